// Completion queues on their own: waiting (next, take, for await) with its timeout, abort
// and close; depth and overruns; what a completion carries. Completions come from real RDMA
// writes between two players.
import { getEventListeners } from 'node:events';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { Cluster, connectQps, QpState, SendFlags, WcOpcode, WcStatus, WrOpcode, type CompletionQueue, type QueuePair } from '../../lib/index.js';
import { closeAll, createPlayers, sleep, thrown, track, within, type Player } from './helpers.js';

afterEach(closeAll);

/** A QP of the client with its own CQ of `depth`, connected to a new QP of the server. */
function withCq(depth: number): { cq: CompletionQueue; qp: QueuePair; client: Player; server: Player } {
  const { client, server } = createPlayers();
  const cq = client.ctx.createCq(depth);
  const qp = client.ctx.createQp(client.pd, { sendCq: cq, recvCq: cq });
  const peer = server.ctx.createQp(server.pd, { sendCq: server.cq, recvCq: server.cq });
  connectQps(qp, peer);
  return { cq, qp, client, server };
}

function write(qp: QueuePair, client: Player, server: Player, wrId: number): void {
  qp.postSend({
    wrId,
    opcode: WrOpcode.RDMA_WRITE,
    sendFlags: SendFlags.SIGNALED,
    sgList: [client.sge(0, 64)],
    rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
  });
}

describe('waiting for completions', () => {
  test('next() times out with ETIMEDOUT after its timeout, and a later completion is not lost', async () => {
    const { cq, qp, client, server } = withCq(8);
    const t0 = performance.now();
    const e = await cq.next({ timeoutMs: 30 }).then(
      () => undefined,
      (err: Error & { code?: string }) => err,
    );
    expect(performance.now() - t0).toBeGreaterThanOrEqual(29);
    expect(e).toMatchObject({ code: 'ETIMEDOUT', message: 'no completion within 30 ms' });
    write(qp, client, server, 5);
    await within(
      'the completion',
      (async () => {
        while (cq.length === 0) await sleep(1);
      })(),
    );
    expect(cq.poll(4).map((w) => w.wrId)).toEqual([5n]);
  });

  test('waits of different timeouts on one CQ each end at their own deadline; a completion goes to the oldest', async () => {
    const { cq, qp, client, server } = withCq(8);
    const settled = (p: Promise<unknown>) =>
      p.then(
        (wc) => ({ at: performance.now() - t0, wc, code: undefined }),
        (e: Error & { code?: string }) => ({ at: performance.now() - t0, wc: undefined, code: e.code }),
      );
    const t0 = performance.now();
    const long = settled(cq.next({ timeoutMs: 5000 }));
    const short = settled(cq.next({ timeoutMs: 40 }));
    const later = settled(cq.next({ timeoutMs: 80 }));
    const s = await short;
    expect(s.code).toBe('ETIMEDOUT');
    expect(s.at).toBeGreaterThanOrEqual(39);
    expect(s.at).toBeLessThan(2000);
    const l = await later;
    expect(l.code).toBe('ETIMEDOUT');
    expect(l.at).toBeGreaterThanOrEqual(79);
    write(qp, client, server, 7);
    const first = await within('the long wait', long);
    expect(first.code).toBeUndefined();
    expect((first.wc as { wrId: bigint }).wrId).toBe(7n);
    expect(cq.length).toBe(0);
  });

  test('next() with an AbortSignal rejects with ABORT_ERR when aborted; the completion then waits in the queue', async () => {
    const { cq, qp, client, server } = withCq(8);
    const ac = new AbortController();
    const p = cq.next({ timeoutMs: 5000, signal: ac.signal });
    ac.abort();
    await expect(p).rejects.toMatchObject({ code: 'ABORT_ERR', message: 'wait for a completion was aborted' });
    write(qp, client, server, 6);
    expect((await cq.next({ timeoutMs: 3000 })).wrId).toBe(6n);
  });

  test('one AbortSignal for many waits: each settled wait leaves no listener on it, and a later abort touches none', async () => {
    const { cq, qp, client, server } = withCq(8);
    const ac = new AbortController();
    for (let i = 1; i <= 3; i++) {
      const p = cq.next({ timeoutMs: 3000, signal: ac.signal });
      expect(getEventListeners(ac.signal, 'abort')).toHaveLength(1);
      write(qp, client, server, i);
      expect((await p).wrId).toBe(BigInt(i));
      expect(getEventListeners(ac.signal, 'abort')).toHaveLength(0);
    }
    // A timed-out wait lets go of the signal too.
    await expect(cq.next({ timeoutMs: 5, signal: ac.signal })).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    expect(getEventListeners(ac.signal, 'abort')).toHaveLength(0);
    ac.abort();
    write(qp, client, server, 9);
    expect((await cq.next({ timeoutMs: 3000 })).wrId).toBe(9n);
  });

  test('take(n) resolves with n completions in order; a waiter gets the completion, not the queue', async () => {
    const { cq, qp, client, server } = withCq(8);
    const waiting = cq.take(3, { timeoutMs: 3000 });
    for (const id of [1, 2, 3]) write(qp, client, server, id);
    const wcs = await waiting;
    expect(wcs.map((w) => w.wrId)).toEqual([1n, 2n, 3n]);
    expect(cq.length).toBe(0);
    for (const w of wcs)
      expect(w).toMatchObject({
        status: WcStatus.SUCCESS,
        statusStr: 'success',
        opcode: WcOpcode.RDMA_WRITE,
        byteLen: 64,
        vendorErr: 0,
        qpNum: qp.qpNum,
        wcFlags: 0,
      });
  });

  test('for await … of a CQ yields completions until the CQ is closed', async () => {
    const { cq, qp, client, server } = withCq(8);
    for (const id of [1, 2]) write(qp, client, server, id);
    const seen: bigint[] = [];
    const loop = (async () => {
      for await (const wc of cq) {
        seen.push(wc.wrId);
        if (seen.length === 2) setImmediate(() => cq.close());
      }
    })();
    await within('the loop to end', loop, 3000);
    expect(seen).toEqual([1n, 2n]);
  });

  test("for await … of a CQ waits as long as it takes: no next()'s 10 s default timeout", async () => {
    const cluster = track(Cluster.create({ nodes: 1 }));
    const cq = cluster.openDevice(0).createCq(4);
    // Fake timers only here, where nothing but the CQ's own wait uses them.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      let ended: string | undefined;
      const loop = (async () => {
        for await (const wc of cq) void wc;
      })().then(
        () => (ended = 'returned'),
        (e: Error & { code?: string }) => (ended = e.code),
      );
      await vi.advanceTimersByTimeAsync(60_000);
      expect(ended).toBeUndefined();
      cq.close();
      await loop;
      expect(ended).toBe('returned');
    } finally {
      vi.useRealTimers();
    }
  });

  test('closing rejects every waiter with ERR_PFR_CLOSED; a closed CQ refuses poll and next', async () => {
    const { cq } = withCq(8);
    const a = cq.next({ timeoutMs: 5000 });
    const b = cq.next({ timeoutMs: 5000 });
    cq.close();
    cq.close();
    expect(cq.closed).toBe(true);
    await expect(a).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
    await expect(b).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
    expect(thrown(() => cq.poll()).code).toBe('ERR_PFR_CLOSED');
    expect(thrown(() => cq.next()).code).toBe('ERR_PFR_CLOSED');
  });

  test('completions for a closed CQ are dropped, not an overrun: the QP stays in RTS and its writes still land', async () => {
    const { cq, qp, client, server } = withCq(1);
    cq.close();
    for (let i = 0; i < 3; i++) {
      client.fill(0x60 + i, 0, 64);
      write(qp, client, server, i + 1);
      for (let t0 = Date.now(); server.bytes(0, 64)[63] !== 0x60 + i && Date.now() - t0 < 3000;) await sleep(1);
      expect(server.bytes(0, 64).every((b) => b === 0x60 + i)).toBe(true);
    }
    await sleep(20); // the last completion is pushed after the bytes land
    expect(qp.state).toBe(QpState.RTS);
    expect(cq.overruns).toBe(0);
    expect(client.ctx.pollAsyncEvents()).toEqual([]);
  });
});

