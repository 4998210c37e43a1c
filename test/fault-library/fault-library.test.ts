// The fault library's own outputs: statistics per process and per registration, phase
// histograms (measured and modelled), the Chrome trace, and the prefetcher's window.
import { afterEach, describe, expect, test } from 'vitest';
import { MODEL_LABEL } from '../../kernel-sim/index.js';
import { Cluster, Histogram, Prefetcher, SendFlags, WrOpcode, type ChromeTraceEvent, type TraceOption } from '../../lib/index.js';
import { closeAll, createPlayers, P, pollOk } from '../verbs/helpers.js';
import { traceFormatErrors } from '../trace-format.js';

afterEach(closeAll);

/** One RDMA write of `pages` pages from the client into the server's evicted buffer. */
async function faultingWrite(pages: number, policy: 'touch' | 'touch-ahead', trace: TraceOption = true) {
  const players = createPlayers({ size: pages * P, policy, cluster: { trace } });
  const { client, server } = players;
  client.fill(0x5a, 0, pages * P);
  server.region.evict();
  client.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sendFlags: SendFlags.SIGNALED,
    sgList: [client.sge(0, pages * P)],
    rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
  });
  const wc = await pollOk(client.cq);
  return { ...players, wc };
}

describe('statistics', () => {
  test('process and registration stats count what happened: faults by side and kind, pages, retransmissions', async () => {
    const { server, client, wc } = await faultingWrite(8, 'touch');
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 8 });
    const s = server.ctx.faultLibrary.stats();
    expect(s.faults).toEqual({ source: 0, destination: 8, byKind: { 'F_TRANSLATION/write': 8 } });
    expect(s.notifications).toBe(8);
    expect(s.pagesMadeResident).toBe(8);
    expect(s.resolveCalls).toBe(8);
    expect(s.retransmittedBlocks).toBe(8);
    expect(s.unresolved).toBe(0);
    // The MR's registration saw the same faults; the client's library saw none.
    expect(server.mr.registration!.stats.snapshot().faults.destination).toBe(8);
    expect(client.ctx.faultLibrary.stats().faults).toMatchObject({ source: 0, destination: 0 });
    expect(server.region.residentPages()).toBe(8);
  });

  test('phase histograms: one sample per fault, measured and modelled; the modelled resolve phase prices a touch', async () => {
    const t0 = performance.now();
    const { server, cluster } = await faultingWrite(4, 'touch');
    const wallUs = (performance.now() - t0) * 1000;
    const { real, model } = server.ctx.faultLibrary.stats().phases;
    expect(real.resolve.count).toBe(4);
    expect(real.notify.count).toBe(4);
    expect(real.retransmit.count).toBe(4);
    expect(model.notify.count).toBe(4);
    expect(model.resolve.count).toBe(4);
    // Modelled: from the notification, the wake-up + one touched page + the request, the
    // same for every fault; Touch-Ahead of the same 4 pages prices one get_user_pages call.
    const c = cluster.system.costs;
    expect(model.resolve.min).toBeCloseTo(model.resolve.max, 6);
    expect(model.resolve.mean).toBeCloseTo(c.wakeupUs + c.touchPageUs + c.requestUs, 9);
    closeAll();
    const ahead = (await faultingWrite(4, 'touch-ahead')).server.ctx.faultLibrary.stats().phases.model.resolve;
    expect(ahead.count).toBe(1);
    expect(ahead.mean).toBeCloseTo(c.wakeupUs + c.gupCallUs + 4 * c.gupPageUs + c.requestUs, 9);
    // Measured: the four faults' phases follow one another (one block in flight at a time),
    // inside the test's own measurement of the whole write.
    const phases = (['detect', 'notify', 'resolve', 'retransmit'] as const).reduce((sum, ph) => sum + real[ph].mean * real[ph].count, 0);
    expect(real.resolve.min).toBeGreaterThan(0);
    expect(phases).toBeLessThan(wallUs);
    expect(real.detect.count).toBe(4);
  });

  test('touch-ahead: one fault makes the whole rest of the transfer resident in one call', async () => {
    const { server, wc } = await faultingWrite(32, 'touch-ahead');
    expect(wc.odp!.faults.destination).toBe(1);
    const s = server.ctx.faultLibrary.stats();
    expect([s.notifications, s.resolveCalls, s.pagesMadeResident]).toEqual([1, 1, 32]);
  });
});

