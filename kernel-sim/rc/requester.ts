// The requester (rxe_req), in two halves. WqeRequester (below) is a QP's: at the doorbell it
// reads the QP's send ring from its own index, checks each WQE's local SGEs in the node's MR
// table, and posts the WQE as RC transfers on the node's engine. Requester is the engine's
// (one per node's PLDMA): it takes those descriptors and, on the scheduler's turn, translates
// the source of the channel's transfer's next run of blocks on this node's SMMU (one call for
// the run) and sends the run to the destination as one write packet carrying its payload. A
// transfer keeps its pending blocks as a cursor, not an object per block: only a block that
// faulted gets state of its own. Up to RUNS_IN_FLIGHT runs of a transfer are on the wire at
// once, answered in order: a fault (at either end) stops the transfer before a later block is
// written, so each missing page faults once; retransmission after a fault is the same path.
// It never sees the destination's SMMU, engine or memory map: only the answers to its
// packets, which the completer reads.
import { realNowUs } from '../cost-model/index.js';
import { hasRemoteRange, isResponse, RcOp, type WritePacket } from '../fabric/packets.js';
import type { Schedulable } from '../scheduler/scheduler.js';
import type { Completer, Executed, WqeCompleter } from './completer.js';
import { mrPlace, type RcPd, type RcTables } from './tables.js';
import { Access, QpState, SendFlags, UD_MTU, WcStatus, WrOpcode } from '../device/ib.js';
import type { Sge } from '../device/rings.js';
import type { SendRing, SendWqe } from '../device/send-ring.js';
import type { Fault, Faults } from './faults.js';
import type { RunSpans, StallWindow, StreamContext } from '../smmu/smmu.js';
import type { MemoryLike } from '../memory.js';
import {
  type Channel,
  type DmaCompletion,
  type DmaDescriptor,
  DmaStatus,
  type EngineState,
  MAX_RUN_BLOCKS,
  NO_MEMORY,
  type PayloadView,
  type SentRun,
  requestKey,
  RUNS_IN_FLIGHT,
  traceTransfer,
  type Transfer,
  walkCost,
  walkedCost,
} from '../pldma/types.js';

/** The end of the 64-bit address space. */
const SPACE = 1n << 64n;

/** A run's modelled plan: per block its engine cost, issue and arrival times; the bytes; where the channel, engine and link are free after it; when the next block would issue. */
interface RunPlan {
  costs: Float64Array;
  issued: Float64Array;
  arrivals: Float64Array;
  bytes: number;
  cursor: number;
  engineFree: number;
  linkFree: number;
  nextAt: number;
}

export class Requester implements Schedulable {
  readonly capacity: number;
  #s: EngineState;
  #completer: Completer;
  #faults: Faults;
  #nextTid = 1;

  constructor(state: EngineState, completer: Completer, faults: Faults, engineSlots: number) {
    this.#s = state;
    this.#completer = completer;
    this.#faults = faults;
    this.capacity = engineSlots;
  }

  /** Write packets on the wire (the scheduler's capacity is in these). */
  get inflight(): number {
    return this.#completer.outstanding;
  }

  post(desc: DmaDescriptor): Promise<DmaCompletion> {
    const s = this.#s;
    const tid = this.#nextTid++;
    s.counters.posted++;
    return new Promise<DmaCompletion>((resolve) => {
      const start = Math.max(s.clock.now, 0) + s.costs.doorbellUs;
      const t: Transfer = {
        tid,
        desc: { ...desc },
        blocks: 0,
        cursor: 0,
        acked: 0,
        ackedBytes: 0,
        inflight: 0,
        runs: [],
        plan: { cursor: 0, engine: 0, link: 0 },
        own: new Map(),
        parked: false,
        parkedSeq: -1,
        parkTimer: undefined,
        faults: { source: 0, destination: 0 },
        retransmitted: 0,
        pagesFetched: 0,
        nacks: 0,
        modelStart: start - s.costs.doorbellUs,
        modelReady: start,
        modelEnd: start,
        realStart: realNowUs(),
        faultStarted: [],
        faultUs: [],
        resolve,
        done: false,
        failing: undefined,
        held: undefined,
        runLimit: MAX_RUN_BLOCKS,
      };
      const bad = this.#validate(desc);
      if (bad) {
        this.#completer.finish(t, bad.status, bad.reason);
        return;
      }
      // An empty RC message is one packet with no bytes.
      t.blocks = Math.max(1, Math.ceil(desc.length / s.blockSize));
      s.transfers.set(tid, t);
      // A READ or an atomic is answered by its response, which names it by QP and PSN.
      if ((desc.opcode === RcOp.READ_REQUEST || desc.opcode === RcOp.ATOMIC) && desc.srcQp !== undefined && desc.psn !== undefined) {
        t.answer = { landed: 0, sink: 0, within: 0, faultedAt: -1, srcFaults: new Map(), refault: undefined };
        s.requests.set(requestKey(desc.srcQp, desc.psn), t);
        if (desc.responseTimeout) this.#completer.armResponseTimer(t, desc.responseTimeout);
      }
      let ch = s.chans.get(desc.channel);
      if (!ch) {
        ch = { id: desc.channel, queue: [], cursor: 0 };
        s.chans.set(desc.channel, ch);
      }
      ch.queue.push(t);
      // Checked here: the event's objects are not even built while nobody listens.
      if (s.tracer.active) traceTransfer(s.tracer, 'post', s.node, tid, desc.channel, { modelUs: start });
      s.scheduler.wake(desc.channel);
    });
  }

