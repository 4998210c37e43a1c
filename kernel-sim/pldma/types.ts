// The PLDMA's vocabulary: descriptors, statuses, completions, counters, the fault context a
// fault carries, and the state one node's requester and completer share.
import type { CostModel } from '../cost-model/index.js';
import type { ModelResource } from '../cost-model/index.js';
import type { MemoryLike } from '../memory.js';
import type { Scheduler } from '../scheduler/scheduler.js';
import type { Smmu, StallWindow, Translation } from '../smmu/smmu.js';
import type { TraceKind, Tracer } from '../trace.js';
import type { Transport } from '../fabric/transport.js';
import type { Payload, RcOp } from '../fabric/packets.js';

/**
 * Blocks one write packet (and one copy-engine job) may carry: 4 MiB of 4 KiB blocks, so the
 * fixed cost of a packet, its copy-thread hand-off and its answer is paid once per 4 MiB of
 * resident memory, not once per 256 KiB. The modelled time is still planned per block.
 */
export const MAX_RUN_BLOCKS = 1024;

/**
 * Runs of one transfer on the wire at once. Two: the JavaScript of run k+1 (its source and
 * destination translations, its packet) then runs while the copy threads move run k, and the
 * answer of run k is read while run k+1 is copied; a third would only queue behind them (the
 * copy engine's threads are already busy with one run). Only full-size runs are pipelined:
 * after a fault or a returned block a transfer goes one run at a time again.
 */
export const RUNS_IN_FLIGHT = 2;

/** Completion status of a DMA transfer. */
export enum DmaStatus {
  /** Every block was written and acknowledged. */
  SUCCESS = 0,
  /** Source VA in no region of the protection domain (F_ADDR_SIZE at the source SMMU). */
  SRC_ADDR_ERR = 1,
  /** Source region not readable (F_PERMISSION). */
  SRC_PERM_ERR = 2,
  /** Destination VA in no region of the protection domain. */
  DST_ADDR_ERR = 3,
  /** Destination region not writable (e.g. read-only memory). */
  DST_PERM_ERR = 4,
  /** No stream for this protection domain (at the source or the destination). */
  PD_ERR = 5,
  /** The destination node does not exist on the transport. */
  BAD_NODE = 6,
  /** The channel number is out of range. */
  BAD_CHANNEL = 7,
  /** The length is not a positive integer. */
  BAD_LENGTH = 8,
  /** The fault library answered that it could not resolve the fault. */
  FAULT_UNRESOLVED = 9,
  /** A block faulted more times than the retry limit allows. */
  RETRY_EXCEEDED = 10,
  /** A stalled access was ended by CMD_RESUME ABORT/TERM or CMD_STALL_TERM. */
  ABORTED = 11,
  /** The engine was closed (or the channel flushed) before the transfer completed. */
  FLUSHED = 12,
  /** The destination dropped the packets (no such QP, not the connected one, a PSN out of sequence): RC's transport retries run out. */
  DROPPED = 13,
  /** The destination's responder found the request invalid (a SEND longer than the receive). */
  REM_INV_REQ = 14,
  /** The destination's responder could not carry it out (a receive buffer in no MR). */
  REM_OP = 15,
}

/** The side of a transfer: the source (read) or the destination (write). */
export type Side = 'source' | 'destination';

