// Memory regions: mmap'd memory whose residency is real and observable. The ArrayBuffer is
// the mapping itself (no copy); close() detaches it before munmap.
import { kMaxLength } from 'node:buffer';
import { binding, type RawMapping } from '../native/index.js';
import { closedError, sys, systemError } from './errors.js';
import { checkBool, checkInt, checkObject, checkSpan, invalidArg, rangeError } from './validate.js';

export const PAGE_SIZE: number = binding.pageSize;
export const HUGE_PAGE_SIZE = 2 * 1024 * 1024;

export interface MapOptions {
  /** memfd-backed shared memory (minor faults, a second view of the same pages). Default false: anonymous private. */
  shared?: boolean;
  /** Ask for transparent huge pages (MADV_HUGEPAGE, 2 MiB aligned). Default false (MADV_NOHUGEPAGE: 4 KiB faults). */
  hugePages?: boolean;
}

export interface PopulateOptions {
  /** MADV_POPULATE_WRITE (default) or MADV_POPULATE_READ. */
  write?: boolean;
}

/** Something that keeps a region's pages registered and must let go before it is unmapped. */
export interface RegionObserver {
  regionClosing(region: Region): void;
  /** Pages of the range stopped being resident (evict, unmapPages): drop cached translations. */
  regionEvicted?(region: Region, offset: number, length: number): void;
  /** This thread is about to make a call that may block until a userfaultfd reader acts. */
  regionWillBlock?(region: Region): void;
}

const MMAP_FIXES = {
  ENOMEM: 'Not enough memory or address space: map a smaller region, or raise the limits (ulimit -v, vm.max_map_count)',
  EINVAL: 'The size must be a positive multiple of the page size',
};

// Every open region of this process: the SMMU of the model walks the whole address space
// (shared virtual addressing), so an implicit ODP key can reach any of them.
const openRegions = new Set<Region>();

/** The open region containing [address, address+length), if any. */
export function findRegion(address: bigint, length = 1): Region | undefined {
  const end = address + BigInt(length);
  for (const r of openRegions) if (address >= r.address && end <= r.address + BigInt(r.size)) return r;
  return undefined;
}

export class Region {
  /** Handle of the mapping in the addon (stable for the region's life). */
  readonly id: number;
  /** Virtual address of the first byte. */
  readonly address: bigint;
  readonly size: number;
  readonly pageSize: number;
  readonly shared: boolean;
  readonly hugePages: boolean;
  /** The region this one is a second view of (see alias()), or undefined. */
  readonly aliasOf: Region | undefined;
  #buffer: ArrayBuffer;
  #closed = false;
  #observers = new Set<RegionObserver>();

  /** @internal use mapRegion() */
  constructor(raw: RawMapping, size: number, shared: boolean, hugePages: boolean, aliasOf?: Region) {
    this.id = raw.id;
    this.address = raw.address;
    this.size = size;
    this.pageSize = raw.pageSize;
    this.shared = shared;
    this.hugePages = hugePages;
    this.aliasOf = aliasOf;
    this.#buffer = raw.buffer;
    openRegions.add(this);
  }

