// emu/objects/cq.h: completion queues (a ring of Cqe with every ibv_wc field), completion channels
// with a real pollable eventfd, armed / solicited-only notification, resize and overflow.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "emu/objects/status.h"
#include "emu/objects/types.h"

namespace rnic::emu {

class Device;
class Cq;

// One completion: every ibv_wc field, plus the completion time (ibv_wc_read_completion_ts).
struct Cqe {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  // kWcWithImm: immediate data in network byte order (as received, untouched).
  // kWcWithInv: the invalidated rkey. (One field, as the union in ibv_wc.)
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;  // kWc* bits
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  // UD receive: the RoCE L3 header type of the datagram (kRoceL3*), as mlx5 reports it in
  // the CQE's sl field (UCX's ud_verbs reads `wc.sl & 7` to find the dgid in the GRH area).
  uint8_t sl = 0;
  uint8_t dlid_path_bits = 0;
  uint64_t timestamp_ns = 0;  // CLOCK_MONOTONIC ns, stamped by Cq::push
  // Tag matching (kWcTmMatch): the message's TMH tag and app_ctx (ibv_wc_tm_info).
  uint64_t tm_tag = 0;
  uint32_t tm_priv = 0;
};

// Largest ibv_modify_cq period (µs) accepted, as mlx5 (EINVAL above).
inline constexpr uint16_t kMaxCqPeriodUs = 4095;

// RoCE L3 header type of a received UD datagram (the mlx5 PRM's CQE encoding, bits 2:0).
inline constexpr uint8_t kRoceL3Ipv6 = 1;  // RoCE v2 over IPv6
inline constexpr uint8_t kRoceL3Ipv4 = 2;  // RoCE v2 over IPv4

// A completion channel (ibv_comp_channel): fd() is an eventfd (EFD_SEMAPHORE) whose counter
// is the number of undelivered CQ events, so poll() reports POLLIN exactly while
// get_event() has one. Thread-safe.
class CompChannel {
 public:
  CompChannel();
  ~CompChannel();
  CompChannel(const CompChannel&) = delete;
  CompChannel& operator=(const CompChannel&) = delete;

  int fd() const { return fd_; }
  // ibv_get_cq_event: take the oldest event. Honours the fd's O_NONBLOCK flag (blocking fd
  // waits; non-blocking fd with nothing pending -> Errc::kAgain). The caller acknowledges
  // with cq->ack_events(n) (ibv_ack_cq_events).
  Result<std::shared_ptr<Cq>> get_event();
  // Same, but never blocks whatever the fd flags.
  Result<std::shared_ptr<Cq>> try_get_event();
  size_t pending() const;
  // Number of CQs attached (destroy_comp_channel refuses with EBUSY while > 0).
  uint32_t attached() const { return attached_.load(); }

  // Used by Cq: queue an event for cq and make the fd readable.
  void notify(std::shared_ptr<Cq> cq);
  // Used by Device: drop queued events naming cq (it is being destroyed).
  void forget(const Cq* cq);

 private:
  friend class Device;
  Result<std::shared_ptr<Cq>> pop_after_read();
  int fd_ = -1;
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<Cq>> q_;
  std::atomic<uint32_t> attached_{0};
};

// Holds back the completion-channel events that Cq::push raises on this thread while the
// hold is alive; release() (and the destructor) delivers them in order. The receive path
// keeps one per batch and releases it after the batch's coalesced ACKs are on the wire, so
// an application woken by an event cannot send (e.g. its reply) ahead of the ACK the
// responder owes — the order a NIC gives. Completions themselves stay pollable at once.
// Holds nest (the innermost collects). Not copyable; must be destroyed on its own thread.
class CqEventHold {
 public:
  CqEventHold();
  ~CqEventHold();
  CqEventHold(const CqEventHold&) = delete;
  CqEventHold& operator=(const CqEventHold&) = delete;
  void release();

 private:
  friend class Cq;
  std::vector<std::shared_ptr<Cq>> held_;
  CqEventHold* prev_;
};

// Completion queue. Producers (completer, responder, flush) call push() from any thread;
// consumers call poll(). All members are thread-safe (an internal mutex; never held while
// calling out to hooks or other objects' locks except the channel's).
//
// Lock order: Qp send lock -> Qp receive lock -> Srq lock -> Cq lock -> CompChannel lock.
class Cq : public std::enable_shared_from_this<Cq> {
 public:
  Cq(Device& dev, uint32_t handle, uint32_t cqe, std::shared_ptr<CompChannel> channel,
     int comp_vector);
  ~Cq();

