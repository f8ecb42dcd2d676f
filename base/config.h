// base/config.h: the one declaration of every environment variable softrnic reads (name, type,
// default, help, reader), the one parser for all of them, the unknown-variable warning, and
// the generated table behind `softrnic help` and the README's "Configuration" section.
//
// RULES (one set for every variable):
//  - Names are case-sensitive and upper case, as the environment is. A SOFTRNIC_* name that is
//    not declared — including one that differs only by case, e.g. softrnic_log — is unknown:
//    one warning per process, naming the closest declared name (edit distance).
//  - Keyword values (bool, enum, log level) are matched case-insensitively: ON, On and on are
//    one value. Free-form values (name, path, fault plan) are kept exactly as given.
//  - bool: 1|on|yes|true or 0|off|no|false. u32: decimal digits only. seed (u64): decimal or
//    0x-hex; a leading zero is still decimal ("010" is ten) — never octal.
//  - An empty value means "unset" (the default) unless the declaration says empty_is_error.
//  - A bad value is an error that names the variable, its value and what was expected; the
//    shim then fails ibv_open_device with EINVAL (verbs_shim/host.cc).
//
// COST: parsing happens once per device open (and once per device list for SOFTRNIC_NAME);
// nothing on the per-packet path reads a Config or calls into this file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/log.h"

