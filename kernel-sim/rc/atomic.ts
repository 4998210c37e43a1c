// The atomic unit of one node (rxe_resp's atomic_reply and its responder resources): one
// atomic at a time on the node, its register (pages of 8-byte words where each atomic's
// original value is read and its ATOMIC_ACK is sent from), and the replay each QP keeps of the
// atomics it executed, so a duplicate request is answered from the register, never executed
// again. The responder decides whether an atomic runs; this unit runs it on the copy engine.
import { binding, type RawMapping } from '../../native/index.js';
import { type MemoryLike, rawMemory } from '../memory.js';
import type { Smmu, StreamContext } from '../smmu/smmu.js';
import { type CopyEngine, CopyFlag, CopyStatus, type CopyTag } from '../pldma/copy-engine.js';

/** A page of the register: 512 words, where atomics' original values are read and their responses sent from. */
interface RegisterPage {
  raw: RawMapping;
  memory: MemoryLike;
  /** The streams it is mapped in (a response's source is translated there). */
  mapped: WeakSet<StreamContext>;
}

/** An atomic this node executed, kept for a duplicate request: its PSN and the word of the register holding its original value. */
interface Replayed {
  psn: number;
  slot: number;
}

/**
 * Atomics each QP keeps for replay. A requester has one atomic outstanding per QP (the verbs
 * run a READ or an atomic alone), so a word of the register is reused only after the response
 * it holds has landed.
 */
const ATOMIC_REPLAY = 4;
/** Words of one register page; word 0 of the first page is the unit's own (the new value). */
const SLOTS_PER_PAGE = 512;

/** What an atomic's execution did: the word of the register holding the original value, or why it did not run. */
export type AtomicOutcome =
  { status: 'done'; slot: number; address: bigint } | { status: 'source-fault' } | { status: 'read-failed' } | { status: 'write-failed' };

/** An atomic operation (IB's FetchAdd or CmpSwap). */
export interface AtomicOp {
  fetchAdd: boolean;
  compareAdd: bigint;
  swap: bigint;
}

/** @internal The atomic unit of one node (see the top of this file). */
export class AtomicUnit {
  #smmu: Smmu;
  #engine: CopyEngine;
  #queue: Promise<unknown> = Promise.resolve();
  #register: RegisterPage[] = [];
  #freeSlots: number[] = [];
  #replay = new Map<number, Replayed[]>();

  constructor(smmu: Smmu, engine: CopyEngine) {
    this.#smmu = smmu;
    this.#engine = engine;
  }

  /** Run `op` after every atomic queued before it (one at a time on this node). */
  serial<T>(op: () => Promise<T>): Promise<T> {
    const out = this.#queue.then(op, op);
    this.#queue = out.catch(() => undefined);
    return out;
  }

  /** The address of the original value of QP `qp`'s atomic of PSN `psn`, in `ctx`'s stream; undefined if it is no longer kept. */
  replayed(qp: number, psn: number, ctx: StreamContext): bigint | undefined {
    const r = this.#replay.get(qp)?.find((e) => e.psn === psn);
    return r === undefined ? undefined : this.#slotAt(ctx, r.slot).address;
  }

  /**
   * Execute `op` on the 8-byte word at `offset` of `region` (translated in `ctx`'s stream): the
   * original value read into a word of the register, the new value written, the atomic kept
   * for QP `qp`'s replay under `psn`. The copies carry `tag` (fenced with their key or QP).
   */
  async execute(region: MemoryLike, offset: number, op: AtomicOp, ctx: StreamContext, tag: CopyTag, qp: number, psn: number): Promise<AtomicOutcome> {
    const engine = this.#engine;
    const slot = this.#takeSlot();
    const old = this.#slotAt(ctx, slot);
    const read = await engine.copy(region, offset, old.page.memory, old.offset, 8, CopyFlag.CheckSource, tag);
    if (read.status !== CopyStatus.Ok) {
      this.#freeSlots.push(slot);
      return { status: read.status === CopyStatus.SourceFault ? 'source-fault' : 'read-failed' };
    }
    const orig = new DataView(old.page.raw.buffer).getBigUint64(old.offset, true);
    const next = op.fetchAdd ? BigInt.asUintN(64, orig + op.compareAdd) : orig === op.compareAdd ? op.swap : undefined;
    if (next !== undefined) {
      // The unit's own word (word 0 of its first page) holds the new value for the copy.
      const unit = this.#register[0]!;
      new DataView(unit.raw.buffer).setBigUint64(0, next, true);
      const wrote = await engine.copy(unit.memory, 0, region, offset, 8, CopyFlag.CheckDest, tag);
      if (wrote.status !== CopyStatus.Ok) {
        this.#freeSlots.push(slot);
        return { status: 'write-failed' };
      }
    }
    this.#remember(qp, psn, slot);
    return { status: 'done', slot, address: old.address };
  }

  // A free word of the register (a page more when none is left).
  #takeSlot(): number {
    if (this.#freeSlots.length === 0) {
      const raw = binding.mapRegion(SLOTS_PER_PAGE * 8, false, false, false);
      new Uint8Array(raw.buffer).fill(0);
      // Its bytes are read by a transport between processes too (it looks for `buffer`).
      this.#register.push({ raw, memory: rawMemory(raw), mapped: new WeakSet() });
      const base = (this.#register.length - 1) * SLOTS_PER_PAGE;
      for (let i = SLOTS_PER_PAGE - 1; i >= (base === 0 ? 1 : 0); i--) this.#freeSlots.push(base + i);
    }
    return this.#freeSlots.pop()!;
  }

  // Word `slot` of the register: its page (mapped in `ctx`'s stream, where a response's source is translated) and address.
  #slotAt(ctx: StreamContext, slot: number): { page: RegisterPage; offset: number; address: bigint } {
    const page = this.#register[Math.floor(slot / SLOTS_PER_PAGE)]!;
    if (!page.mapped.has(ctx)) {
      this.#smmu.map(ctx.sid, page.memory, { read: true, write: true });
      page.mapped.add(ctx);
    }
    const offset = (slot % SLOTS_PER_PAGE) * 8;
    return { page, offset, address: page.memory.address + BigInt(offset) };
  }

  // An atomic executed for QP `qp`: kept for a duplicate, the QP's oldest one's word freed.
  #remember(qp: number, psn: number, slot: number): void {
    let list = this.#replay.get(qp);
    if (!list) this.#replay.set(qp, (list = []));
    list.push({ psn, slot });
    if (list.length > ATOMIC_REPLAY) this.#freeSlots.push(list.shift()!.slot);
  }

  /** QP `qp` of this node was destroyed (its responses' copies fenced): its replay goes. */
  forget(qp: number): void {
    for (const r of this.#replay.get(qp) ?? []) this.#freeSlots.push(r.slot);
    this.#replay.delete(qp);
  }

  /** The register goes with the engine. */
  close(): void {
    for (const r of this.#register) binding.closeRegion(r.raw.id, r.raw.buffer);
    this.#register = [];
    this.#freeSlots = [];
    this.#replay.clear();
  }
}
