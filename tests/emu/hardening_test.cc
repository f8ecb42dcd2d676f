// tests/emu/hardening_test: retrans_pkts accounting (go-back-N and timeout retransmits), S19
// (rkey re-checked per packet: deregistration in the middle of a multi-packet WRITE / READ
// stops the rest), S20 (ODP: first touch, just outside, an unmapped page), and SOFTRNIC_FAULT_TRACE without a plan. Two devices
// on an in-memory network driven by hand (deterministic), like proto_scenarios_test.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "emu/fault/fault.h"
#include "emu/objects/memory.h"
#include "tests/emu/proto_util.h"
#include "wire/byteorder.h"
#include "wire/port.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;

struct FnFilter : wire::PacketFilter {
  using Fn = std::function<wire::Verdict(wire::Direction, std::span<uint8_t>)>;
  std::mutex mu;
  Fn fn;
  wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint&, const wire::Endpoint&,
                          std::span<uint8_t> roce, wire::FilterOut&) override {
    std::lock_guard lk(mu);
    return fn ? fn(dir, roce) : wire::Verdict::kPass;
  }
};
bool is_request(std::span<const uint8_t> r) { return wire::opcode_info(r[0]).mask & wire::kReqMask; }

// Direct memory access that runs `hook` right after the n-th read (or write) inside [lo, hi):
// the invalidation point falls between two packets of one message.
struct HookedMem final : MemAccess {
  DirectMemAccess d;
  uint64_t lo = 0, hi = 0;
  int reads = 0, writes = 0, fire_read = -1, fire_write = -1;
  std::function<void()> hook;
  bool in(uint64_t a) const { return a >= lo && a < hi; }
  bool read(uint64_t a, void* dst, size_t len) override {
    bool ok = d.read(a, dst, len);
    if (in(a) && ++reads == fire_read && hook) hook();
    return ok;
  }
  bool write(uint64_t a, const void* src, size_t len) override {
    bool ok = d.write(a, src, len);
    if (in(a) && ++writes == fire_write && hook) hook();
    return ok;
  }
  bool atomic_cas64(uint64_t a, uint64_t c, uint64_t s, uint64_t* o) override {
    return d.atomic_cas64(a, c, s, o);
  }
  bool atomic_faa64(uint64_t a, uint64_t v, uint64_t* o) override { return d.atomic_faa64(a, v, o); }
  bool atomic_write64(uint64_t a, uint64_t v) override { return d.atomic_write64(a, v); }
};

class Hardening : public ::testing::Test {
 protected:
  wire::MemNetwork net;
  Node c = Node::on_mem(net, "127.0.0.2");
  Node s = Node::on_mem(net, "127.0.0.3");
  std::shared_ptr<Qp> qc, qs;
  GuardedBuf lbuf{64 * 1024}, tbuf{64 * 1024};
  std::shared_ptr<Mr> ml, mt;
  FnFilter cf, sf;

  void SetUp() override {
    lbuf.pattern(1);
    tbuf.pattern(2);
    ml = c.mr(lbuf.data(), lbuf.n);
    mt = s.mr(tbuf.data(), tbuf.n);
    c.eng->port().set_filter(&cf);
    s.eng->port().set_filter(&sf);
    qc = c.qp(QpType::kRc);
    qs = s.qp(QpType::kRc);
    connect_pair(c, qc, s, qs, ConnOpts{});  // MTU 1024
  }
  void TearDown() override {
    c.eng->port().set_filter(nullptr);
    s.eng->port().set_filter(nullptr);
  }
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
  Status post_rw(WrOpcode o, uint64_t id, uint32_t len) {
    Wr w = send_wr(o, id, {sge(lbuf.data(), len, ml)});
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(tbuf.data());
    w.rdma.rkey = mt->rkey();
    return post(qc, w);
  }
  // The status of C's one send completion (kGeneralErr, and a failure, if not exactly one).
  WcStatus only_send_status() {
    auto cq = drain_cq(*c.scq);
    EXPECT_EQ(cq.size(), 1u) << "C's send completions";
    return cq.size() == 1 ? cq[0].status : WcStatus::kGeneralErr;
  }
  // The offset into b's data of its first byte at or after `from` (the tail guard included)
  // that differs from `before` (a copy of b.mem); -1 if none.
  static long first_change(const GuardedBuf& b, const std::vector<uint8_t>& before, size_t from) {
    const size_t g = GuardedBuf::kGuard;
    for (size_t i = g + from; i < b.mem.size(); ++i)
      if (b.mem[i] != before[i]) return static_cast<long>(i - g);
    return -1;
  }
  // A 16 KiB READ of S's MR (a new pattern) into C's, expected to complete whole.
  void read_16k_whole(uint64_t id) {
    tbuf.pattern(3);
    ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, id, 16 * 1024).is_ok());
    run();
    EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
    EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
  }
  uint64_t cctr(Ctr k) { return qc->comp_.ctr.get(k); }
  uint64_t sctr(Ctr k) { return qs->comp_.ctr.get(k); }
};

