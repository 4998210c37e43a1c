// A Cluster is N simulated nodes in one process, wired by the modelled fabric, with one
// RDMA device per node; a Context (ibv_context) is one process on one node, with its
// netlink socket and fault library. The Cluster and Context create objects; the objects
// themselves know only their device (its tables) and their process.
import { IommuPageResponseCode, SimSystem, type SystemOptions } from '../../kernel-sim/index.js';
import { checkSystemOptions } from '../../kernel-sim/system.js';
import { closedError } from '../errors.js';
import { FaultLibrary, traceLimit, type ResolvedFault, type TraceOption } from '../fault-library/fault-library.js';
import { POLICIES, type PolicyName } from '../fault-library/policy.js';
import { PAGE_SIZE, Region } from '../region.js';
import type { Userfaultfd } from '../uffd.js';
import { checkInt, checkObject, invalidArg, known } from '../validate.js';
import { Access, AdviseMrAdvice, AdviseMrFlags, AsyncEventType, knownAccess, OdpGeneralCaps, OdpTransportCaps, SIZE_MAX } from './constants.js';
import { CompletionChannel } from './comp-channel.js';
import { CompletionQueue } from './cq.js';
import { Device, type Endpoint, type KeyedMr, type SrqEndpoint } from './device.js';
import { verbsError } from './errors.js';
import { MemoryRegion, type OdpCounters, pinForMr, ProtectionDomain, type ProcessObjects, type RegMrOptions, unpinForMr } from './mr.js';
import { QueuePair, type QpInitAttr } from './qp.js';
import { QueuePairEx, type QpInitAttrEx } from './qp-ex.js';
import { SharedReceiveQueue, type SrqInitAttr } from './srq.js';
import { AddressHandle, type AhAttr } from './ah.js';
import { XrcDomain } from './xrc.js';
import type { Sge } from './qp-core.js';
import { claimRegion, DEVICE_LIMITS, DeviceTables, IdAllocator } from './tables.js';

const CLUSTER_KEYS = known<ClusterOptions>({
  defaultPolicy: true,
  trace: true,
  nodes: true,
  hardware: true,
  costs: true,
  channels: true,
  blockSize: true,
  retryLimit: true,
  faultTimeoutMs: true,
  engineThreads: true,
  eventQueueDepth: true,
  netlinkQueue: true,
  iotlbEntries: true,
  transport: true,
});
const OPEN_DEVICE_KEYS = ['defaultPolicy', 'uffd', 'trace'] as const;
const REG_MR_IN_KEYS = known<RegMrIn>({ addr: true, offset: true, length: true, iova: true, access: true, options: true });
const CREATE_CQ_KEYS = known<CreateCqOptions>({ channel: true, cqContext: true });

export type { Sge } from './qp-core.js';

/** An asynchronous event (struct ibv_async_event). */
export interface AsyncEvent {
  /** Which event (ibv_event_type). */
  eventType: AsyncEventType;
  /** ibv_event_type_str-like name, e.g. 'IBV_EVENT_CQ_ERR'. */
  name: string;
  /** The CQ the event is about (CQ_ERR). */
  cq?: CompletionQueue;
  /** The QP the event is about (QP_* events, COMM_EST, SQ_DRAINED). */
  qp?: QueuePair;
  /** The SRQ the event is about (SRQ_LIMIT_REACHED). */
  srq?: SharedReceiveQueue;
}

/** Options of `Cluster.create`: the simulated system's and every context's defaults. */
export interface ClusterOptions extends SystemOptions {
  /** Default ODP policy of every context (default 'touch-ahead'). */
  defaultPolicy?: PolicyName;
  /**
   * Default trace of every context's fault library (exportChromeTrace): off unless asked for;
   * true keeps the newest 200 000 events per context, `{ limit }` the newest `limit`.
   */
  trace?: TraceOption;
}

