// Shared pieces of the verbs suites, modelled on rdma-core's tests/base.py and tests/utils.py:
// two players (client on node 0, server on node 1), each with a PD, a CQ, an RC QP connected
// to the other's, and an MR on fresh mapRegion memory; the traffic loops of utils.traffic,
// rdma_traffic and atomic_traffic; and cleanup that closes clusters before regions.
import { expect } from 'vitest';
import {
  Access,
  Cluster,
  connectQps,
  mapRegion,
  PAGE_SIZE,
  SendFlags,
  SIZE_MAX,
  WcOpcode,
  WcStatus,
  WrOpcode,
  type ClusterOptions,
  type CompletionChannel,
  type CompletionQueue,
  type Context,
  type FaultStatsSnapshot,
  type MemoryRegion,
  type PolicyName,
  type ProtectionDomain,
  type QpAttr,
  type QpCap,
  type QueuePair,
  type Region,
  type Sge,
  type WorkCompletion,
} from '../../lib/index.js';

export const P = PAGE_SIZE;
/** rdma-core's default msg_size. */
export const MSG = 1024;
/** rdma-core's ODP RC access (tests/test_odp.py): the QP gets the same mask. */
export const ODP_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.ON_DEMAND;
/** The same without ON_DEMAND: a pinned MR. */
export const PINNED_ACCESS = ODP_ACCESS & ~Access.ON_DEMAND;
/** Every wait in these suites is bounded by this (ms) unless a test says otherwise. */
export const WAIT_MS = 5_000;

// ---- cleanup --------------------------------------------------------------------------

const open: Array<{ close(): void }> = [];

/** Close `r` after the current test (newest first: clusters before the regions they use). */
export function track<T extends { close(): void }>(r: T): T {
  open.push(r);
  return r;
}

/** Close everything tracked: call from afterEach. */
export function closeAll(): void {
  for (const r of open.splice(0).reverse()) r.close();
}

/** A fresh anonymous mapping, closed after the test. */
export function region(bytes: number, options?: { hugePages?: boolean; shared?: boolean }): Region {
  const r = mapRegion(bytes, options);
  // Regions are opened before their cluster in most tests, so close them after it: unshift.
  open.unshift(r);
  return r;
}

// ---- players --------------------------------------------------------------------------

export interface Player {
  name: 'client' | 'server';
  ctx: Context;
  pd: ProtectionDomain;
  cq: CompletionQueue;
  /** The CQ's completion channel (with `channel: true`). */
  channel?: CompletionChannel;
  qp: QueuePair;
  /** The data buffer (for implicit ODP: a separate fresh mapping reached through the implicit key). */
  region: Region;
  mr: MemoryRegion;
  /** use_mixed_mr: a second, pinned MR on its own region. */
  pinned?: { region: Region; mr: MemoryRegion };
  /** The MR address of offset `o` of the data buffer. */
  at(o?: number): bigint;
  bytes(o?: number, n?: number): Buffer;
  fill(byte: number, o?: number, n?: number): void;
  sge(o?: number, length?: number): Sge;
}

export interface PlayersOptions {
  /** Bytes of each player's data region (default 16 pages; 2 MiB with hugePages). */
  size?: number;
  access?: number;
  /** ODP policy of the MRs (default: the context's, touch-ahead). */
  policy?: PolicyName;
  /** Default policy of the contexts (used by implicit ODP). */
  defaultPolicy?: PolicyName;
  implicit?: boolean;
  hugePages?: boolean;
  /** memfd-backed regions (unmapPages keeps their contents). */
  shared?: boolean;
  /** Add a pinned MR beside the ODP one (rdma-core's use_mixed_mr). */
  mixed?: boolean;
  /** connectQps attributes (rnrRetry, minRnrTimer, qpAccessFlags …). */
  rc?: Partial<QpAttr>;
  cap?: Partial<QpCap>;
  cluster?: ClusterOptions;
  /** Leave the QPs in RESET. */
  connect?: boolean;
  /** Create each CQ on a completion channel of its own context (ibv_rc_pingpong -e). */
  channel?: boolean;
  /** Extended QPs (createQpEx) with these QpExSendOps bits. */
  sendOpsFlags?: number;
}

export interface Players {
  cluster: Cluster;
  client: Player;
  server: Player;
}

