// The verbs' request and response headers (the BTH/RETH/AETH of an RC packet, in spirit):
// what a requester tells a responder on another node and what it hears back. They travel
// as messages through the fabric, laid out in bytes by kernel-sim/fabric/headers.ts; the
// bytes travel in the engine's write packets.
import type { VerbsRequest, VerbsResponse } from '../../kernel-sim/fabric/packets.js';
import type { WcStatus } from './constants.js';

export type { Odp, WireSge } from '../../kernel-sim/fabric/packets.js';

export type Request = VerbsRequest;

export interface Response extends VerbsResponse {
  status: WcStatus;
}

export type Message = Request | Response;

export function isMessage(body: unknown): body is Message {
  const k = (body as { kind?: unknown } | null)?.kind;
  return k === 'request' || k === 'response';
}
