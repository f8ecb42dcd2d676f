// Build and parse RoCEv2 packets: IB transport (BTH + extension headers + payload + pad + ICRC),
// optionally wrapped in IPv4/IPv6 + UDP(4791) and Ethernet (with one optional 802.1Q tag).
// Parse validates every length once, returns a named ParseError, never reads out of bounds,
// never throws, and leaves *out (and *meta) untouched unless it returns kOk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/hdr.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace rnic::wire {

// Every field of every header the opcode table knows. Fields of headers the opcode does not
// carry are ignored by build and zeroed by decode. pad_cnt is computed by build from the payload.
struct PacketFields {
  // BTH
  uint8_t opcode = 0;
  bool se = false;
  bool mig = false;
  uint8_t pad_cnt = 0;
  uint8_t tver = kTver;
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;
  bool becn = false;
  uint32_t dest_qp = 0;
  bool ack_req = false;
  uint32_t psn = 0;
  // RETH / AtomicETH (va, rkey shared)
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_len = 0;
  // AETH
  uint8_t syndrome = 0;
  uint32_t msn = 0;
  // AtomicETH
  uint64_t swap_add = 0;
  uint64_t compare = 0;
  // AtomicAckETH
  uint64_t orig = 0;
  // DETH
  uint32_t qkey = 0;
  uint32_t src_qp = 0;
  // ImmDt
  uint32_t imm = 0;
  // IETH
  uint32_t inv_rkey = 0;
  // XRCETH
  uint32_t xrc_srqn = 0;
  // FETH
  uint8_t flush_sel = 0;
  uint8_t flush_plt = 0;
  // Payload (without pad); set by decode, ignored by build (which takes the payload separately).
  std::span<const uint8_t> payload;

  bool operator==(const PacketFields& o) const;  // compares payload bytes, not pointers
};

enum class ParseError : uint8_t {
  kOk,
  kTooShort,          // fewer bytes than BTH + ICRC
  kBadTver,           // BTH TVer != 0
  kUnknownOpcode,     // no row in the opcode table
  kTruncatedHeader,   // fewer bytes than the opcode's extension headers + ICRC
  kPadMismatch,       // pad count larger than payload area, or packet not a multiple of 4 bytes
  kBadLength,         // payload length illegal for opcode (payload on ACK/READ_REQ/CNP, ...)
  kBadIcrc,
  kBadIpHeader,       // bad version/IHL/total length, IPv4 reserved flag set, IP/Ethertype clash
  kIpFragment,        // IPv4 MF set or fragment offset != 0
  kNotUdp,
  kBadUdpLength,      // UDP length disagrees with IP length
  kWrongPort,         // UDP destination port != 4791
  kNotIp,             // Ethernet type is not IPv4/IPv6 (after an optional VLAN tag)
  kNumParseErrors,
};
const char* parse_error_name(ParseError e);  // "kOk", "kTooShort", ...

// A parsed RoCE packet: pointers into the caller's buffer, valid while it is.
struct PacketView {
  const OpcodeInfo* info = nullptr;
  uint8_t opcode = 0;
  const uint8_t* hdr = nullptr;      // first byte of BTH
  size_t hdr_len = 0;                // == info->length
  const uint8_t* payload = nullptr;  // first payload byte (== hdr + hdr_len)
  size_t payload_len = 0;            // without pad
  uint8_t pad = 0;
  uint32_t icrc = 0;                 // ICRC as on the wire (little-endian load of the trailer)
  const uint8_t* roce = nullptr;     // == hdr; roce_len covers BTH..ICRC
  size_t roce_len = 0;

  bool has(uint32_t mask) const { return info->mask & mask; }
  ConstBth bth() const { return ConstBth(hdr); }
  // Extension header views: only meaningful when has(k<Hdr>Mask).
  ConstReth reth() const { return ConstReth(hdr + info->offset[kHdrReth]); }
  ConstAeth aeth() const { return ConstAeth(hdr + info->offset[kHdrAeth]); }
  ConstAtomicEth atomic_eth() const { return ConstAtomicEth(hdr + info->offset[kHdrAtmEth]); }
  ConstAtomicAckEth atomic_ack_eth() const {
    return ConstAtomicAckEth(hdr + info->offset[kHdrAtmAck]);
  }
  ConstDeth deth() const { return ConstDeth(hdr + info->offset[kHdrDeth]); }
  ConstImmDt immdt() const { return ConstImmDt(hdr + info->offset[kHdrImmDt]); }
  ConstIeth ieth() const { return ConstIeth(hdr + info->offset[kHdrIeth]); }
  ConstFeth feth() const { return ConstFeth(hdr + info->offset[kHdrFeth]); }
  ConstXrcEth xrceth() const { return ConstXrcEth(hdr + info->offset[kHdrXrcEth]); }
  std::span<const uint8_t> payload_span() const { return {payload, payload_len}; }
  std::span<const uint8_t> roce_span() const { return {roce, roce_len}; }
  // Every header field plus the payload span.
  PacketFields fields() const;
};

// udp_payload: BTH .. ICRC. Validates lengths; does NOT check the ICRC (needs IP/UDP data: use
// icrc_check(meta, udp_payload) or parse_ip_datagram(..., check_icrc=true)).
// allow_one_copy: also accept TVer kTverOneCopy (the caller resolves the descriptor payload).
ParseError parse_roce(std::span<const uint8_t> udp_payload, PacketView* out,
                      bool allow_one_copy = false);

