// Errors: bad arguments are refused in TypeScript before any syscall (the raw binding is never
// called), and failed syscalls become Node-style errors naming the operation and the fix.
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { binding } from '../native/index.js';
import { mapRegion, touch, Userfaultfd, type SystemError } from '../lib/index.js';
import { report, requireDist, runFixture } from './child.js';
import { closer, P } from './helpers.js';

const own = closer();

afterEach(() => {
  vi.restoreAllMocks();
});

interface Refusal {
  name: string;
  code: string;
}

/** What `fn` threw: its class name and code. */
function refusal(fn: () => unknown): Refusal | undefined {
  try {
    fn();
  } catch (err) {
    return { name: (err as Error).constructor.name, code: (err as { code: string }).code };
  }
  return undefined;
}

const TYPE = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' };
const RANGE = { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' };
const VALUE = { name: 'TypeError', code: 'ERR_INVALID_ARG_VALUE' };
const CLOSED = { name: 'PfrError', code: 'ERR_PFR_CLOSED' };

/** Spy on raw binding calls so a test can prove none was made. */
function spyOn(...names: (keyof typeof binding)[]): { calls(): number } {
  const raw = binding as unknown as Record<string, (...args: unknown[]) => unknown>;
  const spies = names.map((n) => vi.spyOn(raw, n));
  return { calls: () => spies.reduce((s, sp) => s + sp.mock.calls.length, 0) };
}

describe('bad arguments are refused before any syscall', () => {
  it('mapRegion', () => {
    const raw = spyOn('mapRegion');
    expect(refusal(() => mapRegion(0))).toEqual(RANGE);
    expect(refusal(() => mapRegion(-P))).toEqual(RANGE);
    expect(refusal(() => mapRegion(P + 0.5))).toEqual(RANGE);
    expect(refusal(() => mapRegion(Number.NaN))).toEqual(RANGE);
    expect(refusal(() => mapRegion('4096' as unknown as number))).toEqual(TYPE);
    expect(refusal(() => mapRegion(P + 1))).toEqual(VALUE);
    expect(refusal(() => mapRegion(P, { hugePages: true }))).toEqual(VALUE);
    expect(refusal(() => mapRegion(P, { shared: 'yes' as unknown as boolean }))).toEqual(TYPE);
    expect(refusal(() => mapRegion(P, 5 as never))).toEqual(TYPE);
    expect(raw.calls()).toBe(0);
  });

  it('region ranges: unaligned, outside, empty, negative, non-integer', () => {
    const r = own(mapRegion(4 * P));
    const raw = spyOn('residency', 'populate', 'evict', 'zap', 'pin', 'pagemap');
    const ops: [string, (o?: number, l?: number) => unknown][] = [
      ['residency', (o, l) => r.residency(o, l)],
      ['populate', (o, l) => r.populate(o, l)],
      ['evict', (o, l) => r.evict(o, l)],
      ['unmapPages', (o, l) => r.unmapPages(o, l)],
      ['pin', (o, l) => r.pin(o, l)],
      ['mapped', (o, l) => r.mapped(o, l)],
    ];
    for (const [name, op] of ops) {
      expect({ name, r: refusal(() => op(1, P)) }).toEqual({ name, r: RANGE }); // unaligned offset
      expect({ name, r: refusal(() => op(5 * P, P)) }).toEqual({ name, r: RANGE }); // starts outside
      expect({ name, r: refusal(() => op(3 * P, 2 * P)) }).toEqual({ name, r: RANGE }); // ends outside
      expect({ name, r: refusal(() => op(0, 0)) }).toEqual({ name, r: RANGE }); // empty
      expect({ name, r: refusal(() => op(0, -P)) }).toEqual({ name, r: RANGE }); // negative
      expect({ name, r: refusal(() => op(0, P / 2 + 0.5)) }).toEqual({ name, r: RANGE }); // non-integer
      expect({ name, r: refusal(() => op('0' as unknown as number, P)) }).toEqual({ name, r: TYPE });
    }
    expect(refusal(() => r.populate(0, P, { write: 1 as unknown as boolean }))).toEqual(TYPE);
    expect(raw.calls()).toBe(0);
  });

  it('Userfaultfd.open options', () => {
    const raw = spyOn('uffdOpen');
    expect(refusal(() => Userfaultfd.open({ timeoutMs: 0 }))).toEqual(RANGE);
    expect(refusal(() => Userfaultfd.open({ timeoutMs: 2.5 }))).toEqual(RANGE);
    expect(refusal(() => Userfaultfd.open({ timeoutMs: '100' as unknown as number }))).toEqual(TYPE);
    expect(refusal(() => Userfaultfd.open({ handler: 1 as never }))).toEqual(TYPE);
    expect(refusal(() => Userfaultfd.open({ userModeOnly: 'no' as never }))).toEqual(TYPE);
    expect(refusal(() => Userfaultfd.open({ features: 1 as never }))).toEqual(VALUE);
    expect(raw.calls()).toBe(0);
  });

  it('register / unregister', () => {
    const r = own(mapRegion(4 * P));
    const uffd = own(Userfaultfd.open());
    const raw = spyOn('uffdRegister', 'uffdUnregister');
    expect(refusal(() => uffd.register(r, { offset: 100 }))).toEqual(RANGE);
    expect(refusal(() => uffd.register(r, { length: P + 1 }))).toEqual(RANGE); // whole pages only
    expect(refusal(() => uffd.register(r, { offset: 2 * P, length: 4 * P }))).toEqual(RANGE);
    expect(refusal(() => uffd.register(r, { missing: false }))).toEqual(VALUE); // no mode at all
    expect(refusal(() => uffd.register(r, { minor: true }))).toEqual(VALUE); // minor needs memfd memory
    expect(refusal(() => uffd.register(r, { writeProtect: 1 as never }))).toEqual(TYPE);
    expect(refusal(() => uffd.unregister(r, { length: 0 }))).toEqual(RANGE);
    expect(raw.calls()).toBe(0);
  });

  it('copy / zeropage / continue / writeProtect / wake', () => {
    const r = own(mapRegion(4 * P));
    const unregistered = own(mapRegion(P));
    const uffd = own(Userfaultfd.open());
    uffd.register(r);
    const raw = spyOn('uffdCopy', 'uffdZeropage', 'uffdContinue', 'uffdWriteProtect', 'uffdWake');
    expect(refusal(() => uffd.copy(r, 0, Buffer.alloc(100)))).toEqual(RANGE); // not whole pages
    expect(refusal(() => uffd.copy(r, 1, Buffer.alloc(P)))).toEqual(RANGE);
    expect(refusal(() => uffd.copy(r, 4 * P, Buffer.alloc(P)))).toEqual(RANGE);
    expect(refusal(() => uffd.copy(r, 0, Buffer.alloc(P), { length: 2 * P }))).toEqual(RANGE); // longer than data
    expect(refusal(() => uffd.copy(r, 0, 'text' as never))).toEqual(VALUE);
    expect(refusal(() => uffd.copy(unregistered, 0, Buffer.alloc(P)))).toEqual({ name: 'PfrError', code: 'ERR_PFR_NOT_REGISTERED' });
    expect(refusal(() => uffd.zeropage(r, 0, 0))).toEqual(RANGE);
    expect(refusal(() => uffd.zeropage(r, 0, -P))).toEqual(RANGE);
    expect(refusal(() => uffd.continue(r, P / 2, P))).toEqual(RANGE);
    expect(refusal(() => uffd.writeProtect(r, 0, P, 'on' as never))).toEqual(TYPE);
    expect(refusal(() => uffd.wake(r, 0, 1.5))).toEqual(RANGE);
    expect(raw.calls()).toBe(0);
  });

  it('touch', async () => {
    const r = own(mapRegion(2 * P));
    const raw = spyOn('touch');
    await expect(touch(r, { access: 'execute' as never })).rejects.toMatchObject(VALUE);
    await expect(touch(r, { offset: 3 })).rejects.toMatchObject(RANGE);
    await expect(touch(r, { offset: 0, length: 3 * P })).rejects.toMatchObject(RANGE);
    await expect(touch(r, { fill: 256 })).rejects.toMatchObject(RANGE);
    await expect(touch(r, { probe: 'yes' as never })).rejects.toMatchObject(TYPE);
    expect(raw.calls()).toBe(0);
  });

  it('closed objects', async () => {
    const r = mapRegion(2 * P);
    const uffd = Userfaultfd.open();
    uffd.close();
    r.close();
    const raw = spyOn('uffdRegister', 'uffdCopy', 'residency', 'touch', 'mapAlias');
    const live = own(mapRegion(P));
    expect(refusal(() => uffd.register(live))).toEqual(CLOSED);
    expect(refusal(() => uffd.copy(live, 0, Buffer.alloc(P)))).toEqual(CLOSED);
    expect(refusal(() => uffd.setTimeout(100))).toEqual(CLOSED);
    const other = own(Userfaultfd.open());
    expect(refusal(() => other.register(r))).toEqual(CLOSED);
    expect(refusal(() => r.residency())).toEqual(CLOSED);
    const shared = mapRegion(P, { shared: true });
    shared.close();
    expect(refusal(() => shared.alias())).toEqual(CLOSED);
    await expect(touch(r)).rejects.toMatchObject(CLOSED);
    expect(raw.calls()).toBe(0);
  });
});

/** The error `fn` throws, which must be a system error. */
function systemErrorOf(fn: () => unknown): SystemError {
  try {
    fn();
  } catch (err) {
    return err as SystemError;
  }
  throw new Error('expected a system error, nothing was thrown');
}

describe('failed syscalls become Node-style errors that name the fix', () => {
  it('registering a range already registered with another userfaultfd: EBUSY', () => {
    const region = own(mapRegion(2 * P));
    const a = own(Userfaultfd.open());
    const b = own(Userfaultfd.open());
    a.register(region);
    const e = systemErrorOf(() => b.register(region));
    expect(e).toMatchObject({ code: 'EBUSY', errno: -16, syscall: 'ioctl(UFFDIO_REGISTER)' });
    expect(e.message).toMatch(/^register: ioctl\(UFFDIO_REGISTER\) failed with EBUSY/);
    expect(e.message).toMatch(/unregister it there first/);
    expect(b.isRegistered(region)).toBe(false);
  });

  it('continue() on anonymous memory: EINVAL, saying continue is for shmem minor faults', () => {
    const region = own(mapRegion(P));
    const uffd = own(Userfaultfd.open());
    uffd.register(region);
    const e = systemErrorOf(() => uffd.continue(region, 0, P));
    expect(e).toMatchObject({ code: 'EINVAL', errno: -22, syscall: 'ioctl(UFFDIO_CONTINUE)' });
    expect(e.message).toMatch(/continue is for minor faults of shmem/);
  });

  it('writeProtect() on a range registered without write-protect: ENOENT, saying how to register', () => {
    const region = own(mapRegion(P));
    const uffd = own(Userfaultfd.open());
    uffd.register(region);
    const e = systemErrorOf(() => uffd.writeProtect(region, 0, P, true));
    expect(e).toMatchObject({ code: 'ENOENT', errno: -2, syscall: 'ioctl(UFFDIO_WRITEPROTECT)' });
    expect(e.message).toMatch(/writeProtect: true/);
  });

  describe('pin() past RLIMIT_MEMLOCK (a child as nobody: root has CAP_IPC_LOCK)', () => {
    beforeAll(requireDist);

    it('fails with ENOMEM naming the limit and how to raise it', async () => {
      const r = await runFixture('unprivileged.mjs', ['pin'], { asNobody: true, memlockKiB: 64 });
      expect(r.code, r.stderr).toBe(0);
      const out = report<{ uid: number; soft: number; pin: SystemError & { message: string } }>(r);
      expect(out.soft).toBe(64 * 1024);
      expect(out.pin).toMatchObject({ code: 'ENOMEM', errno: -12, syscall: 'mlock' });
      expect(out.pin.message).toMatch(/^pin: mlock failed with ENOMEM/);
      expect(out.pin.message).toMatch(/RLIMIT_MEMLOCK \(soft limit 65536 bytes\)/);
      expect(out.pin.message).toMatch(/ulimit -l/);
    });
  });
});
