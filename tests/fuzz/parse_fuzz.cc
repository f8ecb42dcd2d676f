// libFuzzer target for the RoCEv2 parser: feeds the input as an Ethernet frame, an IP datagram
// and a bare UDP payload; every successful parse must rebuild to a packet that parses to the
// same fields with a valid ICRC; the CRC-32 implementations must agree. Built by scripts/fuzz.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "wire/icrc.h"
#include "wire/packet.h"

using namespace rnic::wire;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// A parsed packet rebuilt from its decoded fields must parse back to the same fields.
void round_trip(const PacketView& v, const IpUdpMeta& meta, bool via_ip) {
  PacketFields f = v.fields();
  check(f.opcode == v.opcode && v.info == &opcode_info(v.opcode));
  check(v.payload_len + v.pad + v.hdr_len + kIcrcBytes == v.roce_len);
  std::vector<uint8_t> buf(v.roce_len + 64);
  PacketView w;
  if (via_ip) {
    size_t n = build_ip_datagram(buf, f, v.payload_span(), meta);
    check(n > 0);
    IpUdpMeta m2;
    check(parse_ip_datagram({buf.data(), n}, &w, &m2, true) == ParseError::kOk);
    check(m2.src_port == meta.src_port && m2.ipv6 == meta.ipv6);
  } else {
    size_t n = build_roce(buf, f, v.payload_span(), meta);
    check(n == v.roce_len);
    check(parse_roce({buf.data(), n}, &w) == ParseError::kOk);
    check(icrc_check(meta, {buf.data(), n}));
  }
  check(w.fields() == f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  PacketView v;
  IpUdpMeta meta;
  for (bool check_icrc : {false, true}) {
    ParseError e = parse_ethernet_frame(in, &v, &meta, check_icrc);
    check(parse_error_name(e) != nullptr);
    if (e == ParseError::kOk) {
      round_trip(v, meta, true);
      // The socket-side fast form assumes an IPv4 header without options (IHL 5).
      const uint8_t* ip_start = v.roce - kUdpHdrBytes - kIpv4HdrBytes;
      if (!meta.ipv6 && ip_start >= data && ip_start[0] == 0x45) {
        auto id = icrc_solve_ip_id(meta, v.roce_span());
        if (check_icrc) check(id.has_value() && *id == meta.ip_id);
      }
    }
  }
  if (parse_ip_datagram(in, &v, &meta, true) == ParseError::kOk) round_trip(v, meta, true);
  if (size > 14 && parse_ip_datagram(in.subspan(14), &v, &meta, false) == ParseError::kOk) {
    round_trip(v, meta, true);
  }
  IpUdpMeta plain;
  if (parse_roce(in, &v) == ParseError::kOk) round_trip(v, plain, false);
  if (size > 42 && parse_roce(in.subspan(42), &v) == ParseError::kOk) round_trip(v, plain, false);
  // ICRC helpers never read out of bounds on arbitrary input.
  (void)icrc_compute(in);
  (void)icrc_check(in);
  (void)icrc_check(plain, in);
  // Differential check of the CRC-32 implementations.
  uint32_t ref = crc32_update(Crc32Impl::kZlib, 0, in);
  for (Crc32Impl impl : {Crc32Impl::kIsal, Crc32Impl::kSlice8, Crc32Impl::kPclmul,
                          Crc32Impl::kVpclmul}) {
    if (crc32_impl_available(impl)) check(crc32_update(impl, 0, in) == ref);
  }
  return 0;
}
