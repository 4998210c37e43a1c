/* Devices and contexts: ibv_get_device_list asks the device process (rdma-core reads sysfs;
 * there is no kernel device here), ibv_open_device opens a connection of its own and sets the
 * context up the way a provider does (providers/rxe/rxe.c: the ops the inline verbs call),
 * lets the device in to this process's memory and starts the fault thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

/* The devices listed so far: kept for the life of the process (contexts point at them). */
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pfr_device *known_device;

static struct pfr_device *device_from_info(const struct pfr_device_info *info)
{
	struct pfr_device *d = known_device;
	char name[PFR_DEVICE_NAME_MAX];
	memcpy(name, info->name, sizeof(name));
	name[sizeof(name) - 1] = 0;
	if (d && strcmp(d->device.name, name) == 0 && d->node_guid == info->node_guid) {
		d->flags = info->flags;
		return d;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->device.node_type = (enum ibv_node_type)info->node_type;
	d->device.transport_type = (enum ibv_transport_type)info->transport_type;
	snprintf(d->device.name, sizeof(d->device.name), "%s", name);
	snprintf(d->device.dev_name, sizeof(d->device.dev_name), "uverbs-%s", name);
	pfr_runtime_dir(d->device.dev_path, sizeof(d->device.dev_path));
	snprintf(d->device.ibdev_path, sizeof(d->device.ibdev_path), "%s", d->device.dev_path);
	d->node_guid = info->node_guid;
	d->flags = info->flags;
	known_device = d; /* an earlier one (another device since) stays allocated: contexts may hold it */
	return d;
}

PFR_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	static bool warned;
	struct pfr_conn c;
	struct pfr_device_info info;
	struct ibv_device **list = calloc(2, sizeof(*list));
	int err;
	if (num_devices)
		*num_devices = 0;
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_connect(&c);
	if (!err) {
		err = pfr_call(&c, PFR_OP_QUERY_INFO, NULL, 0, NULL, 0, &info, sizeof(info), NULL, 0);
		pfr_disconnect(&c);
	}
	if (err) {
		char dir[256];
		if (!warned && !getenv("PFR_QUIET") && pfr_runtime_dir(dir, sizeof(dir)) == 0)
			pfr_warn("no device process at %s/device.sock (%s): start one with `pagefault-rdma device`, "
				 "or run the program under `pagefault-rdma exec`", dir, strerror(err));
		warned = true;
		return list; /* no device, as rdma-core says with no RDMA hardware */
	}
	pthread_mutex_lock(&devices_lock);
	list[0] = (struct ibv_device *)device_from_info(&info);
	if (list[0])
		((struct pfr_device *)list[0])->index = 0;
	pthread_mutex_unlock(&devices_lock);
	if (list[0] && num_devices)
		*num_devices = 1;
	return list;
}

PFR_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

PFR_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

PFR_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return ((struct pfr_device *)device)->node_guid;
}

PFR_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return (int)((struct pfr_device *)device)->index;
}

void pfr_set_ops(struct pfr_context *ctx)
{
	struct verbs_context *v = &ctx->vctx;
	struct ibv_context_ops *ops = &v->context.ops;
	ops->poll_cq = pfr_poll_cq;
	ops->req_notify_cq = pfr_req_notify_cq;
	ops->post_send = pfr_post_send;
	ops->post_recv = pfr_post_recv;
	ops->post_srq_recv = pfr_post_srq_recv;
	v->query_port = pfr_query_port;
	v->advise_mr = pfr_advise_mr;
	v->query_device_ex = pfr_query_device_ex;
	v->create_qp_ex = pfr_create_qp_ex;
	v->create_srq_ex = pfr_create_srq_ex;
	v->get_srq_num = pfr_get_srq_num;
	v->open_xrcd = pfr_open_xrcd;
	v->close_xrcd = pfr_close_xrcd;
	v->sz = sizeof(*v);
	v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
}

/* GET_CONTEXT: the async pipe's write end, the doorbell eventfd and the device's end of the
 * fault socket go to the device; the doorbell page comes back. */
static int get_context(struct pfr_context *ctx, int async_w, int fault_dev)
{
	struct pfr_get_context req = {.provider_abi = PFR_ABI_VERSION};
	struct pfr_get_context_resp resp;
	int fds[3] = {async_w, ctx->doorbell_fd, fault_dev};
	int page_fd = -1;
	void *page;
	int err = pfr_call(&ctx->conn, PFR_OP_GET_CONTEXT, &req, sizeof(req), fds, 3, &resp, sizeof(resp), &page_fd, 1);
	if (err)
		return err;
	if (resp.doorbell_page_size != PFR_DOORBELL_PAGE_SIZE) {
		close(page_fd);
		return EIO;
	}
	err = pfr_ring_map(page_fd, PFR_DOORBELL_PAGE_SIZE, &page);
	if (err)
		return err;
	ctx->doorbell = page;
	if (ctx->doorbell->magic != PFR_DOORBELL_MAGIC || ctx->doorbell->context_handle != resp.context_handle)
		return EIO;
	ctx->handle = resp.context_handle;
	ctx->flags = resp.flags;
	ctx->device_pid = resp.device_pid;
	ctx->vctx.context.num_comp_vectors = (int)resp.num_comp_vectors;
	return 0;
}

