// emu/transport/engine.h: the per-device transport engine. It owns the device's wire::Port (a real
// UdpPort, or a MemPort in tests), implements TransportHooks (requester inline on post_send,
// receive drain inline on poll of an empty CQ), and runs a progress thread (epoll over the
// port's fd + a timerfd for retransmit/RNR timers + an eventfd for stop) for everything else.
//
// HOW A DEVICE GETS ITS ENGINE
//   auto dev = Device::open(cfg).value();             // cfg.ip = "127.0.0.2"
//   auto eng = Engine::start(dev, EngineConfig{});    // UdpPort on cfg.ip:4791,
//                                                     // dev->set_hooks(eng), dev->set_engine(eng),
//                                                     // progress thread running
//   ... verbs ... (Qp::post_send / post_recv / Cq::poll / req_notify are thread-safe)
//   eng->stop();      // optional: joins the thread, detaches hooks; idempotent
//   dev->close();     // or just drop the device: ~Device destroys the engine last-but-tables
// Tests use Engine::start_with_port(dev, mem_port, cfg) with cfg.progress_thread = false
// and drive it by hand with poll_rx() and run_timers().
//
// THREADING
//  * post_send: the requester runs in the posting thread under the QP's send lock and hands
//    each batch of packets to the port with one send_batch.
//  * receive: one thread at a time drains the port (rx_mu_): the progress thread (blocking
//    lock) or a poll_cq caller on an empty CQ (try-lock, never blocks). Each packet takes
//    only its QP's receive lock (responder) or send lock (completer).
//  * busy poll: poll_cq on an empty CQ stamps the time; the first such poll takes the socket
//    out of the progress thread's epoll set and arms a timerfd, so a busy-polling app is not
//    interrupted by a progress-thread wake per packet. When no poll happened for
//    busy_poll_ns (the lease, renewed at half time while the calls go on) the progress thread
//    watches the socket again and drains it. A post while the polls hold receive counts as a
//    call for the gap (on_app_post; a post_send from its start, on_app_enter).
//  * spin: with spin_ns, the progress thread polls the port for spin_ns after the last
//    datagram it received before it sleeps in epoll (timers due meanwhile run from the spin),
//    if the machine's runnable threads leave a CPU spare (spare_core).
//  * timers: per-QP deadlines in CompState. Whoever sets one calls arm_timer(qp, deadline),
//    which queues the QP in a min-heap of (deadline, QP) unless an entry at or before that
//    deadline is queued already (CompState::timer_queued_ns); one timerfd is armed at the
//    heap's top. When it fires, only the QPs whose entries are due are visited (each one's
//    real deadlines are checked under its send lock and re-queued if still armed), so the
//    cost of a timer tick is independent of the number of idle QPs. An entry may be early
//    (the deadline moved later) or stale (disarmed, destroyed: the weak_ptr is dead), never
//    late: every armed deadline has an entry at or before it.
// Per-packet code allocates nothing and takes no lock wider than one QP (rx_mu_ is the
// device's receive lock of docs/progress.md; the timer lock is taken only to queue a QP whose
// earliest timer entry moves earlier or that has none, about once per timer period of a busy
// QP; the heap's push allocates only when it grows past its largest size so far).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "emu/objects/counters.h"
#include "emu/objects/device.h"
#include "emu/objects/hooks.h"
#include "emu/objects/status.h"
#include "emu/transport/gsi.h"
#include "emu/transport/one_copy.h"
#include "emu/transport/scatter_cache.h"
#include "emu/transport/stash.h"
#include "wire/port.h"

