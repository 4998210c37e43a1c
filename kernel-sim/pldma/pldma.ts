// The fault-aware PLDMA of one node: virtual channels, descriptors, transfers split into
// blocks, built by role as rdma_rxe is. The requester (requester.ts) translates each block's
// source on this node's SMMU and sends it as a write packet; the destination node's
// responder (responder.ts) translates it on its own SMMU and NACKs a fault, or writes it
// with the native copy engine and ACKs it; the completer (completer.ts) reads the answers and
// completes transfers; the fault unit (faults.ts, rxe_odp's role) owns every fault of either
// side: its record, the blocks waiting on it, parking a transfer until the fault library
// asks for the retransmission (terminate mode, the thesis's design) within the retry
// limits, and the answer's fan-out. In stall mode the copy thread blocks in a genuine
// userfaultfd fault until CMD_RESUME. Only packets, through the transport, pass between nodes.
import type { CostModel } from '../cost-model/index.js';
import { ModelResource } from '../cost-model/index.js';
import type { Packet } from '../fabric/packets.js';
import type { ResolveMethod } from '../netlink/messages.js';
import type { Transport } from '../fabric/transport.js';
import { Scheduler } from '../scheduler/scheduler.js';
import type { Smmu } from '../smmu/smmu.js';
import type { Tracer } from '../trace.js';
import { Completer } from '../rc/completer.js';
import type { CopyEngine, CopyTag } from './copy-engine.js';
import { Faults, type PageResponse, type SentAgain } from '../rc/faults.js';
import { Requester } from '../rc/requester.js';
import { RcTables } from '../rc/tables.js';
import { Responder } from '../rc/responder.js';
import {
  DmaStatus,
  type DmaCompletion,
  type DmaDescriptor,
  type EngineState,
  type FaultHook,
  type FaultInfo,
  type PldmaCounters,
  type PldmaOptions,
} from './types.js';

/** The fault-aware DMA engine (PLDMA) of one node: virtual channels, transfers split into blocks, NACKed blocks retransmitted once the fault is resolved, retry limits. */
export class Pldma {
  /** The node the engine belongs to. */
  readonly node: number;
  /** Virtual channels (1024 in the thesis's engine). */
  readonly channels: number;
  /** Bytes per block. */
  readonly blockSize: number;
  /** Faults one block may take before its transfer fails. */
  readonly retryLimit: number;
  /** A fault not answered in this time fails its transfer, ms. */
  readonly faultTimeoutMs: number;
  /** Blocks the engine has in flight at once. */
  readonly capacity: number;
  /** The round-robin channel scheduler (the firmware's). */
  readonly scheduler: Scheduler;
  #s: EngineState;
  #faults: Faults;
  #requester: Requester;
  #responder: Responder;
  #completer: Completer;
  #fenceCopies: (node: number, tag: CopyTag, timeoutMs?: number) => boolean;

