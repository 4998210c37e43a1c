// Jobs of many processes over libfabric tcp, started as HPC users start them: the all-to-all
// under the built-in `run -n 4` and under mpich's `mpiexec -n 4` (hydra), every byte checked and
// every rank faulting at both ends; and a rank killed mid-job, which every other rank must
// notice by itself and exit non-zero with its reason, and which fails the launcher's job. Under CI (CI set) these run and fail when
// libfabric or mpiexec is missing; elsewhere they are skipped then, with the reason.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { AlltoallResult } from '../../cli/programs/alltoall.js';
import { allowedCpus } from '../../cli/launcher.js';
import { built, ci, freePort, start, waitFor } from '../fabric/spawn.js';

const dir = mkdtempSync(join(tmpdir(), 'pfr-job-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const mpiexec = spawnSync('mpiexec', ['--version'], { encoding: 'utf8' });
const hydra = mpiexec.status === 0 && /HYDRA/.test(mpiexec.stdout);

const RANKS = 4;
const ITERS = 3;
const BLOCK = 16 * 1024;

/** The job's results (rank 0's --json), checked: every rank verified every byte it was sent, and faulted at both ends. */
function checkJob(file: string, launcher: string): AlltoallResult {
  const r = (JSON.parse(readFileSync(file, 'utf8')) as { results: AlltoallResult }).results;
  expect(r.size).toBe(RANKS);
  expect(r.launcher).toBe(launcher);
  expect(r.ranks.map((x) => x.rank)).toEqual([0, 1, 2, 3]);
  for (const x of r.ranks) {
    expect(x.error, `rank ${x.rank}`).toBeUndefined();
    expect(x.bytesVerified, `rank ${x.rank}`).toBe(ITERS * (RANKS - 1) * BLOCK);
    expect(x.mismatches, `rank ${x.rank}`).toBe(0);
    expect(x.iterUs.map((run) => run.length)).toEqual([ITERS]);
    // Evicted before every iteration: its blocks fault when read, its slots when written.
    expect(x.faults.source, `rank ${x.rank}`).toBeGreaterThanOrEqual(ITERS);
    expect(x.faults.destination, `rank ${x.rank}`).toBeGreaterThanOrEqual(ITERS);
    expect(x.nacks, `rank ${x.rank}`).toBeGreaterThan(0);
    // Its CPU in the timed iterations, per write it posted.
    expect(x.transfers, `rank ${x.rank}`).toBe(ITERS * (RANKS - 1));
    expect(x.cpuUs, `rank ${x.rank}`).toBeGreaterThan(0);
  }
  return r;
}

const args = (json: string) => ['alltoall', '-n', String(ITERS), '-s', String(BLOCK), '--json', json];

describe.skipIf(!built && !ci)('jobs of many processes (libfabric tcp)', () => {
  it(`run -n ${RANKS} --pin: the all-to-all on ODP buffers, output prefixed by rank, a CPU each`, async () => {
    const json = join(dir, 'run.json');
    const e = await start(['run', '-n', String(RANKS), '--pin', '--timeout', '120', '--', ...args(json)]).exit;
    expect(e.stderr).toBe(`[0] results: ${json}\n`);
    expect(e.code).toBe(0);
    expect(e.stdout).toMatch(/^\[0\] job of 4 ranks connected all-to-all \(pagefault-rdma run, libfabric tcp\)$/m);
    expect(e.stdout).toMatch(/^\[0\] all-to-all: 4 ranks/m);
    // perftest's latency row of the size: #bytes, #iterations, then 7 columns of µs.
    expect(e.stdout).toMatch(new RegExp(`^\\[0\\]\\s+${BLOCK}\\s+${ITERS}(\\s+[\\d.]+){7}$`, 'm'));
    const r = checkJob(json, 'pagefault-rdma run');
    // --pin: rank k runs on the k-th allowed CPU (modulo their number), and on it alone.
    const allowed = allowedCpus();
    for (const x of r.ranks) expect(x.cpus, `rank ${x.rank}`).toBe(String(allowed[x.rank % allowed.length]));
  }, 120_000);

  it.skipIf(!hydra && !ci)(
    `mpiexec -n ${RANKS} (mpich's hydra: PMI_RANK, PMI_SIZE): the same all-to-all`,
    async () => {
      expect(hydra, "mpiexec is mpich's hydra (CI installs the mpich package)").toBe(true);
      const json = join(dir, 'mpiexec.json');
      const rendezvous = `127.0.0.1:${await freePort()}`;
      const e = await start([...args(json), '--rendezvous', rendezvous], {
        command: ['mpiexec', '-n', String(RANKS), process.execPath, join('dist', 'cli', 'main.js')],
      }).exit;
      expect(e.stderr).toBe(`results: ${json}\n`);
      expect(e.code).toBe(0);
      checkJob(json, 'mpich (hydra)');
    },
    120_000,
  );

  it('a rank killed mid-job (run -n 3): the others fail by themselves, name it, exit 1; run fails the job', async () => {
    const r = start(['run', '-n', '3', '--', 'alltoall', '-n', '1000000', '-s', '4K', '--timeout', '20']);
    await waitFor(r.output, /\[0\] job of 3 ranks connected/, 60_000);
    const kids = readFileSync(`/proc/${r.child.pid}/task/${r.child.pid}/children`, 'utf8').trim().split(/\s+/).map(Number);
    expect(kids).toHaveLength(3);
    const t = Date.now();
    process.kill(kids[2]!, 'SIGKILL');
    const e = await r.exit;
    // Well within the ranks' own --timeout 20: the rendezvous and the transport see it at once.
    expect(Date.now() - t).toBeLessThan(15_000);
    expect(e.code).toBe(1);
    expect(e.stderr).toMatch(/^run: the job failed: rank 2 was killed by SIGKILL$/m);
    // The ranks left learned it through the job by themselves (not from the launcher's SIGTERM,
    // which comes after a grace of 3 s), said who went away, and exited 1.
    expect(e.stderr).toMatch(/^run: rank 0 exited 1, rank 1 exited 1, rank 2 killed by SIGKILL$/m);
    // Each rank's message is wrapped to its share of the width (COLUMNS): its continuation lines joined.
    for (const rank of [0, 1]) {
      const joined = e.stderr.replace(new RegExp(`\\n\\[${rank}\\] {3,}`, 'g'), ' ');
      expect(joined).toMatch(new RegExp(`^\\[${rank}\\] pagefault-rdma: .*rank 2 .*went away`, 'm'));
    }
    for (const pid of kids) expect(() => process.kill(pid, 0)).toThrow();
  }, 90_000);
});
