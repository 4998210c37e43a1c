// Output helpers shared by the examples: aligned tables, perftest-style latency columns,
// sizes written the way perftest and dd take them (4K, 16M).
import { pathToFileURL } from 'node:url';
import { InvalidArgumentError } from 'commander';
import { MODEL_LABEL } from '../../kernel-sim/index.js';

export { MODEL_LABEL };
export const MEASURED_LABEL = 'measured (real time on this machine)';

/** Print rows under a header, columns right-aligned except those listed in `left`. */
export function printTable(header: string[], rows: string[][], left: ReadonlySet<number> = new Set()): void {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    ' ' + cells.map((c, i) => (left.has(i) ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ').trimEnd();
  console.log(line(header));
  for (const r of rows) console.log(line(r));
}

/** The latency columns of perftest (ib_send_lat, ib_write_lat), in µs. */
export interface LatencyStats {
  min: number;
  max: number;
  typical: number;
  avg: number;
  stdev: number;
  p99: number;
  p999: number;
}

export const LATENCY_HEADER = ['t_min[usec]', 't_max[usec]', 't_typical[usec]', 't_avg[usec]', 't_stdev[usec]', '99% percentile[usec]', '99.9% percentile[usec]'];

export function latencyStats(samples: readonly number[]): LatencyStats {
  if (samples.length === 0) throw new RangeError('latencyStats: no samples');
  const s = [...samples].sort((a, b) => a - b);
  const n = s.length;
  const avg = s.reduce((a, b) => a + b, 0) / n;
  const stdev = Math.sqrt(s.reduce((a, b) => a + (b - avg) ** 2, 0) / n);
  // perftest: the sample below which the given share of the run lies.
  const pct = (q: number) => s[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))]!;
  return { min: s[0]!, max: s[n - 1]!, typical: s[n >> 1]!, avg, stdev, p99: pct(0.99), p999: pct(0.999) };
}

export function latencyCells(l: LatencyStats): string[] {
  return [l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999].map((x) => us(x));
}

/** µs with two decimals (perftest prints two). */
export function us(x: number): string {
  return x.toFixed(2);
}

/** Bytes as 4K / 16M / 1G when they divide evenly, else the number. */
export function sizeName(bytes: number): string {
  for (const [unit, k] of [
    ['G', 2 ** 30],
    ['M', 2 ** 20],
    ['K', 2 ** 10],
  ] as const) {
    if (bytes >= k && bytes % k === 0) return `${bytes / k}${unit}`;
  }
  return String(bytes);
}

/** commander parser for sizes: 4096, 4K, 16M, 1G (binary units). */
export function parseSize(value: string): number {
  const m = /^(\d+)\s*([kmg]?)(i?b)?$/i.exec(value.trim());
  if (!m) throw new InvalidArgumentError('expected a size such as 4096, 64K or 16M');
  const mult = { '': 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30 }[m[2]!.toLowerCase() as '' | 'k' | 'm' | 'g'];
  const n = Number(m[1]) * mult;
  if (!Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError('the size must be positive');
  return n;
}

/** commander parser for a positive integer. */
export function parsePositiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError('expected a positive integer');
  return n;
}

/** A section heading. */
export function heading(title: string): void {
  console.log(`\n== ${title} ${'='.repeat(Math.max(3, 86 - title.length))}`);
}

/** True when the module at `url` is the script node was asked to run (not imported by the demo). */
export function isMain(url: string): boolean {
  return process.argv[1] !== undefined && url === pathToFileURL(process.argv[1]).href;
}
