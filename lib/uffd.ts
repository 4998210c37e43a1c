// userfaultfd for Node: genuine page faults on registered regions, handed to a TypeScript
// handler by a native reader thread, resolved with UFFDIO_COPY / ZEROPAGE / CONTINUE /
// WRITEPROTECT. See docs/threads.md for which thread touches what.
import { EventEmitter } from 'node:events';
import { binding, UFFD_EVENT_WIDTH, UffdEventKind, UffdFaultFlag, type RawUffdStats } from '../native/index.js';
import { closedError, PfrError, sys } from './errors.js';
import { PageCategory, type Region, type RegionObserver } from './region.js';
import { checkBool, checkFunction, checkInt, checkObject, invalidArg, rangeError, known } from './validate.js';

/** UFFD_FEATURE_* bits (linux/userfaultfd.h). */
export const UffdFeature = {
  /** Write-protect faults (UFFD_FEATURE_PAGEFAULT_FLAG_WP). */
  PAGEFAULT_FLAG_WP: 1n << 0n,
  /** Report fork() and copy the registrations to the child. */
  EVENT_FORK: 1n << 1n,
  /** Report mremap() of registered memory. */
  EVENT_REMAP: 1n << 2n,
  /** Report MADV_DONTNEED / MADV_REMOVE of registered memory. */
  EVENT_REMOVE: 1n << 3n,
  /** Missing faults on hugetlbfs. */
  MISSING_HUGETLBFS: 1n << 4n,
  /** Missing faults on shmem. */
  MISSING_SHMEM: 1n << 5n,
  /** Report munmap() of registered memory. */
  EVENT_UNMAP: 1n << 6n,
  /** Missing faults raise SIGBUS instead of an event. */
  SIGBUS: 1n << 7n,
  /** Faults carry the faulting thread's id. */
  THREAD_ID: 1n << 8n,
  /** Minor faults on hugetlbfs. */
  MINOR_HUGETLBFS: 1n << 9n,
  /** Minor faults on shmem. */
  MINOR_SHMEM: 1n << 10n,
  /** Fault addresses are exact, not page-aligned. */
  EXACT_ADDRESS: 1n << 11n,
  /** Write-protect on hugetlbfs and shmem. */
  WP_HUGETLBFS_SHMEM: 1n << 12n,
  /** Write-protect pages never populated. */
  WP_UNPOPULATED: 1n << 13n,
  /** UFFDIO_POISON. */
  POISON: 1n << 14n,
  /** Asynchronous write-protect: the kernel resolves WP faults itself. */
  WP_ASYNC: 1n << 15n,
  /** UFFDIO_MOVE. */
  MOVE: 1n << 16n,
} as const;

// performance.now() minus process.hrtime() in ms (both CLOCK_MONOTONIC; this thread's time
// origin): a batch's native receive time becomes a Fault's receivedAt with an addition.
const HRTIME_TO_PERFORMANCE_MS = ((): number => {
  const hrtimeMs = (): number => {
    const [s, ns] = process.hrtime();
    return s * 1e3 + ns / 1e6;
  };
  // An hrtime read between two performance.now() reads, the tightest pair of a few (the first
  // calls also load code): the offset is then within a few tens of ns.
  let best = Infinity,
    offset = 0;
  for (let i = 0; i < 8; i++) {
    const before = performance.now();
    const hr = hrtimeMs();
    const after = performance.now();
    if (after - before < best) [best, offset] = [after - before, (before + after) / 2 - hr];
  }
  return offset;
})();

const REGISTER_MISSING = 1;
const REGISTER_WP = 2;
const REGISTER_MINOR = 4;
const CONTINUE_MODE_WP = 2;
const COPY_MODE_DONTWAKE = 1;
const COPY_MODE_WP = 2;

/**
 * The features this userfaultfd has: the ones it asked for at the UFFDIO_API handshake and
 * the kernel enabled. (On output the kernel lists every feature it *offers*; that set is
 * `available`, and a feature there but not in `raw` is off for this uffd.)
 */
export interface UffdFeatures {
  /** The UFFD_FEATURE_* mask enabled on this uffd. */
  raw: bigint;
  /** The UFFD_FEATURE_* mask the kernel offers (what open({ features }) could ask for). */
  available: bigint;
  /** Faults carry the faulting thread's id (THREAD_ID; required). */
  threadId: boolean;
  /** Fault addresses are exact (EXACT_ADDRESS, 5.18). */
  exactAddress: boolean;
  /** Write-protect faults on anonymous memory (5.7). */
  writeProtect: boolean;
  /** Write-protect faults on shmem and hugetlbfs (5.19). */
  writeProtectShmem: boolean;
  /** Write-protecting unpopulated pages (6.4). */
  writeProtectUnpopulated: boolean;
  /** Asynchronous write-protect: the kernel resolves WP faults itself, PAGEMAP_SCAN reads them (6.7). */
  writeProtectAsync: boolean;
  /** Minor faults on shmem (5.14). */
  minor: boolean;
  /** Minor faults on hugetlbfs (5.13). */
  minorHugetlbfs: boolean;
  /** Missing faults on shmem. */
  missingShmem: boolean;
  /** Missing faults on hugetlbfs. */
  missingHugetlbfs: boolean;
  /** Missing faults raise SIGBUS in the faulting thread instead of an event. */
  sigbus: boolean;
  /** UFFDIO_POISON (6.6). */
  poison: boolean;
  /** UFFDIO_MOVE (6.8). */
  move: boolean;
  /** fork() is reported. */
  eventFork: boolean;
  /** MADV_DONTNEED / MADV_REMOVE are reported. */
  eventRemove: boolean;
  /** munmap() is reported. */
  eventUnmap: boolean;
  /** mremap() is reported. */
  eventRemap: boolean;
}

