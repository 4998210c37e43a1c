// Port of "register-ioctls": the ioctls UFFDIO_REGISTER says are valid on a range depend on
// the memory and the mode, as the kernel computes them.
import { describe, expect, it } from 'vitest';
import { mapRegion, Userfaultfd } from '../../lib/index.js';
import { closer, codeOf, P } from '../helpers.js';
import { DELIVERIES, open } from './matrix.js';

const own = closer();
const UFFDIO = { WAKE: 0x02n, COPY: 0x03n, ZEROPAGE: 0x04n, MOVE: 0x05n, WRITEPROTECT: 0x06n, CONTINUE: 0x07n, POISON: 0x08n };
const has = (mask: bigint, bit: bigint): boolean => ((mask >> bit) & 1n) === 1n;

describe.each(DELIVERIES)('register-ioctls (%s delivery)', (delivery) => {
  it('anon, missing: COPY, ZEROPAGE, WAKE, MOVE, POISON; not WRITEPROTECT or CONTINUE', () => {
    const uffd = own(open(delivery));
    const r = own(mapRegion(4 * P));
    const io = uffd.register(r);
    for (const b of [UFFDIO.COPY, UFFDIO.ZEROPAGE, UFFDIO.WAKE, UFFDIO.MOVE, UFFDIO.POISON]) expect(has(io, b)).toBe(true);
    expect(has(io, UFFDIO.WRITEPROTECT)).toBe(false);
    expect(has(io, UFFDIO.CONTINUE)).toBe(false);
  });

  it('anon, missing + write-protect: WRITEPROTECT too', () => {
    const uffd = own(open(delivery));
    const r = own(mapRegion(4 * P));
    expect(has(uffd.register(r, { writeProtect: true }), UFFDIO.WRITEPROTECT)).toBe(true);
  });

  it('shmem, minor: CONTINUE', () => {
    const uffd = own(open(delivery));
    const r = own(mapRegion(4 * P, { shared: true }));
    const io = uffd.register(r, { missing: false, minor: true });
    expect(has(io, UFFDIO.CONTINUE)).toBe(true);
    expect(has(io, UFFDIO.WRITEPROTECT)).toBe(false);
  });

  it('a range registered on another uffd is EBUSY, with the fix in the message', () => {
    const a = own(open(delivery));
    const b = own(open(delivery));
    const r = own(mapRegion(4 * P));
    a.register(r);
    let err: (Error & { code?: string; syscall?: string }) | undefined;
    try {
      b.register(r);
    } catch (e) {
      err = e as Error & { code?: string; syscall?: string };
    }
    expect(err?.code).toBe('EBUSY');
    expect(err?.syscall).toBe('ioctl(UFFDIO_REGISTER)');
    expect(err?.message).toMatch(/unregister it there first/);
  });

  it('minor on anonymous memory is refused before the syscall', () => {
    const uffd = own(Userfaultfd.open({ delivery }));
    const r = own(mapRegion(4 * P));
    expect(codeOf(() => uffd.register(r, { minor: true }))).toBe('ERR_INVALID_ARG_VALUE');
  });
});
