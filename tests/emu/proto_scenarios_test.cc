// tests/emu/proto_scenarios_test.cc: the conformance scenarios of docs/scenarios.md
// (S01-S17 protection, S21-S30 reliability) as named tests. Two devices C (client,
// 127.0.0.2) and S (server, 127.0.0.3) on an in-memory network, RC, path MTU 1024,
// timeout 14, retry_cnt 7, rnr_retry 7 unless stated. Driven by hand: packets move on
// pump(), timers fire on fire_timers(), faults come from a packet filter on a port, so every
// run is deterministic. Each test checks statuses, QP states, counters and memory.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>

#include "emu/objects/mw.h"
#include "emu/transport/req.h"
#include "tests/emu/proto_util.h"
#include "wire/byteorder.h"
#include "wire/port.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;
namespace aeth = wire::aeth;

// A programmable packet filter (the port's fault hook).
struct TestFilter : wire::PacketFilter {
  using Fn = std::function<wire::Verdict(wire::Direction, const wire::Endpoint&,
                                         const wire::Endpoint&, std::span<uint8_t>,
                                         wire::FilterOut&)>;
  std::mutex mu;
  Fn fn;
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint& src, const wire::Endpoint& dst,
                          std::span<uint8_t> roce, wire::FilterOut& out) override {
    std::lock_guard lk(mu);
    return fn ? fn(dir, src, dst, roce, out) : wire::Verdict::kPass;
  }
};
uint8_t opcode_of(std::span<const uint8_t> r) { return r[0]; }
uint32_t psn_of(std::span<const uint8_t> r) { return wire::load_be24(r.data() + 9); }
bool is_request(std::span<const uint8_t> r) { return wire::opcode_info(r[0]).mask & wire::kReqMask; }
void fix_icrc(const wire::Endpoint& src, const wire::Endpoint& dst, std::span<uint8_t> r) {
  wire::IpUdpMeta m = wire::meta_between(src, dst);
  uint32_t icrc = wire::icrc_compute(m, r.first(r.size() - 4));
  wire::store_le32(r.data() + r.size() - 4, icrc);
}

class Scenario : public ::testing::Test {
 protected:
  wire::MemNetwork net;
  Node c = Node::on_mem(net, "127.0.0.2");
  Node s = Node::on_mem(net, "127.0.0.3");
  std::shared_ptr<Qp> qc, qs;
  GuardedBuf lbuf{64 * 1024}, tbuf{64 * 1024}, rbuf{64 * 1024};
  std::shared_ptr<Mr> ml, mt, mr;
  TestFilter cf, sf;  // on C's and S's ports

