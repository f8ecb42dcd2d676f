// SOFTRNIC_* environment configuration of the shim, and its stderr logger.
// Contract: parsing never prints to stdout and never aborts; a bad value yields a
// message naming the variable, and the caller fails the verb with EINVAL.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>

namespace rnic::shim {

// Log levels, ordered; SOFTRNIC_LOG picks the threshold (default kError).
enum class LogLevel : int { kOff = 0, kError, kWarn, kInfo, kDebug, kTrace };

// One device's configuration as read from the environment.
struct Config {
  std::string name = "softrnic0";  // SOFTRNIC_NAME: [A-Za-z0-9_.-], 1..63 chars
  bool ip_set = false;             // SOFTRNIC_IP given?
  in_addr ip{};                    // SOFTRNIC_IP: IPv4 bind address (network order)
  uint32_t mtu = 0;                // SOFTRNIC_MTU: 256..4096 (power of two); 0 = from interface
  LogLevel log = LogLevel::kError; // SOFTRNIC_LOG: off|error|warn|info|debug|trace or 0..5
  std::string pcap;                // SOFTRNIC_PCAP: capture file, "%p" -> pid; empty = off
  // Hardening (validated here so a bad value fails the open naming the variable; applied to
  // the device by emu::DeviceServices from the same variables, see emu/services/services.h).
  bool secure_keys = false;        // SOFTRNIC_SECURE_KEYS: 0|1 -> DeviceConfig::secure_keys
  bool strict_src = false;         // SOFTRNIC_STRICT_SRC: 0|1 -> DeviceConfig::strict_src
  uint16_t strict_src_port = 0;    // SOFTRNIC_STRICT_SRC_PORT: 1..65535 (implies strict_src)
};

// Reads only SOFTRNIC_NAME. Returns false and fills *err when it is invalid.
bool parse_name(std::string* name, std::string* err);

// Reads every SOFTRNIC_* variable. Returns false and fills *err (which names the
// variable) on the first invalid one.
bool parse_config(Config* cfg, std::string* err);

// Current log threshold (from SOFTRNIC_LOG, read lazily; invalid -> kError).
LogLevel log_level();

// printf-style logging to stderr when `level` <= log_level(). Never stdout.
void log_msg(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Unconditional error line to stderr ("softrnic: ..."), used for configuration errors.
void log_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace rnic::shim
