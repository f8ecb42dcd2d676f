// RoCEv2 ICRC (masked pseudo-header + transport + payload) and the CRC-32 implementations
// behind it: zlib, ISA-L (when built with it) and an own slicing-by-8.
#include "wire/icrc.h"

#include <zlib.h>

#include <array>
#include <cstring>

#include "wire/byteorder.h"
#include "wire/hdr.h"

#ifdef SOFTRNIC_HAVE_ISAL
#include <isa-l/crc.h>
#endif

namespace rnic::wire {
namespace {

constexpr uint32_t kPoly = 0xedb88320;  // reflected CRC-32 polynomial

// ---- own slicing-by-8 ----
constexpr std::array<std::array<uint32_t, 256>, 8> make_slice_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}
constexpr auto kSlice = make_slice_tables();

uint32_t crc32_slice8(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  while (n >= 8) {
    // Little-endian assembly of the 8 bytes, independent of host byte order.
    uint32_t lo = c ^ load_le32(p);
    uint32_t hi = load_le32(p + 4);
    c = kSlice[7][lo & 0xff] ^ kSlice[6][(lo >> 8) & 0xff] ^ kSlice[5][(lo >> 16) & 0xff] ^
        kSlice[4][lo >> 24] ^ kSlice[3][hi & 0xff] ^ kSlice[2][(hi >> 8) & 0xff] ^
        kSlice[1][(hi >> 16) & 0xff] ^ kSlice[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kSlice[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t crc32_zlib(uint32_t crc, const uint8_t* p, size_t n) {
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

// Bitwise CRC for constexpr prefixes.
constexpr uint32_t crc32_bitwise(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
  }
  return ~c;
}

// Constant prefixes: 8 x 0xFF (stands in for the masked LRH), then for the fast forms the
// constant first bytes of the masked IP header (IPv4: 0x45 + TOS ones; IPv6: version 6 with
// traffic class and flow label ones).
constexpr uint8_t kPrefixV4[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x45, 0xff};
constexpr uint8_t kPrefixV6[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff, 0xff, 0x6f, 0xff, 0xff, 0xff};
constexpr uint32_t kCrcFf8 = crc32_bitwise(0, kPrefixV4, 8);
constexpr uint32_t kCrcPrefixV4 = crc32_bitwise(0, kPrefixV4, sizeof(kPrefixV4));
constexpr uint32_t kCrcPrefixV6 = crc32_bitwise(0, kPrefixV6, sizeof(kPrefixV6));
// rxe seeds crc32_le (no pre/post inversion) with 0xDEBB20E3 = state after 8 x 0xFF.
static_assert(~kCrcFf8 == 0xdebb20e3u);

#if defined(SOFTRNIC_HAVE_ISAL)
constexpr Crc32Impl kDefaultImpl = Crc32Impl::kIsal;
#else
constexpr Crc32Impl kDefaultImpl = Crc32Impl::kSlice8;
#endif

inline uint32_t crc_default(uint32_t crc, const uint8_t* p, size_t n) {
#if defined(SOFTRNIC_HAVE_ISAL)
  return crc32_gzip_refl(crc, p, n);
#else
  return crc32_slice8(crc, p, n);
#endif
}

// Masks the variant fields of a copied IP(+UDP+BTH) header in place.
void mask_ipv4(uint8_t* ip, size_t ihl) {
  ip[1] = 0xff;   // TOS (DSCP + ECN)
  ip[8] = 0xff;   // TTL
  ip[10] = 0xff;  // header checksum
  ip[11] = 0xff;
  uint8_t* udp = ip + ihl;
  udp[6] = 0xff;  // UDP checksum
  udp[7] = 0xff;
  udp[kUdpHdrBytes + 4] = 0xff;  // BTH resv8a (FECN, BECN, reserved)
}
void mask_ipv6(uint8_t* ip) {
  ip[0] |= 0x0f;  // traffic class high nibble
  ip[1] = 0xff;   // traffic class low nibble + flow label
  ip[2] = 0xff;
  ip[3] = 0xff;
  ip[7] = 0xff;   // hop limit
  uint8_t* udp = ip + kIpv6HdrBytes;
  udp[6] = 0xff;
  udp[7] = 0xff;
  udp[kUdpHdrBytes + 4] = 0xff;
}

// Builds the masked pseudo header for the fast form. Returns its length.
size_t build_pseudo(const IpUdpMeta& m, size_t roce_len_with_icrc, const uint8_t* bth,
                    uint8_t* buf) {
  size_t udp_len = kUdpHdrBytes + roce_len_with_icrc;
  size_t off;
  if (!m.ipv6) {
    buf[0] = 0x45;
    buf[1] = 0xff;
    store_be16(buf + 2, static_cast<uint16_t>(kIpv4HdrBytes + udp_len));
    store_be16(buf + 4, m.ip_id);
    store_be16(buf + 6, m.df ? 0x4000 : 0);
    buf[8] = 0xff;
    buf[9] = 17;
    buf[10] = 0xff;
    buf[11] = 0xff;
    std::memcpy(buf + 12, m.src, 4);
    std::memcpy(buf + 16, m.dst, 4);
    off = kIpv4HdrBytes;
  } else {
    buf[0] = 0x6f;
    buf[1] = buf[2] = buf[3] = 0xff;
    store_be16(buf + 4, static_cast<uint16_t>(udp_len));
    buf[6] = 17;
    buf[7] = 0xff;
    std::memcpy(buf + 8, m.src, 16);
    std::memcpy(buf + 24, m.dst, 16);
    off = kIpv6HdrBytes;
  }
  store_be16(buf + off, m.src_port);
  store_be16(buf + off + 2, m.dst_port);
  store_be16(buf + off + 4, static_cast<uint16_t>(udp_len));
  buf[off + 6] = buf[off + 7] = 0xff;
  off += kUdpHdrBytes;
  std::memcpy(buf + off, bth, kBthBytes);
  buf[off + 4] = 0xff;
  return off + kBthBytes;
}

}  // namespace

const char* crc32_impl_name(Crc32Impl impl) {
  switch (impl) {
    case Crc32Impl::kZlib: return "zlib";
    case Crc32Impl::kIsal: return "isal";
    case Crc32Impl::kSlice8: return "slice8";
  }
  return "?";
}

bool crc32_impl_available(Crc32Impl impl) {
#if defined(SOFTRNIC_HAVE_ISAL)
  (void)impl;
  return true;
#else
  return impl != Crc32Impl::kIsal;
#endif
}

uint32_t crc32_update(Crc32Impl impl, uint32_t crc, std::span<const uint8_t> d) {
  switch (impl) {
    case Crc32Impl::kZlib: return crc32_zlib(crc, d.data(), d.size());
#if defined(SOFTRNIC_HAVE_ISAL)
    case Crc32Impl::kIsal: return crc32_gzip_refl(crc, d.data(), d.size());
#endif
    default: return crc32_slice8(crc, d.data(), d.size());
  }
}

Crc32Impl crc32_default_impl() { return kDefaultImpl; }

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> d) {
  return crc_default(crc, d.data(), d.size());
}

uint32_t icrc_compute(std::span<const uint8_t> ip) {
  if (ip.empty()) return 0;
  uint8_t buf[60 + kUdpHdrBytes + kBthBytes];
  size_t hlen;
  if ((ip[0] >> 4) == 4) {
    size_t ihl = size_t{ip[0] & 0xfu} * 4;
    hlen = ihl + kUdpHdrBytes + kBthBytes;
    if (ihl < kIpv4HdrBytes || ip.size() < hlen + kIcrcBytes) return 0;
    std::memcpy(buf, ip.data(), hlen);
    mask_ipv4(buf, ihl);
  } else if ((ip[0] >> 4) == 6) {
    hlen = kIpv6HdrBytes + kUdpHdrBytes + kBthBytes;
    if (ip.size() < hlen + kIcrcBytes) return 0;
    std::memcpy(buf, ip.data(), hlen);
    mask_ipv6(buf);
  } else {
    return 0;
  }
  uint32_t crc = crc_default(kCrcFf8, buf, hlen);
  return crc_default(crc, ip.data() + hlen, ip.size() - hlen - kIcrcBytes);
}

bool icrc_check(std::span<const uint8_t> ip) {
  if (ip.size() < kIpv4HdrBytes + kUdpHdrBytes + kBthBytes + kIcrcBytes) return false;
  uint32_t want = load_le32(ip.data() + ip.size() - kIcrcBytes);
  // icrc_compute returns 0 for malformed input; a real ICRC of 0 still has to be computed.
  uint8_t v = ip[0] >> 4;
  if (v != 4 && v != 6) return false;
  if (v == 4) {
    size_t ihl = size_t{ip[0] & 0xfu} * 4;
    if (ihl < kIpv4HdrBytes || ip.size() < ihl + kUdpHdrBytes + kBthBytes + kIcrcBytes) {
      return false;
    }
  } else if (ip.size() < kIpv6HdrBytes + kUdpHdrBytes + kBthBytes + kIcrcBytes) {
    return false;
  }
  return icrc_compute(ip) == want;
}

uint32_t icrc_compute(const IpUdpMeta& meta, std::span<const uint8_t> roce) {
  if (roce.size() < kBthBytes) return 0;
  uint8_t buf[kIpv6HdrBytes + kUdpHdrBytes + kBthBytes];
  size_t n = build_pseudo(meta, roce.size() + kIcrcBytes, roce.data(), buf);
  // Skip the constant prefix bytes already folded into kCrcPrefixV4/V6.
  size_t skip = meta.ipv6 ? sizeof(kPrefixV6) - 8 : sizeof(kPrefixV4) - 8;
  uint32_t crc = crc_default(meta.ipv6 ? kCrcPrefixV6 : kCrcPrefixV4, buf + skip, n - skip);
  return crc_default(crc, roce.data() + kBthBytes, roce.size() - kBthBytes);
}

bool icrc_check(const IpUdpMeta& meta, std::span<const uint8_t> r) {
  if (r.size() < kBthBytes + kIcrcBytes) return false;
  return icrc_compute(meta, r.first(r.size() - kIcrcBytes)) ==
         load_le32(r.data() + r.size() - kIcrcBytes);
}

std::optional<uint16_t> icrc_solve_ip_id(const IpUdpMeta& meta, std::span<const uint8_t> r) {
  if (r.size() < kBthBytes + kIcrcBytes || meta.ipv6) {
    if (r.size() >= kBthBytes + kIcrcBytes && icrc_check(meta, r)) return uint16_t{0};
    return std::nullopt;
  }
  auto body = r.first(r.size() - kIcrcBytes);
  uint32_t want = load_le32(r.data() + r.size() - kIcrcBytes);
  IpUdpMeta m = meta;
  m.ip_id = meta.ip_id;
  if (icrc_compute(m, body) == want) return meta.ip_id;
  // crc(id) = c0 ^ XOR_{bit i set in id} delta[i]  (CRC is affine over GF(2) at fixed length).
  m.ip_id = 0;
  uint32_t c0 = icrc_compute(m, body);
  uint32_t delta[16];
  for (int i = 0; i < 16; ++i) {
    m.ip_id = static_cast<uint16_t>(1u << i);
    delta[i] = icrc_compute(m, body) ^ c0;
  }
  uint32_t rhs = want ^ c0;
  // Rows: one equation per CRC bit j: sum_i delta[i]_j * x_i = rhs_j. Row = 16 coeff bits + rhs.
  uint32_t rows[32];
  for (int j = 0; j < 32; ++j) {
    uint32_t row = 0;
    for (int i = 0; i < 16; ++i) row |= ((delta[i] >> j) & 1u) << i;
    rows[j] = row | (((rhs >> j) & 1u) << 16);
  }
  int rank = 0;
  int pivot_col[16];
  for (int col = 0; col < 16; ++col) {
    int p = -1;
    for (int j = rank; j < 32; ++j) {
      if (rows[j] & (1u << col)) {
        p = j;
        break;
      }
    }
    if (p < 0) continue;
    std::swap(rows[rank], rows[p]);
    for (int j = 0; j < 32; ++j) {
      if (j != rank && (rows[j] & (1u << col))) rows[j] ^= rows[rank];
    }
    pivot_col[rank] = col;
    ++rank;
  }
  for (int j = rank; j < 32; ++j) {
    if (rows[j] & (1u << 16)) return std::nullopt;  // inconsistent: no ID matches
  }
  if (rank != 16) return std::nullopt;  // not unique (cannot happen for CRC-32, kept for safety)
  uint16_t id = 0;
  for (int k = 0; k < rank; ++k) {
    if (rows[k] & (1u << 16)) id = static_cast<uint16_t>(id | (1u << pivot_col[k]));
  }
  return id;
}

}  // namespace rnic::wire
