// The fault unit of one node's PLDMA (rdma_rxe's rxe_odp): everything a fault is, on either
// side, in one place. It builds a fault's context (FaultInfo: one builder for source,
// destination and stall windows), records it in the SMMU's event queue and counts it, keeps
// the blocks waiting on a page (one answer serves every block waiting on it: the driver
// merges their notifications), parks a transfer on a fault and unparks it (retry limits, the
// park timer), and fans the fault library's answer out: a source block is re-queued, a
// destination block's fault NACK, held by the responder until then, goes out carrying the
// answer (so a faulting write is the write, its NACK, the retransmission and its ACK). It also
// models what the answer cost and tells the driver when the block went out again, so the
// SMMU driver keeps no engine bookkeeping.
import { realNowUs } from '../cost-model/index.js';
import { isResponse, type WritePacket } from '../fabric/packets.js';
import type { ResolveMethod } from '../netlink/messages.js';
import { IommuPageResponseCode } from '../smmu-driver/iopf.js';
import { EvtId } from '../smmu/records.js';
import type { Access, Translation } from '../smmu/smmu.js';
import { DmaStatus, type EngineState, type FaultInfo, type Side, traceTransfer, type Transfer } from '../pldma/types.js';

/** A translation that failed: what a fault is. */
export type Fault = Extract<Translation, { ok: false }>;

const STATUS_FOR: Partial<Record<EvtId, { read: DmaStatus; write: DmaStatus }>> = {
  [EvtId.F_ADDR_SIZE]: { read: DmaStatus.SRC_ADDR_ERR, write: DmaStatus.DST_ADDR_ERR },
  [EvtId.F_PERMISSION]: { read: DmaStatus.SRC_PERM_ERR, write: DmaStatus.DST_PERM_ERR },
  [EvtId.C_BAD_STREAMID]: { read: DmaStatus.PD_ERR, write: DmaStatus.PD_ERR },
};

/** The status a fault that cannot be resolved ends a transfer with. */
export function statusForFault(id: EvtId, access: Access): DmaStatus {
  return STATUS_FOR[id]?.[access] ?? (access === 'read' ? DmaStatus.SRC_ADDR_ERR : DmaStatus.DST_ADDR_ERR);
}

/** What the fault library answered for a fault, as the driver hands it on (iommu_page_response and the library's report). */
export interface PageResponse {
  status: IommuPageResponseCode;
  /** How the library made the pages resident, and how many bytes it asked for. */
  method: ResolveMethod;
  bytes: number;
  /** Pages a page store supplied (remote paging's major faults). */
  fetched: number;
}

/** Told when the block whose fault was answered goes out again (modelled µs, performance.now() ms). */
export type SentAgain = (modelUs: number, realMs: number) => void;

/**
 * What a destination fault's NACK carries once the fault library answered: whether the pages
 * are there, when (modelled µs) the answer reaches the block's source, and pages a page store
 * supplied. Undefined when no answer came within the fault timeout.
 */
export interface HeldAnswer {
  ok: boolean;
  atUs: number;
  fetched: number;
  /** Real µs from the fault's detection to the answer. */
  heldUs: number;
}

/** Where a fault happened, as its side knows it: the one FaultInfo builder's input. */
export interface FaultSite {
  sid: number;
  /** Node that posted the transfer, its transfer id and channel, the block. */
  srcNode: number;
  tid: number;
  channel: number;
  seq: number;
  /** The faulting address, and the transfer's bytes from it on (the Touch-Ahead hint). */
  va: bigint;
  lengthHint: number;
  /** Modelled detection; when the block was issued (modelled µs, performance.now() ms). */
  modelUs: number;
  issuedUs: number;
  issuedMs: number;
}

/** @internal How the unit ends a transfer (the completer's fail, once its blocks on the wire are answered). */
export type EndTransfer = (t: Transfer, onWire: boolean, status: DmaStatus, reason: string, at: number, side: Side) => void;

/** @internal The fault unit of one node's PLDMA (see the top of this file). */
export class Faults {
  #s: EngineState;
  #end: EndTransfer;
  /** Blocks waiting on a page, by stream and page. */
  #waiting = new Map<string, FaultInfo[]>();
  /** Answers whose driver waits for their block to go out again (srcNode:tid:seq:side). */
  #sentAgain = new Map<string, SentAgain>();
  /** Destination faults whose NACK the responder holds until the answer (or the fault timeout). */
  #held = new Map<FaultInfo, (a: Omit<HeldAnswer, 'heldUs'> | undefined) => void>();

