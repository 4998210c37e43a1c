// `pagefault-rdma device`: the device process of this host and user (kernel-sim/device), which
// the project's libibverbs.so.1 talks to: Debian's unmodified verbs programs see it as the
// RDMA device pfr0. Run by hand with its log on stderr, or started on demand by `exec`, which
// gives it an idle timeout. One per runtime folder: a second one refuses to start.
import { readFileSync } from 'node:fs';
import { InvalidArgumentError } from 'commander';
import { Device, type DeviceStats } from '../../kernel-sim/device/device.js';
import { runtimeDir } from '../../kernel-sim/device/runtime-dir.js';
import { defineProgram } from '../program.js';

interface Options {
  dir?: string;
  idleTimeout: number;
  name: string;
}

function parseSeconds(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError('expected seconds (0: never)');
  return n;
}

/** One line of what the device counted, and its refusals by reason. */
export function statsLine(s: DeviceStats): string {
  const refused = Object.entries(s.refused).filter(([, n]) => n > 0);
  const total = refused.reduce((a, [, n]) => a + n, 0);
  return (
    `connections ${s.connections} | messages ${s.messages} | refused ${total}` +
    `${refused.length ? ` (${refused.map(([r, n]) => `${r.toLowerCase()} ${n}`).join(', ')})` : ''} | ` +
    `faults raised ${s.faultsRaised}, resolved ${s.faultsResolved}, failed ${s.faultsFailed} | objects released ${s.releasedObjects}` +
    (s.dataPath
      ? ` | WQEs ${s.dataPath.sendWqes} sent, ${s.dataPath.recvWqes} received, ${s.dataPath.refusedWqes} refused, ` +
        `${s.dataPath.corruptRings} corrupt rings | CQEs ${s.dataPath.cqes} | doorbells ${s.dataPath.doorbells}`
      : '')
  );
}

const version = (JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string }).version;

export default defineProgram<Options>({
  name: 'device',
  summary: "run this host's RDMA device for unmodified verbs programs (the project's libibverbs talks to it)",
  description:
    "The device process: programs run with the project's libibverbs.so.1 (`pagefault-rdma exec -- PROGRAM`, or " +
    "LD_LIBRARY_PATH=$(pagefault-rdma libdir)) see it as the RDMA device pfr0, a RoCEv2 port on this host's interfaces " +
    'with on-demand paging. It listens on the control socket of its runtime folder ($PFR_DEVICE_DIR, else ' +
    '$XDG_RUNTIME_DIR/pagefault-rdma, else /tmp/pagefault-rdma-UID; 0700, the socket 0600), logs to stderr, and stops on ' +
    'SIGINT or SIGTERM (or after --idle-timeout seconds with no program), printing what it counted.',
  noTrace: 'the device traces nothing yet: its data path comes with the device-owned queues',
  options(cmd) {
    cmd
      .option('--dir <folder>', 'the runtime folder (default: as the library finds it)')
      .option('--idle-timeout <seconds>', 'stop after this long with no program connected (0: never)', parseSeconds, 0)
      .option('--name <name>', 'the device name programs see', 'pfr0');
  },
  async run(o) {
    const log = (line: string): void => {
      process.stderr.write(`${new Date().toISOString()} device: ${line}\n`);
    };
    let idle: () => void = () => {};
    const stopped = new Promise<string>((resolve) => {
      process.once('SIGINT', () => resolve('SIGINT'));
      process.once('SIGTERM', () => resolve('SIGTERM'));
      idle = () => resolve(`idle for ${o.idleTimeout} s`);
    });
    const device = Device.start({
      dir: o.dir ?? runtimeDir(),
      name: o.name,
      version,
      idleTimeoutMs: o.idleTimeout * 1000,
      onIdle: () => idle(),
      log,
    });
    log(`${device.name} listening on ${device.socketPath} (pid ${process.pid}; GIDs ${device.gids.map((g) => g.text).join(', ') || 'none'})`);
    const why = await stopped;
    const stats = device.stats();
    device.close();
    log(`stopped (${why}): ${statsLine(stats)}`);
    return { results: { dir: device.dir, stopped: why, ...stats } };
  },
});
