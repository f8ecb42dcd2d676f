// Real-capture proof of the IP-ID/DF reasoning (suite slow, needs root for dumpcap on lo):
// packets built with ICRC over (IP ID 0, DF) are sent through UdpPort 127.0.0.2 -> 127.0.0.3,
// captured on lo, and the ICRC is verified over the IP header the kernel actually wrote.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/pcap.h"
#include "wire/udp_port.h"

namespace rnic::wire {
namespace {

using namespace std::chrono_literals;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

IpUdpMeta meta_for(const Endpoint& src, const Endpoint& dst, uint16_t ip_id) {
  IpUdpMeta m;
  m.ipv6 = src.ipv6;
  std::memcpy(m.src, src.addr, 16);
  std::memcpy(m.dst, dst.addr, 16);
  m.src_port = src.port;
  m.dst_port = dst.port;
  m.ip_id = ip_id;
  m.df = true;
  return m;
}

// Owns the dumpcap child and the temp directory; TearDown kills and removes both even when
// an assertion failed half-way.
class LoopbackCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/softrnic-cap-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    stop_capture(SIGKILL);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts `dumpcap -i lo -f <filter> -P -w file`; returns once dumpcap says it is capturing.
  void start_capture(const std::string& filter) {
    cap_ = dir_ + "/lo.pcap";
    err_ = dir_ + "/dumpcap.err";
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned dumpcap if this test crashes
      int fd = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 2);
        ::dup2(fd, 1);
      }
      ::execlp("dumpcap", "dumpcap", "-i", "lo", "-f", filter.c_str(), "-P", "-w", cap_.c_str(),
               static_cast<char*>(nullptr));
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string e = slurp(err_);
      if (e.find("Capturing on") != std::string::npos) return;
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "dumpcap exited early: " << e;
      }
      std::this_thread::sleep_for(20ms);
    }
    FAIL() << "dumpcap did not start capturing: " << slurp(err_);
  }

  // SIGINT lets dumpcap flush and close the file; returns its exit status.
  int stop_capture(int sig = SIGINT) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  // Every frame in the capture file so far (dumpcap appends as it reads).
  std::vector<PcapFrame> read_frames() {
    std::vector<PcapFrame> v;
    auto rd = PcapReader::open(cap_);
    PcapFrame f;
    while (rd && rd->next(f)) v.push_back(f);
    return v;
  }

  // Sends `probe` from `a` to `dst` until the capture shows a frame (BPF filter attached).
  void probe_until_seen(UdpPort& a, const Endpoint& dst, const std::vector<uint8_t>& probe) {
    for (auto deadline = std::chrono::steady_clock::now() + 20s;;) {
      TxDesc d{dst, probe.data(), uint32_t(probe.size()), 0};
      ASSERT_EQ(a.send_batch(std::span<const TxDesc>(&d, 1)), 1);
      if (!read_frames().empty()) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "capture never saw a probe";
      std::this_thread::sleep_for(50ms);
    }
  }

  // Waits (20 s cap) until pred(frames) holds, then stops the capture; returns the frames.
  template <typename Pred>
  std::vector<PcapFrame> finish_when(Pred pred) {
    for (auto deadline = std::chrono::steady_clock::now() + 20s;
         !pred(read_frames()) && std::chrono::steady_clock::now() < deadline;) {
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_EQ(stop_capture(SIGINT), 0) << slurp(err_);
    return read_frames();
  }

  std::string dir_, cap_, err_;
  pid_t pid_ = -1;
};

// UDP payload of a captured lo frame (Ethernet + IPv4 without options + UDP).
std::span<const uint8_t> udp_payload_of(const PcapFrame& f) {
  const size_t off = kEthHdrLen + kIpv4HdrLen + kUdpHdrLen;
  if (f.data.size() < off) return {};
  return std::span<const uint8_t>(f.data).subspan(off);
}

bool same(std::span<const uint8_t> a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::equal(b.begin(), b.end(), a.begin());
}

std::vector<uint8_t> make_packet(uint8_t opcode, uint32_t qp, uint32_t psn, size_t payload_len,
                                 const IpUdpMeta& meta) {
  PacketFields f;
  f.opcode = opcode;
  f.dest_qp = qp;
  f.psn = psn;
  f.syndrome = 0x1f;
  std::vector<uint8_t> payload(payload_len, uint8_t(psn));
  std::vector<uint8_t> buf(roce_size(opcode, payload_len));
  if (build_roce(buf, f, payload, meta) != buf.size()) buf.clear();
  return buf;
}

