// emu/transport/engine.cc: engine start/stop, the progress thread (epoll: port fd, timerfd, eventfd),
// the receive drain, timers, and the TransportHooks glue to req/comp/resp/recv.
#include "emu/transport/engine.h"
#include "emu/transport/window.h"

#include <fcntl.h>
#include <sched.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "emu/transport/comp.h"
#include "emu/objects/cq.h"
#include "emu/transport/recv.h"
#include "emu/transport/req.h"
#include "emu/transport/resp.h"
#include "wire/packet.h"
#include "wire/port.h"
#include "wire/psn.h"
#include "wire/udp_port.h"

namespace rnic::emu {

// ---------------------------------------------------------------- TxBatch

TxBatch::TxBatch() : mem_(new uint8_t[kArenaBytes]) {}

int TxBatch::flush(wire::Port& port, Counters& dev_ctr) {
  int off = 0;
  int stalls = 0;
  while (off < n_) {
    int r = port.send_batch(std::span<const wire::TxDesc>(descs_ + off, n_ - off));
    if (r > 0) {
      off += r;
      stalls = 0;
      continue;
    }
    if ((r == 0 || r == -EAGAIN || r == -ENOBUFS) && ++stalls < 1000) {
      sched_yield();
      continue;
    }
    dev_ctr.add(Ctr::kSendErr, static_cast<uint64_t>(n_ - off));
    break;
  }
  n_ = 0;
  used_ = 0;
  run_open_ = false;
  return off;
}

void TxBatch::move_last_to(int pos) {
  const wire::TxDesc last = descs_[n_ - 1];
  for (int i = n_ - 1; i > pos; --i) descs_[i] = descs_[i - 1];
  descs_[pos] = last;
  run_open_ = false;
}

namespace {

// A timerfd set to fire once at deadline_ns (CLOCK_MONOTONIC, absolute). 7 us when the
// deadline falls before the next tick on this VM, 0.3 us after it (docs/progress.md).
void program_timerfd(int fd, uint64_t deadline_ns) {
  itimerspec its{};
  its.it_value.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000);
  its.it_value.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000);
  timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr);
}

// The index of a GRO buffer's last segment when it is an ACK that rode a post as the tail of
// its GSO datagram (req_run, EngineConfig::ack_tail), else 0: an RC ACK, shorter than the
// segments before it, each of them a request to the ACK's QP. Its sender took it before the
// requests, so it is handled first, as if it had come first: a completion of the reply is
// never visible ahead of the ACK of the message it answers (the two are of the QP's two
// directions, so nothing else depends on their order). Only behind requests to its own QP:
// kernel GRO may merge other datagrams of the peer (another QP's requests, READ responses
// that must be handled before a later ACK).
uint32_t ack_tail_index(const wire::RxDesc& d) {
  if (d.seg_size < wire::kBthBytes || d.seg_size >= d.len) return 0;
  const uint32_t nseg = (d.len + d.seg_size - 1) / d.seg_size;
  const uint32_t last = (nseg - 1) * d.seg_size;
  if (d.len - last >= d.seg_size || d.len - last < wire::kBthBytes) return 0;
  const wire::BthT<const uint8_t> ack(d.buf + last);
  if (ack.opcode() != wire::op::kRcAcknowledge) return 0;
  for (uint32_t k = 0; k + 1 < nseg; ++k) {
    const wire::BthT<const uint8_t> req(d.buf + k * d.seg_size);
    if (!(wire::opcode_info(req.opcode()).mask & wire::kReqMask) ||
        req.dest_qp() != ack.dest_qp())
      return 0;
  }
  return nseg - 1;
}

}  // namespace

// True on an engine's progress thread (set once there).
thread_local bool t_progress_thread = false;
// The engine whose receive batch this thread is running (drain_locked; rx_mu_ held).
thread_local Engine* t_drain_engine = nullptr;
// drain_locked's batch reading, for t_drain_engine's packets (Engine::rx_now).
thread_local uint64_t* t_drain_clock = nullptr;

TxBatch& tx_batch_for_thread() {
  thread_local TxBatch batch;
  return batch;
}

wire::Endpoint peer_endpoint(const Av& av, uint16_t udp_port) {
  wire::Endpoint e;
  if (av.ipv4) {
    e = wire::Endpoint::v4(av.dest_ipv4, udp_port);
  } else {
    e.ipv6 = true;
    std::memcpy(e.addr, av.dgid, 16);
    e.port = udp_port;
    e.tclass = av.traffic_class;
    e.hop_limit = av.hop_limit;
    e.flow_label = av.flow_label & 0xfffffu;
    e.scope_id = av.scope_id;
  }
  e.src_index = av.sgid_index;
  return e;
}

// ---------------------------------------------------------------- start / stop

Engine::Engine(Device* dev, std::unique_ptr<wire::Port> port, const EngineConfig& cfg)
    : dev_(dev), port_(std::move(port)), cfg_(cfg), gso_(cfg.gso) {}

Result<std::shared_ptr<Engine>> Engine::start(const std::shared_ptr<Device>& dev,
                                              const EngineConfig& cfg) {
  if (!dev) return Errc::kInval;
  const std::string& ip = cfg.ip.empty() ? dev->config().ip : cfg.ip;
  auto ep = wire::Endpoint::parse(ip, cfg.udp_port);
  if (!ep) return Errc::kInval;
  wire::UdpPortOptions o;
  o.bind = *ep;
  o.rcvbuf = cfg.rcvbuf;
  o.sndbuf = cfg.sndbuf;
  o.gso = cfg.gso;
  o.gro = cfg.gro;
  if (cfg.ip.empty()) {
    // One socket per further GID (index i -> socket i), so the GID a packet is sent from is
    // its source address and a peer may address any GID (wire.md §5).
    for (size_t i = 1; i < dev->gids().size(); ++i) {
      wire::Endpoint b = dev->gids()[i].addr;
      b.port = cfg.udp_port;
      o.more.push_back(b);
    }
  }
  int err = 0;
  std::unique_ptr<wire::UdpPort> port = wire::UdpPort::open(o, &err);
  if (!port && !o.more.empty()) {
    // An address that cannot be bound (another device on this host holds it, a tentative IPv6
    // address still in DAD, ...): run on the primary address alone and list only GID 0.
    RNIC_LOG(kWarn, "cannot bind UDP %u on every GID of %s (%s): only on %s", cfg.udp_port,
             dev->name().c_str(), std::strerror(err), ep->ip_string().c_str());
    o.more.clear();
    port = wire::UdpPort::open(o, &err);
    if (port) dev->truncate_gids(1);
  }
  if (!port) return static_cast<Errc>(err != 0 ? err : EIO);
  return start_with_port(dev, std::move(port), cfg);
}

Result<std::shared_ptr<Engine>> Engine::start_with_port(const std::shared_ptr<Device>& dev,
                                                        std::unique_ptr<wire::Port> port,
                                                        const EngineConfig& cfg) {
  if (!dev || !port) return Errc::kInval;
  if (dev->hooks() != nullptr) return Errc::kBusy;
  std::shared_ptr<Engine> e(new Engine(dev.get(), std::move(port), cfg));
  Status st = e->init();
  if (!st) return st;
  dev->set_hooks(e.get());
  dev->set_engine(e);
  if (cfg.progress_thread) e->thread_ = std::thread([p = e.get()] { p->progress_loop(); });
  return e;
}

Status Engine::init() {
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  defer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0 || event_fd_ < 0 || epoll_fd_ < 0 || defer_fd_ < 0)
    return static_cast<Errc>(errno);
  auto add = [&](int fd) {
    if (fd < 0) return true;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
  };
  if (!add(port_->wait_fd()) || !add(port_->group_wait_fd()) || !add(timer_fd_) ||
      !add(event_fd_) || !add(defer_fd_))
    return static_cast<Errc>(errno);
  rx_mem_.reset(new uint8_t[static_cast<size_t>(kRxBatch) * kRxBufBytes]);
  for (int i = 0; i < kRxBatch; ++i) {
    rx_descs_[i].buf = rx_mem_.get() + static_cast<size_t>(i) * kRxBufBytes;
    rx_descs_[i].cap = kRxBufBytes;
  }
  rx_tx_ = std::make_unique<TxBatch>();
  rx_tx_->set_gso(gso_ ? port_->max_gso_segments() : 1);
  if (cfg_.one_copy) {
    std::string err;
    oc_ = OneCopy::open(port_->local(), &err);
    if (!oc_) RNIC_LOG(kWarn, "%s: payloads go by value", err.c_str());
    if (oc_ && !add(oc_->wait_fd())) return static_cast<Errc>(errno);
  }
  ack_qps_.reserve(kMaxDeferredAcks);
  held_acks_.reserve(kMaxDeferredAcks);
  replay_qps_.reserve(kMaxDeferredAcks);
  replay_scan_.reserve(kMaxDeferredAcks);
  due_.reserve(64);
  if (cfg_.spin_ns != 0) {
    loadavg_fd_ = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    cpu_set_t set;
    CPU_ZERO(&set);
    ncpus_ = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  return Status::ok();
}

void Engine::stop() {
  std::lock_guard lk(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t w = write(event_fd_, &one, sizeof(one));
    (void)w;
    thread_.join();
  }
  {
    // ACKs still held for a post go now: an application that closes the device right after
    // its last completion must not take the peer's last ACK with it.
    std::lock_guard rl(rx_mu_);
    if (rx_tx_) {
      flush_acks_locked();
      release_held_acks_locked(~uint64_t{0});
      flush(*rx_tx_);
    }
  }
  if (dev_->hooks() == this) dev_->set_hooks(nullptr);
}

