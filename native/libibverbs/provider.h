/* The project's libibverbs.so.1: a libibverbs and its provider in one library, over the
 * device process (kernel-sim/device) instead of a kernel driver. The programs' ABI is
 * libibverbs-dev's <infiniband/verbs.h>; what the library shares with the device is
 * native/device/abi.h (docs/device-abi.md). The objects below embed the ibv_* structs the
 * programs see, first or where verbs.h says, as providers/rxe/rxe.h does. */
#ifndef PFR_PROVIDER_H
#define PFR_PROVIDER_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../device/abi.h"

#define PFR_EXPORT __attribute__((visibility("default")))

/* The device as ibv_get_device_list lists it. Its head is laid out as rdma-core's struct
 * verbs_device (the ibv_device, then a pointer to its driver's ops), so a Debian provider
 * library that asks "is this device mine?" (mlx5dv_is_supported, efadv_query_device) finds an
 * ops pointer that is none of its own and answers no. */
struct pfr_device {
	struct ibv_device device;
	const void *driver_ops; /* NULL: no rdma-core driver's */
	uint64_t node_guid;     /* big-endian, as the device sent it */
	uint32_t flags;         /* enum pfr_info_flags */
	uint32_t index;
};

/* One connection to the device's control socket. One request at a time (the mutex). */
struct pfr_conn {
	int fd;
	uint32_t next_id;
	int timeout_ms;
	bool dead; /* the device went away or broke the protocol: every call fails with EIO */
	pthread_mutex_t lock;
};

/* Objects by handle, per context: the device's handles, the provider's objects. */
struct pfr_table {
	void **slots;
	uint32_t size;
};

struct pfr_mr {
	struct ibv_mr ibv_mr;
	uint32_t handle;
	bool pinned; /* mlock'd at registration */
	bool implicit;
};

struct pfr_context {
	struct verbs_context vctx; /* its ibv_context is what the program holds */
	struct pfr_conn conn;
	uint32_t handle;
	uint32_t flags;     /* enum pfr_info_flags: PFR_INFO_DATA_PATH once the device consumes rings */
	uint32_t device_pid;
	int doorbell_fd;    /* eventfd the device waits on */
	struct pfr_doorbell_page *doorbell;
	int fault_fd;       /* the fault thread's end of the fault socket */
	pthread_t fault_thread;
	bool fault_thread_started;
	atomic_bool stopping;
	atomic_bool device_gone; /* the fault socket ended while the context lived: the device died */
	pthread_mutex_t objects_lock; /* the tables below, and the MRs the fault thread checks */
	struct pfr_table mrs;
	struct pfr_table cqs;
	struct pfr_table qps;
	struct pfr_table srqs;
};

/* One ring as the provider maps it: the device's geometry, copied at creation. */
struct pfr_ring {
	struct pfr_queue_buf *buf;
	uint32_t num_elems;
	uint32_t log2_elem_size;
};

struct pfr_cq {
	struct ibv_cq ibv_cq;
	uint32_t handle;
	void *map;
	size_t map_size;
	struct pfr_ring ring;
	pthread_spinlock_t lock; /* the consumer side: poll and arm */
	uint32_t arm_sn;
	uint32_t empty_polls; /* polls in a row that found nothing */
};

/* Empty polls of a CQ before poll_cq yields the CPU once (sched_yield), to the device. */
#define PFR_POLLS_BEFORE_YIELD 64

struct pfr_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qp_ex; /* starts with the ibv_qp: programs hold either */
	};
	uint32_t handle;
	void *map;
	size_t map_size;
	struct pfr_ring sq; /* the rings the posts produce into (post.c) */
	struct pfr_ring rq;
	bool has_sq, has_rq;
	/* What the rings hold, as CREATE_QP answered: each WR is checked against it before it is written. */
	uint32_t max_send_sge, max_recv_sge, max_inline;
	pthread_spinlock_t sq_lock, rq_lock; /* one producer per ring */
};

struct pfr_srq {
	struct ibv_srq srq;
	uint32_t handle;
	uint32_t srq_num;
	void *map;
	size_t map_size;
	struct pfr_ring ring;
	uint32_t max_sge;
	pthread_spinlock_t lock;
};

struct pfr_pd {
	struct ibv_pd ibv_pd;
	uint32_t handle;
};

struct pfr_ah {
	struct ibv_ah ibv_ah;
	uint32_t handle;
};

struct pfr_xrcd {
	struct ibv_xrcd xrcd;
	uint32_t handle;
};

struct pfr_channel {
	struct ibv_comp_channel ibv_channel;
	uint32_t handle;
};

static inline struct pfr_context *to_pctx(struct ibv_context *c)
{
	return (struct pfr_context *)((char *)c - offsetof(struct pfr_context, vctx.context));
}
#define PFR_OF(type, member, ptr) ((type *)((char *)(ptr) - offsetof(type, member)))

/* control.c */
int pfr_runtime_dir(char *out, size_t size);
int pfr_connect(struct pfr_conn *c);
void pfr_disconnect(struct pfr_conn *c);
/* One request and its reply. Returns 0 or a positive errno (the device's, or EIO, ETIMEDOUT);
 * the reply body must be exactly reply_len bytes and carry exactly nrfds descriptors. */
int pfr_call(struct pfr_conn *c, uint16_t op, const void *body, size_t len, const int *fds, int nfds, void *reply,
	     size_t reply_len, int *rfds, int nrfds);
/* A call that answers with a struct pfr_handle. */
int pfr_call_handle(struct pfr_conn *c, uint16_t op, const void *body, size_t len, const int *fds, int nfds,
		    uint32_t *handle);
/* A call whose body is one handle and whose reply is `reply_len` bytes (0: none). */
int pfr_call_on(struct pfr_conn *c, uint16_t op, uint32_t handle, void *reply, size_t reply_len);
void pfr_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* table.c */
int pfr_table_set(struct pfr_table *t, uint32_t handle, void *obj);
void *pfr_table_get(struct pfr_table *t, uint32_t handle);
void pfr_table_clear(struct pfr_table *t, uint32_t handle);
void pfr_table_free(struct pfr_table *t);

/* device.c */
void pfr_set_ops(struct pfr_context *ctx);

/* rings.c */
int pfr_ring_map(int fd, size_t size, void **map);
int pfr_ring_attach(struct pfr_ring *r, void *map, size_t map_size, uint64_t offset, uint16_t kind);

/* post.c: the producer's step and the doorbell (docs/device-abi.md §2, §3) */
void pfr_ring_doorbell(struct pfr_context *ctx);

/* fault_thread.c */
int pfr_fault_thread_start(struct pfr_context *ctx);
void pfr_fault_thread_stop(struct pfr_context *ctx);

/* query.c, memory.c, cq.c, qp.c: the ops pfr_set_ops puts in the context */
int pfr_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t attr_size);
int pfr_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr, size_t len);
int pfr_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, struct ibv_sge *sg_list,
		  uint32_t num_sge);
int pfr_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int pfr_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int pfr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int pfr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int pfr_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
struct ibv_qp *pfr_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr);
struct ibv_srq *pfr_create_srq_ex(struct ibv_context *context, struct ibv_srq_init_attr_ex *attr);
int pfr_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num);
struct ibv_xrcd *pfr_open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr);
int pfr_close_xrcd(struct ibv_xrcd *xrcd);

/* Release everything of a context whose objects the program did not destroy (close_device). */
void pfr_release_objects(struct pfr_context *ctx);

#endif