  runnable(channel: number): boolean {
    const t = this.#s.chans.get(channel)?.queue[0];
    if (!t || t.parked || t.done || t.failing || t.held || t.cursor >= t.blocks) return false;
    const n = t.runs.length;
    return n === 0 || (n < RUNS_IN_FLIGHT && t.runLimit === MAX_RUN_BLOCKS && t.runs[n - 1]!.window === undefined);
  }

  /**
   * Issue the channel's transfer's next run: its next blocks from the cursor, their source
   * translated in one call (each block's walk and fault as if alone), sent as one write
   * packet. Each block's modelled engine and link time is planned here in one numeric loop
   * (from where the runs already on the wire end) and reserved when its answer comes back,
   * in order, so a block the responder did not get to costs nothing. A source fault ends the
   * run (held until the runs before it have landed); a stall-mode block goes alone (it has a
   * stall window of its own).
   */
  issue(channel: number): void {
    const s = this.#s;
    const ch = s.chans.get(channel)!;
    const t = ch.queue[0]!;
    const d = t.desc;
    const bs = s.blockSize;
    const src = s.smmu.streamForPd(d.pd);
    const first = t.cursor;
    const pipelined = t.runs.length > 0;
    const issueAt = Math.max(pipelined ? t.plan.cursor : ch.cursor, t.modelReady);
    if (!src) {
      // The posting process's protection domain went away mid-transfer: flush, do not send.
      this.#start(t, first, 1, issueAt);
      t.cursor = first + 1;
      this.#completer.fail(t, true, DmaStatus.FLUSHED, `node ${s.node} no longer has a stream for protection domain ${d.pd}`, issueAt, 'source');
      return;
    }
    if (d.length === 0) return this.#empty(t, ch, issueAt);
    const n = src.faultModel === 'stall' ? 1 : Math.min(t.runLimit, t.blocks - first);
    const offset0 = first * bs;
    const batch = s.smmu.translateRun(src.sid, d.srcVa + BigInt(offset0), Math.min(n * bs, d.length - offset0), bs, 'read');
    // The run's first block faults at the source.
    if (batch.blocks === 0) return this.#firstFault(t, ch, src.sid, batch.fault!, issueAt, pipelined);
    const plan = this.#plan(t, ch, batch, issueAt, pipelined);
    this.#sendRun(t, src, batch, plan, n);
  }

