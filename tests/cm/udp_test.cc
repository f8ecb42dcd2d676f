// tests/cm/udp_test: two devices over real loopback UDP (127.0.0.61/62:4791) doing
// REQ/REP/RTU, DREQ/DREP and a REJ 8 (no listener), captured with SOFTRNIC_PCAP's writer
// (DeviceServices) and decoded by tshark: nothing malformed, every CM field named and equal
// to what was sent (cm-notes §4.2). Skips (counted) when tshark is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "emu/services/services.h"
#include "tests/cm/cm_test_util.h"

namespace rnic::cm::testing {
namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, c)) v.push_back(x);
  return v;
}

uint64_t num(const std::string& s) {
  char* end = nullptr;
  const uint64_t v = std::strtoull(s.c_str(), &end, 0);
  return s.empty() || end == s.c_str() ? ~uint64_t{0} : v;
}

TEST(CmUdp, HandshakeTeardownRejOverLoopbackDecodedByTshark) {
  char tmpl[] = "/tmp/cm_udp_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string pcap = std::string(tmpl) + "/cm.pcap";
  uint32_t id = 0, pid = 0;
  {
    auto a = udp_node("127.0.0.61", 200);
    auto b = udp_node("127.0.0.62", 200);
    if (!a || !b) GTEST_SKIP() << "cannot bind 127.0.0.61/62:4791";
    emu::ServicesOptions so;
    so.pcap = pcap;
    so.control = emu::ControlMode::kOff;
    std::string err;
    // Services of a: capture of both directions. Made after the agent; torn down first
    // (it stops a's engine), so the agent goes before it.
    auto svc = emu::DeviceServices::create(a->dev, so, &err);
    ASSERT_TRUE(svc) << err;
    Recorder ra, rb;
    Agent& A = *a->cm;
    Agent& B = *b->cm;
    rb.on_event([&](const Event& e) {
      if (e.type == EventType::kReqReceived) {
        EXPECT_EQ(B.send_rep(e.comm_id, rep_params()), 0);
      }
      if (e.type == EventType::kDreqReceived) {
        EXPECT_EQ(B.send_drep(e.comm_id, {}), 0);
      }
    });
    ra.on_event([&](const Event& e) {
      if (e.type == EventType::kRepReceived) {
        EXPECT_EQ(A.send_rtu(e.comm_id, {}), 0);
      }
    });
    ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
    const int64_t r = A.send_req(req_to(*a, *b), ra.sink());
    ASSERT_GT(r, 0);
    id = static_cast<uint32_t>(r);
    ASSERT_TRUE(rb.wait(EventType::kRtuReceived));
    pid = rb.first(EventType::kReqReceived).comm_id;
    ASSERT_EQ(A.send_dreq(id, {}), 0);
    ASSERT_TRUE(ra.wait(EventType::kDrepReceived));
    ASSERT_TRUE(ra.wait(EventType::kTimewaitExit));
    ReqParams q = req_to(*a, *b);
    q.service_id = kSid + 1;
    Recorder r2;
    ASSERT_GT(A.send_req(q, r2.sink()), 0);
    ASSERT_TRUE(r2.wait(EventType::kRejReceived));
    EXPECT_EQ(r2.first(EventType::kRejReceived).reject_reason, kRejInvalidServiceId);
    EXPECT_EQ(A.counters().mads_retried, 0u);
    a->cm.reset();
    svc.reset();
  }
  if (system("command -v tshark >/dev/null 2>&1") != 0) GTEST_SKIP() << "tshark not installed";
  // Nothing malformed, no dissector error.
  const std::string bad = run("tshark -r " + pcap + " -Y '_ws.malformed || _ws.expert.severity >= 6291456' 2>/dev/null | wc -l");
  EXPECT_EQ(std::stoi(bad), 0) << run("tshark -r " + pcap + " -V 2>&1 | head -200");
  const std::string f =
      run("tshark -r " + pcap + " -T fields -E separator=, -e infiniband.mad.attributeid "
          "-e infiniband.mad.method -e infiniband.mad.classversion -e infiniband.deth.q_key "
          "-e infiniband.deth.srcqp -e infiniband.bth.destqp "
          "-e infiniband.cm.req -e infiniband.cm.req.serviceid -e infiniband.cm.req.localqpn "
          "-e infiniband.cm.req.startpsn -e infiniband.cm.req.responderres "
          "-e infiniband.cm.req.initdepth -e infiniband.cm.req.pppmtu "
          "-e infiniband.cm.rep -e infiniband.cm.rep.remotecommid -e infiniband.cm.rep.localqpn "
          "-e infiniband.cm.rep.startpsn -e infiniband.cm.rtu.localcommid "
          "-e infiniband.cm.dreq.localcommid -e infiniband.cm.req.remoteqpneecn "
          "-e infiniband.cm.drsp.localcommid -e infiniband.cm.rej.reason "
          "-e infiniband.cm.rej.remotecommid 2>/dev/null");
  int req = 0, rep = 0, rtu = 0, dreq = 0, drep = 0, rej = 0;
  for (const std::string& line : split(f, '\n')) {
    auto c = split(line, ',');
    c.resize(23);
    EXPECT_EQ(num(c[1]), 3u) << line;             // Send
    EXPECT_EQ(num(c[2]), 2u) << line;             // class version 2
    EXPECT_EQ(num(c[3]), 0x80010000u) << line;    // GSI Q_Key
    EXPECT_EQ(num(c[4]), 1u) << line;             // SrcQP 1
    EXPECT_EQ(num(c[5]), 1u) << line;             // DestQP 1
    switch (num(c[0])) {
      case 0x10:
        ++req;
        if (num(c[7]) == kSid) {
          EXPECT_EQ(num(c[6]), id) << line;
          EXPECT_EQ(num(c[8]), 0x123u) << line;
          EXPECT_EQ(num(c[9]), 0xABCDu) << line;
          EXPECT_EQ(num(c[10]), 4u) << line;
          EXPECT_EQ(num(c[11]), 2u) << line;
          EXPECT_EQ(num(c[12]), 3u) << line;
        }
        break;
      case 0x13:
        ++rep;
        EXPECT_EQ(num(c[13]), pid) << line;
        EXPECT_EQ(num(c[14]), id) << line;
        EXPECT_EQ(num(c[15]), 0x456u) << line;
        EXPECT_EQ(num(c[16]), 0xBEEFu) << line;
        break;
      case 0x14: ++rtu; EXPECT_EQ(num(c[17]), id) << line; break;
      case 0x15:
        ++dreq;
        EXPECT_EQ(num(c[18]), id) << line;
        EXPECT_EQ(num(c[19]), 0x456u) << line;  // the receiver's QPN
        break;
      case 0x16: ++drep; EXPECT_EQ(num(c[20]), pid) << line; break;
      case 0x12: ++rej; EXPECT_EQ(num(c[21]), 8u) << line; break;
      default: ADD_FAILURE() << "unexpected: " << line;
    }
  }
  EXPECT_EQ(req, 2);
  EXPECT_EQ(rep, 1);
  EXPECT_EQ(rtu, 1);
  EXPECT_EQ(dreq, 1);
  EXPECT_EQ(drep, 1);
  EXPECT_EQ(rej, 1);
  std::string rm = "rm -rf " + std::string(tmpl);
  (void)system(rm.c_str());
}

}  // namespace
}  // namespace rnic::cm::testing
