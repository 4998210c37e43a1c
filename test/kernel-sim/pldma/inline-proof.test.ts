// The inline copy's proof that every page is present (engineCopyNow, docs/threads.md): a
// pagemap read is reused only while nothing can have dropped a page. Each path that drops
// one (evict, unmapPages, pageout, UFFDIO_MOVE, close, another thread's eviction) makes the
// next inline copy read pagemap again and find the page missing, so a missing page is still
// found by a copy thread, as a fault, once, with the bytes right.
import { Worker } from 'node:worker_threads';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, test } from 'vitest';
import { CopyEngine, CopyFlag, CopyStatus } from '../../../kernel-sim/index.js';
import { binding } from '../../../native/index.js';
import { ROOT, requireDist } from '../../child.js';
import { bytesOf, fill, P, sleep, useEnv, within } from '../helpers.js';
import { closeAll, createPlayers, pollOk } from '../../verbs/helpers.js';
import { SendFlags, WrOpcode } from '../../../lib/index.js';

const env = useEnv();
afterEach(closeAll);
beforeAll(requireDist);

/** A raw native engine (engineCopyNow is the function under test), a thread engine, a filled 4-page source and a resident 4-page destination. */
function rig() {
  const raw = binding.engineCreate(1, () => {});
  env.track({ close: () => binding.engineClose(raw.handle) });
  const eng = env.track(new CopyEngine(1));
  const src = env.region(4 * P);
  const dst = env.region(4 * P);
  const data = fill(src, 0x3c);
  dst.populate();
  const out = new Float64Array(3);
  // status (-1: not every page present, nothing touched) and the pagemap reads it made.
  const copyNow = (srcOff: number, dstOff: number, len: number) => {
    const status = binding.engineCopyNow(raw.handle, src.id, srcOff, dst.id, dstOff, len, out);
    return { status, reads: out[2]! };
  };
  return { handle: raw.handle, eng, src, dst, data, copyNow };
}

/** Run `code` (an ES module body with `binding` and `Region` in scope) in a worker thread; its postMessage'd value. */
async function inWorker<T>(code: string, data: unknown): Promise<T> {
  const url = (p: string) => 'file://' + join(ROOT, p);
  const src = `
    import { parentPort, workerData } from 'node:worker_threads';
    const { binding } = await import(${JSON.stringify(url('dist/native/index.js'))});
    const { Region } = await import(${JSON.stringify(url('dist/lib/index.js'))});
    try { parentPort.postMessage(await (async () => { ${code} })()); } catch (e) { parentPort.postMessage({ error: String(e.message) }); }
  `;
  const w = new Worker(new URL('data:text/javascript,' + encodeURIComponent(src)), { workerData: data });
  try {
    return await within('worker', new Promise<T>((resolve, reject) => (w.once('message', resolve), w.once('error', reject))), 10_000);
  } finally {
    await w.terminate();
  }
}

