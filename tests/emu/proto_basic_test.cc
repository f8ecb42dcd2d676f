// tests/emu/proto_basic_test.cc: two devices on an in-memory network, driven by hand
// (no threads): every RC/UC/UD operation moves the right bytes and completes correctly.
#include <gtest/gtest.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

class BasicTest : public ::testing::Test {
 protected:
  wire::MemNetwork net;
  Node a = Node::on_mem(net, "127.0.0.2");
  Node b = Node::on_mem(net, "127.0.0.3");
  std::shared_ptr<Qp> qa, qb;

  void rc(ConnOpts o = {}) {
    qa = a.qp(QpType::kRc);
    qb = b.qp(QpType::kRc);
    connect_pair(a, qa, b, qb, o);
  }
};

TEST_F(BasicTest, RcSendSmall) {
  rc();
  GuardedBuf src(100), dst(200);
  src.pattern(1);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 7, {sge(dst.data(), 200, md)}).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {sge(src.data(), 100, ms)})).is_ok());
  pump({&a, &b});
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rs[0].wr_id, 7u);
  EXPECT_EQ(rs[0].byte_len, 100u);
  EXPECT_EQ(rs[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(rs[0].qp_num, qb->qpn());
  EXPECT_EQ(rs[0].src_qp, qa->qpn());
  auto ss = drain_cq(*a.scq);
  ASSERT_EQ(ss.size(), 1u);
  EXPECT_EQ(ss[0].status, WcStatus::kSuccess);
  EXPECT_EQ(ss[0].opcode, WcOpcode::kSend);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 100));
  EXPECT_EQ(dst.data()[100], 0);
  EXPECT_TRUE(dst.guards_ok());
}

TEST_F(BasicTest, RcSendMultiPacketMultiSge) {
  rc();
  GuardedBuf src(5000), dst(6000);
  src.pattern(2);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 1, {sge(dst.data(), 1000, md), sge(dst.data() + 1000, 5000, md)}).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1,
                               {sge(src.data(), 10, ms), sge(src.data() + 10, 3000, ms),
                                sge(src.data() + 3010, 1990, ms)}))
                  .is_ok());
  pump({&a, &b});
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].byte_len, 5000u);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 5000));
  EXPECT_TRUE(dst.guards_ok());
  EXPECT_EQ(drain_cq(*a.scq).size(), 1u);
}

TEST_F(BasicTest, RcWriteReadAtomics) {
  rc();
  GuardedBuf local(9000), remote(9000);
  local.pattern(3);
  auto ml = a.mr(local.data(), local.n);
  auto mr = b.mr(remote.data(), remote.n);
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(local.data(), 9000, ml)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  w.rdma.rkey = mr->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  pump({&a, &b});
  auto c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaWrite);
  EXPECT_EQ(0, std::memcmp(local.data(), remote.data(), 9000));
  EXPECT_TRUE(remote.guards_ok());

  // READ back into a fresh buffer.
  GuardedBuf back(9000);
  auto mb = a.mr(back.data(), back.n);
  Wr r = send_wr(WrOpcode::kRdmaRead, 2, {sge(back.data(), 4000, mb), sge(back.data() + 4000, 5000, mb)});
  r.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  r.rdma.rkey = mr->rkey();
  ASSERT_TRUE(post(qa, r).is_ok());
  pump({&a, &b});
  c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(c[0].byte_len, 9000u);
  EXPECT_EQ(0, std::memcmp(local.data(), back.data(), 9000));
  EXPECT_TRUE(back.guards_ok());

  // FAA then CAS on an aligned word.
  uint64_t* word = reinterpret_cast<uint64_t*>(remote.data() + 64);
  *word = 40;
  uint64_t res = 0;
  auto mres = a.mr(&res, 8);
  Wr f = send_wr(WrOpcode::kAtomicFetchAndAdd, 3, {sge(&res, 8, mres)});
  f.atomic.remote_addr = reinterpret_cast<uint64_t>(word);
  f.atomic.rkey = mr->rkey();
  f.atomic.compare_add = 2;
  ASSERT_TRUE(post(qa, f).is_ok());
  pump({&a, &b});
  c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kFetchAdd);
  EXPECT_EQ(res, 40u);
  EXPECT_EQ(*word, 42u);
  Wr s = send_wr(WrOpcode::kAtomicCmpAndSwp, 4, {sge(&res, 8, mres)});
  s.atomic.remote_addr = reinterpret_cast<uint64_t>(word);
  s.atomic.rkey = mr->rkey();
  s.atomic.compare_add = 42;
  s.atomic.swap = 1000;
  ASSERT_TRUE(post(qa, s).is_ok());
  pump({&a, &b});
  c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(res, 42u);
  EXPECT_EQ(*word, 1000u);
}

