// softrnicd: one software RNIC per host address, shared by every process of the host
// (daemon/proto/proto.h describes the shape, docs/daemon.md the whole design).
//
//   softrnicd [--ip ADDR]... [--interface IF]... [--name NAME] [--mtu BYTES]
//             [--runtime-dir DIR] [--system] [--foreground] [--config FILE]
//
// Without --ip/--interface it serves the first free loopback address from 127.0.0.2, as embedded
// hosting does.
// Without --foreground it detaches once the sockets are bound (so a caller can start it and
// use it at once). SIGTERM/SIGINT stop it; its clients then see IBV_EVENT_DEVICE_FATAL.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "daemon/server.h"
#include "wire/udp_port.h"

namespace {

using rnic::daemon::DeviceSpec;

// The first IPv4 address of interface `ifname` (else its first IPv6 one), or "".
std::string address_of(const std::string& ifname) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return "";
  std::string v4, v6;
  for (ifaddrs* p = ifa; p != nullptr; p = p->ifa_next) {
    if (p->ifa_addr == nullptr || ifname != p->ifa_name) continue;
    char b[INET6_ADDRSTRLEN] = {};
    if (p->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, b, sizeof b);
      v4 = b;
    } else if (p->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* s6 = reinterpret_cast<sockaddr_in6*>(p->ifa_addr);
      inet_ntop(AF_INET6, &s6->sin6_addr, b, sizeof b);
      v6 = b;
      if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) v6 += "%" + ifname;
    }
  }
  freeifaddrs(ifa);
  return !v4.empty() ? v4 : v6;
}

