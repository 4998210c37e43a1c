// Latency statistics, one implementation for the whole package: the fault library's phase
// histograms, the examples' perftest columns and the benchmark. Percentiles come from Node's
// HdrHistogram (perf_hooks.createHistogram, 3 significant digits, values kept as ns); count,
// mean, stdev, min and max are exact. One percentile definition everywhere: HdrHistogram's
// value at percentile (the smallest recorded value with at least p% of the samples at or
// below it, to 3 significant digits).
import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';

/** The latency columns of perftest (ib_send_lat, ib_write_lat), in µs. */
export interface LatencyStats {
  /** Samples taken. */
  count: number;
  /** Smallest sample (perftest's t_min). */
  min: number;
  /** Largest sample (perftest's t_max). */
  max: number;
  /** perftest's t_typical: the median. */
  typical: number;
  /** Mean (perftest's t_avg). */
  avg: number;
  /** Standard deviation (perftest's t_stdev). */
  stdev: number;
  /** 99th percentile. */
  p99: number;
  /** 99.9th percentile. */
  p999: number;
}

const PENDING_MAX = 4096;

/** A histogram of µs values: exact moments, HdrHistogram percentiles, log2 bucket counts. */
export class Histogram {
  /** Bucket i counts values in [2^(i-1), 2^i) µs; bucket 0 those below 1 µs. */
  readonly buckets: number[] = [];
  /** Samples recorded. */
  count = 0;
  /** Sum of the samples. */
  sum = 0;
  /** Smallest sample (Infinity while empty). */
  min = Infinity;
  /** Largest sample (0 while empty). */
  max = 0;
  #sumSq = 0;
  // Recorded as ns + 1: HdrHistogram takes integers >= 1, and a 0 µs model phase is real.
  // Created on first need: each one zeroes ~360 KB of counts, and the fault library keeps
  // eight per ODP registration, which made ibv_reg_mr(ON_DEMAND) cost 0.2-0.6 ms here.
  // Until then (and at most PENDING_MAX values) the values wait in #pending.
  #hdr: RecordableHistogram | undefined;
  #pending: number[] = [];

  /** Record one value in µs; negative or non-finite values are ignored. */
  add(us: number): void {
    if (!Number.isFinite(us) || us < 0) return;
    const i = us < 1 ? 0 : Math.floor(Math.log2(us)) + 1;
    while (this.buckets.length <= i) this.buckets.push(0);
    this.buckets[i]!++;
    this.count++;
    this.sum += us;
    this.#sumSq += us * us;
    this.min = Math.min(this.min, us);
    this.max = Math.max(this.max, us);
    const ns = Math.round(us * 1000) + 1;
    if (this.#hdr) this.#hdr.record(ns);
    else if (this.#pending.push(ns) >= PENDING_MAX) this.#percentiles();
  }

  #percentiles(): RecordableHistogram {
    if (!this.#hdr) {
      this.#hdr = createHistogram();
      for (const ns of this.#pending) this.#hdr.record(ns);
      this.#pending = [];
    }
    return this.#hdr;
  }

  /** Mean of the samples (0 while empty). */
  get mean(): number {
    return this.count ? this.sum / this.count : 0;
  }

  /** Population standard deviation, as perftest prints it. */
  get stdev(): number {
    if (!this.count) return 0;
    return Math.sqrt(Math.max(0, this.#sumSq / this.count - this.mean ** 2));
  }

  /** The value at quantile q in [0, 1] (the package's one percentile definition), µs. */
  quantile(q: number): number {
    if (!this.count) return 0;
    if (q <= 0) return this.min;
    if (q >= 1) return this.max;
    // Clamp to the exact extremes: HdrHistogram's buckets are 3 significant digits wide.
    const v = (this.#percentiles().percentile(q * 100) - 1) / 1000;
    return Math.min(this.max, Math.max(this.min, v));
  }

  /** Count, mean, median, 99th percentile and extremes, as the statistics snapshots print them. */
  summary(): {
    /** Samples recorded. */
    count: number;
    /** Mean. */
    mean: number;
    /** Median. */
    p50: number;
    /** 99th percentile. */
    p99: number;
    /** Smallest sample (0 while empty). */
    min: number;
    /** Largest sample. */
    max: number;
  } {
    return { count: this.count, mean: this.mean, p50: this.quantile(0.5), p99: this.quantile(0.99), min: this.count ? this.min : 0, max: this.max };
  }

  /** perftest's latency columns. */
  latency(): LatencyStats {
    if (!this.count) throw new RangeError('Histogram.latency: no samples');
    return {
      count: this.count,
      min: this.min,
      max: this.max,
      typical: this.quantile(0.5),
      avg: this.mean,
      stdev: this.stdev,
      p99: this.quantile(0.99),
      p999: this.quantile(0.999),
    };
  }

  /** A histogram of `samples` (µs). */
  static of(samples: Iterable<number>): Histogram {
    const h = new Histogram();
    for (const s of samples) h.add(s);
    return h;
  }
}

/** perftest's latency columns of `samples` (µs). */
export function latencyStats(samples: Iterable<number>): LatencyStats {
  return Histogram.of(samples).latency();
}

/** The median of `samples` in the package's one percentile definition (NaN when empty). */
export function median(samples: Iterable<number>): number {
  const h = Histogram.of(samples);
  return h.count ? h.quantile(0.5) : NaN;
}
