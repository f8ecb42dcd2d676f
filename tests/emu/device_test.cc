// tests/emu/device_test.cc: device open and attributes: identity, limits like rxe, GID
// table (index 0 = ::ffff:a.b.c.d, RoCE v2), active MTU from the interface, stable node
// GUID, create-time validation and EBUSY on destroying objects still in use.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::Env;
using testing::open_device;
using testing::test_config;

TEST(Device, OpenValidatesConfig) {
  DeviceConfig c = test_config();
  c.ip = "not-an-ip";
  EXPECT_EQ(Device::open(c).error(), Errc::kInval);
  c.ip = "";
  EXPECT_EQ(Device::open(c).error(), Errc::kInval);
  c = test_config();
  c.name = "";
  EXPECT_EQ(Device::open(c).error(), Errc::kInval);
  c = test_config();
  c.active_mtu = 1000;
  EXPECT_EQ(Device::open(c).error(), Errc::kInval);
  c = test_config();
  c.name = "mydev";
  auto d = open_device(c);
  EXPECT_EQ(d->name(), "mydev");
  EXPECT_EQ(open_device()->name(), "softrnic0");
}

TEST(Device, AttributesLikeRxe) {
  auto d = open_device();
  const DeviceAttr& a = d->attr();
  EXPECT_EQ(a.vendor_id, 0x02534Eu);
  EXPECT_NE(a.vendor_id, 0x02c9u);  // Mellanox
  EXPECT_NE(a.vendor_id, 0x1d0fu);  // Amazon (efa)
  EXPECT_EQ(a.max_qp_wr, 0x4000);
  EXPECT_EQ(a.max_sge, 32);
  EXPECT_EQ(a.max_cqe, 32767);
  EXPECT_EQ(a.max_qp_rd_atom, 128);
  EXPECT_EQ(a.max_srq_sge, 27);
  EXPECT_EQ(a.atomic_cap, AtomicCap::kHca);
  EXPECT_EQ(a.phys_port_cnt, 1);
  EXPECT_EQ(a.max_mr_size, ~uint64_t{0});
  EXPECT_TRUE(a.device_cap_flags & kDevCapMemWindowType2B);
  EXPECT_TRUE(a.device_cap_flags & kDevCapRcRnrNakGen);
  EXPECT_NE(a.node_guid, 0u);
  EXPECT_EQ((a.node_guid >> 56) & 0x03, 0x02u);  // locally administered, unicast
}

TEST(Device, NodeGuidStableAndDistinct) {
  auto a = open_device();
  auto b = open_device();
  EXPECT_EQ(a->attr().node_guid, b->attr().node_guid);
  DeviceConfig c = test_config();
  c.ip = "127.0.0.3";
  EXPECT_NE(open_device(c)->attr().node_guid, a->attr().node_guid);
  c = test_config();
  c.name = "softrnic1";
  EXPECT_NE(open_device(c)->attr().node_guid, a->attr().node_guid);
}

// The node GUID is the CA GUID of the CM (duplicate/stale detection key of Linux peers):
// another process (here a forked child) opening the same name on the same IP gets another one.
TEST(Device, NodeGuidDiffersPerProcess) {
  const uint64_t mine = open_device()->attr().node_guid;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto r = Device::open(test_config());
    uint64_t g = r.has_value() ? (*r)->attr().node_guid : 0;
    ssize_t w = write(fds[1], &g, sizeof g);
    _exit(w == sizeof g ? 0 : 1);
  }
  uint64_t child = 0;
  ASSERT_EQ(read(fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  int st = 0;
  waitpid(pid, &st, 0);
  close(fds[0]);
  close(fds[1]);
  EXPECT_NE(child, 0u);
  EXPECT_NE(child, mine);
  EXPECT_EQ((child >> 56) & 0x03, 0x02u);
}

TEST(Device, GidTableIndex0IsIpv4MappedRoceV2) {
  auto d = open_device();
  auto g = d->query_gid(1, 0);
  ASSERT_TRUE(g.has_value());
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2};
  EXPECT_EQ(std::memcmp(g->raw.data(), want, 16), 0);
  EXPECT_EQ(g->type, GidType::kRoceV2);
  EXPECT_EQ(d->query_gid(1, 1).error(), Errc::kInval);
  EXPECT_EQ(d->query_gid(2, 0).error(), Errc::kInval);
  EXPECT_EQ(*d->query_pkey(1, 0), 0xFFFF);
  EXPECT_EQ(d->query_pkey(1, 1).error(), Errc::kInval);
  EXPECT_EQ(d->ipv4(), 0x7F000002u);
}

