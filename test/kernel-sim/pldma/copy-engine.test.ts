// The copy engine's own contract, one rule per test: which copies run inline and when their
// results settle, how a large terminate-mode copy is split across the threads (and that the
// pieces together copy exactly the bytes asked for), what a fence cancels by its key and QP
// tags, and what a closed engine answers. A copy thread is held in a genuine userfaultfd
// fault where a test needs jobs to stay queued behind it.
import { describe, expect, test } from 'vitest';
import { CopyEngine, CopyFlag, type CopyResult, CopyStatus, type CopyTag } from '../../../kernel-sim/index.js';
import { INLINE_COPY_MAX, INLINE_SAME_TURN } from '../../../kernel-sim/pldma/copy-engine.js';
import { binding } from '../../../native/index.js';
import { bytesOf, fill, holdCopyThread, P, useEnv, within } from '../helpers.js';

const env = useEnv();
const CHECKS = CopyFlag.CheckSource | CopyFlag.CheckDest;
const INLINE = CHECKS | CopyFlag.Inline;
const KiB = 1024;
const MiB = 1024 * KiB;

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** A filled source and a resident destination of `bytes` each, the destination set to 0xee. */
function regions(bytes: number) {
  const src = env.region(bytes);
  const dst = env.region(bytes);
  const data = fill(src, 0x47);
  dst.populate();
  new Uint8Array(dst.buffer).fill(0xee);
  return { src, dst, data };
}

/**
 * A one-thread engine whose thread is held in a userfaultfd fault: it copies from a
 * registered source page that is missing, tagged `heldTag`, until `release()`.
 */
async function heldEngine(heldTag: CopyTag) {
  const eng = env.track(new CopyEngine(1));
  const release = await holdCopyThread(env, eng, heldTag);
  return { eng, release };
}

describe('inline copies', () => {
  test('a copy of exactly INLINE_COPY_MAX bytes is still done inline, on the JS thread', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(INLINE_COPY_MAX);
    const p = eng.copy(src, 0, dst, 0, INLINE_COPY_MAX, INLINE);
    // Done as copy() returns: no job was queued.
    expect(eng.inflight).toBe(0);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const r = await within('inline copy', p);
    expect(r).toMatchObject({ status: CopyStatus.Ok, faultOffset: -1, tid: binding.gettid() });
  });

  test('the count of inline copies settled at once starts again each turn of the event loop', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst } = regions(4 * P);
    await nextTurn();
    // One turn with a single inline copy, then a turn with INLINE_SAME_TURN of them.
    await within('first turn', eng.copy(src, 0, dst, 0, 64, INLINE));
    await nextTurn();
    const order: Array<number | 'turn'> = [];
    setImmediate(() => order.push('turn'));
    const copies = Array.from({ length: INLINE_SAME_TURN }, (_, k) => eng.copy(src, 0, dst, 0, 64, INLINE).then(() => order.push(k)));
    await within('second turn', Promise.all(copies));
    await nextTurn();
    // Every one of them settled before the event loop turned.
    expect(order).toEqual([...Array.from({ length: INLINE_SAME_TURN }, (_, k) => k), 'turn']);
  });
});

describe('large terminate-mode copies are split across the threads', () => {
  test('1 MiB with both checks: one job per thread, the bytes right', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(MiB);
    const p = eng.copy(src, 0, dst, 0, MiB, CHECKS);
    expect(eng.inflight).toBe(2);
    const r = await within('split copy', p);
    expect(r).toMatchObject({ status: CopyStatus.Ok, faultOffset: -1 });
    expect(eng.tids).toContain(r.tid);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(eng.inflight).toBe(0);
  });

  test('never into more pieces than threads: 2 MiB on two threads is two jobs', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(2 * MiB);
    const p = eng.copy(src, 0, dst, 0, 2 * MiB, CHECKS);
    expect(eng.inflight).toBe(2);
    expect((await within('split copy', p)).status).toBe(CopyStatus.Ok);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('512 KiB (less than two pieces of SPLIT_PIECE_MIN) is one job', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(512 * KiB);
    const p = eng.copy(src, 0, dst, 0, 512 * KiB, CHECKS);
    expect(eng.inflight).toBe(1);
    expect((await within('copy', p)).status).toBe(CopyStatus.Ok);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a copy without both checks (stall mode) is one job however long', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(MiB);
    const p = eng.copy(src, 0, dst, 0, MiB, 0);
    expect(eng.inflight).toBe(1);
    expect((await within('copy', p)).status).toBe(CopyStatus.Ok);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a length that does not halve into whole pages: the last piece is shorter, no byte past the end is written', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst, data } = regions(2 * MiB);
    const length = MiB + P; // pieces of 129 and 128 pages (the first rounded up to a page)
    const p = eng.copy(src, 0, dst, 0, length, CHECKS);
    expect(eng.inflight).toBe(2);
    expect((await within('split copy', p)).status).toBe(CopyStatus.Ok);
    expect(bytesOf(dst, 0, length).equals(data.subarray(0, length))).toBe(true);
    expect(bytesOf(dst, length).every((b) => b === 0xee)).toBe(true);
  });

  test('a zero-length copy completes Ok, copying nothing', async () => {
    const eng = env.track(new CopyEngine(2));
    const { src, dst } = regions(P);
    const r = await within('empty copy', eng.copy(src, 0, dst, 0, 0, 0));
    expect(r).toMatchObject({ status: CopyStatus.Ok, faultOffset: -1 });
    expect(eng.tids).toContain(r.tid);
    expect(bytesOf(dst).every((b) => b === 0xee)).toBe(true);
  });
});

