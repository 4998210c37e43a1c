// One RDMA WRITE per size and policy: pinned memory (ibv_reg_mr without ON_DEMAND: mlock at
// registration) against on-demand paging resolved by the fault library (prefault, touch,
// touch-ahead, prefetch). Before every write the destination buffer (and with --evict both,
// the source) is evicted with MADV_DONTNEED, then both buffers are registered, the write is
// posted and completed, and the MRs are deregistered: registration is part of the cost,
// because that is where pinning pays.
import { Command, InvalidArgumentError, Option } from 'commander';
import { Access, mapRegion, PAGE_SIZE, SendFlags, WcStatus, WrOpcode, type MemoryRegion, type PolicyName, type Region } from '../lib/index.js';
import { heading, isMain, MEASURED_LABEL, MODEL_LABEL, parsePositiveInt, parseSize, printTable, sizeName, us } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';

export const TABLE_POLICIES: readonly PolicyName[] = ['pin', 'prefault', 'touch', 'touch-ahead', 'prefetch'];

export interface OdpVsPinnedOptions {
  /** Smallest and largest write (default 4 KiB … 16 MiB, ×4 apart). */
  minSize?: number;
  maxSize?: number;
  /** Writes per size and policy below `bigSize` (default 5); one write at and above it. */
  iters?: number;
  /** From this size on, one write per policy (default 4 MiB). */
  bigSize?: number;
  /** Evict the destination only (default), or both buffers. */
  evict?: 'dst' | 'both';
  policies?: readonly PolicyName[];
}

/** One row of the table: medians over the writes of one size and policy. */
export interface OdpRow {
  size: number;
  policy: PolicyName;
  iters: number;
  error?: string;
  faults?: { source: number; destination: number };
  madeResident?: number;
  retransmitted?: number;
  modelUs?: number;
  realUs?: number;
}

const ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE;

export async function odpVsPinned(options: OdpVsPinnedOptions = {}): Promise<OdpRow[]> {
  const minSize = options.minSize ?? 4096;
  const maxSize = options.maxSize ?? 16 * 2 ** 20;
  const iters = options.iters ?? 5;
  const bigSize = options.bigSize ?? 4 * 2 ** 20;
  const evict = options.evict ?? 'dst';
  const policies = options.policies ?? TABLE_POLICIES;
  const sizes: number[] = [];
  for (let s = minSize; s <= maxSize; s *= 4) sizes.push(s);

  const pair = connectedPair();
  try {
    // Warm up once per policy (JIT, copy threads), unrecorded.
    for (const policy of policies) await measure(pair, PAGE_SIZE, policy, 2, evict);

    const rows: OdpRow[] = [];
    for (const size of sizes) {
      const n = size >= bigSize ? 1 : iters;
      for (const policy of policies) rows.push(await measure(pair, size, policy, n, evict));
    }

    console.log(`One RDMA WRITE from node 0 to node 1 per row; evicted before each write: ${evict === 'both' ? 'source and destination' : 'the destination (the source holds fresh data)'}.`);
    console.log(`Times are medians, from ibv_reg_mr of both buffers to the completion (registration included).`);
    console.log(`  t_model: ${MODEL_LABEL}`);
    console.log(`  t_real:  ${MEASURED_LABEL}`);
    const header = ['#bytes', 'policy', '#iter', 'faults src/dst', 'pages made resident', 'retx blocks', 't_model[usec]', 't_real[usec]', 'model ×pin', 'real ×pin'];
    const table: string[][] = [];
    const errors: string[] = [];
    for (const r of rows) {
      const pin = rows.find((x) => x.size === r.size && x.policy === 'pin' && !x.error);
      const ratio = (a?: number, b?: number) => (a !== undefined && b ? (a / b).toFixed(2) : '-');
      if (r.error) {
        errors.push(`${sizeName(r.size)} ${r.policy}: ${r.error}`);
        table.push([String(r.size), r.policy, String(r.iters), `failed (${errors.length})`, '-', '-', '-', '-', '-', '-']);
        continue;
      }
      table.push([
        String(r.size),
        r.policy,
        String(r.iters),
        `${r.faults!.source}/${r.faults!.destination}`,
        String(r.madeResident),
        String(r.retransmitted),
        us(r.modelUs!),
        us(r.realUs!),
        ratio(r.modelUs, pin?.modelUs),
        ratio(r.realUs, pin?.realUs),
      ]);
    }
    printTable(header, table, new Set([1]));
    errors.forEach((e, i) => console.log(` (${i + 1}) ${e}`));
    const c = pair.cluster.system.costs;
    console.log('Modelled set-up added to the transfer:');
    console.log(`  pin: pages × ${c.pinPageUs} µs (mlock at registration; the two nodes pin at once; here, one process, they share its RLIMIT_MEMLOCK)`);
    console.log(`  prefault: pages not resident × ${c.touchPageUs} µs (the buffer touched before the write)`);
    console.log('Faults, pages and retransmissions are per write (medians); ×pin compares with the pinned row of the same size.');
    return rows;
  } finally {
    pair.cluster.close();
  }
}

