// The device ABI's TypeScript mirror: every struct of native/device/abi.h (and the uapi
// structs it uses) written with C's layout rules, every constant with its C value. The C header
// is the definition; test/device/abi.test.ts compiles native/device/abi-layout.c and checks this
// file against it field by field. docs/device-abi.md says who writes what.
import { array, struct, union } from './layout.js';

export const ABI_VERSION = 1;

// ---- rings ----
export const QUEUE_MAGIC = 0x51524650;
export const QUEUE_LINE = 128;
export const QUEUE_DATA_OFFSET = 384;
/** log2 of a CQE slot's size (128 bytes). */
export const CQE_LOG2 = 7;

/** enum pfr_queue_kind */
export enum QueueKind {
  SQ = 1,
  RQ = 2,
  SRQ = 3,
  CQ = 4,
}

export const queueBuf = struct('pfr_queue_buf', [
  ['log2_elem_size', 'u32'],
  ['index_mask', 'u32'],
  ['magic', 'u32'],
  ['abi_version', 'u16'],
  ['kind', 'u16'],
  ['num_elems', 'u32'],
  ['handle', 'u32'],
  ['pad_1', array('u32', 26)],
  ['producer_index', 'u32'],
  ['notify_fired', 'u32'],
  ['pad_2', array('u32', 30)],
  ['consumer_index', 'u32'],
  ['arm_sn', 'u32'],
  ['arm_solicited', 'u32'],
  ['pad_3', array('u32', 29)],
  ['data', array('u8', 0)],
]);

export const sendWr = struct('pfr_send_wr', [
  ['wr_id', 'u64'],
  ['opcode', 'u32'],
  ['send_flags', 'u32'],
  [
    'ex',
    union('ex', [
      ['imm_data', 'u32'],
      ['invalidate_rkey', 'u32'],
    ]),
  ],
  ['xrc_remote_srqn', 'u32'],
  [
    'wr',
    union('wr', [
      [
        'rdma',
        struct('rdma', [
          ['remote_addr', 'u64'],
          ['rkey', 'u32'],
          ['reserved', 'u32'],
        ]),
      ],
      [
        'atomic',
        struct('atomic', [
          ['remote_addr', 'u64'],
          ['compare_add', 'u64'],
          ['swap', 'u64'],
          ['rkey', 'u32'],
          ['reserved', 'u32'],
        ]),
      ],
      [
        'ud',
        struct('ud', [
          ['remote_qpn', 'u32'],
          ['remote_qkey', 'u32'],
          ['ah_handle', 'u32'],
          ['reserved', 'u32'],
        ]),
      ],
      [
        'flush',
        struct('flush', [
          ['remote_addr', 'u64'],
          ['length', 'u64'],
          ['rkey', 'u32'],
          ['type', 'u8'],
          ['level', 'u8'],
          ['reserved', 'u16'],
        ]),
      ],
    ]),
  ],
]);

export const dmaInfo = struct('pfr_dma_info', [
  ['length', 'u32'],
  ['resid', 'u32'],
  ['cur_sge', 'u32'],
  ['num_sge', 'u32'],
  ['sge_offset', 'u32'],
  ['reserved', 'u32'],
]);

export const rxeSge = struct('rxe_sge', [
  ['addr', 'u64'],
  ['length', 'u32'],
  ['lkey', 'u32'],
]);

export const sendWqe = struct('pfr_send_wqe', [
  ['wr', sendWr],
  ['dma', dmaInfo],
]);

export const recvWqe = struct('pfr_recv_wqe', [
  ['wr_id', 'u64'],
  ['reserved', 'u32'],
  ['padding', 'u32'],
  ['dma', dmaInfo],
]);

export const uverbsWc = struct('ib_uverbs_wc', [
  ['wr_id', 'u64'],
  ['status', 'u32'],
  ['opcode', 'u32'],
  ['vendor_err', 'u32'],
  ['byte_len', 'u32'],
  [
    'ex',
    union('ex', [
      ['imm_data', 'u32'],
      ['invalidate_rkey', 'u32'],
    ]),
  ],
  ['qp_num', 'u32'],
  ['src_qp', 'u32'],
  ['wc_flags', 'u32'],
  ['pkey_index', 'u16'],
  ['slid', 'u16'],
  ['sl', 'u8'],
  ['dlid_path_bits', 'u8'],
  ['port_num', 'u8'],
  ['reserved', 'u8'],
]);