  // The source of the run's first block faults: nothing goes on the wire. Behind runs in flight
  // the fault is held until they land; else it is the fault unit's now.
  #firstFault(t: Transfer, ch: Channel, sid: number, tr: Fault, issueAt: number, pipelined: boolean): void {
    const c = this.#s.costs;
    const first = t.cursor;
    const cost = c.scheduleUs + walkCost(c, tr) + c.blockUs;
    const issuedMs = this.#start(t, first, 1, issueAt);
    t.cursor = first + 1;
    if (pipelined) {
      t.held = { seq: first, sid, tr, cost, issuedUs: issueAt, issuedMs };
      return;
    }
    ch.cursor = this.#s.engineRes.reserve(issueAt, cost);
    this.#completer.blockFault(t, first, sid, tr, issueAt + c.scheduleUs + walkCost(c, tr), issueAt, issuedMs);
  }

  // The plan, block by block in one numeric loop (no object per block): engine, then link,
  // from where the runs already on the wire end.
  #plan(t: Transfer, ch: Channel, batch: RunSpans, issueAt: number, pipelined: boolean): RunPlan {
    const s = this.#s;
    const c = s.costs;
    const d = t.desc;
    const bs = s.blockSize;
    const first = t.cursor;
    const k = batch.blocks;
    let cursor = pipelined ? t.plan.cursor : ch.cursor;
    let engineFree = pipelined ? Math.max(s.engineRes.freeAt, t.plan.engine) : s.engineRes.freeAt;
    let linkFree = s.transport.linkFreeAt(s.node, d.dstNode);
    if (pipelined) linkFree = Math.max(linkFree, t.plan.link);
    const costs = new Float64Array(k);
    const issued = new Float64Array(k);
    const arrivals = new Float64Array(k);
    const ready = t.modelReady;
    const perByte = 1 / c.linkBytesPerUs;
    const lastLen = d.length - (t.blocks - 1) * bs;
    let bytes = 0;
    let at = issueAt;
    // Per stretch of blocks that walked as many pages (translateRun's spans), one cost.
    const spans = batch.spans;
    for (let i = 0, j = 0; i < spans.length; i += 2) {
      const cost = c.scheduleUs + walkedCost(c, spans[i + 1]!) + c.blockUs;
      for (const stop = j + spans[i]!; j < stop; j++) {
        issued[j] = at;
        costs[j] = cost;
        const engineDone = Math.max(at, engineFree) + cost;
        engineFree = cursor = engineDone;
        const len = first + j === t.blocks - 1 ? lastLen : bs;
        bytes += len;
        linkFree = Math.max(engineDone, linkFree) + len * perByte;
        arrivals[j] = linkFree + c.linkLatencyUs;
        at = Math.max(cursor, ready);
      }
    }
    return { costs, issued, arrivals, bytes, cursor, engineFree, linkFree, nextAt: at };
  }

  // The planned run on the wire as one write packet: its stall window (stall-mode memory), its
  // payload, its record among the transfer's runs; the block after it held if it faulted.
  #sendRun(t: Transfer, src: StreamContext, batch: RunSpans, plan: RunPlan, n: number): void {
    const s = this.#s;
    const c = s.costs;
    const d = t.desc;
    const first = t.cursor;
    const k = batch.blocks;
    const { costs, issued, arrivals, bytes } = plan;
    const region = batch.region!;
    const issuedMs = this.#start(t, first, k, issued);
    const window =
      src.faultModel === 'stall'
        ? this.#stallWindow(t, src.sid, { region, offset: batch.offset, length: bytes }, plan.cursor, issued[0]!, issuedMs)
        : undefined;
    const payload: PayloadView = isResponse(d.opcode)
      ? this.#answerPayload(t, region, batch.offset)
      : { region, offset: batch.offset, revoked: false };
    const sent: SentRun = { seq: first, count: k, costs, issuedUs: issued, issuedMs, sid: src.sid, region, offset: batch.offset, window, payload };
    t.runs.push(sent);
    t.plan.cursor = plan.cursor;
    t.plan.engine = plan.engineFree;
    t.plan.link = plan.linkFree;
    t.cursor = first + k;
    if (batch.fault && k < n) {
      // The block after the run faults at the source: it counts only if the runs before it land whole.
      const tr = batch.fault;
      const at = plan.nextAt;
      const heldMs = this.#start(t, first + k, 1, at);
      t.cursor++;
      t.held = { seq: first + k, sid: src.sid, tr, cost: c.scheduleUs + walkCost(c, tr) + c.blockUs, issuedUs: at, issuedMs: heldMs };
    }
    this.#completer.outstanding++;
    this.#send(t, sent, bytes, arrivals);
    // A response's run is done once sent (on the next microtask: not inside the scheduler's pass).
    if (isResponse(d.opcode)) queueMicrotask(() => this.#completer.answerSent(t));
  }

  // Stall-mode source memory: the payload's read may stall (a genuine userfaultfd fault of the
  // copy thread) until this node's SMMU resumes it; the window lasts until the answer.
  #stallWindow(
    t: Transfer,
    sid: number,
    at: { region: MemoryLike; offset: number; length: number },
    modelUs: number,
    issuedUs: number,
    issuedMs: number,
  ): StallWindow {
    const s = this.#s;
    const d = t.desc;
    const first = t.cursor;
    const offset0 = first * s.blockSize;
    const tag = this.#faults.info('source', {
      sid,
      srcNode: s.node,
      tid: t.tid,
      channel: d.channel,
      seq: first,
      va: d.srcVa + BigInt(offset0),
      lengthHint: Math.max(0, d.length - offset0),
      modelUs,
      issuedUs,
      issuedMs,
    });
    return s.smmu.beginStallWindow({ sid, region: at.region, offset: at.offset, length: at.length, access: 'read', tag });
  }

  // A response's payload: its runs are done when sent, so its QP's destruction revokes it
  // through the QP (EngineState.answers), with every other response the QP sent.
  #answerPayload(t: Transfer, region: MemoryLike, offset: number): PayloadView {
    const s = this.#s;
    const d = t.desc;
    let tok = s.answers.get(d.srcQp!);
    if (!tok) s.answers.set(d.srcQp!, (tok = { revoked: false, peers: new Map() }));
    const token = tok;
    token.peers.set(d.dstNode * 2 ** 24 + d.dstQp!, { node: d.dstNode, qp: d.dstQp! });
    return {
      region,
      offset,
      get revoked() {
        return token.revoked;
      },
      set revoked(v: boolean) {
        token.revoked = v;
      },
    };
  }

  // A run (just pushed on the transfer's runs) goes on the wire as one write packet, with the
  // RC headers of its message: `bytes` of payload, its blocks arriving at `arrivals`.
  #send(t: Transfer, run: SentRun, bytes: number, arrivals: Float64Array): void {
    const { seq: first, count, payload, issuedUs, issuedMs } = run;
    const sourceStall = run.window !== undefined;
    const s = this.#s;
    const d = t.desc;
    const offset0 = first * s.blockSize;
    const packet: WritePacket = {
      type: 'write',
      src: s.node,
      dst: d.dstNode,
      pd: d.dstPd ?? d.pd,
      va: d.dstVa + BigInt(offset0),
      tid: t.tid,
      seq: first,
      length: bytes,
      arrivesAt: arrivals[0]!,
      channel: d.channel,
      count,
      blockSize: s.blockSize,
      payload,
      lengthHint: Math.max(0, d.length - offset0),
      issuedUs,
      arrivals,
      issuedMs,
      sourceStall,
    };
    this.#rc(packet, t);
    try {
      s.transport.deliver(packet);
    } catch (e) {
      // A packet the transport's checks refuse never left: counted, and the transfer ends
      // with the error once its other runs are answered; nothing escapes to the scheduler.
      this.#refused(t, first, count, e);
    }
  }

  // The run just pushed for blocks [first, first+count) did not go on the wire.
  #refused(t: Transfer, first: number, count: number, e: unknown): void {
    const s = this.#s;
    s.counters.packetsRefused++;
    const i = t.runs.findIndex((r) => r.seq === first);
    if (i >= 0) {
      const [run] = t.runs.splice(i, 1);
      this.#completer.outstanding--;
      if (run!.window) s.smmu.endStallWindow(run!.window);
    }
    t.inflight -= count;
    s.counters.blocksIssued -= count;
    const reason = `the packet was refused before it left: ${e instanceof Error ? e.message : String(e)}`;
    this.#completer.fail(t, false, DmaStatus.DST_ADDR_ERR, reason, t.modelReady, 'destination');
  }

  // The RC headers of a QP's message, in every packet (BTH, RETH, ImmDt).
  #rc(packet: WritePacket, t: Transfer): void {
    const d = t.desc;
    if (d.key !== undefined) packet.key = d.key;
    if (d.dstQp !== undefined) packet.qpn = d.dstQp;
    if (d.opcode === undefined) return;
    packet.opcode = d.opcode;
    if (d.srcQp !== undefined) packet.srcQpn = d.srcQp;
    if (d.psn !== undefined) packet.psn = d.psn;
    if (d.immData !== undefined) packet.immData = d.immData;
    if (d.solicited) packet.solicited = true;
    if (d.message) {
      packet.msgOffset = d.message.offset;
      packet.msgLength = d.message.length;
    }
    if (d.dmaLength !== undefined) packet.dmaLength = d.dmaLength;
    if (d.sinks) packet.sinks = d.sinks;
    if (d.atomic) packet.atomic = d.atomic;
    if (d.flush) packet.flush = d.flush;
    if (d.qkey !== undefined) packet.qkey = d.qkey;
    if (d.srqn !== undefined) packet.srqn = d.srqn;
    const srcFaults = t.faults.source + (d.srcFaults ?? 0);
    if (srcFaults) packet.srcFaults = srcFaults;
    if (t.answer) this.#again(packet, t);
  }

  // A READ or an atomic sent again after a fault at its sink: the same PSN, for what has not
  // landed (RETH and the sinks moved on by it); the sink fault's statistics end here.
  #again(packet: WritePacket, t: Transfer): void {
    const a = t.answer!;
    const d = t.desc;
    if (a.landed > 0) {
      packet.va += BigInt(a.landed);
      packet.dmaLength = d.dmaLength! - a.landed;
      packet.sinks = d.sinks!.slice(a.sink);
      const first = packet.sinks[0]!;
      packet.sinks[0] = { addr: first.addr + BigInt(a.within), length: first.length - a.within, lkey: first.lkey };
    }
    if (a.refault) {
      this.#faults.sentAgain(a.refault.node, a.refault.tid, a.refault.seq, 'destination', packet.issuedUs[0]!, packet.issuedMs);
      a.refault = undefined;
    }
  }

  // An empty RC message: one packet carrying no bytes (a zero-length WRITE, SEND or immediate).
  #empty(t: Transfer, ch: { cursor: number }, issueAt: number): void {
    const s = this.#s;
    const c = s.costs;
    const d = t.desc;
    const cost = c.scheduleUs + c.blockUs;
    const issued = Float64Array.of(issueAt);
    const arrivals = Float64Array.of(Math.max(issueAt + cost, s.transport.linkFreeAt(s.node, d.dstNode)) + c.linkLatencyUs);
    const issuedMs = this.#start(t, 0, 1, issued);
    const payload: PayloadView = { region: NO_MEMORY, offset: 0, revoked: false };
    t.runs.push({
      seq: 0,
      count: 1,
      costs: Float64Array.of(cost),
      issuedUs: issued,
      issuedMs,
      sid: -1,
      region: NO_MEMORY,
      offset: 0,
      window: undefined,
      payload,
    });
    t.plan.cursor = t.plan.engine = issueAt + cost;
    t.plan.link = arrivals[0]! - c.linkLatencyUs;
    t.cursor = 1;
    ch.cursor = Math.max(ch.cursor, issueAt);
    this.#completer.outstanding++;
    this.#send(t, t.runs[t.runs.length - 1]!, 0, arrivals);
  }

  // Blocks [first, first+count) go on the wire (issued at `issued`, per block or all at
  // once): counters, and for a block sent again after a fault, the retransmission's
  // bookkeeping (only the first block of a run can be one). Returns performance.now().
  #start(t: Transfer, first: number, count: number, issued: Float64Array | number): number {
    const s = this.#s;
    const own = t.own.size ? t.own.get(first) : undefined;
    const at0 = typeof issued === 'number' ? issued : issued[0]!;
    if (own && ++own.attempts > 1) {
      t.retransmitted++;
      s.counters.retransmittedBlocks++;
      traceTransfer(s.tracer, 'retransmit', s.node, t.tid, t.desc.channel, {
        modelUs: at0,
        detail: { seq: first, attempt: own.attempts, srcNode: s.node },
      });
      const started = t.faultStarted.shift();
      if (started !== undefined) t.faultUs.push(realNowUs() - started);
    }
    t.inflight += count;
    s.counters.blocksIssued += count;
    const ms = performance.now();
    // Checked here: the events' objects are not even built while nobody listens.
    if (s.tracer.active)
      for (let j = 0; j < count; j++)
        traceTransfer(s.tracer, 'block', s.node, t.tid, t.desc.channel, {
          modelUs: typeof issued === 'number' ? issued : issued[j]!,
          detail: { seq: first + j, attempt: j === 0 && own ? own.attempts : 1 },
        });
    // A source fault of this block answered by this node's fault library: its statistics end here.
    if (own && own.attempts > 1) this.#faults.sentAgain(s.node, t.tid, first, 'source', at0, ms);
    return ms;
  }

  #validate(d: DmaDescriptor): { status: DmaStatus; reason: string } | undefined {
    const s = this.#s;
    if (s.closed) return { status: DmaStatus.FLUSHED, reason: 'the engine is closed' };
    // A responder's answers (READ responses, atomics' old values) have channels of their own above the posted ones.
    const channels = isResponse(d.opcode) ? 2 * s.channels : s.channels;
    if (!Number.isInteger(d.channel) || d.channel < 0 || d.channel >= channels)
      return { status: DmaStatus.BAD_CHANNEL, reason: `channel ${d.channel} is not in 0..${s.channels - 1}` };
    if (!Number.isSafeInteger(d.length) || d.length < (d.opcode === undefined ? 1 : 0))
      return { status: DmaStatus.BAD_LENGTH, reason: `length ${d.length} must be a positive integer (0 only for an RC message)` };
    if (typeof d.srcVa !== 'bigint' || d.srcVa < 0n) return { status: DmaStatus.SRC_ADDR_ERR, reason: 'srcVa must be a non-negative bigint' };
    if (typeof d.dstVa !== 'bigint' || d.dstVa < 0n) return { status: DmaStatus.DST_ADDR_ERR, reason: 'dstVa must be a non-negative bigint' };
    if (!Number.isInteger(d.dstNode) || !s.transport.hasNode(d.dstNode))
      return { status: DmaStatus.BAD_NODE, reason: `node ${d.dstNode} is not on the fabric` };
    if (!s.smmu.streamForPd(d.pd)) return { status: DmaStatus.PD_ERR, reason: `node ${s.node} has no stream for protection domain ${d.pd}` };
    // A remote range past 2^64 is covered by no MR (an R_Key violation): refused here, as its
    // packet could not be put on the wire (RETH's address is 64 bits).
    const reach = d.opcode === RcOp.ATOMIC ? 8 : d.opcode === RcOp.READ_REQUEST || d.opcode === RcOp.FLUSH ? (d.dmaLength ?? 0) : d.length;
    if (hasRemoteRange(d.opcode) && d.dstVa + BigInt(reach) > SPACE)
      return {
        status: DmaStatus.DST_ADDR_ERR,
        reason: `the remote range 0x${d.dstVa.toString(16)} + ${reach} passes the 64-bit address space: no MR covers it`,
      };
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// The QP's requester (rxe_req's WQE half): when the doorbell rings it reads the send ring from
// its own index, checks each WQE's local SGEs in the node's MR table by lkey, and turns the WQE
// into RC packets on this node's engine (BTH: opcode, destination QP, PSN; RETH; AtomicETH;
// ImmDt), one transfer per SGE; the connected QP's node checks and answers them. A READ or an
// atomic is one request packet; the responder's node sends the bytes back as READ responses.
// What a WQE's outcome is, and its CQE, is the completer's (WqeCompleter).

