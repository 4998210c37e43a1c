// Child processes for what a test cannot do in its own process: drop root, lower a limit,
// or exit with a fault in flight. The children are plain .mjs scripts in test/fixtures that
// import the built library from dist/ (npm test builds it first).
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NOBODY = 65534;

/** Throws unless dist/ holds a build of lib/ at least as new as its sources. */
export function requireDist(): void {
  const built = join(ROOT, 'dist/lib/index.js');
  if (!existsSync(built)) throw new Error(`${built} is missing: run "npm run build:ts" (npm test does it)`);
  const builtAt = statSync(built).mtimeMs;
  for (const dir of ['lib', 'native']) {
    for (const f of readdirSync(join(ROOT, dir)).filter((n) => n.endsWith('.ts'))) {
      if (statSync(join(ROOT, dir, f)).mtimeMs > builtAt) throw new Error(`dist/ is older than ${dir}/${f}: run "npm run build:ts" (npm test does it)`);
    }
  }
}

export interface ChildOptions {
  /** Run as user nobody (uid/gid 65534) when we are root. */
  asNobody?: boolean;
  /** RLIMIT_MEMLOCK for the child, in KiB (ulimit -l). */
  memlockKiB?: number;
  timeoutMs?: number;
}

export interface ChildResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Run test/fixtures/<name> with node; resolves when it exits (killed after timeoutMs). */
export function runFixture(name: string, args: string[] = [], options: ChildOptions = {}): Promise<ChildResult> {
  const script = join(ROOT, 'test/fixtures', name);
  const [cmd, argv] =
    options.memlockKiB === undefined
      ? [process.execPath, [script, ...args]]
      : ['/bin/sh', ['-c', `ulimit -l ${options.memlockKiB} && exec "$0" "$@"`, process.execPath, script, ...args]];
  const drop = options.asNobody && process.getuid?.() === 0 ? { uid: NOBODY, gid: NOBODY } : {};
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { cwd: ROOT, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, stdio: ['ignore', 'pipe', 'pipe'], ...drop });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 20_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** The last line of a child's stdout, parsed as JSON (fixtures report that way). */
export function report<T = Record<string, unknown>>(r: ChildResult): T {
  const line = r.stdout.trim().split('\n').pop();
  if (!line) throw new Error(`child printed nothing (exit ${r.code}, signal ${r.signal}); stderr:\n${r.stderr}`);
  return JSON.parse(line) as T;
}
