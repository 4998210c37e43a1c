// The layout of the pagefault-rdma family's two messages, in one place: PFR_CMD_FAULT
// (kernel → process: a fault to resolve, with the context it carries) and PFR_CMD_RESOLVED
// (process → kernel: the answer). The SMMU driver, the fault library and the tests all
// encode and decode through these, never attribute by attribute by hand.
import { IommuPageResponseCode } from '../smmu-driver/iopf.js';
import { NlAttr, NlCmd, type NlMessage } from './netlink.js';

/** A message's attributes, by NlAttr. */
export type NlAttrs = Map<NlAttr, number | bigint | string | boolean>;

/** How the library made pages resident (a cost-model input): touch, gup, uffd or none. */
export type ResolveMethod = 'touch' | 'gup' | 'uffd' | 'none';

/** PFR_CMD_FAULT: one fault, with the context the engine gave it (transfer, block, side). */
export interface FaultNotice {
  /** The process the fault belongs to. */
  pid: number;
  /** The faulting virtual address. */
  va: bigint;
  /** Bytes of the transfer from `va` on (the Touch-Ahead hint). */
  length: number;
  /** True for a write access (the destination side). */
  write: boolean;
  /** Node whose SMMU took the fault. */
  node: number;
  /** Engine channel of the transfer. */
  channel: number;
  /** Transfer id on the posting node. */
  transfer: number;
  /** Node that posted the transfer. */
  srcNode: number;
  /** Block number in the transfer. */
  block: number;
  /** Which side of the transfer faulted. */
  side: 'source' | 'destination';
  /** SMMU stream id of the faulting access. */
  sid: number;
  /** The SMMU event (EvtId). */
  event: number;
  /** True if the access is stalled (stall mode). */
  stall: boolean;
  /** The record's STAG: a stalled access's tag, or the grpid naming a terminated fault's context. */
  stag: number;
  /** The fault's timeline so far, for the library's statistics: modelled µs and real ms. */
  issuedUs: number;
  /** Real ms (performance.now()) the faulting block was issued. */
  issuedMs: number;
  /** Modelled µs the fault was detected. */
  detectedUs: number;
  /** Real ms the fault was detected. */
  detectedMs: number;
  /** Modelled µs the notice was sent. */
  notifyUs: number;
}

/**
 * The ACK of a RESOLVED sent with NLM_F_ACK: the kernel sends it once the answer has been
 * acted on, with when it reached the engine and, for a terminated fault, when the block
 * went out again (the statistics of the last two phases).
 */
export interface ResolvedAck {
  /** Netlink sequence number of the RESOLVED this acknowledges. */
  seq: number;
  /** Modelled µs the answer reached the engine. */
  resolvedUs: number;
  /** Modelled µs the block went out again (terminated faults). */
  retransmitUs?: number;
  /** Real ms the block went out again. */
  retransmitMs?: number;
}

/** PFR_CMD_RESOLVED: the answer to a fault (STALL and STAG only for a stalled access). */
export interface ResolvedAnswer {
  /** SMMU stream id the answer is for. */
  sid: number;
  /** The faulting virtual address. */
  va: bigint;
  /** The page response: SUCCESS (retry), INVALID or FAILURE. */
  status: IommuPageResponseCode;
  /** Bytes made resident. */
  length: number;
  /** How the pages were made resident. */
  method: ResolveMethod;
  /** True if the access is stalled (answered with CMD_RESUME). */
  stall: boolean;
  /** The stalled access's tag, or the terminated fault's grpid. */
  stag: number;
  /** Pages a page store supplied (remote paging): the fault was a major one. */
  fetched?: number;
}

/** A PFR_CMD_FAULT message's attributes. */
export function encodeFault(n: FaultNotice): NlAttrs {
  return new Map<NlAttr, number | bigint | string | boolean>([
    [NlAttr.PID, n.pid],
    [NlAttr.VA, n.va],
    [NlAttr.LENGTH, n.length],
    [NlAttr.WRITE, n.write],
    [NlAttr.NODE, n.node],
    [NlAttr.CHANNEL, n.channel],
    [NlAttr.TRANSFER, n.transfer],
    [NlAttr.SRC_NODE, n.srcNode],
    [NlAttr.BLOCK, n.block],
    [NlAttr.SIDE, n.side],
    [NlAttr.SID, n.sid],
    [NlAttr.EVENT, n.event],
    [NlAttr.STALL, n.stall],
    [NlAttr.STAG, n.stag],
    [NlAttr.ISSUED_US, n.issuedUs],
    [NlAttr.ISSUED_MS, n.issuedMs],
    [NlAttr.DETECTED_US, n.detectedUs],
    [NlAttr.DETECTED_MS, n.detectedMs],
    [NlAttr.NOTIFY_US, n.notifyUs],
  ]);
}

