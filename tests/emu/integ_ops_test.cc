// tests/emu/integ_ops_test.cc: two devices over real loopback UDP (127.0.0.2 <-> 127.0.0.3,
// progress threads on): every operation x RC/UC/UD where legal, sizes 0, 1, MTU-1, MTU,
// MTU+1 and 1 MiB, single and multi-SGE, memory checked byte for byte with guard bands.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <atomic>
#include <thread>
#include <tuple>

#include "emu/objects/mw.h"
#include "tests/emu/proto_util.h"
#include "wire/port.h"

namespace rnic::emu::test {
namespace {

constexpr uint32_t kMtu = 1024;

struct Pair {
  explicit Pair(const EngineConfig& ec = EngineConfig{})
      : a(Node::on_udp_first_free({"127.0.0.2", "127.0.0.12", "127.0.0.22", "127.0.0.32"}, ec)),
        b(Node::on_udp_first_free({"127.0.0.3", "127.0.0.13", "127.0.0.23", "127.0.0.33"}, ec)) {}
  Node a, b;
};

const char* type_name(QpType t) {
  return t == QpType::kRc ? "RC" : t == QpType::kUc ? "UC" : "UD";
}

// Splits [p, p+len) into up to n SGEs of uneven sizes.
std::vector<Sge> split(uint8_t* p, uint32_t len, const std::shared_ptr<Mr>& m, int n) {
  std::vector<Sge> v;
  if (n <= 1 || len < 3) {
    v.push_back(sge(p, len, m));
    return v;
  }
  uint32_t a = len / 7 + 1, b = len / 2;
  v.push_back(sge(p, a, m));
  v.push_back(sge(p + a, b, m));
  v.push_back(sge(p + a + b, len - a - b, m));
  return v;
}

using Case = std::tuple<QpType, WrOpcode, uint32_t, bool>;

class OpsTest : public ::testing::TestWithParam<Case> {};

TEST_P(OpsTest, MovesBytesExactly) {
  auto [type, opc, size, multi] = GetParam();
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  auto qa = p.a.qp(type);
  auto qb = p.b.qp(type);
  ConnOpts o;
  if (type == QpType::kUd) {
    connect_qp(*p.a.dev, qa, nullptr, 0, o);
    connect_qp(*p.b.dev, qb, nullptr, 0, o);
  } else {
    connect_pair(p.a, qa, p.b, qb, o);
  }
  const bool is_send = opc == WrOpcode::kSend || opc == WrOpcode::kSendWithImm;
  const bool is_read = opc == WrOpcode::kRdmaRead;
  const bool has_imm = opc == WrOpcode::kSendWithImm || opc == WrOpcode::kRdmaWriteWithImm;
  const uint32_t grh = type == QpType::kUd ? 40 : 0;

  GuardedBuf local(size), remote(size + grh);
  local.pattern(size + 1);
  remote.pattern(size + 99);  // distinct: a READ must overwrite local with it
  if (is_read) std::swap(local, remote);  // READ: data flows b -> a
  auto ml = p.a.mr(local.raw(), local.raw_size());
  auto mr = p.b.mr(remote.raw(), remote.raw_size());
  GuardedBuf rbuf(8);
  auto mrb = p.b.mr(rbuf.data(), rbuf.n);

  const int nsge = multi ? 3 : 1;
  const bool needs_recv = is_send || opc == WrOpcode::kRdmaWriteWithImm;
  if (needs_recv) {
    if (is_send)
      ASSERT_TRUE(post_recv(qb, 77, split(remote.data(), remote.n, mr, multi ? 2 : 1)).is_ok());
    else
      ASSERT_TRUE(post_recv(qb, 77, {sge(rbuf.data(), 8, mrb)}).is_ok());
  }
  std::shared_ptr<Ah> ah;
  Wr w = send_wr(opc, 5, split(local.data(), size, ml, nsge));
  if (type == QpType::kUd) {
    ah = *p.a.dev->create_ah(p.a.pd, ah_to(p.b.ip.c_str()));
    w.ud.ah = ah.get();
    w.ud.remote_qpn = qb->qpn();
    w.ud.remote_qkey = o.qkey;
  }
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  w.rdma.rkey = mr->rkey();
  w.imm_data = 0xa1b2c3d4;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(post(qa, w).is_ok());

  auto sc = poll_n(*p.a.scq, 1, 20000);
  ASSERT_EQ(sc.size(), 1u) << "no send completion";
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess) << wc_status_name(sc[0].status);
  EXPECT_EQ(sc[0].wr_id, 5u);
  EXPECT_EQ(sc[0].opcode, wc_opcode_for(opc));
  if (needs_recv) {
    auto rc = poll_n(*p.b.rcq, 1, 20000);
    ASSERT_EQ(rc.size(), 1u) << "no receive completion";
    EXPECT_EQ(rc[0].status, WcStatus::kSuccess) << wc_status_name(rc[0].status);
    EXPECT_EQ(rc[0].wr_id, 77u);
    EXPECT_EQ(rc[0].byte_len, size + grh);
    EXPECT_EQ(rc[0].opcode, is_send ? WcOpcode::kRecv : WcOpcode::kRecvRdmaWithImm);
    EXPECT_EQ(rc[0].qp_num, qb->qpn());
    EXPECT_EQ(rc[0].src_qp, qa->qpn());
    if (has_imm) {
      EXPECT_TRUE(rc[0].wc_flags & kWcWithImm);
      EXPECT_EQ(rc[0].imm_data, 0xa1b2c3d4u);
    }
    if (type == QpType::kUd) {
      EXPECT_TRUE(rc[0].wc_flags & kWcGrh);
    }
  } else if (type == QpType::kUc) {
    // UC WRITE has no remote completion: a zero-length SEND behind it on the same QP
    // completes at b only after the WRITE's bytes have landed (in-order delivery).
    ASSERT_TRUE(post_recv(qb, 78, {sge(rbuf.data(), 8, mrb)}).is_ok());
    ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 6, {})).is_ok());
    auto rc = poll_n(*p.b.rcq, 1, 20000);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].wr_id, 78u);
    EXPECT_EQ(poll_n(*p.a.scq, 1, 20000).size(), 1u);
  }
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - t0).count();
  if (size >= (1u << 20)) {
    std::printf("[ info ] %s %s %u bytes: %lld us (%.1f MB/s)\n", type_name(type),
                wr_opcode_name(opc), size, static_cast<long long>(us),
                us > 0 ? size / static_cast<double>(us) : 0.0);
  }
  // Byte for byte: the target equals the source, and nothing else changed.
  EXPECT_EQ(0, std::memcmp(local.data(), remote.data() + grh, size));
  EXPECT_TRUE(local.guards_ok());
  EXPECT_TRUE(remote.guards_ok());
  EXPECT_EQ(qa->state(), QpState::kRts);
  EXPECT_EQ(qb->state(), QpState::kRts);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const uint32_t sizes[] = {0, 1, kMtu - 1, kMtu, kMtu + 1, 1u << 20};
  for (QpType t : {QpType::kRc, QpType::kUc, QpType::kUd}) {
    for (WrOpcode op : {WrOpcode::kSend, WrOpcode::kSendWithImm, WrOpcode::kRdmaWrite,
                        WrOpcode::kRdmaWriteWithImm, WrOpcode::kRdmaRead}) {
      if (t == QpType::kUd && op != WrOpcode::kSend && op != WrOpcode::kSendWithImm) continue;
      if (t == QpType::kUc && op == WrOpcode::kRdmaRead) continue;
      for (uint32_t s : sizes) {
        if (t == QpType::kUd && s > kMtu) continue;  // UD messages are <= MTU (port MTU here is 4096)
        v.emplace_back(t, op, s, false);
        if (s > 2) v.emplace_back(t, op, s, true);
      }
    }
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  auto [t, op, s, m] = i.param;
  std::string n = std::string(type_name(t)) + "_" + wr_opcode_name(op) + "_" + std::to_string(s) +
                  (m ? "_multisge" : "");
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpsTest, ::testing::ValuesIn(cases()), case_name);

// Atomics (RC only): CAS and FAA on 8-byte aligned words, results checked on both sides.
TEST(AtomicsTest, CasAndFaa) {
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  auto qa = p.a.qp(QpType::kRc);
  auto qb = p.b.qp(QpType::kRc);
  connect_pair(p.a, qa, p.b, qb);
  alignas(8) uint64_t words[4] = {5, 10, 0, 0};
  alignas(8) uint64_t res[4] = {};
  auto mw = p.b.mr(words, sizeof(words));
  auto mres = p.a.mr(res, sizeof(res));
  Wr f = send_wr(WrOpcode::kAtomicFetchAndAdd, 1, {sge(&res[0], 8, mres)});
  f.atomic.remote_addr = reinterpret_cast<uint64_t>(&words[0]);
  f.atomic.rkey = mw->rkey();
  f.atomic.compare_add = 7;
  Wr c1 = send_wr(WrOpcode::kAtomicCmpAndSwp, 2, {sge(&res[1], 8, mres)});
  c1.atomic.remote_addr = reinterpret_cast<uint64_t>(&words[1]);
  c1.atomic.rkey = mw->rkey();
  c1.atomic.compare_add = 10;
  c1.atomic.swap = 99;
  Wr c2 = send_wr(WrOpcode::kAtomicCmpAndSwp, 3, {sge(&res[2], 8, mres)});
  c2.atomic.remote_addr = reinterpret_cast<uint64_t>(&words[1]);
  c2.atomic.rkey = mw->rkey();
  c2.atomic.compare_add = 10;  // no longer matches: no swap
  c2.atomic.swap = 1234;
  ASSERT_TRUE(post(qa, f).is_ok());
  ASSERT_TRUE(post(qa, c1).is_ok());
  ASSERT_TRUE(post(qa, c2).is_ok());
  auto sc = poll_n(*p.a.scq, 3, 10000);
  ASSERT_EQ(sc.size(), 3u);
  for (auto& e : sc) EXPECT_EQ(e.status, WcStatus::kSuccess);
  EXPECT_EQ(sc[0].opcode, WcOpcode::kFetchAdd);
  EXPECT_EQ(sc[1].opcode, WcOpcode::kCompSwap);
  EXPECT_EQ(res[0], 5u);
  EXPECT_EQ(words[0], 12u);
  EXPECT_EQ(res[1], 10u);
  EXPECT_EQ(res[2], 99u);
  EXPECT_EQ(words[1], 99u);
  EXPECT_EQ(words[2], 0u);
}

