// Embedded hosting: the engine of one device living inside this process. The first
// ibv_open_device of a device starts it (binding UDP 4791 on SOFTRNIC_IP or on the first
// free loopback address from 127.0.0.2); contexts share it; the last close stops it.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "verbs_shim/config.h"

namespace rnic::shim {

struct DeviceEntry;

// One running device engine. Fields are written once in host_acquire, then read-only.
struct Host {
  DeviceEntry* dev_ = nullptr;
  Config cfg_;
  in_addr ip_{};           // bound address (network order)
  uint32_t active_mtu_ = 4096;
  int refs_ = 0;           // guarded by the host registry mutex
  struct Impl;             // engine objects (host.cc)
  Impl* impl_ = nullptr;
};

// Starts (or references) the engine of `dev`. Returns 0 or a positive errno; a bad
// SOFTRNIC_* value prints a message naming the variable and returns EINVAL.
int host_acquire(DeviceEntry* dev, Host** out);
// Drops one reference; the last one stops the engine. Null-safe.
void host_release(Host* host);

}  // namespace rnic::shim
