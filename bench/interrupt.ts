// What a benchmark made, undone when it is interrupted: on SIGINT or SIGTERM its child
// processes (each the leader of its own process group, so a launcher's ranks go too) are
// killed and its temporary folders removed, the progress line cleared; then it exits as the
// signal asks (130, 143) without a stack.
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { readdirSync, readFileSync, rmSync } from 'node:fs';

const children = new Set<ChildProcess>();
const folders = new Set<string>();
let installed = false;

function install(): void {
  if (installed) return;
  installed = true;
  for (const [signal, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ] as const)
    process.on(signal, () => {
      cleanUp();
      // The terminal echoed ^C where the cursor was: start the shell's prompt on a clean line.
      if (process.stderr.isTTY === true) process.stderr.write('\r\x1b[K\x1b[?25h');
      process.exit(code);
    });
  process.on('exit', cleanUp);
}

/**
 * Every live descendant of this process, from /proc (a child that a library started, such
 * as a redis-server, is no ChildProcess of ours to hold).
 */
function descendants(): number[] {
  const parent = new Map<number, number>();
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      // pid (comm) state ppid …: comm may hold spaces and parentheses, so read after the last ')'.
      const stat = readFileSync(`/proc/${p}/stat`, 'latin1');
      parent.set(Number(p), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // gone meanwhile
    }
  }
  const found: number[] = [];
  const mine = new Set([process.pid]);
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, ppid] of parent)
      if (mine.has(ppid) && !mine.has(pid)) {
        mine.add(pid);
        found.push(pid);
        grew = true;
      }
  }
  return found;
}

/**
 * Kill every child left (its whole process group) and every other descendant, and remove
 * every folder made.
 */
export function cleanUp(): void {
  for (const pid of descendants()) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // exited meanwhile
    }
  }
  for (const c of children) {
    if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) {
      try {
        process.kill(-c.pid, 'SIGKILL');
      } catch {
        c.kill('SIGKILL');
      }
    }
  }
  children.clear();
  for (const d of folders) rmSync(d, { recursive: true, force: true });
  folders.clear();
}

/** spawn(), the child in a process group of its own that an interrupt kills. */
export function spawnOwned(cmd: string, args: readonly string[], options: SpawnOptions = {}): ChildProcess {
  install();
  const c = spawn(cmd, args, { ...options, detached: true });
  children.add(c);
  c.once('exit', () => children.delete(c));
  return c;
}

/** A temporary folder that an interrupt removes; `forget` it once removed normally. */
export function ownFolder(dir: string): { forget(): void } {
  install();
  folders.add(dir);
  return { forget: () => folders.delete(dir) };
}

/** What a child run to its end by runOwned printed and how it ended. */
export interface OwnedRun {
  status: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  error?: Error;
}

/**
 * spawnSync's result, without blocking the event loop: the child runs owned (an interrupt
 * kills it, which a signal handler could not do while spawnSync blocked the thread), killed
 * (SIGKILL) after `timeoutMs` or once its output passes `maxBuffer` bytes.
 */
export function runOwned(cmd: string, args: readonly string[], options: { timeoutMs?: number; maxBuffer?: number } = {}): Promise<OwnedRun> {
  const { timeoutMs = 300_000, maxBuffer = 256 << 20 } = options;
  return new Promise((resolve) => {
    const c = spawnOwned(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let bytes = 0;
    let error: Error | undefined;
    const take = (into: Buffer[]) => (d: Buffer) => {
      into.push(d);
      bytes += d.length;
      if (bytes > maxBuffer && !error) {
        error = new Error(`${cmd}: output passed ${maxBuffer} bytes (killed)`);
        c.kill('SIGKILL');
      }
    };
    c.stdout!.on('data', take(out));
    c.stderr!.on('data', take(err));
    const timer = setTimeout(() => {
      error ??= new Error(`${cmd}: no end within ${timeoutMs} ms (killed)`);
      c.kill('SIGKILL');
    }, timeoutMs);
    let done = false;
    const finish = (status: number | null, signal: NodeJS.Signals | null): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve({
        status,
        signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
        ...(error ? { error } : {}),
      });
    };
    // A child that could not start (ENOENT, EACCES) may never 'close'.
    c.once('error', (e) => {
      error ??= e;
      if (c.pid === undefined) finish(null, null);
    });
    c.once('close', finish);
  });
}
