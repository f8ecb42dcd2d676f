// Tests for wire/udp_port over real loopback sockets (suite slow): batched exchange,
// reported source/destination addresses, non-blocking receive, wait_fd, GSO/GRO, IPv6.
#include "wire/udp_port.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace rnic::wire {
namespace {

Endpoint ep(const char* ip, uint16_t port) { return *Endpoint::parse(ip, port); }

std::unique_ptr<UdpPort> open_port(const char* ip, bool gro = false) {
  UdpPortOptions o;
  o.bind = ep(ip, 0);
  o.gro = gro;
  int err = 0;
  auto p = UdpPort::open(o, &err);
  EXPECT_NE(p, nullptr) << "bind " << ip << ": " << strerror(err);
  return p;
}

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

struct RxBufs {
  explicit RxBufs(size_t n, uint32_t cap = 2048) : store(n, std::vector<uint8_t>(cap)), descs(n) {
    for (size_t i = 0; i < n; ++i) descs[i] = RxDesc{{}, {}, store[i].data(), cap, 0, 0, 0, false};
  }
  std::vector<std::vector<uint8_t>> store;
  std::vector<RxDesc> descs;
};

// Receives until `want` datagrams arrived (waiting on wait_fd, 5 s cap per wait).
std::vector<RxDesc> recv_n(UdpPort& p, RxBufs& rx, size_t want, std::vector<std::vector<uint8_t>>* data) {
  std::vector<RxDesc> out;
  while (out.size() < want) {
    if (!readable(p.wait_fd(), 5000)) break;
    int n = p.recv_batch(rx.descs);
    EXPECT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      out.push_back(rx.descs[size_t(i)]);
      data->emplace_back(rx.descs[size_t(i)].buf, rx.descs[size_t(i)].buf + rx.descs[size_t(i)].len);
    }
  }
  return out;
}

TEST(UdpPortTest, BindsEphemeralAndReportsLocal) {
  auto a = open_port("127.0.0.2");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->local().ip_string(), "127.0.0.2");
  EXPECT_NE(a->local().port, 0);
  EXPECT_GE(a->wait_fd(), 0);
  EXPECT_GT(a->rcvbuf(), 0);
}

TEST(UdpPortTest, EmptyRecvReturnsZeroWithoutBlocking) {
  auto a = open_port("127.0.0.2");
  ASSERT_NE(a, nullptr);
  RxBufs rx(8);
  EXPECT_EQ(a->recv_batch(rx.descs), 0);
  EXPECT_FALSE(readable(a->wait_fd(), 0));
}

TEST(UdpPortTest, BatchesBothWaysWithAddresses) {
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3");
  ASSERT_TRUE(a && b);
  constexpr int kN = 100;  // > kBatch, so send and receive both chunk
  std::vector<std::vector<uint8_t>> pkts;
  for (int i = 0; i < kN; ++i) pkts.push_back(std::vector<uint8_t>(size_t(28 + i), uint8_t(i)));
  for (auto [from, to] : {std::pair{a.get(), b.get()}, std::pair{b.get(), a.get()}}) {
    std::vector<TxDesc> tx;
    for (auto& p : pkts) tx.push_back(TxDesc{to->local(), p.data(), uint32_t(p.size()), 0});
    ASSERT_EQ(from->send_batch(tx), kN);
    EXPECT_TRUE(readable(to->wait_fd(), 5000));
    RxBufs rx(16);
    std::vector<std::vector<uint8_t>> got;
    auto descs = recv_n(*to, rx, kN, &got);
    ASSERT_EQ(descs.size(), size_t(kN));
    for (const RxDesc& d : descs) {
      EXPECT_EQ(d.src, from->local());
      EXPECT_EQ(d.dst, to->local());
      EXPECT_FALSE(d.truncated);
      EXPECT_EQ(d.seg_size, 0);
    }
    EXPECT_EQ(got, pkts);  // loopback keeps order
    EXPECT_EQ(to->recv_batch(rx.descs), 0);
    EXPECT_FALSE(readable(to->wait_fd(), 0));
    EXPECT_EQ(from->counters().tx_packets, uint64_t(kN));
    EXPECT_EQ(to->counters().rx_packets, uint64_t(kN));
  }
}

