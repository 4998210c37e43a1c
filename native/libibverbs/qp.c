/* Queue pairs, shared receive queues, XRC domains and address handles: their bookkeeping is
 * the device's (CREATE_*, MODIFY_QP with uverbs' own struct ib_uverbs_modify_qp, QUERY_QP),
 * their send and receive rings are mapped here; post.c writes work requests into them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider.h"

static int map_rings(struct pfr_qp *qp, int fd, const struct pfr_create_qp_resp *r)
{
	int err = pfr_ring_map(fd, r->ring_size, &qp->map);
	if (err)
		return err;
	qp->map_size = r->ring_size;
	qp->has_sq = r->sq_offset != UINT64_MAX;
	qp->has_rq = r->rq_offset != UINT64_MAX;
	if (qp->has_sq && (err = pfr_ring_attach(&qp->sq, qp->map, qp->map_size, r->sq_offset, PFR_QUEUE_SQ)))
		return err;
	if (qp->has_rq && (err = pfr_ring_attach(&qp->rq, qp->map, qp->map_size, r->rq_offset, PFR_QUEUE_RQ)))
		return err;
	return 0;
}

static uint32_t handle_of_cq(struct ibv_cq *cq)
{
	return cq ? PFR_OF(struct pfr_cq, ibv_cq, cq)->handle : PFR_NO_HANDLE;
}

/* CREATE_QP's body from the program's attributes (the device checks every field). */
static void qp_request(struct pfr_create_qp *req, const struct ibv_qp_init_attr_ex *a)
{
	req->pd_handle = a->comp_mask & IBV_QP_INIT_ATTR_PD && a->pd ? PFR_OF(struct pfr_pd, ibv_pd, a->pd)->handle : PFR_NO_HANDLE;
	req->xrcd_handle = a->comp_mask & IBV_QP_INIT_ATTR_XRCD && a->xrcd ? PFR_OF(struct pfr_xrcd, xrcd, a->xrcd)->handle
									    : PFR_NO_HANDLE;
	req->send_cq_handle = handle_of_cq(a->send_cq);
	req->recv_cq_handle = handle_of_cq(a->recv_cq);
	req->srq_handle = a->srq ? PFR_OF(struct pfr_srq, srq, a->srq)->handle : PFR_NO_HANDLE;
	req->qp_type = a->qp_type;
	req->max_send_wr = a->cap.max_send_wr;
	req->max_recv_wr = a->cap.max_recv_wr;
	req->max_send_sge = a->cap.max_send_sge;
	req->max_recv_sge = a->cap.max_recv_sge;
	req->max_inline_data = a->cap.max_inline_data;
	req->sq_sig_all = a->sq_sig_all ? 1 : 0;
}

/* The ibv_qp the program holds, and the capabilities the rings have, written back as libibverbs does. */
static void init_qp(struct pfr_qp *qp, struct ibv_context *context, struct ibv_qp_init_attr_ex *a, const struct pfr_create_qp_resp *r)
{
	qp->qp.context = context;
	qp->qp.qp_context = a->qp_context;
	qp->qp.pd = a->comp_mask & IBV_QP_INIT_ATTR_PD ? a->pd : NULL;
	qp->qp.send_cq = a->send_cq;
	qp->qp.recv_cq = a->recv_cq;
	qp->qp.srq = a->srq;
	qp->qp.handle = qp->handle;
	qp->qp.qp_num = r->qp_num;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = a->qp_type;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	a->cap.max_send_wr = r->max_send_wr;
	a->cap.max_recv_wr = r->max_recv_wr;
	a->cap.max_send_sge = r->max_send_sge;
	a->cap.max_recv_sge = r->max_recv_sge;
	a->cap.max_inline_data = r->max_inline_data;
	qp->max_send_sge = r->max_send_sge;
	qp->max_recv_sge = r->max_recv_sge;
	qp->max_inline = r->max_inline_data;
	pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq_lock, PTHREAD_PROCESS_PRIVATE);
}

