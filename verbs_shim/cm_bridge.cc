// The CM bridge table (verbs_shim/cm_bridge.h): librdmacm.so.1 reaches the device's CM
// agent (emu/cm/agent.h) through these functions, found via the tail of our ibv_device.
// They translate softrnic_cm_msg <-> the agent's parameter and event structs; every
// agent event of this process's connections goes to the one handler librdmacm installed.
#include "verbs_shim/cm_bridge.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>

#include "emu/cm/agent.h"
#include "emu/transport/engine.h"
#include "verbs_shim/host.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {
namespace {

// The consumer librdmacm installed (one per process: embedded hosting has one device).
std::mutex g_handler_mu;
softrnic_cm_handler g_fn = nullptr;
void* g_user = nullptr;

Host* host_of(ibv_context* c) {
  if (c == nullptr) return nullptr;
  Context* ctx = to_ctx(c);
  if (ctx->host_ == nullptr || host_inherited(ctx->host_)) return nullptr;
  return ctx->host_;
}

cm::Agent* agent_of(ibv_context* c) { return host_cm_agent(host_of(c)); }

int pos(int64_t rc) { return rc < 0 ? static_cast<int>(-rc) : 0; }

void copy_pdata(softrnic_cm_msg* m, const std::vector<uint8_t>& v) {
  size_t n = std::min(v.size(), sizeof m->private_data);
  if (n != 0) std::memcpy(m->private_data, v.data(), n);
  m->private_data_len = static_cast<uint32_t>(n);
}

uint32_t msg_of(cm::Msg m) {
  switch (m) {
    case cm::Msg::kReq: return SOFTRNIC_CM_REQ;
    case cm::Msg::kRep: return SOFTRNIC_CM_REP;
    case cm::Msg::kDreq: return SOFTRNIC_CM_DREQ;
    case cm::Msg::kSidrReq: return SOFTRNIC_CM_SIDR_REQ;
    case cm::Msg::kOther: break;
  }
  return 0;
}

// An agent event as a softrnic_cm_msg, to the installed handler.
void deliver(const cm::Event& e) {
  softrnic_cm_msg m{};
  uint64_t listen = 0;
  m.service_id = e.service_id;
  m.qpn = e.remote_qpn;
  m.starting_psn = e.starting_psn;
  m.responder_resources = e.responder_resources;
  m.initiator_depth = e.initiator_depth;
  m.retry_count = e.retry_count;
  m.rnr_retry_count = e.rnr_retry_count;
  m.flow_control = e.flow_control ? 1 : 0;
  m.srq = e.srq ? 1 : 0;
  m.target_ack_delay = e.target_ack_delay;
  copy_pdata(&m, e.private_data);
  switch (e.type) {
    case cm::EventType::kReqReceived:
    case cm::EventType::kSidrReqReceived:
      m.type = e.type == cm::EventType::kReqReceived ? SOFTRNIC_CM_REQ : SOFTRNIC_CM_SIDR_REQ;
      listen = e.service_id;  // the listen handle is the service ID
      m.qp_type = e.qp_type == cm::QpKind::kUc ? IBV_QPT_UC : IBV_QPT_RC;
      m.path_mtu = e.path.mtu;
      m.local_ack_timeout = e.path.local_ack_timeout;
      m.traffic_class = e.path.traffic_class;
      m.hop_limit = e.path.hop_limit;
      m.sl = e.path.sl;
      m.flow_label = e.path.flow_label;
      // As on the wire: the REQ's "local" GID is the sender's.
      std::memcpy(m.local_gid, e.path.remote_gid.data(), 16);
      std::memcpy(m.remote_gid, e.path.local_gid.data(), 16);
      if (e.type == cm::EventType::kSidrReqReceived) std::memcpy(m.local_gid, e.src_addr.data(), 16);
      break;
    case cm::EventType::kRepReceived: m.type = SOFTRNIC_CM_REP; break;
    case cm::EventType::kRtuReceived: m.type = SOFTRNIC_CM_RTU; break;
    case cm::EventType::kRejReceived:
      m.type = SOFTRNIC_CM_REJ;
      m.status = e.reject_reason;
      m.rej_msg = static_cast<uint8_t>(e.msg);
      break;
    case cm::EventType::kMraReceived:
      m.type = SOFTRNIC_CM_MRA;
      m.status = e.service_timeout;
      break;
    case cm::EventType::kDreqReceived: m.type = SOFTRNIC_CM_DREQ; break;
    case cm::EventType::kDrepReceived: m.type = SOFTRNIC_CM_DREP; break;
    case cm::EventType::kTimeout:
      m.type = SOFTRNIC_CM_TIMEOUT;
      m.status = msg_of(e.msg);
      break;
    case cm::EventType::kTimewaitExit: m.type = SOFTRNIC_CM_TIMEWAIT_EXIT; break;
    case cm::EventType::kSidrRepReceived:
      m.type = SOFTRNIC_CM_SIDR_REP;
      m.status = e.sidr_status;
      m.qpn = e.qpn;
      m.qkey = e.qkey;
      break;
  }
  softrnic_cm_handler fn;
  void* user;
  {
    std::lock_guard<std::mutex> lk(g_handler_mu);
    fn = g_fn;
    user = g_user;
  }
  if (fn != nullptr) fn(user, e.comm_id, listen, &m);
}

std::span<const uint8_t> pdata(const softrnic_cm_msg* m) {
  return {m->private_data, std::min<size_t>(m->private_data_len, sizeof m->private_data)};
}

cm::Path path_of(const softrnic_cm_msg* m, uint8_t default_mtu) {
  cm::Path p;
  std::memcpy(p.local_gid.data(), m->local_gid, 16);
  std::memcpy(p.remote_gid.data(), m->remote_gid, 16);
  p.flow_label = m->flow_label & 0xFFFFF;
  p.traffic_class = m->traffic_class;
  p.hop_limit = m->hop_limit ? m->hop_limit : 64;
  p.sl = m->sl;
  p.mtu = m->path_mtu ? m->path_mtu : default_mtu;
  if (m->local_ack_timeout) p.local_ack_timeout = m->local_ack_timeout;
  return p;
}

int cm_query(ibv_context* c, softrnic_cm_device_info* out) {
  Host* h = host_of(c);
  if (h == nullptr || out == nullptr) return ENODEV;
  std::memset(out, 0, sizeof *out);
  out->ipv4.s_addr = htonl(h->dev_->ipv4());  // 0.0.0.0 on an IPv6 device
  const auto& gids = h->dev_->gids();
  size_t n = std::min<size_t>(gids.size(), SOFTRNIC_CM_MAX_GIDS);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out->gids[i].raw, gids[i].raw.data(), 16);
    out->gids[i].scope_id = gids[i].addr.ipv6 && gids[i].addr.link_local() ? gids[i].addr.scope_id : 0;
  }
  out->gid_count = static_cast<uint32_t>(n);
  if (n > 0) std::memcpy(out->gid, out->gids[0].raw, 16);
  out->node_guid = to_ctx(c)->dev_->node_guid_be_;
  out->port_num = 1;
  auto p = h->dev_->query_port(1);
  out->active_mtu = p.has_value() ? static_cast<uint8_t>(p.value().active_mtu) : static_cast<uint8_t>(IBV_MTU_1024);
  out->ack_delay = h->dev_->attr().local_ca_ack_delay;
  return 0;
}

