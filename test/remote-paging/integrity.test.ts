// A page the pager stored comes back with its bytes or fails loudly, never as zeros: a real
// redis-server restarted without persistence (the pages are gone), a fake RESP server in a
// process of its own that answers wrongly on purpose, two pagers sharing a prefix and an
// address, keys left behind at close, and stores that error or die. Accesses are made by the
// native toucher (a failed access is ERR_PFR_ACCESS_FAILED with the pages' offsets; the main
// thread would die of SIGBUS, see main-thread.test.ts).
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PAGE_SIZE as P, RemotePager, touch, type RemotePagerOptions } from '../../lib/index.js';
import { startRedis, type RedisServer } from '../../cli/programs/support/redis-server.js';
import { ROOT } from '../child.js';
import { sleep, until } from '../helpers.js';
import { fillPages, usePagers } from '../fixtures/pager.js';

const pagers = usePagers();
function pager(socket: string, o: Omit<RemotePagerOptions, 'store'> & { prefix?: string; persist?: boolean }) {
  const { prefix, persist, ...rest } = o;
  return pagers.watched({ ...rest, store: { redis: { socket, prefix: prefix ?? 'integrity', persist } } });
}

const fill = fillPages;

interface Failed {
  code?: string;
  offsets?: number[];
  result?: { data?: Buffer };
}
/** Read the region with a native thread; the failure, if its access failed. */
const readBack = (p: RemotePager, offset = 0, length = p.region.size): Promise<{ data?: Buffer } & Failed> =>
  touch(p.region, { offset, length }).catch((e: unknown) => e as Failed);
const pagesAt = (offsets: number[] | undefined): number[] => (offsets ?? []).map((o) => o / P);
const range = (a: number, b: number): number[] => Array.from({ length: b - a }, (_, i) => a + i);

