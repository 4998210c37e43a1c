// The suite's own oracle (issue 35): random lists of work requests over every opcode, on RC,
// UD and XRC QPs and an SRQ, checked WR by WR against libibverbs / IB RC semantics computed
// here from the spec (never from the code): the status of each completion, the receive it
// takes, and a byte-exact shadow of every registered region with canary pages around each
// buffer. Zero-length SGEs at any position, zero-length messages (C9-88: no R_Key check),
// remote ranges near 0 and 2^64, keys of another PD, another node, a dead MR and none at all,
// a QP without remote access, evictions before and racing each transfer, receive queues short
// or empty (RNR), and QPs destroyed mid-flight. fast-check drives it: seeds printed, a failure
// shrunk to a minimal WR list. test/verbs/wr-oracle.test.ts runs it bounded; `npm run
// test:random-wr` runs it for minutes.
import fc from 'fast-check';
import {
  Access,
  Cluster,
  connectQps,
  mapRegion,
  PAGE_SIZE as P,
  QpState,
  QpType,
  SendFlags,
  SrqType,
  WcStatus,
  WrOpcode,
  FlushLevel,
  FlushType,
  type CompletionQueue,
  type Context,
  type MemoryRegion,
  type QueuePair,
  type Region,
  type SendWr,
  type SharedReceiveQueue,
} from '../../lib/index.js';

const BUF = 6 * P; // each side's registered buffer
const CANARY = P; // a page before and after it, never registered
const CANARY_BYTE = 0xcc;
const TOP = 1n << 64n;
// rnr_retry 6: an ODP fault NACK counts against it (as mlx5's RNR NAK for a responder page fault), so a WR may take 6.
const RNR = { rnrRetry: 6, minRnrTimer: 1 };

type Kind = 'rc' | 'rc-noaccess' | 'rc-srq' | 'ud' | 'xrc';
type Op = 'write' | 'write-imm' | 'send' | 'send-imm' | 'read' | 'faa' | 'cas' | 'atomic-write' | 'flush';
type Key = 'ok' | 'readonly' | 'other-pd' | 'other-node' | 'dead' | 'bogus';
type Where = 'in' | 'overrun' | 'near-0' | 'near-top' | 'misaligned';

/** One generated WR: everything the oracle needs to say what must happen. */
export interface GenWr {
  kind: Kind;
  op: Op;
  /** Local SGE lengths (0 allowed anywhere) and where each starts in the client buffer. */
  sges: Array<{ off: number; length: number }>;
  lkeyBad: 'none' | 'other-pd' | 'dead' | 'bogus';
  rkey: Key;
  where: Where;
  remoteOff: number;
  /** Receives posted before it (each a list of SGE lengths), for a SEND or a WRITE_WITH_IMM. */
  recv: number[][];
  add: bigint;
  casMatch: boolean;
  word: number;
  evictBefore: { client: number; server: number };
  evictRacing: number;
  /** Destroy the client QP right after the post (RC only). */
  destroy: boolean;
}

const SEND_OPS: Op[] = ['send', 'send-imm'];
const RC_OPS: Op[] = ['write', 'write-imm', 'send', 'send-imm', 'read', 'faa', 'cas', 'atomic-write', 'flush'];

