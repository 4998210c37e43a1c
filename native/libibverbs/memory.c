/* Protection domains and memory regions. An ODP MR (IBV_ACCESS_ON_DEMAND) is never pinned:
 * the device reaches its pages through this process's page tables and asks the fault thread
 * for those that are not there. A pinned MR is mlock'd here, in the program, against its own
 * RLIMIT_MEMLOCK (ENOMEM past it, as libibverbs), before the device hears of it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

PFR_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct pfr_pd *pd = calloc(1, sizeof(*pd));
	int err;
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	err = pfr_call_handle(&to_pctx(context)->conn, PFR_OP_ALLOC_PD, NULL, 0, NULL, 0, &pd->handle);
	if (err) {
		free(pd);
		errno = err;
		return NULL;
	}
	pd->ibv_pd.context = context;
	pd->ibv_pd.handle = pd->handle;
	return &pd->ibv_pd;
}

PFR_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibv_pd)
{
	struct pfr_pd *pd = PFR_OF(struct pfr_pd, ibv_pd, ibv_pd);
	int err = pfr_call_on(&to_pctx(ibv_pd->context)->conn, PFR_OP_DEALLOC_PD, pd->handle, NULL, 0);
	if (!err)
		free(pd);
	return err;
}

/* The policy of the MRs this program registers: `pagefault-rdma exec --policy` sets it. */
static uint32_t policy_from_env(void)
{
	const char *p = getenv("PFR_POLICY");
	if (!p)
		return PFR_POLICY_DEFAULT;
	if (strcmp(p, "touch") == 0)
		return PFR_POLICY_TOUCH;
	if (strcmp(p, "touch-ahead") == 0)
		return PFR_POLICY_TOUCH_AHEAD;
	if (strcmp(p, "prefetch") == 0)
		return PFR_POLICY_PREFETCH;
	return PFR_POLICY_DEFAULT;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct pfr_context *ctx = to_pctx(pd->context);
	struct pfr_reg_mr req = {.start = (uintptr_t)addr, .length = length, .iova = iova,
				 .pd_handle = PFR_OF(struct pfr_pd, ibv_pd, pd)->handle, .access = access,
				 .policy = policy_from_env()};
	struct pfr_reg_mr_resp resp;
	struct pfr_mr *mr = calloc(1, sizeof(*mr));
	int err;
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->implicit = addr == NULL && length == SIZE_MAX;
	if (!(access & IBV_ACCESS_ON_DEMAND) && !mr->implicit && length) {
		if (mlock(addr, length) != 0) {
			err = errno == EAGAIN || errno == EPERM ? ENOMEM : errno;
			goto fail;
		}
		mr->pinned = true;
	}
	err = pfr_call(&ctx->conn, PFR_OP_REG_MR, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), NULL, 0);
	if (err)
		goto fail;
	mr->handle = resp.mr_handle;
	mr->ibv_mr.context = pd->context;
	mr->ibv_mr.pd = pd;
	mr->ibv_mr.addr = addr;
	mr->ibv_mr.length = length;
	mr->ibv_mr.handle = resp.mr_handle;
	mr->ibv_mr.lkey = resp.lkey;
	mr->ibv_mr.rkey = resp.rkey;
	pthread_mutex_lock(&ctx->objects_lock);
	err = pfr_table_set(&ctx->mrs, mr->handle, mr);
	pthread_mutex_unlock(&ctx->objects_lock);
	if (err) {
		pfr_call_on(&ctx->conn, PFR_OP_DEREG_MR, mr->handle, NULL, 0);
		goto fail;
	}
	return &mr->ibv_mr;
fail:
	if (mr->pinned)
		munlock(addr, length);
	free(mr);
	errno = err;
	return NULL;
}

#undef ibv_reg_mr
PFR_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

#undef ibv_reg_mr_iova
PFR_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned int)access);
}

PFR_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

/* A pinned MR's pages are unlocked unless another pinned MR of the context still covers them
 * (mlock does not count: unlocking one range unlocks it for every MR). Under objects_lock. */