/** Device attributes (struct ibv_device_attr and its ODP caps), as `Context.queryDevice` returns them. */
export interface DeviceAttr {
  /** Device name, as ibv_get_device_name gives it. */
  name: string;
  /** The simulated node this device belongs to. */
  node: number;
  /** Most QPs a context may create (max_qp). */
  maxQp: number;
  /** Most entries of one CQ (max_cqe). */
  maxCqe: number;
  /** Most MRs a context may register (max_mr). */
  maxMr: number;
  /** Most scatter/gather entries of one work request (max_sge). */
  maxSge: number;
  /** Largest MR in bytes (max_mr_size). */
  maxMrSize: bigint;
  /** Page sizes the device supports, as a bit mask (page_size_cap). */
  pageSizeCap: number;
  /** On-demand paging capabilities (struct ibv_odp_caps): OdpGeneralCaps and OdpTransportCaps bits. */
  odpCaps: {
    /** OdpGeneralCaps bits: ODP supported, implicit ODP supported. */
    generalCaps: number;
    /** OdpTransportCaps bits for RC QPs. */
    rcOdpCaps: number;
    /** OdpTransportCaps bits for UC QPs (none here). */
    ucOdpCaps: number;
    /** OdpTransportCaps bits for UD QPs. */
    udOdpCaps: number;
    /** OdpTransportCaps bits for XRC QPs (ibv_odp_caps_ex's xrc_odp_caps): an XRC QP has no receive queue, its receives are its XRC SRQ's. */
    xrcOdpCaps: number;
  };
}

/** Options of `Context.createCq` beyond the depth (struct ibv_cq_init_attr_ex's channel and cq_context). */
export interface CreateCqOptions {
  /** The completion channel the CQ reports its events to once armed with `reqNotify()`. */
  channel?: CompletionChannel;
  /** Anything: kept as `cq.cqContext` (ibv_cq.cq_context). */
  cqContext?: unknown;
}

/** The struct of `Context.regMrEx` (struct ibv_reg_mr_in of ibv_reg_mr_ex). */
export interface RegMrIn {
  /** The memory: a Region or the ArrayBuffer of one (null with offset 0 and length SIZE_MAX: implicit ODP). */
  addr: Region | ArrayBuffer | null;
  /** Byte offset of the MR in `addr` (default 0). */
  offset?: number;
  /** Bytes to register (default: the rest of the region; SIZE_MAX for implicit ODP). */
  length?: number | bigint;
  /**
   * I/O virtual address the MR's keys use (ibv_reg_mr_iova). Only the MR's own virtual
   * address is accepted: the modelled SMMU translates the process's virtual addresses (shared
   * virtual addressing), so another iova is EOPNOTSUPP.
   */
  iova?: bigint;
  /** Access bits. */
  access: number;
  /** The ODP policy of this MR (as regMr's options). */
  options?: RegMrOptions;
}

/** What `Context.queryMr` says of an MR (its ibv_mr fields, access and ODP state). */
export interface MrAttr {
  /** Start address (ibv_mr.addr); 0n for implicit ODP. */
  addr: bigint;
  /** Bytes registered (ibv_mr.length); SIZE_MAX for implicit ODP. */
  length: bigint;
  /** The I/O virtual address the keys use: addr here. */
  iova: bigint;
  /** Local key (ibv_mr.lkey). */
  lkey: number;
  /** Remote key (ibv_mr.rkey). */
  rkey: number;
  /** Access bits it was registered with. */
  access: number;
  /** True for Access.ON_DEMAND. */
  onDemand: boolean;
  /** True for implicit ODP (the whole address space). */
  implicit: boolean;
  /** True if its pages are pinned (mlock). */
  pinned: boolean;
  /** Its ODP counters (ib_odp_counters), undefined for a pinned MR. */
  odp: OdpCounters | undefined;
}

/** One line of `rdma statistic mr` (`Context.statisticMr`): an ODP MR and its counters. */
export interface MrStatistic extends OdpCounters {
  /** Device name, e.g. 'pfr1'. */
  dev: string;
  /** The MR's number (mrn): its lkey here. */
  mrn: number;
}

/** `rdma statistic mr` lines: `dev pfr1 mrn 4097 page_faults 16 page_faults_handled 1 page_invalidations 16 page_invalidations_handled 1 page_prefetch 0`. */
export function formatMrStatistics(rows: readonly MrStatistic[]): string {
  return rows
    .map(
      (r) =>
        `dev ${r.dev} mrn ${r.mrn} page_faults ${r.faults} page_faults_handled ${r.faultsHandled} ` +
        `page_invalidations ${r.invalidations} page_invalidations_handled ${r.invalidationsHandled} page_prefetch ${r.prefetch}`,
    )
    .join('\n');
}

