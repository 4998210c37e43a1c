// A QP keeps up to maxSendWr RDMA_WRITEs in flight and completes them in posting order, as RC
// requires; a failed WR flushes the ones after it; a READ after writes sees every one of them.
import { afterEach, describe, expect, test } from 'vitest';
import { SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, sleep } from './helpers.js';

afterEach(closeAll);

const N = 64;

describe('several WRs in flight on one QP', () => {
  test('64 RDMA_WRITEs outstanding: more than one in flight at once, completions in order, every byte lands', async () => {
    const { client, server, cluster } = createPlayers({ size: N * P });
    for (let i = 0; i < N; i++) client.fill(i + 1, i * P, P);
    server.fill(0, 0, N * P);
    client.qp.postSend(
      Array.from({ length: N }, (_, i) => ({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(i * P, P)],
        rdma: { remoteAddr: server.at(i * P), rkey: server.mr.rkey },
      })),
    );
    let most = 0;
    const ids: number[] = [];
    const engine = cluster.system.nodes[0]!.pldma;
    const watch = setInterval(() => (most = Math.max(most, engine.active)), 0);
    try {
      for (let i = 0; i < N; i++) {
        const wc = await next(client.cq);
        expect(wc.status).toBe(WcStatus.SUCCESS);
        most = Math.max(most, engine.active);
        ids.push(Number(wc.wrId));
      }
    } finally {
      clearInterval(watch);
    }
    expect(ids).toEqual(Array.from({ length: N }, (_, i) => i));
    expect(most).toBeGreaterThan(1);
    for (let i = 0; i < N; i++) expect(server.bytes(i * P, P).every((b) => b === i + 1)).toBe(true);
  });

  test('a WRITE posted on its own while another is in flight joins it at once, not after it completes', async () => {
    // 16 MiB into untouched memory: thousands of destination faults, far longer than a
    // request's round trip.
    const BIG = 4096 * P;
    const { client, server, cluster } = createPlayers({ size: BIG + P });
    client.fill(0x71, 0, BIG + P);
    const write = (wrId: number, at: number, length: number) =>
      client.qp.postSend({
        wrId,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(at, length)],
        rdma: { remoteAddr: server.at(at), rkey: server.mr.rkey },
      });
    const engine = cluster.system.nodes[0]!.pldma;
    write(1, 0, BIG);
    const t0 = Date.now();
    while (engine.active === 0 && Date.now() - t0 < 5000) await sleep(1);
    expect(engine.active).toBe(1);
    // The send queue was empty when the loop began to wait: the second post must wake it.
    write(2, BIG, P);
    let most = 0;
    while (client.cq.length === 0 && most < 2 && Date.now() - t0 < 10_000) {
      most = Math.max(most, engine.active);
      await sleep(0);
    }
    // Both on the engine at once: the second was posted while the first still ran.
    expect(most).toBe(2);
    const wcs = [await next(client.cq, 10_000), await next(client.cq, 10_000)];
    expect(wcs.map((w) => [Number(w.wrId), w.status])).toEqual([
      [1, WcStatus.SUCCESS],
      [2, WcStatus.SUCCESS],
    ]);
    expect(server.bytes(0, BIG + P).every((b) => b === 0x71)).toBe(true);
  });

  test('a WR that fails at once, posted while a write is in flight, completes after that write, in order', async () => {
    const BIG = 4096 * P;
    const { client, server, cluster } = createPlayers({ size: BIG + P });
    client.fill(0x72, 0, BIG);
    const engine = cluster.system.nodes[0]!.pldma;
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, BIG)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const t0 = Date.now();
    while (engine.active === 0 && Date.now() - t0 < 5000) await sleep(1);
    // A bad lkey: refused locally, before any request, long before the first write is done.
    client.qp.postSend({
      wrId: 2,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [{ ...client.sge(BIG, P), lkey: client.mr.lkey ^ 0x5a5a00 }],
      rdma: { remoteAddr: server.at(BIG), rkey: server.mr.rkey },
    });
    const wcs = [await next(client.cq, 10_000), await next(client.cq, 10_000)];
    expect(wcs.map((w) => [Number(w.wrId), w.status])).toEqual([
      [1, WcStatus.SUCCESS],
      [2, WcStatus.LOC_PROT_ERR],
    ]);
    expect(server.bytes(0, BIG).every((b) => b === 0x72)).toBe(true);
  });

  test('a WRITE posted behind a READ of the same memory waits for it: the READ returns the bytes from before the write', async () => {
    // A 16 MiB READ into untouched memory (thousands of faults where it lands), then a
    // one-page WRITE to the last page it reads.
    const BIG = 4096 * P;
    const { client, server } = createPlayers({ size: BIG + P });
    server.fill(0x21, 0, BIG);
    client.fill(0x7e, BIG, P);
    const rkey = server.mr.rkey;
    client.qp.postSend([
      { wrId: 1, opcode: WrOpcode.RDMA_READ, sendFlags: SendFlags.SIGNALED, sgList: [client.sge(0, BIG)], rdma: { remoteAddr: server.at(0), rkey } },
      {
        wrId: 2,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(BIG, P)],
        rdma: { remoteAddr: server.at(BIG - P), rkey },
      },
    ]);
    const wcs = [await next(client.cq, 10_000), await next(client.cq, 10_000)];
    expect(wcs.map((w) => [Number(w.wrId), w.status])).toEqual([
      [1, WcStatus.SUCCESS],
      [2, WcStatus.SUCCESS],
    ]);
    expect(client.bytes(0, BIG).every((b) => b === 0x21)).toBe(true);
    expect(server.bytes(BIG - P, P).every((b) => b === 0x7e)).toBe(true);
  });

  test('a failed WR among writes in flight: the ones before succeed, it fails, the ones after flush, in order', async () => {
    const { client, server } = createPlayers({ size: 8 * P });
    client.qp.postSend(
      Array.from({ length: 8 }, (_, i) => ({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(i * P, P)],
        rdma: { remoteAddr: server.at(i * P), rkey: i === 3 ? server.mr.rkey ^ 0x5a5a00 : server.mr.rkey },
      })),
    );
    const wcs = [];
    for (let i = 0; i < 8; i++) wcs.push(await next(client.cq));
    expect(wcs.map((w) => Number(w.wrId))).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(wcs.slice(0, 3).map((w) => w.status)).toEqual([WcStatus.SUCCESS, WcStatus.SUCCESS, WcStatus.SUCCESS]);
    expect(wcs[3]!.status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(wcs.slice(4).every((w) => w.status === WcStatus.WR_FLUSH_ERR)).toBe(true);
  });

  test('a READ posted behind writes waits for them: it reads what they wrote', async () => {
    const { client, server } = createPlayers({ size: 16 * P });
    client.fill(0x77, 0, 8 * P);
    server.fill(0, 0, 16 * P);
    client.fill(0, 8 * P, 8 * P);
    const writes = Array.from({ length: 8 }, (_, i) => ({
      wrId: i,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(i * P, P)],
      rdma: { remoteAddr: server.at(i * P), rkey: server.mr.rkey },
    }));
    const read = {
      wrId: 99,
      opcode: WrOpcode.RDMA_READ,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(8 * P, 8 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    };
    client.qp.postSend([...writes, read]);
    const wc = await next(client.cq);
    expect([Number(wc.wrId), wc.status]).toEqual([99, WcStatus.SUCCESS]);
    expect(client.bytes(8 * P, 8 * P).every((b) => b === 0x77)).toBe(true);
  });
});
