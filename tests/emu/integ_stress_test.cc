// tests/emu/integ_stress_test.cc: 4 application threads x 4 RC QP pairs each between two
// devices over real loopback UDP, mixed WRITE / READ / SEND / FAA / CAS, with 1% drop, 1%
// duplicate and ~1% reordering (delay) injected on every transmitted packet. Ends with every
// WR completed exactly once with success, memory byte-exact, and each FAA counter equal to
// the number of FAAs with every fetched value seen exactly once (atomics exactly-once).
// Also runs under TSan (meson -Db_sanitize=thread): iteration counts shrink there.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>

#include "tests/emu/proto_util.h"
#include "wire/port.h"

#if defined(__SANITIZE_THREAD__)
constexpr int kIters = 60;
#else
constexpr int kIters = 400;
#endif

namespace rnic::emu::test {
namespace {

// Drops / duplicates / delays transmitted packets with fixed probabilities (seeded).
struct ChaosFilter : wire::PacketFilter {
  explicit ChaosFilter(uint64_t seed) : seed_(seed) {}
  double drop = 0.01, dup = 0.01, delay = 0.01;
  std::atomic<uint64_t> seq{0}, dropped{0}, duplicated{0}, delayed{0};
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint&, const wire::Endpoint&,
                          std::span<uint8_t>, wire::FilterOut& out) override {
    if (dir != wire::Direction::kTx) return wire::Verdict::kPass;
    uint64_t x = seed_ + 0x9e3779b97f4a7c15ull * (seq.fetch_add(1, std::memory_order_relaxed) + 1);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    double r = static_cast<double>(x >> 11) * 0x1.0p-53;
    if (r < drop) {
      dropped.fetch_add(1, std::memory_order_relaxed);
      return wire::Verdict::kDrop;
    }
    if (r < drop + dup) {
      duplicated.fetch_add(1, std::memory_order_relaxed);
      out.copies = 1;
      return wire::Verdict::kDuplicate;
    }
    if (r < drop + dup + delay) {
      delayed.fetch_add(1, std::memory_order_relaxed);
      out.delay_us = static_cast<uint32_t>(20 + (x & 127));
      return wire::Verdict::kDelay;
    }
    return wire::Verdict::kPass;
  }

