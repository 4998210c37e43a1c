// What one node's RC responder knows of its own QPs and MRs (rdma_rxe's rxe_pool objects as
// rxe_resp reads them), and the checks it makes of every packet that names a QP, once per
// packet, on its own node: QP state and connection, opcode, rkey, PD, access flags, bounds
// (rxe_resp's check_op_valid, check_rkey, check_length), and for a SEND or a WRITE with
// immediate the receive WQE it takes (check_resource: none posted is an RNR NAK). The verbs
// layer keeps its objects in these tables; the engine only reads them: it never asks the
// verbs whether a packet may land.
import { RcOp } from '../fabric/packets.js';
import type { MemoryLike } from '../memory.js';
import type { FaultCounts } from './types.js';

export { RcOp };

/** A protection domain as the tables see it: its handle (its SMMU stream's PD) and whether it is gone. */
export interface RcPd {
  /** The PD's handle. */
  readonly handle: number;
  /** True once the PD was deallocated. */
  readonly closed: boolean;
}

/** Where a range of an MR lies: a region of the process's memory and the offset in it. */
export interface RcPlaceAt {
  /** The region. */
  region: MemoryLike;
  /** Byte offset of the range in it. */
  offset: number;
}

/** ibv_access_flags bits the responder checks (libibverbs values). */
export const RcAccess = { LOCAL_WRITE: 1, REMOTE_WRITE: 2, REMOTE_READ: 4, REMOTE_ATOMIC: 8, FLUSH_GLOBAL: 256, FLUSH_PERSISTENT: 512 } as const;

/** An MR as its node's responder reads it. */
export interface RcMr {
  /** True once deregistered. */
  readonly closed: boolean;
  /** ibv_access_flags. */
  readonly access: number;
  /** The MR's protection domain (its handle is its SMMU stream's PD). */
  readonly pd: RcPd;
  /**
   * Where [addr, addr+length) lies, its region mapped in the PD's stream (ODP: the engine
   * faults on its pages); undefined if the range is not all inside the MR.
   */
  place(addr: bigint, length: number): RcPlaceAt | undefined;
  /** Whether [addr, addr+length) lies inside the MR (nothing mapped or touched). */
  covers(addr: bigint, length: number): boolean;
}

/** A shared receive queue as the responder takes receives from it (an XRC target's, by number). */
export interface RcSrq {
  /** The next receive WQE, taken off the queue for good; undefined if it is empty (an RNR NAK). */
  take(): RcRecvWqe | undefined;
}

/** A receive work request as the responder takes it. */
export interface RcRecvWqe {
  /** The WR's id, for its completion. */
  wrId: bigint | number;
  /** The buffers an incoming SEND is scattered into, in order. */
  sgList: RcSge[];
}

/** What the responder does with a receive queue (a RecvRing: the device's side of its ring). */
export interface RcRecvQueue {
  readonly length: number;
  /** The next receive (the same object until it is consumed), or undefined. */
  head(): RcRecvWqe | undefined;
  /** Consume the head. */
  shift(): RcRecvWqe | undefined;
}

/** A scatter/gather entry of a receive (struct ibv_sge). */
export interface RcSge {
  /** Start address. */
  addr: bigint;
  /** Bytes. */
  length: number;
  /** The lkey of the MR that holds it. */
  lkey: number;
}

/** How a receive ended, as the responder reports it to its QP (which completes it on its CQ). */
export interface RcReceived {
  /** 'ok'; 'prot': a buffer is in no MR of the QP's PD with LOCAL_WRITE; 'len': the message is longer than the buffers. */
  status: 'ok' | 'prot' | 'len';
  /** Which operation consumed it. */
  op: RcOp.SEND | RcOp.SEND_IMM | RcOp.WRITE_IMM | RcOp.UD_SEND | RcOp.UD_SEND_IMM;
  /** Bytes of the message. */
  byteLen: number;
  /** The immediate data of a SEND_WITH_IMM or WRITE_WITH_IMM. */
  immData?: number;
  /** The sender asked for a solicited event (BTH SE). */
  solicited?: boolean;
  /** The QP number of the sender. */
  srcQpn: number;
  /** What the message took at this end (and the source's faults, as the last packet reported them). */
  odp: RcOdp;
}