/** Simulated nodes on one fabric, each with an SMMU, a fault-aware DMA engine and its driver; `openDevice(n)` opens a process (an ibv_context) on node n. */
export class Cluster {
  /** The modelled hardware and kernel of every node (kernel-sim). */
  readonly system: SimSystem;
  #contexts = new Set<Context>();
  #devices: Device[];
  #nextPid = 1000;
  #defaultPolicy: PolicyName;
  #trace: TraceOption;
  #closed = false;

  private constructor(options: ClusterOptions) {
    const { defaultPolicy, trace, ...sys } = options;
    traceLimit(trace); // a bad option fails here, before anything is built
    this.#trace = trace ?? false;
    this.system = new SimSystem(sys);
    this.#defaultPolicy = defaultPolicy ?? 'touch-ahead';
    // Each device keeps its own tables and allocators: nothing a node hands out is another's.
    this.#devices = this.system.nodes.map((n) => new Device(n, this.system.costs, new DeviceTables<KeyedMr, Endpoint, SrqEndpoint>(n.id, n.tables)));
  }

  /** Create `nodes` simulated nodes (default 2) wired by the fabric. Every option is checked first. */
  static create(options: ClusterOptions = {}): Cluster {
    checkObject('Cluster.create: options', options, CLUSTER_KEYS);
    try {
      checkSystemOptions(options);
    } catch (e) {
      (e as Error).message = `Cluster.create: ${(e as Error).message}`;
      throw e;
    }
    if (options.defaultPolicy !== undefined && !POLICIES.includes(options.defaultPolicy))
      throw invalidArg(`Cluster.create: defaultPolicy must be one of ${POLICIES.join(', ')}, got ${String(options.defaultPolicy)}`);
    return new Cluster(options);
  }

