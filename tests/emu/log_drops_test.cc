// tests/emu/log_drops_test.cc: every dropped or refused packet is explained by one rate-limited
// warning (emu/transport/recv.cc, resp.cc): a wrong rkey, an unknown QPN and a bad ICRC each
// name their reason, source, QPN, opcode, PSN and counter; a flood prints at most
// base::RateLimit::kBurst lines and then a "suppressed" count; nothing at the default level;
// stderr or the log file, never stdout; trace level follows accepted packets through the steps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;

// One log file for the whole binary: the rate limits are per call site and process-wide, so
// the tests reason about all the lines ever written.
std::string g_log_path;
// Bad-ICRC packets sent while warnings were enabled (each one is printed or suppressed).
uint64_t g_bad_icrc_sent = 0;

std::string read_log() {
  std::ifstream in(g_log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos) out.push_back(l);
  return out;
}

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "0x%x", v);
  return b;
}

class LogEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    g_log_path = ::testing::TempDir() + "softrnic_log_drops_" + std::to_string(getpid()) + ".log";
    std::remove(g_log_path.c_str());
    ASSERT_EQ(base::set_log_file(g_log_path), "");
  }
  void TearDown() override {
    (void)base::set_log_file("");
    base::set_log_level(base::LogLevel::kError);
    std::remove(g_log_path.c_str());
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new LogEnv);

// Two devices on the in-memory network (c 127.0.0.2 -> s 127.0.0.3, one RC pair) and a raw
// peer (127.0.0.9) that can send s what no device would: a bad ICRC, an unknown QPN.
class LogDrops : public ::testing::Test {
 protected:
  wire::MemNetwork net;
  Node c = Node::on_mem(net, "127.0.0.2");
  Node s = Node::on_mem(net, "127.0.0.3");
  Peer peer{net, "127.0.0.9", "127.0.0.3"};
  std::shared_ptr<Qp> qc, qs;
  GuardedBuf lbuf{4096}, tbuf{4096}, rbuf{4096};
  std::shared_ptr<Mr> ml, mt, mr;

  void SetUp() override {
    base::set_log_level(base::LogLevel::kDebug);  // what SOFTRNIC_LOG=debug sets
    qc = c.qp(QpType::kRc);
    qs = s.qp(QpType::kRc);
    connect_pair(c, qc, s, qs);  // PSNs start at 100
    ml = c.mr(lbuf.data(), lbuf.n);
    mt = s.mr(tbuf.data(), tbuf.n);
    mr = s.mr(rbuf.data(), rbuf.n);
  }
  void TearDown() override { base::set_log_level(base::LogLevel::kError); }
  void run() { pump({&c, &s}); }
  wire::PacketFields send_to(uint32_t qpn, uint32_t psn) {
    wire::PacketFields f;
    f.opcode = op::kRcSendOnly;
    f.dest_qp = qpn;
    f.psn = psn;
    f.ack_req = true;
    return f;
  }
  void bad_icrc(uint32_t psn) {
    const uint8_t pay[16] = {};
    peer.send(send_to(qs->qpn(), psn), pay, /*corrupt_icrc=*/true);
    if (base::log_enabled(base::LogLevel::kWarn)) ++g_bad_icrc_sent;
  }
  void unknown_qpn(uint32_t qpn, uint32_t psn) {
    const uint8_t pay[4] = {};
    peer.send(send_to(qpn, psn), pay);
  }
  void write_wrong_rkey() {
    Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(lbuf.data(), 64, ml)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(tbuf.data());
    w.rdma.rkey = mt->rkey() ^ 0x80;  // what `rewrite(rkey ^= 0x80, fix)` does on the wire
    ASSERT_TRUE(post(qc, w).is_ok());
  }
};

TEST_F(LogDrops, EachDropIsNamedOnceWithSourceQpnOpcodePsnAndCounter) {
  const std::string before = read_log();
  bad_icrc(12);
  unknown_qpn(0xabcd, 7);
  write_wrong_rkey();
  run();
  // The drops happened (the counters are the ground truth the lines must agree with).
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 1u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
  EXPECT_EQ(qs->comp_.ctr.get(Ctr::kRemAccessNakSent), 1u);
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr);

  const std::string log = read_log().substr(before.size());
  const std::string qpn = hex(qs->qpn());
  auto icrc = lines_with(log, "drop: bad ICRC");
  ASSERT_EQ(icrc.size(), 1u) << log;
  EXPECT_NE(icrc[0].find("drop: bad ICRC from 127.0.0.9:4791 to qpn " + qpn +
                         " op RC_SEND_ONLY psn 12 (icrc_err)"),
            std::string::npos)
      << icrc[0];
  auto uq = lines_with(log, "drop: unknown QPN");
  ASSERT_EQ(uq.size(), 1u) << log;
  EXPECT_NE(uq[0].find("drop: unknown QPN from 127.0.0.9:4791 to qpn 0xabcd op RC_SEND_ONLY "
                       "psn 7 (drop_unknown_qpn)"),
            std::string::npos)
      << uq[0];
  auto rk = lines_with(log, "refused by rkey check");
  ASSERT_EQ(rk.size(), 1u) << log;
  EXPECT_NE(rk[0].find("nak: WRITE refused by rkey check: BAD_KEY from 127.0.0.2:4791 to qpn " +
                       qpn + " op RC_RDMA_WRITE_ONLY psn 100 (rem_access_nak_sent)"),
            std::string::npos)
      << rk[0];
  // Warnings, in softrnic's line format.
  for (const auto& l : {icrc[0], uq[0], rk[0]})
    EXPECT_EQ(l.rfind("softrnic[" + std::to_string(getpid()) + "] warn: ", 0), 0u) << l;
}

