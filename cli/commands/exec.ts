// `pagefault-rdma exec -- PROGRAM ARGS…`: run an unmodified verbs program on the device: with
// the project's libibverbs.so.1 first on its library path (none of Debian's binaries carries
// an RPATH), the device of this user's runtime folder started if none answers there (with an
// idle timeout and its log in the folder), and the program's exit status passed on.
import { spawn } from 'node:child_process';
import { openSync, closeSync, readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { fileURLToPath } from 'node:url';
import { InvalidArgumentError } from 'commander';
import { queryInfo } from '../../kernel-sim/device/client.js';
import { ensureRuntimeDir, logPath, runtimeDir } from '../../kernel-sim/device/runtime-dir.js';
import { verbsLibDir } from '../../native/index.js';
import { printErr } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  dir?: string;
  policy?: string;
  start: boolean;
  idleTimeout: number;
}

const POLICIES = ['touch', 'touch-ahead', 'prefetch'];

function parsePolicy(value: string): string {
  if (!POLICIES.includes(value)) throw new InvalidArgumentError(`expected one of ${POLICIES.join(', ')}`);
  return value;
}

function parseSeconds(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError('expected a positive number of seconds');
  return n;
}

// A device of its own, detached (it outlives this command until its idle timeout), logging to
// the folder's device.log; ready once it answers on its socket.
async function startDevice(dir: string, idleTimeout: number): Promise<void> {
  ensureRuntimeDir(dir);
  const log = openSync(logPath(dir), 'a', 0o600);
  const main = fileURLToPath(new URL('../main.js', import.meta.url));
  const child = spawn(process.execPath, [main, 'device', '--dir', dir, '--idle-timeout', String(idleTimeout)], {
    detached: true,
    stdio: ['ignore', log, log],
  });
  closeSync(log);
  let exited: number | null | undefined;
  child.once('exit', (code) => (exited = code));
  child.unref();
  for (const deadline = Date.now() + 15_000; Date.now() < deadline;) {
    if (await queryInfo(dir, 500)) return;
    // Another exec's device won the folder: this one exits, and that one answers.
    if (exited !== undefined && exited !== 0 && !(await queryInfo(dir, 500))) {
      const tail = readFileSync(logPath(dir), 'utf8').trim().split('\n').slice(-3).join('\n');
      throw new Error(`the device did not start (exit ${exited}); ${logPath(dir)} says:\n${tail}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`the device started in ${dir} did not answer within 15 s: see ${logPath(dir)}`);
}

export default defineProgram<Options>({
  name: 'exec',
  summary: 'run a verbs program (ibv_devinfo, ibv_rc_pingpong, ib_write_bw, …) on the device, e.g. exec -- ibv_devinfo -v',
  description:
    "Run PROGRAM with the project's libibverbs.so.1 (LD_LIBRARY_PATH), talking to this user's device, which is started " +
    '(detached, with --idle-timeout, logging to device.log in the runtime folder) when none answers. The exit status is ' +
    "the program's. Example: exec -- ibv_devinfo -v",
  noTrace: 'the device traces nothing yet: its data path comes with the device-owned queues',
  options(cmd) {
    cmd.parent?.enablePositionalOptions();
    cmd
      .option('--dir <folder>', "the device's runtime folder (default: as the library finds it)")
      .option('--policy <name>', `how the program's ODP MRs fault pages in: ${POLICIES.join(', ')} (default: the device's)`, parsePolicy)
      .option('--no-start', 'fail instead of starting a device when none answers')
      .option('--idle-timeout <seconds>', 'for a device started here: stop after this long with no program', parseSeconds, 60)
      .argument('<program...>', 'the program and its arguments (after --)')
      .passThroughOptions();
  },
  async run(o) {
    const [program, ...args] = o.args ?? [];
    if (!program) throw new Error('exec: name a program to run, e.g. exec -- ibv_devinfo');
    const libdir = verbsLibDir();
    const dir = o.dir ?? runtimeDir();
    if (!(await queryInfo(dir, 1000))) {
      if (!o.start) throw new Error(`exec: no device answers in ${dir} (start one with \`pagefault-rdma device\`, or drop --no-start)`);
      await startDevice(dir, o.idleTimeout);
    }
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      LD_LIBRARY_PATH: [libdir, process.env['LD_LIBRARY_PATH']].filter(Boolean).join(':'),
      PFR_DEVICE_DIR: dir,
    };
    if (o.policy) env['PFR_POLICY'] = o.policy;
    const child = spawn(program, args, { stdio: 'inherit', env });
    const forward = (s: NodeJS.Signals): void => void child.kill(s);
    process.on('SIGINT', forward);
    process.on('SIGTERM', forward);
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
      child.once('error', (err) => reject(new Error(`exec: cannot run ${program}: ${err.message}`)));
      child.once('exit', (c, s) => resolve([c, s]));
    });
    process.off('SIGINT', forward);
    process.off('SIGTERM', forward);
    process.exitCode = signal ? 128 + (constants.signals[signal] ?? 0) : (code ?? 1);
    if (signal) printErr(`exec: ${program} was killed by ${signal}`);
    return { results: { program, args, code, signal } };
  },
});