// Many small SENDs back to back: every WR completes exactly once, in order, and each
// receive holds its own message (the sender's slot is not reused before its completion);
// prints a rate. defer_inflight: doorbell batching (EngineConfig), with the progress threads
// and the polling thread both running the requester.
void small_sends_in_order(uint32_t defer_inflight) {
  EngineConfig ec;
  ec.defer_inflight = defer_inflight;
  Pair p(ec);
  Node& a = p.a;
  Node& b = p.b;
  ASSERT_TRUE(a.eng && b.eng);
  auto qa = a.qp(QpType::kRc, nullptr, 1024);
  auto qb = b.qp(QpType::kRc, nullptr, 1024);
  connect_pair(a, qa, b, qb);
  constexpr int kN = 20000;
  constexpr int kWindow = 256;
  std::vector<uint64_t> src(8 * kWindow), dst(8 * kWindow);
  auto ms = a.mr(src.data(), src.size() * 8);
  auto md = b.mr(dst.data(), dst.size() * 8);
  for (int i = 0; i < kWindow; ++i)
    ASSERT_TRUE(post_recv(qb, static_cast<uint64_t>(i), {sge(&dst[8 * i], 64, md)}).is_ok());
  int posted = 0, sdone = 0, rdone = 0;
  uint64_t next_send_id = 0, next_recv_id = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto deadline = t0 + std::chrono::seconds(60);
  Cqe buf[32];
  while ((sdone < kN || rdone < kN) && std::chrono::steady_clock::now() < deadline) {
    while (posted < kN && posted - sdone < kWindow / 2) {
      uint64_t* slot = &src[8 * (posted % kWindow)];
      for (int w = 0; w < 8; ++w) slot[w] = static_cast<uint64_t>(posted) * 8 + w;
      Wr w = send_wr(WrOpcode::kSend, static_cast<uint64_t>(posted), {sge(slot, 64, ms)});
      ASSERT_TRUE(post(qa, w).is_ok());
      ++posted;
    }
    int k = a.scq->poll(buf, 32);
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(buf[i].status, WcStatus::kSuccess);
      ASSERT_EQ(buf[i].wr_id, next_send_id++);
    }
    sdone += k;
    k = b.rcq->poll(buf, 32);
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(buf[i].status, WcStatus::kSuccess);
      ASSERT_EQ(buf[i].wr_id, next_recv_id % kWindow);
      const uint64_t* got = &dst[8 * buf[i].wr_id];
      for (int w = 0; w < 8; ++w) ASSERT_EQ(got[w], next_recv_id * 8 + w) << "message " << next_recv_id;
      ++next_recv_id;
      ASSERT_TRUE(post_recv(qb, buf[i].wr_id, {sge(&dst[8 * buf[i].wr_id], 64, md)}).is_ok());
    }
    rdone += k;
  }
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(sdone, kN);
  EXPECT_EQ(rdone, kN);
  const uint64_t deferred = a.eng->counters().get(Ctr::kTxDeferred);
  if (defer_inflight == 0) {
    EXPECT_EQ(deferred, 0u);
  } else {
    EXPECT_GT(deferred, 0u);  // 128 posts in a row: the second always finds the first unacked
  }
  std::printf("[ info ] %d x 64-byte RC SENDs over loopback UDP in %lld us: %.0f msg/s "
              "(defer_inflight %u: %llu posts waited for an ACK)\n",
              kN, static_cast<long long>(us), us > 0 ? kN * 1e6 / static_cast<double>(us) : 0.0,
              defer_inflight, static_cast<unsigned long long>(deferred));
}

TEST(RateTest, SmallSendsInOrder) { small_sends_in_order(0); }
TEST(RateTest, SmallSendsInOrderWithDoorbellBatching) { small_sends_in_order(1); }

}  // namespace
}  // namespace rnic::emu::test

namespace rnic::emu::test {
namespace {

// Streams 1 MiB RDMA WRITEs (path MTU 4096, 8 in flight) and prints the rate.
TEST(RateTest, LargeWritesMtu4096) {
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  auto qa = p.a.qp(QpType::kRc);
  auto qb = p.b.qp(QpType::kRc);
  ConnOpts o;
  o.mtu = Mtu::k4096;
  connect_pair(p.a, qa, p.b, qb, o);
  constexpr uint32_t kLen = 1u << 20;
  constexpr int kN = 200;
  std::vector<uint8_t> src(kLen, 0x3c), dst(kLen);
  auto ms = p.a.mr(src.data(), kLen);
  auto md = p.b.mr(dst.data(), kLen);
  int posted = 0, done = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto deadline = t0 + std::chrono::seconds(60);
  Cqe buf[16];
  while (done < kN && std::chrono::steady_clock::now() < deadline) {
    while (posted < kN && posted - done < 8) {
      Wr w = send_wr(WrOpcode::kRdmaWrite, static_cast<uint64_t>(posted), {sge(src.data(), kLen, ms)});
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
      w.rdma.rkey = md->rkey();
      ASSERT_TRUE(post(qa, w).is_ok());
      ++posted;
    }
    int k = p.a.scq->poll(buf, 16);
    for (int i = 0; i < k; ++i) ASSERT_EQ(buf[i].status, WcStatus::kSuccess);
    done += k;
  }
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(done, kN);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), kLen));
  // GSO runs carry per-segment IP IDs in their ICRCs and GRO hands them back: none may fail.
  EXPECT_EQ(p.a.eng->counters().get(Ctr::kIcrcErr), 0u);
  EXPECT_EQ(p.b.eng->counters().get(Ctr::kIcrcErr), 0u);
  std::printf("[ info ] %d x 1 MiB RC WRITE (MTU 4096) over loopback UDP in %lld us: %.2f Gb/s; "
              "retries %llu\n",
              kN, static_cast<long long>(us), us > 0 ? kN * 8.0 * kLen / (us * 1000.0) : 0.0,
              static_cast<unsigned long long>(p.a.eng->counters().get(Ctr::kCompleterRetryErr)));
}

// The application's view of memory a peer's WRITE lands in, as ib_write_lat polls it. The
// engine's store is a plain memcpy, as a NIC's DMA is invisible to the CPU's memory model, so
// ThreadSanitizer would report the pair; this read (not the engine) is exempt from it.
__attribute__((no_sanitize("thread"))) uint32_t peek_dma(const volatile uint32_t* v) {
  return *v;
}
__attribute__((no_sanitize("thread"))) uint64_t peek_dma(const volatile uint64_t* v) {
  return *v;
}

// An RC QP on a and one on b, connected for a ping-pong between threads: ~17 ms x 8 tries is
// ample for four busy threads on two cores under a sanitizer, and a peer that went away
// still ends in RETRY_EXC_ERR in well under a second.
std::pair<std::shared_ptr<Qp>, std::shared_ptr<Qp>> ping_pong_qps(Node& a, Node& b) {
  auto qa = a.qp(QpType::kRc);
  auto qb = b.qp(QpType::kRc);
  ConnOpts o;
  o.timeout = 12;
  o.retry_cnt = 7;
  connect_pair(a, qa, b, qb, o);
  return {qa, qb};
}

