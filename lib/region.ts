// Memory regions: mmap'd memory whose residency is real and observable. The ArrayBuffer is
// the mapping itself (no copy); close() detaches it before munmap.
import { kMaxLength } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { binding, type RawMapping } from '../native/index.js';
import { closedError, sys, systemError } from './errors.js';
import { checkBool, checkInt, checkObject, checkSpan, invalidArg, rangeError, known } from './validate.js';

/** The system page size in bytes (4096 on x86_64). */
export const PAGE_SIZE: number = binding.pageSize;
/** A transparent huge page or hugetlbfs page: 2 MiB. */
export const HUGE_PAGE_SIZE = 2 * 1024 * 1024;

/** Options of `mapRegion`. */
export interface MapOptions {
  /** memfd-backed shared memory (minor faults, a second view of the same pages). Default false: anonymous private. */
  shared?: boolean;
  /** Ask for transparent huge pages (MADV_HUGEPAGE, 2 MiB aligned). Default false (MADV_NOHUGEPAGE: 4 KiB faults). */
  hugePages?: boolean;
  /**
   * hugetlbfs memory (MAP_HUGETLB; with `shared`, a memfd with MFD_HUGETLB): 2 MiB pages from
   * the pool reserved with vm.nr_hugepages. Missing, minor and write-protect faults come in
   * 2 MiB units, and `pageSize` is 2 MiB. Default false.
   */
  hugetlb?: boolean;
}

/** PAGEMAP_SCAN page categories (linux/fs.h PAGE_IS_*). */
export const PageCategory = {
  /** Registered with a userfaultfd for async write-protect (WP_ASYNC). */
  WPALLOWED: 1 << 0,
  /** Written since it was last write-protected (the dirty bit of WP_ASYNC). */
  WRITTEN: 1 << 1,
  /** The page is file-backed (or shmem). */
  FILE: 1 << 2,
  /** The page is present in memory. */
  PRESENT: 1 << 3,
  /** The page is swapped out. */
  SWAPPED: 1 << 4,
  /** The page maps the shared zero page. */
  PFNZERO: 1 << 5,
  /** The page is part of a huge page. */
  HUGE: 1 << 6,
} as const;

/** The range `pagemapScan()` reads. */
export interface PagemapScanOptions {
  /** Byte offset where the scan starts (default 0). */
  offset?: number;
  /** Bytes to scan (default: to the end). */
  length?: number;
  /** Pages must have every one of these categories (PageCategory bits). */
  all?: number;
  /** Pages must have none of these. */
  none?: number;
  /** Pages must have at least one of these (when non-zero). */
  any?: number;
  /**
   * Write-protect the pages reported (PM_SCAN_WP_MATCHING): re-arms dirty tracking, so a
   * page written after the scan is WRITTEN again at the next one. Needs a userfaultfd
   * opened with WP_ASYNC and the range registered for write-protect.
   */
  writeProtect?: boolean;
}

/** Physical frames of a range of pages (Region.frames()). */
export interface PageFrames {
  /** False when the kernel hid the frame numbers (no CAP_SYS_ADMIN): present pages read 0. */
  visible: boolean;
  /** One entry per page: its physical frame number, -1 if not present. */
  pfns: Float64Array;
  /** Why the frames are hidden, when they are. */
  hidden?: string;
}

/** What Region.frames() says when the kernel hides physical frame numbers. */
export const FRAMES_HIDDEN =
  'physical frame numbers need CAP_SYS_ADMIN (/proc/self/pagemap reports them as 0 to other users): run as root to see them; residency is still real';

/** A region as `share()` describes it to another thread. */
export interface SharedRegion {
  id: number;
  size: number;
  shared: boolean;
  hugePages: boolean;
  hugetlb: boolean;
}

/** A run of pages PAGEMAP_SCAN reported, with the categories it has. */
export interface PageRun {
  /** Byte offset of the run in the region. */
  offset: number;
  /** Bytes of the run. */
  length: number;
  /** PageCategory bits every page of the run has. */
  categories: number;
}

/** Options of `populate()`. */
export interface PopulateOptions {
  /** MADV_POPULATE_WRITE (default) or MADV_POPULATE_READ. */
  write?: boolean;
}

