// The CM agent's messages turned into rdma_cm events (cm-notes §2.2), in the worker
// thread: the device's callback only queues them, so QP modifies and replies never run in
// the device's thread. Also the 36-byte IP CM header.
#include <arpa/inet.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "rdmacm_shim/cma.h"

namespace rnic::rdmacm {

bool cma_hdr_build(const sockaddr* src, const sockaddr* dst, uint8_t out[kCmaHdrSize]) {
  uint8_t s[16], d[16];
  uint32_t scope = 0;
  if (!sa_gid(src, s, &scope) || !sa_gid(dst, d, &scope)) return false;
  std::memset(out, 0, kCmaHdrSize);
  out[0] = 0x00;  // MajV | MinV
  uint16_t port = htons(sa_port(src));
  std::memcpy(out + 2, &port, 2);  // the active side's port
  if (gid_is_v4(s)) {
    out[1] = 4 << 4;  // IP version 4: 12 zero bytes + the address (not ::ffff-mapped)
    std::memcpy(out + 4 + 12, s + 12, 4);
    std::memcpy(out + 20 + 12, d + 12, 4);
  } else {
    out[1] = 6 << 4;  // IP version 6: the 16-byte addresses
    std::memcpy(out + 4, s, 16);
    std::memcpy(out + 20, d, 16);
  }
  return true;
}

bool cma_hdr_parse(const uint8_t* in, sockaddr_storage* src, sockaddr_storage* dst) {
  int ver = in[1] >> 4;
  if (in[0] != 0x00 || (ver != 4 && ver != 6)) return false;
  std::memset(src, 0, sizeof *src);
  std::memset(dst, 0, sizeof *dst);
  if (ver == 4) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(src);
    auto* d4 = reinterpret_cast<sockaddr_in*>(dst);
    s4->sin_family = d4->sin_family = AF_INET;
    std::memcpy(&s4->sin_port, in + 2, 2);
    std::memcpy(&s4->sin_addr.s_addr, in + 16, 4);
    std::memcpy(&d4->sin_addr.s_addr, in + 32, 4);
  } else {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(src);
    auto* d6 = reinterpret_cast<sockaddr_in6*>(dst);
    s6->sin6_family = d6->sin6_family = AF_INET6;
    std::memcpy(&s6->sin6_port, in + 2, 2);
    std::memcpy(s6->sin6_addr.s6_addr, in + 4, 16);
    std::memcpy(d6->sin6_addr.s6_addr, in + 20, 16);
  }
  return true;
}

namespace {

struct Item {
  Device* dev;
  uint64_t conn, listen;
  softrnic_cm_msg msg;
};

// The worker's queue. Leaked on purpose: the worker waits on it until the process ends, and
// destroying a condition variable someone waits on blocks exit().
struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> items;
  bool worker_started = false;
};
Queue& queue() {
  static Queue* q = new Queue();
  return *q;
}

void set_conn_param(Event* ev, const softrnic_cm_msg& m, int pdata_max, int skip) {
  rdma_conn_param& c = ev->pub.param.conn;
  int n = pdata_max - skip;
  if (n < 0) n = 0;
  std::memcpy(ev->pdata, m.private_data + skip, static_cast<size_t>(n));
  c.private_data = ev->pdata;
  c.private_data_len = static_cast<uint8_t>(n);
  c.responder_resources = m.initiator_depth;  // swapped: what the peer will ask of us
  c.initiator_depth = m.responder_resources;
  c.flow_control = m.flow_control;
  c.retry_count = m.retry_count;
  c.rnr_retry_count = m.rnr_retry_count;
  c.srq = m.srq;
  c.qp_num = m.qpn;
}

void fill_ud_ah(Id* id, ibv_ah_attr* ah) {
  std::memset(ah, 0, sizeof *ah);
  ah->is_global = 1;
  std::memcpy(ah->grh.dgid.raw, id->path.dgid.raw, 16);
  ah->grh.sgid_index = static_cast<uint8_t>(id->sgid_index);
  ah->grh.hop_limit = id->path.hop_limit ? id->path.hop_limit : 64;
  ah->grh.traffic_class = id->path.traffic_class;
  ah->grh.flow_label = ntohl(id->path.flow_label);
  ah->port_num = id->pub.port_num;
}