/** The faults and times of a message, as one end saw them. */
export interface RcOdp {
  /** Faults by side. */
  faults: FaultCounts;
  /** Pages a page store supplied (remote paging's major faults). */
  majorFaults: number;
  /** Blocks sent again after a fault. */
  retransmittedBlocks: number;
  /** Modelled µs, first packet issued to last landed. */
  modelUs: number;
  /** Measured µs, the same span. */
  realUs: number;
}

/** A QP as its node's responder reads it. */
export interface RcQp {
  /** The QP's number. */
  readonly qpNum: number;
  /** The QP's protection domain: the MRs it may use, the stream that translates its bytes. */
  readonly pd: RcPd;
  /** In RTR, RTS or SQD and not destroyed: it accepts packets. */
  readonly receiving: boolean;
  /** The node of the connected QP: the only one whose packets it accepts. */
  readonly destNode: number;
  /** The connected QP's number. */
  readonly destQpNum: number;
  /** qp_access_flags: the remote operations it accepts. */
  readonly accessFlags: number;
  /** The RNR NAK timer code it answers with. */
  readonly minRnrTimer: number;
  /**
   * The receive queue, a ring of receive WQEs (kernel-sim/device/recv-ring.ts): its head is
   * taken by a SEND's first packet (kept there until the message completes).
   */
  readonly rq: RcRecvQueue;
  /**
   * Where receives come from when they are not `rq`'s head (a QP attached to a shared
   * receive queue): the next receive WQE taken off that queue for good, or undefined if it
   * is empty (an RNR NAK). The message holds it until it completes (or the QP's ERR flushes it).
   */
  take?(): RcRecvWqe | undefined;
  /** A UD QP's Q_Key (absent for an RC QP): it takes UD SENDs from any QP that names it. */
  readonly qkey?: number;
  /** UD: give back a receive `take` returned whose datagram did not land (a fault: it comes again). */
  giveBack?(wqe: RcRecvWqe): void;
  /**
   * An XRC target QP (XRC_RECV): the XRC SRQ of its XRC domain numbered `srqn` (the packet's
   * XRCETH), which its messages take their receives from; undefined if the domain has none.
   */
  xrcSrq?(srqn: number): RcSrq | undefined;
  /** Whether the peer's READ response or atomic result may land in [va, va+length) under `lkey` (this QP's outstanding sinks). */
  expects(lkey: number, va: bigint, length: number): boolean;
  /** A receive ended (its WQE has left `rq`). */
  received(wqe: RcRecvWqe, r: RcReceived): void;
  /** A receive failed at this end (a bad buffer, too short): the QP goes to ERR. */
  toError(): void;
  /** The responder's own state of this QP (rxe's qp->resp): the PSN it expects, the message in progress. */
  readonly resp: RcRespState;
}

/** What a QP's responder keeps between packets (set up by the QP at RTR, cleared at RESET). */
export interface RcRespState {
  /** The PSN of the next message (rq_psn at RTR; 24 bits). */
  epsn: number;
  /** The message in progress: its PSN, the sender's transfer, the receive WQE it took, what it cost here. */
  msg: RcMessage | undefined;
}

/** A message this QP is receiving. */
export interface RcMessage {
  psn: number;
  tid: number;
  opcode: RcOp;
  /** SEND: the receive WQE its first packet took (still at the head of rq until the message completes). */
  wqe: RcRecvWqe | undefined;
  /** Destination faults (NACKs) this end took for it. */
  faults: number;
  /** When its first packet was issued (modelled µs, performance.now() ms). */
  firstUs: number;
  firstMs: number;
}

/** One node's object tables: its MRs by key and its QPs by number. */
export class RcTables {
  /** MRs by key (lkey = rkey). */
  readonly mrs = new Map<number, RcMr>();
  /** QPs by number. */
  readonly qps = new Map<number, RcQp>();
  /**
   * Set once a verbs device drives the node: a packet that names no QP is then accepted only
   * from the node's own engine (an atomic's read into its own buffer), never from a peer.
   */
  strict = false;
}

