// One QP as the node's RC transport keeps it (rxe_qp.c's part of struct rxe_qp): the
// attributes its responder and completer read, written by its owner at each modify (as
// ibv_modify_qp reaches rxe_qp_from_attr), never read back from the owner; its receive side
// (its own ring, or the SRQ records it takes from, and its receive CQ's ring), which the
// device works itself, as rxe_resp.c does; and the responder's own state (the PSN it
// expects, the message in progress).
//
// The API (what a device in another process builds from memfd rings and its tables alone):
//
//   const qp = new RcQueuePair({ qpNum, pd, rq, recvCq, srq, xrcd, ud });
//     pd      an RcPd record (tables.ts)              rq      a RecvRing, or undefined (SRQ, XRC)
//     recvCq  a CompletionRing, or undefined (XRC)    srq     an RcSrq record (a QP on an SRQ)
//     xrcd    an XRC target's domain handle           ud      a UD QP (receives taken for good)
//   tables.qps.set(qpNum, qp);
//   qp.modify({ state, destroyed, destNode, destQpNum, accessFlags, minRnrTimer, qkey });
//   qp.expectPsn(rqPsn)                 at RTR
//   qp.landings                         the spans its READ and atomic answers may land in
//
// The device's own steps (the responder calls them): take / giveBack a receive, received
// (the receive's CQE: RECV or RECV_RDMA_WITH_IMM, byte_len, imm, src_qp, status SUCCESS,
// LOC_PROT_ERR or LOC_LEN_ERR), toError (ERR, the receives flushed with WR_FLUSH_ERR CQEs and
// 'qp-error' on the node's event line). Nothing here holds an object of the provider's.
//
// The send side, what a provider drives (lib/verbs/qp.ts here; a device process whose rings
// are memfds written by the C provider, next): `send` in the init, from rings and the node alone.
//
//   new RcQueuePair({ ..., send: { node, qpType, sq, sendCq, sqSigAll } })
//     node    the SimNode (RcNode: its engine's post and cancel, its tables, deviceMemory)
//     sq      a SendRing (over a queue memfd: new SendRing(maxWr, maxSge, transport, handle,
//             { buffer, offset }); sq.setAh(handle, { dlid }) for the AHs its WQEs name)
//     sendCq  the send CQ's CompletionRing
//   qp.modify({ ..., rnrRetry, retryCnt, timeout });  qp.startPsn(sqPsn)   at RTS
//   writeSendWqe(…)     the provider writes a checked WR into the send ring (lib's
//                       provider-queue.ts; the C provider's post_send; sq.push in tests) …
//   qp.doorbell()       … and rings: the requester (requester.ts, WqeRequester) reads the ring
//                       from its own index, checks each WQE's SGEs by lkey in the node's MR
//                       records and posts its packets on the node's engine; the completer
//                       (completer.ts, WqeCompleter) writes each CQE in posting order, then
//                       frees the WQE's slot (the consumer index moves at completion); a
//                       failure takes the QP to ERR ('qp-error') and flushes the rest
//   qp.destroy()        WQEs in flight and queued complete WR_FLUSH_ERR, oldest first
//   qp.release()        after the QP's copies are fenced: its inline memory goes
//   qp.sqPsn, qp.sqOutstanding   what ibv_query_qp and ibv_post_send read back
import type { CompletionRing } from '../device/cq-ring.js';
import { QpState, QpType, WcOpcode, WcStatus } from '../device/ib.js';
import type { RecvRing } from '../device/recv-ring.js';
import type { Sge } from '../device/rings.js';
import type { SendRing, SendWqe } from '../device/send-ring.js';
import { WqeCompleter } from './completer.js';
import { type RcAh, type RcNode, WqeRequester } from './requester.js';
import { RcOp } from '../fabric/packets.js';
import {
  type RcPd,
  type RcQp,
  type RcReceived,
  type RcRecvQueue,
  type RcRecvWqe,
  type RcRespState,
  type RcSrq,
  type RcTables,
  srqTake,
} from './tables.js';

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
  /** Retries after an RNR NAK (7: infinite), after an ACK timeout; the local ACK timeout code (absent: 7, 7, 14). */
  rnrRetry?: number;
  retryCnt?: number;
  timeout?: number;
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

