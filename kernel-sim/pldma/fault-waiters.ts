// Blocks waiting on a faulting page of this node, keyed by stream and page: several
// transfers (either side) may fault on the same page before the fault library answers, and
// one answer serves them all (the driver merges their notifications into one pending fault).
import type { FaultInfo } from './types.js';

export class FaultWaiters {
  #waiting = new Map<string, FaultInfo[]>();

  add(info: FaultInfo): void {
    const key = `${info.sid}:${info.va}`;
    const list = this.#waiting.get(key);
    if (list) list.push(info);
    else this.#waiting.set(key, [info]);
  }

  /** Everything waiting on the page `info` is about (at least `info` itself), now answered. */
  take(info: FaultInfo): FaultInfo[] {
    const key = `${info.sid}:${info.va}`;
    const list = this.#waiting.get(key) ?? [info];
    this.#waiting.delete(key);
    return list;
  }
}