TEST_F(BasicTest, RcWriteWithImmAndSendWithImm) {
  rc();
  GuardedBuf local(3000), remote(3000), rbuf(64);
  local.pattern(4);
  auto ml = a.mr(local.data(), local.n);
  auto mr = b.mr(remote.data(), remote.n);
  auto mrb = b.mr(rbuf.data(), rbuf.n);
  ASSERT_TRUE(post_recv(qb, 11, {sge(rbuf.data(), 64, mrb)}).is_ok());
  ASSERT_TRUE(post_recv(qb, 12, {sge(rbuf.data(), 64, mrb)}).is_ok());
  Wr w = send_wr(WrOpcode::kRdmaWriteWithImm, 1, {sge(local.data(), 3000, ml)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  w.rdma.rkey = mr->rkey();
  w.imm_data = 0x12345678;
  ASSERT_TRUE(post(qa, w).is_ok());
  Wr s = send_wr(WrOpcode::kSendWithImm, 2, {sge(local.data(), 10, ml)});
  s.imm_data = 0xdeadbeef;
  ASSERT_TRUE(post(qa, s).is_ok());
  pump({&a, &b});
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].wr_id, 11u);
  EXPECT_EQ(rs[0].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(rs[0].byte_len, 3000u);
  EXPECT_EQ(rs[0].imm_data, 0x12345678u);
  EXPECT_TRUE(rs[0].wc_flags & kWcWithImm);
  EXPECT_EQ(rs[1].wr_id, 12u);
  EXPECT_EQ(rs[1].opcode, WcOpcode::kRecv);
  EXPECT_EQ(rs[1].imm_data, 0xdeadbeefu);
  EXPECT_EQ(0, std::memcmp(local.data(), remote.data(), 3000));
  EXPECT_EQ(drain_cq(*a.scq).size(), 2u);
}

TEST_F(BasicTest, ZeroLengthOps) {
  rc();
  GuardedBuf rbuf(64);
  auto mrb = b.mr(rbuf.data(), rbuf.n);
  ASSERT_TRUE(post_recv(qb, 1, {sge(rbuf.data(), 64, mrb)}).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {})).is_ok());
  Wr w = send_wr(WrOpcode::kRdmaWrite, 2, {});
  w.rdma.remote_addr = 0xdeadbeef;  // garbage: C9-88, no rkey check for zero length (S07)
  w.rdma.rkey = 0x1234;
  ASSERT_TRUE(post(qa, w).is_ok());
  Wr r = send_wr(WrOpcode::kRdmaRead, 3, {});
  r.rdma.remote_addr = 0xfeedface;
  r.rdma.rkey = 0x4321;
  ASSERT_TRUE(post(qa, r).is_ok());
  pump({&a, &b});
  auto c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 3u);
  for (auto& e : c) EXPECT_EQ(e.status, WcStatus::kSuccess) << wc_status_name(e.status);
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].byte_len, 0u);
  EXPECT_EQ(qa->state(), QpState::kRts);
  EXPECT_EQ(qb->state(), QpState::kRts);
}

TEST_F(BasicTest, UcSendAndWrite) {
  qa = a.qp(QpType::kUc);
  qb = b.qp(QpType::kUc);
  connect_pair(a, qa, b, qb);
  GuardedBuf src(2500), dst(2500), remote(2500);
  src.pattern(5);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  auto mr = b.mr(remote.data(), remote.n);
  ASSERT_TRUE(post_recv(qb, 1, {sge(dst.data(), 2500, md)}).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {sge(src.data(), 2500, ms)})).is_ok());
  Wr w = send_wr(WrOpcode::kRdmaWrite, 2, {sge(src.data(), 2500, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  w.rdma.rkey = mr->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  pump({&a, &b});
  EXPECT_EQ(drain_cq(*a.scq).size(), 2u);
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].byte_len, 2500u);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 2500));
  EXPECT_EQ(0, std::memcmp(src.data(), remote.data(), 2500));
}

