// Benchmark: the genuine userfaultfd fault round trip through the TypeScript handler,
// measured side by side with a C handler doing the same work (bench/c/uffd-handler.c).
//
// For each touch-ahead size (pages resolved per fault) and each round, a thread that is
// not the handler's reads one byte of every page of a 64 MiB region with no page present
// (a fresh mapping for C, the run's one region evicted for TypeScript); each missing page
// faults, the handler answers with one UFFDIO_COPY of the aligned group of pages, and
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
// It is a program that prints real measurements (pagefault-rdma bench-faults, npm run
// bench:faults), never a test. It runs from a checkout or an installed package alike: the C
// handler is compiled into a temporary folder, and the JSON goes to --json, else to
// bench-faults.json in the working directory (a temporary folder inside the installed package).
import { execFileSync, spawnSync } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { InvalidArgumentError } from 'commander';
import { Histogram, mapRegion, median, PAGE_SIZE, touch, Userfaultfd, type ChromeTraceEvent, type Region } from '../lib/index.js';
import { print, Table } from '../cli/programs/support/format.js';
import { progress, type Progress } from '../cli/programs/support/progress.js';
import type { TraceFile } from '../cli/programs/support/trace-file.js';
import { ownFolder, runOwned } from './interrupt.js';

/** Byte both handlers place in every page: the faulting thread's checksum proves where pages came from. */
const FILL = 0xa7;

/**
 * Targets (issue 43): the TypeScript median at most this many times the C handler's, with every
 * thread on one CPU (free placement adds cross-vCPU wake-ups that neither handler controls).
 */
const TARGETS: ReadonlyMap<number, number> = new Map([
  [1, 1.2],
  [256, 1.05],
]);

/**
 * The headline: faults one handler thread resolves per second, one page a fault, with the
 * faulting threads on a CPU of their own (RATE_FAULTERS of them, each reading its own slice,
 * so that a fault is nearly always waiting for the handler). The rate is taken from the
 * RATE_WARM_FAULTS-th resolution to the last, past start-up and the JIT's warm-up.
 */
const RATE_FAULTERS = 4;
const RATE_WARM_FAULTS = 1000;
/** What a simple C handler is published to reach: about 128,000 faults a second (7.8 µs a fault). */
const PUBLISHED_RATE = 128_000;

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
  /** Traced TypeScript rounds: when each fault reached the handler and when its copy returned (ms). */
  stamps?: { receivedMs: number[]; copiedMs: number[]; handlerThread: number; faulterThread: number };
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

export interface BenchFaultsOptions {
  pages: number;
  rounds: number;
  pagesPerFault: number[];
  placements: Placement[];
  relay: boolean;
  breakdown: boolean;
  /** Where the JSON goes (default: bench-faults.json in the working directory, or a temporary folder); false: not written. */
  json?: string | false;
  trace?: TraceFile;
}

type Options = BenchFaultsOptions;

function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError('must be a positive integer');
  return n;
}

export function intList(value: string): number[] {
  return value.split(',').map((v) => positiveInt(v.trim()));
}