namespace rnic::base {

enum class VarType : uint8_t {
  kName,     // [A-Za-z0-9_.-], 1..63 characters
  kString,   // anything (fault plans, script settings)
  kPath,     // a file or directory path
  kBool,     // 0|1 (see RULES)
  kU32,      // decimal in [min, max]; pow2 -> a power of two
  kSeed,     // u64, decimal or 0x-hex
  kEnum,     // one of choices ("on,off,required")
  kIp,       // a unicast IPv4 or IPv6 address (IPv6 link-local: with %interface)
  kLevel,    // a base::LogLevel name or 0..5
};

// The control socket mode of SOFTRNIC_CONTROL (emu/services/services.h maps it).
enum class ControlSocket : uint8_t { kOn = 0, kOff, kRequired };

// SOFTRNIC_GSO: whether the engine sends UDP GSO batches (verbs_shim/host.cc decides kAuto).
enum class GsoMode : uint8_t { kAuto = 0, kOn, kOff };

// SOFTRNIC_HOSTING: where the device lives (verbs_shim/daemon_client.h).
enum class Hosting : uint8_t { kAuto = 0, kDaemon, kEmbedded };

// SOFTRNIC_PIN: how registered pages are held (emu/objects/pin.h; the shim maps it).
enum class PinMode : uint8_t { kShadow = 0, kDirect };

// SOFTRNIC_SPIN_US default: the progress thread's busy-poll budget after traffic.
inline constexpr uint32_t kDefaultSpinUs = 20;
// SOFTRNIC_BUSY_POLL_US default: the busy-poll hand-off's lease (EngineConfig::busy_poll_ns).
inline constexpr uint32_t kDefaultBusyPollUs = 2000;
// SOFTRNIC_BUSY_POLL_LATE default: late empty polls per lease that keep the polls' receive
// (EngineConfig::busy_poll_late_polls).
inline constexpr uint32_t kDefaultBusyPollLate = 1;
// SOFTRNIC_TX_DEFER default: packets in flight at which a post waits for the next ACK.
inline constexpr uint32_t kDefaultTxDefer = 1;
// SOFTRNIC_ACK_HOLD_US default: how long an owed ACK waits for a post to carry it.
inline constexpr uint32_t kDefaultAckHoldUs = 50;
inline constexpr uint32_t kDefaultLingerUs = 5;
// SOFTRNIC_RX_MARK_PCT default: receive-queue fill (percent) at which requests draw CNPs.
inline constexpr uint32_t kDefaultRxMarkPct = 85;

// Every parsed value. A field is read by the component named in its declaration's reader.
struct Config {
  std::string name = "softrnic0";            // SOFTRNIC_NAME (shim)
  bool name_set = false;                     // SOFTRNIC_NAME was given (daemon hosting picks by name)
  std::optional<std::string> ip;             // SOFTRNIC_IP as given, IPv4 or IPv6 (shim)
  uint32_t mtu = 0;                          // SOFTRNIC_MTU, 0 = from the interface (shim)
  GsoMode gso = GsoMode::kAuto;              // SOFTRNIC_GSO (shim)
  PinMode pin = PinMode::kShadow;            // SOFTRNIC_PIN (shim)
  Hosting hosting = Hosting::kAuto;          // SOFTRNIC_HOSTING (shim)
  uint32_t spin_us = kDefaultSpinUs;         // SOFTRNIC_SPIN_US (shim -> EngineConfig::spin_ns)
  uint32_t busy_poll_us = kDefaultBusyPollUs;  // SOFTRNIC_BUSY_POLL_US (shim -> busy_poll_ns)
  // SOFTRNIC_BUSY_POLL_LATE (shim -> busy_poll_late_polls)
  uint32_t busy_poll_late = kDefaultBusyPollLate;
  uint32_t tx_defer = kDefaultTxDefer;       // SOFTRNIC_TX_DEFER (shim -> defer_inflight)
  uint32_t ack_hold_us = kDefaultAckHoldUs;  // SOFTRNIC_ACK_HOLD_US (shim -> ack_hold_ns)
  uint32_t linger_us = kDefaultLingerUs;     // SOFTRNIC_LINGER_US (shim -> linger_ns)
  bool ack_tail = true;                      // SOFTRNIC_ACK_TAIL (shim -> EngineConfig)
  uint32_t rx_mark_pct = kDefaultRxMarkPct;  // SOFTRNIC_RX_MARK_PCT (shim -> rx_mark_pct)
  bool window_share = true;                  // SOFTRNIC_WINDOW_SHARE (shim -> EngineConfig)
  bool one_copy = false;                     // SOFTRNIC_ONE_COPY (shim -> EngineConfig)
  LogLevel log = LogLevel::kError;           // SOFTRNIC_LOG (shim, at device open)
  std::string log_file;                      // SOFTRNIC_LOG_FILE, "" = stderr (shim)
  std::string pcap;                          // SOFTRNIC_PCAP pattern, "%p" -> pid (services)
  std::string stats_at_exit;                 // SOFTRNIC_STATS_AT_EXIT pattern (services)
  std::string faults;                        // SOFTRNIC_FAULTS (services -> fault engine)
  std::string faults_file;                   // SOFTRNIC_FAULTS_FILE (services)
  std::optional<uint64_t> fault_seed;        // SOFTRNIC_FAULT_SEED (services)
  std::string fault_trace;                   // SOFTRNIC_FAULT_TRACE (services)
  std::optional<bool> secure_keys;           // SOFTRNIC_SECURE_KEYS (services)
  std::optional<bool> strict_src;            // SOFTRNIC_STRICT_SRC (services)
  uint16_t strict_src_port = 0;              // SOFTRNIC_STRICT_SRC_PORT (services)
  std::optional<bool> rc_stash;              // SOFTRNIC_RC_STASH (services)
  ControlSocket control = ControlSocket::kOn;  // SOFTRNIC_CONTROL (services)
  uint32_t cm_max_wait_ms = 0;               // SOFTRNIC_CM_MAX_WAIT_MS, 0 = IBA timers (cm)
  std::string runtime_dir;                   // SOFTRNIC_RUNTIME_DIR (control, tools)
  std::string xdg_runtime_dir;               // XDG_RUNTIME_DIR (control: default runtime dir)
  std::string sysfs_path;                    // SYSFS_PATH (shim: sysfs root it reports)
};

// One parsed value, as the type produced it.
struct VarValue {
  bool b = false;
  uint64_t u = 0;                 // kU32, kSeed, kEnum (choice index)
  LogLevel level = LogLevel::kError;
  std::string s;                  // kName, kString, kPath, kIp
};

struct VarDecl {
  std::string_view name;
  VarType type;
  std::string_view default_text;  // as shown in the table
  std::string_view values;        // accepted values, as shown in the table
  std::string_view help;          // one line
  std::string_view reader;        // shim | services | control | tools | scripts
  bool empty_is_error = false;
  uint32_t min = 0, max = 0;      // kU32
  bool pow2 = false;              // kU32
  std::string_view choices;       // kEnum: comma-separated, '/' between aliases; index = value
  // Stores a parsed value into its Config field; nullptr for variables only scripts read.
  void (*store)(Config*, const VarValue&) = nullptr;
};

// Every declared variable, in table order.
std::span<const VarDecl> config_vars();
const VarDecl* find_var(std::string_view name);

// Looks a variable up: the value or nullptr when unset. process_env() is getenv.
using EnvLookup = std::function<const char*(const char* name)>;
EnvLookup process_env();

// THE parse path. Parses one value of `decl` into *out; "" or an error naming the variable.
std::string parse_value(const VarDecl& decl, std::string_view text, VarValue* out);

// Parses every declared variable (or only those in `only`, when not empty) from env into *cfg,
// then the cross-variable rules (SOFTRNIC_STRICT_SRC_PORT needs SOFTRNIC_STRICT_SRC unset or 1,
// and implies it). Returns "" or the error for the first bad variable, in table order.
std::string parse_config(const EnvLookup& env, Config* cfg,
                         std::span<const std::string_view> only = {});

// Levenshtein distance, and the declared name closest to `name` (compared upper-cased).
size_t edit_distance(std::string_view a, std::string_view b);
std::string_view closest_var(std::string_view name);

// For each SOFTRNIC_* name (prefix matched case-insensitively) among `names` that is not
// declared: "unknown variable X (did you mean Y?)".
std::vector<std::string> unknown_variable_messages(std::span<const std::string> names);
// The names (before '=') of this process's environment.
std::vector<std::string> environment_names();
// Writes each message of the process environment through log_write at kWarn — regardless of
// the threshold (the default is error), but not when `level` is kOff. Returns how many.
size_t warn_unknown_variables(LogLevel level);
// As above, at most once per process (the shim calls it at device open).
void warn_unknown_variables_once(LogLevel level);

// The table of every declaration: plain text for `softrnic help`, and the Markdown table the
// README's "Configuration" section holds (tests/base/config_test compares the two).
std::string config_table_text();
std::string config_table_markdown();

}  // namespace rnic::base
