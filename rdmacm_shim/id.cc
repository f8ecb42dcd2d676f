// rdma_cm ids: create/destroy, bind, address and route resolution (cm-notes §5), listen,
// connect/accept/reject/establish/notify/disconnect, migrate, options, ports, ECE and the
// multicast calls (join / leave over the device's UD multicast).
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "rdmacm_shim/cma.h"

namespace rnic::rdmacm {
namespace {

bool valid_ps(int ps) {
  return ps == RDMA_PS_TCP || ps == RDMA_PS_UDP || ps == RDMA_PS_IB || ps == RDMA_PS_IPOIB;
}

bool ud_ps(int ps) { return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB; }

// REQUIRES g().mu.
Id* id_new(Channel* ch, void* context, rdma_port_space ps, ibv_qp_type qpt) {
  auto* id = new Id();
  std::memset(&id->pub, 0, sizeof id->pub);
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = qpt;
  id->pub.route.path_rec = &id->path;
  if (ch == nullptr) {
    id->own_channel = channel_new();
    if (id->own_channel == nullptr) {
      delete id;
      return nullptr;
    }
    id->sync = true;
    ch = id->own_channel;
  }
  id->pub.channel = &ch->pub;
  g().ids.insert(id);
  return id;
}

// Is the address of `addr` (AF_INET / AF_INET6) one of this host's (a socket can bind it)?
bool host_owns(const sockaddr* addr) {
  sockaddr_storage ss{};
  std::memcpy(&ss, addr, sa_len(addr));
  sa_set_port(reinterpret_cast<sockaddr*>(&ss), 0);
  int s = socket(addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  bool ok = bind(s, reinterpret_cast<sockaddr*>(&ss), sa_len(addr)) == 0;
  close(s);
  return ok;
}

bool is_v6(const sockaddr* sa) { return sa != nullptr && sa->sa_family == AF_INET6; }

// Reserves (ps, port) in this process; port 0 picks an ephemeral one. REQUIRES g().mu.
int reserve_port(Id* id, uint16_t want) {
  int ps = id->pub.ps;
  if (want != 0) {
    if (want < 1024 && geteuid() != 0) return EACCES;
    if (g().ports.count({ps, want})) return EADDRINUSE;
    g().ports.insert({ps, want});
    id->port = want;
    return 0;
  }
  for (int tries = 0; tries < 30000; ++tries) {
    uint16_t p = static_cast<uint16_t>(32768 + random24() % 28232);  // ip_local_port_range
    if (!g().ports.count({ps, p})) {
      g().ports.insert({ps, p});
      id->port = p;
      return 0;
    }
  }
  return EADDRINUSE;
}

bool loopback_gid(const uint8_t g[16]) {
  static constexpr uint8_t kV6Loop[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return gid_is_v4(g) ? g[12] == 127 : std::memcmp(g, kV6Loop, 16) == 0;
}

// A bind to a loopback address no device has ("localhost": libfabric's verbs provider binds
// its passive endpoints there when the program names no address, e.g. fi_pingpong's server)
// when no softrnic device is on loopback of that family (its IP is on a veth or eth0, one
// device per process): the process's first device with an address of that family takes it
// (IPv4: its address; IPv6 ::1: its first non-link-local IPv6 GID), and the id reports that
// address, the one a peer on another host can reach. With a device on loopback, other
// loopback addresses stay ENODEV (no device), as they are for the kernel. REQUIRES g().mu.
Device* loopback_stand_in(const uint8_t gid[16], int* index) {
  if (!loopback_gid(gid)) return nullptr;
  for (Device* d : g().devs) {
    uint32_t n = std::min<uint32_t>(d->info.gid_count, SOFTRNIC_CM_MAX_GIDS);
    for (uint32_t i = 0; i < n; ++i)
      if (gid_is_v4(d->info.gids[i].raw) == gid_is_v4(gid) && loopback_gid(d->info.gids[i].raw)) return nullptr;
  }
  for (Device* d : g().devs)
    if (int i = gid_index_like(d, gid, 0); i >= 0) {
      *index = i;
      return d;
    }
  return nullptr;
}

// The device an id lands on: sets verbs, pd, port_num, the GID. REQUIRES g().mu.
void attach_device(Id* id, Device* d, int index) {
  id->dev = d;
  id->sgid_index = index;
  id->pub.verbs = d->verbs;
  id->pub.pd = d->pd;
  id->pub.port_num = d->info.port_num;
  id->mtu = d->info.active_mtu;
  std::memcpy(id->pub.route.addr.addr.ibaddr.sgid.raw, d->info.gids[index].raw, 16);
}

// rdma_bind_addr's work. REQUIRES g().mu.
int bind_locked(Id* id, const sockaddr* addr) {
  if (id->state != State::kIdle) return EINVAL;
  if (addr == nullptr) return EINVAL;
  if (addr->sa_family == AF_IB) return EAFNOSUPPORT;
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return EAFNOSUPPORT;
  uint8_t gid[16];
  uint32_t scope = 0;
  sa_gid(addr, gid, &scope);
  Device* d = nullptr;
  int index = 0;
  sockaddr_storage local{};  // what the id reports: the address, its scope, a stand-in's
  std::memcpy(&local, addr, sa_len(addr));
  if (!sa_any(addr)) {
    d = device_for_gid(gid, scope, &index);
    if (d == nullptr && (d = loopback_stand_in(gid, &index)) != nullptr)
      sa_of_gid(d, index, sa_port(addr), is_v6(addr), &local);
    if (d == nullptr) return host_owns(addr) ? ENODEV : EADDRNOTAVAIL;
    auto* l6 = reinterpret_cast<sockaddr_in6*>(&local);
    if (local.ss_family == AF_INET6 && l6->sin6_scope_id == 0 && IN6_IS_ADDR_LINKLOCAL(&l6->sin6_addr))
      l6->sin6_scope_id = d->info.gids[index].scope_id;  // the interface the GID is on
  }
  const auto* la = reinterpret_cast<const sockaddr*>(&local);
  if (int rc = reserve_port(id, sa_port(la)); rc != 0) return rc;
  std::memset(&id->bound, 0, sizeof id->bound);
  std::memcpy(&id->bound, la, sa_len(la));
  id->bound_set = true;
  // The kernel's default: an AF_INET id takes only IPv4, an AF_INET6 one both families
  // (net.ipv6.bindv6only = 0) unless RDMA_OPTION_ID_AFONLY says otherwise.
  if (!id->afonly_set) id->afonly = addr->sa_family == AF_INET ? 1 : 0;
  std::memset(&id->pub.route.addr.src_addr, 0, sizeof id->pub.route.addr.src_storage);
  std::memcpy(&id->pub.route.addr.src_addr, la, sa_len(la));
  sa_set_port(&id->pub.route.addr.src_addr, id->port);
  if (d != nullptr) attach_device(id, d, index);
  id->pub.route.addr.addr.ibaddr.pkey = htons(0xFFFF);
  id->state = State::kAddrBound;
  return 0;
}

// The source address the kernel would pick for `dst` (a connected UDP socket's name; an
// IPv6 one carries the interface of a link-local source in its scope id).
bool route_source(const sockaddr* dst, sockaddr_storage* src) {
  int s = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  sockaddr_storage sa{};
  std::memcpy(&sa, dst, sa_len(dst));
  sa_set_port(reinterpret_cast<sockaddr*>(&sa), 4791);
  bool ok = connect(s, reinterpret_cast<sockaddr*>(&sa), sa_len(dst)) == 0;
  socklen_t len = sizeof *src;
  if (ok) ok = getsockname(s, reinterpret_cast<sockaddr*>(src), &len) == 0;
  close(s);
  return ok;
}

// Device choice for an unbound active id (cm-notes §5), by the destination's family: the
// device owning the route's source address; else, for a loopback or zero destination, the
// first device with a loopback GID of that family (softrnic's devices take distinct
// 127.0.0.x addresses, or ::1); else the first device with a GID of that family (IPv6: a
// link-local one on the destination's interface for a link-local destination). None:
// ENODEV, as the kernel's when no RDMA device has the route's source address.
Device* device_for_dst(const sockaddr* dst, int* index, int* err) {
  uint8_t dgid[16];
  uint32_t scope = 0;
  sa_gid(dst, dgid, &scope);
  // A multicast group has no route source (and a host without a default route has no route
  // to it at all): the first device with a GID of its family joins it (cm-notes §5).
  const bool mc = gid_is_v4(dgid) ? (dgid[12] & 0xF0) == 0xE0 : dgid[0] == 0xFF;
  if (mc) {
    for (Device* d : g().devs) {
      const int i = gid_index_like(d, dgid, 0);
      if (i < 0) continue;
      *index = i;
      return d;
    }
    *err = ENODEV;
    return nullptr;
  }
  bool loop = sa_loopback(dst) || sa_any(dst);
  sockaddr_storage src{};
  if (!loop && !route_source(dst, &src)) {
    *err = ENETUNREACH;
    return nullptr;
  }
  if (!loop) {
    uint8_t sgid[16];
    uint32_t sscope = 0;
    if (sa_gid(reinterpret_cast<sockaddr*>(&src), sgid, &sscope))
      if (Device* d = device_for_gid(sgid, sscope, index)) return d;
    if (scope == 0) scope = sscope;
  }
  for (Device* d : g().devs) {
    int i = gid_index_like(d, dgid, scope);
    if (i < 0) continue;
    if (loop && !loopback_gid(d->info.gids[i].raw)) {
      // a loopback GID of the family, if this device has one further on
      i = -1;
      for (uint32_t k = 0; k < std::min<uint32_t>(d->info.gid_count, SOFTRNIC_CM_MAX_GIDS); ++k)
        if (gid_is_v4(d->info.gids[k].raw) == gid_is_v4(dgid) && loopback_gid(d->info.gids[k].raw)) {
          i = static_cast<int>(k);
          break;
        }
      if (i < 0) continue;
    }
    *index = i;
    return d;
  }
  *err = ENODEV;
  return nullptr;
}

void fill_path(Id* id) {
  ibv_sa_path_rec& p = id->path;
  std::memset(&p, 0, sizeof p);
  std::memcpy(p.sgid.raw, id->pub.route.addr.addr.ibaddr.sgid.raw, 16);
  std::memcpy(p.dgid.raw, id->pub.route.addr.addr.ibaddr.dgid.raw, 16);
  uint16_t sport = sa_port(&id->pub.route.addr.src_addr);
  uint16_t dport = sa_port(&id->pub.route.addr.dst_addr);
  uint32_t fl = (static_cast<uint32_t>(sport) * 31 + dport) & 0xFFFFF;
  if (id->pub.route.addr.dst_addr.sa_family == AF_INET6) {  // the destination's flow label wins
    uint32_t info = ntohl(reinterpret_cast<const sockaddr_in6*>(&id->pub.route.addr.dst_addr)->sin6_flowinfo);
    if ((info & 0xFFFFF) != 0) fl = info & 0xFFFFF;
  }
  p.flow_label = htonl(fl);
  p.hop_limit = 64;
  p.traffic_class = id->tos;
  p.reversible = 1;
  p.numb_path = 1;
  p.pkey = htons(0xFFFF);
  p.sl = 0;
  p.mtu_selector = 2;  // exactly
  p.mtu = id->mtu;
  p.rate_selector = 2;
  p.rate = 3;  // 10 Gb/s: softrnic reports no faster link
  p.packet_life_time_selector = 2;
  p.packet_life_time = id->ack_timeout_set && id->ack_timeout > 0 ? id->ack_timeout - 1 : kPacketLifetime;
  id->pub.route.num_paths = 1;
}

// Conn-param checks shared by connect and accept (cm-notes §2.3).
int check_depths(Id* id, const rdma_conn_param* p, uint8_t dflt_rr, uint8_t dflt_ini, uint8_t* rr,
                 uint8_t* ini) {
  const ibv_device_attr& a = id->dev->attr;
  uint8_t max_rr = static_cast<uint8_t>(std::min(a.max_qp_rd_atom, 255));
  uint8_t max_ini = static_cast<uint8_t>(std::min(a.max_qp_init_rd_atom, 255));
  if (p == nullptr) {
    *rr = std::min(dflt_rr, max_rr);
    *ini = std::min(dflt_ini, max_ini);
    return 0;
  }
  if (p->responder_resources != RDMA_MAX_RESP_RES && p->responder_resources > max_rr) return EINVAL;
  if (p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > max_ini) return EINVAL;
  *rr = p->responder_resources == RDMA_MAX_RESP_RES ? std::min(dflt_rr, max_rr) : p->responder_resources;
  *ini = p->initiator_depth == RDMA_MAX_INIT_DEPTH ? std::min(dflt_ini, max_ini) : p->initiator_depth;
  return 0;
}

void release_conn(Id* id) {
  if (id->conn == 0) return;
  g().conns.erase({id->conn_dev, id->conn});
  id->conn_dev->ops->release(id->conn_dev->verbs, id->conn);
  id->conn = 0;
}

int connect_locked(Id* id, const rdma_conn_param* p) {
  if (id->state != State::kRouteResolved) return EINVAL;
  bool ud = id->pub.qp_type == IBV_QPT_UD;
  bool hdr = uses_cma_hdr(id);
  int limit = (ud ? kSidrReqPdata : kReqPdata) - (hdr ? kCmaHdrSize : 0);
  if (p != nullptr && p->private_data_len > limit) return EINVAL;
  if (p != nullptr && p->private_data_len > 0 && p->private_data == nullptr) return EINVAL;
  softrnic_cm_msg m{};
  m.type = ud ? SOFTRNIC_CM_SIDR_REQ : SOFTRNIC_CM_REQ;
  m.service_id = service_id(id->pub.ps, sa_port(&id->pub.route.addr.dst_addr));
  size_t off = 0;
  if (hdr) {
    if (!cma_hdr_build(&id->pub.route.addr.src_addr, &id->pub.route.addr.dst_addr, m.private_data)) return EINVAL;
    off = kCmaHdrSize;
  }
  if (p != nullptr && p->private_data_len > 0) std::memcpy(m.private_data + off, p->private_data, p->private_data_len);
  m.private_data_len = static_cast<uint32_t>(off + (p ? p->private_data_len : 0));
  m.path_mtu = id->path.mtu;
  m.local_ack_timeout = id->ack_timeout;
  m.traffic_class = id->path.traffic_class;
  m.hop_limit = id->path.hop_limit;
  m.sl = id->path.sl;
  m.flow_label = ntohl(id->path.flow_label);
  std::memcpy(m.local_gid, id->path.sgid.raw, 16);
  std::memcpy(m.remote_gid, id->path.dgid.raw, 16);
  if (!ud) {
    uint8_t rr = 0, ini = 0;
    const ibv_device_attr& a = id->dev->attr;
    if (int rc = check_depths(id, p, static_cast<uint8_t>(std::min(a.max_qp_rd_atom, 255)),
                              static_cast<uint8_t>(std::min(a.max_qp_init_rd_atom, 255)), &rr, &ini);
        rc != 0)
      return rc;
    m.qpn = id->pub.qp ? id->pub.qp->qp_num : (p ? p->qp_num & 0xFFFFFF : 0);
    m.qp_type = id->pub.qp ? id->pub.qp->qp_type : IBV_QPT_RC;
    id->my_psn = random24();
    m.starting_psn = id->my_psn;
    m.responder_resources = rr;
    m.initiator_depth = ini;
    m.retry_count = p ? std::min<uint8_t>(7, p->retry_count) : 7;
    m.rnr_retry_count = p ? std::min<uint8_t>(7, p->rnr_retry_count) : 7;
    m.flow_control = p ? (p->flow_control ? 1 : 0) : 1;
    m.srq = id->pub.qp ? (id->pub.qp->srq != nullptr) : (p ? p->srq : 0);
    // What the QP gets until the REP says otherwise (the REP swaps them, see cm.cc).
    id->rr = rr;
    id->ini = ini;
    id->retry = m.retry_count;
  }
  uint64_t conn = 0;
  int rc = id->dev->ops->connect(id->dev->verbs, &m, &conn);
  if (rc != 0) return rc;
  id->conn = conn;
  id->conn_dev = id->dev;
  g().conns[{id->dev, conn}] = id;
  id->state = State::kConnect;
  return 0;
}

int accept_locked(Id* id, const rdma_conn_param* p) {
  if (id->state != State::kReqRcvd) return EINVAL;
  bool ud = id->pub.qp_type == IBV_QPT_UD;
  int limit = ud ? kSidrRepPdata : kRepPdata;
  if (p != nullptr && p->private_data_len > limit) return EINVAL;
  if (p != nullptr && p->private_data_len > 0 && p->private_data == nullptr) return EINVAL;
  softrnic_cm_msg m{};
  if (p != nullptr && p->private_data_len > 0) std::memcpy(m.private_data, p->private_data, p->private_data_len);
  m.private_data_len = p ? p->private_data_len : 0;
  if (ud) {
    m.type = SOFTRNIC_CM_SIDR_REP;
    m.status = 0;
    m.service_id = service_id(id->pub.ps, id->port);
    m.qpn = id->pub.qp ? id->pub.qp->qp_num : (p ? p->qp_num & 0xFFFFFF : 0);
    m.qkey = RDMA_UDP_QKEY;
    int rc = cm_send(id, m);
    if (rc != 0) return rc;
    id->state = State::kDone;  // SIDR has no ESTABLISHED on the passive side
    return 0;
  }
  uint8_t rr = 0, ini = 0;
  if (int rc = check_depths(id, p, id->peer_ini, id->peer_rr, &rr, &ini); rc != 0) return rc;
  id->rr = rr;
  id->ini = ini;
  // The REP's RNR retry count is the active side's; our QP keeps the REQ's (id->rnr).
  uint8_t rep_rnr = p ? std::min<uint8_t>(7, p->rnr_retry_count) : 7;
  if (id->pub.qp != nullptr) {
    if (int rc = qp_connect(id); rc != 0) {
      qp_to_err(id);
      return rc;
    }
  }
  m.type = SOFTRNIC_CM_REP;
  m.qpn = id->pub.qp ? id->pub.qp->qp_num : (p ? p->qp_num & 0xFFFFFF : 0);
  m.starting_psn = id->my_psn;
  m.responder_resources = rr;
  m.initiator_depth = ini;
  m.target_ack_delay = id->dev->info.ack_delay;
  m.flow_control = p ? (p->flow_control ? 1 : 0) : 1;
  m.rnr_retry_count = rep_rnr;
  m.srq = id->pub.qp ? (id->pub.qp->srq != nullptr) : (p ? p->srq : 0);
  int rc = cm_send(id, m);
  if (rc != 0) {
    qp_to_err(id);
    return rc;
  }
  id->state = State::kRepSent;
  return 0;
}

int reject_locked(Id* id, const void* pdata, uint8_t len, uint16_t reason) {
  if (id->state != State::kReqRcvd) return EINVAL;
  bool ud = id->pub.qp_type == IBV_QPT_UD;
  if (len > (ud ? kSidrRepPdata : kRejPdata)) return EINVAL;
  if (len > 0 && pdata == nullptr) return EINVAL;
  softrnic_cm_msg m{};
  if (len > 0) std::memcpy(m.private_data, pdata, len);
  m.private_data_len = len;
  if (ud) {
    m.type = SOFTRNIC_CM_SIDR_REP;
    m.status = kSidrRejected;
    m.service_id = service_id(id->pub.ps, id->port);
  } else {
    m.type = SOFTRNIC_CM_REJ;
    m.status = reason;
    m.rej_msg = 0;
  }
  int rc = cm_send(id, m);
  if (rc != 0) return rc;
  id->state = State::kDone;
  return 0;
}

// Waits (g().mu held through `lk`) until every reported event of `id` is acked.
void wait_acked(Id* id, std::unique_lock<std::mutex>& lk) {
  g().acked_cv.wait(lk, [&] { return id->acked >= id->reported; });
}

}  // namespace

bool uses_cma_hdr(const Id* id) { return id->pub.route.addr.src_addr.sa_family != AF_IB; }

int cm_send(Id* id, const softrnic_cm_msg& m) {
  if (id->conn == 0) return EINVAL;
  return id->conn_dev->ops->send(id->conn_dev->verbs, id->conn, &m);
}

// Used by cm.cc for incoming requests: a new id under `listen`. REQUIRES g().mu.
Id* id_for_request(Id* listen, Device* d) {
  Channel* ch = listen->sync ? nullptr : to_channel(listen->pub.channel);
  Id* id = id_new(ch, listen->pub.context, listen->pub.ps, listen->pub.qp_type);
  if (id == nullptr) return nullptr;
  attach_device(id, d, 0);
  id->listen_parent = listen;
  id->tos = listen->tos;
  id->ack_timeout = listen->ack_timeout;
  id->ack_timeout_set = listen->ack_timeout_set;
  return id;
}

}  // namespace rnic::rdmacm

using namespace rnic::rdmacm;

RDMACM_EXPORT int rdma_create_id(struct rdma_event_channel* channel, struct rdma_cm_id** id, void* context,
                                 enum rdma_port_space ps) {
  left_data_path();
  return guard([&] {
    if (int rc = ucma_init(); rc != 0) return fail(rc);
    // A caller may pass any int: read it as one (an out-of-range enum load is undefined).
    int ps_raw;
    static_assert(sizeof ps_raw == sizeof ps);
    std::memcpy(&ps_raw, &ps, sizeof ps_raw);
    if (id == nullptr || !valid_ps(ps_raw)) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    Id* i = id_new(channel ? to_channel(channel) : nullptr, context, ps, ud_ps(ps) ? IBV_QPT_UD : IBV_QPT_RC);
    if (i == nullptr) return -1;
    *id = &i->pub;
    return 0;
  });
}

// rdma_create_ep's variant with an explicit QP type (addrinfo.cc).
namespace rnic::rdmacm {
int create_id_qpt(rdma_event_channel* ch, rdma_cm_id** out, void* ctx, rdma_port_space ps, ibv_qp_type qpt) {
  if (int rc = rdma_create_id(ch, out, ctx, ps); rc != 0) return rc;
  (*out)->qp_type = qpt;
  return 0;
}
}  // namespace rnic::rdmacm

RDMACM_EXPORT int rdma_destroy_id(struct rdma_cm_id* id) {
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    if (i->pub.event != nullptr) {
      rdma_ack_cm_event(i->pub.event);
      i->pub.event = nullptr;
    }
    std::unique_lock<std::mutex> lk(g().mu);
    for (auto& [d, h] : i->listens) {
      g().listens.erase({d, h});
      d->ops->unlisten(d->verbs, h);
    }
    i->listens.clear();
    release_conn(i);
    for (const Id::Mcast& m : i->mcasts) {
      if (!m.attached || i->pub.qp == nullptr) continue;
      ibv_gid gid;
      std::memcpy(gid.raw, m.mgid, 16);
      (void)ibv_detach_mcast(i->pub.qp, &gid, 0);
    }
    i->mcasts.clear();
    if (i->port != 0) g().ports.erase({i->pub.ps, i->port});
    purge_events(i, nullptr);
    wait_acked(i, lk);
    g().ids.erase(i);
    for (Id* other : g().ids)
      if (other->listen_parent == i) other->listen_parent = nullptr;
    Channel* own = i->own_channel;
    lk.unlock();
    channel_free(own);
    delete i;
    return 0;
  });
}

