// Tests for emu/control (request execution, ControlServer over a real Unix socket, client and
// socket discovery) and for the softrnic-ctl binary, against a fake ControlTarget whose fault
// side is a real FaultEngine.
#include "emu/services/control.h"
#include "tools/control_client.h"
#include "wire/port.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rnic::emu {
namespace {

namespace fs = std::filesystem;

class FakeTarget : public ControlTarget {
 public:
  explicit FakeTarget(std::string name = "fake0") : name_(std::move(name)) {}
  // Set by the fixture's start(): stops (joins) the server threads before the target they
  // serve goes. The fixture's servers_ outlive the test body's targets, and TSan reported the
  // server thread's fault_add racing with ~FakeTarget (no join in between).
  std::function<void()> before_destroy;
  ~FakeTarget() {
    if (before_destroy) before_destroy();
  }
  std::string device_name() const override { return name_; }
  std::string fault_add(std::string_view plan) override { return eng_.add_rules(plan, "control"); }
  std::vector<FaultRuleInfo> fault_list() override {
    std::lock_guard<std::mutex> g(mu_);
    if (!canned_.empty()) return canned_;
    return eng_.list();
  }
  void fault_clear() override { eng_.clear(); }
  std::string stats(std::optional<uint32_t> qpn, StatList* out) override {
    std::lock_guard<std::mutex> g(mu_);
    if (!qpn) {
      ++stats_calls_;  // sent_pkts grows by one per call: --watch shows "+1"
      out->emplace_back("sent_pkts", 100 + stats_calls_);
      out->emplace_back("rcvd_pkts", 7);
      if (dotted_) out->emplace_back(".dotted", 1);
      return "";
    }
    if (*qpn != 17) return "no QP " + std::to_string(*qpn);
    out->emplace_back("sent_pkts", 3);
    out->emplace_back("retrans_pkts", 1);
    return "";
  }
  std::string capture_start(std::string_view path) override {
    std::lock_guard<std::mutex> g(mu_);
    if (!capture_.empty()) return "already capturing to " + capture_;
    capture_ = std::string(path);
    return "";
  }
  std::string capture_stop() override {
    std::lock_guard<std::mutex> g(mu_);
    if (capture_.empty()) return "not capturing";
    capture_.clear();
    return "";
  }

  std::string capture() {
    std::lock_guard<std::mutex> g(mu_);
    return capture_;
  }
  void set_canned(std::vector<FaultRuleInfo> v) {
    std::lock_guard<std::mutex> g(mu_);
    canned_ = std::move(v);
  }
  void set_dotted() { dotted_ = true; }

