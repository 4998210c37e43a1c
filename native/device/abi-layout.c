/* Prints the byte layout of the device ABI (native/device/abi.h and the uapi structs it uses)
 * as JSON: every struct's size and alignment, every field's offset and size, every constant.
 * The test of the TypeScript mirror (kernel-sim/device/abi.ts) compiles and runs this and
 * compares, field by field: the layout is defined in C once and checked, never retyped. */
#include <stddef.h>
#include <stdio.h>

#include "abi.h"

static int first_struct = 1, first_field;

static void begin(const char *name, size_t size, size_t align)
{
	printf("%s\n    \"%s\": { \"size\": %zu, \"align\": %zu, \"fields\": {", first_struct ? "" : ",", name, size, align);
	first_struct = 0;
	first_field = 1;
}

static void field(const char *name, size_t offset, size_t size)
{
	printf("%s\n      \"%s\": [%zu, %zu]", first_field ? "" : ",", name, offset, size);
	first_field = 0;
}

static void end(void) { printf("\n    } }"); }

#define S(t) begin(#t, sizeof(struct t), _Alignof(struct t))
#define F(t, f) field(#f, offsetof(struct t, f), sizeof(((struct t *)0)->f))
#define C(name) printf("%s\n    \"%s\": %lld", first_const ? "" : ",", #name, (long long)(name)), first_const = 0