Engine::~Engine() {
  stop();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (timer_fd_ >= 0) close(timer_fd_);
  if (event_fd_ >= 0) close(event_fd_);
  if (defer_fd_ >= 0) close(defer_fd_);
  if (probe_.fd >= 0) close(probe_.fd);
  if (loadavg_fd_ >= 0) close(loadavg_fd_);
}

// ---------------------------------------------------------------- progress thread

void Engine::progress_loop() {
  // The busy-poll re-check is a short timer: do not let the default 50 us slack stretch it.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  pthread_setname_np(pthread_self(), "softrnic-prog");  // top -H, perf sched
  t_progress_thread = true;
  epoll_event evs[5];
  while (!stopping_.load(std::memory_order_acquire)) {
    // Packets held by the fault layer need a wake-up of their own.
    int timeout_ms = -1;
    uint64_t held = port_->next_held_deadline_ns();
    if (wire::HeldPacketSource* fe = fault_.load(std::memory_order_acquire)) {
      uint64_t f = fe->next_deadline_ns();
      if (f != 0 && (held == 0 || f < held)) held = f;
    }
    if (held != 0) {
      uint64_t now = wire::monotonic_ns();
      timeout_ms = held <= now ? 0
                               : static_cast<int>(
                                     std::min<uint64_t>((held - now) / 1'000'000 + 1, 1000));
    }
    int n = epoll_wait(epoll_fd_, evs, 5, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    bool rx = false, timer = false, defer = false;
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (oc_ && fd == oc_->wait_fd()) {
        // A peer linked, shared or forgot memory, or went away: its mappings go with it.
        std::lock_guard lk(rx_mu_);
        oc_->service();
      } else if (fd == event_fd_) {
        uint64_t v;
        ssize_t r = read(event_fd_, &v, sizeof(v));
        (void)r;
      } else if (fd == timer_fd_) {
        uint64_t v;
        ssize_t r = read(timer_fd_, &v, sizeof(v));
        (void)r;
        timer = true;
      } else if (fd == defer_fd_) {
        uint64_t v;
        ssize_t r = read(defer_fd_, &v, sizeof(v));
        (void)r;
        defer = true;
      } else {
        rx = true;
      }
    }
    if (stopping_.load(std::memory_order_acquire)) break;
    if (held != 0) {
      port_->release_held();
      if (fault_.load(std::memory_order_acquire) != nullptr) drain_fault_tx();
      rx = true;
    }
    if (defer) {
      // The polls' lease (on_poll_empty renews it, without waking us, while they go on).
      // Renewed meanwhile: sleep on (re-armed whoever holds receive: two polling threads'
      // renewals may have armed an earlier end last). Ran out while the polls held receive:
      // the application stopped polling without a word (it waits on memory, or computes);
      // watch the socket again (level-triggered: anything that arrived meanwhile wakes us at
      // once), drain it now. Either way run the timers that fell due while parked (run_timers
      // re-arms the timerfd through arm_locked once receive is ours).
      // A run-out lease is kept while an application thread is inside a call of ours or the
      // thread that renewed it waits for a CPU (lease_holder_waits). Then the timers stay
      // parked for the polls that come back: a retransmit timer run now, with its ACK unread
      // in the parked socket, would resend for nothing. Only held ACKs that fell due go
      // (the peer probes after 200 us), unless a receive in progress holds the lock: its
      // batch's end sends them.
      const uint64_t lease = lease_end_ns_.load(std::memory_order_acquire);
      const uint64_t now = wire::monotonic_ns();
      bool kept = false;
      if (now < lease) {
        arm_defer(lease);
      } else if (!rx_watched_.load(std::memory_order_acquire) && lease_holder_waits(now, lease)) {
        ctr_.add(Ctr::kBusyPollLeaseKept);
        kept = true;
        const uint64_t h = held_deadline_ns_.load(std::memory_order_acquire);
        if (h != 0 && h <= now) release_held_acks(now, /*try_only=*/true);
      } else if (const uint64_t again = lease_end_ns_.load(std::memory_order_acquire);
                 again != lease && wire::monotonic_ns() < again) {
        arm_defer(again);  // renewed while lease_holder_waits looked: sleep on
      } else if (!rx_watched_.load(std::memory_order_acquire)) {
        if (set_rx_watched(true)) {
          ctr_.add(Ctr::kBusyPollLeaseEnded);
        } else if (!rx_watched_.load(std::memory_order_acquire)) {
          // The socket could not go back into the epoll set (watch_rx): look again at the
          // next lease end, draining now and then, rather than never.
          const uint64_t again = wire::monotonic_ns() + lease_ns();
          lease_end_ns_.store(again, std::memory_order_release);
          arm_defer(again);
        }
        rx = true;
      }
      if (!kept) timer = true;
    }
    int got = 0;
    if (rx) {
      // An application thread draining inline (poll_cq) usually holds the receive lock when
      // a packet wakes us, and takes that packet itself. Blocking on the lock at once cost a
      // futex sleep here and a futex wake in its unlock on every packet of a ping-pong
      // (ib_send_lat typical 26-35 us; 13 us with the yield, docs/progress.md). So yield
      // first; only a holder still busy after that is waited for.
      std::unique_lock lk(rx_mu_, std::try_to_lock);
      if (!lk.owns_lock()) {
        sched_yield();
        lk.lock();
      }
      got = drain_locked(256);
    }
    if (timer) run_timers(wire::monotonic_ns());
    // Timers parked while an application's polls held receive, then handed back without
    // programming the timerfd (hand_back_rx): program it now, on this thread's time.
    if (rx_watched_.load(std::memory_order_acquire)) program_parked_timer();
    if (got > 0 && cfg_.spin_ns != 0 && spare_core(wire::monotonic_ns())) spin_rx();
  }
  set_rx_watched(true);
}

// Polls the port until cfg_.spin_ns passed without a datagram (or a stop, or a fault engine
// that needs the epoll loop's held-packet wake-ups). Timers that fall due meanwhile run here;
// their timerfd still fires later and finds nothing due. The CPU is yielded between empty
// polls.
void Engine::spin_rx() {
  uint64_t last = wire::monotonic_ns();
  while (!stopping_.load(std::memory_order_acquire)) {
    if (fault_.load(std::memory_order_acquire) != nullptr || port_->held_count() != 0) return;
    // An application's polls took receive (on_poll_empty): spinning would take it back.
    if (!rx_watched_.load(std::memory_order_relaxed)) return;
    const int n = try_poll_rx(256);
    const uint64_t now = wire::monotonic_ns();
    // The core must stay spare for the whole spin, not only at its start: a ping-pong keeps
    // the spin alive (every packet renews it), so a spin begun while the applications were
    // still setting up would otherwise outlast the spare core by the whole run.
    if (!spare_core(now)) return;
    if (n > 0) {
      last = now;
    } else if (now - last >= cfg_.spin_ns) {
      return;
    } else {
      sched_yield();
    }
    if (armed_ns_.load(std::memory_order_acquire) <= now) run_timers(now);
  }
}

// A spin is only free on a core nobody else wants. Where threads outnumber cores it takes
// one from the application: two ib_write_lat processes waiting on memory on 2 cores, with a
// progress thread spinning after each packet, have one core left between them and each
// runs a scheduler slice at a time (64 B typical 2,000 us, where progress threads asleep in
// epoll give 30 us; docs/progress.md). Yielding does not help: the spinners yield to each
// other. So the progress thread spins only while the machine's runnable threads (the 4th
// field of /proc/loadavg, this thread included) fit in the CPUs this process may use,
// looked at most every kSpareCoreCheckNs.
bool Engine::spare_core(uint64_t now) {
  if (now - spare_checked_ns_ < kSpareCoreCheckNs) return spare_core_;
  spare_checked_ns_ = now;
  spare_core_ = false;
  if (loadavg_fd_ < 0) return false;
  char buf[128];
  const ssize_t n = pread(loadavg_fd_, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return false;
  buf[n] = 0;
  // "0.20 0.18 0.12 1/80 11206": the running count is before the '/'.
  const char* slash = std::strchr(buf, '/');
  if (slash == nullptr) return false;
  const char* p = slash;
  while (p > buf && p[-1] >= '0' && p[-1] <= '9') --p;
  if (p == slash) return false;
  const long runnable = std::strtol(p, nullptr, 10);
  spare_core_ = runnable <= ncpus_;
  if (!spare_core_) ctr_.add(Ctr::kSpinSkipped);
  return spare_core_;
}

// Only the unicast sockets change hands: the multicast groups' stay with the progress thread
// (a group datagram wakes it, and its drain takes whatever is in; receive is under rx_mu_
// either way). The socket leaves the epoll set rather than staying in it with no events: a
// member's wake-up callback runs on every datagram the peer's sendmmsg delivers, whatever
// its events, and cost ~0.2 us of each one-way trip here (a two-process UDP ping-pong:
// 3.17 us one way with the socket in an epoll set with no events, 2.95 without it). A
// DEL and ADD pair costs 0.83 us against 0.39 for two MODs, and a take and its hand-back
// come once per ping-pong phase, not per packet (ib_read_lat's client: none, sq_drained).
// ADD of a readable socket wakes the progress thread at once (level-triggered).
bool Engine::watch_rx(bool on) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = port_->wait_fd();
  if (epoll_ctl(epoll_fd_, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, port_->wait_fd(), &ev) == 0)
    return true;
  const int err = errno;
  if (err == (on ? EEXIST : ENOENT)) return true;  // already so
  // ADD allocates (ENOMEM, or ENOSPC past max_user_watches): receive stays with the polls,
  // and the progress thread looks again at every lease end (progress_loop).
  RNIC_LOG(kWarn, "epoll_ctl %s of the receive socket failed: %s", on ? "ADD" : "DEL",
           std::strerror(err));
  return false;
}