export const wcOdp = struct('pfr_wc_odp', [
  ['faults_source', 'u32'],
  ['faults_destination', 'u32'],
  ['major_faults', 'u32'],
  ['retransmitted_blocks', 'u32'],
  ['model_us', 'f64'],
  ['real_us', 'f64'],
]);

export const cqe = struct('pfr_cqe', [
  ['wc', uverbsWc],
  ['odp', wcOdp],
]);

// ---- the doorbell page ----
export const DOORBELL_MAGIC = 0x44524650;
export const DOORBELL_PAGE_SIZE = 4096;

/** enum pfr_device_state */
export enum DeviceState {
  RUNNING = 1,
  FATAL = 2,
}

export const doorbellPage = struct('pfr_doorbell_page', [
  ['magic', 'u32'],
  ['abi_version', 'u16'],
  ['reserved', 'u16'],
  ['context_handle', 'u32'],
  ['device_state', 'u32'],
  ['pad_1', array('u32', 28)],
  ['device_sleeping', 'u32'],
  ['pad_2', array('u32', 31)],
  ['doorbells_rung', 'u64'],
  ['pad_3', array('u32', 30)],
]);

// ---- the control protocol ----
export const CTL_MAGIC = 0x43524650;
export const CTL_MAX_MESSAGE = 4096;
export const CTL_MAX_FDS = 4;
export const NO_HANDLE = 0xffffffff;
export const DEVICE_NAME_MAX = 64;
export const ADVISE_MAX_SGE = 16;
export const CTL_REPLY = 1;
export const INFO_DATA_PATH = 1;

/** enum pfr_ctl_op */
export enum Op {
  QUERY_INFO = 1,
  GET_CONTEXT = 2,
  QUERY_DEVICE = 3,
  QUERY_PORT = 4,
  QUERY_GID = 5,
  QUERY_PKEY = 6,
  ALLOC_PD = 7,
  DEALLOC_PD = 8,
  REG_MR = 9,
  DEREG_MR = 10,
  ADVISE_MR = 11,
  CREATE_COMP_CHANNEL = 12,
  DESTROY_COMP_CHANNEL = 13,
  CREATE_CQ = 14,
  DESTROY_CQ = 15,
  CREATE_QP = 16,
  MODIFY_QP = 17,
  QUERY_QP = 18,
  DESTROY_QP = 19,
  CREATE_SRQ = 20,
  MODIFY_SRQ = 21,
  QUERY_SRQ = 22,
  DESTROY_SRQ = 23,
  OPEN_XRCD = 24,
  CLOSE_XRCD = 25,
  CREATE_AH = 26,
  DESTROY_AH = 27,
  QUERY_STATS = 28,
}
export const OP_MAX = 28;

/** enum pfr_mr_policy */
export enum MrPolicy {
  DEFAULT = 0,
  TOUCH = 1,
  TOUCH_AHEAD = 2,
  PREFETCH = 3,
}

/** enum pfr_refusal: why the device refused a message (a counter each). */
export enum Refusal {
  FRAMING = 0,
  OP = 1,
  BODY = 2,
  HANDLE = 3,
  FDS = 4,
  PEER = 5,
  RESOURCE = 6,
}
export const REFUSAL_KINDS = 7;

export const ctlHdr = struct('pfr_ctl_hdr', [
  ['magic', 'u32'],
  ['abi_version', 'u16'],
  ['op', 'u16'],
  ['length', 'u32'],
  ['request_id', 'u32'],
  ['status', 'i32'],
  ['flags', 'u32'],
]);

export const handleBody = struct('pfr_handle', [
  ['handle', 'u32'],
  ['reserved', 'u32'],
]);

export const deviceInfo = struct('pfr_device_info', [
  ['name', array('u8', DEVICE_NAME_MAX)],
  ['node_guid', 'u64'],
  ['device_pid', 'u32'],
  ['flags', 'u32'],
  ['node_type', 'u32'],
  ['transport_type', 'u32'],
  ['num_comp_vectors', 'u32'],
  ['reserved', 'u32'],
]);