/** A DMA transfer to post (`SimNode.post`): from a source VA on this node to a destination VA on another. */
export interface DmaDescriptor {
  /** Virtual channel, 0 … channels-1. */
  channel: number;
  /** Source virtual address (in the posting process's memory on this node). */
  srcVa: bigint;
  /** Destination node. */
  dstNode: number;
  /** Destination virtual address. */
  dstVa: bigint;
  /** Bytes to move. */
  length: number;
  /** Protection domain of the posting process: its stream translates the source. */
  pd: number;
  /** Protection domain whose stream translates the destination (default: `pd`, as ExaNet's PDID). */
  dstPd?: number;
  /**
   * Retransmissions allowed per block after destination faults (NACKs, like InfiniBand's
   * rnr_retry; default: the engine's retryLimit; Infinity: no limit). Source faults are the
   * engine's own and always use the engine's retryLimit.
   */
  retryLimit?: number;
  /** Ask for a completion notification at the destination too (ExaNet notif_enable). */
  notify?: boolean;
  /**
   * The memory key and QP number the destination's admission check (SimNode.admit) is asked
   * about on every block: a key or QP revoked mid-transfer stops the next block (DST_PERM_ERR).
   */
  key?: number;
  /** The destination QP the write is for. */
  dstQp?: number;
  /** The QP on this node that posted the transfer: `SimNode.cancel(srcQp)` ends it (its QP destroyed). */
  srcQp?: number;
  /**
   * An RC message (with dstQp and srcQp): its opcode, PSN and immediate data, carried in every
   * packet; the destination's responder checks them against its own QP and MR tables. A SEND
   * names no destination address (`dstVa` is ignored): the receive WQE its first packet takes
   * says where its bytes go. An RC message may be empty (length 0): one packet, no bytes.
   */
  opcode?: RcOp;
  /** The message's PSN (24 bits). */
  psn?: number;
  /** ImmDt of a SEND or WRITE with immediate. */
  immData?: number;
  /** BTH SE: a solicited event where the receive completes (SendFlags.SOLICITED of a SEND or WRITE with immediate). */
  solicited?: boolean;
  /** DETH Q_Key of a UD SEND. */
  qkey?: number;
  /** XRCETH: the XRC SRQ number at the target. */
  srqn?: number;
  /** READ request: RETH's DMA length. */
  dmaLength?: number;
  /** READ request, ATOMIC: where the answer lands at the requester. */
  sinks?: Array<{
    /** Start address. */
    addr: bigint;
    /** Bytes. */
    length: number;
    /** The requester's lkey. */
    lkey: number;
  }>;
  /**
   * READ request, ATOMIC: RC's local ACK timeout. Once the request is on the wire, a period of
   * `periodMs` in which nothing of its response came counts one retry; after `retries` + 1
   * such periods in a row the request ends RETRY_EXCEEDED (the verbs' RETRY_EXC_ERR).
   */
  responseTimeout?: {
    /** One period (ms): IB's 4.096 µs × 2^timeout, floored as the verbs layer documents. */
    periodMs: number;
    /** retry_cnt. */
    retries: number;
  };
  /** ATOMIC: AtomicETH. */
  atomic?: {
    /** Fetch-and-add (else compare-and-swap). */
    fetchAdd: boolean;
    /** The value added, or compared with. */
    compareAdd: bigint;
    /** Compare-and-swap: the value written when the comparison matches. */
    swap: bigint;
  };
  /** A response (READ_RESPONSE, ATOMIC_ACK): faults the responder took before posting it (an atomic's word), reported with its packets. */
  srcFaults?: number;
  /** FLUSH: FETH's placement type bits and selectivity level (the range is `dstVa` and `dmaLength`). */
  flush?: {
    /** ibv_placement_type bits. */
    type: number;
    /** ibv_selectivity_level. */
    level: number;
  };
  /** A message of several transfers (one per SGE). */
  message?: {
    /** This transfer's byte offset in the message. */
    offset: number;
    /** The message's bytes. */
    length: number;
  };
}

/** Faults by side. */
export interface FaultCounts {
  /** Faults at the source. */
  source: number;
  /** Faults at the destination. */
  destination: number;
}

