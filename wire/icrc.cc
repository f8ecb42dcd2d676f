// RoCEv2 ICRC (masked pseudo-header + transport + payload) and the CRC-32 implementations
// behind it: zlib, ISA-L (when built with it), own slicing-by-8, own PCLMULQDQ and AVX-512
// VPCLMULQDQ folding.
#include "wire/icrc.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <array>
#include <cstdint>
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

#if defined(__x86_64__)
// ---- own carry-less-multiply folding (Intel "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ", reflected form). Folds 4 x 128 bits per step, then 1 x 128, reduces
// 128 -> 64 -> 32 bits and finishes with a Barrett reduction. Constants are x^k mod P
// (bit-reflected, shifted left by one) for the fold distances, plus P' and mu for Barrett.
constexpr uint64_t kK1 = 0x154442bd4;  // x^(4*128+32) mod P  (fold 512 bits, low half)
constexpr uint64_t kK2 = 0x1c6e41596;  // x^(4*128-32) mod P  (fold 512 bits, high half)
constexpr uint64_t kK3 = 0x1751997d0;  // x^(128+32) mod P    (fold 128 bits, low half)
constexpr uint64_t kK4 = 0x0ccaa009e;  // x^(128-32) mod P    (fold 128 bits, high half)
constexpr uint64_t kK5 = 0x163cd6124;  // x^64 mod P          (64 -> 32)
constexpr uint64_t kPolyR = 0x1db710641;  // P reflected (33 bits)
constexpr uint64_t kMu = 0x1f7011641;     // floor(x^64 / P) reflected

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k,
                                                              __m128i next) {
  __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
  __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

// Reduces a 128-bit folded remainder to the 32-bit CRC register.
__attribute__((target("pclmul,sse4.1"))) inline uint32_t reduce128(__m128i x) {
  const __m128i k34 = _mm_set_epi64x(static_cast<long long>(kK4), static_cast<long long>(kK3));
  // 128 -> 64 bits.
  __m128i t = _mm_clmulepi64_si128(x, k34, 0x10);
  x = _mm_xor_si128(t, _mm_srli_si128(x, 8));
  // 64 -> 32 bits.
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  const __m128i k5 = _mm_set_epi64x(0, static_cast<long long>(kK5));
  t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00);
  x = _mm_xor_si128(t, _mm_srli_si128(x, 4));
  // Barrett reduction.
  const __m128i pu = _mm_set_epi64x(static_cast<long long>(kMu), static_cast<long long>(kPolyR));
  t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pu, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), pu, 0x00);
  x = _mm_xor_si128(x, t);
  return static_cast<uint32_t>(_mm_extract_epi32(x, 1));
}

// CRC register update (no pre/post inversion) over n >= 64 bytes, n % 16 == 0.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_pclmul_blocks(uint32_t reg,
                                                                       const uint8_t* p,
                                                                       size_t n) {
  auto load = [](const uint8_t* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  const __m128i k12 = _mm_set_epi64x(static_cast<long long>(kK2), static_cast<long long>(kK1));
  while (n >= 64) {
    x0 = fold(x0, k12, load(p));
    x1 = fold(x1, k12, load(p + 16));
    x2 = fold(x2, k12, load(p + 32));
    x3 = fold(x3, k12, load(p + 48));
    p += 64;
    n -= 64;
  }
  const __m128i k34 = _mm_set_epi64x(static_cast<long long>(kK4), static_cast<long long>(kK3));
  __m128i x = fold(x0, k34, x1);
  x = fold(x, k34, x2);
  x = fold(x, k34, x3);
  while (n >= 16) {
    x = fold(x, k34, load(p));
    p += 16;
    n -= 16;
  }
  return reduce128(x);
}

bool cpu_has_pclmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}

