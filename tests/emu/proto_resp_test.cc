// tests/emu/proto_resp_test.cc: protocol tests of the RESPONDER, Given/Expect style: a raw
// peer port sends hand-built request packets to one device over the in-memory network and
// checks every packet the device answers with, its completions, counters and memory.
#include "wire/mem_port.h"
#include <gtest/gtest.h>

#include "emu/objects/mw.h"
#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;
namespace aeth = wire::aeth;

constexpr uint32_t kPeerQpn = 0x000123;
constexpr uint32_t kEpsn = 100;

class RespTest : public ::testing::Test {
 protected:
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3");
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Qp> qp;
  GuardedBuf rbuf{8192}, target{8192};
  std::shared_ptr<Mr> mrb, mt;

  void SetUp() override { setup(QpType::kRc, kEpsn); }
  void setup(QpType t, uint32_t epsn, ConnOpts o = {}) {
    qp = s.qp(t);
    o.rq_psn = epsn;
    o.sq_psn = 500;
    o.min_rnr_timer = 12;
    connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
    mrb = s.mr(rbuf.data(), rbuf.n);
    target.pattern(9);
    mt = s.mr(target.data(), target.n);
  }
  wire::PacketFields req(uint8_t opcode, uint32_t psn, bool ack_req = true) {
    wire::PacketFields f;
    f.opcode = opcode;
    f.dest_qp = qp->qpn();
    f.psn = psn;
    f.ack_req = ack_req;
    return f;
  }
  wire::PacketFields write(uint8_t opcode, uint32_t psn, uint64_t va, uint32_t len,
                           uint32_t rkey = 0) {
    wire::PacketFields f = req(opcode, psn);
    f.va = va;
    f.rkey = rkey ? rkey : mt->rkey();
    f.dma_len = len;
    return f;
  }
  uint64_t tva(size_t off = 0) { return reinterpret_cast<uint64_t>(target.data() + off); }
  // Let the device process everything, return what it sent.
  std::vector<Captured> step() {
    s.eng->poll_rx();
    return p.recv_all();
  }
  void post_rbuf(uint64_t id, uint32_t len = 4096) {
    ASSERT_TRUE(post_recv(qp, id, {sge(rbuf.data(), len, mrb)}).is_ok());
  }
  uint64_t ctr(Ctr c) { return qp->comp_.ctr.get(c); }
};

std::vector<uint8_t> bytes(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

// ---- PSN sequence ----

// The in-order responder of IBA 9.7.5.1.1 (ConnectX, rxe; softrnic with SOFTRNIC_RC_STASH=0):
// packets past a gap are discarded and the requester goes back N.
TEST_F(RespTest, PsnGapSendsOneNakThenRecovers) {
  s.dev->set_rc_stash(false);
  post_rbuf(1);
  post_rbuf(2);
  auto pay = bytes(16, 0x11);
  // Given: the expected PSN is 100. Receive 102, 103, 104 (101 was lost).
  p.send(req(op::kRcSendOnly, 102), pay);
  p.send(req(op::kRcSendOnly, 103), pay);
  p.send(req(op::kRcSendOnly, 104), pay);
  auto out = step();
  // Expect: exactly one PSN-sequence NAK naming ePSN 100; nothing executed.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakPsnSeqError));
  EXPECT_EQ(out[0].psn(), kEpsn);
  EXPECT_EQ(out[0].f.dest_qp, kPeerQpn);
  EXPECT_EQ(ctr(Ctr::kOutOfSeqRequest), 3u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 0u);
  // Receive more out-of-order packets: still silent (one NAK per gap).
  p.send(req(op::kRcSendOnly, 105), pay);
  EXPECT_EQ(step().size(), 0u);
  // Receive 100 and 101 (go-back-N) in one batch: both executed, one coalesced ACK for 101.
  p.send(req(op::kRcSendOnly, 100), pay);
  p.send(req(op::kRcSendOnly, 101), pay);
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 101u);
  EXPECT_EQ(out[0].f.msn, 2u);
  EXPECT_EQ(ctr(Ctr::kAckDeferred), 1u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 2u);
  // A new gap gets a new NAK (the latch was cleared by in-order traffic).
  p.send(req(op::kRcSendOnly, 109), pay);
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakPsnSeqError));
  EXPECT_EQ(out[0].psn(), 102u);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

// The stash (the default, docs/congestion.md §2): the same gap still draws exactly one NAK and
// executes nothing out of order, but the SENDs past it are kept and executed, in PSN order and
// through every check, when the gap fills; one ACK then covers them all.
TEST_F(RespTest, PsnGapStashesLaterRequestsAndReplaysThemInOrder) {
  for (uint64_t i = 0; i < 7; ++i)
    ASSERT_TRUE(post_recv(qp, i, {sge(rbuf.data() + i * 16, 16, mrb)}).is_ok());
  // 100 in order: S now knows the UDP port this QP's requests come from (only those are kept).
  p.send(req(op::kRcSendOnly, 100), bytes(16, 100));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 100u);
  // Then 103..106 arrive (101 and 102 were lost), each with its own byte.
  for (uint32_t psn = 103; psn <= 106; ++psn)
    p.send(req(op::kRcSendOnly, psn), bytes(16, static_cast<uint8_t>(psn)));
  out = step();
  // Expect: one PSN-sequence NAK for 101, nothing executed yet, four packets kept.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakPsnSeqError));
  EXPECT_EQ(out[0].psn(), 101u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);
  EXPECT_EQ(ctr(Ctr::kStashStored), 4u);
  // A duplicate of a kept PSN is not kept twice.
  p.send(req(op::kRcSendOnly, 104), bytes(16, 0xEE));
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(ctr(Ctr::kStashStored), 4u);
  // 101 alone fills nothing past it: executed and acknowledged, the stash waits for 102.
  p.send(req(op::kRcSendOnly, 101), bytes(16, 101));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 101u);
  // 102 fills the gap: 102 then the four kept SENDs run, one ACK for 106.
  p.send(req(op::kRcSendOnly, 102), bytes(16, 102));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 106u);
  EXPECT_EQ(out[0].f.msn, 7u);
  EXPECT_EQ(ctr(Ctr::kStashReplayed), 4u);
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 6u);
  for (uint64_t i = 1; i < 7; ++i) {
    EXPECT_EQ(c[i - 1].wr_id, i);  // completed in PSN order, each into its own receive
    EXPECT_EQ(rbuf.data()[i * 16], static_cast<uint8_t>(100 + i)) << i;
  }
  // The resend of a replayed PSN is a duplicate: acknowledged, not executed again.
  p.send(req(op::kRcSendOnly, 105), bytes(16, 0xEE));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(drain_cq(*s.rcq).size(), 0u);
  EXPECT_EQ(rbuf.data()[5 * 16], 105);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

// Before any request was taken in order the responder does not know the requester's UDP port,
// so nothing past a gap is kept (a forger spraying PSNs at a fresh QP fills no slot).
TEST_F(RespTest, PsnGapBeforeAnyInOrderRequestStashesNothing) {
  post_rbuf(1);
  p.send(req(op::kRcSendOnly, 101), bytes(16, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakPsnSeqError));
  EXPECT_EQ(ctr(Ctr::kStashStored), 0u);
}