// A WRITE ping-pong in which each side waits on memory (as ib_write_lat), so every WRITE is
// received by the peer's progress thread. Every byte arrives, each side polls only its send
// CQ; then, with the peer's engine stopped, a's retransmit timer still fires (RETRY_EXC_ERR
// after retry_cnt retries).
void write_ping_pong(uint32_t spin_ns, uint32_t busy_poll_ns, uint64_t ack_hold_ns = 0,
                     int wait_s = 10) {
  EngineConfig ec;
  ec.spin_ns = spin_ns;
  ec.busy_poll_ns = busy_poll_ns;
  ec.ack_hold_ns = ack_hold_ns;
  Pair p(ec);
  Node& a = p.a;
  Node& b = p.b;
  ASSERT_TRUE(a.eng && b.eng);
  EXPECT_EQ(a.eng->config().spin_ns, spin_ns);
  EXPECT_EQ(a.eng->config().busy_poll_ns, busy_poll_ns);
  auto [qa, qb] = ping_pong_qps(a, b);
  constexpr int kN = 300;
  alignas(8) volatile uint32_t ina = 0, inb = 0;
  uint32_t outa = 0, outb = 0;
  auto ma = a.mr(const_cast<uint32_t*>(&ina), 4);
  auto mb = b.mr(const_cast<uint32_t*>(&inb), 4);
  auto moa = a.mr(&outa, 4);
  auto mob = b.mr(&outb, 4);
  auto write = [&](Node& n, std::shared_ptr<Qp>& q, uint32_t* src, const std::shared_ptr<Mr>& ms,
                   volatile uint32_t* dst, const std::shared_ptr<Mr>& md) {
    Wr w = send_wr(WrOpcode::kRdmaWrite, *src, {sge(src, 4, ms)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst);
    w.rdma.rkey = md->rkey();
    ASSERT_TRUE(post(q, w).is_ok());
    // 256 polls back to back before it yields: a yield after each empty poll can outlast the
    // busy-poll gap (50 us) every time on a loaded machine, and then the polls never take
    // receive (CI saw kBusyPollTaken == 0 once).
    auto c = poll_n(*n.scq, 1, 5000, {}, 256);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, WcStatus::kSuccess);
  };
  auto wait_for = [wait_s](volatile uint32_t* v, uint32_t want) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
    while (peek_dma(v) != want && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    return peek_dma(v) == want;
  };
  std::thread tb([&] {
    for (uint32_t i = 1; i <= kN; ++i) {
      if (!wait_for(&inb, i)) return;
      outb = i;
      write(b, qb, &outb, mob, &ina, ma);
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() { if (t.joinable()) t.join(); }  // an ASSERT below must not leave it joinable
  } joiner{tb};
  for (uint32_t i = 1; i <= kN; ++i) {
    outa = i;
    write(a, qa, &outa, moa, &inb, mb);
    ASSERT_TRUE(wait_for(&ina, i)) << "reply " << i << " never arrived";
  }
  // With a long lease: no reply waited for it (see below). Looked at before b's last WRITE
  // completes: a holds its ACK for a post that never comes, and a's polls have stopped, so
  // that ACK goes when a's lease runs out.
  const bool long_lease = busy_poll_ns >= 50'000'000u;
  const uint64_t a_lease_ended = a.eng->counters().get(Ctr::kBusyPollLeaseEnded);
  tb.join();
  EXPECT_EQ(peek_dma(&ina), static_cast<uint32_t>(kN));
  EXPECT_EQ(peek_dma(&inb), static_cast<uint32_t>(kN));
  // Who received: b's progress thread took at least the first WRITE (b waits on memory from
  // the start, before any poll of its), and only polls of an empty CQ count as rx_drain_poll
  // (b's polls for its send completions, or none when its progress thread took everything).
  EXPECT_GT(b.eng->counters().get(Ctr::kRxDrainProgress), 0u);
  EXPECT_LE(a.eng->counters().get(Ctr::kRxDrainPoll) + a.eng->counters().get(Ctr::kRxDrainProgress),
            a.eng->counters().get(Ctr::kRcvdPkts));
  if (long_lease) {
    // The polls held receive, gave it back when their WRITE completed without the answer in,
    // and never left a reply to the lease (each would have waited for it to run out). With
    // ACKs held (by a poll's drain, or a progress thread's while its application is in its
    // loop) each answer can carry the ACK of the WRITE it answers: that completion then comes
    // with the answer in, and a side whose every answer came so never hands receive back.
    for (Node* n : {&a, &b}) {
      EXPECT_GT(n->eng->counters().get(Ctr::kBusyPollTaken), 0u);
      if (ack_hold_ns == 0) {
        EXPECT_GT(n->eng->counters().get(Ctr::kBusyPollReturned), 0u);
      }
    }
    EXPECT_EQ(a_lease_ended, 0u);
    EXPECT_EQ(b.eng->counters().get(Ctr::kBusyPollLeaseEnded), 0u);
    EXPECT_LE(a.eng->counters().get(Ctr::kBusyPollLeaseEnded), 1u);
  }
  // The peer goes away: a's retransmit timer must fire (from the spin, from epoll, or from
  // a's polls while they hold receive).
  b.eng->stop();
  outa = 0;
  Wr w = send_wr(WrOpcode::kRdmaWrite, 7, {sge(&outa, 4, moa)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(&inb);
  w.rdma.rkey = mb->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  auto c = poll_n(*a.scq, 1, 20000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRetryExcErr);
  if (long_lease) {
    EXPECT_GT(a.eng->counters().get(Ctr::kTimersOnPoll), 0u);
  }
}

// The progress thread's spin (EngineConfig::spin_ns, SOFTRNIC_SPIN_US): every WRITE of the
// ping-pong is received by the peer's progress thread, spinning between packets.
TEST(SpinTest, WritePingPongThroughSpinningProgressThreads) { write_ping_pong(200'000, 0); }

// The busy-poll hand-off (EngineConfig::busy_poll_ns, SOFTRNIC_BUSY_POLL_US): each side's
// polls of its empty send CQ take the socket from its progress thread, then it stops polling
// and waits on memory. The peer's WRITE comes while nobody polls, so the progress thread must
// take the socket back busy_poll_ns after the last poll (an engine that left receive to a
// poller that stopped would never see it: the 10 s wait fails).
TEST(BusyPollTest, WritePingPongWaitingOnMemoryAfterPolling) { write_ping_pong(0, 20'000); }
TEST(BusyPollTest, WritePingPongWithSpinAndHandOff) { write_ping_pong(20'000, 20'000); }

// A lease of 50 ms (the last held ACK waits for it: b spends a retry or two). Each side's polls of its send CQ take receive (busy_poll_taken) and run
// its timers; then it waits on memory, and the drain that completed its WRITE without the
// peer's answer in hands receive back (busy_poll_returned). Without that, a reply sat in the
// socket until the lease ran out (busy_poll_lease_ended, 0 here). The timers parked meanwhile
// ran from the polls (timers_on_poll: the peer-gone retries at the end, RETRY_EXC_ERR).
// With ACKs held for posts, the last one (b's last WRITE: a never posts again, and has
// stopped polling) goes when a's lease runs out.
TEST(BusyPollTest, WritePingPongHandsReceiveBackWhenTheLastWqeCompletes) {
  write_ping_pong(0, 50'000'000u);
}
TEST(BusyPollTest, WritePingPongWithHoldHandsReceiveBackWhenTheLastWqeCompletes) {
  write_ping_pong(0, 50'000'000u, 50'000);
}

// Hand-off scenes on one pair: a's polls of its empty receive CQ, then a WRITE from b into a's
// memory that a waits for without polling, for at most 2 s.
struct HandOffScene {
  Pair p;
  std::shared_ptr<Qp> qa, qb;
  alignas(8) uint32_t in = 0;
  uint32_t out = 0;
  std::shared_ptr<Mr> min, mout;
  // late_polls: EngineConfig::busy_poll_late_polls. 0 here (every late poll hands receive
  // back), so that the scenes of the gap's measurement see each late poll; the forgiveness
  // has tests of its own (LatePollTest).
  explicit HandOffScene(uint32_t busy_poll_ns, uint32_t gap_ns = 0, uint64_t ack_hold_ns = 0,
                        uint32_t late_polls = 0)
      : p([&] {
          EngineConfig ec;
          ec.busy_poll_ns = busy_poll_ns;
          if (gap_ns != 0) ec.busy_poll_gap_ns = gap_ns;
          ec.ack_hold_ns = ack_hold_ns;
          ec.busy_poll_late_polls = late_polls;
          return ec;
        }()) {
    if (!p.a.eng || !p.b.eng) return;
    std::tie(qa, qb) = ping_pong_qps(p.a, p.b);
    min = p.a.mr(&in, 4);
    mout = p.b.mr(&out, 4);
    rmr = p.a.mr(&rbuf, 4);
  }
  uint64_t ctr(Ctr c) const { return p.a.eng->counters().get(c); }
  // One more receive on a's queue (a post: Engine::on_app_post); the queue holds 256.
  bool repost() {
    return post_recv(qa, posted++, {sge(&rbuf, 4, rmr)}).is_ok();
  }
  uint32_t rbuf = 0;
  std::shared_ptr<Mr> rmr;
  uint64_t posted = 0;
  // Polls a's empty receive CQ back to back until the polls hold receive (1 s at most).
  bool take() {
    Cqe c;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (ctr(Ctr::kBusyPollTaken) == 0 && std::chrono::steady_clock::now() < end)
      p.a.rcq->poll(&c, 1);
    return ctr(Ctr::kBusyPollTaken) > 0;
  }
  // Posts b's WRITE of v (from `out`, set here) into a's `in`.
  Status b_post_write(uint32_t v) {
    out = v;
    Wr w = send_wr(WrOpcode::kRdmaWrite, v, {sge(&out, 4, mout)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(&in);
    w.rdma.rkey = min->rkey();
    return post(qb, w);
  }
  // Posts a's 4-byte WRITE (from its receive buffer) into b's `out`.
  Status a_post_write() {
    Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(&rbuf, 4, rmr)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(&out);
    w.rdma.rkey = mout->rkey();
    return post(qa, w);
  }
  // b's WRITE of v into a's memory, which a waits for (2 s at most), polling its empty
  // receive CQ if `polls` (else without a call); b's completion is not polled.
  bool b_writes(uint32_t v, bool polls = false) {
    if (!b_post_write(v).is_ok()) return false;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    Cqe c;
    while (peek_dma(&in) != v && std::chrono::steady_clock::now() < end) {
      if (polls)
        p.a.rcq->poll(&c, 1);
      else
        std::this_thread::yield();
    }
    return peek_dma(&in) == v;
  }
  // Holds a's QP's receive lock for `d` on a thread of its own (join it); returns once held.
  std::thread lock_a_recv_for(std::chrono::milliseconds d) {
    std::atomic<bool> locked{false};
    std::thread t([this, d, &locked] {
      std::lock_guard lk(qa->recv_mutex());
      locked.store(true);  // the last touch of `locked`
      std::this_thread::sleep_for(d);
    });
    while (!locked.load()) std::this_thread::yield();
    return t;
  }
  // b WRITEs `v` into a's memory; true once a sees it, polling nothing, within 2 s, and b's
  // WRITE completes.
  bool write_arrives(uint32_t v) {
    if (!b_writes(v)) return false;
    auto c = poll_n(*p.b.scq, 1);
    return c.size() == 1 && c[0].status == WcStatus::kSuccess;
  }
};

// The late-poll scenes (gap 50 ms): `late()` sleeps 150 ms and polls; `within()` polls again
// at once and reports whether it really came within the gap of late()'s start (a loaded CI
// machine can stall a thread for longer; the test then skips rather than read a second late
// poll as the feature's fault).
struct LateScene : HandOffScene {
  static constexpr auto kGap = std::chrono::milliseconds(50);
  explicit LateScene(uint32_t lease_ns) : HandOffScene(lease_ns, 50'000'000u, 0, 1) {}
  std::chrono::steady_clock::time_point last;
  Cqe c;
  int late() {
    std::this_thread::sleep_for(3 * kGap);
    last = std::chrono::steady_clock::now();
    return p.a.rcq->poll(&c, 1);
  }
  bool within() {
    p.a.rcq->poll(&c, 1);
    return std::chrono::steady_clock::now() - last < kGap;
  }
};

// One late empty poll (EngineConfig::busy_poll_late_polls = 1, the default) keeps the polls'
// receive: a poll 150 ms after the last call (gap 50 ms) hands nothing back, and the polls
// still hold receive (the next, within the gap, takes nothing). Mostly such a poll is the
// application thread preempted, not an application that polls slower than the gap.
TEST(LatePollTest, OneLatePollKeepsReceive) {
  LateScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  EXPECT_EQ(s.late(), 0);
  if (!s.within()) GTEST_SKIP() << "a stall between two polls meant to be back to back";
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLateForgiven), 1u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollTaken), 1u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// The second late poll in a lease hands receive back, even with a poll within the gap between
// the two (an application that polls two CQs back to back every few ms): it does not hold its
// peer's packets. The WRITE then lands through a's progress thread, long before the 4 s lease
// would run out.
TEST(LatePollTest, TheSecondLatePollInALeaseHandsReceiveBack) {
  LateScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  EXPECT_EQ(s.late(), 0);  // forgiven
  if (!s.within()) GTEST_SKIP() << "a stall between two polls meant to be back to back";
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
  EXPECT_EQ(s.late(), 0);  // late again, in the same lease
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 1u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLateForgiven), 1u);
  EXPECT_TRUE(s.write_arrives(5));
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// The count is per lease: once a lease's time (1 s) has passed since the first forgiven late
// poll, with the application polling back to back all along, the next late poll is forgiven
// again. (The lease, renewed at half time, has at least 500 ms left when the polls stop.)
TEST(LatePollTest, EachLeaseForgivesOneLatePoll) {
  LateScene s(1'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  EXPECT_EQ(s.late(), 0);  // forgiven
  const auto end = s.last + std::chrono::milliseconds(1050);
  int hits = 0;
  bool stalled = false;
  for (auto t = std::chrono::steady_clock::now(); t < end;) {
    hits += s.p.a.rcq->poll(&s.c, 1);
    const auto now = std::chrono::steady_clock::now();
    stalled = stalled || now - t >= LateScene::kGap;
    t = now;
  }
  if (stalled) GTEST_SKIP() << "a stall between two polls meant to be back to back";
  EXPECT_EQ(hits, 0);
  EXPECT_EQ(s.late(), 0);  // late, in a new lease: forgiven
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLateForgiven), 2u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// What the progress thread does when the polls' lease runs out (Engine::lease_holder_waits):
// it keeps the lease while an application thread is inside a call of ours, or while the
// thread whose call renewed it last is runnable and gains less than 2 gaps of CPU time
// between two looks; it takes receive when that thread sleeps, or ran, or the probation's
// bound passes. Lease 80 ms, gap 2 ms: a look every 8 ms (4 gaps), "ran" means 4 ms of CPU
// since the last look, and a probation lasts 320 ms (4 leases, 40 looks) at most.
struct LeaseScene : HandOffScene {
  LeaseScene() : HandOffScene(80'000'000u, 2'000'000u) {}
  // Waits (2 s at most) until `pred` holds.
  template <class F>
  static bool wait_for(F pred) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!pred() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return pred();
  }
};

// A holder that sleeps outside our calls loses the lease at the first look: it is not
// runnable (/proc/self/task/<tid>/stat), and the WRITE lands through the progress thread.
TEST(LeaseEndTest, ASleepingHolderLosesTheLeaseAtOnce) {
  LeaseScene s;
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the lease and a probation
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 1u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseKept), 0u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
  EXPECT_TRUE(s.write_arrives(31));
}

// A holder that runs without a call (it waits on memory, or computes) is runnable too: the
// first look keeps the lease, a later one sees it gained CPU time and ends it, long before
// the probation's bound (320 ms, 40 looks). Reading "runnable" as "preempted" kept it ~40
// looks. (A spinner that gets half a CPU or more in most 8 ms windows ends it at once; on a
// loaded machine it may take a few looks.)
TEST(LeaseEndTest, AHolderRunningWithoutACallLosesTheLease) {
  LeaseScene s;
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (s.ctr(Ctr::kBusyPollLeaseEnded) == 0 && std::chrono::steady_clock::now() < end) {
  }  // spins, calling nothing
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 1u);
  EXPECT_GE(s.ctr(Ctr::kBusyPollLeaseKept), 1u);
  EXPECT_LT(s.ctr(Ctr::kBusyPollLeaseKept), 30u);
  EXPECT_TRUE(s.write_arrives(33));
}

// A holder that is runnable but gets no CPU (preempted: here pinned to one CPU at nice 19
// beside a spinning thread at nice 0) keeps the lease look after look; once it runs without a
// call (the spinner gone), or the probation's bound passes, the lease ends. Before, the lease
// ran out under every such preemption: where every core is busy (ib_send_bw -q 4), the
// progress thread then took receive and a core from the applications.
TEST(LeaseEndTest, AHolderWaitingForACpuKeepsTheLease) {
  LeaseScene s;
  ASSERT_TRUE(s.qa && s.qb);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  std::atomic<bool> hog_go{true}, holder_go{true}, taken{false};
  std::atomic<int> hog_ready{0};
  std::thread hog([&] {
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    hog_ready.store(1);
    while (hog_go.load(std::memory_order_relaxed)) {
    }
  });
  while (hog_ready.load() == 0) std::this_thread::yield();
  std::thread holder([&] {
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    taken.store(s.take());
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    while (holder_go.load(std::memory_order_relaxed)) {  // spins, calling nothing
    }
  });
  const bool kept = LeaseScene::wait_for([&] {
    return s.ctr(Ctr::kBusyPollLeaseKept) >= 3 || s.ctr(Ctr::kBusyPollLeaseEnded) != 0;
  });
  const uint64_t ended_while_starved = s.ctr(Ctr::kBusyPollLeaseEnded);
  const uint64_t kept_n = s.ctr(Ctr::kBusyPollLeaseKept);
  hog_go.store(false);
  hog.join();
  // Alone on its CPU now, the holder runs without a call: the lease ends.
  const bool ended = LeaseScene::wait_for([&] { return s.ctr(Ctr::kBusyPollLeaseEnded) != 0; });
  holder_go.store(false);
  holder.join();
  ASSERT_TRUE(taken.load());
  EXPECT_TRUE(kept);
  EXPECT_EQ(ended_while_starved, 0u) << "the lease ended under a preempted holder";
  EXPECT_GE(kept_n, 3u);
  EXPECT_TRUE(ended);
  EXPECT_TRUE(s.write_arrives(32));
}

// A holder inside a call of ours (a post_send waiting 80 ms for its QP's send lock, asleep)
// keeps the lease past its end (40 ms; looked at again every 20 ms, for 160 ms from the
// post's start at most): the application is in its loop. Once the post is done and the
// thread that renewed the lease sleeps outside the library, the lease ends.
TEST(LeaseEndTest, AHolderInsideAPostKeepsTheLease) {
  HandOffScene s(40'000'000u, 30'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  std::unique_lock held(s.qa->send_mutex());
  bool posted = false;
  std::thread poster([&] { posted = s.a_post_write().is_ok(); });  // within the gap: stamped
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  const uint64_t ended_in_post = s.ctr(Ctr::kBusyPollLeaseEnded);
  const uint64_t kept_in_post = s.ctr(Ctr::kBusyPollLeaseKept);
  held.unlock();
  poster.join();
  EXPECT_TRUE(posted);
  EXPECT_EQ(ended_in_post, 0u) << "the lease ended under a post";
  EXPECT_GE(kept_in_post, 1u);
  EXPECT_TRUE(LeaseScene::wait_for([&] { return s.ctr(Ctr::kBusyPollLeaseEnded) == 1; }));
  auto done = poll_n(*s.p.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
}

// A thread that leaves the data path (req_notify, get_cq_event, rdma_cm: left_data_path)
// hands receive back at once: the WRITE lands although the polls' 4 s lease has not run out.
TEST(BusyPollTest, LeavingTheDataPathHandsReceiveBack) {
  HandOffScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  s.p.a.eng->left_data_path();
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 1u);
  EXPECT_TRUE(s.write_arrives(7));
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// The timers parked while the polls held receive are programmed when the thread leaves the
// data path: a WRITE to a peer that went away is retried (probes) by the progress thread
// after a's last poll, long before the 4 s lease would have run out.
TEST(BusyPollTest, LeavingTheDataPathProgramsTheParkedTimers) {
  HandOffScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  s.p.b.eng->stop();
  ASSERT_TRUE(s.take());
  // a's WRITE goes to b's address, which nobody serves any more (b's engine stopped).
  Wr wa = send_wr(WrOpcode::kRdmaWrite, 6, {sge(&s.in, 4, s.min)});
  wa.rdma.remote_addr = reinterpret_cast<uint64_t>(&s.out);
  wa.rdma.rkey = s.mout->rkey();
  ASSERT_TRUE(post(s.qa, wa).is_ok());
  // a's polls, back to back, until they hold receive (a sanitizer's slow poll may have
  // handed it back meanwhile: taken once more than given back).
  auto held = [&] {
    return s.ctr(Ctr::kBusyPollTaken) ==
           s.ctr(Ctr::kBusyPollReturned) + s.ctr(Ctr::kBusyPollLeaseEnded) + 1;
  };
  Cqe c;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  do {
    s.p.a.rcq->poll(&c, 1);
  } while (!held() && std::chrono::steady_clock::now() < until);
  ASSERT_TRUE(held());
  const uint64_t returned = s.ctr(Ctr::kBusyPollReturned);
  s.p.a.eng->left_data_path();
  ASSERT_EQ(s.ctr(Ctr::kBusyPollReturned), returned + 1);
  const uint64_t probes = s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts) == probes &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts), probes);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// A deadline the progress thread programmed before the polls took receive is disarmed when
// they take it (park_timerfd): they run it themselves, and its firing would have woken the
// progress thread on a core that a spinning thread wants. a's WRITE goes to b, which serves
// nobody, so its retransmit timer is programmed; once a's polls hold receive the timerfd is
// disarmed, and the polls still retry the WRITE (probes) long before the 4 s lease ends.
TEST(BusyPollTest, TakingReceiveDisarmsTheTimerfdAndThePollsRunTheTimers) {
  HandOffScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  s.p.b.eng->stop();
  Wr wa = send_wr(WrOpcode::kRdmaWrite, 6, {sge(&s.in, 4, s.min)});
  wa.rdma.remote_addr = reinterpret_cast<uint64_t>(&s.out);
  wa.rdma.rkey = s.mout->rkey();
  ASSERT_TRUE(post(s.qa, wa).is_ok());
  // The progress thread watches receive: the deadline is programmed (or, after a preemption
  // past it, fired and programmed again: looked for up to 1 s).
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!s.p.a.eng->timerfd_programmed() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  ASSERT_TRUE(s.p.a.eng->timerfd_programmed());
  const uint64_t probes = s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts);
  ASSERT_TRUE(s.take());
  EXPECT_FALSE(s.p.a.eng->timerfd_programmed());
  // The polls retry the WRITE (a hand-back by a sanitizer's slow poll programs nothing: no
  // ACK is held, and the progress thread sleeps until the lease's end).
  Cqe c;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts) == probes &&
         std::chrono::steady_clock::now() < end)
    s.p.a.rcq->poll(&c, 1);
  EXPECT_GT(s.ctr(Ctr::kRetransProbes) + s.ctr(Ctr::kRetransPkts), probes);
  EXPECT_GT(s.ctr(Ctr::kTimersOnPoll), 0u);
  EXPECT_FALSE(s.p.a.eng->timerfd_programmed());
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// Polls 2 ms apart are not a busy poll: receive stays with the progress thread (else the
// WRITE would wait in the socket for the 4 s lease).
TEST(BusyPollTest, SparsePollsLeaveReceiveWithTheProgressThread) {
  HandOffScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  Cqe c;
  for (int i = 0; i < 10; ++i) {
    s.p.a.rcq->poll(&c, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(s.ctr(Ctr::kBusyPollTaken), 0u);
  EXPECT_TRUE(s.write_arrives(9));
}

// Posts are the application in the library, not away (Engine::on_app_post): posts 2 ms apart
// for 100 ms, with no poll, keep the receive that a's polls took (gap 20 ms here), and the
// next empty poll, just after the last post, finds the gap measured from that post, not from
// the last poll: nothing is handed back. Before, ib_send_bw's posts between two empty polls
// handed receive back several hundred times a second.
TEST(BusyPollTest, PostsBetweenPollsKeepReceive) {
  HandOffScene s(4'000'000'000u, 20'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  const uint64_t returned = s.ctr(Ctr::kBusyPollReturned);
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(s.repost());
  }
  Cqe c;
  EXPECT_EQ(s.p.a.rcq->poll(&c, 1), 0);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), returned) << "the poll after the posts handed receive back";
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// Posts that come without an empty poll for longer than the gap receive themselves (as the
// poll would): b's WRITE lands while a only posts, every 1 ms, its polls holding receive on a
// 4 s lease with a 5 ms gap. Without it the WRITE would sit in the socket until the lease ran
// out (an application that posts often and polls rarely would hold the peer's ACKs).
TEST(BusyPollTest, PostsReceiveWhenThePollsStop) {
  HandOffScene s(4'000'000'000u, 5'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  const uint64_t on_post = s.ctr(Ctr::kRxOnPost);
  ASSERT_TRUE(s.b_post_write(13).is_ok());
  for (int i = 0; i < 200 && peek_dma(&s.in) != 13u; ++i) {
    ASSERT_TRUE(s.repost());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(peek_dma(&s.in), 13u);
  EXPECT_GT(s.ctr(Ctr::kRxOnPost), on_post);
  auto c = poll_n(*s.p.b.scq, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u);
}

// A post_recv's receive takes a few datagrams, not the backlog (kPostRecvRxBudget): 12
// WRITEs of b wait in a's socket while a's polls hold receive, and a repost a gap after the
// last receive takes 1 to 4 of them; the next empty poll takes the rest. With an empty poll's
// budget, ib_send_bw -q 4's receiver took 64 messages with each repost, fed its CQ faster
// than it reposted and ran its receive queues dry (RNR NAKs).
TEST(BusyPollTest, APostRecvReceivesOnlyAFewDatagrams) {
  HandOffScene s(4'000'000'000u, 5'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  constexpr uint32_t kWrites = 12;
  for (uint32_t v = 1; v <= kWrites; ++v) ASSERT_TRUE(s.b_post_write(100 + v).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the gap; all sent
  const uint64_t before = s.ctr(Ctr::kRcvdPkts);
  const uint64_t on_post = s.ctr(Ctr::kRxOnPost);
  ASSERT_TRUE(s.repost());
  ASSERT_EQ(s.ctr(Ctr::kRxOnPost), on_post + 1) << "the repost did not receive";
  const uint64_t took = s.ctr(Ctr::kRcvdPkts) - before;
  EXPECT_GE(took, 1u);
  EXPECT_LE(took, static_cast<uint64_t>(Engine::kPostRecvRxBudget));
  Cqe c;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (peek_dma(&s.in) != 100 + kWrites && std::chrono::steady_clock::now() < end)
    s.p.a.rcq->poll(&c, 1);
  EXPECT_EQ(peek_dma(&s.in), 100 + kWrites);
  EXPECT_GE(s.ctr(Ctr::kRcvdPkts) - before, kWrites);  // (and b's probes, unanswered 20 ms)
  EXPECT_EQ(poll_n(*s.p.b.scq, kWrites).size(), kWrites);
}

// Posts back to back (0.5 ms apart, within the 5 ms gap) renew the polls' lease (20 ms here)
// as polls would: 60 ms of them and it has not run out. Posts further apart (10 ms) do not:
// an application that posts now and then and waits on memory gets the progress thread back
// when the lease runs out, and the WRITE lands through it.
TEST(BusyPollTest, OnlyPostsBackToBackRenewTheLease) {
  HandOffScene s(20'000'000u, 5'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(60);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(s.repost());
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u) << "back-to-back posts let the lease run out";
  // (At most 120 + 100 receives: the queue holds 256.)
  for (int i = 0; i < 100 && s.ctr(Ctr::kBusyPollLeaseEnded) == 0; ++i) {
    ASSERT_TRUE(s.repost());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 1u);
  EXPECT_TRUE(s.write_arrives(15));  // received by the progress thread
}

// A post_send is the application in the library from its start (Engine::on_app_enter): one
// that waits 240 ms for its QP's send lock (as a post does behind a requester run an ACK
// released) is not a gap. Lease 400 ms, gap 200 ms: a's polls take receive and poll again
// 120 ms later; 120 ms after that a post begins (within the gap of that poll, the lease past
// half: it renews, to 640 ms) and waits past the lease's first end (400 ms). Measured from
// the post's end (360 ms after the last poll), nothing renewed the lease and it ran out
// under the post. (Wide margins: the sleeps overshoot on a loaded machine.)
TEST(BusyPollTest, APostWaitingForItsSendLockIsNotAGap) {
  HandOffScene s(400'000'000u, 200'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  Cqe c;
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_EQ(s.p.a.rcq->poll(&c, 1), 0);
  std::unique_lock held(s.qa->send_mutex());
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  bool posted = false;
  std::thread poster([&] { posted = s.a_post_write().is_ok(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(240));
  held.unlock();
  poster.join();
  EXPECT_TRUE(posted);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 0u) << "the lease ran out under the post";
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
  auto done = poll_n(*s.p.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
}

// An empty poll's receive is the application in the library until it ends (receive_for_app):
// a drain that waits 300 ms for a's QP's receive lock (gap 100 ms) is not a gap, and the next
// empty poll keeps receive. Measured from the first poll's start, it handed receive back.
TEST(BusyPollTest, AnEmptyPollsLongReceiveIsNotAGap) {
  HandOffScene s(4'000'000'000u, 100'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  const uint64_t returned = s.ctr(Ctr::kBusyPollReturned);
  std::thread holder = s.lock_a_recv_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(s.b_post_write(21).is_ok());
  // Polls back to back until one receives the WRITE (usually the first: on loopback the
  // datagram is in a's socket when b's post returns, unless the kernel deferred it); that one
  // waits for the lock.
  Cqe c;
  std::chrono::steady_clock::duration took{};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (peek_dma(&s.in) != 21u && std::chrono::steady_clock::now() < end) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(s.p.a.rcq->poll(&c, 1), 0);
    took = std::chrono::steady_clock::now() - t0;
  }
  EXPECT_EQ(s.p.a.rcq->poll(&c, 1), 0);
  holder.join();
  EXPECT_GE(took, std::chrono::milliseconds(200)) << "the poll's receive did not wait for the lock";
  EXPECT_EQ(peek_dma(&s.in), 21u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), returned) << "the next poll handed receive back";
  auto done = poll_n(*s.p.b.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
}

// A post_send's start is stamped only when it came within the gap (on_app_enter): post_sends
// 10 ms apart (gap 5 ms) do not renew the polls' lease (20 ms), as post_recvs do not
// (OnlyPostsBackToBackRenewTheLease). Stamped always, each post's end found its own start
// within the gap and renewed: an application posting every few ms and waiting on memory kept
// receive parked for good.
TEST(BusyPollTest, PostSendsFarApartLetTheLeaseRunOut) {
  HandOffScene s(20'000'000u, 5'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  for (int i = 0; i < 100 && s.ctr(Ctr::kBusyPollLeaseEnded) == 0; ++i) {
    ASSERT_TRUE(s.a_post_write().is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 1u) << "post_sends far apart kept the lease";
}

// A post never takes receive from the progress thread: only empty polls do.
TEST(BusyPollTest, PostsDoNotTakeReceive) {
  HandOffScene s(4'000'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(s.repost());
  EXPECT_EQ(s.ctr(Ctr::kBusyPollTaken), 0u);
  EXPECT_EQ(s.ctr(Ctr::kRxOnPost), 0u);
  EXPECT_TRUE(s.write_arrives(14));
}

// The progress thread holds an owed ACK for the application's next post while the
// application is in its loop (its last call within the gap), as the application's own polls
// do: a ping-pong that waits on memory and so began with the progress threads receiving gets
// onto the one-datagram footing (the answer carries the ACK) instead of staying on two.
// Scene: a's polls take receive and acknowledge b's first WRITE, which a answers at once
// (qa holds ACKs from then on); a's polls of its send CQ give receive back when a's WRITE
// completes, its QP idle (on_poll_hit); b's next WRITE is then taken by a's progress thread,
// a's last call 1 s ago at most (the gap here).
struct HoldScene : HandOffScene {
  HoldScene(uint32_t busy_poll_ns = 4'000'000'000u, uint32_t gap_ns = 1'000'000'000u,
            uint64_t ack_hold_ns = 2'000'000'000ull)
      : HandOffScene(busy_poll_ns, gap_ns, ack_hold_ns) {
    if (!qa) return;
    // No retransmit timer (timeout 0): b's probe of an unacknowledged WRITE would make a
    // answer the duplicate at once (MemNetwork loses nothing).
    qa = p.a.qp(QpType::kRc);
    qb = p.b.qp(QpType::kRc);
    ConnOpts o;
    o.timeout = 0;
    connect_pair(p.a, qa, p.b, qb, o);
  }
  alignas(8) uint32_t bin = 0;
  uint32_t aout = 0;
  std::shared_ptr<Mr> mbin, maout;
  // a's WRITE into b's memory, and a's polls of its send CQ until it completes.
  bool a_writes(uint32_t v) {
    if (!mbin) {
      mbin = p.b.mr(&bin, 4);
      maout = p.a.mr(&aout, 4);
    }
    aout = v;
    Wr w = send_wr(WrOpcode::kRdmaWrite, v, {sge(&aout, 4, maout)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(&bin);
    w.rdma.rkey = mbin->rkey();
    if (!post(qa, w).is_ok()) return false;
    auto c = poll_n(*p.a.scq, 1, 5000, {}, 256);
    return c.size() == 1 && c[0].status == WcStatus::kSuccess;
  }
  // Sets the scene up to b's second WRITE landing in a's memory (taken by a's progress
  // thread); `leave`: a leaves the data path before it. "" or the step that went wrong.
  std::string play(bool leave) {
    // a's polls take receive and acknowledge b's first WRITE; a answers it at once, so qa
    // holds ACKs from then on.
    if (!take()) return "a's polls did not take receive";
    if (!b_writes(1, true)) return "b's first WRITE did not land";
    if (poll_n(*p.b.scq, 1).size() != 1) return "b's first WRITE did not complete";
    p.b.eng->left_data_path();  // b's progress thread takes a's WRITEs (b's polls stopped)
    const uint64_t returned = ctr(Ctr::kBusyPollReturned);
    if (!a_writes(1)) return "a's answer did not complete";
    if (ctr(Ctr::kBusyPollReturned) != returned + 1) return "a's polls kept receive";
    if (leave) p.a.eng->left_data_path();
    const uint64_t drains = ctr(Ctr::kRxDrainProgress);
    if (!b_writes(2)) return "b's second WRITE did not land";
    // (counted at the drain's end, after the WRITE landed)
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (ctr(Ctr::kRxDrainProgress) == drains && std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
    if (ctr(Ctr::kRxDrainProgress) == drains) return "a's progress thread did not take it";
    return "";
  }
};

// An empty poll that gets no datagram is the application in the library until it ends too
// (receive_for_app): one that waits ~240 ms (gap 100 ms) to release an ACK held for a post
// (ack_hold 50 ms, past when the poll begins: the drain's end, or the timers the poll
// runs), its QP's receive lock held elsewhere, is not a gap, and the next empty poll keeps
// receive. Stamped only after a
// receive that got datagrams, the next poll was late and handed receive back (ib_send_bw
// -q 4's sender: ~60 times a second, after 370-800 us inside such a poll: a timer resending
// a window).
TEST(BusyPollTest, AnEmptyPollThatWaitsWithoutDatagramsIsNotAGap) {
  HoldScene s(4'000'000'000u, 100'000'000u, 50'000'000ull);
  ASSERT_TRUE(s.qa && s.qb);
  // b writes, a answers (its polls then hand receive back: the QP went idle) and takes it
  // again: a ping-pong, so a's QP holds the ACK of b's next WRITE for a post.
  ASSERT_TRUE(s.take());
  ASSERT_TRUE(s.b_writes(1, true));
  ASSERT_EQ(poll_n(*s.p.b.scq, 1).size(), 1u);
  ASSERT_TRUE(s.a_writes(1));
  const uint64_t taken = s.ctr(Ctr::kBusyPollTaken);
  Cqe c;
  for (int i = 0; i < 100000 && s.ctr(Ctr::kBusyPollTaken) == taken; ++i) s.p.a.rcq->poll(&c, 1);
  ASSERT_GT(s.ctr(Ctr::kBusyPollTaken), taken);
  ASSERT_TRUE(s.b_writes(2, true));  // a's poll receives it; its ACK is held
  const uint64_t returned = s.ctr(Ctr::kBusyPollReturned);
  const uint64_t timers = s.ctr(Ctr::kTimersOnPoll);
  std::thread holder = s.lock_a_recv_for(std::chrono::milliseconds(300));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the hold's deadline passes
  std::chrono::steady_clock::duration longest{};
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  while (std::chrono::steady_clock::now() < end) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(s.p.a.rcq->poll(&c, 1), 0);
    longest = std::max(longest, std::chrono::steady_clock::now() - t0);
  }
  holder.join();
  EXPECT_GT(s.ctr(Ctr::kTimersOnPoll), timers);
  EXPECT_GE(longest, std::chrono::milliseconds(150)) << "no timer run waited for the lock";
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), returned) << "the next poll handed receive back";
  auto done = poll_n(*s.p.b.scq, 1);  // the held ACK went
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::kSuccess);
}

TEST(BusyPollTest, TheProgressThreadHoldsTheAckWhileTheApplicationIsIn) {
  HoldScene s;
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_EQ(s.play(false), "");
  // The ACK of b's WRITE waits for a's answer (the hold is 2 s): no completion at b.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Cqe c;
  EXPECT_EQ(s.p.b.scq->poll(&c, 1), 0) << "the ACK went before a's answer";
  const uint64_t rode = s.p.a.eng->counters().get(Ctr::kAckOnPost);
  ASSERT_TRUE(s.a_writes(2));
  EXPECT_EQ(s.p.a.eng->counters().get(Ctr::kAckOnPost), rode + 1) << "the answer carried it";
  auto cb = poll_n(*s.p.b.scq, 1);
  ASSERT_EQ(cb.size(), 1u);
  EXPECT_EQ(cb[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s.ctr(Ctr::kAckHoldExpired), 0u);
}

// ... but not once the application has left the data path (req_notify_cq, get_cq_event,
// rdma_cm): it is not about to post, and b's WRITE completes at once.
TEST(BusyPollTest, TheProgressThreadSendsTheAckOnceTheApplicationLeft) {
  HoldScene s;
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_EQ(s.play(true), "");
  auto cb = poll_n(*s.p.b.scq, 1, 1000);
  ASSERT_EQ(cb.size(), 1u) << "the ACK was held after a left";
  EXPECT_EQ(cb[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s.ctr(Ctr::kAckHoldExpired), 0u);
}

// Polls that stop without a word (the application computes, or waits on memory with nothing
// of its own outstanding): the progress thread takes receive back when their lease (20 ms)
// runs out, and the WRITE lands.
TEST(BusyPollTest, TheProgressThreadTakesReceiveBackWhenTheLeaseRunsOut) {
  HandOffScene s(20'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  EXPECT_TRUE(s.write_arrives(11));
  EXPECT_EQ(s.ctr(Ctr::kBusyPollLeaseEnded), 1u);
  EXPECT_EQ(s.ctr(Ctr::kBusyPollReturned), 0u);
}
// A completion that leaves the QP idle hands receive back only when the peer's application
// may answer it: a WRITE's or an ATOMIC_WRITE's, not a READ's (nothing on the peer sees a READ; the
// application posts or polls again, and a hand-back before each READ cost ib_read_lat's
// client two epoll_ctl a round trip). a polls its send CQ for each of kN READs, then for each
// of kN WRITEs; the polls keep receive through the READs and give it back after each WRITE.
// The gap allowed between polls is 20 ms here (busy_poll_gap_ns): a poll slower than the
// default 50 us (a sanitizer, a loaded machine, poll_n's yield) would hand receive back too.
// Counted loosely all the same: a WRITE whose ACK the progress thread took (the thread was
// preempted between post and poll) finds receive already back and counts nothing.
TEST(BusyPollTest, ReadCompletionsKeepReceiveWriteCompletionsHandItBack) {
  HandOffScene s(4'000'000'000u, 20'000'000u);
  ASSERT_TRUE(s.qa && s.qb);
  ASSERT_TRUE(s.take());
  constexpr int kN = 200;
  auto run = [&](WrOpcode op) {
    for (int i = 0; i < kN; ++i) {
      Wr w = send_wr(op, static_cast<uint64_t>(i), {sge(&s.in, 4, s.min)});
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(&s.out);
      w.rdma.rkey = s.mout->rkey();
      if (!post(s.qa, w).is_ok()) return false;
      auto c = poll_n(*s.p.a.scq, 1);
      if (c.size() != 1 || c[0].status != WcStatus::kSuccess) return false;
    }
    return true;
  };
  const uint64_t r0 = s.ctr(Ctr::kBusyPollReturned);
  s.out = 0x5eed;
  ASSERT_TRUE(run(WrOpcode::kRdmaRead));
  EXPECT_EQ(peek_dma(&s.in), 0x5eedu);
  const uint64_t after_reads = s.ctr(Ctr::kBusyPollReturned) - r0;
  ASSERT_TRUE(run(WrOpcode::kRdmaWrite));
  const uint64_t after_writes = s.ctr(Ctr::kBusyPollReturned) - r0 - after_reads;
  EXPECT_LT(after_reads, static_cast<uint64_t>(kN / 10))
      << "READ completions handed receive back (" << after_reads << "; WRITEs " << after_writes
      << ")";
  EXPECT_GE(after_writes, static_cast<uint64_t>(kN / 4))
      << "WRITE completions kept receive (" << after_writes << ")";
  // ATOMIC_WRITE is answered with an empty READ response, yet the peer's application sees it
  // (a flag written in its memory): it hands receive back like a WRITE.
  alignas(8) uint64_t flag_src = 0, flag_dst = 0;
  auto msrc = s.p.a.mr(&flag_src, 8);
  auto mdst = s.p.b.mr(&flag_dst, 8);
  const uint64_t r1 = s.ctr(Ctr::kBusyPollReturned);
  for (int i = 1; i <= kN; ++i) {
    flag_src = static_cast<uint64_t>(i);
    Wr w = send_wr(WrOpcode::kAtomicWrite, static_cast<uint64_t>(i), {sge(&flag_src, 8, msrc)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(&flag_dst);
    w.rdma.rkey = mdst->rkey();
    ASSERT_TRUE(post(s.qa, w).is_ok());
    auto c = poll_n(*s.p.a.scq, 1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, WcStatus::kSuccess);
  }
  EXPECT_EQ(peek_dma(&flag_dst), static_cast<uint64_t>(kN));
  const uint64_t after_atomic_writes = s.ctr(Ctr::kBusyPollReturned) - r1;
  EXPECT_GE(after_atomic_writes, static_cast<uint64_t>(kN / 4))
      << "ATOMIC_WRITE completions kept receive (" << after_atomic_writes << ")";
}

// A duplicate of the peer's last request (its probe) in the drain that completes this side's
// last WQE is not the answer: the poll that returns the completion still hands receive back.
// Taking any request packet for the answer dropped the hand-back, and an application waiting
// on memory for the real answer waited for the polls' lease (ib_write_lat's rare ~2 ms
// iterations). A raw peer on a MemNetwork sends the ACK and the duplicate together, so one
// drain of the application's poll handles both.
TEST(BusyPollTest, ADuplicateRequestIsNotTheAnswer) {
  wire::MemNetwork net;
  EngineConfig ec;
  ec.busy_poll_ns = 4'000'000'000u;
  ec.busy_poll_gap_ns = 20'000'000u;
  Node s = Node::on_mem(net, "127.0.0.3", true, ErrorsMode::kSpec, 0, ec);
  Peer peer{net, "127.0.0.2", "127.0.0.3"};
  constexpr uint32_t kPeerQpn = 0x456;
  auto qp = s.qp(QpType::kRc);
  ConnOpts o;
  o.sq_psn = 500;
  o.rq_psn = 1;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  std::vector<uint8_t> rbuf(64), wbuf(8, 7), pay(8, 9);
  auto mr = s.mr(rbuf.data(), rbuf.size());
  auto mw = s.mr(wbuf.data(), wbuf.size());
  ASSERT_TRUE(post_recv(qp, 1, {sge(rbuf.data(), 64, mr)}).is_ok());
  ASSERT_TRUE(post_recv(qp, 2, {sge(rbuf.data(), 64, mr)}).is_ok());
  // The peer's SEND (PSN 1) arrives and is executed.
  wire::PacketFields send;
  send.opcode = wire::op::kRcSendOnly;
  send.dest_qp = qp->qpn();
  send.psn = 1;
  send.ack_req = true;
  peer.send(send, pay);
  ASSERT_EQ(poll_n(*s.rcq, 1).size(), 1u);
  // This side WRITEs (PSN 500) and polls its send CQ until the polls hold receive.
  Wr w = send_wr(WrOpcode::kRdmaWrite, 3, {sge(wbuf.data(), 8, mw)});
  w.rdma.remote_addr = 0x10000;
  w.rdma.rkey = 0x777;
  ASSERT_TRUE(post(qp, w).is_ok());
  auto ctr = [&](Ctr c) { return s.eng->counters().get(c); };
  Cqe c;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (ctr(Ctr::kBusyPollTaken) == 0 && std::chrono::steady_clock::now() < end)
    ASSERT_EQ(s.scq->poll(&c, 1), 0);
  ASSERT_GT(ctr(Ctr::kBusyPollTaken), 0u);
  const uint64_t returned = ctr(Ctr::kBusyPollReturned);
  const uint64_t dups = ctr(Ctr::kDuplicateRequest);
  // The ACK of the WRITE, then a duplicate of the SEND (PSN 1 again).
  wire::PacketFields ack;
  ack.opcode = wire::op::kRcAcknowledge;
  ack.dest_qp = qp->qpn();
  ack.psn = 500;
  ack.msn = 1;
  ack.syndrome = wire::aeth::ack(wire::aeth::kCreditInvalid);
  peer.send(ack);
  peer.send(send, pay);
  auto sc = poll_n(*s.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), dups + 1);  // the duplicate was in that drain
  EXPECT_EQ(ctr(Ctr::kBusyPollReturned), returned + 1)
      << "the duplicate request cancelled the hand-back";
  EXPECT_EQ(poll_n(*s.rcq, 1, 50).size(), 0u);  // and was not delivered again
}

// ACKs ride posts and a poll_cq that gets a ping-pong's ACK lingers for the answer behind it
// (ack_hold_ns, linger_ns): with both progress threads, every byte still arrives in order. A
// safety test only (how often a linger happens here depends on the scheduler): the linger's
// own checks are proto_resp_test's LingerTest.*.
TEST(AckHoldTest, WritePingPongWaitingOnMemoryWithHoldAndLinger) { write_ping_pong(0, 0, 50'000); }

// ACKs ride posts (EngineConfig::ack_hold_ns, SOFTRNIC_ACK_HOLD_US) in a SEND ping-pong over
// real UDP with both progress threads running, each side polling its receive CQ (as
// ib_send_lat). Every message's bytes arrive, every SEND completes in order, the posts carried
// ACKs (ack_on_post), and the last message's ACK, which no post takes, still comes (the
// hold's deadline). Not asserted: that a reply's receive CQE never precedes the send CQE of
// the message it answers. A post sends a held ACK first, but the ACK of a receive batch
// still in progress (the progress thread's, which never holds) can be overtaken by the
// reply, as without holding (seen once in ~500 here, with and without it).
TEST(AckHoldTest, SendPingPongAcksRidePosts) {
  EngineConfig ec;
  // A hold is learned only when the application answers within ack_hold_ns of an ACK
  // (resp_take_ack). Under TSan a turn takes longer than 50 us, and c523f32's CI saw ~1,600
  // drains by polls with no hold ever learned; a sanitizer build gets a 2 ms hold.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  ec.ack_hold_ns = 2'000'000;
#else
  ec.ack_hold_ns = 50'000;
#endif
  Pair p(ec);
  Node& a = p.a;
  Node& b = p.b;
  ASSERT_TRUE(a.eng && b.eng);
  auto [qa, qb] = ping_pong_qps(a, b);
  constexpr int kN = 500;
  constexpr uint32_t kLen = 64;
  constexpr int kSlots = 8;
  struct Side {
    std::vector<uint8_t> rx = std::vector<uint8_t>(kSlots * kLen), tx = std::vector<uint8_t>(kLen);
    std::shared_ptr<Mr> mrx, mtx;
  } sa, sb;
  for (auto [n, sd] : {std::pair{&a, &sa}, std::pair{&b, &sb}}) {
    sd->mrx = n->mr(sd->rx.data(), sd->rx.size());
    sd->mtx = n->mr(sd->tx.data(), sd->tx.size());
  }
  for (int i = 0; i < kSlots; ++i) {
    ASSERT_TRUE(post_recv(qa, i, {sge(sa.rx.data() + i * kLen, kLen, sa.mrx)}).is_ok());
    ASSERT_TRUE(post_recv(qb, i, {sge(sb.rx.data() + i * kLen, kLen, sb.mrx)}).is_ok());
  }
  auto fill = [](std::vector<uint8_t>& v, uint32_t tag) {
    for (uint32_t k = 0; k < kLen; ++k) v[k] = static_cast<uint8_t>(tag * 7 + k);
  };
  auto send = [&](std::shared_ptr<Qp>& q, Side& sd, uint32_t tag) {
    fill(sd.tx, tag);
    return post(q, send_wr(WrOpcode::kSend, tag, {sge(sd.tx.data(), kLen, sd.mtx)})).is_ok();
  };
  // One message in: its bytes, then the receive posted again. "" if all is well.
  auto take = [&](Node& n, std::shared_ptr<Qp>& q, Side& sd, uint32_t tag) -> std::string {
    auto c = poll_n(*n.rcq, 1);
    if (c.size() != 1 || c[0].status != WcStatus::kSuccess || c[0].byte_len != kLen)
      return "no good receive completion for " + std::to_string(tag);
    const uint8_t* got = sd.rx.data() + c[0].wr_id * kLen;
    std::vector<uint8_t> want(kLen);
    fill(want, tag);
    if (std::memcmp(got, want.data(), kLen) != 0) return "wrong bytes in " + std::to_string(tag);
    if (!post_recv(q, c[0].wr_id, {sge(sd.rx.data() + c[0].wr_id * kLen, kLen, sd.mrx)}).is_ok())
      return "post_recv";
    return "";
  };
  std::string b_err;
  std::vector<Cqe> b_sent;  // b's send completions
  std::thread tb([&] {
    for (uint32_t i = 1; i <= kN && b_err.empty(); ++i) {
      b_err = take(b, qb, sb, i);
      if (b_err.empty() && !send(qb, sb, 0x10000 + i)) b_err = "post_send";
      for (const Cqe& c : drain_cq(*b.scq)) b_sent.push_back(c);
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() { if (t.joinable()) t.join(); }
  } joiner{tb};
  for (uint32_t i = 1; i <= kN; ++i) {
    ASSERT_TRUE(send(qa, sa, i));
    ASSERT_EQ(take(a, qa, sa, 0x10000 + i), "");
    auto sc = poll_n(*a.scq, 1);
    ASSERT_EQ(sc.size(), 1u) << i;
    EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
    EXPECT_EQ(sc[0].wr_id, i);
  }
  tb.join();
  EXPECT_EQ(b_err, "");
  // b's last reply is answered by nobody: its ACK (owed by a) goes at the hold's deadline.
  for (const Cqe& c : poll_n(*b.scq, kN - b_sent.size(), 10000)) b_sent.push_back(c);
  ASSERT_EQ(b_sent.size(), static_cast<size_t>(kN));
  for (uint32_t i = 0; i < kN; ++i) {
    EXPECT_EQ(b_sent[i].status, WcStatus::kSuccess) << i;
    EXPECT_EQ(b_sent[i].wr_id, 0x10001u + i);
  }
  const uint64_t rode = a.eng->counters().get(Ctr::kAckOnPost) + b.eng->counters().get(Ctr::kAckOnPost);
  auto both = [&](Ctr c) {
    return std::to_string(a.eng->counters().get(c)) + "/" + std::to_string(b.eng->counters().get(c));
  };
  const std::string seen = "(a/b: drains by poll " + both(Ctr::kRxDrainPoll) +
                           ", by the progress thread " + both(Ctr::kRxDrainProgress) +
                           ", lingers " + both(Ctr::kLingerHit) + " hit " +
                           both(Ctr::kLingerExpired) + " expired, holds expired " +
                           both(Ctr::kAckHoldExpired) + ")";
  // Only a receive run by an application thread holds an ACK. Under TSan on a loaded CI
  // machine the progress threads sometimes take nearly every message (2c8fabc's CI: 0-11 of
  // ~1,000 drains by polls, no ACK rode a post), and then there is nothing to check here;
  // holding itself is checked deterministically in proto_resp_test's AckHoldTest.*.
  const uint64_t by_poll =
      a.eng->counters().get(Ctr::kRxDrainPoll) + b.eng->counters().get(Ctr::kRxDrainPoll);
  if (by_poll >= 100) {
    EXPECT_GT(rode, 0u) << "no ACK rode a post " << seen;
  } else {
    std::fprintf(stderr, "note: ACK riding not checked: the polls received too little %s\n",
                 seen.c_str());
  }
}

// A receiver whose port has a filter (capture / fault mode) gets GRO buffers split into
// segments without their index: GSO runs from a filter-free sender must still pass ICRC.
struct PassFilter : wire::PacketFilter {
  std::atomic<uint64_t> seen{0};
  wire::Verdict on_packet(wire::Direction, const wire::Endpoint&, const wire::Endpoint&,
                          std::span<uint8_t>, wire::FilterOut&) override {
    seen.fetch_add(1, std::memory_order_relaxed);
    return wire::Verdict::kPass;
  }
};

TEST(GsoTest, GsoSenderToFilteredReceiver) {
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  PassFilter f;
  if (!wire::kFaultInjection) {
    EXPECT_FALSE(p.b.eng->port().set_filter(&f));  // the port refuses the hook
    GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  }
  ASSERT_TRUE(p.b.eng->port().set_filter(&f));
  auto qa = p.a.qp(QpType::kRc);
  auto qb = p.b.qp(QpType::kRc);
  ConnOpts o;
  o.mtu = Mtu::k4096;
  connect_pair(p.a, qa, p.b, qb, o);
  constexpr uint32_t kLen = 1u << 20;
  std::vector<uint8_t> src(kLen), dst(kLen);
  for (uint32_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>(i * 31 + (i >> 12));
  auto ms = p.a.mr(src.data(), kLen);
  auto md = p.b.mr(dst.data(), kLen);
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(src.data(), kLen, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w.rdma.rkey = md->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  auto c = poll_n(*p.a.scq, 1, 20000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), kLen));
  EXPECT_EQ(p.b.eng->counters().get(Ctr::kIcrcErr), 0u);
  EXPECT_GE(f.seen.load(), 256u);
  p.b.eng->port().set_filter(nullptr);
}


// SEND_WITH_INV over real UDP: b binds a type-2 MW on its QP, a invalidates it with the
// SEND; the receive completion reports it and a later WRITE through the MW is refused.
TEST(InvalidateTest, SendWithInvalidateThenWriteRefused) {
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  auto qa = p.a.qp(QpType::kRc);
  auto qb = p.b.qp(QpType::kRc);
  connect_pair(p.a, qa, p.b, qb);
  GuardedBuf win(4096), rbuf(256), src(256);
  src.pattern(3);
  auto mwin = p.b.mr(win.data(), win.n, kAccessLocalWrite | kAccessRemoteWrite | kAccessMwBind);
  auto mrb = p.b.mr(rbuf.data(), rbuf.n);
  auto ms = p.a.mr(src.data(), src.n);
  auto mw = *p.b.dev->alloc_mw(p.b.pd, MwType::kType2);
  Wr b = send_wr(WrOpcode::kBindMw, 1, {});
  b.bind_mw.mw_rkey = mw->rkey();
  b.bind_mw.new_rkey = (mw->rkey() & ~0xffu) | 0x5a;
  b.bind_mw.mr_lkey = mwin->lkey();
  b.bind_mw.addr = reinterpret_cast<uint64_t>(win.data());
  b.bind_mw.length = 1024;
  b.bind_mw.access = kAccessRemoteWrite;
  ASSERT_TRUE(post(qb, b).is_ok());
  auto bc = poll_n(*p.b.scq, 1, 5000);
  ASSERT_EQ(bc.size(), 1u);
  ASSERT_EQ(bc[0].status, WcStatus::kSuccess);
  const uint32_t rk = b.bind_mw.new_rkey;
  // A WRITE through the window works.
  Wr w = send_wr(WrOpcode::kRdmaWrite, 2, {sge(src.data(), 64, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(win.data());
  w.rdma.rkey = rk;
  ASSERT_TRUE(post(qa, w).is_ok());
  auto c = poll_n(*p.a.scq, 1, 5000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(win.data(), src.data(), 64));
  // SEND_WITH_INV invalidates it.
  ASSERT_TRUE(post_recv(qb, 9, {sge(rbuf.data(), 256, mrb)}).is_ok());
  Wr si = send_wr(WrOpcode::kSendWithInv, 3, {sge(src.data(), 100, ms)});
  si.invalidate_rkey = rk;
  ASSERT_TRUE(post(qa, si).is_ok());
  auto rc = poll_n(*p.b.rcq, 1, 5000);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(rc[0].wc_flags & kWcWithInv);
  EXPECT_EQ(rc[0].imm_data, rk);
  EXPECT_EQ(rc[0].byte_len, 100u);
  EXPECT_EQ(poll_n(*p.a.scq, 1, 5000).size(), 1u);
  std::vector<uint8_t> before(win.mem);
  Wr w2 = send_wr(WrOpcode::kRdmaWrite, 4, {sge(src.data() + 64, 64, ms)});
  w2.rdma.remote_addr = reinterpret_cast<uint64_t>(win.data());
  w2.rdma.rkey = rk;
  ASSERT_TRUE(post(qa, w2).is_ok());
  c = poll_n(*p.a.scq, 1, 5000);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(before, win.mem);
}

}  // namespace
}  // namespace rnic::emu::test
