// One QP as the node's RC transport keeps it (rxe_qp.c's part of struct rxe_qp): the
// attributes its requester, responder and completer read (whether it receives, the connected
// QP, its access flags, its RNR timer and retry counts, a UD QP's Q_Key), written by its owner
// at each modify (as ibv_modify_qp reaches rxe_qp_from_attr), never read back from the owner;
// its queues (rings of the one byte layout, kernel-sim/device/abi.ts); and the requester's and
// responder's own state (the PSNs, the message in progress, the WQEs in flight).
//
// The send side's API, what a provider drives (lib/verbs/qp.ts here; a device process whose
// rings are memfds written by the C provider, next): built from rings and the node's tables
// only, it holds no object of the provider's and reads nothing in a ring but its bytes.
//
//   const rc = new RcQueuePair(qpNum, pd, owner, { node, qpType, sq, sendCq, sqSigAll });
//   rc.modify(attrs)       ibv_modify_qp's attributes (state, destination, rnrRetry, timeout, …)
//   rc.startPsn(psn)       RTR → RTS: the first PSN of its requests (sq_psn)
//   writeSendWqe(…)        the provider writes a checked WR into the send ring (lib's
//                          provider-queue.ts; the C provider's post_send; sq.push in tests) …
//   rc.doorbell()          … and rings: the requester (rc/requester.ts, WqeRequester) reads
//                          the ring from its own index, checks each WQE's SGEs by lkey in
//                          node.tables.mrs and posts its packets on node's engine
//   sendCq (CompletionRing) the completer (rc/completer.ts, WqeCompleter) writes each CQE in
//                          posting order, then frees the WQE's slot (sq.consumer moves at
//                          completion); a failure takes the QP to ERR and flushes the rest;
//                          the CQ's listener hears of the CQE, the armed event, an overrun
//   rc.toError()           → ERR: the engine's transfers of the QP end, queued WQEs flush
//   rc.destroy()           WQEs in flight and queued complete WR_FLUSH_ERR, oldest first
//   rc.release()           after the QP's copies are fenced: its inline memory goes
//   rc.state, rc.sqPsn, rc.sqOutstanding   what ibv_query_qp and ibv_post_send read back
//
// The rings may be in memory of another process: new SendRing(maxWr, maxSge, transport,
// handle, { buffer, offset }) over the queue memfd, sq.setAh(handle, { dlid }) for the AHs its
// WQEs name. node is the SimNode (RcNode: its engine's post and cancel, its MR table,
// deviceMemory for INLINE bytes); the receive side's owner hooks are going (issue 38, i38r).
import type { CompletionRing } from '../device/cq-ring.js';
import { QpState, QpType } from '../device/ib.js';
import type { Sge } from '../device/rings.js';
import type { SendRing, SendWqe } from '../device/send-ring.js';
import { WqeCompleter } from './completer.js';
import { type RcAh, type RcNode, WqeRequester } from './requester.js';
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
  /** Retries after an RNR NAK (7: infinite), after an ACK timeout; the local ACK timeout code. */
  rnrRetry: number;
  retryCnt: number;
  timeout: number;
}

/** The send side of a QP: the node whose engine carries its requests, its send ring and send CQ. */
export interface RcSendSide {
  node: RcNode;
  qpType: QpType;
  sq: SendRing<SendWqe<RcAh>>;
  sendCq: CompletionRing;
  /** Every WQE completes with a CQE (sq_sig_all). */
  sqSigAll: boolean;
}

/** A span of this QP's memory the peer's bytes are expected in, under `key` (a READ's or an atomic's sinks). */
interface Landing {
  key: number;
  addr: bigint;
  end: bigint;
}

