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
  /**
   * Optional fast path of the DM-Handler's fetch: read and check `r.count` stored pages in one
   * request, with no object per page (see PageReads). Rejects only when nothing could be asked;
   * a store without it is read with getMany and decodePage (readStoredPages).
   */
  readPages?(r: PageReads): Promise<void>;
}

/** How the read of one stored page went (PageReads.status). */
export const ReadStatus = {
  /** Checked and copied to `out`. */
  OK: 0,
  /** The store does not hold it (ERR_PFR_PAGE_LOST). */
  LOST: 1,
  /** Not a page and its trailer (detail: the length). */
  LENGTH: 2,
  /** The checksum does not match (detail: stored, computed). */
  CHECKSUM: 3,
  /** Another page's value (detail: its address). */
  ADDRESS: 4,
  /** Another write of the page (detail: its version). */
  VERSION: 5,
  /** The store refused the request (messages[i]). */
  REFUSED: 6,
  /** The store did not answer (messages[i]). */
  UNREACHABLE: 7,
  /** The store is known down and was not asked (messages[i]). */
  DOWN: 8,
  /** The answer was not one value per page (messages[i]: what it was). */
  SHAPE: 9,
} as const;

/**
 * Stored pages to read and check in one request, laid out for a native reader: page i is the
 * page at addresses[i], which must be write versions[i] of it; its bytes land at
 * out[i * pageSize]. The DM-Handler reuses one of these for every fetch.
 */
export interface PageReads {
  /** Pages asked for. */
  count: number;
  /** Each page's address (its key). */
  addresses: Float64Array;
  /** The write each page must be. */
  versions: Float64Array;
  /** The pager instance's checksum seed. */
  seed: number;
  /** Bytes per page. */
  pageSize: number;
  /** Out: the pages' bytes. */
  out: Buffer;
  /** Out: a ReadStatus per page. */
  status: Int32Array;
  /** Out: each page's pageCrc (status OK). */
  crcs: Uint32Array;
  /** Out: two numbers per page: what a refused value said instead (see ReadStatus). */
  detail: Float64Array;
  /** Out: why, for a page whose request failed as a whole (REFUSED, UNREACHABLE, DOWN, SHAPE); undefined when none did. */
  messages: (string | undefined)[] | undefined;
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

/** The status of a stored value that is not write `id.version` of the page at `id.address`, and what it said instead. */
function refusal(value: Buffer, id: PageIdentity, seed: number, pageSize: number, detail: number[]): number {
  if (value.length !== pageSize + TRAILER || value.readUInt32LE(pageSize + 16) !== pageSize) return ((detail[0] = value.length), ReadStatus.LENGTH);
  const sum = binding.crc32c(pageCrc(seed, value.subarray(0, pageSize)), value.subarray(pageSize, pageSize + 20));
  const stored = value.readUInt32LE(pageSize + 20);
  if (sum !== stored) return ((detail[0] = stored), (detail[1] = sum), ReadStatus.CHECKSUM);
  const address = value.readBigUInt64LE(pageSize);
  if (address !== id.address) return ((detail[0] = Number(address)), ReadStatus.ADDRESS);
  const version = Number(value.readBigUInt64LE(pageSize + 8));
  if (version !== id.version) return ((detail[0] = version), ReadStatus.VERSION);
  return ReadStatus.OK;
}

/** Why a stored value was refused (LENGTH, CHECKSUM, ADDRESS, VERSION), as ERR_PFR_PAGE_CORRUPT: it must never be written into memory. */
export function corruptPage(status: number, id: PageIdentity, pageSize: number, detail: ArrayLike<number>): PfrError {
  const d0 = detail[0]!,
    d1 = detail[1]!;
  const why =
    status === ReadStatus.LENGTH
      ? `the store returned ${d0} bytes, not a ${pageSize}-byte page with its ${TRAILER}-byte trailer`
      : status === ReadStatus.CHECKSUM
        ? `checksum mismatch (stored ${d0.toString(16)}, computed ${d1.toString(16)}): the value is corrupted or was written by another pager instance`
        : status === ReadStatus.ADDRESS
          ? `the store answered with the value of page 0x${d0.toString(16)}`
          : `the store answered with write ${d0} of the page, not write ${id.version} (a stale copy)`;
  return new PfrError('ERR_PFR_PAGE_CORRUPT', `page 0x${id.address.toString(16)}: ${why}; the page is lost`);
}

/**
 * The page bytes of a stored value and their pageCrc, after checking that it is write
 * `id.version` of the page at `id.address` of this instance, whole. Anything else throws
 * ERR_PFR_PAGE_CORRUPT: it must never be written into memory.
 */
export function decodePage(value: Buffer, id: PageIdentity, seed: number, pageSize: number): { page: Buffer; crc: number } {
  const detail: number[] = [0, 0];
  const status = refusal(value, id, seed, pageSize, detail);
  if (status !== ReadStatus.OK) throw corruptPage(status, id, pageSize, detail);
  const page = value.subarray(0, pageSize);
  return { page, crc: pageCrc(seed, page) };
}

/** PageStore.readPages for a store without it: getMany, then each value checked and copied. */
export async function readStoredPages(store: PageStore, r: PageReads): Promise<void> {
  if (store.readPages) return store.readPages(r);
  const keys = Array.from(r.addresses.subarray(0, r.count), (a) => a.toString(16));
  const values = await store.getMany(keys);
  r.messages = undefined;
  if (!Array.isArray(values) || values.length !== r.count || !values.every((v) => v === null || Buffer.isBuffer(v))) {
    const what = Array.isArray(values) ? `${values.length} values` : typeof values;
    r.messages = keys.map(() => `${what} for ${r.count} pages`);
    r.status.fill(ReadStatus.SHAPE, 0, r.count);
    return;
  }
  const detail: number[] = [0, 0];
  values.forEach((v, i) => {
    if (v === null) return void (r.status[i] = ReadStatus.LOST);
    const s = (r.status[i] = refusal(v, { address: BigInt(r.addresses[i]!), version: r.versions[i]! }, r.seed, r.pageSize, detail));
    r.detail[2 * i] = detail[0]!;
    r.detail[2 * i + 1] = detail[1]!;
    if (s !== ReadStatus.OK) return;
    r.out.set(v.subarray(0, r.pageSize), i * r.pageSize);
    r.crcs[i] = pageCrc(r.seed, v.subarray(0, r.pageSize));
  });
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
