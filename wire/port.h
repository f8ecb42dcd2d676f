// Port: the interface the engine (emu/) sends and receives RoCEv2 datagrams through,
// implemented by UdpPort (a real UDP socket) and MemPort (an in-memory hub for tests),
// plus Endpoint (IP + UDP port) and the PacketFilter hook the fault engine plugs into.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include "wire/hdr.h"  // kRoceUdpPort (4791)
#include "wire/icrc.h"  // IpUdpMeta

namespace rnic::wire {

// True when the fault hooks are compiled in (meson option fault_injection; wire_dep
// passes -DSOFTRNIC_FAULTS=1 to every user so the header agrees across libraries).
#if defined(SOFTRNIC_FAULTS) && SOFTRNIC_FAULTS
inline constexpr bool kFaultInjection = true;
#else
inline constexpr bool kFaultInjection = false;
#endif

// An IP address and UDP port. IPv4 addresses sit in addr[0..3] in network byte order
// (the rest zero); IPv6 uses all 16 bytes. `port` is in host byte order.
// Plain value type: trivially copyable, comparable, no allocation.
struct Endpoint {
  bool ipv6 = false;
  uint8_t addr[16] = {};
  uint16_t port = 0;
  // How a datagram to this endpoint is sent (or, in RxDesc::dst, how it arrived); not part of
  // the address, so operator== and same_ip ignore them:
  //  - src_index: which of the port's local addresses sends it (UdpPortOptions::bind is 0,
  //    UdpPortOptions::more[i] is i + 1; the device's GID index). RxDesc::dst: the one it
  //    arrived on.
  //  - IPv6 header fields from the GRH (IBA A17.4.5.1): traffic class, flow label (20 bits),
  //    hop limit (0 = the kernel's default). IPv4 sends keep the kernel's TOS and TTL.
  //  - scope_id: interface index of a link-local IPv6 address (0 otherwise).
  uint8_t src_index = 0;
  uint8_t tclass = 0;
  uint8_t hop_limit = 0;
  uint32_t flow_label = 0;
  uint32_t scope_id = 0;