/** What kind of fault: a missing page, a write to a write-protected page, or a page in the page cache but not mapped (minor). */
export type FaultKind = 'missing' | 'write-protect' | 'minor';

/** One genuine page fault. */
export interface Fault {
  /** The registered region the page belongs to. */
  region: Region;
  /** Page-aligned offset of the faulting page in the region. */
  offset: number;
  /** The faulting address: exact where UFFD_FEATURE_EXACT_ADDRESS was granted, else page-aligned. */
  address: bigint;
  /** What kind of fault it is. */
  kind: FaultKind;
  /** The access was a write. */
  write: boolean;
  /** Kernel thread id of the faulting thread (UFFD_FEATURE_THREAD_ID). */
  threadId: number;
  /**
   * 'handler': waiting for the handler to resolve it. 'native': a fault of the handler
   * thread itself, already resolved in native code with the region's default content
   * (it could not wait for its own handler), reported for observation.
   */
  resolvedBy: 'handler' | 'native';
  /** When the reader thread handed it over (performance.now() of the JS thread). */
  receivedAt: number;
}

/** Resolves one fault (copy, zeropage, continue, writeProtect…); may be async. */
export type FaultHandler = (fault: Fault, uffd: Userfaultfd) => void | Promise<void>;

/** Options of `Userfaultfd.open`. */
export interface UffdOpenOptions {
  /** Handle faults with this function (also settable with onFault). */
  handler?: FaultHandler;
  /** A forwarded fault not resolved within this time is resolved with the default and reported. Default 5000 ms. */
  timeoutMs?: number;
  /** Ask for UFFD_USER_MODE_ONLY even when privileged. */
  userModeOnly?: boolean;
  /** Extra UFFD_FEATURE_* bits to request when available. */
  features?: bigint;
  /**
   * How faults reach the handler. 'event-loop' (default): this thread's event loop reads
   * the uffd itself, and the native reader thread only steps in when this thread stops
   * reading (blocked in a fault of its own, or busy): two thread hand-offs per fault.
   * 'thread': the native reader thread reads every event and hands batches over through a
   * thread-safe function: one more hand-off per fault. See docs/threads.md.
   */
  delivery?: 'event-loop' | 'thread';
}

/** Options of `register`: the range and the modes. */
export interface RegisterOptions {
  /** Byte offset of the range in the region (default 0). */
  offset?: number;
  /** Bytes of the range (default: to the end). */
  length?: number;
  /** Trap accesses to pages that are not there (UFFDIO_REGISTER_MODE_MISSING). Default true. */
  missing?: boolean;
  /** Trap writes to write-protected pages (MODE_WP). */
  writeProtect?: boolean;
  /** Trap accesses to pages in the page cache but not mapped here (MODE_MINOR, shmem). */
  minor?: boolean;
}

/** Options every resolving call takes. */
export interface ResolveOptions {
  /** Wake the faulting threads (default true). */
  wake?: boolean;
}

/** Options of `copy` (UFFDIO_COPY). */
export interface CopyOptions extends ResolveOptions {
  /** Bytes to place (a multiple of the page size); default: the data's length. */
  length?: number;
  /** Map the copied pages write-protected (UFFDIO_COPY_MODE_WP). */
  writeProtect?: boolean;
}

/** Options of `continue` (UFFDIO_CONTINUE). */
export interface ContinueOptions extends ResolveOptions {
  /** Map the pages write-protected (UFFDIO_CONTINUE_MODE_WP, Linux 6.4): the next write is a write-protect fault. */
  writeProtect?: boolean;
}

/** Options of `move` (UFFDIO_MOVE). */
export interface MoveOptions extends ResolveOptions {
  /** Skip source pages that are not there instead of failing with ENOENT (UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES). */
  allowSourceHoles?: boolean;
}

const RESOLVE_KEYS = known<ResolveOptions>({ wake: true });
const COPY_KEYS = known<CopyOptions>({ wake: true, length: true, writeProtect: true });
const CONTINUE_KEYS = known<ContinueOptions>({ wake: true, writeProtect: true });
const MOVE_KEYS = known<MoveOptions>({ wake: true, allowSourceHoles: true });
const SPAN_KEYS = known<{ offset?: number; length?: number }>({ offset: true, length: true });
const DIRTY_PAGES_KEYS = known<DirtyPagesOptions>({ offset: true, length: true, rearm: true });

/** The range `dirtyPages()` reads and clears. */
export interface DirtyPagesOptions {
  /** Byte offset of the range (default 0). */
  offset?: number;
  /** Bytes of the range (default: to the end). */
  length?: number;
  /** Write-protect the dirty pages again, so the next call reports only newer writes. Default true. */
  rearm?: boolean;
}

