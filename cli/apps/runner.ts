// Runs an application kernel as a measurement: every policy `runs` times, the policies taking
// turns in each run (williams order, so a slow spell of this shared machine falls on all of
// them alike), each trial on every rank at once. Per trial: the time of each step (the slowest
// rank's), faults per rank, the bytes verified, CPU time by thread. Then a verdict like
// measured-table's: each ODP policy's slowdown against pinning after the first step, its
// spread over the runs, whether it is within the noise (pinning's own spread over the same
// runs) and, from the trials' own figures, why not.
import { median } from '../../lib/index.js';
import type { AppPolicy } from './policy.js';
import { williams } from '../programs/odp-vs-pinned.js';
import { print, Table, us } from '../programs/support/format.js';
import { PLOT_CONFIG, type PlotSpec } from '../programs/support/plot.js';
import { cpuSample, cpuSpent, FIRST_STEPS, type CpuSpent, type Kernel, type RankOutcome, type TrialOptions } from './kernel.js';
import type { World } from './world.js';

const WARM_UP_MS = 1500;
const WARM_UP_MAX_ROUNDS = 20;

/** One trial's measurements, over all ranks. */
export interface Trial {
  /** 1-based. */
  run: number;
  /** The policy the trial's buffers were registered under. */
  policy: AppPolicy;
  /** Each step's µs: the slowest rank's. */
  stepUs: number[];
  /** The first step (fresh buffers: registration's or the first faults' cost lands here), µs. */
  firstStepUs: number;
  /** The median step after the first, µs. */
  medianStepUs: number;
  /** Faults each rank's fault library resolved (source + destination), by rank. */
  faultsPerRank: number[];
  /** The fault library's measured path of those faults (detect to retransmit), µs, all ranks. */
  faultPathUs: number;
  /** Faults in the steps after the first FIRST_STEPS (both halves of the receive buffers written once), all ranks. */
  faultsSteady: number;
  /** Pages each rank read from the memory server (the remote policy; 0 otherwise), by rank. */
  pagesFetched: number[];
  /**
   * CPU per step and process over the steps after the first FIRST_STEPS, ms: the process, its
   * main thread, its other threads (fault handling, the transport, V8's helpers). 0 with no
   * steps after them.
   */
  steadyCpu: { processMs: number; mainThreadMs: number; otherThreadsMs: number };
  /** Bytes of results checked, all ranks. */
  bytesVerified: number;
  /** Values that differ from the serial computation, all ranks (0 in a correct run). */
  mismatches: number;
  /** kv: operations served per second after the first step (all clients' operations per step less the refused, over the median step); 0 for the other kernels. */
  opsPerSecond: number;
  /** kv: requests the server refused (keys past what a pinned server may lock), all ranks. */
  refused: number;
  /** CPU of the trial: per process (one process holds every rank in-process; one per rank in a job). */
  cpu: CpuSpent[];
}

/** An ODP policy against pinning over the runs. */
export interface Verdict {
  /** The ODP policy judged. */
  policy: AppPolicy;
  /** Median step after the first over pin's, per run. */
  ratios: number[];
  /** The median of `ratios` (the package's median: the lower middle value of an even count). */
  slowdown: number;
  /**
   * The noise, relative: from four runs on, the interquartile range of `ratios` (the spread of
   * the slowdown over the interleaved runs); below that, the larger of pinning's own run-to-run
   * spread ((max − min) / median of its median steps; with one run, its steps' interquartile
   * range over their median) and half the range of `ratios`.
   */
  noise: number;
  /** |slowdown − 1| is no more than the noise: no measurable difference from pinning. */
  withinNoise: boolean;
  /** The measured reason, from the trials' figures. */
  cause: string;
}

/** What `runKernel` returns. */
export interface AppResult {
  /** The application's name. */
  app: string;
  /** Ranks in the run. */
  ranks: number;
  /** 'nodes in one process', or the launcher that started the job. */
  where: string;
  /** Steps per trial. */
  steps: number;
  /** Whether the buffers were evicted before every step. */
  evictEachStep: boolean;
  /** Every trial, in the order run. */
  trials: Trial[];
  /** Each ODP policy against pin (empty without pin trials). */
  verdicts: Verdict[];
  /** Every trial verified every value. */
  verified: boolean;
}