// retrans_pkts: dropping request packet 7 of a 16-packet WRITE makes S NAK (PSN sequence).
// S here is an in-order responder (SOFTRNIC_RC_STASH=0, as ConnectX and rxe): C resends
// packet 7 alone, S answers exactly it, and C goes back N from packet 8: 7..16 are sent
// again (10). (With S's stash only packet 7 goes again: RetransPktsCountsTheSelectiveResend.)
TEST_F(Hardening, RetransPktsCountsGoBackN) {
  s.dev->set_rc_stash(false);
  // The drop comes from a port filter (the packet hook).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  int n = 0;
  cf.fn = [&](wire::Direction d, std::span<uint8_t> r) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 7) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(cctr(Ctr::kRcvdSeqErr), 1u);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 10u);
  EXPECT_EQ(cctr(Ctr::kSentPkts), 26u);
  EXPECT_EQ(c.eng->counters().get(Ctr::kRetransPkts), 10u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
}

TEST_F(Hardening, RetransPktsCountsTheSelectiveResend) {
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  int n = 0;
  cf.fn = [&](wire::Direction d, std::span<uint8_t> r) {
    if (d == wire::Direction::kTx && is_request(r) && ++n == 7) return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(cctr(Ctr::kRcvdSeqErr), 1u);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 1u);
  EXPECT_EQ(cctr(Ctr::kSentPkts), 17u);
  EXPECT_EQ(sctr(Ctr::kStashReplayed), 9u);
  EXPECT_EQ(c.eng->counters().get(Ctr::kRetransPkts), 1u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
}

// retrans_pkts: the only ACK of a 2-packet WRITE is dropped; the retransmit timer fires and
// C sends both packets again (S answers them as duplicates).
TEST_F(Hardening, RetransPktsCountsTimeoutRetransmit) {
  // The drop comes from a port filter (the packet hook).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  int acks = 0;
  sf.fn = [&](wire::Direction d, std::span<uint8_t> r) {
    if (d == wire::Direction::kTx && r[0] == op::kRcAcknowledge && ++acks == 1)
      return wire::Verdict::kDrop;
    return wire::Verdict::kPass;
  };
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 2048).is_ok());
  run();
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 0u);
  EXPECT_TRUE(drain_cq(*c.scq).empty());
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(cctr(Ctr::kLocalAckTimeoutErr), 1u);
  // The timeout resends the oldest packet alone (docs/congestion.md §2); the responder's
  // re-ACK of that duplicate covers both packets, so the second is never resent.
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 1u);
  EXPECT_EQ(sctr(Ctr::kDuplicateRequest), 1u);
  // A clean WRITE afterwards counts nothing more.
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 2, 1024).is_ok());
  run();
  ASSERT_EQ(drain_cq(*c.scq).size(), 1u);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 1u);
}

// The hook watches the addresses the engine copies to: the device's view of b's pinned pages
// (emu/objects/pin.h), taken from the MR registered over b.
std::shared_ptr<HookedMem> hook_target(Node& n, GuardedBuf& b, const std::shared_ptr<Mr>& mr,
                                       std::function<void()> fn) {
  auto hm = std::make_shared<HookedMem>();
  const MrView v = mr->view();
  hm->lo = v.dev_addr + (reinterpret_cast<uint64_t>(b.data()) - v.host_addr);
  hm->hi = hm->lo + b.n;
  hm->hook = std::move(fn);
  n.dev->set_mem(hm);
  return hm;
}

// hook_target whose hook moves mr to other's pages with `access` (a rereg: a new key).
std::shared_ptr<HookedMem> hook_rereg(Node& n, GuardedBuf& b, std::shared_ptr<Mr>& mr,
                                      GuardedBuf& other, uint32_t access) {
  return hook_target(n, b, mr, [&n, &mr, &other, access] {
    EXPECT_TRUE(n.dev->rereg_mr(mr, kReregChangeTranslation, nullptr,
                                reinterpret_cast<uint64_t>(other.data()), other.n, access)
                    .is_ok());
  });
}

// S19 (WRITE): S's target MR is deregistered right after packet 4 of a 16-packet WRITE has
// been written. The rkey is re-checked per packet: packet 5 is refused with NAK 0x62 (S ->
// ERR), packets after it change nothing; C: REM_ACCESS_ERR.
TEST_F(Hardening, S19_DeregMidMultiPacketWriteStopsTheRest) {
  const auto before = std::vector<uint8_t>(tbuf.mem.begin(), tbuf.mem.end());
  auto hm = hook_target(s, tbuf, mt, [&] { EXPECT_TRUE(s.dev->dereg_mr(mt).is_ok()); });
  hm->fire_write = 4;
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(qc->state(), QpState::kErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(sctr(Ctr::kRemAccessNakSent), 1u);
  EXPECT_EQ(hm->writes, 4);  // no write after the invalidation
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 4 * 1024));
  EXPECT_EQ(first_change(tbuf, before, 4 * 1024), -1);  // nothing after it
  for (size_t i = 0; i < GuardedBuf::kGuard; ++i) ASSERT_EQ(tbuf.mem[i], before[i]);
}