export function placementList(value: string): Placement[] {
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

export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || !existsSync(join(dir, 'bench', 'c', 'uffd-handler.c'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('bench-faults: cannot find bench/c/uffd-handler.c beside the package.json above this script');
    dir = up;
  }
  return dir;
}

/**
 * Builds bench/c/NAME.c with the system compiler into `outDir`; returns the binary's path.
 * `libs` are linked (-l), and `missing` says which package to install when compiling fails.
 */
export function compileC(root: string, outDir: string, name: string, libs: string[] = [], missing = ''): string {
  const source = join(root, 'bench', 'c', `${name}.c`);
  const binary = join(outDir, name);
  const cc = spawnSync('cc', ['-O2', '-pthread', '-Wall', '-Wextra', '-o', binary, source, ...libs.map((l) => `-l${l}`)], { encoding: 'utf8' });
  if (cc.error && (cc.error as NodeJS.ErrnoException).code === 'ENOENT') {
    throw new Error('bench: no C compiler: "cc" is not on PATH. Install one (Debian/Ubuntu: apt-get install build-essential) and run again');
  }
  if (cc.error) throw new Error(`bench: running cc failed: ${cc.error.message}`);
  if (cc.status !== 0) throw new Error(`bench: cc could not compile ${relative(root, source)}${missing ? ` (${missing})` : ''}:\n${cc.stderr}`);
  return binary;
}

/** Where a benchmark's JSON goes without --json: bench-FILE in the working directory, else a temporary folder. */
export function defaultResults(root: string, file = 'faults.json'): string {
  // Where the user is (the working directory), never into the installed package or the
  // checkout's tracked files: bench-faults.json in the working directory, or, when that is
  // inside the installed package or not writable, a temporary folder (the path is printed).
  const name = `bench-${file}`;
  const cwd = process.cwd();
  const inPackage = root.split(sep).includes('node_modules') && (cwd === root || cwd.startsWith(root + sep));
  if (!inPackage && !tracked(cwd, name)) {
    try {
      accessSync(cwd, constants.W_OK);
      return join(cwd, name);
    } catch {
      // not writable: a temporary folder below
    }
  }
  return join(mkdtempSync(join(os.tmpdir(), 'pagefault-rdma-results-')), name);
}

/** Whether `name` in `dir` is a file git tracks (writing it would change the user's checkout). */
function tracked(dir: string, name: string): boolean {
  return spawnSync('git', ['-C', dir, 'ls-files', '--error-unmatch', name], { stdio: 'ignore' }).status === 0;
}

function allowedCpus(): string {
  return /^Cpus_allowed_list:\s*(.*)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '';
}

/**
 * Sets the CPU affinity of every thread of this process, or of one thread. Threads created
 * later (the uffd reader, the toucher) inherit it from the JS thread, and so do the C
 * handler's processes.
 */
function setAffinity(cpus: string, thread?: number): void {
  // With a thread id: that thread only (threads it creates afterwards inherit it).
  const which =
    thread === undefined ? ['--all-tasks', '--pid', '--cpu-list', cpus, String(process.pid)] : ['--pid', '--cpu-list', cpus, String(thread)];
  try {
    execFileSync('taskset', which, { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    if (e.code === 'ENOENT')
      throw new Error('bench/faults: "taskset" is not on PATH (Debian/Ubuntu: util-linux); run with --placements free', { cause: err });
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

async function runC(binary: string, pages: number, perFault: number, mode: 'direct' | 'relay', placement: Placement): Promise<Round> {
  const r = await runOwned(binary, [String(pages), String(perFault), mode]);
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

/**
 * The TypeScript rounds' memory: one region for the whole run, its pages dropped after each
 * round. A fresh 64 MiB mapping a round would be 64 MiB more external memory for V8 each
 * time: a major GC a round, marking on the handler's CPU while the faults are timed.
 */
function freshPages(region: Region): Region {
  if (region.residentPages() !== 0) throw new Error('bench/faults: the region still has pages from the last round: they would not fault');
  return region;
}

async function runTs(memory: Region, perFault: number, source: Buffer, trace: boolean, delivery: 'event-loop' | 'thread'): Promise<Round> {
  const region = freshPages(memory);
  const pages = region.size / PAGE_SIZE;
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
      round.stamps = { receivedMs: received, copiedMs: copied, handlerThread: uffd.handlerThreadId, faulterThread: r.threadId };
    }
    return round;
  } finally {
    uffd.close(); // unregisters: the eviction below is a plain MADV_DONTNEED
    region.evict();
  }
}

/** Where the headline runs: the handler's CPU and the faulting threads' CPU. */
interface RatePlacement {
  handlerCpu: number;
  faulterCpu: number;
}

/** The resolution the rate is counted from: the RATE_WARM_FAULTS-th, or a quarter in (small runs). */
function warmFaults(pages: number): number {
  return Math.min(RATE_WARM_FAULTS, Math.floor(pages / 4));
}

/** Faults resolved per second between the warm-up's last resolution (at `fromNs`) and the last one (at `toNs`). */
function rate(faults: number, fromNs: number, toNs: number): number {
  return (faults - warmFaults(faults)) / ((toNs - fromNs) / 1e9);
}

async function runCRate(binary: string, pages: number, at: RatePlacement): Promise<number> {
  const args = [String(pages), '1', 'rate', String(RATE_FAULTERS), String(at.handlerCpu), String(at.faulterCpu)];
  const r = await runOwned(binary, args);
  if (r.error) throw new Error(`bench/faults: running the C handler failed: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`bench/faults: the C handler (rate) exited with ${r.status ?? r.signal}: ${r.stderr.trim()}`);
  const copied = (JSON.parse(r.stdout) as COutput).faultCopiedNs;
  return rate(copied.length, copied[warmFaults(copied.length) - 1]!, copied[copied.length - 1]!);
}

/** The CPUs a thread may run on, from /proc (a thread of this process). */
function threadCpus(tid: number): string {
  return /^Cpus_allowed_list:\s*(.*)$/m.exec(readFileSync(`/proc/self/task/${tid}/status`, 'utf8'))?.[1] ?? '';
}

/**
 * The TypeScript handler on the JS thread (its uffd's guard beside it), RATE_FAULTERS
 * toucher threads on the faulters' CPU: a thread starts on its creator's CPUs, so the JS
 * thread moves there to start them and comes back.
 */
async function runTsRate(memory: Region, page: Buffer, at: RatePlacement): Promise<number> {
  const region = freshPages(memory);
  const pages = region.size / PAGE_SIZE;
  const uffd = Userfaultfd.open();
  const errors: Error[] = [];
  uffd.on('error', (err: Error) => errors.push(err));
  try {
    uffd.register(region);
    let resolved = 0,
      fromMs = 0,
      toMs = 0;
    const warm = warmFaults(pages);
    const faulters = new Set<number>();
    const misplaced: string[] = [];
    uffd.onFault((f) => {
      uffd.copy(f.region, f.offset, page);
      if (++resolved === warm) fromMs = performance.now();
      else if (resolved === pages) toMs = performance.now();
      if (!faulters.has(f.threadId)) {
        faulters.add(f.threadId); // once a thread: where it runs is the claim the figure makes
        const cpus = threadCpus(f.threadId);
        if (cpus !== String(at.faulterCpu)) misplaced.push(`thread ${f.threadId} on CPUs ${cpus}`);
      }
    });
    const slice = Math.floor(pages / RATE_FAULTERS) * PAGE_SIZE;
    setAffinity(String(at.faulterCpu), process.pid);
    const walks = Array.from({ length: RATE_FAULTERS }, (_, k) =>
      touch(region, { offset: k * slice, length: k === RATE_FAULTERS - 1 ? region.size - k * slice : slice, probe: true }),
    );
    setAffinity(String(at.handlerCpu), process.pid);
    const sums = (await Promise.all(walks)).reduce((sum, r) => sum + r.checksum, 0);
    if (errors.length) throw new Error(`bench/faults: the TypeScript handler failed: ${errors[0]!.message}`, { cause: errors[0] });
    if (sums !== pages * FILL || resolved !== pages || faulters.size !== RATE_FAULTERS || misplaced.length) {
      throw new Error(
        `bench/faults: wrong TypeScript rate outcome: checksum ${sums} (want ${pages * FILL}), ${resolved} faults resolved (want ${pages}), ` +
          `${faulters.size} faulting threads (want ${RATE_FAULTERS})${misplaced.length ? `, not on CPU ${at.faulterCpu}: ${misplaced.join(', ')}` : ''}`,
      );
    }
    return rate(pages, fromMs * 1e6, toMs * 1e6);
  } finally {
    uffd.close();
    region.evict();
  }
}

/** The headline rounds, C and TypeScript in turns after a warm-up of each; medians. */
async function measureRate(opts: Options, binary: string, memory: Region, at: RatePlacement, bar: Progress): Promise<Record<string, unknown>> {
  const page = Buffer.alloc(PAGE_SIZE, FILL);
  setAffinity(String(at.handlerCpu)); // every thread the handler side has, and the C processes
  const rounds: Record<'c' | 'ts', number[]> = { c: [], ts: [] };
  const run = (h: 'c' | 'ts'): Promise<number> | number => (h === 'c' ? runCRate(binary, opts.pages, at) : runTsRate(memory, page, at));
  await run('c');
  await run('ts');
  for (let r = 0; r < opts.rounds; r++) {
    for (const h of r % 2 ? (['ts', 'c'] as const) : (['c', 'ts'] as const)) {
      rounds[h].push(await run(h));
      bar.tick(`rate, ${HANDLER_SHORT[h]}`);
    }
  }
  const c = median(rounds.c);
  const ts = median(rounds.ts);
  print(
    `\nHeadline: faults resolved per second by one handler thread (1 page a fault; the handler on CPU ${at.handlerCpu}, ` +
      `${RATE_FAULTERS} faulting threads on CPU ${at.faulterCpu}; median of ${opts.rounds} rounds, from the ${warmFaults(opts.pages)}th fault on)`,
  );
  const table = new Table([
    { header: 'handler', width: 9, left: true },
    { header: 'faults/s', width: 9 },
    { header: 'us/fault', width: 8 },
    { header: 'vs C', width: 6 },
  ]);
  table.header();
  table.row([HANDLER_SHORT.c, c.toFixed(0), f2(1e6 / c), '']);
  table.row([HANDLER_SHORT.ts, ts.toFixed(0), f2(1e6 / ts), `${(ts / c).toFixed(2)}x`]);
  print(`published for a simple C handler: about ${PUBLISHED_RATE.toLocaleString('en')} faults/s (${f2(1e6 / PUBLISHED_RATE)} us/fault)`);
  return {
    ...at,
    faulters: RATE_FAULTERS,
    warmFaults: warmFaults(opts.pages),
    faultsPerSecond: { c, ts },
    usPerFault: { c: 1e6 / c, ts: 1e6 / ts },
    ratioTsToC: ts / c,
    rounds,
    published: PUBLISHED_RATE,
  };
}

/** The first two CPUs this process may use (handler, faulters), or null with fewer. */
function ratePlacement(): RatePlacement | null {
  const cpus = allowedCpus()
    .split(',')
    .flatMap((part) => {
      const [a, b] = part.split('-').map(Number);
      return b === undefined ? [a!] : Array.from({ length: b - a! + 1 }, (_, i) => a! + i);
    });
  return cpus.length >= 2 ? { handlerCpu: cpus[0]!, faulterCpu: cpus[1]! } : null;
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

function summarize(rounds: readonly Round[], perFault: number): Summary {
  const samples = Histogram.of(rounds.flatMap((r) => faultSamples(r.pageNs, perFault)));
  const roundsUs = rounds.map((r) => r.totalNs / r.pageNs.length / 1e3);
  return { samples: samples.count, medianUs: samples.quantile(0.5), p99Us: samples.quantile(0.99), roundMedianUs: median(roundsUs), roundsUs };
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

/** The version in the package.json at `root` ('unknown' when it cannot be read). */
export function packageVersion(root: string): string {
  try {
    return (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

export function machineInfo(root: string): Record<string, unknown> {
  const cpus = os.cpus();
  return {
    cpus: cpus.length,
    cpuModel: cpus[0]?.model ?? 'unknown',
    cpuAffinity: allowedCpus() || 'unknown',
    kernel: os.release(),
    node: process.version,
    cc: spawnSync('cc', ['--version'], { encoding: 'utf8' }).stdout?.split('\n')[0] ?? 'unknown',
    // The library under test: its package version, the commit and whether its sources differ from it.
    version: packageVersion(root),
    commit: git(root, 'rev-parse', '--short', 'HEAD') || 'unknown',
    libraryModified: git(root, 'status', '--porcelain', '--', 'native', 'lib') !== '',
    date: new Date().toISOString(),
  };
}

const f2 = (n: number | undefined): string => (n !== undefined && Number.isFinite(n) ? n.toFixed(2) : '-');

type RunFn = (h: HandlerName, perFault: number, trace?: boolean) => Promise<Round> | Round;

/** Measured rounds of every handler at every touch-ahead size under the current placement. */
async function measure(opts: Options, handlers: readonly HandlerName[], run: RunFn, placement: Placement, bar: Progress): Promise<unknown[]> {
  const results: unknown[] = [];
  print(`\nPlacement: ${placement.cpu === null ? `free (the scheduler picks among CPUs ${allowedCpus()})` : `every thread on ${placement.name}`}`);
  const table = new Table([
    { header: 'pages/fault', width: 5 },
    { header: 'handler', width: 9, left: true },
    { header: 'median [us/page]', width: 8 },
    { header: 'p99 [us/page]', width: 8 },
    { header: 'round median', width: 8 },
    { header: 'TS/C median', width: 6 },
    { header: 'target', width: 13, left: true },
  ]);
  table.header();
  for (const perFault of opts.pagesPerFault) {
    const rounds = new Map<HandlerName, Round[]>(handlers.map((h) => [h, []]));
    for (const h of handlers) await run(h, perFault); // warm-up: JIT, allocator, page cache
    for (let r = 0; r < opts.rounds; r++) {
      // Rotate who goes first so no handler always follows the same one.
      for (let i = 0; i < handlers.length; i++) {
        const h = handlers[(i + r) % handlers.length]!;
        rounds.get(h)!.push(await run(h, perFault));
        bar.tick(`${placement.name}, ${perFault} pages/fault, ${HANDLER_SHORT[h]}`);
      }
    }
    const summary = Object.fromEntries(handlers.map((h) => [h, summarize(rounds.get(h)!, perFault)])) as Record<HandlerName, Summary>;
    const ratio = summary.ts.medianUs / summary.c.medianUs;
    const target = placement.cpu === null ? undefined : TARGETS.get(perFault);
    const met = target === undefined ? undefined : ratio <= target;
    for (const h of handlers) {
      const s = summary[h];
      const isTs = h === 'ts';
      const threadRatio = h === 'ts-thread' ? `${(s.medianUs / summary.c.medianUs).toFixed(2)}x` : '';
      table.row([
        String(perFault),
        HANDLER_SHORT[h],
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
  return results;
}

/** Instrumented rounds (the TS handler stamps each copy): where the time of one fault goes. */
async function breakdown(opts: Options, handlers: readonly HandlerName[], run: RunFn, placement: Placement): Promise<unknown> {
  const rounds = Math.max(3, Math.ceil(opts.rounds / 2));
  const result: Record<string, Record<string, Record<string, number>>> = {};
  print(`\nBreakdown, placement ${placement.name} (${rounds} instrumented rounds per handler; median µs per fault, not per page)`);
  const table = new Table([
    { header: 'pages/fault', width: 5 },
    { header: 'stage', width: 48, left: true },
    ...handlers.map((h) => ({ header: HANDLER_SHORT[h], width: 7 })),
  ]);
  table.header();
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
      table.row([String(perFault), label, ...handlers.map((h) => f2(per[h]![key]))]);
    }
  }
  return result;
}

/** One traced TypeScript round per touch-ahead size, as trace slices (--trace). */
async function traceRounds(opts: Options, run: RunFn, trace: TraceFile): Promise<void> {
  const pid = trace.nextPid();
  const events: ChromeTraceEvent[] = [
    {
      name: 'process_name',
      cat: '__metadata',
      ph: 'M',
      ts: 0,
      pid,
      tid: 0,
      args: { name: 'bench-faults: TypeScript handler, measured (real time)' },
    },
  ];
  const threads = new Map<number, string>();
  for (const perFault of opts.pagesPerFault) {
    const r = await run('ts', perFault, true);
    const st = r.stamps!;
    threads.set(st.handlerThread, `JS thread ${st.handlerThread} (fault handler)`);
    threads.set(st.faulterThread, `toucher thread ${st.faulterThread}`);
    st.receivedMs.forEach((at, i) => {
      const end = st.copiedMs[i]!;
      events.push({
        name: 'resolve',
        cat: 'uffd',
        ph: 'X',
        ts: at * 1000,
        dur: Math.max(0, (end - at) * 1000),
        pid,
        tid: st.handlerThread,
        args: { pagesPerFault: perFault, fault: i },
      });
    });
  }
  for (const [tid, name] of threads) events.push({ name: 'thread_name', cat: '__metadata', ph: 'M', ts: 0, pid, tid, args: { name } });
  trace.add(...events);
}

/** Run the benchmark; returns the JSON document it wrote. */
export async function benchFaults(opts: Options): Promise<Record<string, unknown>> {
  const root = packageRoot();
  const buildDir = mkdtempSync(join(os.tmpdir(), 'pagefault-rdma-bench-'));
  const owned = ownFolder(buildDir); // removed on SIGINT / SIGTERM too
  try {
    const binary = compileC(root, buildDir, 'uffd-handler');
    return await benchWith(opts, root, binary);
  } finally {
    rmSync(buildDir, { recursive: true, force: true });
    owned.forget();
  }
}

async function benchWith(opts: Options, root: string, binary: string): Promise<Record<string, unknown>> {
  const machine = machineInfo(root);
  const handlers: HandlerName[] = opts.relay ? ['c', 'c-relay', 'ts', 'ts-thread'] : ['c', 'ts', 'ts-thread'];
  const source = Buffer.alloc(Math.max(...opts.pagesPerFault) * PAGE_SIZE, FILL);
  const original = allowedCpus();
  const memory = mapRegion(opts.pages * PAGE_SIZE);

  print('userfaultfd fault round trip, TypeScript handler vs C handler: real measurements on this machine, now');
  print(
    `${machine['cpus']} x ${machine['cpuModel']}, Linux ${machine['kernel']}, Node ${machine['node']}, pagefault-rdma ${String(machine['version'])}${machine['commit'] === 'unknown' ? '' : ` (${String(machine['commit'])})`}` +
      `${machine['libraryModified'] ? ' + uncommitted changes' : ''}; ${opts.pages} pages (${(opts.pages * PAGE_SIZE) / 2 ** 20} MiB) ` +
      `per round, ${opts.rounds} rounds per handler after a warm-up round, interleaved.`,
  );
  print(
    "A sample = one fault: time the faulting thread spent on the fault's group of pages / pages in the group, in µs per 4 KiB page. " +
      'median, p99: over all faults of all rounds; round median: median over rounds of (round wall time / pages).',
  );
  for (const h of handlers) print(`  ${HANDLER_SHORT[h].padEnd(9)}  ${HANDLER_LABEL[h]}`);

  const results: unknown[] = [];
  const breakdowns: Record<string, unknown> = {};
  const at = opts.pages >= 4 * RATE_FAULTERS ? ratePlacement() : null;
  let headline: Record<string, unknown> | null = null;
  const bar = progress(
    opts.placements.length * opts.pagesPerFault.length * opts.rounds * handlers.length + (at ? 2 * opts.rounds : 0),
    'bench-faults',
  );
  try {
    if (at) headline = await measureRate(opts, binary, memory, at, bar);
    else
      print(
        `\nHeadline (faults per second, faulting threads on a CPU of their own): skipped, it needs two CPUs and ${4 * RATE_FAULTERS} pages or more`,
      );
    for (const placement of opts.placements) {
      setAffinity(placement.cpu === null ? original : String(placement.cpu));
      const run: RunFn = (h, perFault, trace = false) =>
        h === 'ts' || h === 'ts-thread'
          ? runTs(memory, perFault, source, trace, h === 'ts' ? 'event-loop' : 'thread')
          : runC(binary, opts.pages, perFault, h === 'c' ? 'direct' : 'relay', placement);
      results.push(...(await measure(opts, handlers, run, placement, bar)));
      if (opts.breakdown) breakdowns[placement.name] = await breakdown(opts, handlers, run, placement);
      if (opts.trace && placement === opts.placements[0]) await traceRounds(opts, run, opts.trace);
    }
  } finally {
    bar.stop();
    setAffinity(original);
    memory.close();
  }
  if (opts.breakdown) {
    print(
      '\nTS handler start = Fault.receivedAt (the JS thread enters the reader thread\'s callback); "-": not visible from TypeScript. ' +
        "Stages are stamps of different threads: when the woken faulter runs before the waker's UFFDIO_COPY returns (same CPU, " +
        'wake-up preemption), "runs again" is negative and "handler start -> UFFDIO_COPY returned" includes the faulter\'s run.',
    );
  }

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
    headline,
    results,
    ...(opts.breakdown ? { breakdown: breakdowns } : {}),
  };
  if (opts.json !== false) {
    const out = resolve(opts.json ?? defaultResults(root));
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, JSON.stringify(doc, null, 2) + '\n');
    const rel = relative(process.cwd(), out);
    print(`\nJSON: ${rel && !rel.startsWith('..') ? rel : out}`); // where the user is, or the whole path
  }
  return doc;
}
