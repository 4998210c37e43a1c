// The resident-page table (EDM's LSPT): what the DM-Handler knows of each page of a remote-
// paged region, the second-chance clock the eviction worker picks victims with, and which
// write of each page the store holds (its version), so that a page the store lost or answers
// wrongly for is an error, never the zero page.

export type PageState = 'fetching' | 'resident' | 'evicting';

export interface PageEntry {
  state: PageState;
  /** Checksum of the bytes as they were placed (or last written back): a page whose bytes
   *  still match it is clean, whatever the dirty bit missed. */
  crc: number;
  /** Written since placed or written back (PAGEMAP_SCAN WRITTEN, or a write-protect fault). */
  dirty: boolean;
  /** Second chance: used since the clock hand last passed. */
  referenced: boolean;
  /** Settles when the fetch or eviction in progress ends. */
  settled?: Promise<void>;
}

export class ResidentPageTable {
  #entries = new Map<number, PageEntry>();
  // Resident pages in clock order: a Map keeps insertion order, so the front is the hand.
  #clock = new Map<number, true>();
  // The version of the write of each page the store acknowledged last. Versions come from one
  // counter, so no two writes share one: a stale or replayed value cannot pass for a new one.
  #stored = new Map<number, number>();
  // Every page a write went out for, acknowledged or not (a lost reply may hide a stored
  // value): the keys close() deletes.
  #written = new Set<number>();
  #version = 0;

  /** The version of the page's copy in the store; undefined for a page never stored (the zero page). */
  storedVersion(page: number): number | undefined {
    return this.#stored.get(page);
  }

  /** The version of a write of `page` about to go to the store. */
  nextVersion(page: number): number {
    this.#written.add(page);
    return ++this.#version;
  }

  /** The store acknowledged write `version` of `page`. Writes of one page reach the store in the order they were issued (one connection), so the highest acknowledged is what it holds. */
  stored(page: number, version: number): void {
    if ((this.#stored.get(page) ?? 0) < version) this.#stored.set(page, version);
  }

  /** Every page whose key the store may hold. */
  written(): number[] {
    return [...this.#written];
  }

  get(page: number): PageEntry | undefined {
    return this.#entries.get(page);
  }

  /** Pages resident or on their way in. */
  get resident(): number {
    return this.#entries.size;
  }

  fetching(page: number, settled: Promise<void>): PageEntry {
    const e: PageEntry = { state: 'fetching', crc: 0, dirty: false, referenced: true, settled };
    this.#entries.set(page, e);
    return e;
  }

  placed(page: number, crc: number): void {
    const e = this.#entries.get(page) ?? { state: 'resident', crc, dirty: false, referenced: true };
    Object.assign(e, { state: 'resident', crc, dirty: false, referenced: true, settled: undefined });
    this.#entries.set(page, e);
    this.#clock.delete(page);
    this.#clock.set(page, true);
  }

  /** The page left memory (evicted, failed, or dropped by someone else). */
  drop(page: number): void {
    this.#entries.delete(page);
    this.#clock.delete(page);
  }

  markDirty(page: number): void {
    const e = this.#entries.get(page);
    if (e && e.state === 'resident') e.dirty = e.referenced = true;
  }

  /**
   * Up to `n` victims by second chance: the hand takes the oldest resident page; one used
   * since its last pass gets its bit cleared and goes to the back instead.
   */
  victims(n: number): number[] {
    const out: number[] = [];
    let passes = this.#clock.size * 2; // every page can be passed once, then taken
    for (const page of this.#clock.keys()) {
      if (out.length >= n || passes-- <= 0) break;
      const e = this.#entries.get(page);
      this.#clock.delete(page);
      if (!e || e.state !== 'resident') continue;
      if (e.referenced) {
        e.referenced = false;
        this.#clock.set(page, true); // second chance: to the back of the clock
      } else {
        out.push(page);
      }
    }
    return out;
  }

  /** Every page the table holds, for flush and close. */
  pages(state: PageState = 'resident'): number[] {
    return [...this.#entries].filter(([, e]) => e.state === state).map(([p]) => p);
  }
}
