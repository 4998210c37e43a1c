// What one node's RC transport knows of its own PDs, MRs, SRQs and QPs (rdma_rxe's rxe_pool
// objects as rxe_resp reads them): plain device records in the node's tables, entered by the
// control path (ibv_alloc_pd, ibv_reg_mr, ibv_create_srq, ibv_create_qp's commands) and removed
// at their destruction, and what the responder's checks (responder.ts) and answers say. The
// engine reads only these: it never asks the provider whether a packet may land.
//
// The API (what a device in another process builds from its tables and memfd rings alone):
//
//   const t = node.tables;                                   // an RcTables
//   const pd: RcPd = { handle, closed: false };              // ibv_alloc_pd; closed = true at dealloc
//   const mr = mrRecord({ key, pd, access, region, offset, length });
//     region  any MemoryLike (a local Region, a ForeignRegion over another process's memory),
//             already mapped in the PD's SMMU stream (SimNode.map); ODP: the engine faults on
//             its pages, pinned: resident. Implicit ODP: { space } instead of region/offset.
//   t.mrs.set(key, mr);  ...  mrFree(mr); t.mrs.delete(key); // ibv_dereg_mr
//   const srq: RcSrq = { handle, pd, ring: new RecvRing(maxWr, maxSge, QueueKind.SRQ, handle),
//                        limit, xrcd, cq, destroyed: false }; t.srqs.set(handle, srq);
//   t.qps.set(qpn, new RcQueuePair({ ... }));                // see qp.ts
//   t.events = (e: RcEvent) => ...;                          // SRQ limit, a QP's own ERR
import type { CompletionRing } from '../device/cq-ring.js';
import type { RecvRing } from '../device/recv-ring.js';
import { RcOp } from '../fabric/packets.js';
import type { MemoryLike, MemoryObserver } from '../memory.js';
import type { FaultCounts } from '../pldma/types.js';

export { RcOp };

/**
 * A protection domain's record (rxe_pd): its handle (its SMMU stream's PD) and whether it is
 * gone. Entered by the control path at ibv_alloc_pd, marked closed at ibv_dealloc_pd.
 */
export interface RcPd {
  /** The PD's handle. */
  readonly handle: number;
  /** True once the PD was deallocated. */
  closed: boolean;
}

/** Where a range of an MR lies: a region of the process's memory and the offset in it. */
export interface RcPlaceAt {
  /** The region. */
  region: MemoryLike;
  /** Byte offset of the range in it. */
  offset: number;
}

/** rxe_mr's state: VALID from registration, FREE once deregistered (no key reaches it). */
export enum MrState {
  /** Registered: its keys reach it. */
  VALID = 1,
  /** Deregistered: no key reaches it. */
  FREE = 2,
}

/**
 * An implicit ODP MR's reach (address 0, length SIZE_MAX): the memory of its process, as the
 * kernel's implicit ODP walks the process's mm. `find` returns the region that holds a range,
 * its mapping into the MR's PD stream made (the engine faults on its pages); undefined if no
 * region of the process holds it. The only part of an MR record that is not plain data.
 */
export interface RcAddressSpace {
  /** `map`: map the region into the MR's PD stream (a check alone maps nothing). */
  find(addr: bigint, length: number, map: boolean): RcPlaceAt | undefined;
}

/**
 * An MR's record in its node's tables (rxe_mr as rxe_pool keeps it): plain data, entered by
 * the control path at ibv_reg_mr (its region already mapped in its PD's SMMU stream: ODP, the
 * engine faults on its pages; pinned, resident) and set FREE at ibv_dereg_mr. The responder's
 * rkey and lkey checks read nothing else. Construct one with `mrRecord`.
 */
export interface RcMr {
  /** Local key (equal to the remote key here). */
  readonly lkey: number;
  /** Remote key. */
  readonly rkey: number;
  /** The MR's protection domain (its handle is its SMMU stream's PD). */
  pd: RcPd;
  /** ibv_access_flags. */
  access: number;
  /** First address (implicit: 0). */
  readonly iova: bigint;
  /** Bytes (implicit: SIZE_MAX). */
  readonly length: number;
  /** The region the MR lies in (undefined for an implicit MR). */
  readonly region: MemoryLike | undefined;
  /** The MR's byte offset in its region. */
  readonly offset: number;
  /** An implicit MR's reach (see RcAddressSpace). */
  readonly space: RcAddressSpace | undefined;
  /** The 'prefault' baseline: the range a packet lands in is made resident first. */
  prefault: boolean;
  /** VALID or FREE. */
  state: MrState;
  /** Set when its region was unmapped (the record watches it: the data path reads only this). */
  regionGone: boolean;
  /** @internal What watches the region (undone by mrFree). */
  readonly watch: MemoryObserver | undefined;
}