  /** The open region whose buffer is `buffer`, if any. */
  static ofBuffer(buffer: ArrayBuffer): Region | undefined {
    for (const r of openRegions) if (r.#buffer === buffer) return r;
    return undefined;
  }

  /** The mapped memory itself. Reading an untouched page faults it in (resolved at once if registered). */
  get buffer(): ArrayBuffer {
    this.#check();
    return this.#buffer;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** The translation granule: 2 MiB with huge pages, else the page size. */
  get granule(): number {
    return this.hugePages ? HUGE_PAGE_SIZE : this.pageSize;
  }

  /** Page-granular check of a sub-range; returns it with defaults filled in. */
  span(what: string, offset?: number, length?: number, alignLength = false): { offset: number; length: number } {
    this.#check();
    return checkSpan(what, this.size, offset, length, this.pageSize, alignLength);
  }

  /** One entry per page of the range: 1 if resident (mincore), 0 if not. */
  residency(offset?: number, length?: number): Uint8Array {
    const s = this.span('residency', offset, length);
    return sys('residency', {}, () => binding.residency(this.id, s.offset, s.length));
  }

  /** Number of resident pages in the range. */
  residentPages(offset?: number, length?: number): number {
    let n = 0;
    for (const r of this.residency(offset, length)) n += r;
    return n;
  }

  /**
   * One entry per page: 1 if this mapping's page-table entry is present (/proc/self/pagemap).
   * For shared memory a page can be in the page cache (resident) yet not mapped here.
   */
  mapped(offset?: number, length?: number): Uint8Array {
    const s = this.span('mapped', offset, length);
    return sys('mapped', { EACCES: 'Reading /proc/self/pagemap was refused' }, () => binding.pagemap(this.id, s.offset, s.length));
  }

  /** Make the range resident: MADV_POPULATE_WRITE (or _READ), the user-space get_user_pages. */
  populate(offset?: number, length?: number, options?: PopulateOptions): void {
    const s = this.span('populate', offset, length);
    const write = checkBool('populate: options.write', checkObject('populate: options', options).write, true);
    this.#willBlock();
    sys('populate', {
      EINVAL: 'MADV_POPULATE needs Linux 5.14 or newer',
      EFAULT: 'Populating a userfaultfd range opened in user-mode-only mode cannot fault from the kernel; touch the pages from a thread instead',
      ENOMEM: 'Not enough memory to make the range resident',
    }, () => binding.populate(this.id, s.offset, s.length, write));
  }

  /**
   * Make the range non-resident so the next access faults again: MADV_DONTNEED for
   * anonymous memory (the contents are dropped: the next read sees zeros or whatever a
   * userfaultfd handler provides), a hole punched in the file for memfd memory.
   */
  evict(offset?: number, length?: number): void {
    const s = this.span('evict', offset, length);
    this.#willBlock();
    sys('evict', { EINVAL: 'Pinned (mlocked) anonymous pages cannot be evicted: unpin() first' }, () => binding.evict(this.id, s.offset, s.length));
    this.#notifyEvicted(s.offset, s.length);
  }

  /**
   * Drop this mapping's page-table entries but keep the contents (memfd memory: the pages
   * stay in the page cache, so the next access is a minor fault). On anonymous memory it is
   * the same as evict().
   */
  unmapPages(offset?: number, length?: number): void {
    const s = this.span('unmapPages', offset, length);
    this.#willBlock();
    sys('unmapPages', {}, () => binding.zap(this.id, s.offset, s.length));
    this.#notifyEvicted(s.offset, s.length);
  }

  #willBlock(): void {
    for (const o of this.#observers) o.regionWillBlock?.(this);
  }

  // The MMU-notifier role: whoever caches translations of these pages must drop them.
  #notifyEvicted(offset: number, length: number): void {
    for (const o of this.#observers) o.regionEvicted?.(this, offset, length);
  }

  /** mlock: make the range resident and keep it so (pinning). Bounded by RLIMIT_MEMLOCK. */
  pin(offset?: number, length?: number): void {
    const s = this.span('pin', offset, length);
    try {
      binding.pin(this.id, s.offset, s.length, true);
    } catch (err) {
      const limit = binding.memlockLimit();
      const soft = limit.soft < 0 ? 'unlimited' : `${limit.soft} bytes`;
      const advice =
        `Pinning ${s.length} bytes goes past RLIMIT_MEMLOCK (soft limit ${soft}); raise it with "ulimit -l" or ` +
        `/etc/security/limits.conf (memlock), run with CAP_IPC_LOCK, or leave the memory unpinned (on-demand paging)`;
      throw systemError('pin', err, { ENOMEM: advice, EPERM: advice, EAGAIN: 'Some pages could not be locked right now; retry' });
    }
  }

  unpin(offset?: number, length?: number): void {
    const s = this.span('unpin', offset, length);
    sys('unpin', {}, () => binding.pin(this.id, s.offset, s.length, false));
  }

  /**
   * A second mapping of the same memfd pages at another address: a separate page table
   * over the same memory (the device's view beside the CPU's). Shared regions only.
   */
  alias(): Region {
    this.#check();
    if (!this.shared) throw invalidArg('alias: only shared (memfd) regions have a second view; map with { shared: true }');
    const raw = sys('alias', MMAP_FIXES, () => binding.mapAlias(this.id));
    return new Region(raw, this.size, true, false, this);
  }

  /** @internal registrations (userfaultfd) that must be undone before munmap. */
  observe(o: RegionObserver): void {
    this.#observers.add(o);
  }

  /** @internal */
  unobserve(o: RegionObserver): void {
    this.#observers.delete(o);
  }

  /**
   * Unregister from every userfaultfd (waking anything blocked on it), detach the
   * ArrayBuffer, unmap. Idempotent. Native threads still working on the region keep it
   * mapped until they finish, so closing never crashes them.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    openRegions.delete(this);
    for (const o of [...this.#observers]) o.regionClosing(this);
    this.#observers.clear();
    binding.closeRegion(this.id, this.#buffer);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  #check(): void {
    if (this.#closed) throw closedError('Region');
  }
}

/** Map `bytes` of memory (a multiple of the page size; of 2 MiB with huge pages). */
export function mapRegion(bytes: number, options?: MapOptions): Region {
  const opts = checkObject('mapRegion: options', options);
  const shared = checkBool('mapRegion: options.shared', opts.shared, false);
  const hugePages = checkBool('mapRegion: options.hugePages', opts.hugePages, false);
  const size = checkInt('mapRegion: bytes', bytes, 1);
  const unit = hugePages ? HUGE_PAGE_SIZE : PAGE_SIZE;
  if (size % unit !== 0) {
    throw invalidArg(`mapRegion: bytes (${size}) must be a multiple of ${unit}${hugePages ? ' with hugePages' : ' (the page size)'}; round it up`);
  }
  // Before the mmap: the mapping is handed to JavaScript as one ArrayBuffer, and a size the
  // platform cannot give one would fail after the mapping exists (and abort the process).
  if (size > kMaxLength) throw rangeError(`mapRegion: bytes (${size}) is more than one ArrayBuffer can hold on this platform (${kMaxLength}); map several smaller regions`);
  const raw = sys('mapRegion', MMAP_FIXES, () => binding.mapRegion(size, shared, hugePages));
  return new Region(raw, size, shared, hugePages);
}
