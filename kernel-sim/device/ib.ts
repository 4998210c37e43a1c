// The IB enums the device speaks: libibverbs names and values (verbs.h), so code and logs read
// like rdma-core. They live with the device (kernel-sim) because its ABI, its engine and its
// state machine carry them; lib/verbs re-exports them as its public constants, as libibverbs'
// verbs.h restates the kernel's ib_user_verbs.h.

/** enum ibv_access_flags */
export const Access = {
  /** The local side may write the MR (receives, RDMA READ results, atomics' results); required with REMOTE_WRITE or REMOTE_ATOMIC. */
  LOCAL_WRITE: 1,
  /** A peer may RDMA WRITE into the MR. */
  REMOTE_WRITE: 2,
  /** A peer may RDMA READ from the MR. */
  REMOTE_READ: 4,
  /** A peer may run atomic operations on the MR. */
  REMOTE_ATOMIC: 8,
  /** Memory windows may be bound to the MR. */
  MW_BIND: 16,
  /** Remote addresses are offsets from the MR's start instead of virtual addresses. */
  ZERO_BASED: 32,
  /** On-demand paging: the MR is not pinned; pages fault in when the engine touches them. */
  ON_DEMAND: 64,
  /** The MR is backed by huge pages. */
  HUGETLB: 128,
  /** A peer may RDMA FLUSH the MR for global visibility (IBV_ACCESS_FLUSH_GLOBAL); on a QP, it accepts such FLUSHes. */
  FLUSH_GLOBAL: 256,
  /** A peer may RDMA FLUSH the MR to persistence (needs persistent memory: refused by regMr here). */
  FLUSH_PERSISTENT: 512,
} as const;
// rdma-core's enum ibv_access_flags up to FLUSH_PERSISTENT (the FLUSH bits since v45); any
// other bit is refused (EINVAL), not ignored.
const ACCESS_ALL = 0x3ff;
/** True if `flags` is a non-negative integer made of Access bits only. */
export function knownAccess(flags: number): boolean {
  return Number.isInteger(flags) && flags >= 0 && (flags & ~ACCESS_ALL) === 0;
}

/** enum ibv_wc_status, in libibverbs order. */
export enum WcStatus {
  /** The operation completed successfully. */
  SUCCESS = 0,
  /** Local length error: a receive buffer was too small for the incoming message, or a send was longer than allowed. */
  LOC_LEN_ERR,
  /** Local QP operation error: an internal QP consistency error while processing the work request. */
  LOC_QP_OP_ERR,
  /** Local EE context operation error (RD only; never raised here). */
  LOC_EEC_OP_ERR,
  /** Local protection error: a local buffer is not inside an MR valid for the operation (wrong lkey, PD, bounds). */
  LOC_PROT_ERR,
  /** Work request flushed: the QP went to the error state while the request was outstanding. */
  WR_FLUSH_ERR,
  /** Memory window bind error. */
  MW_BIND_ERR,
  /** Bad response error: the responder returned an unexpected transport opcode. */
  BAD_RESP_ERR,
  /** Local access error: a protection error on a local buffer while it was written (RDMA READ response, receive with immediate). */
  LOC_ACCESS_ERR,
  /** Remote invalid request: the responder found the request invalid (operation it does not support, no room for a SEND, length too large). */
  REM_INV_REQ_ERR,
  /** Remote access error: a protection error on the remote buffer (rkey, bounds, access flags or PD). */
  REM_ACCESS_ERR,
  /** Remote operation error: the responder could not complete the operation (here also a destination fault it could not resolve). */
  REM_OP_ERR,
  /** Transport retry counter exceeded: no ACK or NAK came back within timeout, retry_cnt times. */
  RETRY_EXC_ERR,
  /** RNR retry counter exceeded: the responder had no receive posted, rnr_retry times. */
  RNR_RETRY_EXC_ERR,
  /** Local RDD violation (RD only; never raised here). */
  LOC_RDD_VIOL_ERR,
  /** Remote invalid RD request (RD only; never raised here). */
  REM_INV_RD_REQ_ERR,
  /** Remote aborted: the responder aborted the operation. */
  REM_ABORT_ERR,
  /** Invalid EE context number (RD only; never raised here). */
  INV_EECN_ERR,
  /** Invalid EE context state (RD only; never raised here). */
  INV_EEC_STATE_ERR,
  /** Fatal error of the device. */
  FATAL_ERR,
  /** Response timeout. */
  RESP_TIMEOUT_ERR,
  /** Any other error. */
  GENERAL_ERR,
  /** Tag matching error (tag matching is not modelled). */
  TM_ERR,
  /** Tag matching rendezvous incomplete (tag matching is not modelled). */
  TM_RNDV_INCOMPLETE,
}

