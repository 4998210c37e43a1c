// Concurrency: application threads reading an ODP buffer while DMA faults on it (the JS
// thread, a native thread, a worker_thread) never hang and, once the completion is polled,
// see exactly the source bytes; several QPs and atomics at once; and tearing things down
// (destroying a QP, closing a context or the cluster) with work in flight flushes it with
// WR_FLUSH_ERR instead of hanging.
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { afterEach, describe, expect, test } from 'vitest';
import { connectQps, QpState, SendFlags, touch, WcStatus, WrOpcode, type WorkCompletion } from '../../lib/index.js';
import { ROOT } from '../child.js';
import { closeAll, createPlayers, next, P, pollOk, setU64, sleep, u64, within, type Player } from './helpers.js';

afterEach(closeAll);

const PAGES = 256; // 1 MiB

/** Page i holds the byte pat(i) (never 0, so a zero byte is always "not written yet"). */
const pat = (i: number): number => (i % 251) + 1;

function fillPattern(p: Player, pages = PAGES): void {
  const u = new Uint8Array(p.region.buffer, 0, pages * P);
  for (let i = 0; i < pages; i++) u.fill(pat(i), i * P, (i + 1) * P);
}

/** Bytes that are neither 0 (not yet written) nor their page's pattern: must stay 0. */
function foreignBytes(b: Uint8Array, pages = PAGES): number {
  let bad = 0;
  for (let i = 0; i < pages; i++) {
    const want = pat(i);
    for (let o = i * P; o < (i + 1) * P; o += 64) if (b[o] !== 0 && b[o] !== want) bad++;
  }
  return bad;
}

function exactPattern(b: Uint8Array, pages = PAGES): boolean {
  for (let i = 0; i < pages; i++) {
    const want = pat(i);
    for (let o = i * P; o < (i + 1) * P; o++) if (b[o] !== want) return false;
  }
  return true;
}

/** A 1 MiB RDMA WRITE into the server's evicted buffer, one fault per page ('touch'). */
function bigWrite() {
  const players = createPlayers({ policy: 'touch', size: PAGES * P });
  const { client, server } = players;
  fillPattern(client);
  server.region.evict();
  const post = () =>
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, PAGES * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
  return { ...players, post };
}

describe('an application thread reading an ODP buffer while DMA faults on it', () => {
  test('the JS thread (setImmediate loop): no hang, no foreign bytes meanwhile, exact bytes after the completion', async () => {
    const { client, server, post } = bigWrite();
    const view = new Uint8Array(server.region.buffer, 0, PAGES * P);
    let done = false;
    let reads = 0;
    let foreign = 0;
    const reader = new Promise<void>((resolve) => {
      const loop = () => {
        if (done) return resolve();
        foreign += foreignBytes(view);
        reads++;
        setImmediate(loop);
      };
      setImmediate(loop);
    });
    post();
    const wc = await pollOk(client.cq, 5000);
    done = true;
    await within('reader loop', reader, 2000);
    expect(reads).toBeGreaterThan(1); // the reads really interleaved with the transfer
    expect(foreign).toBe(0);
    expect(exactPattern(view)).toBe(true);
    // The reads made some pages resident (the zero page) before the DMA reached them, so
    // the DMA took at most one fault per page.
    expect(wc.odp!.faults.source).toBe(0);
    expect(wc.odp!.faults.destination).toBeLessThanOrEqual(PAGES);
    expect(server.region.residentPages()).toBe(PAGES);
  });

  test('a native thread (touch) reading the whole buffer again and again meanwhile', async () => {
    const { client, server, post } = bigWrite();
    let done = false;
    let reads = 0;
    let foreign = 0;
    post();
    const completion = pollOk(client.cq, 5000).finally(() => (done = true));
    while (!done) {
      const r = await within('native read', touch(server.region, { length: PAGES * P }), 5000);
      foreign += foreignBytes(r.data!);
      reads++;
    }
    const wc = await completion;
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(reads).toBeGreaterThan(0);
    expect(foreign).toBe(0);
    const after = await touch(server.region, { length: PAGES * P });
    expect(exactPattern(after.data!)).toBe(true);
  });

  test('a worker_thread reading through the addon meanwhile, then once more after the completion', async () => {
    const { client, server, post } = bigWrite();
    // The worker loads the same addon (its region table is per process) and reads the
    // mapping by id from its own thread until told to stop, then once more.
    const flag = new Int32Array(new SharedArrayBuffer(4));
    const worker = new Worker(
      `
      const { parentPort, workerData } = require('node:worker_threads');
      const binding = require(workerData.gyp)(workerData.root);
      const { id, length, pages, P } = workerData;
      const pat = (i) => (i % 251) + 1;
      const check = (b) => {
        let foreign = 0, exact = true;
        for (let i = 0; i < pages; i++) for (let o = i * P; o < (i + 1) * P; o += 64) {
          if (b[o] !== pat(i)) exact = false;
          if (b[o] !== 0 && b[o] !== pat(i)) foreign++;
        }
        return { foreign, exact };
      };
      (async () => {
        let reads = 0, foreign = 0;
        parentPort.postMessage({ started: true });
        while (Atomics.load(workerData.flag, 0) === 0) {
          const r = await binding.touch(id, 0, length, 0, 0, false);
          foreign += check(r.data).foreign;
          reads++;
        }
        const last = check((await binding.touch(id, 0, length, 0, 0, false)).data);
        parentPort.postMessage({ reads, foreign, lastExact: last.exact, lastForeign: last.foreign });
      })().catch((e) => parentPort.postMessage({ error: String(e && e.stack || e) }));
      `,
      {
        eval: true,
        workerData: {
          gyp: createRequire(import.meta.url).resolve('node-gyp-build'),
          root: ROOT,
          id: server.region.id,
          length: PAGES * P,
          pages: PAGES,
          P,
          flag,
        },
      },
    );
    try {
      const messages: Array<Record<string, unknown>> = [];
      const result = new Promise<Record<string, unknown>>((resolve, reject) => {
        worker.on('message', (m: Record<string, unknown>) => {
          messages.push(m);
          if (!m['started']) resolve(m);
        });
        worker.on('error', reject);
      });
      await within('worker start', new Promise<void>((r) => worker.once('message', () => r())), 5000);
      post();
      await pollOk(client.cq, 5000);
      Atomics.store(flag, 0, 1);
      const r = await within('worker result', result, 5000);
      expect(r['error']).toBeUndefined();
      expect(r['reads']).toBeGreaterThan(0);
      expect(r['foreign']).toBe(0);
      expect(r['lastForeign']).toBe(0);
      expect(r['lastExact']).toBe(true);
    } finally {
      await worker.terminate();
    }
  });
});

