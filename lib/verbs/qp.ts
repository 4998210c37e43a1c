// Queue pairs: the QP state machine and the verbs that post work, for RC and, on the same
// packets, UD and XRC. The work itself is done by the QP's roles, as in rdma_rxe: its
// requester (requester.ts) runs the send queue, its responder (responder.ts) answers the
// connected QP's requests on this QP's own node, its completer (completer.ts) reads the
// answers to its requests (retrying an RNR NAK) and writes completions. A destination fault
// behaves like ODP's RNR NAK: the engine retries up to rnrRetry (7 = infinite), then
// completes with RNR_RETRY_EXC_ERR. A failed work request moves the QP to ERR and the rest
// complete with WR_FLUSH_ERR. A QP holds nothing of another QP: only its number and node.
import { closedError } from '../errors.js';
import { checkInt, checkObject, invalidArg, known } from '../validate.js';
import type { FaultModel } from '../../kernel-sim/index.js';
import { RcQueuePair } from '../../kernel-sim/rc/qp.js';
import { Access, QP_DEFAULTS, QpAttrMask, QpState, QpType, WcOpcode, WcStatus } from './constants.js';
import { Completer } from './completer.js';
import type { CompletionQueue } from './cq.js';
import type { Device } from './device.js';
import { verbsError } from './errors.js';
import type { ProcessObjects, ProtectionDomain, VerbsProcess } from './mr.js';
import { CompletionQueue as Cq } from './cq.js';
import { SharedReceiveQueue, SrqType } from './srq.js';
import { XrcDomain } from './xrc.js';
import { RecvRing } from '../../kernel-sim/device/recv-ring.js';
import { SendRing } from '../../kernel-sim/device/send-ring.js';
import type { QpAttrs, QpCore, RecvWr, SendWr } from './qp-core.js';
import { Requester, WC_OPCODE } from './requester.js';
import { checkRecvWr, checkSendWr, checkTransportWr } from './wr-check.js';

// sendOpsFlags: createQpEx's init comes through here too.
const QP_INIT_KEYS = [
  ...known<QpInitAttr>({ qpType: true, type: true, sendCq: true, recvCq: true, xrcd: true, cap: true, sqSigAll: true, srq: true, faultModel: true }),
  'sendOpsFlags',
];
const QP_ATTR_KEYS = known<QpAttr>({
  qpState: true,
  qpAccessFlags: true,
  portNum: true,
  qkey: true,
  pathMtu: true,
  destQpNum: true,
  destNode: true,
  rqPsn: true,
  sqPsn: true,
  minRnrTimer: true,
  timeout: true,
  retryCnt: true,
  rnrRetry: true,
  maxRdAtomic: true,
  maxDestRdAtomic: true,
});

export type { RecvWr, SendWr } from './qp-core.js';

/** QP capacities (struct ibv_qp_cap). */
export interface QpCap {
  /** Most outstanding send work requests. */
  maxSendWr: number;
  /** Most outstanding receive work requests. */
  maxRecvWr: number;
  /** Most scatter/gather entries in one send work request. */
  maxSendSge: number;
  /** Most scatter/gather entries in one receive work request. */
  maxRecvSge: number;
}

/** Attributes of a new QP (struct ibv_qp_init_attr), as `Context.createQp` takes them. */
export interface QpInitAttr {
  /** ibv_qp_init_attr.qp_type: RC (default), UD, XRC_SEND or XRC_RECV. `type` is accepted as a synonym. */
  qpType?: QpType | 'RC' | 'UD' | 'XRC_SEND' | 'XRC_RECV';
  /** Transport type: RC, UD, XRC_SEND or XRC_RECV. */
  type?: QpType | 'RC' | 'UD' | 'XRC_SEND' | 'XRC_RECV';
  /** CQ for send completions (not for XRC_RECV). */
  sendCq?: CompletionQueue;
  /** CQ for receive completions (not for XRC QPs: an XRC SRQ has its own). */
  recvCq?: CompletionQueue;
  /** XRC_RECV: the XRC domain (openXrcd) whose XRC SRQs its requests name. */
  xrcd?: XrcDomain;
  /** Capacities (defaults for the rest). */
  cap?: Partial<QpCap>;
  /** Every send WR generates a completion (IBV_QPINITATTR sq_sig_all). */
  sqSigAll?: boolean;
  /** Take receives from this shared receive queue (ibv_qp_init_attr.srq; same PD); the QP's own postRecv is then refused. */
  srq?: SharedReceiveQueue;
  /**
   * How the engine meets a page fault on this QP's transfers: 'terminate' (the default, the
   * thesis's design: the block is aborted and retransmitted, a destination fault NACKed) or
   * 'stall' (SMMUv3 stall / PCIe PRI: the access waits in the fault until it is resolved).
   * It is the fault model of the PD's SMMU stream, which all the PD's QPs share: a PD's QPs
   * are all of one model.
   */
  faultModel?: FaultModel;
}

