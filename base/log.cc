// base/log.cc: the logger behind base/log.h.
#include "base/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace rnic::base {
namespace detail {
std::atomic<uint8_t> g_threshold{static_cast<uint8_t>(LogLevel::kError)};
}

namespace {

constexpr std::string_view kNames[] = {"off", "error", "warn", "info", "debug", "trace"};

std::atomic<int> g_fd{STDERR_FILENO};
std::mutex g_file_mu;  // serialises set_log_file only; writes are single write(2) calls

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void vwrite(LogLevel l, uint64_t suppressed, const char* fmt, va_list ap) {
  char buf[1024];
  int n = std::snprintf(buf, sizeof(buf), "softrnic[%d] %s: ", static_cast<int>(getpid()),
                        kNames[static_cast<size_t>(l)].data());
  if (n < 0) return;
  size_t len = static_cast<size_t>(n);
  int m = std::vsnprintf(buf + len, sizeof(buf) - len, fmt, ap);
  if (m > 0) len = std::min(sizeof(buf) - 1, len + static_cast<size_t>(m));
  if (suppressed != 0 && len < sizeof(buf) - 1) {
    int k = std::snprintf(buf + len, sizeof(buf) - len, " (%llu similar messages suppressed)",
                          static_cast<unsigned long long>(suppressed));
    if (k > 0) len = std::min(sizeof(buf) - 1, len + static_cast<size_t>(k));
  }
  if (len >= sizeof(buf) - 1) len = sizeof(buf) - 2;
  buf[len++] = '\n';
  int fd = g_fd.load(std::memory_order_acquire);
  ssize_t w;
  do {
    w = ::write(fd, buf, len);
  } while (w < 0 && errno == EINTR);
}

}  // namespace

std::string_view log_level_name(LogLevel l) {
  size_t i = static_cast<size_t>(l);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool parse_log_level(std::string_view s, LogLevel* out) {
  if (s.size() == 1 && s[0] >= '0' && s[0] <= '5') {
    *out = static_cast<LogLevel>(s[0] - '0');
    return true;
  }
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (s.size() != kNames[i].size()) continue;
    bool eq = true;
    for (size_t j = 0; j < s.size() && eq; ++j) {
      char c = s[j];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      eq = c == kNames[i][j];
    }
    if (eq) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  }
  if (s == "warning" || s == "WARNING") {
    *out = LogLevel::kWarn;
    return true;
  }
  return false;
}

void set_log_level(LogLevel l) {
  detail::g_threshold.store(static_cast<uint8_t>(l), std::memory_order_relaxed);
}

LogLevel log_level() {
  return static_cast<LogLevel>(detail::g_threshold.load(std::memory_order_relaxed));
}

std::string set_log_file(const std::string& path) {
  std::lock_guard lk(g_file_mu);
  int fd = STDERR_FILENO;
  if (!path.empty()) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return "cannot open log file " + path + ": " + std::strerror(errno);
  }
  int old = g_fd.exchange(fd, std::memory_order_acq_rel);
  // The old descriptor is left open: another thread may be inside write() on it. One leaked
  // fd per log-file change (a configuration-time event) is the price of a lock-free write.
  (void)old;
  return "";
}

void log_write(LogLevel l, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwrite(l, 0, fmt, ap);
  va_end(ap);
}

void log_write_suppressed(LogLevel l, uint64_t suppressed, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwrite(l, suppressed, fmt, ap);
  va_end(ap);
}

bool RateLimit::allow(uint64_t* suppressed) {
  const uint64_t now = now_ns();
  uint64_t start = window_start_ns_.load(std::memory_order_relaxed);
  if (start == 0 || now - start >= kIntervalNs) {
    // A new window: whoever wins the exchange resets the budget.
    if (window_start_ns_.compare_exchange_strong(start, now, std::memory_order_relaxed)) {
      in_window_.store(0, std::memory_order_relaxed);
    }
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) < kBurst) {
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace rnic::base
