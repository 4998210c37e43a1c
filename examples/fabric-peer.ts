// Two processes, one RDMA node each, joined by libfabric (the way ibv_rc_pingpong and
// perftest run: a server in one terminal, a client in another, possibly on another host).
// The server hosts node 1 and listens; the client hosts node 0 and connects; they swap the
// run's parameters, then QP numbers, buffer addresses and rkeys, as rc_pingpong does over its
// socket. Buffers are memfd-backed (shared) so that evicting them (MADV_DONTNEED) keeps the
// bytes: every fault is genuine and the payload can still be verified.
//   send:  ping-pong, each side evicts its buffer before every message (faults at both ends)
//   write: the client evicts its source before every write; the server's buffer starts evicted
//   read:  the client evicts its sink before every read; the server's buffer starts evicted
import {
  Access,
  Cluster,
  LibfabricTransport,
  mapRegion,
  QP_DEFAULTS,
  QpState,
  SendFlags,
  WcStatus,
  WrOpcode,
  type CompletionQueue,
  type LibfabricProvider,
  type PolicyName,
  type QueuePair,
  type Region,
  type WorkCompletion,
} from '../lib/index.js';

export type FabricOp = 'send' | 'write' | 'read';

/** What the client decides and the server adopts. */
export interface RunParams {
  op: FabricOp;
  size: number;
  iters: number;
  evict: boolean;
  odp: boolean;
  policy: PolicyName;
}

export interface PeerOptions extends RunParams {
  /** Client: the server's host; absent: run the server. */
  host?: string | undefined;
  port: number;
  provider?: LibfabricProvider;
  /** Server: told the port it listens on (useful with port 0). */
  onListening?: (port: number) => void;
  /** Told the local and remote QP numbers, addresses and keys once they are swapped. */
  onConnected?: (local: Endpoint, remote: Endpoint) => void;
}

export interface Endpoint {
  node: number;
  qpn: number;
  addr: bigint;
  rkey: number;
}

export interface PeerResult {
  role: 'server' | 'client';
  params: RunParams;
  provider: LibfabricProvider;
  /** Bytes compared with what the other side wrote or sent (all must match). */
  bytesVerified: number;
  mismatches: number;
  /** The first failed work completion's status string (the run stops there). */
  error?: string;
  faults: { source: number; destination: number };
  retransmitted: number;
  /** NACKs this node's engine received (destination faults of the transfers it sent). */
  nacks: number;
  /** Round trip (send) or completion time (write, read) of each iteration, µs (measured). */
  realUs: number[];
  seconds: number;
  /** The server's own counters, as it reported them at the end (client only). */
  peer?: { bytesVerified: number; mismatches: number; nacks: number };
}

const CLIENT = 0;
const SERVER = 1;

/** The byte at `i` of iteration `it`'s payload from `who` (c: client, s: server). */
function pattern(buf: Uint8Array, len: number, it: number, who: 'c' | 's'): void {
  const k = who === 'c' ? 17 : 29;
  for (let i = 0; i < len; i++) buf[i] = (i * k + it * 7 + 1) & 0xff;
}

function compare(buf: Uint8Array, len: number, it: number, who: 'c' | 's'): number {
  const want = new Uint8Array(len);
  pattern(want, len, it, who);
  let bad = 0;
  for (let i = 0; i < len; i++) if (buf[i] !== want[i]) bad++;
  return bad;
}

function connect(qp: QueuePair, remote: Endpoint): void {
  qp.modify({
    qpState: QpState.INIT,
    portNum: 1,
    qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC,
  });
  qp.modify({ qpState: QpState.RTR, destQpNum: remote.qpn, destNode: remote.node, minRnrTimer: QP_DEFAULTS.minRnrTimer });
  qp.modify({ qpState: QpState.RTS, timeout: QP_DEFAULTS.timeout, retryCnt: QP_DEFAULTS.retryCnt, rnrRetry: QP_DEFAULTS.rnrRetry });
}

async function completion(cq: CompletionQueue): Promise<WorkCompletion> {
  return cq.next({ timeoutMs: 30_000 });
}

