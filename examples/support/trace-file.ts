// A program's --trace file: the Chrome trace of every process it ran (each context's own
// export), runs of several clusters side by side under distinct pids, plus any events a
// program traces itself (the userfaultfd programs, which have no fault library).
import { writeFileSync } from 'node:fs';
import { MODEL_LABEL } from '../../kernel-sim/index.js';
import type { ChromeTraceEvent, Context } from '../../lib/index.js';

export class TraceFile {
  readonly events: ChromeTraceEvent[] = [];
  // The first pid no run has used yet.
  #base = 0;

  /** The traces of `contexts` (call before the cluster closes or after: traces outlive it). */
  addContexts(contexts: readonly Context[], label?: string): void {
    // Each cluster's node n is pid 2n / 2n+1 in its own export; each run gets pids of its own.
    const offset = this.#base;
    for (const c of contexts) {
      for (const e of c.faultLibrary.exportChromeTrace().traceEvents) {
        const ev = { ...e, pid: e.pid + offset };
        this.#base = Math.max(this.#base, ev.pid + 1);
        if (e.id !== undefined) ev.id = `${offset}:${e.id}`; // flow ids restart with each cluster
        if (label && e.ph === 'M' && e.name === 'process_name') ev.args = { name: `${label}: ${String(e.args?.['name'])}` };
        this.events.push(ev);
      }
    }
  }

  /** A pid of its own for a program's own events. */
  nextPid(): number {
    return this.#base++;
  }

  add(...events: ChromeTraceEvent[]): void {
    this.events.push(...events);
  }

  write(file: string): void {
    writeFileSync(
      file,
      JSON.stringify({ traceEvents: this.events, displayTimeUnit: 'ns', otherData: { producer: 'pagefault-rdma', model: MODEL_LABEL } }),
    );
  }
}