/** rdma-core's create_players for OdpRC: two nodes, one player on each, QPs in RTS. */
export function createPlayers(o: PlayersOptions = {}): Players {
  const size = o.size ?? (o.hugePages ? 2 * 1024 * 1024 : 16 * P);
  const access = o.access ?? ODP_ACCESS | (o.hugePages ? Access.HUGETLB : 0);
  // Regions first (tracked to close after the cluster), then the cluster.
  const opts = o.hugePages || o.shared ? { ...(o.hugePages ? { hugePages: true } : {}), ...(o.shared ? { shared: true } : {}) } : undefined;
  const regions = [region(size, opts), region(size, opts)];
  const extra = o.mixed ? [region(4 * P), region(4 * P)] : [];
  const cluster = track(Cluster.create({ nodes: 2, ...o.cluster }));
  const make = (node: 0 | 1): Player => {
    const ctx = cluster.openDevice(node, o.defaultPolicy ? { defaultPolicy: o.defaultPolicy } : {});
    const pd = ctx.allocPd();
    const channel = o.channel ? ctx.createCompChannel() : undefined;
    const cq = ctx.createCq(1000, channel ? { channel } : {});
    const init = { sendCq: cq, recvCq: cq, cap: { maxSendWr: 1000, maxRecvWr: 1000, maxSendSge: 2, maxRecvSge: 2, ...o.cap } };
    const qp = o.sendOpsFlags === undefined ? ctx.createQp(pd, init) : ctx.createQpEx(pd, { ...init, sendOpsFlags: o.sendOpsFlags });
    const r = regions[node]!;
    const mr = o.implicit ? ctx.regMr(pd, null, 0, SIZE_MAX, access) : ctx.regMr(pd, r, 0, size, access, o.policy ? { policy: o.policy } : {});
    const base = r.address;
    const p: Player = {
      name: node === 0 ? 'client' : 'server',
      ctx,
      pd,
      cq,
      qp,
      region: r,
      mr,
      at: (off = 0) => base + BigInt(off),
      bytes: (off = 0, n = MSG) => Buffer.from(r.buffer, off, n),
      fill: (byte, off = 0, n = MSG) => void new Uint8Array(r.buffer, off, n).fill(byte),
      sge: (off = 0, length = MSG) => ({ addr: base + BigInt(off), length, lkey: mr.lkey }),
    };
    if (channel) p.channel = channel;
    if (o.mixed) {
      const pr = extra[node]!;
      p.pinned = { region: pr, mr: ctx.regMr(pd, pr, 0, pr.size, Access.LOCAL_WRITE) };
    }
    return p;
  };
  const client = make(0);
  const server = make(1);
  if (o.connect ?? true) connectQps(client.qp, server.qp, o.rc);
  return { cluster, client, server };
}

/** The next completion of `cq`, failing the test instead of hanging. */
export function next(cq: CompletionQueue, timeoutMs = WAIT_MS): Promise<WorkCompletion> {
  return cq.next({ timeoutMs });
}

/** Like rdma-core's poll_cq: the completion must be a success, else fail with its status string. */
export async function pollOk(cq: CompletionQueue, timeoutMs = WAIT_MS): Promise<WorkCompletion> {
  const wc = await next(cq, timeoutMs);
  if (wc.status !== WcStatus.SUCCESS) throw new Error(`Completion status is ${wc.statusStr} (wr ${wc.wrId})`);
  return wc;
}

/** Difference of two fault-library snapshots, the counts only. */
export function delta(
  after: FaultStatsSnapshot,
  before: FaultStatsSnapshot,
): { source: number; destination: number; pages: number; retransmitted: number; unresolved: number } {
  return {
    source: after.faults.source - before.faults.source,
    destination: after.faults.destination - before.faults.destination,
    pages: after.pagesMadeResident - before.pagesMadeResident,
    retransmitted: after.retransmittedBlocks - before.retransmittedBlocks,
    unresolved: after.unresolved - before.unresolved,
  };
}

/** True if every byte of `b` is `byte` (reports the first offender otherwise). */
export function allBytes(b: Buffer, byte: number): boolean {
  const i = b.findIndex((x) => x !== byte);
  if (i >= 0) expect.fail(`byte ${i} is 0x${b[i]!.toString(16)}, expected 0x${byte.toString(16)}`);
  return true;
}

const C = 'c'.charCodeAt(0);
const S = 's'.charCodeAt(0);