/** Something that keeps a region's pages registered and must let go before it is unmapped. */
export interface RegionObserver {
  regionClosing(region: Region): void;
  /**
   * Pages of the range are about to stop being resident (evict, unmapPages): the MMU
   * notifier's invalidate_range_start. regionEvicted follows if the kernel did it.
   */
  regionInvalidating?(region: Region, offset: number, length: number): void;
  /** Pages of the range stopped being resident (evict, unmapPages): drop cached translations. */
  regionEvicted?(region: Region, offset: number, length: number): void;
  /** Pages of the range stayed resident but may sit in other frames now (collapse): re-check cached translations. */
  regionMoved?(region: Region, offset: number, length: number): void;
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

/** Real mmap'd memory that faults for real: evict, populate, pin, scan and share it. Made by `mapRegion()`. */
export class Region {
  /** Handle of the mapping in the addon (stable for the region's life). */
  readonly id: number;
  /** Virtual address of the first byte. */
  readonly address: bigint;
  /** Bytes mapped. */
  readonly size: number;
  /** Page size of the mapping: 4 KiB, or 2 MiB for hugetlb. */
  readonly pageSize: number;
  /** True for memfd-backed shared memory. */
  readonly shared: boolean;
  /** True if transparent huge pages were asked for. */
  readonly hugePages: boolean;
  /** hugetlbfs memory: `pageSize` is 2 MiB. */
  readonly hugetlb: boolean;
  /** The region this one is a second view of (see alias()), or undefined. */
  readonly aliasOf: Region | undefined;
  #buffer: ArrayBuffer;
  #closed = false;
  #observers = new Set<RegionObserver>();

  /** @internal use mapRegion() */
  constructor(raw: RawMapping, size: number, shared: boolean, hugePages: boolean, aliasOf?: Region, hugetlb = false) {
    this.id = raw.id;
    this.address = raw.address;
    this.size = size;
    this.pageSize = hugetlb ? HUGE_PAGE_SIZE : raw.pageSize;
    this.shared = shared;
    this.hugePages = hugePages;
    this.hugetlb = hugetlb;
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

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** The translation granule: 2 MiB with huge pages (THP or hugetlb), else the page size. */
  get granule(): number {
    return this.hugePages || this.hugetlb ? HUGE_PAGE_SIZE : this.pageSize;
  }

  /** Page-granular check of a sub-range; returns it with defaults filled in. */
  span(
    what: string,
    offset?: number,
    length?: number,
    alignLength = false,
  ): {
    /** Byte offset of the range. */
    offset: number;
    /** Bytes of the range. */
    length: number;
  } {
    this.#check();
    return checkSpan(what, this.size, offset, length, this.pageSize, alignLength);
  }

  /** One entry per page (of `pageSize`) of the range: 1 if resident (mincore), 0 if not. */
  residency(offset?: number, length?: number): Uint8Array {
    const s = this.span('residency', offset, length);
    return this.#perPage(sys('residency', {}, () => binding.residency(this.id, s.offset, s.length)));
  }

  // The kernel answers per base page; a hugetlb page is resident or not as a whole.
  #perPage(basePages: Uint8Array): Uint8Array {
    const ratio = this.pageSize / binding.pageSize;
    if (ratio === 1) return basePages;
    return Uint8Array.from({ length: Math.ceil(basePages.length / ratio) }, (_, i) => basePages[i * ratio]!);
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
    return this.#perPage(sys('mapped', { EACCES: 'Reading /proc/self/pagemap was refused' }, () => binding.pagemap(this.id, s.offset, s.length)));
  }

  /**
   * The physical frame of each page of the range (/proc/self/pagemap, PFN bits 0–54): what
   * a device that translated the range once (a pinned MR) holds. Without CAP_SYS_ADMIN the
   * kernel hides them (every PFN reads 0): `visible` is then false, `pfns` holds 0 for
   * present pages, and `hidden` says why. A page not present has -1.
   */
  frames(offset?: number, length?: number): PageFrames {
    const s = this.span('frames', offset, length);
    const raw = sys('frames', { EACCES: 'Reading /proc/self/pagemap was refused' }, () => binding.frames(this.id, s.offset, s.length));
    const ratio = this.pageSize / binding.pageSize;
    const pfns = ratio === 1 ? raw.pfns : Float64Array.from({ length: Math.ceil(raw.pfns.length / ratio) }, (_, i) => raw.pfns[i * ratio]!);
    const out: PageFrames = { visible: raw.visible, pfns };
    if (!raw.visible) out.hidden = FRAMES_HIDDEN;
    return out;
  }

  /** Make the range resident: MADV_POPULATE_WRITE (or _READ), the user-space get_user_pages. */
  populate(offset?: number, length?: number, options?: PopulateOptions): void {
    const s = this.span('populate', offset, length);
    const write = checkBool('populate: options.write', checkObject('populate: options', options).write, true);
    this.#willBlock();
    sys(
      'populate',
      {
        EINVAL: 'MADV_POPULATE needs Linux 5.14 or newer',
        EFAULT: 'Populating a userfaultfd range opened in user-mode-only mode cannot fault from the kernel; touch the pages from a thread instead',
        ENOMEM: 'Not enough memory to make the range resident',
      },
      () => binding.populate(this.id, s.offset, s.length, write),
    );
  }