// Notification point (docs/congestion.md §3): a request that arrives CE-marked draws a CNP to
// the requesting QP (opcode 0x81, BECN, PSN 0), at most one per QP per cnp_min_gap_ns; the
// request itself is executed and acknowledged as usual.
TEST_F(RespTest, CeMarkedRequestsDrawCnpsAtMostOncePerGap) {
  auto* mp = dynamic_cast<wire::MemPort*>(&s.eng->port());
  ASSERT_NE(mp, nullptr);
  for (uint64_t i = 0; i < 5; ++i) post_rbuf(i);
  auto count_cnps = [](const std::vector<Captured>& v) {
    size_t n = 0;
    for (auto& c : v) n += c.opcode() == op::kCnp;
    return n;
  };
  // Not marked: no CNP.
  p.send(req(op::kRcSendOnly, 100), bytes(16, 1));
  auto out = step();
  EXPECT_EQ(count_cnps(out), 0u);
  // Marked, three requests within one long gap: one CNP, three requests executed.
  mp->set_ce_mark(true);
  s.dev->set_cnp_min_gap_ns(3'600'000'000'000ull);
  for (uint32_t psn = 101; psn <= 103; ++psn) p.send(req(op::kRcSendOnly, psn), bytes(16, 1));
  out = step();
  ASSERT_EQ(count_cnps(out), 1u);
  for (auto& c : out) {
    if (c.opcode() != op::kCnp) continue;
    EXPECT_EQ(c.f.dest_qp, kPeerQpn);
    EXPECT_TRUE(c.f.becn);
    EXPECT_EQ(c.psn(), 0u);
    EXPECT_EQ(c.v.payload_len, 0u);
  }
  EXPECT_EQ(ctr(Ctr::kCnpSent), 1u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kEcnCeRcvd), 3u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 4u);
  // No gap: each marked request draws its own.
  s.dev->set_cnp_min_gap_ns(0);
  p.send(req(op::kRcSendOnly, 104), bytes(16, 1));
  out = step();
  EXPECT_EQ(count_cnps(out), 1u);
  EXPECT_EQ(ctr(Ctr::kCnpSent), 2u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

// The receive queue as a congestion point (EngineConfig::rx_mark_pct, docs/congestion.md §3):
// a receive batch that comes back full while the port's queue is at or above the mark counts
// its requests as CE-marked, so each draws a CNP (cnp_min_gap 0 here: one per request); the
// batches after it, a queue below the mark, or marking off, draw none. Every WRITE executes.
struct MarkRun {
  size_t cnps = 0;        // CNPs the device sent
  uint64_t marks = 0;     // rx_backlog_marks
  uint64_t ce = 0;        // ecn_ce_rcvd: a mark is not a CE on the wire
  bool all_written = false;
};

MarkRun run_backlog(uint32_t mark_pct, uint32_t writes) {
  // 64 datagrams a port: the engine's first batch takes 32, and 16 left behind is 25%.
  wire::MemNetwork net{64};
  EngineConfig ec;
  ec.rx_mark_pct = mark_pct;
  Node s = Node::on_mem(net, "127.0.0.3", false, ErrorsMode::kSpec, 0, ec);
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Qp> qp = s.qp(QpType::kRc);
  ConnOpts o;
  o.rq_psn = kEpsn;
  o.sq_psn = 500;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  s.dev->set_cnp_min_gap_ns(0);
  GuardedBuf target{4096};
  std::shared_ptr<Mr> mt = s.mr(target.data(), target.n);
  for (uint32_t i = 0; i < writes; ++i) {
    wire::PacketFields f;
    f.opcode = op::kRcRdmaWriteOnly;
    f.dest_qp = qp->qpn();
    f.psn = kEpsn + i;
    f.ack_req = i + 1 == writes;  // one ACK for all
    f.va = reinterpret_cast<uint64_t>(target.data()) + 4 * i;
    f.rkey = mt->rkey();
    f.dma_len = 4;
    p.send(f, bytes(4, static_cast<uint8_t>(i + 1)));
  }
  s.eng->poll_rx();
  MarkRun r;
  for (const Captured& c : p.recv_all()) r.cnps += c.opcode() == op::kCnp;
  r.marks = s.eng->counters().get(Ctr::kRxBacklogMarks);
  r.ce = s.eng->counters().get(Ctr::kEcnCeRcvd);
  r.all_written = true;
  for (uint32_t i = 0; i < writes; ++i)
    r.all_written = r.all_written && target.data()[4 * i + 3] == static_cast<uint8_t>(i + 1);
  return r;
}

TEST(RxMarkTest, AFullBatchWithTheQueuePastTheMarkDrawsCnps) {
  // 52 queued: the first batch (32) leaves 20 of 64 (31%) behind it: its 32 are marked.
  MarkRun r = run_backlog(25, 52);
  EXPECT_EQ(r.cnps, 32u);
  EXPECT_EQ(r.marks, 1u);
  EXPECT_EQ(r.ce, 0u);
  EXPECT_TRUE(r.all_written);
}

TEST(RxMarkTest, AQueueBelowTheMarkOrMarkingOffDrawsNone) {
  // 42 queued: 10 of 64 (15%) behind the first batch.
  MarkRun below = run_backlog(25, 42);
  EXPECT_EQ(below.cnps, 0u);
  EXPECT_EQ(below.marks, 0u);
  EXPECT_TRUE(below.all_written);
  // The mark at 15%: the same queue is at it.
  MarkRun at = run_backlog(15, 42);
  EXPECT_EQ(at.cnps, 32u);
  EXPECT_EQ(at.marks, 1u);
  MarkRun off = run_backlog(0, 52);
  EXPECT_EQ(off.cnps, 0u);
  EXPECT_EQ(off.marks, 0u);
  EXPECT_TRUE(off.all_written);
}

TEST_F(RespTest, AckBeforeNakKeepsPsnOrder) {
  post_rbuf(1);
  // A SEND that is owed an ACK, then a bad WRITE in the same batch: ACK 100, then NAK 101.
  p.send(req(op::kRcSendOnly, 100), bytes(4, 1));
  p.send(write(op::kRcRdmaWriteOnly, 101, tva(), 4, mt->rkey() ^ 0x80), bytes(4, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(out[1].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
  EXPECT_EQ(out[1].psn(), 101u);
}

TEST_F(RespTest, AckCoalescingOnlyOnAckReq) {
  post_rbuf(1);
  auto pay = bytes(1024, 0x22);
  // Given a 3-packet SEND whose first two packets carry no AckReq.
  p.send(req(op::kRcSendFirst, 100, false), pay);
  p.send(req(op::kRcSendMiddle, 101, false), pay);
  p.send(req(op::kRcSendLast, 102, true), bytes(5, 0x33));
  auto out = step();
  // Expect one ACK, for the last PSN.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 102u);
  EXPECT_EQ(ctr(Ctr::kAckDeferred), 2u);
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].byte_len, 2053u);
}

// ---- duplicates ----

TEST_F(RespTest, DuplicateSendIsReAckedNotReExecuted) {
  post_rbuf(1);
  post_rbuf(2);
  p.send(req(op::kRcSendOnly, 100), bytes(8, 0x44));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  // Receive the same SEND again (its ACK was lost).
  p.send(req(op::kRcSendOnly, 100), bytes(8, 0x44));
  out = step();
  // Expect: re-ACK at the last acknowledged PSN, no second receive completion (C9-105).
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);
  EXPECT_EQ(qp->rq().size(), 1u);  // WQE 2 still posted
}

TEST_F(RespTest, DuplicateWriteIsNotReapplied) {
  p.send(write(op::kRcRdmaWriteOnly, 100, tva(), 4), bytes(4, 0xAA));
  ASSERT_EQ(step().size(), 1u);
  EXPECT_EQ(target.data()[0], 0xAA);
  target.data()[0] = 0x55;  // the application changes it afterwards
  p.send(write(op::kRcRdmaWriteOnly, 100, tva(), 4), bytes(4, 0xAA));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(target.data()[0], 0x55);  // not written again
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
}

TEST_F(RespTest, DuplicateReadIsReplayedFromMemoryWithRkeyRecheck) {
  // READ 3000 bytes = 3 response packets (path MTU 1024), PSNs 100..102.
  p.send(write(op::kRcRdmaReadRequest, 100, tva(), 3000));
  auto out = step();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadResponseFirst);
  EXPECT_EQ(out[1].opcode(), op::kRcRdmaReadResponseMiddle);
  EXPECT_EQ(out[2].opcode(), op::kRcRdmaReadResponseLast);
  EXPECT_EQ(out[2].psn(), 102u);
  EXPECT_EQ(out[2].v.payload_len, 3000u - 2048u);
  EXPECT_EQ(0, std::memcmp(out[1].v.payload, target.data() + 1024, 1024));
  // The memory changes; the requester retries the READ from PSN 101 (subset of the original).
  target.data()[1024] ^= 0xFF;
  p.send(write(op::kRcRdmaReadRequest, 101, tva(1024), 1976));
  out = step();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadResponseFirst);
  EXPECT_EQ(out[0].psn(), 101u);
  EXPECT_EQ(out[1].psn(), 102u);
  EXPECT_EQ(out[0].v.payload[0], target.data()[1024]);  // re-read, not cached
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
  // A retried READ that is not a subset of the original: dropped (Class D).
  p.send(write(op::kRcRdmaReadRequest, 101, tva(1024), 4000));
  EXPECT_EQ(step().size(), 0u);
  // The MR goes away: the replay re-checks the rkey and NAKs Remote Access.
  ASSERT_TRUE(s.dev->dereg_mr(mt).is_ok());
  p.send(write(op::kRcRdmaReadRequest, 100, tva(), 3000, mt->rkey()));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(RespTest, DuplicateAtomicReturnsSavedValueNeverReExecutes) {
  uint64_t* word = reinterpret_cast<uint64_t*>(target.data() + 64);
  *word = 5;
  wire::PacketFields f = req(op::kRcFetchAdd, 100);
  f.va = tva(64);
  f.rkey = mt->rkey();
  f.swap_add = 1;
  p.send(f);
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAtomicAcknowledge);
  EXPECT_EQ(out[0].f.orig, 5u);
  EXPECT_EQ(*word, 6u);
  // Duplicate of the same FAA: the saved original value comes back; the add is not redone.
  p.send(f);
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAtomicAcknowledge);
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(out[0].f.orig, 5u);
  EXPECT_EQ(*word, 6u);
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
}

