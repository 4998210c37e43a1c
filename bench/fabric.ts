// npm run bench:fabric: the libfabric transport against libfabric's own fi_pingpong
// (Debian's libfabric-bin, when installed) over the same provider (tcp, FI_EP_MSG) on loopback,
// in one run: small-message latency (one way) and large-message bandwidth, resident and with
// faults, in stall mode (RMA writes) and terminate mode (engine packets), each progress mode
// (--progress adaptive, poll, wait) side by side, the CPU both processes spent per iteration
// (their --json results' cpuUs), and the all-to-all program at 2 and 8 ranks (run -n N), with
// and without a CPU per rank (--pin), for the same bytes per rank pair; interleaved rounds,
// medians, the load average of each round. Every side is a real process; the JSON goes where
// the user is (./bench-fabric.json, or --json FILE), never into the package. A signal kills
// every child's process group and removes the temp folder.
import type { ChildProcess, ChildProcessByStdio } from 'node:child_process';
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { line, print, target } from '../cli/programs/support/format.js';
import { progress } from '../cli/programs/support/progress.js';
import { machineInfo } from './faults.js';
import { ownFolder, spawnOwned } from './interrupt.js';

export interface FabricBenchOptions {
  small: number;
  large: number;
  iters: number;
  /** Interleaved rounds whose medians are reported (default 3). */
  rounds?: number;
  /** Where the JSON goes (default ./bench-fabric.json, in the directory npm or the shell was run from); false: not written. */
  json?: string | false;
}

/** CPU (user + system, every thread) each process spent per iteration of the client (a round trip of send-lat, a write of write-bw), µs. */
export interface CpuPerOp {
  client: number;
  server: number;
}

export interface Row {
  what: string;
  size: number;
  /** One-way latency, µs (fi_pingpong's usec/xfer; ours: round trip / 2). */
  latencyUs?: number;
  mbPerSec?: number;
  /** Every round's figure (the row shows their median). */
  samples: number[];
  /** Rows with faults: both sides' faults per work request, and their measured time per work request, µs (medians of the rounds). */
  faults?: { perOp: number; usPerOp: number; evictUsPerOp: number };
  /** Our programs: each side's CPU per iteration, µs (medians); all-to-all: the median rank's CPU per transfer (as `client`). */
  cpuUsPerOp?: CpuPerOp;
  /** All-to-all: the median rank's CPU per transfer between the barriers around the writes, µs (the rest of cpuUsPerOp is filling, checking, the first barrier). */
  writeCpuUsPerTransfer?: number;
  /** Our programs: how the client's write payloads past the batch were sent (lent from their pages, or copied), summed over the rounds. */
  sends?: { lent: number; copied: number; lentBytes: number; copiedBytes: number };
}

