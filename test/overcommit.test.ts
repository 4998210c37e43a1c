// Overcommit on real memory: ODP MRs over 4× the machine's RAM register at once, a sparse RDMA
// WRITE workload completes and only the pages written become resident; the same registered
// pinned (in a child with RLIMIT_MEMLOCK lowered and CAP_IPC_LOCK dropped) fails at
// registration with the library's error naming the limit.
import { totalmem } from 'node:os';
import { beforeAll, describe, expect, it } from 'vitest';
import { overcommit } from '../cli/programs/overcommit.js';
import { requireDist } from './child.js';

describe('pagefault-rdma overcommit', () => {
  beforeAll(requireDist);

  it('ODP over 4× the RAM: registered, completed, sparse; pinned: refused at registration naming RLIMIT_MEMLOCK', async () => {
    const r = await overcommit({ ratio: 4, writes: 16, memlockKiB: 1024 });
    const odp = r.odp!;
    expect(odp.error).toBeUndefined();
    expect(odp.registeredBytes).toBeGreaterThanOrEqual(4 * totalmem() - 4096);
    expect(odp.mrs).toBe(Math.ceil(odp.registeredBytes / r.regionBytes));
    expect(odp.completion).toBe('16 × success');
    expect(odp.bytesOk).toBe(true);
    expect(odp.residentPages).toBe(16); // the pages written, nothing else
    expect(odp.rssAfter - odp.rssBefore).toBeLessThan(totalmem() / 4);
    // One implicit ODP MR reaches all of it: a write into each region's last page, each made resident.
    expect(odp.implicit).toMatchObject({ completion: `${odp.mrs} × success`, bytesOk: true, residentPagesAdded: odp.mrs });

    const pinned = r.pinned!;
    expect(pinned.memlockSoft).toBe(1024 * 1024);
    expect(pinned.capIpcLock).toBe(false);
    expect(pinned.mrs).toBe(0);
    expect(pinned.registeredBytes).toBe(0);
    expect(pinned.error).toMatchObject({ code: 'ENOMEM', syscall: 'mlock' });
    expect(pinned.error!.message).toMatch(/past RLIMIT_MEMLOCK \(soft limit 1048576 bytes\).*ulimit -l/);
    expect(pinned.completion).toBe('nothing posted: the registration failed');
    expect(pinned.residentPages).toBe(0);
  }, 120_000);

  it('the pinned side alone never pins past a limit that would not stop it', async () => {
    // This process (root in CI) may lock without limit: pinned registration of 4× RAM is not tried.
    const r = await overcommit({ ratio: 4, side: 'pinned' });
    const p = r.pinned!;
    expect(p.mrs).toBe(0);
    if (p.capIpcLock || p.memlockSoft < 0) expect(p.error!.message).toMatch(/^not tried: .*would lock the machine's memory/);
    else expect(p.error).toMatchObject({ code: 'ENOMEM' });
  });
});
