// Benchmark: the genuine userfaultfd fault round trip through the TypeScript handler,
// measured side by side with a C handler doing the same work (bench/c/uffd-handler.c).
//
// For each touch-ahead size (pages resolved per fault) and each round, a thread that is
// not the handler's reads one byte of every page of a fresh 64 MiB region; each missing
// page faults, the handler answers with one UFFDIO_COPY of the aligned group of pages, and
// the faulting thread records how long each page took. Rounds of the handlers alternate
// so that drift of the machine hits all of them alike.
//
// A sample is one fault: the time the faulting thread spent on the fault's group of pages
// divided by the pages in the group (µs per 4 KiB page).
//
// Every configuration runs under two thread placements, because on a VM whose idle vCPUs
// halt at once, waking a thread on the other vCPU costs more than the rest of a fault:
// 'free' (the scheduler places the threads on any CPU) and one CPU (every thread of the
// benchmark, and of the C handler it starts, on the same CPU).
//
// It is a script that prints real measurements, never a test.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, InvalidArgumentError, Option } from 'commander';
import { mapRegion, PAGE_SIZE, touch, Userfaultfd } from '../lib/index.js';

/** Byte both handlers place in every page: the faulting thread's checksum proves where pages came from. */
const FILL = 0xa7;

/** Issue targets: TS median at most this many times the C handler's. */
const TARGETS: ReadonlyMap<number, number> = new Map([
  [1, 1.5],
  [256, 1.2],
]);

type HandlerName = 'c' | 'c-relay' | 'ts' | 'ts-thread';

const HANDLER_LABEL: Record<HandlerName, string> = {
  c: 'C handler thread (poll+read, UFFDIO_COPY)',
  'c-relay': 'C reader -> eventfd -> resolver thread',
  ts: "TypeScript (lib, delivery 'event-loop': JS thread polls the uffd)",
  'ts-thread': "TypeScript (lib, delivery 'thread': reader thread -> JS)",
};

const HANDLER_SHORT: Record<HandlerName, string> = { c: 'C', 'c-relay': 'C relay', ts: 'TS', 'ts-thread': 'TS thread' };

/** Where the threads may run: anywhere the process may ('free'), or all on one CPU. */
interface Placement {
  name: string;
  cpu: number | null;
}

/** One round of one handler: what the faulting thread saw, plus handler-side times when traced. */
interface Round {
  pageNs: ArrayLike<number>;
  totalNs: number;
  trace?: Trace;
}

/** Per-fault stage times in ns, one entry per fault after the first (see BREAKDOWN_STAGES). */
interface Trace {
  gapNs: number[];
  serviceNs: number[];
  resumeNs?: number[];
  faultToReadNs?: number[];
  hopNs?: number[];
}

const BREAKDOWN_STAGES: [keyof Trace, string][] = [
  ['resumeNs', 'copy done -> faulting thread runs again'],
  ['faultToReadNs', 'next page faults -> read() on the uffd returns'],
  ['hopNs', 'read() returned -> resolving thread picks it up'],
  ['gapNs', '= previous copy done -> handler starts this fault'],
  ['serviceNs', 'handler start -> UFFDIO_COPY returned'],
];

interface Summary {
  samples: number;
  medianUs: number;
  p99Us: number;
  /** Median over rounds of (round wall time / pages). */
  roundMedianUs: number;
  roundsUs: number[];
}

interface Options {
  pages: number;
  rounds: number;
  pagesPerFault: number[];
  placements: Placement[];
  relay: boolean;
  breakdown: boolean;
  out: string;
}

function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError('must be a positive integer');
  return n;
}

function intList(value: string): number[] {
  return value.split(',').map((v) => positiveInt(v.trim()));
}

function placementList(value: string): Placement[] {
  return value.split(',').map((v) => {
    const name = v.trim();
    if (name === 'free') return { name, cpu: null };
    const cpu = Number(name);
    if (!Number.isInteger(cpu) || cpu < 0 || cpu >= os.cpus().length) {
      throw new InvalidArgumentError(`"${name}" is neither "free" nor a CPU number (0..${os.cpus().length - 1})`);
    }
    return { name: `cpu ${cpu}`, cpu };
  });
}

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || !existsSync(join(dir, 'bench', 'c'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('bench/faults: cannot find the package root (package.json beside bench/c)');
    dir = up;
  }
  return dir;
}

