// tests/emu/protection_test.cc: PD/MR/MW protection. S09 local SGE checks, the remote rkey
// check of docs/checks.md §2.3 (MR and MW paths), S15 MW bind rules (each named, with its status),
// S12/S13/S14 window semantics, S17 dereg while bound, rereg, reg_mr flag rules.
#include <gtest/gtest.h>
#include <chrono>

#include <atomic>
#include <cstring>
#include <thread>

#include "emu/objects/memory.h"
#include "emu/objects/transport_state.h"
#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::Env;

constexpr uint32_t kAll = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                          kAccessRemoteAtomic | kAccessMwBind;

class Protection : public ::testing::Test {
 protected:
  Env env;
  alignas(64) uint8_t buf[4096] = {};
  uint64_t base() const { return reinterpret_cast<uint64_t>(buf); }
  // Whether the engine's address `dev` (a translation result) reaches the application's byte
  // at `host`: the same page offset in the device's view of the pinned pages (pin.h), and a
  // store through one is seen through the other.
  bool reaches(uint64_t dev, uint64_t host) {
    if ((dev & 4095) != (host & 4095)) return false;
    auto* h = reinterpret_cast<volatile uint8_t*>(host);
    auto* d = reinterpret_cast<volatile uint8_t*>(dev);
    const uint8_t old = *h;
    *h = static_cast<uint8_t>(old + 1);
    const bool same = *d == static_cast<uint8_t>(old + 1);
    *h = old;
    return same;
  }
  std::shared_ptr<Mr> reg(uint32_t access, const std::shared_ptr<Pd>& pd = nullptr,
                          uint64_t iova = 0) {
    auto r = env.dev->reg_mr(pd ? pd : env.pd, base(), sizeof(buf), iova ? iova : base(),
                             access);
    EXPECT_TRUE(r.has_value());
    return r.has_value() ? *r : nullptr;
  }
  WcStatus local(const Sge& s, bool write, const Pd* pd = nullptr,
                 ErrorsMode m = ErrorsMode::kSpec, uint64_t* host = nullptr) {
    return check_local(env.dev->keys(), s, pd ? pd : env.pd.get(), write, m, host);
  }
  RkeyResult remote(uint32_t rkey, uint64_t va, uint64_t len, uint32_t req,
                    uint32_t qpn = 0x100, const Pd* pd = nullptr, RemoteTarget* t = nullptr) {
    return check_remote(env.dev->keys(), rkey, pd ? pd : env.pd.get(), qpn, va, len, req, t);
  }
  // Type-2 bind through QP number qpn of PD pd.
  WcStatus bind(const std::shared_ptr<Mw>& mw, const std::shared_ptr<Mr>& mr, uint64_t addr,
                uint64_t len, uint32_t access, uint32_t qpn = 0x100, const Pd* pd = nullptr,
                uint32_t* out = nullptr) {
    BindInfo b;
    b.mw_rkey = mw->rkey();
    b.new_rkey = mw->rkey() + 1;  // ibv_inc_rkey
    b.mr_lkey = mr ? mr->lkey() : 0;
    b.addr = addr;
    b.length = len;
    b.access = access;
    return bind_mw(*env.dev, pd ? pd : env.pd.get(), qpn, b, out);
  }
};

// ------------------------------------------------------------------ S09 local checks

TEST_F(Protection, S09_ValidSgeTranslates) {
  auto mr = reg(kAccessLocalWrite, nullptr, 0x10000);  // ibv_reg_mr_iova: iova != addr
  uint64_t host = 0;
  EXPECT_EQ(local({0x10000 + 100, 50, mr->lkey()}, true, nullptr, ErrorsMode::kSpec, &host),
            WcStatus::kSuccess);
  EXPECT_TRUE(reaches(host, base() + 100));
  EXPECT_EQ(local({0x10000, sizeof(buf), mr->lkey()}, true), WcStatus::kSuccess);
}

TEST_F(Protection, S09_BadLkeyIsLocProtErr) {
  auto mr = reg(kAccessLocalWrite);
  EXPECT_EQ(local({base(), 8, mr->lkey() + 1}, false), WcStatus::kLocProtErr);  // key byte+1
  EXPECT_EQ(local({base(), 8, 0xDEAD00}, false), WcStatus::kLocProtErr);
}