TEST(UdpPortTest, WildcardBindReportsRealDestinationViaPktinfo) {
  auto any = open_port("0.0.0.0");
  auto a = open_port("127.0.0.2");
  ASSERT_TRUE(any && a);
  uint8_t p[16] = {9};
  TxDesc tx[2] = {{ep("127.0.0.5", any->local().port), p, 16, 0},
                  {ep("127.0.0.7", any->local().port), p, 16, 0}};
  ASSERT_EQ(a->send_batch(tx), 2);
  RxBufs rx(4);
  std::vector<std::vector<uint8_t>> got;
  auto d = recv_n(*any, rx, 2, &got);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].dst.ip_string(), "127.0.0.5");
  EXPECT_EQ(d[1].dst.ip_string(), "127.0.0.7");
  EXPECT_EQ(d[0].dst.port, any->local().port);
  EXPECT_EQ(d[0].src, a->local());
}

// Datagrams the kernel dropped at a full receive buffer are counted (SO_MEMINFO, read when
// the counters are asked for): every datagram sent is either received or counted dropped.
TEST(UdpPortTest, FullReceiveBufferDropsAreCounted) {
  UdpPortOptions o;
  o.bind = ep("127.0.0.3", 0);
  o.gro = false;
  o.rcvbuf = 4096;  // the kernel doubles it and keeps a floor: a few datagrams fit
  int err = 0;
  auto b = UdpPort::open(o, &err);
  auto a = open_port("127.0.0.2");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->counters().rx_dropped, 0u);
  constexpr int kN = 200;
  std::vector<uint8_t> p(1000, 3);
  for (int i = 0; i < kN; ++i) {
    TxDesc tx{b->local(), p.data(), uint32_t(p.size()), 0};
    ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  }
  // Loopback delivers in the sender's softirq, which a loaded machine may defer to
  // ksoftirqd: receive until every datagram is accounted for (2 s at most).
  RxBufs rx(16);
  size_t got = 0;
  uint64_t dropped = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  do {
    for (int n; (n = b->recv_batch(rx.descs)) > 0;) got += size_t(n);
    dropped = b->counters().rx_dropped;
  } while (got + dropped < uint64_t(kN) && std::chrono::steady_clock::now() < end);
  EXPECT_GT(dropped, 0u);
  EXPECT_GT(got, 0u);
  EXPECT_EQ(got + dropped, uint64_t(kN));
}

// The kernel's receive-queue fill (SO_MEMINFO rmem_alloc against rcvbuf): 0 when empty,
// growing with the datagrams queued, 0 again once they are read.
TEST(UdpPortTest, FillReportsTheReceiveQueue) {
  UdpPortOptions o;
  o.bind = ep("127.0.0.3", 0);
  o.gro = false;
  o.rcvbuf = 64 << 10;  // the kernel doubles it: 128 KiB
  int err = 0;
  auto b = UdpPort::open(o, &err);
  auto a = open_port("127.0.0.2");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->rx_fill_pct(), 0);
  constexpr int kN = 20;
  std::vector<uint8_t> p(1000, 3);
  for (int i = 0; i < kN; ++i) {
    TxDesc tx{b->local(), p.data(), uint32_t(p.size()), 0};
    ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  }
  ASSERT_TRUE(readable(b->wait_fd(), 2000));
  // 20 datagrams of ~2 KiB truesize each in 128 KiB; all queued once the sender's softirq ran.
  int fill = 0;
  for (int i = 0; i < 200 && (fill = b->rx_fill_pct()) < 20; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(fill, 20);
  EXPECT_LE(fill, 100);
  RxBufs rx(32);
  std::vector<std::vector<uint8_t>> data;
  EXPECT_EQ(recv_n(*b, rx, kN, &data).size(), size_t(kN));
  EXPECT_EQ(b->rx_fill_pct(), 0);
}

