// EDM's DM-Handler on userfaultfd: serves the page faults of a remote-paged region from a page
// store, and keeps the resident pages between two watermarks with an eviction worker (LPET).
// It runs in a worker_thread (see pager.ts): every thread of the process, the main JS thread
// included, may fault on the region and simply waits for its page, because the thread that
// resolves faults never touches the region's missing pages itself.
//
// A fault, step by step: the worker's userfaultfd reports it; a page being evicted is waited
// for; at the high watermark the eviction worker is woken; the page joins the next batch of
// fetches (every fault of one delivery, plus the window the prefetcher plans from the region's
// stream, prefetch.ts, in one store request); a
// page never stored is resolved with UFFDIO_ZEROPAGE without asking the store, a stored one
// with UFFDIO_COPY of its checked bytes (write-protected: dirty tracking); the copy wakes
// every thread waiting on it. A stored page the store no longer has, or answers wrongly for
// (another page, an older write, bytes that fail the checksum), fails its access.
//
// Dirty pages: with UFFD_FEATURE_WP_ASYNC (6.7) the kernel clears the protection on the first
// write by itself and PAGEMAP_SCAN reports the pages written ('wp-async'); on older kernels
// the first write is a write-protect fault the handler records ('wp-sync', as UMap does).
// Eviction ('wp-async' also needs UFFDIO_MOVE, 6.8): the victim is moved out of the region
// into a staging page in one step, so a racing access faults and waits for the eviction
// instead of writing into a page on its way out; its bytes are written to the store and
// acknowledged before the staging page is dropped. A page the scan calls clean is checked
// against the checksum it was placed with (a write between the scan and the move would
// otherwise be lost) and dropped without a write when it matches. 'wp-sync' write-protects
// the victim instead of moving it, so a racing write waits in its fault.
import { writeSync } from 'node:fs';
import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';
import { PfrError } from '../errors.js';
import { mapRegion, Region, type SharedRegion } from '../region.js';
import { UffdFeature, Userfaultfd, type Fault } from '../uffd.js';
import { ResidentPageTable } from './lspt.js';
import { Counter, type Counters } from './counters.js';
import { Prefetcher } from './prefetch.js';
import {
  corruptPage,
  EmbeddedStore,
  encodePage,
  instanceSeed,
  pageCrc,
  readStoredPages,
  ReadStatus,
  TRAILER,
  type PageReads,
  type PageStore,
  type StoredPage,
} from './store.js';
import { RedisStore, type RedisStoreOptions } from './redis-store.js';
import { MemoryServerStore, type MemoryServerStoreOptions } from './memory-server-store.js';

/** How dirty pages are found: asynchronous write-protect with PAGEMAP_SCAN (6.7), or write-protect faults. */
export type DirtyTracking = 'wp-async' | 'wp-sync';

/** What the pager hands the worker (plain data: it crosses threads). */
export interface DmHandlerConfig {
  region: SharedRegion;
  pageSize: number;
  highPages: number;
  lowPages: number;
  prefetch: number;
  fillWorkers: number;
  evictWorkers: number;
  evictBatch: number;
  timeoutMs: number;
  tracking: DirtyTracking;
  store: { kind: 'embedded' } | { kind: 'redis'; options: RedisStoreOptions } | { kind: 'server'; options: MemoryServerStoreOptions };
  /** This pager instance's key prefix (application prefix and instance id): the keys' and the checksums' own. */
  keyPrefix: string;
  /** Leave the keys in the store at close. */
  persist: boolean;
  counters: SharedArrayBuffer;
  /** Trace events the handler keeps (the newest; 0: no trace). */
  traceEvents: number;
}

/**
 * One event of the DM-Handler's trace, in Chrome's trace-event layout: ts and dur in µs since
 * the epoch (performance.timeOrigin + now(), the same clock in every thread); tid the thread
 * that faulted (an OS thread id), or 0 for the DM-Handler's own spans, each on its `track`.
 */
export interface DmTraceEvent {
  /**
   * On a faulting thread: 'fault', from the fault's receipt to its resolution (args.kind: major,
   * first touch: zero page, minor: page in flight, minor: placed before its fault,
   * eviction-wait, write-protect; args.batch: the fetch batch that resolved it). On the
   * DM-Handler's tracks: 'fetch' (a batch: args.pages, faults, batch) with its 'store read' and
   * 'place and wake'; 'evict' (args.pages, writtenBack, victims) with its 'take out',
   * 'write-back' (args.pages, bytes) and 'drop'; 'flush' with its 'write-back'.
   */
  name: string;
  /** 'X': a span of `dur`. */
  ph: 'X';
  /** µs since the epoch. */
  ts: number;
  /** µs. */
  dur: number;
  /** The faulting thread, or 0: the DM-Handler's worker (then `track` says which of its workers). */
  tid: number;
  /** tid 0: 'fill N' (the N-th fetch in flight at once: fillWorkers of them), 'evict N' (eviction worker N), 'flush'. */
  track?: string;
  /** Page numbers and counts. */
  args: Record<string, number | string>;
}

