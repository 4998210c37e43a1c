// The requester of one node's PLDMA (rxe_req's role): it takes descriptors, splits each
// transfer into blocks, and on the scheduler's turn translates the next block's source on
// this node's SMMU and sends it to the destination as a write packet carrying its payload.
// A transfer has one block on the wire at a time, so a fault (at either end) stops it before
// a later block goes out and each missing page faults once; retransmission after a fault
// is the same path. It never sees the destination's SMMU, engine or memory map: only the
// answer to its packet, which the completer reads.
import { realNowUs } from '../cost-model/index.js';
import type { WritePacket } from '../fabric/packets.js';
import type { Schedulable } from '../scheduler/scheduler.js';
import type { Completer } from './completer.js';
import { type Block, type Channel, type DmaCompletion, type DmaDescriptor, DmaStatus, type EngineState, traceTransfer, type Transfer, walkCost } from './types.js';

export class Requester implements Schedulable {
  readonly capacity: number;
  #s: EngineState;
  #completer: Completer;
  #nextTid = 1;

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
        parkTimer: undefined,
        faults: { source: 0, destination: 0 },
        retransmitted: 0,
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
      traceTransfer(s.tracer, 'post', s.node, tid, desc.channel, { modelUs: start });
      s.scheduler.wake(desc.channel);
    });
  }

  runnable(channel: number): boolean {
    const t = this.#s.chans.get(channel)?.queue[0];
    if (!t || t.parked || t.done || t.failing) return false;
    return t.inflight === 0 && t.acked < t.blocks.length;
  }

  /** Issue the channel's transfer's next block: translate its source, send it. */
  issue(channel: number): void {
    const s = this.#s;
    const ch = s.chans.get(channel)!;
    const t = ch.queue[0]!;
    let b: Block | undefined;
    for (let i = t.next; i < t.blocks.length && !b; i++) if (t.blocks[i]!.state === 'pending') b = t.blocks[i]!;
    if (!b) return;
    this.#start(ch, t, b);
    const c = s.costs;
    const d = t.desc;
    const issueAt = Math.max(ch.cursor, t.modelReady);
    const src = s.smmu.streamForPd(d.pd);
    if (!src) {
      // The posting process's protection domain went away mid-transfer: flush, do not send.
      this.#completer.fail(t, b, DmaStatus.FLUSHED, `node ${s.node} no longer has a stream for protection domain ${d.pd}`, issueAt, 'source');
      return;
    }
    const va = d.srcVa + BigInt(b.offset);
    const tr = s.smmu.translate(src.sid, va, b.length, 'read');
    const engineDone = s.engineRes.reserve(issueAt, c.scheduleUs + walkCost(c, tr) + c.blockUs);
    ch.cursor = engineDone;
    if (!tr.ok) {
      this.#completer.blockFault(t, b, src.sid, tr, issueAt + c.scheduleUs + walkCost(c, tr));
      return;
    }
    const arrive = s.transport.transmit(s.node, d.dstNode, b.length, engineDone);
    // Stall-mode source memory: the payload's read may stall (a genuine userfaultfd fault of
    // the copy thread) until this node's SMMU resumes it; the window lasts until the answer.
    const window =
      src.faultModel === 'stall'
        ? s.smmu.beginStallWindow({
            sid: src.sid,
            region: tr.region,
            offset: tr.offset,
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
    b.sent = { issueAt, arrive, sid: src.sid, region: tr.region, offset: tr.offset, window };
    this.#completer.outstanding++;
    const packet: WritePacket = {
      type: 'write',
      src: s.node,
      dst: d.dstNode,
      pd: d.dstPd ?? d.pd,
      va: d.dstVa + BigInt(b.offset),
      tid: t.tid,
      seq: b.seq,
      length: b.length,
      arrivesAt: arrive,
      channel: d.channel,
      payload: { region: tr.region, offset: tr.offset },
      lengthHint: Math.max(0, d.length - b.offset),
      sourceStall: window !== undefined,
      issuedUs: b.issuedUs,
      issuedMs: b.issuedMs,
    };
    if (d.key !== undefined) packet.key = d.key;
    if (d.dstQp !== undefined) packet.qpn = d.dstQp;
    s.transport.deliver(packet);
  }

  #start(ch: Channel, t: Transfer, b: Block): void {
    const s = this.#s;
    b.state = 'inflight';
    b.attempts++;
    if (b.attempts > 1) {
      t.retransmitted++;
      s.counters.retransmittedBlocks++;
      traceTransfer(s.tracer, 'retransmit', s.node, t.tid, t.desc.channel, {
        modelUs: Math.max(ch.cursor, t.modelReady),
        detail: { seq: b.seq, attempt: b.attempts, srcNode: s.node },
      });
      const started = t.faultStarted.shift();
      if (started !== undefined) t.faultUs.push(realNowUs() - started);
    }
    t.inflight++;
    s.counters.blocksIssued++;
    b.issuedUs = Math.max(ch.cursor, t.modelReady);
    b.issuedMs = performance.now();
    traceTransfer(s.tracer, 'block', s.node, t.tid, t.desc.channel, { modelUs: b.issuedUs, detail: { seq: b.seq, attempt: b.attempts } });
    // A source fault of this block answered by this node's fault library: its statistics end here.
    if (b.attempts > 1) s.retransmitted?.(s.node, t.tid, b.seq, 'source', b.issuedUs, b.issuedMs);
  }

  #validate(d: DmaDescriptor): { status: DmaStatus; reason: string } | undefined {
    const s = this.#s;
    if (s.closed) return { status: DmaStatus.FLUSHED, reason: 'the engine is closed' };
    if (!Number.isInteger(d.channel) || d.channel < 0 || d.channel >= s.channels)
      return { status: DmaStatus.BAD_CHANNEL, reason: `channel ${d.channel} is not in 0..${s.channels - 1}` };
    if (!Number.isSafeInteger(d.length) || d.length <= 0) return { status: DmaStatus.BAD_LENGTH, reason: `length ${d.length} must be a positive integer` };
    if (typeof d.srcVa !== 'bigint' || d.srcVa < 0n) return { status: DmaStatus.SRC_ADDR_ERR, reason: 'srcVa must be a non-negative bigint' };
    if (typeof d.dstVa !== 'bigint' || d.dstVa < 0n) return { status: DmaStatus.DST_ADDR_ERR, reason: 'dstVa must be a non-negative bigint' };
    if (!Number.isInteger(d.dstNode) || !s.transport.hasNode(d.dstNode)) return { status: DmaStatus.BAD_NODE, reason: `node ${d.dstNode} is not on the fabric` };
    if (!s.smmu.streamForPd(d.pd)) return { status: DmaStatus.PD_ERR, reason: `node ${s.node} has no stream for protection domain ${d.pd}` };
    return undefined;
  }
}
