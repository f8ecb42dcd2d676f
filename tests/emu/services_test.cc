// tests/emu/services_test: DeviceServices on two devices over a MemNetwork (engines driven by
// hand): SOFTRNIC_PCAP capture decodes (PcapReader + ICRC on every frame, tshark if present),
// faults added through the control socket change traffic, stats, runtime capture start/stop,
// filter install/removal, and the error paths (bad plan, bad SOFTRNIC_CONTROL, required socket).
#include "emu/services/services.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "emu/services/control.h"
#include "tools/control_client.h"
#include "tests/emu/proto_util.h"
#include "wire/icrc.h"
#include "wire/pcap.h"
#include "wire/port.h"

namespace rnic::emu {
namespace {

using test::Node;

bool wait_for(const std::function<bool()>& pred, int timeout_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string temp_dir() {
  char tmpl[] = "/tmp/svc_test.XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

// Every frame of a pcap: Ethernet + IPv4, ICRC verified over the IP datagram.
struct PcapSummary {
  size_t frames = 0;
  size_t icrc_ok = 0;
  std::vector<uint8_t> opcodes;
  std::vector<size_t> bad_icrc;  // frame indices (0-based) whose ICRC does not verify
};

PcapSummary read_pcap(const std::string& path) {
  PcapSummary s;
  int err = 0;
  auto r = wire::PcapReader::open(path, &err);
  EXPECT_NE(r, nullptr) << path << ": " << err;
  if (r == nullptr) return s;
  EXPECT_EQ(r->linktype(), wire::kLinktypeEthernet);
  wire::PcapFrame f;
  while (r->next(f)) {
    ++s.frames;
    if (f.data.size() < wire::kEthHdrLen + wire::kIpv4HdrLen + wire::kUdpHdrLen + 12 + 4) continue;
    std::span<const uint8_t> ip(f.data.data() + wire::kEthHdrLen, f.data.size() - wire::kEthHdrLen);
    if (wire::icrc_check(ip)) {
      ++s.icrc_ok;
    } else {
      s.bad_icrc.push_back(s.frames - 1);
    }
    s.opcodes.push_back(f.data[wire::kEthHdrLen + wire::kIpv4HdrLen + wire::kUdpHdrLen]);
  }
  return s;
}

// Two nodes, one RC pair, services on node a.
class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    a_ = Node::on_mem(net_, "10.0.0.1");
    b_ = Node::on_mem(net_, "10.0.0.2");
    qa_ = a_.qp(QpType::kRc);
    qb_ = b_.qp(QpType::kRc);
    test::connect_pair(a_, qa_, b_, qb_);
    src_ = std::make_unique<test::GuardedBuf>(kLen);
    dst_ = std::make_unique<test::GuardedBuf>(kLen);
    src_->pattern(7);
    ma_ = a_.mr(src_->data(), kLen);
    mb_ = b_.mr(dst_->data(), kLen);
  }
  void TearDown() override {
    svc_.reset();
    std::string cmd = getenv("SVC_KEEP") ? std::string("true") : "rm -rf '" + dir_ + "'";
    int rc = std::system(cmd.c_str());
    (void)rc;
  }

  ServicesOptions opts() {
    ServicesOptions o;
    o.control_opts.runtime_dir = dir_ + "/rt";
    o.warn_stderr = false;
    return o;
  }
  void make(const ServicesOptions& o) {
    std::string err;
    svc_ = DeviceServices::create(a_.dev, o, &err);
    ASSERT_NE(svc_, nullptr) << err;
    EXPECT_EQ(err, "");
  }

  // RDMA WRITE of `len` bytes from a to b, then completes; returns the CQE status.
  WcStatus write(uint32_t len, uint64_t id = 1) {
    auto wr = test::send_wr(WrOpcode::kRdmaWrite, id, {test::sge(src_->data(), len, ma_)});
    wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst_->data());
    wr.rdma.rkey = mb_->rkey();
    EXPECT_TRUE(test::post(qa_, wr).is_ok());
    test::pump({&a_, &b_});
    auto c = test::poll_n(*a_.scq, 1, 2000, {&a_, &b_});
    if (c.size() != 1) return WcStatus::kGeneralErr;
    return c[0].status;
  }
  // SEND of `len` bytes a -> b with a receive posted on b.
  void send_msg(uint32_t len, uint64_t id) {
    ASSERT_TRUE(test::post_recv(qb_, id, {test::sge(dst_->data(), kLen, mb_)}).is_ok());
    auto wr = test::send_wr(WrOpcode::kSend, id, {test::sge(src_->data(), len, ma_)});
    ASSERT_TRUE(test::post(qa_, wr).is_ok());
    test::pump({&a_, &b_});
    auto c = test::poll_n(*a_.scq, 1, 2000, {&a_, &b_});
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, WcStatus::kSuccess);
    auto r = test::poll_n(*b_.rcq, 1, 2000, {&a_, &b_});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].byte_len, len);
  }
  ControlReply request(const std::string& line) {
    std::string err;
    EXPECT_NE(svc_->control(), nullptr);
    auto c = ControlClient::connect(svc_->control()->socket_path(), &err);
    EXPECT_NE(c, nullptr) << err;
    ControlReply rep;
    if (c) {
      EXPECT_EQ(c->request(line, &rep), "");
    }
    return rep;
  }
  static uint64_t stat(const ControlReply& r, const std::string& name) {
    for (const std::string& l : r.lines) {
      if (l.rfind(name + " ", 0) == 0) return std::strtoull(l.c_str() + name.size() + 1, nullptr, 10);
    }
    ADD_FAILURE() << "no stat " << name;
    return ~uint64_t{0};
  }

  static constexpr uint32_t kLen = 64 * 1024;
  std::string dir_;
  wire::MemNetwork net_;
  Node a_, b_;
  std::shared_ptr<Qp> qa_, qb_;
  std::unique_ptr<test::GuardedBuf> src_, dst_;
  std::shared_ptr<Mr> ma_, mb_;
  std::unique_ptr<DeviceServices> svc_;
};

