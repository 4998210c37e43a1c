// The fault-aware PLDMA of one node: virtual channels, descriptors, transfers split into
// blocks. Every block is translated by the source SMMU (a read) and by the destination
// node's SMMU (a write) against the real state of memory, and its bytes are moved by the
// native copy engine. Terminate mode (the thesis's design): a faulting block aborts and is
// recorded, the transfer is parked while the engine serves other channels, and only the
// failed block is retransmitted once the fault library asks; a destination fault returns to
// the source as a NACK (ACK resp FAULT). The transfer completes when every block is
// acknowledged; a retry limit ends it with an error status. Stall mode: the copy thread
// blocks in a genuine userfaultfd fault until CMD_RESUME.
import { type CostModel, MODEL_LABEL, ModelResource, realNowUs } from '../cost-model/index.js';
import { AckResp, type Fabric, type Packet } from '../fabric/fabric.js';
import { Scheduler, type Schedulable } from '../scheduler/scheduler.js';
import { EvtId } from '../smmu/records.js';
import type { Access, Smmu, StallWindow, Translation } from '../smmu/smmu.js';
import type { Tracer } from '../trace.js';
import { type CopyEngine, CopyFlag, CopyStatus } from './copy-engine.js';
import type { MemoryLike } from '../memory.js';

/** Completion status of a DMA transfer. */
export enum DmaStatus {
  SUCCESS = 0,
  /** Source VA in no region of the protection domain (F_ADDR_SIZE at the source SMMU). */
  SRC_ADDR_ERR = 1,
  /** Source region not readable (F_PERMISSION). */
  SRC_PERM_ERR = 2,
  /** Destination VA in no region of the protection domain. */
  DST_ADDR_ERR = 3,
  /** Destination region not writable (e.g. read-only memory). */
  DST_PERM_ERR = 4,
  /** No stream for this protection domain (at the source or the destination). */
  PD_ERR = 5,
  BAD_NODE = 6,
  BAD_CHANNEL = 7,
  BAD_LENGTH = 8,
  /** The fault library answered that it could not resolve the fault. */
  FAULT_UNRESOLVED = 9,
  /** A block faulted more times than the retry limit allows. */
  RETRY_EXCEEDED = 10,
  /** A stalled access was ended by CMD_RESUME ABORT/TERM or CMD_STALL_TERM. */
  ABORTED = 11,
  /** The engine was closed (or the channel flushed) before the transfer completed. */
  FLUSHED = 12,
}

export type Side = 'source' | 'destination';

export interface DmaDescriptor {
  /** Virtual channel, 0 … channels-1. */
  channel: number;
  /** Source virtual address (in the posting process's memory on this node). */
  srcVa: bigint;
  dstNode: number;
  dstVa: bigint;
  length: number;
  /** Protection domain of the posting process: its stream translates the source. */
  pd: number;
  /** Protection domain whose stream translates the destination (default: `pd`, as ExaNet's PDID). */
  dstPd?: number;
  /**
   * Retransmissions allowed per block after destination faults (NACKs, like InfiniBand's
   * rnr_retry; default: the engine's retryLimit; Infinity: no limit). Source faults are the
   * engine's own and always use the engine's retryLimit.
   */
  retryLimit?: number;
  /** Ask for a completion notification at the destination too (ExaNet notif_enable). */
  notify?: boolean;
}

export interface FaultCounts {
  source: number;
  destination: number;
}

export interface DmaCompletion {
  tid: number;
  status: DmaStatus;
  statusName: string;
  /** Human-readable reason for an error status. */
  reason?: string;
  descriptor: DmaDescriptor;
  bytes: number;
  blocks: number;
  faults: FaultCounts;
  /** Blocks sent again after a fault (terminate) or accesses retried (stall). */
  retransmittedBlocks: number;
  /** NACKs received from the destination. */
  nacks: number;
  model: { startUs: number; endUs: number; us: number; label: string };
  /** Measured: whole transfer, and each fault from detection to the retransmission. */
  real: { us: number; faultUs: number[] };
}

interface Block {
  seq: number;
  offset: number;
  length: number;
  state: 'pending' | 'inflight' | 'parked' | 'acked';
  attempts: number;
  /** Faults taken by this block at each side (bounded by the retry limits). */
  srcFaults: number;
  dstNacks: number;
  ackAt: number;
  /** When this attempt was issued (modelled µs, real performance.now() ms), for the trace. */
  issuedUs: number;
  issuedMs: number;
}

