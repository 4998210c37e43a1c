// bench:remote: remote paging's major fault, fault -> store -> UFFDIO_COPY, measured side by
// side in one run, interleaved round by round: the TypeScript DM-Handler against Redis, a C
// program doing the same with hiredis against the same server and the same stored pages, the
// DM-Handler with the embedded store, and a sequential scan with and without prefetch.
// Every access is made by a native thread (the toucher; the C program's main thread) and
// timed around that one access. JSON: bench/results/remote.json (not tracked), or --json.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { latencyStats, median, PAGE_SIZE, RemotePager, touch, type RemotePagerOptions } from '../lib/index.js';
import { Table, print, target } from '../examples/support/format.js';
import { progress } from '../examples/support/progress.js';
import { startRedis } from '../examples/support/redis-server.js';
import { startMemoryServer } from '../examples/support/memory-server.js';
import { compileC, defaultResults, machineInfo, packageRoot } from './faults.js';

export interface BenchRemoteOptions {
  pages: number;
  rounds: number;
  prefetch: number;
  /** Where the JSON goes (default bench/results/remote.json or a temporary folder); false: not written. */
  json?: string | false;
}

interface Round {
  medianUs: number;
  p99Us: number;
  meanUs: number;
}

const CASES = {
  c: 'C + hiredis: fault -> Redis GET -> UFFDIO_COPY',
  redis: 'TypeScript DM-Handler, Redis store',
  embedded: 'TypeScript DM-Handler, embedded store',
  server: 'TypeScript DM-Handler, own memory server (pagefault-rdma memory-server, Unix socket)',
  prefetch: 'TypeScript DM-Handler, Redis store, prefetch window',
} as const;
type Case = keyof typeof CASES;

/** One pass over every page of the pager's region by a native thread, then every page evicted again. */
async function tsRound(p: RemotePager): Promise<Round> {
  const r = await touch(p.region, { probe: true, timings: true });
  const us = Array.from(r.pageNs!, (ns) => ns / 1000);
  const s = latencyStats(us);
  await p.evict(); // the pages are clean: dropped, the store keeps them
  return { medianUs: s.typical, p99Us: s.p99, meanUs: r.ns / 1000 / r.pages };
}

