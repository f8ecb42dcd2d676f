// RoCEv2 Invariant CRC (ICRC) generate/check over IPv4/IPv6 + UDP + IB transport, per DESIGN.md
// "Wire rules": CRC-32 over 8 bytes 0xFF, the IP header with TOS/TTL/checksum (v4) or traffic
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

// IP-ID policy for received IPv4 packets (the socket does not show the ID): verify with
// meta.ip_id first (normally 0, which is what Linux peers send with DF on an unconnected
// socket, and what hardware RNICs observed in the golden captures send). If that fails, the
// CRC is affine in the 16 ID bits, so solve the 32x16 GF(2) system for the ID that makes the
// ICRC match. Returns that ID if exactly one exists, std::nullopt otherwise (corrupt packet).
// A match by solving accepts a random corruption with probability ~2^-16, so the receive path
// should only use this for peers known to set IDs. IPv6 has no ID: returns nullopt on failure.
std::optional<uint16_t> icrc_solve_ip_id(const IpUdpMeta& meta,
                                         std::span<const uint8_t> roce_with_icrc);

}  // namespace rnic::wire
