// bench:engine: the data path of the engine against what the machine does without it, side
// by side in one run, cases interleaved round by round (issue 9's (a)–(g)):
// (a) one resident RDMA_WRITE of 1–256 MiB vs a memcpy (TypedArray.set) of the same buffers;
// (b) 64 B / 4 KiB RDMA_WRITE rate, one QP × 64 outstanding and 64 QPs × 1, vs a
//     MessageChannel between two worker threads with 64 in flight;
// (c) 8 B / 4 KiB SEND ping-pong one-way latency vs a MessageChannel ping-pong;
// (d) a one-page write into an evicted page, real vs modelled;
// (e) µs per page with every page faulting, 1 MiB vs 256 MiB, policies touch and touch-ahead;
// (f) per-transfer time of all-to-all writes (evicted destinations), 2 vs 16 nodes;
// (g) wake-ups of an idle process holding a Cluster and a Userfaultfd, and the heap growth
//     after faulting in 1 GiB with default options;
// (h) heap bytes allocated per 64 B RDMA_WRITE on the steady path (issue 38), over 100,000 WRs.
// A program that prints real measurements (npm run bench:engine), never a test. JSON:
// bench-engine.json in the working directory, or --json.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { GCProfiler, getHeapStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Worker } from 'node:worker_threads';
import {
  Access,
  Cluster,
  connectQps,
  latencyStats,
  mapRegion,
  median,
  PAGE_SIZE,
  SendFlags,
  Userfaultfd,
  WcStatus,
  WrOpcode,
  type CompletionQueue,
  type Context,
  type MemoryRegion,
  type PolicyName,
  type ProtectionDomain,
  type QueuePair,
  type Region,
} from '../lib/index.js';
import { print, sizeName, target } from '../cli/programs/support/format.js';
import { progress, type Progress } from '../cli/programs/support/progress.js';
import { defaultResults, machineInfo, packageRoot } from './faults.js';

export const ENGINE_CASES = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'] as const;
export type EngineCase = (typeof ENGINE_CASES)[number];

export interface BenchEngineOptions {
  /** Measured rounds per case (after one warm-up round). */
  rounds: number;
  /** Which of (a)–(h) to run. */
  cases: EngineCase[];
  /** (a) sizes in bytes. */
  writeSizes: number[];
  /** (e) sizes in bytes (small, large). */
  faultSizes: number[];
  /** (f) node counts. */
  nodes: number[];
  /** (g) seconds of idleness measured. */
  idleSeconds: number;
  /** (g) bytes faulted in for the heap figure. */
  heapBytes: number;
  /** Where the JSON goes (default bench-engine.json in the working directory); false: not written. */
  json?: string | false;
}

const ODP = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
const MSG_INFLIGHT = 64;

/** One context per node, each with a PD and a CQ. */
interface Nodes {
  cluster: Cluster;
  ctx: Context[];
  pd: ProtectionDomain[];
  cq: CompletionQueue[];
}

function nodes(n: number, cqe = 1024): Nodes {
  const cluster = Cluster.create({ nodes: n });
  const ctx = Array.from({ length: n }, (_, i) => cluster.openDevice(i));
  const pd = ctx.map((c) => c.allocPd());
  const cq = ctx.map((c) => c.createCq(cqe));
  return { cluster, ctx, pd, cq };
}

function qpPair(w: Nodes, a: number, b: number): [QueuePair, QueuePair] {
  const qa = w.ctx[a]!.createQp(w.pd[a]!, { sendCq: w.cq[a]!, recvCq: w.cq[a]!, cap: { maxSendWr: 256, maxRecvWr: 256 } });
  const qb = w.ctx[b]!.createQp(w.pd[b]!, { sendCq: w.cq[b]!, recvCq: w.cq[b]!, cap: { maxSendWr: 256, maxRecvWr: 256 } });
  connectQps(qa, qb);
  return [qa, qb];
}

function resident(size: number, byte: number): Region {
  const r = mapRegion(Math.ceil(size / PAGE_SIZE) * PAGE_SIZE);
  new Uint8Array(r.buffer).fill(byte);
  return r;
}

