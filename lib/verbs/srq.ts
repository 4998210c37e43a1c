// Shared receive queues (struct ibv_srq): one pool of receive WQEs that several QPs of a PD
// take their receives from. The provider's face: the SRQ is a device record in the node's
// tables (kernel-sim/rc/tables.ts's RcSrq: its ring, PD, limit, and for XRC its domain and
// CQ), entered here at creation; postRecv writes WQEs into its ring. The device's responder
// takes a WQE off it when a SEND's first packet (or a WRITE with immediate's last) is
// admitted: the message holds it until it completes on its own QP's receive CQ; none left is
// an RNR NAK, as a QP's own empty receive queue is. The limit event is rdma_rxe's: once armed
// (srq_limit > 0), the first take that leaves fewer WQEs than the limit raises
// IBV_EVENT_SRQ_LIMIT_REACHED on the device's event line, which the context reports, and
// disarms it (srq_limit back to 0).
import { closedError } from '../errors.js';
import { checkInt, checkObject, known } from '../validate.js';
import type { RcRecvWqe, RcSrq } from '../../kernel-sim/index.js';
import { verbsError } from './errors.js';
import type { CompletionQueue } from './cq.js';
import type { ProtectionDomain, VerbsProcess } from './mr.js';
import type { RecvWr } from './qp-core.js';
import { checkRecvWr } from './wr-check.js';
import { XrcDomain } from './xrc.js';
import { QueueKind } from '../../kernel-sim/device/abi.js';
import { RecvRing } from '../../kernel-sim/device/recv-ring.js';

const SRQ_INIT_KEYS = known<SrqInitAttr>({ maxWr: true, maxSge: true, srqLimit: true, srqType: true, xrcd: true, cq: true });

/** enum ibv_srq_type */
export enum SrqType {
  /** A plain SRQ: QPs created with `{ srq }` take their receives from it. */
  BASIC = 0,
  /** An XRC SRQ: in an XRC domain, with a number (srqNum) that XRC requests name and a CQ of its own. */
  XRC = 1,
}

/** Attributes of a new SRQ (struct ibv_srq_init_attr's attr), as `Context.createSrq` takes them. */
export interface SrqInitAttr {
  /** Most receive WQEs the SRQ holds (max_wr, default 128). */
  maxWr?: number;
  /** Most scatter/gather entries of one receive WQE (max_sge, default 4). */
  maxSge?: number;
  /** The limit event's threshold (srq_limit, default 0: not armed). */
  srqLimit?: number;
  /** ibv_srq_init_attr_ex.srq_type (default BASIC). */
  srqType?: SrqType;
  /** XRC: the XRC domain (openXrcd) the SRQ belongs to. */
  xrcd?: XrcDomain;
  /** XRC: the CQ its receives complete on (the target QP has none). */
  cq?: CompletionQueue;
}

/** struct ibv_srq_attr, as `SharedReceiveQueue.query` returns it. */
export interface SrqAttr {
  /** Most receive WQEs the SRQ holds. */
  maxWr: number;
  /** Most scatter/gather entries of one receive WQE. */
  maxSge: number;
  /** The armed limit, or 0 when not armed (the event fired, or never armed). */
  srqLimit: number;
}

/** A shared receive queue (struct ibv_srq): `postRecv` fills it, QPs created with `srq` take their receives from it. */
export class SharedReceiveQueue {
  /** The context (process) that created the SRQ. */
  readonly context: VerbsProcess;
  /** The SRQ's protection domain: its QPs are in the same one. */
  readonly pd: ProtectionDomain;
  /** Most scatter/gather entries of one receive WQE (max_sge). */
  readonly maxSge: number;
  /** @internal QPs that take their receives from this SRQ (ibv_destroy_srq fails with EBUSY while any is left). */
  readonly users = new Set<object>();
  /** BASIC or XRC. */
  readonly srqType: SrqType;
  /** XRC: its domain. */
  readonly xrcd: XrcDomain | undefined;
  /** XRC: the CQ its receives complete on. */
  readonly cq: CompletionQueue | undefined;
  /** XRC: the number XRC requests name it by (ibv_get_srq_num); undefined for a BASIC SRQ. */
  readonly srqNum: number | undefined;
  #maxWr: number;
  /** @internal The SRQ's record in its device's tables: its ring (the device's responder takes from it), its limit. */
  readonly rc: RcSrq;
  #limitReached: (srq: SharedReceiveQueue) => void;
  #destroyed = false;

