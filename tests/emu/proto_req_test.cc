// tests/emu/proto_req_test.cc: protocol tests of the REQUESTER and COMPLETER, Given/Expect
// style: the device sends, a raw peer port plays the responder with hand-built ACKs, NAKs
// and responses; timers are fired by hand (Engine::run_timers) so nothing depends on time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "base/log.h"
#include "emu/transport/req.h"
#include "tests/emu/req_peer_fixture.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;
namespace aeth = wire::aeth;

using ReqTest = ReqPeerFixture;

TEST_F(ReqTest, SegmentsByMtuWithAckReqOnLast) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 3000).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].opcode(), op::kRcSendFirst);
  EXPECT_EQ(out[1].opcode(), op::kRcSendMiddle);
  EXPECT_EQ(out[2].opcode(), op::kRcSendLast);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].psn(), kSpsn + i);
    EXPECT_EQ(out[i].f.dest_qp, kPeerQpn);
    EXPECT_EQ(out[i].f.ack_req, i == 2);
    EXPECT_EQ(out[i].f.pkey, 0xffff);
  }
  EXPECT_EQ(out[2].v.payload_len, 3000u - 2048u);
  EXPECT_EQ(0, std::memcmp(out[1].v.payload, buf.data() + 1024, 1024));
  EXPECT_EQ(drain_cq(*s.scq).size(), 0u);  // not complete before the ACK
  ack(502);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].wr_id, 1u);
}

TEST_F(ReqTest, AckReqAtLeastEvery64Packets) {
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 100 * 1024).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 100u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteFirst);
  EXPECT_EQ(out[0].f.dma_len, 100u * 1024u);
  EXPECT_EQ(out[0].f.rkey, kRkey);
  int reqs = 0;
  for (auto& c : out) reqs += c.f.ack_req;
  EXPECT_EQ(reqs, 2);
  EXPECT_TRUE(out[63].f.ack_req);
  EXPECT_TRUE(out[99].f.ack_req);
  ack(kSpsn + 99);
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
}

TEST_F(ReqTest, CoalescedAckCompletesEveryCoveredWqeInOrder) {
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(post_op(WrOpcode::kSend, i, 10).is_ok());
  EXPECT_EQ(sent().size(), 3u);
  ack(kSpsn + 1);  // covers the first two
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 0u);
  EXPECT_EQ(c[1].wr_id, 1u);
  ack(kSpsn);  // an older ACK changes nothing
  EXPECT_EQ(drain_cq(*s.scq).size(), 0u);
  ack(kSpsn + 2);
  c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 2u);
}

// A peer already known to discard what follows a gap (two selective resends answered in
// order: SendWindow::inorder_votes, docs/congestion.md §2; ConnectX, rxe): a PSN-sequence NAK
// goes back N at once, as IBA's requester does.
TEST_F(ReqTest, PsnSequenceNakGoesBackN) {
  qp->comp_.win.inorder_votes = SendWindow::kInorderVotes;
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 3000).is_ok());
  ASSERT_EQ(sent().size(), 3u);
  // The responder lost PSN 501: it NAKs with the PSN it expects.
  ack(kSpsn + 1, aeth::nak(aeth::kNakPsnSeqError));
  auto out = sent();
  // Expect: go back to 501, resend MIDDLE and LAST with the same bytes.
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].psn(), kSpsn + 1);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteMiddle);
  EXPECT_EQ(0, std::memcmp(out[0].v.payload, buf.data() + 1024, 1024));
  EXPECT_EQ(out[1].psn(), kSpsn + 2);
  EXPECT_EQ(ctr(Ctr::kRcvdSeqErr), 1u);
  ack(kSpsn + 2);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
}

// Any other peer: the NAK'd PSN goes again alone, and the answer to it decides. Past
// everything sent before the resend: the responder kept the rest (a stashing softrnic),
// nothing more is sent. Exactly the resent PSN: it discarded the rest, go back N from there.
TEST_F(ReqTest, PsnSequenceNakResendsThatPsnAloneFirst) {
  for (bool stashing_peer : {true, false}) {
    SCOPED_TRACE(stashing_peer ? "stashing peer" : "in-order peer");
    setup({});
    ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 3000).is_ok());
    ASSERT_EQ(sent().size(), 3u);
    ack(kSpsn + 1, aeth::nak(aeth::kNakPsnSeqError));  // 500 implicitly acknowledged
    auto out = sent();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].psn(), kSpsn + 1);
    EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteMiddle);
    EXPECT_TRUE(out[0].f.ack_req);  // its answer is what decides
    EXPECT_EQ(0, std::memcmp(out[0].v.payload, buf.data() + 1024, 1024));
    EXPECT_EQ(ctr(Ctr::kRcvdSeqErr), 1u);
    EXPECT_EQ(ctr(Ctr::kWindowCuts), 0u);
    if (stashing_peer) {
      ack(kSpsn + 2);
      EXPECT_EQ(sent().size(), 0u);
      EXPECT_EQ(ctr(Ctr::kRetransPkts), 1u);
      EXPECT_EQ(ctr(Ctr::kWindowCuts), 0u);
      EXPECT_EQ(qp->comp_.win.inorder_votes, 0u);
    } else {
      ack(kSpsn + 1);
      out = sent();
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].psn(), kSpsn + 2);
      EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteLast);
      EXPECT_EQ(ctr(Ctr::kRetransPkts), 2u);
      EXPECT_EQ(ctr(Ctr::kWindowCuts), 1u);
      EXPECT_EQ(qp->comp_.win.inorder_votes, 1u);
      ack(kSpsn + 2);
    }
    auto c = drain_cq(*s.scq);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  }
}

