// Embedded hosting of the engine: configuration, address choice, emu::Device and engine
// start/stop, and the async-event dispatcher thread.
#include "verbs_shim/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <pthread.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "daemon/proto/proto.h"
#include "emu/transport/engine.h"
#include "emu/services/services.h"
#include "verbs_shim/daemon_client.h"
#include "verbs_shim/shim.h"
#include "wire/udp_port.h"

namespace rnic::shim {

std::atomic<uint64_t> g_fork_generation{0};

namespace {

std::mutex g_host_mu;
Host* g_host = nullptr;  // one device per process in embedded mode
bool g_atfork_installed = false;  // guarded by g_host_mu

// fork(): hold g_host_mu across it so the child never inherits it locked mid-update. The
// child forgets the parent's host (leaked on purpose: its threads are gone, and closing
// its socket or stopping its engine is the parent's business) and starts a new generation.
void atfork_prepare() { g_host_mu.lock(); }
void atfork_parent() { g_host_mu.unlock(); }
void atfork_child() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  // Daemon hosting: the parent's slot sockets and daemon connection are the parent's; a child
  // keeping them would hold the slot's sockets after the parent left (daemon/server.cc).
  if (g_host != nullptr) {
    for (int fd : g_host->daemon_fds_) close(fd);
    if (g_host->daemon_fd_ >= 0) close(g_host->daemon_fd_);
  }
  g_host = nullptr;
  g_host_mu.unlock();
}

// 0 if UDP 4791 on `ip` (IPv4 or IPv6) is free, else the errno (wire::probe_bind).
int probe_bind(const std::string& ip) {
  std::optional<wire::Endpoint> ep = wire::Endpoint::parse(ip, wire::kRoceUdpPort);
  return ep ? wire::probe_bind(*ep) : EINVAL;
}

std::string ip_str(in_addr ip) {
  char b[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &ip, b, sizeof b);
  return b;
}

// EngineConfig::gso from SOFTRNIC_GSO: auto sends GSO batches only where the IP is on a
// loopback interface; elsewhere one datagram per packet (sendmmsg batches) with IP ID 0, so
// every packet verifies on a capture from any interface whatever its offloads. Receiving with
// GRO stays on regardless (EngineConfig::gro).
bool gso_for(base::GsoMode mode, const std::string& ip) {
  switch (mode) {
    case base::GsoMode::kOn: return true;
    case base::GsoMode::kOff: return false;
    case base::GsoMode::kAuto: break;
  }
  return emu::ip_on_loopback(ip);
}

// Translates one emu event into the verbs event of the context that owns the object.
void dispatch(Host* h, emu::AsyncEvent& ev) {
  // Held while the back pointer is read: destroy clears it under this lock
  // (Context::retire_async), so no event names an object being freed.
  std::lock_guard<std::mutex> lk(h->ctx_mu_);
  ibv_async_event out{};
  out.event_type = static_cast<ibv_event_type>(ev.type);
  Context* owner = nullptr;
  if (ev.qp) {
    auto* q = static_cast<Qp*>(ev.qp->user_context);
    if (q == nullptr) return;
    out.element.qp = &q->pub_.qp_base;
    owner = to_ctx(q->pub_.qp_base.context);
  } else if (ev.cq) {
    auto* c = static_cast<Cq*>(ev.cq->user_context);
    if (c == nullptr) return;
    out.element.cq = reinterpret_cast<ibv_cq*>(&c->pub_);
    owner = to_ctx(c->pub_.context);
  } else if (ev.srq) {
    auto* s = static_cast<Srq*>(ev.srq->user_context);
    if (s == nullptr) return;
    out.element.srq = &s->pub_;
    owner = to_ctx(s->pub_.context);
  } else {
    out.element.port_num = ev.port_num;
  }
  for (Context* c : h->contexts_) {
    if (owner == nullptr || owner == c) c->post_async(out);
  }
}

// Daemon hosting: one message from softrnicd (the dispatcher is its only reader). Returns
// false once the daemon is gone: the device then turns fatal (Device::fatal), as a device
// whose hardware died, and every request waiting for a reply gets EIO.
bool on_daemon_message(Host* h) {
  alignas(8) uint8_t buf[daemon::kMaxMsg];
  ssize_t r = daemon::recv_msg(h->daemon_fd_, buf, sizeof buf);
  if (r == -EAGAIN || r == -EINTR) return true;
  if (r > 0) {
    daemon::Header hd;
    std::memcpy(&hd, buf, sizeof hd);
    if (hd.type == uint32_t(daemon::MsgType::kReply) && size_t(r) == sizeof(daemon::ReplyMsg)) {
      daemon::ReplyMsg m;
      std::memcpy(&m, buf, sizeof m);
      std::lock_guard lk(h->req_mu_);
      h->reply_seq_ = m.seq;
      h->reply_err_ = m.err;
      h->req_cv_.notify_all();
    }
    return true;  // anything else is ignored (a newer daemon's message)
  }
  RNIC_LOG(kError, "device %s: softrnicd (%s) is gone: the device is lost",
           h->cfg_.name.c_str(), h->daemon_path_.c_str());
  {
    std::lock_guard lk(h->req_mu_);
    h->daemon_lost_ = true;
    h->req_cv_.notify_all();
  }
  h->dev_->fatal();
  return false;
}

void dispatcher_main(Host* h) {
  emu::AsyncEventQueue& q = h->dev_->async_events();
  bool daemon_up = h->daemon_fd_ >= 0;
  for (;;) {
    pollfd fds[3] = {{q.fd(), POLLIN, 0}, {h->stop_fd_, POLLIN, 0}, {h->daemon_fd_, POLLIN, 0}};
    int r = poll(fds, daemon_up ? 3 : 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (daemon_up && fds[2].revents != 0) daemon_up = on_daemon_message(h);
    emu::AsyncEvent ev;
    while (q.try_get(&ev).is_ok()) {
      dispatch(h, ev);
      ev = emu::AsyncEvent{};
    }
  }
}

// `dd`: daemon hosting (the device softrnicd chose, its slot and sockets), else nullptr.
int start_device(Host* h, const DaemonDevice* dd = nullptr, const daemon::OpenedMsg* slot = nullptr,
                 std::vector<int>* fds = nullptr) {
  emu::DeviceConfig dc;
  dc.name = h->cfg_.name;
  dc.ip = h->ip_;
  dc.active_mtu = h->cfg_.mtu;
  // This process's node GUID (device.cc device_guid): recomputed here so a forked child's
  // device gets its own; the listed device reports the same value from now on. A daemon's
  // device has one GUID for every process.
  dc.node_guid = dd != nullptr ? dd->info.node_guid : device_guid(dc.name);
  if (dd != nullptr) {
    dc.name = dd->info.name;
    if (dc.active_mtu == 0) dc.active_mtu = dd->info.active_mtu;
    dc.slot = static_cast<uint8_t>(slot->slot);
    dc.max_qp = slot->max_qp;
    dc.max_mr = slot->max_mr;
  }
  h->dev_entry_->node_guid_be_ = htobe64(dc.node_guid);
  dc.pin = h->cfg_.pin == base::PinMode::kDirect ? emu::PinMode::kDirect : emu::PinMode::kShadow;
  auto r = emu::Device::open(dc);
  if (!r.has_value()) {
    RNIC_LOG(kError, "cannot open device %s on %s: %s", dc.name.c_str(), dc.ip.c_str(),
              std::strerror(err_of(r.error())));
    return err_of(r.error());
  }
  std::shared_ptr<emu::Device> dev = std::move(r.value());
  // The engine binds UDP <ip>:4791, installs itself as the device's hooks and engine, and
  // starts its progress thread; the device owns it from here on.
  emu::EngineConfig ec;
  ec.gso = dd != nullptr && h->cfg_.gso == base::GsoMode::kAuto ? dd->info.gso != 0
                                                                  : gso_for(h->cfg_.gso, h->ip_);
  ec.spin_ns = h->cfg_.spin_us * 1000u;
  ec.busy_poll_ns = h->cfg_.busy_poll_us * 1000u;
  ec.busy_poll_late_polls = h->cfg_.busy_poll_late;
  ec.defer_inflight = h->cfg_.tx_defer;
  ec.ack_hold_ns = h->cfg_.ack_hold_us * 1000ull;
  ec.linger_ns = h->cfg_.linger_us * 1000ull;
  ec.ack_tail = h->cfg_.ack_tail;
  ec.rx_mark_pct = h->cfg_.rx_mark_pct;
  ec.window_share = h->cfg_.window_share;
  // One copy needs this process's own view of the pages (shadow pinning) and a device of
  // its own: a daemon's device cannot map an application's memfds (docs/daemon.md).
  ec.one_copy = dd == nullptr && h->cfg_.one_copy && h->cfg_.pin != base::PinMode::kDirect;
  RNIC_LOG(kInfo, "device %s on %s: UDP GSO %s", dc.name.c_str(), dc.ip.c_str(),
           ec.gso ? "on" : "off (one datagram per packet)");
  emu::Result<std::shared_ptr<emu::Engine>> e = emu::Errc::kInval;
  if (dd == nullptr) {
    e = emu::Engine::start(dev, ec);
  } else {
    // The slot's sockets, one per GID in the daemon's order: the engine owns them from here.
    wire::UdpPortOptions o;
    if (slot->side != 0) {
      o.side_fd = fds->back();  // the CM channel: QP1 datagrams softrnicd routes to us
      fds->pop_back();
    }
    o.adopt = *fds;
    fds->clear();
    o.rcvbuf = ec.rcvbuf;
    o.sndbuf = ec.sndbuf;
    o.gso = ec.gso;
    o.gro = ec.gro;
    int perr = 0;
    std::unique_ptr<wire::UdpPort> port = wire::UdpPort::open(o, &perr);
    if (!port) {
      RNIC_LOG(kError, "device %s: the sockets from softrnicd are unusable: %s", dc.name.c_str(),
               std::strerror(perr));
      dev->close();
      return perr != 0 ? perr : EIO;
    }
    // GID i is the address of socket i; a GID the daemon did not bind is not listed.
    size_t ok = 0;
    while (ok < port->sockets() && ok < dev->gids().size() &&
           port->local(ok).same_ip(dev->gids()[ok].addr)) {
      h->daemon_fds_.push_back(port->fd(ok));
      ++ok;
    }
    if (ok == 0) {
      RNIC_LOG(kError, "device %s: softrnicd's sockets are not on %s", dc.name.c_str(), dc.ip.c_str());
      dev->close();
      return EIO;
    }
    for (size_t i = ok; i < port->sockets(); ++i) h->daemon_fds_.push_back(port->fd(i));
    if (ok < dev->gids().size()) dev->truncate_gids(ok);
    e = emu::Engine::start_with_port(dev, std::move(port), ec);
  }
  if (!e.has_value()) {
    int rc = err_of(e.error());
    if (rc != EADDRINUSE) {
      RNIC_LOG(kError, "cannot start the engine of %s on %s:4791: %s", dc.name.c_str(), dc.ip.c_str(),
                std::strerror(rc));
    }
    dev->close();
    return rc;
  }
  // Faults, capture and the control socket (emu/services/services.h), from the configuration
  // host_acquire parsed (SOFTRNIC_FAULTS*, SOFTRNIC_PCAP, SOFTRNIC_CONTROL, hardening).
  emu::ServicesOptions so = emu::ServicesOptions::from_config(h->cfg_);
  std::string err;
  std::unique_ptr<emu::DeviceServices> svc = emu::DeviceServices::create(dev, so, &err);
  if (!svc) {
    RNIC_LOG(kError, "%s; cannot open the device", err.c_str());
    if (emu::Engine* eng = dev->engine()) eng->stop();
    dev->close();
    return EINVAL;
  }
  h->services_ = std::move(svc);
  // The IB CM on QP1 (emu/cm/agent.h), for librdmacm. Without it the device still works for
  // verbs (QP1 then drops MADs, counted as drop_unknown_qpn).
  cm::AgentOptions ao;
  ao.max_wait_ms = h->cfg_.cm_max_wait_ms;
  if (h->daemon_fd_ >= 0) {
    ao.comm_id_prefix = h->slot_;
    ao.claim_service = [h](uint64_t sid, bool listen) { return host_claim_service(h, sid, listen); };
  }
  int cm_err = 0;
  h->cm_ = cm::Agent::create(dev, ao, &cm_err);
  if (!h->cm_) RNIC_LOG(kWarn, "device %s: no CM agent: %s", dc.name.c_str(), std::strerror(-cm_err));
  h->dev_ = std::move(dev);
  return 0;
}

}  // namespace

int host_acquire(DeviceEntry* dev, Host** out) {
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (!g_atfork_installed) {
    int rc = pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    if (rc != 0) return rc;
    g_atfork_installed = true;
  }
  if (g_host != nullptr && g_host->dev_entry_ == dev) {
    ++g_host->refs_;
    *out = g_host;
    return 0;
  }
  Config cfg;
  std::string err;
  if (!parse_config(&cfg, &err)) {
    RNIC_LOG(kError, "%s; cannot open the device", err.c_str());
    return EINVAL;
  }
  auto h = std::make_unique<Host>();
  h->fork_gen_ = g_fork_generation.load(std::memory_order_relaxed);
  h->dev_entry_ = dev;
  h->cfg_ = cfg;
  int rc = 0;
  bool hosted = false;
  if (cfg.hosting != base::Hosting::kEmbedded) {
    DaemonDevice dd;
    rc = daemon_find(cfg, &dd);
    if (rc == ENOENT && cfg.hosting == base::Hosting::kAuto) {
      rc = 0;  // no daemon: embed the device
    } else if (rc == ENOENT) {
      RNIC_LOG(kError, "SOFTRNIC_HOSTING=daemon: no softrnicd answers at %s", dd.path.c_str());
      return ENODEV;
    } else if (rc != 0) {
      return rc;
    } else {
      daemon::OpenedMsg opened;
      std::vector<int> fds;
      rc = daemon_open_slot(&dd, &opened, &fds);
      if (rc != 0) {
        RNIC_LOG(kError, "softrnicd at %s refused device %s: %s", dd.path.c_str(), dd.info.name,
                 std::strerror(rc));
        close(dd.fd);
        return rc;
      }
      h->ip_ = dd.info.ip;
      h->daemon_fd_ = dd.fd;
      h->daemon_path_ = dd.path;
      h->slot_ = static_cast<uint8_t>(opened.slot);
      rc = start_device(h.get(), &dd, &opened, &fds);
      for (int f : fds) close(f);
      if (rc != 0) {
        close(dd.fd);
        return rc;
      }
      hosted = true;
    }
  }
  if (hosted) {
    // softrnicd's device: nothing to bind here.
  } else if (cfg.ip) {
    h->ip_ = *cfg.ip;
    rc = probe_bind(h->ip_);
    if (rc != 0) RNIC_LOG(kError, "cannot bind UDP %s port 4791 (SOFTRNIC_IP): %s", h->ip_.c_str(), std::strerror(rc));
    if (rc == 0) rc = start_device(h.get());
  } else {
    rc = EADDRINUSE;
    for (uint32_t a = 0x7f000002u; a < 0x7f0000ffu; ++a) {
      in_addr ip;
      ip.s_addr = htonl(a);
      int r = probe_bind(ip_str(ip));
      if (r == EADDRINUSE) continue;
      if (r != 0) {
        rc = r;
        break;
      }
      h->ip_ = ip_str(ip);
      rc = start_device(h.get());
      if (rc != EADDRINUSE) break;  // lost a race for this address: try the next one
    }
    if (rc == EADDRINUSE) RNIC_LOG(kError, "no free loopback address for UDP 4791 from 127.0.0.2");
  }
  if (rc != 0) return rc;
  h->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (h->stop_fd_ < 0) return errno;
  h->dispatcher_ = std::thread(dispatcher_main, h.get());
  h->refs_ = 1;
  g_host = h.release();
  *out = g_host;
  RNIC_LOG(kInfo, "device %s on %s port 4791", cfg.name.c_str(), g_host->ip_.c_str());
  return 0;
}

void host_left_data_path(Host* h) {
  if (h == nullptr || host_inherited(h)) return;
  if (emu::Engine* e = h->dev_->engine()) e->left_data_path();
}

void host_release(Host* host) {
  if (host == nullptr) return;
  if (host_inherited(host)) return;  // the parent's: never stop its engine from a child
  {
    std::lock_guard<std::mutex> lk(g_host_mu);
    if (--host->refs_ > 0) return;
    if (g_host == host) g_host = nullptr;
  }
  uint64_t one = 1;
  ssize_t w = write(host->stop_fd_, &one, sizeof one);
  (void)w;
  if (host->dispatcher_.joinable()) host->dispatcher_.join();
  close(host->stop_fd_);
  host->cm_.reset();  // the CM agent unhooks QP1 and joins its thread before the engine stops
  // Services go first: they stop the control socket, unhook the port filter, stop the
  // engine and close the capture (emu/services/services.h "DESTRUCTION").
  host->services_.reset();
  if (emu::Engine* e = host->dev_->engine()) e->stop();
  host->dev_->close();
  host->dev_.reset();
  // Daemon hosting: the engine (and with it the slot's sockets) is gone; closing the
  // connection hands the slot back.
  if (host->daemon_fd_ >= 0) close(host->daemon_fd_);
  delete host;
}

int host_claim_service(Host* host, uint64_t service_id, bool listen) {
  if (host == nullptr || host->daemon_fd_ < 0) return 0;
  std::lock_guard one_at_a_time(host->call_mu_);
  std::unique_lock lk(host->req_mu_);
  if (host->daemon_lost_) return EIO;
  daemon::ServiceMsg m;
  daemon::init_msg(&m, listen ? daemon::MsgType::kListen : daemon::MsgType::kUnlisten);
  m.service_id = service_id;
  m.seq = ++host->req_seq_;
  if (daemon::send_msg(host->daemon_fd_, &m, sizeof m) != 0) return EIO;
  // Requests are sent under req_mu_ and answered in order, so the reply with our number is
  // the next one (the dispatcher thread stores it).
  bool got = host->req_cv_.wait_for(lk, std::chrono::seconds(5), [&] {
    return host->daemon_lost_ || host->reply_seq_ == m.seq;
  });
  if (!got || host->daemon_lost_) return EIO;
  return host->reply_err_;
}

void host_add_context(Host* host, Context* ctx) {
  std::lock_guard<std::mutex> lk(host->ctx_mu_);
  host->contexts_.push_back(ctx);
}

void host_remove_context(Host* host, Context* ctx) {
  if (host_inherited(host)) return;  // its mutex may have been held by a thread at fork
  std::lock_guard<std::mutex> lk(host->ctx_mu_);
  auto& v = host->contexts_;
  v.erase(std::remove(v.begin(), v.end(), ctx), v.end());
}

}  // namespace rnic::shim