// ---- ATOMIC_WRITE and FLUSH (IBA 1.5 Annex A19) ----

// ATOMIC_WRITE stores the 8 payload bytes as sent and is answered by a zero-length RDMA READ
// RESPONSE ONLY carrying the MSN; a duplicate is re-answered from the responder resource and
// never re-executed (a later store to the word survives it).
TEST_F(RespTest, AtomicWriteStoresEightBytesAnswersEmptyReadResponseAndReplays) {
  const uint8_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  wire::PacketFields f = write(op::kRcAtomicWrite, 100, tva(128), 8);
  p.send(f, v);
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadResponseOnly);
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(out[0].v.payload_len, 0u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].f.msn, 1u);
  EXPECT_EQ(0, std::memcmp(target.data() + 128, v, 8));
  target.data()[128] = 0x77;
  p.send(f, v);
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadResponseOnly);
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(out[0].f.msn, 1u);
  EXPECT_EQ(target.data()[128], 0x77);  // not re-executed
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
  // A FETCH_AND_ADD after it sees the stored word (one atomic path).
  uint64_t word;
  std::memcpy(&word, target.data() + 128, 8);
  wire::PacketFields a = req(op::kRcFetchAdd, 101);
  a.va = tva(128);
  a.rkey = mt->rkey();
  a.swap_add = 1;
  p.send(a);
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].f.orig, word);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

