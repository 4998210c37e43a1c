// UD queue pairs and address handles (IBV_QPT_UD, ibv_create_ah): rdma-core's ODP UD traffic
// (tests/test_odp.py test_odp_ud_traffic: 100 iterations of 1 KiB, both sides evicted before
// each) with the 40 bytes of GRH space at the head of every receive buffer, srcQp in the
// receive completion, a send from ODP memory that faults at the source; and what UD does with
// what it cannot take: a wrong Q_Key or no receive is dropped in silence, a message over the
// MTU is a local length error, a receive too short a LOC_LEN_ERR at the receiver only.
import { afterEach, describe, expect, test } from 'vitest';
import {
  AddressHandle,
  Cluster,
  OdpTransportCaps,
  QpState,
  QpType,
  SendFlags,
  UD_MTU,
  WcOpcode,
  WcStatus,
  WrOpcode,
  type CompletionQueue,
  type Context,
  type MemoryRegion,
  type ProtectionDomain,
  type QueuePair,
  type Region,
  type SendWr,
} from '../../lib/index.js';
import { allBytes, closeAll, MSG, next, ODP_ACCESS, P, pollOk, region, sleep, thrown, track } from './helpers.js';

afterEach(closeAll);

const GRH = 40;
const QKEY = 0x1111_1111;

interface UdPlayer {
  ctx: Context;
  pd: ProtectionDomain;
  cq: CompletionQueue;
  qp: QueuePair;
  region: Region;
  mr: MemoryRegion;
  /** An AH to the other node. */
  ah: AddressHandle;
}

function udQp(ctx: Context, pd: ProtectionDomain, cq: CompletionQueue, qkey = QKEY): QueuePair {
  const qp = ctx.createQp(pd, { qpType: QpType.UD, sendCq: cq, recvCq: cq, cap: { maxSendWr: 64, maxRecvWr: 64 } });
  qp.modify({ qpState: QpState.INIT, portNum: 1, qkey });
  qp.modify({ qpState: QpState.RTR });
  qp.modify({ qpState: QpState.RTS, sqPsn: 0 });
  return qp;
}

function udPlayers(o: { shared?: boolean } = {}): { cluster: Cluster; client: UdPlayer; server: UdPlayer } {
  const regions = [region(16 * P, o.shared ? { shared: true } : undefined), region(16 * P, o.shared ? { shared: true } : undefined)];
  const cluster = track(Cluster.create({ nodes: 2 }));
  const make = (node: 0 | 1): UdPlayer => {
    const ctx = cluster.openDevice(node);
    const pd = ctx.allocPd();
    const cq = ctx.createCq(1000);
    const r = regions[node]!;
    return { ctx, pd, cq, qp: udQp(ctx, pd, cq), region: r, mr: ctx.regMr(pd, r, 0, r.size, ODP_ACCESS), ah: ctx.createAh(pd, { dlid: 1 - node }) };
  };
  return { cluster, client: make(0), server: make(1) };
}

const send = (
  from: UdPlayer,
  to: UdPlayer,
  wrId: number,
  o: { at?: number; length?: number; qkey?: number; qp?: QueuePair; imm?: number } = {},
): SendWr => ({
  wrId,
  opcode: o.imm === undefined ? WrOpcode.SEND : WrOpcode.SEND_WITH_IMM,
  sgList: [{ addr: from.region.address + BigInt(o.at ?? 0), length: o.length ?? MSG, lkey: from.mr.lkey }],
  sendFlags: SendFlags.SIGNALED,
  ...(o.imm === undefined ? {} : { immData: o.imm }),
  ud: { ah: from.ah, remoteQpn: (o.qp ?? to.qp).qpNum, remoteQkey: o.qkey ?? QKEY },
});

const recv = (p: UdPlayer, wrId: number, at: number, length = GRH + MSG) =>
  p.qp.postRecv({ wrId, sgList: [{ addr: p.region.address + BigInt(at), length, lkey: p.mr.lkey }] });

