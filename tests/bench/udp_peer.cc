// tests/bench/udp_peer.cc: the raw UDP peer scripts/bench compares softrnic with (not a test).
// The floor any UDP transport on this host can reach, with the same syscalls softrnic uses.
//   udp_peer pingpong server|client PORT SIZE ITERS busy|block
//       ping-pong of SIZE-byte datagrams on 127.0.0.1:PORT; the client prints
//       "pingpong SIZE typical_usec p99_usec" (one-way: half the round trip; typical = median).
//       busy: recv with MSG_DONTWAIT in a loop (as perftest spins on a CQ); block: poll()
//       then recv (as a thread sleeping in epoll).
//   udp_peer pingpong server|client PORT SIZE ITERS roce
//       busy, but each message goes as the datagrams an RC WRITE ping-pong needs on the wire:
//       the request (SIZE bytes cut into 4 KiB payloads, each with its 32 bytes of BTH, RETH
//       and ICRC) and the ACK of the peer's last message (BTH, AETH, ICRC: 20 bytes), in
//       one sendmsg with UDP_SEGMENT (at most 64 KiB each), received with UDP_GRO. No RoCE
//       stack on kernel UDP sockets can send less per message: the ACK is mandatory, and a
//       GSO send was the cheapest way to send the pair here (2.5 us one way at 64 B; the two
//       datagrams by one sendmmsg 3.3 us; one 96-byte datagram 2.1 us; docs/bench/README.md).
//   udp_peer stall SECONDS
//       the host's own noise: one thread reads CLOCK_MONOTONIC back to back for SECONDS and
//       prints "stall gaps_1us_per_s gaps_20us_per_s lost_pct": how often it lost the CPU
//       for 1 us or more (interrupts, the scheduler, a hypervisor), and for 20 us or more,
//       and the share of the time lost. A ping-pong round trip of T us meets a gap of 20 us
//       or more with a probability of about 2 T gaps_20us_per_s / 1e6 (two CPUs in the loop).
//   udp_peer stream server|client PORT SIZE SECONDS [gso]
//       the client sends SIZE-byte messages (cut into 4 KiB datagrams, one sendmmsg per
//       message; with gso one sendmsg with UDP_SEGMENT); the server receives with recvmmsg
//       (and UDP_GRO with gso) and prints "stream SIZE Gb/s Mpps" of what arrived.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

uint64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

sockaddr_in addr(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int sock(int bind_port) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  int big = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (bind_port >= 0) {
    sockaddr_in a = addr(bind_port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      perror("bind");
      exit(1);
    }
  }
  return fd;
}

ssize_t rx(int fd, void* b, size_t n, bool busy, sockaddr_in* from, uint64_t deadline) {
  for (;;) {
    socklen_t fl = sizeof *from;
    if (!busy) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 1000) == 0 && now_ns() > deadline) return -1;
    }
    ssize_t r = recvfrom(fd, b, n, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(from), &fl);
    if (r >= 0) return r;
    if (errno != EAGAIN && errno != EINTR) return -1;
    if (busy && now_ns() > deadline) return -1;
  }
}

// One sendmsg of len bytes cut into seg-byte datagrams (UDP_SEGMENT), to `to` (or the
// connected peer when null); waits out a full socket buffer, and exits on any other error (a
// bench that hangs on a refused send measures nothing).
void gso_sendmsg(int fd, const sockaddr_in* to, char* p, size_t len, uint16_t seg) {
  iovec v{p, len};
  char ctl[CMSG_SPACE(sizeof(uint16_t))] = {};
  msghdr h{};
  h.msg_name = const_cast<sockaddr_in*>(to);
  h.msg_namelen = to != nullptr ? sizeof *to : 0;
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = IPPROTO_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  memcpy(CMSG_DATA(c), &seg, sizeof seg);
  while (sendmsg(fd, &h, 0) < 0) {
    if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
      perror("udp_peer: sendmsg (UDP_SEGMENT)");
      exit(1);
    }
    sched_yield();
  }
}