describe('a store that lost pages (redis-server without persistence, restarted)', () => {
  let redis: RedisServer;
  beforeAll(async () => void (redis = await startRedis()));
  afterAll(async () => redis?.dispose());

  it('every evicted page fails its access and is reported lost; none reads as zeros; a page never stored still reads zeros', async () => {
    const { p, errors } = await pager(redis.socket, { size: 32 * P });
    fill(p, 16, 0x40); // pages 16–31 are never written: never stored
    expect(await p.evict()).toBe(16);
    await redis.stop();
    await redis.start(); // empty: no persistence
    await sleep(600); // the client reconnects (its backoff is at most 500 ms)
    const r = await readBack(p);
    expect(r.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect(pagesAt(r.offsets)).toEqual(range(0, 16));
    // The pages that did come back are the never-stored ones, as zeros.
    expect(r.result!.data!.subarray(16 * P).every((x) => x === 0)).toBe(true);
    await until('an error event per lost page', () => errors.length >= 16);
    expect(new Set(errors.map((e) => e.code))).toEqual(new Set(['ERR_PFR_PAGE_LOST']));
    expect(errors[0]!.message).toMatch(/no longer holds it .*acknowledged write \d+/);
    await until('every page counted lost and poisoned', () => p.stats().lost === 16 && p.stats().poisoned === 16, 2000);
    expect(p.stats().majorFaults).toBe(0);
  });
});

/** The fake server of test/fixtures/fake-redis.mjs, in its own process. */
class FakeRedis {
  readonly socket: string;
  #dir: string;
  #proc: ChildProcessWithoutNullStreams;
  #lines: string[] = [];
  private constructor(dir: string, proc: ChildProcessWithoutNullStreams) {
    this.#dir = dir;
    this.socket = join(dir, 'fake.sock');
    this.#proc = proc;
    createInterface({ input: proc.stdout }).on('line', (l) => this.#lines.push(l));
  }
  static async start(): Promise<FakeRedis> {
    const dir = mkdtempSync(join(tmpdir(), 'pfr-fake-redis-'));
    const proc = spawn(process.execPath, [join(ROOT, 'test/fixtures/fake-redis.mjs'), join(dir, 'fake.sock')]);
    const f = new FakeRedis(dir, proc);
    await f.#line('listening');
    return f;
  }
  async #line(want: string | RegExp): Promise<string> {
    let got: string | undefined;
    await until(
      `fake-redis to say ${String(want)}`,
      () => (got = this.#lines.find((l) => (typeof want === 'string' ? l === want : want.test(l)))) !== undefined,
    );
    this.#lines.splice(this.#lines.indexOf(got!), 1);
    return got!;
  }
  async mode(m: string): Promise<void> {
    this.#proc.stdin.write(`${m}\n`);
    await this.#line(`mode ${m}`);
  }
  /** MGETs answered so far. */
  async mgets(): Promise<number> {
    this.#proc.stdin.write('count\n');
    return Number((await this.#line(/^mgets /)).split(' ')[1]);
  }
  dispose(): void {
    this.#proc.kill('SIGKILL');
    rmSync(this.#dir, { recursive: true, force: true });
  }
}

describe('a store that answers wrongly (a fake RESP server in its own process)', () => {
  let fake: FakeRedis;
  beforeAll(async () => void (fake = await FakeRedis.start()));
  afterAll(() => fake?.dispose());
  afterEach(async () => fake.mode('normal'));

  /** 64 pages stored twice (two versions each), then read back while the server answers `mode`. */
  async function storedTwiceThenRead(mode: string) {
    const N = 64;
    const { p, errors } = await pager(fake.socket, { size: N * P });
    fill(p, N, 1);
    await p.evict();
    expect((await readBack(p)).code).toBeUndefined(); // the first version comes back whole
    fill(p, N, 101);
    await p.evict();
    await fake.mode(mode);
    const major = p.stats().majorFaults;
    const r = await readBack(p);
    await until('the error events', () => errors.length >= 1);
    return { p, errors, r, N, placed: p.stats().majorFaults - major };
  }

  it.each([
    ['short', 'ERR_PFR_PAGE_CORRUPT', /returned 5 bytes, not a 4096-byte page/],
    ['garbage', 'ERR_PFR_PAGE_CORRUPT', /returned|checksum mismatch/],
    ['other-key', 'ERR_PFR_PAGE_CORRUPT', /answered with the value of page 0x[0-9a-f]+/],
    ['stale', 'ERR_PFR_PAGE_CORRUPT', /answered with write \d+ of the page, not write \d+ \(a stale copy\)/],
    ['lost', 'ERR_PFR_PAGE_LOST', /no longer holds it/],
    ['few', 'ERR_PFR_PAGE_CORRUPT', /answered 0 values for 1 pages/],
    ['not-array', 'ERR_PFR_PAGE_CORRUPT', /answered number for 1 pages/],
  ])('MGET answering %s: every page fails its access with %s, no byte of memory written', async (mode, code, message) => {
    const { p, errors, r, N, placed } = await storedTwiceThenRead(mode);
    expect(r.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect(pagesAt(r.offsets)).toEqual(range(0, N));
    expect(errors[0]).toMatchObject({ code, message: expect.stringMatching(message) });
    expect(new Set(errors.map((e) => e.code))).toEqual(new Set([code]));
    expect(placed).toBe(0);
    // (The counter is added to just after the poison wakes the reader.)
    await until('every page counted poisoned', () => p.stats().poisoned === N, 2000);
  });

  it('MGET error replies: touch() ends with every page failed, one MGET per page at most', async () => {
    // More pages than one eviction batch: under 'wp-async' the second batch's dirty scan leaves
    // write-protect markers on pages the first batch evicted, which UFFDIO_POISON skips.
    const N = 64;
    const { p, errors } = await pager(fake.socket, { size: N * P, evictBatch: 16 });
    fill(p, N, 7);
    await p.evict();
    await fake.mode('error');
    const before = await fake.mgets();
    const r = await Promise.race([readBack(p), sleep(20_000).then(() => ({ code: 'still running after 20 s' }) as Failed)]);
    expect(r.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect(pagesAt(r.offsets)).toEqual(range(0, N));
    expect((await fake.mgets()) - before).toBeLessThanOrEqual(N);
    await until('the error events', () => errors.length >= 1);
    expect(errors[0]!.message).toMatch(/MGET: the Redis server at unix:.* refused: ERR fake-redis/);
  });
});

describe('pager instances and their keys (real redis-server)', () => {
  let redis: RedisServer;
  beforeAll(async () => void (redis = await startRedis()));
  afterAll(async () => redis?.dispose());

  it('a second pager with the same prefix at the same address reads zeros, not the first one’s bytes', async () => {
    const first = await pager(redis.socket, { size: 16 * P, prefix: 'same', persist: true });
    fill(first.p, 16, 0xab);
    await first.p.evict();
    const address = first.p.region.address;
    await first.p.close(); // its keys stay (persist)
    // mmap gives the hole just freed back: the same address, so the same page keys but for the instance id.
    const second = await pager(redis.socket, { size: 16 * P, prefix: 'same' });
    expect(second.p.region.address).toBe(address);
    const r = await readBack(second.p);
    expect(r.code).toBeUndefined();
    expect(r.data!.every((x) => x === 0)).toBe(true);
    expect(second.p.stats()).toMatchObject({ majorFaults: 0, errors: 0 });
    expect(second.p.keyPrefix).not.toBe(first.p.keyPrefix);
  });

  it('close() deletes the pager’s keys and says how many (counted in Redis); persist: true keeps them', async () => {
    const c = await redis.client();
    const count = async (prefix: string) => (await c.keys(`${prefix}:*`)).length;
    const gone = await pager(redis.socket, { size: 100 * P, prefix: 'del' });
    fill(gone.p, 100, 3);
    await gone.p.evict();
    expect(await count(gone.p.keyPrefix)).toBe(100);
    expect(await gone.p.close()).toEqual({ keysDeleted: 100, keysLeft: 0 });
    expect(await count(gone.p.keyPrefix)).toBe(0);
    expect(gone.p.stats().keysDeleted).toBe(100);
    expect(await gone.p.close()).toEqual({ keysDeleted: 100, keysLeft: 0 }); // idempotent

    const kept = await pager(redis.socket, { size: 40 * P, prefix: 'del', persist: true });
    fill(kept.p, 40, 5);
    await kept.p.evict();
    expect(await kept.p.close()).toEqual({ keysDeleted: 0, keysLeft: 40 });
    expect(await count(kept.p.keyPrefix)).toBe(40);
    expect(await count('del')).toBe(40); // the other pager's are all gone
  });
});

describe('a dead store (circuit breaker)', () => {
  it('64 pages fail at once after the first timeout, not one timeout each; pages read after the server is back come back whole', async () => {
    const redis = await startRedis({ appendonly: true }); // the pages outlive the restart
    try {
      const N = 64,
        TIMEOUT = 1000;
      const { p, errors } = await pager(redis.socket, { size: 2 * N * P, timeoutMs: TIMEOUT });
      fill(p, 2 * N, 9);
      await p.evict();
      await redis.stop();
      const t0 = Date.now();
      const r = await readBack(p, 0, N * P);
      const ms = Date.now() - t0;
      expect(r.code).toBe('ERR_PFR_ACCESS_FAILED');
      expect(pagesAt(r.offsets)).toEqual(range(0, N));
      // One timeout, then the pages fail without waiting (plus a probe now and then): far from 64 timeouts.
      expect(ms).toBeLessThan((N * TIMEOUT) / 4);
      await until('the error events', () => errors.length >= N);
      expect(errors.at(-1)!.message).toMatch(
        /has been down for .*\(MGET: reconnect failed: (No such file or directory|Connection refused)\); requests fail at once until it answers a PING again/,
      );

      await redis.start();
      await sleep(2 * TIMEOUT); // past the probe interval, and the client has reconnected
      const back = await readBack(p, N * P, N * P);
      expect(back.code).toBeUndefined();
      for (let i = 0; i < N; i++) expect(back.data![i * P + 5]).toBe((9 + N + i) & 0xff);
      expect(p.stats()).toMatchObject({ lost: 0, corrupt: 0, majorFaults: N });
    } finally {
      await redis.dispose();
    }
  });
});
