// A receive queue's ring or a shared receive queue's (docs/device-abi.md §2, struct
// pfr_recv_wqe, then rxe_sge's): the provider posts receive WQEs into it (push, the producer's
// step), the device's responder reads the head and consumes it when a message takes it.
// The layout is abi.ts's; nothing in the ring is a JavaScript object. The device's side keeps
// its own copies: the head it decoded (the same object until it is consumed, so a message can
// hold it) and the receives a UD datagram gave back (they go in front again).
import { QueueKind, recvWqe } from './abi.js';
import { recvGeometry, WqeRing } from './rings.js';

const WQE = recvWqe.offsets(['wr_id', 'dma.length', 'dma.resid', 'dma.num_sge'] as const);
const SGES = recvWqe.size;

/** A receive WQE as the device decodes it (and as the provider posts it). */
export interface RecvWqe {
  wrId: bigint | number;
  sgList: { addr: bigint; length: number; lkey: number }[];
}

export class RecvRing<W extends RecvWqe = RecvWqe> extends WqeRing<W> {
  /** SGEs a WQE of this ring holds. */
  readonly maxSge: number;
  readonly #returned: W[] = [];

  /** A ring for `maxWr` receives of up to `maxSge` SGEs (an SRQ's: `kind` SRQ). */
  constructor(maxWr: number, maxSge: number, kind: QueueKind.RQ | QueueKind.SRQ = QueueKind.RQ, handle = 0) {
    const g = recvGeometry(Math.max(1, maxWr), Math.max(1, maxSge));
    super({ kind, numElems: g.numElems, log2: g.log2 }, handle);
    this.maxSge = g.maxSge;
  }

  /** Receives posted and not consumed (those given back included). */
  get length(): number {
    return this.count + this.#returned.length;
  }

  /** The provider's step: write one checked WQE into the next slot and publish it; false if full. */
  push(wr: RecvWqe): boolean {
    if (this.count >= this.numElems || wr.sgList.length > this.maxSge) return false;
    const v = this.view;
    const at = this.slot(this.producer);
    const length = this.writeSges(at, SGES, wr.sgList);
    v.setBigUint64(at + WQE.wr_id, BigInt(wr.wrId), true);
    v.setUint32(at + WQE['dma.length'], length >>> 0, true);
    v.setUint32(at + WQE['dma.resid'], length >>> 0, true);
    v.setUint32(at + WQE['dma.num_sge'], wr.sgList.length, true);
    this.produced();
    return true;
  }

  /** The device's view of the next receive, decoded once (the same object until consumed). */
  override head(): W | undefined {
    return this.#returned.length ? this.#returned[0] : this.peek();
  }

  /** The device consumes the head (a message took it for good). */
  override shift(): W | undefined {
    return this.#returned.length ? this.#returned.shift() : this.take();
  }

  /** A receive the device took comes back to the head (a UD datagram that faulted comes again). */
  unshift(w: W): void {
    this.#returned.unshift(w);
  }

  // Copy a WQE out of its slot (the device checks and uses its copy, never the slot again).
  protected decode(at: number): W {
    const v = this.view;
    const n = Math.min(v.getUint32(at + WQE['dma.num_sge'], true), this.maxSge);
    const sgList = this.readSges(at, SGES, n);
    return { wrId: v.getBigUint64(at + WQE.wr_id, true), sgList } as W;
  }
}
