// emu/objects/cq.cc: CompChannel (eventfd-backed CQ event queue) and Cq (completion ring, arming,
// overflow into the error state, resize).
#include "emu/objects/cq.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "emu/objects/device.h"

namespace rnic::emu {

// ---------------------------------------------------------------- CompChannel

CompChannel::CompChannel() { fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE); }

CompChannel::~CompChannel() {
  if (fd_ >= 0) ::close(fd_);
}

void CompChannel::notify(std::shared_ptr<Cq> cq) {
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(cq));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(fd_, &one, sizeof(one));
}

void CompChannel::forget(const Cq* cq) {
  // Drain this CQ's queued events, keeping the eventfd counter equal to the queue length.
  std::lock_guard lk(mu_);
  size_t removed = 0;
  for (auto it = q_.begin(); it != q_.end();) {
    if (it->get() == cq) {
      it = q_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < removed; ++i) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) break;
    uint64_t v;
    if (::read(fd_, &v, sizeof(v)) != sizeof(v)) break;
  }
}

Result<std::shared_ptr<Cq>> CompChannel::pop_after_read() {
  std::lock_guard lk(mu_);
  if (q_.empty()) return Errc::kAgain;
  std::shared_ptr<Cq> cq = std::move(q_.front());
  q_.pop_front();
  cq->events_delivered_.fetch_add(1);
  return cq;
}

Result<std::shared_ptr<Cq>> CompChannel::get_event() {
  uint64_t v;
  for (;;) {
    ssize_t r = ::read(fd_, &v, sizeof(v));
    if (r == sizeof(v)) return pop_after_read();
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return Errc::kAgain;
    return Errc::kIo;
  }
}

Result<std::shared_ptr<Cq>> CompChannel::try_get_event() {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) return Errc::kAgain;
  return get_event();
}

size_t CompChannel::pending() const {
  std::lock_guard lk(mu_);
  return q_.size();
}

// ---------------------------------------------------------------- CqEventHold

namespace {
thread_local CqEventHold* t_event_hold = nullptr;
}  // namespace

CqEventHold::CqEventHold() : prev_(t_event_hold) { t_event_hold = this; }

CqEventHold::~CqEventHold() {
  release();
  t_event_hold = prev_;
}

void CqEventHold::release() {
  for (auto& cq : held_) {
    CompChannel& ch = *cq->channel_;
    ch.notify(std::move(cq));
  }
  held_.clear();
}

// ---------------------------------------------------------------- Cq

Cq::Cq(Device& dev, uint32_t handle, uint32_t cqe, std::shared_ptr<CompChannel> channel,
       int comp_vector)
    : dev_(&dev), handle_(handle), comp_vector_(comp_vector), channel_(std::move(channel)),
      ring_(cqe), cqe_(cqe) {}

// The channel's attached count is kept by Device::create_cq / destroy_cq.
Cq::~Cq() = default;

uint32_t Cq::cqe() const {
  std::lock_guard lk(mu_);
  return cqe_;
}

void Cq::fire_locked(std::shared_ptr<Cq>* fire) {
  arm_ = Arm::kNone;
  mod_pending_ = 0;
  mod_deadline_ns_ = 0;
  if (channel_) *fire = shared_from_this();
}

void Cq::maybe_notify_locked(const Cqe& e, bool solicited, std::shared_ptr<Cq>* fire,
                             uint64_t* deadline) {
  if (arm_ == Arm::kNone) return;
  // Solicited-only arm fires on a solicited completion or an unsuccessful one (IBA 11.4.2.2).
  bool hit = arm_ == Arm::kNext || solicited || e.status != WcStatus::kSuccess;
  if (!hit) return;
  const bool moderated = mod_count_ > 1 || (mod_count_ == 0 && mod_period_us_ != 0);
  if (moderated) {
    ++mod_pending_;
    if (mod_count_ == 0 || mod_pending_ < mod_count_) {
      if (mod_period_us_ == 0) return;  // count only: wait for the count
      if (mod_deadline_ns_ == 0) {
        const uint64_t t = e.timestamp_ns != 0 ? e.timestamp_ns : Device::now_ns();
        mod_deadline_ns_ = t + uint64_t(mod_period_us_) * 1000;
        *deadline = mod_deadline_ns_;
      }
      return;
    }
  }
  fire_locked(fire);
}

Status Cq::set_moderation(uint16_t count, uint16_t period_us) {
  if (period_us > kMaxCqPeriodUs) return Errc::kInval;
  std::lock_guard lk(mu_);
  mod_count_ = count;
  mod_period_us_ = period_us;
  return Status::ok();
}

