// A trace of every fault event, exportable as Chrome trace-event JSON (open it in Perfetto or
// chrome://tracing). Two timelines per node: the modelled hardware time and the real time of
// the software path. Each fault becomes complete ("X") slices, one per phase, on the thread
// that did the work (detect: the SMMU; notify: the SMMU driver's IRQ handler; resolve: the
// fault library; retransmit: the engine's channel; copy: the native copy thread), and a flow
// event ties the block's fault to its retransmission, across nodes for a destination fault.
// A recorder scoped to one process exports only that process; the other nodes' events are
// kept only to time the phases that end there (a destination fault is retransmitted by the
// source). A flow is exported only when both its ends are: one process's export has no flow
// start without its finish; the processes of a cluster exported together pair theirs.
import { MODEL_LABEL, type TraceEvent } from '../../kernel-sim/index.js';

/** One Chrome trace-event (the Trace Event Format that Perfetto and chrome://tracing read). */
export interface ChromeTraceEvent {
  /** Event name. */
  name: string;
  /** Category (comma-separated). */
  cat: string;
  /** i: instant, X: complete slice, M: metadata, s / f: flow start / finish, C: a counter (args: its series). */
  ph: 'i' | 'X' | 'M' | 's' | 'f' | 'C';
  /** Timestamp, µs. */
  ts: number;
  /** Duration of a complete ('X') event, µs. */
  dur?: number;
  /** Process id (a track group: one per node and timeline). */
  pid: number;
  /** Thread id (a track). */
  tid: number;
  /** Scope of an instant event: thread, process or global. */
  s?: 't' | 'p' | 'g';
  /** Flow id, joining a flow's start and finish. */
  id?: string;
  /** Flow binding point: 'e' binds to the enclosing slice. */
  bp?: 'e';
  /** Extra fields shown with the event. */
  args?: Record<string, unknown>;
}

/** A whole trace, as JSON.stringify writes it to a file. */
export interface ChromeTrace {
  /** The events. */
  traceEvents: ChromeTraceEvent[];
  /** Unit the viewer shows. */
  displayTimeUnit: 'ns';
  /**
   * producer, model; keptEvents and droppedEvents (the ring's: the oldest are dropped, with a
   * note saying how to keep them); modelOriginUs and realOriginMs when the times start at 0
   * (what 0 is on each clock: modelled µs, performance.now() ms).
   */
  otherData: Record<string, string>;
}

/** What toChromeTrace exports and from where its times count. */
export interface ChromeTraceOptions {
  /** Other processes of the same system exported with this one (their flows paired with its). */
  with?: readonly TraceScope[];
  /**
   * 'absolute' (default): modelled µs since the system started, real µs of performance.now().
   * 'first-event': each time base starts at 0 at the earliest event kept (the origins go to otherData).
   */
  origin?: 'absolute' | 'first-event';
}

/** The phases of one fault, in order, as the trace names its slices. */
export const FAULT_PHASES = ['detect', 'notify', 'resolve', 'retransmit', 'copy'] as const;
/** One of FAULT_PHASES. */
export type FaultPhase = (typeof FAULT_PHASES)[number];

/** Which process a recorder belongs to: its node (and its pid, for notifications). */
export interface TraceScope {
  /** The node whose events are kept. */
  node: number;
  /** The process whose events are kept (default: every process of the node). */
  pid?: number;
}

// Thread lanes of a node (Chrome "tid"): fixed ones, the engine's channels, and the copy
// threads under their real Linux thread ids.
const LANE_SMMU = 1;
const LANE_DRIVER = 2;
const LANE_LIBRARY = 3;
const LANE_CHANNEL = 1_000_000;

type Time = { model: number; real: number };

/** Events a trace keeps by default (a ring: the newest are kept, the oldest dropped). */
export const DEFAULT_TRACE_EVENTS = 200_000;