/** Run one side; resolves with its result (a failed work completion is reported in `error`, not thrown). */
export async function runPeer(o: PeerOptions): Promise<PeerResult> {
  const role = o.host === undefined ? 'server' : 'client';
  const me = role === 'server' ? SERVER : CLIENT;
  const provider = o.provider ?? 'tcp';
  let transport: LibfabricTransport;
  if (role === 'server') {
    transport = LibfabricTransport.listen({ port: o.port, provider, localNodes: [SERVER] });
    o.onListening?.(transport.port);
    await transport.waitForPeer();
  } else {
    transport = await LibfabricTransport.connect({ host: o.host!, port: o.port, provider, localNodes: [CLIENT] });
  }
  const cluster = Cluster.create({ nodes: 2, transport });
  let buf: Region | undefined;
  try {
    const theirs = await transport.exchange<RunParams | null>(role === 'client' ? pickParams(o) : null);
    const params = role === 'client' ? pickParams(o) : theirs!;
    const ctx = cluster.openDevice(me, { defaultPolicy: params.policy });
    const pd = ctx.allocPd();
    const cq = ctx.createCq(256);
    const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
    const bytes = Math.max(4096, Math.ceil(params.size / 4096) * 4096);
    buf = mapRegion(bytes, { shared: true });
    const view = new Uint8Array(buf.buffer);
    const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | (params.odp ? Access.ON_DEMAND : 0);
    const mr = ctx.regMr(pd, buf, 0, bytes, access, { policy: params.policy });
    const local: Endpoint = { node: me, qpn: qp.qpNum, addr: mr.addr, rkey: mr.rkey };
    const remote = await transport.exchange<Endpoint>(local);
    connect(qp, remote);
    o.onConnected?.(local, remote);
    const sge = [{ addr: mr.addr, length: params.size, lkey: mr.lkey }];
    const r: PeerResult = {
      role,
      params,
      provider,
      bytesVerified: 0,
      mismatches: 0,
      faults: { source: 0, destination: 0 },
      retransmitted: 0,
      nacks: 0,
      realUs: [],
      seconds: 0,
    };
    const count = (wc: WorkCompletion) => {
      if (wc.status !== WcStatus.SUCCESS) r.error ??= `${wc.statusStr} (${WcStatus[wc.status]})`;
      if (wc.odp) {
        r.faults.source += wc.odp.faults.source;
        r.faults.destination += wc.odp.faults.destination;
        r.retransmitted += wc.odp.retransmittedBlocks;
      }
      return wc.status === WcStatus.SUCCESS;
    };
    // The server's passive buffer starts evicted: the first write or read faults there.
    if (params.op !== 'send' && role === 'server') {
      if (params.op === 'read') pattern(view, params.size, 0, 's');
      if (params.evict) buf.unmapPages();
    }
    await transport.exchange('ready');
    const t0 = performance.now();
    if (params.op === 'send') {
      for (let it = 0; it < params.iters && !r.error; it++) {
        const t = performance.now();
        if (role === 'client') {
          pattern(view, params.size, it, 'c');
          if (params.evict) buf.unmapPages();
          qp.postRecv({ wrId: BigInt(it), sgList: sge });
          qp.postSend({ wrId: BigInt(it), opcode: WrOpcode.SEND, sgList: sge, sendFlags: SendFlags.SIGNALED });
          for (let k = 0; k < 2 && !r.error; k++) count(await completion(cq));
          if (r.error) break;
          r.mismatches += compare(view, params.size, it, 's');
          r.bytesVerified += params.size;
        } else {
          if (params.evict) buf.unmapPages();
          qp.postRecv({ wrId: BigInt(it), sgList: sge });
          if (!count(await completion(cq))) break;
          r.mismatches += compare(view, params.size, it, 'c');
          r.bytesVerified += params.size;
          pattern(view, params.size, it, 's');
          if (params.evict) buf.unmapPages();
          qp.postSend({ wrId: BigInt(it), opcode: WrOpcode.SEND, sgList: sge, sendFlags: SendFlags.SIGNALED });
          count(await completion(cq));
        }
        r.realUs.push((performance.now() - t) * 1000);
      }
    } else if (role === 'client') {
      const opcode = params.op === 'write' ? WrOpcode.RDMA_WRITE : WrOpcode.RDMA_READ;
      for (let it = 0; it < params.iters && !r.error; it++) {
        if (params.op === 'write') pattern(view, params.size, it, 'c');
        if (params.evict) buf.unmapPages();
        const t = performance.now();
        qp.postSend({ wrId: BigInt(it), opcode, sgList: sge, sendFlags: SendFlags.SIGNALED, rdma: { remoteAddr: remote.addr, rkey: remote.rkey } });
        if (!count(await completion(cq))) break;
        r.realUs.push((performance.now() - t) * 1000);
        if (params.op === 'read') {
          r.mismatches += compare(view, params.size, 0, 's');
          r.bytesVerified += params.size;
        }
      }
    }
    r.seconds = (performance.now() - t0) / 1000;
    // The end: once the client is done, the server checks what was written into its buffer
    // (not before: reading it would make its pages resident) and both report their counters.
    const finished = await transport.exchange('done', r.error ? 1000 : 600_000).catch(() => undefined);
    r.nacks = cluster.system.node(me).pldma.counters().nacksReceived;
    if (params.op === 'write' && role === 'server' && finished !== undefined) {
      r.mismatches += compare(view, params.size, params.iters - 1, 'c');
      r.bytesVerified += params.size;
    }
    const mine = { bytesVerified: r.bytesVerified, mismatches: r.mismatches, nacks: r.nacks };
    const peer = await transport.exchange<typeof mine>(mine, r.error ? 1000 : 30_000).catch(() => undefined);
    if (role === 'client' && peer) r.peer = peer;
    return r;
  } finally {
    cluster.close();
    transport.close();
    buf?.close();
  }
}

function pickParams(o: PeerOptions): RunParams {
  return { op: o.op, size: o.size, iters: o.iters, evict: o.evict, odp: o.odp, policy: o.policy };
}