const nowUs = (): number => (performance.timeOrigin + performance.now()) * 1000;
// A time of this thread's performance clock (ms) in µs since the epoch.
const epochUs = (ms: number): number => (performance.timeOrigin + ms) * 1000;

/** What close() did with the pager's keys. */
export interface CloseResult {
  /** Keys of this pager the store deleted. */
  keysDeleted: number;
  /** Keys left in the store: kept (persist), or the store could not be reached. */
  keysLeft: number;
}

interface Batch {
  /** Every page of the batch: the faulting ones, then the ones read ahead (sorted before the fetch). */
  pages: number[];
  /** The pages some thread faulted on, when each fault was received, and by which thread (the main JS thread's id is the process id). */
  faults: number[];
  receivedAt: number[];
  threads: number[];
  /** Its number, for the trace (the faults it resolves name it). */
  id: number;
  /** When its pages were woken (µs since the epoch; traced only): where its faults' spans end. */
  wokenAt?: number;
  settled: Promise<void>;
  done: () => void;
}

/** Latency of one kind of store request. */
export interface LatencySummary {
  /** Requests measured. */
  count: number;
  /** Median, µs. */
  p50Us: number;
  /** 99th percentile, µs. */
  p99Us: number;
  /** Largest, µs. */
  maxUs: number;
}

export class DmHandler {
  readonly tracking: DirtyTracking;
  #cfg: DmHandlerConfig;
  #uffd: Userfaultfd;
  #region: Region;
  #staging: Region | undefined;
  #store: PageStore;
  #lspt = new ResidentPageTable();
  #counters: Counters;
  #pending: Batch | undefined;
  #queued: Batch[] = [];
  #fills = 0;
  #evictor: Promise<void> | undefined;
  // One eviction at a time per group of staging slots (an eviction worker's).
  #slots: Promise<unknown>[] = [];
  #closed = false;
  #refused: PfrError | undefined; // why the store last refused an eviction
  #onError: (err: PfrError) => void;
  #seed: number;
  #zeroCrc: number;
  #zeros: Uint8Array;
  #base: number; // the region's address, as a number (user addresses fit in 53 bits)
  #reads: PageReads[] = [];
  #prefetch: Prefetcher;
  readonly major: RecordableHistogram = createHistogram();
  readonly minor: RecordableHistogram = createHistogram();

  private constructor(cfg: DmHandlerConfig, store: PageStore, onError: (err: PfrError) => void) {
    this.#cfg = cfg;
    this.tracking = cfg.tracking;
    this.#store = store;
    this.#onError = onError;
    this.#counters = new BigInt64Array(cfg.counters);
    this.#zeros = new Uint8Array(cfg.pageSize);
    this.#seed = instanceSeed(cfg.keyPrefix);
    this.#zeroCrc = pageCrc(this.#seed, this.#zeros);
    this.#region = Region.attach(cfg.region);
    this.#base = Number(this.#region.address);
    this.#prefetch = new Prefetcher(this.#region.size / cfg.pageSize, cfg.prefetch, (n) => this.#add(Counter.prefetchUsed, n));
    const features = cfg.tracking === 'wp-async' ? UffdFeature.WP_ASYNC : 0n;
    // The store's timeout ends a fetch first; the uffd's watchdog is the last resort.
    this.#uffd = Userfaultfd.open({ features, timeoutMs: cfg.timeoutMs * 3 + 1000, handler: (f) => this.#onFault(f) });
    this.#uffd.on('error', (err) => this.#report(err));
    this.#uffd.on('remove', (e) => this.#onRemove(e.address, e.length));
    this.#uffd.register(this.#region, { missing: true, writeProtect: true });
    if (cfg.tracking === 'wp-async') {
      if (!this.#uffd.features.writeProtectAsync || !this.#uffd.features.move) {
        throw new PfrError(
          'ERR_PFR_UNSUPPORTED',
          "remote paging: dirtyTracking 'wp-async' needs WP_ASYNC (Linux 6.7) and UFFDIO_MOVE (6.8); use 'wp-sync'",
        );
      }
      this.#uffd.writeProtect(this.#region, 0, this.#region.size, true);
      this.#staging = mapRegion(cfg.evictWorkers * cfg.evictBatch * cfg.pageSize);
      this.#uffd.register(this.#staging);
    }
  }

  static async start(cfg: DmHandlerConfig, onError: (err: PfrError) => void): Promise<DmHandler> {
    const store =
      cfg.store.kind === 'redis'
        ? await RedisStore.connect({ timeoutMs: cfg.timeoutMs, ...cfg.store.options, prefix: cfg.keyPrefix })
        : cfg.store.kind === 'server'
          ? await MemoryServerStore.connect({ timeoutMs: cfg.timeoutMs, ...cfg.store.options, namespace: cfg.keyPrefix })
          : new EmbeddedStore();
    return new DmHandler(cfg, store, onError);
  }