/** Why the responder refused a packet: the NAK syndrome (AETH) and what it says. */
export interface RcRefusal {
  /** 'drop': a UD datagram silently dropped (the sender's engine is answered as if it landed). */
  nak: 'qp' | 'psn' | 'access' | 'inv-req' | 'op' | 'rnr' | 'drop';
  reason: string;
  /** RNR NAK: the QP's min_rnr_timer code. */
  rnrTimer?: number;
}

/** An RC packet's fields the responder acts on. */
export interface RcPacket {
  src: number;
  qpn: number;
  srcQpn: number | undefined;
  opcode: RcOp;
  psn: number | undefined;
  key: number | undefined;
  tid: number;
  seq: number;
  va: bigint;
  length: number;
  /** Bytes of the transfer from this packet's first on. */
  lengthHint: number;
  /** A message of several transfers (one per SGE): this transfer's offset in it and the message's bytes. */
  msgOffset: number | undefined;
  msgLength: number | undefined;
  /** READ request: the bytes to read from `va`; FLUSH: the bytes to flush. */
  dmaLength: number | undefined;
  /** FLUSH: FETH's placement type bits and selectivity level. */
  flush?: { type: number; level: number } | undefined;
  /** UD SEND: DETH's Q_Key. */
  qkey?: number | undefined;
  /** XRCETH: the XRC SRQ number, in every request of an XRC send QP. */
  srqn?: number | undefined;
  blockSize: number;
  issuedUs: number;
  issuedMs: number;
}

/** A packet admitted: its QP, the message it belongs to, where its bytes land. */
export interface RcAdmitted {
  qp: RcQp;
  msg: RcMessage;
  /** Bytes of the message. */
  total: number;
  /** Destination spans in order, each inside an MR checked for this packet (empty: no bytes). */
  spans: RcPlace['spans'];
  /** The packet ends the message. */
  last: boolean;
  /**
   * A READ or an atomic request under a PSN this QP already took (rxe_resp's duplicate_request):
   * the requester asks again for the rest of a READ, or for an atomic's result (a fault at its
   * sink). A READ is read again; an atomic is answered from the replay, never executed again.
   */
  duplicate?: boolean;
}

/** How far back (PSNs) a READ or an atomic request counts as a duplicate of one already taken. */
const DUPLICATE_WINDOW = 1 << 23;

/**
 * Admit an RC packet at this node (rxe_resp's checks, in its order): the QP and its
 * connection, the PSN (the next message's first packet, or the message in progress), the
 * opcode and rkey (checkRc), then the resources: a SEND's first packet takes the receive at
 * the head of rq (RNR NAK if there is none; its buffers are checked: not in an MR of the
 * QP's PD is REM_OP_ERR, too short REM_INV_REQ_ERR, the receive completing in error and the
 * QP going to ERR), a WRITE with immediate's last packet needs one too. A message starts
 * (epsn moves on) only once its first packet is admitted.
 */