  void SetUp() override {
    lbuf.pattern(1);
    tbuf.pattern(2);
    ml = c.mr(lbuf.data(), lbuf.n);
    mt = s.mr(tbuf.data(), tbuf.n, kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                                       kAccessRemoteAtomic | kAccessMwBind);
    mr = s.mr(rbuf.data(), rbuf.n);
    // Refused when the hook is compiled out; the S21-S29 cases that use it skip then.
    ASSERT_EQ(c.eng->port().set_filter(&cf), wire::kFaultInjection);
    ASSERT_EQ(s.eng->port().set_filter(&sf), wire::kFaultInjection);
  }
  void TearDown() override {
    c.eng->port().set_filter(nullptr);
    s.eng->port().set_filter(nullptr);
  }
  void connect(ConnOpts o = {}) {
    qc = c.qp(QpType::kRc);
    qs = s.qp(QpType::kRc);
    connect_pair(c, qc, s, qs, o);
  }
  // Moves packets (and held/reordered ones) until nothing moves.
  void run() {
    for (int i = 0; i < 100000; ++i) {
      int moved = c.eng->port().release_held() + s.eng->port().release_held();
      moved += c.eng->poll_rx() + s.eng->poll_rx();
      if (moved == 0) return;
    }
  }
  void fire_timers() {
    uint64_t far = wire::monotonic_ns() + 3'600'000'000'000ull;
    c.eng->run_timers(far);
    s.eng->run_timers(far);
    run();
  }
  Status write(uint64_t id, uint64_t va, uint32_t len, uint32_t rkey, size_t loff = 0,
               const std::shared_ptr<Qp>& q = nullptr) {
    Wr w = send_wr(WrOpcode::kRdmaWrite, id, {sge(lbuf.data() + loff, len, ml)});
    w.rdma.remote_addr = va;
    w.rdma.rkey = rkey;
    return post(q ? q : qc, w);
  }
  Status read(uint64_t id, uint64_t va, uint32_t len, uint32_t rkey) {
    Wr w = send_wr(WrOpcode::kRdmaRead, id, {sge(lbuf.data(), len, ml)});
    w.rdma.remote_addr = va;
    w.rdma.rkey = rkey;
    return post(qc, w);
  }
  Status atomic(WrOpcode opc, uint64_t id, uint64_t va, uint32_t rkey, uint64_t add_or_cmp,
                uint64_t swap = 0) {
    Wr w = send_wr(opc, id, {sge(lbuf.data(), 8, ml)});
    w.atomic.remote_addr = va;
    w.atomic.rkey = rkey;
    w.atomic.compare_add = add_or_cmp;
    w.atomic.swap = swap;
    return post(qc, w);
  }
  uint64_t tva(size_t off = 0) { return reinterpret_cast<uint64_t>(tbuf.data() + off); }
  std::vector<uint8_t> snapshot() { return std::vector<uint8_t>(tbuf.mem.begin(), tbuf.mem.end()); }
  bool unchanged(const std::vector<uint8_t>& before) { return before == tbuf.mem; }
  // Expect one C completion with `st`; if the QP failed, every later WR flushes.
  void expect_err_and_flush(WcStatus st) {
    ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 999, {})).is_ok());
    run();
    auto cq = drain_cq(*c.scq);
    ASSERT_EQ(cq.size(), 2u);
    EXPECT_EQ(cq[0].status, st) << wc_status_name(cq[0].status);
    EXPECT_EQ(cq[1].wr_id, 999u);
    EXPECT_EQ(cq[1].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(qc->state(), QpState::kErr);
  }
  uint64_t sctr(Ctr k) { return qs->comp_.ctr.get(k); }
  uint64_t cctr(Ctr k) { return qc->comp_.ctr.get(k); }
};

// ============================== protection (S01-S17) ==============================

TEST_F(Scenario, S01_WriteWithRkeyPlusOne) {
  connect();
  auto before = snapshot();
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey() + 1).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_EQ(sctr(Ctr::kRemAccessNakSent), 1u);
  EXPECT_EQ(cctr(Ctr::kRemAccessNakRcvd), 1u);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S02_WriteWithRkeyOfMrInAnotherPd) {
  connect();
  auto pd2 = *s.dev->alloc_pd();
  GuardedBuf other(4096);
  auto m2 = s.mr(other.data(), other.n, kAccessLocalWrite | kAccessRemoteWrite, pd2);
  std::vector<uint8_t> before(other.mem);
  ASSERT_TRUE(write(1, reinterpret_cast<uint64_t>(other.data()), 100, m2->rkey()).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(before, other.mem);
}

TEST_F(Scenario, S03_MrLacksTheRight) {
  struct Case {
    uint32_t access;
    int op;  // 0 write, 1 read, 2 faa
  };
  for (Case k : {Case{kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteAtomic, 0},
                 Case{kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteAtomic, 1},
                 Case{kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead, 2}}) {
    connect();
    GuardedBuf t(4096);
    auto m = s.mr(t.data(), t.n, k.access);
    std::vector<uint8_t> before(t.mem);
    uint64_t va = reinterpret_cast<uint64_t>(t.data());
    Status st = k.op == 0   ? write(1, va, 64, m->rkey())
                : k.op == 1 ? read(1, va, 64, m->rkey())
                            : atomic(WrOpcode::kAtomicFetchAndAdd, 1, va, m->rkey(), 1);
    ASSERT_TRUE(st.is_ok());
    run();
    auto cq = drain_cq(*c.scq);
    ASSERT_EQ(cq.size(), 1u) << "case " << k.op;
    EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr) << "case " << k.op;
    EXPECT_EQ(before, t.mem);
    drain_cq(*s.rcq);
  }
}

