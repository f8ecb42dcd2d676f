// emu/objects/async_event.cc: AsyncEventQueue — eventfd-backed queue of asynchronous events.
#include "emu/objects/async_event.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "emu/objects/cq.h"
#include "emu/objects/qp.h"
#include "emu/objects/srq.h"

namespace rnic::emu {

AsyncEventQueue::AsyncEventQueue() { fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE); }

AsyncEventQueue::~AsyncEventQueue() {
  if (fd_ >= 0) ::close(fd_);
}

void AsyncEventQueue::push(AsyncEvent ev) {
  {
    std::lock_guard lk(mu_);
    if (q_.size() >= kMaxQueued) {
      ++dropped_;
      return;
    }
    q_.push_back(std::move(ev));
  }
  uint64_t one = 1;
  // An eventfd write of 1 only fails if the counter would overflow 2^64-2: impossible here.
  [[maybe_unused]] ssize_t r = ::write(fd_, &one, sizeof(one));
}

Status AsyncEventQueue::pop_after_read(AsyncEvent* out) {
  std::lock_guard lk(mu_);
  if (q_.empty()) return Errc::kAgain;  // cannot happen: counter == queue length
  *out = std::move(q_.front());
  q_.pop_front();
  return Status::ok();
}

Status AsyncEventQueue::get(AsyncEvent* out) {
  uint64_t v;
  for (;;) {
    ssize_t r = ::read(fd_, &v, sizeof(v));
    if (r == sizeof(v)) return pop_after_read(out);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return Errc::kAgain;
    return Errc::kIo;
  }
}

Status AsyncEventQueue::try_get(AsyncEvent* out) {
  // poll(0) first so a blocking fd is never read while empty. Contract (header): do not
  // race try_get() with a concurrent blocking get() on the same queue.
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) return Errc::kAgain;
  return get(out);
}

size_t AsyncEventQueue::pending() const {
  std::lock_guard lk(mu_);
  return q_.size();
}

uint64_t AsyncEventQueue::dropped() const {
  std::lock_guard lk(mu_);
  return dropped_;
}

}  // namespace rnic::emu
