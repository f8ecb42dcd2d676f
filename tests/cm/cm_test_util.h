// tests/cm/cm_test_util.h: two softrnic devices with engines and CM agents (in-memory or real
// UDP), an event recorder, and the standard REQ/REP parameters.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emu/cm/agent.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "wire/mem_port.h"

namespace rnic::cm::testing {

// Records events; waits (bounded) for a condition over them.
class Recorder {
 public:
  Sink sink() {
    return [this](const Event& e) {
      std::lock_guard lk(mu_);
      events_.push_back(e);
      if (hook_) hook_(e);
      cv_.notify_all();
    };
  }
  // Called on the cm thread for each event, after recording (may call the agent).
  void on_event(std::function<void(const Event&)> f) {
    std::lock_guard lk(mu_);
    hook_ = std::move(f);
  }
  // Waits until n events of type t were recorded; returns the n-th (or a default Event).
  bool wait(EventType t, size_t n = 1, int timeout_ms = 5000) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                        [&] { return count_locked(t) >= n; });
  }
  Event first(EventType t) {
    std::lock_guard lk(mu_);
    for (const Event& e : events_)
      if (e.type == t) return e;
    return Event{};
  }
  size_t count(EventType t) {
    std::lock_guard lk(mu_);
    return count_locked(t);
  }
  std::vector<Event> all() {
    std::lock_guard lk(mu_);
    return events_;
  }

 private:
  size_t count_locked(EventType t) const {
    size_t n = 0;
    for (const Event& e : events_) n += e.type == t ? 1 : 0;
    return n;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
  std::function<void(const Event&)> hook_;
};

struct Node {
  std::shared_ptr<emu::Device> dev;
  std::unique_ptr<Agent> cm;
  ~Node() {
    cm.reset();
    if (dev && dev->engine() != nullptr) dev->engine()->stop();
    if (dev) dev->close();
  }
};

inline emu::DeviceConfig node_config(const std::string& ip) {
  emu::DeviceConfig c;
  c.ip = ip;
  c.netdev_mtu = 1500;
  return c;
}

// A device on `ip` whose engine uses a MemPort of `net` (progress thread on) and an agent.
inline std::unique_ptr<Node> mem_node(wire::MemNetwork& net, const std::string& ip,
                                      uint32_t max_wait_ms) {
  auto n = std::make_unique<Node>();
  auto d = emu::Device::open(node_config(ip));
  if (!d.has_value()) return nullptr;
  n->dev = *d;
  auto ep = wire::Endpoint::parse(ip, 4791);
  int err = 0;
  auto port = net.attach(*ep, &err);
  if (!port) return nullptr;
  emu::EngineConfig ec;
  ec.gso = false;
  auto e = emu::Engine::start_with_port(n->dev, std::move(port), ec);
  if (!e.has_value()) return nullptr;
  AgentOptions o;
  o.max_wait_ms = max_wait_ms;
  n->cm = Agent::create(n->dev, o, &err);
  if (!n->cm) return nullptr;
  return n;
}

// The same over a real UDP socket on ip:4791.
inline std::unique_ptr<Node> udp_node(const std::string& ip, uint32_t max_wait_ms) {
  auto n = std::make_unique<Node>();
  auto d = emu::Device::open(node_config(ip));
  if (!d.has_value()) return nullptr;
  n->dev = *d;
  emu::EngineConfig ec;
  ec.gso = false;
  auto e = emu::Engine::start(n->dev, ec);
  if (!e.has_value()) return nullptr;
  AgentOptions o;
  o.max_wait_ms = max_wait_ms;
  int err = 0;
  n->cm = Agent::create(n->dev, o, &err);
  if (!n->cm) return nullptr;
  return n;
}

inline constexpr uint64_t kSid = 0x0000000001061D2Full;  // rdma_cm TCP port 7471

inline ReqParams req_to(const Node& from, const Node& to, std::span<const uint8_t> pd = {}) {
  ReqParams p;
  p.service_id = kSid;
  p.local_qpn = 0x000123;
  p.starting_psn = 0x00ABCD;
  p.responder_resources = 4;
  p.initiator_depth = 2;
  p.path.local_gid = from.cm->local_gid();
  p.path.remote_gid = to.cm->local_gid();
  p.path.mtu = 3;
  p.private_data = pd;
  return p;
}

inline RepParams rep_params() {
  RepParams r;
  r.local_qpn = 0x000456;
  r.starting_psn = 0x00BEEF;
  r.responder_resources = 2;
  r.initiator_depth = 4;
  return r;
}

}  // namespace rnic::cm::testing