/** struct ibv_qp_attr, the fields this model uses. */
export interface QpAttr {
  /** State to move the QP to (ibv_qp_attr.qp_state). */
  qpState: QpState;
  /** Remote operations this QP accepts as a responder (Access.REMOTE_*); 0, the default, accepts none. */
  qpAccessFlags?: number;
  /** Physical port (1; one port per device here). */
  portNum?: number;
  /** UD (INIT): the QP's Q_Key; UD SENDs to it must carry the same. */
  qkey?: number;
  /** Path MTU in bytes (RTR). */
  pathMtu?: number;
  /** The remote QP (RTR): its number and the node it lives on (the address vector). */
  destQpNum?: number;
  /** The node the remote QP lives on. */
  destNode?: number;
  /** Receive queue's first PSN (RTR). */
  rqPsn?: number;
  /** Send queue's first PSN (RTS). */
  sqPsn?: number;
  /** RNR NAK timer code (RTR): how long the peer waits before retrying; see rnrTimerMs(). */
  minRnrTimer?: number;
  /** Local ACK timeout code (RTS): 4.096 µs × 2^timeout before a retry. */
  timeout?: number;
  /** Retries after an ACK timeout before RETRY_EXC_ERR (RTS). */
  retryCnt?: number;
  /** Retries after an RNR NAK before RNR_RETRY_EXC_ERR; 7 means infinite (RTS). */
  rnrRetry?: number;
  /** Outstanding RDMA reads and atomics this QP may issue (RTS). */
  maxRdAtomic?: number;
  /** Outstanding RDMA reads and atomics this QP accepts as a responder (RTR). */
  maxDestRdAtomic?: number;
}

/**
 * What ibv_query_qp reports (`QueuePair.query`, `Context.queryQp`): the struct ibv_qp_attr
 * fields (only those a mask names, when one is given; qpState always) and the QP's init
 * attributes. PSNs are the current ones, as rdma_rxe reports them: sqPsn the next request's,
 * rqPsn the next one the responder expects.
 */
export interface QpQueryAttr extends QpAttr {
  /** Current QP state (qp_state). */
  qpState: QpState;
  /** Current QP state as the caller last knew it (cur_qp_state): the same here. */
  curQpState?: QpState;
  /** Whether the send queue is still draining in SQD (sq_draining). */
  sqDraining?: boolean;
  /** Partition key index (pkey_index): 0, one partition. */
  pkeyIndex?: number;
  /** The QP's capacities (cap). */
  cap?: QpCap;
  /** Transport type (ibv_qp_init_attr.qp_type). */
  qpType?: QpType;
  /** sq_sig_all of the init attributes. */
  sqSigAll?: boolean;
}

const TRANSITIONS: Record<QpState, QpState[]> = {
  [QpState.RESET]: [QpState.INIT],
  [QpState.INIT]: [QpState.INIT, QpState.RTR],
  [QpState.RTR]: [QpState.RTS],
  [QpState.RTS]: [QpState.RTS, QpState.SQD],
  [QpState.SQD]: [QpState.RTS, QpState.SQD],
  [QpState.SQE]: [QpState.RTS],
  [QpState.ERR]: [],
};

