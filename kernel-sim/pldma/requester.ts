// The requester of one node's PLDMA (rxe_req's role): it takes descriptors, splits each
// transfer into blocks, and on the scheduler's turn translates the next block's source on
// this node's SMMU and sends it to the destination as a write packet carrying its payload.
// A transfer has one run of blocks on the wire at a time, answered block by block in order:
// a fault (at either end) stops it before a later block is written, so each missing page
// faults once; retransmission after a fault is the same path. It never sees the destination's SMMU, engine or memory map: only the
// answer to its packet, which the completer reads.
import { realNowUs } from '../cost-model/index.js';
import { linkArrival } from '../fabric/fabric.js';
import type { WireBlock, WritePacket } from '../fabric/packets.js';
import type { Schedulable } from '../scheduler/scheduler.js';
import type { RunTranslation } from '../smmu/smmu.js';
import type { Completer } from './completer.js';
import {
  type Block,
  type DmaCompletion,
  type DmaDescriptor,
  DmaStatus,
  type EngineState,
  traceTransfer,
  type Transfer,
  walkCost,
  walkedCost,
} from './types.js';

/**
 * Blocks one write packet (and one copy-engine job) may carry: 4 MiB of 4 KiB blocks, so the
 * fixed cost of a packet, its copy-thread hand-off and its answer is paid once per 4 MiB of
 * resident memory, not once per 256 KiB. The modelled time is still planned per block.
 */
export const MAX_RUN_BLOCKS = 1024;

export class Requester implements Schedulable {
  readonly capacity: number;
  #s: EngineState;
  #completer: Completer;
  #nextTid = 1;
  #walked: number[] = [];

  constructor(state: EngineState, completer: Completer, engineSlots: number) {
    this.#s = state;
    this.#completer = completer;
    this.capacity = engineSlots;
  }

