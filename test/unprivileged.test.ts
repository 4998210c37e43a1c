// Dropping root: a child running as user nobody opens a userfaultfd the way an ordinary user
// can. With vm.unprivileged_userfaultfd=0 that is the UFFD_USER_MODE_ONLY fallback: user-mode
// faults are trapped and handled; a kernel access (populate) gets EFAULT, as documented.
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import { report, requireDist, runFixture } from './child.js';

interface Report {
  uid: number;
  mode?: string;
  open?: { code: string; message: string };
  faults?: number[];
  bytesOk?: boolean;
  jsRead?: number;
  jsWrite?: number;
  populate?: { code: string; errno: number; syscall: string; message: string } | null;
  stats?: { forwarded: number; resolvedNatively: number };
}

const sysctl = (): number => Number(readFileSync('/proc/sys/vm/unprivileged_userfaultfd', 'utf8').trim());

describe('as user nobody', () => {
  beforeAll(requireDist);

  it('falls back to user-mode-only and handles faults', async () => {
    const r = await runFixture('unprivileged.mjs', ['uffd'], { asNobody: true });
    expect(r.code, r.stderr).toBe(0);
    const out = report<Report>(r);
    if (process.getuid?.() === 0) expect(out.uid).toBe(65534);
    expect(out.open).toBeUndefined();
    if (sysctl() === 0) {
      expect(out.mode).toBe('user-mode-only');
      expect(out.populate).toMatchObject({ code: 'EFAULT', errno: -14, syscall: 'madvise(MADV_POPULATE_WRITE)' });
      expect(out.populate!.message).toMatch(/user-mode-only mode cannot fault from the kernel/);
    } else {
      expect(out.mode).toBe('syscall');
    }
    // A native thread's four faults reached the handler, and it read what the handler placed.
    expect(out.faults).toEqual([0, 1, 2, 3]);
    expect(out.bytesOk).toBe(true);
    // The JS thread read and wrote never-touched registered pages itself.
    expect(out.jsRead).toBe(0);
    expect(out.jsWrite).toBe(7);
    // Its two faults were resolved natively; in user-mode-only mode populate() made none.
    expect(out.stats).toMatchObject({ forwarded: 4, resolvedNatively: sysctl() === 0 ? 2 : 3 });
  });
});
