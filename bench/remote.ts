// bench:remote: remote paging's major fault, fault -> store -> UFFDIO_COPY, measured side by
// side in one run, interleaved round by round: the TypeScript DM-Handler against Redis, a C
// program doing the same with hiredis against the same server and the same stored pages, the
// DM-Handler with the embedded store, the project's own memory server, and over a three-master
// Redis Cluster; adaptive prefetch
// on a sequential and on a random scan, each against the same scan without prefetch; and the
// throughput of 4 faulting threads against 1, on one server and on the cluster.
// Every access is made by a native thread (the toucher; the C program's main thread) and
// timed around that one access. JSON: bench-remote.json in the working directory, or --json.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { latencyStats, median, PAGE_SIZE, RemotePager, touch, type RemotePagerOptions } from '../lib/index.js';
import { Table, print, target } from '../cli/programs/support/format.js';
import { progress } from '../cli/programs/support/progress.js';
import { startRedis } from '../cli/programs/support/redis-server.js';
import { startMemoryServer } from '../cli/programs/support/memory-server.js';
import { clusterUnavailable, startRedisCluster, type RedisCluster } from '../cli/programs/support/redis-cluster.js';
import { compileC, defaultResults, machineInfo, packageRoot } from './faults.js';
import { ownFolder, runOwned } from './interrupt.js';

export interface BenchRemoteOptions {
  pages: number;
  rounds: number;
  prefetch: number;
  /** Where the JSON goes (default bench-remote.json in the working directory, or a temporary folder); false: not written. */
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
  'tcp-1': 'TypeScript DM-Handler, one Redis server on loopback TCP (a cluster of 1 master)',
  cluster: 'TypeScript DM-Handler, Redis Cluster of 3 masters on loopback TCP',
  'seq-pf': 'sequential scan, Redis store, adaptive prefetch',
  rand: 'random scan, Redis store, no prefetch',
  'rand-pf': 'random scan, Redis store, adaptive prefetch',
} as const;
type Case = keyof typeof CASES;

/** One pass over the pager's pages by native threads, in `order` (one thread per access) or sequentially (one thread); then every page evicted again. */
async function tsRound(p: RemotePager, order?: number[]): Promise<Round> {
  let us: number[];
  let totalUs: number;
  if (order) {
    us = [];
    for (const i of order)
      us.push((await touch(p.region, { offset: i * PAGE_SIZE, length: PAGE_SIZE, probe: true, timings: true })).pageNs![0]! / 1000);
    totalUs = us.reduce((a, b) => a + b, 0);
  } else {
    const r = await touch(p.region, { probe: true, timings: true });
    us = Array.from(r.pageNs!, (ns) => ns / 1000);
    totalUs = r.ns / 1000;
  }
  const s = latencyStats(us);
  await p.evict(); // the pages are clean: dropped, the store keeps them
  return { medianUs: s.typical, p99Us: s.p99, meanUs: totalUs / us.length };
}

/** Pages per ms of `threads` native threads faulting each through its share of the region at once. */
async function throughput(p: RemotePager, threads: number): Promise<number> {
  const share = p.region.size / threads;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: threads }, (_, k) => touch(p.region, { offset: k * share, length: share, probe: true })));
  const ms = performance.now() - t0;
  await p.evict();
  return p.region.size / PAGE_SIZE / ms;
}

