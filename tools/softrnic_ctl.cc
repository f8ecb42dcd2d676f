// softrnic-ctl: talks to a running device's control socket (emu/services/control.h): fault rules,
// counters (once or watched with deltas) and packet capture. Exit status: 0 ok, 1 the device
// refused the request or could not be reached, 2 usage error.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "emu/services/control.h"
#include "tools/control_client.h"

namespace {

using rnic::emu::ControlClient;
using rnic::emu::ControlReply;
using rnic::emu::ControlSocketInfo;

constexpr const char* kUsage =
    "usage: softrnic-ctl [--device NAME | --pid PID | --socket PATH] [--runtime-dir DIR] CMD\n"
    "  fault add 'RULE[; RULE...]'   add fault rules (all or none; see emu/fault/fault_rules.h)\n"
    "  fault list                    rules with their fire counts\n"
    "  fault clear                   remove every rule\n"
    "  stats [--qp N] [--watch [--interval S] [--count N]]\n"
    "                                counters as 'name value' (watch: + delta per interval)\n"
    "  capture -w FILE               start writing a pcap of all traffic to FILE\n"
    "  capture --stop                stop the capture\n"
    "  list                          running devices (device pid socket)\n"
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
  *v = std::strtoull(s.c_str(), &end, 0);
  return errno == 0 && end && *end == '\0' && s[0] != '-';
}

struct Selector {
  std::string device;
  pid_t pid = 0;
  std::string socket;
  std::string runtime_dir;
};

// Consumes a selector option at args[*i] (and its value). Returns 1 if consumed, 0 if args[*i]
// is not one, -1 on a usage error (message in *err).
int take_selector(const std::vector<std::string>& args, size_t* i, Selector* sel,
                  std::string* err) {
  const std::string& a = args[*i];
  std::string* dst = nullptr;
  if (a == "--device") dst = &sel->device;
  else if (a == "--socket") dst = &sel->socket;
  else if (a == "--runtime-dir") dst = &sel->runtime_dir;
  else if (a != "--pid") return 0;
  if (*i + 1 >= args.size()) {
    *err = a + " needs a value";
    return -1;
  }
  const std::string& v = args[++*i];
  if (dst) {
    *dst = v;
  } else {
    unsigned long long p = 0;
    if (!parse_num(v, &p) || p == 0 || p > INT_MAX) {
      *err = "bad --pid '" + v + "'";
      return -1;
    }
    sel->pid = static_cast<pid_t>(p);
  }
  ++*i;
  return 1;
}

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

// Sends one request; prints data lines to stdout. Returns the exit status.
int run_simple(Conn& c, const std::string& req) {
  ControlReply r;
  if (std::string e = c.client->request(req, &r); !e.empty()) return fail(e);
  for (const std::string& l : r.lines) std::printf("%s\n", l.c_str());
  if (!r.ok) return fail(r.error);
  return 0;
}

// Parses "name value" lines into an ordered list.
std::vector<std::pair<std::string, unsigned long long>> parse_stats(const ControlReply& r) {
  std::vector<std::pair<std::string, unsigned long long>> out;
  for (const std::string& l : r.lines) {
    size_t sp = l.rfind(' ');
    unsigned long long v = 0;
    if (sp == std::string::npos || !parse_num(l.substr(sp + 1), &v)) continue;
    out.emplace_back(l.substr(0, sp), v);
  }
  return out;
}

