// emu/cm/agent.cc: the CM agent — QP1 hook, receive queue, the connection and SIDR state
// machines of IBA 12.9 (cm-notes §3.11), their timers, and event delivery on the cm thread.
// Facts (timeouts, retry counts, duplicate/stale rules) from cm-notes §3.7-3.10, checked
// against Linux drivers/infiniband/core/cm.c; the code is our own.
#include "emu/cm/agent.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "emu/cm/mad.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/transport/gsi.h"
#include "wire/port.h"

namespace rnic::cm {

namespace {

using Clock = std::chrono::steady_clock;
using mad::Buf;
using emu::Status;

enum class St : uint8_t {
  kReqSent,
  kMraReqRcvd,
  kReqRcvd,
  kMraReqSent,
  kRepSent,
  kMraRepRcvd,
  kRepRcvd,
  kMraRepSent,
  kEstablished,
  kDreqSent,
  kDreqRcvd,
  kTimewait,
  kSidrReqSent,
  kSidrReqRcvd,
};

enum class Tm : uint8_t { kNone, kRetry, kTimewait };

// Linux cm_convert_to_ms: 4.096 us * 2^t, approximated as 2^(t-8) ms.
uint64_t iba_ms(unsigned t) { return uint64_t{1} << (t > 8 ? t - 8 : 0); }

uint64_t rand64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
    v = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  }
  return v;
}

wire::Endpoint endpoint_of(const std::array<uint8_t, 16>& gid, uint16_t port) {
  static constexpr uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  wire::Endpoint e;
  if (std::memcmp(gid.data(), kV4Prefix, 12) == 0) {
    std::memcpy(e.addr, gid.data() + 12, 4);
  } else {
    e.ipv6 = true;
    std::memcpy(e.addr, gid.data(), 16);
  }
  e.port = port;
  return e;
}

std::array<uint8_t, 16> gid_of(const wire::Endpoint& e) {
  std::array<uint8_t, 16> g{};
  if (e.ipv6) {
    std::memcpy(g.data(), e.addr, 16);
  } else {
    g[10] = g[11] = 0xFF;
    std::memcpy(g.data() + 12, e.addr, 4);
  }
  return g;
}

bool gid_usable(const std::array<uint8_t, 16>& g) {
  for (uint8_t b : g)
    if (b != 0) return true;
  return false;
}

template <size_t N>
void copy_pd(std::array<uint8_t, N>* dst, std::span<const uint8_t> src) {
  dst->fill(0);
  if (!src.empty()) std::memcpy(dst->data(), src.data(), std::min(N, src.size()));
}

template <size_t N>
std::vector<uint8_t> vec_of(const std::array<uint8_t, N>& a, size_t n = N) {
  return std::vector<uint8_t>(a.begin(), a.begin() + static_cast<long>(std::min(n, N)));
}

struct Conn {
  uint32_t id = 0;
  uint32_t remote_id = 0;
  St st = St::kReqSent;
  Sink sink;  // empty: a destroyed id finishing its protocol silently
  bool passive = false;
  uint64_t service_id = 0;
  uint64_t remote_guid = 0;
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  wire::Endpoint peer;
  uint64_t tid = 0;       // TID of the REQ / SIDR_REQ (echoed by every reply)
  uint64_t dreq_tid = 0;  // TID of the DREQ being answered
  uint8_t plt = 18;
  uint64_t timeout_ms = 0;  // retry wait of REQ/REP/DREQ
  uint8_t max_retries = 15;
  Path path;
  // timer
  Tm tm = Tm::kNone;
  uint64_t deadline = 0;  // steady ns
  Msg retry_msg = Msg::kReq;
  int retries_left = 0;
  uint64_t retry_wait_ms = 0;
  Buf retry_mad{};
  // last replies, resent on duplicates
  bool has_rep = false, has_rtu = false, has_mra = false, has_drep = false;
  Buf rep_mad{}, rtu_mad{}, mra_mad{}, drep_mad{};
};

struct RxMad {
  Buf b{};
  size_t len = 0;
  wire::Endpoint src;
  bool replayed = false;  // came back from held_: already counted in mads_received
  bool expired = false;   // its hold window passed: answer it, never hold it again
};

class AgentImpl final : public Agent, public emu::GsiHandler {
 public:
  AgentImpl(std::shared_ptr<emu::Device> dev, emu::Engine* eng, const AgentOptions& opt)
      : dev_(std::move(dev)), eng_(eng), opt_(opt) {
    guid_ = dev_->attr().node_guid;
    if (auto g = dev_->query_gid(1, 0); g.has_value()) gid_ = g->raw;
    udp_port_ = eng_->config().udp_port;
    next_id_ = opt_.first_comm_id != 0 ? opt_.first_comm_id : static_cast<uint32_t>(rand64());
    if (opt_.comm_id_prefix != 0) {
      next_id_ = (uint32_t{opt_.comm_id_prefix} << 24) | (next_id_ & 0xFFFFFFu);
    }
    hi_tid_ = static_cast<uint32_t>(rand64() >> 32);
  }

  int start() {
    Status st = eng_->set_gsi_handler(this);
    if (!st) return -st.errno_value();
    thread_ = std::thread([this] { loop(); });
    return 0;
  }

