// The completer (rxe_comp), in two halves. Completer is the engine's (one per node's PLDMA):
// it reads the ACKs, NACKs and error ACKs that come back for the runs this node sent (a
// transfer's in the order it sent them), and the responses to its READ and atomic requests
// (what of them landed in its sinks), hands a fault to the fault unit (faults.ts: it parks the
// transfer until the fault library answers), and completes the transfer with a status that
// says which side failed and why. WqeCompleter (below) is a QP's: it turns the outcomes of
// the QP's WQEs into CQEs on its send CQ, in posting order, and frees their slots.
import { MODEL_LABEL, realNowUs } from '../cost-model/index.js';
import { AckResp, type AckPacket, RcOp, type Verdict, type WritePacket } from '../fabric/packets.js';
import type { Translation } from '../smmu/smmu.js';
import type { Faults } from './faults.js';
import { rnrTimerMs, type RcOdp } from './tables.js';
import type { CompletionRing } from '../device/cq-ring.js';
import { QpState, SendFlags, WcOpcode, WcStatus, WrOpcode } from '../device/ib.js';
import type { SendRing, SendWqe } from '../device/send-ring.js';
import {
  type Awaited,
  type DmaCompletion,
  requestKey,
  type SentRun,
  DmaStatus,
  type EngineState,
  MAX_RUN_BLOCKS,
  type Side,
  stallDelay,
  traceTransfer,
  type Transfer,
  walkCost,
} from '../pldma/types.js';

/** The status a destination's error ACK stands for. */
const STATUS_OF_RESP: Partial<Record<AckResp, DmaStatus>> = {
  [AckResp.PD_ERR]: DmaStatus.PD_ERR,
  [AckResp.ACCESS_ERR]: DmaStatus.DST_PERM_ERR,
  [AckResp.ADDR_ERR]: DmaStatus.DST_ADDR_ERR,
  [AckResp.DROPPED]: DmaStatus.DROPPED,
  [AckResp.INV_REQ]: DmaStatus.REM_INV_REQ,
  [AckResp.OP_ERR]: DmaStatus.REM_OP,
  [AckResp.FLUSHED]: DmaStatus.FLUSHED,
};

export class Completer {
  #s: EngineState;
  #faults: Faults;
  /** Write packets sent and not yet answered (the scheduler's capacity is in these). */
  outstanding = 0;
  /** When the block #reserve last reserved was issued, and the modelled delay of its stalls. */
  #issueAt = 0;
  #delay = 0;
  /** The fault NACK of the ACK being handled: its block and the answer it carries. */
  #nacked: { seq: number; resolved: Verdict['resolved'] } | undefined;

  constructor(state: EngineState, faults: Faults) {
    this.#s = state;
    this.#faults = faults;
  }

  /** The answer to one of this node's writes. */
  onAck(p: AckPacket): void {
    const s = this.#s;
    const t = s.transfers.get(p.tid);
    // A transfer's answers come back in the order its runs were sent. An answer to no run on
    // the wire (a transfer never sent, done, or not that run) is refused: it must not count
    // against the runs in flight, which the scheduler's capacity check trusts.
    const run = t && !t.done && t.runs[0]?.seq === p.seq ? t.runs.shift() : undefined;
    if (!t || !run) {
      s.counters.answersRefused++;
      return;
    }
    this.outstanding--;
    if (run.window) s.smmu.endStallWindow(run.window);
    for (const v of p.verdicts ?? []) if (!t.done) this.#verdict(t, run, v);
    // After a destination fault, runs start small again: the blocks sent after a fault are
    // translated for nothing.
    if (!t.done) t.runLimit = (p.returned?.count ?? 0) > 0 || t.parked ? 2 : Math.min(MAX_RUN_BLOCKS, t.runLimit * 2);
    if (p.returned && !t.done) this.#unsend(t, p.returned.seq, p.returned.count);
    if (!t.done) this.#settle(t);
    // A fault NACK carries its answer: the block goes again once this ACK is settled (a
    // source fault found behind it waits, as it would behind a parked block).
    const n = this.#nacked;
    this.#nacked = undefined;
    if (n && !t.done) this.#faults.nackAnswered(t, n.seq, n.resolved);
    s.scheduler.kick();
  }

