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

/** What the CQ's event line says (the completion vector, rxe's comp_handler; a C provider's eventfd). */
export enum CqEvent {
  /** A CQE was written. */
  COMPLETION = 0,
  /** A CQE found the CQ full: the CQ is in error from now on (IBV_EVENT_CQ_ERR), once. */
  OVERRUN = 1,
}

/**
 * The device's side of a CQ: a ring of `capacity` usable entries (the `cqe` asked for; the
 * ring's slots are the next power of two). `write` is the producer's step; `complete` is the
 * device's CQE writer (the send side's completer and the responder's receives both write
 * through it): a CQ that is full when a CQE must be written is overrun, the CQ goes to error
 * and the caller moves its QP to ERR. The provider reads the ring and the state fields below;
 * the device tells it of each CQE on the event line (`onEvent`), nothing else.
 */
export class CompletionRing extends Ring {
  readonly capacity: number;
  /** Set once a CQE found the CQ full (IBV_EVENT_CQ_ERR): as on hardware, it stays in error. */
  error = false;
  /** CQEs that found the CQ full (each moved its QP to ERR). */
  overruns = 0;
  /** Set by the provider at ibv_destroy_cq: CQEs for it are dropped. */
  closed = false;
  /** Waiters the provider has on the CQ (it writes this; one means the ring is empty): a CQ in error still hands them a CQE. */
  waiting = 0;
  /** The CQ's event line: told after each CQE, and once at the overrun. */
  onEvent: ((e: CqEvent, status: number, solicited: boolean) => void) | undefined;

  constructor(capacity: number, handle = 0) {
    const g = cqGeometry(capacity);
    super({ kind: QueueKind.CQ, numElems: g.numElems, log2: g.log2 }, handle);
    this.capacity = capacity;
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
    if (!this.hasRoom) return false;
    const v = this.view;
    const at = this.slot(this.producer);
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

  /**
   * The device's CQE writer: `write`, then the event line. False if the CQ overran (the CQ
   * goes to error, said once on the event line): the caller moves its QP to ERR. A closed CQ
   * takes nothing (true). `solicited`: a receive whose sender set SE.
   */
  complete(
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
    if ((this.error && this.waiting === 0) || !this.write(wrId, status, opcode, byteLen, qpNum, srcQp, immData, odp)) {
      this.overruns++;
      if (!this.error) {
        this.error = true;
        this.onEvent?.(CqEvent.OVERRUN, status, solicited);
      }
      return false;
    }
    this.onEvent?.(CqEvent.COMPLETION, status, solicited);
    return true;
  }
}