/** The notice a FAULT message carries, or undefined for any other message. */
export function decodeFault(m: NlMessage): FaultNotice | undefined {
  if (m.cmd !== NlCmd.FAULT) return undefined;
  const a = m.attrs;
  const va = a.get(NlAttr.VA);
  if (typeof va !== 'bigint') return undefined;
  return {
    pid: Number(a.get(NlAttr.PID)),
    va,
    length: Number(a.get(NlAttr.LENGTH) ?? 0),
    write: a.get(NlAttr.WRITE) === true,
    node: Number(a.get(NlAttr.NODE)),
    channel: Number(a.get(NlAttr.CHANNEL)),
    transfer: Number(a.get(NlAttr.TRANSFER)),
    srcNode: Number(a.get(NlAttr.SRC_NODE)),
    block: Number(a.get(NlAttr.BLOCK)),
    side: a.get(NlAttr.SIDE) === 'source' ? 'source' : 'destination',
    sid: Number(a.get(NlAttr.SID)),
    event: Number(a.get(NlAttr.EVENT)),
    stall: a.get(NlAttr.STALL) === true,
    stag: Number(a.get(NlAttr.STAG) ?? 0),
    issuedUs: Number(a.get(NlAttr.ISSUED_US) ?? 0),
    issuedMs: Number(a.get(NlAttr.ISSUED_MS) ?? 0),
    detectedUs: Number(a.get(NlAttr.DETECTED_US) ?? 0),
    detectedMs: Number(a.get(NlAttr.DETECTED_MS) ?? 0),
    notifyUs: Number(a.get(NlAttr.NOTIFY_US) ?? 0),
  };
}

/** The attributes of a RESOLVED's ACK. */
export function encodeResolvedAck(a: Omit<ResolvedAck, 'seq'>): NlAttrs {
  const attrs: NlAttrs = new Map([[NlAttr.RESOLVED_US, a.resolvedUs]]);
  if (a.retransmitUs !== undefined) attrs.set(NlAttr.RETRANSMIT_US, a.retransmitUs);
  if (a.retransmitMs !== undefined) attrs.set(NlAttr.RETRANSMIT_MS, a.retransmitMs);
  return attrs;
}

/** The ACK of a RESOLVED, or undefined for any other message. */
export function decodeResolvedAck(m: NlMessage): ResolvedAck | undefined {
  if (m.cmd !== NlCmd.ACK || !m.attrs.has(NlAttr.RESOLVED_US)) return undefined;
  const a = m.attrs;
  const out: ResolvedAck = { seq: m.seq, resolvedUs: Number(a.get(NlAttr.RESOLVED_US)) };
  if (a.has(NlAttr.RETRANSMIT_US)) out.retransmitUs = Number(a.get(NlAttr.RETRANSMIT_US));
  if (a.has(NlAttr.RETRANSMIT_MS)) out.retransmitMs = Number(a.get(NlAttr.RETRANSMIT_MS));
  return out;
}

/** A PFR_CMD_RESOLVED message's attributes. */
export function encodeResolved(r: ResolvedAnswer): NlAttrs {
  const attrs = new Map<NlAttr, number | bigint | string | boolean>([
    [NlAttr.SID, r.sid],
    [NlAttr.VA, r.va],
    [NlAttr.STATUS, r.status],
    [NlAttr.LENGTH, r.length],
    [NlAttr.METHOD, r.method],
  ]);
  if (r.stall) {
    attrs.set(NlAttr.STALL, true);
    attrs.set(NlAttr.STAG, r.stag);
  }
  if (r.fetched) attrs.set(NlAttr.FETCHED, r.fetched);
  return attrs;
}

/** The answer a RESOLVED message carries, or undefined for any other (or a malformed) message. */
export function decodeResolved(m: NlMessage): ResolvedAnswer | undefined {
  if (m.cmd !== NlCmd.RESOLVED) return undefined;
  const a = m.attrs;
  const va = a.get(NlAttr.VA);
  if (typeof va !== 'bigint') return undefined;
  const stall = a.get(NlAttr.STALL) === true;
  return {
    sid: Number(a.get(NlAttr.SID) ?? -1),
    va,
    status: Number(a.get(NlAttr.STATUS) ?? IommuPageResponseCode.SUCCESS) as IommuPageResponseCode,
    length: Number(a.get(NlAttr.LENGTH) ?? 0),
    method: String(a.get(NlAttr.METHOD) ?? 'touch') as ResolveMethod,
    stall,
    stag: stall ? Number(a.get(NlAttr.STAG) ?? 0) : 0,
    fetched: Number(a.get(NlAttr.FETCHED) ?? 0),
  };
}
