// `pagefault-rdma app NAME`: an application kernel (cli/apps/) run as N ranks, each policy in
// turn, with its own result verified and a verdict of ODP against pinning. The ranks are nodes
// of one process (-n N), or, started under `pagefault-rdma run -n N --` or mpiexec, one
// process each (then rank 0 prints and writes --json).
import { InvalidArgumentError } from 'commander';
import { launchInfo } from '../../lib/index.js';
import { heading, parsePositiveInt } from '../programs/support/format.js';
import { startMemoryServer, type MemoryServerProcess } from '../programs/support/memory-server.js';
import { APPS, type AppName } from '../apps/apps.js';
import { APP_POLICIES, RemoteMemory, type AppPolicy } from '../apps/policy.js';
import { runKernel, verdictPlot } from '../apps/runner.js';
import { jobWorld, localWorlds, type World } from '../apps/world.js';
import { defineProgram } from '../program.js';

interface Options {
  ranks?: number;
  size?: number;
  steps: number;
  runs: number;
  policies: AppPolicy[];
  evictEachStep: boolean;
  warmUp: boolean;
  rendezvous?: string;
  timeout?: number;
  memlock?: number;
  serverSocket?: string;
}

// Ranks in one process: each is a node with its own fault library; past this the event loop is the bottleneck, not the fabric.
const MAX_LOCAL_RANKS = 64;
// The wait for the other ranks scales with the job: each process spends ~1 s of CPU starting
// (Node, then the modules) before it reaches the rendezvous, and then dials its peers. Measured
// (16 processes, 2 cores, load ~10): the ranks reached the rendezvous 7.0–8.4 s after their
// start, and were all connected 4.7 s after the last one came (rank 0 waited 6.5 s in all):
// ~0.4 s per rank. 2 s per rank leaves room for a machine five times as busy.
const MIN_TIMEOUT_S = 30;
const TIMEOUT_S_PER_RANK = 2;
// The variables by which a launcher says "this process is one rank of a job" (lib/job reads and checks them all).
const JOB_SIZE_VARS = ['PFR_SIZE', 'PMI_SIZE', 'OMPI_COMM_WORLD_SIZE'];

