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
  ASSERT_EQ((*d)->query_port(1)->gid_tbl_len, 1);
  auto g = (*d)->query_gid(1, 0);
  ASSERT_TRUE(g.has_value());
  const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(g->raw.data(), one, 16), 0);
  EXPECT_EQ((*d)->query_gid(1, 1).error(), Errc::kInval);
}

// An AH must pair an SGID and a DGID of one family; an IPv6 DGID must be unicast.
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
  a.grh.dgid[0] = 0xff;  // multicast
  EXPECT_EQ(d->create_ah(pd, a).error(), Errc::kInval);
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
