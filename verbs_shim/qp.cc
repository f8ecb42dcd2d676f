// Queue pairs: every QP is an ibv_qp_ex with the ibv_wr_* table filled; create, modify,
// query, destroy, post_send/post_recv.
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {
int op_post_send(ibv_qp*, ibv_send_wr* wr, ibv_send_wr** bad) { if (bad) *bad = wr; return EOPNOTSUPP; }
int op_post_recv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr** bad) { if (bad) *bad = wr; return EOPNOTSUPP; }
ibv_qp* op_create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*) { return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP)); }
}  // namespace rnic::shim

SHIM_EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd*, struct ibv_qp_init_attr*) { return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_modify_qp(struct ibv_qp*, struct ibv_qp_attr*, int) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_query_qp(struct ibv_qp*, struct ibv_qp_attr*, int, struct ibv_qp_init_attr*) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_destroy_qp(struct ibv_qp*) { return EOPNOTSUPP; }
SHIM_EXPORT struct ibv_qp_ex* ibv_qp_to_qp_ex(struct ibv_qp*) { return static_cast<ibv_qp_ex*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp*, enum ibv_wr_opcode, uint32_t) { return 0; }
