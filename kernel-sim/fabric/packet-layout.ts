// The byte layout of the engine's packets, in one place (as rxe_hdr.h is for rdma_rxe): the
// write packet (BTH-like header, RETH, ImmDt, XRCETH, DETH, the verbs' SGEs, then the payload)
// and the ACK packet (AETH-like verdicts). Every frame starts with an opcode byte and a flags
// byte; the fields that follow are fixed by the opcode and the flags, big-endian as on an IB
// wire. An unknown flag is refused. `checkPacket` applies the same field checks to a packet
// object, so the in-process fabric hands over packets that obey the layout's ranges too.
import { AckResp, type AckPacket, type Packet, RcOp, type Verdict, type WritePacket } from './packets.js';
import type { MemoryLike } from '../memory.js';
import {
  addr,
  bad,
  bool,
  finite,
  flags,
  frameWriter,
  int,
  naming,
  node,
  Op,
  type Reader,
  size,
  SPACE,
  text,
  times,
  u32,
  U64,
  WIRE_MAX_BLOCKS,
  WireError,
  type Writer,
} from './wire-codec.js';

/** Block sizes: a multiple of the page size up to 1 GiB (SystemOptions.blockSize's range). */
const MIN_BLOCK = 4096;
const MAX_BLOCK = 1 << 30;
/** Verdicts one ACK may carry: one per group of blocks written and one for where it stopped. */
const MAX_VERDICTS = WIRE_MAX_BLOCKS + 2;
/** The opcode byte's bit that says an XRCETH (the XRC SRQ number) follows. */
const XRC_BIT = 0x80;
/** The opcode byte's bit for BTH's SE (solicited event), as IB's BTH carries it. */
const SE_BIT = 0x40;
/** The operations whose message takes a receive (and so may ask for a solicited event). */
const RECEIVE_OPS: ReadonlySet<RcOp> = new Set([RcOp.SEND, RcOp.SEND_IMM, RcOp.WRITE_IMM, RcOp.UD_SEND, RcOp.UD_SEND_IMM]);
/** The largest UD message: IBV_MTU_4096. */
const UD_MAX_BYTES = 4096;
/** Scatter/gather entries one verbs header may carry (the QPs' max_sge). */
const MAX_SGE = 32;
/** Bytes of a reason string, of an exchange string, and the exchange value's shape limits. */
export const MAX_REASON = 1024;
/** The highest AckResp and WcStatus (ibv_wc_status' TM_RNDV_INCOMPLETE) a frame may carry. */
const MAX_ACK_RESP = AckResp.ANSWER_ERR;
/** An ACK's resp: one AckResp names (5 was the separate RESOLVED answer, gone). */
function ackResp(field: string, v: unknown): AckResp {
  int(field, v, 0, MAX_ACK_RESP);
  if (AckResp[v as AckResp] === undefined) bad(field, 'an AckResp', v);
  return v as AckResp;
}

/** The header every engine packet has: where it goes, the transfer and block, the span. */
function checkHeader(p: Packet & { type: 'write' | 'ack' }): void {
  node('src', p.src);
  node('dst', p.dst);
  u32('pd', p.pd);
  const va = addr('va', p.va);
  u32('tid', p.tid);
  u32('seq', p.seq);
  const length = u32('length', p.length);
  if (va + BigInt(length) > SPACE) bad('va + length', 'within the 64-bit address space', va + BigInt(length));
  finite('arrivesAt', p.arrivesAt);
}