// S19 with a rereg: S's target MR moves to other pages (a new rkey) from inside packet 4's
// write. The gate is open again when packet 5 comes (the rereg is over): packet 5 is refused
// because the old rkey names nothing now, and nothing lands after packet 4, neither in the
// old pages nor in the new ones. (It guards any cache of the re-check's MR: one kept without
// a check that the MR is unchanged wrote packet 5 through the released pin, and crashed.)
TEST_F(Hardening, S19_ReregMidMultiPacketWriteStopsTheRest) {
  GuardedBuf other{64 * 1024};
  const auto before = std::vector<uint8_t>(tbuf.mem.begin(), tbuf.mem.end());
  const auto other_before = std::vector<uint8_t>(other.mem.begin(), other.mem.end());
  auto hm = hook_rereg(s, tbuf, mt, other,
                       kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
  hm->fire_write = 4;
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(hm->writes, 4);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 4 * 1024));
  EXPECT_EQ(first_change(tbuf, before, 4 * 1024), -1);  // nothing after it
  EXPECT_TRUE(other.mem == other_before) << "a byte landed in the MR's new pages";
}

// An access-only rereg keeps the rkey: S's MR loses REMOTE_WRITE from inside packet 4's
// write. Packet 5's re-check sees the new rights (the key alone would pass): it is refused
// (NAK 0x62, C: REM_ACCESS_ERR) and nothing lands after 4 KiB.
TEST_F(Hardening, S19_AccessReregMidMultiPacketWriteStopsTheRest) {
  const auto before = std::vector<uint8_t>(tbuf.mem.begin(), tbuf.mem.end());
  const uint32_t key = mt->rkey();
  auto hm = hook_target(s, tbuf, mt, [&] {
    EXPECT_TRUE(s.dev->rereg_mr(mt, kReregChangeAccess, nullptr, 0, 0, kAccessLocalWrite).is_ok());
  });
  hm->fire_write = 4;
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(mt->rkey(), key);
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(hm->writes, 4);
  EXPECT_EQ(first_change(tbuf, before, 4 * 1024), -1);  // nothing after it
}

// The same for a READ's responses: S's MR moves after response 5 read its data; response 6
// is refused, and C holds nothing read after the rereg.
TEST_F(Hardening, S19_ReregMidReadStopsResponses) {
  GuardedBuf other{64 * 1024};
  auto hm = hook_rereg(s, tbuf, mt, other,
                       kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
  hm->fire_read = 5;
  std::memset(lbuf.data(), 0, 16 * 1024);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(hm->reads, 5);
  for (size_t i = 5 * 1024; i < 16 * 1024; ++i)
    ASSERT_EQ(lbuf.data()[i], 0) << "byte " << i << " read after the rereg";
}

// Without a change, a 16-packet WRITE and a 16-packet READ write / read each piece of S's MR
// once and land whole.
TEST_F(Hardening, MultiPacketTargetIsTouchedOncePerPacket) {
  auto hm = hook_target(s, tbuf, mt, nullptr);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  ASSERT_EQ(drain_cq(*c.scq).size(), 1u);
  EXPECT_EQ(hm->writes, 16);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
  ASSERT_NO_FATAL_FAILURE(read_16k_whole(2));
  EXPECT_EQ(hm->reads, 16);
}

// S09 on the requester: C's source MR is deregistered (from inside the copy, so on the
// requester's own thread) right after packet 4 of a 16-packet WRITE read its payload. The
// requester keeps the MR it checked for the packets of one WQE (req.cc GatherCache); the
// closed gate must still stop packet 5's gather: LOC_PROT_ERR, no read after the dereg, and
// S holds only the 4 KiB that went before it.
TEST_F(Hardening, S09_DeregMidMultiPacketSourceStopsTheGather) {
  const auto before = std::vector<uint8_t>(tbuf.mem.begin(), tbuf.mem.end());
  auto hm = hook_target(c, lbuf, ml, [&] { EXPECT_TRUE(c.dev->dereg_mr(ml).is_ok()); });
  hm->fire_read = 4;
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kLocProtErr);
  EXPECT_EQ(qc->state(), QpState::kErr);
  EXPECT_EQ(hm->reads, 4);  // no read after the dereg
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 4 * 1024));
  EXPECT_EQ(first_change(tbuf, before, 4 * 1024), -1);  // nothing after it
}

// The same with a rereg to other pages from inside packet 4's copy: the gate is open again
// when packet 5 is built (close_and_drain does not wait for this thread's own guard), but the
// key changed, so the kept view is not used: the old lkey is refused, nothing more is read.
TEST_F(Hardening, S09_ReregMidMultiPacketSourceStopsTheGather) {
  GuardedBuf other{64 * 1024};
  auto hm = hook_rereg(c, lbuf, ml, other, kAccessLocalWrite);
  hm->fire_read = 4;
  const uint32_t old_key = ml->lkey();
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_NE(ml->lkey(), old_key);
  EXPECT_EQ(only_send_status(), WcStatus::kLocProtErr);
  EXPECT_EQ(hm->reads, 4);
}