export const getContext = struct('pfr_get_context', [
  ['provider_abi', 'u32'],
  ['flags', 'u32'],
  ['reserved', 'u64'],
]);

export const getContextResp = struct('pfr_get_context_resp', [
  ['context_handle', 'u32'],
  ['flags', 'u32'],
  ['num_comp_vectors', 'u32'],
  ['device_pid', 'u32'],
  ['doorbell_page_size', 'u32'],
  ['reserved', 'u32'],
]);

export const portIndex = struct('pfr_port_index', [
  ['port_num', 'u32'],
  ['index', 'u32'],
]);

export const pkey = struct('pfr_pkey', [
  ['pkey', 'u16'],
  ['reserved', 'u16'],
  ['reserved2', 'u32'],
]);

export const regMr = struct('pfr_reg_mr', [
  ['start', 'u64'],
  ['length', 'u64'],
  ['iova', 'u64'],
  ['pd_handle', 'u32'],
  ['access', 'u32'],
  ['policy', 'u32'],
  ['reserved', 'u32'],
]);

export const regMrResp = struct('pfr_reg_mr_resp', [
  ['mr_handle', 'u32'],
  ['lkey', 'u32'],
  ['rkey', 'u32'],
  ['reserved', 'u32'],
]);

export const adviseMr = struct('pfr_advise_mr', [
  ['pd_handle', 'u32'],
  ['advice', 'u32'],
  ['flags', 'u32'],
  ['num_sge', 'u32'],
]);

export const uverbsSge = struct('ib_uverbs_sge', [
  ['addr', 'u64'],
  ['length', 'u32'],
  ['lkey', 'u32'],
]);

export const createCq = struct('pfr_create_cq', [
  ['cqe', 'u32'],
  ['channel_handle', 'u32'],
  ['comp_vector', 'u32'],
  ['flags', 'u32'],
]);

export const createCqResp = struct('pfr_create_cq_resp', [
  ['cq_handle', 'u32'],
  ['cqe', 'u32'],
  ['ring_size', 'u64'],
]);

export const destroyCqResp = struct('ib_uverbs_destroy_cq_resp', [
  ['comp_events_reported', 'u32'],
  ['async_events_reported', 'u32'],
]);

export const createQp = struct('pfr_create_qp', [
  ['pd_handle', 'u32'],
  ['send_cq_handle', 'u32'],
  ['recv_cq_handle', 'u32'],
  ['srq_handle', 'u32'],
  ['xrcd_handle', 'u32'],
  ['qp_type', 'u32'],
  ['max_send_wr', 'u32'],
  ['max_recv_wr', 'u32'],
  ['max_send_sge', 'u32'],
  ['max_recv_sge', 'u32'],
  ['max_inline_data', 'u32'],
  ['sq_sig_all', 'u32'],
]);

export const createQpResp = struct('pfr_create_qp_resp', [
  ['qp_handle', 'u32'],
  ['qp_num', 'u32'],
  ['max_send_wr', 'u32'],
  ['max_recv_wr', 'u32'],
  ['max_send_sge', 'u32'],
  ['max_recv_sge', 'u32'],
  ['max_inline_data', 'u32'],
  ['reserved', 'u32'],
  ['sq_offset', 'u64'],
  ['rq_offset', 'u64'],
  ['ring_size', 'u64'],
]);

export const qpDest = struct('ib_uverbs_qp_dest', [
  ['dgid', array('u8', 16)],
  ['flow_label', 'u32'],
  ['dlid', 'u16'],
  ['reserved', 'u16'],
  ['sgid_index', 'u8'],
  ['hop_limit', 'u8'],
  ['traffic_class', 'u8'],
  ['sl', 'u8'],
  ['src_path_bits', 'u8'],
  ['static_rate', 'u8'],
  ['is_global', 'u8'],
  ['port_num', 'u8'],
]);