describe('depth', () => {
  test('a CQ of depth 2 keeps two completions and counts the third as an overrun', async () => {
    const { cq, qp, client, server } = withCq(2);
    expect(cq.depth).toBe(2);
    for (const id of [1, 2, 3]) write(qp, client, server, id);
    await within(
      'three writes',
      (async () => {
        while (server.ctx.cluster.system.node(0).pldma.counters().completed < 3) await sleep(1);
      })(),
    );
    await sleep(5);
    expect(cq.length).toBe(2);
    expect(cq.overruns).toBe(1);
    expect(cq.poll(5).map((w) => w.wrId)).toEqual([1n, 2n]);
  });

  test('poll(n) takes at most n, oldest first; n must be a positive integer; depth is bounded', async () => {
    const { cq, qp, client, server } = withCq(8);
    for (const id of [1, 2, 3]) write(qp, client, server, id);
    await cq.take(0);
    while (cq.length < 3) await sleep(1);
    expect(cq.poll().map((w) => w.wrId)).toEqual([1n]);
    expect(cq.poll(5).map((w) => w.wrId)).toEqual([2n, 3n]);
    expect(cq.poll(5)).toEqual([]);
    expect(() => cq.poll(0)).toThrow(RangeError);
    expect(() => client.ctx.createCq(0)).toThrow(RangeError);
    expect(() => client.ctx.createCq(2 ** 22 + 1)).toThrow(RangeError);
    expect(client.ctx.createCq(2 ** 22).depth).toBe(2 ** 22);
    expect(() => cq.next({ timeoutMs: 0 })).toThrow(RangeError);
  });
});
