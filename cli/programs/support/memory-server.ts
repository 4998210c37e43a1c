// A `pagefault-rdma memory-server` in a process of its own, on a Unix socket in a temporary
// folder, for the tests, bench:remote and the remote-paging example: started and stopped (or
// killed, to see what its clients do without it) by the caller.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export interface MemoryServerProcess {
  socket: string;
  /** The server's pid (undefined while stopped). */
  readonly pid: number | undefined;
  /** Every line the server printed (stdout and stderr), across restarts. */
  readonly output: string[];
  /** Start it again (on the same socket): it holds no pages. */
  start(): Promise<void>;
  /** SIGTERM (it prints its stats and exits 0; resolves to its exit code) or SIGKILL. */
  stop(signal?: 'SIGTERM' | 'SIGKILL'): Promise<number | null>;
  /** Stop for good and remove the folder. */
  dispose(): Promise<void>;
}

// The built CLI: beside this file in dist/, or dist/ of the package when run from the sources.
function mainScript(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, '..', '..', 'main.js'), join(here, '..', '..', '..', 'dist', 'cli', 'main.js')]) if (existsSync(p)) return p;
  throw new Error('the memory server needs the built CLI (dist/cli/main.js): run "npm run build:ts"');
}

/** `parent`: where its folder goes (default the temporary folder; a caller's folder removes it with its own). */
export async function startMemoryServer(extraArgs: string[] = [], parent = tmpdir()): Promise<MemoryServerProcess> {
  const dir = mkdtempSync(join(parent, 'pfr-memsrv-'));
  const socket = join(dir, 'memory.sock');
  const output: string[] = [];
  let proc: ChildProcess | undefined;

  const start = async (): Promise<void> => {
    const p = spawn(process.execPath, [mainScript(), 'memory-server', '--socket', socket, ...extraArgs], { stdio: ['ignore', 'pipe', 'pipe'] });
    proc = p;
    let listening = false;
    for (const s of [p.stdout!, p.stderr!]) createInterface({ input: s }).on('line', (l) => (output.push(l), (listening ||= /listening on/.test(l))));
    const end = Date.now() + 10_000;
    while (!listening) {
      if (p.exitCode !== null) throw new Error(`the memory server exited with ${p.exitCode}: ${output.join('\n')}`);
      if (Date.now() > end) throw new Error('the memory server did not listen within 10 s');
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const stop = async (signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<number | null> => {
    const p = proc;
    proc = undefined;
    if (!p) return null;
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((r) => p.once('exit', r));
      p.kill(signal);
      // Unref'd: a caller that ends right after stop() must not wait out the grace.
      await Promise.race([exited, new Promise((r) => setTimeout(r, 5000).unref())]);
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    }
    // Its last lines (the stats) may still be on their way through the pipe.
    if (!p.stdout!.closed) await Promise.race([new Promise((r) => p.stdout!.once('close', r)), new Promise((r) => setTimeout(r, 1000).unref())]);
    return p.exitCode;
  };
  await start();
  return {
    socket,
    get pid() {
      return proc?.pid;
    },
    output,
    start,
    stop,
    async dispose() {
      await stop('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