describe('UD traffic with ODP (test_odp_ud_traffic)', () => {
  test('100 iterations of 1 KiB both ways, both sides evicted each time: GRH space kept, srcQp, data at the receiver, destination faults in wc.odp', async () => {
    const { client, server } = udPlayers();
    expect(client.ctx.queryDevice().odpCaps.udOdpCaps & (OdpTransportCaps.SEND | OdpTransportCaps.RECV)).toBe(3);
    for (let i = 0; i < 100; i++) {
      for (const [from, to] of [
        [client, server],
        [server, client],
      ] as const) {
        from.region.evict();
        to.region.evict();
        const byte = 0x41 + (i % 26);
        new Uint8Array(from.region.buffer, 0, MSG).fill(byte);
        recv(to, i, 4 * P); // an evicted page: the datagram faults there and is sent again
        from.qp.postSend(send(from, to, i, { imm: i }));
        const s = await pollOk(from.cq);
        expect(s.opcode).toBe(WcOpcode.SEND);
        expect(s.odp!.faults).toEqual({ source: 0, destination: 1 });
        const r = await pollOk(to.cq);
        expect([r.opcode, r.wrId, r.byteLen, r.srcQp, r.qpNum, r.immData]).toEqual([
          WcOpcode.RECV,
          BigInt(i),
          GRH + MSG,
          from.qp.qpNum,
          to.qp.qpNum,
          i,
        ]);
        // The message starts after the 40 bytes of GRH space, which nothing wrote.
        allBytes(Buffer.from(to.region.buffer, 4 * P + GRH, MSG), byte);
        allBytes(Buffer.from(to.region.buffer, 4 * P, GRH), 0);
      }
    }
  });

  test('a UD SEND from ODP memory that is not mapped (memfd, contents kept) faults at the source and delivers the bytes', async () => {
    const { client, server } = udPlayers({ shared: true });
    for (let i = 0; i < 10; i++) {
      new Uint8Array(client.region.buffer, 0, MSG).fill(0x60 + i);
      client.region.unmapPages();
      recv(server, i, 0);
      client.qp.postSend(send(client, server, i));
      expect((await pollOk(client.cq)).odp!.faults.source).toBe(1);
      await pollOk(server.cq);
      allBytes(Buffer.from(server.region.buffer, GRH, MSG), 0x60 + i);
    }
  });

  test('two senders to one UD QP at once: each datagram takes its own receive and names its sender', async () => {
    const { client, server } = udPlayers();
    const second = udQp(client.ctx, client.pd, client.cq);
    server.region.evict();
    recv(server, 1, 0);
    recv(server, 2, 2 * P);
    new Uint8Array(client.region.buffer, 0, MSG).fill(0x31);
    new Uint8Array(client.region.buffer, P, MSG).fill(0x32);
    client.qp.postSend(send(client, server, 1));
    second.postSend({ ...send(client, server, 2, { at: P }) });
    await pollOk(client.cq);
    await pollOk(client.cq);
    const got = [await pollOk(server.cq), await pollOk(server.cq)];
    const bySender = new Map(got.map((wc) => [wc.srcQp, Number(wc.wrId)]));
    expect(new Set(bySender.keys())).toEqual(new Set([client.qp.qpNum, second.qpNum]));
    allBytes(Buffer.from(server.region.buffer, (bySender.get(client.qp.qpNum)! - 1) * 2 * P + GRH, MSG), 0x31);
    allBytes(Buffer.from(server.region.buffer, (bySender.get(second.qpNum)! - 1) * 2 * P + GRH, MSG), 0x32);
  });

  test('a UD QP takes its receives from an SRQ', async () => {
    const { client, server } = udPlayers();
    const srq = server.ctx.createSrq(server.pd, { maxWr: 4 });
    const qp = server.ctx.createQp(server.pd, { qpType: 'UD', sendCq: server.cq, recvCq: server.cq, srq });
    qp.modify({ qpState: QpState.INIT, qkey: QKEY });
    qp.modify({ qpState: QpState.RTR });
    srq.postRecv({ wrId: 9, sgList: [{ addr: server.region.address, length: GRH + MSG, lkey: server.mr.lkey }] });
    new Uint8Array(client.region.buffer, 0, MSG).fill(0x77);
    client.qp.postSend(send(client, server, 1, { qp }));
    await pollOk(client.cq);
    const r = await pollOk(server.cq);
    expect([r.wrId, r.qpNum, r.byteLen]).toEqual([9n, qp.qpNum, GRH + MSG]);
    allBytes(Buffer.from(server.region.buffer, GRH, MSG), 0x77);
  });
});

