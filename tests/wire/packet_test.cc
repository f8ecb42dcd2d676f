// Tests for packet build/parse: every opcode round-trips (RoCE, IPv4, IPv6, Ethernet), and one
// named test per malformed kind, each checking its ParseError and that the outputs are untouched.
#include "wire/packet.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "wire/byteorder.h"

namespace rnic::wire {
namespace {

IpUdpMeta v4_meta() {
  IpUdpMeta m;
  const uint8_t s[4] = {10, 0, 0, 1}, d[4] = {10, 0, 0, 2};
  std::memcpy(m.src, s, 4);
  std::memcpy(m.dst, d, 4);
  m.src_port = 0xc001;
  m.tos = 0x02;
  m.ttl = 64;
  return m;
}

IpUdpMeta v6_meta() {
  IpUdpMeta m;
  m.ipv6 = true;
  for (int i = 0; i < 16; ++i) {
    m.src[i] = static_cast<uint8_t>(0x20 + i);
    m.dst[i] = static_cast<uint8_t>(0x40 + i);
  }
  m.df = false;
  m.src_port = 0xd00d;
  m.tos = 0x88;
  m.ttl = 9;
  m.flow_label = 0x12345;
  return m;
}

// Random values for every field; build zeroes fields of absent headers, so clear them here.
PacketFields random_fields(uint8_t opcode, std::mt19937_64& rng) {
  PacketFields f;
  f.opcode = opcode;
  f.se = rng() & 1;
  f.mig = rng() & 1;
  f.pkey = static_cast<uint16_t>(rng());
  f.fecn = rng() & 1;
  f.becn = rng() & 1;
  f.dest_qp = rng() & 0xffffff;
  f.ack_req = rng() & 1;
  f.psn = rng() & 0xffffff;
  const uint32_t mask = opcode_info(opcode).mask;
  if (mask & (kRethMask | kAtmEthMask)) {
    f.va = rng();
    f.rkey = static_cast<uint32_t>(rng());
  }
  if (mask & kRethMask) f.dma_len = static_cast<uint32_t>(rng());
  if (mask & kAtmEthMask) {
    f.swap_add = rng();
    f.compare = rng();
  }
  if (mask & kAethMask) {
    f.syndrome = static_cast<uint8_t>(rng());
    f.msn = rng() & 0xffffff;
  }
  if (mask & kAtmAckMask) f.orig = rng();
  if (mask & kDethMask) {
    f.qkey = static_cast<uint32_t>(rng());
    f.src_qp = rng() & 0xffffff;
  }
  if (mask & kImmMask) f.imm = static_cast<uint32_t>(rng());
  if (mask & kIethMask) f.inv_rkey = static_cast<uint32_t>(rng());
  if (mask & kFethMask) {
    f.flush_sel = rng() & 3;
    f.flush_plt = rng() & 0xf;
  }
  if (mask & kXrcEthMask) f.xrc_srqn = rng() & 0xffffff;
  return f;
}

std::vector<size_t> payload_lengths(uint8_t opcode) {
  const uint32_t mask = opcode_info(opcode).mask;
  if (!(mask & kPayloadMask)) return {0};
  if (mask & kAtomicWriteMask) return {8};
  return {0, 1, 2, 3, 4, 5, 6, 7, 256, 1023, 4096};
}

std::vector<uint8_t> make_payload(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> p(n);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

std::vector<uint8_t> valid_opcodes() {
  std::vector<uint8_t> v;
  for (int i = 0; i < 256; ++i) {
    if (opcode_valid(static_cast<uint8_t>(i))) v.push_back(static_cast<uint8_t>(i));
  }
  return v;
}

void expect_meta_eq(const IpUdpMeta& a, const IpUdpMeta& b) {
  EXPECT_EQ(a.ipv6, b.ipv6);
  EXPECT_EQ(0, std::memcmp(a.src, b.src, a.ipv6 ? 16 : 4));
  EXPECT_EQ(0, std::memcmp(a.dst, b.dst, a.ipv6 ? 16 : 4));
  EXPECT_EQ(a.src_port, b.src_port);
  EXPECT_EQ(a.dst_port, b.dst_port);
  EXPECT_EQ(a.tos, b.tos);
  EXPECT_EQ(a.ttl, b.ttl);
  if (a.ipv6) {
    EXPECT_EQ(a.flow_label, b.flow_label);
  } else {
    EXPECT_EQ(a.ip_id, b.ip_id);
    EXPECT_EQ(a.df, b.df);
  }
}

TEST(PacketTest, EveryOpcodeRoundTripsRoce) {
  std::mt19937_64 rng(42);
  auto ops = valid_opcodes();
  ASSERT_EQ(ops.size(), 63u);  // 40 RC/UC/UD/CNP rows + 23 XRC rows
  IpUdpMeta m = v4_meta();
  for (uint8_t opc : ops) {
    for (size_t len : payload_lengths(opc)) {
      SCOPED_TRACE(std::string(opcode_info(opc).name) + " len " + std::to_string(len));
      PacketFields f = random_fields(opc, rng);
      auto payload = make_payload(len, rng);
      std::vector<uint8_t> buf(len + 128);
      size_t n = build_roce(buf, f, payload, m);
      ASSERT_EQ(n, roce_size(opc, len));
      ASSERT_EQ(n % 4, 0u);
      PacketView v;
      ASSERT_EQ(parse_roce({buf.data(), n}, &v), ParseError::kOk);
      EXPECT_EQ(v.opcode, opc);
      EXPECT_EQ(v.info, &opcode_info(opc));
      EXPECT_EQ(v.hdr, buf.data());
      EXPECT_EQ(v.hdr_len, opcode_info(opc).length);
      EXPECT_EQ(v.payload_len, len);
      EXPECT_EQ(v.pad, (4 - len % 4) % 4);
      EXPECT_EQ(v.roce_len, n);
      f.pad_cnt = v.pad;
      f.payload = payload;
      EXPECT_TRUE(v.fields() == f);
      EXPECT_EQ(v.icrc, icrc_compute(m, {buf.data(), n - kIcrcBytes}));
      EXPECT_TRUE(icrc_check(m, {buf.data(), n}));
      // Pad bytes are zero.
      for (size_t i = 0; i < v.pad; ++i) EXPECT_EQ(v.payload[len + i], 0);
    }
  }
}

TEST(PacketTest, EveryOpcodeRoundTripsIpv4Ipv6AndEthernet) {
  std::mt19937_64 rng(7);
  const uint8_t dmac[6] = {1, 2, 3, 4, 5, 6}, smac[6] = {0xa, 0xb, 0xc, 0xd, 0xe, 0xf};
  for (bool v6 : {false, true}) {
    IpUdpMeta m = v6 ? v6_meta() : v4_meta();
    if (!v6) m.ip_id = 0x4321;
    for (uint8_t opc : valid_opcodes()) {
      for (size_t len : payload_lengths(opc)) {
        SCOPED_TRACE(std::string(opcode_info(opc).name) + (v6 ? " v6" : " v4"));
        PacketFields f = random_fields(opc, rng);
        auto payload = make_payload(len, rng);
        std::vector<uint8_t> buf(len + 256);
        size_t n = build_ip_datagram(buf, f, payload, m);
        size_t hl = (v6 ? kIpv6HdrBytes : kIpv4HdrBytes) + kUdpHdrBytes;
        ASSERT_EQ(n, hl + roce_size(opc, len));
        if (!v6) {
          EXPECT_EQ(inet_checksum({buf.data(), kIpv4HdrBytes}), 0);
        }
        PacketView v;
        IpUdpMeta got;
        ASSERT_EQ(parse_ip_datagram({buf.data(), n}, &v, &got, true), ParseError::kOk);
        f.pad_cnt = v.pad;
        f.payload = payload;
        EXPECT_TRUE(v.fields() == f);
        expect_meta_eq(got, m);
        // Ethernet
        std::vector<uint8_t> fr(n + 14);
        size_t fn = build_ethernet_frame(fr, dmac, smac, f, payload, m);
        ASSERT_EQ(fn, n + 14);
        EXPECT_EQ(load_be16(fr.data() + 12), v6 ? 0x86dd : 0x0800);
        PacketView ev;
        ASSERT_EQ(parse_ethernet_frame({fr.data(), fn}, &ev, nullptr, true), ParseError::kOk);
        EXPECT_TRUE(ev.fields() == f);
      }
    }
  }
}

TEST(PacketTest, Ipv6UdpChecksumIsValid) {
  IpUdpMeta m = v6_meta();
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  const uint8_t pl[5] = {9, 8, 7, 6, 5};
  std::vector<uint8_t> buf(256);
  size_t n = build_ip_datagram(buf, f, pl, m);
  ASSERT_GT(n, 48u);
  // Sum over pseudo header (src, dst, length, next header) + UDP segment must be 0xffff.
  uint64_t sum = 0;
  for (size_t i = 8; i < 40; i += 2) sum += load_be16(buf.data() + i);
  sum += n - 40;
  sum += 17;
  sum += static_cast<uint16_t>(~inet_checksum({buf.data() + 40, n - 40}));
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  EXPECT_EQ(sum, 0xffffu);
  EXPECT_NE(load_be16(buf.data() + 46), 0);
}

TEST(PacketTest, BuildHonoursOutputSizeAndOpcodeRules) {
  IpUdpMeta m = v4_meta();
  PacketFields f;
  f.opcode = op::kRcSendOnly;
  const uint8_t pl[5] = {};
  std::vector<uint8_t> buf(64, 0xaa);
  size_t need = roce_size(op::kRcSendOnly, 5);
  EXPECT_EQ(need, 12u + 5 + 3 + 4);
  EXPECT_EQ(build_roce({buf.data(), need - 1}, f, pl, m), 0u);
  EXPECT_EQ(buf[0], 0xaa);  // nothing written
  EXPECT_EQ(build_roce({buf.data(), need}, f, pl, m), need);
  EXPECT_EQ(build_ip_datagram({buf.data(), 20 + 8 + need - 1}, f, pl, m), 0u);
  f.opcode = op::kRcAcknowledge;
  EXPECT_EQ(build_roce(buf, f, pl, m), 0u);  // payload on ACK
  f.opcode = op::kRcAtomicWrite;
  EXPECT_EQ(build_roce(buf, f, pl, m), 0u);  // ATOMIC_WRITE needs exactly 8 bytes
  f.opcode = 0x15;
  EXPECT_EQ(build_roce(buf, f, {}, m), 0u);
  EXPECT_EQ(roce_size(0x15, 0), 0u);
}

// The two-step writer (write_roce_headers, payload placed by the caller, finish_roce) is what
// the requester and responder use on their send slots: on a dirty buffer, with a GSO segment's
// IP ID, it must give exactly build_roce()'s bytes for that ID, and the ICRC must verify.
TEST(PacketTest, TwoStepWriterEqualsBuildRoceOnDirtyBuffers) {
  std::mt19937_64 rng(99);
  for (uint8_t opc : valid_opcodes()) {
    for (size_t len : payload_lengths(opc)) {
      SCOPED_TRACE(std::string(opcode_info(opc).name) + " len " + std::to_string(len));
      PacketFields f = random_fields(opc, rng);
      auto payload = make_payload(len, rng);
      const uint16_t seg_id = static_cast<uint16_t>(1 + rng() % 60);
      IpUdpMeta m = v4_meta();  // ip_id 0, as a QP's saved meta
      IpUdpMeta seg = m;
      seg.ip_id = seg_id;
      std::vector<uint8_t> want(len + 128, 0);
      const size_t n = build_roce(want, f, payload, seg);
      ASSERT_EQ(n, roce_size(opc, len));

      std::vector<uint8_t> slot(len + 128, 0xa5);  // a reused send slot: stale bytes
      const size_t hl = write_roce_headers(slot.data(), f, len);
      ASSERT_EQ(hl, opcode_info(opc).length);
      if (len > 0) std::memcpy(slot.data() + hl, payload.data(), len);
      ASSERT_EQ(roce_len(hl, len), n);
      ASSERT_EQ(finish_roce(slot.data(), hl, len, m, seg_id), n);
      EXPECT_EQ(0, std::memcmp(slot.data(), want.data(), n));
      EXPECT_TRUE(icrc_check(seg, {slot.data(), n}));
      EXPECT_FALSE(icrc_check(m, {slot.data(), n}));  // the ID is covered by the ICRC
      PacketView v;
      ASSERT_EQ(parse_roce({slot.data(), n}, &v), ParseError::kOk);
      f.pad_cnt = v.pad;
      f.payload = payload;
      EXPECT_TRUE(v.fields() == f);
      // Same ID as the meta: the one-argument form.
      ASSERT_EQ(finish_roce(slot.data(), hl, len, seg), n);
      EXPECT_EQ(0, std::memcmp(slot.data(), want.data(), n));
    }
  }
}

TEST(PacketTest, WriterRefusesUnknownOpcodeAndIllegalPayload) {
  std::vector<uint8_t> buf(64, 0xaa);
  PacketFields f;
  f.opcode = 0x15;  // reserved
  EXPECT_EQ(write_roce_headers(buf.data(), f, 0), 0u);
  f.opcode = op::kRcAcknowledge;
  EXPECT_EQ(write_roce_headers(buf.data(), f, 4), 0u);
  f.opcode = op::kRcRdmaReadRequest;
  EXPECT_EQ(write_roce_headers(buf.data(), f, 1), 0u);
  for (uint8_t b : buf) EXPECT_EQ(b, 0xaa);  // nothing written
  EXPECT_EQ(write_roce_headers(buf.data(), f, 0), 28u);
}

// The UD GRH area: for IPv4 twenty zero bytes, then an IPv4 header that parses as the header
// of the same datagram built by build_ip_datagram(); for IPv6 the IPv6 header itself.
TEST(PacketTest, GrhImageMatchesTheDatagramsIpHeader) {
  std::mt19937_64 rng(5);
  for (bool v6 : {false, true}) {
    for (size_t len : {size_t{0}, size_t{3}, size_t{1024}}) {
      SCOPED_TRACE(std::string(v6 ? "v6" : "v4") + " len " + std::to_string(len));
      IpUdpMeta m = v6 ? v6_meta() : v4_meta();
      PacketFields f = random_fields(op::kUdSendOnly, rng);
      auto payload = make_payload(len, rng);
      std::vector<uint8_t> dgram(len + 256);
      const size_t n = build_ip_datagram(dgram, f, payload, m);
      const size_t ip_len = v6 ? kIpv6HdrBytes : kIpv4HdrBytes;
      const size_t roce_bytes = n - ip_len - kUdpHdrBytes;
      std::array<uint8_t, 40> grh;
      grh.fill(0xee);
      ASSERT_TRUE(write_grh_image(grh, m, roce_bytes));
      for (size_t i = 0; i < 40 - ip_len; ++i) EXPECT_EQ(grh[i], 0) << i;
      EXPECT_EQ(0, std::memcmp(grh.data() + 40 - ip_len, dgram.data(), ip_len));
      // The image's IP header in front of the datagram's UDP part parses back to meta.
      std::vector<uint8_t> rebuilt(grh.begin() + (40 - ip_len), grh.end());
      rebuilt.insert(rebuilt.end(), dgram.begin() + ip_len, dgram.begin() + n);
      PacketView v;
      IpUdpMeta got;
      ASSERT_EQ(parse_ip_datagram(rebuilt, &v, &got, true), ParseError::kOk);
      expect_meta_eq(got, m);
      if (!v6) {
        EXPECT_EQ(inet_checksum({grh.data() + 20, kIpv4HdrBytes}), 0);
        EXPECT_EQ(load_be16(grh.data() + 20 + 2), 20 + 8 + roce_bytes);
      }
    }
  }
  std::array<uint8_t, 40> grh{};
  EXPECT_FALSE(write_grh_image(grh, v4_meta(), 0x10000));
}

TEST(PacketTest, ParseErrorNamesAreDistinct) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(ParseError::kNumParseErrors); ++i) {
    const char* n = parse_error_name(static_cast<ParseError>(i));
    ASSERT_NE(n, nullptr);
    names.insert(n);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(ParseError::kNumParseErrors));
  EXPECT_STREQ(parse_error_name(ParseError::kBadIcrc), "kBadIcrc");
  EXPECT_STREQ(parse_error_name(static_cast<ParseError>(200)), "kUnknownParseError");
}

// ---- Malformed input: one test per kind. Each checks the reason and untouched outputs. ----

class MalformedTest : public ::testing::Test {
 protected:
  // A valid RC RDMA WRITE ONLY (BTH+RETH, 10-byte payload) as a v4 datagram and frame.
  void SetUp() override {
    m_ = v4_meta();
    f_.opcode = op::kRcRdmaWriteOnly;
    f_.dest_qp = 0x77;
    f_.psn = 0x100;
    f_.va = 0x1000;
    f_.rkey = 0xabc;
    f_.dma_len = 10;
    const uint8_t pl[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ip_.resize(128);
    ip_.resize(build_ip_datagram(ip_, f_, pl, m_));
    ASSERT_EQ(ip_.size(), 20u + 8 + 28 + 12 + 4);
    roce_.assign(ip_.begin() + 28, ip_.end());
    const uint8_t mac[6] = {2, 0, 0, 0, 0, 1};
    frame_.resize(200);
    frame_.resize(build_ethernet_frame(frame_, mac, mac, f_, pl, m_));
    // Sentinels: every field set to a value parse would never produce.
    static const uint8_t junk[1] = {0};
    sentinel_view_.info = &opcode_info(0x15);
    sentinel_view_.opcode = 0x5c;
    sentinel_view_.hdr = junk;
    sentinel_view_.hdr_len = 5555;
    sentinel_view_.payload = junk;
    sentinel_view_.payload_len = 6666;
    sentinel_view_.pad = 9;
    sentinel_view_.icrc = 0x5c5c5c5c;
    sentinel_view_.roce = junk;
    sentinel_view_.roce_len = 7777;
    sentinel_meta_.ipv6 = true;
    std::memset(sentinel_meta_.src, 0x5c, 16);
    std::memset(sentinel_meta_.dst, 0x5c, 16);
    sentinel_meta_.ip_id = 0x5c5c;
    sentinel_meta_.df = false;
    sentinel_meta_.src_port = 0x5c5c;
    sentinel_meta_.dst_port = 0x5c5c;
    sentinel_meta_.tos = 0x5c;
    sentinel_meta_.ttl = 0x5c;
    sentinel_meta_.flow_label = 0x5c5c5c;
  }
  ParseError roce(std::span<const uint8_t> d) {
    PacketView v = sentinel_view_;
    ParseError e = parse_roce(d, &v);
    expect_untouched(v, sentinel_meta_);
    return e;
  }
  ParseError ip(std::span<const uint8_t> d, bool check = true) {
    PacketView v = sentinel_view_;
    IpUdpMeta m = sentinel_meta_;
    ParseError e = parse_ip_datagram(d, &v, &m, check);
    expect_untouched(v, m);
    return e;
  }
  ParseError eth(std::span<const uint8_t> d) {
    PacketView v = sentinel_view_;
    IpUdpMeta m = sentinel_meta_;
    ParseError e = parse_ethernet_frame(d, &v, &m, true);
    expect_untouched(v, m);
    return e;
  }
  void expect_untouched(const PacketView& v, const IpUdpMeta& m) {
    const PacketView& s = sentinel_view_;
    EXPECT_TRUE(v.info == s.info && v.opcode == s.opcode && v.hdr == s.hdr &&
                v.hdr_len == s.hdr_len && v.payload == s.payload &&
                v.payload_len == s.payload_len && v.pad == s.pad && v.icrc == s.icrc &&
                v.roce == s.roce && v.roce_len == s.roce_len)
        << "view touched";
    const IpUdpMeta& t = sentinel_meta_;
    EXPECT_TRUE(m.ipv6 == t.ipv6 && std::memcmp(m.src, t.src, 16) == 0 &&
                std::memcmp(m.dst, t.dst, 16) == 0 && m.ip_id == t.ip_id && m.df == t.df &&
                m.src_port == t.src_port && m.dst_port == t.dst_port && m.tos == t.tos &&
                m.ttl == t.ttl && m.flow_label == t.flow_label)
        << "meta touched";
  }
  // Builds a RoCE packet of an arbitrary opcode with a valid ICRC.
  std::vector<uint8_t> built(uint8_t opc, size_t payload_len) {
    PacketFields f;
    f.opcode = opc;
    std::vector<uint8_t> pl(payload_len, 0x42), out(payload_len + 128);
    out.resize(build_roce(out, f, pl, m_));
    return out;
  }
  // Recomputes the ICRC of a modified RoCE packet so that only the intended defect remains.
  void refresh_icrc(std::vector<uint8_t>& r) {
    if (r.size() < kBthBytes + kIcrcBytes) return;
    store_le32(r.data() + r.size() - 4, icrc_compute(m_, {r.data(), r.size() - 4}));
  }

  IpUdpMeta m_;
  PacketFields f_;
  std::vector<uint8_t> ip_, roce_, frame_;
  PacketView sentinel_view_;
  IpUdpMeta sentinel_meta_;
};

TEST_F(MalformedTest, ValidBaselineParses) {
  PacketView v;
  IpUdpMeta m;
  EXPECT_EQ(parse_roce(roce_, &v), ParseError::kOk);
  EXPECT_EQ(parse_ip_datagram(ip_, &v, &m, true), ParseError::kOk);
  EXPECT_EQ(parse_ethernet_frame(frame_, &v, &m, true), ParseError::kOk);
}

TEST_F(MalformedTest, EmptyInput) {
  EXPECT_EQ(roce({}), ParseError::kTooShort);
  EXPECT_EQ(ip({}), ParseError::kBadIpHeader);
  EXPECT_EQ(eth({}), ParseError::kTooShort);
}

TEST_F(MalformedTest, TooShortForBth) {
  EXPECT_EQ(roce({roce_.data(), 11}), ParseError::kTooShort);
}

TEST_F(MalformedTest, TooShortForIcrc) {
  auto r = built(op::kRcSendOnly, 0);
  ASSERT_EQ(r.size(), 16u);
  EXPECT_EQ(roce({r.data(), 15}), ParseError::kTooShort);
  EXPECT_EQ(roce({r.data(), 12}), ParseError::kTooShort);
}

TEST_F(MalformedTest, BadTver) {
  for (uint8_t tver = 1; tver < 16; ++tver) {
    auto r = roce_;
    Bth(r.data()).set_tver(tver);
    refresh_icrc(r);
    EXPECT_EQ(roce(r), ParseError::kBadTver) << int(tver);
  }
}

TEST_F(MalformedTest, UnknownOpcode) {
  for (int opc = 0; opc < 256; ++opc) {
    if (opcode_valid(static_cast<uint8_t>(opc))) continue;
    auto r = roce_;
    r[0] = static_cast<uint8_t>(opc);
    refresh_icrc(r);
    EXPECT_EQ(roce(r), ParseError::kUnknownOpcode) << opc;
  }
}

TEST_F(MalformedTest, TruncatedReth) {
  // BTH + 8 of the 16 RETH bytes + ICRC.
  std::vector<uint8_t> r(roce_.begin(), roce_.begin() + 20);
  r.resize(24);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kTruncatedHeader);
}

TEST_F(MalformedTest, TruncatedAtomicEth) {
  auto r = built(op::kRcCompareSwap, 0);
  ASSERT_EQ(r.size(), 44u);
  r.erase(r.begin() + 36, r.begin() + 40);  // drop 4 bytes of AtomicETH
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kTruncatedHeader);
}

