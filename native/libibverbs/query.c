/* The queries: device, port, GIDs and P_Keys, answered by the device with the uverbs reply
 * structs (ib_uverbs_ex_query_device_resp, ib_uverbs_query_port_resp, ib_uverbs_gid_entry)
 * and copied into libibverbs' structs field by field, as libibverbs' cmd_device.c does. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "provider.h"

/* rdma-core's enum ibv_gid_type_sysfs (driver.h, not installed): what ibv_query_gid_type answers. */
enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};
PFR_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
				  enum ibv_gid_type_sysfs *type);

static void copy_device_attr(struct ibv_device_attr *a, const struct ib_uverbs_query_device_resp *r)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%u.%u.%u", (unsigned)(r->fw_ver >> 32), (unsigned)((r->fw_ver >> 16) & 0xffff),
		 (unsigned)(r->fw_ver & 0xffff));
	a->node_guid = r->node_guid;
	a->sys_image_guid = r->sys_image_guid;
	a->max_mr_size = r->max_mr_size;
	a->page_size_cap = r->page_size_cap;
	a->vendor_id = r->vendor_id;
	a->vendor_part_id = r->vendor_part_id;
	a->hw_ver = r->hw_ver;
	a->max_qp = (int)r->max_qp;
	a->max_qp_wr = (int)r->max_qp_wr;
	a->device_cap_flags = r->device_cap_flags;
	a->max_sge = (int)r->max_sge;
	a->max_sge_rd = (int)r->max_sge_rd;
	a->max_cq = (int)r->max_cq;
	a->max_cqe = (int)r->max_cqe;
	a->max_mr = (int)r->max_mr;
	a->max_pd = (int)r->max_pd;
	a->max_qp_rd_atom = (int)r->max_qp_rd_atom;
	a->max_ee_rd_atom = (int)r->max_ee_rd_atom;
	a->max_res_rd_atom = (int)r->max_res_rd_atom;
	a->max_qp_init_rd_atom = (int)r->max_qp_init_rd_atom;
	a->max_ee_init_rd_atom = (int)r->max_ee_init_rd_atom;
	a->atomic_cap = (enum ibv_atomic_cap)r->atomic_cap;
	a->max_ee = (int)r->max_ee;
	a->max_rdd = (int)r->max_rdd;
	a->max_mw = (int)r->max_mw;
	a->max_raw_ipv6_qp = (int)r->max_raw_ipv6_qp;
	a->max_raw_ethy_qp = (int)r->max_raw_ethy_qp;
	a->max_mcast_grp = (int)r->max_mcast_grp;
	a->max_mcast_qp_attach = (int)r->max_mcast_qp_attach;
	a->max_total_mcast_qp_attach = (int)r->max_total_mcast_qp_attach;
	a->max_ah = (int)r->max_ah;
	a->max_fmr = (int)r->max_fmr;
	a->max_map_per_fmr = (int)r->max_map_per_fmr;
	a->max_srq = (int)r->max_srq;
	a->max_srq_wr = (int)r->max_srq_wr;
	a->max_srq_sge = (int)r->max_srq_sge;
	a->max_pkeys = r->max_pkeys;
	a->local_ca_ack_delay = r->local_ca_ack_delay;
	a->phys_port_cnt = r->phys_port_cnt;
}

static int query_device_resp(struct ibv_context *context, struct ib_uverbs_ex_query_device_resp *r)
{
	return pfr_call(&to_pctx(context)->conn, PFR_OP_QUERY_DEVICE, NULL, 0, NULL, 0, r, sizeof(*r), NULL, 0);
}

PFR_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	struct ib_uverbs_ex_query_device_resp r;
	int err = query_device_resp(context, &r);
	if (err)
		return err;
	copy_device_attr(device_attr, &r.base);
	return 0;
}

int pfr_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp r;
	struct ibv_device_attr_ex a;
	int err;
	if ((input && input->comp_mask) || attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	err = query_device_resp(context, &r);
	if (err)
		return err;
	memset(&a, 0, sizeof(a));
	copy_device_attr(&a.orig_attr, &r.base);
	a.odp_caps.general_caps = r.odp_caps.general_caps;
	a.odp_caps.per_transport_caps.rc_odp_caps = r.odp_caps.per_transport_caps.rc_odp_caps;
	a.odp_caps.per_transport_caps.uc_odp_caps = r.odp_caps.per_transport_caps.uc_odp_caps;
	a.odp_caps.per_transport_caps.ud_odp_caps = r.odp_caps.per_transport_caps.ud_odp_caps;
	a.completion_timestamp_mask = r.timestamp_mask;
	a.hca_core_clock = r.hca_core_clock;
	a.device_cap_flags_ex = r.device_cap_flags_ex | r.base.device_cap_flags;
	a.max_wq_type_rq = r.max_wq_type_rq;
	a.raw_packet_caps = r.raw_packet_caps;
	a.max_dm_size = r.max_dm_size;
	a.xrc_odp_caps = r.xrc_odp_caps;
	a.phys_port_cnt_ex = r.base.phys_port_cnt;
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	return 0;
}

