// Port of "events": non-cooperative events reach the uffd. Eviction reports REMOVE on
// anonymous and on memfd memory alike; with EVENT_FORK a fork (child_process) completes,
// is reported, and leaves the parent's registrations working.
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { touch, UffdFeature } from '../../lib/index.js';
import { closer, P, recording, until } from '../helpers.js';
import { BOTH, open, pagesOf, region } from './matrix.js';

const own = closer();

describe.each(BOTH)('events ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('evict() reports REMOVE for exactly the evicted range, and the pages fault again', async () => {
    const N = 8;
    const h = recording((f, u) => u.zeropage(f.region, f.offset, P));
    const uffd = own(open(delivery, h.handler));
    expect(uffd.features.eventRemove).toBe(true);
    const removed: { address: bigint; length: number }[] = [];
    uffd.on('remove', (e) => removed.push(e));
    const r = own(region(N, shared));
    uffd.register(r);
    await touch(r, { probe: true });
    r.evict(2 * P, 3 * P);
    await until('the REMOVE event', () => removed.length > 0);
    expect(removed).toEqual([{ address: r.address + BigInt(2 * P), length: 3 * P }]);
    h.faults.length = 0;
    await touch(r, { probe: true });
    expect(pagesOf(h.faults)).toEqual([2, 3, 4]);
  });

  it('with EVENT_FORK, spawnSync completes, the fork is reported, and faults are still served', async () => {
    const h = recording((f, u) => u.copy(f.region, f.offset, Buffer.alloc(P, 0x42)));
    const uffd = own(open(delivery, h.handler, { features: UffdFeature.EVENT_FORK }));
    expect(uffd.features.eventFork).toBe(true);
    const forks: unknown[] = [];
    uffd.on('fork', (e) => forks.push(e));
    const r = own(region(4, shared));
    uffd.register(r);
    const child = spawnSync(process.execPath, ['-e', 'process.stdout.write("child ran")'], { timeout: 10_000, encoding: 'utf8' });
    expect(child.error).toBeUndefined();
    expect(child.stdout).toBe('child ran');
    await until('the FORK event', () => forks.length > 0);
    expect(uffd.stats().forks).toBeGreaterThanOrEqual(1);
    const res = await touch(r, { probe: true });
    expect(res.checksum).toBe(4 * 0x42);
    expect(pagesOf(h.faults)).toEqual([0, 1, 2, 3]);
  });
});