int Engine::on_mcast_group(const uint8_t (&mgid)[16], uint8_t sgid_index, bool join) {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  wire::Endpoint g;
  if (std::memcmp(mgid, kMapped, 12) == 0) {
    std::memcpy(g.addr, mgid + 12, 4);
  } else {
    g.ipv6 = true;
    std::memcpy(g.addr, mgid, 16);
  }
  g.port = cfg_.udp_port;
  g.src_index = sgid_index;
  const int r = port_->join_group(g, join);
  if (r == -EEXIST || (!join && r == -ENOENT)) return 0;
  return r < 0 ? -r : 0;
}

void Engine::arm_defer(uint64_t deadline_ns) {
  program_timerfd(defer_fd_, deadline_ns);
}

// ---------------------------------------------------------------- QP1 (GSI)

Status Engine::set_gsi_handler(GsiHandler* h) {
  if (h == nullptr) return Errc::kInval;
  GsiHandler* none = nullptr;
  return gsi_.compare_exchange_strong(none, h, std::memory_order_acq_rel) ? Status::ok()
                                                                          : Status(Errc::kBusy);
}

void Engine::clear_gsi_handler(GsiHandler* h) {
  GsiHandler* cur = h;
  if (!gsi_.compare_exchange_strong(cur, nullptr, std::memory_order_acq_rel)) return;
  std::lock_guard lk(rx_mu_);  // a call that loaded h before the exchange has returned
}

Status Engine::send_gsi(const wire::Endpoint& dst, uint32_t dest_qpn, uint16_t pkey,
                        std::span<const uint8_t> payload) {
  if (payload.size() > 4096) return Errc::kInval;
  wire::PacketFields f;
  f.opcode = wire::op::kUdSendOnly;
  f.pkey = pkey;
  f.dest_qp = dest_qpn & wire::kPsnMask;
  f.psn = gsi_psn_.fetch_add(1, std::memory_order_relaxed) & wire::kPsnMask;
  f.qkey = kGsiQkey;
  f.src_qp = kGsiQpn;
  TxBatch& tx = tx_batch();
  if (tx.full()) flush(tx);
  uint8_t* buf = tx.next();
  const size_t hl = wire::write_roce_headers(buf, f, payload.size());
  if (hl == 0) return Errc::kInval;
  if (!payload.empty()) std::memcpy(buf + hl, payload.data(), payload.size());
  const auto len = static_cast<uint32_t>(wire::roce_len(hl, payload.size()));
  wire::finish_roce(buf, hl, payload.size(),
                    wire::meta_between(port_->local_for(dst), dst, tx.ip_id_for(dst, len)));
  tx.commit(dst, len);
  ctr_.add(Ctr::kSentPkts);
  flush(tx);
  return Status::ok();
}

// ---------------------------------------------------------------- receive

int Engine::poll_rx(int budget) {
  std::lock_guard lk(rx_mu_);
  return drain_locked(budget);
}

