// Cancelling a transfer with an AbortSignal (what destroying a queue pair does): the
// engine stops it, FLUSHED, instead of retransmitting and writing after the flush.
import { describe, expect, test } from 'vitest';
import { DmaStatus } from '../../kernel-sim/index.js';
import { bytesOf, deferred, FaultLibrary, fill, P, proc, sleep, until, useEnv, within } from './helpers.js';

const env = useEnv();

function rig(pages: number) {
  const sys = env.system({ nodes: 2 });
  const src = env.region(pages * P);
  const dst = env.region(pages * P);
  fill(src, 1);
  proc(sys.node(0), 100, 7, [src]);
  const b = proc(sys.node(1), 200, 7, [dst]);
  return { sys, src, dst, b };
}

describe('cancelling a transfer', () => {
  test('aborted while parked on a destination fault: FLUSHED at once, no retransmission, nothing written', async () => {
    const pages = 4;
    const { sys, src, dst, b } = rig(pages);
    const release = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], hold: () => release.promise }));
    const ac = new AbortController();
    const pc = sys.node(0).pldma.post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: pages * P, pd: 7 }, { signal: ac.signal });
    await until('the first fault', () => lib.faults.length === 1);
    ac.abort();
    const c = await within('cancelled transfer', pc);
    expect(c.status).toBe(DmaStatus.FLUSHED);
    expect(c.reason).toMatch(/cancelled/);
    expect(c.bytes).toBe(0);
    expect(sys.node(0).pldma.active).toBe(0);
    // The late answer finds nothing to retransmit.
    release.resolve();
    await sleep(20);
    expect(lib.faults).toHaveLength(1);
    expect(sys.node(0).pldma.counters().retransmittedBlocks).toBe(0);
    expect(bytesOf(dst).every((x) => x === 0)).toBe(true);
  });

  test('a signal aborted before the post: FLUSHED, no block issued', async () => {
    const { sys, src, dst } = rig(1);
    const ac = new AbortController();
    ac.abort();
    const c = await within('transfer', sys.node(0).pldma.post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: P, pd: 7 }, { signal: ac.signal }));
    expect(c.status).toBe(DmaStatus.FLUSHED);
    expect(sys.node(0).pldma.counters().blocksIssued).toBe(0);
  });

  test('a signal never aborted changes nothing; aborting after the completion is a no-op', async () => {
    const { sys, src, dst, b } = rig(2);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const ac = new AbortController();
    const c = await within('transfer', sys.node(0).pldma.post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: 2 * P, pd: 7 }, { signal: ac.signal }));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    ac.abort();
    expect(sys.node(0).pldma.counters()).toMatchObject({ completed: 1, errors: 0 });
    expect(bytesOf(dst).equals(bytesOf(src))).toBe(true);
  });
});
