// tests/emu/qp_post_test.cc: post_send/post_recv validation (immediate errno as rdma-core
// and rxe give it), WQE contents handed to the transports, hooks, and flush on ERR with
// WR_FLUSH_ERR completions.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::drive_to;
using testing::Env;

SendWr send_wr(uint64_t id, const Sge* s, int n, WrOpcode op = WrOpcode::kSend,
               uint32_t flags = kSendSignaled) {
  SendWr w;
  w.wr_id = id;
  w.sg_list = s;
  w.num_sge = n;
  w.opcode = op;
  w.send_flags = flags;
  return w;
}

TEST(PostSend, StateRules) {
  Env env;
  Sge s{0, 0, 0};
  SendWr w = send_wr(1, &s, 1);
  int bad = -1;
  for (QpState st : {QpState::kReset, QpState::kInit, QpState::kRtr}) {
    auto qp = env.qp(QpType::kRc);
    drive_to(*env.dev, qp, st);
    EXPECT_EQ(qp->post_send(&w, 1, &bad), Errc::kInval) << qp_state_name(st);
    EXPECT_EQ(bad, 0);
  }
  auto qp = env.qp(QpType::kRc);
  drive_to(*env.dev, qp, QpState::kRts);
  EXPECT_TRUE(qp->post_send(&w, 1, &bad).is_ok());
  EXPECT_EQ(bad, 1);
}

TEST(PostRecv, StateRules) {
  Env env;
  Sge s{0, 0, 0};
  RecvWr w{1, &s, 1};
  int bad = -1;
  auto qp = env.qp(QpType::kRc);
  EXPECT_EQ(qp->post_recv(&w, 1, &bad), Errc::kInval);  // RESET
  drive_to(*env.dev, qp, QpState::kInit);
  EXPECT_TRUE(qp->post_recv(&w, 1, &bad).is_ok());  // INIT may post receives
  std::lock_guard lk(qp->recv_mutex());
  EXPECT_EQ(qp->rq().size(), 1u);
}

TEST(PostSend, OpcodeValidPerQpType) {
  Env env;
  Sge s{0, 8, 0};
  struct Case {
    QpType t;
    WrOpcode op;
    bool ok;
  } cases[] = {
      {QpType::kRc, WrOpcode::kRdmaRead, true},        {QpType::kRc, WrOpcode::kAtomicFetchAndAdd, true},
      {QpType::kRc, WrOpcode::kSendWithInv, true},     {QpType::kRc, WrOpcode::kTso, false},
      {QpType::kRc, WrOpcode::kDriver1, false},        {QpType::kUc, WrOpcode::kRdmaWrite, true},
      {QpType::kUc, WrOpcode::kRdmaRead, false},       {QpType::kUc, WrOpcode::kAtomicCmpAndSwp, false},
      {QpType::kUd, WrOpcode::kSendWithImm, true},     {QpType::kUd, WrOpcode::kRdmaWrite, false},
      {QpType::kUd, WrOpcode::kRdmaRead, false},       {QpType::kUd, WrOpcode::kBindMw, false},
  };
  AhAttr aa = testing::peer_ah(9);
  auto ah = *env.dev->create_ah(env.pd, aa);
  for (const Case& c : cases) {
    auto qp = env.qp(c.t);
    drive_to(*env.dev, qp, QpState::kRts);
    SendWr w = send_wr(7, &s, 1, c.op);
    w.ud.ah = ah.get();
    int bad;
    Status st = qp->post_send(&w, 1, &bad);
    EXPECT_EQ(st.is_ok(), c.ok) << qp_type_name(c.t) << " " << wr_opcode_name(c.op);
    if (!c.ok) {
      EXPECT_EQ(st, Errc::kInval);
    }
  }
}

