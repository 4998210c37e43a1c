// The verbs' request and response headers (the BTH/RETH/AETH of an RC packet, in spirit):
// what a requester tells a responder on another node and what it hears back. They travel
// as messages through the fabric; the bytes travel in the engine's write packets.
import type { WcStatus } from './constants.js';

export interface WireSge {
  addr: bigint;
  length: number;
  lkey: number;
}

export interface Odp {
  faults: { source: number; destination: number };
  /** Faults resolved with pages from a page store (remote paging): major faults, counted in pages. */
  majorFaults: number;
  retransmittedBlocks: number;
  modelUs: number;
  realUs: number;
}

export interface Request {
  kind: 'request';
  op: 'write' | 'write-imm' | 'send' | 'send-fin' | 'read' | 'atomic';
  srcQpn: number;
  dstQpn: number;
  /** Matches the response to the request (a packet sequence number). */
  psn: number;
  length: number;
  rkey?: number;
  addr?: bigint;
  immData?: number;
  /** READ / ATOMIC: where the answer lands at the requester, its PD handle and its RNR retry count for the transfer. */
  sinks?: WireSge[];
  pd?: number;
  rnrRetry?: number;
  atomic?: { fetchAdd: boolean; compareAdd: bigint; swap: bigint };
  /** SEND's end: whether the payload landed. */
  ok?: boolean;
  /** SEND's end, WRITE_WITH_IMM: the transfer's faults and times, for the receive completion. */
  odp?: Odp;
}

export interface Response {
  kind: 'response';
  srcQpn: number;
  dstQpn: number;
  psn: number;
  /** SUCCESS: go ahead (WRITE, SEND) or done (READ, ATOMIC); else the requester's completion status. */
  status: WcStatus;
  /** RNR NAK: no receive posted; retry after this min_rnr_timer code. */
  rnr?: number;
  /** WRITE / SEND: the responder's PD handle (its stream on its node), SEND: where the payload goes. */
  pd?: number;
  targets?: WireSge[];
  /** READ / ATOMIC: what the responder's transfers took. */
  odp?: Odp;
}

export type Message = Request | Response;

export function isMessage(body: unknown): body is Message {
  const k = (body as { kind?: unknown } | null)?.kind;
  return k === 'request' || k === 'response';
}