// A learned in-order peer is tried selectively again on every 8th NAK (a stashing peer can
// look in-order twice in a row under heavy loss); an answer past the resend unlearns it.
TEST_F(ReqTest, LearnedInOrderPeerIsRetriedSelectivelyEveryEighthNak) {
  qp->comp_.win.inorder_votes = SendWindow::kInorderVotes;
  for (uint32_t m = 0; m < SendWindow::kInorderRetry; ++m) {
    SCOPED_TRACE(m);
    const uint32_t base = kSpsn + 3 * m;
    ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, m, 3000).is_ok());
    ASSERT_EQ(sent().size(), 3u);
    ack(base + 1, aeth::nak(aeth::kNakPsnSeqError));
    auto out = sent();
    const bool selective = m + 1 == SendWindow::kInorderRetry;
    ASSERT_EQ(out.size(), selective ? 1u : 2u);  // alone, or the go-back of 501 and 502
    EXPECT_EQ(out[0].psn(), base + 1);
    ack(base + 2);
    auto c = drain_cq(*s.scq);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, WcStatus::kSuccess);
    EXPECT_EQ(qp->comp_.win.inorder_votes, selective ? 0u : SendWindow::kInorderVotes);
  }
}

TEST_F(ReqTest, TimeoutRetransmitsThenRetryExceeded) {
  ConnOpts o;
  o.retry_cnt = 2;
  setup(o);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 10).is_ok());
  EXPECT_EQ(sent().size(), 2u);
  EXPECT_NE(s.eng->next_deadline_ns(), 0u);  // the retransmit timer is armed
  // Nobody answers: each expiry resends the oldest unacknowledged PSN alone (window 1: the
  // rest follows as ACKs return, docs/congestion.md).
  fire_timers();
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn);
  fire_timers();
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn);
  EXPECT_EQ(ctr(Ctr::kCompleterRetryErr), 2u);
  // Third expiry with retry_cnt = 2 spent: RETRY_EXC_ERR, QP to ERR, the rest flushed.
  fire_timers();
  EXPECT_EQ(sent().size(), 0u);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(c[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(qp->state(), QpState::kErr);
  EXPECT_EQ(ctr(Ctr::kRetryExceededErr), 1u);
  EXPECT_EQ(ctr(Ctr::kLocalAckTimeoutErr), 3u);
}

TEST_F(ReqTest, ProgressResetsRetryCount) {
  ConnOpts o;
  o.retry_cnt = 1;
  setup(o);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 10).is_ok());
  sent();
  fire_timers();  // one retry spent: the oldest goes alone
  EXPECT_EQ(sent().size(), 1u);
  ack(kSpsn);  // forward progress: the count is back to 1, and the window lets 501 go
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn + 1);
  fire_timers();
  EXPECT_EQ(sent().size(), 1u);
  ack(kSpsn + 1);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].status, WcStatus::kSuccess);
}

TEST_F(ReqTest, RnrNakWaitsForTimerThenRetries) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  ASSERT_EQ(sent().size(), 1u);
  ack(kSpsn, aeth::rnr_nak(14));
  EXPECT_EQ(ctr(Ctr::kRcvdRnrErr), 1u);
  // Blocked until the RNR timer fires: new WRs wait too.
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 10).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  fire_timers();
  auto out = sent();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].psn(), kSpsn);
  EXPECT_EQ(out[1].psn(), kSpsn + 1);
  ack(kSpsn + 1);
  EXPECT_EQ(drain_cq(*s.scq).size(), 2u);
}

TEST_F(ReqTest, RnrRetryExhausted) {
  ConnOpts o;
  o.rnr_retry = 2;
  setup(o);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(sent().size(), 1u);
    ack(kSpsn, aeth::rnr_nak(1));
    fire_timers();
  }
  ASSERT_EQ(sent().size(), 1u);
  ack(kSpsn, aeth::rnr_nak(1));
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRnrRetryExcErr);
  EXPECT_EQ(qp->state(), QpState::kErr);
  EXPECT_EQ(ctr(Ctr::kRcvdRnrErr), 3u);
  EXPECT_EQ(ctr(Ctr::kRnrNakRetryErr), 1u);
}

