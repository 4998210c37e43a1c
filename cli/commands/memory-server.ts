// `pagefault-rdma memory-server`: EDM's DMS role, a process that holds other processes' evicted
// pages (their pagers' `store: { server: { socket } }`) on a Unix socket or loopback TCP,
// until SIGINT or SIGTERM; it prints what it served when it stops.
import { InvalidArgumentError } from 'commander';
import { parseSize, print } from '../programs/support/format.js';
import { MemoryServer, type ChromeTraceEvent, type MemoryServerStats, type MemoryServerTraceEvent } from '../../lib/index.js';
import type { TraceFile } from '../programs/support/trace-file.js';
import { defineProgram } from '../program.js';

interface Options {
  socket?: string;
  port?: number;
  host: string;
  maxMemory: number;
}

function parsePort(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError('expected a port in 0..65535');
  return n;
}

/** The stats as one line of `name value` pairs, and the refusals by reason. */
export function statsLine(s: MemoryServerStats): string {
  const reasons = Object.entries(s.refusedBy)
    .map(([r, n]) => `${r}: ${n}`)
    .join(', ');
  return (
    `connections ${s.connections} | gets ${s.gets} (pages ${s.pagesRead}, absent ${s.absent}) | puts ${s.puts} (pages ${s.pagesWritten}, ` +
    `full ${s.full}) | dels ${s.dels} (pages ${s.pagesDeleted}) | held ${s.pages} pages, ${s.bytes} B in ${s.namespaces} namespaces | ` +
    `refused ${s.refused}${reasons ? ` (${reasons})` : ''}`
  );
}

const TRACK_NAMES: Record<string, string> = { get: 'fetch', put: 'write-back', del: 'delete' };

/**
 * The server's events as one process of the trace file: the server's own track (its counter of
 * pages held, refusals before a connection is known), then a track per connection, named by the
 * namespace its hello claimed, with each batch it served (fetches, write-backs, deletes) as a
 * span; times from `originUs`.
 */
export function addServerTrace(trace: TraceFile, got: { events: MemoryServerTraceEvent[]; dropped: number }, originUs: number, label: string): void {
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
  const namespaces = new Map<number, string>();
  for (const e of got.events) if (e.name === 'hello') namespaces.set(e.conn, String(e.args['namespace']));
  const tracks = new Set<number>([0]);
  const events: ChromeTraceEvent[] = got.events.map((e) => {
    tracks.add(e.conn);
    const pages = e.args['pages'];
    const name = TRACK_NAMES[e.name] ? `${TRACK_NAMES[e.name]} (${String(pages)} pages)` : e.name;
    const ev: ChromeTraceEvent = { name, cat: 'memory-server', ph: e.ph, ts: e.ts - originUs, pid, tid: e.conn, args: { ...e.args } };
    if (e.ph === 'X') ev.dur = e.dur ?? 0;
    if (e.ph === 'i') ev.s = 't';
    return ev;
  });
  trace.add(meta('process_name', 0, `${label} (process ${process.pid}): batches served, per connection`));
  for (const t of tracks)
    trace.add(meta('thread_name', t, t === 0 ? 'the server: pages held' : `connection ${t}${namespaces.has(t) ? `: ${namespaces.get(t)!}` : ''}`));
  trace.add(...events);
  trace.dropped += got.dropped;
}

export default defineProgram<Options>({
  name: 'memory-server',
  summary: "a memory server (EDM's DMS) for other processes' remote-paged memory, on a Unix socket or loopback TCP",
  description:
    "A memory server (EDM's DMS role): it holds the pages other processes' pagers evict (RemotePager with " +
    "store: { server: { socket } }, or remote-paging --store server) and gives them back on their faults. Each client's " +
    'pages live in a namespace of its own. Listens on a Unix socket (made 0600) or on a loopback TCP port, until SIGINT ' +
    'or SIGTERM; then prints what it served. Pages live in this process: a restarted server holds none (their pagers ' +
    'then fail those accesses with ERR_PFR_PAGE_LOST, never zeros). --trace FILE: every batch it served (fetches, ' +
    'write-backs, deletes), hellos and refusals, a track per connection, and the pages it held; written when it stops.',
  engine: false,
  options(cmd) {
    cmd
      .option('--socket <path>', 'listen on this Unix socket')
      .option('--port <n>', 'listen on this TCP port of the loopback interface (0: any free port, printed)', parsePort)
      .option('--host <addr>', 'the loopback address for --port: 127.0.0.1, ::1 or localhost', '127.0.0.1')
      .option('--max-memory <bytes>', 'bytes of pages it may hold (a PUT past it is refused: ERR_PFR_STORE_FULL)', parseSize, 2 ** 30);
    cmd.hook('preAction', (c) => {
      const o = c.opts() as Options;
      if ((o.socket === undefined) === (o.port === undefined)) c.error('error: give --socket PATH or --port N (one of them)');
    });
  },
  async run(o, io) {
    const originUs = (performance.timeOrigin + performance.now()) * 1000;
    const server = await MemoryServer.listen({
      socket: o.socket,
      port: o.port,
      host: o.host,
      maxMemory: o.maxMemory,
      ...(io.trace ? { traceEvents: io.trace.limit } : {}),
    });
    print(`memory server listening on ${server.address} (epoch ${server.epoch.toString('hex')}, at most ${o.maxMemory} bytes of pages)`);
    const signal = await new Promise<NodeJS.Signals>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    const stats = server.stats();
    await server.close();
    if (io.trace) addServerTrace(io.trace, server.trace(), originUs, 'memory-server');
    print(`memory server stopped (${signal}): ${statsLine(stats)}`);
    return { results: { address: server.address, signal, ...stats } };
  },
});