TEST_F(MalformedTest, TruncatedDethAndImmDt) {
  auto r = built(op::kUdSendOnlyWithImm, 0);
  ASSERT_EQ(r.size(), 28u);
  r.erase(r.begin() + 20, r.begin() + 24);  // ImmDt missing
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kTruncatedHeader);
}

TEST_F(MalformedTest, TruncatedAeth) {
  auto r = built(op::kRcAcknowledge, 0);
  ASSERT_EQ(r.size(), 20u);
  r.erase(r.begin() + 12, r.begin() + 16);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kTruncatedHeader);
}

TEST_F(MalformedTest, PadCountMismatch) {
  // SEND_ONLY with a 1-byte payload area... claim pad 3 on a 4-byte area with 2 payload bytes
  // is fine (1 byte payload), but pad > area is not: zero payload area with pad 2.
  auto r = built(op::kRcSendOnly, 0);
  Bth(r.data()).set_pad_cnt(2);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kPadMismatch);
}

TEST_F(MalformedTest, LengthNotMultipleOfFour) {
  auto r = built(op::kRcSendOnly, 4);
  r.insert(r.begin() + 16, 0x00);  // 5-byte payload area, pad count says 0
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kPadMismatch);
}

TEST_F(MalformedTest, PayloadOnAcknowledge) {
  auto r = built(op::kRcAcknowledge, 0);
  r.insert(r.begin() + 16, 4, 0x00);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kBadLength);
}