TEST(UdpPortTest, TruncationReported) {
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3");
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> p(500, 1);
  TxDesc tx{b->local(), p.data(), 500, 0};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  RxBufs rx(1, 100);
  std::vector<std::vector<uint8_t>> got;
  auto d = recv_n(*b, rx, 1, &got);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].truncated);
  EXPECT_EQ(d[0].len, 100u);
  EXPECT_EQ(b->counters().rx_truncated, 1u);
}

TEST(UdpPortTest, ConcurrentSendersAllArrive) {
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3");
  ASSERT_TRUE(a && b);
  constexpr int kThreads = 4, kPer = 256;  // 1024 small datagrams: well within rcvbuf
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < kPer; i += 8) {
        uint32_t v[8][2];
        TxDesc d[8];
        for (int k = 0; k < 8; ++k) {
          v[k][0] = uint32_t(t);
          v[k][1] = uint32_t(i + k);
          d[k] = TxDesc{b->local(), reinterpret_cast<uint8_t*>(v[k]), 8, 0};
        }
        EXPECT_EQ(a->send_batch(d), 8);
      }
    });
  }
  for (auto& x : th) x.join();
  RxBufs rx(64);
  std::vector<std::vector<uint8_t>> got;
  auto d = recv_n(*b, rx, kThreads * kPer, &got);
  ASSERT_EQ(d.size(), size_t(kThreads * kPer));
  std::vector<int> next(kThreads, 0);
  for (auto& g : got) {
    uint32_t v[2];
    std::memcpy(v, g.data(), 8);
    EXPECT_EQ(int(v[1]), next[v[0]]++);  // per-thread order kept
  }
}

TEST(UdpPortTest, GsoSendArrivesAsSeparateDatagrams) {
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3");  // no GRO: the kernel splits a GSO super-packet
  ASSERT_TRUE(a && b);
  if (!a->gso_supported()) GTEST_SKIP() << "kernel lacks UDP_SEGMENT";
  EXPECT_EQ(a->max_gso_segments(), UdpPort::kMaxGsoSegments);
  std::vector<uint8_t> p(250);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(i);
  TxDesc tx{b->local(), p.data(), 250, 100};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  RxBufs rx(8);
  std::vector<std::vector<uint8_t>> got;
  auto d = recv_n(*b, rx, 3, &got);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(got[0], std::vector<uint8_t>(p.begin(), p.begin() + 100));
  EXPECT_EQ(got[1], std::vector<uint8_t>(p.begin() + 100, p.begin() + 200));
  EXPECT_EQ(got[2], std::vector<uint8_t>(p.begin() + 200, p.end()));
  EXPECT_EQ(a->counters().tx_packets, 3u);
}

TEST(UdpPortTest, GroReceiverSplitsBySegmentSize) {
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3", /*gro=*/true);
  ASSERT_TRUE(a && b);
  if (!a->gso_supported() || !b->gro_enabled()) GTEST_SKIP() << "no UDP_SEGMENT / UDP_GRO";
  std::vector<uint8_t> p(4 * 1000 + 10);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(i * 7);
  TxDesc tx{b->local(), p.data(), uint32_t(p.size()), 1000};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  RxBufs rx(8, 65535);
  std::vector<std::vector<uint8_t>> segs;
  while (segs.size() < 5 && readable(b->wait_fd(), 5000)) {
    int n = b->recv_batch(rx.descs);
    for (int i = 0; i < n; ++i) {
      for_each_segment(rx.descs[size_t(i)], [&](std::span<uint8_t> s, uint32_t) {
        segs.emplace_back(s.begin(), s.end());
      });
    }
  }
  ASSERT_EQ(segs.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    size_t off = k * 1000, len = k < 4 ? 1000 : 10;
    EXPECT_EQ(segs[k], std::vector<uint8_t>(p.begin() + long(off), p.begin() + long(off + len)));
  }
  EXPECT_EQ(b->counters().rx_packets, 5u);
}

