// Remote paging for the application: a region whose pages live in a page store (embedded,
// or Redis) and come back on demand, through EDM's DM-Handler (dm-handler.ts) running in a
// worker thread. Every thread may read and write the region at any time; a page that is not
// resident is fetched while the faulting thread waits, the main JS thread included.
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { closedError, PfrError, type PfrErrorCode } from '../errors.js';
import { mapRegion, PAGE_SIZE, type Region } from '../region.js';
import { UffdFeature, Userfaultfd } from '../uffd.js';
import { checkInt, checkObject, invalidArg, known, rangeError } from '../validate.js';
import { newCounters, readCounters } from './counters.js';
import type { CloseResult, DirtyTracking, DmHandlerConfig, DmTraceEvent, LatencySummary } from './dm-handler.js';
import type { RedisStoreOptions } from './redis-store.js';
import type { MemoryServerStoreOptions } from './memory-server-store.js';
import type { Request } from './worker.js';

/** Options of `RemotePager.create`. */
export interface RemotePagerOptions {
  /** Bytes of the region (a multiple of pageSize). */
  size: number;
  /** Where evicted pages go: 'embedded' (default, in the DM-Handler's thread), a Redis server, or a `pagefault-rdma memory-server`. */
  store?:
    | 'embedded'
    | {
        /** Where and how to reach the Redis server. */
        redis: RedisStoreOptions;
      }
    | {
        /** Where and how to reach the memory server (`pagefault-rdma memory-server --socket PATH`). */
        server: MemoryServerStoreOptions;
      };
  /** The unit of fetch and eviction: a multiple of the system page (UMap's UMAP_PAGESIZE). Default the system page. */
  pageSize?: number;
  /** Resident bytes the region may hold (UMap's buffer size). Default: all of it (no eviction). */
  residentLimit?: number;
  /** Fraction of residentLimit at which the eviction worker starts (default 0.9) and down to which it evicts (default 0.7). */
  highWatermark?: number;
  /** Fraction of residentLimit down to which the eviction worker evicts (default 0.7). */
  lowWatermark?: number;
  /**
   * The largest prefetch window, in pages (default 0: no prefetch). The window adapts: per
   * region, a sequential or strided stream in the recent faults (a majority trend, as Leap
   * finds it) is read ahead along its stride, in the faulting page's store request, in a
   * window sized by how many of the last window's pages were used; without a trend (a random
   * scan) nothing is read ahead. stats() reports the accuracy and coverage.
   */
  prefetch?: number;
  /** Fetch batches in flight at once (UMap's fill workers; default 2). */
  fillWorkers?: number;
  /** Eviction batches in flight at once (evict workers; default 1), and pages per batch (default 32). */
  evictWorkers?: number;
  /** Pages per eviction batch (default 32). */
  evictBatch?: number;
  /**
   * A store request not answered in this time fails: the access fails (poisoned page) and an 'error' event says why. After
   * one such failure the store counts as down and the next accesses fail at once until it answers again. Default 2000 ms.
   */
  timeoutMs?: number;
  /** 'auto' (default): 'wp-async' where the kernel has WP_ASYNC and UFFDIO_MOVE (6.8), else 'wp-sync'. */
  dirtyTracking?: 'auto' | DirtyTracking;
  /** Trace events the DM-Handler keeps, the newest (default 0: no trace); read them with trace(). */
  traceEvents?: number;
}

