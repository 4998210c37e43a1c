// Output helpers shared by the programs: the one table printer (rows printed as they finish),
// text wrapped to the terminal's width (80 columns when not a terminal), every line written
// above a progress bar that may be drawn (progress.ts), perftest-style latency columns, sizes written and read the way
// perftest and dd take them (4K, 64M).
import { InvalidArgumentError } from 'commander';
import { MODEL_LABEL } from '../../../kernel-sim/index.js';
import type { LatencyStats } from '../../../lib/index.js';
import { writeAbove, writeErrAbove } from './progress.js';

export { MODEL_LABEL };
export const MEASURED_LABEL = 'measured (real time on this machine)';

/** Lines printed to a log or a pipe fit this many columns. */
export const COLUMNS = 80;

/**
 * The width text is wrapped to: the terminal's; when stdout is not a terminal, the environment's
 * COLUMNS (a job's ranks get what their `[rank] ` prefix leaves), else 80.
 */
export function columns(): number {
  if (process.stdout.isTTY === true && process.stdout.columns > 0) return process.stdout.columns;
  const env = Number(process.env.COLUMNS);
  return Number.isSafeInteger(env) && env >= 20 && env <= 1000 ? env : COLUMNS;
}

/**
 * The width stderr's messages are wrapped to: its terminal's; not a terminal, COLUMNS when set
 * (a job's ranks are told the launcher's); else none: a log or a pipe keeps a message a line.
 */
export function errColumns(): number | undefined {
  if (process.stderr.isTTY === true && process.stderr.columns > 0) return process.stderr.columns;
  const env = Number(process.env.COLUMNS);
  return Number.isSafeInteger(env) && env >= 20 && env <= 1000 ? env : undefined;
}

/**
 * A message on stderr, wrapped at spaces to errColumns() as print() wraps stdout (continuation
 * lines indented 2); a word longer than the line (a path, an address) is left whole, so that it
 * can be copied.
 */
export function printErr(text: string): void {
  const width = errColumns();
  const body = text.replace(/\n$/, '');
  writeErrAbove((width === undefined ? [body] : body.split('\n').flatMap((l) => wrap(l, undefined, width, false))).map((l) => `${l}\n`).join(''));
}

/** Write one line to stdout (above the progress bar, when one is drawn). */
export function line(text = ''): void {
  writeAbove(`${text}\n`);
}

/**
 * Print text wrapped to columns() at spaces; continuation lines are indented by `indent` spaces
 * (default: the text's own leading spaces + 2). Several lines (\n) are wrapped one by one.
 */
export function print(text = '', indent?: number): void {
  const width = columns();
  writeAbove(
    text
      .split('\n')
      .flatMap((l) => wrap(l, indent, width))
      .map((l) => `${l}\n`)
      .join(''),
  );
}

/** `text` (several lines) wrapped to columns(), continuation lines not indented: for --help texts. */
export function wrapped(text: string): string {
  const width = columns();
  return text
    .split('\n')
    .flatMap((l) => wrap(l, 0, width))
    .join('\n');
}

/** `text` as lines of at most `width` columns, cut at spaces (a longer word broken, unless `breakWords` is false). */
export function wrap(text: string, indent?: number, width = COLUMNS, breakWords = true): string[] {
  if (text.length <= width) return [text];
  const lead = indent ?? /^ */.exec(text)![0].length + 2;
  const out: string[] = [];
  let rest = text;
  let prefix = '';
  while (prefix.length + rest.length > width) {
    const room = width - prefix.length;
    let cut = rest.lastIndexOf(' ', room);
    if (cut <= 0 && !breakWords) cut = rest.indexOf(' ', room); // one long word: whole, on a line of its own
    if (cut <= 0 && !breakWords) break;
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
 * that does not fit its column is split over two lines at its spaces.
 */
export class Table {
  readonly columns: Array<Required<Column>>;
  readonly #gap: string;

  /** `gap`: spaces between columns (default 2; 1 lets a wide table fit 80 columns). */
  constructor(columns: Column[], options: { gap?: number } = {}) {
    this.#gap = ' '.repeat(options.gap ?? 2);
    this.columns = columns.map((c) => ({ header: c.header, left: c.left ?? false, width: Math.max(c.width ?? 0, headerWidth(c.header)) }));
  }

  /** Print the header line(s). */
  header(): void {
    const split = this.columns.map((c) => splitHeader(c.header, c.width));
    if (split.some((s) => s.length === 2)) line(this.#line(split.map((s) => (s.length === 2 ? s[0] : ''))));
    line(this.#line(split.map((s) => (s.length === 2 ? s[1] : s[0]))));
  }

  /** Print one row now. */
  row(cells: string[]): void {
    line(this.#line(cells));
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
        .join(this.#gap)
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

/**
 * perftest's latency columns (ib_send_lat, ib_write_lat), µs: 7 wide (t_typical 9, its name), so
 * that with gap 1 a table of them and two or three more columns fits 80 columns.
 */
export const LATENCY_COLUMNS: Column[] = [
  { header: 't_min [usec]', width: 7 },
  { header: 't_max [usec]', width: 7 },
  { header: 't_typical [usec]', width: 9 },
  { header: 't_avg [usec]', width: 7 },
  { header: 't_stdev [usec]', width: 7 },
  { header: '99% [usec]', width: 7 },
  { header: '99.9% [usec]', width: 7 },
];

/** The cells of LATENCY_COLUMNS: two decimals as perftest prints them, fewer where 7 columns need it (12345.7, 123457). */
export function latencyCells(l: LatencyStats): string[] {
  return [l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999].map((x) => usIn(x, 7));
}

/** µs in `width` characters: two decimals, or fewer when the number is too long for them. */
export function usIn(x: number, width: number): string {
  for (const d of [2, 1]) {
    const s = x.toFixed(d);
    if (s.length <= width) return s;
  }
  return x.toFixed(0);
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

/** A benchmark's target and whether this run met it: "(target <= 1.5: met)", "(target >= 4×: MISSED)". */
export function target(value: number, op: '<=' | '>=', goal: number, unit = ''): string {
  const met = op === '<=' ? value <= goal : value >= goal;
  return `(target ${op} ${goal}${unit}: ${met ? 'met' : 'MISSED'})`;
}

/** A section heading, as wide as the terminal (at most 80 columns). */
export function heading(title: string): void {
  const fill = Math.min(columns(), COLUMNS) - 4 - title.length;
  line();
  // A title too long for the terminal is wrapped, without the rule.
  if (fill >= 3) line(`== ${title} ${'='.repeat(fill)}`);
  else print(`== ${title}`, 3);
}