uint32_t crc32_pclmul(uint32_t crc, const uint8_t* p, size_t n) {
  if (n < 64 || !cpu_has_pclmul()) return crc32_slice8(crc, p, n);
  size_t blocks = n & ~size_t{15};
  uint32_t reg = crc32_pclmul_blocks(~crc, p, blocks);
  return crc32_slice8(~reg, p + blocks, n - blocks);
}
// AVX-512 VPCLMULQDQ variant: four 512-bit accumulators fold 256 bytes per step (distance 2048
// bits), then fold into one 512-bit value (distance 512), then its four 128-bit lanes into one
// (distances 384/256/128) and finish like the SSE path.
constexpr uint64_t kK2048Lo = 0x11542778a;  // x^(2048+32) mod P
constexpr uint64_t kK2048Hi = 0x1322d1430;  // x^(2048-32) mod P
constexpr uint64_t kK384Lo = 0x03db1ecdc;   // x^(384+32) mod P
constexpr uint64_t kK384Hi = 0x174359406;   // x^(384-32) mod P
constexpr uint64_t kK256Lo = 0x0f1da05aa;   // x^(256+32) mod P
constexpr uint64_t kK256Hi = 0x15a546366;   // x^(256-32) mod P

#define RNIC_AVX512_TARGET \
  __attribute__((target("avx512f,avx512vl,avx512bw,vpclmulqdq,pclmul,sse4.1")))

RNIC_AVX512_TARGET inline __m512i fold512(__m512i z, __m512i k, __m512i next) {
  __m512i lo = _mm512_clmulepi64_epi128(z, k, 0x00);
  __m512i hi = _mm512_clmulepi64_epi128(z, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, next, 0x96);  // lo ^ hi ^ next
}

RNIC_AVX512_TARGET inline __m512i load512(const uint8_t* q) { return _mm512_loadu_si512(q); }

RNIC_AVX512_TARGET inline __m512i bcast(uint64_t hi, uint64_t lo) {
  // maskz forms: GCC 12 warns (-Wuninitialized) on the unmasked ones' undefined source.
  return _mm512_maskz_broadcast_i32x4(
      0xffff,
      _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo)));
}

// CRC register update over n >= 256 bytes, n % 16 == 0.
RNIC_AVX512_TARGET uint32_t crc32_vpclmul_blocks(uint32_t reg, const uint8_t* p, size_t n) {
  __m512i z0 = _mm512_xor_si512(load512(p), _mm512_zextsi128_si512(
                                             _mm_cvtsi32_si128(static_cast<int>(reg))));
  __m512i z1 = load512(p + 64), z2 = load512(p + 128), z3 = load512(p + 192);
  p += 256;
  n -= 256;
  const __m512i k2048 = bcast(kK2048Hi, kK2048Lo);
  while (n >= 256) {
    z0 = fold512(z0, k2048, load512(p));
    z1 = fold512(z1, k2048, load512(p + 64));
    z2 = fold512(z2, k2048, load512(p + 128));
    z3 = fold512(z3, k2048, load512(p + 192));
    p += 256;
    n -= 256;
  }
  const __m512i k512 = bcast(kK2, kK1);
  __m512i z = fold512(z0, k512, z1);
  z = fold512(z, k512, z2);
  z = fold512(z, k512, z3);
  while (n >= 64) {
    z = fold512(z, k512, load512(p));
    p += 64;
    n -= 64;
  }
  // Lanes 0..2 are 384/256/128 bits ahead of lane 3.
  const __m128i k384 = _mm_set_epi64x(static_cast<long long>(kK384Hi),
                                      static_cast<long long>(kK384Lo));
  const __m128i k256 = _mm_set_epi64x(static_cast<long long>(kK256Hi),
                                      static_cast<long long>(kK256Lo));
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kK4), static_cast<long long>(kK3));
  __m128i x = _mm512_maskz_extracti32x4_epi32(0xf, z, 3);
  x = fold(_mm512_maskz_extracti32x4_epi32(0xf, z, 0), k384, x);
  x = fold(_mm512_maskz_extracti32x4_epi32(0xf, z, 1), k256, x);
  x = fold(_mm512_maskz_extracti32x4_epi32(0xf, z, 2), k128, x);
  while (n >= 16) {
    x = fold(x, k128, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    n -= 16;
  }
  return reduce128(x);
}

bool cpu_has_vpclmul() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") &&
                          __builtin_cpu_supports("sse4.1");
  return has;
}