int pfr_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr, size_t len)
{
	struct pfr_port_index q = {.port_num = port_num};
	struct ib_uverbs_query_port_resp r;
	struct ibv_port_attr a;
	int err = pfr_call(&to_pctx(context)->conn, PFR_OP_QUERY_PORT, &q, sizeof(q), NULL, 0, &r, sizeof(r), NULL, 0);
	if (err)
		return err;
	memset(&a, 0, sizeof(a));
	a.state = (enum ibv_port_state)r.state;
	a.max_mtu = (enum ibv_mtu)r.max_mtu;
	a.active_mtu = (enum ibv_mtu)r.active_mtu;
	a.gid_tbl_len = (int)r.gid_tbl_len;
	a.port_cap_flags = r.port_cap_flags;
	a.max_msg_sz = r.max_msg_sz;
	a.bad_pkey_cntr = r.bad_pkey_cntr;
	a.qkey_viol_cntr = r.qkey_viol_cntr;
	a.pkey_tbl_len = r.pkey_tbl_len;
	a.lid = r.lid;
	a.sm_lid = r.sm_lid;
	a.lmc = r.lmc;
	a.max_vl_num = r.max_vl_num;
	a.sm_sl = r.sm_sl;
	a.subnet_timeout = r.subnet_timeout;
	a.init_type_reply = r.init_type_reply;
	a.active_width = r.active_width;
	a.active_speed = r.active_speed;
	a.phys_state = r.phys_state;
	a.link_layer = r.link_layer;
	a.flags = r.flags;
	memcpy(port_attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* The exported symbol takes libibverbs 1.0's struct (everything before port_cap_flags2);
 * programs built against these headers call the op through ___ibv_query_port instead. */
#undef ibv_query_port
PFR_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr)
{
	return pfr_query_port(context, port_num, (struct ibv_port_attr *)port_attr,
			      offsetof(struct ibv_port_attr, port_cap_flags2));
}

static int query_gid_entry(struct ibv_context *context, uint32_t port_num, uint32_t index, struct ib_uverbs_gid_entry *r)
{
	struct pfr_port_index q = {.port_num = port_num, .index = index};
	return pfr_call(&to_pctx(context)->conn, PFR_OP_QUERY_GID, &q, sizeof(q), NULL, 0, r, sizeof(*r), NULL, 0);
}

PFR_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct ib_uverbs_gid_entry r;
	int err = index < 0 ? EINVAL : query_gid_entry(context, port_num, (uint32_t)index, &r);
	if (err) {
		errno = err;
		return -1;
	}
	memcpy(gid->raw, r.gid, sizeof(gid->raw));
	return 0;
}

PFR_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				 struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ib_uverbs_gid_entry r;
	int err;
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	err = query_gid_entry(context, port_num, gid_index, &r);
	if (err)
		return err == EINVAL ? ENODATA : err;
	memcpy(entry->gid.raw, r.gid, sizeof(entry->gid.raw));
	entry->gid_index = r.gid_index;
	entry->port_num = r.port_num;
	entry->gid_type = r.gid_type;
	entry->ndev_ifindex = r.netdev_ifindex;
	return 0;
}

PFR_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
					uint32_t flags, size_t entry_size)
{
	struct ibv_port_attr port;
	size_t n = 0;
	int err;
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	err = pfr_query_port(context, 1, &port, sizeof(port));
	if (err)
		return -err;
	for (int i = 0; i < port.gid_tbl_len; i++) {
		if (n == max_entries)
			return -EINVAL; /* as libibverbs: the caller's table is too small */
		err = _ibv_query_gid_ex(context, 1, (uint32_t)i, (struct ibv_gid_entry *)((char *)entries + n * entry_size), 0,
					entry_size);
		if (err)
			return -err;
		n++;
	}
	return (ssize_t)n;
}

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, enum ibv_gid_type_sysfs *type)
{
	struct ib_uverbs_gid_entry r;
	int err = query_gid_entry(context, port_num, index, &r);
	if (err) {
		errno = err;
		return -1;
	}
	*type = r.gid_type == IB_UVERBS_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

PFR_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	struct pfr_port_index q = {.port_num = port_num, .index = (uint32_t)index};
	struct pfr_pkey r;
	int err = index < 0 ? EINVAL
			    : pfr_call(&to_pctx(context)->conn, PFR_OP_QUERY_PKEY, &q, sizeof(q), NULL, 0, &r, sizeof(r), NULL, 0);
	if (err) {
		errno = err;
		return -1;
	}
	*pkey = htobe16(r.pkey);
	return 0;
}

PFR_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	struct ibv_port_attr port;
	if (pfr_query_port(context, port_num, &port, sizeof(port)))
		return -1;
	for (int i = 0; i < port.pkey_tbl_len; i++) {
		__be16 p;
		if (ibv_query_pkey(context, port_num, i, &p) == 0 && p == pkey)
			return i;
	}
	return -1;
}
