// All-to-all over a job of many processes (lib/job): every rank RDMA-writes a block into
// every other rank's buffer, on on-demand-paging (ODP) memory that nothing pins. Each rank
// hosts node `rank`, one RC QP per other rank. Before every iteration each rank evicts its
// whole buffer (its blocks to send and the slots the others write into), then a barrier: so
// every write meets missing pages at both ends, source faults here and destination faults
// (NACKs) at the target, all resolved by each process's own fault library. After the writes
// complete everywhere (a second barrier) each rank checks every byte it received.
// Buffer layout, one page-aligned slot per block: [to rank 0 … to rank N-1 | from rank 0 … from rank N-1].
import { readFileSync } from 'node:fs';
import {
  Access,
  Cluster,
  mapRegion,
  SendFlags,
  WcStatus,
  WrOpcode,
  type CompletionQueue,
  type Context,
  type LibfabricProvider,
  type PolicyName,
  type QueuePair,
  type Region,
  type WorkCompletion,
} from '../../lib/index.js';
import { Job, type Launcher } from '../../lib/index.js';
import type { TraceFile } from './support/trace-file.js';
import { connect, newPsn, PEER_TIMEOUT_MS, type Endpoint } from './fabric-peer.js';

export interface AlltoallOptions {
  /** --trace: this rank's fault library's events go to it (the program writes a file per rank). */
  trace?: TraceFile;
  /** Bytes each rank writes to each other rank per iteration, one run of `iters` per size, in order. */
  blocks: number[];
  iters: number;
  policy: PolicyName;
  /** Evict the buffer before every iteration (default true): faults at both ends every time. */
  evict?: boolean;
  rendezvous?: string;
  bind?: string;
  provider?: LibfabricProvider;
  /** The job's wait for its ranks (to arrive, at each barrier), ms. */
  timeoutMs?: number;
  /** Told once every rank is connected to every other, before the first iteration. */
  onConnected?: (job: Job) => void;
}

/** One rank's outcome, as every rank learns it at the end. */
export interface RankResult {
  rank: number;
  /** Real µs of each iteration's writes (posting the first to the last completion), per size in order. */
  iterUs: number[][];
  /** Faults this rank's fault library resolved: its blocks read (source), its slots written (destination). */
  faults: { source: number; destination: number };
  /** NACKs this rank's engine received (destination faults of its writes at the other ranks). */
  nacks: number;
  retransmitted: number;
  bytesVerified: number;
  mismatches: number;
  /** Writes this rank posted in the timed iterations (every size, every peer). */
  transfers: number;
  /** CPU this rank's process used in them (every thread, barriers and checks included), µs: `cpuUs / transfers` is its CPU per transfer. */
  cpuUs: number;
  /**
   * The part of it from the barrier before each iteration's writes to the barrier after them
   * (posting, completing, and serving the other ranks' writes), µs: the CPU inside the time the
   * writes take; the rest is filling, checking and the first barrier.
   */
  writeCpuUs: number;
  /** The CPUs this rank's process may run on (its Cpus_allowed_list: one CPU when pinned, `run --pin`). */
  cpus: string;
  /** The first failed work completion. */
  error?: string;
}

export interface AlltoallResult {
  rank: number;
  size: number;
  launcher: Launcher;
  blocks: number[];
  iters: number;
  /** Every rank's result, by rank. */
  ranks: RankResult[];
}

const WRITE_TIMEOUT_MS = 30_000;

/** The 256-byte period of the block `src` writes to `dst` in iteration `it`: distinct for every triple a test would confuse. */
function period(it: number, src: number, dst: number): Uint8Array {
  const p = new Uint8Array(256);
  for (let i = 0; i < 256; i++) p[i] = (i * 17 + it * 7 + src * 31 + dst * 13 + 1) & 0xff;
  return p;
}

/** Bytes of `got` that differ from the block `src` writes to `dst` in iteration `it`. */
function differing(got: Buffer, it: number, src: number, dst: number): number {
  const want = Buffer.alloc(got.length).fill(period(it, src, dst));
  if (got.equals(want)) return 0;
  let bad = 0;
  for (let i = 0; i < got.length; i++) if (got[i] !== want[i]) bad++;
  return bad;
}

/** What each rank tells the others to reach it: its buffer, key, and per peer its QP's number and PSN. */
interface RankEndpoints {
  addr: string;
  rkey: number;
  qpns: number[];
  psns: number[];
}

