// DeviceServices: fault engine + capture + control socket of one open device, chained onto
// the engine's port as one PacketFilter (see services.h for the contract).
#include "emu/services/services.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/log.h"
#include "emu/fault/fault_rules.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/objects/qp.h"

namespace rnic::emu {

// ---------------------------------------------------------------- options

ServicesOptions ServicesOptions::from_config(const base::Config& c) {
  ServicesOptions o;
  auto opt = [](const std::string& v) { return v.empty() ? std::nullopt : std::optional(v); };
  o.faults = opt(c.faults);
  o.faults_file = opt(c.faults_file);
  o.fault_trace = opt(c.fault_trace);
  // Decimal text of the already-parsed seed, so the fault engine reads exactly this number.
  if (c.fault_seed) o.fault_seed = std::to_string(*c.fault_seed);
  o.pcap = c.pcap;
  o.stats_at_exit = c.stats_at_exit;
  o.secure_keys = c.secure_keys;
  o.strict_src = c.strict_src;
  o.strict_src_port = c.strict_src_port;
  o.rc_stash = c.rc_stash;
  switch (c.control) {
    case base::ControlSocket::kOn: o.control = ControlMode::kOn; break;
    case base::ControlSocket::kOff: o.control = ControlMode::kOff; break;
    case base::ControlSocket::kRequired: o.control = ControlMode::kRequired; break;
  }
  return o;
}

std::string ServicesOptions::from_env(ServicesOptions* out) {
  static constexpr std::string_view kVars[] = {
      "SOFTRNIC_FAULTS",      "SOFTRNIC_FAULTS_FILE", "SOFTRNIC_FAULT_SEED",
      "SOFTRNIC_FAULT_TRACE", "SOFTRNIC_PCAP",        "SOFTRNIC_SECURE_KEYS",
      "SOFTRNIC_STRICT_SRC",  "SOFTRNIC_STRICT_SRC_PORT", "SOFTRNIC_CONTROL",
      "SOFTRNIC_RC_STASH",    "SOFTRNIC_STATS_AT_EXIT"};
  base::Config c;
  if (std::string e = base::parse_config(base::process_env(), &c, kVars); !e.empty()) return e;
  *out = from_config(c);
  return "";
}

// ---------------------------------------------------------------- lifetime

DeviceServices::DeviceServices(std::shared_ptr<Device> dev) : dev_(std::move(dev)) {}

std::unique_ptr<DeviceServices> DeviceServices::create(const std::shared_ptr<Device>& dev,
                                                       const ServicesOptions& opt,
                                                       std::string* err) {
  err->clear();
  if (dev == nullptr || dev->engine() == nullptr) {
    *err = "device services: the device has no running engine";
    return nullptr;
  }
  if (opt.secure_keys && !dev->set_secure_keys(*opt.secure_keys).is_ok()) {
    *err = "SOFTRNIC_SECURE_KEYS: cannot change the key mode after memory was registered";
    return nullptr;
  }
  if (opt.strict_src) dev->set_strict_src(*opt.strict_src, opt.strict_src_port);
  if (opt.rc_stash) dev->set_rc_stash(*opt.rc_stash);
  std::unique_ptr<DeviceServices> s(new DeviceServices(dev));
  s->always_filter_ = opt.always_filter;
  s->stats_at_exit_ = opt.stats_at_exit;

  auto c = [](const std::optional<std::string>& v) { return v ? v->c_str() : nullptr; };
  std::string e = FaultEngine::from_values(c(opt.faults), c(opt.faults_file), c(opt.fault_seed),
                                           c(opt.fault_trace), &s->faults_);
  if (!e.empty()) {
    *err = e;
    return nullptr;
  }
  if (s->faults_ == nullptr) {
    // No plan: an empty engine, so `softrnic fault add` works later. from_values validated
    // the seed already.
    uint64_t seed = FaultEngine::kDefaultSeed;
    if (opt.fault_seed && !opt.fault_seed->empty()) (void)parse_fault_u64(*opt.fault_seed, &seed);
    s->faults_ = std::make_unique<FaultEngine>(seed);
  }
  s->engine_ = dev->engine();
  DeviceServices* self = s.get();
  s->faults_->set_qpn_resolver([self](wire::Direction d, const wire::Endpoint&,
                                      const wire::Endpoint&, uint32_t q) {
    return self->resolve_qpn(d, q);
  });
  // The engine drains what the fault engine holds or synthesizes; update_filter_locked (below)
  // hooks it on with the filter, before the application's traffic starts.

  {
    std::lock_guard lk(s->cfg_mu_);
    if constexpr (!wire::kFaultInjection) {
      // Capture rides on the packet hook (wire/port.cc set_filter); without it the file
      // would stay empty. Refused like `capture start` (capture_start below).
      if (!opt.pcap.empty()) {
        *err = "SOFTRNIC_PCAP: capture needs the packet hook (built with -Dfault_injection=false)";
        return nullptr;
      }
    }
    if (!opt.pcap.empty()) {
      int en = 0;
      std::unique_ptr<wire::PcapWriter> w = wire::PcapWriter::open(opt.pcap, &en);
      if (w == nullptr) {
        *err = "SOFTRNIC_PCAP: cannot open \"" + wire::expand_pcap_path(opt.pcap) +
               "\": " + std::strerror(en != 0 ? en : EIO);
        return nullptr;  // ~DeviceServices unhooks the fault engine (engine left running)
      }
      std::lock_guard ck(s->cap_mu_);
      s->cap_ = std::move(w);
      s->capturing_.store(true, std::memory_order_release);
    }
    s->update_filter_locked();
  }

  if (opt.control != ControlMode::kOff) {
    std::string cerr;
    s->server_ = ControlServer::open(s.get(), opt.control_opts, &cerr);
    if (s->server_ != nullptr) {
      cerr = s->server_->start_thread();
      if (!cerr.empty()) s->server_.reset();
    }
    if (s->server_ == nullptr) {
      if (opt.control == ControlMode::kRequired) {
        *err = "SOFTRNIC_CONTROL=required: control socket: " + cerr;
        return nullptr;  // ~DeviceServices removes the filter and the hook (engine left running)
      }
      s->warning_ = "control socket unavailable (" + cerr +
                    "); `softrnic fault|stats|capture` cannot reach this device";
      if (opt.warn_stderr) std::fprintf(stderr, "softrnic: warning: %s\n", s->warning_.c_str());
    }
  }
  s->stop_engine_ = true;
  return s;
}

DeviceServices::~DeviceServices() {
  if (server_ != nullptr) server_->stop();
  server_.reset();
  // Services go away with the device: stop the engine first so neither its progress
  // thread nor its hooks reach the port, the filter or the fault engine any more.
  if (engine_ != nullptr) {
    if (stop_engine_) engine_->stop();
    engine_->port().set_filter(nullptr);
    installed_.store(false, std::memory_order_release);
    engine_->set_fault_engine(nullptr);
  }
  if (engine_ != nullptr && stop_engine_ && !stats_at_exit_.empty()) write_stats_at_exit();
  // A thread that loaded the filter pointer just before it was cleared may still be
  // entering on_packet: wait until none is inside, twice across a yield.
  for (int quiet = 0; quiet < 2;) {
    if (inflight_.load(std::memory_order_acquire) == 0) {
      ++quiet;
    } else {
      quiet = 0;
    }
    std::this_thread::yield();
  }
  std::shared_ptr<wire::PcapWriter> w;
  {
    std::lock_guard ck(cap_mu_);
    w = std::move(cap_);
    capturing_.store(false, std::memory_order_release);
  }
  if (w != nullptr) w->close();
}

// The final counters (engine stopped: nothing moves any more) to stats_at_exit_ via a
// temporary file and rename. A failure is logged, never fatal: the device is closing.
void DeviceServices::write_stats_at_exit() {
  StatList list;
  if (!stats(std::nullopt, &list).empty()) return;
  std::string path = wire::expand_pcap_path(stats_at_exit_);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
  if (f == nullptr) {
    int en = errno;
    if (fd >= 0) ::close(fd);
    RNIC_LOG(kError, "SOFTRNIC_STATS_AT_EXIT: cannot write \"%s\": %s", tmp.c_str(),
             std::strerror(en));
    return;
  }
  bool ok = true;
  for (const auto& [name, value] : list) {
    ok = ok && std::fprintf(f, "%s %llu\n", name.c_str(),
                            static_cast<unsigned long long>(value)) > 0;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    RNIC_LOG(kError, "SOFTRNIC_STATS_AT_EXIT: cannot write \"%s\": %s", path.c_str(),
             std::strerror(errno));
    (void)::unlink(tmp.c_str());
  }
}

// ---------------------------------------------------------------- filter

void DeviceServices::update_filter_locked() {
  bool want = always_filter_ || capturing_.load(std::memory_order_acquire) ||
              !faults_->list().empty() || faults_->pending() != 0;
  if (want == installed_.load(std::memory_order_acquire)) return;
  // The engine sees the fault engine only while the filter is wanted: an attached one turns
  // off the engine's busy-poll hand-off and its receive spin (a held packet needs the
  // progress thread's timed wake-up), which every device paid for when it was attached
  // from create() with no rule (strace of ib_send_lat: one epoll_wait per packet, no
  // hand-off). Detached only with nothing held (want includes pending()).
  engine_->set_fault_engine(want ? faults_.get() : nullptr);
  // set_filter refuses a filter when the hook is compiled out (-Dfault_injection=false):
  // filter_installed() then says so.
  bool set = engine_->port().set_filter(want ? static_cast<wire::PacketFilter*>(this) : nullptr);
  installed_.store(want && set, std::memory_order_release);
}

bool DeviceServices::wants(wire::Direction dir) const {
  return always_filter_ || capturing_.load(std::memory_order_acquire) || faults_->wants(dir);
}

wire::Verdict DeviceServices::on_packet(wire::Direction dir, const wire::Endpoint& src,
                                        const wire::Endpoint& dst, std::span<uint8_t> roce,
                                        wire::FilterOut& out) {
  inflight_.fetch_add(1, std::memory_order_acq_rel);
  bool cap = capturing_.load(std::memory_order_relaxed);
  wire::Verdict v;
  if (dir == wire::Direction::kRx) {
    if (cap) capture(src, dst, roce, 1);
    v = faults_->on_packet(dir, src, dst, roce, out);
  } else {
    v = faults_->on_packet(dir, src, dst, roce, out);
    if (cap) {
      uint32_t len = std::min<uint32_t>(out.len, static_cast<uint32_t>(roce.size()));
      switch (v) {
        case wire::Verdict::kPass:
        case wire::Verdict::kDelay:
          capture(src, dst, roce.first(len), 1);
          break;
        case wire::Verdict::kDuplicate:
          capture(src, dst, roce.first(len), 1u + out.copies);
          break;
        case wire::Verdict::kDrop:
          break;
      }
    }
  }
  inflight_.fetch_sub(1, std::memory_order_acq_rel);
  return v;
}

void DeviceServices::capture(const wire::Endpoint& src, const wire::Endpoint& dst,
                             std::span<const uint8_t> bytes, unsigned times) {
  std::shared_ptr<wire::PcapWriter> w;
  {
    std::lock_guard ck(cap_mu_);
    w = cap_;
  }
  if (w == nullptr) return;
  for (unsigned i = 0; i < times; ++i) w->write_packet(src, dst, bytes, 0);
}

// rx: the matched packet is addressed to our QP dest_qpn; a synthesized NAK goes to that
// QP's peer. tx: the local QP sending to a remote QPN cannot be found without a scan (no
// QP enumeration in Device): unresolved, the rule must name qpn= itself. The QP lock is only
// tried (this runs under the fault engine's lock, possibly inside another QP's lock).
std::optional<uint32_t> DeviceServices::resolve_qpn(wire::Direction dir, uint32_t dest_qpn) const {
  if (dir != wire::Direction::kRx) return std::nullopt;
  std::shared_ptr<Qp> qp = dev_->find_qp(dest_qpn);
  if (qp == nullptr) return std::nullopt;
  std::unique_lock lk(qp->recv_mutex(), std::try_to_lock);
  if (!lk.owns_lock()) return std::nullopt;
  return qp->attr().dest_qp_num;
}

// ---------------------------------------------------------------- ControlTarget

std::string DeviceServices::device_name() const { return dev_->name(); }

std::string DeviceServices::fault_add(std::string_view plan) {
  std::lock_guard lk(cfg_mu_);
  std::string e = faults_->add_rules(plan, "control");
  update_filter_locked();
  return e;
}

std::vector<FaultRuleInfo> DeviceServices::fault_list() { return faults_->list(); }

void DeviceServices::fault_clear() {
  std::lock_guard lk(cfg_mu_);
  faults_->clear();
  // Held reorder packets were released to the drain queue; the engine drains them after
  // its next port I/O. Keep the filter until nothing is pending (it costs nothing extra);
  // the next rule change or capture stop re-evaluates.
  update_filter_locked();
}

std::string DeviceServices::stats(std::optional<uint32_t> qpn, StatList* out) {
  if (qpn) {
    std::shared_ptr<Qp> qp = dev_->find_qp(*qpn);
    if (qp == nullptr) return "no QP " + std::to_string(*qpn) + " on " + dev_->name();
    append_counter_stats(qp->comp_.ctr, out);
    return "";
  }
  append_counter_stats(engine_->counters(), out);
  append_fault_stats(faults_->counters(), out);
  wire::PortCounters pc = engine_->port().counters();
  out->emplace_back("port_tx_packets", pc.tx_packets);
  out->emplace_back("port_tx_bytes", pc.tx_bytes);
  out->emplace_back("port_tx_errors", pc.tx_errors);
  out->emplace_back("port_rx_packets", pc.rx_packets);
  out->emplace_back("port_rx_bytes", pc.rx_bytes);
  out->emplace_back("port_rx_dropped", pc.rx_dropped);
  out->emplace_back("port_filter_dropped", pc.filter_dropped);
  out->emplace_back("port_filter_duplicated", pc.filter_duplicated);
  out->emplace_back("port_filter_delayed", pc.filter_delayed);
  out->emplace_back("capture_packets", capture_packets());
  return "";
}

uint64_t DeviceServices::capture_packets() const {
  std::lock_guard ck(cap_mu_);
  return cap_ != nullptr ? cap_->packets() : 0;
}

std::string DeviceServices::capture_start(std::string_view path) {
  if constexpr (!wire::kFaultInjection) {
    return "capture needs the packet hook (built with -Dfault_injection=false)";
  }
  std::lock_guard lk(cfg_mu_);
  if (capturing_.load(std::memory_order_acquire)) return "already capturing (capture stop first)";
  if (path.empty()) return "capture start: empty path";
  int en = 0;
  std::unique_ptr<wire::PcapWriter> w = wire::PcapWriter::open(path, &en);
  if (w == nullptr) {
    return "cannot open \"" + wire::expand_pcap_path(path) + "\": " + std::strerror(en != 0 ? en : EIO);
  }
  {
    std::lock_guard ck(cap_mu_);
    cap_ = std::move(w);
  }
  capturing_.store(true, std::memory_order_release);
  update_filter_locked();
  return "";
}

std::string DeviceServices::capture_stop() {
  std::shared_ptr<wire::PcapWriter> w;
  {
    std::lock_guard lk(cfg_mu_);
    if (!capturing_.load(std::memory_order_acquire)) return "not capturing";
    capturing_.store(false, std::memory_order_release);
    {
      std::lock_guard ck(cap_mu_);
      w = std::move(cap_);
    }
    update_filter_locked();
  }
  // A writer still held by a packet in flight finishes that write, then the file is
  // flushed and closed here; later writes to the closed writer are refused.
  if (w != nullptr) w->close();
  return "";
}

}  // namespace rnic::emu
