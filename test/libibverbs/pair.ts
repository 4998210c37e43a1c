// Two processes of one verbs program on loopback, as their users run them: the server first
// (its TCP port listening), then the client naming 127.0.0.1; both to their end, with a timeout.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { verbsEnv } from '../device/fixture.js';

/** A TCP socket listens on `port` (from /proc/net/tcp*: a probe connection would be taken for a client). */
export function listening(port: number): boolean {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')} `;
  return ['/proc/net/tcp', '/proc/net/tcp6'].some(
    (f) =>
      existsSync(f) &&
      readFileSync(f, 'utf8')
        .split('\n')
        .some((l) => l.includes(hex) && / 0A /.test(l)),
  );
}

export interface Run {
  status: number | null;
  signal: NodeJS.Signals | null;
  out: string;
}

let next = 0;

/** A TCP port of this run's own (pid-based, so two suites in parallel do not meet). */
export function freePort(): number {
  for (;;) {
    const port = 20000 + ((process.pid * 37 + next++ * 7) % 30000);
    if (!listening(port)) return port;
  }
}

/** Run `cmd args` with the device of `dir`; resolves at its exit (killed after `timeoutMs`). */
export function run(dir: string, cmd: string, args: string[], timeoutMs: number): { done: Promise<Run>; pid: number | undefined; kill(): void } {
  const child = spawn(cmd, args, { env: verbsEnv(dir), stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const done = new Promise<Run>((resolve) =>
    child.once('close', (status, signal) => {
      clearTimeout(timer);
      resolve({ status, signal, out });
    }),
  );
  return { done, pid: child.pid, kill: () => child.kill('SIGKILL') };
}

/** The server (`args` and `-p PORT` after `portFlag`), then the client (the same and 127.0.0.1 or `host`). */
export async function pair(
  dir: string,
  cmd: string,
  args: string[],
  { timeoutMs = 60_000, host = '127.0.0.1', portFlag = '-p' }: { timeoutMs?: number; host?: string; portFlag?: string } = {},
): Promise<{ server: Run; client: Run }> {
  const port = freePort();
  const a = [...args, portFlag, String(port)];
  const server = run(dir, cmd, a, timeoutMs);
  for (let i = 0; i < 400 && !listening(port); i++) await new Promise((r) => setTimeout(r, 25));
  const client = run(dir, cmd, [...a, host], timeoutMs);
  const [s, c] = await Promise.all([server.done, client.done]);
  return { server: s, client: c };
}
