// UD multicast (issue 14): Device::attach_mcast / detach_mcast errno cases (rxe's), and over
// real loopback UDP one send from device A to a multicast GID reaching every QP attached to
// it in devices B and C (one copy each, Q_Key checked per QP, GRH image with the group as
// destination), nothing after the detach, and the datagram as it is on the wire (a plain
// socket joined to the group sees BTH DestQP 0xFFFFFF).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <sstream>

#include "tests/emu/proto_util.h"
#include "wire/pcap.h"
#include "wire/udp_port.h"

namespace rnic::emu::test {
namespace {

// A group of its own per run (other checkouts may run this test at the same time).
std::string random_group() {
  std::random_device rd;
  return "239.193." + std::to_string(rd() % 256) + "." + std::to_string(1 + rd() % 250);
}

void mgid_of(const std::string& v4, uint8_t (&g)[16]) {
  std::memset(g, 0, 16);
  g[10] = g[11] = 0xff;
  in_addr a{};
  ASSERT_EQ(inet_pton(AF_INET, v4.c_str(), &a), 1);
  std::memcpy(g + 12, &a, 4);
}

void ud_up(Node& n, const std::shared_ptr<Qp>& q, uint32_t qkey) {
  ConnOpts o;
  o.qkey = qkey;
  connect_qp(*n.dev, q, nullptr, 0, o);
}

TEST(McastAttach, ErrnoCases) {
  Node n = Node::make_dev("127.0.0.1", ErrorsMode::kSpec);  // no engine: the table alone
  n.finish();
  uint8_t g[16];
  mgid_of("239.1.2.3", g);
  auto ud = n.qp(QpType::kUd);
  auto rc = n.qp(QpType::kRc);
  EXPECT_EQ(n.dev->attach_mcast(rc, g).code(), Errc::kInval);  // not UD
  uint8_t uni[16];
  mgid_of("127.0.0.9", uni);
  EXPECT_EQ(n.dev->attach_mcast(ud, uni).code(), Errc::kInval);  // not a multicast GID
  uint8_t v6mc[16] = {0xff, 0x0e};
  v6mc[15] = 0x42;
  EXPECT_TRUE(Device::is_mcast_gid(v6mc));
  EXPECT_FALSE(Device::is_mcast_gid(uni));
  EXPECT_EQ(n.dev->detach_mcast(ud, g).code(), Errc::kInval);  // not attached
  ASSERT_TRUE(n.dev->attach_mcast(ud, g).is_ok());
  EXPECT_TRUE(n.dev->attach_mcast(ud, g).is_ok());  // again: no change
  uint32_t m[4];
  EXPECT_EQ(n.dev->mcast_members(g, m, 4), 1u);
  EXPECT_EQ(m[0], ud->qpn());
  EXPECT_EQ(n.dev->detach_mcast(rc, g).code(), Errc::kInval);
  ASSERT_TRUE(n.dev->detach_mcast(ud, g).is_ok());
  EXPECT_EQ(n.dev->detach_mcast(ud, g).code(), Errc::kInval);
  EXPECT_EQ(n.dev->mcast_groups(), 0u);
  // Limits as reported: max_mcast_qp_attach QPs per group, max_mcast_grp groups.
  EXPECT_EQ(n.dev->attr().max_mcast_grp, static_cast<int>(kMaxMcastGrp));
  EXPECT_EQ(n.dev->attr().max_mcast_qp_attach, static_cast<int>(kMaxMcastQpAttach));
  std::vector<std::shared_ptr<Qp>> qps;
  for (uint32_t i = 0; i < kMaxMcastQpAttach; ++i) {
    qps.push_back(n.qp(QpType::kUd, nullptr, 4));
    ASSERT_TRUE(n.dev->attach_mcast(qps.back(), g).is_ok()) << i;
  }
  auto extra = n.qp(QpType::kUd, nullptr, 4);
  EXPECT_EQ(n.dev->attach_mcast(extra, g).code(), Errc::kNoMem);
  for (uint32_t i = 1; i < kMaxMcastGrp; ++i) {
    uint8_t gi[16] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, static_cast<uint8_t>(i >> 8),
                      static_cast<uint8_t>(i)};
    ASSERT_TRUE(n.dev->attach_mcast(extra, gi).is_ok()) << i;
  }
  uint8_t last[16] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  EXPECT_EQ(n.dev->attach_mcast(ud, last).code(), Errc::kNoMem);
  // Destroying a QP detaches it (rxe): its groups with no other QP go away.
  EXPECT_EQ(n.dev->mcast_groups(), kMaxMcastGrp);
  ASSERT_TRUE(n.dev->destroy_qp(extra).is_ok());
  EXPECT_EQ(n.dev->mcast_groups(), 1u);
  for (auto& q : qps) ASSERT_TRUE(n.dev->destroy_qp(q).is_ok());
  EXPECT_EQ(n.dev->mcast_groups(), 0u);
  n.dev->close();
}

// A plain UDP socket joined to `group` on lo (the wire as another host would see it).
int tap_socket(const std::string& group) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int one = 1;
  (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(wire::kRoceUdpPort);
  inet_pton(AF_INET, group.c_str(), &a.sin_addr);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  ip_mreqn m{};
  m.imr_multiaddr = a.sin_addr;
  inet_pton(AF_INET, "127.0.0.1", &m.imr_address);
  if (setsockopt(s, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) != 0) {
    close(s);
    return -1;
  }
  return s;
}

TEST(McastUdp, OneSendReachesEveryAttachedQpInTwoDevices) {
  const std::string group = random_group();
  uint8_t g[16];
  mgid_of(group, g);
  Node a = Node::on_udp_first_free({"127.91.0.2", "127.91.1.2", "127.91.2.2"});
  Node b = Node::on_udp_first_free({"127.91.0.3", "127.91.1.3", "127.91.2.3"});
  Node c = Node::on_udp_first_free({"127.91.0.4", "127.91.1.4", "127.91.2.4"});
  ASSERT_TRUE(a.eng && b.eng && c.eng);
  constexpr uint32_t kQkey = 0x01234567;
  auto qa = a.qp(QpType::kUd), qb1 = b.qp(QpType::kUd), qb2 = b.qp(QpType::kUd);
  auto qc = c.qp(QpType::kUd), qbad = c.qp(QpType::kUd);
  ud_up(a, qa, kQkey);
  ud_up(b, qb1, kQkey);
  ud_up(b, qb2, kQkey);
  ud_up(c, qc, kQkey);
  ud_up(c, qbad, 0x7777);  // attached, other Q_Key: no delivery, a Q_Key violation
  for (auto* p : {&qb1, &qb2}) ASSERT_TRUE(b.dev->attach_mcast(*p, g).is_ok());
  ASSERT_TRUE(c.dev->attach_mcast(qc, g).is_ok());
  ASSERT_TRUE(c.dev->attach_mcast(qbad, g).is_ok());
  auto* bp = dynamic_cast<wire::UdpPort*>(&b.eng->port());
  ASSERT_NE(bp, nullptr);
  EXPECT_EQ(bp->groups(), 1u);  // one IP group for the two QPs
  const int tap = tap_socket(group);
  ASSERT_GE(tap, 0) << strerror(errno);

  constexpr uint32_t kLen = 200;
  GuardedBuf src(kLen);
  src.pattern(5);
  auto ms = a.mr(src.data(), kLen);
  GuardedBuf rb1(40 + kLen), rb2(40 + kLen), rc1(40 + kLen), rbad(40 + kLen);
  auto m1 = b.mr(rb1.data(), rb1.n), m2 = b.mr(rb2.data(), rb2.n);
  auto m3 = c.mr(rc1.data(), rc1.n), m4 = c.mr(rbad.data(), rbad.n);
  ASSERT_TRUE(post_recv(qb1, 11, {sge(rb1.data(), rb1.n, m1)}).is_ok());
  ASSERT_TRUE(post_recv(qb2, 12, {sge(rb2.data(), rb2.n, m2)}).is_ok());
  ASSERT_TRUE(post_recv(qc, 13, {sge(rc1.data(), rc1.n, m3)}).is_ok());
  ASSERT_TRUE(post_recv(qbad, 14, {sge(rbad.data(), rbad.n, m4)}).is_ok());
  AhAttr aa = ah_to("127.0.0.1");
  std::memcpy(aa.grh.dgid, g, 16);
  aa.grh.hop_limit = 1;
  auto ah = a.dev->create_ah(a.pd, aa);
  ASSERT_TRUE(ah.has_value());
  const uint64_t qviol0 = c.eng->counters().get(Ctr::kQkeyViolCntr);
  Wr w = send_wr(WrOpcode::kSend, 1, {sge(src.data(), kLen, ms)});
  w.ud.ah = ah->get();
  w.ud.remote_qpn = 0xFFFFFF;
  w.ud.remote_qkey = kQkey;
  ASSERT_TRUE(post(qa, w).is_ok());
  auto sc = poll_n(*a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
  auto rb = poll_n(*b.rcq, 2);
  auto rcv = poll_n(*c.rcq, 1);
  ASSERT_EQ(rb.size(), 2u);
  ASSERT_EQ(rcv.size(), 1u);
  for (const Cqe& e : {rb[0], rb[1], rcv[0]}) {
    EXPECT_EQ(e.status, WcStatus::kSuccess) << wc_status_name(e.status);
    EXPECT_EQ(e.byte_len, 40 + kLen);
    EXPECT_EQ(e.src_qp, qa->qpn());
    EXPECT_TRUE(e.wc_flags & kWcGrh);
  }
  EXPECT_EQ(rcv[0].wr_id, 13u);
  for (GuardedBuf* r : {&rb1, &rb2, &rc1}) {
    EXPECT_EQ(std::memcmp(r->data() + 40, src.data(), kLen), 0);
    // The IPv4 header in the GRH area's last 20 bytes: to the group, from A.
    const uint8_t* ip = r->data() + 20;
    EXPECT_EQ(ip[0] >> 4, 4);
    EXPECT_EQ(std::memcmp(ip + 16, g + 12, 4), 0);
    EXPECT_EQ(std::memcmp(ip + 12, wire::Endpoint::parse(a.ip, 0)->addr, 4), 0);
    EXPECT_TRUE(r->guards_ok());
  }
  // The other Q_Key: nothing delivered, one violation counted.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(c.eng->counters().get(Ctr::kQkeyViolCntr), qviol0 + 1);
  Cqe extra[4];
  EXPECT_EQ(c.rcq->poll(extra, 4), 0);

  // On the wire: UDP 4791 to the group, BTH opcode UD SEND_ONLY, DestQP 0xFFFFFF, DETH Q_Key.
  pollfd pf{tap, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 2000), 1);
  uint8_t pkt[2048];
  const ssize_t got = recv(tap, pkt, sizeof pkt, 0);
  ASSERT_GE(got, static_cast<ssize_t>(12 + 8 + kLen + 4));
  wire::PacketView pv;
  ASSERT_EQ(wire::parse_roce(std::span<const uint8_t>(pkt, size_t(got)), &pv), wire::ParseError::kOk);
  EXPECT_EQ(pv.opcode, wire::op::kUdSendOnly);
  EXPECT_EQ(pv.bth().dest_qp(), 0xFFFFFFu);
  EXPECT_EQ(pv.deth().qkey(), kQkey);
  EXPECT_EQ(pv.deth().src_qp(), qa->qpn());
  close(tap);
  // tshark decodes it (if installed): the pcap frame as it was on the wire, nothing malformed.
  if (system("command -v tshark >/dev/null 2>&1") == 0) {
    const std::string pcap = "/tmp/softrnic_mcast_" + std::to_string(getpid()) + ".pcap";
    {
      auto w = wire::PcapWriter::open(pcap);
      ASSERT_NE(w, nullptr);
      wire::Endpoint from = *wire::Endpoint::parse(a.ip, qa->udp_sport());
      wire::Endpoint to = *wire::Endpoint::parse(group, wire::kRoceUdpPort);
      ASSERT_TRUE(w->write_packet(from, to, std::span<const uint8_t>(pkt, size_t(got))));
    }
    auto run = [](const std::string& cmd) {
      std::string out;
      FILE* f = popen(cmd.c_str(), "r");
      char buf[512];
      while (f != nullptr && fgets(buf, sizeof buf, f) != nullptr) out += buf;
      if (f != nullptr) pclose(f);
      return out;
    };
    const std::string bad =
        run("tshark -r " + pcap + " -Y '_ws.malformed || _ws.expert.severity >= 6291456' 2>/dev/null | wc -l");
    EXPECT_EQ(std::atoi(bad.c_str()), 0);
    const std::string f = run("tshark -r " + pcap +
                              " -T fields -E separator=, -e ip.dst -e udp.dstport -e infiniband.bth.opcode"
                              " -e infiniband.bth.destqp -e infiniband.deth.q_key 2>/dev/null");
    // ip.dst, udp.dstport, opcode 100 (UD SEND_ONLY), DestQP, Q_Key (hex widths vary by version).
    std::vector<std::string> v;
    std::stringstream ss(f);
    for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
    ASSERT_EQ(v.size(), 5u) << f;
    EXPECT_EQ(v[0], group);
    EXPECT_EQ(v[1], "4791");
    EXPECT_EQ(v[2], "100");
    EXPECT_EQ(std::strtoul(v[3].c_str(), nullptr, 0), 0xFFFFFFul) << f;
    EXPECT_EQ(std::strtoull(v[4].c_str(), nullptr, 0), kQkey) << f;
    unlink(pcap.c_str());
  }

  // After B's detaches B has left the IP group: a second send reaches C only.
  ASSERT_TRUE(b.dev->detach_mcast(qb1, g).is_ok());
  EXPECT_EQ(bp->groups(), 1u);
  ASSERT_TRUE(b.dev->detach_mcast(qb2, g).is_ok());
  EXPECT_EQ(bp->groups(), 0u);
  ASSERT_TRUE(post_recv(qb1, 21, {sge(rb1.data(), rb1.n, m1)}).is_ok());
  ASSERT_TRUE(post_recv(qc, 23, {sge(rc1.data(), rc1.n, m3)}).is_ok());
  Wr w2 = send_wr(WrOpcode::kSend, 2, {sge(src.data(), kLen, ms)});
  w2.ud.ah = ah->get();
  w2.ud.remote_qpn = 0xFFFFFF;
  w2.ud.remote_qkey = kQkey;
  ASSERT_TRUE(post(qa, w2).is_ok());
  ASSERT_EQ(poll_n(*a.scq, 1).size(), 1u);
  auto r2 = poll_n(*c.rcq, 1);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].wr_id, 23u);
  EXPECT_EQ(poll_n(*b.rcq, 1, 300).size(), 0u);

  for (Node* n : {&a, &b, &c}) {
    n->eng->stop();
    n->dev->close();
  }
}

}  // namespace
}  // namespace rnic::emu::test
