// The stored page's checksum: CRC-32C from the native addon (zlib.crc32 is missing before
// Node 20.15), checked against a bitwise reference at every length and alignment its fast
// paths split at; and the stored form binds a page to its pager, address and version.
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { binding } from '../../native/index.js';
import { decodePage, encodePage, instanceSeed } from '../../lib/remote-paging/store.js';
import { P } from '../helpers.js';

const TABLE = Array.from({ length: 256 }, (_, i) => {
  let c = i;
  for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  return c >>> 0;
});
const reference = (seed: number, bytes: Uint8Array): number => {
  let c = ~seed >>> 0;
  for (const x of bytes) c = (TABLE[(c ^ x) & 0xff]! ^ (c >>> 8)) >>> 0;
  return ~c >>> 0;
};

describe('native crc32c', () => {
  it("is CRC-32C: the standard check value, and a seed continues a CRC (zlib's convention)", () => {
    expect(binding.crc32c(0, Buffer.from('123456789'))).toBe(0xe3069283);
    const page = randomBytes(P);
    expect(binding.crc32c(binding.crc32c(0, page.subarray(0, 1000)), page.subarray(1000))).toBe(binding.crc32c(0, page));
  });

  it('matches a bitwise reference at every length around its three-stream blocks, at any alignment', () => {
    const big = randomBytes(3 * P);
    let bad = 0;
    for (const len of [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 1536, 2303, 2304, P - 1, P, P + 24, 3 * P - 64]) {
      for (const off of [0, 1, 3, 8, 13]) {
        const v = big.subarray(off, off + len);
        if (binding.crc32c(0x1234_5678, v) !== reference(0x1234_5678, v)) bad++;
      }
    }
    expect(bad).toBe(0);
  });

  it('refuses what is not a Uint8Array', () => {
    expect(() => binding.crc32c(0, new Uint16Array(4) as unknown as Uint8Array)).toThrow(/Uint8Array/);
    expect(() => binding.crc32c(-1, Buffer.alloc(1))).toThrow(RangeError);
  });
});

describe('stored form', () => {
  const page = randomBytes(P);
  const id = { address: 0x7f12_3456_0000n, version: 5 };
  const seed = instanceSeed('app:0123456789ab');
  const value = encodePage(page, id, seed);
  const flipped = Buffer.from(value);
  flipped[17]! ^= 1;

  it('round-trips the page with its own checksum', () => {
    const back = decodePage(value, id, seed, P);
    expect(back.page.equals(page)).toBe(true);
    expect(back.crc).toBe(binding.crc32c(seed, page));
  });

  it.each([
    ['another page', () => decodePage(value, { ...id, address: id.address + BigInt(P) }, seed, P), /value of page 0x7f1234560000/],
    ['an older write', () => decodePage(value, { ...id, version: 6 }, seed, P), /write 5 of the page, not write 6 \(a stale copy\)/],
    ['another pager', () => decodePage(value, id, instanceSeed('app:ba9876543210'), P), /checksum mismatch/],
    ['a flipped bit', () => decodePage(flipped, id, seed, P), /checksum mismatch/],
    ['a short value', () => decodePage(value.subarray(0, P), id, seed, P), /returned 4096 bytes, not a 4096-byte page with its 24-byte trailer/],
  ])('refuses %s: ERR_PFR_PAGE_CORRUPT', (_, decode, message) => {
    expect(decode).toThrow(expect.objectContaining({ code: 'ERR_PFR_PAGE_CORRUPT', message: expect.stringMatching(message) }));
  });
});
