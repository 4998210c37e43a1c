// The application kernels (cli/apps/) at small sizes, as ranks of one process: each one's
// result checked value for value, faults counted on every rank under `touch` with buffers
// evicted every step (none under pin), the remote policy's pages fetched from a real memory
// server (and a page it lost failing loudly), and the verdict's figures from the trials. Then
// processes of a job: halo under `pagefault-rdma run -n 3` and under mpich's `mpiexec -n 3`
// (skipped with the reason when mpiexec is not hydra, unless CI is set); and the command's
// refusals of bad options.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { APPS, type AppName } from '../../cli/apps/apps.js';
import { TrialBuffers } from '../../cli/apps/buffers.js';
import { RemoteMemory, type AppPolicy } from '../../cli/apps/policy.js';
import appProgram from '../../cli/commands/app.js';
import { addProgram } from '../../cli/program.js';
import { Completions } from '../../cli/apps/kernel.js';
import { startMemoryServer, type MemoryServerProcess } from '../../cli/programs/support/memory-server.js';
import { PAGE_SIZE, SendFlags, WrOpcode } from '../../lib/index.js';
import { judge, runKernel, verdictPlot, type Trial } from '../../cli/apps/runner.js';
import { renderSvg } from '../../cli/programs/support/plot.js';
import { dims3 } from '../../cli/apps/kernel.js';
import { exchangeBuffers, localWorlds } from '../../cli/apps/world.js';
import { requireDist } from '../child.js';
import { ci, freePort, MAIN, start } from '../fabric/spawn.js';
import { until } from '../helpers.js';

const mpiexec = spawnSync('mpiexec', ['--version'], { encoding: 'utf8' });
const hydra = mpiexec.status === 0 && /HYDRA/.test(mpiexec.stdout);
const SMALL: Record<AppName, number> = { halo: 6, allreduce: 3000, transpose: 8, kv: 64 };
let dir: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-apps-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe.each(Object.keys(APPS) as AppName[])('%s on 4 ranks in one process', (name) => {
  test('verifies every value; touch with evicted buffers faults on every rank, every step; pin never', async () => {
    const app = APPS[name];
    const worlds = await localWorlds(4);
    try {
      const steps = 4;
      const r = await runKernel({
        app: name,
        kernel: app.kernel as never,
        params: app.params(SMALL[name]) as never,
        policies: ['pin', 'touch'],
        runs: 1,
        steps,
        evictEachStep: true,
        warmUp: false,
        worlds,
        size: 4,
      });
      expect(r.verified).toBe(true);
      for (const t of r.trials) {
        expect(t.mismatches).toBe(0);
        expect(t.stepUs).toHaveLength(steps);
        expect(t.faultsPerRank).toHaveLength(4);
      }
      const [pin, touch] = (['pin', 'touch'] as const).map((p) => r.trials.find((t) => t.policy === p)!);
      // The values checked: the halo's blocks, or every step's vector / rows.
      // The kernels' results; kv's GETs are random (its SETs are checked by the GETs after them).
      const perRank: Record<Exclude<AppName, 'kv'>, number> = {
        halo: SMALL.halo ** 3 * 8,
        allreduce: SMALL.allreduce * 8 * steps,
        transpose: SMALL.transpose * 4 * SMALL.transpose * 8 * steps,
      };
      if (name === 'kv') expect(touch!.bytesVerified).toBeGreaterThan(0);
      else expect(touch!.bytesVerified).toBe(4 * perRank[name]);
      expect(pin!.faultsPerRank).toEqual([0, 0, 0, 0]);
      expect(Math.min(...touch!.faultsPerRank)).toBeGreaterThan(0);
      // Evicted before every step: the steps after the first two fault too.
      expect(touch!.faultsSteady).toBeGreaterThan(0);
      expect(r.verdicts.map((v) => v.policy)).toEqual(['touch']);
      expect(r.verdicts[0]!.ratios).toHaveLength(1);
    } finally {
      worlds[0]!.cluster.close();
    }
  });
});