function write(qp: QueuePair, wrId: number, src: MemoryRegion, dst: MemoryRegion, length: number, offset = 0): void {
  qp.postSend({
    wrId,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [{ addr: src.addr, length, lkey: src.lkey }],
    rdma: { remoteAddr: dst.addr + BigInt(offset), rkey: dst.rkey },
    sendFlags: SendFlags.SIGNALED,
  });
}

async function completion(cq: CompletionQueue): Promise<NonNullable<Awaited<ReturnType<CompletionQueue['next']>>>> {
  const wc = await cq.next({ timeoutMs: 120_000 });
  if (wc.status !== WcStatus.SUCCESS) throw new Error(`bench-engine: a work request failed: ${WcStatus[wc.status]}`);
  return wc;
}

// ---- the MessageChannel references: two worker threads joined by a MessageChannel ----

const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
parentPort.once('message', ({ port, role, mode, size, count, inflight }) => {
  if (role === 'echo') {
    port.on('message', (m) => port.postMessage(mode === 'rate' ? 1 : m));
    parentPort.postMessage('ready');
    return;
  }
  const payload = new Uint8Array(size);
  let sent = 0, got = 0;
  const t0 = performance.now();
  const lat = [];
  let t = 0;
  const send = () => { sent++; if (mode === 'ping') t = performance.now(); port.postMessage(payload); };
  port.on('message', () => {
    got++;
    if (mode === 'ping') lat.push((performance.now() - t) * 500);
    if (got === count) { port.close(); parentPort.postMessage({ ms: performance.now() - t0, lat }); return; }
    if (sent < count) send();
  });
  for (let i = 0; i < (mode === 'rate' ? inflight : 1); i++) send();
});
`;

/** `count` messages of `size` bytes from one worker to another (rate: `inflight` at once; ping: one-way µs each). */
async function messageChannel(mode: 'rate' | 'ping', size: number, count: number): Promise<{ ms: number; lat: number[] }> {
  const { MessageChannel } = await import('node:worker_threads');
  const ch = new MessageChannel();
  const echo = new Worker(WORKER, { eval: true });
  const driver = new Worker(WORKER, { eval: true });
  try {
    const ready = new Promise((r) => echo.once('message', r));
    echo.postMessage({ port: ch.port1, role: 'echo', mode }, [ch.port1]);
    await ready;
    const result = new Promise<{ ms: number; lat: number[] }>((resolve, reject) => {
      driver.once('message', resolve);
      driver.once('error', reject);
    });
    driver.postMessage({ port: ch.port2, role: 'driver', mode, size, count, inflight: MSG_INFLIGHT }, [ch.port2]);
    return await result;
  } finally {
    await Promise.all([echo.terminate(), driver.terminate()]);
  }
}

// ---- (a) big resident writes vs memcpy ----

async function caseA(o: BenchEngineOptions, bar: Progress): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const size of o.writeSizes) {
    const w = nodes(2);
    const src = resident(size, 0x5a);
    const dst = resident(size, 0);
    try {
      const [qa] = qpPair(w, 0, 1);
      const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, size, ODP);
      const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, size, ODP);
      const a = new Uint8Array(src.buffer);
      const b = new Uint8Array(dst.buffer);
      const rdma: number[] = [];
      const memcpy: number[] = [];
      for (let r = 0; r <= o.rounds; r++) {
        const t0 = performance.now();
        write(qa, r, ms, md, size);
        await completion(w.cq[0]!);
        const t1 = performance.now();
        if (b[size - 1] !== 0x5a) throw new Error('bench-engine (a): the write did not land');
        b.fill(0, size - 1);
        const t2 = performance.now();
        b.set(a);
        const t3 = performance.now();
        if (r > 0) {
          rdma.push(size / (t1 - t0) / 1e6);
          memcpy.push(size / (t3 - t2) / 1e6);
        }
        bar.tick(`(a) ${sizeName(size)}`);
      }
      const row = { size, rdmaGBs: median(rdma), memcpyGBs: median(memcpy), ratio: median(rdma) / median(memcpy) };
      print(
        `(a) RDMA_WRITE ${sizeName(size).padStart(5)}B resident: ${row.rdmaGBs.toFixed(2)} GB/s   memcpy ${row.memcpyGBs.toFixed(2)} GB/s   ratio ${row.ratio.toFixed(3)}  ${size >= 16 * 2 ** 20 ? target(row.ratio, '>=', 0.8) : '(target >= 0.8 from 16 MiB: none here)'}`,
      );
      out.push(row);
    } finally {
      w.cluster.close();
      src.close();
      dst.close();
    }
  }
  return out;
}

// ---- (b) small-write rate ----

async function writeRate(size: number, qps: number, outstanding: number, count: number): Promise<number> {
  const w = nodes(2, 4096);
  const src = resident(size, 1);
  const dst = resident(size, 0);
  try {
    const pairs = Array.from({ length: qps }, () => qpPair(w, 0, 1)[0]);
    const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, src.size, ODP);
    const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, dst.size, ODP);
    let posted = 0;
    const t0 = performance.now();
    for (const qp of pairs) for (let k = 0; k < outstanding && posted < count; k++) write(qp, posted++, ms, md, size);
    for (let done = 0; done < count; done++) {
      const wc = await completion(w.cq[0]!);
      if (posted < count) write(pairs[wc.qpNum === pairs[0]!.qpNum ? 0 : pairs.findIndex((q) => q.qpNum === wc.qpNum)]!, posted++, ms, md, size);
    }
    return count / ((performance.now() - t0) / 1000);
  } finally {
    w.cluster.close();
    src.close();
    dst.close();
  }
}

async function caseB(o: BenchEngineOptions, bar: Progress): Promise<unknown[]> {
  const out: unknown[] = [];
  const count = 4000;
  for (const size of [64, 4096]) {
    const one: number[] = [];
    const many: number[] = [];
    const mc: number[] = [];
    for (let r = 0; r <= o.rounds; r++) {
      const x = await writeRate(size, 1, MSG_INFLIGHT, count);
      const y = await writeRate(size, MSG_INFLIGHT, 1, count);
      const m = await messageChannel('rate', size, count * 4);
      if (r > 0) {
        one.push(x);
        many.push(y);
        mc.push((count * 4) / (m.ms / 1000));
      }
      bar.tick(`(b) ${size} B`);
    }
    const row = { size, oneQp64: median(one), qps64x1: median(many), messageChannel: median(mc) };
    print(
      `(b) RDMA_WRITE ${String(size).padStart(4)} B rate: 1 QP x 64 ${(row.oneQp64 / 1e3).toFixed(1)} k/s (${(row.oneQp64 / row.messageChannel).toFixed(3)})   ` +
        `64 QPs x 1 ${(row.qps64x1 / 1e3).toFixed(1)} k/s (${(row.qps64x1 / row.messageChannel).toFixed(3)})   MessageChannel ${(row.messageChannel / 1e3).toFixed(1)} k/s  ` +
        `${target(Math.min(row.oneQp64, row.qps64x1) / row.messageChannel, '>=', 1.0).replace('target', 'target, both')}`,
    );
    out.push(row);
  }
  return out;
}

// ---- (c) SEND ping-pong ----

async function sendPingPong(size: number, iters: number): Promise<number[]> {
  const w = nodes(2);
  const buf = [resident(size, 1), resident(size, 2)];
  try {
    const qp = qpPair(w, 0, 1);
    const mr = [0, 1].map((i) => w.ctx[i]!.regMr(w.pd[i]!, buf[i]!, 0, buf[i]!.size, ODP));
    const sge = (i: number) => [{ addr: mr[i]!.addr, length: size, lkey: mr[i]!.lkey }];
    qp[0].postRecv({ wrId: 0, sgList: sge(0) });
    qp[1].postRecv({ wrId: 0, sgList: sge(1) });
    const message = async (from: number, to: number, i: number) => {
      qp[from]!.postSend({ wrId: i, opcode: WrOpcode.SEND, sgList: sge(from), sendFlags: SendFlags.SIGNALED });
      await completion(w.cq[from]!);
      await completion(w.cq[to]!);
      qp[to]!.postRecv({ wrId: i, sgList: sge(to) });
    };
    const lat: number[] = [];
    for (let i = 0; i < iters; i++) {
      const t0 = performance.now();
      await message(0, 1, i);
      await message(1, 0, i);
      lat.push((performance.now() - t0) * 500);
    }
    return lat;
  } finally {
    w.cluster.close();
    for (const b of buf) b.close();
  }
}

async function caseC(o: BenchEngineOptions, bar: Progress): Promise<unknown[]> {
  const out: unknown[] = [];
  const iters = 500;
  for (const size of [8, 4096]) {
    const send: number[] = [];
    const mc: number[] = [];
    for (let r = 0; r <= o.rounds; r++) {
      const s = await sendPingPong(size, iters);
      const m = await messageChannel('ping', size, iters);
      if (r > 0) {
        send.push(...s);
        mc.push(...m.lat);
      }
      bar.tick(`(c) ${size} B`);
    }
    const a = latencyStats(send);
    const b = latencyStats(mc);
    const row = {
      size,
      sendUs: { median: a.typical, p99: a.p99 },
      messageChannelUs: { median: b.typical, p99: b.p99 },
      ratio: a.typical / b.typical,
    };
    print(
      `(c) SEND ping-pong ${String(size).padStart(4)} B one way: median ${a.typical.toFixed(1)} µs (p99 ${a.p99.toFixed(1)})   ` +
        `MessageChannel ${b.typical.toFixed(1)} µs (p99 ${b.p99.toFixed(1)})   ratio ${row.ratio.toFixed(2)}  ${target(row.ratio, '<=', 0.5)}`,
    );
    out.push(row);
  }
  return out;
}

// ---- (d) one-page write into an evicted page ----

async function caseD(o: BenchEngineOptions, bar: Progress): Promise<unknown> {
  const w = nodes(2);
  const src = resident(PAGE_SIZE, 7);
  const dst = mapRegion(PAGE_SIZE);
  try {
    const [qa] = qpPair(w, 0, 1);
    const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, PAGE_SIZE, ODP);
    const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, PAGE_SIZE, ODP);
    const real: number[] = [];
    const model: number[] = [];
    const iters = 200;
    for (let r = 0; r <= o.rounds; r++) {
      for (let i = 0; i < iters; i++) {
        dst.evict();
        const t0 = performance.now();
        write(qa, i, ms, md, PAGE_SIZE);
        const wc = await completion(w.cq[0]!);
        const us = (performance.now() - t0) * 1000;
        if ((wc.odp?.faults.destination ?? 0) < 1) throw new Error('bench-engine (d): the evicted page did not fault');
        if (r > 0) {
          real.push(us);
          model.push(wc.odp!.modelUs);
        }
      }
      bar.tick('(d)');
    }
    const a = latencyStats(real);
    const row = { realUs: { median: a.typical, p99: a.p99 }, modelUs: median(model), ratio: a.typical / median(model) };
    print(
      `(d) one-page write into an evicted page: real median ${a.typical.toFixed(1)} µs (p99 ${a.p99.toFixed(1)})   modelled ${row.modelUs.toFixed(1)} µs   ratio ${row.ratio.toFixed(2)}  ${target(row.ratio, '<=', 1.5)}`,
    );
    return row;
  } finally {
    w.cluster.close();
    src.close();
    dst.close();
  }
}

// ---- (e) every page faulting ----

async function faultingWrite(size: number, policy: PolicyName): Promise<number> {
  const w = nodes(2);
  const src = resident(size, 3);
  const dst = mapRegion(size);
  try {
    const [qa] = qpPair(w, 0, 1);
    const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, size, ODP);
    const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, size, ODP, { policy });
    const t0 = performance.now();
    write(qa, 0, ms, md, size);
    const wc = await completion(w.cq[0]!);
    const us = (performance.now() - t0) * 1000;
    if ((wc.odp?.faults.destination ?? 0) < 1) throw new Error('bench-engine (e): the destination did not fault');
    return us / (size / PAGE_SIZE);
  } finally {
    w.cluster.close();
    src.close();
    dst.close();
  }
}

async function caseE(o: BenchEngineOptions, bar: Progress): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const policy of ['touch', 'touch-ahead'] as const) {
    const per = new Map<number, number[]>(o.faultSizes.map((s) => [s, []]));
    for (let r = 0; r <= o.rounds; r++) {
      for (const size of o.faultSizes) {
        const us = await faultingWrite(size, policy);
        if (r > 0) per.get(size)!.push(us);
        bar.tick(`(e) ${policy} ${sizeName(size)}`);
      }
    }
    const row = { policy, usPerPage: Object.fromEntries([...per].map(([sz, v]) => [sz, median(v)])) };
    const figures = [...per].map(([, v]) => median(v));
    const ratio = figures[figures.length - 1]! / figures[0]!;
    print(
      `(e) every page faulting, policy ${policy.padEnd(11)}: ${[...per].map(([s, v]) => `${sizeName(s)}B ${median(v).toFixed(1)} µs/page`).join('   ')}   ratio ${ratio.toFixed(2)}  ${target(ratio, '<=', 1.3)}`,
    );
    out.push({ ...row, ratio });
  }
  return out;
}

// ---- (f) all-to-all ----

async function allToAll(n: number, size: number): Promise<number> {
  const w = nodes(n, 4096);
  const src = w.ctx.map(() => resident(size, 9));
  const dst = w.ctx.map(() => mapRegion(size * n));
  try {
    const ms = w.ctx.map((c, i) => c.regMr(w.pd[i]!, src[i]!, 0, size, ODP));
    const md = w.ctx.map((c, i) => c.regMr(w.pd[i]!, dst[i]!, 0, size * n, ODP));
    const qps: Array<[number, number, QueuePair]> = [];
    for (let a = 0; a < n; a++) for (let b = 0; b < n; b++) if (a !== b) qps.push([a, b, qpPair(w, a, b)[0]]);
    const transfers = qps.length;
    const t0 = performance.now();
    for (const [a, b, qp] of qps) write(qp, 0, ms[a]!, md[b]!, size, a * size);
    await Promise.all(w.ctx.map((_, a) => w.cq[a]!.take(n - 1, { timeoutMs: 120_000 })));
    return ((performance.now() - t0) * 1000) / transfers;
  } finally {
    w.cluster.close();
    for (const r of [...src, ...dst]) r.close();
  }
}

async function caseF(o: BenchEngineOptions, bar: Progress): Promise<unknown> {
  const size = 16 * 1024;
  const per = new Map<number, number[]>(o.nodes.map((n) => [n, []]));
  for (let r = 0; r <= o.rounds; r++) {
    for (const n of o.nodes) {
      const us = await allToAll(n, size);
      if (r > 0) per.get(n)!.push(us);
      bar.tick(`(f) ${n} nodes`);
    }
  }
  const figures = [...per].map(([, v]) => median(v));
  const ratio = figures[figures.length - 1]! / figures[0]!;
  print(
    `(f) all-to-all ${size / 1024} KiB writes into evicted memory, per transfer: ${[...per].map(([n, v]) => `${n} nodes ${median(v).toFixed(1)} µs`).join('   ')}   ratio ${ratio.toFixed(2)}  ${target(ratio, '<=', 1.3)}`,
  );
  return { size, usPerTransfer: Object.fromEntries([...per].map(([n, v]) => [n, median(v)])), ratio };
}

// ---- (g) idle wake-ups and heap ----

/** Context switches of every thread of this process, by thread id. */
function contextSwitches(): Map<string, { name: string; n: number }> {
  const out = new Map<string, { name: string; n: number }>();
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      const s = readFileSync(`/proc/self/task/${tid}/status`, 'utf8');
      const name = /^Name:\s*(.*)$/m.exec(s)?.[1] ?? '?';
      const v = Number(/^voluntary_ctxt_switches:\s*(\d+)/m.exec(s)?.[1] ?? 0);
      const nv = Number(/^nonvoluntary_ctxt_switches:\s*(\d+)/m.exec(s)?.[1] ?? 0);
      out.set(tid, { name, n: v + nv });
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

function gc(): void {
  setFlagsFromString('--expose-gc');
  (runInNewContext('gc') as () => void)();
}

async function caseG(o: BenchEngineOptions, bar: Progress): Promise<unknown> {
  // Idle: a Cluster with an open context and a Userfaultfd with a registered region.
  const cluster = Cluster.create({ nodes: 2 });
  cluster.openDevice(0);
  const uffd = Userfaultfd.open();
  const region = mapRegion(PAGE_SIZE * 16);
  let idle: { perSecond: number; byThread: Record<string, number> };
  try {
    uffd.register(region);
    await new Promise((r) => setTimeout(r, 200));
    const before = contextSwitches();
    await new Promise((r) => setTimeout(r, o.idleSeconds * 1000));
    const after = contextSwitches();
    const byThread: Record<string, number> = {};
    let total = 0;
    for (const [tid, a] of after) {
      const d = a.n - (before.get(tid)?.n ?? 0);
      if (tid === String(process.pid)) continue; // the JS thread: woken once by the sleep's own timer
      total += d;
      if (d > 0) byThread[`${a.name}#${tid}`] = d;
    }
    idle = { perSecond: total / o.idleSeconds, byThread };
  } finally {
    uffd.close();
    region.close();
    cluster.close();
  }
  bar.tick('(g) idle');
  print(
    `(g) idle process with a Cluster and a Userfaultfd: ${idle.perSecond.toFixed(1)} wake-ups/s over ${o.idleSeconds} s (threads other than the JS thread: ${JSON.stringify(idle.byThread)})  ${target(idle.perSecond, '<=', 1)}`,
  );

  // Heap: fault in heapBytes of an ODP buffer with default options, in writes of 64 MiB.
  gc();
  const heap0 = process.memoryUsage().heapUsed;
  const chunk = Math.min(o.heapBytes, 64 * 2 ** 20);
  const w = nodes(2);
  const src = resident(chunk, 4);
  const dst = mapRegion(o.heapBytes);
  let heapAfter: number;
  try {
    const [qa] = qpPair(w, 0, 1);
    const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, chunk, ODP);
    const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, o.heapBytes, ODP);
    for (let off = 0; off < o.heapBytes; off += chunk) {
      write(qa, off / chunk, ms, md, chunk, off);
      await completion(w.cq[0]!);
    }
    gc();
    heapAfter = process.memoryUsage().heapUsed;
  } finally {
    w.cluster.close();
    src.close();
    dst.close();
  }
  gc();
  const heapClosed = process.memoryUsage().heapUsed;
  bar.tick('(g) heap');
  const mib = (x: number) => x / 2 ** 20;
  print(
    `(g) heap after faulting in ${sizeName(o.heapBytes)}B (default options): +${mib(heapAfter - heap0).toFixed(1)} MiB; after cluster.close(): +${mib(heapClosed - heap0).toFixed(1)} MiB  ${target(mib(heapAfter - heap0), '<=', 32, ' MiB')}`,
  );
  return { idle, heap: { bytes: o.heapBytes, growthMiB: mib(heapAfter - heap0), afterCloseMiB: mib(heapClosed - heap0) } };
}