  uint32_t handle() const { return handle_; }
  Device& device() const { return *dev_; }
  // Capacity the application may rely on (ibv_cq::cqe).
  uint32_t cqe() const;
  int comp_vector() const { return comp_vector_; }
  // Whether push stamps each completion with the clock (Cqe::timestamp_ns; on by default).
  // The shim turns it off unless the CQ was created with a completion-timestamp wc_flag: a
  // clock read per completion was ~2% of a 64 B message's engine time (path_bench).
  void set_timestamps(bool on) { stamp_.store(on, std::memory_order_relaxed); }
  const std::shared_ptr<CompChannel>& channel() const { return channel_; }

  // Append a completion. `solicited` marks a receive completion of a message with the SE
  // bit (fires a solicited-only arm). Returns false on overflow: the entry is dropped, the
  // CQ enters the error state (in_error()), a CQ_ERR async event is queued once, and every
  // later push also fails. On false the CALLER must move the QP it was completing for to
  // ERR (Qp::enter_error_locked) — that is the "QP concerned" (IBA Class G).
  bool push(const Cqe& e, bool solicited = false);
  // Copy up to n oldest completions into out; returns how many (0..n). If the CQ is empty
  // and the device has hooks, calls hooks->on_poll_empty(*this) once and looks again.
  // Entries already queued stay pollable after an overflow. Never blocks on I/O.
  int poll(Cqe* out, int n);
  // Number of completions queued.
  uint32_t count() const;
  // Drops every queued completion of QP `qp_num`, keeping the others in order; returns how
  // many. Used when that QP goes to RESET (as libmlx5's mlx5_cq_clean: the IBA leaves
  // unpolled completions of a reset QP to the implementation; hardware providers drop them,
  // so a QP reset after an error does not hand its stale flush completions to the next
  // round of traffic).
  uint32_t remove_qp(uint32_t qp_num);
  // ibv_req_notify_cq: arm for the next completion (solicited_only: the next solicited or
  // unsuccessful completion). One event per arm; arming an armed CQ keeps the weaker
  // (next-completion) condition. Arming without a channel is allowed and never signals.
  Status req_notify(bool solicited_only);
  bool armed() const;
  // ibv_ack_cq_events.
  void ack_events(uint32_t n);
  uint32_t events_delivered() const { return events_delivered_.load(); }
  uint32_t events_acked() const { return events_acked_.load(); }
  bool in_error() const { return error_.load(std::memory_order_acquire); }

  // ibv_resize_cq: new capacity >= count() and <= device max, else EINVAL.
  Status resize(uint32_t cqe);

  // ibv_modify_cq(IBV_CQ_ATTR_MODERATE): event moderation, as a NIC's CQ moderation. It
  // changes only when an armed CQ's completion event is raised, never what poll() returns:
  // the event waits until `count` completions matching the arm have arrived, or until
  // `period_us` microseconds after the first of them, whichever comes first. count 0 = no
  // count bound (period only); count <= 1 with period 0 = no moderation (an event at the
  // first matching completion, the default). With a period but no engine to time it (no
  // hooks), the event is raised at once. Limits: count <= 65535, period <= kMaxCqPeriodUs.
  Status set_moderation(uint16_t count, uint16_t period_us);  // EINVAL: period too long
  uint16_t moderation_count() const;
  uint16_t moderation_period_us() const;
  // The engine's timer: raise the event whose period ended by now_ns. Returns the pending
  // deadline if it is still ahead, else 0 (nothing more to time).
  uint64_t moderation_tick(uint64_t now_ns);

  // QPs using this CQ (destroy_cq refuses with EBUSY while > 0).
  uint32_t users() const { return users_.load(); }

  void* user_context = nullptr;  // free for the shim (its ibv_cq wrapper)

 private:
  friend class Device;
  friend class CompChannel;
  friend class CqEventHold;
  void maybe_notify_locked(const Cqe& e, bool solicited, std::shared_ptr<Cq>* fire,
                           uint64_t* deadline);
  void fire_locked(std::shared_ptr<Cq>* fire);
  Device* dev_;
  uint32_t handle_;
  int comp_vector_;
  std::shared_ptr<CompChannel> channel_;
  mutable std::mutex mu_;
  std::vector<Cqe> ring_;
  uint32_t head_ = 0, count_ = 0, cqe_ = 0;
  enum class Arm : uint8_t { kNone, kNext, kSolicited } arm_ = Arm::kNone;
  uint16_t mod_count_ = 0, mod_period_us_ = 0;
  uint32_t mod_pending_ = 0;     // matching completions since the arm, event held back
  uint64_t mod_deadline_ns_ = 0;  // end of the running period (0: none)
  std::atomic<bool> error_{false};
  std::atomic<bool> stamp_{true};
  std::atomic<uint32_t> events_delivered_{0}, events_acked_{0};
  std::atomic<uint32_t> users_{0};
};

}  // namespace rnic::emu
