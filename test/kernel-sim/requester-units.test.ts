// The PLDMA's requester and its front (pldma.ts) at the edges the larger suites leave open:
// a peer lost under parked transfers, and what the requester puts on the wire (runs, their
// lengths and counts, the key and QP a write names), watched on the fabric's own packets.
import { describe, expect, test } from 'vitest';
import { DmaStatus } from '../../kernel-sim/index.js';
import { deferred, FaultLibrary, fill, P, post, proc, until, useEnv, within } from './helpers.js';

const env = useEnv();

describe('a peer lost', () => {
  test('ends only the transfers to that node, RETRY_EXCEEDED, naming it; the others go on', async () => {
    const sys = env.system({ nodes: 3, faultTimeoutMs: 60_000 });
    const src = env.region(2 * P);
    const d1 = env.region(2 * P);
    const d2 = env.region(2 * P);
    const data = fill(src, 0x52);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [d1]);
    const c = proc(sys.node(2), 300, 7, [d2]);
    // Both destinations fault and their libraries hold the answer: both transfers are parked.
    const hold = deferred();
    const lib1 = env.track(new FaultLibrary(b.socket, { regions: [d1], hold: () => hold.promise }));
    const lib2 = env.track(new FaultLibrary(c.socket, { regions: [d2], hold: () => hold.promise }));
    const to1 = post(sys.node(0), src, d1, { channel: 0 });
    const to2 = post(sys.node(0), src, d2, { channel: 1, dstNode: 2 });
    await until('both faults', () => lib1.faults.length === 1 && lib2.faults.length === 1);
    sys.node(0).pldma.peerLost(1);
    const c1 = await within('the transfer to node 1', to1, 3000);
    expect(c1).toMatchObject({ status: DmaStatus.RETRY_EXCEEDED, reason: 'node 1 went away (its connection shut down)', bytes: 0 });
    expect(sys.node(0).pldma.active).toBe(1);
    hold.resolve();
    const c2 = await within('the transfer to node 2', to2);
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(Buffer.from(d2.buffer).equals(data)).toBe(true);
  });
});