/** Keeps the newest model trace events of one scope and turns them into a Chrome trace. */
export class TraceRecorder {
  /** Most events kept; older ones are dropped. */
  readonly limit: number;
  /** Whose events are kept (undefined: every node's). */
  readonly scope: TraceScope | undefined;
  /** Events dropped because the ring was full (the oldest ones). */
  dropped = 0;
  /** While true, events are not recorded (a program traces a sample of its transfers, not all). */
  paused = false;
  // A ring of at most `limit` events: memory stays bounded however long the run.
  #ring: TraceEvent[] = [];
  #head = 0;

  constructor(limit = DEFAULT_TRACE_EVENTS, scope?: TraceScope) {
    if (!Number.isSafeInteger(limit) || limit < 1) throw new RangeError(`trace limit must be a positive integer, got ${String(limit)}`);
    this.limit = limit;
    this.scope = scope;
  }

  /** The events kept, oldest first. */
  get events(): TraceEvent[] {
    return this.#head === 0 ? this.#ring.slice() : [...this.#ring.slice(this.#head), ...this.#ring.slice(0, this.#head)];
  }

  /** Keep one event (if it is in scope). */
  record(e: TraceEvent): void {
    if (this.paused) return;
    if (this.#ring.length < this.limit) {
      this.#ring.push(e);
      return;
    }
    this.#ring[this.#head] = e;
    this.#head = (this.#head + 1) % this.limit;
    this.dropped++;
  }

  /** Drop every event kept. */
  clear(): void {
    this.#ring = [];
    this.#head = 0;
    this.dropped = 0;
  }

