// Shared pieces of the kernel-sim suites: a two-node system with one process per node, a
// small test fault library (a netlink listener that makes pages resident and answers
// RESOLVED), and cleanup that closes systems, userfaultfds and regions after each test.
import { afterEach } from 'vitest';
import { mapRegion, Userfaultfd, type Fault, type MapOptions, type Region, type UffdOpenOptions } from '../../lib/index.js';
import {
  decodeFault,
  encodeResolved,
  IommuPageResponseCode,
  NlCmd,
  SimSystem,
  type CopyEngine,
  type CopyResult,
  type CopyTag,
  type DmaCompletion,
  type DmaDescriptor,
  type FaultModel,
  type NetlinkSocket,
  type NlMessage,
  type ResolveMethod,
  type SimNode,
  type StreamContext,
  type SystemOptions,
} from '../../kernel-sim/index.js';
import { deferred, P, pattern } from '../helpers.js';

// The small helpers every suite shares.
export { deferred, P, pattern, sleep, until } from '../helpers.js';

/**
 * Everything a test opens, closed after it in a safe order: systems first (every transfer
 * ends FLUSHED, the copy engine stops), then fault libraries and userfaultfds (nothing left
 * blocked), then regions.
 */
export interface Env {
  system(options?: SystemOptions): SimSystem;
  region(bytes: number, options?: MapOptions): Region;
  uffd(options?: UffdOpenOptions): Userfaultfd;
  track<T extends { close(): void }>(resource: T): T;
}

export function useEnv(): Env {
  const systems: SimSystem[] = [];
  const middle: { close(): void }[] = [];
  const regions: Region[] = [];
  afterEach(() => {
    const failed = middle.flatMap((m) => (m instanceof FaultLibrary ? m.errors : []));
    for (const s of systems.splice(0)) s.close();
    for (const m of middle.splice(0).reverse()) m.close();
    for (const r of regions.splice(0).reverse()) r.close();
    // A fault library that threw would otherwise only show as a timeout.
    if (failed.length) throw new AggregateError(failed, 'the test fault library failed');
  });
  return {
    system(options) {
      const s = new SimSystem(options);
      systems.push(s);
      return s;
    },
    region(bytes, options) {
      const r = mapRegion(bytes, options);
      regions.push(r);
      return r;
    },
    uffd(options) {
      const u = Userfaultfd.open(options);
      middle.push(u);
      return u;
    },
    track(resource) {
      middle.push(resource);
      return resource;
    },
  };
}

/**
 * Hold one of `engine`'s copy threads in a genuine userfaultfd fault: it copies from a
 * registered source page that is missing (tagged `tag`) until `release()`, which answers the
 * fault and returns that copy's result. With a one-thread engine, later copies wait queued.
 */
export async function holdCopyThread(env: Env, engine: CopyEngine, tag?: CopyTag): Promise<() => Promise<CopyResult>> {
  const gate = deferred();
  const faulted = deferred();
  const uffd = env.uffd({
    handler: async (f, u) => {
      faulted.resolve();
      await gate.promise;
      u.zeropage(f.region, f.offset, P);
    },
  });
  const missing = env.region(P);
  const sink = env.region(P);
  sink.populate();
  uffd.register(missing);
  const held = engine.copy(missing, 0, sink, 0, P, 0, tag);
  await within('the copy thread to fault', faulted.promise);
  return () => {
    gate.resolve();
    return within('the held copy', held);
  };
}

export interface Proc {
  node: SimNode;
  stream: StreamContext;
  socket: NetlinkSocket;
  pid: number;
  pd: number;
}

/** A process with protection domain `pd` on `node`, its regions mapped into its stream. */
export function proc(node: SimNode, pid: number, pd: number, regions: Region[] = [], faultModel?: FaultModel): Proc {
  const { stream, socket } = node.attachProcess(faultModel ? { pid, pd, faultModel } : { pid, pd });
  for (const r of regions) node.map(stream, r);
  return { node, stream, socket, pid, pd };
}

/**
 * Node 0: terminate-mode source (filled). Node 1: stall-mode destination registered on a
 * userfaultfd (or the other way round with `stallSide: 'source'`).
 */