TEST(PostSend, SgeInlineAhAndQueueFull) {
  Env env;
  auto qp = env.qp(QpType::kRc, /*wr=*/4);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge s[5] = {};
  int bad;
  SendWr w = send_wr(1, s, 5);  // max_send_sge is 4
  EXPECT_EQ(qp->post_send(&w, 1, &bad), Errc::kInval);
  char big[65] = {};
  Sge bs{reinterpret_cast<uint64_t>(big), 65, 0};
  w = send_wr(1, &bs, 1, WrOpcode::kSend, kSendInline);  // max_inline_data is 64
  EXPECT_EQ(qp->post_send(&w, 1, &bad), Errc::kInval);
  w = send_wr(1, &bs, 1, WrOpcode::kRdmaRead, kSendInline);  // inline READ
  bs.length = 8;
  EXPECT_EQ(qp->post_send(&w, 1, &bad), Errc::kInval);
  Sge four{0, 4, 0};
  w = send_wr(1, &four, 1, WrOpcode::kAtomicFetchAndAdd);  // atomic needs 8 bytes
  EXPECT_EQ(qp->post_send(&w, 1, &bad), Errc::kInval);
  // Queue full: a list of 6 on a 4-deep SQ queues 4, then ENOMEM with bad = 4.
  SendWr list[6];
  Sge z{0, 0, 0};
  for (int i = 0; i < 6; ++i) list[i] = send_wr(10 + i, &z, 1);
  EXPECT_EQ(qp->post_send(list, 6, &bad), Errc::kNoMem);
  EXPECT_EQ(bad, 4);
  std::lock_guard lk(qp->send_mutex());
  EXPECT_EQ(qp->sq().size(), 4u);
  EXPECT_EQ(qp->sq().head().wr_id, 10u);
  // UD without AH
  auto ud = env.qp(QpType::kUd);
  drive_to(*env.dev, ud, QpState::kRts);
  SendWr u = send_wr(1, &z, 1);
  EXPECT_EQ(ud->post_send(&u, 1, &bad), Errc::kInval);
}

TEST(PostSend, WqeCarriesTheWorkRequest) {
  Env env;
  auto qp = env.qp(QpType::kRc, 8, nullptr, /*sig_all=*/false);
  drive_to(*env.dev, qp, QpState::kRts);
  char payload[16] = "hello inline";
  Sge in{reinterpret_cast<uint64_t>(payload), 13, 0};
  SendWr w1 = send_wr(1, &in, 1, WrOpcode::kSendWithImm,
                      kSendSignaled | kSendInline | kSendSolicited);
  w1.imm_data = 0x01020304;
  Sge g[2] = {{0x1000, 100, 0x111}, {0x2000, 28, 0x222}};
  SendWr w2 = send_wr(2, g, 2, WrOpcode::kRdmaWrite, 0);
  w2.rdma.remote_addr = 0xABCDEF00;
  w2.rdma.rkey = 0x1234;
  Sge a{0x3000, 8, 0x333};
  SendWr w3 = send_wr(3, &a, 1, WrOpcode::kAtomicCmpAndSwp);
  w3.atomic.remote_addr = 0x8000;
  w3.atomic.rkey = 0x99;
  w3.atomic.compare_add = 5;
  w3.atomic.swap = 6;
  SendWr list[3] = {w1, w2, w3};
  int bad;
  ASSERT_TRUE(qp->post_send(list, 3, &bad).is_ok());
  std::memset(payload, 0, sizeof payload);  // inline data was copied at post time
  std::lock_guard lk(qp->send_mutex());
  ASSERT_EQ(qp->sq().size(), 3u);
  const SendWqe& e1 = qp->sq().at(0);
  EXPECT_TRUE(e1.is_inline);
  EXPECT_EQ(e1.inline_len, 13u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(e1.inline_data)), "hello inline");
  EXPECT_EQ(e1.imm_data, 0x01020304u);
  EXPECT_TRUE(e1.signaled);
  EXPECT_EQ(e1.send_flags & kSendSolicited, kSendSolicited);
  const SendWqe& e2 = qp->sq().at(1);
  EXPECT_FALSE(e2.signaled);
  EXPECT_EQ(e2.num_sge, 2u);
  EXPECT_EQ(e2.length, 128u);
  EXPECT_EQ(e2.sge[1].lkey, 0x222u);
  EXPECT_EQ(e2.remote_addr, 0xABCDEF00u);
  EXPECT_EQ(e2.rkey, 0x1234u);
  EXPECT_EQ(e2.state, WqeState::kPosted);
  const SendWqe& e3 = qp->sq().at(2);
  EXPECT_EQ(e3.remote_addr, 0x8000u);
  EXPECT_EQ(e3.rkey, 0x99u);
  EXPECT_EQ(e3.compare_add, 5u);
  EXPECT_EQ(e3.swap, 6u);
}