TEST_F(Protection, S09_BadLkeyRxeModeIsLocQpOpErr) {
  auto mr = reg(kAccessLocalWrite);
  EXPECT_EQ(local({base(), 8, mr->lkey() + 1}, false, nullptr, ErrorsMode::kRxe),
            WcStatus::kLocQpOpErr);
}

TEST_F(Protection, S09_RangePastEndIsLocProtErr) {
  auto mr = reg(kAccessLocalWrite);
  EXPECT_EQ(local({base() + sizeof(buf) - 8, 9, mr->lkey()}, false), WcStatus::kLocProtErr);
  EXPECT_EQ(local({base() + sizeof(buf), 1, mr->lkey()}, false), WcStatus::kLocProtErr);
}

TEST_F(Protection, S09_RangeBeforeStartIsLocProtErr) {
  auto mr = reg(kAccessLocalWrite);
  EXPECT_EQ(local({base() - 1, 8, mr->lkey()}, false), WcStatus::kLocProtErr);
}

TEST_F(Protection, S09_RangeWrapIsLocProtErr) {
  auto mr = reg(kAccessLocalWrite);
  EXPECT_EQ(local({~uint64_t{0} - 4, 16, mr->lkey()}, false), WcStatus::kLocProtErr);
}

TEST_F(Protection, S09_OtherPdIsLocProtErr) {
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAccessLocalWrite, pd2);
  EXPECT_EQ(local({base(), 8, mr->lkey()}, false), WcStatus::kLocProtErr);
  EXPECT_EQ(local({base(), 8, mr->lkey()}, false, pd2.get()), WcStatus::kSuccess);
}

TEST_F(Protection, S09_ScatterWithoutLocalWriteIsLocProtErr) {
  auto mr = reg(kAccessRemoteRead);
  EXPECT_EQ(local({base(), 8, mr->lkey()}, true), WcStatus::kLocProtErr);
  EXPECT_EQ(local({base(), 8, mr->lkey()}, false), WcStatus::kSuccess);  // gather is fine
}

TEST_F(Protection, S09_DeregisteredLkeyIsLocProtErr) {
  auto mr = reg(kAccessLocalWrite);
  uint32_t k = mr->lkey();
  ASSERT_TRUE(env.dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(local({base(), 8, k}, false), WcStatus::kLocProtErr);
}

TEST_F(Protection, S09_ZeroLengthSgeTouchesNothing) {
  EXPECT_EQ(local({0, 0, 0xBADBAD}, true), WcStatus::kSuccess);
}

// ------------------------------------------------------------------ remote (docs/checks.md §2.3)

TEST_F(Protection, Remote_ValidWriteTranslates) {
  auto mr = reg(kAll, nullptr, 0x7000000);
  RemoteTarget t;
  EXPECT_EQ(remote(mr->rkey(), 0x7000000 + 16, 32, kAccessRemoteWrite, 0x100, nullptr, &t),
            RkeyResult::kOk);
  EXPECT_TRUE(reaches(t.host_addr, base() + 16));
  EXPECT_EQ(t.mr, mr);
}

TEST_F(Protection, S01_KeyBytePlusOneIsBadKey) {
  auto mr = reg(kAll);
  EXPECT_EQ(remote(mr->rkey() + 1, base(), 8, kAccessRemoteWrite), RkeyResult::kBadKey);
}

TEST_F(Protection, S02_OtherPdIsPdMismatch) {
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAll, pd2);
  EXPECT_EQ(remote(mr->rkey(), base(), 8, kAccessRemoteWrite), RkeyResult::kPdMismatch);
}

TEST_F(Protection, S03_MissingRightIsAccessDenied) {
  auto w = reg(kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteAtomic);
  EXPECT_EQ(remote(w->rkey(), base(), 8, kAccessRemoteWrite), RkeyResult::kAccessDenied);
  auto r = reg(kAccessLocalWrite | kAccessRemoteWrite);
  EXPECT_EQ(remote(r->rkey(), base(), 8, kAccessRemoteRead), RkeyResult::kAccessDenied);
  EXPECT_EQ(remote(r->rkey(), base(), 8, kAccessRemoteAtomic), RkeyResult::kAccessDenied);
}

