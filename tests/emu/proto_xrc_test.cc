// Protocol tests of the XRC target (IBA 9.3.6, 11.2.5.4): a hand-driven peer sends XRC
// requests to an XRC_RECV QP; the XRCETH names the SRQ that receives, which must be an XRC
// SRQ of the QP's own XRC domain, else the answer is an Invalid Request NAK.
#include <gtest/gtest.h>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {
namespace {

namespace op = wire::op;
namespace aeth = wire::aeth;

constexpr uint32_t kPeerQpn = 0x000456;

struct XrcTarget {
  wire::MemNetwork net;
  Node s = Node::on_mem(net, "127.0.0.3");
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Xrcd> x = *s.dev->alloc_xrcd();
  std::shared_ptr<Xrcd> y = *s.dev->alloc_xrcd();
  std::shared_ptr<Qp> tgt;
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096, 0);
  std::shared_ptr<Mr> mr = s.mr(buf.data(), buf.size());

  XrcTarget() {
    QpInitAttr ia;
    ia.qp_type = QpType::kXrcRecv;
    ia.xrcd = x;
    tgt = *s.dev->create_qp(nullptr, ia);
    QpAttr a;
    a.qp_state = QpState::kInit;
    a.port_num = 1;
    a.qp_access_flags = kAccessRemoteWrite;
    EXPECT_TRUE(s.dev->modify_qp(tgt, a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags).is_ok());
    a = QpAttr{};
    a.qp_state = QpState::kRtr;
    a.ah_attr = ah_to("127.0.0.2");
    a.path_mtu = Mtu::k1024;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = 100;
    a.min_rnr_timer = 1;
    EXPECT_TRUE(s.dev->modify_qp(tgt, a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn |
                                             kQpMaxDestRdAtomic | kQpMinRnrTimer).is_ok());
    a = QpAttr{};
    a.qp_state = QpState::kRts;
    a.timeout = 14;
    a.sq_psn = 7;
    EXPECT_TRUE(s.dev->modify_qp(tgt, a, kQpState | kQpTimeout | kQpSqPsn).is_ok());
  }
  std::shared_ptr<Srq> srq(std::shared_ptr<Xrcd> d, bool xrc = true) {
    SrqAttr sa;
    sa.max_wr = 4;
    sa.max_sge = 1;
    auto r = xrc ? s.dev->create_srq(s.pd, sa, d, s.rcq) : s.dev->create_srq(s.pd, sa);
    EXPECT_TRUE(r.has_value());
    Sge g{reinterpret_cast<uint64_t>(buf.data()), 4096, mr->lkey()};
    RecvWr w;
    w.wr_id = 0x77;
    w.sg_list = &g;
    w.num_sge = 1;
    int bad = 0;
    EXPECT_TRUE((*r)->post_recv(&w, 1, &bad).is_ok());
    return *r;
  }
  void send_only(uint32_t srqn, uint32_t psn, std::span<const uint8_t> payload) {
    wire::PacketFields f;
    f.opcode = op::kXrcSendOnly;
    f.dest_qp = tgt->qpn();
    f.psn = psn;
    f.ack_req = true;
    f.xrc_srqn = srqn;
    p.send(f, payload);
    pump({&s});
  }
};

TEST(ProtoXrcTest, SendLandsInTheNamedSrqAndIsAckedWithAnXrcAck) {
  // Given: an XRC SRQ of the target's domain with one receive posted.
  XrcTarget t;
  auto sx = t.srq(t.x);
  const std::vector<uint8_t> msg = {1, 2, 3, 4, 5, 6, 7};
  // When: the peer sends XRC_SEND_ONLY naming it.
  t.send_only(sx->srq_num(), 100, msg);
  // Expect: an XRC ACKNOWLEDGE (0xB1, no XRCETH) for PSN 100 to the peer's QP, the data in the
  // buffer, and the completion on the SRQ's CQ naming the target QP.
  auto out = t.p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kXrcAcknowledge);
  EXPECT_EQ(out[0].f.dest_qp, kPeerQpn);
  EXPECT_EQ(out[0].psn(), 100u);
  EXPECT_TRUE(aeth::is_ack(out[0].syndrome()));
  EXPECT_EQ(0, std::memcmp(t.buf.data(), msg.data(), msg.size()));
  auto cqes = drain_cq(*t.s.rcq);
  ASSERT_EQ(cqes.size(), 1u);
  EXPECT_EQ(cqes[0].status, WcStatus::kSuccess);
  EXPECT_EQ(cqes[0].wr_id, 0x77u);
  EXPECT_EQ(cqes[0].byte_len, msg.size());
  EXPECT_EQ(cqes[0].qp_num, t.tgt->qpn());
  EXPECT_EQ(t.tgt->state(), QpState::kRts);
}

