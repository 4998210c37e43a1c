// Pages over a real three-master Redis Cluster (redis-server --cluster-enabled, joined by
// redis-cli --cluster create, on loopback ports): they spread over the shards, a run of pages
// shares a shard (hash tags), they come back byte for byte, and a shard that dies fails its own
// pages only, never as zeros, while the others keep serving.
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PAGE_SIZE as P, RemotePager, touch, type PfrError } from '../../lib/index.js';
import { clusterUnavailable, startRedisCluster, type RedisCluster } from '../../cli/programs/support/redis-cluster.js';
import { until } from '../helpers.js';

const missing = clusterUnavailable();

describe.skipIf(missing !== undefined)(`remote paging over a Redis Cluster${missing ? ` (skipped: ${missing})` : ''}`, () => {
  let cluster: RedisCluster;
  beforeAll(async () => void (cluster = await startRedisCluster(3)), 60_000);
  afterAll(async () => cluster?.dispose());

  /** The page numbers whose keys master i holds. */
  const pagesOn = (i: number, p: RemotePager): number[] => {
    const out = spawnSync('redis-cli', ['-p', String(cluster.nodes[i]!.port), '--scan', '--pattern', `${p.keyPrefix}:*`], {
      encoding: 'utf8',
    }).stdout;
    return out
      .split('\n')
      .filter(Boolean)
      .map((k) => Number((BigInt(`0x${k.split(':').at(-1)!}`) - p.region.address) / BigInt(P)))
      .sort((a, b) => a - b);
  };

  it('pages spread over the shards by runs, come back whole; a dead shard fails its pages only', async () => {
    const N = 2048; // 32 runs of 64 pages: every shard gets some
    const p = await RemotePager.create({ size: N * P, prefetch: 16, store: { redis: { cluster: cluster.nodes, prefix: 'cl', timeoutMs: 1000 } } });
    const errors: PfrError[] = [];
    p.on('error', (e) => errors.push(e));
    try {
      const b = new Uint8Array(p.region.buffer);
      for (let i = 0; i < N; i++) b.fill((i * 7) & 0xff, i * P, (i + 1) * P);
      expect(await p.evict()).toBe(N);
      const on = [0, 1, 2].map((i) => pagesOn(i, p));
      expect(on.map((x) => x.length).reduce((s, n) => s + n)).toBe(N);
      for (const pages of on) {
        expect(pages.length).toBeGreaterThan(0);
        // Whole runs of 64 pages (256 KiB-aligned addresses) on one shard: a prefetch window is one MGET.
        const runs = new Set(pages.map((i) => (p.region.address + BigInt(i * P)) >> 18n));
        for (const run of runs) for (let i = 0; i < N; i++) if ((p.region.address + BigInt(i * P)) >> 18n === run) expect(pages).toContain(i);
      }
      const r = await touch(p.region, { probe: true });
      expect(r.checksum).toBe([...Array(N).keys()].reduce((s, i) => s + ((i * 7) & 0xff), 0));
      expect(p.stats()).toMatchObject({ majorFaults: expect.any(Number), corrupt: 0, lost: 0 });
      expect(p.stats().majorFaults + p.stats().prefetched).toBe(N);
      expect(errors).toEqual([]);

      await p.evict(); // clean: dropped, the shards keep them
      await cluster.kill(1);
      const failed = (await touch(p.region).catch((e: unknown) => e)) as { code?: string; offsets?: number[]; result?: { data?: Buffer } };
      expect(failed.code).toBe('ERR_PFR_ACCESS_FAILED');
      expect(failed.offsets!.map((o) => o / P)).toEqual(on[1]);
      const data = failed.result!.data!;
      const dead = new Set(on[1]);
      let wrong = 0;
      for (let i = 0; i < N; i++) if (!dead.has(i) && (data[i * P] !== ((i * 7) & 0xff) || data[i * P + P - 1] !== ((i * 7) & 0xff))) wrong++;
      expect(wrong).toBe(0);
      await until('the error events', () => errors.length > 0);
      // The dead shard's pages: the store down, never lost or corrupt.
      expect(errors[0]).toMatchObject({ code: 'ERR_PFR_STORE_UNAVAILABLE', message: expect.stringContaining(`127.0.0.1:${cluster.nodes[1]!.port}`) });
      expect(errors.filter((e) => e.code !== 'ERR_PFR_STORE_UNAVAILABLE')).toEqual([]);
      expect(p.stats().poisoned).toBe(on[1]!.length); // each failed access poisoned once, no fault taken twice
      expect(p.stats()).toMatchObject({ corrupt: 0, lost: 0 });
    } finally {
      await p.close();
    }
  }, 60_000);

  it('a prefix with a brace is refused: it would break the pages’ hash tags', async () => {
    await expect(RemotePager.create({ size: 4 * P, store: { redis: { cluster: cluster.nodes, prefix: 'a{b}' } } })).rejects.toMatchObject({
      code: 'ERR_INVALID_ARG_VALUE',
      message: expect.stringMatching(/must not contain \{ or \}/),
    });
  });
});