function checkWrite(p: WritePacket, each = false): void {
  checkHeader(p);
  int('channel', p.channel, 0, 0xffff);
  const count = int('count', p.count, 1, WIRE_MAX_BLOCKS);
  const bs = int('blockSize', p.blockSize, MIN_BLOCK, MAX_BLOCK);
  if (bs % MIN_BLOCK !== 0) bad('blockSize', `a multiple of ${MIN_BLOCK}`, bs);
  // A run's last block may be short, its others are whole; an empty RC message is one block of none.
  const empty = p.length === 0 && count === 1 && p.opcode !== undefined;
  if (!empty && (p.length <= (count - 1) * bs || p.length > count * bs))
    bad('length', `in ${(count - 1) * bs + 1}..${count * bs} for ${count} blocks of ${bs}`, p.length);
  size('lengthHint', p.lengthHint);
  times('issuedUs', p.issuedUs, count, each);
  times('arrivals', p.arrivals, count, each);
  finite('issuedMs', p.issuedMs);
  bool('sourceStall', p.sourceStall);
  if (p.key !== undefined) u32('key', p.key);
  if (p.qpn !== undefined) int('qpn', p.qpn, 0, 0xffffff);
  if (p.opcode !== undefined) checkRcHeaders(p as WritePacket & { opcode: RcOp }, count, bs);
  else if (
    p.srcQpn !== undefined ||
    p.psn !== undefined ||
    p.immData !== undefined ||
    p.solicited !== undefined ||
    p.msgOffset !== undefined ||
    p.srqn !== undefined ||
    p.qkey !== undefined ||
    p.flush !== undefined
  ) {
    bad('opcode', 'present with the RC fields', undefined);
  }
  if (p.sourceFault !== undefined) {
    int('sourceFault.seq', p.sourceFault.seq, p.seq, p.seq + count - 1);
    size('sourceFault.faultOffset', p.sourceFault.faultOffset);
  }
}

// An RC packet's headers: BTH (opcode, destination QP, PSN), the sending QP, ImmDt, its place
// in its message, and each opcode's own (RETH, AtomicETH, FETH, DETH, XRCETH).
function checkRcHeaders(p: WritePacket & { opcode: RcOp }, count: number, bs: number): void {
  // An RC packet: BTH (opcode, destination QP, PSN), the sending QP, ImmDt, its place in its message.
  int('opcode', p.opcode, RcOp.WRITE, RcOp.ATOMIC_ACK);
  if (p.qpn === undefined) bad('qpn', 'present in an RC packet', undefined);
  int('srcQpn', p.srcQpn, 0, 0xffffff);
  int('psn', p.psn, 0, 0xffffff);
  if (p.immData !== undefined) u32('immData', p.immData);
  if (p.solicited !== undefined) {
    bool('solicited', p.solicited);
    if (p.solicited && !RECEIVE_OPS.has(p.opcode)) bad('solicited', 'only on an operation that takes a receive', p.opcode);
  }
  if (p.srcFaults !== undefined) u32('srcFaults', p.srcFaults);
  if ((p.msgOffset === undefined) !== (p.msgLength === undefined)) bad('msgOffset', 'given with msgLength', p.msgOffset);
  if (p.msgOffset !== undefined) {
    const total = size('msgLength', p.msgLength);
    if (size('msgOffset', p.msgOffset) + p.seq * bs + p.length > total)
      bad('msgOffset + seq × blockSize + length', `at most msgLength (${total})`, p.msgOffset);
  }
  const request = p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC;
  if (request) {
    // A request carries no payload: RETH / AtomicETH and where the answer lands.
    if (p.length !== 0) bad('length', `0 in a ${RcOp[p.opcode]} request`, p.length);
    checkSges('sinks', p.sinks);
    if (p.opcode === RcOp.READ_REQUEST) int('dmaLength', p.dmaLength, 0, 2 ** 31);
    else {
      if (p.atomic === undefined) bad('atomic', 'present in an ATOMIC request', undefined);
      bool('atomic.fetchAdd', p.atomic.fetchAdd);
      addr('atomic.compareAdd', p.atomic.compareAdd);
      addr('atomic.swap', p.atomic.swap);
    }
  } else if (p.opcode === RcOp.FLUSH) {
    // FLUSH: RETH's range and FETH; no payload, no answer but the ACK.
    if (p.length !== 0) bad('length', '0 in a FLUSH request', p.length);
    int('dmaLength', p.dmaLength, 0, 2 ** 31);
    if (p.flush === undefined) bad('flush', 'present in a FLUSH request', undefined);
    int('flush.type', p.flush.type, 1, 3);
    int('flush.level', p.flush.level, 0, 1);
    if (p.sinks !== undefined || p.atomic !== undefined) bad('opcode', 'READ_REQUEST or ATOMIC with sinks or atomic', p.opcode);
  } else if (p.sinks !== undefined || p.dmaLength !== undefined || p.atomic !== undefined) {
    bad('opcode', 'READ_REQUEST or ATOMIC with sinks, dmaLength or atomic', p.opcode);
  }
  if (p.opcode !== RcOp.FLUSH && p.flush !== undefined) bad('opcode', 'FLUSH with flush', p.opcode);
  // UD SEND: DETH's Q_Key, and the whole message in one block of at most the largest MTU.
  const ud = p.opcode === RcOp.UD_SEND || p.opcode === RcOp.UD_SEND_IMM;
  if (ud) {
    u32('qkey', p.qkey);
    if (count !== 1 || p.seq !== 0 || p.length > UD_MAX_BYTES || p.msgOffset !== undefined)
      bad('length', `a UD message of at most ${UD_MAX_BYTES} bytes in one block`, p.length);
  } else if (p.qkey !== undefined) bad('opcode', 'UD_SEND or UD_SEND_IMM with qkey', p.opcode);
  // XRCETH: an XRC send QP's request names the target's XRC SRQ (never an answer, never UD).
  if (p.srqn !== undefined) {
    int('srqn', p.srqn, 0, 0xffffff);
    if (ud || p.opcode === RcOp.READ_RESPONSE || p.opcode === RcOp.ATOMIC_ACK) bad('opcode', 'an RC request with srqn', p.opcode);
  }
  // ATOMIC WRITE: the 8 new bytes of one word; ATOMIC ACKNOWLEDGE: AtomicAckETH, the word's 8 old bytes; one block each.
  if ((p.opcode === RcOp.ATOMIC_WRITE || p.opcode === RcOp.ATOMIC_ACK) && (p.length !== 8 || p.seq !== 0 || p.msgOffset !== undefined))
    bad('length', `8 in an ${RcOp[p.opcode]}, one block`, p.length);
}

