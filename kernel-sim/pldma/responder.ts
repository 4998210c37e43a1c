// The responder of one node's PLDMA (rxe_resp's role): a write packet arrives, its
// destination is translated on this node's SMMU with the packet's protection domain, a
// fault is recorded here and NACKed (the source sends the block again once this node's
// fault library has answered), an access this node refuses gets an error ACK, and a block
// that translates is written by the copy engine and ACKed. Everything it knows comes from
// the packet; everything it says goes back as a packet.
import type { CostModel } from '../cost-model/index.js';
import { AckResp, type AckPacket, type Verdict, type WireBlock, type WritePacket } from '../fabric/packets.js';
import type { Transport } from '../fabric/transport.js';
import { EvtId } from '../smmu/records.js';
import type { MemoryLike } from '../memory.js';
import type { Smmu, Translation } from '../smmu/smmu.js';
import type { Tracer } from '../trace.js';
import { statusForFault } from './completer.js';
import { type CopyEngine, CopyFlag, CopyStatus } from './copy-engine.js';
import type { FaultWaiters } from './fault-waiters.js';
import { DmaStatus, type FaultInfo, type PldmaCounters, type Retransmitted, traceTransfer, walkCost, walkedCost } from './types.js';

export interface ResponderDeps {
  node: number;
  smmu: Smmu;
  transport: Transport;
  engine: CopyEngine;
  costs: CostModel;
  tracer: Tracer;
  counters: PldmaCounters;
  waiters: FaultWaiters;
}

/** The destination's own check of the key and QP a write names (the verbs responder's rkey check, per block). */
export type Admission = (p: WritePacket, block: WireBlock) => boolean;

/** A block whose destination translated, with where it lands. */
interface Accepted {
  blk: WireBlock;
  region: MemoryLike;
  offset: number;
  walkUs: number;
}

/** True if `b` continues `a` at both ends, so one copy can carry both. */
function follows(a: Accepted, b: Accepted): boolean {
  return (
    b.blk.payload.region === a.blk.payload.region &&
    b.region === a.region &&
    b.blk.payload.offset === a.blk.payload.offset + a.blk.length &&
    b.offset === a.offset + a.blk.length
  );
}

export class Responder {
  #d: ResponderDeps;
  admit: Admission | undefined;
  retransmitted: Retransmitted | undefined;
  /** Copy-engine jobs in flight for packets this node received. */
  jobs = 0;
  #walked: number[] = [];

  constructor(deps: ResponderDeps) {
    this.#d = deps;
  }