export interface TrafficOptions {
  iters: number;
  msg?: number;
  /** madvise(MADV_DONTNEED) both MRs every iteration (rdma-core's force_page_faults). */
  evict?: boolean;
  /** Where each side receives (default 0: the same buffer it sends from, as rdma-core). */
  recvOffset?: number;
  /** Prefetch the sender's SGE before each send (rdma-core's use_mr_prefetch). */
  prefetch?: { advice: number; flags: number };
  /** Two SGEs per WR, the second on the pinned MR (use_mixed_mr). */
  mixed?: boolean;
}

export interface IterationFaults {
  /** wc.odp.faults of the client's and the server's send completions. */
  clientSend: { source: number; destination: number };
  serverSend: { source: number; destination: number };
}

/**
 * rdma-core's utils.traffic: RC SEND/RECV ping-pong. Receives are posted once before the
 * loop and re-posted after each one is consumed; each side fills its buffer with its letter,
 * sends, and the peer's buffer must then hold exactly that letter.
 */
export async function traffic(c: Player, s: Player, o: TrafficOptions): Promise<IterationFaults[]> {
  const msg = o.msg ?? MSG;
  const ro = o.recvOffset ?? 0;
  const sgl = (p: Player, off: number): Sge[] =>
    o.mixed ? [p.sge(off, msg), { addr: p.pinned!.region.address, length: msg, lkey: p.pinned!.mr.lkey }] : [p.sge(off, msg)];
  const postRecv = (p: Player, id: number) => p.qp.postRecv({ wrId: id, sgList: sgl(p, ro) });
  const fillAll = (p: Player, byte: number) => {
    p.fill(byte, 0, msg);
    if (o.mixed) new Uint8Array(p.pinned!.region.buffer, 0, msg).fill(byte);
  };
  const check = (p: Player, byte: number) => {
    allBytes(p.bytes(ro, msg), byte);
    if (o.mixed) allBytes(Buffer.from(p.pinned!.region.buffer, 0, msg), byte);
  };
  const total = o.mixed ? 2 * msg : msg;
  const pending: Promise<void>[] = [];
  const prefetch = (p: Player) => {
    if (!o.prefetch) return;
    const r = p.ctx.adviseMr(p.pd, o.prefetch.advice, o.prefetch.flags, [p.sge(0, msg)]);
    pending.push(r);
  };
  const out: IterationFaults[] = [];
  postRecv(c, 0);
  postRecv(s, 0);
  try {
    for (let i = 0; i < o.iters; i++) {
      if (o.evict ?? true) {
        c.region.evict();
        s.region.evict();
      }
      fillAll(c, C);
      prefetch(c);
      c.qp.postSend({ wrId: i, opcode: WrOpcode.SEND, sgList: sgl(c, 0), sendFlags: SendFlags.SIGNALED });
      const cs = await pollOk(c.cq);
      const sr = await pollOk(s.cq);
      expect(cs.opcode).toBe(WcOpcode.SEND);
      expect(sr.opcode).toBe(WcOpcode.RECV);
      expect(sr.byteLen).toBe(total);
      expect(sr.srcQp).toBe(c.qp.qpNum);
      postRecv(s, i + 1);
      check(s, C);

      fillAll(s, S);
      prefetch(s);
      s.qp.postSend({ wrId: i, opcode: WrOpcode.SEND, sgList: sgl(s, 0), sendFlags: SendFlags.SIGNALED });
      const ss = await pollOk(s.cq);
      const cr = await pollOk(c.cq);
      expect(cr.opcode).toBe(WcOpcode.RECV);
      expect(cr.byteLen).toBe(total);
      postRecv(c, i + 1);
      check(c, S);
      out.push({ clientSend: cs.odp!.faults, serverSend: ss.odp!.faults });
    }
  } finally {
    await Promise.all(pending);
  }
  return out;
}

/**
 * rdma-core's utils.rdma_traffic: the client runs `op` against the server's MR, then the
 * roles reverse. Faults are forced at the target of the data: for WRITE the responder's
 * buffer is evicted, for READ the requester's (the side holding the data was just written
 * by its CPU). Returns the send completions.
 */