export function wrArb(): fc.Arbitrary<GenWr> {
  const len = fc.oneof(
    { weight: 2, arbitrary: fc.constant(0) },
    { weight: 5, arbitrary: fc.integer({ min: 1, max: 3000 }) },
    { weight: 1, arbitrary: fc.integer({ min: 3000, max: 2 * P + 7 }) },
  );
  return fc
    .record({
      kind: fc.constantFrom<Kind>('rc', 'rc', 'rc', 'rc', 'rc-noaccess', 'rc-srq', 'ud', 'xrc'),
      opIndex: fc.nat(RC_OPS.length - 1),
      lens: fc.array(len, { minLength: 0, maxLength: 4 }),
      starts: fc.array(fc.nat(BUF), { minLength: 4, maxLength: 4 }),
      lkeyBad: fc.constantFrom<GenWr['lkeyBad']>('none', 'none', 'none', 'none', 'none', 'none', 'none', 'other-pd', 'dead', 'bogus'),
      rkey: fc.constantFrom<Key>('ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'readonly', 'other-pd', 'other-node', 'dead', 'bogus'),
      where: fc.constantFrom<Where>('in', 'in', 'in', 'in', 'in', 'in', 'in', 'in', 'overrun', 'near-0', 'near-top', 'misaligned'),
      remoteOff: fc.nat(BUF),
      recv: fc.array(fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 9000 })), { minLength: 1, maxLength: 3 }), {
        minLength: 0,
        maxLength: 2,
      }),
      add: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
      casMatch: fc.boolean(),
      word: fc.nat(BUF / 8 - 1),
      evictBefore: fc.record({ client: fc.integer({ min: -4, max: BUF / P - 1 }), server: fc.integer({ min: -4, max: BUF / P - 1 }) }),
      evictRacing: fc.integer({ min: -6, max: BUF / P - 1 }),
      destroy: fc.integer({ min: 0, max: 39 }).map((n) => n === 0),
    })
    .map((r): GenWr => {
      const ops = r.kind === 'ud' || r.kind === 'xrc' ? (r.kind === 'ud' ? SEND_OPS : (['send', 'send-imm', 'write', 'read'] as Op[])) : RC_OPS;
      const op = ops[r.opIndex % ops.length]!;
      const atomic = op === 'faa' || op === 'cas' || op === 'atomic-write';
      let lens = r.lens;
      if (atomic) lens = r.lens.length === 1 && r.lens[0] === 16 ? [16] : [8];
      if (op === 'flush') lens = [];
      if (r.kind === 'ud') lens = lens.slice(0, 1).map((n) => Math.min(n, 1500));
      const sges = lens.map((length, i) => {
        const at = atomic ? 8 * Math.floor(r.starts[i]! / 8) : r.starts[i]!;
        return { off: Math.min(at, BUF - length), length };
      });
      return { ...r, op, sges, destroy: r.destroy && r.kind === 'rc' && (op === 'write' || op === 'read') };
    });
}

type Sg = { off: number; length: number };

interface Side {
  ctx: Context;
  region: Region;
  mr: MemoryRegion;
  /** The whole region's bytes as they must be, canaries included. */
  shadow: Buffer;
  base: bigint;
}

interface Pair {
  kind: Kind;
  c: QueuePair;
  s: QueuePair;
  ccq: CompletionQueue;
  scq: CompletionQueue;
  /** The receives the server side holds (their SGEs), oldest first: its RQ, or the SRQ it shares. */
  rq: Sg[][];
}

export interface OracleStats {
  wrs: number;
  statuses: Record<string, number>;
  faults: { source: number; destination: number };
}

/** The bytes a list of SGEs names, gathered. */
function gather(shadow: Buffer, sges: Array<{ off: number; length: number }>): Buffer {
  return Buffer.concat(sges.map((s) => shadow.subarray(CANARY + s.off, CANARY + s.off + s.length)));
}
function scatter(shadow: Buffer, sges: Array<{ off: number; length: number }>, bytes: Buffer): void {
  let k = 0;
  for (const s of sges) {
    if (k >= bytes.length) break;
    const n = Math.min(s.length, bytes.length - k);
    bytes.copy(shadow, CANARY + s.off, k, k + n);
    k += n;
  }
}

