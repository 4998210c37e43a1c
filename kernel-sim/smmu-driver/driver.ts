// The modified Linux SMMU driver of one node. Its interrupt handler drains the event queue,
// decodes each record, maps the StreamID to its owner process and notifies that process's
// fault library over netlink; it turns the library's answers into engine retransmission
// requests (terminate) or CMD_RESUME (stall). Unrecoverable faults (address size,
// permission) are logged and counted only: the engine already ended those transfers.
import type { CostModel } from '../cost-model/index.js';
import { decodeResolved, encodeFault, encodeResolvedAck, type NlAttrs, type ResolveMethod } from '../netlink/messages.js';
import { NlCmd, type NetlinkFamily, type NetlinkSocket, type NlMessage } from '../netlink/netlink.js';
import type { PageResponse, SentAgain } from '../rc/faults.js';
import type { FaultInfo } from '../pldma/types.js';
import { CMD_RESUME, EvtId, eventName, ResumeResp, type SmmuEventRecord } from '../smmu/records.js';
import type { Smmu } from '../smmu/smmu.js';
import type { Tracer } from '../trace.js';
import { IommuPageResponseCode, isRecoverable, resumeFor, toPageRequest, type IommuFaultPageRequest } from './iopf.js';

export type { ResolveMethod };

/** One fault as the driver handled it (for users who want to watch). */
export interface DriverFault {
  /** The SMMU event record. */
  record: SmmuEventRecord;
  /** The event's name (e.g. F_TRANSLATION). */
  name: string;
  /** What today's Linux IOPF framework would report. */
  pageRequest: IommuFaultPageRequest;
  /** The process that owns the stream, if known. */
  pid: number | undefined;
  /** The engine's context of the fault (transfer, block, side), if it came from a transfer. */
  info: FaultInfo | undefined;
  /** Netlink sequence number of the notification, -1 if dropped, undefined if not sent. */
  seq: number | undefined;
}

/** Counters of one SMMU driver. */
export interface DriverCounters {
  /** Interrupts handled. */
  interrupts: number;
  /** Event records drained. */
  records: number;
  /** Faults sent to a fault library. */
  notified: number;
  /** Notifications dropped (no listener, or a full queue). */
  dropped: number;
  /** Records of faults that cannot be recovered (permission, address size). */
  unrecoverable: number;
  /** Records of a stream no process owns. */
  unknownStream: number;
  /** Answers received from fault libraries. */
  responses: number;
  /** CMD_RESUME commands issued. */
  resumes: number;
}

/**
 * The engine of the driver's node, which owns what a fault means for a transfer: the driver
 * hands it the fault library's answer (iommu_page_response: the status, with what the
 * library did) and keeps no engine bookkeeping of its own.
 */
export interface FaultAnswers {
  /** A terminated fault answered; `sentAgain` hears when the block goes out again. */
  answer(info: FaultInfo, response: PageResponse, sentAgain?: SentAgain): void;
  /** When (modelled) the fault library's answer to a fault reached the engine or, for a stalled access, the SMMU. */
  answeredAt(info: FaultInfo, method: ResolveMethod, bytes: number): number;
}

/** The modified Linux SMMU driver of one node: its IRQ handler drains the event queue, finds the stream's owner, notifies its fault library over netlink, and acts on the answer (retransmission or CMD_RESUME). */
export class SmmuDriver {
  /** The node the driver runs on. */
  readonly node: number;
  #smmu: Smmu;
  #netlink: NetlinkFamily;
  #costs: CostModel;
  #tracer: Tracer;
  #engine: FaultAnswers | undefined;
  #pending = new Map<string, FaultInfo>(); // notified and waiting for the library
  #watchers: Array<(f: DriverFault) => void> = [];
  #c: DriverCounters = { interrupts: 0, records: 0, notified: 0, dropped: 0, unrecoverable: 0, unknownStream: 0, responses: 0, resumes: 0 };

  constructor(node: number, deps: { smmu: Smmu; netlink: NetlinkFamily; costs: CostModel; tracer: Tracer }) {
    this.node = node;
    this.#smmu = deps.smmu;
    this.#netlink = deps.netlink;
    this.#costs = deps.costs;
    this.#tracer = deps.tracer;
    this.#smmu.onInterrupt(() => this.#irq());
    this.#netlink.onKernelMessage((m, from, wantsAck) => this.#onMessage(m, from, wantsAck));
  }

  /** The engine of this node, told when the fault library has answered a terminated fault. */
  attachEngine(engine: FaultAnswers): void {
    this.#engine = engine;
  }

  /** Watch every fault the driver handles, with its iommu_fault_page_request form. */
  onFault(watcher: (f: DriverFault) => void): () => void {
    this.#watchers.push(watcher);
    return () => {
      this.#watchers = this.#watchers.filter((w) => w !== watcher);
    };
  }

  /** The counters now. */
  counters(): DriverCounters {
    return { ...this.#c };
  }

  /** Faults notified and not yet answered. */
  get pending(): number {
    return this.#pending.size;
  }

  #irq(): void {
    this.#c.interrupts++;
    for (const record of this.#smmu.eventq.drain()) {
      this.#c.records++;
      this.#handle(record);
    }
  }