describe('what UD drops, and its errors', () => {
  test('a wrong Q_Key, a QP that does not exist, no receive posted: the sender completes SUCCESS, nothing arrives, the receive stays posted', async () => {
    const { client, server } = udPlayers();
    client.qp.postSend(send(client, server, 1)); // no receive posted yet: dropped (no RNR on UD)
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    recv(server, 5, 0);
    client.qp.postSend(send(client, server, 2, { qkey: QKEY + 1 }));
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    client.qp.postSend({ ...send(client, server, 3), ud: { ah: client.ah, remoteQpn: 0xfffff0, remoteQkey: QKEY } });
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    await sleep(20);
    expect(server.cq.poll(4)).toEqual([]);
    // The receive was left for a datagram with the right Q_Key.
    new Uint8Array(client.region.buffer, 0, MSG).fill(0x21);
    client.qp.postSend(send(client, server, 4));
    await pollOk(client.cq);
    expect((await pollOk(server.cq)).wrId).toBe(5n);
  });

  test('over the MTU: LOC_LEN_ERR at the sender; a receive too short: LOC_LEN_ERR at the receiver, SUCCESS at the sender', async () => {
    const { client, server } = udPlayers();
    recv(server, 1, 0, GRH + 100);
    client.qp.postSend(send(client, server, 1, { length: 200 }));
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    const r = await next(server.cq);
    expect([r.wrId, r.status]).toEqual([1n, WcStatus.LOC_LEN_ERR]);
    client.qp.postSend(send(client, server, 2, { length: UD_MTU + 1 }));
    expect((await next(client.cq)).status).toBe(WcStatus.LOC_LEN_ERR);
  });

  test('bad UD use is refused with the field and the fix', () => {
    const { client, server, cluster } = udPlayers();
    const bad = (wr: SendWr) => thrown(() => client.qp.postSend(wr)) as Error & { field?: string };
    expect(bad({ ...send(client, server, 1), opcode: WrOpcode.RDMA_WRITE, rdma: { remoteAddr: 0n, rkey: 1 } }).field).toBe('opcode');
    expect(bad({ ...send(client, server, 1), ud: undefined } as SendWr).field).toBe('ud');
    const otherPd = client.ctx.allocPd();
    expect(bad({ ...send(client, server, 1), ud: { ah: client.ctx.createAh(otherPd, { dlid: 1 }), remoteQpn: 1, remoteQkey: 1 } }).message).toMatch(
      /another protection domain/,
    );
    expect(bad({ ...send(client, server, 1), ud: { ah: client.ah, remoteQpn: 1 << 24, remoteQkey: 1 } }).field).toBe('ud.remoteQpn');
    expect(thrown(() => client.ctx.createAh(client.pd, { dlid: 7 })).message).toMatch(/dlid 7 names no node/);
    expect(
      thrown(() => client.ctx.createQp(client.pd, { qpType: QpType.UD, sendCq: client.cq, recvCq: client.cq, cap: { maxSendSge: 2 } })).message,
    ).toMatch(/maxSendSge must be 1/);
    const q = client.ctx.createQp(client.pd, { qpType: QpType.UD, sendCq: client.cq, recvCq: client.cq });
    expect(thrown(() => q.modify({ qpState: QpState.INIT })).message).toMatch(/qkey at INIT/);
    const rc = cluster.openDevice(0);
    const pd = rc.allocPd();
    const cq = rc.createCq(4);
    const rq = rc.createQp(pd, { sendCq: cq, recvCq: cq });
    expect(thrown(() => rq.modify({ qpState: QpState.INIT, qkey: 1 })).message).toMatch(/qkey is a UD QP attribute/);
    expect(thrown(() => client.pd.dealloc()).code).toBe('EBUSY');
    client.ah.destroy();
    expect(bad(send(client, server, 1)).message).toMatch(/was destroyed/);
  });
});
