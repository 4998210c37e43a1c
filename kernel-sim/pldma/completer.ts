// The completer of one node's PLDMA (rxe_comp's role): it reads the ACKs, NACKs and error
// ACKs that come back for the blocks this node sent, parks a transfer on a fault until the
// fault library answers (or its timer runs out), enforces the retry limits, and completes
// the transfer with a status that says which side failed and why.
import { MODEL_LABEL, realNowUs } from '../cost-model/index.js';
import { AckResp, type AckPacket } from '../fabric/packets.js';
import { EvtId } from '../smmu/records.js';
import type { Access, Translation } from '../smmu/smmu.js';
import type { FaultWaiters } from './fault-waiters.js';
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

  /** An ACK for this node: the answer to one of its blocks, or a destination's fault library's answer. */
  onAck(p: AckPacket): void {
    if (p.resp === AckResp.RESOLVED || p.resp === AckResp.UNRESOLVED) return this.#onResolvedAck(p);
    this.outstanding--;
    const s = this.#s;
    const t = s.transfers.get(p.tid);
    const b = t?.blocks[p.seq];
    const sent = b?.sent;
    if (b) b.sent = undefined;
    if (sent?.window) s.smmu.endStallWindow(sent.window);
    if (!t || t.done || !b || !sent || b.state !== 'inflight') {
      s.scheduler.kick();
      return;
    }
    const srcStalls = sent.window?.stalls ?? 0;
    const stalls = srcStalls + (p.stalls ?? 0);
    const delay = stalls * stallDelay(s.costs);
    if (stalls) {
      // A stalled access holds the engine until the resume: later blocks wait behind it.
      s.engineRes.reserve(sent.arrive, delay);
      t.modelReady = Math.max(t.modelReady, sent.arrive + delay);
      // Each stall is a fault whose access was retried in place (no retransmission).
      t.faults.source += srcStalls;
      t.faults.destination += p.stalls ?? 0;
      s.counters.faults.source += srcStalls;
    }
    if (sent.window?.aborted || p.resp === AckResp.ABORTED) {
      const which = sent.window?.aborted ? 'source read' : 'destination write';
      this.fail(t, b, DmaStatus.ABORTED, `a stalled ${which} was aborted (CMD_RESUME ABORT/TERM or CMD_STALL_TERM)`, sent.arrive + delay, sent.window?.aborted ? 'source' : 'destination');
      return;
    }
    switch (p.resp) {
      case AckResp.OK:
        this.ack(t, b, p.arrivesAt + srcStalls * stallDelay(s.costs));
        return;
      case AckResp.FAULT:
        t.nacks++;
        t.faults.destination++;
        t.faultStarted.push(realNowUs());
        s.counters.nacksReceived++;
        traceTransfer(s.tracer, 'nack', s.node, t.tid, t.desc.channel, { side: 'destination', modelUs: p.arrivesAt, detail: { seq: b.seq } });
        this.park(t, b, p.arrivesAt, 'destination');
        return;
      case AckResp.SOURCE_FAULT: {
        // The page was there when translated and gone when the payload was read.
        const addr = sent.region.address + BigInt(p.faultOffset ?? sent.offset);
        const tr: Translation = { ok: false, id: EvtId.F_TRANSLATION, addr, recoverable: true, reason: 'source page evicted before the copy' };
        s.smmu.iotlb.invalidateRange(addr, sent.region.pageSize, sent.region.pageSize);
        this.blockFault(t, b, sent.sid, tr, sent.issueAt + s.costs.scheduleUs);
        return;
      }
      case AckResp.FLUSHED:
        this.fail(t, b, DmaStatus.FLUSHED, p.reason ?? 'the copy engine was closed', sent.arrive, 'destination');
        return;
      default:
        this.fail(t, b, STATUS_OF_RESP[p.resp] ?? DmaStatus.DST_ADDR_ERR, p.reason ?? `destination answered ${AckResp[p.resp]}`, p.arrivesAt, 'destination');
    }
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
  sourceResolved(info: FaultInfo, ok: boolean, modelUs: number): void {
    const t = this.#s.transfers.get(info.tid);
    if (!t || t.blocks[info.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
    traceTransfer(this.#s.tracer, 'resolved', this.#s.node, t.tid, t.desc.channel, { side: 'source', modelUs, detail: { seq: info.seq, srcNode: info.srcNode } });
    if (ok) this.#unpark(t, modelUs);
    else this.fail(t, undefined, DmaStatus.FAULT_UNRESOLVED, `the fault library could not resolve the source fault at 0x${info.va.toString(16)}`, modelUs, 'source');
  }

  #onResolvedAck(p: AckPacket): void {
    const t = this.#s.transfers.get(p.tid);
    if (!t || t.blocks[p.seq]?.state !== 'parked') return; // retried meanwhile: a late answer
    if (p.resp === AckResp.RESOLVED) this.#unpark(t, p.arrivesAt);
    else this.fail(t, undefined, DmaStatus.FAULT_UNRESOLVED, `node ${p.src}'s fault library could not resolve the destination fault`, p.arrivesAt, 'destination');
  }

  // The failed block waits for the retransmission request (or the timeout).
  park(t: Transfer, b: Block, at: number, side: Side): void {
    b.state = 'parked';
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
    for (let i = t.next; i < t.blocks.length; i++) if (t.blocks[i]!.state === 'parked') t.blocks[i]!.state = 'pending';
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
      model: { startUs: t.modelStart, endUs: t.modelEnd, us: t.modelEnd - t.modelStart, label: MODEL_LABEL },
      real: { us: realNowUs() - t.realStart, faultUs: t.faultUs },
    };
    if (reason) completion.reason = reason;
    if (side && status !== DmaStatus.SUCCESS) completion.side = side;
    traceTransfer(s.tracer, 'complete', s.node, t.tid, t.desc.channel, { modelUs: t.modelEnd, detail: { status: completion.statusName } });
    t.resolve(completion);
  }
}
