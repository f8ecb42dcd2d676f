// The provider operations the shim installs in ibv_context.ops and verbs_context, grouped
// by the file that implements them. Every slot gets one of these; unsupported ones live in
// ops_unsupported.cc and return EOPNOTSUPP (int) or NULL with errno = EOPNOTSUPP.
// Hot path (called per WR / per poll, must not allocate): post_send, post_recv,
// post_srq_recv, poll_cq, req_notify_cq, and the ibv_qp_ex / ibv_cq_ex function tables.
#pragma once

#include <infiniband/verbs.h>

namespace rnic::shim {

// device.cc
int op_query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len);
int op_query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* in,
                       ibv_device_attr_ex* attr, size_t attr_size);
int op_query_rt_values(ibv_context* ctx, ibv_values_ex* values);

// cq.cc
int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int op_req_notify_cq(ibv_cq* cq, int solicited_only);
ibv_cq_ex* op_create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
int op_modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr);

// qp.cc
int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_qp* op_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);

// xrc.cc
ibv_xrcd* op_open_xrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr);
int op_close_xrcd(ibv_xrcd* xrcd);
ibv_qp* op_open_qp(ibv_context* ctx, ibv_qp_open_attr* attr);

// srq.cc
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_srq* op_create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
int op_get_srq_num(ibv_srq* srq, uint32_t* num);
int op_post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad);

// pd_mr.cc (memory windows)
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type);
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);
int op_dealloc_mw(ibv_mw* mw);
ibv_td* op_alloc_td(ibv_context* ctx, ibv_td_init_attr* init);
int op_dealloc_td(ibv_td* td);
ibv_pd* op_alloc_parent_domain(ibv_context* ctx, ibv_parent_domain_init_attr* attr);
ibv_dm* op_alloc_dm(ibv_context* ctx, ibv_alloc_dm_attr* attr);
int op_free_dm(ibv_dm* dm);
ibv_mr* op_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t off, size_t length, unsigned int access);
int op_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                 uint32_t num_sge);

// ops_unsupported.cc: EOPNOTSUPP for everything softrnic does not model.
int uns_compat_query_device(ibv_context*, ibv_device_attr*);
int uns_compat_query_port(ibv_context*, uint8_t, struct _compat_ibv_port_attr*);
void* uns_compat_void();
void uns_abi_placeholder();
ibv_mr* uns_alloc_null_mr(ibv_pd*);
int uns_read_counters(ibv_counters*, uint64_t*, uint32_t, uint32_t);
int uns_attach_counters_point_flow(ibv_counters*, ibv_counter_attach_attr*, ibv_flow*);
ibv_counters* uns_create_counters(ibv_context*, ibv_counters_init_attr*);
int uns_destroy_counters(ibv_counters*);
int uns_modify_flow_action_esp(ibv_flow_action*, ibv_flow_action_esp_attr*);
int uns_destroy_flow_action(ibv_flow_action*);
ibv_flow_action* uns_create_flow_action_esp(ibv_context*, ibv_flow_action_esp_attr*);
int uns_modify_qp_rate_limit(ibv_qp*, ibv_qp_rate_limit_attr*);
int uns_destroy_rwq_ind_table(ibv_rwq_ind_table*);
ibv_rwq_ind_table* uns_create_rwq_ind_table(ibv_context*, ibv_rwq_ind_table_init_attr*);
int uns_destroy_wq(ibv_wq*);
int uns_modify_wq(ibv_wq*, ibv_wq_attr*);
ibv_wq* uns_create_wq(ibv_context*, ibv_wq_init_attr*);
int uns_destroy_flow(ibv_flow*);
ibv_flow* uns_create_flow(ibv_qp*, ibv_flow_attr*);

}  // namespace rnic::shim
