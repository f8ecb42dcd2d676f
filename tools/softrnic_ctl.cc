// softrnic-ctl: talks to a running device's control socket (emu/services/control.h): fault rules,
// counters (once or watched with deltas, as text or --json) and packet capture; `status` asks
// softrnicd (daemon/proto) for its devices, slots, clients and counters; `env` prints the table
// of configuration variables (base/config.h). Arguments are parsed with CLI11, JSON is written
// with nlohmann-json (neither is linked into libibverbs.so.1). Exit status: 0 ok, 1 the device
// refused the request or could not be reached, 2 usage error.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/config.h"
#include "daemon/proto/proto.h"
#include "emu/objects/device.h"
#include "emu/services/control.h"
#include "tools/control_client.h"

namespace {

using rnic::emu::ControlClient;
using rnic::emu::ControlReply;
using rnic::emu::ControlSocketInfo;
using Json = nlohmann::ordered_json;

constexpr const char* kUsage =
    "usage: softrnic-ctl [--device NAME | --pid PID | --socket PATH] [--runtime-dir DIR] CMD\n"
    "  fault add 'RULE[; RULE...]'   add fault rules (all or none; see emu/fault/fault_rules.h)\n"
    "  fault list [--json]           rules with their fire counts\n"
    "  fault clear                   remove every rule\n"
    "  stats [--qp N] [--json] [--watch [--interval S] [--count N]]\n"
    "                                counters as 'name value' (watch: + delta per interval)\n"
    "  capture -w FILE               start writing a pcap of all traffic to FILE\n"
    "  capture --stop                stop the capture\n"
    "  gids [--ip IP]                the GID table a device on IP (default $SOFTRNIC_IP) lists:\n"
    "                                'index gid type netdev' per line, gid as sysfs writes it\n"
    "  list                          running devices (device pid socket)\n"
    "  status [--json]               softrnicd's devices, slots, clients and counters\n"
    "  env [--markdown]              the SOFTRNIC_* variables (base/config.h)\n"
    "Without --device/--pid/--socket the only running device is used.\n";

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int usage(const std::string& msg) {
  if (!msg.empty()) std::fprintf(stderr, "softrnic-ctl: %s\n", msg.c_str());
  std::fputs(kUsage, stderr);
  return 2;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "softrnic-ctl: %s\n", msg.c_str());
  return 1;
}