function checkVerdict(i: number, v: Verdict, each: boolean): void {
  naming(i);
  u32('seq', v.seq);
  const count = int('count', v.count, 1, WIRE_MAX_BLOCKS);
  ackResp('resp', v.resp);
  finite('walkUs', v.walkUs);
  if (v.walks !== undefined) times('walks', v.walks, count, each);
  if (v.late !== undefined) bool('late', v.late);
  if (v.reason !== undefined) text('reason', v.reason, MAX_REASON);
  if (v.faultOffset !== undefined) size('faultOffset', v.faultOffset);
  if (v.stalls !== undefined) u32('stalls', v.stalls);
  if (v.copyThread !== undefined) u32('copyThread', v.copyThread);
  if (v.copyNs !== undefined) finite('copyNs', v.copyNs);
  if (v.rnrTimer !== undefined) int('rnrTimer', v.rnrTimer, 0, 31);
  if (v.resolved !== undefined) {
    if (v.resp !== AckResp.FAULT) bad('resolved', 'only on a FAULT verdict', v.resp);
    finite('resolved.atUs', v.resolved.atUs);
    u32('resolved.fetched', v.resolved.fetched);
    finite('resolved.heldUs', v.resolved.heldUs);
  }
  if (v.answered !== undefined) {
    u32('answered.faults.source', v.answered.faults.source);
    u32('answered.faults.destination', v.answered.faults.destination);
    u32('answered.retransmittedBlocks', v.answered.retransmittedBlocks);
    u32('answered.majorFaults', v.answered.majorFaults);
  }
  if ((v.resp === AckResp.ANSWER_ERR) !== (v.answer !== undefined)) bad('answer', 'present exactly with resp ANSWER_ERR', v.answer);
  if (v.answer !== undefined) {
    int('answer.status', v.answer.status, 1, 15);
    if (v.answer.side !== 'source' && v.answer.side !== 'destination') bad('answer.side', "'source' or 'destination'", v.answer.side);
  }
  naming(-1);
}

function checkAck(p: AckPacket, each = false): void {
  checkHeader(p);
  ackResp('resp', p.resp);
  if (p.verdicts !== undefined) {
    if (!Array.isArray(p.verdicts) || p.verdicts.length > MAX_VERDICTS) bad('verdicts', `an array of at most ${MAX_VERDICTS}`, p.verdicts);
    for (let i = 0; i < p.verdicts.length; i++) checkVerdict(i, p.verdicts[i]!, each);
  }
  if (p.returned !== undefined) {
    u32('returned.seq', p.returned.seq);
    int('returned.count', p.returned.count, 1, WIRE_MAX_BLOCKS);
  }
}

