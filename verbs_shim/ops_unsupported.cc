// Everything softrnic does not model: unsupported op slots (EOPNOTSUPP, or NULL with
// errno = EOPNOTSUPP), unsupported exported verbs, and the IBVERBS_PRIVATE_34 provider API
// as harmless stubs so that the real libmlx5/libefa (DT_NEEDED of perftest, libfabric,
// UCX) load and register against this library. Their driver code never reaches these
// stubs for a softrnic device: mlx5/efa check the NULL ops word after ibv_device first.
#include <cerrno>
#include <cstdarg>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {

namespace {
int eopnotsupp() { return fail_errno(EOPNOTSUPP); }
template <class T>
T* enull() {
  errno = EOPNOTSUPP;
  return nullptr;
}
}  // namespace

int uns_compat_query_device(ibv_context*, ibv_device_attr*) { return fail_errno(EOPNOTSUPP); }
int uns_compat_query_port(ibv_context*, uint8_t, struct _compat_ibv_port_attr*) {
  return fail_errno(EOPNOTSUPP);
}
void* uns_compat_void() { return enull<void>(); }
void uns_abi_placeholder() {}
ibv_mr* uns_alloc_null_mr(ibv_pd*) { return enull<ibv_mr>(); }
int uns_read_counters(ibv_counters*, uint64_t*, uint32_t, uint32_t) { return eopnotsupp(); }
int uns_attach_counters_point_flow(ibv_counters*, ibv_counter_attach_attr*, ibv_flow*) { return eopnotsupp(); }
ibv_counters* uns_create_counters(ibv_context*, ibv_counters_init_attr*) { return enull<ibv_counters>(); }
int uns_destroy_counters(ibv_counters*) { return eopnotsupp(); }
int uns_modify_flow_action_esp(ibv_flow_action*, ibv_flow_action_esp_attr*) { return eopnotsupp(); }
int uns_destroy_flow_action(ibv_flow_action*) { return eopnotsupp(); }
ibv_flow_action* uns_create_flow_action_esp(ibv_context*, ibv_flow_action_esp_attr*) { return enull<ibv_flow_action>(); }
int uns_modify_qp_rate_limit(ibv_qp*, ibv_qp_rate_limit_attr*) { return eopnotsupp(); }
int uns_destroy_rwq_ind_table(ibv_rwq_ind_table*) { return eopnotsupp(); }
ibv_rwq_ind_table* uns_create_rwq_ind_table(ibv_context*, ibv_rwq_ind_table_init_attr*) { return enull<ibv_rwq_ind_table>(); }
int uns_destroy_wq(ibv_wq*) { return eopnotsupp(); }
int uns_modify_wq(ibv_wq*, ibv_wq_attr*) { return eopnotsupp(); }
ibv_wq* uns_create_wq(ibv_context*, ibv_wq_init_attr*) { return enull<ibv_wq>(); }
int uns_destroy_flow(ibv_flow*) { return eopnotsupp(); }
ibv_flow* uns_create_flow(ibv_qp*, ibv_flow_attr*) { return enull<ibv_flow>(); }

}  // namespace rnic::shim

// ---------------------------------------------------------------------------------------
// Exported verbs softrnic does not support (yet). Signatures follow <infiniband/verbs.h>.

SHIM_EXPORT struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
SHIM_EXPORT int ibv_set_ece(struct ibv_qp*, struct ibv_ece*) {
  return rnic::shim::fail_errno(EOPNOTSUPP);
}
SHIM_EXPORT int ibv_query_ece(struct ibv_qp*, struct ibv_ece*) {
  return rnic::shim::fail_errno(EOPNOTSUPP);
}
SHIM_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context*, struct ibv_ah_attr*, uint8_t[6],
                                            uint16_t*) {
  return rnic::shim::fail_errno(EOPNOTSUPP);
}

// Kernel-ABI copy helpers (IBVERBS_1.0/1.1). Only the real librdmacm calls them, and only
// with data from /dev/infiniband/rdma_cm, which never exists with softrnic: no-ops.
SHIM_EXPORT void ibv_copy_qp_attr_from_kern(void*, void*) {}
SHIM_EXPORT void ibv_copy_ah_attr_from_kern(void*, void*) {}
SHIM_EXPORT void ibv_copy_path_rec_from_kern(void*, void*) {}
SHIM_EXPORT void ibv_copy_path_rec_to_kern(void*, void*) {}

// ---------------------------------------------------------------------------------------
// IBVERBS_PRIVATE_34 provider API. int stubs return EOPNOTSUPP, pointer stubs NULL with
// errno, void stubs do nothing. Arguments are ignored (declared without parameters).

extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
}

#define SHIM_INT_STUB(name) \
  SHIM_EXPORT int name() { return rnic::shim::fail_errno(EOPNOTSUPP); }
#define SHIM_PTR_STUB(name) \
  SHIM_EXPORT void* name() {  \
    errno = EOPNOTSUPP;      \
    return nullptr;          \
  }