static void unpin(struct pfr_context *ctx, struct pfr_mr *gone)
{
	munlock(gone->ibv_mr.addr, gone->ibv_mr.length);
	for (uint32_t i = 0; i < ctx->mrs.size; i++) {
		struct pfr_mr *m = ctx->mrs.slots[i];
		uintptr_t a = (uintptr_t)gone->ibv_mr.addr, b = a + gone->ibv_mr.length;
		uintptr_t c = m ? (uintptr_t)m->ibv_mr.addr : 0, d = m ? c + m->ibv_mr.length : 0;
		if (m && m != gone && m->pinned && c < b && a < d)
			mlock(m->ibv_mr.addr, m->ibv_mr.length);
	}
}

PFR_EXPORT int ibv_dereg_mr(struct ibv_mr *ibv_mr)
{
	struct pfr_mr *mr = PFR_OF(struct pfr_mr, ibv_mr, ibv_mr);
	struct pfr_context *ctx = to_pctx(ibv_mr->context);
	int err = pfr_call_on(&ctx->conn, PFR_OP_DEREG_MR, mr->handle, NULL, 0);
	if (err && err != EIO)
		return err;
	pthread_mutex_lock(&ctx->objects_lock);
	pfr_table_clear(&ctx->mrs, mr->handle);
	if (mr->pinned)
		unpin(ctx, mr);
	pthread_mutex_unlock(&ctx->objects_lock);
	free(mr);
	return 0;
}

PFR_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	(void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
	errno = EOPNOTSUPP; /* not offered: deregister and register again */
	return IBV_REREG_MR_ERR_INPUT;
}

PFR_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					    int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP; /* no device memory of another driver here */
	return NULL;
}

/* The device checks every SGE against an ODP MR of the PD; the pages are then made resident
 * here, where they are (prefetch for reading or writing; NO_FAULT maps none that is not there). */
int pfr_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, struct ibv_sge *sg_list,
		  uint32_t num_sge)
{
	uint8_t body[sizeof(struct pfr_advise_mr) + PFR_ADVISE_MAX_SGE * sizeof(struct ib_uverbs_sge)];
	struct pfr_advise_mr h = {.pd_handle = PFR_OF(struct pfr_pd, ibv_pd, pd)->handle, .advice = advice, .flags = flags,
				  .num_sge = num_sge};
	const long ps = sysconf(_SC_PAGESIZE);
	int err;
	if (num_sge == 0 || num_sge > PFR_ADVISE_MAX_SGE)
		return EINVAL;
	memcpy(body, &h, sizeof(h));
	for (uint32_t i = 0; i < num_sge; i++) {
		struct ib_uverbs_sge s = {.addr = sg_list[i].addr, .length = sg_list[i].length, .lkey = sg_list[i].lkey};
		memcpy(body + sizeof(h) + i * sizeof(s), &s, sizeof(s));
	}
	err = pfr_call(&to_pctx(pd->context)->conn, PFR_OP_ADVISE_MR, body, sizeof(h) + num_sge * sizeof(struct ib_uverbs_sge),
		       NULL, 0, NULL, 0, NULL, 0);
	if (err || advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return err;
	for (uint32_t i = 0; i < num_sge; i++) {
		uintptr_t a = (uintptr_t)sg_list[i].addr & ~(uintptr_t)(ps - 1);
		uintptr_t b = (uintptr_t)sg_list[i].addr + sg_list[i].length;
		int how = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
		if (sg_list[i].length && madvise((void *)a, b - a, how) != 0)
			return errno;
	}
	return 0;
}

/* fork: the device reaches memory through this process's current page tables (no page is
 * pinned under it by physical address), so a copy-on-write after fork cannot leave it behind. */
PFR_EXPORT int ibv_fork_init(void)
{
	return 0;
}

PFR_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

PFR_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base, (void)size;
	return 0;
}

PFR_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base, (void)size;
	return 0;
}

/* Sharing objects across processes (ibv_import_*) needs a kernel's object ids: not offered. */
PFR_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context, (void)pd_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

PFR_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd, (void)mr_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

PFR_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context, (void)dm_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}
