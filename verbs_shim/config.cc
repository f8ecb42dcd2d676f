// Parsing of the SOFTRNIC_* environment variables and the shim's stderr logger.
#include "verbs_shim/config.h"

#include <arpa/inet.h>
#include <strings.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace rnic::shim {
namespace {

bool valid_name(const char* s) {
  size_t n = std::strlen(s);
  if (n == 0 || n > 63) return false;
  for (size_t i = 0; i < n; ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool parse_level(const char* s, LogLevel* out) {
  static constexpr const char* kNames[] = {"off", "error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < 6; ++i) {
    if (strcasecmp(s, kNames[i]) == 0 || (s[0] == '0' + i && s[1] == '\0')) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  }
  if (strcasecmp(s, "warning") == 0) {
    *out = LogLevel::kWarn;
    return true;
  }
  return false;
}

bool parse_bool(const char* s, bool* out) {
  if (strcasecmp(s, "1") == 0 || strcasecmp(s, "on") == 0 || strcasecmp(s, "yes") == 0) {
    *out = true;
    return true;
  }
  if (*s == '\0' || strcasecmp(s, "0") == 0 || strcasecmp(s, "off") == 0 ||
      strcasecmp(s, "no") == 0) {
    *out = false;
    return true;
  }
  return false;
}

std::string describe(const char* var, const char* value, const char* expect) {
  std::string m = std::string("invalid ") + var + "='" + value + "': expected " + expect;
  return m;
}

}  // namespace

bool parse_name(std::string* name, std::string* err) {
  const char* v = std::getenv("SOFTRNIC_NAME");
  if (v == nullptr) {
    *name = "softrnic0";
    return true;
  }
  if (!valid_name(v)) {
    *err = describe("SOFTRNIC_NAME", v, "1..63 characters from [A-Za-z0-9_.-]");
    return false;
  }
  *name = v;
  return true;
}

bool parse_config(Config* cfg, std::string* err) {
  if (!parse_name(&cfg->name, err)) return false;
  if (const char* v = std::getenv("SOFTRNIC_IP")) {
    in_addr a{};
    if (inet_pton(AF_INET, v, &a) != 1) {
      *err = describe("SOFTRNIC_IP", v, "an IPv4 address such as 127.0.0.2");
      return false;
    }
    uint32_t h = ntohl(a.s_addr);
    if (h == 0 || h == 0xffffffffu || (h >> 28) == 0xe) {
      *err = describe("SOFTRNIC_IP", v, "a unicast IPv4 address");
      return false;
    }
    cfg->ip_set = true;
    cfg->ip = a;
  }
  if (const char* v = std::getenv("SOFTRNIC_MTU")) {
    char* end = nullptr;
    unsigned long m = std::strtoul(v, &end, 10);
    bool ok = end != v && *end == '\0' &&
              (m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096);
    if (!ok) {
      *err = describe("SOFTRNIC_MTU", v, "one of 256, 512, 1024, 2048, 4096");
      return false;
    }
    cfg->mtu = static_cast<uint32_t>(m);
  }
  if (const char* v = std::getenv("SOFTRNIC_LOG")) {
    if (!parse_level(v, &cfg->log)) {
      *err = describe("SOFTRNIC_LOG", v, "off|error|warn|info|debug|trace or 0..5");
      return false;
    }
  }
  for (auto [var, dst] : {std::pair{"SOFTRNIC_SECURE_KEYS", &cfg->secure_keys},
                         std::pair{"SOFTRNIC_STRICT_SRC", &cfg->strict_src}}) {
    const char* v = std::getenv(var);
    if (v == nullptr) continue;
    if (!parse_bool(v, dst)) {
      *err = describe(var, v, "0 or 1");
      return false;
    }
  }
  if (const char* v = std::getenv("SOFTRNIC_STRICT_SRC_PORT")) {
    char* end = nullptr;
    unsigned long p = std::strtoul(v, &end, 10);
    if (end == v || *end != '\0' || p == 0 || p > 65535) {
      *err = describe("SOFTRNIC_STRICT_SRC_PORT", v, "a UDP port 1..65535, e.g. 4791");
      return false;
    }
    if (std::getenv("SOFTRNIC_STRICT_SRC") != nullptr && !cfg->strict_src) {
      *err = describe("SOFTRNIC_STRICT_SRC_PORT", v, "SOFTRNIC_STRICT_SRC unset or 1");
      return false;
    }
    cfg->strict_src_port = static_cast<uint16_t>(p);
    cfg->strict_src = true;
  }
  if (const char* v = std::getenv("SOFTRNIC_PCAP")) {
    if (*v == '\0') {
      *err = describe("SOFTRNIC_PCAP", v, "a file path (%p is replaced by the pid)");
      return false;
    }
    cfg->pcap = v;
    // Expand %p -> pid here so the engine gets a plain path.
    std::string out;
    for (size_t i = 0; i < cfg->pcap.size(); ++i) {
      if (cfg->pcap[i] == '%' && i + 1 < cfg->pcap.size() && cfg->pcap[i + 1] == 'p') {
        out += std::to_string(getpid());
        ++i;
      } else {
        out += cfg->pcap[i];
      }
    }
    cfg->pcap = out;
  }
  return true;
}

LogLevel log_level() {
  // Read once; a racy double read is harmless (same value).
  static int cached = -1;
  if (cached < 0) {
    LogLevel l = LogLevel::kError;
    if (const char* v = std::getenv("SOFTRNIC_LOG")) {
      if (!parse_level(v, &l)) l = LogLevel::kError;
    }
    cached = static_cast<int>(l);
  }
  return static_cast<LogLevel>(cached);
}

void log_msg(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > static_cast<int>(log_level())) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "softrnic[%d]: %s\n", static_cast<int>(getpid()), buf);
}

void log_error(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "softrnic: %s\n", buf);
}

}  // namespace rnic::shim