static void free_context(struct pfr_context *ctx)
{
	if (ctx->doorbell)
		munmap(ctx->doorbell, PFR_DOORBELL_PAGE_SIZE);
	ctx->doorbell = NULL;
}

PFR_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct pfr_context *ctx = calloc(1, sizeof(*ctx));
	int async[2] = {-1, -1}, fault[2] = {-1, -1};
	int err;
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->doorbell_fd = -1;
	ctx->fault_fd = -1;
	err = pfr_connect(&ctx->conn);
	if (err)
		goto fail_free;
	pthread_mutex_init(&ctx->objects_lock, NULL);
	if (pipe2(async, O_CLOEXEC) != 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fault) != 0 ||
	    (ctx->doorbell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		err = errno;
		goto fail;
	}
	err = get_context(ctx, async[1], fault[1]);
	close(async[1]);
	close(fault[1]);
	async[1] = fault[1] = -1;
	if (err)
		goto fail;
	ctx->fault_fd = fault[0];
	fault[0] = -1;
	/* Under Yama's ptrace_scope 1 the device (not this process's ancestor) may read and write this
	 * process's memory only if named here; without Yama the call fails with EINVAL and is not needed. */
	prctl(PR_SET_PTRACER, (unsigned long)ctx->device_pid, 0, 0, 0);
	ctx->vctx.context.device = device;
	ctx->vctx.context.cmd_fd = ctx->conn.fd;
	ctx->vctx.context.async_fd = async[0];
	pthread_mutex_init(&ctx->vctx.context.mutex, NULL);
	pfr_set_ops(ctx);
	err = pfr_fault_thread_start(ctx);
	if (err) {
		async[0] = -1;
		goto fail;
	}
	return &ctx->vctx.context;
fail:
	for (int i = 0; i < 2; i++) {
		if (async[i] >= 0)
			close(async[i]);
		if (fault[i] >= 0)
			close(fault[i]);
	}
	if (ctx->doorbell_fd >= 0)
		close(ctx->doorbell_fd);
	if (ctx->fault_fd >= 0)
		close(ctx->fault_fd);
	free_context(ctx);
	pfr_disconnect(&ctx->conn);
	pthread_mutex_destroy(&ctx->objects_lock);
fail_free:
	free(ctx);
	errno = err;
	return NULL;
}

PFR_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct pfr_context *ctx = to_pctx(context);
	pfr_fault_thread_stop(ctx);
	pfr_release_objects(ctx);
	/* Closing the connection releases on the device whatever the program did not destroy. */
	pfr_disconnect(&ctx->conn);
	close(context->async_fd);
	close(ctx->doorbell_fd);
	free_context(ctx);
	pthread_mutex_destroy(&ctx->objects_lock);
	pthread_mutex_destroy(&context->mutex);
	free(ctx);
	return 0;
}

PFR_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct pfr_context *ctx = to_pctx(context);
	struct pfr_async_event e;
	ssize_t n;
	while ((n = read(context->async_fd, &e, sizeof(e))) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)sizeof(e)) {
		if (n >= 0)
			errno = EIO; /* the device went away (end of the pipe) or broke the record */
		return -1;
	}
	memset(event, 0, sizeof(*event));
	event->event_type = (enum ibv_event_type)e.event_type;
	pthread_mutex_lock(&ctx->objects_lock);
	switch (e.element_kind) {
	case PFR_ELEMENT_CQ: {
		struct pfr_cq *cq = pfr_table_get(&ctx->cqs, e.handle);
		event->element.cq = cq ? &cq->ibv_cq : NULL;
		break;
	}
	case PFR_ELEMENT_QP: {
		struct pfr_qp *qp = pfr_table_get(&ctx->qps, e.handle);
		event->element.qp = qp ? &qp->qp : NULL;
		break;
	}
	case PFR_ELEMENT_SRQ: {
		struct pfr_srq *srq = pfr_table_get(&ctx->srqs, e.handle);
		event->element.srq = srq ? &srq->srq : NULL;
		break;
	}
	case PFR_ELEMENT_PORT:
		event->element.port_num = (int)e.handle;
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&ctx->objects_lock);
	return 0;
}

PFR_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event; /* events are counted by the device; nothing waits on the acknowledgement here */
}