/** Whether `cmd` is an executable on PATH. */
function installed(cmd: string): boolean {
  return (process.env.PATH ?? '').split(delimiter).some((dir) => {
    try {
      accessSync(join(dir, cmd), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** Where the JSON goes by default: the directory the user ran the command from (npm run changes cwd to the package; INIT_CWD is where it was run). */
export function defaultFabricJson(): string {
  return join(process.env.INIT_CWD ?? process.cwd(), 'bench-fabric.json');
}

/** The all-to-all rows: bytes each rank writes to each other rank, and iterations. */
const ALLTOALL_BYTES = 64 * 1024;
const ALLTOALL_ITERS = 20;

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MAIN = join(ROOT, 'dist/cli/main.js');

function run(cmd: string, args: string[], env: Record<string, string> = {}, timeoutMs = 300_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const c = spawnOwned(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } }) as ChildProcessByStdio<
      null,
      Readable,
      Readable
    >;
    let out = '';
    c.stdout.on('data', (d: Buffer) => (out += d.toString()));
    c.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => c.kill('SIGKILL'), timeoutMs);
    c.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(e.code === 'ENOENT' ? new Error(`bench:fabric: ${cmd} is not installed (Debian: apt-get install libfabric-bin)`) : e);
    });
    c.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

async function waitFor(get: () => string, re: RegExp): Promise<RegExpExecArray> {
  for (let i = 0; i < 600; i++) {
    const m = re.exec(get());
    if (m) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`bench:fabric: timed out waiting for ${re}`);
}

/**
 * fi_pingpong -p tcp -e msg -I iters -S size: its client's result line. Its columns: bytes,
 * #sent, #ack, total (both directions), time, MB/sec (total / time), usec/xfer (time /
 * (2 × iters): one way), Mxfers/sec. Without -I it runs 10 iterations, whose first one carries
 * the connection's warm-up: the ~1 ms "latency" of a bare fi_pingpong.
 */
async function fiPingpong(size: number, iters: number): Promise<{ latencyUs: number; mbPerSec: number }> {
  const port = String(20000 + Math.floor(Math.random() * 20000));
  const common = ['-p', 'tcp', '-e', 'msg', '-I', String(iters), '-S', String(size)];
  const server = run('fi_pingpong', [...common, '-B', port]);
  await new Promise((r) => setTimeout(r, 500));
  const client = await run('fi_pingpong', [...common, '-P', port, '127.0.0.1']);
  await server;
  const line = client.out.trim().split('\n').pop() ?? '';
  const cols = line.trim().split(/\s+/);
  if (client.code !== 0 || cols.length < 8) throw new Error(`bench:fabric: fi_pingpong failed:\n${client.out}`);
  return { mbPerSec: Number(cols[5]), latencyUs: Number(cols[6]) };
}

/** A run of one of our programs: the client's result row, and the measured time of both sides' faults per work request, µs. */
interface Ours {
  row: Record<string, number>;
  faultUsPerOp: number;
  faultsPerOp: number;
  /** --evict: both sides' time dropping their buffers' pages, per work request, µs. */
  evictUsPerOp: number;
  /** Each process's CPU per work request, µs. */
  cpu: CpuPerOp;
  /** The client's payload sends: lent (no staging copy) or copied. */
  sends?: { lent: number; copied: number; lentBytes: number; copiedBytes: number };
}

/** One of our programs as server and client processes (the server with `serverFlags` too); the client's --json results. */
async function ours(
  program: string,
  size: number,
  iters: number,
  flags: string[],
  dir: string,
  serverFlags: string[] = [],
  env: Record<string, string> = {},
): Promise<Ours> {
  let sout = '';
  const server = spawnOwned(process.execPath, [MAIN, program, '-p', '0', ...serverFlags], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  }) as ChildProcessByStdio<null, Readable, Readable>;
  server.stdout.on('data', (d: Buffer) => (sout += d.toString()));
  try {
    const port = (await waitFor(() => sout, /port (\d+)/))[1]!;
    const json = join(dir, `${program}-${size}-${flags.join('')}.json`);
    const args = [MAIN, program, '127.0.0.1', '-p', port, '-s', String(size), '-n', String(iters), '--json', json, ...flags];
    const c = await run(process.execPath, args, env);
    if (c.code !== 0) throw new Error(`bench:fabric: ${program} ${flags.join(' ')} failed:\n${c.out}`);
    type Time = { faults: number; totalUs: number } | undefined;
    const r = (
      JSON.parse(readFileSync(json, 'utf8')) as {
        results: {
          row: Record<string, number>;
          faultTime?: Time;
          evictUs?: number;
          cpuUs?: number;
          sends?: { lent: number; copied: number; lentBytes: number; copiedBytes: number };
          peer?: { faultTime?: Time; evictUs?: number; cpuUs?: number };
        };
      }
    ).results;
    const n = r.row.iterations || 1;
    const sides = [r.faultTime, r.peer?.faultTime];
    return {
      row: r.row,
      faultUsPerOp: sides.reduce((t, f) => t + (f?.totalUs ?? 0), 0) / n,
      faultsPerOp: sides.reduce((t, f) => t + (f?.faults ?? 0), 0) / n,
      evictUsPerOp: ((r.evictUs ?? 0) + (r.peer?.evictUs ?? 0)) / n,
      cpu: { client: (r.cpuUs ?? 0) / n, server: (r.peer?.cpuUs ?? 0) / n },
      ...(r.sends ? { sends: r.sends } : {}),
    };
  } finally {
    await stop(server);
  }
}

/**
 * End a server that normally ends by itself once its client is done. A signal that lands
 * while it exits can hang it for good (libinfinipath's handler, loaded with libfabric, calls
 * exit() inside the interrupted free(): seen here), so it gets time first; then SIGTERM, then SIGKILL.
 */
