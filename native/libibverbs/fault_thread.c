/* The program's fault library: a thread of this library in the program (as the thesis's
 * library lives in the application's process) that hears the device's fault requests on the
 * fault socket and makes the pages resident, then answers (docs/device-abi.md §5). Every request
 * is checked against this context's own MRs: the device makes this process touch nothing but
 * what it registered. The pages are made resident with MADV_POPULATE_(READ|WRITE), which fault
 * them in exactly as an access would (get_user_pages), page by page for TOUCH or in one call
 * for POPULATE, and which fail with an errno on a range that is not mapped where an access from
 * this thread would kill the program. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "provider.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The request's range lies inside MR `handle` of this context (an implicit MR covers all). */
static bool inside_mr(struct pfr_context *ctx, const struct pfr_fault_request *r)
{
	bool ok = false;
	pthread_mutex_lock(&ctx->objects_lock);
	struct pfr_mr *mr = pfr_table_get(&ctx->mrs, r->mr_handle);
	if (mr) {
		const long ps = sysconf(_SC_PAGESIZE);
		uintptr_t first = (uintptr_t)mr->ibv_mr.addr & ~(uintptr_t)(ps - 1);
		uintptr_t end = (uintptr_t)mr->ibv_mr.addr + mr->ibv_mr.length;
		ok = mr->implicit || (r->addr >= first && r->length <= UINT64_MAX - r->addr && r->addr + r->length <= ((end + ps - 1) & ~(uintptr_t)(ps - 1)));
	}
	pthread_mutex_unlock(&ctx->objects_lock);
	return ok;
}

/* Make the pages resident; the pages made so, or -errno. */
static int32_t resolve(const struct pfr_fault_request *r, uint32_t *pages)
{
	const long ps = sysconf(_SC_PAGESIZE);
	const int how = r->flags & PFR_FAULT_WRITE ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
	*pages = 0;
	if (r->method == PFR_FAULT_POPULATE) {
		if (madvise((void *)(uintptr_t)r->addr, r->length, how) != 0)
			return -errno;
		*pages = (uint32_t)(r->length / (uint64_t)ps);
		return 0;
	}
	for (uint64_t off = 0; off < r->length; off += (uint64_t)ps) {
		if (madvise((void *)(uintptr_t)(r->addr + off), (size_t)ps, how) != 0)
			return -errno;
		(*pages)++;
	}
	return 0;
}

static bool valid(const struct pfr_fault_request *r, ssize_t n)
{
	const long ps = sysconf(_SC_PAGESIZE);
	return n == (ssize_t)sizeof(*r) && r->magic == PFR_FAULT_MAGIC && r->abi_version == PFR_ABI_VERSION &&
	       r->op == PFR_FAULT_REQUEST && r->addr % (uint64_t)ps == 0 && r->length > 0 && r->length % (uint64_t)ps == 0 &&
	       (r->method == PFR_FAULT_TOUCH || r->method == PFR_FAULT_POPULATE) && !(r->flags & ~(uint32_t)PFR_FAULT_WRITE);
}

static void *fault_thread(void *arg)
{
	struct pfr_context *ctx = arg;
	while (!atomic_load(&ctx->stopping)) {
		struct pollfd p = {.fd = ctx->fault_fd, .events = POLLIN};
		struct pfr_fault_request r;
		struct pfr_fault_response a = {.magic = PFR_FAULT_MAGIC, .abi_version = PFR_ABI_VERSION, .op = PFR_FAULT_RESOLVED};
		ssize_t n;
		uint64_t t0;
		/* A bounded wait: close_device's shutdown wakes it, this makes sure it notices. */
		if (poll(&p, 1, 1000) <= 0)
			continue;
		n = recv(ctx->fault_fd, &r, sizeof(r), MSG_TRUNC);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
			/* The device is gone: nothing more will come, and no completion either (poll_cq
			 * and the posts fail from now on instead of waiting for it). */
			if (!atomic_load(&ctx->stopping))
				atomic_store(&ctx->device_gone, true);
			break;
		}
		if (n < 0)
			continue;
		if (!valid(&r, n))
			continue; /* not a request this thread can answer: the device times it out */
		t0 = now_ns();
		a.fault_id = r.fault_id;
		a.status = inside_mr(ctx, &r) ? resolve(&r, &a.pages) : -EFAULT;
		a.ns = now_ns() - t0;
		if (send(ctx->fault_fd, &a, sizeof(a), MSG_NOSIGNAL) < 0 && errno == EPIPE) {
			if (!atomic_load(&ctx->stopping))
				atomic_store(&ctx->device_gone, true);
			break;
		}
	}
	return NULL;
}

int pfr_fault_thread_start(struct pfr_context *ctx)
{
	int err;
	atomic_store(&ctx->stopping, false);
	atomic_store(&ctx->device_gone, false);
	err = pthread_create(&ctx->fault_thread, NULL, fault_thread, ctx);
	if (err)
		return err;
	pthread_setname_np(ctx->fault_thread, "pfr-faults");
	ctx->fault_thread_started = true;
	return 0;
}

void pfr_fault_thread_stop(struct pfr_context *ctx)
{
	if (!ctx->fault_thread_started)
		return;
	atomic_store(&ctx->stopping, true);
	shutdown(ctx->fault_fd, SHUT_RDWR);
	pthread_join(ctx->fault_thread, NULL);
	close(ctx->fault_fd);
	ctx->fault_fd = -1;
	ctx->fault_thread_started = false;
}
