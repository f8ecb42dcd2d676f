// Runtime control of the embedded device: the ControlTarget behind `softrnic stats|fault|
// capture` (a per-process control socket), SOFTRNIC_FAULTS* fault plans and SOFTRNIC_PCAP
// capture, all plugged into the engine's port through one PacketFilter (the "tap").
// Contract: the tap is installed on the port only while faults or a capture are active,
// so the default data path keeps UDP GSO and pays nothing.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "emu/control.h"
#include "emu/engine.h"
#include "emu/fault.h"
#include "wire/pcap.h"
#include "wire/port.h"

namespace rnic::shim {

class DeviceControl final : public emu::ControlTarget, public wire::PacketFilter {
 public:
  // dev must have an engine. Does not install anything yet.
  explicit DeviceControl(std::shared_ptr<emu::Device> dev);
  ~DeviceControl() override;

  // Applies SOFTRNIC_FAULTS / _FILE / _SEED / _TRACE and SOFTRNIC_PCAP (pcap may be empty).
  // Returns "" or a message naming the variable (the caller fails the open with EINVAL).
  std::string apply_env(const std::string& pcap);
  // Opens the control socket and its thread. Returns "" or a message (not fatal).
  std::string serve();
  // Detaches from the port and stops serving; call before the engine stops. Idempotent.
  void shutdown();

  // ControlTarget
  std::string device_name() const override;
  std::string fault_add(std::string_view plan) override;
  std::vector<emu::FaultRuleInfo> fault_list() override;
  void fault_clear() override;
  std::string stats(std::optional<uint32_t> qpn, emu::StatList* out) override;
  std::string capture_start(std::string_view path) override;
  std::string capture_stop() override;

  // PacketFilter (thread-safe; called by every sender and the receiver while installed).
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint& src,
                          const wire::Endpoint& dst, std::span<uint8_t> roce,
                          wire::FilterOut& out) override;

 private:
  // REQUIRES: mu_ held. Installs the tap iff faults or capture are active.
  void update_filter_locked();
  std::string ensure_faults_locked();

  std::shared_ptr<emu::Device> dev_;
  emu::Engine* eng_;
  std::mutex mu_;  // control path only
  std::unique_ptr<emu::FaultEngine> faults_;
  std::atomic<emu::FaultEngine*> faults_live_{nullptr};
  std::unique_ptr<wire::PcapWriter> pcap_;
  std::atomic<wire::PcapWriter*> pcap_live_{nullptr};
  std::unique_ptr<wire::PcapWriter> retired_pcap_;  // kept until shutdown: in-flight writers
  bool installed_ = false;
  std::unique_ptr<emu::ControlServer> server_;
};

}  // namespace rnic::shim