TEST_F(Scenario, S04_QpAccessFlagsLackTheRight) {
  ConnOpts o;
  o.access = kAccessLocalWrite;  // no remote rights on the QPs
  connect(o);
  auto before = snapshot();
  ASSERT_TRUE(write(1, tva(), 64, mt->rkey()).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemInvReqErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S05_WriteOneBytePastEndOrBeforeStart) {
  connect();
  auto before = snapshot();
  // 2049 bytes (3 packets) ending one byte past the MR: the first two packets are in range.
  ASSERT_TRUE(write(1, tva(tbuf.n - 2048), 2049, mt->rkey()).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_TRUE(unchanged(before));
  EXPECT_TRUE(tbuf.guards_ok());
  // VA one byte before the start.
  connect();
  ASSERT_TRUE(write(1, tva() - 1, 100, mt->rkey()).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S06_WrappingVa) {
  // (RETH length > 2^31 cannot be posted through verbs; RespTest.DmaLengthAbove2GNaks-
  // InvalidRequest sends it by hand and expects Invalid Request.)
  connect();
  auto before = snapshot();
  ASSERT_TRUE(write(1, ~uint64_t{0} - 15, 64, mt->rkey()).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S07_ZeroLengthWithGarbageRkey) {
  connect();
  auto before = snapshot();
  ASSERT_TRUE(write(1, 0xdeadbeef00, 0, 0x12345678).is_ok());
  ASSERT_TRUE(read(2, 0xfeedface00, 0, 0x87654321).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 2u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(cq[1].status, WcStatus::kSuccess);
  EXPECT_EQ(qc->state(), QpState::kRts);
  EXPECT_EQ(qs->state(), QpState::kRts);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S08_MisalignedAtomic) {
  connect();
  auto before = snapshot();
  ASSERT_TRUE(atomic(WrOpcode::kAtomicFetchAndAdd, 1, tva(9), mt->rkey(), 1).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemInvReqErr);
  EXPECT_TRUE(unchanged(before));
  connect();
  ASSERT_TRUE(atomic(WrOpcode::kAtomicCmpAndSwp, 1, tva(12), mt->rkey(), 0, 1).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kRemInvReqErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S09_LocalSgeBadLkeyOrOutOfRange) {
  connect();
  // Range outside the MR: no packet leaves, LOC_PROT_ERR, ERR + flush.
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(lbuf.data() + lbuf.n - 10, 20, ml)});
  w.rdma.remote_addr = tva();
  w.rdma.rkey = mt->rkey();
  ASSERT_TRUE(post(qc, w).is_ok());
  EXPECT_EQ(cctr(Ctr::kSentPkts), 0u);
  run();
  expect_err_and_flush(WcStatus::kLocProtErr);
  EXPECT_EQ(cctr(Ctr::kSentPkts), 0u);
  EXPECT_EQ(qs->state(), QpState::kRts);
  // Unknown lkey: spec mode reports LOC_PROT_ERR too (rxe mode: LOC_QP_OP_ERR).
  connect();
  Wr w2 = send_wr(WrOpcode::kSend, 1, {Sge{reinterpret_cast<uint64_t>(lbuf.data()), 8, 0xbad00}});
  ASSERT_TRUE(post(qc, w2).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kLocProtErr);
}

TEST_F(Scenario, S10_ReceiveWqeInAnotherPd) {
  connect();
  auto pd2 = *s.dev->alloc_pd();
  GuardedBuf other(4096);
  auto m2 = s.mr(other.data(), other.n, kAccessLocalWrite, pd2);
  ASSERT_TRUE(post_recv(qs, 5, {sge(other.data(), 4096, m2)}).is_ok());
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 100, ml)})).is_ok());
  run();
  auto rq = drain_cq(*s.rcq);
  ASSERT_EQ(rq.size(), 1u);
  EXPECT_EQ(rq[0].wr_id, 5u);
  EXPECT_EQ(rq[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  expect_err_and_flush(WcStatus::kRemOpErr);
}

TEST_F(Scenario, S11_SendLongerThanReceiveBuffer) {
  connect();
  ASSERT_TRUE(post_recv(qs, 5, {sge(rbuf.data(), 1000, mr)}).is_ok());
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 3000, ml)})).is_ok());
  run();
  auto rq = drain_cq(*s.rcq);
  ASSERT_EQ(rq.size(), 1u);
  EXPECT_EQ(rq[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  expect_err_and_flush(WcStatus::kRemInvReqErr);
}

// Binds mw on qp (through a BIND_MW WQE) over [va, va+len) of MR m; returns the new rkey.
uint32_t bind_mw_wr(Node& n, const std::shared_ptr<Qp>& qp, const std::shared_ptr<Mw>& mw,
              const std::shared_ptr<Mr>& m, uint64_t va, uint64_t len, uint32_t access,
              uint8_t key_byte, WcStatus expect = WcStatus::kSuccess) {
  Wr b = send_wr(WrOpcode::kBindMw, 77, {});
  b.bind_mw.mw_rkey = mw->rkey();
  b.bind_mw.new_rkey = (mw->rkey() & ~0xffu) | key_byte;
  b.bind_mw.mr_lkey = m ? m->lkey() : 0;
  b.bind_mw.addr = va;
  b.bind_mw.length = len;
  b.bind_mw.access = access;
  EXPECT_TRUE(post(qp, b).is_ok());
  auto cq = drain_cq(*n.scq);
  EXPECT_EQ(cq.size(), 1u);
  if (!cq.empty()) {
    EXPECT_EQ(cq[0].status, expect) << wc_status_name(cq[0].status);
    EXPECT_EQ(cq[0].opcode, WcOpcode::kBindMw);
  }
  return b.bind_mw.new_rkey;
}

TEST_F(Scenario, S12_Type1MwBindWriteUnbindWrite) {
  connect();
  auto mw = *s.dev->alloc_mw(s.pd, MwType::kType1);
  uint32_t rk = bind_mw_wr(s, qs, mw, mt, tva(256), 512, kAccessRemoteWrite, 0x31);
  ASSERT_TRUE(write(1, tva(256), 100, rk).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(tbuf.data() + 256, lbuf.data(), 100));
  // Bind with length 0 = unbind (type 1).
  uint32_t rk2 = bind_mw_wr(s, qs, mw, nullptr, 0, 0, 0, 0x32);
  auto before = snapshot();
  ASSERT_TRUE(write(2, tva(256), 100, rk2, 500).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S13_Type2MwBoundToAnotherQpOfSamePd) {
  connect();
  // Second connection C.qc1 <-> S.qs1, same PDs.
  auto qc1 = c.qp(QpType::kRc);
  auto qs1 = s.qp(QpType::kRc);
  connect_pair(c, qc1, s, qs1);
  auto mw = *s.dev->alloc_mw(s.pd, MwType::kType2);
  uint32_t rk = bind_mw_wr(s, qs, mw, mt, tva(0), 1024, kAccessRemoteWrite, 0x51);
  auto before = snapshot();
  ASSERT_TRUE(write(1, tva(0), 64, rk, 0, qc1).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(qc1->state(), QpState::kErr);
  EXPECT_EQ(qs1->state(), QpState::kErr);
  EXPECT_TRUE(unchanged(before));
  // QP0 traffic is unaffected.
  ASSERT_TRUE(write(2, tva(0), 64, rk).is_ok());
  run();
  cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(qc->state(), QpState::kRts);
}

TEST_F(Scenario, S14_Type2MwInvalidatedThenWrite) {
  for (int how = 0; how < 3; ++how) {
    connect();
    auto mw = *s.dev->alloc_mw(s.pd, MwType::kType2);
    uint32_t rk = bind_mw_wr(s, qs, mw, mt, tva(0), 1024, kAccessRemoteWrite, 0x61);
    if (how == 0) {  // LOCAL_INV on S
      Wr inv = send_wr(WrOpcode::kLocalInv, 3, {});
      inv.invalidate_rkey = rk;
      ASSERT_TRUE(post(qs, inv).is_ok());
      auto cq = drain_cq(*s.scq);
      ASSERT_EQ(cq.size(), 1u);
      EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
    } else if (how == 1) {  // SEND_WITH_INV from C
      ASSERT_TRUE(post_recv(qs, 8, {sge(rbuf.data(), 64, mr)}).is_ok());
      Wr si = send_wr(WrOpcode::kSendWithInv, 4, {sge(lbuf.data(), 16, ml)});
      si.invalidate_rkey = rk;
      ASSERT_TRUE(post(qc, si).is_ok());
      run();
      auto rq = drain_cq(*s.rcq);
      ASSERT_EQ(rq.size(), 1u);
      EXPECT_EQ(rq[0].status, WcStatus::kSuccess);
      EXPECT_TRUE(rq[0].wc_flags & kWcWithInv);
      EXPECT_EQ(rq[0].imm_data, rk);  // invalidated_rkey
      auto cq = drain_cq(*c.scq);
      ASSERT_EQ(cq.size(), 1u);
      EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
    } else {  // dealloc
      ASSERT_TRUE(s.dev->dealloc_mw(mw).is_ok());
    }
    auto before = snapshot();
    ASSERT_TRUE(write(1, tva(0), 64, rk).is_ok());
    run();
    auto cq = drain_cq(*c.scq);
    ASSERT_EQ(cq.size(), 1u) << "how " << how;
    EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr) << "how " << how;
    EXPECT_TRUE(unchanged(before));
  }
}

TEST_F(Scenario, S15_BindErrors) {
  // (a) Type 2 MW not FREE (already bound).
  connect();
  auto mw = *s.dev->alloc_mw(s.pd, MwType::kType2);
  uint32_t rk = bind_mw_wr(s, qs, mw, mt, tva(0), 1024, kAccessRemoteWrite, 0x71);
  bind_mw_wr(s, qs, mw, mt, tva(0), 1024, kAccessRemoteWrite, 0x72, WcStatus::kMwBindErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(mw->view().rkey, rk);  // the old rkey keeps its validity
  EXPECT_EQ(mw->view().state, MwState::kValid);
  // (b) MR without MW_BIND.
  connect();
  auto mw2 = *s.dev->alloc_mw(s.pd, MwType::kType2);
  bind_mw_wr(s, qs, mw2, mr, reinterpret_cast<uint64_t>(rbuf.data()), 64, kAccessRemoteRead, 0x11,
       WcStatus::kMwBindErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  // (c) Remote-write window on an MR without LOCAL_WRITE.
  connect();
  GuardedBuf ro(4096);
  auto mro = s.mr(ro.data(), ro.n, kAccessRemoteRead | kAccessMwBind);
  auto mw3 = *s.dev->alloc_mw(s.pd, MwType::kType2);
  bind_mw_wr(s, qs, mw3, mro, reinterpret_cast<uint64_t>(ro.data()), 64, kAccessRemoteWrite, 0x12,
       WcStatus::kMwBindErr);
  // (d) Window outside the MR.
  connect();
  bind_mw_wr(s, qs, mw3, mt, tva(tbuf.n - 10), 64, kAccessRemoteWrite, 0x13, WcStatus::kMwBindErr);
  // ERR + flush of a WR behind the failed bind.
  connect();
  Wr b = send_wr(WrOpcode::kBindMw, 1, {});
  b.bind_mw.mw_rkey = mw3->rkey() ^ 0x1;  // stale mw_rkey
  b.bind_mw.mr_lkey = mt->lkey();
  b.bind_mw.addr = tva(0);
  b.bind_mw.length = 64;
  b.bind_mw.access = kAccessRemoteRead;
  drain_cq(*s.scq);
  ASSERT_TRUE(post(qs, b).is_ok());
  ASSERT_TRUE(post(qs, send_wr(WrOpcode::kSend, 2, {})).is_ok());
  auto cq = drain_cq(*s.scq);
  ASSERT_EQ(cq.size(), 2u);
  EXPECT_EQ(cq[0].status, WcStatus::kMwBindErr);
  EXPECT_EQ(cq[1].status, WcStatus::kWrFlushErr);
}

TEST_F(Scenario, S16_SendWithInvalidateOfWrongObject) {
  auto mw1 = *s.dev->alloc_mw(s.pd, MwType::kType1);
  for (int how = 0; how < 3; ++how) {
    connect();
    uint32_t key = how == 0 ? mw1->rkey() : how == 1 ? mt->rkey() : 0xabcdef00;
    ASSERT_TRUE(post_recv(qs, 8, {sge(rbuf.data(), 64, mr)}).is_ok());
    Wr si = send_wr(WrOpcode::kSendWithInv, 4, {sge(lbuf.data(), 16, ml)});
    si.invalidate_rkey = key;
    ASSERT_TRUE(post(qc, si).is_ok());
    run();
    auto rq = drain_cq(*s.rcq);
    ASSERT_EQ(rq.size(), 1u) << "how " << how;
    EXPECT_EQ(rq[0].status, WcStatus::kRemInvReqErr);
    EXPECT_EQ(qs->state(), QpState::kErr);
    // rxe: no NAK for Class J; the requester sees success.
    auto cq = drain_cq(*c.scq);
    ASSERT_EQ(cq.size(), 1u);
    EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
    EXPECT_EQ(mt->view().state, MrState::kValid);  // nothing invalidated
  }
}

TEST_F(Scenario, S17_DeregWhileMwBoundThenStaleRkey) {
  connect();
  GuardedBuf t(4096);
  auto m = s.mr(t.data(), t.n, kAccessLocalWrite | kAccessRemoteWrite | kAccessMwBind);
  auto mw = *s.dev->alloc_mw(s.pd, MwType::kType2);
  bind_mw_wr(s, qs, mw, m, reinterpret_cast<uint64_t>(t.data()), 128, kAccessRemoteWrite, 0x21);
  EXPECT_FALSE(s.dev->dereg_mr(m).is_ok());  // EBUSY while the window is bound
  ASSERT_TRUE(s.dev->dealloc_mw(mw).is_ok());
  uint32_t old = m->rkey();
  ASSERT_TRUE(s.dev->dereg_mr(m).is_ok());
  auto m2 = s.mr(t.data(), t.n, kAccessLocalWrite | kAccessRemoteWrite);
  std::vector<uint8_t> before(t.mem);
  ASSERT_TRUE(write(1, reinterpret_cast<uint64_t>(t.data()), 64, old).is_ok());
  run();
  if (m2->rkey() == old) GTEST_SKIP() << "key reissued identically (2^-8 chance)";
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(before, t.mem);
}

// ============================== reliability (S21-S30) ==============================

TEST_F(Scenario, S21_DropFirstPacketOfMultiPacketWriteRecoversByNak) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 2) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  // A first WRITE in order (S learns the UDP port C's requests come from), then the 3-packet
  // one whose first packet is lost.
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  run();
  ASSERT_EQ(drain_cq(*c.scq).size(), 1u);
  ASSERT_TRUE(write(1, tva(), 3000, mt->rkey()).is_ok());
  run();
  // PSN+1 and PSN+2 arrive first: one PSN NAK, no timeout needed. S keeps both (its stash,
  // docs/congestion.md §2); C resends PSN alone; S executes it and the two kept packets.
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sctr(Ctr::kOutOfSeqRequest), 2u);
  EXPECT_EQ(sctr(Ctr::kNakSent), 1u);
  EXPECT_EQ(sctr(Ctr::kStashReplayed), 2u);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 1u);
  EXPECT_EQ(cctr(Ctr::kCompleterRetryErr), 0u);  // no go-back: no retry spent
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 3000));
}

