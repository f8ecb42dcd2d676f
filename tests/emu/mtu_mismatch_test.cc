// tests/emu/mtu_mismatch_test.cc: a path-MTU mismatch between peers (issue 11), two devices with
// different SOFTRNIC_MTU (DeviceConfig::active_mtu) on the in-memory network. The IBA makes the
// path MTU a QP got at RTR the one that counts (9.7.5.1.4, C9-20..22): a packet longer than it
// is a malformed length. RC answers with an Invalid Request NAK (the requester completes with
// REM_INV_REQ_ERR) and writes nothing; UD drops the datagram silently (above the port MTU).
// Both are counted in mtu_exceeded. A message that fits the smaller MTU still goes through.
#include <gtest/gtest.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

uint64_t ctr(Node& n, Ctr c) { return n.eng->counters().snapshot()[static_cast<size_t>(c)]; }

struct MtuPair {
  wire::MemNetwork net;
  Node big = Node::on_mem(net, "127.0.8.1", false, ErrorsMode::kSpec, 4096);
  Node small = Node::on_mem(net, "127.0.8.2", false, ErrorsMode::kSpec, 1024);
};

TEST(MtuMismatch, PortsReportTheirActiveMtu) {
  MtuPair p;
  EXPECT_EQ(p.big.dev->query_port(1)->active_mtu, Mtu::k4096);
  EXPECT_EQ(p.small.dev->query_port(1)->active_mtu, Mtu::k1024);
}

// RC: each side's path_mtu is its own port's (what perftest and rc_pingpong -m do without an
// agreement): 4096 on the sender, 1024 on the receiver.
TEST(MtuMismatch, RcPacketAboveTheResponderPathMtuIsNakedInvalidRequest) {
  MtuPair p;
  auto qa = p.big.qp(QpType::kRc);
  auto qb = p.small.qp(QpType::kRc);
  ConnOpts oa, ob;
  oa.mtu = Mtu::k4096;
  ob.mtu = Mtu::k1024;
  ob.rq_psn = oa.sq_psn;
  ob.sq_psn = oa.rq_psn;
  connect_qp(*p.big.dev, qa, p.small.ip.c_str(), qb->qpn(), oa);
  connect_qp(*p.small.dev, qb, p.big.ip.c_str(), qa->qpn(), ob);
  GuardedBuf src(8192), dst(8192);
  src.pattern(7);
  auto ms = p.big.mr(src.data(), src.n);
  auto md = p.small.mr(dst.data(), dst.n);

  // 1024 bytes: one packet, fits both path MTUs.
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(src.data(), 1024, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w.rdma.rkey = md->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  auto c = poll_n(*p.big.scq, 1, 5000, {&p.big, &p.small});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess) << wc_status_name(c[0].status);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), 1024), 0);
  EXPECT_EQ(ctr(p.small, Ctr::kMtuExceeded), 0u);

  // 8192 bytes: 4096-byte packets, longer than the responder's 1024.
  std::vector<uint8_t> before(dst.data(), dst.data() + dst.n);
  Wr w2 = send_wr(WrOpcode::kRdmaWrite, 2, {sge(src.data(), 8192, ms)});
  w2.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w2.rdma.rkey = md->rkey();
  ASSERT_TRUE(post(qa, w2).is_ok());
  c = poll_n(*p.big.scq, 1, 5000, {&p.big, &p.small});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemInvReqErr) << wc_status_name(c[0].status);
  EXPECT_GE(ctr(p.small, Ctr::kMtuExceeded), 1u);
  EXPECT_GE(ctr(p.small, Ctr::kNakSent), 1u);
  EXPECT_EQ(std::memcmp(before.data(), dst.data(), dst.n), 0) << "bytes landed";
  EXPECT_TRUE(dst.guards_ok());
}

TEST(MtuMismatch, UdDatagramAboveTheReceiverPortMtuIsDroppedAndCounted) {
  MtuPair p;
  auto qa = p.big.qp(QpType::kUd);
  auto qb = p.small.qp(QpType::kUd);
  ConnOpts o;
  connect_qp(*p.big.dev, qa, nullptr, 0, o);
  connect_qp(*p.small.dev, qb, nullptr, 0, o);
  GuardedBuf src(2048), dst(40 + 2048);
  auto ms = p.big.mr(src.data(), src.n);
  auto md = p.small.mr(dst.data(), dst.n);
  ASSERT_TRUE(post_recv(qb, 10, {sge(dst.data(), dst.n, md)}).is_ok());
  ASSERT_TRUE(post_recv(qb, 11, {sge(dst.data(), dst.n, md)}).is_ok());
  auto ah = *p.big.dev->create_ah(p.big.pd, ah_to(p.small.ip.c_str()));
  for (uint32_t len : {2048u, 1024u}) {
    Wr w = send_wr(WrOpcode::kSend, len, {sge(src.data(), len, ms)});
    w.ud.ah = ah.get();
    w.ud.remote_qpn = qb->qpn();
    w.ud.remote_qkey = o.qkey;
    ASSERT_TRUE(post(qa, w).is_ok());
    auto sc = poll_n(*p.big.scq, 1, 5000, {&p.big, &p.small});
    ASSERT_EQ(sc.size(), 1u);
    EXPECT_EQ(sc[0].status, WcStatus::kSuccess);  // UD: the sender never learns
  }
  pump({&p.big, &p.small});
  auto rc = drain_cq(*p.small.rcq);
  ASSERT_EQ(rc.size(), 1u) << "the 2048-byte datagram must be dropped, the 1024 one delivered";
  EXPECT_EQ(rc[0].wr_id, 10u);
  EXPECT_EQ(rc[0].byte_len, 40u + 1024u);
  EXPECT_EQ(ctr(p.small, Ctr::kMtuExceeded), 1u);
  EXPECT_EQ(ctr(p.small, Ctr::kUdDropped), 1u);
}

}  // namespace
}  // namespace rnic::emu::test
