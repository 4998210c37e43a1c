// The completer of one node's PLDMA (rxe_comp's role): it reads the ACKs, NACKs and error
// ACKs that come back for the blocks this node sent, parks a transfer on a fault until the
// fault library answers (or its timer runs out), enforces the retry limits, and completes
// the transfer with a status that says which side failed and why.
import { MODEL_LABEL, realNowUs } from '../cost-model/index.js';
import { AckResp, type AckPacket, type Verdict } from '../fabric/packets.js';
import { EvtId } from '../smmu/records.js';
import type { Access, Translation } from '../smmu/smmu.js';
import type { FaultWaiters } from './fault-waiters.js';
import { MAX_RUN_BLOCKS } from './requester.js';
import {
  type Block,
  type DmaCompletion,
  DmaStatus,
  type EngineState,
  type FaultInfo,
  type Side,
  stallDelay,
  traceTransfer,
  type Transfer,
  walkCost,
} from './types.js';

const STATUS_FOR: Partial<Record<EvtId, { read: DmaStatus; write: DmaStatus }>> = {
  [EvtId.F_ADDR_SIZE]: { read: DmaStatus.SRC_ADDR_ERR, write: DmaStatus.DST_ADDR_ERR },
  [EvtId.F_PERMISSION]: { read: DmaStatus.SRC_PERM_ERR, write: DmaStatus.DST_PERM_ERR },
  [EvtId.C_BAD_STREAMID]: { read: DmaStatus.PD_ERR, write: DmaStatus.PD_ERR },
};

/** The status a destination's error ACK stands for. */
const STATUS_OF_RESP: Partial<Record<AckResp, DmaStatus>> = {
  [AckResp.PD_ERR]: DmaStatus.PD_ERR,
  [AckResp.ACCESS_ERR]: DmaStatus.DST_PERM_ERR,
  [AckResp.ADDR_ERR]: DmaStatus.DST_ADDR_ERR,
};

/** The status a fault that cannot be resolved ends a transfer with. */
export function statusForFault(id: EvtId, access: Access): DmaStatus {
  return STATUS_FOR[id]?.[access] ?? (access === 'read' ? DmaStatus.SRC_ADDR_ERR : DmaStatus.DST_ADDR_ERR);
}

export class Completer {
  #s: EngineState;
  #waiters: FaultWaiters;
  /** Write packets sent and not yet answered (the scheduler's capacity is in these). */
  outstanding = 0;

  constructor(state: EngineState, waiters: FaultWaiters) {
    this.#s = state;
    this.#waiters = waiters;
  }

  /** An ACK for this node: the answer to one of its writes, or a destination fault library's answer. */
  onAck(p: AckPacket): void {
    if (p.resp === AckResp.RESOLVED || p.resp === AckResp.UNRESOLVED) return this.#onResolvedAck(p);
    this.outstanding--;
    const s = this.#s;
    const t = s.transfers.get(p.tid);
    const live = t !== undefined && !t.done;
    for (const v of p.verdicts ?? []) {
      const b = t?.blocks[v.seq];
      const sent = b?.sent;
      if (!b || !sent) continue;
      b.sent = undefined;
      if (sent.window) s.smmu.endStallWindow(sent.window);
      if (live && b.state === 'inflight') this.#verdict(t, b, sent, v);
    }
    // After a destination fault, runs start small again: the blocks sent after a fault are
    // translated for nothing.
    if (live) t.runLimit = (p.returned?.length ?? 0) > 0 || t.parked ? 2 : Math.min(MAX_RUN_BLOCKS, t.runLimit * 2);
    for (const seq of p.returned ?? []) {
      const b = t?.blocks[seq];
      if (!b?.sent) continue;
      if (b.sent.window) s.smmu.endStallWindow(b.sent.window);
      b.sent = undefined;
      if (live && b.state === 'inflight') this.#unsend(t, b);
    }
    if (live) this.#settle(t);
    s.scheduler.kick();
  }

