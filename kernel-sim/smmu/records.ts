// SMMU record and command layouts, named as in the SMMUv3 spec (IHI0070), Linux
// arm-smmu-v3.h and QEMU smmuv3-internal.h. One place for the bit positions.

/** Event record IDs (EVT_ID_*). */
export enum EvtId {
  /** Unsupported upstream transaction. */
  F_UUT = 0x01,
  /** StreamID out of range. */
  C_BAD_STREAMID = 0x02,
  /** Fetching the stream table entry failed. */
  F_STE_FETCH = 0x03,
  /** The stream table entry is invalid. */
  C_BAD_STE = 0x04,
  /** A bad ATS translation request. */
  F_BAD_ATS_TREQ = 0x05,
  /** The stream is disabled. */
  F_STREAM_DISABLED = 0x06,
  /** Translation is forbidden for this stream (bypass disallowed). */
  F_TRANS_FORBIDDEN = 0x07,
  /** SubstreamID out of range. */
  C_BAD_SUBSTREAMID = 0x08,
  /** Fetching the context descriptor failed. */
  F_CD_FETCH = 0x09,
  /** The context descriptor is invalid. */
  C_BAD_CD = 0x0a,
  /** An external abort during the page table walk. */
  F_WALK_EABT = 0x0b,
  /** Translation fault: no valid translation (a page that is not resident). */
  F_TRANSLATION = 0x10,
  /** Address size fault: the address is outside the translatable range (here: in no mapped region). */
  F_ADDR_SIZE = 0x11,
  /** Access flag fault. */
  F_ACCESS = 0x12,
  /** Permission fault: the access is not allowed by the mapping. */
  F_PERMISSION = 0x13,
  /** TLB conflict. */
  F_TLB_CONFLICT = 0x20,
  /** Configuration cache conflict. */
  F_CFG_CONFLICT = 0x21,
  /** A PRI page request (PCIe). */
  E_PAGE_REQ = 0x24,
}

/** EVTQ_1_CLASS: which stage of the walk faulted. */
export enum EvtClass {
  /** The fault happened fetching the context descriptor. */
  CD = 0,
  /** The fault happened fetching translation tables. */
  TT = 1,
  /** The fault happened on the input address (the access itself). */
  IN = 2,
}

/** A decoded event record (Linux struct arm_smmu_event). */
export interface SmmuEventRecord {
  /** Event id (F_TRANSLATION…). */
  id: EvtId;
  /** StreamID of the master (here: the protection domain's stream on this node). */
  sid: number;
  /** SubstreamID valid. */
  ssv: boolean;
  /** SubstreamID (PASID) of the access. */
  ssid: number;
  /** Stall tag, echoed by CMD_RESUME (stall model only). */
  stag: number;
  /** The access is stalled and waits for CMD_RESUME. */
  stall: boolean;
  /** Privileged (PnU) and instruction (InD) accesses: always false for DMA data. */
  pnu: boolean;
  /** Instruction access. */
  ind: boolean;
  /** 1 = read (source side), 0 = write (destination side). */
  rnw: boolean;
  /** The fault happened at stage 2. */
  s2: boolean;
  /** What was being accessed when the fault happened. */
  class: EvtClass;
  /** Input (virtual) address of the faulting access. */
  addr: bigint;
}

/** CMD_RESUME RESP field (CMDQ_RESUME_0_RESP). */
export enum ResumeResp {
  /** Terminate the access: the device gets an abort. */
  TERM = 0,
  /** Retry the access: the translation is there now. */
  RETRY = 1,
  /** Abort the access: the transaction completes with an error. */
  ABORT = 2,
}

/** SMMUv3 command opcode CMD_RESUME: answer one stalled access. */
export const CMD_RESUME = 0x44;
/** SMMUv3 command opcode CMD_STALL_TERM: terminate every stalled access of a stream. */
export const CMD_STALL_TERM = 0x45;

/** CMD_RESUME: resume one stalled access. */
export interface CmdResume {
  /** Command opcode. */
  opcode: typeof CMD_RESUME;
  /** StreamID of the stalled access. */
  sid: number;
  /** The stall tag from the event record. */
  stag: number;
  /** How to resume. */
  resp: ResumeResp;
}
/** CMD_STALL_TERM: terminate every stalled access of a stream. */
export interface CmdStallTerm {
  /** Command opcode. */
  opcode: typeof CMD_STALL_TERM;
  /** StreamID. */
  sid: number;
}
/** A command the driver sends the SMMU. */
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

/** The event's name, e.g. 'F_TRANSLATION'. */
export function eventName(id: EvtId): string {
  return EvtId[id] ?? `0x${id.toString(16)}`;
}
