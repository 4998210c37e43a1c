// The provider's side of the device's queues (rdma-core's providers/rxe/rxe_queue.h and the
// WQE writer of rxe.c's post_send): the same memory the device reads, with the byte layout
// the device defines once (kernel-sim/device/abi.ts; the offsets below are read from it when
// this module loads). The provider writes a send WQE at the producer index and publishes it;
// it reads a CQE at the consumer index and frees its slot. Nothing here calls into the device:
// between postSend and pollCq the only crossings are the doorbell and the CQ's event.
import { sendWqe, rxeSge, QUEUE_DATA_OFFSET } from '../../kernel-sim/device/abi.js';
import { HEADER, SGE } from '../../kernel-sim/device/rings.js';
import { SEND_WQE as W } from '../../kernel-sim/device/send-ring.js';
import { WrOpcode } from './constants.js';
import type { SendWr } from './qp-core.js';

const SGES = sendWqe.size;
const SGE_SIZE = rxeSge.size;
const PI = HEADER.producer_index / 4;
const CI = HEADER.consumer_index / 4;

/** A ring's geometry and memory, as the device made it (a Ring's public fields). */
export interface QueueMemory {
  readonly buffer: ArrayBuffer | SharedArrayBuffer;
  readonly offset: number;
  readonly numElems: number;
  readonly log2ElemSize: number;
}

/**
 * One queue as the provider sees it: free-running producer and consumer indices in the
 * header, slots after it. The geometry is the provider's own copy, taken at creation.
 */
export class ProviderQueue {
  readonly view: DataView;
  readonly numElems: number;
  readonly #mask: number;
  readonly #log2: number;
  readonly #base: number;
  readonly #idx: Uint32Array;

  constructor(m: QueueMemory) {
    this.view = new DataView(m.buffer);
    this.numElems = m.numElems;
    this.#mask = m.numElems - 1;
    this.#log2 = m.log2ElemSize;
    this.#base = m.offset + QUEUE_DATA_OFFSET;
    this.#idx = new Uint32Array(m.buffer, m.offset, QUEUE_DATA_OFFSET / 4);
  }

  get producer(): number {
    return Atomics.load(this.#idx, PI);
  }

  get consumer(): number {
    return Atomics.load(this.#idx, CI);
  }

  /** Entries produced and not consumed. */
  get count(): number {
    return (Atomics.load(this.#idx, PI) - Atomics.load(this.#idx, CI)) >>> 0;
  }

  /** Byte offset of the slot of entry `i`. */
  slot(i: number): number {
    return this.#base + ((i & this.#mask) << this.#log2);
  }

  /** The slot of the consumer index if an entry is there, else -1. */
  consumerSlot(): number {
    const c = Atomics.load(this.#idx, CI);
    if (Atomics.load(this.#idx, PI) === c) return -1;
    return this.#base + ((c & this.#mask) << this.#log2);
  }

  /** Publish the entry written at slot(producer). */
  produced(): void {
    Atomics.store(this.#idx, PI, (Atomics.load(this.#idx, PI) + 1) >>> 0);
  }

  /** Free the slot of the entry read at slot(consumer). */
  consumed(): void {
    Atomics.store(this.#idx, CI, (Atomics.load(this.#idx, CI) + 1) >>> 0);
  }
}

function isAtomic(op: WrOpcode): boolean {
  return op === WrOpcode.ATOMIC_CMP_AND_SWP || op === WrOpcode.ATOMIC_FETCH_AND_ADD;
}

/**
 * post_send's step for one checked WR: write it as a WQE at the producer index and publish it;
 * false if the ring is full. `ahHandle` is the device's number of a UD WR's address handle
 * (wr.ud.ah_handle); `ud` says the QP's WQEs carry wr.ud; `inline`, an INLINE WR's bytes
 * (copied now: the WR's buffers may be reused as soon as postSend returns).
 */
export function writeSendWqe(q: ProviderQueue, wr: SendWr, ud: boolean, ahHandle: number, inline?: Uint8Array): boolean {
  if (q.count >= q.numElems) return false;
  const v = q.view;
  const at = q.slot(q.producer);
  let length = 0;
  // IBV_SEND_INLINE: the bytes themselves follow the header (rxe's dma.inline_data), no SGEs.
  const list = inline ? [] : wr.sgList;
  if (inline) {
    new Uint8Array(v.buffer, at + SGES, inline.length).set(inline);
    length = inline.length;
  }
  for (let k = 0; k < list.length; k++) {
    const s = list[k]!;
    const o = at + SGES + k * SGE_SIZE;
    v.setBigUint64(o + SGE.addr, BigInt(s.addr), true);
    v.setUint32(o + SGE.length, s.length, true);
    v.setUint32(o + SGE.lkey, s.lkey, true);
    length += s.length;
  }
  v.setBigUint64(at + W['wr.wr_id'], BigInt(wr.wrId), true);
  v.setUint32(at + W['wr.opcode'], wr.opcode, true);
  v.setUint32(at + W['wr.send_flags'], wr.sendFlags ?? 0, true);
  v.setUint32(at + W['wr.ex.imm_data'], (wr.immData ?? 0) >>> 0, false);
  v.setUint32(at + W['wr.xrc_remote_srqn'], wr.xrc?.remoteSrqn ?? 0, true);
  writeRemote(v, at, wr, ud, ahHandle);
  v.setUint32(at + W['dma.length'], length >>> 0, true);
  v.setUint32(at + W['dma.resid'], length >>> 0, true);
  v.setUint32(at + W['dma.num_sge'], list.length, true);
  q.produced();
  return true;
}

// The WQE's union wr.wr: what the opcode names at the other end.
function writeRemote(v: DataView, at: number, wr: SendWr, ud: boolean, ahHandle: number): void {
  if (wr.opcode === WrOpcode.FLUSH && wr.flush) {
    const f = wr.flush;
    v.setBigUint64(at + W['wr.wr.flush.remote_addr'], f.remoteAddr, true);
    v.setBigUint64(at + W['wr.wr.flush.length'], BigInt(f.length), true);
    v.setUint32(at + W['wr.wr.flush.rkey'], f.rkey, true);
    v.setUint8(at + W['wr.wr.flush.type'], f.type);
    v.setUint8(at + W['wr.wr.flush.level'], f.level);
  } else if (isAtomic(wr.opcode) && wr.atomic) {
    const a = wr.atomic;
    v.setBigUint64(at + W['wr.wr.atomic.remote_addr'], a.remoteAddr, true);
    v.setBigUint64(at + W['wr.wr.atomic.compare_add'], BigInt.asUintN(64, a.compareAdd), true);
    v.setBigUint64(at + W['wr.wr.atomic.swap'], BigInt.asUintN(64, a.swap ?? 0n), true);
    v.setUint32(at + W['wr.wr.atomic.rkey'], a.rkey, true);
  } else if (ud && wr.ud) {
    v.setUint32(at + W['wr.wr.ud.remote_qpn'], wr.ud.remoteQpn, true);
    v.setUint32(at + W['wr.wr.ud.remote_qkey'], wr.ud.remoteQkey, true);
    v.setUint32(at + W['wr.wr.ud.ah_handle'], ahHandle, true);
  } else if (wr.rdma) {
    v.setBigUint64(at + W['wr.wr.rdma.remote_addr'], wr.rdma.remoteAddr, true);
    v.setUint32(at + W['wr.wr.rdma.rkey'], wr.rdma.rkey, true);
  }
}
