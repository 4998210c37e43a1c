// Every check the responder makes, for each operation (issue 24): a key of another PD, a QP
// that is not the connected one, a key of a deregistered MR, one byte past the MR, an MR
// without the access the operation needs. Each is refused with the status an ibv program
// sees, and nothing is read or written: the server's memory keeps its bytes, the client's
// sink keeps its own (a READ or atomic that were let through would bring the server's back).
import { afterEach, describe, expect, test } from 'vitest';
import { Access, QpState, SendFlags, WcStatus, WrOpcode, type MemoryRegion, type QueuePair, type SendWr, type Sge } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, MSG, next, ODP_ACCESS, P, region, type Player } from './helpers.js';

afterEach(closeAll);

const SERVER = 0x33;
const CLIENT = 0x44;
/** The bytes of memory the key under test reaches, where that is not the server's buffer. */
const ELSEWHERE = 0x77;

type Case = 'another PD' | "another QP's connection" | 'a deregistered MR' | 'one byte past the MR' | 'the access flag missing';
const CASES: Case[] = ['another PD', "another QP's connection", 'a deregistered MR', 'one byte past the MR', 'the access flag missing'];

/** What the responder's side looks like for one case: the key and address to aim at. */
interface Target {
  rkey: number;
  addr: bigint;
  /** The QP that posts (the connected client's, or an intruder's). */
  qp: QueuePair;
  /** Its send CQ. */
  next: () => ReturnType<typeof next>;
  /** The bytes nothing may change (besides the server's buffer). */
  untouched: Array<[Buffer, number]>;
}

const remote: Array<[string, number, WrOpcode, number]> = [
  ['RDMA_WRITE', Access.REMOTE_WRITE, WrOpcode.RDMA_WRITE, MSG],
  ['RDMA_READ', Access.REMOTE_READ, WrOpcode.RDMA_READ, MSG],
  ['ATOMIC_FETCH_AND_ADD', Access.REMOTE_ATOMIC, WrOpcode.ATOMIC_FETCH_AND_ADD, 8],
  ['ATOMIC_CMP_AND_SWP', Access.REMOTE_ATOMIC, WrOpcode.ATOMIC_CMP_AND_SWP, 8],
];

/** An intruder on the client's node: its own process, a QP aimed at the server's (which is connected to the client's). */
function intruder(c: Player, s: Player): { qp: QueuePair; sge: (n: number) => Sge; mem: Buffer } {
  const ctx = c.ctx.cluster.openDevice(0);
  const pd = ctx.allocPd();
  const cq = ctx.createCq(16);
  const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
  const r = region(4 * P);
  const mr = ctx.regMr(pd, r, 0, r.size, ODP_ACCESS);
  const mem = Buffer.from(r.buffer);
  mem.fill(CLIENT);
  qp.modify({ qpState: QpState.INIT, qpAccessFlags: ODP_ACCESS });
  qp.modify({ qpState: QpState.RTR, destQpNum: s.qp.qpNum, destNode: s.ctx.node });
  qp.modify({ qpState: QpState.RTS });
  return { qp, sge: (n) => ({ addr: r.address, length: n, lkey: mr.lkey }), mem };
}

function aim(which: Case, flag: number, length: number, c: Player, s: Player): Target & { sge: Sge } {
  const connected = { qp: c.qp, next: () => next(c.cq), sge: c.sge(0, length), untouched: [[c.bytes(0, MSG), CLIENT]] as Array<[Buffer, number]> };
  const all = ODP_ACCESS;
  switch (which) {
    case 'another PD': {
      // The server's process, another PD, its own memory: reachable only through that PD's QPs.
      const pd2 = s.ctx.allocPd();
      const r = region(4 * P);
      const mem = Buffer.from(r.buffer);
      mem.fill(ELSEWHERE);
      const mr = s.ctx.regMr(pd2, r, 0, r.size, all);
      return { ...connected, rkey: mr.rkey, addr: r.address, untouched: [...connected.untouched, [mem, ELSEWHERE]] };
    }
    case "another QP's connection": {
      const x = intruder(c, s);
      return {
        rkey: s.mr.rkey,
        addr: s.at(0),
        qp: x.qp,
        next: () => x.qp.sendCq.next({ timeoutMs: 5000 }),
        sge: x.sge(length),
        untouched: [[x.mem, CLIENT]],
      };
    }
    case 'a deregistered MR': {
      const mr = s.ctx.regMr(s.pd, s.region, 0, s.region.size, all);
      const rkey = mr.rkey;
      mr.dereg();
      return { ...connected, rkey, addr: s.at(0) };
    }
    case 'one byte past the MR': {
      // An MR over the first page less one byte; the access ends on that byte.
      const mr = s.ctx.regMr(s.pd, s.region, 0, P - 1, all);
      return { ...connected, rkey: mr.rkey, addr: s.at(P - length) };
    }
    case 'the access flag missing': {
      const mr = s.ctx.regMr(s.pd, s.region, 0, s.region.size, all & ~flag);
      return { ...connected, rkey: mr.rkey, addr: s.at(0) };
    }
  }
}