/** How to run a kernel: the policies (pin first if present: the baseline), runs, steps. */
export interface RunKernelOptions<P> {
  /** The application's name, for the output. */
  app: string;
  /** One rank's part of a trial. */
  kernel: Kernel<P>;
  /** The kernel's own parameters. */
  params: P;
  /** The policies, each run once per run. */
  policies: readonly AppPolicy[];
  /** How many times each policy runs. */
  runs: number;
  /** Steps per trial. */
  steps: number;
  /** Evict the kernel's buffers before every step. */
  evictEachStep: boolean;
  /** The worlds of this process: all ranks (in-process), or this process's one rank of a job. */
  worlds: World[];
  /** Unrecorded rounds of every policy first, for WARM_UP_MS at least (V8 compiles the kernel and the engine: the first trials run slower). */
  warmUp: boolean;
  /** The job's size when `worlds` holds one rank of it (otherwise worlds.length). */
  size: number;
}

/** One trial on this process's ranks; every rank of the job learns every rank's outcome and CPU. */
async function trial<P>(o: RunKernelOptions<P>, t: TrialOptions): Promise<{ outcomes: RankOutcome[]; cpu: CpuSpent[] }> {
  const a = cpuSample();
  const mine = await Promise.all(
    o.worlds.map((w) =>
      o.kernel(w, t, o.params).catch((e: unknown) => {
        w.fail(e as Error);
        throw e;
      }),
    ),
  );
  const cpu = cpuSpent(a, cpuSample());
  if (o.worlds.length === o.size) return { outcomes: mine, cpu: [cpu] };
  const all = await o.worlds[0]!.allgather({ outcome: mine[0]!, cpu });
  return { outcomes: all.map((x) => x.outcome), cpu: all.map((x) => x.cpu) };
}

/** Run every policy `runs` times, interleaved; print and return the trials and the verdicts. */
export async function runKernel<P>(o: RunKernelOptions<P>): Promise<AppResult> {
  const trials: Trial[] = [];
  const lead = o.worlds[0]!.rank === 0;
  const printTrial = trialPrinter(o);
  if (o.warmUp) {
    // Rounds of every policy until WARM_UP_MS have passed: a single round left pin, the first policy of run 1, at twice its later step time.
    const t0 = performance.now();
    let rounds = 0;
    let more: boolean;
    do {
      for (const policy of o.policies) await trial(o, { policy, steps: o.steps, evictEachStep: o.evictEachStep });
      rounds++;
      more = performance.now() - t0 < WARM_UP_MS && rounds < WARM_UP_MAX_ROUNDS;
      // In a job every rank must run the same trials: rank 0's clock decides for all.
      if (o.worlds.length < o.size) more = (await o.worlds[0]!.allgather(more))[0] === true;
    } while (more);
    if (lead) print(`warm-up: ${rounds} unrecorded round(s) of every policy (V8 compiling the kernel and the engine)`);
  }
  for (let run = 1; run <= o.runs; run++) {
    for (const k of williams(o.policies.length, run - 1)) {
      const policy = o.policies[k]!;
      const { outcomes, cpu } = await trial(o, { policy, steps: o.steps, evictEachStep: o.evictEachStep });
      const stepUs = outcomes[0]!.stepUs.map((_, i) => Math.max(...outcomes.map((x) => x.stepUs[i]!)));
      const t: Trial = {
        run,
        policy,
        stepUs,
        firstStepUs: stepUs[0]!,
        medianStepUs: stepUs.length > 1 ? median(stepUs.slice(1)) : stepUs[0]!,
        faultsPerRank: outcomes.map((x) => x.faults.source + x.faults.destination),
        faultPathUs: outcomes.reduce((s, x) => s + x.faults.pathUs, 0),
        faultsSteady: outcomes.reduce((s, x) => s + x.faultsSteady, 0),
        pagesFetched: outcomes.map((x) => x.faults.fetched),
        steadyCpu: steadyCpuOf(outcomes, o.steps),
        bytesVerified: outcomes.reduce((s, x) => s + x.bytesVerified, 0),
        mismatches: outcomes.reduce((s, x) => s + x.mismatches, 0),
        opsPerSecond: 0,
        refused: outcomes.reduce((s, x) => s + (x.refused ?? 0), 0),
        cpu,
      };
      const ops = outcomes.reduce((s, x) => s + (x.opsPerStep ?? 0), 0);
      // Served operations only: a refusal is no service.
      t.opsPerSecond = ops ? ((ops - t.refused / o.steps) / t.medianStepUs) * 1e6 : 0;
      trials.push(t);
      if (lead) printTrial(t);
    }
  }
  const verdicts = judge(trials, o.policies, o.steps);
  const result: AppResult = {
    app: o.app,
    ranks: o.size,
    where: o.worlds[0]!.where,
    steps: o.steps,
    evictEachStep: o.evictEachStep,
    trials,
    verdicts,
    verified: trials.every((t) => t.mismatches === 0 && t.bytesVerified > 0),
  };
  if (lead) printVerdicts(result);
  return result;
}

