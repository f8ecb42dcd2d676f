// tests/emu/proto_util.h: helpers for the transport tests — devices with engines on a
// MemNetwork or on real loopback UDP, QP connect helpers, registered buffers with guard
// bands, a raw "peer" port that sends hand-built packets and captures what the device
// answers (protocol tests), and polling helpers.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "emu/transport/comp.h"
#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "wire/mem_port.h"
#include "wire/packet.h"
#include "wire/psn.h"

namespace rnic::emu {
// gtest prints a WcStatus by its name (EXPECT_EQ(status, WcStatus::kSuccess) failures).
inline void PrintTo(WcStatus s, std::ostream* os) { *os << wc_status_name(s); }
}  // namespace rnic::emu

namespace rnic::emu::test {

inline uint32_t ip4(const char* s) {
  return wire::Endpoint::parse(s, 0)->v4_host();
}

inline AhAttr ah_to(const char* ip) {
  AhAttr a;
  a.is_global = 1;
  a.port_num = 1;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 64;
  auto e = wire::Endpoint::parse(ip, 0);
  if (e && e->ipv6) {  // an IPv6 GID is the address itself
    std::memcpy(a.grh.dgid, e->addr, 16);
    return a;
  }
  uint32_t v = ip4(ip);
  a.grh.dgid[10] = 0xff;
  a.grh.dgid[11] = 0xff;
  a.grh.dgid[12] = static_cast<uint8_t>(v >> 24);
  a.grh.dgid[13] = static_cast<uint8_t>(v >> 16);
  a.grh.dgid[14] = static_cast<uint8_t>(v >> 8);
  a.grh.dgid[15] = static_cast<uint8_t>(v);
  return a;
}

// One device with its engine.
struct Node {
  std::string ip;
  std::shared_ptr<Device> dev;
  std::shared_ptr<Engine> eng;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> scq, rcq;

