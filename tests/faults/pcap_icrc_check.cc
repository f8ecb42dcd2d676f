// pcap_icrc_check: reads a classic pcap (Ethernet link type) with wire::PcapReader and checks
// that every frame parses as RoCEv2 and its ICRC verifies. Exit 0 and a summary line when all
// pass; exit 1 naming the first bad frame (1-based, as tshark numbers them); 2 on usage/IO.
//   pcap_icrc_check FILE [--min N]    (--min: also fail when fewer than N frames)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "wire/packet.h"
#include "wire/pcap.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: pcap_icrc_check FILE [--min N]\n");
    return 2;
  }
  unsigned long min_frames = 1;
  if (argc == 4) {
    if (std::strcmp(argv[2], "--min") != 0) {
      std::fprintf(stderr, "usage: pcap_icrc_check FILE [--min N]\n");
      return 2;
    }
    min_frames = std::strtoul(argv[3], nullptr, 10);
  }
  int err = 0;
  auto rd = rnic::wire::PcapReader::open(argv[1], &err);
  if (!rd) {
    std::fprintf(stderr, "pcap_icrc_check: cannot read %s: %s\n", argv[1], std::strerror(err));
    return 2;
  }
  if (rd->linktype() != 1) {
    std::fprintf(stderr, "pcap_icrc_check: %s: link type %u, want 1 (Ethernet)\n", argv[1],
                 rd->linktype());
    return 1;
  }
  rnic::wire::PcapFrame fr;
  unsigned long n = 0;
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
  }
  if (n < min_frames) {
    std::fprintf(stderr, "pcap_icrc_check: %s: %lu frames, want at least %lu\n", argv[1], n,
                 min_frames);
    return 1;
  }
  std::printf("pcap_icrc_check: %s: %lu frames, all parse, all ICRCs verify\n", argv[1], n);
  return 0;
}