// The roce mode's wire shape of one message: kRocePayload-byte packets with kReqOverhead
// bytes each, then the ACK; sent in GSO runs of at most kGsoSegs segments.
constexpr size_t kRocePayload = 4096;
constexpr size_t kReqOverhead = 12 + 16 + 4;  // BTH, RETH, ICRC
constexpr size_t kAckBytes = 12 + 4 + 4;      // BTH, AETH, ICRC
constexpr size_t kGsoSegs = 64;
constexpr size_t kMaxUdp = 65507;

// Sends one message: a plain datagram, or (roce) its request packets and the ACK.
void send_msg(int fd, const sockaddr_in& to, char* buf, size_t size, bool roce) {
  if (!roce) {
    sendto(fd, buf, size, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    return;
  }
  const size_t pkts = std::max<size_t>(1, (size + kRocePayload - 1) / kRocePayload);
  const size_t seg = std::min(size, kRocePayload) + kReqOverhead;
  // The last packet may be short; it and the ACK end the message's last GSO run. A GSO
  // run's segments are all `seg` bytes but its last, so a short last packet goes alone.
  const size_t last = size - (pkts - 1) * kRocePayload + kReqOverhead;
  size_t full = last == seg ? pkts : pkts - 1;  // packets of exactly seg bytes
  auto gso_send = [&](size_t len, uint16_t gso) { gso_sendmsg(fd, &to, buf, len, gso); };
  // Full runs first; the final run carries the remaining full packets and the ACK (and the
  // short last packet, alone before it, if there is one). A run is one UDP datagram to the
  // kernel: at most 65,507 bytes.
  const size_t run = std::min(kGsoSegs, (kMaxUdp - kAckBytes) / seg);
  while (full > run) {
    gso_send(run * seg, static_cast<uint16_t>(seg));
    full -= run;
  }
  if (last != seg) {
    if (full > 0) gso_send(full * seg, static_cast<uint16_t>(seg));
    gso_send(last + kAckBytes, static_cast<uint16_t>(last));
  } else {
    gso_send(full * seg + kAckBytes, static_cast<uint16_t>(seg));
  }
}

// Receives one message: one datagram, or (roce) until its request bytes and the ACK arrived
// (GRO may hand several packets over in one read).
int recv_msg(int fd, char* buf, size_t cap, size_t size, bool busy, bool roce,
             sockaddr_in* from, uint64_t deadline) {
  if (!roce) return rx(fd, buf, cap, busy, from, deadline) < 0 ? -1 : 0;
  const size_t pkts = std::max<size_t>(1, (size + kRocePayload - 1) / kRocePayload);
  const size_t want = size + pkts * kReqOverhead + kAckBytes;
  for (size_t got = 0; got < want;) {
    ssize_t r = rx(fd, buf, cap, busy, from, deadline);
    if (r < 0) return -1;
    got += size_t(r);
  }
  return 0;
}

int pingpong(bool server, int port, size_t size, int iters, bool busy, bool roce) {
  // roce: room for a GRO read of a whole GSO run.
  std::vector<char> buf(roce ? 65536 + 512 : std::max<size_t>(size, 1));
  uint64_t deadline = now_ns() + 60ull * 1000000000u;
  if (server) {
    int fd = sock(port);
    int one = 1;
    if (roce) setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
    sockaddr_in from{};
    for (int i = 0; i < iters; ++i) {
      if (recv_msg(fd, buf.data(), buf.size(), size, busy, roce, &from, deadline) < 0) return 1;
      send_msg(fd, from, buf.data(), size, roce);
    }
    return 0;
  }
  int fd = sock(0);
  int one = 1;
  if (roce) setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
  sockaddr_in to = addr(port);
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    uint64_t t0 = now_ns();
    // The server may not be bound yet for the first datagram: resend until it answers.
    for (;;) {
      send_msg(fd, to, buf.data(), size, roce);
      sockaddr_in from{};
      uint64_t dl = i == 0 ? now_ns() + 100000000u : deadline;
      if (recv_msg(fd, buf.data(), buf.size(), size, busy, roce, &from, dl) >= 0) break;
      if (i != 0 || now_ns() > deadline) return 1;
    }
    us.push_back(double(now_ns() - t0) / 2000.0);
  }
  std::sort(us.begin(), us.end());
  printf("pingpong %zu %.2f %.2f\n", size, us[us.size() / 2], us[us.size() * 99 / 100]);
  return 0;
}