struct ibv_qp *pfr_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a)
{
	struct pfr_context *ctx = to_pctx(context);
	const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	struct pfr_create_qp req = {0};
	struct pfr_create_qp_resp r;
	struct pfr_qp *qp;
	int fd = -1;
	int err;
	if (a->comp_mask & ~known || ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)) {
		errno = EOPNOTSUPP; /* the extended send API (ibv_wr_*), RSS, TSO and create flags: not yet */
		return NULL;
	}
	qp_request(&req, a);
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_call(&ctx->conn, PFR_OP_CREATE_QP, &req, sizeof(req), NULL, 0, &r, sizeof(r), &fd,
		       a->qp_type == IBV_QPT_XRC_RECV ? 0 : 1);
	if (err)
		goto fail;
	qp->handle = r.qp_handle;
	err = fd >= 0 ? map_rings(qp, fd, &r) : 0;
	if (!err) {
		pthread_mutex_lock(&ctx->objects_lock);
		err = pfr_table_set(&ctx->qps, qp->handle, qp);
		pthread_mutex_unlock(&ctx->objects_lock);
	}
	if (err) {
		if (qp->map)
			munmap(qp->map, qp->map_size);
		pfr_call_on(&ctx->conn, PFR_OP_DESTROY_QP, qp->handle, &(struct ib_uverbs_destroy_qp_resp){0},
			    sizeof(struct ib_uverbs_destroy_qp_resp));
		goto fail;
	}
	init_qp(qp, context, a, &r);
	return &qp->qp;
fail:
	free(qp);
	errno = err;
	return NULL;
}

PFR_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex a = {.qp_context = attr->qp_context, .send_cq = attr->send_cq, .recv_cq = attr->recv_cq,
					.srq = attr->srq, .cap = attr->cap, .qp_type = attr->qp_type,
					.sq_sig_all = attr->sq_sig_all, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd};
	struct ibv_qp *qp = pfr_create_qp_ex(pd->context, &a);
	if (qp)
		attr->cap = a.cap;
	return qp;
}

static void to_uverbs_dest(struct ib_uverbs_qp_dest *d, const struct ibv_ah_attr *ah)
{
	memcpy(d->dgid, ah->grh.dgid.raw, sizeof(d->dgid));
	d->flow_label = ah->grh.flow_label;
	d->dlid = ah->dlid;
	d->sgid_index = ah->grh.sgid_index;
	d->hop_limit = ah->grh.hop_limit;
	d->traffic_class = ah->grh.traffic_class;
	d->sl = ah->sl;
	d->src_path_bits = ah->src_path_bits;
	d->static_rate = ah->static_rate;
	d->is_global = ah->is_global;
	d->port_num = ah->port_num;
}

static void from_uverbs_dest(struct ibv_ah_attr *ah, const struct ib_uverbs_qp_dest *d)
{
	memcpy(ah->grh.dgid.raw, d->dgid, sizeof(d->dgid));
	ah->grh.flow_label = d->flow_label;
	ah->dlid = d->dlid;
	ah->grh.sgid_index = d->sgid_index;
	ah->grh.hop_limit = d->hop_limit;
	ah->grh.traffic_class = d->traffic_class;
	ah->sl = d->sl;
	ah->src_path_bits = d->src_path_bits;
	ah->static_rate = d->static_rate;
	ah->is_global = d->is_global;
	ah->port_num = d->port_num;
}