describe('the inline presence proof', () => {
  test('one pagemap read per side proves the pages; the next copies reuse it; the bytes land each time', () => {
    const { src, dst, data, copyNow } = rig();
    // A proof lives 10 ms: two copies back to back (a GC pause between them
    // may outlast it, so a few tries).
    const pairs: Array<[number, number]> = [];
    for (let i = 0; i < 20 && !pairs.some(([, b]) => b === 0); i++) {
      new Uint8Array(src.buffer)[0] = i;
      const a = copyNow(0, 0, 64);
      const b = copyNow(0, 0, 64);
      expect([a.status, b.status]).toEqual([CopyStatus.Ok, CopyStatus.Ok]);
      pairs.push([a.reads, b.reads]);
      expect(bytesOf(dst, 0, 64).equals(bytesOf(src, 0, 64))).toBe(true);
    }
    expect(pairs[0]![0]).toBe(2);
    expect(pairs.some(([, b]) => b === 0)).toBe(true);
    // Pages next to a proved one extend it; a copy inside the extended proof reads nothing.
    let extended = false;
    for (let i = 0; i < 20 && !extended; i++) {
      const a = copyNow(P, P, P);
      const b = copyNow(0, 0, 2 * P);
      expect([a.status, b.status]).toEqual([CopyStatus.Ok, CopyStatus.Ok]);
      extended = b.reads === 0;
    }
    expect(extended).toBe(true);
    expect(bytesOf(dst, 0, 2 * P).equals(bytesOf(src, 0, 2 * P))).toBe(true);
    expect(bytesOf(src, 2 * P).equals(data.subarray(2 * P))).toBe(true);
  });

  test('a proof expires: after its time-to-live pagemap is read again', async () => {
    const { copyNow } = rig();
    expect(copyNow(0, 0, 64).reads).toBe(2);
    await sleep(15);
    expect(copyNow(0, 0, 64)).toEqual({ status: CopyStatus.Ok, reads: 2 });
  });

  const drops: Array<[string, (r: ReturnType<typeof rig>) => void | Promise<void>]> = [
    ['evict()', ({ dst }) => dst.evict(0, P)],
    ['unmapPages()', ({ dst }) => dst.unmapPages(0, P)],
    ['pageout() (a no-op for anonymous memory without swap: the proof is dropped all the same)', ({ dst }) => dst.pageout(0, P)],
  ];
  test.each(drops)('every drop path ends the proof: %s', async (_name, drop) => {
    const r = rig();
    expect(r.copyNow(0, 0, 64).reads).toBe(2);
    await drop(r);
    const gone = r.dst.residentPages(0, P) === 0;
    const after = r.copyNow(0, 0, 64);
    expect(after.reads).toBeGreaterThan(0);
    if (gone) {
      // Missing now: nothing touched inline, and a copy thread finds the fault.
      expect(after.status).toBe(-1);
      expect(r.dst.residentPages(0, P)).toBe(0);
      const f = await within('copy', r.eng.copy(r.src, 0, r.dst, 0, 64, CopyFlag.CheckSource | CopyFlag.CheckDest | CopyFlag.Inline));
      expect(f).toMatchObject({ status: CopyStatus.DestFault, faultOffset: 0 });
      expect(r.eng.tids).toContain(f.tid);
    } else {
      expect(after.status).toBe(CopyStatus.Ok);
    }
  });

  test('UFFDIO_MOVE taking the source page away ends the proof', async () => {
    const u = env.uffd();
    if (!u.features.move) return; // Linux < 6.8: no such drop path here
    const r = rig();
    const staging = env.region(P);
    u.register(staging, { missing: true });
    expect(r.copyNow(0, 0, 64).reads).toBe(2);
    expect(u.move(staging, 0, r.src, 0, P)).toBe(P);
    expect(r.copyNow(0, 0, 64)).toEqual({ status: -1, reads: 1 });
  });

  test('a page evicted by another thread (a worker holding the region) is missing for the next inline copy', async () => {
    const r = rig();
    expect(r.copyNow(0, 0, 64).reads).toBe(2);
    const resident = await inWorker<number>(
      `const reg = Region.attach(workerData); reg.evict(0, ${P}); const n = reg.residentPages(0, ${P}); reg.close(); return n;`,
      r.dst.share(),
    );
    expect(resident).toBe(0);
    expect(r.copyNow(0, 0, 64)).toEqual({ status: -1, reads: 2 });
  });

  test("bad calls: a short out array, a closed engine, a range outside the region, another thread's call", async () => {
    const { handle: h, src, dst } = rig();
    expect(() => binding.engineCopyNow(h, src.id, 0, dst.id, 0, 64, new Float64Array(1))).toThrow(RangeError);
    expect(() => binding.engineCopyNow(h, src.id, 0, dst.id, 4 * P - 10, 64, new Float64Array(2))).toThrow(/outside the region/);
    const other = await inWorker<{ error?: string }>(
      `return binding.engineCopyNow(workerData.h, workerData.s, 0, workerData.d, 0, 64, new Float64Array(2));`,
      {
        h,
        s: src.id,
        d: dst.id,
      },
    );
    expect(other.error).toMatch(/engine's own JavaScript thread/);
    binding.engineClose(h);
    expect(() => binding.engineCopyNow(h, src.id, 0, dst.id, 0, 64, new Float64Array(2))).toThrow(/closed/);
  });
});

describe('small RDMA_WRITEs around an eviction', () => {
  test('a page evicted between two 64 B writes faults once at the destination; the bytes are right each time', async () => {
    const { client, server } = createPlayers({ size: P });
    const src = new Uint8Array(client.region.buffer);
    const dst = new Uint8Array(server.region.buffer);
    const write = async (byte: number, evictFirst: () => void = () => {}) => {
      src.fill(byte, 0, 64);
      evictFirst();
      client.qp.postSend({
        wrId: byte,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: client.mr.addr, length: 64, lkey: client.mr.lkey }],
        rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
        sendFlags: SendFlags.SIGNALED,
      });
      const wc = await pollOk(client.cq);
      return wc.odp?.faults.destination ?? 0;
    };
    await write(1); // first touches of the fresh mapping
    dst.fill(0xee);
    expect(await write(2)).toBe(0);
    expect(dst.subarray(0, 64).every((b) => b === 2)).toBe(true);
    expect(await write(3, () => server.region.evict())).toBe(1);
    expect(dst.subarray(0, 64).every((b) => b === 3)).toBe(true);
    expect(dst.subarray(64).every((b) => b === 0)).toBe(true); // the rest of the evicted page: zeros
    expect(await write(4)).toBe(0);
    expect(dst.subarray(0, 64).every((b) => b === 4)).toBe(true);
    // Evicted by another thread between two writes: found all the same.
    const share = server.region.share();
    await inWorker<number>(`const reg = Region.attach(workerData); reg.evict(); reg.close(); return 0;`, share);
    expect(await write(5)).toBe(1);
    expect(dst.subarray(0, 64).every((b) => b === 5)).toBe(true);
  });
});