 private:
  std::string name_;
  FaultEngine eng_;
  std::mutex mu_;
  std::vector<FaultRuleInfo> canned_;
  std::string capture_;
  uint64_t stats_calls_ = 0;
  bool dotted_ = false;
};

// ---- Request execution without a socket --------------------------------------------

std::string exec(ControlTarget& t, std::string_view line) { return execute_control_request(t, line); }

TEST(ControlRequest, HelpListsCommandsThenOk) {
  FakeTarget t;
  std::string r = exec(t, "help");
  EXPECT_NE(r.find("fault add PLAN\n"), std::string::npos);
  EXPECT_NE(r.find("capture stop\n"), std::string::npos);
  EXPECT_TRUE(r.ends_with("\n.\nok\n")) << r;
}

TEST(ControlRequest, UnknownCommandIsErr) {
  FakeTarget t;
  EXPECT_EQ(exec(t, "reboot now"), ".\nerr unknown command 'reboot' (try 'help')\n");
}

TEST(ControlRequest, EmptyAndBlankLinesAreErr) {
  FakeTarget t;
  EXPECT_EQ(exec(t, ""), ".\nerr empty request (try 'help')\n");
  EXPECT_EQ(exec(t, "   \t "), ".\nerr empty request (try 'help')\n");
}

TEST(ControlRequest, ControlCharactersRejected) {
  FakeTarget t;
  std::string nul("stats\0x", 7);
  EXPECT_EQ(exec(t, nul), ".\nerr bad request: control character in line\n");
  EXPECT_EQ(exec(t, "stats\x1b[2J"), ".\nerr bad request: control character in line\n");
}

TEST(ControlRequest, TrailingCarriageReturnTolerated) {
  FakeTarget t;
  EXPECT_EQ(exec(t, "stats qp 17\r"), "sent_pkts 3\nretrans_pkts 1\n.\nok\n");
}

TEST(ControlRequest, StatsArgumentErrors) {
  FakeTarget t;
  EXPECT_EQ(exec(t, "stats foo"), ".\nerr usage: stats [qp QPN]\n");
  EXPECT_EQ(exec(t, "stats qp"), ".\nerr usage: stats [qp QPN]\n");
  EXPECT_EQ(exec(t, "stats qp 1 2"), ".\nerr usage: stats [qp QPN]\n");
  EXPECT_EQ(exec(t, "stats qp x1"), ".\nerr bad QPN 'x1'\n");
  EXPECT_EQ(exec(t, "stats qp 0x1000000"), ".\nerr bad QPN '0x1000000'\n");
  EXPECT_EQ(exec(t, "stats qp 99999999999999999999"), ".\nerr bad QPN '99999999999999999999'\n");
  EXPECT_EQ(exec(t, "stats qp 0x11"), "sent_pkts 3\nretrans_pkts 1\n.\nok\n");
  EXPECT_EQ(exec(t, "stats qp 5"), ".\nerr no QP 5\n");
}

TEST(ControlRequest, FaultAndCaptureUsageErrors) {
  FakeTarget t;
  EXPECT_EQ(exec(t, "fault"), ".\nerr usage: fault add PLAN | fault list | fault clear\n");
  EXPECT_EQ(exec(t, "fault add"), ".\nerr usage: fault add PLAN\n");
  EXPECT_EQ(exec(t, "fault add    "), ".\nerr usage: fault add PLAN\n");
  EXPECT_EQ(exec(t, "fault list all"), ".\nerr usage: fault list\n");
  EXPECT_EQ(exec(t, "capture"), ".\nerr usage: capture start PATH | capture stop\n");
  EXPECT_EQ(exec(t, "capture start"), ".\nerr usage: capture start PATH\n");
  EXPECT_EQ(exec(t, "capture start rel.pcap"), ".\nerr capture path must be absolute\n");
  EXPECT_EQ(t.capture(), "");
}

TEST(ControlRequest, FaultListFormatAndOneLineText) {
  FakeTarget t;
  t.set_canned({{3, "a", "rule a op=*WRITE* => drop", 10, 4}, {7, "x", "two\nlines", 0, 0}});
  EXPECT_EQ(exec(t, "fault list"),
            "3 fired=4 matched=10 rule a op=*WRITE* => drop\n7 fired=0 matched=0 two; lines\n"
            ".\nok\n");
}

TEST(ControlRequest, DataLineStartingWithDotIsStuffed) {
  FakeTarget t;
  t.set_dotted();
  std::string r = exec(t, "stats");
  EXPECT_NE(r.find("\n..dotted 1\n.\nok\n"), std::string::npos) << r;
}

TEST(ControlRequest, ErrorMessageIsOneLine) {
  FakeTarget t;
  std::string r = exec(t, "fault add rule z bogus=1 => drop");
  ASSERT_TRUE(r.starts_with(".\nerr ")) << r;
  EXPECT_EQ(r.find('\n', 6), r.size() - 1) << r;  // only the final newline
}

TEST(ControlRequest, CounterAndFaultStatHelpers) {
  Counters c;
  c.add(Ctr::kSentPkts, 5);
  c.add(Ctr::kRetransPkts, 2);
  StatList l;
  append_counter_stats(c, &l);
  ASSERT_EQ(l.size(), kNumCtrs);
  EXPECT_EQ(l[0], (std::pair<std::string, uint64_t>{"sent_pkts", 5}));
  bool retrans = false;
  for (const auto& [n, v] : l) retrans |= n == "retrans_pkts" && v == 2;
  EXPECT_TRUE(retrans);
  FaultCounters f;
  f.fired = 3;
  f.dropped = 2;
  append_fault_stats(f, &l);
  ASSERT_EQ(l.size(), kNumCtrs + 15);
  EXPECT_EQ(l[kNumCtrs + 2], (std::pair<std::string, uint64_t>{"fault_fired", 3}));
  EXPECT_EQ(l[kNumCtrs + 3], (std::pair<std::string, uint64_t>{"fault_dropped", 2}));
  for (const auto& [n, v] : l) EXPECT_EQ(n.find(' '), std::string::npos) << n;
}

// ---- Fixtures with a real socket ------------------------------------------------------

class ControlSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/softrnic-ctltest.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_ = base_ + "/run";
  }
  void TearDown() override {
    servers_.clear();
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  ControlServer* start(FakeTarget* t, ControlServer::Options opt = {}, bool thread = true) {
    if (opt.runtime_dir.empty()) opt.runtime_dir = dir_;
    std::string err;
    auto s = ControlServer::open(t, opt, &err);
    EXPECT_NE(s, nullptr) << err;
    if (!s) return nullptr;
    if (thread) {
      EXPECT_EQ(s->start_thread(), "");
    }
    t->before_destroy = [this] { servers_.clear(); };
    servers_.push_back(std::move(s));
    return servers_.back().get();
  }

  ControlReply ask(ControlServer* s, std::string_view line) {
    std::string err;
    auto c = ControlClient::connect(s->socket_path(), &err);
    EXPECT_NE(c, nullptr) << err;
    ControlReply r;
    if (c) {
      EXPECT_EQ(c->request(line, &r), "");
    }
    return r;
  }

  static int raw_connect(const std::string& path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path.c_str());
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      close(fd);
      return -1;
    }
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  static bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t w = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (w <= 0) return false;
      data.remove_prefix(static_cast<size_t>(w));
    }
    return true;
  }
  // Reads one whole response (data lines, ".", status line) from a raw fd; "" on EOF.
  static std::string read_response(int fd, std::string* buf) {
    while (true) {
      for (size_t pos = 0;;) {
        size_t nl = buf->find('\n', pos);
        if (nl == std::string::npos) break;
        if (nl - pos == 1 && (*buf)[pos] == '.') {
          size_t end = buf->find('\n', nl + 1);
          if (end == std::string::npos) break;
          std::string r = buf->substr(0, end + 1);
          buf->erase(0, end + 1);
          return r;
        }
        pos = nl + 1;
      }
      char tmp[4096];
      ssize_t got = recv(fd, tmp, sizeof(tmp), 0);
      if (got <= 0) return "";
      buf->append(tmp, static_cast<size_t>(got));
    }
  }

  std::string base_;
  std::string dir_;
  std::vector<std::unique_ptr<ControlServer>> servers_;
};

