// Remote paging: an application whose working set is larger than the memory it may keep.
// It writes every page of a region four times (say) its resident limit, then reads and
// updates random pages for a few passes, checking every byte against what it wrote. The
// DM-Handler fetches each missing page from the store while the application's thread waits,
// and the eviction worker keeps the resident pages between the watermarks. A live summary
// line shows faults, pages fetched, evicted, written back and resident.
import {
  PAGE_SIZE,
  RemotePager,
  type ChromeTraceEvent,
  type DmTraceEvent,
  type RemotePagingStats,
  type RemotePagerOptions,
} from '../../lib/index.js';
import { print, sizeName } from './support/format.js';
import { liveLine } from './support/progress.js';
import { startRedis, type RedisServer } from './support/redis-server.js';
import { startMemoryServer, type MemoryServerProcess } from './support/memory-server.js';
import type { TraceFile } from './support/trace-file.js';

export interface RemotePagingOptions {
  size: number;
  resident: number;
  store: 'embedded' | 'redis' | 'server';
  /** An existing server's Unix socket (store 'redis'); without it a redis-server is started and stopped here. */
  redisSocket?: string;
  /** An existing `pagefault-rdma memory-server`'s Unix socket (store 'server'); without it one is started and stopped here. */
  serverSocket?: string;
  prefetch: number;
  passes: number;
  /** Random page updates per pass. */
  updates: number;
  /** --trace: the DM-Handler's events (each fault, fetch and eviction) and the main thread's phases go here. */
  trace?: TraceFile | undefined;
}

const nowUs = (): number => (performance.timeOrigin + performance.now()) * 1000;

/** A DM-Handler track's name in the file. */
function trackName(track: string): string {
  const [kind, n] = track.split(' ');
  if (kind === 'fill') return `DM-Handler fetch ${Number(n) + 1}: a batch's store read, placement, wake`;
  if (kind === 'evict') return `DM-Handler eviction worker ${Number(n) + 1}: take out, write-back, drop`;
  return `DM-Handler ${track}`;
}

/**
 * The DM-Handler's events as one process of the trace file: a track per faulting thread (the
 * main JS thread's is the process id) with each fault as a span from its receipt to its
 * resolution, inside the main thread's phases; a track per DM-Handler worker (each fetch in
 * flight at once, each eviction worker, flush) with its batches and their steps; times from
 * `originUs`.
 */
function addTrace(trace: TraceFile, got: { events: DmTraceEvent[]; dropped: number }, phases: ChromeTraceEvent[], originUs: number): void {
  const pid = trace.nextPid();
  const meta = (name: string, tid: number, value: string): ChromeTraceEvent => ({
    name,
    cat: '__metadata',
    ph: 'M',
    ts: 0,
    pid,
    tid,
    args: { name: value },
  });
  // The DM-Handler's tracks (tid 0 and a track name in its events) get tids 1, 2, … in name order.
  const tracks = [...new Set(got.events.filter((e) => e.tid === 0).map((e) => e.track ?? 'worker'))].sort();
  const trackTid = new Map(tracks.map((t, i) => [t, i + 1]));
  const tids = new Set<number>([process.pid]);
  const events: ChromeTraceEvent[] = [];
  for (const e of got.events) {
    const tid = e.tid === 0 ? trackTid.get(e.track ?? 'worker')! : e.tid;
    if (e.tid !== 0) tids.add(e.tid);
    events.push({
      name: e.name === 'fault' ? `fault (${String(e.args['kind'])})` : e.name,
      cat: 'remote-paging',
      ph: 'X',
      ts: e.ts - originUs,
      dur: e.dur,
      pid,
      tid,
      args: e.args,
    });
  }
  trace.add(meta('process_name', 0, `remote-paging (process ${process.pid}): the DM-Handler's faults, fetches, evictions`));
  for (const [t, tid] of trackTid) trace.add(meta('thread_name', tid, trackName(t)));
  for (const t of tids) trace.add(meta('thread_name', t, t === process.pid ? 'main JS thread: its faults and phases' : `thread ${t}: its faults`));
  trace.add(...phases.map((p) => ({ ...p, pid, tid: process.pid, ts: p.ts - originUs })), ...events);
  trace.dropped += got.dropped;
}

function summary(s: RemotePagingStats): string {
  return (
    `faults ${s.faults} (major ${s.majorFaults}) | fetched ${s.pagesFetched} (+${s.prefetched} ahead) | evicted ${s.evicted}: ` +
    `written back ${s.writtenBack}, dropped clean ${s.droppedClean} | resident ${s.resident}`
  );
}