TEST_F(MalformedTest, PayloadOnReadRequest) {
  auto r = built(op::kRcRdmaReadRequest, 0);
  r.insert(r.begin() + 28, 8, 0x00);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kBadLength);
}

TEST_F(MalformedTest, PayloadOnCnp) {
  auto r = built(op::kCnp, 0);
  ASSERT_EQ(r.size(), 32u);
  r.insert(r.begin() + 28, 4, 0x00);
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kBadLength);
}

TEST_F(MalformedTest, AtomicWriteWrongLength) {
  auto r = built(op::kRcAtomicWrite, 8);
  ASSERT_EQ(r.size(), 28u + 8 + 4);
  r.insert(r.begin() + 36, 4, 0x00);  // 12-byte payload
  refresh_icrc(r);
  EXPECT_EQ(roce(r), ParseError::kBadLength);
}

TEST_F(MalformedTest, IcrcMismatch) {
  auto d = ip_;
  d.back() ^= 0x01;
  EXPECT_EQ(ip(d), ParseError::kBadIcrc);
  d = ip_;
  d[28 + 30] ^= 0x80;  // RETH byte
  EXPECT_EQ(ip(d), ParseError::kBadIcrc);
  // Without the check the same datagram parses.
  PacketView v;
  EXPECT_EQ(parse_ip_datagram(d, &v, nullptr, false), ParseError::kOk);
}

