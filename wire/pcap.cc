// pcap writer/reader and the Ethernet/IP/UDP frame builder used for captures.
#include "wire/pcap.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rnic::wire {

namespace {

void put16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}

// pcap headers are written in host byte order (readers detect it from the magic).
template <typename T>
void put_host(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

constexpr uint32_t kMagicUs = 0xa1b2c3d4;
constexpr uint32_t kMagicNs = 0xa1b23c4d;

}  // namespace

std::string expand_pcap_path(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(::getpid());
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

void mac_for(const Endpoint& e, uint8_t mac[6]) {
  mac[0] = 0x02;  // locally administered, unicast
  if (!e.ipv6) {
    mac[1] = 0x00;
    std::memcpy(mac + 2, e.addr, 4);
  } else {
    std::memcpy(mac + 1, e.addr + 11, 5);
  }
}

uint32_t inet_csum_add(uint32_t sum, std::span<const uint8_t> d) {
  size_t i = 0;
  for (; i + 1 < d.size(); i += 2) sum += uint32_t(d[i]) << 8 | d[i + 1];
  if (i < d.size()) sum += uint32_t(d[i]) << 8;
  return sum;
}

uint16_t inet_csum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(~sum);
}

size_t build_frame(uint8_t* out, size_t cap, const Endpoint& src, const Endpoint& dst,
                   std::span<const uint8_t> roce, uint16_t ip_id, bool df) {
  const bool v6 = src.ipv6;
  const size_t iph = v6 ? kIpv6HdrLen : kIpv4HdrLen;
  const size_t udp_len = kUdpHdrLen + roce.size();
  const size_t total = kEthHdrLen + iph + udp_len;
  if (udp_len > 65535 || (!v6 && iph + udp_len > 65535) || total > cap) return 0;

  // Ethernet II
  mac_for(dst, out);
  mac_for(src, out + 6);
  put16(out + 12, v6 ? 0x86dd : 0x0800);
  uint8_t* ip = out + kEthHdrLen;
  uint8_t* udp = ip + iph;
  if (!v6) {
    ip[0] = 0x45;  // version 4, IHL 5
    ip[1] = 0;     // DSCP/ECN
    put16(ip + 2, uint16_t(iph + udp_len));
    put16(ip + 4, ip_id);
    put16(ip + 6, df ? 0x4000 : 0);
    ip[8] = 64;  // TTL
    ip[9] = 17;  // UDP
    put16(ip + 10, 0);
    std::memcpy(ip + 12, src.addr, 4);
    std::memcpy(ip + 16, dst.addr, 4);
    put16(ip + 10, inet_csum_fold(inet_csum_add(0, std::span<const uint8_t>(ip, iph))));
  } else {
    ip[0] = 0x60;
    ip[1] = ip[2] = ip[3] = 0;  // traffic class 0, flow label 0
    put16(ip + 4, uint16_t(udp_len));
    ip[6] = 17;
    ip[7] = 64;  // hop limit
    std::memcpy(ip + 8, src.addr, 16);
    std::memcpy(ip + 24, dst.addr, 16);
  }
  put16(udp, src.port);
  put16(udp + 2, dst.port);
  put16(udp + 4, uint16_t(udp_len));
  put16(udp + 6, 0);
  if (!roce.empty()) std::memcpy(udp + kUdpHdrLen, roce.data(), roce.size());
  if (v6) {
    // RFC 8200 8.1: the UDP checksum is mandatory over IPv6 (pseudo-header + datagram).
    uint32_t s = 0;
    s = inet_csum_add(s, std::span<const uint8_t>(ip + 8, 32));
    s += uint32_t(udp_len >> 16) + uint32_t(udp_len & 0xffff);
    s += 17;
    s = inet_csum_add(s, std::span<const uint8_t>(udp, udp_len));
    uint16_t c = inet_csum_fold(s);
    put16(udp + 6, c == 0 ? 0xffff : c);
  }
  return total;
}

// ---- PcapWriter -----------------------------------------------------------------------