int stream(bool server, int port, size_t size, double secs, bool gso) {
  constexpr size_t kSeg = 4096;
  if (server) {
    int fd = sock(port);
    if (gso) {
      int one = 1;
      setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
    }
    constexpr int kN = 32;
    std::vector<char> mem(kN * 65536);
    mmsghdr m[kN];
    iovec v[kN];
    uint64_t bytes = 0, pkts = 0, t0 = 0, t1 = 0;
    for (;;) {
      for (int i = 0; i < kN; ++i) {
        v[i] = {mem.data() + i * 65536, 65536};
        m[i] = {};
        m[i].msg_hdr.msg_iov = &v[i];
        m[i].msg_hdr.msg_iovlen = 1;
      }
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, t0 == 0 ? 30000 : 500) == 0) break;
      int n = recvmmsg(fd, m, kN, MSG_DONTWAIT, nullptr);
      if (n <= 0) continue;
      if (t0 == 0) t0 = now_ns();
      t1 = now_ns();
      for (int i = 0; i < n; ++i) {
        bytes += m[i].msg_len;
        pkts += (m[i].msg_len + kSeg - 1) / kSeg;
      }
    }
    double s = double(t1 - t0) / 1e9;
    if (s <= 0) return 1;
    printf("stream %zu %.2f %.3f\n", size, double(bytes) * 8 / s / 1e9, double(pkts) / s / 1e6);
    return 0;
  }
  int fd = sock(0);
  sockaddr_in to = addr(port);
  connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
  std::vector<char> buf(size);
  uint64_t end = now_ns() + uint64_t(secs * 1e9);
  size_t segs = (size + kSeg - 1) / kSeg;
  std::vector<mmsghdr> m(segs);
  std::vector<iovec> v(segs);
  while (now_ns() < end) {
    if (gso && size > kSeg) {
      for (size_t off = 0; off < size; off += 15 * kSeg)
        gso_sendmsg(fd, nullptr, buf.data() + off, std::min(size - off, 15 * kSeg), kSeg);
      continue;
    }
    for (size_t i = 0; i < segs; ++i) {
      v[i] = {buf.data() + i * kSeg, std::min(kSeg, size - i * kSeg)};
      m[i] = {};
      m[i].msg_hdr.msg_iov = &v[i];
      m[i].msg_hdr.msg_iovlen = 1;
    }
    for (size_t off = 0; off < segs;) {
      int r = sendmmsg(fd, m.data() + off, unsigned(segs - off), 0);
      if (r > 0) off += size_t(r);
      else sched_yield();
    }
  }
  return 0;
}

}  // namespace

int stall(double secs) {
  const uint64_t start = now_ns(), end = start + uint64_t(secs * 1e9);
  uint64_t last = start, gaps1 = 0, gaps20 = 0, lost = 0;
  for (uint64_t t = now_ns(); t < end; t = now_ns()) {
    const uint64_t gap = t - last;
    if (gap >= 1000) {
      ++gaps1;
      lost += gap;
      if (gap >= 20000) ++gaps20;
    }
    last = t;
  }
  const double s = double(last - start) / 1e9;
  if (s <= 0) {
    fprintf(stderr, "udp_peer stall: SECONDS must be > 0\n");
    return 1;
  }
  printf("stall %.0f %.0f %.2f\n", double(gaps1) / s, double(gaps20) / s,
         100.0 * double(lost) / double(last - start));
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "stall") == 0) return stall(atof(argv[2]));
  if (argc < 6) {
    fprintf(stderr, "usage: udp_peer pingpong|stream server|client PORT SIZE ITERS|SECONDS "
                    "[busy|block|roce|gso] | udp_peer stall SECONDS\n");
    return 2;
  }
  bool server = strcmp(argv[2], "server") == 0;
  int port = atoi(argv[3]);
  size_t size = strtoul(argv[4], nullptr, 10);
  const char* mode = argc > 6 ? argv[6] : "";
  if (strcmp(argv[1], "pingpong") == 0)
    return pingpong(server, port, size, atoi(argv[5]), strcmp(mode, "block") != 0,
                    strcmp(mode, "roce") == 0);
  return stream(server, port, size, atof(argv[5]), strcmp(mode, "gso") == 0);
}
