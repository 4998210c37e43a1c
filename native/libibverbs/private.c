/* The IBVERBS_PRIVATE_34 symbols: rdma-core 44's interface between libibverbs and its provider
 * drivers, which Debian's libmlx5.so.1 and libefa.so.1 (linked by perftest and pyverbs) bind
 * when they load. Exporting them lets those real libraries load beside this libibverbs, where
 * they answer for this device what they answer for any device not theirs: mlx5dv_is_supported
 * is false, efadv_query_device EOPNOTSUPP (struct pfr_device's head says "no driver of yours").
 *
 * A driver's constructor registers it (verbs_register_driver_34): no device is ever handed to
 * one, since this library's only device is the device process. So none of the kernel commands
 * below is reached; each answers EOPNOTSUPP should a driver call it all the same. Their real
 * prototypes are in rdma-core's driver.h, which libibverbs-dev does not install; a caller's
 * arguments are ignored (the x86-64 and aarch64 calling conventions let a callee that takes
 * none return to any caller). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#include "provider.h"

PFR_EXPORT bool verbs_allow_disassociate_destroy;

PFR_EXPORT void verbs_register_driver_34(const void *ops);
void verbs_register_driver_34(const void *ops)
{
	(void)ops; /* devices come from the device process, never from a driver's sysfs match */
}

PFR_EXPORT void __verbs_log(void);
void __verbs_log(void)
{
}

PFR_EXPORT void *_verbs_init_and_alloc_context(void);
void *_verbs_init_and_alloc_context(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT void *verbs_open_device(void);
void *verbs_open_device(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

PFR_EXPORT void verbs_init_cq(void);
void verbs_init_cq(void)
{
}

PFR_EXPORT void verbs_set_ops(void);
void verbs_set_ops(void)
{
}

PFR_EXPORT void verbs_uninit_context(void);
void verbs_uninit_context(void)
{
}

PFR_EXPORT unsigned int __ioctl_final_num_attrs(void);
unsigned int __ioctl_final_num_attrs(void)
{
	return 0;
}

PFR_EXPORT int ibv_read_ibdev_sysfs_file(void);
int ibv_read_ibdev_sysfs_file(void)
{
	return -1;
}

#define NO_KERNEL(name)                \
	PFR_EXPORT int name(void);     \
	int name(void)                 \
	{                              \
		return EOPNOTSUPP;     \
	}

NO_KERNEL(execute_ioctl)
NO_KERNEL(ibv_cmd_advise_mr)
NO_KERNEL(ibv_cmd_alloc_dm)
NO_KERNEL(ibv_cmd_alloc_mw)
NO_KERNEL(ibv_cmd_alloc_pd)
NO_KERNEL(ibv_cmd_attach_mcast)
NO_KERNEL(ibv_cmd_close_xrcd)
NO_KERNEL(ibv_cmd_create_ah)
NO_KERNEL(ibv_cmd_create_counters)
NO_KERNEL(ibv_cmd_create_cq)
NO_KERNEL(ibv_cmd_create_cq_ex)
NO_KERNEL(ibv_cmd_create_flow)
NO_KERNEL(ibv_cmd_create_flow_action_esp)
NO_KERNEL(ibv_cmd_create_qp)
NO_KERNEL(ibv_cmd_create_qp_ex)
NO_KERNEL(ibv_cmd_create_qp_ex2)
NO_KERNEL(ibv_cmd_create_rwq_ind_table)
NO_KERNEL(ibv_cmd_create_srq)
NO_KERNEL(ibv_cmd_create_srq_ex)
NO_KERNEL(ibv_cmd_create_wq)
NO_KERNEL(ibv_cmd_dealloc_mw)
NO_KERNEL(ibv_cmd_dealloc_pd)
NO_KERNEL(ibv_cmd_dereg_mr)
NO_KERNEL(ibv_cmd_destroy_ah)
NO_KERNEL(ibv_cmd_destroy_counters)
NO_KERNEL(ibv_cmd_destroy_cq)
NO_KERNEL(ibv_cmd_destroy_flow)
NO_KERNEL(ibv_cmd_destroy_flow_action)
NO_KERNEL(ibv_cmd_destroy_qp)
NO_KERNEL(ibv_cmd_destroy_rwq_ind_table)
NO_KERNEL(ibv_cmd_destroy_srq)
NO_KERNEL(ibv_cmd_destroy_wq)
NO_KERNEL(ibv_cmd_detach_mcast)
NO_KERNEL(ibv_cmd_free_dm)
NO_KERNEL(ibv_cmd_get_context)
NO_KERNEL(ibv_cmd_modify_cq)
NO_KERNEL(ibv_cmd_modify_flow_action_esp)
NO_KERNEL(ibv_cmd_modify_qp)
NO_KERNEL(ibv_cmd_modify_qp_ex)
NO_KERNEL(ibv_cmd_modify_srq)
NO_KERNEL(ibv_cmd_modify_wq)
NO_KERNEL(ibv_cmd_open_qp)
NO_KERNEL(ibv_cmd_open_xrcd)
NO_KERNEL(ibv_cmd_poll_cq)
NO_KERNEL(ibv_cmd_post_recv)
NO_KERNEL(ibv_cmd_post_send)
NO_KERNEL(ibv_cmd_post_srq_recv)
NO_KERNEL(ibv_cmd_query_context)
NO_KERNEL(ibv_cmd_query_device_any)
NO_KERNEL(ibv_cmd_query_mr)
NO_KERNEL(ibv_cmd_query_port)
NO_KERNEL(ibv_cmd_query_qp)
NO_KERNEL(ibv_cmd_query_srq)
NO_KERNEL(ibv_cmd_read_counters)
NO_KERNEL(ibv_cmd_reg_dm_mr)
NO_KERNEL(ibv_cmd_reg_dmabuf_mr)
NO_KERNEL(ibv_cmd_reg_mr)
NO_KERNEL(ibv_cmd_req_notify_cq)
NO_KERNEL(ibv_cmd_rereg_mr)
NO_KERNEL(ibv_cmd_resize_cq)