export function stallRig(
  env: Env,
  pages: number,
  o: { stallSide?: 'source' | 'destination'; blockSize?: number; costs?: SystemOptions['costs']; hardware?: string } = {},
) {
  const stallSide = o.stallSide ?? 'destination';
  const sys = env.system({
    nodes: 2,
    ...(o.blockSize ? { blockSize: o.blockSize } : {}),
    ...(o.costs ? { costs: o.costs } : {}),
    ...(o.hardware ? { hardware: o.hardware } : {}),
  });
  const uffd = env.uffd();
  const src = env.region(pages * P);
  const dst = env.region(pages * P);
  const data = fill(src, 0x31);
  if (stallSide === 'source') {
    // Keep the contents, make the pages missing, then register: the library will provide them.
    src.evict();
    uffd.register(src);
    dst.populate();
  } else {
    uffd.register(dst);
  }
  sys.attachStallSource(uffd);
  const a = proc(sys.node(0), 100, 7, [src], stallSide === 'source' ? 'stall' : 'terminate');
  const b = proc(sys.node(1), 200, 7, [dst], stallSide === 'destination' ? 'stall' : 'terminate');
  const deviceFaults: Fault[] = [];
  uffd.on('fault', (f: Fault) => deviceFaults.push(f));
  return { sys, uffd, src, dst, data, a, b, deviceFaults };
}

/** Resolve a stalled page without waking the thread: only CMD_RESUME RETRY may wake it. */
export function zeroNoWake(uffd: Userfaultfd) {
  return (r: Region, off: number, len: number) => uffd.zeropage(r, off, len, { wake: false });
}

/** Post `src` (node 0) → `dst` (node `dstNode`, default 1): whole regions unless told. */
export function post(node: SimNode, src: Region, dst: Region, d: Partial<DmaDescriptor> = {}): Promise<DmaCompletion> {
  return node.post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: Math.min(src.size, dst.size), pd: 7, ...d });
}

/** Fill a region with `pattern(pages, base)` through the CPU (makes every page resident). */
export function fill(r: Region, base = 1): Buffer {
  const data = pattern(r.size / P, base);
  new Uint8Array(r.buffer).set(data);
  return data;
}

export function bytesOf(r: Region, offset = 0, length = r.size - offset): Buffer {
  return Buffer.from(r.buffer, offset, length);
}

/** Indexes of the pages of `r` that are resident. */
export function residentPages(r: Region): number[] {
  const out: number[] = [];
  r.residency().forEach((v, i) => v && out.push(i));
  return out;
}

