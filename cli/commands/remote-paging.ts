// `pagefault-rdma remote-paging` (npm run example:remote-paging): an application whose
// working set exceeds its resident limit, served by EDM's DM-Handler from a page store.
import { Option } from 'commander';
import { remotePaging } from '../programs/remote-paging.js';
import { heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { PAGE_SIZE } from '../../lib/index.js';
import { defineProgram } from '../program.js';

interface Options {
  size: number;
  resident: number;
  store: 'embedded' | 'redis' | 'server';
  redisSocket?: string;
  serverSocket?: string;
  prefetch: number;
  passes: number;
  updates: number;
}

export default defineProgram<Options>({
  name: 'remote-paging',
  summary: "remote paging: a working set 4× the resident limit, served from a page store by EDM's DM-Handler",
  description:
    "Remote paging (EDM's DM-Handler on userfaultfd): the main JS thread writes a region larger than it may keep " +
    'resident, then reads and updates random pages, checking every byte. Pages leave for the store (embedded, a ' +
    'Redis server, or a pagefault-rdma memory-server) and come back on demand; a live summary line shows faults, fetches, ' +
    'evictions, write-backs.',
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'size of the region', parseSize, 64 * 2 ** 20)
      .option('--resident <bytes>', 'resident limit', parseSize, 16 * 2 ** 20)
      .addOption(new Option('--store <kind>', 'page store').choices(['embedded', 'redis', 'server']).default('embedded'))
      .option('--redis-socket <path>', "an existing Redis server's Unix socket (else --store redis starts one)")
      .option('--server-socket <path>', "an existing memory server's Unix socket (else --store server starts one)")
      .option('--prefetch <pages>', 'largest adaptive prefetch window, in pages (0: none)', (v) => (v === '0' ? 0 : parsePositiveInt(v)), 0)
      .option('--passes <n>', 'passes of random updates', parsePositiveInt, 2)
      .option('--updates <n>', 'random page updates per pass', parsePositiveInt, 4096);
    cmd.hook('preAction', (c) => {
      const o = c.opts() as Options;
      if (o.size % PAGE_SIZE || o.resident % PAGE_SIZE) c.error(`error: --size and --resident must be multiples of ${PAGE_SIZE}`);
      if (o.resident > o.size) c.error('error: --resident must not be larger than --size');
      if (o.serverSocket !== undefined && o.store !== 'server') c.error('error: --server-socket needs --store server');
    });
  },
  async run(o, io) {
    heading('Remote paging: a working set larger than memory, served from a page store');
    const { size, resident, store, redisSocket, serverSocket, prefetch, passes, updates } = o;
    return { results: await remotePaging({ size, resident, store, redisSocket, serverSocket, prefetch, passes, updates, trace: io.trace }) };
  },
});