function checkSges(field: string, v: unknown): void {
  if (!Array.isArray(v) || v.length > MAX_SGE) bad(field, `an array of at most ${MAX_SGE} entries`, v);
  for (let i = 0; i < v.length; i++) {
    const s = v[i] as { addr: unknown; length: unknown; lkey: unknown };
    // Names built only for the message of an entry that fails.
    if (typeof s.addr !== 'bigint' || s.addr < 0n || s.addr > U64) addr(`${field}[${i}].addr`, s.addr);
    if (typeof s.length !== 'number' || !Number.isInteger(s.length) || s.length < 0 || s.length > 0xffffffff) u32(`${field}[${i}].length`, s.length);
    if (typeof s.lkey !== 'number' || !Number.isInteger(s.lkey) || s.lkey < 0 || s.lkey > 0xffffffff) u32(`${field}[${i}].lkey`, s.lkey);
  }
}

/**
 * Check every field of a packet against the layout's ranges (what decoding a frame of it
 * would check); throws a WireError naming the first field out of range. The in-process
 * fabric checks each packet it delivers with it.
 */
export function checkPacket(p: Packet): void {
  switch (p?.type) {
    case 'write':
      return checkWrite(p);
    case 'ack':
      return checkAck(p);
    default:
      bad('type', "'write' or 'ack'", (p as { type?: unknown })?.type);
  }
}

const W_STALL = 1;
const W_KEY = 2;
const W_QPN = 4;
const W_SOURCE_FAULT = 8;
const W_RC = 16;
const W_IMM = 32;
const W_SRC_FAULTS = 64;
const W_MESSAGE = 128;
const W_ALL = W_STALL | W_KEY | W_QPN | W_SOURCE_FAULT | W_RC | W_IMM | W_SRC_FAULTS | W_MESSAGE;

/**
 * The bytes of a packet. A write's payload is `bytes` (what the source read, up to the run's
 * length; fewer where `sourceFault` says a source page was missing), not `p.payload`.
 */
export function encodePacket(p: Packet, bytes?: Uint8Array): Uint8Array {
  const w = frameWriter();
  const payload = writePacket(w, p, bytes);
  if (payload.length) w.bytes(payload);
  return w.done();
}

// Writes every field of `p`; returns the payload that ends the frame (empty for an ACK).
/** @internal */
export function writePacket(w: Writer, p: Packet, bytes?: Uint8Array): Uint8Array {
  checkPacket(p);
  if (p.type === 'write') {
    const f =
      (p.sourceStall ? W_STALL : 0) |
      (p.key !== undefined ? W_KEY : 0) |
      (p.qpn !== undefined ? W_QPN : 0) |
      (p.sourceFault ? W_SOURCE_FAULT : 0) |
      (p.opcode !== undefined ? W_RC : 0) |
      (p.immData !== undefined ? W_IMM : 0) |
      (p.srcFaults !== undefined ? W_SRC_FAULTS : 0) |
      (p.msgOffset !== undefined ? W_MESSAGE : 0);
    w.u8(Op.WRITE);
    w.u8(f);
    header(w, p);
    w.u16(p.channel);
    w.u16(p.count);
    w.u32(p.blockSize);
    w.f64(p.lengthHint);
    w.f64(p.issuedMs);
    if (p.key !== undefined) w.u32(p.key);
    if (p.qpn !== undefined) w.u32(p.qpn);
    if (p.sourceFault) {
      w.u32(p.sourceFault.seq);
      w.f64(p.sourceFault.faultOffset);
    }
    if (p.opcode !== undefined) {
      // The opcode's top bit says an XRCETH follows (IB's XRC opcodes differ from RC's in their top bits too).
      w.u8(p.opcode | (p.srqn !== undefined ? XRC_BIT : 0) | (p.solicited ? SE_BIT : 0));
      if (p.srqn !== undefined) w.u32(p.srqn);
      w.u32(p.srcQpn!);
      w.u32(p.psn!);
      if (p.opcode === RcOp.READ_REQUEST) w.u32(p.dmaLength!);
      if (p.opcode === RcOp.ATOMIC) {
        w.u8(p.atomic!.fetchAdd ? 1 : 0);
        w.u64(p.atomic!.compareAdd);
        w.u64(p.atomic!.swap);
      }
      if (p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC) sges(w, p.sinks!);
      if (p.opcode === RcOp.UD_SEND || p.opcode === RcOp.UD_SEND_IMM) w.u32(p.qkey!);
      if (p.opcode === RcOp.FLUSH) {
        w.u32(p.dmaLength!);
        w.u8(p.flush!.type);
        w.u8(p.flush!.level);
      }
    }
    if (p.immData !== undefined) w.u32(p.immData);
    if (p.srcFaults !== undefined) w.u32(p.srcFaults);
    if (p.msgOffset !== undefined) {
      w.f64(p.msgOffset);
      w.f64(p.msgLength!);
    }
    w.f64s(p.issuedUs);
    w.f64s(p.arrivals);
    const payload = bytes ?? NO_BYTES;
    if (payload.length !== carriedBytes(p))
      throw new WireError(`payload must be the ${carriedBytes(p)} bytes the run carries, got ${payload.length}`);
    return payload;
  }
  const f = (p.verdicts !== undefined ? 2 : 0) | (p.returned !== undefined ? 4 : 0);
  w.u8(Op.ACK);
  w.u8(f);
  header(w, p);
  w.u8(p.resp);
  if (p.returned !== undefined) {
    w.u32(p.returned.seq);
    w.u16(p.returned.count);
  }
  if (p.verdicts !== undefined) {
    w.u16(p.verdicts.length);
    for (const v of p.verdicts) verdict(w, v);
  }
  return NO_BYTES;
}

