/* The device ABI of pagefault-rdma: what a provider (the project's libibverbs.so.1 in a
 * program's process, lib/verbs in the device's own) and the device share, defined once.
 *
 *  - the queues: rings of fixed-layout entries in shared memory (a sealed memfd the device
 *    makes and the provider maps), modelled on rxe's user ABI (rdma_user_rxe.h): the ring
 *    header keeps struct rxe_queue_buf's offsets, receive WQEs are struct rxe_recv_wqe, send
 *    WQEs carry struct rxe_dma_info and its struct rxe_sge list, and a CQE starts with
 *    struct ib_uverbs_wc followed by this project's ODP figures;
 *  - the doorbell page and the doorbell eventfd of each context;
 *  - the control protocol: fixed-size messages on a SOCK_SEQPACKET Unix socket, modelled on
 *    uverbs' commands, using the uapi request and response structs where they fit;
 *  - the fault protocol: the device's SMMU driver asks the program's fault thread to make
 *    pages resident, and hears the answer.
 *
 * Everything is little-endian, naturally aligned, with explicit padding: no layout depends on
 * a compiler, a language or a JavaScript object. docs/device-abi.md describes every field and
 * who writes it; tools/abi-layout.c prints every offset so the TypeScript mirror
 * (kernel-sim/device/abi.ts) is checked against this file.
 *
 * Nothing a peer writes is trusted: the device checks every message and every index it reads
 * from shared memory, and keeps its own copy of every ring's geometry. */
#ifndef PFR_DEVICE_ABI_H
#define PFR_DEVICE_ABI_H

#include <stdint.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_rxe.h>

#ifdef __cplusplus
#define PFR_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define PFR_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define PFR_ABI_VERSION 1

/* ------------------------------------------------------------------------------------------
 * Rings
 * ---------------------------------------------------------------------------------------- */

/* Indices are free-running 32-bit counters (they wrap at 2^32); entry i lives in slot
 * (i & index_mask). Empty: producer == consumer. Full: producer - consumer == num_elems. A
 * ring holds num_elems entries (a power of two). Each index sits on a line of its own (128
 * bytes: two cache lines, as rxe, against the adjacent-line prefetcher), written only by its
 * owner. */
#define PFR_QUEUE_MAGIC 0x51524650u /* "PFRQ" */
#define PFR_QUEUE_LINE 128u
#define PFR_QUEUE_DATA_OFFSET 384u

enum pfr_queue_kind {
	PFR_QUEUE_SQ = 1,  /* send queue: the provider produces WQEs, the device consumes */
	PFR_QUEUE_RQ = 2,  /* receive queue: the provider produces, the device consumes */
	PFR_QUEUE_SRQ = 3, /* shared receive queue: as RQ */
	PFR_QUEUE_CQ = 4,  /* completion queue: the device produces CQEs, the provider consumes */
};

struct pfr_queue_buf {
	/* line 0: geometry, written by the device before the memfd is handed over; read-only to
	 * the provider. The device never reads it back: it keeps its own copy. */
	uint32_t log2_elem_size; /* entry slot size = 1 << log2_elem_size bytes */
	uint32_t index_mask;     /* num_elems - 1 */
	uint32_t magic;          /* PFR_QUEUE_MAGIC */
	uint16_t abi_version;    /* PFR_ABI_VERSION */
	uint16_t kind;           /* enum pfr_queue_kind */
	uint32_t num_elems;      /* entries the ring holds (a power of two) */
	uint32_t handle;         /* the QP, SRQ or CQ handle the ring belongs to */
	uint32_t pad_1[26];
	/* line 1: the producer's (SQ/RQ/SRQ: provider; CQ: device) */
	uint32_t producer_index;
	uint32_t notify_fired; /* CQ: the arm_sn the device last fired an event for */
	uint32_t pad_2[30];
	/* line 2: the consumer's (SQ/RQ/SRQ: device; CQ: provider) */
	uint32_t consumer_index;
	uint32_t arm_sn;        /* CQ: incremented by the provider to arm (ibv_req_notify_cq) */
	uint32_t arm_solicited; /* CQ: 1 = wake only for a solicited or an error completion */
	uint32_t pad_3[29];
	uint8_t data[]; /* num_elems slots at PFR_QUEUE_DATA_OFFSET */
};