/** The largest message (ibv_port_attr.max_msg_sz): 2^31 bytes. */
export const MAX_MSG = 2 ** 31;

/** rdma-core's default local ACK timeout code (4.096 µs × 2^14), for timeout 0 (infinite in IB). */
const DEFAULT_TIMEOUT = 14;

/** A UD WQE's address handle, as the device's table holds it: the destination node. */
export interface RcAh {
  readonly dlid: number;
}

/** What the requester needs of the node: its engine and its MR table. */
export interface RcNode {
  readonly id: number;
  readonly channels: number;
  /** The engine's fault timeout, ms: a response timer's period is never shorter. */
  readonly faultTimeoutMs: number;
  /** Its tables: the MR records SGEs are checked in, the event line the QP's ERR is said on. */
  readonly tables: RcTables;
  post(desc: DmaDescriptor): Promise<DmaCompletion>;
  /** End every transfer QP `qp` posted (they complete FLUSHED). */
  cancel(qp: number): boolean;
  /** Memory of the device's own mapped read-only in PD `pd`'s stream (INLINE WQEs' bytes go from there). */
  deviceMemory?(pd: number, size: number): { address: bigint; bytes: Uint8Array; release(): void } | undefined;
}

/** What the requester needs of its QP (rc/qp.ts's RcQueuePair). */
export interface WqeRequesterQp {
  readonly qpNum: number;
  readonly pd: RcPd;
  readonly ud: boolean;
  readonly state: QpState;
  readonly destNode: number;
  readonly destQpNum: number;
  readonly rnrRetry: number;
  readonly timeout: number;
  readonly retryCnt: number;
  readonly node: RcNode;
  readonly sq: SendRing<SendWqe<RcAh>>;
  /** Expect the peer's bytes in `sges` (a READ's or an atomic's sinks); the returned function ends it. */
  expectLanding(sges: readonly Sge[]): () => void;
}