const NO_BYTES = new Uint8Array(0);

/** Bytes a write carries: the run's, or those of the blocks before a missing source page. */
export function carriedBytes(p: WritePacket): number {
  return p.sourceFault ? (p.sourceFault.seq - p.seq) * p.blockSize : p.length;
}

function header(w: Writer, p: WritePacket | AckPacket): void {
  w.u16(p.src);
  w.u16(p.dst);
  w.u32(p.pd);
  w.u64(p.va);
  w.u32(p.tid);
  w.u32(p.seq);
  w.u32(p.length);
  w.f64(p.arrivesAt);
}

const V_WALKS = 1;
const V_LATE = 2;
const V_REASON = 4;
const V_FAULT_OFFSET = 8;
const V_STALLS = 16;
const V_COPY_THREAD = 32;
const V_COPY_NS = 64;
/** A second flags byte follows (V2_*). */
const V_MORE = 128;
const V2_RNR = 1;
const V2_ANSWERED = 2;
const V2_RESOLVED = 4;

function verdict(w: Writer, v: Verdict): void {
  const f =
    (v.walks ? V_WALKS : 0) |
    (v.late ? V_LATE : 0) |
    (v.reason !== undefined ? V_REASON : 0) |
    (v.faultOffset !== undefined ? V_FAULT_OFFSET : 0) |
    (v.stalls !== undefined ? V_STALLS : 0) |
    (v.copyThread !== undefined ? V_COPY_THREAD : 0) |
    (v.copyNs !== undefined ? V_COPY_NS : 0) |
    (v.rnrTimer !== undefined || v.answered !== undefined || v.resolved !== undefined ? V_MORE : 0);
  w.u8(f);
  if (f & V_MORE)
    w.u8((v.rnrTimer !== undefined ? V2_RNR : 0) | (v.answered !== undefined ? V2_ANSWERED : 0) | (v.resolved !== undefined ? V2_RESOLVED : 0));
  w.u32(v.seq);
  w.u16(v.count);
  w.u8(v.resp);
  w.f64(v.walkUs);
  if (v.walks) w.f64s(v.walks);
  if (v.reason !== undefined) w.str(v.reason);
  if (v.faultOffset !== undefined) w.f64(v.faultOffset);
  if (v.stalls !== undefined) w.u32(v.stalls);
  if (v.copyThread !== undefined) w.u32(v.copyThread);
  if (v.copyNs !== undefined) w.f64(v.copyNs);
  if (v.rnrTimer !== undefined) w.u8(v.rnrTimer);
  if (v.resolved !== undefined) {
    w.f64(v.resolved.atUs);
    w.u32(v.resolved.fetched);
    w.f64(v.resolved.heldUs);
  }
  if (v.answered !== undefined) {
    w.u32(v.answered.faults.source);
    w.u32(v.answered.faults.destination);
    w.u32(v.answered.retransmittedBlocks);
    w.u32(v.answered.majorFaults);
  }
  // Fixed by the resp, not by a flag: an ANSWER_ERR says how the answer ended.
  if (v.answer) {
    w.u8(v.answer.status);
    w.u8(v.answer.side === 'source' ? 0 : 1);
  }
}

