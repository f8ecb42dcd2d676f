// UdpPort: the Port over a real UDP socket (IPv4 or IPv6), batched with sendmmsg /
// recvmmsg, DF set, IP_PKTINFO for each datagram's destination, optional UDP GSO / GRO.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "wire/port.h"

namespace rnic::wire {

struct UdpPortOptions {
  // Address to bind. port 0 = ephemeral (tests); the device uses kRoceUdpPort.
  // An unspecified address (0.0.0.0 / ::) is allowed; IP_PKTINFO still reports the
  // real destination of each datagram.
  Endpoint bind = Endpoint::v4(0x7f000002, kRoceUdpPort);
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
};

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

  const Endpoint& local() const override { return local_; }
  // The socket itself (readable while datagrams wait).
  int wait_fd() const override { return fd_; }

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

 protected:
  int send_impl(std::span<const TxDesc> pkts) override;
  int recv_impl(std::span<RxDesc> descs) override;
  int gso_max_segments_impl() const override { return gso_ ? kMaxGsoSegments : 1; }

 private:
  UdpPort() = default;
  int send_chunk(std::span<const TxDesc> pkts);
  int send_one_split(const TxDesc& d);

  int fd_ = -1;
  Endpoint local_;
  bool gso_ = false;
  bool gro_ = false;
  int rcvbuf_ = 0;
  int sndbuf_ = 0;

  // Receive-side scratch (single consumer, so members are safe and allocation-free).
  struct RxScratch;
  std::unique_ptr<RxScratch> rx_;
};

}  // namespace rnic::wire
