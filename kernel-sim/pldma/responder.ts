// The responder of one node's PLDMA (rxe_resp's role): a write packet (a run of blocks)
// arrives, its destination is translated on this node's SMMU with the packet's protection
// domain, a fault is recorded here and NACKed (the source sends the block again once this
// node's fault library has answered), an access this node refuses gets an error ACK, and
// the blocks that translate are written by the copy engine and ACKed with one verdict. A
// channel's writes are answered in the order they came, and after one stopped at a block,
// the later writes of that transfer come back unanswered until that block comes again (an
// RC responder's PSN check). A READ or an atomic request is answered by its response (a
// transfer of this node's engine, which nothing ACKs); a response to this node's own request
// is placed the same way as a write, and what landed goes to this node's completer instead of
// an ACK. Everything it knows comes from the packet; everything it says goes back as a packet.
import type { CostModel } from '../cost-model/index.js';
import { binding, type RawMapping } from '../../native/index.js';
import { AckResp, type AckPacket, isResponse, RcOp, type Verdict, type WritePacket } from '../fabric/packets.js';
import type { Transport } from '../fabric/transport.js';
import { EvtId } from '../smmu/records.js';
import { type MemoryLike, rawMemory } from '../memory.js';
import type { Smmu, StallWindow, StreamContext, Translation } from '../smmu/smmu.js';
import { statusForFault } from './completer.js';
import { type CopyEngine, CopyFlag, type CopyResult, CopyStatus, type CopyTag, nodeTag } from './copy-engine.js';
import type { Faults, HeldAnswer } from './faults.js';
import { admitRc, GRH_BYTES, takesReceives, type RcAdmitted, type RcReceived, type RcRefusal, type RcTables, stillAdmitted } from './rc.js';
import { type DmaCompletion, type DmaDescriptor, DmaStatus, type PldmaCounters, revoked, walkCost, walkedCost } from './types.js';

/** @internal What one node's responder needs of its node. */
export interface ResponderDeps {
  node: number;
  smmu: Smmu;
  transport: Transport;
  engine: CopyEngine;
  costs: CostModel;
  counters: PldmaCounters;
  faults: Faults;
  /** The node's QP and MR tables, which RC packets are checked against. */
  tables: RcTables;
  /** Post a transfer on this node's engine (a READ response, an atomic's original value). */
  post: (d: DmaDescriptor) => Promise<DmaCompletion>;
  /** A response to one of this node's requests was placed (or stopped): its completer's to read, as an ACK. */
  responded: (p: WritePacket, verdicts: Verdict[]) => void;
  /** Virtual channels of this node's engine. */
  channels: number;
}

/** Records a destination fault and waits for its answer (a NACK carries it). */
type HoldNack = () => Promise<HeldAnswer | undefined>;

/** A page of the atomic unit's register: 512 words, where atomics' original values are read and their responses sent from. */
interface AtomicRegister {
  raw: RawMapping;
  memory: MemoryLike;
  /** The streams it is mapped in (a response's source is translated there). */
  mapped: WeakSet<StreamContext>;
}

/** An atomic this node executed, kept for a duplicate request (rxe's responder resources): its PSN and the word of the register holding its original value. */
interface Replayed {
  psn: number;
  slot: number;
}

/**
 * Atomics each QP keeps for replay. A requester has one atomic outstanding per QP (the verbs
 * run a READ or an atomic alone), so a word of the register is reused only after the response
 * it holds has landed.
 */
const ATOMIC_REPLAY = 4;
/** Words of one register page; word 0 of the first page is the unit's own (the new value). */
const SLOTS_PER_PAGE = 512;
/** Base page and huge page sizes (an IOTLB entry is keyed at its page's base). */
const PAGE = 4096;
const HUGE_PAGE = 2n * 1024n * 1024n;

/** Blocks of a write whose destination translated in one piece: where they land. */
interface Group {
  /** Index in the packet of its first block, and its blocks. */
  at: number;
  count: number;
  region: MemoryLike;
  offset: number;
  /** Per block, modelled µs of the walk (0-length: all `walkUs`). */
  walks: number[];
  /** Destination address and bytes of the piece. */
  va: bigint;
  length: number;
  /** Byte offset of the piece in the packet, where it does not start at block `at` (a SEND's receive buffer). */
  byteAt?: number;
}

/** A packet's destination, checked: the stream that translates it and the spans it lands in. */
interface Placed {
  ctx: StreamContext;
  spans: Array<{ va: bigint; length: number; key: number | undefined }>;
  /** An RC packet: its QP and message. */
  rc?: RcAdmitted;
}

/** The ACK syndrome of each refusal of the RC checks. */
const NAK_RESP: Record<RcRefusal['nak'], AckResp> = {
  qp: AckResp.DROPPED,
  psn: AckResp.DROPPED,
  access: AckResp.ACCESS_ERR,
  'inv-req': AckResp.INV_REQ,
  op: AckResp.OP_ERR,
  rnr: AckResp.RNR,
  // UD: the sender's engine hears the datagram landed; nothing was written.
  drop: AckResp.OK,
};

/** A channel of a source node, as this responder sees it: its writes answered in order, and where the transfer stopped. */
interface Lane {
  /** Writes taken and not yet answered. */
  open: number;
  /** Writes waiting for the answer of the one before them, in order (a write that found none open waits for nothing). */
  waiting: Array<() => void>;
  /** The transfer and block a write stopped at: that transfer's later writes are returned until it comes again. */
  stop: { tid: number; seq: number } | undefined;
}