TEST(ProtoXrcTest, SrqOfAnotherXrcdIsAnInvalidRequestNak) {
  // Given: the only SRQ named belongs to another XRC domain.
  XrcTarget t;
  auto sy = t.srq(t.y);
  const std::vector<uint8_t> msg(16, 0xee);
  t.send_only(sy->srq_num(), 100, msg);
  // Expect: NAK Invalid Request, nothing written, no completion, the target QP in ERR.
  auto out = t.p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode(), op::kXrcAcknowledge);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_EQ(t.buf[0], 0);
  EXPECT_TRUE(drain_cq(*t.s.rcq).empty());
  EXPECT_EQ(sy->count(), 1u);  // its WQE untouched
  EXPECT_EQ(t.tgt->state(), QpState::kErr);
}

TEST(ProtoXrcTest, BasicSrqOrUnknownSrqnIsAnInvalidRequestNak) {
  for (int basic = 0; basic < 2; ++basic) {
    XrcTarget t;
    uint32_t n = 0xabcdef;  // no such SRQ
    std::shared_ptr<Srq> sb;
    if (basic) {
      sb = t.srq(nullptr, false);
      n = sb->srq_num();
    }
    t.send_only(n, 100, std::vector<uint8_t>(4, 1));
    auto out = t.p.recv_all();
    ASSERT_EQ(out.size(), 1u) << basic;
    EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest)) << basic;
    EXPECT_EQ(t.tgt->state(), QpState::kErr) << basic;
  }
}

TEST(ProtoXrcTest, DestroyedSrqIsNoLongerDelivered) {
  // Given: one message delivered into sx, then sx destroyed.
  XrcTarget t;
  auto sx = t.srq(t.x);
  const uint32_t n = sx->srq_num();
  t.send_only(n, 100, std::vector<uint8_t>(4, 1));
  ASSERT_EQ(t.p.recv_all().size(), 1u);
  ASSERT_EQ(drain_cq(*t.s.rcq).size(), 1u);
  ASSERT_TRUE(t.s.dev->destroy_srq(sx).is_ok());
  // When: the next message names the same SRQ number.
  t.send_only(n, 101, std::vector<uint8_t>(4, 2));
  // Expect: Invalid Request NAK, nothing delivered (the target held the SRQ of message 1).
  auto out = t.p.recv_all();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].psn(), 101u);
  EXPECT_EQ(out[0].syndrome(), aeth::nak(aeth::kNakInvalidRequest));
  EXPECT_TRUE(drain_cq(*t.s.rcq).empty());
}

TEST(ProtoXrcTest, RcOpcodeToAnXrcTargetIsDropped) {
  // An RC SEND to an XRC_RECV QP: wrong transport class, dropped and counted, no answer.
  XrcTarget t;
  auto sx = t.srq(t.x);
  wire::PacketFields f;
  f.opcode = op::kRcSendOnly;
  f.dest_qp = t.tgt->qpn();
  f.psn = 100;
  f.ack_req = true;
  t.p.send(f, std::vector<uint8_t>(4, 1));
  pump({&t.s});
  EXPECT_TRUE(t.p.recv_all().empty());
  EXPECT_EQ(sx->count(), 1u);
  EXPECT_EQ(t.tgt->state(), QpState::kRts);
}

}  // namespace
}  // namespace rnic::emu::test