  /**
   * Make the range non-resident so the next access faults again: MADV_DONTNEED for
   * anonymous memory (the contents are dropped: the next read sees zeros or whatever a
   * userfaultfd handler provides), a hole punched in the file for memfd memory.
   */
  evict(offset?: number, length?: number): void {
    const s = this.span('evict', offset, length);
    this.#willBlock();
    this.#notifyInvalidating(s.offset, s.length);
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
    this.#notifyInvalidating(s.offset, s.length);
    sys('unmapPages', {}, () => binding.zap(this.id, s.offset, s.length));
    this.#notifyEvicted(s.offset, s.length);
  }

  /**
   * MADV_COLLAPSE (Linux 6.1): make the range transparent huge pages now, the way
   * khugepaged would later. Every 4 KiB frame of a collapsed 2 MiB range is replaced (its
   * physical address changes), pinned (mlocked) or not: pinning does not keep a DMA
   * address stable. The range must be whole 2 MiB pages (a region whose size is a multiple of
   * 2 MiB is 2 MiB aligned); it stays eligible for huge pages afterwards. shmem (shared)
   * regions also need /sys/kernel/mm/transparent_hugepage/shmem_enabled other than "never".
   */
  collapse(offset?: number, length?: number): void {
    const s = this.span('collapse', offset, length);
    if (this.hugetlb) throw invalidArg('collapse: hugetlb regions are huge pages already');
    if (this.address % BigInt(HUGE_PAGE_SIZE) !== 0n || s.offset % HUGE_PAGE_SIZE !== 0 || s.length % HUGE_PAGE_SIZE !== 0) {
      throw invalidArg(`collapse: the range must be whole 2 MiB pages (map a multiple of 2 MiB; offset ${s.offset}, length ${s.length})`);
    }
    this.#willBlock();
    sys(
      'collapse',
      {
        EINVAL:
          'MADV_COLLAPSE needs Linux 6.1+ and transparent huge pages not set to "never" (/sys/kernel/mm/transparent_hugepage/enabled; ' +
          'for shared regions also shmem_enabled)',
        EAGAIN: 'The kernel could not collapse the range right now (pages locked or busy); retry',
        ENOMEM: 'No free 2 MiB page to collapse into; free memory or retry later',
      },
      () => binding.advise(this.id, s.offset, s.length, MADV_COLLAPSE),
    );
    // The pages stayed resident in new frames: whoever caches translations re-checks them
    // (observers that only know eviction drop them).
    for (const o of this.#observers) {
      if (o.regionMoved) o.regionMoved(this, s.offset, s.length);
      else o.regionEvicted?.(this, s.offset, s.length);
    }
  }

  /**
   * MADV_PAGEOUT (Linux 5.4): reclaim the range now. Anonymous pages go to swap (without
   * swap they stay resident); clean file and shmem pages leave memory. Returns the number
   * of pages of the range that left memory.
   */
  pageout(offset?: number, length?: number): number {
    const s = this.span('pageout', offset, length);
    const before = this.residentPages(s.offset, s.length);
    sys('pageout', { EINVAL: 'MADV_PAGEOUT needs Linux 5.4+, and cannot reclaim locked (pinned) pages' }, () =>
      binding.advise(this.id, s.offset, s.length, MADV_PAGEOUT),
    );
    const gone = before - this.residentPages(s.offset, s.length);
    if (gone > 0) this.#notifyEvicted(s.offset, s.length);
    return Math.max(0, gone);
  }

  /**
   * PAGEMAP_SCAN (Linux 6.7): the runs of pages of the range that match the categories
   * (PageCategory bits), optionally write-protecting them (dirty tracking with WP_ASYNC).
   */
  pagemapScan(options?: PagemapScanOptions): PageRun[] {
    const opts = checkObject('pagemapScan: options', options);
    const s = this.span('pagemapScan', opts.offset as number | undefined, opts.length as number | undefined);
    const all = opts.all === undefined ? 0 : checkInt('pagemapScan: options.all', opts.all, 0, 0x7f);
    const none = opts.none === undefined ? 0 : checkInt('pagemapScan: options.none', opts.none, 0, 0x7f);
    const any = opts.any === undefined ? 0 : checkInt('pagemapScan: options.any', opts.any, 0, 0x7f);
    const wp = checkBool('pagemapScan: options.writeProtect', opts.writeProtect, false);
    if (wp && all === 0 && none === 0 && any === 0) {
      throw invalidArg('pagemapScan: writeProtect needs a category filter (e.g. { all: PageCategory.WRITTEN })');
    }
    // The kernel takes "inverted" bits as part of the mask: a page must lack them.
    const raw = sys(
      'pagemapScan',
      {
        EINVAL: 'PAGEMAP_SCAN needs Linux 6.7+; writeProtect also needs the range registered for write-protect on a userfaultfd opened with WP_ASYNC',
        ENOTTY: 'PAGEMAP_SCAN needs Linux 6.7 or newer',
      },
      () => binding.pagemapScan(this.id, s.offset, s.length, wp ? PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC : 0, all | none, none, any, 0x7f),
    );
    const runs: PageRun[] = [];
    for (let i = 0; i < raw.length; i += 3) runs.push({ offset: raw[i]!, length: raw[i + 1]! - raw[i]!, categories: raw[i + 2]! });
    return runs;
  }