  // "127.0.0.2" or "::1" / "fe80::1" (no brackets, no port). nullopt if unparsable.
  static std::optional<Endpoint> parse(std::string_view ip, uint16_t port);
  // IPv4 from a host-order 32-bit address (0x7f000002 = 127.0.0.2).
  static Endpoint v4(uint32_t host_order_addr, uint16_t port);
  // From a sockaddr_in / sockaddr_in6. An IPv4-mapped IPv6 address (::ffff:a.b.c.d)
  // becomes a plain IPv4 Endpoint. Returns false for other families or short lengths.
  bool from_sockaddr(const sockaddr* sa, socklen_t len);
  // Fills a sockaddr_in / sockaddr_in6 (IPv6: with scope_id and, if with_flow, the flow
  // label in sin6_flowinfo); returns its length.
  socklen_t to_sockaddr(sockaddr_storage* ss, bool with_flow = false) const;
  // fe80::/10 (needs scope_id to be sent or bound).
  // An IP multicast address: IPv4 224.0.0.0/4, IPv6 ff00::/8.
  bool multicast() const { return ipv6 ? addr[0] == 0xff : (addr[0] & 0xf0) == 0xe0; }
  bool link_local() const { return ipv6 && addr[0] == 0xfe && (addr[1] & 0xc0) == 0x80; }
  // "127.0.0.2" / "::1".
  std::string ip_string() const;
  // "127.0.0.2:4791" / "[::1]:4791".
  std::string to_string() const;
  // IPv4 address as host-order uint32 (REQUIRES: !ipv6).
  uint32_t v4_host() const {
    return (uint32_t{addr[0]} << 24) | (uint32_t{addr[1]} << 16) | (uint32_t{addr[2]} << 8) | addr[3];
  }
  bool same_ip(const Endpoint& o) const {
    // Constant lengths, so the compiler compares in registers (a variable length was a libc
    // memcmp call on every packet a TxBatch sends: 1.6% of ib_write_bw's sender).
    if (ipv6 != o.ipv6) return false;
    return ipv6 ? std::memcmp(addr, o.addr, 16) == 0 : std::memcmp(addr, o.addr, 4) == 0;
  }
  friend bool operator==(const Endpoint& a, const Endpoint& b) {
    return a.port == b.port && a.same_ip(b);
  }
};

// One datagram to send. `data` is borrowed for the duration of send_batch only.
// gso_size != 0 asks for UDP GSO: `data` holds consecutive RoCE packets of gso_size
// bytes each (the last may be shorter) and the port sends them as separate datagrams,
// in one syscall where the kernel supports UDP_SEGMENT (see Port::max_gso_segments()).
// ICRC NOTE: the kernel numbers GSO segments; segment k of one descriptor leaves with
// IPv4 ID k (DF set, unconnected socket) and its own total length, so the caller must
// compute segment k's ICRC with ip_id = k. MemPort mirrors this (reports ip_id = k).
struct TxDesc {
  Endpoint dst;
  const uint8_t* data = nullptr;
  uint32_t len = 0;
  uint16_t gso_size = 0;
};

// One receive slot. The caller provides buf/cap; the port fills src, dst, len, ip_id,
// seg_size and truncated.
//  - src: sender's IP and UDP source port (the UDP source port is covered by ICRC).
//  - dst: the datagram's destination IP and this port's UDP port (UdpPort: the address its
//    socket is bound to, a multicast group's for a group socket; IP_PKTINFO on a wildcard bind).
//  - ip_id: the IPv4 ID if the port knows it (MemPort), else 0 (UdpPort: the kernel
//    does not report it; verify ICRC with 0 and fall back per the receive policy).
//  - seg_size: 0 for a single datagram; with GRO enabled (UdpPortOptions::gro) the
//    buffer may hold several coalesced datagrams of seg_size bytes each (last may be
//    shorter): split with for_each_segment(). Segment k arrived with IP ID base+k.
//  - truncated: the datagram was larger than cap; len == cap and the bytes are partial.
struct RxDesc {
  Endpoint src;
  Endpoint dst;
  uint8_t* buf = nullptr;
  uint32_t cap = 0;
  uint32_t len = 0;
  uint16_t ip_id = 0;
  uint16_t seg_size = 0;
  bool truncated = false;
  // IPv4 TOS / IPv6 traffic class (UdpPort: IP_RECVTOS / IPV6_RECVTCLASS; 0 if unknown). The
  // low 2 bits are ECN: 3 = CE (congestion experienced).
  uint8_t tos = 0;
  // IPv6 only (IPV6_RECVHOPLIMIT / IPV6_FLOWINFO; 0 if unknown): the hop limit and the 20-bit
  // flow label the datagram arrived with (the UD GRH image carries them).
  uint8_t hop_limit = 0;
  uint32_t flow_label = 0;
};

// Calls fn(std::span<uint8_t> segment, uint32_t index) for each datagram in `d`
// (one call when d.seg_size == 0).
template <typename Fn>
inline void for_each_segment(const RxDesc& d, Fn&& fn) {
  if (d.seg_size == 0 || d.seg_size >= d.len) {
    fn(std::span<uint8_t>(d.buf, d.len), 0u);
    return;
  }
  uint32_t idx = 0;
  for (uint32_t off = 0; off < d.len; off += d.seg_size, ++idx) {
    uint32_t n = d.len - off < d.seg_size ? d.len - off : d.seg_size;
    fn(std::span<uint8_t>(d.buf + off, n), idx);
  }
}

// Counters a port keeps (relaxed atomics; a snapshot may be slightly torn across fields).
struct PortCounters {
  uint64_t tx_packets = 0;      // datagrams handed to the network (GSO: per segment)
  uint64_t tx_bytes = 0;
  uint64_t tx_errors = 0;       // datagrams the kernel / hub refused (dropped, counted)
  uint64_t rx_packets = 0;      // datagrams delivered to the caller (GRO: per segment)
  uint64_t rx_bytes = 0;
  uint64_t rx_truncated = 0;    // larger than the caller's buffer
  uint64_t rx_dropped = 0;      // MemPort: queue full; UdpPort: full socket buffers
  uint64_t unknown_dst = 0;     // MemPort: no port attached at the destination
  uint64_t filter_dropped = 0;  // fault hook verdicts
  uint64_t filter_duplicated = 0;
  uint64_t filter_delayed = 0;
};

// ---- Fault-injection hook -----------------------------------------------------------

enum class Direction : uint8_t { kTx, kRx };

enum class Verdict : uint8_t {
  kPass,       // send / deliver (possibly rewritten in place, possibly truncated)
  kDrop,       // discard
  kDuplicate,  // deliver `out.copies` extra copies as well (1 = two packets total)
  kDelay,      // hold for out.delay_us, then deliver (packets behind it overtake it:
               // this is also how reordering is expressed)
};

// Filled by the filter. `len` starts at the packet's length; the filter may lower it
// (truncate) but not raise it.
struct FilterOut {
  uint32_t len = 0;
  uint32_t delay_us = 0;
  uint8_t copies = 1;
};

// The fault engine (emu/fault.*) implements this. The port consults it for every
// datagram of each direction it wants(), before the wire (tx) and before the caller sees it
// (rx). REQUIRES: thread-safe — it is called concurrently from every sending thread and
// from the receiving thread. `roce` is a private writable copy on tx and the caller's
// receive buffer on rx (starts at the BTH; ends with the ICRC); the filter may rewrite
// bytes in place (fixing the ICRC for IP ID 0 is its job). GSO descriptors are presented
// segment by segment; one whose segments all pass unchanged leaves whole, else its
// segments leave as plain datagrams (an unchanged segment k > 0 with its ICRC redone for
// ID 0). While tx is filtered max_gso_segments() is 1, so the engine builds no GSO runs.
// A coalesced rx buffer is presented segment by segment too, and delivered whole when all
// pass.
class PacketFilter {
 public:
  virtual ~PacketFilter() = default;
  virtual Verdict on_packet(Direction dir, const Endpoint& src, const Endpoint& dst,
                            std::span<uint8_t> roce, FilterOut& out) = 0;
  // Whether the port must present this direction's packets. False: the port bypasses the
  // filter for them (no call, no copy) and, on tx, lets the engine build GSO runs as without
  // a filter. Asked per batch, so it may change at any time; a GSO run built just before it
  // turned true is presented and sent segment by segment (send_filtered). Must be cheap.
  virtual bool wants(Direction dir) const {
    (void)dir;
    return true;
  }
};

// Packets a filter holds back (reorder, delay) or synthesizes (injected NAKs, duplicates),
// which the device must emit after its own port I/O. The fault engine (emu/fault/) is the
// one implementation; the transport (emu/transport/engine.*) sees only this interface, so
// fault injection stays a hook the transport calls and the build keeps the layers apart.
class HeldPacketSource {
 public:
  virtual ~HeldPacketSource() = default;
  // fn(ctx, src, dst, bytes) once per packet ready for direction dir, in order; returns how
  // many were emitted. kTx: send bytes to dst. kRx: process as if received from src.
  using EmitFn = void (*)(void* ctx, const Endpoint& src, const Endpoint& dst,
                          std::span<const uint8_t> bytes);
  virtual size_t drain(Direction dir, EmitFn fn, void* ctx) = 0;
  // CLOCK_MONOTONIC ns at which a held packet becomes due, or 0 if none is held.
  virtual uint64_t next_deadline_ns() const = 0;
  // Cheap test (no lock): true if anything may be waiting.
  virtual bool maybe_pending() const = 0;

