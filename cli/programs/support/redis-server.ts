// A real redis-server for the tests and bench:remote: Debian's package `redis-server`, started on a Unix
// socket in a temporary folder (no TCP port), stopped by the test. Persistence is off unless
// asked for (appendonly, for the restart in the soak test).
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createClient, RESP_TYPES } from 'redis';

export interface RedisOptions {
  maxmemory?: string;
  appendonly?: boolean;
  /** Where its folder goes (default the temporary folder; a caller's folder removes it with its own). */
  parent?: string;
}

/** What the tests do with a client of their own (values as Buffers). */
export interface RedisClient {
  keys(pattern: string): Promise<unknown[]>;
  get(key: string): Promise<unknown>;
  set(key: string, value: Buffer): Promise<unknown>;
  dbSize(): Promise<number>;
  configSet(parameter: string, value: string): Promise<unknown>;
  destroy(): void;
}

export interface RedisServer {
  socket: string;
  dir: string;
  /** A client of the test's own (binary values), connected. */
  client(): Promise<RedisClient>;
  stop(): Promise<void>;
  start(): Promise<void>;
  /**
   * Freeze the server for `ms` (SIGSTOP), and resolve once it runs again. The SIGCONT comes
   * from a process of its own: this process's event loop may be what is being tested.
   */
  pause(ms: number): Promise<void>;
  /** Stop for good and remove the folder. */
  dispose(): Promise<void>;
}

const binaryClient = (socket: string): RedisClient & { connect(): Promise<unknown>; on(e: 'error', f: () => void): unknown } =>
  createClient({ socket: { path: socket, reconnectStrategy: false } }).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });

export async function startRedis(options: RedisOptions = {}): Promise<RedisServer> {
  const dir = mkdtempSync(join(options.parent ?? tmpdir(), 'pfr-redis-'));
  const socket = join(dir, 'redis.sock');
  const args = [
    '--port',
    '0',
    '--unixsocket',
    socket,
    '--unixsocketperm',
    '700',
    '--dir',
    dir,
    '--save',
    '',
    '--daemonize',
    'no',
    '--loglevel',
    'warning',
  ];
  if (options.appendonly) args.push('--appendonly', 'yes', '--appendfsync', 'always');
  if (options.maxmemory) args.push('--maxmemory', options.maxmemory, '--maxmemory-policy', 'noeviction');
  let proc: ChildProcess | undefined;
  const clients: RedisClient[] = [];

  const start = async (): Promise<void> => {
    proc = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let failed: Error | undefined;
    proc.once(
      'error',
      (e) => (failed = Object.assign(new Error(`redis-server could not start (${e.message}); install Debian's package redis-server`), { cause: e })),
    );
    const end = Date.now() + 10_000;
    while (!existsSync(socket)) {
      if (failed) throw failed;
      if (Date.now() > end) throw new Error('redis-server did not open its socket within 10 s');
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const stop = async (): Promise<void> => {
    const p = proc;
    proc = undefined;
    if (!p || p.exitCode !== null) return;
    const exited = new Promise((r) => p.once('exit', r));
    p.kill('SIGTERM'); // redis flushes its append-only file and exits
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    if (p.exitCode === null) p.kill('SIGKILL');
    rmSync(socket, { force: true });
  };
  await start();
  return {
    socket,
    dir,
    async client() {
      const c = binaryClient(socket);
      c.on('error', () => undefined);
      await c.connect();
      clients.push(c);
      return c;
    },
    stop,
    start,
    async pause(ms) {
      const pid = proc?.pid;
      if (pid === undefined || proc!.exitCode !== null) throw new Error('redis-server is not running: start() it first');
      process.kill(pid, 'SIGSTOP');
      const waker = spawn('/bin/sh', ['-c', `sleep ${ms / 1000}; kill -CONT ${pid}`], { stdio: 'ignore' });
      await new Promise((r) => {
        waker.once('exit', r);
        waker.once('error', () => r(process.kill(pid, 'SIGCONT'))); // no sh: wake it now rather than never
      });
    },
    async dispose() {
      for (const c of clients.splice(0)) c.destroy();
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
