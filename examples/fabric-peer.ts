// Two processes, one RDMA node each, joined by libfabric (the way ibv_rc_pingpong and
// perftest run: a server in one terminal, a client in another, possibly on another host).
// The server hosts node 1 and listens; the client hosts node 0 and connects; they swap the
// run's parameters, then QP numbers, buffer addresses and rkeys, as rc_pingpong does over its
// socket. Buffers are memfd-backed (shared) so that evicting them (MADV_DONTNEED) keeps the
// bytes: every fault is genuine and the payload can still be verified.
//   send:  ping-pong, each side evicts its buffer before every message (faults at both ends)
//   write: the client evicts its source before every write; the server's buffer starts evicted
//   read:  the client evicts its sink before every read; the server's buffer starts evicted
//   atomic: the client's FETCH_AND_ADD 1 (or CMP_AND_SWAP i → i+1) on the server's first 8
//          bytes, its 8-byte sink evicted before each; the server's buffer starts evicted.
//          Iteration i must return i, and the server's word ends at iters.
// Stall mode (faultModel 'stall', write only): the client's writes are libfabric RMA writes
// straight into the server's buffer, which is anonymous memory registered on the server's
// userfaultfd; with --evict the server evicts it before each write (the client asks). The server's provider places them on a native progress
// thread; a write that lands on a missing page blocks that thread in a genuine fault, which
// the server's SMMU stalls and its fault library resolves (netlink, CMD_RESUME): the JS thread
// serving the fault is never the one blocked.
import type { FaultModel, SimNode } from '../kernel-sim/index.js';
import {
  Access,
  Cluster,
  LibfabricTransport,
  mapRegion,
  peerTimeoutMs,
  QP_DEFAULTS,
  QpState,
  SendFlags,
  WcStatus,
  wcStatusStr,
  WrOpcode,
  type CompletionQueue,
  type LibfabricProvider,
  type PolicyName,
  type QueuePair,
  type Region,
  type Fault,
  type WorkCompletion,
  Userfaultfd,
} from '../lib/index.js';

export type FabricOp = 'send' | 'write' | 'read' | 'atomic';

/** perftest's -A: the atomic operation of an 'atomic' run. */
export type AtomicType = 'FETCH_AND_ADD' | 'CMP_AND_SWAP';

/** What the client decides and the server adopts. */
export interface RunParams {
  op: FabricOp;
  size: number;
  iters: number;
  evict: boolean;
  odp: boolean;
  policy: PolicyName;
  /** 'terminate' (the default): engine packets, faults NACKed; 'stall': libfabric RMA writes that block in the target's faults. */
  faultModel?: FaultModel;
  /** perftest's -a: every size from 2 to 2^23 bytes (powers of two), `iters` each; `size` is then ignored. */
  all?: boolean;
  /** The 'atomic' op's operation (default FETCH_AND_ADD). */
  atomicType?: AtomicType;
}

/** perftest's -a sizes: 2, 4, … 2^23 bytes. */
export const ALL_SIZES: readonly number[] = Array.from({ length: 23 }, (_, i) => 2 ** (i + 1));

/** The message sizes a run goes through, in order. */
export function runSizes(p: RunParams): number[] {
  return p.all ? [...ALL_SIZES] : [p.size];
}

/** One message size's measurements. */
export interface SizeRun {
  size: number;
  /** Round trip (send) or completion time (write, read) of each iteration, µs (measured). */
  realUs: number[];
  seconds: number;
}

export interface PeerOptions extends RunParams {
  /** Client: the server's host; absent: run the server. */
  host?: string | undefined;
  port: number;
  /** Server: the address to listen on (default 127.0.0.1, this host only; 0.0.0.0: every interface). */
  bind?: string;
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
  /** Each size's measurements (one size unless -a), in order; the client's (and both sides' for send). */
  runs: SizeRun[];
  /** The server's own counters, as it reported them at the end (client only). */
  peer?: { bytesVerified: number; mismatches: number; nacks: number; stall?: StallReport };
  /** Stall mode, server side: which thread blocked in the faults and who resolved them. */
  stall?: StallReport;
  /** Frames and connections the transport refused (malformed, before a hello, a node not the connection's). */
  refused: number;
}