namespace rnic::emu {


struct EngineConfig {
  // Bind address; empty = the device's GID table (every GID's address gets a socket; GID i
  // sends from socket i). Set: that one address only.
  std::string ip;
  // UDP port to bind and to send to (RoCEv2: 4791). Tests may use another.
  uint16_t udp_port = wire::kRoceUdpPort;
  // Start the progress thread (timers, background receive, completion events).
  bool progress_thread = true;
  // UDP GSO on send (UdpPort): equal-sized packets of a message leave in one sendmsg. Off =
  // one datagram per packet (SOFTRNIC_GSO; only safe where a batch is never cut, wire.md §4).
  bool gso = true;
  // UDP GRO on receive, independent of gso: always safe, since the receiver splits a
  // coalesced buffer by its segment size and checks each packet's ICRC on its own (with the
  // segment's IP ID, or solving for it: wire.md §3). Tests turn it off to see single datagrams.
  bool gro = true;
  // Busy-poll hand-off (on_poll_empty). While an application polls empty CQs back to back (its
  // calls at most busy_poll_gap_ns apart, from the end of one to the start of the next:
  // last_app_call_ns_), its polls receive (poll_cq drains inline) and run the timers, the progress
  // thread stops watching the socket, and the timerfd is parked (arm_locked): the progress thread
  // sleeps. The polls hold receive on a lease of busy_poll_ns, renewed at half time by a
  // timerfd_settime that wakes no one. Receive goes back to the progress thread (hand_back_rx) when
  // a poll returns a completion that left its QP idle with the peer's answer not in (ib_write_lat
  // then waits on memory), when the application leaves the data path (left_data_path: req_notify,
  // get_cq_event, rdma_cm), when the polls come further apart (busy_poll_late_polls + 1 late ones
  // in a lease), and at the latest when the lease runs out, unless an application thread is inside
  // a call of ours or the thread that renewed it waits for a CPU (lease_holder_waits). A post
  // counts as a poll for the gap (the application is in the library), renews the lease when it came
  // within the gap of the last call, and, after a gap without a receive, receives as a poll would;
  // it never takes receive (on_app_post). 0 = the progress thread always receives (the default
  // here; the shim's SOFTRNIC_BUSY_POLL_US is 2000).
  uint32_t busy_poll_ns = 0;
  // Calls further apart than this (from the end of one to the start of the next: a poll's
  // receive or a post_send can run long) are not a busy poll: receive stays with (or goes back
  // to) the progress thread; an application polling every millisecond would otherwise hold
  // the peer's ACKs that long. Tests under a sanitizer widen it (a poll there can take longer).
  uint32_t busy_poll_gap_ns = 50'000;
  // Late empty polls (each further than busy_poll_gap_ns from the call before) that the
  // polls' receive survives within one lease (lease_ns(), from the first of them): the next
  // one hands it back. With 0, every late poll hands receive back. 1 (the default): one late
  // poll a lease is forgiven, since a single late one is mostly the application thread
  // preempted (four busy threads on two cores: ib_send_bw -q 4's sender handed receive back
  // ~50 times a second, its progress thread woke for each, took a core from the
  // application, and the next poll took receive again: two epoll_ctl). An application that
  // really polls slower than the gap gives receive back at its second late poll in a lease
  // at the latest. A late poll never takes receive, and none after left_data_path is
  // forgiven.
  uint32_t busy_poll_late_polls = 1;
  // Adaptive busy polling in the progress thread (SOFTRNIC_SPIN_US): after it received
  // traffic, it keeps polling the port (non-blocking, yielding the CPU between polls) until
  // spin_ns passed without a datagram, then sleeps in epoll again. It saves the epoll
  // wake-up (several us, more when the core runs a spinning application) on every packet
  // of a ping-pong. Only while a core is spare (Engine::spare_core). 0 = always sleep (the
  // shim sets SOFTRNIC_SPIN_US, default 20 us).
  uint32_t spin_ns = 0;
  // Doorbell batching (shim: SOFTRNIC_TX_DEFER). A post to an RC or XRC QP that has at least
  // defer_inflight packets unacknowledged, with its retransmit timer armed, builds nothing:
  // its WQEs wait in the SQ, and the requester runs when the next ACK (or that timer) is
  // handled, sending everything posted since in one batch (one sendmmsg instead of one per
  // post). An ACK is certain to come: every message's last packet asks for one. At most
  // defer_max WQEs wait; the post that would exceed it runs the requester itself. 0 = off
  // (every post sends at once; the default here, for tests that drive packets by hand).
  uint32_t defer_inflight = 0;
  uint32_t defer_max = 64;
  // ACKs ride posts (shim: SOFTRNIC_ACK_HOLD_US). A post to an RC QP whose responder owes an
  // ACK sends it first, in the same batch as its requests. And once a QP's application has
  // answered that way (or posted less than this long after an ACK went alone), the receive
  // context holds that QP's owed ACKs for the next post, at most this long; one that times
  // out goes alone and ends the holding. So a ping-pong sends one sendmmsg per message, not
  // two. The progress thread holds only while the application is in its loop (its last call
  // within busy_poll_gap_ns: flush_acks_locked); run_timers sends a held ACK no post took (the
  // progress thread's timerfd, the polls' timer runs, or a test's hand). 0 = off (the default
  // here, for tests that drive packets by hand).
  uint64_t ack_hold_ns = 0;
  // With ack_hold_ns: an application thread's receive (poll_cq) that handled the ACK of a
  // ping-pong's last message waits at most this long for the answer behind it before it
  // returns (Engine::linger_rx). 0 = never.
  uint64_t linger_ns = 5'000;
  // With ack_hold_ns and GSO: a requester run takes the held ACK after its requests, as the
  // short last segment of their GSO datagram (one datagram per ping-pong answer, not two;
  // the receiver's drain handles such an ACK first); one that does not fit goes as its own
  // datagram ahead of them. Never while a fault engine (capture, faults) is attached. Off by
  // default (docs/progress.md: a perftest -R failure in the full suite not yet understood).
  bool ack_tail = false;
  // One copy between two devices of one host (emu/transport/one_copy.h, SOFTRNIC_ONE_COPY):
  // listen for peers on the abstract socket of the port's first address, and send RC SEND /
  // WRITE payloads as descriptors of the registered pages to a peer that listens too.
  bool one_copy = false;
  // The receive queue as a congestion point (shim: SOFTRNIC_RX_MARK_PCT). A receive batch that
  // comes back full looks at the port's fill (Port::rx_fill_pct, a system call); at or above
  // this percent of what the socket holds before the kernel drops, every RC/UC request of
  // that batch counts as ECN CE-marked: its QP's requester gets a CNP (note_ce, at most one per
  // cnp_min_gap_ns) and halves its window. Several QPs into one receiver otherwise fill the
  // socket with their windows (2 MiB each at 4 KiB): the copy out of a deep queue is slower,
  // and past the buffer the kernel drops and the QPs go back N. 0 = off (the default here;
  // the shim's is 85).
  uint32_t rx_mark_pct = 0;
  // Window sharing (shim: SOFTRNIC_WINDOW_SHARE). The RC QPs of this device whose windows
  // fill towards one destination address share kMaxUnackedPsns between them (each at least
  // kShareFloorPsns): a QP whose window fills counts itself in the destination's epoch of
  // window_share_epoch_ns and takes kMaxUnackedPsns / (the count of this epoch or the last) as its
  // cap. One QP keeps the whole window; four into one receiver no longer queue four windows
  // (8 MiB at 4 KiB) in its socket, where the copy out of a deep queue is slower. Off: each
  // QP's window is its own (the default here; the shim's is on).
  bool window_share = false;
  uint64_t window_share_epoch_ns = 1'000'000;  // (tests make it longer)
  // Socket buffer sizes asked of the UdpPort (best effort).
  int rcvbuf = 8 << 20;
  int sndbuf = 4 << 20;
};

// Builds outgoing packets back to back in one arena and hands them to the port in one
// send_batch. Consecutive packets of equal size to the same destination are merged into one
// UDP GSO descriptor when the port allows it (set_gso); packet k of such a run leaves with
// IPv4 ID k, so the builder asks ip_id_for() before computing the packet's ICRC.
// Not thread-safe: one per thread (tx_batch_for_thread()) or per context.
class TxBatch {
 public:
  static constexpr int kMaxDescs = 128;
  static constexpr uint32_t kSlotBytes = 4096 + 128;  // largest packet: MTU + headers + ICRC
  static constexpr size_t kArenaBytes = 128 * 1024 + 64 * kSlotBytes;
  static constexpr uint32_t kMaxGsoBytes = 65507 - 8;  // one UDP datagram
  static constexpr uint32_t kMinGsoSegment = 512;     // runs of smaller packets are not merged
  TxBatch();
  // Largest GSO run (1 = no GSO). Set from Port::max_gso_segments() before building.
  void set_gso(int max_segments) { gso_max_ = max_segments < 1 ? 1 : max_segments; }
  // Buffer for the next packet (room for kSlotBytes). REQUIRES: !full().
  uint8_t* next() { return mem_.get() + used_; }
  // The IPv4 ID the next packet (len bytes, to dst) will leave with: its index in the GSO
  // run it joins, or 0.
  // small: a one-copy descriptor packet (one_copy.h), merged with the ones next to it however
  // small (a 64 KiB message is 16 of them; one datagram each would cost more than the copies
  // they save).
  uint16_t ip_id_for(const wire::Endpoint& dst, uint32_t len, bool small = false) const {
    return joins_run(dst, len, small) ? static_cast<uint16_t>(segs_) : 0;
  }
  void commit(const wire::Endpoint& dst, uint32_t len, bool small = false) {
    if (joins_run(dst, len, small)) {
      wire::TxDesc& d = descs_[n_ - 1];
      d.len += len;
      d.gso_size = static_cast<uint16_t>(seg_);
      ++segs_;
      if (len < seg_) run_open_ = false;  // a short segment must be the run's last
    } else {
      descs_[n_] = wire::TxDesc{dst, next(), len, 0};
      ++n_;
      seg_ = len;
      segs_ = 1;
      run_open_ = true;
      run_small_ = small;
    }
    used_ += len;
  }
  bool full() const { return n_ == kMaxDescs || used_ + kSlotBytes > kArenaBytes; }
  // Room for n more packets without a flush.
  bool room_for(int n) const {
    return n_ + n <= kMaxDescs && used_ + static_cast<size_t>(n) * kSlotBytes <= kArenaBytes;
  }
  // While set, a packet no longer than the open run's segments joins it as its last
  // segment whatever the run's size (an ACK riding a post as the tail of its GSO datagram:
  // req_run, docs/progress.md).
  void allow_tail(bool on) { tail_ok_ = on; }
  // The next packet starts a datagram of its own (no earlier run is extended).
  void close_run() { run_open_ = false; }
  // Moves the last descriptor to index `pos`, ahead of those from pos on (which keep their
  // order), and closes the open run. REQUIRES: pos < size().
  void move_last_to(int pos);
  int size() const { return n_; }
  // Sends everything queued (retrying partial sends); returns descriptors handed over.
  int flush(wire::Port& port, Counters& dev_ctr);