export function admitRc(t: RcTables, p: RcPacket): RcAdmitted | RcRefusal {
  if (p.opcode === RcOp.UD_SEND || p.opcode === RcOp.UD_SEND_IMM) return admitUd(t, p);
  const refused = checkRc(t, p);
  if (refused) return refused;
  const qp = t.qps.get(p.qpn)!;
  // Where the packet's bytes sit in its message, and whether it ends the message.
  const { off, total } = spanOf(p);
  const last = off + p.length === total;
  const spansOf = (): RcPlace['spans'] => (p.length > 0 ? [{ va: p.va, length: p.length, key: p.key! }] : []);
  // A READ response or an atomic's belongs to this QP's own outstanding request (checkRc
  // checked it expects it), not to a message its responder receives: no PSN of the receive side.
  if (p.opcode === RcOp.READ_RESPONSE || p.opcode === RcOp.ATOMIC_ACK)
    return {
      qp,
      msg: { psn: p.psn ?? 0, tid: p.tid, opcode: p.opcode, wqe: undefined, faults: 0, firstUs: p.issuedUs, firstMs: p.issuedMs },
      total,
      spans: spansOf(),
      last,
    };
  // XRC: a target QP takes requests of its XRC send QP only, each naming an XRC SRQ of its domain.
  let take = qp.take ? () => qp.take!() : undefined;
  if (qp.xrcSrq || p.srqn !== undefined) {
    const srq = p.srqn === undefined ? undefined : qp.xrcSrq?.(p.srqn);
    if (!srq)
      return {
        nak: 'inv-req',
        reason: qp.xrcSrq
          ? `XRC target QP ${p.qpn}'s domain has no XRC SRQ ${String(p.srqn)}`
          : `QP ${p.qpn} is no XRC target: the request names XRC SRQ ${String(p.srqn)}`,
      };
    take = () => srq.take();
  }
  const r = qp.resp;
  let msg = r.msg;
  const continues = msg !== undefined && msg.psn === p.psn;
  if (!continues) {
    const behind = (r.epsn - (p.psn ?? r.epsn)) & 0xffffff;
    if ((p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC) && behind > 0 && behind <= DUPLICATE_WINDOW)
      return {
        qp,
        msg: { psn: p.psn!, tid: p.tid, opcode: p.opcode, wqe: undefined, faults: 0, firstUs: p.issuedUs, firstMs: p.issuedMs },
        total,
        spans: spansOf(),
        last,
        duplicate: true,
      };
    if (p.psn !== r.epsn || off !== 0)
      return { nak: 'psn', reason: `QP ${p.qpn} expects PSN ${r.epsn} to start a message, got PSN ${String(p.psn)} at byte ${off}` };
    msg = { psn: p.psn, tid: p.tid, opcode: p.opcode, wqe: undefined, faults: 0, firstUs: p.issuedUs, firstMs: p.issuedMs };
  }
  const send = p.opcode === RcOp.SEND || p.opcode === RcOp.SEND_IMM;
  let spans: RcPlace['spans'];
  if (send) {
    if (!msg!.wqe) {
      const wqe = take ? take() : qp.rq.head();
      if (!wqe) return { nak: 'rnr', reason: `QP ${p.qpn} has no receive posted`, rnrTimer: qp.minRnrTimer };
      const s = scatterSend(t, qp, wqe, 0, 0, total);
      if ('fail' in s) {
        if (!take) qp.rq.shift();
        qp.received(wqe, { status: s.fail, op: p.opcode as RcOp.SEND, byteLen: 0, srcQpn: p.srcQpn ?? 0, odp: emptyRcOdp() });
        qp.toError();
        return s.fail === 'prot'
          ? { nak: 'op', reason: `a buffer of QP ${p.qpn}'s receive is in no MR of its PD with LOCAL_WRITE` }
          : { nak: 'inv-req', reason: `a ${total}-byte SEND does not fit QP ${p.qpn}'s receive buffers` };
      }
      msg!.wqe = wqe;
    }
    const s = scatterSend(t, qp, msg!.wqe!, off, p.length, 0);
    if ('fail' in s) return { nak: 'op', reason: `QP ${p.qpn}'s receive buffers went away mid-message` };
    spans = s.spans;
  } else {
    if (p.opcode === RcOp.WRITE_IMM && last) {
      // From a shared queue the receive is taken now, held by the message like a SEND's.
      if (take) msg!.wqe ??= take();
      if (!(take ? msg!.wqe : qp.rq.head())) return { nak: 'rnr', reason: `QP ${p.qpn} has no receive posted`, rnrTimer: qp.minRnrTimer };
    }
    spans = spansOf();
  }
  if (!continues) {
    r.msg = msg;
    r.epsn = (r.epsn + 1) & 0xffffff;
  }
  return { qp, msg: msg!, total, spans, last };
}

/** Whether `qp` takes each receive off its queue for good (an SRQ's, an XRC SRQ's, a UD QP's): the message holds it. */
export function takesReceives(qp: RcQp): boolean {
  return qp.take !== undefined || qp.xrcSrq !== undefined;
}

/** Bytes at the head of a UD receive buffer kept for the GRH (never written here: no GRH is carried). */
export const GRH_BYTES = 40;

