// The verbs half of a QP's completer (rdma_rxe's rxe_comp): the ACKs and NAKs, their
// retransmissions and the RNR timer are the engine's (kernel-sim/rc/completer.ts); here
// the outcome of a work request becomes its libibverbs status (statusOf) and the work
// completion goes on the QP's own CQ. A CQ that overflows behaves as in libibverbs: the CQ
// goes to error, IBV_EVENT_CQ_ERR is reported, and the QP moves to ERR; no completion
// vanishes without that.
import { DmaStatus, type DmaCompletion, type RcOdp } from '../../kernel-sim/index.js';
import { type QpState, WcStatus, type WcOpcode } from './constants.js';
import type { CompletionQueue } from './cq.js';

/** The faults and times of a transfer, as a work completion reports them. */
export type Odp = RcOdp;

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

  constructor(qp: CompleterQp) {
    this.#qp = qp;
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
    solicited?: boolean,
  ): void {
    const qpNum = this.#qp.qpNum;
    if (!cq.complete(BigInt(wrId), status, opcode, byteLen, qpNum, srcQp ?? this.#qp.destQpNum, immData, odp, solicited)) this.#qp.toError();
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