 private:
  bool joins_run(const wire::Endpoint& dst, uint32_t len, bool small) const {
    // Small packets (ACKs) gain nothing from GSO runs of their own; keeping them single also
    // keeps captures and filters, which cannot see IP IDs, exact for them. The exception is an
    // ACK riding a post as the tail of its requests' run (allow_tail; never with a filter).
    if (gso_max_ <= 1 || n_ == 0 || !run_open_) return false;
    if (seg_ < kMinGsoSegment && !(small && run_small_) && !tail_ok_) return false;
    const wire::TxDesc& d = descs_[n_ - 1];
    // A tail must be shorter than the run's segments: that is how the receiver tells it.
    if (tail_ok_ && len >= seg_) return false;
    return len <= seg_ && segs_ < static_cast<uint32_t>(gso_max_) &&
           d.len + len <= kMaxGsoBytes && d.dst == dst;
  }
  std::unique_ptr<uint8_t[]> mem_;
  wire::TxDesc descs_[kMaxDescs];
  int n_ = 0;
  size_t used_ = 0;
  int gso_max_ = 1;
  uint32_t seg_ = 0, segs_ = 0;
  bool run_open_ = false;
  bool run_small_ = false;  // the open run is of one-copy descriptors
  bool tail_ok_ = false;
};

// The calling thread's TxBatch (allocated on first use, then reused).
TxBatch& tx_batch_for_thread();

// Where packets for an address vector go: the DGID's IPv4 or IPv6 address at udp_port, sent
// from the SGID (src_index) with the GRH's traffic class, flow label and hop limit (IPv6) and
// the SGID interface for a link-local DGID.
wire::Endpoint peer_endpoint(const Av& av, uint16_t udp_port);

class Engine final : public TransportHooks {
 public:
  // Opens a UdpPort on cfg.ip (or the device's IP) : cfg.udp_port, installs the engine as
  // dev's hooks and engine, starts the progress thread. Errors: EADDRINUSE/EADDRNOTAVAIL...
  // from the socket, EINVAL for a bad IP, EBUSY if the device already has hooks.
  static Result<std::shared_ptr<Engine>> start(const std::shared_ptr<Device>& dev,
                                               const EngineConfig& cfg);
  // Same with a caller-made port (MemPort in tests); cfg.ip is ignored.
  static Result<std::shared_ptr<Engine>> start_with_port(const std::shared_ptr<Device>& dev,
                                                         std::unique_ptr<wire::Port> port,
                                                         const EngineConfig& cfg);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stops the progress thread and detaches from the device's hooks. Idempotent. After it,
  // posted WQEs stay queued and nothing is received.
  void stop();