// The same against an in-order responder (ConnectX, rxe; SOFTRNIC_RC_STASH=0): it discards
// PSN+1 and PSN+2; C's resend of PSN is answered with exactly PSN, and C goes back N.
TEST_F(Scenario, S21_DropFirstPacketOfMultiPacketWriteInOrderResponderGoesBackN) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  s.dev->set_rc_stash(false);
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 1) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 3000, mt->rkey()).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sctr(Ctr::kOutOfSeqRequest), 2u);
  EXPECT_EQ(sctr(Ctr::kNakSent), 1u);
  EXPECT_EQ(sctr(Ctr::kStashStored), 0u);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 3u);
  EXPECT_EQ(cctr(Ctr::kCompleterRetryErr), 1u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 3000));
}

TEST_F(Scenario, S21_DropFirstRequestPacketOfWrite) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 1) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  run();
  EXPECT_EQ(drain_cq(*c.scq).size(), 0u);
  fire_timers();  // timeout -> retransmit
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(cctr(Ctr::kCompleterRetryErr), 1u);
  EXPECT_EQ(cctr(Ctr::kLocalAckTimeoutErr), 1u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 100));
}

TEST_F(Scenario, S22_DropMiddlePacketOf16PacketWrite) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 7) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 16 * 1024, mt->rkey()).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sctr(Ctr::kOutOfSeqRequest), 9u);  // packets 8..16 arrive early
  EXPECT_EQ(sctr(Ctr::kNakSent), 1u);         // but only one NAK
  EXPECT_EQ(cctr(Ctr::kRcvdSeqErr), 1u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
  EXPECT_TRUE(tbuf.guards_ok());
}

