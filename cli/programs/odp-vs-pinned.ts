// One RDMA WRITE per size and policy: pinned memory (ibv_reg_mr without ON_DEMAND: mlock at
// registration) against on-demand paging resolved by the fault library (prefault, touch,
// touch-ahead, prefetch). Before every write the destination buffer (and with --evict both,
// the source) is evicted with MADV_DONTNEED, then both buffers are registered, the write is
// posted and completed, and the MRs are deregistered: registration is part of the cost,
// because that is where pinning pays.
//
// What is timed is only that: ibv_reg_mr of both buffers, the post and the completion. The
// buffers are mapped once per size, filled, evicted and checked outside the window; the
// policies take turns write by write (each round in another order, each policy following each
// other equally often: williams()), so a slow spell of this shared machine, or the garbage of
// the write before, falls on all of them alike; the process warms up first (the JIT) and a
// round of each size is run unrecorded; each row is the median of its writes, with their
// spread and the garbage collection that fell inside the window, so noise shows as noise.
import { PerformanceObserver } from 'node:perf_hooks';
import {
  Access,
  Histogram,
  mapRegion,
  median,
  PAGE_SIZE,
  PHASES,
  SendFlags,
  WcStatus,
  WrOpcode,
  type FaultStats,
  type MemoryRegion,
  type PolicyName,
  type Region,
} from '../../lib/index.js';
import { MEASURED_LABEL, MODEL_LABEL, print, sizeName, Table, us } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import type { PlotSpec } from './support/plot.js';
import { PLOT_CONFIG, SIZE_LABEL_EXPR } from './support/plot.js';
import { progress } from './support/progress.js';
import type { TraceFile } from './support/trace-file.js';

export const TABLE_POLICIES: readonly PolicyName[] = ['pin', 'prefault', 'touch', 'touch-ahead', 'prefetch'];

export interface OdpVsPinnedOptions {
  /** Smallest and largest write (default 4 KiB … 16 MiB, ×4 apart). */
  minSize?: number;
  maxSize?: number;
  /** The sizes to write, instead of minSize … maxSize ×4 apart (perftest -a: every power of two). */
  sizes?: readonly number[];
  /** Writes per size and policy below `bigSize` (default 5, median reported); one at and above it. */
  iters?: number;
  /** Writes per size and policy up to SMALL_SIZE, where a write costs well under a millisecond (default: iters). */
  smallIters?: number;
  /** From this size on, one write per policy (default 16 MiB). */
  bigSize?: number;
  /** Evict the destination only (default), or both buffers. */
  evict?: 'dst' | 'both';
  policies?: readonly PolicyName[];
  /** Where to put the trace of both processes (--trace): the first measured write of each size and policy. */
  trace?: TraceFile;
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
  /** Measured, µs: the median write, registration included (= regUs + transferUs on a typical write). */
  realUs?: number;
  /** Median ibv_reg_mr of both buffers, µs (pinned: the mlock is here). */
  regUs?: number;
  /** Median post-to-completion, µs (faults, resolution, retransmission and the copy are here). */
  transferUs?: number;
  /** The fault library's own measure of its part of the transfer (detect, notify, resolve, retransmit), median µs. */
  faultPathUs?: number;
  /** How much the writes varied: the interquartile range of samplesUs, µs. */
  spreadUs?: number;
  /** Garbage collection inside the timed window: writes it hit, and its median µs over all writes. */
  gc?: { writes: number; medianUs: number };
  /** Every write's measured time, µs, in the order taken. */
  samplesUs?: number[];
}

/** The small writes: up to 64 KiB, where a fault round trip is a large part of a write. */
export const SMALL_SIZE = 64 * 1024;
const ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE;
// Warm-up. Measured here: a process's first 1500-2500 writes are up to 4× slower than the
// next (a pinned 8K write 145 -> 35 µs post to completion; with node --no-opt it stays at
// 130: V8 optimizing the engine's JavaScript). So an unrecorded warm-up runs at least
// WARM_UP_MIN_WRITES, then blocks of WARM_UP_ROUNDS rounds until a block's median write is no
// more than 10% faster than the previous block's, for at most WARM_UP_MAX_MS.
const WARM_UP_MIN_WRITES = 2500;
const WARM_UP_ROUNDS = 100;
const WARM_UP_MAX_MS = 3000;

