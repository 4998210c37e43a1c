// Redis as the memory server: a real redis-server (Debian's package) on a Unix socket, started
// and stopped here. Pages are stored under their address with a checksum, per-application
// prefixes share one server, and every way the server can fail ends in a reported error and
// an access that fails visibly, never a hang or silent zeros.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PAGE_SIZE as P, RemotePager, touch, type PfrError, type RemotePagerOptions } from '../../lib/index.js';
import { until } from '../helpers.js';
import { requireDist, ROOT } from '../child.js';
import { startRedis, type RedisServer } from '../../cli/programs/support/redis-server.js';
import { fillPages, usePagers } from '../fixtures/pager.js';

let redis: RedisServer;
beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => redis?.dispose());

const pagers = usePagers();
function pager(o: Omit<RemotePagerOptions, 'store'> & { prefix?: string; socket?: string }): Promise<{ p: RemotePager; errors: PfrError[] }> {
  const { prefix, socket, ...rest } = o;
  return pagers.watched({ ...rest, store: { redis: { socket: socket ?? redis.socket, prefix: prefix ?? 'test' } } });
}

const fill = fillPages;

describe('Redis page store', () => {
  it('pages evicted to Redis come back byte for byte, stored under their address with a checksum', async () => {
    const N = 512;
    const { p, errors } = await pager({ size: N * P, prefix: 'app-a' });
    expect(p.keyPrefix).toMatch(/^app-a:[0-9a-f]{12}$/); // the application's prefix, then the instance's id
    fill(p, N, 3);
    expect(await p.evict()).toBe(N);
    const c = await redis.client();
    const keys = (await c.keys('app-a:*')).map(String);
    expect(keys).toHaveLength(N);
    expect(keys).toContain(`${p.keyPrefix}:${(p.region.address + BigInt(5 * P)).toString(16)}`);
    const raw = (await c.get(`${p.keyPrefix}:${p.region.address.toString(16)}`)) as unknown as Buffer;
    expect(raw.length).toBe(P + 24); // the page, then address, version, length and checksum
    const r = await touch(p.region);
    for (let i = 0; i < N; i++) expect(r.data![i * P + 17]).toBe((3 + i) & 0xff);
    expect(p.stats()).toMatchObject({ majorFaults: N, evicted: N, writtenBack: N, corrupt: 0 });
    expect(errors).toEqual([]);
  });

  it('two applications share one server through their prefixes without seeing each other', async () => {
    const a = await pager({ size: 16 * P, prefix: 'shared-a' });
    const b = await pager({ size: 16 * P, prefix: 'shared-b' });
    fill(a.p, 16, 1);
    fill(b.p, 16, 101);
    await Promise.all([a.p.evict(), b.p.evict()]);
    const [ra, rb] = await Promise.all([touch(a.p.region, { probe: true }), touch(b.p.region, { probe: true })]);
    expect(ra.checksum).toBe([...Array(16).keys()].reduce((s, i) => s + 1 + i, 0));
    expect(rb.checksum).toBe([...Array(16).keys()].reduce((s, i) => s + 101 + i, 0));
  });

  it('a corrupted or short reply is refused: the access fails, the memory is not written, an error says why', async () => {
    const { p, errors } = await pager({ size: 4 * P, prefix: 'corrupt' });
    fill(p, 4, 9);
    await p.evict();
    const c = await redis.client();
    const key = (i: number) => `${p.keyPrefix}:${(p.region.address + BigInt(i * P)).toString(16)}`;
    const page1 = (await c.get(key(1))) as unknown as Buffer;
    page1[100] ^= 0xff; // one flipped byte
    await c.set(key(1), page1);
    await c.set(key(2), Buffer.from('short'));
    const err = (await touch(p.region).catch((e: unknown) => e)) as { code?: string; offsets?: number[]; result?: { data?: Buffer } };
    expect(err.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect(err.offsets).toEqual([P, 2 * P]);
    expect(err.result!.data![0]).toBe(9);
    expect(err.result!.data![3 * P]).toBe(12);
    await until('the error events', () => errors.length >= 2);
    expect(errors.map((e) => e.code)).toEqual(['ERR_PFR_PAGE_CORRUPT', 'ERR_PFR_PAGE_CORRUPT']);
    expect(p.stats()).toMatchObject({ corrupt: 2, poisoned: 2 });
  });

  it('a server that dies mid-run: faults end within the timeout with an error and a failed access', async () => {
    const dying = await startRedis();
    try {
      const { p, errors } = await pager({ size: 8 * P, socket: dying.socket, timeoutMs: 300 });
      fill(p, 8, 1);
      await p.evict();
      await dying.stop();
      const t0 = Date.now();
      const err = (await touch(p.region, { probe: true }).catch((e: unknown) => e)) as { code?: string; offsets?: number[] };
      expect(Date.now() - t0).toBeLessThan(5000);
      expect(err.code).toBe('ERR_PFR_ACCESS_FAILED');
      expect(err.offsets!.length).toBeGreaterThan(0);
      await until('the error event', () => errors.length > 0);
      expect(errors[0]!.code).toBe('ERR_PFR_STORE_UNAVAILABLE');
    } finally {
      await dying.dispose();
    }
  });

  it('an unreachable server is a clear error at create(), naming the missing socket and how to get it', async () => {
    await expect(RemotePager.create({ size: 4 * P, store: { redis: { socket: '/nonexistent/redis.sock', timeoutMs: 300 } } })).rejects.toMatchObject({
      code: 'ERR_PFR_STORE_UNAVAILABLE',
      message: expect.stringMatching(
        /no Redis socket at \/nonexistent\/redis\.sock: start redis-server with --unixsocket \/nonexistent\/redis\.sock/,
      ),
    });
  });

  it('a server full (maxmemory, noeviction) is ERR_PFR_STORE_FULL, and the pages it refused stay resident', async () => {
    const small = await startRedis({ maxmemory: '2mb' });
    try {
      const { p, errors } = await pager({ size: 2048 * P, socket: small.socket });
      fill(p, 2048, 5);
      await expect(p.evict()).rejects.toMatchObject({ code: 'ERR_PFR_STORE_FULL' });
      await until('the error event', () => errors.length > 0);
      expect(errors.some((e) => e.code === 'ERR_PFR_STORE_FULL' && /maxmemory/.test(e.message))).toBe(true);
      const b = new Uint8Array(p.region.buffer);
      for (let i = 0; i < 2048; i++) expect(b[i * P + 1]).toBe((5 + i) & 0xff); // nothing lost
    } finally {
      await small.dispose();
    }
  });
});

it("README's RemotePager sample prints what its comments say, against a redis-server on a Unix socket", async () => {
  requireDist();
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const block = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!).find((b) => b.includes('RemotePager.create'))!;
  expect(block).toContain("{ host: '127.0.0.1', port: 6379,");
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-readme-'));
  try {
    const file = join(dir, 'sample.mjs');
    writeFileSync(
      file,
      block
        .replace("{ host: '127.0.0.1', port: 6379,", `{ socket: ${JSON.stringify(redis.socket)},`)
        .replaceAll("from 'pagefault-rdma'", `from '${pathToFileURL(join(ROOT, 'dist/lib/index.js')).href}'`),
    );
    const r = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 60_000 });
    expect(r.stderr).toBe('');
    const [first, second] = r.stdout.trim().split('\n');
    expect(first).toBe(block.match(/pager\.stats\(\)\.lost\);\s+\/\/ (.+)/)![1]);
    // All but what stays resident went to Redis, each under its own key: the eviction worker
    // starts at highWatermark (0.9) × 16 MiB and stops at lowWatermark (0.7) × 16 MiB, so
    // between the two, as the timing decides (plus the page read back).
    const deleted = Number(second!.match(/keysDeleted: (\d+), keysLeft: 0 \}/)![1]);
    const least = (64 << 8) - Math.floor((16 << 8) * 0.9),
      most = (64 << 8) - Math.floor((16 << 8) * 0.7) + 16;
    expect(deleted).toBeGreaterThanOrEqual(least);
    expect(deleted).toBeLessThanOrEqual(most);
    // What the comment says.
    const said = block.match(/\{ keysDeleted: (\d+) to (\d+), keysLeft: 0 \}: ([\d.]+) to ([\d.]+) MiB went to Redis/)!;
    expect([Number(said[1]), Number(said[2])]).toEqual([least, most]);
    expect([Number(said[3]), Number(said[4])]).toEqual([least, most].map((n) => Math.round((n * P * 10) / 2 ** 20) / 10));
    const c = await redis.client();
    expect(await c.keys('myapp:*')).toEqual([]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 90_000);
