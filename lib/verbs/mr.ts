// Protection domains and memory regions (rdma_rxe's rxe_pd / rxe_mr). An ODP MR (ON_DEMAND)
// is registered with the fault library and may fault; any other MR is pinned (mlock) at
// registration, bounded by RLIMIT_MEMLOCK. Implicit ODP (address 0, length SIZE_MAX) gives
// one key for every region of the process. A PD's stream maps a region only while an MR (or
// a QP's own buffer) of that PD holds it: deregistering the last one unmaps it, so no block
// lands there afterwards. MRs and PDs know their device and process, never the Cluster.
import { mrFree, mrRecord, type RcMr, type RcPd, type StreamContext } from '../../kernel-sim/index.js';
import { closedError } from '../errors.js';
import { invalidArg } from '../validate.js';
import type { FaultLibrary, Registration } from '../fault-library/fault-library.js';
import type { PolicyName, PolicyOptions } from '../fault-library/policy.js';
import { findRegion, type Region, type RegionObserver } from '../region.js';
import { Access } from './constants.js';
import type { Device } from './device.js';
import { verbsError } from './errors.js';
import { claimRegion } from './tables.js';

// The ranges each region's MRs pinned. mlock does not count: one munlock unlocks a page
// however many MRs locked it, so deregistering one of two pinned MRs over the same pages
// would leave the other's pages evictable. An MR unpins only the pages no other MR pins
// (whole pages: mlock rounds out to them).
const pinnedRanges = new WeakMap<Region, Array<{ offset: number; length: number }>>();

/** @internal mlock [offset, offset+length) of the region for one MR (throws the RLIMIT_MEMLOCK advice). */
export function pinForMr(region: Region, offset: number, length: number): void {
  region.pin(offset, length);
  let list = pinnedRanges.get(region);
  if (!list) pinnedRanges.set(region, (list = []));
  list.push({ offset, length });
}

/** @internal Undo one pinForMr: munlock the pages of the range that no other MR still pins. */
export function unpinForMr(region: Region, offset: number, length: number): void {
  const list = pinnedRanges.get(region) ?? [];
  const i = list.findIndex((r) => r.offset === offset && r.length === length);
  if (i >= 0) list.splice(i, 1);
  const ps = region.pageSize;
  let pieces: Array<[number, number]> = [[offset, offset + length]];
  for (const r of list) {
    const a = Math.floor(r.offset / ps) * ps;
    const b = Math.ceil((r.offset + r.length) / ps) * ps;
    pieces = pieces.flatMap(([x, y]): Array<[number, number]> =>
      b <= x || a >= y
        ? [[x, y]]
        : (
            [
              [x, a],
              [b, y],
            ] as Array<[number, number]>
          ).filter(([u, v]) => v > u),
    );
  }
  for (const [x, y] of pieces) region.unpin(x, y - x);
}

/** What a PD, MR or QP knows of the process (ibv_context) that owns it. */
export interface VerbsProcess {
  /** The node the process runs on. */
  readonly node: number;
  /** The modelled process id (the owner of the SMMU stream). */
  readonly pid: number;
  /** The process's fault library. */
  readonly faultLibrary: FaultLibrary;
  /** True once the process's context was closed. */
  readonly closed: boolean;
}

/** The objects a process holds, so closing it can release them (the ucontext's lists). */
export interface ProcessObjects {
  readonly pds: Set<ProtectionDomain>;
  readonly mrs: Set<MemoryRegion>;
  readonly qps: Set<{ destroy(): void }>;
}

/** A protection domain (struct ibv_pd): MRs and QPs of one PD only work with each other. */
export class ProtectionDomain {
  /** Cluster-wide id; the SMMU stream of this PD on its node carries it (ExaNet's PDID). */
  readonly handle: number;
  /** The context (process) that allocated this PD. */
  readonly context: VerbsProcess;
  /** @internal */
  readonly stream: StreamContext;
  /** @internal */
  readonly device: Device;
  /** @internal MRs and QPs on this PD (ibv_dealloc_pd fails with EBUSY while any is left). */
  readonly users = new Set<object>();
  /** @internal The PD's record in its device's tables (what the engine reads of it). */
  readonly rc: RcPd;
  #objects: ProcessObjects;
  #free: (handle: number) => void;
  // Which holders (MRs, QPs) keep each region mapped in this PD's stream.
  #maps = new Map<Region, Set<object>>();
  #closed = false;

