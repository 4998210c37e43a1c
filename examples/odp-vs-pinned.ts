// One RDMA WRITE per size and policy: pinned memory (ibv_reg_mr without ON_DEMAND: mlock at
// registration) against on-demand paging resolved by the fault library (prefault, touch,
// touch-ahead, prefetch). Before every write the destination buffer (and with --evict both,
// the source) is evicted with MADV_DONTNEED, then both buffers are registered, the write is
// posted and completed, and the MRs are deregistered: registration is part of the cost,
// because that is where pinning pays.
import {
  Access,
  mapRegion,
  median,
  PAGE_SIZE,
  SendFlags,
  WcStatus,
  WrOpcode,
  type MemoryRegion,
  type PolicyName,
  type Region,
} from '../lib/index.js';
import { MEASURED_LABEL, MODEL_LABEL, print, sizeName, Table, us } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import type { PlotSpec } from './support/plot.js';
import { PLOT_CONFIG } from './support/plot.js';
import { progress } from './support/progress.js';
import type { TraceFile } from './support/trace-file.js';

export const TABLE_POLICIES: readonly PolicyName[] = ['pin', 'prefault', 'touch', 'touch-ahead', 'prefetch'];

export interface OdpVsPinnedOptions {
  /** Smallest and largest write (default 4 KiB … 16 MiB, ×4 apart). */
  minSize?: number;
  maxSize?: number;
  /** The sizes to write, instead of minSize … maxSize ×4 apart (perftest -a: every power of two). */
  sizes?: readonly number[];
  /** Writes per size and policy below `bigSize` (default 5); one write at and above it. */
  iters?: number;
  /** From this size on, one write per policy (default 4 MiB). */
  bigSize?: number;
  /** Evict the destination only (default), or both buffers. */
  evict?: 'dst' | 'both';
  policies?: readonly PolicyName[];
  /** Where to put the trace of both processes (--trace). */
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
  const sizes: number[] = options.sizes ? [...options.sizes] : [];
  if (!options.sizes) for (let s = minSize; s <= maxSize; s *= 4) sizes.push(s);

  const pair = connectedPair({ trace: options.trace !== undefined });
  const bar = progress(policies.length * (sizes.length + 1), 'odp-vs-pinned');
  try {
    // Warm up once per policy (JIT, copy threads), unrecorded.
    for (const policy of policies) {
      await measure(pair, PAGE_SIZE, policy, 2, evict);
      bar.tick('warm-up');
    }

    print(
      `One RDMA WRITE from node 0 to node 1 per row; evicted before each write: ${evict === 'both' ? 'source and destination' : 'the destination (the source holds fresh data)'}.`,
    );
    print('Times are medians, from ibv_reg_mr of both buffers to the completion (registration included).');
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
    table.header();
    const rows: OdpRow[] = [];
    const errors: string[] = [];
    const ratio = (a?: number, b?: number) => (a !== undefined && b ? (a / b).toFixed(2) : '-');
    // Each row is printed as soon as it is measured; 'pin' goes first, so ×pin is known.
    for (const size of sizes) {
      const n = size >= bigSize ? 1 : iters;
      for (const policy of policies) {
        const r = await measure(pair, size, policy, n, evict);
        bar.tick(`${sizeName(size)} ${policy}`);
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
    options.trace?.addContexts(pair.ctx);
    return rows;
  } finally {
    bar.stop();
    pair.cluster.close();
  }
}

/** Latency against size per policy, log-log, modelled and measured (--plot). */
export function odpVsPinnedPlot(rows: readonly OdpRow[]): PlotSpec {
  const values = rows
    .filter((r) => !r.error)
    .flatMap((r) => [
      { bytes: r.size, policy: r.policy, time: 'modelled', us: r.modelUs! },
      { bytes: r.size, policy: r.policy, time: 'measured', us: r.realUs! },
    ]);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'One RDMA WRITE into evicted memory: latency by size and policy', subtitle: `dashed: ${MODEL_LABEL}; solid: ${MEASURED_LABEL}` },
    config: PLOT_CONFIG,
    width: 560,
    height: 360,
    data: { values },
    mark: { type: 'line', point: true },
    encoding: {
      x: { field: 'bytes', type: 'quantitative', scale: { type: 'log', base: 2 }, title: 'bytes written' },
      y: { field: 'us', type: 'quantitative', scale: { type: 'log' }, title: 'latency [µs], registration included' },
      color: { field: 'policy', type: 'nominal', sort: [...TABLE_POLICIES] },
      strokeDash: { field: 'time', type: 'nominal', title: 'time' },
      shape: { field: 'time', type: 'nominal', title: 'time' },
      detail: [{ field: 'policy' }, { field: 'time' }],
    },
  };
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
      if (!Buffer.from(dst.buffer).equals(Buffer.from(src.buffer)))
        return { size, policy, iters, error: 'the destination does not hold the source bytes' };
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
    faults: { source: Math.round(med((x) => x.faults.source)), destination: Math.round(med((x) => x.faults.destination)) },
    madeResident: Math.round(med((x) => x.madeResident)),
    retransmitted: Math.round(med((x) => x.retransmitted)),
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
