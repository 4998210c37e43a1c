// `pagefault-rdma bench-engine` (npm run bench:engine): the engine's data path against the
// machine without it, (a)–(g) of issue 9 and (h) of issue 38 side by side.
import { InvalidArgumentError, Option } from 'commander';
import { benchEngine, ENGINE_CASES, type BenchEngineOptions, type EngineCase } from '../../bench/engine.js';
import { heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { BENCH_NO_TRACE, defineProgram } from '../program.js';

type Options = Omit<BenchEngineOptions, 'json'>;

function list<T>(parse: (v: string) => T): (value: string) => T[] {
  return (value) => value.split(',').map((v) => parse(v.trim()));
}

function engineCase(v: string): EngineCase {
  if (!(ENGINE_CASES as readonly string[]).includes(v)) throw new InvalidArgumentError(`"${v}" is not one of ${ENGINE_CASES.join(',')}`);
  return v as EngineCase;
}

export default defineProgram<Options>({
  name: 'bench-engine',
  summary: 'benchmark: the engine data path (writes, rates, ping-pong, faults, all-to-all, idle) against memcpy and MessageChannel',
  description:
    'The data path of the engine measured side by side with what the machine does without it: (a) big resident ' +
    'RDMA_WRITEs vs memcpy, (b) small-write rate vs a MessageChannel, (c) SEND ping-pong vs a MessageChannel ping-pong, ' +
    '(d) a one-page write into an evicted page real vs modelled, (e) µs per faulting page small vs large, (f) all-to-all ' +
    'per-transfer time few vs many nodes, (g) idle wake-ups and the heap after faulting in 1 GiB, (h) heap bytes per 64 B ' +
    'write. Writes its JSON to --json FILE, else to bench-engine.json in the working directory (a temporary folder inside ' +
    'the installed package).',
  noTrace: BENCH_NO_TRACE,
  options(cmd) {
    cmd
      .option('--rounds <n>', 'measured rounds per case (after one warm-up round)', parsePositiveInt, 3)
      .addOption(new Option('--cases <list>', 'which of a,b,c,d,e,f,g,h to run').argParser(list(engineCase)).default([...ENGINE_CASES], 'all'))
      .addOption(
        new Option('--write-sizes <list>', '(a) write sizes')
          .argParser(list(parseSize))
          .default([2 ** 20, 16 * 2 ** 20, 64 * 2 ** 20, 256 * 2 ** 20], '1M,16M,64M,256M'),
      )
      .addOption(
        new Option('--fault-sizes <list>', '(e) sizes, small then large').argParser(list(parseSize)).default([2 ** 20, 256 * 2 ** 20], '1M,256M'),
      )
      .addOption(new Option('--nodes <list>', '(f) node counts, few then many').argParser(list(parsePositiveInt)).default([2, 16], '2,16'))
      .option('--idle-seconds <n>', '(g) seconds of idleness measured', parsePositiveInt, 10)
      .option('--heap-bytes <bytes>', '(g) bytes faulted in for the heap figure', parseSize, 2 ** 30);
  },
  async run(o) {
    heading('Benchmark: the engine data path at machine speed');
    const { rounds, cases, writeSizes, faultSizes, nodes, idleSeconds, heapBytes } = o;
    const opts: BenchEngineOptions = { rounds, cases, writeSizes, faultSizes, nodes, idleSeconds, heapBytes };
    // With --json the CLI writes the document there; without, the benchmark writes its default file.
    if (o.json) opts.json = false;
    return { results: await benchEngine(opts) };
  },
});
