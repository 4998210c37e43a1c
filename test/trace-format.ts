// A validator for Chrome trace-event JSON (the "JSON Object Format" of the Trace Event Format
// document that Perfetto and chrome://tracing read): returns every violation it finds.
const PHASES = new Set(['B', 'E', 'X', 'i', 'I', 'C', 'b', 'n', 'e', 's', 't', 'f', 'P', 'N', 'O', 'D', 'M', 'V', 'v', 'R', 'c']);
const METADATA = new Set(['process_name', 'process_labels', 'process_sort_index', 'thread_name', 'thread_sort_index']);

export interface TraceEventLike {
  name?: unknown;
  cat?: unknown;
  ph?: unknown;
  ts?: unknown;
  dur?: unknown;
  pid?: unknown;
  tid?: unknown;
  s?: unknown;
  id?: unknown;
  bp?: unknown;
  args?: unknown;
}

export function traceFormatErrors(doc: unknown): string[] {
  const errors: string[] = [];
  if (typeof doc !== 'object' || doc === null || !Array.isArray((doc as { traceEvents?: unknown }).traceEvents)) return ['no traceEvents array'];
  const d = doc as { traceEvents: TraceEventLike[]; displayTimeUnit?: unknown };
  if (d.displayTimeUnit !== undefined && d.displayTimeUnit !== 'ms' && d.displayTimeUnit !== 'ns')
    errors.push(`displayTimeUnit ${String(d.displayTimeUnit)}`);
  const flows = new Map<string, { s: number; f: number }>();
  const named = new Set<string>();
  const used = new Set<string>();
  d.traceEvents.forEach((e, i) => {
    const at = `event ${i} (${String(e.name)})`;
    if (typeof e.name !== 'string' || !e.name) errors.push(`${at}: name`);
    if (typeof e.ph !== 'string' || !PHASES.has(e.ph)) errors.push(`${at}: ph ${String(e.ph)}`);
    if (!Number.isInteger(e.pid) || !Number.isInteger(e.tid)) errors.push(`${at}: pid/tid must be integers`);
    if (typeof e.ts !== 'number' || !Number.isFinite(e.ts)) errors.push(`${at}: ts`);
    if (e.args !== undefined && (typeof e.args !== 'object' || e.args === null)) errors.push(`${at}: args`);
    switch (e.ph) {
      case 'X':
        if (typeof e.dur !== 'number' || !(e.dur >= 0)) errors.push(`${at}: X needs dur >= 0`);
        used.add(`${String(e.pid)}:${String(e.tid)}`);
        break;
      case 'i':
      case 'I':
        if (e.s !== undefined && !['t', 'p', 'g'].includes(e.s as string)) errors.push(`${at}: instant scope ${String(e.s)}`);
        used.add(`${String(e.pid)}:${String(e.tid)}`);
        break;
      case 's':
      case 't':
      case 'f': {
        if (typeof e.id !== 'string' && typeof e.id !== 'number') errors.push(`${at}: flow needs an id`);
        if (typeof e.cat !== 'string') errors.push(`${at}: flow needs a cat`);
        if (e.bp !== undefined && e.bp !== 'e') errors.push(`${at}: bp`);
        const f = flows.get(String(e.id)) ?? { s: 0, f: 0 };
        if (e.ph === 's') f.s++;
        if (e.ph === 'f') f.f++;
        flows.set(String(e.id), f);
        break;
      }
      case 'M': {
        if (!METADATA.has(e.name as string)) errors.push(`${at}: unknown metadata`);
        const args = e.args as Record<string, unknown> | undefined;
        if (e.name === 'process_name' || e.name === 'thread_name') {
          if (typeof args?.['name'] !== 'string') errors.push(`${at}: metadata needs args.name`);
          named.add(e.name === 'process_name' ? `${String(e.pid)}` : `${String(e.pid)}:${String(e.tid)}`);
        }
        break;
      }
    }
  });
  for (const [id, f] of flows) if (f.s !== 1 || f.f !== 1) errors.push(`flow ${id}: ${f.s} start(s), ${f.f} finish(es)`);
  // Every process and thread with events is named by metadata.
  for (const lane of used) {
    if (!named.has(lane.split(':')[0]!)) errors.push(`pid ${lane.split(':')[0]} has no process_name`);
    if (!named.has(lane)) errors.push(`thread ${lane} has no thread_name`);
  }
  return [...new Set(errors)];
}

/**
 * Spans ('X') of one track that overlap without nesting (one starts inside another and ends
 * after it), which Perfetto cannot draw as a stack: each as "pid:tid name@ts", at most `max`.
 */
export function misnestedSpans(doc: { traceEvents: TraceEventLike[] }, max = 10): string[] {
  const byTrack = new Map<string, Array<{ name: string; ts: number; end: number }>>();
  for (const e of doc.traceEvents) {
    if (e.ph !== 'X' || typeof e.ts !== 'number' || typeof e.dur !== 'number') continue;
    const key = `${String(e.pid)}:${String(e.tid)}`;
    const list = byTrack.get(key) ?? [];
    list.push({ name: String(e.name), ts: e.ts, end: e.ts + e.dur });
    byTrack.set(key, list);
  }
  const out: string[] = [];
  for (const [track, spans] of byTrack) {
    spans.sort((a, b) => a.ts - b.ts || b.end - a.end);
    const open: Array<{ name: string; end: number }> = [];
    for (const s of spans) {
      while (open.length && open[open.length - 1]!.end <= s.ts) open.pop();
      const parent = open[open.length - 1];
      if (parent && s.end > parent.end) out.push(`${track} ${s.name}@${s.ts} ends after ${parent.name}`);
      else open.push(s);
      if (out.length >= max) return out;
    }
  }
  return out;
}