TEST_F(ServicesTest, BadFaultPlanFailsCreateWithMessage) {
  ServicesOptions o = opts();
  o.faults = "op=RDMA_WRITE_* => explode";
  std::string err;
  auto s = DeviceServices::create(a_.dev, o, &err);
  EXPECT_EQ(s, nullptr);
  EXPECT_NE(err.find("SOFTRNIC_FAULTS"), std::string::npos) << err;
  EXPECT_NE(err.find("explode"), std::string::npos) << err;
  // The engine is untouched and still works.
  EXPECT_EQ(write(4096), WcStatus::kSuccess);
}

TEST_F(ServicesTest, BadFaultsFileAndSeedFailCreate) {
  ServicesOptions o = opts();
  o.faults_file = dir_ + "/missing.plan";
  std::string err;
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("SOFTRNIC_FAULTS_FILE"), std::string::npos) << err;
  o = opts();
  o.faults = "dir=tx => drop";
  o.fault_seed = "banana";
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("SOFTRNIC_FAULT_SEED"), std::string::npos) << err;
}

TEST_F(ServicesTest, FromEnvReadsAndValidatesVariables) {
  setenv("SOFTRNIC_CONTROL", "sometimes", 1);
  ServicesOptions o;
  std::string err = ServicesOptions::from_env(&o);
  EXPECT_NE(err.find("SOFTRNIC_CONTROL"), std::string::npos) << err;
  setenv("SOFTRNIC_CONTROL", "required", 1);
  setenv("SOFTRNIC_FAULTS", "dir=rx => drop", 1);
  setenv("SOFTRNIC_PCAP", "/tmp/x.%p.pcap", 1);
  o = ServicesOptions{};
  EXPECT_EQ(ServicesOptions::from_env(&o), "");
  EXPECT_EQ(o.control, ControlMode::kRequired);
  ASSERT_TRUE(o.faults.has_value());
  EXPECT_EQ(*o.faults, "dir=rx => drop");
  EXPECT_EQ(o.pcap, "/tmp/x.%p.pcap");
  setenv("SOFTRNIC_STATS_AT_EXIT", "/tmp/s.%p", 1);
  EXPECT_EQ(ServicesOptions::from_env(&o), "");
  EXPECT_EQ(o.stats_at_exit, "/tmp/s.%p");
  unsetenv("SOFTRNIC_STATS_AT_EXIT");
  setenv("SOFTRNIC_PCAP", "", 1);
  EXPECT_NE(ServicesOptions::from_env(&o).find("SOFTRNIC_PCAP"), std::string::npos);
  unsetenv("SOFTRNIC_CONTROL");
  unsetenv("SOFTRNIC_FAULTS");
  unsetenv("SOFTRNIC_PCAP");
}