export async function rdmaTraffic(
  c: Player,
  s: Player,
  op: WrOpcode.RDMA_WRITE | WrOpcode.RDMA_READ | WrOpcode.RDMA_WRITE_WITH_IMM,
  o: { iters: number; msg?: number; evict?: boolean },
): Promise<WorkCompletion[]> {
  const msg = o.msg ?? MSG;
  const out: WorkCompletion[] = [];
  for (let i = 0; i < o.iters; i++) {
    for (const [req, resp, mine, theirs] of [
      [c, s, C, S],
      [s, c, S, C],
    ] as const) {
      if (o.evict ?? true) {
        req.region.evict();
        resp.region.evict();
      }
      // The side the bytes come from writes its pattern; the other side is left evicted.
      if (op === WrOpcode.RDMA_READ) resp.fill(theirs, 0, msg);
      else req.fill(mine, 0, msg);
      if (op === WrOpcode.RDMA_WRITE_WITH_IMM) resp.qp.postRecv({ wrId: 1000 + i, sgList: [] });
      req.qp.postSend({
        wrId: i,
        opcode: op,
        sgList: [req.sge(0, msg)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: resp.at(0), rkey: resp.mr.rkey },
        immData: 0x1000 + i,
      });
      const wc = await pollOk(req.cq);
      expect(wc.byteLen).toBe(msg);
      if (op === WrOpcode.RDMA_READ) {
        expect(wc.opcode).toBe(WcOpcode.RDMA_READ);
        allBytes(req.bytes(0, msg), theirs);
      } else {
        expect(wc.opcode).toBe(WcOpcode.RDMA_WRITE);
        allBytes(resp.bytes(0, msg), mine);
      }
      if (op === WrOpcode.RDMA_WRITE_WITH_IMM) {
        const r = await pollOk(resp.cq);
        expect(r.opcode).toBe(WcOpcode.RECV_RDMA_WITH_IMM);
        expect(r.immData).toBe(0x1000 + i);
        expect(r.byteLen).toBe(msg);
      }
      out.push(wc);
    }
  }
  return out;
}

/** A 64-bit value whose 8 bytes are all `b` (rdma-core's int8b). */
export const int8b = (b: number): bigint => BigInt.asUintN(64, BigInt(b) * 0x0101010101010101n);

export function u64(p: Player, off = 0): bigint {
  return new DataView(p.region.buffer).getBigUint64(off, true);
}
export function setU64(p: Player, v: bigint, off = 0): void {
  new DataView(p.region.buffer).setBigUint64(off, v, true);
}

/**
 * rdma-core's utils.atomic_traffic: the requester's 8 bytes hold `senderVal`, the
 * responder's `receiverVal`; the requester posts the atomic with compare_add = senderVal and
 * swap = 0, then the roles reverse. The requester must get the responder's old value and the
 * responder hold the result. `evictLocal` leaves the requester's result buffer evicted so the
 * returned old value lands on a faulting page.
 */
export async function atomicTraffic(
  c: Player,
  s: Player,
  op: WrOpcode.ATOMIC_CMP_AND_SWP | WrOpcode.ATOMIC_FETCH_AND_ADD,
  o: { iters: number; senderVal: number; receiverVal: number; evictLocal?: boolean },
): Promise<WorkCompletion[]> {
  const out: WorkCompletion[] = [];
  const sender = int8b(o.senderVal);
  const receiver = int8b(o.receiverVal);
  const expected = op === WrOpcode.ATOMIC_FETCH_AND_ADD ? BigInt.asUintN(64, receiver + sender) : receiver === sender ? 0n : receiver;
  for (let i = 0; i < o.iters; i++) {
    for (const [req, resp] of [
      [c, s],
      [s, c],
    ] as const) {
      if (o.evictLocal) req.region.evict();
      else setU64(req, sender);
      setU64(resp, receiver);
      req.qp.postSend({
        wrId: i,
        opcode: op,
        sgList: [req.sge(0, 8)],
        sendFlags: SendFlags.SIGNALED,
        atomic: { remoteAddr: resp.at(0), rkey: resp.mr.rkey, compareAdd: sender, swap: 0n },
      });
      const wc = await pollOk(req.cq);
      expect(wc.opcode).toBe(op === WrOpcode.ATOMIC_FETCH_AND_ADD ? WcOpcode.FETCH_ADD : WcOpcode.COMP_SWAP);
      expect(wc.byteLen).toBe(8);
      expect(u64(req)).toBe(receiver); // the old remote value
      expect(u64(resp)).toBe(expected);
      out.push(wc);
    }
  }
  return out;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Rejects with `what` if `p` does not settle within `ms`. */
export function within<T>(what: string, p: Promise<T>, ms = WAIT_MS): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => (t = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms))),
  ]).finally(() => clearTimeout(t));
}

/** The error `fn` throws (fails the test if it does not). */
export function thrown(fn: () => unknown): Error & { code?: string; syscall?: string } {
  try {
    fn();
  } catch (e) {
    return e as Error & { code?: string };
  }
  return expect.fail('expected an exception');
}