export async function benchRemote(opts: BenchRemoteOptions): Promise<Record<string, unknown>> {
  const root = packageRoot();
  const build = mkdtempSync(join(os.tmpdir(), 'pagefault-rdma-bench-'));
  const redis = await startRedis();
  const server = await startMemoryServer();
  const pagers: RemotePager[] = [];
  try {
    const binary = compileC(root, build, 'remote-handler', ['hiredis'], "Debian's libhiredis-dev is needed");
    const size = opts.pages * PAGE_SIZE;
    const make = async (o: Partial<RemotePagerOptions>, seed: number): Promise<RemotePager> => {
      const p = await RemotePager.create({ size, ...o });
      pagers.push(p);
      const b = new Uint8Array(p.region.buffer);
      for (let i = 0; i < opts.pages; i++) b.fill((seed + i) & 0xff, i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
      await p.evict(); // every page in the store
      return p;
    };
    const byCase: Record<Case, RemotePager | undefined> = {
      c: undefined,
      redis: await make({ store: { redis: { socket: redis.socket, prefix: 'bench' } } }, 1),
      embedded: await make({}, 2),
      server: await make({ store: { server: { socket: server.socket, prefix: 'bench' } } }, 4),
      prefetch: await make({ prefetch: opts.prefetch, store: { redis: { socket: redis.socket, prefix: 'bench-pf' } } }, 3),
    };
    const base = byCase.redis!.region.address.toString(16);
    const cRound = (): Round => {
      const r = spawnSync(binary, [redis.socket, byCase.redis!.keyPrefix, base, String(opts.pages), '1'], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`bench-remote: the C program failed: ${r.stderr}`);
      return (JSON.parse(r.stdout) as { rounds: Round[] }).rounds[0]!;
    };

    print('Remote paging, the major fault: real measurements on this machine, now.');
    print(
      `${opts.pages} pages of ${PAGE_SIZE} B per round, ${opts.rounds} rounds after a warm-up, cases interleaved; redis-server on a ` +
        'Unix socket. A sample = one access of a native thread to an evicted page (µs). mean = pass time / pages. The C program ' +
        "copies the stored bytes without checking them; the DM-Handler checks each page's CRC-32C (key, version and bytes) first.",
    );
    const rounds: Record<Case, Round[]> = { c: [], redis: [], embedded: [], server: [], prefetch: [] };
    const bar = progress((opts.rounds + 1) * Object.keys(CASES).length, 'bench-remote');
    try {
      for (let round = 0; round <= opts.rounds; round++) {
        for (const c of Object.keys(CASES) as Case[]) {
          const r = c === 'c' ? cRound() : await tsRound(byCase[c]!);
          if (round > 0) rounds[c].push(r); // round 0 warms up
          bar.tick(c);
        }
      }
    } finally {
      bar.stop();
    }

    const sum = (c: Case) => ({
      medianUs: median(rounds[c].map((r) => r.medianUs)),
      p99Us: median(rounds[c].map((r) => r.p99Us)),
      meanUs: median(rounds[c].map((r) => r.meanUs)),
    });
    const results = Object.fromEntries((Object.keys(CASES) as Case[]).map((c) => [c, { ...sum(c), rounds: rounds[c] }])) as Record<
      Case,
      Round & { rounds: Round[] }
    >;
    const table = new Table([
      { header: 'case', width: 9, left: true },
      { header: 'median µs', width: 10 },
      { header: 'p99 µs', width: 9 },
      { header: 'mean µs', width: 9 },
      { header: 'vs C (median)', width: 13 },
    ]);
    table.header();
    for (const c of Object.keys(CASES) as Case[]) {
      const r = results[c];
      table.row([c, r.medianUs.toFixed(2), r.p99Us.toFixed(2), r.meanUs.toFixed(2), `${(r.medianUs / results.c.medianUs).toFixed(2)}×`]);
    }
    for (const c of Object.keys(CASES) as Case[]) print(`  ${c.padEnd(9)} ${CASES[c]}${c === 'prefetch' ? ` (${opts.prefetch} pages)` : ''}`);
    const ratio = results.redis.medianUs / results.c.medianUs;
    const speedup = results.redis.meanUs / results.prefetch.meanUs;
    const serverRatio = results.server.medianUs / results.c.medianUs;
    print(
      `\nTypeScript major fault / C: ${ratio.toFixed(2)}× ${target(ratio, '<=', 1.3, '×')}; ` +
        `sequential scan, prefetch ${opts.prefetch}: ${speedup.toFixed(1)}× faster ${target(speedup, '>=', 4, '×')}.`,
    );
    print(`Own memory server / C: ${serverRatio.toFixed(2)}× ${target(serverRatio, '<=', 1, '×')}.`);

    const doc = {
      benchmark: 'remote paging major fault: fault -> store -> UFFDIO_COPY',
      machine: machineInfo(root),
      options: { pages: opts.pages, rounds: opts.rounds, warmupRounds: 1, prefetch: opts.prefetch, pageSize: PAGE_SIZE },
      cases: CASES,
      results,
      ratios: { tsOverC: ratio, prefetchSpeedup: speedup, serverOverC: serverRatio },
    };
    if (opts.json !== false) {
      const out = resolve(opts.json ?? defaultResults(root, 'remote.json'));
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, JSON.stringify(doc, null, 2) + '\n');
      print(`\nJSON: ${relative(process.cwd(), out) || out}`);
    }
    return doc;
  } finally {
    for (const p of pagers) await p.close();
    await redis.dispose();
    await server.dispose();
    rmSync(build, { recursive: true, force: true });
  }
}