RDMACM_EXPORT int rdma_bind_addr(struct rdma_cm_id* id, struct sockaddr* addr) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = bind_locked(to_id(id), addr);
    return rc ? fail(rc) : 0;
  });
}

RDMACM_EXPORT int rdma_resolve_addr(struct rdma_cm_id* id, struct sockaddr* src_addr, struct sockaddr* dst_addr,
                                    int /*timeout_ms*/) {
  left_data_path();
  return guard([&] {
    if (id == nullptr || dst_addr == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (dst_addr->sa_family != AF_INET && dst_addr->sa_family != AF_INET6) return fail(EAFNOSUPPORT);
      if (src_addr != nullptr && src_addr->sa_family == AF_UNSPEC) src_addr = nullptr;  // as the kernel
      if (i->state == State::kIdle) {
        sockaddr_storage any{};
        any.ss_family = dst_addr->sa_family;  // the wildcard of the destination's family
        int rc = bind_locked(i, src_addr ? src_addr : reinterpret_cast<sockaddr*>(&any));
        if (rc != 0) return fail(rc);
      } else if (i->state != State::kAddrBound) {
        return fail(EINVAL);
      }
      // The kernel's rule: the id's family is the destination's (an AF_INET id cannot reach
      // an IPv6 address, nor the reverse).
      if (i->pub.route.addr.src_addr.sa_family != dst_addr->sa_family) return fail(EINVAL);
      int err = 0, index = i->sgid_index;
      Device* d = i->dev;
      if (d == nullptr) d = device_for_dst(dst_addr, &index, &err);
      std::memset(&i->pub.route.addr.dst_addr, 0, sizeof i->pub.route.addr.dst_storage);
      std::memcpy(&i->pub.route.addr.dst_addr, dst_addr, sa_len(dst_addr));
      if (d == nullptr) {
        queue_event(i, RDMA_CM_EVENT_ADDR_ERROR, -err);
      } else {
        attach_device(i, d, index);
        sockaddr_storage src{};
        sa_of_gid(d, index, i->port, is_v6(dst_addr), &src);
        std::memset(&i->pub.route.addr.src_addr, 0, sizeof i->pub.route.addr.src_storage);
        std::memcpy(&i->pub.route.addr.src_addr, &src, sa_len(reinterpret_cast<sockaddr*>(&src)));
        auto& ib = i->pub.route.addr.addr.ibaddr;
        uint32_t scope = 0;
        if (sa_any(dst_addr)) std::memcpy(ib.dgid.raw, ib.sgid.raw, 16);  // zero destination: ourselves
        else sa_gid(dst_addr, ib.dgid.raw, &scope);
        ib.pkey = htons(0xFFFF);
        i->state = State::kAddrResolved;
        queue_event(i, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
      }
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_resolve_route(struct rdma_cm_id* id, int /*timeout_ms*/) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (i->state != State::kAddrResolved) return fail(EINVAL);
      fill_path(i);
      i->state = State::kRouteResolved;
      queue_event(i, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_listen(struct rdma_cm_id* id, int /*backlog*/) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    std::lock_guard<std::mutex> lk(g().mu);
    if (i->state == State::kIdle) {  // the kernel binds an unbound listener to 0.0.0.0
      sockaddr_in any{};
      any.sin_family = AF_INET;
      if (int rc = bind_locked(i, reinterpret_cast<sockaddr*>(&any)); rc != 0) return fail(rc);
    }
    if (i->state != State::kAddrBound) return fail(EINVAL);
    uint64_t sid = service_id(i->pub.ps, i->port);
    std::vector<Device*> on = i->dev ? std::vector<Device*>{i->dev} : g().devs;  // wildcard: every device
    for (Device* d : on) {
      uint64_t h = 0;
      int rc = d->ops->listen(d->verbs, sid, &h);
      if (rc != 0) {
        for (auto& [d2, h2] : i->listens) {
          g().listens.erase({d2, h2});
          d2->ops->unlisten(d2->verbs, h2);
        }
        i->listens.clear();
        return fail(rc);
      }
      i->listens.push_back({d, h});
      g().listens[{d, h}] = i;
    }
    i->state = State::kListen;
    return 0;
  });
}

RDMACM_EXPORT int rdma_connect(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      int rc = connect_locked(i, conn_param);
      if (rc != 0) return fail(rc);
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_accept(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      int rc = accept_locked(i, conn_param);
      if (rc != 0) return fail(rc);
      if (i->pub.qp_type == IBV_QPT_UD) return 0;
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_reject(struct rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = reject_locked(to_id(id), private_data, private_data_len, kRejConsumer);
    return rc ? fail(rc) : 0;
  });
}

RDMACM_EXPORT int rdma_reject_ece(struct rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    std::lock_guard<std::mutex> lk(g().mu);
    int rc = reject_locked(to_id(id), private_data, private_data_len, kRejVendorOption);
    return rc ? fail(rc) : 0;
  });
}

RDMACM_EXPORT int rdma_establish(struct rdma_cm_id* id) {
  left_data_path();
  return guard([&] {
    if (id == nullptr || id->qp != nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    std::lock_guard<std::mutex> lk(g().mu);
    if (i->state != State::kRepRcvd) return fail(EINVAL);
    softrnic_cm_msg m{};
    m.type = SOFTRNIC_CM_RTU;
    int rc = cm_send(i, m);
    if (rc != 0) return fail(rc);
    i->state = State::kEstablished;
    return 0;
  });
}

RDMACM_EXPORT int rdma_notify(struct rdma_cm_id* id, enum ibv_event_type event) {
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    std::lock_guard<std::mutex> lk(g().mu);
    if (event != IBV_EVENT_COMM_EST || i->state != State::kRepSent) return 0;
    softrnic_cm_msg m{};
    m.type = SOFTRNIC_CM_ESTABLISHED;
    int rc = cm_send(i, m);
    if (rc != 0) return fail(rc);
    i->state = State::kEstablished;
    queue_event(i, RDMA_CM_EVENT_ESTABLISHED, 0);
    return 0;
  });
}

