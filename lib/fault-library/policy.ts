// Resolution policies: how many pages the fault library makes resident on a fault.
// touch: one page (the thesis's "touch pages one by one"); touch-ahead: the rest of the
// faulting transfer in one call, get_user_pages style (optionally capped); prefetch: learns
// sequential or strided faults per region and grows its window, shrinking on misses.
// pin and prefault are the baselines the thesis compares against: they are acted on at
// registration (mlock) and before each transfer (populate the whole buffer), not on faults.

/** How a fault is resolved: touch one page, touch-ahead (the rest of the transfer at once), an adaptive prefetch window, or the pin / prefault baselines. */
export type PolicyName = 'touch' | 'touch-ahead' | 'prefetch' | 'pin' | 'prefault';

/** Every policy name, in the order the programs print them. */
export const POLICIES: readonly PolicyName[] = ['touch', 'touch-ahead', 'prefetch', 'pin', 'prefault'];

/** Options of a policy. */
export interface PolicyOptions {
  /** touch-ahead: at most this many bytes per fault (default: no cap). */
  cap?: number;
  /** prefetch: first and largest window in pages (defaults 4 and 256). */
  minWindowPages?: number;
  /** prefetch: largest window in pages (default 256). */
  maxWindowPages?: number;
}

/** The span to make resident for one fault, before clipping to the registration. */
export interface Span {
  offset: number;
  length: number;
  /** How the pages are made resident: one touch per page, or one get_user_pages call. */
  method: 'touch' | 'gup';
}

/** Per-registration prefetcher state: the last fault and the current window. */
export class Prefetcher {
  /** Smallest window, pages. */
  readonly min: number;
  /** Largest window, pages. */
  readonly max: number;
  /** Current window, pages: doubled on a sequential fault, reset on a jump. */
  window: number;
  #last = -1;
  #stride = 0;
  /** Faults that followed the previous one in sequence. */
  hits = 0;
  /** Faults that did not. */
  misses = 0;

  constructor(minPages = 4, maxPages = 256) {
    this.min = Math.max(1, minPages);
    this.max = Math.max(this.min, maxPages);
    this.window = this.min;
  }

  /**
   * A fault at page `page`: a fault where the pattern predicted (the previous fault plus
   * its stride, or right after the last window) grows the window ×2; anything else
   * shrinks it back toward the minimum and restarts the pattern.
   */
  next(page: number): {
    /** First page of the window. */
    start: number;
    /** Pages in the window. */
    pages: number;
  } {
    const predicted = this.#last >= 0 && this.#stride !== 0 && page === this.#last + this.#stride;
    const sequential = this.#last >= 0 && page > this.#last && page <= this.#last + this.window + 1;
    if (predicted || sequential) {
      this.hits++;
      this.window = Math.min(this.max, this.window * 2);
    } else {
      this.misses++;
      this.window = Math.max(this.min, Math.floor(this.window / 2));
    }
    this.#stride = this.#last >= 0 ? page - this.#last : 0;
    this.#last = page;
    return { start: page, pages: this.window };
  }
}

/**
 * The span a policy resolves for a fault at `offset` (page-aligned) when the faulting
 * transfer still needs `remaining` bytes from there.
 */
export function spanFor(policy: PolicyName, offset: number, remaining: number, pageSize: number, opts: PolicyOptions, pf?: Prefetcher): Span {
  switch (policy) {
    case 'touch':
    case 'pin':
    case 'prefault':
      // pin/prefault registrations should not fault; if they do (THP split, reclaim),
      // resolve the least.
      return { offset, length: pageSize, method: 'touch' };
    case 'touch-ahead': {
      const want = Math.max(pageSize, remaining);
      return { offset, length: opts.cap ? Math.min(want, Math.max(pageSize, opts.cap)) : want, method: 'gup' };
    }
    case 'prefetch': {
      const w = pf!.next(offset / pageSize);
      return { offset, length: w.pages * pageSize, method: 'gup' };
    }
  }
}