TEST(RnrTimerTable, IbaValues) {
  EXPECT_EQ(rnr_timer_ns(0), 655'360'000u);
  EXPECT_EQ(rnr_timer_ns(1), 10'000u);
  EXPECT_EQ(rnr_timer_ns(14), 1'280'000u);
  EXPECT_EQ(rnr_timer_ns(31), 491'520'000u);
  EXPECT_EQ(ack_timeout_ns(0), 0u);
  EXPECT_EQ(ack_timeout_ns(14), 4096ull << 14);  // 67.1 ms
}

struct NakCase {
  uint8_t code;
  WcStatus status;
};
class NakStatusTest : public ReqTest, public ::testing::WithParamInterface<NakCase> {};

TEST_P(NakStatusTest, NakCodeMapsToWcStatusAndErr) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 2, 10).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 3, 10).is_ok());
  ASSERT_EQ(sent().size(), 3u);
  // The NAK names the WRITE (PSN 501): the SEND before it is implicitly acknowledged.
  ack(kSpsn + 1, aeth::nak(GetParam().code));
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].status, GetParam().status);
  EXPECT_EQ(c[2].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(qp->state(), QpState::kErr);
}
INSTANTIATE_TEST_SUITE_P(Codes, NakStatusTest,
                         ::testing::Values(NakCase{aeth::kNakInvalidRequest, WcStatus::kRemInvReqErr},
                                           NakCase{aeth::kNakRemoteAccessError, WcStatus::kRemAccessErr},
                                           NakCase{aeth::kNakRemoteOperationalError, WcStatus::kRemOpErr},
                                           NakCase{9, WcStatus::kRemOpErr}));

TEST_F(ReqTest, NakForNonOutstandingPsnIsIgnored) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  sent();
  ack(kSpsn + 50, aeth::nak(aeth::kNakRemoteAccessError));  // S31: not an outstanding PSN
  ack(kSpsn - 3, aeth::nak(aeth::kNakRemoteAccessError));
  EXPECT_EQ(qp->state(), QpState::kRts);
  EXPECT_EQ(drain_cq(*s.scq).size(), 0u);
  ack(kSpsn);
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
}

TEST_F(ReqTest, ReadResponsesLandAndLostOneIsReRequested) {
  ASSERT_TRUE(post_op(WrOpcode::kRdmaRead, 1, 3000).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadRequest);
  EXPECT_EQ(out[0].f.dma_len, 3000u);
  EXPECT_EQ(out[0].f.va, kRemoteVa);
  std::vector<uint8_t> data(3000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  std::span<const uint8_t> d(data);
  // FIRST arrives, MIDDLE (501) is lost, LAST arrives: go back to 501.
  respond(op::kRcRdmaReadResponseFirst, 500, aeth::ack(31), d.subspan(0, 1024));
  respond(op::kRcRdmaReadResponseLast, 502, aeth::ack(31), d.subspan(2048));
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadRequest);
  EXPECT_EQ(out[0].psn(), 501u);
  EXPECT_EQ(out[0].f.va, kRemoteVa + 1024);
  EXPECT_EQ(out[0].f.dma_len, 3000u - 1024u);
  respond(op::kRcRdmaReadResponseFirst, 501, aeth::ack(31), d.subspan(1024, 1024));
  respond(op::kRcRdmaReadResponseLast, 502, aeth::ack(31), d.subspan(2048));
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(c[0].byte_len, 3000u);
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), 3000));
  EXPECT_TRUE(buf.guards_ok());
}

TEST_F(ReqTest, AckPastUnansweredReadRetriesTheRead) {
  ASSERT_TRUE(post_op(WrOpcode::kRdmaRead, 1, 100).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 10).is_ok());
  ASSERT_EQ(sent().size(), 2u);
  ack(kSpsn + 1);  // the SEND's ACK, but the READ response never came
  auto out = sent();
  ASSERT_GE(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaReadRequest);
  EXPECT_EQ(out[0].psn(), kSpsn);
  EXPECT_EQ(drain_cq(*s.scq).size(), 0u);
}

TEST_F(ReqTest, AtomicAckDeliversOriginalValue) {
  uint64_t* res = reinterpret_cast<uint64_t*>(buf.data());
  Wr w = send_wr(WrOpcode::kAtomicCmpAndSwp, 1, {sge(res, 8, mb)});
  w.atomic.remote_addr = 0x1000;
  w.atomic.rkey = kRkey;
  w.atomic.compare_add = 11;
  w.atomic.swap = 22;
  ASSERT_TRUE(post(qp, w).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcCompareSwap);
  EXPECT_EQ(out[0].f.compare, 11u);
  EXPECT_EQ(out[0].f.swap_add, 22u);
  EXPECT_TRUE(out[0].f.ack_req);
  respond(op::kRcAtomicAcknowledge, kSpsn, aeth::ack(31), {}, 0x0102030405060708ull);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kCompSwap);
  EXPECT_EQ(*res, 0x0102030405060708ull);
}

TEST_F(ReqTest, InitiatorDepthLimitsOutstandingReads) {
  ConnOpts o;
  o.max_rd_atomic = 1;
  setup(o);
  ASSERT_TRUE(post_op(WrOpcode::kRdmaRead, 1, 8).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kRdmaRead, 2, 8, kSendSignaled, 8).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);  // the second READ waits for a credit
  respond(op::kRcRdmaReadResponseOnly, kSpsn, aeth::ack(31), std::vector<uint8_t>(8, 1));
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn + 1);
}