const WC_STATUS_STR = [
  'success',
  'local length error',
  'local QP operation error',
  'local EE context operation error',
  'local protection error',
  'Work Request Flushed Error',
  'memory management operation error',
  'bad response error',
  'local access error',
  'remote invalid request error',
  'remote access error',
  'remote operation error',
  'transport retry counter exceeded',
  'RNR retry counter exceeded',
  'local RDD violation error',
  'remote invalid RD request',
  'aborted error',
  'invalid EE context number',
  'invalid EE context state',
  'fatal error',
  'response timeout error',
  'general error',
  'TM error',
  'TM software rendezvous',
];

/** ibv_wc_status_str() */
export function wcStatusStr(status: WcStatus): string {
  return WC_STATUS_STR[status] ?? 'unknown';
}

/** enum ibv_wr_opcode */
export enum WrOpcode {
  /** Write the local buffers into remote memory; no completion at the responder. */
  RDMA_WRITE = 0,
  /** RDMA WRITE that also consumes a receive at the responder and delivers immediate data. */
  RDMA_WRITE_WITH_IMM = 1,
  /** Send the local buffers into the responder's next posted receive. */
  SEND = 2,
  /** SEND with immediate data delivered in the receive completion. */
  SEND_WITH_IMM = 3,
  /** Read remote memory into the local buffers. */
  RDMA_READ = 4,
  /** Compare the remote 8-byte word with compareAdd and, if equal, write swap; the old value comes back. */
  ATOMIC_CMP_AND_SWP = 5,
  /** Add compareAdd to the remote 8-byte word; the old value comes back. */
  ATOMIC_FETCH_AND_ADD = 6,
  /** Make remote memory globally visible (or persistent): wr.flush names the range, placement type and selectivity. */
  FLUSH = 14,
  /** Write the 8 bytes of the one local SGE to the 8-byte aligned remote word (wr.rdma), atomically visible. */
  ATOMIC_WRITE = 15,
}

/** enum ibv_placement_type: what an RDMA FLUSH makes of the bytes (bits). */
export const FlushType = {
  /** Visible to every observer of the responder's memory (IBV_FLUSH_GLOBAL). */
  GLOBAL: 1,
  /** Persistent across power loss (IBV_FLUSH_PERSISTENT). */
  PERSISTENT: 2,
} as const;

/** enum ibv_selectivity_level: what an RDMA FLUSH covers. */
export const FlushLevel = {
  /** The range [remoteAddr, remoteAddr+length) (IBV_FLUSH_RANGE). */
  RANGE: 0,
  /** The whole MR the rkey names (IBV_FLUSH_MR); remoteAddr must still lie inside it. */
  MR: 1,
} as const;

/** enum ibv_wc_opcode */
export enum WcOpcode {
  /** A SEND (with or without immediate) completed at the requester. */
  SEND = 0,
  /** An RDMA WRITE completed at the requester. */
  RDMA_WRITE = 1,
  /** An RDMA READ completed at the requester. */
  RDMA_READ = 2,
  /** A compare-and-swap completed at the requester. */
  COMP_SWAP = 3,
  /** A fetch-and-add completed at the requester. */
  FETCH_ADD = 4,
  /** An RDMA FLUSH completed at the requester. */
  FLUSH = 8,
  /** An ATOMIC WRITE completed at the requester. */
  ATOMIC_WRITE = 9,
  /** A receive completed: a SEND arrived. */
  RECV = 1 << 7,
  /** A receive consumed by an RDMA WRITE with immediate. */
  RECV_RDMA_WITH_IMM = (1 << 7) + 1,
}

