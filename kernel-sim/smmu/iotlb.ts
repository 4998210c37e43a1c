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

/** How the pages of a run stand in the kernel's page table (the SMMU reads it natively, per run). */
export interface RunPages {
  /** The first granule at or after granule `q` whose page-table entry is not present, or -1. */
  absentFrom(q: number): number;
  /** The frame of granule q's first page (0: hidden by the kernel); asked in increasing q, all before the run's stop. */
  frame(q: number): number;
}

/** What accessRun did. */
export interface RunOutcome {
  /** Blocks that translated (before the fault, if any). */
  blocks: number;
  /** Blocks that walked at least one granule (the faulting one included), and the granules walked. */
  walks: number;
  pagesWalked: number;
  /** The granule (index from the region's start) that faulted in block `blocks`, or -1. */
  fault: number;
}

/** What accessRun knows of its run between its steps (see Iotlb.accessRun). */
interface RunState {
  sid: number;
  base: number;
  offset: number;
  end: number;
  blockSize: number;
  g: number;
  /** Blocks of the run. */
  nb: number;
  pages: RunPages;
  spans: number[];
  out: RunOutcome;
  /** Granules of the run cached before it, ascending, and the next one to look at. */
  cand: number[];
  ci: number;
  /** The first push still cached (or a later one). */
  pf: number;
  /** Entries before the run, not hit by it (the list's head part). */
  untouched: number;
  /** Entries cached, counting the pushes not materialized yet. */
  size: number;
  inserted: boolean;
  /** The last granule of the block before, and its push when a hit on a slot (-1: a miss pushed last). */
  prevL: number;
  prevSeg: number;
  /** The granules of the current block that hit. */
  hitQ: number[];
}

// A run's block j: its first and last granules; the block granule q falls in.
const firstOf = (st: RunState, j: number): number => Math.floor((st.offset + j * st.blockSize) / st.g);
const lastOf = (st: RunState, j: number): number => Math.floor((Math.min(st.offset + (j + 1) * st.blockSize, st.end) - 1) / st.g);
const blockOf = (st: RunState, q: number): number => Math.floor((q * st.g - st.offset) / st.blockSize);

// Count `count` more blocks that walked `walked` pages each into spans' (count, walked) pairs.
function span(count: number, walked: number, spans: number[]): void {
  if (count <= 0) return;
  const n = spans.length;
  if (n && spans[n - 1] === walked) spans[n - 2]! += count;
  else spans.push(count, walked);
}

/** The SMMU's IOTLB: cached translations per stream, invalidated when pages are evicted or move. */
export class Iotlb {
  /** Most entries held. */
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
  // accessRun's pushes (see there): segments of granules [q, q+n), a cached slot or -1 (not materialized yet).
  #pQ: number[] = [];
  #pN: number[] = [];
  #pSlot: number[] = [];
  /** Lookups that found a translation. */
  hits = 0;
  /** Lookups that did not. */
  misses = 0;
  /** Entries invalidated. */
  invalidations = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** True if the page's translation is cached (counts a hit or a miss). */
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

  /** Cache the page's translation (to `frame`). */
  insert(sid: number, page: bigint, frame = 0): void {
    this.insertAt(sid, Number(page), frame);
  }

  /** Cache a translation by page number. */
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

