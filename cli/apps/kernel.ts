// What every application kernel shares: the options of one trial (a policy, a number of steps,
// whether buffers are evicted every step), what a rank reports from it (the time of each step,
// its faults, the bytes it verified), the routing of a rank's completions (writes done, writes
// with immediate received, receives re-posted), and the CPU time of the process by thread.
import { readdirSync, readFileSync } from 'node:fs';
import { PfrError, PHASES, WcOpcode, WcStatus, type QueuePair, type WorkCompletion } from '../../lib/index.js';
import type { AppPolicy } from './policy.js';
import { LOCAL, WAIT_MS, type World } from './world.js';

/** One trial of a kernel: every rank runs `steps` steps under `policy`. */
export interface TrialOptions {
  /** How the kernel's RDMA buffers are had: pinned, an ODP fault library policy, or remote-paged (buffers.ts). */
  policy: AppPolicy;
  /** Steps of the trial (the kernel's unit: a sweep, an allreduce, a transpose). */
  steps: number;
  /** Evict the kernel's RDMA buffers before every step (not only the fresh mapping of the first): faults every step. */
  evictEachStep: boolean;
}

/**
 * The steps in which a kernel's buffers are first written: every kernel here double-buffers
 * what it receives by the step's parity (a peer may be one step ahead), so each half of the
 * receive buffer is first written, and faults, in one of the first two steps.
 */
export const FIRST_STEPS = 2;

/** One rank's outcome of a trial. */
export interface RankOutcome {
  /** The rank reporting. */
  rank: number;
  /** Real µs of each step at this rank. */
  stepUs: number[];
  /** Faults this rank's fault library resolved during the trial: its buffers read (source), written (destination), and their measured path. */
  faults: FaultCount;
  /** Faults in the steps after the first FIRST_STEPS. */
  faultsSteady: number;
  /** Bytes (or Float64 values × 8) of the result this rank checked against the serial computation. */
  bytesVerified: number;
  /** Values that differ from the serial computation. */
  mismatches: number;
  /** Operations this rank completed per step (kv's clients: GETs and SETs), for ops/s. */
  opsPerStep?: number;
  /** Requests refused (kv: keys outside what a pinned server could lock). */
  refused?: number;
  /** This rank's process's CPU over the steps after the first FIRST_STEPS (sampled by rank 0 of a process: see faultCount). */
  steadyCpu?: CpuSpent;
}

/** A rank's outcome before its trial: nothing timed, counted or checked yet. */
export function newOutcome(rank: number, extra: Pick<RankOutcome, 'opsPerStep' | 'refused'> = {}): RankOutcome {
  return {
    rank,
    stepUs: [],
    faults: { source: 0, destination: 0, pathUs: 0, fetched: 0 },
    faultsSteady: 0,
    bytesVerified: 0,
    mismatches: 0,
    ...extra,
  };
}

/** An application kernel: one rank's part of one trial. */
export type Kernel<P> = (w: World, t: TrialOptions, params: P) => Promise<RankOutcome>;

/** A rank's faults: by side, and the real µs its fault library measured on their paths (detect, notify, resolve, retransmit). */
export interface FaultCount {
  source: number;
  destination: number;
  /** Σ over the faults of their measured detect-to-retransmit time, µs (a latency: faults resolved at once overlap). */
  pathUs: number;
  /** Pages read from the memory server (remote policy: DMA and CPU faults alike; 0 otherwise). */
  fetched: number;
  /** The process's CPU then: sampled by one rank per process (every rank of a job, rank 0 of nodes in one process), else undefined. */
  cpu?: CpuSample;
}

/** The fault library's counts of this rank so far. */
export function faultCount(w: World): FaultCount {
  const s = w.ctx.faultLibrary.stats();
  const pathUs = PHASES.reduce((sum, p) => sum + s.phases.real[p].count * s.phases.real[p].mean, 0);
  const cpu = w.rank === 0 || w.where !== LOCAL ? cpuSample() : undefined;
  return { source: s.faults.source, destination: s.faults.destination, pathUs, fetched: w.remote?.pagesFetched() ?? 0, ...(cpu ? { cpu } : {}) };
}

/** The counts since `before`. */
export function faultsSince(w: World, before: FaultCount): FaultCount {
  const now = faultCount(w);
  return {
    source: now.source - before.source,
    destination: now.destination - before.destination,
    pathUs: now.pathUs - before.pathUs,
    fetched: now.fetched - before.fetched,
  };
}

/** The trial's faults into `me`: all of them since `before`, and those after the first FIRST_STEPS steps (since `steady`). A memory server's failure during the trial throws. */
export function countFaults(w: World, t: TrialOptions, me: RankOutcome, before: FaultCount, steady: FaultCount): void {
  w.remote?.check();
  me.faults = faultsSince(w, before);
  const late = faultsSince(w, steady);
  me.faultsSteady = t.steps > FIRST_STEPS ? late.source + late.destination : 0;
  if (steady.cpu && t.steps > FIRST_STEPS) me.steadyCpu = cpuSpent(steady.cpu, cpuSample());
}

/**
 * A rank's completions, routed: writes this rank posted (counted) and writes with immediate
 * received (counted by their immediate, the tag a kernel gives a step). A receive consumed is
 * re-posted on its QP while the kernel still expects more there, so a peer one step ahead
 * always finds one (never an RNR wait). Any failed completion fails the wait.
 */
export class Completions {
  #sends = 0;
  #tags = new Map<number, number>();
  #left = new Map<number, { qp: QueuePair; left: number }>();
  #received: WorkCompletion[] = [];

