// The bytes every frame between two nodes' processes is made of (as rxe_hdr.h's accessors are
// for rdma_rxe): the frame opcode, the field checks the decoders and checkPacket share, the
// writer a frame is encoded into and the reader that decodes one. Decoding trusts nothing:
// every length, count, enum and number is checked against its range before anything is built
// from it, and a frame that ends early or goes on after its last field is refused, each with a
// WireError that names the field. What the fields are is said where each frame is laid out:
// packet-layout.ts (the engine's write and ACK packets), framing.ts (the transport's own
// frames), exchange-codec.ts (the value two programs swap).

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

/** The largest frame a peer may announce in chunks: a run of MAX blocks of 1 MiB plus its headers. */
export const MAX_FRAME_BYTES = WIRE_MAX_BLOCKS * (1 << 20) + (1 << 20);
export const U64 = (1n << 64n) - 1n;
export const SPACE = 1n << 64n;

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

/** @internal Name verdict `i` in the next field error (-1: none); checkVerdict sets it. */
export function naming(i: number): void {
  verdictAt = i;
}

export function bad(field: string, want: string, got: unknown): never {
  const shown = typeof got === 'bigint' ? `${got}n` : typeof got === 'number' || typeof got === 'boolean' ? String(got) : typeof got;
  const name = verdictAt < 0 ? field : `verdicts[${verdictAt}].${field}`;
  verdictAt = -1;
  throw new WireError(`${name} must be ${want}, got ${shown}`);
}

// ---- field checks, shared by the decoder and checkPacket ----

export function int(field: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) bad(field, `an integer in ${min}..${max}`, v);
  return v;
}
export const u32 = (field: string, v: unknown) => int(field, v, 0, 0xffffffff);
export const node = (field: string, v: unknown) => int(field, v, 0, MAX_NODES - 1);
/** A non-negative count of bytes or pages carried as a double (up to 2^53). */
export const size = (field: string, v: unknown) => int(field, v, 0, Number.MAX_SAFE_INTEGER);

export function finite(field: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) bad(field, 'a finite number', v);
  return v;
}

export function addr(field: string, v: unknown): bigint {
  if (typeof v !== 'bigint' || v < 0n || v > U64) bad(field, 'a bigint in 0..2^64-1', v);
  return v;
}

export function bool(field: string, v: unknown): boolean {
  if (typeof v !== 'boolean') bad(field, 'a boolean', v);
  return v;
}

/**
 * Per-block modelled times: their count always; each value's finiteness where they come off
 * the wire (`each`): in one process they are the engine's own sums, and a time moves no byte.
 */
export function times(field: string, v: unknown, count: number, each: boolean): Float64Array {
  if (!(v instanceof Float64Array) || v.length !== count) bad(field, `a Float64Array of ${count} modelled times`, v);
  if (each) for (let i = 0; i < count; i++) if (!Number.isFinite(v[i]!)) bad(`${field}[${i}]`, 'a finite number', v[i]);
  return v;
}

export function text(field: string, v: unknown, max: number): string {
  if (typeof v !== 'string' || v.length > max) bad(field, `a string of at most ${max} characters`, v);
  return v;
}

// ---- encoding ----

// A frame is written in a buffer kept (and grown) across frames: the scratch one, copied out at
// the frame's exact size (one allocation per frame, none while writing: a fresh buffer and view
// per frame were most of an ACK's encoding time), or an Outbox's, where it stays until sent.
export class Writer {
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
export function frameWriter(): Writer {
  scratch.at = 0;
  return scratch;
}

export class Reader {
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
export function flags(r: Reader, known: number, what: string): number {
  const f = r.u8('flags');
  if (f & ~known) throw new WireError(`${what}: unknown flag bits 0x${(f & ~known).toString(16)}`);
  return f;
}
