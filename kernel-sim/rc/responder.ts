// The responder of one node's PLDMA (rxe_resp's role): a write packet (a run of blocks)
// arrives, its destination is translated on this node's SMMU with the packet's protection
// domain, a fault is recorded here and NACKed (the source sends the block again once this
// node's fault library has answered), an access this node refuses gets an error ACK, and
// the blocks that translate are written by the copy engine and ACKed with one verdict. A
// channel's writes are answered in the order they came, and after one stopped at a block,
// the later writes of that transfer come back unanswered until that block comes again (an
// RC responder's PSN check). A READ or an atomic request is answered by its response (a
// transfer of this node's engine, which nothing ACKs); a response to this node's own request
// is placed the same way as a write, and what landed goes to this node's completer instead of
// an ACK. Everything it knows comes from the packet; everything it says goes back as a packet.
import type { CostModel } from '../cost-model/index.js';
import { AckResp, type AckPacket, isResponse, RcOp, type Verdict, type WritePacket } from '../fabric/packets.js';
import type { Transport } from '../fabric/transport.js';
import type { MemoryLike } from '../memory.js';
import type { RunSpans, Smmu, StallWindow, StreamContext, Translation } from '../smmu/smmu.js';
import { Access } from '../device/ib.js';
import { AtomicUnit } from './atomic.js';
import { type CopyEngine, CopyFlag, type CopyResult, CopyStatus, type CopyTag, nodeTag } from '../pldma/copy-engine.js';
import type { Fault, Faults, HeldAnswer } from './faults.js';
import {
  MrState,
  mrCovers,
  mrPlace,
  type RcAdmitted,
  type RcMessage,
  type RcMr,
  type RcOdp,
  type RcPacket,
  type RcPlace,
  type RcQp,
  type RcReceived,
  type RcRecvWqe,
  type RcRefusal,
  type RcSrq,
  type RcTables,
} from './tables.js';
import { type DmaCompletion, type DmaDescriptor, DmaStatus, type PldmaCounters, revoked, walkCost, walkedCost } from '../pldma/types.js';

/** @internal What one node's responder needs of its node. */
export interface ResponderDeps {
  node: number;
  smmu: Smmu;
  transport: Transport;
  engine: CopyEngine;
  costs: CostModel;
  counters: PldmaCounters;
  faults: Faults;
  /** The node's QP and MR tables, which RC packets are checked against. */
  tables: RcTables;
  /** Post a transfer on this node's engine (a READ response, an atomic's original value). */
  post: (d: DmaDescriptor) => Promise<DmaCompletion>;
  /** A response to one of this node's requests was placed (or stopped): its completer's to read, as an ACK. */
  responded: (p: WritePacket, verdicts: Verdict[]) => void;
  /** Virtual channels of this node's engine. */
  channels: number;
}

/** Records a destination fault and waits for its answer (a NACK carries it). */
type HoldNack = () => Promise<HeldAnswer | undefined>;

/** Base page and huge page sizes (an IOTLB entry is keyed at its page's base). */
const PAGE = 4096;
const HUGE_PAGE = 2n * 1024n * 1024n;

/** Blocks of a write whose destination translated in one piece: where they land. */
interface Group {
  /** Index in the packet of its first block, and its blocks. */
  at: number;
  count: number;
  region: MemoryLike;
  offset: number;
  /** Per block, modelled µs of the walk (0-length: all `walkUs`). */
  walks: number[];
  /** Destination address and bytes of the piece. */
  va: bigint;
  length: number;
  /** Byte offset of the piece in the packet, where it does not start at block `at` (a SEND's receive buffer). */
  byteAt?: number;
}

/** A packet's destination, checked: the stream that translates it and the spans it lands in. */
interface Placed {
  ctx: StreamContext;
  spans: Array<{ va: bigint; length: number; key: number | undefined }>;
  /** An RC packet: its QP and message. */
  rc?: RcAdmitted;
}

/** A write's blocks translated: the pieces to copy, the blocks that translated, and the verdict of the block that stopped it. */
interface Translated {
  /** Blocks that carry bytes (up to a source fault the sender's transport found). */
  carried: number;
  groups: Group[];
  written: number;
  refused: Verdict | undefined;
  refusedFault: HoldNack | undefined;
}

/** A write being executed: the packet, where it lands, its verdicts, the faults whose NACKs wait for their answers, and whether a copy stopped it. */
interface Executed {
  p: WritePacket;
  dest: Placed;
  verdicts: Verdict[];
  faults: HoldNack[];
  stopped: boolean;
}

/** Where a group's bytes start in its packet's payload. */
function sourceOffset(p: WritePacket, g: Group): number {
  return p.payload.offset + (g.byteAt ?? g.at * p.blockSize);
}

/** A packet refused before it lands: the error ACK's syndrome and why. */
interface Refused {
  refusal: AckResp;
  reason: string;
  rnrTimer?: number;
}

/** The ACK syndrome of each refusal of the RC checks. */
const NAK_RESP: Record<RcRefusal['nak'], AckResp> = {
  qp: AckResp.DROPPED,
  psn: AckResp.DROPPED,
  access: AckResp.ACCESS_ERR,
  'inv-req': AckResp.INV_REQ,
  op: AckResp.OP_ERR,
  rnr: AckResp.RNR,
  // UD: the sender's engine hears the datagram landed; nothing was written.
  drop: AckResp.OK,
};

/** A channel of a source node, as this responder sees it: its writes answered in order, and where the transfer stopped. */
interface Lane {
  /** Writes taken and not yet answered. */
  open: number;
  /** Writes waiting for the answer of the one before them, in order (a write that found none open waits for nothing). */
  waiting: Array<() => void>;
  /** The transfer and block a write stopped at: that transfer's later writes are returned until it comes again. */
  stop: { tid: number; seq: number } | undefined;
}

// ---- the checks (rxe_resp's chain, in its order) ----
//
// A packet that names a QP goes through the checks once, on its own node, against its own
// tables: the QP and its connection (rxe_rcv's header check), then the PSN, the opcode against
// the QP (and an XRC target's SRQ), the rkey, and the resources (a receive WQE). Each step is a
// small function that returns the next one, or the refusal that ends the chain; the last one
// admits the packet (a message starts, epsn moving on, only then). The rkey is checked before
// the resource, where rxe checks it after: a receive taken off a shared queue is taken for
// good, so it is taken only for a packet that will land.

/** How far back (PSNs) a READ or an atomic request counts as a duplicate of one already taken. */
const DUPLICATE_WINDOW = 1 << 23;

/** Bytes at the head of a UD receive buffer kept for the GRH (never written here: no GRH is carried). */
export const GRH_BYTES = 40;

/** What the checks know of a packet so far. */
interface Check {
  t: RcTables;
  p: RcPacket;
  qp: RcQp;
  /** Where the packet's bytes sit in its message, the message's bytes, and whether it ends it. */
  off: number;
  total: number;
  last: boolean;
  /** The message it starts or continues. */
  msg: RcMessage | undefined;
  continues: boolean;
  duplicate: boolean;
  /** Where its receive comes from when it is not rq's head (an SRQ, an XRC SRQ). */
  take: (() => RcRecvWqe | undefined) | undefined;
  /** Where its bytes land, once known (a SEND's receive buffers). */
  spans: RcPlace['spans'] | undefined;
}

/** A step of the chain: the next step, the packet admitted, or why it is refused. */
type Step = (c: Check) => Step | RcAdmitted | RcRefusal;

/**
 * Admit an RC packet at this node: rxe_resp's chain of checks (see above). UD datagrams have
 * a chain of their own (admitUd).
 */