  /** Blocks on the wire (the scheduler's capacity is in these). */
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
        blocks: [],
        next: 0,
        acked: 0,
        inflight: 0,
        parked: false,
        parkedBlocks: [],
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
      for (let off = 0, seq = 0; off < desc.length; off += s.blockSize, seq++) {
        t.blocks.push({
          seq,
          offset: off,
          length: Math.min(s.blockSize, desc.length - off),
          state: 'pending',
          attempts: 0,
          srcFaults: 0,
          dstNacks: 0,
          ackAt: 0,
          issuedUs: 0,
          issuedMs: 0,
          sent: undefined,
        });
      }
      s.transfers.set(tid, t);
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
    if (!t || t.parked || t.done || t.failing) return false;
    return t.inflight === 0 && t.acked < t.blocks.length;
  }

  /**
   * Issue the channel's transfer's next run: its next blocks, each translated at the source
   * on its own (its walk, its fault), sent together as one write packet. The modelled engine
   * and link time of each block is planned here and reserved when its answer comes back, in
   * order, so a block the responder did not get to (after a fault) costs nothing. A source
   * fault ends the run; a stall-mode block goes alone (it has a stall window of its own).
   */
  issue(channel: number): void {
    const s = this.#s;
    const c = s.costs;
    const ch = s.chans.get(channel)!;
    const t = ch.queue[0]!;
    const d = t.desc;
    const src = s.smmu.streamForPd(d.pd);
    let cursor = ch.cursor;
    let engineFree = s.engineRes.freeAt;
    let linkFree = s.transport.linkFreeAt(s.node, d.dstNode);
    const run: Block[] = [];
    const wire: WireBlock[] = [];
    const walked = this.#walked;
    let batch: RunTranslation | undefined;
    let batchAt = -1;
    for (let i = t.next; i < t.blocks.length && run.length < t.runLimit; i++) {
      const b = t.blocks[i]!;
      if (b.state !== 'pending') continue;
      // Only the first block of a run may be a retransmission; a stalled source read goes alone.
      if (run.length && (b.attempts > 0 || run[run.length - 1]!.sent!.window)) break;
      const issueAt = Math.max(cursor, t.modelReady);
      this.#start(t, b, issueAt);
      if (!src) {
        // The posting process's protection domain went away mid-transfer: flush, do not send.
        this.#completer.fail(t, b, DmaStatus.FLUSHED, `node ${s.node} no longer has a stream for protection domain ${d.pd}`, issueAt, 'source');
        break;
      }
      const va = d.srcVa + BigInt(b.offset);
      // The source of the blocks this run will carry is translated in one call (the same
      // walks and IOTLB lookups as block by block, the region found and the table read once).
      // Past the blocks it translated (and not at its fault), a new batch.
      if (!batch || i - batchAt > walked.length || (i - batchAt === walked.length && !batch.fault)) {
        const n = src.faultModel === 'stall' ? 1 : this.#runAhead(t, i, t.runLimit - run.length);
        const last = t.blocks[i + n - 1]!;
        batch = s.smmu.translateBlocks(src.sid, va, last.offset + last.length - b.offset, s.blockSize, 'read', walked);
        batchAt = i;
      }
      const k = i - batchAt;
      if (k >= walked.length) {
        // The block after the ones translated: its fault ends the run.
        const tr = batch.fault!;
        const cost = c.scheduleUs + walkCost(c, tr) + c.blockUs;
        if (!run.length) {
          ch.cursor = s.engineRes.reserve(issueAt, cost);
          this.#completer.blockFault(t, b, src.sid, tr, issueAt + c.scheduleUs + walkCost(c, tr));
          return;
        }
        t.held = { b, sid: src.sid, tr, cost };
        break;
      }
      // A block that translated: no Translation object per block, only what it says.
      const region = batch.region!;
      const offset = batch.offset + (b.offset - t.blocks[batchAt]!.offset);
      const cost = c.scheduleUs + walkedCost(c, walked[k]!) + c.blockUs;
      const engineDone = Math.max(issueAt, engineFree) + cost;
      engineFree = cursor = engineDone;
      const link = linkArrival(c, linkFree, b.length, engineDone);
      linkFree = link.freeAt;
      // Stall-mode source memory: the payload's read may stall (a genuine userfaultfd fault of
      // the copy thread) until this node's SMMU resumes it; the window lasts until the answer.
      const window =
        src.faultModel === 'stall'
          ? s.smmu.beginStallWindow({
              sid: src.sid,
              region,
              offset,
              length: b.length,
              access: 'read',
              tag: {
                node: s.node,
                sid: src.sid,
                side: 'source',
                srcNode: s.node,
                tid: t.tid,
                channel: d.channel,
                seq: b.seq,
                va,
                write: false,
                lengthHint: Math.max(0, d.length - b.offset),
                modelUs: engineDone,
                detectedMs: performance.now(),
                issuedUs: b.issuedUs,
                issuedMs: b.issuedMs,
              },
            })
          : undefined;
      b.sent = { cost, arrive: link.arrive, sid: src.sid, region, offset, window };
      run.push(b);
      wire.push({
        seq: b.seq,
        va: d.dstVa + BigInt(b.offset),
        length: b.length,
        payload: { region, offset },
        arrivesAt: link.arrive,
        lengthHint: Math.max(0, d.length - b.offset),
        issuedUs: b.issuedUs,
        issuedMs: b.issuedMs,
      });
    }
    if (!run.length) return;
    this.#completer.outstanding++;
    const first = wire[0]!;
    const packet: WritePacket = {
      type: 'write',
      src: s.node,
      dst: d.dstNode,
      pd: d.dstPd ?? d.pd,
      va: first.va,
      tid: t.tid,
      seq: first.seq,
      length: wire.reduce((n, w) => n + w.length, 0),
      arrivesAt: first.arrivesAt,
      channel: d.channel,
      blocks: wire,
      sourceStall: run[0]!.sent!.window !== undefined,
    };
    if (d.key !== undefined) packet.key = d.key;
    if (d.dstQp !== undefined) packet.qpn = d.dstQp;
    s.transport.deliver(packet);
  }

  // How many blocks from `i` (at most `max`) the run may carry: pending, contiguous, and not
  // retransmissions after the first (the loop in issue() stops at the same place).
  #runAhead(t: Transfer, i: number, max: number): number {
    let n = 1;
    const end = Math.min(t.blocks.length, i + max);
    while (i + n < end) {
      const b = t.blocks[i + n]!;
      if (b.state !== 'pending' || b.attempts > 0) break;
      n++;
    }
    return n;
  }

  #start(t: Transfer, b: Block, issueAt: number): void {
    const s = this.#s;
    b.state = 'inflight';
    b.attempts++;
    if (b.attempts > 1) {
      t.retransmitted++;
      s.counters.retransmittedBlocks++;
      traceTransfer(s.tracer, 'retransmit', s.node, t.tid, t.desc.channel, {
        modelUs: issueAt,
        detail: { seq: b.seq, attempt: b.attempts, srcNode: s.node },
      });
      const started = t.faultStarted.shift();
      if (started !== undefined) t.faultUs.push(realNowUs() - started);
    }
    t.inflight++;
    s.counters.blocksIssued++;
    b.issuedUs = issueAt;
    b.issuedMs = performance.now();
    // Checked here: the event's objects are not even built while nobody listens.
    if (s.tracer.active)
      traceTransfer(s.tracer, 'block', s.node, t.tid, t.desc.channel, { modelUs: b.issuedUs, detail: { seq: b.seq, attempt: b.attempts } });
    // A source fault of this block answered by this node's fault library: its statistics end here.
    if (b.attempts > 1) s.retransmitted?.(s.node, t.tid, b.seq, 'source', b.issuedUs, b.issuedMs);
  }

  #validate(d: DmaDescriptor): { status: DmaStatus; reason: string } | undefined {
    const s = this.#s;
    if (s.closed) return { status: DmaStatus.FLUSHED, reason: 'the engine is closed' };
    if (!Number.isInteger(d.channel) || d.channel < 0 || d.channel >= s.channels)
      return { status: DmaStatus.BAD_CHANNEL, reason: `channel ${d.channel} is not in 0..${s.channels - 1}` };
    if (!Number.isSafeInteger(d.length) || d.length <= 0)
      return { status: DmaStatus.BAD_LENGTH, reason: `length ${d.length} must be a positive integer` };
    if (typeof d.srcVa !== 'bigint' || d.srcVa < 0n) return { status: DmaStatus.SRC_ADDR_ERR, reason: 'srcVa must be a non-negative bigint' };
    if (typeof d.dstVa !== 'bigint' || d.dstVa < 0n) return { status: DmaStatus.DST_ADDR_ERR, reason: 'dstVa must be a non-negative bigint' };
    if (!Number.isInteger(d.dstNode) || !s.transport.hasNode(d.dstNode))
      return { status: DmaStatus.BAD_NODE, reason: `node ${d.dstNode} is not on the fabric` };
    if (!s.smmu.streamForPd(d.pd)) return { status: DmaStatus.PD_ERR, reason: `node ${s.node} has no stream for protection domain ${d.pd}` };
    return undefined;
  }
}