uint32_t crc32_vpclmul(uint32_t crc, const uint8_t* p, size_t n) {
  if (n < 256 || !cpu_has_vpclmul()) return crc32_pclmul(crc, p, n);
  size_t blocks = n & ~size_t{15};
  uint32_t reg = crc32_vpclmul_blocks(~crc, p, blocks);
  return crc32_slice8(~reg, p + blocks, n - blocks);
}
#endif

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
// ISA-L's AVX-512 CRC (crc32_gzip_refl_by16_10, taken for 256 B and more; ISA-L 2.30 as Debian
// 12 ships it) returns without VZEROUPPER, so the upper halves of the vector registers stay
// dirty. Every legacy-SSE instruction after it, ours or the compiler's, then pays a transition
// penalty: measured on a Xeon KVM guest, 64 B of struct copies went from 5 ns to 120 ns, and
// an ICRC of a 1 KiB packet from 33 ns to 140 ns. So each call is followed by one (a cycle).
const bool kAvx = [] {
#if defined(__x86_64__)
  __builtin_cpu_init();  // this may run before libgcc's own constructor
  return __builtin_cpu_supports("avx") != 0;
#else
  return false;
#endif
}();
inline uint32_t crc_isal(uint32_t crc, const uint8_t* p, size_t n) {
  crc = crc32_gzip_refl(crc, p, n);
#if defined(__x86_64__)
  if (kAvx) asm volatile("vzeroupper");
#endif
  return crc;
}
#endif

// Default, chosen by tests/bench/icrc_bench (medians, GiB/s at 64 B / 1 KiB / 4 KiB, AMD EPYC
// with AVX-512): ISA-L 3.9/30.9/42.7, own VPCLMULQDQ 2.9/29.7/45.7, own PCLMULQDQ 3.0/6.0/6.4,
// zlib 0.45/2.6/3.1, slice-by-8 2.0/2.0/2.0. ISA-L wins small packets and ties at 1 KiB, so it
// is the default when built; otherwise own VPCLMULQDQ -> PCLMULQDQ -> slice-by-8 by CPU.
inline uint32_t crc_default(uint32_t crc, const uint8_t* p, size_t n) {
#if defined(SOFTRNIC_HAVE_ISAL)
  return crc_isal(crc, p, n);
#elif defined(__x86_64__)
  return crc32_vpclmul(crc, p, n);  // falls back to PCLMULQDQ, then slice-by-8, by CPU
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
    case Crc32Impl::kPclmul: return "pclmul";
    case Crc32Impl::kVpclmul: return "vpclmul";
  }
  return "?";
}

bool crc32_impl_available(Crc32Impl impl) {
  switch (impl) {
    case Crc32Impl::kZlib: return true;
    case Crc32Impl::kSlice8: return true;
#if defined(SOFTRNIC_HAVE_ISAL)
    case Crc32Impl::kIsal: return true;
#else
    case Crc32Impl::kIsal: return false;
#endif
#if defined(__x86_64__)
    case Crc32Impl::kPclmul: return cpu_has_pclmul();
    case Crc32Impl::kVpclmul: return cpu_has_vpclmul();
#else
    case Crc32Impl::kPclmul: return false;
    case Crc32Impl::kVpclmul: return false;
#endif
  }
  return false;
}

uint32_t crc32_update(Crc32Impl impl, uint32_t crc, std::span<const uint8_t> d) {
  switch (impl) {
    case Crc32Impl::kZlib: return crc32_zlib(crc, d.data(), d.size());
#if defined(SOFTRNIC_HAVE_ISAL)
    case Crc32Impl::kIsal: return crc_isal(crc, d.data(), d.size());
#endif
#if defined(__x86_64__)
    case Crc32Impl::kPclmul: return crc32_pclmul(crc, d.data(), d.size());
    case Crc32Impl::kVpclmul: return crc32_vpclmul(crc, d.data(), d.size());
#endif
    default: return crc32_slice8(crc, d.data(), d.size());
  }
}

