/* Completion queues and channels. A CQ is a ring the device produces into and this library
 * consumes (ibv_poll_cq copies each struct ib_uverbs_wc out, as providers/rxe does); arming it
 * is a store in its header, and the device writes the CQ's handle into the channel's pipe when
 * an armed CQ gets its next completion (docs/device-abi.md §2). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider.h"

PFR_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct pfr_channel *ch = calloc(1, sizeof(*ch));
	int p[2];
	int err;
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	if (pipe2(p, O_CLOEXEC) != 0) {
		err = errno;
		free(ch);
		errno = err;
		return NULL;
	}
	err = pfr_call_handle(&to_pctx(context)->conn, PFR_OP_CREATE_COMP_CHANNEL, NULL, 0, &p[1], 1, &ch->handle);
	close(p[1]);
	if (err) {
		close(p[0]);
		free(ch);
		errno = err;
		return NULL;
	}
	ch->ibv_channel.context = context;
	ch->ibv_channel.fd = p[0];
	return &ch->ibv_channel;
}

PFR_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct pfr_channel *ch = PFR_OF(struct pfr_channel, ibv_channel, channel);
	int err = pfr_call_on(&to_pctx(channel->context)->conn, PFR_OP_DESTROY_COMP_CHANNEL, ch->handle, NULL, 0);
	if (err && err != EIO)
		return err;
	close(channel->fd);
	free(ch);
	return 0;
}

PFR_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
					struct ibv_comp_channel *channel, int comp_vector)
{
	struct pfr_context *ctx = to_pctx(context);
	struct pfr_create_cq req = {.cqe = (uint32_t)cqe, .comp_vector = (uint32_t)comp_vector,
				    .channel_handle = channel ? PFR_OF(struct pfr_channel, ibv_channel, channel)->handle
							      : PFR_NO_HANDLE};
	struct pfr_create_cq_resp resp;
	struct pfr_cq *cq;
	int fd = -1;
	int err;
	if (cqe <= 0 || comp_vector < 0) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_call(&ctx->conn, PFR_OP_CREATE_CQ, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), &fd, 1);
	if (err)
		goto fail;
	cq->handle = resp.cq_handle;
	cq->map_size = resp.ring_size;
	err = pfr_ring_map(fd, cq->map_size, &cq->map);
	if (!err)
		err = pfr_ring_attach(&cq->ring, cq->map, cq->map_size, 0, PFR_QUEUE_CQ);
	if (!err) {
		pthread_mutex_lock(&ctx->objects_lock);
		err = pfr_table_set(&ctx->cqs, cq->handle, cq);
		pthread_mutex_unlock(&ctx->objects_lock);
	}
	if (err) {
		if (cq->map)
			munmap(cq->map, cq->map_size);
		pfr_call_on(&ctx->conn, PFR_OP_DESTROY_CQ, cq->handle, &(struct ib_uverbs_destroy_cq_resp){0},
			    sizeof(struct ib_uverbs_destroy_cq_resp));
		goto fail;
	}
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	cq->ibv_cq.context = context;
	cq->ibv_cq.channel = channel;
	cq->ibv_cq.cq_context = cq_context;
	cq->ibv_cq.handle = cq->handle;
	cq->ibv_cq.cqe = (int)resp.cqe;
	pthread_mutex_init(&cq->ibv_cq.mutex, NULL);
	pthread_cond_init(&cq->ibv_cq.cond, NULL);
	return &cq->ibv_cq;
fail:
	free(cq);
	errno = err;
	return NULL;
}

PFR_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq, (void)cqe;
	return EOPNOTSUPP; /* a CQ keeps the size it was made with */
}