export const modifyQp = struct('ib_uverbs_modify_qp', [
  ['dest', qpDest],
  ['alt_dest', qpDest],
  ['qp_handle', 'u32'],
  ['attr_mask', 'u32'],
  ['qkey', 'u32'],
  ['rq_psn', 'u32'],
  ['sq_psn', 'u32'],
  ['dest_qp_num', 'u32'],
  ['qp_access_flags', 'u32'],
  ['pkey_index', 'u16'],
  ['alt_pkey_index', 'u16'],
  ['qp_state', 'u8'],
  ['cur_qp_state', 'u8'],
  ['path_mtu', 'u8'],
  ['path_mig_state', 'u8'],
  ['en_sqd_async_notify', 'u8'],
  ['max_rd_atomic', 'u8'],
  ['max_dest_rd_atomic', 'u8'],
  ['min_rnr_timer', 'u8'],
  ['port_num', 'u8'],
  ['timeout', 'u8'],
  ['retry_cnt', 'u8'],
  ['rnr_retry', 'u8'],
  ['alt_port_num', 'u8'],
  ['alt_timeout', 'u8'],
  ['reserved', array('u8', 2)],
  ['driver_data', array('u64', 0)],
]);

export const queryQp = struct('pfr_query_qp', [
  ['qp_handle', 'u32'],
  ['attr_mask', 'u32'],
]);

export const queryQpResp = struct('ib_uverbs_query_qp_resp', [
  ['dest', qpDest],
  ['alt_dest', qpDest],
  ['max_send_wr', 'u32'],
  ['max_recv_wr', 'u32'],
  ['max_send_sge', 'u32'],
  ['max_recv_sge', 'u32'],
  ['max_inline_data', 'u32'],
  ['qkey', 'u32'],
  ['rq_psn', 'u32'],
  ['sq_psn', 'u32'],
  ['dest_qp_num', 'u32'],
  ['qp_access_flags', 'u32'],
  ['pkey_index', 'u16'],
  ['alt_pkey_index', 'u16'],
  ['qp_state', 'u8'],
  ['cur_qp_state', 'u8'],
  ['path_mtu', 'u8'],
  ['path_mig_state', 'u8'],
  ['sq_draining', 'u8'],
  ['max_rd_atomic', 'u8'],
  ['max_dest_rd_atomic', 'u8'],
  ['min_rnr_timer', 'u8'],
  ['port_num', 'u8'],
  ['timeout', 'u8'],
  ['retry_cnt', 'u8'],
  ['rnr_retry', 'u8'],
  ['alt_port_num', 'u8'],
  ['alt_timeout', 'u8'],
  ['sq_sig_all', 'u8'],
  ['reserved', array('u8', 5)],
  ['driver_data', array('u64', 0)],
]);

export const destroyQpResp = struct('ib_uverbs_destroy_qp_resp', [['events_reported', 'u32']]);

export const createSrq = struct('pfr_create_srq', [
  ['pd_handle', 'u32'],
  ['srq_type', 'u32'],
  ['xrcd_handle', 'u32'],
  ['cq_handle', 'u32'],
  ['max_wr', 'u32'],
  ['max_sge', 'u32'],
  ['srq_limit', 'u32'],
  ['reserved', 'u32'],
]);

export const createSrqResp = struct('pfr_create_srq_resp', [
  ['srq_handle', 'u32'],
  ['srq_num', 'u32'],
  ['max_wr', 'u32'],
  ['max_sge', 'u32'],
  ['ring_size', 'u64'],
]);

export const modifySrq = struct('pfr_modify_srq', [
  ['srq_handle', 'u32'],
  ['attr_mask', 'u32'],
  ['max_wr', 'u32'],
  ['srq_limit', 'u32'],
]);

export const querySrqResp = struct('pfr_query_srq_resp', [
  ['max_wr', 'u32'],
  ['max_sge', 'u32'],
  ['srq_limit', 'u32'],
  ['reserved', 'u32'],
]);

export const destroySrqResp = struct('ib_uverbs_destroy_srq_resp', [['events_reported', 'u32']]);

export const globalRoute = struct('ib_uverbs_global_route', [
  ['dgid', array('u8', 16)],
  ['flow_label', 'u32'],
  ['sgid_index', 'u8'],
  ['hop_limit', 'u8'],
  ['traffic_class', 'u8'],
  ['reserved', 'u8'],
]);

export const ahAttr = struct('ib_uverbs_ah_attr', [
  ['grh', globalRoute],
  ['dlid', 'u16'],
  ['sl', 'u8'],
  ['src_path_bits', 'u8'],
  ['static_rate', 'u8'],
  ['is_global', 'u8'],
  ['port_num', 'u8'],
  ['reserved', 'u8'],
]);

