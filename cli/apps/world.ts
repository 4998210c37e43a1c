// The ranks an application kernel runs as, and what they share: a World is one rank's view
// (its node's context, PD and CQ, one connected RC QP to every other rank, a barrier and an
// allgather). The same kernel code runs on worlds of two kinds: N nodes of one Cluster in this
// process (localWorlds: the ranks are async functions taking turns on one event loop), or one
// process of a job under `pagefault-rdma run -n N` / mpiexec (jobWorld: lib/job's rendezvous
// and libfabric transport). Only the barrier and allgather differ between them.
import { setMaxListeners } from 'node:events';
import {
  Access,
  Cluster,
  Job,
  launchInfo,
  PfrError,
  type CompletionQueue,
  type Context,
  type MemoryRegion,
  type ProtectionDomain,
  type QueuePair,
  type Region,
} from '../../lib/index.js';
import { connect, newPsn, PEER_TIMEOUT_MS } from '../programs/fabric-peer.js';
import { REMOTE_ODP, type AppPolicy, type RemoteMemory } from './policy.js';

/** One rank's view of the job. */
export interface World {
  /** This rank, 0..size-1: it hosts node `rank`. */
  rank: number;
  /** Ranks in the job. */
  size: number;
  /** How the ranks run: 'nodes in one process' or the launcher that started this process. */
  where: string;
  /** The cluster the ranks' nodes belong to (closing it ends every rank of this process). */
  cluster: Cluster;
  /** This rank's device context (ibv_context) on its node. */
  ctx: Context;
  /** This rank's protection domain: its MRs and QPs. */
  pd: ProtectionDomain;
  /** Send and receive completions of every QP of this rank. */
  cq: CompletionQueue;
  /** The RC QP connected to each other rank, by rank (undefined at this rank's own index). */
  qps: Array<QueuePair | undefined>;
  /** Aborted when the job fails (a rank lost): every wait of the kernel should take it. */
  signal: AbortSignal;
  /** Every rank's `value`, by rank. */
  allgather<T>(value: T): Promise<T[]>;
  barrier(): Promise<void>;
  /** This rank failed: every other rank's waits end with `reason`. */
  fail(reason: Error): void;
  /** This rank's remote-paged memory, when the remote policy runs (the command sets it up). */
  remote?: RemoteMemory;
}

/** World.where of ranks that are nodes of one process. */
export const LOCAL = 'nodes in one process';

/** How long a rank waits for the others (a barrier, an allgather, a completion). */
export const WAIT_MS = 30_000;

/** Room on each QP: a ring kernel has up to one receive per rank posted ahead (MAX_LOCAL_RANKS). */
export const QP_DEPTH = 64;
const MTU = 4096;

/** An allgather among async ranks of one process; a barrier is an allgather of nothing. */
class LocalGroup {
  #values: unknown[] = [];
  #arrived = 0;
  #waiters: Array<{ resolve: (v: unknown[]) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }> = [];
  readonly abort = new AbortController();

  constructor(readonly size: number) {
    // Every rank waits on it at once (its allgather, its CQ): more listeners than the default 10 are expected.
    setMaxListeners(4 * size + 16, this.abort.signal);
  }

  allgather<T>(rank: number, value: T): Promise<T[]> {
    if (this.abort.signal.aborted) return Promise.reject(this.abort.signal.reason as Error);
    this.#values[rank] = value;
    return new Promise<T[]>((resolve, reject) => {
      // A rank that never arrives (it failed) must not hang the others.
      const timer = setTimeout(() => {
        const e = new PfrError('ERR_PFR_RANK_LOST', `rank ${rank}: the other ranks did not reach the allgather within ${WAIT_MS} ms`);
        this.abort.abort(e);
        reject(e);
      }, WAIT_MS);
      const onAbort = (): void => {
        clearTimeout(timer);
        reject(this.abort.signal.reason as Error);
      };
      this.abort.signal.addEventListener('abort', onAbort, { once: true });
      this.#waiters.push({
        resolve: (v) => {
          this.abort.signal.removeEventListener('abort', onAbort);
          resolve(v as T[]);
        },
        reject,
        timer,
      });
      if (++this.#arrived < this.size) return;
      const values = this.#values;
      const waiters = this.#waiters;
      this.#values = [];
      this.#waiters = [];
      this.#arrived = 0;
      for (const w of waiters) {
        clearTimeout(w.timer);
        w.resolve(values);
      }
    });
  }
}

/** Every rank's QP numbers and PSNs, one per peer, as each rank tells the others. */
interface QpEndpoints {
  qpns: number[];
  psns: number[];
}

/** Create and connect one RC QP between every pair of ranks (each rank's half). */
async function connectAll(w: Omit<World, 'qps'>): Promise<Array<QueuePair | undefined>> {
  const qps = [...Array(w.size).keys()].map((p) =>
    p === w.rank ? undefined : w.ctx.createQp(w.pd, { sendCq: w.cq, recvCq: w.cq, cap: { maxSendWr: QP_DEPTH, maxRecvWr: QP_DEPTH } }),
  );
  const psns = qps.map(() => newPsn());
  const mine: QpEndpoints = { qpns: qps.map((q) => q?.qpNum ?? 0), psns };
  const theirs = await w.allgather(mine);
  theirs.forEach((e, r) => {
    const ok = [e?.qpns, e?.psns].every(
      (a) => Array.isArray(a) && a.length === w.size && a.every((x) => Number.isInteger(x) && x >= 0 && x < 0x100_0000),
    );
    if (!ok) throw new PfrError('ERR_PFR_RENDEZVOUS', `rank ${r} sent malformed QP endpoints (${w.size} QP numbers and PSNs)`);
  });
  qps.forEach((qp, p) => {
    if (!qp) return;
    connect(
      qp,
      { node: w.rank, qpn: qp.qpNum, psn: psns[p]!, addr: 0n, rkey: 0 },
      { node: p, qpn: theirs[p]!.qpns[w.rank]!, psn: theirs[p]!.psns[w.rank]!, addr: 0n, rkey: 0 },
      MTU,
    );
  });
  return qps;
}

