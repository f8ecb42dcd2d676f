// emu/objects/async_event.h: the device's asynchronous event queue (ibv_get_async_event): QP fatal,
// CQ error, SRQ limit, LAST_WQE_REACHED, COMM_EST, port active... backed by an eventfd
// that poll()/epoll report readable while events are pending.
#pragma once

#include <deque>
#include <memory>
#include <mutex>

#include "emu/objects/status.h"
#include "emu/objects/types.h"

namespace rnic::emu {

class Qp;
class Cq;
class Srq;

// One event. Exactly one of qp/cq/srq is set, or none for port/device events (then
// port_num is meaningful). The shared_ptr keeps the object alive until the event is taken.
struct AsyncEvent {
  EventType type = EventType::kPortActive;
  std::shared_ptr<Qp> qp;
  std::shared_ptr<Cq> cq;
  std::shared_ptr<Srq> srq;
  int port_num = 0;
};

// Multi-producer, multi-consumer. fd() is an eventfd (EFD_SEMAPHORE) whose counter equals
// the number of queued events, so it polls readable exactly while get() has something.
class AsyncEventQueue {
 public:
  AsyncEventQueue();
  ~AsyncEventQueue();
  AsyncEventQueue(const AsyncEventQueue&) = delete;
  AsyncEventQueue& operator=(const AsyncEventQueue&) = delete;

  // The pollable fd (owned here; the shim may set O_NONBLOCK on it).
  int fd() const { return fd_; }
  // Queue an event; never blocks. Thread-safe. Events beyond kMaxQueued are dropped
  // (counted in dropped()).
  void push(AsyncEvent ev);
  // Take the oldest event. Honours the fd's O_NONBLOCK flag like ibv_get_async_event:
  // blocking fd -> waits; non-blocking fd and none queued -> Errc::kAgain.
  Status get(AsyncEvent* out);
  // Non-blocking take regardless of the fd's flags (tests, the daemon). kAgain if empty.
  // Do not race it with a concurrent blocking get() on the same queue.
  Status try_get(AsyncEvent* out);
  size_t pending() const;
  uint64_t dropped() const;

  static constexpr size_t kMaxQueued = 4096;

 private:
  Status pop_after_read(AsyncEvent* out);
  int fd_ = -1;
  mutable std::mutex mu_;
  std::deque<AsyncEvent> q_;
  uint64_t dropped_ = 0;
};

}  // namespace rnic::emu