TEST_F(MalformedTest, BadIpVersion) {
  auto d = ip_;
  d[0] = 0x55;
  EXPECT_EQ(ip(d), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, Ipv4HeaderTruncated) {
  EXPECT_EQ(ip({ip_.data(), 19}), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, Ipv4IhlTooSmall) {
  auto d = ip_;
  d[0] = 0x44;
  EXPECT_EQ(ip(d), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, Ipv4IhlBeyondTotalLength) {
  auto d = ip_;
  store_be16(d.data() + 2, 20);
  d[0] = 0x46;  // IHL 24 > total 20
  EXPECT_EQ(ip(d), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, Ipv4TotalLengthBeyondBuffer) {
  auto d = ip_;
  store_be16(d.data() + 2, static_cast<uint16_t>(d.size() + 1));
  EXPECT_EQ(ip(d), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, Ipv4Fragment) {
  auto d = ip_;
  store_be16(d.data() + 6, 0x2000);  // MF
  EXPECT_EQ(ip(d), ParseError::kIpFragment);
  store_be16(d.data() + 6, 0x4001);  // DF + offset 8
  EXPECT_EQ(ip(d), ParseError::kIpFragment);
}

TEST_F(MalformedTest, Ipv4ReservedFlag) {
  auto d = ip_;
  store_be16(d.data() + 6, 0xc000);  // reserved bit + DF
  EXPECT_EQ(ip(d, /*check=*/false), ParseError::kBadIpHeader);
  store_le32(d.data() + d.size() - 4, icrc_compute(d));  // even with a matching ICRC
  EXPECT_EQ(ip(d), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, NotUdp) {
  auto d = ip_;
  d[9] = 6;
  EXPECT_EQ(ip(d), ParseError::kNotUdp);
}

TEST_F(MalformedTest, UdpLengthMismatch) {
  auto d = ip_;
  store_be16(d.data() + 24, static_cast<uint16_t>(d.size() - 20 - 4));
  EXPECT_EQ(ip(d), ParseError::kBadUdpLength);
  store_be16(d.data() + 2, 26);  // IP payload shorter than a UDP header
  store_be16(d.data() + 24, 6);
  EXPECT_EQ(ip(d), ParseError::kBadUdpLength);
}

TEST_F(MalformedTest, WrongPort) {
  auto d = ip_;
  store_be16(d.data() + 22, 4790);
  EXPECT_EQ(ip(d), ParseError::kWrongPort);
}

TEST_F(MalformedTest, RoceErrorsPropagateThroughIp) {
  auto d = ip_;
  d[28] = 0x15;  // reserved opcode
  EXPECT_EQ(ip(d), ParseError::kUnknownOpcode);
}

TEST_F(MalformedTest, Ipv6Truncated) {
  std::vector<uint8_t> d(200);
  d.resize(build_ip_datagram(d, f_, {}, v6_meta()));
  ASSERT_GT(d.size(), 40u);
  EXPECT_EQ(ip({d.data(), 39}), ParseError::kBadIpHeader);
  EXPECT_EQ(ip({d.data(), d.size() - 1}), ParseError::kBadIpHeader);  // payload length too big
  auto e = d;
  e[6] = 59;  // no next header
  EXPECT_EQ(ip(e), ParseError::kNotUdp);
  e = d;
  e[20] ^= 1;  // source address: covered by ICRC
  EXPECT_EQ(ip(e), ParseError::kBadIcrc);
}

TEST_F(MalformedTest, EthernetTooShort) {
  EXPECT_EQ(eth({frame_.data(), 13}), ParseError::kTooShort);
  auto f = frame_;
  store_be16(f.data() + 12, 0x8100);
  EXPECT_EQ(eth({f.data(), 17}), ParseError::kTooShort);
}

TEST_F(MalformedTest, NotIpEthertype) {
  auto f = frame_;
  store_be16(f.data() + 12, 0x0806);  // ARP
  EXPECT_EQ(eth(f), ParseError::kNotIp);
  store_be16(f.data() + 12, 0x8915);  // RoCEv1
  EXPECT_EQ(eth(f), ParseError::kNotIp);
}

TEST_F(MalformedTest, EthertypeDisagreesWithIpVersion) {
  auto f = frame_;
  store_be16(f.data() + 12, 0x86dd);
  EXPECT_EQ(eth(f), ParseError::kBadIpHeader);
}

TEST_F(MalformedTest, VlanTaggedFrameAndEthernetPaddingParse) {
  std::vector<uint8_t> f(frame_.begin(), frame_.begin() + 12);
  const uint8_t tag[4] = {0x81, 0x00, 0x20, 0x05};
  f.insert(f.end(), tag, tag + 4);
  f.insert(f.end(), frame_.begin() + 12, frame_.end());
  f.resize(f.size() + 6, 0x00);  // trailing Ethernet padding is ignored (IP total length rules)
  PacketView v;
  IpUdpMeta m;
  ASSERT_EQ(parse_ethernet_frame(f, &v, &m, true), ParseError::kOk);
  EXPECT_EQ(v.fields().rkey, 0xabcu);
  EXPECT_EQ(v.payload_len, 10u);
}

}  // namespace
}  // namespace rnic::wire