/** What a QP is built from: its number, its PD's record, its receive rings and SRQ (see the top of this file). */
export interface RcQpInit {
  qpNum: number;
  pd: RcPd;
  /** Its own receive ring (none for an XRC QP or one on an SRQ). */
  rq: RecvRing | undefined;
  /** The receive CQ's ring (an XRC target's receives complete on their XRC SRQ's). */
  recvCq: CompletionRing | undefined;
  /** The SRQ it takes its receives from. */
  srq?: RcSrq | undefined;
  /** An XRC target: its XRC domain's handle. */
  xrcd?: number | undefined;
  /** A UD QP: each datagram takes its receive off the queue when admitted. */
  ud?: boolean;
  /** Its send side (none: a QP that only receives, as in the receive side's own tests). */
  send?: RcSendSide;
}

/** A receive queue that holds nothing (a QP whose receives come from elsewhere). */
const NO_RQ: RcRecvQueue = { length: 0, head: () => undefined, shift: () => undefined };

/** A span of this QP's memory the peer's answer is expected in, under `key`. */
export interface RcLanding {
  key: number;
  addr: bigint;
  end: bigint;
}

/** @internal One QP's RC state at its node (see the top of this file). */
export class RcQueuePair implements RcQp {
  readonly qpNum: number;
  readonly pd: RcPd;
  readonly rq: RcRecvQueue;
  readonly srq: RcSrq | undefined;
  readonly xrcd: number | undefined;
  readonly takesReceives: boolean;
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
  // The send side (see the top of this file); set when the init has one.
  readonly node!: RcNode;
  readonly ud: boolean;
  readonly sq!: SendRing<SendWqe<RcAh>>;
  readonly sendCq!: CompletionRing;
  readonly sqSigAll: boolean = false;
  readonly #requester: WqeRequester | undefined;
  /** Where the peer may land answers: this QP's READ and atomic sinks while they wait. */
  readonly landings = new Set<RcLanding>();
  readonly #ring: RecvRing | undefined;
  readonly #recvCq: CompletionRing | undefined;
  readonly #ud: boolean;
  /** The SRQ each receive it took came from (an XRC target completes it on that SRQ's CQ). */
  readonly #from = new WeakMap<RcRecvWqe, RcSrq>();

  constructor(init: RcQpInit) {
    this.qpNum = init.qpNum;
    this.pd = init.pd;
    this.#ring = init.rq;
    this.rq = init.rq ?? NO_RQ;
    this.#recvCq = init.recvCq;
    this.srq = init.srq;
    this.xrcd = init.xrcd;
    this.#ud = init.ud ?? false;
    this.takesReceives = this.srq !== undefined || this.xrcd !== undefined || this.#ud;
    this.ud = this.#ud;
    const send = init.send;
    if (send) {
      this.node = send.node;
      this.ud = send.qpType === QpType.UD;
      this.sq = send.sq;
      this.sendCq = send.sendCq;
      this.sqSigAll = send.sqSigAll;
      this.#requester = new WqeRequester(this, new WqeCompleter(this));
    }
  }

  /** The provider wrote WQEs into the send ring: start what may start (rxe's post_send doorbell). */
  doorbell(): void {
    this.#requester?.kick();
  }

  /** RTR → RTS: the PSN of the first request (sq_psn). */
  startPsn(psn: number): void {
    this.#requester?.startPsn(psn);
  }

  /** The PSN of the next request (ibv_query_qp's sq_psn). */
  get sqPsn(): number {
    return this.#requester?.psn ?? 0;
  }

  /** WQEs posted and not completed: they hold their slots (post_send's room, SQD's draining). */
  get sqOutstanding(): number {
    return this.#requester ? this.sq.length : 0;
  }

  /** The QP is destroyed: its WQEs in flight, then those queued, complete WR_FLUSH_ERR in posting order. */
  destroy(): void {
    this.destroyed = true;
    this.#requester?.flushQueued();
  }

  /** The QP is gone and its transfers fenced: what the device kept for it (its inline memory) goes. */
  release(): void {
    this.#requester?.release();
  }

  /** Expect the peer's bytes in `sges` (a READ's or an atomic's sinks); the returned function ends it. */
  expectLanding(sges: readonly Sge[]): () => void {
    const spans = sges.map((s) => ({ key: s.lkey, addr: s.addr, end: s.addr + BigInt(s.length) }));
    for (const l of spans) this.landings.add(l);
    return () => {
      for (const l of spans) this.landings.delete(l);
    };
  }