export async function remotePaging(o: RemotePagingOptions): Promise<Record<string, unknown>> {
  let redis: RedisServer | undefined;
  let server: MemoryServerProcess | undefined;
  let store: RemotePagerOptions['store'] = 'embedded';
  if (o.store === 'redis') {
    if (!o.redisSocket) redis = await startRedis();
    store = { redis: { socket: o.redisSocket ?? redis!.socket, prefix: `pfr-example-${process.pid}` } };
  } else if (o.store === 'server') {
    if (!o.serverSocket) server = await startMemoryServer();
    store = { server: { socket: o.serverSocket ?? server!.socket, prefix: `pfr-example-${process.pid}` } };
  }
  const pages = o.size / PAGE_SIZE;
  const originUs = nowUs();
  const phases: ChromeTraceEvent[] = [];
  // A phase of the main thread (writing, a pass, the check) as a span of its track.
  let phaseStart = originUs;
  const phase = (name: string): void => {
    const now = nowUs();
    phases.push({ name, cat: 'remote-paging', ph: 'X', ts: phaseStart, dur: now - phaseStart, pid: 0, tid: 0, args: summaryArgs() });
    phaseStart = now;
  };
  const pager = await RemotePager.create({
    size: o.size,
    residentLimit: o.resident,
    prefetch: o.prefetch,
    store,
    ...(o.trace ? { traceEvents: o.trace.limit } : {}),
  });
  const summaryArgs = (): Record<string, unknown> => ({ ...pager.stats() });
  const errors: string[] = [];
  pager.on('error', (e) => errors.push(`${e.code}: ${e.message}`));
  // Milestones are lines of the output; between them a live line (a terminal only) shows the counters.
  const show = (what: string): void => print(`${what.padEnd(10)} ${summary(pager.stats())}`);
  const live = liveLine();
  const timer = process.stderr.isTTY === true ? setInterval(() => live.update(`…          ${summary(pager.stats())}`), 200) : undefined;
  try {
    print(
      `A ${sizeName(o.size)} region (${pages} pages) that may keep ${sizeName(o.resident)} resident; store: ${o.store}` +
        `${o.store === 'redis' ? (o.redisSocket ? ` at ${o.redisSocket}` : ' (a redis-server started for this run)') : ''}` +
        `${o.store === 'server' ? (o.serverSocket ? ` at ${o.serverSocket}` : ' (a pagefault-rdma memory-server started for this run)') : ''}; ` +
        `dirty tracking: ${pager.tracking}; prefetch ${o.prefetch} pages. Every access below is the main JS thread's own.`,
    );
    const mem = new Uint8Array(pager.region.buffer);
    const shadow = new Uint8Array(pages); // the byte each page was last given
    const t0 = performance.now();
    // Work in slices so the summary line (a timer on this thread) gets its turn.
    const slices = async (n: number, body: (i: number) => void): Promise<void> => {
      for (let i = 0; i < n; i++) {
        body(i);
        if (i % 512 === 511) await new Promise((r) => setImmediate(r));
      }
    };
    await slices(pages, (i) => {
      shadow[i] = (i * 7 + 1) & 0xff;
      mem.fill(shadow[i]!, i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
    });
    show('written');
    phase('write every page');
    let seed = 7;
    const rand = (n: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
    let bad = 0;
    for (let pass = 1; pass <= o.passes; pass++) {
      await slices(o.updates, () => {
        const i = rand(pages);
        if (mem[i * PAGE_SIZE + rand(PAGE_SIZE)] !== shadow[i]) bad++;
        shadow[i] = (shadow[i]! + 1) & 0xff;
        mem.fill(shadow[i]!, i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
      });
      show(`pass ${pass}`);
      phase(`pass ${pass}: ${o.updates} random updates`);
    }
    await slices(pages, (i) => {
      if (mem[i * PAGE_SIZE] !== shadow[i] || mem[(i + 1) * PAGE_SIZE - 1] !== shadow[i]) bad++;
    });
    phase('check every page');
    if (timer) clearInterval(timer);
    live.stop();
    if (o.trace) addTrace(o.trace, await pager.trace(), phases, originUs);
    const seconds = (performance.now() - t0) / 1000;
    const stats = pager.stats();
    const latency = await pager.latency();
    print(`verified   ${summary(stats)}`);
    print(
      `Every page checked: ${bad === 0 ? 'all bytes are what the application wrote' : `${bad} pages WRONG`}. ` +
        `${seconds.toFixed(2)} s; major fault median ${latency.major.p50Us.toFixed(1)} µs, p99 ${latency.major.p99Us.toFixed(1)} µs ` +
        `(receipt to resolution, in the DM-Handler's thread).`,
    );
    for (const e of errors) print(`error: ${e}`);
    return {
      size: o.size,
      resident: o.resident,
      store: o.store,
      tracking: pager.tracking,
      prefetch: o.prefetch,
      passes: o.passes,
      badPages: bad,
      seconds,
      stats,
      latency,
      errors,
    };
  } finally {
    if (timer) clearInterval(timer);
    live.stop();
    await pager.close();
    await redis?.dispose();
    await server?.dispose();
  }
}
