// Where the device of this user lives: the runtime folder (docs/device-abi.md §1), found the
// same way by the provider in C (native/libibverbs/runtime.c). One device per folder: the
// running one holds device.lock with flock, so a second refuses to start, and a socket left by
// a device that died is replaced by the next.
import { closeSync, lstatSync, mkdirSync, readFileSync, unlinkSync, writeSync, ftruncateSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import { binding } from '../../native/index.js';

/** The runtime folder of this user's device (PFR_DEVICE_DIR, else $XDG_RUNTIME_DIR/pagefault-rdma, else /tmp/pagefault-rdma-UID). */
export function runtimeDir(env: NodeJS.ProcessEnv = process.env): string {
  const own = env['PFR_DEVICE_DIR'];
  if (own) return own;
  const xdg = env['XDG_RUNTIME_DIR'];
  if (xdg && isAbsolute(xdg)) return join(xdg, 'pagefault-rdma');
  return `/tmp/pagefault-rdma-${process.getuid?.() ?? 0}`;
}

/** The control socket in `dir`. */
export function socketPath(dir: string): string {
  return join(dir, 'device.sock');
}

/** The log a device started by `exec` writes, in `dir`. */
export function logPath(dir: string): string {
  return join(dir, 'device.log');
}

function deviceError(message: string, code: string): Error {
  return Object.assign(new Error(message), { code });
}

/**
 * Make `dir` (0700) if it is not there, and refuse one that is not this user's own or that
 * others may write: a device there could be an impostor's, and programs let their device in to
 * their memory.
 */
export function ensureRuntimeDir(dir: string): void {
  try {
    mkdirSync(dir, { mode: 0o700, recursive: true });
  } catch (err) {
    throw deviceError(`cannot make the device's folder ${dir}: ${(err as Error).message}`, 'ERR_PFR_DEVICE_DIR');
  }
  const st = lstatSync(dir);
  const uid = process.getuid?.() ?? 0;
  if (!st.isDirectory()) throw deviceError(`${dir} is not a folder: remove it, or set PFR_DEVICE_DIR`, 'ERR_PFR_DEVICE_DIR');
  if (st.uid !== uid)
    throw deviceError(`${dir} belongs to uid ${st.uid}, not to this user (${uid}): set PFR_DEVICE_DIR to a folder of your own`, 'ERR_PFR_DEVICE_DIR');
  if ((st.mode & 0o022) !== 0)
    throw deviceError(
      `${dir} may be written by others (mode ${(st.mode & 0o777).toString(8)}): chmod 700 it, or set PFR_DEVICE_DIR`,
      'ERR_PFR_DEVICE_DIR',
    );
}

/** The pid of the device that holds `dir`'s lock, or undefined when none does. */
export function runningDevice(dir: string): number | undefined {
  let fd: number;
  try {
    fd = binding.lockFile(join(dir, 'device.lock'));
  } catch (err) {
    if ((err as { code?: string }).code !== 'EWOULDBLOCK' && (err as { code?: string }).code !== 'EAGAIN') return undefined;
    const pid = Number.parseInt(readFileSync(join(dir, 'device.lock'), 'utf8'), 10);
    return Number.isInteger(pid) && pid > 0 ? pid : -1;
  }
  binding.fdClose(fd);
  return undefined;
}

/** This process's claim on a runtime folder: the lock held, its pid written, the socket path free. */
export class DeviceLock {
  readonly dir: string;
  #fd: number;

  private constructor(dir: string, fd: number) {
    this.dir = dir;
    this.#fd = fd;
  }

  /** Take `dir` for this process, or fail naming the device that holds it. */
  static take(dir: string): DeviceLock {
    ensureRuntimeDir(dir);
    let fd: number;
    try {
      fd = binding.lockFile(join(dir, 'device.lock'));
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'EWOULDBLOCK' || code === 'EAGAIN')
        throw deviceError(`a device already runs for this user in ${dir} (pid ${runningDevice(dir) ?? '?'})`, 'ERR_PFR_DEVICE_RUNNING');
      throw err;
    }
    ftruncateSync(fd, 0);
    writeSync(fd, `${process.pid}\n`, 0);
    // The lock is ours: a socket file there is a dead device's.
    try {
      unlinkSync(socketPath(dir));
    } catch {
      // none
    }
    return new DeviceLock(dir, fd);
  }

  /** Let the folder go: the socket removed, the lock released. Idempotent. */
  release(): void {
    if (this.#fd < 0) return;
    try {
      unlinkSync(socketPath(this.dir));
    } catch {
      // gone already
    }
    closeSync(this.#fd);
    this.#fd = -1;
  }
}