TEST_F(ControlSocketTest, InfoNamesDeviceAndPid) {
  FakeTarget t;
  ControlServer* s = start(&t);
  ControlReply r = ask(s, "info");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"device fake0", "pid " + std::to_string(getpid())}));
}

TEST_F(ControlSocketTest, FaultAddListClearRoundTrip) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  FakeTarget t;
  ControlServer* s = start(&t);
  std::string err;
  auto c = ControlClient::connect(s->socket_path(), &err);
  ASSERT_NE(c, nullptr) << err;
  ControlReply r;
  // Given: two rules in one plan.
  ASSERT_EQ(c->request("fault add rule lose dir=tx class=write nth=1 => drop; rule d p=0.5 => dup",
                       &r), "");
  EXPECT_TRUE(r.ok) << r.error;
  // Expect: both listed in order with fire counts.
  ASSERT_EQ(c->request("fault list", &r), "");
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_TRUE(r.lines[0].starts_with("1 fired=0 matched=0 ")) << r.lines[0];
  EXPECT_NE(r.lines[0].find("lose"), std::string::npos) << r.lines[0];
  EXPECT_TRUE(r.lines[1].starts_with("2 fired=0 matched=0 ")) << r.lines[1];
  // A bad rule is refused with the parser's message, and adds nothing.
  ASSERT_EQ(c->request("fault add rule ok1 => drop; rule bad frobnicate=1 => drop", &r), "");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("frobnicate"), std::string::npos) << r.error;
  ASSERT_EQ(c->request("fault list", &r), "");
  EXPECT_EQ(r.lines.size(), 2u);
  // Clear empties the list.
  ASSERT_EQ(c->request("fault clear", &r), "");
  EXPECT_TRUE(r.ok);
  ASSERT_EQ(c->request("fault list", &r), "");
  EXPECT_TRUE(r.ok);
  EXPECT_TRUE(r.lines.empty());
}

TEST_F(ControlSocketTest, StatsDeviceAndQp) {
  FakeTarget t;
  ControlServer* s = start(&t);
  ControlReply r = ask(s, "stats");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"sent_pkts 101", "rcvd_pkts 7"}));
  r = ask(s, "stats qp 17");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"sent_pkts 3", "retrans_pkts 1"}));
  r = ask(s, "stats qp 18");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "no QP 18");
  EXPECT_TRUE(r.lines.empty());
}

TEST_F(ControlSocketTest, CaptureStartStop) {
  FakeTarget t;
  ControlServer* s = start(&t);
  ControlReply r = ask(s, "capture stop");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "not capturing");
  r = ask(s, "capture start /tmp/x y.pcap");  // the path is the rest of the line
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(t.capture(), "/tmp/x y.pcap");
  r = ask(s, "capture start /tmp/z.pcap");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "already capturing to /tmp/x y.pcap");
  r = ask(s, "capture stop");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(t.capture(), "");
}