TEST_F(ServicesTest, NoRulesNoCaptureLeavesPortUnfiltered) {
  make(opts());
  EXPECT_FALSE(svc_->filter_installed());
  // Nor is the fault engine attached to the engine: an attached one turns off the busy-poll
  // hand-off and the progress thread's spin for every packet.
  EXPECT_FALSE(a_.eng->fault_engine_attached());
  EXPECT_EQ(write(8192), WcStatus::kSuccess);
  EXPECT_EQ(svc_->faults().counters().packets, 0u);  // the filter saw nothing
}

// SOFTRNIC_STATS_AT_EXIT: closing the device writes the final counters, the same lines as
// `stats`, to the pattern's file ("%p" -> pid), 0600, with no temporary left behind.
TEST_F(ServicesTest, StatsAtExitWritesFinalCountersAtClose) {
  ServicesOptions o = opts();
  o.stats_at_exit = dir_ + "/final.%p";
  make(o);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(write(8192, i + 1), WcStatus::kSuccess);
  ControlReply live = request("stats");
  uint64_t tx = stat(live, "port_tx_packets");
  ASSERT_GT(tx, 0u);
  std::string path = dir_ + "/final." + std::to_string(getpid());
  struct stat st {};
  ASSERT_NE(::stat(path.c_str(), &st), 0) << "written before close";
  svc_.reset();
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(::stat((path + ".tmp").c_str(), &st), 0);
  ControlReply final_rep;
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    final_rep.lines.push_back(l);
  }
  std::fclose(f);
  EXPECT_EQ(final_rep.lines.size(), live.lines.size());
  EXPECT_EQ(stat(final_rep, "port_tx_packets"), tx);  // nothing sent after the last write
  EXPECT_GT(stat(final_rep, "sent_pkts"), 0u);
}

// An unwritable SOFTRNIC_STATS_AT_EXIT costs a log line at close, never the device.
TEST_F(ServicesTest, StatsAtExitUnwritableIsNotFatal) {
  ServicesOptions o = opts();
  o.stats_at_exit = dir_ + "/no/such/dir/final";
  make(o);
  EXPECT_EQ(write(4096), WcStatus::kSuccess);
  svc_.reset();
  struct stat st {};
  EXPECT_NE(::stat((dir_ + "/no").c_str(), &st), 0);
}

TEST_F(ServicesTest, PcapFromStartCapturesBothDirectionsWithGoodIcrc) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  ServicesOptions o = opts();
  o.pcap = dir_ + "/cap.%p.pcap";
  make(o);
  EXPECT_TRUE(svc_->filter_installed());
  EXPECT_EQ(write(kLen), WcStatus::kSuccess);   // 64 WRITE packets at MTU 1024 + ACKs
  send_msg(3000, 2);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 3000), 0);
  wire::PortCounters pc = a_.eng->port().counters();
  uint64_t expected = pc.tx_packets + pc.rx_packets;
  EXPECT_EQ(svc_->capture_packets(), expected);
  svc_.reset();  // closes the file
  std::string path = wire::expand_pcap_path(dir_ + "/cap.%p.pcap");
  PcapSummary s = read_pcap(path);
  EXPECT_EQ(s.frames, expected);
  EXPECT_GE(s.frames, 64u + 3u + 2u);
  EXPECT_EQ(s.icrc_ok, s.frames) << "first bad frame: " << (s.bad_icrc.empty() ? -1 : static_cast<long>(s.bad_icrc[0]));
  // tshark decodes every frame as InfiniBand with nothing malformed (when installed).
  if (access("/usr/bin/tshark", X_OK) == 0) {
    std::string cmd = "tshark -r '" + path + "' -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null | wc -l";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[64] = {};
    ASSERT_NE(fgets(buf, sizeof buf, p), nullptr);
    pclose(p);
    EXPECT_EQ(std::atoi(buf), 0) << "tshark found malformed frames in " << path;
    cmd = "tshark -r '" + path + "' -Y infiniband 2>/dev/null | wc -l";
    p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    ASSERT_NE(fgets(buf, sizeof buf, p), nullptr);
    pclose(p);
    EXPECT_EQ(static_cast<size_t>(std::atoi(buf)), s.frames);
  }
}