  Device& device() { return *dev_; }
  wire::Port& port() { return *port_; }
  const EngineConfig& config() const { return cfg_; }
  // Device-wide counters (sum over QPs, plus drops before a QP is known).
  Counters& counters() { return ctr_; }
  StashPool& stash_pool() { return stash_; }
  // Optional fault engine whose held/injected packets must be drained after port I/O
  // (wire::HeldPacketSource; emu/fault/fault.h implements it). Not owned. It may come and go
  // while traffic runs (DeviceServices attaches it only while a rule, a held packet or a
  // capture wants it: attached, it turns off the busy-poll hand-off and the receive spin);
  // detach it only when it holds no packet.
  // A fault engine needs the progress thread's epoll loop (held packets): polls stop taking
  // receive (on_poll_empty), and what they hold now goes back.
  void set_fault_engine(wire::HeldPacketSource* f) {
    fault_.store(f, std::memory_order_release);
    if (f != nullptr) hand_back_rx(true);
  }
  bool fault_engine_attached() const { return fault_.load(std::memory_order_acquire) != nullptr; }
  // Whether outgoing packets may be merged into UDP GSO datagrams.
  bool gso() const { return gso_; }
  // The one-copy link table (nullptr: EngineConfig::one_copy off, or it could not listen).
  OneCopy* one_copy() const { return oc_.get(); }

  // ---- QP1 (GSI, emu/transport/gsi.h) ----
  // Registers the one handler of QP1's received MADs. EBUSY if one is set.
  Status set_gsi_handler(GsiHandler* h);
  // Removes h (no-op if it is not the handler). On return no call to h is running or will
  // start (takes the receive lock: never call it from the receive context).
  void clear_gsi_handler(GsiHandler* h);
  GsiHandler* gsi_handler() const { return gsi_.load(std::memory_order_acquire); }
  // Sends payload (a MAD) as one UD SEND_ONLY from QP1: P_Key pkey, DestQP dest_qpn, DETH
  // Q_Key 0x80010000, SrcQP 1, PSN = QP1's send counter, to dst. Any thread except the
  // receive context. EINVAL: payload larger than the path MTU allows (4096).
  Status send_gsi(const wire::Endpoint& dst, uint32_t dest_qpn, uint16_t pkey,
                  std::span<const uint8_t> payload);