bool parse_num(const std::string& s, unsigned long long* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *v = std::strtoull(s.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0' && s[0] != '-';
}

struct Selector {
  std::string device;
  int pid = 0;
  std::string socket;
  std::string runtime_dir;
};

struct Conn {
  std::unique_ptr<ControlClient> client;
  ControlSocketInfo info;
};

std::string open_conn(const Selector& sel, Conn* c) {
  if (!sel.socket.empty()) {
    c->info.path = sel.socket;
  } else {
    std::string dir = sel.runtime_dir.empty() ? rnic::emu::control_runtime_dir() : sel.runtime_dir;
    if (std::string e = rnic::emu::check_runtime_dir(dir, false, geteuid()); !e.empty()) {
      if (access(dir.c_str(), F_OK) != 0) return "no running softrnic device (no " + dir + ")";
      return e;
    }
    if (std::string e = rnic::emu::select_control_socket(dir, sel.device, sel.pid, &c->info);
        !e.empty()) {
      return e;
    }
  }
  std::string err;
  c->client = ControlClient::connect(c->info.path, &err);
  return c->client ? "" : err;
}

using StatLines = std::vector<std::pair<std::string, unsigned long long>>;

// Parses "name value" lines into an ordered list.
StatLines parse_stats(const ControlReply& r) {
  StatLines out;
  for (const std::string& l : r.lines) {
    size_t sp = l.rfind(' ');
    unsigned long long v = 0;
    if (sp == std::string::npos || !parse_num(l.substr(sp + 1), &v)) continue;
    out.emplace_back(l.substr(0, sp), v);
  }
  return out;
}

// "ID fired=N matched=N RULE" lines of `fault list` (emu/services/control.cc) as JSON objects.
Json fault_list_json(const ControlReply& r) {
  Json arr = Json::array();
  for (const std::string& l : r.lines) {
    unsigned long long id = 0, fired = 0, matched = 0;
    int used = 0;
    if (std::sscanf(l.c_str(), "%llu fired=%llu matched=%llu %n", &id, &fired, &matched, &used) < 3)
      continue;
    arr.push_back({{"id", id}, {"fired", fired}, {"matched", matched},
                   {"rule", l.substr(static_cast<size_t>(used))}});
  }
  return arr;
}

enum class Output { kText, kJson, kFaultJson };

// Sends one request; prints data lines (or their JSON) to stdout. Returns the exit status.
int run_simple(Conn& c, const std::string& req, Output out) {
  ControlReply r;
  if (std::string e = c.client->request(req, &r); !e.empty()) return fail(e);
  if (!r.ok) {
    for (const std::string& l : r.lines) std::printf("%s\n", l.c_str());
    return fail(r.error);
  }
  if (out == Output::kText) {
    for (const std::string& l : r.lines) std::printf("%s\n", l.c_str());
  } else if (out == Output::kFaultJson) {
    std::printf("%s\n", fault_list_json(r).dump(2).c_str());
  } else {
    Json counters = Json::object();
    for (const auto& [name, v] : parse_stats(r)) counters[name] = v;
    Json doc = {{"device", c.info.device}, {"pid", c.info.pid}, {"counters", counters}};
    std::printf("%s\n", doc.dump(2).c_str());
  }
  return 0;
}

int run_watch(Conn& c, const std::string& req, double interval, unsigned long long count,
              bool json) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: the sleep returns early on ^C
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::map<std::string, unsigned long long> prev;
  for (unsigned long long round = 1; !g_stop; ++round) {
    ControlReply r;
    if (std::string e = c.client->request(req, &r); !e.empty()) return fail(e);
    if (!r.ok) return fail(r.error);
    time_t now = time(nullptr);
    struct tm tmv;
    localtime_r(&now, &tmv);
    char ts[16];
    std::strftime(ts, sizeof(ts), "%H:%M:%S", &tmv);
    Json counters = Json::object(), delta = Json::object();
    if (!json) {
      std::printf("--- %s pid %d %s%s\n", c.info.device.empty() ? "device" : c.info.device.c_str(),
                  static_cast<int>(c.info.pid), ts, round == 1 ? "" : " (delta since last)");
    }
    for (const auto& [name, v] : parse_stats(r)) {
      auto it = prev.find(name);
      long long d = it == prev.end() ? 0 : static_cast<long long>(v - it->second);
      if (json) {
        counters[name] = v;
        if (it != prev.end()) delta[name] = d;
      } else if (it == prev.end()) {
        std::printf("%s %llu\n", name.c_str(), v);
      } else {
        std::printf("%s %llu %+lld\n", name.c_str(), v, d);
      }
      prev[name] = v;
    }
    if (json) {  // one object per line (JSON Lines)
      Json doc = {{"device", c.info.device}, {"pid", c.info.pid}, {"time", ts},
                  {"counters", counters}};
      if (round != 1) doc["delta"] = delta;
      std::printf("%s\n", doc.dump().c_str());
    }
    std::fflush(stdout);
    if (count != 0 && round >= count) break;
    timespec t{static_cast<time_t>(interval), static_cast<long>((interval - static_cast<long>(interval)) * 1e9)};
    while (!g_stop && nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
  }
  return 0;
}

std::string absolute_path(const std::string& p) {
  if (!p.empty() && p[0] == '/') return p;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof(cwd))) return p;
  return std::string(cwd) + "/" + p;
}

// `gids`: the table Device::open builds (emu/objects/device.h gid_table_for), for the sysfs
// tree scripts/softrnic writes (gids/N, gid_attrs/types/N, gid_attrs/ndevs/N).
int print_gids(std::string ip) {
  if (ip.empty()) {
    const char* e = std::getenv("SOFTRNIC_IP");
    if (e == nullptr || *e == '\0') return usage("gids: no --ip and no SOFTRNIC_IP");
    ip = e;
  }
  std::optional<rnic::wire::Endpoint> ep = rnic::wire::Endpoint::parse(ip, 0);
  if (!ep) return usage("gids: not an IP address: " + ip);
  auto nif = rnic::emu::interface_of(ip);
  const std::vector<rnic::emu::GidEntry> t =
      rnic::emu::gid_table_for(*ep, nif.has_value() ? &nif.value() : nullptr);
  for (size_t i = 0; i < t.size(); ++i) {
    std::string g;
    char b[8];
    for (int k = 0; k < 16; k += 2) {
      std::snprintf(b, sizeof(b), "%s%02x%02x", k == 0 ? "" : ":", t[i].raw[k], t[i].raw[k + 1]);
      g += b;
    }
    std::printf("%zu %s RoCE v2 %s\n", i, g.c_str(), t[i].netdev.empty() ? "lo" : t[i].netdev.c_str());
  }
  return 0;
}

