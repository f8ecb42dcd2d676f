// pcap_icrc_check: reads a classic pcap (Ethernet link type) with wire::PcapReader and checks
// that every frame parses as RoCEv2 and its ICRC verifies. Exit 0 and a summary line when all
// pass; exit 1 naming the first bad frame (1-based, as tshark numbers them); 2 on usage/IO.
// The ICRC is verified over the headers as captured, with the IP header's real ID.
//   pcap_icrc_check FILE [--min N] [--min-ipv6 N] [--max-retrans-pct P]
//     --min: also fail when fewer than N frames
//     --min-ipv6: also fail when fewer than N frames are IPv6 (the ICRC over the IPv6 header,
//       traffic class, flow label and hop limit masked: IBA A17.4.5.1)
//     --max-retrans-pct: a frame whose (IP source, IP destination, dest QP, opcode, PSN) was
//       seen before is a retransmission; report their share of the RoCE bytes and fail above P
//   It also reports how many frames carried a non-zero IP ID and a zero UDP checksum.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <tuple>

#include "wire/packet.h"
#include "wire/pcap.h"

int main(int argc, char** argv) {
  unsigned long min_frames = 1, min_v6 = 0;
  double max_retrans_pct = -1;
  const char* file = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--min") == 0 && i + 1 < argc) {
      min_frames = std::strtoul(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--min-ipv6") == 0 && i + 1 < argc) {
      min_v6 = std::strtoul(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--max-retrans-pct") == 0 && i + 1 < argc) {
      max_retrans_pct = std::strtod(argv[++i], nullptr);
    } else if (file == nullptr && argv[i][0] != '-') {
      file = argv[i];
    } else {
      file = nullptr;
      break;
    }
  }
  if (file == nullptr) {
    std::fprintf(stderr, "usage: pcap_icrc_check FILE [--min N] [--min-ipv6 N] [--max-retrans-pct P]\n");
    return 2;
  }
  int err = 0;
  auto rd = rnic::wire::PcapReader::open(file, &err);
  if (!rd) {
    std::fprintf(stderr, "pcap_icrc_check: cannot read %s: %s\n", file, std::strerror(err));
    return 2;
  }
  if (rd->linktype() != 1) {
    std::fprintf(stderr, "pcap_icrc_check: %s: link type %u, want 1 (Ethernet)\n", file,
                 rd->linktype());
    return 1;
  }
  rnic::wire::PcapFrame fr;
  unsigned long n = 0, nonzero_id = 0, zero_udp_csum = 0, v6 = 0;
  uint64_t bytes = 0, retrans_bytes = 0;
  unsigned long retrans = 0;
  std::set<std::tuple<std::string, std::string, uint32_t, uint8_t, uint32_t>> seen;
  while (rd->next(fr)) {
    ++n;
    if (fr.orig_len != fr.data.size()) {
      std::fprintf(stderr, "pcap_icrc_check: frame %lu: truncated capture (%zu of %u bytes)\n",
                   n, fr.data.size(), fr.orig_len);
      return 1;
    }
    rnic::wire::PacketView pv;
    rnic::wire::IpUdpMeta meta;
    // Parse first without the ICRC so a structural error is named as such.
    auto pe = rnic::wire::parse_ethernet_frame(fr.data, &pv, &meta, false);
    if (pe != rnic::wire::ParseError::kOk) {
      std::fprintf(stderr, "pcap_icrc_check: frame %lu: parse error %s\n", n,
                   rnic::wire::parse_error_name(pe));
      return 1;
    }
    pe = rnic::wire::parse_ethernet_frame(fr.data, &pv, &meta, true);
    if (pe != rnic::wire::ParseError::kOk) {
      std::fprintf(stderr, "pcap_icrc_check: frame %lu: ICRC check failed (%s), %zu bytes\n", n,
                   rnic::wire::parse_error_name(pe), fr.data.size());
      return 1;
    }
    if (meta.ip_id != 0) ++nonzero_id;
    // UDP checksum: the 2 bytes before the BTH (the UDP header ends where the RoCE part starts).
    if (pv.roce != nullptr && pv.roce >= fr.data.data() + 2 && pv.roce[-2] == 0 && pv.roce[-1] == 0)
      ++zero_udp_csum;
    if (meta.ipv6) ++v6;
    const size_t alen = meta.ipv6 ? 16 : 4;
    auto key = std::make_tuple(std::string(reinterpret_cast<const char*>(meta.src), alen),
                               std::string(reinterpret_cast<const char*>(meta.dst), alen),
                               pv.bth().dest_qp(), pv.opcode, pv.bth().psn());
    bytes += pv.roce_len;
    if (!seen.insert(key).second) {
      ++retrans;
      retrans_bytes += pv.roce_len;
    }
  }
  if (n < min_frames) {
    std::fprintf(stderr, "pcap_icrc_check: %s: %lu frames, want at least %lu\n", argv[1], n,
                 min_frames);
    return 1;
  }
  if (v6 < min_v6) {
    std::fprintf(stderr, "pcap_icrc_check: %s: %lu IPv6 frames, want at least %lu\n", argv[1], v6,
                 min_v6);
    return 1;
  }
  const double pct = bytes != 0 ? 100.0 * double(retrans_bytes) / double(bytes) : 0.0;
  std::printf("pcap_icrc_check: %s: %lu frames (%lu IPv6), all parse, all ICRCs verify; %lu with a non-zero "
              "IP ID, %lu with UDP checksum 0; retransmitted %lu frames, %llu of %llu RoCE bytes "
              "(%.2f%%)\n",
              file, n, v6, nonzero_id, zero_udp_csum, retrans,
              static_cast<unsigned long long>(retrans_bytes),
              static_cast<unsigned long long>(bytes), pct);
  if (max_retrans_pct >= 0 && pct > max_retrans_pct) {
    std::fprintf(stderr, "pcap_icrc_check: %s: %.2f%% retransmitted bytes, more than %.2f%%\n",
                 file, pct, max_retrans_pct);
    return 1;
  }
  return 0;
}