  /**
   * A write: its blocks in order, each admitted (key and QP), translated and, in runs that
   * are contiguous at both ends, copied by one copy-engine job. The first block that cannot
   * be written (a fault, a refusal) ends it; the blocks after it are returned unanswered.
   * One ACK carries a verdict per block handled.
   */
  async onWrite(p: WritePacket): Promise<void> {
    const { smmu, costs: c } = this.#d;
    const verdicts: Verdict[] = [];
    const accepted: Accepted[] = [];
    // Faults are recorded as the answer goes out: the NACK reaches the source before the
    // fault library's answer can (the blocks before the fault are written first).
    const faults: Array<() => void> = [];
    const ctx = smmu.streamForPd(p.pd);
    const blocks = p.blocks;
    const checks = this.admit !== undefined && (p.key !== undefined || p.qpn !== undefined);
    // Per run, not per block: the blocks the key and QP admit (a check of the whole span
    // first; nothing can be revoked within this synchronous step), and their destinations
    // translated in one call, with the same walks and IOTLB lookups as block by block.
    const { admitted, equal } = this.#admitRun(p, checks);
    const walked = this.#walked;
    const batch =
      ctx && equal && admitted > 0 && ctx.faultModel !== 'stall'
        ? smmu.translateBlocks(
            ctx.sid,
            blocks[0]!.va,
            (admitted - 1) * blocks[0]!.length + blocks[admitted - 1]!.length,
            blocks[0]!.length,
            'write',
            walked,
          )
        : undefined;
    let stopped = false;
    for (let i = 0; i < blocks.length; i++) {
      const blk = blocks[i]!;
      this.retransmitted?.(p.src, p.tid, blk.seq, 'destination', blk.issuedUs, blk.issuedMs);
      if (checks && i >= admitted) {
        verdicts.push({
          seq: blk.seq,
          resp: AckResp.ACCESS_ERR,
          walkUs: 0,
          reason: `node ${this.#d.node} no longer accepts key 0x${(p.key ?? 0).toString(16)} for QP ${p.qpn}`,
        });
        stopped = true;
        break;
      }
      if (!ctx) {
        verdicts.push({ seq: blk.seq, resp: AckResp.PD_ERR, walkUs: 0, reason: `node ${this.#d.node} has no stream for protection domain ${p.pd}` });
        stopped = true;
        break;
      }
      if (batch && i < walked.length) {
        // Translated by the run's one call: no Translation object per block.
        accepted.push({ blk, region: batch.region!, offset: batch.offset + i * blocks[0]!.length, walkUs: walkedCost(c, walked[i]!) });
        continue;
      }
      const tr: Translation = batch?.fault && i === walked.length ? batch.fault : smmu.translate(ctx.sid, blk.va, blk.length, 'write');
      const walkUs = walkCost(c, tr);
      if (!tr.ok) {
        stopped = true;
        if (tr.recoverable) {
          const at = blk.arrivesAt + walkUs;
          faults.push(() => this.#fault(p, blk, ctx.sid, tr, at));
          verdicts.push({ seq: blk.seq, resp: AckResp.FAULT, walkUs });
          break;
        }
        smmu.recordFault(ctx.sid, tr, 'write');
        const status = statusForFault(tr.id, 'write');
        const resp = status === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : status === DmaStatus.PD_ERR ? AckResp.PD_ERR : AckResp.ADDR_ERR;
        verdicts.push({ seq: blk.seq, resp, walkUs, reason: tr.reason });
        break;
      }
      accepted.push({ blk, region: tr.region, offset: tr.offset, walkUs });
      // A stall-mode block is written alone, under its own stall window.
      if (ctx.faultModel === 'stall') break;
    }
    // Verdicts of refused/faulting blocks come after the writes of the blocks before them.
    const refused = verdicts.splice(0);
    let i = 0;
    while (i < accepted.length) {
      let j = i + 1;
      while (j < accepted.length && follows(accepted[j - 1]!, accepted[j]!)) j++;
      const ok = await this.#write(p, accepted.slice(i, j), ctx!.sid, ctx!.faultModel === 'stall', verdicts, faults);
      if (!ok) {
        stopped = true;
        break;
      }
      i = j;
    }
    // A block refused after the written ones was refused (and its fault recorded) all the same.
    verdicts.push(...refused);
    let returned: number[] = [];
    if (stopped || verdicts.length < p.blocks.length) {
      const answered = new Set(verdicts.map((v) => v.seq));
      returned = p.blocks.filter((b) => !answered.has(b.seq)).map((b) => b.seq);
    }
    const ack: AckPacket = {
      type: 'ack',
      src: this.#d.node,
      dst: p.src,
      pd: p.pd,
      va: p.va,
      tid: p.tid,
      seq: p.seq,
      length: p.length,
      resp: AckResp.OK,
      arrivesAt: p.blocks[p.blocks.length - 1]!.arrivesAt + c.linkLatencyUs,
      verdicts,
      returned,
    };
    this.#d.transport.deliver(ack);
    for (const f of faults) f();
  }

  // How many of the packet's blocks the destination's key and QP admit, and whether they are
  // equal blocks (all but the last) contiguous in the destination's address space.
  #admitRun(p: WritePacket, checks: boolean): { admitted: number; equal: boolean } {
    const blocks = p.blocks;
    const first = blocks[0]!;
    const last = blocks[blocks.length - 1]!;
    // Consecutive blocks of a transfer sit at consecutive offsets: consecutive seqs and equal
    // lengths, with the last one where that puts it, are one contiguous span.
    let equal = last.va === first.va + BigInt((last.seq - first.seq) * first.length);
    for (let i = 1; i < blocks.length && equal; i++) equal = blocks[i - 1]!.length === first.length && blocks[i]!.seq === first.seq + i;
    if (!checks) return { admitted: blocks.length, equal };
    if (equal && this.admit!(p, { ...first, length: Number(last.va - first.va) + last.length })) return { admitted: blocks.length, equal };
    let admitted = 0;
    while (admitted < blocks.length && this.admit!(p, blocks[admitted]!)) admitted++;
    return { admitted, equal };
  }

