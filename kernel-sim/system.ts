// A simulated system: N nodes, each with its SMMU, modified SMMU driver, netlink family and
// fault-aware PLDMA, joined by a fabric, sharing one native copy engine (the device whose
// threads move the bytes) and one modelled clock.
import { costModel, type CostModel } from './cost-model/index.js';
import { Fabric } from './fabric/fabric.js';
import type { MemoryLike, UffdLike } from './memory.js';
import { NetlinkFamily, type NetlinkSocket } from './netlink/netlink.js';
import { CopyEngine } from './pldma/copy-engine.js';
import { Pldma, type DmaCompletion, type DmaDescriptor } from './pldma/pldma.js';
import { SmmuDriver } from './smmu-driver/driver.js';
import { releaseForeignFault, Smmu, type FaultModel, type StreamContext } from './smmu/smmu.js';
import { Tracer } from './trace.js';

export interface SystemOptions {
  nodes?: number;
  costs?: Partial<CostModel>;
  channels?: number;
  blockSize?: number;
  retryLimit?: number;
  faultTimeoutMs?: number;
  engineThreads?: number;
  eventQueueDepth?: number;
  netlinkQueue?: number;
  iotlbEntries?: number;
}

export class SimNode {
  readonly id: number;
  readonly smmu: Smmu;
  readonly netlink: NetlinkFamily;
  readonly driver: SmmuDriver;
  readonly pldma: Pldma;

  /** @internal */
  constructor(id: number, system: SimSystem, options: SystemOptions) {
    this.id = id;
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
      engine: system.engine,
      tracer: system.tracer,
      clock: system.clock,
    });
    this.driver.attachEngine(this.pldma);
    system.fabric.attach(id, (packet) => this.pldma.onPacket(packet));
  }

  /**
   * A process on this node: its stream (protection domain) in the SMMU and its netlink
   * socket, on which its fault library hears about its faults.
   */
  attachProcess(config: { pid: number; pd: number; faultModel?: FaultModel }): { stream: StreamContext; socket: NetlinkSocket } {
    const stream = this.smmu.attach(config);
    return { stream, socket: this.netlink.bind(config.pid) };
  }

  /** Map a region into a stream's address space with permissions. */
  map(stream: StreamContext, region: MemoryLike, perms?: { read?: boolean; write?: boolean }): void {
    this.smmu.map(stream.sid, region, perms);
  }

  post(desc: DmaDescriptor): Promise<DmaCompletion> {
    return this.pldma.post(desc);
  }
}

export class SimSystem {
  readonly costs: CostModel;
  readonly fabric: Fabric;
  readonly engine: CopyEngine;
  readonly tracer = new Tracer();
  /** The modelled clock (µs): the latest modelled completion so far. */
  readonly clock = { now: 0 };
  readonly nodes: SimNode[] = [];
  #closed = false;

  constructor(options: SystemOptions = {}) {
    const n = options.nodes ?? 2;
    if (!Number.isInteger(n) || n < 1 || n > 1024) throw new RangeError(`nodes must be an integer in 1..1024, got ${n}`);
    this.costs = costModel(options.costs);
    this.fabric = new Fabric(this.costs);
    this.engine = new CopyEngine(options.engineThreads ?? 2);
    for (let i = 0; i < n; i++) this.nodes.push(new SimNode(i, this, options));
  }

  node(id: number): SimNode {
    const n = this.nodes[id];
    if (!n) throw new RangeError(`no node ${id} (nodes 0..${this.nodes.length - 1})`);
    return n;
  }

  /** Stall-mode memory of every node is registered on `uffd`; the copy threads are the device. */
  attachStallSource(uffd: UffdLike): void {
    for (const n of this.nodes) n.smmu.attachStallSource(uffd, this.engine.tids, { listen: false });
    // One handler for all nodes (a uffd keeps only the last one set): the SMMU whose
    // stall window covers the access stalls it.
    uffd.onFault((f) => {
      if (!this.nodes.some((n) => n.smmu.stallDeviceFault(f))) releaseForeignFault(uffd, f);
    });
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Flush every transfer (FLUSHED), stop the copy engine. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const n of this.nodes) n.pldma.close();
    this.engine.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
