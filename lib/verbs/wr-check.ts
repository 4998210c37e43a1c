// Post-time checks of work requests, as ibv_post_send / ibv_post_recv make them: every field,
// before anything is queued. The error is EINVAL with `field` (the WR field at fault, e.g.
// 'wrId' or 'sgList[1].lkey') and `badWr` (its index in the posted list), as the bad_wr
// pointer says in libibverbs.
import { AddressHandle } from './ah.js';
import { QpType, WrOpcode } from './constants.js';
import { verbsError } from './errors.js';
import type { RecvWr, SendWr } from './qp-core.js';

const U64 = 2n ** 64n;
const OPCODES = new Set<unknown>(Object.values(WrOpcode).filter((v) => typeof v === 'number'));
const KNOWN_SEND_FLAGS = 0xf;

function bad(verb: string, index: number, field: string, message: string): Error {
  const e = verbsError(verb, 'EINVAL', `wr[${index}].${field} ${message}`) as Error & { field: string; badWr: number };
  e.field = field;
  e.badWr = index;
  return e;
}

const isU32 = (v: unknown) => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= 0xffff_ffff;
const isU64 = (v: unknown) => typeof v === 'bigint' && v >= 0n && v < U64;

function checkWrId(verb: string, i: number, wrId: unknown): void {
  const ok = (typeof wrId === 'number' && Number.isSafeInteger(wrId) && wrId >= 0) || isU64(wrId);
  if (!ok)
    throw bad(verb, i, 'wrId', `must be an integer in 0..2^64-1 (a number or a bigint), got ${typeof wrId === 'bigint' ? `${wrId}n` : String(wrId)}`);
}

function checkSgList(verb: string, i: number, sgList: unknown, maxSge: number): void {
  if (!Array.isArray(sgList)) throw bad(verb, i, 'sgList', 'must be an array of SGEs');
  if (sgList.length > maxSge) throw bad(verb, i, 'sgList', `holds ${sgList.length} SGEs; the QP allows at most ${maxSge} (cap.max*Sge)`);
  sgList.forEach((sge: unknown, k) => {
    const s = sge as { addr?: unknown; length?: unknown; lkey?: unknown } | null;
    if (s === null || typeof s !== 'object') throw bad(verb, i, `sgList[${k}]`, 'must be { addr: bigint, length, lkey }');
    if (!isU64(s.addr)) throw bad(verb, i, `sgList[${k}].addr`, 'must be a bigint in 0..2^64-1');
    if (typeof s.length !== 'number' || !Number.isInteger(s.length) || s.length < 0 || s.length > 2 ** 32 - 1)
      throw bad(verb, i, `sgList[${k}].length`, `must be an integer in 0..2^32-1, got ${String(s.length)}`);
    if (!isU32(s.lkey)) throw bad(verb, i, `sgList[${k}].lkey`, `must be a 32-bit unsigned integer, got ${String(s.lkey)}`);
  });
}

export function checkSendWr(wr: SendWr, i: number, maxSge: number): void {
  const v = 'ibv_post_send';
  if (wr === null || typeof wr !== 'object') throw bad(v, i, 'wr', 'must be an object');
  checkWrId(v, i, wr.wrId);
  if (!OPCODES.has(wr.opcode)) throw bad(v, i, 'opcode', `must be a WrOpcode member, got ${String(wr.opcode)}`);
  checkSgList(v, i, wr.sgList, maxSge);
  if (wr.sendFlags !== undefined && (!isU32(wr.sendFlags) || (wr.sendFlags & ~KNOWN_SEND_FLAGS) !== 0))
    throw bad(v, i, 'sendFlags', `must be SendFlags bits, got ${String(wr.sendFlags)}`);
  if (wr.immData !== undefined && !isU32(wr.immData)) throw bad(v, i, 'immData', `must be a 32-bit unsigned integer, got ${String(wr.immData)}`);
  const rdma =
    wr.opcode === WrOpcode.RDMA_WRITE ||
    wr.opcode === WrOpcode.RDMA_WRITE_WITH_IMM ||
    wr.opcode === WrOpcode.RDMA_READ ||
    wr.opcode === WrOpcode.ATOMIC_WRITE;
  const atomic = wr.opcode === WrOpcode.ATOMIC_CMP_AND_SWP || wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD;
  if (rdma) {
    if (!wr.rdma || typeof wr.rdma !== 'object') throw bad(v, i, 'rdma', 'RDMA operations need wr.rdma = { remoteAddr, rkey }');
    if (!isU64(wr.rdma.remoteAddr)) throw bad(v, i, 'rdma.remoteAddr', 'must be a bigint in 0..2^64-1');
    if (!isU32(wr.rdma.rkey)) throw bad(v, i, 'rdma.rkey', `must be a 32-bit unsigned integer, got ${String(wr.rdma.rkey)}`);
  }
  if (atomic) {
    const a = wr.atomic;
    if (!a || typeof a !== 'object') throw bad(v, i, 'atomic', 'atomics need wr.atomic = { remoteAddr, rkey, compareAdd, swap? }');
    if (!isU64(a.remoteAddr)) throw bad(v, i, 'atomic.remoteAddr', 'must be a bigint in 0..2^64-1');
    if (!isU32(a.rkey)) throw bad(v, i, 'atomic.rkey', `must be a 32-bit unsigned integer, got ${String(a.rkey)}`);
    if (typeof a.compareAdd !== 'bigint') throw bad(v, i, 'atomic.compareAdd', 'must be a bigint');
    if (a.swap !== undefined && typeof a.swap !== 'bigint') throw bad(v, i, 'atomic.swap', 'must be a bigint');
  }
  if (wr.opcode === WrOpcode.FLUSH) {
    const f = wr.flush;
    if (!f || typeof f !== 'object') throw bad(v, i, 'flush', 'FLUSH needs wr.flush = { remoteAddr, rkey, length, type, level }');
    if (!isU64(f.remoteAddr)) throw bad(v, i, 'flush.remoteAddr', 'must be a bigint in 0..2^64-1');
    if (!isU32(f.rkey)) throw bad(v, i, 'flush.rkey', `must be a 32-bit unsigned integer, got ${String(f.rkey)}`);
    if (!isU32(f.length) || f.length > 2 ** 31) throw bad(v, i, 'flush.length', `must be an integer in 0..2^31, got ${String(f.length)}`);
    if (f.type !== 1 && f.type !== 2 && f.type !== 3)
      throw bad(v, i, 'flush.type', `must be FlushType bits (GLOBAL 1, PERSISTENT 2), got ${String(f.type)}`);
    if (f.level !== 0 && f.level !== 1) throw bad(v, i, 'flush.level', `must be FlushLevel.RANGE (0) or MR (1), got ${String(f.level)}`);
    if (wr.sgList.length) throw bad(v, i, 'sgList', 'must be empty: a FLUSH carries no local buffers');
  }
}