TEST_F(Protection, S05_OneBytePastEndOrBeforeStartIsOutOfRange) {
  auto mr = reg(kAll);
  EXPECT_EQ(remote(mr->rkey(), base() + 1, sizeof(buf), kAccessRemoteWrite),
            RkeyResult::kOutOfRange);
  EXPECT_EQ(remote(mr->rkey(), base() - 1, 8, kAccessRemoteWrite), RkeyResult::kOutOfRange);
  EXPECT_EQ(remote(mr->rkey(), base(), sizeof(buf), kAccessRemoteWrite), RkeyResult::kOk);
}

TEST_F(Protection, S06_WrappingRangeIsOutOfRange) {
  auto mr = reg(kAll);
  EXPECT_EQ(remote(mr->rkey(), ~uint64_t{0} - 7, 64, kAccessRemoteWrite),
            RkeyResult::kOutOfRange);
  EXPECT_EQ(remote(mr->rkey(), base() + 8, ~uint64_t{0}, kAccessRemoteRead),
            RkeyResult::kOutOfRange);
}

TEST_F(Protection, S07_ZeroLengthSkipsKeyCheck) {
  EXPECT_EQ(remote(0xBAD0BAD, 0xFFFFFFFFFFFF0000, 0, kAccessRemoteWrite), RkeyResult::kOk);
  EXPECT_EQ(remote(0, 0, 0, kAccessRemoteRead), RkeyResult::kOk);
}

TEST_F(Protection, S08_MisalignedAtomic) {
  auto mr = reg(kAll);
  EXPECT_EQ(remote(mr->rkey(), base() + 1, 8, kAccessRemoteAtomic), RkeyResult::kMisaligned);
  EXPECT_EQ(remote(mr->rkey(), base() + 8, 8, kAccessRemoteAtomic), RkeyResult::kOk);
}

TEST_F(Protection, S17_DeregRefusedWhileMwBoundThenOldRkeyDead) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite), WcStatus::kSuccess);
  EXPECT_EQ(mr->bound_mws(), 1u);
  EXPECT_EQ(env.dev->dereg_mr(mr), Errc::kBusy);
  EXPECT_EQ(env.dev->rereg_mr(mr, kReregChangeAccess, nullptr, 0, 0, kAll), Errc::kBusy);
  ASSERT_EQ(local_invalidate(*env.dev, env.pd.get(), mw->rkey()), WcStatus::kSuccess);
  EXPECT_EQ(mr->bound_mws(), 0u);
  uint32_t old = mr->rkey();
  ASSERT_TRUE(env.dev->dereg_mr(mr).is_ok());
  auto mr2 = reg(kAll);
  EXPECT_NE(mr2->rkey(), old);
  EXPECT_EQ(remote(old, base(), 8, kAccessRemoteWrite), RkeyResult::kBadKey);
  ASSERT_TRUE(env.dev->dealloc_mw(mw).is_ok());
}

// ------------------------------------------------------------------ reg / rereg rules

TEST_F(Protection, RegMrFlagRules) {
  auto r1 = env.dev->reg_mr(env.pd, base(), 64, base(), kAccessRemoteWrite);
  ASSERT_FALSE(r1.has_value());
  EXPECT_EQ(r1.error(), Errc::kInval);  // REMOTE_WRITE without LOCAL_WRITE
  auto r2 = env.dev->reg_mr(env.pd, base(), 64, base(), kAccessRemoteAtomic);
  EXPECT_EQ(r2.error(), Errc::kInval);
  auto r3 = env.dev->reg_mr(env.pd, base(), 64, base(), kAccessOnDemand | kAccessLocalWrite);
  ASSERT_TRUE(r3.has_value());  // ODP (hardening_test S20)
  EXPECT_FALSE((*r3)->shadowed());
  EXPECT_TRUE(env.dev->dereg_mr(*r3).is_ok());
  auto r4 = env.dev->reg_mr(env.pd, base(), 0, base(), kAccessLocalWrite);
  EXPECT_EQ(r4.error(), Errc::kInval);
  auto r5 = env.dev->reg_mr(env.pd, ~uint64_t{0} - 10, 64, 0, kAccessLocalWrite);
  EXPECT_EQ(r5.error(), Errc::kInval);
  auto r6 = env.dev->reg_mr(env.pd, base(), 64, base(), kAccessRemoteRead | (1u << 12));
  EXPECT_EQ(r6.error(), Errc::kInval);
  // Optional-range bits (RELAXED_ORDERING) are accepted and ignored.
  auto r7 = env.dev->reg_mr(env.pd, base(), 64, base(), kAccessRemoteRead | kAccessRelaxedOrdering);
  ASSERT_TRUE(r7.has_value());
  EXPECT_EQ((*r7)->access(), kAccessRemoteRead);
}

