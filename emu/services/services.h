// DeviceServices: the user-facing services of one open device — fault injection (FaultEngine),
// packet capture (pcap) and the runtime control socket (ControlServer) — wired onto the
// device's running Engine from the parsed configuration (base/config.h), and the ControlTarget behind
// `softrnic fault|stats|capture`.
//
// HOW A DEVICE GETS ITS SERVICES (after Engine::start, before the application posts):
//   base::Config cfg;                                       // parsed once at device open:
//   std::string err = base::parse_config(base::process_env(), &cfg);  // bad value -> fail open
//   ServicesOptions so = ServicesOptions::from_config(cfg);
//   auto svc = DeviceServices::create(dev, so, &err);       // nullptr + err -> fail open
//   ... traffic; `softrnic fault add ...`, `softrnic stats`, `softrnic capture -w f.pcap` ...
//   svc.reset();   // at device close, BEFORE the engine is stopped/destroyed (see below)
//
// CONFIGURATION (ServicesOptions::from_config; every variable is declared and parsed once in
// base/config.h — this file reads none of them from the environment)
//   SOFTRNIC_FAULTS / SOFTRNIC_FAULTS_FILE / SOFTRNIC_FAULT_SEED / SOFTRNIC_FAULT_TRACE
//       fault plan, seed and trace file (emu/fault/fault.h from_values). A bad plan is an error
//       that names the variable, file, line and column; the device must not open.
//       With no plan the engine still exists (empty) so `softrnic fault add` works later;
//       SOFTRNIC_FAULT_TRACE without a plan traces those run-time rules.
//   SOFTRNIC_SECURE_KEYS=0|1   secure keys (DeviceConfig::secure_keys; applied by create()
//       before any MR exists). SOFTRNIC_STRICT_SRC=0|1 strict source check, latching each
//       RC/UC QP's first-seen UDP source port; SOFTRNIC_STRICT_SRC_PORT=N strict with that
//       fixed source port (4791 = softrnic peers). DeviceConfig::strict_src documents both.
//       A bad value is an error naming the variable.
//   SOFTRNIC_PCAP=file      capture from the start ("%p" -> pid). Cannot open -> error.
//   SOFTRNIC_STATS_AT_EXIT=file  at device close (after the engine stopped, so every packet
//       is counted) the `stats` lines go to this file ("%p" -> pid), written to file.tmp and
//       renamed, so a reader never sees half of it. Tests read final counters from it; a
//       sampler of the control socket can miss the end of a short run.
//   SOFTRNIC_CONTROL=on|off|required   (default on) the control socket in the runtime dir
//       (emu/services/control.h). on: failure to open it prints one warning line on stderr and the
//       device works without it. required: failure is an error. off: no socket.
//
// THE PACKET FILTER. The port has one PacketFilter slot; DeviceServices installs ONE filter
// that chains capture and faults, and only while something needs it (at least one fault
// rule, or a capture running): with no rule and no capture the port runs unfiltered (and
// keeps its GSO path). Order, per direction:
//   tx: faults first, then capture of what actually leaves: nothing for a drop, the
//       (possibly rewritten/truncated) bytes once for a pass, 1+copies times for a
//       duplicate, once (at decision time) for a delay; packets the fault engine holds for
//       reordering or synthesizes are captured when drain() sends them through the port.
//   rx: capture what arrived on the wire (before any fault), then faults. NAKs the fault
//       engine synthesizes toward this device's own requester never crossed the wire and
//       are not captured.
//   Frames are written with IP ID 0 (UdpPort does not report the received ID and the
//   engine does not use GSO while a filter is installed), so their ICRC verifies. Exception:
//   a GSO batch the engine built just before the filter was installed (capture start / first
//   rule, while traffic flows) goes out as plain datagrams whose ICRC was computed for IP ID k;
//   those few frames fail an ICRC check in the pcap.
//   COST (measured on this 2-core machine, loopback UDP): installing the filter turns off the
//   engine's GSO and copies every packet; 64 KiB RDMA WRITEs over loopback UDP went from
//   3.7-5.6 Gb/s to 1.65 Gb/s with the filter and 1.1-1.2 Gb/s with capture to tmpfs. Hence
//   the filter is installed only while a rule or a capture exists (fault clear / capture stop
//   remove it again).
//
// THREADING. Every public method is thread-safe. on_packet (the data path) takes no lock
// of its own: a relaxed load decides whether capture is on; the capture writer is reached
// through a mutex only while capturing; faults take the FaultEngine's own lock only for
// packets a rule may match. capture_start/stop swap the writer while packets flow: a
// packet in flight either lands in the old file (before stop returns) or is not captured.
//
// DESTRUCTION. ~DeviceServices stops the control server, stops the engine (joins its
// progress thread and detaches its hooks: services are torn down with the device; not done
// when create() failed, where the engine is left running and untouched), removes
// the filter from the port, unhooks the fault engine from the Engine, waits until no
// packet is inside the filter, then closes the capture. REQUIRES: no verbs call is running
// on the device (the application is closing it).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/config.h"
#include "emu/services/control.h"
#include "emu/fault/fault.h"
#include "wire/pcap.h"
#include "wire/port.h"