type Piece = { fromVa: bigint; toVa: bigint; length: number; key?: number };
type Request = Pick<DmaDescriptor, 'dmaLength' | 'sinks' | 'atomic' | 'flush' | 'solicited' | 'responseTimeout'>;

/**
 * WQEs that may run while the ones before them are still in flight: RDMA_WRITEs after
 * RDMA_WRITEs. Their DMA goes on one engine channel per QP, whose transfers run in posting
 * order, so the bytes land in order as RC requires; a SEND or WRITE_WITH_IMM (which takes a
 * receive), a READ or an atomic (which must see every earlier write) waits for all before it.
 */
function overlaps(wqe: SendWqe): boolean {
  return wqe.opcode === WrOpcode.RDMA_WRITE;
}

// SendFlags.SOLICITED: BTH's SE bit on the message's packets (a SEND or WRITE with immediate).
function solicited(wqe: SendWqe): { solicited: true } | undefined {
  return (wqe.sendFlags ?? 0) & SendFlags.SOLICITED ? { solicited: true } : undefined;
}

function offsetOf(sges: readonly { length: number }[], i: number): number {
  let o = 0;
  for (let k = 0; k < i; k++) o += sges[k]!.length;
  return o;
}

function isRead(op: WrOpcode): boolean {
  return op === WrOpcode.RDMA_READ || op === WrOpcode.ATOMIC_CMP_AND_SWP || op === WrOpcode.ATOMIC_FETCH_AND_ADD;
}

