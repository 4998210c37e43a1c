// The IOTLB: cached translations (page → physical frame) of one SMMU. Eviction or unmapping
// must invalidate it, and a move of the frames (THP collapse, migration) must drop the
// entries whose frame changed (the MMU-notifier role), so the next access walks again.

// Keys are numbers (4 KiB frame of the VA × 2^16 + StreamID): exact below 2^53 for 47-bit
// virtual addresses, and much cheaper than strings on the per-block path.
const FRAME = 4096;
const SIDS = 65536;
const keyAt = (sid: number, page: number): number => Math.floor(page / FRAME) * SIDS + (sid % SIDS);

export class Iotlb {
  readonly capacity: number;
  // Map order doubles as LRU order; the value is the frame the walk found (0: not known,
  // the kernel hides frame numbers without CAP_SYS_ADMIN).
  #entries = new Map<number, number>();
  #sids = new Set<number>();
  hits = 0;
  misses = 0;
  invalidations = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  lookup(sid: number, page: bigint): boolean {
    return this.lookupAt(sid, Number(page));
  }

  /** lookup() with the page's address as a number (exact below 2^53): no BigInt on the per-page path. */
  lookupAt(sid: number, page: number): boolean {
    const k = keyAt(sid, page);
    const frame = this.#entries.get(k);
    if (frame !== undefined) {
      this.#entries.delete(k);
      this.#entries.set(k, frame);
      this.hits++;
      return true;
    }
    this.misses++;
    return false;
  }

  insert(sid: number, page: bigint, frame = 0): void {
    this.insertAt(sid, Number(page), frame);
  }

  insertAt(sid: number, page: number, frame = 0): void {
    const k = keyAt(sid, page);
    this.#entries.delete(k);
    this.#entries.set(k, frame);
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

  /** The cached entries of [start, start+length), all streams, without touching LRU order or counters. */
  entriesIn(start: bigint, length: number): Array<{ sid: number; page: bigint; frame: number }> {
    const first = Number(start);
    const end = first + length;
    const out: Array<{ sid: number; page: bigint; frame: number }> = [];
    for (const [k, frame] of this.#entries) {
      const va = Math.floor(k / SIDS) * FRAME;
      if (va >= first && va < end) out.push({ sid: k % SIDS, page: BigInt(va), frame });
    }
    return out;
  }

  /** Drop one stream's entry for a page; true if it was cached. */
  invalidate(sid: number, page: bigint): boolean {
    const gone = this.#entries.delete(keyAt(sid, Number(page)));
    if (gone) this.invalidations++;
    return gone;
  }

  invalidateStream(sid: number): void {
    for (const k of [...this.#entries.keys()]) if (k % SIDS === sid % SIDS) this.#entries.delete(k);
  }

  get size(): number {
    return this.#entries.size;
  }
}