// Builds the id of an incoming REQ / SIDR_REQ (cm-notes §2.1): inherits from the listener,
// addresses from the CMA header, the route from the REQ's primary path.
void on_request(Device* d, uint64_t conn, uint64_t listen, const softrnic_cm_msg& m) {
  auto it = g().listens.find({d, listen});
  softrnic_cm_msg rej{};
  rej.type = m.type == SOFTRNIC_CM_SIDR_REQ ? SOFTRNIC_CM_SIDR_REP : SOFTRNIC_CM_REJ;
  rej.status = m.type == SOFTRNIC_CM_SIDR_REQ ? 1u : kRejConsumer;  // SID unsupported / consumer
  rej.service_id = m.service_id;
  if (it == g().listens.end()) {
    d->ops->send(d->verbs, conn, &rej);
    d->ops->release(d->verbs, conn);
    return;
  }
  Id* l = it->second;
  bool ud = m.type == SOFTRNIC_CM_SIDR_REQ;
  bool want_ud = l->pub.qp_type == IBV_QPT_UD;
  sockaddr_storage src{}, dst{};
  bool hdr = uses_cma_hdr(l);
  bool ok = ud == want_ud && (!hdr || cma_hdr_parse(m.private_data, &src, &dst));
  // Which requests a listener takes (the kernel's cma_match_private_data): a wildcard one
  // every request unless AFONLY (an AF_INET wildcard is AFONLY by default); otherwise only
  // its own IP version, and an IP-bound one only requests for its address.
  const auto* bound = reinterpret_cast<const sockaddr*>(&l->bound);
  if (ok && hdr && !(sa_any(bound) && !l->afonly)) {
    uint8_t bg[16], dg[16];
    uint32_t scope = 0;
    bool hdr_v4 = dst.ss_family == AF_INET;
    sa_gid(bound, bg, &scope);
    sa_gid(reinterpret_cast<const sockaddr*>(&dst), dg, &scope);
    if (gid_is_v4(bg) != hdr_v4) ok = false;
    else if (!sa_any(bound) && std::memcmp(bg, dg, 16) != 0) ok = false;
  }
  // Our side of it: the GID the REQ was sent to (its primary path's remote GID; SIDR: the
  // one it arrived on), else the header's destination.
  int index = gid_index(d, m.remote_gid, 0);
  if (index < 0 && hdr) {
    uint8_t dg[16];
    uint32_t scope = 0;
    sa_gid(reinterpret_cast<const sockaddr*>(&dst), dg, &scope);
    index = gid_index(d, dg, 0);
  }
  if (index < 0) index = 0;
  Id* id = ok ? id_for_request(l, d) : nullptr;
  if (id == nullptr) {
    d->ops->send(d->verbs, conn, &rej);
    d->ops->release(d->verbs, conn);
    return;
  }
  id->port = 0;  // the listener owns the port
  id->sgid_index = index;
  auto& ra = id->pub.route.addr;
  std::memcpy(ra.addr.ibaddr.sgid.raw, d->info.gids[index].raw, 16);
  if (hdr) {
    // A link-local pair lives on the interface of our GID (the kernel: the netdev's index).
    uint32_t scope = d->info.gids[index].scope_id;
    for (sockaddr_storage* a : {&src, &dst}) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(a);
      if (a->ss_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) a6->sin6_scope_id = scope;
    }
    sa_set_port(reinterpret_cast<sockaddr*>(&dst), static_cast<uint16_t>(m.service_id & 0xFFFF));
    std::memcpy(&ra.src_addr, &dst, sa_len(reinterpret_cast<sockaddr*>(&dst)));  // our side: the header's destination
    std::memcpy(&ra.dst_addr, &src, sa_len(reinterpret_cast<sockaddr*>(&src)));
  }
  if (ud) {
    uint32_t scope = 0;
    if (!hdr || !sa_gid(reinterpret_cast<const sockaddr*>(&src), ra.addr.ibaddr.dgid.raw, &scope))
      std::memcpy(ra.addr.ibaddr.dgid.raw, m.local_gid, 16);  // where the SIDR_REQ came from
  } else {
    std::memcpy(ra.addr.ibaddr.dgid.raw, m.local_gid, 16);
  }
  ra.addr.ibaddr.pkey = htons(0xFFFF);
  ibv_sa_path_rec& p = id->path;
  std::memcpy(p.sgid.raw, ra.addr.ibaddr.sgid.raw, 16);
  std::memcpy(p.dgid.raw, ra.addr.ibaddr.dgid.raw, 16);
  p.hop_limit = ud ? 64 : m.hop_limit;
  p.traffic_class = m.traffic_class;
  p.flow_label = htonl(m.flow_label);
  p.reversible = 1;
  p.numb_path = 1;
  p.pkey = htons(0xFFFF);
  p.sl = m.sl;
  p.mtu_selector = 2;
  p.mtu = ud ? id->mtu : m.path_mtu;
  p.rate_selector = 2;
  p.rate = 3;
  p.packet_life_time_selector = 2;
  p.packet_life_time = kPacketLifetime;
  id->pub.route.num_paths = 1;
  id->mtu = p.mtu;
  id->conn = conn;
  id->conn_dev = d;
  g().conns[{d, conn}] = id;
  id->state = State::kReqRcvd;
  id->peer_known = true;
  id->peer_qpn = m.qpn;
  id->peer_psn = m.starting_psn;
  id->peer_rr = m.responder_resources;
  id->peer_ini = m.initiator_depth;
  // Known from here on, so rdma_init_qp_attr works before rdma_accept (rping -q, UCX):
  // our PSN, and the depths the REQ implies (accept may lower them).
  id->my_psn = random24();
  {
    const ibv_device_attr& a = d->attr;
    id->rr = static_cast<uint8_t>(std::min<int>(m.initiator_depth, std::min(a.max_qp_rd_atom, 255)));
    id->ini = static_cast<uint8_t>(std::min<int>(m.responder_resources, std::min(a.max_qp_init_rd_atom, 255)));
  }
  id->retry = m.retry_count;
  id->rnr = m.rnr_retry_count;  // what the requester asks us to retry (our QP's rnr_retry)
  if (!ud && m.local_ack_timeout != 0 && !id->ack_timeout_set) id->ack_timeout = kDefaultAckTimeout;
  Event* ev = queue_event(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0, to_channel(l->pub.channel));
  ev->pub.listen_id = &l->pub;
  int skip = hdr ? kCmaHdrSize : 0;
  if (ud) {
    rdma_ud_param& u = ev->pub.param.ud;
    std::memcpy(ev->pdata, m.private_data + skip, static_cast<size_t>(kSidrReqPdata - skip));
    u.private_data = ev->pdata;
    u.private_data_len = static_cast<uint8_t>(kSidrReqPdata - skip);
    fill_ud_ah(id, &u.ah_attr);
  } else {
    set_conn_param(ev, m, kReqPdata, skip);
  }
}

