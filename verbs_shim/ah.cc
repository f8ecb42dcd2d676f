// Address handles (UD destinations): create/destroy, ibv_init_ah_from_wc and
// ibv_create_ah_from_wc (RoCEv2/IPv4: the peer's address is in the IPv4 header that sits in
// the last 20 bytes of the 40-byte GRH area), and verbs <-> emu AhAttr conversion.
#include <cstring>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {

emu::AhAttr to_emu(const ibv_ah_attr& a) {
  emu::AhAttr e;
  std::memcpy(e.grh.dgid, a.grh.dgid.raw, 16);
  e.grh.flow_label = a.grh.flow_label;
  e.grh.sgid_index = a.grh.sgid_index;
  e.grh.hop_limit = a.grh.hop_limit;
  e.grh.traffic_class = a.grh.traffic_class;
  e.dlid = a.dlid;
  e.sl = a.sl;
  e.src_path_bits = a.src_path_bits;
  e.static_rate = a.static_rate;
  e.is_global = a.is_global;
  e.port_num = a.port_num;
  return e;
}

void from_emu(const emu::AhAttr& e, ibv_ah_attr* a) {
  std::memset(a, 0, sizeof *a);
  std::memcpy(a->grh.dgid.raw, e.grh.dgid, 16);
  a->grh.flow_label = e.grh.flow_label;
  a->grh.sgid_index = e.grh.sgid_index;
  a->grh.hop_limit = e.grh.hop_limit;
  a->grh.traffic_class = e.grh.traffic_class;
  a->dlid = e.dlid;
  a->sl = e.sl;
  a->src_path_bits = e.src_path_bits;
  a->static_rate = e.static_rate;
  a->is_global = e.is_global;
  a->port_num = e.port_num;
}

}  // namespace rnic::shim

SHIM_EXPORT struct ibv_ah* ibv_create_ah(struct ibv_pd* pd, struct ibv_ah_attr* attr) {
  return guard_ptr<ibv_ah>([&]() -> ibv_ah* {
    if (pd == nullptr || attr == nullptr) return static_cast<ibv_ah*>(null_errno(EINVAL));
    if (inherited(pd->context)) return static_cast<ibv_ah*>(null_errno(EIO));
    auto r = to_ctx(pd->context)->emu_->create_ah(to_pd(pd)->emu_, to_emu(*attr));
    if (!r.has_value()) return static_cast<ibv_ah*>(null_errno(err_of(r.error())));
    auto* a = new Ah();
    a->emu_ = std::move(r.value());
    a->emu_->user_context = a;
    a->pub_.context = pd->context;
    a->pub_.pd = pd;
    a->pub_.handle = a->emu_->handle();
    pd_hold(pd);
    return &a->pub_;
  });
}

SHIM_EXPORT int ibv_destroy_ah(struct ibv_ah* ah) {
  if (ah == nullptr) return fail_errno(EINVAL);
  if (inherited(ah->context)) return fail_errno(EIO);
  return guard_int([&] {
    Ah* a = to_ah(ah);
    emu::Status st = to_ctx(ah->context)->emu_->destroy_ah(a->emu_);
    if (!st.is_ok()) return err_of(st);
    pd_release(ah->pd);
    a->emu_->user_context = nullptr;
    delete a;
    return 0;
  });
}

// IBA 11.2.4.7 (RoCEv2 annex A17.4.5.2): build the reply AH from a received UD completion.
SHIM_EXPORT int ibv_init_ah_from_wc(struct ibv_context* context, uint8_t port_num, struct ibv_wc* wc,
                                    struct ibv_grh* grh, struct ibv_ah_attr* ah_attr) {
  if (context == nullptr || wc == nullptr || ah_attr == nullptr) return fail_errno(EINVAL);
  if (inherited(context)) return fail_errno(EIO);
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->port_num = port_num;
  ah_attr->sl = wc->sl;
  ah_attr->dlid = wc->slid;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  // RoCE needs the GRH.
  if (!(wc->wc_flags & IBV_WC_GRH) || grh == nullptr) return fail_errno(EINVAL);
  ah_attr->is_global = 1;
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  const uint8_t* ip4 = raw + 20;  // IPv4 header in the last 20 bytes of the GRH area
  uint8_t our_addr[16];
  if ((ip4[0] >> 4) == 4) {
    // Peer address = IPv4 source; our address = IPv4 destination.
    std::memset(ah_attr->grh.dgid.raw, 0, 16);
    ah_attr->grh.dgid.raw[10] = 0xff;
    ah_attr->grh.dgid.raw[11] = 0xff;
    std::memcpy(&ah_attr->grh.dgid.raw[12], ip4 + 12, 4);
    std::memset(our_addr, 0, 16);
    our_addr[10] = 0xff;
    our_addr[11] = 0xff;
    std::memcpy(&our_addr[12], ip4 + 16, 4);
    ah_attr->grh.traffic_class = ip4[1];
    ah_attr->grh.hop_limit = 0xff;
    ah_attr->grh.flow_label = 0;
  } else {
    std::memcpy(ah_attr->grh.dgid.raw, grh->sgid.raw, 16);
    std::memcpy(our_addr, grh->dgid.raw, 16);
    uint32_t vtf = be32toh(grh->version_tclass_flow);
    ah_attr->grh.flow_label = vtf & 0xfffff;
    ah_attr->grh.traffic_class = static_cast<uint8_t>((vtf >> 20) & 0xff);
    ah_attr->grh.hop_limit = 0xff;
  }
  // sgid_index: our GID that the packet was addressed to.
  Context* ctx = to_ctx(context);
  // The populated GIDs only (gid_tbl_len also counts empty slots).
  const int populated = static_cast<int>(ctx->emu_->gids().size());
  for (int i = 0; i < populated; ++i) {
    ibv_gid g;
    int type = 0;
    if (query_gid(ctx, port_num, static_cast<uint32_t>(i), &g, &type) &&
        std::memcmp(g.raw, our_addr, 16) == 0) {
      ah_attr->grh.sgid_index = static_cast<uint8_t>(i);
      return 0;
    }
  }
  return fail_errno(ENOENT);
}

SHIM_EXPORT struct ibv_ah* ibv_create_ah_from_wc(struct ibv_pd* pd, struct ibv_wc* wc,
                                                 struct ibv_grh* grh, uint8_t port_num) {
  if (pd == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  int rc = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  return ibv_create_ah(pd, &attr);
}