// Config file: "key = value" lines, '#' comments; keys are the long options without "--".
bool read_config(const std::string& path, std::vector<std::string>* ips,
                 std::vector<std::string>* ifs, std::string* name, uint32_t* mtu,
                 std::string* runtime_dir, uint32_t* max_clients, uint32_t* max_qp,
                 uint32_t* max_mr, std::string* err) {
  std::ifstream in(path);
  if (!in) {
    *err = path + ": " + std::strerror(errno);
    return false;
  }
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (auto h = line.find('#'); h != std::string::npos) line.erase(h);
    auto trim = [](std::string s) {
      size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) {
      *err = path + ":" + std::to_string(n) + ": expected key = value";
      return false;
    }
    std::string k = trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
    try {
      if (k == "ip") ips->push_back(v);
      else if (k == "interface") ifs->push_back(v);
      else if (k == "name") *name = v;
      else if (k == "mtu") *mtu = static_cast<uint32_t>(std::stoul(v));
      else if (k == "runtime-dir") *runtime_dir = v;
      else if (k == "max-clients") *max_clients = static_cast<uint32_t>(std::stoul(v));
      else if (k == "max-qp") *max_qp = static_cast<uint32_t>(std::stoul(v));
      else if (k == "max-mr") *max_mr = static_cast<uint32_t>(std::stoul(v));
      else {
        *err = path + ":" + std::to_string(n) + ": unknown key '" + k + "'";
        return false;
      }
    } catch (...) {
      *err = path + ":" + std::to_string(n) + ": bad number '" + v + "'";
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"softrnicd: a software RoCEv2 RNIC shared by every process of this host"};
  std::vector<std::string> ips, ifs;
  std::string name, runtime_dir, config, log_level = "warn";
  uint32_t mtu = 0, max_clients = 254, max_qp = 0, max_mr = 0;
  bool system = false, foreground = false;
  app.add_option("--ip", ips, "a device on this address (repeatable; default: the first free "
                 "loopback address from 127.0.0.2)");
  app.add_option("--interface", ifs, "a device on this interface's first address (repeatable)");
  app.add_option("--name", name, "device name (several devices: NAME0, NAME1, ...)");
  app.add_option("--mtu", mtu, "active MTU in bytes (default: from the interface)");
  app.add_option("--runtime-dir", runtime_dir,
                 "where softrnicd.sock lives (default: SOFTRNIC_RUNTIME_DIR's default)");
  app.add_option("--max-clients", max_clients, "processes per device (1..254)");
  app.add_option("--max-qp", max_qp, "QPs per process (default: 61440); past it create_qp fails with ENOMEM");
  app.add_option("--max-mr", max_mr, "MRs per process (default: 28672); past it reg_mr fails with ENOMEM");
  app.add_option("--config", config, "file of key = value lines (same keys as the options)");
  app.add_option("--log-level", log_level, "error, warn, info, debug");
  app.add_flag("--system", system, "system service: socket in /run/softrnic, open to every user");
  app.add_flag("--foreground", foreground, "do not detach");
  CLI11_PARSE(app, argc, argv);

  std::string err;
  if (!config.empty() &&
      !read_config(config, &ips, &ifs, &name, &mtu, &runtime_dir, &max_clients, &max_qp, &max_mr,
                   &err)) {
    std::fprintf(stderr, "softrnicd: %s\n", err.c_str());
    return 2;
  }
  if (rnic::base::LogLevel lv; rnic::base::parse_log_level(log_level, &lv)) {
    rnic::base::set_log_level(lv);
  } else {
    std::fprintf(stderr, "softrnicd: bad --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  if (system && runtime_dir.empty()) runtime_dir = "/run/softrnic";
  for (const std::string& i : ifs) {
    std::string a = address_of(i);
    if (a.empty()) {
      std::fprintf(stderr, "softrnicd: interface %s has no address\n", i.c_str());
      return 2;
    }
    ips.push_back(a);
  }
  if (ips.empty()) {
    // As embedded hosting: the first loopback address from 127.0.0.2 whose port 4791 is free.
    for (uint32_t a = 0x7f000002u; a < 0x7f0000ffu && ips.empty(); ++a) {
      rnic::wire::Endpoint ep = rnic::wire::Endpoint::v4(a, rnic::wire::kRoceUdpPort);
      if (rnic::wire::probe_bind(ep) == 0) ips.push_back(ep.ip_string());
    }
    if (ips.empty()) {
      std::fprintf(stderr, "softrnicd: no free loopback address for UDP 4791 from 127.0.0.2\n");
      return 1;
    }
  }
  rnic::daemon::ServerOptions so;
  so.runtime_dir = runtime_dir;
  so.system = system;
  so.max_clients = max_clients;
  so.max_qp = max_qp;
  so.max_mr = max_mr;
  for (size_t i = 0; i < ips.size(); ++i) {
    DeviceSpec d;
    d.ip = ips[i];
    d.name = name.empty() ? "" : ips.size() == 1 ? name : name + std::to_string(i);
    d.active_mtu = mtu;
    so.devices.push_back(d);
  }
  // Signals arrive through a signalfd watched by a small thread that calls stop().
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  int ready[2] = {-1, -1};
  if (!foreground) {
    if (pipe2(ready, O_CLOEXEC) != 0) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) {  // parent: exit once the child has bound everything (or failed)
      close(ready[1]);
      char c = 1;
      ssize_t r = read(ready[0], &c, 1);
      return r == 1 && c == 0 ? 0 : 1;
    }
    close(ready[0]);
    setsid();
  }
  std::unique_ptr<rnic::daemon::Server> srv = rnic::daemon::Server::open(so, &err);
  if (!srv) {
    std::fprintf(stderr, "softrnicd: %s\n", err.c_str());
    if (ready[1] >= 0) {
      char c = 1;
      ssize_t w = write(ready[1], &c, 1);
      (void)w;
    }
    return 1;
  }
  std::fprintf(stderr, "softrnicd: pid %d serving %zu device(s) on %s\n", int(getpid()),
               so.devices.size(), srv->socket_path().c_str());
  if (ready[1] >= 0) {
    int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (dn >= 0) {
      dup2(dn, 0);
      dup2(dn, 1);
      close(dn);
    }
    char c = 0;
    ssize_t w = write(ready[1], &c, 1);
    (void)w;
    close(ready[1]);
  }
  int sfd = signalfd(-1, &set, SFD_CLOEXEC);
  std::thread sig([&] {
    signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) < 0 && errno == EINTR) {
    }
    srv->stop();
  });
  int rc = srv->run();
  if (sig.joinable()) {
    // Wake the signal thread if run() ended for another reason.
    kill(getpid(), SIGTERM);
    sig.join();
  }
  close(sfd);
  srv.reset();
  return rc == 0 ? 0 : 1;
}
