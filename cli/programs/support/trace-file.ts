// A program's --trace file: the Chrome trace of every process it ran (the contexts of one
// cluster exported together, so a fault's flow from one process to the other is paired),
// runs of several clusters side by side under distinct pids, plus any events a program traces
// itself (the userfaultfd programs, which have no fault library). What the rings dropped is
// counted in the file's metadata and said on stderr; the programs trace a sample of their
// transfers (sample()), so that the file stays one Perfetto opens.
import { writeFileSync } from 'node:fs';
import { MODEL_LABEL } from '../../../kernel-sim/index.js';
import { DEFAULT_TRACE_EVENTS, defaultHardware, type ChromeTraceEvent, type Context } from '../../../lib/index.js';

export class TraceFile {
  readonly events: ChromeTraceEvent[] = [];
  /** Events each process's ring keeps (--trace-events): what a cluster is created with. */
  readonly limit: number;
  /** Events the rings dropped (the oldest), over every run added. */
  dropped = 0;
  // The first pid no run has used yet.
  #base = 0;

  constructor(limit = DEFAULT_TRACE_EVENTS) {
    this.limit = limit;
  }

  /** The cluster option that makes its processes keep a trace for this file. */
  get option(): { limit: number } {
    return { limit: this.limit };
  }

  /**
   * Record only while `on` (the programs trace one transfer of each kind, not thousands):
   * pauses or resumes the rings of `contexts`.
   */
  sample(contexts: readonly Context[], on: boolean): void {
    for (const c of contexts) c.faultLibrary.trace.paused = !on;
  }

  /** The traces of `contexts`, the processes of one cluster (call before the cluster closes or after: traces outlive it). */
  addContexts(contexts: readonly Context[], label?: string): void {
    const [first, ...rest] = contexts;
    if (!first) return;
    // Each cluster's node n is pid 2n / 2n+1 in its own export; each run gets pids of its own.
    const offset = this.#base;
    const trace = first.faultLibrary.exportChromeTrace({ with: rest.map((c) => c.faultLibrary) });
    this.dropped += first.faultLibrary.trace.dropped;
    for (const e of trace.traceEvents) {
      const ev = { ...e, pid: e.pid + offset };
      this.#base = Math.max(this.#base, ev.pid + 1);
      if (e.id !== undefined) ev.id = `${offset}:${e.id}`; // flow ids restart with each cluster
      if (label && e.ph === 'M' && e.name === 'process_name') ev.args = { name: `${label}: ${String(e.args?.['name'])}` };
      this.events.push(ev);
    }
  }

  /** A pid of its own for a program's own events. */
  nextPid(): number {
    return this.#base++;
  }

  add(...events: ChromeTraceEvent[]): void {
    this.events.push(...events);
  }

  /** What to tell the user about events the rings dropped, or undefined when none were. */
  get droppedNote(): string | undefined {
    if (this.dropped === 0) return undefined;
    return (
      `${this.dropped} trace events were dropped (the oldest: each process keeps the newest ${this.limit}); ` +
      `keep them with --trace-events ${nextLimit(this.limit + this.dropped)}, or trace fewer iterations`
    );
  }

  write(file: string): void {
    const otherData: Record<string, string> = {
      producer: 'pagefault-rdma',
      model: MODEL_LABEL,
      // The hardware preset the modelled times are of (--hardware; pagefault-rdma hardware).
      hardware: defaultHardware(),
      eventsKeptPerProcess: String(this.limit),
      droppedEvents: String(this.dropped),
    };
    const note = this.droppedNote;
    if (note) otherData['dropped'] = note;
    writeFileSync(file, JSON.stringify({ traceEvents: this.events, displayTimeUnit: 'ns', otherData }));
  }
}

// A round figure at or above n.
function nextLimit(n: number): number {
  const step = 10 ** Math.max(0, Math.floor(Math.log10(n)) - 1);
  return Math.ceil(n / step) * step;
}
