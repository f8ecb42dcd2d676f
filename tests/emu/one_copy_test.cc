// tests/emu/one_copy_test.cc: one copy between two devices of one host (emu/transport/
// one_copy.h) over real loopback UDP: bytes land exactly through descriptors, what goes by
// value, forged descriptors are dropped and counted, losses are recovered, and a peer's
// mappings go when it closes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "emu/transport/one_copy.h"
#include "tests/emu/proto_util.h"
#include "wire/hdr.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace rnic::emu::test {
namespace {

EngineConfig one_copy_config(bool on) {
  EngineConfig ec;
  ec.one_copy = on;
  return ec;
}

struct Pair {
  explicit Pair(bool a_on = true, bool b_on = true)
      : a(Node::on_udp_first_free({"127.0.0.4", "127.0.0.14", "127.0.0.24", "127.0.0.34"},
                                  one_copy_config(a_on))),
        b(Node::on_udp_first_free({"127.0.0.5", "127.0.0.15", "127.0.0.25", "127.0.0.35"},
                                  one_copy_config(b_on))) {}
  Node a, b;
  uint64_t ctr(Node& n, Ctr c) { return n.eng->counters().get(c); }
};

wire::Endpoint endpoint_of(const Node& n) {
  return *wire::Endpoint::parse(n.ip, wire::kRoceUdpPort);
}

struct Conn {
  std::shared_ptr<Qp> qa, qb;
};

Conn connect(Pair& p, Mtu mtu = Mtu::k4096) {
  Conn c{p.a.qp(QpType::kRc), p.b.qp(QpType::kRc)};
  ConnOpts o;
  o.mtu = mtu;
  connect_pair(p.a, c.qa, p.b, c.qb, o);
  return c;
}

// One WRITE (or SEND into a posted receive) of `size` bytes from a to b, checked byte for byte
// with guard bands on both sides.
void transfer(Pair& p, Conn& c, WrOpcode opc, uint32_t size, int nsge = 1) {
  GuardedBuf local(size), remote(size);
  local.pattern(size + 3);
  auto ml = p.a.mr(local.raw(), local.raw_size());
  auto mr = p.b.mr(remote.raw(), remote.raw_size());
  const bool send = opc == WrOpcode::kSend;
  if (send) {
    ASSERT_TRUE(post_recv(c.qb, 9, {sge(remote.data(), size, mr)}).is_ok());
  }
  std::vector<Sge> sges;
  uint32_t done = 0;
  for (int i = 0; i < nsge; ++i) {
    const uint32_t n = i + 1 == nsge ? size - done : size / nsge;
    sges.push_back(sge(local.data() + done, n, ml));
    done += n;
  }
  Wr w = send_wr(opc, 7, std::move(sges));
  w.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  w.rdma.rkey = mr->rkey();
  ASSERT_TRUE(post(c.qa, w).is_ok());
  auto sc = poll_n(*p.a.scq, 1, 20000);
  ASSERT_EQ(sc.size(), 1u) << "no send completion";
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess) << wc_status_name(sc[0].status);
  if (send) {
    auto rc = poll_n(*p.b.rcq, 1, 20000);
    ASSERT_EQ(rc.size(), 1u) << "no receive completion";
    EXPECT_EQ(rc[0].status, WcStatus::kSuccess) << wc_status_name(rc[0].status);
    EXPECT_EQ(rc[0].byte_len, size);
  }
  EXPECT_EQ(std::memcmp(local.data(), remote.data(), size), 0) << "payload differs";
  EXPECT_TRUE(remote.guards_ok()) << "a guard band was written";
}

// (opcode, bytes, SGEs, packets expected to go as descriptors)
class OneCopySizes
    : public ::testing::TestWithParam<std::tuple<WrOpcode, uint32_t, int, uint32_t>> {};

