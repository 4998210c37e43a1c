// libibverbs names and values (verbs.h), so code and logs read like rdma-core.

/** enum ibv_access_flags */
export const Access = {
  LOCAL_WRITE: 1,
  REMOTE_WRITE: 2,
  REMOTE_READ: 4,
  REMOTE_ATOMIC: 8,
  MW_BIND: 16,
  ZERO_BASED: 32,
  ON_DEMAND: 64,
  HUGETLB: 128,
} as const;
const ACCESS_ALL = 0xff;
export function knownAccess(flags: number): boolean {
  return Number.isInteger(flags) && flags >= 0 && (flags & ~ACCESS_ALL) === 0;
}

/** enum ibv_wc_status, in libibverbs order. */
export enum WcStatus {
  SUCCESS = 0,
  LOC_LEN_ERR,
  LOC_QP_OP_ERR,
  LOC_EEC_OP_ERR,
  LOC_PROT_ERR,
  WR_FLUSH_ERR,
  MW_BIND_ERR,
  BAD_RESP_ERR,
  LOC_ACCESS_ERR,
  REM_INV_REQ_ERR,
  REM_ACCESS_ERR,
  REM_OP_ERR,
  RETRY_EXC_ERR,
  RNR_RETRY_EXC_ERR,
  LOC_RDD_VIOL_ERR,
  REM_INV_RD_REQ_ERR,
  REM_ABORT_ERR,
  INV_EECN_ERR,
  INV_EEC_STATE_ERR,
  FATAL_ERR,
  RESP_TIMEOUT_ERR,
  GENERAL_ERR,
  TM_ERR,
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
  RDMA_WRITE = 0,
  RDMA_WRITE_WITH_IMM = 1,
  SEND = 2,
  SEND_WITH_IMM = 3,
  RDMA_READ = 4,
  ATOMIC_CMP_AND_SWP = 5,
  ATOMIC_FETCH_AND_ADD = 6,
}

/** enum ibv_wc_opcode */
export enum WcOpcode {
  SEND = 0,
  RDMA_WRITE = 1,
  RDMA_READ = 2,
  COMP_SWAP = 3,
  FETCH_ADD = 4,
  RECV = 1 << 7,
  RECV_RDMA_WITH_IMM = (1 << 7) + 1,
}

/** enum ibv_send_flags */
export const SendFlags = { FENCE: 1, SIGNALED: 2, SOLICITED: 4, INLINE: 8 } as const;

/** enum ibv_wc_flags */
export const WcFlags = { GRH: 1, WITH_IMM: 2 } as const;

/** enum ibv_qp_state */
export enum QpState {
  RESET = 0,
  INIT,
  RTR,
  RTS,
  SQD,
  SQE,
  ERR,
}

/** enum ibv_qp_type (RC only here) */
export enum QpType {
  RC = 2,
}

/** enum ib_uverbs_advise_mr_advice and flags */
export enum AdviseMrAdvice {
  PREFETCH = 0,
  PREFETCH_WRITE = 1,
  PREFETCH_NO_FAULT = 2,
}
export const AdviseMrFlags = { FLUSH: 1 } as const;

/** ibv_odp_general_caps and transport cap bits */
export const OdpGeneralCaps = { SUPPORT: 1, SUPPORT_IMPLICIT: 2 } as const;
export const OdpTransportCaps = { SEND: 1, RECV: 2, WRITE: 4, READ: 8, ATOMIC: 16, SRQ_RECV: 32 } as const;

/** Implicit ODP: address 0, length SIZE_MAX. */
export const SIZE_MAX = 2n ** 64n - 1n;

/** rdma-core test defaults (rc_pingpong, tests/base.py). */
export const QP_DEFAULTS = { timeout: 14, retryCnt: 7, rnrRetry: 7, minRnrTimer: 12, pathMtu: 1024 } as const;

/** IB encoding of min_rnr_timer (code → ms), from the IB spec table. */
export function rnrTimerMs(code: number): number {
  const table = [
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48,
    30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
  ];
  return table[code & 31]!;
}

/** enum ibv_event_type (the ones this model raises come first in libibverbs too). */
export enum AsyncEventType {
  CQ_ERR = 0,
  QP_FATAL,
  QP_REQ_ERR,
  QP_ACCESS_ERR,
  COMM_EST,
  SQ_DRAINED,
  PATH_MIG,
  PATH_MIG_ERR,
  DEVICE_FATAL,
}
