/* The data path's producer side (docs/device-abi.md §2, §3), as providers/rxe posts: every
 * work request is checked here first (its opcode for the QP's type, its SGE count, its inline
 * size, room in the ring), then written into the next slot of the mapped ring, and the
 * producer index is published with a release store; after the list, one doorbell if the
 * device sleeps. A WR that fails a check is *bad_wr and nothing from it on is posted. Keys and
 * addresses are the device's to check: it copies each WQE out before it looks at it. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "provider.h"

static inline uint32_t load_acquire(const uint32_t *p)
{
	return atomic_load_explicit((_Atomic uint32_t *)p, memory_order_acquire);
}

static inline void store_release(uint32_t *p, uint32_t v)
{
	atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release);
}

/* The slot of the next entry, or NULL if the ring is full (or its consumer index is corrupt). */
static void *next_slot(struct pfr_ring *r, uint32_t *prod)
{
	struct pfr_queue_buf *q = r->buf;
	uint32_t p = atomic_load_explicit((_Atomic uint32_t *)&q->producer_index, memory_order_relaxed);
	uint32_t c = load_acquire(&q->consumer_index);
	if (p - c >= r->num_elems)
		return NULL;
	*prod = p;
	return q->data + ((size_t)(p & (r->num_elems - 1)) << r->log2_elem_size);
}

/* Docs §3: store (the producer index), full fence, load device_sleeping; write the eventfd if it sleeps. */
void pfr_ring_doorbell(struct pfr_context *ctx)
{
	uint64_t one = 1;
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit((_Atomic uint32_t *)&ctx->doorbell->device_sleeping, memory_order_relaxed))
		return;
	if (write(ctx->doorbell_fd, &one, sizeof(one)) == (ssize_t)sizeof(one))
		atomic_fetch_add_explicit((_Atomic uint64_t *)&ctx->doorbell->doorbells_rung, 1, memory_order_relaxed);
	/* EAGAIN: the counter is at its limit, the device has a wake-up pending anyway */
}

/* 0 if the data path runs, or why not: a device that does not consume rings, or one in its fatal state. */
static int data_path(struct pfr_context *ctx)
{
	if (!(ctx->flags & PFR_INFO_DATA_PATH))
		return ENOSYS;
	if (ctx->conn.dead || atomic_load_explicit(&ctx->device_gone, memory_order_relaxed) ||
	    atomic_load_explicit((_Atomic uint32_t *)&ctx->doorbell->device_state, memory_order_relaxed) != PFR_DEVICE_RUNNING)
		return EIO;
	return 0;
}

static bool opcode_fits(enum ibv_qp_type type, enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return type == IBV_QPT_RC || type == IBV_QPT_UD || type == IBV_QPT_XRC_SEND;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
	default:
		return false; /* LOCAL_INV, BIND_MW, SEND_WITH_INV, TSO, DRIVER1: not offered (FLUSH and
			       * ATOMIC_WRITE are the extended API's, ibv_wr_*) */
	}
}

static const unsigned SEND_FLAGS = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

static int check_send(struct pfr_qp *qp, const struct ibv_send_wr *wr, uint64_t *inline_len)
{
	const size_t room = ((size_t)1 << qp->sq.log2_elem_size) - sizeof(struct pfr_send_wqe);
	if (!opcode_fits(qp->qp.qp_type, wr->opcode) || (wr->send_flags & ~SEND_FLAGS))
		return EINVAL;
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_send_sge || (wr->num_sge && !wr->sg_list))
		return EINVAL;
	if (qp->qp.qp_type == IBV_QPT_UD && !wr->wr.ud.ah)
		return EINVAL;
	*inline_len = 0;
	if (wr->send_flags & IBV_SEND_INLINE) {
		/* Inline data is the bytes of a SEND or a WRITE, copied now: not a READ's or an atomic's sink. */
		if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM && wr->opcode != IBV_WR_RDMA_WRITE &&
		    wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
			return EINVAL;
		for (int i = 0; i < wr->num_sge; i++)
			*inline_len += wr->sg_list[i].length;
		if (*inline_len > qp->max_inline || *inline_len > room)
			return EINVAL;
	} else if ((size_t)wr->num_sge * sizeof(struct rxe_sge) > room) {
		return EINVAL;
	}
	return 0;
}

