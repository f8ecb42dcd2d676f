// tests/bench/udp_peer.cc: the raw UDP peer scripts/bench compares softrnic with (not a test).
// The floor any UDP transport on this host can reach, with the same syscalls softrnic uses.
//   udp_peer pingpong server|client PORT SIZE ITERS busy|block
//       ping-pong of SIZE-byte datagrams on 127.0.0.1:PORT; the client prints
//       "pingpong SIZE typical_usec p99_usec" (one-way: half the round trip; typical = median).
//       busy: recv with MSG_DONTWAIT in a loop (as perftest spins on a CQ); block: poll()
//       then recv (as a thread sleeping in epoll).
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

int pingpong(bool server, int port, size_t size, int iters, bool busy) {
  std::vector<char> buf(std::max<size_t>(size, 1));
  uint64_t deadline = now_ns() + 60ull * 1000000000u;
  if (server) {
    int fd = sock(port);
    sockaddr_in from{};
    for (int i = 0; i < iters; ++i) {
      if (rx(fd, buf.data(), buf.size(), busy, &from, deadline) < 0) return 1;
      sendto(fd, buf.data(), size, 0, reinterpret_cast<sockaddr*>(&from), sizeof from);
    }
    return 0;
  }
  int fd = sock(0);
  sockaddr_in to = addr(port);
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    uint64_t t0 = now_ns();
    // The server may not be bound yet for the first datagram: resend until it answers.
    for (;;) {
      sendto(fd, buf.data(), size, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
      sockaddr_in from{};
      uint64_t dl = i == 0 ? now_ns() + 100000000u : deadline;
      if (rx(fd, buf.data(), buf.size(), busy, &from, dl) >= 0) break;
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
      for (size_t off = 0; off < size; off += 15 * kSeg) {
        iovec one{buf.data() + off, std::min(size - off, 15 * kSeg)};
        char ctl[CMSG_SPACE(sizeof(uint16_t))] = {};
        msghdr h{};
        h.msg_iov = &one;
        h.msg_iovlen = 1;
        h.msg_control = ctl;
        h.msg_controllen = sizeof ctl;
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t seg = kSeg;
        memcpy(CMSG_DATA(c), &seg, sizeof seg);
        while (sendmsg(fd, &h, 0) < 0 && (errno == EAGAIN || errno == ENOBUFS)) sched_yield();
      }
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

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: udp_peer pingpong|stream server|client PORT SIZE ITERS|SECONDS [busy|block|gso]\n");
    return 2;
  }
  bool server = strcmp(argv[2], "server") == 0;
  int port = atoi(argv[3]);
  size_t size = strtoul(argv[4], nullptr, 10);
  const char* mode = argc > 6 ? argv[6] : "";
  if (strcmp(argv[1], "pingpong") == 0)
    return pingpong(server, port, size, atoi(argv[5]), strcmp(mode, "block") != 0);
  return stream(server, port, size, atof(argv[5]), strcmp(mode, "gso") == 0);
}
