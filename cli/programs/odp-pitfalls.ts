// ODP's pitfalls under the mlx5-odp preset. (1) The min_rnr_timer sweep: a receive-side fault is
// answered with an RNR NAK and the requester retries after the responder's min_rnr_timer (the
// IB spec's encoding, where 0 means 655.36 ms): at 0 every receive fault costs 655.36 ms (the
// cliff); past the fault's service time a single wait suffices and the cost is the timer itself
// (the knee). Each point is a real 4 KiB RDMA WRITE into evicted memory, timed by the engine.
// (2) Fukuoka, Sato and Taura, "Pitfalls of InfiniBand with On-Demand Paging" (ISPASS 2021): a
// fault the NIC cannot NAK (a requester-side fault on an RDMA READ's response data, which the
// HCA drops) is recovered only by the QP's local ACK timeout, 4.096 µs × 2^timeout, retried up
// to retry_cnt times: three to four orders of magnitude over a common-case fault.
import { Access, ackTimeoutUs, mapRegion, RNR_TIMER_US, SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { MODEL_LABEL } from './support/format.js';
import { connectedPair } from './support/pair.js';
import { PLOT_CONFIG, type PlotSpec } from './support/plot.js';

/** One min_rnr_timer code: modelled µs per 4 KiB WRITE into evicted memory, and the RNR waits per write. */
export interface RnrPoint {
  code: number;
  timerUs: number;
  modelUs: number;
  waitsPerWrite: number;
}

/** One QP timeout: the timeout path's modelled cost against the common-case fault. */
export interface TimeoutPoint {
  timeout: number;
  timeoutUs: number;
  /** Timeouts waited before a retry found the fault served (≤ retry_cnt). */
  tries: number;
  /** The READ's modelled µs on the timeout path (RETRY_EXC_ERR when tries > retry_cnt: Infinity). */
  pathUs: number;
  /** pathUs over the common-case fault (the RNR path with a timer below the service time). */
  ratio: number;
  /** log10 of the ratio: orders of magnitude. */
  orders: number;
}

export interface PitfallsResult {
  rnr: RnrPoint[];
  /** The fault's service time under mlx5-odp (the knee is where the timer passes it), modelled µs. */
  serviceUs: number;
  /** The first code whose timer is at least the service time (one RNR wait per fault). */
  kneeCode: number;
  /** The common-case fault: a 4 KiB WRITE into evicted memory minus the resident one, at min_rnr_timer 1. */
  commonFaultUs: number;
  timeouts: TimeoutPoint[];
  retryCnt: number;
}

/** Modelled µs of `writes` 4 KiB WRITEs into evicted (or resident) memory under mlx5-odp with min_rnr_timer `code`. */
export async function writeIntoEvicted(code: number, writes: number, evict = true): Promise<{ modelUs: number; waits: number }> {
  const pair = connectedPair({ hardware: { name: 'mlx5-odp', minRnrTimer: code } });
  const src = mapRegion(4096);
  const dst = mapRegion(4096);
  try {
    const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
    const a = pair.ctx[0].regMr(pair.pd[0], src, 0, 4096, access);
    const b = pair.ctx[1].regMr(pair.pd[1], dst, 0, 4096, access);
    new Uint8Array(src.buffer).fill(0x5a);
    if (!evict) dst.populate();
    let total = 0;
    for (let i = 0; i < writes; i++) {
      if (evict) dst.evict();
      pair.qp[0].postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: a.addr, length: 4096, lkey: a.lkey }],
        rdma: { remoteAddr: b.addr, rkey: b.rkey },
        sendFlags: SendFlags.SIGNALED,
      });
      const wc = await pair.cq[0].next();
      if (wc.status !== WcStatus.SUCCESS) throw new Error(`odp-pitfalls: the WRITE completed with status ${wc.status}`);
      if (new Uint8Array(dst.buffer)[4095] !== 0x5a) throw new Error('odp-pitfalls: the WRITE did not land');
      total += wc.odp?.modelUs ?? 0;
    }
    return { modelUs: total / writes, waits: pair.cluster.system.hardwareCounters.rnrWaits / writes };
  } finally {
    pair.cluster.close();
    src.close();
    dst.close();
  }
}

/** The sweep and the timeout path (writes per point default 2; timeouts 4..22; retry_cnt default 7). */
export async function odpPitfalls(o: { writes?: number; retryCnt?: number; timeouts?: readonly number[] } = {}): Promise<PitfallsResult> {
  const writes = o.writes ?? 2;
  const retryCnt = o.retryCnt ?? 7;
  const resident = await writeIntoEvicted(1, writes, false);
  const rnr: RnrPoint[] = [];
  for (let code = 0; code < 32; code++) {
    const r = await writeIntoEvicted(code, writes);
    rnr.push({ code, timerUs: RNR_TIMER_US[code]!, modelUs: r.modelUs, waitsPerWrite: r.waits });
  }
  const commonFaultUs = rnr[1]!.modelUs - resident.modelUs;
  // The service time: what the fault costs with the finest timer, less its quantisation (one timer at most).
  const serviceUs = commonFaultUs - RNR_TIMER_US[1]! / 2;
  const kneeCode = rnr.findIndex((p) => p.code > 0 && p.waitsPerWrite <= 1);
  const timeouts: TimeoutPoint[] = [];
  for (const t of o.timeouts ?? Array.from({ length: 19 }, (_, i) => i + 4)) {
    const T = ackTimeoutUs(t);
    // The response was dropped: nothing happens until the ACK timer fires; the retried READ
    // faults again (and is dropped again) until the fault has been served.
    const tries = Math.max(1, Math.ceil(serviceUs / T));
    const pathUs = tries > retryCnt ? Infinity : tries * T + resident.modelUs;
    const ratio = pathUs / commonFaultUs;
    timeouts.push({ timeout: t, timeoutUs: T, tries, pathUs, ratio, orders: Math.log10(ratio) });
  }
  return { rnr, serviceUs, kneeCode, commonFaultUs, timeouts, retryCnt };
}