TEST_F(LoopbackCaptureTest, KernelWritesIpId0WithDfSoSenderIcrcMatchesTheWire) {
  ASSERT_EQ(::geteuid(), 0u) << "this test captures on lo with dumpcap and needs root "
                                "(CAP_NET_RAW); run the slow suite as root";
  UdpPortOptions oa, ob;
  oa.bind = *Endpoint::parse("127.0.0.2", 0);
  ob.bind = *Endpoint::parse("127.0.0.3", 0);
  int err = 0;
  auto a = UdpPort::open(oa, &err);
  ASSERT_NE(a, nullptr) << strerror(err);
  auto b = UdpPort::open(ob, &err);
  ASSERT_NE(b, nullptr) << strerror(err);

  start_capture("udp and dst host 127.0.0.3 and dst port " + std::to_string(b->local().port));
  if (HasFatalFailure()) return;

  // Probe until the capture demonstrably sees traffic (the BPF filter is attached):
  // dumpcap writes each packet as it arrives, so the file grows past its 24-byte header.
  const IpUdpMeta meta = meta_for(a->local(), b->local(), 0);
  std::vector<uint8_t> probe(roce_size(op::kRcAcknowledge, 0));
  {
    PacketFields f;
    f.opcode = op::kRcAcknowledge;
    f.dest_qp = 0xffff01;  // marks probes
    f.syndrome = 0x1f;
    ASSERT_EQ(build_roce(probe, f, {}, meta), probe.size());
  }
  int probes = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 20s;; ++probes) {
    TxDesc d{b->local(), probe.data(), uint32_t(probe.size()), 0};
    ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&d, 1)), 1);
    struct stat sb{};
    if (::stat(cap_.c_str(), &sb) == 0 && sb.st_size > 24) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "capture never saw a probe";
    std::this_thread::sleep_for(50ms);
  }

  // The packets under test, each with its ICRC computed for IP ID 0 and DF.
  struct Case {
    uint8_t opcode;
    size_t payload;
  };
  const Case cases[] = {{op::kRcSendOnly, 13},          {op::kRcRdmaWriteOnly, 1024},
                        {op::kRcRdmaReadResponseOnly, 4096}, {op::kRcAcknowledge, 0},
                        {op::kUdSendOnly, 100},          {op::kCnp, 0}};
  std::vector<std::vector<uint8_t>> sent;
  std::vector<TxDesc> tx;
  for (size_t i = 0; i < std::size(cases); ++i) {
    PacketFields f;
    f.opcode = cases[i].opcode;
    f.dest_qp = 0x10 + uint32_t(i);
    f.psn = 1000 + uint32_t(i);
    f.va = 0x1000;
    f.rkey = 0x55;
    f.dma_len = uint32_t(cases[i].payload);
    f.syndrome = 0x1f;
    f.qkey = 0x11111111;
    f.src_qp = 1;
    std::vector<uint8_t> payload(cases[i].payload, uint8_t(0xa0 + i));
    std::vector<uint8_t> buf(roce_size(f.opcode, payload.size()));
    ASSERT_EQ(build_roce(buf, f, payload, meta), buf.size()) << int(f.opcode);
    sent.push_back(std::move(buf));
  }
  for (auto& s : sent) tx.push_back(TxDesc{b->local(), s.data(), uint32_t(s.size()), 0});
  ASSERT_EQ(a->send_batch(tx), int(tx.size()));  // one sendmmsg

  // Receiver side: addresses reported, ICRC verifies with the ID-0 policy.
  std::vector<std::vector<uint8_t>> store(64, std::vector<uint8_t>(9000));
  std::vector<RxDesc> rx(64);
  for (size_t i = 0; i < rx.size(); ++i) rx[i] = RxDesc{{}, {}, store[i].data(), 9000, 0, 0, 0, false};
  size_t got_tests = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       got_tests < sent.size() && std::chrono::steady_clock::now() < deadline;) {
    pollfd p{b->wait_fd(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    int n = b->recv_batch(rx);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      const RxDesc& d = rx[size_t(i)];
      EXPECT_EQ(d.src, a->local());
      EXPECT_EQ(d.dst, b->local());
      IpUdpMeta m = meta_for(d.src, d.dst, d.ip_id);
      EXPECT_TRUE(icrc_check(m, std::span<const uint8_t>(d.buf, d.len)));
      if (std::span<const uint8_t>(d.buf, d.len).size() != probe.size() ||
          std::memcmp(d.buf, probe.data(), probe.size()) != 0) {
        ++got_tests;
      }
    }
  }
  EXPECT_EQ(got_tests, sent.size());

  // dumpcap writes packets as it reads them; stop only once every test packet is in the
  // file (a SIGINT earlier would lose what is still in its kernel buffer).
  auto count_matches = [&] {
    size_t m = 0;
    auto rd = PcapReader::open(cap_);
    PcapFrame pf;
    while (rd && rd->next(pf)) {
      const size_t off = kEthHdrLen + kIpv4HdrLen + kUdpHdrLen;
      if (pf.data.size() < off) continue;
      for (auto& s : sent) {
        if (s.size() == pf.data.size() - off && std::equal(s.begin(), s.end(), pf.data.begin() + off)) ++m;
      }
    }
    return m;
  };
  for (auto deadline = std::chrono::steady_clock::now() + 20s;
       count_matches() < sent.size() && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(stop_capture(SIGINT), 0) << slurp(err_);

  // What the kernel actually wrote on lo.
  auto r = PcapReader::open(cap_, &err);
  ASSERT_NE(r, nullptr) << "cannot read " << cap_ << ": " << strerror(err);
  // lo is LINKTYPE_ETHERNET with all-zero MAC addresses.
  EXPECT_EQ(r->linktype(), kLinktypeEthernet);
  PcapFrame fr;
  size_t frames = 0, probe_frames = 0, matched = 0;
  while (r->next(fr)) {
    ++frames;
    ASSERT_GE(fr.data.size(), kEthHdrLen + kIpv4HdrLen + kUdpHdrLen);
    const uint8_t* f = fr.data.data();
    const uint8_t zero_mac[12] = {};
    EXPECT_EQ(std::memcmp(f, zero_mac, 12), 0) << "lo frames carry zero MACs";
    EXPECT_EQ(f[12], 0x08);
    EXPECT_EQ(f[13], 0x00);
    const uint8_t* ip = f + kEthHdrLen;
    std::span<const uint8_t> dgram(ip, fr.data.size() - kEthHdrLen);
    EXPECT_EQ(ip[0], 0x45);
    const uint16_t ip_id = uint16_t(ip[4] << 8 | ip[5]);
    const uint16_t flags = uint16_t(ip[6] << 8 | ip[7]);
    EXPECT_EQ(ip_id, 0) << "frame " << frames << ": kernel wrote IP ID " << ip_id;
    EXPECT_EQ(flags, 0x4000) << "frame " << frames << ": DF set, no fragment offset";
    // The proof: the ICRC the sender computed for (ID 0, DF) matches the real header.
    EXPECT_TRUE(icrc_check(dgram)) << "frame " << frames;
    PacketView pv;
    // parse_ip_datagram insists on port 4791; our ephemeral port is fine for parse_roce.
    std::span<const uint8_t> udp_payload = dgram.subspan(kIpv4HdrLen + kUdpHdrLen);
    ASSERT_EQ(parse_roce(udp_payload, &pv), ParseError::kOk);
    if (udp_payload.size() == probe.size() &&
        std::equal(probe.begin(), probe.end(), udp_payload.begin())) {
      ++probe_frames;
      continue;
    }
    for (auto& s : sent) {
      if (s.size() == udp_payload.size() && std::equal(s.begin(), s.end(), udp_payload.begin())) {
        ++matched;
      }
    }
  }
  EXPECT_EQ(matched, sent.size()) << "every test packet captured exactly once";
  EXPECT_EQ(frames, matched + probe_frames);
  EXPECT_GE(probe_frames, 1u);  // probes sent before the filter attached are not seen
  EXPECT_LE(probe_frames, size_t(probes + 1));
  RecordProperty("frames", int(frames));
}

}  // namespace
}  // namespace rnic::wire

