// SMMU record and command layouts, named as in the SMMUv3 spec (IHI0070), Linux
// arm-smmu-v3.h and QEMU smmuv3-internal.h. One place for the bit positions.

/** Event record IDs (EVT_ID_*). */
export enum EvtId {
  F_UUT = 0x01,
  C_BAD_STREAMID = 0x02,
  F_STE_FETCH = 0x03,
  C_BAD_STE = 0x04,
  F_BAD_ATS_TREQ = 0x05,
  F_STREAM_DISABLED = 0x06,
  F_TRANS_FORBIDDEN = 0x07,
  C_BAD_SUBSTREAMID = 0x08,
  F_CD_FETCH = 0x09,
  C_BAD_CD = 0x0a,
  F_WALK_EABT = 0x0b,
  F_TRANSLATION = 0x10,
  F_ADDR_SIZE = 0x11,
  F_ACCESS = 0x12,
  F_PERMISSION = 0x13,
  F_TLB_CONFLICT = 0x20,
  F_CFG_CONFLICT = 0x21,
  E_PAGE_REQ = 0x24,
}

/** EVTQ_1_CLASS: which stage of the walk faulted. */
export enum EvtClass {
  CD = 0,
  TT = 1,
  IN = 2,
}

/** A decoded event record (Linux struct arm_smmu_event). */
export interface SmmuEventRecord {
  id: EvtId;
  /** StreamID of the master (here: the protection domain's stream on this node). */
  sid: number;
  ssv: boolean;
  ssid: number;
  /** Stall tag, echoed by CMD_RESUME (stall model only). */
  stag: number;
  stall: boolean;
  /** Privileged (PnU) and instruction (InD) accesses: always false for DMA data. */
  pnu: boolean;
  ind: boolean;
  /** 1 = read (source side), 0 = write (destination side). */
  rnw: boolean;
  s2: boolean;
  class: EvtClass;
  /** Input (virtual) address of the faulting access. */
  addr: bigint;
}

/** CMD_RESUME RESP field (CMDQ_RESUME_0_RESP). */
export enum ResumeResp {
  TERM = 0,
  RETRY = 1,
  ABORT = 2,
}

export const CMD_RESUME = 0x44;
export const CMD_STALL_TERM = 0x45;

export interface CmdResume {
  opcode: typeof CMD_RESUME;
  sid: number;
  stag: number;
  resp: ResumeResp;
}
export interface CmdStallTerm {
  opcode: typeof CMD_STALL_TERM;
  sid: number;
}
export type SmmuCommand = CmdResume | CmdStallTerm;

const bit = (v: boolean, pos: bigint): bigint => (v ? 1n << pos : 0n);
const field = (v: bigint, pos: bigint, width: bigint): bigint => (v >> pos) & ((1n << width) - 1n);

/** Encode a record into its 32-byte in-memory form (4 × u64, Linux EVTQ_* positions). */
export function encodeEvent(e: SmmuEventRecord): BigUint64Array {
  const d = new BigUint64Array(4);
  d[0] = BigInt(e.id & 0xff) | bit(e.ssv, 11n) | (BigInt(e.ssid & 0xfffff) << 12n) | (BigInt(e.sid >>> 0) << 32n);
  d[1] =
    BigInt(e.stag & 0xffff) | bit(e.stall, 31n) | bit(e.pnu, 33n) | bit(e.ind, 34n) | bit(e.rnw, 35n) | bit(e.s2, 39n) | (BigInt(e.class & 3) << 40n);
  d[2] = BigInt.asUintN(64, e.addr);
  d[3] = 0n;
  return d;
}

/** Decode a 32-byte record (arm_smmu_decode_event). */
export function decodeEvent(d: BigUint64Array): SmmuEventRecord {
  const d0 = d[0]!;
  const d1 = d[1]!;
  return {
    id: Number(field(d0, 0n, 8n)) as EvtId,
    ssv: field(d0, 11n, 1n) === 1n,
    ssid: Number(field(d0, 12n, 20n)),
    sid: Number(field(d0, 32n, 32n)),
    stag: Number(field(d1, 0n, 16n)),
    stall: field(d1, 31n, 1n) === 1n,
    pnu: field(d1, 33n, 1n) === 1n,
    ind: field(d1, 34n, 1n) === 1n,
    rnw: field(d1, 35n, 1n) === 1n,
    s2: field(d1, 39n, 1n) === 1n,
    class: Number(field(d1, 40n, 2n)) as EvtClass,
    addr: d[2]!,
  };
}

/** Encode CMD_RESUME (2 × u64): SID [63:32], RESP [13:12], STAG in dword 1 [15:0]. */
export function encodeResume(c: CmdResume): BigUint64Array {
  const d = new BigUint64Array(2);
  d[0] = BigInt(CMD_RESUME) | (BigInt(c.resp & 3) << 12n) | (BigInt(c.sid >>> 0) << 32n);
  d[1] = BigInt(c.stag & 0xffff);
  return d;
}

export function eventName(id: EvtId): string {
  return EvtId[id] ?? `0x${id.toString(16)}`;
}