/** Counters of a RemotePager (`stats()`). */
export interface RemotePagingStats {
  /** Faults taken on the region. */
  faults: number;
  /** Faults served from the store. */
  majorFaults: number;
  /** Faults served without the store: a page never stored (zero page), or one already on its way. */
  minorFaults: number;
  /** Pages read from the store (faulting and prefetched). */
  pagesFetched: number;
  /** Pages read ahead (prefetch) with a faulting one. */
  prefetched: number;
  /** Pages evicted. */
  evicted: number;
  /** Dirty pages written to the store on eviction. */
  writtenBack: number;
  /** Clean pages dropped without a write (their checksum unchanged). */
  droppedClean: number;
  /** Bytes read from the store. */
  bytesIn: number;
  /** Bytes written to the store. */
  bytesOut: number;
  /** Pages resident now. */
  resident: number;
  /** Store requests that failed. */
  errors: number;
  /** Pages poisoned because they could not be had. */
  poisoned: number;
  /** Pages the store answered wrongly for (short, garbled, another page's, an older write): ERR_PFR_PAGE_CORRUPT. */
  corrupt: number;
  /** Stored pages the store no longer held: ERR_PFR_PAGE_LOST. */
  lost: number;
  /** Keys close() deleted from the store. */
  keysDeleted: number;
  /** Pages read ahead that were then used (written, or walked through by the stream without a fault: see prefetch.ts). */
  prefetchUsed: number;
  /** prefetchUsed ÷ prefetched: how much of what was read ahead was used (0 with nothing read ahead). */
  prefetchAccuracy: number;
  /** prefetchUsed ÷ (prefetchUsed + majorFaults): how many of the store reads a fault would have waited for prefetch took off the fault path. */
  prefetchCoverage: number;
}

const TRACKINGS = ['auto', 'wp-async', 'wp-sync'] as const;

// Open pagers by their region's id: the fault library asks whether a region it resolves is
// remote-paged, to tell a major fault (a page from the store) from a minor one.
const pagers = new Map<number, RemotePager>();

/** The remote pager whose region `region` is, if any. */
export function remotePagerOf(region: Region): RemotePager | undefined {
  return pagers.get(region.id);
}

function workerPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const sibling = join(here, 'worker.js');
  if (existsSync(sibling)) return sibling;
  // Run from the TypeScript sources (tests): the worker is the compiled one.
  const built = join(here, '..', '..', 'dist', 'lib', 'remote-paging', 'worker.js');
  if (existsSync(built)) return built;
  throw new PfrError('ERR_PFR_UNSUPPORTED', `remote paging: the worker script is not built (${built}); run "npm run build:ts"`);
}