TEST_F(LogDrops, NothingAtTheDefaultLevel) {
  base::set_log_level(base::LogLevel::kError);  // the default threshold
  const std::string before = read_log();
  bad_icrc(13);
  unknown_qpn(0xabce, 8);
  write_wrong_rkey();
  run();
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 1u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
  EXPECT_EQ(read_log(), before);
}

TEST_F(LogDrops, LinesGoToStderrNeverStdout) {
  ASSERT_EQ(base::set_log_file(""), "");
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  unknown_qpn(0xabcf, 9);
  run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(base::set_log_file(g_log_path), "");
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
  EXPECT_NE(err.find("drop: unknown QPN from 127.0.0.9:4791 to qpn 0xabcf"), std::string::npos)
      << err;
  EXPECT_EQ(out.find("softrnic"), std::string::npos) << out;
}

// A flood of 1000 bad-ICRC packets: at most kBurst lines in the window; the first line after
// it reports how many were suppressed, so lines + suppressed == packets (none unexplained).
TEST_F(LogDrops, FloodIsRateLimitedAndReportsTheSuppressedCount) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) {
    bad_icrc(static_cast<uint32_t>(1000 + i));
    if (i % 64 == 63) run();
  }
  run();
  ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4))
      << "the flood must fit in one rate-limit window for this test to mean anything";
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 1000u);
  const size_t in_window = lines_with(read_log(), "drop: bad ICRC").size();
  EXPECT_GE(in_window, 1u);
  EXPECT_LE(in_window, base::RateLimit::kBurst);

  // After the interval the next bad packet prints again, with the suppressed count.
  std::this_thread::sleep_for(std::chrono::nanoseconds(base::RateLimit::kIntervalNs) +
                              std::chrono::milliseconds(200));
  bad_icrc(5000);
  run();
  auto all = lines_with(read_log(), "drop: bad ICRC");
  ASSERT_EQ(all.size(), in_window + 1);
  const std::regex sup(R"(\((\d+) similar messages suppressed\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all.back(), m, sup)) << all.back();
  EXPECT_GE(std::stoull(m[1]), 1000u - base::RateLimit::kBurst);
  uint64_t explained = all.size();
  for (const auto& l : all)
    if (std::regex_search(l, m, sup)) explained += std::stoull(m[1]);
  EXPECT_EQ(explained, g_bad_icrc_sent);
}

// SOFTRNIC_LOG=trace: an accepted packet is traced at ingress and at each responder step.
TEST_F(LogDrops, TraceFollowsAnAcceptedPacketThroughTheResponderSteps) {
  base::set_log_level(base::LogLevel::kTrace);
  ASSERT_TRUE(post_recv(qs, 5, {sge(rbuf.data(), 64, mr)}).is_ok());
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 6, {sge(lbuf.data(), 32, ml)})).is_ok());
  const std::string before = read_log();
  run();
  ASSERT_EQ(poll_n(*s.rcq, 1, 1000).size(), 1u);
  const std::string log = read_log().substr(before.size());
  const std::string qpn = hex(qs->qpn());
  EXPECT_EQ(lines_with(log, "rx: RC_SEND_ONLY from 127.0.0.2:4791 to qpn " + qpn +
                                " psn 100 len 32 -> responder")
                .size(),
            1u)
      << log;
  // Every step of the state machine, in order, each named once.
  std::vector<std::string> steps;
  for (const auto& l : lines_with(log, "resp: qpn " + qpn + " RC_SEND_ONLY psn 100 epsn "))
    steps.push_back(l.substr(l.rfind(" step ") + 6));
  const std::vector<std::string> want = {"CHECK_PSN",    "CHECK_OP_SEQ", "CHECK_OP_VALID",
                                         "CHECK_RESOURCE", "CHECK_LENGTH", "CHECK_RKEY",
                                         "EXECUTE",      "COMPLETE",     "ACKNOWLEDGE",
                                         "DONE"};
  EXPECT_EQ(steps, want) << log;
  // The ACK going back is traced at c's ingress, to the completer.
  EXPECT_FALSE(lines_with(log, "rx: RC_ACKNOWLEDGE from 127.0.0.3:4791 to qpn " + hex(qc->qpn()))
                   .empty())
      << log;
}

}  // namespace
}  // namespace rnic::emu::test