  /** Number of simulated nodes. */
  get nodes(): number {
    return this.system.nodes.length;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_open_device on `node`: a new process there, with its fault library. */
  openDevice(node: number, options: { defaultPolicy?: PolicyName; uffd?: Userfaultfd; trace?: TraceOption } = {}): Context {
    this.#check();
    checkInt('openDevice: node', node, 0, this.nodes - 1);
    if (!this.system.isLocal(node)) throw invalidArg(`openDevice: node ${node} is hosted by the transport's peer process, not this one`);
    checkObject('openDevice: options', options, OPEN_DEVICE_KEYS);
    if (options.defaultPolicy !== undefined && !POLICIES.includes(options.defaultPolicy))
      throw invalidArg(`openDevice: defaultPolicy must be one of ${POLICIES.join(', ')}, got ${String(options.defaultPolicy)}`);
    const trace = options.trace ?? this.#trace;
    traceLimit(trace);
    const ctx = new Context(this, this.#devices[node]!, this.#nextPid++, options.defaultPolicy ?? this.#defaultPolicy, options.uffd, trace, (c) =>
      this.#contexts.delete(c),
    );
    this.#contexts.add(ctx);
    return ctx;
  }

  /** Close every context (QPs flushed), then the simulated system. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const c of [...this.#contexts]) c.close();
    this.system.close();
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  #check(): void {
    if (this.#closed) throw closedError('Cluster');
  }
}

/** A process on one node with the device open (struct ibv_context): PDs, MRs, CQs, QPs and its own fault library. */
export class Context {
  /** The cluster this context belongs to. */
  readonly cluster: Cluster;
  /** The node this context's process runs on. */
  readonly node: number;
  /** The (simulated) process id its faults are sent to. */
  readonly pid: number;
  /** The process's fault library: resolves its ODP faults, counts them and records its trace. */
  readonly faultLibrary: FaultLibrary;
  #device: Device;
  #pdHandles: IdAllocator;
  #objects: ProcessObjects = { pds: new Set(), mrs: new Set(), qps: new Set() };
  #cqs = new Set<CompletionQueue>();
  #channels = new Set<CompletionChannel>();
  #srqs = new Set<SharedReceiveQueue>();
  #ahs = new Set<AddressHandle>();
  #xrcds = new Set<XrcDomain>();
  #events: AsyncEvent[] = [];
  #eventListeners: Array<(e: AsyncEvent) => void> = [];
  #forget: (c: Context) => void;
  #closed = false;

  /** @internal use Cluster.openDevice */
  constructor(
    cluster: Cluster,
    device: Device,
    pid: number,
    defaultPolicy: PolicyName,
    uffd: Userfaultfd | undefined,
    trace: TraceOption,
    forget: (c: Context) => void,
  ) {
    this.cluster = cluster;
    this.#device = device;
    this.#pdHandles = device.tables.pds;
    this.#forget = forget;
    this.node = device.node;
    this.pid = pid;
    const socket = device.sim.openProcess(pid);
    const opts: ConstructorParameters<typeof FaultLibrary>[0] = { system: cluster.system, node: device.node, pid, socket, defaultPolicy, trace };
    if (uffd) opts.uffd = uffd;
    this.faultLibrary = new FaultLibrary(opts);
    this.faultLibrary.onResolve((f) => this.#countFault(f));
  }

  /** True once the context (or its cluster) was closed. */
  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_query_device(_ex): limits (enforced) and ODP capabilities. */
  queryDevice(): DeviceAttr {
    this.#check();
    const rc =
      OdpTransportCaps.SEND |
      OdpTransportCaps.RECV |
      OdpTransportCaps.WRITE |
      OdpTransportCaps.READ |
      OdpTransportCaps.ATOMIC |
      OdpTransportCaps.SRQ_RECV |
      OdpTransportCaps.FLUSH |
      OdpTransportCaps.ATOMIC_WRITE;
    return {
      name: `pfr${this.node}`,
      node: this.node,
      maxQp: DEVICE_LIMITS.maxQp,
      maxCqe: DEVICE_LIMITS.maxCqe,
      maxMr: DEVICE_LIMITS.maxMr,
      maxSge: DEVICE_LIMITS.maxSge,
      maxMrSize: SIZE_MAX,
      pageSizeCap: PAGE_SIZE,
      odpCaps: {
        generalCaps: OdpGeneralCaps.SUPPORT | OdpGeneralCaps.SUPPORT_IMPLICIT,
        rcOdpCaps: rc,
        ucOdpCaps: 0,
        udOdpCaps: OdpTransportCaps.SEND | OdpTransportCaps.RECV | OdpTransportCaps.SRQ_RECV,
        xrcOdpCaps: rc & ~OdpTransportCaps.RECV,
      },
    };
  }

  /** ibv_get_async_event, without blocking: the events raised so far, oldest first (and forgotten). */
  pollAsyncEvents(): AsyncEvent[] {
    return this.#events.splice(0);
  }

  /** Hear every async event as it is raised (IBV_EVENT_CQ_ERR, …). Returns an unsubscribe. */
  onAsyncEvent(listener: (e: AsyncEvent) => void): () => void {
    this.#eventListeners.push(listener);
    return () => {
      this.#eventListeners = this.#eventListeners.filter((l) => l !== listener);
    };
  }

  /** ibv_alloc_pd: a protection domain, with its stream in this node's SMMU. */
  allocPd(): ProtectionDomain {
    this.#check();
    const handle = this.#pdHandles.alloc('ibv_alloc_pd');
    const stream = this.#device.sim.allocStream({ pid: this.pid, pd: handle });
    const pd = new ProtectionDomain(this, this.#device, handle, stream, this.#objects, (h) => this.#pdHandles.free(h));
    this.#objects.pds.add(pd);
    return pd;
  }

  /**
   * ibv_reg_mr. `memory` is a Region (or the ArrayBuffer of one) and [offset, offset+length)
   * a range of it; or null with offset 0 and length SIZE_MAX (or Infinity) for implicit ODP.
   * Without Access.ON_DEMAND the range is pinned now.
   */
  regMr(
    pd: ProtectionDomain,
    memory: Region | ArrayBuffer | null,
    offset: number,
    length: number | bigint,
    access: number,
    options: RegMrOptions = {},
  ): MemoryRegion {
    this.#check();
    checkObject('regMr: options', options, ['policy', 'policyOptions']);
    this.#ownPd('ibv_reg_mr', pd);
    if (!knownAccess(access)) throw verbsError('ibv_reg_mr', 'EINVAL', `unknown access flags 0x${Number(access).toString(16)}`);
    if (access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) && !(access & Access.LOCAL_WRITE))
      throw verbsError('ibv_reg_mr', 'EINVAL', 'REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (as in libibverbs)');
    if (access & Access.ZERO_BASED) throw verbsError('ibv_reg_mr', 'EOPNOTSUPP', `Access.ZERO_BASED is not offered: ${SVA}`);
    // rdma_rxe refuses it on memory that is not pmem; nothing here is persistent.
    if (access & Access.FLUSH_PERSISTENT)
      throw verbsError(
        'ibv_reg_mr',
        'EINVAL',
        'FLUSH_PERSISTENT needs persistent memory (pmem or a DAX file); regions here are anonymous or memfd pages that go with the process: register with FLUSH_GLOBAL',
      );
    const odp = (access & Access.ON_DEMAND) !== 0;
    const lib = this.faultLibrary;
    const tables = this.#device.tables;

    if (memory === null) {
      if (offset !== 0 || (length !== SIZE_MAX && length !== Infinity))
        throw verbsError('ibv_reg_mr', 'EINVAL', 'an MR without memory is implicit ODP: pass offset 0 and length SIZE_MAX');
      if (!odp) throw verbsError('ibv_reg_mr', 'EINVAL', 'implicit MRs (address 0, length SIZE_MAX) need Access.ON_DEMAND');
      const mr = tables.addMr(
        (key) => new MemoryRegion(pd, key, undefined, 0, Number.MAX_SAFE_INTEGER, access, undefined, false, this.#objects),
      ) as MemoryRegion;
      this.#objects.mrs.add(mr);
      return mr;
    }
    const region = memory instanceof Region ? memory : regionOfBuffer(memory);
    if (typeof length !== 'number') throw invalidArg('regMr: length must be a number for an explicit MR');
    const s = region.span('regMr', offset, length);
    if (access & Access.HUGETLB && !region.hugePages && !region.hugetlb)
      throw verbsError(
        'ibv_reg_mr',
        'EINVAL',
        'Access.HUGETLB needs huge-page memory: a region mapped with { hugetlb: true } (MAP_HUGETLB) or { hugePages: true }',
      );
    const policy = options.policy ?? lib.defaultPolicy;
    let pinned = false;
    if (!odp || policy === 'pin') {
      // Pinned MRs, and ODP MRs whose policy is the 'pin' baseline: mlock now.
      pinForMr(region, s.offset, s.length); // throws the RLIMIT_MEMLOCK advice on failure
      pinned = true;
    }
    let registration: ReturnType<FaultLibrary['register']> | undefined;
    try {
      registration = odp ? lib.register(region, s.offset, s.length, policy, options.policyOptions ?? {}) : undefined;
      claimRegion(region, this);
      const reg = registration;
      const mr = tables.addMr((key) => new MemoryRegion(pd, key, region, s.offset, s.length, access, reg, pinned, this.#objects)) as MemoryRegion;
      this.#objects.mrs.add(mr);
      return mr;
    } catch (e) {
      if (registration) lib.unregister(registration);
      if (pinned) unpinForMr(region, s.offset, s.length);
      throw e;
    }
  }

  /**
   * ibv_reg_mr_ex: regMr with its arguments in one struct, and an iova (which must be the
   * MR's own address: see RegMrIn.iova). Access.ZERO_BASED is refused for the same reason.
   */
  regMrEx(pd: ProtectionDomain, mrIn: RegMrIn): MemoryRegion {
    this.#check();
    checkObject('regMrEx: mrIn', mrIn, REG_MR_IN_KEYS);
    const { addr, iova, access } = mrIn;
    if (typeof access !== 'number') throw verbsError('ibv_reg_mr_ex', 'EINVAL', 'access must be Access bits (a number)');
    if (access & Access.ZERO_BASED) throw verbsError('ibv_reg_mr_ex', 'EOPNOTSUPP', `Access.ZERO_BASED is not offered: ${SVA}`);
    const offset = mrIn.offset ?? 0;
    if (addr === null) {
      if (iova !== undefined && iova !== 0n) throw verbsError('ibv_reg_mr_ex', 'EINVAL', 'an implicit ODP MR has iova 0');
      return this.regMr(pd, null, offset, mrIn.length ?? SIZE_MAX, access, mrIn.options);
    }
    const region = addr instanceof Region ? addr : regionOfBuffer(addr);
    const length = mrIn.length ?? region.size - checkInt('regMrEx: offset', offset, 0, region.size);
    if (iova !== undefined) {
      if (typeof iova !== 'bigint') throw verbsError('ibv_reg_mr_ex', 'EINVAL', `iova must be a bigint, got ${typeof iova}`);
      const va = region.address + BigInt(offset);
      if (iova !== va)
        throw verbsError(
          'ibv_reg_mr_ex',
          'EOPNOTSUPP',
          `iova 0x${iova.toString(16)} differs from the MR's address 0x${va.toString(16)}: ${SVA}; omit iova`,
        );
    }
    return this.regMr(pd, region, offset, length, access, mrIn.options);
  }

  /**
   * ibv_advise_mr: make the pages of the SGEs resident and their translations present.
   * With AdviseMrFlags.FLUSH it is done when the call returns; without, it runs on the next
   * turn (the returned promise settles then). Validation errors throw at once.
   */
  adviseMr(pd: ProtectionDomain, advice: AdviseMrAdvice, flags: number, sgList: Sge[]): Promise<void> {
    this.#check();
    this.#ownPd('ibv_advise_mr', pd);
    if (!(advice in AdviseMrAdvice) || typeof advice !== 'number') throw verbsError('ibv_advise_mr', 'ENOTSUP', `unknown advice ${String(advice)}`);
    if (!Number.isInteger(flags) || (flags & ~AdviseMrFlags.FLUSH) !== 0) throw verbsError('ibv_advise_mr', 'EINVAL', `unknown flags ${flags}`);
    if (!Array.isArray(sgList) || sgList.length === 0) throw verbsError('ibv_advise_mr', 'EINVAL', 'sgList must hold at least one SGE');
    const work = sgList.map((sge) => {
      if (!sge || typeof sge.addr !== 'bigint' || !Number.isInteger(sge.length) || sge.length < 0 || !Number.isInteger(sge.lkey))
        throw verbsError('ibv_advise_mr', 'EINVAL', 'each SGE needs { addr: bigint, length: integer >= 0, lkey: integer }');
      // Keys are the device's own: another node's key names nothing here.
      const mr = this.#device.tables.mr(sge.lkey) as MemoryRegion | undefined;
      if (!mr || mr.closed) throw verbsError('ibv_advise_mr', 'EFAULT', `no MR with lkey 0x${sge.lkey.toString(16)} on this device`);
      if (!this.#objects.mrs.has(mr)) throw verbsError('ibv_advise_mr', 'EPERM', 'the lkey belongs to another process');
      if (mr.pd !== pd) throw verbsError('ibv_advise_mr', 'EPERM', 'the lkey belongs to another protection domain');
      if (!mr.onDemand) throw verbsError('ibv_advise_mr', 'EINVAL', 'advise_mr applies to ODP MRs only (Access.ON_DEMAND)');
      if (advice === AdviseMrAdvice.PREFETCH_WRITE && !(mr.access & Access.LOCAL_WRITE))
        throw verbsError('ibv_advise_mr', 'EPERM', 'PREFETCH_WRITE needs an MR with LOCAL_WRITE');
      const at = mr.resolve(sge.addr, sge.length);
      if (!at) throw verbsError('ibv_advise_mr', 'EFAULT', `range 0x${sge.addr.toString(16)}+${sge.length} is outside the MR`);
      return { mr, ...at, length: sge.length };
    });
    const run = () => {
      for (const { mr, region, offset, length } of work) {
        // An empty SGE asks for nothing (populate refuses a length of 0).
        if (mr.closed || region.closed || length === 0) continue;
        const ps = region.pageSize;
        const start = offset - (offset % ps);
        const len = length + (offset - start);
        pd.mapFor(mr, region);
        const span = Math.min(len, region.size - start);
        if (advice !== AdviseMrAdvice.PREFETCH_NO_FAULT) region.populate(start, span, { write: advice === AdviseMrAdvice.PREFETCH_WRITE });
        // page_prefetch: the pages mapped for the device (NO_FAULT maps only those already there).
        mr.odpCounters.prefetch += region.residentPages(start, Math.ceil(span / ps) * ps);
        // Post the translations of resident pages to the device (its IOTLB); NO_FAULT does
        // only this, for the pages that are already there.
        this.#device.sim.prefetchTranslations(pd.stream, region, start, len);
      }
    };
    if (flags & AdviseMrFlags.FLUSH) {
      run();
      return Promise.resolve();
    }
    return new Promise((resolve, reject) =>
      setImmediate(() => {
        try {
          run();
          resolve();
        } catch (e) {
          reject(e);
        }
      }),
    );
  }

  /**
   * ibv_create_cq; depth up to queryDevice().maxCqe. An overrun raises IBV_EVENT_CQ_ERR here.
   * With `{ channel }` (from createCompChannel) the CQ reports events there once armed with
   * `cq.reqNotify()`.
   */
  createCq(depth: number, options: CreateCqOptions = {}): CompletionQueue {
    this.#check();
    checkObject('createCq: options', options, CREATE_CQ_KEYS);
    const { channel } = options;
    if (channel !== undefined) {
      if (!(channel instanceof CompletionChannel) || !this.#channels.has(channel))
        throw verbsError('ibv_create_cq', 'EINVAL', "channel must be a CompletionChannel from this context's createCompChannel()");
      if (channel.closed) throw verbsError('ibv_create_cq', 'EINVAL', 'the completion channel was closed');
    }
    const cq = new CompletionQueue(depth, (c) => this.#raise({ eventType: AsyncEventType.CQ_ERR, name: 'IBV_EVENT_CQ_ERR', cq: c }), {
      channel,
      cqContext: options.cqContext,
    });
    this.#cqs.add(cq);
    return cq;
  }

  /** ibv_create_comp_channel: a channel CQs report their completion events to (ibv_rc_pingpong -e). */
  createCompChannel(): CompletionChannel {
    this.#check();
    const ch = new CompletionChannel((c) => this.#channels.delete(c));
    this.#channels.add(ch);
    return ch;
  }

  /** ibv_create_qp (RC). The QP starts in RESET; QP access flags default to 0 (no remote access). */
  createQp(pd: ProtectionDomain, init: QpInitAttr): QueuePair {
    this.#check();
    this.#ownPd('ibv_create_qp', pd);
    const qp = this.#device.tables.addQp((num) => new QueuePair(this, this.#device, pd, num, init, this.#objects)) as QueuePair;
    this.#objects.qps.add(qp);
    return qp;
  }

  /**
   * ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: an RC QP with the new post API
   * (`wrStart()`, `wrRdmaWrite()`, … `wrComplete()`) for the operations in `sendOpsFlags`
   * (QpExSendOps bits); `postSend()` works as well.
   */
  createQpEx(pd: ProtectionDomain, init: QpInitAttrEx): QueuePairEx {
    this.#check();
    this.#ownPd('ibv_create_qp_ex', pd);
    const qp = this.#device.tables.addQp((num) => new QueuePairEx(this, this.#device, pd, num, init, this.#objects)) as QueuePairEx;
    this.#objects.qps.add(qp);
    return qp;
  }

  /** ibv_query_qp(qp, attr_mask): the QP's attributes (only the QpAttrMask fields asked for, when a mask is given) and its init attributes. */
  queryQp(qp: QueuePair, attrMask?: number): ReturnType<QueuePair['query']> {
    this.#check();
    if (!(qp instanceof QueuePair) || qp.context !== this)
      throw verbsError('ibv_query_qp', 'EINVAL', 'qp must be a QueuePair created by this context');
    return qp.query(attrMask);
  }

  /** The attributes of one of this context's MRs: its ibv_mr fields, access, and ODP counters. */
  queryMr(mr: MemoryRegion): MrAttr {
    this.#check();
    if (!(mr instanceof MemoryRegion) || mr.pd.context !== this)
      throw verbsError('ibv_query_mr', 'EINVAL', 'mr must be a MemoryRegion registered by this context');
    if (mr.closed) throw verbsError('ibv_query_mr', 'EINVAL', 'the MR was deregistered');
    const length = mr.implicit ? SIZE_MAX : BigInt(mr.length);
    return {
      addr: mr.addr,
      length,
      iova: mr.addr,
      lkey: mr.lkey,
      rkey: mr.rkey,
      access: mr.access,
      onDemand: mr.onDemand,
      implicit: mr.implicit,
      pinned: mr.pinned,
      odp: mr.onDemand ? mr.odpStats : undefined,
    };
  }

  /** `rdma statistic mr` for this process: one row per ODP MR, oldest first (formatMrStatistics() prints them). */
  statisticMr(): MrStatistic[] {
    this.#check();
    return [...this.#objects.mrs].filter((m) => m.onDemand).map((m) => ({ dev: `pfr${this.node}`, mrn: m.lkey, ...m.odpStats }));
  }

  /**
   * ibv_create_srq: a shared receive queue in `pd`. QPs created with `{ srq }` take their
   * receives from it; `srqLimit` (here or in `srq.modify`) arms IBV_EVENT_SRQ_LIMIT_REACHED.
   */
  createSrq(pd: ProtectionDomain, attr: SrqInitAttr = {}): SharedReceiveQueue {
    this.#check();
    this.#ownPd('ibv_create_srq', pd);
    const srq = new SharedReceiveQueue(this, pd, attr, (s) =>
      this.#raise({ eventType: AsyncEventType.SRQ_LIMIT_REACHED, name: 'IBV_EVENT_SRQ_LIMIT_REACHED', srq: s }),
    );
    this.#srqs.add(srq);
    return srq;
  }

  /** ibv_open_xrcd: an XRC domain, for XRC SRQs (`createSrq(pd, { srqType: SrqType.XRC, xrcd, cq })`) and XRC_RECV QPs. */
  openXrcd(): XrcDomain {
    this.#check();
    const x = new XrcDomain();
    this.#xrcds.add(x);
    return x;
  }

  /** ibv_create_ah: the address of a node's port for UD SENDs (`wr.ud.ah`); `dlid` is the node's number. */
  createAh(pd: ProtectionDomain, attr: AhAttr): AddressHandle {
    this.#check();
    this.#ownPd('ibv_create_ah', pd);
    const ah = new AddressHandle(pd, this.#device, attr);
    this.#ahs.add(ah);
    return ah;
  }

  /** ibv_close_device: destroy QPs (flushing their work) and SRQs, deregister MRs, free PDs, close CQs. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const qp of [...this.#objects.qps]) qp.destroy();
    for (const srq of this.#srqs) srq.destroy();
    for (const ah of this.#ahs) ah.destroy();
    for (const x of this.#xrcds) x.close();
    for (const mr of [...this.#objects.mrs]) mr.dereg();
    for (const pd of [...this.#objects.pds]) pd.dealloc();
    for (const cq of this.#cqs) cq.destroy();
    for (const ch of [...this.#channels]) ch.shut();
    this.faultLibrary.close();
    this.#forget(this);
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  // A fault the library resolved is counted on the ODP MR it was taken through: the PD's
  // stream and the address name it (an explicit MR first, newest first, as the library
  // picks the registration; else the PD's implicit MR). page_faults counts the pages mapped.
  #countFault(f: ResolvedFault): void {
    if (f.status !== IommuPageResponseCode.SUCCESS) return;
    let implicit: MemoryRegion | undefined;
    let explicit: MemoryRegion | undefined;
    for (const mr of this.#objects.mrs) {
      if (!mr.onDemand || mr.pd.stream.sid !== f.sid) continue;
      if (mr.implicit) implicit ??= mr;
      else if (f.va >= mr.addr && f.va < mr.addr + BigInt(mr.length)) explicit = mr;
    }
    const mr = explicit ?? implicit;
    if (!mr) return;
    mr.odpCounters.faults += Math.ceil(f.bytes / (f.region?.pageSize ?? PAGE_SIZE));
    mr.odpCounters.faultsHandled++;
  }

  #raise(e: AsyncEvent): void {
    this.#events.push(e);
    for (const l of this.#eventListeners) l(e);
  }

  #ownPd(verb: string, pd: ProtectionDomain): void {
    if (!(pd instanceof ProtectionDomain)) throw verbsError(verb, 'EINVAL', 'pd must be a ProtectionDomain from allocPd()');
    pd.check();
    if (pd.context !== this) throw verbsError(verb, 'EINVAL', 'the protection domain belongs to another context');
  }

  #check(): void {
    if (this.#closed) throw closedError('Context');
  }
}

// Why an MR is addressed only by its own virtual address.
const SVA = 'the modelled SMMU translates process virtual addresses (shared virtual addressing), so an MR is addressed by its own VA';

function regionOfBuffer(buffer: ArrayBuffer): Region {
  if (!(buffer instanceof ArrayBuffer)) throw invalidArg('regMr: memory must be a Region, the ArrayBuffer of one, or null (implicit ODP)');
  const r = Region.ofBuffer(buffer);
  if (!r) throw invalidArg('regMr: this ArrayBuffer is not mapped by mapRegion(); register memory from mapRegion() so its pages can fault');
  return r;
}