  ~AgentImpl() override {
    eng_->clear_gsi_handler(this);
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  uint64_t ca_guid() const override { return guid_; }
  std::array<uint8_t, 16> local_gid() const override { return gid_; }

  // ---- GsiHandler (receive context) ----
  // Replies leave from the GID the MAD arrived on (src_index, wire/port.h).
  void on_gsi_packet(const emu::GsiPacket& p) override {
    wire::Endpoint src = p.src;
    src.src_index = p.dst.src_index;
    enqueue(p.payload, src);
  }

  void inject_mad(std::span<const uint8_t> mad, uint32_t from_ip) override {
    enqueue(mad, wire::Endpoint::v4(from_ip, udp_port_));
  }

  // ---- passive ----
  int listen(uint64_t service_id, Sink sink) override {
    if (!sink) return -EINVAL;
    {
      std::lock_guard lk(mu_);
      if (stop_) return -ESHUTDOWN;
      if (listeners_.count(service_id) != 0) return -EADDRINUSE;
    }
    // Device-wide claim first (a round trip to softrnicd; never under mu_).
    if (opt_.claim_service) {
      if (int e = opt_.claim_service(service_id, true); e != 0) return -e;
    }
    std::lock_guard lk(mu_);
    if (stop_) return -ESHUTDOWN;
    if (!listeners_.emplace(service_id, std::move(sink)).second) return -EADDRINUSE;
    // The REQs held for this service go back to the cm thread, ahead of newer MADs.
    unlistened_.erase(service_id);
    size_t n = 0;  // in arrival order, ahead of what came after them
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->service_id != service_id) {
        ++it;
        continue;
      }
      it->m.replayed = true;
      rxq_.insert(rxq_.begin() + static_cast<std::ptrdiff_t>(n++), it->m);
      it = held_.erase(it);
    }
    if (n != 0) cv_.notify_one();
    return 0;
  }
  int cancel_listen(uint64_t service_id) override {
    {
      std::lock_guard lk(mu_);
      if (listeners_.erase(service_id) == 0) return -ENOENT;
      const uint64_t now = now_ns();
      std::erase_if(unlistened_, [&](const auto& kv) {
        return !within_relisten_window(kv.second, now);
      });
      unlistened_[service_id] = now;
    }
    if (opt_.claim_service) (void)opt_.claim_service(service_id, false);
    return 0;
  }
  int set_sink(uint32_t comm_id, Sink sink) override {
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    c->sink = std::move(sink);
    return 0;
  }

  // ---- active ----
  int64_t send_req(const ReqParams& p, Sink sink) override {
    if (p.private_data.size() > kReqPrivateBytes) return -EINVAL;
    if (p.local_qpn > 0xFFFFFF || p.starting_psn > 0xFFFFFF) return -EINVAL;
    if (p.local_cm_response_timeout > 31 || p.remote_cm_response_timeout > 31 ||
        p.max_cm_retries > 15 || p.path.mtu < 1 || p.path.mtu > 5 ||
        p.path.flow_label > 0xFFFFF || p.path.packet_lifetime > 31 ||
        p.path.local_ack_timeout > 31 || p.path.sl > 15)
      return -EINVAL;
    if (p.qp_type != QpKind::kRc && p.qp_type != QpKind::kUc && p.qp_type != QpKind::kXrc)
      return -EINVAL;
    if (!gid_usable(p.path.remote_gid)) return -EHOSTUNREACH;
    std::lock_guard lk(mu_);
    if (stop_) return -ESHUTDOWN;
    Conn& c = new_conn_locked();
    c.st = St::kReqSent;
    c.sink = std::move(sink);
    c.service_id = p.service_id;
    c.local_qpn = p.local_qpn;
    c.path = p.path;
    c.peer = peer_of_locked(p.path);
    c.plt = p.path.packet_lifetime;
    c.timeout_ms = 2 * iba_ms(c.plt) + iba_ms(p.remote_cm_response_timeout);
    c.max_retries = p.max_cm_retries;
    c.tid = (uint64_t{hi_tid_} << 32) | c.id;
    mad::Req r;
    r.local_comm_id = c.id;
    r.service_id = p.service_id;
    r.local_ca_guid = guid_;
    r.local_qpn = p.local_qpn;
    r.responder_resources = p.responder_resources;
    r.initiator_depth = p.initiator_depth;
    r.remote_cm_response_timeout = p.remote_cm_response_timeout;
    r.transport_service_type = static_cast<uint8_t>(p.qp_type);
    r.flow_control = p.flow_control;
    r.starting_psn = p.starting_psn;
    r.local_cm_response_timeout = p.local_cm_response_timeout;
    r.retry_count = std::min<uint8_t>(p.retry_count, 7);
    r.pkey = p.path.pkey;
    r.path_mtu = p.path.mtu;
    r.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
    r.max_cm_retries = p.max_cm_retries;
    r.srq = p.srq;
    r.extended_transport = p.qp_type == QpKind::kXrc ? 1 : 0;
    // RoCE has no LIDs: 0xFFFF ("permissive") when the path leaves the subnet (hop limit > 1).
    r.primary_local_lid = r.primary_remote_lid = p.path.hop_limit > 1 ? 0xFFFF : 0;
    r.primary_local_gid = p.path.local_gid;
    r.primary_remote_gid = p.path.remote_gid;
    r.primary_flow_label = p.path.flow_label;
    r.primary_traffic_class = p.path.traffic_class;
    r.primary_hop_limit = p.path.hop_limit;
    r.primary_sl = p.path.sl;
    r.primary_subnet_local = p.path.hop_limit <= 1;
    r.primary_local_ack_timeout = p.path.local_ack_timeout;
    copy_pd(&r.private_data, p.private_data);
    c.retry_mad = mad::encode(r, c.tid);
    send_locked(c.retry_mad, c.peer);
    arm_retry_locked(c, Msg::kReq, c.timeout_ms, c.max_retries);
    return c.id;
  }

  int send_rep(uint32_t comm_id, const RepParams& p) override {
    if (p.private_data.size() > kRepPrivateBytes) return -EINVAL;
    if (p.local_qpn > 0xFFFFFF || p.starting_psn > 0xFFFFFF || p.target_ack_delay > 31)
      return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    if (c->st != St::kReqRcvd && c->st != St::kMraReqSent) return -EPROTO;
    c->local_qpn = p.local_qpn;
    mad::Rep r;
    r.local_comm_id = c->id;
    r.remote_comm_id = c->remote_id;
    r.local_qpn = p.local_qpn;
    r.starting_psn = p.starting_psn;
    r.responder_resources = p.responder_resources;
    r.initiator_depth = p.initiator_depth;
    r.target_ack_delay = p.target_ack_delay;
    r.flow_control = p.flow_control;
    r.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
    r.srq = p.srq;
    r.local_ca_guid = guid_;
    copy_pd(&r.private_data, p.private_data);
    c->rep_mad = mad::encode(r, c->tid);
    c->has_rep = true;
    c->retry_mad = c->rep_mad;
    c->st = St::kRepSent;
    send_locked(c->rep_mad, c->peer);
    arm_retry_locked(*c, Msg::kRep, c->timeout_ms, c->max_retries);
    return 0;
  }

  int send_rtu(uint32_t comm_id, std::span<const uint8_t> pd) override {
    if (pd.size() > kRtuPrivateBytes) return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    if (c->st != St::kRepRcvd && c->st != St::kMraRepSent) return -EPROTO;
    mad::Rtu r;
    r.local_comm_id = c->id;
    r.remote_comm_id = c->remote_id;
    copy_pd(&r.private_data, pd);
    c->rtu_mad = mad::encode(r, c->tid);
    c->has_rtu = true;
    c->st = St::kEstablished;
    c->tm = Tm::kNone;
    send_locked(c->rtu_mad, c->peer);
    return 0;
  }

  int send_rej(uint32_t comm_id, const RejParams& p) override {
    if (p.private_data.size() > kRejPrivateBytes || p.ari.size() > kRejAriBytes) return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    uint8_t msg = 2;
    switch (c->st) {
      case St::kReqRcvd: case St::kMraReqSent: msg = 0; break;
      case St::kRepRcvd: case St::kMraRepSent: msg = 1; break;
      case St::kReqSent: case St::kMraReqRcvd: case St::kRepSent: case St::kMraRepRcvd: break;
      default: return -EPROTO;
    }
    send_rej_locked(*c, msg, p.reason, p.ari, p.private_data);
    release_locked(c->id);
    return 0;
  }

  int send_mra(uint32_t comm_id, const MraParams& p) override {
    if (p.private_data.size() > kMraPrivateBytes || p.service_timeout > 31) return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    uint8_t msg;
    if (c->st == St::kReqRcvd || c->st == St::kMraReqSent) {
      msg = 0;
      c->st = St::kMraReqSent;
    } else if (c->st == St::kRepRcvd || c->st == St::kMraRepSent) {
      msg = 1;
      c->st = St::kMraRepSent;
    } else {
      return -EPROTO;
    }
    make_mra_locked(*c, msg, p.service_timeout, p.private_data);
    send_locked(c->mra_mad, c->peer);
    return 0;
  }

  int send_dreq(uint32_t comm_id, std::span<const uint8_t> pd) override {
    if (pd.size() > kDreqPrivateBytes) return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    if (c->st != St::kEstablished) return -EPROTO;
    start_dreq_locked(*c, pd);
    return 0;
  }

  int send_drep(uint32_t comm_id, std::span<const uint8_t> pd) override {
    if (pd.size() > kDrepPrivateBytes) return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    if (c->st != St::kDreqRcvd) return -EPROTO;
    send_drep_locked(*c, pd);
    return 0;
  }

  int establish(uint32_t comm_id) override {
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return -ENOENT;
    if (c->st == St::kEstablished) return 0;
    if (c->st != St::kRepSent && c->st != St::kMraRepRcvd) return -EPROTO;
    c->st = St::kEstablished;
    c->tm = Tm::kNone;
    return 0;
  }

  int64_t sidr_req(const SidrReqParams& p, Sink sink) override {
    if (p.private_data.size() > kSidrReqPrivateBytes || p.timeout > 31 || p.max_retries > 15)
      return -EINVAL;
    if (!gid_usable(p.path.remote_gid)) return -EHOSTUNREACH;
    std::lock_guard lk(mu_);
    if (stop_) return -ESHUTDOWN;
    Conn& c = new_conn_locked();
    c.st = St::kSidrReqSent;
    c.sink = std::move(sink);
    c.service_id = p.service_id;
    c.path = p.path;
    c.peer = peer_of_locked(p.path);
    c.tid = (uint64_t{hi_tid_} << 32) | c.id;
    mad::SidrReq r;
    r.request_id = c.id;
    r.pkey = p.path.pkey;
    r.service_id = p.service_id;
    copy_pd(&r.private_data, p.private_data);
    c.retry_mad = mad::encode(r, c.tid);
    send_locked(c.retry_mad, c.peer);
    arm_retry_locked(c, Msg::kSidrReq, iba_ms(p.timeout), p.max_retries);
    return c.id;
  }

  int sidr_rep(uint32_t request_id, const SidrRepParams& p) override {
    if (p.private_data.size() > kSidrRepPrivateBytes || p.info.size() > kSidrRepInfoBytes ||
        p.qpn > 0xFFFFFF)
      return -EINVAL;
    std::lock_guard lk(mu_);
    Conn* c = find(request_id);
    if (c == nullptr) return -ENOENT;
    if (c->st != St::kSidrReqRcvd) return -EPROTO;
    send_sidr_rep_locked(c->peer, c->tid, c->remote_id, c->service_id, p);
    release_locked(c->id);
    return 0;
  }

  int destroy(uint32_t comm_id) override {
    std::lock_guard lk(mu_);
    Conn* c = find(comm_id);
    if (c == nullptr) return 0;
    destroyed_.insert(comm_id);
    static constexpr std::span<const uint8_t> kNone;
    switch (c->st) {
      case St::kReqSent: case St::kMraReqRcvd: {
        // Linux: REJ "timeout" with our CA GUID as ARI (the peer matches it by GUID + ID).
        uint8_t ari[8];
        for (int i = 0; i < 8; ++i) ari[i] = static_cast<uint8_t>(guid_ >> (56 - 8 * i));
        send_rej_locked(*c, 2, kRejTimeout, ari, kNone);
        break;
      }
      case St::kReqRcvd: case St::kMraReqSent:
        send_rej_locked(*c, 0, kRejConsumerDefined, kNone, kNone);
        break;
      case St::kRepRcvd: case St::kMraRepSent:
        send_rej_locked(*c, 1, kRejConsumerDefined, kNone, kNone);
        break;
      case St::kRepSent: case St::kMraRepRcvd:
        send_rej_locked(*c, 2, kRejConsumerDefined, kNone, kNone);
        break;
      case St::kEstablished:
        c->sink = nullptr;  // finishes DREQ -> DREP -> timewait silently
        start_dreq_locked(*c, kNone);
        return 0;
      case St::kDreqRcvd:
        c->sink = nullptr;
        send_drep_locked(*c, kNone);
        return 0;
      case St::kDreqSent: case St::kTimewait:
        c->sink = nullptr;
        return 0;
      case St::kSidrReqRcvd: {
        SidrRepParams p;
        p.status = kSidrReject;
        send_sidr_rep_locked(c->peer, c->tid, c->remote_id, c->service_id, p);
        break;
      }
      case St::kSidrReqSent:
        break;
    }
    release_locked(comm_id);
    return 0;
  }

  AgentCounters counters() const override {
    std::lock_guard lk(mu_);
    AgentCounters c = ctr_;
    c.connections = conns_.size();
    return c;
  }

 private:
  static constexpr size_t kMaxQueue = 4096;

  // Copies one received MAD into the cm thread's queue (or counts why not).
  void enqueue(std::span<const uint8_t> mad, const wire::Endpoint& src) {
    std::lock_guard lk(mu_);
    if (mad.size() != kMadBytes) {
      ++ctr_.dropped_malformed;
      RNIC_LOG_RL(kWarn, "cm: dropped a %zu-byte MAD from %s (must be 256)", mad.size(),
                  src.to_string().c_str());
      return;
    }
    if (rxq_.size() >= kMaxQueue) {
      ++ctr_.dropped_overflow;
      return;
    }
    RxMad& m = rxq_.emplace_back();
    std::memcpy(m.b.data(), mad.data(), kMadBytes);
    m.len = kMadBytes;
    m.src = src;
    cv_.notify_one();
  }

  // Where an active side's MADs go: the path's remote GID, sent from the device's GID that
  // equals the path's local GID (an IPv6 GID sends from its own socket; a link-local peer is
  // on that GID's interface). A local GID not in the table: the first of the peer's family.
  wire::Endpoint peer_of_locked(const Path& path) const {
    wire::Endpoint e = endpoint_of(path.remote_gid, path.udp_port != 0 ? path.udp_port : udp_port_);
    const auto& gids = dev_->gids();
    for (size_t i = 0; i < gids.size(); ++i) {
      if (gids[i].raw != path.local_gid || gids[i].addr.ipv6 != e.ipv6) continue;
      e.src_index = static_cast<uint8_t>(i);
      if (e.link_local()) e.scope_id = gids[i].addr.scope_id;
      break;
    }
    return e;
  }

  // The device's GID a datagram arrived on (src.src_index, see on_gsi_packet); GID 0 if unknown.
  std::array<uint8_t, 16> arrival_gid_locked(const wire::Endpoint& src) const {
    const auto& gids = dev_->gids();
    if (src.src_index < gids.size() && gids[src.src_index].addr.ipv6 == src.ipv6) return gids[src.src_index].raw;
    return gid_;
  }

  Conn* find(uint32_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : &it->second;
  }

  Conn& new_conn_locked() {
    uint32_t id;
    do {
      id = next_id_++;
      if (opt_.comm_id_prefix != 0) {  // stay inside this process's prefix (daemon hosting)
        id = (uint32_t{opt_.comm_id_prefix} << 24) | (id & 0xFFFFFFu);
        next_id_ = id + 1;
      }
    } while (id == 0 || conns_.count(id) != 0);
    Conn& c = conns_[id];
    c.id = id;
    return c;
  }

  void release_locked(uint32_t id) { conns_.erase(id); }

  uint64_t cap_ms(uint64_t ms) const {
    return opt_.max_wait_ms != 0 ? std::min<uint64_t>(ms, opt_.max_wait_ms) : ms;
  }
  static uint64_t now_ns() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
  }
  static constexpr uint64_t kRelistenWindowNs = kRelistenWindowMs * 1000000ull;
  // True while a listen that ended at ended_ns (now_ns clock) may still come back.
  static bool within_relisten_window(uint64_t ended_ns, uint64_t now) {
    return now - ended_ns <= kRelistenWindowNs;
  }

  void arm_retry_locked(Conn& c, Msg msg, uint64_t wait_ms, int retries) {
    c.tm = Tm::kRetry;
    c.retry_msg = msg;
    c.retries_left = retries;
    c.retry_wait_ms = wait_ms;
    c.deadline = now_ns() + cap_ms(wait_ms) * 1000000ull;
    cv_.notify_one();
  }

  void enter_timewait_locked(Conn& c) {
    c.st = St::kTimewait;
    c.tm = Tm::kTimewait;
    c.deadline = now_ns() + cap_ms(iba_ms(c.plt + 1u)) * 1000000ull;
    cv_.notify_one();
  }

  void send_locked(const Buf& b, const wire::Endpoint& dst) {
    Status st = eng_->send_gsi(dst, kGsiQpn, kGsiPkey, b);
    if (st) {
      ++ctr_.mads_sent;
      RNIC_TRACE("cm: sent %s to %s", mad::attr_name(static_cast<uint16_t>(
                                          mad::get(b.data(), mad::hdr::kAttributeId))),
                 dst.to_string().c_str());
    }
  }

  void send_rej_locked(const Conn& c, uint8_t msg, uint16_t reason,
                       std::span<const uint8_t> ari, std::span<const uint8_t> pd) {
    mad::Rej r;
    r.local_comm_id = c.id;
    r.remote_comm_id = c.remote_id;
    r.message_rejected = msg;
    r.reject_info_length = static_cast<uint8_t>(std::min(ari.size(), kRejAriBytes));
    r.reason = reason;
    copy_pd(&r.ari, ari);
    copy_pd(&r.private_data, pd);
    send_locked(mad::encode(r, c.tid), c.peer);
    ++ctr_.rej_sent;
  }

  void make_mra_locked(Conn& c, uint8_t msg, uint8_t service_timeout,
                       std::span<const uint8_t> pd) {
    mad::Mra m;
    m.local_comm_id = c.id;
    m.remote_comm_id = c.remote_id;
    m.message_mraed = msg;
    m.service_timeout = service_timeout;
    copy_pd(&m.private_data, pd);
    c.mra_mad = mad::encode(m, c.tid);
    c.has_mra = true;
  }

  void start_dreq_locked(Conn& c, std::span<const uint8_t> pd) {
    mad::Dreq d;
    d.local_comm_id = c.id;
    d.remote_comm_id = c.remote_id;
    d.remote_qpn = c.remote_qpn;
    copy_pd(&d.private_data, pd);
    c.st = St::kDreqSent;
    c.retry_mad = mad::encode(d, (uint64_t{hi_tid_} << 32) | c.id);
    send_locked(c.retry_mad, c.peer);
    arm_retry_locked(c, Msg::kDreq, c.timeout_ms, c.max_retries);
  }

  void send_drep_locked(Conn& c, std::span<const uint8_t> pd) {
    mad::Drep d;
    d.local_comm_id = c.id;
    d.remote_comm_id = c.remote_id;
    copy_pd(&d.private_data, pd);
    c.drep_mad = mad::encode(d, c.dreq_tid);
    c.has_drep = true;
    send_locked(c.drep_mad, c.peer);
    enter_timewait_locked(c);
  }

  void send_sidr_rep_locked(const wire::Endpoint& to, uint64_t tid, uint32_t request_id,
                            uint64_t service_id, const SidrRepParams& p) {
    mad::SidrRep r;
    r.request_id = request_id;
    r.status = p.status;
    r.additional_info_length = static_cast<uint8_t>(std::min(p.info.size(), kSidrRepInfoBytes));
    r.qpn = p.qpn;
    r.service_id = service_id;
    r.qkey = p.qkey;
    copy_pd(&r.info, p.info);
    copy_pd(&r.private_data, p.private_data);
    send_locked(mad::encode(r, tid), to);
  }

  void post_locked(const Conn& c, Event&& ev) {
    if (!c.sink) return;
    ev.comm_id = c.id;
    ev.remote_comm_id = c.remote_id;
    pending_.emplace_back(c.sink, std::move(ev));
  }

  // ---- the cm thread ----
  void loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      destroyed_.clear();
      while (!rxq_.empty() && !stop_) {
        RxMad m = rxq_.front();
        rxq_.pop_front();
        handle_locked(m);
      }
      run_timers_locked(now_ns());
      if (!pending_.empty()) {
        std::vector<std::pair<Sink, Event>> evs;
        evs.swap(pending_);
        for (auto& [sink, ev] : evs) {
          if (stop_) break;
          if (destroyed_.count(ev.comm_id) != 0) continue;
          lk.unlock();
          sink(ev);
          lk.lock();
        }
        continue;
      }
      if (!rxq_.empty()) continue;
      uint64_t next = 0;
      for (auto& [id, c] : conns_)
        if (c.tm != Tm::kNone && (next == 0 || c.deadline < next)) next = c.deadline;
      for (const Held& x : held_)
        if (next == 0 || x.deadline < next) next = x.deadline;
      if (next == 0) {
        cv_.wait(lk);
      } else {
        const uint64_t now = now_ns();
        if (next > now) cv_.wait_for(lk, std::chrono::nanoseconds(next - now));
      }
    }
  }

  void run_timers_locked(uint64_t now) {
    // Held REQs whose listen did not come back: answered now as if never held.
    while (!held_.empty() && held_.front().deadline <= now) {
      RxMad m = held_.front().m;
      held_.pop_front();
      m.replayed = m.expired = true;
      handle_locked(m);
    }
    std::vector<uint32_t> gone;
    for (auto& [id, c] : conns_) {
      if (c.tm == Tm::kNone || c.deadline > now) continue;
      if (c.tm == Tm::kTimewait) {
        Event ev;
        ev.type = EventType::kTimewaitExit;
        post_locked(c, std::move(ev));
        gone.push_back(id);
        continue;
      }
      if (c.retries_left > 0) {
        --c.retries_left;
        ++ctr_.mads_retried;
        send_locked(c.retry_mad, c.peer);
        c.deadline = now + cap_ms(c.retry_wait_ms) * 1000000ull;
        continue;
      }
      ++ctr_.timeouts;
      Event ev;
      ev.type = EventType::kTimeout;
      ev.status = -ETIMEDOUT;
      ev.msg = c.retry_msg;
      post_locked(c, std::move(ev));
      if (c.retry_msg == Msg::kDreq) {
        enter_timewait_locked(c);
      } else {
        gone.push_back(id);
      }
    }
    for (uint32_t id : gone) release_locked(id);
  }

  // True (and m kept) if a REQ/SIDR_REQ for service_id, which nobody listens on, arrived
  // within kRelistenWindowMs of that service's listen ending: the listener may be coming back.
  // key names the request (REQ: remote CA GUID ^ comm ID; SIDR: request ID): a retransmission
  // of a held request is dropped (it stays held once).
  bool hold_locked(const RxMad& m, uint64_t service_id, uint64_t key) {
    if (m.expired) return false;
    for (const Held& x : held_) {
      if (x.key == key && x.service_id == service_id && x.m.src.same_ip(m.src)) {
        ++ctr_.dropped_duplicate;
        return true;
      }
    }
    if (held_.size() >= kMaxHeld) return false;
    auto u = unlistened_.find(service_id);
    if (u == unlistened_.end()) return false;
    const uint64_t now = now_ns();
    if (!within_relisten_window(u->second, now)) {
      unlistened_.erase(u);
      return false;
    }
    held_.push_back(Held{m, service_id, key, now + kRelistenWindowNs});  // deadlines stay in order
    ++ctr_.reqs_held;
    cv_.notify_one();
    return true;
  }

  void handle_locked(const RxMad& m) {
    mad::Header h;
    mad::Verdict v = mad::parse_header(std::span<const uint8_t>(m.b.data(), m.len), &h);
    if (v == mad::Verdict::kUnsupported) {
      ++ctr_.dropped_unsupported;
      return;
    }
    if (v != mad::Verdict::kOk) {
      ++ctr_.dropped_malformed;
      RNIC_LOG_RL(kWarn, "cm: dropped a MAD from %s: %s", m.src.to_string().c_str(),
                  mad::verdict_name(v));
      return;
    }
    const uint8_t* b = m.b.data();
    // The reply address: the sender's IP, the RoCEv2 port (the UDP source port is the
    // sender's choice and not a listening port).
    const wire::Endpoint from = [&] {
      wire::Endpoint e = m.src;
      e.port = udp_port_;
      return e;
    }();
    switch (h.attr_id) {
      case mad::kAttrReq: { mad::Req x; if (ok(mad::decode(b, &x), m)) on_req(h, x, from, m); break; }
      case mad::kAttrMra: { mad::Mra x; if (ok(mad::decode(b, &x), m)) on_mra(x); break; }
      case mad::kAttrRej: { mad::Rej x; if (ok(mad::decode(b, &x), m)) on_rej(x); break; }
      case mad::kAttrRep: { mad::Rep x; if (ok(mad::decode(b, &x), m)) on_rep(x, m.src); break; }
      case mad::kAttrRtu: { mad::Rtu x; if (ok(mad::decode(b, &x), m)) on_rtu(x); break; }
      case mad::kAttrDreq: { mad::Dreq x; if (ok(mad::decode(b, &x), m)) on_dreq(h, x, from); break; }
      case mad::kAttrDrep: { mad::Drep x; if (ok(mad::decode(b, &x), m)) on_drep(x); break; }
      case mad::kAttrSidrReq: { mad::SidrReq x; if (ok(mad::decode(b, &x), m)) on_sidr_req(h, x, from, m); break; }
      case mad::kAttrSidrRep: { mad::SidrRep x; if (ok(mad::decode(b, &x), m)) on_sidr_rep(x); break; }
      default: ++ctr_.dropped_malformed; break;
    }
  }

  bool ok(mad::Verdict v, const RxMad& m) {
    if (v == mad::Verdict::kOk) {
      if (!m.replayed) ++ctr_.mads_received;
      return true;
    }
    ++ctr_.dropped_malformed;
    RNIC_LOG_RL(kWarn, "cm: dropped a MAD from %s: %s", m.src.to_string().c_str(),
                mad::verdict_name(v));
    return false;
  }

  void unmatched(const char* what) {
    ++ctr_.dropped_unmatched;
    RNIC_LOG_RL(kInfo, "cm: dropped a %s for no connection in a state that takes it", what);
  }

  static void fill_src(Event& ev, const wire::Endpoint& src) {
    ev.src_addr = gid_of(src);
    ev.src_port = src.port;
  }

  // m: the MAD as received (its source address; hold_locked keeps it).
  void on_req(const mad::Header& h, const mad::Req& r, const wire::Endpoint& from,
              const RxMad& m) {
    const wire::Endpoint& src = m.src;
    // Duplicate: same (remote CA GUID, remote comm ID).
    for (auto& [id, c] : conns_) {
      if (!c.passive || c.remote_guid != r.local_ca_guid || c.remote_id != r.local_comm_id ||
          c.st == St::kSidrReqRcvd)
        continue;
      ++ctr_.dropped_duplicate;
      switch (c.st) {
        case St::kReqRcvd:
          // rdma_cm's delayed MRA: a retransmitted REQ draws a real MRA (service timeout 24).
          make_mra_locked(c, 0, 24, {});
          c.st = St::kMraReqSent;
          send_locked(c.mra_mad, c.peer);
          break;
        case St::kMraReqSent:
          if (c.has_mra) send_locked(c.mra_mad, c.peer);
          break;
        case St::kRepSent: case St::kMraRepRcvd:
          if (c.has_rep) send_locked(c.rep_mad, c.peer);
          break;
        case St::kTimewait:
          send_stateless_rej(h.tid, from, r.local_comm_id, kRejStaleConn);
          break;
        default:
          break;
      }
      return;
    }
    // Stale: (remote QPN, remote CA GUID) still in timewait. A timewait whose deadline has
    // passed is over even if the timer thread has not run yet (the peer's, started later,
    // may already have ended and let it reconnect).
    const uint64_t now = now_ns();
    for (auto& [id, c] : conns_) {
      if (c.st == St::kTimewait && c.deadline > now && c.remote_guid == r.local_ca_guid &&
          c.remote_qpn == r.local_qpn && c.remote_qpn != 0) {
        send_stateless_rej(h.tid, from, r.local_comm_id, kRejStaleConn);
        return;
      }
    }
    auto l = listeners_.find(r.service_id);
    if (l == listeners_.end()) {
      if (hold_locked(m, r.service_id, r.local_ca_guid ^ r.local_comm_id)) return;
      send_stateless_rej(h.tid, from, r.local_comm_id, kRejInvalidServiceId);
      return;
    }
    Conn& c = new_conn_locked();
    c.passive = true;
    c.st = St::kReqRcvd;
    c.sink = l->second;
    c.service_id = r.service_id;
    c.remote_id = r.local_comm_id;
    c.remote_guid = r.local_ca_guid;
    c.remote_qpn = r.local_qpn;
    c.peer = from;
    c.tid = h.tid;
    c.plt = r.primary_local_ack_timeout > 0 ? r.primary_local_ack_timeout - 1 : 0;
    c.timeout_ms = iba_ms(r.local_cm_response_timeout);
    c.max_retries = r.max_cm_retries;
    Path& p = c.path;
    p.local_gid = r.primary_remote_gid;
    p.remote_gid = r.primary_local_gid;
    p.flow_label = r.primary_flow_label;
    p.traffic_class = r.primary_traffic_class;
    p.hop_limit = r.primary_hop_limit;
    p.sl = r.primary_sl;
    p.mtu = r.path_mtu;
    p.packet_lifetime = c.plt;
    p.local_ack_timeout = r.primary_local_ack_timeout;
    p.pkey = r.pkey;
    p.udp_port = udp_port_;
    Event ev;
    ev.type = EventType::kReqReceived;
    ev.service_id = r.service_id;
    ev.remote_ca_guid = r.local_ca_guid;
    ev.remote_qpn = r.local_qpn;
    ev.starting_psn = r.starting_psn;
    ev.responder_resources = r.responder_resources;
    ev.initiator_depth = r.initiator_depth;
    ev.retry_count = r.retry_count;
    ev.rnr_retry_count = r.rnr_retry_count;
    ev.flow_control = r.flow_control;
    ev.srq = r.srq;
    ev.qp_type = static_cast<QpKind>(r.transport_service_type);
    ev.local_cm_response_timeout = r.local_cm_response_timeout;
    ev.remote_cm_response_timeout = r.remote_cm_response_timeout;
    ev.max_cm_retries = r.max_cm_retries;
    ev.path = p;
    ev.pkey = r.pkey;
    fill_src(ev, src);
    ev.private_data = vec_of(r.private_data);
    post_locked(c, std::move(ev));
  }

  // REJ for a REQ that made no connection: LocalCommID 0, MsgREJed = REQ.
  void send_stateless_rej(uint64_t tid, const wire::Endpoint& to, uint32_t remote_id,
                          uint16_t reason) {
    mad::Rej r;
    r.remote_comm_id = remote_id;
    r.message_rejected = 0;
    r.reason = reason;
    send_locked(mad::encode(r, tid), to);
    ++ctr_.rej_sent;
  }

  void on_rep(const mad::Rep& r, const wire::Endpoint& src) {
    Conn* c = find(r.remote_comm_id);
    if (c == nullptr || c->passive || c->st == St::kSidrReqSent) return unmatched("REP");
    switch (c->st) {
      case St::kReqSent: case St::kMraReqRcvd: {
        c->remote_id = r.local_comm_id;
        c->remote_qpn = r.local_qpn;
        c->remote_guid = r.local_ca_guid;
        c->st = St::kRepRcvd;
        c->tm = Tm::kNone;
        Event ev;
        ev.type = EventType::kRepReceived;
        ev.service_id = c->service_id;
        ev.remote_ca_guid = r.local_ca_guid;
        ev.remote_qpn = r.local_qpn;
        ev.starting_psn = r.starting_psn;
        ev.responder_resources = r.responder_resources;
        ev.initiator_depth = r.initiator_depth;
        ev.target_ack_delay = r.target_ack_delay;
        ev.flow_control = r.flow_control;
        ev.rnr_retry_count = r.rnr_retry_count;
        ev.srq = r.srq;
        ev.path = c->path;
        fill_src(ev, src);
        ev.private_data = vec_of(r.private_data);
        post_locked(*c, std::move(ev));
        return;
      }
      default:
        break;
    }
    if (r.local_comm_id != c->remote_id) return unmatched("REP");
    ++ctr_.dropped_duplicate;
    if (c->st == St::kEstablished && c->has_rtu) {
      send_locked(c->rtu_mad, c->peer);  // our RTU was lost: the peer resent its REP
    } else if (c->st == St::kMraRepSent && c->has_mra) {
      send_locked(c->mra_mad, c->peer);
    }
  }

  void on_rtu(const mad::Rtu& r) {
    Conn* c = find(r.remote_comm_id);
    if (c == nullptr || !c->passive || r.local_comm_id != c->remote_id) return unmatched("RTU");
    if (c->st == St::kRepSent || c->st == St::kMraRepRcvd) {
      c->st = St::kEstablished;
      c->tm = Tm::kNone;
      Event ev;
      ev.type = EventType::kRtuReceived;
      ev.private_data = vec_of(r.private_data);
      post_locked(*c, std::move(ev));
      return;
    }
    if (c->st == St::kEstablished) {
      ++ctr_.dropped_duplicate;
      return;
    }
    unmatched("RTU");
  }

  void on_rej(const mad::Rej& r) {
    Conn* c = find(r.remote_comm_id);
    if (c == nullptr && r.reason == kRejTimeout && r.reject_info_length >= 8) {
      // REJ 4 from an active side that destroyed its REQ: no remote comm ID yet, matched by
      // (ARI = its CA GUID, its comm ID).
      uint64_t g = 0;
      for (int i = 0; i < 8; ++i) g = (g << 8) | r.ari[i];
      for (auto& [id, x] : conns_)
        if (x.passive && x.remote_guid == g && x.remote_id == r.local_comm_id) c = &x;
    } else if (c != nullptr && r.message_rejected != 0 && c->remote_id != 0 &&
               r.local_comm_id != c->remote_id) {
      c = nullptr;  // MsgREJed = REQ is matched by the remote comm ID alone
    }
    if (c == nullptr) return unmatched("REJ");
    switch (c->st) {
      case St::kReqSent: case St::kMraReqRcvd: case St::kReqRcvd: case St::kMraReqSent:
      case St::kRepSent: case St::kMraRepRcvd: case St::kRepRcvd: case St::kMraRepSent:
      case St::kEstablished:
        break;
      default:
        return unmatched("REJ");
    }
    Event ev;
    ev.type = EventType::kRejReceived;
    ev.msg = static_cast<Msg>(r.message_rejected);
    ev.reject_reason = r.reason;
    ev.ari = vec_of(r.ari, r.reject_info_length);
    ev.private_data = vec_of(r.private_data);
    post_locked(*c, std::move(ev));
    if (r.reason == kRejStaleConn) {
      enter_timewait_locked(*c);  // IBA 12.9.7: a stale-connection REJ leads to timewait
    } else {
      release_locked(c->id);
    }
  }

  void on_mra(const mad::Mra& m) {
    Conn* c = find(m.remote_comm_id);
    if (c == nullptr) return unmatched("MRA");
    St next;
    if (m.message_mraed == 0 && (c->st == St::kReqSent || c->st == St::kMraReqRcvd)) {
      next = St::kMraReqRcvd;
    } else if (m.message_mraed == 1 && (c->st == St::kRepSent || c->st == St::kMraRepRcvd) &&
               m.local_comm_id == c->remote_id) {
      next = St::kMraRepRcvd;
    } else {
      return unmatched("MRA");
    }
    const bool first = c->st != next;
    c->st = next;
    if (m.message_mraed == 0) c->remote_id = m.local_comm_id;
    // The peer needs service_timeout more: wait that plus a packet lifetime before retrying.
    c->deadline = now_ns() + cap_ms(iba_ms(m.service_timeout) + iba_ms(c->plt)) * 1000000ull;
    cv_.notify_one();
    if (!first) {
      ++ctr_.dropped_duplicate;
      return;
    }
    Event ev;
    ev.type = EventType::kMraReceived;
    ev.msg = static_cast<Msg>(m.message_mraed);
    ev.service_timeout = m.service_timeout;
    ev.private_data = vec_of(m.private_data);
    post_locked(*c, std::move(ev));
  }

  void on_dreq(const mad::Header& h, const mad::Dreq& d, const wire::Endpoint& from) {
    Conn* c = find(d.remote_comm_id);
    if (c == nullptr || c->st == St::kSidrReqSent || c->st == St::kSidrReqRcvd ||
        (c->remote_id != 0 && c->remote_id != d.local_comm_id)) {
      // Unknown connection: a stateless DREP so the peer's DREQ retries stop.
      mad::Drep r;
      r.local_comm_id = d.remote_comm_id;
      r.remote_comm_id = d.local_comm_id;
      send_locked(mad::encode(r, h.tid), from);
      return unmatched("DREQ");
    }
    if (d.remote_qpn != c->local_qpn) return unmatched("DREQ");  // Linux drops it too
    switch (c->st) {
      case St::kEstablished: case St::kRepSent: case St::kMraRepRcvd: case St::kDreqSent: {
        c->st = St::kDreqRcvd;
        c->tm = Tm::kNone;
        c->dreq_tid = h.tid;
        Event ev;
        ev.type = EventType::kDreqReceived;
        ev.private_data = vec_of(d.private_data);
        if (c->sink) {
          post_locked(*c, std::move(ev));
        } else {
          send_drep_locked(*c, {});  // destroyed id: answer ourselves
        }
        return;
      }
      case St::kTimewait:
        ++ctr_.dropped_duplicate;
        if (c->has_drep) {
          send_locked(c->drep_mad, c->peer);
        } else {
          mad::Drep r;
          r.local_comm_id = c->id;
          r.remote_comm_id = c->remote_id;
          send_locked(mad::encode(r, h.tid), c->peer);
        }
        return;
      case St::kDreqRcvd:
        ++ctr_.dropped_duplicate;
        return;
      default:
        return unmatched("DREQ");
    }
  }

  void on_drep(const mad::Drep& d) {
    Conn* c = find(d.remote_comm_id);
    if (c == nullptr || d.local_comm_id != c->remote_id) return unmatched("DREP");
    if (c->st == St::kTimewait) {
      ++ctr_.dropped_duplicate;
      return;
    }
    if (c->st != St::kDreqSent) return unmatched("DREP");
    Event ev;
    ev.type = EventType::kDrepReceived;
    ev.private_data = vec_of(d.private_data);
    post_locked(*c, std::move(ev));
    enter_timewait_locked(*c);
  }

  void on_sidr_req(const mad::Header& h, const mad::SidrReq& r, const wire::Endpoint& from,
                    const RxMad& m) {
    const wire::Endpoint& src = m.src;
    for (auto& [id, c] : conns_) {
      if (c.st == St::kSidrReqRcvd && c.remote_id == r.request_id && c.peer.same_ip(from)) {
        ++ctr_.dropped_duplicate;
        return;
      }
    }
    auto l = listeners_.find(r.service_id);
    if (l == listeners_.end()) {
      if (hold_locked(m, r.service_id, r.request_id)) return;
      SidrRepParams p;
      p.status = kSidrUnsupported;
      send_sidr_rep_locked(from, h.tid, r.request_id, r.service_id, p);
      return;
    }
    Conn& c = new_conn_locked();
    c.passive = true;
    c.st = St::kSidrReqRcvd;
    c.sink = l->second;
    c.service_id = r.service_id;
    c.remote_id = r.request_id;
    c.peer = from;
    c.tid = h.tid;
    c.path.local_gid = arrival_gid_locked(src);
    c.path.remote_gid = gid_of(src);
    c.path.pkey = r.pkey;
    c.path.udp_port = udp_port_;
    Event ev;
    ev.type = EventType::kSidrReqReceived;
    ev.service_id = r.service_id;
    ev.pkey = r.pkey;
    ev.path = c.path;
    fill_src(ev, src);
    ev.private_data = vec_of(r.private_data);
    post_locked(c, std::move(ev));
  }

  void on_sidr_rep(const mad::SidrRep& r) {
    Conn* c = find(r.request_id);
    if (c == nullptr || c->st != St::kSidrReqSent) return unmatched("SIDR_REP");
    Event ev;
    ev.type = EventType::kSidrRepReceived;
    ev.service_id = r.service_id;
    ev.sidr_status = r.status;
    ev.qpn = r.qpn;
    ev.remote_qpn = r.qpn;
    ev.qkey = r.qkey;
    ev.info = vec_of(r.info, r.additional_info_length);
    ev.path = c->path;
    ev.private_data = vec_of(r.private_data);
    post_locked(*c, std::move(ev));
    release_locked(c->id);
  }

  std::shared_ptr<emu::Device> dev_;
  emu::Engine* eng_;
  AgentOptions opt_;
  uint64_t guid_ = 0;
  std::array<uint8_t, 16> gid_{};
  uint16_t udp_port_ = 4791;
  uint32_t hi_tid_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<RxMad> rxq_;
  std::unordered_map<uint32_t, Conn> conns_;
  std::map<uint64_t, Sink> listeners_;
  // A REQ held for a service whose listen ended within kRelistenWindowMs (agent.h, Passive).
  struct Held {
    RxMad m;
    uint64_t service_id = 0;
    uint64_t key = 0;       // hold_locked's
    uint64_t deadline = 0;  // steady ns; held_ is in deadline order
  };
  std::map<uint64_t, uint64_t> unlistened_;  // service ID -> when its listen ended (steady ns)
  std::deque<Held> held_;
  uint32_t next_id_ = 1;
  AgentCounters ctr_;
  std::vector<std::pair<Sink, Event>> pending_;
  std::unordered_set<uint32_t> destroyed_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Agent> Agent::create(const std::shared_ptr<emu::Device>& dev,
                                     const AgentOptions& opt, int* err) {
  int dummy = 0;
  int* e = err != nullptr ? err : &dummy;
  if (!dev || dev->engine() == nullptr) {
    *e = -ENODEV;
    return nullptr;
  }
  auto a = std::make_unique<AgentImpl>(dev, dev->engine(), opt);
  int rc = a->start();
  if (rc != 0) {
    *e = rc;
    return nullptr;
  }
  *e = 0;
  return a;
}

}  // namespace rnic::cm
