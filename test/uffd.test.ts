// Genuine faults through userfaultfd: a native toucher thread faults, the kernel reports each
// fault, the TypeScript handler resolves it, and the bytes the thread reads are the bytes placed.
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { mapRegion, touch, Userfaultfd, type Fault } from '../lib/index.js';
import { closer, P, pattern, recording, sleep, until } from './helpers.js';

const own = closer();

/** A region of `pages` registered (missing faults) on a fresh uffd whose handler is `h`. */
function setup(pages: number, h: ReturnType<typeof recording>) {
  const region = own(mapRegion(pages * P));
  const uffd = own(Userfaultfd.open({ handler: h.handler }));
  uffd.register(region);
  return { region, uffd };
}

const offsets = (faults: Fault[]): number[] => faults.map((f) => f.offset / P);
const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, i) => from + i);

describe('missing faults', () => {
  it('N untouched pages read by the toucher give exactly N faults; the bytes copied in are the bytes read back', async () => {
    const N = 32;
    const data = pattern(N);
    const h = recording((f, u) => {
      u.copy(f.region, f.offset, data.subarray(f.offset, f.offset + P));
    });
    const { region, uffd } = setup(N, h);
    expect(uffd.features.threadId).toBe(true);
    expect(region.residentPages()).toBe(0);

    const res = await touch(region);

    expect(h.faults).toHaveLength(N);
    expect(offsets(h.faults)).toEqual(range(0, N));
    for (const f of h.faults) {
      expect(f.kind).toBe('missing');
      expect(f.write).toBe(false);
      expect(f.region).toBe(region);
      expect(f.resolvedBy).toBe('handler');
      // The toucher's thread took the faults, not the JS thread that handles them.
      expect(f.threadId).toBe(res.threadId);
      expect(f.address >= region.address + BigInt(f.offset)).toBe(true);
      expect(f.address < region.address + BigInt(f.offset + P)).toBe(true);
    }
    expect(res.threadId).not.toBe(uffd.handlerThreadId);
    expect(res.pages).toBe(N);
    expect(res.data!.equals(data)).toBe(true);
    expect(region.residentPages()).toBe(N);
    expect(uffd.stats()).toMatchObject({ forwarded: N, resolvedNatively: 0, handled: N, timeouts: 0, handlerErrors: 0 });
    expect(uffd.pending).toBe(0);
  });

  it('writes fault as writes, and what the toucher wrote is in the memory afterwards', async () => {
    const N = 8;
    const h = recording((f, u) => u.zeropage(f.region, f.offset, P));
    const { region } = setup(N, h);
    await touch(region, { access: 'write', fill: 0xc3 });
    expect(h.faults).toHaveLength(N);
    expect(h.faults.every((f) => f.write && f.kind === 'missing')).toBe(true);
    expect(new Uint8Array(region.buffer).every((b) => b === 0xc3)).toBe(true);
  });

  it('zeropage() resolves with zeros', async () => {
    const N = 16;
    const h = recording((f, u) => u.zeropage(f.region, f.offset, P));
    const { region } = setup(N, h);
    const res = await touch(region);
    expect(h.faults).toHaveLength(N);
    expect(res.data!.length).toBe(N * P);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(region.residentPages()).toBe(N);
  });

  it('resolving all 64 pages on the first fault (touch-ahead) gives 1 fault for 64 pages', async () => {
    const N = 64;
    const data = pattern(N, 7);
    const h = recording((f, u) => {
      expect(u.copy(f.region, 0, data)).toBe(N * P);
    });
    const { region, uffd } = setup(N, h);
    const res = await touch(region);
    expect(h.faults).toHaveLength(1);
    expect(h.faults[0]!.offset).toBe(0);
    expect(res.data!.equals(data)).toBe(true);
    expect(region.residentPages()).toBe(N);
    expect(uffd.stats().forwarded).toBe(1);
  });

  it('a copy over pages partly resolved already places the rest (EEXIST is success)', async () => {
    const N = 8;
    const data = pattern(N, 0x20);
    const h = recording((f, u) => {
      // Pages 0..3 are there already: only 4..7 are placed, and the toucher is woken
      // once, after all of them, so it does not run ahead into a page not yet copied.
      u.copy(f.region, 0, data);
    });
    const { region, uffd } = setup(N, h);
    uffd.copy(region, 0, data.subarray(0, 4 * P));
    const res = await touch(region);
    expect(offsets(h.faults)).toEqual([4]);
    expect(res.data!.equals(data)).toBe(true);
  });

  it('evict() makes the next access fault again, for exactly the evicted pages', async () => {
    const N = 16;
    const h = recording((f, u) => u.copy(f.region, f.offset, Buffer.alloc(P, 0x10 + f.offset / P)));
    const { region, uffd } = setup(N, h);
    const removed: { address: bigint; length: number }[] = [];
    uffd.on('remove', (e: { address: bigint; length: number }) => removed.push(e));
    await touch(region, { probe: true });
    expect(h.faults).toHaveLength(N);

    region.evict(4 * P, 3 * P);
    expect(
      Array.from(region.residency())
        .map((v, i) => (v ? -1 : i))
        .filter((i) => i >= 0),
    ).toEqual([4, 5, 6]);
    h.faults.length = 0;
    const again = await touch(region, { probe: true });
    expect(offsets(h.faults)).toEqual([4, 5, 6]);
    // The handler filled every page with 0x10 + page number, the first time and again now.
    expect(again.checksum).toBe(range(0, N).reduce((s, i) => s + 0x10 + i, 0));
    if (uffd.features.eventRemove) {
      await until('the REMOVE event', () => removed.length > 0);
      expect(removed[0]).toEqual({ address: region.address + BigInt(4 * P), length: 3 * P });
    }
  });

  it('populate() makes pages resident with no fault reaching the handler', async () => {
    const N = 16;
    const h = recording((f, u) => u.copy(f.region, f.offset, Buffer.alloc(P, 1)));
    const { region, uffd } = setup(N, h);
    // On registered memory too: populate() runs on the handler thread, so its own faults
    // are resolved natively (zero pages) and never wait for the handler.
    region.populate(0, N * P);
    expect(region.residentPages()).toBe(N);
    const res = await touch(region);
    expect(h.faults).toHaveLength(0);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(uffd.stats().forwarded).toBe(0);
  });

  it('a bare wake() leaves the page unresolved: the thread faults again and the handler sees it again', async () => {
    const h = recording((f, u) => {
      if (h.faults.length === 1) u.wake(f.region, f.offset, P);
      else u.copy(f.region, f.offset, Buffer.alloc(P, 0xee));
    });
    const { region, uffd } = setup(1, h);
    const res = await touch(region);
    expect(offsets(h.faults)).toEqual([0, 0]);
    expect(res.data!.every((b) => b === 0xee)).toBe(true);
    expect(uffd.stats().timeouts).toBe(0);
  });
});