/**
 * Admit a UD SEND (rxe_resp for a UD QP): a UD QP receiving, the Q_Key it holds, a receive
 * WQE taken off its queue; the message lands after the receive's first GRH_BYTES. Anything
 * else is dropped without a word to the sender, as IB's UD does: no QP, a wrong Q_Key (a
 * Q_Key violation), no receive posted (no RNR on UD). A receive too short completes with
 * LOC_LEN_ERR, one with a buffer in no MR with LOC_PROT_ERR (the QP going to ERR); the
 * datagram is dropped then too.
 */
function admitUd(t: RcTables, p: RcPacket): RcAdmitted | RcRefusal {
  const qp = t.qps.get(p.qpn);
  if (!qp || !qp.receiving || qp.pd.closed || qp.qkey === undefined) return { nak: 'drop', reason: `no UD QP ${p.qpn} receiving on this node` };
  if (p.qkey !== qp.qkey) return { nak: 'drop', reason: `Q_Key 0x${(p.qkey ?? 0).toString(16)} does not match UD QP ${p.qpn}'s` };
  const wqe = qp.take?.();
  if (!wqe) return { nak: 'drop', reason: `UD QP ${p.qpn} has no receive posted` };
  const op = p.opcode as RcOp.UD_SEND;
  const s = scatterSend(t, qp, wqe, GRH_BYTES, p.length, GRH_BYTES + p.length);
  if ('fail' in s) {
    qp.received(wqe, { status: s.fail, op, byteLen: 0, srcQpn: p.srcQpn ?? 0, odp: emptyRcOdp() });
    if (s.fail === 'prot') qp.toError();
    return { nak: 'drop', reason: `UD QP ${p.qpn}'s receive ${s.fail === 'len' ? 'is too short' : 'has a buffer in no MR of its PD'}` };
  }
  const msg: RcMessage = { psn: p.psn ?? 0, tid: p.tid, opcode: p.opcode, wqe, faults: 0, firstUs: p.issuedUs, firstMs: p.issuedMs };
  return { qp, msg, total: p.length, spans: s.spans, last: true };
}

