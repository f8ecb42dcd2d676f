// tests/emu/req_peer_fixture.h: the requester-side protocol fixture (proto_req_test,
// proto_recovery_test): one device on a MemNetwork with an RC QP connected to a raw peer that
// plays the responder with hand-built ACKs, NAKs and responses; timers fired by hand.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "tests/emu/proto_util.h"

namespace rnic::emu::test {

inline constexpr uint32_t kPeerQpn = 0x000456;
inline constexpr uint32_t kSpsn = 500;

class ReqPeerFixture : public ::testing::Test {
 protected:
  explicit ReqPeerFixture(size_t buf_bytes = 1 << 19, const EngineConfig& ec = EngineConfig{})
      : s(Node::on_mem(net, "127.0.0.3", false, ErrorsMode::kSpec, 0, ec)), buf(buf_bytes) {}
  wire::MemNetwork net;
  Node s;
  Peer p{net, "127.0.0.2", "127.0.0.3"};
  std::shared_ptr<Qp> qp;
  GuardedBuf buf;
  std::shared_ptr<Mr> mb;
  static constexpr uint64_t kRemoteVa = 0x10000;
  static constexpr uint32_t kRkey = 0x777;

  void SetUp() override { setup({}); }
  void setup(ConnOpts o, uint32_t sq_psn = kSpsn) {
    qp = s.qp(QpType::kRc);
    o.sq_psn = sq_psn;
    o.rq_psn = 1;
    connect_qp(*s.dev, qp, "127.0.0.2", kPeerQpn, o);
    buf.pattern(3);
    mb = s.mr(buf.data(), buf.n);
  }
  Status post_op(WrOpcode opc, uint64_t id, uint32_t len, uint32_t flags = kSendSignaled,
                 uint32_t off = 0) {
    Wr w = send_wr(opc, id, {sge(buf.data() + off, len, mb)}, flags);
    w.rdma.remote_addr = kRemoteVa;
    w.rdma.rkey = kRkey;
    return post(qp, w);
  }
  std::vector<Captured> sent() { return p.recv_all(); }
  void respond(uint8_t opcode, uint32_t psn, uint8_t syndrome, std::span<const uint8_t> pay = {},
               uint64_t orig = 0) {
    wire::PacketFields f;
    f.opcode = opcode;
    f.dest_qp = qp->qpn();
    f.psn = psn;
    f.syndrome = syndrome;
    f.msn = 1;
    f.orig = orig;
    p.send(f, pay);
    s.eng->poll_rx();
  }
  void ack(uint32_t psn, uint8_t syn = wire::aeth::ack(wire::aeth::kCreditInvalid)) {
    respond(wire::op::kRcAcknowledge, psn, syn);
  }
  void fire_timers() { s.eng->run_timers(wire::monotonic_ns() + 3'600'000'000'000ull); }
  uint64_t ctr(Ctr c) { return qp->comp_.ctr.get(c); }
};

}  // namespace rnic::emu::test