/** What the transport hands back to a QP's owner: receives it takes or gives back, their completions, the receive side of its ERR. */
export interface RcQpOwner {
  /** The receive queue the responder takes a SEND's receive from (its head). */
  rq: RcRecvQueue;
  take?(): RcRecvWqe | undefined;
  giveBack?(wqe: RcRecvWqe): void;
  xrcSrq?(srqn: number): RcSrq | undefined;
  received(wqe: RcRecvWqe, r: RcReceived): void;
  /** The QP went to ERR: its receives are flushed. */
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
  rnrRetry = 7;
  retryCnt = 7;
  timeout = 14;
  readonly resp: RcRespState = { epsn: 0, msg: undefined };
  readonly take?: () => RcRecvWqe | undefined;
  readonly giveBack?: (wqe: RcRecvWqe) => void;
  readonly xrcSrq?: (srqn: number) => RcSrq | undefined;
  readonly received: (wqe: RcRecvWqe, r: RcReceived) => void;
  readonly #flushReceives: () => void;
  // The send side (see the top of this file).
  readonly node: RcNode;
  readonly ud: boolean;
  readonly sq: SendRing<SendWqe<RcAh>>;
  readonly sendCq: CompletionRing;
  readonly sqSigAll: boolean;
  readonly #requester: WqeRequester;
  readonly #completer: WqeCompleter;
  /** Where the peer may land bytes under a key without REMOTE_WRITE: this QP's READ and atomic sinks while they wait for their answer. */
  readonly #landings = new Set<Landing>();

  constructor(qpNum: number, pd: RcPd, owner: RcQpOwner, send: RcSendSide) {
    this.qpNum = qpNum;
    this.pd = pd;
    this.rq = owner.rq;
    if (owner.take) this.take = owner.take;
    if (owner.giveBack) this.giveBack = owner.giveBack;
    if (owner.xrcSrq) this.xrcSrq = owner.xrcSrq;
    this.received = owner.received;
    this.#flushReceives = owner.toError;
    this.node = send.node;
    this.ud = send.qpType === QpType.UD;
    this.sq = send.sq;
    this.sendCq = send.sendCq;
    this.sqSigAll = send.sqSigAll;
    this.#completer = new WqeCompleter(this);
    this.#requester = new WqeRequester(this, this.#completer);
  }

  /** The provider wrote WQEs into the send ring: start what may start (rxe's post_send doorbell). */
  doorbell(): void {
    this.#requester.kick();
  }

  /** RTR → RTS: the PSN of the first request (sq_psn). */
  startPsn(psn: number): void {
    this.#requester.startPsn(psn);
  }

  /** The PSN of the next request (ibv_query_qp's sq_psn). */
  get sqPsn(): number {
    return this.#requester.psn;
  }

  /** WQEs posted and not completed: they hold their slots (post_send's room, SQD's draining). */
  get sqOutstanding(): number {
    return this.sq.length;
  }

  /**
   * The QP goes to ERR (a WQE failed, a CQ overran, a receive failed, or the owner's modify):
   * its receives are flushed, its transfers on the engine end (FLUSHED), and with nothing in
   * flight its queued WQEs complete WR_FLUSH_ERR now (else behind what is in flight). A no-op in ERR.
   */
  toError(): void {
    if (this.state === QpState.ERR) return;
    this.state = QpState.ERR;
    this.#flushReceives();
    this.node.cancel(this.qpNum);
    if (!this.#requester.running) this.#requester.kick();
  }

  /** The QP is destroyed: its WQEs in flight, then those queued, complete WR_FLUSH_ERR in posting order. */
  destroy(): void {
    this.destroyed = true;
    this.#requester.flushQueued();
  }

  /** The QP is gone and its transfers fenced: what the device kept for it (its inline memory) goes. */
  release(): void {
    this.#requester.release();
  }

  /** Expect the peer's bytes in `sges` (a READ's or an atomic's sinks); the returned function ends it. */
  expectLanding(sges: readonly Sge[]): () => void {
    const spans = sges.map((s) => ({ key: s.lkey, addr: s.addr, end: s.addr + BigInt(s.length) }));
    for (const l of spans) this.#landings.add(l);
    return () => {
      for (const l of spans) this.#landings.delete(l);
    };
  }

  /** Whether [va, va+length) under `lkey` lies in a span this QP expects the peer's bytes in. */
  expects(lkey: number, va: bigint, length: number): boolean {
    for (const l of this.#landings) if (l.key === lkey && va >= l.addr && va + BigInt(length) <= l.end) return true;
    return false;
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
    this.rnrRetry = a.rnrRetry;
    this.retryCnt = a.retryCnt;
    this.timeout = a.timeout;
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