test('without eviction the buffers fault in the first two steps only', async () => {
  const worlds = await localWorlds(2);
  try {
    const r = await runKernel({
      app: 'halo',
      kernel: APPS.halo.kernel,
      params: { n: 4 },
      policies: ['touch'],
      runs: 1,
      steps: 5,
      evictEachStep: false,
      warmUp: false,
      worlds,
      size: 2,
    });
    expect(r.verified).toBe(true);
    expect(Math.min(...r.trials[0]!.faultsPerRank)).toBeGreaterThan(0);
    expect(r.trials[0]!.faultsSteady).toBe(0);
    // The steady steps' CPU, sampled by rank 0 for the process.
    expect(r.trials[0]!.steadyCpu.processMs).toBeGreaterThan(0);
  } finally {
    worlds[0]!.cluster.close();
  }
});

test('kv over its memlock budget: the pinned server refuses the keys past it, the ODP server serves them all', async () => {
  const worlds = await localWorlds(3);
  try {
    const r = await runKernel({
      app: 'kv',
      kernel: APPS.kv.kernel,
      // 64 keys of a page; the pinned server may lock 16 of them.
      params: APPS.kv.params(64, 64),
      policies: ['pin', 'touch-ahead'],
      runs: 1,
      steps: 3,
      evictEachStep: false,
      warmUp: false,
      worlds,
      size: 3,
    });
    expect(r.verified).toBe(true);
    const [pin, odp] = (['pin', 'touch-ahead'] as const).map((p) => r.trials.find((t) => t.policy === p)!);
    expect(pin!.refused).toBeGreaterThan(0);
    expect(odp!.refused).toBe(0);
    expect(odp!.opsPerSecond).toBeGreaterThan(0);
    // The server (rank 0) faults its store in on demand.
    expect(odp!.faultsPerRank[0]).toBeGreaterThan(0);
  } finally {
    worlds[0]!.cluster.close();
  }
});