/** An MR record over [offset, offset+length) of `region` (or an implicit one over `space`). */
export function mrRecord(a: {
  key: number;
  pd: RcPd;
  access: number;
  region?: MemoryLike | undefined;
  offset?: number;
  length: number;
  space?: RcAddressSpace | undefined;
  prefault?: boolean;
}): RcMr {
  const offset = a.offset ?? 0;
  const watch: MemoryObserver | undefined = a.region
    ? {
        regionClosing: () => {
          mr.regionGone = true;
        },
      }
    : undefined;
  const mr: RcMr = {
    lkey: a.key,
    rkey: a.key,
    pd: a.pd,
    access: a.access,
    iova: a.region ? a.region.address + BigInt(offset) : 0n,
    length: a.length,
    region: a.region,
    offset,
    space: a.space,
    prefault: a.prefault ?? false,
    state: MrState.VALID,
    regionGone: a.region?.closed ?? false,
    watch,
  };
  if (watch) a.region!.observe(watch);
  return mr;
}

/** ibv_dereg_mr's end of a record: FREE (no key reaches it from now on), its region no longer watched. */
export function mrFree(mr: RcMr): void {
  if (mr.state === MrState.FREE) return;
  mr.state = MrState.FREE;
  if (mr.watch && !mr.regionGone) mr.region!.unobserve(mr.watch);
}

/** Whether [addr, addr+length) lies inside the MR (nothing mapped or touched). */
export function mrCovers(mr: RcMr, addr: bigint, length: number): boolean {
  return mrPlace(mr, addr, length, false) !== undefined;
}

/**
 * Where [addr, addr+length) of a VALID MR lies (rxe's mr_check_range, then its iova to the
 * region's offset); undefined if it is not all inside the MR or its region is gone. With
 * `touch` (a packet lands there), an implicit MR maps the region it reached and the
 * 'prefault' baseline makes the range resident.
 */
export function mrPlace(mr: RcMr, addr: bigint, length: number, touch = true): RcPlaceAt | undefined {
  if (mr.state !== MrState.VALID) return undefined;
  let at: RcPlaceAt | undefined;
  if (mr.space) at = mr.space.find(addr, length, touch);
  else {
    const r = mr.region!;
    if (addr < mr.iova || addr + BigInt(length) > mr.iova + BigInt(mr.length) || mr.regionGone) return undefined;
    at = { region: r, offset: Number(addr - r.address) };
  }
  if (at && touch && mr.prefault && at.region.populate) {
    const ps = at.region.pageSize;
    const start = at.offset - (at.offset % ps);
    at.region.populate(start, Math.min(at.region.size - start, Math.ceil((length + at.offset - start) / ps) * ps));
  }
  return at;
}

/**
 * A shared receive queue's record (rxe_srq): its ring of receive WQEs (the provider posts
 * into it), its PD, its limit (armed above 0: the first take that leaves fewer WQEs raises
 * SRQ_LIMIT_REACHED on the node's event line and disarms it), and for an XRC SRQ its domain
 * and the CQ its receives complete on. In the node's tables by handle (an XRC SRQ's is its
 * srqn, the number XRCETH names). Entered at ibv_create_srq, destroyed at ibv_destroy_srq.
 */
export interface RcSrq {
  /** Its handle in the node's tables (an XRC SRQ's srqn). */
  readonly handle: number;
  /** Its PD's record: its buffers are checked there, its QPs are of it. */
  readonly pd: RcPd;
  /** The ring (replaced by a bigger one at a resize, its WQEs moved over). */
  ring: RecvRing;
  /** srq_limit: 0 when not armed. */
  limit: number;
  /** XRC: the handle of its XRC domain. */
  readonly xrcd: number | undefined;
  /** XRC: the ring of the CQ its receives complete on. */
  readonly cq: CompletionRing | undefined;
  /** Set at ibv_destroy_srq: nothing is taken from it any more. */
  destroyed: boolean;
}

/** What the node's event line says (the async events, ibv_get_async_event's; a C provider's socket). */
export interface RcEvent {
  /**
   * 'srq-limit': an SRQ's limit was reached (IBV_EVENT_SRQ_LIMIT_REACHED); 'qp-error': the
   * device moved a QP to ERR on its own (a receive's local error, a CQ overrun), its receives
   * flushed.
   */
  type: 'srq-limit' | 'qp-error';
  /** The SRQ's handle, or the QP's number. */
  handle: number;
}

/** The next receive WQE of an SRQ, taken off it for good (the limit event raised if it was reached). */
export function srqTake(t: RcTables, srq: RcSrq): RcRecvWqe | undefined {
  if (srq.destroyed) return undefined;
  const wqe = srq.ring.shift();
  if (wqe && srq.limit > 0 && srq.ring.length < srq.limit) {
    srq.limit = 0;
    t.events?.({ type: 'srq-limit', handle: srq.handle });
  }
  return wqe;
}