RDMACM_EXPORT int rdma_disconnect(struct rdma_cm_id* id) {
  left_data_path();
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    std::lock_guard<std::mutex> lk(g().mu);
    if (i->conn == 0) return fail(EINVAL);
    qp_to_err(i);
    softrnic_cm_msg m{};
    if (i->dreq_rcvd) {
      m.type = SOFTRNIC_CM_DREP;
      i->dreq_rcvd = false;
      (void)cm_send(i, m);
    } else if (i->state == State::kEstablished || i->state == State::kRepSent) {
      m.type = SOFTRNIC_CM_DREQ;
      (void)cm_send(i, m);
      i->state = State::kDisconnect;
    }
    return 0;  // as the kernel: 0 once the id has a connection, whatever its state
  });
}

RDMACM_EXPORT int rdma_migrate_id(struct rdma_cm_id* id, struct rdma_event_channel* channel) {
  return guard([&] {
    if (id == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    if (i->sync && i->pub.event != nullptr) {
      rdma_ack_cm_event(i->pub.event);
      i->pub.event = nullptr;
    }
    Channel* fresh = nullptr;
    if (channel == nullptr) {
      fresh = channel_new();
      if (fresh == nullptr) return -1;
    }
    std::unique_lock<std::mutex> lk(g().mu);
    Channel* to = channel ? to_channel(channel) : fresh;
    wait_acked(i, lk);
    purge_events(i, to);
    Channel* old_own = i->own_channel;
    i->pub.channel = &to->pub;
    i->own_channel = fresh;
    i->sync = fresh != nullptr;
    lk.unlock();
    channel_free(old_own);
    return 0;
  });
}

RDMACM_EXPORT int rdma_set_option(struct rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  return guard([&] {
    if (id == nullptr || optval == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    std::lock_guard<std::mutex> lk(g().mu);
    if (level == RDMA_OPTION_ID) {
      switch (optname) {
        case RDMA_OPTION_ID_TOS:
          if (optlen != sizeof(uint8_t)) return fail(EINVAL);
          i->tos = *static_cast<uint8_t*>(optval);
          return 0;
        case RDMA_OPTION_ID_REUSEADDR:
          if (optlen != sizeof(int)) return fail(EINVAL);
          i->reuseaddr = *static_cast<int*>(optval);
          return 0;
        case RDMA_OPTION_ID_AFONLY:
          if (optlen != sizeof(int)) return fail(EINVAL);
          i->afonly = *static_cast<int*>(optval) ? 1 : 0;
          i->afonly_set = true;
          return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT:
          if (optlen != sizeof(uint8_t)) return fail(EINVAL);
          i->ack_timeout = std::min<uint8_t>(31, *static_cast<uint8_t*>(optval));
          i->ack_timeout_set = true;
          return 0;
      }
      return fail(ENOSYS);
    }
    if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) return fail(EOPNOTSUPP);
    return fail(ENOSYS);
  });
}

RDMACM_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id* id) {
  return id ? htons(sa_port(&id->route.addr.src_addr)) : 0;
}

