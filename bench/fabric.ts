// npm run bench:fabric: the libfabric transport against libfabric's own fi_pingpong
// (Debian's libfabric-bin) over the same provider (tcp, FI_EP_MSG) on loopback, in one run:
// small-message latency (one way) and large-message bandwidth, resident and with faults, in
// stall mode (RMA writes) and terminate mode (engine packets), and the all-to-all program at 2
// and 8 ranks (run -n N) for the same bytes per rank pair; interleaved rounds, medians.
// Every side is a real process; the JSON goes to bench-fabric.json in the working directory.
import type { ChildProcess, ChildProcessByStdio } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { line, print, target } from '../examples/support/format.js';
import { progress } from '../examples/support/progress.js';
import { defaultResults, machineInfo } from './faults.js';
import { ownFolder, spawnOwned } from './interrupt.js';

export interface FabricBenchOptions {
  small: number;
  large: number;
  iters: number;
  /** Interleaved rounds whose medians are reported (default 3). */
  rounds?: number;
  /** Where the JSON goes (default bench-fabric.json in the working directory); false: not written. */
  json?: string | false;
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
}

/** The all-to-all rows: bytes each rank writes to each other rank, and iterations. */
const ALLTOALL_BYTES = 64 * 1024;
const ALLTOALL_ITERS = 20;

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MAIN = join(ROOT, 'dist/cli/main.js');

function run(cmd: string, args: string[], timeoutMs = 300_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const c = spawnOwned(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] }) as ChildProcessByStdio<null, Readable, Readable>;
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
}

