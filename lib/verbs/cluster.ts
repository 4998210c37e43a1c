// A Cluster is N simulated nodes in one process, wired by the modelled fabric; a Context
// (ibv_context) is one process on one node, with its netlink socket and fault library.
import { SimSystem, type SystemOptions, type SimNode } from '../../kernel-sim/index.js';
import { closedError } from '../errors.js';
import { FaultLibrary } from '../fault-library/fault-library.js';
import type { PolicyName } from '../fault-library/policy.js';
import { PAGE_SIZE, Region } from '../region.js';
import type { Userfaultfd } from '../uffd.js';
import { checkInt, checkObject, invalidArg } from '../validate.js';
import { Access, AdviseMrAdvice, AdviseMrFlags, knownAccess, OdpGeneralCaps, OdpTransportCaps, SIZE_MAX } from './constants.js';
import { CompletionQueue } from './cq.js';
import { verbsError } from './errors.js';
import { claimRegion, MemoryRegion, ProtectionDomain, type RegMrOptions } from './mr.js';
import { QueuePair, type QpInitAttr } from './qp.js';

export interface ClusterOptions extends SystemOptions {
  /** Default ODP policy of every context (default 'touch-ahead'). */
  defaultPolicy?: PolicyName;
}

export interface DeviceAttr {
  name: string;
  node: number;
  maxQp: number;
  maxCqe: number;
  maxMr: number;
  maxSge: number;
  maxMrSize: bigint;
  pageSizeCap: number;
  odpCaps: { generalCaps: number; rcOdpCaps: number; ucOdpCaps: number; udOdpCaps: number };
}

/** One scatter/gather element (struct ibv_sge). */
export interface Sge {
  addr: bigint;
  length: number;
  lkey: number;
}

export class Cluster {
  readonly system: SimSystem;
  #contexts = new Set<Context>();
  #mrs = new Map<number, MemoryRegion>();
  #qps = new Map<string, QueuePair>();
  #nextPid = 1000;
  #nextPd = 1;
  #nextKey = 0x1000;
  #nextQp = 0x11;
  #defaultPolicy: PolicyName;
  #closed = false;
  /** Serialises atomics: the responders' atomic units. */
  atomicChain: Promise<unknown> = Promise.resolve();

  private constructor(options: ClusterOptions) {
    const { defaultPolicy, ...sys } = options;
    this.system = new SimSystem(sys);
    this.#defaultPolicy = defaultPolicy ?? 'touch-ahead';
  }

  /** Create `nodes` simulated nodes (default 2) wired by the fabric. */
  static create(options: ClusterOptions = {}): Cluster {
    checkObject('Cluster.create: options', options);
    return new Cluster(options);
  }