TEST_F(ServicesTest, BadPcapPathFailsCreate) {
  ServicesOptions o = opts();
  o.pcap = dir_ + "/no/such/dir/cap.pcap";
  std::string err;
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("SOFTRNIC_PCAP"), std::string::npos) << err;
  EXPECT_EQ(write(1024), WcStatus::kSuccess);  // engine untouched
}

TEST_F(ServicesTest, FaultAddThroughControlSocketDropsAndRetransmits) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  make(opts());
  ASSERT_NE(svc_->control(), nullptr) << svc_->warning();
  ControlReply r = request("fault add dir=tx op=RDMA_WRITE_* nth=3 => drop");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(svc_->filter_installed());
  EXPECT_TRUE(a_.eng->fault_engine_attached());
  r = request("fault list");
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.lines.size(), 1u);
  // 8 packets; the 3rd is dropped, b NAKs the gap (PSN sequence) and keeps 4..8 (its stash,
  // docs/congestion.md §2); a resends the 3rd alone.
  auto wr = test::send_wr(WrOpcode::kRdmaWrite, 1, {test::sge(src_->data(), 8192, ma_)});
  wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst_->data());
  wr.rdma.rkey = mb_->rkey();
  ASSERT_TRUE(test::post(qa_, wr).is_ok());
  test::pump({&a_, &b_});
  auto c = test::poll_n(*a_.scq, 1, 2000, {&a_, &b_});
  if (c.empty()) {  // recovery by timeout instead of NAK: fire the timer
    a_.eng->run_timers(wire::monotonic_ns() + 3'600'000'000'000ull);
    test::pump({&a_, &b_});
    c = test::poll_n(*a_.scq, 1, 2000, {&a_, &b_});
  }
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 8192), 0);
  EXPECT_TRUE(dst_->guards_ok());
  r = request("stats");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(stat(r, "fault_dropped"), 1u);
  EXPECT_EQ(stat(r, "fault_fired"), 1u);
  EXPECT_EQ(stat(r, "port_filter_dropped"), 1u);
  // b NAKed the gap once; a sent packet 3 again, alone (8 + 1), and spent no retry.
  EXPECT_EQ(stat(r, "rcvd_seq_err"), 1u);
  EXPECT_EQ(stat(r, "completer_retry_err"), 0u);
  EXPECT_EQ(stat(r, "retrans_pkts"), 1u);
  EXPECT_EQ(stat(r, "sent_pkts"), 9u);
  EXPECT_EQ(stat(r, "port_tx_packets"), 8u);  // the dropped one never left
  // Per-QP view of the same QP.
  r = request("stats qp " + std::to_string(qa_->qpn()));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(stat(r, "rcvd_seq_err"), 1u);
  EXPECT_EQ(stat(r, "sent_pkts"), 9u);
  EXPECT_EQ(stat(r, "rdma_sends"), 1u);
  r = request("stats qp 0x1");
  EXPECT_FALSE(r.ok);
  // Clearing the rules removes the filter again (nothing held).
  r = request("fault clear");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_FALSE(svc_->filter_installed());
  EXPECT_FALSE(a_.eng->fault_engine_attached());
  EXPECT_EQ(write(4096), WcStatus::kSuccess);
}

