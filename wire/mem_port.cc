// MemNetwork hub and MemPort queues: copy-on-send delivery, eventfd readiness.
#include "wire/mem_port.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rnic::wire {

MemNetwork::MemNetwork(size_t queue_depth, uint32_t max_datagram, bool signal_fds)
    : queue_depth_(queue_depth == 0 ? 1 : queue_depth),
      max_datagram_(max_datagram),
      signal_fds_(signal_fds) {}

MemNetwork::~MemNetwork() = default;

std::unique_ptr<MemPort> MemNetwork::attach(const Endpoint& ep, int* err) {
  int dummy;
  if (err == nullptr) err = &dummy;
  *err = 0;
  std::unique_lock lk(mu_);
  Endpoint want = ep;
  if (want.port == 0) {
    for (uint32_t p = 49152; p <= 65535; ++p) {
      want.port = uint16_t(p);
      if (find_locked(want) == nullptr) break;
      want.port = 0;
    }
    if (want.port == 0) {
      *err = EADDRINUSE;
      return nullptr;
    }
  } else if (find_locked(want) != nullptr) {
    *err = EADDRINUSE;
    return nullptr;
  }
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) {
    *err = errno;
    return nullptr;
  }
  std::unique_ptr<MemPort> p(new MemPort(this, want, efd, queue_depth_));
  ports_.push_back(p.get());
  return p;
}

void MemNetwork::detach(MemPort* p) {
  std::unique_lock lk(mu_);
  ports_.erase(std::remove(ports_.begin(), ports_.end(), p), ports_.end());
}

MemPort* MemNetwork::find_locked(const Endpoint& ep) const {
  for (MemPort* p : ports_) {
    if (p->local_ == ep) return p;
  }
  return nullptr;
}

uint64_t MemNetwork::unknown_dst() const { return unknown_dst_.load(std::memory_order_relaxed); }

size_t MemNetwork::port_count() const {
  std::shared_lock lk(mu_);
  return ports_.size();
}

// ---- MemPort --------------------------------------------------------------------------

int MemPort::wait_fd() const { return net_->signal_fds_ ? efd_ : -1; }

MemPort::MemPort(MemNetwork* net, const Endpoint& ep, int efd, size_t depth)
    : net_(net), local_(ep), efd_(efd), ring_(depth) {}

MemPort::~MemPort() {
  // Detach first: once the hub's exclusive lock is taken no sender is inside deliver().
  net_->detach(this);
  ::close(efd_);
}

size_t MemPort::queued() const {
  std::lock_guard lk(mu_);
  return count_;
}

int MemPort::rx_fill_pct() const {
  return static_cast<int>(queued() * 100 / ring_.size());  // the ring's size is fixed
}

bool MemPort::deliver(const Endpoint& src, const uint8_t* data, uint32_t len, uint16_t ip_id,
                      uint16_t seg_size) {
  std::lock_guard lk(mu_);
  if (count_ == ring_.size()) {
    bump(ctr_.rx_dropped);
    return false;
  }
  Slot& s = ring_[(head_ + count_) % ring_.size()];
  s.src = src;
  s.ip_id = ip_id;
  s.seg_size = seg_size;
  s.bytes.assign(data, data + len);  // reuses the slot's capacity after warm-up
  if (count_++ == 0 && net_->signal_fds_) {
    uint64_t one = 1;
    (void)!::write(efd_, &one, sizeof(one));  // empty -> non-empty: make the fd readable
  }
  return true;
}

int MemPort::send_impl(std::span<const TxDesc> pkts) {
  // Shared lock: destination ports cannot detach (be destroyed) while we deliver.
  std::shared_lock lk(net_->mu_);
  for (const TxDesc& d : pkts) {
    const uint32_t seg = d.gso_size != 0 && d.gso_size < d.len ? d.gso_size : d.len;
    const uint32_t nseg = seg == 0 ? 1 : (d.len + seg - 1) / seg;
    MemPort* dst = net_->find_locked(d.dst);
    if (dst == nullptr) {
      bump(ctr_.unknown_dst, nseg);
      bump(ctr_.tx_errors, nseg);
      net_->unknown_dst_.fetch_add(nseg, std::memory_order_relaxed);
      continue;
    }
    if (seg > net_->max_datagram_) {
      bump(ctr_.tx_errors, nseg);
      continue;
    }
    if (dst->gro_ && nseg > 1) {  // one coalesced buffer, as UDP_GRO delivers it
      bump(ctr_.tx_packets, nseg);
      bump(ctr_.tx_bytes, d.len);
      (void)dst->deliver(local_, d.data, d.len, 0, uint16_t(seg));
      continue;
    }
    for (uint32_t k = 0; k < nseg; ++k) {
      const uint32_t off = k * seg;
      const uint32_t n = std::min(seg, d.len - off);
      bump(ctr_.tx_packets);
      bump(ctr_.tx_bytes, n);
      // Loss at a full receiver is the receiver's drop (rx_dropped), like a socket.
      (void)dst->deliver(local_, d.data + off, n, uint16_t(k));
    }
  }
  return int(pkts.size());
}

int MemPort::recv_impl(std::span<RxDesc> descs) {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (; n < descs.size() && count_ > 0; ++n) {
    Slot& s = ring_[head_];
    RxDesc& d = descs[n];
    const uint32_t len = uint32_t(s.bytes.size());
    d.truncated = len > d.cap;
    d.len = std::min(len, d.cap);
    std::memcpy(d.buf, s.bytes.data(), d.len);
    d.src = s.src;
    d.dst = local_;
    d.ip_id = s.ip_id;
    d.tos = ce_.load(std::memory_order_relaxed) ? 3 : 0;
    d.seg_size = s.seg_size < d.len ? s.seg_size : 0;
    if (d.truncated) bump(ctr_.rx_truncated);
    bump(ctr_.rx_packets, d.seg_size != 0 ? (d.len + d.seg_size - 1) / d.seg_size : 1);
    bump(ctr_.rx_bytes, d.len);
    head_ = (head_ + 1) % ring_.size();
    --count_;
  }
  if (n > 0 && count_ == 0 && net_->signal_fds_) {
    uint64_t v;
    (void)!::read(efd_, &v, sizeof(v));  // non-empty -> empty: clear readiness
  }
  return int(n);
}

}  // namespace rnic::wire