namespace rnic::wire {
namespace {

// Negative control: a socket WITHOUT IP_PMTUDISC_DO. Linux then clears DF and draws the IP ID
// from its ident hash, so an ICRC computed for ID 0 does not match the wire. The ICRC is affine
// in the ID bits: for a peer that computes over its real header, solving for the ID recovers
// the one the kernel wrote — the receive policy for peers that set IDs.
TEST_F(LoopbackCaptureTest, WithoutDfTheKernelIdBreaksTheIcrcAndTheSolverRecoversIt) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root for dumpcap on lo";
  UdpPortOptions ob;
  ob.bind = *Endpoint::parse("127.0.0.3", 0);
  auto b = UdpPort::open(ob);
  ASSERT_NE(b, nullptr);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  int dont = IP_PMTUDISC_DONT;
  ASSERT_EQ(setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &dont, sizeof(dont)), 0);
  Endpoint src = *Endpoint::parse("127.0.0.2", 0);
  sockaddr_storage ss;
  socklen_t sl = src.to_sockaddr(&ss);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&ss), sl), 0);
  sl = sizeof(ss);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl), 0);
  ASSERT_TRUE(src.from_sockaddr(reinterpret_cast<sockaddr*>(&ss), sl));

  // A DF UdpPort on another source port arms the capture.
  UdpPortOptions oa;
  oa.bind = *Endpoint::parse("127.0.0.2", 0);
  auto a = UdpPort::open(oa);
  ASSERT_NE(a, nullptr);
  start_capture("udp and dst host 127.0.0.3 and dst port " + std::to_string(b->local().port));
  if (HasFatalFailure()) return;
  probe_until_seen(*a, b->local(), make_packet(op::kRcAcknowledge, 0xffff01, 0, 0,
                                               meta_for(a->local(), b->local(), 0)));
  if (HasFatalFailure()) return;

  // The sender knows DF will be clear but cannot know the ID: it computes with (ID 0, no DF).
  IpUdpMeta meta = meta_for(src, b->local(), 0);
  meta.df = false;
  std::vector<std::vector<uint8_t>> pkts;
  for (uint32_t i = 0; i < 4; ++i) pkts.push_back(make_packet(op::kRcSendOnly, 0x20, i, 40 + i, meta));
  sl = b->local().to_sockaddr(&ss);
  for (auto& p : pkts) {
    ASSERT_EQ(::sendto(fd, p.data(), p.size(), 0, reinterpret_cast<sockaddr*>(&ss), sl), ssize_t(p.size()));
  }
  auto count = [&](const std::vector<PcapFrame>& fr) {
    size_t n = 0;
    for (auto& f : fr)
      for (auto& p : pkts) n += same(udp_payload_of(f), p);
    return n;
  };
  auto frames = finish_when([&](const std::vector<PcapFrame>& fr) { return count(fr) == pkts.size(); });
  ASSERT_EQ(count(frames), pkts.size());
  size_t nonzero_ids = 0;
  for (auto& f : frames) {
    auto pl = udp_payload_of(f);
    bool ours = false;
    for (auto& p : pkts) ours |= same(pl, p);
    if (!ours) continue;
    const uint8_t* ip = f.data.data() + kEthHdrLen;
    const uint16_t id = uint16_t(ip[4] << 8 | ip[5]);
    const uint16_t flags = uint16_t(ip[6] << 8 | ip[7]);
    EXPECT_EQ(flags & 0x4000, 0) << "DF clear without IP_PMTUDISC_DO";
    nonzero_ids += id != 0;
    // The ICRC built for ID 0 verifies over the real header only if the kernel chose ID 0 ...
    EXPECT_EQ(icrc_check(std::span<const uint8_t>(f.data).subspan(kEthHdrLen)), id == 0);
    // A peer that knows its ID (hardware computes over the real header) would have sent the
    // ICRC of this very header: rebuild that packet and check that the receive-side solver,
    // starting from the ID-0 assumption, recovers the ID the kernel wrote.
    std::vector<uint8_t> dgram(f.data.begin() + kEthHdrLen, f.data.end());
    const uint32_t real = icrc_compute(dgram);
    std::memcpy(dgram.data() + dgram.size() - 4, &real, 4);  // little-endian value = wire bytes
    ASSERT_TRUE(icrc_check(dgram));
    std::span<const uint8_t> fixed = std::span<const uint8_t>(dgram).subspan(kIpv4HdrLen + kUdpHdrLen);
    EXPECT_EQ(icrc_check(meta, fixed), id == 0);
    auto solved = icrc_solve_ip_id(meta, fixed);
    ASSERT_TRUE(solved.has_value());
    EXPECT_EQ(*solved, id);
  }
  EXPECT_GE(nonzero_ids, 1u) << "Linux assigns non-zero IDs to non-DF datagrams";
}

