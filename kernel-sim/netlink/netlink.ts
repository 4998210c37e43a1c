// A generic-netlink-like channel between the (modelled) kernel and processes. One family,
// unicast per process (a process receives only its own faults), sequence numbers, typed
// attributes, acknowledgements, and bounded socket queues whose drops are counted.

/** Attributes of a fault notification (PFR_ATTR_*). */
export enum NlAttr {
  /** Process id. */
  PID = 1,
  /** Virtual address. */
  VA = 2,
  /** Length in bytes (the Touch-Ahead hint, or bytes made resident). */
  LENGTH = 3,
  /** Write access (boolean). */
  WRITE = 4,
  /** Node id. */
  NODE = 5,
  /** Engine channel. */
  CHANNEL = 6,
  /** Transfer id. */
  TRANSFER = 7,
  /** Side: 'source' or 'destination'. */
  SIDE = 8,
  /** SMMU stream id. */
  SID = 9,
  /** Stall tag or grpid. */
  STAG = 10,
  /** SMMU event id (EvtId). */
  EVENT = 11,
  /** Page response code (IommuPageResponseCode). */
  STATUS = 12,
  /** Stalled access (boolean). */
  STALL = 13,
  /** Block number. */
  BLOCK = 14,
  /** How the library made pages resident: 'touch', 'gup', 'uffd' or 'none'. */
  METHOD = 15,
  /** Node that posted the transfer (the source). */
  SRC_NODE = 16,
  /** Modelled µs: when the faulting block was issued, when the fault was detected, when the notice was sent. */
  ISSUED_US = 17,
  /** Modelled µs the fault was detected. */
  DETECTED_US = 18,
  /** Modelled µs the notice was sent. */
  NOTIFY_US = 19,
  /** Real ms (performance.now()): when the faulting block was issued and when the fault was detected. */
  ISSUED_MS = 20,
  /** Real ms the fault was detected. */
  DETECTED_MS = 21,
  /** In the ACK of RESOLVED: when the answer reached the engine (modelled µs), and when the block went out again (modelled µs, real ms). */
  RESOLVED_US = 22,
  /** Modelled µs the block went out again. */
  RETRANSMIT_US = 23,
  /** Real ms the block went out again. */
  RETRANSMIT_MS = 24,
  /** In RESOLVED: pages a page store supplied to resolve the fault (remote paging's major faults). */
  FETCHED = 25,
}

/** Commands of the family (PFR_CMD_*). */
export enum NlCmd {
  /** kernel → process: a fault to resolve. */
  FAULT = 1,
  /** process → kernel: resolved (STATUS: 0 success / retry, 1 invalid, 2 failure). */
  RESOLVED = 2,
  /** kernel → process: acknowledgement of a request (NLMSG_ERROR with error 0 is an ack). */
  ACK = 3,
}

/** One generic-netlink message. */
export interface NlMessage {
  /** Family name. */
  family: string;
  /** Command. */
  cmd: NlCmd;
  /** Sequence number (per sender). */
  seq: number;
  /** Port id of the sender (0 = kernel). */
  portId: number;
  /** Attributes. */
  attrs: Map<NlAttr, number | bigint | string | boolean>;
  /** When it was sent (performance.now()), for the measured notify time. */
  sentAt: number;
}

/** Counters of one netlink family. */
export interface NetlinkCounters {
  /** Messages sent to processes. */
  sent: number;
  /** Messages a process received. */
  delivered: number;
  /** Messages dropped on a full socket queue. */
  dropped: number;
  /** Messages for a process with no socket bound. */
  noListener: number;
  /** ACKs sent back for NLM_F_ACK requests. */
  acks: number;
}

/** The kernel side's handler: attributes for the ACK, or 'defer' (it will call ack() itself). */
export type KernelHandler = (
  m: NlMessage,
  from: NetlinkSocket,
  wantsAck: boolean,
) => Map<NlAttr, number | bigint | string | boolean> | 'defer' | void;

/** A process's socket bound to the family. */
export class NetlinkSocket {
  /** The process the socket is bound to. */
  readonly pid: number;
  /** Messages the receive queue holds before it drops. */
  readonly capacity: number;
  #queue: NlMessage[] = [];
  #waiters: Array<(m: NlMessage | undefined) => void> = [];
  #listener: ((m: NlMessage) => void) | undefined;
  #closed = false;
  #bus: NetlinkFamily;
  /** Messages dropped on a full queue. */
  dropped = 0;
  /** Messages received. */
  received = 0;

  /** @internal */
  constructor(bus: NetlinkFamily, pid: number, capacity: number) {
    this.#bus = bus;
    this.pid = pid;
    this.capacity = capacity;
  }

