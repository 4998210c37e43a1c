// `pagefault-rdma run`'s launcher: a job of N processes on this host, for a user without MPI.
// It does what mpiexec does for lib/job: starts N copies of this CLI with the program's
// arguments, each told its rank, the job's size and rank 0's rendezvous (PFR_RANK, PFR_SIZE,
// PFR_RENDEZVOUS); forwards their output line by line, prefixed by rank; and ends the job as a
// whole: one rank failing (or Ctrl-C, or the timeout) stops the others, and the launcher
// exits non-zero.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { columns } from './programs/support/format.js';

/** What a launch is told to do. */
export interface LaunchOptions {
  /** Processes (ranks). */
  np: number;
  /** The CLI arguments of every rank: the program and its options. */
  args: string[];
  /** The whole job's limit, ms. */
  timeoutMs: number;
  /** Rank 0's rendezvous (default: 127.0.0.1, a port free now). */
  rendezvous?: string;
  /**
   * Pin each rank to one CPU (rank modulo the CPUs this process may use, in order), as
   * mpiexec's `-bind-to core` does: started under util-linux's `taskset -c`.
   */
  pin?: boolean;
  /** After a rank fails, how long the others get to end on their own (they learn it too) before SIGTERM, and SIGKILL after as long again. */
  graceMs?: number;
}

/** How each rank ended, and why the job failed if it did. */
export interface LaunchResult {
  ranks: Array<{ rank: number; code: number | null; signal: NodeJS.Signals | null }>;
  /** Why the job failed (the first rank that failed, the timeout, Ctrl-C); undefined if every rank exited 0. */
  failure?: string;
}

const MAIN = fileURLToPath(new URL('./main.js', import.meta.url));

/** A TCP port free on the loopback now (rank 0 listens on it a moment later). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** The CPUs this process may run on, in order (sched_getaffinity, as `taskset -p` prints them). */
export function allowedCpus(): number[] {
  const r = spawnSync('taskset', ['-cp', String(process.pid)], { encoding: 'utf8' });
  if (r.error || r.status !== 0)
    throw Object.assign(
      new Error(`run --pin: taskset could not run (${r.error?.message ?? r.stderr.trim()}): install util-linux (apt-get install util-linux)`),
      {
        code: 'ENOENT',
      },
    );
  const list = r.stdout.split(':').at(-1)!.trim();
  const cpus: number[] = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let c = a!; c <= (b ?? a!); c++) cpus.push(c);
  }
  return cpus;
}

/** Run the job; resolves once every rank has exited. */
export async function launch(o: LaunchOptions): Promise<LaunchResult> {
  const cpus = o.pin ? allowedCpus() : [];
  const rendezvous = o.rendezvous ?? `127.0.0.1:${await freePort()}`;
  const grace = o.graceMs ?? 3_000;
  const children: ChildProcess[] = [];
  const result: LaunchResult = { ranks: [] };
  const timers: Array<ReturnType<typeof setTimeout>> = [];
  const alive = () => children.filter((c) => c.exitCode === null && c.signalCode === null);
  // The first failure ends the job. A rank's failure reaches the others through the job itself
  // (they fail with its reason, which they print): they get `grace` to do so, then SIGTERM,
  // then SIGKILL. The timeout and Ctrl-C stop them at once.
  const fail = (why: string, now = false) => {
    if (result.failure !== undefined) return;
    result.failure = why;
    const term = () => {
      for (const c of alive()) c.kill('SIGTERM');
      timers.push(setTimeout(() => alive().forEach((c) => c.kill('SIGKILL')), grace));
    };
    if (now) term();
    else timers.push(setTimeout(term, grace));
  };
  const exits = Array.from({ length: o.np }, (_, rank) => {
    const argv = [process.execPath, MAIN, ...o.args];
    if (o.pin) argv.unshift('taskset', '-c', String(cpus[rank % cpus.length]));
    const child = spawn(argv[0]!, argv.slice(1), {
      stdio: ['ignore', 'pipe', 'pipe'],
      // A rank's lines fit the screen with their `[rank] ` prefix: the rank wraps to what is left (COLUMNS).
      env: {
        ...process.env,
        PFR_RANK: String(rank),
        PFR_SIZE: String(o.np),
        PFR_RENDEZVOUS: rendezvous,
        COLUMNS: String(Math.max(40, columns() - `[${rank}] `.length)),
      },
    });
    children.push(child);
    for (const [from, to] of [
      [child.stdout!, process.stdout],
      [child.stderr!, process.stderr],
    ] as const)
      createInterface({ input: from, crlfDelay: Infinity }).on('line', (l) => to.write(`[${rank}] ${l}\n`));
    return new Promise<void>((resolve) => {
      child.once('error', (e) => {
        fail(`rank ${rank} could not start: ${e.message}`);
        result.ranks[rank] = { rank, code: null, signal: null };
        resolve();
      });
      child.once('close', (code, signal) => {
        result.ranks[rank] = { rank, code, signal };
        if (code !== 0) fail(`rank ${rank} ${signal ? `was killed by ${signal}` : `exited with code ${String(code)}`}`);
        resolve();
      });
    });
  });
  timers.push(setTimeout(() => fail(`the job did not finish within ${o.timeoutMs / 1000} s (run --timeout)`, true), o.timeoutMs));
  const onSignal = (sig: NodeJS.Signals) => fail(`interrupted (${sig})`, true);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    await Promise.all(exits);
  } finally {
    for (const t of timers) clearTimeout(t);
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }
  return result;
}
