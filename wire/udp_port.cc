// UdpPort: socket setup (DF, PKTINFO, buffers, GSO/GRO probing) and the batched
// sendmmsg / recvmmsg data path. The data path allocates nothing.
#include "wire/udp_port.h"

#include <ifaddrs.h>
#include <linux/sock_diag.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
// From <linux/in6.h> (glibc's <netinet/in.h> lacks them).
#ifndef IPV6_FLOWINFO
#define IPV6_FLOWINFO 11
#endif
#ifndef IPV6_FLOWINFO_SEND
#define IPV6_FLOWINFO_SEND 33
#endif
#ifndef IP_MULTICAST_ALL
#define IP_MULTICAST_ALL 49
#endif
#ifndef IPV6_MULTICAST_ALL
#define IPV6_MULTICAST_ALL 29
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

namespace rnic::wire {

namespace {

union SockAddr {
  sockaddr sa;
  sockaddr_in v4;
  sockaddr_in6 v6;
};

// Control space for one received datagram: PKTINFO (v4 or v6; a wildcard bind only), UDP_GRO,
// TOS / TCLASS, IPv6 hop limit and flow info (each fits the space of an int). The 64 spare
// bytes are slack: a cmsg that does not fit sets MSG_CTRUNC and is lost, never overruns.
constexpr size_t kRxCtrl = CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) +
                           3 * CMSG_SPACE(sizeof(int)) + 64;
// Control space for one sent datagram: UDP_SEGMENT, IPV6_TCLASS, IPV6_HOPLIMIT.
constexpr size_t kTxCtrl = CMSG_SPACE(sizeof(uint16_t)) + 2 * CMSG_SPACE(sizeof(int));

// A socket bound to one address receives only datagrams sent to it: their header's
// destination is the bound address (recv_fd's default; join_group's sockets, bound to their
// group, follow the same rule). Only a wildcard bind asks the kernel for each datagram's (a
// cmsg per datagram: ~0.05 us of a 64 B ping-pong's one-way, measured). 0 or an errno.
int ask_pktinfo_if_wildcard(int fd, const Endpoint& bound) {
  static constexpr uint8_t kAny[16] = {};
  if (std::memcmp(bound.addr, kAny, bound.ipv6 ? 16 : 4) != 0) return 0;
  const int one = 1;
  const int r = bound.ipv6 ? setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one))
                           : setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
  return r != 0 ? errno : 0;
}

// The kernel's memory accounting of fd (SO_MEMINFO) into mi; false if it fails or stops
// short of entry `need`.
bool socket_meminfo(int fd, uint32_t (&mi)[SK_MEMINFO_VARS], int need) {
  socklen_t len = sizeof(mi);
  return fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mi, &len) == 0 &&
         len > static_cast<socklen_t>(need * sizeof(uint32_t));
}

// The kernel's count of datagrams dropped at fd (sk_drops, what SO_RXQ_OVFL reports).
uint64_t socket_drops(int fd) {
  uint32_t mi[SK_MEMINFO_VARS] = {};
  return socket_meminfo(fd, mi, SK_MEMINFO_DROPS) ? mi[SK_MEMINFO_DROPS] : 0;
}

void fill_sockaddr(const Endpoint& e, SockAddr* out, socklen_t* len) {
  sockaddr_storage ss;
  *len = e.to_sockaddr(&ss);
  std::memcpy(out, &ss, *len);
}

uint32_t segments_of(uint32_t len, uint16_t seg) {
  if (seg == 0 || seg >= len) return 1;
  return (len + seg - 1) / seg;
}

// The index of the interface carrying local address e (e.scope_id if set), 0 if unknown.
unsigned ifindex_of(const Endpoint& e) {
  if (e.scope_id != 0) return e.scope_id;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return 0;
  unsigned idx = 0;
  for (ifaddrs* i = ifa; i != nullptr && idx == 0; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
    Endpoint a;
    const socklen_t l = i->ifa_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (!a.from_sockaddr(i->ifa_addr, l) || !a.same_ip(e)) continue;
    idx = if_nametoindex(i->ifa_name);
  }
  freeifaddrs(ifa);
  // 127.0.0.2 and the like are not interface addresses but are on lo.
  if (idx == 0 && !e.ipv6 && e.addr[0] == 127) idx = if_nametoindex("lo");
  return idx;
}