/** One of our programs as server and client processes; the client's --json results. */
async function ours(program: string, size: number, iters: number, flags: string[], dir: string): Promise<Ours> {
  let sout = '';
  const server = spawnOwned(process.execPath, [MAIN, program, '-p', '0'], { stdio: ['ignore', 'pipe', 'pipe'] }) as ChildProcessByStdio<
    null,
    Readable,
    Readable
  >;
  server.stdout.on('data', (d: Buffer) => (sout += d.toString()));
  try {
    const port = (await waitFor(() => sout, /port (\d+)/))[1]!;
    const json = join(dir, `${program}-${size}-${flags.join('')}.json`);
    const args = [MAIN, program, '127.0.0.1', '-p', port, '-s', String(size), '-n', String(iters), '--json', json, ...flags];
    const c = await run(process.execPath, args);
    if (c.code !== 0) throw new Error(`bench:fabric: ${program} ${flags.join(' ')} failed:\n${c.out}`);
    type Time = { faults: number; totalUs: number } | undefined;
    const r = (
      JSON.parse(readFileSync(json, 'utf8')) as {
        results: {
          row: Record<string, number>;
          faultTime?: Time;
          evictUs?: number;
          peer?: { faultTime?: Time; evictUs?: number };
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
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/**
 * The all-to-all program as a job of `ranks` processes (`run -n RANKS -- alltoall`), resident
 * buffers: the typical time of one rank's write to one other rank, µs (an iteration's typical
 * time, its slowest rank's, over the ranks - 1 writes each rank makes in it).
 */
async function alltoall(ranks: number, size: number, iters: number, dir: string): Promise<number> {
  const json = join(dir, `alltoall-${ranks}.json`);
  const args = [MAIN, 'run', '-n', String(ranks), '--', 'alltoall', '--no-evict', '-s', String(size), '-n', String(iters), '--json', json];
  const c = await run(process.execPath, args);
  if (c.code !== 0) throw new Error(`bench:fabric: run -n ${ranks} -- alltoall failed:\n${c.out}`);
  const rows = (JSON.parse(readFileSync(json, 'utf8')) as { results: { rows: Array<{ typical: number }> } }).results.rows;
  return rows.at(-1)!.typical / (ranks - 1);
}

/** A measurement: how to take it once, and which kind of figure it gives. */
interface Case {
  what: string;
  size: number;
  kind: 'latency' | 'bandwidth';
  take: () => Promise<number>;
  /** Rows with faults: each round's measured fault time and count per work request (both sides). */
  faults?: Array<{ us: number; count: number; evictUs: number }>;
}

/** Take one of our runs, keeping its fault time in `c.faults`. */
function faulting(c: Omit<Case, 'take' | 'faults'>, run: () => Promise<Ours>, figure: (o: Ours) => number): Case {
  const faults: NonNullable<Case['faults']> = [];
  return {
    ...c,
    faults,
    take: async () => {
      const o = await run();
      faults.push({ us: o.faultUsPerOp, count: o.faultsPerOp, evictUs: o.evictUsPerOp });
      return figure(o);
    },
  };
}

export async function benchFabric(
  o: FabricBenchOptions,
): Promise<{ rows: Row[]; ratios: Record<string, number>; explained: Record<string, number> }> {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-bench-fabric-'));
  const owned = ownFolder(dir);
  const rounds = o.rounds ?? 3;
  const bwIters = Math.max(10, Math.floor(o.iters / 10));
  try {
    // Stall mode is an RDMA WRITE as a libfabric RMA write (the provider moves the bytes, as
    // fi_pingpong's); a write completes when the target has placed it (a round trip), so its
    // one-way figure is half of it, as perftest's write_lat reports. Terminate mode carries
    // every message through the modelled engine as packets (the thesis's design).
    const cases: Case[] = [
      { what: 'fi_pingpong tcp msg', size: o.small, kind: 'latency', take: async () => (await fiPingpong(o.small, o.iters)).latencyUs },
      { what: 'fi_pingpong tcp msg', size: o.large, kind: 'bandwidth', take: async () => (await fiPingpong(o.large, bwIters)).mbPerSec },
      {
        what: 'write-lat --stall resident (RMA, rtt/2)',
        size: o.small,
        kind: 'latency',
        take: async () => (await ours('write-lat', o.small, o.iters, ['--stall'], dir)).row.typical! / 2,
      },
      {
        what: 'write-bw --stall resident (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, ['--stall'], dir)).row.bwAverage!,
      },
      {
        what: 'write-bw --stall faults at the server (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, ['--stall', '--evict'], dir)).row.bwAverage!,
      },
      {
        what: 'send-lat resident (engine)',
        size: o.small,
        kind: 'latency',
        take: async () => (await ours('send-lat', o.small, o.iters, [], dir)).row.typical!,
      },
      faulting(
        { what: 'send-lat faults at both ends (engine)', size: o.small, kind: 'latency' },
        () => ours('send-lat', o.small, o.iters, ['--evict'], dir),
        (r) => r.row.typical!,
      ),
      {
        what: 'write-bw resident (engine)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, [], dir)).row.bwAverage!,
      },
      faulting(
        { what: 'write-bw faults at both ends (engine)', size: o.large, kind: 'bandwidth' },
        () => ours('write-bw', o.large, bwIters, ['--evict'], dir),
        (r) => r.row.bwAverage!,
      ),
      {
        what: 'read-bw --stall resident (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('read-bw', o.large, bwIters, ['--stall'], dir)).row.bwAverage!,
      },
      // The same bytes per rank pair at 2 and 8 ranks (each rank writes to every other).
      ...[2, 8].map((ranks): Case => ({
        what: `alltoall ${ranks} ranks, per transfer (engine)`,
        size: ALLTOALL_BYTES,
        kind: 'latency',
        take: () => alltoall(ranks, ALLTOALL_BYTES, ALLTOALL_ITERS, dir),
      })),
    ];
    // Interleaved rounds (the machine is shared and noisy): every case once per round, medians.
    const samples = cases.map(() => [] as number[]);
    // The run time is not known before a round is measured (it depends on the machine and its
    // load): said up front as what it is made of, then after each round what is left.
    print(
      `${rounds} rounds of ${cases.length} runs (${cases.length - 2} of them two processes of this program, two run jobs, ` +
        `two fi_pingpong pairs), each a few seconds on a quiet machine: minutes in all; the time left is printed after each round.`,
    );
    const live = process.stderr.isTTY === true;
    const bar = progress(rounds * cases.length, 'bench-fabric');
    const started = performance.now();
    try {
      for (let r = 0; r < rounds; r++) {
        for (const [i, c] of cases.entries()) {
          const v = await c.take();
          samples[i]!.push(v);
          // No bar in a log or a pipe: a line per run as it finishes instead.
          if (!live) line(`round ${r + 1}/${rounds}: ${c.what}, ${c.size} B: ${v.toFixed(2)} ${c.kind === 'latency' ? 'us one way' : 'MB/sec'}`);
          bar.tick(i + 1 < cases.length ? `round ${r + 1}/${rounds}: ${cases[i + 1]!.what}` : `round ${r + 1}/${rounds} done`);
        }
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
    }));
    const fiLat = rows[0]!.latencyUs!;
    const fiBw = rows[1]!.mbPerSec!;
    const ratios = {
      latencyStallVsFiPingpong: rows[2]!.latencyUs! / fiLat,
      bandwidthStallVsFiPingpong: rows[3]!.mbPerSec! / fiBw,
      bandwidthStallEvictedVsFiPingpong: rows[4]!.mbPerSec! / fiBw,
      latencyEngineVsFiPingpong: rows[5]!.latencyUs! / fiLat,
      latencyEngineFaultsVsFiPingpong: rows[6]!.latencyUs! / fiLat,
      bandwidthEngineVsFiPingpong: rows[7]!.mbPerSec! / fiBw,
      bandwidthEngineFaultsVsFiPingpong: rows[8]!.mbPerSec! / fiBw,
      bandwidthStallReadVsFiPingpong: rows[9]!.mbPerSec! / fiBw,
      alltoallPerTransfer8vs2Ranks: rows[11]!.latencyUs! / rows[10]!.latencyUs!,
    };
    // Faults at both ends: is the extra time what the faults themselves took (their count times
    // each one's measured time), or the path's? A send-lat round trip is two messages (one way: half).
    const lat = { extra: rows[6]!.latencyUs! - rows[5]!.latencyUs!, faults: rows[6]!.faults! };
    const perWrite = (mbPerSec: number) => o.large / mbPerSec;
    const bw = { extra: perWrite(rows[8]!.mbPerSec!) - perWrite(rows[7]!.mbPerSec!), faults: rows[8]!.faults! };
    const explained = {
      latencyExtraUs: lat.extra,
      latencyFaultUs: lat.faults.usPerOp / 2,
      latencyFaults: lat.faults.perOp / 2,
      latencyExtraVsFaultTime: lat.extra / (lat.faults.usPerOp / 2),
      latencyEvictUs: lat.faults.evictUsPerOp / 2,
      bandwidthExtraUsPerWrite: bw.extra,
      bandwidthFaultUsPerWrite: bw.faults.usPerOp,
      bandwidthFaultsPerWrite: bw.faults.perOp,
      bandwidthExtraVsFaultTime: bw.extra / bw.faults.usPerOp,
      bandwidthEvictUsPerWrite: bw.faults.evictUsPerOp,
    };
    line(`The median of ${rounds} rounds:`);
    line(`${'what'.padEnd(43)} ${'bytes'.padStart(8)} ${'usec 1-way'.padStart(10)} ${'MB/sec'.padStart(9)}`);
    for (const r of rows)
      line(
        `${r.what.padEnd(43)} ${String(r.size).padStart(8)} ${(r.latencyUs?.toFixed(2) ?? '').padStart(10)} ${(r.mbPerSec?.toFixed(2) ?? '').padStart(9)}`,
      );
    const x = (v: number) => `${v.toFixed(2)}x`;
    print(
      `stall mode (RMA): latency ${x(ratios.latencyStallVsFiPingpong)} fi_pingpong's ${target(ratios.latencyStallVsFiPingpong, '<=', 1.5, 'x')}; ` +
        `bandwidth ${x(ratios.bandwidthStallVsFiPingpong)} ${target(ratios.bandwidthStallVsFiPingpong, '>=', 0.7, 'x')}, ` +
        `${x(ratios.bandwidthStallEvictedVsFiPingpong)} with faults at the server; reads ${x(ratios.bandwidthStallReadVsFiPingpong)}`,
    );
    print(
      `terminate mode (engine packets): latency ${x(ratios.latencyEngineVsFiPingpong)} ${target(ratios.latencyEngineVsFiPingpong, '<=', 2, 'x')} ` +
        `(${x(ratios.latencyEngineFaultsVsFiPingpong)} with faults); bandwidth ${x(ratios.bandwidthEngineVsFiPingpong)} ` +
        `${target(ratios.bandwidthEngineVsFiPingpong, '>=', 0.5, 'x')} (${x(ratios.bandwidthEngineFaultsVsFiPingpong)} with faults)`,
    );
    const each = (us: number, n: number) => (n ? (us / n).toFixed(1) : '-');
    print(
      `faults at both ends (terminate mode): send-lat +${explained.latencyExtraUs.toFixed(1)} us one way against ` +
        `${explained.latencyFaults.toFixed(2)} faults x ${each(explained.latencyFaultUs, explained.latencyFaults)} us measured in them = ` +
        `${explained.latencyFaultUs.toFixed(1)} us (${x(explained.latencyExtraVsFaultTime)}), and ${explained.latencyEvictUs.toFixed(1)} us evicting; ` +
        `write-bw +${explained.bandwidthExtraUsPerWrite.toFixed(1)} us per write against ` +
        `${explained.bandwidthFaultsPerWrite.toFixed(1)} faults x ${each(explained.bandwidthFaultUsPerWrite, explained.bandwidthFaultsPerWrite)} us = ` +
        `${explained.bandwidthFaultUsPerWrite.toFixed(1)} us (${x(explained.bandwidthExtraVsFaultTime)}; the faults of writes in flight overlap), ` +
        `and ${explained.bandwidthEvictUsPerWrite.toFixed(1)} us evicting`,
    );
    print(
      `all-to-all (resident, ${ALLTOALL_BYTES} bytes per rank pair): per transfer at 8 ranks ${x(ratios.alltoallPerTransfer8vs2Ranks)} that at 2 ` +
        `${target(ratios.alltoallPerTransfer8vs2Ranks, '<=', 1.3, 'x')}`,
    );
    line(
      `load average: ${loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')} on ${cpus().length} CPUs`,
    );
    if (o.json !== false) {
      const file = o.json ?? defaultResults(ROOT, 'fabric.json');
      writeFileSync(file, JSON.stringify({ machine: machineInfo(ROOT), loadavg: loadavg(), options: o, rows, ratios, explained }, null, 2) + '\n');
      console.error(`results: ${file}`);
    }
    return { rows, ratios, explained };
  } finally {
    rmSync(dir, { recursive: true, force: true });
    owned.forget();
  }
}