PFR_STATIC_ASSERT(sizeof(struct pfr_queue_buf) == PFR_QUEUE_DATA_OFFSET, "ring header");
/* rxe's offsets, kept: a reader of rdma_user_rxe.h finds every index where rxe has it. */
PFR_STATIC_ASSERT(__builtin_offsetof(struct pfr_queue_buf, log2_elem_size) ==
		  __builtin_offsetof(struct rxe_queue_buf, log2_elem_size), "rxe log2_elem_size");
PFR_STATIC_ASSERT(__builtin_offsetof(struct pfr_queue_buf, index_mask) ==
		  __builtin_offsetof(struct rxe_queue_buf, index_mask), "rxe index_mask");
PFR_STATIC_ASSERT(__builtin_offsetof(struct pfr_queue_buf, producer_index) ==
		  __builtin_offsetof(struct rxe_queue_buf, producer_index), "rxe producer_index");
PFR_STATIC_ASSERT(__builtin_offsetof(struct pfr_queue_buf, consumer_index) ==
		  __builtin_offsetof(struct rxe_queue_buf, consumer_index), "rxe consumer_index");
PFR_STATIC_ASSERT(__builtin_offsetof(struct pfr_queue_buf, data) ==
		  __builtin_offsetof(struct rxe_queue_buf, data), "rxe data");

/* A send work request as the provider posts it: rxe_send_wr's shape (wr_id, opcode, flags,
 * immediate, then one union by opcode), with what rxe lacks and the engine has: XRC's remote
 * SRQ number and FLUSH's range. opcode and send_flags carry enum ibv_wr_opcode and enum
 * ibv_send_flags values; imm_data is in network order, as ibv_send_wr.imm_data. */
struct pfr_send_wr {
	uint64_t wr_id;
	uint32_t opcode;
	uint32_t send_flags;
	union {
		uint32_t imm_data;        /* big-endian, as posted */
		uint32_t invalidate_rkey; /* not offered: SEND_WITH_INV is refused */
	} ex;
	uint32_t xrc_remote_srqn; /* XRC_SEND QPs: the target SRQ number */
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
			uint32_t reserved;
		} rdma; /* RDMA_WRITE(_WITH_IMM), RDMA_READ, ATOMIC_WRITE */
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
			uint32_t reserved;
		} atomic; /* ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD */
		struct {
			uint32_t remote_qpn;
			uint32_t remote_qkey;
			uint32_t ah_handle; /* the device's handle of the AH (CREATE_AH) */
			uint32_t reserved;
		} ud; /* UD QPs */
		struct {
			uint64_t remote_addr;
			uint64_t length;
			uint32_t rkey;
			uint8_t type;  /* enum ibv_placement_type */
			uint8_t level; /* enum ibv_selectivity_level */
			uint16_t reserved;
		} flush; /* FLUSH */
	} wr;
};
PFR_STATIC_ASSERT(sizeof(struct pfr_send_wr) == 56, "send wr");

/* rxe's DMA descriptor, struct rxe_dma_info, as a fixed header: the SGEs (struct rxe_sge:
 * addr, length, lkey) or IBV_SEND_INLINE's bytes follow it. (rxe_dma_info ends in a union of
 * flexible arrays, which C++ compilers size differently from C; this header keeps one layout
 * for both, asserted equal to rxe's in C.) length: bytes of the message; num_sge: SGEs that
 * follow. resid, cur_sge, sge_offset and reserved are rxe's progress fields: the provider
 * writes resid = length and zeros, the device ignores them (its progress lives in its own copy
 * of the WQE, never in shared memory). */
struct pfr_dma_info {
	uint32_t length;
	uint32_t resid;
	uint32_t cur_sge;
	uint32_t num_sge;
	uint32_t sge_offset;
	uint32_t reserved;
};
PFR_STATIC_ASSERT(sizeof(struct pfr_dma_info) == 24, "dma info");
PFR_STATIC_ASSERT(sizeof(struct rxe_sge) == 16, "sge");