static void write_send(struct pfr_qp *qp, uint8_t *slot, const struct ibv_send_wr *wr, uint64_t inline_len)
{
	struct pfr_send_wqe w;
	uint32_t length = 0;
	memset(&w, 0, sizeof(w));
	w.wr.wr_id = wr->wr_id;
	w.wr.opcode = wr->opcode;
	w.wr.send_flags = wr->send_flags;
	if (wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		w.wr.ex.imm_data = wr->imm_data;
	if (qp->qp.qp_type == IBV_QPT_XRC_SEND)
		w.wr.xrc_remote_srqn = wr->qp_type.xrc.remote_srqn;
	switch (wr->opcode) {
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		w.wr.wr.atomic.remote_addr = wr->wr.atomic.remote_addr;
		w.wr.wr.atomic.compare_add = wr->wr.atomic.compare_add;
		w.wr.wr.atomic.swap = wr->wr.atomic.swap;
		w.wr.wr.atomic.rkey = wr->wr.atomic.rkey;
		break;
	default:
		if (qp->qp.qp_type == IBV_QPT_UD) {
			w.wr.wr.ud.remote_qpn = wr->wr.ud.remote_qpn;
			w.wr.wr.ud.remote_qkey = wr->wr.ud.remote_qkey;
			w.wr.wr.ud.ah_handle = PFR_OF(struct pfr_ah, ibv_ah, wr->wr.ud.ah)->handle;
		} else {
			w.wr.wr.rdma.remote_addr = wr->wr.rdma.remote_addr;
			w.wr.wr.rdma.rkey = wr->wr.rdma.rkey;
		}
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		uint8_t *p = slot + sizeof(w);
		for (int i = 0; i < wr->num_sge; i++) {
			memcpy(p, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			p += wr->sg_list[i].length;
		}
		length = (uint32_t)inline_len;
	} else {
		struct rxe_sge *s = (struct rxe_sge *)(slot + sizeof(w));
		for (int i = 0; i < wr->num_sge; i++) {
			s[i].addr = wr->sg_list[i].addr;
			s[i].length = wr->sg_list[i].length;
			s[i].lkey = wr->sg_list[i].lkey;
				length += wr->sg_list[i].length;
		}
		w.dma.num_sge = (uint32_t)wr->num_sge;
	}
	w.dma.length = length;
	w.dma.resid = length;
	memcpy(slot, &w, sizeof(w));
}

int pfr_post_send(struct ibv_qp *ibv_qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct pfr_qp *qp = PFR_OF(struct pfr_qp, qp, ibv_qp);
	struct pfr_context *ctx = to_pctx(ibv_qp->context);
	int err = data_path(ctx);
	bool posted = false;
	if (!err && !qp->has_sq)
		err = EINVAL; /* an XRC_RECV QP sends nothing */
	if (err) {
		*bad_wr = wr;
		return err;
	}
	pthread_spin_lock(&qp->sq_lock);
	for (; wr; wr = wr->next) {
		uint64_t inline_len;
		uint32_t prod;
		uint8_t *slot;
		if ((err = check_send(qp, wr, &inline_len)))
			break;
		if (!(slot = next_slot(&qp->sq, &prod))) {
			err = ENOMEM;
			break;
		}
		write_send(qp, slot, wr, inline_len);
		store_release(&qp->sq.buf->producer_index, prod + 1);
		posted = true;
	}
	pthread_spin_unlock(&qp->sq_lock);
	if (posted)
		pfr_ring_doorbell(ctx);
	if (err)
		*bad_wr = wr;
	return err;
}

/* One receive into `r` (an RQ or an SRQ), checked against `max_sge`. */
static int post_recv_one(struct pfr_ring *r, uint32_t max_sge, const struct ibv_recv_wr *wr)
{
	const size_t room = ((size_t)1 << r->log2_elem_size) - sizeof(struct pfr_recv_wqe);
	struct pfr_recv_wqe w;
	struct rxe_sge *s;
	uint8_t *slot;
	uint32_t prod;
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge || (size_t)wr->num_sge * sizeof(*s) > room ||
	    (wr->num_sge && !wr->sg_list))
		return EINVAL;
	if (!(slot = next_slot(r, &prod)))
		return ENOMEM;
	memset(&w, 0, sizeof(w));
	w.wr_id = wr->wr_id;
	s = (struct rxe_sge *)(slot + sizeof(w));
	for (int i = 0; i < wr->num_sge; i++) {
		s[i].addr = wr->sg_list[i].addr;
		s[i].length = wr->sg_list[i].length;
		s[i].lkey = wr->sg_list[i].lkey;
		w.dma.length += wr->sg_list[i].length;
	}
	w.dma.resid = w.dma.length;
	w.dma.num_sge = (uint32_t)wr->num_sge;
	memcpy(slot, &w, sizeof(w));
	store_release(&r->buf->producer_index, prod + 1);
	return 0;
}

static int post_recvs(struct pfr_context *ctx, struct pfr_ring *r, uint32_t max_sge, pthread_spinlock_t *lock,
		      struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	int err = data_path(ctx);
	bool posted = false;
	if (err) {
		*bad_wr = wr;
		return err;
	}
	pthread_spin_lock(lock);
	for (; wr; wr = wr->next, posted = true)
		if ((err = post_recv_one(r, max_sge, wr)))
			break;
	pthread_spin_unlock(lock);
	if (posted)
		pfr_ring_doorbell(ctx);
	if (err)
		*bad_wr = wr;
	return err;
}

int pfr_post_recv(struct ibv_qp *ibv_qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct pfr_qp *qp = PFR_OF(struct pfr_qp, qp, ibv_qp);
	if (!qp->has_rq) {
		*bad_wr = wr;
		return EINVAL; /* a QP of an SRQ, or an XRC QP: its receives are the SRQ's */
	}
	return post_recvs(to_pctx(ibv_qp->context), &qp->rq, qp->max_recv_sge, &qp->rq_lock, wr, bad_wr);
}

int pfr_post_srq_recv(struct ibv_srq *ibv_srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct pfr_srq *srq = PFR_OF(struct pfr_srq, srq, ibv_srq);
	return post_recvs(to_pctx(ibv_srq->context), &srq->ring, srq->max_sge, &srq->lock, wr, bad_wr);
}
