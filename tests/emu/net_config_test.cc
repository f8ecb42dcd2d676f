// tests/emu/net_config_test.cc: what the device derives from its network (issue 11): the GID
// table's layout for an interface's addresses (IPv4-mapped GID 0, IPv6 global, then link-local,
// nothing more on a loopback interface), AH resolution over IPv6 GIDs, and receive GRO being on
// whatever the send-side GSO setting (EngineConfig::gro vs gso).
#include <gtest/gtest.h>

#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "tests/emu/proto_util.h"
#include "wire/udp_port.h"

namespace rnic::emu::test {
namespace {

wire::Endpoint ep(const char* s) { return *wire::Endpoint::parse(s, 0); }

NetIf veth() {
  NetIf n;
  n.name = "eth0";
  n.index = 7;
  n.addrs = {ep("10.1.0.2"), ep("fe80::1:2"), ep("10.1.0.11"), ep("fd00::2"), ep("2001:db8::2")};
  return n;
}

TEST(GidTable, Ipv4PrimaryThenIpv6GlobalThenLinkLocal) {
  NetIf n = veth();
  auto t = gid_table_for(ep("10.1.0.2"), &n);
  ASSERT_EQ(t.size(), 4u);
  const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 0, 2};
  EXPECT_EQ(std::memcmp(t[0].raw.data(), mapped, 16), 0);
  EXPECT_EQ(t[1].addr.ip_string(), "fd00::2");
  EXPECT_EQ(t[2].addr.ip_string(), "2001:db8::2");
  EXPECT_EQ(t[3].addr.ip_string(), "fe80::1:2");
  EXPECT_EQ(t[3].addr.scope_id, 7u);  // link-local: the interface
  for (const GidEntry& g : t) {
    EXPECT_EQ(g.type, GidType::kRoceV2);
    EXPECT_EQ(g.netdev, "eth0");
  }
  // The other IPv4 address (another device's, maybe) is not listed.
  for (const GidEntry& g : t) EXPECT_NE(g.addr.ip_string(), "10.1.0.11");
}

TEST(GidTable, Ipv6PrimaryFirst) {
  NetIf n = veth();
  auto t = gid_table_for(ep("fd00::2"), &n);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].addr.ip_string(), "fd00::2");
  EXPECT_EQ(t[1].addr.ip_string(), "2001:db8::2");
  EXPECT_EQ(t[2].addr.ip_string(), "fe80::1:2");
}

TEST(GidTable, LoopbackListsOnlyTheDeviceAddress) {
  NetIf n = veth();
  n.loopback = true;
  EXPECT_EQ(gid_table_for(ep("10.1.0.2"), &n).size(), 1u);
  EXPECT_EQ(gid_table_for(ep("10.1.0.2"), nullptr).size(), 1u);
}

TEST(GidTable, DeviceOnIpv6LoopbackHasOneIpv6Gid) {
  DeviceConfig cfg;
  cfg.ip = "::1";
  cfg.netdev_mtu = 65536;
  auto d = Device::open(cfg);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ((*d)->gids().size(), 1u);
  EXPECT_EQ((*d)->query_port(1)->gid_tbl_len, kGidTableSlots);
  auto g = (*d)->query_gid(1, 0);
  ASSERT_TRUE(g.has_value());
  const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(g->raw.data(), one, 16), 0);
  EXPECT_EQ((*d)->query_gid(1, 1).error(), Errc::kInval);
}

