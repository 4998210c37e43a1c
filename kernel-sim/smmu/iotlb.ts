// The IOTLB: cached translations (page → physical frame) of one SMMU. Eviction or unmapping
// must invalidate it, and a move of the frames (THP collapse, migration) must drop the
// entries whose frame changed (the MMU-notifier role), so the next access walks again.

// Keys are numbers (4 KiB frame of the VA × 2^16 + StreamID): exact below 2^53 for 47-bit
// virtual addresses, and much cheaper than strings on the per-block path.
const FRAME = 4096;
const SIDS = 65536;
const NONE = -1;
const keyAt = (sid: number, page: number): number => Math.floor(page / FRAME) * SIDS + (sid % SIDS);

export class Iotlb {
  readonly capacity: number;
  // LRU as a doubly linked list of slots in typed arrays, with a Map from key to slot: a hit
  // moves its slot to the tail and an eviction takes the head, both O(1) with no Map change.
  // (A Map's own order as the LRU, with delete + set per hit, left a hole per hit that the
  // evicting keys().next() walked over: microseconds per page once the IOTLB was full.)
  #slot = new Map<number, number>();
  #key = new Float64Array(0);
  // The frame the walk found (0: not known, the kernel hides frame numbers without CAP_SYS_ADMIN).
  #frame = new Float64Array(0);
  #prev = new Int32Array(0);
  #next = new Int32Array(0);
  #head = NONE; // least recently used
  #tail = NONE;
  #free: number[] = [];
  #used = 0; // slots ever handed out (the arrays grow to capacity as needed)
  #sids = new Set<number>();
  #lastSid = -1; // the stream last added to #sids (one Set.add per stream change, not per page)
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
    const s = this.#slot.get(keyAt(sid, page));
    if (s !== undefined) {
      this.#toTail(s);
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
    const s = this.#slot.get(keyAt(sid, page));
    if (s === undefined) return this.insertMissedAt(sid, page, frame);
    this.#frame[s] = frame;
    this.#toTail(s);
  }

  /** insertAt() of a page whose lookupAt() just missed (nothing cached it since): one Map lookup fewer per page walked. */
  insertMissedAt(sid: number, page: number, frame = 0): void {
    const k = keyAt(sid, page);
    if (sid !== this.#lastSid) {
      this.#sids.add(sid % SIDS);
      this.#lastSid = sid;
    }
    if (this.#slot.size >= this.capacity) {
      if (this.#head === NONE) return; // capacity 0: nothing is cached
      this.#drop(this.#head);
    }
    const s = this.#alloc();
    this.#key[s] = k;
    this.#frame[s] = frame;
    this.#slot.set(k, s);
    this.#link(s);
  }

  /** Drop every cached page of [start, start+length) for all streams. */
  invalidateRange(start: bigint, length: number, pageSize: number): number {
    let n = 0;
    const first = Math.floor(Number(start) / pageSize) * pageSize;
    const end = Number(start) + length;
    if (this.#slot.size * 2 < ((end - first) / FRAME) * this.#sids.size) {
      for (const [k, s] of [...this.#slot]) {
        const va = Math.floor(k / SIDS) * FRAME;
        if (va >= first && va < end) {
          this.#drop(s);
          n++;
        }
      }
    } else {
      for (let va = first; va < end; va += pageSize) {
        for (const sid of this.#sids) {
          const s = this.#slot.get((va / FRAME) * SIDS + sid);
          if (s !== undefined) {
            this.#drop(s);
            n++;
          }
        }
      }
    }
    this.invalidations += n;
    return n;
  }

  /** The cached entries of [start, start+length), all streams, least recently used first, without touching LRU order or counters. */
  entriesIn(start: bigint, length: number): Array<{ sid: number; page: bigint; frame: number }> {
    const first = Number(start);
    const end = first + length;
    const out: Array<{ sid: number; page: bigint; frame: number }> = [];
    for (let s = this.#head; s !== NONE; s = this.#next[s]!) {
      const k = this.#key[s]!;
      const va = Math.floor(k / SIDS) * FRAME;
      if (va >= first && va < end) out.push({ sid: k % SIDS, page: BigInt(va), frame: this.#frame[s]! });
    }
    return out;
  }

  /** Drop one stream's entry for a page; true if it was cached. */
  invalidate(sid: number, page: bigint): boolean {
    const s = this.#slot.get(keyAt(sid, Number(page)));
    if (s === undefined) return false;
    this.#drop(s);
    this.invalidations++;
    return true;
  }

  invalidateStream(sid: number): void {
    for (const [k, s] of [...this.#slot]) if (k % SIDS === sid % SIDS) this.#drop(s);
  }

  get size(): number {
    return this.#slot.size;
  }

  #alloc(): number {
    const s = this.#free.pop();
    if (s !== undefined) return s;
    if (this.#used === this.#key.length) this.#grow();
    return this.#used++;
  }

  // The arrays double up to the capacity: a large capacity costs memory only once it is used.
  #grow(): void {
    const n = Math.min(this.capacity, Math.max(1024, this.#key.length * 2));
    const key = new Float64Array(n);
    const frame = new Float64Array(n);
    const prev = new Int32Array(n);
    const next = new Int32Array(n);
    key.set(this.#key);
    frame.set(this.#frame);
    prev.set(this.#prev);
    next.set(this.#next);
    [this.#key, this.#frame, this.#prev, this.#next] = [key, frame, prev, next];
  }

  #drop(s: number): void {
    this.#slot.delete(this.#key[s]!);
    this.#unlink(s);
    this.#free.push(s);
  }

  #link(s: number): void {
    this.#prev[s] = this.#tail;
    this.#next[s] = NONE;
    if (this.#tail === NONE) this.#head = s;
    else this.#next[this.#tail] = s;
    this.#tail = s;
  }

  #unlink(s: number): void {
    const p = this.#prev[s]!;
    const n = this.#next[s]!;
    if (p === NONE) this.#head = n;
    else this.#next[p] = n;
    if (n === NONE) this.#tail = p;
    else this.#prev[n] = p;
  }

  #toTail(s: number): void {
    if (s === this.#tail) return;
    this.#unlink(s);
    this.#link(s);
  }
}
