// Devices: finding softrnic's devices inside the process's libibverbs.so.1 (the CM bridge
// tail, verbs_shim/cm_bridge.h), rdma_get_devices / rdma_free_devices, and small helpers.
#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "rdmacm_shim/cma.h"

namespace rnic::rdmacm {

Global& g() {
  static Global* gl = new Global();  // never destroyed: the worker and devices outlive exit
  return *gl;
}

namespace {

// The bridge of one of our devices, or nullptr if `dev` belongs to another libibverbs.
const softrnic_cm_ops* bridge_of(ibv_device* dev) {
  const char* base = reinterpret_cast<const char*>(dev);
  const void* provider_ops = nullptr;  // verbs_device ops: never NULL in rdma-core
  std::memcpy(&provider_ops, base + sizeof(ibv_device), sizeof provider_ops);
  if (provider_ops != nullptr) return nullptr;
  softrnic_cm_tail tail;
  std::memcpy(&tail, base + SOFTRNIC_CM_TAIL_OFFSET, sizeof tail);
  if (tail.magic != SOFTRNIC_CM_MAGIC || tail.ops == nullptr) return nullptr;
  if (tail.ops->magic != SOFTRNIC_CM_MAGIC || tail.ops->abi != SOFTRNIC_CM_ABI ||
      tail.ops->size < sizeof(softrnic_cm_ops))
    return nullptr;
  return tail.ops;
}

// REQUIRES g().mu.
int init_locked() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return errno ? errno : ENODEV;
  int err = ENODEV;
  for (int i = 0; i < n; ++i) {
    const softrnic_cm_ops* ops = bridge_of(list[i]);
    if (ops == nullptr) continue;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      err = errno ? errno : ENODEV;
      continue;
    }
    auto* d = new Device();
    d->verbs = ctx;
    d->ops = ops;
    if (ops->query(ctx, &d->info) != 0 || ibv_query_device(ctx, &d->attr) != 0) {
      ibv_close_device(ctx);
      delete d;
      continue;
    }
    d->pd = ibv_alloc_pd(ctx);
    if (d->pd == nullptr || ops->set_handler(ctx, cm_handler, d) != 0) {
      if (d->pd) ibv_dealloc_pd(d->pd);
      ibv_close_device(ctx);
      delete d;
      continue;
    }
    g().devs.push_back(d);
  }
  ibv_free_device_list(list);
  return g().devs.empty() ? err : 0;
}

}  // namespace

int ucma_init() {
  std::lock_guard<std::mutex> lk(g().mu);
  if (!g().init_done) {
    g().init_err = init_locked();
    g().init_done = g().init_err == 0;  // retried until a device appears, as the real one
  }
  return g().init_err;
}

void left_data_path() noexcept {
  try {
    std::vector<Device*> devs;
    {
      std::lock_guard<std::mutex> lk(g().mu);
      if (!g().init_done) return;
      devs = g().devs;
    }
    for (Device* d : devs) d->ops->left_data_path(d->verbs);  // devices live until unload
  } catch (...) {  // no memory for the list: the ACKs go at their deadline
  }
}

namespace {
constexpr uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
bool gid_link_local(const uint8_t g[16]) { return g[0] == 0xFE && (g[1] & 0xC0) == 0x80; }
}  // namespace

bool gid_is_v4(const uint8_t gid[16]) { return std::memcmp(gid, kV4Prefix, 12) == 0; }

