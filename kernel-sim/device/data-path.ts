// The device's data path (docs/device-abi.md §2, §3): the engine consumes the programs' rings.
// One engine node hosts every context (as one rxe device serves every process of its host):
// each PD of each context is a stream of its own in the node's SMMU (a device-wide PD number),
// each MR a ForeignRegion of its program mapped in its PD's stream and a record in the node's
// tables under its key, each QP an RcQueuePair in those tables under its device-wide number,
// so two programs on loopback connect by (GID, QPN) as ibv_rc_pingpong exchanges them. A
// doorbell makes the context's rings scanned; every index and entry read from them is the
// program's and is checked (copied out first); what is wrong is refused and counted, and the
// QP (or CQ) goes to its error state while everything else goes on. A page the SMMU finds
// absent is a fault the node's SMMU driver reports on the context's netlink socket: the
// device asks the program's fault thread to make it resident (program-memory.ts), by the
// MR's policy, and answers, and the engine retransmits.
import { binding, type RawMapping } from '../../native/index.js';
import { RcOp } from '../fabric/packets.js';
import { rawMemory, type MemoryLike } from '../memory.js';
import { decodeFault, decodeResolvedAck, encodeResolved } from '../netlink/messages.js';
import { NlCmd, type NetlinkSocket } from '../netlink/netlink.js';
import { DmaStatus, type DmaCompletion, type DmaDescriptor } from '../pldma/types.js';
import { RcQueuePair } from '../rc/qp.js';
import { mrFree, mrRecord, type RcEvent, type RcMr, type RcPd, type RcReceived, type RcRecvWqe, type RcSrq } from '../rc/tables.js';
import { IommuPageResponseCode } from '../smmu-driver/iopf.js';
import type { StreamContext } from '../smmu/smmu.js';
import { SimSystem, type SimNode, type SystemOptions } from '../system.js';
import * as abi from './abi.js';
import { DeviceState, FaultMethod, MrPolicy, QueueKind } from './abi.js';
import { CompletionRing, CQE } from './cq-ring.js';
import { RecvRing } from './recv-ring.js';
import { Access, AsyncEventType, QpState, QpType, SendFlags, UD_MTU, WcOpcode, WcStatus, WrOpcode } from './ib.js';
import type { Ah, Cq, Mr, Pd, Qp, Srq } from './objects.js';
import type { ProgramMemory } from './program-memory.js';
import { Ring, SGE, type RingMemory } from './rings.js';
import { SEND_WQE as SW } from './send-ring.js';

const PAGE = 4096;
const MAX_MSG = 2 ** 31;
/** Netlink "pids" of the contexts' fault sockets: a space of their own, never a real pid's. */
const NETLINK_BASE = 0x4000_0000;
/** The end of x86-64's (and AArch64's 48-bit) user address space. */
const USER_END = 1n << 47n;
/** Prefetch's window, pages. */
const PREFETCH_PAGES = 16;

/** What the data path counted, device-wide. */
export interface DataPathCounters {
  /** Send WQEs started, receive WQEs taken. */
  sendWqes: number;
  recvWqes: number;
  /** CQEs written. */
  cqes: number;
  /** Ring entries or indices refused (a bad opcode, SGE count, length, key, handle, a corrupt index). */
  refusedWqes: number;
  /** Rings found corrupt (an index past the ring): their QP, SRQ or CQ went to error. */
  corruptRings: number;
  /** Doorbells heard (eventfd wake-ups). */
  doorbells: number;
  /** Completion and async events written into programs' pipes, and those dropped (a full pipe). */
  events: number;
  eventsDropped: number;
}

/** The engine the device hosts: one node of a simulated system, its tables strict. */
export class DeviceEngine {
  readonly system: SimSystem;
  readonly node: SimNode;
  readonly counters: DataPathCounters = {
    sendWqes: 0,
    recvWqes: 0,
    cqes: 0,
    refusedWqes: 0,
    corruptRings: 0,
    doorbells: 0,
    events: 0,
    eventsDropped: 0,
  };
  #nextPd = 1;
  #nextSrq = 1;
  /** @internal The QPs and SRQs on the node's event line, by QP number and SRQ record handle. */
  readonly qps = new Map<number, QpEngine>();
  readonly srqs = new Map<number, { ctx: ContextDataPath; handle: number }>();

  constructor(options: Omit<SystemOptions, 'nodes'> = {}) {
    this.system = new SimSystem({ ...options, nodes: 1 });
    this.node = this.system.node(0);
    this.node.tables.strict = true;
    // The node's event line: a QP the responder moved to ERR on its own, an SRQ's limit.
    this.node.tables.events = (e: RcEvent) => {
      if (e.type === 'qp-error') this.qps.get(e.handle)?.toError();
      else {
        const s = this.srqs.get(e.handle);
        s?.ctx.asyncEvent(AsyncEventType.SRQ_LIMIT_REACHED, abi.ElementKind.SRQ, s.handle);
      }
    };
  }

  /** A protection domain number unique on the device (the SMMU's streams are found by it). */
  newPd(): number {
    return this.#nextPd++;
  }

  /** An SRQ record's handle, unique on the device. */
  newSrq(): number {
    return this.#nextSrq++;
  }