interface Transfer {
  tid: number;
  desc: DmaDescriptor;
  blocks: Block[];
  next: number; // first block not yet acked, in order
  acked: number;
  inflight: number;
  parked: boolean;
  parkTimer: NodeJS.Timeout | undefined;
  faults: FaultCounts;
  retransmitted: number;
  nacks: number;
  modelStart: number;
  modelReady: number; // earliest modelled time the next block may issue
  modelEnd: number;
  realStart: number;
  faultStarted: number[]; // real µs at detection, per unresolved fault
  faultUs: number[];
  resolve: (c: DmaCompletion) => void;
  done: boolean;
  /** An error that ends the transfer once the blocks already in flight have landed. */
  failing: { status: DmaStatus; reason: string } | undefined;
  /** Stops listening to the poster's AbortSignal. */
  unlisten: (() => void) | undefined;
}

interface Channel {
  id: number;
  queue: Transfer[];
  cursor: number; // modelled time the channel may issue its next block
}

/** What the driver learns about a recorded fault to notify the right process. */
export interface FaultInfo {
  node: number;
  sid: number;
  side: Side;
  /** Node that posted the transfer and its transfer id. */
  srcNode: number;
  tid: number;
  channel: number;
  seq: number;
  va: bigint;
  write: boolean;
  /** Bytes of the transfer from the faulting address on (the Touch-Ahead hint). */
  lengthHint: number;
  /** Modelled time of detection, µs. */
  modelUs: number;
  stall?: { stag: number; window: StallWindow };
}

export interface PldmaOptions {
  node: number;
  /** Virtual channels (the real engine had 1024). */
  channels?: number;
  /** Block size in bytes (a multiple of the page size). */
  blockSize?: number;
  /** Times one block may be retransmitted after faults; Infinity for no limit. */
  retryLimit?: number;
  /** A parked transfer that hears nothing for this long retries on its own (ms). */
  faultTimeoutMs?: number;
  /** Blocks in flight at once on the engine. */
  engineSlots?: number;
}

export interface PldmaPeers {
  pldma(node: number): Pldma | undefined;
}

export interface PldmaCounters {
  posted: number;
  completed: number;
  errors: number;
  blocksIssued: number;
  blocksAcked: number;
  retransmittedBlocks: number;
  faults: FaultCounts;
  nacksSent: number;
  nacksReceived: number;
  retryTimeouts: number;
}

/** Blocks one copy-engine job may carry (a run of translated, contiguous blocks). */
const MAX_RUN_BLOCKS = 64;

/** The destination's answer to a block's write: translated, or refused (NACK / error ACK). */
interface Accepted {
  ok: true;
  region: MemoryLike;
  offset: number;
  sid: number;
  walkUs: number;
  stall: boolean;
  openStall: () => StallWindow;
}
interface Refused {
  ok: false;
  resp: AckResp;
  status: DmaStatus;
  reason: string;
  at: number;
}

/** A block whose translations held at both ends, on its way to the copy engine. */
interface Sent {
  b: Block;
  peer: Pldma;
  srcSid: number;
  src: Extract<Translation, { ok: true }>;
  dst: Accepted;
  issueAt: number;
  arrive: number;
  srcWin?: StallWindow;
  dstWin?: StallWindow;
}

/** True if `s` continues `prev` at both ends, so one copy can carry both. */
function follows(prev: Sent, s: Sent): boolean {
  return (
    s.src.region === prev.src.region &&
    s.dst.region === prev.dst.region &&
    s.src.offset === prev.src.offset + prev.b.length &&
    s.dst.offset === prev.dst.offset + prev.b.length
  );
}

const STATUS_FOR: Partial<Record<EvtId, { read: DmaStatus; write: DmaStatus }>> = {
  [EvtId.F_ADDR_SIZE]: { read: DmaStatus.SRC_ADDR_ERR, write: DmaStatus.DST_ADDR_ERR },
  [EvtId.F_PERMISSION]: { read: DmaStatus.SRC_PERM_ERR, write: DmaStatus.DST_PERM_ERR },
  [EvtId.C_BAD_STREAMID]: { read: DmaStatus.PD_ERR, write: DmaStatus.PD_ERR },
};