TEST_F(ServicesTest, RkeyRewriteRuleGivesRemoteAccessErrorNotHang) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  make(opts());
  ASSERT_TRUE(request("fault add dir=tx class=write => rewrite(rkey ^= 0x80)").ok);
  EXPECT_EQ(write(2048), WcStatus::kRemAccessErr);
  EXPECT_EQ(qa_->state(), QpState::kErr);
  ControlReply r = request("stats");
  EXPECT_EQ(stat(r, "fault_rewritten"), 1u);
  EXPECT_EQ(stat(r, "rem_access_nak_rcvd"), 1u);
  EXPECT_TRUE(dst_->guards_ok());
  for (size_t i = 0; i < 2048; ++i) ASSERT_EQ(dst_->data()[i], 0) << i;
}

// A nak rule on the responder's rx side needs no qpn=: the services resolve the requester's
// QPN from the local QP the packet is addressed to (its dest_qp_num).
TEST_F(ServicesTest, ResponderSideNakRuleResolvesRequesterQpn) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  ServicesOptions o = opts();
  o.control = ControlMode::kOff;
  o.faults = "dir=rx class=write once => nak(rem_access)";
  std::string err;
  auto sb = DeviceServices::create(b_.dev, o, &err);
  ASSERT_NE(sb, nullptr) << err;
  EXPECT_EQ(write(1024), WcStatus::kRemAccessErr);
  EXPECT_EQ(sb->faults().counters().injected, 1u);
  EXPECT_EQ(sb->faults().counters().inject_unresolved, 0u);
  EXPECT_EQ(qa_->state(), QpState::kErr);
  EXPECT_EQ(qb_->state(), QpState::kRts);  // the responder never saw the WRITE
  EXPECT_EQ(qb_->comp_.ctr.get(Ctr::kRdmaRecvs), 0u);
  for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(dst_->data()[i], 0) << i;
  EXPECT_TRUE(dst_->guards_ok());
}

TEST_F(ServicesTest, RuntimeCaptureStartStopThroughSocket) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  make(opts());
  EXPECT_FALSE(svc_->filter_installed());
  std::string path = dir_ + "/run.pcap";
  ControlReply r = request("capture start " + path);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(svc_->filter_installed());
  r = request("capture start " + path);
  EXPECT_FALSE(r.ok);  // already capturing
  send_msg(100, 1);
  uint64_t n = svc_->capture_packets();
  EXPECT_EQ(n, 2u);  // SEND_ONLY out, ACK in
  r = request("capture stop");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_FALSE(svc_->filter_installed());
  EXPECT_FALSE(request("capture stop").ok);
  send_msg(100, 2);  // not captured
  PcapSummary s = read_pcap(path);
  EXPECT_EQ(s.frames, 2u);
  EXPECT_EQ(s.icrc_ok, 2u);
  ASSERT_EQ(s.opcodes.size(), 2u);
  EXPECT_EQ(s.opcodes[0], wire::op::kRcSendOnly);
  EXPECT_EQ(s.opcodes[1], wire::op::kRcAcknowledge);
  EXPECT_FALSE(request("capture start " + dir_ + "/nodir/x.pcap").ok);
}

TEST_F(ServicesTest, TxCaptureShowsWhatLeavesDuplicatesTwiceDropsNever) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  ServicesOptions o = opts();
  o.faults = "rule d1 dir=tx op=SEND_ONLY nth=1 => dup(1); rule d2 dir=tx op=SEND_ONLY nth=2 => drop";
  o.pcap = dir_ + "/dup.pcap";
  make(o);
  send_msg(64, 1);  // duplicated: b answers the copy as a duplicate
  // Second SEND dropped on tx: recovered by the retransmit timer.
  ASSERT_TRUE(test::post_recv(qb_, 2, {test::sge(dst_->data(), kLen, mb_)}).is_ok());
  auto wr = test::send_wr(WrOpcode::kSend, 2, {test::sge(src_->data(), 64, ma_)});
  ASSERT_TRUE(test::post(qa_, wr).is_ok());
  test::pump({&a_, &b_});
  a_.eng->run_timers(wire::monotonic_ns() + 3'600'000'000'000ull);
  test::pump({&a_, &b_});
  auto c = test::poll_n(*a_.scq, 1, 2000, {&a_, &b_});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  svc_.reset();
  PcapSummary s = read_pcap(dir_ + "/dup.pcap");
  size_t sends = 0;
  for (uint8_t op : s.opcodes) sends += op == wire::op::kRcSendOnly;
  // 2 copies of the first SEND, 0 of the dropped original, 1 retransmission.
  EXPECT_EQ(sends, 3u);
  EXPECT_EQ(s.icrc_ok, s.frames) << "first bad frame: " << (s.bad_icrc.empty() ? -1 : static_cast<long>(s.bad_icrc[0]));
  EXPECT_GE(qb_->comp_.ctr.get(Ctr::kDuplicateRequest), 1u);
}