TEST_F(Protection, ReregAccessKeepsKeyAndChangesRights) {
  auto mr = reg(kAccessLocalWrite | kAccessRemoteWrite);
  uint32_t k = mr->rkey();
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangeAccess, nullptr, 0, 0, kAccessLocalWrite).is_ok());
  EXPECT_EQ(mr->rkey(), k);
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite), RkeyResult::kAccessDenied);  // S03 rereg
  EXPECT_EQ(env.dev->rereg_mr(mr, kReregChangeAccess, nullptr, 0, 0, kAccessRemoteWrite),
            Errc::kInval);
  EXPECT_EQ(mr->access(), kAccessLocalWrite);  // rejected rereg changed nothing
}

TEST_F(Protection, ReregPdIssuesNewKeyAndMovesPd) {
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAll);
  uint32_t k = mr->rkey();
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangePd, pd2, 0, 0, 0).is_ok());
  EXPECT_NE(mr->rkey(), k);
  EXPECT_EQ(mr->pd(), pd2);
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite), RkeyResult::kBadKey);
  EXPECT_EQ(remote(mr->rkey(), base(), 8, kAccessRemoteWrite), RkeyResult::kPdMismatch);
  EXPECT_EQ(remote(mr->rkey(), base(), 8, kAccessRemoteWrite, 0x100, pd2.get()),
            RkeyResult::kOk);
  EXPECT_EQ(env.dev->dealloc_pd(pd2), Errc::kBusy);
  EXPECT_TRUE(env.dev->dealloc_pd(env.pd).is_ok());  // its only MR moved away
  env.pd = pd2;
}

// A QP's remembered MR (MrCache: the requester's lkeys, the responder's rkeys) answers as the
// key table does: through rereg of the key, of the rights, dereg, and an entry that names
// another MR than the one its key now resolves to (a reissued key).
TEST_F(Protection, MrCacheAnswersAsTheTable) {
  const KeyTable& keys = env.dev->keys();
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAll);
  const uint32_t k = mr->rkey();
  MrCache rc, lc;
  auto rem = [&](uint32_t key, const Pd* pd, uint32_t req, RemoteTarget* t = nullptr) {
    return check_remote(keys, key, pd, 0x100, base(), 8, req, t, &rc);
  };
  {
    RemoteTarget t;
    EXPECT_EQ(rem(k, env.pd.get(), kAccessRemoteWrite, &t), RkeyResult::kOk);
    EXPECT_EQ(rc.mr, mr);  // remembered
    EXPECT_EQ(t.mr, mr);
  }
  {
    RemoteTarget t;
    EXPECT_EQ(rem(k, env.pd.get(), kAccessRemoteWrite, &t), RkeyResult::kOk);  // from the cache
    EXPECT_EQ(t.mr, mr);
  }
  // A new key (and PD): the old one resolves to nothing, the cache's MR notwithstanding.
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangePd, pd2, 0, 0, 0).is_ok());
  const uint32_t k2 = mr->rkey();
  ASSERT_NE(k2, k);
  EXPECT_EQ(rem(k, pd2.get(), kAccessRemoteWrite), RkeyResult::kBadKey);
  EXPECT_EQ(rem(k2, env.pd.get(), kAccessRemoteWrite), RkeyResult::kPdMismatch);
  EXPECT_EQ(rem(k2, pd2.get(), kAccessRemoteWrite), RkeyResult::kOk);
  EXPECT_EQ(rc.key, k2);
  // New rights under the same key: the remembered MR's current ones count.
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangeAccess, nullptr, 0, 0, kAccessLocalWrite).is_ok());
  EXPECT_EQ(rem(k2, pd2.get(), kAccessRemoteWrite), RkeyResult::kAccessDenied);
  // An entry naming another MR than the key's: the table's MR answers.
  auto other = reg(kAll, pd2);
  rc.key = other->rkey();
  rc.mr = mr;  // live, under another key
  {
    RemoteTarget t;
    EXPECT_EQ(rem(other->rkey(), pd2.get(), kAccessRemoteWrite, &t), RkeyResult::kOk);
    EXPECT_EQ(t.mr, other);
    EXPECT_EQ(rc.mr, other);
  }
  lc.key = other->rkey();
  lc.mr = mr;
  const Sge so{base(), 8, other->lkey()};
  std::shared_ptr<Mr> got;
  EXPECT_EQ(check_local(keys, so, pd2.get(), true, ErrorsMode::kSpec, nullptr, nullptr, &got,
                        nullptr, &lc),
            WcStatus::kSuccess);
  EXPECT_EQ(got, other);
  EXPECT_EQ(lc.mr, other);
  // Dereg: the remembered MR is invalid, and the table has no such key.
  const Sge s{base(), 8, k2};
  EXPECT_EQ(check_local(keys, s, pd2.get(), true, ErrorsMode::kSpec, nullptr, nullptr, nullptr,
                        nullptr, &lc),
            WcStatus::kSuccess);
  EXPECT_EQ(lc.mr, mr);
  rc.key = k2;
  rc.mr = mr;
  ASSERT_TRUE(env.dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(check_local(keys, s, pd2.get(), true, ErrorsMode::kSpec, nullptr, nullptr, nullptr,
                        nullptr, &lc),
            WcStatus::kLocProtErr);
  EXPECT_EQ(lc.mr, nullptr);  // let go
  EXPECT_EQ(rem(k2, pd2.get(), kAccessRemoteRead), RkeyResult::kBadKey);
  EXPECT_EQ(rc.mr, nullptr);
  ASSERT_TRUE(env.dev->dereg_mr(other).is_ok());
  env.pd = pd2;  // the fixture's PD has no MR left; pd2 holds none now either
}