/** A receive work request as the responder takes it. */
export interface RcRecvWqe {
  /** The WR's id, for its completion. */
  wrId: bigint | number;
  /** The buffers an incoming SEND is scattered into, in order. */
  sgList: RcSge[];
}

/** What the responder does with a receive queue (a RecvRing: the device's side of its ring). */
export interface RcRecvQueue {
  readonly length: number;
  /** The next receive (the same object until it is consumed), or undefined. */
  head(): RcRecvWqe | undefined;
  /** Consume the head. */
  shift(): RcRecvWqe | undefined;
}

/** A scatter/gather entry of a receive (struct ibv_sge). */
export interface RcSge {
  /** Start address. */
  addr: bigint;
  /** Bytes. */
  length: number;
  /** The lkey of the MR that holds it. */
  lkey: number;
}

/** How a receive ended, as the responder reports it to its QP (which completes it on its CQ). */
export interface RcReceived {
  /** 'ok'; 'prot': a buffer is in no MR of the QP's PD with LOCAL_WRITE; 'len': the message is longer than the buffers. */
  status: 'ok' | 'prot' | 'len';
  /** Which operation consumed it. */
  op: RcOp.SEND | RcOp.SEND_IMM | RcOp.WRITE_IMM | RcOp.UD_SEND | RcOp.UD_SEND_IMM;
  /** Bytes of the message. */
  byteLen: number;
  /** The immediate data of a SEND_WITH_IMM or WRITE_WITH_IMM. */
  immData?: number;
  /** The sender asked for a solicited event (BTH SE). */
  solicited?: boolean;
  /** The QP number of the sender. */
  srcQpn: number;
  /** What the message took at this end (and the source's faults, as the last packet reported them). */
  odp: RcOdp;
}

/** The faults and times of a message, as one end saw them. */
export interface RcOdp {
  /** Faults by side. */
  faults: FaultCounts;
  /** Pages a page store supplied (remote paging's major faults). */
  majorFaults: number;
  /** Blocks sent again after a fault. */
  retransmittedBlocks: number;
  /** Modelled µs, first packet issued to last landed. */
  modelUs: number;
  /** Measured µs, the same span. */
  realUs: number;
}

/**
 * A QP as its node's responder reads it (kernel-sim/rc/qp.ts's RcQueuePair): its attributes,
 * its receive queue (its own ring, an SRQ's, or an XRC target's SRQs by number) and receive
 * CQ, and what the device does with them itself: take a receive, give a UD datagram's back,
 * write the receive's CQE, move the QP to ERR.
 */
export interface RcQp {
  /** The QP's number. */
  readonly qpNum: number;
  /** The QP's protection domain: the MRs it may use, the stream that translates its bytes. */
  readonly pd: RcPd;
  /** In RTR, RTS or SQD and not destroyed: it accepts packets. */
  readonly receiving: boolean;
  /** The node of the connected QP: the only one whose packets it accepts. */
  readonly destNode: number;
  /** The connected QP's number. */
  readonly destQpNum: number;
  /** qp_access_flags: the remote operations it accepts. */
  readonly accessFlags: number;
  /** The RNR NAK timer code it answers with. */
  readonly minRnrTimer: number;
  /**
   * The receive queue, a ring of receive WQEs (kernel-sim/device/recv-ring.ts): its head is
   * taken by a SEND's first packet (kept there until the message completes). Empty for a QP
   * that takes its receives elsewhere.
   */
  readonly rq: RcRecvQueue;
  /** A UD QP's Q_Key (absent for an RC QP): it takes UD SENDs from any QP that names it. */
  readonly qkey?: number | undefined;
  /** An XRC target QP (XRC_RECV): its XRC domain's handle; its messages name an XRC SRQ of it. */
  readonly xrcd?: number | undefined;
  /** True if each receive is taken off its queue for good (an SRQ's, an XRC SRQ's, a UD QP's): the message holds it. */
  readonly takesReceives: boolean;
  /** Take the next receive for good (`srq`: an XRC target's SRQ; else its SRQ, or a UD QP's rq); undefined if none (an RNR NAK). */
  take(t: RcTables, srq?: RcSrq): RcRecvWqe | undefined;
  /** UD: a receive `take` returned whose datagram did not land (a fault: it comes again); flushed if the QP is in ERR. */
  giveBack(wqe: RcRecvWqe): void;
  /** Whether the peer's READ response or atomic result may land in [va, va+length) under `lkey` (this QP's outstanding sinks). */
  expects(lkey: number, va: bigint, length: number): boolean;
  /** A receive ended (its WQE has left `rq`): its CQE written on the receive CQ (an XRC SRQ's, for an XRC target). */
  received(t: RcTables, wqe: RcRecvWqe, r: RcReceived): void;
  /** A receive failed at this end (a bad buffer, too short), or its CQ overran: the QP goes to ERR, its receives flushed. */
  toError(t: RcTables): void;
  /** The responder's own state of this QP (rxe's qp->resp): the PSN it expects, the message in progress. */
  readonly resp: RcRespState;
}

