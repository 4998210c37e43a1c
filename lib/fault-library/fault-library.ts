// The fault library (the thesis's "new software library"): one per process. It listens on
// its netlink socket for the faults the SMMU driver sends it, makes the pages resident the
// way the registration's policy says (touch, touch-ahead, prefetch; THP-aware), and asks the
// engine to retransmit (terminate) or resume (stall). Everything it does happens to real
// memory; the time it takes is measured, and the hardware's share is modelled.
import {
  IommuPageResponseCode,
  NlAttr,
  NlCmd,
  type NetlinkSocket,
  type NlMessage,
  type SimSystem,
  type TraceEvent,
  EvtId,
} from '../../kernel-sim/index.js';
import { HUGE_PAGE_SIZE, findRegion, type Region } from '../region.js';
import type { Userfaultfd } from '../uffd.js';
import { checkInt, invalidArg } from '../validate.js';
import { closedError } from '../errors.js';
import { POLICIES, Prefetcher, spanFor, type PolicyName, type PolicyOptions } from './policy.js';
import { FaultStats, type FaultStatsSnapshot, type Phase } from './stats.js';
import { TraceRecorder } from './trace.js';

/** A range of memory the library resolves with one policy. */
export interface Registration {
  readonly region: Region;
  readonly offset: number;
  readonly length: number;
  policy: PolicyName;
  options: PolicyOptions;
  readonly stats: FaultStats;
  /** @internal */
  prefetcher: Prefetcher | undefined;
}

/** One fault as the library handled it (emitted to onResolve listeners). */
export interface ResolvedFault {
  side: 'source' | 'destination';
  node: number;
  va: bigint;
  write: boolean;
  stall: boolean;
  region: Region | undefined;
  policy: PolicyName | undefined;
  /** Bytes the policy asked to make resident, and pages that really became resident. */
  bytes: number;
  pagesMadeResident: number;
  status: IommuPageResponseCode;
  /** Measured time the library spent resolving, µs. */
  realUs: number;
  /** When the notification reached the library (performance.now(), ms). */
  receivedAt: number;
  /** The transfer it belongs to: posting node, transfer id, block, channel. */
  srcNode: number;
  transfer: number;
  block: number;
  channel: number;
}

interface Pending {
  stats: FaultStats[];
  block?: { real: number; model: number };
  fault?: { real: number; model: number };
  notify?: { real: number; model: number };
  resolved?: { real: number; model: number };
}

export interface FaultLibraryOptions {
  system: SimSystem;
  node: number;
  pid: number;
  socket: NetlinkSocket;
  /** Policy for faults on memory no registration covers (implicit ODP). Default 'touch-ahead'. */
  defaultPolicy?: PolicyName;
  /** The userfaultfd stall-mode memory is registered on (resolved with UFFDIO_ZEROPAGE). */
  uffd?: Userfaultfd;
  /** Keep a trace of every event (default true). */
  trace?: boolean;
}

export class FaultLibrary {
  readonly node: number;
  readonly pid: number;
  readonly trace: TraceRecorder;
  defaultPolicy: PolicyName;
  #socket: NetlinkSocket;
  #uffd: Userfaultfd | undefined;
  #regs: Registration[] = [];
  #stats = new FaultStats();
  #pending = new Map<string, Pending>();
  #listeners: Array<(f: ResolvedFault) => void> = [];
  #untrace: () => void;
  #closed = false;

