// pagefault-rdma: the user-space library.
export { mapRegion, Region, PAGE_SIZE, HUGE_PAGE_SIZE, type MapOptions, type PopulateOptions } from './region.js';
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
  type ResolveOptions,
  type UffdStats,
} from './uffd.js';
export { touch, type TouchOptions, type TouchResult } from './toucher.js';
export { PfrError, type PfrErrorCode, type SystemError } from './errors.js';
