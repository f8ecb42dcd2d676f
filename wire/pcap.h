// pcap capture of RoCEv2 traffic: PcapWriter writes whole Ethernet/IP/UDP/RoCE frames
// (LINKTYPE_ETHERNET) that Wireshark/tshark decode; PcapReader reads classic pcap back.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/port.h"

namespace rnic::wire {

inline constexpr uint32_t kLinktypeEthernet = 1;
inline constexpr size_t kEthHdrLen = 14;
inline constexpr size_t kIpv4HdrLen = 20;
inline constexpr size_t kIpv6HdrLen = 40;
inline constexpr size_t kUdpHdrLen = 8;

// "%p" -> process id, "%%" -> "%"; everything else verbatim.
std::string expand_pcap_path(std::string_view pattern);

// The made-up, locally administered unicast MAC for an address: 02:00:a.b.c.d for IPv4
// (02 + last five bytes for IPv6). Stable, so one host's frames always carry one MAC.
void mac_for(const Endpoint& e, uint8_t mac[6]);

// Builds the frame Ethernet + IPv4 (IHL 5, DSCP/ECN 0, ID ip_id, DF when df, TTL 64,
// correct header checksum) or IPv6 (hop limit 64, flow label 0) + UDP (src/dst ports from
// the endpoints; checksum 0 on IPv4, computed on IPv6 where it is mandatory) + roce
// (BTH .. ICRC, copied as is). Returns the frame length, or 0 if cap is too small or
// the datagram would exceed 65535 bytes. Allocation-free.
size_t build_frame(uint8_t* out, size_t cap, const Endpoint& src, const Endpoint& dst,
                   std::span<const uint8_t> roce, uint16_t ip_id = 0, bool df = true);

// Internet checksum (RFC 1071) of `data`, folded, not inverted, added to `sum`.
uint32_t inet_csum_add(uint32_t sum, std::span<const uint8_t> data);
uint16_t inet_csum_fold(uint32_t sum);  // returns ~folded sum (the value to store)

// Thread-safe pcap writer (one mutex per write). Microsecond timestamps, snaplen 65535.
// Not a hot-path object: the engine calls it only when capture is on.
class PcapWriter {
 public:
  // Opens (truncates) expand_pcap_path(pattern) and writes the global header.
  // nullptr and *err (errno) on failure.
  static std::unique_ptr<PcapWriter> open(std::string_view pattern, int* err = nullptr);
  ~PcapWriter();  // flushes and closes

  const std::string& path() const { return path_; }

  // Writes one frame built by build_frame(). ts_ns: wall-clock ns since the epoch,
  // 0 = now (CLOCK_REALTIME). Returns false on a write error or oversized packet.
  bool write_packet(const Endpoint& src, const Endpoint& dst, std::span<const uint8_t> roce,
                    uint16_t ip_id = 0, uint64_t ts_ns = 0);
  // Writes an already-built Ethernet frame.
  bool write_frame(std::span<const uint8_t> frame, uint64_t ts_ns = 0);
  void flush();
  void close();
  uint64_t packets() const;

 private:
  PcapWriter() = default;
  bool write_locked(std::span<const uint8_t> frame, uint64_t ts_ns);

  mutable std::mutex mu_;
  std::FILE* f_ = nullptr;
  std::string path_;
  uint64_t packets_ = 0;
  std::vector<uint8_t> frame_buf_;  // reused under mu_
};

// One frame read back.
struct PcapFrame {
  uint64_t ts_ns = 0;
  uint32_t orig_len = 0;
  std::vector<uint8_t> data;
};

// Minimal classic-pcap reader (both byte orders, microsecond or nanosecond magic). For
// tests and tools; pcapng is not supported (convert with `tshark -F pcap` or capture
// with `dumpcap -P`).
class PcapReader {
 public:
  static std::unique_ptr<PcapReader> open(const std::string& path, int* err = nullptr);
  ~PcapReader();
  uint32_t linktype() const { return linktype_; }
  // Next frame; false at end of file or on a truncated record.
  bool next(PcapFrame& out);

 private:
  PcapReader() = default;
  uint32_t rd32(const uint8_t* p) const;
  std::FILE* f_ = nullptr;
  bool swap_ = false;
  bool nanos_ = false;
  uint32_t linktype_ = 0;
};

}  // namespace rnic::wire