  // Engine on a MemNetwork port (progress thread off unless asked).
  // `base`: the rest of the engine's configuration (e.g. defer_inflight).
  static Node on_mem(wire::MemNetwork& net, const char* ip, bool thread = false,
                     ErrorsMode errors = ErrorsMode::kSpec, uint32_t active_mtu = 0,
                     const EngineConfig& base = EngineConfig{}) {
    Node n = make_dev(ip, errors, PinMode::kShadow, active_mtu);
    auto port = net.attach(*wire::Endpoint::parse(ip, wire::kRoceUdpPort));
    EXPECT_TRUE(port != nullptr);
    EngineConfig ec = base;
    ec.progress_thread = thread;
    auto e = Engine::start_with_port(n.dev, std::move(port), ec);
    EXPECT_TRUE(e.has_value());
    n.eng = *e;
    n.finish();
    return n;
  }
  // Engine on real UDP (ip:4791), progress thread on.
  static Node on_udp(const char* ip, bool thread = true, PinMode pin = PinMode::kShadow) {
    Node n = make_dev(ip, ErrorsMode::kSpec, pin);
    EngineConfig ec;
    ec.progress_thread = thread;
    auto e = Engine::start(n.dev, ec);
    EXPECT_TRUE(e.has_value()) << "engine start on " << ip;
    if (e) n.eng = *e;
    n.finish();
    return n;
  }
  // Engine on real UDP at the first of `ips` whose port 4791 is free (other test binaries
  // may hold some loopback addresses).
  // `ec`: the engine's configuration (its ip is ignored).
  static Node on_udp_first_free(std::initializer_list<const char*> ips,
                                const EngineConfig& ec = EngineConfig{}) {
    for (const char* ip : ips) {
      Node n = make_dev(ip, ErrorsMode::kSpec);
      auto e = Engine::start(n.dev, ec);
      if (!e) continue;
      n.eng = *e;
      n.finish();
      return n;
    }
    ADD_FAILURE() << "no free loopback address for a device";
    return Node{};
  }
  static Node make_dev(const char* ip, ErrorsMode errors, PinMode pin = PinMode::kShadow,
                       uint32_t active_mtu = 0) {
    Node n;
    n.ip = ip;
    DeviceConfig cfg;
    cfg.ip = ip;
    cfg.name = std::string("t_") + ip;
    cfg.netdev_mtu = 65536;
    cfg.active_mtu = active_mtu;  // SOFTRNIC_MTU (0: from netdev_mtu, 4096)
    cfg.errors = errors;
    cfg.pin = pin;
    auto d = Device::open(cfg);
    EXPECT_TRUE(d.has_value());
    n.dev = *d;
    return n;
  }
  void finish() {
    pd = *dev->alloc_pd();
    scq = *dev->create_cq(4096, nullptr, 0);
    rcq = *dev->create_cq(4096, nullptr, 0);
  }
  std::shared_ptr<Qp> qp(QpType t, std::shared_ptr<Srq> srq = nullptr, uint32_t depth = 256,
                         bool sig_all = false) {
    QpInitAttr ia;
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = srq;
    ia.qp_type = t;
    ia.sq_sig_all = sig_all;
    ia.cap.max_send_wr = depth;
    ia.cap.max_recv_wr = depth;
    ia.cap.max_send_sge = 16;
    ia.cap.max_recv_sge = 16;
    ia.cap.max_inline_data = 256;
    auto q = dev->create_qp(pd, ia);
    EXPECT_TRUE(q.has_value());
    return *q;
  }
  std::shared_ptr<Mr> mr(void* p, size_t len,
                         uint32_t access = kAccessLocalWrite | kAccessRemoteWrite |
                                           kAccessRemoteRead | kAccessRemoteAtomic,
                         std::shared_ptr<Pd> in_pd = nullptr) {
    auto a = reinterpret_cast<uint64_t>(p);
    auto m = dev->reg_mr(in_pd ? in_pd : pd, a, len, a, access);
    EXPECT_TRUE(m.has_value());
    return m ? *m : nullptr;
  }
};

struct ConnOpts {
  Mtu mtu = Mtu::k1024;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 10 us
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  uint32_t access = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                    kAccessRemoteAtomic;
  uint32_t sq_psn = 100;
  uint32_t rq_psn = 100;  // the peer's sq_psn must match
  uint32_t qkey = 0x11111111;
};

// Brings qp to RTS talking to (remote_ip, remote_qpn).
inline void connect_qp(Device& dev, const std::shared_ptr<Qp>& qp, const char* remote_ip,
                       uint32_t remote_qpn, const ConnOpts& o) {
  QpAttr a;
  a.qp_state = QpState::kInit;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = o.access;
  a.qkey = o.qkey;
  uint32_t m = kQpState | kQpPkeyIndex | kQpPort;
  m |= qp->type() == QpType::kUd ? kQpQkey : kQpAccessFlags;
  ASSERT_TRUE(dev.modify_qp(qp, a, m).is_ok());
  a = QpAttr{};
  a.qp_state = QpState::kRtr;
  m = kQpState;
  if (qp->type() != QpType::kUd) {
    a.ah_attr = ah_to(remote_ip);
    a.path_mtu = o.mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = o.rq_psn;
    m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
    if (qp->type() == QpType::kRc) {
      a.max_dest_rd_atomic = o.max_dest_rd_atomic;
      a.min_rnr_timer = o.min_rnr_timer;
      m |= kQpMaxDestRdAtomic | kQpMinRnrTimer;
    }
  }
  ASSERT_TRUE(dev.modify_qp(qp, a, m).is_ok());
  a = QpAttr{};
  a.qp_state = QpState::kRts;
  a.sq_psn = o.sq_psn;
  m = kQpState | kQpSqPsn;
  if (qp->type() == QpType::kRc) {
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  }
  ASSERT_TRUE(dev.modify_qp(qp, a, m).is_ok());
}

// Connects a <-> b (both RC or both UC).
inline void connect_pair(Node& na, const std::shared_ptr<Qp>& a, Node& nb,
                         const std::shared_ptr<Qp>& b, ConnOpts o = {}) {
  ConnOpts oa = o, ob = o;
  oa.rq_psn = o.rq_psn;
  oa.sq_psn = o.sq_psn;
  ob.rq_psn = o.sq_psn;
  ob.sq_psn = o.rq_psn;
  connect_qp(*na.dev, a, nb.ip.c_str(), b->qpn(), oa);
  connect_qp(*nb.dev, b, na.ip.c_str(), a->qpn(), ob);
}

// Runs both engines' receive paths until no packet moves (manual mode, MemPort).
inline void pump(std::initializer_list<Node*> nodes, int max_rounds = 100000) {
  for (int i = 0; i < max_rounds; ++i) {
    int moved = 0;
    for (Node* n : nodes) moved += n->eng->poll_rx();
    if (moved == 0) return;
  }
}

// A buffer with guard bands: data() is kGuard bytes into the allocation; the guards are
// filled with kGuardByte and checked by guards_ok().
struct GuardedBuf {
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xA5;
  std::vector<uint8_t> mem;
  size_t n;
  explicit GuardedBuf(size_t len, uint8_t fill = 0) : mem(len + 2 * kGuard, kGuardByte), n(len) {
    std::memset(mem.data() + kGuard, fill, len);
  }
  uint8_t* data() { return mem.data() + kGuard; }
  // Whole allocation (guards included), for registering an MR that covers the guards.
  uint8_t* raw() { return mem.data(); }
  size_t raw_size() const { return mem.size(); }
  bool guards_ok() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[i] != kGuardByte || mem[kGuard + n + i] != kGuardByte) return false;
    return true;
  }
  void pattern(uint32_t seed) {
    for (size_t i = 0; i < n; ++i) data()[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
};

inline Sge sge(const void* p, uint32_t len, const std::shared_ptr<Mr>& m) {
  return Sge{reinterpret_cast<uint64_t>(p), len, m ? m->lkey() : 0};
}

inline Status post_recv(const std::shared_ptr<Qp>& qp, uint64_t wr_id, std::vector<Sge> sges) {
  RecvWr wr;
  wr.wr_id = wr_id;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  int bad = 0;
  return qp->post_recv(&wr, 1, &bad);
}

// A SendWr that owns its SGE list (non-copyable so sg_list never dangles).
struct Wr : SendWr {
  std::vector<Sge> sg;
  Wr(WrOpcode op, uint64_t id, std::vector<Sge> s, uint32_t flags) : sg(std::move(s)) {
    wr_id = id;
    opcode = op;
    sg_list = sg.data();
    num_sge = static_cast<int>(sg.size());
    send_flags = flags;
  }
  Wr(const Wr&) = delete;
  Wr& operator=(const Wr&) = delete;
};

inline Wr send_wr(WrOpcode op, uint64_t wr_id, std::vector<Sge> sges,
                  uint32_t flags = kSendSignaled) {
  return Wr(op, wr_id, std::move(sges), flags);
}

inline Status post(const std::shared_ptr<Qp>& qp, const SendWr& wr) {
  int bad = 0;
  return qp->post_send(&wr, 1, &bad);
}

// Polls cq (driving receive inline through on_poll_empty) until n completions or timeout.
// spin: empty polls made back to back (as perftest spins on its CQ) before each further empty
// poll yields the CPU. With 0 every empty poll yields; on a loaded machine a yield can outlast
// a busy-poll gap, so tests of the busy-poll hand-off spin.
inline std::vector<Cqe> poll_n(Cq& cq, size_t n, int timeout_ms = 5000,
                               std::initializer_list<Node*> pump_nodes = {}, int spin = 0) {
  std::vector<Cqe> out;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Cqe buf[16];
  int empty = 0;
  while (out.size() < n && std::chrono::steady_clock::now() < end) {
    for (Node* nd : pump_nodes) nd->eng->poll_rx();
    int k = cq.poll(buf, static_cast<int>(std::min<size_t>(16, n - out.size())));
    for (int i = 0; i < k; ++i) out.push_back(buf[i]);
    if (k == 0 && pump_nodes.size() == 0 && ++empty > spin) std::this_thread::yield();
  }
  return out;
}

inline std::vector<Cqe> drain_cq(Cq& cq) {
  std::vector<Cqe> out;
  Cqe buf[16];
  int k;
  while ((k = cq.poll(buf, 16)) > 0)
    for (int i = 0; i < k; ++i) out.push_back(buf[i]);
  return out;
}

// ---- raw peer for protocol tests ----

// A packet captured from the device under test.
struct Captured {
  std::vector<uint8_t> bytes;
  wire::PacketView v;
  wire::PacketFields f;
  uint8_t opcode() const { return v.opcode; }
  uint32_t psn() const { return f.psn; }
  uint8_t syndrome() const { return f.syndrome; }
  uint16_t ip_id = 0;  // segment k of a GSO datagram arrives with k (MemPort)
};

// A hand-driven RoCE endpoint attached to the MemNetwork.
struct Peer {
  std::unique_ptr<wire::MemPort> port;
  wire::Endpoint self, dut;
  Peer(wire::MemNetwork& net, const char* ip, const char* dut_ip)
      : self(*wire::Endpoint::parse(ip, wire::kRoceUdpPort)),
        dut(*wire::Endpoint::parse(dut_ip, wire::kRoceUdpPort)) {
    port = net.attach(self);
  }
  wire::IpUdpMeta meta() const {
    wire::IpUdpMeta m;
    std::memcpy(m.src, self.addr, 16);
    std::memcpy(m.dst, dut.addr, 16);
    m.src_port = self.port;
    m.dst_port = dut.port;
    return m;
  }
  // Builds f (+payload) with a correct ICRC and sends it to the device.
  void send(const wire::PacketFields& f, std::span<const uint8_t> payload = {},
            bool corrupt_icrc = false) {
    std::vector<uint8_t> b(8192);
    size_t n = wire::build_roce(b, f, payload, meta());
    ASSERT_GT(n, 0u);
    if (corrupt_icrc) b[n - 1] ^= 0x01;
    wire::TxDesc t;
    t.dst = dut;
    t.data = b.data();
    t.len = static_cast<uint32_t>(n);
    ASSERT_EQ(port->send_batch(std::span<const wire::TxDesc>(&t, 1)), 1);
  }
  // Everything the device sent to us, parsed (ICRC checked).
  std::vector<Captured> recv_all() {
    std::vector<Captured> out;
    for (;;) {
      std::vector<uint8_t> buf(8192);
      wire::RxDesc d;
      d.buf = buf.data();
      d.cap = static_cast<uint32_t>(buf.size());
      int n = port->recv_batch(std::span<wire::RxDesc>(&d, 1));
      if (n <= 0) break;
      buf.resize(d.len);
      wire::IpUdpMeta m;
      std::memcpy(m.src, d.src.addr, 16);
      std::memcpy(m.dst, d.dst.addr, 16);
      m.src_port = d.src.port;
      m.dst_port = d.dst.port;
      m.ip_id = d.ip_id;
      EXPECT_TRUE(wire::icrc_check(m, buf)) << "device sent a packet with a bad ICRC";
      Captured c;
      c.ip_id = d.ip_id;
      c.bytes = std::move(buf);
      EXPECT_EQ(wire::parse_roce(c.bytes, &c.v), wire::ParseError::kOk);
      c.f = c.v.fields();
      out.push_back(std::move(c));
    }
    return out;
  }
};

inline const char* op_name(uint8_t op) {
  const char* n = wire::opcode_info(op).name;
  return n ? n : "?";
}

}  // namespace rnic::emu::test