std::unique_ptr<PcapWriter> PcapWriter::open(std::string_view pattern, int* err) {
  int dummy;
  if (err == nullptr) err = &dummy;
  *err = 0;
  std::unique_ptr<PcapWriter> w(new PcapWriter());
  w->path_ = expand_pcap_path(pattern);
  // 0600: a capture holds every RDMA payload (issue 10 item 7). An existing file is
  // truncated and narrowed to 0600 as well (best effort: fchmod fails on another's file).
  int fd = ::open(w->path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    *err = errno;
    return nullptr;
  }
  (void)::fchmod(fd, 0600);
  w->f_ = ::fdopen(fd, "wb");
  if (w->f_ == nullptr) {
    *err = errno;
    ::close(fd);
    return nullptr;
  }
  std::vector<uint8_t> hdr;
  put_host<uint32_t>(hdr, kMagicUs);
  put_host<uint16_t>(hdr, 2);  // version 2.4
  put_host<uint16_t>(hdr, 4);
  put_host<int32_t>(hdr, 0);     // thiszone
  put_host<uint32_t>(hdr, 0);    // sigfigs
  put_host<uint32_t>(hdr, 65535);  // snaplen
  put_host<uint32_t>(hdr, kLinktypeEthernet);
  if (std::fwrite(hdr.data(), 1, hdr.size(), w->f_) != hdr.size()) {
    *err = errno ? errno : EIO;
    return nullptr;
  }
  w->frame_buf_.resize(kEthHdrLen + kIpv6HdrLen + kUdpHdrLen + 65535);
  return w;
}

PcapWriter::~PcapWriter() { close(); }

void PcapWriter::close() {
  std::lock_guard lk(mu_);
  if (f_ != nullptr) {
    std::fflush(f_);
    std::fclose(f_);
    f_ = nullptr;
  }
}

void PcapWriter::flush() {
  std::lock_guard lk(mu_);
  if (f_ != nullptr) std::fflush(f_);
}

uint64_t PcapWriter::packets() const {
  std::lock_guard lk(mu_);
  return packets_;
}

bool PcapWriter::write_packet(const Endpoint& src, const Endpoint& dst,
                              std::span<const uint8_t> roce, uint16_t ip_id, uint64_t ts_ns) {
  std::lock_guard lk(mu_);
  size_t n = build_frame(frame_buf_.data(), frame_buf_.size(), src, dst, roce, ip_id, true);
  if (n == 0) return false;
  return write_locked(std::span<const uint8_t>(frame_buf_.data(), n), ts_ns);
}

bool PcapWriter::write_frame(std::span<const uint8_t> frame, uint64_t ts_ns) {
  std::lock_guard lk(mu_);
  return write_locked(frame, ts_ns);
}

bool PcapWriter::write_locked(std::span<const uint8_t> frame, uint64_t ts_ns) {
  if (f_ == nullptr) return false;
  if (ts_ns == 0) ts_ns = realtime_ns();
  uint32_t rec[4] = {uint32_t(ts_ns / 1000000000ull), uint32_t(ts_ns % 1000000000ull / 1000),
                     uint32_t(frame.size()), uint32_t(frame.size())};
  if (std::fwrite(rec, sizeof(rec), 1, f_) != 1) return false;
  if (!frame.empty() && std::fwrite(frame.data(), 1, frame.size(), f_) != frame.size()) return false;
  ++packets_;
  return true;
}

// ---- PcapReader -----------------------------------------------------------------------

std::unique_ptr<PcapReader> PcapReader::open(const std::string& path, int* err) {
  int dummy;
  if (err == nullptr) err = &dummy;
  *err = 0;
  std::unique_ptr<PcapReader> r(new PcapReader());
  r->f_ = std::fopen(path.c_str(), "rbe");
  if (r->f_ == nullptr) {
    *err = errno;
    return nullptr;
  }
  uint8_t h[24];
  if (std::fread(h, 1, sizeof(h), r->f_) != sizeof(h)) {
    *err = EINVAL;
    return nullptr;
  }
  uint32_t magic;
  std::memcpy(&magic, h, 4);
  if (magic == kMagicUs || magic == kMagicNs) {
    r->nanos_ = magic == kMagicNs;
  } else if (__builtin_bswap32(magic) == kMagicUs || __builtin_bswap32(magic) == kMagicNs) {
    r->swap_ = true;
    r->nanos_ = __builtin_bswap32(magic) == kMagicNs;
  } else {
    *err = EINVAL;  // not classic pcap (pcapng starts 0x0a0d0d0a)
    return nullptr;
  }
  r->linktype_ = r->rd32(h + 20) & 0x0fffffff;
  return r;
}

PcapReader::~PcapReader() {
  if (f_ != nullptr) std::fclose(f_);
}

uint32_t PcapReader::rd32(const uint8_t* p) const {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return swap_ ? __builtin_bswap32(v) : v;
}

bool PcapReader::next(PcapFrame& out) {
  uint8_t rec[16];
  if (std::fread(rec, 1, sizeof(rec), f_) != sizeof(rec)) return false;
  uint64_t sec = rd32(rec), frac = rd32(rec + 4);
  uint32_t incl = rd32(rec + 8);
  out.orig_len = rd32(rec + 12);
  out.ts_ns = sec * 1000000000ull + (nanos_ ? frac : frac * 1000);
  if (incl > (1u << 26)) return false;
  out.data.resize(incl);
  return incl == 0 || std::fread(out.data.data(), 1, incl, f_) == incl;
}

}  // namespace rnic::wire