TEST_P(OneCopySizes, BytesLandExactlyThroughDescriptors) {
  auto [opc, size, nsge, want] = GetParam();
  Pair p;
  ASSERT_TRUE(p.a.eng && p.b.eng);
  ASSERT_NE(p.a.eng->one_copy(), nullptr);
  ASSERT_NE(p.b.eng->one_copy(), nullptr);
  Conn c = connect(p);
  transfer(p, c, opc, size, nsge);
  // Every first transmission of a packet whose payload is >= kOneCopyMinBytes and inside one
  // SGE goes as a descriptor; resends (a slow sanitizer build times some out) carry bytes.
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), want);
  EXPECT_GT(p.ctr(p.b, Ctr::kOneCopyRx), 0u);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropOneCopy), 0u);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropMalformed), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, OneCopySizes,
    ::testing::Values(std::make_tuple(WrOpcode::kRdmaWrite, 256u, 1, 1u),
                      std::make_tuple(WrOpcode::kRdmaWrite, 4095u, 1, 1u),
                      std::make_tuple(WrOpcode::kRdmaWrite, 4096u, 1, 1u),
                      std::make_tuple(WrOpcode::kRdmaWrite, 4096u + 300u, 1, 2u),
                      // a 100-byte tail goes by value, in the same message and batch
                      std::make_tuple(WrOpcode::kRdmaWrite, 4096u + 100u, 1, 1u),
                      std::make_tuple(WrOpcode::kRdmaWrite, 1u << 20, 1, 256u),
                      std::make_tuple(WrOpcode::kRdmaWrite, 3u * 4096u, 3, 3u),
                      // 3 SGEs of 5000 bytes: packets 2 and 3 cross SGEs and go by value
                      std::make_tuple(WrOpcode::kRdmaWrite, 15000u, 3, 2u),
                      std::make_tuple(WrOpcode::kSend, 4096u, 1, 1u),
                      std::make_tuple(WrOpcode::kSend, 65536u, 1, 16u),
                      std::make_tuple(WrOpcode::kSend, 65536u, 4, 16u),
                      std::make_tuple(WrOpcode::kSend, 15000u, 3, 2u)));

TEST(OneCopy, SmallPayloadsGoByValue) {
  Pair p;
  Conn c = connect(p);
  transfer(p, c, WrOpcode::kRdmaWrite, kOneCopyMinBytes - 1);
  transfer(p, c, WrOpcode::kSend, 64);
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), 0u);
}

TEST(OneCopy, APeerThatDoesNotListenGetsPayloadsByValue) {
  Pair p(true, false);
  ASSERT_EQ(p.b.eng->one_copy(), nullptr);
  Conn c = connect(p);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), 0u);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropMalformed), 0u);
}

// Capture and fault injection see every packet as it is on the wire: a sender with either
// attached (a fault engine, however empty) sends by value.
TEST(OneCopy, ASenderWithCaptureOrFaultsSendsByValue) {
  struct Idle : wire::HeldPacketSource {
    size_t drain(wire::Direction, EmitFn, void*) override { return 0; }
    uint64_t next_deadline_ns() const override { return 0; }
    bool maybe_pending() const override { return false; }
  } idle;
  Pair p;
  Conn c = connect(p);
  p.a.eng->set_fault_engine(&idle);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), 0u);
  p.a.eng->set_fault_engine(nullptr);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), 16u);
}

// Drops every 5th request packet at the receiver (first transmissions and resends alike):
// the stash keeps descriptors that arrived after a lost one and resolves them again when
// the gap is filled; resends carry bytes; the bytes land.
TEST(OneCopy, LossesAreRecoveredThroughDescriptors) {
  struct Dropper : wire::PacketFilter {
    std::atomic<uint64_t> n{0}, dropped{0};
    wire::Verdict on_packet(wire::Direction dir, const wire::Endpoint&, const wire::Endpoint&,
                            std::span<uint8_t> roce, wire::FilterOut&) override {
      if (dir != wire::Direction::kRx || roce.size() < wire::kBthBytes) return wire::Verdict::kPass;
      if (!(wire::opcode_info(roce[0]).mask & wire::kReqMask) || n.fetch_add(1) % 5 != 2) return wire::Verdict::kPass;
      dropped.fetch_add(1);
      return wire::Verdict::kDrop;
    }
  } dropper;
  Pair p;
  Conn c = connect(p);
  if (!p.b.eng->port().set_filter(&dropper)) GTEST_SKIP() << "built without the packet hook";
  transfer(p, c, WrOpcode::kRdmaWrite, 1u << 20);
  transfer(p, c, WrOpcode::kSend, 65536);
  p.b.eng->port().set_filter(nullptr);
  EXPECT_GT(dropper.dropped.load(), 0u);
  EXPECT_GT(p.ctr(p.a, Ctr::kRetransPkts), 0u);
  EXPECT_EQ(p.ctr(p.a, Ctr::kOneCopyTx), 256u + 16u);  // first transmissions only
  EXPECT_GT(p.ctr(p.b, Ctr::kStashReplayed), 0u) << "no stashed descriptor was replayed";
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropOneCopy), 0u);
}