/** One run: a fresh 2-node cluster, `wrs` posted one by one, each checked. Throws on the first difference. */
export async function runWrs(wrs: GenWr[], stats: OracleStats, what: string): Promise<void> {
  const closers: Array<{ close(): void }> = [];
  const cluster = Cluster.create({ nodes: 2, faultTimeoutMs: 500 });
  try {
    const side = (node: number): Side => {
      const ctx = cluster.openDevice(node, { defaultPolicy: 'touch' });
      const region = mapRegion(BUF + 2 * CANARY, { shared: true });
      closers.unshift(region);
      const bytes = new Uint8Array(region.buffer);
      bytes.fill(CANARY_BYTE);
      for (let i = 0; i < BUF; i++) bytes[CANARY + i] = (i * 7 + node * 13 + 1) & 0xff;
      const shadow = Buffer.from(bytes);
      return { ctx, region, mr: undefined as unknown as MemoryRegion, shadow, base: region.address + BigInt(CANARY) };
    };
    const C = side(0);
    const S = side(1);
    const full = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.FLUSH_GLOBAL | Access.ON_DEMAND;
    const cpd = C.ctx.allocPd();
    const spd = S.ctx.allocPd();
    C.mr = C.ctx.regMr(cpd, C.region, CANARY, BUF, full);
    S.mr = S.ctx.regMr(spd, S.region, CANARY, BUF, full);
    const readonly = S.ctx.regMr(spd, S.region, CANARY, BUF, Access.REMOTE_READ | Access.ON_DEMAND);
    const otherPd = S.ctx.allocPd();
    const otherPdMr = S.ctx.regMr(otherPd, S.region, CANARY, BUF, full);
    const cOtherPd = C.ctx.allocPd();
    const cOtherPdMr = C.ctx.regMr(cOtherPd, C.region, CANARY, BUF, full);
    const deadS = S.ctx.regMr(spd, S.region, CANARY, BUF, full);
    const deadRkey = deadS.rkey;
    deadS.dereg();
    const deadC = C.ctx.regMr(cpd, C.region, CANARY, BUF, full);
    const deadLkey = deadC.lkey;
    deadC.dereg();
    const serverKeys = new Set([S.mr.rkey, readonly.rkey, otherPdMr.rkey]);

    const qpAccess = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.FLUSH_GLOBAL;
    const cap = { maxSendWr: 16, maxRecvWr: 16, maxSendSge: 4, maxRecvSge: 4 };
    const srq = S.ctx.createSrq(spd, { maxWr: 64, maxSge: 4 });
    const xrcd = S.ctx.openXrcd();
    const xcq = S.ctx.createCq(256);
    const xsrq: SharedReceiveQueue = S.ctx.createSrq(spd, { srqType: SrqType.XRC, xrcd, cq: xcq, maxWr: 64, maxSge: 4 });
    const srqRq: Sg[][] = [];
    const xrcRq: Sg[][] = [];
    const make = (kind: Kind): Pair => {
      const ccq = C.ctx.createCq(256);
      const scq = kind === 'xrc' ? xcq : S.ctx.createCq(256);
      if (kind === 'ud') {
        const ud = (ctx: Context, pd: typeof cpd, cq: CompletionQueue) => {
          const qp = ctx.createQp(pd, { qpType: QpType.UD, sendCq: cq, recvCq: cq, cap: { ...cap, maxSendSge: 1 } });
          qp.modify({ qpState: QpState.INIT, portNum: 1, qkey: 0x1234 });
          qp.modify({ qpState: QpState.RTR });
          qp.modify({ qpState: QpState.RTS, sqPsn: 0 });
          return qp;
        };
        return { kind, c: ud(C.ctx, cpd, ccq), s: ud(S.ctx, spd, scq), ccq, scq, rq: [] };
      }
      if (kind === 'xrc') {
        const c = C.ctx.createQp(cpd, { qpType: QpType.XRC_SEND, sendCq: ccq, cap: { maxSendWr: 16, maxSendSge: 4, maxRecvWr: 0, maxRecvSge: 0 } });
        const s = S.ctx.createQp(spd, { qpType: QpType.XRC_RECV, xrcd });
        connectQps(c, s, { ...RNR, qpAccessFlags: qpAccess });
        return { kind, c, s, ccq, scq, rq: xrcRq };
      }
      const c = C.ctx.createQp(cpd, { sendCq: ccq, recvCq: ccq, cap });
      const s = S.ctx.createQp(spd, { sendCq: scq, recvCq: scq, cap, ...(kind === 'rc-srq' ? { srq } : {}) });
      connectQps(c, s, { ...RNR, qpAccessFlags: qpAccess });
      if (kind === 'rc-noaccess') {
        // The server QP allows no remote access at all (qp_access_flags LOCAL_WRITE).
        s.modify({ qpState: QpState.RESET });
        s.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: Access.LOCAL_WRITE });
        s.modify({ qpState: QpState.RTR, destQpNum: c.qpNum, destNode: 0, minRnrTimer: 1 });
        s.modify({ qpState: QpState.RTS, rnrRetry: RNR.rnrRetry });
      }
      return { kind, c, s, ccq, scq, rq: kind === 'rc-srq' ? srqRq : [] };
    };
    const pairs = new Map<Kind, Pair>();
    for (const k of ['rc', 'rc-noaccess', 'rc-srq', 'ud', 'xrc'] as Kind[]) pairs.set(k, make(k));

    // A pair whose WR failed: both QPs back to RTS; the receives of its own RQ are flushed.
    const reset = async (p: Pair, w: string) => {
      if (p.kind === 'ud') {
        // Only the sender failed (locally): it alone goes back to RTS.
        p.c.modify({ qpState: QpState.RESET });
        p.c.modify({ qpState: QpState.INIT, portNum: 1, qkey: 0x1234 });
        p.c.modify({ qpState: QpState.RTR });
        p.c.modify({ qpState: QpState.RTS, sqPsn: 0 });
        return;
      }
      const own = p.kind === 'rc' || p.kind === 'rc-noaccess';
      if (own && p.rq.length) {
        p.s.modify({ qpState: QpState.ERR });
        for (let i = p.rq.length; i > 0; i--) {
          const wc = await p.scq.next({ timeoutMs: 5000 });
          if (wc.status !== WcStatus.WR_FLUSH_ERR)
            throw new Error(`${w}: a receive left on the reset QP completed ${WcStatus[wc.status]}, not WR_FLUSH_ERR`);
        }
        p.rq.length = 0;
      }
      const flags = p.kind === 'rc-noaccess' ? Access.LOCAL_WRITE : qpAccess;
      for (const [x, y, node] of [
        [p.c, p.s, 1],
        [p.s, p.c, 0],
      ] as const) {
        x.modify({ qpState: QpState.RESET });
        x.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: x === p.s ? flags : qpAccess });
        x.modify({ qpState: QpState.RTR, destQpNum: y.qpNum, destNode: node, minRnrTimer: 1 });
        x.modify({ qpState: QpState.RTS, rnrRetry: RNR.rnrRetry });
      }
    };

    const sbuf = (x: Side) => Buffer.from(x.region.buffer);
    const checkBytes = (w: string) => {
      for (const [name, x] of [
        ['client', C],
        ['server', S],
      ] as const) {
        const actual = sbuf(x);
        if (!actual.equals(x.shadow)) {
          let i = 0;
          while (actual[i] === x.shadow[i]) i++;
          const where = i < CANARY || i >= CANARY + BUF ? 'a canary' : `buffer offset ${i - CANARY}`;
          throw new Error(`${w}: ${name} byte at ${where} is 0x${actual[i]!.toString(16)}, the oracle says 0x${x.shadow[i]!.toString(16)}`);
        }
      }
    };
    // A range the spec leaves undefined after this WR: the oracle takes what is there.
    const undefinedRange = (x: Side, off: number, length: number) => {
      if (length > 0) sbuf(x).copy(x.shadow, CANARY + off, CANARY + off, CANARY + off + length);
    };

    for (let n = 0; n < wrs.length; n++) {
      const g = wrs[n]!;
      const w = `${what}, WR ${n} ${JSON.stringify(g, (_, v: unknown) => (typeof v === 'bigint' ? String(v) : v))}`;
      const p = pairs.get(g.kind)!;
      const total = g.sges.reduce((s, x) => s + x.length, 0);
      const atomic = g.op === 'faa' || g.op === 'cas' || g.op === 'atomic-write';
      const takesRecv = g.op === 'send' || g.op === 'send-imm' || g.op === 'write-imm';

      // ---- the WR ----
      const lkeyOf = (i: number): number => {
        // A bad key only on a non-empty SGE (a zero-length SGE is skipped: rxe's copy_data).
        if (g.lkeyBad === 'none' || g.sges[i]!.length === 0) return C.mr.lkey;
        return g.lkeyBad === 'other-pd' ? cOtherPdMr.lkey : g.lkeyBad === 'dead' ? deadLkey : 0x00ba_d000 + n;
      };
      const sgList = g.sges.map((s, i) => ({ addr: C.base + BigInt(s.off), length: s.length, lkey: lkeyOf(i) }));
      const lkeyBad = g.sges.some((s, i) => s.length > 0 && lkeyOf(i) !== C.mr.lkey);
      const otherNode = serverKeys.has(C.mr.rkey) ? 0x00ba_d800 + n : C.mr.rkey;
      const rkey = {
        ok: S.mr.rkey,
        readonly: readonly.rkey,
        'other-pd': otherPdMr.rkey,
        'other-node': otherNode,
        dead: deadRkey,
        bogus: 0x00ba_dc00 + n,
      }[g.rkey];
      const span = atomic ? 8 : g.op === 'flush' ? Math.max(1, total || 64) : total;
      let remoteOff = atomic ? 8 * g.word : Math.min(g.remoteOff, BUF - span);
      let remoteAddr = S.base + BigInt(remoteOff);
      if (g.where === 'overrun') remoteOff = BUF - Math.max(1, Math.floor(span / 2));
      if (g.where === 'overrun') remoteAddr = S.base + BigInt(remoteOff);
      if (g.where === 'near-0') remoteAddr = BigInt(g.remoteOff % 64);
      if (g.where === 'near-top') remoteAddr = TOP - BigInt(1 + (g.remoteOff % Math.max(1, span)));
      if (g.where === 'misaligned' && atomic) remoteAddr += 4n;
      const inRange = remoteAddr >= S.base && remoteAddr + BigInt(span) <= S.base + BigInt(BUF);
      const misaligned = atomic && remoteAddr % 8n !== 0n;
      const opcode = {
        write: WrOpcode.RDMA_WRITE,
        'write-imm': WrOpcode.RDMA_WRITE_WITH_IMM,
        send: WrOpcode.SEND,
        'send-imm': WrOpcode.SEND_WITH_IMM,
        read: WrOpcode.RDMA_READ,
        faa: WrOpcode.ATOMIC_FETCH_AND_ADD,
        cas: WrOpcode.ATOMIC_CMP_AND_SWP,
        'atomic-write': WrOpcode.ATOMIC_WRITE,
        flush: WrOpcode.FLUSH,
      }[g.op];
      const wr: SendWr = { wrId: BigInt(n), opcode, sgList, sendFlags: SendFlags.SIGNALED };
      if (g.op.startsWith('write') || g.op === 'read' || g.op === 'atomic-write') wr.rdma = { remoteAddr, rkey };
      if (g.op.endsWith('imm')) wr.immData = n;
      const old = inRange && atomic && !misaligned ? S.shadow.readBigUInt64LE(CANARY + Number(remoteAddr - S.base)) : 0n;
      if (g.op === 'faa') wr.atomic = { remoteAddr, rkey, compareAdd: g.add };
      if (g.op === 'cas') wr.atomic = { remoteAddr, rkey, compareAdd: g.casMatch ? old : BigInt.asUintN(64, old + 1n), swap: g.add };
      if (g.op === 'flush') wr.flush = { remoteAddr, rkey, length: span, type: FlushType.GLOBAL, level: FlushLevel.RANGE };
      if (g.kind === 'ud') wr.ud = { ah: C.ctx.createAh(cpd, { dlid: 1 }), remoteQpn: p.s.qpNum, remoteQkey: 0x1234 };
      if (g.kind === 'xrc') wr.xrc = { remoteSrqn: xsrq.srqNum! };

      // Receives (on the server QP's own RQ, its SRQ, or the XRC SRQ), each of 1-3 SGEs.
      const rq = p.rq;
      if (takesRecv)
        for (const lens of g.kind === 'ud' ? g.recv.map(() => [2000]) : g.recv) {
          if (rq.length >= 12) break;
          let at = (n * 977) % BUF;
          const sg = lens.map((l) => {
            const length = Math.min(l, BUF);
            if (at + length > BUF) at = 0;
            const x = { off: at, length };
            at += length;
            return x;
          });
          const rwr = { wrId: BigInt(n), sgList: sg.map((x) => ({ addr: S.base + BigInt(x.off), length: x.length, lkey: S.mr.lkey })) };
          if (g.kind === 'rc-srq') srq.postRecv(rwr);
          else if (g.kind === 'xrc') xsrq.postRecv(rwr);
          else p.s.postRecv(rwr);
          rq.push(sg);
        }

      // ---- the oracle: the status the spec gives ----
      const remoteAccess = g.kind !== 'rc-noaccess';
      const keyAllows = (need: 'write' | 'read' | 'atomic' | 'flush') => g.rkey === 'ok' || (g.rkey === 'readonly' && need === 'read');
      let status: WcStatus;
      let recvStatus: WcStatus | undefined;
      // Statuses the spec allows besides `status` where it leaves the order of two checks open.
      const also: WcStatus[] = [];
      const head = rq[0];
      const headRoom = head ? head.reduce((a, x) => a + x.length, 0) : -1;
      if (lkeyBad) status = WcStatus.LOC_PROT_ERR;
      else if (atomic && total !== 8) status = WcStatus.LOC_LEN_ERR;
      else if (g.kind === 'ud') status = WcStatus.SUCCESS;
      else if (g.op === 'send' || g.op === 'send-imm') {
        if (!head) status = WcStatus.RNR_RETRY_EXC_ERR;
        else if (headRoom < total) [status, recvStatus] = [WcStatus.REM_INV_REQ_ERR, WcStatus.LOC_LEN_ERR];
        else [status, recvStatus] = [WcStatus.SUCCESS, WcStatus.SUCCESS];
      } else if (!remoteAccess) {
        // A QP whose qp_access_flags refuse the operation: IBA's remote access error (rxe NAKs
        // it as an invalid request); with no receive for an immediate, RNR may come first.
        status = WcStatus.REM_ACCESS_ERR;
        also.push(WcStatus.REM_INV_REQ_ERR);
        if (g.op === 'write-imm' && !head) also.push(WcStatus.RNR_RETRY_EXC_ERR);
      } else if (misaligned) {
        // rxe checks an atomic's alignment before its MR; a range past its MR (or 2^64) is an R_Key violation too.
        status = WcStatus.REM_INV_REQ_ERR;
        if (g.rkey !== 'ok' || !inRange) also.push(WcStatus.REM_ACCESS_ERR);
      } else if (g.op === 'write' || g.op === 'write-imm') {
        const ok = total === 0 || (remoteAccess && keyAllows('write') && inRange);
        if (!remoteAccess && total > 0) status = WcStatus.REM_ACCESS_ERR;
        else if (!ok) status = WcStatus.REM_ACCESS_ERR;
        else if (g.op === 'write-imm' && !head) status = WcStatus.RNR_RETRY_EXC_ERR;
        else [status, recvStatus] = [WcStatus.SUCCESS, g.op === 'write-imm' ? WcStatus.SUCCESS : undefined];
      } else if (g.op === 'read')
        status = !remoteAccess ? WcStatus.REM_ACCESS_ERR : total === 0 || (keyAllows('read') && inRange) ? WcStatus.SUCCESS : WcStatus.REM_ACCESS_ERR;
      else if (g.op === 'faa' || g.op === 'cas') status = remoteAccess && keyAllows('atomic') && inRange ? WcStatus.SUCCESS : WcStatus.REM_ACCESS_ERR;
      else if (g.op === 'atomic-write') status = remoteAccess && keyAllows('write') && inRange ? WcStatus.SUCCESS : WcStatus.REM_ACCESS_ERR;
      else status = remoteAccess && keyAllows('flush') && inRange ? WcStatus.SUCCESS : WcStatus.REM_ACCESS_ERR;
      // A WRITE_WITH_IMM whose key fails and finds no receive: RNR or the access error may come first.
      if (g.op === 'write-imm' && !head && status === WcStatus.REM_ACCESS_ERR) also.push(WcStatus.RNR_RETRY_EXC_ERR);

      // ---- run it ----
      if (g.evictBefore.client >= 0) C.region.unmapPages(CANARY + g.evictBefore.client * P, P);
      if (g.evictBefore.server >= 0) S.region.unmapPages(CANARY + g.evictBefore.server * P, P);
      p.c.postSend(wr);
      if (g.evictRacing >= 0) (g.evictRacing % 2 ? S : C).region.unmapPages(CANARY + g.evictRacing * P, P);
      if (g.destroy) {
        p.c.destroy();
        status = WcStatus.WR_FLUSH_ERR;
      }
      const wc = await p.ccq.next({ timeoutMs: 8000 }).catch((e: Error) => {
        throw new Error(`${w}: HANG, no completion (${e.message})`);
      });
      stats.wrs++;
      const got = WcStatus[wc.status];
      stats.statuses[`${g.op}:${got}`] = (stats.statuses[`${g.op}:${got}`] ?? 0) + 1;
      stats.faults.source += wc.odp?.faults.source ?? 0;
      stats.faults.destination += wc.odp?.faults.destination ?? 0;
      if (wc.wrId !== BigInt(n)) throw new Error(`${w}: completion of WR ${wc.wrId}`);
      if (wc.status !== status && !also.includes(wc.status)) throw new Error(`${w}: WRONG STATUS ${got}, the spec says ${WcStatus[status]}`);
      if (wc.status === WcStatus.SUCCESS && g.op !== 'flush' && wc.byteLen !== (atomic ? 8 : total) && g.op !== 'atomic-write')
        throw new Error(`${w}: byte_len ${wc.byteLen}, want ${total}`);

      // ---- what the bytes must be now ----
      if (g.destroy) {
        // Flushed mid-flight: the WR's target is undefined, nothing else may change.
        if (g.op === 'write') undefinedRange(S, remoteOff, inRange ? total : 0);
        if (g.op === 'read') for (const s of g.sges) undefinedRange(C, s.off, s.length);
      } else if (wc.status === WcStatus.SUCCESS && inRange) {
        const src = gather(C.shadow, g.sges);
        const roff = Number(remoteAddr - S.base);
        if (g.op === 'write' || g.op === 'write-imm') src.copy(S.shadow, CANARY + roff);
        if (g.op === 'read') scatter(C.shadow, g.sges, S.shadow.subarray(CANARY + roff, CANARY + roff + total));
        if (g.op === 'atomic-write') src.copy(S.shadow, CANARY + roff);
        if (g.op === 'faa' || g.op === 'cas') {
          scatter(C.shadow, g.sges, Buffer.from(new BigUint64Array([old]).buffer));
          const next = g.op === 'faa' ? BigInt.asUintN(64, old + g.add) : g.casMatch ? g.add : old;
          S.shadow.writeBigUInt64LE(next, CANARY + roff);
        }
      }
      if (g.op === 'write-imm' && wc.status === WcStatus.RNR_RETRY_EXC_ERR && inRange) undefinedRange(S, Number(remoteAddr - S.base), total);

      // The receive the message took: its completion, and its bytes (or the undefined range of a too-small one).
      const consumed = !g.destroy && g.kind !== 'ud' && recvStatus !== undefined && wc.status === status;
      const udTaken = g.kind === 'ud' && wc.status === WcStatus.SUCCESS && rq.length > 0 && headRoom >= total;
      if (consumed || udTaken) {
        const rwc = await p.scq.next({ timeoutMs: 8000 }).catch((e: Error) => {
          throw new Error(`${w}: HANG, no receive completion (${e.message})`);
        });
        const sg = rq.shift()!;
        const want = udTaken ? WcStatus.SUCCESS : recvStatus!;
        if (rwc.status !== want) throw new Error(`${w}: WRONG RECEIVE STATUS ${WcStatus[rwc.status]}, the spec says ${WcStatus[want]}`);
        if (want === WcStatus.SUCCESS) {
          // A UD receive's first 40 bytes are the GRH's room (none is written here), counted in byte_len.
          const grh = g.kind === 'ud' ? 40 : 0;
          if (rwc.byteLen !== total + grh) throw new Error(`${w}: receive byte_len ${rwc.byteLen}, want ${total + grh}`);
          const data = gather(C.shadow, g.sges);
          if (g.op !== 'write-imm') scatter(S.shadow, sg, grh ? Buffer.concat([gather(S.shadow, sg).subarray(0, grh), data]) : data);
        } else for (const s of sg) undefinedRange(S, s.off, s.length);
      }
      checkBytes(w);

      // A failed RC WR leaves the client QP in ERR (and maybe the server's): the pair is reset.
      if (g.destroy) {
        // The old server QP's receives are flushed with it; a new pair takes its place.
        if (p.rq.length) {
          p.s.modify({ qpState: QpState.ERR });
          for (let i = p.rq.length; i > 0; i--) await p.scq.next({ timeoutMs: 5000 });
        }
        p.s.destroy();
        pairs.set('rc', make('rc'));
      } else if (wc.status !== WcStatus.SUCCESS) {
        await reset(p, w);
      }
    }
  } finally {
    cluster.close();
    for (const c of closers) c.close();
  }
}

/** Run the property: `numRuns` random WR lists of up to `maxWrs`, or until `timeMs`. Prints the seed. */
export async function oracle(o: { seed: number; numRuns: number; maxWrs: number; timeMs?: number }): Promise<OracleStats> {
  const stats: OracleStats = { wrs: 0, statuses: {}, faults: { source: 0, destination: 0 } };
  let run = 0;
  console.log(`[random-wr] seed ${o.seed} (PFR_SEED=${o.seed} reproduces it)`);
  await fc.assert(
    fc.asyncProperty(fc.array(wrArb(), { minLength: 1, maxLength: o.maxWrs }), async (wrs) => {
      await runWrs(wrs, stats, `seed ${o.seed}, run ${run++}`);
    }),
    { seed: o.seed, numRuns: o.numRuns, ...(o.timeMs ? { interruptAfterTimeLimit: o.timeMs } : {}), endOnFailure: false },
  );
  return stats;
}
