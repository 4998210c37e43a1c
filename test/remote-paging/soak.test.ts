// Soak: random writes across a region four times its resident limit, through many eviction
// cycles, with Redis restarted (append-only persistence) in the middle; then every byte is
// checked against a shadow copy. Bounded: a few seconds.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { PAGE_SIZE as P, RemotePager, type PfrError } from '../../lib/index.js';
import { startRedis, type RedisServer } from '../../examples/support/redis-server.js';

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
