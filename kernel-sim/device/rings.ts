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
    const o = queueBuf.offsets(['log2_elem_size', 'index_mask', 'magic', 'abi_version', 'kind', 'num_elems', 'handle'] as const);
    for (const r of rings) {
      v.setUint32(r.offset + o.log2_elem_size, r.log2ElemSize, true);
      v.setUint32(r.offset + o.index_mask, r.numElems - 1, true);
      v.setUint32(r.offset + o.magic, QUEUE_MAGIC, true);
      v.setUint16(r.offset + o.abi_version, ABI_VERSION, true);
      v.setUint16(r.offset + o.kind, r.kind, true);
      v.setUint32(r.offset + o.num_elems, r.numElems, true);
      v.setUint32(r.offset + o.handle, handle, true);
    }
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
