// RoCEv2 Invariant CRC (ICRC) generate/check over IPv4/IPv6 + UDP + IB transport, per docs/wire.md
// §2: CRC-32 over 8 bytes 0xFF, the IP header with TOS/TTL/checksum (v4) or traffic
// class/flow label/hop limit (v6) set to ones, UDP with checksum ones, BTH with byte 4 ones, then
// the rest. Value convention: an ICRC is a uint32_t whose little-endian bytes are the 4 bytes on
// the wire (== standard zlib-style CRC-32 of the masked pseudo packet); compare with
// load_le32(trailer). Also: the CRC-32 implementations behind it, selectable for benchmarking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace rnic::wire {

// ---- CRC-32 (reflected poly 0xEDB88320, zlib convention: crc32_update(0, data) = CRC-32) ----
enum class Crc32Impl : uint8_t {
  kZlib,     // zlib crc32()
  kIsal,     // ISA-L crc32_gzip_refl() (only when built with SOFTRNIC_HAVE_ISAL)
  kSlice8,   // own table-driven slicing-by-8
  kPclmul,   // own carry-less-multiply folding (x86-64 with PCLMULQDQ + SSE4.1 at run time)
  kVpclmul,  // own AVX-512 VPCLMULQDQ folding for >= 256 B (else kPclmul); x86-64 at run time
};
const char* crc32_impl_name(Crc32Impl impl);
// False if the implementation is not compiled in or the CPU lacks the instructions.
bool crc32_impl_available(Crc32Impl impl);
// Continues a CRC: crc32_update(crc32_update(0, a), b) == CRC-32(a||b). Unavailable impls
// fall back to kSlice8.
uint32_t crc32_update(Crc32Impl impl, uint32_t crc, std::span<const uint8_t> data);
// The implementation used by icrc_*() (the fastest available one, chosen by benchmark).
Crc32Impl crc32_default_impl();
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data);

// ---- ICRC over a whole IP datagram ----
// ip_datagram: an IPv4 (any IHL) or IPv6 (no extension headers) datagram carrying UDP and
// RoCE, INCLUDING the trailing 4-byte ICRC slot. The IP total/payload length and UDP length are
// taken from the bytes as given. Computes over everything but the last 4 bytes.
// Returns 0 if the datagram is too short to contain IP+UDP+BTH+ICRC (caller validates first).
uint32_t icrc_compute(std::span<const uint8_t> ip_datagram);
// True iff the last 4 bytes equal icrc_compute(ip_datagram) (little-endian, see above).
bool icrc_check(std::span<const uint8_t> ip_datagram);

// ---- ICRC from socket metadata (the UDP socket hides the IP header) ----
struct IpUdpMeta {
  bool ipv6 = false;
  uint8_t src[16] = {};  // IPv4 in src[0..3], network order
  uint8_t dst[16] = {};
  uint16_t ip_id = 0;    // IPv4 identification (0: Linux with DF on an unconnected socket)
  bool df = true;        // IPv4 don't-fragment flag
  uint16_t src_port = 0;
  uint16_t dst_port = 4791;
  // Not covered by the ICRC (masked); used by build_ip_datagram() and filled by parse.
  uint8_t tos = 0;             // IPv4 TOS / IPv6 traffic class
  uint8_t ttl = 64;            // IPv4 TTL / IPv6 hop limit
  uint32_t flow_label = 0;     // IPv6 only (20 bits)
};

// roce: BTH .. payload .. pad, WITHOUT the ICRC. IP and UDP lengths are derived from its size
// (IPv4 header without options). Returns the ICRC to append.
uint32_t icrc_compute(const IpUdpMeta& meta, std::span<const uint8_t> roce);
// roce_with_icrc: BTH .. pad .. ICRC (a UDP payload as received). False if < BTH+ICRC bytes.
bool icrc_check(const IpUdpMeta& meta, std::span<const uint8_t> roce_with_icrc);

// ---- The receive-side IP-ID policy (docs/wire.md §3) ----
// A UDP socket does not show the IPv4 ID, which the ICRC covers; peers choose it (Linux with
// DF on an unconnected socket: 0; GSO segment k: k; hardware: incrementing, random or 0). The
// CRC is affine in the 16 ID bits, so after ONE pass over the packet (with ID 0) any candidate
// ID is checked, and the one ID that matches (if any) is solved for, in O(1).
enum class IcrcMatch : uint8_t {
  kNone,      // no ID makes the ICRC verify (or too short): corrupt, drop it
  kIdZero,    // verifies with ID 0 (IPv6: as given, there is no ID)
  kIdHint,    // verifies with the receive path's inferred ID (GRO segment k: base + k)
  kIdSolved,  // verifies with exactly one other ID, solved for (a peer choosing its own IDs)
};
const char* icrc_match_name(IcrcMatch m);
struct IcrcVerdict {
  IcrcMatch match = IcrcMatch::kNone;
  uint16_t ip_id = 0;  // the ID it verified with
};
// meta.ip_id is ignored. Tries ID 0, then `hint` (when set and non-zero), then (solve) solves
// the 32x16 GF(2) system, accepting exactly one solution. The residual risk of solving: a
// corrupted packet passes when the system happens to be consistent, probability ~2^-16 per
// corrupted packet (against ~2^-32 for a fixed ID); docs/wire.md §3 states why that is kept.
IcrcVerdict icrc_verify_rx(const IpUdpMeta& meta, std::span<const uint8_t> roce_with_icrc,
                           std::optional<uint16_t> hint, bool solve = true);
// ICRC(id) ^ ICRC(0) for a RoCE body (BTH .. pad, no ICRC) of body_len bytes behind an
// option-less IPv4 header (linear in id; exposed for tests).
uint32_t icrc_id_delta(size_t body_len, uint16_t id);
// icrc_verify_rx(meta, roce, meta.ip_id, true): the ID it verified with, or nullopt. IPv6:
// 0 when it verifies, else nullopt.
std::optional<uint16_t> icrc_solve_ip_id(const IpUdpMeta& meta,
                                         std::span<const uint8_t> roce_with_icrc);

}  // namespace rnic::wire