TEST_F(ReqTest, FenceWaitsForOutstandingRead) {
  ASSERT_TRUE(post_op(WrOpcode::kRdmaRead, 1, 8).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 2, 8, kSendSignaled | kSendFence, 16).is_ok());
  ASSERT_EQ(sent().size(), 1u);  // only the READ
  respond(op::kRcRdmaReadResponseOnly, kSpsn, aeth::ack(31), std::vector<uint8_t>(8, 1));
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteOnly);
}

TEST_F(ReqTest, BadLkeyEmitsNoPacketAndFlushes) {
  // S09: a local SGE outside its MR.
  Wr w = send_wr(WrOpcode::kSend, 1, {sge(buf.data() + buf.n - 4, 8, mb)});
  ASSERT_TRUE(post(qp, w).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 8).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(c[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(qp->state(), QpState::kErr);
}

TEST_F(ReqTest, UnsignaledCompletesSilentlyButErrorsAlwaysReport) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 8, 0).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 8, kSendSignaled).is_ok());
  sent();
  ack(kSpsn + 1);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 2u);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 3, 8, 0).is_ok());
  sent();
  ack(kSpsn + 2, aeth::nak(aeth::kNakRemoteAccessError));
  c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 3u);
  EXPECT_EQ(c[0].status, WcStatus::kRemAccessErr);
}

TEST_F(ReqTest, PsnWrapsAt24Bits) {
  setup({}, 0xFFFFFE);
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 3000).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].psn(), 0xFFFFFEu);
  EXPECT_EQ(out[1].psn(), 0xFFFFFFu);
  EXPECT_EQ(out[2].psn(), 0u);
  ack(0xFFFFFF, aeth::nak(aeth::kNakPsnSeqError));  // the NAK'd PSN alone first
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 0xFFFFFFu);
  ack(0xFFFFFF);  // answered short of what was sent: go back across the wrap
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 0u);
  ack(0);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 8).is_ok());
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 1u);
}

TEST_F(ReqTest, WindowStopsAtMaxUnackedPsns) {
  // Three 100-packet WRITEs and a 300-packet one: 600 PSNs, more than the window.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, i, 100 * 1024).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 3, 300 * 1024).is_ok());
  auto out = sent();
  EXPECT_EQ(out.size(), kMaxUnackedPsns);
  EXPECT_EQ(out.back().psn(), kSpsn + kMaxUnackedPsns - 1);
  ack(kSpsn + 99);  // opens the window: the remaining 600 - 512 go out
  out = sent();
  EXPECT_EQ(out.size(), 600u - kMaxUnackedPsns);
  ack(kSpsn + 599);
  out = sent();
  EXPECT_EQ(out.size(), 0u);
  EXPECT_EQ(drain_cq(*s.scq).size(), 4u);
}

// Window sharing (EngineConfig::window_share), one epoch long enough for a test.
EngineConfig share_config() {
  EngineConfig ec;
  ec.window_share = true;
  ec.window_share_epoch_ns = 3'600'000'000'000ull;
  return ec;
}

class ShareTest : public ReqPeerFixture {
 protected:
  ShareTest() : ReqPeerFixture(2 << 20, share_config()) {}
};

// The share, counted per destination and epoch: one QP whose window fills keeps the whole
// window; n of them towards one destination get kMaxUnackedPsns / n (counted once each per
// epoch, at least kShareFloorPsns); another destination counts apart; the last epoch's count
// holds through the next, and is gone after it.
TEST_F(ShareTest, ShareIsTheWindowOverTheQpsWhoseWindowsFill) {
  Engine& e = *s.eng;
  wire::Endpoint a, b;
  a.addr[15] = 2;
  b.addr[15] = 9;
  a.port = b.port = 4791;
  const uint64_t ep = 3'600'000'000'000ull;
  const uint64_t t = 5 * ep;
  uint64_t c[8];
  std::fill(std::begin(c), std::end(c), UINT64_MAX);  // never counted
  EXPECT_EQ(e.window_share(a, &c[0], t), kMaxUnackedPsns);
  EXPECT_EQ(e.window_share(a, &c[1], t), kMaxUnackedPsns / 2);
  EXPECT_EQ(e.window_share(a, &c[0], t + 1), kMaxUnackedPsns / 2);  // counted once
  EXPECT_EQ(e.window_share(a, &c[2], t), kMaxUnackedPsns / 3);
  EXPECT_EQ(e.window_share(a, &c[3], t), kMaxUnackedPsns / 4);
  EXPECT_EQ(e.window_share(b, &c[4], t), kMaxUnackedPsns);  // another destination
  EXPECT_EQ(e.window_share(a, &c[0], t + ep), kMaxUnackedPsns / 4);  // the last epoch's 4
  EXPECT_EQ(e.window_share(a, &c[0], t + 2 * ep), kMaxUnackedPsns);  // the last epoch's 1
  uint64_t many[100];
  std::fill(std::begin(many), std::end(many), UINT64_MAX);
  uint32_t last = 0;
  for (uint64_t& m : many) last = e.window_share(b, &m, t + 10 * ep);
  EXPECT_EQ(last, Engine::kShareFloorPsns);
  // Epoch 0 (a host up for less than an epoch) counts as any other.
  wire::Endpoint z;
  z.addr[15] = 77;
  EXPECT_EQ(e.window_share(z, &c[5], 0), kMaxUnackedPsns);
  EXPECT_EQ(e.window_share(z, &c[6], 1), kMaxUnackedPsns / 2);
  // A stale reading (epoch 5, after the slot it shares with epoch 7 moved on) leaves the
  // newer epoch's count alone: a second QP of epoch 7 still finds the first.
  EXPECT_EQ(e.window_share(a, &c[7], t + 2 * ep + 5), kMaxUnackedPsns / 2);  // c[0] and c[7]
  uint64_t stale = UINT64_MAX, late = UINT64_MAX;
  (void)e.window_share(a, &stale, t);
  EXPECT_EQ(e.window_share(a, &late, t + 2 * ep + 9), kMaxUnackedPsns / 3);
}