async function measure(pair: Pair, size: number, policy: PolicyName, iters: number, evict: 'dst' | 'both'): Promise<OdpRow> {
  const { ctx, pd, cq, qp } = pair;
  const costs = pair.cluster.system.costs;
  const src = mapRegion(size);
  const dst = mapRegion(size);
  const pages = size / PAGE_SIZE;
  const samples: Array<Required<Pick<OdpRow, 'faults' | 'madeResident' | 'retransmitted' | 'modelUs' | 'realUs'>>> = [];
  try {
    for (let i = 0; i < iters; i++) {
      fillPattern(src, i);
      dst.evict();
      if (evict === 'both') src.evict();
      const missing = [src, dst].map((r) => pages - r.residentPages());

      const t0 = performance.now();
      const access = policy === 'pin' ? ACCESS : ACCESS | Access.ON_DEMAND;
      const reg = policy === 'pin' ? {} : { policy };
      const s = tryRegMr(() => ctx[0].regMr(pd[0], src, 0, size, access, reg));
      const d = s instanceof Error ? s : tryRegMr(() => ctx[1].regMr(pd[1], dst, 0, size, access, reg));
      if (s instanceof Error || d instanceof Error) {
        // Pinning past RLIMIT_MEMLOCK without CAP_IPC_LOCK: the library's message says how to fix it.
        if (!(s instanceof Error)) s.dereg();
        return { size, policy, iters, error: (s instanceof Error ? s : (d as Error)).message };
      }
      qp[0].postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: s.addr, length: size, lkey: s.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: d.addr, rkey: d.rkey },
      });
      const wc = await cq[0].next({ timeoutMs: 600_000 });
      const realUs = (performance.now() - t0) * 1000;
      // Both nodes pin at once: the pinning baseline's modelled set-up is one side's.
      const pinUs = s.modelPinUs;
      s.dereg();
      d.dereg();
      if (wc.status !== WcStatus.SUCCESS) return { size, policy, iters, error: `work completion ${wc.statusStr}` };
      if (!Buffer.from(dst.buffer).equals(Buffer.from(src.buffer))) return { size, policy, iters, error: 'the destination does not hold the source bytes' };
      const odp = wc.odp!;
      const setupUs = policy === 'pin' ? pinUs : policy === 'prefault' ? Math.max(...missing) * costs.touchPageUs : 0;
      samples.push({
        faults: odp.faults,
        madeResident: missing[0]! + missing[1]! - (pages - src.residentPages()) - (pages - dst.residentPages()),
        retransmitted: odp.retransmittedBlocks,
        modelUs: odp.modelUs + setupUs,
        realUs,
      });
    }
  } finally {
    src.close();
    dst.close();
  }
  const med = <T>(key: (x: (typeof samples)[number]) => T & number) => median(samples.map(key));
  return {
    size,
    policy,
    iters,
    faults: { source: med((x) => x.faults.source), destination: med((x) => x.faults.destination) },
    madeResident: med((x) => x.madeResident),
    retransmitted: med((x) => x.retransmitted),
    modelUs: med((x) => x.modelUs),
    realUs: med((x) => x.realUs),
  };
}

// Different bytes every write, so a stale destination cannot pass the check.
function fillPattern(r: Region, i: number): void {
  const b = new Uint8Array(r.buffer);
  b.fill(0x30 + (i % 64));
  for (let p = 0; p < b.length; p += PAGE_SIZE) b[p] = (p / PAGE_SIZE + i) & 0xff;
}

function tryRegMr(reg: () => MemoryRegion): MemoryRegion | Error {
  try {
    return reg();
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1]!;
}

function policyList(value: string): PolicyName[] {
  const list = value.split(',').map((s) => s.trim()) as PolicyName[];
  for (const p of list) if (!TABLE_POLICIES.includes(p)) throw new InvalidArgumentError(`unknown policy '${p}' (choose from ${TABLE_POLICIES.join(', ')})`);
  return list;
}

if (isMain(import.meta.url)) {
  const program = new Command()
    .name('example:odp-vs-pinned')
    .description('One RDMA WRITE per size under pinning and each on-demand paging policy, as one table')
    .option('--min-size <bytes>', 'smallest write (sizes grow ×4)', parseSize, 4096)
    .option('--max-size <bytes>', 'largest write (64M for the whole range)', parseSize, 16 * 2 ** 20)
    .option('--iters <n>', 'writes per size and policy below --big-size (median reported)', parsePositiveInt, 5)
    .option('--big-size <bytes>', 'from this size on, one write per policy', parseSize, 4 * 2 ** 20)
    .addOption(new Option('--evict <which>', 'buffers evicted before each write').choices(['dst', 'both']).default('dst'))
    .addOption(new Option('--policies <list>', 'comma-separated subset of ' + TABLE_POLICIES.join(',')).argParser(policyList))
    .parse();
  const o = program.opts<{ minSize: number; maxSize: number; iters: number; bigSize: number; evict: 'dst' | 'both'; policies?: PolicyName[] }>();
  if (o.minSize % PAGE_SIZE !== 0 || o.maxSize < o.minSize) program.error(`--min-size must be a multiple of ${PAGE_SIZE} and no larger than --max-size`);
  const t = performance.now();
  heading('ODP vs pinned: one RDMA WRITE per size and policy');
  const opts: OdpVsPinnedOptions = { minSize: o.minSize, maxSize: o.maxSize, iters: o.iters, bigSize: o.bigSize, evict: o.evict };
  if (o.policies) opts.policies = o.policies;
  await odpVsPinned(opts);
  console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
}