TEST_F(Protection, ReregTranslation) {
  auto mr = reg(kAll);
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangeTranslation, nullptr, base() + 1024, 512, 0).is_ok());
  EXPECT_EQ(mr->addr(), base() + 1024);
  EXPECT_EQ(mr->length(), 512u);
  EXPECT_EQ(remote(mr->rkey(), base(), 8, kAccessRemoteWrite), RkeyResult::kOutOfRange);
  EXPECT_EQ(remote(mr->rkey(), base() + 1024, 512, kAccessRemoteWrite), RkeyResult::kOk);
  EXPECT_EQ(env.dev->rereg_mr(mr, 0, nullptr, 0, 0, 0), Errc::kInval);
  EXPECT_EQ(env.dev->rereg_mr(mr, 1u << 3, nullptr, 0, 0, 0), Errc::kInval);
  EXPECT_EQ(env.dev->rereg_mr(mr, kReregChangeTranslation, nullptr, base(), 0, 0), Errc::kInval);
}

// Mr::view() reads without a lock (a sequence lock): a reader racing reregs sees the fields
// of one registration or the other, never a mix. Translation and access change together
// here: A = [base, +1024) with LOCAL_WRITE|REMOTE_WRITE, B = [base+1024, +512) with
// LOCAL_WRITE only; each rereg also issues a new key.
TEST_F(Protection, ViewIsNeverTornAcrossReregs) {
  auto mr = reg(kAll);
  const uint32_t acc_a = kAccessLocalWrite | kAccessRemoteWrite, acc_b = kAccessLocalWrite;
  ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangeTranslation | kReregChangeAccess, nullptr,
                                base(), 1024, acc_a)
                  .is_ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> seen{0}, torn{0};
  std::thread reader([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const MrView v = mr->view();
      const bool a = v.host_addr == base() && v.length == 1024 && v.access == acc_a;
      const bool b = v.host_addr == base() + 1024 && v.length == 512 && v.access == acc_b;
      if (!(a || b) || v.iova != v.host_addr || v.state != MrState::kValid || v.key == 0)
        torn.fetch_add(1, std::memory_order_relaxed);
      seen.fetch_add(1, std::memory_order_relaxed);
    }
  });
  // The reader races the reregs: it has started before the first, and the reregs go on (2000
  // at least, 5 s at most) until it has read 1000 views among them. (On a loaded machine the
  // reader once got no CPU before 2000 reregs were done, and the test read nothing.)
  while (seen.load() == 0) std::this_thread::yield();
  const uint64_t seen0 = seen.load();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int i = 0; i < 2000 || (seen.load() - seen0 < 1000 &&
                               std::chrono::steady_clock::now() < until);
       ++i) {
    const bool to_b = i % 2 == 0;
    ASSERT_TRUE(env.dev->rereg_mr(mr, kReregChangeTranslation | kReregChangeAccess, nullptr,
                                  to_b ? base() + 1024 : base(), to_b ? 512 : 1024,
                                  to_b ? acc_b : acc_a)
                    .is_ok());
    const MrView v = mr->view();  // the writer's own thread sees its change at once
    EXPECT_EQ(v.key, mr->lkey());
    EXPECT_EQ(v.length, to_b ? 512u : 1024u);
  }
  const uint64_t raced = seen.load() - seen0;
  stop = true;
  reader.join();
  EXPECT_GE(raced, 1000u);
  EXPECT_EQ(torn.load(), 0u);
}

