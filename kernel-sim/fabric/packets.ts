// The packets nodes exchange, and nothing else crosses from one node to another. A write
// carries a run of blocks of a transfer with its payload; the responder answers with an ACK
// (the blocks landed), a NACK (a fault: held until the destination's fault library answers, and
// carrying that answer: send the block again then) or an error ACK. Fields follow
// ExaNet's headers: the protection domain, the destination VA, tid and seq, a 4-bit resp.
import type { MemoryLike } from '../memory.js';

/** The RC opcode a write packet carries (BTH.opcode, folded: a run of packets of one message). */
export enum RcOp {
  /** RDMA WRITE: RETH names the destination (rkey, address). */
  WRITE = 1,
  /** RDMA WRITE with immediate: the last packet takes a receive WQE (RNR NAK if none). */
  WRITE_IMM = 2,
  /** SEND: the first packet takes a receive WQE (RNR NAK if none); the bytes go where it says. */
  SEND = 3,
  /** SEND with immediate. */
  SEND_IMM = 4,
  /**
   * RDMA READ response: it lands in the requester's own sinks. It is the READ's acknowledgement
   * (AETH): nothing ACKs it; a fault at the sink makes the requester ask again (see ATOMIC_ACK).
   */
  READ_RESPONSE = 5,
  /** RDMA READ request: RETH names what to read (`va`, `key`, `dmaLength`); no payload. */
  READ_REQUEST = 6,
  /** ATOMIC (compare-and-swap or fetch-and-add): AtomicETH names the 8-byte word and the operands; no payload. */
  ATOMIC = 7,
  /** ATOMIC WRITE: RETH names an 8-byte aligned word, the payload is its 8 new bytes, written as one store. */
  ATOMIC_WRITE = 8,
  /** RDMA FLUSH: RETH names the range (`va`, `key`, `dmaLength`), FETH the placement type and selectivity (`flush`); no payload. */
  FLUSH = 9,
  /**
   * UD SEND: one packet, a whole message of at most the path MTU, to any UD QP that holds the
   * packet's Q_Key (DETH); the receive WQE is taken when it lands. A UD responder drops what it
   * cannot take (no QP, a wrong Q_Key, no receive posted), answering the sender's engine as if
   * it had landed: UD has no ACK or NAK of its own.
   */
  UD_SEND = 10,
  /** UD SEND with immediate. */
  UD_SEND_IMM = 11,
  /**
   * ATOMIC ACKNOWLEDGE: its 8 bytes are AtomicAckETH, the word's original value, landing in the
   * requester's sink. Like a READ response it is the request's acknowledgement, never ACKed:
   * a fault at the sink makes the requester send the request again under the same PSN, which the
   * responder answers from its replay of recent atomics without executing it again.
   */
  ATOMIC_ACK = 12,
}

/** Whether an opcode's RETH names a range of the responder's memory (so the range must be a real one: below 2^64). */
export function hasRemoteRange(op: RcOp | undefined): boolean {
  return (
    op === RcOp.WRITE || op === RcOp.WRITE_IMM || op === RcOp.READ_REQUEST || op === RcOp.ATOMIC || op === RcOp.ATOMIC_WRITE || op === RcOp.FLUSH
  );
}

/** Whether an opcode is a response (a READ's bytes, an atomic's old value): the request's acknowledgement, which nothing ACKs. */
export function isResponse(op: RcOp | undefined): boolean {
  return op === RcOp.READ_RESPONSE || op === RcOp.ATOMIC_ACK;
}

/** The ACK's 4-bit resp field. */
export enum AckResp {
  /** The block was written. */
  OK = 0,
  /**
   * Translation fault at the destination (the thesis's fault NACK, like InfiniBand's RNR NAK):
   * sent once its fault library answered, the verdict's `resolved` says when to retransmit.
   */
  FAULT = 1,
  /** The destination has no stream for this protection domain. */
  PD_ERR = 2,
  /** The destination refused the access (permission). */
  ACCESS_ERR = 3,
  /** The destination VA is in no region of that protection domain. */
  ADDR_ERR = 4,
  /** A fault NACK whose fault the destination's fault library could not resolve (5 is unused: it was a separate RESOLVED). */
  UNRESOLVED = 6,
  /** The destination aborted a stalled access (CMD_RESUME ABORT / TERM). */
  ABORTED = 7,
  /** The payload could not be read: a source page went away before the write (the requester's fault). */
  SOURCE_FAULT = 8,
  /** The destination's engine is closed: the block was not written. */
  FLUSHED = 9,
  /** RNR NAK: no receive WQE posted for a SEND (or a WRITE with immediate): send it again after the verdict's timer. */
  RNR = 10,
  /**
   * The packet was dropped: no QP of that number accepting packets, not the connected QP, or
   * a PSN out of sequence. An RC requester's transport retries then run out (RETRY_EXC_ERR).
   */
  DROPPED = 11,
  /** NAK invalid request: e.g. a SEND longer than the receive buffers (REM_INV_REQ_ERR). */
  INV_REQ = 12,
  /** NAK remote operational error: the responder could not carry it out, e.g. a receive buffer in no MR (REM_OP_ERR). */
  OP_ERR = 13,
  /** A READ's or an atomic's response could not be sent (the responder's memory): the verdict's `answer` says how it ended. */
  ANSWER_ERR = 14,
}

