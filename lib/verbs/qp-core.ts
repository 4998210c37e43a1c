// The work requests a QP takes (struct ibv_send_wr, ibv_recv_wr, ibv_sge) and the attributes
// the library keeps of a QP (what ibv_modify_qp set, written to the device at each change).
import type { AddressHandle } from './ah.js';
import type { WrOpcode } from './constants.js';

/** One scatter/gather element (struct ibv_sge). */
export interface Sge {
  /** Start address of the buffer (virtual address inside a registered MR). */
  addr: bigint;
  /** Bytes of the buffer. */
  length: number;
  /** The lkey of the MR that holds the buffer. */
  lkey: number;
}

/** A send work request (struct ibv_send_wr), as `QueuePair.postSend` takes it. */
export interface SendWr {
  /** Id returned in the work completion (as a bigint). */
  wrId: bigint | number;
  /** The operation (ibv_wr_opcode). */
  opcode: WrOpcode;
  /** Local buffers (scatter/gather list), gathered in order. */
  sgList: Sge[];
  /** SendFlags bits (SIGNALED asks for a completion, INLINE, FENCE, SOLICITED). */
  sendFlags?: number;
  /** Immediate data of a *_WITH_IMM operation, delivered with the remote completion. */
  immData?: number;
  /** RDMA_WRITE(_WITH_IMM), RDMA_READ and ATOMIC_WRITE (the 8-byte word's address) */
  rdma?: {
    /** Remote virtual address (wr.rdma.remote_addr). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
  };
  /** UD SEND: where it goes (wr.ud): the address handle of the node, the QP there and its Q_Key. */
  ud?: {
    /** The destination's address handle (createAh), in the QP's PD. */
    ah: AddressHandle;
    /** The destination UD QP's number (remote_qpn). */
    remoteQpn: number;
    /** The Q_Key the destination QP holds (remote_qkey); a mismatch is dropped there. */
    remoteQkey: number;
  };
  /** XRC_SEND: the XRC SRQ at the target that the request is for (wr.qp_type.xrc.remote_srqn). */
  xrc?: {
    /** The XRC SRQ's number (its srqNum, ibv_get_srq_num), 24 bits. */
    remoteSrqn: number;
  };
  /** FLUSH: what to flush (ibv_wr_flush's arguments); the WR carries no local buffers. */
  flush?: {
    /** Remote address of the range (with FlushLevel.MR: any address inside the MR). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
    /** Bytes of the range (FlushLevel.RANGE). */
    length: number;
    /** FlushType bits: GLOBAL and/or PERSISTENT. */
    type: number;
    /** FlushLevel: RANGE or MR. */
    level: number;
  };
  /** ATOMIC_CMP_AND_SWP (compareAdd = compare, swap) and ATOMIC_FETCH_AND_ADD (compareAdd = add) */
  atomic?: {
    /** Remote virtual address of the 8-byte word (wr.atomic.remote_addr). */
    remoteAddr: bigint;
    /** The remote MR's rkey. */
    rkey: number;
    /** FETCH_AND_ADD: the value added; CMP_AND_SWP: the value compared with. */
    compareAdd: bigint;
    /** CMP_AND_SWP: the value written when the comparison matches. */
    swap?: bigint;
  };
}

/** A receive work request (struct ibv_recv_wr), as `QueuePair.postRecv` takes it. */
export interface RecvWr {
  /** Id returned in the work completion (as a bigint). */
  wrId: bigint | number;
  /** Buffers an incoming SEND is scattered into, in order. */
  sgList: Sge[];
}

export interface QpAttrs {
  qpAccessFlags: number;
  minRnrTimer: number;
  timeout: number;
  retryCnt: number;
  rnrRetry: number;
  destQpNum: number;
  destNode: number;
  /** The PSN the responder expects first (RTR) and the requester sends first (RTS). */
  rqPsn: number;
  sqPsn: number;
  /** UD: the QP's Q_Key (set at INIT). */
  qkey?: number;
}
