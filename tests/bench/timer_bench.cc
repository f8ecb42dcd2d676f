// Google Benchmark of the engine's timer tick against the number of idle QPs (issue 15,
// scale): one device on a MemNetwork with one active RC QP and range(0) idle connected RC
// QPs. One iteration = the active QP sends a 1-byte SEND (arming its retransmit timer), a raw
// peer ACKs it, and the timer wake-up the send asked for runs (run_timers at the armed
// time), as the progress thread's timerfd would. The cost must not grow with the idle QPs.
// Run: timer_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

constexpr uint32_t kPeerQpn = 0x456;

void BM_TimerTick(benchmark::State& state) {
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3");
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::vector<std::shared_ptr<Qp>> idle;
  for (int64_t i = 0; i < state.range(0); ++i) {
    idle.push_back(s.qp(QpType::kRc, nullptr, 4));
    connect_qp(*s.dev, idle.back(), "127.0.0.2", kPeerQpn + 1 + static_cast<uint32_t>(i), {});
  }
  auto qp = s.qp(QpType::kRc, nullptr, 64);
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, {});
  std::vector<uint8_t> buf(64, 1);
  auto mr = s.mr(buf.data(), buf.size());
  uint32_t psn = ConnOpts{}.sq_psn, msn = 0;
  uint64_t ticks = 0;
  for (auto _ : state) {
    Wr w = send_wr(WrOpcode::kSend, psn, {sge(buf.data(), 1, mr)}, 0);
    if (!post(qp, w).is_ok()) state.SkipWithError("post_send failed");
    const uint64_t at = qp->comp_.retrans_deadline_ns;  // the wake-up the send asked for
    (void)p.recv_all();
    wire::PacketFields f;
    f.opcode = wire::op::kRcAcknowledge;
    f.dest_qp = qp->qpn();
    f.psn = psn++;
    f.syndrome = wire::aeth::ack(wire::aeth::kCreditInvalid);
    f.msn = ++msn;
    p.send(f);
    s.eng->poll_rx();
    if (at != 0) {
      s.eng->run_timers(at);
      ++ticks;
    }
  }
  if (qp->comp_.ctr.get(Ctr::kRetryExceededErr) != 0 || qp->state() != QpState::kRts)
    state.SkipWithError("the active QP failed");
  state.counters["ticks"] = static_cast<double>(ticks);
}
BENCHMARK(BM_TimerTick)->Arg(0)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rnic::emu::test

BENCHMARK_MAIN();