export const XRCD_FILE = 1;

export const openXrcd = struct('pfr_open_xrcd', [
  ['flags', 'u32'],
  ['oflags', 'u32'],
]);

export const createAh = struct('pfr_create_ah', [
  ['pd_handle', 'u32'],
  ['reserved', 'u32'],
  ['attr', ahAttr],
]);

export const deviceStats = struct('pfr_device_stats', [
  ['connections', 'u64'],
  ['open_contexts', 'u64'],
  ['messages', 'u64'],
  ['refused', array('u64', REFUSAL_KINDS)],
  ['faults_raised', 'u64'],
  ['faults_resolved', 'u64'],
  ['faults_failed', 'u64'],
  ['fault_answers_refused', 'u64'],
  ['released_objects', 'u64'],
  ['send_wqes', 'u64'],
  ['recv_wqes', 'u64'],
  ['cqes', 'u64'],
  ['refused_wqes', 'u64'],
  ['corrupt_rings', 'u64'],
  ['doorbells', 'u64'],
]);

// ---- the fault protocol ----
export const FAULT_MAGIC = 0x46524650;

/** enum pfr_fault_op */
export enum FaultOp {
  REQUEST = 1,
  RESOLVED = 2,
}
export const FAULT_WRITE = 1;

/** enum pfr_fault_method */
export enum FaultMethod {
  TOUCH = 1,
  POPULATE = 2,
}

export const faultRequest = struct('pfr_fault_request', [
  ['magic', 'u32'],
  ['abi_version', 'u16'],
  ['op', 'u16'],
  ['fault_id', 'u64'],
  ['addr', 'u64'],
  ['length', 'u64'],
  ['mr_handle', 'u32'],
  ['flags', 'u32'],
  ['method', 'u32'],
  ['reserved', 'u32'],
]);

export const faultResponse = struct('pfr_fault_response', [
  ['magic', 'u32'],
  ['abi_version', 'u16'],
  ['op', 'u16'],
  ['fault_id', 'u64'],
  ['status', 'i32'],
  ['pages', 'u32'],
  ['ns', 'u64'],
]);

// ---- events ----
/** enum pfr_element_kind */
export enum ElementKind {
  DEVICE = 0,
  CQ = 1,
  QP = 2,
  SRQ = 3,
  PORT = 4,
}

export const asyncEvent = struct('pfr_async_event', [
  ['event_type', 'u32'],
  ['element_kind', 'u32'],
  ['handle', 'u32'],
  ['reserved', 'u32'],
]);

export const compEvent = struct('pfr_comp_event', [
  ['cq_handle', 'u32'],
  ['reserved', 'u32'],
]);

// ---- the uapi query replies ----
export const queryPortResp = struct('ib_uverbs_query_port_resp', [
  ['port_cap_flags', 'u32'],
  ['max_msg_sz', 'u32'],
  ['bad_pkey_cntr', 'u32'],
  ['qkey_viol_cntr', 'u32'],
  ['gid_tbl_len', 'u32'],
  ['pkey_tbl_len', 'u16'],
  ['lid', 'u16'],
  ['sm_lid', 'u16'],
  ['state', 'u8'],
  ['max_mtu', 'u8'],
  ['active_mtu', 'u8'],
  ['lmc', 'u8'],
  ['max_vl_num', 'u8'],
  ['sm_sl', 'u8'],
  ['subnet_timeout', 'u8'],
  ['init_type_reply', 'u8'],
  ['active_width', 'u8'],
  ['active_speed', 'u8'],
  ['phys_state', 'u8'],
  ['link_layer', 'u8'],
  ['flags', 'u8'],
  ['reserved', 'u8'],
]);

export const gidEntry = struct('ib_uverbs_gid_entry', [
  ['gid', array('u64', 2)],
  ['gid_index', 'u32'],
  ['port_num', 'u32'],
  ['gid_type', 'u32'],
  ['netdev_ifindex', 'u32'],
]);

