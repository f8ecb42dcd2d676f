// tests/daemon: softrnicd shared by several processes (issue 16's must-show items). Each test
// starts its own softrnicd (SOFTRNICD, --foreground) in a fresh runtime directory and drives
// client processes (DCLIENT, tests/daemon/dclient.cc: the shim, SOFTRNIC_HOSTING=daemon) over
// their stdin/stdout:
//  - FourClientsAndAnAttacker: four processes on one device and one GID with interleaved RC
//    traffic (0<->1, 2<->3, 0<->2, 1<->3; WRITEs and SENDs, every byte checked) while a fifth
//    uses another process's rkey on a QP connected to a third (remote access error, memory
//    unchanged, counted by the QP's owner) and forges packets to another process's QPNs from a
//    plain UDP socket (dropped and counted); the four complete with correct data.
//  - CrashLoop: a client killed with SIGKILL mid-transfer, DAEMON_TEST_CRASHES times (default
//    100): each time the surviving peer's QP fails with RETRY_EXC_ERR within its retry
//    timeout and the daemon's slots in use return to one (the survivor), no slot leaked.
//  - DaemonDeath: softrnicd killed (SIGKILL, SIGTERM) under a client with outstanding WRs:
//    IBV_EVENT_DEVICE_FATAL, every WR flushed, a clean exit.
//  - MaliciousSocket: garbage, short, oversized and out-of-order messages, wrong types, slot
//    exhaustion, many idle connections, another client's service ID, sockets kept after the
//    connection's end: each counted or refused, the daemon keeps serving a real client.
// softrnicd must exit 0 after SIGTERM in every test (under ASan: no leak, no error).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/proto/proto.h"

namespace {

using Json = nlohmann::json;
namespace dp = rnic::daemon;

uint64_t mono_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// Exit status of a waited child as text ("exit 0", "signal 9").
std::string how(int st) {
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return "signal " + std::to_string(WTERMSIG(st));
  return "?";
}

// Waits up to ms for pid; returns its status or -1.
int wait_for(pid_t pid, int ms) {
  uint64_t end = mono_ms() + uint64_t(ms);
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (mono_ms() > end) return -1;
    usleep(2000);
  }
}

class Daemon {
 public:
  // ip: an address of its own per test (127.0.16.x: no other test uses them), so tests may
  // run at the same time.
  // nofile: its descriptor limit (0: inherited).
  explicit Daemon(const std::string& ip, std::vector<std::string> extra = {}, rlim_t nofile = 0) {
    char tmpl[] = "/tmp/softrnic-dtest-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::vector<std::string> args = {SOFTRNICD, "--foreground", "--runtime-dir", dir_, "--ip", ip};
    for (auto& e : extra) args.push_back(e);
    pid_ = fork();
    if (pid_ == 0) {
      if (nofile != 0) {
        rlimit rl{nofile, nofile};
        setrlimit(RLIMIT_NOFILE, &rl);
      }
      std::vector<char*> av;
      for (auto& a : args) av.push_back(const_cast<char*>(a.c_str()));
      av.push_back(nullptr);
      execv(av[0], av.data());
      _exit(127);
    }
    // Ready once kStatus answers.
    uint64_t end = mono_ms() + 20000;
    while (mono_ms() < end) {
      Json j;
      if (status(&j)) {
        ip_ = j["devices"][0]["ip"].get<std::string>();
        return;
      }
      if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      usleep(10000);
    }
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::string rm = "rm -rf '" + dir_ + "'";
    if (std::system(rm.c_str()) != 0) {
    }
  }
  bool up() const { return pid_ > 0 && !ip_.empty(); }
  const std::string& dir() const { return dir_; }
  const std::string& ip() const { return ip_; }
  pid_t pid() const { return pid_; }

  bool status(Json* out) const {
    int fd = dp::connect_daemon(dir_);
    if (fd < 0) return false;
    dp::Header req{uint32_t(dp::MsgType::kStatus), sizeof(dp::Header)};
    std::vector<char> buf(1 << 20);
    ssize_t r = dp::call(fd, &req, sizeof req, buf.data(), buf.size(), nullptr, 0, 5000);
    close(fd);
    if (r <= static_cast<ssize_t>(sizeof(dp::Header))) return false;
    *out = Json::parse(std::string(buf.data() + sizeof(dp::Header), size_t(r) - sizeof(dp::Header)),
                       nullptr, false);
    return !out->is_discarded();
  }
  Json status() const {
    Json j;
    EXPECT_TRUE(status(&j)) << "softrnicd does not answer kStatus";
    return j;
  }
  uint64_t counter(const char* k) const { return status().value(k, uint64_t{0}); }
  uint64_t dev_field(const char* k) const { return status()["devices"][0].value(k, uint64_t{0}); }
  // Polls until the device's slots_in_use is n (and nobody waits for an exit); false on timeout.
  bool wait_slots(uint64_t n, int ms = 5000) const {
    uint64_t end = mono_ms() + uint64_t(ms);
    for (;;) {
      Json j = status();
      if (j.is_object() && j["devices"][0].value("slots_in_use", uint64_t{99}) == n &&
          j["devices"][0].value("slots_waiting_exit", uint64_t{99}) == 0)
        return true;
      if (mono_ms() > end) return false;
      usleep(2000);
    }
  }
  // Signals softrnicd and returns its wait status (-1: it did not exit in 10 s).
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int st = wait_for(pid_, 10000);
    if (st != -1) pid_ = -1;
    return st;
  }

 private:
  std::string dir_, ip_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
};