/** Zero faults and times. */
export function emptyRcOdp(): RcOdp {
  return { faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
}

/** Whether an admitted packet's key and QP still hold a turn later (a group copied after the first). */
export function stillAdmitted(t: RcTables, a: RcAdmitted, key: number | undefined): boolean {
  if (!a.qp.receiving || a.qp.pd.closed || t.qps.get(a.qp.qpNum) !== a.qp) return false;
  if (key === undefined) return true;
  const mr = t.mrs.get(key);
  return mr !== undefined && !mr.closed && !mr.pd.closed;
}

/** Where a run of a message lands at this node, once checked. */
export interface RcPlace {
  /** The destination span(s): one for RETH-addressed packets, one per receive buffer for a SEND. */
  spans: Array<{ va: bigint; length: number; key: number }>;
  /** The PD whose stream translates them. */
  pd: number;
  qp: RcQp;
}

const hex = (n: number) => `0x${n.toString(16)}`;

/**
 * The MR `key` names, if it is this QP's to use for `access` over [va, va+length) (and, when
 * given, over the message's bytes from va on: RETH's DMA length), its span mapped.
 */
function keyFor(t: RcTables, qp: RcQp, key: number, va: bigint, length: number, access: number, rest = length): RcMr | undefined {
  const mr = t.mrs.get(key);
  if (!mr || mr.closed || mr.pd.closed || mr.pd.handle !== qp.pd.handle || (mr.access & access) !== access) return undefined;
  if (rest > length && !mr.covers(va, rest)) return undefined;
  return mr.place(va, length) ? mr : undefined;
}

/** Where a packet's bytes sit in its message, the message's bytes, and what of it is left from this packet on. */
function spanOf(p: RcPacket): { off: number; total: number; rest: number } {
  const off = (p.msgOffset ?? 0) + p.seq * p.blockSize;
  const total = p.msgLength ?? off + p.lengthHint;
  return { off, total, rest: total - off };
}

/**
 * Check a packet that names QP `qpn` against this node's tables (once per packet, no
 * callback to anyone): the QP, its connection (the packet's source node as the transport
 * proved it, and its QP), the opcode against the QP's access flags, and for RETH-addressed
 * packets the rkey: its MR live, in the QP's PD, with the access and covering the span.
 * Returns the refusal, or undefined.
 */
export function checkRc(t: RcTables, p: RcPacket): RcRefusal | undefined {
  const qp = t.qps.get(p.qpn);
  if (!qp || !qp.receiving || qp.pd.closed) return { nak: 'qp', reason: `no QP ${p.qpn} accepting packets on this node` };
  if (p.src !== qp.destNode || p.srcQpn !== qp.destQpNum)
    return { nak: 'qp', reason: `QP ${p.qpn} is connected to QP ${qp.destQpNum} of node ${qp.destNode}, not QP ${p.srcQpn} of node ${p.src}` };
  switch (p.opcode) {
    case RcOp.WRITE:
    case RcOp.WRITE_IMM: {
      if (!(qp.accessFlags & RcAccess.REMOTE_WRITE)) return { nak: 'access', reason: `QP ${p.qpn} does not accept RDMA WRITE (qp_access_flags)` };
      // A zero-length write names no memory (IB: its rkey is not checked). The rest of the
      // message must fit too (RETH's DMA length): a write past its MR lands nothing.
      if (p.length === 0) return undefined;
      const { rest } = spanOf(p);
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, p.length, RcAccess.REMOTE_WRITE, rest))
        return { nak: 'access', reason: rkeyReason(t, qp, p.key, p.va, rest, 'REMOTE_WRITE') };
      return undefined;
    }
    case RcOp.SEND:
    case RcOp.SEND_IMM:
      return undefined;
    case RcOp.READ_REQUEST: {
      if (!(qp.accessFlags & RcAccess.REMOTE_READ)) return { nak: 'access', reason: `QP ${p.qpn} does not accept RDMA READ (qp_access_flags)` };
      const n = p.dmaLength ?? 0;
      if (n === 0) return undefined;
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, n, RcAccess.REMOTE_READ))
        return { nak: 'access', reason: rkeyReason(t, qp, p.key, p.va, n, 'REMOTE_READ') };
      return undefined;
    }
    case RcOp.ATOMIC:
      if (p.va % 8n !== 0n) return { nak: 'inv-req', reason: `an atomic's address must be 8-byte aligned, got 0x${p.va.toString(16)}` };
      if (!(qp.accessFlags & RcAccess.REMOTE_ATOMIC)) return { nak: 'access', reason: `QP ${p.qpn} does not accept atomics (qp_access_flags)` };
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, 8, RcAccess.REMOTE_ATOMIC))
        return { nak: 'access', reason: rkeyReason(t, qp, p.key, p.va, 8, 'REMOTE_ATOMIC') };
      return undefined;
    case RcOp.ATOMIC_WRITE:
      // rxe_resp: QP and MR need REMOTE_WRITE; the word is 8-byte aligned and the payload its 8 bytes.
      if (p.va % 8n !== 0n) return { nak: 'inv-req', reason: `an ATOMIC WRITE's address must be 8-byte aligned, got 0x${p.va.toString(16)}` };
      if (spanOf(p).total !== 8) return { nak: 'inv-req', reason: `an ATOMIC WRITE carries 8 bytes, got ${spanOf(p).total}` };
      if (!(qp.accessFlags & RcAccess.REMOTE_WRITE))
        return { nak: 'access', reason: `QP ${p.qpn} does not accept ATOMIC WRITE (qp_access_flags lacks REMOTE_WRITE)` };
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, 8, RcAccess.REMOTE_WRITE))
        return { nak: 'access', reason: rkeyReason(t, qp, p.key, p.va, 8, 'REMOTE_WRITE') };
      return undefined;
    case RcOp.FLUSH: {
      // rxe_resp's check_qp_attr_access and check_placement_type: the QP and the MR must both
      // allow each placement type asked for.
      const type = p.flush?.type ?? 0;
      const want = (type & 1 ? RcAccess.FLUSH_GLOBAL : 0) | (type & 2 ? RcAccess.FLUSH_PERSISTENT : 0);
      const name = type & 1 && !(qp.accessFlags & RcAccess.FLUSH_GLOBAL) ? 'FLUSH_GLOBAL' : 'FLUSH_PERSISTENT';
      if (want === 0) return { nak: 'inv-req', reason: 'a FLUSH names no placement type' };
      if ((qp.accessFlags & want) !== want) return { nak: 'access', reason: `QP ${p.qpn} does not accept FLUSH with ${name} (qp_access_flags)` };
      // Selectivity MR flushes the whole MR: only the key is checked; a range must lie inside it.
      const n = p.flush?.level === 1 ? 0 : (p.dmaLength ?? 0);
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, n, want)) {
        const mr = p.key === undefined ? undefined : t.mrs.get(p.key);
        const lacks = mr && !mr.closed && mr.pd.handle === qp.pd.handle && (mr.access & want) !== want;
        const flag = mr && type & 1 && !(mr.access & RcAccess.FLUSH_GLOBAL) ? 'FLUSH_GLOBAL' : 'FLUSH_PERSISTENT';
        return { nak: 'access', reason: lacks ? `rkey ${hex(p.key!)}'s MR was registered without ${flag}` : rkeyReason(t, qp, p.key, p.va, n, flag) };
      }
      return undefined;
    }
    case RcOp.READ_RESPONSE:
    case RcOp.ATOMIC_ACK:
      if (p.length === 0) return undefined;
      if (p.key === undefined || !keyFor(t, qp, p.key, p.va, p.length, RcAccess.LOCAL_WRITE) || !qp.expects(p.key, p.va, p.length))
        return { nak: 'access', reason: `QP ${p.qpn} expects no response bytes at ${hex(Number(p.va))} under key ${hex(p.key ?? 0)}` };
      return undefined;
    default:
      return { nak: 'inv-req', reason: `opcode ${String(p.opcode)} is not an RC opcode this responder knows` };
  }
}

