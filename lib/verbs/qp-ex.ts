// Extended QPs (struct ibv_qp_ex) and the post API of rdma-core's ibv_wr_*: wrStart() opens a
// batch, each wr<Op>() call starts a WR (taking the QP's wrId and wrFlags as they are then),
// wrSetSge()/wrSetSgeList() give the current WR its buffers, and wrComplete() posts the batch
// through postSend(): the same checks, all or nothing. An operation the QP was not created
// for (sendOpsFlags) is refused at once.
import { mapRegion, PAGE_SIZE, type Region } from '../region.js';
import { checkObject, known } from '../validate.js';
import { Access, QpExSendOps, WrOpcode } from './constants.js';
import type { Device } from './device.js';
import { verbsError } from './errors.js';
import type { MemoryRegion, ProcessObjects, ProtectionDomain, VerbsProcess } from './mr.js';
import { QueuePair, type QpInitAttr } from './qp.js';
import type { SendWr, Sge } from './qp-core.js';

const QP_INIT_EX_KEYS = known<QpInitAttrEx>({
  sendOpsFlags: true,
  qpType: true,
  type: true,
  sendCq: true,
  recvCq: true,
  xrcd: true,
  cap: true,
  sqSigAll: true,
  srq: true,
  faultModel: true,
});

/** Attributes of a new extended QP (struct ibv_qp_init_attr_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS). */
export interface QpInitAttrEx extends QpInitAttr {
  /** QpExSendOps bits: the operations the wr* API may post on this QP. */
  sendOpsFlags: number;
}

const OFFERED =
  QpExSendOps.WITH_RDMA_WRITE |
  QpExSendOps.WITH_RDMA_WRITE_WITH_IMM |
  QpExSendOps.WITH_SEND |
  QpExSendOps.WITH_SEND_WITH_IMM |
  QpExSendOps.WITH_RDMA_READ |
  QpExSendOps.WITH_ATOMIC_CMP_AND_SWP |
  QpExSendOps.WITH_ATOMIC_FETCH_AND_ADD |
  QpExSendOps.WITH_FLUSH |
  QpExSendOps.WITH_ATOMIC_WRITE;

const OP_FLAG: Record<WrOpcode, number> = {
  [WrOpcode.RDMA_WRITE]: QpExSendOps.WITH_RDMA_WRITE,
  [WrOpcode.RDMA_WRITE_WITH_IMM]: QpExSendOps.WITH_RDMA_WRITE_WITH_IMM,
  [WrOpcode.SEND]: QpExSendOps.WITH_SEND,
  [WrOpcode.SEND_WITH_IMM]: QpExSendOps.WITH_SEND_WITH_IMM,
  [WrOpcode.RDMA_READ]: QpExSendOps.WITH_RDMA_READ,
  [WrOpcode.ATOMIC_CMP_AND_SWP]: QpExSendOps.WITH_ATOMIC_CMP_AND_SWP,
  [WrOpcode.ATOMIC_FETCH_AND_ADD]: QpExSendOps.WITH_ATOMIC_FETCH_AND_ADD,
  [WrOpcode.FLUSH]: QpExSendOps.WITH_FLUSH,
  [WrOpcode.ATOMIC_WRITE]: QpExSendOps.WITH_ATOMIC_WRITE,
};

const flagName = (bit: number) => Object.entries(QpExSendOps).find(([, v]) => v === bit)?.[0] ?? `0x${bit.toString(16)}`;

// Checked before the QP exists, so a refused init leaves nothing behind.
function checkInitEx(init: QpInitAttrEx): QpInitAttrEx {
  checkObject('createQpEx: init', init, QP_INIT_EX_KEYS);
  const f = init.sendOpsFlags;
  if (typeof f !== 'number' || !Number.isInteger(f) || f <= 0 || f > 0x1fff)
    throw verbsError('ibv_create_qp_ex', 'EINVAL', `sendOpsFlags must be a non-empty set of QpExSendOps bits, got ${String(f)}`);
  const refused = f & ~OFFERED;
  if (refused) {
    const names = [...Array(13).keys()]
      .map((i) => 1 << i)
      .filter((b) => refused & b)
      .map(flagName);
    throw verbsError('ibv_create_qp_ex', 'EOPNOTSUPP', `sendOpsFlags ${names.join(', ')} not offered (memory windows and TSO are not modelled)`);
  }
  return init;
}