/** enum ibv_send_flags */
export const SendFlags = {
  /** Wait for earlier RDMA READs and atomics to complete before this request starts. */
  FENCE: 1,
  /** Generate a work completion for this request (unless the QP signals all). */
  SIGNALED: 2,
  /** Set the solicited event indicator at the responder. */
  SOLICITED: 4,
  /** Copy the payload at post time: the buffers may be reused at once and need no lkey. */
  INLINE: 8,
} as const;

/** enum ibv_wc_flags */
export const WcFlags = {
  /** A GRH is present (UD only; never set here). */
  GRH: 1,
  /** The completion carries immediate data (immData). */
  WITH_IMM: 2,
} as const;

/** enum ibv_qp_state */
export enum QpState {
  /** Just created, or reset: nothing is processed. */
  RESET = 0,
  /** Initialised: receives may be posted, nothing is processed yet. */
  INIT,
  /** Ready to receive: the QP answers incoming requests. */
  RTR,
  /** Ready to send: the QP sends and answers. */
  RTS,
  /** Send queue drained: new sends are held. */
  SQD,
  /** Send queue error: a send failed; receives still work. */
  SQE,
  /** Error: outstanding and new work requests complete with WR_FLUSH_ERR. */
  ERR,
}

/** enum ibv_qp_type (RC, UD and XRC here; no UC) */
export enum QpType {
  /** Reliable connected: ordered, acknowledged, with RDMA and atomics. */
  RC = 2,
  /** Unreliable datagram: SENDs of up to the MTU to any UD QP, addressed by an AH, unacknowledged. */
  UD = 4,
  /** XRC send (initiator) QP: RC to one XRC target QP, each request naming an XRC SRQ there. */
  XRC_SEND = 9,
  /** XRC receive (target) QP: in an XRC domain, no receive queue of its own; requests take receives from the XRC SRQ they name. */
  XRC_RECV = 10,
}

/** The path MTU of UD messages (the port's active MTU, IBV_MTU_4096): a longer SEND completes LOC_LEN_ERR. */
export const UD_MTU = 4096;

/** enum ib_uverbs_advise_mr_advice and flags */
export enum AdviseMrAdvice {
  /** Make the range resident for reading (ibv_advise_mr IBV_ADVISE_MR_ADVICE_PREFETCH). */
  PREFETCH = 0,
  /** Make the range resident and writable. */
  PREFETCH_WRITE = 1,
  /** Map only the pages already resident; fault none in. */
  PREFETCH_NO_FAULT = 2,
}
/** Flags of ibv_advise_mr. */
export const AdviseMrFlags = {
  /** Synchronous: return only when the advice has been carried out. */
  FLUSH: 1,
} as const;

/** enum ibv_odp_general_caps */
export const OdpGeneralCaps = {
  /** On-demand paging is supported. */
  SUPPORT: 1,
  /** Implicit ODP (an MR over the whole address space) is supported. */
  SUPPORT_IMPLICIT: 2,
} as const;
/** enum ibv_odp_transport_cap_bits: the operations ODP works for on a transport. */
export const OdpTransportCaps = {
  /** SEND from ODP memory. */
  SEND: 1,
  /** Receives into ODP memory. */
  RECV: 2,
  /** RDMA WRITE to and from ODP memory. */
  WRITE: 4,
  /** RDMA READ from and into ODP memory. */
  READ: 8,
  /** Atomics on ODP memory. */
  ATOMIC: 16,
  /** Shared-receive-queue receives into ODP memory. */
  SRQ_RECV: 32,
  /** RDMA FLUSH of ODP memory. */
  FLUSH: 64,
  /** ATOMIC WRITE to and from ODP memory. */
  ATOMIC_WRITE: 128,
} as const;