/** What a QP's responder keeps between packets (set up by the QP at RTR, cleared at RESET). */
export interface RcRespState {
  /** The PSN of the next message (rq_psn at RTR; 24 bits). */
  epsn: number;
  /** The message in progress: its PSN, the sender's transfer, the receive WQE it took, what it cost here. */
  msg: RcMessage | undefined;
}

/** A message this QP is receiving. */
export interface RcMessage {
  psn: number;
  tid: number;
  opcode: RcOp;
  /** SEND: the receive WQE its first packet took (still at the head of rq until the message completes). */
  wqe: RcRecvWqe | undefined;
  /** Destination faults (NACKs) this end took for it. */
  faults: number;
  /** When its first packet was issued (modelled µs, performance.now() ms). */
  firstUs: number;
  firstMs: number;
}

/** One node's object tables: its PDs' records live in its MRs and QPs; its MRs by key, its QPs by number, its SRQs by handle. */
export class RcTables {
  /** MRs by key (lkey = rkey). */
  readonly mrs = new Map<number, RcMr>();
  /** QPs by number. */
  readonly qps = new Map<number, RcQp>();
  /** SRQs by handle (an XRC SRQ's is its srqn). */
  readonly srqs = new Map<number, RcSrq>();
  /** The node's event line (async events), if a provider listens. */
  events: ((e: RcEvent) => void) | undefined;
  /**
   * Set once a verbs device drives the node: a packet that names no QP is then accepted only
   * from the node's own engine (an atomic's read into its own buffer), never from a peer.
   */
  strict = false;
}

/** Why the responder refused a packet: the NAK syndrome (AETH) and what it says. */
export interface RcRefusal {
  /** 'drop': a UD datagram silently dropped (the sender's engine is answered as if it landed). */
  nak: 'qp' | 'psn' | 'access' | 'inv-req' | 'op' | 'rnr' | 'drop';
  reason: string;
  /** RNR NAK: the QP's min_rnr_timer code. */
  rnrTimer?: number;
}

/** An RC packet's fields the responder acts on. */
export interface RcPacket {
  src: number;
  qpn: number;
  srcQpn: number | undefined;
  opcode: RcOp;
  psn: number | undefined;
  key: number | undefined;
  tid: number;
  seq: number;
  va: bigint;
  length: number;
  /** Bytes of the transfer from this packet's first on. */
  lengthHint: number;
  /** A message of several transfers (one per SGE): this transfer's offset in it and the message's bytes. */
  msgOffset: number | undefined;
  msgLength: number | undefined;
  /** READ request: the bytes to read from `va`; FLUSH: the bytes to flush. */
  dmaLength: number | undefined;
  /** FLUSH: FETH's placement type bits and selectivity level. */
  flush?: { type: number; level: number } | undefined;
  /** UD SEND: DETH's Q_Key. */
  qkey?: number | undefined;
  /** XRCETH: the XRC SRQ number, in every request of an XRC send QP. */
  srqn?: number | undefined;
  blockSize: number;
  issuedUs: number;
  issuedMs: number;
}

/** A packet admitted: its QP, the message it belongs to, where its bytes land. */
export interface RcAdmitted {
  qp: RcQp;
  msg: RcMessage;
  /** Bytes of the message. */
  total: number;
  /** Destination spans in order, each inside an MR checked for this packet (empty: no bytes). */
  spans: RcPlace['spans'];
  /** The packet ends the message. */
  last: boolean;
  /**
   * A READ or an atomic request under a PSN this QP already took (rxe_resp's duplicate_request):
   * the requester asks again for the rest of a READ, or for an atomic's result (a fault at its
   * sink). A READ is read again; an atomic is answered from the replay, never executed again.
   */
  duplicate?: boolean;
}

/** Where a run of a message lands at this node, once checked. */
export interface RcPlace {
  /** The destination span(s): one for RETH-addressed packets, one per receive buffer for a SEND. */
  spans: Array<{ va: bigint; length: number; key: number }>;
  /** The PD whose stream translates them. */
  pd: number;
  qp: RcQp;
}

/** min_rnr_timer codes in ms (IB spec table; 0 is the longest, 655.36 ms). */
export function rnrTimerMs(code: number): number {
  const table = [
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48,
    30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
  ];
  return table[code & 31]!;
}
