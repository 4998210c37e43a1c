// The responder of one node's PLDMA (rxe_resp's role): a write packet arrives, its
// destination is translated on this node's SMMU with the packet's protection domain, a
// fault is recorded here and NACKed (the source sends the block again once this node's
// fault library has answered), an access this node refuses gets an error ACK, and a block
// that translates is written by the copy engine and ACKed. Everything it knows comes from
// the packet; everything it says goes back as a packet.
import type { CostModel } from '../cost-model/index.js';
import { AckResp, type AckPacket, type WritePacket } from '../fabric/packets.js';
import type { Transport } from '../fabric/transport.js';
import { EvtId } from '../smmu/records.js';
import type { Smmu, StallWindow, Translation } from '../smmu/smmu.js';
import type { Tracer } from '../trace.js';
import { statusForFault } from './completer.js';
import { type CopyEngine, CopyFlag, CopyStatus } from './copy-engine.js';
import type { FaultWaiters } from './fault-waiters.js';
import { DmaStatus, type FaultInfo, type PldmaCounters, type Retransmitted, stallDelay, traceTransfer, walkCost } from './types.js';

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
export type Admission = (p: WritePacket) => boolean;

export class Responder {
  #d: ResponderDeps;
  admit: Admission | undefined;
  retransmitted: Retransmitted | undefined;
  /** Copy-engine jobs in flight for packets this node received. */
  jobs = 0;

  constructor(deps: ResponderDeps) {
    this.#d = deps;
  }

  async onWrite(p: WritePacket): Promise<void> {
    const { smmu, costs: c } = this.#d;
    this.retransmitted?.(p.src, p.tid, p.seq, 'destination', p.issuedUs, p.issuedMs);
    if (this.admit && (p.key !== undefined || p.qpn !== undefined) && !this.admit(p))
      return this.#answer(p, AckResp.ACCESS_ERR, p.arrivesAt + c.linkLatencyUs, { reason: `node ${this.#d.node} no longer accepts key 0x${(p.key ?? 0).toString(16)} for QP ${p.qpn}` });
    const ctx = smmu.streamForPd(p.pd);
    if (!ctx) return this.#answer(p, AckResp.PD_ERR, p.arrivesAt + c.linkLatencyUs, { reason: `node ${this.#d.node} has no stream for protection domain ${p.pd}` });
    const tr = smmu.translate(ctx.sid, p.va, p.length, 'write');
    const walkUs = walkCost(c, tr);
    if (!tr.ok) {
      if (tr.recoverable) {
        this.#fault(p, ctx.sid, tr, p.arrivesAt + walkUs);
        return this.#answer(p, AckResp.FAULT, p.arrivesAt + walkUs + c.linkLatencyUs);
      }
      smmu.recordFault(ctx.sid, tr, 'write');
      const status = statusForFault(tr.id, 'write');
      const resp = status === DmaStatus.DST_PERM_ERR ? AckResp.ACCESS_ERR : status === DmaStatus.PD_ERR ? AckResp.PD_ERR : AckResp.ADDR_ERR;
      return this.#answer(p, resp, p.arrivesAt + walkUs + c.linkLatencyUs, { reason: tr.reason });
    }
    let window: StallWindow | undefined;
    if (ctx.faultModel === 'stall') {
      window = smmu.beginStallWindow({
        sid: ctx.sid,
        region: tr.region,
        offset: tr.offset,
        length: p.length,
        access: 'write',
        tag: this.#info(p, ctx.sid, p.va, p.arrivesAt),
      });
    }
    // Terminate-mode sides are walked again by the copy thread right before copying (a page
    // evicted meanwhile is a fault, not silent zeros); stall-mode sides fault for real.
    const flags = (p.sourceStall ? 0 : CopyFlag.CheckSource) | (window ? 0 : CopyFlag.CheckDest);
    this.jobs++;
    let status: CopyStatus;
    let faultOffset = -1;
    try {
      const tag: { key?: number; qp?: number } = {};
      if (p.key !== undefined) tag.key = p.key;
      if (p.qpn !== undefined) tag.qp = p.qpn;
      const r = await this.#d.engine.copy(p.payload.region, p.payload.offset, tr.region, tr.offset, p.length, flags, tag);
      status = r.status;
      faultOffset = r.faultOffset;
    } catch {
      status = -1 as CopyStatus;
    } finally {
      this.jobs--;
      if (window) smmu.endStallWindow(window);
    }
    const stalls = window?.stalls ?? 0;
    this.#d.counters.faults.destination += stalls;
    const extra = { stalls };
    if (window?.aborted) return this.#answer(p, AckResp.ABORTED, p.arrivesAt + stalls * stallDelay(c) + c.linkLatencyUs, extra);
    switch (status) {
      case CopyStatus.Ok:
        return this.#answer(p, AckResp.OK, p.arrivesAt + walkUs + stalls * stallDelay(c) + c.linkLatencyUs, extra);
      case CopyStatus.SourceFault:
        return this.#answer(p, AckResp.SOURCE_FAULT, p.arrivesAt, { ...extra, faultOffset });
      case CopyStatus.DestFault: {
        const addr = tr.region.address + BigInt(faultOffset);
        const evicted: Translation = { ok: false, id: EvtId.F_TRANSLATION, addr, recoverable: true, reason: 'destination page evicted before the write' };
        smmu.iotlb.invalidateRange(addr, tr.region.pageSize, tr.region.pageSize);
        this.#fault(p, ctx.sid, evicted, p.arrivesAt);
        return this.#answer(p, AckResp.FAULT, p.arrivesAt + c.linkLatencyUs, extra);
      }
      case CopyStatus.Cancelled:
        // Fenced while queued: the key or QP it was written for went away.
        return this.#answer(p, AckResp.ACCESS_ERR, p.arrivesAt + c.linkLatencyUs, { ...extra, reason: `node ${this.#d.node} revoked key 0x${(p.key ?? 0).toString(16)} / QP ${p.qpn} before the write` });
      default:
        return this.#answer(p, AckResp.FLUSHED, p.arrivesAt, { ...extra, reason: 'the copy engine was closed' });
    }
  }

