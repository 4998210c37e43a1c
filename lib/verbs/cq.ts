// Completion queues: pollCq(n) like ibv_poll_cq, and an async way to wait (next(), or
// for await … of cq); or, created on a completion channel and armed with reqNotify(), an
// event on the channel for the next completion (comp-channel.ts). The completions live in a
// ring of CQEs (kernel-sim/device/cq-ring.ts, docs/device-abi.md's struct pfr_cqe): the device
// side writes them, poll() reads them into WorkCompletion objects as rdma-core's rxe provider
// reads the kernel's ring in ibv_poll_cq.
import { CompletionRing, CQE, CqEvent, type CqeOdp } from '../../kernel-sim/device/cq-ring.js';
import { closedError } from '../errors.js';
import { checkInt, checkObject } from '../validate.js';
import { WcFlags, WcOpcode, WcStatus, wcStatusStr } from './constants.js';
import { verbsError } from './errors.js';

/** struct ibv_wc, plus what this library can tell about faults. */
export interface WorkCompletion {
  /** The work request's id, as posted (ibv_wc.wr_id, 64 bits). */
  wrId: bigint;
  /** How the work request ended (ibv_wc.status); anything but SUCCESS is an error. */
  status: WcStatus;
  /** The operation that completed (ibv_wc.opcode). */
  opcode: WcOpcode;
  /** Vendor error syndrome (ibv_wc.vendor_err); 0 here. */
  vendorErr: number;
  /** Bytes transferred (ibv_wc.byte_len): received bytes for a receive. */
  byteLen: number;
  /** Immediate data of a *_WITH_IMM operation, when WcFlags.WITH_IMM is set (ibv_wc.imm_data). */
  immData?: number;
  /** Local QP number of the completed work request (ibv_wc.qp_num). */
  qpNum: number;
  /** Remote QP number (ibv_wc.src_qp): the sender's, for a receive. */
  srcQp: number;
  /** WcFlags bits of the completion (ibv_wc.wc_flags). */
  wcFlags: number;
  /** ibv_wc_status_str(status) */
  statusStr: string;
  /** Faults this work request took on the way, modelled and measured time. */
  /**
   * On-demand paging of the transfer: faults by side, major faults (pages a page store supplied:
   * remote paging), blocks sent again, modelled and measured µs.
   */
  odp?: {
    /** Faults taken at the source and at the destination. */
    faults: {
      /** Faults at the source (translating the local buffer). */
      source: number;
      /** Faults at the destination (translating the remote buffer). */
      destination: number;
    };
    /** Pages a page store supplied (remote paging). */
    majorFaults: number;
    /** Blocks the engine sent again after a fault. */
    retransmittedBlocks: number;
    /** Modelled time of the transfer, µs. */
    modelUs: number;
    /** Measured (wall-clock) time of the transfer, µs. */
    realUs: number;
  };
}

interface Waiter {
  resolve: (wc: WorkCompletion) => void;
  reject: (e: Error) => void;
  /** performance.now() after which the wait times out. */
  deadline: number;
  timeoutMs: number;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

/** What a CQ needs of its completion channel (a CompletionChannel, comp-channel.ts, which imports this module). */
export interface CqEventChannel {
  /** True once the channel was closed. */
  readonly closed: boolean;
  /** A CQ created on the channel. */
  attach(cq: CompletionQueue): void;
  /** The CQ was closed. */
  detach(cq: CompletionQueue): void;
  /** One event of the CQ for getCqEvent(). */
  notify(cq: CompletionQueue): void;
  /** ibv_get_cq_event: the CQ of the next event (see CompletionChannel.getCqEvent). */
  getCqEvent(options?: { timeoutMs?: number; signal?: AbortSignal }): Promise<CompletionQueue>;
}

/** A completion queue (struct ibv_cq): `poll()` as ibv_poll_cq, `next()` or `for await` to wait for completions. */
export class CompletionQueue {
  /** Most completions the CQ holds before it overruns (cqe). */
  readonly depth: number;
  /** The ring of CQEs: written by the device side (complete()), read by poll() and next(). */
  readonly ring: CompletionRing;
  #waiters: Waiter[] = [];
  /**
   * One timer for all waiters, due at the earliest deadline (not one per next(): a timer per
   * completion was a large share of the cost of a small WR); ref'd only while someone waits.
   */
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Infinity;
  #closed = false;
  #onOverrun: (cq: CompletionQueue) => void;
  /** The completion channel the CQ reports its events to (ibv_cq.channel), if it was created with one. */
  readonly channel: CqEventChannel | undefined;
  /** What the creator passed as `cqContext` (ibv_cq.cq_context): comes back with each event. */
  readonly cqContext: unknown;
  // reqNotify() armed the CQ: undefined, 'any' or 'solicited'.
  #armed: 'any' | 'solicited' | undefined;
  #unacked = 0;