int Engine::try_poll_rx(int budget) {
  std::unique_lock lk(rx_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return 0;
  return drain_locked(budget);
}

int Engine::drain_locked(int budget) {
  // t_drain_engine for the batch (take_ack) and the batch's clock (rx_now), restored on the
  // way out.
  uint64_t now_cache = 0;
  struct DrainMark {
    Engine* prev;
    uint64_t* prev_clock;
    DrainMark(Engine* en, uint64_t* clock) : prev(t_drain_engine), prev_clock(t_drain_clock) {
      t_drain_engine = en;
      t_drain_clock = clock;
    }
    ~DrainMark() {
      t_drain_engine = prev;
      t_drain_clock = prev_clock;
    }
  } mark(this, &now_cache);
  // The local checks of a batch's scatters (ScatterCache), let go at each batch's end and on
  // every way out of the drain: a guard kept longer would make a dereg wait for the peer.
  struct ScatterBatch {
    Engine* en;
    void end() {
      if (const uint64_t kept = en->rx_scatter_.reset(); kept != 0)
        en->ctr_.add(Ctr::kScatterKept, kept);
    }
    ~ScatterBatch() { end(); }
  } scatter_batch{this};
  int total = 0;
  rx_tx_->set_gso(gso_ ? port_->max_gso_segments() : 1);  // the batch is empty here
  // Completion events raised by this batch fire only once its ACKs have been sent: an app
  // woken by one (ib_send_lat -e) must not get its reply onto the wire ahead of our ACK.
  CqEventHold events;
  const bool faults = fault_.load(std::memory_order_acquire) != nullptr;
  if (faults) {
    drain_fault_rx_locked();
    scatter_batch.end();
  }
  uint64_t linger_end = 0;
  // The batch's clock (rx_now: an ACK's RTT sample and retransmit timer, flush_acks_locked's
  // holds): read once for a batch and the drain's end after it (three reads a ping-pong
  // message before), again for each later batch (a long drain must not hold ACKs past their
  // deadline on a stale reading).
  linger_qp_ = nullptr;
  linger_more_ = false;
  idle_qp_ = nullptr;
  while (total < budget) {
    // (A budget below a batch reads that many: kPostRecvRxBudget.)
    int n = port_->recv_batch(
        std::span<wire::RxDesc>(rx_descs_, std::min<int>(kRxBatch, budget - total)));
    if (n > 0) now_cache = 0;
    // A full batch: more may be queued behind it. Mark it if the queue is past rx_mark_pct,
    // looked up at most every kFillLookNs (a system call; full batches of small datagrams
    // from a link without GRO come every few tens of microseconds): a look's verdict holds
    // for the full batches until the next one.
    rx_marking_ = false;
    if (n == kRxBatch && cfg_.rx_mark_pct != 0) {
      if (const uint64_t now = rx_now(); now >= fill_next_look_ns_) {
        fill_next_look_ns_ = now + kFillLookNs;
        fill_over_ = port_->rx_fill_pct() >= static_cast<int>(cfg_.rx_mark_pct);
      }
      rx_marking_ = fill_over_;
      if (rx_marking_) ctr_.add(Ctr::kRxBacklogMarks);
    }
    if (n <= 0 && linger_qp_ != nullptr && !t_progress_thread && !faults &&
        replay_qps_.empty()) {
      // The answer behind the ACK just handled (linger_rx): look again, for at most
      // linger_ns from the first empty look (other datagrams meanwhile do not extend it).
      const uint64_t now = wire::monotonic_ns();
      if (linger_end == 0) linger_end = now + cfg_.linger_ns;
      if (now < linger_end) continue;
      linger_qp_ = nullptr;
      linger_end = 0;
      ctr_.add(Ctr::kLingerExpired);
    }
    if (n <= 0) {
      if (replay_qps_.empty()) break;
      // Nothing received: the next slice of each READ replay, then look again.
      run_replays_locked();
      flush(*rx_tx_);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const wire::RxDesc& d = rx_descs_[i];
      if (d.truncated) {
        ctr_.add(Ctr::kDropMalformed);
        continue;
      }
      // An ACK tail (ack_tail_index) is handled first, then the requests ahead of it.
      const uint32_t tail = ack_tail_index(d);
      if (tail != 0) {
        const uint32_t off = tail * d.seg_size;
        recv_packet(*this, d, std::span<uint8_t>(d.buf + off, d.len - off), tail);
      }
      wire::for_each_segment(d, [&](std::span<uint8_t> seg, uint32_t idx) {
        if (tail == 0 || idx != tail) recv_packet(*this, d, seg, idx);
      });
    }
    total += n;
    rx_marking_ = false;
    if (faults) drain_fault_rx_locked();
    scatter_batch.end();
    if (linger_end != 0 && linger_qp_ == nullptr) {  // the answer came (answer_came)
      linger_end = 0;
      ctr_.add(Ctr::kLingerHit);
    } else if (linger_more_) {  // part of it came: a new window for the rest
      linger_end = 0;
    }
    linger_more_ = false;
    flush_acks_locked(&now_cache);
    run_replays_locked();
    flush(*rx_tx_);
    events.release();
    // A short batch read every socket empty (recv_batch): the next look would be an empty
    // recvmmsg on the critical path, ~0.4 us between a ping-pong's answer and the poll that
    // returns it. What came meanwhile is the next poll's (or the level-triggered epoll's).
    // Not while a linger waits for the rest of an answer, or READ replays are to run, or
    // the port holds received packets that are due (a filter split a GRO buffer, or faults
    // duplicated one): those do not make the socket readable, so the next look is theirs.
    if (n < kRxBatch && linger_qp_ == nullptr && replay_qps_.empty() && port_->held_count() == 0)
      break;
    // An application's polls took receive from us meanwhile (on_poll_empty) and go on (its
    // last call came within the busy-poll gap): what is left is theirs, and each batch more
    // here is one their try-lock misses (while their requester runs would wait on ours).
    // READ replays and held packets stay ours to finish, and so does the rest of a drain in
    // which a QP went idle (its end hands receive straight back). Not when the socket could
    // not go back into the epoll set (watch_rx failed: receive is ours at each lease end,
    // with no polls going on).
    if (t_progress_thread && !rx_watched_.load(std::memory_order_relaxed) &&
        idle_qp_ == nullptr && replay_qps_.empty() && port_->held_count() == 0 &&
        within_gap(wire::monotonic_ns(), last_app_call_ns_.load(std::memory_order_relaxed)))
      break;
  }
  flush_acks_locked(&now_cache);
  flush(*rx_tx_);
  if (total > 0) ctr_.add(t_progress_thread ? Ctr::kRxDrainProgress : Ctr::kRxDrainPoll);
  // A QP's last WQE completed and the peer's answer did not come (sq_drained; a linger ran
  // out): the poll that returns that completion hands receive back (on_poll_hit). This
  // drain may be the progress thread's, just before an application's poll took receive.
  // Or the progress thread's, while an application's poll was taking receive: then that
  // poll may have returned the completion already (it was in the CQ before this store); if
  // the take came first, hand it back here (seq_cst: the poll stores rx_watched_ before it
  // loads idle_pending_, this drain the other way round).
  if (idle_qp_ != nullptr) {
    idle_pending_.store(idle_qp_, std::memory_order_seq_cst);
    if (t_progress_thread && !rx_watched_.load(std::memory_order_seq_cst)) hand_back_rx(false);
  }
  return total;  // `events` releases the rest
}

static_assert(ReqState::kFullShare == kMaxUnackedPsns);

uint32_t Engine::window_share(const wire::Endpoint& dst, uint64_t* counted_epoch,
                              uint64_t now_ns) {
  constexpr uint64_t kCount = (uint64_t{1} << kShareCountBits) - 1;
  uint64_t h = dst.port;
  for (uint8_t b : dst.addr) h = h * 131 + b;
  std::atomic<uint64_t>* slots = share_slots_[(h ^ (h >> 17)) % kShareBuckets];
  const uint64_t ep = now_ns / std::max<uint64_t>(cfg_.window_share_epoch_ns, 1);
  std::atomic<uint64_t>& cur = slots[ep & 1];
  uint64_t v = cur.load(std::memory_order_relaxed);
  if (*counted_epoch != ep) {  // this QP's first fill in the epoch: count it
    *counted_epoch = ep;
    // A slot of an older epoch starts afresh; one of a newer epoch (this clock reading is
    // stale: the thread waited) is left alone.
    while ((v >> kShareCountBits) <= ep) {
      const uint64_t nv = (v >> kShareCountBits) == ep ? v + 1 : (ep << kShareCountBits) | 1;
      if (cur.compare_exchange_weak(v, nv, std::memory_order_relaxed)) {
        v = nv;
        break;
      }
    }
  }
  // The larger of this epoch's count and the last's: early in an epoch, the others have not
  // counted themselves yet.
  uint64_t n = (v >> kShareCountBits) == ep ? v & kCount : 0;
  const uint64_t pv = slots[(ep - 1) & 1].load(std::memory_order_relaxed);
  if ((pv >> kShareCountBits) == ep - 1) n = std::max(n, pv & kCount);
  if (n <= 1) return kMaxUnackedPsns;
  return std::max<uint32_t>(kShareFloorPsns, static_cast<uint32_t>(kMaxUnackedPsns / n));
}

std::shared_ptr<Qp> Engine::rx_find_qp(uint32_t qpn) {
  const uint64_t gen = dev_->qp_table_generation();
  if (gen != rx_qps_gen_) {
    for (RxQpSlot& s : rx_qps_) s = RxQpSlot{};
    rx_qps_gen_ = gen;
  }
  RxQpSlot& s = rx_qps_[qpn % kRxQpSlots];
  if (s.qp && s.qpn == qpn) return s.qp;
  // The generation was read before the lookup: an erase between them moves it past
  // rx_qps_gen_, and the next call starts afresh.
  std::shared_ptr<Qp> qp = dev_->find_qp(qpn);
  if (qp) {
    s.qpn = qpn;
    s.qp = qp;
  }
  return qp;
}

ScatterCache* Engine::drain_scatter_cache() {
  return t_drain_engine != nullptr ? &t_drain_engine->rx_scatter_ : nullptr;
}

uint64_t Engine::rx_now() {
  if (t_drain_engine != this || t_drain_clock == nullptr) return wire::monotonic_ns();
  if (*t_drain_clock == 0) *t_drain_clock = wire::monotonic_ns();
  return *t_drain_clock;
}

void Engine::flush_acks_locked(uint64_t* now_cache) {
  // Held where an application thread drains (poll_cq): it returns to its code at once and
  // answers. The progress thread holds only while the application is in its loop, its last
  // call (last_app_call_ns_: a poll, a post, the end of its receive) within the gap:
  // one that has gone away, or has no core, would leave the ACK to its deadline (the first
  // version held there always; on 2 cores a quarter of ib_write_lat's held ACKs timed out).
  // Sending at once there kept a ping-pong that began with the progress thread receiving on
  // that footing: the answer and its ACK went as two datagrams, the peer's completion came
  // before the answer, its application waited on memory and handed receive to its own
  // progress thread, which acknowledged at once in turn (ib_write_lat -n 1000: a third of
  // the messages in some runs, p99 up to 12x typical).
  bool hold = cfg_.ack_hold_ns != 0 && !t_progress_thread;
  const bool progress_may_hold = cfg_.ack_hold_ns != 0 && t_progress_thread;
  // Set only by this thread, from inside this drain (release_held_acks_now).
  bool left = false;
  if (release_held_now_) {
    release_held_now_ = false;
    left = true;
  }
  if (ack_qps_.empty() && held_acks_.empty()) return;
  uint64_t now = 0;
  if (hold || progress_may_hold || !held_acks_.empty()) {
    // A batch and the drain's end share one reading (drain_locked).
    if (now_cache == nullptr) {
      now = wire::monotonic_ns();
    } else {
      if (*now_cache == 0) *now_cache = wire::monotonic_ns();
      now = *now_cache;
    }
  }
  if (progress_may_hold && !left && busy_poll_allowed() &&
      within_gap(now, last_app_call_ns_.load(std::memory_order_relaxed)))
    hold = true;
  // What the batch already built goes first: a post may send a held ACK at once
  // (resp_take_ack), and it must not overtake this QP's earlier responses (a READ response
  // behind a later ACK reads as lost at the requester).
  if (hold && rx_tx_->size() > 0) flush(*rx_tx_);
  for (auto& qp : ack_qps_) {
    std::lock_guard lk(qp->recv_mutex());
    if (!resp_flush_ack(*this, *qp, hold && held_acks_.size() < kMaxDeferredAcks ? now : 0))
      continue;
    RespState& rs = qp->resp_;
    if (rs.ack_hold_until_ns == 0) {  // a new ACK held (not one coalesced into a held one)
      rs.ack_hold_until_ns = now + cfg_.ack_hold_ns;
      const uint64_t d = held_deadline_ns_.load(std::memory_order_relaxed);
      if (d == 0 || rs.ack_hold_until_ns < d) {
        held_deadline_ns_.store(rs.ack_hold_until_ns, std::memory_order_release);
        arm_timer(rs.ack_hold_until_ns);
      }
    }
    if (!rs.ack_held) {
      rs.ack_held = true;
      held_acks_.push_back(qp);
    }
  }
  ack_qps_.clear();
  if (held_acks_.empty()) return;
  // The application may have left the data path since the progress thread read its last
  // call: left_data_path clears it, then looks for held ACKs (release_held_acks_now); this
  // side holds a deadline, then looks at the last call again. Each side's two steps are
  // sequentially consistent (here a read-modify-write of the deadline, which reads its
  // latest value), so one of the two sees the other and the held ACK goes now, not at its
  // deadline. (Not fences: ThreadSanitizer does not support them.)
  if (hold && t_progress_thread && !left) {
    held_deadline_ns_.fetch_add(0, std::memory_order_seq_cst);
    if (last_app_call_ns_.load(std::memory_order_seq_cst) == 0) left = true;
  }
  if (left)
    release_held_acks_locked(~uint64_t{0});  // the thread left the data path meanwhile
  else if (held_deadline_ns_.load(std::memory_order_relaxed) <= now)
    release_held_acks_locked(now);
}

// Sends the held ACKs due at now_ns that no post took; QPs whose ACK a post took leave the
// list; the rest stay, and the deadline becomes the earliest of theirs. With `only`: that
// QP's alone (its destroy), the rest stay.
void Engine::release_held_acks_locked(uint64_t now_ns, const Qp* only) {
  size_t kept = 0;
  uint64_t next = 0;
  for (auto& qp : held_acks_) {
    std::lock_guard lk(qp->recv_mutex());
    RespState& rs = qp->resp_;
    if (only != nullptr ? qp.get() != only : rs.ack_pending && rs.ack_hold_until_ns > now_ns) {
      // (with `only`, a kept QP whose ACK a post took has no deadline: 0)
      if (rs.ack_hold_until_ns != 0 && (next == 0 || rs.ack_hold_until_ns < next))
        next = rs.ack_hold_until_ns;
      held_acks_[kept++] = qp;
      continue;
    }
    resp_release_ack(*this, *qp);
  }
  held_acks_.resize(kept);
  held_deadline_ns_.store(next, std::memory_order_release);
  if (next != 0) arm_timer(next);
}

void Engine::release_held_acks_now() {
  if (held_deadline_ns_.load(std::memory_order_seq_cst) == 0) return;  // (left_data_path)
  if (t_drain_engine == this) {
    // Called from inside this thread's own drain (a memory hook, a callback), which holds the
    // receive lock: its batch's end releases them (flush_acks_locked).
    release_held_now_ = true;
    return;
  }
  // Any other holder of the lock finishes within a batch; a control call can wait for it.
  std::lock_guard lk(rx_mu_);
  if (!rx_tx_) return;
  release_held_acks_locked(~uint64_t{0});
  flush(*rx_tx_);
}

void Engine::release_held_acks(uint64_t now_ns, bool try_only) {
  std::unique_lock lk(rx_mu_, std::defer_lock);
  if (!try_only) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return;  // a receive in progress: its batch's end sends them
  }
  if (!rx_tx_) return;
  release_held_acks_locked(now_ns);
  flush(*rx_tx_);
}