/** @internal The responder of one node's PLDMA (see the top of this file). */
/** The opcodes whose message completes a receive WQE at the responder. */
const RECEIVING: ReadonlySet<RcOp> = new Set([RcOp.SEND, RcOp.SEND_IMM, RcOp.WRITE_IMM, RcOp.UD_SEND, RcOp.UD_SEND_IMM]);

export class Responder {
  #d: ResponderDeps;
  /** Copy-engine jobs in flight for packets this node received. */
  jobs = 0;
  /** Keyed by source node × 2^20 + channel: bounded by the fabric's nodes and channels. */
  #lanes = new Map<number, Lane>();
  /** One atomic at a time on this node (the atomic unit), its register, its free words and its replay per QP. */
  #atomics: Promise<unknown> = Promise.resolve();
  #register: AtomicRegister[] = [];
  #freeSlots: number[] = [];
  #replay = new Map<number, Replayed[]>();

  constructor(deps: ResponderDeps) {
    this.#d = deps;
  }

  /**
   * A write: its blocks admitted (key and QP) and translated, in order, up to the first
   * that cannot be written (a fault, a refusal); the ones before it copied by one copy-engine
   * job per piece contiguous at both ends. One ACK answers them: a verdict for the blocks
   * written, one for the block that stopped the write, and the range it did not get to.
   */
  async onWrite(p: WritePacket): Promise<void> {
    const { smmu, costs: c } = this.#d;
    const key = p.src * 2 ** 20 + p.channel;
    let lane = this.#lanes.get(key);
    if (!lane) this.#lanes.set(key, (lane = { open: 0, waiting: [], stop: undefined }));
    // The answer of the write before this one in the lane, if it has not gone out: no promise
    // (nor a turn of the microtask queue) for a write that has nothing ahead of it.
    const before = lane.open++ > 0 ? new Promise<void>((resolve) => lane.waiting.push(resolve)) : undefined;
    const stop = lane.stop;
    if (stop && stop.tid === p.tid && p.seq > stop.seq) {
      // Behind a write of this transfer that stopped: returned whole, as RC drops it.
      if (before) await before;
      this.#reply(p, [], { seq: p.seq, count: p.count });
      this.#answered(lane);
      return;
    }
    // The transfer goes on (that block again), or another one started on this channel.
    if (stop) lane.stop = undefined;
    this.#d.faults.sentAgain(p.src, p.tid, p.seq, 'destination', p.issuedUs[0]!, p.issuedMs);
    const verdicts: Verdict[] = [];
    // A fault is recorded when its answer is due to go out (after the writes before it in
    // this lane), and the NACK waits for the fault library's answer, which it carries.
    const faults: Array<HoldNack> = [];
    const bs = p.blockSize;
    // Blocks that carry bytes: a source page missing when another process's transport read
    // the payload ends the run there (answered SOURCE_FAULT after the blocks before it).
    const carried = p.sourceFault ? p.sourceFault.seq - p.seq : p.count;
    const groups: Group[] = [];
    let written = 0;
    let refused: Verdict | undefined;
    let refusedFault: HoldNack | undefined;
    // Where the packet lands, checked once, here, against this node's own tables and SMMU.
    const dest = this.#place(p);
    const ctx = 'refusal' in dest ? undefined : dest.ctx;
    if (!('refusal' in dest) && dest.rc && (p.opcode === RcOp.READ_REQUEST || p.opcode === RcOp.ATOMIC || p.opcode === RcOp.FLUSH)) {
      // A READ or an atomic: carried out here, its response (READ_RESPONSE, ATOMIC_ACK) sent
      // back on this node's engine; the response is the request's acknowledgement, so an ACK
      // goes only for a FLUSH, a refusal, a fault NACK, or a response that could not be sent.
      const out: { verdict: Verdict; fault?: HoldNack } | undefined =
        p.opcode === RcOp.READ_REQUEST
          ? this.#read(p, dest.rc)
          : p.opcode === RcOp.FLUSH
            ? this.#flush(p, dest)
            : await this.#queueAtomic(p, dest as Placed & { rc: RcAdmitted });
      if (dest.rc.qp.resp.msg === dest.rc.msg && out?.verdict.resp !== AckResp.FAULT) dest.rc.qp.resp.msg = undefined;
      if (out?.verdict.resp === AckResp.FAULT) lane.stop = { tid: p.tid, seq: p.seq };
      if (before) await before;
      if (out) {
        await this.#hold(out.verdict, out.fault);
        this.#answer(p, [out.verdict], undefined);
      } else this.#d.transport.placed?.(p);
      this.#answered(lane);
      return;
    }
    if ('refusal' in dest && dest.refusal === AckResp.OK) {
      // A UD datagram dropped: answered as taken, as UD has no NAK.
      written = p.count;
    } else if ('refusal' in dest) {
      refused = { seq: p.seq, count: 1, resp: dest.refusal, walkUs: 0, reason: dest.reason };
      if (dest.rnrTimer !== undefined) refused.rnrTimer = dest.rnrTimer;
    } else if (dest.spans.length === 0) {
      // A zero-length message: nothing to translate or copy.
      written = carried;
    } else if (dest.spans.length > 1) {
      // A SEND's run across receive buffers: translated span by span, a fault stopping it at
      // the block it falls in.
      const r = this.#placeSpans(p, dest, carried, groups);
      written = r.written;
      refused = r.refused;
      refusedFault = r.fault;
    } else {
      // Per run, not per block: the blocks' destinations translated in one call per region
      // (one in all but at a region's end), with the same walks and IOTLB lookups as block
      // by block. A stall-mode block is written alone, under its own stall window.
      const base = dest.spans[0]!.va;
      const stallMode = ctx!.faultModel === 'stall';
      const want = stallMode ? Math.min(carried, 1) : carried;
      const end = Math.min(p.length, want * bs);
      while (written < want) {
        const va = base + BigInt(written * bs);
        let fault: Extract<Translation, { ok: false }> | undefined;
        let got = 0;
        if (stallMode) {
          const tr = smmu.translate(ctx!.sid, va, end - written * bs, 'write');
          if (tr.ok) {
            groups.push({ at: written, count: 1, region: tr.region, offset: tr.offset, walks: [walkCost(c, tr)], va, length: end - written * bs });
            got = 1;
          } else fault = tr;
        } else {
          const batch = smmu.translateRun(ctx!.sid, va, end - written * bs, bs, 'write');
          fault = batch.fault;
          got = batch.blocks;
          if (got) {
            // A piece that continues the previous one (a run translated block by block at a
            // region's end) joins it: one copy.
            const prev = groups[groups.length - 1];
            const joins = prev !== undefined && prev.region === batch.region && prev.offset + prev.count * bs === batch.offset;
            const g = joins ? prev : { at: written, count: 0, region: batch.region!, offset: batch.offset, walks: [], va, length: 0 };
            const spans = batch.spans;
            for (let i = 0; i < spans.length; i += 2) {
              const w = walkedCost(c, spans[i + 1]!);
              for (let n = spans[i]!; n > 0; n--) g.walks.push(w);
            }
            g.count += got;
            g.length = Math.min(end, (g.at + g.count) * bs) - g.at * bs;
            if (!joins) groups.push(g);
          }
        }
        written += got;
        if (fault) {
          const r = this.#fault(p, written, ctx!.sid, fault, base);
          refused = r.verdict;
          refusedFault = r.fault;
          break;
        }
      }
    }
    // Where this write stops is known now, before any copy: the channel's next write of this
    // transfer, already on its way, is returned instead of written.
    if (refused || written < p.count) lane.stop = { tid: p.tid, seq: refused ? refused.seq : p.seq + written };
    let stopped = false;
    for (const g of groups) {
      const w = this.#write(p, g, ctx!.sid, ctx!.faultModel === 'stall', verdicts, faults, dest as Placed);
      if (!(w === true || (w !== false && (await w)))) {
        stopped = true;
        break;
      }
    }
    // An empty message, or a SEND's run across receive buffers: one verdict for its blocks.
    const pieces = groups.length === 0 || groups[0]!.byteAt !== undefined;
    if (!stopped && pieces && written > 0)
      verdicts.push({ seq: p.seq, count: written, resp: AckResp.OK, walkUs: groups.length ? groups[0]!.walks[0]! : 0 });
    if (!stopped && refused) {
      verdicts.push(refused);
      if (refusedFault) faults.push(refusedFault);
    } else if (!stopped && p.sourceFault && written === carried) {
      verdicts.push({ seq: p.sourceFault.seq, count: 1, resp: AckResp.SOURCE_FAULT, walkUs: 0, faultOffset: p.sourceFault.faultOffset });
    }
    const last = verdicts[verdicts.length - 1];
    const done = last ? last.seq + last.count - p.seq : 0;
    if (stopped) {
      // A copy stopped at a block (a page went away under it): the same, found later.
      const seq = last!.seq;
      if (!lane.stop || lane.stop.tid !== p.tid || seq < lane.stop.seq) lane.stop = { tid: p.tid, seq };
    }
    const rc = 'rc' in dest ? dest.rc : undefined;
    if (rc) rc.msg.faults += faults.length;
    if (before) await before;
    // A write of this transfer before this one stopped under its copy, after this one was
    // translated: this one's answer is dropped (its bytes are written again after that block).
    const early = lane.stop;
    if (early && early.tid === p.tid && early.seq < p.seq) {
      if (rc) this.#notReceived(rc);
      this.#reply(p, [], { seq: p.seq, count: p.count });
    } else {
      // Every byte of the message is in: its receive completes before the ACK goes out.
      if (rc && rc.last && done === p.count && last?.resp === AckResp.OK) this.#received(p, rc);
      else if (rc) this.#notReceived(rc);
      // A write stops at its first fault: it is the last verdict.
      for (const f of faults) await this.#hold(last!, f);
      this.#reply(p, verdicts, done < p.count ? { seq: p.seq + done, count: p.count - done } : undefined);
    }
    this.#answered(lane);
  }

