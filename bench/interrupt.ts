// What a benchmark made, undone when it is interrupted: on SIGINT or SIGTERM its child
// processes (each the leader of its own process group, so a launcher's ranks go too) are
// killed and its temporary folders removed, the progress line cleared; then it exits as the
// signal asks (130, 143) without a stack.
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { rmSync } from 'node:fs';

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

/** Kill every child left (its whole process group) and remove every folder made. */
export function cleanUp(): void {
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
