// The embedded device's runtime control: fault plans, pcap capture and the control socket.
#include "verbs_shim/control.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace rnic::shim {

DeviceControl::DeviceControl(std::shared_ptr<emu::Device> dev)
    : dev_(std::move(dev)), eng_(dev_->engine()) {}

DeviceControl::~DeviceControl() { shutdown(); }

std::string DeviceControl::apply_env(const std::string& pcap) {
  std::lock_guard<std::mutex> lk(mu_);
  const char* plan = std::getenv("SOFTRNIC_FAULTS");
  const char* file = std::getenv("SOFTRNIC_FAULTS_FILE");
  const char* seed = std::getenv("SOFTRNIC_FAULT_SEED");
  const char* trace = std::getenv("SOFTRNIC_FAULT_TRACE");
  std::unique_ptr<emu::FaultEngine> f;
  std::string err = emu::FaultEngine::from_values(plan, file, seed, trace, &f);
  if (!err.empty()) return err;
  if (f) {
    faults_ = std::move(f);
    faults_live_.store(faults_.get(), std::memory_order_release);
    eng_->set_fault_engine(faults_.get());
  }
  if (!pcap.empty()) {
    int e = 0;
    pcap_ = wire::PcapWriter::open(pcap, &e);
    if (!pcap_) return "SOFTRNIC_PCAP='" + pcap + "': cannot open: " + std::strerror(e ? e : EIO);
    pcap_live_.store(pcap_.get(), std::memory_order_release);
  }
  update_filter_locked();
  return "";
}

std::string DeviceControl::serve() {
  std::string err;
  auto s = emu::ControlServer::open(this, &err);
  if (!s) return err;
  err = s->start_thread();
  if (!err.empty()) return err;
  server_ = std::move(s);
  return "";
}

void DeviceControl::shutdown() {
  if (server_) {
    server_->stop();
    server_.reset();
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (installed_) {
    eng_->port().set_filter(nullptr);
    installed_ = false;
  }
  if (pcap_) pcap_->flush();
}

void DeviceControl::update_filter_locked() {
  bool want = faults_live_.load() != nullptr || pcap_live_.load() != nullptr;
  if (want == installed_) return;
  eng_->port().set_filter(want ? this : nullptr);
  installed_ = want;
}

std::string DeviceControl::ensure_faults_locked() {
  if (faults_) return "";
  faults_ = std::make_unique<emu::FaultEngine>();
  faults_live_.store(faults_.get(), std::memory_order_release);
  eng_->set_fault_engine(faults_.get());
  return "";
}

std::string DeviceControl::device_name() const { return dev_->name(); }

std::string DeviceControl::fault_add(std::string_view plan) {
  std::lock_guard<std::mutex> lk(mu_);
  ensure_faults_locked();
  std::string err = faults_->add_rules(plan, "control");
  update_filter_locked();
  return err;
}

std::vector<emu::FaultRuleInfo> DeviceControl::fault_list() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!faults_) return {};
  return faults_->list();
}

void DeviceControl::fault_clear() {
  std::lock_guard<std::mutex> lk(mu_);
  if (faults_) faults_->clear();
}

std::string DeviceControl::stats(std::optional<uint32_t> qpn, emu::StatList* out) {
  if (!qpn) {
    emu::append_counter_stats(eng_->counters(), out);
    std::lock_guard<std::mutex> lk(mu_);
    if (faults_) emu::append_fault_stats(faults_->counters(), out);
    return "";
  }
  std::shared_ptr<emu::Qp> qp = dev_->find_qp(*qpn);
  if (!qp) return "no QP " + std::to_string(*qpn);
  emu::append_counter_stats(qp->comp_.ctr, out);
  return "";
}

std::string DeviceControl::capture_start(std::string_view path) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pcap_live_.load() != nullptr) return "already capturing to " + pcap_->path();
  int e = 0;
  auto w = wire::PcapWriter::open(path, &e);
  if (!w) return "cannot open " + std::string(path) + ": " + std::strerror(e ? e : EIO);
  if (pcap_) retired_pcap_ = std::move(pcap_);
  pcap_ = std::move(w);
  pcap_live_.store(pcap_.get(), std::memory_order_release);
  update_filter_locked();
  return "";
}

std::string DeviceControl::capture_stop() {
  std::lock_guard<std::mutex> lk(mu_);
  wire::PcapWriter* w = pcap_live_.exchange(nullptr);
  if (w == nullptr) return "not capturing";
  update_filter_locked();
  // Senders already inside on_packet may still hold w: flush now, free at shutdown.
  w->flush();
  return "";
}

wire::Verdict DeviceControl::on_packet(wire::Direction dir, const wire::Endpoint& src,
                                       const wire::Endpoint& dst, std::span<uint8_t> roce,
                                       wire::FilterOut& out) {
  wire::PcapWriter* w = pcap_live_.load(std::memory_order_acquire);
  // Received packets are captured as they arrived, before any injected fault.
  if (w != nullptr && dir == wire::Direction::kRx) w->write_packet(src, dst, roce);
  wire::Verdict v = wire::Verdict::kPass;
  if (emu::FaultEngine* f = faults_live_.load(std::memory_order_acquire)) {
    v = f->on_packet(dir, src, dst, roce, out);
  }
  // Sent packets are captured as they leave (after faults rewrote or truncated them).
  if (w != nullptr && dir == wire::Direction::kTx && v != wire::Verdict::kDrop) {
    w->write_packet(src, dst, roce.first(out.len < roce.size() ? out.len : roce.size()));
  }
  return v;
}

}  // namespace rnic::shim