describe('trace', () => {
  test('off by default: nothing listens to the system events and nothing is kept', async () => {
    const { server, client, cluster } = await faultingWrite(4, 'touch', false);
    expect(cluster.system.tracer.active).toBe(false);
    expect(server.ctx.faultLibrary.trace.events).toEqual([]);
    // Exporting it says how to turn it on, rather than handing out an empty trace.
    expect(client.ctx.faultLibrary.tracing).toBe(false);
    expect(() => client.ctx.faultLibrary.exportChromeTrace()).toThrow(
      expect.objectContaining({ code: 'ERR_PFR_TRACE_OFF', message: expect.stringContaining('Cluster.create({ trace: true })') }),
    );
    // The statistics do not depend on it.
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(4);
  });

  test('off when the cluster is created without the option: a faulting write records nothing', async () => {
    const { client, server, cluster } = createPlayers({ policy: 'touch' });
    server.region.evict();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, P)],
      rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).odp!.faults.destination).toBe(1);
    expect(cluster.system.tracer.active).toBe(false);
    expect([server.ctx.faultLibrary.trace.events, client.ctx.faultLibrary.trace.events]).toEqual([[], []]);
  });

  test('a ring of the size the user sets: the newest events are kept, the oldest counted as dropped', async () => {
    const full = (await faultingWrite(8, 'touch')).server.ctx.faultLibrary.trace.events;
    closeAll();
    const { server } = await faultingWrite(8, 'touch', { limit: 10 });
    const t = server.ctx.faultLibrary.trace;
    expect(t.events).toHaveLength(10);
    // The same transfer's events, the oldest of them dropped and counted.
    expect(full.length).toBeGreaterThan(10);
    expect(t.dropped).toBe(full.length - 10);
    const kinds = (events: typeof full) => events.map((e) => e.kind).sort();
    expect(kinds(t.events)).toEqual(kinds(full.slice(-10)));
    expect(t.events.at(-1)!.kind).toBe('complete'); // the last event of the transfer is still there
    const real = t.events.map((e) => e.realMs);
    expect([...real].sort((a, b) => a - b)).toEqual(real);
  });

  test('a bad trace option is a clear error before anything is built', () => {
    expect(() => createPlayers({ cluster: { trace: { limit: 0 } } })).toThrow(/trace must be true, false or \{ limit/);
    // Not an object, null, a limit that is not a positive integer, a function that has one: each refused by name.
    const bad: unknown[] = [null, 5, 'on', { limit: 1.5 }, { limit: '8' }, { limit: -1 }, {}, Object.assign(() => {}, { limit: 8 })];
    for (const trace of bad) {
      expect(() => Cluster.create({ nodes: 2, trace: trace as TraceOption }), String(trace)).toThrow(
        /^trace must be true, false or \{ limit: a positive integer \} \(events kept\), got /,
      );
    }
  });

  test('a ring of one event keeps the newest', async () => {
    const { server } = await faultingWrite(2, 'touch', { limit: 1 });
    const t = server.ctx.faultLibrary.trace;
    expect(t.events).toHaveLength(1);
    expect(t.events[0]!.kind).toBe('complete');
    expect(t.dropped).toBeGreaterThan(0);
  });

  test('Chrome trace-event JSON: both timelines, every step of the fault, serialisable', async () => {
    const { server, client } = await faultingWrite(2, 'touch');
    const trace = server.ctx.faultLibrary.exportChromeTrace();
    const json = JSON.parse(JSON.stringify(trace)) as { traceEvents: ChromeTraceEvent[]; otherData: { model: string } };
    expect(json.otherData.model).toBe(MODEL_LABEL);
    const names = json.traceEvents.filter((e) => e.ph === 'i' && e.pid === 2).map((e) => e.name); // node 1, modelled
    expect(names.filter((n) => n === 'fault (destination)')).toHaveLength(2);
    expect(names.filter((n) => n === 'irq (destination)')).toHaveLength(2);
    expect(names.filter((n) => n === 'notify (destination)')).toHaveLength(2);
    expect(names.filter((n) => n === 'resolved (destination)')).toHaveLength(2);
    // Each context's export holds only its own process: node 0's steps are in the client's.
    expect(json.traceEvents.filter((e) => e.pid === 0 || e.pid === 1)).toEqual([]);
    const clientTrace = client.ctx.faultLibrary.exportChromeTrace().traceEvents;
    expect(clientTrace.filter((e) => e.pid >= 2)).toEqual([]);
    const sources = clientTrace.filter((e) => e.ph === 'i' && e.pid === 0).map((e) => e.name); // node 0, modelled
    expect(sources.filter((n) => n === 'retransmit')).toHaveLength(2);
    expect(sources.filter((n) => n === 'complete')).toHaveLength(1);
    // Each event is on both timelines (model: pid 2n, real: pid 2n+1), named by metadata.
    expect(json.traceEvents.filter((e) => e.ph === 'i' && e.pid === 3)).toHaveLength(names.length);
    const meta = json.traceEvents.filter((e) => e.ph === 'M').map((e) => e.args!['name']);
    expect(meta).toContain(`node 1: ${MODEL_LABEL}`);
    expect(meta).toContain('node 1: measured (real time)');
    // Modelled timestamps of one fault's steps are in order.
    const order = ['fault (destination)', 'irq (destination)', 'notify (destination)', 'resolved (destination)'];
    const ts = order.map((n) => json.traceEvents.find((e) => e.pid === 2 && e.name === n)!.ts);
    expect([...ts].sort((a, b) => a - b)).toEqual(ts);
  });

  test('complete slices per phase on the thread that did it, and a flow from each fault to its retransmission', async () => {
    const { server, client } = await faultingWrite(2, 'touch');
    const dst = server.ctx.faultLibrary.exportChromeTrace().traceEvents;
    const src = client.ctx.faultLibrary.exportChromeTrace().traceEvents;
    const slices = (events: ChromeTraceEvent[], pid: number) => events.filter((e) => e.ph === 'X' && e.pid === pid);
    // The destination faulted twice: detect, notify and resolve there, each on its own thread.
    for (const phase of ['detect', 'notify', 'resolve']) expect(slices(dst, 2).filter((e) => e.name === phase)).toHaveLength(2);
    expect(new Set(slices(dst, 2).map((e) => e.tid)).size).toBe(3);
    // The source retransmitted both blocks and a copy thread copied them.
    for (const phase of ['retransmit', 'copy']) expect(slices(src, 0).filter((e) => e.name === phase)).toHaveLength(2);
    const threadNames = (events: ChromeTraceEvent[]) =>
      events.filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => String(e.args!['name']));
    expect(threadNames(dst)).toEqual(expect.arrayContaining(['SMMU', 'SMMU driver (IRQ handler)', 'fault library']));
    expect(threadNames(src).some((n) => /^copy engine thread \d+$/.test(n))).toBe(true);
    for (const e of [...dst, ...src].filter((x) => x.ph === 'X')) expect(e.dur).toBeGreaterThanOrEqual(0);
    // Flows: started by the fault on node 1, finished by the retransmission on node 0, in the
    // export of both processes; each process's own holds no half of one.
    expect([...dst, ...src].filter((e) => e.ph === 's' || e.ph === 'f')).toEqual([]);
    const both = server.ctx.faultLibrary.exportChromeTrace({ with: [client.ctx.faultLibrary] }).traceEvents;
    const starts = both.filter((e) => e.ph === 's' && e.pid === 2).map((e) => e.id);
    const ends = both.filter((e) => e.ph === 'f' && e.pid === 0).map((e) => e.id);
    expect(starts).toHaveLength(2);
    expect(ends.sort()).toEqual(starts.sort());
    expect(traceFormatErrors({ traceEvents: both })).toEqual([]);
  });

  test('each time base starts at 0 in a process of its own; the origins and the dropped events are in the metadata', async () => {
    const { server, client } = await faultingWrite(8, 'touch', { limit: 30 });
    const trace = server.ctx.faultLibrary.exportChromeTrace({ with: [client.ctx.faultLibrary] });
    const timed = trace.traceEvents.filter((e) => e.ph !== 'M');
    for (const pid of [0, 1, 2, 3])
      expect(
        timed.some((e) => e.pid === pid),
        `pid ${pid}`,
      ).toBe(true);
    const model = timed.filter((e) => e.pid % 2 === 0).map((e) => e.ts);
    const real = timed.filter((e) => e.pid % 2 === 1).map((e) => e.ts);
    expect([Math.min(...model), Math.min(...real)]).toEqual([0, 0]);
    // Measured time is µs since the first event, not since the process started.
    expect(Math.max(...real)).toBeLessThan(performance.now() * 1000 - Number(trace.otherData['realOriginMs']) * 1000 + 1);
    expect(Number(trace.otherData['realOriginMs'])).toBeGreaterThan(0);
    const names = trace.traceEvents.filter((e) => e.name === 'process_name').map((e) => [e.pid, e.args!['name']]);
    expect(names).toEqual(
      expect.arrayContaining([
        [2, `node 1: ${MODEL_LABEL}`],
        [3, 'node 1: measured (real time)'],
      ]),
    );
    const t = server.ctx.faultLibrary.trace;
    expect(t.dropped).toBeGreaterThan(0);
    expect(trace.otherData['droppedEvents']).toBe(String(t.dropped));
    expect(trace.otherData['keptEvents']).toBe('30');
    expect(trace.otherData['dropped']).toMatch(/trace: \{ limit \}/);
  });

  test('paused, a recorder keeps nothing: a program traces a sample of its transfers', async () => {
    const players = createPlayers({ policy: 'touch', cluster: { trace: true } });
    for (const c of [players.client, players.server]) c.ctx.faultLibrary.trace.paused = true;
    players.server.region.evict();
    players.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [players.client.sge(0, P)],
      rdma: { remoteAddr: players.server.mr.addr, rkey: players.server.mr.rkey },
    });
    expect((await pollOk(players.client.cq)).odp!.faults.destination).toBe(1);
    expect([players.server.ctx.faultLibrary.trace.events, players.server.ctx.faultLibrary.trace.dropped]).toEqual([[], 0]);
  });

  test('exported together, the processes must be of one cluster', async () => {
    const a = await faultingWrite(1, 'touch');
    const other = Cluster.create({ nodes: 1, trace: true });
    try {
      expect(() => a.server.ctx.faultLibrary.exportChromeTrace({ with: [other.openDevice(0).faultLibrary] })).toThrow(/same cluster/);
    } finally {
      other.close();
    }
  });
});

