// The transport's own frames (beside libfabric-transport.ts, which sends them): the hello
// that names a connection's nodes, the keepalive ping, a chunk of a frame too large for one
// message, the batch of a turn's frames and the Outbox that writes one, and decodeFrame, which
// takes any frame apart (a write or ACK packet by packet-layout.ts, an exchange by
// exchange-codec.ts).
import type { AckPacket, Packet, WritePacket } from './packets.js';
import { readValue } from './exchange-codec.js';
import { carriedBytes, type DecodedWrite, readAck, readWrite, writePacket } from './packet-layout.js';
import { bad, flags, frameWriter, int, MAX_FRAME_BYTES, MAX_NODES, node, Op, Reader, WireError, Writer } from './wire-codec.js';

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