/* A send WQE: the request, then the DMA descriptor, then num_sge struct rxe_sge (or inline
 * bytes) at offset sizeof(struct pfr_send_wqe). */
struct pfr_send_wqe {
	struct pfr_send_wr wr;
	struct pfr_dma_info dma;
};
PFR_STATIC_ASSERT(sizeof(struct pfr_send_wqe) == 80, "send wqe");

/* A receive WQE: struct rxe_recv_wqe's layout (wr_id, reserved, padding, the DMA descriptor),
 * then num_sge struct rxe_sge at offset sizeof(struct pfr_recv_wqe). */
struct pfr_recv_wqe {
	uint64_t wr_id;
	uint32_t reserved;
	uint32_t padding;
	struct pfr_dma_info dma;
};
PFR_STATIC_ASSERT(sizeof(struct pfr_recv_wqe) == 40, "recv wqe");

#ifndef __cplusplus
PFR_STATIC_ASSERT(sizeof(struct rxe_dma_info) == sizeof(struct pfr_dma_info), "rxe dma info");
PFR_STATIC_ASSERT(__builtin_offsetof(struct rxe_dma_info, sge) == sizeof(struct pfr_dma_info), "rxe sge offset");
PFR_STATIC_ASSERT(__builtin_offsetof(struct rxe_dma_info, num_sge) ==
		  __builtin_offsetof(struct pfr_dma_info, num_sge), "rxe num_sge");
PFR_STATIC_ASSERT(sizeof(struct rxe_recv_wqe) == sizeof(struct pfr_recv_wqe), "rxe recv wqe");
PFR_STATIC_ASSERT(__builtin_offsetof(struct rxe_recv_wqe, dma) ==
		  __builtin_offsetof(struct pfr_recv_wqe, dma), "rxe recv dma");
#endif

/* What a completion says about on-demand paging (lib/verbs' wc.odp): faults the transfer
 * took at each side, pages a page store supplied, blocks sent again, the modelled time of the
 * hardware and the measured time, in µs (IEEE-754 binary64). */
struct pfr_wc_odp {
	uint32_t faults_source;
	uint32_t faults_destination;
	uint32_t major_faults;
	uint32_t retransmitted_blocks;
	double model_us;
	double real_us;
};

/* A CQE: the kernel's work completion (uapi ib_uverbs_wc: status enum ibv_wc_status, opcode
 * enum ibv_wc_opcode, imm_data big-endian), then the ODP figures. */
struct pfr_cqe {
	struct ib_uverbs_wc wc;
	struct pfr_wc_odp odp;
};
PFR_STATIC_ASSERT(sizeof(struct ib_uverbs_wc) == 48, "uverbs wc");
PFR_STATIC_ASSERT(sizeof(struct pfr_cqe) == 80, "cqe");

/* Slot sizes: the smallest power of two that holds the entry and its SGEs or inline data. */
#define PFR_CQE_LOG2 7u /* 128 */

/* ------------------------------------------------------------------------------------------
 * The doorbell page (one per context, a sealed memfd of PFR_DOORBELL_PAGE_SIZE bytes)
 * ---------------------------------------------------------------------------------------- */

#define PFR_DOORBELL_MAGIC 0x44524650u /* "PFRD" */
#define PFR_DOORBELL_PAGE_SIZE 4096u

enum pfr_device_state {
	PFR_DEVICE_RUNNING = 1,
	PFR_DEVICE_FATAL = 2, /* every QP is in error; the next verbs fail (IBV_EVENT_DEVICE_FATAL) */
};

struct pfr_doorbell_page {
	/* line 0: the device's, written before the memfd is handed over, then device_state */
	uint32_t magic;
	uint16_t abi_version;
	uint16_t reserved;
	uint32_t context_handle;
	uint32_t device_state; /* enum pfr_device_state */
	uint32_t pad_1[28];
	/* line 1: the device's. 1: the device is about to wait on the doorbell eventfd, so a
	 * provider that produced an entry must write it; 0: the device is scanning the rings and
	 * will see the entry without a wake-up. */
	uint32_t device_sleeping;
	uint32_t pad_2[31];
	/* line 2: the provider's. Doorbells it rang (eventfd writes), for the statistics. */
	uint64_t doorbells_rung;
	uint32_t pad_3[30];
};
PFR_STATIC_ASSERT(sizeof(struct pfr_doorbell_page) == 3 * PFR_QUEUE_LINE, "doorbell page");

