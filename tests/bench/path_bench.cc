// Google Benchmark of the engine's own per-message work, without the kernel (issue 15,
// latency): two devices on a MemNetwork, one thread, a 64 B RC SEND ping-pong. One
// iteration = a posts a SEND, b's poll_cq receives it (inline drain) and b posts the answer,
// a's poll_cq receives that: two messages, each with its ACK, through every layer a UDP
// ping-pong takes (post, requester, headers and ICRC, receive checks, responder, CQ) but the
// socket. With ack_hold (range(0) = 1) the ACKs ride the posts, as in ib_send_lat.
// range(1) = k: empty recvmmsg calls (EmptySocket) before each side's poll loop, so k a message
// and 2k an iteration; BM_EmptyLook is one of them alone. Per message, ns_per_msg(k) -
// ns_per_msg(0) - k x BM_EmptyLook is what a system call between packets costs the engine's
// own work (the caches it leaves cold).
// Run: path_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

// Two devices on a MemNetwork with one connected RC QP each (MTU 1024). The hub keeps no
// eventfds (nothing waits on them here): an eventfd write and read a message were 40% of the
// ping-pong's time, which is the hub's, not the engine's.
struct Pair {
  wire::MemNetwork net{4096, 65535, /*signal_fds=*/false};
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

// An empty UDP socket: range(1) > 0 makes that many empty recvmmsg calls on it before each
// take, as an application polling a real UDP port does while it waits for the answer. What
// they leave in the caches (the kernel's code and data) is what the engine's next packet
// meets on a real link, which a hot single-threaded loop does not show.
struct EmptySocket {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  bool ok = false;  // a bound socket (else each look would be a short EBADF call)
  EmptySocket() {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  }
  ~EmptySocket() {
    if (fd >= 0) close(fd);
  }
  void look(int64_t times) const {
    uint8_t buf[64];
    iovec iov{buf, sizeof(buf)};
    mmsghdr m{};
    m.msg_hdr.msg_iov = &iov;
    m.msg_hdr.msg_iovlen = 1;
    for (int64_t i = 0; i < times; ++i) (void)recvmmsg(fd, &m, 1, MSG_DONTWAIT, nullptr);
  }
};

void BM_SendPingPong64(benchmark::State& state) {
  EngineConfig ec;
  ec.ack_hold_ns = state.range(0) != 0 ? 50'000 : 0;
  const int64_t looks = state.range(1);
  EmptySocket empty;
  if (looks > 0 && !empty.ok) {
    state.SkipWithError("no UDP socket for the empty looks");
    return;
  }
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
    empty.look(looks);
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
// One empty recvmmsg (EmptySocket::look): the syscall the ping-pong's range(1) adds.
void BM_EmptyLook(benchmark::State& state) {
  EmptySocket empty;
  if (!empty.ok) {
    state.SkipWithError("no UDP socket");
    return;
  }
  for (auto _ : state) empty.look(1);
}
BENCHMARK(BM_EmptyLook);

BENCHMARK(BM_SendPingPong64)->Args({0, 0})->Args({1, 0})->Args({1, 1})->Args({1, 4});

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