export class WqeRequester {
  readonly #qp: WqeRequesterQp;
  readonly #completer: WqeCompleter;
  #running = false;
  /** The ring index of the next WQE to start (rxe's req.wqe_index); the completer's is the consumer index. */
  #next = 0;
  #psn = 0;
  /** The XRC SRQ the WQE being started names (XRC_SEND QPs). */
  #srqn: number | undefined;
  /** Where INLINE WQEs' bytes are sent from: a slot per ring slot, held as the WQE is (until it completes). */
  #inline: { address: bigint; bytes: Uint8Array; release(): void } | undefined;

  constructor(qp: WqeRequesterQp, completer: WqeCompleter) {
    this.#qp = qp;
    this.#completer = completer;
    this.#next = qp.sq.consumer;
  }

  /** The QP reached RTS: its first PSN (sq_psn). */
  startPsn(psn: number): void {
    this.#psn = psn & 0xff_ffff;
  }

  /** The PSN of the next request (ibv_query_qp's sq_psn). */
  get psn(): number {
    return this.#psn;
  }

  /** True while WQEs are in flight (or being started): the queue is flushed in order behind them. */
  get running(): boolean {
    return this.#running || this.#completer.inflight > 0;
  }

  /** The doorbell (and RTS, and each completion): start what the send queue may start now. */
  kick(): void {
    if (this.#running) return;
    this.#running = true;
    try {
      this.#drain();
    } finally {
      this.#running = false;
    }
  }

  /** The QP is destroyed: every WQE posted and not started is flushed, oldest first. */
  flushQueued(): void {
    const sq = this.#qp.sq;
    this.#completer.flushInflight();
    for (let wqe = sq.at(sq.consumer); wqe !== undefined; wqe = sq.at(sq.consumer)) this.#completer.flushed(wqe);
    this.#next = sq.consumer;
  }

  // WQEs in flight (see overlaps), completed in posting order by the completer. In ERR with
  // nothing in flight, the queue is flushed in order. Synchronous, with nothing awaited: what
  // cannot start now is started by the kick of a later doorbell or completion.
  #drain(): void {
    const q = this.#qp;
    const c = this.#completer;
    const next = () => this.kick();
    for (;;) {
      const live = q.state === QpState.RTS || q.state === QpState.ERR;
      const wqe = live ? q.sq.at(this.#next) : undefined;
      // A WQE of another kind in flight is alone there: WQEs in flight are all writes.
      const first = c.first;
      const room = first === undefined || (wqe !== undefined && overlaps(wqe) && overlaps(first));
      if (!wqe || !room || q.state === QpState.ERR) {
        if (first !== undefined || !wqe) return;
        this.#next++;
        c.flushed(wqe);
        continue;
      }
      const index = this.#next++;
      c.started(
        wqe,
        this.#execute(wqe, index).catch((): Executed => ({ status: WcStatus.GENERAL_ERR })),
        next,
      );
    }
  }

  async #execute(wqe: SendWqe<RcAh>, index: number): Promise<Executed> {
    // XRC: every packet of the WQE names the target's XRC SRQ (read by #move before any await).
    this.#srqn = wqe.xrc?.remoteSrqn;
    let total = 0;
    for (const s of wqe.sgList) total += s.length;
    if (total > MAX_MSG) return { status: WcStatus.LOC_LEN_ERR };
    let local: readonly Sge[] = wqe.sgList;
    if (wqe.inline) {
      const src = this.#inlineSource(wqe, index);
      if (!src) return { status: WcStatus.LOC_QP_OP_ERR };
      local = src;
      total = wqe.inline.length;
    } else if (!this.#localSges(wqe.sgList, isRead(wqe.opcode))) return { status: WcStatus.LOC_PROT_ERR };
    switch (wqe.opcode) {
      case WrOpcode.RDMA_WRITE:
      case WrOpcode.RDMA_WRITE_WITH_IMM:
        return this.#write(wqe, local, total);
      case WrOpcode.SEND:
      case WrOpcode.SEND_WITH_IMM:
        return this.#qp.ud ? this.#sendUd(wqe, local[0], total) : this.#send(wqe, local, total);
      case WrOpcode.RDMA_READ:
        return this.#read(wqe, local, total);
      case WrOpcode.ATOMIC_CMP_AND_SWP:
      case WrOpcode.ATOMIC_FETCH_AND_ADD:
        return this.#atomic(wqe, local);
      case WrOpcode.ATOMIC_WRITE:
        return this.#atomicWrite(wqe, local);
      case WrOpcode.FLUSH:
        return this.#flush(wqe);
    }
    return { status: WcStatus.LOC_QP_OP_ERR };
  }

  /** The QP is destroyed and its transfers fenced: the inline memory goes. */
  release(): void {
    this.#inline?.release();
    this.#inline = undefined;
  }

  /**
   * An INLINE WQE's bytes (a SEND or an RDMA WRITE: rxe's dma.inline_data) as the one SGE they
   * go from: copied into the device's inline memory at the WQE's ring slot, mapped in the QP's
   * PD, where they stay until the WQE completes (its slot is the WQE's till then).
   */
  #inlineSource(wqe: SendWqe, index: number): Sge[] | undefined {
    const op = wqe.opcode;
    if (op !== WrOpcode.SEND && op !== WrOpcode.SEND_WITH_IMM && op !== WrOpcode.RDMA_WRITE && op !== WrOpcode.RDMA_WRITE_WITH_IMM) return undefined;
    const q = this.#qp;
    const room = q.sq.maxInline;
    if (!this.#inline) this.#inline = q.node.deviceMemory?.(q.pd.handle, Math.ceil((q.sq.numElems * room) / 4096) * 4096 || 4096);
    const mem = this.#inline;
    if (!mem) return undefined;
    const bytes = wqe.inline!;
    const offset = (index & (q.sq.numElems - 1)) * room;
    mem.bytes.set(bytes, offset);
    return [{ addr: mem.address + BigInt(offset), length: bytes.length, lkey: 0 }];
  }

  /**
   * The WQE's SGEs checked in the node's MR table by lkey: an MR of the QP's PD, LOCAL_WRITE
   * if the bytes land there, the range inside it (its region mapped in the PD's stream).
   */
  #localSges(sges: readonly Sge[], write: boolean): boolean {
    const q = this.#qp;
    const mrs = q.node.tables.mrs;
    for (const sge of sges) {
      const mr = mrs.get(sge.lkey);
      if (!mr || mr.pd.handle !== q.pd.handle || (write && !(mr.access & Access.LOCAL_WRITE))) return false;
      // A VALID record, the range inside it (an implicit MR maps what it reaches; 'prefault' populates).
      if (!mrPlace(mr, sge.addr, sge.length)) return false;
    }
    return true;
  }

