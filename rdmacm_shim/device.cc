// Devices: finding softrnic's devices inside the process's libibverbs.so.1 (the CM bridge
// tail, verbs_shim/cm_bridge.h), rdma_get_devices / rdma_free_devices, and small helpers.
#include <arpa/inet.h>
#include <sys/random.h>

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

Device* device_for_ip(in_addr ip) {
  for (Device* d : g().devs)
    if (d->info.ipv4.s_addr == ip.s_addr) return d;
  return nullptr;
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