  /** A run of one of this node's responses went out: it is done (nothing ACKs a response). */
  answerSent(t: Transfer): void {
    const s = this.#s;
    const run = !t.done ? t.runs.shift() : undefined;
    if (run) {
      this.outstanding--;
      if (run.window) s.smmu.endStallWindow(run.window);
      this.#verdict(t, run, { seq: run.seq, count: run.count, resp: AckResp.OK, walkUs: 0 });
      if (!t.done) this.#settle(t);
    }
    s.scheduler.kick();
  }

  /**
   * What landed of a response (READ_RESPONSE, ATOMIC_ACK) to one of this node's READ or atomic
   * requests, packet by packet in the order they came (rxe_comp's do_read, do_atomic): the
   * response is the request's acknowledgement. Bytes count where they continue what has landed
   * (a packet of a response asked for before a fault, or twice, lands nothing new and is passed
   * over); the request completes once every byte of its sinks has landed. A fault at a sink
   * (its page already resolved by this node's fault unit, or not within the fault timeout), or
   * a page of the responder's gone before the copy read it, sends the request again for the rest.
   */
  onResponse(p: WritePacket, verdicts: Verdict[]): void {
    const s = this.#s;
    const t = s.requests.get(requestKey(p.qpn!, p.psn!));
    const a = t?.answer;
    // Nothing of this request is on the wire (it waits to go again): a late packet.
    if (!t || !a || t.done || t.runs.length === 0) return;
    let walkUs = 0;
    a.heard = true;
    for (const v of verdicts) {
      const k = v.seq - p.seq;
      // A zero-length sink takes no byte, wherever it stands (rxe's copy_data skips it): the
      // responder sends nothing for it, so the bytes due next are the next sink's.
      this.#landed(t, a, 0);
      const sink = t.desc.sinks![a.sink];
      if (!sink || p.key !== sink.lkey || p.va + BigInt(k * p.blockSize) !== sink.addr + BigInt(a.within)) return;
      a.srcFaults.set(p.tid, p.srcFaults ?? 0);
      if (v.resp !== AckResp.OK) return this.#responseStopped(t, a, p, v);
      this.#landed(t, a, Math.min(p.length, (k + v.count) * p.blockSize) - k * p.blockSize);
      walkUs = v.walks ? v.walks[v.count - 1]! : v.walkUs;
    }
    if (a.landed < (t.desc.opcode === RcOp.ATOMIC ? 8 : (t.desc.dmaLength ?? 0))) return;
    for (const n of a.srcFaults.values()) t.faults.source += n;
    const run = t.runs.shift()!;
    this.outstanding--;
    const arrive = this.#reserve(t, run, 0, 0);
    this.ack(t, 0, 1, Math.max(arrive, p.arrivals[p.count - 1]! + walkUs));
    s.scheduler.kick();
  }

  /**
   * RC's local ACK timer of a READ or an atomic (rxe's retrans timer): each period in which
   * nothing of its response came while the request was on the wire counts one retry; after
   * retries + 1 such periods in a row the request ends RETRY_EXCEEDED, never waiting forever.
   * A period in which it waited to go again (a sink fault) or heard anything counts none.
   */
  armResponseTimer(t: Transfer, rt: { periodMs: number; retries: number }): void {
    const a = t.answer!;
    a.misses = 0;
    const tick = () => {
      if (t.done) return;
      if (a.heard || t.runs.length === 0) {
        a.heard = false;
        a.misses = 0;
      } else if (++a.misses! > rt.retries) {
        a.timer = undefined;
        this.#s.counters.retryTimeouts++;
        const reason = `no response to the ${t.desc.opcode === RcOp.ATOMIC ? 'atomic' : 'READ'} within ${rt.retries + 1} × ${rt.periodMs} ms (the QP's timeout × (retry_cnt + 1))`;
        this.finish(t, DmaStatus.RETRY_EXCEEDED, reason, 'source');
        return;
      }
      a.timer = setTimeout(tick, rt.periodMs);
      a.timer.unref?.();
    };
    // Unref'd, as every timer of the engine: it never keeps a process alive by itself.
    a.timer = setTimeout(tick, rt.periodMs);
    a.timer.unref?.();
  }

