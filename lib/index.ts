// pagefault-rdma: the user-space library.
export {
  mapRegion,
  findRegion,
  Region,
  PAGE_SIZE,
  HUGE_PAGE_SIZE,
  PageCategory,
  FRAMES_HIDDEN,
  type PageFrames,
  type MapOptions,
  type PopulateOptions,
  type PagemapScanOptions,
  type PageRun,
} from './region.js';
export {
  Userfaultfd,
  UffdFeature,
  type Fault,
  type FaultKind,
  type FaultHandler,
  type UffdFeatures,
  type UffdOpenOptions,
  type RegisterOptions,
  type CopyOptions,
  type ContinueOptions,
  type MoveOptions,
  type DirtyPagesOptions,
  type ResolveOptions,
  type UffdStats,
  type UserfaultfdEvents,
} from './uffd.js';
export { touch, type TouchOptions, type TouchResult, type AccessFailedError } from './toucher.js';
export { PfrError, type PfrErrorCode, type SystemError } from './errors.js';
export { FaultLibrary, type Registration, type ResolvedFault, type FaultLibraryOptions, type TraceOption } from './fault-library/fault-library.js';
export { POLICIES, Prefetcher, type PolicyName, type PolicyOptions } from './fault-library/policy.js';
export { Histogram, latencyStats, median, type LatencyStats } from './latency.js';
export { FaultStats, PHASES, type FaultStatsSnapshot, type Phase } from './fault-library/stats.js';
export {
  TraceRecorder,
  DEFAULT_TRACE_EVENTS,
  FAULT_PHASES,
  type ChromeTrace,
  type ChromeTraceEvent,
  type FaultPhase,
  type TraceScope,
} from './fault-library/trace.js';
export * from './verbs/index.js';
export * from './remote-paging/index.js';
export {
  DEFAULT_BIND,
  DEFAULT_PEER_TIMEOUT_MS,
  LibfabricTransport,
  LIBFABRIC_PROVIDERS,
  peerTimeoutMs,
  type LibfabricProvider,
  type LibfabricOptions,
  type RmaTarget,
  type TransportStats,
} from '../kernel-sim/fabric/libfabric-transport.js';
