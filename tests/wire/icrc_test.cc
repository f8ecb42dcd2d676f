// Tests for CRC-32 implementations and the RoCEv2 ICRC: known answers (CRC-32 check value,
// a ConnectX-4 Lx CNP capture, scapy.contrib.roce-computed packets), the socket fast form,
// masked-field invariance and the IP-ID solver.
#include "wire/icrc.h"

#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "wire/byteorder.h"
#include "wire/packet.h"

namespace rnic::wire {
namespace {

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> v;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    v.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return v;
}

const Crc32Impl kImpls[] = {Crc32Impl::kZlib, Crc32Impl::kIsal, Crc32Impl::kSlice8,
                            Crc32Impl::kPclmul, Crc32Impl::kVpclmul};

TEST(Crc32Test, CheckValueAllImpls) {
  const std::string s = "123456789";
  std::span<const uint8_t> d(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  for (Crc32Impl impl : kImpls) {
    if (!crc32_impl_available(impl)) continue;
    EXPECT_EQ(crc32_update(impl, 0, d), 0xcbf43926u) << crc32_impl_name(impl);
    EXPECT_EQ(crc32_update(impl, 0, {}), 0u) << crc32_impl_name(impl);
  }
  EXPECT_EQ(crc32_update(0, d), 0xcbf43926u);
}

TEST(Crc32Test, DefaultIsFastestAvailable) {
  // Benchmark order (tests/bench/icrc_bench): ISA-L >= own VPCLMUL > own PCLMUL > zlib, slice8.
  Crc32Impl d = crc32_default_impl();
  EXPECT_TRUE(crc32_impl_available(d));
  if (crc32_impl_available(Crc32Impl::kIsal)) {
    EXPECT_EQ(d, Crc32Impl::kIsal);
  } else if (crc32_impl_available(Crc32Impl::kVpclmul)) {
    EXPECT_EQ(d, Crc32Impl::kVpclmul);
  } else if (crc32_impl_available(Crc32Impl::kPclmul)) {
    EXPECT_EQ(d, Crc32Impl::kPclmul);
  }
  EXPECT_TRUE(crc32_impl_available(Crc32Impl::kZlib));
  EXPECT_TRUE(crc32_impl_available(Crc32Impl::kSlice8));
}

#if defined(__x86_64__)
// XINUSE (XGETBV with ECX = 1), or nullopt where the CPU cannot report it. Bit 2: the upper
// halves of YMM0-15 are in use; bit 6: the upper halves of ZMM0-15 are.
std::optional<uint64_t> xinuse() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return std::nullopt;
  if (!__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || !(a & (1u << 2))) return std::nullopt;
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (uint64_t{hi} << 32) | lo;
}
#endif

// A CRC leaves no dirty upper vector state behind: legacy-SSE code after it would pay a
// transition penalty on every instruction (ISA-L's AVX-512 CRC returns without VZEROUPPER;
// wire/icrc.cc issues one). 4 KiB takes the widest path of every implementation.
TEST(Crc32Test, NoImplLeavesUpperVectorStateDirty) {
#if defined(__x86_64__)
  if (!xinuse()) GTEST_SKIP() << "the CPU does not report XINUSE (XGETBV 1)";
  std::vector<uint8_t> d(4096, 0x5a);
  int tried = 0;
  for (Crc32Impl impl : kImpls) {
    if (!crc32_impl_available(impl)) continue;
    const uint32_t c = crc32_update(impl, 0, d);
    const uint64_t in_use = *xinuse();
    EXPECT_EQ(in_use & ((1u << 2) | (1u << 6)), 0u)
        << crc32_impl_name(impl) << " XINUSE " << std::hex << in_use << " crc " << c;
    ++tried;
  }
  EXPECT_GE(tried, 2);
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(Crc32Test, ImplsAgreeOnAllLengthsAlignmentsAndChaining) {
  std::mt19937 rng(1);
  std::vector<uint8_t> buf(5000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t len : {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 79, 80, 81, 127,
                     128, 129, 143, 191, 192, 255, 256, 257, 271, 272, 319, 320, 511, 512,
                     513, 1000, 1024, 4096, 5000}) {
    for (size_t align = 0; align < 8; ++align) {
      std::span<const uint8_t> d(buf.data() + align, len);
      uint32_t ref = crc32_update(Crc32Impl::kZlib, 0, d);
      for (Crc32Impl impl : kImpls) {
        if (!crc32_impl_available(impl)) continue;
        EXPECT_EQ(crc32_update(impl, 0, d), ref) << crc32_impl_name(impl) << " len " << len;
        size_t cut = len / 3;
        uint32_t c = crc32_update(impl, 0xdeadbeef, d.first(cut));
        c = crc32_update(impl, c, d.subspan(cut));
        EXPECT_EQ(c, crc32_update(Crc32Impl::kZlib, 0xdeadbeef, d)) << crc32_impl_name(impl);
      }
    }
  }
}

// The CNP frame "RoCE CNP captured on ConnectX-4 Lx" (scapy test/contrib/roce.uts, also the
// one-frame golden pcap), from the IPv4 header on: 20 IP (TOS 0xc2, ID 0x718c, DF) + 8 UDP +
// 12 BTH (BECN, QP 0x118) + 16 reserved + ICRC 82 fd 00 2a on the wire.
const char kCnpIpHex[] =
    "45c2003c718c4000401191610a0011010a001201000012b700280000" "8100ffff40000118"
    "00000000" "00000000000000000000000000000000" "82fd002a";

TEST(IcrcTest, CnpCaptureKnownAnswer) {
  std::vector<uint8_t> ip = from_hex(kCnpIpHex);
  ASSERT_EQ(ip.size(), 60u);
  EXPECT_EQ(icrc_compute(ip), 0x2a00fd82u);  // LE bytes 82 fd 00 2a
  EXPECT_TRUE(icrc_check(ip));
  PacketView v;
  IpUdpMeta m;
  ASSERT_EQ(parse_ip_datagram(ip, &v, &m, true), ParseError::kOk);
  EXPECT_EQ(m.ip_id, 0x718c);
  // The fast form needs the sender's IP ID; with 0 it fails and the solver finds it.
  auto roce = v.roce_span();
  EXPECT_TRUE(icrc_check(m, roce));
  IpUdpMeta zero = m;
  zero.ip_id = 0;
  EXPECT_FALSE(icrc_check(zero, roce));
  auto id = icrc_solve_ip_id(zero, roce);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, 0x718c);
}

// Datagrams built by softrnic whose ICRC was recomputed independently by scapy.contrib.roce
// (BTH.compute_icrc, IPv4 only): /usr/bin/python3, IP(bytes) -> BTH(icrc=None) -> raw().
struct ScapyVector {
  const char* name;
  const char* hex;
  uint32_t icrc;
};
const ScapyVector kScapy[] = {
    {"rc_send_only",
     "45000038000040004011b746c0a8010ac0a80114c12312b7002400000410ffff0000001180000abc68656c6c"
     "6f20726f6365210077b74f8c",
     0x8c4fb777},
    {"rc_write_only_imm",
     "45000050000040004011b72ec0a8010ac0a80114c12312b7003c00000b80ffff00abcdef00fffffe00007f00"
     "12345678deadbeef000000100102030400112233445566778899aabbccddeeff85b2aa95",
     0x95aab285},
    {"ud_send_only_id1234_tos2_ttl3",
     "4502003c123440000311e20cc0a8010ac0a80114c12312b7002800006430ffff000000010000000711111111"
     "0000002200112233440000009d9b214f",
     0x4f219b9d},
};

TEST(IcrcTest, ScapyKnownAnswers) {
  for (const auto& v : kScapy) {
    std::vector<uint8_t> ip = from_hex(v.hex);
    EXPECT_EQ(icrc_compute(ip), v.icrc) << v.name;
    EXPECT_TRUE(icrc_check(ip)) << v.name;
    // Our builder produces exactly these bytes.
    PacketView pv;
    IpUdpMeta m;
    ASSERT_EQ(parse_ip_datagram(ip, &pv, &m, true), ParseError::kOk) << v.name;
    PacketFields f = pv.fields();
    std::vector<uint8_t> out(ip.size() + 16);
    size_t n = build_ip_datagram(out, f, pv.payload_span(), m);
    ASSERT_EQ(n, ip.size());
    EXPECT_EQ(0, std::memcmp(out.data(), ip.data(), n)) << v.name;
  }
}

IpUdpMeta test_meta(bool v6) {
  IpUdpMeta m;
  m.ipv6 = v6;
  for (int i = 0; i < 16; ++i) {
    m.src[i] = static_cast<uint8_t>(0x10 + i);
    m.dst[i] = static_cast<uint8_t>(0xa0 + i);
  }
  m.src_port = 0xc0de;
  m.dst_port = kRoceUdpPort;
  m.tos = 0x48;
  m.ttl = 17;
  m.flow_label = 0xabcde;
  return m;
}

TEST(IcrcTest, FastFormEqualsDatagramForm) {
  // Payload sizes around the fast form's one-pass limit (192 bytes past the BTH: RETH 16 +
  // payload 176) and one far past it.
  for (size_t size : {0, 1, 4, 175, 176, 177, 180, 777}) {
    SCOPED_TRACE(size);
    std::vector<uint8_t> payload(size);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
    for (bool v6 : {false, true}) {
      for (uint16_t id : {0, 1, 0xbeef}) {
        IpUdpMeta m = test_meta(v6);
        m.ip_id = id;
        PacketFields f;
        f.opcode = op::kRcRdmaWriteFirst;
        f.dest_qp = 0x123;
        f.psn = 99;
        f.fecn = true;
        std::vector<uint8_t> buf(2048);
        size_t n = build_ip_datagram(buf, f, payload, m);
        ASSERT_GT(n, 0u);
        std::span<const uint8_t> ip(buf.data(), n);
        size_t hl = (v6 ? kIpv6HdrBytes : kIpv4HdrBytes) + kUdpHdrBytes;
        auto roce = ip.subspan(hl);
        EXPECT_EQ(icrc_compute(ip), icrc_compute(m, roce.first(roce.size() - kIcrcBytes)));
        EXPECT_TRUE(icrc_check(ip));
        EXPECT_TRUE(icrc_check(m, roce));
        // The fast form covers the addresses, ports and (v4) the ID.
        IpUdpMeta other = m;
        other.src_port ^= 1;
        EXPECT_FALSE(icrc_check(other, roce));
        other = m;
        other.dst[3] ^= 0x80;
        EXPECT_FALSE(icrc_check(other, roce));
        if (!v6) {
          other = m;
          other.ip_id ^= 0x100;
          EXPECT_FALSE(icrc_check(other, roce));
          other = m;
          other.df = !m.df;
          EXPECT_FALSE(icrc_check(other, roce));
        }
        // ...but not TOS/TTL/flow label.
        other = m;
        other.tos = 0;
        other.ttl = 1;
        other.flow_label = 0;
        EXPECT_TRUE(icrc_check(other, roce));
      }
    }
  }
}

TEST(IcrcTest, Ipv6MaskedFieldsIgnored) {
  IpUdpMeta m = test_meta(true);
  PacketFields f;
  f.opcode = op::kUdSendOnlyWithImm;
  f.qkey = 0x11111111;
  std::vector<uint8_t> buf(256);
  const uint8_t pl[3] = {1, 2, 3};
  size_t n = build_ip_datagram(buf, f, pl, m);
  ASSERT_EQ(n, 40u + 8 + 24 + 4 + 4);
  std::span<uint8_t> ip(buf.data(), n);
  ASSERT_TRUE(icrc_check(ip));
  ip[0] ^= 0x0f;  // traffic class high nibble
  ip[1] ^= 0xff;  // traffic class low nibble + flow label
  ip[2] ^= 0xff;
  ip[3] ^= 0xff;
  ip[7] ^= 0xff;                // hop limit
  ip[40 + 6] ^= 0xff;           // UDP checksum
  ip[40 + 8 + 4] ^= 0xff;       // BTH byte 4
  EXPECT_TRUE(icrc_check(ip));
  ip[0] ^= 0x10;  // version: covered
  EXPECT_FALSE(icrc_check(ip));
  ip[0] ^= 0x10;
  ip[4] ^= 0x01;  // payload length: covered
  EXPECT_FALSE(icrc_check(ip));
}

TEST(IcrcTest, MalformedDatagramsDoNotVerify) {
  EXPECT_FALSE(icrc_check(std::span<const uint8_t>()));
  std::vector<uint8_t> small(20, 0x45);
  EXPECT_FALSE(icrc_check(small));
  EXPECT_EQ(icrc_compute(small), 0u);
  std::vector<uint8_t> bad_version(100, 0);
  bad_version[0] = 0x55;
  EXPECT_FALSE(icrc_check(bad_version));
  std::vector<uint8_t> bad_ihl(100, 0);
  bad_ihl[0] = 0x4f;  // IHL 60: header + UDP + BTH + ICRC does not fit in 80 bytes
  bad_ihl.resize(80);
  EXPECT_FALSE(icrc_check(bad_ihl));
  uint8_t bth[4] = {};
  EXPECT_FALSE(icrc_check(IpUdpMeta{}, bth));
}

TEST(IcrcTest, SolveIpIdRecoversPeerId) {
  IpUdpMeta m = test_meta(false);
  m.ip_id = 0x5a3c;
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  f.dest_qp = 0x42;
  std::vector<uint8_t> payload(100, 0x33);
  std::vector<uint8_t> roce(256);
  size_t n = build_roce(roce, f, payload, m);
  ASSERT_GT(n, 0u);
  std::span<const uint8_t> r(roce.data(), n);
  IpUdpMeta rx = m;
  rx.ip_id = 0;  // what the receiver assumes
  EXPECT_FALSE(icrc_check(rx, r));
  auto id = icrc_solve_ip_id(rx, r);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, 0x5a3c);
  // ID 0 packets are accepted directly.
  m.ip_id = 0;
  n = build_roce(roce, f, payload, m);
  id = icrc_solve_ip_id(rx, {roce.data(), n});
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, 0);
}