  constructor(private readonly w: World) {}

  /** Expect `total` writes with immediate on `qp`: post the first `ahead` receives (as many as the peer can have in flight). */
  arm(qp: QueuePair, total: number, ahead = 2): void {
    const now = Math.min(ahead, total);
    for (let i = 0; i < now; i++) qp.postRecv({ wrId: 0, sgList: [] });
    this.#left.set(qp.qpNum, { qp, left: total - now });
  }

  /** The next SEND this rank received (its receive's completion), in arrival order. */
  async receive(): Promise<WorkCompletion> {
    while (!this.#received.length) await this.wait(0, 0, 0, true);
    return this.#received.shift()!;
  }

  /**
   * Wait until `sends` of this rank's sends, writes and reads completed and `recvs` writes with
   * immediate `tag` arrived; consume them. With `one`, take at least one completion first.
   */
  async wait(sends: number, tag: number, recvs: number, one = false): Promise<void> {
    while (this.#sends < sends || (this.#tags.get(tag) ?? 0) < recvs || one) {
      one = false;
      // A lost rank ends the wait with the job's reason, not the wait's own 'aborted'.
      const wc = await this.w.cq
        .next({ timeoutMs: WAIT_MS, signal: this.w.signal })
        .catch((e: unknown) => Promise.reject(this.w.signal.aborted ? (this.w.signal.reason as Error) : (e as Error)));
      if (wc.status !== WcStatus.SUCCESS)
        throw new PfrError(
          'ERR_PFR_ACCESS_FAILED',
          `rank ${this.w.rank}: a work request on QP ${wc.qpNum} failed: ${wc.statusStr} (${WcStatus[wc.status]})`,
        );
      if (wc.opcode === WcOpcode.RECV) this.#received.push(wc);
      else if (wc.opcode === WcOpcode.RECV_RDMA_WITH_IMM) {
        this.#tags.set(wc.immData!, (this.#tags.get(wc.immData!) ?? 0) + 1);
        const q = this.#left.get(wc.qpNum);
        if (q && q.left > 0) {
          q.qp.postRecv({ wrId: 0, sgList: [] });
          q.left--;
        }
      } else this.#sends++;
    }
    this.#sends -= sends;
    if (recvs) this.#tags.set(tag, this.#tags.get(tag)! - recvs);
  }
}

/** CPU time in ms: the process (process.cpuUsage) and each of its threads (/proc/self/task/TID/stat utime + stime). */
export interface CpuSample {
  /** The process's user CPU, ms. */
  userMs: number;
  /** The process's system CPU, ms. */
  systemMs: number;
  /** By thread id: its name (comm) and user + system ms. */
  threads: Map<number, { name: string; ms: number }>;
}

const TICK_MS = 10; // USER_HZ is 100 on Linux: /proc's utime and stime are in 10 ms ticks.

/** The process's CPU time now, by thread. */
export function cpuSample(): CpuSample {
  const u = process.cpuUsage();
  const threads = new Map<number, { name: string; ms: number }>();
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
      // The name is in parentheses and may hold spaces: the fields follow the last ')'.
      const close = stat.lastIndexOf(')');
      const fields = stat.slice(close + 2).split(' ');
      threads.set(Number(tid), { name: stat.slice(stat.indexOf('(') + 1, close), ms: (Number(fields[11]) + Number(fields[12])) * TICK_MS });
    } catch {
      // A thread that ended between the listing and the read has no CPU left to count.
    }
  }
  return { userMs: u.user / 1000, systemMs: u.system / 1000, threads };
}

/** CPU spent between two samples: the process, its main (JavaScript) thread, and all its other threads. */
export interface CpuSpent {
  /** User + system CPU of the whole process, ms (process.cpuUsage). */
  processMs: number;
  /** Its user part, ms. */
  userMs: number;
  /** Its system part (page faults, madvise, mlock, the transport's syscalls), ms. */
  systemMs: number;
  /** The main thread (JavaScript: the kernels, the engine, the fault library's resolution), ms, in 10 ms ticks. */
  mainThreadMs: number;
  /** Threads other than the main one (fault handling, libuv, the transport, V8's helpers), as `name:tid`, ms. */
  otherThreadsMs: Record<string, number>;
}

/** The CPU spent from `a` to `b`. */
export function cpuSpent(a: CpuSample, b: CpuSample): CpuSpent {
  const other: Record<string, number> = {};
  let main = 0;
  for (const [tid, t] of b.threads) {
    const ms = t.ms - (a.threads.get(tid)?.ms ?? 0);
    if (tid === process.pid) main = ms;
    // By name and id: the native threads take the process's name ('node'), so the id tells them apart.
    else if (ms > 0) other[`${t.name}:${tid}`] = ms;
  }
  const userMs = b.userMs - a.userMs;
  const systemMs = b.systemMs - a.systemMs;
  return { processMs: userMs + systemMs, userMs, systemMs, mainThreadMs: main, otherThreadsMs: other };
}

/** The 3-D process grid of `n` ranks, as balanced as its factors allow (MPI_Dims_create): largest first. */
export function dims3(n: number): [number, number, number] {
  const d: [number, number, number] = [1, 1, 1];
  // Each prime factor, largest first, goes to the dimension with the fewest ranks so far.
  const primes: number[] = [];
  for (let m = n, p = 2; m > 1;) {
    if (m % p === 0) {
      primes.push(p);
      m /= p;
    } else p++;
  }
  for (const p of primes.reverse()) {
    const i = d.indexOf(Math.min(...d));
    d[i] *= p;
  }
  return d.sort((a, b) => b - a);
}
