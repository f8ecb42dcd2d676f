// Shared receive queues.
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {
int op_post_srq_recv(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) { if (bad) *bad = wr; return EOPNOTSUPP; }
ibv_srq* op_create_srq_ex(ibv_context*, ibv_srq_init_attr_ex*) { return static_cast<ibv_srq*>(null_errno(EOPNOTSUPP)); }
int op_get_srq_num(ibv_srq*, uint32_t*) { return EOPNOTSUPP; }
}  // namespace rnic::shim

SHIM_EXPORT struct ibv_srq* ibv_create_srq(struct ibv_pd*, struct ibv_srq_init_attr*) { return static_cast<ibv_srq*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_modify_srq(struct ibv_srq*, struct ibv_srq_attr*, int) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_query_srq(struct ibv_srq*, struct ibv_srq_attr*) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_destroy_srq(struct ibv_srq*) { return EOPNOTSUPP; }
