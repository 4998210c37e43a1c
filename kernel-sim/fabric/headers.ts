// The byte layout of everything that crosses from one node's process to another's, in one
// place (as rxe_hdr.h is for rdma_rxe): the frame header, the engine's write and ACK packets,
// the verbs' request and response headers, and the transport's own hello, keepalive,
// exchange and chunk frames. Every frame starts with an opcode byte and a flags byte; the
// fields that follow are fixed by the opcode and the flags, big-endian as on an IB wire.
// Decoding trusts nothing: every length, count, enum and number is checked against its
// range before anything is built from it, an unknown opcode or flag is refused, and a frame
// that ends early or goes on after its last field is refused, each with a WireError that
// names the field. `checkPacket` applies the same field checks to a packet object, so the
// in-process fabric hands over packets that obey the layout's ranges too.
import { AckResp, type AckPacket, type Packet, RcOp, type Verdict, type WritePacket } from './packets.js';
import type { MemoryLike } from '../memory.js';

/** Frame opcodes (the first byte of every frame). */
export enum Op {
  HELLO = 0x01,
  PING = 0x02,
  EXCHANGE = 0x03,
  CHUNK = 0x04,
  BATCH = 0x05,
  WRITE = 0x10,
  ACK = 0x11,
}

/** Node ids a frame may name (LibfabricOptions.localNodes' range). */
export const MAX_NODES = 1024;
/** Blocks one write packet may carry (the engine's MAX_RUN_BLOCKS must not exceed it; a test checks). */
export const WIRE_MAX_BLOCKS = 1024;
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
const MAX_REASON = 1024;
const MAX_STRING = 1 << 16;
const MAX_ITEMS = 4096;
const MAX_KEYS = 256;
const MAX_DEPTH = 8;
/** The largest frame a peer may announce in chunks: a run of MAX blocks of 1 MiB plus its headers. */
export const MAX_FRAME_BYTES = WIRE_MAX_BLOCKS * (1 << 20) + (1 << 20);
/** The highest AckResp and WcStatus (ibv_wc_status' TM_RNDV_INCOMPLETE) a frame may carry. */
const MAX_ACK_RESP = AckResp.ANSWER_ERR;
/** An ACK's resp: one AckResp names (5 was the separate RESOLVED answer, gone). */
function ackResp(field: string, v: unknown): AckResp {
  int(field, v, 0, MAX_ACK_RESP);
  if (AckResp[v as AckResp] === undefined) bad(field, 'an AckResp', v);
  return v as AckResp;
}
const U64 = (1n << 64n) - 1n;
const SPACE = 1n << 64n;

/** A frame or packet that breaks the layout: `code` ERR_WIRE_MALFORMED, the message names the field. */
export class WireError extends Error {
  readonly code = 'ERR_WIRE_MALFORMED';
  constructor(message: string) {
    super(message);
    this.name = 'WireError';
  }
}

/** The verdict whose fields are being checked (-1: none): named in an error only, no string built per check. */
let verdictAt = -1;

function bad(field: string, want: string, got: unknown): never {
  const shown = typeof got === 'bigint' ? `${got}n` : typeof got === 'number' || typeof got === 'boolean' ? String(got) : typeof got;
  const name = verdictAt < 0 ? field : `verdicts[${verdictAt}].${field}`;
  verdictAt = -1;
  throw new WireError(`${name} must be ${want}, got ${shown}`);
}

// ---- field checks, shared by the decoder and checkPacket ----

function int(field: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) bad(field, `an integer in ${min}..${max}`, v);
  return v;
}
const u32 = (field: string, v: unknown) => int(field, v, 0, 0xffffffff);
const node = (field: string, v: unknown) => int(field, v, 0, MAX_NODES - 1);
/** A non-negative count of bytes or pages carried as a double (up to 2^53). */
const size = (field: string, v: unknown) => int(field, v, 0, Number.MAX_SAFE_INTEGER);