// ---- (h) heap bytes per small write ----

/**
 * Bytes allocated on the V8 heap per 64 B RDMA_WRITE, 1 QP × 64 outstanding, over `count` WRs
 * after a warm-up: the growth of used_heap_size plus what every GC in between freed (v8's
 * GCProfiler reports the heap statistics before and after each). The program reuses one WR
 * object, as a C program reuses its ibv_send_wr; the work completions pollCq returns are counted.
 */
async function heapPerWrite(count: number): Promise<number> {
  const size = 64;
  const w = nodes(2, 4096);
  const src = resident(size, 1);
  const dst = resident(size, 0);
  try {
    const [qp] = qpPair(w, 0, 1);
    const ms = w.ctx[0]!.regMr(w.pd[0]!, src, 0, src.size, ODP);
    const md = w.ctx[1]!.regMr(w.pd[1]!, dst, 0, dst.size, ODP);
    const cq = w.cq[0]!;
    const wr = {
      wrId: 0,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: ms.addr, length: size, lkey: ms.lkey }],
      rdma: { remoteAddr: md.addr, rkey: md.rkey },
      sendFlags: SendFlags.SIGNALED,
    };
    const run = async (n: number) => {
      let posted = 0;
      let done = 0;
      for (; posted < MSG_INFLIGHT && posted < n; posted++) {
        wr.wrId = posted;
        qp.postSend(wr);
      }
      while (done < n) {
        const wc = await cq.next({ timeoutMs: 120_000 });
        if (wc.status !== WcStatus.SUCCESS) throw new Error(`bench-engine (h): a work request failed: ${WcStatus[wc.status]}`);
        done++;
        for (const c of cq.poll(MSG_INFLIGHT)) {
          if (c.status !== WcStatus.SUCCESS) throw new Error(`bench-engine (h): a work request failed: ${WcStatus[c.status]}`);
          done++;
        }
        while (posted < n && posted - done < MSG_INFLIGHT) {
          wr.wrId = posted++;
          qp.postSend(wr);
        }
      }
    };
    await run(Math.min(count, 20_000));
    gc();
    const profiler = new GCProfiler();
    const used0 = getHeapStatistics().used_heap_size;
    profiler.start();
    await run(count);
    const stats = profiler.stop();
    const used1 = getHeapStatistics().used_heap_size;
    let freed = 0;
    for (const s of stats?.statistics ?? []) freed += s.beforeGC.heapStatistics.usedHeapSize - s.afterGC.heapStatistics.usedHeapSize;
    return (used1 - used0 + freed) / count;
  } finally {
    w.cluster.close();
    src.close();
    dst.close();
  }
}

