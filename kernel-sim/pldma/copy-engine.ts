// The native copy engine seen from TypeScript: threads of the addon that move the bytes
// of DMA blocks on real memory. One per simulated system; its threads are "the device"
// for every SMMU (their userfaultfd faults are DMA accesses).
import { binding, COPY_COMPLETION_WIDTH, CopyFlag, CopyStatus } from '../../native/index.js';
import type { MemoryLike } from '../memory.js';

export { CopyFlag, CopyStatus };

/** How one copy ended. */
export interface CopyResult {
  /** Ok, or which side had a page missing. */
  status: CopyStatus;
  /** Offset (in the faulting side's region) of the first non-resident page, or -1. */
  faultOffset: number;
  /** Real time the copy thread spent on the job, ns. */
  ns: number;
  /** Kernel thread id of the copy thread. */
  tid: number;
}

/** What a copy's bytes are written for: a memory key, a QP number (a fence may wait for them). */
export interface CopyTag {
  /** The memory key the bytes are written for. */
  key?: number;
  /** The QP number the bytes are written for. */
  qp?: number;
}

/**
 * @internal The tag the engine keeps for a key or QP of node `node`. Keys and QP numbers are a node's
 * own (between processes two nodes may use the same), while one engine serves every node of
 * a process: its tags name the node too.
 */
export function nodeTag(node: number, tag: CopyTag): CopyTag {
  const out: CopyTag = {};
  if (tag.key !== undefined) out.key = node * 2 ** 32 + tag.key;
  if (tag.qp !== undefined) out.qp = node * 2 ** 24 + tag.qp;
  return out;
}

/**
 * The largest copy done inline on the JavaScript thread (copyNow). A copy thread's job costs a
 * wake-up (30-50 µs of this thread's CPU in a PVM guest, and up to ~100 µs more before the
 * thread runs when the other vCPU is busy) and a call back, while this thread mostly waits
 * for it; a 1 MiB memcpy is ~150 µs at 7 GB/s. So a run of up to 1 MiB (one 1 MiB write
 * between processes) is copied here: write-bw -s 1M went from ~660 to ~790 MB/s.
 */
export const INLINE_COPY_MAX = 1024 * 1024;

/**
 * Inline copies per turn of the event loop whose result settles at once (in a microtask);
 * later ones that turn settle on the next turn. 16 small writes are ~0.2 ms of JavaScript.
 */
export const INLINE_SAME_TURN = 16;

/** The flags of a copy that may run inline: both sides terminate-mode. */
const INLINE_FLAGS = CopyFlag.CheckSource | CopyFlag.CheckDest | CopyFlag.Inline;

/** A terminate-mode copy at least twice this long is split across the threads, one job each. */
const SPLIT_PIECE_MIN = 512 * 1024;
const PIECE_ALIGN = 4096;