function finite(field: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) bad(field, 'a finite number', v);
  return v;
}

function addr(field: string, v: unknown): bigint {
  if (typeof v !== 'bigint' || v < 0n || v > U64) bad(field, 'a bigint in 0..2^64-1', v);
  return v;
}

function bool(field: string, v: unknown): boolean {
  if (typeof v !== 'boolean') bad(field, 'a boolean', v);
  return v;
}

/**
 * Per-block modelled times: their count always; each value's finiteness where they come off
 * the wire (`each`): in one process they are the engine's own sums, and a time moves no byte.
 */
function times(field: string, v: unknown, count: number, each: boolean): Float64Array {
  if (!(v instanceof Float64Array) || v.length !== count) bad(field, `a Float64Array of ${count} modelled times`, v);
  if (each) for (let i = 0; i < count; i++) if (!Number.isFinite(v[i]!)) bad(`${field}[${i}]`, 'a finite number', v[i]);
  return v;
}

function text(field: string, v: unknown, max: number): string {
  if (typeof v !== 'string' || v.length > max) bad(field, `a string of at most ${max} characters`, v);
  return v;
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
  if (p.opcode !== undefined) {
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
  } else if (
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

function checkVerdict(i: number, v: Verdict, each: boolean): void {
  verdictAt = i;
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
  verdictAt = -1;
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

// ---- encoding ----

// A frame is written in a buffer kept (and grown) across frames: the scratch one, copied out at
// the frame's exact size (one allocation per frame, none while writing: a fresh buffer and view
// per frame were most of an ACK's encoding time), or an Outbox's, where it stays until sent.
class Writer {
  at = 0;
  buf: Uint8Array;
  view: DataView;

  constructor(size: number) {
    this.buf = new Uint8Array(size);
    this.view = new DataView(this.buf.buffer);
  }

  #room(n: number): DataView {
    if (this.at + n > this.buf.length) {
      const next = new Uint8Array(Math.max(this.buf.length * 2, this.at + n));
      next.set(this.buf.subarray(0, this.at));
      this.buf = next;
      this.view = new DataView(next.buffer);
    }
    return this.view;
  }
  u8(v: number): void {
    this.#room(1).setUint8(this.at, v);
    this.at += 1;
  }
  u16(v: number): void {
    this.#room(2).setUint16(this.at, v);
    this.at += 2;
  }
  u32(v: number): void {
    this.#room(4).setUint32(this.at, v);
    this.at += 4;
  }
  u64(v: bigint): void {
    this.#room(8).setBigUint64(this.at, v);
    this.at += 8;
  }
  f64(v: number): void {
    this.#room(8).setFloat64(this.at, v);
    this.at += 8;
  }
  f64s(v: Float64Array): void {
    const d = this.#room(8 * v.length);
    for (let i = 0; i < v.length; i++) d.setFloat64(this.at + 8 * i, v[i]!);
    this.at += 8 * v.length;
  }
  bytes(v: Uint8Array): void {
    this.#room(v.length);
    this.buf.set(v, this.at);
    this.at += v.length;
  }
  /** A UTF-8 string with its byte length first (u32). */
  str(v: string): void {
    const b = Buffer.from(v, 'utf8');
    this.u32(b.length);
    this.bytes(b);
  }
  done(): Uint8Array {
    return this.buf.slice(0, this.at);
  }
}

const scratch = new Writer(16 << 10);

/** The scratch writer, emptied: one frame at a time. */
function frameWriter(): Writer {
  scratch.at = 0;
  return scratch;
}

class Reader {
  #b: Uint8Array;
  #view: DataView;
  at = 0;

  constructor(b: Uint8Array) {
    this.#b = b;
    this.#view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  }
  #need(n: number, field: string): number {
    if (this.at + n > this.#b.length) throw new WireError(`the frame ends inside ${field} (${this.#b.length} bytes)`);
    const at = this.at;
    this.at += n;
    return at;
  }
  u8(field: string): number {
    return this.#view.getUint8(this.#need(1, field));
  }
  u16(field: string): number {
    return this.#view.getUint16(this.#need(2, field));
  }
  u32(field: string): number {
    return this.#view.getUint32(this.#need(4, field));
  }
  u64(field: string): bigint {
    return this.#view.getBigUint64(this.#need(8, field));
  }
  f64(field: string): number {
    return this.#view.getFloat64(this.#need(8, field));
  }
  f64s(field: string, n: number): Float64Array {
    const at = this.#need(8 * n, field);
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = this.#view.getFloat64(at + 8 * i);
    return out;
  }
  bytes(field: string, n: number): Uint8Array {
    const at = this.#need(n, field);
    return this.#b.subarray(at, at + n);
  }
  str(field: string, max: number): string {
    const n = this.u32(`${field} length`);
    if (n > max) bad(`${field} length`, `at most ${max} bytes`, n);
    const b = this.bytes(field, n);
    const s = Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('utf8');
    return s;
  }
  rest(): Uint8Array {
    return this.bytes('the rest', this.#b.length - this.at);
  }
  end(): void {
    if (this.at !== this.#b.length) throw new WireError(`${this.#b.length - this.at} bytes after the last field of the frame`);
  }
}

/** Flags must name only the bits the opcode defines. */
function flags(r: Reader, known: number, what: string): number {
  const f = r.u8('flags');
  if (f & ~known) throw new WireError(`${what}: unknown flag bits 0x${(f & ~known).toString(16)}`);
  return f;
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
function writePacket(w: Writer, p: Packet, bytes?: Uint8Array): Uint8Array {
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
function readWrite(r: Reader): DecodedWrite {
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

function readAck(r: Reader): AckPacket {
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

// ---- the transport's own frames ----

/** What one frame says, decoded and checked. */
export type Frame =
  | { op: Op.HELLO; nodes: number[]; token?: Uint8Array }
  | { op: Op.PING }
  | { op: Op.EXCHANGE; body: unknown }
  | { op: Op.CHUNK; total: number; offset: number; data: Uint8Array }
  | { op: Op.BATCH; frames: Uint8Array[] }
  | { op: Op.WRITE; packet: DecodedWrite; bytes: Uint8Array }
  | { op: Op.ACK; packet: AckPacket };

/** Decode one frame; throws a WireError for anything that breaks the layout. */
export function decodeFrame(frame: Uint8Array): Frame {
  const r = new Reader(frame);
  const op = r.u8('opcode') as Op;
  switch (op) {
    case Op.WRITE: {
      const packet = readWrite(r);
      // A view of the payload inside the frame: as many bytes as the checked header says it carries.
      const bytes = r.bytes('payload', carriedBytes(packet as WritePacket));
      r.end();
      return { op, packet, bytes };
    }
    case Op.ACK:
      return { op, packet: readAck(r) };
    case Op.HELLO: {
      const f = flags(r, HELLO_TOKEN, 'hello');
      const n = r.u16('nodes count');
      int('nodes count', n, 1, MAX_NODES);
      const nodes: number[] = [];
      for (let i = 0; i < n; i++) nodes.push(node(`nodes[${i}]`, r.u16(`nodes[${i}]`)));
      const token = f & HELLO_TOKEN ? helloToken(r) : undefined;
      r.end();
      if (new Set(nodes).size !== n) throw new WireError('hello: a node is named twice');
      return token ? { op, nodes, token } : { op, nodes };
    }
    case Op.PING:
      flags(r, 0, 'ping');
      r.end();
      return { op };
    case Op.EXCHANGE: {
      flags(r, 0, 'exchange');
      const body = readValue(r, 0);
      r.end();
      return { op, body };
    }
    case Op.CHUNK: {
      flags(r, 0, 'chunk');
      const total = r.u32('chunk total');
      const offset = r.u32('chunk offset');
      int('chunk total', total, 1, MAX_FRAME_BYTES);
      const data = r.rest();
      if (data.length === 0 || offset + data.length > total)
        bad('chunk offset + length', `within the announced ${total} bytes`, offset + data.length);
      return { op, total, offset, data };
    }
    case Op.BATCH: {
      flags(r, 0, 'batch');
      const n = r.u16('batch count');
      int('batch count', n, 2, MAX_BATCH_FRAMES);
      const frames: Uint8Array[] = [];
      for (let i = 0; i < n; i++) {
        const len = r.u32(`batch[${i}] length`);
        // The smallest frame is an opcode and a flags byte; what each says is checked when it is decoded.
        if (len < 2) bad(`batch[${i}] length`, 'at least 2', len);
        frames.push(r.bytes(`batch[${i}]`, len));
      }
      r.end();
      return { op, frames };
    }
    default:
      throw new WireError(`unknown opcode 0x${(op as number).toString(16).padStart(2, '0')}`);
  }
}

/** The hello's flag: the sender's token follows the nodes (a length byte, then its bytes). */
const HELLO_TOKEN = 1;
/** Bytes of a hello's token. */
export const MAX_TOKEN_BYTES = 255;

function helloToken(r: Reader): Uint8Array {
  const n = r.u8('token length');
  int('token length', n, 1, MAX_TOKEN_BYTES);
  return r.bytes('token', n);
}

/** A hello: the nodes the sender hosts, and its token if it has one (LibfabricOptions.token). */
export function encodeHello(nodes: readonly number[], token?: Uint8Array): Uint8Array {
  int('nodes count', nodes.length, 1, MAX_NODES);
  if (token) int('token length', token.length, 1, MAX_TOKEN_BYTES);
  const w = frameWriter();
  w.u8(Op.HELLO);
  w.u8(token ? HELLO_TOKEN : 0);
  w.u16(nodes.length);
  nodes.forEach((n, i) => w.u16(node(`nodes[${i}]`, n)));
  if (token) {
    w.u8(token.length);
    w.bytes(token);
  }
  return w.done();
}

const PING = Uint8Array.of(Op.PING, 0);
export function encodePing(): Uint8Array {
  return PING;
}

/** A slice of a frame too large for one message: `total` bytes, this one at `offset`. */
export function encodeChunk(total: number, offset: number, data: Uint8Array): Uint8Array {
  const w = frameWriter();
  w.u8(Op.CHUNK);
  w.u8(0);
  w.u32(total);
  w.u32(offset);
  w.bytes(data);
  return w.done();
}

/** Bytes a chunk frame adds to its slice. */
export const CHUNK_HEADER_BYTES = 10;

/** Frames one batch may carry. */
export const MAX_BATCH_FRAMES = 0xffff;
/** Bytes a batch adds: its opcode, flags and count, then each frame's length. */
export const BATCH_HEADER_BYTES = 4;
export const BATCH_ENTRY_BYTES = 4;

/**
 * Several frames as one transport message (what one turn of the event loop had ready for a
 * connection): opcode, flags, u16 count (2..MAX_BATCH_FRAMES), then each frame as a u32
 * length and its bytes. Each frame is decoded and checked on its own on arrival. `frames`
 * are each frame's parts (encodePacketParts); returns the batch's parts in order, the
 * frames' own parts not copied.
 */
export function encodeBatch(frames: ReadonlyArray<readonly Uint8Array[]>): Uint8Array[] {
  int('batch count', frames.length, 2, MAX_BATCH_FRAMES);
  const head = new Uint8Array(BATCH_HEADER_BYTES + BATCH_ENTRY_BYTES * frames.length);
  const view = new DataView(head.buffer);
  head[0] = Op.BATCH;
  view.setUint16(2, frames.length);
  const out: Uint8Array[] = [];
  let at = BATCH_HEADER_BYTES;
  for (const parts of frames) {
    let len = 0;
    for (const p of parts) len += p.length;
    view.setUint32(at, len);
    // Each length goes just before its frame: a view of the one header allocation.
    out.push(head.subarray(at === BATCH_HEADER_BYTES ? 0 : at, at + BATCH_ENTRY_BYTES), ...parts);
    at += BATCH_ENTRY_BYTES;
  }
  return out;
}

/**
 * The frames one connection has ready, written straight into one buffer in the batch layout
 * (encodeBatch's) as they come: no copy of a frame, no array of parts. `take` gives the message,
 * the batch's header written last, or a lone frame without it.
 */
export class Outbox {
  #w = new Writer(64 << 10);
  #count = 0;
  #last = 0; // where the last frame's length starts

  constructor() {
    this.#w.at = BATCH_HEADER_BYTES;
  }

  /** Frames in the box. */
  get frames(): number {
    return this.#count;
  }

  /** Bytes of the message so far (its batch header and frame lengths included, an external payload not). */
  get bytes(): number {
    return this.#w.at;
  }

  /**
   * Append a packet's frame; a write's `payload` (see encodePacket) is copied in, or, if
   * `external`, only counted: it must go as the message's last part, right after `take`.
   * Nothing is appended if the packet breaks the layout (the WireError is thrown).
   */
  packet(p: Packet, payload?: Uint8Array, external = false): void {
    const w = this.#w;
    const start = w.at;
    this.#last = start;
    w.u32(0);
    try {
      const bytes = writePacket(w, p, payload);
      if (!external && bytes.length) w.bytes(bytes);
      w.view.setUint32(start, w.at - start - BATCH_ENTRY_BYTES + (external ? bytes.length : 0));
    } catch (e) {
      w.at = start;
      throw e;
    }
    this.#count++;
  }

  /** Append an encoded frame (a hello, ping, exchange). */
  frame(frame: Uint8Array): void {
    this.#last = this.#w.at;
    this.#w.u32(frame.length);
    this.#w.bytes(frame);
    this.#count++;
  }

  /** Take the last frame out again (a copy of its bytes; an external payload is not among them). */
  popLast(): Uint8Array {
    const w = this.#w;
    const frame = w.buf.slice(this.#last + BATCH_ENTRY_BYTES, w.at);
    w.at = this.#last;
    this.#count--;
    return frame;
  }

  /** The message (a view, valid until the next append) and an empty box. */
  take(): Uint8Array {
    const w = this.#w;
    const n = this.#count;
    const end = w.at;
    this.#count = 0;
    w.at = BATCH_HEADER_BYTES;
    if (n === 1) return w.buf.subarray(BATCH_HEADER_BYTES + BATCH_ENTRY_BYTES, end);
    int('batch count', n, 2, MAX_BATCH_FRAMES);
    w.buf[0] = Op.BATCH;
    w.buf[1] = 0;
    w.view.setUint16(2, n);
    return w.buf.subarray(0, end);
  }
}

// An exchange carries a small value the two programs swap (parameters, QP numbers, addresses
// and keys, counters): null, booleans, finite numbers, bigints of 64 bits, strings, arrays and
// plain objects, each tagged, bounded in size and nesting. Nothing else can be expressed.
const enum Tag {
  NULL = 0,
  UNDEFINED = 1,
  FALSE = 2,
  TRUE = 3,
  NUMBER = 4,
  BIGINT = 5,
  NEG_BIGINT = 6,
  STRING = 7,
  ARRAY = 8,
  OBJECT = 9,
}

export function encodeExchange(body: unknown): Uint8Array {
  const w = frameWriter();
  w.u8(Op.EXCHANGE);
  w.u8(0);
  writeValue(w, body, 0, 'body');
  return w.done();
}

function writeValue(w: Writer, v: unknown, depth: number, path: string): void {
  if (depth > MAX_DEPTH) throw new WireError(`${path}: nested deeper than ${MAX_DEPTH}`);
  if (v === null) w.u8(Tag.NULL);
  else if (v === undefined) w.u8(Tag.UNDEFINED);
  else if (typeof v === 'boolean') w.u8(v ? Tag.TRUE : Tag.FALSE);
  else if (typeof v === 'number') {
    w.u8(Tag.NUMBER);
    w.f64(finite(path, v));
  } else if (typeof v === 'bigint') {
    const m = v < 0n ? -v : v;
    if (m > U64) bad(path, 'a bigint within ±(2^64-1)', v);
    w.u8(v < 0n ? Tag.NEG_BIGINT : Tag.BIGINT);
    w.u64(m);
  } else if (typeof v === 'string') {
    // Bytes, as the decoder counts them: a string of multi-byte characters may not pass here and be refused there.
    if (Buffer.byteLength(v, 'utf8') > MAX_STRING) bad(path, `a string of at most ${MAX_STRING} UTF-8 bytes`, v);
    w.u8(Tag.STRING);
    w.str(v);
  } else if (Array.isArray(v)) {
    if (v.length > MAX_ITEMS) bad(path, `an array of at most ${MAX_ITEMS} items`, v);
    w.u8(Tag.ARRAY);
    w.u32(v.length);
    v.forEach((x, i) => writeValue(w, x, depth + 1, `${path}[${i}]`));
  } else if (typeof v === 'object' && [Object.prototype, null].includes(Object.getPrototypeOf(v) as object | null)) {
    const entries = Object.entries(v as Record<string, unknown>);
    if (entries.length > MAX_KEYS) bad(path, `an object of at most ${MAX_KEYS} keys`, v);
    w.u8(Tag.OBJECT);
    w.u32(entries.length);
    for (const [k, x] of entries) {
      w.str(text(`${path} key`, k, MAX_REASON));
      writeValue(w, x, depth + 1, `${path}.${k}`);
    }
  } else bad(path, 'null, a boolean, number, bigint, string, array or plain object', v);
}

function readValue(r: Reader, depth: number): unknown {
  if (depth > MAX_DEPTH) throw new WireError(`exchange body nested deeper than ${MAX_DEPTH}`);
  const tag = r.u8('value tag') as Tag;
  switch (tag) {
    case Tag.NULL:
      return null;
    case Tag.UNDEFINED:
      return undefined;
    case Tag.FALSE:
      return false;
    case Tag.TRUE:
      return true;
    case Tag.NUMBER:
      return finite('number', r.f64('number'));
    case Tag.BIGINT:
      return r.u64('bigint');
    case Tag.NEG_BIGINT:
      return -r.u64('bigint');
    case Tag.STRING:
      return r.str('string', MAX_STRING);
    case Tag.ARRAY: {
      const n = r.u32('array length');
      int('array length', n, 0, MAX_ITEMS);
      const out: unknown[] = [];
      for (let i = 0; i < n; i++) out.push(readValue(r, depth + 1));
      return out;
    }
    case Tag.OBJECT: {
      const n = r.u32('object keys');
      int('object keys', n, 0, MAX_KEYS);
      // No prototype to reach through a key such as "__proto__".
      const out = Object.create(null) as Record<string, unknown>;
      for (let i = 0; i < n; i++) {
        const k = r.str('key', MAX_REASON);
        out[k] = readValue(r, depth + 1);
      }
      return out;
    }
    default:
      throw new WireError(`unknown value tag ${tag as number}`);
  }
}

/** The decoded write, its payload now at `offset` of `memory` (a staging mapping, or the receive slot it arrived in). */
export function place(p: DecodedWrite, memory: MemoryLike, offset = 0): WritePacket {
  p.payload = { region: memory, offset };
  return p as WritePacket;
}
