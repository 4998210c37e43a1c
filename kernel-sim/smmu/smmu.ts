// The SMMU of one node. Translation walks the *real* state of the owning process's memory
// (its page-table entries, /proc/self/pagemap, through the addon), the way the ExaNeSt SMMU
// walked the process's own page tables: a page that is not mapped is a translation fault.
// An IOTLB caches what the walk found and is invalidated when pages are evicted or regions
// unmapped.
//
// Fault models per stream: terminate (the access aborts, the engine sees the error; the
// thesis's choice) and stall (the engine's copy thread blocks in a genuine userfaultfd fault
// until CMD_RESUME).
import { binding } from '../../native/index.js';
import type { MemoryLike, MemoryObserver, UffdFaultLike, UffdLike } from '../memory.js';
import { EventQueue } from './event-queue.js';
import { Iotlb, type RunPages } from './iotlb.js';
import { CMD_RESUME, CMD_STALL_TERM, EvtClass, EvtId, ResumeResp, type SmmuCommand, type SmmuEventRecord } from './records.js';

/** How far ahead one real page-table read looks (not a modelled cost). */
const WALK_AHEAD_BYTES = 256 * 1024;

/** What the SMMU does on a fault: abort the access and report it (terminate, the thesis's), or hold it until CMD_RESUME (stall). */
export type FaultModel = 'terminate' | 'stall';
/** An access's direction. */
export type Access = 'read' | 'write';

/** One region of the process's address space as the SMMU sees it, with its permissions. */
export interface StreamMapping {
  /** The region mapped. */
  region: MemoryLike;
  /** The device may read it. */
  read: boolean;
  /** The device may write it. */
  write: boolean;
}

/** A stream table entry: the context of one process (protection domain) on this node. */
export interface StreamContext {
  /** StreamID. */
  readonly sid: number;
  /** The process that owns the stream. */
  readonly pid: number;
  /** Protection-domain id the stream serves. */
  readonly pd: number;
  /** Terminate or stall on a fault. */
  faultModel: FaultModel;
  /** The regions the device may access through this stream. */
  readonly mappings: StreamMapping[];
}

/** The result of translating one access: where it lands, or the fault it raised. */
export type Translation =
  | {
      /** Translated. */
      ok: true;
      /** Region the access lands in. */
      region: MemoryLike;
      /** Byte offset in that region. */
      offset: number;
      /** Pages walked (0 on an IOTLB hit). */
      walked: number;
      /** True if the IOTLB had the translation. */
      hit: boolean;
    }
  | {
      /** Not translated: a fault. */
      ok: false;
      /** The fault's event id. */
      id: EvtId;
      /** Faulting address. */
      addr: bigint;
      /** True if resolving the fault can make the access succeed (a translation fault). */
      recoverable: boolean;
      /** Why, in words. */
      reason: string;
    };

/** What translateBlocks found: the blocks that translated, and the failure that ended the run. */
export interface RunTranslation {
  /** Where the first block lands (undefined if it did not translate). */
  region: MemoryLike | undefined;
  /** Byte offset of the first block in that region. */
  offset: number;
  /** Pages walked per block translated (0: an IOTLB hit). */
  walked: number[];
  /** The fault that ended the run, if one did. */
  fault: Extract<Translation, { ok: false }> | undefined;
}

/**
 * translateRun's compact answer: what translateBlocks says, with the pages walked per block as
 * (count, walked) pairs (`spans`), one per stretch of blocks that walked as many pages each (0:
 * an IOTLB hit), so a run costs work per stretch, not per block.
 */
export interface RunSpans {
  /** Where the first block lands (undefined if it did not translate). */
  region: MemoryLike | undefined;
  /** Byte offset of the first block in that region. */
  offset: number;
  /** Blocks translated (the sum of the spans' counts). */
  blocks: number;
  /** (count, pages walked per block) pairs. */
  spans: number[];
  /** The fault that ended the run, if one did. */
  fault: Extract<Translation, { ok: false }> | undefined;
}

