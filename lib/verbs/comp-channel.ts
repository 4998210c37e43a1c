// Completion channels (struct ibv_comp_channel): a CQ created on a channel and armed with
// reqNotify() puts itself on the channel when its next completion arrives, and
// getCqEvent() sleeps until a CQ is there, as ibv_rc_pingpong -e does with read() on the
// channel's fd. An event fires once per arming; every event must be acknowledged
// (ackEvents) before the CQ is destroyed, as libibverbs requires.
import { closedError } from '../errors.js';
import { checkInt, checkObject } from '../validate.js';
import type { CompletionQueue } from './cq.js';
import { verbsError } from './errors.js';

interface EventWaiter {
  resolve: (cq: CompletionQueue) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

/** Options of `CompletionChannel.getCqEvent`. */
export interface GetCqEventOptions {
  /** Longest wait in ms (default 10 000, as rdma-core's POLL_CQ_TIMEOUT); then it rejects with ETIMEDOUT. */
  timeoutMs?: number;
  /** Aborting it rejects the wait with ABORT_ERR. */
  signal?: AbortSignal;
}

/** A completion event channel (struct ibv_comp_channel): armed CQs created on it report their next completion here. Made by `Context.createCompChannel()`. */
export class CompletionChannel {
  #ready: CompletionQueue[] = [];
  #waiters: EventWaiter[] = [];
  /** CQs created on this channel and not yet destroyed (ibv_destroy_comp_channel refuses while any is left). */
  #cqs = new Set<CompletionQueue>();
  #closed = false;
  #forget: (c: CompletionChannel) => void;

  /** @internal use Context.createCompChannel */
  constructor(forget: (c: CompletionChannel) => void = () => {}) {
    this.#forget = forget;
  }

  /** True once the channel (or its context) was closed. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Events raised and not yet taken by getCqEvent(). */
  get pending(): number {
    return this.#ready.length;
  }

  /**
   * ibv_get_cq_event: the CQ whose armed notification fired, oldest first; waits for one
   * (up to `timeoutMs`, default 10 s: then ETIMEDOUT). The CQ must be re-armed with
   * `reqNotify()` for another event, and the event acknowledged with `cq.ackEvents(1)`.
   * Closing the channel rejects a pending wait with ERR_PFR_CLOSED.
   */
  getCqEvent(options: GetCqEventOptions = {}): Promise<CompletionQueue> {
    this.#check();
    checkObject('getCqEvent: options', options, ['timeoutMs', 'signal']);
    const timeoutMs = options.timeoutMs === undefined ? 10_000 : checkInt('getCqEvent: timeoutMs', options.timeoutMs, 1, 2 ** 31 - 1);
    const ready = this.#ready.shift();
    if (ready) {
      ready.eventTaken();
      return Promise.resolve(ready);
    }
    if (options.signal?.aborted) return Promise.reject(abortError());
    return new Promise((resolve, reject) => {
      const w: EventWaiter = {
        resolve,
        reject,
        timer: setTimeout(
          () =>
            this.#settle(
              w,
              Object.assign(new Error(`getCqEvent: no completion event within ${timeoutMs} ms; was the CQ armed with reqNotify()?`), {
                code: 'ETIMEDOUT',
              }),
            ),
          timeoutMs,
        ),
        signal: options.signal,
        onAbort: undefined,
      };
      if (w.signal) {
        w.onAbort = () => this.#settle(w, abortError());
        w.signal.addEventListener('abort', w.onAbort, { once: true });
      }
      this.#waiters.push(w);
    });
  }

  /**
   * ibv_destroy_comp_channel: EBUSY while CQs created on it are alive (destroy them first);
   * otherwise a pending getCqEvent() rejects with ERR_PFR_CLOSED. Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    const live = [...this.#cqs].filter((cq) => !cq.closed).length;
    if (live) throw verbsError('ibv_destroy_comp_channel', 'EBUSY', `${live} CQ(s) still use this channel; destroy them (cq.close()) first`);
    this.#shut();
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** @internal the context closes: its CQs are gone, the channel goes whatever is left. */
  shut(): void {
    if (!this.#closed) this.#shut();
  }

  /** @internal a CQ was created on this channel. */
  attach(cq: CompletionQueue): void {
    this.#check();
    this.#cqs.add(cq);
  }

  /** @internal a CQ on this channel was destroyed: its events not yet taken go with it. */
  detach(cq: CompletionQueue): void {
    this.#cqs.delete(cq);
    this.#ready = this.#ready.filter((c) => c !== cq);
  }

  /** @internal an armed CQ got a completion: hand it to the oldest waiter, or keep it. */
  notify(cq: CompletionQueue): void {
    if (this.#closed) return;
    const w = this.#waiters[0];
    if (w) this.#settle(w, cq);
    else this.#ready.push(cq);
  }

  #shut(): void {
    this.#closed = true;
    this.#ready = [];
    for (const w of [...this.#waiters]) this.#settle(w, closedError('CompletionChannel'));
    this.#forget(this);
  }

  #settle(w: EventWaiter, x: CompletionQueue | Error): void {
    const i = this.#waiters.indexOf(w);
    if (i < 0) return;
    this.#waiters.splice(i, 1);
    clearTimeout(w.timer);
    if (w.onAbort) w.signal!.removeEventListener('abort', w.onAbort);
    if (x instanceof Error) return w.reject(x);
    x.eventTaken();
    w.resolve(x);
  }

  #check(): void {
    if (this.#closed) throw closedError('CompletionChannel');
  }
}

function abortError(): Error {
  return Object.assign(new Error('wait for a completion event was aborted'), { code: 'ABORT_ERR' });
}
