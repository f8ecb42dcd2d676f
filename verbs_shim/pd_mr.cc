// Protection domains, memory regions and memory windows.
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace rnic::shim;

namespace rnic::shim {
ibv_mw* op_alloc_mw(ibv_pd*, ibv_mw_type) { return static_cast<ibv_mw*>(null_errno(EOPNOTSUPP)); }
int op_bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { return EOPNOTSUPP; }
int op_dealloc_mw(ibv_mw*) { return EOPNOTSUPP; }
}  // namespace rnic::shim

SHIM_EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context*) { return static_cast<ibv_pd*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_dealloc_pd(struct ibv_pd*) { return EOPNOTSUPP; }
SHIM_EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd*, void*, size_t, int) { return static_cast<ibv_mr*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT struct ibv_mr* ibv_reg_mr_iova(struct ibv_pd*, void*, size_t, uint64_t, int) { return static_cast<ibv_mr*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd*, void*, size_t, uint64_t, unsigned int) { return static_cast<ibv_mr*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_rereg_mr(struct ibv_mr*, int, struct ibv_pd*, void*, size_t, int) { return IBV_REREG_MR_ERR_INPUT; }
SHIM_EXPORT int ibv_dereg_mr(struct ibv_mr*) { return EOPNOTSUPP; }
