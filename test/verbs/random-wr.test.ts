// Thousands of seeded random work requests (opcodes, sizes, keys, addresses, QP states)
// checked one by one against a libibverbs oracle: the status each completion must have and
// the bytes each buffer must then hold. Every buffer sits between canary pages that must
// never change, whatever the request did. Pages are unmapped at random on both sides, so the
// requests fault at the source and the destination as they go.
import { afterEach, expect, test } from 'vitest';
import {
  Access,
  Cluster,
  connectQps,
  mapRegion,
  PAGE_SIZE as P,
  QpState,
  SendFlags,
  WcOpcode,
  WcStatus,
  WrOpcode,
  type CompletionQueue,
  type Context,
  type MemoryRegion,
  type QueuePair,
  type Region,
  type SendWr,
} from '../../lib/index.js';

const open: Array<{ close(): void }> = [];
afterEach(() => {
  for (const r of open.splice(0).reverse()) r.close();
});

/** mulberry32: a small seeded PRNG, so a failure names the seed and WR that reproduce it. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const BUF = 8 * P; // the registered buffer
const CANARY = P; // one page before and after it, never registered
const CANARY_BYTE = 0xcc;

interface Side {
  ctx: Context;
  region: Region;
  mr: MemoryRegion;
  /** What the buffer must hold (the oracle's memory). */
  shadow: Buffer;
  qp: QueuePair;
  cq: CompletionQueue;
  base: bigint; // address of the buffer
}

function side(cluster: Cluster, node: number): Side {
  const ctx = cluster.openDevice(node, { defaultPolicy: 'touch' });
  const pd = ctx.allocPd();
  const cq = ctx.createCq(64);
  const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 8, maxRecvWr: 8, maxSendSge: 1, maxRecvSge: 1 } });
  // Shared (memfd) memory keeps its bytes in the page cache when its page-table entries go
  // (unmapPages), so dropping them only makes the requests fault.
  const region = mapRegion(BUF + 2 * CANARY, { shared: true });
  open.unshift(region);
  const bytes = new Uint8Array(region.buffer);
  bytes.fill(CANARY_BYTE);
  const shadow = Buffer.alloc(BUF);
  for (let i = 0; i < BUF; i++) shadow[i] = (i * 7 + node * 13) & 0xff;
  bytes.set(shadow, CANARY);
  const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.ON_DEMAND;
  const mr = ctx.regMr(pd, region, CANARY, BUF, access);
  return { ctx, region, mr, shadow, qp, cq, base: region.address + BigInt(CANARY) };
}

type Op = 'write' | 'write-imm' | 'read' | 'send' | 'faa' | 'cas';
const OPS: Op[] = ['write', 'write-imm', 'read', 'send', 'faa', 'cas'];

interface Pick {
  op: Op;
  localOff: number;
  remoteOff: number;
  length: number;
  lkey: 'ok' | 'bogus';
  rkey: 'ok' | 'bogus' | 'readonly';
  /** Remote range runs past the MR into the canary. */
  overrun: boolean;
  misaligned: boolean;
  add: bigint;
  swap: bigint;
}