// Capture start/stop and rule add/clear through the socket while a sender thread keeps
// WRITEs flowing (engines with progress threads): every WRITE completes with the right data,
// and every capture file is whole, each frame with a good ICRC. (GSO off: a GSO batch built
// just before the filter went in would leave frames with IP IDs the capture cannot know.)
TEST(ServicesConcurrency, CaptureAndRulesSwappedWhileTrafficFlows) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  std::string dir = temp_dir();
  wire::MemNetwork net;
  auto node = [&](const char* ip) {
    Node n = Node::make_dev(ip, ErrorsMode::kSpec);
    EngineConfig ec;
    ec.progress_thread = true;
    ec.gso = false;
    auto e = Engine::start_with_port(n.dev, net.attach(*wire::Endpoint::parse(ip, wire::kRoceUdpPort)), ec);
    EXPECT_TRUE(e.has_value());
    n.eng = *e;
    n.finish();
    return n;
  };
  Node a = node("10.0.1.1"), b = node("10.0.1.2");
  auto qa = a.qp(QpType::kRc), qb = b.qp(QpType::kRc);
  test::connect_pair(a, qa, b, qb);
  constexpr uint32_t kSize = 8192;
  test::GuardedBuf src(kSize), dst(kSize);
  src.pattern(11);
  auto ma = a.mr(src.data(), kSize), mb = b.mr(dst.data(), kSize);
  ServicesOptions o;
  o.control_opts.runtime_dir = dir + "/rt";
  o.warn_stderr = false;
  std::string err;
  auto svc = DeviceServices::create(a.dev, o, &err);
  ASSERT_NE(svc, nullptr) << err;
  ASSERT_NE(svc->control(), nullptr);
  auto cli = ControlClient::connect(svc->control()->socket_path(), &err);
  ASSERT_NE(cli, nullptr) << err;

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, bad{0};
  std::thread sender([&] {
    uint64_t id = 0;
    while (!stop.load()) {
      auto wr = test::send_wr(WrOpcode::kRdmaWrite, ++id, {test::sge(src.data(), kSize, ma)});
      wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
      wr.rdma.rkey = mb->rkey();
      if (!test::post(qa, wr).is_ok()) {
        ++bad;
        return;
      }
      auto c = test::poll_n(*a.scq, 1, 20000);
      if (c.size() == 1 && c[0].status == WcStatus::kSuccess) {
        ++ok;
      } else {
        ++bad;
        return;
      }
    }
  });
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) {
    ControlReply r;
    std::string path = dir + "/c" + std::to_string(i) + ".pcap";
    ASSERT_EQ(cli->request("capture start " + path, &r), "");
    EXPECT_TRUE(r.ok) << r.error;
    if (i % 2 == 0) {
      ASSERT_EQ(cli->request("fault add dir=tx p=5% => dup", &r), "");
      EXPECT_TRUE(r.ok) << r.error;
    }
    uint64_t before = ok.load();
    wait_for([&] { return ok.load() >= before + 3 || bad.load() != 0; }, 10000);
    ASSERT_EQ(cli->request("capture stop", &r), "");
    EXPECT_TRUE(r.ok) << r.error;
    ASSERT_EQ(cli->request("fault clear", &r), "");
    EXPECT_TRUE(r.ok) << r.error;
  }
  stop = true;
  sender.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GE(ok.load(), static_cast<uint64_t>(kRounds) * 3);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kSize), 0);
  EXPECT_TRUE(dst.guards_ok());
  EXPECT_FALSE(svc->filter_installed());
  cli.reset();
  svc.reset();
  b.eng->stop();
  size_t frames = 0;
  for (int i = 0; i < kRounds; ++i) {
    PcapSummary s = read_pcap(dir + "/c" + std::to_string(i) + ".pcap");
    EXPECT_GT(s.frames, 0u) << i;
    EXPECT_EQ(s.icrc_ok, s.frames) << "capture " << i << " first bad frame "
                                   << (s.bad_icrc.empty() ? -1 : static_cast<long>(s.bad_icrc[0]));
    frames += s.frames;
  }
  EXPECT_GT(frames, static_cast<size_t>(kRounds) * 3 * 3);
  std::string cmd = "rm -rf '" + dir + "'";
  int rc = std::system(cmd.c_str());
  (void)rc;
}