int run_watch(Conn& c, const std::string& req, double interval, unsigned long long count) {
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
    std::printf("--- %s pid %d %s%s\n", c.info.device.empty() ? "device" : c.info.device.c_str(),
                static_cast<int>(c.info.pid), ts, round == 1 ? "" : " (delta since last)");
    for (const auto& [name, v] : parse_stats(r)) {
      auto it = prev.find(name);
      if (it == prev.end()) {
        std::printf("%s %llu\n", name.c_str(), v);
      } else {
        long long d = static_cast<long long>(v - it->second);
        std::printf("%s %llu %+lld\n", name.c_str(), v, d);
      }
      prev[name] = v;
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

int run(std::vector<std::string> args) {
  Selector sel;
  std::string err;
  size_t i = 0;
  // Leading selectors.
  while (i < args.size()) {
    int t = take_selector(args, &i, &sel, &err);
    if (t < 0) return usage(err);
    if (t == 0) break;
  }
  if (i >= args.size()) return usage("");
  std::string cmd = args[i++];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // Remaining words: selectors anywhere, except inside a fault plan.
  std::vector<std::string> rest;
  bool plan = false;
  while (i < args.size()) {
    if (!plan) {
      int t = take_selector(args, &i, &sel, &err);
      if (t < 0) return usage(err);
      if (t == 1) continue;
    }
    rest.push_back(args[i++]);
    if (cmd == "fault" && rest.size() == 1 && rest[0] == "add") plan = true;
  }
  int selectors = !sel.socket.empty() + (!sel.device.empty() || sel.pid != 0);
  if (selectors > 1) return usage("--socket excludes --device and --pid");

  if (cmd == "list") {
    if (!rest.empty()) return usage("list takes no arguments");
    std::string dir = sel.runtime_dir.empty() ? rnic::emu::control_runtime_dir() : sel.runtime_dir;
    for (const ControlSocketInfo& s : rnic::emu::find_control_sockets(dir, true)) {
      if (!sel.device.empty() && s.device != sel.device) continue;
      if (sel.pid != 0 && s.pid != sel.pid) continue;
      std::printf("%s %d %s\n", s.device.c_str(), static_cast<int>(s.pid), s.path.c_str());
    }
    return 0;
  }

  std::string req;
  bool watch = false;
  double interval = 1.0;
  unsigned long long count = 0;
  if (cmd == "fault") {
    if (rest.empty()) return usage("fault: add, list or clear?");
    if (rest[0] == "add") {
      if (rest.size() < 2) return usage("fault add: no rule given");
      req = "fault add";
      for (size_t k = 1; k < rest.size(); ++k) {
        req += ' ';
        for (char ch : rest[k]) req += (ch == '\n' ? ';' : ch);  // a pasted plan: lines -> ';'
      }
    } else if ((rest[0] == "list" || rest[0] == "clear") && rest.size() == 1) {
      req = "fault " + rest[0];
    } else {
      return usage("fault: add 'RULE', list or clear");
    }
  } else if (cmd == "stats") {
    req = "stats";
    bool interval_set = false;
    for (size_t k = 0; k < rest.size(); ++k) {
      const std::string& a = rest[k];
      unsigned long long v = 0;
      if ((a == "--qp" || a == "--interval" || a == "--count") && k + 1 >= rest.size()) {
        return usage(a + " needs a value");
      }
      if (a == "--qp") {
        if (!parse_num(rest[++k], &v) || v > 0xffffff) return usage("bad QPN '" + rest[k] + "'");
        req = "stats qp " + std::to_string(v);
      } else if (a == "--watch") {
        watch = true;
      } else if (a == "--interval") {
        char* end = nullptr;
        interval = std::strtod(rest[++k].c_str(), &end);
        if (!end || *end != '\0' || !(interval > 0) || interval > 86400) {
          return usage("bad --interval '" + rest[k] + "'");
        }
        interval_set = true;
      } else if (a == "--count") {
        if (!parse_num(rest[++k], &count) || count == 0) return usage("bad --count");
      } else {
        return usage("stats: unknown argument '" + a + "'");
      }
    }
    if ((interval_set || count != 0) && !watch) return usage("--interval/--count need --watch");
  } else if (cmd == "capture") {
    std::string file;
    bool stop = false;
    for (size_t k = 0; k < rest.size(); ++k) {
      if (rest[k] == "-w" && k + 1 < rest.size()) {
        file = rest[++k];
      } else if (rest[k] == "--stop") {
        stop = true;
      } else {
        return usage("capture: -w FILE or --stop");
      }
    }
    if (stop == !file.empty()) return usage("capture: give either -w FILE or --stop");
    req = stop ? "capture stop" : "capture start " + absolute_path(file);
  } else {
    return usage("unknown command '" + cmd + "'");
  }

  Conn c;
  if (std::string e = open_conn(sel, &c); !e.empty()) return fail(e);
  if (watch) return run_watch(c, req, interval, count);
  return run_simple(c, req);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return run(std::vector<std::string>(argv + 1, argv + argc));
}