int cm_set_handler(ibv_context* c, softrnic_cm_handler fn, void* user) {
  if (host_of(c) == nullptr) return ENODEV;
  std::lock_guard<std::mutex> lk(g_handler_mu);
  g_fn = fn;
  g_user = user;
  return 0;
}

int cm_listen(ibv_context* c, uint64_t service_id, uint64_t* handle) {
  cm::Agent* a = agent_of(c);
  if (a == nullptr) return ENOSYS;
  int rc = a->listen(service_id, deliver);
  if (rc < 0) return -rc;
  *handle = service_id;
  return 0;
}

int cm_unlisten(ibv_context* c, uint64_t handle) {
  cm::Agent* a = agent_of(c);
  if (a == nullptr) return ENOSYS;
  return pos(a->cancel_listen(handle));
}

int cm_connect(ibv_context* c, const softrnic_cm_msg* m, uint64_t* conn) {
  cm::Agent* a = agent_of(c);
  if (a == nullptr) return ENOSYS;
  if (m == nullptr || conn == nullptr) return EINVAL;
  uint8_t mtu = static_cast<uint8_t>(host_of(c)->dev_->query_port(1).value().active_mtu);
  int64_t rc = -EINVAL;
  if (m->type == SOFTRNIC_CM_REQ) {
    cm::ReqParams p;
    p.service_id = m->service_id;
    p.local_qpn = m->qpn;
    p.qp_type = m->qp_type == IBV_QPT_UC ? cm::QpKind::kUc : cm::QpKind::kRc;
    p.starting_psn = m->starting_psn;
    p.responder_resources = m->responder_resources;
    p.initiator_depth = m->initiator_depth;
    p.retry_count = m->retry_count;
    p.rnr_retry_count = m->rnr_retry_count;
    p.flow_control = m->flow_control != 0;
    p.srq = m->srq != 0;
    p.path = path_of(m, mtu);
    p.private_data = pdata(m);
    rc = a->send_req(p, deliver);
  } else if (m->type == SOFTRNIC_CM_SIDR_REQ) {
    cm::SidrReqParams p;
    p.service_id = m->service_id;
    p.path = path_of(m, mtu);
    p.private_data = pdata(m);
    rc = a->sidr_req(p, deliver);
  }
  if (rc < 0) return static_cast<int>(-rc);
  *conn = static_cast<uint64_t>(rc);
  return 0;
}