  // ---- manual driving (tests; also used by the progress thread) ----
  // Drains the port until it is empty or `budget` datagrams were handled; blocks on the
  // receive lock. Returns datagrams handled.
  int poll_rx(int budget = 1 << 30);
  // Like poll_rx but gives up at once if another thread is receiving.
  int try_poll_rx(int budget = 1 << 30);
  // Runs every retransmit / RNR timer due at `now_ns` (CLOCK_MONOTONIC). Tests pass a time
  // far in the future to fire armed timers deterministically.
  void run_timers(uint64_t now_ns);
  // Earliest armed deadline (ns) over the QPs with a timer entry, 0 if none.
  uint64_t next_deadline_ns();
  // Before a requester run's first packet (req.cc): the ACK qp's responder owes goes first
  // (EngineConfig::ack_hold_ns; engine.cc). now_ns: a clock reading where holds_acks(qp).
  // REQUIRES: qp's send lock.
  void take_ack(Qp& qp, TxBatch& tx, uint64_t now_ns);
  // Whether qp's responder may hold an ACK for a post: RC, with ack_hold_ns.
  bool holds_acks(const Qp& qp) const {
    return cfg_.ack_hold_ns != 0 && qp.type() == QpType::kRc;
  }
  // An application thread left the data path (a CM call, a wait for a completion event):
  // the ACKs held for a post (EngineConfig::ack_hold_ns) go now, every QP's (a hold bets on
  // the next post of the process, not of one thread), instead of when the progress thread's
  // timer wakes it. Where every core is busy that wake-up came 1-10 ms late, and the peer's
  // send completion waited for it (perftest -R: the peer's second rdma_listen came after
  // this side's connect, docs/progress.md). Waits for a batch in progress on another thread;
  // from inside this thread's own drain, that drain's end sends them.
  void release_held_acks_now();
  // An application thread leaves the data path (it will sleep, or waits for a completion
  // event: req_notify, get_cq_event, a CM call): the progress thread takes receive and the
  // timers back at once (busy_poll_ns), and the held ACKs go (release_held_acks_now).
  void left_data_path();
  // In the receive context, for the batch in progress: an ACK completed the last WQE of a QP
  // in a ping-pong (ReqState::answers), so the peer's next request comes right behind it (in
  // the same sendmmsg when the peer's post carried the ACK). An application thread's drain
  // (poll_cq) that finds the socket empty then looks again for up to linger_ns instead of
  // returning: ib_write_lat leaves poll_cq with its send completion and waits on memory, and
  // the request it waits for would otherwise be the progress thread's (a wake-up, and its
  // ACK goes alone).
  void linger_rx(const Qp& qp) {
    if (cfg_.linger_ns != 0) linger_qp_ = &qp;
  }
  // In the receive context: an ACK or response completed the last WQE of qp. If no request
  // of the peer for qp came by the drain's end, the poll that returns a completion next
  // hands receive back to the progress thread (on_poll_hit, hand_back_rx): the application
  // may now wait for the answer by other means than polling (ib_write_lat waits on memory).
  void sq_drained(const Qp& qp) { idle_qp_ = &qp; }
  // A request packet for qp came in this batch. The last packet of a message ends a linger
  // for qp (the answer is here); an earlier one (a multi-packet answer, ib_write_lat 64 KiB)
  // gives the rest of it a new window.
  void answer_came(const Qp& qp, bool ends_message) {
    if (ends_message) {  // a whole answer is in
      if (idle_qp_ == &qp) idle_qp_ = nullptr;
      const Qp* q = &qp;
      if (idle_pending_.load(std::memory_order_relaxed) == q)
        idle_pending_.compare_exchange_strong(q, nullptr, std::memory_order_relaxed);
    }
    if (linger_qp_ != &qp) return;
    if (ends_message) {
      linger_qp_ = nullptr;
    } else {
      linger_more_ = true;
    }
  }
  // The clock for a received packet's steps: the reading this thread's drain of this engine
  // shares for its batch (taken at its first use), else a fresh one.
  uint64_t rx_now();
  // The ScatterCache of the engine whose receive drain this thread is in (scatter_sges), or
  // null outside one.
  static ScatterCache* drain_scatter_cache();
  // The QP a received packet names (Device::find_qp), through a small cache of the receive
  // context's recent lookups: a hit costs one load of the QP table's generation, where the
  // table's shared lock took two atomic read-modify-writes per packet. A hit is a QP still
  // in the table (no erase since it was found). REQUIRES: rx_mu_ held (recv_packet).
  std::shared_ptr<Qp> rx_find_qp(uint32_t qpn);
  // When the timerfd is armed to fire (ns), ~0 if not armed (tests, diagnostics).
  uint64_t timerfd_deadline_ns() const { return armed_ns_.load(std::memory_order_acquire); }
  // Whether the kernel's timerfd will wake the progress thread (timerfd_gettime; tests).
  bool timerfd_programmed() const;

  // ---- TransportHooks ----
  void on_post_send(Qp& qp) override;
  void on_post_recv(Qp& qp) override;
  void on_post_srq_recv(Srq& srq) override;
  void on_modify(Qp& qp, QpState from, QpState to) override;
  void on_before_destroy(Qp& qp) override;
  void on_destroy(Qp& qp) override;
  void on_after_destroy(Qp& qp) override;
  void on_app_post(bool recv_wr = false) override;
  // Datagrams an application's receive takes at most: an empty poll's or a post_send's, and
  // a post_recv's (a few, not a backlog: on_app_post).
  static constexpr int kAppRxBudget = 64;
  static constexpr int kPostRecvRxBudget = 4;
  void on_app_enter() override;
  void on_poll_empty(Cq& cq) override;
  void on_poll_hit(Cq& cq) override;
  // CQ event moderation periods: timed with the QP timers (run_timers ticks the CQ).
  bool on_cq_deadline(Cq& cq, uint64_t deadline_ns) override;
  // Joins / leaves the IP group of a multicast GID on the port (wire::Port::join_group).
  int on_mcast_group(const uint8_t (&mgid)[16], uint8_t sgid_index, bool join) override;

