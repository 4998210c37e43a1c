// A program context's objects (PDs, MRs, CQs, QPs, …), each under a handle of the context's
// own: one space for all kinds, never reused while the context lives, so a stale or forged
// handle is refused, as is a handle of another context (each has its own table). Objects that
// others use count their users: destroying one in use is EBUSY, as in uverbs.
import { Refusal } from './abi.js';
import { refuse } from './messages.js';
import type { QpState, QpType } from './ib.js';
import type { RingMemory } from './rings.js';

/** What every object has: its handle, kind, users and how to let go of what it holds. */
interface Base {
  handle: number;
  /** Objects that depend on this one (a PD's MRs and QPs, a CQ's QPs, …). */
  users: number;
}

export interface Pd extends Base {
  kind: 'pd';
}

export interface Mr extends Base {
  kind: 'mr';
  pd: Pd;
  start: bigint;
  length: bigint;
  access: number;
  policy: number;
  lkey: number;
  rkey: number;
  /** addr 0, length SIZE_MAX: the whole address space, on demand. */
  implicit: boolean;
}

export interface CompChannel extends Base {
  kind: 'channel';
  /** The write end of the program's event pipe. */
  fd: number;
}

export interface Cq extends Base {
  kind: 'cq';
  capacity: number;
  channel: CompChannel | undefined;
  ring: RingMemory;
}

export interface Xrcd extends Base {
  kind: 'xrcd';
  /** The device-wide domain of a file's inode this handle opens (ibv_open_xrcd with an fd), if any. */
  shared: SharedXrcd | undefined;
}

/** An XRC domain named by a file: one per inode on the device, as long as a context holds it open. */
export interface SharedXrcd {
  key: string;
  /** Handles of any context that name it. */
  opens: number;
}

export interface Srq extends Base {
  kind: 'srq';
  pd: Pd;
  srqNum: number;
  xrcd: Xrcd | undefined;
  cq: Cq | undefined;
  maxWr: number;
  maxSge: number;
  limit: number;
  ring: RingMemory;
}

export interface Ah extends Base {
  kind: 'ah';
  pd: Pd;
  /** The destination's GID (all zeros without a GRH: this host). */
  dgid: Uint8Array;
}

/** What MODIFY_QP has set (struct ibv_qp_attr's fields the device keeps). */
export interface QpAttrs {
  qkey: number;
  rqPsn: number;
  sqPsn: number;
  destQpNum: number;
  accessFlags: number;
  pkeyIndex: number;
  pathMtu: number;
  maxRdAtomic: number;
  maxDestRdAtomic: number;
  minRnrTimer: number;
  portNum: number;
  timeout: number;
  retryCnt: number;
  rnrRetry: number;
  /** The AV's ib_uverbs_qp_dest, as given. */
  dest: Uint8Array;
}

export interface Qp extends Base {
  kind: 'qp';
  type: QpType;
  qpNum: number;
  pd: Pd | undefined;
  sendCq: Cq | undefined;
  recvCq: Cq | undefined;
  srq: Srq | undefined;
  xrcd: Xrcd | undefined;
  caps: { maxSendWr: number; maxRecvWr: number; maxSendSge: number; maxRecvSge: number; maxInlineData: number };
  sqSigAll: boolean;
  state: QpState;
  attrs: QpAttrs;
  /** The send and receive rings (none for XRC_RECV). */
  ring: RingMemory | undefined;
}

export type DeviceObject = Pd | Mr | CompChannel | Cq | Xrcd | Srq | Ah | Qp;
type Kind = DeviceObject['kind'];
type OfKind<K extends Kind> = Extract<DeviceObject, { kind: K }>;

/** One context's objects by handle. */
export class ObjectTable {
  readonly #objects = new Map<number, DeviceObject>();
  #next = 1;

  get size(): number {
    return this.#objects.size;
  }

  /** The next handle (objects are built with it, then added). */
  nextHandle(): number {
    return this.#next++;
  }

  add<T extends DeviceObject>(o: T): T {
    this.#objects.set(o.handle, o);
    return o;
  }

  /** The object `handle` names if it is a `kind`; refused (EINVAL) otherwise. */
  get<K extends Kind>(handle: number, kind: K): OfKind<K> {
    const o = this.#objects.get(handle);
    if (!o || o.kind !== kind) refuse(Refusal.HANDLE, 'EINVAL', `handle ${handle} is not a ${kind} of this context`);
    return o as OfKind<K>;
  }

  /** As get, or undefined for PFR_NO_HANDLE. */
  optional<K extends Kind>(handle: number, kind: K, none: number): OfKind<K> | undefined {
    return handle === none ? undefined : this.get(handle, kind);
  }

  /** Take an unused object out of the table (EBUSY while others use it). */
  remove<K extends Kind>(handle: number, kind: K): OfKind<K> {
    const o = this.get(handle, kind);
    if (o.users > 0) refuse(Refusal.BODY, 'EBUSY', `${kind} ${handle} is in use by ${o.users} object${o.users === 1 ? '' : 's'}`);
    this.#objects.delete(handle);
    return o;
  }

  /** Every object, newest first (users before what they use), and the table emptied. */
  drain(): DeviceObject[] {
    const all = [...this.#objects.values()].reverse();
    this.#objects.clear();
    return all;
  }

  /** The objects of one kind. */
  all<K extends Kind>(kind: K): OfKind<K>[] {
    return [...this.#objects.values()].filter((o): o is OfKind<K> => o.kind === kind);
  }
}
