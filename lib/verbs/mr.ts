// Protection domains and memory regions. An ODP MR (ON_DEMAND) is registered with the fault
// library and may fault; any other MR is pinned (mlock) at registration, bounded by
// RLIMIT_MEMLOCK. Implicit ODP (address 0, length SIZE_MAX) gives one key for every region
// of the process.
import type { StreamContext } from '../../kernel-sim/index.js';
import { closedError } from '../errors.js';
import type { Registration } from '../fault-library/fault-library.js';
import type { PolicyName, PolicyOptions } from '../fault-library/policy.js';
import { findRegion, Region } from '../region.js';
import { Access } from './constants.js';
import type { Context } from './cluster.js';

// All simulated nodes live in one OS process, so every region is in one address space.
// A region registered by a context belongs to that context's (simulated) process: another
// process's implicit key must not reach it.
const owners = new WeakMap<Region, Context>();

/** @internal record that `ctx`'s process owns `region` (its first registration wins). */
export function claimRegion(region: Region, ctx: Context): void {
  if (!owners.has(region)) owners.set(region, ctx);
}

export class ProtectionDomain {
  /** Cluster-wide id; the SMMU stream of this PD on its node carries it (ExaNet's PDID). */
  readonly handle: number;
  readonly context: Context;
  /** @internal */
  readonly stream: StreamContext;
  #closed = false;

  /** @internal use Context.allocPd */
  constructor(context: Context, handle: number, stream: StreamContext) {
    this.context = context;
    this.handle = handle;
    this.stream = stream;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_dealloc_pd */
  dealloc(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.context.releasePd(this);
  }

  /** @internal */
  check(): void {
    if (this.#closed) throw closedError('ProtectionDomain');
  }
}

export interface RegMrOptions {
  /** ODP resolution policy (default: the context's, 'touch-ahead'). */
  policy?: PolicyName;
  policyOptions?: PolicyOptions;
}

export class MemoryRegion {
  readonly pd: ProtectionDomain;
  readonly lkey: number;
  readonly rkey: number;
  /** The registered memory, or undefined for an implicit ODP MR. */
  readonly region: Region | undefined;
  readonly offset: number;
  /** Start address (0n for implicit) and length (SIZE_MAX for implicit). */
  readonly addr: bigint;
  readonly length: number;
  readonly access: number;
  readonly implicit: boolean;
  /** @internal the fault library registration of an explicit ODP MR */
  readonly registration: Registration | undefined;
  #closed = false;
  #pinned: boolean;

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
  }

  get onDemand(): boolean {
    return (this.access & Access.ON_DEMAND) !== 0;
  }

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
    return pages * this.pd.context.cluster.system.costs.pinPageUs;
  }

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
    if (!reg) throw new TypeError('setPolicy: only explicit ODP MRs have a policy of their own');
    const lib = this.pd.context.faultLibrary;
    const old = { policy: reg.policy, options: reg.options };
    lib.setPolicy(reg, policy, options); // validates
    try {
      if (policy === 'pin' && !this.#pinned) {
        this.region!.pin(this.offset, this.length);
        this.#pinned = true;
      } else if (policy !== 'pin' && this.#pinned) {
        this.region!.unpin(this.offset, this.length);
        this.#pinned = false;
      }
    } catch (err) {
      lib.setPolicy(reg, old.policy, old.options);
      throw err;
    }
  }

  /**
   * The region and offset for [addr, addr+length) if this MR covers it, else undefined
   * (an implicit MR covers every open region of the process).
   */
  resolve(addr: bigint, length: number): { region: Region; offset: number } | undefined {
    if (this.#closed) return undefined;
    if (this.implicit) {
      const r = findRegion(addr, Math.max(1, length));
      const owner = r && owners.get(r);
      if (!r || (owner && owner !== this.pd.context)) return undefined;
      return { region: r, offset: Number(addr - r.address) };
    }
    const end = this.addr + BigInt(this.length);
    if (addr < this.addr || addr + BigInt(length) > end || this.region!.closed) return undefined;
    return { region: this.region!, offset: Number(addr - this.region!.address) };
  }

  /** ibv_dereg_mr: unpin a pinned MR, forget the key. Idempotent. */
  dereg(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#pinned && this.region && !this.region.closed) this.region.unpin(this.offset, this.length);
    this.#pinned = false;
    if (this.registration) this.pd.context.faultLibrary.unregister(this.registration);
    this.pd.context.releaseMr(this);
  }

  [Symbol.dispose](): void {
    this.dereg();
  }

  #check(): void {
    if (this.#closed) throw closedError('MemoryRegion');
  }
}
