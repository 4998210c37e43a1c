// The server of test/fixtures/port-server.mjs in a child process (a crash there is its own,
// its exit status and signal asserted), what it reports, and the real client it serves: this
// process as node 0, connected for one RDMA WRITE into the server's MR.
import { fork, type ChildProcess } from 'node:child_process';
import { openSync, readSync, closeSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { Access, Cluster, LibfabricTransport, mapRegion, QpState, SendFlags, WcStatus, WrOpcode, type LibfabricOptions } from '../../lib/index.js';
import { ROOT } from '../child.js';
import { next } from '../verbs/helpers.js';

export interface Report {
  stats: ReturnType<LibfabricTransport['stats']>;
  /** Bytes of the region outside the MR that are not the 0x33 it was filled with (the server's own view). */
  outside: number;
  rssKiB: number;
  /** V8's heap in use. */
  heapKiB: number;
  fds: number;
  inflight: number;
  answersRefused: number;
  served: number;
  /** Nodes the server lost, in order. */
  lost: number[];
}

export interface PortServer {
  child: ChildProcess;
  port: number;
  pid: number;
  /** The region's address and size in the server (what /proc/PID/mem is read at). */
  region: { address: bigint; size: number };
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>;
  report(): Promise<Report>;
  /** Bytes outside the MR that are not 0x33, read through /proc/PID/mem (the kernel's view, not the server's). */
  outsideByMem(): number;
  /** Still running: no exit status and no signal yet. */
  alive(): boolean;
}

const running = new Set<ChildProcess>();
afterAll(() => {
  for (const c of running) c.kill('SIGKILL');
});

/** Start the server with these transport options (JSON: `peers: null` lifts the peers bound). */
export async function startServer(options: Partial<Omit<LibfabricOptions, 'peers'>> & { peers?: number[] | null } = {}): Promise<PortServer> {
  const child = fork(join(ROOT, 'test/fixtures/port-server.mjs'), [JSON.stringify(options)], {
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    cwd: ROOT,
  });
  running.add(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>((resolve) =>
    child.on('exit', (code, signal) => {
      running.delete(child);
      resolve({ code, signal, stderr });
    }),
  );
  const ready = await new Promise<{ port: number; pid: number; region: string; size: number }>((resolve, reject) => {
    child.once('message', (m: { ready: { port: number; pid: number; region: string; size: number } }) => resolve(m.ready));
    void exit.then((e) => reject(new Error(`the port server ended before it listened: ${JSON.stringify(e)}`)));
  });
  const region = { address: BigInt(ready.region), size: ready.size };
  return {
    child,
    port: ready.port,
    pid: ready.pid,
    region,
    exit,
    alive: () => child.exitCode === null && child.signalCode === null,
    report: () =>
      new Promise((resolve) => {
        const take = (m: { report?: Report }) => {
          if (!m.report) return;
          child.removeListener('message', take);
          resolve(m.report);
        };
        child.on('message', take);
        child.send('report');
      }),
    outsideByMem: () => {
      const fd = openSync(`/proc/${ready.pid}/mem`, 'r');
      try {
        const b = Buffer.alloc(region.size - 4 * 4096);
        readSync(fd, b, 0, b.length, Number(region.address) + 4 * 4096);
        return b.filter((x) => x !== 0x33).length;
      } finally {
        closeSync(fd);
      }
    },
  };
}

/** Node 0's side of the port server's exchange over `t`: its QP connected to the server's, and where the server's MR is. */
export async function clientQp(t: LibfabricTransport) {
  const cluster = Cluster.create({ nodes: 2, transport: t });
  const ctx = cluster.openDevice(0);
  const pd = ctx.allocPd();
  const cq = ctx.createCq(16);
  const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
  const server = await t.exchange<{ qpn: number; addr: bigint; rkey: number }>({ qpn: qp.qpNum }, 10_000);
  qp.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: Access.LOCAL_WRITE });
  qp.modify({ qpState: QpState.RTR, destQpNum: server.qpn, destNode: 1 });
  qp.modify({ qpState: QpState.RTS });
  return { cluster, ctx, pd, cq, qp, server };
}

/**
 * The real client: connect as node 0, swap QP numbers, RDMA WRITE 64 bytes of `fill` into the
 * server's MR; resolves with the write's status (the transport closed after it).
 */
export async function realClient(port: number, fill = 0x5a, options: Partial<LibfabricOptions> = {}): Promise<WcStatus> {
  const t = await LibfabricTransport.connect({ host: '127.0.0.1', port, localNodes: [0], peers: [1], timeoutMs: 10_000, ...options });
  const src = mapRegion(4096);
  let cluster: Cluster | undefined;
  try {
    const c = await clientQp(t);
    cluster = c.cluster;
    new Uint8Array(src.buffer).fill(fill);
    const mr = c.ctx.regMr(c.pd, src, 0, 4096, Access.LOCAL_WRITE);
    c.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: src.address, length: 64, lkey: mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: c.server.addr, rkey: c.server.rkey },
    });
    return (await next(c.cq, 10_000)).status;
  } finally {
    cluster?.close();
    t.close();
    src.close();
  }
}