// Multicast datagrams a socket sends leave on its own address's interface (else the kernel
// routes 239.x by the default route, away from a 127.x device). Best effort.
void set_multicast_if(int fd, const Endpoint& local) {
  if (local.ipv6) {
    static constexpr uint8_t kAny[16] = {};
    if (std::memcmp(local.addr, kAny, 16) == 0) return;
    const int idx = static_cast<int>(ifindex_of(local));
    if (idx != 0) (void)setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &idx, sizeof(idx));
    return;
  }
  if (local.v4_host() == 0) return;
  ip_mreqn m{};
  std::memcpy(&m.imr_address, local.addr, 4);
  (void)setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof(m));
}

}  // namespace

struct UdpPort::RxScratch {
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  SockAddr names[kBatch];
  alignas(cmsghdr) unsigned char ctrl[kBatch][kRxCtrl];
};

namespace {

// One bound socket with every option the port relies on; -1 and *err on failure.
// `adopted` >= 0: that already-bound socket (its family from getsockname) instead of a new one.
int open_socket(const Endpoint& bind_ep, const UdpPortOptions& opt, bool* gso, bool* gro,
                Endpoint* local, int* err, int adopted = -1) {
  Endpoint bind = bind_ep;
  if (adopted >= 0) {
    SockAddr got{};
    socklen_t gotlen = sizeof(got);
    if (getsockname(adopted, &got.sa, &gotlen) != 0 || !bind.from_sockaddr(&got.sa, gotlen)) {
      *err = errno != 0 ? errno : EBADF;
      ::close(adopted);
      return -1;
    }
  }
  const bool v6 = bind.ipv6;
  int fd = adopted >= 0 ? adopted : ::socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  auto fail = [&](int e) {
    *err = e;
    ::close(fd);
    return -1;
  };
  int one = 1;
  int zero = 0;
  if (v6 && adopted < 0) {
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) return fail(errno);
  }
  if (v6) {
    int pmtu = IPV6_PMTUDISC_DO;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof(pmtu)) != 0) return fail(errno);
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one));  // ECN (best effort)
    // The GRH's flow label goes out in sin6_flowinfo; with no label the header carries 0, not
    // a kernel hash (auto flow labels off). Received hop limit and flow label feed the UD GRH.
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWINFO_SEND, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, &zero, sizeof(zero));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWINFO, &one, sizeof(one));
  } else {
    // DF on every datagram: with an unconnected socket Linux then writes IP ID 0
    // (ip_select_ident: DF set and no inet_daddr), which the ICRC covers.
    int pmtu = IP_PMTUDISC_DO;
    if (setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)) != 0) return fail(errno);
    (void)setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one));  // ECN (best effort)
  }
  // No SO_RXQ_OVFL: the kernel's drop count is read when counters are asked for
  // (UdpPort::kernel_drops, SO_MEMINFO), not carried in a cmsg of every datagram.
  // Buffers: FORCE variants exceed rmem_max when privileged; else plain, capped.
  if (opt.rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &opt.rcvbuf, sizeof(int)) != 0) {
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opt.rcvbuf, sizeof(int));
  }
  if (opt.sndbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &opt.sndbuf, sizeof(int)) != 0) {
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt.sndbuf, sizeof(int));
  }
  // Setting a zero default segment size succeeds iff the kernel knows UDP_SEGMENT.
  if (opt.gso) *gso = *gso && setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0;
  if (opt.gro) *gro = *gro && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) == 0;

  if (opt.reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
    return fail(errno);
  }
  SockAddr sa{};
  socklen_t salen = 0;
  fill_sockaddr(bind, &sa, &salen);
  if (adopted < 0 && ::bind(fd, &sa.sa, salen) != 0) return fail(errno);
  SockAddr got{};
  socklen_t gotlen = sizeof(got);
  if (getsockname(fd, &got.sa, &gotlen) != 0) return fail(errno);
  if (!local->from_sockaddr(&got.sa, gotlen)) return fail(EAFNOSUPPORT);
  if (bind.ipv6 && !local->ipv6) return fail(EAFNOSUPPORT);
  if (const int e = ask_pktinfo_if_wildcard(fd, *local); e != 0) return fail(e);
  set_multicast_if(fd, *local);
  return fd;
}

}  // namespace

