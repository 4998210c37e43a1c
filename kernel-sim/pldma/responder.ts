// The responder of one node's PLDMA (rxe_resp's role): a write packet (a run of blocks)
// arrives, its destination is translated on this node's SMMU with the packet's protection
// domain, a fault is recorded here and NACKed (the source sends the block again once this
// node's fault library has answered), an access this node refuses gets an error ACK, and
// the blocks that translate are written by the copy engine and ACKed with one verdict. A
// channel's writes are answered in the order they came, and after one stopped at a block,
// the later writes of that transfer come back unanswered until that block comes again (an
// RC responder's PSN check). Everything it knows comes from the packet; everything it says
// goes back as a packet.
import type { CostModel } from '../cost-model/index.js';
import { AckResp, type AckPacket, type Verdict, type WireBlock, type WritePacket } from '../fabric/packets.js';
import type { Transport } from '../fabric/transport.js';
import { EvtId } from '../smmu/records.js';
import type { MemoryLike } from '../memory.js';
import type { Smmu, Translation } from '../smmu/smmu.js';
import { statusForFault } from './completer.js';
import { type CopyEngine, CopyFlag, CopyStatus, type CopyTag, nodeTag } from './copy-engine.js';
import type { Faults } from './faults.js';
import { DmaStatus, type PldmaCounters, revoked, walkCost, walkedCost } from './types.js';

/** @internal What one node's responder needs of its node. */
export interface ResponderDeps {
  node: number;
  smmu: Smmu;
  transport: Transport;
  engine: CopyEngine;
  costs: CostModel;
  counters: PldmaCounters;
  faults: Faults;
}

/**
 * The destination's own check of the key and QP a write names (the verbs responder's rkey
 * check), for a span of its blocks. Once installed it is asked about every write, also one
 * that names neither.
 */
export type Admission = (p: WritePacket, span: WireBlock) => boolean;

/** Blocks of a write whose destination translated in one piece: where they land. */
interface Group {
  /** Index in the packet of its first block, and its blocks. */
  at: number;
  count: number;
  region: MemoryLike;
  offset: number;
  /** Per block, modelled µs of the walk (0-length: all `walkUs`). */
  walks: number[];
}

/** A channel of a source node, as this responder sees it: its writes answered in order, and where the transfer stopped. */
interface Lane {
  /** Settles when the answer of the channel's last write has gone out. */
  tail: Promise<void>;
  /** The transfer and block a write stopped at: that transfer's later writes are returned until it comes again. */
  stop: { tid: number; seq: number } | undefined;
}

