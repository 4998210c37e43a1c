// `pagefault-rdma memory-server`: EDM's DMS role, a process that holds other processes' evicted
// pages (their pagers' `store: { server: { socket } }`) on a Unix socket or loopback TCP,
// until SIGINT or SIGTERM; it prints what it served when it stops.
import { InvalidArgumentError } from 'commander';
import { parseSize, print } from '../programs/support/format.js';
import { MemoryServer, type MemoryServerStats } from '../../lib/index.js';
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

export default defineProgram<Options>({
  name: 'memory-server',
  summary: "a memory server (EDM's DMS) for other processes' remote-paged memory, on a Unix socket or loopback TCP",
  description:
    "A memory server (EDM's DMS role): it holds the pages other processes' pagers evict (RemotePager with " +
    "store: { server: { socket } }, or remote-paging --store server) and gives them back on their faults. Each client's " +
    'pages live in a namespace of its own. Listens on a Unix socket (made 0600) or on a loopback TCP port, until SIGINT ' +
    'or SIGTERM; then prints what it served. Pages live in this process: a restarted server holds none (their pagers ' +
    'then fail those accesses with ERR_PFR_PAGE_LOST, never zeros).',
  engine: false,
  noTrace: 'the memory server serves pages, it takes no faults',
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
  async run(o) {
    const server = await MemoryServer.listen({ socket: o.socket, port: o.port, host: o.host, maxMemory: o.maxMemory });
    print(`memory server listening on ${server.address} (epoch ${server.epoch.toString('hex')}, at most ${o.maxMemory} bytes of pages)`);
    const signal = await new Promise<NodeJS.Signals>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    const stats = server.stats();
    await server.close();
    print(`memory server stopped (${signal}): ${statsLine(stats)}`);
    return { results: { address: server.address, signal, ...stats } };
  },
});