export interface StallReport {
  /** The native thread that progresses the RMA connection (places the peer's writes). */
  progressTid: number;
  /** The JavaScript thread (serves the userfaultfd, runs the fault library). */
  jsTid: number;
  /** Distinct threads that faulted on the buffer, and how the faults were resolved. */
  faultTids: number[];
  faultsByHandler: number;
  faultsNative: number;
  /** Stalls the SMMU recorded, and faults the fault library resolved (destination side). */
  smmuStalls: number;
  libraryFaults: number;
  /** Pages the writes found evicted (--evict: the server evicts its buffer before each write). */
  pagesTouched: number;
}

const CLIENT = 0;
const SERVER = 1;
/**
 * The QPs' local ACK timeout between processes (268 ms; 14, the in-process default, gives
 * 67 ms, which a loaded machine's scheduling pauses can exceed). A peer silent for this times
 * retry_cnt + 1 is lost: its work requests end with RETRY_EXC_ERR.
 */
const QP_TIMEOUT = 16;
const PEER_TIMEOUT_MS = peerTimeoutMs(QP_TIMEOUT, QP_DEFAULTS.retryCnt);

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
  qp.modify({ qpState: QpState.RTS, timeout: QP_TIMEOUT, retryCnt: QP_DEFAULTS.retryCnt, rnrRetry: QP_DEFAULTS.rnrRetry });
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
    transport = LibfabricTransport.listen({
      port: o.port,
      provider,
      localNodes: [SERVER],
      peerTimeoutMs: PEER_TIMEOUT_MS,
      ...(o.bind !== undefined ? { host: o.bind } : {}),
    });
    o.onListening?.(transport.port);
    await transport.waitForPeer();
  } else {
    transport = await LibfabricTransport.connect({ host: o.host!, port: o.port, provider, localNodes: [CLIENT], peerTimeoutMs: PEER_TIMEOUT_MS });
  }
  const cluster = Cluster.create({ nodes: 2, transport });
  let buf: Region | undefined;
  try {
    const theirs = await transport.exchange<RunParams | null>(role === 'client' ? pickParams(o) : null);
    const params = role === 'client' ? pickParams(o) : theirs!;
    if ((params.faultModel ?? 'terminate') === 'stall') {
      const r = await runStall(role, params, provider, transport, cluster, o.onConnected);
      r.refused = transport.stats().refused;
      return r;
    }
    const ctx = cluster.openDevice(me, { defaultPolicy: params.policy });
    const pd = ctx.allocPd();
    const cq = ctx.createCq(256);
    const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
    const sizes = runSizes(params);
    const largest = Math.max(...sizes);
    const bytes = Math.max(4096, Math.ceil(largest / 4096) * 4096);
    const region = (buf = mapRegion(bytes, { shared: true }));
    const view = new Uint8Array(region.buffer);
    const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | (params.odp ? Access.ON_DEMAND : 0);
    const mr = ctx.regMr(pd, buf, 0, bytes, access, { policy: params.policy });
    const local: Endpoint = { node: me, qpn: qp.qpNum, addr: mr.addr, rkey: mr.rkey };
    const remote = await transport.exchange<Endpoint>(local);
    connect(qp, remote);
    o.onConnected?.(local, remote);
    const r = emptyResult(role, params, provider);
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
      if (params.op === 'read') pattern(view, largest, 0, 's');
      if (params.evict) buf.unmapPages();
    }
    await transport.exchange('ready');
    for (const size of sizes) {
      if (r.error) break;
      const run: SizeRun = { size, realUs: [], seconds: 0 };
      if (params.op === 'send' || role === 'client') r.runs.push(run);
      const sge = [{ addr: mr.addr, length: size, lkey: mr.lkey }];
      const t0 = performance.now();
      await iterate(size, sge, run);
      run.seconds = (performance.now() - t0) / 1000;
    }
    // One size's iterations: ping-pong (send), or the client's writes or reads.
    async function iterate(size: number, sge: Array<{ addr: bigint; length: number; lkey: number }>, run: SizeRun): Promise<void> {
      if (params.op === 'send') {
        for (let it = 0; it < params.iters && !r.error; it++) {
          const t = performance.now();
          if (role === 'client') {
            pattern(view, size, it, 'c');
            if (params.evict) region.unmapPages();
            qp.postRecv({ wrId: BigInt(it), sgList: sge });
            qp.postSend({ wrId: BigInt(it), opcode: WrOpcode.SEND, sgList: sge, sendFlags: SendFlags.SIGNALED });
            for (let k = 0; k < 2 && !r.error; k++) count(await completion(cq));
            if (r.error) break;
            r.mismatches += compare(view, size, it, 's');
            r.bytesVerified += size;
          } else {
            if (params.evict) region.unmapPages();
            qp.postRecv({ wrId: BigInt(it), sgList: sge });
            if (!count(await completion(cq))) break;
            r.mismatches += compare(view, size, it, 'c');
            r.bytesVerified += size;
            pattern(view, size, it, 's');
            if (params.evict) region.unmapPages();
            qp.postSend({ wrId: BigInt(it), opcode: WrOpcode.SEND, sgList: sge, sendFlags: SendFlags.SIGNALED });
            count(await completion(cq));
          }
          run.realUs.push((performance.now() - t) * 1000);
        }
      } else if (role === 'client' && params.op === 'atomic') {
        const cas = params.atomicType === 'CMP_AND_SWAP';
        const word = new DataView(region.buffer);
        for (let it = 0; it < params.iters && !r.error; it++) {
          if (params.evict) region.unmapPages();
          const atomic = cas
            ? { remoteAddr: remote.addr, rkey: remote.rkey, compareAdd: BigInt(it), swap: BigInt(it + 1) }
            : { remoteAddr: remote.addr, rkey: remote.rkey, compareAdd: 1n };
          const t = performance.now();
          qp.postSend({
            wrId: BigInt(it),
            opcode: cas ? WrOpcode.ATOMIC_CMP_AND_SWP : WrOpcode.ATOMIC_FETCH_AND_ADD,
            sgList: [{ ...sge[0]!, length: 8 }],
            sendFlags: SendFlags.SIGNALED,
            atomic,
          });
          if (!count(await completion(cq))) break;
          run.realUs.push((performance.now() - t) * 1000);
          // The original value comes back into the sink (host byte order): iteration i's is i.
          if (word.getBigUint64(0, true) !== BigInt(it)) r.mismatches += 8;
          r.bytesVerified += 8;
        }
      } else if (role === 'client') {
        const opcode = params.op === 'write' ? WrOpcode.RDMA_WRITE : WrOpcode.RDMA_READ;
        for (let it = 0; it < params.iters && !r.error; it++) {
          if (params.op === 'write') pattern(view, size, it, 'c');
          if (params.evict) region.unmapPages();
          const t = performance.now();
          qp.postSend({ wrId: BigInt(it), opcode, sgList: sge, sendFlags: SendFlags.SIGNALED, rdma: { remoteAddr: remote.addr, rkey: remote.rkey } });
          if (!count(await completion(cq))) break;
          run.realUs.push((performance.now() - t) * 1000);
          if (params.op === 'read') {
            r.mismatches += compare(view, size, 0, 's');
            r.bytesVerified += size;
          }
        }
      }
    }
    // The end: once the client is done, the server checks what was written into its buffer
    // (not before: reading it would make its pages resident) and both report their counters.
    const finished = await transport.exchange('done', r.error ? 1000 : 600_000).catch(() => undefined);
    r.nacks = cluster.system.node(me).pldma.counters().nacksReceived;
    if (params.op === 'atomic' && role === 'server' && finished !== undefined) {
      if (new DataView(region.buffer).getBigUint64(0, true) !== BigInt(params.iters)) r.mismatches += 8;
      r.bytesVerified += 8;
    }
    if (params.op === 'write' && role === 'server' && finished !== undefined) {
      // The last write of the largest size covers every byte the others wrote.
      r.mismatches += compare(view, largest, params.iters - 1, 'c');
      r.bytesVerified += largest;
    }
    const mine = { bytesVerified: r.bytesVerified, mismatches: r.mismatches, nacks: r.nacks };
    const peer = await transport.exchange<typeof mine>(mine, r.error ? 1000 : 30_000).catch(() => undefined);
    if (role === 'client' && peer) r.peer = peer;
    r.refused = transport.stats().refused;
    return r;
  } finally {
    cluster.close();
    transport.close();
    buf?.close();
  }
}

