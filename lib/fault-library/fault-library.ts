// The fault library (the thesis's "new software library"): one per process. It listens on
// its netlink socket for the faults the SMMU driver sends it, makes the pages resident the
// way the registration's policy says (touch, touch-ahead, prefetch; THP-aware), and asks the
// engine to retransmit (terminate) or resume (stall). Everything it does happens to real
// memory; the time it takes is measured, and the hardware's share is modelled.
import {
  decodeFault,
  decodeResolvedAck,
  encodeResolved,
  EvtId,
  IommuPageResponseCode,
  NlCmd,
  type NetlinkSocket,
  type FaultNotice,
  type NlMessage,
  type ResolvedAck,
  type ResolveMethod,
  type SimSystem,
} from '../../kernel-sim/index.js';
import { HUGE_PAGE_SIZE, findRegion, type Region } from '../region.js';
import type { Userfaultfd } from '../uffd.js';
import { checkInt, invalidArg } from '../validate.js';
import { closedError, PfrError } from '../errors.js';
import { POLICIES, Prefetcher, spanFor, type PolicyName, type PolicyOptions } from './policy.js';
import { FaultStats, type FaultStatsSnapshot } from './stats.js';
import { DEFAULT_TRACE_EVENTS, TraceRecorder, type ChromeTrace } from './trace.js';
import { remotePagerOf } from '../remote-paging/pager.js';
import { touch } from '../toucher.js';

/** A range of memory the library resolves with one policy. */
export interface Registration {
  /** The region the range belongs to. */
  readonly region: Region;
  /** Byte offset of the range in the region. */
  readonly offset: number;
  /** Bytes of the range. */
  readonly length: number;
  /** How a fault in the range is resolved. */
  policy: PolicyName;
  /** Options of the policy (touch-ahead's cap, prefetch's window). */
  options: PolicyOptions;
  /** Faults of this range only. */
  readonly stats: FaultStats;
  /** @internal */
  prefetcher: Prefetcher | undefined;
}

/** One fault as the library handled it (emitted to onResolve listeners). */
export interface ResolvedFault {
  /** Which side of the transfer faulted: the source (read) or the destination (write). */
  side: 'source' | 'destination';
  /** The node whose SMMU took the fault. */
  node: number;
  /** The SMMU stream of the faulting access (one per protection domain). */
  sid: number;
  /** The faulting virtual address. */
  va: bigint;
  /** True for a write access (the destination side). */
  write: boolean;
  /** True if the access was stalled (stall mode) rather than terminated. */
  stall: boolean;
  /** The region that holds the address, if one is known to this process. */
  region: Region | undefined;
  /** The policy that resolved it (undefined if none applied). */
  policy: PolicyName | undefined;
  /** Bytes the policy asked to make resident, and pages that really became resident. */
  bytes: number;
  /** Pages that became resident. */
  pagesMadeResident: number;
  /** The page response sent back (SUCCESS: retry; INVALID or FAILURE: the transfer fails). */
  status: IommuPageResponseCode;
  /** Measured time the library spent resolving, µs. */
  realUs: number;
  /** When the notification reached the library (performance.now(), ms). */
  receivedAt: number;
  /** The transfer it belongs to: posting node, transfer id, block, channel. */
  srcNode: number;
  /** Transfer id on the posting node. */
  transfer: number;
  /** Block number in the transfer. */
  block: number;
  /** Engine channel the transfer runs on. */
  channel: number;
}

/** What resolving a fault came to: the answer's fields and the statistics' figures. */
interface Outcome {
  status: IommuPageResponseCode;
  method: ResolveMethod;
  /** Bytes the policy asked to make resident, pages that became resident, pages a page store supplied. */
  bytes: number;
  made: number;
  fetched: number;
}

const UNRESOLVED: Outcome = { status: IommuPageResponseCode.INVALID, method: 'none', bytes: 0, made: 0, fetched: 0 };

/** An answer waiting for its ACK, which brings the modelled resolve and the retransmission. */
interface Pending {
  stats: FaultStats[];
  notifyUs: number;
  /** When the library had resolved (performance.now() ms). */
  resolvedMs: number;
}

/** A trace: off (false, the default), on with the default ring size (true), or a ring of `limit` events. */
export type TraceOption =
  | boolean
  | {
      /** Newest events kept. */
      limit: number;
    };

/** Events the trace keeps, 0 for none; a clear error for a bad option. */
export function traceLimit(trace: TraceOption | undefined): number {
  if (trace === undefined || trace === false) return 0;
  if (trace === true) return DEFAULT_TRACE_EVENTS;
  if (typeof trace !== 'object' || trace === null || !Number.isSafeInteger(trace.limit) || trace.limit < 1)
    throw invalidArg(`trace must be true, false or { limit: a positive integer } (events kept), got ${JSON.stringify(trace)}`);
  return trace.limit;
}