/** EDM's DM-Handler: a region whose pages live in a page store and come back on demand, with an eviction worker keeping it under residentLimit. */
export class RemotePager extends EventEmitter<{
  /** A page could not be had or stored: the code says why. */
  error: [err: PfrError];
}> {
  /** The remote-paged memory. Read and write it freely; never evict() it directly. */
  readonly region: Region;
  /** The unit of fetch and eviction, bytes. */
  readonly pageSize: number;
  /** How dirty pages are found on this kernel. */
  readonly tracking: DirtyTracking;
  /** The prefix of this pager's keys in the store: the application's prefix and an instance id of this pager's own. */
  readonly keyPrefix: string;
  #worker: Worker;
  #counters: SharedArrayBuffer;
  #next = 1;
  #waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  #closed = false;
  #closing: Promise<CloseResult> | undefined;

  private constructor(region: Region, worker: Worker, counters: SharedArrayBuffer, pageSize: number, tracking: DirtyTracking, keyPrefix: string) {
    super();
    this.region = region;
    this.keyPrefix = keyPrefix;
    this.#worker = worker;
    this.#counters = counters;
    this.pageSize = pageSize;
    this.tracking = tracking;
    worker.on('message', (m: { id?: number; event?: string; result?: unknown; error?: { code: string; message: string } }) => {
      if (m.event === 'error') return this.#emitError(m.error!);
      const w = m.id === undefined ? undefined : this.#waiting.get(m.id);
      if (!w) return;
      this.#waiting.delete(m.id!);
      if (this.#waiting.size === 0) worker.unref();
      if (m.error) w.reject(Object.assign(new PfrError(m.error.code as PfrErrorCode, m.error.message)));
      else w.resolve(m.result);
    });
    worker.on('exit', () => {
      for (const w of this.#waiting.values()) w.reject(new PfrError('ERR_PFR_CLOSED', 'remote paging: the DM-Handler thread ended'));
      this.#waiting.clear();
    });
    worker.unref(); // an idle pager does not keep the process alive
    pagers.set(region.id, this);
  }

  /** Map the region, start the DM-Handler thread, connect it to the store. */
  static async create(options: RemotePagerOptions): Promise<RemotePager> {
    const o = checkObject(
      'RemotePager.create: options',
      options,
      known<RemotePagerOptions>({
        size: true,
        store: true,
        pageSize: true,
        residentLimit: true,
        highWatermark: true,
        lowWatermark: true,
        prefetch: true,
        fillWorkers: true,
        evictWorkers: true,
        evictBatch: true,
        timeoutMs: true,
        dirtyTracking: true,
        traceEvents: true,
      }),
    ) as unknown as RemotePagerOptions;
    const pageSize = o.pageSize === undefined ? PAGE_SIZE : checkInt('RemotePager.create: options.pageSize', o.pageSize, PAGE_SIZE, 1 << 30);
    if (pageSize % PAGE_SIZE !== 0)
      throw invalidArg(`RemotePager.create: options.pageSize (${pageSize}) must be a multiple of the system page (${PAGE_SIZE})`);
    const size = checkInt('RemotePager.create: options.size', o.size, pageSize);
    if (size % pageSize !== 0) throw invalidArg(`RemotePager.create: options.size (${size}) must be a multiple of pageSize (${pageSize})`);
    const limit = o.residentLimit === undefined ? size : checkInt('RemotePager.create: options.residentLimit', o.residentLimit, pageSize);
    const high = o.highWatermark ?? 0.9,
      low = o.lowWatermark ?? 0.7;
    if (!(typeof high === 'number' && typeof low === 'number' && low > 0 && low < high && high <= 1)) {
      throw rangeError(`RemotePager.create: watermarks must satisfy 0 < lowWatermark < highWatermark <= 1 (got ${String(low)}, ${String(high)})`);
    }
    const limitPages = Math.floor(limit / pageSize);
    const evictBatch = o.evictBatch === undefined ? 32 : checkInt('RemotePager.create: options.evictBatch', o.evictBatch, 1, 4096);
    const tracking = o.dirtyTracking ?? 'auto';
    if (!TRACKINGS.includes(tracking)) throw invalidArg(`RemotePager.create: options.dirtyTracking must be one of ${TRACKINGS.join(', ')}`);
    let store: DmHandlerConfig['store'] = { kind: 'embedded' };
    let prefix = 'pfr',
      persist = false;
    if (o.store !== undefined && o.store !== 'embedded' && 'server' in (checkObject('RemotePager.create: options.store', o.store) as object)) {
      const s = checkServerOptions((o.store as { server: unknown }).server);
      store = { kind: 'server', options: s };
      prefix = s.prefix ?? prefix;
      persist = s.persist ?? false;
    } else if (o.store !== undefined && o.store !== 'embedded') {
      const s = checkObject('RemotePager.create: options.store', o.store) as { redis?: RedisStoreOptions };
      if (!s.redis || typeof s.redis !== 'object')
        throw invalidArg(
          "RemotePager.create: options.store must be 'embedded', { redis: { socket | host, port | url, prefix } } or { server: { socket | port, prefix } }",
        );
      if (s.redis.prefix !== undefined && (typeof s.redis.prefix !== 'string' || s.redis.prefix === ''))
        throw invalidArg('RemotePager.create: options.store.redis.prefix must be a non-empty string');
      if (s.redis.persist !== undefined && typeof s.redis.persist !== 'boolean')
        throw invalidArg('RemotePager.create: options.store.redis.persist must be a boolean');
      store = { kind: 'redis', options: s.redis };
      prefix = s.redis.prefix ?? prefix;
      persist = s.redis.persist ?? false;
    }
    // An instance id of this pager's own: two pagers with one prefix, even at one address, never read each other's pages.
    const keyPrefix = `${prefix}:${randomBytes(6).toString('hex')}`;
    const region = mapRegion(size);
    const counters = newCounters();
    const cfg: DmHandlerConfig = {
      region: region.share(),
      pageSize,
      // Without a limit nothing is evicted (but what evict() asks for).
      highPages: o.residentLimit === undefined ? Number.MAX_SAFE_INTEGER : Math.max(1, Math.floor(limitPages * high)),
      lowPages: Math.max(0, Math.floor(limitPages * low)),
      prefetch: o.prefetch === undefined ? 0 : checkInt('RemotePager.create: options.prefetch', o.prefetch, 0, 4096),
      fillWorkers: o.fillWorkers === undefined ? 2 : checkInt('RemotePager.create: options.fillWorkers', o.fillWorkers, 1, 64),
      evictWorkers: o.evictWorkers === undefined ? 1 : checkInt('RemotePager.create: options.evictWorkers', o.evictWorkers, 1, 64),
      evictBatch,
      timeoutMs: o.timeoutMs === undefined ? 2000 : checkInt('RemotePager.create: options.timeoutMs', o.timeoutMs, 1, 600_000),
      tracking: tracking === 'auto' ? defaultTracking() : tracking,
      store,
      keyPrefix,
      persist,
      counters,
      traceEvents: o.traceEvents === undefined ? 0 : checkInt('RemotePager.create: options.traceEvents', o.traceEvents, 0, 10_000_000),
    };
    const worker = new Worker(workerPath(), { workerData: cfg });
    try {
      const ready = await new Promise<{ tracking: DirtyTracking }>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new PfrError('ERR_PFR_STORE_UNAVAILABLE', 'remote paging: the DM-Handler did not start within 10 s')),
          10_000,
        );
        worker.once('error', (e) => (clearTimeout(timer), reject(e)));
        worker.on('message', function first(m: { event?: string; tracking?: DirtyTracking; error?: { code: string; message: string } }) {
          if (m.event !== 'ready' && m.event !== 'failed') return;
          worker.off('message', first);
          clearTimeout(timer);
          if (m.event === 'ready') resolve({ tracking: m.tracking! });
          else reject(new PfrError(m.error!.code as PfrErrorCode, m.error!.message));
        });
      });
      return new RemotePager(region, worker, counters, pageSize, ready.tracking, keyPrefix);
    } catch (err) {
      await worker.terminate();
      region.close();
      throw err;
    }
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** The counters, read at once from shared memory (no message to the DM-Handler). */
  stats(): RemotePagingStats {
    const c = readCounters(this.#counters);
    return {
      ...c,
      prefetchAccuracy: c.prefetched ? c.prefetchUsed / c.prefetched : 0,
      prefetchCoverage: c.prefetchUsed ? c.prefetchUsed / (c.prefetchUsed + c.majorFaults) : 0,
    };
  }

  /**
   * The DM-Handler's trace (with options.traceEvents > 0): each fault's arrival on the thread
   * that faulted (major, minor on a page in flight, a wait on an eviction, a write-protect
   * fault), each fetch batch and each eviction batch as a span of the DM-Handler's worker.
   */
  trace(): Promise<{
    /** The events kept, oldest first. */
    events: DmTraceEvent[];
    /** Older events the ring dropped (raise options.traceEvents to keep them). */
    dropped: number;
  }> {
    return this.#request({ op: 'trace' }) as Promise<{ events: DmTraceEvent[]; dropped: number }>;
  }

  /** Fault latency (receipt to resolution, in the DM-Handler's thread), major and minor. */
  latency(): Promise<{
    /** Faults served from the store. */
    major: LatencySummary;
    /** Faults served without the store. */
    minor: LatencySummary;
  }> {
    return this.#request({ op: 'latency' }) as Promise<{ major: LatencySummary; minor: LatencySummary }>;
  }

  /** Write every dirty resident page to the store (pages stay resident). Resolves to the pages written. */
  flush(): Promise<number> {
    return this.#request({ op: 'flush' }) as Promise<number>;
  }

  /** Evict the resident pages of a range now (dirty ones written back first). Resolves to the pages evicted. */
  evict(offset = 0, length = this.region.size - offset): Promise<number> {
    const s = this.region.span('RemotePager.evict', offset, length);
    if (s.offset % this.pageSize || s.length % this.pageSize)
      throw invalidArg(`RemotePager.evict: offset and length must be multiples of pageSize (${this.pageSize})`);
    return this.#request({ op: 'evict', offset: s.offset, length: s.length }) as Promise<number>;
  }

  /**
   * Stop the DM-Handler (it finishes the evictions under way), delete this pager's keys from
   * the store (UNLINK in batches of 1000, only the keys it wrote) unless the store was created
   * with `persist: true`, close the store connection, unmap the region. Resolves to the keys
   * deleted and the keys left (kept by `persist`, or the store could not be reached: an
   * 'error' event says why); `stats().keysDeleted` says it too. A second call resolves to
   * the first one's result.
   */
  close(): Promise<CloseResult> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<CloseResult> {
    let result: CloseResult = { keysDeleted: 0, keysLeft: 0 };
    try {
      result = (await this.#request({ op: 'close' })) as CloseResult;
    } catch {
      // the thread is gone already
    }
    this.#closed = true;
    pagers.delete(this.region.id);
    await this.#worker.terminate();
    this.region.close();
    return result;
  }

  #request(req: DistributiveOmit<Request, 'id'>): Promise<unknown> {
    if (this.#closed) return Promise.reject(closedError('RemotePager'));
    const id = this.#next++;
    this.#worker.ref();
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
      this.#worker.postMessage({ ...req, id });
    });
  }

  #emitError(e: { code: string; message: string }): void {
    const err = new PfrError(e.code as PfrErrorCode, e.message);
    if (this.listenerCount('error')) this.emit('error', err);
    else process.emitWarning(err.message, { code: err.code });
  }
}