  // One block's answer. Its modelled engine and link time is reserved now, in block order.
  #verdict(t: Transfer, b: Block, sent: NonNullable<Block['sent']>, v: Verdict): void {
    const s = this.#s;
    const c = s.costs;
    const ch = s.chans.get(t.desc.channel)!;
    const issueAt = Math.max(ch.cursor, t.modelReady);
    const engineDone = s.engineRes.reserve(issueAt, sent.cost);
    ch.cursor = engineDone;
    const arrive = s.transport.transmit(s.node, t.desc.dstNode, b.length, engineDone);
    const srcStalls = sent.window?.stalls ?? 0;
    const stalls = srcStalls + (v.stalls ?? 0);
    const delay = stalls * stallDelay(c);
    if (stalls) {
      // A stalled access holds the engine until the resume: later blocks wait behind it.
      s.engineRes.reserve(arrive, delay);
      t.modelReady = Math.max(t.modelReady, arrive + delay);
      // Each stall is a fault whose access was retried in place (no retransmission).
      t.faults.source += srcStalls;
      t.faults.destination += v.stalls ?? 0;
      s.counters.faults.source += srcStalls;
    }
    if (sent.window?.aborted || v.resp === AckResp.ABORTED) {
      const which = sent.window?.aborted ? 'source read' : 'destination write';
      this.fail(
        t,
        b,
        DmaStatus.ABORTED,
        `a stalled ${which} was aborted (CMD_RESUME ABORT/TERM or CMD_STALL_TERM)`,
        arrive + delay,
        sent.window?.aborted ? 'source' : 'destination',
      );
      return;
    }
    switch (v.resp) {
      case AckResp.OK: {
        const ackAt = arrive + v.walkUs + delay + c.linkLatencyUs;
        // A retransmitted block's copy closes its fault in the trace: which thread copied it.
        if (b.attempts > 1) {
          const detail = { seq: b.seq, attempt: b.attempts, srcNode: s.node, thread: v.copyThread, copyNs: v.copyNs };
          traceTransfer(s.tracer, 'ack', s.node, t.tid, t.desc.channel, { modelUs: ackAt, detail });
        }
        this.ack(t, b, ackAt);
        return;
      }
      case AckResp.FAULT: {
        const at = v.late ? arrive + c.linkLatencyUs : arrive + v.walkUs + c.linkLatencyUs;
        t.nacks++;
        t.faults.destination++;
        t.faultStarted.push(realNowUs());
        s.counters.nacksReceived++;
        traceTransfer(s.tracer, 'nack', s.node, t.tid, t.desc.channel, { side: 'destination', modelUs: at, detail: { seq: b.seq } });
        this.park(t, b, at, 'destination');
        return;
      }
      case AckResp.SOURCE_FAULT: {
        // The page was there when translated and gone when the payload was read.
        const addr = sent.region.address + BigInt(v.faultOffset ?? sent.offset);
        const tr: Translation = { ok: false, id: EvtId.F_TRANSLATION, addr, recoverable: true, reason: 'source page evicted before the copy' };
        s.smmu.iotlb.invalidateRange(addr, sent.region.pageSize, sent.region.pageSize);
        this.blockFault(t, b, sent.sid, tr, issueAt + c.scheduleUs);
        return;
      }
      case AckResp.FLUSHED:
        this.fail(t, b, DmaStatus.FLUSHED, v.reason ?? 'the copy engine was closed', arrive, 'destination');
        return;
      default:
        this.fail(
          t,
          b,
          STATUS_OF_RESP[v.resp] ?? DmaStatus.DST_ADDR_ERR,
          v.reason ?? `destination answered ${AckResp[v.resp]}`,
          arrive + v.walkUs + c.linkLatencyUs,
          'destination',
        );
    }
  }

  // A block the responder did not get to: as if it had never been sent.
  #unsend(t: Transfer, b: Block): void {
    b.state = 'pending';
    b.attempts--;
    t.inflight--;
    this.#s.counters.blocksIssued--;
  }

  // After a write's answers: a source fault found right after the run counts only if the
  // run landed whole; a transfer that is failing ends once nothing of it is on the wire.
  #settle(t: Transfer): void {
    const h = t.held;
    if (h && t.inflight === 1) {
      t.held = undefined;
      if (t.parked || t.failing) {
        this.#unsend(t, h.b);
      } else {
        const s = this.#s;
        const c = s.costs;
        const ch = s.chans.get(t.desc.channel)!;
        const issueAt = Math.max(ch.cursor, t.modelReady);
        ch.cursor = s.engineRes.reserve(issueAt, h.cost);
        this.blockFault(t, h.b, h.sid, h.tr, issueAt + c.scheduleUs + walkCost(c, h.tr));
      }
    }
    if (t.failing && t.inflight === 0) this.finish(t, t.failing.status, t.failing.reason, t.failing.side);
  }

  /** A source-side fault of one block: an error if it cannot be resolved, else wait for the fault library. */
  blockFault(t: Transfer, b: Block, sid: number, tr: Extract<Translation, { ok: false }>, at: number): void {
    const s = this.#s;
    if (!tr.recoverable) {
      s.smmu.recordFault(sid, tr, 'read');
      this.fail(t, b, statusForFault(tr.id, 'read'), tr.reason, at, 'source');
      return;
    }
    t.faults.source++;
    s.counters.faults.source++;
    t.faultStarted.push(realNowUs());
    const info: FaultInfo = {
      node: s.node,
      sid,
      side: 'source',
      srcNode: s.node,
      tid: t.tid,
      channel: t.desc.channel,
      seq: b.seq,
      va: tr.addr,
      write: false,
      lengthHint: Math.max(0, t.desc.length - Number(tr.addr - t.desc.srcVa)),
      modelUs: at,
      detectedMs: performance.now(),
      issuedUs: b.issuedUs,
      issuedMs: b.issuedMs,
    };
    this.#waiters.add(info);
    traceTransfer(s.tracer, 'fault', s.node, t.tid, t.desc.channel, {
      side: 'source',
      modelUs: at,
      detail: { seq: b.seq, va: tr.addr, srcNode: s.node, issuedUs: b.issuedUs, issuedMs: b.issuedMs },
    });
    this.park(t, b, at, 'source');
    s.smmu.recordFault(sid, tr, 'read', { context: info });
  }

  /** The fault library answered a source fault of this node (through its driver). */
  sourceResolved(info: FaultInfo, ok: boolean, modelUs: number, fetched = 0): void {
    const t = this.#s.transfers.get(info.tid);
    if (!t || t.blocks[info.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
    traceTransfer(this.#s.tracer, 'resolved', this.#s.node, t.tid, t.desc.channel, {
      side: 'source',
      modelUs,
      detail: { seq: info.seq, srcNode: info.srcNode },
    });
    t.pagesFetched += fetched;
    if (ok) this.#unpark(t, modelUs);
    else
      this.fail(
        t,
        undefined,
        DmaStatus.FAULT_UNRESOLVED,
        `the fault library could not resolve the source fault at 0x${info.va.toString(16)}`,
        modelUs,
        'source',
      );
  }

  #onResolvedAck(p: AckPacket): void {
    const t = this.#s.transfers.get(p.tid);
    if (!t || t.blocks[p.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
    t.pagesFetched += p.fetched ?? 0;
    if (p.resp === AckResp.RESOLVED) this.#unpark(t, p.arrivesAt);
    else
      this.fail(
        t,
        undefined,
        DmaStatus.FAULT_UNRESOLVED,
        `node ${p.src}'s fault library could not resolve the destination fault`,
        p.arrivesAt,
        'destination',
      );
  }

  // The failed block waits for the retransmission request (or the timeout).
  park(t: Transfer, b: Block, at: number, side: Side): void {
    b.state = 'parked';
    t.parkedBlocks.push(b);
    t.parked = true;
    t.inflight--;
    t.modelReady = Math.max(t.modelReady, at);
    const faults = side === 'source' ? ++b.srcFaults : ++b.dstNacks;
    const limit = side === 'source' ? this.#s.retryLimit : (t.desc.retryLimit ?? this.#s.retryLimit);
    if (faults > limit) {
      this.fail(t, b, DmaStatus.RETRY_EXCEEDED, `block ${b.seq} took ${faults} ${side} faults (retry limit ${limit})`, at, side);
      return;
    }
    clearTimeout(t.parkTimer);
    t.parkTimer = setTimeout(() => {
      // Nobody answered (no fault library, a dropped notification): retry anyway, like an
      // RNR timer; the retry limit bounds it.
      if (t.done || !t.parked) return;
      this.#s.counters.retryTimeouts++;
      this.#unpark(t, t.modelReady);
    }, this.#s.faultTimeoutMs);
    t.parkTimer.unref?.();
    this.#s.scheduler.kick();
  }

  #unpark(t: Transfer, at: number): void {
    if (t.done) return;
    clearTimeout(t.parkTimer);
    t.parkTimer = undefined;
    for (const b of t.parkedBlocks.splice(0)) if (b.state === 'parked') b.state = 'pending';
    t.parked = false;
    t.modelReady = Math.max(t.modelReady, at);
    this.#s.scheduler.wake(t.desc.channel);
  }

  ack(t: Transfer, b: Block, ackAt: number): void {
    b.state = 'acked';
    b.ackAt = ackAt;
    t.inflight--;
    this.#s.counters.blocksAcked++;
    t.modelEnd = Math.max(t.modelEnd, ackAt);
    t.acked++;
    while (t.blocks[t.next]?.state === 'acked') t.next++;
    if (t.acked === t.blocks.length) this.finish(t, DmaStatus.SUCCESS);
    else this.#s.scheduler.kick();
  }

  fail(t: Transfer, b: Block | undefined, status: DmaStatus, reason: string, at: number, side: Side | undefined): void {
    if (b && b.state === 'inflight') {
      b.state = 'pending';
      t.inflight--;
    }
    t.modelEnd = Math.max(t.modelEnd, at);
    // A block still on the wire may yet land: complete after its answer, so the completion
    // counts exactly the bytes that arrived.
    t.failing ??= { status, reason, side };
    if (t.inflight === 0) this.finish(t, t.failing.status, t.failing.reason, t.failing.side);
  }

  finish(t: Transfer, status: DmaStatus, reason?: string, side?: Side): void {
    if (t.done) return;
    const s = this.#s;
    t.done = true;
    clearTimeout(t.parkTimer);
    s.transfers.delete(t.tid);
    const ch = s.chans.get(t.desc.channel);
    if (ch) {
      const i = ch.queue.indexOf(t);
      if (i >= 0) ch.queue.splice(i, 1);
      if (!ch.queue.length) s.scheduler.retire(ch.id);
      else s.scheduler.wake(ch.id);
      // Its engine slot is free: channels held back by the capacity limit may issue now.
      s.scheduler.kick();
    }
    if (status === DmaStatus.SUCCESS) s.counters.completed++;
    else s.counters.errors++;
    s.clock.now = Math.max(s.clock.now, t.modelEnd);
    const completion: DmaCompletion = {
      tid: t.tid,
      status,
      statusName: DmaStatus[status],
      descriptor: t.desc,
      bytes: status === DmaStatus.SUCCESS ? t.desc.length : t.blocks.filter((x) => x.state === 'acked').reduce((n, x) => n + x.length, 0),
      blocks: t.blocks.length,
      faults: { ...t.faults },
      retransmittedBlocks: t.retransmitted,
      nacks: t.nacks,
      pagesFetched: t.pagesFetched,
      model: { startUs: t.modelStart, endUs: t.modelEnd, us: t.modelEnd - t.modelStart, label: MODEL_LABEL },
      real: { us: realNowUs() - t.realStart, faultUs: t.faultUs },
    };
    if (reason) completion.reason = reason;
    if (side && status !== DmaStatus.SUCCESS) completion.side = side;
    // Checked here: the event's objects are not even built while nobody listens.
    if (s.tracer.active)
      traceTransfer(s.tracer, 'complete', s.node, t.tid, t.desc.channel, { modelUs: t.modelEnd, detail: { status: completion.statusName } });
    t.resolve(completion);
  }
}