/** One measured write: what each row's medians are taken over. */
interface Sample {
  faults: { source: number; destination: number };
  madeResident: number;
  retransmitted: number;
  modelUs: number;
  regUs: number;
  transferUs: number;
  faultPathUs: number;
  window: [number, number];
}

export async function odpVsPinned(options: OdpVsPinnedOptions = {}): Promise<OdpRow[]> {
  const minSize = options.minSize ?? 4096;
  const maxSize = options.maxSize ?? 16 * 2 ** 20;
  const iters = options.iters ?? 5;
  const smallIters = options.smallIters ?? iters;
  const bigSize = options.bigSize ?? 16 * 2 ** 20;
  const evict = options.evict ?? 'dst';
  const policies = options.policies ?? TABLE_POLICIES;
  const sizes: number[] = options.sizes ? [...options.sizes] : [];
  if (!options.sizes) for (let s = minSize; s <= maxSize; s *= 4) sizes.push(s);

  const pair = connectedPair({ trace: options.trace?.option ?? false });
  // The trace holds one write per size and policy: all of them (thousands with the warm-up)
  // would overflow the rings and make a file Perfetto cannot open.
  const trace = options.trace;
  trace?.sample(pair.ctx, false);
  const bar = progress(policies.length * sizes.length, 'odp-vs-pinned');
  const gc = gcWatch();
  try {
    print(
      `One RDMA WRITE from node 0 to node 1 per row; evicted before each write: ${evict === 'both' ? 'source and destination' : 'the destination (the source holds fresh data)'}.`,
    );
    print('Times are medians, from ibv_reg_mr of both buffers to the completion (registration included); the policies take turns write by write.');
    print(`  t_model: ${MODEL_LABEL}`);
    print(`  t_real:  ${MEASURED_LABEL}`);
    const table = new Table([
      { header: '#bytes', width: 8 },
      { header: 'policy', width: 11, left: true },
      { header: '#iter' },
      { header: 'faults src/dst', width: 9 },
      { header: 'pages made resident', width: 8 },
      { header: 'retx blocks', width: 6 },
      { header: 't_model [usec]', width: 9 },
      { header: 't_real [usec]', width: 9 },
      { header: 'model ×pin', width: 6 },
      { header: 'real ×pin', width: 6 },
    ]);
    const warm = await warmUp(pair, sizes[0]!, policies, evict);
    print(
      `Warm-up (unrecorded): ${warm.writes} writes of ${sizeName(sizes[0]!)}, until the median write stopped falling ` +
        `(${us(warm.firstUs)} -> ${us(warm.lastUs)} µs)${warm.steady ? '' : `; still falling after ${WARM_UP_MAX_MS} ms`}.`,
    );
    table.header();
    const rows: OdpRow[] = [];
    const errors: string[] = [];
    const ratio = (a?: number, b?: number) => (a !== undefined && b ? (a / b).toFixed(2) : '-');
    for (const size of sizes) {
      const n = size >= bigSize ? 1 : size <= SMALL_SIZE ? smallIters : iters;
      const sized = await measureSize(pair, size, policies, n, evict, trace);
      for (const policy of policies) {
        const samples = sized.get(policy)!;
        bar.tick(`${sizeName(size)} ${policy}`);
        const r = row(size, policy, n, samples, gc);
        rows.push(r);
        if (r.error) {
          errors.push(`${sizeName(r.size)} ${r.policy}: ${r.error}`);
          table.row([String(r.size), r.policy, String(r.iters), `failed (${errors.length})`, '-', '-', '-', '-', '-', '-']);
          continue;
        }
        const pin = rows.find((x) => x.size === r.size && x.policy === 'pin' && !x.error);
        table.row([
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
    }
    bar.stop();
    errors.forEach((e, i) => print(` (${i + 1}) ${e}`));
    const c = pair.cluster.system.costs;
    print('Modelled set-up added to the transfer:');
    print(`  pin: pages × ${c.pinPageUs} µs (mlock at registration; the two nodes pin at once; here, one process, they share its RLIMIT_MEMLOCK)`);
    print(`  prefault: pages not resident × ${c.touchPageUs} µs (the buffer touched before the write)`);
    print('Faults, pages and retransmissions are per write (medians); ×pin compares with the pinned row of the same size.');
    const hit = rows.reduce((k, r) => k + (r.gc?.writes ?? 0), 0);
    const all = rows.reduce((k, r) => k + (r.samplesUs?.length ?? 0), 0);
    print(`Garbage collection fell inside the timed window of ${hit} of ${all} writes.`);
    options.trace?.addContexts(pair.ctx);
    return rows;
  } finally {
    gc.stop();
    bar.stop();
    pair.cluster.close();
  }
}

/** Latency against size per policy, log-log, modelled (dashed) and measured (solid) (--plot). */
export function odpVsPinnedPlot(rows: readonly OdpRow[]): PlotSpec {
  const values = rows
    .filter((r) => !r.error)
    .flatMap((r) => [
      { bytes: r.size, policy: r.policy, time: 'modelled', us: r.modelUs! },
      { bytes: r.size, policy: r.policy, time: 'measured', us: r.realUs! },
    ]);
  // A tick at each size measured, and only there, labelled as the table writes sizes (4K, 64K, 1M).
  const sizes = [...new Set(values.map((v) => v.bytes))].sort((a, b) => a - b);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'One RDMA WRITE into evicted memory: latency by size and policy', subtitle: `dashed: ${MODEL_LABEL}; solid: ${MEASURED_LABEL}` },
    config: PLOT_CONFIG,
    width: 560,
    height: 360,
    data: { values },
    encoding: {
      x: {
        field: 'bytes',
        type: 'quantitative',
        scale: { type: 'log', base: 2, domain: [sizes[0] ?? 1, sizes[sizes.length - 1] ?? 2], nice: false },
        axis: { values: sizes, labelExpr: SIZE_LABEL_EXPR, labelOverlap: false, grid: true },
        title: 'bytes written',
      },
      y: { field: 'us', type: 'quantitative', scale: { type: 'log' }, title: 'latency [µs], registration included' },
      color: { field: 'policy', type: 'nominal', sort: [...TABLE_POLICIES] },
    },
    // Lines and points in layers of their own: a line mark with points would draw the
    // strokeDash legend's symbols without a stroke, and the legend is what says solid and dashed.
    layer: [
      {
        mark: 'line',
        encoding: {
          strokeDash: {
            field: 'time',
            type: 'nominal',
            title: 'time',
            scale: {
              domain: ['measured', 'modelled'],
              range: [
                [1, 0],
                [6, 4],
              ],
            },
            legend: {
              symbolType: 'stroke',
              symbolStrokeColor: '#444',
              symbolStrokeWidth: 2,
              labelExpr: "datum.label === 'measured' ? 'measured (solid)' : 'modelled (dashed)'",
            },
          },
          detail: [{ field: 'policy' }, { field: 'time' }],
        },
      },
      { mark: { type: 'point', filled: true } },
    ],
  };
}

/**
 * The order of n policies in round r: a Williams design (a balanced Latin square, with its
 * rows mirrored when n is odd), so that over n rounds (2n when odd) each policy comes right
 * after each other one equally often. What a write leaves behind (the garbage of a 4 MiB touch
 * write's thousand faults, collected during the next write) then falls on every policy alike;
 * with a plain rotation touch-ahead came after touch in two rounds of three.
 */
export function williams(n: number, r: number): number[] {
  const first = [0];
  for (let j = 1, lo = 1, hi = n - 1; j < n; j++) first.push(j % 2 === 1 ? lo++ : hi--);
  const row = first.map((x) => (x + r) % n);
  return n % 2 === 1 && Math.floor(r / n) % 2 === 1 ? row.reverse() : row;
}

/** Unrecorded blocks of writes of `size` until the per-write time stops falling (or WARM_UP_MAX_MS): the JIT's warm-up. */
async function warmUp(
  pair: Pair,
  size: number,
  policies: readonly PolicyName[],
  evict: 'dst' | 'both',
): Promise<{ writes: number; firstUs: number; lastUs: number; steady: boolean }> {
  const t0 = performance.now();
  const blocks: number[] = [];
  let writes = 0;
  for (;;) {
    const taken = [...(await measureSize(pair, size, policies, WARM_UP_ROUNDS, evict)).values()].flat();
    const samples = taken.filter((x): x is Sample => typeof x !== 'string');
    writes += taken.length;
    // A policy that cannot run (RLIMIT_MEMLOCK) is reported by the table itself.
    if (samples.length === 0) return { writes, firstUs: NaN, lastUs: NaN, steady: true };
    blocks.push(median(samples.map((x) => x.regUs + x.transferUs)));
    const n = blocks.length;
    const steady = writes >= WARM_UP_MIN_WRITES && n >= 2 && blocks[n - 1]! >= 0.9 * blocks[n - 2]!;
    if (steady || performance.now() - t0 > WARM_UP_MAX_MS) return { writes, firstUs: blocks[0]!, lastUs: blocks[n - 1]!, steady };
  }
}

/**
 * `iters` writes of `size` bytes per policy, the policies taking turns (in williams() order),
 * after one unrecorded round (not for a single write: the largest sizes,
 * where it would double the run time). With `trace`, round 0's writes are traced. A policy that fails stops being measured; its
 * error is its last entry.
 */
async function measureSize(
  pair: Pair,
  size: number,
  policies: readonly PolicyName[],
  iters: number,
  evict: 'dst' | 'both',
  trace?: TraceFile,
): Promise<Map<PolicyName, Array<Sample | string>>> {
  const src = mapRegion(size);
  const dst = mapRegion(size);
  const out = new Map<PolicyName, Array<Sample | string>>(policies.map((p) => [p, []]));
  try {
    for (let round = iters > 1 ? -1 : 0; round < iters; round++) {
      for (let k = 0; k < policies.length; k++) {
        const policy = policies[williams(policies.length, Math.max(0, round))[k]!]!;
        const taken = out.get(policy)!;
        if (typeof taken[taken.length - 1] === 'string') continue;
        trace?.sample(pair.ctx, round === 0);
        const r = await measure(pair, src, dst, policy, round, evict);
        trace?.sample(pair.ctx, false);
        if (round >= 0 || typeof r === 'string') taken.push(r);
      }
    }
  } finally {
    src.close();
    dst.close();
  }
  return out;
}

/** The row of one size and policy: medians of its writes. */
function row(size: number, policy: PolicyName, iters: number, taken: ReadonlyArray<Sample | string>, gc: GcWatch): OdpRow {
  const error = taken.find((x): x is string => typeof x === 'string');
  if (error !== undefined) return { size, policy, iters, error };
  const samples = taken as readonly Sample[];
  const med = (key: (x: Sample) => number) => median(samples.map(key));
  const totals = samples.map((x) => x.regUs + x.transferUs);
  const inWindow = samples.map((x) => gc.within(x.window[0], x.window[1]));
  return {
    size,
    policy,
    iters,
    faults: { source: Math.round(med((x) => x.faults.source)), destination: Math.round(med((x) => x.faults.destination)) },
    madeResident: Math.round(med((x) => x.madeResident)),
    retransmitted: Math.round(med((x) => x.retransmitted)),
    modelUs: med((x) => x.modelUs),
    realUs: median(totals),
    regUs: med((x) => x.regUs),
    transferUs: med((x) => x.transferUs),
    faultPathUs: med((x) => x.faultPathUs),
    spreadUs: quantile(totals, 0.75) - quantile(totals, 0.25),
    gc: { writes: inWindow.filter((u) => u > 0).length, medianUs: median(inWindow) },
    samplesUs: totals,
  };
}

/** One write: evict, then (timed) register both buffers, post, complete; deregister and check the bytes. */
async function measure(pair: Pair, src: Region, dst: Region, policy: PolicyName, i: number, evict: 'dst' | 'both'): Promise<Sample | string> {
  const { ctx, pd, cq, qp } = pair;
  const costs = pair.cluster.system.costs;
  const size = src.size;
  const pages = size / PAGE_SIZE;
  fillPattern(src, i + 1);
  dst.evict();
  if (evict === 'both') src.evict();
  const missing = [src, dst].map((r) => pages - r.residentPages());
  const access = policy === 'pin' ? ACCESS : ACCESS | Access.ON_DEMAND;
  const reg = policy === 'pin' ? {} : { policy };

  const t0 = performance.now();
  const s = tryRegMr(() => ctx[0].regMr(pd[0], src, 0, size, access, reg));
  const d = s instanceof Error ? s : tryRegMr(() => ctx[1].regMr(pd[1], dst, 0, size, access, reg));
  const t1 = performance.now();
  if (s instanceof Error || d instanceof Error) {
    // Pinning past RLIMIT_MEMLOCK without CAP_IPC_LOCK: the library's message says how to fix it.
    if (!(s instanceof Error)) s.dereg();
    return (s instanceof Error ? s : (d as Error)).message;
  }
  qp[0].postSend({
    wrId: i + 1,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [{ addr: s.addr, length: size, lkey: s.lkey }],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: d.addr, rkey: d.rkey },
  });
  const wc = await cq[0].next({ timeoutMs: 600_000 });
  const t2 = performance.now();

  // Both nodes pin at once: the pinning baseline's modelled set-up is one side's.
  const pinUs = s.modelPinUs;
  const faultPathUs = [s, d].reduce((sum, mr) => sum + (mr.registration ? faultPath(mr.registration.stats) : 0), 0);
  s.dereg();
  d.dereg();
  if (wc.status !== WcStatus.SUCCESS) return `work completion ${wc.statusStr}`;
  if (!Buffer.from(dst.buffer).equals(Buffer.from(src.buffer))) return 'the destination does not hold the source bytes';
  const odp = wc.odp!;
  const setupUs = policy === 'pin' ? pinUs : policy === 'prefault' ? Math.max(...missing) * costs.touchPageUs : 0;
  return {
    faults: odp.faults,
    madeResident: missing[0]! + missing[1]! - (pages - src.residentPages()) - (pages - dst.residentPages()),
    retransmitted: odp.retransmittedBlocks,
    modelUs: odp.modelUs + setupUs,
    regUs: (t1 - t0) * 1000,
    transferUs: (t2 - t1) * 1000,
    faultPathUs,
    window: [t0, t2],
  };
}

/** The real µs a registration's faults spent in the fault path (a fresh registration: this write's). */
function faultPath(stats: FaultStats): number {
  return PHASES.reduce((sum, p) => sum + stats.real[p].sum, 0);
}

/** The value at quantile q of `xs`, in the package's one percentile definition. */
function quantile(xs: readonly number[], q: number): number {
  return Histogram.of(xs).quantile(q);
}

interface GcWatch {
  /** µs of garbage collection between two performance.now() instants. */
  within(from: number, to: number): number;
  stop(): void;
}

/** Garbage collections as Node reports them (perf_hooks 'gc' entries, on the performance.now() clock). */
function gcWatch(): GcWatch {
  const spans: Array<[number, number]> = [];
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) spans.push([e.startTime, e.startTime + e.duration]);
  });
  obs.observe({ entryTypes: ['gc'] });
  return {
    within: (from, to) => spans.reduce((sum, [a, b]) => sum + Math.max(0, Math.min(b, to) - Math.max(a, from)), 0) * 1000,
    stop: () => obs.disconnect(),
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
