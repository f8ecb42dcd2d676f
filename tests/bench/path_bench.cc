// Google Benchmark of the engine's own per-message work, without the kernel (issue 15,
// latency): two devices on a MemNetwork, one thread, a 64 B RC SEND ping-pong. One
// iteration = a posts a SEND, b's poll_cq receives it (inline drain) and b posts the answer,
// a's poll_cq receives that: two messages, each with its ACK, through every layer a UDP
// ping-pong takes (post, requester, headers and ICRC, receive checks, responder, CQ) but the
// socket. With ack_hold (range(0) = 1) the ACKs ride the posts, as in ib_send_lat.
// Run: path_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

// Two devices on a MemNetwork with one connected RC QP each (MTU 1024).
struct Pair {
  wire::MemNetwork net;
  Node a, b;
  std::shared_ptr<Qp> qa, qb;
  explicit Pair(const EngineConfig& ec = {})
      : a(Node::on_mem(net, "127.0.0.2", false, ErrorsMode::kSpec, 0, ec)),
        b(Node::on_mem(net, "127.0.0.3", false, ErrorsMode::kSpec, 0, ec)) {
    // As the shim's CQs without a completion-timestamp wc_flag (ibv_create_cq: perftest).
    for (Node* n : {&a, &b})
      for (Cq* c : {n->scq.get(), n->rcq.get()}) c->set_timestamps(false);
    qa = a.qp(QpType::kRc);
    qb = b.qp(QpType::kRc);
    connect_pair(a, qa, b, qb);
  }
};

void BM_SendPingPong64(benchmark::State& state) {
  EngineConfig ec;
  ec.ack_hold_ns = state.range(0) != 0 ? 50'000 : 0;
  Pair p(ec);
  Node &a = p.a, &b = p.b;
  auto &qa = p.qa, &qb = p.qb;
  constexpr uint32_t kLen = 64;
  constexpr int kSlots = 16;
  std::vector<uint8_t> ra(kLen * kSlots), rb(kLen * kSlots), ta(kLen, 1), tb(kLen, 2);
  auto mra = a.mr(ra.data(), ra.size()), mrb = b.mr(rb.data(), rb.size());
  auto mta = a.mr(ta.data(), ta.size()), mtb = b.mr(tb.data(), tb.size());
  for (int i = 0; i < kSlots; ++i) {
    (void)post_recv(qa, i, {sge(ra.data() + i * kLen, kLen, mra)});
    (void)post_recv(qb, i, {sge(rb.data() + i * kLen, kLen, mrb)});
  }
  Wr wa = send_wr(WrOpcode::kSend, 1, {sge(ta.data(), kLen, mta)});
  Wr wb = send_wr(WrOpcode::kSend, 2, {sge(tb.data(), kLen, mtb)});
  // Polls one receive completion (draining inline), posts the receive again.
  auto take = [&](Node& n, std::shared_ptr<Qp>& q, std::vector<uint8_t>& r,
                  const std::shared_ptr<Mr>& m) {
    Cqe c;
    for (int spins = 0; spins < 1000; ++spins) {
      if (n.rcq->poll(&c, 1) == 1) {
        if (c.status != WcStatus::kSuccess) return false;
        return post_recv(q, c.wr_id, {sge(r.data() + c.wr_id * kLen, kLen, m)}).is_ok();
      }
    }
    return false;
  };
  Cqe sc[16];
  for (auto _ : state) {
    if (!post(qa, wa).is_ok() || !take(b, qb, rb, mrb) || !post(qb, wb).is_ok() ||
        !take(a, qa, ra, mra)) {
      state.SkipWithError("ping-pong stalled");
      break;
    }
    while (a.scq->poll(sc, 16) > 0) {
    }
    while (b.scq->poll(sc, 16) > 0) {
    }
  }
  state.counters["ns_per_msg"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SendPingPong64)->Arg(0)->Arg(1);

// One RDMA READ of range(0) bytes at MTU 1024 (64 KiB: 64 response packets), one thread: a
// posts it, b's drain answers it, a's drain scatters the responses into its MR and completes
// it. Both sides' per-packet work, the requester's scatter checks (ScatterCache) among
// it, without the kernel.
void BM_Read(benchmark::State& state) {
  Pair p;
  Node &a = p.a, &b = p.b;
  auto& qa = p.qa;
  const auto len = static_cast<uint32_t>(state.range(0));
  std::vector<uint8_t> la(len), rb(len, 7);
  auto mla = a.mr(la.data(), la.size()), mrb = b.mr(rb.data(), rb.size());
  Wr w = send_wr(WrOpcode::kRdmaRead, 1, {sge(la.data(), len, mla)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(rb.data());
  w.rdma.rkey = mrb->rkey();
  Cqe c;
  for (auto _ : state) {
    if (!post(qa, w).is_ok()) {
      state.SkipWithError("post failed");
      break;
    }
    int k = 0;
    for (int spins = 0; k == 0 && spins < 100000; ++spins) {
      b.eng->poll_rx();
      k = a.scq->poll(&c, 1);  // drains a's socket inline
    }
    if (k != 1 || c.status != WcStatus::kSuccess) {
      state.SkipWithError("READ did not complete");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * len);
  state.counters["kept"] = static_cast<double>(a.eng->counters().get(Ctr::kScatterKept));
}
BENCHMARK(BM_Read)->Arg(4096)->Arg(65536);

}  // namespace
}  // namespace rnic::emu::test

BENCHMARK_MAIN();