describe('prefetcher', () => {
  test('sequential faults double the window up to the maximum; a jump shrinks it', () => {
    const p = new Prefetcher(4, 32);
    expect(p.next(0).pages).toBe(4); // first fault: nothing to learn yet
    expect(p.next(4).pages).toBe(8); // right after the last window
    expect(p.next(12).pages).toBe(16);
    expect(p.next(28).pages).toBe(32);
    expect(p.next(60).pages).toBe(32); // capped
    expect(p.next(1000).pages).toBe(16); // a miss halves it
    expect([p.hits, p.misses]).toEqual([4, 2]);
  });

  test('a constant stride is learned', () => {
    const p = new Prefetcher(1, 64);
    p.next(0);
    p.next(100); // stride 100: not predicted yet
    const w = p.window;
    p.next(200); // predicted by the stride
    expect(p.window).toBe(w * 2);
  });
});

describe('histogram', () => {
  test('counts, mean, quantiles and log2 buckets', () => {
    const h = new Histogram();
    for (const v of [0.5, 1, 2, 3, 100]) h.add(v);
    h.add(-1); // ignored
    expect(h.count).toBe(5);
    expect(h.mean).toBeCloseTo(21.3, 6);
    expect(h.quantile(0.5)).toBe(2);
    expect(h.summary()).toMatchObject({ count: 5, min: 0.5, max: 100 });
    expect(h.buckets[0]).toBe(1); // < 1 µs
    expect(h.buckets.reduce((a, b) => a + b, 0)).toBe(5);
  });
});