describe('several transfers at once', () => {
  test('two QP pairs write disjoint halves of one evicted buffer at once: each page faults once, bytes exact', async () => {
    const { client, server } = createPlayers({ policy: 'touch', size: 64 * P });
    // A second QP pair between the same contexts and MRs.
    const qa = client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq });
    const qb = server.ctx.createQp(server.pd, { sendCq: server.cq, recvCq: server.cq });
    connectQps(qa, qb);
    fillPattern(client, 64);
    server.region.evict();
    const wr = (id: number, half: number) => ({
      wrId: id,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(half * 32 * P, 32 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(half * 32 * P), rkey: server.mr.rkey },
    });
    client.qp.postSend(wr(1, 0));
    qa.postSend(wr(2, 1));
    const wcs = [await pollOk(client.cq), await pollOk(client.cq)];
    expect(wcs.map((w) => w.wrId).sort()).toEqual([1n, 2n]);
    for (const w of wcs) expect(w.odp!.faults).toEqual({ source: 0, destination: 32 });
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(64);
    expect(exactPattern(new Uint8Array(server.region.buffer), 64)).toBe(true);
  });

  test('many WRs outstanding on one QP complete in posting order, faults and all', async () => {
    const { client, server } = createPlayers({ policy: 'touch', size: 64 * P });
    fillPattern(client, 64);
    server.region.evict();
    client.qp.postSend(
      Array.from({ length: 16 }, (_, i) => ({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(i * 4 * P, 4 * P)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(i * 4 * P), rkey: server.mr.rkey },
      })),
    );
    const wcs: WorkCompletion[] = [];
    for (let i = 0; i < 16; i++) wcs.push(await pollOk(client.cq));
    expect(wcs.map((w) => Number(w.wrId))).toEqual(Array.from({ length: 16 }, (_, i) => i));
    for (const w of wcs) expect(w.odp!.faults.destination).toBe(4);
    expect(exactPattern(new Uint8Array(server.region.buffer), 64)).toBe(true);
  });

  test('FETCH_AND_ADD from both sides on one word at once: every old value distinct, the sum exact', async () => {
    const { client, server } = createPlayers({ size: 64 * P });
    // The word lives on the server; the client adds 1 and the server (through its own QP to
    // itself is not modelled, so through a second client QP) adds 1, 20 times each.
    const qa = client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq });
    const qb = server.ctx.createQp(server.pd, { sendCq: server.cq, recvCq: server.cq });
    connectQps(qa, qb);
    setU64(server, 0n);
    const N = 20;
    for (let i = 0; i < N; i++) {
      for (const [q, k] of [
        [client.qp, 0],
        [qa, 1],
      ] as const) {
        const slot = (2 * i + k) * 8;
        q.postSend({
          wrId: 2 * i + k,
          opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
          sgList: [client.sge(P + slot, 8)],
          sendFlags: SendFlags.SIGNALED,
          atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n },
        });
      }
    }
    for (let i = 0; i < 2 * N; i++) await pollOk(client.cq);
    expect(u64(server)).toBe(BigInt(2 * N));
    const olds = Array.from({ length: 2 * N }, (_, j) => Number(u64(client, P + j * 8))).sort((a, b) => a - b);
    expect(olds).toEqual(Array.from({ length: 2 * N }, (_, j) => j));
  });
});

