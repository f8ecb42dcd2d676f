// UdpPort: the Port over a real UDP socket (IPv4 or IPv6), batched with sendmmsg /
// recvmmsg, DF set, IP_PKTINFO for each datagram's destination, optional UDP GSO / GRO.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "wire/port.h"

namespace rnic::wire {

struct UdpPortOptions {
  // Address to bind. port 0 = ephemeral (tests); the device uses kRoceUdpPort.
  // An unspecified address (0.0.0.0 / ::) is allowed; IP_PKTINFO still reports the
  // real destination of each datagram.
  Endpoint bind = Endpoint::v4(0x7f000002, kRoceUdpPort);
  // More local addresses, one socket each (the device's other GIDs: its interface's IPv6
  // addresses; a link-local one needs scope_id). A datagram leaves from the socket its
  // TxDesc::dst.src_index names (0 = bind, i + 1 = more[i]); RxDesc::dst.src_index tells
  // which one received it. Every socket uses bind.port. One socket per address, rather than
  // one dual-stack wildcard socket, keeps several devices on one host (127.0.0.2, ...) from
  // claiming each other's port, and makes the source address of every datagram the GID the
  // sender chose (docs/wire.md §5).
  std::vector<Endpoint> more;
  // SO_RCVBUF / SO_SNDBUF requested (best effort: the kernel caps them at
  // net.core.rmem_max / wmem_max; SO_*BUFFORCE is tried first when privileged).
  int rcvbuf = 8 << 20;
  int sndbuf = 4 << 20;
  // Use UDP_SEGMENT for TxDesc::gso_size when the kernel supports it (else the port
  // sends each segment as its own datagram, same bytes on the wire).
  bool gso = true;
  // Enable UDP_GRO: received buffers may then hold several coalesced datagrams
  // (RxDesc::seg_size); give each RxDesc a cap of 65535 or coalesced data is truncated.
  bool gro = false;
  // SO_REUSEPORT before bind: the daemon (daemon/) binds one socket per client on the
  // device's address, and a classic BPF program steers each datagram to one of them.
  bool reuseport = false;
  // Sockets already bound (daemon hosting: received from softrnicd), one per address in
  // order; `bind` and `more` are then ignored and the port owns these descriptors. Every
  // other option is still applied to them.
  std::vector<int> adopt;
  // A SOCK_SEQPACKET socket carrying datagrams that arrived at another socket, one SideFrame
  // and the UDP payload per message (daemon hosting: the QP1 traffic softrnicd routes to this
  // process). They come out of recv_batch like any datagram; the port owns the descriptor.
  int side_fd = -1;
};

// One forwarded datagram on UdpPortOptions::side_fd: this header, then the UDP payload.
struct SideFrame {
  uint8_t src_addr[16] = {};  // IPv4 in the first 4 bytes when !ipv6
  uint8_t dst_addr[16] = {};
  uint16_t src_port = 0;
  uint8_t ipv6 = 0;
  uint8_t dst_index = 0;      // which local address received it (RxDesc::dst.src_index)
  uint8_t tos = 0;
  uint8_t pad[3] = {};
  uint32_t scope_id = 0;
};
static_assert(sizeof(SideFrame) == 44);

// Contract: as Port. The socket is blocking for send (so a full send buffer applies
// back-pressure instead of dropping) and recv uses MSG_DONTWAIT, so recv_batch never
// blocks. DF is set (IP_PMTUDISC_DO / IPV6_PMTUDISC_DO) and the socket is never
// connected, so Linux writes IPv4 ID 0 on every non-GSO datagram — the ICRC the
// sender computes with ip_id 0 matches what is on the wire (proved by
// tests/wire/loopback_capture_test.cc). A datagram larger than the path MTU fails
// with EMSGSIZE (counted in tx_errors) instead of being fragmented.
class UdpPort final : public Port {
 public:
  // Opens and binds. Returns nullptr and sets *err (positive errno) on failure.
  static std::unique_ptr<UdpPort> open(const UdpPortOptions& opt, int* err = nullptr);
  ~UdpPort() override;

