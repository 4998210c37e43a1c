// RC ping-pong in the manner of ibv_rc_pingpong, on ODP memory: node 0 (the client) SENDs its
// buffer to node 1 (the server), which SENDs it back; N iterations. Each side has one buffer,
// registered once with Access.ON_DEMAND, used to send and to receive, as rc_pingpong does.
// With eviction (the default) both buffers are evicted with MADV_DONTNEED before every
// message, the way rdma-core's test_odp.py forces faults: every SEND takes a source fault at
// the sender and a destination fault (NACK, retransmission) at the receiver. A second run
// with the buffers left resident gives the fault-free latency beside it.
//
// Latency is reported as perftest's ib_send_lat does: one way = round trip / 2.
import { Command, Option } from 'commander';
import { Access, mapRegion, PAGE_SIZE, POLICIES, SendFlags, WcStatus, WrOpcode, type PolicyName, type Region, type Sge, type WorkCompletion } from '../lib/index.js';
import {
  heading,
  isMain,
  LATENCY_HEADER,
  latencyCells,
  latencyStats,
  MEASURED_LABEL,
  MODEL_LABEL,
  parsePositiveInt,
  printTable,
  us,
} from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';

export interface PingPongOptions {
  /** Message size in bytes (default 4096, rc_pingpong's). */
  size?: number;
  /** Round trips (default 1000, rc_pingpong's). */
  iters?: number;
  /** Fault library policy of both buffers (default 'touch-ahead'). */
  policy?: PolicyName;
  /** Also run with the buffers left resident (default true). */
  baseline?: boolean;
}

interface Run {
  evict: boolean;
  modelUs: number[];
  realUs: number[];
  seconds: number;
  faults: { source: number; destination: number };
  pagesMadeResident: number;
  retransmitted: number;
  nacks: number;
  errors: number;
}

export async function pingPong(options: PingPongOptions = {}): Promise<Run[]> {
  const size = options.size ?? 4096;
  const iters = options.iters ?? 1000;
  const policy = options.policy ?? 'touch-ahead';
  const pair = connectedPair();
  const { ctx, pd, qp } = pair;
  const bytes = Math.ceil(size / PAGE_SIZE) * PAGE_SIZE;
  const buf: [Region, Region] = [mapRegion(bytes), mapRegion(bytes)];
  try {
    const access = Access.LOCAL_WRITE | Access.ON_DEMAND;
    const mr = [ctx[0].regMr(pd[0], buf[0], 0, bytes, access, { policy }), ctx[1].regMr(pd[1], buf[1], 0, bytes, access, { policy })] as const;
    const sge = (side: 0 | 1) => [{ addr: mr[side].addr, length: size, lkey: mr[side].lkey }];
    console.log(
      `client: node 0, QPN 0x${qp[0].qpNum.toString(16).padStart(6, '0')}, buffer ${bytes / PAGE_SIZE} page(s) at 0x${mr[0].addr.toString(16)}; ` +
        `server: node 1, QPN 0x${qp[1].qpNum.toString(16).padStart(6, '0')}, buffer at 0x${mr[1].addr.toString(16)}`,
    );
    console.log(`${size} B per message, ${iters} round trips, ODP policy '${policy}'.`);

    qp[1].postRecv({ wrId: 0, sgList: sge(1) });
    qp[0].postRecv({ wrId: 0, sgList: sge(0) });
    // Warm up (JIT, copy threads), unrecorded.
    await run(pair, buf, sge, size, Math.min(50, iters), true);
    const runs = [await run(pair, buf, sge, size, iters, true)];
    if (options.baseline ?? true) runs.push(await run(pair, buf, sge, size, iters, false));

    console.log(`\nOne-way latency (round trip / 2, as ib_send_lat). model: ${MODEL_LABEL}; real: ${MEASURED_LABEL}.`);
    const rows: string[][] = [];
    for (const r of runs) {
      const what = r.evict ? 'evicted before every message' : 'resident (no faults)';
      rows.push([String(size), String(iters), ...latencyCells(latencyStats(r.modelUs)), 'model', what]);
      rows.push([String(size), String(iters), ...latencyCells(latencyStats(r.realUs)), 'real', what]);
    }
    printTable(['#bytes', '#iterations', ...LATENCY_HEADER, 'time', 'buffers'], rows, new Set([9, 10]));

    for (const r of runs) {
      const perMsg = (x: number) => (x / (2 * iters)).toFixed(2);
      console.log(
        `\n${r.evict ? 'Evicted' : 'Resident'}: faults source ${r.faults.source}, destination ${r.faults.destination} ` +
          `(${perMsg(r.faults.source)} + ${perMsg(r.faults.destination)} per message); pages made resident by the fault libraries ${r.pagesMadeResident}; ` +
          `retransmitted blocks ${r.retransmitted}; NACKs ${r.nacks}; failed completions or payloads ${r.errors}.`,
      );
      // rc_pingpong's own closing lines (measured).
      const total = 2 * size * iters;
      console.log(
        `  ${total} bytes in ${r.seconds.toFixed(2)} seconds = ${((total * 8) / r.seconds / 1e6).toFixed(2)} Mbit/sec (measured); ` +
          `${iters} iters in ${r.seconds.toFixed(2)} seconds = ${us((r.seconds * 1e6) / iters)} usec/iter`,
      );
    }
    return runs;
  } finally {
    pair.cluster.close();
    for (const b of buf) b.close();
  }
}

