// Port of "sigbus": with UFFD_FEATURE_SIGBUS a missing fault raises SIGBUS in the faulting
// thread instead of an event. A native thread that gets it reports the access as failed
// (the process lives on); pages placed with UFFDIO_COPY need no fault and read back.
import { describe, expect, it } from 'vitest';
import { touch, UffdFeature } from '../../lib/index.js';
import { closer, P, pattern, recording } from '../helpers.js';
import { BOTH, open, region, touchError } from './matrix.js';

const own = closer();

describe.each(BOTH)('sigbus ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('every missing page fails the access with SIGBUS, no fault event, and Node lives', async () => {
    const N = 8;
    const h = recording(() => undefined);
    const uffd = own(open(delivery, h.handler, { features: UffdFeature.SIGBUS }));
    expect(uffd.features.sigbus).toBe(true);
    const r = own(region(N, shared));
    uffd.register(r);
    const err = await touchError(r, { probe: true });
    expect(err?.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect(err?.signal).toBe('SIGBUS');
    expect(err?.offsets).toEqual([...Array(N).keys()].map((i) => i * P));
    expect(h.faults).toHaveLength(0);
    expect(uffd.stats().events).toBe(0);
  });

  it('pages copied in before the access read back; only the rest fail', async () => {
    const N = 8;
    const uffd = own(open(delivery, undefined, { features: UffdFeature.SIGBUS }));
    const r = own(region(N, shared));
    uffd.register(r);
    const data = pattern(4, 0x61);
    expect(uffd.copy(r, 0, data)).toBe(4 * P);
    const ok = await touch(r, { length: 4 * P });
    expect(ok.data!.equals(data)).toBe(true);
    const err = (await touchError(r)) as { offsets?: number[]; result?: { data?: Buffer } } | undefined;
    expect(err?.offsets).toEqual([4, 5, 6, 7].map((i) => i * P));
    expect(err?.result?.data?.subarray(0, 4 * P).equals(data)).toBe(true);
  });
});