// One slice of every READ replay in progress; QPs with more to send stay listed.
void Engine::run_replays_locked() {
  replay_scan_.swap(replay_qps_);
  for (auto& qp : replay_scan_) {
    ReplayResult r;
    {
      std::lock_guard lk(qp->recv_mutex());
      r = resp_replay_slice(*this, *qp);
    }
    if (r == ReplayResult::kMore) {
      replay_qps_.push_back(qp);
    } else if (r == ReplayResult::kFatal) {
      // As recv.cc for a fatal responder outcome (lock order send -> receive).
      std::scoped_lock lk(qp->send_mutex(), qp->recv_mutex());
      if (!qp->comp_.dead && qp->state() != QpState::kErr) qp->enter_error_locked(false);
    }
  }
  replay_scan_.clear();
}

void Engine::drain_fault_rx_locked() {
  wire::HeldPacketSource* fe = fault_.load(std::memory_order_acquire);
  if (fe == nullptr) return;
  fe->drain_with(wire::Direction::kRx, [&](const wire::Endpoint& src, const wire::Endpoint& dst,
                                           std::span<const uint8_t> bytes) {
    wire::RxDesc d;
    d.src = src;
    d.dst = dst;
    d.len = static_cast<uint32_t>(bytes.size());
    recv_packet(*this, d, bytes, 0);
  });
}

void Engine::drain_fault_tx() {
  wire::HeldPacketSource* fe = fault_.load(std::memory_order_acquire);
  if (fe == nullptr) return;
  fe->drain_with(wire::Direction::kTx, [&](const wire::Endpoint&, const wire::Endpoint& dst,
                                           std::span<const uint8_t> bytes) {
    wire::TxDesc t;
    t.dst = dst;
    t.data = bytes.data();
    t.len = static_cast<uint32_t>(bytes.size());
    (void)port_->send_batch(std::span<const wire::TxDesc>(&t, 1));
  });
}

// ---------------------------------------------------------------- timers

void Engine::arm_timer(uint64_t deadline_ns) {
  if (deadline_ns == 0) deadline_ns = 1;
  if (deadline_ns >= armed_ns_.load(std::memory_order_acquire)) return;
  std::lock_guard lk(timer_mu_);
  arm_locked(deadline_ns);
}

void Engine::arm_locked(uint64_t deadline_ns) {
  if (deadline_ns >= armed_ns_.load(std::memory_order_relaxed)) return;
  armed_ns_.store(deadline_ns, std::memory_order_seq_cst);
  // Parked while an application's polls hold receive: they run what falls due
  // (receive_for_app: on_poll_empty, on_app_post); whoever hands receive back programs it
  // (hand_back_rx, program_parked_timer), or the progress thread does at the lease's end
  // (run_timers).
  if (!rx_watched_.load(std::memory_order_seq_cst)) return;
  programmed_ns_ = deadline_ns;
  program_timerfd(timer_fd_, deadline_ns);
}

void Engine::arm_timer(Qp& qp, uint64_t deadline_ns) {
  if (deadline_ns == 0) deadline_ns = 1;
  std::atomic<uint64_t>& queued = qp.comp_.timer_queued_ns;
  // An entry at or before deadline_ns finds the QP's real deadlines when it pops and
  // re-queues it then: nothing to add, and no lock (a QP re-arming on every ACK costs
  // nothing). Read without the timer lock: an entry popped meanwhile is run under the send
  // lock the caller holds, so it sees this deadline and re-queues it.
  uint64_t q = queued.load(std::memory_order_relaxed);
  if (q != 0 && q <= deadline_ns) return;
  std::lock_guard lk(timer_mu_);
  q = queued.load(std::memory_order_relaxed);
  if (q != 0 && q <= deadline_ns) return;
  queued.store(deadline_ns, std::memory_order_relaxed);
  heap_.push_back(TimerEntry{deadline_ns, qp.weak_from_this()});
  std::push_heap(heap_.begin(), heap_.end(), timer_later);
  arm_locked(deadline_ns);
}

void Engine::run_timers(uint64_t now_ns) {
  std::lock_guard lk(run_timers_mu_);
  run_timers_locked(now_ns);
}

void Engine::run_timers_locked(uint64_t now_ns) {
  const uint64_t held = held_deadline_ns_.load(std::memory_order_acquire);
  if (held != 0 && held <= now_ns) release_held_acks(now_ns);
  {
    // The due entries leave the heap; the timerfd is re-armed at the next one.
    std::lock_guard lk(timer_mu_);
    armed_ns_.store(~uint64_t{0}, std::memory_order_release);
    if (programmed_ns_ <= now_ns) programmed_ns_ = ~uint64_t{0};  // it fired
    due_.clear();
    while (!heap_.empty() && heap_.front().at <= now_ns) {
      std::pop_heap(heap_.begin(), heap_.end(), timer_later);
      TimerEntry t = std::move(heap_.back());
      heap_.pop_back();
      if (auto sp = t.qp.lock()) {
        if (sp->comp_.timer_queued_ns.load(std::memory_order_relaxed) == t.at)
          sp->comp_.timer_queued_ns.store(0, std::memory_order_relaxed);
        // A QP with several due entries (an early one and a re-queued one) runs once per
        // tick, as in one scan: a second run would see the deadlines the first re-armed.
        if (!sp->comp_.timer_due) {
          sp->comp_.timer_due = true;
          due_.push_back(std::move(sp));
        }
      }
    }
    for (auto& qp : due_) qp->comp_.timer_due = false;
    if (!heap_.empty()) arm_locked(heap_.front().at);
    // Held ACKs' deadline: its arm_timer was a no-op if an earlier deadline was armed then.
    if (uint64_t h = held_deadline_ns_.load(std::memory_order_acquire); h != 0) arm_locked(h);
  }
  for (auto& qp : due_) {
    std::lock_guard lk(qp->send_mutex());
    if (qp->comp_.dead) continue;
    comp_on_timer(*this, *qp, now_ns);
    // Deadlines still armed (not due yet: the entry was early) go back in the heap.
    const CompState& c = qp->comp_;
    uint64_t next = ~uint64_t{0};
    if (c.retrans_deadline_ns != 0) next = std::min(next, c.retrans_deadline_ns);
    if (c.rnr_deadline_ns != 0) next = std::min(next, c.rnr_deadline_ns);
    if (next != ~uint64_t{0}) arm_timer(*qp, next);
  }
  due_.clear();
  // CQ moderation periods (no QP lock held: Cq::moderation_tick takes the CQ's and the
  // channel's locks only).
  std::vector<std::shared_ptr<Cq>> cqs;
  {
    std::lock_guard lk(cqs_mu_);
    if (mod_cqs_.empty()) return;
    for (auto& w : mod_cqs_)
      if (auto sp = w.lock()) cqs.push_back(std::move(sp));
    mod_cqs_.clear();
  }
  uint64_t next = ~uint64_t{0};
  for (auto& cq : cqs) {
    uint64_t d = cq->moderation_tick(now_ns);
    if (d == 0) continue;
    next = std::min(next, d);
    std::lock_guard lk(cqs_mu_);
    mod_cqs_.push_back(cq);
  }
  if (next != ~uint64_t{0}) arm_timer(next);
}

bool Engine::on_cq_deadline(Cq& cq, uint64_t deadline_ns) {
  // No progress thread (tests driving by hand): nothing would tick it.
  if (!cfg_.progress_thread || stopping_.load(std::memory_order_acquire)) return false;
  {
    std::lock_guard lk(cqs_mu_);
    bool known = false;
    for (auto& w : mod_cqs_) known = known || w.lock().get() == &cq;
    if (!known) mod_cqs_.push_back(cq.weak_from_this());
  }
  arm_timer(deadline_ns);
  return true;
}

uint64_t Engine::next_deadline_ns() {
  // Every armed deadline has a heap entry at or before it: the QPs in the heap are all
  // the QPs that can have one.
  std::vector<std::shared_ptr<Qp>> v;
  {
    std::lock_guard lk(timer_mu_);
    for (auto& t : heap_)
      if (auto sp = t.qp.lock()) v.push_back(std::move(sp));
  }
  uint64_t next = 0;
  for (auto& qp : v) {
    std::lock_guard lk(qp->send_mutex());
    for (uint64_t d : {qp->comp_.retrans_deadline_ns, qp->comp_.rnr_deadline_ns})
      if (d != 0 && (next == 0 || d < next)) next = d;
  }
  return next;
}