  // ---- used by req/comp/resp/recv (same library) ----
  // Ask for a timer wake-up at deadline_ns (no-op if an earlier one is armed).
  void arm_timer(uint64_t deadline_ns);
  // Ask for comp_on_timer(qp) at deadline_ns: queues qp in the timer heap (no-op if it has an
  // entry at or before deadline_ns) and arms the wake-up. REQUIRES: qp's send lock held.
  void arm_timer(Qp& qp, uint64_t deadline_ns);
  // Sends a batch the caller built (counts send errors).
  void flush(TxBatch& b) {
    if (b.size() > 0) b.flush(*port_, ctr_);
    if (fault_.load(std::memory_order_acquire) != nullptr) drain_fault_tx();
  }
  // The receive context's batch (REQUIRES: rx_mu_ held, i.e. inside poll_rx).
  TxBatch& rx_batch() { return *rx_tx_; }
  // The receive batch being handled found the port's queue at or above rx_mark_pct: its
  // requests count as CE-marked (REQUIRES: rx_mu_ held).
  bool rx_marking() const { return rx_marking_; }
  // EngineConfig::window_share: the share of the window of a QP towards `dst` whose window
  // filled now; counts it once per epoch (*counted_epoch: the last it was counted in,
  // UINT64_MAX never). REQUIRES: the QP's send lock (for *counted_epoch); the counts are
  // atomics.
  uint32_t window_share(const wire::Endpoint& dst, uint64_t* counted_epoch, uint64_t now_ns);
  static constexpr uint32_t kShareFloorPsns = 32;
  // The calling thread's batch, GSO set up for this engine's port.
  TxBatch& tx_batch() {
    TxBatch& b = tx_batch_for_thread();
    b.set_gso(gso_ ? port_->max_gso_segments() : 1);
    return b;
  }
  uint16_t local_udp_port() const { return port_->local().port; }
  // The local address a datagram to dst leaves from (dst.src_index = the SGID index): the
  // source the ICRC and the UD GRH image are computed with.
  const wire::Endpoint& local_for(const wire::Endpoint& dst) const { return port_->local_for(dst); }
  // Responder ACK coalescing: remember qp until the end of this receive batch. false if the
  // list is full (the caller sends the ACK at once). REQUIRES: receive context.
  bool defer_ack(Qp& qp) {
    if (ack_qps_.size() >= kMaxDeferredAcks) return false;
    ack_qps_.push_back(qp.shared_from_this());
    return true;
  }
  // Duplicate READ replay in slices (resp.cc): remember qp so that each further receive
  // round sends its next slice (round-robin with other QPs, interleaved with receiving).
  // false if the list is full (the caller finishes the replay at once). REQUIRES: receive
  // context.
  bool list_replay(Qp& qp) {
    if (replay_qps_.size() >= kMaxDeferredAcks) return false;
    replay_qps_.push_back(qp.shared_from_this());
    return true;
  }

 private:
  Engine(Device* dev, std::unique_ptr<wire::Port> port, const EngineConfig& cfg);
  Status init();
  void progress_loop();
  bool defer_post(Qp& qp) const;      // REQUIRES: qp's send lock
  int drain_locked(int budget);
  void drain_fault_rx_locked();
  void drain_fault_tx();
  bool watch_rx(bool on);  // false: epoll_ctl failed (logged)
  // The busy-poll hand-off may run: configured, a progress thread to hand back to, no fault
  // engine (capture and faults keep receive with the progress thread), not stopping.
  bool busy_poll_allowed() const {
    return cfg_.busy_poll_ns != 0 && cfg_.progress_thread && port_->wait_fd() >= 0 &&
           fault_.load(std::memory_order_relaxed) == nullptr &&
           !stopping_.load(std::memory_order_relaxed);
  }
  // `then` is within the busy-poll gap of `now` (signed: another thread's later stamp may be
  // in `then`): calls that close together are back to back.
  bool within_gap(uint64_t now, uint64_t then) const {
    return static_cast<int64_t>(now - then) <= static_cast<int64_t>(cfg_.busy_poll_gap_ns);
  }
  // The polls' lease: busy_poll_ns, at least two poll gaps (a shorter one would run out
  // between polls that still count as back to back).
  uint64_t lease_ns() const {
    return std::max<uint64_t>(cfg_.busy_poll_ns, 2 * uint64_t{cfg_.busy_poll_gap_ns});
  }
  void arm_defer(uint64_t deadline_ns);
  // The polls' lease runs until now + lease_ns() (renewed once half of it is gone).
  void renew_lease(uint64_t now_ns);
  // An application thread's post counts for the hand-off (on_app_enter, on_app_post): the
  // application's polls hold receive, so the progress thread is parked. Not the progress
  // thread's own posts.
  bool app_post_counts() const;
  // The application's last call was at now_ns (a post's start, a receive's end), in its
  // loop: the stamp the gap is measured from, and the lease renewed from it.
  void stamp_call(uint64_t now_ns) {
    last_app_call_ns_.store(now_ns, std::memory_order_relaxed);
    renew_lease(now_ns);
  }
  // What an empty poll does for the application: receive (try-lock), and, when its polls
  // hold receive (`owned`), the timers that fell due while they are parked. `in_loop`: the
  // call came within the gap of the last stamp (on_poll_empty, on_app_post); its receive's
  // end is then the application's last call. `budget`: datagrams at most.
  void receive_for_app(bool owned, uint64_t now_ns, bool in_loop, int budget = kAppRxBudget);