TEST(Device, ActiveMtuFromInterface) {
  EXPECT_EQ(active_mtu_for_netdev(1500), Mtu::k1024);
  EXPECT_EQ(active_mtu_for_netdev(9000), Mtu::k4096);
  EXPECT_EQ(active_mtu_for_netdev(65536), Mtu::k4096);
  EXPECT_EQ(active_mtu_for_netdev(2200), Mtu::k2048);
  EXPECT_EQ(active_mtu_for_netdev(576), Mtu::k256);
  EXPECT_EQ(active_mtu_for_netdev(600), Mtu::k512);
  EXPECT_EQ(active_mtu_for_netdev(100), Mtu::k256);
  auto d = open_device();  // netdev_mtu 1500 in the test config
  auto p = d->query_port(1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->active_mtu, Mtu::k1024);
  EXPECT_EQ(p->max_mtu, Mtu::k4096);
  EXPECT_EQ(p->state, PortState::kActive);
  EXPECT_EQ(p->link_layer, kLinkLayerEthernet);
  EXPECT_EQ(p->gid_tbl_len, kGidTableSlots);  // 1 populated, the rest empty
  EXPECT_EQ(d->gids().size(), 1u);
  EXPECT_EQ(p->pkey_tbl_len, 1);
  EXPECT_EQ(d->query_port(0).error(), Errc::kInval);
  // Looked up: 127.0.0.2 lives on lo (MTU 65536 -> 4096).
  auto lo = interface_mtu_for("127.0.0.2");
  ASSERT_TRUE(lo.has_value());
  DeviceConfig c = test_config();
  c.netdev_mtu = 0;
  auto d2 = open_device(c);
  EXPECT_EQ(d2->query_port(1)->active_mtu, active_mtu_for_netdev(*lo));
  EXPECT_EQ(interface_mtu_for("203.0.113.77").error(), Errc::kNoDev);
  c.active_mtu = 2048;
  EXPECT_EQ(open_device(c)->query_port(1)->active_mtu, Mtu::k2048);
}

TEST(Device, CreateQpValidatesCaps) {
  Env env;
  QpInitAttr in;
  in.qp_type = QpType::kRc;
  in.send_cq = env.cq;
  in.recv_cq = env.cq;
  in.cap = {16, 16, 4, 4, 0};
  EXPECT_TRUE(env.dev->create_qp(env.pd, in).has_value());
  QpInitAttr b = in;
  b.cap.max_send_wr = 0x4001;
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  b = in;
  b.cap.max_recv_sge = 33;
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  b = in;
  b.cap.max_inline_data = 401;
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  b = in;
  b.send_cq = nullptr;
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  b = in;
  b.qp_type = QpType(8);  // RAW_PACKET
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  Env other;  // a CQ of another device
  b = in;
  b.recv_cq = other.cq;
  EXPECT_EQ(env.dev->create_qp(env.pd, b).error(), Errc::kInval);
  b = in;
  b.cap.max_send_wr = 0;
  auto q = env.dev->create_qp(env.pd, b);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ((*q)->cap().max_send_wr, 1u);
}

