// Progress of a long run on stderr, so stdout keeps only the results: a bar, or a live status
// line, drawn only when stderr is a terminal (a log or a pipe gets no control characters).
// The line is always cleared before it is redrawn, never wider than the terminal (no wrap to
// undo), and every line the programs print goes above it (format.ts writes through
// writeAbove): a row and the bar never share a line. The cursor is hidden while the line is
// drawn and shown again when it stops, when the process exits, and on Ctrl-C.

export interface Progress {
  /** One step done; `label` says what runs next. */
  tick(label?: string): void;
  /** Remove the bar (idempotent). */
  stop(): void;
}

export interface LiveLine {
  /** Show `text` on the live line (in place of what it showed). */
  update(text: string): void;
  /** Remove the line (idempotent). */
  stop(): void;
}

const ESC = '\x1b[';
const CLEAR = `\r${ESC}K`;
const HIDE_CURSOR = `${ESC}?25l`;
const SHOW_CURSOR = `${ESC}?25h`;
// Redraws at most this often (ms): a bar ticked per round trip must not flood the terminal.
const REDRAW_MS = 100;

// The one line drawn now (a program draws one at a time), and what it shows.
let current: { text: string } | undefined;

/** Write `text` (whole lines) to stdout above the live line, which is redrawn below it. */
export function writeAbove(text: string): void {
  if (!current) {
    process.stdout.write(text);
    return;
  }
  process.stderr.write(CLEAR);
  process.stdout.write(text);
  process.stderr.write(fit(current.text));
}

/** Write `text` (whole lines) to stderr above the live line, which is redrawn below it. */
export function writeErrAbove(text: string): void {
  if (!current) {
    process.stderr.write(text);
    return;
  }
  process.stderr.write(CLEAR + text + fit(current.text));
}

/** A live status line on stderr, redrawn in place; nothing when stderr is not a terminal. */
export function liveLine(): LiveLine {
  if (process.stderr.isTTY !== true || current) return { update: () => undefined, stop: () => undefined };
  const mine = { text: '' };
  current = mine;
  process.stderr.write(HIDE_CURSOR);
  // Ctrl-C and exit leave the terminal as it was found: the line cleared, the cursor shown.
  const restore = (): void => {
    if (current !== mine) return;
    current = undefined;
    process.stderr.write(CLEAR + SHOW_CURSOR);
  };
  const onSigint = (): void => {
    restore();
    process.exit(130);
  };
  process.on('exit', restore);
  process.once('SIGINT', onSigint);
  return {
    update(text) {
      if (current !== mine) return;
      mine.text = text;
      process.stderr.write(CLEAR + fit(text));
    },
    stop() {
      restore();
      process.off('exit', restore);
      process.off('SIGINT', onSigint);
    },
  };
}

/** A bar of `total` steps named `what`. */
export function progress(total: number, what: string): Progress {
  const line = total > 1 ? liveLine() : undefined;
  let value = 0;
  let drawn = 0;
  const draw = (label: string): void => {
    const width = 30;
    const full = Math.round((value / total) * width);
    line?.update(`${what} [${'█'.repeat(full)}${'░'.repeat(width - full)}] ${value}/${total} ${label}`);
    drawn = performance.now();
  };
  if (line) draw('');
  return {
    tick(label = '') {
      if (!line) return;
      value = Math.min(total, value + 1);
      if (value === total || performance.now() - drawn >= REDRAW_MS) draw(label);
    },
    stop() {
      line?.stop();
    },
  };
}

// One terminal line: cut to the width, so that it never wraps (a wrapped line cannot be cleared
// with \r), with room left for the ^C the terminal echoes after it on Ctrl-C: an echo that
// wrapped would leave the line, cut, with a ^ glued to it above the cleared one.
const ECHO_ROOM = 3;
function fit(text: string): string {
  const cols = process.stderr.columns || 80;
  const room = Math.max(1, cols - ECHO_ROOM);
  return text.length <= room ? text : text.slice(0, room);
}
