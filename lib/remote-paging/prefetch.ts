// Adaptive prefetch for a remote-paged region, after Leap (Al Maruf & Chowdhury, ATC'20): the
// region's recent faults vote for a trend (the stride that a majority of the last deltas
// share, found with Boyer-Moore's majority vote over the newest half of the history, then over
// all of it), and the window grows with what the last one was used for: the pages used since
// the last prefetch, plus one, rounded up to a power of two, up to the configured largest
// window; at most halved at a time when they go unused. Without a trend, nothing is read ahead:
// a random scan costs what it costs without prefetch.
//
// "Used": a prefetched page is mapped, so reading it takes no fault, and user space cannot see
// a page's accessed bit. A prefetched page counts as used when it is written (the dirty scan or
// a write-protect fault says so), or when the stream's next fault lands past it in the trend's
// direction within reach of the window (the faulting thread walked through it without faulting);
// such a page joins the history as an access, so the faults that prefetch leaves (one per
// window) still show the stream's stride. A page evicted before either is counted unused.
// Accuracy = used ÷ prefetched pages.

/** Faults remembered per region. */
const HISTORY = 8;

export class Prefetcher {
  readonly maxWindow: number;
  #history = new Float64Array(HISTORY);
  #count = 0;
  #window = 0;
  #stride = 0;
  #hits = 0; // pages used since the last prefetch was issued
  // Per page: 1 while prefetched and not yet counted used.
  #pending: Uint8Array;
  #onUsed: (n: number) => void;

  /** `pages`: pages of the region; `maxWindow`: the largest window (0: no prefetch); `onUsed`: n prefetched pages were used. */
  constructor(pages: number, maxWindow: number, onUsed: (n: number) => void) {
    this.maxWindow = maxWindow;
    this.#pending = new Uint8Array(maxWindow ? pages : 0);
    this.#onUsed = onUsed;
  }

  /** The current window (pages) and stride: what the last fault planned. */
  get window(): number {
    return this.#window;
  }

  get stride(): number {
    return this.#stride;
  }

  /**
   * A fault at `page`: count the prefetched pages the stream walked through, record the
   * fault, and plan the next window. Returns the pages to read ahead (possibly none).
   */
  onFault(page: number, total: number): number[] {
    if (!this.maxWindow) return [];
    const last = this.#count ? this.#history[(this.#count - 1) % HISTORY]! : -1;
    if (this.#stride && this.#count) this.#walked(last, page);
    this.#history[this.#count++ % HISTORY] = page;
    const stride = this.#trend();
    if (!stride) {
      this.#stride = this.#window = 0;
      return [];
    }
    if (stride !== this.#stride) this.#window = 0; // a new stream starts small
    this.#stride = stride;
    const grown = this.#hits ? 2 ** Math.ceil(Math.log2(this.#hits + 1)) : 1;
    this.#window = Math.min(this.maxWindow, Math.max(grown, this.#window >> 1));
    this.#hits = 0;
    const out: number[] = [];
    for (let k = 1, q = page + stride; k <= this.#window && q >= 0 && q < total; k++, q += stride) out.push(q);
    return out;
  }

  /** A page read ahead was placed: it waits to be used. */
  placed(page: number): void {
    if (this.#pending.length) this.#pending[page] = 1;
  }

  /** A page was written: if it was read ahead and not yet counted, it was used. */
  written(page: number): void {
    if (this.#pending[page]) this.#use(page);
  }

  /** A page left memory: if it was read ahead and never counted used, it was not. */
  gone(page: number): void {
    if (this.#pending.length) this.#pending[page] = 0;
  }

  #use(page: number): void {
    this.#pending[page] = 0;
    this.#hits++;
    this.#onUsed(1);
  }

  // The pages strictly between the last fault and this one, when this one follows the trend
  // within reach of the window: the thread went through them without faulting.
  #walked(last: number, page: number): void {
    const s = this.#stride,
      d = page - last;
    if (d * s <= 0 || Math.abs(d) > Math.abs(s) * (this.#window + 2)) return;
    for (let q = last + Math.sign(d); q !== page; q += Math.sign(d)) {
      if (!this.#pending[q]) continue;
      this.#use(q);
      this.#history[this.#count++ % HISTORY] = q; // an access, as the faults are: the trend stays visible
    }
  }

  // Leap's FINDTREND: the majority delta of the newest half of the history, else of all of it; 0 if none.
  #trend(): number {
    const n = Math.min(this.#count, HISTORY);
    if (n < 3) return 0;
    for (const span of [Math.max(2, n >> 1), n - 1]) {
      let candidate = 0,
        votes = 0;
      for (let i = 0; i < span; i++) {
        const d = this.#delta(i);
        if (votes === 0) candidate = d;
        votes += d === candidate ? 1 : -1;
      }
      let count = 0;
      for (let i = 0; i < span; i++) if (this.#delta(i) === candidate) count++;
      if (candidate !== 0 && count > span / 2) return candidate;
    }
    return 0;
  }

  // The i-th newest delta between consecutive faults.
  #delta(i: number): number {
    const at = (k: number) => this.#history[(this.#count - 1 - k) % HISTORY]!;
    return at(i) - at(i + 1);
  }
}