TEST(Device, DestroyInUseIsEbusy) {
  Env env;
  alignas(8) static uint8_t buf[64];
  auto mr = *env.dev->reg_mr(env.pd, reinterpret_cast<uint64_t>(buf), 64,
                             reinterpret_cast<uint64_t>(buf), 0);
  auto qp = env.qp(QpType::kUd);
  EXPECT_EQ(env.dev->dealloc_pd(env.pd), Errc::kBusy);
  EXPECT_EQ(env.dev->destroy_cq(env.cq), Errc::kBusy);
  ASSERT_TRUE(env.dev->destroy_qp(qp).is_ok());
  EXPECT_TRUE(env.dev->destroy_cq(env.cq).is_ok());
  EXPECT_EQ(env.dev->dealloc_pd(env.pd), Errc::kBusy);
  ASSERT_TRUE(env.dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(env.dev->dereg_mr(mr), Errc::kInval);  // twice
  EXPECT_TRUE(env.dev->dealloc_pd(env.pd).is_ok());
}

TEST(Device, AhValidation) {
  Env env;
  AhAttr a = testing::peer_ah(5);
  auto ah = env.dev->create_ah(env.pd, a);
  ASSERT_TRUE(ah.has_value());
  EXPECT_EQ((*ah)->av().dest_ipv4, 0x7F000005u);
  EXPECT_EQ((*ah)->av().hop_limit, 64);
  a.is_global = 0;
  EXPECT_EQ(env.dev->create_ah(env.pd, a).error(), Errc::kInval);
  // Any 32-bit flow label is accepted; its low 20 bits are used (UCX passes 0xffffffff).
  for (auto [fl, want] : {std::pair{0xffffffffu, 0xfffffu}, {0x12345678u, 0x45678u},
                          {1u << 20, 0u}}) {
    a = testing::peer_ah(5);
    a.grh.flow_label = fl;
    auto ah2 = env.dev->create_ah(env.pd, a);
    ASSERT_TRUE(ah2.has_value()) << fl;
    EXPECT_EQ((*ah2)->av().flow_label, want);
    EXPECT_TRUE(env.dev->destroy_ah(*ah2).is_ok());
  }
  EXPECT_EQ(env.dev->dealloc_pd(env.pd), Errc::kBusy);
  EXPECT_TRUE(env.dev->destroy_ah(*ah).is_ok());
}

TEST(Device, CloseReclaimsEverything) {
  Env env;
  auto ch = *env.dev->create_comp_channel();
  auto cq = *env.dev->create_cq(4, ch, 0);
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  Cqe e;
  ASSERT_TRUE(cq->push(e));  // an undelivered event (CQ <-> channel reference)
  auto qp = env.qp(QpType::kRc);
  auto mw = *env.dev->alloc_mw(env.pd, MwType::kType2);
  env.dev->close();
  EXPECT_EQ(env.dev->find_qp(qp->qpn()), nullptr);
  EXPECT_EQ(env.dev->keys().find_mw(mw->rkey()), nullptr);
  EXPECT_EQ(ch->pending(), 0u);
}

TEST(Status, ErrnoValuesAndResult) {
  Status s = Errc::kBusy;
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.errno_value(), EBUSY);
  EXPECT_EQ(Status().errno_value(), 0);
  Result<int> r = 5;
  EXPECT_TRUE(r.has_value());
  EXPECT_EQ(*r, 5);
  Result<int> e = Errc::kNoMem;
  EXPECT_FALSE(e.has_value());
  EXPECT_EQ(e.error(), Errc::kNoMem);
  EXPECT_EQ(e.status().errno_value(), ENOMEM);
  Result<std::string> str = std::string("abc");
  Result<std::string> copy = str;
  EXPECT_EQ(copy->size(), 3u);
  EXPECT_STREQ(errc_name(Errc::kOpNotSupp), "EOPNOTSUPP");
  EXPECT_STREQ(wc_status_name(WcStatus::kWrFlushErr), "WR_FLUSH_ERR");
}

}  // namespace
}  // namespace rnic::emu