bool sa_gid(const sockaddr* sa, uint8_t gid[16], uint32_t* scope) {
  if (sa == nullptr) return false;
  *scope = 0;
  if (sa->sa_family == AF_INET) {
    std::memcpy(gid, kV4Prefix, 12);
    std::memcpy(gid + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    std::memcpy(gid, s6->sin6_addr.s6_addr, 16);
    if (gid_link_local(gid)) *scope = s6->sin6_scope_id;
    return true;
  }
  return false;
}

int gid_index(const Device* d, const uint8_t gid[16], uint32_t scope) {
  uint32_t n = std::min<uint32_t>(d->info.gid_count, SOFTRNIC_CM_MAX_GIDS);
  for (uint32_t i = 0; i < n; ++i) {
    const softrnic_cm_gid& e = d->info.gids[i];
    if (std::memcmp(e.raw, gid, 16) != 0) continue;
    if (gid_link_local(gid) && scope != 0 && e.scope_id != 0 && e.scope_id != scope) continue;
    return static_cast<int>(i);
  }
  return -1;
}

Device* device_for_gid(const uint8_t gid[16], uint32_t scope, int* index) {
  for (Device* d : g().devs) {
    int i = gid_index(d, gid, scope);
    if (i >= 0) {
      *index = i;
      return d;
    }
  }
  return nullptr;
}

int gid_index_like(const Device* d, const uint8_t like[16], uint32_t scope) {
  bool v4 = gid_is_v4(like), ll = !v4 && gid_link_local(like);
  uint32_t n = std::min<uint32_t>(d->info.gid_count, SOFTRNIC_CM_MAX_GIDS);
  for (uint32_t i = 0; i < n; ++i) {
    const softrnic_cm_gid& e = d->info.gids[i];
    if (gid_is_v4(e.raw) != v4) continue;
    if (v4) {
      if (std::memcmp(e.raw + 12, "\0\0\0\0", 4) == 0) continue;  // an IPv6 device's 0.0.0.0
      return static_cast<int>(i);
    }
    if (gid_link_local(e.raw) != ll) continue;
    if (ll && scope != 0 && e.scope_id != scope) continue;
    return static_cast<int>(i);
  }
  return -1;
}

void sa_of_raw_gid(const uint8_t gid[16], uint32_t scope, uint16_t port, bool as_v6, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  if (gid_is_v4(gid) && !as_v6) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(out);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr.s_addr, gid + 12, 4);
    return;
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(out);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(port);
  std::memcpy(s6->sin6_addr.s6_addr, gid, 16);
  if (gid_link_local(gid)) s6->sin6_scope_id = scope;
}

void sa_of_gid(const Device* d, int index, uint16_t port, bool as_v6, sockaddr_storage* out) {
  const softrnic_cm_gid& e = d->info.gids[index];
  sa_of_raw_gid(e.raw, e.scope_id, port, as_v6, out);
}

Device* device_for_ctx(ibv_context* c) {
  for (Device* d : g().devs)
    if (d->verbs == c) return d;
  return nullptr;
}

uint16_t sa_port(const sockaddr* sa) {
  if (sa == nullptr) return 0;
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

void sa_set_port(sockaddr* sa, uint16_t port) {
  if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
  if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
}

socklen_t sa_len(const sockaddr* sa) {
  if (sa == nullptr) return 0;
  switch (sa->sa_family) {
    case AF_INET: return sizeof(sockaddr_in);
    case AF_INET6: return sizeof(sockaddr_in6);
    case AF_IB: return sizeof(sockaddr_ib);
  }
  return 0;
}

bool sa_ipv4(const sockaddr* sa, in_addr* out) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET) {
    *out = reinterpret_cast<const sockaddr_in*>(sa)->sin_addr;
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      std::memcpy(&out->s_addr, a.s6_addr + 12, 4);
      return true;
    }
    if (IN6_IS_ADDR_UNSPECIFIED(&a)) {
      out->s_addr = 0;
      return true;
    }
  }
  return false;
}

bool sa_any(const sockaddr* sa) {
  in_addr a{};
  return sa_ipv4(sa, &a) && a.s_addr == 0;
}

bool sa_loopback(const sockaddr* sa) {
  in_addr a{};
  if (sa_ipv4(sa, &a)) return (ntohl(a.s_addr) >> 24) == 127;
  return sa != nullptr && sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

uint32_t random24() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(std::rand());
  return v & 0xFFFFFFu;
}

}  // namespace rnic::rdmacm

using namespace rnic::rdmacm;

RDMACM_EXPORT struct ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  if (int rc = ucma_init(); rc != 0) {
    // As the real library: an empty list when there is no device.
    auto** empty = static_cast<ibv_context**>(std::calloc(1, sizeof(ibv_context*)));
    if (empty == nullptr) errno = ENOMEM;
    return empty;
  }
  std::lock_guard<std::mutex> lk(g().mu);
  size_t n = g().devs.size();
  auto** list = static_cast<ibv_context**>(std::calloc(n + 1, sizeof(ibv_context*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i) list[i] = g().devs[i]->verbs;
  if (num_devices) *num_devices = static_cast<int>(n);
  return list;
}

RDMACM_EXPORT void rdma_free_devices(struct ibv_context** list) { std::free(list); }