// The same WRITE without a dereg reads each of its 16 pieces once: the kept MR changes how
// often the key is looked up, not what is copied.
TEST_F(Hardening, MultiPacketSourceIsReadOncePerPacket) {
  auto hm = hook_target(c, lbuf, ml, nullptr);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 16 * 1024).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(hm->reads, 16);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
}

// The READ's requester keeps the local check of its responses' scatter for one receive batch
// (scatter_cache.h): the 16 responses of a 16 KiB READ, drained in one batch, look C's lkey
// up once and write each piece once; the MR's guard is let go when the drain ends.
TEST_F(Hardening, ReadResponsesInOneBatchKeepTheirLocalCheck) {
  auto hm = hook_target(c, lbuf, ml, nullptr);
  ASSERT_NO_FATAL_FAILURE(read_16k_whole(1));
  EXPECT_EQ(hm->writes, 16);
  EXPECT_EQ(c.eng->counters().get(Ctr::kScatterKept), 15u);  // all but the first piece
  EXPECT_EQ(ml->gate().inflight(), 0u);  // nothing held once the drain returned
  EXPECT_TRUE(c.dev->dereg_mr(ml).is_ok());
}

// The same for a 16 KiB SEND at the responder: the receive WQE's MR is checked once a batch.
TEST_F(Hardening, SendPayloadInOneBatchKeepsItsLocalCheck) {
  ASSERT_TRUE(post_recv(qs, 7, {sge(tbuf.data(), 16 * 1024, mt)}).is_ok());
  ASSERT_TRUE(post(qc, send_wr(WrOpcode::kSend, 1, {sge(lbuf.data(), 16 * 1024, ml)})).is_ok());
  run();
  auto rq = drain_cq(*s.rcq);
  ASSERT_EQ(rq.size(), 1u);
  EXPECT_EQ(rq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rq[0].byte_len, 16u * 1024);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 16 * 1024));
  EXPECT_EQ(s.eng->counters().get(Ctr::kScatterKept), 15u);
  EXPECT_EQ(mt->gate().inflight(), 0u);
}

// S09 at the READ's requester: C's destination MR is deregistered from inside the write of
// response 5 (C's own thread, mid-batch, while the batch keeps its check). The kept check is
// not used after that: response 6 is refused (LOC_PROT_ERR), nothing lands after 5 KiB.
TEST_F(Hardening, S09_DeregMidReadResponsesStopsTheScatter) {
  const auto before = std::vector<uint8_t>(lbuf.mem.begin(), lbuf.mem.end());
  auto hm = hook_target(c, lbuf, ml, [&] { EXPECT_TRUE(c.dev->dereg_mr(ml).is_ok()); });
  hm->fire_write = 5;
  tbuf.pattern(3);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kLocProtErr);
  EXPECT_EQ(hm->writes, 5);  // no write after the dereg
  EXPECT_EQ(c.eng->counters().get(Ctr::kScatterKept), 4u);  // responses 2-5 used the kept check
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 5 * 1024));
  EXPECT_EQ(first_change(lbuf, before, 5 * 1024), -1);  // nothing after it
}

// The same with a rereg of C's MR to other pages (a new key) from inside response 5's write:
// the gate is open again when response 6 comes, but the view's publication changed, so the
// kept check is dropped and the old key refused; nothing lands in the old or the new pages.
TEST_F(Hardening, S09_ReregMidReadResponsesStopsTheScatter) {
  GuardedBuf other{64 * 1024};
  const auto before = std::vector<uint8_t>(lbuf.mem.begin(), lbuf.mem.end());
  const auto other_before = std::vector<uint8_t>(other.mem.begin(), other.mem.end());
  auto hm = hook_rereg(c, lbuf, ml, other, kAccessLocalWrite);
  hm->fire_write = 5;
  tbuf.pattern(3);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kLocProtErr);
  EXPECT_EQ(hm->writes, 5);
  EXPECT_EQ(c.eng->counters().get(Ctr::kScatterKept), 4u);
  EXPECT_EQ(first_change(lbuf, before, 5 * 1024), -1);  // nothing after it
  EXPECT_TRUE(other.mem == other_before) << "a byte landed in the MR's new pages";
}

// An access-only rereg keeps the key (Device::rereg_mr): C's MR loses LOCAL_WRITE from inside
// response 5's write. Only the view's publication tells the kept check that the MR changed;
// response 6 is refused (LOC_PROT_ERR) and nothing lands after 5 KiB.
TEST_F(Hardening, S09_AccessReregMidReadResponsesStopsTheScatter) {
  const auto before = std::vector<uint8_t>(lbuf.mem.begin(), lbuf.mem.end());
  const uint32_t key = ml->lkey();
  auto hm = hook_target(c, lbuf, ml, [&] {
    EXPECT_TRUE(c.dev->rereg_mr(ml, kReregChangeAccess, nullptr, 0, 0, 0).is_ok());
  });
  hm->fire_write = 5;
  tbuf.pattern(3);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(ml->lkey(), key);
  EXPECT_EQ(only_send_status(), WcStatus::kLocProtErr);
  EXPECT_EQ(hm->writes, 5);
  EXPECT_EQ(c.eng->counters().get(Ctr::kScatterKept), 4u);
  EXPECT_EQ(first_change(lbuf, before, 5 * 1024), -1);
}