// A share at the floor is asked for ACKs as often as a window of its size (every 8 packets),
// not as cwnd's 512 would be (every 64: a 32-packet window would wait for the probe timer).
TEST_F(ShareTest, AShareAtTheFloorAsksForAcksWithinIt) {
  uint64_t others[16];
  std::fill(std::begin(others), std::end(others), UINT64_MAX);
  const uint64_t now = wire::monotonic_ns();
  for (uint64_t& o : others) (void)s.eng->window_share(qp->req_.dst, &o, now);
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 1500 * 1024).is_ok());
  EXPECT_EQ(sent().size(), kMaxUnackedPsns);  // the first fill: the whole window
  ack(kSpsn + kMaxUnackedPsns - 1);
  auto out = sent();
  ASSERT_EQ(out.size(), Engine::kShareFloorPsns);
  int reqs = 0;
  for (const Captured& k : out) reqs += k.f.ack_req ? 1 : 0;
  EXPECT_EQ(reqs, 4);
}

// Two QPs whose windows fill towards one peer: each first fills the whole window (a share is
// taken when the window fills), then keeps to half of it. Without sharing, qp's second refill
// would be 300 packets, not 44.
TEST_F(ShareTest, TwoQpsIntoOnePeerShareTheWindow) {
  auto qp2 = s.qp(QpType::kRc);
  ConnOpts o;
  o.sq_psn = kSpsn;
  o.rq_psn = 1;
  connect_qp(*s.dev, qp2, "127.0.0.2", kPeerQpn + 1, o);
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 1500 * 1024).is_ok());
  EXPECT_EQ(sent().size(), kMaxUnackedPsns);  // alone: the whole window
  Wr w = send_wr(WrOpcode::kRdmaWrite, 2, {sge(buf.data(), 1500 * 1024, mb)});
  w.rdma.remote_addr = kRemoteVa;
  w.rdma.rkey = kRkey;
  ASSERT_TRUE(post(qp2, w).is_ok());
  EXPECT_EQ(sent().size(), kMaxUnackedPsns);  // filled before it counted; now two share
  ack(kSpsn + 299);
  EXPECT_EQ(sent().size(), 300u);  // qp refills to its old share, and takes the new one there
  ack(kSpsn + 599);
  EXPECT_EQ(sent().size(), kMaxUnackedPsns / 2 - 212);  // 812 sent, 600 acknowledged
}

TEST_F(ReqTest, LocalInvalidateWaitsForEarlierWqes) {
  auto mw = *s.dev->alloc_mw(s.pd, MwType::kType2);
  GuardedBuf win(256);
  auto mbind = s.mr(win.data(), win.n, kAccessLocalWrite | kAccessRemoteRead | kAccessMwBind);
  // Bind a type-2 MW through the QP, then LOCAL_INV it after a SEND.
  Wr b = send_wr(WrOpcode::kBindMw, 1, {});
  b.bind_mw.mw_rkey = mw->rkey();
  b.bind_mw.new_rkey = (mw->rkey() & ~0xffu) | 0x42;
  b.bind_mw.mr_lkey = mbind->lkey();
  b.bind_mw.addr = reinterpret_cast<uint64_t>(win.data());
  b.bind_mw.length = 64;
  b.bind_mw.access = kAccessRemoteRead;
  ASSERT_TRUE(post(qp, b).is_ok());
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kBindMw);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 8).is_ok());
  Wr inv = send_wr(WrOpcode::kLocalInv, 3, {});
  inv.invalidate_rkey = b.bind_mw.new_rkey;
  ASSERT_TRUE(post(qp, inv).is_ok());
  EXPECT_EQ(mw->view().state, MwState::kValid);  // waits behind the SEND
  sent();
  ack(kSpsn);
  c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].opcode, WcOpcode::kLocalInv);
  EXPECT_EQ(c[1].status, WcStatus::kSuccess);
  EXPECT_EQ(mw->view().state, MwState::kFree);
}


