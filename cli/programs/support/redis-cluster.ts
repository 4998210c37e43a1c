// A real Redis Cluster for the tests and bench-remote: redis-server masters on loopback ports
// (cluster mode, no replicas) in a temporary folder, joined by `redis-cli --cluster create`
// (one master alone takes every slot), stopped by the caller. `cluster-require-full-coverage no`: a master that dies stops
// only its own slots, so the others keep serving (what a pager over many memory servers wants).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface RedisCluster {
  /** The masters, as RemotePager's { redis: { cluster } } takes them. */
  nodes: { host: string; port: number }[];
  dir: string;
  /** Kill master i (SIGKILL): its slots stop answering. */
  kill(i: number): Promise<void>;
  /** Stop every master and remove the folder. */
  dispose(): Promise<void>;
}

/** Why a cluster cannot be started here (a missing program), or undefined. */
export function clusterUnavailable(): string | undefined {
  for (const p of ['redis-server', 'redis-cli']) {
    if (spawnSync(p, ['--version'], { stdio: 'ignore' }).status !== 0)
      return `${p} is not installed (Debian: apt-get install redis-server, which brings redis-tools)`;
  }
  return undefined;
}

// A free loopback port whose cluster bus port (port + 10000) is free too.
async function freePort(): Promise<number> {
  for (let tries = 0; tries < 50; tries++) {
    const port = await new Promise<number>((resolve, reject) => {
      const s = createServer().once('error', reject);
      s.listen(0, '127.0.0.1', () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    if (port + 10000 > 65535) continue;
    const busFree = await new Promise<boolean>((resolve) => {
      const s = createServer().once('error', () => resolve(false));
      s.listen(port + 10000, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (busFree) return port;
  }
  throw new Error('no free loopback port pair (port, port + 10000) for a cluster node');
}

/** `parent`: where its folder goes (default the temporary folder). */
export async function startRedisCluster(masters = 3, parent = tmpdir()): Promise<RedisCluster> {
  const dir = mkdtempSync(join(parent, 'pfr-redis-cluster-'));
  const procs: ChildProcess[] = [];
  const nodes: { host: string; port: number }[] = [];
  const stop = async (p: ChildProcess, signal: NodeJS.Signals): Promise<void> => {
    if (p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((r) => p.once('exit', r));
    p.kill(signal);
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  };
  const dispose = async (): Promise<void> => {
    await Promise.all(procs.map((p) => stop(p, 'SIGTERM')));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < masters; i++) {
      const port = await freePort();
      // prettier-ignore
      const args = ['--port', String(port), '--bind', '127.0.0.1', '--cluster-enabled', 'yes', '--cluster-config-file', `nodes-${port}.conf`,
        '--cluster-require-full-coverage', 'no', '--cluster-node-timeout', '2000', '--dir', dir, '--save', '', '--appendonly', 'no',
        '--daemonize', 'no', '--loglevel', 'warning'];
      const p = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
      procs.push(p);
      nodes.push({ host: '127.0.0.1', port });
    }
    // Each must answer before the cluster is made.
    for (const n of nodes) await until(() => cli(n.port, ['PING']).trim() === 'PONG', `redis-server on port ${n.port} to answer`);
    // redis-cli --cluster create wants three masters at least; one takes every slot itself.
    const args =
      masters === 1
        ? ['-p', String(nodes[0]!.port), 'CLUSTER', 'ADDSLOTSRANGE', '0', '16383']
        : ['--cluster', 'create', ...nodes.map((n) => `${n.host}:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'];
    const made = spawnSync('redis-cli', args, { encoding: 'utf8', timeout: 30_000 });
    if (made.status !== 0 || /ERR/.test(made.stdout)) throw new Error(`redis-cli ${args.join(' ')} failed: ${made.stdout}${made.stderr}`);
    for (const n of nodes) await until(() => /cluster_state:ok/.test(cli(n.port, ['CLUSTER', 'INFO'])), `node ${n.port} to see the cluster ok`);
  } catch (err) {
    await dispose();
    throw err;
  }
  return {
    nodes,
    dir,
    kill: (i) => stop(procs[i]!, 'SIGKILL'),
    dispose,
  };
}

function cli(port: number, args: string[]): string {
  return spawnSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8', timeout: 5000 }).stdout ?? '';
}

async function until(ok: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`redis cluster: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