describe('tearing down with work in flight', () => {
  test('destroying a QP mid-transfer: every posted WR completes once, the unfinished ones with WR_FLUSH_ERR; no hang', async () => {
    const { client, server, post } = bigWrite();
    post();
    client.qp.postSend(
      [2, 3, 4].map((id) => ({
        wrId: id,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, P)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      })),
    );
    // Let the first transfer start faulting, then destroy the QP under it.
    const t0 = Date.now();
    while (server.ctx.faultLibrary.stats().faults.destination === 0 && Date.now() - t0 < 2000) await sleep(1);
    expect(server.ctx.faultLibrary.stats().faults.destination).toBeGreaterThan(0);
    client.qp.destroy();
    const wcs: WorkCompletion[] = [];
    for (let i = 0; i < 4; i++) wcs.push(await next(client.cq, 3000));
    expect(wcs.map((w) => Number(w.wrId)).sort()).toEqual([1, 2, 3, 4]);
    for (const w of wcs) expect(w.status).toBe(WcStatus.WR_FLUSH_ERR);
    await sleep(50);
    expect(client.cq.length).toBe(0); // exactly once each
  });

  test('destroying a QP whose SEND waits for a receive (RNR, rnrRetry 7): flushed, and the SEND never lands later', async () => {
    const { client, server } = createPlayers({ rc: { minRnrTimer: 1 } });
    client.fill(0x66);
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge()], sendFlags: SendFlags.SIGNALED });
    await sleep(20);
    client.qp.destroy();
    expect(await next(client.cq, 2000)).toMatchObject({ wrId: 1n, status: WcStatus.WR_FLUSH_ERR });
    server.qp.postRecv({ wrId: 9, sgList: [server.sge()] });
    await sleep(50);
    expect(server.cq.length).toBe(0);
    expect(server.bytes().includes(0x66)).toBe(false);
  });

  test('closing the requester context mid-transfer: a pending cq.next() settles at once; closing the cluster then does not hang', async () => {
    const { cluster, client, post } = bigWrite();
    post();
    const waiting = client.cq.next({ timeoutMs: 5000 }).then(
      (wc) => ({ wc }),
      (e: Error & { code?: string }) => ({ error: e.code }),
    );
    await sleep(5);
    client.ctx.close();
    const r = await within('pending next() after close', waiting, 1000);
    // The context destroys its QPs (flushing their work to the waiters) before it closes its
    // CQs: the waiter gets the flushed completion, not a timeout or a closed-CQ error.
    expect(r).toEqual({ wc: expect.objectContaining({ wrId: 1n, status: WcStatus.WR_FLUSH_ERR }) });
    expect(client.qp.state).toBe(QpState.ERR);
    const t0 = Date.now();
    cluster.close();
    expect(Date.now() - t0).toBeLessThan(1000);
  });

  test('closing the responder context while a write into its memory is faulting: the requester gets an error, not a hang', async () => {
    const { client, server, post } = bigWrite();
    post();
    const t0 = Date.now();
    while (server.ctx.faultLibrary.stats().faults.destination === 0 && Date.now() - t0 < 2000) await sleep(1);
    server.ctx.close();
    const wc = await next(client.cq, 5000);
    // Its MR and PD are gone: the requester's next block is refused (on hardware the dead QP
    // would not answer at all: a retry error). Either way an error, promptly.
    expect([WcStatus.REM_ACCESS_ERR, WcStatus.RETRY_EXC_ERR]).toContain(wc.status);
    expect(client.qp.state).toBe(QpState.ERR);
  });

  test('closing the cluster with transfers in flight: their QPs flush, pending waits settle', async () => {
    const { cluster, client, post } = bigWrite();
    post();
    const waiting = client.cq.next({ timeoutMs: 5000 }).then(
      (wc) => wc.status,
      (e: Error & { code?: string }) => e.code,
    );
    await sleep(5);
    cluster.close();
    const r = await within('pending next() after cluster.close', waiting, 1000);
    expect(r).toBe(WcStatus.WR_FLUSH_ERR);
  });
});
