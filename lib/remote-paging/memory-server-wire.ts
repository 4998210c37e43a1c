// The memory server's wire format, in one place (the server, memory-server.ts, and its client,
// memory-server-store.ts, both read and write frames only through here). A frame is a fixed
// 16-byte header and a body whose length the header gives:
//   magic u16 'pf' | op u8 | status u8 | id u32 | count u32 | body length u32   (little-endian)
// A reply carries its request's op with REPLY set, the request's id, and status OK or an
// error (its body then the reason, UTF-8). Bodies:
//   HELLO  version u16, namespace length u16, secret 16 B, namespace   -> epoch 8 B, limits 3 × u32
//   GET    count × address u64                                          -> count × length u32 (ABSENT: none), the values
//   PUT    count × (address u64, length u32), then the values            -> count = values stored
//   DEL    count × address u64                                          -> count = values deleted
// The wire is untrusted: the header is checked before its body is awaited (a body past the
// limit is refused without reading it), every body field before it is used. Nothing here is
// decoded with v8.deserialize.

export const MAGIC = 0x6670; // 'pf' little-endian
export const VERSION = 1;
export const HEADER_BYTES = 16;

export enum Op {
  HELLO = 1,
  GET = 2,
  PUT = 3,
  DEL = 4,
}
/** Set in a reply's op. */
export const REPLY = 0x80;

export enum Status {
  OK = 0,
  /** The server's memory limit: the PUT stored nothing. */
  FULL = 1,
  /** The frame broke the protocol: the server closes the connection after this reply. */
  REFUSED = 2,
  /** The namespace belongs to another client (another secret). */
  NAMESPACE = 3,
}

/** A GET reply's length for a page the server does not hold. */
export const ABSENT = 0xffffffff;

/** Largest body either side accepts: a bigger batch is split by the client. */
export const MAX_BODY = 64 << 20;
/** Most addresses in one request. */
export const MAX_COUNT = 65536;
/** Largest value (a 16 MiB page and its trailer, with room to spare). */
export const MAX_VALUE = (16 << 20) + 64;
/** Namespace: 1 to this many printable ASCII bytes. */
export const MAX_NAMESPACE = 200;
export const SECRET_BYTES = 16;
/** HELLO body without its namespace. */
export const HELLO_FIXED = 4 + SECRET_BYTES;
/** HELLO reply body: epoch, max body, max count, max value. */
export const HELLO_REPLY_BYTES = 8 + 12;
/** Addresses are user-space virtual addresses: below 2^53, so a JavaScript number holds one exactly. */
const MAX_ADDRESS_HI = 1 << 21;

export interface Header {
  op: number;
  status: number;
  id: number;
  count: number;
  bodyLength: number;
}

/** A frame: header and body in one buffer (the start of `into`, if it is large enough). */
export function frame(op: number, status: number, id: number, count: number, bodyLength: number, into?: Buffer): Buffer {
  const n = HEADER_BYTES + bodyLength;
  const b = into && into.length >= n ? into.subarray(0, n) : Buffer.allocUnsafe(n);
  b.writeUInt16LE(MAGIC, 0);
  b[2] = op;
  b[3] = status;
  b.writeUInt32LE(id, 4);
  b.writeUInt32LE(count, 8);
  b.writeUInt32LE(bodyLength, 12);
  return b;
}

/** An error reply whose body says why. */
export function errorFrame(op: number, status: Status, id: number, reason: string): Buffer {
  const text = Buffer.from(reason, 'utf8');
  const b = frame(op | REPLY, status, id, 0, text.length);
  text.copy(b, HEADER_BYTES);
  return b;
}

/** The address at `off`, or -1 if it is not a user-space address (≥ 2^53). */
export function readAddress(b: Buffer, off: number): number {
  const hi = b.readUInt32LE(off + 4);
  return hi >= MAX_ADDRESS_HI ? -1 : hi * 0x1_0000_0000 + b.readUInt32LE(off);
}

export function writeAddress(b: Buffer, off: number, address: number): void {
  b.writeUInt32LE(address >>> 0, off);
  b.writeUInt32LE(Math.floor(address / 0x1_0000_0000), off + 4);
}

/** A namespace is printable ASCII without spaces, 1..MAX_NAMESPACE bytes. */
export function validNamespace(ns: Buffer | string): boolean {
  const b = typeof ns === 'string' ? Buffer.from(ns, 'latin1') : ns;
  if (b.length < 1 || b.length > MAX_NAMESPACE) return false;
  for (const c of b) if (c < 0x21 || c > 0x7e) return false;
  return true;
}

/**
 * Cuts a byte stream into frames. The header is checked by `check` as soon as it is whole (a
 * reason string refuses it, and nothing more is read); the body is gathered into a buffer of
 * its own, which `onFrame` owns.
 */
export class FrameReader {
  #head = Buffer.alloc(HEADER_BYTES);
  #headHave = 0;
  #header: Header | undefined;
  #body: Buffer | undefined;
  #bodyHave = 0;
  #stopped = false;
  #check: (h: Header) => string | undefined;
  #onFrame: (h: Header, body: Buffer) => void;
  #onRefuse: (reason: string, h: Header | undefined) => void;

  constructor(
    check: (h: Header) => string | undefined,
    onFrame: (h: Header, body: Buffer) => void,
    onRefuse: (reason: string, h: Header | undefined) => void,
  ) {
    this.#check = check;
    this.#onFrame = onFrame;
    this.#onRefuse = onRefuse;
  }

  /** Stop reading (after a refusal, or when the connection closes). */
  stop(): void {
    this.#stopped = true;
  }

  /** Feed `n` bytes of `chunk` (the reader copies what it keeps). */
  push(chunk: Buffer, n = chunk.length): void {
    let at = 0;
    while (at < n && !this.#stopped) {
      if (!this.#header) {
        const take = Math.min(HEADER_BYTES - this.#headHave, n - at);
        chunk.copy(this.#head, this.#headHave, at, at + take);
        this.#headHave += take;
        at += take;
        if (this.#headHave < HEADER_BYTES) return;
        this.#headHave = 0;
        const h = this.#decodeHeader();
        if (typeof h === 'string') return this.#refuse(h, undefined);
        const why = this.#check(h);
        if (why) return this.#refuse(why, h);
        this.#header = h;
        this.#body = Buffer.allocUnsafe(h.bodyLength);
        this.#bodyHave = 0;
      }
      const body = this.#body!;
      const take = Math.min(body.length - this.#bodyHave, n - at);
      chunk.copy(body, this.#bodyHave, at, at + take);
      this.#bodyHave += take;
      at += take;
      if (this.#bodyHave === body.length) {
        const h = this.#header;
        this.#header = this.#body = undefined;
        this.#onFrame(h, body);
      }
    }
  }

  #decodeHeader(): Header | string {
    const b = this.#head;
    if (b.readUInt16LE(0) !== MAGIC) return 'bad magic';
    const bodyLength = b.readUInt32LE(12);
    if (bodyLength > MAX_BODY) return 'body too large';
    const count = b.readUInt32LE(8);
    if (count > MAX_COUNT) return 'count too large';
    return { op: b[2]!, status: b[3]!, id: b.readUInt32LE(4), count, bodyLength };
  }

  #refuse(reason: string, h: Header | undefined): void {
    this.#stopped = true;
    this.#onRefuse(reason, h);
  }
}