RDMACM_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id* id) {
  return id ? htons(sa_port(&id->route.addr.dst_addr)) : 0;
}

RDMACM_EXPORT int rdma_set_local_ece(struct rdma_cm_id* id, struct ibv_ece* ece) {
  if (id == nullptr || ece == nullptr || id->qp != nullptr || ece->vendor_id == 0 || ece->comp_mask != 0)
    return fail(EINVAL);
  std::lock_guard<std::mutex> lk(g().mu);
  to_id(id)->local_ece = *ece;
  return 0;
}

RDMACM_EXPORT int rdma_get_remote_ece(struct rdma_cm_id* id, struct ibv_ece* ece) {
  if (id == nullptr || ece == nullptr || id->qp != nullptr) return fail(EINVAL);
  std::lock_guard<std::mutex> lk(g().mu);
  *ece = to_id(id)->remote_ece;
  return 0;
}

// ---- Multicast (UD port spaces over softrnic's UD multicast) ----
namespace {

// The MGID of a multicast sockaddr (RoCE, cm-notes): IPv4 224.0.0.0/4 (AF_INET or v4-mapped
// AF_INET6) -> ::ffff:a.b.c.d, IPv6 ff00::/8 -> itself. False for anything else.
bool mcast_mgid(const sockaddr* sa, uint8_t mgid[16]) {
  in_addr v4{};
  if (sa_ipv4(sa, &v4)) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&v4.s_addr);
    if ((b[0] & 0xF0) != 0xE0) return false;
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    std::memcpy(mgid, kMapped, 12);
    std::memcpy(mgid + 12, b, 4);
    return true;
  }
  if (sa->sa_family != AF_INET6) return false;
  const auto* a6 = reinterpret_cast<const sockaddr_in6*>(sa);
  if (a6->sin6_addr.s6_addr[0] != 0xFF) return false;
  std::memcpy(mgid, a6->sin6_addr.s6_addr, 16);
  return true;
}

