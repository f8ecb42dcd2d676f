// Port base: Endpoint conversions, counters, and the fault-hook path (filter, held queue)
// shared by UdpPort and MemPort. The unfiltered path is a straight call to *_impl.
#include "wire/port.h"

#include "wire/icrc.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace rnic::wire {

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// ---- Endpoint -------------------------------------------------------------------------

std::optional<Endpoint> Endpoint::parse(std::string_view ip, uint16_t port) {
  char buf[INET6_ADDRSTRLEN + 1];
  if (ip.empty() || ip.size() >= sizeof(buf)) return std::nullopt;
  std::memcpy(buf, ip.data(), ip.size());
  buf[ip.size()] = '\0';
  Endpoint e;
  e.port = port;
  if (inet_pton(AF_INET, buf, e.addr) == 1) return e;
  // IPv6, optionally with a zone: "fe80::1%veth0" (or "%3").
  uint32_t scope = 0;
  if (char* pct = std::strchr(buf, '%')) {
    *pct = '\0';
    scope = if_nametoindex(pct + 1);
    if (scope == 0) scope = static_cast<uint32_t>(std::strtoul(pct + 1, nullptr, 10));
    if (scope == 0) return std::nullopt;
  }
  if (inet_pton(AF_INET6, buf, e.addr) == 1) {
    e.ipv6 = true;
    if (e.link_local()) e.scope_id = scope;
    return e;
  }
  return std::nullopt;
}

Endpoint Endpoint::v4(uint32_t a, uint16_t port) {
  Endpoint e;
  e.addr[0] = uint8_t(a >> 24);
  e.addr[1] = uint8_t(a >> 16);
  e.addr[2] = uint8_t(a >> 8);
  e.addr[3] = uint8_t(a);
  e.port = port;
  return e;
}

bool Endpoint::from_sockaddr(const sockaddr* sa, socklen_t len) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET && len >= socklen_t(sizeof(sockaddr_in))) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(sa);
    *this = Endpoint{};
    std::memcpy(addr, &s4->sin_addr, 4);
    port = ntohs(s4->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6 && len >= socklen_t(sizeof(sockaddr_in6))) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    *this = Endpoint{};
    port = ntohs(s6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
      std::memcpy(addr, s6->sin6_addr.s6_addr + 12, 4);
    } else {
      ipv6 = true;
      std::memcpy(addr, s6->sin6_addr.s6_addr, 16);
      if (link_local()) scope_id = s6->sin6_scope_id;
    }
    return true;
  }
  return false;
}

socklen_t Endpoint::to_sockaddr(sockaddr_storage* ss, bool with_flow) const {
  std::memset(ss, 0, sizeof(*ss));
  if (!ipv6) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr, addr, 4);
    return sizeof(sockaddr_in);
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(port);
  std::memcpy(&s6->sin6_addr, addr, 16);
  s6->sin6_scope_id = scope_id;
  if (with_flow) s6->sin6_flowinfo = htonl(flow_label & 0xfffffu);
  return sizeof(sockaddr_in6);
}

std::string Endpoint::ip_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(ipv6 ? AF_INET6 : AF_INET, addr, buf, sizeof(buf));
  return buf;
}

std::string Endpoint::to_string() const {
  std::string ip = ip_string();
  if (ipv6) return "[" + ip + "]:" + std::to_string(port);
  return ip + ":" + std::to_string(port);
}

// ---- Port -----------------------------------------------------------------------------

PortCounters Port::counters() const {
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  PortCounters c;
  c.tx_packets = ld(ctr_.tx_packets);
  c.tx_bytes = ld(ctr_.tx_bytes);
  c.tx_errors = ld(ctr_.tx_errors);
  c.rx_packets = ld(ctr_.rx_packets);
  c.rx_bytes = ld(ctr_.rx_bytes);
  c.rx_truncated = ld(ctr_.rx_truncated);
  c.rx_dropped = ld(ctr_.rx_dropped) + kernel_drops();
  c.unknown_dst = ld(ctr_.unknown_dst);
  c.filter_dropped = ld(ctr_.filter_dropped);
  c.filter_duplicated = ld(ctr_.filter_duplicated);
  c.filter_delayed = ld(ctr_.filter_delayed);
  return c;
}