  #willBlock(): void {
    for (const o of this.#observers) o.regionWillBlock?.(this);
  }

  #notifyInvalidating(offset: number, length: number): void {
    for (const o of this.#observers) o.regionInvalidating?.(this, offset, length);
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

  /** munlock the range (default: the whole region). */
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
    return new Region(raw, this.size, true, false, this, this.hugetlb);
  }

  /**
   * What another JS thread (a worker_thread) needs to open this same memory with
   * `Region.attach()`: plain data, so it can be posted. The memory stays mapped until every
   * thread's Region is closed.
   */
  share(): SharedRegion {
    this.#check();
    return { id: this.id, size: this.size, shared: this.shared, hugePages: this.hugePages, hugetlb: this.hugetlb };
  }

  /** Open, in this thread, a region another thread shared with `share()`. */
  static attach(handle: SharedRegion): Region {
    const h = checkObject('Region.attach: handle', handle) as Partial<SharedRegion>;
    const id = checkInt('Region.attach: handle.id', h.id, 1, 0xffffffff);
    const raw = sys('Region.attach', {}, () => binding.regionShare(id));
    return new Region(raw, checkInt('Region.attach: handle.size', h.size, 1), h.shared === true, h.hugePages === true, undefined, h.hugetlb === true);
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

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  #check(): void {
    if (this.#closed) throw closedError('Region');
  }
}

const MADV_PAGEOUT = 21;
const MADV_COLLAPSE = 25;
const PM_SCAN_WP_MATCHING = 1;
const PM_SCAN_CHECK_WPASYNC = 2;

/** The hugetlb pool as the kernel reports it, for error messages. */
function hugetlbPool(): string {
  try {
    const reserved = readFileSync('/proc/sys/vm/nr_hugepages', 'utf8').trim();
    const free = /HugePages_Free:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? '?';
    return `vm.nr_hugepages is ${reserved}, ${free} free`;
  } catch {
    return 'vm.nr_hugepages could not be read';
  }
}

/** Map `bytes` of memory (a multiple of the page size; of 2 MiB with huge pages or hugetlb). */
export function mapRegion(bytes: number, options?: MapOptions): Region {
  const opts = checkObject('mapRegion: options', options, known<MapOptions>({ shared: true, hugePages: true, hugetlb: true }));
  const shared = checkBool('mapRegion: options.shared', opts.shared, false);
  const hugePages = checkBool('mapRegion: options.hugePages', opts.hugePages, false);
  const hugetlb = checkBool('mapRegion: options.hugetlb', opts.hugetlb, false);
  if (hugePages && hugetlb) throw invalidArg('mapRegion: choose hugePages (transparent huge pages) or hugetlb (hugetlbfs), not both');
  const size = checkInt('mapRegion: bytes', bytes, 1);
  const unit = hugePages || hugetlb ? HUGE_PAGE_SIZE : PAGE_SIZE;
  if (size % unit !== 0) {
    throw invalidArg(
      `mapRegion: bytes (${size}) must be a multiple of ${unit}${hugePages ? ' with hugePages' : hugetlb ? ' with hugetlb' : ' (the page size)'}; round it up`,
    );
  }
  // Before the mmap: the mapping is handed to JavaScript as one ArrayBuffer, and a size the
  // platform cannot give one would fail after the mapping exists (and abort the process).
  if (size > kMaxLength)
    throw rangeError(
      `mapRegion: bytes (${size}) is more than one ArrayBuffer can hold on this platform (${kMaxLength}); map several smaller regions`,
    );
  if (hugetlb) {
    const pages = size / HUGE_PAGE_SIZE;
    const fix = `Reserve 2 MiB pages first, e.g. "sysctl vm.nr_hugepages=${pages}" as root (${hugetlbPool()})`;
    const raw = sys(
      'mapRegion',
      { ENOMEM: `Not enough free huge pages for ${pages} × 2 MiB. ${fix}`, EINVAL: `hugetlbfs is not available. ${fix}` },
      () => binding.mapRegion(size, shared, false, true),
    );
    return new Region(raw, size, shared, false, undefined, true);
  }
  const raw = sys('mapRegion', MMAP_FIXES, () => binding.mapRegion(size, shared, hugePages, false));
  return new Region(raw, size, shared, hugePages);
}
