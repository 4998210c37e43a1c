// Progress of a long run on stderr (cli-progress), so stdout keeps only the results. Drawn
// only when stderr is a terminal: a log or a pipe gets no bar characters.
import { SingleBar } from 'cli-progress';

export interface Progress {
  /** One step done; `label` says what runs next. */
  tick(label?: string): void;
  /** Remove the bar (idempotent). */
  stop(): void;
}

/** A bar of `total` steps named `what`. */
export function progress(total: number, what: string): Progress {
  const bar = new SingleBar({
    stream: process.stderr,
    format: `${what} [{bar}] {value}/{total} {label}`,
    barsize: 30,
    hideCursor: true,
    clearOnComplete: true,
    noTTYOutput: false,
    fps: 5,
  });
  let running = process.stderr.isTTY === true && total > 1;
  if (running) bar.start(total, 0, { label: '' });
  return {
    tick(label = '') {
      if (running) bar.increment(1, { label });
    },
    stop() {
      if (running) bar.stop();
      running = false;
    },
  };
}
