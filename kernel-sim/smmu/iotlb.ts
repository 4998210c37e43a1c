// The IOTLB: cached translations (page → physical frame) of one SMMU. Eviction or unmapping
// must invalidate it, and a move of the frames (THP collapse, migration) must drop the
// entries whose frame changed (the MMU-notifier role), so the next access walks again.

// Keys are numbers (4 KiB frame of the VA × 2^16 + StreamID): exact below 2^53 for 47-bit
// virtual addresses, and much cheaper than strings on the per-block path.
const FRAME = 4096;
const SIDS = 65536;
const NONE = -1;
const keyAt = (sid: number, page: number): number => Math.floor(page / FRAME) * SIDS + (sid % SIDS);

const EMPTY = -1;

// Key → slot, open addressing with linear probing in typed arrays: the keys (above 2^31) stay
// unboxed doubles, where a Map<number, number> boxed one per lookup and hashed it as a heap
// number: most of what was left of the IOTLB's cost per page. Deletion shifts the entries
// after the hole back (no tombstones), so a full IOTLB's churn does not slow it down.
class KeyIndex {
  size = 0;
  #keys = new Float64Array(16);
  #vals = new Int32Array(16).fill(EMPTY);
  #mask = 15;

  #home(k: number): number {
    // MurmurHash3's finalizer over the key's two 32-bit halves (the low one holds the StreamID).
    let h = (k | 0) ^ Math.imul((k / 4294967296) | 0, 0x9e3779b1);
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    return (h ^ (h >>> 16)) & this.#mask;
  }

  get(k: number): number {
    for (let i = this.#home(k); ; i = (i + 1) & this.#mask) {
      const v = this.#vals[i]!;
      if (v === EMPTY || this.#keys[i] === k) return v;
    }
  }

  set(k: number, v: number): void {
    if ((this.size + 1) * 2 > this.#vals.length) this.#rehash(this.#vals.length * 2);
    let i = this.#home(k);
    while (this.#vals[i] !== EMPTY && this.#keys[i] !== k) i = (i + 1) & this.#mask;
    if (this.#vals[i] === EMPTY) this.size++;
    this.#keys[i] = k;
    this.#vals[i] = v;
  }

  delete(k: number): void {
    let i = this.#home(k);
    for (;;) {
      const v = this.#vals[i];
      if (v === EMPTY) return;
      if (this.#keys[i] === k) break;
      i = (i + 1) & this.#mask;
    }
    this.size--;
    // Move back each later entry of the cluster whose home is not in (hole, its place].
    for (let j = (i + 1) & this.#mask; this.#vals[j] !== EMPTY; j = (j + 1) & this.#mask) {
      const h = this.#home(this.#keys[j]!);
      if (j > i ? h <= i || h > j : h <= i && h > j) {
        this.#keys[i] = this.#keys[j]!;
        this.#vals[i] = this.#vals[j]!;
        i = j;
      }
    }
    this.#vals[i] = EMPTY;
  }

  #rehash(n: number): void {
    const keys = this.#keys;
    const vals = this.#vals;
    this.#keys = new Float64Array(n);
    this.#vals = new Int32Array(n).fill(EMPTY);
    this.#mask = n - 1;
    this.size = 0;
    for (let i = 0; i < vals.length; i++) if (vals[i] !== EMPTY) this.set(keys[i]!, vals[i]!);
  }
}

export class Iotlb {
  readonly capacity: number;
  // LRU as a doubly linked list of slots in typed arrays, with an index from key to slot: a
  // hit moves its slot to the tail and an eviction takes the head, both O(1).
  // (A Map's own order as the LRU, with delete + set per hit, left a hole per hit that the
  // evicting keys().next() walked over: microseconds per page once the IOTLB was full.)
  #slot = new KeyIndex();
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
    if (s !== EMPTY) {
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
    if (s === EMPTY) return this.insertMissedAt(sid, page, frame);
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
      for (let s = this.#head; s !== NONE;) {
        const next = this.#next[s]!;
        const va = Math.floor(this.#key[s]! / SIDS) * FRAME;
        if (va >= first && va < end) {
          this.#drop(s);
          n++;
        }
        s = next;
      }
    } else {
      for (let va = first; va < end; va += pageSize) {
        for (const sid of this.#sids) {
          const s = this.#slot.get((va / FRAME) * SIDS + sid);
          if (s !== EMPTY) {
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
    if (s === EMPTY) return false;
    this.#drop(s);
    this.invalidations++;
    return true;
  }

  invalidateStream(sid: number): void {
    for (let s = this.#head; s !== NONE;) {
      const next = this.#next[s]!;
      if (this.#key[s]! % SIDS === sid % SIDS) this.#drop(s);
      s = next;
    }
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