std::unique_ptr<UdpPort> UdpPort::open(const UdpPortOptions& opt, int* err) {
  int dummy;
  if (err == nullptr) err = &dummy;
  *err = 0;
  const size_t n = opt.adopt.empty() ? opt.more.size() + 1 : opt.adopt.size();
  if (n > kMaxSockets) {
    for (int fd : opt.adopt) ::close(fd);
    *err = EINVAL;
    return nullptr;
  }
  std::unique_ptr<UdpPort> p(new UdpPort());
  bool gso = opt.gso, gro = opt.gro;
  for (size_t i = 0; i < n; ++i) {
    Endpoint b = i == 0 ? opt.bind : opt.adopt.empty() ? opt.more[i - 1] : opt.bind;
    if (i > 0) b.port = p->socks_[0].local.port;  // one UDP port for every address
    Sock& s = p->socks_[i];
    s.fd = open_socket(b, opt, &gso, &gro, &s.local, err, opt.adopt.empty() ? -1 : opt.adopt[i]);
    if (s.fd < 0) {
      for (size_t j = i + 1; j < opt.adopt.size(); ++j) ::close(opt.adopt[j]);
    }
    if (s.fd < 0) return nullptr;  // the destructor closes the ones already open
    s.local.src_index = static_cast<uint8_t>(i);
    p->nsocks_ = i + 1;
  }
  p->gso_ = gso;
  p->gro_ = gro;
  p->side_fd_ = opt.side_fd;
  if (p->nsocks_ > 1 || p->side_fd_ >= 0) {
    p->epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd_ < 0) {
      *err = errno;
      return nullptr;
    }
    for (size_t i = 0; i < p->nsocks_; ++i) {
      epoll_event ev{};
      ev.events = EPOLLIN;  // level-triggered: the set stays readable until all are drained
      ev.data.u64 = i;
      if (epoll_ctl(p->epfd_, EPOLL_CTL_ADD, p->socks_[i].fd, &ev) != 0) {
        *err = errno;
        return nullptr;
      }
    }
    if (p->side_fd_ >= 0) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kMaxSockets;
      if (epoll_ctl(p->epfd_, EPOLL_CTL_ADD, p->side_fd_, &ev) != 0) {
        *err = errno;
        return nullptr;
      }
    }
  }
  p->gepfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (p->gepfd_ < 0) {
    *err = errno;
    return nullptr;
  }
  const int fd = p->socks_[0].fd;
  socklen_t ilen = sizeof(int);
  (void)getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &p->rcvbuf_, &ilen);
  ilen = sizeof(int);
  (void)getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &p->sndbuf_, &ilen);
  p->rx_ = std::make_unique<RxScratch>();
  return p;
}

UdpPort::~UdpPort() {
  for (size_t i = 0; i < nsocks_; ++i) ::close(socks_[i].fd);
  if (side_fd_ >= 0) ::close(side_fd_);
  if (epfd_ >= 0) ::close(epfd_);
  for (const Group& g : groups_) ::close(g.fd);
  if (gepfd_ >= 0) ::close(gepfd_);
}

