// What kernel-sim needs to know about a process's memory. lib's Region satisfies this
// structurally, so kernel-sim never imports lib (imports go native ← kernel-sim ← lib).

/** Told when pages of a region stop being resident or the region goes away. */
export interface MemoryObserver {
  /** The region is being unmapped: drop everything about it. */
  regionClosing(region: MemoryLike): void;
  /** Pages of the range stopped being resident (evict): drop cached translations. */
  regionEvicted?(region: MemoryLike, offset: number, length: number): void;
  /** The pages of the range stayed resident but may have moved to other frames (THP collapse). */
  regionMoved?(region: MemoryLike, offset: number, length: number): void;
}

/** A process's memory as kernel-sim sees it (lib's Region satisfies it). */
export interface MemoryLike {
  /** Region id, unique in the process. */
  readonly id: number;
  /** Start virtual address. */
  readonly address: bigint;
  /** Bytes mapped. */
  readonly size: number;
  /** Page size of the mapping. */
  readonly pageSize: number;
  /** True once unmapped. */
  readonly closed: boolean;
  /** Translation granule (2 MiB for huge pages). */
  readonly granule: number;
  /** Be told of evictions and unmapping. */
  observe(o: MemoryObserver): void;
  /** Stop being told. */
  unobserve(o: MemoryObserver): void;
  /** Make [offset, offset+length) resident (MADV_POPULATE_WRITE), where the memory can (the 'prefault' baseline). */
  populate?(offset: number, length: number): void;
}

/** A fault as a userfaultfd reports it (lib's Fault satisfies this). */
export interface UffdFaultLike {
  /** The region that faulted. */
  region: MemoryLike;
  /** Byte offset of the fault in the region. */
  offset: number;
  /** Faulting address. */
  address: bigint;
  /** True for a write access. */
  write: boolean;
  /** Kernel thread id of the faulting thread. */
  threadId: number;
  /** Who resolves it: the TypeScript handler (a device thread's fault) or native code (the JS thread's own). */
  resolvedBy: 'handler' | 'native';
}

/**
 * The userfaultfd operations stall mode needs (lib's Userfaultfd satisfies this): the
 * engine's copy threads block in genuine faults on registered memory until the resume.
 */
export interface UffdLike {
  /** True once closed. */
  readonly closed: boolean;
  /** Handle faults with this function. */
  onFault(handler: (fault: UffdFaultLike) => void | Promise<void>): unknown;
  /** Resolve with zero pages (UFFDIO_ZEROPAGE). */
  zeropage(region: MemoryLike, offset: number, length: number, options?: { wake?: boolean }): void;
  /** Wake threads waiting on the range (UFFDIO_WAKE). */
  wake(region: MemoryLike, offset: number, length: number): void;
  /** True if the region (at `offset`) is registered with this uffd. */
  isRegistered(region: MemoryLike, offset?: number): boolean;
}

/** A mapping of the addon's own (an engine's register, a transport's staging buffer) as MemoryLike, its bytes reachable as `buffer`. */
export function rawMemory(raw: { id: number; address: bigint; buffer: ArrayBuffer; pageSize: number }): MemoryLike & { buffer: ArrayBuffer } {
  return {
    id: raw.id,
    address: raw.address,
    buffer: raw.buffer,
    size: raw.buffer.byteLength,
    pageSize: raw.pageSize,
    closed: false,
    granule: raw.pageSize,
    observe() {},
    unobserve() {},
  };
}