TEST_F(RespTest, AtomicWriteMisalignedNaksInvalidRequestMemoryUnchanged) {
  GuardedBuf before{16};
  std::memcpy(before.data(), target.data() + 128, 16);
  p.send(write(op::kRcAtomicWrite, 100, tva(130), 8), bytes(8, 0xee));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_EQ(0, std::memcmp(before.data(), target.data() + 128, 16));
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(RespTest, AtomicWriteNeedsRemoteWriteOnTheMrAndEightByteDmaLength) {
  auto ro = s.mr(target.data(), 4096, kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteAtomic);
  p.send(write(op::kRcAtomicWrite, 100, tva(64), 8, ro->rkey()), bytes(8, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
  setup(QpType::kRc, kEpsn);
  p.send(write(op::kRcAtomicWrite, 100, tva(64), 16), bytes(8, 1));  // RETH says 16
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

TEST_F(RespTest, AtomicWriteNeedsRemoteWriteOnTheQp) {
  ConnOpts o;
  o.access = kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteAtomic;
  setup(QpType::kRc, kEpsn, o);
  p.send(write(op::kRcAtomicWrite, 100, tva(64), 8), bytes(8, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

class FlushRespTest : public RespTest {
 protected:
  std::shared_ptr<Mr> mf;
  void SetUp() override {
    ConnOpts o;
    o.access |= kAccessFlushGlobal | kAccessFlushPersistent;
    setup(QpType::kRc, kEpsn, o);
    mf = s.mr(target.data(), target.n, kAccessLocalWrite | kAccessRemoteWrite | kAccessFlushGlobal);
  }
  wire::PacketFields flush(uint32_t psn, uint64_t va, uint32_t len, uint8_t plt, uint8_t sel,
                           uint32_t rkey = 0) {
    wire::PacketFields f = write(op::kRcFlush, psn, va, len, rkey ? rkey : mf->rkey());
    f.flush_plt = plt;
    f.flush_sel = sel;
    return f;
  }
};

// Both selectivity levels: a range inside the MR, and the whole MR (VA/length ignored).
TEST_F(FlushRespTest, GlobalFlushOfRangeAndOfWholeMrAnswersEmptyReadResponse) {
  p.send(flush(100, tva(0), 4096, kFlushGlobal, kFlushRange));
  p.send(flush(101, 0xdead0000, 0, kFlushGlobal, kFlushMr));
  auto out = step();
  ASSERT_EQ(out.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].opcode(), op::kRcRdmaReadResponseOnly);
    EXPECT_EQ(out[i].psn(), 100u + i);
    EXPECT_EQ(out[i].v.payload_len, 0u);
    EXPECT_EQ(out[i].f.msn, 1u + i);
  }
  p.send(flush(101, 0xdead0000, 0, kFlushGlobal, kFlushMr));  // duplicate: re-answered
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 101u);
  EXPECT_EQ(out[0].f.msn, 2u);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

// The MR has FLUSH_GLOBAL only: a PERSISTENT flush is a remote access error (rdma-core
// test_qp_ex_rc_flush_type_violate), and so is a range outside the MR.
TEST_F(FlushRespTest, PersistentFlushWithoutTheMrRightNaksRemoteAccess) {
  p.send(flush(100, tva(0), 64, kFlushPersistent, kFlushRange));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
}

TEST_F(FlushRespTest, RangeOutsideTheMrNaksRemoteAccess) {
  p.send(flush(100, tva(8000), 4096, kFlushGlobal, kFlushRange));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
}

TEST_F(FlushRespTest, GlobalFlushOnMrWithoutFlushRightNaksRemoteAccess) {
  p.send(flush(100, tva(0), 64, kFlushGlobal, kFlushRange, mt->rkey()));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
}

TEST_F(FlushRespTest, ReservedPlacementTypeOrLevelNaksInvalidRequest) {
  p.send(flush(100, tva(0), 64, 0, kFlushRange));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  SetUp();
  p.send(flush(100, tva(0), 64, kFlushGlobal, 2));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

TEST_F(RespTest, FlushWithoutTheQpFlushRightNaksInvalidRequest) {
  wire::PacketFields f = write(op::kRcFlush, 100, tva(0), 64);
  f.flush_plt = kFlushGlobal;
  p.send(f);
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

TEST(FlushMrAccess, PersistentRegistrationIsEinvalGlobalIsAccepted) {
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3");
  GuardedBuf b{4096};
  auto a = reinterpret_cast<uint64_t>(b.data());
  EXPECT_EQ(s.dev->reg_mr(s.pd, a, 4096, a, kAccessLocalWrite | kAccessFlushPersistent)
                .error(),
            Errc::kInval);
  EXPECT_TRUE(s.dev->reg_mr(s.pd, a, 4096, a, kAccessLocalWrite | kAccessFlushGlobal)
                  .has_value());
}

// ---- NAK syndromes ----

TEST_F(RespTest, OpcodeSequenceErrorNaksInvalidRequest) {
  post_rbuf(1);
  // A SEND_MIDDLE with no FIRST before it (Class C).
  p.send(req(op::kRcSendMiddle, 100), bytes(1024, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(qp->state(), QpState::kErr);
  // The posted receive WQE is flushed.
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kWrFlushErr);
  // Packets to an ERR QP are dropped.
  p.send(req(op::kRcSendOnly, 101), bytes(4, 1));
  EXPECT_EQ(step().size(), 0u);
}

TEST_F(RespTest, BadRkeyNaksRemoteAccessAndWritesNothing) {
  std::vector<uint8_t> before(target.data(), target.data() + target.n);
  // Multi-packet WRITE whose range runs one byte past the MR: NAK on the FIRST packet,
  // before any byte lands — including the in-range first packet (S05).
  p.send(write(op::kRcRdmaWriteFirst, 100, tva(8192 - 2048), 2049), bytes(1024, 0xEE));
  p.send(req(op::kRcRdmaWriteMiddle, 101), bytes(1024, 0xEE));
  p.send(req(op::kRcRdmaWriteLast, 102), bytes(1, 0xEE));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(qp->state(), QpState::kErr);
  EXPECT_EQ(0, std::memcmp(before.data(), target.data(), target.n));
  EXPECT_TRUE(target.guards_ok());
  EXPECT_EQ(ctr(Ctr::kRemAccessNakSent), 1u);
}

TEST_F(RespTest, BadReceiveLkeyNaksRemoteOperationalError) {
  // The receive WQE names an lkey that does not exist (S10).
  ASSERT_TRUE(post_recv(qp, 9, {Sge{reinterpret_cast<uint64_t>(rbuf.data()), 64, 0xdead00}}).is_ok());
  p.send(req(op::kRcSendOnly, 100), bytes(16, 3));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteOperationalError));
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 9u);
  EXPECT_EQ(c[0].status, WcStatus::kLocProtErr);  // spec mode (rxe: LOC_QP_OP_ERR)
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(RespTest, SendLongerThanReceiveBufferNaksInvalidRequest) {
  post_rbuf(4, 10);
  p.send(req(op::kRcSendOnly, 100), bytes(11, 3));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kLocLenErr);  // S11 (spec; rxe: REM_INV_REQ_ERR)
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(RespTest, NoReceiveWqeSendsRnrNakWithMinRnrTimer) {
  p.send(req(op::kRcSendOnly, 100), bytes(16, 3));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::rnr_nak(12));
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_EQ(ctr(Ctr::kSendRnrErr), 1u);
  EXPECT_EQ(qp->state(), QpState::kRts);
  // The message's later packets, already in flight, are dropped without a PSN NAK.
  p.send(req(op::kRcSendOnly, 101), bytes(16, 3));
  EXPECT_EQ(step().size(), 0u);
  // After a receive is posted, the retried SEND succeeds at the same PSN.
  post_rbuf(1);
  p.send(req(op::kRcSendOnly, 100), bytes(16, 3));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(drain_cq(*s.rcq).size(), 1u);
}

TEST_F(RespTest, MissingQpAccessNaksInvalidRequest) {
  // S04: qp_access_flags without REMOTE_WRITE.
  qp = s.qp(QpType::kRc);
  ConnOpts o;
  o.rq_psn = kEpsn;
  o.access = kAccessLocalWrite | kAccessRemoteRead;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  p.send(write(op::kRcRdmaWriteOnly, 100, tva(), 4), bytes(4, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(RespTest, MisalignedAtomicNaksInvalidRequest) {
  uint64_t before = *reinterpret_cast<uint64_t*>(target.data() + 64);
  wire::PacketFields f = req(op::kRcCompareSwap, 100);
  f.va = tva(65);
  f.rkey = mt->rkey();
  p.send(f);
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_EQ(before, *reinterpret_cast<uint64_t*>(target.data() + 64));
}

TEST_F(RespTest, DmaLengthAbove2GNaksInvalidRequest) {
  // S06: RETH length > 2^31 is Invalid Request even with a valid rkey.
  p.send(write(op::kRcRdmaReadRequest, 100, tva(), 0x80000001u));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

TEST_F(RespTest, WrappingVaNaksRemoteAccess) {
  // S06: VA near 2^64 whose range wraps: the overflow-safe range check refuses it.
  p.send(write(op::kRcRdmaWriteOnly, 100, ~uint64_t{0} - 1, 4), bytes(4, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakRemoteAccessError));
}

TEST_F(RespTest, WritePayloadMustMatchDmaLength) {
  // ReDMArk A2: WRITE_ONLY whose payload disagrees with the RETH length.
  p.send(write(op::kRcRdmaWriteOnly, 100, tva(), 8), bytes(4, 1));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
}

// ---- ingress drops ----

TEST_F(RespTest, CorruptIcrcIsDroppedAndCounted) {
  post_rbuf(1);
  p.send(req(op::kRcSendOnly, 100), bytes(16, 3), /*corrupt_icrc=*/true);
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kIcrcErr), 1u);
  EXPECT_EQ(qp->resp_.epsn, kEpsn);  // no state touched
  p.send(req(op::kRcSendOnly, 100), bytes(16, 3));
  EXPECT_EQ(step().size(), 1u);
}

// The receive context remembers its recent QP lookups (Engine::rx_find_qp). A destroyed QP is
// let go when destroy_qp returns, with no packet after it (its CQs and their timers go with
// it), and its number is unknown from then on.
TEST_F(RespTest, DestroyedQpIsLetGoAndUnknownAtOnce) {
  post_rbuf(1);
  p.send(req(op::kRcSendOnly, kEpsn), bytes(16, 3));
  ASSERT_EQ(step().size(), 1u);  // its ACK: the lookup is remembered
  wire::PacketFields f = req(op::kRcSendOnly, kEpsn + 1);
  std::weak_ptr<Qp> gone = qp;
  ASSERT_TRUE(s.dev->destroy_qp(qp).is_ok());
  qp.reset();
  EXPECT_TRUE(gone.expired());
  p.send(f, bytes(4, 1));
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
}

// The lookup remembered again while destroy_qp runs (a drain between its first hook and the
// QP leaving the table), here made by taking the engine's hooks away for the destroy: the QP
// table's generation drops the entry at the next packet, and the QPN is unknown.
TEST_F(RespTest, QpRememberedAcrossItsDestroyIsUnknownAtTheNextPacket) {
  post_rbuf(1);
  p.send(req(op::kRcSendOnly, kEpsn), bytes(16, 3));
  ASSERT_EQ(step().size(), 1u);  // its ACK: the lookup is remembered
  post_rbuf(2);
  wire::PacketFields f = req(op::kRcSendOnly, kEpsn + 1);
  s.dev->set_hooks(nullptr);
  ASSERT_TRUE(s.dev->destroy_qp(qp).is_ok());
  s.dev->set_hooks(s.eng.get());
  p.send(f, bytes(4, 1));
  EXPECT_EQ(step().size(), 0u);  // no ACK: not delivered to the destroyed QP
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
}

TEST_F(RespTest, UnknownQpnAndWrongSourceAreDropped) {
  wire::PacketFields f = req(op::kRcSendOnly, 100);
  f.dest_qp = qp->qpn() ^ 0x800000;
  p.send(f, bytes(4, 1));
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kDropUnknownQpn), 1u);
  // A packet from another address than the QP's peer (S33): silent drop.
  Peer other(net, "127.0.0.9", "127.0.0.3");
  other.send(req(op::kRcSendOnly, 100), bytes(4, 1));
  s.eng->poll_rx();
  EXPECT_EQ(other.recv_all().size(), 0u);
  EXPECT_EQ(ctr(Ctr::kDropAddr), 1u);
  EXPECT_EQ(qp->resp_.epsn, kEpsn);
}

// ---- PSN wrap ----

TEST_F(RespTest, PsnWrapsAt24Bits) {
  qp = s.qp(QpType::kRc);
  ConnOpts o;
  o.rq_psn = 0xFFFFFE;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  post_rbuf(1);
  p.send(req(op::kRcSendFirst, 0xFFFFFE, false), bytes(1024, 1));
  p.send(req(op::kRcSendMiddle, 0xFFFFFF, false), bytes(1024, 2));
  p.send(req(op::kRcSendLast, 0x000000, true), bytes(10, 3));
  auto out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), 0u);
  EXPECT_EQ(qp->resp_.epsn, 1u);
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].byte_len, 2058u);
  // A PSN "behind" across the wrap is a duplicate, not a gap.
  p.send(req(op::kRcSendLast, 0xFFFFFF, true), bytes(10, 3));
  out = step();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(ctr(Ctr::kDuplicateRequest), 1u);
}

// ---- UC ----

TEST_F(RespTest, UcGapDropsUntilNextFirst) {
  qp = s.qp(QpType::kUc);
  ConnOpts o;
  o.rq_psn = kEpsn;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  post_rbuf(1);
  // FIRST at 100, MIDDLE at 101 lost, LAST at 102: the message is dropped, no NAK.
  p.send(req(op::kUcSendFirst, 100, false), bytes(1024, 1));
  p.send(req(op::kUcSendLast, 102, false), bytes(5, 1));
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 0u);
  // The next message (ONLY at 103) is delivered into the same, unused WQE.
  p.send(req(op::kUcSendOnly, 103, false), bytes(7, 9));
  EXPECT_EQ(step().size(), 0u);
  auto c = drain_cq(*s.rcq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].byte_len, 7u);
  EXPECT_EQ(rbuf.data()[0], 9);
  EXPECT_EQ(qp->state(), QpState::kRts);
}