function checkServerOptions(value: unknown): MemoryServerStoreOptions {
  const s = checkObject('RemotePager.create: options.store.server', value) as MemoryServerStoreOptions;
  const what = 'RemotePager.create: options.store.server';
  if ((s.socket === undefined) === (s.port === undefined))
    throw invalidArg(`${what}: give exactly one of socket (the server's Unix socket path) and port (its loopback TCP port)`);
  if (s.socket !== undefined && (typeof s.socket !== 'string' || s.socket === '')) throw invalidArg(`${what}.socket must be a path`);
  if (s.port !== undefined) checkInt(`${what}.port`, s.port, 1, 65535);
  if (s.host !== undefined && typeof s.host !== 'string') throw invalidArg(`${what}.host must be a string`);
  if (s.prefix !== undefined && (typeof s.prefix !== 'string' || s.prefix === '')) throw invalidArg(`${what}.prefix must be a non-empty string`);
  if (s.persist !== undefined && typeof s.persist !== 'boolean') throw invalidArg(`${what}.persist must be a boolean`);
  if (s.timeoutMs !== undefined) checkInt(`${what}.timeoutMs`, s.timeoutMs, 1, 600_000);
  if (s.probeIntervalMs !== undefined) checkInt(`${what}.probeIntervalMs`, s.probeIntervalMs, 1, 600_000);
  return { ...s };
}

type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

function defaultTracking(): DirtyTracking {
  const probe = Userfaultfd.open();
  try {
    const a = probe.features.available;
    return (a & UffdFeature.WP_ASYNC) !== 0n && (a & UffdFeature.MOVE) !== 0n ? 'wp-async' : 'wp-sync';
  } finally {
    probe.close();
  }
}