PFR_EXPORT int ibv_destroy_cq(struct ibv_cq *ibv_cq)
{
	struct pfr_cq *cq = PFR_OF(struct pfr_cq, ibv_cq, ibv_cq);
	struct pfr_context *ctx = to_pctx(ibv_cq->context);
	struct ib_uverbs_destroy_cq_resp resp = {0};
	int err = pfr_call_on(&ctx->conn, PFR_OP_DESTROY_CQ, cq->handle, &resp, sizeof(resp));
	if (err && err != EIO)
		return err;
	/* As libibverbs: the events the device reported must all be acknowledged first. */
	pthread_mutex_lock(&ibv_cq->mutex);
	while (ibv_cq->comp_events_completed < resp.comp_events_reported ||
	       ibv_cq->async_events_completed < resp.async_events_reported)
		pthread_cond_wait(&ibv_cq->cond, &ibv_cq->mutex);
	pthread_mutex_unlock(&ibv_cq->mutex);
	pthread_mutex_lock(&ctx->objects_lock);
	pfr_table_clear(&ctx->cqs, cq->handle);
	pthread_mutex_unlock(&ctx->objects_lock);
	munmap(cq->map, cq->map_size);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

static void copy_wc(struct ibv_wc *wc, const struct ib_uverbs_wc *u)
{
	wc->wr_id = u->wr_id;
	wc->status = (enum ibv_wc_status)u->status;
	wc->opcode = (enum ibv_wc_opcode)u->opcode;
	wc->vendor_err = u->vendor_err;
	wc->byte_len = u->byte_len;
	wc->imm_data = u->ex.imm_data;
	wc->qp_num = u->qp_num;
	wc->src_qp = u->src_qp;
	wc->wc_flags = u->wc_flags;
	wc->pkey_index = u->pkey_index;
	wc->slid = u->slid;
	wc->sl = u->sl;
	wc->dlid_path_bits = u->dlid_path_bits;
}

int pfr_poll_cq(struct ibv_cq *ibv_cq, int num_entries, struct ibv_wc *wc)
{
	struct pfr_cq *cq = PFR_OF(struct pfr_cq, ibv_cq, ibv_cq);
	struct pfr_queue_buf *q = cq->ring.buf;
	uint32_t cons, prod;
	int n = 0;
	pthread_spin_lock(&cq->lock);
	cons = atomic_load_explicit((_Atomic uint32_t *)&q->consumer_index, memory_order_relaxed);
	prod = atomic_load_explicit((_Atomic uint32_t *)&q->producer_index, memory_order_acquire);
	if (prod - cons > cq->ring.num_elems) {
		pthread_spin_unlock(&cq->lock);
		errno = EIO; /* the device wrote an index past the ring: nothing in it can be trusted */
		return -1;
	}
	for (; n < num_entries && cons != prod; n++, cons++) {
		const struct pfr_cqe *e =
			(const struct pfr_cqe *)(q->data + ((size_t)(cons & (cq->ring.num_elems - 1)) << cq->ring.log2_elem_size));
		copy_wc(&wc[n], &e->wc);
	}
	atomic_store_explicit((_Atomic uint32_t *)&q->consumer_index, cons, memory_order_release);
	/* The device is a process of this host: a program that spins on an empty CQ takes the CPU
	 * the device needs to complete its work. After a run of empty polls, give it up once. */
	if (n == 0 && atomic_load_explicit(&to_pctx(ibv_cq->context)->device_gone, memory_order_relaxed)) {
		pthread_spin_unlock(&cq->lock);
		errno = EIO; /* the device died: what it wrote was read, nothing more will come */
		return -1;
	}
	if (n == 0 && ++cq->empty_polls >= PFR_POLLS_BEFORE_YIELD) {
		cq->empty_polls = 0;
		pthread_spin_unlock(&cq->lock);
		sched_yield();
		return 0;
	}
	if (n)
		cq->empty_polls = 0;
	pthread_spin_unlock(&cq->lock);
	return n;
}

int pfr_req_notify_cq(struct ibv_cq *ibv_cq, int solicited_only)
{
	struct pfr_cq *cq = PFR_OF(struct pfr_cq, ibv_cq, ibv_cq);
	struct pfr_queue_buf *q = cq->ring.buf;
	pthread_spin_lock(&cq->lock);
	atomic_store_explicit((_Atomic uint32_t *)&q->arm_solicited, solicited_only ? 1 : 0, memory_order_relaxed);
	atomic_store_explicit((_Atomic uint32_t *)&q->arm_sn, ++cq->arm_sn, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	pthread_spin_unlock(&cq->lock);
	return 0;
}

PFR_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct pfr_context *ctx = to_pctx(channel->context);
	struct pfr_comp_event e;
	struct pfr_cq *found;
	ssize_t n;
	while ((n = read(channel->fd, &e, sizeof(e))) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)sizeof(e)) {
		if (n >= 0)
			errno = EIO; /* the device went away, or wrote a broken record */
		return -1;
	}
	pthread_mutex_lock(&ctx->objects_lock);
	found = pfr_table_get(&ctx->cqs, e.cq_handle);
	pthread_mutex_unlock(&ctx->objects_lock);
	if (!found || found->ibv_cq.channel != channel) {
		errno = EIO;
		return -1;
	}
	*cq = &found->ibv_cq;
	*cq_context = found->ibv_cq.cq_context;
	return 0;
}

PFR_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}