// ------------------------------------------------------------------ MW semantics

TEST_F(Protection, MwType2BindWriteAndIncRkey) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t before = mw->rkey();
  // FREE type 2: not bound to this (or any) QP - docs/checks.md §2.3 checks the QP binding first.
  EXPECT_EQ(remote(before, base(), 8, kAccessRemoteWrite), RkeyResult::kMwWrongQp);
  uint32_t nk = 0;
  ASSERT_EQ(bind(mw, mr, base() + 64, 128, kAccessRemoteWrite, 0x100, nullptr, &nk),
            WcStatus::kSuccess);
  EXPECT_EQ(nk, mw->rkey());
  EXPECT_EQ(nk & ~0xFFu, before & ~0xFFu);              // same index
  EXPECT_EQ(nk & 0xFF, (before + 1) & 0xFF);            // the application's key byte
  EXPECT_EQ(remote(before, base() + 64, 8, kAccessRemoteWrite), RkeyResult::kBadKey);
  RemoteTarget t;
  EXPECT_EQ(remote(nk, base() + 64, 128, kAccessRemoteWrite, 0x100, nullptr, &t),
            RkeyResult::kOk);
  EXPECT_TRUE(reaches(t.host_addr, base() + 64));
  EXPECT_EQ(remote(nk, base() + 63, 8, kAccessRemoteWrite), RkeyResult::kOutOfRange);
  EXPECT_EQ(remote(nk, base() + 64, 8, kAccessRemoteRead), RkeyResult::kAccessDenied);
}

TEST_F(Protection, MwZeroBasedWindowOffsets) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t nk;
  ASSERT_EQ(bind(mw, mr, base() + 256, 64, kAccessRemoteRead | kAccessZeroBased, 0x100,
                 nullptr, &nk),
            WcStatus::kSuccess);
  RemoteTarget t;
  EXPECT_EQ(remote(nk, 8, 16, kAccessRemoteRead, 0x100, nullptr, &t), RkeyResult::kOk);
  EXPECT_TRUE(reaches(t.host_addr, base() + 256 + 8));
  EXPECT_EQ(remote(nk, 60, 8, kAccessRemoteRead), RkeyResult::kOutOfRange);
}

TEST_F(Protection, S12_Type1ZeroLengthBindInvalidates) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  uint32_t k1;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0, nullptr, &k1), WcStatus::kSuccess);
  EXPECT_EQ(remote(k1, base(), 8, kAccessRemoteWrite), RkeyResult::kOk);
  uint32_t k2;
  ASSERT_EQ(bind(mw, nullptr, 0, 0, 0, 0, nullptr, &k2), WcStatus::kSuccess);
  EXPECT_EQ(mr->bound_mws(), 0u);
  EXPECT_EQ(remote(k2, base(), 8, kAccessRemoteWrite), RkeyResult::kMwUnbound);
  EXPECT_EQ(remote(k1, base(), 8, kAccessRemoteWrite), RkeyResult::kBadKey);
}