  /**
   * The IOTLB accesses of a run of blocks by one stream, exactly as translate() block by block
   * does them (per block: a lookupAt per granule in order, then for the granules that missed a
   * walk and an insertMissedAt each, in order, stopping at the first that is not resident), but
   * with work per run, not per page: O(C + k) for capacity C and k special granules (cached
   * before the run, the fault, a granule shared by two blocks).
   *
   * Under LRU a run of distinct granules has a closed form. The list is always [entries the run
   * has not touched, in their old order] ++ [the run's pushes, in push order]: a hit moves an
   * entry to the end, a miss appends its granule, and each miss on a full IOTLB evicts the head,
   * the untouched entries first, then the run's own earliest pushes. So misses are appended a
   * stretch at a time as granule ranges, evictions from the pushes advance over those ranges,
   * and only the pushes still cached at the end are made entries (with their frames): at most C.
   *
   * Granule q lies at region offset q × g (IOTLB page base + q × g). `spans` gets (count, pages
   * walked) pairs, one per stretch of blocks that walked as many pages each (0: an IOTLB hit).
   */
  accessRun(sid: number, base: number, offset: number, length: number, blockSize: number, g: number, pages: RunPages, spans: number[]): RunOutcome {
    const end = offset + length;
    const nb = Math.ceil(length / blockSize);
    const out: RunOutcome = { blocks: 0, walks: 0, pagesWalked: 0, fault: -1 };
    if (nb === 0) return out;
    // Blocks that never share a granule: stretches of blocks with no cached granule and no
    // absent one are appended whole, with no work per block.
    const regular = nb === 1 || (offset % g === 0 && blockSize % g === 0);
    if (regular && this.#hitAll(sid, base, g, Math.floor(offset / g), Math.floor((end - 1) / g))) {
      // A run read again (a buffer written over and over): every granule hit, in order.
      span(nb, 0, spans);
      out.blocks = nb;
      return out;
    }
    this.#pQ.length = this.#pN.length = this.#pSlot.length = 0;
    const st: RunState = {
      sid,
      base,
      offset,
      end,
      blockSize,
      g,
      nb,
      pages,
      spans,
      out,
      cand: this.#cachedIn(sid, base, g, Math.floor(offset / g), Math.floor((end - 1) / g)),
      ci: 0,
      pf: 0,
      untouched: this.#slot.size,
      size: this.#slot.size,
      inserted: false,
      prevL: -1,
      prevSeg: -1,
      hitQ: [],
    };
    for (let j = 0; j < nb;) {
      if (regular) {
        const jn = this.#regularStretch(st, j);
        if (jn > j) {
          j = jn;
          continue;
        }
      }
      if (!this.#oneBlock(st, j)) break;
      j++;
    }
    if (out.fault < 0) out.blocks = nb;
    this.#materialize(st);
    if (st.inserted && sid !== this.#lastSid) {
      this.#sids.add(sid % SIDS);
      this.#lastSid = sid;
    }
    return out;
  }

  // Evict the x least recently used: untouched entries first, then the earliest pushes.
  #evict(st: RunState, x: number): void {
    const pN = this.#pN;
    const pSlot = this.#pSlot;
    for (; x > 0 && st.untouched > 0; x--, st.untouched--) this.#drop(this.#head);
    while (x > 0) {
      const n = pN[st.pf]!;
      if (n === 0) st.pf++;
      else if (pSlot[st.pf]! >= 0) {
        this.#drop(pSlot[st.pf]!);
        pN[st.pf++] = 0;
        x--;
      } else {
        const t = Math.min(n, x);
        this.#pQ[st.pf]! += t;
        pN[st.pf] = n - t;
        x -= t;
      }
    }
  }