  /** @internal use Context.allocPd */
  constructor(context: VerbsProcess, device: Device, handle: number, stream: StreamContext, objects: ProcessObjects, free: (handle: number) => void) {
    this.context = context;
    this.device = device;
    this.handle = handle;
    this.rc = { handle, closed: false };
    this.stream = stream;
    this.#objects = objects;
    this.#free = free;
  }

  /** True once the PD was deallocated (or its context closed). */
  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_dealloc_pd: EBUSY while MRs or QPs still use it, as in libibverbs. */
  dealloc(): void {
    if (this.#closed) return;
    if (this.users.size)
      throw verbsError(
        'ibv_dealloc_pd',
        'EBUSY',
        `${this.users.size} MR(s)/QP(s) still use this protection domain; deregister and destroy them first`,
      );
    this.#closed = true;
    this.rc.closed = true;
    this.#maps.clear();
    // The stream goes: every later block through it, at either end, fails.
    this.device.sim.freeStream(this.stream);
    this.#free(this.handle);
    this.#objects.pds.delete(this);
  }

  /** @internal */
  check(): void {
    if (this.#closed) throw closedError('ProtectionDomain');
  }

  /** @internal map `region` into this PD's stream on behalf of `holder`. */
  mapFor(holder: object, region: Region): void {
    let set = this.#maps.get(region);
    if (!set) {
      set = new Set();
      this.#maps.set(region, set);
      this.device.sim.map(this.stream, region);
    }
    set.add(holder);
  }

  /** @internal `holder` no longer needs any region: unmap the ones nobody else holds. */
  unmapFor(holder: object): void {
    for (const [region, set] of this.#maps) {
      if (!set.delete(holder) || set.size) continue;
      this.#maps.delete(region);
      if (!this.#closed) this.device.sim.unmap(this.stream, region);
    }
  }
}

/** Options of `Context.regMr` beyond libibverbs' arguments: the ODP policy of this MR. */
export interface RegMrOptions {
  /** ODP resolution policy (default: the context's, 'touch-ahead'). */
  policy?: PolicyName;
  /** Options of the policy (touch-ahead's cap, prefetch's window). */
  policyOptions?: PolicyOptions;
}

/**
 * The ODP counters the kernel keeps per MR (struct ib_odp_counters), as `rdma statistic mr`
 * prints them: page_faults, page_faults_handled, page_invalidations,
 * page_invalidations_handled, page_prefetch.
 */
export interface OdpCounters {
  /** Pages the device mapped to resolve faults on this MR (page_faults): a fault resolved by touch-ahead over 16 pages adds 16. */
  faults: number;
  /** Faults on this MR resolved (page_faults_handled): one per fault, whatever it mapped. */
  faultsHandled: number;
  /** Mapped pages of this MR an invalidation unmapped (page_invalidations): MADV_DONTNEED, hole punching, unmapPages. */
  invalidations: number;
  /** Invalidations that unmapped pages of this MR (page_invalidations_handled). */
  invalidationsHandled: number;
  /** Pages ibv_advise_mr (adviseMr) mapped for this MR (page_prefetch). */
  prefetch: number;
}

/** A registered memory region (struct ibv_mr): its keys, its range of a Region and its access flags; pinned, or ODP with `Access.ON_DEMAND`. */
export class MemoryRegion {
  /** The PD the MR was registered in. */
  readonly pd: ProtectionDomain;
  /** Local key: names this MR in the local side of a work request (Sge.lkey). */
  readonly lkey: number;
  /** Remote key: what a peer puts in RDMA and atomic work requests to reach this MR. */
  readonly rkey: number;
  /** The registered memory, or undefined for an implicit ODP MR. */
  readonly region: Region | undefined;
  /** Byte offset of the MR in its Region. */
  readonly offset: number;
  /** Start address (0n for implicit) and length (SIZE_MAX for implicit). */
  readonly addr: bigint;
  /** Bytes registered. */
  readonly length: number;
  /** Access flags (Access bits) the MR was registered with. */
  readonly access: number;
  /** True for an implicit ODP MR (address 0, length SIZE_MAX: the whole address space). */
  readonly implicit: boolean;
  /** @internal the fault library registration of an explicit ODP MR */
  readonly registration: Registration | undefined;
  /**
   * @internal The MR's record in its device's tables (kernel-sim/rc/tables.ts), what the
   * engine's key checks read: entered at registration, FREE at dereg, its policy's prefault
   * flag written at setPolicy.
   */
  readonly rc: RcMr;
  #closed = false;
  #pinned: boolean;
  #objects: ProcessObjects;
  /** @internal counted by the context (faults), adviseMr (prefetch) and the region's invalidations */
  readonly odpCounters: OdpCounters = { faults: 0, faultsHandled: 0, invalidations: 0, invalidationsHandled: 0, prefetch: 0 };
  // The MMU-notifier analogue of an ODP MR: mapped pages of the MR counted before an
  // invalidation, added once the kernel has done it. An explicit MR watches its region, an
  // implicit one every region it reaches.
  #invalidating: { region: Region | undefined; offset: number; length: number; pages: number } = {
    region: undefined,
    offset: 0,
    length: 0,
    pages: 0,
  };
  #watched = new Set<Region>();
  #notifier: RegionObserver = {
    regionClosing: (r) => void this.#watched.delete(r),
    regionInvalidating: (r, off, len) => {
      const lo = Math.max(off, this.implicit ? 0 : this.offset);
      const hi = Math.min(off + len, this.implicit ? r.size : this.offset + this.length);
      const ps = r.pageSize;
      const first = lo - (lo % ps);
      let pages = 0;
      if (hi > lo) for (const m of mappedPages(r, first, Math.min(r.size, Math.ceil(hi / ps) * ps) - first)) pages += m;
      this.#invalidating = { region: r, offset: off, length: len, pages };
    },
    regionEvicted: (r, off, len) => {
      const inv = this.#invalidating;
      this.#invalidating = { region: undefined, offset: 0, length: 0, pages: 0 };
      if (inv.region !== r || inv.offset !== off || inv.length !== len || inv.pages === 0) return;
      this.odpCounters.invalidations += inv.pages;
      this.odpCounters.invalidationsHandled++;
    },
  };

  /** @internal use Context.regMr */
  constructor(
    pd: ProtectionDomain,
    key: number,
    region: Region | undefined,
    offset: number,
    length: number,
    access: number,
    registration: Registration | undefined,
    pinned: boolean,
    objects: ProcessObjects,
  ) {
    this.pd = pd;
    this.lkey = key;
    this.rkey = key;
    this.region = region;
    this.offset = offset;
    this.addr = region ? region.address + BigInt(offset) : 0n;
    this.length = length;
    this.access = access;
    this.implicit = region === undefined;
    this.registration = registration;
    this.#pinned = pinned;
    this.#objects = objects;
    pd.users.add(this);
    if (region) pd.mapFor(this, region);
    if (region && registration) this.#watch(region);
    this.rc = mrRecord({
      key,
      pd: pd.rc,
      access,
      region,
      offset,
      length,
      // An implicit MR reaches its process's regions as the kernel's implicit ODP walks its mm.
      space: region ? undefined : { find: (addr, len, map) => this.#reach(addr, len, map) },
      prefault: this.policy === 'prefault',
    });
  }

  // An implicit MR's reach: the region of its process that holds the range, mapped in the PD's stream when `map`.
  #reach(addr: bigint, length: number, map: boolean): { region: Region; offset: number } | undefined {
    const at = this.resolve(addr, length);
    if (at && map) this.pd.mapFor(this, at.region);
    return at;
  }

  #watch(region: Region): void {
    if (this.#watched.has(region)) return;
    this.#watched.add(region);
    region.observe(this.#notifier);
  }

  /** This MR's ODP counters (struct ib_odp_counters; all 0 for a pinned MR). */
  get odpStats(): OdpCounters {
    return { ...this.odpCounters };
  }

  /** True when registered with Access.ON_DEMAND (no pinning; faults resolved by the fault library). */
  get onDemand(): boolean {
    return (this.access & Access.ON_DEMAND) !== 0;
  }

  /** True when the MR's pages are pinned (mlock), i.e. not ON_DEMAND. */
  get pinned(): boolean {
    return this.#pinned;
  }

  /**
   * Modelled cost of pinning this MR for a transfer (pages × the cost model's pinPageUs:
   * get_user_pages pin + unpin); 0 when it is not pinned. The pinning baseline adds it to
   * each transfer's modelled time.
   */
  get modelPinUs(): number {
    if (!this.#pinned || !this.region) return 0;
    const ps = this.region.pageSize;
    const first = this.offset - (this.offset % ps);
    const pages = Math.ceil((this.offset + this.length - first) / ps);
    return pages * this.pd.device.costs.pinPageUs;
  }

  /** True once the MR was deregistered (or its context closed). */
  get closed(): boolean {
    return this.#closed;
  }

  /** The resolution policy of this MR ('pin' for pinned MRs). */
  get policy(): PolicyName {
    return this.registration?.policy ?? (this.#pinned ? 'pin' : this.pd.context.faultLibrary.defaultPolicy);
  }

  /** Change the ODP policy at run time ('pin' mlocks the range; leaving 'pin' unlocks it). */
  setPolicy(policy: PolicyName, options?: PolicyOptions): void {
    this.#check();
    const reg = this.registration;
    if (!reg) throw invalidArg('setPolicy: only explicit ODP MRs have a policy of their own');
    const lib = this.pd.context.faultLibrary;
    const old = { policy: reg.policy, options: reg.options };
    lib.setPolicy(reg, policy, options); // validates
    try {
      if (policy === 'pin' && !this.#pinned) {
        pinForMr(this.region!, this.offset, this.length);
        this.#pinned = true;
      } else if (policy !== 'pin' && this.#pinned) {
        unpinForMr(this.region!, this.offset, this.length);
        this.#pinned = false;
      }
    } catch (err) {
      lib.setPolicy(reg, old.policy, old.options);
      throw err;
    }
    this.rc.prefault = this.policy === 'prefault';
  }

  /**
   * The region and offset for [addr, addr+length) if this MR covers it, else undefined. An
   * implicit MR covers the open regions of its own process: those it registered or first
   * reached through its implicit key, never another process's or the library's own.
   */
  resolve(
    addr: bigint,
    length: number,
  ):
    | {
        /** The Region that holds the range. */
        region: Region;
        /** Byte offset of the range in it. */
        offset: number;
      }
    | undefined {
    if (this.#closed) return undefined;
    if (this.implicit) {
      const r = findRegion(addr, Math.max(1, length));
      if (!r || !claimRegion(r, this.pd.context)) return undefined;
      this.#watch(r);
      return { region: r, offset: Number(addr - r.address) };
    }
    const end = this.addr + BigInt(this.length);
    if (addr < this.addr || addr + BigInt(length) > end || this.region!.closed) return undefined;
    return { region: this.region!, offset: Number(addr - this.region!.address) };
  }

  /** ibv_dereg_mr: unpin a pinned MR, forget the key, unmap what only it held. Idempotent. */
  dereg(): void {
    if (this.#closed) return;
    this.#closed = true;
    mrFree(this.rc);
    if (this.#pinned && this.region && !this.region.closed) unpinForMr(this.region, this.offset, this.length);
    this.#pinned = false;
    if (this.registration) this.pd.context.faultLibrary.unregister(this.registration);
    for (const r of this.#watched) r.unobserve(this.#notifier);
    this.#watched.clear();
    this.pd.unmapFor(this);
    this.pd.users.delete(this);
    this.pd.device.tables.removeMr(this.lkey);
    // Refused from the next block on; and the block being written right now lands before we return.
    this.pd.device.sim.fence({ key: this.lkey });
    this.#objects.mrs.delete(this);
  }

  /** Same as `dereg()`, for `using`. */
  [Symbol.dispose](): void {
    this.dereg();
  }

  #check(): void {
    if (this.#closed) throw closedError('MemoryRegion');
  }
}

// Pages of the range this mapping maps (pagemap); residency (mincore) where pagemap cannot be read.
function mappedPages(r: Region, offset: number, length: number): Uint8Array {
  try {
    return r.mapped(offset, length);
  } catch {
    return r.residency(offset, length);
  }
}

// The 'prefault' baseline: touch the whole buffer before each transfer.
export function prefaultIfAsked(mr: MemoryRegion, region: Region, offset: number, length: number): void {
  if (mr.policy !== 'prefault') return;
  const ps = region.pageSize;
  const start = offset - (offset % ps);
  region.populate(start, Math.min(region.size - start, Math.ceil((length + offset - start) / ps) * ps));
}