/** The explanation and the tables (lines under 100 columns). */
export function pitfallsReport(r: PitfallsResult): string {
  const L: string[] = [];
  L.push(`time: ${MODEL_LABEL}.`);
  L.push('');
  L.push('1. min_rnr_timer sweep (mlx5-odp; a real 4 KiB RDMA WRITE into evicted memory per point)');
  L.push('   A receive-side fault is answered with an RNR NAK; the requester waits min_rnr_timer and');
  L.push('   retries, again and again until the fault is served (rnr_retry = 7: forever).');
  L.push(` code   timer µs   µs per write   RNR waits`);
  for (const p of r.rnr)
    L.push(
      ` ${String(p.code).padStart(4)} ${p.timerUs.toFixed(2).padStart(10)} ${p.modelUs.toFixed(2).padStart(14)} ${p.waitsPerWrite.toFixed(1).padStart(11)}` +
        (p.code === 0 ? '   <- the cliff: 0 means 655.36 ms' : p.code === r.kneeCode ? '   <- the knee: the timer passes the service time' : ''),
    );
  L.push(`   The fault's service time is ${r.serviceUs.toFixed(1)} µs: below code ${r.kneeCode} the requester polls`);
  L.push('   with NAKs until it is served; from there one wait suffices and the timer itself is the cost.');
  L.push('   Avoid code 0 (rdma-core examples use 12 = 640 µs: about 3x a 220 µs fault).');
  L.push('');
  L.push('2. The timeout path (Fukuoka, Sato, Taura, ISPASS 2021: "Pitfalls of InfiniBand with ODP")');
  L.push("   A fault the HCA cannot NAK - the requester's own buffer faulting under an RDMA READ's");
  L.push('   response - drops the response; only the local ACK timeout, 4.096 µs x 2^timeout, retries,');
  L.push(`   up to retry_cnt = ${r.retryCnt} times (then IBV_WC_RETRY_EXC_ERR). The common-case fault here:`);
  L.push(`   ${r.commonFaultUs.toFixed(1)} µs (the engine's RNR path above, min_rnr_timer 1). Computed from the`);
  L.push("   engine's service time and the IB timer, not run through the engine's READ path.");
  L.push(' timeout   timer µs   tries   path µs        x common   orders');
  for (const t of r.timeouts)
    L.push(
      ` ${String(t.timeout).padStart(7)} ${t.timeoutUs.toFixed(1).padStart(10)} ${String(t.tries).padStart(7)} ` +
        `${(Number.isFinite(t.pathUs) ? t.pathUs.toFixed(1) : 'RETRY_EXC').padStart(12)} ${(Number.isFinite(t.ratio) ? t.ratio.toFixed(1) : '-').padStart(12)}` +
        ` ${(Number.isFinite(t.orders) ? t.orders.toFixed(2) : '-').padStart(8)}` +
        (t.timeout === 14 ? '  <- rdma-core tests, rc_pingpong' : ''),
    );
  const three = r.timeouts.filter((t) => t.orders >= 3 && t.orders <= 4).map((t) => t.timeout);
  L.push(`   Three to four orders of magnitude at timeout ${three[0] ?? '-'}..${three[three.length - 1] ?? '-'}.`);
  const safe = r.timeouts.find((t) => Number.isFinite(t.pathUs) && t.tries <= 1);
  L.push('   What avoids it: prefetch the READ target (ibv_advise_mr PREFETCH_WRITE, FLAG_FLUSH) so no');
  L.push('   response faults; failing that, the smallest timeout whose timer passes the fault service');
  L.push(`   (timeout ${safe?.timeout ?? '-'}: ${safe ? safe.timeoutUs.toFixed(1) : '-'} µs), with retry_cnt high enough that a slower fault`);
  L.push('   retries instead of failing. A small timeout also retransmits sooner on real loss.');
  return L.join('\n');
}

/** The sweep's plot: µs per write against the min_rnr_timer code (log), the cliff and the knee visible. */
export function pitfallsPlot(r: PitfallsResult): PlotSpec {
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: { text: 'mlx5-odp: a receive-side fault against min_rnr_timer', subtitle: `preset mlx5-odp; time: ${MODEL_LABEL}` },
    width: 520,
    height: 260,
    data: { values: r.rnr.map((p) => ({ code: p.code, us: p.modelUs, timer: p.timerUs })) },
    layer: [
      {
        mark: { type: 'line', point: true },
        encoding: {
          x: { field: 'code', type: 'ordinal', title: 'min_rnr_timer code (0 = 655.36 ms)' },
          y: { field: 'us', type: 'quantitative', scale: { type: 'log' }, title: 'modelled µs per 4 KiB write into evicted memory' },
        },
      },
    ],
    config: PLOT_CONFIG,
  } as PlotSpec;
}