  // One copy-engine job for blocks contiguous at both ends; a verdict for each block it
  // settles. False if it stopped at one (the blocks after it are returned).
  async #write(p: WritePacket, run: Accepted[], sid: number, stall: boolean, verdicts: Verdict[], faults: Array<() => void>): Promise<boolean> {
    const { smmu } = this.#d;
    const first = run[0]!;
    const length = run.reduce((n, a) => n + a.blk.length, 0);
    const window = stall
      ? smmu.beginStallWindow({
          sid,
          region: first.region,
          offset: first.offset,
          length,
          access: 'write',
          tag: this.#info(p, first.blk, sid, first.blk.va, first.blk.arrivesAt),
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
      const tag: { key?: number; qp?: number } = {};
      if (p.key !== undefined) tag.key = p.key;
      if (p.qpn !== undefined) tag.qp = p.qpn;
      const r = await this.#d.engine.copy(first.blk.payload.region, first.blk.payload.offset, first.region, first.offset, length, flags, tag);
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
      verdicts.push({ seq: first.blk.seq, resp: AckResp.ABORTED, walkUs: first.walkUs, stalls });
      return false;
    }
    if (status === CopyStatus.Ok) {
      for (const a of run)
        verdicts.push({ seq: a.blk.seq, resp: AckResp.OK, walkUs: a.walkUs, stalls, copyThread: copy!.copyThread, copyNs: copy!.copyNs });
      return true;
    }
    // The copy stopped at the first page it found missing: the blocks before it were written.
    const k =
      status === CopyStatus.SourceFault || status === CopyStatus.DestFault
        ? Math.max(
            0,
            run.findIndex((a) => faultOffset < (status === CopyStatus.SourceFault ? a.blk.payload.offset : a.offset) + a.blk.length),
          )
        : 0;
    for (const a of run.slice(0, k)) verdicts.push({ seq: a.blk.seq, resp: AckResp.OK, walkUs: a.walkUs, stalls, ...copy });
    const at = run[k]!;
    switch (status) {
      case CopyStatus.SourceFault:
        verdicts.push({ seq: at.blk.seq, resp: AckResp.SOURCE_FAULT, walkUs: at.walkUs, faultOffset, stalls });
        break;
      case CopyStatus.DestFault: {
        const addr = at.region.address + BigInt(faultOffset);
        const evicted: Translation = {
          ok: false,
          id: EvtId.F_TRANSLATION,
          addr,
          recoverable: true,
          reason: 'destination page evicted before the write',
        };
        smmu.iotlb.invalidateRange(addr, at.region.pageSize, at.region.pageSize);
        faults.push(() => this.#fault(p, at.blk, sid, evicted, at.blk.arrivesAt));
        verdicts.push({ seq: at.blk.seq, resp: AckResp.FAULT, walkUs: at.walkUs, late: true, stalls });
        break;
      }
      case CopyStatus.Cancelled:
        // Fenced while queued: the key or QP it was written for went away.
        verdicts.push({
          seq: at.blk.seq,
          resp: AckResp.ACCESS_ERR,
          walkUs: at.walkUs,
          reason: `node ${this.#d.node} revoked key 0x${(p.key ?? 0).toString(16)} / QP ${p.qpn} before the write`,
        });
        break;
      default:
        verdicts.push({ seq: at.blk.seq, resp: AckResp.FLUSHED, walkUs: at.walkUs, reason: 'the copy engine was closed' });
    }
    return false;
  }

  /** This node's fault library answered a destination fault: tell the source over the fabric. */
  destinationResolved(info: FaultInfo, ok: boolean, modelUs: number, fetched = 0): void {
    this.#d.tracer.emit({
      kind: 'resolved',
      node: this.#d.node,
      tid: info.tid,
      channel: info.channel,
      side: 'destination',
      modelUs,
      detail: { seq: info.seq, srcNode: info.srcNode },
    });
    this.#d.transport.send<AckPacket>(
      {
        type: 'ack',
        src: this.#d.node,
        dst: info.srcNode,
        pd: 0,
        va: info.va,
        tid: info.tid,
        seq: info.seq,
        length: 0,
        resp: ok ? AckResp.RESOLVED : AckResp.UNRESOLVED,
        ...(fetched ? { fetched } : {}),
      },
      modelUs,
    );
  }

  #fault(p: WritePacket, blk: WireBlock, sid: number, tr: Extract<Translation, { ok: false }>, at: number): void {
    const d = this.#d;
    d.counters.faults.destination++;
    d.counters.nacksSent++;
    const info = this.#info(p, blk, sid, tr.addr, at);
    d.waiters.add(info);
    traceTransfer(d.tracer, 'fault', d.node, p.tid, p.channel, {
      side: 'destination',
      modelUs: at,
      detail: { seq: blk.seq, va: tr.addr, srcNode: p.src, issuedUs: blk.issuedUs, issuedMs: blk.issuedMs },
    });
    d.smmu.recordFault(sid, tr, 'write', { context: info });
  }

  #info(p: WritePacket, blk: WireBlock, sid: number, va: bigint, at: number): FaultInfo {
    return {
      node: this.#d.node,
      sid,
      side: 'destination',
      srcNode: p.src,
      tid: p.tid,
      channel: p.channel,
      seq: blk.seq,
      va,
      write: true,
      lengthHint: Math.max(0, blk.lengthHint - Number(va - blk.va)),
      modelUs: at,
      detectedMs: performance.now(),
      issuedUs: blk.issuedUs,
      issuedMs: blk.issuedMs,
    };
  }
}