export const queryDeviceResp = struct('ib_uverbs_query_device_resp', [
  ['fw_ver', 'u64'],
  ['node_guid', 'u64'],
  ['sys_image_guid', 'u64'],
  ['max_mr_size', 'u64'],
  ['page_size_cap', 'u64'],
  ...(
    [
      'vendor_id',
      'vendor_part_id',
      'hw_ver',
      'max_qp',
      'max_qp_wr',
      'device_cap_flags',
      'max_sge',
      'max_sge_rd',
      'max_cq',
      'max_cqe',
      'max_mr',
      'max_pd',
      'max_qp_rd_atom',
      'max_ee_rd_atom',
      'max_res_rd_atom',
      'max_qp_init_rd_atom',
      'max_ee_init_rd_atom',
      'atomic_cap',
      'max_ee',
      'max_rdd',
      'max_mw',
      'max_raw_ipv6_qp',
      'max_raw_ethy_qp',
      'max_mcast_grp',
      'max_mcast_qp_attach',
      'max_total_mcast_qp_attach',
      'max_ah',
      'max_fmr',
      'max_map_per_fmr',
      'max_srq',
      'max_srq_wr',
      'max_srq_sge',
    ] as const
  ).map((n) => [n, 'u32'] as const),
  ['max_pkeys', 'u16'],
  ['local_ca_ack_delay', 'u8'],
  ['phys_port_cnt', 'u8'],
  ['reserved', array('u8', 4)],
]);

export const exQueryDeviceResp = struct('ib_uverbs_ex_query_device_resp', [
  ['base', queryDeviceResp],
  ['comp_mask', 'u32'],
  ['response_length', 'u32'],
  [
    'odp_caps',
    struct('ib_uverbs_odp_caps', [
      ['general_caps', 'u64'],
      [
        'per_transport_caps',
        struct('per_transport_caps', [
          ['rc_odp_caps', 'u32'],
          ['uc_odp_caps', 'u32'],
          ['ud_odp_caps', 'u32'],
        ]),
      ],
      ['reserved', 'u32'],
    ]),
  ],
  ['timestamp_mask', 'u64'],
  ['hca_core_clock', 'u64'],
  ['device_cap_flags_ex', 'u64'],
  [
    'rss_caps',
    struct('ib_uverbs_rss_caps', [
      ['supported_qpts', 'u32'],
      ['max_rwq_indirection_tables', 'u32'],
      ['max_rwq_indirection_table_size', 'u32'],
      ['reserved', 'u32'],
    ]),
  ],
  ['max_wq_type_rq', 'u32'],
  ['raw_packet_caps', 'u32'],
  [
    'tm_caps',
    struct('ib_uverbs_tm_caps', [
      ['max_rndv_hdr_size', 'u32'],
      ['max_num_tags', 'u32'],
      ['flags', 'u32'],
      ['max_ops', 'u32'],
      ['max_sge', 'u32'],
      ['reserved', 'u32'],
    ]),
  ],
  [
    'cq_moderation_caps',
    struct('ib_uverbs_cq_moderation_caps', [
      ['max_cq_moderation_count', 'u16'],
      ['max_cq_moderation_period', 'u16'],
      ['reserved', 'u32'],
    ]),
  ],
  ['max_dm_size', 'u64'],
  ['xrc_odp_caps', 'u32'],
  ['reserved', 'u32'],
]);

/** Every struct of the ABI by its C name: what the layout test walks. */
export const ABI_STRUCTS = [
  queueBuf,
  sendWr,
  dmaInfo,
  rxeSge,
  sendWqe,
  recvWqe,
  uverbsWc,
  wcOdp,
  cqe,
  doorbellPage,
  ctlHdr,
  handleBody,
  deviceInfo,
  getContext,
  getContextResp,
  portIndex,
  pkey,
  regMr,
  regMrResp,
  adviseMr,
  uverbsSge,
  createCq,
  createCqResp,
  destroyCqResp,
  createQp,
  createQpResp,
  qpDest,
  modifyQp,
  queryQp,
  queryQpResp,
  destroyQpResp,
  createSrq,
  createSrqResp,
  modifySrq,
  querySrqResp,
  destroySrqResp,
  globalRoute,
  ahAttr,
  openXrcd,
  createAh,
  deviceStats,
  faultRequest,
  faultResponse,
  asyncEvent,
  compEvent,
  queryPortResp,
  gidEntry,
  queryDeviceResp,
  exQueryDeviceResp,
] as const;
