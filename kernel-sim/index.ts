// kernel-sim: TypeScript models of the hardware and kernel side of fault-aware RDMA.
// An explicit list: what a user builds a system, a transport or a fault handler from. Engine
// internals (transfer state, run sizes, cost helpers, option checks) stay behind it; the library
// and the tests import those from their own modules.
export { DEFAULT_COSTS, MODEL_LABEL, costModel, type CostModel } from './cost-model/index.js';
export {
  DEFAULT_HARDWARE,
  HARDWARE_NAMES,
  RNR_TIMER_US,
  ackTimeoutUs,
  defaultHardware,
  hardwarePreset,
  hardwarePresets,
  setDefaultHardware,
  type FaultMode,
  type HardwareName,
  type HardwarePreset,
} from './cost-model/presets.js';
export type { MemoryLike, MemoryObserver, UffdFaultLike, UffdLike } from './memory.js';
export { Tracer, type TraceEvent, type TraceKind, type TraceListener } from './trace.js';
export {
  CMD_RESUME,
  CMD_STALL_TERM,
  EvtClass,
  EvtId,
  ResumeResp,
  decodeEvent,
  encodeEvent,
  encodeResume,
  eventName,
  type CmdResume,
  type CmdStallTerm,
  type SmmuCommand,
  type SmmuEventRecord,
} from './smmu/records.js';
export { EventQueue } from './smmu/event-queue.js';
export { Iotlb } from './smmu/iotlb.js';
export {
  Smmu,
  type Access,
  type FaultModel,
  type MoveReport,
  type RunSpans,
  type RunTranslation,
  type SmmuCounters,
  type SmmuOptions,
  type StallWindow,
  type StreamContext,
  type StreamMapping,
  type Translation,
} from './smmu/smmu.js';
export {
  IOMMU_FAULT_PAGE_REQ,
  IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE,
  IOMMU_FAULT_PAGE_REQUEST_PASID_VALID,
  IOMMU_FAULT_PAGE_RESPONSE_NEEDS_PASID,
  IOMMU_FAULT_PERM_EXEC,
  IOMMU_FAULT_PERM_PRIV,
  IOMMU_FAULT_PERM_READ,
  IOMMU_FAULT_PERM_WRITE,
  IommuPageResponseCode,
  isRecoverable,
  resumeFor,
  toPageRequest,
  type IommuFaultPageRequest,
} from './smmu-driver/iopf.js';
export { SmmuDriver, type DriverFault, type DriverCounters, type FaultAnswers } from './smmu-driver/driver.js';
export { NetlinkFamily, NetlinkSocket, NlAttr, NlCmd, type KernelHandler, type NetlinkCounters, type NlMessage } from './netlink/netlink.js';
export {
  decodeFault,
  decodeResolved,
  decodeResolvedAck,
  encodeFault,
  encodeResolved,
  encodeResolvedAck,
  type FaultNotice,
  type NlAttrs,
  type ResolveMethod,
  type ResolvedAck,
  type ResolvedAnswer,
} from './netlink/messages.js';
export {
  AckResp,
  type AckPacket,
  type Packet,
  type PacketType,
  type Payload,
  type Verdict,
  type WireBlock,
  type WritePacket,
} from './fabric/packets.js';
export type { Transport } from './fabric/transport.js';
export { Fabric } from './fabric/fabric.js';
export {
  DEFAULT_PEER_TIMEOUT_MS,
  DEFAULT_TRANSPORT_LIMITS,
  LIBFABRIC_PROVIDERS,
  LibfabricTransport,
  DEFAULT_MAX_SPIN_US,
  PROGRESS_MODES,
  type ProgressMode,
  type ProgressStats,
  type FabricSendStats,
  peerTimeoutMs,
  type LibfabricOptions,
  type LibfabricProvider,
  type RmaTarget,
  type TransportLimits,
} from './fabric/libfabric-transport.js';
export { Scheduler, type Schedulable } from './scheduler/scheduler.js';
export { CopyEngine, CopyFlag, CopyStatus, type CopyResult, type CopyTag } from './pldma/copy-engine.js';
export { Pldma } from './pldma/pldma.js';
export {
  MrState,
  mrFree,
  mrRecord,
  RcOp,
  RcTables,
  rnrTimerMs,
  type RcAddressSpace,
  type RcEvent,
  type RcMr,
  type RcPd,
  type RcOdp,
  type RcQp,
  type RcReceived,
  type RcRecvWqe,
  type RcRespState,
  type RcSrq,
} from './rc/tables.js';
export {
  DmaStatus,
  type DmaCompletion,
  type DmaDescriptor,
  type FaultCounts,
  type FaultInfo,
  type PldmaCounters,
  type PldmaOptions,
  type Side,
} from './pldma/types.js';
export { SimNode, SimSystem, type SystemOptions } from './system.js';