Crc32Impl crc32_default_impl() {
#if defined(SOFTRNIC_HAVE_ISAL)
  return Crc32Impl::kIsal;
#elif defined(__x86_64__)
  if (cpu_has_vpclmul()) return Crc32Impl::kVpclmul;
  return cpu_has_pclmul() ? Crc32Impl::kPclmul : Crc32Impl::kSlice8;
#else
  return Crc32Impl::kSlice8;
#endif
}

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
  // A small packet's rest (past the BTH: an ACK's AETH, a 64 B WRITE's RETH and payload) is
  // copied behind the pseudo header, so its ICRC is one CRC call, not two: a call's fixed cost
  // (~10 ns here) is most of a small packet's ICRC, and an RC message sends and checks four.
  constexpr size_t kOnePass = 192;
  alignas(16) uint8_t buf[kIpv6HdrBytes + kUdpHdrBytes + kBthBytes + kOnePass];
  size_t n = build_pseudo(meta, roce.size() + kIcrcBytes, roce.data(), buf);
  // Skip the constant prefix bytes already folded into kCrcPrefixV4/V6.
  size_t skip = meta.ipv6 ? sizeof(kPrefixV6) - 8 : sizeof(kPrefixV4) - 8;
  const uint32_t prefix = meta.ipv6 ? kCrcPrefixV6 : kCrcPrefixV4;
  const size_t rest = roce.size() - kBthBytes;
  if (rest <= kOnePass) {
    std::memcpy(buf + n, roce.data() + kBthBytes, rest);
    return crc_default(prefix, buf + skip, n - skip + rest);
  }
  uint32_t crc = crc_default(prefix, buf + skip, n - skip);
  return crc_default(crc, roce.data() + kBthBytes, rest);
}

bool icrc_check(const IpUdpMeta& meta, std::span<const uint8_t> r) {
  if (r.size() < kBthBytes + kIcrcBytes) return false;
  return icrc_compute(meta, r.first(r.size() - kIcrcBytes)) ==
         load_le32(r.data() + r.size() - kIcrcBytes);
}

namespace {

// ---- The ICRC as an affine function of the IPv4 ID (docs/wire.md §3) ----
// For two pseudo packets of one length, crc(A) ^ crc(B) is the raw CRC register (start 0, no
// final inversion) of A ^ B. Changing only the ID (bytes 4..5 of the IPv4 header) therefore
// changes the ICRC by L(id) = raw(id bytes) * x^(8 * n_after) mod P, where n_after counts the
// pseudo-packet bytes behind the ID field. L is linear in the 16 ID bits, so one CRC pass over
// the packet (with ID 0) answers every candidate ID.

constexpr uint32_t kPolyRefl = 0xEDB88320u;

// a * b mod P over GF(2), both in the reflected representation (bit 31 is x^0).
constexpr uint32_t gf2_mulmod(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) p ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPolyRefl : b >> 1;
  }
  return p;
}

// kPow8[j] = x^(8 * 2^j) mod P (reflected).
constexpr std::array<uint32_t, 32> make_pow8() {
  std::array<uint32_t, 32> t{};
  t[0] = 1u << (31 - 8);  // x^8
  for (size_t j = 1; j < t.size(); ++j) t[j] = gf2_mulmod(t[j - 1], t[j - 1]);
  return t;
}
constexpr std::array<uint32_t, 32> kPow8 = make_pow8();

// x^(8n) mod P: the effect of appending n zero bytes to a raw CRC register.
uint32_t zeros_operator(uint64_t n) {
  uint32_t r = 1u << 31;  // x^0
  for (size_t j = 0; n != 0 && j < kPow8.size(); ++j, n >>= 1)
    if (n & 1u) r = gf2_mulmod(r, kPow8[j]);
  return r;
}

// Raw CRC register after the two big-endian ID bytes of `id` from register 0.
uint32_t raw_id_register(uint16_t id) {
  const uint8_t b[2] = {static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id)};
  return ~crc32_update(Crc32Impl::kSlice8, 0xFFFFFFFFu, std::span<const uint8_t>(b, 2));
}

// The ICRC difference of each ID bit for a RoCE body (without ICRC) of body_len bytes behind
// an option-less IPv4 header: 14 header bytes after the ID field, the UDP header, the body.
struct IdBasis {
  uint32_t bit[16];
  // Branch-free: the ID bits of successive GSO segments look random to a branch predictor.
  uint32_t of(uint16_t id) const {
    uint32_t d = 0;
    for (int i = 0; i < 16; ++i) d ^= bit[i] & (0u - ((uint32_t{id} >> i) & 1u));
    return d;
  }
};
IdBasis id_basis(size_t body_len) {
  const uint32_t shift = zeros_operator(uint64_t{kIpv4HdrBytes - 6} + kUdpHdrBytes + body_len);
  IdBasis b;
  for (int i = 0; i < 16; ++i)
    b.bit[i] = gf2_mulmod(raw_id_register(static_cast<uint16_t>(1u << i)), shift);
  return b;
}