void on_rep(Id* id, const softrnic_cm_msg& m) {
  if (id->state != State::kConnect) return;
  id->peer_known = true;
  id->peer_qpn = m.qpn;
  id->peer_psn = m.starting_psn;
  // Active side after the REP (ib_cm): responder resources = the REP's initiator depth,
  // initiator depth = the REP's responder resources; rnr retry = the REP's.
  id->rr = m.initiator_depth;
  id->ini = m.responder_resources;
  id->rnr = m.rnr_retry_count;
  if (id->pub.qp == nullptr) {
    id->state = State::kRepRcvd;
    Event* ev = queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
    set_conn_param(ev, m, kRepPdata, 0);
    return;
  }
  int rc = qp_connect(id);
  softrnic_cm_msg reply{};
  if (rc != 0) {
    reply.type = SOFTRNIC_CM_REJ;
    reply.status = kRejConsumer;
    reply.rej_msg = 1;
    cm_send(id, reply);
    id->conn_error = true;
    id->state = State::kDone;
    queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -rc);
    return;
  }
  reply.type = SOFTRNIC_CM_RTU;
  cm_send(id, reply);
  id->state = State::kEstablished;
  Event* ev = queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  set_conn_param(ev, m, kRepPdata, 0);
}

void on_sidr_rep(Id* id, const softrnic_cm_msg& m) {
  if (id->state != State::kConnect) return;
  if (m.status != 0) {
    id->state = State::kDone;
    Event* ev = queue_event(id, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(m.status));
    std::memcpy(ev->pdata, m.private_data, kSidrRepPdata);
    ev->pub.param.ud.private_data = ev->pdata;
    ev->pub.param.ud.private_data_len = kSidrRepPdata;
    return;
  }
  id->state = State::kEstablished;
  Event* ev = queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  rdma_ud_param& u = ev->pub.param.ud;
  std::memcpy(ev->pdata, m.private_data, kSidrRepPdata);
  u.private_data = ev->pdata;
  u.private_data_len = kSidrRepPdata;
  fill_ud_ah(id, &u.ah_attr);
  u.qp_num = m.qpn;
  u.qkey = m.qkey;
}