  constructor(state: EngineState, end: EndTransfer) {
    this.#s = state;
    this.#end = end;
  }

  /**
   * A page that translated and was gone when the copy engine reached it (the copy's own
   * fault): its IOTLB entries dropped, and the fault it is, F_TRANSLATION and recoverable.
   * The one place such a translation is built, for either side.
   */
  evicted(addr: bigint, pageSize: number, reason: string): Fault {
    this.#s.smmu.iotlb.invalidateRange(addr, pageSize, pageSize);
    return { ok: false, id: EvtId.F_TRANSLATION, addr, recoverable: true, reason };
  }

  /**
   * A fault no answer can resolve (F_PERMISSION, F_ADDR_SIZE, no stream): recorded in the
   * SMMU's event queue, and the status the transfer ends with.
   */
  refused(sid: number, tr: Fault, access: Access): DmaStatus {
    this.#s.smmu.recordFault(sid, tr, access);
    return statusForFault(tr.id, access);
  }

  /** The context of a fault of this node's `side` (the one builder of FaultInfo). */
  info(side: Side, at: FaultSite): FaultInfo {
    return { node: this.#s.node, side, write: side === 'destination', detectedMs: performance.now(), ...at };
  }

  /**
   * A recoverable fault of the source of block `seq` (its transfer's first block not acked):
   * recorded, and the transfer parked until the fault library answers.
   */
  source(t: Transfer, seq: number, sid: number, tr: Fault, at: number, issuedUs: number, issuedMs: number): void {
    const s = this.#s;
    t.faults.source++;
    s.counters.faults.source++;
    t.faultStarted.push(realNowUs());
    const d = t.desc;
    const info = this.info('source', {
      sid,
      srcNode: s.node,
      tid: t.tid,
      channel: d.channel,
      seq,
      va: tr.addr,
      lengthHint: Math.max(0, d.length - Number(tr.addr - d.srcVa)),
      modelUs: at,
      issuedUs,
      issuedMs,
    });
    this.wait(info);
    this.park(t, seq, at, 'source');
    this.#raise(info, tr);
  }

  /**
   * A recoverable fault of the destination of block `i` of a write this node received:
   * recorded here; the responder holds its NACK until the fault library's answer (which it
   * carries back to the source), or until the fault timeout (a NACK without one: the source
   * goes again at once, as its park timer would have).
   */
  destination(p: WritePacket, i: number, sid: number, tr: Fault, at: number, base: bigint = p.va, nack = true): Promise<HeldAnswer | undefined> {
    const s = this.#s;
    s.counters.faults.destination++;
    // A response's sink fault sends no NACK (its requester asks again), nor an atomic's word held here.
    if (nack && !isResponse(p.opcode)) s.counters.nacksSent++;
    const info = this.destinationInfo(p, i, sid, tr.addr, at, base);
    const t0 = realNowUs();
    const answered = new Promise<HeldAnswer | undefined>((resolve) => {
      const timer = setTimeout(() => this.#release(info, undefined), s.faultTimeoutMs);
      timer.unref?.();
      this.#held.set(info, (a) => {
        clearTimeout(timer);
        resolve(a && { ...a, heldUs: realNowUs() - t0 });
      });
    });
    this.wait(info);
    this.#raise(info, tr);
    return answered;
  }

