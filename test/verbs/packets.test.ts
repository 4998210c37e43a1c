// One RC protocol: what a work request puts on the transport, counted with a tap on it. A
// resident RDMA WRITE, a SEND and a WRITE with immediate are one packet and its ACK; no
// verbs-level request or response goes before or after the bytes. A SEND with no receive
// posted is answered with an RNR NAK, a packet like any other; a destination fault with the
// fault NACK, the thesis's retransmission request, the retransmission and its ACK.
import { afterEach, describe, expect, test } from 'vitest';
import { AckResp, type Packet, RcOp } from '../../kernel-sim/index.js';
import { SendFlags, WcOpcode, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, pollOk, sleep, type Players } from './helpers.js';

afterEach(closeAll);

/** Every packet the cluster's transport carries from now on, in order. */
function tap(players: Players): Packet[] {
  const fabric = players.cluster.system.fabric;
  const seen: Packet[] = [];
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    seen.push(p);
    deliver(p);
  };
  return seen;
}

/** A packet as a short word: write:OPCODE (or raw), ack:RESP of its last verdict. */
function word(p: Packet): string {
  return p.type === 'write' ? `write:${p.opcode !== undefined ? RcOp[p.opcode] : 'raw'}` : `ack:${AckResp[p.resp]}`;
}

function resident(players: Players): void {
  players.client.region.populate();
  players.server.region.populate();
}

describe('a resident work request is exactly two packets', () => {
  test.each([
    ['64 B', 64],
    ['one run, 1 MiB', 1 << 20],
  ])('RDMA WRITE of %s: the write and its ACK', async (_, bytes) => {
    const players = createPlayers({ size: 2 << 20 });
    const { client, server } = players;
    resident(players);
    client.fill(0x41, 0, bytes);
    const seen = tap(players);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, bytes)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).byteLen).toBe(bytes);
    expect(seen.map(word)).toEqual(['write:WRITE', 'ack:OK']);
    const w = seen[0]!;
    expect(w.type === 'write' && { qpn: w.qpn, srcQpn: w.srcQpn, key: w.key, psn: w.psn }).toEqual({
      qpn: server.qp.qpNum,
      srcQpn: client.qp.qpNum,
      key: server.mr.rkey,
      psn: 0,
    });
    expect(server.bytes(0, bytes).every((b) => b === 0x41)).toBe(true);
  });

  test('SEND of 8 B: the packet takes the receive where it lands, and its ACK; the next SEND has the next PSN', async () => {
    const players = createPlayers();
    const { client, server } = players;
    resident(players);
    server.qp.postRecv([
      { wrId: 7, sgList: [server.sge(0, 64)] },
      { wrId: 8, sgList: [server.sge(64, 64)] },
    ]);
    client.fill(0x42, 0, 8);
    const seen = tap(players);
    for (const id of [1, 2]) client.qp.postSend({ wrId: id, opcode: WrOpcode.SEND, sgList: [client.sge(0, 8)], sendFlags: SendFlags.SIGNALED });
    await pollOk(client.cq);
    await pollOk(client.cq);
    expect(seen.map(word)).toEqual(['write:SEND', 'ack:OK', 'write:SEND', 'ack:OK']);
    expect(seen.filter((p) => p.type === 'write').map((p) => p.type === 'write' && p.psn)).toEqual([0, 1]);
    const recvs = [await pollOk(server.cq), await pollOk(server.cq)];
    expect(recvs.map((w) => [w.wrId, w.opcode, w.byteLen, w.srcQp])).toEqual([
      [7n, WcOpcode.RECV, 8, client.qp.qpNum],
      [8n, WcOpcode.RECV, 8, client.qp.qpNum],
    ]);
    expect(server.bytes(0, 8).every((b) => b === 0x42)).toBe(true);
  });

  test('WRITE with immediate, and an empty SEND: one packet each and its ACK, the receive completed', async () => {
    const players = createPlayers();
    const { client, server } = players;
    resident(players);
    server.qp.postRecv([
      { wrId: 7, sgList: [] },
      { wrId: 8, sgList: [] },
    ]);
    const seen = tap(players);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      immData: 0x1234,
      sgList: [client.sge(0, 256)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    client.qp.postSend({ wrId: 2, opcode: WrOpcode.SEND_WITH_IMM, immData: 5, sgList: [], sendFlags: SendFlags.SIGNALED });
    await pollOk(client.cq);
    await pollOk(client.cq);
    expect(seen.map(word)).toEqual(['write:WRITE_IMM', 'ack:OK', 'write:SEND_IMM', 'ack:OK']);
    expect(await pollOk(server.cq)).toMatchObject({ wrId: 7n, opcode: WcOpcode.RECV_RDMA_WITH_IMM, immData: 0x1234, byteLen: 256 });
    expect(await pollOk(server.cq)).toMatchObject({ wrId: 8n, opcode: WcOpcode.RECV, immData: 5, byteLen: 0 });
  });
});

