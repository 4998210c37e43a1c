// userfaultfd for Node: genuine page faults on registered regions, handed to a TypeScript
// handler by a native reader thread, resolved with UFFDIO_COPY / ZEROPAGE / CONTINUE /
// WRITEPROTECT. See docs/threads.md for which thread touches what.
import { EventEmitter } from 'node:events';
import { binding, UFFD_EVENT_WIDTH, UffdEventKind, UffdFaultFlag, type RawUffdStats } from '../native/index.js';
import { closedError, PfrError, sys } from './errors.js';
import type { Region, RegionObserver } from './region.js';
import { checkBool, checkFunction, checkInt, checkObject, invalidArg, rangeError } from './validate.js';

/** UFFD_FEATURE_* bits (linux/userfaultfd.h). */
export const UffdFeature = {
  PAGEFAULT_FLAG_WP: 1n << 0n,
  EVENT_FORK: 1n << 1n,
  EVENT_REMAP: 1n << 2n,
  EVENT_REMOVE: 1n << 3n,
  MISSING_HUGETLBFS: 1n << 4n,
  MISSING_SHMEM: 1n << 5n,
  EVENT_UNMAP: 1n << 6n,
  SIGBUS: 1n << 7n,
  THREAD_ID: 1n << 8n,
  MINOR_HUGETLBFS: 1n << 9n,
  MINOR_SHMEM: 1n << 10n,
  EXACT_ADDRESS: 1n << 11n,
  WP_HUGETLBFS_SHMEM: 1n << 12n,
  WP_UNPOPULATED: 1n << 13n,
  POISON: 1n << 14n,
  WP_ASYNC: 1n << 15n,
  MOVE: 1n << 16n,
} as const;

const REGISTER_MISSING = 1;
const REGISTER_WP = 2;
const REGISTER_MINOR = 4;

/** What the kernel granted at the UFFDIO_API handshake. */
export interface UffdFeatures {
  /** The raw UFFD_FEATURE_* mask. */
  raw: bigint;
  threadId: boolean;
  exactAddress: boolean;
  writeProtect: boolean;
  minor: boolean;
  missingShmem: boolean;
  eventRemove: boolean;
  eventUnmap: boolean;
  eventRemap: boolean;
}

export type FaultKind = 'missing' | 'write-protect' | 'minor';

/** One genuine page fault. */
export interface Fault {
  /** The registered region the page belongs to. */
  region: Region;
  /** Page-aligned offset of the faulting page in the region. */
  offset: number;
  /** The faulting address: exact where UFFD_FEATURE_EXACT_ADDRESS was granted, else page-aligned. */
  address: bigint;
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

export type FaultHandler = (fault: Fault, uffd: Userfaultfd) => void | Promise<void>;

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

export interface RegisterOptions {
  offset?: number;
  length?: number;
  /** Trap accesses to pages that are not there (UFFDIO_REGISTER_MODE_MISSING). Default true. */
  missing?: boolean;
  /** Trap writes to write-protected pages (MODE_WP). */
  writeProtect?: boolean;
  /** Trap accesses to pages in the page cache but not mapped here (MODE_MINOR, shmem). */
  minor?: boolean;
}

export interface ResolveOptions {
  /** Wake the faulting threads (default true). */
  wake?: boolean;
}

export interface CopyOptions extends ResolveOptions {
  /** Bytes to place (a multiple of the page size); default: the data's length. */
  length?: number;
  /** Map the copied pages write-protected (UFFDIO_COPY_MODE_WP). */
  writeProtect?: boolean;
}

export interface UffdStats extends RawUffdStats {
  /** Faults the handler resolved (or that resolved while it ran). */
  handled: number;
  handlerErrors: number;
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
  UffdFeature.MISSING_SHMEM |
  UffdFeature.WP_HUGETLBFS_SHMEM |
  UffdFeature.WP_UNPOPULATED |
  UffdFeature.EVENT_REMOVE |
  UffdFeature.EVENT_UNMAP |
  UffdFeature.EVENT_REMAP;

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
  ENOENT: 'The range is not registered (or was unregistered): register it first',
  EINVAL: 'The range or mode is not valid for this memory (zeropage is for missing faults of anonymous/shmem memory; continue is for minor faults of shmem)',
  ESRCH: 'The faulting process is gone',
  EAGAIN: 'The address space kept changing; retry',
  ENOMEM: 'Not enough memory to place the pages',
  EFAULT: 'The source buffer is not readable',
};

/** The events a Userfaultfd emits, with their arguments (typed `on` / `once` / `emit`). */
export interface UserfaultfdEvents {
  /** A fault for the handler (also what `onFault` handlers receive). */
  fault: [fault: Fault];
  /**
   * A handler threw or did not answer in time (`ERR_PFR_HANDLER_FAILED`, with `region` and
   * `offset` where known): the fault was resolved with the zero page. Without a listener it
   * is a process warning.
   */
  error: [err: PfrError & { region?: Region; offset?: number; fault?: Fault }];
  /** Registered memory was discarded (MADV_DONTNEED / MADV_REMOVE). */
  remove: [range: { address: bigint; length: number }];
  /** Registered memory was unmapped. */
  unmap: [range: { address: bigint; length: number }];
  /** Registered memory was moved by mremap. */
  remap: [range: { from: bigint; to: bigint; length: number }];
}

/**
 * A userfaultfd. Faults of any thread but this JS thread (native toucher and copy-engine
 * threads, worker threads) reach the handler; this thread's own faults are resolved
 * natively at once so it can always read and write registered memory.
 */
export class Userfaultfd extends EventEmitter<UserfaultfdEvents> implements RegionObserver {
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