// A dclient process driven by lines.
class Client {
 public:
  Client(const Daemon& d) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      setenv("SOFTRNIC_HOSTING", "daemon", 1);
      setenv("SOFTRNIC_RUNTIME_DIR", d.dir().c_str(), 1);
      execl(DCLIENT, DCLIENT, static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Client() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0) {
      if (wait_for(pid_, 5000) == -1) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
  }
  pid_t pid() const { return pid_; }
  void send(const std::string& line) {
    std::string l = line + "\n";
    ASSERT_EQ(write(to_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // The next reply line ("" after timeout_ms or at EOF).
  std::string read(int timeout_ms = 30000) {
    uint64_t end = mono_ms() + uint64_t(timeout_ms);
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      int left = static_cast<int>(end - std::min(end, mono_ms()));
      if (left == 0) return "";
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char b[4096];
      ssize_t n = ::read(from_, b, sizeof b);
      if (n <= 0) return "";
      buf_.append(b, size_t(n));
    }
  }
  // Sends a command and returns the words of its "ok" reply after "ok" (fails the test else).
  std::vector<std::string> cmd(const std::string& line, int timeout_ms = 30000) {
    send(line);
    std::string r = read(timeout_ms);
    EXPECT_EQ(r.rfind("ok", 0), 0u) << "pid " << pid_ << ": '" << line << "' -> '" << r << "'";
    std::vector<std::string> w = words(r);
    if (!w.empty()) w.erase(w.begin());
    return w;
  }
  // Closes stdin (dclient tears down and exits) and returns the wait status.
  int quit() {
    close(to_);
    to_ = -1;
    int st = wait_for(pid_, 10000);
    if (st != -1) pid_ = -1;
    return st;
  }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buf_;
};

// `softrnic-ctl stats` of the device of process pid.
std::map<std::string, uint64_t> stats(const Daemon& d, pid_t pid) {
  std::string c = std::string(SOFTRNIC_CTL) + " --runtime-dir '" + d.dir() + "' --pid " +
                  std::to_string(pid) + " stats";
  std::map<std::string, uint64_t> m;
  FILE* f = popen(c.c_str(), "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    auto w = words(line);
    if (w.size() == 2) m[w[0]] = std::strtoull(w[1].c_str(), nullptr, 10);
  }
  pclose(f);
  return m;
}

constexpr uint32_t kWindow = 64 * 1024;  // dclient.cc
constexpr int kRemAccessErr = IBV_WC_REM_ACCESS_ERR;


TEST(Daemon, FourClientsAndAnAttacker) {
  Daemon d("127.0.16.1");
  ASSERT_TRUE(d.up());
  std::vector<std::unique_ptr<Client>> c;
  std::vector<std::string> gid, addr, rkey;
  for (int i = 0; i < 5; ++i) {
    c.push_back(std::make_unique<Client>(d));
    auto w = c[i]->cmd("open " + std::to_string(i));
    ASSERT_EQ(w.size(), 2u);
    gid.push_back(w[0]);
    w = c[i]->cmd("mr win " + std::to_string(8 * kWindow) + " " + std::to_string(100 + i));
    ASSERT_EQ(w.size(), 2u);
    addr.push_back(w[0]);
    rkey.push_back(w[1]);
  }
  for (int i = 1; i < 5; ++i) EXPECT_EQ(gid[i], gid[0]) << "one device, one GID for every process";
  // Every process has its own slot: the QPN's and rkey's top bytes differ.
  Json st = d.status();
  ASSERT_EQ(st["devices"][0]["slots_in_use"], 5);
  ASSERT_EQ(st["devices"][0]["clients"].size(), 5u);

  // RC connections a <-> b: QP "q<b>" in a, "q<a>" in b.
  const int pairs[][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}};
  std::map<std::pair<int, int>, std::vector<std::string>> qp_of;  // (a, b): a's QPN and PSN
  for (auto [a, b] : pairs) {
    auto qa = c[a]->cmd("qp q" + std::to_string(b));
    auto qb = c[b]->cmd("qp q" + std::to_string(a));
    ASSERT_EQ(qa.size(), 2u);
    ASSERT_EQ(qb.size(), 2u);
    qp_of[{a, b}] = qa;
    qp_of[{b, a}] = qb;
    c[a]->cmd("connect q" + std::to_string(b) + " " + qb[0] + " " + qb[1] + " " + gid[b] + " " +
              std::to_string(b) + " " + addr[b] + " " + rkey[b] + " 14 7");
    c[b]->cmd("connect q" + std::to_string(a) + " " + qa[0] + " " + qa[1] + " " + gid[a] + " " +
              std::to_string(a) + " " + addr[a] + " " + rkey[a] + " 14 7");
  }
  // The attacker (4): QPs "w" and "r" connected to victim 0's "atkw"/"atkr"; process 0 has an
  // MR the attacker may use ("open"); process 1's window MR is what it must not reach.
  auto open0 = c[0]->cmd("mr open 65536 55");
  ASSERT_EQ(open0.size(), 2u);
  for (std::string n : {"w", "r"}) {
    auto v = c[0]->cmd("qp atk" + n);
    auto a = c[4]->cmd("qp " + n);
    ASSERT_EQ(v.size(), 2u);
    ASSERT_EQ(a.size(), 2u);
    c[0]->cmd("connect atk" + n + " " + a[0] + " " + a[1] + " " + gid[4] + " 4 0 0 14 7");
    c[4]->cmd("connect " + n + " " + v[0] + " " + v[1] + " " + gid[0] + " 0 0 0 14 7");
  }
  // P1's QP in RESET, for a forged packet (its QPN's top byte is P1's slot).
  auto q10 = c[1]->cmd("qp spare");
  ASSERT_EQ(q10.size(), 2u);
  const uint32_t slot1 = std::stoul(q10[0]) >> 16;
  const std::string p1_target = std::to_string(std::stoull(addr[1]) + 4 * kWindow);
  const std::string p1_hash = c[1]->cmd("hash win " + std::to_string(4 * kWindow) + " " +
                                        std::to_string(kWindow))[0];
  const std::string p0_hash = c[0]->cmd("hash win " + std::to_string(4 * kWindow) + " " +
                                        std::to_string(kWindow))[0];
  auto before0 = stats(d, c[0]->pid());
  auto before1 = stats(d, c[1]->pid());
  const uint64_t daemon_before = d.counter("drop_cm_unrouted") + d.counter("cm_routed") +
                                 d.counter("drop_free_slot");

  // Interleaved traffic on the four while the attacker works.
  const int rounds = 400, size = 2048;
  const char* qps[] = {"q1 q2", "q0 q3", "q3 q0", "q2 q1"};
  for (int i = 0; i < 4; ++i) {
    c[i]->send("traffic " + std::to_string(rounds) + " " + std::to_string(size) + " " + qps[i]);
  }
  // A legitimate WRITE and READ on the attacker's QPs work (the QPs are sound) ...
  EXPECT_EQ(c[4]->cmd("rdma write w win 0 256 " + open0[0] + " " + open0[1]),
            std::vector<std::string>{"0"});
  EXPECT_EQ(c[4]->cmd("rdma read r win 0 256 " + open0[0] + " " + open0[1]),
            std::vector<std::string>{"0"});
  // ... P1's rkey on them is refused: remote access error at the attacker.
  EXPECT_EQ(c[4]->cmd("rdma write w win 0 256 " + p1_target + " " + rkey[1]),
            std::vector<std::string>{std::to_string(kRemAccessErr)});
  EXPECT_EQ(c[4]->cmd("rdma read r win 4096 256 " + p1_target + " " + rkey[1]),
            std::vector<std::string>{std::to_string(kRemAccessErr)});
  // Forged RDMA WRITEs (opcode 10) with P1's own rkey from a plain UDP socket to P1's QPNs:
  // to its live QP towards P0 with a bad ICRC, and well formed but with a stale PSN (behind
  // the PSNs P0 sends it, a duplicate); to its QP in RESET; to a QPN of its slot that does not
  // exist; and one to a slot nobody holds.
  const std::string live = qp_of[{1, 0}][0];
  const uint32_t stale = (std::stoul(qp_of[{0, 1}][1]) - 10) & 0xffffff;
  const std::string forged = " 10 " + std::to_string(stale) + " " + p1_target + " " + rkey[1] + " 64 ";
  EXPECT_TRUE(c[4]->cmd("forge " + d.ip() + " " + live + forged + "1").empty());
  EXPECT_TRUE(c[4]->cmd("forge " + d.ip() + " " + live + forged + "0").empty());
  EXPECT_TRUE(c[4]->cmd("forge " + d.ip() + " " + q10[0] + forged + "0").empty());
  EXPECT_TRUE(c[4]->cmd("forge " + d.ip() + " " + std::to_string(slot1 << 16 | 0xFFF0) + forged +
                        "0").empty());
  EXPECT_TRUE(c[4]->cmd("forge " + d.ip() + " " + std::to_string(0xEE0011) + forged + "0").empty());

  for (int i = 0; i < 4; ++i) {
    auto w = words(c[i]->read(120000));
    ASSERT_EQ(w.size(), 3u) << "process " << i << " traffic did not finish";
    EXPECT_EQ(w[0], "ok");
    EXPECT_EQ(w[1], std::to_string(2 * rounds));
    EXPECT_EQ(w[2], std::to_string(2 * rounds));
  }
  for (auto [a, b] : pairs) {
    c[a]->cmd("checkwin win " + std::to_string(b) + " " + std::to_string(rounds) + " " +
              std::to_string(size));
    c[b]->cmd("checkwin win " + std::to_string(a) + " " + std::to_string(rounds) + " " +
              std::to_string(size));
  }
  // Nothing reached P1's memory or P0's window of the attacker.
  EXPECT_EQ(c[1]->cmd("hash win " + std::to_string(4 * kWindow) + " " + std::to_string(kWindow))[0],
            p1_hash);
  EXPECT_EQ(c[0]->cmd("hash win " + std::to_string(4 * kWindow) + " " + std::to_string(kWindow))[0],
            p0_hash);
  // Counted where they landed: P0 (the QPs' owner) refused two requests; P1 dropped the
  // forged packets (bad ICRC, unknown QPN, a request to a QP that is not ready).
  auto after0 = stats(d, c[0]->pid());
  auto after1 = stats(d, c[1]->pid());
  ASSERT_FALSE(after0.empty());
  ASSERT_FALSE(after1.empty());
  EXPECT_GE(after0["rem_access_nak_sent"] - before0["rem_access_nak_sent"], 2u);
  EXPECT_GE(after1["icrc_err"] - before1["icrc_err"], 1u);
  EXPECT_GE(after1["drop_unknown_qpn"] - before1["drop_unknown_qpn"], 1u);
  EXPECT_GE(after1["drop_bad_state"] - before1["drop_bad_state"], 1u);
  // (The stale-PSN write counts here; so do the traffic's own retransmissions.)
  EXPECT_GE(after1["duplicate_request"] - before1["duplicate_request"], 1u);
  EXPECT_EQ(after1["rem_access_nak_sent"], before1["rem_access_nak_sent"]);
  auto atk_stats = stats(d, c[4]->pid());
  std::printf("P0 rem_access_nak_sent +%llu; P1 icrc_err +%llu drop_unknown_qpn +%llu "
              "drop_bad_state +%llu duplicate_request +%llu; attacker rem_access_nak_rcvd %llu\n",
              (unsigned long long)(after0["rem_access_nak_sent"] - before0["rem_access_nak_sent"]),
              (unsigned long long)(after1["icrc_err"] - before1["icrc_err"]),
              (unsigned long long)(after1["drop_unknown_qpn"] - before1["drop_unknown_qpn"]),
              (unsigned long long)(after1["drop_bad_state"] - before1["drop_bad_state"]),
              (unsigned long long)(after1["duplicate_request"] - before1["duplicate_request"]),
              (unsigned long long)atk_stats["rem_access_nak_rcvd"]);
  EXPECT_GE(atk_stats["rem_access_nak_rcvd"], 2u);
  // The packet for a slot nobody holds reached the daemon, which counted it.
  EXPECT_GE(d.counter("drop_cm_unrouted") + d.counter("cm_routed") + d.counter("drop_free_slot"),
            daemon_before + 1);

  for (int i = 0; i < 5; ++i) EXPECT_EQ(how(c[i]->quit()), "exit 0") << "process " << i;
  EXPECT_TRUE(d.wait_slots(0));
  EXPECT_EQ(how(d.stop()), "exit 0");
}

// The retry timeout of the survivor's QP: 4.096 us * 2^kTimeout per try, kRetry retries.
// With the timer's backoff (x1, x2, x4) a live victim may be off the CPU for ~117 ms before
// the survivor gives up on it: at 4.2 ms (timeout 10, ~30 ms in all) a loaded 2-core machine
// failed the survivor's first WRITE in one loop of 100 before the victim was killed.
constexpr int kTimeout = 12;  // 16.8 ms
constexpr int kRetry = 2;

TEST(Daemon, CrashLoop) {
  const char* e = std::getenv("DAEMON_TEST_CRASHES");
  const int loops = e != nullptr ? std::atoi(e) : 100;
  Daemon d("127.0.16.2");
  ASSERT_TRUE(d.up());
  Client s(d);
  auto g = s.cmd("open 9");
  ASSERT_EQ(g.size(), 2u);
  auto sm = s.cmd("mr win " + std::to_string(8 * kWindow) + " 9");
  ASSERT_EQ(sm.size(), 2u);
  // (kRetry + 1) tries of the timeout, the k-th backed off x2^min(k, 2) (docs/congestion.md
  // §2), plus scheduling slack (2 shared cores, sanitizers).
  uint64_t tries_ms = 0;
  for (int k = 0; k <= kRetry; ++k) tries_ms += ((4096ull << kTimeout) << std::min(k, 2)) / 1000000 + 1;
  const uint64_t bound_ms = tries_ms + 1000;
  uint64_t worst = 0, total = 0;
  int stalls = 0;
  constexpr int kMaxStalls = 3;
  const uint64_t t_start = mono_ms();
  for (int i = 0; i < loops; ++i) {
    SCOPED_TRACE("crash " + std::to_string(i));
    Client v(d);
    auto vg = v.cmd("open " + std::to_string(i % 8));
    auto vm = v.cmd("mr win " + std::to_string(8 * kWindow) + " 1");
    auto vq = v.cmd("qp a");
    auto sq = s.cmd("qp s");
    ASSERT_EQ(vq.size(), 2u);
    ASSERT_EQ(sq.size(), 2u);
    ASSERT_EQ(vg.size(), 2u);
    ASSERT_EQ(vm.size(), 2u);
    s.cmd("connect s " + vq[0] + " " + vq[1] + " " + vg[0] + " 1 " + vm[0] + " " + vm[1] + " " +
          std::to_string(kTimeout) + " " + std::to_string(kRetry));
    v.cmd("connect a " + sq[0] + " " + sq[1] + " " + g[0] + " 9 " + sm[0] + " " + sm[1] + " 14 7");
    ASSERT_TRUE(d.wait_slots(2));
    // Both stream RDMA WRITEs at each other; the victim dies mid-transfer.
    v.send("stream a win 4096");
    s.send("stream s win 4096");
    ASSERT_EQ(v.read(), "ok started");
    const std::string s_started = s.read();
    if (s_started.rfind("ok 12 ", 0) == 0 && stalls < kMaxStalls) {
      // The survivor gave up on a live victim before the kill: its ~117 ms retry budget
      // (kTimeout, kRetry, backoff) ran out while a loaded machine kept the victim off the
      // CPU (a helper's analysis of the counters: every packet is accounted for, the late
      // ACKs met a QP already in ERR). Counted, shown and bounded; the loop is redone.
      ++stalls;
      std::printf("crash %d: the survivor's stream failed before the kill (stall %d of at most %d)\n",
                  i, stalls, kMaxStalls);
      v.kill9();
      s.cmd("destroy s");
      ASSERT_TRUE(d.wait_slots(1)) << d.status().dump();
      --i;
      continue;
    }
    if (s_started != "ok started") {
      // Both processes' counters, to tell a scheduling stall from a drop.
      for (auto [who, pid] : {std::pair{"victim", v.pid()}, std::pair{"survivor", s.pid()}}) {
        std::string line;
        for (auto& [k, n] : stats(d, pid)) {
          if (n != 0) line += " " + k + "=" + std::to_string(n);
        }
        std::printf("%s pid %d:%s\n", who, int(pid), line.c_str());
      }
    }
    ASSERT_EQ(s_started, "ok started");
    const uint64_t t0 = mono_ms();
    v.kill9();
    auto w = words(s.read(10000));
    ASSERT_EQ(w.size(), 3u) << "the survivor's QP got no error completion";
    EXPECT_EQ(w[1], std::to_string(IBV_WC_RETRY_EXC_ERR));
    const uint64_t te = std::stoull(w[2]);
    const uint64_t dt = te > t0 ? te - t0 : 0;
    EXPECT_LE(dt, bound_ms);
    worst = std::max(worst, dt);
    total += dt;
    s.cmd("destroy s");
    // The victim's slot is back at once: only the survivor's is in use.
    ASSERT_TRUE(d.wait_slots(1)) << d.status().dump();
    if (HasFatalFailure()) return;
  }
  const uint64_t elapsed = mono_ms() - t_start;
  Json st = d.status();
  // Slots are reused, never leaked: the survivor's and the one the victims take in turn.
  EXPECT_LE(st["devices"][0].value("slots_created", uint64_t{999}), 3u) << st.dump();
  std::printf("%d crashes in %llu ms; survivor's RETRY_EXC_ERR after the kill: worst %llu ms, "
              "mean %llu ms (bound %llu ms); %d loops redone after a stall before the kill\n",
              loops, (unsigned long long)elapsed, (unsigned long long)worst,
              (unsigned long long)(loops ? total / uint64_t(loops) : 0),
              (unsigned long long)bound_ms, stalls);
  EXPECT_EQ(how(s.quit()), "exit 0");
  EXPECT_TRUE(d.wait_slots(0));
  EXPECT_EQ(how(d.stop()), "exit 0");
}

// softrnicd dies under a client with outstanding WRs (sends to a QP that never answers,
// receives): the client sees IBV_EVENT_DEVICE_FATAL and every WR flushed, and exits cleanly.
TEST(Daemon, DaemonDeath) {
  for (int sig : {SIGKILL, SIGTERM}) {
    SCOPED_TRACE("signal " + std::to_string(sig));
    Daemon d("127.0.16.3");
    ASSERT_TRUE(d.up());
    Client c(d);
    auto g = c.cmd("open 0");
    ASSERT_EQ(g.size(), 2u);
    auto q = c.cmd("qp a");
    ASSERT_EQ(q.size(), 2u);
    // Towards a QPN of our own slot that does not exist: nothing is ever acknowledged
    // (timeout 18: 1 s per try, 7 retries).
    const uint32_t nobody = (std::stoul(q[0]) & 0xff0000u) | 0xFFF0;
    c.cmd("connect a " + std::to_string(nobody) + " 0 " + g[0] + " 1 0 0 18 7");
    c.cmd("outstanding a 8");
    int st = d.stop(sig);
    EXPECT_NE(st, -1);
    if (sig == SIGTERM) {
      EXPECT_EQ(how(st), "exit 0");
    }
    auto w = c.cmd("waitfatal 5000", 10000);
    ASSERT_EQ(w.size(), 4u);
    EXPECT_EQ(w[0], std::to_string(IBV_EVENT_DEVICE_FATAL));
    EXPECT_EQ(w[1], "16") << "8 sends and 8 receives flushed";
    EXPECT_EQ(w[2], "0") << "no other status";
    // A new QP on a dead device is refused (or any verb fails cleanly): no hang.
    c.send("qp b");
    const std::string r = c.read(10000);
    EXPECT_FALSE(r.empty());
    std::printf("after DEVICE_FATAL (signal %d): waitfatal -> %s %s %s %s, a new QP -> '%s'\n", sig,
                w[0].c_str(), w[1].c_str(), w[2].c_str(), w[3].c_str(), r.c_str());
    EXPECT_EQ(how(c.quit()), "exit 0");
  }
}

// A raw connection to the daemon socket.
int raw(const Daemon& d) { return dp::connect_daemon(d.dir()); }

// Sends bytes and returns whether the daemon closed the connection (within 2 s).
bool closed_after(int fd, const void* p, size_t n) {
  if (send(fd, p, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) return true;
  pollfd pf{fd, POLLIN, 0};
  for (;;) {
    if (poll(&pf, 1, 2000) != 1) return false;
    char b[8192];
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r <= 0) return true;  // (a reply before the close is read and skipped)
  }
}

template <class M>
M msg(dp::MsgType t) {
  M m{};
  dp::init_msg(&m, t);
  return m;
}

bool hello(int fd) {
  auto h = msg<dp::HelloMsg>(dp::MsgType::kHello);
  dp::DevicesMsg out;
  return dp::call(fd, &h, sizeof h, &out, sizeof out, nullptr, 0, 5000) == sizeof out;
}

// kOpen: the reply's err (0 with the slot's sockets in *fds).
int open_slot(int fd, std::vector<int>* fds, uint32_t index = 0) {
  auto o = msg<dp::OpenMsg>(dp::MsgType::kOpen);
  o.index = index;
  dp::OpenedMsg out{};
  ssize_t r = dp::call(fd, &o, sizeof o, &out, sizeof out, fds, dp::kMaxFds, 5000);
  return r == sizeof out ? out.err : -1;
}

int listen_sid(int fd, uint64_t sid, dp::MsgType t = dp::MsgType::kListen) {
  auto l = msg<dp::ServiceMsg>(t);
  l.service_id = sid;
  l.seq = 7;
  dp::ReplyMsg out{};
  ssize_t r = dp::call(fd, &l, sizeof l, &out, sizeof out, nullptr, 0, 5000);
  return r == sizeof out && out.seq == 7 ? out.err : -1;
}

// CPU ticks (user + system) process pid has used.
uint64_t cpu_ticks(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[2048] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* p = std::strrchr(buf, ')');
  if (n == 0 || p == nullptr) return 0;
  auto w = words(p + 2);  // state ppid ... utime(12th) stime(13th)
  return w.size() > 12 ? std::stoull(w[11]) + std::stoull(w[12]) : 0;
}

// More connections than softrnicd has descriptors: the ones beyond are refused (closed at
// once, counted), the daemon does not spin on its listening socket, and serves again once
// they are gone.
TEST(Daemon, OutOfDescriptors) {
  Daemon d("127.0.16.5", {}, 64);
  ASSERT_TRUE(d.up());
  std::vector<int> conns;
  for (int i = 0; i < 120; ++i) {
    int fd = raw(d);
    if (fd >= 0) conns.push_back(fd);
  }
  usleep(200000);
  const uint64_t t0 = cpu_ticks(d.pid());
  usleep(500000);
  const uint64_t spent = cpu_ticks(d.pid()) - t0;
  EXPECT_LT(spent, 10u) << "softrnicd spun for " << spent << " ticks in 0.5 s";
  // The refused ones read end-of-file.
  size_t refused = 0;
  for (int fd : conns) {
    char b;
    if (recv(fd, &b, 1, MSG_DONTWAIT) == 0) ++refused;
  }
  EXPECT_GT(refused, 0u);
  for (int fd : conns) close(fd);
  uint64_t end = mono_ms() + 5000;
  Json st;
  while (!d.status(&st) && mono_ms() < end) usleep(10000);
  ASSERT_TRUE(st.is_object());
  EXPECT_GE(st.value("refused", uint64_t{0}), refused);  // + status polls refused meanwhile
  Client cl(d);
  EXPECT_EQ(cl.cmd("open 1").size(), 2u);
  EXPECT_EQ(how(cl.quit()), "exit 0");
  EXPECT_EQ(how(d.stop()), "exit 0");
}

TEST(Daemon, MaliciousSocket) {
  Daemon d("127.0.16.4", {"--max-clients", "4"});
  ASSERT_TRUE(d.up());
  uint64_t bad = 0;
  {
    // Garbage, too short, too long, a header whose length lies, an unknown type.
    int fd = raw(d);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; ++i) junk[i] = uint8_t(i * 37 + 11);
    EXPECT_TRUE(closed_after(fd, junk, sizeof junk));
    close(fd);
    ++bad;
    fd = raw(d);
    EXPECT_TRUE(closed_after(fd, "abc", 3));
    close(fd);
    ++bad;
    std::vector<uint8_t> big(3 * dp::kMaxMsg);
    dp::Header bh{uint32_t(dp::MsgType::kHello), uint32_t(big.size())};
    std::memcpy(big.data(), &bh, sizeof bh);
    fd = raw(d);
    EXPECT_TRUE(closed_after(fd, big.data(), big.size()));
    close(fd);
    ++bad;
    auto h = msg<dp::HelloMsg>(dp::MsgType::kHello);
    h.h.len = 8;
    fd = raw(d);
    EXPECT_TRUE(closed_after(fd, &h, sizeof h));
    close(fd);
    ++bad;
    dp::Header unknown{999, sizeof(dp::Header)};
    fd = raw(d);
    EXPECT_TRUE(closed_after(fd, &unknown, sizeof unknown));
    close(fd);
    ++bad;
  }
  {
    // Out of order: kOpen before kHello, kListen before kOpen, a second kHello, a wrong
    // version, kStatus with a body, kOpen twice.
    int fd = raw(d);
    auto o = msg<dp::OpenMsg>(dp::MsgType::kOpen);
    EXPECT_TRUE(closed_after(fd, &o, sizeof o));
    close(fd);
    ++bad;
    fd = raw(d);
    ASSERT_TRUE(hello(fd));
    auto l = msg<dp::ServiceMsg>(dp::MsgType::kListen);
    EXPECT_TRUE(closed_after(fd, &l, sizeof l));
    close(fd);
    ++bad;
    fd = raw(d);
    ASSERT_TRUE(hello(fd));
    auto h = msg<dp::HelloMsg>(dp::MsgType::kHello);
    EXPECT_TRUE(closed_after(fd, &h, sizeof h));
    close(fd);
    ++bad;
    fd = raw(d);
    h.version = 99;
    EXPECT_TRUE(closed_after(fd, &h, sizeof h));
    close(fd);
    ++bad;
    fd = raw(d);
    struct {
      dp::Header h{uint32_t(dp::MsgType::kStatus), 12};
      uint32_t extra = 0;
    } st;
    EXPECT_TRUE(closed_after(fd, &st, sizeof st));
    close(fd);
    ++bad;
    fd = raw(d);
    ASSERT_TRUE(hello(fd));
    std::vector<int> fds;
    ASSERT_EQ(open_slot(fd, &fds), 0);
    for (int f : fds) close(f);
    EXPECT_TRUE(closed_after(fd, &o, sizeof o));
    close(fd);
    ++bad;
    // A device index that does not exist is an answer, not a bad message.
    fd = raw(d);
    ASSERT_TRUE(hello(fd));
    EXPECT_EQ(open_slot(fd, &fds, 7), ENODEV);
    close(fd);
  }
  EXPECT_EQ(d.counter("bad_messages"), bad);
  EXPECT_TRUE(d.wait_slots(0));
  {
    // Every slot taken (--max-clients 4): the fifth is refused with EUSERS; a service ID one
    // client holds is EADDRINUSE for another until the holder leaves.
    std::vector<int> conns;
    std::vector<std::vector<int>> slot_fds;
    for (int i = 0; i < 4; ++i) {
      int fd = raw(d);
      ASSERT_TRUE(hello(fd));
      std::vector<int> fds;
      ASSERT_EQ(open_slot(fd, &fds), 0);
      slot_fds.push_back(fds);
      conns.push_back(fd);
    }
    EXPECT_EQ(d.dev_field("slots_in_use"), 4u);
    const uint64_t refused = d.counter("refused");
    int fd = raw(d);
    ASSERT_TRUE(hello(fd));
    std::vector<int> fds;
    EXPECT_EQ(open_slot(fd, &fds), EUSERS);
    EXPECT_EQ(d.counter("refused"), refused + 1);
    close(fd);
    const uint64_t sid = 0x0106000000001234ull;
    EXPECT_EQ(listen_sid(conns[0], sid), 0);
    EXPECT_EQ(listen_sid(conns[1], sid), EADDRINUSE);
    EXPECT_EQ(listen_sid(conns[1], sid, dp::MsgType::kUnlisten), 0);  // not its: no effect
    EXPECT_EQ(listen_sid(conns[2], sid), EADDRINUSE);
    EXPECT_EQ(listen_sid(conns[0], sid), 0);  // its own again
    // The holder leaves (its sockets closed first, as a client's exit does): the service ID
    // and the slot are free at once.
    for (int f : slot_fds[0]) close(f);
    close(conns[0]);
    uint64_t end = mono_ms() + 2000;
    while (listen_sid(conns[1], sid) != 0 && mono_ms() < end) usleep(1000);
    EXPECT_EQ(listen_sid(conns[2], sid), EADDRINUSE);
    EXPECT_TRUE(d.wait_slots(3));
    for (size_t i = 1; i < conns.size(); ++i) {
      for (int f : slot_fds[i]) close(f);
      close(conns[i]);
    }
  }
  {
    // A process that ends its connection but keeps the slot's sockets: the slot is not handed
    // on while the process lives (it could read the next owner's traffic), and is once it dies.
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) {
      int fd = raw(d);
      std::vector<int> fds;
      bool ok = hello(fd) && open_slot(fd, &fds) == 0;
      close(fd);
      char c = ok ? 1 : 0;
      if (write(ready[1], &c, 1) != 1) _exit(1);
      pause();
      _exit(0);
    }
    char c = 0;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    ASSERT_EQ(c, 1);
    uint64_t end = mono_ms() + 2000;
    while (d.dev_field("slots_waiting_exit") != 1 && mono_ms() < end) usleep(2000);
    EXPECT_EQ(d.dev_field("slots_waiting_exit"), 1u);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    EXPECT_TRUE(d.wait_slots(0));
    close(ready[0]);
    close(ready[1]);
  }
  {
    // Descriptors sent to the daemon are closed, the message served; 200 idle connections
    // (no hello) do not stop it serving a real client.
    int fd = raw(d);
    auto h = msg<dp::HelloMsg>(dp::MsgType::kHello);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_EQ(dp::send_msg(fd, &h, sizeof h, &devnull, 1), 0);
    dp::DevicesMsg out;
    pollfd pf{fd, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 5000), 1);
    EXPECT_EQ(dp::recv_msg(fd, &out, sizeof out), static_cast<ssize_t>(sizeof out));
    close(devnull);
    close(fd);
    std::vector<int> idle;
    for (int i = 0; i < 200; ++i) {
      int f = raw(d);
      if (f >= 0) idle.push_back(f);
    }
    EXPECT_EQ(idle.size(), 200u);
    Client cl(d);
    auto g = cl.cmd("open 3");
    ASSERT_EQ(g.size(), 2u);
    auto m = cl.cmd("mr win " + std::to_string(8 * kWindow) + " 3");
    auto x = cl.cmd("qp x");
    auto y = cl.cmd("qp y");
    ASSERT_EQ(x.size(), 2u);
    ASSERT_EQ(y.size(), 2u);
    ASSERT_EQ(m.size(), 2u);
    cl.cmd("connect x " + y[0] + " " + y[1] + " " + g[0] + " 3 " + m[0] + " " + m[1] + " 14 7");
    cl.cmd("connect y " + x[0] + " " + x[1] + " " + g[0] + " 3 " + m[0] + " " + m[1] + " 14 7");
    EXPECT_EQ(cl.cmd("traffic 100 1024 x y"), (std::vector<std::string>{"200", "200"}));
    EXPECT_EQ(how(cl.quit()), "exit 0");
    for (int f : idle) close(f);
  }
  EXPECT_EQ(d.counter("bad_messages"), bad);
  EXPECT_TRUE(d.wait_slots(0));
  EXPECT_EQ(how(d.stop()), "exit 0");
}

}  // namespace