export default defineProgram<Options>({
  name: 'app',
  noTrace: 'the kernels run many trials at full speed; trace one faulting write with destination-fault --trace',
  plot: "each ODP policy's time per step after the first against pin, per run",
  summary: 'application kernels as N ranks (halo, allreduce, transpose, kv): verified, per policy, with a verdict of ODP against pinning',
  description:
    'Run an application kernel as N ranks over the verbs API, every policy --runs times in interleaved turns, and check its ' +
    'result against a serial computation. halo: a 3-D halo exchange (7-point stencil on Float64, RDMA WRITE WITH IMMEDIATE of ' +
    "the six faces into the neighbours' buffers); allreduce: a ring allreduce of Float64 vectors (reduce-scatter then " +
    'allgather, RDMA WRITE WITH IMMEDIATE); transpose: an all-to-all transpose of a distributed matrix (every rank writes to every ' +
    'other); kv: a key-value server and clients (GET/SET over SEND/RECV, values read by RDMA READ), a pinned server held to ' +
    'RLIMIT_MEMLOCK. Policy remote: the buffers are remote-paged, their pages written to a memory server before every step and ' +
    'fetched back by the faults. Reports per policy the time per step (the first, and the median after it), faults and pages ' +
    'fetched per rank and CPU time by thread; ' +
    "then each ODP policy's slowdown against pin and whether it is within pin's own spread over the runs. The ranks are " +
    'nodes of this process (-n N), or processes: `pagefault-rdma run -n 4 -- app halo` (or mpiexec -n 4 npx pagefault-rdma app halo).',
  options(cmd) {
    cmd
      .argument('<name>', `the application: ${Object.keys(APPS).join(', ')}`)
      .option('-n, --ranks <n>', 'ranks, as nodes of this process (default 8; under a launcher the job has its own)', parsePositiveInt)
      .option(
        '-s, --size <n>',
        'problem size per rank: grid points per axis (halo), Float64 values (allreduce), matrix rows (transpose)',
        parsePositiveInt,
      )
      .option('--steps <n>', 'steps per trial (halo: sweeps; allreduce: allreduces; transpose: transposes)', parsePositiveInt, 20)
      .option('-r, --runs <n>', 'how many times each policy runs, the policies taking turns', parsePositiveInt, 3)
      .option(
        '--policies <list>',
        `comma-separated subset of ${APP_POLICIES.join(',')} (pin is the baseline of the verdict; remote: buffers paged from a memory server)`,
        appPolicies,
        [...APP_POLICIES],
      )
      .option('--server-socket <path>', "remote: an existing memory server's Unix socket (else one is started for the run, by rank 0 of a job)")
      .option(
        '--evict-each-step',
        "evict the kernel's RDMA buffers before every step (ODP faults every step, not only the first; pinned memory stays)",
        false,
      )
      .option('--memlock <KiB>', "kv: what the pinned server may lock (default: this process's RLIMIT_MEMLOCK, ulimit -l)", parsePositiveInt)
      .option('--no-warm-up', 'skip the unrecorded trial of each policy that lets V8 compile the kernel first')
      .option('--rendezvous <host:port>', "under a launcher: rank 0's rendezvous (default $PFR_RENDEZVOUS)")
      .option(
        '--timeout <seconds>',
        `under a launcher: how long the ranks wait for each other to start and connect, and at each barrier (default ${MIN_TIMEOUT_S}, or ${TIMEOUT_S_PER_RANK} per rank in larger jobs)`,
        parsePositiveInt,
      );
    cmd.hook('preAction', (c) => {
      const name = c.args[0]!;
      if (!(name in APPS)) c.error(`error: unknown application '${name}' (choose from ${Object.keys(APPS).join(', ')})`);
      const o = c.opts() as Options;
      const inJob = JOB_SIZE_VARS.some((v) => process.env[v] !== undefined);
      if (inJob && o.ranks !== undefined)
        c.error('error: --ranks: this process is one rank of a job (its launcher set the size): leave -n to the launcher');
      if (o.ranks !== undefined && o.ranks > MAX_LOCAL_RANKS)
        c.error(`error: --ranks: at most ${MAX_LOCAL_RANKS} ranks in one process (use run -n N for more)`);
      const app = APPS[name as AppName];
      const problem = app.check(o.ranks ?? 8, o.size ?? app.defaultSize);
      if (problem && !inJob) c.error(`error: ${problem}`);
    });
  },
  async run(o) {
    const name = o.args![0] as AppName;
    const app = APPS[name];
    const inJob = JOB_SIZE_VARS.some((v) => process.env[v] !== undefined);
    let worlds: World[];
    let size: number;
    let leave: () => Promise<void>;
    if (inJob) {
      const timeoutS = o.timeout ?? Math.max(MIN_TIMEOUT_S, TIMEOUT_S_PER_RANK * launchInfo().size);
      const { world, job } = await jobWorld({ timeoutMs: timeoutS * 1000, ...(o.rendezvous !== undefined ? { rendezvous: o.rendezvous } : {}) });
      const problem = app.check(job.size, o.size ?? app.defaultSize);
      if (problem) {
        world.cluster.close();
        await job.close();
        throw new Error(problem);
      }
      worlds = [world];
      size = job.size;
      leave = async () => {
        world.cluster.close();
        await job.close();
      };
    } else {
      size = o.ranks ?? 8;
      worlds = await localWorlds(size);
      leave = () => Promise.resolve(worlds[0]!.cluster.close());
    }
    const server = o.policies.includes('remote')
      ? await remoteMemory(worlds, o.serverSocket).catch(async (e: unknown) => {
          // The other ranks of a job wait for the server's socket: they learn at once why none comes.
          worlds[0]!.fail(e as Error);
          await leave();
          throw e;
        })
      : undefined;
    try {
      if (worlds[0]!.rank === 0) heading(`app ${name}: ${app.title}`);
      const r = await runKernel({
        app: name,
        kernel: app.kernel as never,
        params: app.params(o.size ?? app.defaultSize, o.memlock) as never,
        policies: o.policies,
        runs: o.runs,
        steps: o.steps,
        evictEachStep: o.evictEachStep,
        warmUp: o.warmUp,
        worlds,
        size,
      });
      if (!r.verified) process.exitCode = 1;
      return { results: r, plot: verdictPlot(r), writes: worlds[0]!.rank === 0 };
    } finally {
      await server?.close();
      await leave();
    }
  },
});

/** --policies: a comma-separated list of APP_POLICIES, each once (commander's argument parser). */
function appPolicies(value: string): AppPolicy[] {
  const list = value.split(',').map((s) => s.trim()) as AppPolicy[];
  for (const p of list)
    if (!APP_POLICIES.includes(p)) throw new InvalidArgumentError(`unknown policy '${p}' (choose from ${APP_POLICIES.join(', ')})`);
  if (new Set(list).size !== list.length) throw new InvalidArgumentError('a policy is listed twice');
  return list;
}

/**
 * Give every rank of this process its remote-paged memory, on the memory server at `socket`, or
 * on one started here (in a job, by rank 0, for every rank: its socket goes round by allgather).
 * Resolves to what closes it all: every rank's pagers, then the server once no rank needs it.
 */
async function remoteMemory(worlds: World[], socket: string | undefined): Promise<{ close(): Promise<void> }> {
  const w0 = worlds[0]!;
  const inJob = worlds.length < w0.size;
  let server: MemoryServerProcess | undefined;
  if (socket === undefined && w0.rank === 0) server = await startMemoryServer();
  const mine = socket ?? server?.socket ?? null;
  const path = inJob ? (await w0.allgather(mine))[0] : mine;
  if (typeof path !== 'string' || path === '') throw new Error('rank 0 sent no memory server socket for the remote policy');
  for (const w of worlds) w.remote = new RemoteMemory(path, `pfr-app-${process.pid}-${w.rank}`);
  return {
    async close() {
      await Promise.all(worlds.map((w) => w.remote?.close()));
      // The server outlives every rank's pagers (their keys deleted): rank 0 waits for the others before stopping it.
      if (inJob && !w0.signal.aborted) await w0.barrier().catch(() => undefined);
      await server?.dispose();
    },
  };
}