describe('fences, by the key and QP a copy was written for', () => {
  // Queued behind the held thread, one copy of each tag; which of them a fence cancels.
  const TAGS: Record<string, CopyTag> = { key5: { key: 5 }, qp3: { qp: 3 }, key3: { key: 3 }, key1: { key: 1 }, qp1: { qp: 1 }, none: {} };

  async function cancelledBy(fence: CopyTag): Promise<string[]> {
    const { eng, release } = await heldEngine({ key: 9 });
    const { src, dst, data } = regions(P);
    const names = Object.keys(TAGS);
    const copies = names.map((n) => eng.copy(src, 0, dst, 0, P, CHECKS, TAGS[n]));
    // Nothing of key 9's QP or key is fenced: the fence does not wait for the held copy.
    expect(eng.fence(fence)).toBe(true);
    expect((await release()).status).toBe(CopyStatus.Ok);
    const rs = await within('queued copies', Promise.all(copies));
    expect(rs.every((r) => r.status === CopyStatus.Ok || r.status === CopyStatus.Cancelled)).toBe(true);
    // Some copy ran: the bytes are there.
    if (rs.some((r) => r.status === CopyStatus.Ok)) expect(bytesOf(dst).equals(data)).toBe(true);
    return names.filter((_, i) => rs[i]!.status === CopyStatus.Cancelled);
  }

  test('a key fence cancels the queued copies of that key only', async () => {
    expect(await cancelledBy({ key: 5 })).toEqual(['key5']);
    expect(await cancelledBy({ key: 1 })).toEqual(['key1']);
    expect(await cancelledBy({ key: 3 })).toEqual(['key3']);
  });

  test('a QP fence cancels the queued copies of that QP only', async () => {
    expect(await cancelledBy({ qp: 1 })).toEqual(['qp1']);
    expect(await cancelledBy({ qp: 3 })).toEqual(['qp3']);
  });

  test('a fence waits for a running copy of its key, and says false when the wait times out', async () => {
    const { eng, release } = await heldEngine({ key: 9 });
    expect(eng.fence({ key: 9 }, 50)).toBe(false);
    expect((await release()).status).toBe(CopyStatus.Ok);
    expect(eng.fence({ key: 9 }, 50)).toBe(true);
  });
});

describe('errors and the closed engine', () => {
  test('a range outside a region rejects the copy', async () => {
    const eng = env.track(new CopyEngine(1));
    const { src, dst } = regions(P);
    await expect(within('rejected copy', eng.copy(src, 0, dst, P / 2, P, 0), 5000)).rejects.toThrow(/outside the region/);
    expect(eng.inflight).toBe(0);
  });

  test('a copy still queued at close settles as no copy outcome: status -1, no fault offset, no thread', async () => {
    const { eng, release } = await heldEngine({});
    const { src, dst } = regions(P);
    const queued = eng.copy(src, 0, dst, 0, P, CHECKS);
    eng.close();
    expect(await within('queued copy', queued)).toEqual({ status: -1, faultOffset: -1, ns: 0, tid: 0 });
    // The held copy's promise was settled the same way; its thread finishes once let go.
    expect((await release()).status).toBe(-1);
    expect(bytesOf(dst).every((b) => b === 0xee)).toBe(true);
  });

  test('after close: an inline copy is a rejected promise (no throw), a fence has nothing to wait for', async () => {
    const eng = new CopyEngine(1);
    const { src, dst } = regions(P);
    eng.close();
    let p: Promise<CopyResult> | undefined;
    expect(() => (p = eng.copy(src, 0, dst, 0, 64, INLINE))).not.toThrow();
    await expect(p).rejects.toThrow('copy engine is closed');
    expect(eng.fence({ key: 1 })).toBe(true);
    expect(eng.fence({ qp: 1 }, 10)).toBe(true);
  });
});