// A responder that cannot resolve descriptors (no mapping, no fd to spare) drops them; the
// requester's resends carry the bytes, so the QP completes instead of retrying to its end.
TEST(OneCopy, UnresolvableDescriptorsAreResentByValue) {
  Pair p;
  Conn c = connect(p);
  p.b.eng->one_copy()->fail_resolves_for_test(1000);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  transfer(p, c, WrOpcode::kSend, 65536);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropOneCopy), 32u);
  EXPECT_GT(p.ctr(p.a, Ctr::kRetransPkts), 0u);
  EXPECT_EQ(p.ctr(p.a, Ctr::kRetryExceededErr), 0u);
}

// The responder drops its links (as when receiving a share fails): the requester's device
// sees the hang-up, retires its link, and the QP links again.
TEST(OneCopy, ALinkTheResponderDroppedIsMadeAgain) {
  Pair p;
  Conn c = connect(p);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  OneCopyLink* first = p.a.eng->one_copy()->link(endpoint_of(p.b));
  ASSERT_NE(first, nullptr);
  p.b.eng->one_copy()->drop_links_for_test();
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!OneCopy::broken(first) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(OneCopy::broken(first)) << "the hang-up was not seen";
  const uint64_t before = p.ctr(p.b, Ctr::kOneCopyRx);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  EXPECT_GE(p.ctr(p.b, Ctr::kOneCopyRx) - before, 16u);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropOneCopy), 0u);
}

// A datagram from anyone on the host, made to look like the linked peer's descriptors.
class Forger {
 public:
  // From `from`'s IP (another UDP port), so that only the descriptor can make a difference.
  Forger(const Node& from, const Node& to) : dst_(endpoint_of(to)) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(endpoint_of(from).v4_host());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t l = sizeof a;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l), 0);
    src_ = wire::Endpoint::v4(endpoint_of(from).v4_host(), ntohs(a.sin_port));
  }
  ~Forger() { ::close(fd_); }
  void send(uint8_t opcode, uint32_t qpn, uint32_t psn, const OneCopyDesc& d, uint64_t va,
            uint32_t rkey, uint8_t tver = wire::kTverOneCopy) {
    wire::PacketFields f;
    f.opcode = opcode;
    f.tver = tver;
    f.dest_qp = qpn;
    f.psn = psn;
    f.ack_req = true;
    f.va = va;
    f.rkey = rkey;
    f.dma_len = d.len;
    uint8_t buf[256];
    const size_t hl = wire::write_roce_headers(buf, f, kOneCopyDescBytes);
    ASSERT_NE(hl, 0u);
    put_one_copy_desc(buf + hl, d);
    const size_t n = wire::finish_roce(buf, hl, kOneCopyDescBytes, wire::meta_between(src_, dst_));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(dst_.port);
    to.sin_addr.s_addr = htonl(dst_.v4_host());
    ASSERT_EQ(::sendto(fd_, buf, n, 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(n));
  }

 private:
  int fd_ = -1;
  wire::Endpoint src_, dst_;
};

uint32_t epsn(const std::shared_ptr<Qp>& qp) {
  std::lock_guard lk(qp->recv_mutex());
  return qp->resp_.epsn;
}

uint64_t wait_ctr(Node& n, Ctr c, uint64_t want) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (n.eng->counters().get(c) < want && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return n.eng->counters().get(c);
}