bool Port::set_filter(PacketFilter* f) {
  if constexpr (!kFaultInjection) {
    (void)f;
    return false;
  }
  filter_.store(f, std::memory_order_release);
  return true;
}

int Port::send_batch(std::span<const TxDesc> pkts) {
  if constexpr (kFaultInjection) {
    PacketFilter* f = filter_for(Direction::kTx);
    if (f != nullptr) return send_filtered(f, pkts);
  }
  return send_impl(pkts);
}

int Port::recv_batch(std::span<RxDesc> descs) {
  if constexpr (kFaultInjection) {
    PacketFilter* f = filter_for(Direction::kRx);
    // Held packets can outlive the filter's removal: keep draining them.
    if (f != nullptr || held_n_.load(std::memory_order_acquire) != 0) {
      return recv_filtered(f, descs);
    }
  }
  return recv_impl(descs);
}

size_t Port::held_count() const { return held_n_.load(std::memory_order_acquire); }

uint64_t Port::next_held_deadline_ns() const {
  std::lock_guard<std::mutex> lk(held_mu_);
  uint64_t best = 0;
  for (const Held& h : held_) {
    if (best == 0 || h.due_ns < best) best = h.due_ns;
  }
  return best;
}

int Port::release_held() {
  // Pop due tx packets under the lock, send them outside it (send_impl may block).
  std::vector<Held> due;
  {
    HeldLock lk(*this);
    uint64_t now = monotonic_ns();
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->dir == Direction::kTx && it->due_ns <= now) {
        due.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Held& h : due) {
    TxDesc d{h.dst, h.bytes.data(), uint32_t(h.bytes.size()), 0};
    send_impl(std::span<const TxDesc>(&d, 1));
  }
  return int(due.size());
}

// Fault mode: every datagram (every GSO segment) is copied and filtered. A GSO descriptor
// whose segments all pass unchanged leaves as it came (one GSO send); otherwise its segments
// leave alone, and an unchanged segment k > 0 gets the ICRC of IP ID 0 (the ID the kernel
// gives a lone datagram) instead of ID k. Everything that leaves now goes in one send_impl.
// Allocation and locking are acceptable here; this path exists only with a filter.
int Port::send_filtered(PacketFilter* f, std::span<const TxDesc> pkts) {
  release_held();
  struct Out {
    const TxDesc* d;  // the descriptor it came from (its destination)
    bool whole;       // d itself, else the arena's bytes [off, off + len)
    size_t off;
    uint32_t len;
  };
  thread_local std::vector<uint8_t> arena;
  thread_local std::vector<Out> outs;
  thread_local std::vector<TxDesc> send;
  arena.clear();
  outs.clear();
  const Endpoint& src = local();
  for (const TxDesc& d : pkts) {
    uint32_t seg = d.gso_size != 0 ? d.gso_size : d.len;
    if (seg == 0) seg = 1;  // zero-length datagram: one iteration
    const size_t outs0 = outs.size(), arena0 = arena.size();
    bool intact = true;
    uint16_t k = 0;
    for (uint32_t off = 0; off < d.len || (off == 0 && d.len == 0); off += seg, ++k) {
      const uint32_t n = std::min(seg, d.len - off);
      const size_t at = arena.size();
      arena.insert(arena.end(), d.data + off, d.data + off + n);
      uint8_t* b = arena.data() + at;
      FilterOut out;
      out.len = n;
      Verdict v = f->on_packet(Direction::kTx, src, d.dst, std::span<uint8_t>(b, n), out);
      const uint32_t len = std::min(out.len, n);
      const bool same = len == n && (n == 0 || std::memcmp(b, d.data + off, n) == 0);
      intact = intact && same && v == Verdict::kPass;
      // Leaving alone: an unchanged segment k's ICRC (computed with ID k) redone for ID 0.
      if (same && k != 0 && !d.dst.ipv6 && n >= kIcrcBytes) {
        uint8_t* tail = b + n - kIcrcBytes;  // stored little-endian (wire/icrc.h)
        const uint32_t delta = icrc_id_delta(n - kIcrcBytes, k);
        for (int i = 0; i < 4; ++i) tail[i] ^= uint8_t(delta >> (8 * i));
      }
      switch (v) {
        case Verdict::kPass:
          outs.push_back(Out{&d, false, at, len});
          break;
        case Verdict::kDrop:
          bump(ctr_.filter_dropped);
          break;
        case Verdict::kDuplicate:
          bump(ctr_.filter_duplicated, out.copies);
          for (unsigned i = 0; i <= out.copies; ++i) outs.push_back(Out{&d, false, at, len});
          break;
        case Verdict::kDelay: {
          bump(ctr_.filter_delayed);
          HeldLock lk(*this);
          held_.push_back(Held{monotonic_ns() + uint64_t(out.delay_us) * 1000, Direction::kTx, src,
                               d.dst, std::vector<uint8_t>(b, b + len)});
          break;
        }
      }
      if (d.len == 0) break;
    }
    if (intact && d.gso_size != 0 && d.gso_size < d.len) {
      outs.resize(outs0);  // every segment passed unchanged: the descriptor goes as it is
      arena.resize(arena0);
      outs.push_back(Out{&d, true, 0, 0});
    }
  }
  send.clear();
  for (const Out& o : outs)
    send.push_back(o.whole ? *o.d : TxDesc{o.d->dst, arena.data() + o.off, o.len, 0});
  for (size_t done = 0; done < send.size();) {
    const int r = send_impl(std::span<const TxDesc>(send).subspan(done));
    done += r > 0 ? size_t(r) : 1;  // a refused datagram is skipped, as a lone send would be
  }
  return int(pkts.size());
}

