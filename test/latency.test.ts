// The package's one latency statistics: exact moments, HdrHistogram percentiles (3 significant
// digits), perftest's columns, and zero-µs samples (a modelled phase can take no time).
import { describe, expect, test } from 'vitest';
import { Histogram, latencyStats, median } from '../lib/index.js';

describe('latency statistics', () => {
  test("perftest's columns of 1..1000 µs: median, 99%, 99.9%, exact mean and population stdev", () => {
    const samples = Array.from({ length: 1000 }, (_, i) => i + 1);
    const l = latencyStats(samples.reverse());
    expect(l).toMatchObject({ count: 1000, min: 1, max: 1000, avg: 500.5 });
    expect(l.stdev).toBeCloseTo(Math.sqrt((1000 ** 2 - 1) / 12), 9);
    // The smallest value with at least p% of the samples at or below it, to 3 significant digits.
    expect(l.typical).toBeCloseTo(500, 0);
    expect(l.p99).toBeCloseTo(990, 0);
    expect(l.p999).toBeCloseTo(999, 0);
  });

  test('equal samples give exactly that value everywhere; zeros are values, not gaps', () => {
    expect(latencyStats([119.126, 119.126, 119.126])).toMatchObject({ min: 119.126, typical: 119.126, p99: 119.126, p999: 119.126, stdev: 0 });
    const h = Histogram.of([0, 0, 0, 5]);
    expect(h.quantile(0.5)).toBe(0);
    expect(h.quantile(1)).toBe(5);
    expect(h.count).toBe(4);
  });

  test('no samples: a clear error, not NaN columns', () => {
    expect(() => latencyStats([])).toThrow(RangeError);
    expect(median([])).toBeNaN();
    expect(median([3, 1, 2])).toBe(2);
    expect(new Histogram().summary()).toEqual({ count: 0, mean: 0, p50: 0, p99: 0, min: 0, max: 0 });
  });

  test('values added after a percentile was read, and past the pending buffer, all count', () => {
    // The HdrHistogram is made on first need: before it, at it and after it, no value is lost.
    const h = new Histogram();
    for (let i = 1; i <= 10; i++) h.add(i);
    expect(h.quantile(0.5)).toBeCloseTo(5, 1);
    for (let i = 11; i <= 20; i++) h.add(i);
    expect(h.quantile(0.5)).toBeCloseTo(10, 1);
    expect(h.quantile(0.95)).toBeCloseTo(19, 1);
    const big = Histogram.of(Array.from({ length: 10_001 }, (_, i) => 10_001 - i));
    expect(big.count).toBe(10_001);
    expect(big.quantile(0.5)).toBeCloseTo(5001, -1);
    expect(big.quantile(0.001)).toBeCloseTo(10, 0);
  });
});
