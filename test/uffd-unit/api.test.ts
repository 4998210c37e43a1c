// Port of the kernel's UFFDIO_API checks (uffd-unit-tests.c "api"): what the handshake
// enabled is what the uffd asked for, never the whole set the kernel offers.
import { describe, expect, it } from 'vitest';
import { UffdFeature, Userfaultfd } from '../../lib/index.js';
import { closer, codeOf } from '../helpers.js';
import { DELIVERIES, open } from './matrix.js';

const own = closer();
// Bits that change fault semantics: never enabled unless asked for.
const OPT_IN = [UffdFeature.SIGBUS, UffdFeature.EVENT_FORK, UffdFeature.WP_ASYNC] as const;

describe.each(DELIVERIES)('api (%s delivery)', (delivery) => {
  it('features.raw holds what was enabled: a subset of what the kernel offers, without the opt-in bits', () => {
    const uffd = own(open(delivery));
    const { raw, available } = uffd.features;
    expect(raw & ~available).toBe(0n);
    expect(raw & UffdFeature.THREAD_ID).toBe(UffdFeature.THREAD_ID);
    for (const bit of OPT_IN) expect(raw & bit).toBe(0n);
    expect(uffd.features.sigbus).toBe(false);
    expect(uffd.features.eventFork).toBe(false);
    expect(uffd.features.writeProtectAsync).toBe(false);
    // This kernel (6.18) offers them, so "raw" really is narrower than "available".
    for (const bit of OPT_IN) expect(available & bit).toBe(bit);
  });

  it('an opt-in feature asked for is enabled and reported', () => {
    const uffd = own(open(delivery, undefined, { features: UffdFeature.SIGBUS | UffdFeature.WP_ASYNC }));
    expect(uffd.features.sigbus).toBe(true);
    expect(uffd.features.writeProtectAsync).toBe(true);
    expect(uffd.features.raw & UffdFeature.EVENT_FORK).toBe(0n);
  });

  it('the kernel features of 6.6–6.8 are enabled where offered: POISON, MOVE', () => {
    const uffd = own(open(delivery));
    expect(uffd.features.poison).toBe((uffd.features.available & UffdFeature.POISON) !== 0n);
    expect(uffd.features.move).toBe((uffd.features.available & UffdFeature.MOVE) !== 0n);
    expect(uffd.features.move).toBe(true);
  });

  it('the handshake ioctls include API, REGISTER and UNREGISTER', () => {
    const uffd = own(open(delivery));
    for (const bit of [0x3fn, 0x00n, 0x01n]) expect((uffd.ioctls >> bit) & 1n).toBe(1n);
  });
});

describe('api: bad feature requests', () => {
  it('bits no UFFD_FEATURE_* names are refused before the syscall', () => {
    expect(codeOf(() => Userfaultfd.open({ features: 1n << 40n }))).toBe('ERR_INVALID_ARG_VALUE');
    expect(codeOf(() => Userfaultfd.open({ features: -1n }))).toBe('ERR_INVALID_ARG_VALUE');
  });
});