// S19 (READ): a 16 KiB READ; S's MR is deregistered right after response 5 read its data.
// Response 6 fails its rkey re-check (NAK 0x62, S -> ERR), responses 6.. are never sent, C
// gets REM_ACCESS_ERR and holds no byte from after the invalidation point.
TEST_F(Hardening, S19_DeregMidReadStopsResponses) {
  auto hm = hook_target(s, tbuf, mt, [&] { EXPECT_TRUE(s.dev->dereg_mr(mt).is_ok()); });
  hm->fire_read = 5;
  int resp = 0;
  cf.fn = [&](wire::Direction d, std::span<uint8_t> r) {
    if (d == wire::Direction::kRx && r[0] >= op::kRcRdmaReadResponseFirst &&
        r[0] <= op::kRcRdmaReadResponseOnly)
      ++resp;
    return wire::Verdict::kPass;
  };
  std::memset(lbuf.data(), 0, 16 * 1024);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaRead, 1, 16 * 1024).is_ok());
  run();
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(sctr(Ctr::kRemAccessNakSent), 1u);
  EXPECT_EQ(hm->reads, 5);  // no memory read after the invalidation
  std::printf("S19 READ: %d read-response packets reached C (of 16)\n", resp);
  EXPECT_LE(resp, 5);
  for (size_t i = 5 * 1024; i < 16 * 1024; ++i)
    ASSERT_EQ(lbuf.data()[i], 0) << "byte " << i << " read after the invalidation";
  EXPECT_TRUE(lbuf.guards_ok());
}

// Strict source check, fixed port that C does not send from: C's WRITE is dropped at S's
// address check (drop_src_port, not drop_addr_mismatch), no NAK; C retries and finally fails.
TEST_F(Hardening, StrictSrcFixedPortMismatchIsCountedDrop) {
  s.dev->set_strict_src(true, 4792);  // C sends from 4791
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 1024).is_ok());
  run();
  EXPECT_EQ(sctr(Ctr::kDropSrcPort), 1u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropSrcPort), 1u);
  EXPECT_EQ(sctr(Ctr::kDropAddr), 0u);
  EXPECT_EQ(sctr(Ctr::kRdmaRecvs), 0u);
  EXPECT_EQ(sctr(Ctr::kNakSent), 0u);
  // Switched off again: the retransmission is accepted.
  s.dev->set_strict_src(false);
  fire_timers();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(cctr(Ctr::kRetransPkts), 1u);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 1024));
}

// Strict source check, latching: the first packet latches 4791 on S's QP (requests) and on
// C's QP (its responses, when C is strict too); RESET clears the latch.
TEST_F(Hardening, StrictSrcLatchSetByFirstPacketClearedByReset) {
  s.dev->set_strict_src(true);
  c.dev->set_strict_src(true);
  EXPECT_EQ(qs->comp_.src_latch.load(), 0u);
  ASSERT_TRUE(post_rw(WrOpcode::kRdmaWrite, 1, 2048).is_ok());
  run();
  ASSERT_EQ(drain_cq(*c.scq).size(), 1u);
  EXPECT_EQ(qs->comp_.src_latch.load(), 0x10000u | wire::kRoceUdpPort);
  EXPECT_EQ(qc->comp_.src_latch.load(), 0x10000u | wire::kRoceUdpPort);
  EXPECT_EQ(sctr(Ctr::kDropSrcPort) + cctr(Ctr::kDropSrcPort), 0u);
  QpAttr a;
  a.qp_state = QpState::kReset;
  ASSERT_TRUE(s.dev->modify_qp(qs, a, kQpState).is_ok());
  EXPECT_EQ(qs->comp_.src_latch.load(), 0u);
}

// S20: ODP MRs (IBV_ACCESS_ON_DEMAND) are not pinned and not checked against the mappings
// when registered; the device reaches the pages through the fault-safe accessor.
constexpr uint32_t kOdpAccess =
    kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead | kAccessOnDemand;