// A port on [::1]:ephemeral; nullptr (and v6_missing set) where the host has no IPv6 loopback.
bool v6_missing = false;
std::unique_ptr<UdpPort> open_v6() {
  UdpPortOptions o;
  o.bind = ep("::1", 0);
  int err = 0;
  auto p = UdpPort::open(o, &err);
  if (p == nullptr) v6_missing = err == EADDRNOTAVAIL || err == EAFNOSUPPORT;
  return p;
}

TEST(UdpPortTest, Ipv6Loopback) {
  auto a = open_v6(), b = open_v6();
  if (a == nullptr && v6_missing) GTEST_SKIP() << "no ::1";
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a->local().ipv6);
  EXPECT_EQ(a->local().to_string().substr(0, 6), "[::1]:");
  uint8_t p[40] = {6};
  TxDesc tx{b->local(), p, 40, 0};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  ASSERT_TRUE(readable(b->wait_fd(), 5000));
  RxBufs rx(2);
  ASSERT_EQ(b->recv_batch(rx.descs), 1);
  EXPECT_EQ(rx.descs[0].src, a->local());
  EXPECT_EQ(rx.descs[0].dst, b->local());
  EXPECT_EQ(rx.descs[0].len, 40u);
}

// The IPv6 header carries the GRH's traffic class, flow label and hop limit (TxDesc::dst), and
// the receiver reports them (the UD GRH image needs them); label 0 stays 0 (no kernel hash).
TEST(UdpPortTest, Ipv6HeaderFieldsFromTheDestinationAreSentAndReported) {
  auto a = open_v6(), b = open_v6();
  if (a == nullptr && v6_missing) GTEST_SKIP() << "no ::1";
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  uint8_t p[40] = {6};
  Endpoint d1 = b->local(), d2 = b->local();
  d1.tclass = 0x68;  // DSCP 26, ECN 0
  d1.flow_label = 0xabcde;
  d1.hop_limit = 7;
  TxDesc tx[2] = {{d1, p, 40, 0}, {d2, p, 40, 0}};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(tx, 2)), 2);
  RxBufs rx(4);
  std::vector<std::vector<uint8_t>> data;
  auto got = recv_n(*b, rx, 2, &data);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].tos, 0x68);
  EXPECT_EQ(got[0].flow_label, 0xabcdeu);
  EXPECT_EQ(got[0].hop_limit, 7);
  EXPECT_EQ(got[1].tos, 0);
  EXPECT_EQ(got[1].flow_label, 0u);
  EXPECT_EQ(got[1].hop_limit, 64);  // the kernel's default for ::1
}

// Several local addresses, one socket each: a datagram leaves from the one dst.src_index names
// (its source address), the receiver reports which socket got it, and wait_fd covers all.
TEST(UdpPortTest, SeveralAddressesOneSocketEachSourceChosenBySrcIndex) {
  UdpPortOptions o;
  o.bind = ep("127.0.0.1", 0);
  o.more = {ep("::1", 0)};
  int err = 0;
  auto a = UdpPort::open(o, &err);
  if (a == nullptr && (err == EADDRNOTAVAIL || err == EAFNOSUPPORT)) GTEST_SKIP() << "no ::1";
  ASSERT_NE(a, nullptr) << strerror(err);
  ASSERT_EQ(a->sockets(), 2u);
  EXPECT_EQ(a->local(1).port, a->local(0).port);  // one UDP port for every address
  EXPECT_TRUE(a->local(1).ipv6);
  UdpPortOptions ob;
  ob.bind = ep("127.0.0.1", 0);
  ob.more = {ep("::1", 0)};
  auto b = UdpPort::open(ob, &err);
  ASSERT_NE(b, nullptr);
  uint8_t p[40] = {6};
  Endpoint to4 = b->local(0), to6 = b->local(1);
  to6.src_index = 1;
  EXPECT_TRUE(a->local_for(to6).ipv6);
  EXPECT_FALSE(a->local_for(to4).ipv6);
  TxDesc tx[2] = {{to6, p, 40, 0}, {to4, p, 40, 0}};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(tx, 2)), 2);
  RxBufs rx(4);
  std::vector<std::vector<uint8_t>> data;
  auto got = recv_n(*b, rx, 2, &data);
  ASSERT_EQ(got.size(), 2u);
  int v6 = 0;
  for (const RxDesc& d : got) {
    EXPECT_EQ(d.src.ipv6, d.dst.ipv6);
    EXPECT_EQ(d.dst.src_index, d.dst.ipv6 ? 1 : 0);
    EXPECT_TRUE(d.src.same_ip(a->local(d.dst.ipv6 ? 1 : 0)));
    v6 += d.src.ipv6;
  }
  EXPECT_EQ(v6, 1);
}