TEST_F(Protection, S13_Type2BoundToOtherQpIsRefused) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t k;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, /*qpn=*/0x200, nullptr, &k),
            WcStatus::kSuccess);
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite, 0x200), RkeyResult::kOk);
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite, 0x201), RkeyResult::kMwWrongQp);
}

TEST_F(Protection, S14_Type2InvalidatedByLocalInvRemoteInvAndDealloc) {
  auto mr = reg(kAll);
  // LOCAL_INV
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t k;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0x100, nullptr, &k), WcStatus::kSuccess);
  ASSERT_EQ(local_invalidate(*env.dev, env.pd.get(), k), WcStatus::kSuccess);
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite), RkeyResult::kMwWrongQp);  // FREE
  EXPECT_EQ(mw->view().state, MwState::kFree);
  // SEND_WITH_INV
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0x100, nullptr, &k), WcStatus::kSuccess);
  EXPECT_TRUE(remote_invalidate(*env.dev, env.pd.get(), k));
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite), RkeyResult::kMwWrongQp);  // FREE
  EXPECT_FALSE(remote_invalidate(*env.dev, env.pd.get(), k));  // already FREE
  // dealloc
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0x100, nullptr, &k), WcStatus::kSuccess);
  ASSERT_TRUE(env.dev->dealloc_mw(mw).is_ok());
  EXPECT_EQ(remote(k, base(), 8, kAccessRemoteWrite), RkeyResult::kBadKey);
  EXPECT_EQ(mr->bound_mws(), 0u);
}

TEST_F(Protection, S16_InvalidateOfType1OrMrOrUnknownFails) {
  auto mr = reg(kAll);
  auto mw1 = *env.dev->alloc_mw(env.pd, MwType::kType1);
  uint32_t k1;
  ASSERT_EQ(bind(mw1, mr, base(), 64, kAccessRemoteWrite, 0, nullptr, &k1), WcStatus::kSuccess);
  EXPECT_FALSE(remote_invalidate(*env.dev, env.pd.get(), k1));
  EXPECT_FALSE(remote_invalidate(*env.dev, env.pd.get(), mr->rkey()));
  EXPECT_FALSE(remote_invalidate(*env.dev, env.pd.get(), 0x12345678));
  EXPECT_EQ(local_invalidate(*env.dev, env.pd.get(), k1), WcStatus::kLocQpOpErr);
  EXPECT_EQ(remote(k1, base(), 8, kAccessRemoteWrite), RkeyResult::kOk);  // nothing changed
}

// ------------------------------------------------------------------ S15 bind errors

// Every S15 case: the bind fails with MW_BIND_ERR and the previously bound rkey keeps its
// validity (we bind once successfully first where the case allows it).
class S15 : public Protection {
 protected:
  void expect_old_key_intact(const std::shared_ptr<Mw>& mw, uint32_t old_key, bool was_valid) {
    EXPECT_EQ(mw->rkey(), old_key);
    EXPECT_EQ(remote(old_key, base(), 8, kAccessRemoteWrite) == RkeyResult::kOk, was_valid);
  }
};

TEST_F(S15, Type2NotFreeIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t k;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0x100, nullptr, &k), WcStatus::kSuccess);
  EXPECT_EQ(bind(mw, mr, base(), 128, kAccessRemoteWrite), WcStatus::kMwBindErr);
  expect_old_key_intact(mw, k, true);
  EXPECT_EQ(mw->view().length, 64u);
}

TEST_F(S15, QpInAnotherPdIsMwBindErr) {
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  uint32_t k = mw->rkey();
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0x100, pd2.get()), WcStatus::kMwBindErr);
  expect_old_key_intact(mw, k, false);
  EXPECT_EQ(mw->view().state, MwState::kFree);
}

TEST_F(S15, MrWithoutMwBindIsMwBindErr) {
  auto mr = reg(kAll & ~kAccessMwBind);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteRead), WcStatus::kMwBindErr);
  EXPECT_EQ(mr->bound_mws(), 0u);
}

TEST_F(S15, RemoteWriteWindowOnMrWithoutLocalWriteIsMwBindErr) {
  auto mr = reg(kAccessRemoteRead | kAccessMwBind);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite), WcStatus::kMwBindErr);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteAtomic), WcStatus::kMwBindErr);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteRead), WcStatus::kSuccess);  // read is fine
}