TEST_F(ServicesTest, ControlRequiredFailsWhenSocketCannotOpen) {
  ServicesOptions o = opts();
  std::string file = dir_ + "/not_a_dir";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  o.control_opts.runtime_dir = file;
  o.control = ControlMode::kRequired;
  std::string err;
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("SOFTRNIC_CONTROL=required"), std::string::npos) << err;
  // Best effort: a warning, and the device still works (faults from the plan included when
  // the hooks are compiled in).
  o.control = ControlMode::kOn;
  if (wire::kFaultInjection) o.faults = "dir=rx op=ACKNOWLEDGE nth=1000000 => drop";
  ASSERT_NO_FATAL_FAILURE(make(o));
  EXPECT_EQ(svc_->control(), nullptr);
  EXPECT_NE(svc_->warning().find("control socket"), std::string::npos);
  EXPECT_EQ(write(1024), WcStatus::kSuccess);
  if (wire::kFaultInjection) {
    EXPECT_GT(svc_->faults().counters().packets, 0u);
  }
}

// -Dfault_injection=false: a plan (create or control socket) and a capture (SOFTRNIC_PCAP or
// `capture start`) are refused with a message naming the build option; no filter goes in and
// traffic still flows.
TEST_F(ServicesTest, NoFaultBuildRefusesPlansAndCapture) {
  if (wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled in";
  ServicesOptions o = opts();
  o.faults = "dir=tx => drop";
  std::string err;
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("fault injection is compiled out"), std::string::npos) << err;
  o = opts();
  o.pcap = dir_ + "/cap.pcap";
  EXPECT_EQ(DeviceServices::create(a_.dev, o, &err), nullptr);
  EXPECT_NE(err.find("SOFTRNIC_PCAP"), std::string::npos) << err;
  EXPECT_NE(err.find("-Dfault_injection=false"), std::string::npos) << err;
  o = opts();
  o.always_filter = true;
  ASSERT_NO_FATAL_FAILURE(make(o));
  EXPECT_FALSE(svc_->filter_installed());  // the port refuses the hook
  ASSERT_NE(svc_->control(), nullptr) << svc_->warning();
  ControlReply r = request("fault add dir=tx => drop");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("compiled out"), std::string::npos) << r.error;
  r = request("capture start " + dir_ + "/run.pcap");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("packet hook"), std::string::npos) << r.error;
  EXPECT_FALSE(svc_->filter_installed());
  EXPECT_EQ(write(4096), WcStatus::kSuccess);
}

TEST_F(ServicesTest, ControlOffOpensNoSocket) {
  ServicesOptions o = opts();
  o.control = ControlMode::kOff;
  make(o);
  EXPECT_EQ(svc_->control(), nullptr);
  EXPECT_EQ(svc_->warning(), "");
  struct stat st;
  EXPECT_NE(::stat((dir_ + "/rt").c_str(), &st), 0);
}

TEST_F(ServicesTest, SocketNamedAfterDeviceAndRemovedOnDestroy) {
  make(opts());
  ASSERT_NE(svc_->control(), nullptr);
  std::string path = svc_->control()->socket_path();
  EXPECT_NE(path.find(a_.dev->name() + "." + std::to_string(getpid()) + ".sock"), std::string::npos);
  ControlReply r = request("info");
  ASSERT_TRUE(r.ok);
  ASSERT_FALSE(r.lines.empty());
  EXPECT_EQ(r.lines[0], "device " + a_.dev->name());
  svc_.reset();
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace rnic::emu