TEST_F(Scenario, S23_DropTheAck) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  int n = 0;
  sf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && opcode_of(r) == op::kRcAcknowledge && ++n == 1)
      return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(post_recv(qs, 5, {sge(rbuf.data(), 4096, mr)}).is_ok());
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 100, ml)})).is_ok());
  run();
  EXPECT_EQ(drain_cq(*c.scq).size(), 0u);
  fire_timers();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sctr(Ctr::kDuplicateRequest), 1u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);  // executed once
}

TEST_F(Scenario, S24_DuplicateFaaAndWritePacket) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  uint64_t* word = reinterpret_cast<uint64_t*>(tbuf.data() + 128);
  *word = 100;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, wire::FilterOut& out) {
    if (d == wire::Direction::kTx && is_request(r)) {
      out.copies = 1;
      return wire::Verdict::kDuplicate;
    }
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(atomic(WrOpcode::kAtomicFetchAndAdd, 1, tva(128), mt->rkey(), 5).is_ok());
  run();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(*word, 105u);  // exactly once
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(lbuf.data()), 100u);
  EXPECT_EQ(sctr(Ctr::kDuplicateRequest), 1u);
  // A duplicated WRITE packet is re-ACKed, not re-applied (the memory changes in between).
  ASSERT_TRUE(write(2, tva(0), 64, mt->rkey(), 1000).is_ok());
  run();
  EXPECT_EQ(drain_cq(*c.scq).size(), 1u);
  EXPECT_EQ(sctr(Ctr::kDuplicateRequest), 2u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data() + 1000, 64));
}