function sges(w: Writer, list: ReadonlyArray<{ addr: bigint; length: number; lkey: number }>): void {
  w.u8(list.length);
  for (const s of list) {
    w.u64(s.addr);
    w.u32(s.length);
    w.u32(s.lkey);
  }
}

// ---- decoding ----

/**
 * A decoded write: its header fields; no payload until the transport says where its bytes (the
 * frame's `bytes`) are kept (place).
 */
export type DecodedWrite = Omit<WritePacket, 'payload'> & { payload: WritePacket['payload'] | undefined };

const NO_TIMES = new Float64Array(0);

// The header fields are read straight into each packet's one object literal, in wire order (no
// header object spread into it: a copy per packet).
/** @internal */
export function readWrite(r: Reader): DecodedWrite {
  const f = flags(r, W_ALL, 'write');
  const src = r.u16('src');
  const dst = r.u16('dst');
  const pd = r.u32('pd');
  const va = r.u64('va');
  const tid = r.u32('tid');
  const seq = r.u32('seq');
  const length = r.u32('length');
  const arrivesAt = r.f64('arrivesAt');
  const channel = r.u16('channel');
  const count = r.u16('count');
  // The count bounds what is read next: checked before the per-block fields are.
  int('count', count, 1, WIRE_MAX_BLOCKS);
  const p: DecodedWrite = {
    type: 'write',
    src,
    dst,
    pd,
    va,
    tid,
    seq,
    length,
    arrivesAt,
    channel,
    count,
    blockSize: r.u32('blockSize'),
    lengthHint: r.f64('lengthHint'),
    // The sender's clock is not this process's (performance.now() counts from each process's
    // start): what the receiver measures of a peer's packet runs from its arrival here.
    issuedMs: (r.f64('issuedMs'), performance.now()),
    sourceStall: (f & W_STALL) !== 0,
    issuedUs: NO_TIMES,
    arrivals: NO_TIMES,
    payload: undefined,
  };
  if (f & W_KEY) p.key = r.u32('key');
  if (f & W_QPN) p.qpn = r.u32('qpn');
  if (f & W_SOURCE_FAULT) p.sourceFault = { seq: r.u32('sourceFault.seq'), faultOffset: r.f64('sourceFault.faultOffset') };
  if (f & W_RC) {
    const op = r.u8('opcode');
    p.opcode = op & ~(XRC_BIT | SE_BIT);
    if (op & SE_BIT) p.solicited = true;
    if (op & XRC_BIT) p.srqn = r.u32('srqn');
    p.srcQpn = r.u32('srcQpn');
    p.psn = r.u32('psn');
    if (p.opcode === RcOp.READ_REQUEST) p.dmaLength = r.u32('dmaLength');
    if (p.opcode === RcOp.ATOMIC) {
      const fa = r.u8('atomic.fetchAdd');
      if (fa > 1) bad('atomic.fetchAdd', '0 or 1', fa);
      p.atomic = { fetchAdd: fa === 1, compareAdd: r.u64('atomic.compareAdd'), swap: r.u64('atomic.swap') };
    }
    if (p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC) p.sinks = readSges(r, 'sinks');
    if (p.opcode === RcOp.UD_SEND || p.opcode === RcOp.UD_SEND_IMM) p.qkey = r.u32('qkey');
    if (p.opcode === RcOp.FLUSH) {
      p.dmaLength = r.u32('dmaLength');
      p.flush = { type: r.u8('flush.type'), level: r.u8('flush.level') };
    }
  }
  if (f & W_IMM) p.immData = r.u32('immData');
  if (f & W_SRC_FAULTS) p.srcFaults = r.u32('srcFaults');
  if (f & W_MESSAGE) {
    p.msgOffset = r.f64('msgOffset');
    p.msgLength = r.f64('msgLength');
  }
  p.issuedUs = r.f64s('issuedUs', count);
  p.arrivals = r.f64s('arrivals', count);
  checkWrite(p as WritePacket, true);
  return p;
}