 private:
  uint64_t seed_;
};

constexpr int kThreads = 4;
constexpr int kPairsPerThread = 4;
constexpr uint32_t kRegion = 32 * 1024;

struct PairState {
  std::shared_ptr<Qp> qa, qb;
  std::vector<uint8_t> remote, local, back, recvbuf, expect;
  std::shared_ptr<Mr> m_remote, m_local, m_back, m_recv;
  alignas(8) uint64_t counter = 0;  // remote FAA word
  alignas(8) uint64_t cas_word = 0; // remote CAS word
  std::shared_ptr<Mr> m_words;
  alignas(8) uint64_t fetched[4] = {};
  std::shared_ptr<Mr> m_fetched;
  uint64_t faas = 0;
  std::set<uint64_t> faa_values;
};

TEST(StressTest, FourThreadsMixedOpsUnderDropDupReorder) {
  // The drops, duplicates and reorders come from port filters (the packet hook).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  Node a = Node::on_udp_first_free({"127.0.0.2", "127.0.0.42", "127.0.0.52"});
  Node b = Node::on_udp_first_free({"127.0.0.3", "127.0.0.43", "127.0.0.53"});
  ASSERT_TRUE(a.eng && b.eng);
  ChaosFilter fa(11), fb(22);
  a.eng->port().set_filter(&fa);
  b.eng->port().set_filter(&fb);

  std::atomic<int> failures{0};
  std::atomic<uint64_t> total_wrs{0};
  auto worker = [&](int t) {
    // Per-thread CQs so each thread polls only its own completions.
    auto acq = *a.dev->create_cq(1024, nullptr, 0);
    auto bcq = *b.dev->create_cq(1024, nullptr, 0);
    std::vector<PairState> pairs(kPairsPerThread);
    ConnOpts o;
    // ~16.8 ms: recovery from a drop stays quick, and retry_cnt 7 (seven retries, IBA) is not
    // used up by a progress thread that a sanitizer and a loaded machine stall for a few ms.
    o.timeout = 12;
    o.retry_cnt = 7;
    o.rnr_retry = 7;
    o.sq_psn = 0xFFFF00 + static_cast<uint32_t>(t);  // cross the 24-bit wrap early
    o.rq_psn = 0x000100 + static_cast<uint32_t>(t);
    for (auto& p : pairs) {
      QpInitAttr ia;
      ia.send_cq = acq;
      ia.recv_cq = acq;
      ia.qp_type = QpType::kRc;
      ia.cap = {64, 64, 4, 4, 64};
      p.qa = *a.dev->create_qp(a.pd, ia);
      ia.send_cq = bcq;
      ia.recv_cq = bcq;
      p.qb = *b.dev->create_qp(b.pd, ia);
      connect_pair(a, p.qa, b, p.qb, o);
      p.remote.assign(kRegion, 0);
      p.local.assign(kRegion, 0);
      p.back.assign(kRegion, 0);
      p.recvbuf.assign(kRegion, 0);
      p.m_remote = b.mr(p.remote.data(), kRegion);
      p.m_local = a.mr(p.local.data(), kRegion);
      p.m_back = a.mr(p.back.data(), kRegion);
      p.m_recv = b.mr(p.recvbuf.data(), kRegion);
      p.m_words = b.mr(&p.counter, 16);
      p.m_fetched = a.mr(p.fetched, sizeof(p.fetched));
    }
    std::mt19937_64 rng(1000 + t);
    std::unordered_set<uint64_t> outstanding;
    uint64_t next_id = (uint64_t(t) << 40) + 1;
    Cqe buf[32];
    auto wait_all = [&](Cq& cq, size_t n_expected) {
      size_t got = 0;
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (got < n_expected && std::chrono::steady_clock::now() < end) {
        int k = cq.poll(buf, 32);
        for (int i = 0; i < k; ++i) {
          if (buf[i].status != WcStatus::kSuccess) {
            ADD_FAILURE() << "thread " << t << " wr " << buf[i].wr_id << " status "
                          << wc_status_name(buf[i].status);
            failures++;
          }
          if (outstanding.erase(buf[i].wr_id) != 1) {
            ADD_FAILURE() << "completion for unknown or already completed wr " << buf[i].wr_id;
            failures++;
          }
        }
        got += static_cast<size_t>(k);
        if (k == 0) std::this_thread::yield();
      }
      if (got != n_expected) {
        ADD_FAILURE() << "thread " << t << " timed out: " << got << "/" << n_expected;
        failures++;
      }
    };
    for (int it = 0; it < kIters && failures == 0; ++it) {
      PairState& p = pairs[rng() % kPairsPerThread];
      uint32_t len = static_cast<uint32_t>(rng() % kRegion);
      if (rng() % 4 == 0) len = static_cast<uint32_t>(rng() % 64);
      uint8_t seed = static_cast<uint8_t>(rng());
      for (uint32_t i = 0; i < len; ++i) p.local[i] = static_cast<uint8_t>(seed + i * 13);
      // One batch: WRITE, READ back, SEND (with a receive on b), FAA, CAS.
      ASSERT_TRUE(post_recv(p.qb, next_id, {sge(p.recvbuf.data(), kRegion, p.m_recv)}).is_ok());
      uint64_t recv_id = next_id++;
      outstanding.insert(recv_id);
      Wr w = send_wr(WrOpcode::kRdmaWrite, next_id, {sge(p.local.data(), len, p.m_local)});
      w.rdma.remote_addr = reinterpret_cast<uint64_t>(p.remote.data());
      w.rdma.rkey = p.m_remote->rkey();
      outstanding.insert(next_id++);
      Wr r = send_wr(WrOpcode::kRdmaRead, next_id, {sge(p.back.data(), len, p.m_back)});
      r.rdma.remote_addr = reinterpret_cast<uint64_t>(p.remote.data());
      r.rdma.rkey = p.m_remote->rkey();
      outstanding.insert(next_id++);
      uint32_t slen = len / 3;
      Wr s = send_wr(WrOpcode::kSend, next_id, {sge(p.local.data(), slen, p.m_local)});
      outstanding.insert(next_id++);
      Wr f = send_wr(WrOpcode::kAtomicFetchAndAdd, next_id, {sge(&p.fetched[0], 8, p.m_fetched)});
      f.atomic.remote_addr = reinterpret_cast<uint64_t>(&p.counter);
      f.atomic.rkey = p.m_words->rkey();
      f.atomic.compare_add = 1;
      outstanding.insert(next_id++);
      Wr c = send_wr(WrOpcode::kAtomicCmpAndSwp, next_id, {sge(&p.fetched[1], 8, p.m_fetched)});
      c.atomic.remote_addr = reinterpret_cast<uint64_t>(&p.cas_word);
      c.atomic.rkey = p.m_words->rkey();
      c.atomic.compare_add = static_cast<uint64_t>(it);  // matches only if it was set to it
      c.atomic.swap = static_cast<uint64_t>(it) + 1;
      outstanding.insert(next_id++);
      for (Wr* x : {&w, &r, &s, &f, &c}) ASSERT_TRUE(post(p.qa, *x).is_ok());
      // 5 send completions on a's CQ, 1 receive on b's.
      wait_all(*acq, 5);
      wait_all(*bcq, 1);
      total_wrs += 6;
      if (std::memcmp(p.back.data(), p.local.data(), len) != 0 ||
          std::memcmp(p.remote.data(), p.local.data(), len) != 0 ||
          std::memcmp(p.recvbuf.data(), p.local.data(), slen) != 0) {
        ADD_FAILURE() << "thread " << t << " iteration " << it << ": memory mismatch";
        failures++;
      }
      if (!p.faa_values.insert(p.fetched[0]).second) {
        ADD_FAILURE() << "FAA value " << p.fetched[0] << " returned twice";
        failures++;
      }
      ++p.faas;
      p.cas_word = static_cast<uint64_t>(it) + 1;  // next iteration's CAS can match or not
    }
    for (auto& p : pairs) {
      EXPECT_EQ(p.counter, p.faas) << "FAA executed other than exactly once";
      EXPECT_EQ(p.faa_values.size(), p.faas);
      if (!p.faa_values.empty()) {
        EXPECT_EQ(*p.faa_values.rbegin(), p.faas - 1);
      }
      EXPECT_EQ(p.qa->state(), QpState::kRts);
      EXPECT_EQ(p.qb->state(), QpState::kRts);
      EXPECT_TRUE(a.dev->destroy_qp(p.qa).is_ok());
      EXPECT_TRUE(b.dev->destroy_qp(p.qb).is_ok());
    }
    EXPECT_TRUE(outstanding.empty());
  };
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ths;
  for (int t = 0; t < kThreads; ++t) ths.emplace_back(worker, t);
  for (auto& th : ths) th.join();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - t0).count();
  a.eng->port().set_filter(nullptr);
  b.eng->port().set_filter(nullptr);
  EXPECT_EQ(failures.load(), 0);
  uint64_t retries = a.eng->counters().get(Ctr::kCompleterRetryErr);
  uint64_t dups = b.eng->counters().get(Ctr::kDuplicateRequest) +
                  a.eng->counters().get(Ctr::kDuplicateRequest);
  std::printf("[ info ] %llu WRs in %lld ms; injected drop %llu dup %llu delay %llu; "
              "go-back-N retries %llu, duplicate requests seen %llu\n",
              static_cast<unsigned long long>(total_wrs.load()), static_cast<long long>(ms),
              static_cast<unsigned long long>(fa.dropped + fb.dropped),
              static_cast<unsigned long long>(fa.duplicated + fb.duplicated),
              static_cast<unsigned long long>(fa.delayed + fb.delayed),
              static_cast<unsigned long long>(retries), static_cast<unsigned long long>(dups));
  EXPECT_GT(fa.dropped + fb.dropped, 0u);
  EXPECT_GT(dups, 0u);
}

}  // namespace
}  // namespace rnic::emu::test