/** Builds the C handler with the system compiler; returns the binary's path. */
function compileHandler(root: string): string {
  const source = join(root, 'bench', 'c', 'uffd-handler.c');
  const outDir = join(root, 'bench', '.build');
  const binary = join(outDir, 'uffd-handler');
  mkdirSync(outDir, { recursive: true });
  const cc = spawnSync('cc', ['-O2', '-pthread', '-Wall', '-Wextra', '-o', binary, source], { encoding: 'utf8' });
  if (cc.error && (cc.error as NodeJS.ErrnoException).code === 'ENOENT') {
    throw new Error('bench/faults: no C compiler: "cc" is not on PATH. Install one (Debian/Ubuntu: apt-get install build-essential) and run again');
  }
  if (cc.error) throw new Error(`bench/faults: running cc failed: ${cc.error.message}`);
  if (cc.status !== 0) throw new Error(`bench/faults: cc could not compile ${relative(root, source)}:\n${cc.stderr}`);
  return binary;
}

function allowedCpus(): string {
  return /^Cpus_allowed_list:\s*(.*)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '';
}

/**
 * Sets the CPU affinity of every thread of this process. Threads created later (the
 * uffd reader, the toucher) inherit it from the JS thread, and so do the C handler's
 * processes.
 */
function setAffinity(cpus: string): void {
  try {
    execFileSync('taskset', ['--all-tasks', '--pid', '--cpu-list', cpus, String(process.pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    if (e.code === 'ENOENT') throw new Error('bench/faults: "taskset" is not on PATH (Debian/Ubuntu: util-linux); run with --placements free', { cause: err });
    throw new Error(`bench/faults: taskset could not set the CPU affinity to ${cpus}: ${e.stderr?.toString().trim() ?? e.message}`, { cause: err });
  }
}

interface COutput {
  pages: number;
  pagesPerFault: number;
  cpusAllowed: number;
  faults: number;
  totalNs: number;
  faulterStartNs: number;
  pageNs: number[];
  faultReadNs: number[];
  faultHandledNs: number[];
  faultCopiedNs: number[];
}

function runC(binary: string, pages: number, perFault: number, mode: 'direct' | 'relay', placement: Placement): Round {
  const r = spawnSync(binary, [String(pages), String(perFault), mode], { encoding: 'utf8', maxBuffer: 256 << 20, timeout: 300_000 });
  if (r.error) throw new Error(`bench/faults: running the C handler failed: ${r.error.message}`);
  if (r.status !== 0) {
    throw new Error(`bench/faults: the C handler (${mode}, ${perFault} pages/fault) exited with ${r.status ?? r.signal}: ${r.stderr.trim()}`);
  }
  const out = JSON.parse(r.stdout) as COutput;
  if (placement.cpu !== null && out.cpusAllowed !== 1) {
    throw new Error(`bench/faults: the C handler may run on ${out.cpusAllowed} CPUs, not only on ${placement.name}`);
  }
  return { pageNs: out.pageNs, totalNs: out.totalNs, trace: cTrace(out) };
}

/** The faulter's absolute times, rebuilt from its start and per-page times, against the handler's stamps. */
function cTrace(out: COutput): Trace {
  const pageEnd = new Float64Array(out.pages);
  let t = out.faulterStartNs;
  for (let i = 0; i < out.pages; i++) pageEnd[i] = t += out.pageNs[i]!;
  const trace: Required<Trace> = { gapNs: [], serviceNs: [], resumeNs: [], faultToReadNs: [], hopNs: [] };
  for (let g = 1; g < out.faults; g++) {
    const prevCopied = out.faultCopiedNs[g - 1]!;
    // Woken, the faulter stamps the previous group's first page, walks the resident rest
    // of that group, and faults on this group's first page right after its last stamp.
    const resumed = pageEnd[(g - 1) * out.pagesPerFault]!;
    const faulted = pageEnd[g * out.pagesPerFault - 1]!;
    trace.resumeNs.push(resumed - prevCopied);
    trace.faultToReadNs.push(out.faultReadNs[g]! - faulted);
    trace.hopNs.push(out.faultHandledNs[g]! - out.faultReadNs[g]!);
    trace.gapNs.push(out.faultHandledNs[g]! - prevCopied);
    trace.serviceNs.push(out.faultCopiedNs[g]! - out.faultHandledNs[g]!);
  }
  return trace;
}

async function runTs(pages: number, perFault: number, source: Buffer, trace: boolean, delivery: 'event-loop' | 'thread'): Promise<Round> {
  const region = mapRegion(pages * PAGE_SIZE);
  const uffd = Userfaultfd.open({ delivery });
  const errors: Error[] = [];
  uffd.on('error', (err: Error) => errors.push(err));
  try {
    uffd.register(region);
    const group = perFault * PAGE_SIZE;
    // copy() places the whole buffer it is given: one view per group size, made up front.
    const full = source.subarray(0, group);
    const tail = source.subarray(0, region.size % group || group);
    const lastGroup = region.size - (region.size % group || group);
    const received: number[] = [];
    const copied: number[] = [];
    if (trace) {
      uffd.onFault((f) => {
        const start = f.offset - (f.offset % group);
        uffd.copy(f.region, start, start === lastGroup ? tail : full);
        copied.push(performance.now());
        received.push(f.receivedAt);
      });
    } else {
      // The measured handler: exactly the work the C handler does.
      uffd.onFault((f) => {
        const start = f.offset - (f.offset % group);
        uffd.copy(f.region, start, start === lastGroup ? tail : full);
      });
    }
    const r = await touch(region, { probe: true, timings: true });
    const stats = uffd.stats();
    const expected = Math.ceil(pages / perFault);
    if (errors.length) throw new Error(`bench/faults: the TypeScript handler failed: ${errors[0]!.message}`, { cause: errors[0] });
    if (r.checksum !== pages * FILL || stats.forwarded !== expected || stats.handled !== expected || !r.pageNs) {
      throw new Error(
        `bench/faults: wrong TypeScript outcome: checksum ${r.checksum} (want ${pages * FILL}), ` +
          `${stats.forwarded} faults forwarded and ${stats.handled} handled (want ${expected})`,
      );
    }
    const round: Round = { pageNs: r.pageNs, totalNs: r.ns };
    if (trace) {
      // receivedAt (the JS thread entering the reader's callback) and the stamps after
      // copy are both performance.now(): only differences are used.
      const gapNs: number[] = [];
      const serviceNs: number[] = [];
      for (let g = 1; g < received.length; g++) {
        gapNs.push((received[g]! - copied[g - 1]!) * 1e6);
        serviceNs.push((copied[g]! - received[g]!) * 1e6);
      }
      round.trace = { gapNs, serviceNs };
    }
    return round;
  } finally {
    uffd.close();
    region.close();
  }
}

/** Per-fault samples of one round: µs per page of each fault's group. */
function faultSamples(pageNs: ArrayLike<number>, perFault: number): number[] {
  const out: number[] = [];
  for (let first = 0; first < pageNs.length; first += perFault) {
    const last = Math.min(first + perFault, pageNs.length);
    let ns = 0;
    for (let i = first; i < last; i++) ns += pageNs[i]!;
    out.push(ns / (last - first) / 1e3);
  }
  return out;
}

/** Nearest-rank quantile of an ascending array. */
function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

const median = (values: readonly number[]): number => quantile([...values].sort((a, b) => a - b), 0.5);

function summarize(rounds: readonly Round[], perFault: number): Summary {
  const samples = rounds.flatMap((r) => faultSamples(r.pageNs, perFault)).sort((a, b) => a - b);
  const roundsUs = rounds.map((r) => r.totalNs / r.pageNs.length / 1e3);
  return { samples: samples.length, medianUs: quantile(samples, 0.5), p99Us: quantile(samples, 0.99), roundMedianUs: median(roundsUs), roundsUs };
}

/** Median µs per fault of each recorded stage, over all traced rounds. */
function summarizeTrace(rounds: readonly Round[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [stage] of BREAKDOWN_STAGES) {
    const all = rounds.flatMap((r) => r.trace?.[stage] ?? []);
    if (all.length) out[stage.replace(/Ns$/, 'Us')] = median(all) / 1e3;
  }
  return out;
}

function git(root: string, ...args: string[]): string {
  return spawnSync('git', ['-C', root, ...args], { encoding: 'utf8' }).stdout?.trim() ?? '';
}

function machineInfo(root: string): Record<string, unknown> {
  const cpus = os.cpus();
  return {
    cpus: cpus.length,
    cpuModel: cpus[0]?.model ?? 'unknown',
    cpuAffinity: allowedCpus() || 'unknown',
    kernel: os.release(),
    node: process.version,
    cc: spawnSync('cc', ['--version'], { encoding: 'utf8' }).stdout?.split('\n')[0] ?? 'unknown',
    // The library under test: the commit and whether its sources differ from it.
    commit: git(root, 'rev-parse', '--short', 'HEAD') || 'unknown',
    libraryModified: git(root, 'status', '--porcelain', '--', 'native', 'lib') !== '',
    date: new Date().toISOString(),
  };
}

const f2 = (n: number | undefined): string => (n !== undefined && Number.isFinite(n) ? n.toFixed(2) : '-');

function printTable(header: string[], rows: string[][], textColumns = 2): void {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]): string =>
    cells.map((c, i) => (i < textColumns ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ').trimEnd();
  console.log(line(header));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  let group = rows[0]?.[0];
  for (const row of rows) {
    if (row[0] !== group) {
      console.log('');
      group = row[0];
    }
    console.log(line(row));
  }
}

type RunFn = (h: HandlerName, perFault: number, trace?: boolean) => Promise<Round> | Round;

/** Measured rounds of every handler at every touch-ahead size under the current placement. */
async function measure(opts: Options, handlers: readonly HandlerName[], run: RunFn, placement: Placement): Promise<unknown[]> {
  const results: unknown[] = [];
  const rows: string[][] = [];
  for (const perFault of opts.pagesPerFault) {
    const rounds = new Map<HandlerName, Round[]>(handlers.map((h) => [h, []]));
    for (const h of handlers) await run(h, perFault); // warm-up: JIT, allocator, page cache
    for (let r = 0; r < opts.rounds; r++) {
      // Rotate who goes first so no handler always follows the same one.
      for (let i = 0; i < handlers.length; i++) {
        const h = handlers[(i + r) % handlers.length]!;
        rounds.get(h)!.push(await run(h, perFault));
      }
    }
    const summary = Object.fromEntries(handlers.map((h) => [h, summarize(rounds.get(h)!, perFault)])) as Record<HandlerName, Summary>;
    const ratio = summary.ts.medianUs / summary.c.medianUs;
    const target = TARGETS.get(perFault);
    const met = target === undefined ? undefined : ratio <= target;
    for (const h of handlers) {
      const s = summary[h];
      const isTs = h === 'ts';
      const threadRatio = h === 'ts-thread' ? `${(s.medianUs / summary.c.medianUs).toFixed(2)}x` : '';
      rows.push([
        String(perFault),
        HANDLER_LABEL[h],
        f2(s.medianUs),
        f2(s.p99Us),
        f2(s.roundMedianUs),
        isTs ? `${ratio.toFixed(2)}x` : threadRatio,
        isTs && target !== undefined ? `<= ${target}x ${met ? 'met' : 'MISSED'}` : '',
      ]);
    }
    results.push({
      placement: placement.name,
      pagesPerFault: perFault,
      faultsPerRound: Math.ceil(opts.pages / perFault),
      handlers: summary,
      ratioTsToC: { median: ratio, p99: summary.ts.p99Us / summary.c.p99Us, roundMedian: summary.ts.roundMedianUs / summary.c.roundMedianUs },
      target: target ?? null,
      targetMet: met ?? null,
    });
  }
  console.log(`\nPlacement: ${placement.cpu === null ? `free (the scheduler picks among CPUs ${allowedCpus()})` : `every thread on ${placement.name}`}`);
  printTable(['pages/fault', 'handler', 'median', 'p99', 'round median', 'TS/C median', 'target'], rows);
  return results;
}

/** Instrumented rounds (the TS handler stamps each copy): where the time of one fault goes. */
async function breakdown(opts: Options, handlers: readonly HandlerName[], run: RunFn, placement: Placement): Promise<unknown> {
  const rounds = Math.max(3, Math.ceil(opts.rounds / 2));
  const result: Record<string, Record<string, Record<string, number>>> = {};
  const rows: string[][] = [];
  for (const perFault of opts.pagesPerFault) {
    const per: Record<string, Record<string, number>> = {};
    for (const h of handlers) {
      const traced: Round[] = [];
      for (let r = 0; r < rounds; r++) traced.push(await run(h, perFault, true));
      per[h] = summarizeTrace(traced);
    }
    result[String(perFault)] = per;
    for (const [stage, label] of BREAKDOWN_STAGES) {
      const key = stage.replace(/Ns$/, 'Us');
      rows.push([String(perFault), label, ...handlers.map((h) => f2(per[h]![key]))]);
    }
  }
  console.log(`\nBreakdown, placement ${placement.name} (${rounds} instrumented rounds per handler; median µs per fault, not per page)`);
  printTable(['pages/fault', 'stage', ...handlers.map((h) => HANDLER_SHORT[h])], rows);
  return result;
}

async function main(): Promise<void> {
  const opts = new Command('bench:faults')
    .description('userfaultfd fault round trip: TypeScript handler vs C handler, side by side')
    .option('--pages <n>', 'pages per round (4 KiB each)', positiveInt, 16384)
    .option('--rounds <n>', 'measured rounds per handler and touch-ahead size (after one warm-up round)', positiveInt, 7)
    .addOption(new Option('--pages-per-fault <list>', 'touch-ahead sizes, comma-separated').argParser(intList).default([1, 16, 256], '1,16,256'))
    .addOption(
      new Option('--placements <list>', '"free" and/or CPU numbers (every thread on that CPU), comma-separated')
        .argParser(placementList)
        .default(placementList('free,0'), 'free,0'),
    )
    .option('--no-relay', 'skip the C reference that crosses the same thread hop as the library')
    .option('--breakdown', 'also run instrumented rounds and print where the time of one fault goes', false)
    .option('--out <file>', 'where to write the JSON results', 'bench/results/faults.json')
    .parse()
    .opts<Options>();

  const root = packageRoot();
  const binary = compileHandler(root);
  const machine = machineInfo(root);
  const handlers: HandlerName[] = opts.relay ? ['c', 'c-relay', 'ts', 'ts-thread'] : ['c', 'ts', 'ts-thread'];
  const source = Buffer.alloc(Math.max(...opts.pagesPerFault) * PAGE_SIZE, FILL);
  const original = allowedCpus();

  console.log('userfaultfd fault round trip, TypeScript handler vs C handler: real measurements on this machine, now');
  console.log(
    `${machine.cpus} x ${machine.cpuModel}, Linux ${machine.kernel}, Node ${machine.node}, library ${machine.commit}` +
      `${machine.libraryModified ? ' + uncommitted changes' : ''}; ${opts.pages} pages (${(opts.pages * PAGE_SIZE) / 2 ** 20} MiB) ` +
      `per round, ${opts.rounds} rounds per handler after a warm-up round, interleaved.`,
  );
  console.log(
    "A sample = one fault: time the faulting thread spent on the fault's group of pages / pages in the group, in µs per 4 KiB page.\n" +
      'median, p99: over all faults of all rounds; round median: median over rounds of (round wall time / pages).',
  );

  const results: unknown[] = [];
  const breakdowns: Record<string, unknown> = {};
  try {
    for (const placement of opts.placements) {
      setAffinity(placement.cpu === null ? original : String(placement.cpu));
      const run: RunFn = (h, perFault, trace = false) =>
        h === 'ts' || h === 'ts-thread'
          ? runTs(opts.pages, perFault, source, trace, h === 'ts' ? 'event-loop' : 'thread')
          : runC(binary, opts.pages, perFault, h === 'c' ? 'direct' : 'relay', placement);
      results.push(...(await measure(opts, handlers, run, placement)));
      if (opts.breakdown) breakdowns[placement.name] = await breakdown(opts, handlers, run, placement);
    }
  } finally {
    setAffinity(original);
  }
  if (opts.breakdown) {
    console.log(
      '\nTS handler start = Fault.receivedAt (the JS thread enters the reader thread\'s callback); "-": not visible from TypeScript.\n' +
        'Stages are stamps of different threads: when the woken faulter runs before the waker\'s UFFDIO_COPY returns (same CPU,\n' +
        'wake-up preemption), "runs again" is negative and "handler start -> UFFDIO_COPY returned" includes the faulter\'s run.',
    );
  }

  const out = resolve(root, opts.out);
  mkdirSync(dirname(out), { recursive: true });
  const doc = {
    benchmark: 'userfaultfd fault round trip, TypeScript handler vs C handler',
    measured: 'per fault: ns the faulting thread spent on the group of pages one fault resolved / pages per fault, in µs per 4 KiB page',
    machine,
    options: {
      pages: opts.pages,
      rounds: opts.rounds,
      warmupRounds: 1,
      pagesPerFault: opts.pagesPerFault,
      placements: opts.placements.map((p) => p.name),
    },
    handlers: Object.fromEntries(handlers.map((h) => [h, HANDLER_LABEL[h]])),
    results,
    ...(opts.breakdown ? { breakdown: breakdowns } : {}),
  };
  writeFileSync(out, JSON.stringify(doc, null, 2) + '\n');
  console.log(`\nJSON: ${relative(process.cwd(), out) || out}`);
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exitCode = 1;
});