namespace rnic::emu {

class Device;
class Engine;

enum class ControlMode : uint8_t { kOff, kOn, kRequired };

struct ServicesOptions {
  // Fault plan inputs, as the raw values of the variables (nullopt = unset).
  std::optional<std::string> faults, faults_file, fault_seed, fault_trace;
  // Capture file pattern ("%p" -> pid); empty = no capture at start.
  std::string pcap;
  // Counters file written at device close ("%p" -> pid); empty = none.
  std::string stats_at_exit;
  ControlMode control = ControlMode::kOn;
  // Hardening from the environment (nullopt = leave the device's DeviceConfig value).
  std::optional<bool> secure_keys;
  std::optional<bool> strict_src;
  uint16_t strict_src_port = 0;  // with strict_src: 0 = latch first-seen port
  std::optional<bool> rc_stash;  // SOFTRNIC_RC_STASH (Device::set_rc_stash)
  ControlServer::Options control_opts;  // runtime_dir etc. (empty = control_runtime_dir())
  // Install the filter even with no rule and no capture (measurements, tests).
  bool always_filter = false;
  // Print the best-effort control-socket warning on stderr (tests turn it off and read
  // DeviceServices::warning()).
  bool warn_stderr = true;

  // The services' part of an already-parsed configuration (base/config.h): fault plan, seed
  // (as decimal text), trace, capture, control mode and hardening. The plan is checked by
  // create().
  static ServicesOptions from_config(const base::Config& cfg);
  // base::parse_config of the variables above from the environment, then from_config.
  // Returns "" or an error naming the variable (kept for tests and tools).
  static std::string from_env(ServicesOptions* out);
};

class DeviceServices final : public ControlTarget, private wire::PacketFilter {
 public:
  // REQUIRES: dev has a running engine (dev->engine() != nullptr). Returns nullptr and
  // *err for: secure_keys requested after an MR/MW key was issued, a bad fault plan/seed/trace file, a capture file that cannot be opened, or
  // (control == kRequired) a control socket that cannot be opened.
  static std::unique_ptr<DeviceServices> create(const std::shared_ptr<Device>& dev,
                                                const ServicesOptions& opt, std::string* err);
  ~DeviceServices() override;
  DeviceServices(const DeviceServices&) = delete;
  DeviceServices& operator=(const DeviceServices&) = delete;

  FaultEngine& faults() { return *faults_; }
  // The control server, or nullptr (off, or failed in kOn mode).
  ControlServer* control() { return server_.get(); }
  // "" or the reason the control socket is missing in kOn mode.
  const std::string& warning() const { return warning_; }
  // Whether the chained filter is currently installed on the port.
  bool filter_installed() const { return installed_.load(std::memory_order_acquire); }
  // Frames written to the current capture (0 if none).
  uint64_t capture_packets() const;

  // ---- ControlTarget ----
  std::string device_name() const override;
  std::string fault_add(std::string_view plan) override;
  std::vector<FaultRuleInfo> fault_list() override;
  void fault_clear() override;
  // Device: engine counters (append_counter_stats), then the fault totals
  // (append_fault_stats), then port_* and capture_packets. QP: that QP's counters.
  std::string stats(std::optional<uint32_t> qpn, StatList* out) override;
  std::string capture_start(std::string_view path) override;
  std::string capture_stop() override;

 private:
  explicit DeviceServices(std::shared_ptr<Device> dev);
  // wire::PacketFilter (private: only the port calls it).
  // always_filter and a capture see both directions; else the fault engine says
  // (FaultEngine::wants).
  bool wants(wire::Direction dir) const override;
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint& src,
                          const wire::Endpoint& dst, std::span<uint8_t> roce,
                          wire::FilterOut& out) override;
  void capture(const wire::Endpoint& src, const wire::Endpoint& dst,
               std::span<const uint8_t> bytes, unsigned times);
  // Installs or removes the filter to match (rules || capture || always). Takes cfg_mu_.
  void update_filter_locked();
  void write_stats_at_exit();
  std::optional<uint32_t> resolve_qpn(wire::Direction dir, uint32_t dest_qpn) const;

  std::shared_ptr<Device> dev_;
  Engine* engine_ = nullptr;
  std::unique_ptr<FaultEngine> faults_;
  std::unique_ptr<ControlServer> server_;
  std::string warning_;
  bool always_filter_ = false;
  std::string stats_at_exit_;  // ServicesOptions::stats_at_exit
  bool stop_engine_ = false;  // set once create() succeeded

  std::mutex cfg_mu_;                // capture start/stop, rule changes, filter install
  std::atomic<bool> installed_{false};
  std::atomic<bool> capturing_{false};
  mutable std::mutex cap_mu_;        // guards cap_ (the pointer, not the writes)
  std::shared_ptr<wire::PcapWriter> cap_;
  std::atomic<uint32_t> inflight_{0};  // threads inside on_packet
};

}  // namespace rnic::emu
