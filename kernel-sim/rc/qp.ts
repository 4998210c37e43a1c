// One QP as the node's RC transport keeps it (rxe_qp.c's part of struct rxe_qp): the
// attributes its responder and completer read (whether it receives, the connected QP, its
// access flags, its RNR timer, a UD QP's Q_Key), written by its owner at each modify (as
// ibv_modify_qp reaches rxe_qp_from_attr), never read back from the owner; its receive queue;
// and the responder's own state (the PSN it expects, the message in progress).
import { QpState } from '../device/ib.js';
import type { RcPd, RcQp, RcReceived, RcRecvQueue, RcRecvWqe, RcRespState, RcSrq } from './tables.js';

/** The attributes of a QP the transport reads, as its owner sets them (rxe_qp_from_attr). */
export interface RcQpAttrs {
  /** The QP's state (ibv_qp_state), and whether it was destroyed. */
  state: QpState;
  destroyed: boolean;
  /** The node of the connected QP, and its number. */
  destNode: number;
  destQpNum: number;
  /** qp_access_flags. */
  accessFlags: number;
  /** The RNR NAK timer code it answers with. */
  minRnrTimer: number;
  /** A UD QP's Q_Key (undefined for an RC QP, or a UD QP before INIT). */
  qkey: number | undefined;
}

/** What the transport hands back to a QP's owner: receives it takes or gives back, its completions, its ERR. */
export interface RcQpOwner {
  /** The receive queue the responder takes a SEND's receive from (its head). */
  rq: RcRecvQueue;
  take?(): RcRecvWqe | undefined;
  giveBack?(wqe: RcRecvWqe): void;
  xrcSrq?(srqn: number): RcSrq | undefined;
  expects(lkey: number, va: bigint, length: number): boolean;
  received(wqe: RcRecvWqe, r: RcReceived): void;
  toError(): void;
}

/** @internal One QP's RC state at its node (see the top of this file). */
export class RcQueuePair implements RcQp {
  readonly qpNum: number;
  readonly pd: RcPd;
  readonly rq: RcRecvQueue;
  state = QpState.RESET;
  destroyed = false;
  destNode = -1;
  destQpNum = -1;
  accessFlags = 0;
  minRnrTimer = 0;
  qkey: number | undefined = undefined;
  readonly resp: RcRespState = { epsn: 0, msg: undefined };
  readonly take?: () => RcRecvWqe | undefined;
  readonly giveBack?: (wqe: RcRecvWqe) => void;
  readonly xrcSrq?: (srqn: number) => RcSrq | undefined;
  readonly expects: (lkey: number, va: bigint, length: number) => boolean;
  readonly received: (wqe: RcRecvWqe, r: RcReceived) => void;
  readonly toError: () => void;

  constructor(qpNum: number, pd: RcPd, owner: RcQpOwner) {
    this.qpNum = qpNum;
    this.pd = pd;
    this.rq = owner.rq;
    if (owner.take) this.take = owner.take;
    if (owner.giveBack) this.giveBack = owner.giveBack;
    if (owner.xrcSrq) this.xrcSrq = owner.xrcSrq;
    this.expects = owner.expects;
    this.received = owner.received;
    this.toError = owner.toError;
  }

  /** The owner's modify (or its ERR, its destruction): the attributes the transport reads from now on. */
  modify(a: RcQpAttrs): void {
    this.state = a.state;
    this.destroyed = a.destroyed;
    this.destNode = a.destNode;
    this.destQpNum = a.destQpNum;
    this.accessFlags = a.accessFlags;
    this.minRnrTimer = a.minRnrTimer;
    this.qkey = a.qkey;
  }

  /** In RTR, RTS or SQD and not destroyed: it accepts packets. */
  get receiving(): boolean {
    const st = this.state;
    return !this.destroyed && (st === QpState.RTR || st === QpState.RTS || st === QpState.SQD);
  }

  /** RTR: the peer's first message is expected at `rqPsn`; nothing is in progress. */
  expectPsn(rqPsn: number): void {
    this.resp.epsn = rqPsn;
    this.resp.msg = undefined;
  }
}
