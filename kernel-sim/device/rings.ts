// The rings' memory (docs/device-abi.md §2): one sealed memfd per CQ, SRQ or QP (a QP's holds
// its send ring and its receive ring), the geometry written into each header before the fd is
// handed over. The device keeps its own copy of the geometry and never reads it back.
import { binding, type RawMapping } from '../../native/index.js';
import { ABI_VERSION, CQE_LOG2, QUEUE_DATA_OFFSET, QUEUE_MAGIC, QueueKind, queueBuf, rxeSge, sendWqe, recvWqe } from './abi.js';

const PAGE = 4096;

function pageAlign(n: number): number {
  return Math.ceil(n / PAGE) * PAGE;
}

function log2Ceil(n: number): number {
  return n <= 1 ? 0 : 32 - Math.clz32(n - 1);
}

/** A ring's geometry, the device's own copy. */
export interface RingGeometry {
  kind: QueueKind;
  /** Byte offset of the header in its memfd. */
  offset: number;
  numElems: number;
  log2ElemSize: number;
}

/** The slots and entry sizes a queue gets for what was asked (each a power of two). */
export function sendGeometry(
  maxWr: number,
  maxSge: number,
  maxInline: number,
): { numElems: number; log2: number; maxSge: number; maxInline: number } {
  const log2 = log2Ceil(sendWqe.size + Math.max(maxSge * rxeSge.size, maxInline));
  const room = (1 << log2) - sendWqe.size;
  return { numElems: 1 << log2Ceil(maxWr), log2, maxSge: Math.min(16, Math.floor(room / rxeSge.size)), maxInline: Math.min(256, room) };
}

export function recvGeometry(maxWr: number, maxSge: number): { numElems: number; log2: number; maxSge: number } {
  const log2 = log2Ceil(recvWqe.size + maxSge * rxeSge.size);
  return { numElems: 1 << log2Ceil(maxWr), log2, maxSge: Math.min(16, Math.floor(((1 << log2) - recvWqe.size) / rxeSge.size)) };
}

export function cqGeometry(cqe: number): { numElems: number; log2: number } {
  return { numElems: 1 << log2Ceil(cqe), log2: CQE_LOG2 };
}

/** Bytes a ring of `numElems` slots of 2^log2 bytes takes, page-aligned. */
export function ringBytes(numElems: number, log2: number): number {
  return pageAlign(QUEUE_DATA_OFFSET + numElems * 2 ** log2);
}

/** Write a ring's header (the geometry line) at `r.offset` of `v`. */
function writeHeader(v: DataView, r: RingGeometry, handle: number): void {
  const o = HEADER;
  v.setUint32(r.offset + o.log2_elem_size, r.log2ElemSize, true);
  v.setUint32(r.offset + o.index_mask, r.numElems - 1, true);
  v.setUint32(r.offset + o.magic, QUEUE_MAGIC, true);
  v.setUint16(r.offset + o.abi_version, ABI_VERSION, true);
  v.setUint16(r.offset + o.kind, r.kind, true);
  v.setUint32(r.offset + o.num_elems, r.numElems, true);
  v.setUint32(r.offset + o.handle, handle, true);
}

/** Offsets of the header's fields (struct pfr_queue_buf). */
export const HEADER = queueBuf.offsets([
  'log2_elem_size',
  'index_mask',
  'magic',
  'abi_version',
  'kind',
  'num_elems',
  'handle',
  'producer_index',
  'consumer_index',
] as const);

/**
 * One ring in memory (docs/device-abi.md §2): a `pfr_queue_buf` header and its slots, with
 * free-running producer and consumer indices. In one process the memory is an ArrayBuffer (or
 * SharedArrayBuffer); the same bytes are what a provider in another process maps. Both sides
 * read and write entries through `view` at `slot(i)`; nothing here holds a JavaScript object of
 * either side. The geometry is this object's own copy, never read back from the memory.
 */
export class Ring {
  readonly kind: QueueKind;
  readonly numElems: number;
  readonly mask: number;
  readonly log2ElemSize: number;
  /** Byte offset of the ring's header in `buffer`. */
  readonly offset: number;
  /** The memory, and a DataView over all of it (entries are read and written through it). */
  readonly buffer: ArrayBuffer | SharedArrayBuffer;
  readonly view: DataView;
  readonly #base: number;
  readonly #idx: Uint32Array;
  static readonly #PI = HEADER.producer_index / 4;
  static readonly #CI = HEADER.consumer_index / 4;

  constructor(g: { kind: QueueKind; numElems: number; log2: number }, handle = 0, buffer?: ArrayBuffer | SharedArrayBuffer, offset = 0) {
    if (g.numElems < 1 || (g.numElems & (g.numElems - 1)) !== 0) throw new RangeError(`a ring's slots must be a power of two, got ${g.numElems}`);
    this.kind = g.kind;
    this.numElems = g.numElems;
    this.mask = g.numElems - 1;
    this.log2ElemSize = g.log2;
    this.offset = offset;
    this.buffer = buffer ?? new ArrayBuffer(QUEUE_DATA_OFFSET + g.numElems * 2 ** g.log2);
    this.view = new DataView(this.buffer);
    this.#base = offset + QUEUE_DATA_OFFSET;
    this.#idx = new Uint32Array(this.buffer, offset, QUEUE_DATA_OFFSET / 4);
    if (!buffer) writeHeader(this.view, { kind: g.kind, offset, numElems: g.numElems, log2ElemSize: g.log2 }, handle);
  }