/* ------------------------------------------------------------------------------------------
 * The control protocol
 * ---------------------------------------------------------------------------------------- */

#define PFR_CTL_MAGIC 0x43524650u /* "PFRC" */
#define PFR_CTL_MAX_MESSAGE 4096u  /* header + body; a longer datagram is refused */
#define PFR_CTL_MAX_FDS 4u         /* file descriptors one message may carry (SCM_RIGHTS) */
#define PFR_NO_HANDLE 0xffffffffu  /* "none" where a handle is optional (CQ without channel) */
#define PFR_DEVICE_NAME_MAX 64u
#define PFR_ADVISE_MAX_SGE 16u

enum pfr_ctl_flags {
	PFR_CTL_REPLY = 1, /* set by the device on every reply */
};

struct pfr_ctl_hdr {
	uint32_t magic;       /* PFR_CTL_MAGIC */
	uint16_t abi_version; /* PFR_ABI_VERSION */
	uint16_t op;          /* enum pfr_ctl_op; a reply carries its request's */
	uint32_t length;      /* bytes of header and body: the datagram's length */
	uint32_t request_id;  /* the provider's; echoed in the reply */
	int32_t status;       /* requests: 0; replies: 0 or -errno (no body then) */
	uint32_t flags;       /* requests: 0; replies: PFR_CTL_REPLY */
};
PFR_STATIC_ASSERT(sizeof(struct pfr_ctl_hdr) == 24, "ctl header");

/* Each op: its request body (after the header), the fds the request carries, its reply body
 * and the fds the reply carries. Bodies are exactly the size of their struct, except
 * ADVISE_MR's, whose SGE list is num_sge long. */
enum pfr_ctl_op {
	PFR_OP_QUERY_INFO = 1,        /* -> pfr_device_info: for ibv_get_device_list, no context */
	PFR_OP_GET_CONTEXT = 2,       /* pfr_get_context + fds [async, doorbell, fault] -> pfr_get_context_resp + fd [doorbell page] */
	PFR_OP_QUERY_DEVICE = 3,      /* (none) -> struct ib_uverbs_ex_query_device_resp */
	PFR_OP_QUERY_PORT = 4,        /* pfr_port_index -> struct ib_uverbs_query_port_resp */
	PFR_OP_QUERY_GID = 5,         /* pfr_port_index -> struct ib_uverbs_gid_entry */
	PFR_OP_QUERY_PKEY = 6,        /* pfr_port_index -> pfr_pkey */
	PFR_OP_ALLOC_PD = 7,          /* (none) -> pfr_handle */
	PFR_OP_DEALLOC_PD = 8,        /* pfr_handle -> (none) */
	PFR_OP_REG_MR = 9,            /* pfr_reg_mr -> pfr_reg_mr_resp */
	PFR_OP_DEREG_MR = 10,         /* pfr_handle -> (none) */
	PFR_OP_ADVISE_MR = 11,        /* pfr_advise_mr + num_sge ib_uverbs_sge -> (none) */
	PFR_OP_CREATE_COMP_CHANNEL = 12, /* (none) + fd [event pipe] -> pfr_handle */
	PFR_OP_DESTROY_COMP_CHANNEL = 13, /* pfr_handle -> (none) */
	PFR_OP_CREATE_CQ = 14,        /* pfr_create_cq -> pfr_create_cq_resp + fd [ring] */
	PFR_OP_DESTROY_CQ = 15,       /* pfr_handle -> struct ib_uverbs_destroy_cq_resp */
	PFR_OP_CREATE_QP = 16,        /* pfr_create_qp -> pfr_create_qp_resp + fd [rings] */
	PFR_OP_MODIFY_QP = 17,        /* struct ib_uverbs_modify_qp -> (none) */
	PFR_OP_QUERY_QP = 18,         /* pfr_query_qp -> struct ib_uverbs_query_qp_resp */
	PFR_OP_DESTROY_QP = 19,       /* pfr_handle -> struct ib_uverbs_destroy_qp_resp */
	PFR_OP_CREATE_SRQ = 20,       /* pfr_create_srq -> pfr_create_srq_resp + fd [ring] */
	PFR_OP_MODIFY_SRQ = 21,       /* pfr_modify_srq -> (none) */
	PFR_OP_QUERY_SRQ = 22,        /* pfr_handle -> pfr_query_srq_resp */
	PFR_OP_DESTROY_SRQ = 23,      /* pfr_handle -> struct ib_uverbs_destroy_srq_resp */
	PFR_OP_OPEN_XRCD = 24,        /* pfr_open_xrcd + fd [file] if PFR_XRCD_FILE -> pfr_handle */
	PFR_OP_CLOSE_XRCD = 25,       /* pfr_handle -> (none) */
	PFR_OP_CREATE_AH = 26,        /* pfr_create_ah -> pfr_handle */
	PFR_OP_DESTROY_AH = 27,       /* pfr_handle -> (none) */
	PFR_OP_QUERY_STATS = 28,      /* (none) -> pfr_device_stats: no context needed */
	PFR_OP_MAX = 28,
};