TEST_F(RespTest, UcBadRkeyIsDroppedQpStaysRts) {
  qp = s.qp(QpType::kUc);
  ConnOpts o;
  o.rq_psn = kEpsn;
  connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
  std::vector<uint8_t> before(target.data(), target.data() + target.n);
  p.send(write(op::kUcRdmaWriteOnly, 100, tva(), 4, mt->rkey() + 1), bytes(4, 7));
  EXPECT_EQ(step().size(), 0u);
  EXPECT_EQ(qp->state(), QpState::kRts);
  EXPECT_EQ(0, std::memcmp(before.data(), target.data(), target.n));
}

// ---- ACKs ride posts (EngineConfig::ack_hold_ns; shim SOFTRNIC_ACK_HOLD_US) ----

// The device's application answers the peer's SENDs with SENDs of its own on the same QP.
// A hold of an hour, so that "a post soon after the ACK" never depends on this machine's speed;
// the timers are fired by hand.
// kHoldNs, kLingerNs: EngineConfig::ack_hold_ns, linger_ns (LingerTest's linger is 10 s: a
// linger that should not happen then takes 10 s and counts linger_expired, which the test
// sees).
// kTail: EngineConfig::ack_tail (off: the held ACK goes as its own datagram ahead of the
// answer, the layout most tests here check; AckTailTest checks the tail).
template <uint64_t kHoldNs, uint64_t kLingerNs, bool kTail = false>
class HoldFixture : public ::testing::Test {
 protected:
  static EngineConfig hold_config() {
    EngineConfig ec;
    ec.ack_hold_ns = kHoldNs;
    ec.linger_ns = kLingerNs;
    ec.ack_tail = kTail;
    return ec;
  }
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3", false, ErrorsMode::kSpec, 0, hold_config());
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Qp> qp;
  GuardedBuf rbuf{8192}, sbuf{4096};
  std::shared_ptr<Mr> mrb, msb;

  void SetUp() override {
    qp = s.qp(QpType::kRc);
    ConnOpts o;
    o.rq_psn = kEpsn;
    o.sq_psn = 500;
    connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
    mrb = s.mr(rbuf.data(), rbuf.n);
    msb = s.mr(sbuf.data(), sbuf.n);
    for (uint64_t i = 0; i < 8; ++i)
      ASSERT_TRUE(post_recv(qp, i, {sge(rbuf.data() + 512 * i, 512, mrb)}).is_ok());
  }
  // The peer's SEND (AckReq), received in one batch; what the device sent back then.
  std::vector<Captured> peer_send(uint32_t psn) {
    wire::PacketFields f;
    f.opcode = op::kRcSendOnly;
    f.dest_qp = qp->qpn();
    f.psn = psn;
    f.ack_req = true;
    p.send(f, bytes(16, static_cast<uint8_t>(psn)));
    s.eng->poll_rx();
    return p.recv_all();
  }
  // The application's answer; what the device sent for it. The peer then acknowledges the
  // answer (so that no retransmit timer of the device fires in these tests).
  std::vector<Captured> answer(uint64_t id) {
    EXPECT_TRUE(post(qp, send_wr(WrOpcode::kSend, id, {sge(sbuf.data(), 32, msb)})).is_ok());
    auto out = p.recv_all();
    for (const Captured& c : out) {
      if (c.opcode() != op::kRcSendOnly) continue;
      peer_ack(c.psn());
      s.eng->poll_rx();
    }
    return out;
  }
  uint32_t peer_msn = 0;
  void fire_timers() { s.eng->run_timers(wire::monotonic_ns() + 2 * hold_config().ack_hold_ns); }
  uint64_t ctr(Ctr c) { return qp->comp_.ctr.get(c); }
  // One receive round; what the device sent.
  std::vector<Captured> step_only() {
    s.eng->poll_rx();
    return p.recv_all();
  }
  uint64_t dev_ctr(Ctr c) { return s.eng->counters().get(c); }
  // The peer's ACK of the device's SEND at psn (not yet received).
  void peer_ack(uint32_t psn) {
    wire::PacketFields a;
    a.opcode = op::kRcAcknowledge;
    a.dest_qp = qp->qpn();
    a.psn = psn;
    a.syndrome = aeth::ack(aeth::kCreditInvalid);
    a.msn = ++peer_msn;
    p.send(a);
  }
  // Waits (20 s at most) for the device's send completion without polling the CQ: a poll of
  // an empty CQ would receive itself, and could take the ACK from the main thread's drain.
  void wait_for_send_cqe() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (s.scq->count() == 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
    EXPECT_EQ(s.scq->count(), 1u);
  }
  // The peer's SEND at psn (not yet received).
  void peer_send_only(uint32_t psn) {
    wire::PacketFields f;
    f.opcode = op::kRcSendOnly;
    f.dest_qp = qp->qpn();
    f.psn = psn;
    f.ack_req = true;
    p.send(f, bytes(16, static_cast<uint8_t>(psn)));
  }
  // A ping-pong under way: the peer's SEND, the application's answer (posted, not yet
  // acknowledged by the peer); the device's SEND's PSN.
  uint32_t ping_pong_answered() {
    peer_send(kEpsn);
    EXPECT_TRUE(post(qp, send_wr(WrOpcode::kSend, 1, {sge(sbuf.data(), 32, msb)})).is_ok());
    auto out = p.recv_all();
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? 0 : out.back().psn();
  }
};
constexpr uint64_t kHourNs = 3'600'000'000'000ull;
using AckHoldTest = HoldFixture<kHourNs, 5'000>;
using LingerTest = HoldFixture<kHourNs, 10'000'000'000ull>;
using LingerEndTest = HoldFixture<50'000'000, 1'000'000>;  // hold 50 ms, linger 1 ms
using AckTailTest = HoldFixture<kHourNs, 5'000, true>;

// With ack_tail the held ACK rides the answer as the short last segment of the answer's
// GSO datagram: segment 0 the SEND, segment 1 the ACK (IP IDs 0 and 1).
TEST_F(AckTailTest, HeldAckRidesAsTheLastSegmentOfTheAnswer) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());  // held
  auto out = answer(2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcSendOnly);
  EXPECT_EQ(out[0].psn(), 501u);
  EXPECT_EQ(out[0].ip_id, 0u);
  EXPECT_EQ(out[1].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[1].psn(), kEpsn + 1);
  EXPECT_EQ(out[1].ip_id, 1u);  // the same datagram
  EXPECT_EQ(ctr(Ctr::kAckOnPost), 1u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 2u);
}