describe('write-protect faults', () => {
  it('fire on write and not on read (populated memory, protected)', async () => {
    const N = 8;
    const region = own(mapRegion(N * P));
    new Uint8Array(region.buffer).set(pattern(N));
    const h = recording((f, u) => u.writeProtect(f.region, f.offset, P, false));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    uffd.register(region, { missing: false, writeProtect: true });
    uffd.writeProtect(region, 0, N * P, true);

    const read = await touch(region);
    expect(h.faults).toHaveLength(0);
    expect(read.data!.equals(pattern(N))).toBe(true);

    await touch(region, { access: 'write', probe: true, fill: 0xab });
    expect(h.faults).toHaveLength(N);
    expect(offsets(h.faults)).toEqual(range(0, N));
    expect(h.faults.every((f) => f.kind === 'write-protect' && f.write)).toBe(true);
    const view = new Uint8Array(region.buffer);
    for (let i = 0; i < N; i++) {
      expect(view[i * P]).toBe(0xab); // the write went through once unprotected
      expect(view[i * P + 1]).toBe(1 + i);
    }
  });

  it('missing + write-protect: a read is one missing fault, a later write one write-protect fault', async () => {
    const N = 4;
    const h = recording((f, u) => {
      if (f.kind === 'missing') u.copy(f.region, f.offset, Buffer.alloc(P, 3), { writeProtect: true });
      else u.writeProtect(f.region, f.offset, P, false);
    });
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    uffd.register(region, { missing: true, writeProtect: true });

    const read = await touch(region, { probe: true });
    expect(h.faults.map((f) => f.kind)).toEqual(['missing', 'missing', 'missing', 'missing']);
    expect(read.checksum).toBe(3 * N);
    h.faults.length = 0;
    await touch(region, { access: 'write', probe: true, fill: 9 });
    expect(h.faults.map((f) => f.kind)).toEqual(['write-protect', 'write-protect', 'write-protect', 'write-protect']);
    expect(new Uint8Array(region.buffer)[2 * P]).toBe(9);
  });

  it('protecting never-touched anonymous pages (WP_UNPOPULATED): reads pass, writes fault', async () => {
    const N = 4;
    const h = recording((f, u) => u.writeProtect(f.region, f.offset, P, false));
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    if (!(uffd.features.raw & (1n << 13n))) return; // kernel older than 6.4: nothing to show
    uffd.register(region, { missing: false, writeProtect: true });
    uffd.writeProtect(region, 0, N * P, true);
    const read = await touch(region, { probe: true });
    expect(h.faults).toHaveLength(0);
    expect(read.checksum).toBe(0);
    await touch(region, { access: 'write', probe: true, fill: 5 });
    expect(h.faults).toHaveLength(N);
    expect(h.faults.every((f) => f.kind === 'write-protect')).toBe(true);
  });
});

