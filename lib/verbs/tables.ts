// The object tables of the verbs layer (rdma_rxe's rxe_pool): protection-domain handles,
// memory keys and QP numbers are handed out, looked up and released here, one table per
// device (node) for what a device looks up on its own. MRs and QPs hold the table of their
// own device, never their Cluster or Context, and a device only ever looks in its own.
import type { RcMr, RcQp, RcSrq, RcTables } from '../../kernel-sim/index.js';
import type { Region } from '../region.js';
import { verbsError } from './errors.js';

/**
 * 32-bit keys, unique among the live ones, that do not look like small consecutive integers
 * (as real lkeys/rkeys do not). The allocator walks the whole 32-bit space with an odd
 * stride (a full cycle), skipping keys in use and 0, so keys stay 32-bit and unique however
 * many registrations come and go.
 */
export class KeyAllocator {
  #next: number;
  #stride: number;
  #live = new Set<number>();

  constructor(first = 0x1000, stride = 0x101) {
    this.#next = first >>> 0;
    this.#stride = stride | 1;
  }

  alloc(): number {
    if (this.#live.size >= 0xffff_ffff) throw verbsError('ibv_reg_mr', 'ENOMEM', 'every 32-bit key is in use');
    for (;;) {
      const k = this.#next;
      this.#next = (this.#next + this.#stride) >>> 0;
      if (k !== 0 && !this.#live.has(k)) {
        this.#live.add(k);
        return k;
      }
    }
  }

  free(key: number): void {
    this.#live.delete(key);
  }
}

/** Small ids (PD handles, QP numbers) in [first, max], reused only after a full wrap. */
export class IdAllocator {
  #next: number;
  #first: number;
  #max: number;
  #live = new Set<number>();

  constructor(first: number, max: number, start = first) {
    this.#first = first;
    this.#next = start;
    this.#max = max;
  }

  alloc(what: string): number {
    if (this.#live.size > this.#max - this.#first) throw verbsError(what, 'ENOMEM', 'no free id left');
    for (;;) {
      const id = this.#next;
      this.#next = this.#next >= this.#max ? this.#first : this.#next + 1;
      if (!this.#live.has(id)) {
        this.#live.add(id);
        return id;
      }
    }
  }

  free(id: number): void {
    this.#live.delete(id);
  }
}

/** IB QP numbers are 24-bit; 0 and 1 are the special QPs. Each node starts apart (two HCAs' numbers rarely meet; nothing relies on it). */
function qpNumbers(node: number): IdAllocator {
  return new IdAllocator(0x11, 0xff_ffff, 0x11 + (node % 0xffff) * 0x100);
}

/** Device limits (ibv_query_device), enforced by the tables. */
export const DEVICE_LIMITS = { maxQp: 1 << 16, maxCqe: 1 << 22, maxMr: 1 << 20, maxSge: 16 } as const;

/**
 * One device's (node's) tables: its MRs by key and its QPs by number, as the provider knows
 * them. Their device records (an MR's RcMr, a QP's RcQueuePair) are entered into the node's
 * own RcTables here, at registration and creation (the control path, as ibv_reg_mr's and
 * ibv_create_qp's commands), and removed at dereg and destroy: the engine checks every RC
 * packet there, never asking the verbs.
 */
export class DeviceTables<MR extends { readonly rc: RcMr }, QP extends { readonly rc: RcQp }, SRQ = object> {
  readonly node: number;
  readonly #mrs = new Map<number, MR>();
  readonly #qps = new Map<number, QP>();
  readonly #srqs = new Map<number, SRQ>();
  readonly #srqHandles = new IdAllocator(1, 0xff_ffff);
  readonly #rc: RcTables;
  /** This device's memory keys (each node has its own, as each HCA does; they start apart so one node's key is not another's by chance). */
  readonly keys: KeyAllocator;
  /** This device's protection-domain handles. */
  readonly pds = new IdAllocator(1, 0xffff);
  #qpns: IdAllocator;

  constructor(node: number, rc: RcTables) {
    this.node = node;
    this.#qpns = qpNumbers(node);
    this.keys = new KeyAllocator(0x1000 + ((node * 0x0100_0000) >>> 0));
    this.#rc = rc;
  }

  addMr(make: (key: number) => MR): MR {
    if (this.#mrs.size >= DEVICE_LIMITS.maxMr)
      throw verbsError('ibv_reg_mr', 'ENOMEM', `the device holds at most ${DEVICE_LIMITS.maxMr} MRs (queryDevice().maxMr)`);
    const key = this.keys.alloc();
    try {
      const mr = make(key);
      this.#mrs.set(key, mr);
      this.#rc.mrs.set(key, mr.rc);
      return mr;
    } catch (e) {
      this.keys.free(key);
      throw e;
    }
  }

  mr(key: number): MR | undefined {
    return this.#mrs.get(key);
  }

  removeMr(key: number): void {
    this.#rc.mrs.delete(key);
    if (this.#mrs.delete(key)) this.keys.free(key);
  }

  addQp(make: (qpn: number) => QP): QP {
    if (this.#qps.size >= DEVICE_LIMITS.maxQp)
      throw verbsError('ibv_create_qp', 'ENOMEM', `the device holds at most ${DEVICE_LIMITS.maxQp} QPs (queryDevice().maxQp)`);
    const qpn = this.#qpns.alloc('ibv_create_qp');
    try {
      const qp = make(qpn);
      this.#qps.set(qpn, qp);
      this.#rc.qps.set(qpn, qp.rc);
      return qp;
    } catch (e) {
      this.#qpns.free(qpn);
      throw e;
    }
  }

  qps(): IterableIterator<QP> {
    return this.#qps.values();
  }

  qp(qpn: number): QP | undefined {
    return this.#qps.get(qpn);
  }

  removeQp(qpn: number): void {
    this.#rc.qps.delete(qpn);
    if (this.#qps.delete(qpn)) this.#qpns.free(qpn);
  }

  /** Enter an SRQ's record under a new handle (24 bits: an XRC SRQ's number is its handle). */
  addSrq(make: (handle: number) => RcSrq, srq: SRQ): RcSrq {
    const handle = this.#srqHandles.alloc('ibv_create_srq');
    const rc = make(handle);
    this.#srqs.set(handle, srq);
    this.#rc.srqs.set(handle, rc);
    return rc;
  }

  srq(handle: number): SRQ | undefined {
    return this.#srqs.get(handle);
  }

  removeSrq(handle: number): void {
    this.#rc.srqs.delete(handle);
    if (this.#srqs.delete(handle)) this.#srqHandles.free(handle);
  }
}

/**
 * Which simulated process owns a region. All simulated nodes live in one OS process, so
 * every region is in one address space: a region belongs to the first process that
 * registers it or reaches it through its implicit key, and another process's implicit key
 * never reaches it. Regions the library maps for its own use belong to LIBRARY.
 */
export const LIBRARY = Symbol('pagefault-rdma library memory');
const owners = new WeakMap<Region, object | typeof LIBRARY>();

/** Claim `region` for `owner` unless someone owns it already; true if `owner` owns it now. */
export function claimRegion(region: Region, owner: object | typeof LIBRARY): boolean {
  const cur = owners.get(region);
  if (cur === undefined) {
    owners.set(region, owner);
    return true;
  }
  return cur === owner;
}