/** `n` ranks as nodes of one Cluster in this process, connected all-to-all. Close the cluster when done. */
export async function localWorlds(n: number): Promise<World[]> {
  const cluster = Cluster.create({ nodes: n });
  const group = new LocalGroup(n);
  try {
    const bases = [...Array(n).keys()].map((rank) => {
      const ctx = cluster.openDevice(rank);
      const pd = ctx.allocPd();
      return {
        rank,
        size: n,
        where: LOCAL,
        cluster,
        ctx,
        pd,
        cq: ctx.createCq(4 * n * QP_DEPTH),
        signal: group.abort.signal,
        allgather: <T>(value: T) => group.allgather(rank, value),
        barrier: async () => void (await group.allgather(rank, null)),
        fail: (reason: Error) => group.abort.abort(reason),
      };
    });
    const qps = await Promise.all(bases.map((b) => connectAll(b)));
    return bases.map((b, r) => ({ ...b, qps: qps[r]! }));
  } catch (e) {
    cluster.close();
    throw e;
  }
}

/**
 * How long a rank may be silent before the others count it lost, per rank of the job (at least
 * PEER_TIMEOUT_MS, 2.1 s). Ranks beyond the cores share them: 16 processes on 2 busy cores went
 * 2.3–2.6 s without a turn (kv's server, a transpose), and the job failed with RETRY_EXC_ERR
 * though every rank was alive. A killed rank is noticed at once all the same (its connection resets).
 */
const SILENCE_MS_PER_RANK = 500;

/** Options of jobWorld: where rank 0's rendezvous is, and the job's wait. */
export interface JobWorldOptions {
  /** Rank 0's rendezvous, HOST:PORT (default $PFR_RENDEZVOUS). */
  rendezvous?: string;
  /** How long the ranks wait for each other, ms (default WAIT_MS). */
  timeoutMs?: number;
}

/** This process's rank of a job (pagefault-rdma run -n N, mpiexec), connected to every other rank. Close both when done. */
export async function jobWorld(o: JobWorldOptions = {}): Promise<{ world: World; job: Job }> {
  const job = await Job.start({
    ...(o.rendezvous !== undefined ? { rendezvous: o.rendezvous } : {}),
    timeoutMs: o.timeoutMs ?? WAIT_MS,
    peerTimeoutMs: Math.max(PEER_TIMEOUT_MS, SILENCE_MS_PER_RANK * launchInfo().size),
  });
  const why = (e: unknown): Error => (job.signal.aborted ? (job.signal.reason as Error) : (e as Error));
  try {
    const cluster = Cluster.create({ nodes: job.size, transport: job.transport });
    const ctx = cluster.openDevice(job.rank);
    const pd = ctx.allocPd();
    const base = {
      rank: job.rank,
      size: job.size,
      where: job.launcher,
      cluster,
      ctx,
      pd,
      cq: ctx.createCq(4 * job.size * QP_DEPTH),
      signal: job.signal,
      allgather: <T>(value: T) => job.allgather(value).catch((e: unknown) => Promise.reject(why(e))),
      barrier: () => job.barrier().catch((e: unknown) => Promise.reject(why(e))),
      fail: (reason: Error) => {
        if (!job.signal.aborted) job.abort(reason.message);
      },
    };
    return { world: { ...base, qps: await connectAll(base) }, job };
  } catch (e) {
    if (!job.signal.aborted) job.abort((e as Error).message);
    await job.close();
    throw why(e);
  }
}

/** Register the first `length` bytes of `region` for a kernel under `policy`: pinned (no ON_DEMAND, mlock at registration) or on-demand paging (remote-paged memory: REMOTE_ODP). */
export function registerFor(w: World, region: Region, policy: AppPolicy, length = region.size): MemoryRegion {
  const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ;
  return policy === 'pin'
    ? w.ctx.regMr(w.pd, region, 0, length, access)
    : w.ctx.regMr(w.pd, region, 0, length, access | Access.ON_DEMAND, { policy: policy === 'remote' ? REMOTE_ODP : policy });
}

/** Another rank's registered buffer: where to write and with which key. */
export interface RemoteBuffer {
  /** Its address in the other rank's process. */
  addr: bigint;
  /** The rkey its MR gives remote access with. */
  rkey: number;
}

/** Tell every rank this rank's buffer; learn each rank's, by rank (checked: nothing from another process is trusted). */
export async function exchangeBuffers(w: World, mr: MemoryRegion): Promise<RemoteBuffer[]> {
  const all = await w.allgather({ addr: `0x${mr.addr.toString(16)}`, rkey: mr.rkey });
  return all.map((e, r) => {
    if (typeof e?.addr !== 'string' || !/^0x[0-9a-f]{1,16}$/.test(e.addr) || !Number.isInteger(e.rkey) || e.rkey < 0 || e.rkey > 0xffffffff)
      throw new PfrError('ERR_PFR_RENDEZVOUS', `rank ${r} sent a malformed buffer (address, rkey)`);
    return { addr: BigInt(e.addr), rkey: e.rkey };
  });
}