describe('minor faults (memfd memory)', () => {
  it('pages in the page cache but not mapped fault as minor and resolve with continue()', async () => {
    const N = 8;
    const region = own(mapRegion(N * P, { shared: true }));
    const device = own(region.alias());
    new Uint8Array(device.buffer).fill(0x55); // page cache filled through the second view
    expect(Array.from(region.mapped()).every((m) => m === 0)).toBe(true);
    expect(region.residentPages()).toBe(N);

    // The handler updates the page through the other view, then maps it here with CONTINUE.
    const h = recording((f, u) => {
      new Uint8Array(device.buffer, f.offset, P).fill(0x60 + f.offset / P);
      u.continue(f.region, f.offset, P);
    });
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    expect(uffd.features.minor).toBe(true);
    uffd.register(region, { minor: true, missing: false });

    const res = await touch(region);
    expect(offsets(h.faults)).toEqual(range(0, N));
    expect(h.faults.every((f) => f.kind === 'minor')).toBe(true);
    for (let i = 0; i < N; i++) expect(res.data![i * P + 100]).toBe(0x60 + i);
    expect(Array.from(region.mapped()).every((m) => m === 1)).toBe(true);

    // unmapPages() zaps the page table entries but keeps the page cache: minor faults again.
    region.unmapPages(2 * P, 2 * P);
    h.faults.length = 0;
    const again = await touch(region, { probe: true });
    expect(offsets(h.faults)).toEqual([2, 3]);
    expect(again.checksum).toBe(range(0, N).reduce((s, i) => s + 0x60 + i, 0));
  });

  it('pages written then unmapped fault as minor and continue() maps their data', async () => {
    const N = 4;
    const region = own(mapRegion(N * P, { shared: true }));
    new Uint8Array(region.buffer).set(pattern(N, 0x70));
    region.unmapPages();
    const h = recording((f, u) => u.continue(f.region, f.offset, P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    uffd.register(region, { minor: true, missing: false });
    const res = await touch(region);
    expect(h.faults).toHaveLength(N);
    expect(res.data!.equals(pattern(N, 0x70))).toBe(true);
  });
});

describe('the JS thread is never blocked by its own faults', () => {
  it('reads and writes never-touched registered pages while the toucher waits on the handler', async () => {
    const N = 64;
    const T = 16; // the toucher's pages; the JS thread uses the others
    const h = recording(async (f, u) => {
      await sleep(5); // resolve later, from the event loop
      u.copy(f.region, f.offset, Buffer.alloc(P, 1 + f.offset / P));
    });
    const { region, uffd } = setup(N, h);
    const ownFaults: Fault[] = [];
    uffd.on('fault', (f: Fault) => {
      if (f.resolvedBy === 'native') ownFaults.push(f);
    });

    const toucher = touch(region, { length: T * P });
    await h.first; // the toucher is now blocked in the kernel on page 0
    expect(uffd.pending).toBe(1);
    const view = new Uint8Array(region.buffer);
    let sum = 0;
    for (let p = T; p < N; p++) {
      sum += view[p * P + 100]!; // a read of a page nobody provided: resolved natively, zeros
      view[p * P + 200] = p;
    }
    expect(sum).toBe(0);
    // Nothing the JS thread did waited on the handler, which has not run again yet.
    expect(h.faults).toHaveLength(1);
    for (let p = T; p < N; p++) expect(view[p * P + 200]).toBe(p);

    const res = await toucher;
    for (let p = 0; p < T; p++) expect(res.data![p * P]).toBe(1 + p);
    expect(h.faults).toHaveLength(T);
    await until('reports of the JS thread faults', () => ownFaults.length === N - T);
    expect(ownFaults.every((f) => f.threadId === uffd.handlerThreadId && f.kind === 'missing')).toBe(true);
    expect(ownFaults.map((f) => f.offset / P)).toEqual(range(T, N));
    if (uffd.features.exactAddress) {
      expect(ownFaults[0]!.address).toBe(region.address + BigInt(T * P + 100));
    }
    expect(uffd.stats()).toMatchObject({ forwarded: T, resolvedNatively: N - T });
  });
});

describe('the guard thread of event-loop delivery', () => {
  const switches = (tid: string): number => {
    const s = readFileSync(`/proc/self/task/${tid}/status`, 'utf8');
    return Number(/^voluntary_ctxt_switches:\s*(\d+)/m.exec(s)![1]) + Number(/^nonvoluntary_ctxt_switches:\s*(\d+)/m.exec(s)![1]);
  };

  it('sleeps while idle (no periodic tick), and still serves faults after', async () => {
    const before = new Set(readdirSync('/proc/self/task'));
    const h = recording((f, u) => u.zeropage(f.region, f.offset, P));
    const { region } = setup(4, h);
    const guard = readdirSync('/proc/self/task').filter((t) => !before.has(t));
    expect(guard.length).toBeGreaterThan(0);
    await sleep(200); // a few ticks, then it stops ticking
    const start = guard.map(switches);
    await sleep(1000);
    const woken = guard.map(switches).reduce((n, x, i) => n + x - start[i]!, 0);
    expect(woken).toBeLessThanOrEqual(2); // it ticked 100 times a second before
    const r = await touch(region, { probe: true });
    expect(r.pages).toBe(4);
    expect(h.faults).toHaveLength(4);
  });
});
