// MemPort / MemNetwork: the in-memory twin of UdpPort. Ports attach to a MemNetwork hub
// by Endpoint; send_batch copies each datagram into the destination port's queue.
// Used by protocol tests and anything that must run without sockets.
#pragma once

#include <atomic>

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "wire/port.h"

namespace rnic::wire {

class MemPort;

// The hub. Thread-safe. Must outlive every port attached to it.
class MemNetwork {
 public:
  // queue_depth: datagrams each port can hold before further ones are dropped
  // (counted in that port's rx_dropped). max_datagram: larger datagrams are refused
  // (sender's tx_errors).
  // signal_fds false: the ports have no wait_fd (-1) and send/receive make no eventfd
  // syscalls; only for a single-threaded benchmark that never waits on a port's fd
  // (path_bench: the engine's own per-packet cost, without the hub's two syscalls a message).
  explicit MemNetwork(size_t queue_depth = 4096, uint32_t max_datagram = 65535,
                      bool signal_fds = true);
  ~MemNetwork();
  MemNetwork(const MemNetwork&) = delete;
  MemNetwork& operator=(const MemNetwork&) = delete;

  // Attaches a port at `ep`. ep.port == 0 picks a free port from 49152 up. Returns
  // nullptr and sets *err (EADDRINUSE, EMFILE for no eventfd) on failure.
  std::unique_ptr<MemPort> attach(const Endpoint& ep, int* err = nullptr);

  // Datagrams sent to an Endpoint no port is attached at (also counted per sender).
  uint64_t unknown_dst() const;
  // Number of attached ports.
  size_t port_count() const;

 private:
  friend class MemPort;
  void detach(MemPort* p);
  // Caller holds mu_ shared. nullptr if none.
  MemPort* find_locked(const Endpoint& ep) const;

  const size_t queue_depth_;
  const uint32_t max_datagram_;
  const bool signal_fds_;
  mutable std::shared_mutex mu_;  // shared: lookups by senders; exclusive: attach/detach
  std::vector<MemPort*> ports_;
  std::atomic<uint64_t> unknown_dst_{0};
};

// Contract: as Port (send_batch thread-safe, recv_batch single consumer, never blocks).
// Delivery is synchronous: when send_batch returns, the datagrams are in the
// destination queues, so a test can send and immediately receive. Order is preserved
// per (sender thread, destination). A TxDesc with gso_size is delivered as separate
// datagrams; segment k carries ip_id = k, as the kernel would number them.
// wait_fd is an eventfd that is readable exactly while the queue is non-empty.
// The send path copies into preallocated slot buffers: no allocation once each slot has
// seen its largest datagram.
class MemPort final : public Port {
 public:
  ~MemPort() override;

  const Endpoint& local() const override { return local_; }
  // -1 on a hub without eventfds (MemNetwork signal_fds false): there is nothing to wait on.
  int wait_fd() const override;

  // Datagrams waiting.
  size_t queued() const;
  // Datagrams waiting in percent of the queue's depth.
  int rx_fill_pct() const override;
  // Receive as a socket with UDP_GRO does: a GSO descriptor sent to this port arrives as one
  // coalesced buffer (RxDesc::seg_size = its gso_size) instead of one datagram per segment.
  // Off by default. Set before traffic starts.
  void set_gro(bool on) { gro_ = on; }
  // Every datagram this port receives arrives ECN CE-marked (RxDesc::tos = 3), as behind a
  // congested switch that marks ECT traffic.
  void set_ce_mark(bool on) { ce_.store(on, std::memory_order_relaxed); }

 protected:
  int send_impl(std::span<const TxDesc> pkts) override;
  int recv_impl(std::span<RxDesc> descs) override;
  // GSO is emulated (split in the hub) so the engine can exercise its GSO path.
  int gso_max_segments_impl() const override { return 64; }

 private:
  friend class MemNetwork;
  MemPort(MemNetwork* net, const Endpoint& ep, int efd, size_t depth);
  // Enqueue one datagram; false if the queue is full.
  bool deliver(const Endpoint& src, const uint8_t* data, uint32_t len, uint16_t ip_id,
               uint16_t seg_size = 0);

  struct Slot {
    Endpoint src;
    uint16_t ip_id = 0;
    uint16_t seg_size = 0;  // GRO: a coalesced buffer of datagrams of this size
    std::vector<uint8_t> bytes;
  };
  bool gro_ = false;
  std::atomic<bool> ce_{false};

  MemNetwork* net_;
  Endpoint local_;
  int efd_;
  mutable std::mutex mu_;  // guards the ring and the eventfd's readable state
  std::vector<Slot> ring_;
  size_t head_ = 0;  // next to receive
  size_t count_ = 0;
};

}  // namespace rnic::wire