// rdma_join_multicast(_ex)'s work (the kernel's cma_iboe_join_multicast plus librdmacm's
// attach): the QP (if any, and unless send-only) is attached at once and the JOIN event
// carries what a sender needs: the AH to the MGID, QPN 0xFFFFFF, the UDP port space's Q_Key.
int join_locked(Id* i, const sockaddr* addr, uint32_t flags, void* context) {
  if (!ud_ps(i->pub.ps)) return EINVAL;
  // As the kernel: a device, and the address bound or resolved (not later states).
  if (i->dev == nullptr || (i->state != State::kAddrBound && i->state != State::kAddrResolved))
    return EINVAL;
  uint8_t mgid[16];
  if (!mcast_mgid(addr, mgid)) return EINVAL;
  for (const Id::Mcast& m : i->mcasts)
    if (std::memcmp(m.mgid, mgid, 16) == 0) return EADDRINUSE;
  Id::Mcast m{};
  std::memcpy(m.mgid, mgid, 16);
  m.context = context;
  int status = 0;
  if (i->pub.qp != nullptr && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
    ibv_gid gid;
    std::memcpy(gid.raw, mgid, 16);
    status = ibv_attach_mcast(i->pub.qp, &gid, 0);
    m.attached = status == 0;
  }
  if (status == 0) i->mcasts.push_back(m);
  Event* ev = queue_event(i, status == 0 ? RDMA_CM_EVENT_MULTICAST_JOIN : RDMA_CM_EVENT_MULTICAST_ERROR,
                          -status);
  rdma_ud_param& u = ev->pub.param.ud;
  u.private_data = context;
  u.private_data_len = 0;
  ibv_ah_attr& ah = u.ah_attr;
  ah.is_global = 1;
  std::memcpy(ah.grh.dgid.raw, mgid, 16);
  ah.grh.sgid_index = static_cast<uint8_t>(i->sgid_index);
  ah.grh.hop_limit = 1;  // the kernel's multicast record for RoCE: the local link
  ah.grh.traffic_class = i->tos;
  ah.port_num = i->pub.port_num;
  u.qp_num = 0xFFFFFF;
  u.qkey = i->pub.ps == RDMA_PS_UDP ? RDMA_UDP_QKEY : 0;
  return 0;
}

}  // namespace