/** How a transfer ended. */
export interface DmaCompletion {
  /** Transfer id on the posting node. */
  tid: number;
  /** How it ended. */
  status: DmaStatus;
  /** DmaStatus name of `status`. */
  statusName: string;
  /** Human-readable reason for an error status. */
  reason?: string;
  /** Which side the error status comes from (absent on success and for local errors of the post itself). */
  side?: Side;
  /** The descriptor posted. */
  descriptor: DmaDescriptor;
  /** Bytes moved. */
  bytes: number;
  /** Blocks of the transfer. */
  blocks: number;
  /** Faults taken, by side. */
  faults: FaultCounts;
  /** Blocks sent again after a fault (terminate) or accesses retried (stall). */
  retransmittedBlocks: number;
  /** NACKs received from the destination. */
  nacks: number;
  /** Pages a page store supplied while this transfer's faults were resolved: remote paging's major faults. */
  pagesFetched: number;
  /** Modelled: start, end and duration (µs), and the label that says it is modelled. */
  model: {
    /** Modelled start, µs. */
    startUs: number;
    /** Modelled end, µs. */
    endUs: number;
    /** Modelled duration, µs. */
    us: number;
    /** MODEL_LABEL. */
    label: string;
  };
  /** Measured: whole transfer, and each fault from detection to the retransmission. */
  real: {
    /** Measured duration of the whole transfer, µs. */
    us: number;
    /** Each fault, from detection to the retransmission, µs. */
    faultUs: number[];
  };
}

/**
 * The context a fault carries from the engine through the SMMU's event record (its STAG,
 * the grpid of a page request) to the driver and the fault library: which transfer, which
 * block, which side. The driver never asks the engine.
 */
export interface FaultInfo {
  /** Node whose SMMU took the fault. */
  node: number;
  /** SMMU stream id of the access. */
  sid: number;
  /** Side of the transfer. */
  side: Side;
  /** Node that posted the transfer and its transfer id. */
  srcNode: number;
  /** Transfer id on the posting node. */
  tid: number;
  /** Engine channel. */
  channel: number;
  /** Block number. */
  seq: number;
  /** Faulting virtual address. */
  va: bigint;
  /** True for a write (the destination side). */
  write: boolean;
  /** Bytes of the transfer from the faulting address on (the Touch-Ahead hint). */
  lengthHint: number;
  /** Modelled time of detection, µs, and the real one (performance.now() ms). */
  modelUs: number;
  /** Real ms (performance.now()) the fault was detected. */
  detectedMs: number;
  /** When the faulting block was issued (modelled µs, real performance.now() ms). */
  issuedUs: number;
  /** Real ms the faulting block was issued. */
  issuedMs: number;
  /** Stall mode: the stalled access's tag and window. */
  stall?: {
    /** The stall tag CMD_RESUME echoes. */
    stag: number;
    /** The stalled access. */
    window: StallWindow;
  };
}

/** Options of one node's engine. */
export interface PldmaOptions {
  /** The node the engine belongs to. */
  node: number;
  /** Virtual channels (the real engine had 1024). */
  channels?: number;
  /** Block size in bytes (a multiple of the page size). */
  blockSize?: number;
  /** Times one block may be retransmitted after faults; Infinity for no limit. */
  retryLimit?: number;
  /** A parked transfer that hears nothing for this long retries on its own (ms). */
  faultTimeoutMs?: number;
  /** Blocks in flight at once on the engine. */
  engineSlots?: number;
}

/** Counters of one engine. */
export interface PldmaCounters {
  /** Transfers posted. */
  posted: number;
  /** Transfers completed successfully. */
  completed: number;
  /** Transfers that ended with an error. */
  errors: number;
  /** Blocks issued (first sends and retransmissions). */
  blocksIssued: number;
  /** Blocks acknowledged. */
  blocksAcked: number;
  /** Blocks sent again after a fault. */
  retransmittedBlocks: number;
  /** Faults by side. */
  faults: FaultCounts;
  /** NACKs this engine sent as a destination. */
  nacksSent: number;
  /** NACKs this engine received as a source. */
  nacksReceived: number;
  /** Answers (ACKs) a peer sent for no run of this engine's on the wire: refused. */
  answersRefused: number;
  /** Packets of this engine's the transport's checks refused before they left (each ended its transfer with an error). */
  packetsRefused: number;
  /** Faults whose answer did not come within faultTimeoutMs. */
  retryTimeouts: number;
}

/**
 * State of its own for a block that needs it (one that faulted); the others are counted by the
 * transfer's cursors. This type and the engine state below are kept off the public surface by
 * kernel-sim/index.ts's export list, not by an internal tag: requester.d.ts and completer.d.ts import them.
 */
export interface BlockState {
  attempts: number;
  /** Faults taken by this block at each side (bounded by the retry limits). */
  srcFaults: number;
  dstNacks: number;
}