// id_basis through a small per-thread cache by length: computing a basis costs ~30 carry-less
// multiplications of 32 steps each (about a microsecond, more than the ICRC pass of a 4 KiB
// packet), and a stream has a few lengths (its MTU's, its tails). Every GSO segment after the
// first carries a nonzero ID, so without the cache nearly every received packet of a bulk
// transfer paid it (perf: ~6% of ib_send_bw's CPU).
IdBasis id_basis_cached(size_t body_len) {
  struct Slot {
    size_t len = SIZE_MAX;
    IdBasis b{};
  };
  thread_local Slot slots[8];
  Slot& s = slots[(body_len ^ (body_len >> 3)) & 7];
  if (s.len != body_len) {
    s.b = id_basis(body_len);
    s.len = body_len;
  }
  return s.b;
}

// The one ID with basis.of(id) == rhs, or nullopt (none; a CRC-32 makes the 16 columns
// independent, so there is never more than one, which the rank check confirms).
std::optional<uint16_t> solve_id(const IdBasis& basis, uint32_t rhs) {
  // One equation per CRC bit j: sum_i bit[i]_j * x_i = rhs_j. Row = 16 coefficients + rhs.
  uint32_t rows[32];
  for (int j = 0; j < 32; ++j) {
    uint32_t row = 0;
    for (int i = 0; i < 16; ++i) row |= ((basis.bit[i] >> j) & 1u) << i;
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
  if (rank != 16) return std::nullopt;  // more than one solution: refuse
  uint16_t id = 0;
  for (int k = 0; k < rank; ++k) {
    if (rows[k] & (1u << 16)) id = static_cast<uint16_t>(id | (1u << pivot_col[k]));
  }
  return id;
}

}  // namespace

const char* icrc_match_name(IcrcMatch m) {
  switch (m) {
    case IcrcMatch::kNone: return "none";
    case IcrcMatch::kIdZero: return "id_zero";
    case IcrcMatch::kIdHint: return "id_hint";
    case IcrcMatch::kIdSolved: return "id_solved";
  }
  return "?";
}

uint32_t icrc_id_delta(size_t body_len, uint16_t id) {
  return id_basis_cached(body_len).of(id);
}

IcrcVerdict icrc_verify_rx(const IpUdpMeta& meta, std::span<const uint8_t> r,
                           std::optional<uint16_t> hint, bool solve) {
  if (r.size() < kBthBytes + kIcrcBytes) return {};
  auto body = r.first(r.size() - kIcrcBytes);
  const uint32_t want = load_le32(r.data() + r.size() - kIcrcBytes);
  IpUdpMeta m = meta;
  const bool try_hint = !meta.ipv6 && hint && *hint != 0;
  // The one pass over the packet is made with the hint when there is one: a GSO segment after
  // the first (the bulk of a transfer) then verifies without the ID basis.
  m.ip_id = try_hint ? *hint : 0;
  const uint32_t c = icrc_compute(m, body);
  if (c == want) {
    return try_hint ? IcrcVerdict{IcrcMatch::kIdHint, *hint} : IcrcVerdict{IcrcMatch::kIdZero, 0};
  }
  if (meta.ipv6) return {};  // no ID to vary
  if (!try_hint && !solve) return {};
  const IdBasis basis = id_basis_cached(body.size());
  const uint32_t c0 = try_hint ? c ^ basis.of(*hint) : c;  // the CRC with ID 0
  if (try_hint && c0 == want) return {IcrcMatch::kIdZero, 0};
  if (!solve) return {};
  if (std::optional<uint16_t> id = solve_id(basis, want ^ c0))
    return {IcrcMatch::kIdSolved, *id};
  return {};
}

std::optional<uint16_t> icrc_solve_ip_id(const IpUdpMeta& meta, std::span<const uint8_t> r) {
  IcrcVerdict v = icrc_verify_rx(meta, r, meta.ip_id, true);
  if (v.match == IcrcMatch::kNone) return std::nullopt;
  return v.ip_id;
}

}  // namespace rnic::wire
