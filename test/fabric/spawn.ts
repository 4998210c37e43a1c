// Processes the multi-process tests start and stop: the CLI from dist/ (or another command,
// such as mpiexec), their output collected, and every one still running killed at the end.
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { binding } from '../../native/index.js';
import { ROOT } from '../child.js';

export const MAIN = join(ROOT, 'dist/cli/main.js');
/** The addon was built with libfabric. */
export const built = binding.fabricListen !== undefined;
// CI=true (GitHub), CI=1 (others), and .ci/run sets it too; CI=0 or CI=false is not CI.
export const ci = !!process.env.CI && !/^(0|false)$/i.test(process.env.CI);

const children = new Set<ChildProcess>();
afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
});

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Start `pagefault-rdma ARGS` (or `command` with ARGS after it), its output collected. */
export function start(
  args: string[],
  o: { command?: string[]; env?: NodeJS.ProcessEnv } = {},
): { child: ChildProcess; exit: Promise<Exit>; output: () => string } {
  const [cmd, ...pre] = o.command ?? [process.execPath, MAIN];
  const child = spawn(cmd!, [...pre, ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, FORCE_COLOR: '0', ...o.env } });
  children.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exit = new Promise<Exit>((resolve) =>
    child.on('close', (code, signal) => {
      children.delete(child);
      resolve({ code, signal, stdout, stderr });
    }),
  );
  return { child, exit, output: () => stdout + stderr };
}

/** Wait until `get()` matches `re`. */
export async function waitFor(get: () => string, re: RegExp, timeoutMs = 20_000): Promise<RegExpExecArray> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const m = re.exec(get());
    if (m) return m;
    if (Date.now() > end) throw new Error(`timed out waiting for ${re} in:\n${get()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A TCP port free on the loopback now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