/**
 * A run on the wire, as its answer needs it: the engine cost of each block
 * (modelled; reserved when the answer comes back, in order) and its source translation.
 */
export interface SentRun {
  seq: number;
  count: number;
  costs: Float64Array;
  issuedUs: Float64Array;
  issuedMs: number;
  sid: number;
  region: MemoryLike;
  offset: number;
  window: StallWindow | undefined;
  /** What the run's packet carries: revoked when the transfer is cancelled. */
  payload: PayloadView;
}

/**
 * In one process a write's payload is a view of the source's memory, read when the
 * destination copies it. The source revokes it when it cancels the transfer (its QP was
 * destroyed): a destination never starts a copy from a revoked view. A transport between
 * processes reads the bytes when the packet is sent; there is nothing to revoke then.
 */
export interface PayloadView extends Payload {
  revoked: boolean;
}

/** @internal The memory of an empty message's payload: no bytes, never read. */
export const NO_MEMORY: MemoryLike = {
  id: -1,
  address: 0n,
  size: 0,
  pageSize: 4096,
  closed: false,
  granule: 4096,
  observe() {},
  unobserve() {},
};

/** @internal Whether a write's payload was revoked by its source (see PayloadView). */
export function revoked(p: Payload): boolean {
  return (p as Partial<PayloadView>).revoked === true;
}

/** One DMA transfer in flight: its descriptor, cursors and the blocks that need state of their own. */
export interface Transfer {
  tid: number;
  desc: DmaDescriptor;
  /** Blocks of the transfer (blockSize bytes, the last one shorter). */
  blocks: number;
  /** First block not on the wire, parked or held: the next run starts here. */
  cursor: number;
  acked: number;
  ackedBytes: number;
  /** Blocks on the wire (and a held block). */
  inflight: number;
  /** Runs on the wire, in the order they were sent (their answers come back in that order). */
  runs: SentRun[];
  /** Where the runs on the wire end in the plan (modelled µs): the next run is planned from there. */
  plan: { cursor: number; engine: number; link: number };
  /** Per-block state, only for the blocks that need their own (a fault). */
  own: Map<number, BlockState>;
  parked: boolean;
  /** The block parked on a fault (one at a time: a run stops at its first), or -1. */
  parkedSeq: number;
  parkTimer: NodeJS.Timeout | undefined;
  faults: FaultCounts;
  retransmitted: number;
  pagesFetched: number;
  nacks: number;
  modelStart: number;
  modelReady: number; // earliest modelled time the next block may issue
  modelEnd: number;
  realStart: number;
  faultStarted: number[]; // real µs at detection, per unresolved fault
  faultUs: number[];
  resolve: (c: DmaCompletion) => void;
  done: boolean;
  /** An error that ends the transfer once the blocks already in flight have landed. */
  failing: { status: DmaStatus; reason: string; side: Side | undefined } | undefined;
  /**
   * A block whose source faulted while runs were on the wire: its fault counts only if they
   * all land whole (a block before it that faults first stops the transfer before it).
   */
  held: { seq: number; sid: number; tr: Extract<Translation, { ok: false }>; cost: number; issuedUs: number; issuedMs: number } | undefined;
  /** Blocks the next run may carry: 2 after a destination fault, doubling while runs land whole (up to MAX_RUN_BLOCKS). */
  runLimit: number;
  /** A READ or an atomic request: what of its response has landed (set at post). */
  answer?: Awaited;
}

/**
 * What of a READ's or an atomic's response has landed at the requester, in the order of its
 * sinks. The response is the request's acknowledgement (RC's READ response, ATOMIC ACKNOWLEDGE):
 * the request completes once every byte of its sinks has landed, and after a fault at a sink it
 * goes again for the rest only (the same PSN, RETH and sinks moved on by what landed).
 */