// ip: one IPv4 or IPv6 datagram (trailing bytes after the IP total length are ignored, e.g.
// Ethernet padding). Requires UDP to port 4791. The IPv4 header checksum is NOT verified
// (captures taken on a sending host often show offloaded, unfilled checksums; the kernel checks
// received ones). meta (may be nullptr) receives addresses, ports, ID, DF, TOS, TTL, flow label.
ParseError parse_ip_datagram(std::span<const uint8_t> ip, PacketView* out, IpUdpMeta* meta,
                             bool check_icrc);

// frame: Ethernet II, optionally one 802.1Q/802.1ad tag, then as parse_ip_datagram().
ParseError parse_ethernet_frame(std::span<const uint8_t> frame, PacketView* out, IpUdpMeta* meta,
                                bool check_icrc);

// Bytes build_roce() writes for this opcode and payload length (0 if the opcode is unknown).
size_t roce_size(uint8_t opcode, size_t payload_len);

// ---- The packet writer ----
// The one place RoCE transport bytes are written: the requester and responder (emu/transport)
// call it on their send-batch slots, build_roce() and everything built on it (the fault
// engine, tests, captures) too. Two steps so the payload lands in place without a staging
// copy and the ICRC is computed once:
//   size_t hl = write_roce_headers(buf, f, n);   // BTH + extension headers
//   <caller copies n payload bytes to buf + hl>  // gather from SGEs, memory, a span
//   size_t len = finish_roce(buf, hl, n, meta);  // pad (zeros) + ICRC
// Caller-provided buffer of at least roce_len(hl, n) bytes; no allocation, no locks.

// Bytes on the wire for hdr_len header bytes and payload_len payload bytes: headers, payload,
// pad to a multiple of 4 (IBA 9.2: PadCnt) and the 4-byte ICRC.
constexpr size_t roce_len(size_t hdr_len, size_t payload_len) {
  return hdr_len + payload_len + (4 - payload_len % 4) % 4 + kIcrcBytes;
}

// Writes the BTH and every extension header opcode f.opcode carries (opcode table) at out,
// with pad_cnt computed from payload_len (f.pad_cnt is ignored). Returns the header length
// (opcode_info(f.opcode).length), or 0 if the opcode is unknown or payload_len is not allowed
// for it (payload on an ACK / READ request, ATOMIC_WRITE without exactly 8 bytes).
size_t write_roce_headers(uint8_t* out, const PacketFields& f, size_t payload_len);

// Zeroes the pad after out[hdr_len + payload_len) and appends the ICRC over BTH .. pad,
// computed with meta but IPv4 ID ip_id (segment k of a GSO run leaves with ID k: the caller
// passes the ID its packet will carry, e.g. TxBatch::ip_id_for). Returns roce_len(hdr_len,
// payload_len).
size_t finish_roce(uint8_t* out, size_t hdr_len, size_t payload_len, const IpUdpMeta& meta,
                   uint16_t ip_id);
inline size_t finish_roce(uint8_t* out, size_t hdr_len, size_t payload_len,
                          const IpUdpMeta& meta) {
  return finish_roce(out, hdr_len, payload_len, meta, meta.ip_id);
}

// Writes BTH + extension headers + payload + pad (zeros) + ICRC (computed with meta) into out:
// the writer above with the payload copied from a span. Returns bytes written, or 0 if out is
// too small, the opcode is unknown, or the payload is not allowed for the opcode.
size_t build_roce(std::span<uint8_t> out, const PacketFields& f,
                  std::span<const uint8_t> payload, const IpUdpMeta& meta);

// The 40-byte GRH area a UD receive buffer starts with (IBA 11.4.1.2 Post Receive;
// docs/wire.md §5), for a received datagram whose IP/UDP headers meta describes and whose UDP
// payload (BTH .. ICRC) is roce_bytes long. IPv4: 20 zero bytes, then the IPv4 header exactly as
// build_ip_datagram() writes it (meta.tos/ip_id/df/ttl, protocol 17, checksum). IPv6: the
// IPv6 header (traffic class, flow label, hop limit, next header 17). Returns false (and
// writes nothing) if the lengths do not fit an IP header.
bool write_grh_image(std::span<uint8_t, 40> out, const IpUdpMeta& meta, size_t roce_bytes);

// As build_roce() but preceded by an IPv4 header (IHL 5, meta.tos/ttl/ip_id/df, protocol 17,
// correct header checksum) or IPv6 header (traffic class, flow label, hop limit, next header 17)
// and a UDP header (checksum 0 on IPv4; on IPv6 the real checksum, which Wireshark expects).
size_t build_ip_datagram(std::span<uint8_t> out, const PacketFields& f,
                         std::span<const uint8_t> payload, const IpUdpMeta& meta);

// As build_ip_datagram() preceded by an untagged Ethernet II header (type 0x0800/0x86dd).
size_t build_ethernet_frame(std::span<uint8_t> out, const uint8_t dst_mac[6],
                            const uint8_t src_mac[6], const PacketFields& f,
                            std::span<const uint8_t> payload, const IpUdpMeta& meta);

// Internet checksum (RFC 1071) of data, folded and complemented.
uint16_t inet_checksum(std::span<const uint8_t> data);

}  // namespace rnic::wire