describe('a resident READ and an atomic are two packets too', () => {
  // The request and its response, as RC has them: the READ response (or the ATOMIC ACKNOWLEDGE,
  // whose 8 bytes are the word's original value) is the request's acknowledgement, and nothing
  // ACKs it; no verbs-level header either.
  test.each([
    ['RDMA READ', WrOpcode.RDMA_READ],
    ['FETCH_AND_ADD', WrOpcode.ATOMIC_FETCH_AND_ADD],
  ])('%s: the request and its response', async (_, opcode) => {
    const players = createPlayers();
    const { client, server } = players;
    resident(players);
    server.fill(0x44, 0, 64);
    const seen = tap(players);
    const remote = { remoteAddr: server.at(0), rkey: server.mr.rkey };
    client.qp.postSend(
      opcode === WrOpcode.RDMA_READ
        ? { wrId: 1, opcode, sgList: [client.sge(0, 64)], sendFlags: SendFlags.SIGNALED, rdma: remote }
        : { wrId: 1, opcode, sgList: [client.sge(0, 8)], sendFlags: SendFlags.SIGNALED, atomic: { ...remote, compareAdd: 1n } },
    );
    await pollOk(client.cq);
    const [request, response] = opcode === WrOpcode.RDMA_READ ? ['write:READ_REQUEST', 'write:READ_RESPONSE'] : ['write:ATOMIC', 'write:ATOMIC_ACK'];
    // Nothing follows a while later either (no ACK of the response).
    await sleep(20);
    expect(seen.map(word)).toEqual([request, response]);
    expect(client.bytes(0, 8).every((b) => b === 0x44)).toBe(true);
    const r = seen[1]!;
    expect(r.type === 'write' && { qpn: r.qpn, srcQpn: r.srcQpn, psn: r.psn, va: r.va }).toEqual({
      qpn: client.qp.qpNum,
      srcQpn: server.qp.qpNum,
      psn: 0,
      va: client.at(0),
    });
    if (opcode === WrOpcode.ATOMIC_FETCH_AND_ADD) expect(new DataView(server.region.buffer).getBigUint64(0, true)).toBe(0x4444444444444445n);
  });

  test('a READ of one run (1 MiB): the request and one response packet', async () => {
    const players = createPlayers({ size: 2 << 20 });
    const { client, server } = players;
    resident(players);
    server.fill(0x45, 0, 1 << 20);
    const seen = tap(players);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge(0, 1 << 20)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).byteLen).toBe(1 << 20);
    expect(seen.map(word)).toEqual(['write:READ_REQUEST', 'write:READ_RESPONSE']);
    expect(client.bytes(0, 1 << 20).every((b) => b === 0x45)).toBe(true);
  });
});

describe('what a WRITE or SEND adds when it cannot land at once', () => {
  test('a SEND with no receive: an RNR NAK, then after the timer the packet again and its ACK', async () => {
    const players = createPlayers({ rc: { minRnrTimer: 14 } }); // 1.28 ms
    const { client, server } = players;
    resident(players);
    const seen = tap(players);
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 8)], sendFlags: SendFlags.SIGNALED });
    await sleep(5);
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, 64)] });
    await pollOk(client.cq);
    const words = seen.map(word);
    // One RNR NAK per retry while no receive was posted, then the packet lands.
    const naks = words.filter((w) => w === 'ack:RNR').length;
    expect(naks).toBeGreaterThan(0);
    expect(words).toEqual([...Array.from({ length: naks }, () => ['write:SEND', 'ack:RNR']).flat(), 'write:SEND', 'ack:OK']);
    const rnr = seen.find((p) => p.type === 'ack' && p.resp === AckResp.RNR);
    expect(rnr?.type === 'ack' && rnr.verdicts?.[0]?.rnrTimer).toBe(14);
    expect((await pollOk(server.cq)).wrId).toBe(7n);
  });

  test("a one-page WRITE into an evicted page: the fault NACK (carrying its fault library's answer), the retransmission and its ACK", async () => {
    const players = createPlayers({ policy: 'touch' });
    const { client, server } = players;
    client.region.populate();
    server.region.evict();
    client.fill(0x43, 0, P);
    const seen = tap(players);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults.destination).toBe(1);
    expect(seen.map(word)).toEqual(['write:WRITE', 'ack:FAULT', 'write:WRITE', 'ack:OK']);
    const nack = seen[1]!;
    expect(nack.type === 'ack' && nack.verdicts?.[0]?.resolved?.atUs).toBeGreaterThan(0);
    expect(server.bytes(0, P).every((b) => b === 0x43)).toBe(true);
  });
});