// Fresh anonymous pages, never touched (not resident), unmapped at scope exit except a page
// the test unmapped (punch): another mapping (ASan's, say) may have been placed in the hole.
struct FreshPages {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t n;
  uint8_t* p;
  size_t hole = SIZE_MAX;
  explicit FreshPages(size_t npages) : n(npages) {
    void* m = mmap(nullptr, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~FreshPages() {
    for (size_t i = 0; p != nullptr && i < n; ++i)
      if (i != hole) munmap(p + i * page, page);
  }
  bool punch(size_t i) {
    if (munmap(p + i * page, page) != 0) return false;
    hole = i;
    return true;
  }
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uint64_t>(p) + off; }
};

// First touch of a non-resident page of an ODP MR is served; a WRITE running one byte
// past the MR's end is refused (Remote Access NAK) and writes nothing.
TEST_F(Hardening, S20_OdpFirstTouchServedJustOutsideRefused) {
  FreshPages fp(2);
  ASSERT_NE(fp.p, nullptr);
  auto m = s.dev->reg_mr(s.pd, fp.addr(), 2 * fp.page, fp.addr(), kOdpAccess);
  ASSERT_TRUE(m.has_value()) << static_cast<int>(m.error());
  EXPECT_FALSE((*m)->shadowed());  // not pinned: the device sees the application's pages
  unsigned char vec[2] = {1, 1};
  ASSERT_EQ(mincore(fp.p, 2 * fp.page, vec), 0);
  EXPECT_EQ(vec[1] & 1, 0) << "page 1 resident before the first touch";
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(lbuf.data(), 1024, ml)});
  w.rdma.remote_addr = fp.addr(fp.page);
  w.rdma.rkey = (*m)->rkey();
  ASSERT_TRUE(post(qc, w).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(fp.p + fp.page, lbuf.data(), 1024));

  Wr o = send_wr(WrOpcode::kRdmaWrite, 2, {sge(lbuf.data(), 1024, ml)});
  o.rdma.remote_addr = fp.addr(2 * fp.page - 1023);  // ends 1 byte past the MR
  o.rdma.rkey = (*m)->rkey();
  std::vector<uint8_t> before(fp.p + fp.page, fp.p + 2 * fp.page);
  ASSERT_TRUE(post(qc, o).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(sctr(Ctr::kRemAccessNakSent), 1u);
  EXPECT_EQ(0, std::memcmp(fp.p + fp.page, before.data(), fp.page));
  EXPECT_TRUE(s.dev->dereg_mr(*m).is_ok());
}

// A page of an ODP MR unmapped after registration is a page fault the NIC cannot resolve:
// the WRITE into it is a Remote Access error (counted mem_fault), never a signal, and
// the pages around it were served.
TEST_F(Hardening, S20_OdpUnmappedPageIsAnAccessErrorNotASignal) {
  FreshPages fp(3);
  ASSERT_NE(fp.p, nullptr);
  ASSERT_TRUE(fp.punch(1));  // a hole in the middle
  auto m = s.dev->reg_mr(s.pd, fp.addr(), 3 * fp.page, fp.addr(), kOdpAccess);
  ASSERT_TRUE(m.has_value()) << static_cast<int>(m.error());
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(lbuf.data(), 512, ml)});
  w.rdma.remote_addr = fp.addr(2 * fp.page);
  w.rdma.rkey = (*m)->rkey();
  ASSERT_TRUE(post(qc, w).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(fp.p + 2 * fp.page, lbuf.data(), 512));

  Wr h = send_wr(WrOpcode::kRdmaWrite, 2, {sge(lbuf.data(), 512, ml)});
  h.rdma.remote_addr = fp.addr(fp.page + 64);
  h.rdma.rkey = (*m)->rkey();
  ASSERT_TRUE(post(qc, h).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kRemAccessErr);
  EXPECT_EQ(qs->state(), QpState::kErr);
  EXPECT_EQ(sctr(Ctr::kMemFault), 1u);
  EXPECT_TRUE(s.dev->dereg_mr(*m).is_ok());
}

// Registration rules of ODP: implicit ODP (address 0, length UINT64_MAX, iova 0) covers the
// whole address space; a non-zero iova for it, or an explicit range whose end page-aligns
// past 2^64, is EINVAL; rereg cannot switch an MR to or from ODP (EOPNOTSUPP).
TEST_F(Hardening, S20_OdpRegistrationRules) {
  auto im = s.dev->reg_mr(s.pd, 0, UINT64_MAX, 0, kOdpAccess);
  ASSERT_TRUE(im.has_value());
  EXPECT_TRUE((*im)->view().in_range(reinterpret_cast<uint64_t>(tbuf.data()), 4096));
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(lbuf.data(), 256, ml)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(tbuf.data());
  w.rdma.rkey = (*im)->rkey();
  ASSERT_TRUE(post(qc, w).is_ok());
  run();
  EXPECT_EQ(only_send_status(), WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(tbuf.data(), lbuf.data(), 256));
  EXPECT_EQ(s.dev->reg_mr(s.pd, 0, UINT64_MAX, 4096, kOdpAccess).error(), Errc::kInval);
  EXPECT_EQ(s.dev->reg_mr(s.pd, 4096, UINT64_MAX - 4106, 4096, kOdpAccess).error(),
            Errc::kInval);  // its end page-aligns past 2^64 (ib_umem_get)
  EXPECT_EQ(s.dev->rereg_mr(mt, kReregChangeAccess, nullptr, 0, 0, kOdpAccess).code(),
            Errc::kOpNotSupp);
  EXPECT_TRUE(s.dev->dereg_mr(*im).is_ok());
}