  // drain() with any callable (not type-erased on the heap).
  template <typename Fn>
  size_t drain_with(Direction dir, Fn&& fn) {
    if (!maybe_pending()) return 0;
    return drain(
        dir,
        [](void* c, const Endpoint& s, const Endpoint& d, std::span<const uint8_t> b) {
          (*static_cast<std::remove_reference_t<Fn>*>(c))(s, d, b);
        },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }
};

// The ICRC's view of the IP/UDP headers of a datagram from src to dst: the one place an
// IpUdpMeta is filled from endpoints. ip_id as the sender's kernel emits it (0 with DF on an
// unconnected socket; segment k of a GSO batch: k), DF set (wire/udp_port.cc sets
// IP_PMTUDISC_DO).
inline IpUdpMeta meta_between(const Endpoint& src, const Endpoint& dst, uint16_t ip_id = 0) {
  IpUdpMeta m;
  m.ipv6 = src.ipv6;
  std::memcpy(m.src, src.addr, 16);
  std::memcpy(m.dst, dst.addr, 16);
  m.ip_id = ip_id;
  m.df = true;
  m.src_port = src.port;
  m.dst_port = dst.port;
  return m;
}

// ---- Port ---------------------------------------------------------------------------

// Contract:
//  - send_batch: THREAD-SAFE; any number of threads may send at once (the kernel /
//    the hub serialises). Hot path: no allocation, no logging, no lock (UdpPort) when
//    no filter is installed. Returns the number of descriptors consumed, in order
//    (== pkts.size() normally); a per-datagram error (EMSGSIZE, EHOSTUNREACH, unknown
//    MemPort destination ...) drops that datagram, counts it and continues. Returns
//    fewer than pkts.size() only when the kernel's send buffer is full (EAGAIN); returns
//    -errno if nothing could be consumed for a port-level reason (e.g. -EAGAIN).
//  - recv_batch: SINGLE CONSUMER (one thread at a time; the engine serialises with its
//    receive try-lock). Never blocks. Fills descs[0..n) and returns n (0 if nothing is
//    waiting) or -errno. Hot path: no allocation.
//  - wait_fd: a file descriptor that polls readable (EPOLLIN) while datagrams are waiting
//    (level-triggered: stays readable until drained), or -1. Owned by the port; do not
//    read from it or close it.
//  - Lifetime: the port must outlive every in-flight call; destroy it only after all
//    sender threads and the receiver have stopped.
class Port {
 public:
  virtual ~Port() = default;
  Port() = default;
  Port(const Port&) = delete;
  Port& operator=(const Port&) = delete;

