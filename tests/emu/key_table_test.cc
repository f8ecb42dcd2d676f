// tests/emu/key_table_test.cc: memory keys. 100,000 reg/dereg cycles in four patterns never
// give a duplicate live key and never accept a dead key; key bytes change on index reuse;
// secure-key mode shows no index pattern; seeded mode is reproducible; QPNs are not
// sequential.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::Env;
// The key table, not the page holding: registrations here take the direct pin (no shadow
// view per MR), so 100,000 cycles cost the table's work, not 100,000 memfd moves (pin_test
// and memory_safety_test cover shadow pinning).
DeviceConfig test_config() {
  DeviceConfig c = testing::test_config();
  c.pin = PinMode::kDirect;
  return c;
}

alignas(64) uint8_t g_buf[1 << 16];

uint64_t buf_addr() { return reinterpret_cast<uint64_t>(g_buf); }

// Tracks live and dead keys across a device's lifetime and checks both invariants.
struct KeyAudit {
  Env& env;
  std::unordered_map<uint32_t, std::shared_ptr<Mr>> live;
  std::unordered_set<uint32_t> dead;
  std::vector<uint32_t> dead_log;  // every freed key, for sampling
  uint64_t regs = 0, deregs = 0, dead_probes = 0;

  explicit KeyAudit(Env& e) : env(e) {}

  uint32_t reg() {
    uint32_t key = 0;
    reg_into(&key);
    return key;
  }
  void reg_into(uint32_t* out) {
    auto r = env.dev->reg_mr(env.pd, buf_addr(), sizeof(g_buf), buf_addr(),
                             kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
    ASSERT_TRUE(r.has_value());
    uint32_t k = (*r)->lkey();
    ASSERT_EQ((*r)->rkey(), k);
    ASSERT_NE(k, 0u);
    ASSERT_EQ(live.count(k), 0u) << "duplicate live key " << std::hex << k;
    dead.erase(k);  // a reissued key is live again (never while it is live elsewhere)
    live.emplace(k, *r);
    ++regs;
    *out = k;
  }
  void dereg(uint32_t k) {
    auto it = live.find(k);
    ASSERT_NE(it, live.end());
    ASSERT_TRUE(env.dev->dereg_mr(it->second).is_ok());
    live.erase(it);
    dead.insert(k);
    dead_log.push_back(k);
    ++deregs;
    // The key just freed is refused at once, locally and remotely.
    probe(k);
  }
  void probe(uint32_t k) {
    ++dead_probes;
    ASSERT_EQ(env.dev->keys().find_mr(k), nullptr);
    Sge sge{buf_addr(), 8, k};
    ASSERT_NE(check_local(env.dev->keys(), sge, env.pd.get(), false), WcStatus::kSuccess);
    ASSERT_EQ(check_remote(env.dev->keys(), k, env.pd.get(), 0x11, buf_addr(), 8,
                           kAccessRemoteRead, nullptr),
              RkeyResult::kBadKey);
  }
  void probe_sample(std::mt19937& rng, int n) {
    if (dead_log.empty()) return;
    for (int i = 0; i < n; ++i) {
      uint32_t k = dead_log[rng() % dead_log.size()];
      if (dead.count(k)) probe(k);  // skip keys reissued since (live again)
    }
  }
  uint32_t any_live(std::mt19937& rng) {
    auto it = live.begin();
    std::advance(it, rng() % live.size());
    return it->first;
  }
  void check_live_resolve() {
    for (auto& [k, mr] : live) ASSERT_EQ(env.dev->keys().find_mr(k), mr);
  }
};

void run_patterns(DeviceConfig cfg, uint64_t* total_cycles) {
  Env env(cfg);
  KeyAudit a(env);
  std::mt19937 rng(1234);
  // Pattern 1: batch - register 500, deregister all, 50 times (25,000 cycles).
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 500; ++i) a.reg();
    std::vector<uint32_t> ks;
    for (auto& [k, mr] : a.live) ks.push_back(k);
    for (uint32_t k : ks) a.dereg(k);
  }
  // Pattern 2: ping-pong - reg one, dereg it (25,000 cycles).
  for (int i = 0; i < 25000; ++i) {
    a.reg();
    a.dereg(a.live.begin()->first);
  }
  // Pattern 3: LIFO - a stack that grows and shrinks at random (25,000 registrations).
  std::vector<uint32_t> stack;
  for (uint64_t start = a.regs; a.regs - start < 25000;) {
    if (stack.size() < 8 || (stack.size() < 256 && rng() % 2 == 0)) {
      stack.push_back(a.reg());
    } else {
      a.dereg(stack.back());
      stack.pop_back();
    }
  }
  while (!stack.empty()) {
    a.dereg(stack.back());
    stack.pop_back();
  }
  // Pattern 4: random mix around 1,000 live (25,000 cycles), probing dead keys as we go.
  for (int i = 0; i < 1000; ++i) a.reg();
  for (int i = 0; i < 25000; ++i) {
    a.dereg(a.any_live(rng));
    a.reg();
    if (i % 100 == 0) a.probe_sample(rng, 20);
  }
  a.check_live_resolve();
  a.probe_sample(rng, 2000);
  EXPECT_GE(a.regs, 100000u);
  EXPECT_EQ(env.dev->keys().live_mrs(), a.live.size());
  *total_cycles = a.regs;
}