/* A handle of the device's (per context: a handle of another context is EINVAL here). */
struct pfr_handle {
	uint32_t handle;
	uint32_t reserved;
};

enum pfr_info_flags {
	PFR_INFO_DATA_PATH = 1, /* the device consumes the rings: post_send/post_recv work */
};

struct pfr_device_info {
	char name[PFR_DEVICE_NAME_MAX]; /* NUL-terminated, e.g. "pfr0" */
	uint64_t node_guid;             /* big-endian, as ibv_get_device_guid returns it */
	uint32_t device_pid;            /* the device process: what PR_SET_PTRACER lets in */
	uint32_t flags;                 /* enum pfr_info_flags */
	uint32_t node_type;             /* enum ibv_node_type */
	uint32_t transport_type;        /* enum ibv_transport_type */
	uint32_t num_comp_vectors;
	uint32_t reserved;
};

struct pfr_get_context {
	uint32_t provider_abi; /* PFR_ABI_VERSION the provider was built for */
	uint32_t flags;        /* 0 */
	uint64_t reserved;
};

struct pfr_get_context_resp {
	uint32_t context_handle;
	uint32_t flags; /* enum pfr_info_flags */
	uint32_t num_comp_vectors;
	uint32_t device_pid;
	uint32_t doorbell_page_size; /* PFR_DOORBELL_PAGE_SIZE */
	uint32_t reserved;
};

struct pfr_port_index {
	uint32_t port_num; /* 1 */
	uint32_t index;    /* GID or P_Key table index; 0 for QUERY_PORT */
};

struct pfr_pkey {
	uint16_t pkey;
	uint16_t reserved;
	uint32_t reserved2;
};

/* How the fault thread makes an ODP MR's pages resident (the policies of lib/fault-library). */
enum pfr_mr_policy {
	PFR_POLICY_DEFAULT = 0, /* the device's --policy */
	PFR_POLICY_TOUCH = 1,
	PFR_POLICY_TOUCH_AHEAD = 2,
	PFR_POLICY_PREFETCH = 3,
};

struct pfr_reg_mr {
	uint64_t start;  /* the program's virtual address; 0 with length UINT64_MAX: implicit ODP */
	uint64_t length;
	uint64_t iova;   /* must equal start (shared virtual addressing) */
	uint32_t pd_handle;
	uint32_t access; /* enum ibv_access_flags */
	uint32_t policy; /* enum pfr_mr_policy */
	uint32_t reserved;
};

struct pfr_reg_mr_resp {
	uint32_t mr_handle;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t reserved;
};

