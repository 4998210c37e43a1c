// Page stores: where evicted pages live (EDM's DMS). A page is stored under its key with a
// checksum, and a reply that does not check out is refused before it reaches memory.
import { crc32 } from 'node:zlib';
import { PfrError } from '../errors.js';

/** One page on its way to or from a store: the key is the page's address (EDM's layout). */
export interface StoredPage {
  /** The page's key (its address, under the store's prefix). */
  key: string;
  /** The stored form: checksum and page (see encodePage). */
  value: Buffer;
}

/**
 * Where pages go when they leave memory. Batched both ways: a DM-Handler asks for every
 * page it is missing at once (prefetch), and writes a whole eviction batch at once.
 */
export interface PageStore {
  /** Store name, as stats and errors print it. */
  readonly name: string;
  /** The stored values of `keys`, in order; null for a page never stored. */
  getMany(keys: string[]): Promise<(Buffer | null)[]>;
  /** Store every page; resolves once the store has acknowledged all of them. */
  setMany(pages: StoredPage[]): Promise<void>;
  /** Release the store's connection or memory. */
  close(): Promise<void>;
}

// Stored form: [crc32 of the page, u32 LE][page length, u32 LE][page bytes].
const HEADER = 8;

export function encodePage(page: Uint8Array, crc = crc32(page)): Buffer {
  const out = Buffer.allocUnsafe(HEADER + page.length);
  out.writeUInt32LE(crc >>> 0, 0);
  out.writeUInt32LE(page.length, 4);
  out.set(page, HEADER);
  return out;
}

/**
 * The page bytes of a stored value, after checking its length and checksum. A short,
 * truncated or corrupted reply throws ERR_PFR_PAGE_CORRUPT: it must never be written into
 * memory.
 */
export function decodePage(key: string, value: Buffer, pageSize: number): { page: Buffer; crc: number } {
  if (value.length !== HEADER + pageSize || value.readUInt32LE(4) !== pageSize) {
    throw new PfrError('ERR_PFR_PAGE_CORRUPT', `page ${key}: the store returned ${value.length} bytes, not a ${pageSize}-byte page with its header`);
  }
  const page = value.subarray(HEADER);
  const crc = crc32(page) >>> 0;
  if (crc !== value.readUInt32LE(0)) {
    throw new PfrError(
      'ERR_PFR_PAGE_CORRUPT',
      `page ${key}: checksum mismatch (stored ${value.readUInt32LE(0).toString(16)}, got ${crc.toString(16)})`,
    );
  }
  return { page, crc };
}

export const pageCrc = (page: Uint8Array): number => crc32(page) >>> 0;

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

  /** Pages stored (for tests and the example). */
  get size(): number {
    return this.#pages.size;
  }

  /** Drop every page. Idempotent. */
  async close(): Promise<void> {
    this.#pages.clear();
  }
}