/** Another rank's endpoints, checked: a rank sent them, but nothing from another process is trusted. */
function checkEndpoints(v: unknown, rank: number, size: number): { addr: bigint; rkey: number; qpns: number[]; psns: number[] } {
  const e = v as RankEndpoints;
  const ok =
    e !== null &&
    typeof e === 'object' &&
    typeof e.addr === 'string' &&
    /^0x[0-9a-f]{1,16}$/.test(e.addr) &&
    Number.isInteger(e.rkey) &&
    e.rkey >= 0 &&
    e.rkey <= 0xffffffff &&
    [e.qpns, e.psns].every((a) => Array.isArray(a) && a.length === size && a.every((x) => Number.isInteger(x) && x >= 0 && x < 0x100_0000));
  if (!ok)
    throw Object.assign(new Error(`rank ${rank} sent malformed endpoints (buffer address, rkey, ${size} QP numbers and PSNs)`), {
      code: 'ERR_PFR_RENDEZVOUS',
    });
  return { addr: BigInt(e.addr), rkey: e.rkey, qpns: e.qpns, psns: e.psns };
}

/** Another rank's result, checked: its counts must be counts, its times a list of them. */
/** This process's Cpus_allowed_list (/proc/self/status), e.g. `0-1` or `1`. */
function allowedCpuList(): string {
  try {
    return /^Cpus_allowed_list:\s*(\S+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '';
  } catch {
    return '';
  }
}

function checkResult(v: unknown, rank: number, sizes: number, iters: number): RankResult {
  const x = v as RankResult;
  const count = (n: unknown) => Number.isInteger(n) && (n as number) >= 0;
  const ok =
    x !== null &&
    typeof x === 'object' &&
    x.rank === rank &&
    Array.isArray(x.iterUs) &&
    x.iterUs.length <= sizes &&
    x.iterUs.every((run) => Array.isArray(run) && run.length <= iters && run.every((t) => typeof t === 'number' && t >= 0)) &&
    [x.faults?.source, x.faults?.destination, x.nacks, x.retransmitted, x.bytesVerified, x.mismatches, x.transfers].every(count) &&
    typeof x.cpus === 'string' &&
    x.cpus.length <= 256 &&
    [x.cpuUs, x.writeCpuUs].every((u) => typeof u === 'number' && Number.isFinite(u) && u >= 0) &&
    (x.error === undefined || typeof x.error === 'string');
  if (!ok) throw Object.assign(new Error(`rank ${rank} sent a malformed result`), { code: 'ERR_PFR_RENDEZVOUS' });
  return x;
}

/** Run this process's rank of the all-to-all; resolves with every rank's result (a rank lost fails it). */
export async function runAlltoall(o: AlltoallOptions): Promise<AlltoallResult> {
  const job = await Job.start({
    ...(o.rendezvous !== undefined ? { rendezvous: o.rendezvous } : {}),
    ...(o.bind !== undefined ? { bind: o.bind } : {}),
    ...(o.provider !== undefined ? { provider: o.provider } : {}),
    ...(o.timeoutMs !== undefined ? { timeoutMs: o.timeoutMs } : {}),
    peerTimeoutMs: PEER_TIMEOUT_MS,
  });
  const { rank, size } = job;
  let cluster: Cluster | undefined;
  let opened: Context | undefined;
  let region: Region | undefined;
  // A lost rank ends every wait with the job's reason (not the wait's own).
  const why = (e: unknown): Error => (job.signal.aborted ? (job.signal.reason as Error) : (e as Error));
  try {
    if (size < 2) throw Object.assign(new Error('an all-to-all needs at least 2 ranks (run -n 2 or more)'), { code: 'ERR_INVALID_ARG_VALUE' });
    cluster = Cluster.create({ nodes: size, transport: job.transport, defaultPolicy: o.policy, ...(o.trace ? { trace: o.trace.option } : {}) });
    const ctx = cluster.openDevice(rank);
    opened = ctx;
    const pd = ctx.allocPd();
    const cq: CompletionQueue = ctx.createCq(2 * size + 16);
    const peers = [...Array(size).keys()].filter((p) => p !== rank);
    const qps = new Map<number, QueuePair>(peers.map((p) => [p, ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 1, maxRecvWr: 1 } })]));
    // Slots start on pages (the transport reads a source's residency page by page from its
    // start), each as large as the largest block.
    const stride = Math.ceil(Math.max(...o.blocks) / 4096) * 4096;
    region = mapRegion(2 * size * stride, { shared: true });
    const buf = region;
    const mr = ctx.regMr(pd, buf, 0, buf.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND, { policy: o.policy });
    const psns = [...Array(size).keys()].map(() => newPsn());
    const mine: RankEndpoints = {
      addr: `0x${buf.address.toString(16)}`,
      rkey: mr.rkey,
      qpns: [...Array(size).keys()].map((p) => qps.get(p)?.qpNum ?? 0),
      psns,
    };
    const theirs = (await job.allgather(mine).catch((e: unknown) => Promise.reject(why(e)))).map((v, r) => checkEndpoints(v, r, size));
    for (const [p, qp] of qps) {
      const local: Endpoint = { node: rank, qpn: qp.qpNum, psn: psns[p]!, addr: buf.address, rkey: mr.rkey };
      const remote: Endpoint = { node: p, qpn: theirs[p]!.qpns[rank]!, psn: theirs[p]!.psns[rank]!, addr: theirs[p]!.addr, rkey: theirs[p]!.rkey };
      connect(qp, local, remote, 4096);
    }
    o.onConnected?.(job);
    const me: RankResult = {
      rank,
      iterUs: [],
      faults: { source: 0, destination: 0 },
      nacks: 0,
      retransmitted: 0,
      bytesVerified: 0,
      mismatches: 0,
      transfers: 0,
      cpuUs: 0,
      writeCpuUs: 0,
      cpus: allowedCpuList(),
    };
    const slot = (k: number, block: number) => Buffer.from(buf.buffer, k * stride, block);
    const cpu0 = process.cpuUsage();
    for (const block of o.blocks) if (!me.error) me.iterUs.push(await run(block));
    const cpu = process.cpuUsage(cpu0);
    me.cpuUs = cpu.user + cpu.system;
    const stats = ctx.faultLibrary.stats();
    me.faults = { source: stats.faults.source, destination: stats.faults.destination };
    me.nacks = cluster.system.node(rank).pldma.counters().nacksReceived;
    const ranks = (await job.allgather(me).catch((e: unknown) => Promise.reject(why(e)))).map((v, r) => checkResult(v, r, o.blocks.length, o.iters));
    return { rank, size, launcher: job.launcher, blocks: o.blocks, iters: o.iters, ranks };

    // `iters` iterations of `block` bytes to every other rank; returns each one's time.
    async function run(block: number): Promise<number[]> {
      const times: number[] = [];
      for (let it = 0; it < o.iters && !me.error; it++) {
        for (const p of peers) slot(p, block).fill(period(it, rank, p));
        if (o.evict ?? true) buf.unmapPages();
        // Every rank's slots are evicted (and its last check done) before anyone writes.
        await job.barrier().catch((e: unknown) => Promise.reject(why(e)));
        const c0 = process.cpuUsage();
        const t0 = performance.now();
        for (const p of peers)
          qps.get(p)!.postSend({
            wrId: BigInt(p),
            opcode: WrOpcode.RDMA_WRITE,
            sgList: [{ addr: buf.address + BigInt(p * stride), length: block, lkey: mr.lkey }],
            sendFlags: SendFlags.SIGNALED,
            rdma: { remoteAddr: theirs[p]!.addr + BigInt((size + rank) * stride), rkey: theirs[p]!.rkey },
          });
        me.transfers += peers.length;
        for (let n = 0; n < peers.length; n++) {
          const wc: WorkCompletion = await cq.next({ timeoutMs: WRITE_TIMEOUT_MS, signal: job.signal }).catch((e: unknown) => Promise.reject(why(e)));
          if (wc.status !== WcStatus.SUCCESS) me.error ??= `write to rank ${String(wc.wrId)}: ${wc.statusStr} (${WcStatus[wc.status]})`;
          if (wc.odp) me.retransmitted += wc.odp.retransmittedBlocks;
        }
        times.push((performance.now() - t0) * 1000);
        // A write completes at its writer once the target placed it: after this barrier every
        // rank's slots hold this iteration's blocks.
        await job.barrier().catch((e: unknown) => Promise.reject(why(e)));
        const c = process.cpuUsage(c0);
        me.writeCpuUs += c.user + c.system;
        for (const p of peers) {
          me.mismatches += differing(slot(size + p, block), it, p, rank);
          me.bytesVerified += block;
        }
      }
      return times;
    }
  } catch (e) {
    if (!job.signal.aborted) job.abort((e as Error).message);
    throw why(e);
  } finally {
    // This rank's fault library's events (its faults as source and destination), before the cluster goes.
    if (opened && o.trace) o.trace.addContexts([opened], `rank ${rank}`);
    cluster?.close();
    await job.close();
    region?.close();
  }
}