  close(): void {
    this.system.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Rings as the device reads and writes them
// ---------------------------------------------------------------------------------------------

const RW = abi.recvWqe.offsets(['wr_id', 'dma.num_sge'] as const);

interface DevSge {
  addr: bigint;
  length: number;
  lkey: number;
}

/** A send WQE as the device copied and checked it. */
interface DevSendWqe {
  wrId: bigint;
  opcode: WrOpcode;
  flags: number;
  immData: number;
  remoteAddr: bigint;
  rkey: number;
  compareAdd: bigint;
  swap: bigint;
  remoteQpn: number;
  remoteQkey: number;
  ah: Ah | undefined;
  xrcSrqn: number;
  sges: DevSge[];
  /** IBV_SEND_INLINE: the bytes, copied out of the slot. */
  inline: Uint8Array | undefined;
  length: number;
  /** Why the device refuses it (it completes in error), or undefined. */
  bad: WcStatus | undefined;
}

/** A ring the program produces into and the device consumes: the device's own cursor and consumer index. */
class ConsumedRing {
  readonly ring: Ring;
  readonly slotBytes: number;
  readonly #idx: Uint32Array;
  /** The device's copy of the consumer index (it is its only writer). */
  #consumer = 0;
  /** The next entry to read (past consumer: entries read and not yet done). */
  #read = 0;

  constructor(memory: RingMemory, kind: QueueKind) {
    const g = memory.rings.find((r) => r.kind === kind)!;
    this.ring = new Ring({ kind, numElems: g.numElems, log2: g.log2ElemSize }, 0, memory.mapping.buffer, g.offset);
    this.#idx = new Uint32Array(memory.mapping.buffer, g.offset, abi.QUEUE_DATA_OFFSET / 4);
    this.slotBytes = 2 ** g.log2ElemSize;
  }

  /**
   * Entries to read now; -1 if the program's producer index says more than the ring holds, or
   * went back behind what the device read (corrupt).
   */
  available(): number {
    const p = Atomics.load(this.#idx, IDX.producer);
    const pending = (p - this.#consumer) >>> 0;
    const readable = (p - this.#read) >>> 0;
    if (pending > this.ring.numElems || readable > pending) return -1;
    return readable;
  }

  /** A copy of the next entry's slot (the device checks its copy, never the slot again), and the cursor moved. */
  read(): DataView {
    const at = this.ring.slot(this.#read);
    this.#read = (this.#read + 1) >>> 0;
    return new DataView(this.ring.buffer.slice(at, at + this.slotBytes));
  }

  /** The oldest entry read is done: its slot is the program's again (release order: Atomics.store). */
  consume(): void {
    this.#consumer = (this.#consumer + 1) >>> 0;
    Atomics.store(this.#idx, IDX.consumer, this.#consumer);
  }

  /** RESET: the indices start again where the program's producer is (nothing pending). */
  reset(): void {
    this.#read = this.#consumer = Atomics.load(this.#idx, IDX.producer);
    Atomics.store(this.#idx, IDX.consumer, this.#consumer);
  }
}

/** Word indices of a ring header's fields. */
const IDX = (() => {
  const o = abi.queueBuf.offsets(['producer_index', 'notify_fired', 'consumer_index', 'arm_sn', 'arm_solicited'] as const);
  return {
    producer: o.producer_index / 4,
    fired: o.notify_fired / 4,
    consumer: o.consumer_index / 4,
    arm: o.arm_sn / 4,
    solicited: o.arm_solicited / 4,
  };
})();

function readSges(v: DataView, at: number, n: number): DevSge[] {
  const out: DevSge[] = [];
  for (let k = 0; k < n; k++) {
    const o = at + k * abi.rxeSge.size;
    out.push({ addr: v.getBigUint64(o + SGE.addr, true), length: v.getUint32(o + SGE.length, true), lkey: v.getUint32(o + SGE.lkey, true) });
  }
  return out;
}

/** A receive queue's device side over a memfd ring (the QP's engine or an SRQ reads and checks it). */
interface RecvReader {
  length(): number;
  head(): RcRecvWqe | undefined;
  shift(): RcRecvWqe | undefined;
  unshift(w: RcRecvWqe): void;
}

/**
 * The engine's RecvRing (what RcQueuePair and RcSrq hold) over a program's memfd ring: every
 * step goes to the reader, which copies each WQE out of the program's slot and checks it. (The
 * base class's own small ring is unused.)
 */
class MemfdRecvRing extends RecvRing {
  readonly #r: RecvReader;
  constructor(r: RecvReader) {
    super(1, 1);
    this.#r = r;
  }
  override get length(): number {
    return this.#r.length();
  }
  override head(): RcRecvWqe | undefined {
    return this.#r.head();
  }
  override shift(): RcRecvWqe | undefined {
    return this.#r.shift();
  }
  override unshift(w: RcRecvWqe): void {
    this.#r.unshift(w);
  }
}

/** The engine's CompletionRing over a program's CQ memfd: each CQE through the context's checked writer. */
class MemfdCq extends CompletionRing {
  readonly #ctx: ContextDataPath;
  readonly #cq: Cq;
  constructor(ctx: ContextDataPath, cq: Cq) {
    super(1, cq.handle);
    this.#ctx = ctx;
    this.#cq = cq;
  }
  override complete(
    wrId: bigint,
    status: number,
    opcode: number,
    byteLen: number,
    qpNum: number,
    srcQp: number,
    immData: number | undefined,
    odp: RcReceived['odp'] | undefined,
    solicited = false,
  ): boolean {
    return this.#ctx.complete(this.#cq, wrId, status, opcode, byteLen, qpNum, srcQp, immData, odp, solicited);
  }
}

// A receive WQE from its copy: num_sge within the ring's, each SGE's length bounded; the
// lkeys are the responder's to check (in this QP's PD, LOCAL_WRITE), as each packet lands.
function decodeRecv(v: DataView, maxSge: number, slot: number): RcRecvWqe | undefined {
  const n = v.getUint32(RW['dma.num_sge'], true);
  if (n > maxSge || abi.recvWqe.size + n * abi.rxeSge.size > slot) return undefined;
  const sgList = readSges(v, abi.recvWqe.size, n);
  let total = 0;
  for (const x of sgList) total += x.length;
  if (total > MAX_MSG) return undefined;
  return { wrId: v.getBigUint64(RW.wr_id, true), sgList };
}

const RC_OPS = new Set([
  WrOpcode.RDMA_WRITE,
  WrOpcode.RDMA_WRITE_WITH_IMM,
  WrOpcode.SEND,
  WrOpcode.SEND_WITH_IMM,
  WrOpcode.RDMA_READ,
  WrOpcode.ATOMIC_CMP_AND_SWP,
  WrOpcode.ATOMIC_FETCH_AND_ADD,
]);
const SEND_FLAGS = SendFlags.FENCE | SendFlags.SIGNALED | SendFlags.SOLICITED | SendFlags.INLINE;

export const WC_OPCODE: Partial<Record<WrOpcode, WcOpcode>> = {
  [WrOpcode.RDMA_WRITE]: WcOpcode.RDMA_WRITE,
  [WrOpcode.RDMA_WRITE_WITH_IMM]: WcOpcode.RDMA_WRITE,
  [WrOpcode.SEND]: WcOpcode.SEND,
  [WrOpcode.SEND_WITH_IMM]: WcOpcode.SEND,
  [WrOpcode.RDMA_READ]: WcOpcode.RDMA_READ,
  [WrOpcode.ATOMIC_CMP_AND_SWP]: WcOpcode.COMP_SWAP,
  [WrOpcode.ATOMIC_FETCH_AND_ADD]: WcOpcode.FETCH_ADD,
};

// ---------------------------------------------------------------------------------------------
// A context's data path
// ---------------------------------------------------------------------------------------------

interface PdState {
  rc: RcPd;
  stream: StreamContext;
}

interface MrEntry {
  rc: RcMr;
  region: MemoryLike;
  stream: StreamContext;
  start: bigint;
  end: bigint;
  closed: boolean;
}

interface CqState {
  cq: Cq;
  ring: Ring;
  idx: Uint32Array;
  /** The device's copy of the producer index (its only writer). */
  producer: number;
  broken: boolean;
  qps: Set<QpEngine>;
  engineRing?: CompletionRing;
}

interface SrqState {
  srq: Srq;
  ring: ConsumedRing;
  maxSge: number;
  broken: boolean;
  /** The engine's record (its ring reads the memfd through `take`). */
  record: RcSrq;
  /** Receives a UD datagram gave back (they go in front again). */
  returned: RcRecvWqe[];
}

/** What a context's objects need of their context's data path. */
export interface ContextLinks {
  readonly memory: ProgramMemory;
  readonly asyncFd: number;
  readonly doorbell: RawMapping;
  readonly doorbellFd: number;
  /** Objects of the context by handle, of a kind (undefined if not). */
  ah(handle: number): Ah | undefined;
}

export class ContextDataPath {
  readonly engine: DeviceEngine;
  readonly #links: ContextLinks;
  readonly #node: SimNode;
  readonly #socket: NetlinkSocket;
  readonly #netPid: number;
  readonly #pds = new Map<Pd, PdState>();
  readonly #mrs = new Map<Mr, MrEntry>();
  /** This context's MRs by lkey (a key of another context's is no key here). */
  readonly #byKey = new Map<number, Mr>();
  readonly #cqs = new Map<Cq, CqState>();
  readonly #srqs = new Map<Srq, SrqState>();
  readonly #qps = new Map<Qp, QpEngine>();
  readonly #watch: number;
  readonly #sleeping: Uint32Array;
  readonly #state: Uint32Array;
  /** Faults this context's transfers took (source, destination). */
  readonly faults = { source: 0, destination: 0 };
  #scanning = false;
  #closed = false;

  constructor(engine: DeviceEngine, contextHandle: number, links: ContextLinks) {
    this.engine = engine;
    this.#links = links;
    this.#node = engine.node;
    this.#netPid = NETLINK_BASE + contextHandle;
    this.#socket = this.#node.openProcess(this.#netPid);
    this.#socket.onMessage((m) => this.#fault(m));
    const o = abi.doorbellPage.offsets(['device_sleeping', 'device_state'] as const);
    this.#sleeping = new Uint32Array(links.doorbell.buffer, o.device_sleeping, 1);
    this.#state = new Uint32Array(links.doorbell.buffer, o.device_state, 1);
    this.#watch = binding.eventfdWatch(links.doorbellFd, () => this.#doorbell());
  }

  // --- the doorbell (docs §3) -----------------------------------------------------------------

  #doorbell(): void {
    if (this.#closed) return;
    this.engine.counters.doorbells++;
    this.scan();
  }

  /** Work through every ring of the context until nothing is new; then sleep (Dekker's pattern). */
  scan(): void {
    if (this.#scanning || this.#closed) return;
    this.#scanning = true;
    try {
      for (;;) {
        Atomics.store(this.#sleeping, 0, 0);
        while (this.#kickAll()) {
          /* more */
        }
        Atomics.store(this.#sleeping, 0, 1);
        binding.fence();
        if (!this.#kickAll()) break;
      }
    } finally {
      this.#scanning = false;
    }
  }

  // One pass over the send queues: true if any started something.
  #kickAll(): boolean {
    let any = false;
    for (const q of this.#qps.values()) if (q.kick()) any = true;
    return any;
  }

  // --- objects ---------------------------------------------------------------------------------

  pdCreated(pd: Pd): void {
    const id = this.engine.newPd();
    const stream = this.#node.allocStream({ pid: this.#netPid, pd: id });
    this.#pds.set(pd, { rc: { handle: id, closed: false }, stream });
  }

  pdFreed(pd: Pd): void {
    const s = this.#pds.get(pd);
    if (!s) return;
    this.#pds.delete(pd);
    s.rc.closed = true;
    this.#node.freeStream(s.stream);
  }

  mrCreated(mr: Mr): void {
    const pd = this.#pds.get(mr.pd)!;
    // Implicit ODP (addr 0, length SIZE_MAX): the program's whole user address space, page 0 aside.
    const start = mr.implicit ? BigInt(PAGE) : mr.start;
    const end = mr.implicit ? USER_END : mr.start + mr.length;
    const region = this.#links.memory.region(mr.handle, start, end - start);
    this.#node.map(pd.stream, region, { read: true, write: (mr.access & (Access.LOCAL_WRITE | Access.REMOTE_WRITE)) !== 0 });
    // The engine's record of it (tables.ts): what the responder's key checks read.
    const offset = Number(start - region.address);
    const rc = mr.implicit
      ? mrRecord({
          key: mr.lkey,
          pd: pd.rc,
          access: mr.access,
          length: Number(USER_END),
          space: {
            find: (addr: bigint, length: number) =>
              addr >= start && addr + BigInt(length) <= end ? { region, offset: Number(addr - region.address) } : undefined,
          },
        })
      : mrRecord({ key: mr.lkey, pd: pd.rc, access: mr.access, region, offset, length: Number(end - start) });
    this.#mrs.set(mr, { rc, region, stream: pd.stream, start, end, closed: false });
    this.#byKey.set(mr.lkey, mr);
    this.#node.tables.mrs.set(mr.lkey, rc);
  }

  mrFreed(mr: Mr): void {
    const s = this.#mrs.get(mr);
    if (!s) return;
    this.#mrs.delete(mr);
    this.#byKey.delete(mr.lkey);
    s.closed = true;
    mrFree(s.rc);
    this.#node.tables.mrs.delete(mr.lkey);
    this.#node.fence({ key: mr.lkey });
    this.#node.unmap(s.stream, s.region);
  }

  cqCreated(cq: Cq): void {
    const g = cq.ring.rings[0]!;
    const ring = new Ring({ kind: QueueKind.CQ, numElems: g.numElems, log2: g.log2ElemSize }, cq.handle, cq.ring.mapping.buffer, 0);
    this.#cqs.set(cq, {
      cq,
      ring,
      idx: new Uint32Array(cq.ring.mapping.buffer, 0, abi.QUEUE_DATA_OFFSET / 4),
      producer: 0,
      broken: false,
      qps: new Set(),
    });
  }

  cqFreed(cq: Cq): void {
    this.#cqs.delete(cq);
  }

  srqCreated(srq: Srq): void {
    const handle = this.engine.newSrq();
    const state: SrqState = {
      srq,
      ring: new ConsumedRing(srq.ring, QueueKind.SRQ),
      maxSge: srq.maxSge,
      broken: false,
      record: undefined as unknown as RcSrq,
      returned: [],
    };
    const reader: RecvReader = {
      length: () => state.returned.length + Math.max(0, state.ring.available()),
      head: () => undefined,
      shift: () => state.returned.shift() ?? this.#srqTake(state),
      unshift: (w) => state.returned.unshift(w),
    };
    state.record = {
      handle,
      pd: this.#pds.get(srq.pd)!.rc,
      ring: new MemfdRecvRing(reader),
      limit: srq.limit,
      xrcd: undefined,
      cq: undefined,
      destroyed: false,
    };
    this.#srqs.set(srq, state);
    this.engine.srqs.set(handle, { ctx: this, handle: srq.handle });
  }

  srqFreed(srq: Srq): void {
    const s = this.#srqs.get(srq);
    if (!s) return;
    s.record.destroyed = true;
    this.engine.srqs.delete(s.record.handle);
    this.#srqs.delete(srq);
  }

  // The next receive off an SRQ's memfd ring, checked; a corrupt index breaks the SRQ (IBV_EVENT_SRQ_ERR).
  #srqTake(s: SrqState): RcRecvWqe | undefined {
    if (s.broken) return undefined;
    const n = s.ring.available();
    if (n < 0) {
      s.broken = true;
      this.engine.counters.corruptRings++;
      this.asyncEvent(AsyncEventType.SRQ_ERR, abi.ElementKind.SRQ, s.srq.handle);
      return undefined;
    }
    if (n === 0) return undefined;
    const w = decodeRecv(s.ring.read(), s.maxSge, s.ring.slotBytes);
    s.ring.consume();
    if (!w) {
      this.engine.counters.refusedWqes++;
      return undefined;
    }
    this.engine.counters.recvWqes++;
    return w;
  }

  /** @internal A CQ's ring as the engine writes it: through this context's checked writer. */
  cqRing(cq: Cq): CompletionRing {
    const s = this.#cqs.get(cq)!;
    if (!s.engineRing) s.engineRing = new MemfdCq(this, cq);
    return s.engineRing;
  }

  qpCreated(qp: Qp): void {
    if (qp.type === QpType.XRC_RECV || qp.type === QpType.XRC_SEND) return; // XRC: not on the data path yet
    const q = new QpEngine(this, qp, this.#pds.get(qp.pd!)!);
    this.#qps.set(qp, q);
    for (const cq of [qp.sendCq, qp.recvCq]) if (cq) this.#cqs.get(cq)?.qps.add(q);
  }

  qpModified(qp: Qp, from: QpState): void {
    this.#qps.get(qp)?.modified(from);
  }

  qpFreed(qp: Qp): void {
    const q = this.#qps.get(qp);
    if (!q) return;
    this.#qps.delete(qp);
    for (const s of this.#cqs.values()) s.qps.delete(q);
    q.destroy();
  }

  // --- what the QPs use ------------------------------------------------------------------------

  /** @internal */
  get node(): SimNode {
    return this.#node;
  }

  /** @internal The MR of this context's `lkey` in `pd`, if [addr, addr+length) lies in it (and it may be written, if asked). */
  localMr(lkey: number, pd: Pd, addr: bigint, length: number, write: boolean): MrEntry | undefined {
    const mr = this.#byKey.get(lkey);
    if (!mr || mr.pd !== pd) return undefined;
    const s = this.#mrs.get(mr);
    if (!s || s.closed || addr < s.start || addr + BigInt(length) > s.end) return undefined;
    if (write && !(mr.access & Access.LOCAL_WRITE)) return undefined;
    return s;
  }

  /** @internal */
  ah(handle: number): Ah | undefined {
    return this.#links.ah(handle);
  }

  /** @internal */
  srq(srq: Srq): SrqState | undefined {
    return this.#srqs.get(srq);
  }

  /**
   * @internal Write one CQE into `cq`'s ring and fire its channel if it is armed; false if the
   * CQ is overrun or corrupt (IBV_EVENT_CQ_ERR reported, its QPs to error by the caller).
   */
  complete(
    cq: Cq,
    wrId: bigint,
    status: WcStatus,
    opcode: WcOpcode,
    byteLen: number,
    qpNum: number,
    srcQp: number,
    immData: number | undefined,
    odp: RcReceived['odp'] | undefined,
    solicited = false,
  ): boolean {
    const s = this.#cqs.get(cq);
    if (!s || s.broken) return false;
    const r = s.ring;
    const idx = s.idx;
    const used = (s.producer - Atomics.load(idx, IDX.consumer)) >>> 0;
    if (used >= r.numElems) {
      s.broken = true;
      if (used > r.numElems) this.engine.counters.corruptRings++;
      this.asyncEvent(AsyncEventType.CQ_ERR, abi.ElementKind.CQ, cq.handle);
      for (const q of [...s.qps]) q.toError();
      return false;
    }
    const v = r.view;
    const at = r.slot(s.producer);
    v.setBigUint64(at + CQE['wc.wr_id'], wrId, true);
    v.setUint32(at + CQE['wc.status'], status, true);
    v.setUint32(at + CQE['wc.opcode'], opcode, true);
    v.setUint32(at + CQE['wc.vendor_err'], 0, true);
    v.setUint32(at + CQE['wc.byte_len'], byteLen >>> 0, true);
    v.setUint32(at + CQE['wc.ex.imm_data'], immData === undefined ? 0 : immData >>> 0, false);
    v.setUint32(at + CQE['wc.qp_num'], qpNum, true);
    v.setUint32(at + CQE['wc.src_qp'], srcQp >>> 0, true);
    v.setUint32(at + CQE['wc.wc_flags'], immData === undefined ? 0 : 2, true);
    v.setUint32(at + CQE['odp.faults_source'], odp ? odp.faults.source : 0, true);
    v.setUint32(at + CQE['odp.faults_destination'], odp ? odp.faults.destination : 0, true);
    v.setUint32(at + CQE['odp.major_faults'], odp ? odp.majorFaults : 0, true);
    v.setUint32(at + CQE['odp.retransmitted_blocks'], odp ? odp.retransmittedBlocks : 0, true);
    v.setFloat64(at + CQE['odp.model_us'], odp ? odp.modelUs : NaN, true);
    v.setFloat64(at + CQE['odp.real_us'], odp ? odp.realUs : 0, true);
    s.producer = (s.producer + 1) >>> 0;
    Atomics.store(idx, IDX.producer, s.producer);
    this.engine.counters.cqes++;
    // Armed (arm_sn ahead of what last fired): one event on the channel, and disarmed.
    binding.fence();
    const arm = Atomics.load(idx, IDX.arm);
    if (cq.channel && arm !== Atomics.load(idx, IDX.fired)) {
      const solicitedOnly = Atomics.load(idx, IDX.solicited) === 1;
      if (!solicitedOnly || solicited || status !== WcStatus.SUCCESS) {
        Atomics.store(idx, IDX.fired, arm);
        const e = new Uint8Array(abi.compEvent.size);
        new DataView(e.buffer).setUint32(0, cq.handle, true);
        this.#event(cq.channel.fd, e);
      }
    }
    return true;
  }

  /** @internal An async event into the context's pipe. */
  asyncEvent(type: AsyncEventType, kind: number, handle: number): void {
    const e = new Uint8Array(abi.asyncEvent.size);
    const v = new DataView(e.buffer);
    v.setUint32(0, type, true);
    v.setUint32(4, kind, true);
    v.setUint32(8, handle, true);
    this.#event(this.#links.asyncFd, e);
  }

  #event(fd: number, bytes: Uint8Array): void {
    const n = binding.fdWrite(fd, bytes);
    if (n === bytes.byteLength) this.engine.counters.events++;
    else this.engine.counters.eventsDropped++;
  }

  // --- faults (docs §5) ------------------------------------------------------------------------

  // A fault the node's SMMU driver reports for one of this context's streams: the MR that holds
  // the address, the range its policy asks for, the program's fault thread, the answer.
  #fault(m: Parameters<Parameters<NetlinkSocket['onMessage']>[0]>[0]): void {
    if (decodeResolvedAck(m)) return;
    const n = decodeFault(m);
    if (!n || this.#closed) return;
    this.faults[n.side]++;
    let found: Mr | undefined;
    for (const mr of this.#mrs.keys())
      if (n.va >= mr.start && n.va < mr.start + mr.length && (!n.write || mr.access & Access.LOCAL_WRITE)) found = mr;
    const answer = (status: IommuPageResponseCode, length: number, method: 'touch' | 'gup' | 'none') =>
      this.#socket.send(NlCmd.RESOLVED, encodeResolved({ sid: n.sid, va: n.va, status, length, method, stall: false, stag: n.stag }), { ack: true });
    if (!found) return void answer(IommuPageResponseCode.INVALID, 0, 'none');
    const page = n.va - (n.va % BigInt(PAGE));
    const end = found.start + found.length;
    const policy = found.policy === MrPolicy.DEFAULT ? MrPolicy.TOUCH_AHEAD : found.policy;
    let last = page + BigInt(PAGE);
    if (policy === MrPolicy.TOUCH_AHEAD) last = n.va + BigInt(Math.max(1, n.length));
    else if (policy === MrPolicy.PREFETCH) last = page + BigInt(PREFETCH_PAGES * PAGE);
    if (last > end) last = end;
    const length = Math.max(PAGE, Number(last - page));
    const method = policy === MrPolicy.TOUCH ? FaultMethod.TOUCH : FaultMethod.POPULATE;
    void this.#links.memory.resolve(found.handle, page, length, n.write, method).then((a) => {
      if (this.#closed) return;
      if (a.status === 0) answer(IommuPageResponseCode.SUCCESS, a.pages * PAGE, method === FaultMethod.TOUCH ? 'touch' : 'gup');
      else answer(IommuPageResponseCode.INVALID, 0, 'none');
    });
  }

  /** The context is going: every QP ends (nothing more lands in the program), the streams go. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    binding.eventfdUnwatch(this.#watch);
    for (const qp of [...this.#qps.keys()]) this.qpFreed(qp);
    for (const mr of [...this.#mrs.keys()]) this.mrFreed(mr);
    for (const pd of [...this.#pds.keys()]) this.pdFreed(pd);
    this.#socket.close();
  }

  /** The device is failing: every QP of the context to error, the doorbell page says FATAL. */
  fatal(): void {
    Atomics.store(this.#state, 0, DeviceState.FATAL);
    for (const q of this.#qps.values()) q.toError();
    this.asyncEvent(AsyncEventType.DEVICE_FATAL, abi.ElementKind.DEVICE, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// A QP on the engine: its requester (the send ring, in order) and its owner side for the responder
// ---------------------------------------------------------------------------------------------

interface Outcome {
  status: WcStatus;
  byteLen: number;
  odp: RcReceived['odp'];
}

function emptyOdp(): RcReceived['odp'] {
  return { faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
}

function fail(status: WcStatus): Outcome {
  return { status, byteLen: 0, odp: emptyOdp() };
}

function statusOf(results: DmaCompletion[]): WcStatus {
  for (const r of results) {
    switch (r.status) {
      case DmaStatus.SUCCESS:
        continue;
      case DmaStatus.SRC_ADDR_ERR:
      case DmaStatus.SRC_PERM_ERR:
        return WcStatus.LOC_PROT_ERR;
      case DmaStatus.DST_ADDR_ERR:
      case DmaStatus.DST_PERM_ERR:
      case DmaStatus.PD_ERR:
        return WcStatus.REM_ACCESS_ERR;
      case DmaStatus.RETRY_EXCEEDED:
        return r.side === 'destination' ? WcStatus.RNR_RETRY_EXC_ERR : WcStatus.RETRY_EXC_ERR;
      case DmaStatus.FAULT_UNRESOLVED:
        return r.side === 'destination' ? WcStatus.REM_ACCESS_ERR : WcStatus.LOC_PROT_ERR;
      case DmaStatus.ABORTED:
        return WcStatus.REM_ABORT_ERR;
      case DmaStatus.FLUSHED:
        return WcStatus.WR_FLUSH_ERR;
      case DmaStatus.DROPPED:
        return WcStatus.RETRY_EXC_ERR;
      case DmaStatus.REM_INV_REQ:
        return WcStatus.REM_INV_REQ_ERR;
      case DmaStatus.REM_OP:
        return WcStatus.REM_OP_ERR;
      default:
        return WcStatus.GENERAL_ERR;
    }
  }
  return WcStatus.SUCCESS;
}

function done(status: WcStatus, byteLen: number, results: DmaCompletion[]): Outcome {
  const odp = emptyOdp();
  let start = Infinity;
  let end = 0;
  for (const r of results) {
    odp.faults.source += r.faults.source;
    odp.faults.destination += r.faults.destination;
    odp.retransmittedBlocks += r.retransmittedBlocks;
    odp.majorFaults += r.pagesFetched;
    odp.realUs = Math.max(odp.realUs, r.real.us);
    start = Math.min(start, r.model.startUs);
    end = Math.max(end, r.model.endUs);
  }
  odp.modelUs = results.length ? end - start : 0;
  return { status, byteLen: status === WcStatus.SUCCESS ? byteLen : 0, odp };
}

/** @internal One QP's engine side. */
export class QpEngine {
  readonly #ctx: ContextDataPath;
  readonly #qp: Qp;
  readonly #pd: PdState;
  readonly #sq: ConsumedRing | undefined;
  readonly #rq: ConsumedRing | undefined;
  readonly rc: RcQueuePair;
  /** WQEs started, in posting order, and their outcomes. */
  readonly #inflight: Array<{ wqe: DevSendWqe; done: boolean; out: Outcome | undefined }> = [];
  /** The receive WQE at the RQ's head, copied once (the responder holds it until consumed). */
  #head: RcRecvWqe | undefined;
  readonly #returned: RcRecvWqe[] = [];
  /** The next send WQE, read and checked, waiting for those in flight. */
  #next: DevSendWqe | undefined;
  /** An index of its rings was corrupt: they are not read until RESET. */
  #broken = false;
  #psn = 0;
  #destroyed = false;
  #bounce: (MemoryLike & { buffer: ArrayBuffer }) | undefined;
  #bounceAt = 0;

  constructor(ctx: ContextDataPath, qp: Qp, pd: PdState) {
    this.#ctx = ctx;
    this.#qp = qp;
    this.#pd = pd;
    if (qp.ring && qp.caps.maxSendWr) this.#sq = new ConsumedRing(qp.ring, QueueKind.SQ);
    if (qp.ring && qp.caps.maxRecvWr) this.#rq = new ConsumedRing(qp.ring, QueueKind.RQ);
    const reader: RecvReader = {
      length: () => this.#recvLength(),
      head: () => this.#recvHead(),
      shift: () => this.#recvShift(),
      unshift: (w) => this.#returned.unshift(w),
    };
    this.rc = new RcQueuePair({
      qpNum: qp.qpNum,
      pd: pd.rc,
      rq: this.#rq ? new MemfdRecvRing(reader) : undefined,
      recvCq: qp.recvCq ? ctx.cqRing(qp.recvCq) : undefined,
      srq: qp.srq ? ctx.srq(qp.srq)?.record : undefined,
      ud: qp.type === QpType.UD,
    });
    ctx.engine.qps.set(qp.qpNum, this);
    ctx.node.tables.qps.set(qp.qpNum, this.rc);
    this.#publish();
  }

  #publish(): void {
    const a = this.#qp.attrs;
    this.rc.modify({
      state: this.#qp.state,
      destroyed: this.#destroyed,
      destNode: 0,
      destQpNum: a.destQpNum,
      accessFlags: a.accessFlags,
      minRnrTimer: a.minRnrTimer,
      qkey: this.#qp.type === QpType.UD ? a.qkey : undefined,
    });
  }

  /** MODIFY_QP changed the QP (its state and attributes are the context's). */
  modified(from: QpState): void {
    const to = this.#qp.state;
    if (to === QpState.ERR && from !== QpState.ERR) {
      this.#qp.state = from;
      this.toError();
      return;
    }
    if (to === QpState.RESET) {
      this.rc.resp.msg = undefined;
      this.#head = undefined;
      this.#returned.length = 0;
      this.#sq?.reset();
      this.#rq?.reset();
      this.#broken = false;
    }
    if (to === QpState.RTR && from !== QpState.RTR) this.rc.expectPsn(this.#qp.attrs.rqPsn);
    if (to === QpState.RTS && from === QpState.RTR) this.#psn = this.#qp.attrs.sqPsn & 0xff_ffff;
    this.#publish();
    if (to === QpState.RTS) this.#ctx.scan();
  }

  // --- receives --------------------------------------------------------------------------------

  #recvLength(): number {
    if (!this.#rq) return 0;
    const n = this.#rq.available();
    return this.#returned.length + (this.#head ? 1 : 0) + Math.max(0, n);
  }

  // The next receive (decoded once, the same object until consumed); a bad one takes the QP to error.
  #recvHead(): RcRecvWqe | undefined {
    if (this.#returned.length) return this.#returned[0];
    if (this.#head) return this.#head;
    const r = this.#rq;
    if (!r || this.#broken) return undefined;
    const n = r.available();
    if (n < 0) return this.#corrupt();
    if (n === 0) return undefined;
    const w = decodeRecv(r.read(), this.#qp.caps.maxRecvSge, r.slotBytes);
    if (!w) {
      this.#ctx.engine.counters.refusedWqes++;
      r.consume();
      this.toError();
      return undefined;
    }
    this.#ctx.engine.counters.recvWqes++;
    this.#head = w;
    return w;
  }

  #recvShift(): RcRecvWqe | undefined {
    if (this.#returned.length) return this.#returned.shift();
    const w = this.#recvHead();
    if (!w) return undefined;
    this.#head = undefined;
    this.#rq!.consume();
    return w;
  }

  #completeRecv(
    w: RcRecvWqe,
    status: WcStatus,
    opcode: WcOpcode,
    byteLen: number,
    immData?: number,
    odp?: RcReceived['odp'],
    srcQp?: number,
    solicited?: boolean,
  ): void {
    const cq = this.#qp.recvCq;
    if (!cq) return;
    const ok = this.#ctx.complete(
      cq,
      BigInt(w.wrId),
      status,
      opcode,
      byteLen,
      this.#qp.qpNum,
      srcQp ?? this.#qp.attrs.destQpNum,
      immData,
      odp,
      solicited,
    );
    if (!ok) this.toError();
  }

  // --- sends -----------------------------------------------------------------------------------

  // The next send WQE from its copy, every field checked: the opcode for the QP's type, the
  // flags, num_sge within the ring's, inline within max_inline_data, the AH of a UD WR this
  // context's and of the QP's PD. The keys are checked where they are used.
  #decodeSend(v: DataView): DevSendWqe {
    const qp = this.#qp;
    const opcode = v.getUint32(SW['wr.opcode'], true) as WrOpcode;
    const flags = v.getUint32(SW['wr.send_flags'], true);
    const n = v.getUint32(SW['dma.num_sge'], true);
    const length = v.getUint32(SW['dma.length'], true);
    const w: DevSendWqe = {
      wrId: v.getBigUint64(SW['wr.wr_id'], true),
      opcode,
      flags,
      immData: v.getUint32(SW['wr.ex.imm_data'], false),
      remoteAddr: 0n,
      rkey: 0,
      compareAdd: 0n,
      swap: 0n,
      remoteQpn: 0,
      remoteQkey: 0,
      ah: undefined,
      xrcSrqn: v.getUint32(SW['wr.xrc_remote_srqn'], true),
      sges: [],
      inline: undefined,
      length,
      bad: undefined,
    };
    const ud = qp.type === QpType.UD;
    const known = ud ? opcode === WrOpcode.SEND || opcode === WrOpcode.SEND_WITH_IMM : RC_OPS.has(opcode);
    if (!known || flags & ~SEND_FLAGS) {
      w.bad = WcStatus.LOC_QP_OP_ERR;
      return w;
    }
    if (flags & SendFlags.INLINE) {
      if (length > qp.caps.maxInlineData || abi.sendWqe.size + length > v.byteLength) {
        w.bad = WcStatus.LOC_LEN_ERR;
        return w;
      }
      w.inline = new Uint8Array(v.buffer, v.byteOffset + abi.sendWqe.size, length).slice();
    } else {
      if (n > qp.caps.maxSendSge || abi.sendWqe.size + n * abi.rxeSge.size > v.byteLength) {
        w.bad = WcStatus.LOC_LEN_ERR;
        return w;
      }
      w.sges = readSges(v, abi.sendWqe.size, n);
      let total = 0;
      for (const s of w.sges) total += s.length;
      if (total > MAX_MSG) {
        w.bad = WcStatus.LOC_LEN_ERR;
        return w;
      }
      w.length = total;
    }
    if (ud) {
      w.remoteQpn = v.getUint32(SW['wr.wr.ud.remote_qpn'], true) & 0xff_ffff;
      w.remoteQkey = v.getUint32(SW['wr.wr.ud.remote_qkey'], true);
      const ah = this.#ctx.ah(v.getUint32(SW['wr.wr.ud.ah_handle'], true));
      if (!ah || ah.pd !== qp.pd) w.bad = WcStatus.LOC_QP_OP_ERR;
      else w.ah = ah;
      if (w.length > UD_MTU) w.bad = WcStatus.LOC_LEN_ERR;
    } else if (opcode === WrOpcode.ATOMIC_CMP_AND_SWP || opcode === WrOpcode.ATOMIC_FETCH_AND_ADD) {
      w.remoteAddr = v.getBigUint64(SW['wr.wr.atomic.remote_addr'], true);
      w.compareAdd = v.getBigUint64(SW['wr.wr.atomic.compare_add'], true);
      w.swap = v.getBigUint64(SW['wr.wr.atomic.swap'], true);
      w.rkey = v.getUint32(SW['wr.wr.atomic.rkey'], true);
      if (w.sges.length !== 1 || w.sges[0]!.length !== 8) w.bad = WcStatus.LOC_LEN_ERR;
    } else {
      w.remoteAddr = v.getBigUint64(SW['wr.wr.rdma.remote_addr'], true);
      w.rkey = v.getUint32(SW['wr.wr.rdma.rkey'], true);
    }
    return w;
  }

  /** Start what the send queue may start now; true if anything was started. */
  kick(): boolean {
    const q = this.#qp;
    const r = this.#sq;
    if (this.#destroyed || this.#broken) return false;
    if (q.state === QpState.ERR) this.#flushRecvs();
    if (!r || (q.state !== QpState.RTS && q.state !== QpState.ERR)) return false;
    let started = false;
    for (;;) {
      if (!this.#next) {
        const n = r.available();
        if (n < 0) {
          this.#corrupt();
          return started;
        }
        if (n === 0) return started;
        this.#next = this.#decodeSend(r.read());
      }
      const wqe = this.#next;
      // Writes run behind writes; anything else waits for all before it, and all wait for it.
      const head = this.#inflight[0];
      if (
        head &&
        q.state !== QpState.ERR &&
        !(head.wqe.opcode === WrOpcode.RDMA_WRITE && wqe.opcode === WrOpcode.RDMA_WRITE && wqe.bad === undefined)
      )
        return started;
      this.#next = undefined;
      const entry = { wqe, done: false, out: undefined as Outcome | undefined };
      this.#inflight.push(entry);
      started = true;
      this.#ctx.engine.counters.sendWqes++;
      if (q.state === QpState.ERR || wqe.bad !== undefined) {
        if (q.state !== QpState.ERR) this.#ctx.engine.counters.refusedWqes++;
        entry.done = true;
        entry.out = fail(q.state === QpState.ERR ? WcStatus.WR_FLUSH_ERR : wqe.bad!);
        this.#retire();
        continue;
      }
      void this.#execute(wqe)
        .catch(() => fail(WcStatus.GENERAL_ERR))
        .then((out) => {
          entry.done = true;
          entry.out = out;
          this.#retire();
          if (!this.#destroyed) this.#ctx.scan();
        });
    }
  }

  // Complete what is done at the head, in posting order: its slot back to the program, then
  // its CQE (if signalled, or an error). An error takes the QP to ERR: the rest is flushed.
  #retire(): void {
    const q = this.#qp;
    while (this.#inflight.length && this.#inflight[0]!.done) {
      const { wqe, out } = this.#inflight.shift()!;
      const o = q.state === QpState.ERR && out!.status === WcStatus.SUCCESS ? fail(WcStatus.WR_FLUSH_ERR) : out!;
      const signaled = q.sqSigAll || (wqe.flags & SendFlags.SIGNALED) !== 0;
      // The slot first, then the CQE (rxe_comp's order): a program that polls the completion
      // and posts at once finds the room it freed.
      this.#sq!.consume();
      if ((signaled || o.status !== WcStatus.SUCCESS) && q.sendCq)
        if (
          !this.#ctx.complete(
            q.sendCq,
            wqe.wrId,
            o.status,
            WC_OPCODE[wqe.opcode] ?? WcOpcode.SEND,
            o.byteLen,
            q.qpNum,
            q.attrs.destQpNum,
            undefined,
            o.odp,
          )
        )
          this.toError();
      if (o.status !== WcStatus.SUCCESS) this.toError();
    }
  }

  async #execute(w: DevSendWqe): Promise<Outcome> {
    const landsHere = w.opcode === WrOpcode.RDMA_READ || w.opcode === WrOpcode.ATOMIC_CMP_AND_SWP || w.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD;
    let pieces: Array<{ addr: bigint; length: number }>;
    if (w.inline) {
      const at = this.#stage(w.inline);
      pieces = [{ addr: at, length: w.inline.byteLength }];
    } else {
      pieces = [];
      for (const s of w.sges) {
        if (!this.#ctx.localMr(s.lkey, this.#qp.pd!, s.addr, s.length, landsHere)) return fail(WcStatus.LOC_PROT_ERR);
        pieces.push({ addr: s.addr, length: s.length });
      }
    }
    const imm = w.opcode === WrOpcode.RDMA_WRITE_WITH_IMM || w.opcode === WrOpcode.SEND_WITH_IMM ? w.immData : undefined;
    const se = (w.flags & SendFlags.SOLICITED) !== 0 ? { solicited: true } : {};
    let offset = 0;
    switch (w.opcode) {
      case WrOpcode.RDMA_WRITE:
      case WrOpcode.RDMA_WRITE_WITH_IMM: {
        const parts = pieces.map((p) => {
          const o = offset;
          offset += p.length;
          return { fromVa: p.addr, toVa: w.remoteAddr + BigInt(o), length: p.length, key: w.rkey };
        });
        const res = await this.#move(w.opcode === WrOpcode.RDMA_WRITE ? RcOp.WRITE : RcOp.WRITE_IMM, parts, w.length, imm, se);
        return done(statusOf(res), w.length, res);
      }
      case WrOpcode.SEND:
      case WrOpcode.SEND_WITH_IMM: {
        const parts = pieces.map((p) => ({ fromVa: p.addr, toVa: 0n, length: p.length }));
        if (this.#qp.type === QpType.UD) {
          const res = await this.#move(
            imm !== undefined ? RcOp.UD_SEND_IMM : RcOp.UD_SEND,
            [{ fromVa: parts[0]?.fromVa ?? 0n, toVa: 0n, length: w.length }],
            w.length,
            imm,
            se,
            { qpn: w.remoteQpn, qkey: w.remoteQkey },
          );
          return done(statusOf(res), w.length, res);
        }
        const res = await this.#move(imm !== undefined ? RcOp.SEND_IMM : RcOp.SEND, parts, w.length, imm, se);
        return done(statusOf(res), w.length, res);
      }
      case WrOpcode.RDMA_READ: {
        const sinks = w.sges.map((s) => ({ addr: s.addr, length: s.length, lkey: s.lkey }));
        const landed = this.#expect(sinks);
        const res = await this.#move(RcOp.READ_REQUEST, [{ fromVa: 0n, toVa: w.remoteAddr, length: 0, key: w.rkey }], 0, undefined, {
          dmaLength: w.length,
          sinks,
          responseTimeout: this.#responseTimeout(),
        }).finally(landed);
        return done(statusOf(res), w.length, res);
      }
      case WrOpcode.ATOMIC_CMP_AND_SWP:
      case WrOpcode.ATOMIC_FETCH_AND_ADD: {
        const sinks = w.sges.map((s) => ({ addr: s.addr, length: s.length, lkey: s.lkey }));
        const landed = this.#expect(sinks);
        const res = await this.#move(RcOp.ATOMIC, [{ fromVa: 0n, toVa: w.remoteAddr, length: 0, key: w.rkey }], 0, undefined, {
          sinks,
          responseTimeout: this.#responseTimeout(),
          atomic: { fetchAdd: w.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD, compareAdd: w.compareAdd, swap: w.swap },
        }).finally(landed);
        return done(statusOf(res), 8, res);
      }
    }
    return fail(WcStatus.LOC_QP_OP_ERR);
  }

  #expect(sges: DevSge[]): () => void {
    const spans = sges.map((s) => ({ key: s.lkey, addr: s.addr, end: s.addr + BigInt(s.length) }));
    for (const l of spans) this.rc.landings.add(l);
    return () => {
      for (const l of spans) this.rc.landings.delete(l);
    };
  }

  #responseTimeout(): { periodMs: number; retries: number } {
    const a = this.#qp.attrs;
    const ibMs = 0.004096 * 2 ** (a.timeout === 0 ? 14 : a.timeout);
    return { periodMs: Math.max(ibMs, this.#ctx.node.pldma.faultTimeoutMs), retries: a.retryCnt };
  }

  // INLINE bytes: staged in a device-owned buffer of this QP mapped into its PD's stream
  // (the program's buffer may be reused at once and needs no key). One buffer of 64 KiB per QP,
  // used as a ring: a WQE's bytes stay until long after it completed (max_send_wr × 256 fits).
  #stage(bytes: Uint8Array): bigint {
    const size = 64 * 1024;
    if (!this.#bounce) {
      this.#bounce = rawMemory(binding.mapRegion(size, false, false, false));
      binding.populate(this.#bounce.id, 0, size, true);
      this.#ctx.node.map(this.#pd.stream, this.#bounce, { read: true, write: false });
    }
    if (this.#bounceAt + bytes.byteLength > size) this.#bounceAt = 0;
    const at = this.#bounceAt;
    new Uint8Array(this.#bounce.buffer, at, bytes.byteLength).set(bytes);
    this.#bounceAt = (at + bytes.byteLength + 63) & ~63;
    return this.#bounce.address + BigInt(at);
  }

  #move(
    opcode: RcOp,
    pieces: Array<{ fromVa: bigint; toVa: bigint; length: number; key?: number }>,
    total: number,
    immData: number | undefined,
    request?: Pick<DmaDescriptor, 'dmaLength' | 'sinks' | 'atomic' | 'solicited' | 'responseTimeout'>,
    ud?: { qpn: number; qkey: number },
  ): Promise<DmaCompletion[]> {
    const q = this.#qp;
    const node = this.#ctx.node;
    const rnr = q.attrs.rnrRetry;
    const psn = this.#psn;
    this.#psn = (psn + 1) & 0xff_ffff;
    const parts = pieces.filter((p) => p.length > 0);
    if (parts.length === 0) parts.push({ ...(pieces[0] ?? { fromVa: 0n, toVa: 0n }), length: 0 });
    let offset = 0;
    const post = (p: { fromVa: bigint; toVa: bigint; length: number; key?: number }) => {
      const desc: DmaDescriptor = {
        channel: q.qpNum % node.channels,
        srcVa: p.fromVa,
        dstNode: 0,
        dstVa: p.toVa,
        length: p.length,
        pd: this.#pd.rc.handle,
        retryLimit: rnr === 7 ? Infinity : rnr,
        dstQp: ud ? ud.qpn : q.attrs.destQpNum,
        srcQp: q.qpNum,
        opcode,
        psn,
      };
      if (p.key !== undefined) desc.key = p.key;
      if (immData !== undefined) desc.immData = immData;
      if (ud) desc.qkey = ud.qkey;
      if (parts.length > 1) desc.message = { offset, length: total };
      if (request) Object.assign(desc, request);
      offset += p.length;
      return node.post(desc);
    };
    if (parts.length === 1) return post(parts[0]!).then((c) => [c]);
    return Promise.all(parts.map(post));
  }

  // --- errors and the end ----------------------------------------------------------------------

  // A ring whose index the program broke: counted once, the QP to error; the ring is not read
  // again until the QP is reset.
  #corrupt(): undefined {
    if (this.#broken) return undefined;
    this.#broken = true;
    this.#ctx.engine.counters.corruptRings++;
    this.#ctx.engine.counters.refusedWqes++;
    if (this.#qp.state !== QpState.ERR) this.#ctx.asyncEvent(AsyncEventType.QP_FATAL, abi.ElementKind.QP, this.#qp.handle);
    this.toError();
    return undefined;
  }

  /** To ERR: the receives flushed, its messages on the engine ended, the sends flushed behind those in flight. */
  toError(): void {
    const q = this.#qp;
    if (q.state === QpState.ERR && this.rc.state === QpState.ERR) return;
    q.state = QpState.ERR;
    // The engine's QP to ERR: its receives (and one a message held) flushed there, in order.
    this.#publish();
    this.#flushRecvs();
    this.#ctx.node.cancel(q.qpNum);
    if (!this.#destroyed) queueMicrotask(() => this.kick());
  }

  // ERR: every receive posted is flushed (WR_FLUSH_ERR), as it is posted.
  #flushRecvs(): void {
    for (let w = this.#recvShift(); w; w = this.#recvShift()) this.#completeRecv(w, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
  }

  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#qp.state = QpState.ERR;
    this.#publish();
    const node = this.#ctx.node;
    node.tables.qps.delete(this.#qp.qpNum);
    this.#ctx.engine.qps.delete(this.#qp.qpNum);
    node.cancel(this.#qp.qpNum);
    node.fence({ qp: this.#qp.qpNum });
    if (this.#bounce) {
      node.unmap(this.#pd.stream, this.#bounce);
      binding.closeRegion(this.#bounce.id, this.#bounce.buffer);
      this.#bounce = undefined;
    }
  }
}