/** What a fault library is attached to: one process on one node. */
export interface FaultLibraryOptions {
  /** The simulated system whose SMMU drivers notify the library. */
  system: SimSystem;
  /** The node the process runs on. */
  node: number;
  /** The modelled process id (the SMMU stream owner). */
  pid: number;
  /** The netlink socket the driver's notifications arrive on. */
  socket: NetlinkSocket;
  /** Policy for faults on memory no registration covers (implicit ODP). Default 'touch-ahead'. */
  defaultPolicy?: PolicyName;
  /** The userfaultfd stall-mode memory is registered on (resolved with UFFDIO_ZEROPAGE). */
  uffd?: Userfaultfd;
  /**
   * Keep a trace of the fault events (for exportChromeTrace): off by default (nothing listens
   * to the system's events then, and nothing is kept); true keeps the newest
   * DEFAULT_TRACE_EVENTS events, `{ limit }` the newest `limit`.
   */
  trace?: TraceOption;
}

/** The user-space fault library of one process (the thesis's): takes the SMMU driver's netlink notifications, makes the pages resident by the range's policy, and asks for the retransmission or resume. */
export class FaultLibrary {
  /** The node the process runs on. */
  readonly node: number;
  /** The modelled process id. */
  readonly pid: number;
  /** This process's trace recorder (exportChromeTrace). */
  readonly trace: TraceRecorder;
  /** Policy for faults no registration covers (implicit ODP). */
  defaultPolicy: PolicyName;
  #socket: NetlinkSocket;
  #uffd: Userfaultfd | undefined;
  #regs: Registration[] = [];
  #stats = new FaultStats();
  #pending = new Map<number, Pending>(); // by the sequence number of the RESOLVED
  #listeners: Array<(f: ResolvedFault) => void> = [];
  #remoteFetches: Promise<void> = Promise.resolve(); // the chain of remote-paged resolutions
  #untrace: () => void;
  #tracing: boolean;
  #system: SimSystem;
  #closed = false;