// `status`: softrnicd's answer to kStatus (daemon/server.cc status_json), as text or as it came.
int print_status(const std::string& runtime_dir, bool json) {
  namespace d = rnic::daemon;
  std::string dir = runtime_dir.empty() ? rnic::emu::control_runtime_dir() : runtime_dir;
  std::string path;
  int fd = d::connect_daemon(dir, &path);
  if (fd < 0) return fail("no softrnicd answers at " + path + ": " + std::strerror(-fd));
  d::Header req{static_cast<uint32_t>(d::MsgType::kStatus), sizeof(d::Header)};
  std::vector<char> buf(1 << 20);
  ssize_t r = d::call(fd, &req, sizeof req, buf.data(), buf.size(), nullptr, 0, 5000);
  close(fd);
  if (r < 0) return fail("softrnicd at " + path + ": " + std::strerror(static_cast<int>(-r)));
  d::Header h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (h.type != static_cast<uint32_t>(d::MsgType::kStatusText)) {
    return fail("softrnicd at " + path + " answered with message type " + std::to_string(h.type));
  }
  std::string text(buf.data() + sizeof h, static_cast<size_t>(r) - sizeof h);
  Json doc = Json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return fail("softrnicd at " + path + ": bad status JSON");
  if (json) {
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  auto num = [](const Json& j, const char* k) -> unsigned long long {
    return j.contains(k) && j[k].is_number_unsigned() ? j[k].get<unsigned long long>() : 0;
  };
  std::printf("softrnicd pid %llu socket %s\n", num(doc, "pid"),
              doc.value("socket", std::string()).c_str());
  for (const char* k : {"clients_total", "refused", "bad_messages", "drop_free_slot",
                        "drop_cm_unrouted", "cm_routed"}) {
    std::printf("%s %llu\n", k, num(doc, k));
  }
  if (!doc.contains("devices") || !doc["devices"].is_array()) return 0;
  for (const Json& dev : doc["devices"]) {
    std::printf("device %s ip %s gids %llu slots_in_use %llu slots_created %llu "
                "slots_waiting_exit %llu services %llu\n",
                dev.value("name", std::string()).c_str(), dev.value("ip", std::string()).c_str(),
                num(dev, "gids"), num(dev, "slots_in_use"), num(dev, "slots_created"),
                num(dev, "slots_waiting_exit"), num(dev, "services"));
    if (!dev.contains("clients") || !dev["clients"].is_array()) continue;
    for (const Json& c : dev["clients"]) {
      time_t since = static_cast<time_t>(num(c, "since_ms") / 1000);
      struct tm tmv;
      localtime_r(&since, &tmv);
      char ts[32];
      std::strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tmv);
      std::printf("  client pid %llu uid %llu slot %llu since %s services %llu\n", num(c, "pid"),
                  num(c, "uid"), num(c, "slot"), ts, num(c, "services"));
    }
  }
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"softrnic-ctl: a running softrnic device's control socket", "softrnic-ctl"};
  app.set_help_flag();  // -h/--help/help print kUsage (below)
  bool help = false;
  app.add_flag("-h,--help", help);
  // Selectors may come before or after the command (fallthrough), except inside a fault plan.
  app.fallthrough();
  app.require_subcommand(0, 1);
  Selector sel;
  auto* o_dev = app.add_option("--device", sel.device);
  auto* o_pid = app.add_option("--pid", sel.pid)->check(CLI::Range(1, INT_MAX));
  auto* o_sock = app.add_option("--socket", sel.socket);
  app.add_option("--runtime-dir", sel.runtime_dir);
  o_sock->excludes(o_dev)->excludes(o_pid);

  CLI::App* c_help = app.add_subcommand("help");
  CLI::App* c_list = app.add_subcommand("list");
  CLI::App* c_env = app.add_subcommand("env");
  CLI::App* c_status = app.add_subcommand("status");
  bool status_json = false;
  c_status->add_flag("--json", status_json);
  bool markdown = false;
  c_env->add_flag("--markdown", markdown);

  CLI::App* c_fault = app.add_subcommand("fault");
  c_fault->require_subcommand(0, 1);
  CLI::App* c_fadd = c_fault->add_subcommand("add");
  c_fadd->prefix_command()->fallthrough(false);  // the plan's words are taken verbatim
  CLI::App* c_flist = c_fault->add_subcommand("list");
  bool fault_json = false;
  c_flist->add_flag("--json", fault_json);
  CLI::App* c_fclear = c_fault->add_subcommand("clear");

  CLI::App* c_stats = app.add_subcommand("stats");
  unsigned qpn = 0;
  double interval = 1.0;
  unsigned long long count = 0;
  bool watch = false, stats_json = false;
  auto* o_qp = c_stats->add_option("--qp", qpn)->check(CLI::Range(0u, 0xffffffu));
  c_stats->add_flag("--watch", watch);
  c_stats->add_flag("--json", stats_json);
  auto* o_int = c_stats->add_option("--interval", interval)->check(CLI::Range(1e-9, 86400.0));
  auto* o_cnt = c_stats->add_option("--count", count)->check(CLI::PositiveNumber);

  CLI::App* c_gids = app.add_subcommand("gids");
  std::string gid_ip;
  c_gids->add_option("--ip", gid_ip);

  CLI::App* c_cap = app.add_subcommand("capture");
  std::string cap_file;
  bool cap_stop = false;
  auto* o_w = c_cap->add_option("-w", cap_file);
  auto* o_stop = c_cap->add_flag("--stop", cap_stop);
  o_w->excludes(o_stop);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage(e.what());
  }
  if (help || *c_help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (app.get_subcommands().empty()) return usage("");

  if (*c_env) {
    std::fputs((markdown ? rnic::base::config_table_markdown() : rnic::base::config_table_text()).c_str(),
               stdout);
    return 0;
  }
  if (*c_gids) return print_gids(gid_ip);
  if (*c_status) return print_status(sel.runtime_dir, status_json);
  if (*c_list) {
    std::string dir = sel.runtime_dir.empty() ? rnic::emu::control_runtime_dir() : sel.runtime_dir;
    for (const ControlSocketInfo& s : rnic::emu::find_control_sockets(dir, true)) {
      if (!sel.device.empty() && s.device != sel.device) continue;
      if (sel.pid != 0 && s.pid != sel.pid) continue;
      std::printf("%s %d %s\n", s.device.c_str(), static_cast<int>(s.pid), s.path.c_str());
    }
    return 0;
  }

  std::string req;
  Output out = Output::kText;
  if (*c_fault) {
    if (*c_fadd) {
      std::vector<std::string> words = c_fadd->remaining();
      if (words.empty()) return usage("fault add: no rule given");
      req = "fault add";
      for (const std::string& w : words) {
        req += ' ';
        for (char ch : w) req += (ch == '\n' ? ';' : ch);  // a pasted plan: lines -> ';'
      }
    } else if (*c_flist) {
      req = "fault list";
      if (fault_json) out = Output::kFaultJson;
    } else if (*c_fclear) {
      req = "fault clear";
    } else {
      return usage("fault: add 'RULE', list or clear");
    }
  } else if (*c_stats) {
    req = *o_qp ? "stats qp " + std::to_string(qpn) : "stats";
    if ((*o_int || *o_cnt) && !watch) return usage("--interval/--count need --watch");
    if (stats_json) out = Output::kJson;
  } else if (*c_cap) {
    if (cap_stop == !cap_file.empty()) return usage("capture: give either -w FILE or --stop");
    req = cap_stop ? "capture stop" : "capture start " + absolute_path(cap_file);
  }

  Conn c;
  if (std::string e = open_conn(sel, &c); !e.empty()) return fail(e);
  if (watch) return run_watch(c, req, interval, count, stats_json);
  return run_simple(c, req, out);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return run(argc, argv);
}