RDMACM_EXPORT int rdma_join_multicast(struct rdma_cm_id* id, struct sockaddr* addr, void* context) {
  return guard([&] {
    if (id == nullptr || addr == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (int rc = join_locked(i, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context); rc != 0) return fail(rc);
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id* id, struct rdma_cm_join_mc_attr_ex* attr,
                                         void* context) {
  return guard([&] {
    if (id == nullptr || attr == nullptr) return fail(EINVAL);
    constexpr uint32_t kKnown = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if ((attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) == 0 || attr->addr == nullptr ||
        (attr->comp_mask & ~kKnown) != 0)
      return fail(EINVAL);
    uint32_t flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
    if (attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) flags = attr->join_flags;
    if (flags >= RDMA_MC_JOIN_FLAG_RESERVED) return fail(EINVAL);
    Id* i = to_id(id);
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (int rc = join_locked(i, attr->addr, flags, context); rc != 0) return fail(rc);
    }
    return ucma_complete(i);
  });
}

RDMACM_EXPORT int rdma_leave_multicast(struct rdma_cm_id* id, struct sockaddr* addr) {
  return guard([&] {
    if (id == nullptr || addr == nullptr) return fail(EINVAL);
    Id* i = to_id(id);
    uint8_t mgid[16];
    if (!mcast_mgid(addr, mgid)) return fail(EADDRNOTAVAIL);
    std::lock_guard<std::mutex> lk(g().mu);
    for (auto it = i->mcasts.begin(); it != i->mcasts.end(); ++it) {
      if (std::memcmp(it->mgid, mgid, 16) != 0) continue;
      if (it->attached && i->pub.qp != nullptr) {
        ibv_gid gid;
        std::memcpy(gid.raw, mgid, 16);
        (void)ibv_detach_mcast(i->pub.qp, &gid, 0);  // a QP destroyed first detached itself
      }
      i->mcasts.erase(it);
      return 0;
    }
    return fail(EADDRNOTAVAIL);  // not joined
  });
}