TEST_F(S15, WindowOutsideMrIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  uint32_t k;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0, nullptr, &k), WcStatus::kSuccess);
  EXPECT_EQ(bind(mw, mr, base() + sizeof(buf) - 8, 16, kAccessRemoteWrite), WcStatus::kMwBindErr);
  EXPECT_EQ(bind(mw, mr, base() - 8, 16, kAccessRemoteWrite), WcStatus::kMwBindErr);
  EXPECT_EQ(bind(mw, mr, base(), sizeof(buf) + 1, kAccessRemoteWrite | kAccessZeroBased),
            WcStatus::kMwBindErr);
  expect_old_key_intact(mw, k, true);
}

TEST_F(S15, StaleMwRkeyIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  uint32_t k;
  ASSERT_EQ(bind(mw, mr, base(), 64, kAccessRemoteWrite, 0, nullptr, &k), WcStatus::kSuccess);
  BindInfo b;
  b.mw_rkey = k - 1;  // the rkey before the bind
  b.new_rkey = k + 1;
  b.mr_lkey = mr->lkey();
  b.addr = base();
  b.length = 32;
  b.access = kAccessRemoteWrite;
  EXPECT_EQ(bind_mw(*env.dev, env.pd.get(), 0, b, nullptr), WcStatus::kMwBindErr);
  expect_old_key_intact(mw, k, true);
}

TEST_F(S15, StaleMrLkeyIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  BindInfo b;
  b.mw_rkey = mw->rkey();
  b.new_rkey = mw->rkey() + 1;
  b.mr_lkey = mr->lkey() ^ 0x1;
  b.addr = base();
  b.length = 32;
  b.access = kAccessRemoteRead;
  EXPECT_EQ(bind_mw(*env.dev, env.pd.get(), 0x100, b, nullptr), WcStatus::kMwBindErr);
}

TEST_F(S15, Type1ZeroBasedIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteRead | kAccessZeroBased), WcStatus::kMwBindErr);
}

TEST_F(S15, Type2ZeroLengthIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  EXPECT_EQ(bind(mw, mr, base(), 0, kAccessRemoteRead), WcStatus::kMwBindErr);
}

TEST_F(S15, UnsupportedAccessBitIsMwBindErr) {
  auto mr = reg(kAll);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteRead | kAccessOnDemand), WcStatus::kMwBindErr);
}

TEST_F(S15, MrInOtherPdIsMwBindErr) {
  auto pd2 = *env.dev->alloc_pd();
  auto mr = reg(kAll, pd2);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType1);
  EXPECT_EQ(bind(mw, mr, base(), 64, kAccessRemoteRead, 0), WcStatus::kMwBindErr);
}

// ------------------------------------------------------------------ memory access

TEST(DirectMemAccess, CopiesAndAtomics) {
  DirectMemAccess m;
  alignas(8) uint64_t word = 5;
  uint8_t src[4] = {1, 2, 3, 4}, dst[4] = {};
  ASSERT_TRUE(m.write(reinterpret_cast<uint64_t>(dst), src, 4));
  EXPECT_EQ(std::memcmp(src, dst, 4), 0);
  uint8_t back[4];
  ASSERT_TRUE(m.read(reinterpret_cast<uint64_t>(dst), back, 4));
  EXPECT_EQ(std::memcmp(src, back, 4), 0);
  uint64_t orig = 0;
  const auto a = reinterpret_cast<uint64_t>(&word);
  ASSERT_TRUE(m.atomic_faa64(a, 10, &orig));
  EXPECT_EQ(orig, 5u);
  EXPECT_EQ(word, 15u);
  ASSERT_TRUE(m.atomic_cas64(a, 99, 1, &orig));  // compare fails
  EXPECT_EQ(orig, 15u);
  EXPECT_EQ(word, 15u);
  ASSERT_TRUE(m.atomic_cas64(a, 15, 1, &orig));
  EXPECT_EQ(orig, 15u);
  EXPECT_EQ(word, 1u);
  ASSERT_TRUE(m.atomic_write64(a, 77));
  EXPECT_EQ(word, 77u);
  EXPECT_FALSE(m.atomic_faa64(a + 1, 1, &orig));  // misaligned refused
}

}  // namespace
}  // namespace rnic::emu