  #handle(record: SmmuEventRecord): void {
    const ctx = this.#smmu.stream(record.sid);
    let info: FaultInfo | undefined;
    if (record.stall) {
      const s = this.#smmu.stalledAccess(record.stag);
      if (s) info = { ...(s.window.tag as FaultInfo), va: record.addr, stall: { stag: record.stag, window: s.window } };
    } else {
      info = this.#smmu.takeFaultContext(record.stag) as FaultInfo | undefined;
    }
    if (info && this.#tracer.active) {
      this.#tracer.emit({
        kind: 'irq',
        node: this.node,
        tid: info.tid,
        channel: info.channel,
        side: info.side,
        modelUs: info.modelUs + this.#costs.eventRecordUs + this.#costs.irqUs,
        detail: { seq: info.seq, srcNode: info.srcNode, sid: record.sid, event: eventName(record.id) },
      });
    }
    const fault: DriverFault = {
      record,
      name: eventName(record.id),
      pageRequest: toPageRequest(record, info?.lengthHint ?? 0),
      pid: ctx?.pid,
      info,
      seq: undefined,
    };
    if (!ctx) {
      this.#c.unknownStream++;
    } else if (!isRecoverable(record) || !info) {
      this.#c.unrecoverable++;
    } else {
      const attrs = encodeFault({
        pid: ctx.pid,
        va: record.addr,
        length: info.lengthHint,
        write: !record.rnw,
        node: this.node,
        channel: info.channel,
        transfer: info.tid,
        srcNode: info.srcNode,
        block: info.seq,
        side: info.side,
        sid: record.sid,
        event: record.id,
        stall: record.stall,
        stag: record.stag,
        issuedUs: info.issuedUs,
        issuedMs: info.issuedMs,
        detectedUs: info.modelUs,
        detectedMs: info.detectedMs,
        notifyUs: info.modelUs + this.#costs.eventRecordUs + this.#costs.irqUs + this.#costs.driverUs + this.#costs.netlinkUs,
      });
      const key = this.#key(record.sid, record.addr, record.stall ? record.stag : 0);
      this.#pending.set(key, info); // before sending: the answer may come at once
      const seq = this.#netlink.unicast(ctx.pid, NlCmd.FAULT, attrs);
      fault.seq = seq;
      const modelUs = info.modelUs + this.#costs.eventRecordUs + this.#costs.irqUs + this.#costs.driverUs;
      if (seq < 0) {
        this.#pending.delete(key);
        this.#c.dropped++;
        this.#tracer.emit({ kind: 'notify-dropped', node: this.node, tid: info.tid, channel: info.channel, side: info.side, modelUs });
        // Nobody will answer a stalled access: terminate it rather than leave it stalled.
        if (record.stall) this.#resume(record.sid, record.stag, ResumeResp.TERM);
      } else {
        this.#c.notified++;
        this.#tracer.emit({
          kind: 'notify',
          node: this.node,
          tid: info.tid,
          channel: info.channel,
          side: info.side,
          modelUs: modelUs + this.#costs.netlinkUs,
          detail: { seq: info.seq, srcNode: info.srcNode, pid: ctx.pid },
        });
      }
    }
    for (const w of this.#watchers) w(fault);
  }

  #onMessage(m: NlMessage, from: NetlinkSocket, wantsAck: boolean): NlAttrs | 'defer' | undefined {
    const r = decodeResolved(m);
    if (!r) return undefined;
    const { sid, va, stag, stall } = r;
    const key = this.#key(sid, va, stall ? stag : 0);
    const info = this.#pending.get(key);
    // A process may only answer its own faults.
    if (!info || this.#smmu.stream(sid)?.pid !== from.pid) return undefined;
    this.#pending.delete(key);
    this.#c.responses++;
    const code = r.status;
    const resolvedUs = this.#engine?.answeredAt(info, r.method, r.length) ?? info.modelUs;
    if (stall && info.stall) {
      this.#resume(sid, stag, resumeFor(code));
      return encodeResolvedAck({ resolvedUs });
    }
    // The ACK of an answer that asks for a retransmission waits for it: it tells the library
    // when the block went out again (the last phase of the fault's statistics).
    const deferred = wantsAck && code === IommuPageResponseCode.SUCCESS;
    const sentAgain = deferred
      ? (retransmitUs: number, retransmitMs: number) => {
          if (!from.closed) this.#netlink.ack(from, m.seq, encodeResolvedAck({ resolvedUs, retransmitUs, retransmitMs }));
        }
      : undefined;
    this.#engine?.answer(info, { status: code, method: r.method, bytes: r.length, fetched: r.fetched ?? 0 }, sentAgain);
    return deferred ? 'defer' : encodeResolvedAck({ resolvedUs });
  }

  #resume(sid: number, stag: number, resp: ResumeResp): void {
    this.#c.resumes++;
    this.#smmu.command({ opcode: CMD_RESUME, sid, stag, resp });
    this.#tracer.emit({ kind: 'resume', node: this.node, modelUs: 0, detail: { sid, stag, resp: ResumeResp[resp] } });
  }

  #key(sid: number, va: bigint, stag: number): string {
    return `${sid}:${va}:${stag}`;
  }
}

export { EvtId };