// Each side has one receive posted on entry and again on return.
async function run(pair: Pair, buf: [Region, Region], sge: (side: 0 | 1) => Sge[], size: number, iters: number, evict: boolean): Promise<Run> {
  const { ctx, cq, qp, cluster } = pair;
  const before = ctx.map((c) => c.faultLibrary.stats());
  const nacksBefore = cluster.system.nodes.reduce((a, n) => a + n.pldma.counters().nacksReceived, 0);
  const r: Run = { evict, modelUs: [], realUs: [], seconds: 0, faults: { source: 0, destination: 0 }, pagesMadeResident: 0, retransmitted: 0, nacks: 0, errors: 0 };
  const check = (wc: WorkCompletion, imm?: number) => {
    if (wc.status !== WcStatus.SUCCESS || (imm !== undefined && wc.immData !== imm)) r.errors++;
    return wc;
  };

  // One message: `from` sends its buffer to `to`, which had a receive posted; `to` re-posts.
  // Resident buffers carry a checked payload: the client writes the iteration's byte, the
  // receiver's stale bytes must be replaced by the sender's. (Evicted pages read as zeros.)
  const message = async (from: 0 | 1, to: 0 | 1, i: number) => {
    const byte = i & 0xff;
    if (evict) for (const b of buf) b.evict();
    else {
      if (from === 0) new Uint8Array(buf[0].buffer).fill(byte, 0, size);
      new Uint8Array(buf[to].buffer).fill(byte ^ 0xff, 0, size);
    }
    qp[from].postSend({ wrId: i, opcode: WrOpcode.SEND_WITH_IMM, immData: i, sgList: sge(from), sendFlags: SendFlags.SIGNALED });
    const sent = check(await cq[from].next());
    check(await cq[to].next(), i);
    if (!evict && !new Uint8Array(buf[to].buffer, 0, size).every((x) => x === byte)) r.errors++;
    qp[to].postRecv({ wrId: i, sgList: sge(to) });
    return sent;
  };

  const start = performance.now();
  for (let i = 0; i < iters; i++) {
    const t0 = performance.now();
    const ping = await message(0, 1, i);
    const pong = await message(1, 0, i);
    const rtt = (performance.now() - t0) * 1000;
    r.realUs.push(rtt / 2);
    r.modelUs.push(((ping.odp?.modelUs ?? 0) + (pong.odp?.modelUs ?? 0)) / 2);
    r.retransmitted += (ping.odp?.retransmittedBlocks ?? 0) + (pong.odp?.retransmittedBlocks ?? 0);
  }
  r.seconds = (performance.now() - start) / 1000;

  const after = ctx.map((c) => c.faultLibrary.stats());
  for (let k = 0; k < 2; k++) {
    r.faults.source += after[k]!.faults.source - before[k]!.faults.source;
    r.faults.destination += after[k]!.faults.destination - before[k]!.faults.destination;
    r.pagesMadeResident += after[k]!.pagesMadeResident - before[k]!.pagesMadeResident;
  }
  r.nacks = cluster.system.nodes.reduce((a, n) => a + n.pldma.counters().nacksReceived, 0) - nacksBefore;
  return r;
}

if (isMain(import.meta.url)) {
  const program = new Command()
    .name('example:pingpong')
    .description('RC ping-pong like ibv_rc_pingpong, with ODP buffers evicted before every message')
    .option('-s, --size <bytes>', 'message size', parsePositiveInt, 4096)
    .option('-n, --iters <n>', 'round trips', parsePositiveInt, 1000)
    .addOption(new Option('--policy <name>', 'fault library policy of both buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'))
    .option('--no-baseline', 'skip the run with resident buffers')
    .parse();
  const o = program.opts<{ size: number; iters: number; policy: PolicyName; baseline: boolean }>();
  const t = performance.now();
  heading('RC ping-pong with on-demand paging (like ibv_rc_pingpong)');
  await pingPong(o);
  console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
}
