// base/log.h: softrnic's logger. Levels, a per-call-site rate limit for per-packet warnings
// (as rxe's pr_warn_ratelimited), and a trace level whose cost when off is one load and one
// predictable branch. Output goes to stderr or SOFTRNIC_LOG_FILE — never stdout: the
// libraries load into other people's programs.
//
// Contract:
//  - Every function is thread-safe and never throws, aborts or allocates on the fast path
//    (formatting happens only once a line is enabled and allowed by its rate limit).
//  - The level is set once at device open from the configuration (base/config.h) and may be
//    changed at any time; readers use a relaxed atomic load.
//  - A line is "softrnic[PID] LEVEL: message\n", written with one write(2), so lines from
//    several threads never interleave.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace rnic::base {

// Ordered: a line is printed when its level <= the threshold. kOff prints nothing.
enum class LogLevel : uint8_t { kOff = 0, kError, kWarn, kInfo, kDebug, kTrace };

// "off", "error", ... for a level; parse_log_level accepts those names (any case) and 0..5.
std::string_view log_level_name(LogLevel l);
bool parse_log_level(std::string_view s, LogLevel* out);

namespace detail {
extern std::atomic<uint8_t> g_threshold;
}

// Hot path: true when lines of level l are printed.
inline bool log_enabled(LogLevel l) {
  return static_cast<uint8_t>(l) <= detail::g_threshold.load(std::memory_order_relaxed);
}
void set_log_level(LogLevel l);
LogLevel log_level();

// Sends lines to path (appended, created 0600) instead of stderr; "" returns to stderr.
// Returns "" or an error naming the path.
std::string set_log_file(const std::string& path);

// Writes one line (no level check; use the macros). fmt is printf-style, no trailing '\n'.
void log_write(LogLevel l, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// A per-call-site budget: at most kBurst lines per kIntervalNs; the first line allowed after
// a suppressed stretch says how many were suppressed. Lock-free; a static instance per site.
class RateLimit {
 public:
  static constexpr uint32_t kBurst = 10;
  static constexpr uint64_t kIntervalNs = 5'000'000'000ull;  // rxe's default: 10 per 5 s
  // True if this line may print; *suppressed receives the lines dropped since the last one.
  bool allow(uint64_t* suppressed);

 private:
  std::atomic<uint64_t> window_start_ns_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

// log_write for a rate-limited site: appends "(N similar messages suppressed)" when N > 0.
void log_write_suppressed(LogLevel l, uint64_t suppressed, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace rnic::base

// RNIC_LOG(kWarn, "fmt", args...): one line if the level is enabled.
#define RNIC_LOG(level, ...)                                                          \
  do {                                                                                \
    if (__builtin_expect(::rnic::base::log_enabled(::rnic::base::LogLevel::level), 0)) \
      ::rnic::base::log_write(::rnic::base::LogLevel::level, __VA_ARGS__);            \
  } while (0)

// RNIC_LOG_RL(kWarn, ...): as RNIC_LOG, limited per call site (for anything a packet can
// trigger: drops, NAKs, refused accesses). A flood costs one branch and one atomic per packet.
#define RNIC_LOG_RL(level, ...)                                                         \
  do {                                                                                  \
    if (__builtin_expect(::rnic::base::log_enabled(::rnic::base::LogLevel::level), 0)) { \
      static ::rnic::base::RateLimit rnic_rl_;                                          \
      uint64_t rnic_sup_ = 0;                                                           \
      if (rnic_rl_.allow(&rnic_sup_))                                                   \
        ::rnic::base::log_write_suppressed(::rnic::base::LogLevel::level, rnic_sup_,    \
                                           __VA_ARGS__);                                \
    }                                                                                   \
  } while (0)

// RNIC_TRACE(...): per-packet trace, printed only at SOFTRNIC_LOG=trace; never rate-limited
// (trace is asked for). Off: one relaxed load and a branch predicted not taken.
#define RNIC_TRACE(...) RNIC_LOG(kTrace, __VA_ARGS__)
