// A benchmark interrupted (SIGTERM as timeout sends it, SIGINT as Ctrl-C does) leaves nothing
// behind: no child process (found by an environment marker every descendant inherits, so an
// orphan reparented to init is found too) and no temporary folder; it exits 143 / 130 without
// a stack. And without a terminal it says up front what the run is made of.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { requireDist, ROOT } from './child.js';

const MAIN = join(ROOT, 'dist/cli/main.js');
const hasFi = readdirSync('/usr/bin').includes('fi_pingpong');
let dir: string;
beforeAll(() => {
  requireDist();
  dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-bench-int-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Pids of the processes whose environment holds `marker`. */
function marked(marker: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (readFileSync(`/proc/${p}/environ`, 'latin1').includes(marker)) out.push(Number(p));
    } catch {
      // gone, or not ours
    }
  }
  return out;
}

const until = async (ok: () => boolean, ms: number): Promise<boolean> => {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 100))) if (ok()) return true;
  return ok();
};

describe.skipIf(!hasFi)('bench-fabric interrupted', () => {
  test.each([
    ['SIGTERM', 143],
    ['SIGINT', 130],
  ] as const)(
    '%s while its children run: they are killed, its temporary folder removed, exit %i',
    async (signal, code) => {
      const tmp = mkdtempSync(join(dir, 'tmp-'));
      const marker = `PFR_BENCH_INTERRUPT_TEST=${process.pid}-${signal}`;
      const [k, v] = marker.split('=') as [string, string];
      const b = spawn(process.execPath, [MAIN, 'bench-fabric', '-r', '1', '-n', '200000'], {
        cwd: tmp,
        env: { ...process.env, TMPDIR: tmp, [k]: v },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      b.stdout.on('data', (d: Buffer) => (out += d.toString()));
      b.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<number | null>((resolve) => b.on('exit', (c) => resolve(c)));
      // Its children: at least the two fi_pingpong processes of the first run.
      expect(await until(() => marked(marker).filter((p) => p !== b.pid).length >= 2, 60_000), 'children started').toBe(true);
      expect(readdirSync(tmp).filter((f) => f.startsWith('pfr-bench-fabric-'))).toHaveLength(1);
      b.kill(signal);
      expect(await exited).toBe(code);
      expect(await until(() => marked(marker).length === 0, 5000), `left: ${marked(marker).join(' ')}`).toBe(true);
      expect(readdirSync(tmp)).toEqual([]); // no temporary folder, no JSON
      expect(err).not.toMatch(/\n\s+at /); // no stack
      expect(out.replace(/\s+/g, ' ')).toMatch(/1 rounds of \d+ runs .* the time left is printed after each round\./);
    },
    120_000,
  );
});

/** Pids of the processes whose working directory is under `dir` (redis-server runs in its --dir). */
function under(dir: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (readlinkSync(`/proc/${p}/cwd`).startsWith(dir + '/')) out.push(Number(p));
    } catch {
      // gone, or not ours
    }
  }
  return out;
}

// bench-remote's children: redis-server (which overwrites its environment with its process
// title, so it is found by its working directory, its --dir), a Redis cluster's masters when
// redis-cli is there, a memory-server (a node process: found by the marker), the C program.
describe('bench-remote interrupted', () => {
  test.each([
    ['SIGTERM', 143],
    ['SIGINT', 130],
  ] as const)(
    '%s while its redis-server and memory server run: they are killed, their folders removed, exit %i',
    async (signal, code) => {
      const tmp = mkdtempSync(join(dir, 'tmp-'));
      const marker = `PFR_BENCH_INTERRUPT_TEST=${process.pid}-remote-${signal}`;
      const [k, v] = marker.split('=') as [string, string];
      const b = spawn(process.execPath, [MAIN, 'bench-remote', '--pages', '4096', '--rounds', '50'], {
        cwd: tmp,
        env: { ...process.env, TMPDIR: tmp, [k]: v },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      b.stdout.on('data', (d: Buffer) => (out += d.toString()));
      b.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<number | null>((resolve) => b.on('exit', (c) => resolve(c)));
      // Every server up and the measuring begun (its first line printed after they start).
      const started = () =>
        out.includes('Remote paging, the major fault') &&
        under(tmp).length >= 1 &&
        marked(marker).filter((p) => p !== b.pid).length >= 1 &&
        readdirSync(tmp).some((f) => f.startsWith('pfr-br-'));
      expect(await until(started, 60_000), `children started: ${readdirSync(tmp).join(' ')}\n${out}${err}`).toBe(true);
      b.kill(signal);
      expect(await exited, err).toBe(code);
      const left = () => [...marked(marker), ...under(tmp)];
      expect(await until(() => left().length === 0, 5000), `left: ${left().join(' ')}`).toBe(true);
      expect(readdirSync(tmp)).toEqual([]); // no folder of redis, the memory server or the build; no JSON
      expect(err).not.toMatch(/\n\s+at /); // no stack
    },
    90_000,
  );
});

describe('bench-faults', () => {
  test("without --json: its JSON in the working directory (not the package), the package's version printed", () => {
    const cwd = mkdtempSync(join(dir, 'cwd-'));
    const args = ['bench-faults', '--pages', '64', '--rounds', '1', '--placements', 'free', '--pages-per-fault', '1', '--no-relay'];
    const r = spawnSync(process.execPath, [MAIN, ...args], { cwd, encoding: 'utf8', timeout: 120_000 });
    expect(r.status, r.stderr).toBe(0);
    const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    expect(r.stdout.replace(/\s+/g, ' ')).toContain(`pagefault-rdma ${version}`);
    expect(readdirSync(cwd)).toEqual(['bench-faults.json']);
    const doc = JSON.parse(readFileSync(join(cwd, 'bench-faults.json'), 'utf8')) as { machine: { version: string } };
    expect(doc.machine.version).toBe(version);
    expect(r.stdout).toContain('JSON: bench-faults.json');
  }, 120_000);
});