struct pfr_advise_mr {
	uint32_t pd_handle;
	uint32_t advice; /* enum ibv_advise_mr_advice */
	uint32_t flags;  /* enum ibv_advise_mr_flags */
	uint32_t num_sge; /* 1..PFR_ADVISE_MAX_SGE struct ib_uverbs_sge follow */
};

struct pfr_create_cq {
	uint32_t cqe;            /* entries asked for */
	uint32_t channel_handle; /* PFR_NO_HANDLE: no completion channel */
	uint32_t comp_vector;
	uint32_t flags; /* 0 */
};

struct pfr_create_cq_resp {
	uint32_t cq_handle;
	uint32_t cqe;       /* entries the ring holds (>= asked) */
	uint64_t ring_size; /* bytes of the memfd: the ring at offset 0 */
};

struct pfr_create_qp {
	uint32_t pd_handle;
	uint32_t send_cq_handle;
	uint32_t recv_cq_handle;
	uint32_t srq_handle;  /* PFR_NO_HANDLE: none */
	uint32_t xrcd_handle; /* XRC_RECV QPs; PFR_NO_HANDLE otherwise */
	uint32_t qp_type;     /* enum ibv_qp_type: RC, UD, XRC_SEND, XRC_RECV */
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t sq_sig_all;
};

struct pfr_create_qp_resp {
	uint32_t qp_handle;
	uint32_t qp_num;
	uint32_t max_send_wr; /* what the rings hold */
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t reserved;
	uint64_t sq_offset; /* the send ring's header in the memfd */
	uint64_t rq_offset; /* the receive ring's header; UINT64_MAX: none (SRQ, XRC_SEND) */
	uint64_t ring_size; /* bytes of the memfd */
};

struct pfr_query_qp {
	uint32_t qp_handle;
	uint32_t attr_mask; /* enum ibv_qp_attr_mask */
};

struct pfr_create_srq {
	uint32_t pd_handle;
	uint32_t srq_type;    /* enum ibv_srq_type: BASIC or XRC */
	uint32_t xrcd_handle; /* XRC SRQs */
	uint32_t cq_handle;   /* XRC SRQs */
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
	uint32_t reserved;
};

struct pfr_create_srq_resp {
	uint32_t srq_handle;
	uint32_t srq_num;
	uint32_t max_wr;
	uint32_t max_sge;
	uint64_t ring_size;
};

struct pfr_modify_srq {
	uint32_t srq_handle;
	uint32_t attr_mask; /* enum ibv_srq_attr_mask */
	uint32_t max_wr;
	uint32_t srq_limit;
};

struct pfr_query_srq_resp {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
	uint32_t reserved;
};

enum pfr_xrcd_flags {
	PFR_XRCD_FILE = 1, /* the request carries a regular file: the domain of its inode, shared by every
			    * context that opens it (ibv_open_xrcd with an fd) */
};

struct pfr_open_xrcd {
	uint32_t flags;  /* enum pfr_xrcd_flags */
	uint32_t oflags; /* with PFR_XRCD_FILE: O_CREAT, O_EXCL */
};

struct pfr_create_ah {
	uint32_t pd_handle;
	uint32_t reserved;
	struct ib_uverbs_ah_attr attr;
};

/* Counters of the whole device: what it served and what it refused, and why. */
enum pfr_refusal {
	PFR_REFUSED_FRAMING = 0,  /* short, long or truncated datagram, bad magic, version or length */
	PFR_REFUSED_OP = 1,       /* unknown op, or an op that needs a context before GET_CONTEXT */
	PFR_REFUSED_BODY = 2,     /* a body of the wrong size, a field out of range, bad flags */
	PFR_REFUSED_HANDLE = 3,   /* a handle this context does not hold, or of the wrong kind */
	PFR_REFUSED_FDS = 4,      /* the wrong number of file descriptors, or one of the wrong kind */
	PFR_REFUSED_PEER = 5,     /* another user's connection */
	PFR_REFUSED_RESOURCE = 6, /* a limit of the device: too many objects, too large a ring */
	PFR_REFUSED_KINDS = 7,
};