export function admitRc(t: RcTables, p: RcPacket): RcAdmitted | RcRefusal {
  if (p.opcode === RcOp.UD_SEND || p.opcode === RcOp.UD_SEND_IMM) return admitUd(t, p);
  const qp = t.qps.get(p.qpn);
  if (!qp || !qp.receiving || qp.pd.closed) return { nak: 'qp', reason: `no QP ${p.qpn} accepting packets on this node` };
  const { off, total } = spanOf(p);
  const c: Check = {
    t,
    p,
    qp,
    off,
    total,
    last: off + p.length === total,
    msg: undefined,
    continues: false,
    duplicate: false,
    take: undefined,
    spans: undefined,
  };
  let step: Step | RcAdmitted | RcRefusal = checkConnection;
  while (typeof step === 'function') step = step(c);
  return step;
}

/** rxe_rcv's check: the packet comes from the connected QP (its node as the transport proved it, and its QP). */
function checkConnection(c: Check): Step | RcRefusal {
  const { p, qp } = c;
  if (p.src !== qp.destNode || p.srcQpn !== qp.destQpNum)
    return { nak: 'qp', reason: `QP ${p.qpn} is connected to QP ${qp.destQpNum} of node ${qp.destNode}, not QP ${p.srcQpn} of node ${p.src}` };
  // A READ response or an atomic's belongs to this QP's own outstanding request, not to a
  // message its responder receives: no PSN of the receive side.
  return isResponse(p.opcode) ? checkResponse : checkPsn;
}

/** A response to this QP's own request: its bytes land only in a sink it expects, under LOCAL_WRITE. */
function checkResponse(c: Check): RcAdmitted | RcRefusal {
  const { t, p, qp } = c;
  if (p.length > 0 && (p.key === undefined || !keyFor(t, qp, p.key, p.va, p.length, Access.LOCAL_WRITE) || !qp.expects(p.key, p.va, p.length)))
    return { nak: 'access', reason: `QP ${p.qpn} expects no response bytes at ${hex(Number(p.va))} under key ${hex(p.key ?? 0)}` };
  c.msg = newMessage(p);
  return admitted(c);
}

/** rxe's check_psn: the message in progress goes on, the next one starts, or a READ or an atomic is asked again. */
function checkPsn(c: Check): Step | RcRefusal {
  const { p, qp } = c;
  const r = qp.resp;
  if (r.msg !== undefined && r.msg.psn === p.psn) {
    c.msg = r.msg;
    c.continues = true;
    return checkOpValid;
  }
  const behind = (r.epsn - (p.psn ?? r.epsn)) & 0xffffff;
  if ((p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC) && behind > 0 && behind <= DUPLICATE_WINDOW) {
    c.duplicate = true;
    c.msg = newMessage(p);
    return checkOpValid;
  }
  if (p.psn !== r.epsn || c.off !== 0)
    return { nak: 'psn', reason: `QP ${p.qpn} expects PSN ${r.epsn} to start a message, got PSN ${String(p.psn)} at byte ${c.off}` };
  c.msg = newMessage(p);
  return checkOpValid;
}

/** rxe's check_op_valid: the QP accepts the operation (qp_access_flags), its operands are well formed; an XRC target's SRQ. */
function checkOpValid(c: Check): Step | RcRefusal {
  const refused = opRefusal(c.p, c.qp);
  if (refused) return refused;
  return checkXrc;
}

/** XRC: a target QP takes requests of its XRC send QP only, each naming an XRC SRQ of its domain. */
function checkXrc(c: Check): Step | RcRefusal {
  const { t, p, qp } = c;
  c.take = qp.takesReceives && qp.xrcd === undefined ? () => qp.take(t) : undefined;
  if (qp.xrcd === undefined && p.srqn === undefined) return checkRkey;
  const srq = p.srqn === undefined ? undefined : xrcSrq(t, qp, p.srqn);
  if (!srq)
    return {
      nak: 'inv-req',
      reason:
        qp.xrcd !== undefined
          ? `XRC target QP ${p.qpn}'s domain has no XRC SRQ ${String(p.srqn)}`
          : `QP ${p.qpn} is no XRC target: the request names XRC SRQ ${String(p.srqn)}`,
    };
  c.take = () => qp.take(t, srq);
  return checkRkey;
}

/** An XRC target's XRC SRQ numbered `srqn`: in its domain, live, and in its PD (its buffers are checked there). */
function xrcSrq(t: RcTables, qp: RcQp, srqn: number): RcSrq | undefined {
  if (qp.xrcd === undefined) return undefined;
  const s = t.srqs.get(srqn);
  return s && !s.destroyed && s.xrcd === qp.xrcd && s.pd === qp.pd ? s : undefined;
}

/** The opcode against the QP's access flags, and its operands' alignment and size. */
function opRefusal(p: RcPacket, qp: RcQp): RcRefusal | undefined {
  const flags = qp.accessFlags;
  switch (p.opcode) {
    case RcOp.WRITE:
    case RcOp.WRITE_IMM:
      return flags & Access.REMOTE_WRITE ? undefined : { nak: 'access', reason: `QP ${p.qpn} does not accept RDMA WRITE (qp_access_flags)` };
    case RcOp.SEND:
    case RcOp.SEND_IMM:
      return undefined;
    case RcOp.READ_REQUEST:
      return flags & Access.REMOTE_READ ? undefined : { nak: 'access', reason: `QP ${p.qpn} does not accept RDMA READ (qp_access_flags)` };
    case RcOp.ATOMIC:
      if (p.va % 8n !== 0n) return { nak: 'inv-req', reason: `an atomic's address must be 8-byte aligned, got 0x${p.va.toString(16)}` };
      return flags & Access.REMOTE_ATOMIC ? undefined : { nak: 'access', reason: `QP ${p.qpn} does not accept atomics (qp_access_flags)` };
    case RcOp.ATOMIC_WRITE:
      // rxe_resp: QP and MR need REMOTE_WRITE; the word is 8-byte aligned and the payload its 8 bytes.
      if (p.va % 8n !== 0n) return { nak: 'inv-req', reason: `an ATOMIC WRITE's address must be 8-byte aligned, got 0x${p.va.toString(16)}` };
      if (spanOf(p).total !== 8) return { nak: 'inv-req', reason: `an ATOMIC WRITE carries 8 bytes, got ${spanOf(p).total}` };
      if (!(flags & Access.REMOTE_WRITE))
        return { nak: 'access', reason: `QP ${p.qpn} does not accept ATOMIC WRITE (qp_access_flags lacks REMOTE_WRITE)` };
      return undefined;
    case RcOp.FLUSH: {
      // rxe_resp's check_qp_attr_access and check_placement_type: the QP must allow each placement type asked for.
      const type = p.flush?.type ?? 0;
      const want = flushAccess(type);
      const name = type & 1 && !(flags & Access.FLUSH_GLOBAL) ? 'FLUSH_GLOBAL' : 'FLUSH_PERSISTENT';
      if (want === 0) return { nak: 'inv-req', reason: 'a FLUSH names no placement type' };
      return (flags & want) === want ? undefined : { nak: 'access', reason: `QP ${p.qpn} does not accept FLUSH with ${name} (qp_access_flags)` };
    }
    default:
      return { nak: 'inv-req', reason: `opcode ${String(p.opcode)} is not an RC opcode this responder knows` };
  }
}

/** The MR access a FLUSH's placement type bits ask for. */
function flushAccess(type: number): number {
  return (type & 1 ? Access.FLUSH_GLOBAL : 0) | (type & 2 ? Access.FLUSH_PERSISTENT : 0);
}

