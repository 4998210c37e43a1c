// The one completion the library still writes: a receive posted to a QP already in ERR
// completes WR_FLUSH_ERR at once (the device completes every other receive and send itself),
// its CQE going into its CQ's ring through the device's post (CompletionRing.post). A CQ that overflows behaves as in libibverbs: the CQ goes to error,
// IBV_EVENT_CQ_ERR is reported, and the QP moves to ERR; no completion vanishes without that.
// Send completions are the device's own (kernel-sim/rc/completer.ts, WqeCompleter).
import type { RcOdp } from '../../kernel-sim/index.js';
import type { WcOpcode, WcStatus } from './constants.js';
import type { CompletionQueue } from './cq.js';

/** The faults and times of a transfer, as a work completion reports them. */
export type Odp = RcOdp;

/** What the completer needs of its QP. */
export interface CompleterQp {
  readonly qpNum: number;
  /** The QP this one is connected to (the default source QP of a completion). */
  readonly destQpNum: number;
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