/**
 * The bytes a write carries. In one process the in-process transport hands over a view of
 * the source memory, read by the destination's copy engine when it writes; a transport
 * between processes serialises these bytes instead.
 */
export interface Payload {
  /** The source memory the bytes are read from. */
  region: MemoryLike;
  /** Byte offset of the first byte in that memory. */
  offset: number;
}

interface Header {
  /** Sending node. */
  src: number;
  /** Receiving node. */
  dst: number;
  /** Protection-domain id (16 bits in ExaNet headers): the destination's stream. */
  pd: number;
  /** Destination virtual address (write) or the VA the ACK refers to. */
  va: bigint;
  /** Transfer id (per source node) and block sequence number. */
  tid: number;
  /** Block sequence number. */
  seq: number;
  /** Bytes the packet is about. */
  length: number;
  /** Modelled arrival time (µs). */
  arrivesAt: number;
}

/** A span of a write's destination the admission check is asked about (a run's blocks, or one of them). */
export interface WireBlock {
  /** Destination virtual address of the span. */
  va: bigint;
  /** Bytes of the span. */
  length: number;
}

/**
 * A write: a run of consecutive blocks of one transfer, carried as one entry (the header's
 * va, seq and length are the run's: its first block's destination VA and sequence number,
 * its bytes). Blocks are `blockSize` bytes but the last of the transfer; per-block data
 * travels only where it differs from block to block (the modelled times). The responder
 * handles a transfer's writes in order and stops at the first block it cannot write; the
 * blocks after it, and the later writes of that transfer until the source sends that block
 * again, come back unanswered (as an RC responder drops packets after a NAK).
 */
export interface WritePacket extends Header {
  /** Packet kind. */
  type: 'write';
  /** Engine channel the transfer runs on. */
  channel: number;
  /** Blocks of the run, from `seq` on. */
  count: number;
  /** Bytes per block (the last block of a transfer may be shorter). */
  blockSize: number;
  /** The run's bytes, contiguous from here. */
  payload: Payload;
  /** Bytes of the transfer from `va` on (a destination fault's Touch-Ahead hint is counted from it). */
  lengthHint: number;
  /** Per block: when it was issued and when it arrives (modelled µs). */
  issuedUs: Float64Array;
  /** Per block: when it arrives (modelled µs). */
  arrivals: Float64Array;
  /** When the run was issued (performance.now() ms). */
  issuedMs: number;
  /** The source reads the payload under a stall window: its faults stall instead of failing. */
  sourceStall: boolean;
  /**
   * Block `seq` of the run had a source page missing when its bytes were read for another
   * process: only the blocks before it carry bytes, and it is answered SOURCE_FAULT (in
   * order with the transfer's other answers).
   */
  sourceFault?: {
    /** The block whose source page was missing. */
    seq: number;
    /** Offset in the payload's region of that page. */
    faultOffset: number;
  };
  /**
   * RC packets (a QP's message; absent for the engine's own raw transfers): BTH.opcode, the
   * destination QP (BTH.DestQP), the message's PSN (its blocks follow it), the sender's QP;
   * RETH.rkey (`key`) and RETH.va (`va`) for RETH-addressed opcodes; ImmDt. The responder
   * checks them all, once per packet, against its own node's tables (rc.ts).
   */
  opcode?: RcOp;
  /** BTH destination QP. */
  qpn?: number;
  /** The sending QP (the connection's other end). */
  srcQpn?: number;
  /** BTH PSN of the message. */
  psn?: number;
  /** RETH rkey (RDMA WRITE), or the requester's lkey of its sink (READ response). */
  key?: number;
  /** ImmDt of a SEND or WRITE with immediate. */
  immData?: number;
  /** BTH SE: the sender asked for a solicited event (SendFlags.SOLICITED) where the message's receive completes. */
  solicited?: boolean;
  /** DETH Q_Key of a UD SEND: the receiving UD QP must hold the same. */
  qkey?: number;
  /** XRCETH: the XRC SRQ (24-bit number) at the XRC target QP that a request of an XRC send QP is for. */
  srqn?: number;
  /** Source faults the message took so far (for the receive completion's odp figures). */
  srcFaults?: number;
  /** A message of several transfers (one per SGE): this transfer's byte offset in it. */
  msgOffset?: number;
  /** The message's bytes (with msgOffset). */
  msgLength?: number;
  /** READ request: RETH's DMA length, the bytes to read from `va`. */
  dmaLength?: number;
  /** READ request, ATOMIC: where the response lands at the requester (its own SGEs, checked there against what it expects). */
  sinks?: WireSge[];
  /** FLUSH: FETH, the placement type (bits: 1 global visibility, 2 persistence) and the selectivity level (0 the range, 1 the whole MR). */
  flush?: {
    /** ibv_placement_type bits. */
    type: number;
    /** ibv_selectivity_level. */
    level: number;
  };
  /** ATOMIC: AtomicETH's operation and operands. */
  atomic?: {
    /** Fetch-and-add (else compare-and-swap). */
    fetchAdd: boolean;
    /** The value added, or compared with. */
    compareAdd: bigint;
    /** Compare-and-swap: the value written when the comparison matches. */
    swap: bigint;
  };
}

