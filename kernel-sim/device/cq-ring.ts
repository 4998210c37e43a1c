// A completion queue's ring (docs/device-abi.md §2, struct pfr_cqe): the device produces CQEs
// into it, the provider (lib/verbs/cq.ts, or the C provider's ibv_poll_cq) consumes them. The
// layout is abi.ts's `cqe`; the offsets below are read from it once, the hot path writes fields
// straight into the ring's DataView and allocates nothing.
import { cqe, QueueKind } from './abi.js';
import { cqGeometry, Ring } from './rings.js';

/** Offsets of the CQE's fields in its slot. */
export const CQE = cqe.offsets([
  'wc.wr_id',
  'wc.status',
  'wc.opcode',
  'wc.vendor_err',
  'wc.byte_len',
  'wc.ex.imm_data',
  'wc.qp_num',
  'wc.src_qp',
  'wc.wc_flags',
  'odp.faults_source',
  'odp.faults_destination',
  'odp.major_faults',
  'odp.retransmitted_blocks',
  'odp.model_us',
  'odp.real_us',
] as const);

/** ibv_wc_flags' IBV_WC_WITH_IMM: imm_data is valid. */
const WC_WITH_IMM = 1 << 1;

/** The ODP figures of a completion (pfr_wc_odp). */
export interface CqeOdp {
  faults: { source: number; destination: number };
  majorFaults: number;
  retransmittedBlocks: number;
  modelUs: number;
  realUs: number;
}

/** ibv_req_notify_cq's request, as the device keeps it (rxe's cq->notify): none, any, solicited only. */
export enum CqNotify {
  NONE = 0,
  ANY = 1,
  SOLICITED = 2,
}

/**
 * What the device tells whoever consumes a CQ (the provider listens; the device decides
 * nothing by it): a CQE was written, the armed notification fired (the completion channel's
 * event), the CQ overran (IBV_EVENT_CQ_ERR).
 */
export interface CqListener {
  written(): void;
  event(): void;
  overrun(): void;
}

/**
 * The device's side of a CQ: a ring of `capacity` usable entries (the `cqe` asked for; the
 * ring's slots are the next power of two). `write` is the producer's step; `post` is the
 * device's completion (rxe_cq_post): the CQE written, or the CQ overrun, and the armed event.
 */
export class CompletionRing extends Ring {
  readonly capacity: number;
  /** Destroyed (ibv_destroy_cq reached the device): completions for it are dropped. */
  closed = false;
  /** Overran once (IBV_EVENT_CQ_ERR): it stays in error, as on hardware. */
  error = false;
  /** Completions that found the CQ full or in error (each one moved its QP to ERR). */
  overruns = 0;
  /** The provider's request for an event on the next (solicited) completion; cleared when raised. */
  notify = CqNotify.NONE;
  /** The provider waits on the CQ (a blocked poll): a CQE still goes to it on a CQ in error. */
  waiting = false;
  /** Who hears of the CQ's events (the provider's CQ). */
  listener: CqListener | undefined;

  constructor(capacity: number, handle = 0) {
    const g = cqGeometry(capacity);
    super({ kind: QueueKind.CQ, numElems: g.numElems, log2: g.log2 }, handle);
    this.capacity = capacity;
  }

  /**
   * The device completes a WR on this CQ (rxe_cq_post): false if the CQ overran (the caller
   * moves its QP to ERR); the listener hears of the CQE and, if armed for it, of the event.
   * Solicited: a receive whose sender set SOLICITED (BTH SE); an error is always solicited.
   */
  post(
    wrId: bigint,
    status: number,
    opcode: number,
    byteLen: number,
    qpNum: number,
    srcQp: number,
    immData: number | undefined,
    odp: CqeOdp | undefined,
    solicited = false,
  ): boolean {
    if (this.closed) return true;
    if ((this.error && !this.waiting) || !this.write(wrId, status, opcode, byteLen, qpNum, srcQp, immData, odp)) {
      this.overruns++;
      if (!this.error) {
        this.error = true;
        this.listener?.overrun();
      }
      return false;
    }
    this.listener?.written();
    const n = this.notify;
    if (n === CqNotify.NONE || (n === CqNotify.SOLICITED && status === 0 && !solicited)) return true;
    this.notify = CqNotify.NONE;
    this.listener?.event();
    return true;
  }

  /** True if a CQE can be written now. */
  get hasRoom(): boolean {
    return this.count < this.capacity;
  }

  /**
   * Write one CQE and publish it; false (nothing written) if the CQ holds `capacity` entries or
   * its indices are corrupt. `immData` undefined: no immediate (wc_flags without WITH_IMM).
   * `odp` undefined: model_us is NaN (a completion that moved nothing, a flushed WR).
   */
  write(
    wrId: bigint,
    status: number,
    opcode: number,
    byteLen: number,
    qpNum: number,
    srcQp: number,
    immData: number | undefined,
    odp: CqeOdp | undefined,
  ): boolean {
    const at = this.producerSlot(this.capacity);
    if (at < 0) return false;
    const v = this.view;
    v.setBigUint64(at + CQE['wc.wr_id'], wrId, true);
    v.setUint32(at + CQE['wc.status'], status, true);
    v.setUint32(at + CQE['wc.opcode'], opcode, true);
    v.setUint32(at + CQE['wc.vendor_err'], 0, true);
    v.setUint32(at + CQE['wc.byte_len'], byteLen, true);
    v.setUint32(at + CQE['wc.ex.imm_data'], immData === undefined ? 0 : immData >>> 0, false);
    v.setUint32(at + CQE['wc.qp_num'], qpNum, true);
    v.setUint32(at + CQE['wc.src_qp'], srcQp, true);
    v.setUint32(at + CQE['wc.wc_flags'], immData === undefined ? 0 : WC_WITH_IMM, true);
    v.setUint32(at + CQE['odp.faults_source'], odp ? odp.faults.source : 0, true);
    v.setUint32(at + CQE['odp.faults_destination'], odp ? odp.faults.destination : 0, true);
    v.setUint32(at + CQE['odp.major_faults'], odp ? odp.majorFaults : 0, true);
    v.setUint32(at + CQE['odp.retransmitted_blocks'], odp ? odp.retransmittedBlocks : 0, true);
    v.setFloat64(at + CQE['odp.model_us'], odp ? odp.modelUs : NaN, true);
    v.setFloat64(at + CQE['odp.real_us'], odp ? odp.realUs : 0, true);
    this.produced();
    return true;
  }
}
