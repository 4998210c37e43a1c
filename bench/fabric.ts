// npm run bench:fabric: the libfabric transport against libfabric's own fi_pingpong
// (Debian's libfabric-bin) over the same provider (tcp, FI_EP_MSG) on loopback, in one run:
// small-message latency (one way) and large-message bandwidth, resident and with faults, in
// stall mode (RMA writes) and terminate mode (engine packets), and the all-to-all program at 2
// and 8 ranks (run -n N) for the same bytes per rank pair; interleaved rounds, medians.
// Every side is a real process; the JSON goes to bench/results/fabric.json.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { line, print, target } from '../examples/support/format.js';
import { progress } from '../examples/support/progress.js';
import { defaultResults, machineInfo } from './faults.js';

export interface FabricBenchOptions {
  small: number;
  large: number;
  iters: number;
  /** Interleaved rounds whose medians are reported (default 3). */
  rounds?: number;
  /** Where the JSON goes (default bench/results/fabric.json); false: not written. */
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
}

/** The all-to-all rows: bytes each rank writes to each other rank, and iterations. */
const ALLTOALL_BYTES = 64 * 1024;
const ALLTOALL_ITERS = 20;

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MAIN = join(ROOT, 'dist/cli/main.js');

function run(cmd: string, args: string[], timeoutMs = 300_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
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

/** One of our programs as server and client processes; the client's --out_json results. */
async function ours(program: string, size: number, iters: number, flags: string[], dir: string): Promise<Record<string, number>> {
  let sout = '';
  const server = spawn(process.execPath, [MAIN, program, '-p', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout.on('data', (d: Buffer) => (sout += d.toString()));
  try {
    const port = (await waitFor(() => sout, /port (\d+)/))[1]!;
    const json = join(dir, `${program}-${size}-${flags.join('')}.json`);
    const args = [MAIN, program, '127.0.0.1', '-p', port, '-s', String(size), '-n', String(iters), '--out_json', json, ...flags];
    const c = await run(process.execPath, args);
    if (c.code !== 0) throw new Error(`bench:fabric: ${program} ${flags.join(' ')} failed:\n${c.out}`);
    return (JSON.parse(readFileSync(json, 'utf8')) as { row: Record<string, number> }).row;
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
}

export async function benchFabric(o: FabricBenchOptions): Promise<{ rows: Row[]; ratios: Record<string, number> }> {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-bench-fabric-'));
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
        take: async () => (await ours('write-lat', o.small, o.iters, ['--stall'], dir)).typical! / 2,
      },
      {
        what: 'write-bw --stall resident (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, ['--stall'], dir)).bwAverage!,
      },
      {
        what: 'write-bw --stall faults at the server (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, ['--stall', '--evict'], dir)).bwAverage!,
      },
      {
        what: 'send-lat resident (engine)',
        size: o.small,
        kind: 'latency',
        take: async () => (await ours('send-lat', o.small, o.iters, [], dir)).typical!,
      },
      {
        what: 'send-lat faults at both ends (engine)',
        size: o.small,
        kind: 'latency',
        take: async () => (await ours('send-lat', o.small, o.iters, ['--evict'], dir)).typical!,
      },
      {
        what: 'write-bw resident (engine)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, [], dir)).bwAverage!,
      },
      {
        what: 'write-bw faults at both ends (engine)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('write-bw', o.large, bwIters, ['--evict'], dir)).bwAverage!,
      },
      {
        what: 'read-bw --stall resident (RMA)',
        size: o.large,
        kind: 'bandwidth',
        take: async () => (await ours('read-bw', o.large, bwIters, ['--stall'], dir)).bwAverage!,
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
    const bar = progress(rounds * cases.length, 'bench-fabric');
    try {
      for (let r = 0; r < rounds; r++)
        for (const [i, c] of cases.entries()) {
          samples[i]!.push(await c.take());
          bar.tick(i + 1 < cases.length ? `round ${r + 1}/${rounds}: ${cases[i + 1]!.what}` : `round ${r + 1}/${rounds} done`);
        }
    } finally {
      bar.stop();
    }
    const rows: Row[] = cases.map((c, i) => ({
      what: c.what,
      size: c.size,
      ...(c.kind === 'latency' ? { latencyUs: median(samples[i]!) } : { mbPerSec: median(samples[i]!) }),
      samples: samples[i]!,
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
    line(`${'what'.padEnd(42)} ${'bytes'.padStart(9)} ${'one way [usec]'.padStart(15)} ${'MB/sec'.padStart(10)}   (median of ${rounds})`);
    for (const r of rows)
      line(
        `${r.what.padEnd(42)} ${String(r.size).padStart(9)} ${(r.latencyUs?.toFixed(2) ?? '').padStart(15)} ${(r.mbPerSec?.toFixed(2) ?? '').padStart(10)}`,
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
      writeFileSync(file, JSON.stringify({ machine: machineInfo(ROOT), loadavg: loadavg(), options: o, rows, ratios }, null, 2) + '\n');
      console.error(`results: ${file}`);
    }
    return { rows, ratios };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