/** @internal The responder of one node's PLDMA (see the top of this file). */
export class Responder {
  #d: ResponderDeps;
  admit: Admission | undefined;
  /** Copy-engine jobs in flight for packets this node received. */
  jobs = 0;
  #walked: number[] = [];
  /** Keyed by source node × 2^20 + channel: bounded by the fabric's nodes and channels. */
  #lanes = new Map<number, Lane>();

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
    if (!lane) this.#lanes.set(key, (lane = { tail: Promise.resolve(), stop: undefined }));
    const before = lane.tail;
    let answered!: () => void;
    lane.tail = new Promise((resolve) => (answered = resolve));
    const stop = lane.stop;
    if (stop && stop.tid === p.tid && p.seq > stop.seq) {
      // Behind a write of this transfer that stopped: returned whole, as RC drops it.
      await before;
      this.#answer(p, [], { seq: p.seq, count: p.count });
      answered();
      return;
    }
    // The transfer goes on (that block again), or another one started on this channel.
    if (stop) lane.stop = undefined;
    this.#d.faults.sentAgain(p.src, p.tid, p.seq, 'destination', p.issuedUs[0]!, p.issuedMs);
    const verdicts: Verdict[] = [];
    // Faults are recorded as the answer goes out: the NACK reaches the source before the
    // fault library's answer can (the blocks before the fault are written first).
    const faults: Array<() => void> = [];
    const ctx = smmu.streamForPd(p.pd);
    const bs = p.blockSize;
    // Blocks that carry bytes: a source page missing when another process's transport read
    // the payload ends the run there (answered SOURCE_FAULT after the blocks before it).
    const carried = p.sourceFault ? p.sourceFault.seq - p.seq : p.count;
    const groups: Group[] = [];
    let written = 0;
    let refused: Verdict | undefined;
    let refusedFault: (() => void) | undefined;
    if (!ctx) {
      refused = { seq: p.seq, count: 1, resp: AckResp.PD_ERR, walkUs: 0, reason: `node ${this.#d.node} has no stream for protection domain ${p.pd}` };
    } else {
      // Per run, not per block: the admitted blocks' destinations translated in one call per
      // region (one in all but at a region's end), with the same walks and IOTLB lookups as
      // block by block. A stall-mode block is written alone, under its own stall window.
      const stallMode = ctx.faultModel === 'stall';
      const want = stallMode ? Math.min(carried, 1) : carried;
      // With a check installed every write is asked, also one that names no key and no QP
      // (another node's engine could send one; the check decides what such a write may do).
      const checks = this.admit !== undefined;
      const admitted = checks ? this.#admitted(p, want) : want;
      const end = Math.min(p.length, admitted * bs);
      const walked = this.#walked;
      while (written < admitted) {
        const va = p.va + BigInt(written * bs);
        let fault: Extract<Translation, { ok: false }> | undefined;
        let got = 0;
        if (stallMode) {
          const tr = smmu.translate(ctx.sid, va, end - written * bs, 'write');
          if (tr.ok) {
            groups.push({ at: written, count: 1, region: tr.region, offset: tr.offset, walks: [walkCost(c, tr)] });
            got = 1;
          } else fault = tr;
        } else {
          const batch = smmu.translateBlocks(ctx.sid, va, end - written * bs, bs, 'write', walked);
          fault = batch.fault;
          got = walked.length;
          if (got) {
            // A piece that continues the previous one (a run translated block by block at a
            // region's end) joins it: one copy.
            const prev = groups[groups.length - 1];
            const joins = prev !== undefined && prev.region === batch.region && prev.offset + prev.count * bs === batch.offset;
            const g = joins ? prev : { at: written, count: 0, region: batch.region!, offset: batch.offset, walks: [] };
            for (let j = 0; j < got; j++) g.walks.push(walkedCost(c, walked[j]!));
            g.count += got;
            if (!joins) groups.push(g);
          }
        }
        written += got;
        if (fault) {
          const seq = p.seq + written;
          const walkUs = walkCost(c, fault);
          if (fault.recoverable) {
            const i = written;
            const tr = fault;
            const at = p.arrivals[i]! + walkUs;
            refusedFault = () => this.#d.faults.destination(p, i, ctx.sid, tr, at);
            refused = { seq, count: 1, resp: AckResp.FAULT, walkUs };
          } else {
            smmu.recordFault(ctx.sid, fault, 'write');
            // F_PERMISSION or F_ADDR_SIZE: the stream was found above, in this same turn.
            const resp = statusForFault(fault.id, 'write') === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : AckResp.ADDR_ERR;
            refused = { seq, count: 1, resp, walkUs, reason: fault.reason };
          }
          break;
        }
      }
      if (!refused && admitted < want)
        refused = {
          seq: p.seq + admitted,
          count: 1,
          resp: AckResp.ACCESS_ERR,
          walkUs: 0,
          reason:
            p.key === undefined && p.qpn === undefined
              ? `node ${this.#d.node} does not accept a write from node ${p.src} that names no memory key and no QP`
              : `node ${this.#d.node} no longer accepts key 0x${(p.key ?? 0).toString(16)} for QP ${p.qpn}`,
        };
    }
    // Where this write stops is known now, before any copy: the channel's next write of this
    // transfer, already on its way, is returned instead of written.
    if (refused || written < p.count) lane.stop = { tid: p.tid, seq: refused ? refused.seq : p.seq + written };
    let stopped = false;
    for (const g of groups) {
      if (!(await this.#write(p, g, ctx!.sid, ctx!.faultModel === 'stall', verdicts, faults))) {
        stopped = true;
        break;
      }
    }
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
    await before;
    // A write of this transfer before this one stopped under its copy, after this one was
    // translated: this one's answer is dropped (its bytes are written again after that block).
    const early = lane.stop;
    if (early && early.tid === p.tid && early.seq < p.seq) {
      this.#answer(p, [], { seq: p.seq, count: p.count });
    } else {
      this.#answer(p, verdicts, done < p.count ? { seq: p.seq + done, count: p.count - done } : undefined);
      for (const f of faults) f();
    }
    answered();
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
    this.#d.transport.deliver(ack);
  }