  constructor(options: FaultLibraryOptions) {
    this.node = options.node;
    this.pid = options.pid;
    this.#socket = options.socket;
    this.#uffd = options.uffd;
    this.defaultPolicy = options.defaultPolicy ?? 'touch-ahead';
    this.trace = new TraceRecorder();
    const tracing = options.trace ?? true;
    this.#untrace = options.system.tracer.on((e) => this.#onTrace(e, tracing));
    this.#socket.onMessage((m) => this.#onMessage(m));
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Resolve faults on [offset, offset+length) of `region` with `policy`. */
  register(region: Region, offset: number, length: number, policy: PolicyName, options: PolicyOptions = {}): Registration {
    this.#check();
    checkPolicy(policy);
    const s = region.span('register', offset, length);
    const reg: Registration = { region, offset: s.offset, length: s.length, policy, options: { ...options }, stats: new FaultStats(), prefetcher: undefined };
    this.#applyPolicy(reg);
    this.#regs.push(reg);
    return reg;
  }

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

  /** The trace as Chrome trace-event JSON (Perfetto, chrome://tracing). */
  exportChromeTrace(): ReturnType<TraceRecorder['toChromeTrace']> {
    return this.trace.toChromeTrace();
  }

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
    if (m.cmd !== NlCmd.FAULT || this.#closed) return;
    const recvReal = performance.now();
    const va = m.attrs.get(NlAttr.VA) as bigint;
    const side = m.attrs.get(NlAttr.SIDE) as 'source' | 'destination';
    const stall = m.attrs.get(NlAttr.STALL) === true;
    const write = m.attrs.get(NlAttr.WRITE) === true;
    const hint = Number(m.attrs.get(NlAttr.LENGTH) ?? 0);
    const { reg, region } = this.#find(va);
    const policy = reg?.policy ?? (region ? this.defaultPolicy : undefined);

    let status = IommuPageResponseCode.INVALID;
    let bytes = 0;
    let made = 0;
    let method: 'touch' | 'gup' | 'uffd' | 'none' = 'none';
    if (region && policy) {
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
      let start = Math.max(lo - (lo % ps), span.offset);
      let end = Math.min(up(hi), up(span.offset + span.length), region.size);
      if (region.hugePages) {
        start -= start % HUGE_PAGE_SIZE;
        end = Math.min(region.size, end + ((HUGE_PAGE_SIZE - (end % HUGE_PAGE_SIZE)) % HUGE_PAGE_SIZE));
      }
      try {
        const before = region.residentPages(start, end - start);
        if (stall) {
          // Stall-mode memory is userfaultfd-registered: place the pages without waking;
          // CMD_RESUME (from the driver, after our answer) replays the access.
          if (!this.#uffd) throw invalidArg('a stalled fault arrived but the fault library has no userfaultfd');
          this.#uffd.zeropage(region, start, end - start, { wake: false });
          method = 'uffd';
        } else {
          region.populate(start, end - start, { write: true });
          method = span.method;
        }
        made = (end - start) / ps - before;
        bytes = end - start;
        status = IommuPageResponseCode.SUCCESS;
      } catch {
        status = IommuPageResponseCode.FAILURE;
      }
    }
    const doneReal = performance.now();
    const reply = new Map<NlAttr, number | bigint | string | boolean>([
      [NlAttr.SID, m.attrs.get(NlAttr.SID)!],
      [NlAttr.VA, va],
      [NlAttr.STATUS, status],
      [NlAttr.LENGTH, bytes],
      [NlAttr.METHOD, method],
      [NlAttr.STALL, stall],
      [NlAttr.STAG, m.attrs.get(NlAttr.STAG) ?? 0],
    ]);

    // Statistics, process-wide and per registration.
    const targets = reg ? [this.#stats, reg.stats] : [this.#stats];
    const kind = `${EvtId[Number(m.attrs.get(NlAttr.EVENT))] ?? 'F_?'}/${write ? 'write' : 'read'}${stall ? '/stall' : ''}`;
    for (const s of targets) {
      s.faults[side]++;
      s.byKind[kind] = (s.byKind[kind] ?? 0) + 1;
      s.notifications++;
      s.pagesMadeResident += made;
      if (bytes) s.resolveCalls++;
      if (status !== IommuPageResponseCode.SUCCESS) s.unresolved++;
      s.real.resolve.add((doneReal - recvReal) * 1000);
      s.real.notify.add((recvReal - m.sentAt) * 1000);
    }
    const pkey = this.#pendingKey(m);
    const p = this.#pending.get(pkey) ?? { stats: targets };
    p.stats = targets;
    p.resolved = { real: doneReal, model: 0 };
    this.#pending.set(pkey, p);

    this.#socket.send(NlCmd.RESOLVED, reply);
    const rf: ResolvedFault = {
      side,
      node: this.node,
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
      srcNode: Number(m.attrs.get(NlAttr.SRC_NODE)),
      transfer: Number(m.attrs.get(NlAttr.TRANSFER)),
      block: Number(m.attrs.get(NlAttr.BLOCK)),
      channel: Number(m.attrs.get(NlAttr.CHANNEL)),
    };
    for (const l of this.#listeners) l(rf);
  }

  // Correlates the library's faults with the engine's trace events: srcNode:tid:seq.
  #pendingKey(m: NlMessage): string {
    return `${m.attrs.get(NlAttr.SRC_NODE)}:${m.attrs.get(NlAttr.TRANSFER)}:${m.attrs.get(NlAttr.BLOCK)}:${m.attrs.get(NlAttr.SIDE)}`;
  }

  #onTrace(e: TraceEvent, tracing: boolean): void {
    if (tracing) this.trace.record(e);
    const seq = e.detail?.['seq'];
    if (seq === undefined || e.tid === undefined) return;
    const src = (e.detail?.['srcNode'] as number | undefined) ?? e.node;
    const at = { real: e.realMs, model: e.modelUs };
    const k = `${src}:${e.tid}:${seq}:${e.side ?? ''}`;
    if (e.kind === 'fault' || e.kind === 'notify' || e.kind === 'resolved') {
      const p = this.#pending.get(k) ?? { stats: [] };
      if (e.kind === 'fault') {
        // The engine says when the faulting block was issued: the detect phase starts there.
        p.block = { real: Number(e.detail?.['issuedMs']), model: Number(e.detail?.['issuedUs']) };
        p.fault = at;
      }
      else if (e.kind === 'notify') p.notify = at;
      else p.resolved = { real: p.resolved?.real ?? at.real, model: at.model };
      this.#pending.set(k, p);
      // Faults of transfers that ended without a retransmission are never closed: keep it bounded.
      if (this.#pending.size > 10_000) this.#pending.delete(this.#pending.keys().next().value as string);
      return;
    }
    if (e.kind === 'retransmit') {
      for (const side of ['source', 'destination']) {
        const key = `${src}:${e.tid}:${seq}:${side}`;
        const p = this.#pending.get(key);
        if (!p || !p.stats.length || !p.fault) continue;
        this.#pending.delete(key);
        for (const s of p.stats) {
          s.retransmittedBlocks++;
          const add = (phase: Phase, a?: { real: number; model: number }, b?: { real: number; model: number }) => {
            if (!a || !b) return;
            s.real[phase].add(Math.max(0, (b.real - a.real) * 1000));
            s.model[phase].add(Math.max(0, b.model - a.model));
          };
          add('detect', p.block, p.fault);
          s.model.notify.add(Math.max(0, (p.notify?.model ?? p.fault.model) - p.fault.model));
          s.model.resolve.add(Math.max(0, (p.resolved?.model ?? 0) - (p.notify?.model ?? p.fault.model)));
          add('retransmit', p.resolved, at);
        }
      }
    }
  }

  #check(): void {
    if (this.#closed) throw closedError('FaultLibrary');
  }
}

function checkPolicy(policy: unknown): asserts policy is PolicyName {
  if (!POLICIES.includes(policy as PolicyName)) throw invalidArg(`policy must be one of ${POLICIES.join(', ')}, got ${String(policy)}`);
}