void on_message(Device* d, uint64_t conn, uint64_t listen, const softrnic_cm_msg& m) {
  if (m.type == SOFTRNIC_CM_REQ || m.type == SOFTRNIC_CM_SIDR_REQ) {
    on_request(d, conn, listen, m);
    return;
  }
  auto it = g().conns.find({d, conn});
  if (it == g().conns.end()) return;  // its id is gone
  Id* id = it->second;
  switch (m.type) {
    case SOFTRNIC_CM_REP: on_rep(id, m); break;
    case SOFTRNIC_CM_SIDR_REP: on_sidr_rep(id, m); break;
    case SOFTRNIC_CM_RTU:
      if (id->state == State::kRepSent) {
        id->state = State::kEstablished;
        Event* ev = queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
        ev->pub.param.conn.private_data = ev->pdata;
      }
      break;
    case SOFTRNIC_CM_REJ: {
      if (id->conn_error) break;  // swallowed after CONNECT_ERROR, as librdmacm does
      if (id->state != State::kConnect && id->state != State::kRepSent && id->state != State::kRepRcvd) break;
      id->state = State::kDone;
      Event* ev = queue_event(id, RDMA_CM_EVENT_REJECTED, static_cast<int>(m.status));
      std::memcpy(ev->pdata, m.private_data, kRejPdata);
      ev->pub.param.conn.private_data = ev->pdata;
      ev->pub.param.conn.private_data_len = kRejPdata;
      break;
    }
    case SOFTRNIC_CM_DREQ:
      if (id->conn_error) break;
      if (id->state == State::kRepSent) {  // a DREQ implies the RTU we missed
        id->state = State::kEstablished;
        queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
      }
      if (id->state == State::kEstablished) {
        id->dreq_rcvd = true;
        id->state = State::kDisconnect;
        queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      } else if (id->state == State::kDisconnect) {
        // crossing DREQs: ours is answered by theirs
        id->dreq_rcvd = true;
        softrnic_cm_msg drep{};
        drep.type = SOFTRNIC_CM_DREP;
        cm_send(id, drep);
        id->dreq_rcvd = false;
        queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      }
      break;
    case SOFTRNIC_CM_DREP:
      if (id->state == State::kDisconnect && !id->dreq_rcvd) queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      break;
    case SOFTRNIC_CM_TIMEOUT:
      if (m.status == SOFTRNIC_CM_DREQ) {
        if (id->state == State::kDisconnect) queue_event(id, RDMA_CM_EVENT_DISCONNECTED, -ETIMEDOUT);
      } else if (id->state == State::kConnect || id->state == State::kRepSent) {
        id->state = State::kDone;
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      }
      break;
    case SOFTRNIC_CM_TIMEWAIT_EXIT:
      if (id->state == State::kDisconnect) {
        id->state = State::kDone;
        queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
      }
      break;
    default: break;
  }
}

void worker_main() {
  pthread_setname_np(pthread_self(), "rdmacm-cm");
  for (;;) {
    Item it;
    {
      Queue& q = queue();
      std::unique_lock<std::mutex> lk(q.mu);
      q.cv.wait(lk, [&] { return !q.items.empty(); });
      it = q.items.front();
      q.items.pop_front();
    }
    try {
      std::lock_guard<std::mutex> lk(g().mu);
      on_message(it.dev, it.conn, it.listen, it.msg);
    } catch (...) {
      // allocation failure: the message is lost, as a dropped MAD would be
    }
  }
}

}  // namespace

void cm_handler(void* user, uint64_t conn, uint64_t listen, const softrnic_cm_msg* m) {
  if (m == nullptr) return;
  Queue& q = queue();
  try {
    std::lock_guard<std::mutex> lk(q.mu);
    if (!q.worker_started) {
      std::thread(worker_main).detach();
      q.worker_started = true;
    }
    q.items.push_back(Item{static_cast<Device*>(user), conn, listen, *m});
  } catch (...) {
    return;
  }
  q.cv.notify_one();
}

}  // namespace rnic::rdmacm