  // A write's answer went out: the next in its lane goes on.
  #answered(lane: Lane): void {
    lane.open--;
    lane.waiting.shift()?.();
  }

  /**
   * Where a packet lands: an RC packet (one naming a QP) through its QP's checks on this
   * node's tables (rc.ts), translated in its QP's PD; the engine's own raw transfer (no QP)
   * in the PD the packet names, from a peer only while no verbs device drives this node.
   */
  #place(p: WritePacket): Placed | { refusal: AckResp; reason: string; rnrTimer?: number } {
    const { smmu, tables, node } = this.#d;
    if (p.opcode === undefined || p.qpn === undefined) {
      // The engine's raw transfer: its key and QP, if any, only tag its copies (for fences).
      if (tables.strict && p.src !== node)
        return { refusal: AckResp.ACCESS_ERR, reason: `node ${node} does not accept a write from node ${p.src} that names no QP` };
      const ctx = smmu.streamForPd(p.pd);
      if (!ctx) return { refusal: AckResp.PD_ERR, reason: `node ${node} has no stream for protection domain ${p.pd}` };
      return { ctx, spans: p.length > 0 ? [{ va: p.va, length: p.length, key: p.key }] : [] };
    }
    const a = admitRc(tables, {
      src: p.src,
      qpn: p.qpn,
      srcQpn: p.srcQpn,
      opcode: p.opcode,
      psn: p.psn,
      key: p.key,
      tid: p.tid,
      seq: p.seq,
      va: p.va,
      length: p.length,
      lengthHint: p.lengthHint,
      msgOffset: p.msgOffset,
      msgLength: p.msgLength,
      dmaLength: p.dmaLength,
      flush: p.flush,
      qkey: p.qkey,
      srqn: p.srqn,
      blockSize: p.blockSize,
      issuedUs: p.issuedUs[0]!,
      issuedMs: p.issuedMs,
    });
    if ('nak' in a) {
      const r: { refusal: AckResp; reason: string; rnrTimer?: number } = { refusal: NAK_RESP[a.nak], reason: a.reason };
      if (a.rnrTimer !== undefined) r.rnrTimer = a.rnrTimer;
      return r;
    }
    const ctx = smmu.streamForPd(a.qp.pd.handle);
    if (!ctx) return { refusal: AckResp.PD_ERR, reason: `node ${node} has no stream for protection domain ${a.qp.pd.handle}` };
    return { ctx, spans: a.spans, rc: a };
  }

  // An RDMA READ (or one asked again: a duplicate is read again, as RC allows): the bytes read
  // from this node's memory go back as READ responses, one transfer per sink of the
  // requester's, on this node's engine, in the QP's PD. A source fault holds a response until
  // this node's fault library answered (the engine's park). An empty READ is answered by an ACK.
  #read(p: WritePacket, a: RcAdmitted): { verdict: Verdict } | undefined {
    const sinks = p.sinks ?? [];
    const n = p.dmaLength ?? 0;
    let room = 0;
    for (const s of sinks) room += s.length;
    if (room !== n) return { verdict: this.#nak(p, AckResp.INV_REQ, `a ${n}-byte READ names ${room} bytes of sinks`) };
    if (n === 0) return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: 0 } };
    // Asked again: a page may have gone since it was read (its copy found it missing), so the
    // range is walked afresh, not taken from the IOTLB: the fault is this node's SMMU's then.
    // From the 2 MiB boundary below: a huge page's entry is keyed at its base.
    if (a.duplicate) {
      const below = Number(p.va % HUGE_PAGE);
      this.#d.smmu.iotlb.invalidateRange(p.va - BigInt(below), below + n, PAGE);
    }
    let off = 0;
    const posts: Array<Promise<DmaCompletion>> = [];
    for (const s of sinks) {
      if (s.length > 0) posts.push(this.#d.post(this.#answerDesc(p, a, p.va + BigInt(off), s)));
      off += s.length;
    }
    this.#failed(p, posts);
    return undefined;
  }

  // A response that could not be sent (its source unresolved, past its retry limit, its QP
  // destroyed): the request's NAK says how it ended and what it took.
  #failed(p: WritePacket, posts: Array<Promise<DmaCompletion>>): void {
    void Promise.all(posts).then((results) => {
      if (results.some((r) => r.status !== DmaStatus.SUCCESS)) this.#answer(p, [this.#outcome(p, results)], undefined);
    });
  }

  // The descriptor of a response's bytes: from this node's `from` to the requester's sink.
  #answerDesc(p: WritePacket, a: RcAdmitted, from: bigint, sink: { addr: bigint; length: number; lkey: number }): DmaDescriptor {
    const d: DmaDescriptor = {
      // Answers run on channels of their own (channels … 2×channels-1): never queued behind
      // the QP's own requests, which may be waiting for the peer's answers in turn.
      channel: this.#d.channels + (a.qp.qpNum % this.#d.channels),
      srcVa: from,
      dstNode: p.src,
      dstVa: sink.addr,
      length: sink.length,
      pd: a.qp.pd.handle,
      key: sink.lkey,
      dstQp: p.srcQpn!,
      srcQp: a.qp.qpNum,
      opcode: p.opcode === RcOp.ATOMIC ? RcOp.ATOMIC_ACK : RcOp.READ_RESPONSE,
      psn: p.psn!,
    };
    return d;
  }

  // The request's NAK from how its response's transfers ended: the first failure, carried whole
  // (status and side) with what they took, so the requester's completion says what happened.
  #outcome(p: WritePacket, results: DmaCompletion[]): Verdict {
    const answered = { faults: { source: 0, destination: 0 }, retransmittedBlocks: 0, majorFaults: 0 };
    for (const r of results) {
      answered.faults.source += r.faults.source;
      answered.faults.destination += r.faults.destination;
      answered.retransmittedBlocks += r.retransmittedBlocks;
      answered.majorFaults += r.pagesFetched;
    }
    const bad = results.find((r) => r.status !== DmaStatus.SUCCESS)!;
    const v: Verdict = {
      seq: p.seq,
      count: 1,
      resp: AckResp.ANSWER_ERR,
      walkUs: 0,
      answered,
      answer: { status: bad.status, side: bad.side ?? 'source' },
    };
    if (bad.reason) v.reason = bad.reason;
    return v;
  }

  // An RDMA FLUSH (global visibility): the channel's writes before it were answered first and
  // their copies are done, so they are visible already; what is left is rxe_odp's part, the
  // range's pages mapped for the device: a missing one is the fault NACK, and the FLUSH is sent
  // again once it is resolved. (Persistence is refused at registration: no memory here is.)
  #flush(p: WritePacket, dest: Placed): { verdict: Verdict; fault?: HoldNack } {
    const n = p.flush!.level === 0 ? (p.dmaLength ?? 0) : 0;
    if (n === 0) return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: 0 } };
    const tr = this.#d.smmu.translate(dest.ctx.sid, p.va, n, 'read');
    if (!tr.ok) return this.#fault(p, 0, dest.ctx.sid, tr, p.va);
    return { verdict: { seq: p.seq, count: 1, resp: AckResp.OK, walkUs: walkCost(this.#d.costs, tr) } };
  }

  #nak(p: WritePacket, resp: AckResp, reason: string): Verdict {
    return { seq: p.seq, count: 1, resp, walkUs: 0, reason };
  }

  // An atomic request. A duplicate (its requester asks again: a fault at its sink) is answered
  // from the QP's replay, never executed again (rxe's responder resources). A new one's word is
  // translated on this node's SMMU first: a missing page is resolved by this node's fault unit
  // and the atomic waits for it (the response holds, as a write's fault NACK does), or goes back
  // as the fault NACK if no answer came within the fault timeout. Then the atomic unit, one
  // atomic at a time on this node, executes it.
  async #queueAtomic(p: WritePacket, dest: Placed & { rc: RcAdmitted }): Promise<{ verdict: Verdict; fault?: HoldNack } | undefined> {
    const a = dest.rc;
    const sink = p.sinks?.[0];
    if (!sink || sink.length !== 8 || p.sinks!.length !== 1)
      return { verdict: this.#nak(p, AckResp.INV_REQ, 'an atomic answers into one 8-byte sink') };
    if (a.duplicate) {
      const r = this.#replay.get(a.qp.qpNum)?.find((e) => e.psn === p.psn);
      if (!r) return { verdict: this.#nak(p, AckResp.DROPPED, `QP ${a.qp.qpNum} keeps no atomic of PSN ${String(p.psn)} to answer again`) };
      this.#failed(p, [this.#d.post(this.#answerDesc(p, a, this.#slotAt(dest.ctx, r.slot).address, sink))]);
      return undefined;
    }
    let faults = 0;
    const tr = this.#d.smmu.translate(dest.ctx.sid, p.va, 8, 'write');
    if (!tr.ok) {
      const nack = this.#fault(p, 0, dest.ctx.sid, tr, p.va, false);
      if (!nack.fault) return nack;
      const answer = await nack.fault();
      if (!answer?.ok) {
        // No answer in time: the NACK goes without one (the requester asks again at once); or the library could not.
        this.#d.counters.nacksSent++;
        if (answer) nack.verdict.resp = AckResp.UNRESOLVED;
        return { verdict: nack.verdict };
      }
      faults = 1;
    }
    const run = () => this.#atomic(p, dest, faults);
    const out = this.#atomics.then(run, run);
    this.#atomics = out.catch(() => undefined);
    return out;
  }

  // An atomic on the 8-byte word at p.va, in the atomic unit: the word's original value read
  // into a word of the unit's register, the new value written, and the original value sent to
  // the requester's sink as the ATOMIC_ACK (done when sent: its requester asks again if it
  // cannot place it, and the replay answers). A page gone since it was translated is the fault
  // NACK (the requester asks again).
  async #atomic(p: WritePacket, dest: Placed & { rc: RcAdmitted }, faults: number): Promise<{ verdict: Verdict; fault?: HoldNack } | undefined> {
    const { smmu, engine } = this.#d;
    const a = dest.rc;
    // The QP went away while the atomic waited for the unit: nothing is read or written.
    if (!stillAdmitted(this.#d.tables, a, p.key))
      return { verdict: this.#nak(p, AckResp.DROPPED, `QP ${a.qp.qpNum} went away before its atomic ran`) };
    const tr = smmu.translate(dest.ctx.sid, p.va, 8, 'write');
    if (!tr.ok) return this.#fault(p, 0, dest.ctx.sid, tr, p.va);
    const tag = nodeTag(this.#d.node, { qp: a.qp.qpNum, ...(p.key !== undefined ? { key: p.key } : {}) });
    const slot = this.#takeSlot();
    const old = this.#slotAt(dest.ctx, slot);
    const read = await engine.copy(tr.region, tr.offset, old.page.memory, old.offset, 8, CopyFlag.CheckSource, tag);
    if (read.status !== CopyStatus.Ok) {
      this.#freeSlots.push(slot);
      if (read.status === CopyStatus.SourceFault) {
        const evicted: Translation = {
          ok: false,
          id: EvtId.F_TRANSLATION,
          addr: p.va,
          recoverable: true,
          reason: "the atomic's word was evicted before it was read",
        };
        smmu.iotlb.invalidateRange(p.va, tr.region.pageSize, tr.region.pageSize);
        return this.#fault(p, 0, dest.ctx.sid, evicted as Extract<Translation, { ok: false }>, p.va);
      }
      return { verdict: this.#nak(p, AckResp.OP_ERR, 'the atomic unit could not read the word') };
    }
    const orig = new DataView(old.page.raw.buffer).getBigUint64(old.offset, true);
    const at = p.atomic!;
    const next = at.fetchAdd ? BigInt.asUintN(64, orig + at.compareAdd) : orig === at.compareAdd ? at.swap : undefined;
    if (next !== undefined) {
      // The unit's own word (word 0 of its first page) holds the new value for the copy.
      const unit = this.#register[0]!;
      new DataView(unit.raw.buffer).setBigUint64(0, next, true);
      const wrote = await engine.copy(unit.memory, 0, tr.region, tr.offset, 8, CopyFlag.CheckDest, tag);
      if (wrote.status !== CopyStatus.Ok) {
        this.#freeSlots.push(slot);
        return { verdict: this.#nak(p, AckResp.OP_ERR, "the atomic's word went away before its new value was written") };
      }
    }
    this.#remember(a.qp.qpNum, p.psn!, slot);
    const d = this.#answerDesc(p, a, old.address, p.sinks![0]!);
    if (faults) d.srcFaults = faults;
    this.#failed(p, [this.#d.post(d)]);
    return undefined;
  }

  // A free word of the unit's register (a page more when none is left).
  #takeSlot(): number {
    if (this.#freeSlots.length === 0) {
      const raw = binding.mapRegion(SLOTS_PER_PAGE * 8, false, false, false);
      new Uint8Array(raw.buffer).fill(0);
      // Its bytes are read by a transport between processes too (it looks for `buffer`).
      this.#register.push({ raw, memory: rawMemory(raw), mapped: new WeakSet() });
      const base = (this.#register.length - 1) * SLOTS_PER_PAGE;
      for (let i = SLOTS_PER_PAGE - 1; i >= (base === 0 ? 1 : 0); i--) this.#freeSlots.push(base + i);
    }
    return this.#freeSlots.pop()!;
  }

  // Word `slot` of the register: its page (mapped in `ctx`'s stream, where a response's source is translated) and address.
  #slotAt(ctx: StreamContext, slot: number): { page: AtomicRegister; offset: number; address: bigint } {
    const page = this.#register[Math.floor(slot / SLOTS_PER_PAGE)]!;
    if (!page.mapped.has(ctx)) {
      this.#d.smmu.map(ctx.sid, page.memory, { read: true, write: true });
      page.mapped.add(ctx);
    }
    const offset = (slot % SLOTS_PER_PAGE) * 8;
    return { page, offset, address: page.memory.address + BigInt(offset) };
  }

  // An atomic executed for QP `qp`: kept for a duplicate, the QP's oldest one's word freed.
  #remember(qp: number, psn: number, slot: number): void {
    let list = this.#replay.get(qp);
    if (!list) this.#replay.set(qp, (list = []));
    list.push({ psn, slot });
    if (list.length > ATOMIC_REPLAY) this.#freeSlots.push(list.shift()!.slot);
  }

  /** QP `qp` of this node was destroyed (its responses' copies fenced): its replay goes. */
  forget(qp: number): void {
    for (const r of this.#replay.get(qp) ?? []) this.#freeSlots.push(r.slot);
    this.#replay.delete(qp);
  }

  /** The atomic register goes with the engine. */
  close(): void {
    for (const r of this.#register) binding.closeRegion(r.raw.id, r.raw.buffer);
    this.#register = [];
    this.#freeSlots = [];
    this.#replay.clear();
  }

  // A SEND's run over several receive buffers: each span translated whole (a fault stops the
  // run at the block the span starts in: the blocks before it are written in full).
  #placeSpans(p: WritePacket, dest: Placed, carried: number, groups: Group[]): { written: number; refused?: Verdict; fault?: HoldNack } {
    const { smmu, costs: c } = this.#d;
    const bs = p.blockSize;
    const end = Math.min(p.length, carried * bs);
    let at = 0;
    for (const s of dest.spans) {
      if (at >= end) break;
      const length = Math.min(s.length, end - at);
      const tr = smmu.translate(dest.ctx.sid, s.va, length, 'write');
      const block = Math.floor(at / bs);
      if (!tr.ok) {
        const r = this.#fault(p, block, dest.ctx.sid, tr, s.va - BigInt(at - block * bs));
        return { written: block, refused: r.verdict, fault: r.fault };
      }
      groups.push({
        at: block,
        count: Math.ceil((at + length) / bs) - block,
        region: tr.region,
        offset: tr.offset,
        walks: [walkCost(c, tr)],
        va: s.va,
        length,
        byteAt: at,
      });
      at += length;
    }
    return { written: carried };
  }

  // A fault NACK's verdict waits for its fault library's answer, then carries it (or, past the
  // fault timeout, goes without one).
  async #hold(v: Verdict, fault: HoldNack | undefined): Promise<void> {
    if (!fault) return;
    const a = await fault();
    if (!a) return;
    if (a.ok) v.resolved = { atUs: a.atUs, fetched: a.fetched, heldUs: a.heldUs };
    else v.resp = AckResp.UNRESOLVED;
  }

  // A fault at block `i` of the packet (its bytes landing from `base` on): the NACK's verdict,
  // and how to record the fault and wait for its answer; an access this node refuses is an error.
  #fault(
    p: WritePacket,
    i: number,
    sid: number,
    fault: Extract<Translation, { ok: false }>,
    base: bigint,
    nack = true,
  ): { verdict: Verdict; fault?: HoldNack } {
    const seq = p.seq + i;
    const walkUs = walkCost(this.#d.costs, fault);
    if (fault.recoverable) {
      const at = p.arrivals[i]! + walkUs;
      return { verdict: { seq, count: 1, resp: AckResp.FAULT, walkUs }, fault: () => this.#d.faults.destination(p, i, sid, fault, at, base, nack) };
    }
    this.#d.smmu.recordFault(sid, fault, 'write');
    // F_PERMISSION or F_ADDR_SIZE: the stream was found above, in this same turn.
    const resp = statusForFault(fault.id, 'write') === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : AckResp.ADDR_ERR;
    return { verdict: { seq, count: 1, resp, walkUs, reason: fault.reason } };
  }

  // The last packet of a SEND or a WRITE with immediate landed: its receive completes.
  #received(p: WritePacket, a: RcAdmitted): void {
    const { qp, msg } = a;
    // A response is the requester's own: no message of this QP's responder.
    if (isResponse(p.opcode)) return;
    if (qp.resp.msg === msg) qp.resp.msg = undefined;
    // Only a SEND or a WRITE with immediate takes a receive: never a WRITE or an ATOMIC WRITE.
    if (!RECEIVING.has(p.opcode!)) return;
    const wqe = msg.wqe ?? qp.rq.head();
    // The QP went to ERR (its receives flushed) while the bytes landed: nothing to complete.
    // A receive taken off a shared queue is the message's alone; ERR flushed it too, or for
    // a UD datagram (no message kept between packets) its QP flushes it when given back.
    const taken = takesReceives(qp);
    if (wqe && taken && !qp.receiving) this.#notReceived(a);
    if (!wqe || (taken ? !qp.receiving : qp.rq.head() !== wqe)) return;
    if (!taken) qp.rq.shift();
    const total = a.total;
    const r: RcReceived = {
      status: 'ok',
      op: p.opcode as RcReceived['op'],
      // A UD receive counts the GRH space at its head.
      byteLen: qp.qkey === undefined ? total : total + GRH_BYTES,
      srcQpn: p.srcQpn ?? 0,
      odp: {
        faults: { source: p.srcFaults ?? 0, destination: msg.faults },
        majorFaults: 0,
        retransmittedBlocks: msg.faults,
        modelUs: p.arrivals[p.count - 1]! - msg.firstUs,
        realUs: (performance.now() - msg.firstMs) * 1000,
      },
    };
    if (p.immData !== undefined) r.immData = p.immData;
    if (p.solicited) r.solicited = true;
    qp.received(wqe, r);
  }

  // A UD datagram that did not land (a fault: it is sent again) gives back the receive it took.
  #notReceived(a: RcAdmitted): void {
    if (a.qp.qkey !== undefined && a.msg.wqe) a.qp.giveBack?.(a.msg.wqe);
  }

  // The answer to a packet: an ACK; for a response (nothing ACKs it), what landed of it goes
  // to this node's completer, and its bytes' staging (between processes) is free again.
  #reply(p: WritePacket, verdicts: Verdict[], returned: { seq: number; count: number } | undefined): void {
    if (!isResponse(p.opcode)) return this.#answer(p, verdicts, returned);
    this.#d.transport.placed?.(p);
    this.#d.responded(p, verdicts);
  }

  #answer(p: WritePacket, verdicts: Verdict[], returned: { seq: number; count: number } | undefined): void {
    const ack: AckPacket = {
      type: 'ack',
      src: this.#d.node,
      dst: p.src,
      pd: p.pd,
      va: p.va,
      tid: p.tid,
      seq: p.seq,
      length: p.length,
      // The envelope says what the verdicts say: OK, or why the write stopped (the last verdict).
      resp: verdicts.length ? verdicts[verdicts.length - 1]!.resp : AckResp.OK,
      arrivesAt: p.arrivals[p.count - 1]! + this.#d.costs.linkLatencyUs,
      verdicts,
    };
    if (returned) ack.returned = returned;
    try {
      this.#d.transport.deliver(ack);
    } catch {
      // An answer the transport refuses (its peer gone) is lost as on a link: the requester's
      // own timers end what waited for it. Counted, never thrown into the caller's microtask.
      this.#d.counters.packetsRefused++;
    }
  }

  // One copy-engine job for a group of blocks contiguous at both ends; verdicts for the
  // blocks it settles. False if it stopped at one (the blocks after it are returned).
  // An inline copy that settles at once is answered here, without a promise; any other waits
  // for its copy-engine job.
  #write(
    p: WritePacket,
    g: Group,
    sid: number,
    stall: boolean,
    verdicts: Verdict[],
    faults: Array<HoldNack>,
    dest: Placed,
  ): boolean | Promise<boolean> {
    const { smmu } = this.#d;
    const bs = p.blockSize;
    const seq = p.seq + g.at;
    const srcOffset = p.payload.offset + (g.byteAt ?? g.at * bs);
    const length = g.length;
    const va = g.va;
    const key = this.#spanKey(dest, g);
    // Nothing starts once the source cancelled the transfer, or (for a group after the
    // first, copied a turn later) once this node's QP or key no longer takes it.
    const refusal = revoked(p.payload)
      ? `node ${p.src} cancelled transfer ${p.tid} (its QP was destroyed)`
      : g.at > 0 && dest.rc && !stillAdmitted(this.#d.tables, dest.rc, key)
        ? `node ${this.#d.node} no longer accepts key 0x${(key ?? 0).toString(16)} for QP ${p.qpn}`
        : undefined;
    // A piece of a SEND's run across receive buffers: its blocks are answered once the run is
    // (the caller's one verdict), or, where it stops, the blocks before the one it starts in.
    const piece = g.byteAt !== undefined;
    if (piece && (revoked(p.payload) || refusal) && g.at > 0) verdicts.push({ seq: p.seq, count: g.at, resp: AckResp.OK, walkUs: 0 });
    if (refusal) {
      verdicts.push({ seq, count: 1, resp: revoked(p.payload) ? AckResp.FLUSHED : AckResp.ACCESS_ERR, walkUs: g.walks[0]!, reason: refusal });
      return false;
    }
    const window = stall
      ? smmu.beginStallWindow({
          sid,
          region: g.region,
          offset: g.offset,
          length,
          access: 'write',
          tag: this.#d.faults.destinationInfo(p, g.at, sid, va, p.arrivals[g.at]!, dest.spans[0]!.va),
        })
      : undefined;
    // Terminate-mode sides are walked again by the copy thread right before copying (a page
    // evicted meanwhile is a fault, not silent zeros); stall-mode sides fault for real. With
    // both sides terminate-mode, a small copy may run inline if every page is present.
    let flags = (p.sourceStall ? 0 : CopyFlag.CheckSource) | (window ? 0 : CopyFlag.CheckDest) | (p.sourceStall || window ? 0 : CopyFlag.Inline);
    let now: CopyResult | null | undefined;
    try {
      now = this.#d.engine.copyNow(p.payload.region, srcOffset, g.region, g.offset, length, flags);
    } catch {
      if (window) smmu.endStallWindow(window);
      return this.#copied(p, g, seq, srcOffset, sid, verdicts, faults, dest, window, undefined);
    }
    if (now) return this.#copied(p, g, seq, srcOffset, sid, verdicts, faults, dest, window, now);
    // A page of either side not present: a thread's job walks it (not inline again).
    if (now === null) flags &= ~CopyFlag.Inline;
    return this.#job(p, g, seq, srcOffset, sid, verdicts, faults, dest, window, key, flags);
  }

  // A group's copy-engine job, then its verdicts.
  async #job(
    p: WritePacket,
    g: Group,
    seq: number,
    srcOffset: number,
    sid: number,
    verdicts: Verdict[],
    faults: Array<HoldNack>,
    dest: Placed,
    window: StallWindow | undefined,
    key: number | undefined,
    flags: number,
  ): Promise<boolean> {
    this.jobs++;
    let r: CopyResult | undefined;
    try {
      const tag: CopyTag = {};
      if (key !== undefined) tag.key = key;
      if (p.qpn !== undefined) tag.qp = p.qpn;
      r = await this.#d.engine.copy(p.payload.region, srcOffset, g.region, g.offset, g.length, flags, nodeTag(this.#d.node, tag));
    } catch {
      r = undefined;
    } finally {
      this.jobs--;
      if (window) this.#d.smmu.endStallWindow(window);
    }
    return this.#copied(p, g, seq, srcOffset, sid, verdicts, faults, dest, window, r);
  }

  // The verdicts of a group whose copy ended with `r` (undefined: the engine refused it).
  #copied(
    p: WritePacket,
    g: Group,
    seq: number,
    srcOffset: number,
    sid: number,
    verdicts: Verdict[],
    faults: Array<HoldNack>,
    dest: Placed,
    window: StallWindow | undefined,
    r: CopyResult | undefined,
  ): boolean {
    const { smmu } = this.#d;
    const bs = p.blockSize;
    const piece = g.byteAt !== undefined;
    const status = r ? r.status : (-1 as CopyStatus);
    const faultOffset = r ? r.faultOffset : -1;
    const stalls = window?.stalls ?? 0;
    this.#d.counters.faults.destination += stalls;
    if (piece && status !== CopyStatus.Ok && g.at > 0) verdicts.push({ seq: p.seq, count: g.at, resp: AckResp.OK, walkUs: 0 });
    if (window?.aborted) {
      verdicts.push({ seq, count: 1, resp: AckResp.ABORTED, walkUs: g.walks[0]!, stalls });
      return false;
    }
    if (status === CopyStatus.Ok) {
      if (!piece) verdicts.push(this.#written(seq, g.count, g, stalls, r));
      return true;
    }
    // The copy stopped at the first page it found missing: the blocks before it were written.
    const k = piece
      ? 0
      : status === CopyStatus.SourceFault || status === CopyStatus.DestFault
        ? Math.min(g.count - 1, Math.max(0, Math.floor((faultOffset - (status === CopyStatus.SourceFault ? srcOffset : g.offset)) / bs)))
        : 0;
    if (k > 0) verdicts.push(this.#written(seq, k, g, stalls, r));
    const walkUs = g.walks[k]!;
    const stopSeq = seq + k;
    switch (status) {
      case CopyStatus.SourceFault:
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.SOURCE_FAULT, walkUs, faultOffset, stalls });
        break;
      case CopyStatus.DestFault: {
        const region = g.region;
        const addr = region.address + BigInt(faultOffset);
        const evicted: Translation = {
          ok: false,
          id: EvtId.F_TRANSLATION,
          addr,
          recoverable: true,
          reason: 'destination page evicted before the write',
        };
        smmu.iotlb.invalidateRange(addr, region.pageSize, region.pageSize);
        faults.push(() => this.#d.faults.destination(p, g.at + k, sid, evicted, p.arrivals[g.at + k]!, dest.spans[0]!.va));
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.FAULT, walkUs, late: true, stalls });
        break;
      }
      case CopyStatus.Cancelled:
        // Fenced while queued: the key or QP it was written for went away.
        verdicts.push({
          seq: stopSeq,
          count: 1,
          resp: AckResp.ACCESS_ERR,
          walkUs,
          reason: `node ${this.#d.node} revoked key 0x${(p.key ?? 0).toString(16)} / QP ${p.qpn} before the write`,
        });
        break;
      default:
        verdicts.push({ seq: stopSeq, count: 1, resp: AckResp.FLUSHED, walkUs, reason: 'the copy engine was closed' });
    }
    return false;
  }

  // The key of the span a group lands in (a SEND's receive buffer, the RETH's rkey).
  #spanKey(dest: Placed, g: Group): number | undefined {
    if (dest.spans.length === 1) return dest.spans[0]!.key;
    const at = g.byteAt ?? 0;
    let o = 0;
    for (const s of dest.spans) {
      if (at < o + s.length) return s.key;
      o += s.length;
    }
    return undefined;
  }

  // The verdict for the first `count` blocks of a group, written: one walk figure if they
  // all took the same, else one per block.
  #written(seq: number, count: number, g: Group, stalls: number, copy: CopyResult | undefined): Verdict {
    const w0 = g.walks[0]!;
    let same = true;
    for (let j = 1; j < count && same; j++) same = g.walks[j] === w0;
    const v: Verdict = { seq, count, resp: AckResp.OK, walkUs: w0, stalls };
    if (!same) v.walks = Float64Array.from(g.walks.slice(0, count));
    if (copy) {
      v.copyThread = copy.tid;
      v.copyNs = copy.ns;
    }
    return v;
  }
}