function pickParams(o: PeerOptions): RunParams {
  const p: RunParams = { op: o.op, size: o.size, iters: o.iters, evict: o.evict, odp: o.odp, policy: o.policy };
  if (o.faultModel) p.faultModel = o.faultModel;
  if (o.all) p.all = true;
  if (o.op === 'atomic') {
    p.size = 8;
    p.atomicType = o.atomicType ?? 'FETCH_AND_ADD';
  }
  return p;
}

function emptyResult(role: PeerResult['role'], params: RunParams, provider: LibfabricProvider): PeerResult {
  return {
    role,
    params,
    provider,
    bytesVerified: 0,
    mismatches: 0,
    faults: { source: 0, destination: 0 },
    retransmitted: 0,
    nacks: 0,
    runs: [],
    refused: 0,
  };
}

/** The server's buffer in stall mode: what its SMMU and fault library need to stall and resolve the provider thread's faults. */
function stallTarget(node: SimNode, pid: number, region: Region, uffd: Userfaultfd, progressTid: number, peerNode: number) {
  // A stream of its own in stall mode (the verbs PDs are terminate-mode streams).
  const stream = node.allocStream({ pid, pd: 0x5a11, faultModel: 'stall' });
  node.map(stream, region, { read: true, write: true });
  // The progress thread is the device: its faults on the window are stalled DMA accesses.
  node.smmu.attachStallSource(uffd, [progressTid]);
  const now = performance.now();
  return node.smmu.beginStallWindow({
    sid: stream.sid,
    region,
    offset: 0,
    length: region.size,
    access: 'write',
    // What the driver forwards with each stall. A provider's write says nothing of its
    // transfer's length, so the hint is one page: each fault resolves the page it hit.
    tag: {
      node: node.id,
      sid: stream.sid,
      side: 'destination',
      srcNode: peerNode,
      tid: 0,
      channel: 0,
      seq: 0,
      va: region.address,
      write: true,
      lengthHint: region.pageSize,
      modelUs: 0,
      detectedMs: now,
      issuedUs: 0,
      issuedMs: now,
    },
  });
}

