// The completer of a QP (rdma_rxe's rxe_comp): it reads the answers of the QP's requests (the
// responder's ACK or NAK, matched by psn), retries an RNR NAK min_rnr_timer apart, rnrRetry
// times (7: forever), on an unref'd timer, turns the outcome of a work request into its
// libibverbs status (statusOf) and writes the work completion on the QP's own CQ. A CQ that
// overflows behaves as in libibverbs: the CQ goes to error, IBV_EVENT_CQ_ERR is reported,
// and the QP moves to ERR; no completion vanishes without that.
import { DmaStatus, type DmaCompletion } from '../../kernel-sim/index.js';
import { QpState, rnrTimerMs, WcFlags, WcStatus, type WcOpcode } from './constants.js';
import type { CompletionQueue } from './cq.js';
import type { Odp, Response } from './wire.js';

export type Outcome = { status: WcStatus; byteLen: number; odp: Odp };

/** What the completer needs of its QP. */
export interface CompleterQp {
  readonly qpNum: number;
  /** The QP this one is connected to (the default source QP of a completion). */
  readonly destQpNum: number;
  readonly state: QpState;
  readonly rnrRetry: number;
  toError(): void;
}

export class Completer {
  #qp: CompleterQp;
  /** Requests sent and waiting for their answer, by psn. */
  #waiting = new Map<number, (r: Response | undefined) => void>();
  #timers = new Set<{ timer: NodeJS.Timeout; wake: () => void }>();

  constructor(qp: CompleterQp) {
    this.#qp = qp;
  }

  /**
   * Send a request (`send` with its psn, a fresh one from `psn()` per attempt) and wait for
   * its answer; an RNR NAK is retried as the QP's rnrRetry says. A QP in ERR (destroyed
   * included) sends nothing more: the request ends WR_FLUSH_ERR.
   */
  async request(send: (psn: number) => void, psn: () => number): Promise<Response> {
    const q = this.#qp;
    for (let attempt = 0; ; attempt++) {
      if (this.#inError()) return this.#flushed();
      const n = psn();
      const r = await new Promise<Response | undefined>((resolve) => {
        this.#waiting.set(n, resolve);
        send(n);
      });
      // No answer (stop()), or one that came in the turn the QP was destroyed: nothing more is posted.
      if (!r || this.#inError()) return this.#flushed();
      if (r.rnr === undefined) return r;
      if (q.rnrRetry !== 7 && attempt >= q.rnrRetry) return { ...r, status: WcStatus.RNR_RETRY_EXC_ERR };
      await this.#sleep(Math.max(1, rnrTimerMs(r.rnr)));
    }
  }

  /** The answer to one of this QP's requests (an ACK, or a NAK with its status). */
  onResponse(m: Response): void {
    const w = this.#waiting.get(m.psn);
    if (!w) return;
    this.#waiting.delete(m.psn);
    w(m);
  }

  /** The peer's node went away: every answer waited for ends as its retries would have (RETRY_EXC_ERR). */
  peerLost(): void {
    const lost: Response = { kind: 'response', srcQpn: 0, dstQpn: this.#qp.qpNum, psn: 0, status: WcStatus.RETRY_EXC_ERR };
    for (const w of [...this.#waiting.values()]) w(lost);
    this.#waiting.clear();
  }

  /** The QP went to ERR or away: nothing it waits for will be used. */
  stop(): void {
    for (const w of [...this.#waiting.values()]) w(undefined);
    this.#waiting.clear();
    for (const t of [...this.#timers]) {
      clearTimeout(t.timer);
      t.wake();
    }
    this.#timers.clear();
  }

  #inError(): boolean {
    return this.#qp.state === QpState.ERR;
  }

  #flushed(): Response {
    return { kind: 'response', srcQpn: 0, dstQpn: this.#qp.qpNum, psn: 0, status: WcStatus.WR_FLUSH_ERR };
  }

  // An RNR wait neither keeps the process alive nor outlives the QP.
  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = {
        timer: setTimeout(() => {
          this.#timers.delete(t);
          resolve();
        }, ms),
        wake: resolve,
      };
      t.timer.unref();
      this.#timers.add(t);
    });
  }

  complete(
    cq: CompletionQueue,
    wrId: bigint | number,
    status: WcStatus,
    opcode: WcOpcode,
    byteLen: number,
    immData?: number,
    odp?: Odp,
    srcQp?: number,
  ): void {
    const wc: Parameters<CompletionQueue['push']>[0] = {
      wrId: BigInt(wrId),
      status,
      opcode,
      byteLen,
      qpNum: this.#qp.qpNum,
      srcQp: srcQp ?? this.#qp.destQpNum,
      wcFlags: immData !== undefined ? WcFlags.WITH_IMM : 0,
      vendorErr: 0,
    };
    if (immData !== undefined) wc.immData = immData >>> 0;
    if (odp) wc.odp = odp;
    // An overrun CQ takes its QPs to ERR (their later work is flushed into it, and counted).
    if (!cq.push(wc)) this.#qp.toError();
  }
}

export function emptyOdp(): Odp {
  return { faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
}

export function fail(status: WcStatus): Outcome {
  return { status, byteLen: 0, odp: emptyOdp() };
}

/** The outcome of a work request whose bytes moved in `results`. */
export function done(status: WcStatus, byteLen: number, results: DmaCompletion[]): Outcome {
  const odp = emptyOdp();
  let start = Infinity;
  let end = 0;
  for (const r of results) {
    odp.faults.source += r.faults.source;
    odp.faults.destination += r.faults.destination;
    odp.retransmittedBlocks += r.retransmittedBlocks;
    odp.majorFaults += r.pagesFetched;
    odp.realUs = Math.max(odp.realUs, r.real.us);
    start = Math.min(start, r.model.startUs);
    end = Math.max(end, r.model.endUs);
  }
  odp.modelUs = results.length ? end - start : 0;
  return { status, byteLen: status === WcStatus.SUCCESS ? byteLen : 0, odp };
}

/** The work completion status libibverbs would report for a DMA outcome; the completion says which side failed. */
export function statusOf(results: DmaCompletion[]): WcStatus {
  for (const r of results) {
    switch (r.status) {
      case DmaStatus.SUCCESS:
        continue;
      case DmaStatus.SRC_ADDR_ERR:
      case DmaStatus.SRC_PERM_ERR:
        return WcStatus.LOC_PROT_ERR;
      case DmaStatus.DST_ADDR_ERR:
      case DmaStatus.DST_PERM_ERR:
      case DmaStatus.PD_ERR:
        return WcStatus.REM_ACCESS_ERR;
      case DmaStatus.RETRY_EXCEEDED:
        return r.side === 'destination' ? WcStatus.RNR_RETRY_EXC_ERR : WcStatus.RETRY_EXC_ERR;
      case DmaStatus.FAULT_UNRESOLVED:
        return r.side === 'destination' ? WcStatus.REM_ACCESS_ERR : WcStatus.LOC_PROT_ERR;
      case DmaStatus.ABORTED:
        return WcStatus.REM_ABORT_ERR;
      case DmaStatus.FLUSHED:
        return WcStatus.WR_FLUSH_ERR;
      case DmaStatus.DROPPED:
        return WcStatus.RETRY_EXC_ERR;
      case DmaStatus.REM_INV_REQ:
        return WcStatus.REM_INV_REQ_ERR;
      case DmaStatus.REM_OP:
        return WcStatus.REM_OP_ERR;
      default:
        return WcStatus.GENERAL_ERR;
    }
  }
  return WcStatus.SUCCESS;
}