// An ACK that cannot be the last segment (a 0-byte SEND is shorter than an ACK; a message of
// several packets ends its run with a short one) goes as a datagram of its own, ahead of the
// answer, where it went without the tail.
TEST_F(AckTailTest, AckThatCannotBeTheTailGoesAheadOfTheAnswer) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 2, {})).is_ok());
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
  EXPECT_EQ(out[1].opcode(), op::kRcSendOnly);
  EXPECT_EQ(out[0].ip_id, 0u);
  EXPECT_EQ(out[1].ip_id, 0u);
  peer_ack(out[1].psn());
  s.eng->poll_rx();
  // A 2-byte SEND is as long as an ACK (the payload is padded to 4): a tail must be shorter,
  // so that the receiver can tell it, and this ACK goes ahead too.
  ASSERT_TRUE(peer_send(kEpsn + 2).empty());
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 3, {sge(sbuf.data(), 2, msb)})).is_ok());
  out = p.recv_all();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].bytes.size(), out[1].bytes.size());
  EXPECT_EQ(out[1].opcode(), op::kRcSendOnly);
  EXPECT_EQ(out[1].ip_id, 0u);
  peer_ack(out[1].psn());
  s.eng->poll_rx();
  ASSERT_TRUE(peer_send(kEpsn + 3).empty());
  // Three packets (MTU 1024) of 2100 bytes: the run ends with a short segment.
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 4, {sge(sbuf.data(), 2100, msb)})).is_ok());
  out = p.recv_all();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 3);
  EXPECT_EQ(out[1].opcode(), op::kRcSendFirst);
  EXPECT_EQ(out[3].opcode(), op::kRcSendLast);
  EXPECT_EQ(ctr(Ctr::kAckOnPost), 3u);
}

// The receiving side: a GRO buffer whose short last segment is an ACK behind a request is
// handled ACK first, so the completion of the message the ACK acknowledges comes before the
// answer's (one CQ for both here shows the order).
class AckTailRxTest : public AckTailTest {
 protected:
  void SetUp() override {
    s.rcq = s.scq;
    AckTailTest::SetUp();
    static_cast<wire::MemPort&>(s.eng->port()).set_gro(true);
  }
};

TEST_F(AckTailRxTest, AckTailOfAGroBufferIsHandledFirst) {
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 7, {sge(sbuf.data(), 32, msb)})).is_ok());
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  const uint32_t sent_psn = out[0].psn();
  // The peer's answer and, as the tail of the same GSO datagram, its ACK of our SEND.
  wire::PacketFields req;
  req.opcode = op::kRcSendOnly;
  req.dest_qp = qp->qpn();
  req.psn = kEpsn;
  req.ack_req = true;
  wire::PacketFields ack;
  ack.opcode = op::kRcAcknowledge;
  ack.dest_qp = qp->qpn();
  ack.psn = sent_psn;
  ack.syndrome = aeth::ack(aeth::kCreditInvalid);
  ack.msn = 1;
  std::vector<uint8_t> b(8192);
  wire::IpUdpMeta m = p.meta();
  m.ip_id = 0;
  const std::vector<uint8_t> pay = bytes(16, 0x5a);
  const size_t n0 = wire::build_roce(b, req, pay, m);
  m.ip_id = 1;
  const size_t n1 = wire::build_roce(std::span<uint8_t>(b).subspan(n0), ack, {}, m);
  ASSERT_GT(n0, n1);
  wire::TxDesc t;
  t.dst = p.dut;
  t.data = b.data();
  t.len = static_cast<uint32_t>(n0 + n1);
  t.gso_size = static_cast<uint16_t>(n0);
  ASSERT_EQ(p.port->send_batch(std::span<const wire::TxDesc>(&t, 1)), 1);
  s.eng->poll_rx();
  auto cq = drain_cq(*s.scq);
  ASSERT_EQ(cq.size(), 2u);
  EXPECT_EQ(cq[0].wr_id, 7u) << "the ACK's send completion first";
  EXPECT_EQ(cq[0].status, WcStatus::kSuccess);
  EXPECT_EQ(cq[1].wr_id, 0u) << "then the answer's receive";
  EXPECT_EQ(cq[1].status, WcStatus::kSuccess);
}

TEST_F(AckHoldTest, AckRidesTheAnswerOnceTheApplicationAnswers) {
  // Given a QP whose application has not answered yet: the ACK goes when the batch ends.
  auto out = peer_send(kEpsn);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn);
  // The application answers (soon after that ACK): holding starts, the answer goes alone.
  out = answer(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcSendOnly);
  // Expect the next request's ACK held for the next post...
  EXPECT_TRUE(peer_send(kEpsn + 1).empty());
  // ... which sends it first, then its own SEND, in one batch.
  out = answer(2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[1].opcode(), op::kRcSendOnly);
  EXPECT_EQ(out[1].psn(), 501u);
  EXPECT_EQ(ctr(Ctr::kAckOnPost), 1u);
  EXPECT_EQ(ctr(Ctr::kAckHoldExpired), 0u);
  // Both requests completed at once; holding delays no CQE.
  EXPECT_EQ(drain_cq(*s.rcq).size(), 2u);
}

TEST_F(AckHoldTest, HeldAckNoPostTakesGoesAtItsDeadlineAndHoldingStops) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  ASSERT_TRUE(peer_send(kEpsn + 2).empty());  // coalesced into the one held ACK
  // Expect nothing before the deadline, the latest ACK at it.
  s.eng->run_timers(wire::monotonic_ns());
  EXPECT_TRUE(p.recv_all().empty());
  fire_timers();
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 2);
  EXPECT_EQ(ctr(Ctr::kAckHoldExpired), 1u);
  // The application did not answer in time: the next ACK goes when its batch ends.
  out = peer_send(kEpsn + 3);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kEpsn + 3);
  // And the next post carries nothing (nothing owed).
  out = answer(2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcSendOnly);
  EXPECT_EQ(ctr(Ctr::kAckOnPost), 0u);
}

// The held ACKs' deadline stays on the timerfd when an earlier deadline fires first (here
// the stale retransmit-timer entry of the answer, acknowledged since): run_timers re-arms
// it, or nothing would wake the progress thread to send the ACK.
TEST_F(AckHoldTest, HeldDeadlineStaysArmedAfterAnEarlierTimerFires) {
  peer_send(kEpsn);
  answer(1);
  const uint64_t t0 = wire::monotonic_ns();
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());  // held: deadline t0 + 1 h
  s.eng->run_timers(t0 + 60'000'000'000ull);  // a minute on: the retransmit entry is due
  const uint64_t armed = s.eng->timerfd_deadline_ns();
  EXPECT_GT(armed, t0 + 30 * 60'000'000'000ull);
  EXPECT_LT(armed, ~uint64_t{0}) << "no timer armed for the held ACK";
  EXPECT_TRUE(p.recv_all().empty());
  fire_timers();
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
}

// A request that a response releases (here a fenced SEND behind a READ; in tag matching the
// rendezvous FIN) goes after the ACK its QP owes, whether that ACK is held from an earlier
// batch or owed in the batch that carries the response: a requester must see its send
// completion before the answer (rdma-core's test_tm_rndv and tag_matching_test failed in CI
// when the FIN went first).
TEST_F(AckHoldTest, ARequestReleasedByAResponseGoesAfterTheOwedAck) {
  peer_send(kEpsn);
  answer(1);  // PSN 500; holding is on
  for (bool same_batch : {false, true}) {
    SCOPED_TRACE(same_batch ? "ACK owed in the response's batch" : "ACK held from before");
    const uint32_t rpsn = same_batch ? 503 : 501;  // the READ's PSN
    const uint32_t req_psn = same_batch ? kEpsn + 2 : kEpsn + 1;
    Wr rd = send_wr(WrOpcode::kRdmaRead, 10, {sge(sbuf.data(), 8, msb)});
    rd.rdma.remote_addr = 0x1000;
    rd.rdma.rkey = 0x77;
    ASSERT_TRUE(post(qp, rd).is_ok());
    ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 11, {sge(sbuf.data(), 16, msb)},
                                 kSendSignaled | kSendFence)).is_ok());
    auto out = p.recv_all();
    ASSERT_EQ(out.size(), 1u) << "the READ only: the SEND waits for its data";
    EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadRequest);
    EXPECT_EQ(out[0].psn(), rpsn);
    wire::PacketFields f;
    f.opcode = op::kRcSendOnly;
    f.dest_qp = qp->qpn();
    f.psn = req_psn;
    f.ack_req = true;
    p.send(f, bytes(16, 3));
    if (!same_batch) {
      ASSERT_TRUE(step_only().empty()) << "its ACK is held";
    }
    wire::PacketFields r;
    r.opcode = op::kRcRdmaReadResponseOnly;
    r.dest_qp = qp->qpn();
    r.psn = rpsn;
    r.syndrome = aeth::ack(aeth::kCreditInvalid);
    r.msn = ++peer_msn;
    p.send(r, bytes(8, 4));
    out = step_only();
    ASSERT_GE(out.size(), 2u);
    EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
    EXPECT_EQ(out[0].psn(), req_psn);
    EXPECT_EQ(out[1].opcode(), op::kRcSendOnly);
    EXPECT_EQ(out[1].psn(), rpsn + 1);
    // The peer acknowledges the SEND.
    wire::PacketFields a;
    a.opcode = op::kRcAcknowledge;
    a.dest_qp = qp->qpn();
    a.psn = rpsn + 1;
    a.syndrome = aeth::ack(aeth::kCreditInvalid);
    a.msn = ++peer_msn;
    p.send(a);
    s.eng->poll_rx();
    p.recv_all();
  }
}

