// The IOTLB: cached translations (page → resident) of one SMMU. Eviction or unmapping must
// invalidate it (the MMU-notifier role) so the next access walks and faults again.

// Keys are numbers (4 KiB frame of the VA × 2^16 + StreamID): exact below 2^53 for 47-bit
// virtual addresses, and much cheaper than strings on the per-block path.
const FRAME = 4096;
const SIDS = 65536;
const keyOf = (sid: number, page: bigint): number => Math.floor(Number(page) / FRAME) * SIDS + (sid % SIDS);

export class Iotlb {
  readonly capacity: number;
  // Map order doubles as LRU order
  #entries = new Map<number, true>();
  #sids = new Set<number>();
  hits = 0;
  misses = 0;
  invalidations = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  lookup(sid: number, page: bigint): boolean {
    const k = keyOf(sid, page);
    if (this.#entries.delete(k)) {
      this.#entries.set(k, true);
      this.hits++;
      return true;
    }
    this.misses++;
    return false;
  }

  insert(sid: number, page: bigint): void {
    const k = keyOf(sid, page);
    this.#entries.delete(k);
    this.#entries.set(k, true);
    this.#sids.add(sid % SIDS);
    if (this.#entries.size > this.capacity) this.#entries.delete(this.#entries.keys().next().value as number);
  }

  /** Drop every cached page of [start, start+length) for all streams. */
  invalidateRange(start: bigint, length: number, pageSize: number): number {
    let n = 0;
    const first = Math.floor(Number(start) / pageSize) * pageSize;
    const end = Number(start) + length;
    if (this.#entries.size * 2 < ((end - first) / FRAME) * this.#sids.size) {
      for (const k of [...this.#entries.keys()]) {
        const va = Math.floor(k / SIDS) * FRAME;
        if (va >= first && va < end && this.#entries.delete(k)) n++;
      }
    } else {
      for (let va = first; va < end; va += pageSize) {
        for (const s of this.#sids) if (this.#entries.delete((va / FRAME) * SIDS + s)) n++;
      }
    }
    this.invalidations += n;
    return n;
  }

  invalidateStream(sid: number): void {
    for (const k of [...this.#entries.keys()]) if (k % SIDS === sid % SIDS) this.#entries.delete(k);
  }

  get size(): number {
    return this.#entries.size;
  }
}
