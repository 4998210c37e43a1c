// Which QP state changes a MODIFY_QP may ask for, and with which attributes: the table of the
// IB spec (11.2.5) as the kernel's ib_modify_qp_is_ok keeps it, for the QP types the engine
// has. A request outside it is EINVAL, as the kernel answers.

import { QpAttrMask, QpState, QpType } from './ib.js';

export { QpState, QpType };

/** enum ibv_qp_attr_mask, with the bit the device also knows (IBV_QP_RATE_LIMIT) */
export const QpAttr = { ...QpAttrMask, RATE_LIMIT: 1 << 25 } as const;
const A = QpAttr;

interface Rule {
  required: Partial<Record<QpType, number>>;
  optional: Partial<Record<QpType, number>>;
}

const CONNECTED = [QpType.RC, QpType.XRC_SEND, QpType.XRC_RECV] as const;
function each(types: readonly QpType[], mask: number): Partial<Record<QpType, number>> {
  return Object.fromEntries(types.map((t) => [t, mask]));
}

// [from][to] -> what the change needs and allows beyond STATE; absent: not allowed.
const RULES: Partial<Record<QpState, Partial<Record<QpState, Rule>>>> = {
  [QpState.RESET]: {
    [QpState.RESET]: { required: {}, optional: {} },
    [QpState.INIT]: {
      required: { [QpType.UD]: A.PKEY_INDEX | A.PORT | A.QKEY, ...each(CONNECTED, A.PKEY_INDEX | A.PORT | A.ACCESS_FLAGS) },
      optional: {},
    },
  },
  [QpState.INIT]: {
    [QpState.INIT]: {
      required: {},
      optional: { [QpType.UD]: A.PKEY_INDEX | A.PORT | A.QKEY, ...each(CONNECTED, A.PKEY_INDEX | A.PORT | A.ACCESS_FLAGS) },
    },
    [QpState.RTR]: {
      required: {
        [QpType.UD]: 0,
        [QpType.RC]: A.AV | A.PATH_MTU | A.DEST_QPN | A.RQ_PSN | A.MAX_DEST_RD_ATOMIC | A.MIN_RNR_TIMER,
        [QpType.XRC_RECV]: A.AV | A.PATH_MTU | A.DEST_QPN | A.RQ_PSN | A.MAX_DEST_RD_ATOMIC | A.MIN_RNR_TIMER,
        [QpType.XRC_SEND]: A.AV | A.PATH_MTU | A.DEST_QPN | A.RQ_PSN,
      },
      optional: {
        [QpType.UD]: A.PKEY_INDEX | A.QKEY,
        ...each(CONNECTED, A.ALT_PATH | A.ACCESS_FLAGS | A.PKEY_INDEX),
      },
    },
  },
  [QpState.RTR]: {
    [QpState.RTS]: {
      required: {
        [QpType.UD]: A.SQ_PSN,
        [QpType.RC]: A.TIMEOUT | A.RETRY_CNT | A.RNR_RETRY | A.SQ_PSN | A.MAX_QP_RD_ATOMIC,
        [QpType.XRC_SEND]: A.TIMEOUT | A.RETRY_CNT | A.RNR_RETRY | A.SQ_PSN | A.MAX_QP_RD_ATOMIC,
        [QpType.XRC_RECV]: A.TIMEOUT | A.SQ_PSN,
      },
      optional: {
        [QpType.UD]: A.CUR_STATE | A.QKEY,
        ...each(CONNECTED, A.CUR_STATE | A.ALT_PATH | A.ACCESS_FLAGS | A.MIN_RNR_TIMER | A.PATH_MIG_STATE),
      },
    },
  },
  [QpState.RTS]: {
    [QpState.RTS]: {
      required: {},
      optional: {
        [QpType.UD]: A.CUR_STATE | A.QKEY,
        ...each(CONNECTED, A.CUR_STATE | A.ACCESS_FLAGS | A.ALT_PATH | A.PATH_MIG_STATE | A.MIN_RNR_TIMER),
      },
    },
    [QpState.SQD]: { required: {}, optional: each([QpType.UD, ...CONNECTED], A.EN_SQD_ASYNC_NOTIFY) },
  },
  [QpState.SQD]: {
    [QpState.RTS]: {
      required: {},
      optional: {
        [QpType.UD]: A.CUR_STATE | A.QKEY,
        ...each(CONNECTED, A.CUR_STATE | A.ACCESS_FLAGS | A.ALT_PATH | A.PATH_MIG_STATE | A.MIN_RNR_TIMER),
      },
    },
    [QpState.SQD]: {
      required: {},
      optional: {
        [QpType.UD]: A.PKEY_INDEX | A.QKEY,
        ...each(
          CONNECTED,
          A.AV |
            A.ALT_PATH |
            A.ACCESS_FLAGS |
            A.PKEY_INDEX |
            A.MIN_RNR_TIMER |
            A.PATH_MIG_STATE |
            A.TIMEOUT |
            A.RETRY_CNT |
            A.RNR_RETRY |
            A.MAX_QP_RD_ATOMIC |
            A.MAX_DEST_RD_ATOMIC,
        ),
      },
    },
  },
  [QpState.SQE]: {
    [QpState.RTS]: { required: {}, optional: { [QpType.UD]: A.CUR_STATE | A.QKEY } },
  },
};

/**
 * Why `from` → `to` with `mask` is not allowed for a QP of `type`, or undefined when it is.
 * Any state may go to RESET or ERR with STATE alone.
 */
export function transitionError(type: QpType, from: QpState, to: QpState, mask: number): string | undefined {
  if ((to === QpState.RESET || to === QpState.ERR) && (mask & ~(A.STATE | A.CUR_STATE)) === 0) return undefined;
  const rule = RULES[from]?.[to];
  if (!rule) return `${QpState[from]} -> ${QpState[to]} is not a state change a QP makes`;
  const required = rule.required[type] ?? 0;
  const allowed = A.STATE | required | (rule.optional[type] ?? 0);
  if ((mask & required) !== required)
    return `${QpState[from]} -> ${QpState[to]} needs attr_mask 0x${required.toString(16)} (has 0x${mask.toString(16)})`;
  if ((mask & ~allowed) !== 0) return `${QpState[from]} -> ${QpState[to]} does not take attr_mask bits 0x${(mask & ~allowed).toString(16)}`;
  return undefined;
}
