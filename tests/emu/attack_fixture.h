// tests/emu/attack_fixture.h: the attacker-on-the-wire fixture shared by security_test and
// issue10_test: client C and server S are devices with running engines on real loopback UDP,
// one RC pair with guarded buffers; Attacker forges RoCEv2 packets (correct ICRC) from a plain
// UDP socket. Test-only (an anonymous namespace: each test binary gets its own copy).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "emu/services/services.h"
#include "tests/emu/proto_util.h"
#include "wire/packet.h"
#include "wire/port.h"
#include "wire/udp_port.h"

namespace rnic::emu {
namespace {


using test::Node;

bool wait_until(const std::function<bool()>& pred, int timeout_ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// The attacker: a UDP socket bound to any local address (spoofing = binding the victim's
// IP with another UDP port; the address check looks at IPs only).
struct Attacker {
  std::unique_ptr<wire::UdpPort> port;
  explicit Attacker(const std::string& ip) {
    wire::UdpPortOptions o;
    o.bind = *wire::Endpoint::parse(ip, 0);
    int err = 0;
    port = wire::UdpPort::open(o, &err);
    EXPECT_NE(port, nullptr) << "attacker bind " << ip << ": " << err;
  }
  // Builds f + payload with a correct ICRC for (our address -> to:4791) and sends it.
  void send(const std::string& to, const wire::PacketFields& f,
            std::span<const uint8_t> payload = {}) {
    std::vector<wire::PacketFields> one{f};
    send_many(to, one, payload);
  }
  void send_many(const std::string& to, const std::vector<wire::PacketFields>& fs,
                 std::span<const uint8_t> payload = {}) {
    wire::Endpoint dst = *wire::Endpoint::parse(to, wire::kRoceUdpPort);
    wire::IpUdpMeta m;
    std::memcpy(m.src, port->local().addr, 16);
    std::memcpy(m.dst, dst.addr, 16);
    m.src_port = port->local().port;
    m.dst_port = dst.port;
    constexpr size_t kBatch = 64;
    std::vector<std::vector<uint8_t>> bufs(kBatch, std::vector<uint8_t>(8192));
    std::vector<wire::TxDesc> descs(kBatch);
    for (size_t i = 0; i < fs.size(); i += kBatch) {
      size_t n = std::min(kBatch, fs.size() - i);
      for (size_t k = 0; k < n; ++k) {
        size_t len = wire::build_roce(bufs[k], fs[i + k], payload, m);
        ASSERT_GT(len, 0u);
        descs[k] = wire::TxDesc{dst, bufs[k].data(), static_cast<uint32_t>(len), 0};
      }
      size_t done = 0;
      while (done < n) {
        int r = port->send_batch(std::span<const wire::TxDesc>(descs.data() + done, n - done));
        ASSERT_GE(r, 0);
        done += static_cast<size_t>(r);
      }
    }
  }
};

uint64_t qctr(const std::shared_ptr<Qp>& q, Ctr c) { return q->comp_.ctr.get(c); }

// C (client) and S (server), one RC pair, C's source buffer and S's target buffer with guards.
class AttackPairTest : public ::testing::Test {
 protected:
  // Second octet of the 127.X.subnet.{1,2,3} addresses: one per test binary, so binaries run
  // in parallel never share a socket address.
  explicit AttackPairTest(int octet) : octet_(octet) {}

  static constexpr uint32_t kLen = 4096;
  static constexpr uint32_t kPsn = 100;  // C's sq_psn == S's rq_psn

  // Addresses per test so that back-to-back tests never share a socket address.
  void start(int subnet, test::ConnOpts o = {}) {
    const std::string net = "127." + std::to_string(octet_) + "." + std::to_string(subnet);
    c_ip_ = net + ".1";
    s_ip_ = net + ".2";
    a_ip_ = net + ".3";
    c_ = Node::on_udp(c_ip_.c_str());
    s_ = Node::on_udp(s_ip_.c_str());
    ASSERT_TRUE(c_.eng && s_.eng);
    qc_ = c_.qp(QpType::kRc);
    qs_ = s_.qp(QpType::kRc);
    o.sq_psn = kPsn;
    o.rq_psn = kPsn;
    test::connect_pair(c_, qc_, s_, qs_, o);
    src_ = std::make_unique<test::GuardedBuf>(kLen);
    dst_ = std::make_unique<test::GuardedBuf>(kLen, 0x5a);
    src_->pattern(3);
    mc_ = c_.mr(src_->data(), kLen);
    ms_ = s_.mr(dst_->data(), kLen);
  }
  void TearDown() override {
    svc_.reset();
    if (c_.eng) c_.eng->stop();
    if (s_.eng) s_.eng->stop();
  }

  void post_write(uint32_t len, uint64_t id = 1) {
    auto wr = test::send_wr(WrOpcode::kRdmaWrite, id, {test::sge(src_->data(), len, mc_)});
    wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst_->data());
    wr.rdma.rkey = ms_->rkey();
    ASSERT_TRUE(test::post(qc_, wr).is_ok());
  }
  std::vector<Cqe> c_completions(size_t n, int timeout_ms = 10000) {
    return test::poll_n(*c_.scq, n, timeout_ms);
  }
  // A forged RDMA WRITE_ONLY to S's QP at S's target buffer.
  wire::PacketFields forged_write(uint32_t psn, uint32_t rkey, uint32_t len) const {
    wire::PacketFields f;
    f.opcode = wire::op::kRcRdmaWriteOnly;
    f.dest_qp = qs_->qpn();
    f.psn = psn;
    f.ack_req = true;
    f.va = reinterpret_cast<uint64_t>(dst_->data());
    f.rkey = rkey;
    f.dma_len = len;
    return f;
  }
  bool target_is(uint8_t fill) const {
    for (uint32_t i = 0; i < kLen; ++i)
      if (dst_->mem[test::GuardedBuf::kGuard + i] != fill) return false;
    return true;
  }

  int octet_;
  std::string c_ip_, s_ip_, a_ip_;
  Node c_, s_;
  std::shared_ptr<Qp> qc_, qs_;
  std::unique_ptr<test::GuardedBuf> src_, dst_;
  std::shared_ptr<Mr> mc_, ms_;
  std::unique_ptr<DeviceServices> svc_;
};

}  // namespace
}  // namespace rnic::emu