  // Granules [q, q+m) missed and were walked: insertMissedAt each, in order.
  #pushMisses(st: RunState, q: number, m: number): void {
    const cap = this.capacity;
    const pQ = this.#pQ;
    const pN = this.#pN;
    const pSlot = this.#pSlot;
    st.inserted = true;
    if (cap === 0 || m === 0) return;
    const free = cap - st.size;
    if (m > free) {
      const existing = st.size;
      this.#evict(st, Math.min(m - free, existing));
      // More misses than the IOTLB holds: the stretch's own first ones were evicted by its last.
      if (m - free > existing) [q, m] = [q + m - cap, cap];
    }
    st.size = Math.min(cap, st.size + m);
    const last = pQ.length - 1;
    if (last >= st.pf && pSlot[last]! < 0 && pN[last]! > 0 && pQ[last]! + pN[last]! === q) pN[last]! += m;
    else {
      pQ.push(q);
      pN.push(m);
      pSlot.push(-1);
    }
  }

  // A hit on slot s (granule q): it moves to the end. Returns its push.
  #pushHit(q: number, s: number): number {
    this.#toTail(s);
    this.#pQ.push(q);
    this.#pN.push(1);
    return this.#pSlot.push(s) - 1;
  }

  // Blocks j.. of a regular run up to the next with a cached or absent granule: appended whole
  // as one stretch of misses. Returns the block after the stretch (j if there is none).
  #regularStretch(st: RunState, j: number): number {
    const { cand, nb, out, spans } = st;
    const f = firstOf(st, j);
    while (st.ci < cand.length && cand[st.ci]! < f) st.ci++;
    let jn = nb;
    if (st.ci < cand.length) jn = Math.min(jn, blockOf(st, cand[st.ci]!));
    const a = st.pages.absentFrom(f);
    if (a >= 0) jn = Math.min(jn, blockOf(st, a));
    if (jn <= j) return j;
    const l = lastOf(st, jn - 1);
    const full = jn === nb ? jn - 1 - j : jn - j;
    span(full, st.blockSize / st.g, spans);
    if (jn === nb) span(1, l - firstOf(st, nb - 1) + 1, spans);
    this.misses += l - f + 1;
    out.walks += jn - j;
    out.pagesWalked += l - f + 1;
    this.#pushMisses(st, f, l - f + 1);
    st.prevL = l;
    st.prevSeg = -1;
    return jn;
  }

  // One block: its lookups in order (hits move to the end at once), then its misses. False if
  // it faulted (the run ends there).
  #oneBlock(st: RunState, j: number): boolean {
    const { sid, base, g, cand, hitQ } = st;
    const f = firstOf(st, j);
    const l = lastOf(st, j);
    hitQ.length = 0;
    let lSeg = -1; // the push of granule l, if a hit on a slot
    let q = f;
    if (f === st.prevL) {
      q = f + 1;
      if (st.prevSeg < 0) {
        // The previous block's last push: still at the end (a no-op move), unless nothing is cached.
        if (this.capacity > 0) hitQ.push(f);
      } else {
        const s = this.#slot.get(keyAt(sid, base + f * g));
        if (s !== EMPTY) {
          this.#pN[st.prevSeg] = 0; // moves from there to the end
          lSeg = this.#pushHit(f, s);
          hitQ.push(f);
        }
      }
    }
    while (st.ci < cand.length && cand[st.ci]! < q) st.ci++;
    for (; st.ci < cand.length && cand[st.ci]! <= l; st.ci++) {
      const c = cand[st.ci]!;
      const s = this.#slot.get(keyAt(sid, base + c * g));
      if (s === EMPTY) continue; // evicted earlier in the run
      st.untouched--;
      lSeg = this.#pushHit(c, s);
      hitQ.push(c);
    }
    const missing = l - f + 1 - hitQ.length;
    this.hits += hitQ.length;
    this.misses += missing;
    if (missing > 0 && !this.#blockMisses(st, j, f, l, missing)) return false;
    span(1, missing, st.spans);
    st.prevL = l;
    // l's push, if l hit on a slot (lSeg was set by a hit on l itself, the last of the block's hits).
    st.prevSeg = hitQ[hitQ.length - 1] === l ? lSeg : -1;
    return true;
  }

  // Block j's `missing` granules of [f, l] walked and pushed in order, up to the first that is
  // not resident (a cached one is not walked). False if there is one: the run's fault.
  #blockMisses(st: RunState, j: number, f: number, l: number, missing: number): boolean {
    const { out, hitQ, pages } = st;
    out.walks++;
    out.pagesWalked += missing;
    let a: number;
    for (let x = f; ;) {
      a = pages.absentFrom(x);
      if (a < 0 || a > l) {
        a = -1;
        break;
      }
      if (!hitQ.includes(a)) break;
      x = a + 1;
    }
    const stop = a < 0 ? l + 1 : a;
    let p = f;
    for (const h of hitQ) {
      if (h >= stop) break;
      this.#pushMisses(st, p, h - p);
      p = h + 1;
    }
    if (stop > p) this.#pushMisses(st, p, stop - p);
    if (a < 0) return true;
    out.blocks = j;
    out.fault = a;
    return false;
  }

  // Make entries of the pushes still cached, in push order, after the untouched ones. The hits
  // before the first miss kept are in place already (each moved to the end when hit).
  #materialize(st: RunState): void {
    const pQ = this.#pQ;
    const pN = this.#pN;
    const pSlot = this.#pSlot;
    let made = false;
    for (let i = st.pf; i < pQ.length; i++) {
      const n = pN[i]!;
      if (n === 0) continue;
      if (pSlot[i]! >= 0) {
        if (made) this.#toTail(pSlot[i]!);
        continue;
      }
      made = true;
      for (let q = pQ[i]!; q < pQ[i]! + n; q++) {
        const k = keyAt(st.sid, st.base + q * st.g);
        const s = this.#alloc();
        this.#key[s] = k;
        this.#frame[s] = st.pages.frame(q);
        this.#slot.set(k, s);
        this.#link(s);
      }
    }
  }

  // If granules q0..q1 of this stream are all cached and lie in that order next to each other
  // in the LRU list (as a run leaves them), the run's lookups are all hits and, one after the
  // other, move them to the end in that order: one splice of the list, counted as q1-q0+1 hits,
  // with no work per granule but a comparison. False (nothing changed) otherwise.
  #hitAll(sid: number, base: number, g: number, q0: number, q1: number): boolean {
    const first = this.#slot.get(keyAt(sid, base + q0 * g));
    if (first === EMPTY) return false;
    let last = first;
    for (let q = q0 + 1; q <= q1; q++) {
      const s = this.#next[last]!;
      if (s === NONE || this.#key[s] !== keyAt(sid, base + q * g)) return false;
      last = s;
    }
    if (last !== this.#tail) {
      const p = this.#prev[first]!;
      const n = this.#next[last]!;
      if (p === NONE) this.#head = n;
      else this.#next[p] = n;
      this.#prev[n] = p;
      this.#next[this.#tail] = first;
      this.#prev[first] = this.#tail;
      this.#next[last] = NONE;
      this.#tail = last;
    }
    this.hits += q1 - q0 + 1;
    return true;
  }

  // Granules in [q0, q1] this stream has cached (at granule boundaries: no other is looked up),
  // ascending: by lookup when the range is shorter than the IOTLB, else by a pass over it.
  #cachedIn(sid: number, base: number, g: number, q0: number, q1: number): number[] {
    const out: number[] = [];
    if (this.#slot.size === 0) return out;
    if (q1 - q0 < this.#slot.size) {
      for (let q = q0; q <= q1; q++) if (this.#slot.get(keyAt(sid, base + q * g)) !== EMPTY) out.push(q);
      return out;
    }
    const lo = base + q0 * g;
    const hi = base + q1 * g;
    for (let s = this.#head; s !== NONE; s = this.#next[s]!) {
      const k = this.#key[s]!;
      if (k % SIDS !== sid % SIDS) continue;
      const va = Math.floor(k / SIDS) * FRAME;
      if (va >= lo && va <= hi && (va - base) % g === 0) out.push((va - base) / g);
    }
    return out.sort((x, y) => x - y);
  }

  /** Drop every cached page of [start, start+length) for all streams. */
  invalidateRange(start: bigint, length: number, pageSize: number): number {
    // Nothing cached: nothing to drop (and no page-by-page walk of a huge range, an implicit MR's).
    if (this.#slot.size === 0) return 0;
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
  entriesIn(
    start: bigint,
    length: number,
  ): Array<{
    /** StreamID. */
    sid: number;
    /** Page number. */
    page: bigint;
    /** Frame the cached translation points to. */
    frame: number;
  }> {
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

  /** Drop every translation of a stream. */
  invalidateStream(sid: number): void {
    for (let s = this.#head; s !== NONE;) {
      const next = this.#next[s]!;
      if (this.#key[s]! % SIDS === sid % SIDS) this.#drop(s);
      s = next;
    }
  }

  /** Entries cached now. */
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