function readVerdict(r: Reader, i: number): Verdict {
  const f = r.u8(`verdicts[${i}].flags`);
  const f2 = f & V_MORE ? r.u8(`verdicts[${i}].flags2`) : 0;
  if (f2 & ~(V2_RNR | V2_ANSWERED | V2_RESOLVED)) throw new WireError(`verdicts[${i}]: unknown flag bits 0x${f2.toString(16)} (second byte)`);
  const v: Verdict = {
    seq: r.u32(`verdicts[${i}].seq`),
    count: r.u16(`verdicts[${i}].count`),
    resp: r.u8(`verdicts[${i}].resp`),
    walkUs: r.f64(`verdicts[${i}].walkUs`),
  };
  int(`verdicts[${i}].count`, v.count, 1, WIRE_MAX_BLOCKS);
  if (f & V_WALKS) v.walks = r.f64s(`verdicts[${i}].walks`, v.count);
  if (f & V_LATE) v.late = true;
  if (f & V_REASON) v.reason = r.str(`verdicts[${i}].reason`, MAX_REASON);
  if (f & V_FAULT_OFFSET) v.faultOffset = r.f64(`verdicts[${i}].faultOffset`);
  if (f & V_STALLS) v.stalls = r.u32(`verdicts[${i}].stalls`);
  if (f & V_COPY_THREAD) v.copyThread = r.u32(`verdicts[${i}].copyThread`);
  if (f & V_COPY_NS) v.copyNs = r.f64(`verdicts[${i}].copyNs`);
  if (f2 & V2_RNR) v.rnrTimer = r.u8(`verdicts[${i}].rnrTimer`);
  if (f2 & V2_RESOLVED) {
    if (v.resp !== AckResp.FAULT) bad(`verdicts[${i}].resolved`, 'only on a FAULT verdict', v.resp);
    v.resolved = {
      atUs: r.f64(`verdicts[${i}].resolved.atUs`),
      fetched: r.u32(`verdicts[${i}].resolved.fetched`),
      heldUs: r.f64(`verdicts[${i}].resolved.heldUs`),
    };
  }
  if (f2 & V2_ANSWERED)
    v.answered = {
      faults: { source: r.u32(`verdicts[${i}].answered.faults.source`), destination: r.u32(`verdicts[${i}].answered.faults.destination`) },
      retransmittedBlocks: r.u32(`verdicts[${i}].answered.retransmittedBlocks`),
      majorFaults: r.u32(`verdicts[${i}].answered.majorFaults`),
    };
  if (v.resp === AckResp.ANSWER_ERR) {
    const status = r.u8(`verdicts[${i}].answer.status`);
    const side = r.u8(`verdicts[${i}].answer.side`);
    if (side > 1) bad(`verdicts[${i}].answer.side`, '0 or 1', side);
    v.answer = { status, side: side === 0 ? 'source' : 'destination' };
  }
  return v;
}

/** @internal */
export function readAck(r: Reader): AckPacket {
  const f = flags(r, 6, 'ack');
  const p: AckPacket = {
    type: 'ack',
    src: r.u16('src'),
    dst: r.u16('dst'),
    pd: r.u32('pd'),
    va: r.u64('va'),
    tid: r.u32('tid'),
    seq: r.u32('seq'),
    length: r.u32('length'),
    arrivesAt: r.f64('arrivesAt'),
    resp: r.u8('resp'),
  };
  if (f & 4) p.returned = { seq: r.u32('returned.seq'), count: r.u16('returned.count') };
  if (f & 2) {
    const n = r.u16('verdicts count');
    int('verdicts count', n, 0, MAX_VERDICTS);
    p.verdicts = [];
    for (let i = 0; i < n; i++) p.verdicts.push(readVerdict(r, i));
  }
  r.end();
  checkAck(p, true);
  return p;
}

function readSges(r: Reader, field: string): Array<{ addr: bigint; length: number; lkey: number }> {
  const n = r.u8(`${field} count`);
  int(`${field} count`, n, 0, MAX_SGE);
  const out = [];
  for (let i = 0; i < n; i++)
    out.push({ addr: r.u64(`${field}[${i}].addr`), length: r.u32(`${field}[${i}].length`), lkey: r.u32(`${field}[${i}].lkey`) });
  return out;
}

/** The decoded write, its payload now at `offset` of `memory` (a staging mapping, or the receive slot it arrived in). */
export function place(p: DecodedWrite, memory: MemoryLike, offset = 0): WritePacket {
  p.payload = { region: memory, offset };
  return p as WritePacket;
}
