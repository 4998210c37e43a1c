// A simulated system: N nodes, each with its SMMU, modified SMMU driver, netlink family,
// fault-aware PLDMA and native copy engine (the device's threads that move the bytes), joined
// by a fabric, sharing one modelled clock.
import { binding } from '../native/index.js';
import { costModel, type CostModel } from './cost-model/index.js';
import { defaultHardware, hardwarePreset, RNR_TIMER_US, rnrRetry, type HardwarePreset } from './cost-model/presets.js';
import { Fabric } from './fabric/fabric.js';
import type { Transport } from './fabric/transport.js';
import type { MemoryLike, UffdLike } from './memory.js';
import { NetlinkFamily, type NetlinkSocket } from './netlink/netlink.js';
import { CopyEngine, type CopyTag, nodeTag } from './pldma/copy-engine.js';
import { Pldma } from './pldma/pldma.js';
import type { DmaCompletion, DmaDescriptor, FaultHook } from './pldma/types.js';
import { RcTables } from './rc/tables.js';
import { SmmuDriver } from './smmu-driver/driver.js';
import { releaseForeignFault, Smmu, type FaultModel, type StreamContext } from './smmu/smmu.js';
import { Tracer } from './trace.js';

/** Options of the simulated system (and of `Cluster.create`). */
export interface SystemOptions {
  /** Simulated nodes (default 2). */
  nodes?: number;
  /**
   * The hardware preset (cost model + fault handling, `pagefault-rdma hardware` lists them):
   * a name, or `{ name, minRnrTimer }` (mlx5-odp: the responders' min_rnr_timer code 0..31,
   * default 1). Default exanest-pldma (or the program's --hardware).
   */
  hardware?: string | HardwareConfig;
  /** Cost model overrides, on top of the preset's costs (see DEFAULT_COSTS). */
  costs?: Partial<CostModel>;
  /** Virtual channels per engine (default 1024). */
  channels?: number;
  /** Bytes per block (default 4096). */
  blockSize?: number;
  /** Faults one block may take before its transfer fails (default 7). */
  retryLimit?: number;
  /** A fault not answered in this time fails its transfer, ms (default 2000). */
  faultTimeoutMs?: number;
  /** Native copy threads (default 2). */
  engineThreads?: number;
  /** SMMU event queue records (default 256). */
  eventQueueDepth?: number;
  /** Messages a netlink socket holds before it drops (default 64). */
  netlinkQueue?: number;
  /** IOTLB entries per SMMU (default 4096). */
  iotlbEntries?: number;
  /** How nodes reach each other: the in-process Fabric by default, or a LibfabricTransport to nodes in other processes. */
  transport?: Transport;
}

/** A preset with its parameters. */
export interface HardwareConfig {
  name: string;
  /** mlx5-odp: min_rnr_timer code 0..31 of every responder (IB spec encoding; 0 = 655.36 ms; default 1 = 10 µs). */
  minRnrTimer?: number;
}

/** What a system's preset did (modelled): receive faults answered with RNR NAK, and the RNR waits they cost. */
export interface HardwareCounters {
  rnrNaks: number;
  rnrWaits: number;
  rnrWaitUs: number;
  /** stall / inline presets on a terminate-mode QP: destination faults modelled as a wait in place (no NACK, no re-send cost). */
  stalls: number;
}

function optionError(name: string, value: unknown, want: string): Error {
  const e = (
    typeof value === 'number'
      ? new RangeError(`${name} must be ${want}, got ${value}`)
      : new TypeError(`${name} must be ${want}, got ${typeof value}`)
  ) as Error & { code: string };
  e.code = typeof value === 'number' ? 'ERR_OUT_OF_RANGE' : 'ERR_INVALID_ARG_TYPE';
  return e;
}