// REQUIRES: held_mu_ (HeldLock).
void Port::hold_rx_segments(PacketFilter* f, const RxDesc& r, uint32_t from, uint64_t now,
                            const SegVerdict* pre) {
  const uint32_t seg = r.seg_size != 0 && r.seg_size < r.len ? r.seg_size : r.len;
  uint32_t k = seg == 0 ? 0 : from / seg;
  for (uint32_t off = from, j = 0; off < r.len || (off == 0 && r.len == 0);
       off += seg, ++k, ++j) {
    const uint32_t m = std::min<uint32_t>(seg, r.len - off);
    std::vector<uint8_t> bytes(r.buf + off, r.buf + off + m);
    uint64_t due = now;
    Held h{0, Direction::kRx, r.src, r.dst, {}, static_cast<uint16_t>(r.ip_id + k), r.tos,
           r.hop_limit, r.flow_label};
    if (f != nullptr || pre != nullptr) {
      FilterOut out;
      out.len = m;
      Verdict v;
      if (pre != nullptr) {
        v = pre[j].v;
        out = pre[j].out;
      } else {
        v = f->on_packet(Direction::kRx, r.src, r.dst, std::span<uint8_t>(bytes), out);
      }
      bytes.resize(std::min(out.len, m));
      if (v == Verdict::kDrop) {
        bump(ctr_.filter_dropped);
        if (seg == 0) break;
        continue;
      }
      if (v == Verdict::kDelay) {
        bump(ctr_.filter_delayed);
        due += uint64_t(out.delay_us) * 1000;
      }
      if (v == Verdict::kDuplicate) {
        bump(ctr_.filter_duplicated, out.copies);
        for (unsigned c = 0; c < out.copies; ++c) {
          Held d = h;
          d.due_ns = now;
          d.bytes = bytes;
          held_.push_back(std::move(d));
        }
      }
    }
    // Held segments were filtered already; they are delivered as they are.
    h.due_ns = due;
    h.bytes = std::move(bytes);
    held_.push_back(std::move(h));
    if (seg == 0) break;
  }
}