// SOFTRNIC_FAULT_TRACE without SOFTRNIC_FAULTS: an empty engine that traces rules added at
// run time (`softrnic fault add`).
TEST(FaultTraceNoPlan, RuntimeRulesAreTraced) {
  char path[] = "/tmp/softrnic_trace_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::unique_ptr<FaultEngine> fe;
  if (!wire::kFaultInjection) {
    // Inverse: the trace variable alone is refused, naming the build option.
    EXPECT_EQ(FaultEngine::from_values(nullptr, nullptr, nullptr, path, &fe),
              "SOFTRNIC_FAULT_TRACE is set but fault injection is compiled out of this build "
              "(meson -Dfault_injection=true)");
    EXPECT_EQ(fe, nullptr);
    std::remove(path);
    GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  }
  ASSERT_EQ(FaultEngine::from_values(nullptr, nullptr, nullptr, path, &fe), "");
  ASSERT_NE(fe, nullptr);
  EXPECT_TRUE(fe->list().empty());
  ASSERT_EQ(fe->add_rules("dir=tx class=write => drop", "add"), "");

  wire::MemNetwork net;
  Node c = Node::on_mem(net, "127.0.0.2");
  Node s = Node::on_mem(net, "127.0.0.3");
  auto qc = c.qp(QpType::kRc), qs = s.qp(QpType::kRc);
  connect_pair(c, qc, s, qs, ConnOpts{});
  GuardedBuf l(1024), t(1024);
  auto ml = c.mr(l.data(), 1024);
  auto mt = s.mr(t.data(), 1024);
  ASSERT_TRUE(fe->attach(c.eng->port()));
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(l.data(), 512, ml)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(t.data());
  w.rdma.rkey = mt->rkey();
  ASSERT_TRUE(post(qc, w).is_ok());
  for (int i = 0; i < 100 && (c.eng->poll_rx() + s.eng->poll_rx()) > 0; ++i) {
  }
  fe->detach(c.eng->port());
  EXPECT_EQ(fe->counters().dropped, 1u);
  fe.reset();  // closes the trace file
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path);
  EXPECT_NE(ss.str().find("drop"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("qpn=0x"), std::string::npos) << ss.str();
}

// The post-waiting scene (Qp::post_waiting): C's post of four 4 KiB WRITEs (4 packets each
// at MTU 1024) is in its requester run when, reading WQE 1's second packet, another thread
// posts a fifth and waits for the send lock. Then both engines run to quiescence (ACKs, and
// the requester runs they release). What it returns: who sent each request packet, the
// fifth post's status, C's send completions, whether every completed WRITE landed whole, and
// C's deferred posts (tx_deferred).
struct PostWaitResult {
  // Per request packet: 'm' this thread's post, 'p' the poster's, 'a' a requester run that
  // an ACK released (this thread, running the engines after both posts returned).
  std::string sender;
  Status posted4 = Errc::kInval, posted5 = Errc::kInval;
  std::vector<Cqe> wcs;
  bool landed = false;
  uint64_t deferred = 0;
};

PostWaitResult post_wait_scene(const EngineConfig& ec, uint8_t timeout, uint32_t sq_depth) {
  constexpr uint32_t kLen = 4096;
  PostWaitResult res;
  wire::MemNetwork net;
  Node c = Node::on_mem(net, "127.0.0.2", false, ErrorsMode::kSpec, 0, ec);
  Node s = Node::on_mem(net, "127.0.0.3", false, ErrorsMode::kSpec, 0, ec);
  GuardedBuf lbuf{64 * 1024}, tbuf{64 * 1024};
  lbuf.pattern(1);
  tbuf.pattern(2);
  auto ml = c.mr(lbuf.data(), lbuf.n);
  auto mt = s.mr(tbuf.data(), tbuf.n);
  FnFilter cf;
  std::thread::id poster_id;
  std::mutex ids_mu;  // poster_id is set by the hook while the poster may already send
  bool pumping = false;  // under ids_mu
  cf.fn = [&](wire::Direction d, std::span<uint8_t> r) {
    if (d == wire::Direction::kTx && is_request(r)) {
      std::lock_guard lk(ids_mu);
      res.sender.push_back(std::this_thread::get_id() == poster_id ? 'p' : pumping ? 'a' : 'm');
    }
    return wire::Verdict::kPass;
  };
  c.eng->port().set_filter(&cf);
  auto qc = c.qp(QpType::kRc, nullptr, sq_depth);
  auto qs = s.qp(QpType::kRc);
  ConnOpts o;
  o.timeout = timeout;
  connect_pair(c, qc, s, qs, o);  // MTU 1024
  // Five WRITEs: WQE k copies lbuf's k-th 4 KiB to tbuf's.
  std::vector<Sge> sg(5);
  std::vector<SendWr> wrs(5);
  for (uint32_t i = 0; i < 5; ++i) {
    sg[i] = sge(lbuf.data() + i * kLen, kLen, ml);
    wrs[i].wr_id = i + 1;
    wrs[i].opcode = WrOpcode::kRdmaWrite;
    wrs[i].sg_list = &sg[i];
    wrs[i].num_sge = 1;
    wrs[i].send_flags = kSendSignaled;
    wrs[i].rdma.remote_addr = reinterpret_cast<uint64_t>(tbuf.data() + i * kLen);
    wrs[i].rdma.rkey = mt->rkey();
  }
  std::thread poster;
  auto hm = std::make_shared<HookedMem>();
  const MrView v = ml->view();
  hm->lo = v.dev_addr + (reinterpret_cast<uint64_t>(lbuf.data()) - v.host_addr);
  hm->hi = hm->lo + lbuf.n;
  hm->fire_read = 2;  // WQE 1's second packet
  hm->hook = [&] {
    std::lock_guard lk(ids_mu);
    poster = std::thread([&] { res.posted5 = post(qc, wrs[4]); });
    poster_id = poster.get_id();
    // It waits for our send lock (bounded: a missing count fails the checks instead).
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!qc->post_waiting() && std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
  };
  c.dev->set_mem(hm);
  int bad = -1;
  res.posted4 = qc->post_send(wrs.data(), 4, &bad);
  if (poster.joinable()) poster.join();
  {
    std::lock_guard lk(ids_mu);
    pumping = true;
  }
  for (int i = 0; i < 100000; ++i) {
    int moved = c.eng->port().release_held() + s.eng->port().release_held();
    moved += c.eng->poll_rx() + s.eng->poll_rx();
    if (moved == 0) break;
  }
  res.wcs = drain_cq(*c.scq);
  res.landed = std::memcmp(tbuf.data(), lbuf.data(), res.wcs.size() * kLen) == 0;
  res.deferred = c.eng->counters().get(Ctr::kTxDeferred);
  EXPECT_FALSE(qc->post_waiting());
  c.eng->port().set_filter(nullptr);
  return res;
}

