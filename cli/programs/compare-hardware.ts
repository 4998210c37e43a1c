// One workload under every hardware preset, side by side and interleaved (preset after preset,
// message after message, so the machine's load falls on all alike): a ping-pong whose buffers
// are evicted before every message, and one 1 MiB RDMA WRITE into evicted memory. The time is
// the engine's modelled time under each preset's cost model and fault handling; the faults are
// real (real memory evicted, real page faults resolved by the fault library).
import {
  Access,
  HARDWARE_NAMES,
  hardwarePreset,
  mapRegion,
  SendFlags,
  WcStatus,
  WrOpcode,
  type Region,
  type WorkCompletion,
} from '../../lib/index.js';
import { MODEL_LABEL } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import { PLOT_CONFIG, type PlotSpec } from './support/plot.js';

/** The workloads compare-hardware runs. */
export const WORKLOADS = ['pingpong', 'write-1m'] as const;
export type Workload = (typeof WORKLOADS)[number];

export interface CompareOptions {
  /** Presets to compare (default all). */
  presets?: readonly string[];
  /** Workloads (default all). */
  workloads?: readonly Workload[];
  /** Ping-pong round trips (default 20); 1 MiB writes (a third of it, at least 2). */
  iters?: number;
  /** mlx5-odp's min_rnr_timer code (default 1: 10 µs). */
  minRnrTimer?: number;
}

/** One preset's figures on one workload. */
export interface CompareRow {
  workload: Workload;
  preset: string;
  faultMode: string;
  /** Messages (ping-pong: one-way messages; write-1m: writes). */
  messages: number;
  /** Modelled µs per message (ping-pong: one way; write-1m: per write). */
  modelUs: number;
  faults: { source: number; destination: number };
  /** Blocks sent again after a fault (NACK or RNR NAK retries). */
  retransmissions: number;
  /** RNR NAK waits (mlx5-odp: timer periods the requester waited). */
  rnrWaits: number;
  /** Faults the access waited out in place (stall / inline presets). */
  stalls: number;
  /** Failed completions or wrong payloads (must be 0). */
  errors: number;
}

interface Rig {
  preset: string;
  pair: Pair;
  buf: [Region, Region];
  row: CompareRow;
  lkey: [number, number];
  addr: [bigint, bigint];
  rkey: number;
  totalUs: number;
  resent: number;
}

function rig(preset: string, workload: Workload, size: number, minRnrTimer: number): Rig {
  const pair = connectedPair({ hardware: { name: preset, minRnrTimer } });
  const { ctx, pd } = pair;
  const buf: [Region, Region] = [mapRegion(size), mapRegion(size)];
  const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
  const mr = [ctx[0].regMr(pd[0], buf[0], 0, size, access), ctx[1].regMr(pd[1], buf[1], 0, size, access)] as const;
  return {
    preset,
    pair,
    buf,
    lkey: [mr[0].lkey, mr[1].lkey],
    addr: [mr[0].addr, mr[1].addr],
    rkey: mr[1].rkey,
    totalUs: 0,
    resent: 0,
    row: {
      workload,
      preset,
      faultMode: hardwarePreset(preset).faultMode,
      messages: 0,
      modelUs: 0,
      faults: { source: 0, destination: 0 },
      retransmissions: 0,
      rnrWaits: 0,
      stalls: 0,
      errors: 0,
    },
  };
}

function account(r: Rig, wc: WorkCompletion): void {
  if (wc.status !== WcStatus.SUCCESS) r.row.errors++;
  r.totalUs += wc.odp?.modelUs ?? 0;
  r.row.faults.source += wc.odp?.faults.source ?? 0;
  r.row.faults.destination += wc.odp?.faults.destination ?? 0;
  r.resent += wc.odp?.retransmittedBlocks ?? 0;
  r.row.messages++;
}

async function pingMessage(r: Rig, from: 0 | 1, i: number): Promise<void> {
  const to = (1 - from) as 0 | 1;
  const { qp, cq } = r.pair;
  for (const b of r.buf) b.evict();
  qp[from].postSend({
    wrId: i,
    opcode: WrOpcode.SEND_WITH_IMM,
    immData: i,
    sgList: [{ addr: r.addr[from], length: 4096, lkey: r.lkey[from] }],
    sendFlags: SendFlags.SIGNALED,
  });
  account(r, await cq[from].next());
  const got = await cq[to].next();
  if (got.status !== WcStatus.SUCCESS || got.immData !== i) r.row.errors++;
  qp[to].postRecv({ wrId: i, sgList: [{ addr: r.addr[to], length: 4096, lkey: r.lkey[to] }] });
}

