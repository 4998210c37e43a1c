// Soak: random writes across a region four times its resident limit, through many eviction
// cycles, with Redis restarted (append-only persistence) in the middle; then every byte is
// checked against a shadow copy. Bounded: a few seconds.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Access,
  Cluster,
  connectQps,
  mapRegion,
  PAGE_SIZE as P,
  RemotePager,
  SendFlags,
  touch,
  WcStatus,
  WrOpcode,
  type PfrError,
} from '../../lib/index.js';
import { startRedis, type RedisServer } from '../../cli/programs/support/redis-server.js';
import { sleep, until } from '../helpers.js';

let redis: RedisServer;
beforeAll(async () => {
  redis = await startRedis({ appendonly: true });
});
afterAll(async () => redis?.dispose());

it('random writes over 4× the resident limit, Redis restarted mid-run: every byte verified', async () => {
  const N = 1024,
    LIMIT = 256,
    WRITES = 6000;
  const p = await RemotePager.create({
    size: N * P,
    residentLimit: LIMIT * P,
    evictBatch: 16,
    timeoutMs: 5000,
    store: { redis: { socket: redis.socket, prefix: 'soak' } },
  });
  const errors: PfrError[] = [];
  p.on('error', (e) => errors.push(e));
  try {
    const shadow = new Uint8Array(N * P);
    const mem = new Uint8Array(p.region.buffer);
    let seed = 12345;
    const rand = (n: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
    const write = (): void => {
      const page = rand(N),
        off = page * P + rand(P - 64),
        len = 1 + rand(64),
        v = 1 + rand(255);
      mem.fill(v, off, off + len);
      shadow.fill(v, off, off + len);
    };
    for (let i = 0; i < WRITES / 2; i++) write();
    await p.flush(); // every page the server must keep is written and acknowledged
    await redis.stop();
    await redis.start(); // the append-only file brings the pages back
    for (let i = 0; i < WRITES / 2; i++) write();
    let bad = -1;
    for (let i = 0; i < N * P && bad < 0; i++) if (mem[i] !== shadow[i]) bad = i;
    expect(bad).toBe(-1);
    const s = p.stats();
    expect(s.evicted).toBeGreaterThan(3 * N); // many eviction cycles
    expect(s.majorFaults).toBeGreaterThan(N);
    expect(s.corrupt).toBe(0);
    expect(errors).toEqual([]);
  } finally {
    await p.close();
  }
}, 60_000);

// Loss soak: RDMA writes and native-thread writes over 4× the resident limit, the server
// restarted between rounds, with and without persistence. Whatever a restart without
// persistence loses must be reported: every page then reads back its own bytes exactly, or
// its access fails (ERR_PFR_ACCESS_FAILED, an ERR_PFR_PAGE_LOST event); never zeros, never
// other bytes. With persistence nothing is lost. Bounded: about 10 s a server.
describe.each([
  ['with append-only persistence', true],
  ['without persistence', false],
] as const)('loss soak, Redis restarted %s', (_, appendonly) => {
  it('RDMA and native writes, evictions, restarts: 0 bytes wrong, every lost page an error', async () => {
    const N = 256,
      LIMIT = 64,
      ROUNDS = 3,
      OPS = 120;
    const server = await startRedis({ appendonly });
    const cluster = Cluster.create({ nodes: 2 });
    const local = mapRegion(P);
    const p = await RemotePager.create({
      size: N * P,
      residentLimit: LIMIT * P,
      evictBatch: 16,
      timeoutMs: 5000,
      store: { redis: { socket: server.socket, prefix: 'loss-soak' } },
    });
    const errors: PfrError[] = [];
    p.on('error', (e) => errors.push(e));
    try {
      const [a, b] = [cluster.openDevice(0), cluster.openDevice(1)];
      const [pdA, pdB] = [a.allocPd(), b.allocPd()];
      const cq = a.createCq(16),
        cqB = b.createCq(16);
      const connected = () => {
        const qp = [a.createQp(pdA, { sendCq: cq, recvCq: cq }), b.createQp(pdB, { sendCq: cqB, recvCq: cqB })] as const;
        connectQps(...qp);
        return qp;
      };
      let qps = connected();
      const ODP = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.ON_DEMAND;
      const mrA = a.regMr(pdA, local, 0, P, ODP);
      const mrB = b.regMr(pdB, p.region, 0, p.region.size, ODP, { policy: 'touch' });
      const src = new Uint8Array(local.buffer);

      const shadow = new Uint8Array(N); // every byte of page i is shadow[i] (0: never written)
      const failed = new Set<number>(); // pages whose access failed: they stay failed
      const mayBeLost = new Set<number>(); // pages the store may have lost in a restart
      let seed = appendonly ? 99 : 7;
      const rand = (n: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
      let rdmaWrites = 0,
        nativeWrites = 0;

      const rdmaWrite = async (page: number, v: number): Promise<boolean> => {
        src.fill(v);
        qps[0].postSend({
          wrId: page,
          opcode: WrOpcode.RDMA_WRITE,
          sendFlags: SendFlags.SIGNALED,
          sgList: [{ addr: mrA.addr, length: P, lkey: mrA.lkey }],
          rdma: { remoteAddr: mrB.addr + BigInt(page * P), rkey: mrB.rkey },
        });
        const wc = await Promise.race([cq.next(), sleep(15_000).then(() => Promise.reject(new Error('no completion in 15 s')))]);
        rdmaWrites++;
        if (wc.status === WcStatus.SUCCESS) return true;
        // An error completion puts the QP in the error state, as RC does: a new pair goes on.
        for (const qp of qps) qp.destroy();
        qps = connected();
        return false;
      };
      /** Native-thread write of pages [first, first+n); the pages whose access failed. */
      const nativeWrite = async (first: number, n: number, v: number): Promise<number[]> => {
        nativeWrites++;
        const r = await touch(p.region, { access: 'write', fill: v, offset: first * P, length: n * P }).catch((e: { offsets?: number[] }) => e);
        return 'offsets' in r ? r.offsets!.map((o) => o / P) : [];
      };
      /** Read every page back with a native thread and check it against the shadow. */
      const verify = async (): Promise<number> => {
        const r = await touch(p.region).catch((e: { offsets?: number[]; result?: { data?: Buffer } }) => e);
        const data = 'data' in r ? r.data! : (r as { result: { data: Buffer } }).result.data;
        const bad = new Set('offsets' in r ? r.offsets!.map((o) => o / P) : []);
        let wrong = 0;
        for (let i = 0; i < N; i++) {
          if (bad.has(i)) {
            expect(mayBeLost.has(i) || failed.has(i), `page ${i} failed but the store held it safely`).toBe(true);
            failed.add(i);
            continue;
          }
          const page = data.subarray(i * P, (i + 1) * P);
          for (let j = 0; j < P; j++) if (page[j] !== shadow[i]) wrong++;
        }
        return wrong;
      };

      let wrong = 0;
      for (let round = 0; round < ROUNDS; round++) {
        for (let op = 0; op < OPS; op++) {
          const v = 1 + rand(255);
          if (rand(2) === 0) {
            const page = rand(N);
            const ok = await rdmaWrite(page, v);
            if (ok) {
              expect(failed.has(page), `an RDMA write into failed page ${page} succeeded`).toBe(false);
              shadow[page] = v;
            } else {
              expect(mayBeLost.has(page) || failed.has(page), `an RDMA write into page ${page} failed though the store held it`).toBe(true);
              failed.add(page);
            }
          } else {
            const first = rand(N - 4),
              n = 1 + rand(4);
            const bad = new Set(await nativeWrite(first, n, v));
            for (let i = first; i < first + n; i++) {
              if (bad.has(i)) {
                expect(mayBeLost.has(i) || failed.has(i), `a write into page ${i} failed though the store held it`).toBe(true);
                failed.add(i);
              } else {
                expect(failed.has(i), `a write into failed page ${i} succeeded`).toBe(false);
                shadow[i] = v;
              }
            }
          }
        }
        // Without persistence, the restart loses every page whose copy was in the store: any
        // page written so far (a clean resident one's copy too: it is dropped without a write).
        if (!appendonly) for (let i = 0; i < N; i++) if (shadow[i]) mayBeLost.add(i);
        await sleep(200); // the eviction batch under way, if any, is acknowledged first
        await server.stop();
        await server.start();
        await sleep(600); // the client reconnects (backoff at most 500 ms)
        wrong += await verify();
      }
      expect(wrong).toBe(0);
      const s = p.stats();
      expect(rdmaWrites).toBeGreaterThan(100);
      expect(nativeWrites).toBeGreaterThan(100);
      expect(s.evicted).toBeGreaterThan(N); // many eviction cycles
      expect(s.corrupt).toBe(0);
      await until('an error event per failed page', () => p.stats().poisoned >= failed.size, 2000);
      if (appendonly) {
        expect(failed.size).toBe(0);
        expect(errors).toEqual([]);
      } else {
        expect(failed.size).toBeGreaterThan(N / 4); // the restarts did lose pages, and each was reported
        expect(s.lost).toBeGreaterThanOrEqual(failed.size);
        expect(new Set(errors.map((e) => e.code))).toEqual(new Set(['ERR_PFR_PAGE_LOST']));
      }
    } finally {
      await p.close();
      cluster.close();
      local.close();
      await server.dispose();
    }
  }, 60_000);
});