TEST_F(ControlSocketTest, BadCommandGetsErrAndConnectionStaysUsable) {
  FakeTarget t;
  ControlServer* s = start(&t);
  std::string err;
  auto c = ControlClient::connect(s->socket_path(), &err);
  ASSERT_NE(c, nullptr) << err;
  ControlReply r;
  ASSERT_EQ(c->request("frobnicate", &r), "");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "unknown command 'frobnicate' (try 'help')");
  ASSERT_EQ(c->request("stats qp 17", &r), "");
  EXPECT_TRUE(r.ok);
}

TEST_F(ControlSocketTest, PipelinedRequestsAnsweredInOrder) {
  FakeTarget t;
  ControlServer* s = start(&t);
  int fd = raw_connect(s->socket_path());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "stats qp 17\r\nbogus\nst"));
  ASSERT_TRUE(send_all(fd, "ats qp 5\n"));  // one request split across two writes
  std::string buf;
  EXPECT_EQ(read_response(fd, &buf), "sent_pkts 3\nretrans_pkts 1\n.\nok\n");
  EXPECT_EQ(read_response(fd, &buf), ".\nerr unknown command 'bogus' (try 'help')\n");
  EXPECT_EQ(read_response(fd, &buf), ".\nerr no QP 5\n");
  close(fd);
}

TEST_F(ControlSocketTest, RuntimeDirCreated0700AndSocket0600) {
  FakeTarget t;
  ControlServer* s = start(&t);
  struct stat st;
  ASSERT_EQ(lstat(dir_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(s->socket_path(), dir_ + "/fake0." + std::to_string(getpid()) + ".sock");
  ASSERT_EQ(lstat(s->socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST_F(ControlSocketTest, SocketRemovedOnShutdown) {
  FakeTarget t;
  std::string path = start(&t)->socket_path();
  ASSERT_TRUE(fs::exists(path));
  servers_.clear();
  EXPECT_FALSE(fs::exists(fs::symlink_status(path)));
  EXPECT_TRUE(fs::exists(dir_));  // the directory stays (other devices may use it)
}

TEST_F(ControlSocketTest, ExistingDirWithGroupAccessRefused) {
  ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0750), 0);
  FakeTarget t;
  std::string err;
  ControlServer::Options opt;
  opt.runtime_dir = dir_;
  EXPECT_EQ(ControlServer::open(&t, opt, &err), nullptr);
  EXPECT_NE(err.find("has mode 0750"), std::string::npos) << err;
  EXPECT_NE(err.find(dir_), std::string::npos) << err;
  ASSERT_EQ(chmod(dir_.c_str(), 0701), 0);
  EXPECT_NE(check_runtime_dir(dir_, false, geteuid()), "");
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  EXPECT_EQ(check_runtime_dir(dir_, false, geteuid()), "");
}

TEST_F(ControlSocketTest, DirOwnedBySomeoneElseRefused) {
  ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(dir_.c_str(), 65534, 65534), 0);
    FakeTarget t;
    std::string err;
    ControlServer::Options opt;
    opt.runtime_dir = dir_;
    EXPECT_EQ(ControlServer::open(&t, opt, &err), nullptr);
    EXPECT_NE(err.find("owned by uid 65534"), std::string::npos) << err;
  }
  // Without root: the same check against a uid that is not the owner.
  std::string e = check_runtime_dir(dir_, false, geteuid() + 1);
  EXPECT_NE(e.find("not by us"), std::string::npos) << e;
}

TEST_F(ControlSocketTest, SymlinkAndNonDirectoryRefused) {
  ASSERT_EQ(mkdir((base_ + "/real").c_str(), 0700), 0);
  ASSERT_EQ(symlink((base_ + "/real").c_str(), dir_.c_str()), 0);
  EXPECT_NE(check_runtime_dir(dir_, true, geteuid()).find("symlink"), std::string::npos);
  std::string file = base_ + "/file";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_NE(check_runtime_dir(file, true, geteuid()).find("not a directory"), std::string::npos);
  EXPECT_NE(check_runtime_dir(base_ + "/no/such", true, geteuid()).find("cannot create"),
            std::string::npos);
  EXPECT_NE(check_runtime_dir(base_ + "/missing", false, geteuid()), "");
  EXPECT_FALSE(fs::exists(base_ + "/missing"));
}

TEST_F(ControlSocketTest, RuntimeDirFromEnvironment) {
  auto save = [](const char* n) { const char* v = getenv(n); return v ? std::optional<std::string>(v) : std::nullopt; };
  auto restore = [](const char* n, const std::optional<std::string>& v) {
    if (v) setenv(n, v->c_str(), 1); else unsetenv(n);
  };
  auto s1 = save("SOFTRNIC_RUNTIME_DIR");
  auto s2 = save("XDG_RUNTIME_DIR");
  setenv("SOFTRNIC_RUNTIME_DIR", "/x/y", 1);
  setenv("XDG_RUNTIME_DIR", base_.c_str(), 1);
  EXPECT_EQ(control_runtime_dir(), "/x/y");
  unsetenv("SOFTRNIC_RUNTIME_DIR");
  EXPECT_EQ(control_runtime_dir(), base_ + "/softrnic");
  setenv("XDG_RUNTIME_DIR", (base_ + "/gone").c_str(), 1);
  EXPECT_EQ(control_runtime_dir(), "/tmp/softrnic-" + std::to_string(geteuid()));
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(control_runtime_dir(), "/tmp/softrnic-" + std::to_string(geteuid()));
  restore("SOFTRNIC_RUNTIME_DIR", s1);
  restore("XDG_RUNTIME_DIR", s2);
}

TEST_F(ControlSocketTest, BadDeviceNameAndDuplicateNameRefused) {
  FakeTarget bad("a/b");
  std::string err;
  ControlServer::Options opt;
  opt.runtime_dir = dir_;
  EXPECT_EQ(ControlServer::open(&bad, opt, &err), nullptr);
  EXPECT_NE(err.find("bad device name"), std::string::npos) << err;
  FakeTarget a("dup0"), b("dup0");
  ControlServer* s = start(&a);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(ControlServer::open(&b, opt, &err), nullptr);
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
  EXPECT_TRUE(ask(s, "info").ok);  // the first one still works
}

TEST_F(ControlSocketTest, PeerWithAnotherUidIsRefused) {
  FakeTarget t;
  ControlServer::Options opt;
  opt.allowed_uid = geteuid() + 1;  // SO_PEERCRED says we are not that uid
  ControlServer* s = start(&t, opt);
  int fd = raw_connect(s->socket_path());
  ASSERT_GE(fd, 0);
  std::string buf;
  std::string r = read_response(fd, &buf);
  EXPECT_TRUE(r.starts_with(".\nerr permission denied (peer uid " + std::to_string(geteuid())))
      << r;
  char c;
  EXPECT_EQ(recv(fd, &c, 1, 0), 0);  // and disconnected
  close(fd);
  // The client reports the server's reason whether or not its request got sent first.
  for (int i = 0; i < 20; ++i) {
    std::string err;
    auto cl = ControlClient::connect(s->socket_path(), &err);
    ASSERT_NE(cl, nullptr) << err;
    ControlReply r;
    ASSERT_EQ(cl->request(i % 2 ? "capture start /tmp/x.pcap" : "info", &r), "");
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(r.error.starts_with("permission denied (peer uid")) << r.error;
  }
  EXPECT_EQ(t.capture(), "");
}

TEST_F(ControlSocketTest, OtherUserCannotReachTheSocket) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  FakeTarget t;
  ControlServer* s = start(&t);
  std::string path = s->socket_path();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path.c_str());
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    _exit(rc != 0 && errno == EACCES ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);  // 0: connect failed with EACCES (0700 dir / 0600 socket)
}

