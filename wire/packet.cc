// RoCEv2 packet build/parse: the one packet writer (transport headers via the opcode table, pad,
// ICRC), IPv4/IPv6 + UDP, Ethernet, the UD GRH image; and the matching parsers.
#include "wire/packet.h"

#include <algorithm>
#include <cstring>

#include "wire/byteorder.h"

namespace rnic::wire {
namespace {

constexpr const char* kErrorNames[] = {
    "kOk",          "kTooShort",      "kBadTver",    "kUnknownOpcode", "kTruncatedHeader",
    "kPadMismatch", "kBadLength",     "kBadIcrc",    "kBadIpHeader",   "kIpFragment",
    "kNotUdp",      "kBadUdpLength",  "kWrongPort",  "kNotIp",
};
static_assert(std::size(kErrorNames) == static_cast<size_t>(ParseError::kNumParseErrors));

constexpr uint8_t kIpProtoUdp = 17;
constexpr size_t kAtomicWritePayload = 8;

// Payload length rule per opcode, shared by build and parse.
bool payload_len_ok(const OpcodeInfo& info, size_t n) {
  if (!(info.mask & kPayloadMask)) return n == 0;
  if (info.mask & kAtomicWriteMask) return n == kAtomicWritePayload;
  return true;
}

ParseError parse_udp(std::span<const uint8_t> udp, std::span<const uint8_t> ip_for_icrc,
                     PacketView* out, IpUdpMeta* meta_out, IpUdpMeta& meta, bool check_icrc) {
  if (udp.size() < kUdpHdrBytes) return ParseError::kBadUdpLength;
  if (load_be16(udp.data() + 4) != udp.size()) return ParseError::kBadUdpLength;
  meta.src_port = load_be16(udp.data());
  meta.dst_port = load_be16(udp.data() + 2);
  if (meta.dst_port != kRoceUdpPort) return ParseError::kWrongPort;
  PacketView v;
  ParseError e = parse_roce(udp.subspan(kUdpHdrBytes), &v);
  if (e != ParseError::kOk) return e;
  if (check_icrc && !icrc_check(ip_for_icrc)) return ParseError::kBadIcrc;
  *out = v;
  if (meta_out) *meta_out = meta;
  return ParseError::kOk;
}

// The IPv4 (IHL 5) or IPv6 header of a datagram carrying udp_len bytes of UDP: what
// build_ip_datagram() emits and what a UD receive buffer's GRH area shows (write_grh_image).
void write_ip_header(uint8_t* ip, const IpUdpMeta& m, size_t udp_len) {
  if (!m.ipv6) {
    ip[0] = 0x45;
    ip[1] = m.tos;
    store_be16(ip + 2, static_cast<uint16_t>(kIpv4HdrBytes + udp_len));
    store_be16(ip + 4, m.ip_id);
    store_be16(ip + 6, m.df ? 0x4000 : 0);
    ip[8] = m.ttl;
    ip[9] = kIpProtoUdp;
    store_be16(ip + 10, 0);
    std::memcpy(ip + 12, m.src, 4);
    std::memcpy(ip + 16, m.dst, 4);
    store_be16(ip + 10, inet_checksum({ip, kIpv4HdrBytes}));
    return;
  }
  store_be32(ip, (6u << 28) | (uint32_t{m.tos} << 20) | (m.flow_label & 0xfffff));
  store_be16(ip + 4, static_cast<uint16_t>(udp_len));
  ip[6] = kIpProtoUdp;
  ip[7] = m.ttl;
  std::memcpy(ip + 8, m.src, 16);
  std::memcpy(ip + 24, m.dst, 16);
}

}  // namespace

bool PacketFields::operator==(const PacketFields& o) const {
  return opcode == o.opcode && se == o.se && mig == o.mig && pad_cnt == o.pad_cnt &&
         tver == o.tver && pkey == o.pkey && fecn == o.fecn && becn == o.becn &&
         dest_qp == o.dest_qp && ack_req == o.ack_req && psn == o.psn && va == o.va &&
         rkey == o.rkey && dma_len == o.dma_len && syndrome == o.syndrome && msn == o.msn &&
         swap_add == o.swap_add && compare == o.compare && orig == o.orig && qkey == o.qkey &&
         src_qp == o.src_qp && imm == o.imm && inv_rkey == o.inv_rkey &&
         flush_sel == o.flush_sel && flush_plt == o.flush_plt && xrc_srqn == o.xrc_srqn &&
         std::equal(payload.begin(), payload.end(), o.payload.begin(), o.payload.end());
}

const char* parse_error_name(ParseError e) {
  auto i = static_cast<size_t>(e);
  return i < std::size(kErrorNames) ? kErrorNames[i] : "kUnknownParseError";
}

PacketFields PacketView::fields() const {
  PacketFields f;
  ConstBth b = bth();
  f.opcode = b.opcode();
  f.se = b.se();
  f.mig = b.mig();
  f.pad_cnt = b.pad_cnt();
  f.tver = b.tver();
  f.pkey = b.pkey();
  f.fecn = b.fecn();
  f.becn = b.becn();
  f.dest_qp = b.dest_qp();
  f.ack_req = b.ack_req();
  f.psn = b.psn();
  if (has(kRethMask)) {
    f.va = reth().va();
    f.rkey = reth().rkey();
    f.dma_len = reth().dma_len();
  }
  if (has(kAtmEthMask)) {
    f.va = atomic_eth().va();
    f.rkey = atomic_eth().rkey();
    f.swap_add = atomic_eth().swap_add();
    f.compare = atomic_eth().compare();
  }
  if (has(kAethMask)) {
    f.syndrome = aeth().syndrome();
    f.msn = aeth().msn();
  }
  if (has(kAtmAckMask)) f.orig = atomic_ack_eth().orig();
  if (has(kDethMask)) {
    f.qkey = deth().qkey();
    f.src_qp = deth().src_qp();
  }
  if (has(kImmMask)) f.imm = immdt().imm();
  if (has(kIethMask)) f.inv_rkey = ieth().inv_rkey();
  if (has(kXrcEthMask)) f.xrc_srqn = xrceth().srqn();
  if (has(kFethMask)) {
    f.flush_sel = feth().sel();
    f.flush_plt = feth().plt();
  }
  f.payload = payload_span();
  return f;
}

ParseError parse_roce(std::span<const uint8_t> u, PacketView* out, bool allow_one_copy) {
  if (u.size() < kBthBytes + kIcrcBytes) return ParseError::kTooShort;
  const uint8_t* p = u.data();
  ConstBth bth(p);
  if (bth.tver() != kTver && !(allow_one_copy && bth.tver() == kTverOneCopy))
    return ParseError::kBadTver;
  const OpcodeInfo& info = opcode_info(bth.opcode());
  if (info.mask == 0) return ParseError::kUnknownOpcode;
  if (u.size() < size_t{info.length} + kIcrcBytes) return ParseError::kTruncatedHeader;
  size_t area = u.size() - info.length - kIcrcBytes;  // payload + pad
  uint8_t pad = bth.pad_cnt();
  if (pad > area || (u.size() & 3) != 0) return ParseError::kPadMismatch;
  size_t payload_len = area - pad;
  if (!payload_len_ok(info, payload_len)) return ParseError::kBadLength;
  PacketView v;
  v.info = &info;
  v.opcode = bth.opcode();
  v.hdr = p;
  v.hdr_len = info.length;
  v.payload = p + info.length;
  v.payload_len = payload_len;
  v.pad = pad;
  v.icrc = load_le32(p + u.size() - kIcrcBytes);
  v.roce = p;
  v.roce_len = u.size();
  *out = v;
  return ParseError::kOk;
}

ParseError parse_ip_datagram(std::span<const uint8_t> ip, PacketView* out, IpUdpMeta* meta_out,
                             bool check_icrc) {
  IpUdpMeta m;
  if (ip.empty()) return ParseError::kBadIpHeader;
  uint8_t version = ip[0] >> 4;
  if (version == 4) {
    if (ip.size() < kIpv4HdrBytes) return ParseError::kBadIpHeader;
    size_t ihl = size_t{ip[0] & 0xfu} * 4;
    size_t total = load_be16(ip.data() + 2);
    if (ihl < kIpv4HdrBytes || total < ihl || total > ip.size()) return ParseError::kBadIpHeader;
    uint16_t frag = load_be16(ip.data() + 6);
    if (frag & 0x8000) return ParseError::kBadIpHeader;  // reserved flag (RFC 791: zero)
    if (frag & 0x3fff) return ParseError::kIpFragment;   // MF or fragment offset
    if (ip[9] != kIpProtoUdp) return ParseError::kNotUdp;
    m.ipv6 = false;
    m.tos = ip[1];
    m.ip_id = load_be16(ip.data() + 4);
    m.df = frag & 0x4000;
    m.ttl = ip[8];
    std::memcpy(m.src, ip.data() + 12, 4);
    std::memcpy(m.dst, ip.data() + 16, 4);
    auto dgram = ip.first(total);
    return parse_udp(dgram.subspan(ihl), dgram, out, meta_out, m, check_icrc);
  }
  if (version == 6) {
    if (ip.size() < kIpv6HdrBytes) return ParseError::kBadIpHeader;
    size_t total = kIpv6HdrBytes + load_be16(ip.data() + 4);
    if (total > ip.size()) return ParseError::kBadIpHeader;
    if (ip[6] != kIpProtoUdp) return ParseError::kNotUdp;
    m.ipv6 = true;
    m.tos = static_cast<uint8_t>((load_be16(ip.data()) >> 4) & 0xff);
    m.flow_label = load_be24(ip.data() + 1) & 0xfffff;
    m.ttl = ip[7];
    m.ip_id = 0;
    m.df = false;
    std::memcpy(m.src, ip.data() + 8, 16);
    std::memcpy(m.dst, ip.data() + 24, 16);
    auto dgram = ip.first(total);
    return parse_udp(dgram.subspan(kIpv6HdrBytes), dgram, out, meta_out, m, check_icrc);
  }
  return ParseError::kBadIpHeader;
}

ParseError parse_ethernet_frame(std::span<const uint8_t> frame, PacketView* out,
                                IpUdpMeta* meta, bool check_icrc) {
  if (frame.size() < kEthHdrBytes) return ParseError::kTooShort;
  size_t off = 12;
  uint16_t type = load_be16(frame.data() + off);
  if (type == 0x8100 || type == 0x88a8) {
    if (frame.size() < kEthHdrBytes + 4) return ParseError::kTooShort;
    off += 4;
    type = load_be16(frame.data() + off);
  }
  off += 2;
  if (type != 0x0800 && type != 0x86dd) return ParseError::kNotIp;
  auto ip = frame.subspan(off);
  // The IP version must agree with the Ethernet type.
  if (!ip.empty() && (ip[0] >> 4) != (type == 0x0800 ? 4 : 6)) return ParseError::kBadIpHeader;
  return parse_ip_datagram(ip, out, meta, check_icrc);
}

size_t roce_size(uint8_t opcode, size_t payload_len) {
  const OpcodeInfo& info = opcode_info(opcode);
  if (info.mask == 0) return 0;
  size_t pad = (4 - payload_len % 4) % 4;
  return info.length + payload_len + pad + kIcrcBytes;
}

size_t write_roce_headers(uint8_t* p, const PacketFields& f, size_t payload_len) {
  const OpcodeInfo& info = opcode_info(f.opcode);
  if (info.mask == 0 || !payload_len_ok(info, payload_len)) return 0;
  std::memset(p, 0, info.length);
  Bth b(p);
  b.set_opcode(f.opcode);
  b.set_se(f.se);
  b.set_mig(f.mig);
  b.set_pad_cnt(static_cast<uint8_t>((4 - payload_len % 4) % 4));
  b.set_tver(f.tver);
  b.set_pkey(f.pkey);
  b.set_fecn(f.fecn);
  b.set_becn(f.becn);
  b.set_dest_qp(f.dest_qp);
  b.set_ack_req(f.ack_req);
  b.set_psn(f.psn);
  const uint32_t mask = info.mask;
  if (mask & kRethMask) {
    Reth r(p + info.offset[kHdrReth]);
    r.set_va(f.va);
    r.set_rkey(f.rkey);
    r.set_dma_len(f.dma_len);
  }
  if (mask & kAtmEthMask) {
    AtomicEth a(p + info.offset[kHdrAtmEth]);
    a.set_va(f.va);
    a.set_rkey(f.rkey);
    a.set_swap_add(f.swap_add);
    a.set_compare(f.compare);
  }
  if (mask & kAethMask) {
    Aeth a(p + info.offset[kHdrAeth]);
    a.set_syndrome(f.syndrome);
    a.set_msn(f.msn);
  }
  if (mask & kAtmAckMask) AtomicAckEth(p + info.offset[kHdrAtmAck]).set_orig(f.orig);
  if (mask & kDethMask) {
    Deth d(p + info.offset[kHdrDeth]);
    d.set_qkey(f.qkey);
    d.set_src_qp(f.src_qp);
  }
  if (mask & kImmMask) ImmDt(p + info.offset[kHdrImmDt]).set_imm(f.imm);
  if (mask & kIethMask) Ieth(p + info.offset[kHdrIeth]).set_inv_rkey(f.inv_rkey);
  if (mask & kXrcEthMask) XrcEth(p + info.offset[kHdrXrcEth]).set_srqn(f.xrc_srqn);
  if (mask & kFethMask) Feth(p + info.offset[kHdrFeth]).set_sel_plt(f.flush_sel, f.flush_plt);
  return info.length;
}

size_t finish_roce(uint8_t* p, size_t hdr_len, size_t payload_len, const IpUdpMeta& meta,
                   uint16_t ip_id) {
  size_t n = hdr_len + payload_len;
  const size_t pad = (4 - payload_len % 4) % 4;
  std::memset(p + n, 0, pad);
  n += pad;
  uint32_t icrc;
  if (ip_id == meta.ip_id) {
    icrc = icrc_compute(meta, std::span<const uint8_t>(p, n));
  } else {
    IpUdpMeta m = meta;  // segment k of a GSO run: its own IPv4 ID
    m.ip_id = ip_id;
    icrc = icrc_compute(m, std::span<const uint8_t>(p, n));
  }
  store_le32(p + n, icrc);
  return n + kIcrcBytes;
}

size_t build_roce(std::span<uint8_t> out, const PacketFields& f,
                  std::span<const uint8_t> payload, const IpUdpMeta& meta) {
  const OpcodeInfo& info = opcode_info(f.opcode);
  if (info.mask == 0 || out.size() < roce_len(info.length, payload.size())) return 0;
  uint8_t* p = out.data();
  const size_t hl = write_roce_headers(p, f, payload.size());
  if (hl == 0) return 0;
  if (!payload.empty()) std::memcpy(p + hl, payload.data(), payload.size());
  return finish_roce(p, hl, payload.size(), meta);
}

uint16_t inet_checksum(std::span<const uint8_t> d) {
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 1 < d.size(); i += 2) sum += load_be16(d.data() + i);
  if (i < d.size()) sum += uint32_t{d[i]} << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

size_t build_ip_datagram(std::span<uint8_t> out, const PacketFields& f,
                         std::span<const uint8_t> payload, const IpUdpMeta& m) {
  size_t ip_len = m.ipv6 ? kIpv6HdrBytes : kIpv4HdrBytes;
  size_t hdrs = ip_len + kUdpHdrBytes;
  if (out.size() < hdrs) return 0;
  size_t roce = build_roce(out.subspan(hdrs), f, payload, m);
  if (roce == 0) return 0;
  size_t udp_len = kUdpHdrBytes + roce;
  if (ip_len + udp_len > 0xffff) return 0;
  uint8_t* ip = out.data();
  uint8_t* udp = ip + ip_len;
  store_be16(udp, m.src_port);
  store_be16(udp + 2, m.dst_port);
  store_be16(udp + 4, static_cast<uint16_t>(udp_len));
  store_be16(udp + 6, 0);
  write_ip_header(ip, m, udp_len);
  if (m.ipv6) {
    // UDP checksum over the IPv6 pseudo header (RFC 8200 8.1) + UDP header + data.
    uint64_t sum = 0;
    for (size_t i = 8; i < 40; i += 2) sum += load_be16(ip + i);
    sum += udp_len;
    sum += kIpProtoUdp;
    sum += static_cast<uint16_t>(~inet_checksum({udp, udp_len}));
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    uint16_t c = static_cast<uint16_t>(~sum);
    store_be16(udp + 6, c == 0 ? 0xffff : c);
  }
  return ip_len + udp_len;
}

bool write_grh_image(std::span<uint8_t, 40> out, const IpUdpMeta& meta, size_t roce_bytes) {
  const size_t ip_len = meta.ipv6 ? kIpv6HdrBytes : kIpv4HdrBytes;
  const size_t udp_len = kUdpHdrBytes + roce_bytes;
  if (ip_len + udp_len > 0xffff) return false;
  std::memset(out.data(), 0, out.size());
  // IPv4: the header sits in the last 20 bytes of the 40 (RoCEv2, as rxe delivers it).
  write_ip_header(out.data() + out.size() - ip_len, meta, udp_len);
  return true;
}

size_t build_ethernet_frame(std::span<uint8_t> out, const uint8_t dst_mac[6],
                            const uint8_t src_mac[6], const PacketFields& f,
                            std::span<const uint8_t> payload, const IpUdpMeta& meta) {
  if (out.size() < kEthHdrBytes) return 0;
  size_t n = build_ip_datagram(out.subspan(kEthHdrBytes), f, payload, meta);
  if (n == 0) return 0;
  std::memcpy(out.data(), dst_mac, 6);
  std::memcpy(out.data() + 6, src_mac, 6);
  store_be16(out.data() + 12, meta.ipv6 ? 0x86dd : 0x0800);
  return kEthHdrBytes + n;
}

}  // namespace rnic::wire
