// A send queue's ring (docs/device-abi.md §2, struct pfr_send_wqe, then rxe_sge's): the
// provider writes each checked WR as a WQE (push, the producer's step) and rings the doorbell;
// the device's requester reads WQEs from its own index (rxe's req.wqe_index: `at`, a copy
// decoded once), and its completer frees each slot when the WQE completes (`complete`, the
// consumer's step, rxe_queue.h: a slot is the provider's again only once completed). The
// layout is abi.ts's. The one value no byte can carry, a UD WR's address handle, is named by a
// handle (wr.ud.ah_handle) into the ring's table of AHs. An INLINE WQE carries its bytes after
// the header (no SGEs), which the device copies out with the rest.
import { QueueKind, sendWqe } from './abi.js';
import { SendFlags, WrOpcode } from './ib.js';
import { sendGeometry, WqeRing } from './rings.js';

/** Offsets of a send WQE's fields in its slot (the provider writes them, the device decodes them). */
export const SEND_WQE = sendWqe.offsets([
  'wr.wr_id',
  'wr.opcode',
  'wr.send_flags',
  'wr.ex.imm_data',
  'wr.xrc_remote_srqn',
  'wr.wr.rdma.remote_addr',
  'wr.wr.rdma.rkey',
  'wr.wr.atomic.remote_addr',
  'wr.wr.atomic.compare_add',
  'wr.wr.atomic.swap',
  'wr.wr.atomic.rkey',
  'wr.wr.ud.remote_qpn',
  'wr.wr.ud.remote_qkey',
  'wr.wr.ud.ah_handle',
  'wr.wr.flush.remote_addr',
  'wr.wr.flush.length',
  'wr.wr.flush.rkey',
  'wr.wr.flush.type',
  'wr.wr.flush.level',
  'dma.length',
  'dma.resid',
  'dma.num_sge',
] as const);
const W = SEND_WQE;
const SGES = sendWqe.size;

/** A send WR as the provider posts it and the device decodes it (lib's SendWr, `A` its AH). */
export interface SendWqe<A extends object = object> {
  wrId: bigint | number;
  opcode: WrOpcode;
  sgList: { addr: bigint; length: number; lkey: number }[];
  sendFlags?: number;
  immData?: number;
  rdma?: { remoteAddr: bigint; rkey: number };
  ud?: { ah: A; remoteQpn: number; remoteQkey: number };
  xrc?: { remoteSrqn: number };
  flush?: { remoteAddr: bigint; rkey: number; length: number; type: number; level: number };
  atomic?: { remoteAddr: bigint; rkey: number; compareAdd: bigint; swap?: bigint };
  /** IBV_SEND_INLINE: the message's bytes, carried in the WQE (rxe's dma.inline_data); no SGEs. The device's copy. */
  inline?: Uint8Array;
}

export class SendRing<S extends SendWqe = SendWqe> extends WqeRing<S> {
  readonly maxSge: number;
  /** Most bytes an INLINE WQE carries (max_inline_data: the slot's room after the header). */
  readonly maxInline: number;
  /** The QP's type says which parts a WQE has: UD (wr.ud), XRC_SEND (xrc_remote_srqn). */
  readonly #ud: boolean;
  readonly #xrc: boolean;
  /** UD: the AHs named by WQEs' ah_handle (the device's table; a handle per AH object). */
  readonly #ahs = new Map<number, NonNullable<S['ud']>['ah']>();
  readonly #ahHandles = new WeakMap<object, number>();
  #nextAh = 1;

  /**
   * A send ring for `maxWr` WQEs of `maxSge` SGEs; in memory of its own, or at `memory.offset`
   * of a queue memfd whose header is written already (RingMemory: a provider in another process).
   */
  constructor(
    maxWr: number,
    maxSge: number,
    transport: { ud?: boolean; xrc?: boolean } = {},
    handle = 0,
    memory?: { buffer: ArrayBuffer | SharedArrayBuffer; offset: number },
  ) {
    const g = sendGeometry(Math.max(1, maxWr), Math.max(1, maxSge), 0);
    super({ kind: QueueKind.SQ, numElems: g.numElems, log2: g.log2 }, handle, memory?.buffer, memory?.offset ?? 0);
    this.maxSge = g.maxSge;
    this.maxInline = g.maxInline;
    this.#ud = transport.ud === true;
    this.#xrc = transport.xrc === true;
  }

  /** WQEs posted and not yet completed (they hold their slots). */
  get length(): number {
    return this.count;
  }

  /**
   * The device's copy of WQE `i` (a free-running index), decoded from its slot; undefined if
   * `i` is not posted and uncompleted, or if the indices are corrupt (the provider's memory is
   * not trusted).
   */
  at(i: number): S | undefined {
    const at = this.slotOf(i);
    return at < 0 ? undefined : this.decode(at);
  }

