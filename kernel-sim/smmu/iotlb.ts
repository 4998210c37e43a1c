// The IOTLB: cached translations (page → resident) of one SMMU. Eviction or unmapping must
// invalidate it (the MMU-notifier role) so the next access walks and faults again.

export class Iotlb {
  readonly capacity: number;
  // key: `${sid}:${pageVA}`; Map order doubles as LRU order
  #entries = new Map<string, true>();
  hits = 0;
  misses = 0;
  invalidations = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  lookup(sid: number, page: bigint): boolean {
    const k = `${sid}:${page}`;
    if (this.#entries.delete(k)) {
      this.#entries.set(k, true);
      this.hits++;
      return true;
    }
    this.misses++;
    return false;
  }

  insert(sid: number, page: bigint): void {
    const k = `${sid}:${page}`;
    this.#entries.delete(k);
    this.#entries.set(k, true);
    if (this.#entries.size > this.capacity) this.#entries.delete(this.#entries.keys().next().value as string);
  }

  /** Drop every cached page of [start, start+length) for all streams. */
  invalidateRange(start: bigint, length: number, pageSize: number): number {
    let n = 0;
    const ps = BigInt(pageSize);
    const first = start - (start % ps);
    const end = start + BigInt(length);
    if (BigInt(this.#entries.size) < (end - first) / ps) {
      for (const k of [...this.#entries.keys()]) {
        const page = BigInt(k.slice(k.indexOf(':') + 1));
        if (page >= first && page < end && this.#entries.delete(k)) n++;
      }
    } else {
      const sids = new Set<string>();
      for (const k of this.#entries.keys()) sids.add(k.slice(0, k.indexOf(':')));
      for (let p = first; p < end; p += ps) for (const s of sids) if (this.#entries.delete(`${s}:${p}`)) n++;
    }
    this.invalidations += n;
    return n;
  }

  invalidateStream(sid: number): void {
    for (const k of [...this.#entries.keys()]) if (k.startsWith(`${sid}:`)) this.#entries.delete(k);
  }

  get size(): number {
    return this.#entries.size;
  }
}