TEST(KeyTable, HundredThousandCyclesDefaultKeys) {
  uint64_t n = 0;
  run_patterns(test_config(), &n);
  RecordProperty("cycles", static_cast<int>(n));
}

TEST(KeyTable, HundredThousandCyclesSecureKeys) {
  DeviceConfig c = test_config();
  c.secure_keys = true;
  uint64_t n = 0;
  run_patterns(c, &n);
}

TEST(KeyTable, SmallTableReusesIndicesWithNewKeyByte) {
  // max_mr = 3 forces index reuse: the same index must come back with a different byte,
  // and a dead key with the old byte stays refused.
  DeviceConfig c = test_config();
  c.max_mr = 3;
  Env env(c);
  std::map<uint32_t, uint8_t> last_byte;  // index -> byte
  std::set<uint32_t> seen_keys;
  int reuses = 0;
  for (int i = 0; i < 5000; ++i) {
    auto r = env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), kAccessLocalWrite);
    ASSERT_TRUE(r.has_value());
    uint32_t k = (*r)->lkey();
    uint32_t idx = k >> 8;
    auto it = last_byte.find(idx);
    if (it != last_byte.end()) {
      ++reuses;
      EXPECT_NE(it->second, k & 0xFF) << "index " << idx << " reissued with the same byte";
    }
    last_byte[idx] = k & 0xFF;
    ASSERT_TRUE(env.dev->dereg_mr(*r).is_ok());
    EXPECT_EQ(env.dev->keys().find_mr(k), nullptr);
  }
  EXPECT_GT(reuses, 1000);
  // ENOMEM past the limit.
  std::vector<std::shared_ptr<Mr>> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(*env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0));
  auto r = env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), Errc::kNoMem);
  for (auto& m : held) ASSERT_TRUE(env.dev->dereg_mr(m).is_ok());
}

TEST(KeyTable, DefaultKeysShowIndexAndMwRange) {
  // Default mode: key >> 8 is an index; MR and MW index ranges are disjoint.
  Env env;
  auto mr = *env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  EXPECT_FALSE(KeyTable::key_index_is_mw(mr->lkey()));
  EXPECT_TRUE(KeyTable::key_index_is_mw(mw->rkey()));
  EXPECT_EQ(env.dev->keys().kind_of(mr->lkey()), KeyKind::kMr);
  EXPECT_EQ(env.dev->keys().kind_of(mw->rkey()), KeyKind::kMw);
  EXPECT_EQ(env.dev->keys().find_mw(mr->lkey()), nullptr);
  EXPECT_EQ(env.dev->keys().find_mr(mw->rkey()), nullptr);
}

// Statistics over a sequence of keys.
struct KeyStats {
  double bit_min = 1, bit_max = 0;  // frequency of each bit being 1
  size_t distinct_deltas = 0;
  double top_delta_share = 0;       // share of the most common consecutive delta
  size_t distinct_high = 0;         // distinct key >> 8
};
KeyStats stats(const std::vector<uint32_t>& keys) {
  KeyStats s;
  for (int b = 0; b < 32; ++b) {
    size_t ones = 0;
    for (uint32_t k : keys) ones += (k >> b) & 1;
    double f = double(ones) / keys.size();
    s.bit_min = std::min(s.bit_min, f);
    s.bit_max = std::max(s.bit_max, f);
  }
  std::unordered_map<uint32_t, size_t> deltas;
  for (size_t i = 1; i < keys.size(); ++i) deltas[keys[i] - keys[i - 1]]++;
  s.distinct_deltas = deltas.size();
  size_t top = 0;
  for (auto& [d, n] : deltas) top = std::max(top, n);
  s.top_delta_share = double(top) / (keys.size() - 1);
  std::unordered_set<uint32_t> hi;
  for (uint32_t k : keys) hi.insert(k >> 8);
  s.distinct_high = hi.size();
  return s;
}

std::vector<uint32_t> churn_keys(DeviceConfig c, int n) {
  Env env(c);
  std::vector<uint32_t> keys;
  std::vector<std::shared_ptr<Mr>> live;
  std::mt19937 rng(7);
  for (int i = 0; i < n; ++i) {
    auto mr = *env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0);
    keys.push_back(mr->lkey());
    live.push_back(mr);
    if (live.size() > 16) {  // mixed pattern: free a random one
      size_t j = rng() % live.size();
      EXPECT_TRUE(env.dev->dereg_mr(live[j]).is_ok());
      live.erase(live.begin() + j);
    }
  }
  for (auto& m : live) EXPECT_TRUE(env.dev->dereg_mr(m).is_ok());
  return keys;
}

