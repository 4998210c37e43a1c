// Output helpers shared by the programs: the one table printer (rows printed as they finish),
// text wrapped to 100 columns, perftest-style latency columns, sizes written and read the way
// perftest and dd take them (4K, 64M).
import { InvalidArgumentError } from 'commander';
import { MODEL_LABEL } from '../../kernel-sim/index.js';
import type { LatencyStats } from '../../lib/index.js';

export { MODEL_LABEL };
export const MEASURED_LABEL = 'measured (real time on this machine)';

/** Every line the programs print fits this many columns. */
export const COLUMNS = 100;

/**
 * Print text wrapped to COLUMNS at spaces; continuation lines are indented by `indent` spaces
 * (default: the text's own leading spaces + 2). Several lines (\n) are wrapped one by one.
 */
export function print(text = '', indent?: number): void {
  for (const line of text.split('\n')) for (const l of wrap(line, indent)) console.log(l);
}

export function wrap(line: string, indent?: number): string[] {
  if (line.length <= COLUMNS) return [line];
  const lead = indent ?? /^ */.exec(line)![0].length + 2;
  const out: string[] = [];
  let rest = line;
  let prefix = '';
  while (prefix.length + rest.length > COLUMNS) {
    const room = COLUMNS - prefix.length;
    let cut = rest.lastIndexOf(' ', room);
    if (cut <= 0) cut = room; // one long word: break it
    out.push((prefix + rest.slice(0, cut)).trimEnd());
    rest = rest.slice(cut).trimStart();
    prefix = ' '.repeat(lead);
  }
  if (rest) out.push(prefix + rest);
  return out;
}

/** A table column: its header and the width its cells are padded to (at least the header's). */
export interface Column {
  header: string;
  width?: number;
  /** Left-aligned (text); numbers are right-aligned. */
  left?: boolean;
}

/**
 * The one table printer. Widths are fixed up front so that each row can be printed the moment
 * it is measured; a cell wider than its column pushes the rest of that row only. A header
 * that does not fit 100 columns is split over two lines at its spaces.
 */
export class Table {
  readonly columns: Array<Required<Column>>;

  constructor(columns: Column[]) {
    this.columns = columns.map((c) => ({ header: c.header, left: c.left ?? false, width: Math.max(c.width ?? 0, headerWidth(c.header)) }));
  }

  /** Print the header line(s). */
  header(): void {
    const split = this.columns.map((c) => splitHeader(c.header, c.width));
    if (split.some((s) => s.length === 2)) console.log(this.#line(split.map((s) => (s.length === 2 ? s[0] : ''))));
    console.log(this.#line(split.map((s) => (s.length === 2 ? s[1] : s[0]))));
  }

  /** Print one row now. */
  row(cells: string[]): void {
    console.log(this.#line(cells));
  }

  #line(cells: Array<string | undefined>): string {
    return (
      ' ' +
      cells
        .map((c = '', i) => {
          const col = this.columns[i];
          if (!col) return c;
          return col.left ? c.padEnd(col.width) : c.padStart(col.width);
        })
        .join('  ')
    ).trimEnd();
  }
}

// A header may go over two lines ("99.9%" over "[usec]"): its width is the wider half.
function splitHeader(h: string, width: number): [string | undefined, string] | [string] {
  if (h.length <= width) return [h];
  const cut = h.lastIndexOf(' ', width);
  return cut > 0 ? [h.slice(0, cut), h.slice(cut + 1)] : [h];
}

function headerWidth(h: string): number {
  const i = h.lastIndexOf(' ');
  return i < 0 ? h.length : Math.max(i, h.length - i - 1);
}

/** perftest's latency columns (ib_send_lat, ib_write_lat), µs. */
export const LATENCY_COLUMNS: Column[] = [
  { header: 't_min [usec]', width: 8 },
  { header: 't_max [usec]', width: 8 },
  { header: 't_typical [usec]', width: 9 },
  { header: 't_avg [usec]', width: 8 },
  { header: 't_stdev [usec]', width: 8 },
  { header: '99% [usec]', width: 8 },
  { header: '99.9% [usec]', width: 8 },
];

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

/** Parse a size as perftest and dd write it: 4096, 4K, 64K, 16M, 1G (binary units; KB, KiB too). */
export function parseSize(value: string): number {
  const m = /^(\d+)\s*([kmg]?)(i?b)?$/i.exec(value.trim());
  if (!m) throw new InvalidArgumentError('expected a size such as 4096, 64K or 16M');
  const mult = { '': 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30 }[m[2]!.toLowerCase() as '' | 'k' | 'm' | 'g'];
  const n = Number(m[1]) * mult;
  if (!Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError('the size must be positive');
  return n;
}

/** Powers of two from `min` to `max` (perftest -a: every size up to --max-size). */
export function allSizes(min: number, max: number): number[] {
  const sizes: number[] = [];
  for (let s = min; s <= max; s *= 2) sizes.push(s);
  return sizes;
}

/** Parse a positive integer option. */
export function parsePositiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError('expected a positive integer');
  return n;
}

/** A section heading, 100 columns wide. */
export function heading(title: string): void {
  console.log(`\n== ${title} ${'='.repeat(Math.max(3, COLUMNS - 4 - title.length))}`);
}