  /**
   * Chrome trace-event JSON: pid 2n = node n in modelled µs, pid 2n+1 = node n in real µs:
   * the two time bases are separate processes. Scoped: only this process's node (and those
   * of `options.with`).
   */
  toChromeTrace(options: ChromeTraceOptions = {}): ChromeTrace {
    const events = this.events;
    const out: ChromeTraceEvent[] = [];
    const lanes = new Map<string, { pid: number; tid: number; name: string }>();
    const scopes = this.scope === undefined ? undefined : [this.scope, ...(options.with ?? [])];
    const own = (node: number) => scopes === undefined || scopes.some((s) => s.node === node);
    const ownPid = (e: TraceEvent) => {
      const pid = e.detail?.['pid'];
      if (pid === undefined || scopes === undefined) return true;
      const mine = scopes.filter((s) => s.node === e.node);
      return mine.length === 0 || mine.some((s) => s.pid === undefined || s.pid === pid);
    };
    const origin = options.origin === 'first-event' ? originOf(events) : { model: 0, real: 0 };
    // One event on both timelines, and the lane it is on named once.
    const both = (node: number, tid: number, lane: string, make: (pid: number, at: 'model' | 'real') => ChromeTraceEvent | undefined) => {
      for (const at of ['model', 'real'] as const) {
        const pid = node * 2 + (at === 'model' ? 0 : 1);
        const ev = make(pid, at);
        if (!ev) continue;
        out.push(ev);
        lanes.set(`${pid}:${tid}`, { pid, tid, name: lane });
      }
    };
    const ts = (t: Time, at: 'model' | 'real') => (at === 'model' ? t.model - origin.model : (t.real - origin.real) * 1000);
    const time = (e: TraceEvent): Time => ({ model: e.modelUs, real: e.realMs });

    const nodes = new Set<number>();
    for (const e of events) {
      if (!own(e.node) || !ownPid(e)) continue;
      nodes.add(e.node);
      const args: Record<string, unknown> = { side: e.side, tid: e.tid, ...stringify(e.detail ?? {}) };
      const name = e.side ? `${e.kind} (${e.side})` : e.kind;
      const [tid, lane] = laneOf(e);
      both(e.node, tid, lane, (pid, at) => ({ name, cat: e.kind, ph: 'i', s: 't', ts: ts(time(e), at), pid, tid, args }));
    }

    // The phases of each fault, from the events of every node (kept in order of emission):
    // the later steps of each block, indexed by kind, node, source node, transfer, block, side.
    const stepKey = (kind: TraceEvent['kind'], node: number, src: number, tid: number | undefined, seq: unknown, side: string | undefined) =>
      `${kind}:${node}:${src}:${String(tid)}:${String(seq)}:${kind === 'retransmit' || kind === 'ack' ? '' : (side ?? '')}`;
    const steps = new Map<string, number[]>();
    events.forEach((e, k) => {
      if (e.kind !== 'notify' && e.kind !== 'resolved' && e.kind !== 'retransmit' && e.kind !== 'ack') return;
      const key = stepKey(e.kind, e.node, (e.detail?.['srcNode'] as number | undefined) ?? e.node, e.tid, e.detail?.['seq'], e.side);
      const list = steps.get(key);
      if (list) list.push(k);
      else steps.set(key, [k]);
    });
    for (let i = 0; i < events.length; i++) {
      const f = events[i]!;
      if (f.kind !== 'fault' || f.tid === undefined) continue;
      const seq = f.detail?.['seq'];
      const src = (f.detail?.['srcNode'] as number | undefined) ?? f.node;
      // The first step of `kind` of this block after index `from`.
      const find = (from: number, kind: TraceEvent['kind'], node: number, also: (e: TraceEvent) => boolean = () => true) => {
        for (const k of steps.get(stepKey(kind, node, src, f.tid, seq, f.side)) ?? []) if (k >= from && also(events[k]!)) return k;
        return -1;
      };
      const n = find(i + 1, 'notify', f.node);
      const notify = n >= 0 ? events[n]! : undefined;
      if (notify && !ownPid(notify) && own(f.node)) continue; // another process's fault on this node
      const r = find(Math.max(i, n) + 1, 'resolved', f.node);
      const resolved = r >= 0 ? events[r]! : undefined;
      const x = resolved ? find(r + 1, 'retransmit', src) : -1;
      const retransmit = x >= 0 ? events[x]! : undefined;
      const a = retransmit ? find(x + 1, 'ack', src, (e) => e.detail?.['attempt'] === retransmit.detail?.['attempt']) : -1;
      const ack = a >= 0 ? events[a]! : undefined;

      const issued: Time = { model: Number(f.detail?.['issuedUs'] ?? f.modelUs), real: Number(f.detail?.['issuedMs'] ?? f.realMs) };
      const args = { side: f.side, transfer: f.tid, block: seq, srcNode: src, va: stringify({ va: f.detail?.['va'] })['va'] };
      const channelLane = LANE_CHANNEL + (f.channel ?? 0);
      const slices: Array<[FaultPhase, number, number, string, Time, Time | undefined]> = [
        ['detect', f.node, LANE_SMMU, 'SMMU', issued, time(f)],
        ['notify', f.node, LANE_DRIVER, 'SMMU driver (IRQ handler)', time(f), notify && time(notify)],
        ['resolve', f.node, LANE_LIBRARY, 'fault library', notify ? time(notify) : time(f), resolved && time(resolved)],
        ['retransmit', src, channelLane, `PLDMA channel ${f.channel ?? 0}`, resolved ? time(resolved) : time(f), retransmit && time(retransmit)],
      ];
      if (retransmit && ack) {
        const thread = Number(ack.detail?.['thread'] ?? 0);
        slices.push([
          'copy',
          src,
          thread || channelLane,
          thread ? `copy engine thread ${thread}` : `PLDMA channel ${f.channel ?? 0}`,
          time(retransmit),
          time(ack),
        ]);
      }
      for (const [phase, node, tid, lane, start, end] of slices) {
        if (!end || !own(node)) continue;
        nodes.add(node);
        both(node, tid, lane, (pid, at) => {
          const t0 = ts(start, at);
          return { name: phase, cat: 'fault', ph: 'X', ts: t0, dur: Math.max(0, ts(end, at) - t0), pid, tid, args };
        });
      }
      // The flow: from the faulting block's detection to the block's retransmission, when
      // both ends are in this export.
      if (retransmit && own(f.node) && own(src)) {
        const id = `${src}:${f.tid}:${String(seq)}:${f.side}:${String(retransmit.detail?.['attempt'])}`;
        const flow = { name: 'fault -> retransmission', cat: 'fault' };
        both(f.node, LANE_SMMU, 'SMMU', (pid, at) => ({ ...flow, ph: 's', id: `${at}:${id}`, ts: ts(issued, at), pid, tid: LANE_SMMU }));
        both(src, channelLane, `PLDMA channel ${f.channel ?? 0}`, (pid, at) => ({
          ...flow,
          ph: 'f',
          bp: 'e',
          id: `${at}:${id}`,
          ts: ts(resolved ? time(resolved) : time(f), at),
          pid,
          tid: channelLane,
        }));
      }
    }

    for (const n of nodes) {
      const pids = (scopes ?? []).filter((s) => s.node === n && s.pid !== undefined).map((s) => s.pid);
      const scopePid = pids.length ? ` (pid ${pids.join(', ')})` : '';
      out.push({ name: 'process_name', cat: '__metadata', ph: 'M', ts: 0, pid: n * 2, tid: 0, args: { name: `node ${n}: ${MODEL_LABEL}` } });
      out.push({
        name: 'process_name',
        cat: '__metadata',
        ph: 'M',
        ts: 0,
        pid: n * 2 + 1,
        tid: 0,
        args: { name: `node ${n}: measured (real time)` },
      });
      out.push({ name: 'process_labels', cat: '__metadata', ph: 'M', ts: 0, pid: n * 2, tid: 0, args: { labels: `node ${n}${scopePid}` } });
      out.push({ name: 'process_labels', cat: '__metadata', ph: 'M', ts: 0, pid: n * 2 + 1, tid: 0, args: { labels: `node ${n}${scopePid}` } });
    }
    for (const l of lanes.values())
      out.push({ name: 'thread_name', cat: '__metadata', ph: 'M', ts: 0, pid: l.pid, tid: l.tid, args: { name: l.name } });
    const otherData: Record<string, string> = {
      producer: 'pagefault-rdma',
      model: MODEL_LABEL,
      keptEvents: String(events.length),
      droppedEvents: String(this.dropped),
    };
    if (this.dropped > 0)
      otherData['dropped'] =
        `the oldest ${this.dropped} events were dropped: the ring keeps the newest ${this.limit}; ` +
        'keep more with Cluster.create({ trace: { limit } }) (the programs: --trace-events N)';
    if (options.origin === 'first-event') {
      otherData['modelOriginUs'] = String(origin.model);
      otherData['realOriginMs'] = String(origin.real);
    }
    return { traceEvents: out, displayTimeUnit: 'ns', otherData };
  }
}