/** A promise that fails instead of hanging. */
export async function within<T>(what: string, p: Promise<T>, ms = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out (${ms} ms) waiting for ${what}`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

// ---- the test fault library -----------------------------------------------------------

/** One FAULT notification as the library received it. */
export interface FaultNote {
  msg: NlMessage;
  va: bigint;
  /** The LENGTH hint: bytes of the transfer from `va` on. */
  hint: number;
  write: boolean;
  side: string;
  sid: number;
  node: number;
  channel: number;
  transfer: number;
  stall: boolean;
  stag: number;
  region: Region;
  /** Offset of the faulting page in `region`. */
  offset: number;
}

export type Policy = 'touch' | 'ahead';

export interface FaultLibraryOptions {
  /** The process's regions, to find the one a faulting VA belongs to. */
  regions: Region[];
  /** touch: one page per fault; ahead: the LENGTH hint on the first fault (Touch-Ahead). */
  policy?: Policy;
  /** METHOD attribute of the answer (cost-model input); default 'touch' or 'gup' by policy. */
  method?: ResolveMethod;
  /** Make [offset, offset+length) of `region` resident; default region.populate(). */
  resolve?: (region: Region, offset: number, length: number, note: FaultNote) => void;
  /** Make nothing resident (answer only). */
  noResolve?: boolean;
  /** STATUS of the answer (default SUCCESS). */
  status?: IommuPageResponseCode;
  /** Wait for this before resolving and answering (per fault); undefined: answer at once. */
  hold?: (note: FaultNote) => Promise<void> | undefined;
  /** Never answer. */
  silent?: boolean;
}

/**
 * The fault library of one process: on NlCmd.FAULT it makes the page(s) resident (one page,
 * or Touch-Ahead: the LENGTH hint) and answers NlCmd.RESOLVED with SID, VA, STATUS, LENGTH,
 * METHOD (and STALL, STAG for stalled accesses).
 */
export class FaultLibrary {
  readonly faults: FaultNote[] = [];
  readonly errors: unknown[] = [];
  answered = 0;
  /** Pages made resident, summed over faults. */
  pagesResolved = 0;
  #socket: NetlinkSocket;
  #o: FaultLibraryOptions;
  #closed = false;

  constructor(socket: NetlinkSocket, options: FaultLibraryOptions) {
    this.#socket = socket;
    this.#o = options;
    socket.onMessage((m) => {
      if (m.cmd !== NlCmd.FAULT || this.#closed) return;
      this.#on(m).catch((err: unknown) => this.errors.push(err));
    });
  }

  async #on(m: NlMessage): Promise<void> {
    const n = decodeFault(m)!;
    const va = n.va;
    const region = this.#o.regions.find((r) => !r.closed && va >= r.address && va < r.address + BigInt(r.size));
    if (!region) throw new Error(`fault at 0x${va.toString(16)} is in none of the library's regions`);
    const offset = Number(va - region.address) - (Number(va - region.address) % P);
    const note: FaultNote = {
      msg: m,
      va,
      hint: n.length,
      write: n.write,
      side: n.side,
      sid: n.sid,
      node: n.node,
      channel: n.channel,
      transfer: n.transfer,
      stall: n.stall,
      stag: n.stag,
      region,
      offset,
    };
    this.faults.push(note);
    const held = this.#o.hold?.(note);
    if (held) await held;
    if (this.#closed || this.#o.silent) return;
    const policy = this.#o.policy ?? 'touch';
    const wanted = policy === 'ahead' ? Math.max(note.hint, P) : P;
    const length = Math.min(Math.ceil(wanted / P) * P, region.size - offset);
    if (!this.#o.noResolve) {
      if (this.#o.resolve) this.#o.resolve(region, offset, length, note);
      else region.populate(offset, length);
      this.pagesResolved += length / P;
    }
    this.answer(note, this.#o.status ?? IommuPageResponseCode.SUCCESS, this.#o.noResolve ? 0 : length);
  }

  answer(note: FaultNote, status: IommuPageResponseCode, length: number): void {
    answerFault(this.#socket, note, status, length, this.#o.method ?? ((this.#o.policy ?? 'touch') === 'ahead' ? 'gup' : 'touch'));
    this.answered++;
  }

  close(): void {
    this.#closed = true;
  }
}

/** Send NlCmd.RESOLVED for `note` on `socket` (tests that answer by hand use this). */
export function answerFault(
  socket: NetlinkSocket,
  note: FaultNote,
  status: IommuPageResponseCode,
  length: number,
  method: ResolveMethod = 'touch',
): void {
  const attrs = encodeResolved({ sid: note.sid, va: note.va, status, length, method, stall: note.stall, stag: note.stag });
  socket.send(NlCmd.RESOLVED, attrs);
}

/** Sum of the counters that must agree after a run: what each layer saw. */
export function layerCounts(
  sys: SimSystem,
  node: number,
): {
  smmuFaults: number;
  recorded: number;
  overflows: number;
  driverRecords: number;
  notified: number;
  driverDropped: number;
  nlDelivered: number;
  nlDropped: number;
} {
  const n = sys.node(node);
  const s = n.smmu.counters();
  const d = n.driver.counters();
  const nl = n.netlink.counters();
  return {
    smmuFaults: Object.values(s.faults).reduce((a, b) => a + b, 0),
    recorded: s.eventsRecorded,
    overflows: s.eventQueueOverflows,
    driverRecords: d.records,
    notified: d.notified,
    driverDropped: d.dropped,
    nlDelivered: nl.delivered,
    nlDropped: nl.dropped,
  };
}