/** Events of a Userfaultfd. */
export interface UserfaultfdEvents {
  /** Every fault the uffd saw (before the handler runs, and the JS thread's own ones). */
  fault: [fault: Fault];
  /** A handler that threw, rejected or timed out (ERR_PFR_HANDLER_*), or a failed native resolution. */
  error: [err: PfrError];
  /** Pages of a registered range were dropped (MADV_DONTNEED, MADV_REMOVE: evict()). */
  remove: [
    event: {
      /** Start address of the range. */
      address: bigint;
      /** Bytes of the range. */
      length: number;
    },
  ];
  /** A registered range was unmapped. */
  unmap: [
    event: {
      /** Start address of the range. */
      address: bigint;
      /** Bytes of the range. */
      length: number;
    },
  ];
  /** A registered range was moved by mremap. */
  remap: [
    event: {
      /** Old start address. */
      from: bigint;
      /** New start address. */
      to: bigint;
      /** Bytes moved. */
      length: number;
    },
  ];
  /** The process forked (features EVENT_FORK); the child's copy of the registrations was dropped. */
  fork: [event: Record<string, never>];
}

/** Counters of one userfaultfd. */
export interface UffdStats extends RawUffdStats {
  /** Faults the handler resolved (or that resolved while it ran). */
  handled: number;
  /** Faults whose handler threw or rejected (resolved with the default instead). */
  handlerErrors: number;
  /** Faults whose handler did not resolve them within timeoutMs. */
  handlerTimeouts: number;
}

interface Registration {
  region: Region;
  offset: number;
  length: number;
  mode: number;
  ioctls: bigint;
}

// Requested whenever the kernel offers them.
const WANTED =
  UffdFeature.THREAD_ID |
  UffdFeature.EXACT_ADDRESS |
  UffdFeature.PAGEFAULT_FLAG_WP |
  UffdFeature.MINOR_SHMEM |
  UffdFeature.MINOR_HUGETLBFS |
  UffdFeature.MISSING_SHMEM |
  UffdFeature.MISSING_HUGETLBFS |
  UffdFeature.WP_HUGETLBFS_SHMEM |
  UffdFeature.WP_UNPOPULATED |
  UffdFeature.POISON |
  UffdFeature.MOVE |
  UffdFeature.EVENT_REMOVE |
  UffdFeature.EVENT_UNMAP |
  UffdFeature.EVENT_REMAP;

// Features that change what a fault does; asked for only through open({ features }).
// SIGBUS: missing faults raise SIGBUS in the faulting thread (the native toucher reports
// the access as failed; the JS thread cannot survive one). EVENT_FORK: fork() waits until
// the reader reads the event (it then drops the child's registrations). WP_ASYNC: the
// kernel resolves write-protect faults itself and PAGEMAP_SCAN reports the written pages.
const KNOWN = Object.values(UffdFeature).reduce((a, b) => a | b, 0n);

const OPEN_FIXES: Record<string, string> = {
  EPERM:
    'userfaultfd is refused to this user: sysctl vm.unprivileged_userfaultfd is 0 and neither UFFD_USER_MODE_ONLY nor /dev/userfaultfd was allowed. ' +
    'Run as root or with CAP_SYS_PTRACE, set "sysctl vm.unprivileged_userfaultfd=1", or give this user read-write access to /dev/userfaultfd',
  EACCES: 'Access to /dev/userfaultfd was refused: give this user read-write access to it (e.g. a group with rw permission)',
  ENOSYS: 'This kernel has no userfaultfd (CONFIG_USERFAULTFD); Linux 4.11 or newer with it enabled is needed',
  EINVAL: 'The kernel refused the userfaultfd API handshake (features too new for it)',
  EMFILE: 'Too many open files: close some, or raise "ulimit -n"',
};

const REGISTER_FIXES: Record<string, string> = {
  EBUSY: 'The range is already registered with another userfaultfd: unregister it there first',
  EINVAL: 'This mode is not supported for this memory (minor faults need shared memfd memory; write-protect needs Linux 5.7+)',
  EPERM: 'The range cannot be registered by this user',
};

const RESOLVE_FIXES: Record<string, string> = {
  ENOENT: 'The range is not registered (or was unregistered), or a source page of a move is missing: register it first, or pass allowSourceHoles',
  EINVAL:
    'The range or mode is not valid for this memory (zeropage is for missing faults of anonymous/shmem memory; continue is for minor faults of shmem)',
  ESRCH: 'The faulting process is gone',
  EAGAIN: 'The address space kept changing; retry',
  ENOMEM: 'Not enough memory to place the pages',
  EFAULT: 'The source buffer is not readable',
};

/**
 * A userfaultfd. Faults of any thread but this JS thread (native toucher and copy-engine
 * threads, worker threads) reach the handler; this thread's own faults are resolved
 * natively at once so it can always read and write registered memory.
 */
export class Userfaultfd extends EventEmitter<UserfaultfdEvents> implements RegionObserver {
  /** The features this uffd asked for and got. */
  readonly features: UffdFeatures;
  /** How the fd was obtained: 'syscall', 'user-mode-only' or '/dev/userfaultfd'. */
  readonly mode: 'syscall' | 'user-mode-only' | '/dev/userfaultfd';
  /** Kernel thread id of the JS thread that runs the handler. */
  readonly handlerThreadId: number;
  /** The raw UFFDIO_* ioctl mask of the handshake. */
  readonly ioctls: bigint;
  #handle: number;
  #closed = false;
  #handler: FaultHandler | undefined;
  #regions = new Map<number, Registration[]>();
  #handled = 0;
  #handlerErrors = 0;
  #handlerTimeouts = 0;