/** Every option checked up front, with an error naming it (a bad block size would spin, NaN would throw late). */
export function checkSystemOptions(o: SystemOptions): void {
  if (o === null || typeof o !== 'object') throw optionError('options', o, 'an object');
  const int = (name: keyof SystemOptions, min: number, max: number, infinity = false) => {
    const v = o[name];
    if (v === undefined) return;
    if (typeof v !== 'number' || Number.isNaN(v) || (!Number.isInteger(v) && !(infinity && v === Infinity)) || v < min || v > max)
      throw optionError(name, v, `an integer in ${min}..${max}${infinity ? ' or Infinity' : ''}`);
  };
  int('nodes', 1, 1024);
  // Up to 2^15: a responder's answers use channels of their own above them (2^16 on the wire).
  int('channels', 1, 1 << 15);
  int('blockSize', 4096, 1 << 30);
  if (o.blockSize !== undefined && o.blockSize % 4096 !== 0) throw optionError('blockSize', o.blockSize, 'a multiple of the page size (4096)');
  int('retryLimit', 0, 1 << 30, true);
  int('faultTimeoutMs', 1, 2 ** 31 - 1);
  int('engineThreads', 1, 64);
  int('eventQueueDepth', 1, 1 << 20);
  int('netlinkQueue', 1, 1 << 20);
  int('iotlbEntries', 1, 1 << 24);
  const h = o.hardware;
  if (h !== undefined) {
    const name = typeof h === 'object' && h !== null ? h.name : h;
    hardwarePreset(name as string);
    if (typeof h === 'object' && h !== null && h.minRnrTimer !== undefined) {
      const m = h.minRnrTimer;
      if (typeof m !== 'number' || !Number.isInteger(m) || m < 0 || m > 31) throw optionError('hardware.minRnrTimer', m, 'an integer in 0..31');
    }
  }
  const t = o.transport as Partial<Transport> | undefined;
  if (t !== undefined && (t === null || typeof t !== 'object' || typeof t.attach !== 'function' || typeof t.send !== 'function'))
    throw optionError('transport', t, 'a Transport (Fabric or LibfabricTransport)');
}

/** One simulated node: its SMMU, SMMU driver, netlink family and DMA engine. */
export class SimNode {
  /** Node id. */
  readonly id: number;
  /** The node's hardware and kernel parts, for tests and tools that watch them; lib/ uses the methods below. */
  readonly smmu: Smmu;
  /** The node's netlink family (the driver's channel to processes). */
  readonly netlink: NetlinkFamily;
  /** The node's SMMU driver. */
  readonly driver: SmmuDriver;
  /** The node's DMA engine. */
  readonly pldma: Pldma;
  /** The node's QP and MR tables (rxe_pool): the verbs device keeps its objects here, the responder checks every RC packet against them. */
  readonly tables = new RcTables();
  /** The node's copy engine: the threads that write what its responder admits. */
  readonly engine: CopyEngine;
  #fabric: Transport;
  #onPeerLost: ((node: number) => void) | undefined;

  /** @internal */
  constructor(id: number, system: SimSystem, options: SystemOptions) {
    this.id = id;
    this.#fabric = system.fabric;
    this.engine = new CopyEngine(options.engineThreads ?? 2);
    const smmuOpts: ConstructorParameters<typeof Smmu>[0] = { node: id };
    if (options.eventQueueDepth !== undefined) smmuOpts.eventQueueDepth = options.eventQueueDepth;
    if (options.iotlbEntries !== undefined) smmuOpts.iotlbEntries = options.iotlbEntries;
    this.smmu = new Smmu(smmuOpts);
    this.netlink = new NetlinkFamily(id, options.netlinkQueue !== undefined ? { socketQueue: options.netlinkQueue } : {});
    this.driver = new SmmuDriver(id, { smmu: this.smmu, netlink: this.netlink, costs: system.costs, tracer: system.tracer });
    const p: ConstructorParameters<typeof Pldma>[0] = { node: id };
    if (options.channels !== undefined) p.channels = options.channels;
    if (options.blockSize !== undefined) p.blockSize = options.blockSize;
    if (options.retryLimit !== undefined) p.retryLimit = options.retryLimit;
    if (options.faultTimeoutMs !== undefined) p.faultTimeoutMs = options.faultTimeoutMs;
    this.pldma = new Pldma(p, {
      smmu: this.smmu,
      transport: system.fabric,
      costs: system.costs,
      ...(system.faultHook ? { faultHook: system.faultHook } : {}),
      engine: this.engine,
      tracer: system.tracer,
      clock: system.clock,
      tables: this.tables,
      fenceCopies: (node, tag, timeoutMs) => system.fenceCopies(node, tag, timeoutMs),
    });
    this.driver.attachEngine(this.pldma);
    system.fabric.attach(id, (packet) => this.pldma.onPacket(packet));
    system.fabric.onPeerLost?.((node) => {
      this.pldma.peerLost(node);
      this.#onPeerLost?.(node);
    });
  }

  /** Hear when node `node` (in another process) went away: the upper layer ends what waits on it. */
  onPeerLost(handler: ((node: number) => void) | undefined): void {
    this.#onPeerLost = handler;
  }

  /** Whether node `node` is on this node's fabric. */
  hasPeer(node: number): boolean {
    return this.#fabric.hasNode(node);
  }

