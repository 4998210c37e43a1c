// `pagefault-rdma odp-vs-pinned`: one RDMA WRITE per size and policy, as one table.
import { InvalidArgumentError, Option } from 'commander';
import { PAGE_SIZE, type PolicyName } from '../../lib/index.js';
import { odpVsPinned, odpVsPinnedPlot, TABLE_POLICIES, type OdpVsPinnedOptions } from '../programs/odp-vs-pinned.js';
import { allSizes, heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  size?: number;
  all: boolean;
  minSize: number;
  maxSize: number;
  iters: number;
  bigSize: number;
  evict: 'dst' | 'both';
  policies?: PolicyName[];
}

export default defineProgram<Options>({
  name: 'odp-vs-pinned',
  summary: 'one RDMA WRITE per size under pinning and each on-demand paging policy, as one table',
  plot: 'latency against size per policy (log-log), modelled and measured',
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'one size only', parseSize)
      .option('-a, --all', 'every power of two from 4K to --max-size (perftest -a)', false)
      .option('--min-size <bytes>', 'smallest write (sizes grow ×4; ×2 with -a)', parseSize, PAGE_SIZE)
      .option('--max-size <bytes>', 'largest write (64M for the whole range)', parseSize, 16 * 2 ** 20)
      .option('-n, --iters <n>', 'writes per size and policy below --big-size (median reported)', parsePositiveInt, 5)
      .option('--big-size <bytes>', 'from this size on, one write per policy', parseSize, 16 * 2 ** 20)
      .addOption(new Option('--evict <which>', 'buffers evicted before each write').choices(['dst', 'both']).default('dst'))
      .addOption(new Option('--policies <list>', 'comma-separated subset of ' + TABLE_POLICIES.join(',')).argParser(policyList));
    cmd.hook('preAction', (c) => {
      const o = c.opts() as Options;
      const sizes = [o.size ?? o.minSize, o.maxSize];
      if (sizes.some((s) => s % PAGE_SIZE) || o.maxSize < o.minSize)
        c.error(`error: sizes must be multiples of ${PAGE_SIZE} and --min-size no larger than --max-size`);
    });
  },
  async run(o, io) {
    const t = performance.now();
    heading('ODP vs pinned: one RDMA WRITE per size and policy');
    const opts: OdpVsPinnedOptions = { minSize: o.minSize, maxSize: o.maxSize, iters: o.iters, bigSize: o.bigSize, evict: o.evict, trace: io.trace };
    if (o.size !== undefined) opts.sizes = [o.size];
    else if (o.all) opts.sizes = allSizes(o.minSize, o.maxSize);
    if (o.policies) opts.policies = o.policies;
    const rows = await odpVsPinned(opts);
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
    return { results: rows, plot: odpVsPinnedPlot(rows) };
  },
});

/** --policies: a comma-separated list of TABLE_POLICIES, each once (commander's argument parser). */
export function policyList(value: string): PolicyName[] {
  const list = value.split(',').map((s) => s.trim()) as PolicyName[];
  for (const p of list)
    if (!TABLE_POLICIES.includes(p)) throw new InvalidArgumentError(`unknown policy '${p}' (choose from ${TABLE_POLICIES.join(', ')})`);
  if (new Set(list).size !== list.length) throw new InvalidArgumentError('a policy is listed twice');
  return list;
}