  private constructor(handle: number, features: bigint, available: bigint, ioctls: bigint, how: Userfaultfd['mode'], tid: number) {
    super();
    this.#handle = handle;
    this.mode = how;
    this.ioctls = ioctls;
    this.handlerThreadId = tid;
    const has = (bit: bigint): boolean => (features & bit) !== 0n;
    this.features = {
      raw: features,
      available,
      threadId: has(UffdFeature.THREAD_ID),
      exactAddress: has(UffdFeature.EXACT_ADDRESS),
      writeProtect: has(UffdFeature.PAGEFAULT_FLAG_WP),
      writeProtectShmem: has(UffdFeature.WP_HUGETLBFS_SHMEM),
      writeProtectUnpopulated: has(UffdFeature.WP_UNPOPULATED),
      writeProtectAsync: has(UffdFeature.WP_ASYNC),
      minor: has(UffdFeature.MINOR_SHMEM),
      minorHugetlbfs: has(UffdFeature.MINOR_HUGETLBFS),
      missingShmem: has(UffdFeature.MISSING_SHMEM),
      missingHugetlbfs: has(UffdFeature.MISSING_HUGETLBFS),
      sigbus: has(UffdFeature.SIGBUS),
      poison: has(UffdFeature.POISON),
      move: has(UffdFeature.MOVE),
      eventFork: has(UffdFeature.EVENT_FORK),
      eventRemove: has(UffdFeature.EVENT_REMOVE),
      eventUnmap: has(UffdFeature.EVENT_UNMAP),
      eventRemap: has(UffdFeature.EVENT_REMAP),
    };
  }

