// A fabric program's server under --supervise: the server runs in a child process of its own,
// and this process only watches it (it never loads libfabric). libfabric 1.17's tcp provider
// crashes (SIGSEGV) on some messages anyone who reaches the port can send before any hello,
// and nothing inside the process can refuse them first (README, "Security"). A child that dies
// of a signal while it waits for its client is started again on the same port: the server goes
// on. One that dies during its client's run ends this process too, saying so: the run is lost.
import { fork } from 'node:child_process';
import { printErr } from './programs/support/format.js';

/** Set in the supervised child: the port it listens on ('' the first time: the one -p says). */
export const WORKER_ENV = 'PFR_FABRIC_WORKER';
/** Crashes while waiting, at most, before the supervisor gives up (each one a restart). */
export const MAX_RESTARTS = 20;

/** What the child tells its supervisor: the port it listens on, then that its client's run began. */
type Note = { listening: number } | { serving: true };

/** In the supervised child: the port to listen on (undefined: the one given), or undefined if this is no such child. */
export function workerPort(): { port: number | undefined } | undefined {
  const v = process.env[WORKER_ENV];
  if (v === undefined) return undefined;
  // A supervisor that goes away takes its child with it (it cannot be signalled otherwise).
  if (process.listenerCount('disconnect') === 0) process.once('disconnect', () => process.kill(process.pid, 'SIGKILL'));
  // The channel keeps no one alive: the child ends when its run does.
  process.channel?.unref();
  return { port: v === '' ? undefined : Number(v) };
}

/** In the supervised child: tell the supervisor (nothing outside one). */
export function tellSupervisor(note: Note): void {
  if (process.env[WORKER_ENV] !== undefined) process.send?.(note);
}

/** Run this same command as a supervised child, again after each crash while it waits; returns the exit code. */
export async function supervise(name: string): Promise<number> {
  let port: number | undefined;
  // Ctrl-C reaches the child too (one process group): it ends the run, this waits for it.
  const ignore = () => {};
  process.on('SIGINT', ignore);
  try {
    for (let restarts = 0; ; restarts++) {
      const child = fork(process.argv[1]!, process.argv.slice(2), { env: { ...process.env, [WORKER_ENV]: port === undefined ? '' : String(port) } });
      let serving = false;
      child.on('message', (m: Note) => {
        if ('listening' in m) port = m.listening;
        else serving = true;
      });
      let forwarded = false;
      const forward = () => {
        forwarded = true;
        child.kill('SIGTERM');
      };
      process.on('SIGTERM', forward);
      const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => child.on('exit', (c, s) => resolve([c, s])));
      process.removeListener('SIGTERM', forward);
      if (!signal) return code ?? 1;
      // Ended as this process was asked to end: so does this one, the same way.
      if (forwarded && signal === 'SIGTERM') process.kill(process.pid, 'SIGTERM');
      const why = `${name}: the server process (pid ${child.pid}) was killed by ${signal}`;
      if (serving || port === undefined) {
        printErr(`${why} ${serving ? "during its client's run: the run is lost" : 'before it listened'}`);
        return 1;
      }
      if (restarts === MAX_RESTARTS) {
        printErr(`${why} while it waited for a client, ${MAX_RESTARTS + 1} times: giving up`);
        return 1;
      }
      printErr(
        `${why} while it waited for a client (a provider crash on what a stranger sent: README, "Security"); ` +
          `listening again on port ${port} (restart ${restarts + 1} of ${MAX_RESTARTS})`,
      );
    }
  } finally {
    process.removeListener('SIGINT', ignore);
  }
}