  const Endpoint& local() const override { return socks_[0].local; }
  const Endpoint& local_for(const Endpoint& dst) const override {
    return socks_[socket_for(dst)].local;
  }
  // Local address i (0 = bind, i + 1 = more[i]) with the real port; REQUIRES i < sockets().
  const Endpoint& local(size_t i) const { return socks_[i].local; }
  size_t sockets() const { return nsocks_; }
  // Socket i's descriptor (still owned by the port); REQUIRES i < sockets().
  int fd(size_t i) const { return socks_[i].fd; }
  // The socket itself (one address), else an epoll set of all of them (readable while
  // datagrams wait on any).
  int wait_fd() const override { return epfd_ < 0 ? socks_[0].fd : epfd_; }
  // One socket per group, bound to group:port with SO_REUSEADDR (every device and process on
  // the host that joined gets its own copy) and joined on the interface of local address
  // group.src_index (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP). Errors: EINVAL (not a multicast
  // address, or no local address of its family), EEXIST / ENOENT (already / not joined),
  // ENOSPC past kMaxGroups, or the socket's errno. Thread-safe against recv_batch.
  int join_group(const Endpoint& group, bool join) override;
  int group_wait_fd() const override { return gepfd_; }
  // The fullest unicast socket's rmem_alloc against its rcvbuf (SO_MEMINFO).
  int rx_fill_pct() const override;
  size_t groups() const { return ngroups_.load(std::memory_order_relaxed); }
  static constexpr size_t kMaxGroups = 64;

  bool gso_supported() const { return gso_; }
  bool gro_enabled() const { return gro_; }
  // Socket buffer sizes the kernel actually granted (bytes, as getsockopt reports).
  int rcvbuf() const { return rcvbuf_; }
  int sndbuf() const { return sndbuf_; }

  // Max datagrams per sendmmsg / recvmmsg syscall; larger spans are chunked.
  static constexpr int kBatch = 64;
  // Max segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS is 64 on older
  // kernels) and max bytes (a UDP datagram, minus headers).
  static constexpr int kMaxGsoSegments = 64;
  static constexpr uint32_t kMaxGsoBytes = 65507;
  // Most local addresses one port binds (bind + more).
  static constexpr size_t kMaxSockets = 16;

 protected:
  int send_impl(std::span<const TxDesc> pkts) override;
  int recv_impl(std::span<RxDesc> descs) override;
  int gso_max_segments_impl() const override { return gso_ ? kMaxGsoSegments : 1; }

 private:
  UdpPort() = default;
  int send_chunk(int fd, std::span<const TxDesc> pkts);
  int send_one_split(int fd, const TxDesc& d);
  int recv_socket(size_t k, std::span<RxDesc> descs) {
    return recv_fd(socks_[k].fd, socks_[k].local, descs);
  }
  int recv_fd(int fd, const Endpoint& local, std::span<RxDesc> descs);
  int recv_groups(std::span<RxDesc> descs);
  uint64_t kernel_drops() const override;
  int recv_side(std::span<RxDesc> descs);
  // The socket a datagram to dst leaves from: dst.src_index if it names one of dst's family,
  // else the first socket of that family.
  size_t socket_for(const Endpoint& dst) const;

  struct Sock {
    int fd = -1;
    Endpoint local;
  };
  Sock socks_[kMaxSockets];
  size_t nsocks_ = 0;
  int epfd_ = -1;
  // Multicast groups (join_group): changed under grp_mu_, read by the single consumer under
  // a try-lock only while ngroups_ != 0, so the unicast receive path costs one load.
  struct Group {
    Endpoint ep;   // the group address with the port's UDP port
    int fd = -1;
  };
  mutable std::mutex grp_mu_;
  std::vector<Group> groups_;
  std::atomic<size_t> ngroups_{0};
  int gepfd_ = -1;  // epoll set of the group sockets
  int side_fd_ = -1;
  size_t rx_next_ = 0;  // receive round-robin start (single consumer)
  bool gso_ = false;
  bool gro_ = false;
  int rcvbuf_ = 0;
  int sndbuf_ = 0;

  // Receive-side scratch (single consumer, so members are safe and allocation-free).
  struct RxScratch;
  std::unique_ptr<RxScratch> rx_;
};

// Tries to bind a UDP socket on `ep` (IPv6 sockets v6-only) and closes it again: 0 if the
// address and port are free, else the errno (EADDRINUSE when another device holds it).
int probe_bind(const Endpoint& ep);

}  // namespace rnic::wire