/** The responder's answer for blocks of a write: the ones it wrote, or one it did not. */
export interface Verdict {
  /** First block this answer is for. */
  seq: number;
  /** Blocks from `seq` this answer is for: the run written (OK), else 1. */
  count: number;
  /** The answer. */
  resp: AckResp;
  /** Modelled µs the destination's translation took (per block; `walks` where blocks differ). */
  walkUs: number;
  /** Per block: modelled µs of the destination's translation, where blocks differ. */
  walks?: Float64Array;
  /** The fault was found by the copy (the page went away after the translation), not by the walk. */
  late?: boolean;
  /** Why the block was refused, for an error resp. */
  reason?: string;
  /** SOURCE_FAULT: offset in the payload's region of the page that was missing. */
  faultOffset?: number;
  /** Stalls the destination took while writing (each a fault retried in place). */
  stalls?: number;
  /** RNR NAK: the min_rnr_timer code to wait before sending the block again. */
  rnrTimer?: number;
  /**
   * FAULT: the destination's fault library made the page resident; the block may go again
   * from `atUs` (modelled µs its answer reaches the source). Absent: no answer came within
   * the destination's fault timeout (the block goes again at once).
   */
  resolved?: {
    /** Modelled µs the answer reaches the source. */
    atUs: number;
    /** Pages a page store supplied (remote paging's major faults). */
    fetched: number;
    /** Real µs from the fault's detection to its answer, measured at the destination (the source's real fault time starts that much before the NACK). */
    heldUs: number;
  };
  /** ANSWER_ERR: what the response's transfers took before they failed (the requester's completion reports it). */
  answered?: {
    /** Faults at the responder's memory (the answer's source) and at the requester's sinks. */
    faults: {
      /** At the responder's memory. */
      source: number;
      /** At the requester's sinks. */
      destination: number;
    };
    /** Blocks of the answer sent again. */
    retransmittedBlocks: number;
    /** Pages a page store supplied. */
    majorFaults: number;
  };
  /** ANSWER_ERR: how the answer's transfer ended (a DmaStatus) and at which side. */
  answer?: {
    /** Its DmaStatus. */
    status: number;
    /** The side that failed: 'source' (the responder's memory) or 'destination' (the requester's sink). */
    side: 'source' | 'destination';
  };
  /** For the trace only (no wire field of the hardware): the copy thread that wrote the blocks, and its ns. */
  copyThread?: number;
  /** Real ns the copy thread spent writing the blocks (trace only). */
  copyNs?: number;
}

/** An ACK: the answer to a write (verdicts for the blocks it handled, in order, and the range of blocks it did not get to). */
export interface AckPacket extends Header {
  /** Packet kind. */
  type: 'ack';
  /** The answer as a whole (per-block answers in `verdicts`). */
  resp: AckResp;
  /** Answers for the blocks handled, in order. */
  verdicts?: Verdict[];
  /** Blocks the responder did not get to (after a refused one): sent again later. */
  returned?: {
    /** First block not handled. */
    seq: number;
    /** Blocks not handled. */
    count: number;
  };
}

/** A scatter/gather entry a READ or atomic request names: where its answer lands at the requester. */
export interface WireSge {
  addr: bigint;
  length: number;
  lkey: number;
}

/** Anything a transport carries between nodes. */
export type Packet = WritePacket | AckPacket;
/** The kinds of packet. */
export type PacketType = Packet['type'];
