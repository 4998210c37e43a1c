// The verbs-like API: libibverbs names and semantics over the modelled fault-aware engine.
// An explicit list: the verbs' own objects, constants and types; helpers the layers share
// (access-mask checks, error builders) are imported from their modules.
export {
  Access,
  AdviseMrAdvice,
  AdviseMrFlags,
  AsyncEventType,
  FlushLevel,
  FlushType,
  OdpGeneralCaps,
  OdpTransportCaps,
  QP_DEFAULTS,
  QpAttrMask,
  QpExSendOps,
  QpState,
  QpType,
  SIZE_MAX,
  SendFlags,
  UD_MTU,
  WcFlags,
  WcOpcode,
  WcStatus,
  WrOpcode,
  rnrTimerMs,
  wcStatusStr,
} from './constants.js';
export {
  Cluster,
  Context,
  formatMrStatistics,
  type AsyncEvent,
  type ClusterOptions,
  type CreateCqOptions,
  type DeviceAttr,
  type MrAttr,
  type MrStatistic,
  type RegMrIn,
  type Sge,
} from './cluster.js';
export { ProtectionDomain, MemoryRegion, type OdpCounters, type RegMrOptions, type VerbsProcess } from './mr.js';
export { CompletionQueue, type WorkCompletion } from './cq.js';
export { CompletionChannel, type GetCqEventOptions } from './comp-channel.js';
export { AddressHandle, type AhAttr } from './ah.js';
export { SharedReceiveQueue, SrqType, type SrqAttr, type SrqInitAttr } from './srq.js';
export { XrcDomain } from './xrc.js';
export { QueuePair, connectQps, type QpAttr, type QpCap, type QpInitAttr, type QpQueryAttr, type SendWr, type RecvWr } from './qp.js';
export { QueuePairEx, type QpInitAttrEx } from './qp-ex.js';

import type { CompletionChannel, GetCqEventOptions } from './comp-channel.js';
import type { CompletionQueue, WorkCompletion } from './cq.js';
import type { MemoryRegion } from './mr.js';

/** ibv_req_notify_cq(cq, solicited_only): arm `cq` for one event on its channel. */
export function reqNotifyCq(cq: CompletionQueue, solicitedOnly = false): void {
  cq.reqNotify(solicitedOnly);
}

/** ibv_get_cq_event(channel): the next CQ whose armed notification fired (waits up to `timeoutMs`). */
export function getCqEvent(channel: CompletionChannel, options?: GetCqEventOptions): Promise<CompletionQueue> {
  return channel.getCqEvent(options);
}

/** ibv_ack_cq_events(cq, nevents). */
export function ackCqEvents(cq: CompletionQueue, nevents: number): void {
  cq.ackEvents(nevents);
}

/** ibv_poll_cq(cq, n): up to `n` completions, oldest first (none if the queue is empty). */
export function pollCq(cq: CompletionQueue, n = 1): WorkCompletion[] {
  return cq.poll(n);
}

/** ibv_dereg_mr(mr). */
export function deregMr(mr: MemoryRegion): void {
  mr.dereg();
}