/** rxe's check_rkey (and check_length): a RETH-addressed packet's MR live, in the QP's PD, with the access, covering the span. */
function checkRkey(c: Check): Step | RcRefusal {
  const refused = rkeyRefusal(c.t, c.p, c.qp);
  if (refused) return refused;
  // A duplicate READ or atomic takes no resource: it is read again, or answered from the replay.
  return c.duplicate ? admitted : checkResource;
}

/** The rkey check of each RETH-addressed opcode; undefined if it passes (or the opcode names no memory). */
function rkeyRefusal(t: RcTables, p: RcPacket, qp: RcQp): RcRefusal | undefined {
  const rkey = (n: number, access: number, want: string, rest = n): RcRefusal | undefined =>
    p.key !== undefined && keyFor(t, qp, p.key, p.va, n, access, rest)
      ? undefined
      : { nak: 'access', reason: rkeyReason(t, qp, p.key, p.va, rest, want) };
  switch (p.opcode) {
    case RcOp.WRITE:
    case RcOp.WRITE_IMM:
      // A zero-length write names no memory (IB: its rkey is not checked). The rest of the
      // message must fit too (RETH's DMA length): a write past its MR lands nothing.
      return p.length === 0 ? undefined : rkey(p.length, Access.REMOTE_WRITE, 'REMOTE_WRITE', spanOf(p).rest);
    case RcOp.READ_REQUEST:
      return (p.dmaLength ?? 0) === 0 ? undefined : rkey(p.dmaLength!, Access.REMOTE_READ, 'REMOTE_READ');
    case RcOp.ATOMIC:
      return rkey(8, Access.REMOTE_ATOMIC, 'REMOTE_ATOMIC');
    case RcOp.ATOMIC_WRITE:
      return rkey(8, Access.REMOTE_WRITE, 'REMOTE_WRITE');
    case RcOp.FLUSH:
      return flushRkeyRefusal(t, p, qp);
    default:
      return undefined;
  }
}

/** A FLUSH's rkey: the MR must allow each placement type; selectivity MR flushes the whole MR (only the key is checked), a range must lie inside it. */
function flushRkeyRefusal(t: RcTables, p: RcPacket, qp: RcQp): RcRefusal | undefined {
  const type = p.flush?.type ?? 0;
  const want = flushAccess(type);
  const n = p.flush?.level === 1 ? 0 : (p.dmaLength ?? 0);
  if (p.key !== undefined && keyFor(t, qp, p.key, p.va, n, want)) return undefined;
  const mr = p.key === undefined ? undefined : t.mrs.get(p.key);
  const lacks = mr && mr.state === MrState.VALID && mr.pd.handle === qp.pd.handle && (mr.access & want) !== want;
  const flag = mr && type & 1 && !(mr.access & Access.FLUSH_GLOBAL) ? 'FLUSH_GLOBAL' : 'FLUSH_PERSISTENT';
  return { nak: 'access', reason: lacks ? `rkey ${hex(p.key!)}'s MR was registered without ${flag}` : rkeyReason(t, qp, p.key, p.va, n, flag) };
}

/**
 * rxe's check_resource: a SEND's first packet takes the receive at the head of rq (RNR NAK if
 * there is none; its buffers are checked: not in an MR of the QP's PD is REM_OP_ERR, too short
 * REM_INV_REQ_ERR, the receive completing in error and the QP going to ERR); a WRITE with
 * immediate's last packet needs one too.
 */
function checkResource(c: Check): Step | RcRefusal {
  const { p, qp, msg, take } = c;
  if (p.opcode === RcOp.SEND || p.opcode === RcOp.SEND_IMM) return msg!.wqe ? scatterSendRun : takeReceive;
  if (p.opcode === RcOp.WRITE_IMM && c.last) {
    // From a shared queue the receive is taken now, held by the message like a SEND's.
    if (take) msg!.wqe ??= take();
    if (!(take ? msg!.wqe : qp.rq.head())) return { nak: 'rnr', reason: `QP ${p.qpn} has no receive posted`, rnrTimer: qp.minRnrTimer };
  }
  return admitted;
}

/** A SEND's first packet: the receive it lands in, its buffers checked for the whole message. */
function takeReceive(c: Check): Step | RcRefusal {
  const { t, p, qp, take } = c;
  const wqe = take ? take() : qp.rq.head();
  if (!wqe) return { nak: 'rnr', reason: `QP ${p.qpn} has no receive posted`, rnrTimer: qp.minRnrTimer };
  const s = scatterSend(t, qp, wqe, 0, 0, c.total);
  if ('fail' in s) {
    if (!take) qp.rq.shift();
    qp.received(t, wqe, { status: s.fail, op: p.opcode as RcOp.SEND, byteLen: 0, srcQpn: p.srcQpn ?? 0, odp: emptyRcOdp() });
    qp.toError(t);
    return s.fail === 'prot'
      ? { nak: 'op', reason: `a buffer of QP ${p.qpn}'s receive is in no MR of its PD with LOCAL_WRITE` }
      : { nak: 'inv-req', reason: `a ${c.total}-byte SEND does not fit QP ${p.qpn}'s receive buffers` };
  }
  c.msg!.wqe = wqe;
  return scatterSendRun;
}

/** A SEND's packet: the receive buffers' spans its bytes land in. */
function scatterSendRun(c: Check): Step | RcRefusal {
  const s = scatterSend(c.t, c.qp, c.msg!.wqe!, c.off, c.p.length, 0);
  if ('fail' in s) return { nak: 'op', reason: `QP ${c.p.qpn}'s receive buffers went away mid-message` };
  c.spans = s.spans;
  return admitted;
}

/** The end of the chain: the packet admitted, a new message started (epsn moves on). */
function admitted(c: Check): RcAdmitted {
  const { p, qp, msg } = c;
  const spans = c.spans ?? (p.length > 0 ? [{ va: p.va, length: p.length, key: p.key! }] : []);
  if (c.duplicate) return { qp, msg: msg!, total: c.total, spans, last: c.last, duplicate: true };
  if (!c.continues && !isResponse(p.opcode)) {
    qp.resp.msg = msg;
    qp.resp.epsn = (qp.resp.epsn + 1) & 0xffffff;
  }
  return { qp, msg: msg!, total: c.total, spans, last: c.last };
}

/** A message's record from its first packet. */
function newMessage(p: RcPacket): RcMessage {
  return { psn: p.psn ?? 0, tid: p.tid, opcode: p.opcode, wqe: undefined, faults: 0, firstUs: p.issuedUs, firstMs: p.issuedMs };
}

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
  const wqe = qp.take(t);
  if (!wqe) return { nak: 'drop', reason: `UD QP ${p.qpn} has no receive posted` };
  const op = p.opcode as RcOp.UD_SEND;
  const s = scatterSend(t, qp, wqe, GRH_BYTES, p.length, GRH_BYTES + p.length);
  if ('fail' in s) {
    qp.received(t, wqe, { status: s.fail, op, byteLen: 0, srcQpn: p.srcQpn ?? 0, odp: emptyRcOdp() });
    if (s.fail === 'prot') qp.toError(t);
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
  return mr !== undefined && mr.state === MrState.VALID && !mr.pd.closed;
}

const hex = (n: number) => `0x${n.toString(16)}`;

/**
 * The MR `key` names, if it is this QP's to use for `access` over [va, va+length) (and, when
 * given, over the message's bytes from va on: RETH's DMA length), its span mapped.
 */
function keyFor(t: RcTables, qp: RcQp, key: number, va: bigint, length: number, access: number, rest = length): RcMr | undefined {
  const mr = t.mrs.get(key);
  if (!mr || mr.state !== MrState.VALID || mr.pd.closed || mr.pd.handle !== qp.pd.handle || (mr.access & access) !== access) return undefined;
  if (rest > length && !mrCovers(mr, va, rest)) return undefined;
  return mrPlace(mr, va, length) ? mr : undefined;
}

