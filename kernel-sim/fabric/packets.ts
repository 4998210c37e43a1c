// The packets nodes exchange, and nothing else crosses from one node to another. A write
// carries one block of a transfer with its payload; the responder answers with an ACK (the
// block landed), a NACK (a fault: send it again later) or an error ACK; a destination's
// fault library's answer comes back as an ACK with resp RESOLVED / UNRESOLVED. Fields follow
// ExaNet's headers: the protection domain, the destination VA, tid and seq, a 4-bit resp.
import type { MemoryLike } from '../memory.js';

/** The ACK's 4-bit resp field. */
export enum AckResp {
  OK = 0,
  /** Translation fault at the destination: retransmit later (like InfiniBand's RNR NAK). */
  FAULT = 1,
  /** The destination has no stream for this protection domain. */
  PD_ERR = 2,
  /** The destination refused the access (permission). */
  ACCESS_ERR = 3,
  /** The destination VA is in no region of that protection domain. */
  ADDR_ERR = 4,
  /** The destination's fault library resolved the fault: retransmit now. */
  RESOLVED = 5,
  /** The destination's fault library could not resolve the fault. */
  UNRESOLVED = 6,
  /** The destination aborted a stalled access (CMD_RESUME ABORT / TERM). */
  ABORTED = 7,
  /** The payload could not be read: a source page went away before the write (the requester's fault). */
  SOURCE_FAULT = 8,
  /** The destination's engine is closed: the block was not written. */
  FLUSHED = 9,
}

/**
 * The bytes a write carries. In one process the in-process transport hands over a view of
 * the source memory, read by the destination's copy engine when it writes; a transport
 * between processes serialises these bytes instead.
 */
export interface Payload {
  region: MemoryLike;
  offset: number;
}

interface Header {
  src: number;
  dst: number;
  /** Protection-domain id (16 bits in ExaNet headers): the destination's stream. */
  pd: number;
  /** Destination virtual address (write) or the VA the ACK refers to. */
  va: bigint;
  /** Transfer id (per source node) and block sequence number. */
  tid: number;
  seq: number;
  length: number;
  /** Modelled arrival time (µs). */
  arrivesAt: number;
}

/** One block of a write: where it goes, its payload, when it arrives (modelled). */
export interface WireBlock {
  seq: number;
  va: bigint;
  length: number;
  payload: Payload;
  arrivesAt: number;
  /** Bytes of the transfer from `va` on (the Touch-Ahead hint a destination fault carries). */
  lengthHint: number;
  /** When the block was issued (modelled µs, performance.now() ms). */
  issuedUs: number;
  issuedMs: number;
}

/**
 * A write: a run of consecutive blocks of one transfer (the header fields are its first
 * block's). The responder handles them in order and stops at the first it cannot write;
 * the blocks after that one come back unanswered, to be sent again.
 */
export interface WritePacket extends Header {
  type: 'write';
  channel: number;
  blocks: WireBlock[];
  /** The source reads the payload under a stall window: its faults stall instead of failing. */
  sourceStall: boolean;
  /** The memory key and QP the write is for (an upper layer's RETH / BTH), checked on every block by the destination. */
  key?: number;
  qpn?: number;
}

/** The responder's answer for one block of a write. */
export interface Verdict {
  seq: number;
  resp: AckResp;
  /** Modelled µs the destination's translation took. */
  walkUs: number;
  /** The fault was found by the copy (the page went away after the translation), not by the walk. */
  late?: boolean;
  /** Why the block was refused, for an error resp. */
  reason?: string;
  /** SOURCE_FAULT: offset in the payload's region of the page that was missing. */
  faultOffset?: number;
  /** Stalls the destination took while writing (each a fault retried in place). */
  stalls?: number;
  /** For the trace only (no wire field of the hardware): the copy thread that wrote the block, and its ns. */
  copyThread?: number;
  copyNs?: number;
}

/**
 * An ACK: the answer to a write (a verdict per block it handled, and the blocks it did not
 * get to), or, with resp RESOLVED / UNRESOLVED, a destination fault library's answer.
 */
export interface AckPacket extends Header {
  type: 'ack';
  resp: AckResp;
  /** RESOLVED: pages the destination's page store supplied (remote paging's major faults). */
  fetched?: number;
  verdicts?: Verdict[];
  returned?: number[];
}

/** An upper layer's message (the verbs' request and response headers), delivered to the destination node's handler. */
export interface MessagePacket {
  type: 'message';
  src: number;
  dst: number;
  body: unknown;
  arrivesAt: number;
}

export type Packet = WritePacket | AckPacket | MessagePacket;
export type PacketType = Packet['type'];
