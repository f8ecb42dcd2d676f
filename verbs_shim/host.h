// Hosting of the engine of one device in this process. Embedded: the first ibv_open_device
// of a device starts it (binding UDP 4791 on SOFTRNIC_IP or on the first free loopback address
// from 127.0.0.2). Daemon (SOFTRNIC_HOSTING, docs/daemon.md): softrnicd owns the address and
// hands this process a slot — its QPNs and keys — and the slot's reuseport sockets; the engine
// runs here over them. Either way contexts share it and the last close stops it.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu/cm/agent.h"
#include "emu/objects/device.h"
#include "emu/services/services.h"
#include "verbs_shim/config.h"

namespace rnic::shim {

struct DeviceEntry;
struct Context;

// One running device. Fields other than contexts_ are written once in host_acquire.
struct Host {
  DeviceEntry* dev_entry_ = nullptr;
  Config cfg_;
  std::string ip_;  // bound address (SOFTRNIC_IP or the free 127.0.0.x chosen), IPv4 or IPv6
  std::shared_ptr<emu::Device> dev_;
  std::unique_ptr<emu::DeviceServices> services_;  // faults, capture, control socket
  // The IB CM on QP1 (emu/cm/agent.h); destroyed before services_ (it unhooks from the engine).
  std::unique_ptr<cm::Agent> cm_;
  int refs_ = 0;  // guarded by the host registry mutex
  // Async events: a dispatcher thread moves emu's device-wide events into the owning
  // context's queue (port events go to every context).
  std::mutex ctx_mu_;
  std::vector<Context*> contexts_;
  int stop_fd_ = -1;
  std::thread dispatcher_;
  uint64_t fork_gen_ = 0;  // g_fork_generation when started (see host_inherited)
  std::atomic<uint64_t> dm_used_{0};  // bytes of device memory allocated (dm.cc)
  std::atomic<uint32_t> dm_handles_{1};
  // Daemon hosting: the connection to softrnicd (its end means the daemon died: the device
  // turns fatal), this process's slot, and the descriptors it handed over (closed in a
  // forked child, which must not keep the parent's sockets). -1 / 0 / empty when embedded.
  int daemon_fd_ = -1;
  uint8_t slot_ = 0;
  std::vector<int> daemon_fds_;
  std::string daemon_path_;
  // Requests to softrnicd (service IDs): the dispatcher thread reads every message, so a
  // requester waits here for the reply with its sequence number.
  std::mutex call_mu_;  // one request at a time
  std::mutex req_mu_;
  std::condition_variable req_cv_;
  uint32_t req_seq_ = 0;
  uint32_t reply_seq_ = 0;
  int reply_err_ = 0;
  bool daemon_lost_ = false;
};

// Fork safety. A pthread_atfork child handler (installed by the first host_acquire) bumps
// this generation and forgets the running host without touching it: in a forked child the
// engine's threads do not exist and its socket still belongs to the parent, so every object
// of an older generation is the parent's. Verbs on them fail with EIO (what rdma-core
// returns once the kernel has disassociated a device from the file: the process no longer
// owns it) and never reach the engine or its socket; poll_cq returns -1. A new
// ibv_open_device in the child starts its own engine on a new address.
extern std::atomic<uint64_t> g_fork_generation;
inline bool host_inherited(const Host* h) {
  return h->fork_gen_ != g_fork_generation.load(std::memory_order_relaxed);
}

// The device's CM agent (emu/cm/agent.h "HOW THE rdmacm LIBRARY GETS THE AGENT"), or nullptr.
inline cm::Agent* host_cm_agent(Host* h) { return h != nullptr ? h->cm_.get() : nullptr; }

// The application leaves the data path: it is about to sleep on an event, or makes an rdma_cm
// call. Receive, parked timers and held ACKs go back to the progress thread now
// (emu::Engine::left_data_path, the busy-poll hand-off). Null-safe; nothing for an inherited host.
void host_left_data_path(Host* h);

// Starts (or references) the engine of `dev`. Returns 0 or a positive errno; a bad
// SOFTRNIC_* value prints a message naming the variable and returns EINVAL.
int host_acquire(DeviceEntry* dev, Host** out);
// Daemon hosting: claims (listen) or releases a CM service ID on the device for this process.
// 0; EADDRINUSE when another process listens on it; EIO when the daemon is gone. Embedded: 0.
int host_claim_service(Host* host, uint64_t service_id, bool listen);
// Drops one reference; the last one stops the engine. Null-safe.
void host_release(Host* host);
// Context registration for async-event dispatch. Thread-safe.
void host_add_context(Host* host, Context* ctx);
void host_remove_context(Host* host, Context* ctx);

}  // namespace rnic::shim