// UDP GSO on lo: one sendmsg carrying three equal RoCE packets whose ICRCs were computed with
// IP ID k for segment k. lo does not cut the super-packet (the capture shows one datagram of
// the summed length, ID 0); the receiving socket (no UDP_GRO) gets three datagrams that the
// kernel segmented with IDs 0, 1, 2 — each verifies with its own ID, and only segment 0 with
// the default ID-0 policy, so a receiver of GSO traffic must solve for the ID.
TEST_F(LoopbackCaptureTest, GsoSegmentsAreNumberedByTheKernel) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root for dumpcap on lo";
  UdpPortOptions oa, ob;
  oa.bind = *Endpoint::parse("127.0.0.2", 0);
  ob.bind = *Endpoint::parse("127.0.0.3", 0);
  auto a = UdpPort::open(oa);
  auto b = UdpPort::open(ob);
  ASSERT_TRUE(a && b);
  if (!a->gso_supported()) GTEST_SKIP() << "kernel lacks UDP_SEGMENT";
  start_capture("udp and dst host 127.0.0.3 and dst port " + std::to_string(b->local().port));
  if (HasFatalFailure()) return;
  const auto probe = make_packet(op::kRcAcknowledge, 0xffff01, 0, 0, meta_for(a->local(), b->local(), 0));
  probe_until_seen(*a, b->local(), probe);
  if (HasFatalFailure()) return;

  std::vector<uint8_t> super;
  size_t seg = 0;
  for (uint16_t k = 0; k < 3; ++k) {
    auto p = make_packet(op::kRcSendMiddle, 0x30, 500 + k, 1024, meta_for(a->local(), b->local(), k));
    seg = p.size();
    super.insert(super.end(), p.begin(), p.end());
  }
  TxDesc d{b->local(), super.data(), uint32_t(super.size()), uint16_t(seg)};
  ASSERT_EQ(a->send_batch(std::span<const TxDesc>(&d, 1)), 1);

  // Receiver: three datagrams, segment k verifies with ID k.
  std::vector<std::vector<uint8_t>> store(8, std::vector<uint8_t>(9000));
  std::vector<RxDesc> rx(8);
  for (size_t i = 0; i < rx.size(); ++i) rx[i] = RxDesc{{}, {}, store[i].data(), 9000, 0, 0, 0, false};
  std::vector<std::vector<uint8_t>> segs;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       segs.size() < 3 && std::chrono::steady_clock::now() < deadline;) {
    pollfd p{b->wait_fd(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    int n = b->recv_batch(rx);
    for (int i = 0; i < n; ++i) {
      std::span<const uint8_t> pl(rx[size_t(i)].buf, rx[size_t(i)].len);
      if (!same(pl, probe)) segs.emplace_back(pl.begin(), pl.end());
    }
  }
  ASSERT_EQ(segs.size(), 3u);
  for (uint16_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(icrc_check(meta_for(a->local(), b->local(), k), segs[k])) << "segment " << k;
    EXPECT_EQ(icrc_check(meta_for(a->local(), b->local(), 0), segs[k]), k == 0);
    auto solved = icrc_solve_ip_id(meta_for(a->local(), b->local(), 0), segs[k]);
    ASSERT_TRUE(solved.has_value());
    EXPECT_EQ(*solved, k);
  }

  // Capture: lo keeps the super-packet whole (one datagram, ID 0, DF) — or, on a kernel that
  // segments on lo, three datagrams with IDs 0..2 whose ICRCs verify over the real headers.
  auto is_ours = [&](const PcapFrame& f) {
    auto pl = udp_payload_of(f);
    return !pl.empty() && !same(pl, probe);
  };
  auto frames = finish_when([&](const std::vector<PcapFrame>& fr) {
    size_t bytes = 0;
    for (auto& f : fr)
      if (is_ours(f)) bytes += udp_payload_of(f).size();
    return bytes >= super.size();
  });
  std::vector<const PcapFrame*> ours;
  for (auto& f : frames)
    if (is_ours(f)) ours.push_back(&f);
  ASSERT_FALSE(ours.empty());
  if (ours.size() == 1) {
    EXPECT_TRUE(same(udp_payload_of(*ours[0]), super)) << "one unsegmented GSO datagram on lo";
    const uint8_t* ip = ours[0]->data.data() + kEthHdrLen;
    EXPECT_EQ(uint16_t(ip[4] << 8 | ip[5]), 0);
    RecordProperty("lo_gso", "super-packet not segmented on lo");
  } else {
    ASSERT_EQ(ours.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(icrc_check(std::span<const uint8_t>(ours[k]->data).subspan(kEthHdrLen)));
    }
    RecordProperty("lo_gso", "segmented on lo");
  }
}

}  // namespace
}  // namespace rnic::wire