async function stop(c: ChildProcess): Promise<void> {
  const exited = new Promise<void>((resolve) => (c.exitCode !== null || c.signalCode !== null ? resolve() : c.once('exit', () => resolve())));
  const within = (ms: number) =>
    Promise.race([exited.then(() => true), new Promise<boolean>((resolve) => setTimeout(() => resolve(false), ms).unref())]);
  if (await within(3000)) return;
  c.kill('SIGTERM');
  if (await within(3000)) return;
  c.kill('SIGKILL');
  await exited;
}

function median(xs: number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/**
 * The all-to-all program as a job of `ranks` processes (`run -n RANKS [--pin] -- alltoall`),
 * resident buffers: the typical time of one rank's write to one other rank, µs (an
 * iteration's typical time, its slowest rank's, over the ranks - 1 writes each rank makes in
 * it), and the median rank's CPU per transfer, µs: all of it, and the part between the barriers around the writes.
 */
async function alltoall(
  ranks: number,
  size: number,
  iters: number,
  dir: string,
  pin: boolean,
): Promise<{ us: number; cpuUs: number; writeCpuUs: number }> {
  const json = join(dir, `alltoall-${ranks}${pin ? '-pin' : ''}.json`);
  const args = [
    MAIN,
    'run',
    '-n',
    String(ranks),
    ...(pin ? ['--pin'] : []),
    '--',
    'alltoall',
    '--no-evict',
    '-s',
    String(size),
    '-n',
    String(iters),
    '--json',
    json,
  ];
  const c = await run(process.execPath, args);
  if (c.code !== 0) throw new Error(`bench:fabric: run -n ${ranks}${pin ? ' --pin' : ''} -- alltoall failed:\n${c.out}`);
  const r = (
    JSON.parse(readFileSync(json, 'utf8')) as {
      results: { rows: Array<{ typical: number }>; ranks: Array<{ cpuUs: number; writeCpuUs?: number; transfers: number }> };
    }
  ).results;
  const perRank = r.ranks.filter((x) => x.transfers > 0).map((x) => x.cpuUs / x.transfers);
  const inWrites = r.ranks.filter((x) => x.transfers > 0).map((x) => (x.writeCpuUs ?? 0) / x.transfers);
  return {
    us: r.rows.at(-1)!.typical / (ranks - 1),
    cpuUs: perRank.length ? median(perRank) : 0,
    writeCpuUs: inWrites.length ? median(inWrites) : 0,
  };
}

/** A measurement: how to take it once, and which kind of figure it gives. */
interface Case {
  /** The row's name in `ratios` and `explained`. */
  key: string;
  what: string;
  size: number;
  kind: 'latency' | 'bandwidth';
  take: () => Promise<number>;
  /** Rows with faults: each round's measured fault time and count per work request (both sides). */
  faults?: Array<{ us: number; count: number; evictUs: number }>;
  /** Each round's CPU per work request of each process. */
  cpu?: CpuPerOp[];
  /** Each round's client payload sends (lent or copied). */
  sends?: NonNullable<Ours['sends']>[];
  /** All-to-all: each round's median rank's CPU per transfer in the writes. */
  writeCpu?: number[];
}

/** Take one of our runs, keeping its CPU per work request (and, with `withFaults`, its fault time). */
function oursCase(c: Omit<Case, 'take' | 'faults' | 'cpu'>, run: () => Promise<Ours>, figure: (o: Ours) => number, withFaults = false): Case {
  const faults: NonNullable<Case['faults']> = [];
  const cpu: CpuPerOp[] = [];
  const sends: NonNullable<Case['sends']> = [];
  return {
    ...c,
    ...(withFaults ? { faults } : {}),
    cpu,
    sends,
    take: async () => {
      const o = await run();
      if (withFaults) faults.push({ us: o.faultUsPerOp, count: o.faultsPerOp, evictUs: o.evictUsPerOp });
      cpu.push(o.cpu);
      if (o.sends) sends.push(o.sends);
      return figure(o);
    },
  };
}

/** A faulting row none of whose rounds gave a figure. */
const NO_FAULTS = { perOp: NaN, usPerOp: NaN, evictUsPerOp: NaN };

const loads = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');

export async function benchFabric(o: FabricBenchOptions): Promise<{
  rows: Row[];
  ratios: Record<string, number>;
  explained: Record<string, number>;
  loadavg: { start: number[]; rounds: number[][] };
  fiPingpong: boolean;
  /** Runs that failed and were taken once more. */
  retried: Array<{ round: number; what: string; why: string }>;
}> {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-bench-fabric-'));
  const owned = ownFolder(dir);
  const rounds = o.rounds ?? 3;
  const bwIters = Math.max(10, Math.floor(o.iters / 10));
  const fi = installed('fi_pingpong');
  const start = loadavg();
  line(
    `load average at the start: ${loads()} on ${cpus().length} CPUs${fi ? '' : '; fi_pingpong not installed (Debian: apt-get install libfabric-bin): no fi_pingpong rows, no ratios'}`,
  );
  try {
    // Stall mode is an RDMA WRITE as a libfabric RMA write (the provider moves the bytes, as
    // fi_pingpong's); a write completes when the target has placed it (a round trip), so its
    // one-way figure is half of it, as perftest's write_lat reports. Terminate mode carries
    // every message through the modelled engine as packets (the thesis's design). The progress
    // rows give both processes the same --progress (the mode decides how each waits for its
    // answers); the rows without one are adaptive, the default.
    const lat = (
      key: string,
      what: string,
      program: string,
      flags: string[],
      figure: (o: Ours) => number,
      serverFlags: string[] = [],
      withFaults = false,
    ): Case =>
      oursCase({ key, what, size: o.small, kind: 'latency' }, () => ours(program, o.small, o.iters, flags, dir, serverFlags), figure, withFaults);
    const bw = (key: string, what: string, program: string, flags: string[], withFaults = false, env: Record<string, string> = {}): Case =>
      oursCase(
        { key, what, size: o.large, kind: 'bandwidth' },
        () => ours(program, o.large, bwIters, flags, dir, [], env),
        (r) => r.row.bwAverage!,
        withFaults,
      );
    const half = (r: Ours) => r.row.typical! / 2;
    const typical = (r: Ours) => r.row.typical!;
    const progressRows = (['poll', 'wait'] as const).flatMap((mode) => [
      lat(`stallLat_${mode}`, `write-lat --stall --progress ${mode}`, 'write-lat', ['--stall', '--progress', mode], half, ['--progress', mode]),
      lat(`engineLat_${mode}`, `send-lat --progress ${mode} (engine)`, 'send-lat', ['--progress', mode], typical, ['--progress', mode]),
    ]);
    const cases: Case[] = [
      ...(fi
        ? [
            {
              key: 'fiLat',
              what: 'fi_pingpong tcp msg',
              size: o.small,
              kind: 'latency' as const,
              take: async () => (await fiPingpong(o.small, o.iters)).latencyUs,
            },
            {
              key: 'fiBw',
              what: 'fi_pingpong tcp msg',
              size: o.large,
              kind: 'bandwidth' as const,
              take: async () => (await fiPingpong(o.large, bwIters)).mbPerSec,
            },
          ]
        : []),
      lat('stallLat', 'write-lat --stall resident (RMA)', 'write-lat', ['--stall'], half),
      bw('stallBw', 'write-bw --stall resident (RMA)', 'write-bw', ['--stall']),
      bw('stallBwEvict', 'write-bw --stall, server faults (RMA)', 'write-bw', ['--stall', '--evict']),
      lat('engineLat', 'send-lat resident (engine)', 'send-lat', [], typical),
      lat('engineLatFaults', 'send-lat faults at both ends (engine)', 'send-lat', ['--evict'], typical, [], true),
      bw('engineBw', 'write-bw resident (engine)', 'write-bw', []),
      // The same with every payload copied into the send buffer (as before sends lent their pages).
      bw('engineBwCopied', 'write-bw resident, sends copied (engine)', 'write-bw', [], false, { PFR_FABRIC_COPY_SENDS: '1' }),
      bw('engineBwFaults', 'write-bw faults at both ends (engine)', 'write-bw', ['--evict'], true),
      bw('stallReadBw', 'read-bw --stall resident (RMA)', 'read-bw', ['--stall']),
      ...progressRows,
      // The same bytes per rank pair at 2 and 8 ranks (each rank writes to every other), free
      // to run anywhere and pinned to a CPU each (rank modulo the CPUs).
      ...[2, 8].flatMap((ranks) =>
        [false, true].map((pin): Case => {
          const cpu: CpuPerOp[] = [];
          const writeCpu: number[] = [];
          return {
            key: `alltoall${ranks}${pin ? 'Pin' : ''}`,
            what: `alltoall ${ranks} ranks${pin ? ' --pin' : ''}, per transfer`,
            size: ALLTOALL_BYTES,
            kind: 'latency',
            cpu,
            writeCpu,
            take: async () => {
              const a = await alltoall(ranks, ALLTOALL_BYTES, ALLTOALL_ITERS, dir, pin);
              cpu.push({ client: a.cpuUs, server: 0 });
              writeCpu.push(a.writeCpuUs);
              return a.us;
            },
          };
        }),
      ),
    ];
    // Interleaved rounds (the machine is shared and noisy): every case once per round, medians.
    const samples = cases.map(() => [] as number[]);
    const roundLoads: number[][] = [];
    const retried: Array<{ round: number; what: string; why: string }> = [];
    // The run time is not known before a round is measured (it depends on the machine and its
    // load): said up front as what it is made of, then after each round what is left.
    print(
      `${rounds} rounds of ${cases.length} runs (pairs of this program's processes, run jobs and, when installed, ` +
        `fi_pingpong pairs), each a few seconds on a quiet machine: minutes in all; the time left is printed after each round.`,
    );
    const live = process.stderr.isTTY === true;
    const bar = progress(rounds * cases.length, 'bench-fabric');
    const started = performance.now();
    try {
      for (let r = 0; r < rounds; r++) {
        for (const [i, c] of cases.entries()) {
          // A run that fails (on a loaded machine an 8-rank job's connections can time out) is
          // taken once more; failing again, the round has no figure for it. Both are said, in
          // the output and the JSON: a row's figure is the median of the rounds it has.
          const why = (e: unknown) =>
            ((e instanceof Error ? e.message : String(e)).split('\n').find((l) => /fail|cannot|timed out|went away/.test(l)) ?? String(e)).trim();
          try {
            const v = await c.take();
            samples[i]!.push(v);
            // No bar in a log or a pipe: a line per run as it finishes instead.
            if (!live) line(`round ${r + 1}/${rounds}: ${c.what}, ${c.size} B: ${v.toFixed(2)} ${c.kind === 'latency' ? 'us one way' : 'MB/sec'}`);
          } catch (e) {
            try {
              samples[i]!.push(await c.take());
              retried.push({ round: r + 1, what: c.what, why: why(e) });
            } catch (e2) {
              retried.push({ round: r + 1, what: c.what, why: `${why(e)}; again: ${why(e2)}; no figure this round` });
            }
          }
          bar.tick(i + 1 < cases.length ? `round ${r + 1}/${rounds}: ${cases[i + 1]!.what}` : `round ${r + 1}/${rounds} done`);
        }
        roundLoads.push(loadavg());
        const s = (performance.now() - started) / 1000;
        if (r + 1 < rounds)
          line(`round ${r + 1} of ${rounds} done after ${s.toFixed(0)} s; about ${((s / (r + 1)) * (rounds - r - 1)).toFixed(0)} s left`);
      }
    } finally {
      bar.stop();
    }
    const rows: Row[] = cases.map((c, i) => ({
      what: c.what,
      size: c.size,
      ...(c.kind === 'latency' ? { latencyUs: median(samples[i]!) } : { mbPerSec: median(samples[i]!) }),
      samples: samples[i]!,
      ...(c.faults?.length
        ? {
            faults: {
              perOp: median(c.faults.map((f) => f.count)),
              usPerOp: median(c.faults.map((f) => f.us)),
              evictUsPerOp: median(c.faults.map((f) => f.evictUs)),
            },
          }
        : {}),
      ...(c.cpu?.length ? { cpuUsPerOp: { client: median(c.cpu.map((x) => x.client)), server: median(c.cpu.map((x) => x.server)) } } : {}),
      ...(c.writeCpu?.length ? { writeCpuUsPerTransfer: median(c.writeCpu) } : {}),
      ...(c.sends?.length
        ? {
            sends: c.sends.reduce(
              (t, x) => ({
                lent: t.lent + x.lent,
                copied: t.copied + x.copied,
                lentBytes: t.lentBytes + x.lentBytes,
                copiedBytes: t.copiedBytes + x.copiedBytes,
              }),
              { lent: 0, copied: 0, lentBytes: 0, copiedBytes: 0 },
            ),
          }
        : {}),
    }));
    const at = (key: string): Row => rows[cases.findIndex((c) => c.key === key)]!;
    const ratios: Record<string, number> = {
      alltoallPerTransfer8vs2Ranks: at('alltoall8').latencyUs! / at('alltoall2').latencyUs!,
      alltoallPinnedPerTransfer8vs2Ranks: at('alltoall8Pin').latencyUs! / at('alltoall2Pin').latencyUs!,
      alltoall8PinnedVsFree: at('alltoall8Pin').latencyUs! / at('alltoall8').latencyUs!,
    };
    if (fi) {
      const fiLat = at('fiLat').latencyUs!;
      const fiBw = at('fiBw').mbPerSec!;
      Object.assign(ratios, {
        latencyStallVsFiPingpong: at('stallLat').latencyUs! / fiLat,
        bandwidthStallVsFiPingpong: at('stallBw').mbPerSec! / fiBw,
        bandwidthStallEvictedVsFiPingpong: at('stallBwEvict').mbPerSec! / fiBw,
        latencyEngineVsFiPingpong: at('engineLat').latencyUs! / fiLat,
        latencyEngineFaultsVsFiPingpong: at('engineLatFaults').latencyUs! / fiLat,
        bandwidthEngineVsFiPingpong: at('engineBw').mbPerSec! / fiBw,
        bandwidthEngineFaultsVsFiPingpong: at('engineBwFaults').mbPerSec! / fiBw,
        bandwidthStallReadVsFiPingpong: at('stallReadBw').mbPerSec! / fiBw,
      });
      for (const mode of ['poll', 'wait']) {
        ratios[`latencyStall_${mode}VsFiPingpong`] = at(`stallLat_${mode}`).latencyUs! / fiLat;
        ratios[`latencyEngine_${mode}VsFiPingpong`] = at(`engineLat_${mode}`).latencyUs! / fiLat;
      }
    }
    // Faults at both ends: is the extra time what the faults themselves took (their count times
    // each one's measured time), or the path's? A send-lat round trip is two messages (one way: half).
    const latF = { extra: at('engineLatFaults').latencyUs! - at('engineLat').latencyUs!, faults: at('engineLatFaults').faults ?? NO_FAULTS };
    const perWrite = (mbPerSec: number) => o.large / mbPerSec;
    const bwF = {
      extra: perWrite(at('engineBwFaults').mbPerSec!) - perWrite(at('engineBw').mbPerSec!),
      faults: at('engineBwFaults').faults ?? NO_FAULTS,
    };
    // The evicting is inside the measured time too (each side drops its buffer's pages in the
    // loop, before each message): what is left after the faults and the evicting is the remainder.
    const explained: Record<string, number> = {
      latencyExtraUs: latF.extra,
      latencyFaultUs: latF.faults.usPerOp / 2,
      latencyFaults: latF.faults.perOp / 2,
      latencyExtraVsFaultTime: latF.extra / (latF.faults.usPerOp / 2),
      latencyEvictUs: latF.faults.evictUsPerOp / 2,
      latencyRemainderUs: latF.extra - latF.faults.usPerOp / 2 - latF.faults.evictUsPerOp / 2,
      latencyExtraVsFaultAndEvictTime: latF.extra / ((latF.faults.usPerOp + latF.faults.evictUsPerOp) / 2),
      // The CPU the faults add, per round trip, both processes: what a 2-core machine pays for them.
      latencyExtraCpuUs:
        (at('engineLatFaults').cpuUsPerOp?.client ?? NaN) +
        (at('engineLatFaults').cpuUsPerOp?.server ?? NaN) -
        (at('engineLat').cpuUsPerOp?.client ?? NaN) -
        (at('engineLat').cpuUsPerOp?.server ?? NaN),
      bandwidthExtraUsPerWrite: bwF.extra,
      bandwidthFaultUsPerWrite: bwF.faults.usPerOp,
      bandwidthFaultsPerWrite: bwF.faults.perOp,
      bandwidthExtraVsFaultTime: bwF.extra / bwF.faults.usPerOp,
      bandwidthEvictUsPerWrite: bwF.faults.evictUsPerOp,
    };
    line(`The median of ${rounds} rounds (write-lat --stall: rtt/2; RMA: the provider moves the bytes;`);
    line('engine: modelled packets; CPU: microseconds each process spent per iteration):');
    line(
      `${'what'.padEnd(37)} ${'bytes'.padStart(7)} ${'us 1-way'.padStart(8)} ${'MB/sec'.padStart(8)} ${'CPU cli'.padStart(7)} ${'CPU srv'.padStart(7)}`,
    );
    const cpuCell = (r: Row, side: keyof CpuPerOp) =>
      r.cpuUsPerOp && (side === 'client' || !r.what.startsWith('alltoall')) ? r.cpuUsPerOp[side].toFixed(1) : '';
    for (const r of rows)
      line(
        `${r.what.padEnd(37)} ${String(r.size).padStart(7)} ${(r.latencyUs?.toFixed(2) ?? '').padStart(8)} ${(r.mbPerSec?.toFixed(2) ?? '').padStart(8)} ${cpuCell(r, 'client').padStart(7)} ${cpuCell(r, 'server').padStart(7)}`,
      );
    line(
      "CPU/iter: user + system CPU of each process (every thread) from the handshake to the end over the iterations (setup included: amortised over -n) per iteration (send-lat: a round trip, write-lat: a write and its completion, write-bw: a write); all-to-all: the median rank's per transfer, in its iterations",
    );
    line(
      `load average with these figures: ${loads()} on ${cpus().length} CPUs (after each round: ${roundLoads.map((l) => l[0]!.toFixed(2)).join(', ')})`,
    );
    for (const t of retried) line(`retried: round ${t.round}, ${t.what}: ${t.why}`);
    const x = (v: number) => `${v.toFixed(2)}x`;
    const modes = (key: string) =>
      ['', '_poll', '_wait']
        .map(
          (m) =>
            `${m ? m.slice(1) : 'adaptive'} ${at(key + m).latencyUs!.toFixed(1)} us (CPU ${(at(key + m).cpuUsPerOp?.client ?? NaN).toFixed(0)}+${(at(key + m).cpuUsPerOp?.server ?? NaN).toFixed(0)} us)`,
        )
        .join(', ');
    print(`progress modes, one way: RMA ${modes('stallLat')}; engine ${modes('engineLat')}`);
    print(
      `all-to-all (resident, ${ALLTOALL_BYTES} bytes per rank pair): per transfer at 8 ranks ${x(ratios.alltoallPerTransfer8vs2Ranks!)} that at 2 ` +
        `${target(ratios.alltoallPerTransfer8vs2Ranks!, '<=', 1.3, 'x')}; pinned ${x(ratios.alltoallPinnedPerTransfer8vs2Ranks!)} ` +
        `${target(ratios.alltoallPinnedPerTransfer8vs2Ranks!, '<=', 1.3, 'x')}; 8 ranks pinned ${x(ratios.alltoall8PinnedVsFree!)} free`,
    );
    // All-to-all is CPU-bound: each of R ranks makes R - 1 transfers an iteration at c µs of CPU
    // each between the barriers around the writes, on C CPUs, so one transfer takes at least
    // R c / min(R, C) of wall time (c: the median rank's, so about).
    const ncpu = cpus().length;
    const floor = (key: string, ranks: number) => ((at(key).writeCpuUsPerTransfer ?? NaN) * ranks) / Math.min(ranks, ncpu);
    for (const key of ['alltoall2', 'alltoall2Pin', 'alltoall8', 'alltoall8Pin'])
      explained[`${key}CpuFloorUs`] = floor(key, key.startsWith('alltoall8') ? 8 : 2);
    print(
      `all-to-all, CPU per transfer per rank (median rank; in the writes, between their barriers) and the wall time that CPU needs on ${ncpu} CPUs (R x CPU / min(R, CPUs)): ` +
        ['alltoall2', 'alltoall2Pin', 'alltoall8', 'alltoall8Pin']
          .map(
            (key) =>
              `${key.replace('alltoall', '').replace('Pin', ' pinned')} ranks ${(at(key).cpuUsPerOp?.client ?? NaN).toFixed(0)} us CPU ` +
              `(${(at(key).writeCpuUsPerTransfer ?? NaN).toFixed(0)} in the writes), ` +
              `floor ${explained[`${key}CpuFloorUs`]!.toFixed(0)} us, measured ${at(key).latencyUs!.toFixed(0)} us (${x(at(key).latencyUs! / explained[`${key}CpuFloorUs`]!)})`,
          )
          .join('; '),
    );
    const sent = at('engineBw').sends;
    if (sent)
      print(
        `sends without a staging copy: write-bw resident lent ${sent.lent} payloads (${(sent.lentBytes / 2 ** 20).toFixed(0)} MiB) and copied ${sent.copied}; ` +
          `CPU per write lent ${(at('engineBw').cpuUsPerOp?.client ?? NaN).toFixed(0)}+${(at('engineBw').cpuUsPerOp?.server ?? NaN).toFixed(0)} us, ` +
          `copied (PFR_FABRIC_COPY_SENDS=1) ${(at('engineBwCopied').cpuUsPerOp?.client ?? NaN).toFixed(0)}+${(at('engineBwCopied').cpuUsPerOp?.server ?? NaN).toFixed(0)} us; ` +
          `${at('engineBw').mbPerSec!.toFixed(0)} against ${at('engineBwCopied').mbPerSec!.toFixed(0)} MB/sec`,
      );
    const each = (us: number, n: number) => (n ? (us / n).toFixed(1) : '-');
    print(
      `faults at both ends (terminate mode): send-lat +${explained.latencyExtraUs.toFixed(1)} us one way against ` +
        `${explained.latencyFaults.toFixed(2)} faults x ${each(explained.latencyFaultUs, explained.latencyFaults)} us measured in them = ` +
        `${explained.latencyFaultUs.toFixed(1)} us (${x(explained.latencyExtraVsFaultTime)}), and ${explained.latencyEvictUs.toFixed(1)} us evicting; ` +
        `remainder ${explained.latencyRemainderUs.toFixed(1)} us (extra ${x(explained.latencyExtraVsFaultAndEvictTime)} the faults and the evicting; ` +
        `+${explained.latencyExtraCpuUs.toFixed(0)} us CPU per round trip, both processes); ` +
        `write-bw +${explained.bandwidthExtraUsPerWrite.toFixed(1)} us per write against ` +
        `${explained.bandwidthFaultsPerWrite.toFixed(1)} faults x ${each(explained.bandwidthFaultUsPerWrite, explained.bandwidthFaultsPerWrite)} us = ` +
        `${explained.bandwidthFaultUsPerWrite.toFixed(1)} us (${x(explained.bandwidthExtraVsFaultTime)}; the faults of writes in flight overlap), ` +
        `and ${explained.bandwidthEvictUsPerWrite.toFixed(1)} us evicting`,
    );
    if (fi) {
      const r = (k: string) => ratios[k]!;
      print(
        `stall mode (RMA): latency ${x(r('latencyStallVsFiPingpong'))} fi_pingpong's ${target(r('latencyStallVsFiPingpong'), '<=', 1.5, 'x')}; ` +
          `bandwidth ${x(r('bandwidthStallVsFiPingpong'))} ${target(r('bandwidthStallVsFiPingpong'), '>=', 0.8, 'x')}, ` +
          `${x(r('bandwidthStallEvictedVsFiPingpong'))} with faults at the server; reads ${x(r('bandwidthStallReadVsFiPingpong'))}`,
      );
      print(
        `terminate mode (engine packets): latency ${x(r('latencyEngineVsFiPingpong'))} ${target(r('latencyEngineVsFiPingpong'), '<=', 3, 'x')} ` +
          `(${x(r('latencyEngineFaultsVsFiPingpong'))} with faults); bandwidth ${x(r('bandwidthEngineVsFiPingpong'))} ` +
          `${target(r('bandwidthEngineVsFiPingpong'), '>=', 0.5, 'x')} (${x(r('bandwidthEngineFaultsVsFiPingpong'))} with faults)`,
      );
      print(
        `progress modes against fi_pingpong: RMA poll ${x(r('latencyStall_pollVsFiPingpong'))}, wait ${x(r('latencyStall_waitVsFiPingpong'))}; ` +
          `engine poll ${x(r('latencyEngine_pollVsFiPingpong'))}, wait ${x(r('latencyEngine_waitVsFiPingpong'))} ` +
          `(read ratios only from a run whose fi_pingpong rows are near their quiet values)`,
      );
    }
    const load = { start, rounds: roundLoads };
    if (o.json !== false) {
      const file = o.json ?? defaultFabricJson();
      writeFileSync(
        file,
        JSON.stringify({ machine: machineInfo(ROOT), loadavg: load, options: o, fiPingpong: fi, retried, rows, ratios, explained }, null, 2) + '\n',
      );
      console.error(`results: ${file}`);
    }
    return { rows, ratios, explained, loadavg: load, fiPingpong: fi, retried };
  } finally {
    rmSync(dir, { recursive: true, force: true });
    owned.forget();
  }
}
