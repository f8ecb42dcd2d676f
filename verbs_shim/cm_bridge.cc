// The CM bridge table (verbs_shim/cm_bridge.h): librdmacm.so.1 reaches the device's CM
// agent through these functions, found via the tail of our ibv_device.
#include "verbs_shim/cm_bridge.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "verbs_shim/host.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {
namespace {

Host* host_of(ibv_context* c) {
  if (c == nullptr) return nullptr;
  Context* ctx = to_ctx(c);
  if (ctx->host_ == nullptr || host_inherited(ctx->host_)) return nullptr;
  return ctx->host_;
}

int cm_query(ibv_context* c, softrnic_cm_device_info* out) {
  Host* h = host_of(c);
  if (h == nullptr || out == nullptr) return ENODEV;
  std::memset(out, 0, sizeof *out);
  out->ipv4 = h->ip_;
  auto g = h->dev_->query_gid(1, 0);
  if (g.has_value()) std::memcpy(out->gid, g.value().raw.data(), 16);
  out->node_guid = to_ctx(c)->dev_->node_guid_be_;
  out->port_num = 1;
  auto p = h->dev_->query_port(1);
  out->active_mtu = p.has_value() ? static_cast<uint8_t>(p.value().active_mtu) : static_cast<uint8_t>(IBV_MTU_1024);
  out->ack_delay = h->dev_->attr().local_ca_ack_delay;
  return 0;
}

// NEEDS(rdmacm): the cm::Agent of emu/cm/agent.h; until it is merged the CM ops fail with
// ENOSYS and librdmacm reports that errno from rdma_listen / rdma_connect.
int cm_set_handler(ibv_context*, softrnic_cm_handler, void*) { return 0; }
int cm_listen(ibv_context*, uint64_t, uint64_t*) { return ENOSYS; }
int cm_unlisten(ibv_context*, uint64_t) { return 0; }
int cm_connect(ibv_context*, in_addr, const softrnic_cm_msg*, uint64_t*) { return ENOSYS; }
int cm_send(ibv_context*, uint64_t, const softrnic_cm_msg*) { return ENOSYS; }
void cm_release(ibv_context*, uint64_t) {}

const softrnic_cm_ops kOps = {
    SOFTRNIC_CM_MAGIC, SOFTRNIC_CM_ABI, sizeof(softrnic_cm_ops),
    cm_query, cm_set_handler, cm_listen, cm_unlisten, cm_connect, cm_send, cm_release,
};

}  // namespace

const softrnic_cm_ops* cm_bridge_ops() { return &kOps; }

}  // namespace rnic::shim