// An application thread that leaves the data path (a CM call, ibv_get_cq_event) will not post
// within the hold: the held ACK goes at once, not at the progress thread's timer (which on a
// machine with every core busy woke 1-10 ms late), and holding stops until a post shows the
// ping-pong again.
TEST_F(AckHoldTest, LeavingTheDataPathSendsTheHeldAckAtOnce) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  s.eng->release_held_acks_now();
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
  EXPECT_EQ(ctr(Ctr::kAckHoldExpired), 1u);
  // Nothing is left for the timer, and the next ACK goes when its batch ends.
  fire_timers();
  EXPECT_TRUE(p.recv_all().empty());
  out = peer_send(kEpsn + 2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kEpsn + 2);
  // With nothing held it is a no-op.
  s.eng->release_held_acks_now();
  EXPECT_TRUE(p.recv_all().empty());
}

// Writes through to memory and runs `hook` once, at the first write.
struct OnFirstWrite final : MemAccess {
  DirectMemAccess d;
  std::function<void()> hook;
  bool read(uint64_t a, void* dst, size_t len) override { return d.read(a, dst, len); }
  bool write(uint64_t a, const void* src, size_t len) override {
    bool ok = d.write(a, src, len);
    if (hook) std::exchange(hook, nullptr)();
    return ok;
  }
  bool atomic_cas64(uint64_t a, uint64_t c, uint64_t s, uint64_t* o) override {
    return d.atomic_cas64(a, c, s, o);
  }
  bool atomic_faa64(uint64_t a, uint64_t v, uint64_t* o) override { return d.atomic_faa64(a, v, o); }
  bool atomic_write64(uint64_t a, uint64_t v) override { return d.atomic_write64(a, v); }
};

// Leaving while a drain holds the receive lock (here this very thread, from inside the copy
// of the next SEND): the call does not wait for the lock, and the drain's batch end sends the
// held ACK (coalesced with the new one) instead of holding it on.
TEST_F(AckHoldTest, LeavingDuringADrainSendsTheHeldAckAtTheBatchEnd) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  auto mem = std::make_shared<OnFirstWrite>();
  mem->hook = [&] { s.eng->release_held_acks_now(); };
  s.dev->set_mem(mem);
  auto out = peer_send(kEpsn + 2);
  EXPECT_EQ(mem->hook, nullptr) << "the SEND was placed";
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 2);
  EXPECT_EQ(ctr(Ctr::kAckHoldExpired), 1u);
  EXPECT_EQ(drain_cq(*s.rcq).size(), 3u);
}

// A post from another thread while its QP's ACK is still listed in a receive batch (here
// the batch's next packet, for a second QP, is being placed) cannot take that ACK: the batch
// sends it at its end instead of holding it for a post that has already gone (it would
// wait a whole message for the next one).
TEST_F(AckHoldTest, AnAckAPostPassedGoesAtTheBatchEnd) {
  peer_send(kEpsn);
  answer(1);  // qp holds ACKs from now on
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  std::vector<Captured> out = answer(2);  // takes the held ACK: holding is on
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].opcode(), op::kRcAcknowledge);
  auto qp2 = s.qp(QpType::kRc);
  ConnOpts o;
  o.rq_psn = 900;
  o.sq_psn = 700;
  connect_qp(*s.dev, qp2, "127.0.0.2", kPeerQpn + 1, o);
  ASSERT_TRUE(post_recv(qp2, 0, {sge(rbuf.data() + 4096, 512, mrb)}).is_ok());
  // One batch: qp's SEND (its ACK is listed), then qp2's, whose placing runs the post.
  auto mem = std::make_shared<OnFirstWrite>();
  int writes = 0;
  bool posted = false;
  std::function<void()> on_write = [&] {
    if (++writes < 2) {
      mem->hook = on_write;  // the next write
      return;
    }
    std::thread t([&] {
      posted = post(qp, send_wr(WrOpcode::kSend, 3, {sge(sbuf.data(), 32, msb)})).is_ok();
    });
    t.join();
  };
  mem->hook = on_write;
  s.dev->set_mem(mem);
  peer_send_only(kEpsn + 2);
  wire::PacketFields f;
  f.opcode = op::kRcSendOnly;
  f.dest_qp = qp2->qpn();
  f.psn = 900;
  f.ack_req = true;
  p.send(f, bytes(16, 0x22));
  s.eng->poll_rx();
  ASSERT_EQ(writes, 2) << "both SENDs were placed";
  ASSERT_TRUE(posted);
  out = p.recv_all();
  // The post's SEND (alone), then at the batch's end both ACKs: none is held.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].opcode(), op::kRcSendOnly);
  int acks = 0;
  for (size_t i = 1; i < out.size(); ++i) {
    ASSERT_EQ(out[i].opcode(), op::kRcAcknowledge);
    if (out[i].f.dest_qp == kPeerQpn) {
      EXPECT_EQ(out[i].psn(), kEpsn + 2);
      ++acks;
    }
  }
  EXPECT_EQ(acks, 1) << "qp's ACK was held for a post that had gone";
  peer_ack(out[0].psn());  // (no retransmit of the post's SEND below)
  s.eng->poll_rx();
  fire_timers();
  EXPECT_TRUE(p.recv_all().empty());
  EXPECT_EQ(ctr(Ctr::kAckHoldExpired), 0u);
  // Holding stays on for the QP: the next ACK waits for the next post.
  ASSERT_TRUE(peer_send(kEpsn + 3).empty());
}

TEST_F(AckHoldTest, DestroyingTheQpSendsItsHeldAck) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  drain_cq(*s.scq);
  drain_cq(*s.rcq);
  ASSERT_TRUE(s.dev->destroy_qp(qp).is_ok());
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
}

TEST_F(AckHoldTest, ANakIsNeverHeldAndGoesAfterTheHeldAck) {
  peer_send(kEpsn);
  answer(1);
  ASSERT_TRUE(peer_send(kEpsn + 1).empty());
  // A PSN gap: the NAK goes at once, after the ACK it follows (PSN order).
  wire::PacketFields f;
  f.opcode = op::kRcSendOnly;
  f.dest_qp = qp->qpn();
  f.psn = kEpsn + 5;
  f.ack_req = true;
  p.send(f, bytes(16, 1));
  s.eng->poll_rx();
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].syndrome(), aeth::ack(aeth::kCreditInvalid));
  EXPECT_EQ(out[0].psn(), kEpsn + 1);
  EXPECT_EQ(out[1].syndrome(), aeth::nak(aeth::kNakPsnSeqError));
}

