// What a QP's requester, responder and completer share: the QP's own state (never a peer's)
// and the checks of its own SGEs, made on its own device.
import type { RecvRing } from '../../kernel-sim/device/recv-ring.js';
import type { SendRing } from '../../kernel-sim/device/send-ring.js';
import type { Region } from '../region.js';
import type { AddressHandle } from './ah.js';
import { Access, type QpState, type QpType, type WrOpcode } from './constants.js';
import type { Completer } from './completer.js';
import type { CompletionQueue } from './cq.js';
import type { Device } from './device.js';
import { type MemoryRegion, prefaultIfAsked, type ProtectionDomain } from './mr.js';

export { prefaultIfAsked };

/** One scatter/gather element (struct ibv_sge). */
export interface Sge {
  /** Start address of the buffer (virtual address inside a registered MR). */
  addr: bigint;
  /** Bytes of the buffer. */
  length: number;
  /** The lkey of the MR that holds the buffer. */
  lkey: number;
}

/** A send work request (struct ibv_send_wr), as `QueuePair.postSend` takes it. */
export interface SendWr {
  /** Id returned in the work completion (as a bigint). */
  wrId: bigint | number;
  /** The operation (ibv_wr_opcode). */
  opcode: WrOpcode;
  /** Local buffers (scatter/gather list), gathered in order. */
  sgList: Sge[];
  /** SendFlags bits (SIGNALED asks for a completion, INLINE, FENCE, SOLICITED). */
  sendFlags?: number;
  /** Immediate data of a *_WITH_IMM operation, delivered with the remote completion. */
  immData?: number;
  /** RDMA_WRITE(_WITH_IMM), RDMA_READ and ATOMIC_WRITE (the 8-byte word's address) */
  rdma?: {
    /** Remote virtual address (wr.rdma.remote_addr). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
  };
  /** UD SEND: where it goes (wr.ud): the address handle of the node, the QP there and its Q_Key. */
  ud?: {
    /** The destination's address handle (createAh), in the QP's PD. */
    ah: AddressHandle;
    /** The destination UD QP's number (remote_qpn). */
    remoteQpn: number;
    /** The Q_Key the destination QP holds (remote_qkey); a mismatch is dropped there. */
    remoteQkey: number;
  };
  /** XRC_SEND: the XRC SRQ at the target that the request is for (wr.qp_type.xrc.remote_srqn). */
  xrc?: {
    /** The XRC SRQ's number (its srqNum, ibv_get_srq_num), 24 bits. */
    remoteSrqn: number;
  };
  /** FLUSH: what to flush (ibv_wr_flush's arguments); the WR carries no local buffers. */
  flush?: {
    /** Remote address of the range (with FlushLevel.MR: any address inside the MR). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
    /** Bytes of the range (FlushLevel.RANGE). */
    length: number;
    /** FlushType bits: GLOBAL and/or PERSISTENT. */
    type: number;
    /** FlushLevel: RANGE or MR. */
    level: number;
  };
  /** ATOMIC_CMP_AND_SWP (compareAdd = compare, swap) and ATOMIC_FETCH_AND_ADD (compareAdd = add) */
  atomic?: {
    /** Remote virtual address of the 8-byte word (wr.atomic.remote_addr). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
    /** FETCH_AND_ADD: the value added; CMP_AND_SWP: the value compared with. */
    compareAdd: bigint;
    /** CMP_AND_SWP: the value written when the comparison matches. */
    swap?: bigint;
  };
}

/** A receive work request (struct ibv_recv_wr), as `QueuePair.postRecv` takes it. */
export interface RecvWr {
  /** Id returned in the work completion (as a bigint). */
  wrId: bigint | number;
  /** Buffers an incoming SEND is scattered into, in order. */
  sgList: Sge[];
}

export interface QpAttrs {
  qpAccessFlags: number;
  minRnrTimer: number;
  timeout: number;
  retryCnt: number;
  rnrRetry: number;
  destQpNum: number;
  destNode: number;
  /** The PSN the responder expects first (RTR) and the requester sends first (RTS). */
  rqPsn: number;
  sqPsn: number;
  /** UD: the QP's Q_Key (set at INIT). */
  qkey?: number;
}

export interface QpCore {
  readonly qpNum: number;
  readonly qpType: QpType;
  readonly device: Device;
  readonly pd: ProtectionDomain;
  readonly sendCq: CompletionQueue;
  readonly recvCq: CompletionQueue;
  readonly sqSigAll: boolean;
  readonly attr: QpAttrs;
  readonly sq: SendRing<SendWr>;
  readonly rq: RecvRing<RecvWr>;
  readonly completer: Completer;
  readonly state: QpState;
  readonly destroyed: boolean;
  /**
   * Where the peer may land bytes under a key without REMOTE_WRITE: this QP's READ and atomic
   * sinks while they wait for their answer, and the buffers of a receive a SEND has taken.
   */
  readonly landings: Set<Landing>;
  /** Move the QP to ERR (flushing its receives and queued sends); a no-op once in ERR. */
  toError(): void;
}

/** A span of this QP's memory the peer's bytes are expected in, under `key`. */
export interface Landing {
  key: number;
  addr: bigint;
  end: bigint;
}

/** Expect the peer's bytes in `sges` (a READ's sinks, a taken receive); the returned function ends it. */
export function expectLanding(qp: QpCore, sges: ReadonlyArray<{ addr: bigint; length: number; lkey: number }>): () => void {
  const spans = sges.map((s) => ({ key: s.lkey, addr: s.addr, end: s.addr + BigInt(s.length) }));
  for (const l of spans) qp.landings.add(l);
  return () => {
    for (const l of spans) qp.landings.delete(l);
  };
}

/** Whether [va, va+length) under `key` lies in a span this QP expects the peer's bytes in. */
export function expectsLanding(qp: QpCore, key: number, va: bigint, length: number): boolean {
  for (const l of qp.landings) if (l.key === key && va >= l.addr && va + BigInt(length) <= l.end) return true;
  return false;
}

export interface LocalSge extends Sge {
  mr: MemoryRegion;
  region: Region;
  offset: number;
}

/**
 * Check SGEs against this QP's own MRs (its device's keys, its PD, LOCAL_WRITE if the bytes
 * land there) and map their regions into the PD's stream; undefined if any fails.
 */
export function localSges(qp: QpCore, sges: Sge[], write: boolean): LocalSge[] | undefined {
  const out: LocalSge[] = [];
  for (const sge of sges) {
    const mr = qp.device.tables.mr(sge.lkey) as MemoryRegion | undefined;
    if (!mr || mr.closed || mr.pd !== qp.pd || (write && !(mr.access & Access.LOCAL_WRITE))) return undefined;
    const at = mr.resolve(sge.addr, sge.length);
    if (!at) return undefined;
    qp.pd.mapFor(mr, at.region);
    prefaultIfAsked(mr, at.region, at.offset, sge.length);
    // Named fields, not spreads: this runs for every WR, and a spread of two shapes is slow.
    out.push({ addr: sge.addr, length: sge.length, lkey: sge.lkey, mr, region: at.region, offset: at.offset });
  }
  return out;
}

export function offsetOf(sges: { length: number }[], i: number): number {
  let o = 0;
  for (let k = 0; k < i; k++) o += sges[k]!.length;
  return o;
}
