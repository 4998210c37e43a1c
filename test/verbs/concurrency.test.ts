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
  // Each read happens at a point where the transfer is provably in flight: in the fault
  // library's onResolve, i.e. while a block waits for its retransmission. A read covers the
  // pages up to the faulting one only: reading a page further on would map the zero page
  // there and spare the DMA its fault, so the count of faults (and reads) stays exact.
  test("the JS thread, reading at each of the DMA's faults: no hang, no foreign bytes meanwhile, exact bytes after the completion", async () => {
    const { client, server, post } = bigWrite();
    const view = new Uint8Array(server.region.buffer, 0, PAGES * P);
    let reads = 0;
    let foreign = 0;
    let done = false;
    let readsBeforeCompletion = 0;
    server.ctx.faultLibrary.onResolve((f) => {
      const pages = Number(f.va - server.region.address) / P + 1;
      foreign += foreignBytes(view.subarray(0, pages * P), pages);
      reads++;
      if (!done) readsBeforeCompletion++;
    });
    post();
    const wc = await pollOk(client.cq, 5000);
    done = true;
    // One read per fault, every one of them while the transfer was in flight.
    expect(wc.odp!.faults).toEqual({ source: 0, destination: PAGES });
    expect(reads).toBe(PAGES);
    expect(readsBeforeCompletion).toBe(PAGES);
    expect(foreign).toBe(0);
    expect(exactPattern(view)).toBe(true);
    expect(server.region.residentPages()).toBe(PAGES);
  });

  test('a native thread (touch) reading, at each fault, every page up to the faulting one', async () => {
    const { client, server, post } = bigWrite();
    const reads: Array<Promise<number>> = [];
    server.ctx.faultLibrary.onResolve((f) => {
      const pages = Number(f.va - server.region.address) / P + 1;
      // Not awaited: the native thread reads while the DMA goes on.
      reads.push(touch(server.region, { length: pages * P }).then((r) => foreignBytes(r.data!, pages)));
    });
    post();
    const wc = await pollOk(client.cq, 5000);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults.destination).toBe(PAGES);
    expect(reads).toHaveLength(PAGES);
    const foreign = await within('native reads', Promise.all(reads), 5000);
    expect(foreign.reduce((a, b) => a + b, 0)).toBe(0);
    const after = await touch(server.region, { length: PAGES * P });
    expect(exactPattern(after.data!)).toBe(true);
  });

  test('a worker_thread reading through the addon while the transfer waits on its first fault, then once more after the completion', async () => {
    const { client, server, post } = bigWrite();
    // The worker loads the same addon (its region table is per process) and reads the
    // mapping by id from its own thread. sync[0]: go, sync[1]: stop, sync[2]: reads done.
    const sync = new Int32Array(new SharedArrayBuffer(12));
    const worker = new Worker(
      `
      const { parentPort, workerData } = require('node:worker_threads');
      const binding = require(workerData.gyp)(workerData.root);
      const { id, length, pages, P, sync } = workerData;
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
        let foreign = 0;
        parentPort.postMessage({ started: true });
        while (Atomics.load(sync, 0) === 0) Atomics.wait(sync, 0, 0, 50);
        while (Atomics.load(sync, 1) === 0) {
          foreign += check((await binding.touch(id, 0, length, 0, 0, false)).data).foreign;
          Atomics.add(sync, 2, 1);
          Atomics.notify(sync, 2);
        }
        const last = check((await binding.touch(id, 0, length, 0, 0, false)).data);
        parentPort.postMessage({ reads: Atomics.load(sync, 2), foreign, lastExact: last.exact, lastForeign: last.foreign });
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
          sync,
        },
      },
    );
    try {
      const result = new Promise<Record<string, unknown>>((resolve, reject) => {
        worker.on('message', (m: Record<string, unknown>) => {
          if (!m['started']) resolve(m);
        });
        worker.on('error', reject);
      });
      await within('worker start', new Promise<void>((r) => worker.once('message', () => r())), 5000);
      // At the first fault, hold the transfer (this thread blocks in the fault library's
      // listener) until the worker has read the whole buffer twice.
      let readsAtFault = -1;
      server.ctx.faultLibrary.onResolve(() => {
        if (readsAtFault >= 0) return;
        Atomics.store(sync, 0, 1);
        Atomics.notify(sync, 0);
        const t0 = Date.now();
        for (let n = Atomics.load(sync, 2); n < 2 && Date.now() - t0 < 5000; n = Atomics.load(sync, 2)) Atomics.wait(sync, 2, n, 100);
        readsAtFault = Atomics.load(sync, 2);
      });
      post();
      const wc = await pollOk(client.cq, 5000);
      Atomics.store(sync, 1, 1);
      const r = await within('worker result', result, 5000);
      expect(r['error']).toBeUndefined();
      expect(readsAtFault).toBeGreaterThanOrEqual(2);
      // The worker's reads mapped the zero page everywhere else: the DMA took that one fault only.
      expect(wc.odp!.faults.destination).toBe(1);
      expect(r['reads']).toBeGreaterThanOrEqual(readsAtFault);
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
    // Destroy the QP under the first transfer while its first fault is being resolved.
    let faultsAtDestroy = -1;
    server.ctx.faultLibrary.onResolve(() => {
      if (faultsAtDestroy >= 0) return;
      faultsAtDestroy = server.ctx.faultLibrary.stats().faults.destination;
      client.qp.destroy();
    });
    const wcs: WorkCompletion[] = [];
    for (let i = 0; i < 4; i++) wcs.push(await next(client.cq, 3000));
    expect(wcs.map((w) => Number(w.wrId)).sort()).toEqual([1, 2, 3, 4]);
    for (const w of wcs) expect(w.status).toBe(WcStatus.WR_FLUSH_ERR);
    expect(faultsAtDestroy).toBe(1);
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
    // Close the responder's context while its first fault is being resolved.
    let faultsAtClose = -1;
    server.ctx.faultLibrary.onResolve(() => {
      if (faultsAtClose >= 0) return;
      faultsAtClose = server.ctx.faultLibrary.stats().faults.destination;
      server.ctx.close();
    });
    post();
    const wc = await next(client.cq, 5000);
    expect(faultsAtClose).toBe(1);
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