PFR_EXPORT int ibv_modify_qp(struct ibv_qp *ibv_qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct pfr_qp *qp = PFR_OF(struct pfr_qp, qp, ibv_qp);
	struct ib_uverbs_modify_qp m = {0};
	int err;
	if (attr_mask & IBV_QP_AV)
		to_uverbs_dest(&m.dest, &attr->ah_attr);
	if (attr_mask & IBV_QP_ALT_PATH)
		to_uverbs_dest(&m.alt_dest, &attr->alt_ah_attr);
	m.qp_handle = qp->handle;
	m.attr_mask = (uint32_t)attr_mask;
	m.qkey = attr->qkey;
	m.rq_psn = attr->rq_psn;
	m.sq_psn = attr->sq_psn;
	m.dest_qp_num = attr->dest_qp_num;
	m.qp_access_flags = (uint32_t)attr->qp_access_flags;
	m.pkey_index = attr->pkey_index;
	m.alt_pkey_index = attr->alt_pkey_index;
	m.qp_state = (uint8_t)attr->qp_state;
	m.cur_qp_state = (uint8_t)attr->cur_qp_state;
	m.path_mtu = (uint8_t)attr->path_mtu;
	m.path_mig_state = (uint8_t)attr->path_mig_state;
	m.en_sqd_async_notify = attr->en_sqd_async_notify;
	m.max_rd_atomic = attr->max_rd_atomic;
	m.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	m.min_rnr_timer = attr->min_rnr_timer;
	m.port_num = attr->port_num;
	m.timeout = attr->timeout;
	m.retry_cnt = attr->retry_cnt;
	m.rnr_retry = attr->rnr_retry;
	m.alt_port_num = attr->alt_port_num;
	m.alt_timeout = attr->alt_timeout;
	err = pfr_call(&to_pctx(ibv_qp->context)->conn, PFR_OP_MODIFY_QP, &m, sizeof(m), NULL, 0, NULL, 0, NULL, 0);
	if (!err && (attr_mask & IBV_QP_STATE))
		ibv_qp->state = attr->qp_state;
	return err;
}

PFR_EXPORT int ibv_query_qp(struct ibv_qp *ibv_qp, struct ibv_qp_attr *attr, int attr_mask,
			    struct ibv_qp_init_attr *init_attr)
{
	struct pfr_qp *qp = PFR_OF(struct pfr_qp, qp, ibv_qp);
	struct pfr_query_qp q = {.qp_handle = qp->handle, .attr_mask = (uint32_t)attr_mask};
	struct ib_uverbs_query_qp_resp r;
	int err = pfr_call(&to_pctx(ibv_qp->context)->conn, PFR_OP_QUERY_QP, &q, sizeof(q), NULL, 0, &r, sizeof(r), NULL, 0);
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = (enum ibv_qp_state)r.qp_state;
	attr->cur_qp_state = (enum ibv_qp_state)r.cur_qp_state;
	attr->path_mtu = (enum ibv_mtu)r.path_mtu;
	attr->path_mig_state = (enum ibv_mig_state)r.path_mig_state;
	attr->qkey = r.qkey;
	attr->rq_psn = r.rq_psn;
	attr->sq_psn = r.sq_psn;
	attr->dest_qp_num = r.dest_qp_num;
	attr->qp_access_flags = (unsigned int)r.qp_access_flags;
	attr->cap.max_send_wr = r.max_send_wr;
	attr->cap.max_recv_wr = r.max_recv_wr;
	attr->cap.max_send_sge = r.max_send_sge;
	attr->cap.max_recv_sge = r.max_recv_sge;
	attr->cap.max_inline_data = r.max_inline_data;
	from_uverbs_dest(&attr->ah_attr, &r.dest);
	from_uverbs_dest(&attr->alt_ah_attr, &r.alt_dest);
	attr->pkey_index = r.pkey_index;
	attr->alt_pkey_index = r.alt_pkey_index;
	attr->sq_draining = r.sq_draining;
	attr->max_rd_atomic = r.max_rd_atomic;
	attr->max_dest_rd_atomic = r.max_dest_rd_atomic;
	attr->min_rnr_timer = r.min_rnr_timer;
	attr->port_num = r.port_num;
	attr->timeout = r.timeout;
	attr->retry_cnt = r.retry_cnt;
	attr->rnr_retry = r.rnr_retry;
	attr->alt_port_num = r.alt_port_num;
	attr->alt_timeout = r.alt_timeout;
	if (init_attr) {
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = ibv_qp->qp_context;
		init_attr->send_cq = ibv_qp->send_cq;
		init_attr->recv_cq = ibv_qp->recv_cq;
		init_attr->srq = ibv_qp->srq;
		init_attr->qp_type = ibv_qp->qp_type;
		init_attr->cap = attr->cap;
		init_attr->sq_sig_all = r.sq_sig_all;
	}
	return 0;
}