export class Pldma implements Schedulable {
  readonly node: number;
  readonly channels: number;
  readonly blockSize: number;
  readonly retryLimit: number;
  readonly faultTimeoutMs: number;
  readonly capacity: number;
  readonly scheduler: Scheduler;
  #smmu: Smmu;
  #fabric: Fabric;
  #costs: CostModel;
  #engine: CopyEngine;
  #peers: PldmaPeers;
  #tracer: Tracer;
  #clock: { now: number };
  #engineRes = new ModelResource();
  #chans = new Map<number, Channel>();
  #transfers = new Map<number, Transfer>();
  // Transfers waiting on each faulting page (`sid:va`): one resolution serves them all.
  #faultInfo = new Map<string, FaultInfo[]>();
  #nextTid = 1;
  #jobs = 0; // copy-engine jobs in flight
  #closed = false;
  #c: PldmaCounters = {
    posted: 0,
    completed: 0,
    errors: 0,
    blocksIssued: 0,
    blocksAcked: 0,
    retransmittedBlocks: 0,
    faults: { source: 0, destination: 0 },
    nacksSent: 0,
    nacksReceived: 0,
    retryTimeouts: 0,
  };

  constructor(
    options: PldmaOptions,
    deps: { smmu: Smmu; fabric: Fabric; costs: CostModel; engine: CopyEngine; peers: PldmaPeers; tracer: Tracer; clock: { now: number } },
  ) {
    this.node = options.node;
    this.channels = options.channels ?? 1024;
    this.blockSize = options.blockSize ?? 4096;
    this.retryLimit = options.retryLimit ?? 7;
    this.faultTimeoutMs = options.faultTimeoutMs ?? 2000;
    this.capacity = options.engineSlots ?? 4;
    this.#smmu = deps.smmu;
    this.#fabric = deps.fabric;
    this.#costs = deps.costs;
    this.#engine = deps.engine;
    this.#peers = deps.peers;
    this.#tracer = deps.tracer;
    this.#clock = deps.clock;
    this.scheduler = new Scheduler(this, this.channels);
  }

  /** Copy-engine jobs in flight (the scheduler's capacity is in jobs). */
  get inflight(): number {
    return this.#jobs;
  }

  /** Transfers posted and not yet completed. */
  get active(): number {
    return this.#transfers.size;
  }

  /**
   * Post a descriptor. Never throws for bad input: a bad channel, length, node, protection
   * domain, address or permission ends in an error completion. Aborting `signal` (its queue
   * pair was destroyed) ends the transfer FLUSHED once the blocks already in the copy engine
   * have landed: nothing is sent or retransmitted after it.
   */
  post(desc: DmaDescriptor, options: { signal?: AbortSignal } = {}): Promise<DmaCompletion> {
    const tid = this.#nextTid++;
    this.#c.posted++;
    return new Promise<DmaCompletion>((resolve) => {
      const start = Math.max(this.#clock.now, 0) + this.#costs.doorbellUs;
      const t: Transfer = {
        tid,
        desc: { ...desc },
        blocks: [],
        next: 0,
        acked: 0,
        inflight: 0,
        parked: false,
        parkTimer: undefined,
        faults: { source: 0, destination: 0 },
        retransmitted: 0,
        nacks: 0,
        modelStart: start - this.#costs.doorbellUs,
        modelReady: start,
        modelEnd: start,
        realStart: realNowUs(),
        faultStarted: [],
        faultUs: [],
        resolve,
        done: false,
        failing: undefined,
        unlisten: undefined,
      };
      const bad = options.signal?.aborted ? { status: DmaStatus.FLUSHED, reason: 'the transfer was cancelled before it was posted' } : this.#validate(desc);
      if (bad) {
        this.#finish(t, bad.status, bad.reason);
        return;
      }
      for (let off = 0, seq = 0; off < desc.length; off += this.blockSize, seq++) {
        t.blocks.push({ seq, offset: off, length: Math.min(this.blockSize, desc.length - off), state: 'pending', attempts: 0, srcFaults: 0, dstNacks: 0, ackAt: 0, issuedUs: 0, issuedMs: 0 });
      }
      this.#transfers.set(tid, t);
      let ch = this.#chans.get(desc.channel);
      if (!ch) {
        ch = { id: desc.channel, queue: [], cursor: 0 };
        this.#chans.set(desc.channel, ch);
      }
      ch.queue.push(t);
      const signal = options.signal;
      if (signal) {
        const cancel = () => this.#fail(t, undefined, DmaStatus.FLUSHED, 'the transfer was cancelled (its queue pair was destroyed)', t.modelEnd);
        signal.addEventListener('abort', cancel, { once: true });
        t.unlisten = () => signal.removeEventListener('abort', cancel);
      }
      this.#trace('post', t, { modelUs: start });
      this.scheduler.wake(desc.channel);
    });
  }

  // ---- Schedulable ---------------------------------------------------------------------

  runnable(channel: number): boolean {
    const t = this.#chans.get(channel)?.queue[0];
    if (!t || t.parked || t.done || t.failing) return false;
    // One block of a transfer in flight at a time: a fault parks the transfer before any
    // later block of it goes out, so each non-resident page faults exactly once.
    // While it is neither parked nor in flight, every block not acked is pending.
    return t.inflight === 0 && t.acked < t.blocks.length;
  }

  /**
   * Issue the next blocks of the channel's transfer. Each block is translated on its own,
   * in order (its modelled costs, its faults); the consecutive blocks whose translations
   * hold at both ends then go to the copy engine as one job, so the real cost of a native
   * thread hand-off is paid per run of blocks, not per block. A block that faults ends the
   * run: the transfer parks (terminate) while the blocks before it are copied. Stall-mode
   * blocks go one per job: each has its own stall window.
   */
  issue(channel: number): void {
    const ch = this.#chans.get(channel)!;
    const t = ch.queue[0]!;
    let run: Sent[] = [];
    for (let i = t.next; i < t.blocks.length; i++) {
      const b = t.blocks[i]!;
      if (b.state !== 'pending') continue;
      if (run.length >= MAX_RUN_BLOCKS || t.parked || t.done) break;
      this.#start(ch, t, b);
      const s = this.#send(ch, t, b);
      if (!s) break;
      if (run.length && !follows(run[run.length - 1]!, s)) {
        void this.#copy(t, run);
        run = [];
      }
      run.push(s);
      if (s.srcWin || s.dstWin) break;
    }
    if (run.length) void this.#copy(t, run);
  }

  #start(ch: Channel, t: Transfer, b: Block): void {
    b.state = 'inflight';
    b.attempts++;
    if (b.attempts > 1) {
      t.retransmitted++;
      this.#c.retransmittedBlocks++;
      this.#trace('retransmit', t, { modelUs: Math.max(ch.cursor, t.modelReady), detail: { seq: b.seq, attempt: b.attempts, srcNode: this.node } });
      const started = t.faultStarted.shift();
      if (started !== undefined) t.faultUs.push(realNowUs() - started);
    }
    t.inflight++;
    this.#c.blocksIssued++;
    if (this.#tracer.active) {
      b.issuedUs = Math.max(ch.cursor, t.modelReady);
      b.issuedMs = performance.now();
      this.#trace('block', t, { modelUs: b.issuedUs, detail: { seq: b.seq, attempt: b.attempts } });
    }
  }

  // Translate one block at both ends (modelled time advances); undefined if it faulted or
  // failed, which is then already handled (parked, NACKed or completed with an error).
  #send(ch: Channel, t: Transfer, b: Block): Sent | undefined {
    const c = this.#costs;
    const d = t.desc;
    const issueAt = Math.max(ch.cursor, t.modelReady);
    const srcCtx = this.#smmu.streamForPd(d.pd)!;
    const srcTr = this.#smmu.translate(srcCtx.sid, d.srcVa + BigInt(b.offset), b.length, 'read');
    const engineDone = this.#engineRes.reserve(issueAt, c.scheduleUs + this.#walkCost(srcTr) + c.blockUs);
    ch.cursor = engineDone;
    if (!srcTr.ok) {
      this.#blockFault(t, b, 'source', srcCtx.sid, srcTr, issueAt + c.scheduleUs + this.#walkCost(srcTr), 'read');
      return undefined;
    }
    const peer = this.#peers.pldma(d.dstNode)!;
    const arrive = this.#fabric.transmit(this.node, d.dstNode, b.length, engineDone);
    const verdict = peer.#acceptWrite(t, b, this.node, arrive);
    if (!verdict.ok) {
      // NACK / error ACK back to the source.
      const nackAt = verdict.at + c.linkLatencyUs;
      if (verdict.resp === AckResp.FAULT) {
        t.nacks++;
        this.#c.nacksReceived++;
        this.#trace('nack', t, { side: 'destination', modelUs: nackAt, detail: { seq: b.seq } });
        this.#park(t, b, nackAt, 'destination');
      } else {
        this.#fail(t, b, verdict.status, verdict.reason, nackAt);
      }
      return undefined;
    }
    const s: Sent = { b, peer, srcSid: srcCtx.sid, src: srcTr, dst: verdict, issueAt, arrive };
    if (srcCtx.faultModel === 'stall') {
      s.srcWin = this.#smmu.beginStallWindow({
        sid: srcCtx.sid,
        region: srcTr.region,
        offset: srcTr.offset,
        length: b.length,
        access: 'read',
        tag: this.#info(t, b, 'source', srcCtx.sid, d.srcVa + BigInt(b.offset), false, engineDone),
      });
    }
    if (verdict.stall) s.dstWin = verdict.openStall();
    return s;
  }

  // One copy-engine job for a run of blocks contiguous at both ends. Terminate-mode sides
  // are walked again by the copy thread right before copying (a page evicted meanwhile is a
  // fault, not silent zeros); stall-mode sides are left to fault for real.
  async #copy(t: Transfer, run: Sent[]): Promise<void> {
    const c = this.#costs;
    const first = run[0]!;
    const length = run.reduce((n, s) => n + s.b.length, 0);
    const flags = (first.srcWin ? 0 : CopyFlag.CheckSource) | (first.dst.stall ? 0 : CopyFlag.CheckDest);
    this.#jobs++;
    let r;
    try {
      r = await this.#engine.copy(first.src.region, first.src.offset, first.dst.region, first.dst.offset, length, flags);
    } catch {
      r = { status: -1 as CopyStatus, faultOffset: -1, ns: 0, tid: 0 };
    } finally {
      this.#jobs--;
      if (first.srcWin) this.#smmu.endStallWindow(first.srcWin);
      if (first.dstWin) first.peer.#smmu.endStallWindow(first.dstWin);
    }
    if (t.done) return;
    const srcWin = first.srcWin;
    const dstWin = first.dstWin;
    const stalls = (srcWin?.stalls ?? 0) + (dstWin?.stalls ?? 0);
    const stallDelay = stalls * this.#stallDelay();
    if (stalls) {
      // A stalled access holds the engine until the resume: later blocks wait behind it.
      this.#engineRes.reserve(first.arrive, stallDelay);
      t.modelReady = Math.max(t.modelReady, first.arrive + stallDelay);
      // Each stall is a fault whose access was retried in place (no retransmission).
      t.faults.source += srcWin?.stalls ?? 0;
      t.faults.destination += dstWin?.stalls ?? 0;
      this.#c.faults.source += srcWin?.stalls ?? 0;
      first.peer.#c.faults.destination += dstWin?.stalls ?? 0;
    }
    if (srcWin?.aborted || dstWin?.aborted) {
      this.#fail(t, first.b, DmaStatus.ABORTED, `a stalled ${srcWin?.aborted ? 'source read' : 'destination write'} was aborted (CMD_RESUME ABORT/TERM or CMD_STALL_TERM)`, first.arrive + stallDelay);
      return;
    }
    if (r.status !== CopyStatus.Ok && r.status !== CopyStatus.SourceFault && r.status !== CopyStatus.DestFault) {
      for (const x of run) {
        x.b.state = 'pending';
        t.inflight--;
      }
      this.#fail(t, undefined, DmaStatus.FLUSHED, 'the copy engine was closed', first.arrive);
      return;
    }
    // The copy thread stops at the first page it finds missing: blocks before it were
    // copied, the block holding it faults, blocks after it were never sent.
    const side = r.status === CopyStatus.SourceFault ? 'source' : 'destination';
    let faulted = -1;
    if (r.status !== CopyStatus.Ok) {
      faulted = run.findIndex((s) => {
        const at = side === 'source' ? s.src.offset : s.dst.offset;
        return r.faultOffset < at + s.b.length;
      });
      if (faulted < 0) faulted = run.length - 1;
    }
    run.forEach((s, i) => {
      if (faulted < 0 || i < faulted) this.#ack(t, s.b, s.arrive + s.dst.walkUs + stallDelay + c.linkLatencyUs);
      else if (i > faulted) {
        s.b.state = 'pending';
        s.b.attempts--;
        t.inflight--;
      }
    });
    if (faulted < 0) return this.#settle(t);
    const s = run[faulted]!;
    if (side === 'source') {
      const tr: Translation = { ok: false, id: EvtId.F_TRANSLATION, addr: s.src.region.address + BigInt(r.faultOffset), recoverable: true, reason: 'source page evicted before the copy' };
      this.#smmu.iotlb.invalidateRange(tr.addr, s.src.region.pageSize, s.src.region.pageSize);
      this.#blockFault(t, s.b, 'source', s.srcSid, tr, s.issueAt + c.scheduleUs, 'read');
    } else {
      const tr: Translation = { ok: false, id: EvtId.F_TRANSLATION, addr: s.dst.region.address + BigInt(r.faultOffset), recoverable: true, reason: 'destination page evicted before the write' };
      s.peer.#smmu.iotlb.invalidateRange(tr.addr, s.dst.region.pageSize, s.dst.region.pageSize);
      s.peer.#destinationFault(t, s.b, this.node, s.dst.sid, tr, s.arrive);
      t.nacks++;
      this.#c.nacksReceived++;
      this.#park(t, s.b, s.arrive + c.linkLatencyUs, 'destination');
    }
    this.#settle(t);
  }

  // Destination side: translate the incoming write on this node's SMMU.
  #acceptWrite(
    t: Transfer,
    b: Block,
    srcNode: number,
    arrive: number,
  ): Accepted | Refused {
    const d = t.desc;
    const pd = d.dstPd ?? d.pd;
    const ctx = this.#smmu.streamForPd(pd);
    if (!ctx) {
      return { ok: false, resp: AckResp.PD_ERR, status: DmaStatus.PD_ERR, reason: `node ${this.node} has no stream for protection domain ${pd}`, at: arrive };
    }
    const va = d.dstVa + BigInt(b.offset);
    const tr = this.#smmu.translate(ctx.sid, va, b.length, 'write');
    const walkUs = this.#walkCost(tr);
    if (!tr.ok) {
      if (tr.recoverable) {
        this.#destinationFault(t, b, srcNode, ctx.sid, tr, arrive + walkUs);
        return { ok: false, resp: AckResp.FAULT, status: DmaStatus.SUCCESS, reason: tr.reason, at: arrive + walkUs };
      }
      this.#smmu.recordFault(ctx.sid, tr, 'write');
      const status = STATUS_FOR[tr.id]?.write ?? DmaStatus.DST_ADDR_ERR;
      return { ok: false, resp: status === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : AckResp.ADDR_ERR, status, reason: tr.reason, at: arrive + walkUs };
    }
    const stall = ctx.faultModel === 'stall';
    return {
      ok: true,
      region: tr.region,
      offset: tr.offset,
      sid: ctx.sid,
      walkUs,
      stall,
      openStall: () =>
        this.#smmu.beginStallWindow({
          sid: ctx.sid,
          region: tr.region,
          offset: tr.offset,
          length: b.length,
          access: 'write',
          tag: this.#info(t, b, 'destination', ctx.sid, va, true, arrive, srcNode),
        }),
    };
  }

  #destinationFault(t: Transfer, b: Block, srcNode: number, sid: number, tr: Extract<Translation, { ok: false }>, at: number): void {
    t.faults.destination++;
    this.#c.faults.destination++;
    this.#c.nacksSent++;
    t.faultStarted.push(realNowUs());
    this.#waitOn(this.#info(t, b, 'destination', sid, tr.addr, true, at, srcNode));
    this.#trace('fault', t, { side: 'destination', modelUs: at, detail: { seq: b.seq, va: tr.addr, srcNode, issuedUs: b.issuedUs, issuedMs: b.issuedMs } }, this.node);
    this.#smmu.recordFault(sid, tr, 'write');
  }

  #blockFault(t: Transfer, b: Block, side: Side, sid: number, tr: Extract<Translation, { ok: false }>, at: number, access: Access): void {
    if (!tr.recoverable) {
      this.#smmu.recordFault(sid, tr, access);
      const status = STATUS_FOR[tr.id]?.[access] ?? DmaStatus.SRC_ADDR_ERR;
      this.#fail(t, b, status, tr.reason, at);
      return;
    }
    t.faults[side]++;
    this.#c.faults[side]++;
    t.faultStarted.push(realNowUs());
    this.#waitOn(this.#info(t, b, side, sid, tr.addr, false, at));
    this.#trace('fault', t, { side, modelUs: at, detail: { seq: b.seq, va: tr.addr, srcNode: this.node, issuedUs: b.issuedUs, issuedMs: b.issuedMs } });
    this.#park(t, b, at, side);
    this.#smmu.recordFault(sid, tr, access);
  }

  #info(t: Transfer, b: Block, side: Side, sid: number, va: bigint, write: boolean, at: number, srcNode = this.node): FaultInfo {
    const base = side === 'source' ? t.desc.srcVa : t.desc.dstVa;
    return {
      node: this.node,
      sid,
      side,
      srcNode,
      tid: t.tid,
      channel: t.desc.channel,
      seq: b.seq,
      va,
      write,
      lengthHint: Math.max(0, t.desc.length - Number(va - base)),
      modelUs: at,
    };
  }

  // The failed block waits for the retransmission request (or the timeout).
  #park(t: Transfer, b: Block, at: number, side: Side): void {
    b.state = 'parked';
    t.parked = true;
    t.inflight--;
    t.modelReady = Math.max(t.modelReady, at);
    const faults = side === 'source' ? ++b.srcFaults : ++b.dstNacks;
    const limit = side === 'source' ? this.retryLimit : (t.desc.retryLimit ?? this.retryLimit);
    if (faults > limit) {
      this.#fail(t, b, DmaStatus.RETRY_EXCEEDED, `block ${b.seq} took ${faults} ${side} faults (retry limit ${limit})`, at);
      return;
    }
    clearTimeout(t.parkTimer);
    t.parkTimer = setTimeout(() => {
      // Nobody answered (no fault library, a dropped notification): retry anyway, like an
      // RNR timer; the retry limit bounds it.
      if (t.done || !t.parked) return;
      this.#c.retryTimeouts++;
      this.#unpark(t, t.modelReady);
    }, this.faultTimeoutMs);
    t.parkTimer.unref?.();
    this.scheduler.kick();
  }

  #unpark(t: Transfer, at: number): void {
    if (t.done) return;
    clearTimeout(t.parkTimer);
    t.parkTimer = undefined;
    for (let i = t.next; i < t.blocks.length; i++) if (t.blocks[i]!.state === 'parked') t.blocks[i]!.state = 'pending';
    t.parked = false;
    t.modelReady = Math.max(t.modelReady, at);
    this.scheduler.wake(t.desc.channel);
  }

  #ack(t: Transfer, b: Block, ackAt: number): void {
    b.state = 'acked';
    b.ackAt = ackAt;
    t.inflight--;
    this.#c.blocksAcked++;
    t.modelEnd = Math.max(t.modelEnd, ackAt);
    t.acked++;
    while (t.blocks[t.next]?.state === 'acked') t.next++;
    if (t.acked === t.blocks.length) this.#finish(t, DmaStatus.SUCCESS);
    else this.scheduler.kick();
  }

  #fail(t: Transfer, b: Block | undefined, status: DmaStatus, reason: string, at: number): void {
    if (b && b.state === 'inflight') {
      b.state = 'pending';
      t.inflight--;
    }
    t.modelEnd = Math.max(t.modelEnd, at);
    // Blocks sent before this one are still being copied: complete after they land, so the
    // completion counts exactly the bytes that arrived.
    t.failing ??= { status, reason };
    this.#settle(t);
  }

  #settle(t: Transfer): void {
    if (t.failing && t.inflight === 0) this.#finish(t, t.failing.status, t.failing.reason);
  }

  #finish(t: Transfer, status: DmaStatus, reason?: string): void {
    if (t.done) return;
    t.done = true;
    clearTimeout(t.parkTimer);
    t.unlisten?.();
    this.#transfers.delete(t.tid);
    const ch = this.#chans.get(t.desc.channel);
    if (ch) {
      const i = ch.queue.indexOf(t);
      if (i >= 0) ch.queue.splice(i, 1);
      if (!ch.queue.length) this.scheduler.retire(ch.id);
      else this.scheduler.wake(ch.id);
      // Its engine slot is free: channels held back by the capacity limit may issue now.
      this.scheduler.kick();
    }
    if (status === DmaStatus.SUCCESS) this.#c.completed++;
    else this.#c.errors++;
    this.#clock.now = Math.max(this.#clock.now, t.modelEnd);
    const completion: DmaCompletion = {
      tid: t.tid,
      status,
      statusName: DmaStatus[status],
      descriptor: t.desc,
      bytes: status === DmaStatus.SUCCESS ? t.desc.length : t.blocks.filter((x) => x.state === 'acked').reduce((s, x) => s + x.length, 0),
      blocks: t.blocks.length,
      faults: { ...t.faults },
      retransmittedBlocks: t.retransmitted,
      nacks: t.nacks,
      model: { startUs: t.modelStart, endUs: t.modelEnd, us: t.modelEnd - t.modelStart, label: MODEL_LABEL },
      real: { us: realNowUs() - t.realStart, faultUs: t.faultUs },
    };
    if (reason) completion.reason = reason;
    this.#trace('complete', t, { modelUs: t.modelEnd, detail: { status: completion.statusName } });
    t.resolve(completion);
  }

  #validate(d: DmaDescriptor): { status: DmaStatus; reason: string } | undefined {
    if (this.#closed) return { status: DmaStatus.FLUSHED, reason: 'the engine is closed' };
    if (!Number.isInteger(d.channel) || d.channel < 0 || d.channel >= this.channels)
      return { status: DmaStatus.BAD_CHANNEL, reason: `channel ${d.channel} is not in 0..${this.channels - 1}` };
    if (!Number.isSafeInteger(d.length) || d.length <= 0) return { status: DmaStatus.BAD_LENGTH, reason: `length ${d.length} must be a positive integer` };
    if (typeof d.srcVa !== 'bigint' || d.srcVa < 0n) return { status: DmaStatus.SRC_ADDR_ERR, reason: 'srcVa must be a non-negative bigint' };
    if (typeof d.dstVa !== 'bigint' || d.dstVa < 0n) return { status: DmaStatus.DST_ADDR_ERR, reason: 'dstVa must be a non-negative bigint' };
    if (!Number.isInteger(d.dstNode) || !this.#fabric.hasNode(d.dstNode) || !this.#peers.pldma(d.dstNode))
      return { status: DmaStatus.BAD_NODE, reason: `node ${d.dstNode} is not on the fabric` };
    if (!this.#smmu.streamForPd(d.pd)) return { status: DmaStatus.PD_ERR, reason: `node ${this.node} has no stream for protection domain ${d.pd}` };
    return undefined;
  }

  #walkCost(tr: Translation): number {
    return tr.ok && tr.hit ? this.#costs.iotlbHitUs : this.#costs.walkUs * Math.max(1, tr.ok ? tr.walked : 1);
  }

  // Modelled delay of a stalled access: the whole fault path and the resume.
  #stallDelay(): number {
    const c = this.#costs;
    return c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + c.touchPageUs + c.requestUs + c.resumeUs;
  }

  // ---- from the SMMU driver and the fabric ----------------------------------------------

  /** The driver looks up what a recorded (terminate-mode) fault belongs to. */
  faultInfo(sid: number, va: bigint): FaultInfo | undefined {
    return this.#faultInfo.get(`${sid}:${va}`)?.at(-1);
  }

  /**
   * The fault library answered (through the driver). `modelUs` is when, in modelled time,
   * the answer reached the engine. Source side: re-queue the failed block. Destination
   * side: tell the source over the fabric (ACK resp RESOLVED / UNRESOLVED).
   */
  resolved(info: FaultInfo, ok: boolean, modelUs: number): void {
    const key = `${info.sid}:${info.va}`;
    // Several transfers may have faulted on the same page before the answer: it serves them
    // all (the driver merges their notifications into one pending fault).
    const waiters = this.#faultInfo.get(key) ?? [info];
    this.#faultInfo.delete(key);
    for (const w of waiters) this.#resolvedOne(w, ok, modelUs);
  }

  #waitOn(info: FaultInfo): void {
    const key = `${info.sid}:${info.va}`;
    const list = this.#faultInfo.get(key);
    if (list) list.push(info);
    else this.#faultInfo.set(key, [info]);
  }

  #resolvedOne(info: FaultInfo, ok: boolean, modelUs: number): void {
    if (info.side === 'source') {
      const t = this.#transfers.get(info.tid);
      if (!t || t.blocks[info.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
      this.#trace('resolved', t, { side: 'source', modelUs, detail: { seq: info.seq, srcNode: info.srcNode } });
      if (ok) this.#unpark(t, modelUs);
      else this.#fail(t, undefined, DmaStatus.FAULT_UNRESOLVED, `the fault library could not resolve the source fault at 0x${info.va.toString(16)}`, modelUs);
      return;
    }
    this.#tracer.emit({ kind: 'resolved', node: this.node, tid: info.tid, channel: info.channel, side: 'destination', modelUs, detail: { seq: info.seq, srcNode: info.srcNode } });
    this.#fabric.send(
      { type: 'ack', src: this.node, dst: info.srcNode, pd: 0, va: info.va, tid: info.tid, seq: info.seq, length: 0, resp: ok ? AckResp.RESOLVED : AckResp.UNRESOLVED },
      modelUs,
    );
  }

  /** A packet for this node (control ACKs from destinations). */
  onPacket(p: Packet): void {
    if (p.type !== 'ack') return;
    const t = this.#transfers.get(p.tid);
    if (!t || t.blocks[p.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
    if (p.resp === AckResp.RESOLVED) this.#unpark(t, p.arrivesAt);
    else if (p.resp === AckResp.UNRESOLVED)
      this.#fail(t, undefined, DmaStatus.FAULT_UNRESOLVED, `node ${p.src}'s fault library could not resolve the destination fault`, p.arrivesAt);
  }

  counters(): PldmaCounters {
    return { ...this.#c, faults: { ...this.#c.faults } };
  }

  /** Complete every transfer with FLUSHED and refuse new ones. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const t of [...this.#transfers.values()]) this.#finish(t, DmaStatus.FLUSHED, 'the engine was closed');
  }

  #trace(kind: Parameters<Tracer['emit']>[0]['kind'], t: Transfer, e: { side?: Side; modelUs: number; detail?: Record<string, unknown> }, node = this.node): void {
    if (!this.#tracer.active) return;
    const ev: Parameters<Tracer['emit']>[0] = { kind, node, tid: t.tid, channel: t.desc.channel, modelUs: e.modelUs };
    if (e.side) ev.side = e.side;
    if (e.detail) ev.detail = e.detail;
    this.#tracer.emit(ev);
  }
}
