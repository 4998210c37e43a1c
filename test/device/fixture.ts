// What the device tests share: a runtime folder of their own (pid-named, so two worktrees'
// suites never meet), the device in this process or as the `pagefault-rdma device` process,
// C fixtures compiled once per file, and programs run with the project's libibverbs.so.1.
import { spawn, spawnSync, type ChildProcess, type SpawnSyncReturns } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Device, type DeviceOptions } from '../../kernel-sim/device/device.js';
import { verbsLibDir } from '../../native/index.js';
import { ROOT } from '../child.js';

let dirs = 0;

/** A fresh runtime folder (made by the device itself, 0700) and how to remove it. */
export function runtimeFolder(): { dir: string; remove(): void } {
  const parent = mkdtempSync(join(tmpdir(), `pfr-device-${process.pid}-${dirs++}-`));
  return { dir: join(parent, 'run'), remove: () => rmSync(parent, { recursive: true, force: true }) };
}

/** A device in this process, in a folder of its own; close() stops it and removes the folder. */
export function deviceHere(options: Omit<DeviceOptions, 'dir'> = {}): { device: Device; dir: string; close(): void } {
  const f = runtimeFolder();
  const device = Device.start({ ...options, dir: f.dir });
  return {
    device,
    dir: f.dir,
    close: () => {
      device.close();
      f.remove();
    },
  };
}

/** The `pagefault-rdma device` process, ready (its socket listening); stop() ends it and waits. */
export async function deviceProcess(
  args: string[] = [],
): Promise<{ child: ChildProcess; dir: string; log: string[]; stop(): Promise<number | null> }> {
  const f = runtimeFolder();
  const child = spawn(process.execPath, [join(ROOT, 'dist/cli/main.js'), 'device', '--dir', f.dir, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  const log: string[] = [];
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the device did not start: ${log.join('\n')}`)), 15_000);
    createInterface({ input: child.stderr! }).on('line', (l) => {
      log.push(l);
      if (l.includes('listening on')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once('exit', (code) => reject(new Error(`the device exited (${code}): ${log.join('\n')}`)));
  });
  return {
    child,
    dir: f.dir,
    log,
    stop: async () => {
      const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
      // Gone already (a test killed it): its exit event has come and gone.
      const ended = child.exitCode !== null || child.signalCode !== null;
      if (!ended) child.kill('SIGTERM');
      const code = ended ? child.exitCode : await exited;
      f.remove();
      return code;
    },
  };
}

/** The environment a verbs program needs to reach the device of `dir`. */
export function verbsEnv(dir: string, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return { ...process.env, LD_LIBRARY_PATH: verbsLibDir(), PFR_DEVICE_DIR: dir, ...extra };
}

/** Run a program on the device of `dir` to its end. */
export function runVerbs(dir: string, cmd: string, args: string[] = [], timeoutMs = 20_000): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { env: verbsEnv(dir), encoding: 'utf8', timeout: timeoutMs });
}

/** Compile test/fixtures/NAME.c (with native/device on the include path, and -libverbs if asked) into `outDir`. */
export function compileFixture(name: string, outDir: string, libs: string[] = []): string {
  const bin = join(outDir, name);
  const cc = spawnSync(
    'cc',
    [
      '-std=c11',
      '-O1',
      '-Wall',
      '-Wextra',
      '-Werror',
      '-pthread',
      '-I',
      join(ROOT, 'native/device'),
      '-o',
      bin,
      join(ROOT, `test/fixtures/${name}.c`),
      ...libs,
    ],
    { encoding: 'utf8' },
  );
  if (cc.status !== 0) throw new Error(`cc ${name}.c failed: ${cc.stderr}`);
  return bin;
}

/** device-raw-client: a line in, its answer line out. */
export class RawClient {
  readonly child: ChildProcess;
  readonly #lines: string[] = [];
  readonly #waiters: ((l: string) => void)[] = [];

  constructor(bin: string, dir: string) {
    this.child = spawn(bin, [], { env: { ...process.env, PFR_DEVICE_DIR: dir }, stdio: ['pipe', 'pipe', 'inherit'] });
    createInterface({ input: this.child.stdout! }).on('line', (l) => {
      const w = this.#waiters.shift();
      if (w) w(l);
      else this.#lines.push(l);
    });
  }

  /** Send a line; its answer ("reply STATUS LEN NFDS HEX", "closed", …). */
  ask(line: string): Promise<string> {
    this.child.stdin!.write(`${line}\n`);
    const ready = this.#lines.shift();
    if (ready !== undefined) return Promise.resolve(ready);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** The reply's status, body and descriptor count. */
  async reply(line: string): Promise<{ status: number; body: Buffer; fds: number } | 'closed'> {
    const a = await this.ask(line);
    if (a === 'closed') return 'closed';
    const m = /^reply (-?\d+) (\d+) (\d+) ?([0-9a-f]*)$/.exec(a);
    if (!m) throw new Error(`raw client: ${a}`);
    return { status: Number(m[1]), body: Buffer.from(m[4]!, 'hex'), fds: Number(m[3]) };
  }

  close(): void {
    this.child.stdin!.end();
    this.child.kill();
  }
}