  /** Virtual channels of the node's engine. */
  get channels(): number {
    return this.pldma.channels;
  }

  /**
   * @internal Memory of the device's own, `size` bytes, mapped read-only in protection domain
   * `pd`'s stream (a QP's inline data: the engine reads a WQE's bytes there); undefined if the
   * PD has no stream. `release` unmaps it.
   */
  deviceMemory(pd: number, size: number): { address: bigint; bytes: Uint8Array; release(): void } | undefined {
    const stream = this.smmu.streamForPd(pd);
    if (!stream) return undefined;
    const m = binding.mapRegion(size, false, false, false);
    let closed = false;
    const region: MemoryLike = {
      id: m.id,
      address: m.address,
      size: m.buffer.byteLength,
      pageSize: m.pageSize,
      get closed() {
        return closed;
      },
      granule: m.pageSize,
      observe() {},
      unobserve() {},
    };
    this.smmu.map(stream.sid, region, { read: true, write: false });
    const release = () => {
      if (closed) return;
      closed = true;
      if (this.smmu.stream(stream.sid)) this.smmu.unmap(stream.sid, region);
      binding.closeRegion(m.id, m.buffer);
    };
    return { address: m.address, bytes: new Uint8Array(m.buffer), release };
  }

  /** A fault not answered in this time fails its transfer, ms. */
  get faultTimeoutMs(): number {
    return this.pldma.faultTimeoutMs;
  }

  /**
   * A process on this node: its stream (protection domain) in the SMMU and its netlink
   * socket, on which its fault library hears about its faults.
   */
  attachProcess(config: { pid: number; pd: number; faultModel?: FaultModel }): {
    /** The process's SMMU stream on this node. */
    stream: StreamContext;
    /** The process's netlink socket. */
    socket: NetlinkSocket;
  } {
    const stream = this.smmu.attach(config);
    return { stream, socket: this.netlink.bind(config.pid) };
  }

  /** Open a process's netlink socket (its fault library listens on it). */
  openProcess(pid: number): NetlinkSocket {
    return this.netlink.bind(pid);
  }

  /** A stream (SMMU context) for protection domain `pd` of process `pid`. */
  allocStream(config: { pid: number; pd: number; faultModel?: FaultModel }): StreamContext {
    return this.smmu.attach(config);
  }

  /** Remove a stream: every later access through it fails (PD_ERR), stalled accesses end. */
  freeStream(stream: StreamContext): void {
    this.smmu.detach(stream.sid);
  }

  /** Map a region into a stream's address space with permissions. */
  map(stream: StreamContext, region: MemoryLike, perms?: { read?: boolean; write?: boolean }): void {
    this.smmu.map(stream.sid, region, perms);
  }

  /** Unmap `region` from the stream: its translations are dropped. */
  unmap(stream: StreamContext, region: MemoryLike): void {
    if (this.smmu.stream(stream.sid)) this.smmu.unmap(stream.sid, region);
  }

  /** Post the translations of resident pages of [offset, offset+length) to the IOTLB (ibv_advise_mr's device part). */
  prefetchTranslations(stream: StreamContext, region: MemoryLike, offset: number, length: number): void {
    const ps = region.pageSize;
    for (let p = offset - (offset % ps); p < offset + length && p < region.size; p += ps)
      this.smmu.translate(stream.sid, region.address + BigInt(p), ps, 'read');
  }

  /** Post a DMA transfer on this node's engine; resolves when every block is acknowledged or the transfer fails. */
  post(desc: DmaDescriptor): Promise<DmaCompletion> {
    return this.pldma.post(desc);
  }

  /**
   * Wait until no copy written for this memory key or QP is running; queued ones are
   * cancelled. With the admission check refusing them, nothing more lands for them once it
   * returns. False if a stall-mode copy was still held after `timeoutMs`.
   */
  fence(tag: CopyTag, timeoutMs?: number): boolean {
    return this.engine.fence(nodeTag(this.id, tag), timeoutMs);
  }

  /**
   * End every transfer QP `qp` of this node posted (DmaDescriptor.srcQp): once it returns,
   * nothing of them lands in this process (runs already handed to a transport between
   * processes may still land there). They complete FLUSHED. False if a stall-mode copy was
   * still held after `timeoutMs`.
   */
  cancel(qp: number, timeoutMs?: number): boolean {
    return this.pldma.cancel(qp, timeoutMs);
  }
}