  // How many of the packet's first `carried` blocks the destination's key and QP admit: the
  // whole span checked first (nothing can be revoked within this synchronous step), then
  // block by block only if it is refused.
  #admitted(p: WritePacket, carried: number): number {
    if (carried === 0) return 0;
    const spanOf = (n: number): WireBlock => ({ va: p.va, length: Math.min(p.length, n * p.blockSize) });
    if (this.admit!(p, spanOf(carried))) return carried;
    let admitted = 0;
    while (
      admitted < carried &&
      this.admit!(p, { va: p.va + BigInt(admitted * p.blockSize), length: Math.min(p.blockSize, p.length - admitted * p.blockSize) })
    )
      admitted++;
    return admitted;
  }

  // One copy-engine job for a group of blocks contiguous at both ends; verdicts for the
  // blocks it settles. False if it stopped at one (the blocks after it are returned).
  async #write(p: WritePacket, g: Group, sid: number, stall: boolean, verdicts: Verdict[], faults: Array<() => void>): Promise<boolean> {
    const { smmu } = this.#d;
    const bs = p.blockSize;
    const seq = p.seq + g.at;
    const srcOffset = p.payload.offset + g.at * bs;
    const length = Math.min(p.length - g.at * bs, g.count * bs);
    const va = p.va + BigInt(g.at * bs);
    // Nothing starts once the source cancelled the transfer, or (for a group after the
    // first, copied a turn later) once this node stopped admitting its key or QP.
    const refusal = revoked(p.payload)
      ? `node ${p.src} cancelled transfer ${p.tid} (its QP was destroyed)`
      : g.at > 0 && this.admit && !this.admit(p, { va, length })
        ? `node ${this.#d.node} no longer accepts key 0x${(p.key ?? 0).toString(16)} for QP ${p.qpn}`
        : undefined;
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
          tag: this.#d.faults.destinationInfo(p, g.at, sid, va, p.arrivals[g.at]!),
        })
      : undefined;
    // Terminate-mode sides are walked again by the copy thread right before copying (a page
    // evicted meanwhile is a fault, not silent zeros); stall-mode sides fault for real. With
    // both sides terminate-mode, a small copy may run inline if every page is present.
    const flags = (p.sourceStall ? 0 : CopyFlag.CheckSource) | (window ? 0 : CopyFlag.CheckDest) | (p.sourceStall || window ? 0 : CopyFlag.Inline);
    this.jobs++;
    let status: CopyStatus;
    let faultOffset = -1;
    let copy: { copyThread: number; copyNs: number } | undefined;
    try {
      const tag: CopyTag = {};
      if (p.key !== undefined) tag.key = p.key;
      if (p.qpn !== undefined) tag.qp = p.qpn;
      const r = await this.#d.engine.copy(p.payload.region, srcOffset, g.region, g.offset, length, flags, nodeTag(this.#d.node, tag));
      status = r.status;
      faultOffset = r.faultOffset;
      copy = { copyThread: r.tid, copyNs: r.ns };
    } catch {
      status = -1 as CopyStatus;
    } finally {
      this.jobs--;
      if (window) smmu.endStallWindow(window);
    }
    const stalls = window?.stalls ?? 0;
    this.#d.counters.faults.destination += stalls;
    if (window?.aborted) {
      verdicts.push({ seq, count: 1, resp: AckResp.ABORTED, walkUs: g.walks[0]!, stalls });
      return false;
    }
    if (status === CopyStatus.Ok) {
      verdicts.push(this.#written(seq, g.count, g, stalls, copy));
      return true;
    }
    // The copy stopped at the first page it found missing: the blocks before it were written.
    const k =
      status === CopyStatus.SourceFault || status === CopyStatus.DestFault
        ? Math.min(g.count - 1, Math.max(0, Math.floor((faultOffset - (status === CopyStatus.SourceFault ? srcOffset : g.offset)) / bs)))
        : 0;
    if (k > 0) verdicts.push(this.#written(seq, k, g, stalls, copy));
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
        faults.push(() => this.#d.faults.destination(p, g.at + k, sid, evicted, p.arrivals[g.at + k]!));
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

  // The verdict for the first `count` blocks of a group, written: one walk figure if they
  // all took the same, else one per block.
  #written(seq: number, count: number, g: Group, stalls: number, copy: { copyThread: number; copyNs: number } | undefined): Verdict {
    const w0 = g.walks[0]!;
    let same = true;
    for (let j = 1; j < count && same; j++) same = g.walks[j] === w0;
    const v: Verdict = { seq, count, resp: AckResp.OK, walkUs: w0, stalls };
    if (!same) v.walks = Float64Array.from(g.walks.slice(0, count));
    if (copy) {
      v.copyThread = copy.copyThread;
      v.copyNs = copy.copyNs;
    }
    return v;
  }
}