TEST(KeyTable, SecureKeysShowNoIndexPattern) {
  const int kN = 10000;
  DeviceConfig c = test_config();
  c.secure_keys = true;
  KeyStats sec = stats(churn_keys(c, kN));
  // Every one of the 32 bits is a fair coin (10k samples: sd 0.005; allow +-0.03).
  EXPECT_GT(sec.bit_min, 0.47);
  EXPECT_LT(sec.bit_max, 0.53);
  // Consecutive deltas are (almost) all different and none dominates.
  EXPECT_GT(sec.distinct_deltas, size_t(kN * 0.99));
  EXPECT_LT(sec.top_delta_share, 0.01);
  // No upper part is ever reissued (a freed key's handle is retired).
  EXPECT_EQ(sec.distinct_high, size_t(kN));

  // The same statistics on default keys do see the index: the high bits are far from fair
  // (indices are small), and the upper 24 bits repeat or step by one.
  KeyStats def = stats(churn_keys(test_config(), kN));
  EXPECT_LT(def.bit_min, 0.05);
  EXPECT_LT(def.distinct_high, size_t(kN));
}

TEST(KeyTable, SecureModeFreedKeyNeverReissued) {
  DeviceConfig c = test_config();
  c.secure_keys = true;
  Env env(c);
  std::unordered_set<uint32_t> freed_handles;
  for (int i = 0; i < 20000; ++i) {
    auto mr = *env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0);
    ASSERT_EQ(freed_handles.count(mr->lkey() >> 8), 0u);
    freed_handles.insert(mr->lkey() >> 8);
    ASSERT_TRUE(env.dev->dereg_mr(mr).is_ok());
  }
}

TEST(KeyTable, SeededKeysAreReproducible) {
  DeviceConfig c = test_config();
  c.key_seed = 42;
  EXPECT_EQ(churn_keys(c, 500), churn_keys(c, 500));
  c.secure_keys = true;
  EXPECT_EQ(churn_keys(c, 500), churn_keys(c, 500));
  DeviceConfig d = c;
  d.key_seed = 43;
  EXPECT_NE(churn_keys(c, 500), churn_keys(d, 500));
}

TEST(KeyTable, QpnsAreRandomNotSequential) {
  Env env;
  std::vector<uint32_t> qpns;
  std::vector<std::shared_ptr<Qp>> qps;
  for (int i = 0; i < 200; ++i) {
    qps.push_back(env.qp(QpType::kRc, 1));
    uint32_t n = qps.back()->qpn();
    EXPECT_GE(n, 0x11u);
    EXPECT_LE(n, 0xFFFFFEu);
    qpns.push_back(n);
  }
  int steps_of_one = 0;
  for (size_t i = 1; i < qpns.size(); ++i) steps_of_one += (qpns[i] - qpns[i - 1] == 1);
  EXPECT_LT(steps_of_one, 3);
  std::set<uint32_t> uniq(qpns.begin(), qpns.end());
  EXPECT_EQ(uniq.size(), qpns.size());
  for (auto& q : qps) {
    EXPECT_EQ(env.dev->find_qp(q->qpn()), q);
    EXPECT_EQ(q->udp_sport() & 0xC000, 0xC000);
    ASSERT_TRUE(env.dev->destroy_qp(q).is_ok());
    EXPECT_EQ(env.dev->find_qp(q->qpn()), nullptr);
  }
}

TEST(KeyTable, ConcurrentLookupsDuringChurn) {
  // Readers resolve a stable key and probe dead keys while a writer churns the table.
  Env env;
  auto stable = *env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), kAccessLocalWrite);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lookups{0}, bad{0};
  auto reader = [&] {
    while (!stop.load()) {
      if (env.dev->keys().find_mr(stable->lkey()) != stable) bad++;
      lookups++;
    }
  };
  std::thread r1(reader), r2(reader);
  while (lookups.load() < 2) std::this_thread::yield();  // both readers are running
  for (int i = 0; i < 20000; ++i) {
    auto m = *env.dev->reg_mr(env.pd, buf_addr(), 64, buf_addr(), 0);
    uint32_t k = m->lkey();
    ASSERT_TRUE(env.dev->dereg_mr(m).is_ok());
    ASSERT_EQ(env.dev->keys().find_mr(k), nullptr);
  }
  stop = true;
  r1.join();
  r2.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(lookups.load(), 0u);
  ASSERT_TRUE(env.dev->dereg_mr(stable).is_ok());
}

}  // namespace
}  // namespace rnic::emu
