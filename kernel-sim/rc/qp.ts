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
import type { CompletionRing } from '../device/cq-ring.js';
import { QpState, WcOpcode, WcStatus } from '../device/ib.js';
import type { RecvRing } from '../device/recv-ring.js';
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
  readonly resp: RcRespState = { epsn: 0, msg: undefined };
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
    // ibv_modify_qp to ERR (or its destruction): rxe_qp_error, the receive side flushed.
    if (toErr) this.#flushReceives();
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

  toError(t: RcTables): void {
    if (this.state === QpState.ERR) return;
    this.state = QpState.ERR;
    this.#flushReceives();
    t.events?.({ type: 'qp-error', handle: this.qpNum });
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