  get #ps(): number {
    return this.#cfg.pageSize;
  }

  #address(page: number): bigint {
    return this.#region.address + BigInt(page * this.#ps);
  }

  // EDM stores a page under its address (the store adds the instance's prefix).
  #key(page: number): string {
    return this.#address(page).toString(16);
  }

  #add(c: Counter, n = 1): void {
    Atomics.add(this.#counters, c, BigInt(n));
  }

  #get(c: Counter): number {
    return Number(Atomics.load(this.#counters, c));
  }

  #setResident(): void {
    Atomics.store(this.#counters, Counter.resident, BigInt(this.#lspt.resident));
  }

  #report(err: PfrError): void {
    this.#add(Counter.errors);
    this.#onError(err);
  }

  // ---- faults -------------------------------------------------------------------------

  // The trace: a ring of the newest cfg.traceEvents events.
  #trace: DmTraceEvent[] = [];
  #traceNext = 0;
  #traceDropped = 0;

  #event(e: DmTraceEvent): void {
    const limit = this.#cfg.traceEvents;
    if (limit <= 0) return;
    if (this.#trace.length < limit) this.#trace.push(e);
    else {
      this.#trace[this.#traceNext] = e;
      this.#traceNext = (this.#traceNext + 1) % limit;
      this.#traceDropped++;
    }
  }

  /** The events kept, oldest first, and how many older ones the ring dropped. */
  trace(): { events: DmTraceEvent[]; dropped: number } {
    return { events: [...this.#trace.slice(this.#traceNext), ...this.#trace.slice(0, this.#traceNext)], dropped: this.#traceDropped };
  }

  get #tracing(): boolean {
    return this.#cfg.traceEvents > 0;
  }

  // A span of the DM-Handler's `track` from t0 (µs since the epoch) to now.
  #span(name: string, track: string, t0: number, args: Record<string, number | string>): void {
    this.#event({ name, ph: 'X', ts: t0, dur: nowUs() - t0, tid: 0, track, args });
  }

  // `done` (the fault's resolution), traced as a span of the faulting thread from the fault's
  // receipt to it: to its batch's wake when a fetch resolves it (the thread runs on from there).
  #traced<T>(f: Fault, page: number, kind: string, done: Promise<T>, batch = this.#batchOf.get(done)): Promise<T> {
    if (!this.#tracing) return done;
    const emit = (): void => {
      const ts = epochUs(f.receivedAt);
      const end = batch?.wokenAt ?? nowUs();
      this.#event({
        name: 'fault',
        ph: 'X',
        ts,
        dur: Math.max(0, end - ts),
        tid: f.threadId,
        args: { kind, page, ...(batch ? { batch: batch.id } : {}) },
      });
    };
    done.then(emit, emit);
    return done;
  }

  // The fill tracks in use (a fetch takes the lowest free one: at most fillWorkers at once).
  #fillTracks: boolean[] = [];
  // A fetch's batch by its settled promise (traced only): a fault on a page in flight ends with that batch's wake.
  #batchOf = new WeakMap<Promise<unknown>, Batch>();
  #batches = 0;

  async #onFault(f: Fault): Promise<void> {
    if (f.region !== this.#region) {
      this.#uffd.resolveDefault(f); // the staging area is only ever touched when resident
      return;
    }
    const page = Math.floor(f.offset / this.#ps);
    if (f.kind === 'write-protect') return this.#traced(f, page, 'write-protect', this.#onWrite(page));
    this.#add(Counter.faults);
    let e = this.#lspt.get(page);
    if (e?.state === 'fetching') {
      this.#add(Counter.minorFaults); // coalesced: that fetch's copy wakes this thread too
      return this.#traced(f, page, 'minor: page in flight', e.settled ?? Promise.resolve());
    }
    if (e?.state === 'evicting') {
      await this.#traced(f, page, 'eviction-wait', e.settled ?? Promise.resolve());
      e = this.#lspt.get(page);
      if (e?.state === 'resident') {
        this.#wake(page); // the write-back failed and the page came back
        return;
      }
    }
    if (e?.state === 'resident') {
      if (this.#region.residentPages(page * this.#ps, this.#ps) === this.#ps / this.#region.pageSize) {
        this.#add(Counter.minorFaults); // a fault reported before its page was placed: nothing to fetch
        this.#wake(page);
        return this.#traced(f, page, 'minor: placed before its fault', Promise.resolve());
      }
      this.#lspt.drop(page); // dropped behind the table's back (e.g. evict() on the region)
    }
    // A page the store never held comes back as the zero page (counted minor), without the store.
    const kind = this.#lspt.storedVersion(page) === undefined ? 'first touch: zero page' : 'major';
    const b = this.#queueFetch(page, f.receivedAt, f.threadId);
    return this.#traced(f, page, kind, b.settled, b);
  }

  // 'wp-sync': the first write to a page placed write-protected.
  async #onWrite(page: number): Promise<void> {
    const e = this.#lspt.get(page);
    if (e?.state === 'evicting') {
      await e.settled; // gone (the writer faults again, on a missing page) or back, unprotected
      this.#wake(page);
      return;
    }
    this.#lspt.markDirty(page);
    this.#prefetch.written(page);
    this.#uffd.writeProtect(this.#region, page * this.#ps, this.#ps, false);
  }

  #wake(page: number): void {
    if (!this.#closed) this.#uffd.wake(this.#region, page * this.#ps, this.#ps);
  }

  #onRemove(address: bigint, length: number): void {
    const start = address - this.#region.address;
    if (start < 0n || start >= BigInt(this.#region.size)) return; // the staging area
    const first = Math.floor(Number(start) / this.#ps),
      last = Math.ceil((Number(start) + length) / this.#ps);
    for (let p = first; p < last; p++) {
      if (this.#lspt.get(p)?.state === 'resident') this.#lspt.drop(p);
      this.#prefetch.gone(p);
    }
    this.#setResident();
  }

  #queueFetch(page: number, receivedAt: number, thread: number): Batch {
    let b = this.#pending;
    if (!b) {
      let done!: () => void;
      const settled = new Promise<void>((r) => (done = r));
      b = this.#pending = { pages: [], faults: [], receivedAt: [], threads: [], id: ++this.#batches, settled, done };
      if (this.#tracing) this.#batchOf.set(settled, b);
      // Every fault of this delivery joins the batch: one store request for all of them.
      queueMicrotask(() => this.#startBatch());
    }
    b.pages.push(page);
    b.faults.push(page);
    b.receivedAt.push(receivedAt);
    b.threads.push(thread);
    this.#lspt.fetching(page, b.settled);
    return b;
  }

  #startBatch(): void {
    const b = this.#pending!;
    this.#pending = undefined;
    const total = this.#region.size / this.#ps;
    // In the order they came: the prefetcher follows the region's stream.
    for (const p of b.faults) {
      for (const q of this.#prefetch.onFault(p, total)) {
        if (this.#lspt.get(q)) continue;
        b.pages.push(q);
        this.#lspt.fetching(q, b.settled);
      }
    }
    if (this.#fills >= this.#cfg.fillWorkers) this.#queued.push(b);
    else void this.#fill(b);
  }

  // A PageReads for a fetch of up to n pages (one per fill in flight, reused).
  #takeReads(n: number): PageReads {
    const r = this.#reads.pop();
    if (r && r.addresses.length >= n) return r;
    const size = Math.max(n, 64);
    return {
      count: 0,
      addresses: new Float64Array(size),
      versions: new Float64Array(size),
      seed: this.#seed,
      pageSize: this.#ps,
      out: Buffer.allocUnsafe(size * this.#ps),
      status: new Int32Array(size),
      crcs: new Uint32Array(size),
      detail: new Float64Array(2 * size),
      messages: undefined,
    };
  }

  async #fill(b: Batch): Promise<void> {
    if (!this.#tracing) return this.#fillBatch(b, undefined);
    const t0 = nowUs();
    let k = this.#fillTracks.indexOf(false);
    if (k < 0) k = this.#fillTracks.push(false) - 1;
    this.#fillTracks[k] = true;
    const track = `fill ${k}`;
    try {
      await this.#fillBatch(b, track);
    } finally {
      this.#fillTracks[k] = false;
      this.#span('fetch', track, t0, { batch: b.id, pages: b.pages.length, faults: b.faults.length, first: b.pages[0] ?? -1 });
    }
  }

  async #fillBatch(b: Batch, track: string | undefined): Promise<void> {
    this.#fills++;
    if (this.#lspt.resident >= this.#cfg.highPages) this.#wakeEvictor();
    b.pages.sort((x, y) => x - y);
    const r = this.#takeReads(b.pages.length);
    try {
      // Only pages the store holds are asked for: a page never stored is the zero page.
      let n = 0;
      for (const page of b.pages) {
        const version = this.#lspt.storedVersion(page);
        if (version === undefined) continue;
        r.addresses[n] = this.#base + page * this.#ps;
        r.versions[n++] = version;
      }
      r.count = n;
      r.messages = undefined;
      if (n) {
        const t1 = track ? nowUs() : 0;
        try {
          await readStoredPages(this.#store, r);
        } catch (err) {
          const e = asPfrError(err, 'ERR_PFR_STORE_UNAVAILABLE');
          r.status.fill(e.code === 'ERR_PFR_PAGE_CORRUPT' ? ReadStatus.SHAPE : ReadStatus.UNREACHABLE, 0, n);
          r.messages = new Array<string>(n).fill(e.message);
        } finally {
          if (track) this.#span('store read', track, t1, { pages: n });
        }
      }
      // Placed without waking, then woken at once: a thread woken by its page's copy would
      // run ahead into the next page of the batch before that one is placed.
      const t2 = track ? nowUs() : 0;
      this.#placeAll(b, r);
      this.#setResident(); // before the wake: whoever it releases sees the count
      if (!this.#closed && b.pages.length) {
        const lo = b.pages[0]!,
          hi = b.pages[b.pages.length - 1]! + 1;
        if (track) b.wokenAt = nowUs();
        this.#uffd.wake(this.#region, lo * this.#ps, (hi - lo) * this.#ps);
      }
      if (track) this.#span('place and wake', track, t2, { pages: b.pages.length, stored: n });
    } finally {
      this.#reads.push(r);
      this.#setResident();
      this.#fills--;
      b.done();
      const next = this.#queued.shift();
      if (next) void this.#fill(next);
      if (this.#lspt.resident > this.#cfg.highPages) this.#wakeEvictor();
    }
  }

  // Place a batch's pages (sorted), write-protected for dirty tracking, without waking: one
  // UFFDIO_COPY per run of consecutive pages straight from the fetch's buffer (a prefetch
  // window is one run), or of zeros for pages never stored. A page the store could not give
  // fails its faulting thread's access.
  #placeAll(b: Batch, r: PageReads): void {
    if (this.#closed) return;
    const ps = this.#ps;
    let fetched = 0,
      major = 0,
      prefetched = 0,
      minor = 0,
      corrupt = 0,
      lost = 0;
    // The run being gathered: its first page, its length, and where its bytes are (index in r.out; -1: zeros).
    let runPage = -1,
      runLen = 0,
      runAt = 0;
    const flush = (): void => {
      if (!runLen) return;
      const data = runAt < 0 ? this.#zeroRun(runLen) : r.out.subarray(runAt * ps, (runAt + runLen) * ps);
      try {
        this.#uffd.copy(this.#region, runPage * ps, data, { writeProtect: true, wake: false });
        for (let k = 0; k < runLen; k++) this.#placed(b, runPage + k, runAt < 0 ? this.#zeroCrc : r.crcs[runAt + k]!, runAt >= 0);
      } catch (err) {
        for (let k = 0; k < runLen; k++) this.#notPlaced(b, runPage + k, err);
      }
      runLen = 0;
    };
    const extend = (page: number, at: number): void => {
      if (runLen && page === runPage + runLen && (at < 0 ? runAt < 0 : runAt >= 0 && at === runAt + runLen)) return void runLen++;
      flush();
      runPage = page;
      runAt = at;
      runLen = 1;
    };
    let failed: Map<string, { code: 'ERR_PFR_STORE_UNAVAILABLE' | 'ERR_PFR_PAGE_CORRUPT'; pages: number[] }> | undefined;
    let i = 0; // the page's index in r
    for (const page of b.pages) {
      const version = this.#lspt.storedVersion(page);
      const faulting = b.faults.includes(page);
      if (version === undefined) {
        if (faulting) minor++;
        // Never stored: zeros, as EDM does, placed write-protected like any other page so its
        // first write counts. 'wp-async' protected the whole region while unpopulated, and
        // UFFDIO_ZEROPAGE refuses such a page (EEXIST on the protection marker) where
        // UFFDIO_COPY does not: copy zeros. 'wp-sync': UFFDIO_ZEROPAGE, then protect it.
        if (this.tracking === 'wp-async') extend(page, -1);
        else this.#zeroPage(b, page);
        continue;
      }
      const k = i++;
      const status = r.status[k]!;
      if (status === ReadStatus.OK) {
        extend(page, k);
        fetched++;
        if (faulting) major++;
        else {
          prefetched++;
          this.#prefetch.placed(page);
        }
      } else if (status === ReadStatus.LOST) {
        lost++;
        const where = this.#store instanceof RedisStore ? ` (key ${this.#store.fullKey(this.#key(page))})` : '';
        this.#notPlaced(
          b,
          page,
          new PfrError(
            'ERR_PFR_PAGE_LOST',
            `page 0x${this.#key(page)}: the store no longer holds it${where}, though it acknowledged write ${version} of it ` +
              '(restarted without persistence, flushed, or evicting keys: maxmemory-policy must be noeviction); the page is lost',
          ),
        );
      } else if (status <= ReadStatus.VERSION) {
        corrupt++;
        this.#notPlaced(b, page, corruptPage(status, { address: this.#address(page), version }, ps, r.detail.subarray(2 * k, 2 * k + 2)));
      } else {
        // The request failed as a whole (for this page's server): one error per cause, not per page.
        const shape = status === ReadStatus.SHAPE;
        const message = shape
          ? `remote paging: the store answered ${r.messages?.[k]}; they are not placed`
          : (r.messages?.[k] ?? 'the store did not answer');
        failed ??= new Map();
        const f = failed.get(message) ?? { code: shape ? 'ERR_PFR_PAGE_CORRUPT' : 'ERR_PFR_STORE_UNAVAILABLE', pages: [] };
        failed.set(message, f);
        f.pages.push(page);
        if (shape) corrupt++;
      }
    }
    flush();
    for (const [message, f] of failed ?? []) {
      const err = new PfrError(f.code, message);
      for (const page of f.pages) {
        this.#lspt.drop(page);
        const j = b.faults.indexOf(page);
        if (j >= 0) this.#failPage(page, b.threads[j]!, err, false);
      }
      this.#report(err);
    }
    this.#add(Counter.pagesFetched, fetched);
    this.#add(Counter.bytesIn, fetched * (ps + TRAILER));
    this.#add(Counter.majorFaults, major);
    this.#add(Counter.prefetched, prefetched);
    this.#add(Counter.minorFaults, minor);
    if (corrupt) this.#add(Counter.corrupt, corrupt);
    if (lost) this.#add(Counter.lost, lost);
  }

  // 'wp-sync': a page never stored is the zero page, then write-protected (protecting never wakes).
  #zeroPage(b: Batch, page: number): void {
    try {
      this.#uffd.zeropage(this.#region, page * this.#ps, this.#ps, { wake: false });
      this.#uffd.writeProtect(this.#region, page * this.#ps, this.#ps, true);
      this.#placed(b, page, this.#zeroCrc, false);
    } catch (err) {
      this.#notPlaced(b, page, err);
    }
  }

  // `pages` pages of zeros, the source of a run of never-stored pages.
  #zeroRun(pages: number): Uint8Array {
    if (this.#zeros.length < pages * this.#ps) this.#zeros = new Uint8Array(pages * this.#ps);
    return this.#zeros.subarray(0, pages * this.#ps);
  }

  #placed(b: Batch, page: number, crc: number, stored: boolean): void {
    this.#lspt.placed(page, crc);
    const j = b.faults.indexOf(page);
    if (j >= 0) (stored ? this.major : this.minor).record(Math.max(1, Math.round((performance.now() - b.receivedAt[j]!) * 1e6)));
  }

  #notPlaced(b: Batch, page: number, err: unknown): void {
    this.#lspt.drop(page);
    const j = b.faults.indexOf(page);
    if (j >= 0) this.#failPage(page, b.threads[j]!, err);
  }

  // A page that could not be had must not read as zeros: poison it, so the access fails
  // (SIGBUS), where the kernel has UFFDIO_POISON; else the zero page, reported.
  #failPage(page: number, thread: number, cause: unknown, report = true): void {
    const off = page * this.#ps;
    if (thread === process.pid) {
      // The main JS thread dies of the SIGBUS before any event reaches it: say why now.
      const why = cause instanceof Error ? cause.message : String(cause);
      writeSync(
        2,
        `pagefault-rdma: the main thread's page at 0x${(this.#region.address + BigInt(off)).toString(16)} could not be had (${why}); its access fails with SIGBUS\n`,
      );
    }
    try {
      if (this.#uffd.features.poison) {
        // UFFDIO_POISON refuses any PTE marker (EEXIST, 0 bytes), and a 'wp-async' dirty scan
        // leaves uffd-wp markers on pages already evicted: drop the marker first, without a
        // wake (the thread must wake to the poison, not fault again).
        this.#uffd.writeProtect(this.#region, off, this.#ps, false, { wake: false });
        // Woken with the rest of its batch (#fill): woken now, the thread could run on into the
        // next page of the batch, be woken again there by the batch's wake, and fault twice.
        if (this.#uffd.poison(this.#region, off, this.#ps, { wake: false }) !== this.#ps) {
          // Not poisoned: the woken thread faults again; say so rather than count it failed.
          this.#report(
            new PfrError('ERR_PFR_HANDLER_FAILED', `remote paging: the page at offset ${off} could not be poisoned (UFFDIO_POISON placed nothing)`),
          );
        } else {
          this.#add(Counter.poisoned);
        }
      } else {
        this.#uffd.zeropage(this.#region, off, this.#ps);
      }
    } catch {
      // closing: the unregister wakes the thread
    }
    if (report) this.#report(asPfrError(cause, 'ERR_PFR_STORE_UNAVAILABLE'));
  }

  // ---- eviction (LPET) --------------------------------------------------------------------

  #wakeEvictor(): void {
    if (this.#evictor || this.#closed) return;
    this.#evictor = this.#evictDown().finally(() => (this.#evictor = undefined));
  }

  async #evictDown(): Promise<void> {
    while (!this.#closed && this.#lspt.resident > this.#cfg.lowPages) {
      const runs: Promise<boolean>[] = [];
      for (let w = 0; w < this.#cfg.evictWorkers; w++) {
        const want = Math.min(this.#cfg.evictBatch, this.#lspt.resident - this.#cfg.lowPages);
        if (want <= 0) break;
        this.#scanDirty();
        const victims = this.#lspt.victims(want);
        if (!victims.length) break;
        runs.push(this.#inSlots(w, () => this.#evictBatch(victims, w * this.#cfg.evictBatch)));
      }
      if (!runs.length || !(await Promise.all(runs)).every(Boolean)) return; // a failed write-back: retried at the next fault
      // The store's writes are synchronous: let the faults that came meanwhile in between batches.
      await new Promise((r) => setImmediate(r));
    }
  }

  #inSlots<T>(w: number, fn: () => Promise<T>): Promise<T> {
    const run = (this.#slots[w] ?? Promise.resolve()).then(fn);
    this.#slots[w] = run.catch(() => undefined);
    return run;
  }

  // 'wp-async': what was written since the last scan is dirty; the scan re-arms it.
  #scanDirty(): void {
    if (this.tracking !== 'wp-async' || this.#closed) return;
    for (const off of this.#uffd.dirtyPages(this.#region)) {
      const page = Math.floor(off / this.#ps);
      this.#lspt.markDirty(page);
      this.#prefetch.written(page);
    }
  }

  /** Evict `victims` through staging slots from `slot` on; true if all went to the store. */
  async #evictBatch(victims: number[], slot: number): Promise<boolean> {
    if (!this.#tracing) return this.#evictVictims(victims, slot, undefined);
    const t0 = nowUs();
    // Eviction worker w uses the slots from w × evictBatch (evict() uses worker 0's).
    const track = `evict ${Math.floor(slot / this.#cfg.evictBatch)}`;
    const before = [this.#get(Counter.evicted), this.#get(Counter.writtenBack)];
    try {
      return await this.#evictVictims(victims, slot, track);
    } finally {
      const args = {
        pages: this.#get(Counter.evicted) - before[0]!,
        writtenBack: this.#get(Counter.writtenBack) - before[1]!,
        victims: victims.length,
      };
      this.#span('evict', track, t0, args);
    }
  }

  async #evictVictims(victims: number[], slot: number, track: string | undefined): Promise<boolean> {
    let done!: () => void;
    const settled = new Promise<void>((r) => (done = r));
    const taken: { page: number; slot: number; crc: number; version: number }[] = [];
    const writes: StoredPage[] = [];
    let t = track ? nowUs() : 0;
    try {
      for (const page of victims) {
        const e = this.#lspt.get(page);
        if (e?.state !== 'resident') continue; // taken by another eviction, or refetching
        e.state = 'evicting';
        e.settled = settled;
        let bytes: Buffer | undefined;
        try {
          bytes = this.#takeOut(page, slot + taken.length);
        } catch (err) {
          e.state = 'resident'; // it stays: evicted another time
          this.#report(asPfrError(err, 'ERR_PFR_STORE_UNAVAILABLE'));
          continue;
        }
        if (!bytes) {
          this.#lspt.drop(page); // not there any more
          continue;
        }
        const crc = pageCrc(this.#seed, bytes);
        // 0: clean, dropped without a write (the store holds these bytes, or it is a zero page).
        const version = e.dirty || crc !== e.crc ? this.#lspt.nextVersion(page) : 0;
        taken.push({ page, slot: slot + taken.length, crc, version });
        if (version) writes.push({ key: this.#key(page), value: encodePage(bytes, { address: this.#address(page), version }, this.#seed, crc) });
      }
      if (track) {
        this.#span('take out', track, t, { pages: taken.length, dirty: writes.length });
        t = nowUs();
      }
      try {
        await this.#store.setMany(writes);
      } catch (err) {
        for (const v of taken) this.#putBack(v.page, v.slot, v.crc);
        this.#refused = asPfrError(err, 'ERR_PFR_STORE_UNAVAILABLE');
        this.#report(this.#refused);
        return false;
      } finally {
        if (track && writes.length)
          this.#span('write-back', track, t, { pages: writes.length, bytes: writes.reduce((n, w) => n + w.value.length, 0) });
      }
      if (track) t = nowUs();
      for (const v of taken) {
        if (v.version) this.#lspt.stored(v.page, v.version);
        this.#drop(v.page, v.slot);
        this.#lspt.drop(v.page);
        this.#prefetch.gone(v.page);
        this.#add(Counter.evicted);
        this.#add(v.version ? Counter.writtenBack : Counter.droppedClean);
      }
      for (const w of writes) this.#add(Counter.bytesOut, w.value.length);
      if (track) this.#span('drop', track, t, { pages: taken.length });
      return true;
    } finally {
      this.#setResident();
      done();
    }
  }

  // The victim's bytes, taken so that no write can slip past the eviction (see the header).
  #takeOut(page: number, slot: number): Buffer | undefined {
    const ps = this.#ps,
      off = page * ps;
    if (this.tracking === 'wp-async') {
      let moved: number;
      try {
        moved = this.#uffd.move(this.#staging!, slot * ps, this.#region, off, ps, { allowSourceHoles: true });
      } catch (err) {
        if ((err as { code?: string }).code !== 'EBUSY') throw err;
        // A fork (any child_process) left the page shared copy-on-write, and UFFDIO_MOVE only
        // takes pages this process owns alone. A write fault makes it ours again without
        // changing a byte: MADV_POPULATE_WRITE (the checksum still tells whether it is dirty).
        this.#region.populate(off, ps, { write: true });
        moved = this.#uffd.move(this.#staging!, slot * ps, this.#region, off, ps, { allowSourceHoles: true });
      }
      if (moved !== ps) return undefined;
      return Buffer.from(this.#staging!.buffer, slot * ps, ps);
    }
    if (this.#region.residentPages(off, ps) !== ps / this.#region.pageSize) return undefined;
    this.#uffd.writeProtect(this.#region, off, ps, true);
    return Buffer.from(this.#region.buffer, off, ps); // resident: reading it takes no fault
  }

  #drop(page: number, slot: number): void {
    if (this.tracking === 'wp-async') this.#staging!.evict(slot * this.#ps, this.#ps);
    else this.#region.evict(page * this.#ps, this.#ps);
  }

  // The store refused the page: it goes back where it was, dirty.
  #putBack(page: number, slot: number, crc: number): void {
    const ps = this.#ps;
    if (this.tracking === 'wp-async') {
      this.#uffd.move(this.#region, page * ps, this.#staging!, slot * ps, ps);
      this.#staging!.evict(slot * ps, ps);
    } else {
      this.#uffd.writeProtect(this.#region, page * ps, ps, false);
    }
    this.#lspt.placed(page, crc);
    this.#lspt.markDirty(page);
  }

  // ---- requests from the pager ------------------------------------------------------------

  /** Write every dirty resident page back (UMap's umap_flush); returns the pages written. */
  async flush(): Promise<number> {
    const t0 = this.#tracing ? nowUs() : 0;
    try {
      return await this.#flush(t0);
    } finally {
      if (t0) this.#span('flush', 'flush', t0, {});
    }
  }

  async #flush(t0: number): Promise<number> {
    this.#scanDirty();
    const writes: StoredPage[] = [];
    const crcs: { page: number; crc: number; version: number }[] = [];
    for (const page of this.#lspt.pages()) {
      const e = this.#lspt.get(page)!;
      const off = page * this.#ps;
      if (this.#region.residentPages(off, this.#ps) !== this.#ps / this.#region.pageSize) continue;
      // 'wp-sync': protected again before it is read, so a write from now on (even while the
      // store works) faults and marks it dirty again ('wp-async': the scan re-armed it).
      if (this.tracking === 'wp-sync' && e.dirty) this.#uffd.writeProtect(this.#region, off, this.#ps, true);
      const bytes = Buffer.from(this.#region.buffer, off, this.#ps);
      const crc = pageCrc(this.#seed, bytes);
      if (!e.dirty && crc === e.crc) continue;
      const version = this.#lspt.nextVersion(page);
      writes.push({ key: this.#key(page), value: encodePage(bytes, { address: this.#address(page), version }, this.#seed, crc) });
      crcs.push({ page, crc, version });
      e.dirty = false;
    }
    const t1 = t0 ? nowUs() : 0;
    try {
      await this.#store.setMany(writes);
    } catch (err) {
      for (const { page } of crcs) this.#lspt.markDirty(page); // not stored: still dirty
      throw err;
    } finally {
      if (t1 && writes.length) this.#span('write-back', 'flush', t1, { pages: writes.length, bytes: writes.reduce((n, w) => n + w.value.length, 0) });
    }
    for (const { page, crc, version } of crcs) {
      this.#lspt.stored(page, version);
      const e = this.#lspt.get(page);
      if (e?.state === 'resident') e.crc = crc;
    }
    this.#add(Counter.writtenBack, writes.length);
    for (const w of writes) this.#add(Counter.bytesOut, w.value.length);
    return writes.length;
  }

  /** Evict the resident pages of [offset, offset+length) now, whatever the watermarks. */
  async evict(offset: number, length: number): Promise<number> {
    const first = offset / this.#ps,
      last = (offset + length) / this.#ps;
    const pages = this.#lspt.pages().filter((p) => p >= first && p < last);
    let evicted = 0;
    for (let i = 0; i < pages.length; i += this.#cfg.evictBatch) {
      this.#scanDirty();
      const batch = pages.slice(i, i + this.#cfg.evictBatch).filter((p) => this.#lspt.get(p)?.state === 'resident');
      if (!(await this.#inSlots(0, () => this.#evictBatch(batch, 0)))) {
        throw new PfrError(this.#refused!.code, `evict: the pages stay resident: ${this.#refused!.message}`);
      }
      evicted += batch.length;
    }
    return evicted;
  }

  latency(): { major: LatencySummary; minor: LatencySummary } {
    const sum = (h: RecordableHistogram): LatencySummary => ({
      count: h.count,
      p50Us: h.count ? h.percentile(50) / 1000 : 0,
      p99Us: h.count ? h.percentile(99) / 1000 : 0,
      maxUs: h.count ? h.max / 1000 : 0,
    });
    return { major: sum(this.major), minor: sum(this.minor) };
  }

  /** Stop; delete this pager's keys from the store unless it persists them. */
  async close(): Promise<CloseResult> {
    if (this.#closed) return { keysDeleted: 0, keysLeft: 0 };
    await this.#evictor;
    await Promise.all(this.#slots);
    this.#closed = true;
    this.#uffd.close();
    this.#staging?.close();
    this.#region.close();
    const keys = this.#lspt.written().map((p) => this.#key(p));
    // (A key whose write was never acknowledged may not be there: what is left is at most this.)
    let result = { keysDeleted: 0, keysLeft: keys.length };
    if (!this.#cfg.persist && keys.length) {
      try {
        const keysDeleted = await this.#store.deleteMany(keys);
        result = { keysDeleted, keysLeft: 0 };
        this.#add(Counter.keysDeleted, keysDeleted);
      } catch (err) {
        this.#report(asPfrError(err, 'ERR_PFR_STORE_UNAVAILABLE'));
      }
    }
    await this.#store.close();
    return result;
  }
}

function asPfrError(err: unknown, code: 'ERR_PFR_STORE_UNAVAILABLE'): PfrError {
  if (err instanceof PfrError) return err;
  return new PfrError(code, `remote paging: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
}
