// What kernel-sim needs to know about a process's memory. lib's Region satisfies this
// structurally, so kernel-sim never imports lib (imports go native ← kernel-sim ← lib).

/** Told when pages of a region stop being resident or the region goes away. */
export interface MemoryObserver {
  regionClosing(region: MemoryLike): void;
  regionEvicted?(region: MemoryLike, offset: number, length: number): void;
  /** The pages of the range stayed resident but may have moved to other frames (THP collapse). */
  regionMoved?(region: MemoryLike, offset: number, length: number): void;
}

export interface MemoryLike {
  readonly id: number;
  readonly address: bigint;
  readonly size: number;
  readonly pageSize: number;
  readonly closed: boolean;
  /** Translation granule (2 MiB for huge pages). */
  readonly granule: number;
  observe(o: MemoryObserver): void;
  unobserve(o: MemoryObserver): void;
}

/** A fault as a userfaultfd reports it (lib's Fault satisfies this). */
export interface UffdFaultLike {
  region: MemoryLike;
  offset: number;
  address: bigint;
  write: boolean;
  threadId: number;
  resolvedBy: 'handler' | 'native';
}

/**
 * The userfaultfd operations stall mode needs (lib's Userfaultfd satisfies this): the
 * engine's copy threads block in genuine faults on registered memory until the resume.
 */
export interface UffdLike {
  readonly closed: boolean;
  onFault(handler: (fault: UffdFaultLike) => void | Promise<void>): unknown;
  zeropage(region: MemoryLike, offset: number, length: number, options?: { wake?: boolean }): void;
  wake(region: MemoryLike, offset: number, length: number): void;
  isRegistered(region: MemoryLike, offset?: number): boolean;
}