TEST(IcrcTest, SolveIpIdRejectsCorruption) {
  IpUdpMeta m = test_meta(false);
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  std::vector<uint8_t> payload(64, 0x11);
  std::vector<uint8_t> roce(256);
  size_t n = build_roce(roce, f, payload, m);
  int solved = 0;
  // 64 different single-bit corruptions: with 16 unknowns and 32 equations an accidental
  // solution has probability 2^-16 each; these fixed cases have none.
  for (size_t bit = 0; bit < 64; ++bit) {
    std::vector<uint8_t> bad(roce.begin(), roce.begin() + n);
    bad[20 + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    if (icrc_solve_ip_id(m, bad).has_value()) ++solved;
  }
  EXPECT_EQ(solved, 0);
  IpUdpMeta v6 = test_meta(true);
  n = build_roce(roce, f, payload, v6);
  EXPECT_TRUE(icrc_solve_ip_id(v6, {roce.data(), n}).has_value());
  roce[30] ^= 1;
  EXPECT_FALSE(icrc_solve_ip_id(v6, {roce.data(), n}).has_value());
}

// The affine shortcut (one pass, then O(1) per ID) must equal a full recomputation. Lengths
// come back after others (the per-thread basis cache hits), and 4124/4131 and 60/53 share a
// slot of it: a cached basis is reused only for its own length.
TEST(IcrcTest, IdDeltaEqualsRecomputation) {
  std::mt19937 rng(7);
  IpUdpMeta m = test_meta(false);
  for (size_t body : {size_t{12}, size_t{13}, size_t{60}, size_t{53}, size_t{1040}, size_t{4124},
                      size_t{4131}, size_t{9000}, size_t{65000}, size_t{4124}, size_t{4131},
                      size_t{60}, size_t{53}, size_t{12}, size_t{65000}}) {
    std::vector<uint8_t> b(body);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    m.ip_id = 0;
    const uint32_t c0 = icrc_compute(m, b);
    for (int t = 0; t < 20; ++t) {
      const auto id = static_cast<uint16_t>(rng());
      m.ip_id = id;
      EXPECT_EQ(icrc_compute(m, b) ^ c0, icrc_id_delta(body, id)) << body << " " << id;
    }
  }
}

// A packet built with each kind of ID is matched by the kind the policy names.
TEST(IcrcTest, VerifyRxOrderZeroHintSolved) {
  IpUdpMeta m = test_meta(false);
  PacketFields f;
  f.opcode = op::kRcRdmaWriteMiddle;
  std::vector<uint8_t> payload(1024, 0x5c);
  std::vector<uint8_t> roce(1100);
  std::mt19937 rng(3);
  IpUdpMeta rx = m;
  rx.ip_id = 0x1234;  // ignored by icrc_verify_rx
  for (int t = 0; t < 500; ++t) {
    const uint16_t id = t == 0 ? 0 : t == 1 ? 7 : static_cast<uint16_t>(rng());
    m.ip_id = id;
    f.psn = static_cast<uint32_t>(t);
    size_t n = build_roce(roce, f, payload, m);
    std::span<const uint8_t> r(roce.data(), n);
    IcrcVerdict v = icrc_verify_rx(rx, r, uint16_t{7});
    const IcrcMatch want = id == 0 ? IcrcMatch::kIdZero
                           : id == 7 ? IcrcMatch::kIdHint
                                     : IcrcMatch::kIdSolved;
    ASSERT_EQ(v.match, want) << "id " << id;
    EXPECT_EQ(v.ip_id, id);
    // Without solving, only 0 and the hint verify.
    EXPECT_EQ(icrc_verify_rx(rx, r, uint16_t{7}, false).match,
              want == IcrcMatch::kIdSolved ? IcrcMatch::kNone : want);
  }
  EXPECT_STREQ(icrc_match_name(IcrcMatch::kIdSolved), "id_solved");
}

// Random corruption passes the solver with probability ~2^-16 (16 unknowns, 32 equations):
// 20000 packets with random IDs and 4 random bytes corrupted are all refused but for a few.
// (Structured errors are not uniform: for one length a few single-byte errors at one position
// may be accepted every time; docs/wire.md §3. The UDP checksum catches those.)
TEST(IcrcTest, VerifyRxRefusesRandomCorruption) {
  IpUdpMeta m = test_meta(false);
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  std::vector<uint8_t> payload(256, 0x11);
  std::vector<uint8_t> roce(400);
  std::mt19937 rng(11);
  int accepted = 0;
  for (int t = 0; t < 20000; ++t) {
    m.ip_id = static_cast<uint16_t>(rng());
    f.psn = static_cast<uint32_t>(t);
    size_t n = build_roce(roce, f, payload, m);
    for (int k = 0; k < 4; ++k) {
      size_t byte = rng() % n;
      if (byte == 4) byte = 5;  // BTH byte 4 (FECN/BECN, reserved) is masked out of the ICRC
      roce[byte] ^= static_cast<uint8_t>(1u + rng() % 255);
    }
    if (icrc_verify_rx(m, {roce.data(), n}, std::nullopt).match != IcrcMatch::kNone) ++accepted;
  }
  EXPECT_LE(accepted, 3);
  IpUdpMeta v6 = test_meta(true);
  size_t n = build_roce(roce, f, payload, v6);
  EXPECT_EQ(icrc_verify_rx(v6, {roce.data(), n}, uint16_t{5}).match, IcrcMatch::kIdZero);
  roce[40] ^= 4;
  EXPECT_EQ(icrc_verify_rx(v6, {roce.data(), n}, uint16_t{5}).match, IcrcMatch::kNone);
}

TEST(IcrcTest, DefaultImplIsAvailable) {
  EXPECT_TRUE(crc32_impl_available(crc32_default_impl()));
  EXPECT_NE(std::string(crc32_impl_name(crc32_default_impl())), "?");
}

}  // namespace
}  // namespace rnic::wire
