// libibverbs' constants for the verbs API. The IB enums the device speaks (statuses, opcodes,
// QP states and types, access flags, events) are the device's own and live in
// kernel-sim/device/ib.ts; they are re-exported here, so the public names are unchanged. What
// is the library's alone (its defaults, the extended-QP send ops, SIZE_MAX) stays here.

export {
  Access,
  AdviseMrAdvice,
  AdviseMrFlags,
  AsyncEventType,
  FlushLevel,
  FlushType,
  knownAccess,
  MtuType,
  OdpGeneralCaps,
  OdpTransportCaps,
  QpAttrMask,
  QpState,
  QpType,
  SendFlags,
  UD_MTU,
  WcFlags,
  WcOpcode,
  WcStatus,
  wcStatusStr,
  WrOpcode,
} from '../../kernel-sim/device/ib.js';
export { rnrTimerMs } from '../../kernel-sim/index.js';

/** rdma-core test defaults (rc_pingpong, tests/base.py). */
export const QP_DEFAULTS = {
  /** Local ACK timeout code: 4.096 µs × 2^14 ≈ 67 ms. */
  timeout: 14,
  /** Retries after an ACK timeout. */
  retryCnt: 7,
  /** Retries after an RNR NAK: 7 means infinite. */
  rnrRetry: 7,
  /** RNR NAK timer code: 12 ≈ 0.64 ms. */
  minRnrTimer: 12,
  /** Path MTU in bytes. */
  pathMtu: 1024,
} as const;

/** Implicit ODP: address 0, length SIZE_MAX. */
export const SIZE_MAX = 2n ** 64n - 1n;

/** enum ibv_qp_create_send_ops_flags: the operations an extended QP may post with the ibv_wr_* API (createQpEx's sendOpsFlags). */
export const QpExSendOps = {
  /** ibv_wr_rdma_write */
  WITH_RDMA_WRITE: 1 << 0,
  /** ibv_wr_rdma_write_imm */
  WITH_RDMA_WRITE_WITH_IMM: 1 << 1,
  /** ibv_wr_send */
  WITH_SEND: 1 << 2,
  /** ibv_wr_send_imm */
  WITH_SEND_WITH_IMM: 1 << 3,
  /** ibv_wr_rdma_read */
  WITH_RDMA_READ: 1 << 4,
  /** ibv_wr_atomic_cmp_swp */
  WITH_ATOMIC_CMP_AND_SWP: 1 << 5,
  /** ibv_wr_atomic_fetch_add */
  WITH_ATOMIC_FETCH_AND_ADD: 1 << 6,
  /** ibv_wr_local_inv (memory windows: not offered, refused by createQpEx) */
  WITH_LOCAL_INV: 1 << 7,
  /** ibv_wr_bind_mw (memory windows: not offered, refused by createQpEx) */
  WITH_BIND_MW: 1 << 8,
  /** ibv_wr_send_inv (memory windows: not offered, refused by createQpEx) */
  WITH_SEND_WITH_INV: 1 << 9,
  /** ibv_wr_send_tso (UD raw packets: not offered, refused by createQpEx) */
  WITH_TSO: 1 << 10,
  /** ibv_wr_flush */
  WITH_FLUSH: 1 << 11,
  /** ibv_wr_atomic_write (its 8 bytes an argument, as in libibverbs) */
  WITH_ATOMIC_WRITE: 1 << 12,
} as const;
