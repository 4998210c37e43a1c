// `npm start` (pagefault-rdma demo): a guided tour in well under a minute. Genuine userfaultfd
// faults first, then a fault-aware RDMA write into evicted memory step by step, a compact
// ODP-vs-pinning table and a short ping-pong; each part is one of the programs, run with small
// settings.
import { DEFAULT_COSTS, MODEL_LABEL } from '../../kernel-sim/index.js';
import { PAGE_SIZE } from '../../lib/index.js';
import { destinationFault, type DestinationFaultResult } from './destination-fault.js';
import { firstFaults, type FirstFaultsResult } from './first-faults.js';
import { odpVsPinned, type OdpRow } from './odp-vs-pinned.js';
import { pingPong, type Run } from './pingpong.js';
import { heading, MEASURED_LABEL, print } from './support/format.js';
import type { TraceFile } from './support/trace-file.js';

export interface DemoResult {
  firstFaults: FirstFaultsResult;
  destinationFault: DestinationFaultResult;
  odpVsPinned: OdpRow[];
  pingPong: Run[];
  seconds: number;
}

// A paragraph, wrapped to 100 columns.
const say = (...lines: string[]) => {
  print(lines.join(' '), 0);
  print();
};

export async function demo(options: { trace?: TraceFile } = {}): Promise<DemoResult> {
  const start = performance.now();
  print('pagefault-rdma: RDMA-style transfers on memory that is not pinned, faulting for real.');
  print('Every page fault below is genuine (userfaultfd, mmap, MADV_DONTNEED; the kernel says the page is missing).');
  print(`Two kinds of time are printed: "model" is ${MODEL_LABEL};`);
  print(`"real" is ${MEASURED_LABEL}, the software path in this one process.`);

  heading('1. Genuine page faults, handled in TypeScript');
  say(
    'A native thread reads fresh memory registered with userfaultfd. Each page is a missing fault: the kernel',
    'suspends the thread and queues the fault on the userfaultfd, which this JS thread polls on its event loop; the',
    'TypeScript handler places the bytes with UFFDIO_COPY and the thread goes on. (npx pagefault-rdma faults)',
  );
  const first = await firstFaults(options);

  heading('2. An RDMA write into evicted remote memory, step by step');
  say(
    "RDMA engines cannot wait for a page, so the usual answer is to pin memory. Here, as in the thesis's design, the",
    "engine's SMMU detects the missing page, the access is aborted (terminate mode), the destination NACKs, the SMMU",
    "driver notifies the owner's fault library over netlink, the library makes the page resident, and the block is",
    'retransmitted. (npx pagefault-rdma destination-fault; -s 64K --policy touch-ahead for more pages)',
  );
  const dest = await destinationFault(options);

  heading('3. On-demand paging vs pinning, 4 KiB to 4 MiB');
  say(
    'The same write under each policy: pin (ibv_reg_mr without ON_DEMAND: mlock at registration), prefault (touch the',
    'buffer before the write), and the fault library resolving on demand: touch (one page per fault), touch-ahead',
    '(the rest of the transfer on the first fault, get_user_pages style), prefetch (a window that grows).',
    '(npx pagefault-rdma odp-vs-pinned --max-size 64M for the full range)',
  );
  const rows = await odpVsPinned({ maxSize: 4 * 2 ** 20, iters: 3, ...options });
  const at1M = (policy: string) => rows.find((r) => r.size === 2 ** 20 && r.policy === policy && !r.error);
  const [pin, ahead, touch1] = [at1M('pin'), at1M('touch-ahead'), at1M('touch')];
  if (pin && ahead && touch1) {
    // The pinned row without its registration is the fault-free transfer.
    const faultFree = pin.modelUs! - (2 ** 20 / PAGE_SIZE) * DEFAULT_COSTS.pinPageUs;
    print(
      [
        '',
        `Reading it (modelled): at 1 MiB, touch-ahead took ${ahead.faults!.destination} fault and ${(ahead.modelUs! / faultFree).toFixed(2)}× the fault-free transfer`,
        `(the published figure is 2.6×), ${(ahead.modelUs! / pin.modelUs!).toFixed(2)}× pinning with its registration; touch took ${touch1.faults!.destination} faults, ` +
          `${(touch1.modelUs! / pin.modelUs!).toFixed(1)}× pinning.`,
        'The measured column is this process (a JavaScript model of the engine moving 4 KiB blocks through native threads,',
        'real faults, real copies) and varies from run to run.',
      ].join('\n'),
    );
  }

  heading('4. Ping-pong with a fault on every message');
  say(
    'Like ibv_rc_pingpong with ODP buffers: both buffers are evicted before every SEND, so each message takes a',
    'source fault and a destination fault; then the same with resident buffers. (npx pagefault-rdma pingpong)',
  );
  const runs = await pingPong({ iters: 200, ...options });

  heading('Where next');
  for (const line of [
    'npx pagefault-rdma faults              genuine userfaultfd faults, handled in TypeScript',
    'npx pagefault-rdma destination-fault   one faulting write, every step (-s 64K, --policy, --plot)',
    'npx pagefault-rdma odp-vs-pinned       the policy table (--max-size 64M, -a, --iters, --plot)',
    'npx pagefault-rdma pingpong            RC ping-pong on ODP memory (-s 64K, -n, --policy, --plot)',
    'npx pagefault-rdma bench-faults        the TypeScript fault round trip against a C handler',
    'Every program takes --help and --json FILE; those with a fault library take --trace FILE.json (Perfetto).',
    'README.md for the API; docs/threads.md for which thread touches what.',
  ])
    print(line);
  const seconds = (performance.now() - start) / 1000;
  print(`(demo run time ${seconds.toFixed(1)} s)`);
  return { firstFaults: first, destinationFault: dest, odpVsPinned: rows, pingPong: runs, seconds };
}