  void spin_rx();
  bool spare_core(uint64_t now);  // may spin_rx run (progress thread only)
  static constexpr uint64_t kSpareCoreCheckNs = 10'000'000;

  Device* dev_;  // the device owns the engine (Device::set_engine) and outlives it
  std::unique_ptr<wire::Port> port_;
  EngineConfig cfg_;
  std::unique_ptr<OneCopy> oc_;
  Counters ctr_;
  std::atomic<wire::HeldPacketSource*> fault_{nullptr};
  std::atomic<GsiHandler*> gsi_{nullptr};
  std::atomic<uint32_t> gsi_psn_{0};
  bool gso_ = true;

  // receive context
  StashPool stash_;
  std::mutex rx_mu_;
  static constexpr int kRxBatch = 32;
  static constexpr uint32_t kRxBufBytes = 65536;  // a GRO buffer holds many datagrams
  std::unique_ptr<uint8_t[]> rx_mem_;
  wire::RxDesc rx_descs_[kRxBatch];
  ScatterCache rx_scatter_;  // the batch's scatter checks (drain_locked, under rx_mu_)
  // rx_find_qp's cache (rx_mu_), direct-mapped by the QPN's low bits (QPNs are random).
  // All of it is dropped when the QP table's generation moves (at the next packet), and by
  // on_after_destroy: a destroyed QP is let go when destroy_qp returns, even on an engine
  // that receives nothing more (its CQs, and their moderation timers, go with it).
  struct RxQpSlot {
    uint32_t qpn = 0;
    std::shared_ptr<Qp> qp;
  };
  static constexpr uint32_t kRxQpSlots = 16;
  RxQpSlot rx_qps_[kRxQpSlots];
  uint64_t rx_qps_gen_ = 0;
  std::unique_ptr<TxBatch> rx_tx_;
  static constexpr size_t kMaxDeferredAcks = 256;
  std::vector<std::shared_ptr<Qp>> ack_qps_;  // capacity reserved once
  // now_cache: one clock reading shared by a drain's calls (0 = not read yet), or null.
  void flush_acks_locked(uint64_t* now_cache = nullptr);
  // QPs with an ACK held for a post (EngineConfig::ack_hold_ns; rx_mu_), each until its
  // RespState::ack_hold_until_ns; held_deadline_ns_ is the earliest of those (0: none held;
  // read by run_timers without rx_mu_), on the timerfd.
  std::vector<std::shared_ptr<Qp>> held_acks_;  // capacity reserved once
  std::atomic<uint64_t> held_deadline_ns_{0};
  // release_held_acks_now from inside this thread's drain (rx_mu_ held by the caller).
  bool release_held_now_ = false;  // rx_mu_ (set by its holder, from inside its drain)
  // Held ACKs due at now_ns (~0: all), or with `only` that QP's alone (destroy).
  void release_held_acks_locked(uint64_t now_ns, const Qp* only = nullptr);
  // run_timers: takes rx_mu_; try_only: only if free (a kept lease's look, progress_loop).
  void release_held_acks(uint64_t now_ns, bool try_only = false);
  std::vector<std::shared_ptr<Qp>> replay_qps_;  // QPs with a READ replay in progress
  std::vector<std::shared_ptr<Qp>> replay_scan_;
  void run_replays_locked();

  // timers
  std::mutex timer_mu_;  // leaf lock (taken under a QP's send lock)
  std::atomic<uint64_t> armed_ns_{~uint64_t{0}};
  void arm_locked(uint64_t deadline_ns);  // REQUIRES: timer_mu_
  struct TimerEntry {
    uint64_t at;
    std::weak_ptr<Qp> qp;
  };
  static bool timer_later(const TimerEntry& a, const TimerEntry& b) { return a.at > b.at; }
  std::vector<TimerEntry> heap_;           // min-heap on `at` (std::push_heap, timer_later)
  std::vector<std::shared_ptr<Qp>> due_;   // run_timers scratch (capacity kept)
  int timer_fd_ = -1;
  int event_fd_ = -1;
  int epoll_fd_ = -1;

