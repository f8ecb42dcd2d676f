// Address handles (UD), including ibv_create_ah_from_wc / ibv_init_ah_from_wc.
#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

SHIM_EXPORT struct ibv_ah* ibv_create_ah(struct ibv_pd*, struct ibv_ah_attr*) { return static_cast<ibv_ah*>(null_errno(EOPNOTSUPP)); }
SHIM_EXPORT int ibv_destroy_ah(struct ibv_ah*) { return EOPNOTSUPP; }
SHIM_EXPORT int ibv_init_ah_from_wc(struct ibv_context*, uint8_t, struct ibv_wc*, struct ibv_grh*, struct ibv_ah_attr*) { return EOPNOTSUPP; }
SHIM_EXPORT struct ibv_ah* ibv_create_ah_from_wc(struct ibv_pd*, struct ibv_wc*, struct ibv_grh*, uint8_t) { return static_cast<ibv_ah*>(null_errno(EOPNOTSUPP)); }