/** A printer of trial rows: the table's header comes with the first. */
function trialPrinter<P>(o: RunKernelOptions<P>): (t: Trial) => void {
  let header: Table | undefined;
  return (t) => {
    if (!header) {
      print(
        `${o.app}: ${o.size} ranks (${o.worlds[0]!.where}), ${o.steps} steps per trial, buffers ${o.evictEachStep ? 'evicted before every step' : 'fresh (unpopulated) at the first step'}`,
      );
      print(
        "step: the slowest rank; faults: the median rank's; CPU of the trial: the process(es), and their threads other than the main one; checked: every value against the serial computation",
      );
      header = new Table([
        { header: 'run', width: 3 },
        { header: 'policy', width: 11, left: true },
        { header: 'first step [usec]', width: 9 },
        { header: 'median after [usec]', width: 9 },
        { header: 'faults /rank', width: 6 },
        { header: `after ${FIRST_STEPS} steps`, width: 7 },
        ...(o.policies.includes('remote') ? [{ header: 'fetched /rank', width: 7 }] : []),
        { header: 'CPU [ms]', width: 6 },
        { header: 'others [ms]', width: 6 },
        { header: 'checked', width: 7 },
        ...(t.opsPerSecond
          ? [
              { header: 'served ops/s', width: 7 },
              { header: 'refused', width: 7 },
            ]
          : []),
      ]);
      header.header();
    }
    const sum = (f: (c: CpuSpent) => number): number => t.cpu.reduce((s, c) => s + f(c), 0);
    header.row([
      String(t.run),
      t.policy,
      us(t.firstStepUs),
      us(t.medianStepUs),
      String(Math.round(median(t.faultsPerRank))),
      String(t.faultsSteady),
      ...(o.policies.includes('remote') ? [String(Math.round(median(t.pagesFetched)))] : []),
      sum((c) => c.processMs).toFixed(0),
      sum((c) => Object.values(c.otherThreadsMs).reduce((a, b) => a + b, 0)).toFixed(0),
      t.mismatches ? `${t.mismatches} BAD` : 'ok',
      ...(t.opsPerSecond ? [t.opsPerSecond.toFixed(0), String(t.refused)] : []),
    ]);
  };
}

/** Ranks of the trials (the same in every trial). */
function ranksOf(trials: readonly Trial[]): number {
  return Math.max(1, trials[0]?.faultsPerRank.length ?? 1);
}

/** The spread of `xs` relative to their median: (max − min) / median. */
function relSpread(xs: number[]): number {
  return xs.length ? spread(xs) / median(xs) : NaN;
}

/**
 * The spread of repeated runs: their interquartile range from four runs on (one run that the
 * machine disturbed does not widen it, as it widens the range), their range below that.
 */
function spread(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length >= 4 ? s[Math.floor(s.length * 0.75)]! - s[Math.floor(s.length * 0.25)]! : s[s.length - 1]! - s[0]!;
}

/** The outcomes' CPU after the first FIRST_STEPS steps, per step and process (one sample per process: see faultCount). */
function steadyCpuOf(outcomes: readonly RankOutcome[], steps: number): Trial['steadyCpu'] {
  const samples = outcomes.flatMap((x) => (x.steadyCpu ? [x.steadyCpu] : []));
  const per = (f: (c: CpuSpent) => number): number =>
    samples.length ? samples.reduce((s, c) => s + f(c), 0) / samples.length / (steps - FIRST_STEPS) : 0;
  return {
    processMs: per((c) => c.processMs),
    mainThreadMs: per((c) => c.mainThreadMs),
    otherThreadsMs: per((c) => Object.values(c.otherThreadsMs).reduce((a, b) => a + b, 0)),
  };
}