  /** The owner's modify (or its ERR, its destruction): the attributes the transport reads from now on. */
  modify(a: RcQpAttrs): void {
    const toErr = a.state === QpState.ERR && this.state !== QpState.ERR;
    this.state = a.state;
    this.destroyed = a.destroyed;
    this.destNode = a.destNode;
    this.destQpNum = a.destQpNum;
    this.accessFlags = a.accessFlags;
    this.minRnrTimer = a.minRnrTimer;
    this.qkey = a.qkey;
    if (a.rnrRetry !== undefined) this.rnrRetry = a.rnrRetry;
    if (a.retryCnt !== undefined) this.retryCnt = a.retryCnt;
    if (a.timeout !== undefined) this.timeout = a.timeout;
    // ibv_modify_qp to ERR (or its destruction): rxe_qp_error, both sides.
    if (toErr) this.#error();
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

  take(t: RcTables, srq?: RcSrq): RcRecvWqe | undefined {
    const from = srq ?? this.srq;
    if (!from) return this.#ud ? this.#ring?.shift() : undefined;
    const wqe = srqTake(t, from);
    if (wqe) this.#from.set(wqe, from);
    return wqe;
  }

  giveBack(wqe: RcRecvWqe): void {
    if (this.state === QpState.ERR || this.destroyed) return void this.#cqe(wqe, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
    const srq = this.#from.get(wqe);
    if (srq) {
      if (!srq.destroyed) srq.ring.unshift(wqe);
    } else this.#ring?.unshift(wqe);
  }

  expects(lkey: number, va: bigint, length: number): boolean {
    for (const l of this.landings) if (l.key === lkey && va >= l.addr && va + BigInt(length) <= l.end) return true;
    return false;
  }

  received(t: RcTables, wqe: RcRecvWqe, r: RcReceived): void {
    const ok = r.status === 'ok';
    const status = ok ? WcStatus.SUCCESS : r.status === 'len' ? WcStatus.LOC_LEN_ERR : WcStatus.LOC_PROT_ERR;
    const opcode = r.op === RcOp.WRITE_IMM ? WcOpcode.RECV_RDMA_WITH_IMM : WcOpcode.RECV;
    if (!this.#cqe(wqe, status, opcode, ok ? r.byteLen : 0, r.immData, ok ? r.odp : undefined, r.srcQpn, r.solicited)) this.toError(t);
  }

  /** The device's own ERR (a receive or a WQE failed, a CQ overran): both sides, then 'qp-error' on the node's event line. */
  toError(t: RcTables | undefined = this.node?.tables): void {
    if (this.state === QpState.ERR) return;
    this.state = QpState.ERR;
    this.#error();
    t?.events?.({ type: 'qp-error', handle: this.qpNum });
  }

  // rxe_qp_error: the receives flushed; the QP's transfers on the engine end (FLUSHED), and
  // with nothing in flight its queued WQEs complete WR_FLUSH_ERR now (else behind what is).
  #error(): void {
    this.#flushReceives();
    const r = this.#requester;
    if (!r) return;
    this.node.cancel(this.qpNum);
    if (!r.running) r.kick();
  }

  // The receive side of ERR: a receive a message took off an SRQ is the message's alone,
  // flushed here (the SRQ's others stay for its other QPs); one a SEND has taken from rq is
  // still at its head, flushed with the rest, oldest first.
  #flushReceives(): void {
    const held = this.srq || this.xrcd !== undefined ? this.resp.msg?.wqe : undefined;
    this.resp.msg = undefined;
    if (held) this.#cqe(held, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
    if (this.#ring) for (const w of this.#ring.drain()) this.#cqe(w, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
  }

  // A receive's CQE, on the CQ of the XRC SRQ it came from or the QP's receive CQ. False if the CQ overran.
  #cqe(
    wqe: RcRecvWqe,
    status: WcStatus,
    opcode: WcOpcode,
    byteLen: number,
    immData?: number,
    odp?: RcReceived['odp'],
    srcQp?: number,
    solicited?: boolean,
  ): boolean {
    const cq = (this.xrcd !== undefined ? this.#from.get(wqe)?.cq : undefined) ?? this.#recvCq;
    if (!cq) return true;
    return cq.complete(BigInt(wqe.wrId), status, opcode, byteLen, this.qpNum, srcQp ?? this.destQpNum, immData, odp, solicited);
  }
}