export interface Awaited {
  /** Bytes landed, from the first sink on. */
  landed: number;
  /** The sink the next bytes land in, and its bytes landed. */
  sink: number;
  within: number;
  /** `landed` at the last fault at a sink: its retry count starts again once bytes land past it. */
  faultedAt: number;
  /** Source faults each of the responder's transfers reported (by its transfer id: each counts its own so far). */
  srcFaults: Map<number, number>;
  /** The block of the responder's transfer whose sink fault sends the request again (its fault's statistics end then). */
  refault: { node: number; tid: number; seq: number } | undefined;
  /** Something of the response came since the response timer last looked. */
  heard?: boolean;
  /** The response timer (descriptor's responseTimeout), and the periods in a row it heard nothing. */
  timer?: NodeJS.Timeout | undefined;
  misses?: number;
}

/** The key of a READ or atomic request in EngineState.requests: its QP and PSN, as its response names them. */
export function requestKey(qp: number, psn: number): number {
  return qp * 2 ** 24 + psn;
}

/**
 * The responses one QP of this node sent: their runs are done when sent, so a QP destroyed
 * revokes their payloads through this (a view of this node's memory that the requester's copy
 * may still read) and fences the requesters' copies of them.
 */
export interface AnswerToken {
  revoked: boolean;
  /** The requesters' nodes and QPs the responses went to, by node × 2^24 + QP. */
  peers: Map<number, { node: number; qp: number }>;
}

/** One virtual channel: its queue of transfers and the modelled time it may issue next. */
export interface Channel {
  id: number;
  queue: Transfer[];
  cursor: number; // modelled time the channel may issue its next block
}

/** What one node's requester, completer and fault unit share: its own state only. */
export interface EngineState {
  readonly node: number;
  readonly channels: number;
  readonly blockSize: number;
  readonly retryLimit: number;
  readonly faultTimeoutMs: number;
  readonly smmu: Smmu;
  readonly transport: Transport;
  readonly costs: CostModel;
  readonly tracer: Tracer;
  readonly clock: { now: number };
  readonly engineRes: ModelResource;
  readonly chans: Map<number, Channel>;
  readonly transfers: Map<number, Transfer>;
  /** READ and atomic requests waiting for their responses, by requestKey(QP, PSN). */
  readonly requests: Map<number, Transfer>;
  /** Per QP of this node, what revokes the responses it sent. */
  readonly answers: Map<number, AnswerToken>;
  readonly counters: PldmaCounters;
  /** A hardware preset's say in the fault path (none: the PLDMA's own terminate/NACK timing). */
  readonly faultHook?: FaultHook;
  scheduler: Scheduler;
  closed: boolean;
}

/** Modelled cost of one translation: an IOTLB hit (nothing walked), or a walk per page walked. */
export function walkCost(costs: CostModel, tr: Translation): number {
  return tr.ok ? walkedCost(costs, tr.walked) : costs.walkUs;
}

/** walkCost of a block that translated with `walked` pages walked (0: an IOTLB hit), as translateBlocks reports it. */
export function walkedCost(costs: CostModel, walked: number): number {
  return walked === 0 ? costs.iotlbHitUs : costs.walkUs * walked;
}

/** Modelled delay of a stalled access: the whole fault path and the resume. */
export function stallDelay(c: CostModel): number {
  return c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + c.touchPageUs + c.requestUs + c.resumeUs;
}

/** Emit a trace event about a transfer (only when someone listens). */
export function traceTransfer(
  tracer: Tracer,
  kind: TraceKind,
  node: number,
  tid: number,
  channel: number,
  e: { side?: Side; modelUs: number; detail?: Record<string, unknown> },
): void {
  if (!tracer.active) return;
  const ev: Parameters<Tracer['emit']>[0] = { kind, node, tid, channel, modelUs: e.modelUs };
  if (e.side) ev.side = e.side;
  if (e.detail) ev.detail = e.detail;
  tracer.emit(ev);
}

/**
 * The narrow hook a hardware preset has in the fault path: when a destination fault is
 * answered, when (modelled) the source sends the block again. `nakAtUs`: when a NAK sent at the
 * fault would reach the source; `readyAtUs`: when the fault was served at the destination.
 */
export interface FaultHook {
  receiveFault(nakAtUs: number, readyAtUs: number, linkUs: number): number;
}