/** A device access currently in flight on stall-mode memory (one DMA block). */
export interface StallWindow {
  /** StreamID of the access. */
  sid: number;
  /** Region accessed. */
  region: MemoryLike;
  /** Byte offset of the access. */
  offset: number;
  /** Bytes of the access. */
  length: number;
  /** Read or write. */
  access: Access;
  /** Set when CMD_RESUME ABORT/TERM or CMD_STALL_TERM ended one of its stalls. */
  aborted: boolean;
  /** Faults the access stalled on so far. */
  stalls: number;
  /** Extra attributes the driver forwards (transfer id, channel, side). */
  tag: unknown;
}

interface Stalled {
  sid: number;
  region: MemoryLike;
  page: number;
  window: StallWindow;
  at: number;
}

/** Options of one node's SMMU. */
export interface SmmuOptions {
  /** The node the SMMU belongs to. */
  node: number;
  /** Event queue records (default 256). */
  eventQueueDepth?: number;
  /** IOTLB entries (default 4096). */
  iotlbEntries?: number;
}

/** What the SMMU found when the pages of a range moved (regionMoved). */
export interface MoveReport {
  /** Node whose SMMU saw the move. */
  node: number;
  /** Id of the region. */
  region: number;
  /** Byte offset of the range. */
  offset: number;
  /** Bytes of the range. */
  length: number;
  /** Cached translations of the range that were re-checked. */
  checked: number;
  /** False when the kernel hides frame numbers: every cached entry was dropped unseen. */
  framesKnown: boolean;
  /** The entries dropped: the frame the IOTLB held (what a pinned engine would DMA into) and the page's frame now. */
  stale: Array<{
    /** StreamID of the stale translation. */
    sid: number;
    /** Virtual address of the page. */
    address: bigint;
    /** Frame the cached translation pointed to. */
    was: number;
    /** Frame the page is in now. */
    now: number;
  }>;
}

/** Counters of one SMMU. */
export interface SmmuCounters {
  /** Accesses translated. */
  translations: number;
  /** Page table walks (IOTLB misses). */
  walks: number;
  /** Pages walked. */
  pagesWalked: number;
  /** Faults by event name. */
  faults: Record<string, number>;
  /** Event records queued. */
  eventsRecorded: number;
  /** Event records lost to a full queue. */
  eventQueueOverflows: number;
  /** IOTLB hits. */
  iotlbHits: number;
  /** IOTLB misses. */
  iotlbMisses: number;
  /** IOTLB entries invalidated. */
  iotlbInvalidations: number;
  /** IOTLB entries re-checked after their pages moved (collapse), and those whose frame had changed. */
  movedChecked: number;
  /** Cached translations found stale after pages moved (THP collapse). */
  movedStale: number;
  /** Accesses stalled. */
  stalls: number;
  /** CMD_RESUME commands, by response. */
  resumes: Record<keyof typeof ResumeResp, number>;
  /** CMD_STALL_TERM commands. */
  stallTerms: number;
}

export class Smmu implements MemoryObserver {
  /** The node the SMMU belongs to. */
  readonly node: number;
  /** The event queue the driver drains. */
  readonly eventq: EventQueue;
  /** The translation cache. */
  readonly iotlb: Iotlb;
  #streams = new Map<number, StreamContext>();
  #byPd = new Map<number, number>();
  #nextSid = 1;
  #irqHandlers: Array<() => void> = [];
  #irqPending = false;
  #faults: Record<string, number> = {};
  #translations = 0;
  #walks = 0;
  #pagesWalked = 0;
  #walkCache: { region: MemoryLike; from: number; to: number; frames: Float64Array } | undefined;
  #missing: number[] = [];
  #runFrames = { frames: new Float64Array(0) }; // translateRun's frames, reused
  #fault: Extract<Translation, { ok: false }> | undefined;
  #moveHandlers: Array<(report: MoveReport) => void> = [];
  #moved = { checked: 0, stale: 0 };
  // stall model
  #uffd: UffdLike | undefined;
  #deviceTids = new Set<number>();
  #windows = new Map<number, StallWindow[]>(); // region id -> windows
  #stalled = new Map<number, Stalled>(); // stag -> stalled access
  #contexts = new Map<number, unknown>(); // stag -> context of a terminated fault, until the driver reads it
  #nextStag = 1;
  #stalls = 0;
  #resumes = { TERM: 0, RETRY: 0, ABORT: 0 };
  #stallTerms = 0;