// ---------------------------------------------------------------- hooks

// Doorbell batching (EngineConfig::defer_inflight): leave the posted WQEs for the requester
// run that the next ACK or the retransmit timer makes (comp_on_packet, comp_on_timer). Only
// while that run is certain: an RC or XRC QP in RTS with packets in flight and the timer armed.
bool Engine::defer_post(Qp& qp) const {
  if (cfg_.defer_inflight == 0 || !is_reliable(qp.type())) return false;
  const ReqState& r = qp.req_;
  const CompState& c = qp.comp_;
  if (!r.ready || c.dead || r.rnr_wait || c.retrans_deadline_ns == 0) return false;
  if (qp.state() != QpState::kRts) return false;
  if (wire::psn_diff(r.psn, c.psn) < static_cast<int32_t>(cfg_.defer_inflight)) return false;
  return qp.sq().size() - r.pos <= cfg_.defer_max;
}

// The ACK qp's responder owes goes ahead of the requests a requester run is about to send
// (ack_hold_ns; req_run, at its first packet): a held one into tx, to leave in the same
// sendmmsg (ack_on_post). One still listed in a receive batch that this thread is running
// (a post from the receive context: a tag-matching rendezvous, or a WQE a response released)
// is sent now with that batch, so that neither overtakes the other. One listed in another
// thread's batch is left to it. Lock order send -> receive; waited for, not tried: a receive
// context holding it for this QP's next packet would leave a held ACK to its deadline.
void Engine::take_ack(Qp& qp, TxBatch& tx, uint64_t now_ns) {
  if (!holds_acks(qp)) return;
  std::lock_guard lk(qp.recv_mutex());
  qp.req_.answers = false;
  if (t_drain_engine == this && qp.resp_.ack_listed) {
    if (resp_send_owed_ack(*this, qp)) flush(*rx_tx_);
    return;
  }
  if (resp_take_ack(*this, qp, tx, now_ns, cfg_.ack_hold_ns, &qp.req_.answers))
    bump(qp.comp_.ctr, ctr_, Ctr::kAckOnPost);
}

void Engine::on_post_send(Qp& qp) {
  if (defer_post(qp)) {
    bump(qp.comp_.ctr, ctr_, Ctr::kTxDeferred);
    return;
  }
  req_run(*this, qp);
}

void Engine::on_post_recv(Qp& qp) {
  // RNR recovery is driven by the requester's RNR timer (IBA 9.7.5.2.8); nothing to do.
  (void)qp;
}

void Engine::on_post_srq_recv(Srq& srq) { (void)srq; }

namespace {

void reset_transport(Qp& qp) {
  ReqState& r = qp.req_;
  r.ready = false;
  r.psn = r.max_psn = 0;
  r.pos = 0;
  r.pkts_since_ackreq = 0;
  r.rd_atomic_inflight = 0;
  r.rnr_wait = false;
  r.lkeys.clear();  // a QP reset lets go of the MRs it remembered (MrCache)
  RespState& s = qp.resp_;
  s.ready = false;
  s.rkeys.clear();
  s.epsn = s.msn = 0;
  s.nak_sent = s.rnr_gap = s.uc_drop = false;
  s.inorder_sport = 0;
  s.ack_pending = false;
  s.ack_hold = false;  // `ack_held` stays, as `ack_listed`: the lists drop it
  s.ack_passed = false;
  s.ack_sent_ns = 0;
  s.ack_hold_until_ns = 0;
  s.cur = RespState::kNone;
  s.have_wqe = false;
  s.recv_offset = 0;
  s.res.clear();
  s.res_next = 0;
  s.replay.active = false;  // `listed` stays: the engine's replay list drops it (resp.cc)
  s.xrc_srq.reset();        // XRC target: the SRQ of the last message
  CompState& c = qp.comp_;
  c.psn = 0;
  comp_disarm_retrans(c);
  c.rnr_deadline_ns = 0;
  c.retry_latched = false;
  c.src_latch.store(0, std::memory_order_relaxed);  // strict source check (recv.cc)
}

// INIT -> RTR: the responder starts (rq_psn, path MTU, responder resources; IBA 11.2.5).
void start_responder(Qp& qp, uint32_t mtu, const wire::Endpoint& local,
                     const wire::Endpoint& peer) {
  const QpAttr& a = qp.attr();
  RespState& s = qp.resp_;
  s.epsn = a.rq_psn & wire::kPsnMask;
  s.msn = 0;
  s.mtu = mtu;
  s.nak_sent = s.rnr_gap = s.uc_drop = false;
  s.inorder_sport = 0;
  s.cur = RespState::kNone;
  s.max_dest_rd_atomic = a.max_dest_rd_atomic;
  s.res.assign(a.max_dest_rd_atomic, RespRes{});  // control path: allocation is fine
  s.res_next = 0;
  s.dst = peer;
  s.meta = wire::meta_between(local, peer);
  s.ready = true;
}

// RTR -> RTS: the requester and completer start at sq_psn towards the QP's AV.
void start_requester(Qp& qp, uint32_t mtu, const wire::Endpoint& local,
                     const wire::Endpoint& peer) {
  ReqState& r = qp.req_;
  r.psn = r.max_psn = qp.attr().sq_psn & wire::kPsnMask;
  qp.comp_.psn = r.psn;
  win_reset(qp.comp_.win, kMaxUnackedPsns);  // full window, no RTT estimate, timers off
  r.win_share = kMaxUnackedPsns;
  r.share_epoch = UINT64_MAX;  // never counted
  r.pos = 0;
  r.pkts_since_ackreq = 0;
  r.rd_atomic_inflight = 0;
  r.rnr_wait = false;
  r.dst = peer;
  r.meta = wire::meta_between(local, peer);
  r.oc_state = 0;
  r.oc_link = nullptr;
  r.oc_shared = 0;
  r.oc_retry_ns = 0;
  r.mtu = mtu;
  r.ready = true;
}

// Attributes an RTR->RTS, RTS->RTS or SQD->RTS modify sets: initiator depth, retry counts,
// the local ACK timeout.
void load_requester_attrs(Qp& qp) {
  const QpAttr& a = qp.attr();
  CompState& c = qp.comp_;
  qp.req_.max_rd_atomic = std::max<uint32_t>(a.max_rd_atomic, 1);
  c.retry_cnt = a.retry_cnt;
  c.rnr_retry = a.rnr_retry;
  c.retry_left = a.retry_cnt;
  c.rnr_left = a.rnr_retry;
  c.timeout_ns = ack_timeout_ns(a.timeout);
}

// -> ERR / SQE: timers off, the requester forgets its progress (the SQ is flushed).
void stop_requester(Qp& qp, QpState to) {
  CompState& c = qp.comp_;
  comp_disarm_retrans(c);
  c.rnr_deadline_ns = 0;
  qp.req_.pos = 0;
  qp.req_.rnr_wait = false;
  qp.req_.rd_atomic_inflight = 0;
  // An ACK still owed for requests executed before the error goes out at batch end.
  if (to == QpState::kErr) resp_flush_held(qp);
}

}  // namespace

void Engine::on_modify(Qp& qp, QpState from, QpState to) {
  if (from != to) resp_stash_clear(*this, qp);  // requests held past a gap go with the state
  const QpAttr& a = qp.attr();
  const bool ud = qp.type() == QpType::kUd;
  uint32_t port_mtu = 1024;
  if (auto pa = dev_->query_port(1)) port_mtu = mtu_bytes(pa->active_mtu);
  const uint32_t mtu = ud ? port_mtu : std::max<uint32_t>(mtu_bytes(a.path_mtu), 256);
  const wire::Endpoint peer = peer_endpoint(qp.av(), cfg_.udp_port);
  const wire::Endpoint local = port_->local_for(peer);

  if (to == QpState::kReset) {
    reset_transport(qp);
    return;
  }
  if (to == QpState::kInit && from == QpState::kReset) {
    reset_transport(qp);
    return;
  }
  if (to == QpState::kRtr && from == QpState::kInit) {
    start_responder(qp, mtu, local, peer);
    return;
  }
  if (to == QpState::kRts || to == QpState::kSqd) {
    CompState& c = qp.comp_;
    if (from == QpState::kRtr) start_requester(qp, mtu, local, peer);
    load_requester_attrs(qp);
    if (to == QpState::kSqd && from != QpState::kSqd) {
      // emu reports an SQ that is empty now; the transports report a later drain.
      c.sqd_notified = qp.sq().empty();
      comp_check_sq_drained(qp);
    } else if (to == QpState::kRts) {
      c.sqd_notified = true;
      if (from == QpState::kSqd) {
        // WQEs posted while draining start now, from the progress thread (the requester
        // cannot run inside modify_qp: it may need to fail the QP, which takes both locks).
        c.kick = true;
        arm_timer(qp, wire::monotonic_ns());
      }
    }
    return;
  }
  if (to == QpState::kErr || to == QpState::kSqe) stop_requester(qp, to);
}

// A receive batch delivers CQEs before its coalesced ACKs go out (drain_locked). An
// application that polls the last one and destroys its QP at once (every pingpong's exit)
// must not take the ACK with it: the peer's final WQE would end in RETRY_EXC_ERR. Waiting
// for rx_mu_ waits for that batch, and sends what is still owed.
void Engine::on_before_destroy(Qp& qp) {
  std::lock_guard lk(rx_mu_);
  if (!rx_tx_) return;
  flush_acks_locked();
  if (!held_acks_.empty()) release_held_acks_locked(0, &qp);
  flush(*rx_tx_);
}