TEST_F(BasicTest, UdSendWithGrh) {
  qa = a.qp(QpType::kUd);
  qb = b.qp(QpType::kUd);
  ConnOpts o;
  connect_qp(*a.dev, qa, nullptr, 0, o);
  connect_qp(*b.dev, qb, nullptr, 0, o);
  GuardedBuf src(300), dst(400);
  src.pattern(6);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 5, {sge(dst.data(), 400, md)}).is_ok());
  auto ah = *a.dev->create_ah(a.pd, ah_to("127.0.0.3"));
  Wr s = send_wr(WrOpcode::kSendWithImm, 1, {sge(src.data(), 300, ms)});
  s.ud.ah = ah.get();
  s.ud.remote_qpn = qb->qpn();
  s.ud.remote_qkey = o.qkey;
  s.imm_data = 0x01020304;
  ASSERT_TRUE(post(qa, s).is_ok());
  pump({&a, &b});
  EXPECT_EQ(drain_cq(*a.scq).size(), 1u);
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rs[0].byte_len, 340u);
  EXPECT_EQ(rs[0].src_qp, qa->qpn());
  EXPECT_TRUE(rs[0].wc_flags & kWcGrh);
  EXPECT_TRUE(rs[0].wc_flags & kWcWithImm);
  EXPECT_EQ(rs[0].imm_data, 0x01020304u);
  EXPECT_EQ(rs[0].sl, kRoceL3Ipv4);  // mlx5's L3 type, which UCX's ud_verbs reads (wc.sl & 7)
  EXPECT_EQ(dst.data()[20], 0x45);  // IPv4 header in the last 20 bytes of the GRH area
  EXPECT_EQ(0, std::memcmp(dst.data() + 32, "\x7f\x00\x00\x02\x7f\x00\x00\x03", 8));
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 40, 300));

  // Wrong Q_Key: dropped and counted.
  ASSERT_TRUE(post_recv(qb, 6, {sge(dst.data(), 400, md)}).is_ok());
  s.ud.remote_qkey = 0x999;
  ASSERT_TRUE(post(qa, s).is_ok());
  pump({&a, &b});
  EXPECT_EQ(drain_cq(*b.rcq).size(), 0u);
  EXPECT_EQ(qb->comp_.ctr.get(Ctr::kQkeyViolCntr), 1u);
}


TEST_F(BasicTest, SrqFeedsSeveralQps) {
  SrqAttr sa;
  sa.max_wr = 16;
  sa.max_sge = 2;
  auto srq = *b.dev->create_srq(b.pd, sa);
  qa = a.qp(QpType::kRc);
  qb = b.qp(QpType::kRc, srq);
  auto qa2 = a.qp(QpType::kRc);
  auto qb2 = b.qp(QpType::kRc, srq);
  connect_pair(a, qa, b, qb);
  connect_pair(a, qa2, b, qb2);
  GuardedBuf src(3000), dst(8192);
  src.pattern(7);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  RecvWr rw[2];
  Sge s0[2] = {sge(dst.data(), 1000, md), sge(dst.data() + 1000, 3000, md)};
  Sge s1[1] = {sge(dst.data() + 4096, 4096, md)};
  rw[0].wr_id = 100;
  rw[0].sg_list = s0;
  rw[0].num_sge = 2;
  rw[1].wr_id = 101;
  rw[1].sg_list = s1;
  rw[1].num_sge = 1;
  int bad = 0;
  ASSERT_TRUE(srq->post_recv(rw, 2, &bad).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {sge(src.data(), 3000, ms)})).is_ok());
  ASSERT_TRUE(post(qa2, send_wr(WrOpcode::kSend, 2, {sge(src.data(), 100, ms)})).is_ok());
  pump({&a, &b});
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].wr_id, 100u);
  EXPECT_EQ(rs[0].qp_num, qb->qpn());
  EXPECT_EQ(rs[0].byte_len, 3000u);
  EXPECT_EQ(rs[1].wr_id, 101u);
  EXPECT_EQ(rs[1].qp_num, qb2->qpn());
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 3000));
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 4096, 100));
  EXPECT_TRUE(dst.guards_ok());
}

TEST_F(BasicTest, InlineSendCopiesAtPostTime) {
  rc();
  GuardedBuf dst(256);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 1, {sge(dst.data(), 256, md)}).is_ok());
  uint8_t msg[40];
  for (int i = 0; i < 40; ++i) msg[i] = static_cast<uint8_t>(i + 1);
  // Inline: no lkey needed, and the buffer may change right after post_send returns.
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {Sge{reinterpret_cast<uint64_t>(msg), 40, 0}},
                               kSendSignaled | kSendInline))
                  .is_ok());
  std::memset(msg, 0, sizeof(msg));
  pump({&a, &b});
  auto rs = drain_cq(*b.rcq);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].byte_len, 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(dst.data()[i], i + 1);
}