function wrFor(opcode: WrOpcode, t: { rkey: number; addr: bigint; sge: Sge }): SendWr {
  const base = { wrId: 1, sendFlags: SendFlags.SIGNALED, sgList: [t.sge] };
  if (opcode === WrOpcode.ATOMIC_FETCH_AND_ADD || opcode === WrOpcode.ATOMIC_CMP_AND_SWP)
    return { ...base, opcode, atomic: { remoteAddr: t.addr, rkey: t.rkey, compareAdd: BigInt(SERVER) * 0x0101010101010101n, swap: 1n } };
  return { ...base, opcode, rdma: { remoteAddr: t.addr, rkey: t.rkey } };
}

/** What libibverbs reports at the requester: a QP that is not the connected one is never answered (its retries run out). */
const expected = (which: Case): WcStatus => (which === "another QP's connection" ? WcStatus.RETRY_EXC_ERR : WcStatus.REM_ACCESS_ERR);

describe.each(remote)('%s', (_name, flag, opcode, length) => {
  test.each(CASES)('%s: refused, nothing read or written', async (which) => {
    const { client, server } = createPlayers();
    server.fill(SERVER, 0, 4 * P);
    client.fill(CLIENT, 0, MSG);
    const t = aim(which, flag, length, client, server);
    t.qp.postSend(wrFor(opcode, t));
    const wc = await t.next();
    expect(wc.status).toBe(expected(which));
    expect(wc.byteLen).toBe(0);
    allBytes(server.bytes(0, 4 * P), SERVER);
    for (const [mem, byte] of t.untouched) allBytes(mem, byte);
  });
});

/** SEND: the checks are on the receive WQE the SEND takes (its lkey, PD, bounds, LOCAL_WRITE) and on the sender. */
function receiveFor(which: Exclude<Case, "another QP's connection">, s: Player): { sge: Sge; mr?: MemoryRegion } {
  const all = ODP_ACCESS;
  switch (which) {
    case 'another PD': {
      const mr = s.ctx.regMr(s.ctx.allocPd(), s.region, 0, s.region.size, all);
      return { sge: { addr: s.at(0), length: MSG, lkey: mr.lkey } };
    }
    case 'a deregistered MR': {
      const mr = s.ctx.regMr(s.pd, s.region, 0, s.region.size, all);
      mr.dereg();
      return { sge: { addr: s.at(0), length: MSG, lkey: mr.lkey } };
    }
    case 'one byte past the MR': {
      const mr = s.ctx.regMr(s.pd, s.region, 0, P - 1, all);
      return { sge: { addr: s.at(P - MSG), length: MSG, lkey: mr.lkey } };
    }
    case 'the access flag missing': {
      // No LOCAL_WRITE: the bytes of a SEND may not land (remote write access needs it too).
      const mr = s.ctx.regMr(s.pd, s.region, 0, s.region.size, Access.REMOTE_READ | Access.ON_DEMAND);
      return { sge: { addr: s.at(0), length: MSG, lkey: mr.lkey } };
    }
  }
}

describe('SEND', () => {
  test.each(CASES.filter((c) => c !== "another QP's connection") as Array<Exclude<Case, "another QP's connection">>)(
    'a receive WQE with %s: LOC_PROT_ERR on the receive, REM_OP_ERR at the sender, nothing written',
    async (which) => {
      const { client, server } = createPlayers();
      server.fill(SERVER, 0, 4 * P);
      client.fill(CLIENT, 0, MSG);
      server.qp.postRecv({ wrId: 7, sgList: [receiveFor(which, server).sge] });
      client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED, sgList: [client.sge(0, MSG)] });
      const [sent, received] = [await next(client.cq), await next(server.cq)];
      expect(sent.status).toBe(WcStatus.REM_OP_ERR);
      expect(received).toMatchObject({ wrId: 7n, status: WcStatus.LOC_PROT_ERR, byteLen: 0 });
      allBytes(server.bytes(0, 4 * P), SERVER);
    },
  );

  test('from a QP that is not the connected one: RETRY_EXC_ERR, the receive not taken, nothing written', async () => {
    const { client, server } = createPlayers();
    server.fill(SERVER, 0, 4 * P);
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, MSG)] });
    const x = intruder(client, server);
    x.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED, sgList: [x.sge(MSG)] });
    const wc = await x.qp.sendCq.next({ timeoutMs: 5000 });
    expect(wc.status).toBe(WcStatus.RETRY_EXC_ERR);
    allBytes(server.bytes(0, 4 * P), SERVER);
    expect(server.cq.poll(4)).toEqual([]);
  });
});