uint16_t Cq::moderation_count() const {
  std::lock_guard lk(mu_);
  return mod_count_;
}

uint16_t Cq::moderation_period_us() const {
  std::lock_guard lk(mu_);
  return mod_period_us_;
}

uint64_t Cq::moderation_tick(uint64_t now_ns) {
  std::shared_ptr<Cq> fire;
  {
    std::lock_guard lk(mu_);
    if (mod_deadline_ns_ == 0) return 0;
    if (now_ns < mod_deadline_ns_) return mod_deadline_ns_;
    if (arm_ != Arm::kNone && mod_pending_ > 0) {
      fire_locked(&fire);
    } else {
      mod_pending_ = 0;
      mod_deadline_ns_ = 0;
    }
  }
  if (fire) channel_->notify(std::move(fire));
  return 0;
}

bool Cq::push(const Cqe& e, bool solicited) {
  std::shared_ptr<Cq> fire;
  bool overflow_now = false;
  uint64_t deadline = 0;
  {
    std::lock_guard lk(mu_);
    if (error_.load(std::memory_order_relaxed)) return false;
    if (count_ == cqe_) {
      // IBA 11.4.2.1 / Class G: CQ overflow -> CQ error, async CQ_ERR.
      error_.store(true, std::memory_order_release);
      overflow_now = true;
    } else {
      Cqe& slot = ring_[(head_ + count_) % cqe_];
      slot = e;
      slot.timestamp_ns = stamp_.load(std::memory_order_relaxed) ? Device::now_ns() : 0;
      ++count_;
      maybe_notify_locked(slot, solicited, &fire, &deadline);
    }
  }
  if (deadline != 0) {
    // A moderation period started: the engine times it; without one, raise the event now.
    TransportHooks* h = dev_->hooks();
    if (h == nullptr || !h->on_cq_deadline(*this, deadline)) {
      std::lock_guard lk(mu_);
      if (arm_ != Arm::kNone && mod_deadline_ns_ == deadline) fire_locked(&fire);
    }
  }
  if (overflow_now) {
    AsyncEvent ev;
    ev.type = EventType::kCqErr;
    ev.cq = shared_from_this();
    dev_->async_events().push(std::move(ev));
    return false;
  }
  if (fire) {
    if (t_event_hold != nullptr) {
      t_event_hold->held_.push_back(std::move(fire));
    } else {
      channel_->notify(std::move(fire));
    }
  }
  return true;
}

int Cq::poll(Cqe* out, int n) {
  if (n <= 0) return 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int k = 0;
    {
      std::lock_guard lk(mu_);
      while (k < n && count_ > 0) {
        out[k++] = ring_[head_];
        head_ = (head_ + 1) % cqe_;
        --count_;
      }
    }
    if (k > 0) {
      if (TransportHooks* h = dev_->hooks()) h->on_poll_hit(*this);
      return k;
    }
    if (attempt == 0) {
      TransportHooks* h = dev_->hooks();
      if (h == nullptr) return 0;
      h->on_poll_empty(*this);
    }
  }
  return 0;
}

uint32_t Cq::remove_qp(uint32_t qp_num) {
  std::lock_guard lk(mu_);
  uint32_t kept = 0;
  for (uint32_t i = 0; i < count_; ++i) {
    const Cqe& e = ring_[(head_ + i) % cqe_];
    if (e.qp_num == qp_num) continue;
    if (kept != i) ring_[(head_ + kept) % cqe_] = e;
    ++kept;
  }
  const uint32_t removed = count_ - kept;
  count_ = kept;
  return removed;
}

uint32_t Cq::count() const {
  std::lock_guard lk(mu_);
  return count_;
}

Status Cq::req_notify(bool solicited_only) {
  std::lock_guard lk(mu_);
  if (arm_ == Arm::kNext) return Status::ok();  // already armed for anything
  arm_ = solicited_only ? Arm::kSolicited : Arm::kNext;
  return Status::ok();
}

bool Cq::armed() const {
  std::lock_guard lk(mu_);
  return arm_ != Arm::kNone;
}

void Cq::ack_events(uint32_t n) { events_acked_.fetch_add(n); }

Status Cq::resize(uint32_t cqe) {
  if (cqe < 1 || cqe > static_cast<uint32_t>(dev_->attr().max_cqe)) return Errc::kInval;
  std::lock_guard lk(mu_);
  if (cqe < count_) return Errc::kInval;
  std::vector<Cqe> n(cqe);
  for (uint32_t i = 0; i < count_; ++i) n[i] = ring_[(head_ + i) % cqe_];
  ring_.swap(n);
  head_ = 0;
  cqe_ = cqe;
  return Status::ok();
}

}  // namespace rnic::emu
