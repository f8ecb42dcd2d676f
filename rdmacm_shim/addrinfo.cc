// rdma_getaddrinfo / rdma_freeaddrinfo (libc getaddrinfo, first result; no ibacm), and the
// synchronous endpoint calls rdma_create_ep / rdma_destroy_ep / rdma_get_request.
#include <netdb.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "rdmacm_shim/cma.h"

using namespace rnic::rdmacm;

namespace {

sockaddr* copy_sa(const sockaddr* sa, socklen_t len) {
  auto* out = static_cast<sockaddr*>(std::calloc(1, len));
  if (out) std::memcpy(out, sa, len);
  return out;
}

// No node and no service: the result is the hints' own addresses and fields, unresolved, as
// the real library gives (libfabric's verbs provider asks so with a peer's address in
// ai_dst_addr when it connects to an endpoint name).
int from_hints(const rdma_addrinfo& h, rdma_addrinfo** res) {
  auto* ai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (ai == nullptr) return fail(ENOMEM);
  ai->ai_flags = h.ai_flags;
  ai->ai_family = h.ai_family;
  ai->ai_qp_type = h.ai_qp_type;
  ai->ai_port_space = h.ai_port_space;
  bool ok = true;
  if (h.ai_dst_addr != nullptr && h.ai_dst_len > 0) {
    ok = (ai->ai_dst_addr = copy_sa(h.ai_dst_addr, h.ai_dst_len)) != nullptr;
    ai->ai_dst_len = h.ai_dst_len;
  }
  if (ok && h.ai_src_addr != nullptr && h.ai_src_len > 0) {
    ok = (ai->ai_src_addr = copy_sa(h.ai_src_addr, h.ai_src_len)) != nullptr;
    ai->ai_src_len = h.ai_src_len;
  }
  if (!ok) {
    rdma_freeaddrinfo(ai);
    return fail(ENOMEM);
  }
  *res = ai;
  return 0;
}

}  // namespace

RDMACM_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo* res) {
  while (res != nullptr) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}

RDMACM_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const struct rdma_addrinfo* hints,
                                   struct rdma_addrinfo** res) {
  left_data_path();
  return guard([&]() -> int {
    if (res == nullptr) return fail(EINVAL);
    if (node == nullptr && service == nullptr && hints == nullptr) return EAI_NONAME;
    if (int rc = ucma_init(); rc != 0) return fail(rc);
    if (node == nullptr && service == nullptr) return from_hints(*hints, res);
    // "[fe80::1%eth0]" / "[::1]": the bracketed literal URLs and endpoint names use (an
    // extension; libc's getaddrinfo takes the address, with its %scope, without brackets).
    std::string unbracketed;
    if (node != nullptr && node[0] == '[') {
      const char* end = std::strchr(node, ']');
      if (end == nullptr || end[1] != '\0' || end == node + 1) return EAI_NONAME;
      unbracketed.assign(node + 1, static_cast<size_t>(end - node - 1));
      node = unbracketed.c_str();
    }
    auto* ai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    if (ai == nullptr) return fail(ENOMEM);
    addrinfo h{};
    if (hints != nullptr) {
      ai->ai_flags = hints->ai_flags;
      ai->ai_family = hints->ai_family;
      ai->ai_qp_type = hints->ai_qp_type;
      ai->ai_port_space = hints->ai_port_space;
      if (hints->ai_flags & RAI_PASSIVE) h.ai_flags |= AI_PASSIVE;
      if (hints->ai_flags & RAI_NUMERICHOST) h.ai_flags |= AI_NUMERICHOST;
      if (hints->ai_family != AF_IB) h.ai_family = hints->ai_family;
    }
    // Port space and QP type decide the socket type; hints win (cm-notes §2.4).
    if (ai->ai_port_space == 0 && ai->ai_qp_type == 0) {
      ai->ai_port_space = RDMA_PS_TCP;
      ai->ai_qp_type = IBV_QPT_RC;
    } else if (ai->ai_port_space == 0) {
      ai->ai_port_space = ai->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP;
    } else if (ai->ai_qp_type == 0) {
      ai->ai_qp_type = ai->ai_port_space == RDMA_PS_UDP || ai->ai_port_space == RDMA_PS_IPOIB ? IBV_QPT_UD
                                                                                          : IBV_QPT_RC;
    }
    bool udp = ai->ai_port_space == RDMA_PS_UDP || ai->ai_port_space == RDMA_PS_IPOIB;
    h.ai_socktype = udp ? SOCK_DGRAM : SOCK_STREAM;
    h.ai_protocol = udp ? IPPROTO_UDP : IPPROTO_TCP;
    addrinfo* got = nullptr;
    int rc = getaddrinfo(node, service, &h, &got);
    if (rc != 0) {
      std::free(ai);
      return rc;  // EAI_* as the real library
    }
    ai->ai_family = got->ai_family;
    bool passive = hints != nullptr && (hints->ai_flags & RAI_PASSIVE);
    sockaddr* a = copy_sa(got->ai_addr, got->ai_addrlen);
    if (a == nullptr) {
      freeaddrinfo(got);
      std::free(ai);
      return fail(ENOMEM);
    }
    if (got->ai_canonname) {
      if (passive) ai->ai_src_canonname = strdup(got->ai_canonname);
      else ai->ai_dst_canonname = strdup(got->ai_canonname);
    }
    if (passive) {
      ai->ai_src_addr = a;
      ai->ai_src_len = got->ai_addrlen;
    } else {
      ai->ai_dst_addr = a;
      ai->ai_dst_len = got->ai_addrlen;
      if (hints != nullptr && hints->ai_src_addr != nullptr && hints->ai_src_len > 0) {
        ai->ai_src_addr = copy_sa(hints->ai_src_addr, hints->ai_src_len);
        ai->ai_src_len = hints->ai_src_len;
      }
    }
    freeaddrinfo(got);
    *res = ai;
    return 0;
  });
}