  // busy-poll hand-off (EngineConfig::busy_poll_ns)
  int defer_fd_ = -1;                         // timerfd: the polls' lease ends (lease_end_ns_)
  std::atomic<bool> rx_watched_{true};        // socket in the epoll set (changes: watch_mu_)
  std::mutex watch_mu_;                       // leaf: a change of rx_watched_ and its epoll_ctl
  // False: it was so already, or epoll_ctl failed (watch_rx).
  bool set_rx_watched(bool on);
  const Qp* linger_qp_ = nullptr;             // rx_mu_: linger_rx() in this batch, for it
  bool linger_more_ = false;                  // rx_mu_: part of its answer came (answer_came)
  bool rx_marking_ = false;                   // rx_mu_: rx_marking()
  // window_share: per destination bucket (a hash of its address; two destinations in one
  // bucket share as one), the QPs counted in the current and the last epoch, each slot
  // (epoch << kShareCountBits) | count.
  static constexpr uint32_t kShareBuckets = 64;
  static constexpr int kShareCountBits = 20;
  std::atomic<uint64_t> share_slots_[kShareBuckets][2] = {};
  // rx_mu_: the last look at the port's fill (EngineConfig::rx_mark_pct): its verdict, and
  // when the next full batch may look again.
  static constexpr uint64_t kFillLookNs = 20'000;
  bool fill_over_ = false;
  uint64_t fill_next_look_ns_ = 0;
  const Qp* idle_qp_ = nullptr;               // rx_mu_: sq_drained() in this drain, no answer yet
  std::atomic<const Qp*> idle_pending_{nullptr};  // ... at a drain's end (compared, never used)
  std::atomic<uint64_t> lease_end_ns_{0};     // the polls hold receive until then (renewed)
  // The thread (kernel tid) whose call last renewed the lease: at its end, the progress
  // thread asks the scheduler whether that thread was waiting for a CPU (lease_holder_waits).
  std::atomic<int32_t> lease_tid_{0};
  // At the lease's end (progress thread only): true when the lease is kept, to be looked at
  // again (re-armed here): an application thread is inside a call of ours
  // (app_call_since_ns_), or the thread that renewed the lease last is runnable and gained
  // less than 2 poll gaps of CPU time since the last look (4 gaps before: it waits for a
  // CPU, preempted; its calls did not stop, the scheduler stopped them). For at most 4
  // leases in a row. False (receive goes back): that thread sleeps outside our calls (at
  // once, without a second look), ran without a call, or is gone.
  bool lease_holder_waits(uint64_t now_ns, uint64_t lease_end_ns);
  struct LeaseProbe {           // progress thread only
    int fd = -1;                // /proc/self/task/<tid>/stat
    int32_t tid = 0;
    bool looked = false;        // cpu_ns holds tid's CPU time at this probation's last look
    uint64_t lease_end_ns = 0;  // the run-out lease this probation is for
    uint64_t since_ns = 0;      // when it began (0: none)
    uint64_t cpu_ns = 0;
  } probe_;
  // An application thread's call that can outlast the lease began then (0: none in): an
  // empty poll's or a post's receive (receive_for_app), a post_send while the polls hold
  // receive (on_app_enter .. on_app_post). One word for all threads: a heuristic for
  // lease_holder_waits, which bounds what it believes.
  std::atomic<uint64_t> app_call_since_ns_{0};
  // The application was last seen in the library then: an empty poll's start (whenever busy
  // polling is allowed), and, while its polls hold receive, a post's end (on_app_post), the
  // start of a post_send that came within the gap (on_app_enter), and the end of a receive
  // that got datagrams in a call within the gap (receive_for_app). The busy-poll gap is
  // measured from it, so a long call (a drain of megabytes, a requester run, a wait for a
  // send lock) is not a gap. 0: the application left the data path (left_data_path).
  std::atomic<uint64_t> last_app_call_ns_{0};
  // Late empty polls while the polls held receive, in the lease-long window that began at
  // late_window_ns_ (busy_poll_late_polls).
  std::atomic<uint32_t> late_polls_{0};
  std::atomic<uint64_t> late_window_ns_{0};
  // The last receive done by an application's empty poll, or by a post (on_app_post).
  std::atomic<uint64_t> last_app_rx_ns_{0};
  // run_timers runs on one thread at a time: the progress thread's (blocking), a polling
  // application's while it holds receive (try_lock: on_poll_empty, on_app_post).
  std::mutex run_timers_mu_;
  void run_timers_locked(uint64_t now_ns);  // REQUIRES: run_timers_mu_
  // The progress thread watches the socket again, now (an application thread left the data
  // path, or a poll returned a completion that left its QP idle: on_poll_hit). rearm:
  // program the parked timerfd now (else only a held ACK's deadline is; the progress thread
  // programs the rest when it next wakes, at the latest at the lease's end).
  void hand_back_rx(bool rearm);
  // The polls took receive: the timerfd is disarmed (they run the timers: arm_locked).
  void park_timerfd();
  void program_parked_timer();  // the timerfd at armed_ns_ if that is earlier than programmed
  uint64_t programmed_ns_ = ~uint64_t{0};   // timer_mu_: the timerfd's deadline (~0: none)
  // spare_core (progress thread only): /proc/loadavg, the CPUs we may use, the last answer.
  int loadavg_fd_ = -1;
  long ncpus_ = 1;
  uint64_t spare_checked_ns_ = 0;
  bool spare_core_ = false;

  // CQs with a moderation period running (weak: the device owns CQs); leaf lock.
  std::mutex cqs_mu_;
  std::vector<std::weak_ptr<Cq>> mod_cqs_;

  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::mutex stop_mu_;
};

}  // namespace rnic::emu