int main(void)
{
	int first_const = 1;
	printf("{\n  \"structs\": {");

	S(pfr_queue_buf);
	F(pfr_queue_buf, log2_elem_size); F(pfr_queue_buf, index_mask); F(pfr_queue_buf, magic);
	F(pfr_queue_buf, abi_version); F(pfr_queue_buf, kind); F(pfr_queue_buf, num_elems);
	F(pfr_queue_buf, handle); F(pfr_queue_buf, producer_index); F(pfr_queue_buf, notify_fired);
	F(pfr_queue_buf, consumer_index); F(pfr_queue_buf, arm_sn); F(pfr_queue_buf, arm_solicited);
	field("data", offsetof(struct pfr_queue_buf, data), 0);
	end();

	S(pfr_send_wr);
	F(pfr_send_wr, wr_id); F(pfr_send_wr, opcode); F(pfr_send_wr, send_flags);
	F(pfr_send_wr, ex.imm_data); F(pfr_send_wr, ex.invalidate_rkey); F(pfr_send_wr, xrc_remote_srqn);
	F(pfr_send_wr, wr.rdma.remote_addr); F(pfr_send_wr, wr.rdma.rkey);
	F(pfr_send_wr, wr.atomic.remote_addr); F(pfr_send_wr, wr.atomic.compare_add);
	F(pfr_send_wr, wr.atomic.swap); F(pfr_send_wr, wr.atomic.rkey);
	F(pfr_send_wr, wr.ud.remote_qpn); F(pfr_send_wr, wr.ud.remote_qkey); F(pfr_send_wr, wr.ud.ah_handle);
	F(pfr_send_wr, wr.flush.remote_addr); F(pfr_send_wr, wr.flush.length); F(pfr_send_wr, wr.flush.rkey);
	F(pfr_send_wr, wr.flush.type); F(pfr_send_wr, wr.flush.level);
	end();

	S(pfr_dma_info);
	F(pfr_dma_info, length); F(pfr_dma_info, resid); F(pfr_dma_info, cur_sge);
	F(pfr_dma_info, num_sge); F(pfr_dma_info, sge_offset); F(pfr_dma_info, reserved);
	end();

	S(rxe_sge);
	F(rxe_sge, addr); F(rxe_sge, length); F(rxe_sge, lkey);
	end();

	S(pfr_send_wqe);
	F(pfr_send_wqe, wr); F(pfr_send_wqe, dma);
	end();

	S(pfr_recv_wqe);
	F(pfr_recv_wqe, wr_id); F(pfr_recv_wqe, reserved); F(pfr_recv_wqe, padding); F(pfr_recv_wqe, dma);
	end();

	S(ib_uverbs_wc);
	F(ib_uverbs_wc, wr_id); F(ib_uverbs_wc, status); F(ib_uverbs_wc, opcode); F(ib_uverbs_wc, vendor_err);
	F(ib_uverbs_wc, byte_len); F(ib_uverbs_wc, ex.imm_data); F(ib_uverbs_wc, qp_num); F(ib_uverbs_wc, src_qp);
	F(ib_uverbs_wc, wc_flags); F(ib_uverbs_wc, pkey_index); F(ib_uverbs_wc, slid); F(ib_uverbs_wc, sl);
	F(ib_uverbs_wc, dlid_path_bits); F(ib_uverbs_wc, port_num);
	end();

	S(pfr_wc_odp);
	F(pfr_wc_odp, faults_source); F(pfr_wc_odp, faults_destination); F(pfr_wc_odp, major_faults);
	F(pfr_wc_odp, retransmitted_blocks); F(pfr_wc_odp, model_us); F(pfr_wc_odp, real_us);
	end();

	S(pfr_cqe);
	F(pfr_cqe, wc); F(pfr_cqe, odp);
	end();

	S(pfr_doorbell_page);
	F(pfr_doorbell_page, magic); F(pfr_doorbell_page, abi_version); F(pfr_doorbell_page, context_handle);
	F(pfr_doorbell_page, device_state); F(pfr_doorbell_page, device_sleeping); F(pfr_doorbell_page, doorbells_rung);
	end();

	S(pfr_ctl_hdr);
	F(pfr_ctl_hdr, magic); F(pfr_ctl_hdr, abi_version); F(pfr_ctl_hdr, op); F(pfr_ctl_hdr, length);
	F(pfr_ctl_hdr, request_id); F(pfr_ctl_hdr, status); F(pfr_ctl_hdr, flags);
	end();

	S(pfr_handle);
	F(pfr_handle, handle);
	end();

	S(pfr_device_info);
	F(pfr_device_info, name); F(pfr_device_info, node_guid); F(pfr_device_info, device_pid);
	F(pfr_device_info, flags); F(pfr_device_info, node_type); F(pfr_device_info, transport_type);
	F(pfr_device_info, num_comp_vectors);
	end();

	S(pfr_get_context);
	F(pfr_get_context, provider_abi); F(pfr_get_context, flags); F(pfr_get_context, reserved);
	end();

	S(pfr_get_context_resp);
	F(pfr_get_context_resp, context_handle); F(pfr_get_context_resp, flags);
	F(pfr_get_context_resp, num_comp_vectors); F(pfr_get_context_resp, device_pid);
	F(pfr_get_context_resp, doorbell_page_size);
	end();

	S(pfr_port_index);
	F(pfr_port_index, port_num); F(pfr_port_index, index);
	end();

	S(pfr_pkey);
	F(pfr_pkey, pkey);
	end();

	S(pfr_reg_mr);
	F(pfr_reg_mr, start); F(pfr_reg_mr, length); F(pfr_reg_mr, iova); F(pfr_reg_mr, pd_handle);
	F(pfr_reg_mr, access); F(pfr_reg_mr, policy); F(pfr_reg_mr, reserved);
	end();

	S(pfr_reg_mr_resp);
	F(pfr_reg_mr_resp, mr_handle); F(pfr_reg_mr_resp, lkey); F(pfr_reg_mr_resp, rkey);
	end();

	S(pfr_advise_mr);
	F(pfr_advise_mr, pd_handle); F(pfr_advise_mr, advice); F(pfr_advise_mr, flags); F(pfr_advise_mr, num_sge);
	end();

	S(ib_uverbs_sge);
	F(ib_uverbs_sge, addr); F(ib_uverbs_sge, length); F(ib_uverbs_sge, lkey);
	end();

	S(pfr_create_cq);
	F(pfr_create_cq, cqe); F(pfr_create_cq, channel_handle); F(pfr_create_cq, comp_vector); F(pfr_create_cq, flags);
	end();

	S(pfr_create_cq_resp);
	F(pfr_create_cq_resp, cq_handle); F(pfr_create_cq_resp, cqe); F(pfr_create_cq_resp, ring_size);
	end();

	S(ib_uverbs_destroy_cq_resp);
	F(ib_uverbs_destroy_cq_resp, comp_events_reported); F(ib_uverbs_destroy_cq_resp, async_events_reported);
	end();

	S(pfr_create_qp);
	F(pfr_create_qp, pd_handle); F(pfr_create_qp, send_cq_handle); F(pfr_create_qp, recv_cq_handle);
	F(pfr_create_qp, srq_handle); F(pfr_create_qp, xrcd_handle); F(pfr_create_qp, qp_type);
	F(pfr_create_qp, max_send_wr); F(pfr_create_qp, max_recv_wr); F(pfr_create_qp, max_send_sge);
	F(pfr_create_qp, max_recv_sge); F(pfr_create_qp, max_inline_data); F(pfr_create_qp, sq_sig_all);
	end();

	S(pfr_create_qp_resp);
	F(pfr_create_qp_resp, qp_handle); F(pfr_create_qp_resp, qp_num); F(pfr_create_qp_resp, max_send_wr);
	F(pfr_create_qp_resp, max_recv_wr); F(pfr_create_qp_resp, max_send_sge); F(pfr_create_qp_resp, max_recv_sge);
	F(pfr_create_qp_resp, max_inline_data); F(pfr_create_qp_resp, sq_offset); F(pfr_create_qp_resp, rq_offset);
	F(pfr_create_qp_resp, ring_size);
	end();

	S(ib_uverbs_qp_dest);
	F(ib_uverbs_qp_dest, dgid); F(ib_uverbs_qp_dest, flow_label); F(ib_uverbs_qp_dest, dlid);
	F(ib_uverbs_qp_dest, sgid_index); F(ib_uverbs_qp_dest, hop_limit); F(ib_uverbs_qp_dest, traffic_class);
	F(ib_uverbs_qp_dest, sl); F(ib_uverbs_qp_dest, src_path_bits); F(ib_uverbs_qp_dest, static_rate);
	F(ib_uverbs_qp_dest, is_global); F(ib_uverbs_qp_dest, port_num);
	end();

	S(ib_uverbs_modify_qp);
	F(ib_uverbs_modify_qp, dest); F(ib_uverbs_modify_qp, alt_dest); F(ib_uverbs_modify_qp, qp_handle);
	F(ib_uverbs_modify_qp, attr_mask); F(ib_uverbs_modify_qp, qkey); F(ib_uverbs_modify_qp, rq_psn);
	F(ib_uverbs_modify_qp, sq_psn); F(ib_uverbs_modify_qp, dest_qp_num); F(ib_uverbs_modify_qp, qp_access_flags);
	F(ib_uverbs_modify_qp, pkey_index); F(ib_uverbs_modify_qp, alt_pkey_index); F(ib_uverbs_modify_qp, qp_state);
	F(ib_uverbs_modify_qp, cur_qp_state); F(ib_uverbs_modify_qp, path_mtu); F(ib_uverbs_modify_qp, path_mig_state);
	F(ib_uverbs_modify_qp, en_sqd_async_notify); F(ib_uverbs_modify_qp, max_rd_atomic);
	F(ib_uverbs_modify_qp, max_dest_rd_atomic); F(ib_uverbs_modify_qp, min_rnr_timer); F(ib_uverbs_modify_qp, port_num);
	F(ib_uverbs_modify_qp, timeout); F(ib_uverbs_modify_qp, retry_cnt); F(ib_uverbs_modify_qp, rnr_retry);
	F(ib_uverbs_modify_qp, alt_port_num); F(ib_uverbs_modify_qp, alt_timeout);
	end();

	S(pfr_query_qp);
	F(pfr_query_qp, qp_handle); F(pfr_query_qp, attr_mask);
	end();

	S(ib_uverbs_query_qp_resp);
	F(ib_uverbs_query_qp_resp, dest); F(ib_uverbs_query_qp_resp, alt_dest); F(ib_uverbs_query_qp_resp, max_send_wr);
	F(ib_uverbs_query_qp_resp, max_recv_wr); F(ib_uverbs_query_qp_resp, max_send_sge);
	F(ib_uverbs_query_qp_resp, max_recv_sge); F(ib_uverbs_query_qp_resp, max_inline_data);
	F(ib_uverbs_query_qp_resp, qkey); F(ib_uverbs_query_qp_resp, rq_psn); F(ib_uverbs_query_qp_resp, sq_psn);
	F(ib_uverbs_query_qp_resp, dest_qp_num); F(ib_uverbs_query_qp_resp, qp_access_flags);
	F(ib_uverbs_query_qp_resp, pkey_index); F(ib_uverbs_query_qp_resp, alt_pkey_index);
	F(ib_uverbs_query_qp_resp, qp_state); F(ib_uverbs_query_qp_resp, cur_qp_state); F(ib_uverbs_query_qp_resp, path_mtu);
	F(ib_uverbs_query_qp_resp, path_mig_state); F(ib_uverbs_query_qp_resp, sq_draining);
	F(ib_uverbs_query_qp_resp, max_rd_atomic); F(ib_uverbs_query_qp_resp, max_dest_rd_atomic);
	F(ib_uverbs_query_qp_resp, min_rnr_timer); F(ib_uverbs_query_qp_resp, port_num); F(ib_uverbs_query_qp_resp, timeout);
	F(ib_uverbs_query_qp_resp, retry_cnt); F(ib_uverbs_query_qp_resp, rnr_retry); F(ib_uverbs_query_qp_resp, alt_port_num);
	F(ib_uverbs_query_qp_resp, alt_timeout); F(ib_uverbs_query_qp_resp, sq_sig_all);
	end();

	S(ib_uverbs_destroy_qp_resp);
	F(ib_uverbs_destroy_qp_resp, events_reported);
	end();

	S(pfr_create_srq);
	F(pfr_create_srq, pd_handle); F(pfr_create_srq, srq_type); F(pfr_create_srq, xrcd_handle);
	F(pfr_create_srq, cq_handle); F(pfr_create_srq, max_wr); F(pfr_create_srq, max_sge); F(pfr_create_srq, srq_limit);
	end();

	S(pfr_create_srq_resp);
	F(pfr_create_srq_resp, srq_handle); F(pfr_create_srq_resp, srq_num); F(pfr_create_srq_resp, max_wr);
	F(pfr_create_srq_resp, max_sge); F(pfr_create_srq_resp, ring_size);
	end();

	S(pfr_modify_srq);
	F(pfr_modify_srq, srq_handle); F(pfr_modify_srq, attr_mask); F(pfr_modify_srq, max_wr); F(pfr_modify_srq, srq_limit);
	end();

	S(pfr_query_srq_resp);
	F(pfr_query_srq_resp, max_wr); F(pfr_query_srq_resp, max_sge); F(pfr_query_srq_resp, srq_limit);
	end();

	S(ib_uverbs_destroy_srq_resp);
	F(ib_uverbs_destroy_srq_resp, events_reported);
	end();

	S(ib_uverbs_global_route);
	F(ib_uverbs_global_route, dgid); F(ib_uverbs_global_route, flow_label); F(ib_uverbs_global_route, sgid_index);
	F(ib_uverbs_global_route, hop_limit); F(ib_uverbs_global_route, traffic_class);
	end();

	S(ib_uverbs_ah_attr);
	F(ib_uverbs_ah_attr, grh); F(ib_uverbs_ah_attr, dlid); F(ib_uverbs_ah_attr, sl); F(ib_uverbs_ah_attr, src_path_bits);
	F(ib_uverbs_ah_attr, static_rate); F(ib_uverbs_ah_attr, is_global); F(ib_uverbs_ah_attr, port_num);
	end();

	S(pfr_open_xrcd);
	F(pfr_open_xrcd, flags); F(pfr_open_xrcd, oflags);
	end();

	S(pfr_create_ah);
	F(pfr_create_ah, pd_handle); F(pfr_create_ah, attr);
	end();

	S(pfr_device_stats);
	F(pfr_device_stats, connections); F(pfr_device_stats, open_contexts); F(pfr_device_stats, messages);
	F(pfr_device_stats, refused); F(pfr_device_stats, faults_raised); F(pfr_device_stats, faults_resolved);
	F(pfr_device_stats, faults_failed); F(pfr_device_stats, fault_answers_refused);
	F(pfr_device_stats, released_objects); F(pfr_device_stats, send_wqes); F(pfr_device_stats, recv_wqes);
	F(pfr_device_stats, cqes); F(pfr_device_stats, refused_wqes); F(pfr_device_stats, corrupt_rings);
	F(pfr_device_stats, doorbells);
	end();

	S(pfr_fault_request);
	F(pfr_fault_request, magic); F(pfr_fault_request, abi_version); F(pfr_fault_request, op);
	F(pfr_fault_request, fault_id); F(pfr_fault_request, addr); F(pfr_fault_request, length);
	F(pfr_fault_request, mr_handle); F(pfr_fault_request, flags); F(pfr_fault_request, method);
	end();

	S(pfr_fault_response);
	F(pfr_fault_response, magic); F(pfr_fault_response, abi_version); F(pfr_fault_response, op);
	F(pfr_fault_response, fault_id); F(pfr_fault_response, status); F(pfr_fault_response, pages);
	F(pfr_fault_response, ns);
	end();

	S(pfr_async_event);
	F(pfr_async_event, event_type); F(pfr_async_event, element_kind); F(pfr_async_event, handle);
	end();

	S(pfr_comp_event);
	F(pfr_comp_event, cq_handle);
	end();

	S(ib_uverbs_query_port_resp);
	F(ib_uverbs_query_port_resp, port_cap_flags); F(ib_uverbs_query_port_resp, max_msg_sz);
	F(ib_uverbs_query_port_resp, bad_pkey_cntr); F(ib_uverbs_query_port_resp, qkey_viol_cntr);
	F(ib_uverbs_query_port_resp, gid_tbl_len); F(ib_uverbs_query_port_resp, pkey_tbl_len);
	F(ib_uverbs_query_port_resp, lid); F(ib_uverbs_query_port_resp, sm_lid); F(ib_uverbs_query_port_resp, state);
	F(ib_uverbs_query_port_resp, max_mtu); F(ib_uverbs_query_port_resp, active_mtu); F(ib_uverbs_query_port_resp, lmc);
	F(ib_uverbs_query_port_resp, max_vl_num); F(ib_uverbs_query_port_resp, sm_sl);
	F(ib_uverbs_query_port_resp, subnet_timeout); F(ib_uverbs_query_port_resp, init_type_reply);
	F(ib_uverbs_query_port_resp, active_width); F(ib_uverbs_query_port_resp, active_speed);
	F(ib_uverbs_query_port_resp, phys_state); F(ib_uverbs_query_port_resp, link_layer);
	F(ib_uverbs_query_port_resp, flags);
	end();

	S(ib_uverbs_gid_entry);
	F(ib_uverbs_gid_entry, gid); F(ib_uverbs_gid_entry, gid_index); F(ib_uverbs_gid_entry, port_num);
	F(ib_uverbs_gid_entry, gid_type); F(ib_uverbs_gid_entry, netdev_ifindex);
	end();

	S(ib_uverbs_query_device_resp);
	F(ib_uverbs_query_device_resp, fw_ver); F(ib_uverbs_query_device_resp, node_guid);
	F(ib_uverbs_query_device_resp, sys_image_guid); F(ib_uverbs_query_device_resp, max_mr_size);
	F(ib_uverbs_query_device_resp, page_size_cap); F(ib_uverbs_query_device_resp, vendor_id);
	F(ib_uverbs_query_device_resp, vendor_part_id); F(ib_uverbs_query_device_resp, hw_ver);
	F(ib_uverbs_query_device_resp, max_qp); F(ib_uverbs_query_device_resp, max_qp_wr);
	F(ib_uverbs_query_device_resp, device_cap_flags); F(ib_uverbs_query_device_resp, max_sge);
	F(ib_uverbs_query_device_resp, max_sge_rd); F(ib_uverbs_query_device_resp, max_cq);
	F(ib_uverbs_query_device_resp, max_cqe); F(ib_uverbs_query_device_resp, max_mr);
	F(ib_uverbs_query_device_resp, max_pd); F(ib_uverbs_query_device_resp, max_qp_rd_atom);
	F(ib_uverbs_query_device_resp, max_ee_rd_atom); F(ib_uverbs_query_device_resp, max_res_rd_atom);
	F(ib_uverbs_query_device_resp, max_qp_init_rd_atom); F(ib_uverbs_query_device_resp, max_ee_init_rd_atom);
	F(ib_uverbs_query_device_resp, atomic_cap); F(ib_uverbs_query_device_resp, max_ee);
	F(ib_uverbs_query_device_resp, max_rdd); F(ib_uverbs_query_device_resp, max_mw);
	F(ib_uverbs_query_device_resp, max_raw_ipv6_qp); F(ib_uverbs_query_device_resp, max_raw_ethy_qp);
	F(ib_uverbs_query_device_resp, max_mcast_grp); F(ib_uverbs_query_device_resp, max_mcast_qp_attach);
	F(ib_uverbs_query_device_resp, max_total_mcast_qp_attach); F(ib_uverbs_query_device_resp, max_ah);
	F(ib_uverbs_query_device_resp, max_fmr); F(ib_uverbs_query_device_resp, max_map_per_fmr);
	F(ib_uverbs_query_device_resp, max_srq); F(ib_uverbs_query_device_resp, max_srq_wr);
	F(ib_uverbs_query_device_resp, max_srq_sge); F(ib_uverbs_query_device_resp, max_pkeys);
	F(ib_uverbs_query_device_resp, local_ca_ack_delay); F(ib_uverbs_query_device_resp, phys_port_cnt);
	end();

	S(ib_uverbs_ex_query_device_resp);
	F(ib_uverbs_ex_query_device_resp, base); F(ib_uverbs_ex_query_device_resp, comp_mask);
	F(ib_uverbs_ex_query_device_resp, response_length);
	F(ib_uverbs_ex_query_device_resp, odp_caps.general_caps);
	F(ib_uverbs_ex_query_device_resp, odp_caps.per_transport_caps.rc_odp_caps);
	F(ib_uverbs_ex_query_device_resp, odp_caps.per_transport_caps.uc_odp_caps);
	F(ib_uverbs_ex_query_device_resp, odp_caps.per_transport_caps.ud_odp_caps);
	F(ib_uverbs_ex_query_device_resp, timestamp_mask); F(ib_uverbs_ex_query_device_resp, hca_core_clock);
	F(ib_uverbs_ex_query_device_resp, device_cap_flags_ex);
	F(ib_uverbs_ex_query_device_resp, rss_caps.supported_qpts);
	F(ib_uverbs_ex_query_device_resp, rss_caps.max_rwq_indirection_tables);
	F(ib_uverbs_ex_query_device_resp, rss_caps.max_rwq_indirection_table_size);
	F(ib_uverbs_ex_query_device_resp, max_wq_type_rq); F(ib_uverbs_ex_query_device_resp, raw_packet_caps);
	F(ib_uverbs_ex_query_device_resp, tm_caps.max_rndv_hdr_size); F(ib_uverbs_ex_query_device_resp, tm_caps.max_num_tags);
	F(ib_uverbs_ex_query_device_resp, tm_caps.flags); F(ib_uverbs_ex_query_device_resp, tm_caps.max_ops);
	F(ib_uverbs_ex_query_device_resp, tm_caps.max_sge);
	F(ib_uverbs_ex_query_device_resp, cq_moderation_caps.max_cq_moderation_count);
	F(ib_uverbs_ex_query_device_resp, cq_moderation_caps.max_cq_moderation_period);
	F(ib_uverbs_ex_query_device_resp, max_dm_size); F(ib_uverbs_ex_query_device_resp, xrc_odp_caps);
	end();

	printf("\n  },\n  \"constants\": {");
	C(PFR_ABI_VERSION); C(PFR_QUEUE_MAGIC); C(PFR_QUEUE_LINE); C(PFR_QUEUE_DATA_OFFSET);
	C(PFR_QUEUE_SQ); C(PFR_QUEUE_RQ); C(PFR_QUEUE_SRQ); C(PFR_QUEUE_CQ); C(PFR_CQE_LOG2);
	C(PFR_DOORBELL_MAGIC); C(PFR_DOORBELL_PAGE_SIZE); C(PFR_DEVICE_RUNNING); C(PFR_DEVICE_FATAL);
	C(PFR_CTL_MAGIC); C(PFR_CTL_MAX_MESSAGE); C(PFR_CTL_MAX_FDS); C(PFR_NO_HANDLE); C(PFR_DEVICE_NAME_MAX);
	C(PFR_ADVISE_MAX_SGE); C(PFR_CTL_REPLY); C(PFR_INFO_DATA_PATH);
	C(PFR_OP_QUERY_INFO); C(PFR_OP_GET_CONTEXT); C(PFR_OP_QUERY_DEVICE); C(PFR_OP_QUERY_PORT);
	C(PFR_OP_QUERY_GID); C(PFR_OP_QUERY_PKEY); C(PFR_OP_ALLOC_PD); C(PFR_OP_DEALLOC_PD); C(PFR_OP_REG_MR);
	C(PFR_OP_DEREG_MR); C(PFR_OP_ADVISE_MR); C(PFR_OP_CREATE_COMP_CHANNEL); C(PFR_OP_DESTROY_COMP_CHANNEL);
	C(PFR_OP_CREATE_CQ); C(PFR_OP_DESTROY_CQ); C(PFR_OP_CREATE_QP); C(PFR_OP_MODIFY_QP); C(PFR_OP_QUERY_QP);
	C(PFR_OP_DESTROY_QP); C(PFR_OP_CREATE_SRQ); C(PFR_OP_MODIFY_SRQ); C(PFR_OP_QUERY_SRQ); C(PFR_OP_DESTROY_SRQ);
	C(PFR_OP_OPEN_XRCD); C(PFR_OP_CLOSE_XRCD); C(PFR_OP_CREATE_AH); C(PFR_OP_DESTROY_AH); C(PFR_OP_QUERY_STATS);
	C(PFR_OP_MAX);
	C(PFR_POLICY_DEFAULT); C(PFR_POLICY_TOUCH); C(PFR_POLICY_TOUCH_AHEAD); C(PFR_POLICY_PREFETCH);
	C(PFR_REFUSED_FRAMING); C(PFR_REFUSED_OP); C(PFR_REFUSED_BODY); C(PFR_REFUSED_HANDLE); C(PFR_REFUSED_FDS);
	C(PFR_REFUSED_PEER); C(PFR_REFUSED_RESOURCE); C(PFR_REFUSED_KINDS);
	C(PFR_XRCD_FILE); C(PFR_FAULT_MAGIC); C(PFR_FAULT_REQUEST); C(PFR_FAULT_RESOLVED); C(PFR_FAULT_WRITE);
	C(PFR_FAULT_TOUCH); C(PFR_FAULT_POPULATE);
	C(PFR_ELEMENT_DEVICE); C(PFR_ELEMENT_CQ); C(PFR_ELEMENT_QP); C(PFR_ELEMENT_SRQ); C(PFR_ELEMENT_PORT);
	printf("\n  }\n}\n");
	return 0;
}
