// kernel-sim: TypeScript models of the hardware and kernel side of fault-aware RDMA.
export * from './cost-model/index.js';
export * from './memory.js';
export * from './trace.js';
export * from './smmu/records.js';
export { EventQueue } from './smmu/event-queue.js';
export { Iotlb } from './smmu/iotlb.js';
export * from './smmu/smmu.js';
export * from './smmu-driver/iopf.js';
export { SmmuDriver, type DriverFault, type DriverCounters, type FaultAnswers } from './smmu-driver/driver.js';
export * from './netlink/netlink.js';
export * from './netlink/messages.js';
export * from './fabric/packets.js';
export * from './fabric/transport.js';
export * from './fabric/fabric.js';
export * from './scheduler/scheduler.js';
export * from './pldma/copy-engine.js';
export * from './pldma/pldma.js';
export * from './system.js';