// Counts and optionally drops packets whose first byte is 0xDD.
class CountingFilter : public PacketFilter {
 public:
  std::atomic<int> tx{0}, rx{0};
  Verdict on_packet(Direction dir, const Endpoint&, const Endpoint&, std::span<uint8_t> roce,
                    FilterOut&) override {
    (dir == Direction::kTx ? tx : rx)++;
    return !roce.empty() && roce[0] == 0xDD ? Verdict::kDrop : Verdict::kPass;
  }
};

TEST(UdpPortTest, FilterSeesEachGroSegmentAndDropsOne) {
  if (!kFaultInjection) GTEST_SKIP() << "fault_injection=false";
  auto a = open_port("127.0.0.2");
  auto b = open_port("127.0.0.3", /*gro=*/true);
  ASSERT_TRUE(a && b);
  if (!a->gso_supported()) GTEST_SKIP() << "kernel lacks UDP_SEGMENT";
  CountingFilter f;
  ASSERT_TRUE(b->set_filter(&f));
  // Four 100-byte segments in one GSO send; segment 2 is marked for dropping.
  std::vector<uint8_t> p(400);
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(i / 100);
  p[200] = 0xDD;
  TxDesc tx{b->local(), p.data(), 400, 100};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&tx, 1)), 1);
  ASSERT_TRUE(readable(b->wait_fd(), 5000));
  RxBufs rx(8, 65535);
  std::vector<uint8_t> firsts;
  // Coalesced segments beyond the first are held and come out of later calls (held packets
  // do not make wait_fd readable, so poll the port while it holds something).
  for (int spins = 0; spins < 1000 && firsts.size() < 3; ++spins) {
    int n = b->recv_batch(rx.descs);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(rx.descs[size_t(i)].seg_size, 0);  // split: one datagram per descriptor
      EXPECT_EQ(rx.descs[size_t(i)].len, 100u);
      firsts.push_back(rx.descs[size_t(i)].buf[0]);
    }
    if (n == 0 && b->held_count() == 0) readable(b->wait_fd(), 100);
  }
  EXPECT_EQ(firsts, (std::vector<uint8_t>{0, 1, 3}));
  EXPECT_EQ(f.rx.load(), 4);
  EXPECT_EQ(b->counters().filter_dropped, 1u);
  b->set_filter(nullptr);
}

TEST(EndpointTest, ParseFormatAndSockaddrRoundTrip) {
  auto e = Endpoint::parse("127.0.0.2", 4791);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->v4_host(), 0x7f000002u);
  EXPECT_EQ(*e, Endpoint::v4(0x7f000002, 4791));
  EXPECT_EQ(e->to_string(), "127.0.0.2:4791");
  sockaddr_storage ss;
  socklen_t l = e->to_sockaddr(&ss);
  Endpoint back;
  ASSERT_TRUE(back.from_sockaddr(reinterpret_cast<sockaddr*>(&ss), l));
  EXPECT_EQ(back, *e);
  auto m = Endpoint::parse("::ffff:10.1.2.3", 7);
  ASSERT_TRUE(m);
  l = m->to_sockaddr(&ss);
  ASSERT_TRUE(back.from_sockaddr(reinterpret_cast<sockaddr*>(&ss), l));
  EXPECT_FALSE(back.ipv6);  // v4-mapped folds to IPv4
  EXPECT_EQ(back.ip_string(), "10.1.2.3");
  EXPECT_FALSE(Endpoint::parse("300.1.1.1", 1));
  EXPECT_FALSE(Endpoint::parse("", 1));
}

}  // namespace
}  // namespace rnic::wire