/**
 * What the QP's transport allows of a WR beyond its fields: UD sends SENDs only, to an AH of
 * its PD; an XRC send QP's every WR names the XRC SRQ at the target.
 */
export function checkTransportWr(wr: SendWr, i: number, qp: { qpType: QpType; pd: object }): void {
  const v = 'ibv_post_send';
  const xrc = qp.qpType === QpType.XRC_SEND;
  if (xrc && (!wr.xrc || typeof wr.xrc !== 'object'))
    throw bad(v, i, 'xrc.remoteSrqn', 'an XRC WR must name the XRC SRQ at the target: wr.xrc = { remoteSrqn }');
  if (xrc && (!Number.isInteger(wr.xrc!.remoteSrqn) || wr.xrc!.remoteSrqn < 0 || wr.xrc!.remoteSrqn > 0xff_ffff))
    throw bad(v, i, 'xrc.remoteSrqn', `must be a 24-bit SRQ number, got ${String(wr.xrc!.remoteSrqn)}`);
  if (!xrc && wr.xrc !== undefined) throw bad(v, i, 'xrc', 'is for XRC_SEND QPs');
  if (qp.qpType !== QpType.UD) {
    if (wr.ud !== undefined) throw bad(v, i, 'ud', 'is for UD QPs; an RC QP sends to the QP it is connected to');
    return;
  }
  if (wr.opcode !== WrOpcode.SEND && wr.opcode !== WrOpcode.SEND_WITH_IMM)
    throw bad(v, i, 'opcode', `${WrOpcode[wr.opcode]} on a UD QP: UD sends SEND and SEND_WITH_IMM only`);
  const u = wr.ud;
  if (!u || typeof u !== 'object') throw bad(v, i, 'ud', 'a UD SEND needs wr.ud = { ah, remoteQpn, remoteQkey }');
  if (!(u.ah instanceof AddressHandle)) throw bad(v, i, 'ud.ah', 'must be an AddressHandle from createAh()');
  if (u.ah.destroyed) throw bad(v, i, 'ud.ah', 'was destroyed');
  if (u.ah.pd !== qp.pd) throw bad(v, i, 'ud.ah', "belongs to another protection domain than the QP's");
  if (!Number.isInteger(u.remoteQpn) || u.remoteQpn < 0 || u.remoteQpn > 0xff_ffff)
    throw bad(v, i, 'ud.remoteQpn', `must be a 24-bit QP number, got ${String(u.remoteQpn)}`);
  if (!isU32(u.remoteQkey)) throw bad(v, i, 'ud.remoteQkey', `must be a 32-bit unsigned integer, got ${String(u.remoteQkey)}`);
}

export function checkRecvWr(wr: RecvWr, i: number, maxSge: number): void {
  const v = 'ibv_post_recv';
  if (wr === null || typeof wr !== 'object') throw bad(v, i, 'wr', 'must be an object');
  checkWrId(v, i, wr.wrId);
  checkSgList(v, i, wr.sgList, maxSge);
}