  // RC packets straight away: the responder's engine checks the rkey on every packet and, for
  // the immediate, takes a receive with the last one.
  async #write(wqe: SendWqe, local: readonly Sge[], total: number): Promise<Executed> {
    const { remoteAddr, rkey } = wqe.rdma!;
    const imm = wqe.opcode === WrOpcode.RDMA_WRITE_WITH_IMM;
    const pieces = local.map((l, i) => ({ fromVa: l.addr, toVa: remoteAddr + BigInt(offsetOf(local, i)), length: l.length, key: rkey }));
    const results = await this.#move(imm ? RcOp.WRITE_IMM : RcOp.WRITE, pieces, total, imm ? (wqe.immData ?? 0) : undefined, solicited(wqe));
    return { results, byteLen: total };
  }

  // An RC SEND: the receive WQE is taken where the first packet lands; its buffers say where the bytes go.
  async #send(wqe: SendWqe, local: readonly Sge[], total: number): Promise<Executed> {
    const imm = wqe.opcode === WrOpcode.SEND_WITH_IMM;
    const pieces = local.map((l) => ({ fromVa: l.addr, toVa: 0n, length: l.length }));
    const results = await this.#move(imm ? RcOp.SEND_IMM : RcOp.SEND, pieces, total, imm ? (wqe.immData ?? 0) : undefined, solicited(wqe));
    return { results, byteLen: total };
  }

  // One READ request packet (RETH: address, rkey, DMA length); the responder's node sends the
  // bytes back as READ responses, which land here only in these sinks.
  async #read(wqe: SendWqe, local: readonly Sge[], total: number): Promise<Executed> {
    const { remoteAddr, rkey } = wqe.rdma!;
    const landed = this.#qp.expectLanding(local);
    const results = await this.#move(RcOp.READ_REQUEST, [{ fromVa: 0n, toVa: remoteAddr, length: 0, key: rkey }], 0, undefined, {
      dmaLength: total,
      sinks: sinksOf(local),
      responseTimeout: this.#responseTimeout(),
    }).finally(landed);
    return { results, byteLen: total };
  }

  // An atomic (AtomicETH): its original value lands in the one 8-byte local SGE.
  async #atomic(wqe: SendWqe, local: readonly Sge[]): Promise<Executed> {
    const a = wqe.atomic!;
    if (local.length !== 1 || local[0]!.length !== 8) return { status: WcStatus.LOC_LEN_ERR };
    const landed = this.#qp.expectLanding(local);
    const results = await this.#move(RcOp.ATOMIC, [{ fromVa: 0n, toVa: a.remoteAddr, length: 0, key: a.rkey }], 0, undefined, {
      sinks: sinksOf(local),
      responseTimeout: this.#responseTimeout(),
      atomic: {
        fetchAdd: wqe.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD,
        compareAdd: BigInt.asUintN(64, a.compareAdd),
        swap: BigInt.asUintN(64, a.swap ?? 0n),
      },
    }).finally(landed);
    return { results, byteLen: 8 };
  }

  // One packet carrying the word's 8 new bytes, read from the local SGE (it may fault here).
  async #atomicWrite(wqe: SendWqe, local: readonly Sge[]): Promise<Executed> {
    if (local.length !== 1 || local[0]!.length !== 8) return { status: WcStatus.LOC_LEN_ERR };
    const { remoteAddr, rkey } = wqe.rdma!;
    const results = await this.#move(RcOp.ATOMIC_WRITE, [{ fromVa: local[0]!.addr, toVa: remoteAddr, length: 8, key: rkey }], 8, undefined);
    return { results, byteLen: 8 };
  }

  // One request packet: RETH (the range) and FETH (placement type, selectivity); its ACK comes
  // once the responder has made the range what the type asks.
  async #flush(wqe: SendWqe): Promise<Executed> {
    const f = wqe.flush!;
    const results = await this.#move(RcOp.FLUSH, [{ fromVa: 0n, toVa: f.remoteAddr, length: 0, key: f.rkey }], 0, undefined, {
      dmaLength: f.length,
      flush: { type: f.type, level: f.level },
    });
    return { results, byteLen: 0 };
  }

  // A UD SEND: one packet of at most the MTU to the AH's node and the WQE's QP and Q_Key. Its
  // completion says it left (the responder answers the engine even when it drops it); a fault
  // at either end is still the engine's own: resolved, and the block sent again.
  async #sendUd(wqe: SendWqe<RcAh>, l: Sge | undefined, total: number): Promise<Executed> {
    if (total > UD_MTU) return { status: WcStatus.LOC_LEN_ERR };
    const u = wqe.ud;
    // An AH handle the device's table does not hold: no destination (rxe: a bad AH, LOC_QP_OP_ERR).
    if (!u) return { status: WcStatus.LOC_QP_OP_ERR };
    const imm = wqe.opcode === WrOpcode.SEND_WITH_IMM;
    const ud = { node: u.ah.dlid, qpn: u.remoteQpn, qkey: u.remoteQkey };
    const pieces = [{ fromVa: l?.addr ?? 0n, toVa: 0n, length: total }];
    const results = await this.#move(imm ? RcOp.UD_SEND_IMM : RcOp.UD_SEND, pieces, total, imm ? (wqe.immData ?? 0) : undefined, solicited(wqe), ud);
    return { results, byteLen: total };
  }

  /**
   * The local ACK timeout of a READ or an atomic: IB's 4.096 µs × 2^timeout a period, retry_cnt
   * retries. A period is never shorter than the engine's fault timeout (a responder holds its
   * response while its fault library answers, and tries again after that long), and timeout 0,
   * which is infinite in IB, is taken as the default (14): a response that never comes ends the
   * WQE in RETRY_EXC_ERR, never in a hang.
   */
  #responseTimeout(): { periodMs: number; retries: number } {
    const q = this.#qp;
    const ibMs = 0.004096 * 2 ** (q.timeout === 0 ? DEFAULT_TIMEOUT : q.timeout);
    return { periodMs: Math.max(ibMs, q.node.faultTimeoutMs), retries: q.retryCnt };
  }

  #nextPsn(): number {
    const psn = this.#psn;
    this.#psn = (psn + 1) & 0xff_ffff;
    return psn;
  }

  /**
   * One WQE as RC packets on this node's engine, to the connected QP: one transfer per SGE
   * (each names its byte offset in the message when there are several), all under the WQE's
   * PSN; an empty message is one packet with no bytes.
   */
  #move(
    opcode: RcOp,
    pieces: Piece[],
    total: number,
    immData: number | undefined,
    request?: Request,
    ud?: { node: number; qpn: number; qkey: number },
  ): Promise<DmaCompletion[]> {
    const psn = this.#nextPsn();
    const parts = pieces.filter((p) => p.length > 0);
    if (parts.length === 0) parts.push({ ...(pieces[0] ?? { fromVa: 0n, toVa: 0n }), length: 0 });
    const srqn = this.#srqn;
    let offset = 0;
    const post = (p: Piece) => {
      const desc = this.#descriptor(opcode, p, psn, immData, ud);
      if (srqn !== undefined) desc.srqn = srqn;
      if (parts.length > 1) desc.message = { offset, length: total };
      if (request) Object.assign(desc, request);
      offset += p.length;
      return this.#qp.node.post(desc);
    };
    // The common case, one SGE: no Promise.all (one promise less per WQE).
    if (parts.length === 1) return post(parts[0]!).then((c) => [c]);
    return Promise.all(parts.map(post));
  }

  // One transfer's descriptor: this QP's channel, the connected QP (or a UD WQE's), the PSN.
  #descriptor(
    opcode: RcOp,
    p: Piece,
    psn: number,
    immData: number | undefined,
    ud: { node: number; qpn: number; qkey: number } | undefined,
  ): DmaDescriptor {
    const q = this.#qp;
    const rnr = q.rnrRetry;
    const desc: DmaDescriptor = {
      channel: q.qpNum % q.node.channels,
      srcVa: p.fromVa,
      dstNode: ud ? ud.node : q.destNode,
      dstVa: p.toVa,
      length: p.length,
      pd: q.pd.handle,
      retryLimit: rnr === 7 ? Infinity : rnr,
      dstQp: ud ? ud.qpn : q.destQpNum,
      srcQp: q.qpNum,
      opcode,
      psn,
    };
    if (p.key !== undefined) desc.key = p.key;
    if (immData !== undefined) desc.immData = immData;
    if (ud) desc.qkey = ud.qkey;
    return desc;
  }
}

// Where a READ's or an atomic's response may land: the WQE's local SGEs, as sinks.
function sinksOf(local: readonly Sge[]): Array<{ addr: bigint; length: number; lkey: number }> {
  return local.map((l) => ({ addr: l.addr, length: l.length, lkey: l.lkey }));
}