TEST_F(ControlSocketTest, LongestLineAcceptedOneMoreByteRefused) {
  FakeTarget t;
  ControlServer* s = start(&t);
  int fd = raw_connect(s->socket_path());
  ASSERT_GE(fd, 0);
  std::string buf;
  // Exactly kMaxRequestLine bytes: executed (an unknown command named by its first word).
  std::string max_line = "x" + std::string(kMaxRequestLine - 1, 'a');
  ASSERT_TRUE(send_all(fd, max_line + "\n"));
  std::string r = read_response(fd, &buf);
  EXPECT_TRUE(r.starts_with(".\nerr unknown command 'xaaa")) << r.substr(0, 80);
  ASSERT_TRUE(send_all(fd, max_line + "b\nstats qp 17\n"));
  EXPECT_EQ(read_response(fd, &buf), ".\nerr request line too long (max 65536 bytes)\n");
  EXPECT_EQ(read_response(fd, &buf), "sent_pkts 3\nretrans_pkts 1\n.\nok\n");
  close(fd);
}

TEST_F(ControlSocketTest, HugeLineIsRefusedOnceAndDiscarded) {
  FakeTarget t;
  ControlServer* s = start(&t);
  int fd = raw_connect(s->socket_path());
  ASSERT_GE(fd, 0);
  // 4 MiB without a newline, then a good request.
  std::string chunk(1 << 20, 'A');
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(send_all(fd, chunk));
  ASSERT_TRUE(send_all(fd, "\ninfo\n"));
  std::string buf;
  EXPECT_EQ(read_response(fd, &buf), ".\nerr request line too long (max 65536 bytes)\n");
  std::string r = read_response(fd, &buf);
  EXPECT_TRUE(r.starts_with("device fake0\n")) << r;
  EXPECT_TRUE(r.ends_with(".\nok\n")) << r;
  close(fd);
}

