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
export { Cluster, Context, type AsyncEvent, type ClusterOptions, type DeviceAttr, type Sge } from './cluster.js';
export { ProtectionDomain, MemoryRegion, type RegMrOptions, type VerbsProcess } from './mr.js';
export { CompletionQueue, type WorkCompletion } from './cq.js';
export { AddressHandle, type AhAttr } from './ah.js';
export { SharedReceiveQueue, SrqType, type SrqAttr, type SrqInitAttr } from './srq.js';
export { XrcDomain } from './xrc.js';
export { QueuePair, connectQps, type QpAttr, type QpCap, type QpInitAttr, type SendWr, type RecvWr } from './qp.js';

import type { CompletionQueue, WorkCompletion } from './cq.js';
import type { MemoryRegion } from './mr.js';

/** ibv_poll_cq(cq, n): up to `n` completions, oldest first (none if the queue is empty). */
export function pollCq(cq: CompletionQueue, n = 1): WorkCompletion[] {
  return cq.poll(n);
}

/** ibv_dereg_mr(mr). */
export function deregMr(mr: MemoryRegion): void {
  mr.dereg();
}