  /** Deliver messages to a callback as they arrive (instead of recv()). */
  onMessage(listener: (m: NlMessage) => void): void {
    this.#listener = listener;
    while (this.#queue.length) listener(this.#queue.shift()!);
  }

  /** Receive the next message; undefined once closed. */
  recv(): Promise<NlMessage | undefined> {
    const m = this.#queue.shift();
    if (m || this.#closed) return Promise.resolve(m);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /**
   * Send a message to the kernel side of the family. Returns its sequence number. With
   * `ack` (NLM_F_ACK) the kernel answers with an ACK message carrying the same seq.
   */
  send(cmd: NlCmd, attrs: Map<NlAttr, number | bigint | string | boolean>, options: { ack?: boolean } = {}): number {
    if (this.#closed) throw new Error('netlink socket is closed');
    return this.#bus.fromUser(this, cmd, attrs, options.ack ?? false);
  }

  /** Unbind the socket; receivers still waiting get `undefined`. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#bus.unbind(this);
    for (const w of this.#waiters.splice(0)) w(undefined);
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** @internal */
  deliver(m: NlMessage): boolean {
    if (this.#closed) return false;
    this.received++;
    if (this.#listener) {
      // Another process in reality: it runs after the sender, never inside it.
      const listener = this.#listener;
      queueMicrotask(() => {
        if (!this.#closed) listener(m);
      });
      return true;
    }
    const w = this.#waiters.shift();
    if (w) {
      w(m);
      return true;
    }
    if (this.#queue.length >= this.capacity) {
      this.dropped++;
      return false;
    }
    this.#queue.push(m);
    return true;
  }
}

/** One generic netlink family on one node ("pagefault-rdma"). */
export class NetlinkFamily {
  /** Family name. */
  readonly name: string;
  /** The node whose kernel the family lives in. */
  readonly node: number;
  #sockets = new Map<number, NetlinkSocket>();
  #kernel: KernelHandler | undefined;
  #seq = 1;
  #monitors: Array<(m: NlMessage, to: number | undefined) => void> = [];
  #counters: NetlinkCounters = { sent: 0, delivered: 0, dropped: 0, noListener: 0, acks: 0 };
  #capacity: number;

  constructor(node: number, options: { name?: string; socketQueue?: number } = {}) {
    this.node = node;
    this.name = options.name ?? 'pagefault-rdma';
    this.#capacity = options.socketQueue ?? 64;
  }

  /** A process binds its socket (one per pid). */
  bind(pid: number): NetlinkSocket {
    if (this.#sockets.has(pid)) throw new Error(`netlink: pid ${pid} is already bound on node ${this.node}`);
    const s = new NetlinkSocket(this, pid, this.#capacity);
    this.#sockets.set(pid, s);
    return s;
  }

  /** The socket bound to `pid`, if any. */
  socket(pid: number): NetlinkSocket | undefined {
    return this.#sockets.get(pid);
  }

  /**
   * Watch every message of the family, both ways, like nlmon: `to` is the pid a kernel
   * message was sent to (undefined for messages from a process). Returns an unsubscribe.
   */
  monitor(listener: (m: NlMessage, to: number | undefined) => void): () => void {
    this.#monitors.push(listener);
    return () => {
      this.#monitors = this.#monitors.filter((l) => l !== listener);
    };
  }

  /**
   * The kernel side's receive hook (the SMMU driver). It may return attributes for the ACK
   * of a request that asked for one, or 'defer' to send that ACK later with `ack()` (once
   * the request has been acted on).
   */
  onKernelMessage(handler: KernelHandler): void {
    this.#kernel = handler;
  }

  /** Acknowledge request `seq` of `socket` (NLMSG_ERROR with error 0), with extra attributes. */
  ack(socket: NetlinkSocket, seq: number, attrs: Map<NlAttr, number | bigint | string | boolean> = new Map()): void {
    this.#counters.acks++;
    socket.deliver({ family: this.name, cmd: NlCmd.ACK, seq, portId: 0, attrs: new Map([[NlAttr.STATUS, 0], ...attrs]), sentAt: performance.now() });
  }

  /**
   * Unicast from the kernel to one process. Returns the sequence number, or -1 if the
   * message was dropped (no socket for that pid, or its queue is full): counted.
   */
  unicast(pid: number, cmd: NlCmd, attrs: Map<NlAttr, number | bigint | string | boolean>): number {
    const seq = this.#seq++;
    this.#counters.sent++;
    const s = this.#sockets.get(pid);
    if (!s) {
      this.#counters.noListener++;
      this.#counters.dropped++;
      return -1;
    }
    const msg: NlMessage = { family: this.name, cmd, seq, portId: 0, attrs, sentAt: performance.now() };
    for (const mon of this.#monitors) mon(msg, pid);
    const ok = s.deliver(msg);
    if (!ok) {
      this.#counters.dropped++;
      return -1;
    }
    this.#counters.delivered++;
    return seq;
  }

  /** @internal */
  fromUser(s: NetlinkSocket, cmd: NlCmd, attrs: Map<NlAttr, number | bigint | string | boolean>, ack: boolean): number {
    const seq = this.#seq++;
    const m: NlMessage = { family: this.name, cmd, seq, portId: s.pid, attrs, sentAt: performance.now() };
    for (const mon of this.#monitors) mon(m, undefined);
    const extra = this.#kernel?.(m, s, ack);
    if (ack && extra !== 'defer') this.ack(s, seq, extra ?? new Map());
    return seq;
  }

  /** @internal */
  unbind(s: NetlinkSocket): void {
    if (this.#sockets.get(s.pid) === s) this.#sockets.delete(s.pid);
  }

  /** The counters now. */
  counters(): NetlinkCounters {
    return { ...this.#counters };
  }
}