/** Where a packet's bytes sit in its message, the message's bytes, and what of it is left from this packet on. */
function spanOf(p: RcPacket): { off: number; total: number; rest: number } {
  const off = (p.msgOffset ?? 0) + p.seq * p.blockSize;
  const total = p.msgLength ?? off + p.lengthHint;
  return { off, total, rest: total - off };
}

/** Why an rkey check failed, in words: the first thing wrong with the key. */
function rkeyReason(t: RcTables, qp: RcQp, key: number | undefined, va: bigint, length: number, want: string): string {
  if (key === undefined) return 'the packet names no rkey';
  const mr = t.mrs.get(key);
  if (!mr || mr.state !== MrState.VALID) return `rkey ${hex(key)} names no live MR on this node`;
  if (mr.pd.handle !== qp.pd.handle) return `rkey ${hex(key)} belongs to another protection domain than QP ${qp.qpNum}'s`;
  if (!(mr.access & Access[want as keyof typeof Access])) return `rkey ${hex(key)}'s MR was registered without ${want}`;
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
    if (s.length > 0 && !keyFor(t, qp, s.lkey, s.addr, s.length, Access.LOCAL_WRITE)) return { fail: 'prot' };
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

/** @internal The responder of one node's PLDMA (see the top of this file). */
/** The opcodes whose message completes a receive WQE at the responder. */
const RECEIVING: ReadonlySet<RcOp> = new Set([RcOp.SEND, RcOp.SEND_IMM, RcOp.WRITE_IMM, RcOp.UD_SEND, RcOp.UD_SEND_IMM]);

export class Responder {
  #d: ResponderDeps;
  /** Copy-engine jobs in flight for packets this node received. */
  jobs = 0;
  /** Keyed by source node × 2^20 + channel: bounded by the fabric's nodes and channels. */
  #lanes = new Map<number, Lane>();
  /** The node's atomic unit (atomic.ts): one atomic at a time, its register and replay. */
  #atomics: AtomicUnit;

  constructor(deps: ResponderDeps) {
    this.#d = deps;
    this.#atomics = new AtomicUnit(deps.smmu, deps.engine);
  }

  /**
   * A write: its blocks admitted (key and QP) and translated, in order, up to the first
   * that cannot be written (a fault, a refusal); the ones before it copied by one copy-engine
   * job per piece contiguous at both ends. One ACK answers them: a verdict for the blocks
   * written, one for the block that stopped the write, and the range it did not get to.
   * Check (#place), execute (#translate, #execute), then acknowledge (#acknowledge).
   */
  async onWrite(p: WritePacket): Promise<void> {
    const lane = this.#lane(p);
    // The answer of the write before this one in the lane, if it has not gone out: no promise
    // (nor a turn of the microtask queue) for a write that has nothing ahead of it.
    const before = lane.open++ > 0 ? new Promise<void>((resolve) => lane.waiting.push(resolve)) : undefined;
    const stop = lane.stop;
    if (stop && stop.tid === p.tid && p.seq > stop.seq) {
      // Behind a write of this transfer that stopped: returned whole, as RC drops it.
      if (before) await before;
      this.#reply(p, [], { seq: p.seq, count: p.count });
      this.#answered(lane);
      return;
    }
    // The transfer goes on (that block again), or another one started on this channel.
    if (stop) lane.stop = undefined;
    this.#d.faults.sentAgain(p.src, p.tid, p.seq, 'destination', p.issuedUs[0]!, p.issuedMs);
    // Where the packet lands, checked once, here, against this node's own tables and SMMU.
    const dest = this.#place(p);
    if (!('refusal' in dest) && dest.rc && (p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC || p.opcode === RcOp.FLUSH))
      return this.#onRequest(p, dest as Placed & { rc: RcAdmitted }, lane, before);
    const run = this.#translate(p, dest);
    // Where this write stops is known now, before any copy: the channel's next write of this
    // transfer, already on its way, is returned instead of written.
    if (run.refused || run.written < p.count) lane.stop = { tid: p.tid, seq: run.refused ? run.refused.seq : p.seq + run.written };
    const out = await this.#execute(p, dest as Placed, run);
    if (out.stopped) {
      // A copy stopped at a block (a page went away under it): the same, found later.
      const seq = out.verdicts[out.verdicts.length - 1]!.seq;
      if (!lane.stop || lane.stop.tid !== p.tid || seq < lane.stop.seq) lane.stop = { tid: p.tid, seq };
    }
    const rc = 'rc' in dest ? dest.rc : undefined;
    if (rc) rc.msg.faults += out.faults.length;
    if (before) await before;
    await this.#acknowledge(p, lane, rc, out);
    this.#answered(lane);
  }

  // The lane of a write's source node and channel.
  #lane(p: WritePacket): Lane {
    const key = p.src * 2 ** 20 + p.channel;
    let lane = this.#lanes.get(key);
    if (!lane) this.#lanes.set(key, (lane = { open: 0, waiting: [], stop: undefined }));
    return lane;
  }

  // A READ, an atomic or a FLUSH: carried out here, its response (READ_RESPONSE, ATOMIC_ACK)
  // sent back on this node's engine; the response is the request's acknowledgement, so an ACK
  // goes only for a FLUSH, a refusal, a fault NACK, or a response that could not be sent.
  async #onRequest(p: WritePacket, dest: Placed & { rc: RcAdmitted }, lane: Lane, before: Promise<void> | undefined): Promise<void> {
    const out: { verdict: Verdict; fault?: HoldNack } | undefined =
      p.opcode === RcOp.READ_REQUEST ? this.#read(p, dest.rc) : p.opcode === RcOp.FLUSH ? this.#flush(p, dest) : await this.#queueAtomic(p, dest);
    if (dest.rc.qp.resp.msg === dest.rc.msg && out?.verdict.resp !== AckResp.FAULT) dest.rc.qp.resp.msg = undefined;
    if (out?.verdict.resp === AckResp.FAULT) lane.stop = { tid: p.tid, seq: p.seq };
    if (before) await before;
    if (out) {
      await this.#hold(out.verdict, out.fault);
      this.#answer(p, [out.verdict], undefined);
    } else this.#d.transport.placed?.(p);
    this.#answered(lane);
  }

  // Execute, part one: where the write's blocks land, translated up to the first that cannot
  // be written; the pieces to copy, and the verdict of the block that stopped it.
  #translate(p: WritePacket, dest: Placed | Refused): Translated {
    // Blocks that carry bytes: a source page missing when another process's transport read
    // the payload ends the run there (answered SOURCE_FAULT after the blocks before it).
    const carried = p.sourceFault ? p.sourceFault.seq - p.seq : p.count;
    const run: Translated = { carried, groups: [], written: 0, refused: undefined, refusedFault: undefined };
    if ('refusal' in dest && dest.refusal === AckResp.OK) {
      // A UD datagram dropped: answered as taken, as UD has no NAK.
      run.written = p.count;
    } else if ('refusal' in dest) {
      run.refused = { seq: p.seq, count: 1, resp: dest.refusal, walkUs: 0, reason: dest.reason };
      if (dest.rnrTimer !== undefined) run.refused.rnrTimer = dest.rnrTimer;
    } else if (dest.spans.length === 0) {
      // A zero-length message: nothing to translate or copy.
      run.written = carried;
    } else if (dest.spans.length > 1) {
      // A SEND's run across receive buffers: translated span by span, a fault stopping it at
      // the block it falls in.
      const r = this.#placeSpans(p, dest, carried, run.groups);
      run.written = r.written;
      run.refused = r.refused;
      run.refusedFault = r.fault;
    } else this.#translateRun(p, dest.ctx, dest.spans[0]!.va, run);
    return run;
  }

  // Per run, not per block: the blocks' destinations translated in one call per region (one in
  // all but at a region's end), with the same walks and IOTLB lookups as block by block. A
  // stall-mode block is written alone, under its own stall window.
  #translateRun(p: WritePacket, ctx: StreamContext, base: bigint, run: Translated): void {
    const { smmu, costs: c } = this.#d;
    const bs = p.blockSize;
    const groups = run.groups;
    const stallMode = ctx.faultModel === 'stall';
    const want = stallMode ? Math.min(run.carried, 1) : run.carried;
    const end = Math.min(p.length, want * bs);
    while (run.written < want) {
      const written = run.written;
      const va = base + BigInt(written * bs);
      let fault: Fault | undefined;
      let got = 0;
      if (stallMode) {
        const tr = smmu.translate(ctx.sid, va, end - written * bs, 'write');
        if (tr.ok) {
          groups.push({ at: written, count: 1, region: tr.region, offset: tr.offset, walks: [walkCost(c, tr)], va, length: end - written * bs });
          got = 1;
        } else fault = tr;
      } else {
        const batch = smmu.translateRun(ctx.sid, va, end - written * bs, bs, 'write');
        fault = batch.fault;
        got = batch.blocks;
        if (got) this.#joinPiece(groups, batch, written, va, end, bs);
      }
      run.written += got;
      if (fault) {
        const r = this.#fault(p, run.written, ctx.sid, fault, base);
        run.refused = r.verdict;
        run.refusedFault = r.fault;
        return;
      }
    }
  }

  // The blocks one translateRun call gave: a piece of their own, or joined to the previous one
  // where it continues it (a run translated block by block at a region's end): one copy.
  #joinPiece(groups: Group[], batch: RunSpans, written: number, va: bigint, end: number, bs: number): void {
    const c = this.#d.costs;
    const prev = groups[groups.length - 1];
    const joins = prev !== undefined && prev.region === batch.region && prev.offset + prev.count * bs === batch.offset;
    const g = joins ? prev : { at: written, count: 0, region: batch.region!, offset: batch.offset, walks: [], va, length: 0 };
    const spans = batch.spans;
    for (let i = 0; i < spans.length; i += 2) {
      const w = walkedCost(c, spans[i + 1]!);
      for (let n = spans[i]!; n > 0; n--) g.walks.push(w);
    }
    g.count += batch.blocks;
    g.length = Math.min(end, (g.at + g.count) * bs) - g.at * bs;
    if (!joins) groups.push(g);
  }

  // Execute, part two: the pieces copied in order (a copy that stops ends it), and the write's
  // verdicts: the blocks written, then the block that stopped it.
  async #execute(p: WritePacket, dest: Placed, run: Translated): Promise<Executed> {
    // A fault is recorded when its answer is due to go out (after the writes before it in
    // this lane), and the NACK waits for the fault library's answer, which it carries.
    const w: Executed = { p, dest, verdicts: [], faults: [], stopped: false };
    const { verdicts, faults } = w;
    const { groups, written, refused } = run;
    for (const g of groups) {
      const done = this.#write(w, g);
      if (!(done === true || (done !== false && (await done)))) {
        w.stopped = true;
        break;
      }
    }
    if (w.stopped) return w;
    // An empty message, or a SEND's run across receive buffers: one verdict for its blocks.
    const pieces = groups.length === 0 || groups[0]!.byteAt !== undefined;
    if (pieces && written > 0) verdicts.push({ seq: p.seq, count: written, resp: AckResp.OK, walkUs: groups.length ? groups[0]!.walks[0]! : 0 });
    if (refused) {
      verdicts.push(refused);
      if (run.refusedFault) faults.push(run.refusedFault);
    } else if (p.sourceFault && written === run.carried) {
      verdicts.push({ seq: p.sourceFault.seq, count: 1, resp: AckResp.SOURCE_FAULT, walkUs: 0, faultOffset: p.sourceFault.faultOffset });
    }
    return w;
  }

  // Acknowledge: the receive completes (every byte of its message in) before the ACK goes out;
  // a fault's NACK waits for its answer. A write of this transfer before this one that stopped
  // under its copy, after this one was translated, drops this one's answer (its bytes are
  // written again after that block).
  async #acknowledge(p: WritePacket, lane: Lane, rc: RcAdmitted | undefined, out: Executed): Promise<void> {
    const { verdicts, faults } = out;
    const last = verdicts[verdicts.length - 1];
    const done = last ? last.seq + last.count - p.seq : 0;
    const early = lane.stop;
    if (early && early.tid === p.tid && early.seq < p.seq) {
      if (rc) this.#notReceived(rc);
      this.#reply(p, [], { seq: p.seq, count: p.count });
      return;
    }
    if (rc && rc.last && done === p.count && last?.resp === AckResp.OK) this.#received(p, rc);
    else if (rc) this.#notReceived(rc);
    // A write stops at its first fault: it is the last verdict.
    for (const f of faults) await this.#hold(last!, f);
    this.#reply(p, verdicts, done < p.count ? { seq: p.seq + done, count: p.count - done } : undefined);
  }

  // A write's answer went out: the next in its lane goes on.
  #answered(lane: Lane): void {
    lane.open--;
    lane.waiting.shift()?.();
  }

  /**
   * Where a packet lands: an RC packet (one naming a QP) through its QP's checks on this
   * node's tables (rc.ts), translated in its QP's PD; the engine's own raw transfer (no QP)
   * in the PD the packet names, from a peer only while no verbs device drives this node.
   */
  #place(p: WritePacket): Placed | Refused {
    const { smmu, tables, node } = this.#d;
    if (p.opcode === undefined || p.qpn === undefined) {
      // The engine's raw transfer: its key and QP, if any, only tag its copies (for fences).
      if (tables.strict && p.src !== node)
        return { refusal: AckResp.ACCESS_ERR, reason: `node ${node} does not accept a write from node ${p.src} that names no QP` };
      const ctx = smmu.streamForPd(p.pd);
      if (!ctx) return { refusal: AckResp.PD_ERR, reason: `node ${node} has no stream for protection domain ${p.pd}` };
      return { ctx, spans: p.length > 0 ? [{ va: p.va, length: p.length, key: p.key }] : [] };
    }
    const a = admitRc(tables, {
      src: p.src,
      qpn: p.qpn,
      srcQpn: p.srcQpn,
      opcode: p.opcode,
      psn: p.psn,
      key: p.key,
      tid: p.tid,
      seq: p.seq,
      va: p.va,
      length: p.length,
      lengthHint: p.lengthHint,
      msgOffset: p.msgOffset,
      msgLength: p.msgLength,
      dmaLength: p.dmaLength,
      flush: p.flush,
      qkey: p.qkey,
      srqn: p.srqn,
      blockSize: p.blockSize,
      issuedUs: p.issuedUs[0]!,
      issuedMs: p.issuedMs,
    });
    if ('nak' in a) {
      const r: { refusal: AckResp; reason: string; rnrTimer?: number } = { refusal: NAK_RESP[a.nak], reason: a.reason };
      if (a.rnrTimer !== undefined) r.rnrTimer = a.rnrTimer;
      return r;
    }
    const ctx = smmu.streamForPd(a.qp.pd.handle);
    if (!ctx) return { refusal: AckResp.PD_ERR, reason: `node ${node} has no stream for protection domain ${a.qp.pd.handle}` };
    return { ctx, spans: a.spans, rc: a };
  }

  // An RDMA READ (or one asked again: a duplicate is read again, as RC allows): the bytes read
  // from this node's memory go back as READ responses, one transfer per sink of the
  // requester's, on this node's engine, in the QP's PD. A source fault holds a response until
  // this node's fault library answered (the engine's park). An empty READ is answered by an ACK.
  #read(p: WritePacket, a: RcAdmitted): { verdict: Verdict } | undefined {
    const sinks = p.sinks ?? [];
    const n = p.dmaLength ?? 0;
    let room = 0;
    for (const s of sinks) room += s.length;
    if (room !== n) return { verdict: this.#nak(p, AckResp.INV_REQ, `a ${n}-byte READ names ${room} bytes of sinks`) };
    if (n === 0) return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: 0 } };
    // Asked again: a page may have gone since it was read (its copy found it missing), so the
    // range is walked afresh, not taken from the IOTLB: the fault is this node's SMMU's then.
    // From the 2 MiB boundary below: a huge page's entry is keyed at its base.
    if (a.duplicate) {
      const below = Number(p.va % HUGE_PAGE);
      this.#d.smmu.iotlb.invalidateRange(p.va - BigInt(below), below + n, PAGE);
    }
    let off = 0;
    const posts: Array<Promise<DmaCompletion>> = [];
    for (const s of sinks) {
      if (s.length > 0) posts.push(this.#d.post(this.#answerDesc(p, a, p.va + BigInt(off), s)));
      off += s.length;
    }
    this.#failed(p, posts);
    return undefined;
  }

  // A response that could not be sent (its source unresolved, past its retry limit, its QP
  // destroyed): the request's NAK says how it ended and what it took.
  #failed(p: WritePacket, posts: Array<Promise<DmaCompletion>>): void {
    void Promise.all(posts).then((results) => {
      if (results.some((r) => r.status !== DmaStatus.SUCCESS)) this.#answer(p, [this.#outcome(p, results)], undefined);
    });
  }

  // The descriptor of a response's bytes: from this node's `from` to the requester's sink.
  #answerDesc(p: WritePacket, a: RcAdmitted, from: bigint, sink: { addr: bigint; length: number; lkey: number }): DmaDescriptor {
    const d: DmaDescriptor = {
      // Answers run on channels of their own (channels … 2×channels-1): never queued behind
      // the QP's own requests, which may be waiting for the peer's answers in turn.
      channel: this.#d.channels + (a.qp.qpNum % this.#d.channels),
      srcVa: from,
      dstNode: p.src,
      dstVa: sink.addr,
      length: sink.length,
      pd: a.qp.pd.handle,
      key: sink.lkey,
      dstQp: p.srcQpn!,
      srcQp: a.qp.qpNum,
      opcode: p.opcode === RcOp.ATOMIC ? RcOp.ATOMIC_ACK : RcOp.READ_RESPONSE,
      psn: p.psn!,
    };
    return d;
  }

  // The request's NAK from how its response's transfers ended: the first failure, carried whole
  // (status and side) with what they took, so the requester's completion says what happened.
  #outcome(p: WritePacket, results: DmaCompletion[]): Verdict {
    const answered = { faults: { source: 0, destination: 0 }, retransmittedBlocks: 0, majorFaults: 0 };
    for (const r of results) {
      answered.faults.source += r.faults.source;
      answered.faults.destination += r.faults.destination;
      answered.retransmittedBlocks += r.retransmittedBlocks;
      answered.majorFaults += r.pagesFetched;
    }
    const bad = results.find((r) => r.status !== DmaStatus.SUCCESS)!;
    const v: Verdict = {
      seq: p.seq,
      count: 1,
      resp: AckResp.ANSWER_ERR,
      walkUs: 0,
      answered,
      answer: { status: bad.status, side: bad.side ?? 'source' },
    };
    if (bad.reason) v.reason = bad.reason;
    return v;
  }

  // An RDMA FLUSH (global visibility): the channel's writes before it were answered first and
  // their copies are done, so they are visible already; what is left is rxe_odp's part, the
  // range's pages mapped for the device: a missing one is the fault NACK, and the FLUSH is sent
  // again once it is resolved. (Persistence is refused at registration: no memory here is.)
  #flush(p: WritePacket, dest: Placed): { verdict: Verdict; fault?: HoldNack } {
    const n = p.flush!.level === 0 ? (p.dmaLength ?? 0) : 0;
    if (n === 0) return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: 0 } };
    const tr = this.#d.smmu.translate(dest.ctx.sid, p.va, n, 'read');
    if (!tr.ok) return this.#fault(p, 0, dest.ctx.sid, tr, p.va);
    return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: walkCost(this.#d.costs, tr) } };
  }

  #nak(p: WritePacket, resp: AckResp, reason: string): Verdict {
    return { seq: p.seq, count: 1, resp, walkUs: 0, reason };
  }

  // An atomic request. A duplicate (its requester asks again: a fault at its sink) is answered
  // from the QP's replay, never executed again (rxe's responder resources). A new one's word is
  // translated on this node's SMMU first: a missing page is resolved by this node's fault unit
  // and the atomic waits for it (the response holds, as a write's fault NACK does), or goes back
  // as the fault NACK if no answer came within the fault timeout. Then the atomic unit, one
  // atomic at a time on this node, executes it.
  async #queueAtomic(p: WritePacket, dest: Placed & { rc: RcAdmitted }): Promise<{ verdict: Verdict; fault?: HoldNack } | undefined> {
    const a = dest.rc;
    const sink = p.sinks?.[0];
    if (!sink || sink.length !== 8 || p.sinks!.length !== 1)
      return { verdict: this.#nak(p, AckResp.INV_REQ, 'an atomic answers into one 8-byte sink') };
    if (a.duplicate) {
      const from = this.#atomics.replayed(a.qp.qpNum, p.psn!, dest.ctx);
      if (from === undefined)
        return { verdict: this.#nak(p, AckResp.DROPPED, `QP ${a.qp.qpNum} keeps no atomic of PSN ${String(p.psn)} to answer again`) };
      this.#failed(p, [this.#d.post(this.#answerDesc(p, a, from, sink))]);
      return undefined;
    }
    let faults = 0;
    const tr = this.#d.smmu.translate(dest.ctx.sid, p.va, 8, 'write');
    if (!tr.ok) {
      const nack = this.#fault(p, 0, dest.ctx.sid, tr, p.va, false);
      if (!nack.fault) return nack;
      const answer = await nack.fault();
      if (!answer?.ok) {
        // No answer in time: the NACK goes without one (the requester asks again at once); or the library could not.
        this.#d.counters.nacksSent++;
        if (answer) nack.verdict.resp = AckResp.UNRESOLVED;
        return { verdict: nack.verdict };
      }
      faults = 1;
    }
    return this.#atomics.serial(() => this.#atomic(p, dest, faults));
  }

  // An atomic on the 8-byte word at p.va, in the atomic unit: the word's original value read
  // into a word of the unit's register, the new value written, and the original value sent to
  // the requester's sink as the ATOMIC_ACK (done when sent: its requester asks again if it
  // cannot place it, and the replay answers). A page gone since it was translated is the fault
  // NACK (the requester asks again).
  async #atomic(p: WritePacket, dest: Placed & { rc: RcAdmitted }, faults: number): Promise<{ verdict: Verdict; fault?: HoldNack } | undefined> {
    const { smmu } = this.#d;
    const a = dest.rc;
    // The QP went away while the atomic waited for the unit: nothing is read or written.
    if (!stillAdmitted(this.#d.tables, a, p.key))
      return { verdict: this.#nak(p, AckResp.DROPPED, `QP ${a.qp.qpNum} went away before its atomic ran`) };
    const tr = smmu.translate(dest.ctx.sid, p.va, 8, 'write');
    if (!tr.ok) return this.#fault(p, 0, dest.ctx.sid, tr, p.va);
    const tag = nodeTag(this.#d.node, { qp: a.qp.qpNum, ...(p.key !== undefined ? { key: p.key } : {}) });
    const done = await this.#atomics.execute(tr.region, tr.offset, p.atomic!, dest.ctx, tag, a.qp.qpNum, p.psn!);
    if (done.status === 'source-fault') {
      const evicted = this.#d.faults.evicted(p.va, tr.region.pageSize, "the atomic's word was evicted before it was read");
      return this.#fault(p, 0, dest.ctx.sid, evicted, p.va);
    }
    if (done.status === 'read-failed') return { verdict: this.#nak(p, AckResp.OP_ERR, 'the atomic unit could not read the word') };
    if (done.status === 'write-failed')
      return { verdict: this.#nak(p, AckResp.OP_ERR, "the atomic's word went away before its new value was written") };
    const d = this.#answerDesc(p, a, done.address, p.sinks![0]!);
    if (faults) d.srcFaults = faults;
    this.#failed(p, [this.#d.post(d)]);
    return undefined;
  }

  /** QP `qp` of this node was destroyed (its responses' copies fenced): its replay goes. */
  forget(qp: number): void {
    this.#atomics.forget(qp);
  }

  /** The atomic register goes with the engine. */
  close(): void {
    this.#atomics.close();
  }

  // A SEND's run over several receive buffers: each span translated whole (a fault stops the
  // run at the block the span starts in: the blocks before it are written in full).
  #placeSpans(p: WritePacket, dest: Placed, carried: number, groups: Group[]): { written: number; refused?: Verdict; fault?: HoldNack } {
    const { smmu, costs: c } = this.#d;
    const bs = p.blockSize;
    const end = Math.min(p.length, carried * bs);
    let at = 0;
    for (const s of dest.spans) {
      if (at >= end) break;
      const length = Math.min(s.length, end - at);
      const tr = smmu.translate(dest.ctx.sid, s.va, length, 'write');
      const block = Math.floor(at / bs);
      if (!tr.ok) {
        const r = this.#fault(p, block, dest.ctx.sid, tr, s.va - BigInt(at - block * bs));
        return { written: block, refused: r.verdict, fault: r.fault };
      }
      groups.push({
        at: block,
        count: Math.ceil((at + length) / bs) - block,
        region: tr.region,
        offset: tr.offset,
        walks: [walkCost(c, tr)],
        va: s.va,
        length,
        byteAt: at,
      });
      at += length;
    }
    return { written: carried };
  }

  // A fault NACK's verdict waits for its fault library's answer, then carries it (or, past the
  // fault timeout, goes without one).
  async #hold(v: Verdict, fault: HoldNack | undefined): Promise<void> {
    if (!fault) return;
    const a = await fault();
    if (!a) return;
    if (a.ok) v.resolved = { atUs: a.atUs, fetched: a.fetched, heldUs: a.heldUs };
    else v.resp = AckResp.UNRESOLVED;
  }

  // A fault at block `i` of the packet (its bytes landing from `base` on): the NACK's verdict,
  // and how to record the fault and wait for its answer; an access this node refuses is an error.
  #fault(
    p: WritePacket,
    i: number,
    sid: number,
    fault: Extract<Translation, { ok: false }>,
    base: bigint,
    nack = true,
  ): { verdict: Verdict; fault?: HoldNack } {
    const seq = p.seq + i;
    const walkUs = walkCost(this.#d.costs, fault);
    if (fault.recoverable) {
      const at = p.arrivals[i]! + walkUs;
      return { verdict: { seq, count: 1, resp: AckResp.FAULT, walkUs }, fault: () => this.#d.faults.destination(p, i, sid, fault, at, base, nack) };
    }
    // F_PERMISSION or F_ADDR_SIZE: the stream was found above, in this same turn.
    const resp = this.#d.faults.refused(sid, fault, 'write') === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : AckResp.ADDR_ERR;
    return { verdict: { seq, count: 1, resp, walkUs, reason: fault.reason } };
  }

  // The last packet of a SEND or a WRITE with immediate landed: its receive completes.
  #received(p: WritePacket, a: RcAdmitted): void {
    const { qp, msg } = a;
    // A response is the requester's own: no message of this QP's responder.
    if (isResponse(p.opcode)) return;
    if (qp.resp.msg === msg) qp.resp.msg = undefined;
    // Only a SEND or a WRITE with immediate takes a receive: never a WRITE or an ATOMIC WRITE.
    if (!RECEIVING.has(p.opcode!)) return;
    const wqe = msg.wqe ?? qp.rq.head();
    // The QP went to ERR (its receives flushed) while the bytes landed: nothing to complete.
    // A receive taken off a shared queue is the message's alone; ERR flushed it too, or for
    // a UD datagram (no message kept between packets) its QP flushes it when given back.
    const taken = qp.takesReceives;
    if (wqe && taken && !qp.receiving) this.#notReceived(a);
    if (!wqe || (taken ? !qp.receiving : qp.rq.head() !== wqe)) return;
    if (!taken) qp.rq.shift();
    const total = a.total;
    const r: RcReceived = {
      status: 'ok',
      op: p.opcode as RcReceived['op'],
      // A UD receive counts the GRH space at its head.
      byteLen: qp.qkey === undefined ? total : total + GRH_BYTES,
      srcQpn: p.srcQpn ?? 0,
      odp: {
        faults: { source: p.srcFaults ?? 0, destination: msg.faults },
        majorFaults: 0,
        retransmittedBlocks: msg.faults,
        modelUs: p.arrivals[p.count - 1]! - msg.firstUs,
        realUs: (performance.now() - msg.firstMs) * 1000,
      },
    };
    if (p.immData !== undefined) r.immData = p.immData;
    if (p.solicited) r.solicited = true;
    qp.received(this.#d.tables, wqe, r);
  }

  // A UD datagram that did not land (a fault: it is sent again) gives back the receive it took.
  #notReceived(a: RcAdmitted): void {
    if (a.qp.qkey !== undefined && a.msg.wqe) a.qp.giveBack(a.msg.wqe);
  }

  // The answer to a packet: an ACK; for a response (nothing ACKs it), what landed of it goes
  // to this node's completer, and its bytes' staging (between processes) is free again.
  #reply(p: WritePacket, verdicts: Verdict[], returned: { seq: number; count: number } | undefined): void {
    if (!isResponse(p.opcode)) return this.#answer(p, verdicts, returned);
    this.#d.transport.placed?.(p);
    this.#d.responded(p, verdicts);
  }

  #answer(p: WritePacket, verdicts: Verdict[], returned: { seq: number; count: number } | undefined): void {
    const ack: AckPacket = {
      type: 'ack',
      src: this.#d.node,
      dst: p.src,
      pd: p.pd,
      va: p.va,
      tid: p.tid,
      seq: p.seq,
      length: p.length,
      // The envelope says what the verdicts say: OK, or why the write stopped (the last verdict).
      resp: verdicts.length ? verdicts[verdicts.length - 1]!.resp : AckResp.OK,
      arrivesAt: p.arrivals[p.count - 1]! + this.#d.costs.linkLatencyUs,
      verdicts,
    };
    if (returned) ack.returned = returned;
    try {
      this.#d.transport.deliver(ack);
    } catch {
      // An answer the transport refuses (its peer gone) is lost as on a link: the requester's
      // own timers end what waited for it. Counted, never thrown into the caller's microtask.
      this.#d.counters.packetsRefused++;
    }
  }

  // One copy-engine job for a group of blocks contiguous at both ends; verdicts for the
  // blocks it settles. False if it stopped at one (the blocks after it are returned).
  // An inline copy that settles at once is answered here, without a promise; any other waits
  // for its copy-engine job.
  #write(w: Executed, g: Group): boolean | Promise<boolean> {
    const { smmu } = this.#d;
    const { p, dest, verdicts } = w;
    const sid = dest.ctx.sid;
    const stall = dest.ctx.faultModel === 'stall';
    const seq = p.seq + g.at;
    const srcOffset = sourceOffset(p, g);
    const length = g.length;
    const va = g.va;
    const key = this.#spanKey(dest, g);
    // Nothing starts once the source cancelled the transfer, or (for a group after the
    // first, copied a turn later) once this node's QP or key no longer takes it.
    const refusal = revoked(p.payload)
      ? `node ${p.src} cancelled transfer ${p.tid} (its QP was destroyed)`
      : g.at > 0 && dest.rc && !stillAdmitted(this.#d.tables, dest.rc, key)
        ? `node ${this.#d.node} no longer accepts key 0x${(key ?? 0).toString(16)} for QP ${p.qpn}`
        : undefined;
    // A piece of a SEND's run across receive buffers: its blocks are answered once the run is
    // (the caller's one verdict), or, where it stops, the blocks before the one it starts in.
    const piece = g.byteAt !== undefined;
    if (piece && (revoked(p.payload) || refusal) && g.at > 0) verdicts.push({ seq: p.seq, count: g.at, resp: AckResp.OK, walkUs: 0 });
    if (refusal) {
      verdicts.push({ seq, count: 1, resp: revoked(p.payload) ? AckResp.FLUSHED : AckResp.ACCESS_ERR, walkUs: g.walks[0]!, reason: refusal });
      return false;
    }
    const window = stall
      ? smmu.beginStallWindow({
          sid,
          region: g.region,
          offset: g.offset,
          length,
          access: 'write',
          tag: this.#d.faults.destinationInfo(p, g.at, sid, va, p.arrivals[g.at]!, dest.spans[0]!.va),
        })
      : undefined;
    // Terminate-mode sides are walked again by the copy thread right before copying (a page
    // evicted meanwhile is a fault, not silent zeros); stall-mode sides fault for real. With
    // both sides terminate-mode, a small copy may run inline if every page is present.
    let flags = (p.sourceStall ? 0 : CopyFlag.CheckSource) | (window ? 0 : CopyFlag.CheckDest) | (p.sourceStall || window ? 0 : CopyFlag.Inline);
    let now: CopyResult | null | undefined;
    try {
      now = this.#d.engine.copyNow(p.payload.region, srcOffset, g.region, g.offset, length, flags);
    } catch {
      if (window) smmu.endStallWindow(window);
      return this.#copied(w, g, window, undefined);
    }
    if (now) return this.#copied(w, g, window, now);
    // A page of either side not present: a thread's job walks it (not inline again).
    if (now === null) flags &= ~CopyFlag.Inline;
    return this.#job(w, g, window, key, flags);
  }

  // A group's copy-engine job, then its verdicts.
  async #job(w: Executed, g: Group, window: StallWindow | undefined, key: number | undefined, flags: number): Promise<boolean> {
    const p = w.p;
    this.jobs++;
    let r: CopyResult | undefined;
    try {
      const tag: CopyTag = {};
      if (key !== undefined) tag.key = key;
      if (p.qpn !== undefined) tag.qp = p.qpn;
      r = await this.#d.engine.copy(p.payload.region, sourceOffset(p, g), g.region, g.offset, g.length, flags, nodeTag(this.#d.node, tag));
    } catch {
      r = undefined;
    } finally {
      this.jobs--;
      if (window) this.#d.smmu.endStallWindow(window);
    }
    return this.#copied(w, g, window, r);
  }

  // The verdicts of a group whose copy ended with `r` (undefined: the engine refused it).
  #copied(w: Executed, g: Group, window: StallWindow | undefined, r: CopyResult | undefined): boolean {
    const { p, dest, verdicts, faults } = w;
    const sid = dest.ctx.sid;
    const seq = p.seq + g.at;
    const srcOffset = sourceOffset(p, g);
    const bs = p.blockSize;
    const piece = g.byteAt !== undefined;
    const status = r ? r.status : (-1 as CopyStatus);
    const faultOffset = r ? r.faultOffset : -1;
    const stalls = window?.stalls ?? 0;
    this.#d.counters.faults.destination += stalls;
    if (piece && status !== CopyStatus.Ok && g.at > 0) verdicts.push({ seq: p.seq, count: g.at, resp: AckResp.OK, walkUs: 0 });
    if (window?.aborted) {
      verdicts.push({ seq, count: 1, resp: AckResp.ABORTED, walkUs: g.walks[0]!, stalls });
      return false;
    }
    if (status === CopyStatus.Ok) {
      if (!piece) verdicts.push(this.#written(seq, g.count, g, stalls, r));
      return true;
    }
    // The copy stopped at the first page it found missing: the blocks before it were written.
    const k = piece
      ? 0
      : status === CopyStatus.SourceFault || status === CopyStatus.DestFault
        ? Math.min(g.count - 1, Math.max(0, Math.floor((faultOffset - (status === CopyStatus.SourceFault ? srcOffset : g.offset)) / bs)))
        : 0;
    if (k > 0) verdicts.push(this.#written(seq, k, g, stalls, r));
    const walkUs = g.walks[k]!;
    const stopSeq = seq + k;
    switch (status) {
      case CopyStatus.SourceFault:
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.SOURCE_FAULT, walkUs, faultOffset, stalls });
        break;
      case CopyStatus.DestFault: {
        const region = g.region;
        const addr = region.address + BigInt(faultOffset);
        const evicted = this.#d.faults.evicted(addr, region.pageSize, 'destination page evicted before the write');
        faults.push(() => this.#d.faults.destination(p, g.at + k, sid, evicted, p.arrivals[g.at + k]!, dest.spans[0]!.va));
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.FAULT, walkUs, late: true, stalls });
        break;
      }
      case CopyStatus.Cancelled:
        // Fenced while queued: the key or QP it was written for went away.
        verdicts.push({
          seq: stopSeq,
          count: 1,
          resp: AckResp.ACCESS_ERR,
          walkUs,
          reason: `node ${this.#d.node} revoked key 0x${(p.key ?? 0).toString(16)} / QP ${p.qpn} before the write`,
        });
        break;
      default:
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.FLUSHED, walkUs, reason: 'the copy engine was closed' });
    }
    return false;
  }

  // The key of the span a group lands in (a SEND's receive buffer, the RETH's rkey).
  #spanKey(dest: Placed, g: Group): number | undefined {
    if (dest.spans.length === 1) return dest.spans[0]!.key;
    const at = g.byteAt ?? 0;
    let o = 0;
    for (const s of dest.spans) {
      if (at < o + s.length) return s.key;
      o += s.length;
    }
    return undefined;
  }

  // The verdict for the first `count` blocks of a group, written: one walk figure if they
  // all took the same, else one per block.
  #written(seq: number, count: number, g: Group, stalls: number, copy: CopyResult | undefined): Verdict {
    const w0 = g.walks[0]!;
    let same = true;
    for (let j = 1; j < count && same; j++) same = g.walks[j] === w0;
    const v: Verdict = { seq, count, resp: AckResp.OK, walkUs: w0, stalls };
    if (!same) v.walks = Float64Array.from(g.walks.slice(0, count));
    if (copy) {
      v.copyThread = copy.tid;
      v.copyNs = copy.ns;
    }
    return v;
  }
}