TEST_F(Scenario, S25_DropReadResponseAndItsRetransmission) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  for (int retry_cnt : {7, 1}) {
    ConnOpts o;
    o.retry_cnt = static_cast<uint8_t>(retry_cnt);
    connect(o);
    int mid = 0;
    sf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
      // Drop the response for PSN 101 (second of three) twice: the original and iter=2.
      if (d == wire::Direction::kTx && opcode_of(r) != op::kRcAcknowledge &&
          (wire::opcode_info(opcode_of(r)).mask & wire::kAckMask) && psn_of(r) == 101 &&
          mid++ < 2)
        return wire::Verdict::kDrop;
      return wire::Verdict::kPass;
    };
    std::memset(lbuf.data(), 0, 3000);
    ASSERT_TRUE(read(1, tva(), 3000, mt->rkey()).is_ok());
    run();
    fire_timers();
    fire_timers();
    auto cq = drain_cq(*c.scq);
    ASSERT_EQ(cq.size(), 1u) << "retry_cnt " << retry_cnt;
    if (retry_cnt == 7) {
      EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
      EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 3000));
      EXPECT_EQ(cctr(Ctr::kCompleterRetryErr), 2u);
      EXPECT_GE(sctr(Ctr::kDuplicateRequest), 2u);  // re-requested READs replayed
    } else {
      EXPECT_EQ(cq[0].status, WcStatus::kRetryExcErr);
      EXPECT_EQ(qc->state(), QpState::kErr);
    }
    sf.fn = nullptr;
  }
}