  /** Entries produced (free-running, wraps at 2^32). */
  get producer(): number {
    return Atomics.load(this.#idx, Ring.#PI);
  }

  /** Entries consumed (free-running). */
  get consumer(): number {
    return Atomics.load(this.#idx, Ring.#CI);
  }

  /** Entries produced and not consumed (above numElems: the indices are corrupt). */
  get count(): number {
    return (this.producer - this.consumer) >>> 0;
  }

  /** Byte offset in `buffer` of the slot of entry `i`. */
  slot(i: number): number {
    return this.#base + ((i & this.mask) << this.log2ElemSize);
  }

  /**
   * The slot of entry `i` if it is produced and not consumed, else -1 (also when the indices
   * are corrupt: more entries than slots; the other side's memory is not trusted).
   */
  slotOf(i: number): number {
    const n = (Atomics.load(this.#idx, Ring.#PI) - Atomics.load(this.#idx, Ring.#CI)) >>> 0;
    if (n > this.numElems || (i - Atomics.load(this.#idx, Ring.#CI)) >>> 0 >= n) return -1;
    return this.#base + ((i & this.mask) << this.log2ElemSize);
  }

  /** The slot of the producer index if fewer than `limit` entries are held, else -1 (the producer's room check). */
  producerSlot(limit: number): number {
    const p = Atomics.load(this.#idx, Ring.#PI);
    if ((p - Atomics.load(this.#idx, Ring.#CI)) >>> 0 >= limit) return -1;
    return this.#base + ((p & this.mask) << this.log2ElemSize);
  }

  /** The completer's step (rxe_queue.h's advance_consumer): the oldest entry is done with, its slot free; a no-op on an empty ring. */
  advanceConsumer(): void {
    const c = Atomics.load(this.#idx, Ring.#CI);
    if (Atomics.load(this.#idx, Ring.#PI) !== c) Atomics.store(this.#idx, Ring.#CI, (c + 1) >>> 0);
  }

  /** The producer's step, after writing the entry at slot(producer): publish it. */
  produced(): void {
    Atomics.store(this.#idx, Ring.#PI, (this.producer + 1) >>> 0);
  }

  /** The consumer's step, after copying the entry at slot(consumer): free its slot. */
  consumed(): void {
    Atomics.store(this.#idx, Ring.#CI, (this.consumer + 1) >>> 0);
  }
}

/** A scatter/gather entry as a WQE holds it (struct rxe_sge). */
export interface Sge {
  addr: bigint;
  length: number;
  lkey: number;
}

/** Offsets of an SGE's fields (struct rxe_sge). */
export const SGE = rxeSge.offsets(['addr', 'length', 'lkey'] as const);

/**
 * A ring of work requests the device consumes: the head is copied out of its slot once (the
 * device checks and uses its copy, never the slot again) and stays the same object until
 * consumed.
 */
export abstract class WqeRing<T> extends Ring {
  #head: T | undefined;
  #headAt = -1;

  /** Write `list` as the SGEs that start `sges` bytes into the slot at `at`; their total length. */
  protected writeSges(at: number, sges: number, list: readonly Sge[]): number {
    const v = this.view;
    let length = 0;
    for (let k = 0; k < list.length; k++) {
      const s = list[k]!;
      const o = at + sges + k * rxeSge.size;
      v.setBigUint64(o + SGE.addr, BigInt(s.addr), true);
      v.setUint32(o + SGE.length, s.length, true);
      v.setUint32(o + SGE.lkey, s.lkey, true);
      length += s.length;
    }
    return length;
  }

  /** Copy `n` SGEs out of the slot at `at`, `sges` bytes in. */
  protected readSges(at: number, sges: number, n: number): Sge[] {
    const v = this.view;
    const list: Sge[] = [];
    for (let k = 0; k < n; k++) {
      const o = at + sges + k * rxeSge.size;
      list.push({ addr: v.getBigUint64(o + SGE.addr, true), length: v.getUint32(o + SGE.length, true), lkey: v.getUint32(o + SGE.lkey, true) });
    }
    return list;
  }

  /** Copy the entry at byte offset `at` out of its slot. */
  protected abstract decode(at: number): T;

  /** The device's copy of the next entry, decoded once. */
  protected peek(): T | undefined {
    const c = this.consumer;
    if (this.producer === c) return undefined;
    if (this.#headAt !== c || this.#head === undefined) {
      this.#head = this.decode(this.slot(c));
      this.#headAt = c;
    }
    return this.#head;
  }

  /** Consume the head the device has peeked at. */
  protected take(): T | undefined {
    const w = this.peek();
    if (w === undefined) return undefined;
    this.#head = undefined;
    this.#headAt = -1;
    this.consumed();
    return w;
  }

  /** The next entry the device has, decoded once (the same object until consumed). */
  head(): T | undefined {
    return this.peek();
  }

  /** The device consumes the head. */
  shift(): T | undefined {
    return this.take();
  }

  /** Consume everything (a flush), oldest first. */
  drain(): T[] {
    const out: T[] = [];
    for (let w = this.shift(); w !== undefined; w = this.shift()) out.push(w);
    return out;
  }
}

/** The memory of one or more rings: a sealed memfd mapped here, its fd to send to the program. */
export class RingMemory {
  readonly mapping: RawMapping & { fd: number };
  readonly rings: RingGeometry[];
  #closed = false;

  /** Map `size` bytes (page-aligned) and write each ring's header; `handle` is the owner's. */
  constructor(size: number, rings: RingGeometry[], handle: number) {
    this.mapping = binding.mapSealed(size);
    this.rings = rings;
    const v = new DataView(this.mapping.buffer);
    for (const r of rings) writeHeader(v, r, handle);
  }

  get size(): number {
    return this.mapping.buffer.byteLength;
  }

  /** The fd to send (valid until close). */
  get fd(): number {
    return this.mapping.fd;
  }

  /** Unmap (the program's mapping stays until it unmaps or exits). Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    binding.closeRegion(this.mapping.id, this.mapping.buffer);
  }
}