// Where each time base starts: the earliest event kept, or the issue of the earliest fault.
function originOf(events: readonly TraceEvent[]): Time {
  let model = Infinity;
  let real = Infinity;
  for (const e of events) {
    model = Math.min(model, e.modelUs, Number(e.detail?.['issuedUs'] ?? Infinity));
    real = Math.min(real, e.realMs, Number(e.detail?.['issuedMs'] ?? Infinity));
  }
  return Number.isFinite(model) ? { model, real } : { model: 0, real: 0 };
}

// The thread an instant event happened on.
function laneOf(e: TraceEvent): [number, string] {
  switch (e.kind) {
    case 'fault':
      return [LANE_SMMU, 'SMMU'];
    case 'irq':
    case 'notify':
    case 'notify-dropped':
    case 'resume':
      return [LANE_DRIVER, 'SMMU driver (IRQ handler)'];
    case 'resolved':
      return [LANE_LIBRARY, 'fault library'];
    default:
      return [LANE_CHANNEL + (e.channel ?? 0), `PLDMA channel ${e.channel ?? 0}`];
  }
}

function stringify(o: Record<string, unknown>): Record<string, unknown> {
  const r: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) r[k] = typeof v === 'bigint' ? `0x${v.toString(16)}` : v;
  return r;
}