PFR_EXPORT int ibv_destroy_qp(struct ibv_qp *ibv_qp)
{
	struct pfr_qp *qp = PFR_OF(struct pfr_qp, qp, ibv_qp);
	struct pfr_context *ctx = to_pctx(ibv_qp->context);
	struct ib_uverbs_destroy_qp_resp resp = {0};
	int err = pfr_call_on(&ctx->conn, PFR_OP_DESTROY_QP, qp->handle, &resp, sizeof(resp));
	if (err && err != EIO)
		return err;
	pthread_mutex_lock(&ibv_qp->mutex);
	while (ibv_qp->events_completed < resp.events_reported)
		pthread_cond_wait(&ibv_qp->cond, &ibv_qp->mutex);
	pthread_mutex_unlock(&ibv_qp->mutex);
	pthread_mutex_lock(&ctx->objects_lock);
	pfr_table_clear(&ctx->qps, qp->handle);
	pthread_mutex_unlock(&ctx->objects_lock);
	if (qp->map)
		munmap(qp->map, qp->map_size);
	free(qp);
	return 0;
}

struct ibv_srq *pfr_create_srq_ex(struct ibv_context *context, struct ibv_srq_init_attr_ex *a)
{
	struct pfr_context *ctx = to_pctx(context);
	const uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	struct pfr_create_srq req = {0};
	struct pfr_create_srq_resp r;
	struct pfr_srq *srq;
	int fd = -1;
	int err;
	if (a->comp_mask & ~known || !(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd) {
		errno = a->comp_mask & ~known ? EOPNOTSUPP : EINVAL; /* tag matching: not offered */
		return NULL;
	}
	req.pd_handle = PFR_OF(struct pfr_pd, ibv_pd, a->pd)->handle;
	req.srq_type = a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE ? a->srq_type : IBV_SRQT_BASIC;
	req.xrcd_handle = a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD && a->xrcd ? PFR_OF(struct pfr_xrcd, xrcd, a->xrcd)->handle
									    : PFR_NO_HANDLE;
	req.cq_handle = a->comp_mask & IBV_SRQ_INIT_ATTR_CQ ? handle_of_cq(a->cq) : PFR_NO_HANDLE;
	req.max_wr = a->attr.max_wr;
	req.max_sge = a->attr.max_sge;
	req.srq_limit = a->attr.srq_limit;
	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_call(&ctx->conn, PFR_OP_CREATE_SRQ, &req, sizeof(req), NULL, 0, &r, sizeof(r), &fd, 1);
	if (err)
		goto fail;
	srq->handle = r.srq_handle;
	srq->srq_num = r.srq_num;
	srq->map_size = r.ring_size;
	err = pfr_ring_map(fd, srq->map_size, &srq->map);
	if (!err)
		err = pfr_ring_attach(&srq->ring, srq->map, srq->map_size, 0, PFR_QUEUE_SRQ);
	if (!err) {
		pthread_mutex_lock(&ctx->objects_lock);
		err = pfr_table_set(&ctx->srqs, srq->handle, srq);
		pthread_mutex_unlock(&ctx->objects_lock);
	}
	if (err) {
		if (srq->map)
			munmap(srq->map, srq->map_size);
		pfr_call_on(&ctx->conn, PFR_OP_DESTROY_SRQ, srq->handle, &(struct ib_uverbs_destroy_srq_resp){0},
			    sizeof(struct ib_uverbs_destroy_srq_resp));
		goto fail;
	}
	srq->srq.context = context;
	srq->srq.srq_context = a->srq_context;
	srq->srq.pd = a->pd;
	srq->srq.handle = srq->handle;
	pthread_mutex_init(&srq->srq.mutex, NULL);
	pthread_cond_init(&srq->srq.cond, NULL);
	a->attr.max_wr = r.max_wr;
	a->attr.max_sge = r.max_sge;
	srq->max_sge = r.max_sge;
	pthread_spin_init(&srq->lock, PTHREAD_PROCESS_PRIVATE);
	return &srq->srq;
fail:
	free(srq);
	errno = err;
	return NULL;
}

PFR_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex a = {.srq_context = attr->srq_context, .attr = attr->attr,
					 .comp_mask = IBV_SRQ_INIT_ATTR_PD, .pd = pd};
	struct ibv_srq *srq = pfr_create_srq_ex(pd->context, &a);
	if (srq)
		attr->attr = a.attr;
	return srq;
}