  // The bound address (with the real port number when 0 was asked for).
  virtual const Endpoint& local() const = 0;
  // The local address a datagram to dst leaves from (a port with several addresses picks by
  // dst.src_index and family: UdpPort); the ICRC's source address.
  virtual const Endpoint& local_for(const Endpoint& dst) const {
    (void)dst;
    return local();
  }
  virtual int wait_fd() const = 0;
  // UD multicast (IBA 10.5): join (join = true) or leave the IP multicast group `group` (its
  // port is ignored) on the interface of local address group.src_index, so that datagrams to
  // group:local().port come out of recv_batch with RxDesc::dst = the group. The caller counts
  // references: one join per group. 0 or -errno (-EOPNOTSUPP: this port has no multicast).
  virtual int join_group(const Endpoint& group, bool join) {
    (void)group;
    (void)join;
    return -EOPNOTSUPP;
  }
  // A second descriptor that polls readable while multicast datagrams wait, or -1. Owned by
  // the port; watch it next to wait_fd().
  virtual int group_wait_fd() const { return -1; }

  int send_batch(std::span<const TxDesc> pkts);
  int recv_batch(std::span<RxDesc> descs);

  // Largest GSO segment count one TxDesc may carry: 1 = no GSO (caller sends single
  // datagrams), also while a filter is installed.
  int max_gso_segments() const {
    if constexpr (kFaultInjection) {
      if (filter_for(Direction::kTx) != nullptr) return 1;
    }
    return gso_max_segments_impl();
  }

  PortCounters counters() const;

  // How full the receive queue is: the fullest of the port's unicast sockets, in percent of
  // what it may hold before the kernel drops (rmem_alloc against rcvbuf; a MemPort: queued
  // datagrams against its depth). -1 when the port cannot tell. A system call per socket:
  // for a receive that found backlog (a full batch), not per packet. The kernel's rmem_alloc
  // still counts datagrams already read until UDP releases them in a step (up to rcvbuf/4)
  // or the queue empties: the distance to a drop, not only what is left to read.
  virtual int rx_fill_pct() const { return -1; }