TEST(PostSend, UdWqeCopiesAddressVector) {
  Env env;
  auto ah = *env.dev->create_ah(env.pd, testing::peer_ah(77));
  auto qp = env.qp(QpType::kUd);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge z{0, 0, 0};
  SendWr w = send_wr(1, &z, 1);
  w.ud.ah = ah.get();
  w.ud.remote_qpn = 0x1234;
  w.ud.remote_qkey = 0x11111111;
  int bad;
  ASSERT_TRUE(qp->post_send(&w, 1, &bad).is_ok());
  ASSERT_TRUE(env.dev->destroy_ah(ah).is_ok());  // the WQE keeps its own copy
  std::lock_guard lk(qp->send_mutex());
  EXPECT_EQ(qp->sq().head().av.dest_ipv4, 0x7F00004Du);
  EXPECT_EQ(qp->sq().head().remote_qpn, 0x1234u);
  EXPECT_EQ(qp->sq().head().remote_qkey, 0x11111111u);
}

struct RecordingHooks : TransportHooks {
  int sends = 0, recvs = 0, modifies = 0, destroys = 0, polls = 0;
  QpState last_from = QpState::kUnknown, last_to = QpState::kUnknown;
  bool send_lock_held = false;
  void on_post_send(Qp& qp) override {
    ++sends;
    send_lock_held = !qp.send_mutex().try_lock();
    if (!send_lock_held) qp.send_mutex().unlock();
  }
  void on_post_recv(Qp&) override { ++recvs; }
  void on_modify(Qp&, QpState f, QpState t) override {
    ++modifies;
    last_from = f;
    last_to = t;
  }
  void on_destroy(Qp&) override { ++destroys; }
  void on_poll_empty(Cq&) override { ++polls; }
};

TEST(Hooks, CalledWithTheDocumentedLocks) {
  Env env;
  RecordingHooks h;
  env.dev->set_hooks(&h);
  auto qp = env.qp(QpType::kRc);
  drive_to(*env.dev, qp, QpState::kRts);
  EXPECT_EQ(h.modifies, 3);
  EXPECT_EQ(h.last_from, QpState::kRtr);
  EXPECT_EQ(h.last_to, QpState::kRts);
  Sge z{0, 0, 0};
  SendWr w = send_wr(1, &z, 1);
  RecvWr r{2, &z, 1};
  int bad;
  ASSERT_TRUE(qp->post_send(&w, 1, &bad).is_ok());
  ASSERT_TRUE(qp->post_recv(&r, 1, &bad).is_ok());
  EXPECT_EQ(h.sends, 1);
  EXPECT_TRUE(h.send_lock_held);
  EXPECT_EQ(h.recvs, 1);
  Cqe e;
  EXPECT_EQ(env.cq->poll(&e, 1), 0);
  EXPECT_EQ(h.polls, 1);
  ASSERT_TRUE(env.dev->destroy_qp(qp).is_ok());
  EXPECT_EQ(h.destroys, 1);
  EXPECT_EQ(env.dev->destroy_qp(qp), Errc::kInval);  // twice
  env.dev->set_hooks(nullptr);
}