struct pfr_device_stats {
	uint64_t connections;  /* accepted since the device started */
	uint64_t open_contexts;
	uint64_t messages;     /* requests read */
	uint64_t refused[PFR_REFUSED_KINDS];
	uint64_t faults_raised;   /* fault requests sent to programs' fault threads */
	uint64_t faults_resolved; /* answered with success */
	uint64_t faults_failed;   /* answered with an error, or not in time */
	uint64_t fault_answers_refused; /* answers that broke the fault protocol (dropped) */
	uint64_t released_objects; /* objects freed because their program went away */
	/* the data path */
	uint64_t send_wqes;     /* send WQEs the device read from the programs' rings */
	uint64_t recv_wqes;     /* receive WQEs it took */
	uint64_t cqes;          /* CQEs it wrote */
	uint64_t refused_wqes;  /* WQEs it refused (a bad opcode, flags, SGE count, length, AH): error completions */
	uint64_t corrupt_rings; /* rings whose index the program broke: their QP, SRQ or CQ to error */
	uint64_t doorbells;     /* doorbell wake-ups */
};

/* ------------------------------------------------------------------------------------------
 * The fault protocol (a SOCK_SEQPACKET socketpair per context: the provider's fault thread
 * holds one end, the device the other, passed at GET_CONTEXT)
 * ---------------------------------------------------------------------------------------- */

#define PFR_FAULT_MAGIC 0x46524650u /* "PFRF" */

enum pfr_fault_op {
	PFR_FAULT_REQUEST = 1,  /* device -> program: make [addr, addr+length) resident */
	PFR_FAULT_RESOLVED = 2, /* program -> device: the answer */
};

enum pfr_fault_flags {
	PFR_FAULT_WRITE = 1, /* the device will write: make the pages writable (a write fault) */
};

enum pfr_fault_method {
	PFR_FAULT_TOUCH = 1,    /* access each page from the fault thread, one by one */
	PFR_FAULT_POPULATE = 2, /* one MADV_POPULATE_(READ|WRITE) over the range: get_user_pages */
};

struct pfr_fault_request {
	uint32_t magic;       /* PFR_FAULT_MAGIC */
	uint16_t abi_version; /* PFR_ABI_VERSION */
	uint16_t op;          /* PFR_FAULT_REQUEST */
	uint64_t fault_id;    /* the device's; echoed */
	uint64_t addr;        /* page-aligned, inside the MR */
	uint64_t length;      /* a multiple of the page size, inside the MR */
	uint32_t mr_handle;   /* the MR the range belongs to */
	uint32_t flags;       /* enum pfr_fault_flags */
	uint32_t method;      /* enum pfr_fault_method */
	uint32_t reserved;
};
PFR_STATIC_ASSERT(sizeof(struct pfr_fault_request) == 48, "fault request");

struct pfr_fault_response {
	uint32_t magic;       /* PFR_FAULT_MAGIC */
	uint16_t abi_version; /* PFR_ABI_VERSION */
	uint16_t op;          /* PFR_FAULT_RESOLVED */
	uint64_t fault_id;
	int32_t status;       /* 0, or -errno: the pages could not be made resident */
	uint32_t pages;       /* pages the fault thread made resident */
	uint64_t ns;          /* the resolution's time on the fault thread */
};
PFR_STATIC_ASSERT(sizeof(struct pfr_fault_response) == 32, "fault response");

/* Async events (the context's async pipe) and completion events (a channel's pipe): fixed
 * records the device writes and the provider reads, each a single write() (< PIPE_BUF). */
enum pfr_element_kind {
	PFR_ELEMENT_DEVICE = 0,
	PFR_ELEMENT_CQ = 1,
	PFR_ELEMENT_QP = 2,
	PFR_ELEMENT_SRQ = 3,
	PFR_ELEMENT_PORT = 4,
};

struct pfr_async_event {
	uint32_t event_type;   /* enum ibv_event_type */
	uint32_t element_kind; /* enum pfr_element_kind */
	uint32_t handle;       /* the CQ, QP or SRQ handle; the port number */
	uint32_t reserved;
};

struct pfr_comp_event {
	uint32_t cq_handle;
	uint32_t reserved;
};

#endif /* PFR_DEVICE_ABI_H */