export async function benchRemote(opts: BenchRemoteOptions): Promise<Record<string, unknown>> {
  const root = packageRoot();
  // The C program's build and the servers' folders (made inside it, so that an interrupt while
  // one starts removes it too): removed on SIGINT / SIGTERM, which kill the servers (children).
  // A short name: the servers' Unix sockets are in it.
  const build = mkdtempSync(join(os.tmpdir(), 'pfr-br-'));
  const owned = ownFolder(build);
  const redis = await startRedis({ parent: build });
  const server = await startMemoryServer([], build);
  const noCluster = clusterUnavailable();
  let cluster: RedisCluster | undefined, single: RedisCluster | undefined;
  const pagers: RemotePager[] = [];
  try {
    const binary = compileC(root, build, 'remote-handler', ['hiredis'], "Debian's libhiredis-dev is needed");
    if (!noCluster) {
      cluster = await startRedisCluster(3, build);
      single = await startRedisCluster(1, build);
    }
    const size = opts.pages * PAGE_SIZE;
    const make = async (o: Partial<RemotePagerOptions>, seed: number): Promise<RemotePager> => {
      const p = await RemotePager.create({ size, ...o });
      pagers.push(p);
      const b = new Uint8Array(p.region.buffer);
      for (let i = 0; i < opts.pages; i++) b.fill((seed + i) & 0xff, i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
      await p.evict(); // every page in the store
      return p;
    };
    const onRedis = (prefix: string, prefetch = 0) => ({ prefetch, store: { redis: { socket: redis.socket, prefix } } });
    const byCase: Record<Case, RemotePager | undefined> = {
      c: undefined,
      redis: await make(onRedis('bench'), 1),
      embedded: await make({}, 2),
      server: await make({ store: { server: { socket: server.socket, prefix: 'bench' } } }, 8),
      'tcp-1': single ? await make({ store: { redis: { cluster: single.nodes, prefix: 'bench-1' } } }, 7) : undefined,
      cluster: cluster ? await make({ store: { redis: { cluster: cluster.nodes, prefix: 'bench-cl' } } }, 3) : undefined,
      'seq-pf': await make(onRedis('bench-pf', opts.prefetch), 4),
      rand: await make(onRedis('bench-rand'), 5),
      'rand-pf': await make(onRedis('bench-rand-pf', opts.prefetch), 6),
    };
    const cases = (Object.keys(CASES) as Case[]).filter((c) => c === 'c' || byCase[c]);
    let seed = 1;
    const shuffled = (): number[] => {
      const order = [...Array(opts.pages).keys()];
      for (let i = order.length - 1; i > 0; i--) {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        const j = (seed >>> 8) % (i + 1);
        [order[i], order[j]] = [order[j]!, order[i]!];
      }
      return order;
    };
    const base = byCase.redis!.region.address.toString(16);
    const cRound = async (): Promise<Round> => {
      const r = await runOwned(binary, [redis.socket, byCase.redis!.keyPrefix, base, String(opts.pages), '1'], { timeoutMs: 120_000 });
      if (r.status !== 0) throw new Error(`bench-remote: the C program failed: ${r.stderr}`);
      return (JSON.parse(r.stdout) as { rounds: Round[] }).rounds[0]!;
    };

    print('Remote paging, the major fault: real measurements on this machine, now.');
    print(
      `${opts.pages} pages of ${PAGE_SIZE} B per round, ${opts.rounds} rounds after a warm-up, cases interleaved; redis-server on a ` +
        'Unix socket, the cluster on loopback TCP. A sample = one access of a native thread to an evicted page (µs). mean = pass ' +
        "time / pages. The C program copies the stored bytes without checking them; the DM-Handler checks each page's CRC-32C " +
        '(key, version and bytes) first. Random scans: one native thread per access, in one shuffled order per round.' +
        (noCluster ? ` No cluster: ${noCluster}.` : ''),
    );
    const rounds = Object.fromEntries(cases.map((c) => [c, [] as Round[]])) as Record<Case, Round[]>;
    const tput: Record<'redis' | 'tcp-1' | 'cluster', Record<1 | 4, number[]>> = {
      redis: { 1: [], 4: [] },
      'tcp-1': { 1: [], 4: [] },
      cluster: { 1: [], 4: [] },
    };
    const bar = progress((opts.rounds + 1) * (cases.length + (cluster ? 6 : 2)), 'bench-remote');
    try {
      for (let round = 0; round <= opts.rounds; round++) {
        const order = shuffled();
        for (const c of cases) {
          const r = c === 'c' ? await cRound() : await tsRound(byCase[c]!, c.startsWith('rand') ? order : undefined);
          if (round > 0) rounds[c].push(r); // round 0 warms up
          bar.tick(c);
        }
        for (const where of cluster ? (['redis', 'tcp-1', 'cluster'] as const) : (['redis'] as const)) {
          for (const threads of [1, 4] as const) {
            const t = await throughput(byCase[where]!, threads);
            if (round > 0) tput[where][threads].push(t);
            bar.tick(`${where} ${threads} threads`);
          }
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
    const results = Object.fromEntries(cases.map((c) => [c, { ...sum(c), rounds: rounds[c] }])) as Record<Case, Round & { rounds: Round[] }>;
    const table = new Table([
      { header: 'case', width: 9, left: true },
      { header: 'median µs', width: 10 },
      { header: 'p99 µs', width: 9 },
      { header: 'mean µs', width: 9 },
      { header: 'vs C (median)', width: 13 },
    ]);
    table.header();
    for (const c of cases) {
      const r = results[c];
      table.row([c, r.medianUs.toFixed(2), r.p99Us.toFixed(2), r.meanUs.toFixed(2), `${(r.medianUs / results.c.medianUs).toFixed(2)}×`]);
    }
    for (const c of cases) print(`  ${c.padEnd(9)} ${CASES[c]}${c.endsWith('-pf') ? ` (window up to ${opts.prefetch} pages)` : ''}`);
    const prefetchStats = (c: Case) => {
      const s = byCase[c]!.stats();
      return { prefetched: s.prefetched, used: s.prefetchUsed, accuracy: s.prefetchAccuracy, coverage: s.prefetchCoverage };
    };
    const seq = prefetchStats('seq-pf'),
      rand = prefetchStats('rand-pf');
    const ratio = results.redis.medianUs / results.c.medianUs;
    const serverRatio = results.server.medianUs / results.c.medianUs;
    const speedup = results.redis.meanUs / results['seq-pf'].meanUs;
    const randomRatio = results['rand-pf'].meanUs / results.rand.meanUs;
    const pct = (x: number) => `${(100 * x).toFixed(1)} %`;
    print(`\nTypeScript major fault / C: ${ratio.toFixed(2)}× ${target(ratio, '<=', 1.3, '×')}.`);
    print(
      `Sequential scan, adaptive prefetch: ${speedup.toFixed(1)}× faster than without ${target(speedup, '>=', 4, '×')}; ` +
        `accuracy ${pct(seq.accuracy)} (${seq.used} of ${seq.prefetched} pages read ahead were used), coverage ${pct(seq.coverage)}.`,
    );
    print(`Own memory server / C: ${serverRatio.toFixed(2)}× ${target(serverRatio, '<=', 1, '×')}.`);
    print(
      `Random scan, adaptive prefetch: ${randomRatio.toFixed(2)}× the time without ${target(randomRatio, '<=', 1, '×')}; ` +
        `${rand.prefetched} pages read ahead in ${opts.rounds + 1} passes of ${opts.pages}, accuracy ${pct(rand.accuracy)}.`,
    );
    const tp = (where: 'redis' | 'tcp-1' | 'cluster', n: 1 | 4) => median(tput[where][n]);
    let clusterDoc: Record<string, number> | undefined;
    if (cluster) {
      const perFault = results.cluster.medianUs / results['tcp-1'].medianUs;
      const scaling = tp('cluster', 4) / tp('cluster', 1);
      const scale = (w: 'redis' | 'tcp-1') => `${tp(w, 4).toFixed(1)} against ${tp(w, 1).toFixed(1)}, ${(tp(w, 4) / tp(w, 1)).toFixed(2)}×`;
      print(`Cluster of 3 masters: per fault ${perFault.toFixed(2)}× one server on the same transport ${target(perFault, '<=', 1.2, '×')};`);
      print(
        `  4 faulting threads: ${tp('cluster', 4).toFixed(1)} pages/ms against ${tp('cluster', 1).toFixed(1)} for 1: ` +
          `${scaling.toFixed(2)}× ${target(scaling, '>=', 2, '×')} (one server on TCP: ${scale('tcp-1')}; on its Unix socket: ${scale('redis')}).`,
      );
      clusterDoc = { perFaultOverOneServer: perFault, fourThreadsOverOne: scaling };
    }

    const doc = {
      benchmark: 'remote paging major fault: fault -> store -> UFFDIO_COPY',
      machine: machineInfo(root),
      options: { pages: opts.pages, rounds: opts.rounds, warmupRounds: 1, prefetch: opts.prefetch, pageSize: PAGE_SIZE },
      cases: CASES,
      results,
      prefetch: { sequential: seq, random: rand },
      throughputPagesPerMs: tput,
      ratios: {
        tsOverC: ratio,
        prefetchSpeedup: speedup,
        serverOverC: serverRatio,
        randomPrefetchOverNone: randomRatio,
        ...(clusterDoc && { cluster: clusterDoc }),
      },
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
    await cluster?.dispose();
    await single?.dispose();
    rmSync(build, { recursive: true, force: true });
    owned.forget();
  }
}