void Engine::on_destroy(Qp& qp) {
  qp.comp_.dead = true;
  qp.req_.ready = false;
  qp.resp_.ready = false;
  resp_stash_clear(*this, qp);
  comp_disarm_retrans(qp.comp_);
  qp.comp_.rnr_deadline_ns = 0;
  // A timer entry of the QP stays in the heap until it is due; its weak_ptr is dead by then
  // or the QP is `dead` (run_timers skips both).
}

void Engine::on_after_destroy(Qp& qp) {
  (void)qp;
  RxQpSlot gone[kRxQpSlots];  // released after the lock: a last reference ends a Qp
  {
    std::lock_guard lk(rx_mu_);  // as on_before_destroy: no QP lock held here
    for (uint32_t i = 0; i < kRxQpSlots; ++i) gone[i] = std::move(rx_qps_[i]);
    rx_qps_gen_ = dev_->qp_table_generation();
  }
}

void Engine::on_poll_empty(Cq& cq) {
  (void)cq;
  bool owned = false;
  uint64_t now = 0;
  if (busy_poll_allowed()) {
    now = wire::monotonic_ns();
    // The busy-poll hand-off. While the application polls empty CQs back to back (at most
    // busy_poll_gap_ns apart), its polls receive, run the timers, and hold the socket on a
    // lease of busy_poll_ns, renewed at half time; the progress thread sleeps, parked, and
    // wakes only when the lease runs out (progress_loop). Both are for machines where every
    // core spins: a wake-up of the progress thread took a spinning thread's core, and a
    // timerfd_settime due before the next tick cost 7 us here (a VM: the APIC timer is
    // reprogrammed), one due after it 0.3 us; so the lease is long and renewed rarely
    // (docs/progress.md). An application that polls slower keeps the progress thread.
    // The gap is measured from the application's last call (last_app_call_ns_: an empty
    // poll, the end of its receive, a post).
    const uint64_t prev = last_app_call_ns_.exchange(now, std::memory_order_relaxed);
    last_app_rx_ns_.store(now, std::memory_order_relaxed);
    // A late poll (further than the gap from the last call) hands receive back, unless the
    // polls hold it and it is one of the first busy_poll_late_polls late ones within a
    // lease (late_polls_, counted from late_window_ns_): a preempted application thread, not
    // one that polls slower than the gap, which gives receive back at the latest at its
    // second late poll in a lease. Never after left_data_path (prev 0: the application said
    // it was leaving). A late poll never takes receive, forgiven or not.
    const bool late = !within_gap(now, prev);
    bool forgiven = false;
    if (late && prev != 0 && !rx_watched_.load(std::memory_order_relaxed)) {
      const uint64_t w = late_window_ns_.load(std::memory_order_relaxed);
      // Signed: another thread may have opened a window after this poll read its clock.
      if (w == 0 || static_cast<int64_t>(now - w) >= static_cast<int64_t>(lease_ns())) {
        late_window_ns_.store(now, std::memory_order_relaxed);
        late_polls_.store(0, std::memory_order_relaxed);
      }
      forgiven = late_polls_.fetch_add(1, std::memory_order_relaxed) < cfg_.busy_poll_late_polls;
      if (forgiven) ctr_.add(Ctr::kBusyPollLateForgiven);
    }
    if (late && !forgiven) {
      hand_back_rx(false);
    } else {
      // Taken (again: a drain handed it back), or held. (A forgiven poll that finds receive
      // handed back meanwhile, by a lease end or a drain, does not take it.)
      if (!late && rx_watched_.load(std::memory_order_relaxed) && set_rx_watched(false)) {
        ctr_.add(Ctr::kBusyPollTaken);
        park_timerfd();
      }
      if (!late || !rx_watched_.load(std::memory_order_relaxed)) {
        renew_lease(now);
        owned = true;
      }
    }
  }
  receive_for_app(owned, now, owned);
}

void Engine::renew_lease(uint64_t now_ns) {
  // Only when half of it is gone: each renewal is a timerfd_settime (arm_defer).
  const uint64_t lease = lease_ns();
  if (lease_end_ns_.load(std::memory_order_relaxed) < now_ns + lease / 2) {
    // gettid each time (once per half lease): a cached one would be the parent's in a
    // forked child.
    lease_tid_.store(static_cast<int32_t>(gettid()), std::memory_order_relaxed);
    lease_end_ns_.store(now_ns + lease, std::memory_order_release);
    arm_defer(now_ns + lease);
  }
}

namespace {
// The scheduler state of a thread of ours: the letter after the ")" that ends the command
// name in /proc/self/task/<tid>/stat ('R': running or runnable), read again through `fd`;
// 0 when it cannot be read (the thread is gone).
char task_state(int fd) {
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');  // the name may hold ')' itself
  if (close_paren == nullptr || close_paren[1] != ' ') return 0;
  return close_paren[2];
}

// CPU time of a thread of this process (its CPU-time clock: what glibc's
// pthread_getcpuclockid builds, from the kernel tid, which needs no pthread_t that may be
// gone); false once the thread is.
bool thread_cpu_ns(int32_t tid, uint64_t* ns) {
  const clockid_t clk = static_cast<clockid_t>((~static_cast<uint32_t>(tid) << 3) | 6u);
  timespec ts{};
  if (clock_gettime(clk, &ts) != 0) return false;
  *ns = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
  return true;
}
}  // namespace

bool Engine::lease_holder_waits(uint64_t now_ns, uint64_t lease_end_ns) {
  // Why: where every core is busy (ib_send_bw -q 4: two processes, each an application
  // thread and a progress thread, on two cores), the application thread in its loop is
  // preempted now and then, or is inside a call of ours longer than the lease's renewal
  // allows (a receive of megabytes and the requester runs its ACKs release). Its lease ran
  // out ~35 times a second; each time this thread took receive, woke for every ACK, ran the
  // requesters they released and took a core from the applications, until an empty poll
  // took receive back. A 10 ms lease instead of 2 ms gave 8-14% more bandwidth
  // (docs/progress.md), but would keep a departed application's receive parked five times
  // longer: the scheduler says which it is.
  LeaseProbe& p = probe_;
  if (p.lease_end_ns != lease_end_ns) {  // renewed since the last look: a new probation
    p.lease_end_ns = lease_end_ns;
    p.since_ns = 0;
    p.looked = false;
  }
  const uint64_t bound = 4 * lease_ns();
  const uint64_t probe = 4 * uint64_t{cfg_.busy_poll_gap_ns};
  if (p.since_ns != 0 && now_ns - p.since_ns >= bound) return false;
  // An application thread is inside a call of ours (an empty poll's receive, a post): the
  // application is in its loop, whatever the scheduler says of the thread that renewed.
  const uint64_t in_call = app_call_since_ns_.load(std::memory_order_relaxed);
  if (in_call != 0 && static_cast<int64_t>(now_ns - in_call) < static_cast<int64_t>(bound)) {
    if (p.since_ns == 0) p.since_ns = now_ns;
    p.looked = false;  // the CPU time is read afresh at the next look
    arm_defer(now_ns + lease_ns() / 2);
    return true;
  }
  const int32_t tid = lease_tid_.load(std::memory_order_relaxed);
  if (tid <= 0) return false;
  if (p.tid != tid || p.fd < 0) {
    if (p.fd >= 0) close(p.fd);
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", static_cast<int>(tid));
    p.fd = open(path, O_RDONLY | O_CLOEXEC);
    p.tid = tid;
    p.looked = false;
    if (p.fd < 0) return false;  // gone, or /proc not mounted: as before, receive goes back
  }
  uint64_t cpu = 0;
  const char state = task_state(p.fd);
  if (state != 'R' || !thread_cpu_ns(tid, &cpu)) {  // asleep (outside our calls), or gone
    if (state == 0) {
      close(p.fd);
      p.fd = -1;
    }
    return false;
  }
  // Runnable: running without a call, or waiting for a CPU. One look cannot tell; the CPU
  // time it gains until the next look (a probe later) can.
  if (p.looked && cpu - p.cpu_ns >= 2 * uint64_t{cfg_.busy_poll_gap_ns}) return false;  // ran
  if (p.since_ns == 0) p.since_ns = now_ns;
  p.looked = true;
  p.cpu_ns = cpu;
  arm_defer(now_ns + probe);
  return true;
}