  /** The provider's step: write one checked WR as a WQE and publish it; false if full. */
  push(wr: S): boolean {
    if (this.count >= this.numElems || wr.sgList.length > this.maxSge) return false;
    const v = this.view;
    const at = this.slot(this.producer);
    const length = this.writeSges(at, SGES, wr.sgList);
    v.setBigUint64(at + W['wr.wr_id'], BigInt(wr.wrId), true);
    v.setUint32(at + W['wr.opcode'], wr.opcode, true);
    v.setUint32(at + W['wr.send_flags'], wr.sendFlags ?? 0, true);
    v.setUint32(at + W['wr.ex.imm_data'], (wr.immData ?? 0) >>> 0, false);
    v.setUint32(at + W['wr.xrc_remote_srqn'], wr.xrc?.remoteSrqn ?? 0, true);
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
    } else if (this.#ud && wr.ud) {
      v.setUint32(at + W['wr.wr.ud.remote_qpn'], wr.ud.remoteQpn, true);
      v.setUint32(at + W['wr.wr.ud.remote_qkey'], wr.ud.remoteQkey, true);
      v.setUint32(at + W['wr.wr.ud.ah_handle'], this.ahHandle(wr.ud.ah), true);
    } else if (wr.rdma) {
      v.setBigUint64(at + W['wr.wr.rdma.remote_addr'], wr.rdma.remoteAddr, true);
      v.setUint32(at + W['wr.wr.rdma.rkey'], wr.rdma.rkey, true);
    }
    v.setUint32(at + W['dma.length'], length >>> 0, true);
    v.setUint32(at + W['dma.resid'], length >>> 0, true);
    v.setUint32(at + W['dma.num_sge'], wr.sgList.length, true);
    this.produced();
    return true;
  }

  /** The device's number of a UD WR's address handle (wr.ud.ah_handle), given at its first use. */
  ahHandle(ah: NonNullable<S['ud']>['ah']): number {
    let h = this.#ahHandles.get(ah);
    if (h === undefined) {
      h = this.#nextAh++;
      this.#ahHandles.set(ah, h);
      this.#ahs.set(h, ah);
    }
    return h;
  }

  /**
   * The device's AH table for WQEs written elsewhere (a provider in another process names an
   * AH by the handle ibv_create_ah returned): `ah` is what `handle` stands for from now on.
   */
  setAh(handle: number, ah: NonNullable<S['ud']>['ah']): void {
    this.#ahs.set(handle >>> 0, ah);
    this.#nextAh = Math.max(this.#nextAh, (handle >>> 0) + 1);
  }

  protected decode(at: number): S {
    const v = this.view;
    const opcode = v.getUint32(at + W['wr.opcode'], true) as WrOpcode;
    const sendFlags = v.getUint32(at + W['wr.send_flags'], true);
    const n = Math.min(v.getUint32(at + W['dma.num_sge'], true), this.maxSge);
    const inline = sendFlags & SendFlags.INLINE && n === 0;
    const sgList = inline ? [] : this.readSges(at, SGES, n);
    const wr: SendWqe = { wrId: v.getBigUint64(at + W['wr.wr_id'], true), opcode, sgList, sendFlags };
    // The inline bytes copied out of the slot (no longer than the slot holds: the length is the provider's word).
    if (inline) wr.inline = new Uint8Array(this.buffer, at + SGES, Math.min(v.getUint32(at + W['dma.length'], true), this.maxInline)).slice();
    if (opcode === WrOpcode.RDMA_WRITE_WITH_IMM || opcode === WrOpcode.SEND_WITH_IMM) wr.immData = v.getUint32(at + W['wr.ex.imm_data'], false);
    if (this.#xrc) wr.xrc = { remoteSrqn: v.getUint32(at + W['wr.xrc_remote_srqn'], true) };
    if (opcode === WrOpcode.FLUSH)
      wr.flush = {
        remoteAddr: v.getBigUint64(at + W['wr.wr.flush.remote_addr'], true),
        rkey: v.getUint32(at + W['wr.wr.flush.rkey'], true),
        length: Number(v.getBigUint64(at + W['wr.wr.flush.length'], true)),
        type: v.getUint8(at + W['wr.wr.flush.type']),
        level: v.getUint8(at + W['wr.wr.flush.level']),
      };
    else if (isAtomic(opcode)) {
      wr.atomic = {
        remoteAddr: v.getBigUint64(at + W['wr.wr.atomic.remote_addr'], true),
        rkey: v.getUint32(at + W['wr.wr.atomic.rkey'], true),
        compareAdd: v.getBigUint64(at + W['wr.wr.atomic.compare_add'], true),
      };
      if (opcode === WrOpcode.ATOMIC_CMP_AND_SWP) wr.atomic.swap = v.getBigUint64(at + W['wr.wr.atomic.swap'], true);
    } else if (this.#ud) {
      const ah = this.#ahs.get(v.getUint32(at + W['wr.wr.ud.ah_handle'], true));
      if (ah)
        wr.ud = { ah, remoteQpn: v.getUint32(at + W['wr.wr.ud.remote_qpn'], true), remoteQkey: v.getUint32(at + W['wr.wr.ud.remote_qkey'], true) };
    } else if (
      opcode === WrOpcode.RDMA_WRITE ||
      opcode === WrOpcode.RDMA_WRITE_WITH_IMM ||
      opcode === WrOpcode.RDMA_READ ||
      opcode === WrOpcode.ATOMIC_WRITE
    )
      wr.rdma = { remoteAddr: v.getBigUint64(at + W['wr.wr.rdma.remote_addr'], true), rkey: v.getUint32(at + W['wr.wr.rdma.rkey'], true) };
    return wr as S;
  }
}

function isAtomic(op: WrOpcode): boolean {
  return op === WrOpcode.ATOMIC_CMP_AND_SWP || op === WrOpcode.ATOMIC_FETCH_AND_ADD;
}
