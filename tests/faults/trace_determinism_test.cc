// tests/faults/trace_determinism_test.cc: the same fault plan and seed give the same trace
// twice. Two devices (deterministic QPNs/keys, fixed PSNs) on an in-memory network, with their
// fault engines installed by DeviceServices from SOFTRNIC_FAULT* style options (plan, seed,
// trace file) exactly as the shim does, driven by one thread: post RDMA WRITEs with a window
// of 8, pump both receive paths until quiet, fire the earliest retransmit timer only when
// nothing moves. The packet sequence then depends only on the plan and the seed — unlike
// perftest over UDP, where retransmit timers race the peer and shift packet indices. With
// -Dfault_injection=false it checks instead that the plan is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "emu/services/services.h"
#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

constexpr const char* kPlan =
    "dir=tx class=write p=4% => drop; dir=tx class=write p=3% => dup;"
    " dir=tx class=ack p=10% => drop; dir=tx class=write every=97 => corrupt(payload)";
constexpr int kWrites = 150;
constexpr uint32_t kMsg = 4096;  // 4 packets at MTU 1024

Node mem_node(wire::MemNetwork& net, const char* ip) {
  Node n;
  n.ip = ip;
  DeviceConfig cfg;
  cfg.ip = ip;
  cfg.name = std::string("det_") + ip;
  cfg.netdev_mtu = 65536;
  cfg.key_seed = 12345;  // deterministic QPNs and keys: they appear in the trace
  auto d = Device::open(cfg);
  EXPECT_TRUE(d.has_value());
  n.dev = *d;
  auto port = net.attach(*wire::Endpoint::parse(ip, wire::kRoceUdpPort));
  EXPECT_TRUE(port != nullptr);
  EngineConfig ec;
  ec.progress_thread = false;
  auto e = Engine::start_with_port(n.dev, std::move(port), ec);
  EXPECT_TRUE(e.has_value());
  n.eng = *e;
  n.finish();
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RunResult {
  std::string trace_a, trace_b;  // requester's and responder's trace files
  uint64_t retries = 0, seq_naks = 0, dup_req = 0, icrc = 0;
  int ok = 0;
  bool data_ok = false;
};

RunResult run_once(const std::string& seed, const std::string& tag) {
  RunResult r;
  wire::MemNetwork net;
  Node a = mem_node(net, "10.9.0.1");
  Node b = mem_node(net, "10.9.0.2");
  std::string dir = ::testing::TempDir();
  std::string ta = dir + "det_trace_a_" + tag + "_" + std::to_string(getpid());
  std::string tb = dir + "det_trace_b_" + tag + "_" + std::to_string(getpid());
  std::remove(ta.c_str());
  std::remove(tb.c_str());
  std::unique_ptr<DeviceServices> sa, sb;
  {
    ServicesOptions so;
    so.faults = kPlan;
    so.fault_seed = seed;
    so.control = ControlMode::kOff;
    so.warn_stderr = false;
    std::string err;
    so.fault_trace = ta;
    sa = DeviceServices::create(a.dev, so, &err);
    EXPECT_TRUE(sa) << err;
    so.fault_trace = tb;
    sb = DeviceServices::create(b.dev, so, &err);
    EXPECT_TRUE(sb) << err;
    if (!sa || !sb) return r;
  }
  auto qa = a.qp(QpType::kRc);
  auto qb = b.qp(QpType::kRc);
  ConnOpts o;
  o.timeout = 20;  // ~4 s: never expires by itself; the loop fires timers explicitly
  connect_pair(a, qa, b, qb, o);
  GuardedBuf src(kMsg * kWrites), dst(kMsg * kWrites);
  src.pattern(7);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);

  int posted = 0, done = 0, idle = 0;
  Cqe cqe[16];
  while (done < kWrites && idle < 10000) {
    while (posted < kWrites && posted - done < 8) {
      Wr w = send_wr(WrOpcode::kRdmaWrite, posted, {sge(src.data() + posted * kMsg, kMsg, ms)});
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data() + posted * kMsg);
      w.rdma.rkey = md->rkey();
      EXPECT_TRUE(post(qa, w).is_ok());
      ++posted;
    }
    int moved = a.eng->poll_rx() + b.eng->poll_rx();
    int k = a.scq->poll(cqe, 16);
    for (int i = 0; i < k; ++i) {
      ++done;
      if (cqe[i].status == WcStatus::kSuccess) ++r.ok;
    }
    if (moved == 0 && k == 0) {
      ++idle;
      uint64_t da = a.eng->next_deadline_ns(), db = b.eng->next_deadline_ns();
      if (da == 0 && db == 0) break;  // nothing armed and nothing moving: stuck
      uint64_t t = da == 0 ? db : db == 0 ? da : std::min(da, db);
      if (da == t) a.eng->run_timers(t);
      if (db == t) b.eng->run_timers(t);
    }
  }
  EXPECT_EQ(done, kWrites) << "seed " << seed << ": stuck after " << done << " completions";
  r.data_ok = std::memcmp(src.data(), dst.data(), src.n) == 0 && dst.guards_ok();
  auto ca = a.eng->counters().snapshot();
  auto cb = b.eng->counters().snapshot();
  r.retries = ca[static_cast<size_t>(Ctr::kCompleterRetryErr)];
  r.seq_naks = ca[static_cast<size_t>(Ctr::kRcvdSeqErr)];
  r.dup_req = cb[static_cast<size_t>(Ctr::kDuplicateRequest)];
  r.icrc = cb[static_cast<size_t>(Ctr::kIcrcErr)];
  sa.reset();  // closes the trace files
  sb.reset();
  r.trace_a = slurp(ta);
  r.trace_b = slurp(tb);
  std::remove(ta.c_str());
  std::remove(tb.c_str());
  return r;
}

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(TraceDeterminismTest, SamePlanAndSeedGiveTheSameTraceTwice) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  RunResult r1 = run_once("424242", "1");
  RunResult r2 = run_once("424242", "2");
  RunResult r3 = run_once("31337", "3");
  for (const RunResult* r : {&r1, &r2, &r3}) {
    EXPECT_EQ(r->ok, kWrites);
    EXPECT_TRUE(r->data_ok) << "destination differs from source (or guard bands touched)";
  }
  std::printf("[ info ] seed 424242: %zu + %zu trace lines, completer_retry_err=%llu "
              "rcvd_seq_err=%llu duplicate_request=%llu icrc_err=%llu\n",
              lines(r1.trace_a), lines(r1.trace_b), (unsigned long long)r1.retries,
              (unsigned long long)r1.seq_naks, (unsigned long long)r1.dup_req,
              (unsigned long long)r1.icrc);
  std::printf("[ info ] first requester trace lines:\n%s",
              r1.trace_a.substr(0, r1.trace_a.find('\n', r1.trace_a.find('\n', r1.trace_a.find('\n') + 1) + 1) + 1).c_str());
  // The plan really fired, on both sides, with every action kind.
  EXPECT_GE(lines(r1.trace_a), 10u);
  EXPECT_GE(lines(r1.trace_b), 3u);
  EXPECT_NE(r1.trace_a.find("=> drop drop"), std::string::npos);
  EXPECT_NE(r1.trace_a.find("=> dup dup"), std::string::npos);
  EXPECT_NE(r1.trace_a.find("corrupt(payload)"), std::string::npos);
  EXPECT_NE(r1.trace_b.find("RC_ACKNOWLEDGE"), std::string::npos);
  EXPECT_GT(r1.retries, 0u);
  EXPECT_GT(r1.dup_req, 0u);
  EXPECT_GT(r1.icrc, 0u);
  // Same plan + seed: byte-identical traces and counters.
  EXPECT_EQ(r1.trace_a, r2.trace_a);
  EXPECT_EQ(r1.trace_b, r2.trace_b);
  EXPECT_EQ(r1.retries, r2.retries);
  EXPECT_EQ(r1.seq_naks, r2.seq_naks);
  EXPECT_EQ(r1.dup_req, r2.dup_req);
  // Another seed: another trace.
  EXPECT_NE(r1.trace_a, r3.trace_a);
}

// -Dfault_injection=false: the same options must make device services fail, never run
// without the plan.
TEST(TraceDeterminismTest, PlanIsRefusedWhenCompiledOut) {
  if (wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled in";
  wire::MemNetwork net;
  Node a = mem_node(net, "10.9.0.1");
  ServicesOptions so;
  so.faults = kPlan;
  so.fault_seed = "424242";
  so.control = ControlMode::kOff;
  so.warn_stderr = false;
  std::string err;
  EXPECT_EQ(DeviceServices::create(a.dev, so, &err), nullptr);
  EXPECT_NE(err.find("compiled out"), std::string::npos) << err;
}

}  // namespace
}  // namespace rnic::emu::test