// Linger (Engine::linger_rx): a poll_cq drain that handles the ACK completing the last WQE
// of a ping-pong's QP waits for the peer's answer behind it; here the answer comes only once
// the send completion is there (another thread waits for it), so without the linger the
// drain would return with one datagram.
TEST_F(LingerTest, ADrainWaitsForTheAnswerBehindAPingPongsAck) {
  const uint32_t psn = ping_pong_answered();
  drain_cq(*s.rcq);
  peer_ack(psn);
  std::thread peer([&] {
    wait_for_send_cqe();
    peer_send_only(kEpsn + 1);
  });
  const int got = s.eng->poll_rx();
  peer.join();
  EXPECT_EQ(got, 2);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit), 1u);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 0u);
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
  auto rc = drain_cq(*s.rcq);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::kSuccess);
}

// A multi-packet answer (an RDMA WRITE of two packets, as ib_write_lat 64 KiB): its first
// packet does not end the wait; the rest gets a new window, and the drain returns with the
// whole message (here the last packet comes 20 ms after the first).
TEST_F(LingerTest, AMultiPacketAnswerIsWaitedForToItsLastPacket) {
  const uint32_t psn = ping_pong_answered();
  drain_cq(*s.rcq);
  peer_ack(psn);
  std::vector<uint8_t> data(1024 + 100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  const uint64_t va = reinterpret_cast<uint64_t>(rbuf.data() + 4096);
  std::thread peer([&] {
    wait_for_send_cqe();
    wire::PacketFields f;
    f.opcode = op::kRcRdmaWriteFirst;
    f.dest_qp = qp->qpn();
    f.psn = kEpsn + 1;
    f.va = va;
    f.rkey = mrb->rkey();
    f.dma_len = static_cast<uint32_t>(data.size());
    p.send(f, std::vector<uint8_t>(data.begin(), data.begin() + 1024));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    wire::PacketFields l;
    l.opcode = op::kRcRdmaWriteLast;
    l.dest_qp = qp->qpn();
    l.psn = kEpsn + 2;
    l.ack_req = true;
    p.send(l, std::vector<uint8_t>(data.begin() + 1024, data.end()));
  });
  const int got = s.eng->poll_rx();
  peer.join();
  EXPECT_EQ(got, 3);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit), 1u);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 0u);
  EXPECT_EQ(std::memcmp(rbuf.data() + 4096, data.data(), data.size()), 0);
}

// The answer came in the ACK's own batch (the peer's post carried the ACK): no linger.
TEST_F(LingerTest, NoLingerWhenTheAnswerCameWithTheAck) {
  const uint32_t psn = ping_pong_answered();
  peer_ack(psn);
  peer_send_only(kEpsn + 1);
  EXPECT_EQ(s.eng->poll_rx(), 2);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit), 0u);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 0u);
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
}

// A QP whose application does not answer its peer (it sends first, nothing came): its ACK is
// not a ping-pong's, the drain returns at once.
TEST_F(LingerTest, NoLingerForAQpNotInAPingPong) {
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 1, {sge(sbuf.data(), 32, msb)})).is_ok());
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  peer_ack(out[0].psn());
  EXPECT_EQ(s.eng->poll_rx(), 1);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit) + dev_ctr(Ctr::kLingerExpired), 0u);
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
}

// The ping-pong ended: the application goes on posting, but not in answer to anything (the
// peer sends no more requests, the last ACK it was owed rode a post). Those posts' ACKs are
// not a ping-pong's: no linger. (Holding stays on for the QP: nothing owed ever expires.)
TEST_F(LingerEndTest, NoLingerOncePostsNoLongerAnswer) {
  const uint32_t psn = ping_pong_answered();
  peer_ack(psn);
  peer_send_only(kEpsn + 1);  // with the ACK: the answer, whose ACK is held
  EXPECT_EQ(s.eng->poll_rx(), 2);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired) + dev_ctr(Ctr::kLingerHit), 0u);
  // The application answers again; its post takes the held ACK.
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 2, {sge(sbuf.data(), 32, msb)})).is_ok());
  auto out = p.recv_all();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].opcode(), op::kRcAcknowledge);
  // That answer's ACK comes alone: its drain waits 1 ms for an answer that never comes.
  peer_ack(out[1].psn());
  EXPECT_EQ(s.eng->poll_rx(), 1);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 1u);
  // Later than the hold, a one-way SEND: its ACK's drain returns at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, 3, {sge(sbuf.data(), 32, msb)})).is_ok());
  out = p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  peer_ack(out[0].psn());
  EXPECT_EQ(s.eng->poll_rx(), 1);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 1u);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit), 0u);
  EXPECT_EQ(drain_cq(*s.scq).size(), 3u);
}

// No answer within linger_ns (5 us): the drain gives up and returns; the answer, when it
// comes, is received by the next drain.
TEST_F(AckHoldTest, LingerGivesUpWhenNoAnswerComes) {
  const uint32_t psn = ping_pong_answered();
  peer_ack(psn);
  EXPECT_EQ(s.eng->poll_rx(), 1);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 1u);
  EXPECT_EQ(dev_ctr(Ctr::kLingerHit), 0u);
  peer_send_only(kEpsn + 1);
  EXPECT_EQ(s.eng->poll_rx(), 1);
  EXPECT_EQ(dev_ctr(Ctr::kLingerExpired), 1u);
}

// An RC QP of a default engine (no progress thread) connected to a raw peer, with 3 receive
// WQEs of 512 B.
struct DefaultRcQp {
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3");
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Qp> qp = s.qp(QpType::kRc);
  GuardedBuf rbuf{4096};
  std::shared_ptr<Mr> mrb = s.mr(rbuf.data(), rbuf.n);
  DefaultRcQp() {
    ConnOpts o;
    o.rq_psn = kEpsn;
    o.sq_psn = 500;
    connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
    for (uint64_t i = 0; i < 3; ++i)
      EXPECT_TRUE(post_recv(qp, i, {sge(rbuf.data() + 512 * i, 512, mrb)}).is_ok());
  }
  // The peer's 8-byte SEND at kEpsn + k (AckReq), not yet received.
  void peer_send(uint32_t k) {
    wire::PacketFields f;
    f.opcode = op::kRcSendOnly;
    f.dest_qp = qp->qpn();
    f.psn = kEpsn + k;
    f.ack_req = true;
    p.send(f, bytes(8, 1));
  }
};

TEST(AckHoldDefault, EngineNeverHoldsAcksByDefault) {
  EXPECT_EQ(EngineConfig{}.ack_hold_ns, 0u);
  DefaultRcQp d;
  auto& [net, s, p, qp, rbuf, mrb] = d;
  for (uint32_t k = 0; k < 3; ++k) {
    d.peer_send(k);
    s.eng->poll_rx();
    auto out = p.recv_all();
    ASSERT_EQ(out.size(), 1u) << k;
    EXPECT_EQ(out[0].psn(), kEpsn + k);
    ASSERT_TRUE(post(qp, send_wr(WrOpcode::kSend, k, {sge(rbuf.data(), 8, mrb)})).is_ok());
    out = p.recv_all();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].opcode(), op::kRcSendOnly);
  }
  EXPECT_EQ(qp->comp_.ctr.get(Ctr::kAckOnPost), 0u);
}

// rx_drain_poll / rx_drain_progress count receive drains that got datagrams, by who ran them:
// here every drain is the test thread's (no progress thread), one per datagram sent, and a
// drain that found the socket empty counts nowhere.
TEST(RxDrainCounters, CountDrainsWithDatagramsByWhoRanThem) {
  DefaultRcQp d;
  Node& s = d.s;
  EXPECT_EQ(s.eng->poll_rx(), 0);
  for (uint32_t k = 0; k < 3; ++k) {
    d.peer_send(k);
    EXPECT_EQ(s.eng->poll_rx(), 1);
    EXPECT_EQ(s.eng->poll_rx(), 0);
  }
  EXPECT_EQ(s.eng->counters().get(Ctr::kRxDrainPoll), 3u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kRxDrainProgress), 0u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kRcvdPkts), 3u);
}

}  // namespace
}  // namespace rnic::emu::test
