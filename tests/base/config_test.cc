// tests/base/config_test: base/config.h — every declared variable parses its default, bad values
// name the variable, the case-folding and seed rules, the unknown-variable warning, and the
// README's "Configuration" table equals the generated one.
#include "base/config.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>

namespace rnic::base {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

std::string parse(const Env& env, Config* c) { return parse_config(lookup(env), c); }

// A numeric variable: each of `ok` parses and is stored in c.*field; each of `no` is refused
// with an error that names the variable.
void expect_u32_var(const char* name, uint32_t Config::*field,
                    std::initializer_list<const char*> ok, std::initializer_list<const char*> no) {
  for (const char* v : ok) {
    Config c;
    EXPECT_EQ(parse({{name, v}}, &c), "") << name << "=" << v;
    EXPECT_EQ(c.*field, std::stoul(v)) << name << "=" << v;
  }
  for (const char* v : no) {
    Config c;
    EXPECT_NE(parse({{name, v}}, &c).find(name), std::string::npos) << name << "=" << v;
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A value each declared variable accepts, with the field it must land in checked below.
std::string good_value(const VarDecl& d) {
  switch (d.type) {
    case VarType::kName: return "dev_1.x-y";
    case VarType::kString: return "anything goes";
    case VarType::kPath: return "/tmp/x";
    case VarType::kBool: return "1";
    case VarType::kU32: return std::to_string(d.max);
    case VarType::kSeed: return "42";
    case VarType::kEnum:  // the last choice (SOFTRNIC_CONTROL: required; SOFTRNIC_GSO: off)
    {
      std::string_view last = d.choices.substr(d.choices.rfind(',') + 1);
      return std::string(last.substr(0, last.find('/')));
    }
    case VarType::kIp: return "127.0.0.9";
    case VarType::kLevel: return "trace";
  }
  return "";
}

std::string bad_value(const VarDecl& d) {
  switch (d.type) {
    case VarType::kName: return "bad name!";
    case VarType::kBool: return "maybe";
    case VarType::kU32: return std::to_string(d.max + 1);
    case VarType::kSeed: return "12ab";
    case VarType::kEnum: return "sometimes";
    case VarType::kIp: return "300.1.2.3";
    case VarType::kLevel: return "loud";
    case VarType::kString:
    case VarType::kPath: return "";
  }
  return "";
}

TEST(Config, EmptyEnvironmentGivesTheDocumentedDefaults) {
  Config c;
  ASSERT_EQ(parse({}, &c), "");
  EXPECT_EQ(c.name, "softrnic0");
  EXPECT_FALSE(c.ip.has_value());
  EXPECT_EQ(c.mtu, 0u);
  EXPECT_EQ(c.spin_us, rnic::base::kDefaultSpinUs);
  EXPECT_EQ(c.busy_poll_us, rnic::base::kDefaultBusyPollUs);
  EXPECT_EQ(c.busy_poll_late, rnic::base::kDefaultBusyPollLate);
  EXPECT_EQ(c.log, LogLevel::kError);
  EXPECT_EQ(c.log_file, "");
  EXPECT_EQ(c.pcap, "");
  EXPECT_FALSE(c.fault_seed.has_value());
  EXPECT_FALSE(c.secure_keys.has_value());
  EXPECT_FALSE(c.strict_src.has_value());
  EXPECT_EQ(c.strict_src_port, 0);
  EXPECT_EQ(c.control, ControlSocket::kOn);
}

// Every declared default, written out as a value, parses (where the default is a value at
// all rather than a description such as "from the interface").
TEST(Config, EveryDeclaredDefaultThatIsAValueParses) {
  size_t parsed = 0;
  for (const VarDecl& d : config_vars()) {
    std::string def(d.default_text);
    if (def.size() >= 2 && def.front() == '`' && def.back() == '`' &&
        def.find('`', 1) == def.size() - 1) {
      VarValue v;
      EXPECT_EQ(parse_value(d, def.substr(1, def.size() - 2), &v), "") << d.name;
      ++parsed;
    }
  }
  EXPECT_GE(parsed, 7u);  // NAME, LOG, SECURE_KEYS, STRICT_SRC, CONTROL, SYSFS_PATH, ...
  Config c;
  VarValue v;
  ASSERT_EQ(parse_value(*find_var("SOFTRNIC_LOG"), "error", &v), "");
  EXPECT_EQ(v.level, c.log);
  ASSERT_EQ(parse_value(*find_var("SOFTRNIC_CONTROL"), "on", &v), "");
  EXPECT_EQ(static_cast<ControlSocket>(v.u), c.control);
  ASSERT_EQ(parse_value(*find_var("SOFTRNIC_NAME"), "softrnic0", &v), "");
  EXPECT_EQ(v.s, c.name);
}

TEST(Config, EveryVariableAcceptsAGoodValueAndNamesItselfOnABadOne) {
  for (const VarDecl& d : config_vars()) {
    Config c;
    Env env{{std::string(d.name), good_value(d)}};
    EXPECT_EQ(parse(env, &c), "") << d.name;
    std::string b = bad_value(d);
    if (b.empty() && !d.empty_is_error) continue;  // free-form: nothing is bad
    env[std::string(d.name)] = b;
    Config c2;
    std::string e = parse(env, &c2);
    EXPECT_NE(e.find(std::string(d.name) + "="), std::string::npos) << d.name << ": " << e;
  }
}

TEST(Config, GsoModeParses) {
  for (auto [text, want] : {std::pair{"auto", GsoMode::kAuto}, {"ON", GsoMode::kOn},
                            {"1", GsoMode::kOn}, {"off", GsoMode::kOff},
                            {"no", GsoMode::kOff}}) {
    Config c;
    ASSERT_EQ(parse(Env{{"SOFTRNIC_GSO", text}}, &c), "") << text;
    EXPECT_EQ(c.gso, want) << text;
  }
  Config c;
  EXPECT_EQ(c.gso, GsoMode::kAuto);
  EXPECT_NE(parse(Env{{"SOFTRNIC_GSO", "maybe"}}, &c).find("SOFTRNIC_GSO="), std::string::npos);
}

// SOFTRNIC_IP takes IPv6 too (issue 11): unicast global or ULA, link-local only with a zone;
// never unspecified, multicast or IPv4-mapped.
TEST(Config, IpAcceptsIpv6Unicast) {
  for (const char* ok : {"fd00:1::2", "2001:db8::7", "::1", "fe80::1%lo", "10.1.2.3"}) {
    Config c;
    EXPECT_EQ(parse(Env{{"SOFTRNIC_IP", ok}}, &c), "") << ok;
    ASSERT_TRUE(c.ip.has_value()) << ok;
    EXPECT_EQ(*c.ip, ok);
  }
  for (const char* bad : {"::", "ff02::1", "::ffff:10.0.0.1", "fe80::1", "fd00::1%lo",
                          "fe80::1%", "fd00::g", "224.0.0.1"}) {
    Config c;
    EXPECT_NE(parse(Env{{"SOFTRNIC_IP", bad}}, &c), "") << bad;
  }
}

TEST(Config, ValuesLandInTheirFields) {
  Config c;
  Env env{{"SOFTRNIC_NAME", "mydev"},        {"SOFTRNIC_IP", "127.0.0.77"},
          {"SOFTRNIC_MTU", "1024"},          {"SOFTRNIC_LOG", "debug"},
          {"SOFTRNIC_LOG_FILE", "/tmp/l"},   {"SOFTRNIC_PCAP", "/tmp/x.%p.pcap"},
          {"SOFTRNIC_FAULTS", "dir=tx => drop"}, {"SOFTRNIC_FAULT_SEED", "7"},
          {"SOFTRNIC_SECURE_KEYS", "1"},     {"SOFTRNIC_CONTROL", "off"},
          {"SOFTRNIC_RUNTIME_DIR", "/tmp/rt"}, {"SYSFS_PATH", "/tmp/sys"},
          {"SOFTRNIC_SPIN_US", "0"}};
  ASSERT_EQ(parse(env, &c), "");
  EXPECT_EQ(c.spin_us, 0u);
  EXPECT_EQ(c.name, "mydev");
  ASSERT_TRUE(c.ip.has_value());
  EXPECT_EQ(*c.ip, "127.0.0.77");
  EXPECT_EQ(c.mtu, 1024u);
  EXPECT_EQ(c.log, LogLevel::kDebug);
  EXPECT_EQ(c.log_file, "/tmp/l");
  EXPECT_EQ(c.pcap, "/tmp/x.%p.pcap");  // the pattern; PcapWriter expands %p
  EXPECT_EQ(c.faults, "dir=tx => drop");
  EXPECT_EQ(c.fault_seed, 7u);
  EXPECT_EQ(c.secure_keys, true);
  EXPECT_EQ(c.control, ControlSocket::kOff);
  EXPECT_EQ(c.runtime_dir, "/tmp/rt");
  EXPECT_EQ(c.sysfs_path, "/tmp/sys");
}

TEST(Config, MtuMustBeAPowerOfTwoInRange) {
  expect_u32_var("SOFTRNIC_MTU", &Config::mtu, {"256", "512", "1024", "2048", "4096"},
                 {"1000", "128", "8192", "0x400", "+1024", " 1024", "1024k", ""});
}

TEST(Config, SpinIsMicrosecondsUpToTenMilliseconds) {
  expect_u32_var("SOFTRNIC_SPIN_US", &Config::spin_us, {"0", "1", "200", "10000"},
                 {"10001", "-1", "50us", ""});
}

TEST(Config, BusyPollIsMicrosecondsUpToTenMilliseconds) {
  expect_u32_var("SOFTRNIC_BUSY_POLL_US", &Config::busy_poll_us, {"0", "1", "10", "10000"},
                 {"10001", "-1", "20us", ""});
}

TEST(Config, BusyPollLateIsPollsUpTo64) {
  expect_u32_var("SOFTRNIC_BUSY_POLL_LATE", &Config::busy_poll_late, {"0", "1", "64"},
                 {"65", "-1", "one", ""});
}

TEST(Config, TxDeferIsPacketsUpTo4096DefaultOne) {
  EXPECT_EQ(Config{}.tx_defer, 1u);
  expect_u32_var("SOFTRNIC_TX_DEFER", &Config::tx_defer, {"0", "1", "16", "4096"},
                 {"4097", "-1", "on", ""});
}

TEST(Config, AckHoldIsMicrosecondsUpTo150Default50) {
  EXPECT_EQ(Config{}.ack_hold_us, 50u);
  expect_u32_var("SOFTRNIC_ACK_HOLD_US", &Config::ack_hold_us, {"0", "1", "50", "150"},
                 {"151", "-1", "50us", ""});
}

TEST(Config, LingerIsMicrosecondsUpTo100Default5) {
  EXPECT_EQ(Config{}.linger_us, 5u);
  expect_u32_var("SOFTRNIC_LINGER_US", &Config::linger_us, {"0", "1", "5", "100"},
                 {"101", "-1", "5us", ""});
}

TEST(Config, RxMarkIsPercentUpTo100Default85) {
  EXPECT_EQ(Config{}.rx_mark_pct, 85u);
  expect_u32_var("SOFTRNIC_RX_MARK_PCT", &Config::rx_mark_pct, {"0", "1", "25", "100"},
                 {"101", "-1", "25%", ""});
}

TEST(Config, WindowShareIsABooleanOnByDefault) {
  EXPECT_TRUE(Config{}.window_share);
  Config c;
  ASSERT_EQ(parse({{"SOFTRNIC_WINDOW_SHARE", "0"}}, &c), "");
  EXPECT_FALSE(c.window_share);
  Config d;
  EXPECT_NE(parse({{"SOFTRNIC_WINDOW_SHARE", "2"}}, &d), "");
}

TEST(Config, OneCopyIsABooleanOffByDefault) {
  EXPECT_FALSE(Config{}.one_copy);
  Config c;
  ASSERT_EQ(parse({{"SOFTRNIC_ONE_COPY", "1"}}, &c), "");
  EXPECT_TRUE(c.one_copy);
  Config d;
  EXPECT_NE(parse({{"SOFTRNIC_ONE_COPY", "2"}}, &d), "");
}

// Names are exact; keyword values fold case; free-form values keep it.
TEST(Config, CaseFoldingRule) {
  Config c;
  ASSERT_EQ(parse({{"SOFTRNIC_LOG", "TRACE"}, {"SOFTRNIC_CONTROL", "Required"},
                   {"SOFTRNIC_SECURE_KEYS", "ON"}, {"SOFTRNIC_STRICT_SRC", "Yes"},
                   {"SOFTRNIC_NAME", "MyDev"}, {"SOFTRNIC_PCAP", "/tmp/A.pcap"}},
                  &c),
            "");
  EXPECT_EQ(c.log, LogLevel::kTrace);
  EXPECT_EQ(c.control, ControlSocket::kRequired);
  EXPECT_EQ(c.secure_keys, true);
  EXPECT_EQ(c.strict_src, true);
  EXPECT_EQ(c.name, "MyDev");
  EXPECT_EQ(c.pcap, "/tmp/A.pcap");
  Config d;
  ASSERT_EQ(parse({{"softrnic_log", "trace"}}, &d), "");  // not the variable: ignored
  EXPECT_EQ(d.log, LogLevel::kError);
  EXPECT_EQ(parse({{"SOFTRNIC_LOG", "Warning"}}, &d), "");
  EXPECT_EQ(d.log, LogLevel::kWarn);
}

TEST(Config, SeedIsDecimalOrHexNeverOctal) {
  auto seed = [](const char* s) {
    Config c;
    std::string e = parse({{"SOFTRNIC_FAULT_SEED", s}}, &c);
    return e.empty() ? c.fault_seed : std::nullopt;
  };
  EXPECT_EQ(seed("10"), 10u);
  EXPECT_EQ(seed("010"), 10u);  // not 8
  EXPECT_EQ(seed("0x10"), 16u);
  EXPECT_EQ(seed("0X1f"), 31u);
  EXPECT_EQ(seed("0"), 0u);
  EXPECT_EQ(seed("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(seed("18446744073709551616"), std::nullopt);
  EXPECT_EQ(seed("0x"), std::nullopt);
  EXPECT_EQ(seed("-1"), std::nullopt);
  EXPECT_EQ(seed("12ab"), std::nullopt);
  EXPECT_EQ(seed("0o17"), std::nullopt);
  Config c;
  std::string e = parse({{"SOFTRNIC_FAULT_SEED", "banana"}}, &c);
  EXPECT_NE(e.find("SOFTRNIC_FAULT_SEED"), std::string::npos) << e;
  EXPECT_EQ(parse({{"SOFTRNIC_FAULT_SEED", ""}}, &c), "");  // empty = unset
  EXPECT_FALSE(c.fault_seed.has_value());
}

TEST(Config, EmptyValueRules) {
  Config c;
  for (const char* v : {"SOFTRNIC_PCAP", "SOFTRNIC_NAME", "SOFTRNIC_IP", "SOFTRNIC_LOG"})
    EXPECT_NE(parse({{v, ""}}, &c).find(v), std::string::npos) << v;
  EXPECT_EQ(parse({{"SOFTRNIC_CONTROL", ""}, {"SOFTRNIC_SECURE_KEYS", ""}, {"SOFTRNIC_FAULTS", ""}},
                  &c),
            "");
  EXPECT_EQ(c.control, ControlSocket::kOn);
  EXPECT_FALSE(c.secure_keys.has_value());
}

TEST(Config, StrictSrcPortImpliesAndConflicts) {
  Config a;
  ASSERT_EQ(parse({{"SOFTRNIC_STRICT_SRC_PORT", "4791"}}, &a), "");
  EXPECT_EQ(a.strict_src, true);
  EXPECT_EQ(a.strict_src_port, 4791);
  Config b;
  std::string e = parse({{"SOFTRNIC_STRICT_SRC_PORT", "4791"}, {"SOFTRNIC_STRICT_SRC", "0"}}, &b);
  EXPECT_NE(e.find("SOFTRNIC_STRICT_SRC_PORT"), std::string::npos) << e;
  Config c;
  EXPECT_NE(parse({{"SOFTRNIC_STRICT_SRC_PORT", "70000"}}, &c).find("SOFTRNIC_STRICT_SRC_PORT"),
            std::string::npos);
  EXPECT_NE(parse({{"SOFTRNIC_STRICT_SRC_PORT", "0"}}, &c).find("SOFTRNIC_STRICT_SRC_PORT"),
            std::string::npos);
}

TEST(Config, OnlyParsesTheNamedSubset) {
  Config c;
  static constexpr std::string_view kOnly[] = {"SOFTRNIC_NAME"};
  EXPECT_EQ(parse_config(lookup({{"SOFTRNIC_NAME", "x"}, {"SOFTRNIC_MTU", "bad"}}), &c, kOnly), "");
  EXPECT_EQ(c.name, "x");
}

TEST(Config, EveryVariableIsDeclaredOnce) {
  std::map<std::string, int> seen;
  for (const VarDecl& d : config_vars()) {
    EXPECT_EQ(++seen[std::string(d.name)], 1) << d.name;
    EXPECT_FALSE(d.help.empty()) << d.name;
    EXPECT_FALSE(d.reader.empty()) << d.name;
    EXPECT_EQ(d.store == nullptr, d.reader == "scripts") << d.name;
  }
  for (const char* n : {"SOFTRNIC_TEST_QUICK", "SOFTRNIC_SHIM_DIR", "SOFTRNIC_CTL",
                        "SOFTRNIC_BUILD_DIR", "SOFTRNIC_LOG_FILE"})
    EXPECT_NE(find_var(n), nullptr) << n;
}

TEST(Config, ClosestVariableByEditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(closest_var("SOFTRNIC_FAULT"), "SOFTRNIC_FAULTS");
  EXPECT_EQ(closest_var("SOFTRNIC_MUT"), "SOFTRNIC_MTU");
  EXPECT_EQ(closest_var("SOFTRNIC_FAULTSEED"), "SOFTRNIC_FAULT_SEED");
  EXPECT_EQ(closest_var("softrnic_log"), "SOFTRNIC_LOG");
  std::vector<std::string> names{"PATH", "SOFTRNIC_FAULT", "SOFTRNIC_MTU", "softrnic_log",
                                 "SOFTRNIC_TEST_QUICK", "SOFTRNICX"};
  std::vector<std::string> m = unknown_variable_messages(names);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], "unknown variable SOFTRNIC_FAULT (did you mean SOFTRNIC_FAULTS?)");
  EXPECT_EQ(m[1], "unknown variable softrnic_log (did you mean SOFTRNIC_LOG?)");
}

// The warning goes through base/log.h at warn level even though the threshold is error, to
// the log file (never stdout), and not at all with SOFTRNIC_LOG=off.
TEST(Config, UnknownVariableWarningIsLoggedOnceToTheLogFile) {
  char path[] = "/tmp/config_test_log_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(set_log_file(path), "");
  ASSERT_EQ(log_level(), LogLevel::kError);
  setenv("SOFTRNIC_FAULT", "dir=tx => drop", 1);
  setenv("SOFTRNIC_LOG", "off", 1);  // the variable itself is known: no warning about it
  EXPECT_EQ(warn_unknown_variables(LogLevel::kOff), 0u);
  fflush(stdout);
  long out_before = ftell(stdout);
  EXPECT_EQ(warn_unknown_variables(LogLevel::kError), 1u);
  warn_unknown_variables_once(LogLevel::kError);
  warn_unknown_variables_once(LogLevel::kError);  // second call: nothing
  fflush(stdout);
  EXPECT_EQ(ftell(stdout), out_before);
  unsetenv("SOFTRNIC_FAULT");
  unsetenv("SOFTRNIC_LOG");
  ASSERT_EQ(set_log_file(""), "");
  std::string log = read_file(path);
  unlink(path);
  const std::string want = "warn: unknown variable SOFTRNIC_FAULT (did you mean SOFTRNIC_FAULTS?)";
  size_t first = log.find(want);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find(want, first + 1), std::string::npos) << log;   // the explicit call + once
  size_t second = log.find(want, first + 1);
  EXPECT_EQ(log.find(want, second + 1), std::string::npos) << log;  // ... and not a third time
  EXPECT_EQ(log.find("SOFTRNIC_LOG?"), std::string::npos) << log;
}

// The README's table is the generated one, byte for byte (regenerate with
// `build/tools/softrnic-ctl env --markdown`).
TEST(Config, ReadmeTableIsTheGeneratedOne) {
  std::string readme = read_file(std::string(SOFTRNIC_SOURCE_ROOT) + "/README.md");
  size_t sec = readme.find("\n## Configuration");
  ASSERT_NE(sec, std::string::npos);
  size_t start = readme.find("\n|", sec);
  ASSERT_NE(start, std::string::npos);
  ++start;
  size_t end = start;
  while (end < readme.size() && readme[end] == '|') {
    size_t nl = readme.find('\n', end);
    end = nl == std::string::npos ? readme.size() : nl + 1;
  }
  EXPECT_EQ(readme.substr(start, end - start), config_table_markdown());
}

TEST(Config, TextTableListsEveryVariable) {
  std::string t = config_table_text();
  for (const VarDecl& d : config_vars()) EXPECT_NE(t.find(std::string(d.name) + "  ["), std::string::npos) << d.name;
  EXPECT_EQ(t.find('`'), std::string::npos);
}

}  // namespace
}  // namespace rnic::base