int UdpPort::join_group(const Endpoint& group, bool join) {
  if (!group.multicast()) return -EINVAL;
  Endpoint g = group;
  g.port = socks_[0].local.port;
  std::lock_guard lk(grp_mu_);
  size_t at = 0;
  while (at < groups_.size() && !groups_[at].ep.same_ip(g)) ++at;
  if (!join) {
    if (at == groups_.size()) return -ENOENT;
    (void)epoll_ctl(gepfd_, EPOLL_CTL_DEL, groups_[at].fd, nullptr);
    // Its drops stay counted (kernel_drops reads only the sockets still open).
    ctr_.rx_dropped.fetch_add(socket_drops(groups_[at].fd), std::memory_order_relaxed);
    ::close(groups_[at].fd);  // closing the socket leaves the group
    groups_.erase(groups_.begin() + static_cast<std::ptrdiff_t>(at));
    ngroups_.store(groups_.size(), std::memory_order_release);
    return 0;
  }
  if (at != groups_.size()) return -EEXIST;
  if (groups_.size() >= kMaxGroups) return -ENOSPC;
  // The interface: local address src_index if of the group's family, else the first that is.
  const Endpoint* iface = nullptr;
  if (g.src_index < nsocks_ && socks_[g.src_index].local.ipv6 == g.ipv6) {
    iface = &socks_[g.src_index].local;
  } else {
    for (size_t i = 0; i < nsocks_ && iface == nullptr; ++i) {
      if (socks_[i].local.ipv6 == g.ipv6) iface = &socks_[i].local;
    }
  }
  if (iface == nullptr) return -EINVAL;
  const int fd = ::socket(g.ipv6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  auto fail = [&](int e) {
    ::close(fd);
    return -e;
  };
  int one = 1;
  int zero = 0;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) return fail(errno);
  if (g.ipv6) {
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_FLOWINFO, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &zero, sizeof(zero));
  } else {
    (void)setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one));
    // Only the groups this socket joined (not every group any socket of the host joined).
    (void)setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof(zero));
  }
  if (rcvbuf_ > 0) (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf_, sizeof(int));
  sockaddr_storage ss;
  const socklen_t sl = g.to_sockaddr(&ss);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), sl) != 0) return fail(errno);
  // No IP_PKTINFO: bound to its group, it receives only datagrams sent to the group, which
  // recv_groups reports as their destination (ask_pktinfo_if_wildcard's rule).
  if (g.ipv6) {
    ipv6_mreq m{};
    std::memcpy(&m.ipv6mr_multiaddr, g.addr, 16);
    m.ipv6mr_interface = ifindex_of(*iface);
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &m, sizeof(m)) != 0) return fail(errno);
  } else {
    ip_mreqn m{};
    std::memcpy(&m.imr_multiaddr, g.addr, 4);
    std::memcpy(&m.imr_address, iface->addr, 4);
    if (iface->v4_host() == 0) m.imr_ifindex = 0;
    if (setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m)) != 0) return fail(errno);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(gepfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return fail(errno);
  Group gr;
  gr.ep = g;
  gr.ep.src_index = iface->src_index;
  gr.fd = fd;
  groups_.push_back(gr);
  ngroups_.store(groups_.size(), std::memory_order_release);
  return 0;
}