// Descriptors with a wrong token, an id the peer never shared, a range past the memfd, a
// bad length, or on an opcode other than SEND/WRITE are dropped and counted before any QP
// state or memory is touched; a device with one-copy off refuses TVer 1 as malformed.
TEST(OneCopy, ForgedDescriptorsAreDroppedAndCounted) {
  Pair p;
  Conn c = connect(p);
  transfer(p, c, WrOpcode::kRdmaWrite, 8192);  // links a to b and shares a's buffer
  OneCopyLink* l = p.a.eng->one_copy()->link(endpoint_of(p.b));
  ASSERT_NE(l, nullptr);
  const uint64_t token = OneCopy::token(l);

  GuardedBuf secret(8192), target(8192);
  secret.pattern(77);
  auto ms = p.a.mr(secret.raw(), secret.raw_size());
  auto mt = p.b.mr(target.raw(), target.raw_size());
  PinLoc loc;
  ASSERT_TRUE(ms->pin()->locate(ms->view().translate(reinterpret_cast<uint64_t>(secret.data())),
                                4096, &loc));
  // Share the secret's memfd for real (as a packet of a would), so only the forged fields
  // make the difference.
  ASSERT_TRUE(p.a.eng->one_copy()->share(l, loc.backing));
  const uint32_t id = loc.backing->id;
  const auto va = reinterpret_cast<uint64_t>(target.data());
  const uint32_t rkey = mt->rkey();
  const uint32_t psn = epsn(c.qb);  // what b expects next

  Forger f(p.a, p.b);
  const uint64_t before = p.ctr(p.b, Ctr::kDropOneCopy);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token + 1, id, 4096, loc.off}, va, rkey);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token, id + 1000, 4096, loc.off}, va, rkey);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn,
         {token, id, 4096, loc.backing->size - 4095}, va, rkey);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token, id, 4096, ~uint64_t{0} - 10}, va, rkey);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token, id, 0, loc.off}, va, rkey);
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token, id, 8192, loc.off}, va, rkey);
  f.send(wire::op::kRcRdmaReadResponseOnly, c.qa->qpn(), psn, {token, id, 4096, loc.off}, va,
         rkey);
  f.send(wire::op::kUcSendOnly, c.qb->qpn(), psn, {token, id, 4096, loc.off}, va, rkey);
  EXPECT_EQ(wait_ctr(p.b, Ctr::kDropOneCopy, before + 8), before + 8);
  EXPECT_EQ(p.ctr(p.b, Ctr::kIcrcErr), 0u) << "the forger's ICRC must be right";
  for (size_t i = 0; i < target.n; ++i) ASSERT_EQ(target.data()[i], 0) << "byte " << i;
  EXPECT_TRUE(target.guards_ok());
  EXPECT_EQ(epsn(c.qb), psn) << "a dropped descriptor moved the responder";

  // The same datagram with the right token lands (the forgery above differed only in its
  // fields), and TVer 1 to a device with one-copy off is malformed there.
  f.send(wire::op::kRcRdmaWriteOnly, c.qb->qpn(), psn, {token, id, 4096, loc.off}, va, rkey);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (epsn(c.qb) == psn && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(std::memcmp(target.data(), secret.data(), 4096), 0);

  Pair q(true, false);
  Conn c2 = connect(q);
  Forger f2(q.a, q.b);
  f2.send(wire::op::kRcRdmaWriteOnly, c2.qb->qpn(), epsn(c2.qb), {token, id, 4096, 0}, va, 1);
  EXPECT_EQ(wait_ctr(q.b, Ctr::kDropMalformed, 1), 1u);
  EXPECT_EQ(q.ctr(q.b, Ctr::kOneCopyRx), 0u);
}

// The peer maps what a shares and unmaps all of it once a's device closes.
TEST(OneCopy, APeersMappingsGoWhenItCloses) {
  Pair p;
  {
    Conn c = connect(p);
    transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  }
  EXPECT_GE(p.b.eng->one_copy()->imports(), 1u);
  p.a.eng->stop();
  p.a.dev->close();
  p.a.eng.reset();
  p.a.dev.reset();
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (p.b.eng->one_copy()->imports() != 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(p.b.eng->one_copy()->imports(), 0u);
}

// A device that closes and another that takes its address: the sender links again (a new
// token) instead of sending descriptors the newcomer cannot resolve.
TEST(OneCopy, ANewDeviceAtAClosedPeersAddressIsLinkedAgain) {
  Pair p;
  const std::string ip = p.b.ip;
  {
    Conn c = connect(p);
    transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  }
  OneCopyLink* first = p.a.eng->one_copy()->link(endpoint_of(p.b));
  ASSERT_NE(first, nullptr);
  const uint64_t old_token = OneCopy::token(first);
  p.b.eng->stop();
  p.b.dev->close();
  p.b.eng.reset();
  p.b.dev.reset();
  p.b = Node::on_udp_first_free({ip.c_str()}, one_copy_config(true));
  ASSERT_TRUE(p.b.eng);
  Conn c = connect(p);
  transfer(p, c, WrOpcode::kRdmaWrite, 65536);
  EXPECT_GE(p.ctr(p.b, Ctr::kOneCopyRx), 16u);
  EXPECT_EQ(p.ctr(p.b, Ctr::kDropOneCopy), 0u);
  OneCopyLink* second = p.a.eng->one_copy()->link(endpoint_of(p.b));
  ASSERT_NE(second, nullptr);
  EXPECT_NE(OneCopy::token(second), old_token);
}

// Names are per user and endpoint (abstract sockets are per network namespace).
TEST(OneCopy, ListenerNameIsPerUserAndEndpoint) {
  const std::string n = OneCopy::name_for(*wire::Endpoint::parse("127.0.0.9", 4791));
  EXPECT_EQ(n, "softrnic-oc/" + std::to_string(::geteuid()) + "/127.0.0.9:4791");
}

}  // namespace
}  // namespace rnic::emu::test