// An AH must pair an SGID and a DGID of one family; an IPv6 DGID must not be unspecified (a
// multicast one is a UD multicast destination).
TEST(GidTable, AhFamiliesMustMatch) {
  DeviceConfig cfg;
  cfg.ip = "::1";
  cfg.netdev_mtu = 65536;
  auto d = *Device::open(cfg);
  auto pd = *d->alloc_pd();
  AhAttr a;
  a.is_global = true;
  a.port_num = 1;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 1;
  const uint8_t v6[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
  std::memcpy(a.grh.dgid, v6, 16);
  a.grh.flow_label = 0xffffffffu;
  auto ah = d->create_ah(pd, a);
  ASSERT_TRUE(ah.has_value());
  EXPECT_FALSE((*ah)->av().ipv4);
  EXPECT_EQ((*ah)->av().flow_label, 0xfffffu);
  EXPECT_EQ(d->create_ah(pd, ah_to("127.0.0.5")).error(), Errc::kInval);  // IPv4 DGID, IPv6 SGID
  a.grh.dgid[0] = 0xff;  // multicast (ff00::5): accepted, for UD multicast sends
  auto mah = d->create_ah(pd, a);
  ASSERT_TRUE(mah.has_value());
  EXPECT_FALSE((*mah)->av().ipv4);
  std::memset(a.grh.dgid, 0, 16);  // unspecified: no peer
  EXPECT_EQ(d->create_ah(pd, a).error(), Errc::kInval);
}

// Two devices on IPv6 addresses (the in-memory network): RC WRITE and UD SEND over IPv6 GIDs;
// the UD receive's GRH area is the IPv6 header as it arrived, and wc.sl = 1 (IPv6 L3 type).
TEST(Ipv6Transport, RcWriteAndUdSendOverIpv6Gids) {
  wire::MemNetwork net;
  Node a = Node::on_mem(net, "fd00::a");
  Node b = Node::on_mem(net, "fd00::b");
  auto qa = a.qp(QpType::kRc), qb = b.qp(QpType::kRc);
  connect_pair(a, qa, b, qb);
  GuardedBuf src(5000), dst(5000);
  src.pattern(3);
  auto ms = a.mr(src.data(), src.n);
  auto md = b.mr(dst.data(), dst.n);
  Wr w = send_wr(WrOpcode::kRdmaWrite, 1, {sge(src.data(), 5000, ms)});
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w.rdma.rkey = md->rkey();
  ASSERT_TRUE(post(qa, w).is_ok());
  auto c = poll_n(*a.scq, 1, 5000, {&a, &b});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess) << wc_status_name(c[0].status);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), 5000), 0);

  auto ua = a.qp(QpType::kUd), ub = b.qp(QpType::kUd);
  ConnOpts o;
  connect_qp(*a.dev, ua, nullptr, 0, o);
  connect_qp(*b.dev, ub, nullptr, 0, o);
  GuardedBuf rb(40 + 100);
  auto mrb = b.mr(rb.data(), rb.n);
  ASSERT_TRUE(post_recv(ub, 9, {sge(rb.data(), rb.n, mrb)}).is_ok());
  auto ah = *a.dev->create_ah(a.pd, ah_to("fd00::b"));
  Wr u = send_wr(WrOpcode::kSend, 2, {sge(src.data(), 100, ms)});
  u.ud.ah = ah.get();
  u.ud.remote_qpn = ub->qpn();
  u.ud.remote_qkey = o.qkey;
  ASSERT_TRUE(post(ua, u).is_ok());
  ASSERT_EQ(poll_n(*a.scq, 1, 5000, {&a, &b}).size(), 1u);
  auto r = poll_n(*b.rcq, 1, 5000, {&a, &b});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, WcStatus::kSuccess);
  EXPECT_EQ(r[0].byte_len, 140u);
  EXPECT_EQ(r[0].sl, 1);  // IPv6 (mlx5's CQE L3 type; IPv4 is 2)
  const uint8_t* g = rb.data();
  EXPECT_EQ(g[0] >> 4, 6);                                   // version
  EXPECT_EQ((g[4] << 8) | g[5], 8 + 12 + 8 + 100 + 4);       // payload: UDP+BTH+DETH+data+ICRC
  EXPECT_EQ(g[6], 17);                                       // next header UDP
  EXPECT_EQ(std::memcmp(g + 8, ep("fd00::a").addr, 16), 0);  // source GID
  EXPECT_EQ(std::memcmp(g + 24, ep("fd00::b").addr, 16), 0);
  EXPECT_EQ(std::memcmp(g + 40, src.data(), 100), 0);
}

// GRO is a receive decision: on with SOFTRNIC_GSO=off too (the receiver splits by segment).
TEST(GroGso, ReceiveGroIsOnWhenSendGsoIsOff) {
  Node n = Node::make_dev("127.0.0.1", ErrorsMode::kSpec);
  EngineConfig ec;
  ec.gso = false;
  ec.progress_thread = false;
  ec.udp_port = 0;  // ephemeral: no clash with other tests
  auto e = Engine::start(n.dev, ec);
  ASSERT_TRUE(e.has_value());
  auto* up = dynamic_cast<wire::UdpPort*>(&(*e)->port());
  ASSERT_NE(up, nullptr);
  EXPECT_TRUE(up->gro_enabled());
  EXPECT_EQ((*e)->port().max_gso_segments() > 1, up->gso_supported());
  (*e)->stop();
  n.dev->close();
}

}  // namespace
}  // namespace rnic::emu::test
