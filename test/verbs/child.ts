// A child process for what the verbs suites cannot do in their own process: pin memory past
// RLIMIT_MEMLOCK (root ignores the limit, so the child drops to user nobody). The child runs
// a fixture of test/verbs/fixtures against the built library (dist/), staged with the addon
// in a temporary directory anyone can read, so a checkout in a private directory works too.
import { spawn } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { ROOT, type ChildResult } from '../child.js';

const NOBODY = 65534;

function chmodTree(path: string): void {
  const st = statSync(path);
  chmodSync(path, st.isDirectory() || st.mode & 0o100 ? 0o755 : 0o644);
  if (st.isDirectory()) for (const n of readdirSync(path)) chmodTree(join(path, n));
}

/** Run test/verbs/fixtures/<name> as nobody (when root) with `ulimit -l memlockKiB`. */
export async function runAsNobody(name: string, memlockKiB: number, timeoutMs = 20_000): Promise<ChildResult> {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-verbs-'));
  try {
    for (const p of ['package.json', 'binding.gyp', 'dist', 'node_modules/node-gyp-build', 'build/Release/pagefault_rdma.node', 'prebuilds', `test/verbs/fixtures/${name}`]) {
      if (!existsSync(join(ROOT, p))) continue;
      mkdirSync(dirname(join(dir, p)), { recursive: true });
      cpSync(join(ROOT, p), join(dir, p), { recursive: true });
    }
    chmodTree(dir);
    const drop = process.getuid?.() === 0 ? { uid: NOBODY, gid: NOBODY } : {};
    const script = join(dir, 'test/verbs/fixtures', name);
    return await new Promise((resolve, reject) => {
      const child = spawn('/bin/sh', ['-c', `ulimit -l ${memlockKiB} && exec "$0" "$@"`, process.execPath, script], {
        cwd: dir,
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
        stdio: ['ignore', 'pipe', 'pipe'],
        ...drop,
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      child.on('error', reject);
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, stdout, stderr });
      });
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