TEST_F(Scenario, S26_SwapTwoConsecutiveRequestPackets) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  // In-order reference run.
  connect();
  ASSERT_TRUE(write(1, tva(), 4096, mt->rkey()).is_ok());
  run();
  auto ref_cq = drain_cq(*c.scq);
  auto ref_mem = snapshot();
  // Reordered run: hold PSN 101 until the next packet has passed.
  tbuf.pattern(2);
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, wire::FilterOut& out) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 2) {
      out.delay_us = 0;
      return wire::Verdict::kDelay;
    }
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 4096, mt->rkey()).is_ok());
  run();
  fire_timers();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), ref_cq.size());
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(cq[0].wr_id, ref_cq[0].wr_id);
  EXPECT_EQ(snapshot(), ref_mem);
  EXPECT_EQ(sctr(Ctr::kNakSent), 1u);
  EXPECT_EQ(cctr(Ctr::kRcvdSeqErr), 1u);
}

TEST_F(Scenario, S27_PayloadBitFlipWithoutIcrcFix) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  int n = 0;
  cf.fn = [&](wire::Direction d, auto&, auto&, std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 1) r[r.size() - 10] ^= 0x04;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  run();
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 1u);
  EXPECT_EQ(sctr(Ctr::kNakSent), 0u);
  EXPECT_EQ(drain_cq(*c.scq).size(), 0u);
  fire_timers();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 100));
}