PFR_EXPORT int ibv_modify_srq(struct ibv_srq *ibv_srq, struct ibv_srq_attr *attr, int attr_mask)
{
	struct pfr_srq *srq = PFR_OF(struct pfr_srq, srq, ibv_srq);
	struct pfr_modify_srq m = {.srq_handle = srq->handle, .attr_mask = (uint32_t)attr_mask, .max_wr = attr->max_wr,
				   .srq_limit = attr->srq_limit};
	return pfr_call(&to_pctx(ibv_srq->context)->conn, PFR_OP_MODIFY_SRQ, &m, sizeof(m), NULL, 0, NULL, 0, NULL, 0);
}

PFR_EXPORT int ibv_query_srq(struct ibv_srq *ibv_srq, struct ibv_srq_attr *attr)
{
	struct pfr_srq *srq = PFR_OF(struct pfr_srq, srq, ibv_srq);
	struct pfr_query_srq_resp r;
	int err = pfr_call_on(&to_pctx(ibv_srq->context)->conn, PFR_OP_QUERY_SRQ, srq->handle, &r, sizeof(r));
	if (err)
		return err;
	attr->max_wr = r.max_wr;
	attr->max_sge = r.max_sge;
	attr->srq_limit = r.srq_limit;
	return 0;
}

PFR_EXPORT int ibv_destroy_srq(struct ibv_srq *ibv_srq)
{
	struct pfr_srq *srq = PFR_OF(struct pfr_srq, srq, ibv_srq);
	struct pfr_context *ctx = to_pctx(ibv_srq->context);
	struct ib_uverbs_destroy_srq_resp resp = {0};
	int err = pfr_call_on(&ctx->conn, PFR_OP_DESTROY_SRQ, srq->handle, &resp, sizeof(resp));
	if (err && err != EIO)
		return err;
	pthread_mutex_lock(&ibv_srq->mutex);
	while (ibv_srq->events_completed < resp.events_reported)
		pthread_cond_wait(&ibv_srq->cond, &ibv_srq->mutex);
	pthread_mutex_unlock(&ibv_srq->mutex);
	pthread_mutex_lock(&ctx->objects_lock);
	pfr_table_clear(&ctx->srqs, srq->handle);
	pthread_mutex_unlock(&ctx->objects_lock);
	munmap(srq->map, srq->map_size);
	free(srq);
	return 0;
}

int pfr_get_srq_num(struct ibv_srq *ibv_srq, uint32_t *srq_num)
{
	*srq_num = PFR_OF(struct pfr_srq, srq, ibv_srq)->srq_num;
	return 0;
}

/* An XRC domain: one of this context's own, or, given a file (attr->fd), the device's domain of
 * that file's inode, which every process that opens the same file shares (as the kernel's). */
struct ibv_xrcd *pfr_open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr)
{
	const bool file = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) && attr->fd != -1;
	struct pfr_open_xrcd req = {.flags = file ? PFR_XRCD_FILE : 0,
				    .oflags = file && (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ? (uint32_t)attr->oflags : 0};
	struct pfr_xrcd *x;
	int err;
	if (attr->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS)) {
		errno = EINVAL;
		return NULL;
	}
	x = calloc(1, sizeof(*x));
	if (!x) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_call_handle(&to_pctx(context)->conn, PFR_OP_OPEN_XRCD, &req, sizeof(req), file ? &attr->fd : NULL, file ? 1 : 0,
			      &x->handle);
	if (err) {
		free(x);
		errno = err;
		return NULL;
	}
	x->xrcd.context = context;
	return &x->xrcd;
}

int pfr_close_xrcd(struct ibv_xrcd *xrcd)
{
	struct pfr_xrcd *x = PFR_OF(struct pfr_xrcd, xrcd, xrcd);
	int err = pfr_call_on(&to_pctx(xrcd->context)->conn, PFR_OP_CLOSE_XRCD, x->handle, NULL, 0);
	if (err && err != EIO)
		return err;
	free(x);
	return 0;
}