  // Bytes of a response landed where the next ones were due: on to the next sink when one is full.
  #landed(t: Transfer, a: Awaited, bytes: number): void {
    const sinks = t.desc.sinks!;
    a.landed += bytes;
    a.within += bytes;
    while (a.sink < sinks.length && a.within >= sinks[a.sink]!.length) {
      a.within -= sinks[a.sink]!.length;
      a.sink++;
    }
  }

  // A response stopped where the next bytes were due: the request goes again for the rest
  // (after a sink fault, once this node's fault library answered), or ends with the error.
  #responseStopped(t: Transfer, a: Awaited, p: WritePacket, v: Verdict): void {
    const s = this.#s;
    const run = t.runs.shift()!;
    this.outstanding--;
    const at = Math.max(this.#reserve(t, run, 0, 0), p.arrivals[v.seq - p.seq]!) + v.walkUs;
    switch (v.resp) {
      case AckResp.FAULT: {
        t.faults.destination++;
        // The fault began when this node's responder found it, the time it held it ago.
        t.faultStarted.push(realNowUs() - (v.resolved?.heldUs ?? 0));
        traceTransfer(s.tracer, 'nack', s.node, t.tid, t.desc.channel, { side: 'destination', modelUs: at, detail: { seq: 0, response: true } });
        // Bytes landed since the last fault: the retry limit counts this sink's faults afresh.
        const st = t.own.get(0);
        if (st && a.landed > a.faultedAt) st.dstNacks = 0;
        a.faultedAt = a.landed;
        a.refault = { node: p.src, tid: p.tid, seq: v.seq };
        this.#faults.park(t, 0, at, 'destination');
        this.#faults.nackAnswered(t, 0, v.resolved);
        break;
      }
      case AckResp.UNRESOLVED:
        t.faults.destination++;
        this.fail(
          t,
          true,
          DmaStatus.FAULT_UNRESOLVED,
          `node ${s.node}'s fault library could not resolve the fault at the response's sink`,
          at,
          'destination',
        );
        break;
      case AckResp.SOURCE_FAULT:
        // A page of the responder's went away before the copy read it: ask again (its own SMMU faults on it then).
        this.#unsend(t, 0, 1);
        t.modelReady = Math.max(t.modelReady, at);
        s.scheduler.wake(t.desc.channel);
        break;
      default:
        this.fail(
          t,
          true,
          STATUS_OF_RESP[v.resp] ?? DmaStatus.FLUSHED,
          v.reason ?? `the response was not placed: ${AckResp[v.resp]}`,
          at,
          'destination',
        );
    }
    s.scheduler.kick();
  }

  // Bytes of block `seq` of a transfer.
  #length(t: Transfer, seq: number): number {
    const bs = this.#s.blockSize;
    return Math.min(bs, t.desc.length - seq * bs);
  }

  // The modelled engine and link time of block j of a run, reserved now (in block order), and
  // the stalls it took; returns its arrival, the stalls' delay in #delay.
  #reserve(t: Transfer, run: SentRun, j: number, dstStalls: number): number {
    const s = this.#s;
    const ch = s.chans.get(t.desc.channel)!;
    const issueAt = (this.#issueAt = Math.max(ch.cursor, t.modelReady));
    const engineDone = s.engineRes.reserve(issueAt, run.costs[j]!);
    ch.cursor = engineDone;
    const arrive = s.transport.transmit(s.node, t.desc.dstNode, this.#length(t, run.seq + j), engineDone);
    const srcStalls = run.window?.stalls ?? 0;
    const stalls = srcStalls + dstStalls;
    this.#delay = stalls * stallDelay(s.costs);
    if (stalls) {
      // A stalled access holds the engine until the resume: later blocks wait behind it.
      s.engineRes.reserve(arrive, this.#delay);
      t.modelReady = Math.max(t.modelReady, arrive + this.#delay);
      // Each stall is a fault whose access was retried in place (no retransmission).
      t.faults.source += srcStalls;
      t.faults.destination += dstStalls;
      s.counters.faults.source += srcStalls;
    }
    return arrive;
  }

  // An answer for blocks of a run: the ones written (reserved and acked in one loop), or
  // the one that was not (rxe_comp's check_ack: an ACK, a NAK and its syndrome).
  #verdict(t: Transfer, run: SentRun, v: Verdict): void {
    if (v.resp === AckResp.OK && !run.window?.aborted) return this.#acked(t, run, v);
    const j0 = v.seq - run.seq;
    const arrive = this.#reserve(t, run, j0, v.stalls ?? 0);
    if (run.window?.aborted || v.resp === AckResp.ABORTED) {
      const which = run.window?.aborted ? 'source read' : 'destination write';
      const side: Side = run.window?.aborted ? 'source' : 'destination';
      this.fail(t, true, DmaStatus.ABORTED, `a stalled ${which} was aborted (CMD_RESUME ABORT/TERM or CMD_STALL_TERM)`, arrive + this.#delay, side);
      return;
    }
    this.#nak(t, run, v, arrive);
  }

  // Blocks written: their modelled times reserved block by block, the transfer acked up to them.
  #acked(t: Transfer, run: SentRun, v: Verdict): void {
    const s = this.#s;
    const { end, firstAck } = !v.stalls && !run.window?.stalls ? this.#reserveRun(t, run, v) : this.#reserveStalled(t, run, v);
    // A retransmitted block's copy closes its fault in the trace: which thread copied it.
    const own = t.own.size ? t.own.get(v.seq) : undefined;
    if (own && own.attempts > 1) {
      const detail = { seq: v.seq, attempt: own.attempts, srcNode: s.node, thread: v.copyThread, copyNs: v.copyNs };
      traceTransfer(s.tracer, 'ack', s.node, t.tid, t.desc.channel, { modelUs: firstAck, detail });
    }
    this.ack(t, v.seq, v.count, end);
  }

  // No stalls (every write but a stall-mode one): #reserve's arithmetic, block by block, with
  // its lookups made once per verdict (a run is up to MAX_RUN_BLOCKS blocks).
  #reserveRun(t: Transfer, run: SentRun, v: Verdict): { end: number; firstAck: number } {
    const s = this.#s;
    const c = s.costs;
    const j0 = v.seq - run.seq;
    let end = t.modelEnd;
    let firstAck = 0;
    const ch = s.chans.get(t.desc.channel)!;
    const ready = t.modelReady;
    const { node, engineRes, transport, blockSize: bs } = s;
    const { dstNode, length } = t.desc;
    const costs = run.costs;
    const walks = v.walks;
    let issueAt = this.#issueAt;
    for (let j = j0; j < j0 + v.count; j++) {
      issueAt = Math.max(ch.cursor, ready);
      const engineDone = engineRes.reserve(issueAt, costs[j]!);
      ch.cursor = engineDone;
      const arrive = transport.transmit(node, dstNode, Math.min(bs, length - (run.seq + j) * bs), engineDone);
      const ackAt = arrive + (walks ? walks[j - j0]! : v.walkUs) + c.linkLatencyUs;
      if (j === j0) firstAck = ackAt;
      if (ackAt > end) end = ackAt;
    }
    this.#issueAt = issueAt;
    this.#delay = 0;
    return { end, firstAck };
  }

  // A stall-mode write is one block: its stalls are that block's.
  #reserveStalled(t: Transfer, run: SentRun, v: Verdict): { end: number; firstAck: number } {
    const c = this.#s.costs;
    const j0 = v.seq - run.seq;
    let end = t.modelEnd;
    let firstAck = 0;
    for (let j = j0; j < j0 + v.count; j++) {
      const arrive = this.#reserve(t, run, j, j === j0 ? (v.stalls ?? 0) : 0);
      const ackAt = arrive + (v.walks ? v.walks[j - j0]! : v.walkUs) + this.#delay + c.linkLatencyUs;
      if (j === j0) firstAck = ackAt;
      if (ackAt > end) end = ackAt;
    }
    return { end, firstAck };
  }

  // A NAK (or an error ACK) for block v.seq, reserved to arrive at `arrive`: its syndrome says
  // what comes next: a fault parked, an RNR wait, a source fault, or the transfer's end.
  #nak(t: Transfer, run: SentRun, v: Verdict, arrive: number): void {
    const s = this.#s;
    const c = s.costs;
    switch (v.resp) {
      case AckResp.FAULT:
      case AckResp.UNRESOLVED:
        return this.#faultNak(t, v, v.late ? arrive + c.linkLatencyUs : arrive + v.walkUs + c.linkLatencyUs);
      case AckResp.RNR: {
        const at = arrive + c.linkLatencyUs;
        t.nacks++;
        s.counters.nacksReceived++;
        traceTransfer(s.tracer, 'nack', s.node, t.tid, t.desc.channel, { side: 'destination', modelUs: at, detail: { seq: v.seq, rnr: true } });
        this.#faults.rnr(t, v.seq, at, rnrTimerMs(v.rnrTimer ?? 0));
        return;
      }
      case AckResp.SOURCE_FAULT: {
        // The page was there when translated and gone when the payload was read.
        const j0 = v.seq - run.seq;
        const addr = run.region.address + BigInt(v.faultOffset ?? run.offset + j0 * s.blockSize);
        const tr = this.#faults.evicted(addr, run.region.pageSize, 'source page evicted before the copy');
        this.blockFault(t, v.seq, run.sid, tr, this.#issueAt + c.scheduleUs, run.issuedUs[j0]!, run.issuedMs);
        return;
      }
      case AckResp.FLUSHED:
        this.fail(t, true, DmaStatus.FLUSHED, v.reason ?? 'the copy engine was closed', arrive, 'destination');
        return;
      case AckResp.ANSWER_ERR:
        // A READ's or an atomic's answer ended so: the request ends the same way.
        this.#answered(t, v);
        this.fail(t, true, v.answer!.status as DmaStatus, v.reason ?? `the answer ended ${DmaStatus[v.answer!.status]}`, arrive, v.answer!.side);
        return;
      default: {
        const status = STATUS_OF_RESP[v.resp] ?? DmaStatus.DST_ADDR_ERR;
        this.fail(t, true, status, v.reason ?? `destination answered ${AckResp[v.resp]}`, arrive + v.walkUs + c.linkLatencyUs, 'destination');
      }
    }
  }

  // A fault NACK (at `at`, modelled): counted, and the block parked until the answer it carries
  // says go (or the transfer ends if the fault library could not resolve it).
  #faultNak(t: Transfer, v: Verdict, at: number): void {
    const s = this.#s;
    const seq = v.seq;
    // An atomic's word is the source of its answer (read first): its fault counts there.
    const side: Side = t.desc.opcode === RcOp.ATOMIC ? 'source' : 'destination';
    t.nacks++;
    t.faults[side]++;
    // The fault began when the destination found it, the time it held its NACK ago.
    t.faultStarted.push(realNowUs() - (v.resolved?.heldUs ?? 0));
    s.counters.nacksReceived++;
    traceTransfer(s.tracer, 'nack', s.node, t.tid, t.desc.channel, { side: 'destination', modelUs: at, detail: { seq } });
    if (v.resp === AckResp.UNRESOLVED) {
      const reason = `node ${t.desc.dstNode}'s fault library could not resolve the ${side === 'source' ? "atomic's word" : 'destination'} fault`;
      this.fail(t, true, DmaStatus.FAULT_UNRESOLVED, reason, at, side);
      return;
    }
    // The NACK carries the fault library's answer (or says none came in time): the block
    // is parked, counted against its retry limit, and goes again when the answer says.
    this.#faults.park(t, seq, at, side);
    this.#nacked = { seq, resolved: v.resolved };
  }

  // A READ's or an atomic's response that could not be sent: what it took is this transfer's too.
  #answered(t: Transfer, v: Verdict): void {
    if (!v.answered) return;
    t.faults.source += v.answered.faults.source;
    t.faults.destination += v.answered.faults.destination;
    t.retransmitted += v.answered.retransmittedBlocks;
    t.pagesFetched += v.answered.majorFaults;
  }

  // Blocks the responder did not get to: as if they had never been sent.
  #unsend(t: Transfer, seq: number, count: number): void {
    t.inflight -= count;
    this.#s.counters.blocksIssued -= count;
    if (seq < t.cursor) t.cursor = seq;
    if (t.own.size) for (const [k, st] of t.own) if (k >= seq && k < seq + count) st.attempts--;
  }

  // After a write's answers: a source fault found behind the runs on the wire counts only if
  // they landed whole; a transfer that is failing ends once nothing of it is on the wire.
  #settle(t: Transfer): void {
    const h = t.held;
    if (h && t.inflight === 1) {
      t.held = undefined;
      if (t.parked || t.failing) {
        this.#unsend(t, h.seq, 1);
      } else {
        const s = this.#s;
        const c = s.costs;
        const ch = s.chans.get(t.desc.channel)!;
        const issueAt = Math.max(ch.cursor, t.modelReady);
        ch.cursor = s.engineRes.reserve(issueAt, h.cost);
        this.blockFault(t, h.seq, h.sid, h.tr, issueAt + c.scheduleUs + walkCost(c, h.tr), h.issuedUs, h.issuedMs);
      }
    }
    if (t.failing && t.inflight === 0) this.finish(t, t.failing.status, t.failing.reason, t.failing.side);
  }

  /** A source-side fault of block `seq`: an error if it cannot be resolved, else the fault unit parks the transfer. */
  blockFault(t: Transfer, seq: number, sid: number, tr: Extract<Translation, { ok: false }>, at: number, issuedUs: number, issuedMs: number): void {
    if (tr.recoverable) return this.#faults.source(t, seq, sid, tr, at, issuedUs, issuedMs);
    this.fail(t, true, this.#faults.refused(sid, tr, 'read'), tr.reason, at, 'source');
  }

  /** Blocks [seq, seq+count) landed; the last of them acked at `ackAt` (modelled). */
  ack(t: Transfer, seq: number, count: number, ackAt: number): void {
    const s = this.#s;
    t.inflight -= count;
    s.counters.blocksAcked += count;
    t.modelEnd = Math.max(t.modelEnd, ackAt);
    t.acked += count;
    t.ackedBytes += Math.min(count * s.blockSize, t.desc.length - seq * s.blockSize);
    // Blocks are acked in order: no block before these needs state of its own any more.
    if (t.own.size) for (const k of t.own.keys()) if (k < seq + count) t.own.delete(k);
    if (t.acked === t.blocks) this.finish(t, DmaStatus.SUCCESS);
    else s.scheduler.kick();
  }

  /** End `t` with an error once what is on the wire has landed (`onWire`: the block it is about was one of those). */
  fail(t: Transfer, onWire: boolean, status: DmaStatus, reason: string, at: number, side: Side | undefined): void {
    if (onWire) t.inflight--;
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
    if (t.answer?.timer) clearTimeout(t.answer.timer);
    // Its runs still on the wire are in flight no more: their answers, if any come, are refused.
    this.outstanding -= t.runs.length;
    s.transfers.delete(t.tid);
    if (t.answer) {
      const k = requestKey(t.desc.srcQp!, t.desc.psn!);
      if (s.requests.get(k) === t) s.requests.delete(k);
    }
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
      bytes: status === DmaStatus.SUCCESS ? t.desc.length : t.ackedBytes,
      blocks: t.blocks,
      faults: { source: t.faults.source, destination: t.faults.destination },
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

// ---------------------------------------------------------------------------------------------
// The QP's completer (rxe_comp's WQE half): the outcome of each WQE its requester started
// becomes a CQE on the send CQ, in posting order, and only then is its slot in the send ring
// free (rxe_queue.h: the consumer index moves at completion). A WQE that fails takes the QP to
// ERR; the ones behind it complete WR_FLUSH_ERR.

/** The work completion opcode of each send opcode (rxe_comp's wr_to_wc_opcode). */
export const WC_OPCODE: Record<WrOpcode, WcOpcode> = {
  [WrOpcode.RDMA_WRITE]: WcOpcode.RDMA_WRITE,
  [WrOpcode.RDMA_WRITE_WITH_IMM]: WcOpcode.RDMA_WRITE,
  [WrOpcode.SEND]: WcOpcode.SEND,
  [WrOpcode.SEND_WITH_IMM]: WcOpcode.SEND,
  [WrOpcode.RDMA_READ]: WcOpcode.RDMA_READ,
  [WrOpcode.ATOMIC_CMP_AND_SWP]: WcOpcode.COMP_SWAP,
  [WrOpcode.ATOMIC_FETCH_AND_ADD]: WcOpcode.FETCH_ADD,
  [WrOpcode.FLUSH]: WcOpcode.FLUSH,
  [WrOpcode.ATOMIC_WRITE]: WcOpcode.ATOMIC_WRITE,
};

/** How a WQE ended: its status, the bytes its completion reports, its faults and times. */
export type Outcome = { status: WcStatus; byteLen: number; odp: RcOdp };

/**
 * What the requester hands over for a WQE: the transfers it posted (their outcomes) and the
 * bytes of the message, or the local error that kept it from posting any.
 */
export type Executed = { results: DmaCompletion[]; byteLen: number } | { status: WcStatus };

/** The outcome of an executed WQE (the completer's verdict: statusOf, done). */
export function outcomeOf(e: Executed): Outcome {
  return 'status' in e ? fail(e.status) : done(statusOf(e.results), e.byteLen, e.results);
}

/** What the completer needs of its QP (rc/qp.ts's RcQueuePair). */
export interface WqeCompleterQp {
  readonly qpNum: number;
  readonly state: QpState;
  readonly destroyed: boolean;
  readonly destQpNum: number;
  readonly sqSigAll: boolean;
  readonly sq: SendRing<SendWqe>;
  readonly sendCq: CompletionRing;
  toError(): void;
}

export class WqeCompleter {
  readonly #qp: WqeCompleterQp;
  /** WQEs started and not yet completed, in posting order (their slots are still the device's). */
  readonly #inflight: SendWqe[] = [];
  /** Settles when the last WQE started has completed: each completion waits for the one before. */
  #chain: Promise<void> = Promise.resolve();

  constructor(qp: WqeCompleterQp) {
    this.#qp = qp;
  }

  /** WQEs started and not yet completed. */
  get inflight(): number {
    return this.#inflight.length;
  }

  /** The oldest WQE in flight. */
  get first(): SendWqe | undefined {
    return this.#inflight[0];
  }

  /**
   * The requester started `wqe`, whose outcome `exec` settles with: it completes once it and
   * every WQE before it are done; then `next` (the requester's kick) starts what may start.
   */
  started(wqe: SendWqe, exec: Promise<Executed>, next: () => void): void {
    const q = this.#qp;
    this.#inflight.push(wqe);
    this.#chain = this.#chain.then(async () => {
      const result = await exec;
      // destroy() flushed it already.
      if (this.#inflight[0] !== wqe) return;
      this.#inflight.shift();
      // A WQE before it failed: the QP is in ERR and this one is flushed, whatever it did.
      const out = q.state === QpState.ERR ? fail(WcStatus.WR_FLUSH_ERR) : outcomeOf(result);
      const signaled = q.sqSigAll || ((wqe.sendFlags ?? 0) & SendFlags.SIGNALED) !== 0;
      if (signaled || out.status !== WcStatus.SUCCESS) this.#cqe(wqe, out.status, out.byteLen, out.odp);
      q.sq.advanceConsumer();
      if (out.status !== WcStatus.SUCCESS) q.toError();
      if (!q.destroyed) next();
    });
  }

  /** A WQE the QP's ERR (or its destruction) flushes before it started: WR_FLUSH_ERR, slot freed. */
  flushed(wqe: SendWqe): void {
    this.#cqe(wqe, WcStatus.WR_FLUSH_ERR, 0, undefined);
    this.#qp.sq.advanceConsumer();
  }

  /** The QP is destroyed: the WQEs in flight complete WR_FLUSH_ERR now, oldest first (their outcomes are dropped). */
  flushInflight(): void {
    for (const wqe of this.#inflight.splice(0)) this.flushed(wqe);
  }

  // The CQE of a send WQE; a CQ that overran takes the QP to ERR.
  #cqe(wqe: SendWqe, status: WcStatus, byteLen: number, odp: RcOdp | undefined): void {
    const q = this.#qp;
    const opcode = WC_OPCODE[wqe.opcode] ?? WcOpcode.SEND;
    if (!q.sendCq.complete(BigInt(wqe.wrId), status, opcode, byteLen, q.qpNum, q.destQpNum, undefined, odp)) q.toError();
  }
}

export function emptyOdp(): RcOdp {
  return { faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
}

export function fail(status: WcStatus): Outcome {
  return { status, byteLen: 0, odp: emptyOdp() };
}

/** The outcome of a WQE whose bytes moved in `results`. */
export function done(status: WcStatus, byteLen: number, results: DmaCompletion[]): Outcome {
  const odp = emptyOdp();
  let start = Infinity;
  let end = 0;
  for (const r of results) {
    odp.faults.source += r.faults.source;
    odp.faults.destination += r.faults.destination;
    odp.retransmittedBlocks += r.retransmittedBlocks;
    odp.majorFaults += r.pagesFetched;
    odp.realUs = Math.max(odp.realUs, r.real.us);
    start = Math.min(start, r.model.startUs);
    end = Math.max(end, r.model.endUs);
  }
  odp.modelUs = results.length ? end - start : 0;
  return { status, byteLen: status === WcStatus.SUCCESS ? byteLen : 0, odp };
}

/** The work completion status of a transfer's outcome; the completion says which side failed. */
export function statusOf(results: DmaCompletion[]): WcStatus {
  for (const r of results) {
    switch (r.status) {
      case DmaStatus.SUCCESS:
        continue;
      case DmaStatus.SRC_ADDR_ERR:
      case DmaStatus.SRC_PERM_ERR:
        return WcStatus.LOC_PROT_ERR;
      case DmaStatus.DST_ADDR_ERR:
      case DmaStatus.DST_PERM_ERR:
      case DmaStatus.PD_ERR:
        return WcStatus.REM_ACCESS_ERR;
      case DmaStatus.RETRY_EXCEEDED:
        return r.side === 'destination' ? WcStatus.RNR_RETRY_EXC_ERR : WcStatus.RETRY_EXC_ERR;
      case DmaStatus.FAULT_UNRESOLVED:
        return r.side === 'destination' ? WcStatus.REM_ACCESS_ERR : WcStatus.LOC_PROT_ERR;
      case DmaStatus.ABORTED:
        return WcStatus.REM_ABORT_ERR;
      case DmaStatus.FLUSHED:
        return WcStatus.WR_FLUSH_ERR;
      case DmaStatus.DROPPED:
        return WcStatus.RETRY_EXC_ERR;
      case DmaStatus.REM_INV_REQ:
        return WcStatus.REM_INV_REQ_ERR;
      case DmaStatus.REM_OP:
        return WcStatus.REM_OP_ERR;
      default:
        return WcStatus.GENERAL_ERR;
    }
  }
  return WcStatus.SUCCESS;
}