  /**
   * UFFDIO_API handshake. Tries the plain syscall, then UFFD_USER_MODE_ONLY (what an
   * unprivileged user gets with vm.unprivileged_userfaultfd=0), then /dev/userfaultfd.
   */
  static open(options?: UffdOpenOptions): Userfaultfd {
    const opts = checkObject(
      'Userfaultfd.open: options',
      options,
      known<UffdOpenOptions>({ handler: true, timeoutMs: true, userModeOnly: true, features: true, delivery: true }),
    );
    const userModeOnly = checkBool('Userfaultfd.open: options.userModeOnly', opts.userModeOnly, false);
    const timeoutMs = opts.timeoutMs === undefined ? 5000 : checkInt('Userfaultfd.open: options.timeoutMs', opts.timeoutMs, 1, 3_600_000);
    if (opts.handler !== undefined) checkFunction('Userfaultfd.open: options.handler', opts.handler);
    const delivery = opts.delivery ?? 'event-loop';
    if (delivery !== 'event-loop' && delivery !== 'thread')
      throw invalidArg(`Userfaultfd.open: options.delivery must be 'event-loop' or 'thread', got ${String(delivery)}`);
    let extra = 0n;
    if (opts.features !== undefined) {
      if (typeof opts.features !== 'bigint' || opts.features < 0n)
        throw invalidArg('Userfaultfd.open: options.features must be a non-negative bigint');
      if ((opts.features & ~KNOWN) !== 0n) {
        throw invalidArg(
          `Userfaultfd.open: options.features has bits no UFFD_FEATURE_* names (0x${(opts.features & ~KNOWN).toString(16)}); use UffdFeature.*`,
        );
      }
      extra = opts.features;
    }
    const fixes =
      extra & UffdFeature.EVENT_FORK
        ? { ...OPEN_FIXES, EPERM: 'UFFD_FEATURE_EVENT_FORK needs CAP_SYS_PTRACE (run as root), or leave EVENT_FORK out of options.features' }
        : OPEN_FIXES;
    const raw = sys('Userfaultfd.open', fixes, () => binding.uffdOpen(WANTED | extra, UffdFeature.THREAD_ID, userModeOnly));
    const uffd = new Userfaultfd(raw.handle, raw.features, raw.available, raw.ioctls, raw.how, raw.handlerTid);
    binding.uffdSetTimeout(raw.handle, timeoutMs);
    if (opts.handler) uffd.#handler = opts.handler as FaultHandler;
    binding.uffdStart(
      raw.handle,
      (events, length, addresses, receivedMs) => uffd.#onEvents(events, length, addresses, receivedMs + HRTIME_TO_PERFORMANCE_MS),
      delivery === 'event-loop',
    );
    return uffd;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Forwarded faults not yet resolved. */
  get pending(): number {
    this.#check();
    return binding.uffdPending(this.#handle);
  }

  /** Set (or replace) the fault handler. Without one, faults are resolved with the default at once. */
  onFault(handler: FaultHandler): this {
    this.#check();
    checkFunction('onFault: handler', handler);
    this.#handler = handler;
    return this;
  }

  /** Change the handler deadline (ms). */
  setTimeout(ms: number): void {
    this.#check();
    binding.uffdSetTimeout(this.#handle, checkInt('setTimeout: ms', ms, 1, 3_600_000));
  }

  /** Register a page-aligned range of a region. Returns the UFFDIO_* ioctls valid on it. */
  register(region: Region, options?: RegisterOptions): bigint {
    this.#check();
    const opts = checkObject(
      'register: options',
      options,
      known<RegisterOptions>({ offset: true, length: true, missing: true, writeProtect: true, minor: true }),
    );
    const s = region.span('register', opts.offset as number | undefined, opts.length as number | undefined, true);
    const missing = checkBool('register: options.missing', opts.missing, true);
    const wp = checkBool('register: options.writeProtect', opts.writeProtect, false);
    const minor = checkBool('register: options.minor', opts.minor, false);
    if (!missing && !wp && !minor) throw invalidArg('register: at least one of missing, writeProtect, minor must be true');
    const unsupported = (what: string): PfrError => new PfrError('ERR_PFR_UNSUPPORTED', `register: this kernel did not grant ${what}`);
    if (wp && !this.features.writeProtect) throw unsupported('write-protect faults (Linux 5.7+)');
    if (wp && (region.shared || region.hugetlb) && !this.features.writeProtectShmem)
      throw unsupported('write-protect faults on shmem / hugetlbfs (Linux 5.19+)');
    if (minor && !region.shared) throw invalidArg('register: minor faults need shared memory; map the region with { shared: true }');
    if (minor && !region.hugetlb && !this.features.minor) throw unsupported('minor faults on shmem (Linux 5.14+)');
    if (minor && region.hugetlb && !this.features.minorHugetlbfs) throw unsupported('minor faults on hugetlbfs (Linux 5.13+)');
    if (missing && region.hugetlb && !this.features.missingHugetlbfs) throw unsupported('missing faults on hugetlbfs (Linux 4.11+)');
    const mode = (missing ? REGISTER_MISSING : 0) | (wp ? REGISTER_WP : 0) | (minor ? REGISTER_MINOR : 0);
    const ioctls = sys('register', REGISTER_FIXES, () =>
      binding.uffdRegister(this.#handle, region.id, region.address + BigInt(s.offset), s.length, mode, region.pageSize),
    );
    let list = this.#regions.get(region.id);
    if (!list) {
      list = [];
      this.#regions.set(region.id, list);
      region.observe(this);
    }
    list.push({ region, offset: s.offset, length: s.length, mode, ioctls });
    return ioctls;
  }

  /** Unregister a range (default: everything of the region registered here). Wakes blocked threads. */
  unregister(region: Region, options?: { offset?: number; length?: number }): void {
    this.#check();
    const opts = checkObject('unregister: options', options, SPAN_KEYS);
    const s = region.span('unregister', opts.offset as number | undefined, opts.length as number | undefined, true);
    sys('unregister', RESOLVE_FIXES, () => binding.uffdUnregister(this.#handle, region.address + BigInt(s.offset), s.length));
    const list = (this.#regions.get(region.id) ?? []).filter((r) => r.offset + r.length <= s.offset || r.offset >= s.offset + s.length);
    if (list.length) this.#regions.set(region.id, list);
    else {
      this.#regions.delete(region.id);
      region.unobserve(this);
    }
  }

  /** True if the page at `offset` of `region` is registered here. */
  isRegistered(region: Region, offset = 0): boolean {
    return (this.#regions.get(region.id) ?? []).some((r) => offset >= r.offset && offset < r.offset + r.length);
  }

  /**
   * UFFDIO_COPY: place `data` at `offset` (page-aligned, whole pages) and wake the faulting
   * threads. A range may span many pages (touch-ahead). Pages resolved by someone else in
   * the meantime (EEXIST) are skipped. Returns the bytes placed.
   */
  copy(region: Region, offset: number, data: ArrayBufferView | ArrayBuffer, options?: CopyOptions): number {
    this.#check();
    const opts = checkObject('copy: options', options, COPY_KEYS);
    const bytes = data instanceof ArrayBuffer ? data.byteLength : ArrayBuffer.isView(data) ? data.byteLength : -1;
    if (bytes < 0) throw invalidArg('copy: data must be a Buffer, TypedArray, DataView or ArrayBuffer');
    const length = opts.length === undefined ? bytes : checkInt('copy: options.length', opts.length, 1);
    if (length > bytes) throw rangeError(`copy: length ${length} is longer than the data (${bytes} bytes)`);
    const s = this.#registered('copy', region, offset, length);
    const wp = checkBool('copy: options.writeProtect', opts.writeProtect, false);
    const wake = checkBool('copy: options.wake', opts.wake, true);
    const mode = (wake ? 0 : COPY_MODE_DONTWAKE) | (wp ? COPY_MODE_WP : 0);
    return sys('copy', RESOLVE_FIXES, () => binding.uffdCopy(this.#handle, region.address, s.offset, s.length, data, mode));
  }

  /**
   * UFFDIO_ZEROPAGE: map zero pages over the range (missing faults). Returns the bytes it
   * mapped (pages already there are skipped). hugetlbfs has no zero page: use copy().
   */
  zeropage(region: Region, offset: number, length: number, options?: ResolveOptions): number {
    this.#check();
    const s = this.#registered('zeropage', region, offset, length);
    const wake = checkBool('zeropage: options.wake', checkObject('zeropage: options', options, RESOLVE_KEYS).wake, true);
    if (region.hugetlb) throw invalidArg('zeropage: hugetlbfs has no zero page (UFFDIO_ZEROPAGE is EINVAL there); resolve with copy() of zeros');
    return sys('zeropage', RESOLVE_FIXES, () => binding.uffdZeropage(this.#handle, region.address + BigInt(s.offset), s.length, !wake));
  }

  /**
   * UFFDIO_CONTINUE: map the page-cache pages already there (minor faults), optionally
   * write-protected (UFFDIO_CONTINUE_MODE_WP, Linux 6.4). Returns the bytes it mapped.
   */
  continue(region: Region, offset: number, length: number, options?: ContinueOptions): number {
    this.#check();
    const s = this.#registered('continue', region, offset, length);
    const opts = checkObject('continue: options', options, CONTINUE_KEYS);
    const wake = checkBool('continue: options.wake', opts.wake, true);
    const wp = checkBool('continue: options.writeProtect', opts.writeProtect, false);
    if (wp) {
      // CONTINUE_MODE_WP came with WP_UNPOPULATED in Linux 6.4: an older kernel says EINVAL.
      if ((this.features.available & UffdFeature.WP_UNPOPULATED) === 0n) {
        throw new PfrError('ERR_PFR_UNSUPPORTED', 'continue: { writeProtect: true } needs UFFDIO_CONTINUE_MODE_WP (Linux 6.4+)');
      }
      this.#requireMode(
        region,
        s.offset,
        s.length,
        REGISTER_WP,
        'continue: { writeProtect: true } needs the range registered with { writeProtect: true } too',
      );
    }
    return sys('continue', RESOLVE_FIXES, () =>
      binding.uffdContinue(this.#handle, region.address + BigInt(s.offset), s.length, !wake, wp ? CONTINUE_MODE_WP : 0),
    );
  }

  /**
   * UFFDIO_POISON (Linux 6.6): mark the range's missing pages poisoned and wake the
   * faulting threads. Their access then fails: a native thread (the toucher) reports it as
   * failed; the JS thread, which cannot survive SIGBUS, must not touch them. For a page
   * that could not be fetched, instead of silently handing out zeros. Returns the bytes poisoned:
   * a page that is there already is skipped, and so is a missing page that carries a uffd-wp
   * marker (write-protected while missing, or by a PAGEMAP_SCAN re-arm): the kernel refuses any
   * marker, so drop it first with writeProtect(…, false, { wake: false }). A woken thread whose
   * page was skipped faults again: fewer bytes than asked is not a failed page.
   */
  poison(region: Region, offset: number, length: number, options?: ResolveOptions): number {
    this.#check();
    const s = this.#registered('poison', region, offset, length);
    const wake = checkBool('poison: options.wake', checkObject('poison: options', options, RESOLVE_KEYS).wake, true);
    if (!this.features.poison) throw new PfrError('ERR_PFR_UNSUPPORTED', 'poison: UFFDIO_POISON needs Linux 6.6 or newer');
    return sys('poison', RESOLVE_FIXES, () => binding.uffdPoison(this.#handle, region.address + BigInt(s.offset), s.length, !wake));
  }

  /**
   * UFFDIO_MOVE (Linux 6.8): move the pages of `source` (anonymous private memory of this
   * process) into `region` at `offset` (registered here), without copying: place fetched
   * pages, or take a page out of a registered region into a staging one (which must be
   * registered here too). Destination pages that are there already are skipped. Returns
   * the bytes moved.
   */
  move(region: Region, offset: number, source: Region, sourceOffset: number, length: number, options?: MoveOptions): number {
    this.#check();
    const s = this.#registered('move', region, offset, length);
    const src = source.span('move: source', sourceOffset, s.length, true);
    const opts = checkObject('move: options', options, MOVE_KEYS);
    const wake = checkBool('move: options.wake', opts.wake, true);
    const holes = checkBool('move: options.allowSourceHoles', opts.allowSourceHoles, false);
    if (!this.features.move) throw new PfrError('ERR_PFR_UNSUPPORTED', 'move: UFFDIO_MOVE needs Linux 6.8 or newer');
    for (const r of [region, source]) {
      if (r.shared || r.hugetlb) throw invalidArg('move: UFFDIO_MOVE moves anonymous private pages only; map both regions without shared or hugetlb');
    }
    const a = region.address + BigInt(s.offset),
      b = source.address + BigInt(src.offset);
    if (a < b + BigInt(s.length) && b < a + BigInt(s.length)) throw invalidArg('move: the source and destination ranges overlap');
    const holesBefore = holes ? src.length / source.pageSize - source.residentPages(src.offset, src.length) : 0;
    const moved = sys(
      'move',
      {
        ...RESOLVE_FIXES,
        EBUSY: 'A source page is shared (after fork, KSM or pinning) and cannot be moved; copy it instead',
        EINVAL: 'UFFDIO_MOVE needs both ranges in anonymous private memory, page-aligned, and the destination registered here',
      },
      () => binding.uffdMove(this.#handle, a, b, s.length, !wake, holes),
    );
    // With ALLOW_SRC_HOLES the kernel counts a hole as moved; report the pages really moved.
    return moved - holesBefore * source.pageSize;
  }

  /**
   * The pages of the range written since they were last write-protected, with
   * UFFD_FEATURE_WP_ASYNC (Linux 6.7; open({ features: UffdFeature.WP_ASYNC })) and the
   * PAGEMAP_SCAN ioctl: dirty-page tracking without a fault per first write. Start
   * tracking with writeProtect(region, …, true); each call re-arms what it reports unless
   * `rearm` is false. Returns region offsets, one per dirty page.
   */
  dirtyPages(region: Region, options?: DirtyPagesOptions): number[] {
    this.#check();
    const opts = checkObject('dirtyPages: options', options, DIRTY_PAGES_KEYS);
    const s = this.#registered('dirtyPages', region, (opts.offset as number | undefined) ?? 0, (opts.length as number | undefined) ?? region.size);
    const rearm = checkBool('dirtyPages: options.rearm', opts.rearm, true);
    if (!this.features.writeProtectAsync) {
      throw new PfrError('ERR_PFR_UNSUPPORTED', 'dirtyPages: open the userfaultfd with { features: UffdFeature.WP_ASYNC } (Linux 6.7+)');
    }
    this.#requireMode(region, s.offset, s.length, REGISTER_WP, 'dirtyPages: register the range with { writeProtect: true } first');
    const out: number[] = [];
    for (const run of region.pagemapScan({ offset: s.offset, length: s.length, all: PageCategory.WRITTEN, writeProtect: rearm })) {
      for (let o = run.offset; o < run.offset + run.length; o += region.pageSize) out.push(o);
    }
    return out;
  }

  /**
   * UFFDIO_WRITEPROTECT: protect (on) or unprotect (off, which resolves WP faults) the range.
   * Only unprotecting wakes (as the kernel does); after protecting a page a thread waits on,
   * call wake().
   */
  writeProtect(region: Region, offset: number, length: number, on: boolean, options?: ResolveOptions): void {
    this.#check();
    const s = this.#registered('writeProtect', region, offset, length);
    checkBool('writeProtect: on', on, false);
    const wake = checkBool('writeProtect: options.wake', checkObject('writeProtect: options', options, RESOLVE_KEYS).wake, true);
    // The kernel says ENOENT both for an unregistered range and for one registered without WP.
    sys(
      'writeProtect',
      { ...RESOLVE_FIXES, ENOENT: 'The range is not registered for write-protect faults: register it with { writeProtect: true } first' },
      () => binding.uffdWriteProtect(this.#handle, region.address + BigInt(s.offset), s.length, on, !wake),
    );
  }

  /** UFFDIO_WAKE. A bare wake without resolving makes the thread fault again. */
  wake(region: Region, offset: number, length: number): void {
    this.#check();
    const s = this.#registered('wake', region, offset, length);
    sys('wake', RESOLVE_FIXES, () => binding.uffdWake(this.#handle, region.address + BigInt(s.offset), s.length));
  }

  /** Resolve a fault with the region's default: zero page (missing), CONTINUE (minor), unprotect (write-protect). */
  resolveDefault(fault: Fault): void {
    const ps = fault.region.pageSize;
    if (fault.kind === 'minor') this.continue(fault.region, fault.offset, ps);
    else if (fault.kind === 'write-protect') this.writeProtect(fault.region, fault.offset, ps, false);
    else if (fault.region.hugetlb) this.copy(fault.region, fault.offset, new Uint8Array(ps));
    else this.zeropage(fault.region, fault.offset, ps);
  }

  /** The counters now. */
  stats(): UffdStats {
    this.#check();
    return { ...binding.uffdStats(this.#handle), handled: this.#handled, handlerErrors: this.#handlerErrors, handlerTimeouts: this.#handlerTimeouts };
  }

  /**
   * Stop the reader, resolve every pending fault with the default, unregister every range
   * (waking anyone left), close the fd. Idempotent; nothing stays blocked.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    binding.uffdClose(this.#handle);
    for (const list of this.#regions.values()) list[0]?.region.unobserve(this);
    this.#regions.clear();
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * RegionObserver (not for applications): this thread is about to evict or populate registered memory: the call blocks
   * until the uffd is read (REMOVE events, its own faults), so have the guard read now.
   */
  regionWillBlock(): void {
    if (!this.#closed) binding.uffdKick(this.#handle);
  }

  /** RegionObserver (not for applications): a region is closing; unregister it so nothing stays blocked on it. */
  regionClosing(region: Region): void {
    if (this.#closed) return;
    for (const r of this.#regions.get(region.id) ?? []) {
      try {
        binding.uffdUnregister(this.#handle, region.address + BigInt(r.offset), r.length);
      } catch {
        // already gone (unmapped): nothing is blocked on it
      }
    }
    this.#regions.delete(region.id);
  }

  /** Every page of the range must be registered here with `mode` (a REGISTER_* bit). */
  #requireMode(region: Region, offset: number, length: number, mode: number, message: string): void {
    const covered = (this.#regions.get(region.id) ?? []).filter((r) => r.mode & mode);
    for (let o = offset; o < offset + length; o += region.pageSize) {
      if (!covered.some((r) => o >= r.offset && o < r.offset + r.length)) throw new PfrError('ERR_PFR_NOT_REGISTERED', message);
    }
  }

  #registered(what: string, region: Region, offset: number, length: number): { offset: number; length: number } {
    const s = region.span(what, offset, length, true);
    if (!this.#regions.has(region.id)) {
      throw new PfrError('ERR_PFR_NOT_REGISTERED', `${what}: the region is not registered with this userfaultfd; call register(region) first`);
    }
    return s;
  }

  #regionById(id: number): Region | undefined {
    return this.#regions.get(id)?.[0]?.region;
  }

  /**
   * The first `length` numbers of `ev`, and each event's address from `addresses`: a BigInt
   * read from a BigUint64Array costs a tenth of BigInt(number). The native side reuses both
   * arrays for its next batch.
   */
  #onEvents(ev: Float64Array, length: number, addresses: BigUint64Array, now: number): void {
    if (this.#closed) return;
    for (let i = 0, e = 0; i < length; i += UFFD_EVENT_WIDTH, e++) {
      const kind = ev[i] as UffdEventKind;
      const flags = ev[i + 1]!;
      const address = addresses[e]!;
      switch (kind) {
        case UffdEventKind.Fault:
        case UffdEventKind.FaultResolved: {
          const region = this.#regionById(ev[i + 4]!);
          if (!region) {
            if (kind === UffdEventKind.Fault) this.#resolveRaw(address, flags);
            break;
          }
          const fault: Fault = {
            region,
            offset: ev[i + 5]!,
            address,
            kind: flags & UffdFaultFlag.WriteProtect ? 'write-protect' : flags & UffdFaultFlag.Minor ? 'minor' : 'missing',
            write: (flags & UffdFaultFlag.Write) !== 0,
            threadId: ev[i + 3]!,
            resolvedBy: kind === UffdEventKind.Fault ? 'handler' : 'native',
            receivedAt: now,
          };
          if (this.listenerCount('fault')) this.emit('fault', fault);
          if (kind === UffdEventKind.Fault) this.#dispatch(fault);
          break;
        }
        case UffdEventKind.Timeout: {
          this.#handlerTimeouts++;
          const region = this.#regionById(ev[i + 4]!);
          const err = new PfrError(
            'ERR_PFR_HANDLER_TIMEOUT',
            `fault handler did not resolve the fault at offset ${ev[i + 5]} within the timeout; it was resolved with the region's default (zero page)`,
          );
          this.#emitError(Object.assign(err, { region, offset: ev[i + 5]! }));
          break;
        }
        case UffdEventKind.ResolveError: {
          const err = new PfrError('ERR_PFR_HANDLER_FAILED', `native resolution of the handler thread's own fault failed (errno ${ev[i + 6]})`);
          this.#emitError(err);
          break;
        }
        case UffdEventKind.Remove:
          this.emit('remove', { address, length: ev[i + 6]! });
          break;
        case UffdEventKind.Unmap:
          this.emit('unmap', { address, length: ev[i + 6]! });
          break;
        case UffdEventKind.Remap:
          this.emit('remap', { from: address, to: BigInt(ev[i + 4]!), length: ev[i + 6]! });
          break;
        case UffdEventKind.Fork:
          this.emit('fork', {});
          break;
      }
    }
  }

  #dispatch(fault: Fault): void {
    const handler = this.#handler;
    if (!handler) {
      this.#safeDefault(fault);
      return;
    }
    try {
      const r = handler(fault, this);
      if (r && typeof (r as Promise<void>).then === 'function') {
        (r as Promise<void>).then(
          () => this.#handled++,
          (err: unknown) => this.#handlerFailed(fault, err),
        );
      } else {
        this.#handled++;
      }
    } catch (err) {
      this.#handlerFailed(fault, err);
    }
  }

  #handlerFailed(fault: Fault, cause: unknown): void {
    this.#handlerErrors++;
    this.#safeDefault(fault);
    const err = new PfrError(
      'ERR_PFR_HANDLER_FAILED',
      `fault handler threw for offset ${fault.offset} of region ${fault.region.id}; the page was resolved with the region's default (zero page)`,
      { cause },
    );
    this.#emitError(Object.assign(err, { fault }));
  }

  #safeDefault(fault: Fault): void {
    if (this.#closed) return;
    try {
      this.resolveDefault(fault);
    } catch {
      // region closed or unregistered meanwhile: the unregister already woke the thread
    }
  }

  #resolveRaw(address: bigint, flags: number): void {
    const ps = BigInt(binding.pageSize);
    const page = address - (address % ps);
    try {
      if (flags & UffdFaultFlag.Minor) binding.uffdContinue(this.#handle, page, binding.pageSize, false, 0);
      else if (flags & UffdFaultFlag.WriteProtect) binding.uffdWriteProtect(this.#handle, page, binding.pageSize, false, false);
      else binding.uffdZeropage(this.#handle, page, binding.pageSize, false);
    } catch {
      // range gone: nobody waits on it
    }
  }

  #emitError(err: PfrError): void {
    // An 'error' event without a listener would throw from the reader callback; report instead.
    if (this.listenerCount('error')) this.emit('error', err);
    else process.emitWarning(err.message, { code: (err as PfrError).code });
  }

  #check(): void {
    if (this.#closed) throw closedError('Userfaultfd');
  }
}