  constructor(
    options: PldmaOptions,
    deps: {
      smmu: Smmu;
      transport: Transport;
      costs: CostModel;
      /** A hardware preset's hook in the fault path (types.ts FaultHook). */
      faultHook?: FaultHook;
      /** This node's copy engine (its responder's copy threads). */
      engine: CopyEngine;
      tracer: Tracer;
      clock: { now: number };
      tables?: RcTables;
      /**
       * In one process, where a transfer's payload is a view of this node's memory copied by
       * the destination node's threads: wait for those copies (true when none was held past
       * the timeout; a node in another process copies bytes it was sent, nothing to wait for).
       */
      fenceCopies?: (node: number, tag: CopyTag, timeoutMs?: number) => boolean;
    },
  ) {
    this.node = options.node;
    this.channels = options.channels ?? 1024;
    this.blockSize = options.blockSize ?? 4096;
    this.retryLimit = options.retryLimit ?? 7;
    this.faultTimeoutMs = options.faultTimeoutMs ?? 2000;
    this.capacity = options.engineSlots ?? 4;
    this.#fenceCopies = deps.fenceCopies ?? (() => true);
    const counters: PldmaCounters = {
      posted: 0,
      completed: 0,
      errors: 0,
      blocksIssued: 0,
      blocksAcked: 0,
      retransmittedBlocks: 0,
      faults: { source: 0, destination: 0 },
      nacksSent: 0,
      nacksReceived: 0,
      answersRefused: 0,
      packetsRefused: 0,
      retryTimeouts: 0,
    };
    const state: Omit<EngineState, 'scheduler'> = {
      node: this.node,
      channels: this.channels,
      blockSize: this.blockSize,
      retryLimit: this.retryLimit,
      faultTimeoutMs: this.faultTimeoutMs,
      smmu: deps.smmu,
      transport: deps.transport,
      costs: deps.costs,
      tracer: deps.tracer,
      clock: deps.clock,
      engineRes: new ModelResource(),
      chans: new Map(),
      transfers: new Map(),
      requests: new Map(),
      answers: new Map(),
      counters,
      closed: false,
      ...(deps.faultHook ? { faultHook: deps.faultHook } : {}),
    };
    this.#s = state as EngineState;
    // The fault unit ends a transfer through the completer (a retry limit, an unresolved fault).
    this.#faults = new Faults(this.#s, (t, onWire, status, reason, at, side) => this.#completer.fail(t, onWire, status, reason, at, side));
    this.#completer = new Completer(this.#s, this.#faults);
    this.#requester = new Requester(this.#s, this.#completer, this.#faults, this.capacity);
    this.scheduler = new Scheduler(this.#requester, this.channels);
    this.#s.scheduler = this.scheduler;
    this.#responder = new Responder({
      node: this.node,
      smmu: deps.smmu,
      transport: deps.transport,
      engine: deps.engine,
      costs: deps.costs,
      counters,
      faults: this.#faults,
      tables: deps.tables ?? new RcTables(),
      post: (d) => this.#requester.post(d),
      responded: (p, verdicts) => this.#completer.onResponse(p, verdicts),
      channels: this.channels,
    });
  }

  /** Blocks of this node's transfers on the wire, and copy jobs this node's responder runs. */
  get inflight(): number {
    return this.#completer.outstanding + this.#responder.jobs;
  }

  /** Transfers posted and not yet completed. */
  get active(): number {
    return this.#s.transfers.size;
  }

  /**
   * Post a descriptor. Never throws for bad input: a bad channel, length, node, protection
   * domain, address or permission ends in an error completion.
   */
  post(desc: DmaDescriptor): Promise<DmaCompletion> {
    return this.#requester.post(desc);
  }

  /** A packet for this node: a write for its responder, an answer for its completer. */
  onPacket(p: Packet): void {
    if (p.type === 'write') void this.#responder.onWrite(p);
    else if (p.type === 'ack') this.#completer.onAck(p);
  }

  /**
   * The fault library answered `info` (through this node's driver, as iommu_page_response):
   * the fault unit re-queues every source block waiting on that page and tells the sources
   * of the destination blocks. `sentAgain` hears when the block goes out again.
   */
  answer(info: FaultInfo, response: PageResponse, sentAgain?: SentAgain): void {
    this.#faults.answer(info, response, sentAgain);
  }

  /** When, modelled, the fault library's answer to `info` reached this node's engine (or SMMU, for a stalled access). */
  answeredAt(info: FaultInfo, method: ResolveMethod, bytes: number): number {
    return this.#faults.answeredAt(info, method, bytes);
  }

  /**
   * End every transfer QP `srcQp` posted on this node (DmaDescriptor.srcQp), as its QP is
   * destroyed: no run of them is sent again, the runs on the wire are refused where they
   * arrive (their payload revoked), and their copies already queued or running on this
   * process's engine are cancelled or waited for (the destination QP's copies: for an RC
   * connection, exactly this QP's). Each ends FLUSHED once its runs on the wire are answered.
   * False if a copy was still running after `timeoutMs` (a stall-mode copy held in a fault).
   */
  cancel(srcQp: number, timeoutMs?: number): boolean {
    const fences = new Map<string, { node: number; tag: CopyTag }>();
    for (const t of [...this.#s.transfers.values()]) {
      if (t.desc.srcQp !== srcQp || t.done) continue;
      for (const run of t.runs) run.payload.revoked = true;
      const d = t.desc;
      const tag: CopyTag | undefined = d.dstQp !== undefined ? { qp: d.dstQp } : d.key !== undefined ? { key: d.key } : undefined;
      if (tag) fences.set(`${d.dstNode}:${tag.qp}:${tag.key}`, { node: d.dstNode, tag });
      this.#completer.fail(t, false, DmaStatus.FLUSHED, `QP ${srcQp} of node ${this.node} was destroyed`, t.modelEnd, 'source');
    }
    // Its responses are done once sent: revoked through the QP, their copies fenced too.
    const answers = this.#s.answers.get(srcQp);
    if (answers) {
      answers.revoked = true;
      this.#s.answers.delete(srcQp);
      for (const peer of answers.peers.values()) fences.set(`${peer.node}:${peer.qp}:undefined`, { node: peer.node, tag: { qp: peer.qp } });
    }
    let ok = true;
    for (const f of fences.values()) ok = this.#fenceCopies(f.node, f.tag, timeoutMs) && ok;
    this.#responder.forget(srcQp);
    return ok;
  }

  /** The counters now. */
  counters(): PldmaCounters {
    const c = this.#s.counters;
    return { ...c, faults: { ...c.faults } };
  }

  /** Node `node` went away (its process or connection): its transfers end as an RC QP's whose retries ran out. */
  peerLost(node: number): void {
    for (const t of [...this.#s.transfers.values()])
      if (t.desc.dstNode === node) this.#completer.finish(t, DmaStatus.RETRY_EXCEEDED, `node ${node} went away (its connection shut down)`);
  }

  /** Complete every transfer with FLUSHED and refuse new ones. */
  close(): void {
    if (this.#s.closed) return;
    this.#s.closed = true;
    for (const t of [...this.#s.transfers.values()]) this.#completer.finish(t, DmaStatus.FLUSHED, 'the engine was closed');
    this.#faults.close();
  }

  /** @internal Free the atomic unit's register, once the copy engine that may write it has stopped. */
  release(): void {
    this.#responder.close();
  }
}