TEST_F(ReqTest, SqdDrainsReportsAndResumes) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 10).is_ok());
  ASSERT_EQ(sent().size(), 1u);
  QpAttr a;
  a.qp_state = QpState::kSqd;
  a.en_sqd_async_notify = 1;
  ASSERT_TRUE(s.dev->modify_qp(qp, a, kQpState | kQpEnSqdAsyncNotify).is_ok());
  // A WR posted while draining does not start.
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 10).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  EXPECT_EQ(s.dev->async_events().pending(), 0u);
  ack(kSpsn);  // the in-flight SEND completes: the SQ is drained
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  AsyncEvent ev;
  ASSERT_TRUE(s.dev->async_events().try_get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kSqDrained);
  EXPECT_EQ(ev.qp.get(), qp.get());
  // Back to RTS: the waiting WR starts.
  a = QpAttr{};
  a.qp_state = QpState::kRts;
  ASSERT_TRUE(s.dev->modify_qp(qp, a, kQpState).is_ok());
  fire_timers();
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn + 1);
}


// ATOMIC_WRITE: one RC_ATOMIC_WRITE packet (RETH: VA, rkey, DMA length 8; the 8 operand
// bytes as payload, AckReq), completed by a zero-length READ RESPONSE ONLY; an ACK alone
// does not complete it (the response was lost: go back N, as for a READ).
TEST_F(ReqTest, AtomicWriteSendsRethAndOperandAndCompletesOnEmptyReadResponse) {
  ASSERT_TRUE(post_op(WrOpcode::kAtomicWrite, 7, 8).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAtomicWrite);
  EXPECT_EQ(out[0].psn(), kSpsn);
  EXPECT_EQ(out[0].f.va, kRemoteVa);
  EXPECT_EQ(out[0].f.rkey, kRkey);
  EXPECT_EQ(out[0].f.dma_len, 8u);
  EXPECT_TRUE(out[0].f.ack_req);
  ASSERT_EQ(out[0].v.payload_len, 8u);
  EXPECT_EQ(0, std::memcmp(out[0].v.payload, buf.data(), 8));
  respond(op::kRcRdmaReadResponseOnly, kSpsn, aeth::ack(aeth::kCreditInvalid));
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kAtomicWrite);
  EXPECT_EQ(c[0].wr_id, 7u);
}

// A plain ACK covering an ATOMIC_WRITE means its READ RESPONSE was lost: nothing completes,
// the request goes again with the same PSN (the responder replays, never re-executes); a
// retransmit timeout does the same.
TEST_F(ReqTest, AtomicWriteAnsweredByAckOrTimeoutIsResentSamePsn) {
  ASSERT_TRUE(post_op(WrOpcode::kAtomicWrite, 7, 8).is_ok());
  ASSERT_EQ(sent().size(), 1u);
  ack(kSpsn);
  EXPECT_EQ(drain_cq(*s.scq).size(), 0u);
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcAtomicWrite);
  EXPECT_EQ(out[0].psn(), kSpsn);
  fire_timers();
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn);
  EXPECT_EQ(0, std::memcmp(out[0].v.payload, buf.data(), 8));
  respond(op::kRcRdmaReadResponseOnly, kSpsn, aeth::ack(aeth::kCreditInvalid));
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
}

TEST_F(ReqTest, AtomicWriteByValueAndFlushTakeInitiatorDepthSlots) {
  // Initiator depth 1: the FLUSH waits until the ATOMIC_WRITE before it is answered.
  ConnOpts o;
  o.max_rd_atomic = 1;
  setup(o);
  Wr w = send_wr(WrOpcode::kAtomicWrite, 1, {});
  w.rdma.remote_addr = kRemoteVa + 8;
  w.rdma.rkey = kRkey;
  w.has_operand = true;
  w.operand = 0x1122334455667788ull;
  ASSERT_TRUE(post(qp, w).is_ok());
  Wr f = send_wr(WrOpcode::kFlush, 2, {});
  f.rdma.remote_addr = kRemoteVa;
  f.rdma.rkey = kRkey;
  f.flush.length = 4096;
  f.flush.type = kFlushGlobal;
  f.flush.level = kFlushRange;
  ASSERT_TRUE(post(qp, f).is_ok());
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].v.payload_len, 8u);
  EXPECT_EQ(0, std::memcmp(out[0].v.payload, &w.operand, 8));
  respond(op::kRcRdmaReadResponseOnly, kSpsn, aeth::ack(aeth::kCreditInvalid));
  out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kRcFlush);
  EXPECT_EQ(out[0].psn(), kSpsn + 1);
  EXPECT_EQ(out[0].f.va, kRemoteVa);
  EXPECT_EQ(out[0].f.dma_len, 4096u);
  EXPECT_EQ(out[0].f.flush_plt, kFlushGlobal);
  EXPECT_EQ(out[0].f.flush_sel, kFlushRange);
  EXPECT_EQ(out[0].v.payload_len, 0u);
  EXPECT_TRUE(out[0].f.ack_req);
  // A READ response with data does not answer a FLUSH: dropped.
  std::vector<uint8_t> junk(8, 1);
  respond(op::kRcRdmaReadResponseOnly, kSpsn + 1, aeth::ack(aeth::kCreditInvalid), junk);
  auto c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kAtomicWrite);
  respond(op::kRcRdmaReadResponseOnly, kSpsn + 1, aeth::ack(aeth::kCreditInvalid));
  c = drain_cq(*s.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kFlush);
  EXPECT_EQ(c[0].byte_len, 0u);
}