TEST_F(ControlSocketTest, RandomGarbageNeverCrashes) {
  FakeTarget t;
  ControlServer* s = start(&t);
  std::mt19937 rng(12345);
  for (int round = 0; round < 8; ++round) {
    int fd = raw_connect(s->socket_path());
    ASSERT_GE(fd, 0);
    std::string junk(20000 + round * 7000, '\0');
    size_t newlines = 0;
    for (char& c : junk) {
      c = static_cast<char>(rng() & 0xff);
      newlines += c == '\n';
    }
    ASSERT_TRUE(send_all(fd, junk));
    ASSERT_TRUE(send_all(fd, "\ninfo\n"));
    // Every garbage line gets a response; then info answers normally.
    std::string buf, r;
    for (size_t i = 0; i <= newlines; ++i) {
      r = read_response(fd, &buf);
      ASSERT_FALSE(r.empty()) << "round " << round << " response " << i;
      EXPECT_TRUE(r.find("\n.\nerr ") != std::string::npos || r.starts_with(".\nerr ") ||
                  r.ends_with(".\nok\n"))
          << r.substr(0, 80);
    }
    r = read_response(fd, &buf);
    EXPECT_TRUE(r.starts_with("device fake0\n")) << round << ": " << r.substr(0, 80);
    close(fd);
  }
  EXPECT_TRUE(ask(s, "stats qp 17").ok);
}

TEST_F(ControlSocketTest, ClientsThatVanishDoNotHurtTheServer) {
  FakeTarget t;
  ControlServer* s = start(&t);
  for (int i = 0; i < 20; ++i) {
    int fd = raw_connect(s->socket_path());
    ASSERT_GE(fd, 0);
    // Half a request, or a request whose big answer is never read, then gone.
    send_all(fd, i % 2 ? "stats q" : "help\nhelp\nhelp\nstats\n");
    close(fd);
  }
  ControlReply r = ask(s, "stats qp 17");
  EXPECT_TRUE(r.ok);
}

TEST_F(ControlSocketTest, TooManyClientsGetErr) {
  FakeTarget t;
  ControlServer::Options opt;
  opt.max_clients = 2;
  ControlServer* s = start(&t, opt);
  std::string err;
  auto c1 = ControlClient::connect(s->socket_path(), &err);
  auto c2 = ControlClient::connect(s->socket_path(), &err);
  ASSERT_TRUE(c1 && c2);
  ControlReply r;
  ASSERT_EQ(c1->request("info", &r), "");  // both accepted by now
  ASSERT_EQ(c2->request("info", &r), "");
  int fd = raw_connect(s->socket_path());
  ASSERT_GE(fd, 0);
  std::string buf;
  EXPECT_EQ(read_response(fd, &buf), ".\nerr too many control connections\n");
  close(fd);
  c1.reset();
  // Once c1 has hung up, a new connection is accepted (the server reaps closed clients
  // before refusing).
  auto c3 = ControlClient::connect(s->socket_path(), &err);
  ASSERT_NE(c3, nullptr) << err;
  ASSERT_EQ(c3->request("info", &r), "");
  EXPECT_TRUE(r.ok) << r.error;
}

TEST_F(ControlSocketTest, PollModeWithoutThread) {
  FakeTarget t;
  ControlServer* s = start(&t, {}, /*thread=*/false);
  ASSERT_GE(s->fd(), 0);
  std::atomic<bool> done{false};
  ControlReply r;
  std::string terr;
  std::thread client([&] {
    std::string err;
    auto c = ControlClient::connect(s->socket_path(), &err);
    if (!c) {
      terr = err;
    } else {
      terr = c->request("stats qp 17", &r);
    }
    done = true;
  });
  for (int i = 0; i < 5000 && !done; ++i) {
    pollfd p{s->fd(), POLLIN, 0};
    if (poll(&p, 1, 10) > 0) s->handle_ready();
  }
  client.join();
  EXPECT_EQ(terr, "");
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"sent_pkts 3", "retrans_pkts 1"}));
}

// ---- Discovery ------------------------------------------------------------------------