// The group sockets that are readable (one epoll_wait), each drained like a unicast socket.
// A join or leave in progress holds the lock: this round skips the groups (level-triggered
// readiness brings the engine back).
int UdpPort::recv_groups(std::span<RxDesc> descs) {
  std::unique_lock lk(grp_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return 0;
  epoll_event evs[kMaxGroups];
  const int n = epoll_wait(gepfd_, evs, static_cast<int>(kMaxGroups), 0);
  size_t got = 0;
  for (int i = 0; i < n && got < descs.size(); ++i) {
    const int fd = evs[i].data.fd;
    const Group* g = nullptr;
    for (const Group& x : groups_) {
      if (x.fd == fd) g = &x;
    }
    if (g == nullptr) continue;
    const int r = recv_fd(fd, g->ep, descs.subspan(got));
    if (r > 0) got += size_t(r);
  }
  return int(got);
}

size_t UdpPort::socket_for(const Endpoint& dst) const {
  if (dst.src_index < nsocks_ && socks_[dst.src_index].local.ipv6 == dst.ipv6) return dst.src_index;
  for (size_t i = 0; i < nsocks_; ++i) {
    if (socks_[i].local.ipv6 == dst.ipv6) return i;
  }
  return 0;  // no socket of that family: the kernel refuses it (counted in tx_errors)
}

int UdpPort::send_impl(std::span<const TxDesc> pkts) {
  size_t done = 0;
  while (done < pkts.size()) {
    // A run of datagrams leaving from one socket, at most kBatch.
    const size_t k = socket_for(pkts[done].dst);
    size_t n = 1;
    while (n < kBatch && done + n < pkts.size() && socket_for(pkts[done + n].dst) == k) ++n;
    int r = send_chunk(socks_[k].fd, pkts.subspan(done, n));
    if (r < 0) return done > 0 ? int(done) : r;
    done += size_t(r);
    if (size_t(r) < n) break;  // send buffer full
  }
  return int(done);
}

// A GSO descriptor on a kernel without UDP_SEGMENT: same datagrams, one per segment.
int UdpPort::send_one_split(int fd, const TxDesc& d) {
  TxDesc segs[kMaxGsoSegments];
  uint32_t n = 0;
  for (uint32_t off = 0; off < d.len && n < kMaxGsoSegments; off += d.gso_size) {
    segs[n++] = TxDesc{d.dst, d.data + off, std::min<uint32_t>(d.gso_size, d.len - off), 0};
  }
  int r = send_chunk(fd, std::span<const TxDesc>(segs, n));
  return r < 0 ? r : (uint32_t(r) == n ? 1 : 0);
}

// Stack-only: several threads may be here at once.
int UdpPort::send_chunk(int fd, std::span<const TxDesc> pkts) {
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  SockAddr names[kBatch];
  alignas(cmsghdr) unsigned char ctrl[kBatch][kTxCtrl];
  const size_t n = pkts.size();

  size_t built = 0;
  for (; built < n; ++built) {
    const TxDesc& d = pkts[built];
    const bool seg = d.gso_size != 0 && d.gso_size < d.len;
    if (seg && !gso_) break;  // handled below, alone
    std::memset(&msgs[built], 0, sizeof(mmsghdr));
    iov[built].iov_base = const_cast<uint8_t*>(d.data);
    iov[built].iov_len = d.len;
    sockaddr_storage ss;
    const socklen_t nl = d.dst.to_sockaddr(&ss, true);
    std::memcpy(&names[built], &ss, nl);
    msghdr& m = msgs[built].msg_hdr;
    m.msg_name = &names[built];
    m.msg_namelen = nl;
    m.msg_iov = &iov[built];
    m.msg_iovlen = 1;
    size_t clen = 0;
    auto add = [&](int level, int type, const void* v, size_t vlen) {
      m.msg_control = ctrl[built];
      auto* c = reinterpret_cast<cmsghdr*>(ctrl[built] + clen);  // CMSG_SPACE keeps alignment
      c->cmsg_level = level;
      c->cmsg_type = type;
      c->cmsg_len = CMSG_LEN(vlen);
      std::memcpy(CMSG_DATA(c), v, vlen);
      clen += CMSG_SPACE(vlen);
      m.msg_controllen = clen;
    };
    if (seg) add(SOL_UDP, UDP_SEGMENT, &d.gso_size, sizeof(uint16_t));
    if (d.dst.ipv6) {
      // The IPv6 header the GRH asks for (IBA A17.4.5.1); the flow label is in sin6_flowinfo.
      const int tc = d.dst.tclass;
      add(IPPROTO_IPV6, IPV6_TCLASS, &tc, sizeof(int));
      if (d.dst.hop_limit != 0) {
        const int hl = d.dst.hop_limit;
        add(IPPROTO_IPV6, IPV6_HOPLIMIT, &hl, sizeof(int));
      }
    }
    if (clen == 0) {
      m.msg_control = nullptr;
      m.msg_controllen = 0;
    }
  }
  if (built == 0) {
    // pkts[0] is a GSO descriptor and the kernel lacks UDP_SEGMENT.
    return send_one_split(fd, pkts[0]);
  }

  size_t idx = 0;
  while (idx < built) {
    // One datagram (a ping-pong's request with its riding ACK): sendmsg, which skips
    // sendmmsg's per-message bookkeeping (~0.05 us a call here).
    int r = built - idx == 1 ? (::sendmsg(fd, &msgs[idx].msg_hdr, 0) >= 0 ? 1 : -1)
                             : ::sendmmsg(fd, &msgs[idx], unsigned(built - idx), 0);
    if (r > 0) {
      for (size_t i = idx; i < idx + size_t(r); ++i) {
        bump(ctr_.tx_packets, segments_of(pkts[i].len, pkts[i].gso_size));
        bump(ctr_.tx_bytes, pkts[i].len);
      }
      idx += size_t(r);
      continue;
    }
    int e = errno;
    if (r < 0 && e == EINTR) continue;
    if (r < 0 && (e == EAGAIN || e == EWOULDBLOCK)) return idx > 0 ? int(idx) : -EAGAIN;
    // A per-datagram error (EMSGSIZE, EHOSTUNREACH, ENOBUFS, EINVAL ...): drop it.
    bump(ctr_.tx_errors, segments_of(pkts[idx].len, pkts[idx].gso_size));
    ++idx;
  }
  return int(built);
}

int UdpPort::recv_impl(std::span<RxDesc> descs) {
  size_t total = 0;
  if (side_fd_ >= 0) {
    int r = recv_side(descs);
    if (r > 0) total = size_t(r);
    if (total == descs.size()) return int(total);
    descs = descs.subspan(total);
  }
  if (nsocks_ == 1) {
    int r = recv_socket(0, descs);
    if (r >= 0 && ngroups_.load(std::memory_order_relaxed) != 0 && size_t(r) < descs.size())
      r += recv_groups(descs.subspan(size_t(r)));
    return r < 0 ? (total > 0 ? int(total) : r) : int(total) + r;
  }
  // Every socket in turn, starting one further each call so none starves.
  const size_t first = rx_next_;
  rx_next_ = (rx_next_ + 1) % nsocks_;
  size_t got = 0;  // into descs (after the side channel's)
  for (size_t j = 0; j < nsocks_ && got < descs.size(); ++j) {
    int r = recv_socket((first + j) % nsocks_, descs.subspan(got));
    if (r < 0) return total + got > 0 ? int(total + got) : r;
    got += size_t(r);
  }
  if (ngroups_.load(std::memory_order_relaxed) != 0 && got < descs.size())
    got += size_t(recv_groups(descs.subspan(got)));
  return int(total + got);
}

int UdpPort::recv_side(std::span<RxDesc> descs) {
  size_t n = 0;
  while (n < descs.size()) {
    RxDesc& d = descs[n];
    SideFrame f;
    iovec iov[2] = {{&f, sizeof f}, {d.buf, d.cap}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    ssize_t r = ::recvmsg(side_fd_, &m, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (r == 0) {  // the forwarder is gone: stop watching the channel
      if (epfd_ >= 0) (void)epoll_ctl(epfd_, EPOLL_CTL_DEL, side_fd_, nullptr);
      ::close(side_fd_);
      side_fd_ = -1;
      break;
    }
    if (size_t(r) < sizeof f) continue;  // malformed: nothing to deliver
    d.len = uint32_t(size_t(r) - sizeof f);
    d.truncated = (m.msg_flags & MSG_TRUNC) != 0;
    d.ip_id = 0;
    d.seg_size = 0;
    d.tos = f.tos;
    d.hop_limit = 0;
    d.flow_label = 0;
    d.src = Endpoint{};
    d.src.ipv6 = f.ipv6 != 0;
    std::memcpy(d.src.addr, f.src_addr, d.src.ipv6 ? 16 : 4);
    d.src.port = f.src_port;
    d.src.scope_id = f.scope_id;
    const size_t k = f.dst_index < nsocks_ ? f.dst_index : 0;
    d.dst = socks_[k].local;
    d.dst.ipv6 = d.src.ipv6;
    std::memset(d.dst.addr, 0, sizeof d.dst.addr);
    std::memcpy(d.dst.addr, f.dst_addr, d.dst.ipv6 ? 16 : 4);
    if (d.truncated) bump(ctr_.rx_truncated);
    bump(ctr_.rx_packets);
    bump(ctr_.rx_bytes, d.len);
    ++n;
  }
  return int(n);
}


uint64_t UdpPort::kernel_drops() const {
  uint64_t n = 0;
  // The unicast sockets (fixed for the port's life) and the groups joined (grp_mu_; a group
  // left added its count to rx_dropped). Not the side channel: a SOCK_SEQPACKET socket
  // whose sender waits rather than drops, and which the receive thread may close.
  for (size_t i = 0; i < nsocks_; ++i) n += socket_drops(socks_[i].fd);
  std::lock_guard lk(grp_mu_);
  for (const Group& g : groups_) n += socket_drops(g.fd);
  return n;
}

int UdpPort::rx_fill_pct() const {
  int pct = -1;
  for (size_t i = 0; i < nsocks_; ++i) {
    uint32_t mi[SK_MEMINFO_VARS] = {};
    if (!socket_meminfo(socks_[i].fd, mi, SK_MEMINFO_RCVBUF) || mi[SK_MEMINFO_RCVBUF] == 0)
      continue;
    const uint64_t fill = uint64_t{mi[SK_MEMINFO_RMEM_ALLOC]} * 100 / mi[SK_MEMINFO_RCVBUF];
    pct = std::max(pct, static_cast<int>(std::min<uint64_t>(fill, 100)));
  }
  return pct;
}

int UdpPort::recv_fd(int fd, const Endpoint& local, std::span<RxDesc> descs) {
  RxScratch& s = *rx_;
  size_t total = 0;
  while (total < descs.size()) {
    const size_t n = std::min<size_t>(kBatch, descs.size() - total);
    for (size_t i = 0; i < n; ++i) {
      RxDesc& d = descs[total + i];
      s.iov[i].iov_base = d.buf;
      s.iov[i].iov_len = d.cap;
      msghdr& m = s.msgs[i].msg_hdr;
      m.msg_name = &s.names[i];
      m.msg_namelen = sizeof(SockAddr);
      m.msg_iov = &s.iov[i];
      m.msg_iovlen = 1;
      m.msg_control = s.ctrl[i];
      m.msg_controllen = kRxCtrl;
      m.msg_flags = 0;
      s.msgs[i].msg_len = 0;
    }
    int r = ::recvmmsg(fd, s.msgs, unsigned(n), MSG_DONTWAIT, nullptr);
    if (r < 0) {
      int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) break;
      return total > 0 ? int(total) : -e;
    }
    for (int i = 0; i < r; ++i) {
      RxDesc& d = descs[total + size_t(i)];
      msghdr& m = s.msgs[i].msg_hdr;
      d.len = s.msgs[i].msg_len;
      d.truncated = (m.msg_flags & MSG_TRUNC) != 0;
      d.ip_id = 0;
      d.seg_size = 0;
      d.tos = 0;
      d.hop_limit = 0;
      d.flow_label = 0;
      d.src.from_sockaddr(&s.names[i].sa, m.msg_namelen);
      d.dst = local;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
          in_pktinfo pi;
          std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
          std::memcpy(d.dst.addr, &pi.ipi_addr, 4);  // header destination address
          d.dst.ipv6 = false;
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
          in6_pktinfo pi;
          std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
          std::memcpy(d.dst.addr, &pi.ipi6_addr, 16);
          d.dst.ipv6 = true;
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
          d.tos = *CMSG_DATA(c);  // one byte
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
          int tc = 0;
          std::memcpy(&tc, CMSG_DATA(c), sizeof(tc));
          d.tos = static_cast<uint8_t>(tc);
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
          int hl = 0;
          std::memcpy(&hl, CMSG_DATA(c), sizeof(hl));
          d.hop_limit = static_cast<uint8_t>(hl);
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_FLOWINFO) {
          uint32_t fi = 0;  // network order: traffic class and flow label bits
          std::memcpy(&fi, CMSG_DATA(c), sizeof(fi));
          d.flow_label = ntohl(fi) & 0xfffffu;
        } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int g = 0;
          std::memcpy(&g, CMSG_DATA(c), sizeof(g));
          d.seg_size = uint16_t(g);
        }
      }
      if (d.seg_size >= d.len) d.seg_size = 0;
      if (d.truncated) bump(ctr_.rx_truncated);
      bump(ctr_.rx_packets, segments_of(d.len, d.seg_size));
      bump(ctr_.rx_bytes, d.len);
    }
    total += size_t(r);
    if (size_t(r) < n) break;
  }
  return int(total);
}

int probe_bind(const Endpoint& ep) {
  int s = socket(ep.ipv6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  int one = 1;
  if (ep.ipv6) (void)setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  sockaddr_storage ss;
  socklen_t len = ep.to_sockaddr(&ss);
  int rc = bind(s, reinterpret_cast<sockaddr*>(&ss), len) == 0 ? 0 : errno;
  close(s);
  return rc;
}

}  // namespace rnic::wire