RDMACM_EXPORT int rdma_create_ep(struct rdma_cm_id** id, struct rdma_addrinfo* res, struct ibv_pd* pd,
                                 struct ibv_qp_init_attr* qp_init_attr) {
  return guard([&] {
    if (id == nullptr || res == nullptr) return fail(EINVAL);
    // An XRC endpoint would fail at its first QP (rdma_create_qp_ex: EOPNOTSUPP); a passive one
    // only when a peer connects, so both sides are refused here, at once.
    if (res->ai_qp_type == IBV_QPT_XRC_SEND || res->ai_qp_type == IBV_QPT_XRC_RECV) {
      return fail(EOPNOTSUPP);
    }
    rdma_cm_id* cm = nullptr;
    if (create_id_qpt(nullptr, &cm, nullptr, static_cast<rdma_port_space>(res->ai_port_space),
                      static_cast<ibv_qp_type>(res->ai_qp_type)) != 0)
      return -1;
    Id* i = to_id(cm);
    if (qp_init_attr != nullptr) qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
    auto undo = [&] {
      int e = errno;
      rdma_destroy_id(cm);
      errno = e;
      return -1;
    };
    if (res->ai_flags & RAI_PASSIVE) {
      if (res->ai_src_addr == nullptr || rdma_bind_addr(cm, res->ai_src_addr) != 0) {
        if (res->ai_src_addr == nullptr) errno = EINVAL;
        return undo();
      }
      if (qp_init_attr != nullptr) {
        auto* saved = new (std::nothrow) ibv_qp_init_attr(*qp_init_attr);
        if (saved == nullptr) {
          errno = ENOMEM;
          return undo();
        }
        std::lock_guard<std::mutex> lk(g().mu);
        i->ep_attr = saved;
        i->ep_pd = pd;
      }
      *id = cm;
      return 0;
    }
    if (rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000) != 0) return undo();
    if (rdma_resolve_route(cm, 2000) != 0) return undo();
    if (qp_init_attr != nullptr && rdma_create_qp(cm, pd, qp_init_attr) != 0) return undo();
    *id = cm;
    return 0;
  });
}

RDMACM_EXPORT void rdma_destroy_ep(struct rdma_cm_id* id) {
  if (id == nullptr) return;
  Id* i = to_id(id);
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  ibv_qp_init_attr* a = nullptr;
  {
    std::lock_guard<std::mutex> lk(g().mu);
    a = i->ep_attr;
    i->ep_attr = nullptr;
  }
  delete a;
  rdma_destroy_id(id);
}

RDMACM_EXPORT int rdma_get_request(struct rdma_cm_id* listen, struct rdma_cm_id** id) {
  return guard([&] {
    if (listen == nullptr || id == nullptr) return fail(EINVAL);
    Id* l = to_id(listen);
    if (!l->sync) return fail(EINVAL);
    if (listen->event != nullptr) {
      rdma_ack_cm_event(listen->event);
      listen->event = nullptr;
    }
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(listen->channel, &ev) != 0) return -1;
    auto bail = [&](int e) {
      rdma_ack_cm_event(ev);
      return fail(e);
    };
    if (ev->event == RDMA_CM_EVENT_REJECTED) return bail(ECONNREFUSED);
    if (ev->status != 0) return bail(ev->status < 0 ? -ev->status : ev->status);
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return bail(EINVAL);
    ibv_qp_init_attr attr{};
    ibv_pd* pd = nullptr;
    bool make_qp = false;
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (l->ep_attr != nullptr) {
        attr = *l->ep_attr;
        pd = l->ep_pd;
        make_qp = true;
      }
    }
    if (make_qp && rdma_create_qp(ev->id, pd, &attr) != 0) {
      int e = errno;
      return bail(e);
    }
    *id = ev->id;
    (*id)->event = ev;
    return 0;
  });
}