TEST_F(ControlSocketTest, DiscoveryPicksTheOnlyDeviceAndListsSeveral) {
  FakeTarget a("alpha"), b("beta.1");
  start(&a);
  ControlSocketInfo info;
  ASSERT_EQ(select_control_socket(dir_, "", 0, &info), "");
  EXPECT_EQ(info.device, "alpha");
  EXPECT_EQ(info.pid, getpid());
  start(&b);
  std::string e = select_control_socket(dir_, "", 0, &info);
  EXPECT_NE(e.find("2 softrnic devices"), std::string::npos) << e;
  EXPECT_NE(e.find("alpha pid"), std::string::npos) << e;
  EXPECT_NE(e.find("beta.1 pid"), std::string::npos) << e;
  EXPECT_NE(select_control_socket(dir_, "", getpid(), &info), "");  // same pid, two devices
  ASSERT_EQ(select_control_socket(dir_, "beta.1", 0, &info), "");
  EXPECT_EQ(info.device, "beta.1");  // a dotted device name parses
  ASSERT_EQ(select_control_socket(dir_, "alpha", getpid(), &info), "");
  EXPECT_EQ(info.device, "alpha");
  e = select_control_socket(dir_, "gamma", 0, &info);
  EXPECT_NE(e.find("no running softrnic device device gamma"), std::string::npos) << e;
  EXPECT_NE(e.find("running: alpha(pid"), std::string::npos) << e;
}