/** The native copy threads that move the bytes on real memory; a missing page makes a copy fail (terminate) or block in a genuine fault (stall). */
export class CopyEngine {
  /** Kernel thread ids of the copy threads. */
  readonly tids: readonly number[];
  #handle: number;
  #pending = new Map<number, (r: CopyResult) => void>();
  #next = 1;
  #closed = false;
  #out = new Float64Array(2);
  #jsTid = binding.gettid();
  /** Inline copies settled at once since the last turn of the event loop. */
  #sameTurn = 0;
  #newTurn = (): void => {
    this.#sameTurn = 0;
  };
  /** Inline copies done this turn past INLINE_SAME_TURN, settled together on the next (as a thread's completions are). */
  #doneInline: Array<[(r: CopyResult) => void, CopyResult]> = [];

  constructor(threads = 2) {
    const raw = binding.engineCreate(threads, (c) => this.#onCompletions(c));
    this.#handle = raw.handle;
    this.tids = Object.freeze([...raw.tids]);
  }

  /** Copies queued or running. */
  get inflight(): number {
    return this.#pending.size;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * An inline copy done now, its result returned at once instead of through a promise, when
   * `copy()` would have settled it in this same microtask: both checks and Inline, at most
   * INLINE_COPY_MAX bytes, fewer than INLINE_SAME_TURN settled at once this turn, and every
   * page of both sides present. `null`: a page is not present (nothing touched; a thread's job
   * must walk it: `copy()` without Inline). `undefined`: not such a copy (`copy()` decides).
   */
  copyNow(src: MemoryLike, srcOffset: number, dst: MemoryLike, dstOffset: number, length: number, flags: number): CopyResult | null | undefined {
    if (this.#closed || length > INLINE_COPY_MAX || flags !== INLINE_FLAGS || this.#sameTurn >= INLINE_SAME_TURN) return undefined;
    const r = this.#copyHere(src, srcOffset, dst, dstOffset, length);
    if (!r) return null;
    if (this.#sameTurn++ === 0) setImmediate(this.#newTurn);
    return r;
  }

  /**
   * Copy `length` bytes. With CheckSource / CheckDest the thread first walks that side's
   * real page tables (mincore) and reports the first non-resident page instead of copying.
   * A small copy with Inline (and both checks) is done on this (the JavaScript) thread when
   * every page of both sides has a present page-table entry, so it cannot fault; its result
   * settles at once for the first INLINE_SAME_TURN of a turn, then on the next turn of the
   * event loop (when a thread's would at the earliest). Why that is safe: docs/threads.md.
   */
  copy(
    src: MemoryLike,
    srcOffset: number,
    dst: MemoryLike,
    dstOffset: number,
    length: number,
    flags: number,
    tag: CopyTag = {},
  ): Promise<CopyResult> {
    if (this.#closed) return Promise.reject(new Error('copy engine is closed'));
    const inline = flags === INLINE_FLAGS;
    if (length <= INLINE_COPY_MAX && inline) {
      // The first few of a turn settle at once (no event-loop turn for a small write); after
      // that (copyNow declines), on the next turn, so a stream of small writes cannot starve
      // timers and I/O.
      const now = this.copyNow(src, srcOffset, dst, dstOffset, length, flags);
      if (now) return Promise.resolve(now);
      const r = now === undefined ? this.#copyHere(src, srcOffset, dst, dstOffset, length) : undefined;
      if (r)
        return new Promise((resolve) => {
          if (this.#doneInline.push([resolve, r]) === 1) setImmediate(() => this.#settleInline());
        });
    }
    const checks = CopyFlag.CheckSource | CopyFlag.CheckDest;
    const pieces = (flags & checks) === checks ? Math.min(this.tids.length, Math.floor(length / SPLIT_PIECE_MIN)) : 1;
    if (pieces < 2) return this.#submit(src, srcOffset, dst, dstOffset, length, flags, tag);
    // A large terminate-mode copy: one piece per thread, in order; the first piece that did not
    // copy whole speaks for the copy (the pieces before it landed whole, as one job's would).
    // With Inline the last piece is copied here, on the JavaScript thread, when its pages are
    // all present: this thread would only wait for it meanwhile, and each thread woken costs
    // a wake-up (~50 µs here) and, on two vCPUs, the JavaScript thread's own CPU.
    const step = Math.ceil(length / pieces / PIECE_ALIGN) * PIECE_ALIGN;
    const jobs: Array<Promise<CopyResult>> = [];
    for (let at = 0; at < length; at += step) {
      const n = Math.min(step, length - at);
      const here = inline && at + n === length ? this.#copyHere(src, srcOffset + at, dst, dstOffset + at, n) : undefined;
      jobs.push(here ? Promise.resolve(here) : this.#submit(src, srcOffset + at, dst, dstOffset + at, n, flags, tag));
    }
    return Promise.all(jobs).then((rs) => {
      const ns = Math.max(...rs.map((r) => r.ns));
      return { ...(rs.find((r) => r.status !== CopyStatus.Ok) ?? rs[0]!), ns };
    });
  }

  // An inline copy (engineCopyNow): its result, or undefined if a page of either side is not
  // present (nothing was touched; a thread's job must walk and copy it).
  #copyHere(src: MemoryLike, srcOffset: number, dst: MemoryLike, dstOffset: number, length: number): CopyResult | undefined {
    const status = binding.engineCopyNow(this.#handle, src.id, srcOffset, dst.id, dstOffset, length, this.#out);
    if (status < 0) return undefined;
    return { status: status as CopyStatus, faultOffset: this.#out[0]!, ns: this.#out[1]!, tid: this.#jsTid };
  }

  #submit(src: MemoryLike, srcOffset: number, dst: MemoryLike, dstOffset: number, length: number, flags: number, tag: CopyTag): Promise<CopyResult> {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      try {
        binding.engineSubmit(this.#handle, id, src.id, srcOffset, dst.id, dstOffset, length, flags & ~CopyFlag.Inline, tag.key ?? -1, tag.qp ?? -1);
        this.#pending.set(id, resolve);
      } catch (err) {
        reject(err);
      }
    });
  }

  /**
   * Fence the copies written for a memory key or a QP: queued ones are cancelled (they
   * complete with CopyStatus.Cancelled, nothing copied), and the call returns once none is
   * running: no byte of them lands afterwards. False if one was still running after
   * `timeoutMs` (a stall-mode copy held in a fault).
   */
  fence(tag: CopyTag, timeoutMs = 1000): boolean {
    if (this.#closed) return true;
    return binding.engineFence(this.#handle, tag.key ?? -1, tag.qp ?? -1, timeoutMs);
  }

  /** Stop: queued jobs are dropped (their promises settle with an error), running ones finish. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    binding.engineClose(this.#handle);
    for (const resolve of this.#pending.values()) resolve({ status: -1 as CopyStatus, faultOffset: -1, ns: 0, tid: 0 });
    this.#pending.clear();
  }

  #settleInline(): void {
    for (const [resolve, r] of this.#doneInline.splice(0)) resolve(r);
  }

  // Completions settle on the next turn of the event loop, not inside the native callback:
  // Node drains a thread-safe function's queue in one go, and a transfer whose next job
  // finishes while that drain runs would otherwise complete without the event loop (timers,
  // I/O, setImmediate) ever getting a turn.
  #onCompletions(c: Float64Array): void {
    const done: Array<[(r: CopyResult) => void, CopyResult]> = [];
    for (let i = 0; i < c.length; i += COPY_COMPLETION_WIDTH) {
      const resolve = this.#pending.get(c[i]!);
      if (!resolve) continue;
      this.#pending.delete(c[i]!);
      done.push([resolve, { status: c[i + 1]! as CopyStatus, faultOffset: c[i + 2]!, ns: c[i + 3]!, tid: c[i + 4]! }]);
    }
    if (this.#pending.size === 0 && !this.#closed) binding.engineUnref(this.#handle);
    if (done.length)
      setImmediate(() => {
        for (const [resolve, r] of done) resolve(r);
      });
  }
}
