// mapRegion refuses, before any mmap, a size JavaScript cannot hold as one ArrayBuffer
// (2^32 + 4096 used to map, fail to wrap, and abort the process with a double free).
import { kMaxLength } from 'node:buffer';
import { expect, test } from 'vitest';
import { mapRegion, PAGE_SIZE } from '../lib/index.js';

test('mapRegion(2 ** 32 + 4096): a RangeError naming the limit, and the process lives on', () => {
  let err: (Error & { code?: string }) | undefined;
  try {
    mapRegion(2 ** 32 + 4096).close();
  } catch (e) {
    err = e as Error & { code?: string };
  }
  expect(err).toBeInstanceOf(RangeError);
  expect(err!.code).toBe('ERR_OUT_OF_RANGE');
  expect(err!.message).toContain(String(kMaxLength));
  // The next mapping works: nothing was left half-made.
  const r = mapRegion(PAGE_SIZE);
  new Uint8Array(r.buffer)[0] = 7;
  expect(new Uint8Array(r.buffer)[0]).toBe(7);
  r.close();
});