  /** @internal use Context.createSrq */
  constructor(context: VerbsProcess, pd: ProtectionDomain, attr: SrqInitAttr, limitReached: (srq: SharedReceiveQueue) => void) {
    checkObject('createSrq: attr', attr, SRQ_INIT_KEYS);
    this.context = context;
    this.pd = pd;
    this.#maxWr = checkInt('createSrq: maxWr', attr.maxWr ?? 128, 1, 1 << 16);
    this.maxSge = checkInt('createSrq: maxSge', attr.maxSge ?? 4, 1, 16);
    const limit = this.#checkLimit('ibv_create_srq', attr.srqLimit ?? 0);
    this.#limitReached = limitReached;
    this.srqType = attr.srqType ?? SrqType.BASIC;
    if (this.srqType !== SrqType.BASIC && this.srqType !== SrqType.XRC)
      throw verbsError('ibv_create_srq', 'EOPNOTSUPP', `srqType ${String(attr.srqType)}: BASIC and XRC SRQs are modelled (no tag matching)`);
    if (this.srqType === SrqType.XRC) {
      if (!(attr.xrcd instanceof XrcDomain)) throw verbsError('ibv_create_srq', 'EINVAL', 'an XRC SRQ needs xrcd: an XrcDomain from openXrcd()');
      attr.xrcd.check('ibv_create_srq');
      if (!attr.cq || typeof (attr.cq as { complete?: unknown }).complete !== 'function')
        throw verbsError('ibv_create_srq', 'EINVAL', 'an XRC SRQ needs cq: the CQ its receives complete on');
    } else if (attr.xrcd !== undefined || attr.cq !== undefined)
      throw verbsError('ibv_create_srq', 'EINVAL', 'xrcd and cq are for XRC SRQs (srqType: SrqType.XRC)');
    this.xrcd = attr.xrcd;
    this.cq = attr.cq;
    // The device's record, by a handle of the device's (an XRC SRQ's number is its handle).
    const tables = pd.device.tables;
    this.rc = tables.addSrq(
      (handle) => ({
        handle,
        pd: pd.rc,
        ring: new RecvRing<RcRecvWqe>(this.#maxWr, this.maxSge, QueueKind.SRQ, handle),
        limit,
        xrcd: attr.xrcd?.handle,
        cq: attr.cq?.ring,
        destroyed: false,
      }),
      this,
    );
    this.srqNum = this.srqType === SrqType.XRC ? this.rc.handle : undefined;
    if (this.srqNum !== undefined) attr.xrcd!.srqs.set(this.srqNum, this);
    pd.users.add(this);
  }

  /** @internal The device raised SRQ_LIMIT_REACHED on its event line for this SRQ (it disarmed it). */
  limitReached(): void {
    this.#limitReached(this);
  }

  /** True once `destroy()` was called (or its context closed). */
  get destroyed(): boolean {
    return this.#destroyed;
  }

  /** Receive WQEs posted and not yet taken by a message. */
  get length(): number {
    return this.rc.ring.length;
  }

  /** ibv_query_srq */
  query(): SrqAttr {
    this.#check();
    return { maxWr: this.#maxWr, maxSge: this.maxSge, srqLimit: this.rc.limit };
  }

  /**
   * ibv_modify_srq: `srqLimit` arms the limit event (IBV_SRQ_LIMIT; it must not exceed maxWr),
   * `maxWr` resizes (IBV_SRQ_MAX_WR; not below the WQEs it holds).
   */
  modify(attr: { srqLimit?: number; maxWr?: number }): void {
    this.#check();
    checkObject('modify: attr', attr, ['srqLimit', 'maxWr']);
    if (attr.maxWr !== undefined) {
      const n = checkInt('maxWr', attr.maxWr, 1, 1 << 16);
      const old = this.rc.ring;
      if (n < old.length) throw verbsError('ibv_modify_srq', 'EINVAL', `maxWr ${n} is below the ${old.length} WQEs the SRQ holds`);
      this.#maxWr = n;
      // A ring too small for the new size is replaced by one that holds it, its WQEs moved over.
      if (n > old.numElems) {
        const ring = new RecvRing<RcRecvWqe>(n, this.maxSge, QueueKind.SRQ, this.rc.handle);
        for (const w of old.drain()) ring.push(w);
        this.rc.ring = ring;
      }
    }
    if (attr.srqLimit !== undefined) this.rc.limit = this.#checkLimit('ibv_modify_srq', attr.srqLimit);
  }

  /** ibv_post_srq_recv: checked like QueuePair.postRecv; ENOMEM past maxWr, nothing queued then. */
  postRecv(wrs: RecvWr | RecvWr[]): void {
    this.#check();
    const list = Array.isArray(wrs) ? wrs : [wrs];
    const ring = this.rc.ring;
    if (ring.length + list.length > this.#maxWr)
      throw verbsError(
        'ibv_post_srq_recv',
        'ENOMEM',
        `the SRQ holds at most ${this.#maxWr} WQEs (${ring.length} posted); poll completions before posting more, or modify({ maxWr })`,
      );
    list.forEach((wr, i) => checkRecvWr(wr, i, this.maxSge));
    // The provider's step: each checked WR written as a WQE into the ring (room checked above).
    for (const wr of list) ring.push(wr);
  }

  /** ibv_destroy_srq: EBUSY while QPs use it; the WQEs it still holds are dropped. */
  destroy(): void {
    if (this.#destroyed) return;
    if (this.users.size)
      throw verbsError('ibv_destroy_srq', 'EBUSY', `${this.users.size} QP(s) still take their receives from this SRQ; destroy them first`);
    this.#destroyed = true;
    this.rc.destroyed = true;
    this.rc.ring.drain();
    this.pd.users.delete(this);
    this.pd.device.tables.removeSrq(this.rc.handle);
    if (this.xrcd && this.srqNum !== undefined) this.xrcd.srqs.delete(this.srqNum);
  }

  /** Same as `destroy()`, for `using`. */
  [Symbol.dispose](): void {
    this.destroy();
  }

  #checkLimit(verb: string, v: number): number {
    const n = checkInt('srqLimit', v, 0, 1 << 16);
    if (n > this.#maxWr) throw verbsError(verb, 'EINVAL', `srqLimit ${n} exceeds maxWr ${this.#maxWr}`);
    return n;
  }

  #check(): void {
    if (this.#destroyed) throw closedError('SharedReceiveQueue');
  }
}