  /** This node's fault library answered a destination fault: tell the source over the fabric. */
  destinationResolved(info: FaultInfo, ok: boolean, modelUs: number): void {
    this.#d.tracer.emit({ kind: 'resolved', node: this.#d.node, tid: info.tid, channel: info.channel, side: 'destination', modelUs, detail: { seq: info.seq, srcNode: info.srcNode } });
    this.#d.transport.send<AckPacket>(
      { type: 'ack', src: this.#d.node, dst: info.srcNode, pd: 0, va: info.va, tid: info.tid, seq: info.seq, length: 0, resp: ok ? AckResp.RESOLVED : AckResp.UNRESOLVED },
      modelUs,
    );
  }

  #fault(p: WritePacket, sid: number, tr: Extract<Translation, { ok: false }>, at: number): void {
    const d = this.#d;
    d.counters.faults.destination++;
    d.counters.nacksSent++;
    const info = this.#info(p, sid, tr.addr, at);
    d.waiters.add(info);
    traceTransfer(d.tracer, 'fault', d.node, p.tid, p.channel, {
      side: 'destination',
      modelUs: at,
      detail: { seq: p.seq, va: tr.addr, srcNode: p.src, issuedUs: p.issuedUs, issuedMs: p.issuedMs },
    });
    d.smmu.recordFault(sid, tr, 'write', { context: info });
  }

  #info(p: WritePacket, sid: number, va: bigint, at: number): FaultInfo {
    return {
      node: this.#d.node,
      sid,
      side: 'destination',
      srcNode: p.src,
      tid: p.tid,
      channel: p.channel,
      seq: p.seq,
      va,
      write: true,
      lengthHint: Math.max(0, p.lengthHint - Number(va - p.va)),
      modelUs: at,
      detectedMs: performance.now(),
      issuedUs: p.issuedUs,
      issuedMs: p.issuedMs,
    };
  }

  #answer(p: WritePacket, resp: AckResp, arrivesAt: number, extra: { reason?: string; faultOffset?: number; stalls?: number } = {}): void {
    const ack: AckPacket = { type: 'ack', src: this.#d.node, dst: p.src, pd: p.pd, va: p.va, tid: p.tid, seq: p.seq, length: p.length, resp, arrivesAt, ...extra };
    this.#d.transport.deliver(ack);
  }
}