describe('remote paging: buffers on a memory server', () => {
  let server: MemoryServerProcess;
  beforeAll(async () => {
    requireDist(); // the server is the built CLI's memory-server
    server = await startMemoryServer();
  });
  afterAll(() => server.dispose());

  test.each(['halo', 'kv'] as const)('%s: every step fetches its pages from the server, every value verified', async (name) => {
    const worlds = await localWorlds(3);
    for (const w of worlds) w.remote = new RemoteMemory(server.socket, `apps-test-${w.rank}`);
    try {
      // One step after the first two is enough to see the steady state fetch (kv's steps are 128 operations).
      const steps = name === 'kv' ? 3 : 4;
      const r = await runKernel({
        app: name,
        kernel: APPS[name].kernel as never,
        // kv: 64 keys of a page, of which 16 may stay resident (what a pinned server could lock).
        params: (name === 'kv' ? APPS.kv.params(64, 64) : APPS.halo.params(4)) as never,
        policies: ['pin', 'remote'],
        runs: 2,
        steps,
        evictEachStep: false,
        warmUp: false,
        worlds,
        size: 3,
      });
      expect(r.verified).toBe(true);
      const remote = r.trials.filter((t) => t.policy === 'remote');
      expect(remote).toHaveLength(2);
      for (const t of remote) {
        expect(t.mismatches).toBe(0);
        expect(t.refused).toBe(0);
        // Evicted to the server before every step: the steady steps fault and fetch too, on every rank.
        expect(t.faultsSteady).toBeGreaterThan(0);
        expect(Math.min(...t.pagesFetched)).toBeGreaterThan(0);
      }
      for (const t of r.trials.filter((x) => x.policy === 'pin')) expect(t.pagesFetched).toEqual([0, 0, 0]);
      if (name === 'kv') expect(r.trials.find((t) => t.policy === 'pin')!.refused).toBeGreaterThan(0);
      expect(r.verdicts[0]!.cause).toMatch(/pages per step \(all ranks\) fetched from the memory server$/);
    } finally {
      for (const w of worlds) await w.remote?.close();
      worlds[0]!.cluster.close();
    }
  });

  test('a page the server lost is an error completion and a store error, never zeros', async () => {
    const worlds = await localWorlds(2);
    for (const w of worlds) w.remote = new RemoteMemory(server.socket, `apps-lost-${w.rank}`);
    const [w0, w1] = worlds as [(typeof worlds)[0], (typeof worlds)[0]];
    const mine = new TrialBuffers(w0, 'pin', false);
    const theirs = new TrialBuffers(w1, 'remote', false);
    try {
      const local = await mine.map(4 * PAGE_SIZE);
      const paged = await theirs.map(4 * PAGE_SIZE);
      new Uint8Array(paged.region.buffer).fill(0x5c);
      await theirs.evict(); // every page on the server now
      const [, at] = await Promise.all([exchangeBuffers(w0, local.mr), exchangeBuffers(w1, paged.mr)]);
      // A restarted server holds no pages: the ones rank 1 stored are gone.
      await server.stop('SIGKILL');
      await server.start();
      w0.qps[1]!.postSend({
        wrId: 1,
        opcode: WrOpcode.RDMA_READ,
        sgList: [{ addr: local.mr.addr, length: 4 * PAGE_SIZE, lkey: local.mr.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: at[1]!.addr, rkey: at[1]!.rkey },
      });
      await expect(new Completions(w0).wait(1, 0, 0)).rejects.toMatchObject({ code: 'ERR_PFR_ACCESS_FAILED' });
      await until('the store error', () => {
        try {
          w1.remote!.check();
          return false;
        } catch {
          return true;
        }
      });
      expect(() => w1.remote!.check()).toThrow(expect.objectContaining({ code: expect.stringMatching(/^ERR_PFR_(PAGE_LOST|STORE_UNAVAILABLE)$/) }));
    } finally {
      await mine.release();
      await theirs.release();
      for (const w of worlds) await w.remote?.close();
      worlds[0]!.cluster.close();
    }
  });
});

test('dims3 splits ranks as evenly as their factors allow', () => {
  expect(dims3(1)).toEqual([1, 1, 1]);
  expect(dims3(8)).toEqual([2, 2, 2]);
  expect(dims3(12)).toEqual([3, 2, 2]);
  expect(dims3(16)).toEqual([4, 2, 2]);
  expect(dims3(7)).toEqual([7, 1, 1]);
});

test('the verdict: ratios per run against pin, within the noise or not, and why; its plot', async () => {
  const trial = (run: number, policy: AppPolicy, stepUs: number[], faultsSteady = 0, mainThreadMs = 1): Trial => ({
    run,
    policy,
    stepUs,
    firstStepUs: stepUs[0]!,
    medianStepUs: stepUs[1]!,
    faultsPerRank: [1],
    faultPathUs: faultsSteady * 100,
    faultsSteady,
    pagesFetched: [0],
    steadyCpu: { processMs: mainThreadMs + 0.5, mainThreadMs, otherThreadsMs: 0.5 },
    bytesVerified: 8,
    mismatches: 0,
    opsPerSecond: 0,
    refused: 0,
    cpu: [{ processMs: 10, userMs: 8, systemMs: 2, mainThreadMs: 9, otherThreadsMs: {} }],
  });
  const trials = [
    trial(1, 'pin', [50, 100, 100]),
    trial(1, 'touch-ahead', [90, 102, 102]),
    trial(1, 'touch', [90, 200, 200], 8),
    trial(2, 'pin', [50, 104, 104]),
    trial(2, 'touch-ahead', [90, 101, 101]),
    trial(2, 'touch', [90, 210, 210], 8),
    // No faults after the first steps, 50 µs longer: with 0.05 ms more main-thread CPU per step, and with none.
    trial(1, 'prefault', [90, 150, 150], 0, 1.05),
    trial(2, 'prefault', [90, 150, 150], 0, 1.05),
    trial(1, 'prefetch', [90, 150, 150]),
    trial(2, 'prefetch', [90, 150, 150]),
  ];
  const [ta, touch, prefault, prefetch] = judge(trials, ['pin', 'touch-ahead', 'touch', 'prefault', 'prefetch'], 3);
  expect(ta!.ratios.map((x) => +x.toFixed(3))).toEqual([1.02, 0.971]);
  expect(ta!.withinNoise).toBe(true);
  expect(touch!.withinNoise).toBe(false);
  expect(touch!.cause).toMatch(/^8\.0 faults per step after the first 2 \(all ranks\), each 800 µs from detection/);
  expect(prefault!.withinNoise).toBe(false);
  expect(prefault!.cause).toMatch(
    /^no faults after the first 2 steps; .*\(main thread \+0\.05 ms, .*the main thread's extra CPU \(0\.05 ms\) is most of the extra 0\.05 ms per step$/,
  );
  expect(prefetch!.cause).toMatch(/neither faults nor CPU account for the extra 0\.05 ms per step/);
  // --plot: a point per policy and run, a bar per policy.
  const svg = await renderSvg(
    verdictPlot({
      app: 'halo',
      ranks: 2,
      where: 'nodes in one process',
      steps: 3,
      evictEachStep: false,
      trials,
      verdicts: [ta!, touch!],
      verified: true,
    }),
  );
  const marks = (type: string): number =>
    (svg.match(new RegExp(`<g class="mark-${type} role-mark[^"]*"[^>]*>(.*?)</g>`, 's'))?.[1]?.match(/<path/g) ?? []).length;
  expect(marks('symbol')).toBe(4);
  expect(marks('rect')).toBe(2);
});

test('the verdict from many runs: one run the machine disturbed does not make the noise', () => {
  const trial = (run: number, policy: AppPolicy, medianStepUs: number): Trial => ({
    run,
    policy,
    stepUs: [2 * medianStepUs, medianStepUs, medianStepUs],
    firstStepUs: 2 * medianStepUs,
    medianStepUs,
    faultsPerRank: [1],
    faultPathUs: 0,
    faultsSteady: 0,
    pagesFetched: [0],
    steadyCpu: { processMs: 1, mainThreadMs: 1, otherThreadsMs: 0 },
    bytesVerified: 8,
    mismatches: 0,
    opsPerSecond: 0,
    refused: 0,
    cpu: [],
  });
  // Nine interleaved runs: a machine that was 40 % slower for whole runs (both policies' steps
  // with it), touch-ahead within ±2 % of pin in each but one, where its step took 1.8×.
  const pin = [1000, 1400, 990, 1405, 995, 1000, 1412, 988, 1003];
  const ta = [1005, 1400, 985, 1400, 1000, 1800, 1412, 995, 1003];
  const trials = pin.flatMap((p, i) => [trial(i + 1, 'pin', p), trial(i + 1, 'touch-ahead', ta[i]!)]);
  const [v] = judge(trials, ['pin', 'touch-ahead'], 3);
  expect(v!.slowdown).toBeCloseTo(1, 2);
  expect(v!.noise).toBeLessThan(0.05);
  expect(v!.noise).toBeGreaterThan(0);
  expect(v!.withinNoise).toBe(true);
  // Three runs: the range still stands for the noise, the outlier in it.
  const [few] = judge(
    trials.filter((t) => t.run >= 5 && t.run <= 7),
    ['pin', 'touch-ahead'],
    3,
  );
  expect(few!.noise).toBeGreaterThan(0.3);
});

describe('the command', () => {
  beforeAll(() => requireDist());

  // The command as main.ts builds it, in this process (its errors thrown, not exiting): a refusal comes before any rank starts.
  test.each([
    [['nosuch'], /unknown application 'nosuch' \(choose from halo, allreduce, transpose, kv\)/],
    [['allreduce', '-n', '1'], /--ranks: a ring allreduce needs at least 2 ranks/],
    [['halo', '--size', '1'], /--size: the halo's block needs at least 2 points per axis/],
    [['halo', '--policies', 'pin,bogus'], /--policies.*unknown policy 'bogus' \(choose from pin, prefault, touch, touch-ahead, prefetch, remote\)/],
    [['halo', '-n', '65'], /--ranks: at most 64 ranks in one process/],
    [['allreduce', '-n', '4', '--size', '3'], /--size: each of the 4 ranks needs a chunk/],
    [['kv', '-n', '1'], /--ranks: a key-value job needs a server and at least one client/],
    [['kv', '--memlock', '0'], /--memlock/],
  ])('app %j is refused, naming the option', async (args, message) => {
    let stderr = '';
    const cli = new Command('pagefault-rdma').exitOverride().configureOutput({ writeErr: (s) => void (stderr += s), writeOut: () => undefined });
    addProgram(cli, appProgram as never);
    await expect(cli.parseAsync(['app', ...args], { from: 'user' })).rejects.toMatchObject({ exitCode: 1 });
    expect(stderr).toMatch(message);
  });

  test('as processes of a job: run -n 3 -- app halo verifies, counts faults per rank, rank 0 writes --json', async () => {
    const json = join(dir, 'halo.json');
    const e = await start([
      'run',
      '-n',
      '3',
      '--timeout',
      '60',
      '--',
      'app',
      'halo',
      '-s',
      '4',
      '--steps',
      '3',
      '--runs',
      '1',
      '--policies',
      'pin,touch',
      '--no-warm-up',
      '--json',
      json,
    ]).exit;
    expect(e.stderr).not.toMatch(/Error/);
    expect(e.code).toBe(0);
    const r = jobResults(json, 3, 'pagefault-rdma run');
    const touch = r.trials.find((t) => t.policy === 'touch')!;
    expect(Math.min(...touch.faultsPerRank)).toBeGreaterThan(0);
    expect(touch.bytesVerified).toBe(3 * 4 ** 3 * 8);
  }, 90_000);

  test.skipIf(!hydra && !ci)(
    "under mpiexec -n 3 (mpich's hydra: PMI_RANK, PMI_SIZE): halo, its buffers paged from rank 0's memory server, verified",
    async () => {
      expect(hydra, "mpiexec is mpich's hydra (CI installs the mpich package)").toBe(true);
      const json = join(dir, 'mpiexec.json');
      const rendezvous = `127.0.0.1:${await freePort()}`;
      const args = ['app', 'halo', '-s', '4', '--steps', '3', '--runs', '1', '--policies', 'pin,remote', '--no-warm-up'];
      const e = await start([...args, '--rendezvous', rendezvous, '--json', json], { command: ['mpiexec', '-n', '3', process.execPath, MAIN] }).exit;
      expect(e.stderr).toBe(`results: ${json}\n`);
      expect(e.code).toBe(0);
      const r = jobResults(json, 3, 'mpich (hydra)');
      const [pin, remote] = (['pin', 'remote'] as const).map((p) => r.trials.find((t) => t.policy === p)!);
      // Every rank (a process) fetched its pages from the one server rank 0 started, in the steady steps too.
      expect(Math.min(...remote!.pagesFetched)).toBeGreaterThan(0);
      expect(remote!.faultsSteady).toBeGreaterThan(0);
      expect(pin!.pagesFetched).toEqual([0, 0, 0]);
    },
    90_000,
  );
});

/** A job's --json (rank 0's): `ranks` processes started by `launcher`, every value verified, faults and CPU of every rank. */
function jobResults(json: string, ranks: number, launcher: string): { trials: Trial[] } {
  const r = (JSON.parse(readFileSync(json, 'utf8')) as { results: { ranks: number; where: string; verified: boolean; trials: Trial[] } }).results;
  expect(r.ranks).toBe(ranks);
  expect(r.where).toBe(launcher);
  expect(r.verified).toBe(true);
  for (const t of r.trials) {
    expect(t.faultsPerRank).toHaveLength(ranks);
    // A job's CPU is per process: one sample per rank.
    expect(t.cpu).toHaveLength(ranks);
  }
  return r;
}