function rkeyReason(t: RcTables, qp: RcQp, key: number | undefined, va: bigint, length: number, want: string): string {
  if (key === undefined) return 'the packet names no rkey';
  const mr = t.mrs.get(key);
  if (!mr || mr.closed) return `rkey ${hex(key)} names no live MR on this node`;
  if (mr.pd.handle !== qp.pd.handle) return `rkey ${hex(key)} belongs to another protection domain than QP ${qp.qpNum}'s`;
  if (!(mr.access & RcAccess[want as keyof typeof RcAccess])) return `rkey ${hex(key)}'s MR was registered without ${want}`;
  return `[0x${va.toString(16)}, +${length}) is not inside rkey ${hex(key)}'s MR`;
}

/**
 * The receive buffers' spans for bytes [from, from+length) of a SEND's message: checked
 * against this node's MRs (LOCAL_WRITE, the QP's PD). A 'prot' or 'len' refusal if the WQE
 * cannot hold them.
 */
export function scatterSend(
  t: RcTables,
  qp: RcQp,
  wqe: RcRecvWqe,
  from: number,
  length: number,
  total: number,
): { spans: RcPlace['spans'] } | { fail: 'prot' | 'len' } {
  let room = 0;
  for (const s of wqe.sgList) {
    if (s.length > 0 && !keyFor(t, qp, s.lkey, s.addr, s.length, RcAccess.LOCAL_WRITE)) return { fail: 'prot' };
    room += s.length;
  }
  if (total > room || from + length > room) return { fail: 'len' };
  const spans: RcPlace['spans'] = [];
  let at = 0;
  for (const s of wqe.sgList) {
    const lo = Math.max(from, at);
    const hi = Math.min(from + length, at + s.length);
    if (hi > lo) spans.push({ va: s.addr + BigInt(lo - at), length: hi - lo, key: s.lkey });
    at += s.length;
    if (at >= from + length) break;
  }
  return { spans };
}

/** The MR behind `key`, for a span already checked by checkRc or scatterSend. */
export function placeSpan(t: RcTables, key: number, va: bigint, length: number): { region: MemoryLike; offset: number } | undefined {
  return t.mrs.get(key)?.place(va, length);
}

/** min_rnr_timer codes in ms (IB spec table; 0 is the longest, 655.36 ms). */
export function rnrTimerMs(code: number): number {
  const table = [
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48,
    30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
  ];
  return table[code & 31]!;
}