/** The whole simulated system: nodes (each with its own copy engine) on one transport, one cost model and one modelled clock. */
export class SimSystem {
  /** The cost model in use. */
  readonly costs: CostModel;
  /** The hardware preset in use (its name goes into traces and plots). */
  readonly hardware: HardwarePreset;
  /** mlx5-odp: the responders' min_rnr_timer code. */
  readonly minRnrTimer: number;
  /** What the preset's fault handling did (modelled). */
  readonly hardwareCounters: HardwareCounters = { rnrNaks: 0, rnrWaits: 0, rnrWaitUs: 0, stalls: 0 };
  /** The transport between nodes. */
  readonly fabric: Transport;
  /** Every model event goes through this tracer. */
  readonly tracer = new Tracer();
  /** The modelled clock (µs): the latest modelled completion so far. */
  readonly clock = {
    /** Modelled time now, µs. */
    now: 0,
  };
  /** The nodes, by id. */
  readonly nodes: SimNode[] = [];
  #closed = false;

  constructor(options: SystemOptions = {}) {
    checkSystemOptions(options);
    const n = options.nodes ?? 2;
    const h = options.hardware;
    this.hardware = hardwarePreset(typeof h === 'object' ? h.name : (h ?? defaultHardware()));
    this.minRnrTimer = (typeof h === 'object' ? h.minRnrTimer : undefined) ?? 1;
    this.costs = costModel({ ...this.hardware.costs, ...options.costs });
    this.fabric = options.transport ?? new Fabric(this.costs);
    for (let i = 0; i < n; i++) this.nodes.push(new SimNode(i, this, options));
  }

  /**
   * The preset's hook in the fault path, consulted when a destination fault of a terminate-mode
   * QP is answered (none for exanest-pldma: the engine's own NACK timing, unchanged).
   * rnr-nak: the requester retries by the RNR timer. stall / inline: the access is modelled as
   * waiting in place and resuming when the fault is served (no NACK round trip); the real stall
   * path (faultModel 'stall' with a userfaultfd) needs no hook.
   */
  get faultHook(): FaultHook | undefined {
    const mode = this.hardware.faultMode;
    if (mode === 'terminate-nack') return undefined;
    const c = this.hardwareCounters;
    if (mode === 'rnr-nak') {
      const timerUs = RNR_TIMER_US[this.minRnrTimer]!;
      return {
        receiveFault: (nakAtUs, readyAtUs, linkUs) => {
          const r = rnrRetry(nakAtUs, readyAtUs, linkUs, timerUs);
          c.rnrNaks++;
          c.rnrWaits += r.waits;
          c.rnrWaitUs += r.atUs - nakAtUs;
          return r.atUs;
        },
      };
    }
    const resumeUs = this.costs.resumeUs;
    return {
      receiveFault: (nakAtUs, readyAtUs, linkUs) => {
        c.stalls++;
        void nakAtUs;
        return readyAtUs + resumeUs - linkUs;
      },
    };
  }

  /** Whether node `id` is hosted by this process (always, in process; see LibfabricTransport). */
  isLocal(id: number): boolean {
    return this.fabric.isLocal?.(id) ?? true;
  }

  /** Node `id` (throws for an unknown id). */
  node(id: number): SimNode {
    const n = this.nodes[id];
    if (!n) throw new RangeError(`no node ${id} (nodes 0..${this.nodes.length - 1})`);
    return n;
  }

  /**
   * In this process, wait for the copies node `node`'s threads run for `tag` (a transfer's
   * payload here is a view another node's threads read); a node in another process is sent
   * bytes: nothing of this process's memory to wait for.
   */
  fenceCopies(node: number, tag: CopyTag, timeoutMs?: number): boolean {
    const n = this.nodes[node];
    if (!n || !this.isLocal(node)) return true;
    return n.fence(tag, timeoutMs);
  }

  /**
   * Stall-mode memory of every node is registered on `uffd`; the copy threads are the device.
   * Each SMMU knows every node's threads: in one process a source's payload is a view the
   * destination node's threads read (across processes, the source's transport reads it).
   */
  attachStallSource(uffd: UffdLike): void {
    const tids = this.nodes.flatMap((n) => n.engine.tids);
    for (const n of this.nodes) n.smmu.attachStallSource(uffd, tids, { listen: false });
    // One handler for all nodes (a uffd keeps only the last one set): the SMMU whose
    // stall window covers the access stalls it.
    uffd.onFault((f) => {
      if (!this.nodes.some((n) => n.smmu.stallDeviceFault(f))) releaseForeignFault(uffd, f);
    });
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Flush every transfer (FLUSHED), stop the copy engine. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const n of this.nodes) n.pldma.close();
    for (const n of this.nodes) n.engine.close();
    for (const n of this.nodes) n.pldma.release();
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}