TEST_F(BasicTest, SolicitedEventOnlyForSolicitedSend) {
  auto ch = *b.dev->create_comp_channel();
  auto rcq = *b.dev->create_cq(64, ch, 0);
  QpInitAttr ia;
  ia.send_cq = b.scq;
  ia.recv_cq = rcq;
  ia.qp_type = QpType::kRc;
  ia.cap = {16, 16, 2, 2, 0};
  qb = *b.dev->create_qp(b.pd, ia);
  qa = a.qp(QpType::kRc);
  connect_pair(a, qa, b, qb);
  GuardedBuf dst(256);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 1, {sge(dst.data(), 64, md)}).is_ok());
  ASSERT_TRUE(post_recv(qb, 2, {sge(dst.data(), 64, md)}).is_ok());
  ASSERT_TRUE(rcq->req_notify(/*solicited_only=*/true).is_ok());
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {})).is_ok());
  pump({&a, &b});
  EXPECT_EQ(ch->pending(), 0u);  // unsolicited: no event
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 2, {}, kSendSignaled | kSendSolicited)).is_ok());
  pump({&a, &b});
  EXPECT_EQ(ch->pending(), 1u);
  auto ev = ch->try_get_event();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->get(), rcq.get());
  rcq->ack_events(1);
  EXPECT_EQ(drain_cq(*rcq).size(), 2u);
}

TEST_F(BasicTest, UdOversizedSendCompletesWithoutTransmitting) {
  qa = a.qp(QpType::kUd);
  qb = b.qp(QpType::kUd);
  ConnOpts o;
  connect_qp(*a.dev, qa, nullptr, 0, o);
  connect_qp(*b.dev, qb, nullptr, 0, o);
  GuardedBuf src(8192), dst(9000);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 5, {sge(dst.data(), 9000, md)}).is_ok());
  auto ah = *a.dev->create_ah(a.pd, ah_to("127.0.0.3"));
  Wr s = send_wr(WrOpcode::kSend, 1, {sge(src.data(), 8192, ms)});  // > port MTU 4096
  s.ud.ah = ah.get();
  s.ud.remote_qpn = qb->qpn();
  s.ud.remote_qkey = o.qkey;
  ASSERT_TRUE(post(qa, s).is_ok());
  pump({&a, &b});
  auto c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);  // C10-93.1.1 / rxe
  EXPECT_EQ(qa->comp_.ctr.get(Ctr::kSentPkts), 0u);
  EXPECT_EQ(drain_cq(*b.rcq).size(), 0u);
}

TEST_F(BasicTest, UcLocalErrorGoesToSqe) {
  qa = a.qp(QpType::kUc);
  qb = b.qp(QpType::kUc);
  connect_pair(a, qa, b, qb);
  GuardedBuf src(64);
  auto ms = a.mr(src.data(), src.n);
  ASSERT_TRUE(post(qa, send_wr(WrOpcode::kSend, 1, {sge(src.data(), 100, ms)})).is_ok());
  auto c = drain_cq(*a.scq);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(qa->state(), QpState::kSqe);  // spec: UC/UD send errors -> SQE, not ERR
}

TEST_F(BasicTest, CountersCountBothSides) {
  rc();
  GuardedBuf src(3000), dst(3000);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(src.data(), 3000, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w.rdma.rkey = md->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  pump({&a, &b});
  EXPECT_EQ(qa->comp_.ctr.get(Ctr::kSentPkts), 3u);
  EXPECT_EQ(qb->comp_.ctr.get(Ctr::kRcvdPkts), 3u);
  EXPECT_EQ(qb->comp_.ctr.get(Ctr::kSentPkts), 1u);  // one ACK
  EXPECT_EQ(qa->comp_.ctr.get(Ctr::kRcvdPkts), 1u);
  EXPECT_EQ(qa->comp_.ctr.get(Ctr::kRdmaSends), 1u);
  EXPECT_EQ(qb->comp_.ctr.get(Ctr::kRdmaRecvs), 1u);
  EXPECT_EQ(a.eng->counters().get(Ctr::kSentPkts), 3u);
  EXPECT_EQ(counter_name(Ctr::kDuplicateRequest), "duplicate_request");
  EXPECT_EQ(counter_name(Ctr::kIcrcErr), "icrc_err");
}

}  // namespace
}  // namespace rnic::emu::test
