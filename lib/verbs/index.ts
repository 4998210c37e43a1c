// The verbs-like API: libibverbs names and semantics over the modelled fault-aware engine.
export * from './constants.js';
export { Cluster, Context, type ClusterOptions, type DeviceAttr, type Sge } from './cluster.js';
export { ProtectionDomain, MemoryRegion, type RegMrOptions } from './mr.js';
export { CompletionQueue, type WorkCompletion } from './cq.js';
export { QueuePair, connectQps, type QpAttr, type QpCap, type QpInitAttr, type SendWr, type RecvWr } from './qp.js';
export { verbsError } from './errors.js';