  /** @internal use Context.createCq */
  constructor(
    depth: number,
    onOverrun: (cq: CompletionQueue) => void = () => {},
    options: { channel?: CqEventChannel | undefined; cqContext?: unknown } = {},
  ) {
    this.depth = checkInt('createCq: depth', depth, 1, 1 << 22);
    this.ring = new CompletionRing(this.depth);
    this.#onOverrun = onOverrun;
    // The device's event line: a CQE went into the ring (a waiter takes it), or the CQ overran.
    this.ring.onEvent = (e, status, solicited) => (e === CqEvent.OVERRUN ? this.#onOverrun(this) : this.#delivered(status, solicited));
    this.channel = options.channel;
    this.cqContext = options.cqContext;
    this.channel?.attach(this);
  }

  /**
   * ibv_req_notify_cq: arm the CQ so that its next completion (with `solicitedOnly`, its next
   * solicited one) puts one event on its channel; completions already queued raise none, so
   * poll after arming. One event per arming: re-arm after each `getCqEvent()`. EINVAL on a
   * CQ created without a channel.
   *
   * Solicited: an unsuccessful completion, or the receive of a message whose sender set
   * SendFlags.SOLICITED (carried as BTH's SE bit on its packets).
   */
  reqNotify(solicitedOnly = false): void {
    this.#check();
    if (typeof solicitedOnly !== 'boolean')
      throw verbsError('ibv_req_notify_cq', 'EINVAL', `solicitedOnly must be a boolean, got ${String(solicitedOnly)}`);
    if (!this.channel)
      throw verbsError('ibv_req_notify_cq', 'EINVAL', 'the CQ has no completion channel; create it with createCq(depth, { channel })');
    if (this.channel.closed) throw verbsError('ibv_req_notify_cq', 'EINVAL', 'the completion channel of this CQ was closed');
    this.#armed = solicitedOnly ? 'solicited' : 'any';
  }

  /** True while the CQ is armed (reqNotify() called and its event not raised yet). */
  get armed(): boolean {
    return this.#armed !== undefined;
  }

  /** Events taken from the channel for this CQ and not yet acknowledged. */
  get unackedEvents(): number {
    return this.#unacked;
  }

  /** @internal the channel handed an event of this CQ to getCqEvent(). */
  eventTaken(): void {
    this.#unacked++;
  }

  /**
   * ibv_ack_cq_events: acknowledge `n` events getCqEvent() returned for this CQ (EINVAL for
   * more than were returned). Every event must be acknowledged before the CQ is destroyed.
   */
  ackEvents(n = 1): void {
    checkInt('ackCqEvents: n', n, 1);
    if (n > this.#unacked)
      throw verbsError(
        'ibv_ack_cq_events',
        'EINVAL',
        `acknowledging ${n} event(s) but only ${this.#unacked} were returned by getCqEvent() for this CQ`,
      );
    this.#unacked -= n;
  }

  /** True once the CQ overflowed (IBV_EVENT_CQ_ERR): as on hardware, it stays in error. */
  get error(): boolean {
    return this.ring.error;
  }

  /** Completions that found the CQ full (each one moved its QP to ERR). */
  get overruns(): number {
    return this.ring.overruns;
  }

  /** True once the CQ (or its context) was closed. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Completions waiting to be polled. */
  get length(): number {
    return this.ring.count;
  }

  /** ibv_poll_cq: up to `n` completions, oldest first (may be none). */
  poll(n = 1): WorkCompletion[] {
    this.#check();
    checkInt('pollCq: n', n, 1);
    const out: WorkCompletion[] = [];
    for (let k = this.ring.count; out.length < n && k > 0; k--) out.push(this.#take());
    return out;
  }

  /** The next completion; rejects on timeout (default 10 s, as rdma-core's POLL_CQ_TIMEOUT) or close. */
  next(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<WorkCompletion> {
    this.#check();
    checkObject('next: options', options, ['timeoutMs', 'signal']);
    if (this.ring.count > 0) return Promise.resolve(this.#take());
    const timeoutMs = options.timeoutMs === undefined ? 10_000 : checkInt('next: timeoutMs', options.timeoutMs, 1);
    return new Promise((resolve, reject) => {
      const w: Waiter = { resolve, reject, deadline: performance.now() + timeoutMs, timeoutMs, signal: options.signal, onAbort: undefined };
      if (w.signal) {
        w.onAbort = () => this.#settle(w, Object.assign(new Error('wait for a completion was aborted'), { code: 'ABORT_ERR' }));
        w.signal.addEventListener('abort', w.onAbort, { once: true });
      }
      this.#waiters.push(w);
      this.ring.waiting = this.#waiters.length;
      this.#arm(w.deadline);
    });
  }

  /** Wait for `n` completions (each within the timeout). */
  async take(n: number, options: { timeoutMs?: number } = {}): Promise<WorkCompletion[]> {
    const out: WorkCompletion[] = [];
    for (let i = 0; i < n; i++) out.push(await this.next(options));
    return out;
  }

  /** Completions as they arrive, until the CQ is closed. */
  async *[Symbol.asyncIterator](): AsyncGenerator<WorkCompletion> {
    while (!this.#closed) {
      try {
        yield await this.next({ timeoutMs: 2 ** 31 - 1 });
      } catch (e) {
        if (this.#closed) return;
        throw e;
      }
    }
  }

  /**
   * @internal a completion written by the device's CQE writer (the ring's `complete`). False
   * if the CQ has overrun: the CQ goes to error and IBV_EVENT_CQ_ERR is reported (once); the
   * caller moves its QP to ERR. `immData` undefined: no immediate; `odp` undefined: no ODP
   * figures (a flushed WR). `solicited`: the receive of a message sent with SendFlags.SOLICITED.
   */
  complete(
    wrId: bigint,
    status: WcStatus,
    opcode: WcOpcode,
    byteLen: number,
    qpNum: number,
    srcQp: number,
    immData: number | undefined,
    odp: CqeOdp | undefined,
    solicited = false,
  ): boolean {
    return this.ring.complete(wrId, status, opcode, byteLen, qpNum, srcQp, immData, odp, solicited);
  }

  // The event line said a CQE went into the ring: a waiter (the ring was empty) takes it, and
  // an armed CQ raises its event.
  #delivered(status: WcStatus, solicited: boolean): void {
    if (this.#waiters.length > 0) this.#settle(this.#waiters.shift()!, this.#take(), false);
    this.#event(status, solicited);
  }

  // The consumer's step: copy the CQE at the consumer index into a WorkCompletion, free the slot.
  #take(): WorkCompletion {
    const r = this.ring;
    const v = r.view;
    const at = r.slot(r.consumer);
    const status = v.getUint32(at + CQE['wc.status'], true) as WcStatus;
    const wcFlags = v.getUint32(at + CQE['wc.wc_flags'], true);
    const wc: WorkCompletion = {
      wrId: v.getBigUint64(at + CQE['wc.wr_id'], true),
      status,
      opcode: v.getUint32(at + CQE['wc.opcode'], true) as WcOpcode,
      byteLen: v.getUint32(at + CQE['wc.byte_len'], true),
      qpNum: v.getUint32(at + CQE['wc.qp_num'], true),
      srcQp: v.getUint32(at + CQE['wc.src_qp'], true),
      wcFlags,
      vendorErr: v.getUint32(at + CQE['wc.vendor_err'], true),
      statusStr: wcStatusStr(status),
    };
    if (wcFlags & WcFlags.WITH_IMM) wc.immData = v.getUint32(at + CQE['wc.ex.imm_data'], false);
    const modelUs = v.getFloat64(at + CQE['odp.model_us'], true);
    if (!Number.isNaN(modelUs))
      wc.odp = {
        faults: { source: v.getUint32(at + CQE['odp.faults_source'], true), destination: v.getUint32(at + CQE['odp.faults_destination'], true) },
        majorFaults: v.getUint32(at + CQE['odp.major_faults'], true),
        retransmittedBlocks: v.getUint32(at + CQE['odp.retransmitted_blocks'], true),
        modelUs,
        realUs: v.getFloat64(at + CQE['odp.real_us'], true),
      };
    r.consumed();
    return wc;
  }

  // An armed CQ got a completion that its arming asked for: one event on the channel.
  // Solicited: a receive whose sender set SendFlags.SOLICITED (BTH SE), or an error (as rxe).
  #event(status: WcStatus, solicited: boolean): void {
    if (this.#armed === undefined) return;
    if (this.#armed === 'solicited' && status === WcStatus.SUCCESS && !solicited) return;
    this.#armed = undefined;
    this.channel!.notify(this);
  }

  /**
   * ibv_destroy_cq: waiting `next()` calls reject with ERR_PFR_CLOSED. EBUSY while events
   * returned by getCqEvent() are not acknowledged (libibverbs would block): `ackEvents()`
   * first. Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    if (this.#unacked)
      throw verbsError(
        'ibv_destroy_cq',
        'EBUSY',
        `${this.#unacked} completion event(s) of this CQ are not acknowledged; call cq.ackEvents(${this.#unacked}) first`,
      );
    this.destroy();
  }

  /** @internal close whatever is left (the context closes). */
  destroy(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.ring.closed = true;
    this.#unacked = 0;
    this.channel?.detach(this);
    for (const w of [...this.#waiters]) this.#settle(w, closedError('CompletionQueue'));
    this.#disarm();
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  // Settle a waiter: with a completion, or reject it (timeout, abort, close). `queued`: it is
  // still in #waiters (push() has already taken it out).
  #settle(w: Waiter, x: WorkCompletion | Error, queued = true): void {
    if (queued) {
      const i = this.#waiters.indexOf(w);
      if (i < 0) return;
      this.#waiters.splice(i, 1);
    }
    this.ring.waiting = this.#waiters.length;
    if (w.onAbort) w.signal!.removeEventListener('abort', w.onAbort);
    if (this.#waiters.length === 0) this.#timer?.unref();
    if (x instanceof Error) w.reject(x);
    else w.resolve(x);
  }

  #arm(deadline: number): void {
    if (this.#timer && deadline >= this.#timerAt) {
      this.#timer.ref();
      return;
    }
    this.#disarm();
    this.#timerAt = deadline;
    this.#timer = setTimeout(() => this.#expire(), Math.max(1, Math.ceil(deadline - performance.now())));
  }

  #disarm(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
  }

  // The shared timer fired: time out the waiters whose deadline passed, re-arm for the rest.
  #expire(): void {
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const now = performance.now();
    let next = Infinity;
    for (const w of [...this.#waiters]) {
      if (w.deadline <= now) this.#settle(w, Object.assign(new Error(`no completion within ${w.timeoutMs} ms`), { code: 'ETIMEDOUT' }));
      else next = Math.min(next, w.deadline);
    }
    if (next !== Infinity) this.#arm(next);
  }

  #check(): void {
    if (this.#closed) throw closedError('CompletionQueue');
  }
}