/** Each ODP policy against pin: per-run ratios of the median step after the first, and whether they are within pin's own noise. */
export function judge(trials: readonly Trial[], policies: readonly AppPolicy[], steps: number): Verdict[] {
  const pin = trials.filter((t) => t.policy === 'pin');
  if (!pin.length) return [];
  const runs = [...new Set(trials.map((t) => t.run))];
  const pinMedians = pin.map((t) => t.medianStepUs);
  // One run has no run-to-run spread: its steps' own interquartile range stands for the noise.
  const steady = pin[0]!.stepUs.slice(1).sort((a, b) => a - b);
  const iqr = steady.length >= 4 ? (steady[Math.floor(steady.length * 0.75)]! - steady[Math.floor(steady.length * 0.25)]!) / median(steady) : NaN;
  const noise = runs.length > 1 ? relSpread(pinMedians) : iqr;
  // Steady-state CPU per step and process, the median trial's of each part.
  const cpuOf = (ts: Trial[]): Trial['steadyCpu'] => ({
    processMs: median(ts.map((t) => t.steadyCpu.processMs)),
    mainThreadMs: median(ts.map((t) => t.steadyCpu.mainThreadMs)),
    otherThreadsMs: median(ts.map((t) => t.steadyCpu.otherThreadsMs)),
  });
  const pinCpu = cpuOf(pin);
  const ms = (x: number): string => `${x >= 0 ? '+' : ''}${x.toFixed(2)} ms`;
  return policies
    .filter((p) => p !== 'pin')
    .map((policy) => {
      const mine = trials.filter((t) => t.policy === policy);
      const ratios = runs.flatMap((r) => {
        const a = mine.find((t) => t.run === r);
        const b = pin.find((t) => t.run === r);
        return a && b ? [a.medianStepUs / b.medianStepUs] : [];
      });
      const slowdown = median(ratios);
      // The noise: from four runs on, the spread of the slowdown itself (its per-run ratios'
      // interquartile range): each ratio pairs two trials of one interleaved run, so a machine
      // that is slower for a whole run moves both, not the ratio. Below that, pinning's own
      // run-to-run spread or half the ratios' range, whichever is larger.
      const policyNoise = ratios.length >= 4 ? spread(ratios) : Math.max(Number.isNaN(noise) ? 0 : noise, ratios.length > 1 ? spread(ratios) / 2 : 0);
      const withinNoise = Math.abs(slowdown - 1) <= policyNoise;
      const after = median(mine.map((t) => t.faultsSteady)) / Math.max(1, steps - FIRST_STEPS);
      const cpu = cpuOf(mine);
      const extraMainMs = cpu.mainThreadMs - pinCpu.mainThreadMs;
      const extraOtherMs = cpu.otherThreadsMs - pinCpu.otherThreadsMs;
      // What the faults cost, from the fault library's own measure: their path per fault, and per step against pin's step.
      const faults = mine.reduce((n, t) => n + t.faultsPerRank.reduce((a, b) => a + b, 0), 0);
      const perFaultUs = faults ? mine.reduce((n, t) => n + t.faultPathUs, 0) / faults : 0;
      const extraUs = median(mine.map((t) => t.medianStepUs)) - median(pin.map((t) => t.medianStepUs));
      // Remote paging: every page a step touches comes from the memory server.
      const fetched = median(mine.map((t) => t.pagesFetched.reduce((a, b) => a + b, 0))) / steps;
      const fromServer = fetched > 0 ? `; ${fetched.toFixed(1)} pages per step (all ranks) fetched from the memory server` : '';
      const cause =
        after > 0
          ? `${after.toFixed(1)} faults per step after the first ${FIRST_STEPS} (all ranks), each ${perFaultUs.toFixed(0)} µs ` +
            `from detection to retransmission (the fault library's measure): ${((after * perFaultUs) / ranksOf(mine)).toFixed(0)} µs ` +
            `of fault path per rank and step, against a step ${extraUs.toFixed(0)} µs longer than pin's`
          : `no faults after the first ${FIRST_STEPS} steps; CPU per step and process after them ${ms(cpu.processMs - pinCpu.processMs)} against pin ` +
            `(main thread ${ms(extraMainMs)}, other threads ${ms(extraOtherMs)}; pin: ${pinCpu.processMs.toFixed(2)} ms)` +
            (withinNoise ? '' : `: ${stepCause(extraUs / 1000, extraMainMs, extraOtherMs)}`);
      return { policy, ratios, slowdown, noise: policyNoise, withinNoise, cause: cause + fromServer };
    });
}