  // A held NACK goes out: with the answer, or (undefined) without one.
  #release(info: FaultInfo, a: Omit<HeldAnswer, 'heldUs'> | undefined): void {
    const go = this.#held.get(info);
    if (!go) return;
    this.#held.delete(info);
    go(a);
  }

  /** The engine closes: every held NACK goes out now, without an answer. */
  close(): void {
    for (const info of [...this.#held.keys()]) this.#release(info, undefined);
  }

  /** The context of a fault at block i of a write (at `va`, the faulting page or the block; `base`: where the packet's bytes start landing). */
  destinationInfo(p: WritePacket, i: number, sid: number, va: bigint, at: number, base: bigint = p.va): FaultInfo {
    return this.info('destination', {
      sid,
      srcNode: p.src,
      tid: p.tid,
      channel: p.channel,
      seq: p.seq + i,
      va,
      lengthHint: Math.max(0, p.lengthHint - Number(va - base)),
      modelUs: at,
      issuedUs: p.issuedUs[i]!,
      issuedMs: p.issuedMs,
    });
  }

  /** The block `info` is about waits on its page (traced as a fault) until an answer for that page takes it. */
  wait(info: FaultInfo): void {
    const s = this.#s;
    const key = `${info.sid}:${info.va}`;
    const list = this.#waiting.get(key);
    if (list) list.push(info);
    else this.#waiting.set(key, [info]);
    traceTransfer(s.tracer, 'fault', s.node, info.tid, info.channel, {
      side: info.side,
      modelUs: info.modelUs,
      detail: { seq: info.seq, va: info.va, srcNode: info.srcNode, issuedUs: info.issuedUs, issuedMs: info.issuedMs },
    });
  }

  // The event record that carries the context to the driver (last: its answer may come at once).
  #raise(info: FaultInfo, tr: Fault): void {
    this.#s.smmu.recordFault(info.sid, tr, info.write ? 'write' : 'read', { context: info });
  }

  /** Blocks waiting on the page `info` is about (at least `info` itself): the waiters an answer takes. */
  take(info: FaultInfo): FaultInfo[] {
    const key = `${info.sid}:${info.va}`;
    const list = this.#waiting.get(key) ?? [info];
    this.#waiting.delete(key);
    return list;
  }

  /**
   * The fault library answered `info` (through this node's driver). Every block waiting on
   * that page hears it: a source block is re-queued, a destination block's source is told
   * over the fabric. `sentAgain` (if given) is told when the block goes out again.
   */
  answer(info: FaultInfo, r: PageResponse, sentAgain?: SentAgain): void {
    const modelUs = this.answeredAt(info, r.method, r.bytes);
    const ok = r.status === IommuPageResponseCode.SUCCESS;
    if (sentAgain && ok) {
      this.#sentAgain.set(`${info.srcNode}:${info.tid}:${info.seq}:${info.side}`, sentAgain);
      // Transfers that end without sending the block again never claim theirs: keep it bounded.
      if (this.#sentAgain.size > 10_000) this.#sentAgain.delete(this.#sentAgain.keys().next().value as string);
    }
    for (const w of this.take(info)) {
      if (w.side === 'source') this.#sourceAnswered(w, ok, modelUs, r.fetched);
      else this.#destinationAnswered(w, ok, modelUs, r.fetched);
    }
  }

  /**
   * When, modelled, the fault library's answer to `info` reached the device: the fault's
   * detection, the event record, interrupt, driver, netlink, the library's wake-up, what it
   * did to make the pages resident, and its request back.
   */
  answeredAt(info: FaultInfo, method: ResolveMethod, bytes: number): number {
    const c = this.#s.costs;
    const ps = 4096;
    const pages = Math.max(1, Math.ceil((bytes + Number(info.va % BigInt(ps))) / ps));
    const resolve = method === 'touch' ? c.touchPageUs * pages : method === 'gup' || method === 'uffd' ? c.gupCallUs + c.gupPageUs * pages : 0;
    return info.modelUs + c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + resolve + c.requestUs;
  }

  /** A block goes out again after a fault at `side` (a source retransmission, or one arriving here): the answer's waiter hears it. */
  sentAgain(srcNode: number, tid: number, seq: number, side: Side, modelUs: number, realMs: number): void {
    // Asked for every block received: no key is built while no answer waits (the common case).
    if (this.#sentAgain.size === 0) return;
    const key = `${srcNode}:${tid}:${seq}:${side}`;
    const waiter = this.#sentAgain.get(key);
    if (!waiter) return;
    this.#sentAgain.delete(key);
    waiter(modelUs, realMs);
  }

  #sourceAnswered(info: FaultInfo, ok: boolean, modelUs: number, fetched: number): void {
    const s = this.#s;
    const t = s.transfers.get(info.tid);
    if (!t || !t.parked || t.parkedSeq !== info.seq) return; // retried meanwhile: a late answer
    traceTransfer(s.tracer, 'resolved', s.node, t.tid, t.desc.channel, { side: 'source', modelUs, detail: { seq: info.seq, srcNode: info.srcNode } });
    t.pagesFetched += fetched;
    if (ok) this.#unpark(t, modelUs);
    else
      this.#end(
        t,
        false,
        DmaStatus.FAULT_UNRESOLVED,
        `the fault library could not resolve the source fault at 0x${info.va.toString(16)}`,
        modelUs,
        'source',
      );
  }

  // A destination fault of this node answered: its held NACK goes out with the answer, which
  // reaches the source when a packet sent now would (the reverse link's model).
  #destinationAnswered(info: FaultInfo, ok: boolean, modelUs: number, fetched: number): void {
    const s = this.#s;
    s.tracer.emit({
      kind: 'resolved',
      node: s.node,
      tid: info.tid,
      channel: info.channel,
      side: 'destination',
      modelUs,
      detail: { seq: info.seq, srcNode: info.srcNode },
    });
    let atUs = s.transport.transmit(s.node, info.srcNode, 0, modelUs);
    // A preset whose responder NAKs a receive fault at once (RNR NAK): the requester's retry
    // goes by its own timer, not by the answer (FaultHook, kernel-sim/cost-model/presets.ts).
    if (ok && s.faultHook) atUs = s.faultHook.receiveFault(info.modelUs + s.costs.linkLatencyUs, modelUs, s.costs.linkLatencyUs);
    this.#release(info, { ok, atUs, fetched });
  }

  /**
   * A fault NACK for block `seq` of one of this node's transfers (parked on it) came with the
   * destination's answer: the block goes again at `a.atUs`; without one (the destination's
   * fault timeout passed), now, as the park timer would have sent it.
   */
  nackAnswered(t: Transfer, seq: number, a: { atUs: number; fetched: number; heldUs: number } | undefined): void {
    if (t.done || !t.parked || t.parkedSeq !== seq) return;
    if (!a) {
      this.#s.counters.retryTimeouts++;
      this.#unpark(t, t.modelReady);
      return;
    }
    t.pagesFetched += a.fetched;
    this.#unpark(t, a.atUs);
  }

  /**
   * Block `seq` (the transfer's first not acked: blocks are answered in order) waits for the
   * retransmission request (or the timeout), within the retry limit of its side. The
   * transfer goes on from it: O(1) per fault.
   */
  park(t: Transfer, seq: number, at: number, side: Side): void {
    const s = this.#s;
    const limit = side === 'source' ? s.retryLimit : (t.desc.retryLimit ?? s.retryLimit);
    this.#hold(t, seq, at, side, limit, 'faults', s.faultTimeoutMs, () => {
      // Nobody answered (no fault library, a dropped notification): retry anyway, like an
      // RNR timer; the retry limit bounds it.
      s.counters.retryTimeouts++;
    });
  }

  /**
   * An RNR NAK for block `seq` (no receive posted at the destination): it goes again after
   * `ms` (the destination's min_rnr_timer), within the transfer's retry limit (rnr_retry; the
   * same count as its destination faults').
   */
  rnr(t: Transfer, seq: number, at: number, ms: number): void {
    this.#hold(t, seq, at + ms * 1000, 'destination', t.desc.retryLimit ?? this.#s.retryLimit, 'RNR NAKs (no receive posted)', ms);
  }

  // Park block `seq` from modelled time `at`, its side's count against `limit` (the transfer
  // ends RETRY_EXCEEDED past it); it goes again after `ms` unless an answer unparks it first.
  #hold(t: Transfer, seq: number, at: number, side: Side, limit: number, what: string, ms: number, onTimeout?: () => void): void {
    const s = this.#s;
    t.parked = true;
    t.parkedSeq = seq;
    t.inflight--;
    if (seq < t.cursor) t.cursor = seq;
    t.modelReady = Math.max(t.modelReady, at);
    let st = t.own.get(seq);
    if (!st) t.own.set(seq, (st = { attempts: 1, srcFaults: 0, dstNacks: 0 }));
    const n = side === 'source' ? ++st.srcFaults : ++st.dstNacks;
    if (n > limit) {
      this.#end(t, false, DmaStatus.RETRY_EXCEEDED, `block ${seq} took ${n} ${side} ${what} (retry limit ${limit})`, at, side);
      return;
    }
    clearTimeout(t.parkTimer);
    t.parkTimer = setTimeout(() => {
      if (t.done || !t.parked) return;
      onTimeout?.();
      this.#unpark(t, t.modelReady);
    }, ms);
    t.parkTimer.unref?.();
    s.scheduler.kick();
  }

  #unpark(t: Transfer, at: number): void {
    if (t.done) return;
    clearTimeout(t.parkTimer);
    t.parkTimer = undefined;
    t.parked = false;
    t.parkedSeq = -1;
    t.modelReady = Math.max(t.modelReady, at);
    this.#s.scheduler.wake(t.desc.channel);
  }
}
