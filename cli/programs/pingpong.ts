// RC ping-pong in the manner of ibv_rc_pingpong, on ODP memory: node 0 (the client) SENDs its
// buffer to node 1 (the server), which SENDs it back; N iterations. Each side has one buffer,
// registered once with Access.ON_DEMAND, used to send and to receive, as rc_pingpong does.
// With eviction (the default) both buffers are evicted with MADV_DONTNEED before every
// message, the way rdma-core's test_odp.py forces faults: every SEND takes a source fault at
// the sender and a destination fault (NACK, retransmission) at the receiver. A second run
// with the buffers left resident gives the fault-free latency beside it.
//
// Latency is reported as perftest's ib_send_lat does: one way = round trip / 2.
import {
  Access,
  latencyStats,
  mapRegion,
  PAGE_SIZE,
  SendFlags,
  WcStatus,
  WrOpcode,
  type PolicyName,
  type Region,
  type Sge,
  type WorkCompletion,
  type LatencyStats,
} from '../../lib/index.js';
import { LATENCY_COLUMNS, latencyCells, MEASURED_LABEL, MODEL_LABEL, print, sizeName, Table, us } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import { PLOT_CONFIG, type PlotSpec } from './support/plot.js';
import { progress, type Progress } from './support/progress.js';
import type { TraceFile } from './support/trace-file.js';

export interface PingPongOptions {
  /** Message size in bytes (default 4096, rc_pingpong's). */
  size?: number;
  /** Several message sizes, one after the other (perftest -a). Overrides `size`. */
  sizes?: readonly number[];
  /** Round trips (default 1000, rc_pingpong's). */
  iters?: number;
  /** Fault library policy of both buffers (default 'touch-ahead'). */
  policy?: PolicyName;
  /** Also run with the buffers left resident (default true). */
  baseline?: boolean;
  /** Where to put the trace of both processes (--trace): the first round trips of each run. */
  trace?: TraceFile;
}

// Round trips traced per run (--trace): a few show every step; a thousand would make a file too large to open.
const TRACED_ROUND_TRIPS = 4;

/** One run: `iters` round trips of `size` bytes, buffers evicted before every message or not. */
export interface Run {
  size: number;
  iters: number;
  evict: boolean;
  /** One-way latency of each round trip, µs. */
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
  const sizes = options.sizes ?? [options.size ?? 4096];
  const iters = options.iters ?? 1000;
  const policy = options.policy ?? 'touch-ahead';
  const baseline = options.baseline ?? true;
  const runs: Run[] = [];
  const bar = progress(sizes.length * (baseline ? 2 : 1) * iters, 'pingpong');
  try {
    // #iterations is said above the table: perftest's other columns fit 100 columns then.
    const table = new Table([
      { header: '#bytes', width: 7 },
      ...LATENCY_COLUMNS,
      { header: 'time', width: 5, left: true },
      { header: 'buffers', width: 8, left: true },
    ]);
    for (const [k, size] of sizes.entries()) {
      const pair = connectedPair({ trace: options.trace?.option ?? false });
      const { ctx, pd, qp } = pair;
      const bytes = Math.ceil(size / PAGE_SIZE) * PAGE_SIZE;
      const buf: [Region, Region] = [mapRegion(bytes), mapRegion(bytes)];
      try {
        const access = Access.LOCAL_WRITE | Access.ON_DEMAND;
        const mr = [ctx[0].regMr(pd[0], buf[0], 0, bytes, access, { policy }), ctx[1].regMr(pd[1], buf[1], 0, bytes, access, { policy })] as const;
        const sge = (side: 0 | 1) => [{ addr: mr[side].addr, length: size, lkey: mr[side].lkey }];
        if (k === 0) {
          print(
            `client: node 0, QPN 0x${qp[0].qpNum.toString(16).padStart(6, '0')}, buffer at 0x${mr[0].addr.toString(16)}; ` +
              `server: node 1, QPN 0x${qp[1].qpNum.toString(16).padStart(6, '0')}, buffer at 0x${mr[1].addr.toString(16)}`,
          );
          print(
            `${sizes.length === 1 ? `${size} B` : `${sizeName(size)} to ${sizeName(sizes[sizes.length - 1]!)}`} per message, ${iters} round trips, ODP policy '${policy}'.`,
          );
          print(`One-way latency (round trip / 2, as ib_send_lat), ${iters} iterations per row. model: ${MODEL_LABEL}; real: ${MEASURED_LABEL}.`);
          print('buffers: evicted = both evicted before every message (a fault at each end); resident = no faults.');
          table.header();
        }

        qp[1].postRecv({ wrId: 0, sgList: sge(1) });
        qp[0].postRecv({ wrId: 0, sgList: sge(0) });
        // Warm up (JIT, copy threads), unrecorded.
        options.trace?.sample(ctx, false);
        await run(pair, buf, sge, size, Math.min(50, iters), true);
        for (const evict of baseline ? [true, false] : [true]) {
          const r = await run(pair, buf, sge, size, iters, evict, bar, options.trace);
          runs.push(r);
          const what = r.evict ? 'evicted' : 'resident';
          table.row([String(size), ...latencyCells(latencyStats(r.modelUs)), 'model', what]);
          table.row([String(size), ...latencyCells(latencyStats(r.realUs)), 'real', what]);
        }
        options.trace?.addContexts(ctx, sizes.length > 1 ? `${sizeName(size)} B` : undefined);
      } finally {
        pair.cluster.close();
        for (const b of buf) b.close();
      }
    }
    bar.stop();

    for (const r of runs) {
      const perMsg = (x: number) => (x / (2 * r.iters)).toFixed(2);
      print(
        `\n${sizeName(r.size)} B, ${r.evict ? 'evicted' : 'resident'}: faults source ${r.faults.source}, destination ${r.faults.destination} ` +
          `(${perMsg(r.faults.source)} + ${perMsg(r.faults.destination)} per message); pages made resident by the fault libraries ${r.pagesMadeResident}; ` +
          `retransmitted blocks ${r.retransmitted}; NACKs ${r.nacks}; failed completions or payloads ${r.errors}.`,
      );
      // rc_pingpong's own closing lines (measured).
      const total = 2 * r.size * r.iters;
      print(
        `  ${total} bytes in ${r.seconds.toFixed(2)} seconds = ${((total * 8) / r.seconds / 1e6).toFixed(2)} Mbit/sec (measured); ` +
          `${r.iters} iters in ${r.seconds.toFixed(2)} seconds = ${us((r.seconds * 1e6) / r.iters)} usec/iter`,
      );
    }
    return runs;
  } finally {
    bar.stop();
  }
}