TEST(Flush, ModifyToErrFlushesSqAndRqWithWrFlushErr) {
  Env env;
  auto qp = env.qp(QpType::kRc, 8);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge z{0, 0, 0};
  int bad;
  for (int i = 0; i < 3; ++i) {
    RecvWr r{uint64_t(100 + i), &z, 1};
    ASSERT_TRUE(qp->post_recv(&r, 1, &bad).is_ok());
  }
  SendWr s1 = send_wr(1, &z, 1, WrOpcode::kSend, 0);  // unsignaled: still flushed
  SendWr s2 = send_wr(2, &z, 1, WrOpcode::kRdmaWrite);
  ASSERT_TRUE(qp->post_send(&s1, 1, &bad).is_ok());
  ASSERT_TRUE(qp->post_send(&s2, 1, &bad).is_ok());
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kErr, QpState::kRts), kQpState).is_ok());
  auto got = env.drain();
  ASSERT_EQ(got.size(), 5u);
  // Send queue first, then receive queue; each in posting order.
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].opcode, WcOpcode::kSend);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].opcode, WcOpcode::kRdmaWrite);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[2 + i].wr_id, uint64_t(100 + i));
    EXPECT_EQ(got[2 + i].opcode, WcOpcode::kRecv);
  }
  for (const Cqe& e : got) {
    EXPECT_EQ(e.status, WcStatus::kWrFlushErr);
    EXPECT_EQ(e.qp_num, qp->qpn());
  }
  // Posting in ERR: accepted and flushed at once.
  SendWr s3 = send_wr(3, &z, 1);
  RecvWr r3{103, &z, 1};
  ASSERT_TRUE(qp->post_send(&s3, 1, &bad).is_ok());
  ASSERT_TRUE(qp->post_recv(&r3, 1, &bad).is_ok());
  got = env.drain();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 3u);
  EXPECT_EQ(got[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(got[1].wr_id, 103u);
  EXPECT_EQ(got[1].status, WcStatus::kWrFlushErr);
  // ERR -> RESET -> usable again, queues empty.
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kReset, QpState::kErr), kQpState).is_ok());
  drive_to(*env.dev, qp, QpState::kRts);
  std::lock_guard lk(qp->send_mutex());
  EXPECT_TRUE(qp->sq().empty());
}

TEST(Flush, ResetDropsTheQpsUnpolledCompletionsOnly) {
  // Given: two QPs on one CQ, both flushed to ERR with completions left unpolled.
  Env env;
  auto qp = env.qp(QpType::kRc, 8);
  auto other = env.qp(QpType::kRc, 8);
  Sge z{0, 0, 0};
  int bad;
  for (auto& q : {qp, other}) {
    drive_to(*env.dev, q, QpState::kRts);
    for (int i = 0; i < 2; ++i) {
      RecvWr r{uint64_t(q->qpn() * 10 + i), &z, 1};
      ASSERT_TRUE(q->post_recv(&r, 1, &bad).is_ok());
    }
  }
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kErr, QpState::kRts), kQpState).is_ok());
  ASSERT_TRUE(env.dev->modify_qp(other, testing::full_attr(QpState::kErr, QpState::kRts), kQpState).is_ok());
  ASSERT_EQ(env.cq->count(), 4u);
  // Expect: RESET of one QP takes its two flush completions off the CQ (as libmlx5 does),
  // the other QP's stay, in order; a second RESET finds nothing more to take.
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kReset, QpState::kErr), kQpState).is_ok());
  auto got = env.drain();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].qp_num, other->qpn());
  EXPECT_EQ(got[0].wr_id, uint64_t(other->qpn() * 10));
  EXPECT_EQ(got[1].wr_id, uint64_t(other->qpn() * 10 + 1));
  // A QP reset and used again completes normally: its new flushes are the only ones.
  drive_to(*env.dev, qp, QpState::kRts);
  RecvWr r{7, &z, 1};
  ASSERT_TRUE(qp->post_recv(&r, 1, &bad).is_ok());
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kErr, QpState::kRts), kQpState).is_ok());
  got = env.drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 7u);
}

