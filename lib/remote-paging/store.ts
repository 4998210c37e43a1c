// Page stores: where evicted pages live (EDM's DMS). A stored value is bound to its key: its
// checksum covers the pager instance, the page's address and the page's version as well as
// the bytes, so a reply for another page, another pager or an older write is refused before it
// reaches memory, like a corrupted one. The checksum is CRC-32C from the native addon
// (zlib.crc32 is missing before Node 20.15, and this is faster): one pass over the page.
import { binding } from '../../native/index.js';
import { PfrError } from '../errors.js';

/** One page on its way to or from a store: the key is the page's address (EDM's layout). */
export interface StoredPage {
  /** The page's key (its address, under the store's prefix). */
  key: string;
  /** The stored form: the page and its trailer (see encodePage). */
  value: Buffer;
}

/**
 * Where pages go when they leave memory. Batched both ways: a DM-Handler asks for every
 * page it is missing at once (prefetch), and writes a whole eviction batch at once.
 */
export interface PageStore {
  /** Store name, as stats and errors print it. */
  readonly name: string;
  /** The stored values of `keys`, in order; null for a key the store does not hold. */
  getMany(keys: string[]): Promise<(Buffer | null)[]>;
  /** Store every page; resolves once the store has acknowledged all of them. */
  setMany(pages: StoredPage[]): Promise<void>;
  /** Delete these keys (the pager's own); resolves to how many the store held. */
  deleteMany(keys: string[]): Promise<number>;
  /** Release the store's connection or memory. */
  close(): Promise<void>;
}

/** Which write of which page a stored value must be. */
export interface PageIdentity {
  /** The page's address in the pager's region (its key). */
  address: bigint;
  /** The pager's count of its writes of this page: a value with an older one is stale. */
  version: number;
}

// Stored form: [page bytes][address u64 LE][version u64 LE][page length u32 LE][crc32c u32 LE].
// The CRC runs from the instance's seed over the page (that much is the page's own checksum,
// kept to tell a clean page from a dirty one), then over the trailer up to itself.
export const TRAILER = 24;

/** The checksum seed of a pager instance: the CRC-32C of its key prefix. */
export const instanceSeed = (prefix: string): number => binding.crc32c(0, Buffer.from(prefix));

/** The page's own checksum under an instance's seed (what the eviction compares to see a change). */
export const pageCrc = (seed: number, page: Uint8Array): number => binding.crc32c(seed, page);

/** The stored form of `page` as write `id.version` of the page at `id.address`. `crc`: its pageCrc, if known. */
export function encodePage(page: Uint8Array, id: PageIdentity, seed: number, crc = pageCrc(seed, page)): Buffer {
  const n = page.length;
  const out = Buffer.allocUnsafe(n + TRAILER);
  out.set(page, 0);
  out.writeBigUInt64LE(id.address, n);
  out.writeBigUInt64LE(BigInt(id.version), n + 8);
  out.writeUInt32LE(n, n + 16);
  out.writeUInt32LE(binding.crc32c(crc, out.subarray(n, n + 20)), n + 20);
  return out;
}

/**
 * The page bytes of a stored value and their pageCrc, after checking that it is write
 * `id.version` of the page at `id.address` of this instance, whole. Anything else throws
 * ERR_PFR_PAGE_CORRUPT: it must never be written into memory.
 */
export function decodePage(value: Buffer, id: PageIdentity, seed: number, pageSize: number): { page: Buffer; crc: number } {
  const what = `page 0x${id.address.toString(16)}`;
  const corrupt = (why: string): PfrError => new PfrError('ERR_PFR_PAGE_CORRUPT', `${what}: ${why}; the page is lost`);
  if (value.length !== pageSize + TRAILER || value.readUInt32LE(pageSize + 16) !== pageSize) {
    throw corrupt(`the store returned ${value.length} bytes, not a ${pageSize}-byte page with its ${TRAILER}-byte trailer`);
  }
  const page = value.subarray(0, pageSize);
  const crc = pageCrc(seed, page);
  const sum = binding.crc32c(crc, value.subarray(pageSize, pageSize + 20));
  const stored = value.readUInt32LE(pageSize + 20);
  if (sum !== stored) {
    throw corrupt(
      `checksum mismatch (stored ${stored.toString(16)}, computed ${sum.toString(16)}): the value is corrupted or was written by another pager instance`,
    );
  }
  const address = value.readBigUInt64LE(pageSize);
  if (address !== id.address) throw corrupt(`the store answered with the value of page 0x${address.toString(16)}`);
  const version = Number(value.readBigUInt64LE(pageSize + 8));
  if (version !== id.version) throw corrupt(`the store answered with write ${version} of the page, not write ${id.version} (a stale copy)`);
  return { page, crc };
}

/**
 * The embedded store: pages in a Map of this thread. What `npm start` and the example use,
 * so remote paging works with nothing else installed.
 */
export class EmbeddedStore implements PageStore {
  /** Store name, as stats and errors print it. */
  readonly name = 'embedded';
  #pages = new Map<string, Buffer>();

  async getMany(keys: string[]): Promise<(Buffer | null)[]> {
    return keys.map((k) => this.#pages.get(k) ?? null);
  }

  async setMany(pages: StoredPage[]): Promise<void> {
    for (const p of pages) this.#pages.set(p.key, Buffer.from(p.value));
  }

  async deleteMany(keys: string[]): Promise<number> {
    let n = 0;
    for (const k of keys) if (this.#pages.delete(k)) n++;
    return n;
  }

  /** Pages stored (for tests and the example). */
  get size(): number {
    return this.#pages.size;
  }

  /** Drop every page. Idempotent. */
  async close(): Promise<void> {
    this.#pages.clear();
  }
}