#define SHIM_VOID_STUB(name) \
  SHIM_EXPORT void name() {}

SHIM_INT_STUB(execute_ioctl)
SHIM_INT_STUB(ibv_cmd_advise_mr)
SHIM_INT_STUB(ibv_cmd_alloc_dm)
SHIM_INT_STUB(ibv_cmd_alloc_mw)
SHIM_INT_STUB(ibv_cmd_alloc_pd)
SHIM_INT_STUB(ibv_cmd_attach_mcast)
SHIM_INT_STUB(ibv_cmd_close_xrcd)
SHIM_INT_STUB(ibv_cmd_create_ah)
SHIM_INT_STUB(ibv_cmd_create_counters)
SHIM_INT_STUB(ibv_cmd_create_cq)
SHIM_INT_STUB(ibv_cmd_create_cq_ex)
SHIM_INT_STUB(ibv_cmd_create_flow)
SHIM_INT_STUB(ibv_cmd_create_flow_action_esp)
SHIM_INT_STUB(ibv_cmd_create_qp)
SHIM_INT_STUB(ibv_cmd_create_qp_ex)
SHIM_INT_STUB(ibv_cmd_create_qp_ex2)
SHIM_INT_STUB(ibv_cmd_create_rwq_ind_table)
SHIM_INT_STUB(ibv_cmd_create_srq)
SHIM_INT_STUB(ibv_cmd_create_srq_ex)
SHIM_INT_STUB(ibv_cmd_create_wq)
SHIM_INT_STUB(ibv_cmd_dealloc_mw)
SHIM_INT_STUB(ibv_cmd_dealloc_pd)
SHIM_INT_STUB(ibv_cmd_dereg_mr)
SHIM_INT_STUB(ibv_cmd_destroy_ah)
SHIM_INT_STUB(ibv_cmd_destroy_counters)
SHIM_INT_STUB(ibv_cmd_destroy_cq)
SHIM_INT_STUB(ibv_cmd_destroy_flow)
SHIM_INT_STUB(ibv_cmd_destroy_flow_action)
SHIM_INT_STUB(ibv_cmd_destroy_qp)
SHIM_INT_STUB(ibv_cmd_destroy_rwq_ind_table)
SHIM_INT_STUB(ibv_cmd_destroy_srq)
SHIM_INT_STUB(ibv_cmd_destroy_wq)
SHIM_INT_STUB(ibv_cmd_detach_mcast)
SHIM_INT_STUB(ibv_cmd_free_dm)
SHIM_INT_STUB(ibv_cmd_get_context)
SHIM_INT_STUB(ibv_cmd_modify_cq)
SHIM_INT_STUB(ibv_cmd_modify_flow_action_esp)
SHIM_INT_STUB(ibv_cmd_modify_qp)
SHIM_INT_STUB(ibv_cmd_modify_qp_ex)
SHIM_INT_STUB(ibv_cmd_modify_srq)
SHIM_INT_STUB(ibv_cmd_modify_wq)
SHIM_INT_STUB(ibv_cmd_open_qp)
SHIM_INT_STUB(ibv_cmd_open_xrcd)
SHIM_INT_STUB(ibv_cmd_poll_cq)
SHIM_INT_STUB(ibv_cmd_post_recv)
SHIM_INT_STUB(ibv_cmd_post_send)
SHIM_INT_STUB(ibv_cmd_post_srq_recv)
SHIM_INT_STUB(ibv_cmd_query_context)
SHIM_INT_STUB(ibv_cmd_query_device_any)
SHIM_INT_STUB(ibv_cmd_query_mr)
SHIM_INT_STUB(ibv_cmd_query_port)
SHIM_INT_STUB(ibv_cmd_query_qp)
SHIM_INT_STUB(ibv_cmd_query_srq)
SHIM_INT_STUB(ibv_cmd_read_counters)
SHIM_INT_STUB(ibv_cmd_reg_dm_mr)
SHIM_INT_STUB(ibv_cmd_reg_dmabuf_mr)
SHIM_INT_STUB(ibv_cmd_reg_mr)
SHIM_INT_STUB(ibv_cmd_req_notify_cq)
SHIM_INT_STUB(ibv_cmd_rereg_mr)
SHIM_INT_STUB(ibv_cmd_resize_cq)
SHIM_INT_STUB(ibv_read_ibdev_sysfs_file)
SHIM_INT_STUB(__ioctl_final_num_attrs)
SHIM_PTR_STUB(_verbs_init_and_alloc_context)
SHIM_PTR_STUB(verbs_open_device)
SHIM_VOID_STUB(__verbs_log)
SHIM_VOID_STUB(verbs_init_cq)
SHIM_VOID_STUB(verbs_register_driver_34)  // mlx5/efa constructors call this: accept, ignore
SHIM_VOID_STUB(verbs_set_ops)
SHIM_VOID_STUB(verbs_uninit_context)