// Fault mode receive: due held rx packets first, then fresh datagrams, each filtered, in
// arrival order. A coalesced (GRO) buffer is split: its first segment is delivered now, the
// rest, and every datagram received after it in this call, are held (due now, filtered
// already) and come out of the next call in order.
int Port::recv_filtered(PacketFilter* f, std::span<RxDesc> descs) {
  size_t n = 0;
  {
    HeldLock lk(*this);
    uint64_t now = monotonic_ns();
    for (auto it = held_.begin(); it != held_.end() && n < descs.size();) {
      if (it->dir == Direction::kRx && it->due_ns <= now) {
        RxDesc& r = descs[n++];
        uint32_t len = uint32_t(it->bytes.size());
        r.truncated = len > r.cap;
        r.len = std::min(len, r.cap);
        std::memcpy(r.buf, it->bytes.data(), r.len);
        r.src = it->src;
        r.dst = it->dst;
        r.ip_id = it->ip_id;
        r.seg_size = 0;
        r.tos = it->tos;
        r.hop_limit = it->hop_limit;
        r.flow_label = it->flow_label;
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (n == descs.size()) return int(n);
  int got = recv_impl(descs.subspan(n));
  if (got < 0) return n > 0 ? int(n) : got;
  size_t end = n + size_t(got);
  size_t w = n;  // write cursor: survivors are compacted to descs[n..w)
  // Order is kept: a coalesced (GRO) buffer is split, its first segment stays here and the
  // rest goes to the held queue (due now) — and so does every datagram received after it
  // in this call, behind those segments, so the next call delivers them in arrival order.
  // (Delivering the later datagrams now let them overtake the held segments: a lossless
  // READ response stream arrived as X, X+2, LAST, X+1, ... whenever a capture or fault
  // filter was installed, and every such reorder cost a go-back.)
  bool spill = false;
  const uint64_t now0 = monotonic_ns();
  for (size_t i = n; i < end; ++i) {
    RxDesc& r = descs[i];
    if (spill) {
      HeldLock lk(*this);
      hold_rx_segments(f, r, 0, now0);
      continue;
    }
    // A coalesced buffer: every segment is filtered in place, in arrival order (a seeded
    // fault engine sees arrival order). If all pass unchanged in length, the buffer is
    // delivered whole; else its first segment is delivered (or not) by its verdict and the
    // rest held with theirs.
    RxDesc tail = r;
    const bool coalesced = r.seg_size != 0 && r.seg_size < r.len;
    thread_local std::vector<SegVerdict> pre;
    pre.clear();
    if (coalesced && f != nullptr) {
      bool all = true;
      for (uint32_t off = 0; off < r.len; off += r.seg_size) {
        const uint32_t m = std::min<uint32_t>(r.seg_size, r.len - off);
        SegVerdict sv;
        sv.out.len = m;
        sv.v = f->on_packet(Direction::kRx, r.src, r.dst, std::span<uint8_t>(r.buf + off, m),
                            sv.out);
        all = all && sv.v == Verdict::kPass && sv.out.len >= m;
        pre.push_back(sv);
      }
      if (all) {
        if (w != i) std::swap(descs[w], descs[i]);
        ++w;
        continue;
      }
    }
    if (coalesced && f == nullptr) {  // no filter (held packets draining): nothing to split for
      if (w != i) std::swap(descs[w], descs[i]);
      ++w;
      continue;
    }
    if (coalesced) {
      r.len = r.seg_size;
      r.seg_size = 0;
    }
    bool keep = true;
    if (f != nullptr) {
      FilterOut out;
      out.len = r.len;
      Verdict v;
      if (coalesced) {
        v = pre[0].v;
        out = pre[0].out;
      } else {
        v = f->on_packet(Direction::kRx, r.src, r.dst, std::span<uint8_t>(r.buf, r.len), out);
      }
      r.len = std::min(out.len, r.len);
      // A copy only for what is held (a passing packet is delivered from the buffer).
      auto held = [&] {
        return Held{now0, Direction::kRx, r.src, r.dst,
                    std::vector<uint8_t>(r.buf, r.buf + r.len), r.ip_id, r.tos, r.hop_limit,
                    r.flow_label};
      };
      switch (v) {
        case Verdict::kPass:
          break;
        case Verdict::kDrop:
          bump(ctr_.filter_dropped);
          keep = false;
          break;
        case Verdict::kDuplicate: {
          bump(ctr_.filter_duplicated, out.copies);
          HeldLock lk(*this);
          for (unsigned c = 0; c < out.copies; ++c) held_.push_back(held());
          break;
        }
        case Verdict::kDelay: {
          bump(ctr_.filter_delayed);
          HeldLock lk(*this);
          held_.push_back(held());
          held_.back().due_ns = monotonic_ns() + uint64_t(out.delay_us) * 1000;
          keep = false;
          break;
        }
      }
    }
    if (coalesced) {
      HeldLock lk(*this);
      hold_rx_segments(f, tail, tail.seg_size, now0, pre.size() > 1 ? pre.data() + 1 : nullptr);
      spill = true;
    }
    if (keep) {
      if (w != i) std::swap(descs[w], descs[i]);
      ++w;
    }
  }
  return int(w);
}

}  // namespace rnic::wire