test('5000 seeded random work requests match the libibverbs oracle; canaries never change', async () => {
  const seed = Number(process.env.PFR_SEED ?? 0x5eed);
  const rand = rng(seed);
  const int = (n: number) => Math.floor(rand() * n);
  const cluster = Cluster.create({ nodes: 2 });
  open.push(cluster);
  const c = side(cluster, 0);
  const s = side(cluster, 1);
  // A second MR over the same server buffer that allows remote reads only.
  const ro = s.ctx.regMr(s.mr.pd, s.region, CANARY, BUF, Access.REMOTE_READ | Access.ON_DEMAND);
  const connect = () => connectQps(c.qp, s.qp, { rnrRetry: 1, minRnrTimer: 1 });
  connect();
  const resetServer = () => {
    s.qp.modify({ qpState: QpState.RESET });
    s.qp.modify({ qpState: QpState.INIT, qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC });
    s.qp.modify({ qpState: QpState.RTR, destQpNum: c.qp.qpNum, destNode: 0, minRnrTimer: 1 });
    s.qp.modify({ qpState: QpState.RTS, rnrRetry: 1 });
  };
  // A client QP reset starts again at PSN 0 (sq_psn): its peer is reset too, to expect it
  // (as two rc_pingpong ends exchange their PSNs before they connect).
  const reconnectClient = () => {
    c.qp.modify({ qpState: QpState.RESET });
    c.qp.modify({ qpState: QpState.INIT, qpAccessFlags: Access.LOCAL_WRITE });
    c.qp.modify({ qpState: QpState.RTR, destQpNum: s.qp.qpNum, destNode: 1, minRnrTimer: 1 });
    c.qp.modify({ qpState: QpState.RTS, rnrRetry: 1 });
    if (s.qp.state !== QpState.ERR) resetServer();
  };
  const buf = (x: Side) => Buffer.from(x.region.buffer, CANARY, BUF);
  const canariesIntact = (x: Side) => {
    const b = new Uint8Array(x.region.buffer);
    for (let i = 0; i < CANARY; i++) if (b[i] !== CANARY_BYTE || b[CANARY + BUF + i] !== CANARY_BYTE) return false;
    return true;
  };
  const counts: Record<string, number> = {};
  const faults = { source: 0, destination: 0 };

  for (let n = 0; n < 5000; n++) {
    const op = OPS[int(OPS.length)]!;
    const atomic = op === 'faa' || op === 'cas';
    const length = atomic ? (rand() < 0.9 ? 8 : 16) : int(4) === 0 ? 0 : 1 + int(3 * P);
    const p: Pick = {
      op,
      length,
      localOff: atomic ? 8 * int(BUF / 8 - 2) : int(BUF - length + 1),
      remoteOff: atomic ? 8 * int(BUF / 8 - 1) + (rand() < 0.05 ? 4 : 0) : int(BUF - length + 1),
      lkey: rand() < 0.05 ? 'bogus' : 'ok',
      rkey: rand() < 0.05 ? 'bogus' : rand() < 0.05 ? 'readonly' : 'ok',
      overrun: !atomic && length > 0 && rand() < 0.05,
      misaligned: false,
      add: BigInt(int(1000)),
      swap: BigInt(int(1 << 30)),
    };
    p.misaligned = atomic && p.remoteOff % 8 !== 0;
    // Zero-length requests carry good keys only (the IB spec leaves their key checks open).
    if (p.length === 0) Object.assign(p, { lkey: 'ok', rkey: 'ok' });
    if (p.overrun) p.remoteOff = BUF - Math.max(1, Math.floor(length / 2));
    const what = `seed ${seed}, WR ${n}: ${JSON.stringify({ ...p, add: String(p.add), swap: String(p.swap) })}`;

    // Random QP state: sometimes the client QP is in ERR before the post.
    const inErr = rand() < 0.03;
    if (inErr) c.qp.modify({ qpState: QpState.ERR });
    // Random unmapping on both sides: the request faults where the page-table entries are gone.
    for (const x of [c, s]) if (rand() < 0.3) x.region.unmapPages(CANARY + P * int(BUF / P), P);

    const lkey = p.lkey === 'ok' ? c.mr.lkey : 0xdead_0000 + n;
    const rkey = p.rkey === 'ok' ? s.mr.rkey : p.rkey === 'readonly' ? ro.rkey : 0xdead_8000 + n;
    const local = { addr: c.base + BigInt(p.localOff), length: p.length, lkey };
    const remoteAddr = s.base + BigInt(p.remoteOff);
    const wr: SendWr = { wrId: BigInt(n), opcode: WrOpcode.RDMA_WRITE, sgList: [local], sendFlags: SendFlags.SIGNALED };
    if (op === 'write') wr.rdma = { remoteAddr, rkey };
    if (op === 'write-imm') Object.assign(wr, { opcode: WrOpcode.RDMA_WRITE_WITH_IMM, immData: n, rdma: { remoteAddr, rkey } });
    if (op === 'read') Object.assign(wr, { opcode: WrOpcode.RDMA_READ, rdma: { remoteAddr, rkey } });
    if (op === 'send') wr.opcode = WrOpcode.SEND;
    if (op === 'faa') Object.assign(wr, { opcode: WrOpcode.ATOMIC_FETCH_AND_ADD, atomic: { remoteAddr, rkey, compareAdd: p.add } });
    if (op === 'cas') {
      // Compare with the current value half of the time, so both outcomes happen.
      const cur = p.misaligned ? 0n : s.shadow.readBigUInt64LE(p.remoteOff);
      Object.assign(wr, {
        opcode: WrOpcode.ATOMIC_CMP_AND_SWP,
        atomic: { remoteAddr, rkey, compareAdd: rand() < 0.5 ? cur : cur + 1n, swap: p.swap },
      });
    }
    const needsRecv = op === 'send' || op === 'write-imm';
    const recvPosted = needsRecv && rand() < 0.9;
    const recvOff = int(BUF - Math.max(length, 1) + 1);
    if (recvPosted) s.qp.postRecv({ wrId: BigInt(n), sgList: [{ addr: s.base + BigInt(recvOff), length: Math.max(length, 1), lkey: s.mr.lkey }] });

    // ---- the oracle ----
    let status: WcStatus;
    const localOk = p.lkey === 'ok';
    const remoteOk = !p.overrun && (p.rkey === 'ok' || (p.rkey === 'readonly' && op === 'read'));
    if (inErr) status = WcStatus.WR_FLUSH_ERR;
    else if (!localOk) status = WcStatus.LOC_PROT_ERR;
    else if (atomic && p.length !== 8) status = WcStatus.LOC_LEN_ERR;
    else if (atomic && p.misaligned) status = WcStatus.REM_INV_REQ_ERR;
    else if (op === 'send') status = recvPosted ? WcStatus.SUCCESS : WcStatus.RNR_RETRY_EXC_ERR;
    else if (!remoteOk) status = WcStatus.REM_ACCESS_ERR;
    else if (op === 'write-imm' && !recvPosted) status = WcStatus.RNR_RETRY_EXC_ERR;
    else status = WcStatus.SUCCESS;

    c.qp.postSend(wr);
    const wc = await c.cq.next({ timeoutMs: 5000 });
    expect(wc.wrId, what).toBe(BigInt(n));
    expect(WcStatus[wc.status], what).toBe(WcStatus[status]);
    counts[`${op}:${WcStatus[status]}`] = (counts[`${op}:${WcStatus[status]}`] ?? 0) + 1;
    faults.source += wc.odp?.faults.source ?? 0;
    faults.destination += wc.odp?.faults.destination ?? 0;

    if (status === WcStatus.SUCCESS) {
      const src = c.shadow.subarray(p.localOff, p.localOff + p.length);
      if (op === 'write' || op === 'write-imm') src.copy(s.shadow, p.remoteOff);
      if (op === 'send') src.copy(s.shadow, recvOff);
      if (op === 'read') s.shadow.copy(c.shadow, p.localOff, p.remoteOff, p.remoteOff + p.length);
      if (atomic) {
        const old = s.shadow.readBigUInt64LE(p.remoteOff);
        c.shadow.writeBigUInt64LE(old, p.localOff);
        if (op === 'faa') s.shadow.writeBigUInt64LE(BigInt.asUintN(64, old + p.add), p.remoteOff);
        else if (old === BigInt.asUintN(64, wr.atomic!.compareAdd)) s.shadow.writeBigUInt64LE(p.swap, p.remoteOff);
      }
    }
    // A WRITE_WITH_IMM that found no receive may have written its bytes before the RNR NAK
    // (libibverbs leaves the target range undefined then): only that range is not checked.
    if (op === 'write-imm' && status === WcStatus.RNR_RETRY_EXC_ERR) buf(s).copy(s.shadow, p.remoteOff, p.remoteOff, p.remoteOff + p.length);
    // The receive of a SEND / WRITE_WITH_IMM completes on the server: RECV or RECV_RDMA_WITH_IMM.
    if (recvPosted && status === WcStatus.SUCCESS) {
      const rwc = await s.cq.next({ timeoutMs: 5000 });
      expect(rwc.wrId, what).toBe(BigInt(n));
      expect(WcStatus[rwc.status], what).toBe('SUCCESS');
      expect(rwc.opcode, what).toBe(op === 'send' ? WcOpcode.RECV : WcOpcode.RECV_RDMA_WITH_IMM);
    }
    expect(buf(c).equals(c.shadow), `${what}: client buffer`).toBe(true);
    expect(buf(s).equals(s.shadow), `${what}: server buffer`).toBe(true);
    expect(canariesIntact(c) && canariesIntact(s), `${what}: canaries`).toBe(true);

    // A failed request leaves the client QP in ERR: bring it back, and flush any receive
    // left on the server so each request starts from a known state.
    if (c.qp.state === QpState.ERR) reconnectClient();
    if (recvPosted && status !== WcStatus.SUCCESS) {
      s.qp.modify({ qpState: QpState.ERR });
      const flushed = await s.cq.next({ timeoutMs: 5000 });
      expect(WcStatus[flushed.status], what).toBe('WR_FLUSH_ERR');
      resetServer();
    }
  }
  // The requests really faulted, at both ends; and every kind of outcome happened.
  expect(faults.source).toBeGreaterThan(50);
  expect(faults.destination).toBeGreaterThan(50);
  for (const k of [
    'write:SUCCESS',
    'read:SUCCESS',
    'send:SUCCESS',
    'faa:SUCCESS',
    'cas:SUCCESS',
    'write:REM_ACCESS_ERR',
    'cas:REM_ACCESS_ERR',
    'read:LOC_PROT_ERR',
    'send:RNR_RETRY_EXC_ERR',
    'faa:REM_INV_REQ_ERR',
    'faa:LOC_LEN_ERR',
    'write:WR_FLUSH_ERR',
  ])
    expect(counts[k] ?? 0, k).toBeGreaterThan(0);
}, 120_000);
