// The engine's scheduler: the Cortex-R5 firmware's role. It serves channels round-robin,
// one block per turn, skips parked channels (a transfer waiting on a fault), and keeps
// serving the others meanwhile: no head-of-line blocking across channels.

/** What the scheduler drives: an engine with channels that have blocks to issue. */
export interface Schedulable {
  /** True if the channel has a block it may issue now. */
  runnable(channel: number): boolean;
  /** Issue one block of the channel. */
  issue(channel: number): void;
  /** Blocks in flight on the engine; the scheduler stops issuing at `capacity`. */
  readonly inflight: number;
  /** Most blocks in flight at once. */
  readonly capacity: number;
}

/** The engine firmware's scheduler: channels with work in round-robin order, one block per turn, so one channel's fault never blocks the others. */
export class Scheduler {
  /** Channels scheduled. */
  readonly channels: number;
  #ring: number[] = []; // channels with work, in round-robin order
  #inRing = new Set<number>();
  #target: Schedulable;
  #scheduled = false;
  /** Scheduling turns taken (one block issued each). */
  turns = 0;

  constructor(target: Schedulable, channels: number) {
    this.#target = target;
    this.channels = channels;
  }

  /** A channel got work (new transfer, retransmission request). */
  wake(channel: number): void {
    if (!this.#inRing.has(channel)) {
      this.#inRing.add(channel);
      this.#ring.push(channel);
    }
    this.kick();
  }

  /** Run a scheduling pass soon (coalesced). */
  kick(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    queueMicrotask(this.#pass);
  }

  // One closure for every kick, not one per kick.
  #pass = (): void => {
    this.#scheduled = false;
    this.#run();
  };

  #run(): void {
    const t = this.#target;
    let idle = 0;
    while (t.inflight < t.capacity && this.#ring.length && idle < this.#ring.length) {
      const ch = this.#ring.shift()!;
      if (t.runnable(ch)) {
        this.turns++;
        t.issue(ch);
        this.#ring.push(ch);
        idle = 0;
      } else {
        // Parked or busy: keep it in the ring only while it still has work.
        this.#ring.push(ch);
        idle++;
      }
    }
  }

  /** Forget a channel that has no more work. */
  retire(channel: number): void {
    if (!this.#inRing.delete(channel)) return;
    // A channel is in the ring once (wake adds it only when absent): no new array per transfer.
    const i = this.#ring.indexOf(channel);
    if (i >= 0) this.#ring.splice(i, 1);
  }
}