  constructor(options: SmmuOptions) {
    this.node = options.node;
    this.eventq = new EventQueue(options.eventQueueDepth ?? 256);
    this.iotlb = new Iotlb(options.iotlbEntries ?? 4096);
  }

  /** Install a stream table entry for a process (its protection domain) on this node. */
  attach(config: { pid: number; pd: number; faultModel?: FaultModel; sid?: number }): StreamContext {
    if (this.#byPd.has(config.pd)) throw new Error(`SMMU of node ${this.node}: protection domain ${config.pd} already has a stream`);
    const sid = config.sid ?? this.#nextSid++;
    if (this.#streams.has(sid)) throw new Error(`SMMU of node ${this.node}: StreamID ${sid} is in use`);
    const ctx: StreamContext = { sid, pid: config.pid, pd: config.pd, faultModel: config.faultModel ?? 'terminate', mappings: [] };
    this.#streams.set(sid, ctx);
    this.#byPd.set(config.pd, sid);
    return ctx;
  }

  /** Remove a stream and its translations. */
  detach(sid: number): void {
    const ctx = this.#streams.get(sid);
    if (!ctx) return;
    for (const m of ctx.mappings) m.region.unobserve(this);
    this.#streams.delete(sid);
    this.#byPd.delete(ctx.pd);
    this.iotlb.invalidateStream(sid);
    this.command({ opcode: CMD_STALL_TERM, sid });
  }

  /** The stream with this StreamID, if any. */
  stream(sid: number): StreamContext | undefined {
    return this.#streams.get(sid);
  }

  /** The stream that serves protection domain `pd`, if any. */
  streamForPd(pd: number): StreamContext | undefined {
    const sid = this.#byPd.get(pd);
    return sid === undefined ? undefined : this.#streams.get(sid);
  }

  /** Make a region part of the stream's address space (the process mapped it). */
  map(sid: number, region: MemoryLike, perms: { read?: boolean; write?: boolean } = {}): void {
    const ctx = this.#require(sid);
    if (ctx.mappings.some((m) => m.region === region)) return;
    ctx.mappings.push({ region, read: perms.read ?? true, write: perms.write ?? true });
    region.observe(this);
  }

  /** Remove `region` from the stream's mappings and drop its translations. */
  unmap(sid: number, region: MemoryLike): void {
    const ctx = this.#require(sid);
    const i = ctx.mappings.findIndex((m) => m.region === region);
    if (i < 0) return;
    ctx.mappings.splice(i, 1);
    this.iotlb.invalidateRange(region.address, region.size, region.granule);
    if (![...this.#streams.values()].some((c) => c.mappings.some((m) => m.region === region))) region.unobserve(this);
  }

  /**
   * Translate a device access of [va, va+length) for stream `sid`. Terminate-mode streams
   * walk the real page tables for pages the IOTLB does not hold; a non-resident page is a
   * translation fault at that page. Stall-mode streams leave residency to the access itself.
   */
  translate(sid: number, va: bigint, length: number, access: Access): Translation {
    this.#translations++;
    const m = this.#mappingFor(sid, va, length, access);
    if (!('region' in m)) return m;
    const region = m.region;
    const offset = Number(va - region.address);
    if (m.stall) return { ok: true, region, offset, walked: 0, hit: true };
    const walked = this.#resident(sid, region, offset, length, offset + length);
    return walked < 0 ? this.#fault! : { ok: true, region, offset, walked, hit: walked === 0 };
  }

  /**
   * Translate a run of consecutive blocks of one access, [va, va+length) cut every
   * `blockSize` bytes, with the same outcome and counters as a translate() per block, in
   * order, stopping at the first that fails: but the stream and region are found once and
   * the page table is read once for the whole run (not per 256 KiB). `walked` gets, per block
   * translated, the pages walked (0: an IOTLB hit); `fault` is the failure of the block after
   * them, if one failed.
   */
  translateBlocks(sid: number, va: bigint, length: number, blockSize: number, access: Access, walked: number[]): RunTranslation {
    const run = this.translateRun(sid, va, length, blockSize, access);
    walked.length = 0;
    const spans = run.spans;
    for (let i = 0; i < spans.length; i += 2) for (let n = spans[i]!, w = spans[i + 1]!; n > 0; n--) walked.push(w);
    return { region: run.region, offset: run.offset, walked, fault: run.fault };
  }

  /**
   * translateBlocks with the pages walked per block as (count, walked) spans: the same
   * outcome, counters and IOTLB content (entries, frames, LRU order), with JavaScript work per
   * run (the IOTLB's capacity plus its cached and faulting pages), not per page, and one
   * native scan of the page table (Iotlb.accessRun, binding.pageRun).
   */
  translateRun(sid: number, va: bigint, length: number, blockSize: number, access: Access): RunSpans {
    if (!(Number.isSafeInteger(blockSize) && blockSize > 0)) throw new RangeError(`blockSize must be a positive integer, not ${blockSize}`);
    const spans: number[] = [];
    const m = this.#mappingFor(sid, va, length, access);
    if (!('region' in m)) {
      // Not one region with this access for the whole run: its first block alone, as
      // translate() (the caller asks again for the blocks after it).
      const tr = this.translate(sid, va, Math.min(blockSize, length), access);
      if (!tr.ok) return { region: undefined, offset: 0, blocks: 0, spans, fault: tr };
      spans.push(1, tr.hit ? 0 : tr.walked);
      return { region: tr.region, offset: tr.offset, blocks: 1, spans, fault: undefined };
    }
    const region = m.region;
    const offset = Number(va - region.address);
    const nb = Math.ceil(length / blockSize);
    if (m.stall || nb === 0) {
      this.#translations += nb;
      if (nb) spans.push(nb, 0);
      return { region, offset, blocks: nb, spans, fault: undefined };
    }
    const g = region.granule;
    const q1 = Math.floor((offset + length - 1) / g);
    const run = this.iotlb.accessRun(sid, Number(region.address), offset, length, blockSize, g, new PageRun(region, q1, this.#runFrames), spans);
    this.#translations += run.blocks + (run.fault >= 0 ? 1 : 0);
    this.#walks += run.walks;
    this.#pagesWalked += run.pagesWalked;
    if (run.fault < 0) return { region, offset, blocks: run.blocks, spans, fault: undefined };
    const p = run.fault * g;
    const at = offset + run.blocks * blockSize;
    const fault: Extract<Translation, { ok: false }> = {
      ok: false,
      id: EvtId.F_TRANSLATION,
      addr: region.address + BigInt(Math.max(p, at - (at % region.pageSize))),
      recoverable: true,
      reason: `page at offset ${p} of region ${region.id} is not resident`,
    };
    return { region, offset, blocks: run.blocks, spans, fault };
  }

  // The stream's mapping holding all of [va, va+length) with the access allowed, or the fault.
  #mappingFor(sid: number, va: bigint, length: number, access: Access): { region: MemoryLike; stall: boolean } | Extract<Translation, { ok: false }> {
    const ctx = this.#streams.get(sid);
    if (!ctx) return { ok: false, id: EvtId.C_BAD_STREAMID, addr: va, recoverable: false, reason: `no stream ${sid} on node ${this.node}` };
    const end = va + BigInt(length);
    const m = ctx.mappings.find((x) => !x.region.closed && va >= x.region.address && end <= x.region.address + BigInt(x.region.size));
    if (!m) {
      return {
        ok: false,
        id: EvtId.F_ADDR_SIZE,
        addr: va,
        recoverable: false,
        reason: `address 0x${va.toString(16)}+${length} is in no region of stream ${sid}`,
      };
    }
    if ((access === 'write' && !m.write) || (access === 'read' && !m.read)) {
      return { ok: false, id: EvtId.F_PERMISSION, addr: va, recoverable: false, reason: `${access} to a region mapped without ${access} permission` };
    }
    return { region: m.region, stall: ctx.faultModel === 'stall' };
  }

  // Terminate mode: the pages of [offset, offset+length) the IOTLB does not hold are walked in
  // the real page table (read up to `walkTo` at once). Returns the pages walked (0: all in the
  // IOTLB), or -1 with the fault of the first non-resident one in #fault (no object per block).
  #resident(sid: number, region: MemoryLike, offset: number, length: number, walkTo: number): number {
    const g = region.granule;
    const base = Number(region.address);
    const first = offset - (offset % g);
    const last = offset + length - 1 - ((offset + length - 1) % g);
    const missing = this.#missing;
    missing.length = 0;
    for (let p = first; p <= last; p += g) if (!this.iotlb.lookupAt(sid, base + p)) missing.push(p);
    if (missing.length === 0) return 0;

    this.#walks++;
    const from = missing[0]!;
    const to = Math.min(missing[missing.length - 1]! + g, region.size);
    const walk = this.#walk(region, from, to, walkTo);
    const ps = region.pageSize;
    this.#pagesWalked += missing.length;
    for (const p of missing) {
      // A granule is resident when its first and last 4 KiB pages are (a THP maps all or nothing).
      const a = (p - walk.from) / ps;
      const b = (Math.min(p + g, to) - ps - walk.from) / ps;
      if (walk.frames[a]! < 0 || walk.frames[b]! < 0) {
        this.#fault = {
          ok: false,
          id: EvtId.F_TRANSLATION,
          addr: region.address + BigInt(Math.max(p, offset - (offset % ps))),
          recoverable: true,
          reason: `page at offset ${p} of region ${region.id} is not resident`,
        };
        return -1;
      }
      this.iotlb.insertMissedAt(sid, base + p, walk.frames[a]);
    }
    return missing.length;
  }

  /**
   * The process's own page table (SVA): a page-table entry must be present. For memfd memory
   * that is stricter than residency: a page can be in the page cache yet unmapped here (a
   * minor fault). One read of /proc/self/pagemap serves the rest of this synchronous turn for
   * the pages ahead (a transfer walks consecutive pages); the modelled walk cost is still
   * charged per page walked.
   */
  #walk(region: MemoryLike, from: number, to: number, ahead: number): { from: number; frames: Float64Array } {
    const c = this.#walkCache;
    if (c && c.region === region && from >= c.from && to <= c.to) return c;
    const end = Math.min(region.size, Math.max(to, ahead, from + WALK_AHEAD_BYTES));
    // Frame numbers (-1: not present; 0: present, frame hidden without CAP_SYS_ADMIN).
    const frames = binding.frames(region.id, from, end - from).pfns;
    if (!this.#walkCache) queueMicrotask(() => (this.#walkCache = undefined));
    this.#walkCache = { region, from, to: end, frames };
    return this.#walkCache;
  }

  /**
   * Write a fault record into the event queue and raise the IRQ. False if the queue
   * overflowed. A stalled access passes its STAG; a terminated one may pass the context the
   * engine gives it (transfer, block, side), which the record's STAG then names, as a page
   * request's grpid does: the driver reads it with takeFaultContext and never asks the engine.
   */
  recordFault(sid: number, fault: { id: EvtId; addr: bigint }, access: Access, tag: { stag?: number; context?: unknown } = {}): boolean {
    const name = EvtId[fault.id] ?? String(fault.id);
    this.#faults[name] = (this.#faults[name] ?? 0) + 1;
    let stag = tag.stag ?? 0;
    if (tag.stag === undefined && tag.context !== undefined) {
      stag = this.#allocStag();
      this.#contexts.set(stag, tag.context);
    }
    const record: SmmuEventRecord = {
      id: fault.id,
      sid,
      ssv: false,
      ssid: 0,
      stag,
      stall: tag.stag !== undefined,
      pnu: false,
      ind: false,
      rnw: access === 'read',
      s2: false,
      class: EvtClass.IN,
      addr: fault.addr,
    };
    const queued = this.eventq.push(record);
    if (!queued) this.#contexts.delete(stag);
    this.#raiseIrq();
    return queued;
  }

  /** The context attached to a terminated fault's record (read once: the record is consumed). */
  takeFaultContext(stag: number): unknown {
    const c = this.#contexts.get(stag);
    this.#contexts.delete(stag);
    return c;
  }

  #allocStag(): number {
    const stag = this.#nextStag;
    this.#nextStag = (this.#nextStag % 0xffff) + 1;
    return stag;
  }

  /** The driver's interrupt line. */
  onInterrupt(handler: () => void): void {
    this.#irqHandlers.push(handler);
  }

  // ---- stall model -------------------------------------------------------------------

  /**
   * Give the SMMU the userfaultfd on which stall-mode memory is registered and the kernel
   * thread ids of the copy engine (the device): their faults are stalled DMA accesses.
   */
  attachStallSource(uffd: UffdLike, deviceTids: Iterable<number>, options: { listen?: boolean } = {}): void {
    this.#uffd = uffd;
    for (const t of deviceTids) this.#deviceTids.add(t);
    // A uffd has one fault handler: when several SMMUs share it, their owner (SimSystem)
    // listens once and offers each fault to every SMMU (listen: false).
    if (options.listen ?? true) uffd.onFault((f) => void (this.stallDeviceFault(f) || releaseForeignFault(uffd, f)));
  }

  /** Declare a device access in flight on stall-mode memory; returns it (remove with endStallWindow). */
  beginStallWindow(w: Omit<StallWindow, 'aborted' | 'stalls'>): StallWindow {
    const win: StallWindow = { ...w, aborted: false, stalls: 0 };
    const list = this.#windows.get(w.region.id) ?? [];
    list.push(win);
    this.#windows.set(w.region.id, list);
    return win;
  }

  /** The access ended: its stalls are over. */
  endStallWindow(win: StallWindow): void {
    // The access is over, so none of its stalls can still be waiting (one the userfaultfd's
    // own handler timeout released, say): forget them so no late CMD_RESUME finds them.
    for (const [stag, s] of this.#stalled) if (s.window === win) this.#stalled.delete(stag);
    const list = this.#windows.get(win.region.id);
    if (!list) return;
    const i = list.indexOf(win);
    if (i >= 0) list.splice(i, 1);
    if (!list.length) this.#windows.delete(win.region.id);
  }

  /** Stalled accesses waiting for CMD_RESUME. */
  get stalled(): number {
    return this.#stalled.size;
  }

  /** Look up a stalled access by its tag (the driver uses it to build its notification). */
  stalledAccess(stag: number):
    | {
        /** Region of the stalled access. */
        region: MemoryLike;
        /** Page it stalled on. */
        page: number;
        /** The access's stall window. */
        window: StallWindow;
      }
    | undefined {
    return this.#stalled.get(stag);
  }

  /** The command queue: CMD_RESUME (RETRY / ABORT / TERM) and CMD_STALL_TERM. */
  command(cmd: SmmuCommand): boolean {
    if (cmd.opcode === CMD_RESUME) {
      const s = this.#stalled.get(cmd.stag);
      if (!s || s.sid !== cmd.sid) return false;
      this.#stalled.delete(cmd.stag);
      this.#resumes[ResumeResp[cmd.resp] as keyof typeof ResumeResp]++;
      this.#finishStall(s, cmd.resp === ResumeResp.RETRY);
      return true;
    }
    let n = 0;
    for (const [stag, s] of [...this.#stalled]) {
      if (s.sid !== cmd.sid) continue;
      this.#stalled.delete(stag);
      this.#finishStall(s, false);
      n++;
    }
    this.#stallTerms++;
    return n > 0;
  }

  #finishStall(s: Stalled, retry: boolean): void {
    const uffd = this.#uffd;
    if (!uffd || uffd.closed || s.region.closed) return;
    try {
      if (retry) {
        // RETRY: the access is replayed. If the page was made resident it completes; if
        // not, it faults again: a new stall, as on hardware.
        uffd.wake(s.region, s.page, s.region.pageSize);
      } else {
        // ABORT / TERM: the access must end. Memory cannot fail a CPU instruction, so the
        // page gets the default (zero) content to release the thread, and the block is
        // marked aborted: the engine reports an error for it and its bytes do not count.
        s.window.aborted = true;
        uffd.zeropage(s.region, s.page, s.region.pageSize);
      }
    } catch {
      // range unregistered meanwhile: the unregister woke the thread already
    }
  }

  /**
   * A userfaultfd fault: if it is one of this SMMU's device accesses in flight (a copy
   * thread inside a stall window), stall it and record the event. False if it is not ours.
   */
  stallDeviceFault(f: UffdFaultLike): boolean {
    if (f.resolvedBy === 'native') return true;
    const ps = f.region.pageSize;
    const page = f.offset - (f.offset % ps);
    const win = this.#deviceTids.has(f.threadId)
      ? this.#windows.get(f.region.id)?.find((w) => page + ps > w.offset && page < w.offset + w.length)
      : undefined;
    if (!win) return false;
    const stag = this.#allocStag();
    this.#stalled.set(stag, { sid: win.sid, region: f.region, page, window: win, at: performance.now() });
    win.stalls++;
    this.#stalls++;
    if (!this.recordFault(win.sid, { id: EvtId.F_TRANSLATION, addr: f.region.address + BigInt(page) }, f.write ? 'write' : 'read', { stag })) {
      // Lost record: nobody will resume it. Terminate rather than leave the thread stalled.
      this.#stalled.delete(stag);
      this.#finishStall({ sid: win.sid, region: f.region, page, window: win, at: 0 }, false);
    }
    return true;
  }

  // ---- invalidation (the MMU-notifier role) ------------------------------------------

  /** Pages of the range were evicted: invalidate their translations. */
  regionEvicted(region: MemoryLike, offset: number, length: number): void {
    this.#walkCache = undefined;
    this.iotlb.invalidateRange(region.address + BigInt(offset), length, region.granule);
  }

  /**
   * The pages of the range stayed resident but the kernel may have moved them (THP collapse,
   * compaction): re-walk the IOTLB's entries of the range and drop those whose frame changed
   * (all of them when frame numbers are hidden: a changed frame cannot be ruled out). An
   * engine that pinned at registration and kept its translations would DMA into the old
   * frames; the report lists them.
   */
  regionMoved(region: MemoryLike, offset: number, length: number): MoveReport {
    this.#walkCache = undefined;
    const start = region.address + BigInt(offset);
    const cached = this.iotlb.entriesIn(start, length);
    const report: MoveReport = { node: this.node, region: region.id, offset, length, checked: cached.length, framesKnown: true, stale: [] };
    if (cached.length) {
      const { pfns, visible } = binding.frames(region.id, offset, length);
      report.framesKnown = visible;
      const ps = binding.pageSize;
      for (const e of cached) {
        const now = pfns[Number(e.page - start) / ps] ?? -1;
        if (visible && e.frame !== 0 && now === e.frame) continue;
        this.iotlb.invalidate(e.sid, e.page);
        report.stale.push({ sid: e.sid, address: e.page, was: e.frame, now });
      }
    }
    this.#moved.checked += report.checked;
    this.#moved.stale += report.stale.length;
    for (const h of this.#moveHandlers) h(report);
    return report;
  }

  /** Be told of every regionMoved re-walk (which cached translations went stale). */
  onTranslationsMoved(handler: (report: MoveReport) => void): void {
    this.#moveHandlers.push(handler);
  }

  /** The region is going away: remove it from every stream. */
  regionClosing(region: MemoryLike): void {
    this.#walkCache = undefined;
    this.iotlb.invalidateRange(region.address, region.size, region.granule);
    for (const ctx of this.#streams.values()) {
      const i = ctx.mappings.findIndex((m) => m.region === region);
      if (i >= 0) ctx.mappings.splice(i, 1);
    }
  }

  /** The counters now. */
  counters(): SmmuCounters {
    return {
      translations: this.#translations,
      walks: this.#walks,
      pagesWalked: this.#pagesWalked,
      faults: { ...this.#faults },
      eventsRecorded: this.eventq.recorded,
      eventQueueOverflows: this.eventq.overflows,
      iotlbHits: this.iotlb.hits,
      iotlbMisses: this.iotlb.misses,
      iotlbInvalidations: this.iotlb.invalidations,
      movedChecked: this.#moved.checked,
      movedStale: this.#moved.stale,
      stalls: this.#stalls,
      resumes: { ...this.#resumes },
      stallTerms: this.#stallTerms,
    };
  }

  #raiseIrq(): void {
    if (this.#irqPending) return;
    this.#irqPending = true;
    queueMicrotask(() => {
      this.#irqPending = false;
      for (const h of this.#irqHandlers) h();
    });
  }

  #require(sid: number): StreamContext {
    const ctx = this.#streams.get(sid);
    if (!ctx) throw new Error(`SMMU of node ${this.node}: no stream ${sid}`);
    return ctx;
  }
}

/**
 * The page table as a run's translation sees it, read natively (binding.pageRun): the first
 * absent granule from a point on, and, once the run is over, the frames of the granules the
 * IOTLB keeps (read then, and only those). Nothing is remembered past the run: the kernel's
 * table is the only truth about residency.
 */
class PageRun implements RunPages {
  #region: MemoryLike;
  #q1: number;
  #buffer: { frames: Float64Array };
  #from = -1; // the last scan: granules [#from, #stop) present, #stop absent unless past #q1
  #stop = -1;
  #framesFrom = 0; // frames read: granules [#framesFrom, #framesTo)
  #framesTo = 0;

  constructor(region: MemoryLike, q1: number, buffer: { frames: Float64Array }) {
    this.#region = region;
    this.#q1 = q1;
    this.#buffer = buffer;
  }

  absentFrom(q: number): number {
    if (q < this.#from || q > this.#stop) {
      const g = this.#region.granule;
      const a = binding.pageRun(this.#region.id, q * g, this.#q1 - q + 1, g, 0, this.#buffer.frames);
      this.#from = q;
      this.#stop = a < 0 ? this.#q1 + 1 : q + a;
    }
    return this.#stop > this.#q1 ? -1 : this.#stop;
  }

  frame(q: number): number {
    if (q < this.#framesFrom || q >= this.#framesTo) {
      // The granules the IOTLB keeps are the last ones walked: all of them from q to the stop.
      const g = this.#region.granule;
      const n = Math.max(1, this.#stop - q);
      if (this.#buffer.frames.length < n) this.#buffer.frames = new Float64Array(n);
      const a = binding.pageRun(this.#region.id, q * g, n, g, n, this.#buffer.frames);
      // A page reclaimed since the scan shifts the window; its frame is then not known (0).
      this.#framesTo = a < 0 ? q + n : q + a;
      this.#framesFrom = this.#framesTo - n;
      if (q < this.#framesFrom) return 0;
    }
    return this.#buffer.frames[q - this.#framesFrom]!;
  }
}

/** A fault on stall-source memory that no SMMU claims (not a DMA access): release it. */
export function releaseForeignFault(uffd: UffdLike, f: UffdFaultLike): void {
  if (f.resolvedBy === 'native') return;
  const ps = f.region.pageSize;
  try {
    uffd.zeropage(f.region, f.offset - (f.offset % ps), ps);
  } catch {
    /* gone */
  }
}