TEST_F(Scenario, S28_RkeyRewrittenInFlightWithIcrcFixed) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  connect();
  auto before = snapshot();
  cf.fn = [&](wire::Direction d, const wire::Endpoint& src, const wire::Endpoint& dst,
              std::span<uint8_t> r, auto&) {
    if (d == wire::Direction::kTx && opcode_of(r) == op::kRcRdmaWriteOnly) {
      wire::Reth reth(r.data() + wire::kBthBytes);
      reth.set_rkey(reth.rkey() + 1);
      fix_icrc(src, dst, r);
    }
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  run();
  expect_err_and_flush(WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 0u);
  EXPECT_TRUE(unchanged(before));
}

TEST_F(Scenario, S29_Blackhole) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  ConnOpts o;
  o.retry_cnt = 3;
  connect(o);
  cf.fn = [&](wire::Direction d, auto&, auto&, auto, auto&) {
    return d == wire::Direction::kTx ? wire::Verdict::kDrop : wire::Verdict::kPass;
  };
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  ASSERT_TRUE(write(2, tva(), 100, mt->rkey()).is_ok());
  run();
  int expiries = 0;
  while (drain_cq(*c.scq).empty() && expiries < 10) {
    fire_timers();
    ++expiries;
    if (qc->state() == QpState::kErr) break;
  }
  EXPECT_EQ(expiries, 4);  // retry_cnt retransmissions, then the error: (retry_cnt+1) timeouts
  EXPECT_EQ(qc->state(), QpState::kErr);
  EXPECT_EQ(qs->state(), QpState::kRts);
  EXPECT_EQ(cctr(Ctr::kRetryExceededErr), 1u);
  EXPECT_EQ(cctr(Ctr::kCompleterRetryErr), 3u);
}

TEST_F(Scenario, S29b_BlackholeCompletionStatuses) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  ConnOpts o;
  o.retry_cnt = 2;
  connect(o);
  cf.fn = [&](wire::Direction, auto&, auto&, auto, auto&) { return wire::Verdict::kDrop; };
  ASSERT_TRUE(write(1, tva(), 100, mt->rkey()).is_ok());
  ASSERT_TRUE(write(2, tva(), 100, mt->rkey()).is_ok());
  for (int i = 0; i < 3; ++i) fire_timers();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 2u);
  EXPECT_EQ(cq[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(cq[1].status, WcStatus::kWrFlushErr);
}

TEST_F(Scenario, S30_RnrThenPostAfterThreeNaks) {
  connect();
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 100, ml)})).is_ok());
  run();
  for (int i = 0; i < 2; ++i) fire_timers();  // two more RNR NAKs
  EXPECT_EQ(sctr(Ctr::kSendRnrErr), 3u);
  EXPECT_EQ(cctr(Ctr::kRcvdRnrErr), 3u);
  ASSERT_TRUE(post_recv(qs, 5, {sge(rbuf.data(), 4096, mr)}).is_ok());
  fire_timers();
  auto cq = drain_cq(*c.scq);
  ASSERT_EQ(cq.size(), 1u);
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sctr(Ctr::kSendRnrErr), 3u);
  EXPECT_EQ(cctr(Ctr::kRcvdRnrErr), 3u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);
}

TEST_F(Scenario, S30b_RnrRetryExhausted) {
  ConnOpts o;
  o.rnr_retry = 2;
  connect(o);
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 100, ml)})).is_ok());
  run();
  for (int i = 0; i < 5 && drain_cq(*c.scq).empty(); ++i) fire_timers();
  EXPECT_EQ(qc->state(), QpState::kErr);
  EXPECT_EQ(cctr(Ctr::kRnrNakRetryErr), 1u);
  EXPECT_EQ(sctr(Ctr::kSendRnrErr), 3u);
}

}  // namespace
}  // namespace rnic::emu::test