/** Why a step without faults is `extraMs` longer than pin's, from the extra CPU per step of the main thread and of the others. */
function stepCause(extraMs: number, mainMs: number, otherMs: number): string {
  // The main thread runs the kernel and the engine: its extra CPU is time in the step; half the extra step or more is the cause.
  if (extraMs > 0 && mainMs >= extraMs / 2)
    return `the main thread's extra CPU (${mainMs.toFixed(2)} ms) is most of the extra ${extraMs.toFixed(2)} ms per step`;
  if (extraMs > 0 && mainMs + otherMs >= extraMs / 2)
    return `CPU of the other threads (${otherMs.toFixed(2)} ms, with the main thread's ${mainMs.toFixed(2)} ms) is most of the extra ${extraMs.toFixed(2)} ms per step`;
  return `neither faults nor CPU account for the ${extraMs >= 0 ? 'extra' : 'saved'} ${Math.abs(extraMs).toFixed(2)} ms per step: this machine varying (other processes, scheduling)`;
}

function printVerdicts(r: AppResult): void {
  print(`\n${r.app}: every value checked against the serial computation, in every trial: ${r.verified ? 'yes' : 'NO'}`);
  if (!r.verdicts.length) {
    print('(no pin trials: no verdict against pinning; add pin to --policies)');
    return;
  }
  print(`ODP against pinning, median step after the first (${r.trials.filter((t) => t.policy === 'pin').length} interleaved runs):`);
  for (const v of r.verdicts)
    print(
      `  ${v.policy.padEnd(11)} ${v.slowdown.toFixed(3)}× pin (runs ${v.ratios.map((x) => x.toFixed(3)).join(', ')}); noise ` +
        `±${(v.noise * 100).toFixed(1)} %: ${v.withinNoise ? 'within the noise' : v.slowdown < 1 ? 'faster than pin beyond the noise' : 'NOT within the noise'}; ${v.cause}`,
      2,
    );
  const ta = r.verdicts.find((v) => v.policy === 'touch-ahead');
  if (ta) {
    const noise = `noise ±${(ta.noise * 100).toFixed(1)} %`;
    print(
      `touch-ahead within 5 % of pin after the first step (the thesis's "no measurable slowdown"): ` +
        (!ta.withinNoise && ta.slowdown > 1.05
          ? `no (${ta.slowdown.toFixed(3)}×): ${ta.cause}`
          : ta.noise > 0.05
            ? `not resolved (${ta.slowdown.toFixed(3)}×, but the ${noise} is wider than the 5 % to resolve: more --runs, a quieter machine)`
            : `yes (${ta.slowdown.toFixed(3)}×, ${noise})`),
    );
  }
  print(`pin's median step after the first: ${us(median(r.trials.filter((t) => t.policy === 'pin').map((t) => t.medianStepUs)))} µs`);
}

/** --plot: each ODP policy's time per step after the first over pin's, one point per run, a bar at the median; 1 is pinning. */
export function verdictPlot(r: AppResult): PlotSpec {
  const values = r.verdicts.flatMap((v) => v.ratios.map((ratio, i) => ({ policy: v.policy, run: i + 1, ratio })));
  const medians = r.verdicts.map((v) => ({ policy: v.policy, ratio: v.slowdown }));
  const order = r.verdicts.map((v) => v.policy);
  const x = { field: 'policy', type: 'nominal', sort: order, title: 'policy', axis: { labelAngle: 0 } } as const;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: {
      text: `app ${r.app}: time per step after the first, against pin`,
      subtitle: `${r.ranks} ranks (${r.where}), ${r.steps} steps per trial; points: runs, bars: their median; 1 = pin`,
    },
    config: PLOT_CONFIG,
    width: 420,
    height: 300,
    layer: [
      {
        data: { values: medians },
        mark: { type: 'bar', opacity: 0.35 },
        encoding: { x, y: { field: 'ratio', type: 'quantitative', title: '× pin' } },
      },
      { data: { values }, mark: { type: 'point', filled: true }, encoding: { x, y: { field: 'ratio', type: 'quantitative' } } },
      { data: { values: [{ one: 1 }] }, mark: { type: 'rule', strokeDash: [4, 3] }, encoding: { y: { field: 'one', type: 'quantitative' } } },
    ],
  };
}