/** A queue pair (struct ibv_qp; RC, UD, XRC_SEND or XRC_RECV): `modify()` through RESET, INIT, RTR, RTS, then `postSend()` / `postRecv()`. */
export class QueuePair {
  /** QP number (qp_num), what the peer puts in destQpNum. */
  readonly qpNum: number;
  /** The context (process) that created the QP. */
  readonly context: VerbsProcess;
  /** The QP's protection domain. */
  readonly pd: ProtectionDomain;
  /** CQ for send completions. */
  readonly sendCq: CompletionQueue;
  /** CQ for receive completions. */
  readonly recvCq: CompletionQueue;
  /** The QP's capacities. */
  readonly cap: QpCap;
  /** Transport type: RC or UD. */
  readonly qpType: QpType;
  /** True if every send work request generates a completion, SIGNALED or not (sq_sig_all). */
  readonly sqSigAll: boolean;
  /** The shared receive queue its receives come from, if it was created with one. */
  readonly srq: SharedReceiveQueue | undefined;
  /** XRC_RECV: its XRC domain. */
  readonly xrcd: XrcDomain | undefined;
  /** The fault model of this QP's transfers (QpInitAttr.faultModel). */
  readonly faultModel: FaultModel;
  #device: Device;
  #objects: ProcessObjects;
  #state = QpState.RESET;
  #attr: QpAttrs = {
    qpAccessFlags: 0,
    minRnrTimer: QP_DEFAULTS.minRnrTimer,
    timeout: QP_DEFAULTS.timeout,
    retryCnt: QP_DEFAULTS.retryCnt,
    rnrRetry: QP_DEFAULTS.rnrRetry,
    destQpNum: -1,
    destNode: -1,
    rqPsn: 0,
    sqPsn: 0,
  };
  // Attributes the engine does not read, kept for ibv_query_qp.
  #pathAttr = { portNum: 1, pathMtu: QP_DEFAULTS.pathMtu as number, maxRdAtomic: 1, maxDestRdAtomic: 1 };
  /** The send queue's ring (the device's requester reads it). */
  #sq: SendRing<SendWr>;
  /** The receive queue's ring (the device's responder reads it). */
  #rq: RecvRing<RecvWr>;
  #destroyed = false;
  #core: QpCore;
  /** @internal What the node's engine responder reads of this QP (kept in the node's tables). */
  readonly rc: RcQueuePair;
  #requester: Requester;
  #completer: Completer;

  /** @internal use Context.createQp */
  constructor(context: VerbsProcess, device: Device, pd: ProtectionDomain, qpNum: number, init: QpInitAttr, objects: ProcessObjects) {
    checkObject('createQp: init', init, QP_INIT_KEYS);
    this.qpType = qpTypeOf(init);
    const xrcd = init.xrcd;
    checkQpInit(this.qpType, init, pd);
    this.xrcd = xrcd;
    const srq = init.srq;
    this.srq = srq;
    const faultModel = faultModelOf(init, pd);
    this.faultModel = faultModel;
    this.context = context;
    this.#device = device;
    this.#objects = objects;
    this.pd = pd;
    this.qpNum = qpNum;
    this.sendCq = init.sendCq ?? new Cq(1);
    this.recvCq = init.recvCq ?? new Cq(1);
    this.sqSigAll = init.sqSigAll ?? false;
    this.cap = qpCaps(this.qpType, init);
    this.#rq = new RecvRing(this.cap.maxRecvWr, this.cap.maxRecvSge);
    this.rc = this.#rcQueuePair();
    this.#sq = new SendRing(this.cap.maxSendWr, this.cap.maxSendSge, { ud: this.qpType === QpType.UD, xrc: this.qpType === QpType.XRC_SEND });
    const attr = this.#attr;
    const state = () => this.#state;
    const destroyed = () => this.#destroyed;
    this.#completer = new Completer({
      qpNum,
      get destQpNum() {
        return attr.destQpNum;
      },
      get state() {
        return state();
      },
      get rnrRetry() {
        return attr.rnrRetry;
      },
      toError: () => this.#toError(),
    });
    this.#core = {
      qpNum,
      qpType: this.qpType,
      device,
      pd,
      sendCq: this.sendCq,
      recvCq: this.recvCq,
      sqSigAll: this.sqSigAll,
      attr: this.#attr,
      sq: this.#sq,
      rq: this.#rq,
      completer: this.#completer,
      get state() {
        return state();
      },
      get destroyed() {
        return destroyed();
      },
      // The READ and atomic sinks the device checks answers against (RcQueuePair.expects).
      landings: this.rc.landings,
      toError: () => this.#toError(),
    };
    this.#publish();
    this.#requester = new Requester(this.#core);
    pd.users.add(this);
    srq?.users.add(this);
    xrcd?.qps.add(this);
    // The engine reads the model from the stream: the requester of the source's, the responder of the destination's.
    pd.stream.faultModel = faultModel;
  }

  // What the node's transport keeps of this QP (rc/qp.ts): built from the device's records
  // and rings alone (its PD's, its receive ring, its receive CQ's ring, its SRQ's, its XRC
  // domain's handle); the device takes, scatters and completes receives on its own.
  #rcQueuePair(): RcQueuePair {
    return new RcQueuePair({
      qpNum: this.qpNum,
      pd: this.pd.rc,
      rq: this.#rq,
      recvCq: this.recvCq.ring,
      srq: this.srq?.rc,
      xrcd: this.qpType === QpType.XRC_RECV ? this.xrcd!.handle : undefined,
      ud: this.qpType === QpType.UD,
    });
  }

  /** @internal The device moved this QP to ERR on its own (its event line): the provider's side of ERR follows. */
  deviceError(): void {
    this.#toError();
  }

  /** Current QP state (ibv_query_qp's qp_state). */
  get state(): QpState {
    return this.#state;
  }

  /** ibv_query_qp: every attribute, or (with `attrMask`, QpAttrMask bits) the ones asked for; see QpQueryAttr. */
  query(attrMask?: number): QpQueryAttr {
    this.#checkAlive();
    if (attrMask !== undefined && (!Number.isInteger(attrMask) || attrMask < 0 || attrMask > 0x1fffff))
      throw verbsError('ibv_query_qp', 'EINVAL', `attrMask must be QpAttrMask bits, got ${String(attrMask)}`);
    const a = this.#attr;
    const p = this.#pathAttr;
    const live = this.#state !== QpState.RESET && this.#state !== QpState.INIT;
    const all: Array<[number, keyof QpQueryAttr, unknown]> = [
      [QpAttrMask.CUR_STATE, 'curQpState', this.#state],
      [QpAttrMask.EN_SQD_ASYNC_NOTIFY, 'sqDraining', this.#state === QpState.SQD && this.#requester.inflight + this.#sq.length > 0],
      [QpAttrMask.ACCESS_FLAGS, 'qpAccessFlags', a.qpAccessFlags],
      [QpAttrMask.PKEY_INDEX, 'pkeyIndex', 0],
      [QpAttrMask.PORT, 'portNum', p.portNum],
      [QpAttrMask.AV, 'destNode', a.destNode],
      [QpAttrMask.PATH_MTU, 'pathMtu', p.pathMtu],
      [QpAttrMask.TIMEOUT, 'timeout', a.timeout],
      [QpAttrMask.RETRY_CNT, 'retryCnt', a.retryCnt],
      [QpAttrMask.RNR_RETRY, 'rnrRetry', a.rnrRetry],
      [QpAttrMask.RQ_PSN, 'rqPsn', live ? this.rc.resp.epsn : a.rqPsn],
      [QpAttrMask.MAX_QP_RD_ATOMIC, 'maxRdAtomic', p.maxRdAtomic],
      [QpAttrMask.MIN_RNR_TIMER, 'minRnrTimer', a.minRnrTimer],
      [
        QpAttrMask.SQ_PSN,
        'sqPsn',
        this.#state === QpState.RTS || this.#state === QpState.SQD || this.#state === QpState.ERR ? this.#requester.psn : a.sqPsn,
      ],
      [QpAttrMask.MAX_DEST_RD_ATOMIC, 'maxDestRdAtomic', p.maxDestRdAtomic],
      [QpAttrMask.CAP, 'cap', { ...this.cap }],
      [QpAttrMask.DEST_QPN, 'destQpNum', a.destQpNum],
    ];
    const out: QpQueryAttr = { qpState: this.#state, qpType: this.qpType, sqSigAll: this.sqSigAll };
    for (const [bit, key, value] of all) if (attrMask === undefined || attrMask & bit) (out as unknown as Record<string, unknown>)[key] = value;
    return out;
  }

  /** ibv_modify_qp: RESET → INIT → RTR → RTS, and → ERR / → RESET from anywhere. */
  modify(attr: QpAttr): void {
    // An attribute set before a later one is refused stays set (as it did): published either way.
    try {
      this.#modify(attr);
    } finally {
      this.#publish();
    }
  }

  #modify(attr: QpAttr): void {
    this.#checkAlive();
    checkObject('modify: attr', attr, QP_ATTR_KEYS);
    const to = attr.qpState;
    if (typeof to !== 'number' || !(to in QpState)) throw verbsError('ibv_modify_qp', 'EINVAL', `unknown state ${String(to)}`);
    if (to === QpState.ERR) return this.#toError();
    if (to === QpState.RESET) {
      this.#toError();
      this.#state = QpState.RESET;
      return;
    }
    if (!TRANSITIONS[this.#state].includes(to))
      throw verbsError('ibv_modify_qp', 'EINVAL', `cannot go from ${QpState[this.#state]} to ${QpState[to]} (RESET → INIT → RTR → RTS)`);
    if (attr.qpAccessFlags !== undefined) this.#attr.qpAccessFlags = checkInt('qpAccessFlags', attr.qpAccessFlags, 0, 0x3ff);
    if (attr.portNum !== undefined && attr.portNum !== 1)
      throw verbsError('ibv_modify_qp', 'EINVAL', `portNum ${String(attr.portNum)}: the device has one port, 1`);
    if (attr.pathMtu !== undefined && ![256, 512, 1024, 2048, 4096].includes(attr.pathMtu))
      throw verbsError('ibv_modify_qp', 'EINVAL', `pathMtu must be 256, 512, 1024, 2048 or 4096 bytes (ibv_mtu), got ${String(attr.pathMtu)}`);
    if (attr.pathMtu !== undefined) this.#pathAttr.pathMtu = attr.pathMtu;
    if (attr.maxRdAtomic !== undefined) this.#pathAttr.maxRdAtomic = checkInt('maxRdAtomic', attr.maxRdAtomic, 0, 255);
    if (attr.maxDestRdAtomic !== undefined) this.#pathAttr.maxDestRdAtomic = checkInt('maxDestRdAtomic', attr.maxDestRdAtomic, 0, 255);
    if (attr.qkey !== undefined) {
      if (this.qpType !== QpType.UD) throw verbsError('ibv_modify_qp', 'EINVAL', 'qkey is a UD QP attribute');
      this.#attr.qkey = checkInt('qkey', attr.qkey, 0, 0xffff_ffff);
    }
    if (to === QpState.INIT && this.qpType === QpType.UD && this.#attr.qkey === undefined)
      throw verbsError('ibv_modify_qp', 'EINVAL', 'a UD QP needs its qkey at INIT (IBV_QP_QKEY)');
    if (to === QpState.RTR && this.qpType !== QpType.UD) {
      const destQp = attr.destQpNum ?? this.#attr.destQpNum;
      const destNode = attr.destNode ?? this.#attr.destNode;
      if (destQp < 0 || destNode < 0) throw verbsError('ibv_modify_qp', 'EINVAL', 'RTR needs destQpNum and destNode (the remote QP and its node)');
      if (!this.#device.sim.hasPeer(checkInt('destNode', destNode, 0)))
        throw verbsError('ibv_modify_qp', 'EINVAL', `destNode ${destNode} is not on the fabric`);
      this.#attr.destQpNum = checkInt('destQpNum', destQp, 0, 0xff_ffff);
      this.#attr.destNode = destNode;
    }
    if (to === QpState.RTR) {
      if (attr.minRnrTimer !== undefined) this.#attr.minRnrTimer = checkInt('minRnrTimer', attr.minRnrTimer, 0, 31);
      if (attr.rqPsn !== undefined) this.#attr.rqPsn = checkInt('rqPsn', attr.rqPsn, 0, 0xff_ffff);
      // The responder expects the peer's first message at rq_psn.
      this.rc.expectPsn(this.#attr.rqPsn);
    }
    if (to === QpState.RTS) {
      if (attr.sqPsn !== undefined) this.#attr.sqPsn = checkInt('sqPsn', attr.sqPsn, 0, 0xff_ffff);
      if (this.#state === QpState.RTR) this.#requester.startPsn(this.#attr.sqPsn);
      if (attr.timeout !== undefined) this.#attr.timeout = checkInt('timeout', attr.timeout, 0, 31);
      if (attr.retryCnt !== undefined) this.#attr.retryCnt = checkInt('retryCnt', attr.retryCnt, 0, 7);
      if (attr.rnrRetry !== undefined) this.#attr.rnrRetry = checkInt('rnrRetry', attr.rnrRetry, 0, 7);
    }
    this.#state = to;
    this.#publish();
    if (to === QpState.RTS) this.#requester.kick();
  }

  /**
   * ibv_post_send. Every field of every WR is checked first (an EINVAL naming the field and
   * the index of the bad WR; ENOMEM past maxSendWr); nothing is queued unless all pass.
   * Errors of execution are completions.
   */
  postSend(wrs: SendWr | SendWr[]): void {
    this.#checkAlive();
    if (this.qpType === QpType.XRC_RECV) throw verbsError('ibv_post_send', 'EINVAL', 'an XRC_RECV QP only receives: send from its XRC_SEND peer');
    const list = Array.isArray(wrs) ? wrs : [wrs];
    // In SQD (send queue drained) WRs may be posted, as with rdma_rxe; they start once the QP
    // is back in RTS.
    if (this.#state !== QpState.RTS && this.#state !== QpState.SQD && this.#state !== QpState.ERR)
      throw verbsError('ibv_post_send', 'EINVAL', `the QP is in ${QpState[this.#state]}; move it to RTS first`);
    if (this.#sq.length + this.#requester.inflight + list.length > this.cap.maxSendWr)
      throw verbsError('ibv_post_send', 'ENOMEM', `the send queue holds at most ${this.cap.maxSendWr} WRs`);
    list.forEach((wr, i) => {
      checkSendWr(wr, i, this.cap.maxSendSge);
      checkTransportWr(wr, i, this);
    });
    // The provider's step: each checked WR written as a WQE into the ring (room checked above),
    // then the doorbell: the requester reads the ring.
    for (const wr of list) this.#sq.push(wr);
    this.#requester.kick();
  }

  /** ibv_post_recv: checked like postSend. */
  postRecv(wrs: RecvWr | RecvWr[]): void {
    this.#checkAlive();
    const list = Array.isArray(wrs) ? wrs : [wrs];
    if (this.srq) throw verbsError('ibv_post_recv', 'EINVAL', 'the QP takes its receives from its SRQ: post them with srq.postRecv()');
    if (this.qpType === QpType.XRC_SEND || this.qpType === QpType.XRC_RECV)
      throw verbsError('ibv_post_recv', 'EINVAL', 'XRC QPs have no receive queue: post receives to the XRC SRQ (srq.postRecv())');
    if (this.#state === QpState.RESET) throw verbsError('ibv_post_recv', 'EINVAL', 'the QP is in RESET; move it to INIT first');
    if (this.#rq.length + list.length > this.cap.maxRecvWr)
      throw verbsError('ibv_post_recv', 'ENOMEM', `the receive queue holds at most ${this.cap.maxRecvWr} WRs`);
    list.forEach((wr, i) => checkRecvWr(wr, i, this.cap.maxRecvSge));
    if (this.#state === QpState.ERR) {
      for (const wr of list) this.#completer.complete(this.recvCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
      return;
    }
    // The provider's step: each checked WR written as a WQE into the ring (room checked above).
    for (const wr of list) this.#rq.push(wr);
  }

  /** ibv_destroy_qp: outstanding work completes with WR_FLUSH_ERR; no byte lands for this QP afterwards. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#toError();
    this.#destroyed = true;
    this.#publish();
    // Work in flight and queued behind it (left to the running loop by #toError) is flushed
    // now, in posting order; the loop drops the in-flight outcome when it arrives.
    for (const wr of [...this.#requester.takeCurrent(), ...this.#sq.drain()])
      this.#completer.complete(this.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
    // Writes for it are refused from the next block on; what it posted (its writes and SEND
    // payloads as a requester, READ and atomic answers as a responder) ends, its runs on the
    // wire refused where they arrive; and the copies for either already running finish
    // before this returns.
    this.#device.tables.removeQp(this.qpNum);
    this.#device.sim.cancel(this.qpNum);
    this.#device.sim.fence({ qp: this.qpNum });
    this.pd.unmapFor(this);
    this.pd.users.delete(this);
    this.srq?.users.delete(this);
    this.xrcd?.qps.delete(this);
    this.#objects.qps.delete(this);
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.destroy();
  }

  #toError(): void {
    if (this.#state === QpState.ERR) return;
    this.#state = QpState.ERR;
    // The device's modify to ERR flushes the receive side itself (rc/qp.ts), as rxe_qp_error.
    this.#publish();
    // Its messages on the engine end now (an RNR wait, a parked fault): flushed, as RC's ERR does.
    this.#device.sim.cancel(this.qpNum);
    if (!this.#requester.running)
      for (const wr of this.#sq.drain()) this.#completer.complete(this.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
  }

  // What the transport reads of this QP, written to it at each change (ibv_modify_qp's
  // attributes reaching the device): it never reads them back from here.
  #publish(): void {
    const a = this.#attr;
    this.rc.modify({
      state: this.#state,
      destroyed: this.#destroyed,
      destNode: a.destNode,
      destQpNum: a.destQpNum,
      accessFlags: a.qpAccessFlags,
      minRnrTimer: a.minRnrTimer,
      qkey: this.qpType === QpType.UD ? a.qkey : undefined,
    });
  }

  #checkAlive(): void {
    if (this.#destroyed) throw closedError('QueuePair');
  }
}

// The QP type createQp asked for (a QpType, or its name): RC when none.
function qpTypeOf(init: QpInitAttr): QpType {
  const type = init.qpType ?? init.type;
  const named = typeof type === 'string' && ['RC', 'UD', 'XRC_SEND', 'XRC_RECV'].includes(type) ? QpType[type as keyof typeof QpType] : type;
  if (named !== undefined && ![QpType.RC, QpType.UD, QpType.XRC_SEND, QpType.XRC_RECV].includes(named as QpType))
    throw verbsError('ibv_create_qp', 'EOPNOTSUPP', `QP type ${String(type)}: RC, UD, XRC_SEND and XRC_RECV queue pairs are modelled (no UC)`);
  return (named as QpType | undefined) ?? QpType.RC;
}

// createQp's objects for a QP of `qpType`: its XRC domain, its CQs, its SRQ (ibv_create_qp's EINVALs).
function checkQpInit(qpType: QpType, init: QpInitAttr, pd: ProtectionDomain): void {
  const ud = qpType === QpType.UD;
  const xrcRecv = qpType === QpType.XRC_RECV;
  const xrcd = init.xrcd;
  if (xrcRecv) {
    if (!(xrcd instanceof XrcDomain)) throw verbsError('ibv_create_qp', 'EINVAL', 'an XRC_RECV QP needs xrcd: an XrcDomain from openXrcd()');
    xrcd.check('ibv_create_qp');
  } else if (xrcd !== undefined) throw verbsError('ibv_create_qp', 'EINVAL', 'xrcd is for XRC_RECV QPs');
  // A UD SEND is one packet, one transfer of the engine: gathered from one SGE.
  if (ud && (init.cap?.maxSendSge ?? 1) > 1)
    throw verbsError('ibv_create_qp', 'EINVAL', 'a UD QP here sends from one SGE per WR: cap.maxSendSge must be 1');
  // XRC QPs have no receive queue of their own, an XRC target no send queue either: a CQ
  // they do not name is one nothing completes on.
  const needs = xrcRecv ? [] : qpType === QpType.XRC_SEND ? ['sendCq'] : ['sendCq', 'recvCq'];
  for (const k of needs) if (!init[k as 'sendCq']) throw invalidArg(`createQp: ${needs.join(' and ')} ${needs.length > 1 ? 'are' : 'is'} required`);
  const srq = init.srq;
  if (srq !== undefined && qpType !== QpType.RC && !ud)
    throw verbsError('ibv_create_qp', 'EINVAL', 'an XRC QP takes no srq: XRC SRQs are named by each request');
  if (srq?.srqType === SrqType.XRC)
    throw verbsError('ibv_create_qp', 'EINVAL', 'an XRC SRQ is named by XRC requests (wr.xrc.remoteSrqn), not attached to a QP');
  if (srq !== undefined) {
    if (!(srq instanceof SharedReceiveQueue)) throw verbsError('ibv_create_qp', 'EINVAL', 'srq must be a SharedReceiveQueue from createSrq()');
    if (srq.destroyed) throw verbsError('ibv_create_qp', 'EINVAL', 'the SRQ was destroyed');
    if (srq.pd !== pd) throw verbsError('ibv_create_qp', 'EINVAL', "the SRQ belongs to another protection domain than the QP's");
  }
}

// The QP's fault model: one SMMU stream per PD, so the one of the PD's QPs. They all share it,
// so the first one found tells it (checking them all made createQp quadratic in the PD's QPs).
function faultModelOf(init: QpInitAttr, pd: ProtectionDomain): FaultModel {
  const faultModel = init.faultModel ?? 'terminate';
  if (faultModel !== 'terminate' && faultModel !== 'stall')
    throw invalidArg(`createQp: faultModel must be 'terminate' or 'stall', got ${String(init.faultModel)}`);
  for (const u of pd.users) {
    if (!(u instanceof QueuePair)) continue;
    if (u.faultModel !== faultModel)
      throw verbsError(
        'ibv_create_qp',
        'EINVAL',
        `faultModel '${faultModel}' on a PD whose QPs are '${u.faultModel}' (one SMMU stream per PD): allocate another PD for it`,
      );
    break;
  }
  return faultModel;
}

// The QP's caps. A QP without a receive queue of its own (an XRC initiator or target, a QP on
// an SRQ) takes 0 receive caps, as libibverbs does; a bad cap is EINVAL (ibv_create_qp's errno).
function qpCaps(qpType: QpType, init: QpInitAttr): QpCap {
  const cap = init.cap ?? {};
  const ud = qpType === QpType.UD;
  const noRq = qpType === QpType.XRC_SEND || qpType === QpType.XRC_RECV || init.srq !== undefined;
  const capInt = (name: keyof QpCap, v: number, min: number, max: number): number => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
      throw verbsError('ibv_create_qp', 'EINVAL', `cap.${name} must be an integer in ${min}..${max}, got ${String(v)}`);
    return v;
  };
  return {
    maxSendWr: capInt('maxSendWr', cap.maxSendWr ?? 128, 1, 1 << 16),
    maxRecvWr: capInt('maxRecvWr', cap.maxRecvWr ?? (noRq ? 0 : 128), noRq ? 0 : 1, 1 << 16),
    maxSendSge: capInt('maxSendSge', cap.maxSendSge ?? (ud ? 1 : 4), 1, 16),
    maxRecvSge: capInt('maxRecvSge', cap.maxRecvSge ?? (noRq ? 0 : 4), noRq ? 0 : 1, 16),
  };
}

/** Move two connected QPs (RC, or an XRC_SEND and its XRC_RECV) through INIT → RTR → RTS, each pointing at the other (rc_pingpong's defaults). */
export function connectQps(a: QueuePair, b: QueuePair, attr: Partial<QpAttr> = {}): void {
  const access = attr.qpAccessFlags ?? Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC;
  for (const [x, y] of [
    [a, b],
    [b, a],
  ] as const) {
    x.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: access });
    x.modify({ qpState: QpState.RTR, destQpNum: y.qpNum, destNode: y.context.node, minRnrTimer: attr.minRnrTimer ?? QP_DEFAULTS.minRnrTimer });
    x.modify({
      qpState: QpState.RTS,
      timeout: attr.timeout ?? QP_DEFAULTS.timeout,
      retryCnt: attr.retryCnt ?? QP_DEFAULTS.retryCnt,
      rnrRetry: attr.rnrRetry ?? QP_DEFAULTS.rnrRetry,
    });
  }
}