PFR_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct pfr_create_ah req = {.pd_handle = PFR_OF(struct pfr_pd, ibv_pd, pd)->handle};
	struct pfr_ah *ah = calloc(1, sizeof(*ah));
	int err;
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	memcpy(req.attr.grh.dgid, attr->grh.dgid.raw, sizeof(req.attr.grh.dgid));
	req.attr.grh.flow_label = attr->grh.flow_label;
	req.attr.grh.sgid_index = attr->grh.sgid_index;
	req.attr.grh.hop_limit = attr->grh.hop_limit;
	req.attr.grh.traffic_class = attr->grh.traffic_class;
	req.attr.dlid = attr->dlid;
	req.attr.sl = attr->sl;
	req.attr.src_path_bits = attr->src_path_bits;
	req.attr.static_rate = attr->static_rate;
	req.attr.is_global = attr->is_global;
	req.attr.port_num = attr->port_num;
	err = pfr_call_handle(&to_pctx(pd->context)->conn, PFR_OP_CREATE_AH, &req, sizeof(req), NULL, 0, &ah->handle);
	if (err) {
		free(ah);
		errno = err;
		return NULL;
	}
	ah->ibv_ah.context = pd->context;
	ah->ibv_ah.pd = pd;
	ah->ibv_ah.handle = ah->handle;
	return &ah->ibv_ah;
}

PFR_EXPORT int ibv_destroy_ah(struct ibv_ah *ibv_ah)
{
	struct pfr_ah *ah = PFR_OF(struct pfr_ah, ibv_ah, ibv_ah);
	int err = pfr_call_on(&to_pctx(ibv_ah->context)->conn, PFR_OP_DESTROY_AH, ah->handle, NULL, 0);
	if (err && err != EIO)
		return err;
	free(ah);
	return 0;
}

/* A UD receive carries no GRH here (wc_flags without IBV_WC_GRH): the AH names the sender by
 * its LID fields, this host's fabric. */
PFR_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc, struct ibv_grh *grh,
				   struct ibv_ah_attr *ah_attr)
{
	(void)context, (void)grh;
	memset(ah_attr, 0, sizeof(*ah_attr));
	if (wc->wc_flags & IBV_WC_GRH)
		return EOPNOTSUPP;
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	return 0;
}

PFR_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr attr;
	int err = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr);
	if (err) {
		errno = err;
		return NULL;
	}
	return ibv_create_ah(pd, &attr);
}

PFR_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	errno = EOPNOTSUPP; /* no QP is made with the extended send API yet */
	return NULL;
}

PFR_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp, (void)op, (void)flags;
	return 0; /* no in-order promise beyond the completion */
}

PFR_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return EOPNOTSUPP; /* multicast: not offered */
}

PFR_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return EOPNOTSUPP;
}

PFR_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP; /* enhanced connection establishment: no vendor options to negotiate */
}

PFR_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP;
}

void pfr_release_objects(struct pfr_context *ctx)
{
	/* The device releases the objects when the connection closes; here only the mappings and
	 * the memory of what the program left, and the tables. */
	pthread_mutex_lock(&ctx->objects_lock);
	for (uint32_t i = 0; i < ctx->qps.size; i++) {
		struct pfr_qp *qp = ctx->qps.slots[i];
		if (qp && qp->map)
			munmap(qp->map, qp->map_size);
		free(qp);
	}
	for (uint32_t i = 0; i < ctx->srqs.size; i++) {
		struct pfr_srq *srq = ctx->srqs.slots[i];
		if (srq)
			munmap(srq->map, srq->map_size);
		free(srq);
	}
	for (uint32_t i = 0; i < ctx->cqs.size; i++) {
		struct pfr_cq *cq = ctx->cqs.slots[i];
		if (cq)
			munmap(cq->map, cq->map_size);
		free(cq);
	}
	for (uint32_t i = 0; i < ctx->mrs.size; i++) {
		struct pfr_mr *mr = ctx->mrs.slots[i];
		if (mr && mr->pinned)
			munlock(mr->ibv_mr.addr, mr->ibv_mr.length);
		free(mr);
	}
	pfr_table_free(&ctx->qps);
	pfr_table_free(&ctx->srqs);
	pfr_table_free(&ctx->cqs);
	pfr_table_free(&ctx->mrs);
	pthread_mutex_unlock(&ctx->objects_lock);
}