void Engine::receive_for_app(bool owned, uint64_t now_ns, bool in_loop, int budget) {
  if (owned) app_call_since_ns_.store(now_ns, std::memory_order_relaxed);
  const uint64_t held = held_deadline_ns_.load(std::memory_order_relaxed);
  const int got = try_poll_rx(budget);
  // The timers are parked while the polls hold receive (arm_locked): run what fell due.
  bool ran_timers = false;
  if (owned && armed_ns_.load(std::memory_order_acquire) <= now_ns &&
      !rx_watched_.load(std::memory_order_acquire)) {
    std::unique_lock lk(run_timers_mu_, std::try_to_lock);
    if (lk.owns_lock()) {
      ctr_.add(Ctr::kTimersOnPoll);
      run_timers_locked(now_ns);
      ran_timers = true;
    }
  }
  if (owned) app_call_since_ns_.store(0, std::memory_order_relaxed);
  // The polls' receive can run long (64 GRO buffers of 64 KiB, and the requester runs their ACKs
  // release), and so can what a look without datagrams does (held ACKs that fell due, waiting for
  // their QP's receive lock) and the timers the poll runs (an RNR or retransmit timer resends a
  // window: 400-800 us of sendmmsg in ib_send_bw -q 4): an application in its loop is in the
  // library until here, so the gap to its next call, and the lease, count from here. Measured from
  // the poll's start, a drain of a few megabytes outlasted the gap: the next empty poll handed
  // receive back, and the lease ran out with the application polling (ib_send_bw -q 4's receiver,
  // docs/progress.md). Stamped only after a receive that got datagrams, -q 4's sender still handed
  // receive back ~60 times a second, each time after 370-800 us spent running inside such a poll
  // (its timers). Not when on_app_post's end-to-end check failed (`in_loop` false: a post that came
  // later than the gap, or a post_send whose own run was longer, which on_app_enter stamped at its
  // start): its receive does not make it back to back. Only after a look that did more than look
  // (datagrams, held ACKs due, a timer run): a plain empty look is short, and a busy poll makes one
  // after another (a clock read more each cost ib_write_lat 2%, 5 of 6 pairs).
  const bool worked = got > 0 || ran_timers || (held != 0 && held <= now_ns);
  if (worked && in_loop && !rx_watched_.load(std::memory_order_relaxed))
    stamp_call(wire::monotonic_ns());
}

bool Engine::app_post_counts() const {
  return !t_progress_thread && !rx_watched_.load(std::memory_order_acquire) &&
         busy_poll_allowed();
}

void Engine::on_app_post(bool recv_wr) {
  // A post while the application's polls hold receive (the busy-poll lease): the
  // application is in the library, not away, so the gap to its next empty poll is measured
  // from here. Without this, ib_send_bw's posts (requester runs of megabytes, completions
  // in between) outlasted the 50 us gap between two empty polls several hundred times a
  // second: each handed receive back, the progress thread woke and drained the ACKs and ran
  // their deferred requesters on a core the application wanted while the application spun
  // on an empty CQ, and the next empty poll took receive again (two epoll_ctl).
  // - Posts that come for longer than the gap without a receive of the application's
  //   receive themselves, as an empty poll would, so an application that posts often and
  //   polls rarely does not hold the peer's ACKs until its next poll.
  // - Only receive the polls hold counts: a post never takes it from the progress thread.
  // - A post renews the lease only when it came within the gap of the application's last
  //   call (back to back, as polls must be; a post_send that started within the gap was
  //   stamped and renewed there, by on_app_enter, so a run longer than the gap renews at
  //   its start, not here): ib_send_bw posts for milliseconds between empty polls, and its
  //   lease ran out ~25 times a second. Posts further apart let it run out,
  //   so an application that posts now and then and waits on memory gets the progress
  //   thread back busy_poll_ns after its last empty poll, as before.
  // - A post_recv's receive takes at most kPostRecvRxBudget datagrams. The application
  //   thread is its receive queues' only refiller: a receiver reposting after a poll took
  //   64 datagrams (64 messages of 64 KiB) with each post that came a gap after the last,
  //   so ib_send_bw -q 4's receiver fed its CQ faster than it reposted. Its four queues of
  //   512 ran dry together every ~30 ms with ~2,000 completions unpolled: 80-100 RNR NAKs a
  //   second, each a go-back-N of the QP's window (~100 k packets resent in 3 s). A post_send's
  //   receive keeps the full budget: its ACKs are what release the sender.
  if (app_call_since_ns_.load(std::memory_order_relaxed) != 0)  // on_app_enter's
    app_call_since_ns_.store(0, std::memory_order_relaxed);
  if (!app_post_counts()) return;
  const uint64_t now = wire::monotonic_ns();
  const uint64_t prev = last_app_call_ns_.exchange(now, std::memory_order_relaxed);
  const bool in_loop = within_gap(now, prev);
  if (in_loop) renew_lease(now);
  const uint64_t last_rx = last_app_rx_ns_.load(std::memory_order_relaxed);
  if (within_gap(now, last_rx)) return;
  last_app_rx_ns_.store(now, std::memory_order_relaxed);
  ctr_.add(Ctr::kRxOnPost);
  receive_for_app(true, now, in_loop, recv_wr ? kPostRecvRxBudget : kAppRxBudget);
}

void Engine::on_app_enter() {
  // A post_send's start, while the application's polls hold receive: the gap since its last
  // call ends here, not at the post's end. A post that sends a 64 KiB message, or waits for
  // its QP's send lock (a requester run an ACK released elsewhere), takes longer than the
  // gap by itself; measured end to end, back-to-back posts of ib_send_bw -q 4 renewed
  // nothing and the lease ran out ~35 times a second with the application in its loop
  // (docs/progress.md). One clock read a post, only while the polls hold receive.
  // Only a start within the gap stamps: one after a longer absence is left to on_app_post's
  // end-to-end check, as before (else the post's own end would find its start within the gap
  // and renew: an application posting every millisecond and waiting on memory would keep
  // receive parked for good).
  if (!app_post_counts()) return;
  const uint64_t now = wire::monotonic_ns();
  app_call_since_ns_.store(now, std::memory_order_relaxed);  // until on_app_post
  if (within_gap(now, last_app_call_ns_.load(std::memory_order_relaxed))) stamp_call(now);
}

void Engine::on_poll_hit(Cq& cq) {
  (void)cq;
  // The application goes back to its code with a completion that left its QP idle, the
  // peer's answer not in: it may wait for it on memory (ib_write_lat) rather than poll. The
  // progress thread takes receive back now, not when the polls' lease runs out (an
  // epoll_ctl; the next empty poll takes it again).
  const Qp* q = idle_pending_.load(std::memory_order_seq_cst);
  if (q == nullptr || !idle_pending_.compare_exchange_strong(q, nullptr, std::memory_order_seq_cst))
    return;
  hand_back_rx(false);
}

bool Engine::set_rx_watched(bool on) {
  std::lock_guard lk(watch_mu_);
  if (rx_watched_.load(std::memory_order_relaxed) == on) return false;
  rx_watched_.store(on, std::memory_order_seq_cst);
  if (!watch_rx(on)) {
    rx_watched_.store(!on, std::memory_order_seq_cst);
    return false;
  }
  return true;
}

void Engine::hand_back_rx(bool rearm) {
  if (rx_watched_.load(std::memory_order_acquire) || !set_rx_watched(true)) return;
  ctr_.add(Ctr::kBusyPollReturned);
  // An ACK held for a post must not wait for the lease's end (the peer probes after 200 us):
  // its deadline is programmed now, 7 us where it is before the next tick. Other parked
  // deadlines (a retransmit of another QP) are programmed by the progress thread's next
  // wake-up, at the latest at the lease's end, unless `rearm`: programming every hand-back
  // cost ib_read_lat's client 7 us a round trip (the drained READ's stale deadline).
  if (rearm || held_deadline_ns_.load(std::memory_order_acquire) != 0) program_parked_timer();
}

void Engine::park_timerfd() {
  // The deadline the progress thread programmed before the polls took receive (a
  // retransmit timer, ~200 us ahead on every request) would still wake it, on a core a
  // spinning thread wants: 1 in ~100 ib_send_lat iterations paid that switch. The polls
  // run it (armed_ns_ keeps it). After a hand-back it is programmed again by the hand-back
  // itself where that programs the parked timer (left_data_path, a held ACK), else when the
  // progress thread next runs the timers: at the latest at the lease's end (busy_poll_ns), as
  // any deadline parked meanwhile (hand_back_rx). A receive wake-up alone does not run them.
  // Not if receive went back between the take and here (re-checked under the timer lock,
  // which program_parked_timer takes too): the progress thread owns the timerfd again.
  std::lock_guard lk(timer_mu_);
  if (programmed_ns_ == ~uint64_t{0} || rx_watched_.load(std::memory_order_seq_cst)) return;
  programmed_ns_ = ~uint64_t{0};
  program_timerfd(timer_fd_, 0);  // a zero it_value disarms
}

bool Engine::timerfd_programmed() const {
  itimerspec its{};
  if (timerfd_gettime(timer_fd_, &its) != 0) return false;
  return its.it_value.tv_sec != 0 || its.it_value.tv_nsec != 0;
}

void Engine::program_parked_timer() {
  // Only what arm_locked parked is earlier than what the timerfd holds (a past deadline
  // fires at once). The common case reads two words under a leaf lock.
  std::lock_guard lk(timer_mu_);
  // The polls took receive again meanwhile: the timers are theirs (park_timerfd).
  if (!rx_watched_.load(std::memory_order_seq_cst)) return;
  const uint64_t a = armed_ns_.load(std::memory_order_relaxed);
  if (a == ~uint64_t{0} || a >= programmed_ns_) return;
  programmed_ns_ = a;
  program_timerfd(timer_fd_, a);
}

void Engine::left_data_path() {
  // Its last call no longer says the application is in its loop: the progress thread sends
  // the ACKs it drains at once (flush_acks_locked) until the next call.
  // (Pairs with flush_acks_locked: a progress thread's drain that held an ACK on the last
  // call's old value either sees the 0, or holds a deadline that release_held_acks_now's
  // first load sees; both sequentially consistent.)
  last_app_call_ns_.store(0, std::memory_order_seq_cst);
  hand_back_rx(true);
  release_held_acks_now();
}

}  // namespace rnic::emu