async function caseH(o: BenchEngineOptions, bar: Progress): Promise<unknown> {
  const count = 100_000;
  const per: number[] = [];
  for (let r = 0; r <= o.rounds; r++) {
    const x = await heapPerWrite(count);
    if (r > 0) per.push(x);
    bar.tick('(h) heap per write');
  }
  const bytes = median(per);
  print(
    `(h) heap allocated per 64 B RDMA_WRITE (1 QP x 64, ${count} WRs, v8 GC statistics): ${bytes.toFixed(0)} B  ${target(bytes, '<=', 100, ' B')}`,
  );
  return { count, bytesPerWrite: bytes, rounds: per };
}

export async function benchEngine(o: BenchEngineOptions): Promise<Record<string, unknown>> {
  const root = packageRoot();
  const steps =
    (o.cases.includes('a') ? o.writeSizes.length * (o.rounds + 1) : 0) +
    (o.cases.includes('b') ? 2 * (o.rounds + 1) : 0) +
    (o.cases.includes('c') ? 2 * (o.rounds + 1) : 0) +
    (o.cases.includes('d') ? o.rounds + 1 : 0) +
    (o.cases.includes('e') ? 2 * o.faultSizes.length * (o.rounds + 1) : 0) +
    (o.cases.includes('f') ? o.nodes.length * (o.rounds + 1) : 0) +
    (o.cases.includes('g') ? 2 : 0) +
    (o.cases.includes('h') ? o.rounds + 1 : 0);
  const bar = progress(steps, 'bench-engine');
  print('The engine data path against the machine without it: real measurements on this machine, now.');
  print(`${o.rounds} measured rounds per case after a warm-up; medians (and p99 for latencies).`);
  const results: Record<string, unknown> = { machine: machineInfo(root), options: { ...o, json: undefined } };
  try {
    if (o.cases.includes('a')) results.a = await caseA(o, bar);
    if (o.cases.includes('b')) results.b = await caseB(o, bar);
    if (o.cases.includes('c')) results.c = await caseC(o, bar);
    if (o.cases.includes('d')) results.d = await caseD(o, bar);
    if (o.cases.includes('e')) results.e = await caseE(o, bar);
    if (o.cases.includes('f')) results.f = await caseF(o, bar);
    if (o.cases.includes('g')) results.g = await caseG(o, bar);
    if (o.cases.includes('h')) results.h = await caseH(o, bar);
  } finally {
    bar.stop();
  }
  if (o.json !== false) {
    const file = o.json ?? defaultResults(root, 'engine.json');
    writeFileSync(file, JSON.stringify(results, null, 2) + '\n');
    print(`JSON: ${file}`);
  }
  return results;
}