  constructor(options: FaultLibraryOptions) {
    this.node = options.node;
    this.pid = options.pid;
    this.#socket = options.socket;
    this.#uffd = options.uffd;
    this.defaultPolicy = options.defaultPolicy ?? 'touch-ahead';
    const limit = traceLimit(options.trace);
    this.#tracing = limit > 0;
    this.#system = options.system;
    this.trace = new TraceRecorder(limit || undefined, { node: this.node, pid: this.pid });
    // The trace is observation only; the statistics come with the fault notices and the ACKs.
    this.#untrace = limit ? options.system.tracer.on((e) => this.trace.record(e)) : () => {};
    this.#socket.onMessage((m) => this.#onMessage(m));
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Resolve faults on [offset, offset+length) of `region` with `policy`. */
  register(region: Region, offset: number, length: number, policy: PolicyName, options: PolicyOptions = {}): Registration {
    this.#check();
    checkPolicy(policy);
    const s = region.span('register', offset, length);
    const reg: Registration = {
      region,
      offset: s.offset,
      length: s.length,
      policy,
      options: { ...options },
      stats: new FaultStats(),
      prefetcher: undefined,
    };
    this.#applyPolicy(reg);
    this.#regs.push(reg);
    return reg;
  }

  /** Forget the range: later faults in it are resolved as memory no registration covers. */
  unregister(reg: Registration): void {
    const i = this.#regs.indexOf(reg);
    if (i >= 0) this.#regs.splice(i, 1);
  }

  /** Change a registration's policy at run time. */
  setPolicy(reg: Registration, policy: PolicyName, options?: PolicyOptions): void {
    this.#check();
    checkPolicy(policy);
    reg.policy = policy;
    if (options) reg.options = { ...options };
    this.#applyPolicy(reg);
  }

  /** Run `listener` after each fault the library resolves. */
  onResolve(listener: (f: ResolvedFault) => void): () => void {
    this.#listeners.push(listener);
    return () => {
      this.#listeners = this.#listeners.filter((l) => l !== listener);
    };
  }

  /** Process-wide statistics. */
  stats(): FaultStatsSnapshot {
    return this.#stats.snapshot();
  }

  /** Whether this library keeps a trace (the cluster or the device was opened with `trace`). */
  get tracing(): boolean {
    return this.#tracing;
  }

  /**
   * This process's trace as Chrome trace-event JSON (Perfetto, chrome://tracing), each time
   * base from 0 at its earliest event; with `options.with`, other processes of the same
   * cluster in the same export (a fault's flow from one process to another is paired then).
   * Throws ERR_PFR_TRACE_OFF unless the trace was asked for: `Cluster.create({ trace: true })`.
   */
  exportChromeTrace(options: { with?: readonly FaultLibrary[] } = {}): ChromeTrace {
    for (const lib of [this, ...(options.with ?? [])]) {
      if (!lib.#tracing)
        throw new PfrError(
          'ERR_PFR_TRACE_OFF',
          `exportChromeTrace: the fault library of node ${lib.node} (pid ${lib.pid}) keeps no trace; create the cluster with ` +
            'Cluster.create({ trace: true }) (or openDevice(node, { trace: true })) before the transfers',
        );
      if (lib.#system !== this.#system) throw invalidArg('exportChromeTrace: options.with must hold fault libraries of the same cluster');
    }
    return this.trace.toChromeTrace({ with: (options.with ?? []).map((l) => l.trace.scope!), origin: 'first-event' });
  }

  /** Stop listening: the netlink socket is closed and the trace no longer recorded. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#untrace();
    this.#socket.close();
  }

  #applyPolicy(reg: Registration): void {
    if (reg.policy === 'prefetch') reg.prefetcher ??= new Prefetcher(reg.options.minWindowPages, reg.options.maxWindowPages);
    if (reg.options.cap !== undefined) checkInt('policy option cap', reg.options.cap, 1);
  }

  #find(va: bigint): { reg: Registration | undefined; region: Region | undefined } {
    for (let i = this.#regs.length - 1; i >= 0; i--) {
      const r = this.#regs[i]!;
      if (r.region.closed) continue;
      const start = r.region.address + BigInt(r.offset);
      if (va >= start && va < start + BigInt(r.length)) return { reg: r, region: r.region };
    }
    return { reg: undefined, region: findRegion(va) };
  }

  #onMessage(m: NlMessage): void {
    const ack = decodeResolvedAck(m);
    if (ack) return this.#onAck(ack);
    const n = decodeFault(m);
    if (!n || this.#closed) return;
    const recvReal = performance.now();
    const { va, stall, length: hint } = n;
    const { reg, region } = this.#find(va);
    const policy = reg?.policy ?? (region ? this.defaultPolicy : undefined);
    if (!region || !policy) return this.#answer(m, n, reg, region, policy, recvReal, UNRESOLVED);

    const ps = region.pageSize;
    const off = Number(va - region.address);
    const page = off - (off % ps);
    const span = spanFor(policy, page, hint + (off - page), ps, reg?.options ?? {}, reg?.prefetcher);
    // Clip to the registration (or region), in whole pages (a hint that ends mid-page, as
    // for a transfer starting mid-page, still covers its last page), then widen to whole
    // huge pages for THP memory.
    const up = (x: number) => x + ((ps - (x % ps)) % ps);
    const lo = reg ? reg.offset : 0;
    const hi = reg ? reg.offset + reg.length : region.size;
    let start = Math.max(lo, span.offset); // a registration starts on a page (region.span)
    let end = Math.min(up(hi), up(span.offset + span.length), region.size);
    if (region.hugePages) {
      start -= start % HUGE_PAGE_SIZE;
      end = Math.min(region.size, end + ((HUGE_PAGE_SIZE - (end % HUGE_PAGE_SIZE)) % HUGE_PAGE_SIZE));
    }
    let before = 0; // resident pages of the span before (read where a closed region can throw)
    const done = (status: IommuPageResponseCode, method: ResolveMethod, fetched = 0): Outcome => ({
      status,
      method,
      fetched,
      bytes: status === IommuPageResponseCode.SUCCESS ? end - start : 0,
      made: status === IommuPageResponseCode.SUCCESS ? (end - start) / ps - before : 0,
    });
    const pager = remotePagerOf(region);
    if (pager && !stall) {
      // A remote-paged region's missing pages come from its page store, which may take long:
      // populate() would hold this thread (its event loop stopped) until they came. A native
      // toucher thread reads the span instead, and the answer goes when it is done. One such
      // fetch at a time, so the store's major-fault count is this answer's own.
      const fetch = async (): Promise<Outcome> => {
        const majorBefore = pager.stats().majorFaults;
        try {
          before = region.residentPages(start, end - start);
          await touch(region, { offset: start, length: end - start, probe: true });
          return done(IommuPageResponseCode.SUCCESS, span.method, pager.stats().majorFaults - majorBefore);
        } catch {
          return done(IommuPageResponseCode.FAILURE, 'none');
        }
      };
      const next = this.#remoteFetches.then(fetch);
      this.#remoteFetches = next.then(() => undefined);
      void next.then((o) => this.#answer(m, n, reg, region, policy, recvReal, o));
      return;
    }
    let outcome: Outcome;
    try {
      before = region.residentPages(start, end - start);
      if (stall) {
        // Stall-mode memory is userfaultfd-registered: place the pages without waking;
        // CMD_RESUME (from the driver, after our answer) replays the access.
        if (!this.#uffd) throw invalidArg('a stalled fault arrived but the fault library has no userfaultfd');
        this.#uffd.zeropage(region, start, end - start, { wake: false });
        outcome = done(IommuPageResponseCode.SUCCESS, 'uffd');
      } else {
        region.populate(start, end - start, { write: true });
        outcome = done(IommuPageResponseCode.SUCCESS, span.method);
      }
    } catch {
      outcome = done(IommuPageResponseCode.FAILURE, 'none');
    }
    this.#answer(m, n, reg, region, policy, recvReal, outcome);
  }

  /** Send the answer to a fault notice, and account for it. */
  #answer(
    m: NlMessage,
    n: FaultNotice,
    reg: Registration | undefined,
    region: Region | undefined,
    policy: PolicyName | undefined,
    recvReal: number,
    { status, method, bytes, made, fetched }: Outcome,
  ): void {
    if (this.#closed) return;
    const { va, side, stall, write } = n;
    const doneReal = performance.now();
    const reply = encodeResolved({ sid: n.sid, va, status, length: bytes, method, stall, stag: n.stag, fetched });

    // Statistics, process-wide and per registration.
    const targets = reg ? [this.#stats, reg.stats] : [this.#stats];
    const kind = `${EvtId[n.event] ?? 'F_?'}/${write ? 'write' : 'read'}${stall ? '/stall' : ''}`;
    for (const s of targets) {
      s.faults[side]++;
      s.byKind[kind] = (s.byKind[kind] ?? 0) + 1;
      s.notifications++;
      s.pagesMadeResident += made;
      s.majorFaults += fetched;
      if (bytes) s.resolveCalls++;
      if (status !== IommuPageResponseCode.SUCCESS) s.unresolved++;
      s.real.resolve.add((doneReal - recvReal) * 1000);
      s.real.notify.add((recvReal - m.sentAt) * 1000);
    }
    for (const st of targets) {
      // The notice brings the fault's timeline so far: issue → detection → notification.
      st.real.detect.add(Math.max(0, (n.detectedMs - n.issuedMs) * 1000));
      st.model.detect.add(Math.max(0, n.detectedUs - n.issuedUs));
      st.model.notify.add(Math.max(0, n.notifyUs - n.detectedUs));
    }
    const seq = this.#socket.send(NlCmd.RESOLVED, reply, { ack: true });
    this.#pending.set(seq, { stats: targets, notifyUs: n.notifyUs, resolvedMs: doneReal });
    // Answers whose transfer ended without a retransmission are never acknowledged: keep it bounded.
    if (this.#pending.size > 10_000) this.#pending.delete(this.#pending.keys().next().value as number);
    const rf: ResolvedFault = {
      side,
      node: this.node,
      sid: n.sid,
      va,
      write,
      stall,
      region,
      policy,
      bytes,
      pagesMadeResident: made,
      status,
      realUs: (doneReal - recvReal) * 1000,
      receivedAt: recvReal,
      srcNode: n.srcNode,
      transfer: n.transfer,
      block: n.block,
      channel: n.channel,
    };
    for (const l of this.#listeners) l(rf);
  }

  // The kernel acknowledged an answer: when it reached the engine and, once the block went
  // out again, when that was.
  #onAck(ack: ResolvedAck): void {
    const p = this.#pending.get(ack.seq);
    if (!p) return;
    this.#pending.delete(ack.seq);
    for (const s of p.stats) {
      s.model.resolve.add(Math.max(0, ack.resolvedUs - p.notifyUs));
      if (ack.retransmitUs === undefined || ack.retransmitMs === undefined) continue;
      s.retransmittedBlocks++;
      s.real.retransmit.add(Math.max(0, (ack.retransmitMs - p.resolvedMs) * 1000));
      s.model.retransmit.add(Math.max(0, ack.retransmitUs - ack.resolvedUs));
    }
  }

  #check(): void {
    if (this.#closed) throw closedError('FaultLibrary');
  }
}

function checkPolicy(policy: unknown): asserts policy is PolicyName {
  if (!POLICIES.includes(policy as PolicyName)) throw invalidArg(`policy must be one of ${POLICIES.join(', ')}, got ${String(policy)}`);
}