async function writeMessage(r: Rig, i: number, size: number): Promise<void> {
  const { qp, cq } = r.pair;
  const src = new Uint8Array(r.buf[0].buffer);
  src.fill((i + 1) & 0xff);
  r.buf[1].evict();
  qp[0].postSend({
    wrId: i,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [{ addr: r.addr[0], length: size, lkey: r.lkey[0] }],
    rdma: { remoteAddr: r.addr[1], rkey: r.rkey },
    sendFlags: SendFlags.SIGNALED,
  });
  account(r, await cq[0].next());
  const dst = new Uint8Array(r.buf[1].buffer);
  if (dst[0] !== src[0] || dst[size - 1] !== src[0]) r.row.errors++;
}

/** Run every workload under every preset, interleaved; returns a row per (workload, preset). */
export async function compareHardware(o: CompareOptions = {}): Promise<CompareRow[]> {
  const presets = o.presets ?? HARDWARE_NAMES;
  for (const p of presets) hardwarePreset(p);
  const workloads = o.workloads ?? WORKLOADS;
  const iters = o.iters ?? 20;
  const rows: CompareRow[] = [];
  for (const w of workloads) {
    const size = w === 'pingpong' ? 4096 : 1 << 20;
    const rigs = presets.map((p) => rig(p, w, size, o.minRnrTimer ?? 1));
    try {
      if (w === 'pingpong')
        for (const r of rigs)
          for (const s of [0, 1] as const) r.pair.qp[s].postRecv({ wrId: 0, sgList: [{ addr: r.addr[s], length: 4096, lkey: r.lkey[s] }] });
      const n = w === 'pingpong' ? iters : Math.max(2, Math.ceil(iters / 3));
      for (let i = 0; i < n; i++)
        for (const r of rigs) {
          if (w === 'pingpong') {
            await pingMessage(r, 0, i);
            await pingMessage(r, 1, i);
          } else await writeMessage(r, i, size);
        }
      for (const r of rigs) {
        const h = r.pair.cluster.system.hardwareCounters;
        r.row.modelUs = r.totalUs / r.row.messages;
        r.row.rnrWaits = h.rnrWaits;
        r.row.stalls = h.stalls;
        // A fault waited out in place sends nothing again: the engine's re-send is its model.
        r.row.retransmissions = h.stalls > 0 ? 0 : r.resent;
        rows.push(r.row);
      }
    } finally {
      for (const r of rigs) {
        r.pair.cluster.close();
        for (const b of r.buf) b.close();
      }
    }
  }
  return rows;
}

/** The rows as a table (one line each, under 100 columns). */
export function compareTable(rows: readonly CompareRow[]): string {
  const head = `${'workload'.padEnd(9)} ${'preset'.padEnd(14)} ${'fault mode'.padEnd(15)} ${'model µs/msg'.padStart(13)} ${'faults s+d'.padStart(11)} ${'resent'.padStart(7)} ${'RNR waits'.padStart(9)} ${'stalls'.padStart(7)}`;
  const lines = rows.map(
    (r) =>
      `${r.workload.padEnd(9)} ${r.preset.padEnd(14)} ${r.faultMode.padEnd(15)} ${r.modelUs.toFixed(2).padStart(13)} ${`${r.faults.source}+${r.faults.destination}`.padStart(11)} ${String(r.retransmissions).padStart(7)} ${String(r.rnrWaits).padStart(9)} ${String(r.stalls).padStart(7)}`,
  );
  return [head, ...lines].join('\n');
}

/** A bar per preset and workload: modelled µs per message (log scale), the preset named. */
export function comparePlot(rows: readonly CompareRow[]): PlotSpec {
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: { text: 'The same workload under each hardware preset', subtitle: `time: ${MODEL_LABEL}` },
    data: { values: rows.map((r) => ({ workload: r.workload, preset: r.preset, us: r.modelUs, faultMode: r.faultMode })) },
    facet: { column: { field: 'workload', type: 'nominal', title: null } },
    spec: {
      width: 220,
      height: 220,
      mark: 'bar',
      encoding: {
        x: { field: 'preset', type: 'nominal', title: 'hardware preset', sort: null },
        y: { field: 'us', type: 'quantitative', scale: { type: 'log' }, title: 'modelled µs per message (log)' },
        color: { field: 'faultMode', type: 'nominal', title: 'fault mode' },
        tooltip: [{ field: 'preset' }, { field: 'us', format: '.2f' }],
      },
    },
    resolve: { scale: { y: 'independent' } },
    config: PLOT_CONFIG,
  } as PlotSpec;
}