TEST_F(ReqTest, AtomicWriteAndFlushBadInputIsEinval) {
  Wr w4 = send_wr(WrOpcode::kAtomicWrite, 1, {sge(buf.data(), 4, mb)});  // not 8 bytes
  EXPECT_EQ(post(qp, w4).code(), Errc::kInval);
  Wr wi = send_wr(WrOpcode::kAtomicWrite, 1, {sge(buf.data(), 8, mb)}, kSendInline);
  EXPECT_EQ(post(qp, wi).code(), Errc::kInval);  // no inline ATOMIC_WRITE (rxe)
  for (auto [type, level] : {std::pair<uint8_t, uint8_t>{0, 0}, {4, 0}, {1, 2}}) {
    Wr f = send_wr(WrOpcode::kFlush, 2, {});
    f.flush.type = type;
    f.flush.level = level;
    EXPECT_EQ(post(qp, f).code(), Errc::kInval) << int(type) << "/" << int(level);
  }
  auto uc = s.qp(QpType::kUc);
  connect_qp(*s.dev, uc, "127.0.0.2", kPeerQpn + 1, ConnOpts{});
  Wr fu = send_wr(WrOpcode::kFlush, 3, {});
  fu.flush.type = kFlushGlobal;
  EXPECT_EQ(post(uc, fu).code(), Errc::kInval);
  EXPECT_EQ(post(uc, send_wr(WrOpcode::kAtomicWrite, 4, {sge(buf.data(), 8, mb)})).code(),
            Errc::kInval);
  EXPECT_EQ(sent().size(), 0u);
}

// At SOFTRNIC_LOG=trace the completer names every state it passes through, one line per
// transition (emu/transport/comp.cc CompStep): an ACK, a PSN-sequence NAK and a stale ACK each
// take their own path.
TEST_F(ReqTest, CompleterTraceNamesItsStates) {
  char path[] = "/tmp/proto_req_trace_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const base::LogLevel saved = base::log_level();
  ASSERT_EQ(base::set_log_file(path), "");
  base::set_log_level(base::LogLevel::kTrace);
  qp->comp_.win.inorder_votes = SendWindow::kInorderVotes;  // a learned in-order peer: go back N
  ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, 1, 3000).is_ok());
  ASSERT_EQ(sent().size(), 3u);
  ack(kSpsn + 1, aeth::nak(aeth::kNakPsnSeqError));  // go back N from 501
  ASSERT_EQ(sent().size(), 2u);
  ack(kSpsn + 2);  // completes the WRITE
  ack(kSpsn);      // stale: already acknowledged
  base::set_log_level(saved);
  base::set_log_file("");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  const std::string q = "comp qp " + std::to_string(qp->qpn());
  auto has = [&](uint32_t psn, const char* from, const char* to) {
    return text.find(q + " psn " + std::to_string(psn) + ": " + from + " -> " + to) !=
           std::string::npos;
  };
  // The NAK: implicit acknowledgement of 500, then the go-back-N.
  EXPECT_TRUE(has(kSpsn + 1, "CHECK_PSN", "CHECK_ACK")) << text;
  EXPECT_TRUE(has(kSpsn + 1, "CHECK_ACK", "IMPLICIT_ACK")) << text;
  EXPECT_TRUE(has(kSpsn + 1, "IMPLICIT_ACK", "NAK")) << text;
  EXPECT_TRUE(has(kSpsn + 1, "NAK", "UPDATE_COMP")) << text;
  EXPECT_TRUE(has(kSpsn + 1, "COMPLETE_WQE", "ERROR_RETRY")) << text;
  EXPECT_TRUE(has(kSpsn + 1, "ERROR_RETRY", "DONE")) << text;
  // The ACK: SEND/WRITE retirement, no retry.
  EXPECT_TRUE(has(kSpsn + 2, "CHECK_ACK", "WRITE_SEND")) << text;
  EXPECT_TRUE(has(kSpsn + 2, "COMPLETE_WQE", "DONE")) << text;
  EXPECT_FALSE(has(kSpsn + 2, "COMPLETE_WQE", "ERROR_RETRY")) << text;
  // The stale ACK is dropped at the PSN check.
  EXPECT_TRUE(has(kSpsn, "CHECK_PSN", "DROP")) << text;
  EXPECT_EQ(drain_cq(*s.scq).size(), 1u);
}

// ---- doorbell batching (EngineConfig::defer_inflight, shim SOFTRNIC_TX_DEFER) ----

EngineConfig defer_config(uint32_t inflight, uint32_t max = 64) {
  EngineConfig ec;
  ec.defer_inflight = inflight;
  ec.defer_max = max;
  return ec;
}