  // Installs (or with nullptr removes) the fault hook. The filter must outlive its
  // installation. A no-op returning false when faults are compiled out.
  // Not synchronised with in-flight calls beyond the pointer swap: install before
  // traffic starts, or accept that calls already inside may still use the old one.
  bool set_filter(PacketFilter* f);
  // Delayed packets held by the port (fault mode only). release_held() sends due tx
  // packets now (they are also released at the start of every send_batch; due rx
  // packets come out of recv_batch). next_held_deadline_ns() is CLOCK_MONOTONIC ns of
  // the earliest held packet, or 0 if none (for the progress thread's timerfd).
  // held_count() is the number held. Held rx packets do NOT make wait_fd readable: a
  // progress loop must also wake at next_held_deadline_ns() while held_count() != 0.
  // Tx packets still held when the filter is removed go out only via release_held().
  int release_held();
  uint64_t next_held_deadline_ns() const;
  size_t held_count() const;

 protected:
  // Implementations: same contracts as send_batch / recv_batch, without the filter.
  virtual int send_impl(std::span<const TxDesc> pkts) = 0;
  virtual int recv_impl(std::span<RxDesc> descs) = 0;
  virtual int gso_max_segments_impl() const { return 1; }
  // Datagrams the kernel dropped at this port's sockets (full receive buffers), added to
  // rx_dropped by counters(). Control path: a system call per socket.
  virtual uint64_t kernel_drops() const { return 0; }

  struct AtomicCounters {
    std::atomic<uint64_t> tx_packets{0}, tx_bytes{0}, tx_errors{0};
    std::atomic<uint64_t> rx_packets{0}, rx_bytes{0}, rx_truncated{0}, rx_dropped{0};
    std::atomic<uint64_t> unknown_dst{0};
    std::atomic<uint64_t> filter_dropped{0}, filter_duplicated{0}, filter_delayed{0};
  };
  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.fetch_add(n, std::memory_order_relaxed);
  }
  AtomicCounters ctr_;

 private:
  int send_filtered(PacketFilter* f, std::span<const TxDesc> pkts);
  int recv_filtered(PacketFilter* f, std::span<RxDesc> descs);

  struct Held {
    uint64_t due_ns;
    Direction dir;
    Endpoint src, dst;
    std::vector<uint8_t> bytes;
    // Rx: what the datagram arrived with (RxDesc fields; ip_id already per segment).
    uint16_t ip_id = 0;
    uint8_t tos = 0;
    uint8_t hop_limit = 0;
    uint32_t flow_label = 0;
  };
  // A segment's filter verdict, taken before the segment is held.
  struct SegVerdict {
    Verdict v = Verdict::kPass;
    FilterOut out;
  };
  // Rx, filtered mode: every segment of r from byte `from` on goes to the held queue, each
  // filtered (dropped, duplicated or delayed as its verdict says), due now otherwise. With
  // `pre`, pre[j] is the verdict already taken for the j-th of those segments (f is not asked).
  void hold_rx_segments(PacketFilter* f, const RxDesc& r, uint32_t from, uint64_t now,
                        const SegVerdict* pre = nullptr);
  // Locks held_mu_ and, on scope exit, publishes held_.size() to held_n_ so the receive
  // path can test "anything held?" without taking the mutex.
  struct HeldLock {
    explicit HeldLock(Port& p) : port(p), lk(p.held_mu_) {}
    ~HeldLock() { port.held_n_.store(port.held_.size(), std::memory_order_release); }
    Port& port;
    std::lock_guard<std::mutex> lk;
  };

  // The installed filter if it wants dir's packets (PacketFilter::wants), else nullptr.
  PacketFilter* filter_for(Direction dir) const {
    PacketFilter* f = filter_.load(std::memory_order_acquire);
    return f != nullptr && f->wants(dir) ? f : nullptr;
  }

  std::atomic<PacketFilter*> filter_{nullptr};
  mutable std::mutex held_mu_;
  std::deque<Held> held_;  // fault mode only; allocation is acceptable there
  std::atomic<size_t> held_n_{0};
};

// Monotonic clock in nanoseconds (CLOCK_MONOTONIC), used for held-packet deadlines.
uint64_t monotonic_ns();

}  // namespace rnic::wire
