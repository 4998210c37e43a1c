// An exchange carries a small value the two programs swap (parameters, QP numbers, addresses
// and keys, counters): null, booleans, finite numbers, bigints of 64 bits, strings, arrays and
import { MAX_REASON } from './packet-layout.js';
import { bad, finite, frameWriter, int, Op, type Reader, text, U64, WireError, type Writer } from './wire-codec.js';

/** Bytes of an exchange string, and the exchange value's shape limits. */
const MAX_STRING = 1 << 16;
const MAX_ITEMS = 4096;
const MAX_KEYS = 256;
const MAX_DEPTH = 8;

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

/** @internal */
export function readValue(r: Reader, depth: number): unknown {
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
