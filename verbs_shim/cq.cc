// Completion queues: ibv_cq allocated as ibv_cq_ex (poll_cq and the start/next/end_poll
// + read_* table), notification and resize.
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {
int op_poll_cq(ibv_cq*, int, ibv_wc*) { return -1; }
int op_req_notify_cq(ibv_cq*, int) { return EOPNOTSUPP; }
ibv_cq_ex* op_create_cq_ex(ibv_context*, ibv_cq_init_attr_ex*) { return static_cast<ibv_cq_ex*>(null_errno(EOPNOTSUPP)); }
}  // namespace rnic::shim

SHIM_EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context*, int, void*, struct ibv_comp_channel*, int) { return static_cast<ibv_cq*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_resize_cq(struct ibv_cq*, int) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_destroy_cq(struct ibv_cq*) { return EOPNOTSUPP; }