int cm_send(ibv_context* c, uint64_t conn, const softrnic_cm_msg* m) {
  cm::Agent* a = agent_of(c);
  if (a == nullptr) return ENOSYS;
  if (m == nullptr) return EINVAL;
  auto id = static_cast<uint32_t>(conn);
  switch (m->type) {
    case SOFTRNIC_CM_REP: {
      cm::RepParams p;
      p.local_qpn = m->qpn;
      p.starting_psn = m->starting_psn;
      p.responder_resources = m->responder_resources;
      p.initiator_depth = m->initiator_depth;
      p.target_ack_delay = m->target_ack_delay;
      p.flow_control = m->flow_control != 0;
      p.rnr_retry_count = m->rnr_retry_count;
      p.srq = m->srq != 0;
      p.private_data = pdata(m);
      return pos(a->send_rep(id, p));
    }
    case SOFTRNIC_CM_RTU: return pos(a->send_rtu(id, pdata(m)));
    case SOFTRNIC_CM_REJ: {
      cm::RejParams p;
      p.reason = static_cast<uint16_t>(m->status);
      p.private_data = pdata(m);
      return pos(a->send_rej(id, p));
    }
    case SOFTRNIC_CM_MRA: {
      cm::MraParams p;
      if (m->status) p.service_timeout = static_cast<uint8_t>(m->status);
      p.private_data = pdata(m);
      return pos(a->send_mra(id, p));
    }
    case SOFTRNIC_CM_DREQ: return pos(a->send_dreq(id, pdata(m)));
    case SOFTRNIC_CM_DREP: return pos(a->send_drep(id, pdata(m)));
    case SOFTRNIC_CM_SIDR_REP: {
      cm::SidrRepParams p;
      p.status = static_cast<uint8_t>(m->status);
      p.qpn = m->qpn;
      p.qkey = m->qkey;
      p.private_data = pdata(m);
      return pos(a->sidr_rep(id, p));
    }
    case SOFTRNIC_CM_ESTABLISHED: return pos(a->establish(id));
  }
  return EINVAL;
}

void cm_release(ibv_context* c, uint64_t conn) {
  if (cm::Agent* a = agent_of(c)) (void)a->destroy(static_cast<uint32_t>(conn));
}

void cm_left_data_path(ibv_context* c) { host_left_data_path(host_of(c)); }

const softrnic_cm_ops kOps = {
    SOFTRNIC_CM_MAGIC, SOFTRNIC_CM_ABI, sizeof(softrnic_cm_ops),
    cm_query, cm_set_handler, cm_listen, cm_unlisten, cm_connect, cm_send, cm_release,
    cm_left_data_path,
};

}  // namespace

const softrnic_cm_ops* cm_bridge_ops() { return &kOps; }

}  // namespace rnic::shim
