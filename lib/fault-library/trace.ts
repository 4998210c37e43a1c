// A trace of every fault event, exportable as Chrome trace-event JSON (open it in
// Perfetto or chrome://tracing). Two timelines per node: the modelled hardware time and
// the real time of the software path, so both can be read side by side.
import { MODEL_LABEL, type TraceEvent } from '../../kernel-sim/index.js';

export interface ChromeTraceEvent {
  name: string;
  cat: string;
  ph: 'i' | 'X' | 'M';
  ts: number;
  dur?: number;
  pid: number;
  tid: number;
  s?: 't' | 'p' | 'g';
  args?: Record<string, unknown>;
}

export class TraceRecorder {
  readonly events: TraceEvent[] = [];
  readonly limit: number;
  dropped = 0;
  #t0 = performance.now();

  constructor(limit = 200_000) {
    this.limit = limit;
  }

  record(e: TraceEvent): void {
    if (this.events.length >= this.limit) {
      this.dropped++;
      return;
    }
    this.events.push(e);
  }

  clear(): void {
    this.events.length = 0;
    this.dropped = 0;
    this.#t0 = performance.now();
  }

  /** Chrome trace-event JSON: pid 2n = node n (modelled µs), pid 2n+1 = node n (real µs). */
  toChromeTrace(): { traceEvents: ChromeTraceEvent[]; displayTimeUnit: 'ns'; otherData: Record<string, string> } {
    const out: ChromeTraceEvent[] = [];
    const nodes = new Set<number>();
    for (const e of this.events) {
      nodes.add(e.node);
      const args: Record<string, unknown> = { side: e.side, tid: e.tid, ...stringify(e.detail ?? {}) };
      const name = e.side ? `${e.kind} (${e.side})` : e.kind;
      const lane = e.channel ?? 0;
      out.push({ name, cat: e.kind, ph: 'i', s: 't', ts: e.modelUs, pid: e.node * 2, tid: lane, args });
      out.push({ name, cat: e.kind, ph: 'i', s: 't', ts: (e.realMs - this.#t0) * 1000, pid: e.node * 2 + 1, tid: lane, args });
    }
    for (const n of nodes) {
      out.push({ name: 'process_name', cat: '__metadata', ph: 'M', ts: 0, pid: n * 2, tid: 0, args: { name: `node ${n}: ${MODEL_LABEL}` } });
      out.push({ name: 'process_name', cat: '__metadata', ph: 'M', ts: 0, pid: n * 2 + 1, tid: 0, args: { name: `node ${n}: measured (real time)` } });
    }
    return { traceEvents: out, displayTimeUnit: 'ns', otherData: { producer: 'pagefault-rdma', model: MODEL_LABEL } };
  }
}

function stringify(o: Record<string, unknown>): Record<string, unknown> {
  const r: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) r[k] = typeof v === 'bigint' ? `0x${v.toString(16)}` : v;
  return r;
}