describe('what a READ or an atomic adds when a page is missing', () => {
  const read = (players: Players, bytes: number) =>
    players.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [players.client.sge(0, bytes)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: players.server.at(0), rkey: players.server.mr.rkey },
    });
  const faa = (players: Players) =>
    players.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [players.client.sge(0, 8)],
      sendFlags: SendFlags.SIGNALED,
      atomic: { remoteAddr: players.server.at(0), rkey: players.server.mr.rkey, compareAdd: 5n },
    });

  test('a READ from an evicted source: the response waits for the responder to resolve it; still two packets', async () => {
    // Touch-Ahead: the one fault makes both pages resident.
    const players = createPlayers({ shared: true });
    const { client, server } = players;
    client.region.populate();
    server.fill(0x46, 0, 2 * P);
    server.region.unmapPages();
    const seen = tap(players);
    read(players, 2 * P);
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults).toEqual({ source: 1, destination: 0 });
    expect(seen.map(word)).toEqual(['write:READ_REQUEST', 'write:READ_RESPONSE']);
    expect(client.bytes(0, 2 * P).every((b) => b === 0x46)).toBe(true);
  });

  test('a READ into an evicted sink: the bytes before it land, the rest is asked for again under the same PSN', async () => {
    const players = createPlayers({ policy: 'touch' });
    const { client, server } = players;
    client.region.populate();
    server.region.populate();
    server.fill(0x47, 0, 4 * P);
    client.region.evict(2 * P, P);
    const seen = tap(players);
    read(players, 4 * P);
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(seen.map(word)).toEqual(['write:READ_REQUEST', 'write:READ_RESPONSE', 'write:READ_REQUEST', 'write:READ_RESPONSE']);
    // The second request is for the two pages from the one that faulted: RETH and sink moved on.
    const [first, again, rest] = [seen[0]!, seen[2]!, seen[3]!];
    expect(first.type === 'write' && again.type === 'write' && rest.type === 'write').toBe(true);
    if (first.type !== 'write' || again.type !== 'write' || rest.type !== 'write') return;
    expect(again.psn).toBe(first.psn);
    expect([again.va - first.va, again.dmaLength, again.sinks?.[0]?.addr]).toEqual([BigInt(2 * P), 2 * P, client.at(2 * P)]);
    expect([rest.va, rest.length]).toEqual([client.at(2 * P), 2 * P]);
    expect(client.bytes(0, 4 * P).every((b) => b === 0x47)).toBe(true);
  });

  test('a READ into two sinks, the second one evicted: the first lands, the request goes again for the second only', async () => {
    const players = createPlayers({ policy: 'touch' });
    const { client, server } = players;
    client.region.populate();
    server.region.populate();
    server.fill(0x48, 0, 2 * P);
    client.region.evict(8 * P, P);
    const seen = tap(players);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge(0, P), client.sge(8 * P, P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(seen.map(word)).toEqual(['write:READ_REQUEST', 'write:READ_RESPONSE', 'write:READ_RESPONSE', 'write:READ_REQUEST', 'write:READ_RESPONSE']);
    const again = seen[3]!;
    expect(again.type === 'write' && [again.va, again.dmaLength, again.sinks]).toEqual([
      server.at(P),
      P,
      [{ addr: client.at(8 * P), length: P, lkey: client.mr.lkey }],
    ]);
    expect(client.bytes(0, P).every((b) => b === 0x48)).toBe(true);
    expect(client.bytes(8 * P, P).every((b) => b === 0x48)).toBe(true);
  });

  test('a fetch-and-add whose old value lands in an evicted page: asked for again, answered from the replay, executed once', async () => {
    const players = createPlayers({ policy: 'touch' });
    const { client, server } = players;
    server.region.populate();
    new DataView(server.region.buffer).setBigUint64(0, 100n, true);
    client.region.evict();
    const seen = tap(players);
    faa(players);
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(seen.map(word)).toEqual(['write:ATOMIC', 'write:ATOMIC_ACK', 'write:ATOMIC', 'write:ATOMIC_ACK']);
    expect(seen[2]!.type === 'write' && seen[2].psn).toBe(0);
    // The word was added to once; the requester got its value from before.
    expect(new DataView(server.region.buffer).getBigUint64(0, true)).toBe(105n);
    expect(new DataView(client.region.buffer).getBigUint64(0, true)).toBe(100n);
    // The next atomic has the next PSN and is executed.
    faa(players);
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    expect(new DataView(server.region.buffer).getBigUint64(0, true)).toBe(110n);
    expect(new DataView(client.region.buffer).getBigUint64(0, true)).toBe(105n);
  });

  test("an atomic on an evicted word: it waits for the responder's fault library, then runs; two packets", async () => {
    const players = createPlayers({ shared: true, policy: 'touch' });
    const { client, server } = players;
    client.region.populate();
    new DataView(server.region.buffer).setBigUint64(0, 7n, true);
    server.region.unmapPages();
    const seen = tap(players);
    faa(players);
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults).toEqual({ source: 1, destination: 0 });
    expect(seen.map(word)).toEqual(['write:ATOMIC', 'write:ATOMIC_ACK']);
    expect(new DataView(server.region.buffer).getBigUint64(0, true)).toBe(12n);
    expect(new DataView(client.region.buffer).getBigUint64(0, true)).toBe(7n);
  });
});