/** An extended RC queue pair (struct ibv_qp_ex) with the ibv_wr_* post API; made by `Context.createQpEx`. `postSend()` works too. */
export class QueuePairEx extends QueuePair {
  /** QpExSendOps bits the QP was created with: the operations the wr* API may post. */
  readonly sendOpsFlags: number;
  #wqe: { region: Region; mr: MemoryRegion; next: number } | undefined;
  /** ibv_qp_ex.wr_id: the id the next wr<Op>() call gives its WR. */
  wrId: bigint | number = 0;
  /** ibv_qp_ex.wr_flags: the SendFlags the next wr<Op>() call gives its WR. */
  wrFlags = 0;
  #batch: SendWr[] | undefined;

  /** @internal use Context.createQpEx */
  constructor(context: VerbsProcess, device: Device, pd: ProtectionDomain, qpNum: number, init: QpInitAttrEx, objects: ProcessObjects) {
    super(context, device, pd, qpNum, checkInitEx(init), objects);
    this.sendOpsFlags = init.sendOpsFlags;
  }

  /** True between wrStart() and wrComplete() / wrAbort(). */
  get wrOpen(): boolean {
    return this.#batch !== undefined;
  }

  /** ibv_wr_start: open a batch of WRs (EINVAL if one is open already). */
  wrStart(): void {
    if (this.#batch) throw verbsError('ibv_wr_start', 'EINVAL', 'a batch is open already; wrComplete() or wrAbort() it first');
    this.#batch = [];
  }

  /** ibv_wr_rdma_write: an RDMA WRITE to `remoteAddr` under `rkey`. */
  wrRdmaWrite(rkey: number, remoteAddr: bigint): void {
    this.#add('ibv_wr_rdma_write', WrOpcode.RDMA_WRITE, { rdma: { remoteAddr, rkey } });
  }

  /** ibv_wr_rdma_write_imm: an RDMA WRITE with immediate data (it takes a receive at the responder). */
  wrRdmaWriteImm(rkey: number, remoteAddr: bigint, immData: number): void {
    this.#add('ibv_wr_rdma_write_imm', WrOpcode.RDMA_WRITE_WITH_IMM, { rdma: { remoteAddr, rkey }, immData });
  }

  /** ibv_wr_rdma_read: an RDMA READ of `remoteAddr` under `rkey` into the WR's SGEs. */
  wrRdmaRead(rkey: number, remoteAddr: bigint): void {
    this.#add('ibv_wr_rdma_read', WrOpcode.RDMA_READ, { rdma: { remoteAddr, rkey } });
  }

  /** ibv_wr_send: a SEND of the WR's SGEs. */
  wrSend(): void {
    this.#add('ibv_wr_send', WrOpcode.SEND, {});
  }

  /** ibv_wr_send_imm: a SEND with immediate data. */
  wrSendImm(immData: number): void {
    this.#add('ibv_wr_send_imm', WrOpcode.SEND_WITH_IMM, { immData });
  }

  /** ibv_wr_atomic_fetch_add: add `add` to the remote 8-byte word; the old value lands in the WR's 8-byte SGE. */
  wrAtomicFetchAdd(rkey: number, remoteAddr: bigint, add: bigint): void {
    this.#add('ibv_wr_atomic_fetch_add', WrOpcode.ATOMIC_FETCH_AND_ADD, { atomic: { remoteAddr, rkey, compareAdd: add } });
  }

  /** ibv_wr_atomic_cmp_swp: if the remote 8-byte word equals `compare`, write `swap`; the old value lands in the WR's 8-byte SGE. */
  wrAtomicCmpSwp(rkey: number, remoteAddr: bigint, compare: bigint, swap: bigint): void {
    this.#add('ibv_wr_atomic_cmp_swp', WrOpcode.ATOMIC_CMP_AND_SWP, { atomic: { remoteAddr, rkey, compareAdd: compare, swap } });
  }

  /**
   * ibv_wr_atomic_write: write the 8 bytes of `atomicWr` at `remoteAddr` (8-byte aligned) under
   * `rkey`, seen whole or not at all. As in libibverbs the bytes are the call's argument, copied
   * now (into the QP's own WQE buffer, which the engine reads them from as a NIC reads a WQE's
   * inline data); the WR takes no SGE.
   */
  wrAtomicWrite(rkey: number, remoteAddr: bigint, atomicWr: Uint8Array): void {
    if (!(atomicWr instanceof Uint8Array) || atomicWr.length !== 8)
      throw verbsError(
        'ibv_wr_atomic_write',
        'EINVAL',
        `atomicWr must be 8 bytes (a Uint8Array or Buffer), got ${atomicWr instanceof Uint8Array ? `${atomicWr.length} bytes` : typeof atomicWr}`,
      );
    this.#add('ibv_wr_atomic_write', WrOpcode.ATOMIC_WRITE, { rdma: { remoteAddr, rkey } });
    this.#current('ibv_wr_atomic_write').sgList = [this.#inline(atomicWr)];
  }

  // A slot of the QP's WQE buffer (one per send-queue entry, so one in flight is never
  // overwritten) holding `bytes`, registered in the QP's PD on first use, gone with the QP.
  #inline(bytes: Uint8Array): Sge {
    if (!this.#wqe) {
      const region = mapRegion(Math.ceil((8 * this.cap.maxSendWr) / PAGE_SIZE) * PAGE_SIZE);
      const mr = (this.context as unknown as { regMr: (...a: unknown[]) => MemoryRegion }).regMr(
        this.pd,
        region,
        0,
        region.size,
        Access.LOCAL_WRITE | Access.ON_DEMAND,
      );
      this.#wqe = { region, mr, next: 0 };
    }
    const w = this.#wqe;
    const off = 8 * (w.next++ % this.cap.maxSendWr);
    new Uint8Array(w.region.buffer, off, 8).set(bytes);
    return { addr: w.region.address + BigInt(off), length: 8, lkey: w.mr.lkey };
  }