class DoorbellTest : public ReqPeerFixture {
 protected:
  DoorbellTest() : ReqPeerFixture(1 << 19, defer_config(1, 4)) {}
  void expect_psns(const std::vector<Captured>& out, uint32_t first, size_t n) {
    ASSERT_EQ(out.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(out[i].psn(), first + i) << i;
      EXPECT_TRUE(out[i].f.ack_req) << i;  // each is a whole message: each asks for an ACK
    }
  }
  void expect_done(uint64_t first_id, size_t n, WcStatus st = WcStatus::kSuccess) {
    auto c = drain_cq(*s.scq);
    ASSERT_EQ(c.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(c[i].wr_id, first_id + i);
      EXPECT_EQ(c[i].status, st) << i;
    }
  }
};

// The first post finds nothing in flight and sends; the next ones wait in the SQ for the
// ACK, whose requester run sends all of them in one batch.
TEST_F(DoorbellTest, PostsBehindAnUnackedPacketLeaveWithTheNextAck) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 0, 64).is_ok());
  expect_psns(sent(), kSpsn, 1);
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(post_op(WrOpcode::kRdmaWrite, i, 64).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 3u);
  EXPECT_EQ(s.eng->counters().get(Ctr::kTxDeferred), 3u);
  ack(kSpsn);
  auto out = sent();
  expect_psns(out, kSpsn + 1, 3);
  EXPECT_EQ(out[0].opcode(), op::kRcRdmaWriteOnly);
  EXPECT_EQ(0, std::memcmp(out[2].v.payload, buf.data(), 64));
  expect_done(0, 1);
  ack(kSpsn + 3);
  expect_done(1, 3);
}

// No ACK comes: the retransmit timer's requester run takes over. The oldest packet goes
// alone (window 1, as always after a timeout); the waiting post follows its ACK.
TEST_F(DoorbellTest, WithoutAnAckTheRetransmitTimerRunsTheRequester) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 0, 64).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 64).is_ok());
  expect_psns(sent(), kSpsn, 1);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 1u);
  fire_timers();
  expect_psns(sent(), kSpsn, 1);
  ack(kSpsn);
  expect_psns(sent(), kSpsn + 1, 1);
  ack(kSpsn + 1);
  expect_done(0, 2);
}

// At most defer_max (4 here) WQEs wait: the post that would make it 5 sends them all.
TEST_F(DoorbellTest, AtMostDeferMaxWait) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 0, 64).is_ok());
  expect_psns(sent(), kSpsn, 1);
  for (uint64_t i = 1; i <= 4; ++i) ASSERT_TRUE(post_op(WrOpcode::kSend, i, 64).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 5, 64).is_ok());
  expect_psns(sent(), kSpsn + 1, 5);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 4u);
  ack(kSpsn + 5);
  expect_done(0, 6);
}

// A QP with no retransmit timer (timeout 0: wait forever) has no run it can count on: every
// post sends at once.
TEST_F(DoorbellTest, NoDeferralWithoutARetransmitTimer) {
  ConnOpts o;
  o.timeout = 0;
  setup(o);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(post_op(WrOpcode::kSend, i, 64).is_ok());
  expect_psns(sent(), kSpsn, 3);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 0u);
  ack(kSpsn + 2);
  expect_done(0, 3);
}

// Waiting WQEs are still the SQ's: the QP's move to ERR flushes them, nothing is sent.
TEST_F(DoorbellTest, WaitingPostsAreFlushedByError) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 0, 64).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 64).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 64).is_ok());
  expect_psns(sent(), kSpsn, 1);
  QpAttr a;
  a.qp_state = QpState::kErr;
  ASSERT_TRUE(s.dev->modify_qp(qp, a, kQpState).is_ok());
  EXPECT_EQ(sent().size(), 0u);
  expect_done(0, 3, WcStatus::kWrFlushErr);
}

// defer_inflight 2: one packet in flight is not enough, two are.
class DoorbellAt2Test : public ReqPeerFixture {
 protected:
  DoorbellAt2Test() : ReqPeerFixture(1 << 19, defer_config(2)) {}
};

TEST_F(DoorbellAt2Test, WaitsOnlyWithThatManyPacketsInFlight) {
  ASSERT_TRUE(post_op(WrOpcode::kSend, 0, 64).is_ok());
  ASSERT_TRUE(post_op(WrOpcode::kSend, 1, 64).is_ok());  // 1 in flight: sent
  EXPECT_EQ(sent().size(), 2u);
  ASSERT_TRUE(post_op(WrOpcode::kSend, 2, 64).is_ok());  // 2 in flight: waits
  EXPECT_EQ(sent().size(), 0u);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 1u);
  ack(kSpsn);  // 1 left in flight; the ACK's requester run sends the waiting one
  auto out = sent();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), kSpsn + 2);
  ack(kSpsn + 2);
  EXPECT_EQ(drain_cq(*s.scq).size(), 3u);
}

// Off (the engine's default): every post sends at once, whatever is in flight.
TEST_F(ReqTest, NoDoorbellBatchingByDefault) {
  EXPECT_EQ(s.eng->config().defer_inflight, 0u);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(post_op(WrOpcode::kSend, i, 64).is_ok());
  EXPECT_EQ(sent().size(), 3u);
  EXPECT_EQ(ctr(Ctr::kTxDeferred), 0u);
}

}  // namespace
}  // namespace rnic::emu::test
