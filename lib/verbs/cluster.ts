// A Cluster is N simulated nodes in one process, wired by the modelled fabric, with one
// RDMA device per node; a Context (ibv_context) is one process on one node, with its
// netlink socket and fault library. The Cluster and Context create objects; the objects
// themselves know only their device (its tables) and their process.
import { SimSystem, type SystemOptions } from '../../kernel-sim/index.js';
import { checkSystemOptions } from '../../kernel-sim/system.js';
import { closedError } from '../errors.js';
import { FaultLibrary, traceLimit, type TraceOption } from '../fault-library/fault-library.js';
import { POLICIES, type PolicyName } from '../fault-library/policy.js';
import { PAGE_SIZE, Region } from '../region.js';
import type { Userfaultfd } from '../uffd.js';
import { checkInt, checkObject, invalidArg } from '../validate.js';
import { Access, AdviseMrAdvice, AdviseMrFlags, AsyncEventType, knownAccess, OdpGeneralCaps, OdpTransportCaps, SIZE_MAX } from './constants.js';
import { CompletionQueue } from './cq.js';
import { Device, type Endpoint, type KeyedMr } from './device.js';
import { verbsError } from './errors.js';
import { MemoryRegion, pinForMr, ProtectionDomain, type ProcessObjects, type RegMrOptions, unpinForMr } from './mr.js';
import { QueuePair, type QpInitAttr } from './qp.js';
import { SharedReceiveQueue, type SrqInitAttr } from './srq.js';
import { AddressHandle, type AhAttr } from './ah.js';
import { XrcDomain } from './xrc.js';
import type { Sge } from './qp-core.js';
import { claimRegion, DEVICE_LIMITS, DeviceTables, IdAllocator, KeyAllocator, qpNumbers } from './tables.js';

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
  };
}

/** Simulated nodes on one fabric, each with an SMMU, a fault-aware DMA engine and its driver; `openDevice(n)` opens a process (an ibv_context) on node n. */
export class Cluster {
  /** The modelled hardware and kernel of every node (kernel-sim). */
  readonly system: SimSystem;
  #contexts = new Set<Context>();
  #devices: Device[];
  #nextPid = 1000;
  #pds = new IdAllocator(1, 0xffff);
  #defaultPolicy: PolicyName;
  #trace: TraceOption;
  #closed = false;

  private constructor(options: ClusterOptions) {
    const { defaultPolicy, trace, ...sys } = options;
    traceLimit(trace); // a bad option fails here, before anything is built
    this.#trace = trace ?? false;
    this.system = new SimSystem(sys);
    this.#defaultPolicy = defaultPolicy ?? 'touch-ahead';
    const keys = new KeyAllocator();
    const qpns = qpNumbers();
    this.#devices = this.system.nodes.map((n) => new Device(n, this.system.costs, new DeviceTables<KeyedMr, Endpoint>(n.id, keys, qpns, n.tables)));
  }

  /** Create `nodes` simulated nodes (default 2) wired by the fabric. Every option is checked first. */
  static create(options: ClusterOptions = {}): Cluster {
    checkObject('Cluster.create: options', options);
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
    checkObject('openDevice: options', options);
    if (options.defaultPolicy !== undefined && !POLICIES.includes(options.defaultPolicy))
      throw invalidArg(`openDevice: defaultPolicy must be one of ${POLICIES.join(', ')}, got ${String(options.defaultPolicy)}`);
    const trace = options.trace ?? this.#trace;
    traceLimit(trace);
    const ctx = new Context(
      this,
      this.#devices[node]!,
      this.#nextPid++,
      options.defaultPolicy ?? this.#defaultPolicy,
      options.uffd,
      trace,
      this.#pds,
      (c) => this.#contexts.delete(c),
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
    pds: IdAllocator,
    forget: (c: Context) => void,
  ) {
    this.cluster = cluster;
    this.#device = device;
    this.#pdHandles = pds;
    this.#forget = forget;
    this.node = device.node;
    this.pid = pid;
    const socket = device.sim.openProcess(pid);
    const opts: ConstructorParameters<typeof FaultLibrary>[0] = { system: cluster.system, node: device.node, pid, socket, defaultPolicy, trace };
    if (uffd) opts.uffd = uffd;
    this.faultLibrary = new FaultLibrary(opts);
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
    this.#ownPd('ibv_reg_mr', pd);
    if (!knownAccess(access)) throw verbsError('ibv_reg_mr', 'EINVAL', `unknown access flags 0x${Number(access).toString(16)}`);
    if (access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) && !(access & Access.LOCAL_WRITE))
      throw verbsError('ibv_reg_mr', 'EINVAL', 'REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (as in libibverbs)');
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
    if (access & Access.HUGETLB && !region.hugePages)
      throw verbsError('ibv_reg_mr', 'EINVAL', 'Access.HUGETLB needs a region mapped with { hugePages: true }');
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
      const mr = this.#device.tables.mr(sge.lkey) as MemoryRegion | undefined;
      if ((!mr || mr.closed) && this.#device.tables.keys.has(sge.lkey))
        throw verbsError('ibv_advise_mr', 'EPERM', 'the lkey belongs to another process');
      if (!mr || mr.closed) throw verbsError('ibv_advise_mr', 'EFAULT', `no MR with lkey 0x${sge.lkey.toString(16)}`);
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
        if (advice !== AdviseMrAdvice.PREFETCH_NO_FAULT)
          region.populate(start, Math.min(len, region.size - start), { write: advice === AdviseMrAdvice.PREFETCH_WRITE });
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

  /** ibv_create_cq; depth up to queryDevice().maxCqe. An overrun raises IBV_EVENT_CQ_ERR here. */
  createCq(depth: number): CompletionQueue {
    this.#check();
    const cq = new CompletionQueue(depth, (c) => this.#raise({ eventType: AsyncEventType.CQ_ERR, name: 'IBV_EVENT_CQ_ERR', cq: c }));
    this.#cqs.add(cq);
    return cq;
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
    for (const cq of this.#cqs) cq.close();
    this.faultLibrary.close();
    this.#forget(this);
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
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

function regionOfBuffer(buffer: ArrayBuffer): Region {
  if (!(buffer instanceof ArrayBuffer)) throw invalidArg('regMr: memory must be a Region, the ArrayBuffer of one, or null (implicit ODP)');
  const r = Region.ofBuffer(buffer);
  if (!r) throw invalidArg('regMr: this ArrayBuffer is not mapped by mapRegion(); register memory from mapRegion() so its pages can fault');
  return r;
}