  override destroy(): void {
    super.destroy();
    const w = this.#wqe;
    this.#wqe = undefined;
    if (w) {
      w.mr.dereg();
      w.region.close();
    }
  }

  /** ibv_wr_flush: make `length` bytes at `remoteAddr` (FlushLevel.RANGE) or the whole MR (FlushLevel.MR) visible at placement `type` (FlushType); no local buffers. */
  wrFlush(rkey: number, remoteAddr: bigint, length: number, type: number, level: number): void {
    this.#add('ibv_wr_flush', WrOpcode.FLUSH, { flush: { remoteAddr, rkey, length, type, level } });
  }

  /** ibv_wr_set_sge: the current WR's one buffer. */
  wrSetSge(lkey: number, addr: bigint, length: number): void {
    this.#current('ibv_wr_set_sge').sgList = [{ lkey, addr, length }];
  }

  /** ibv_wr_set_sge_list: the current WR's buffers, gathered in order. */
  wrSetSgeList(sgList: Sge[]): void {
    const wr = this.#current('ibv_wr_set_sge_list');
    if (!Array.isArray(sgList)) throw verbsError('ibv_wr_set_sge_list', 'EINVAL', 'sgList must be an array of { addr, length, lkey }');
    wr.sgList = sgList.map((s) => ({ ...s }));
  }

  /**
   * ibv_wr_complete: post the batch (checked as postSend checks, nothing posted unless every
   * WR passes; the error names the bad WR). The batch is closed either way.
   */
  wrComplete(): void {
    const batch = this.#batch;
    if (!batch) throw verbsError('ibv_wr_complete', 'EINVAL', 'no batch is open; call wrStart() first');
    this.#batch = undefined;
    if (batch.length) this.postSend(batch);
  }

  /** ibv_wr_abort: drop the open batch; nothing of it is posted. */
  wrAbort(): void {
    this.#batch = undefined;
  }

  #add(verb: string, opcode: WrOpcode, fields: Partial<SendWr>): void {
    if (!this.#batch) throw verbsError(verb, 'EINVAL', 'no batch is open; call wrStart() first');
    if (!(this.sendOpsFlags & OP_FLAG[opcode]))
      throw verbsError(verb, 'EOPNOTSUPP', `the QP was created without QpExSendOps.${flagName(OP_FLAG[opcode])} in sendOpsFlags`);
    this.#batch.push({ wrId: this.wrId, opcode, sgList: [], sendFlags: this.wrFlags, ...fields });
  }

  #current(verb: string): SendWr {
    const wr = this.#batch?.at(-1);
    if (!wr) throw verbsError(verb, 'EINVAL', 'no WR to set: call wrStart() and an operation (wrSend(), wrRdmaWrite(), …) first');
    return wr;
  }
}
