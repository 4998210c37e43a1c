// Child processes for what a test cannot do in its own process: drop root, lower a limit,
// or exit with a fault in flight. The children are plain .mjs scripts in test/fixtures that
// import the built library from dist/ (npm test builds it first).
import { spawn } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NOBODY = 65534;

/** True if a user with no rights of its own can reach and read `dir` (o+x on every ancestor). */
function reachableByOthers(dir: string): boolean {
  for (let d = dir; ; d = dirname(d)) {
    if ((statSync(d).mode & 0o001) === 0) return false;
    if (dirname(d) === d) return true;
  }
}

function chmodTree(path: string): void {
  const st = statSync(path);
  chmodSync(path, st.isDirectory() || st.mode & 0o100 ? 0o755 : 0o644);
  if (st.isDirectory()) for (const n of readdirSync(path)) chmodTree(join(path, n));
}

/**
 * The folders (relative to ROOT) of the package's runtime dependencies and of theirs, found as
 * Node finds them: in the nearest node_modules up the tree. dist/ imports them (redis).
 */
function runtimePackages(): string[] {
  const found = new Set<string>();
  const deps = (dir: string): string[] =>
    Object.keys((JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { dependencies?: object }).dependencies ?? {});
  const visit = (from: string, name: string): void => {
    for (let d = from; ; d = dirname(d)) {
      const dir = join(d, 'node_modules', name);
      if (existsSync(join(dir, 'package.json'))) {
        const rel = relative(ROOT, dir);
        if (found.has(rel)) return;
        found.add(rel);
        for (const dep of deps(dir)) visit(dir, dep);
        return;
      }
      if (d === ROOT || dirname(d) === d) return;
    }
  };
  for (const dep of deps(ROOT)) visit(ROOT, dep);
  return [...found];
}

/**
 * Where a child running as nobody can load the library from: the checkout itself when it is
 * readable by others, else (a CI clone in a private directory) a copy of what the child needs
 * in a temporary directory open to everyone; `cleanup` removes that copy.
 */
function rootForNobody(): { root: string; cleanup(): void } {
  if (reachableByOthers(ROOT)) return { root: ROOT, cleanup: () => {} };
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-nobody-'));
  for (const p of ['package.json', 'binding.gyp', 'dist', 'test/fixtures', 'build/Release/pagefault_rdma.node', 'prebuilds', ...runtimePackages()]) {
    if (!existsSync(join(ROOT, p))) continue;
    mkdirSync(dirname(join(dir, p)), { recursive: true });
    cpSync(join(ROOT, p), join(dir, p), { recursive: true });
  }
  chmodTree(dir);
  return { root: dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Throws unless dist/ holds a build of lib/ at least as new as its sources. */
export function requireDist(): void {
  const built = join(ROOT, 'dist/lib/index.js');
  if (!existsSync(built)) throw new Error(`${built} is missing: run "npm run build:ts" (npm test does it)`);
  const builtAt = statSync(built).mtimeMs;
  for (const dir of ['lib', 'native', 'kernel-sim']) {
    for (const f of readdirSync(join(ROOT, dir), { recursive: true }) as string[]) {
      if (f.endsWith('.ts') && statSync(join(ROOT, dir, f)).mtimeMs > builtAt)
        throw new Error(`dist/ is older than ${dir}/${f}: run "npm run build:ts" (npm test does it)`);
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
  const asNobody = options.asNobody === true && process.getuid?.() === 0;
  const { root, cleanup } = asNobody ? rootForNobody() : { root: ROOT, cleanup: () => {} };
  const script = join(root, 'test/fixtures', name);
  const [cmd, argv] =
    options.memlockKiB === undefined
      ? [process.execPath, [script, ...args]]
      : ['/bin/sh', ['-c', `ulimit -l ${options.memlockKiB} && exec "$0" "$@"`, process.execPath, script, ...args]];
  const drop = asNobody ? { uid: NOBODY, gid: NOBODY } : {};
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { cwd: root, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, stdio: ['ignore', 'pipe', 'pipe'], ...drop });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 20_000);
    child.on('error', (err) => {
      cleanup();
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      cleanup();
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