// Each WQE completes in order, successfully.
void expect_in_order(const std::vector<Cqe>& wcs, size_t n) {
  ASSERT_EQ(wcs.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, WcStatus::kSuccess);
  }
}

// A post that waits for the send lock gets in at the holder's next message boundary: the
// run stops after WQE 1's last packet (it asked for an ACK, and the retransmit timer is
// armed); the poster appends and its own run sends WQEs 2-5. Every WRITE lands whole and
// completes in order. Without the stop the first run sends all sixteen of its packets
// before the poster gets the lock.
TEST(PostWaiting, GetsInAtTheNextMessage) {
  // The scene tells the packets' senders apart through a port filter (compiled out there).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  const PostWaitResult r = post_wait_scene(EngineConfig{}, 14, 256);
  ASSERT_TRUE(r.posted4.is_ok());
  ASSERT_TRUE(r.posted5.is_ok());
  EXPECT_EQ(r.sender, std::string(4, 'm') + std::string(16, 'p'));
  expect_in_order(r.wcs, 5);
  EXPECT_TRUE(r.landed);
}

// With an ACK timeout of 0 there is no retransmit timer: a stop whose last packet or ACK was
// lost would leave the rest unsent for good, so the run does not stop for a waiting post.
TEST(PostWaiting, NoStopWithoutARetransmitTimer) {
  // The scene tells the packets' senders apart through a port filter (compiled out there).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  const PostWaitResult r = post_wait_scene(EngineConfig{}, 0, 256);
  ASSERT_TRUE(r.posted4.is_ok());
  ASSERT_TRUE(r.posted5.is_ok());
  EXPECT_EQ(r.sender, std::string(16, 'm') + std::string(4, 'p'));
  expect_in_order(r.wcs, 5);
  EXPECT_TRUE(r.landed);
}

// The waiting post fails (the send queue of 4 is full) and so runs no requester: the stopped
// run's rest goes out when WQE 1's ACK comes (the completer runs the requester), and all four
// complete.
TEST(PostWaiting, APostThatFailsLeavesTheRestToTheAck) {
  // The scene tells the packets' senders apart through a port filter (compiled out there).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  const PostWaitResult r = post_wait_scene(EngineConfig{}, 14, 4);
  ASSERT_TRUE(r.posted4.is_ok());
  EXPECT_EQ(r.posted5.code(), Errc::kNoMem);
  EXPECT_EQ(r.sender, std::string(4, 'm') + std::string(12, 'a'));
  expect_in_order(r.wcs, 4);
  EXPECT_TRUE(r.landed);
}

// Doorbell batching (defer_inflight) defers the waiting post, WQE 1's packets being in
// flight: its run sends nothing, and WQE 1's ACK runs the requester for WQEs 2-5.
TEST(PostWaiting, ADeferredPostLeavesTheRestToTheAck) {
  // The scene tells the packets' senders apart through a port filter (compiled out there).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  EngineConfig ec;
  ec.defer_inflight = 1;
  const PostWaitResult r = post_wait_scene(ec, 14, 256);
  ASSERT_TRUE(r.posted4.is_ok());
  ASSERT_TRUE(r.posted5.is_ok());
  EXPECT_EQ(r.deferred, 1u);
  EXPECT_EQ(r.sender, std::string(4, 'm') + std::string(16, 'a'));
  expect_in_order(r.wcs, 5);
  EXPECT_TRUE(r.landed);
}

TEST(FaultTraceNoPlan, NothingSetMeansNoEngine) {
  std::unique_ptr<FaultEngine> fe;
  EXPECT_EQ(FaultEngine::from_values(nullptr, nullptr, nullptr, nullptr, &fe), "");
  EXPECT_EQ(fe, nullptr);
}

}  // namespace
}  // namespace rnic::emu::test
