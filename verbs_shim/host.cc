// Embedded hosting of the engine: configuration, address choice, start and stop.
#include "verbs_shim/host.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "verbs_shim/shim.h"

namespace rnic::shim {

struct Host::Impl {
  int placeholder = 0;
};

namespace {

std::mutex g_host_mu;
Host* g_host = nullptr;  // one device per process in embedded mode

// Tries to bind UDP 4791 on `ip`; returns 0 if the address is free (socket closed again),
// else the errno (EADDRINUSE when another device holds it).
int probe_bind(in_addr ip) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(4791);
  sa.sin_addr = ip;
  int rc = bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 ? 0 : errno;
  close(s);
  return rc;
}

}  // namespace

int host_acquire(DeviceEntry* dev, Host** out) {
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (g_host != nullptr && g_host->dev_ == dev) {
    ++g_host->refs_;
    *out = g_host;
    return 0;
  }
  Config cfg;
  std::string err;
  if (!parse_config(&cfg, &err)) {
    log_error("%s; cannot open the device", err.c_str());
    return EINVAL;
  }
  auto* h = new (std::nothrow) Host();
  if (h == nullptr) return ENOMEM;
  h->dev_ = dev;
  h->cfg_ = cfg;
  int rc = 0;
  if (cfg.ip_set) {
    h->ip_ = cfg.ip;
    rc = probe_bind(cfg.ip);
    if (rc != 0) {
      char b[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &cfg.ip, b, sizeof b);
      log_error("cannot bind UDP %s:4791 (SOFTRNIC_IP): %s", b, std::strerror(rc));
    }
  } else {
    rc = EADDRINUSE;
    for (uint32_t a = 0x7f000002u; a < 0x7f0000ffu; ++a) {
      in_addr ip;
      ip.s_addr = htonl(a);
      int r = probe_bind(ip);
      if (r == 0) {
        h->ip_ = ip;
        rc = 0;
        break;
      }
      if (r != EADDRINUSE) {
        rc = r;
        break;
      }
    }
    if (rc != 0) log_error("no free loopback address for UDP 4791 from 127.0.0.2: %s", std::strerror(rc));
  }
  if (rc != 0) {
    delete h;
    return rc;
  }
  h->active_mtu_ = cfg.mtu != 0 ? cfg.mtu : 4096;
  h->refs_ = 1;
  g_host = h;
  *out = h;
  char b[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &h->ip_, b, sizeof b);
  log_msg(LogLevel::kInfo, "device %s on %s:4791", cfg.name.c_str(), b);
  return 0;
}

void host_release(Host* host) {
  if (host == nullptr) return;
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (--host->refs_ > 0) return;
  if (g_host == host) g_host = nullptr;
  delete host->impl_;
  delete host;
}

}  // namespace rnic::shim