  get nodes(): number {
    return this.system.nodes.length;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_open_device on `node`: a new process there, with its fault library. */
  openDevice(node: number, options: { defaultPolicy?: PolicyName; uffd?: Userfaultfd } = {}): Context {
    this.#check();
    checkInt('openDevice: node', node, 0, this.nodes - 1);
    const ctx = new Context(this, this.system.node(node), this.#nextPid++, options.defaultPolicy ?? this.#defaultPolicy, options.uffd);
    this.#contexts.add(ctx);
    return ctx;
  }

  /** @internal */
  newPdHandle(): number {
    return this.#nextPd++;
  }
  /** @internal */
  newKey(mr: (key: number) => MemoryRegion): MemoryRegion {
    const key = this.#nextKey;
    this.#nextKey += 0x101; // keys that are not consecutive small integers, like real ones
    const m = mr(key);
    this.#mrs.set(key, m);
    return m;
  }
  /** @internal */
  mrByKey(key: number): MemoryRegion | undefined {
    return this.#mrs.get(key);
  }
  /** @internal */
  forgetMr(mr: MemoryRegion): void {
    this.#mrs.delete(mr.lkey);
  }
  /** @internal */
  newQp(qp: (num: number) => QueuePair): QueuePair {
    const n = this.#nextQp++;
    const q = qp(n);
    this.#qps.set(`${q.context.node}:${n}`, q);
    return q;
  }
  /** @internal */
  qp(node: number, num: number): QueuePair | undefined {
    return this.#qps.get(`${node}:${num}`);
  }
  /** @internal */
  forgetQp(qp: QueuePair): void {
    this.#qps.delete(`${qp.context.node}:${qp.qpNum}`);
  }
  /** @internal */
  forgetContext(ctx: Context): void {
    this.#contexts.delete(ctx);
  }

  /** Close every context (QPs flushed), then the simulated system. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const c of [...this.#contexts]) c.close();
    this.system.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  #check(): void {
    if (this.#closed) throw closedError('Cluster');
  }
}

export class Context {
  readonly cluster: Cluster;
  readonly node: number;
  /** The (simulated) process id its faults are sent to. */
  readonly pid: number;
  readonly faultLibrary: FaultLibrary;
  /** @internal */
  readonly simNode: SimNode;
  #pds = new Set<ProtectionDomain>();
  #mrs = new Set<MemoryRegion>();
  #qps = new Set<QueuePair>();
  #cqs = new Set<CompletionQueue>();
  #closed = false;

  /** @internal use Cluster.openDevice */
  constructor(cluster: Cluster, node: SimNode, pid: number, defaultPolicy: PolicyName, uffd: Userfaultfd | undefined) {
    this.cluster = cluster;
    this.simNode = node;
    this.node = node.id;
    this.pid = pid;
    const socket = node.netlink.bind(pid);
    const opts: ConstructorParameters<typeof FaultLibrary>[0] = { system: cluster.system, node: node.id, pid, socket, defaultPolicy };
    if (uffd) opts.uffd = uffd;
    this.faultLibrary = new FaultLibrary(opts);
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_query_device(_ex): limits and ODP capabilities. */
  queryDevice(): DeviceAttr {
    this.#check();
    const rc = OdpTransportCaps.SEND | OdpTransportCaps.RECV | OdpTransportCaps.WRITE | OdpTransportCaps.READ | OdpTransportCaps.ATOMIC;
    return {
      name: `pfr${this.node}`,
      node: this.node,
      maxQp: 1 << 16,
      maxCqe: 1 << 22,
      maxMr: 1 << 20,
      maxSge: 16,
      maxMrSize: SIZE_MAX,
      pageSizeCap: PAGE_SIZE,
      odpCaps: { generalCaps: OdpGeneralCaps.SUPPORT | OdpGeneralCaps.SUPPORT_IMPLICIT, rcOdpCaps: rc, ucOdpCaps: 0, udOdpCaps: 0 },
    };
  }

  /** ibv_alloc_pd: a protection domain, with its stream in this node's SMMU. */
  allocPd(): ProtectionDomain {
    this.#check();
    const handle = this.cluster.newPdHandle();
    const stream = this.simNode.smmu.attach({ pid: this.pid, pd: handle });
    const pd = new ProtectionDomain(this, handle, stream);
    this.#pds.add(pd);
    return pd;
  }

  /**
   * ibv_reg_mr. `memory` is a Region (or the ArrayBuffer of one) and [offset, offset+length)
   * a range of it; or null with offset 0 and length SIZE_MAX (or Infinity) for implicit ODP.
   * Without Access.ON_DEMAND the range is pinned now.
   */
  regMr(pd: ProtectionDomain, memory: Region | ArrayBuffer | null, offset: number, length: number | bigint, access: number, options: RegMrOptions = {}): MemoryRegion {
    this.#check();
    pd.check();
    if (pd.context !== this) throw verbsError('ibv_reg_mr', 'EINVAL', 'the protection domain belongs to another context');
    if (!knownAccess(access)) throw verbsError('ibv_reg_mr', 'EINVAL', `unknown access flags 0x${Number(access).toString(16)}`);
    if ((access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)) && !(access & Access.LOCAL_WRITE))
      throw verbsError('ibv_reg_mr', 'EINVAL', 'REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (as in libibverbs)');
    const odp = (access & Access.ON_DEMAND) !== 0;
    const lib = this.faultLibrary;

    if (memory === null) {
      if (offset !== 0 || (length !== SIZE_MAX && length !== Infinity))
        throw verbsError('ibv_reg_mr', 'EINVAL', 'an MR without memory is implicit ODP: pass offset 0 and length SIZE_MAX');
      if (!odp) throw verbsError('ibv_reg_mr', 'EINVAL', 'implicit MRs (address 0, length SIZE_MAX) need Access.ON_DEMAND');
      const mr = this.cluster.newKey((key) => new MemoryRegion(pd, key, undefined, 0, Number.MAX_SAFE_INTEGER, access, undefined, false));
      this.#mrs.add(mr);
      return mr;
    }
    const region = memory instanceof Region ? memory : regionOfBuffer(memory);
    if (typeof length !== 'number') throw invalidArg('regMr: length must be a number for an explicit MR');
    const s = region.span('regMr', offset, length);
    if ((access & Access.HUGETLB) && !region.hugePages) throw verbsError('ibv_reg_mr', 'EINVAL', 'Access.HUGETLB needs a region mapped with { hugePages: true }');
    const policy = options.policy ?? lib.defaultPolicy;
    let pinned = false;
    if (!odp || policy === 'pin') {
      // Pinned MRs, and ODP MRs whose policy is the 'pin' baseline: mlock now.
      region.pin(s.offset, s.length); // throws the RLIMIT_MEMLOCK advice on failure
      pinned = true;
    }
    const registration = odp ? lib.register(region, s.offset, s.length, policy, options.policyOptions ?? {}) : undefined;
    this.simNode.smmu.map(pd.stream.sid, region);
    claimRegion(region, this);
    const mr = this.cluster.newKey((key) => new MemoryRegion(pd, key, region, s.offset, s.length, access, registration, pinned));
    this.#mrs.add(mr);
    return mr;
  }

  /**
   * ibv_advise_mr: make the pages of the SGEs resident and their translations present.
   * With AdviseMrFlags.FLUSH it is done when the call returns; without, it runs on the next
   * turn (the returned promise settles then). Validation errors throw at once.
   */
  adviseMr(pd: ProtectionDomain, advice: AdviseMrAdvice, flags: number, sgList: Sge[]): Promise<void> {
    this.#check();
    pd.check();
    if (!(advice in AdviseMrAdvice) || typeof advice !== 'number') throw verbsError('ibv_advise_mr', 'ENOTSUP', `unknown advice ${String(advice)}`);
    if (!Number.isInteger(flags) || (flags & ~AdviseMrFlags.FLUSH) !== 0) throw verbsError('ibv_advise_mr', 'EINVAL', `unknown flags ${flags}`);
    if (!Array.isArray(sgList) || sgList.length === 0) throw verbsError('ibv_advise_mr', 'EINVAL', 'sgList must hold at least one SGE');
    const work = sgList.map((sge) => {
      const mr = this.cluster.mrByKey(sge.lkey);
      if (!mr || mr.closed) throw verbsError('ibv_advise_mr', 'EFAULT', `no MR with lkey 0x${sge.lkey.toString(16)}`);
      if (mr.pd !== pd) throw verbsError('ibv_advise_mr', 'EPERM', 'the lkey belongs to another protection domain');
      if (!mr.onDemand) throw verbsError('ibv_advise_mr', 'EINVAL', 'advise_mr applies to ODP MRs only (Access.ON_DEMAND)');
      if (advice === AdviseMrAdvice.PREFETCH_WRITE && !(mr.access & Access.LOCAL_WRITE))
        throw verbsError('ibv_advise_mr', 'EPERM', 'PREFETCH_WRITE needs an MR with LOCAL_WRITE');
      const at = mr.resolve(sge.addr, sge.length);
      if (!at) throw verbsError('ibv_advise_mr', 'EFAULT', `range 0x${sge.addr.toString(16)}+${sge.length} is outside the MR`);
      return { ...at, length: sge.length };
    });
    const run = () => {
      const smmu = this.simNode.smmu;
      for (const { region, offset, length } of work) {
        const ps = region.pageSize;
        const start = offset - (offset % ps);
        const len = length + (offset - start);
        smmu.map(pd.stream.sid, region);
        if (advice !== AdviseMrAdvice.PREFETCH_NO_FAULT) region.populate(start, Math.min(len, region.size - start), { write: advice === AdviseMrAdvice.PREFETCH_WRITE });
        // Post the translations of resident pages to the device (its IOTLB); NO_FAULT does
        // only this, for the pages that are already there.
        for (let p = start; p < start + len && p < region.size; p += ps) smmu.translate(pd.stream.sid, region.address + BigInt(p), ps, 'read');
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

  /** ibv_create_cq */
  createCq(depth: number): CompletionQueue {
    this.#check();
    const cq = new CompletionQueue(depth);
    this.#cqs.add(cq);
    return cq;
  }

  /** ibv_create_qp (RC). The QP starts in RESET. */
  createQp(pd: ProtectionDomain, init: QpInitAttr): QueuePair {
    this.#check();
    pd.check();
    if (pd.context !== this) throw verbsError('ibv_create_qp', 'EINVAL', 'the protection domain belongs to another context');
    const qp = this.cluster.newQp((num) => new QueuePair(this, pd, num, init));
    this.#qps.add(qp);
    return qp;
  }

  /** @internal */
  releasePd(pd: ProtectionDomain): void {
    this.#pds.delete(pd);
    this.simNode.smmu.detach(pd.stream.sid);
  }
  /** @internal */
  releaseMr(mr: MemoryRegion): void {
    this.#mrs.delete(mr);
    this.cluster.forgetMr(mr);
  }
  /** @internal */
  releaseQp(qp: QueuePair): void {
    this.#qps.delete(qp);
    this.cluster.forgetQp(qp);
  }

  /** ibv_close_device: destroy QPs (flushing their work), deregister MRs, close CQs. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const qp of [...this.#qps]) qp.destroy();
    for (const mr of [...this.#mrs]) mr.dereg();
    for (const pd of [...this.#pds]) pd.dealloc();
    for (const cq of this.#cqs) cq.close();
    this.faultLibrary.close();
    this.cluster.forgetContext(this);
  }

  [Symbol.dispose](): void {
    this.close();
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