/** Stall mode: RDMA WRITEs as libfabric RMA writes into the server's unpinned, userfaultfd-registered buffer. */
async function runStall(
  role: PeerResult['role'],
  params: RunParams,
  provider: LibfabricProvider,
  transport: LibfabricTransport,
  cluster: Cluster,
  onConnected: PeerOptions['onConnected'],
): Promise<PeerResult> {
  if (params.op !== 'write')
    throw Object.assign(new Error(`stall mode carries RDMA WRITE only (write-bw, write-lat), not ${params.op}`), { code: 'ERR_INVALID_ARG_VALUE' });
  const me = role === 'server' ? SERVER : CLIENT;
  const r = emptyResult(role, params, provider);
  const sizes = runSizes(params);
  const largest = Math.max(...sizes);
  const bytes = Math.max(4096, Math.ceil(largest / 4096) * 4096);
  // Pages the writes found evicted: with --evict, every page of every write.
  const pagesTouched = params.evict ? sizes.reduce((n, size) => n + Math.ceil(size / 4096), 0) * params.iters : 0;
  if (role === 'server') {
    const uffd = Userfaultfd.open();
    const ctx = cluster.openDevice(me, { defaultPolicy: params.policy, uffd });
    const buf = mapRegion(bytes);
    try {
      // Resident unless --evict: then every page the writes touch is missing (register first,
      // then evict, or THP could populate the range again).
      buf.populate();
      uffd.register(buf);
      if (params.evict) buf.evict();
      const faults: Fault[] = [];
      uffd.on('fault', (f) => faults.push(f));
      const target = transport.openRmaTarget();
      await transport.exchange({ rmaPort: target.port });
      const { progressTid } = await target.accepted;
      const win = stallTarget(cluster.system.node(me), ctx.pid, buf, uffd, progressTid, CLIENT);
      const { key, base } = transport.exposeRma(buf.address, bytes);
      await transport.exchange({ addr: base, key });
      // --evict: before each write the client asks for the buffer to be evicted and waits for
      // the answer, so every write meets missing pages (and the provider thread stalls on each).
      let m = await transport.receive<string>(600_000).catch(() => undefined);
      while (m === 'evict') {
        buf.evict();
        transport.post('evicted');
        m = await transport.receive<string>(600_000).catch(() => undefined);
      }
      const finished = m === 'done';
      if (finished) transport.post('done');
      if (finished) {
        r.mismatches += compare(new Uint8Array(buf.buffer), largest, params.iters - 1, 'c');
        r.bytesVerified += largest;
      }
      r.faults.destination = ctx.faultLibrary.stats().faults.destination;
      r.stall = {
        progressTid,
        jsTid: process.pid,
        faultTids: [...new Set(faults.map((f) => f.threadId))],
        faultsByHandler: faults.filter((f) => f.resolvedBy === 'handler').length,
        faultsNative: faults.filter((f) => f.resolvedBy === 'native').length,
        smmuStalls: win.stalls,
        libraryFaults: r.faults.destination,
        pagesTouched,
      };
      cluster.system.node(me).smmu.endStallWindow(win);
      await transport.exchange({ bytesVerified: r.bytesVerified, mismatches: r.mismatches, nacks: 0, stall: r.stall }, 30_000).catch(() => undefined);
      return r;
    } finally {
      buf.close();
      uffd.close();
    }
  }
  const buf = mapRegion(bytes, { shared: true });
  try {
    const view = new Uint8Array(buf.buffer);
    const { rmaPort } = await transport.exchange<{ rmaPort: number }>(null);
    await transport.connectRma(rmaPort);
    const remote = await transport.exchange<{ addr: bigint; key: bigint }>(null);
    // No QP here: the libfabric endpoints are the queue pairs (QPN 0).
    onConnected?.({ node: CLIENT, qpn: 0, addr: buf.address, rkey: 0 }, { node: SERVER, qpn: 0, addr: remote.addr, rkey: Number(remote.key) });
    for (const size of sizes) {
      if (r.error) break;
      const run: SizeRun = { size, realUs: [], seconds: 0 };
      r.runs.push(run);
      const t0 = performance.now();
      for (let it = 0; it < params.iters && !r.error; it++) {
        pattern(view, size, it, 'c');
        let t = 0;
        try {
          if (params.evict) {
            // The source's pages are memfd pages the kernel maps back (minor faults it resolves
            // itself); the server evicts its buffer and answers before the write goes.
            buf.unmapPages();
            transport.post('evict');
            await transport.receive(30_000);
          }
          t = performance.now();
          await transport.rmaWrite(buf.address, size, remote.addr, remote.key);
        } catch (e) {
          // The peer went away or never answered: what an RDMA WRITE's requester reports then.
          r.error = `${wcStatusStr(WcStatus.RETRY_EXC_ERR)} (RETRY_EXC_ERR): ${(e as Error).message}`;
          break;
        }
        run.realUs.push((performance.now() - t) * 1000);
      }
      // With --evict only the writes count, not the eviction requests between them.
      run.seconds = params.evict ? run.realUs.reduce((a, b) => a + b, 0) / 1e6 : (performance.now() - t0) / 1000;
    }
    await transport.exchange('done', r.error ? 1000 : 600_000).catch(() => undefined);
    const peer = await transport.exchange<NonNullable<PeerResult['peer']>>({}, r.error ? 1000 : 30_000).catch(() => undefined);
    if (peer) {
      r.peer = peer;
      r.faults.destination = peer.stall?.libraryFaults ?? 0;
    }
    return r;
  } finally {
    buf.close();
  }
}
