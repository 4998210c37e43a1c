// npm run bench:fabric: the libfabric transport against libfabric's own fi_pingpong
// (Debian's libfabric-bin) over the same provider (tcp, FI_EP_MSG) on loopback, in one run:
// small-message latency (one way) and large-message bandwidth, resident and with faults at
// both ends. Every side is a real process; the JSON goes to bench/results/fabric.json.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defaultResults, machineInfo } from './faults.js';

export interface FabricBenchOptions {
  small: number;
  large: number;
  iters: number;
  /** Where the JSON goes (default bench/results/fabric.json); false: not written. */
  json?: string | false;
}

export interface Row {
  what: string;
  size: number;
  /** One-way latency, µs (fi_pingpong's usec/xfer; ours: round trip / 2). */
  latencyUs?: number;
  mbPerSec?: number;
}

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

/** fi_pingpong -p tcp -e msg: its last line's MB/sec and usec/xfer. */
async function fiPingpong(size: number, iters: number): Promise<{ latencyUs: number; mbPerSec: number }> {
  const port = String(20000 + Math.floor(Math.random() * 20000));
  const args = ['-p', 'tcp', '-e', 'msg', '-I', String(iters), '-S', String(size), '-B', port];
  const server = run('fi_pingpong', args);
  await new Promise((r) => setTimeout(r, 500));
  const client = await run('fi_pingpong', ['-p', 'tcp', '-e', 'msg', '-I', String(iters), '-S', String(size), '-P', port, '127.0.0.1']);
  await server;
  const line = client.out.trim().split('\n').pop() ?? '';
  const cols = line.trim().split(/\s+/);
  if (client.code !== 0 || cols.length < 8) throw new Error(`bench:fabric: fi_pingpong failed:\n${client.out}`);
  return { mbPerSec: Number(cols[5]), latencyUs: Number(cols[6]) };
}

/** One of our programs as server and client processes; the client's --json results. */
async function ours(
  program: string,
  size: number,
  iters: number,
  evict: boolean,
  dir: string,
): Promise<{ row: Record<string, number>; realUs?: number[] }> {
  let sout = '';
  const server = spawn(process.execPath, [MAIN, program, '-p', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout.on('data', (d: Buffer) => (sout += d.toString()));
  try {
    const port = (await waitFor(() => sout, /port (\d+)/))[1]!;
    const json = join(dir, `${program}-${size}-${evict}.json`);
    const args = [MAIN, program, '127.0.0.1', '-p', port, '-s', String(size), '-n', String(iters), '--out_json', json, ...(evict ? ['--evict'] : [])];
    const c = await run(process.execPath, args);
    if (c.code !== 0) throw new Error(`bench:fabric: ${program} failed:\n${c.out}`);
    return JSON.parse(readFileSync(json, 'utf8')) as { row: Record<string, number> };
  } finally {
    server.kill('SIGTERM');
  }
}

export async function benchFabric(o: FabricBenchOptions): Promise<{ rows: Row[]; ratios: Record<string, number> }> {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-bench-fabric-'));
  try {
    const rows: Row[] = [];
    const fiSmall = await fiPingpong(o.small, o.iters);
    rows.push({ what: 'fi_pingpong tcp msg', size: o.small, latencyUs: fiSmall.latencyUs });
    const fiLarge = await fiPingpong(o.large, Math.max(10, Math.floor(o.iters / 10)));
    rows.push({ what: 'fi_pingpong tcp msg', size: o.large, mbPerSec: fiLarge.mbPerSec });
    for (const evict of [false, true]) {
      const lat = await ours('send-lat', o.small, o.iters, evict, dir);
      rows.push({ what: `send-lat ${evict ? 'faults at both ends' : 'resident'}`, size: o.small, latencyUs: lat.row.typical! });
      const bw = await ours('write-bw', o.large, Math.max(10, Math.floor(o.iters / 10)), evict, dir);
      rows.push({ what: `write-bw ${evict ? 'faults at both ends' : 'resident'}`, size: o.large, mbPerSec: bw.row.bwAverage! });
    }
    const ratios = {
      latencyResidentVsFiPingpong: rows[2]!.latencyUs! / fiSmall.latencyUs,
      bandwidthResidentVsFiPingpong: rows[3]!.mbPerSec! / fiLarge.mbPerSec,
    };
    console.log(`${'what'.padEnd(34)} ${'bytes'.padStart(9)} ${'one way [usec]'.padStart(15)} ${'MB/sec'.padStart(10)}`);
    for (const r of rows)
      console.log(
        `${r.what.padEnd(34)} ${String(r.size).padStart(9)} ${(r.latencyUs?.toFixed(2) ?? '').padStart(15)} ${(r.mbPerSec?.toFixed(2) ?? '').padStart(10)}`,
      );
    console.log(
      `latency ${ratios.latencyResidentVsFiPingpong.toFixed(1)}x fi_pingpong's (target <= 1.5x); bandwidth ${ratios.bandwidthResidentVsFiPingpong.toFixed(2)}x (target >= 0.5x)`,
    );
    if (o.json !== false) {
      const file = o.json ?? defaultResults(ROOT, 'fabric.json');
      writeFileSync(file, JSON.stringify({ machine: machineInfo(ROOT), options: o, rows, ratios }, null, 2) + '\n');
      console.error(`results: ${file}`);
    }
    return { rows, ratios };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