TEST(Cq, RemoveQpKeepsOrderAcrossTheRingWrap) {
  Env env;
  auto cq = *env.dev->create_cq(4, nullptr, 0);
  Cqe e, out[4];
  // Advance the head so the live entries wrap around the end of the ring.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cq->push(e));
  ASSERT_EQ(cq->poll(out, 3), 3);
  const uint32_t qpns[] = {1, 2, 1, 3};
  for (int i = 0; i < 4; ++i) {
    e.qp_num = qpns[i];
    e.wr_id = uint64_t(i);
    ASSERT_TRUE(cq->push(e));
  }
  EXPECT_EQ(cq->remove_qp(1), 2u);
  EXPECT_EQ(cq->remove_qp(9), 0u);
  ASSERT_EQ(cq->poll(out, 4), 2);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[1].wr_id, 3u);
  // Room again for a full ring after the removal.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(cq->push(e));
  EXPECT_EQ(cq->count(), 4u);
  ASSERT_TRUE(env.dev->destroy_cq(cq).is_ok());
}

TEST(Flush, TransportErrorCompletesHeadThenFlushesRest) {
  // The completer's path: head WQE fails (REM_ACCESS_ERR), QP to ERR, the rest flushed.
  Env env;
  auto qp = env.qp(QpType::kRc, 8);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge z{0, 0, 0};
  int bad;
  for (uint64_t i = 1; i <= 3; ++i) {
    SendWr s = send_wr(i, &z, 1, WrOpcode::kRdmaWrite, 0);
    ASSERT_TRUE(qp->post_send(&s, 1, &bad).is_ok());
  }
  {
    std::scoped_lock lk(qp->send_mutex(), qp->recv_mutex());
    ASSERT_TRUE(qp->complete_send_head_locked(WcStatus::kRemAccessErr));
    qp->enter_error_locked(/*fatal=*/false);
  }
  auto got = env.drain();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].status, WcStatus::kRemAccessErr);  // errors complete even if unsignaled
  EXPECT_EQ(got[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(got[2].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(qp->state(), QpState::kErr);
  QpAttr q;
  ASSERT_TRUE(env.dev->query_qp(qp, &q, nullptr).is_ok());
  EXPECT_EQ(q.qp_state, QpState::kErr);
}

TEST(Flush, UdSendErrorGoesToSqeAndBackToRts) {
  Env env;
  auto qp = env.qp(QpType::kUd, 8);
  drive_to(*env.dev, qp, QpState::kSqe);
  EXPECT_EQ(qp->state(), QpState::kSqe);
  ASSERT_TRUE(env.dev->modify_qp(qp, testing::full_attr(QpState::kRts, QpState::kSqe), kQpState).is_ok());
  EXPECT_EQ(qp->state(), QpState::kRts);
}

TEST(Flush, SignaledSuccessOnlyWhenAsked) {
  Env env;
  auto qp = env.qp(QpType::kRc, 8);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge z{0, 0, 0};
  int bad;
  SendWr a = send_wr(1, &z, 1, WrOpcode::kSend, 0);
  SendWr b = send_wr(2, &z, 1, WrOpcode::kSend, kSendSignaled);
  ASSERT_TRUE(qp->post_send(&a, 1, &bad).is_ok());
  ASSERT_TRUE(qp->post_send(&b, 1, &bad).is_ok());
  {
    std::lock_guard lk(qp->send_mutex());
    ASSERT_TRUE(qp->complete_send_head_locked(WcStatus::kSuccess));
    ASSERT_TRUE(qp->complete_send_head_locked(WcStatus::kSuccess, 0));
  }
  auto got = env.drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 2u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
}

}  // namespace
}  // namespace rnic::emu