/** A run as --json writes it: perftest's latency columns instead of every sample. */
export function runSummary(r: Run): Omit<Run, 'modelUs' | 'realUs'> & { model: LatencyStats; real: LatencyStats } {
  const { modelUs, realUs, ...rest } = r;
  return { ...rest, model: latencyStats(modelUs), real: latencyStats(realUs) };
}

/** Sizes drawn at most (with -a, thirty runs would be thirty lines nobody can tell apart). */
export const PLOTTED_SIZES = 4;

/**
 * The distribution of the measured one-way latency of each run, as a CDF on a log axis
 * (--plot): a colour per message size (at most PLOTTED_SIZES of them, from the smallest to the
 * largest, in numeric order), solid for evicted buffers, dashed for resident ones.
 */
export function pingPongPlot(runs: readonly Run[]): PlotSpec {
  const all = [...new Set(runs.map((r) => r.size))].sort((a, b) => a - b);
  const picked = pick(all, PLOTTED_SIZES);
  const values = runs
    .filter((r) => picked.includes(r.size))
    .flatMap((r) => {
      const sorted = [...r.realUs].sort((a, b) => a - b);
      const buffers = r.evict ? 'evicted before every message' : 'resident';
      return sorted.map((us, i) => ({ size: sizeName(r.size), buffers, us, fraction: (i + 1) / sorted.length }));
    });
  const shown = picked.length < all.length ? `; ${picked.length} of ${all.length} sizes drawn (--json has every run)` : '';
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: {
      text: 'RC ping-pong on ODP memory: one-way latency distribution',
      subtitle: `${MEASURED_LABEL}; round trip / 2, as ib_send_lat${shown}`,
    },
    config: { ...PLOT_CONFIG, legend: { labelLimit: 360 } },
    width: 560,
    height: 320,
    data: { values },
    mark: { type: 'line', interpolate: 'step-after' },
    encoding: {
      x: { field: 'us', type: 'quantitative', scale: { type: 'log' }, title: 'one-way latency [µs]' },
      y: { field: 'fraction', type: 'quantitative', title: 'fraction of round trips at or below', scale: { domain: [0, 1] } },
      color: { field: 'size', type: 'nominal', title: 'message size [bytes]', sort: picked.map(sizeName) },
      strokeDash: {
        field: 'buffers',
        type: 'nominal',
        title: 'buffers',
        scale: {
          domain: ['evicted before every message', 'resident'],
          range: [
            [1, 0],
            [6, 4],
          ],
        },
        legend: { symbolType: 'stroke', symbolStrokeColor: '#444', symbolStrokeWidth: 2 },
      },
    },
  };
}

// n of `sorted`, evenly spread, the first and the last among them.
function pick(sorted: readonly number[], n: number): number[] {
  if (sorted.length <= n) return [...sorted];
  return [...new Set(Array.from({ length: n }, (_, i) => sorted[Math.round((i * (sorted.length - 1)) / (n - 1))]!))];
}

// Each side has one receive posted on entry and again on return.
async function run(
  pair: Pair,
  buf: [Region, Region],
  sge: (side: 0 | 1) => Sge[],
  size: number,
  iters: number,
  evict: boolean,
  bar?: Progress,
  trace?: TraceFile,
): Promise<Run> {
  const { ctx, cq, qp, cluster } = pair;
  const before = ctx.map((c) => c.faultLibrary.stats());
  const nacksBefore = cluster.system.nodes.reduce((a, n) => a + n.pldma.counters().nacksReceived, 0);
  const r: Run = {
    size,
    iters,
    evict,
    modelUs: [],
    realUs: [],
    seconds: 0,
    faults: { source: 0, destination: 0 },
    pagesMadeResident: 0,
    retransmitted: 0,
    nacks: 0,
    errors: 0,
  };
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
    trace?.sample(ctx, i < TRACED_ROUND_TRIPS);
    const t0 = performance.now();
    const ping = await message(0, 1, i);
    const pong = await message(1, 0, i);
    const rtt = (performance.now() - t0) * 1000;
    r.realUs.push(rtt / 2);
    r.modelUs.push(((ping.odp?.modelUs ?? 0) + (pong.odp?.modelUs ?? 0)) / 2);
    r.retransmitted += (ping.odp?.retransmittedBlocks ?? 0) + (pong.odp?.retransmittedBlocks ?? 0);
    bar?.tick(`${sizeName(size)} B ${evict ? 'evicted' : 'resident'}`);
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