  private constructor(handle: number, features: bigint, ioctls: bigint, how: Userfaultfd['mode'], tid: number) {
    super();
    this.#handle = handle;
    this.mode = how;
    this.ioctls = ioctls;
    this.handlerThreadId = tid;
    this.features = {
      raw: features,
      threadId: (features & UffdFeature.THREAD_ID) !== 0n,
      exactAddress: (features & UffdFeature.EXACT_ADDRESS) !== 0n,
      writeProtect: (features & UffdFeature.PAGEFAULT_FLAG_WP) !== 0n,
      minor: (features & UffdFeature.MINOR_SHMEM) !== 0n,
      missingShmem: (features & UffdFeature.MISSING_SHMEM) !== 0n,
      eventRemove: (features & UffdFeature.EVENT_REMOVE) !== 0n,
      eventUnmap: (features & UffdFeature.EVENT_UNMAP) !== 0n,
      eventRemap: (features & UffdFeature.EVENT_REMAP) !== 0n,
    };
  }

  /**
   * UFFDIO_API handshake. Tries the plain syscall, then UFFD_USER_MODE_ONLY (what an
   * unprivileged user gets with vm.unprivileged_userfaultfd=0), then /dev/userfaultfd.
   */
  static open(options?: UffdOpenOptions): Userfaultfd {
    const opts = checkObject('Userfaultfd.open: options', options);
    const userModeOnly = checkBool('Userfaultfd.open: options.userModeOnly', opts.userModeOnly, false);
    const timeoutMs = opts.timeoutMs === undefined ? 5000 : checkInt('Userfaultfd.open: options.timeoutMs', opts.timeoutMs, 1, 3_600_000);
    if (opts.handler !== undefined) checkFunction('Userfaultfd.open: options.handler', opts.handler);
    const delivery = opts.delivery ?? 'event-loop';
    if (delivery !== 'event-loop' && delivery !== 'thread') throw invalidArg(`Userfaultfd.open: options.delivery must be 'event-loop' or 'thread', got ${String(delivery)}`);
    let extra = 0n;
    if (opts.features !== undefined) {
      if (typeof opts.features !== 'bigint' || opts.features < 0n) throw invalidArg('Userfaultfd.open: options.features must be a non-negative bigint');
      extra = opts.features;
    }
    const raw = sys('Userfaultfd.open', OPEN_FIXES, () => binding.uffdOpen(WANTED | extra, UffdFeature.THREAD_ID, userModeOnly));
    const uffd = new Userfaultfd(raw.handle, raw.features, raw.ioctls, raw.how, raw.handlerTid);
    binding.uffdSetTimeout(raw.handle, timeoutMs);
    if (opts.handler) uffd.#handler = opts.handler as FaultHandler;
    binding.uffdStart(raw.handle, (events) => uffd.#onEvents(events), delivery === 'event-loop');
    return uffd;
  }

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
    const opts = checkObject('register: options', options);
    const s = region.span('register', opts.offset as number | undefined, opts.length as number | undefined, true);
    const missing = checkBool('register: options.missing', opts.missing, true);
    const wp = checkBool('register: options.writeProtect', opts.writeProtect, false);
    const minor = checkBool('register: options.minor', opts.minor, false);
    if (!missing && !wp && !minor) throw invalidArg('register: at least one of missing, writeProtect, minor must be true');
    if (wp && !this.features.writeProtect) throw new PfrError('ERR_PFR_UNSUPPORTED', 'register: this kernel did not grant write-protect faults (Linux 5.7+)');
    if (minor && !region.shared) throw invalidArg('register: minor faults need shared memory; map the region with { shared: true }');
    if (minor && !this.features.minor) throw new PfrError('ERR_PFR_UNSUPPORTED', 'register: this kernel did not grant minor faults on shmem (Linux 5.14+)');
    const mode = (missing ? REGISTER_MISSING : 0) | (wp ? REGISTER_WP : 0) | (minor ? REGISTER_MINOR : 0);
    const ioctls = sys('register', REGISTER_FIXES, () =>
      binding.uffdRegister(this.#handle, region.id, region.address + BigInt(s.offset), s.length, mode),
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
    const opts = checkObject('unregister: options', options);
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
    const opts = checkObject('copy: options', options);
    const bytes = data instanceof ArrayBuffer ? data.byteLength : ArrayBuffer.isView(data) ? data.byteLength : -1;
    if (bytes < 0) throw invalidArg('copy: data must be a Buffer, TypedArray, DataView or ArrayBuffer');
    const length = opts.length === undefined ? bytes : checkInt('copy: options.length', opts.length, 1);
    if (length > bytes) throw rangeError(`copy: length ${length} is longer than the data (${bytes} bytes)`);
    const s = this.#registered('copy', region, offset, length);
    const wp = checkBool('copy: options.writeProtect', opts.writeProtect, false);
    const wake = checkBool('copy: options.wake', opts.wake, true);
    return sys('copy', RESOLVE_FIXES, () =>
      binding.uffdCopy(this.#handle, region.address + BigInt(s.offset), s.length, data, 0, wp, !wake),
    );
  }

  /** UFFDIO_ZEROPAGE: map zero pages over the range (missing faults). */
  zeropage(region: Region, offset: number, length: number, options?: ResolveOptions): void {
    this.#check();
    const s = this.#registered('zeropage', region, offset, length);
    const wake = checkBool('zeropage: options.wake', checkObject('zeropage: options', options).wake, true);
    sys('zeropage', RESOLVE_FIXES, () => binding.uffdZeropage(this.#handle, region.address + BigInt(s.offset), s.length, !wake));
  }

  /** UFFDIO_CONTINUE: map the page-cache pages already there (minor faults). */
  continue(region: Region, offset: number, length: number, options?: ResolveOptions): void {
    this.#check();
    const s = this.#registered('continue', region, offset, length);
    const wake = checkBool('continue: options.wake', checkObject('continue: options', options).wake, true);
    sys('continue', RESOLVE_FIXES, () => binding.uffdContinue(this.#handle, region.address + BigInt(s.offset), s.length, !wake));
  }

  /** UFFDIO_WRITEPROTECT: protect (on) or unprotect (off, which resolves WP faults) the range. */
  writeProtect(region: Region, offset: number, length: number, on: boolean, options?: ResolveOptions): void {
    this.#check();
    const s = this.#registered('writeProtect', region, offset, length);
    checkBool('writeProtect: on', on, false);
    const wake = checkBool('writeProtect: options.wake', checkObject('writeProtect: options', options).wake, true);
    // The kernel says ENOENT both for an unregistered range and for one registered without WP.
    sys('writeProtect', { ...RESOLVE_FIXES, ENOENT: 'The range is not registered for write-protect faults: register it with { writeProtect: true } first' }, () =>
      binding.uffdWriteProtect(this.#handle, region.address + BigInt(s.offset), s.length, on, !wake),
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
    else this.zeropage(fault.region, fault.offset, ps);
  }

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

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * @internal this thread is about to evict or populate registered memory: the call blocks
   * until the uffd is read (REMOVE events, its own faults), so have the guard read now.
   */
  regionWillBlock(): void {
    if (!this.#closed) binding.uffdKick(this.#handle);
  }

  /** @internal a region is closing: unregister it so nothing stays blocked on it. */
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

  #onEvents(ev: Float64Array): void {
    if (this.#closed) return;
    const now = performance.now();
    for (let i = 0; i < ev.length; i += UFFD_EVENT_WIDTH) {
      const kind = ev[i] as UffdEventKind;
      const flags = ev[i + 1]!;
      const address = BigInt(ev[i + 2]!);
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
      if (flags & UffdFaultFlag.Minor) binding.uffdContinue(this.#handle, page, binding.pageSize, false);
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