/** enum ibv_event_type (the ones this model raises come first in libibverbs too). */
export enum AsyncEventType {
  /** A CQ overran: it cannot be used any more. */
  CQ_ERR = 0,
  /** A QP hit an error that is not tied to one work request; it went to the error state. */
  QP_FATAL,
  /** A QP's responder received an invalid request; it went to the error state. */
  QP_REQ_ERR,
  /** A QP's responder hit a protection error on an incoming request; it went to the error state. */
  QP_ACCESS_ERR,
  /** A QP in RTR received its first packet: communication is established. */
  COMM_EST,
  /** A QP in SQD has no outstanding send requests left. */
  SQ_DRAINED,
  /** Path migration completed (never raised here). */
  PATH_MIG,
  /** Path migration failed (never raised here). */
  PATH_MIG_ERR,
  /** The device failed; every resource of the context is unusable. */
  DEVICE_FATAL,
  /** A port became active (never raised here). */
  PORT_ACTIVE,
  /** A port went down (never raised here). */
  PORT_ERR,
  /** A port's LID changed (never raised here). */
  LID_CHANGE,
  /** A port's P_Key table changed (never raised here). */
  PKEY_CHANGE,
  /** The subnet manager changed (never raised here). */
  SM_CHANGE,
  /** An SRQ hit an error (never raised here). */
  SRQ_ERR,
  /** An SRQ's WQE count fell below its armed srq_limit (the limit is disarmed). */
  SRQ_LIMIT_REACHED,
}

/** enum ibv_qp_attr_mask: which fields of struct ibv_qp_attr a call names (ibv_query_qp's attr_mask). */
export const QpAttrMask = {
  /** qp_state */
  STATE: 1 << 0,
  /** cur_qp_state */
  CUR_STATE: 1 << 1,
  /** en_sqd_async_notify; ibv_query_qp reports sq_draining (sqDraining) under it here */
  EN_SQD_ASYNC_NOTIFY: 1 << 2,
  /** qp_access_flags */
  ACCESS_FLAGS: 1 << 3,
  /** pkey_index (always 0: one partition) */
  PKEY_INDEX: 1 << 4,
  /** port_num */
  PORT: 1 << 5,
  /** qkey (UD only) */
  QKEY: 1 << 6,
  /** ah_attr: the address vector (destNode here) */
  AV: 1 << 7,
  /** path_mtu */
  PATH_MTU: 1 << 8,
  /** timeout */
  TIMEOUT: 1 << 9,
  /** retry_cnt */
  RETRY_CNT: 1 << 10,
  /** rnr_retry */
  RNR_RETRY: 1 << 11,
  /** rq_psn */
  RQ_PSN: 1 << 12,
  /** max_rd_atomic */
  MAX_QP_RD_ATOMIC: 1 << 13,
  /** alt_ah_attr (no alternate path here) */
  ALT_PATH: 1 << 14,
  /** min_rnr_timer */
  MIN_RNR_TIMER: 1 << 15,
  /** sq_psn */
  SQ_PSN: 1 << 16,
  /** max_dest_rd_atomic */
  MAX_DEST_RD_ATOMIC: 1 << 17,
  /** path_mig_state (no path migration here) */
  PATH_MIG_STATE: 1 << 18,
  /** cap */
  CAP: 1 << 19,
  /** dest_qp_num */
  DEST_QPN: 1 << 20,
} as const;

/** enum ibv_mtu: a QP's path MTU as its code (ibv_modify_qp's path_mtu). */
export enum MtuType {
  /** 256 bytes */
  MTU_256 = 1,
  /** 512 bytes */
  MTU_512 = 2,
  /** 1024 bytes */
  MTU_1024 = 3,
  /** 2048 bytes */
  MTU_2048 = 4,
  /** 4096 bytes */
  MTU_4096 = 5,
}