TEST_F(ControlSocketTest, StaleSocketsSkippedAndRemoved) {
  FakeTarget a("alpha");
  start(&a);
  // A socket left behind by a dead process: bound, never listening any more.
  std::string stale = dir_ + "/ghost.999999.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", stale.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  close(fd);
  // Files that are not control sockets are ignored and left alone.
  for (const char* n : {"/junk.12.sock", "/notes.txt", "/x.0.sock", "/nopid.sock"}) {
    std::FILE* f = std::fopen((dir_ + n).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  std::vector<ControlSocketInfo> all = find_control_sockets(dir_, false);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(fs::exists(fs::symlink_status(stale)));  // not cleaned without clean_stale
  ControlSocketInfo info;
  ASSERT_EQ(select_control_socket(dir_, "", 0, &info), "");
  EXPECT_EQ(info.device, "alpha");
  EXPECT_FALSE(fs::exists(fs::symlink_status(stale)));
  EXPECT_TRUE(fs::exists(dir_ + "/junk.12.sock"));
  EXPECT_TRUE(find_control_sockets(base_ + "/nothing", true).empty());
}

// ---- The softrnic-ctl binary ----------------------------------------------------------

struct CmdResult {
  int status = -1;
  std::string out;
};

class ControlCliTest : public ControlSocketTest {
 protected:
  // Runs softrnic-ctl with SOFTRNIC_RUNTIME_DIR=dir_ (stderr folded into out when err).
  CmdResult ctl(const std::string& args, bool with_stderr = true, const std::string& cwd = "") {
    std::string cmd;
    if (!cwd.empty()) cmd += "cd '" + cwd + "' && ";
    cmd += "SOFTRNIC_RUNTIME_DIR='" + dir_ + "' '" SOFTRNIC_CTL_PATH "' " + args;
    cmd += with_stderr ? " 2>&1" : " 2>/dev/null";
    CmdResult r;
    std::FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
  }
};

TEST_F(ControlCliTest, StatsPrintsNameValueLines) {
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("stats", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "sent_pkts 101\nrcvd_pkts 7\n");
  r = ctl("stats --qp 17", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "sent_pkts 3\nretrans_pkts 1\n");
  r = ctl("stats --qp 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "softrnic-ctl: no QP 4\n");
}

TEST_F(ControlCliTest, FaultAddListClear) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("fault add 'rule w dir=tx class=write => drop'");
  EXPECT_EQ(r.status, 0) << r.out;
  r = ctl("fault add rule d 'p=0.1' '=>' dup");  // words are joined with spaces
  EXPECT_EQ(r.status, 0) << r.out;
  r = ctl("fault list", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("1 fired=0 matched=0 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 fired=0 matched=0 "), std::string::npos) << r.out;
  r = ctl("fault add 'rule x nosuchkey=1 => drop'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("nosuchkey"), std::string::npos) << r.out;
  EXPECT_EQ(ctl("fault clear").status, 0);
  r = ctl("fault list");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
}

// -Dfault_injection=false: `fault add` fails (exit 1) with the engine's message naming the
// build option; the list stays empty.
TEST_F(ControlCliTest, FaultAddRefusedWithoutFaultInjection) {
  if (wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled in";
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("fault add 'rule w dir=tx class=write => drop'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("fault injection is compiled out of this build"), std::string::npos) << r.out;
  r = ctl("fault list");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
}

TEST_F(ControlCliTest, WatchReprintsWithDeltas) {
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("stats --watch --interval 0.01 --count 3", false);
  EXPECT_EQ(r.status, 0);
  // Round 1: plain values; rounds 2 and 3: values with deltas (sent_pkts grows by 1 a call).
  EXPECT_NE(r.out.find("sent_pkts 101\nrcvd_pkts 7\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sent_pkts 102 +1\nrcvd_pkts 7 +0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sent_pkts 103 +1\nrcvd_pkts 7 +0\n"), std::string::npos) << r.out;
  size_t headers = 0;
  for (size_t p = 0; (p = r.out.find("--- fake0 pid ", p)) != std::string::npos; ++p) ++headers;
  EXPECT_EQ(headers, 3u);
}

TEST_F(ControlCliTest, CaptureMakesThePathAbsolute) {
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("capture -w out.pcap", true, base_);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(t.capture(), base_ + "/out.pcap");
  EXPECT_EQ(ctl("capture --stop").status, 0);
  EXPECT_EQ(t.capture(), "");
  r = ctl("capture --stop");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "softrnic-ctl: not capturing\n");
}

TEST_F(ControlCliTest, SelectorsAndSeveralDevices) {
  FakeTarget a("alpha"), b("beta");
  start(&a);
  ControlServer* sb = start(&b);
  CmdResult r = ctl("stats");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("2 softrnic devices"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("alpha pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("beta pid"), std::string::npos) << r.out;
  EXPECT_EQ(ctl("--device beta stats --qp 17").status, 0);
  EXPECT_EQ(ctl("stats --device beta").status, 0);  // selectors may follow the command
  EXPECT_EQ(ctl("--socket '" + sb->socket_path() + "' stats").status, 0);
  r = ctl("list", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("alpha " + std::to_string(getpid()) + " " + dir_), std::string::npos);
  EXPECT_NE(r.out.find("beta " + std::to_string(getpid())), std::string::npos);
}

TEST_F(ControlCliTest, NoDeviceAndUsageErrors) {
  CmdResult r = ctl("stats");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no running softrnic device"), std::string::npos) << r.out;
  EXPECT_EQ(ctl("").status, 2);
  EXPECT_EQ(ctl("stats --bogus").status, 2);
  EXPECT_EQ(ctl("stats --interval 1").status, 2);
  EXPECT_EQ(ctl("capture").status, 2);
  EXPECT_EQ(ctl("capture -w a --stop").status, 2);
  EXPECT_EQ(ctl("fault").status, 2);
  EXPECT_EQ(ctl("fault add").status, 2);
  EXPECT_EQ(ctl("--pid zero stats").status, 2);
  EXPECT_EQ(ctl("--socket /x --device y stats").status, 2);
  EXPECT_EQ(ctl("frob").status, 2);
  EXPECT_EQ(ctl("--help").status, 0);
}

// --json (nlohmann-json) carries the same numbers as the text form; the plan words after
// `fault add` are kept in order and selectors there are plan text, not options.
TEST_F(ControlCliTest, JsonOutputForStatsAndFaultList) {
  FakeTarget t;
  start(&t);
  CmdResult r = ctl("stats --json", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("\"counters\": {\n    \"sent_pkts\": 101,\n    \"rcvd_pkts\": 7\n  }"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"pid\": " + std::to_string(getpid())), std::string::npos) << r.out;
  r = ctl("stats --json --watch --interval 0.01 --count 2", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("\"counters\":{\"sent_pkts\":102,\"rcvd_pkts\":7}}\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"delta\":{\"sent_pkts\":1,\"rcvd_pkts\":0}"), std::string::npos) << r.out;
  if (!wire::kFaultInjection) {
    r = ctl("fault add rule d 'p=0.1' '=>' dup");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("fault injection is compiled out"), std::string::npos) << r.out;
    GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false): fault list --json not checked";
  }
  ASSERT_EQ(ctl("fault add rule d 'p=0.1' '=>' dup").status, 0);
  r = ctl("fault list --json", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("\"id\": 1,\n    \"fired\": 0,\n    \"matched\": 0,\n    \"rule\": \""),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("p=0.1 => dup"), std::string::npos) << r.out;
  EXPECT_EQ(ctl("fault add 'dir=rx' --device x '=>' drop").status, 1);  // --device is plan text
}

// `softrnic-ctl env` prints every declared variable (base/config.h); --markdown is the table
// the README holds (tests/base/config_test compares it with README.md).
TEST_F(ControlCliTest, EnvPrintsTheConfigurationTable) {
  CmdResult r = ctl("env", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("SOFTRNIC_FAULT_SEED  [services]"), std::string::npos) << r.out;
  r = ctl("env --markdown", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("| variable | default |", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("| `SOFTRNIC_LOG_FILE` |"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace rnic::emu
