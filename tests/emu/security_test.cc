// tests/emu/security_test: the security conformance scenarios S31-S36 of docs/scenarios.md
// Client C and server S are devices with running engines on real loopback UDP (port 4791);
// the attacker A forges RoCEv2 packets (correct ICRC) through a plain UDP socket. Each test
// asserts statuses on both sides, QP states, counters, and that no byte outside the granted
// range changed (guard bands on every buffer).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "emu/services/services.h"
#include "tests/emu/attack_fixture.h"
#include "tests/emu/proto_util.h"
#include "wire/packet.h"
#include "wire/port.h"
#include "wire/udp_port.h"

namespace rnic::emu {
namespace {

class SecurityTest : public AttackPairTest {
 protected:
  SecurityTest() : AttackPairTest(31) {}
};

// S31: a NAK (0x62) spoofed from S's IP with the PSN of C's outstanding WRITE completes it with
// REM_ACCESS_ERR although S is healthy; a NAK with a PSN that is not outstanding is ignored.
TEST_F(SecurityTest, S31_SpoofedRemoteAccessNakFailsOutstandingWrite) {
  // C's fault engine keeps the WRITE outstanding (below).
  if (!wire::kFaultInjection) GTEST_SKIP() << "fault injection compiled out (-Dfault_injection=false)";
  test::ConnOpts o;
  o.timeout = 20;  // ~4 s: no retransmission during the test
  ASSERT_NO_FATAL_FAILURE(start(31, o));
  // Keep C's WRITE outstanding: C's own fault engine drops it on the way out (S stays healthy
  // and never sees it).
  ServicesOptions so;
  so.control = ControlMode::kOff;
  so.faults = "dir=tx class=write => drop";
  std::string err;
  svc_ = DeviceServices::create(c_.dev, so, &err);
  ASSERT_NE(svc_, nullptr) << err;
  post_write(256);
  ASSERT_TRUE(wait_until([&] { return svc_->faults().counters().dropped >= 1; }));

  Attacker a(s_ip_);  // S's IP, another UDP port
  wire::PacketFields nak;
  nak.opcode = wire::op::kRcAcknowledge;
  nak.dest_qp = qc_->qpn();
  // First a NAK (invalid request) for a PSN C never sent: must be ignored.
  nak.psn = kPsn + 50;
  nak.syndrome = 0x61;
  a.send(c_ip_, nak);
  // Then remote access error for the outstanding PSN.
  nak.psn = kPsn;
  nak.syndrome = 0x62;
  a.send(c_ip_, nak);

  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemAccessErr);  // not REM_INV_REQ: the first was ignored
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(qc_->state(), QpState::kErr);
  EXPECT_EQ(qctr(qc_, Ctr::kRemAccessNakRcvd), 1u);
  // S is untouched and healthy.
  EXPECT_EQ(qs_->state(), QpState::kRts);
  EXPECT_EQ(qctr(qs_, Ctr::kRcvdPkts), 0u);
  EXPECT_EQ(qctr(qs_, Ctr::kNakSent) + qctr(qs_, Ctr::kRemAccessNakSent), 0u);
  EXPECT_TRUE(target_is(0x5a));
  EXPECT_TRUE(dst_->guards_ok());
  EXPECT_TRUE(src_->guards_ok());
}

// S32: a WRITE_ONLY forged with C's source IP, the exact ePSN, the right QPN and rkey is
// executed; C's genuine WRITE with that PSN is then a duplicate: ACKed, not executed, and C
// sees SUCCESS while A's data is in memory. (Reproduced on purpose: no sentinel mode yet.)
TEST_F(SecurityTest, S32_ForgedWriteWithExactPsnFromClientIpIsExecuted) {
  ASSERT_NO_FATAL_FAILURE(start(32));
  Attacker a(c_ip_);  // C's IP, another UDP port (not checked by default; see S32s_*)
  std::vector<uint8_t> evil(512, 0xEE);
  a.send(s_ip_, forged_write(kPsn, ms_->rkey(), 512), evil);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kRdmaRecvs) == 1; }));

  post_write(512);  // C's genuine WRITE, PSN kPsn
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kDuplicateRequest) == 1; }));
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 1u);  // only A's was executed
  EXPECT_EQ(qc_->state(), QpState::kRts);
  EXPECT_EQ(qs_->state(), QpState::kRts);
  for (uint32_t i = 0; i < 512; ++i) ASSERT_EQ(dst_->data()[i], 0xEE) << i;
  for (uint32_t i = 512; i < kLen; ++i) ASSERT_EQ(dst_->data()[i], 0x5a) << i;
  EXPECT_TRUE(dst_->guards_ok());
  // The connection goes on: the next PSN executes normally.
  post_write(64, 2);
  c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 64), 0);
}

// S32 with the opt-in strict source check (DeviceConfig::strict_src, latching mode): C's first
// WRITE latches C's UDP source port (4791) on S's QP; A's WRITE forged with C's IP, the exact
// ePSN, QPN and rkey but from another UDP port is then dropped silently (drop_src_port), and
// C's genuine WRITE with that PSN executes. Paired with the same run without strict mode,
// where A's packet is accepted.
TEST_F(SecurityTest, S32s_StrictSrcLatchDropsForgedWriteFromOtherPort) {
  ASSERT_NO_FATAL_FAILURE(start(37));
  s_.dev->set_strict_src(true);  // latch the first-seen port
  post_write(256, 1);            // genuine, PSN kPsn: latches 4791
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(qs_->comp_.src_latch.load(), 0x10000u | wire::kRoceUdpPort);

  Attacker a(c_ip_);  // C's IP, another UDP port
  std::vector<uint8_t> evil(512, 0xEE);
  a.send(s_ip_, forged_write(kPsn + 1, ms_->rkey(), 512), evil);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kDropSrcPort) == 1; }));
  EXPECT_EQ(s_.eng->counters().get(Ctr::kDropSrcPort), 1u);
  EXPECT_EQ(qctr(qs_, Ctr::kDropAddr), 0u);
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 1u);
  EXPECT_EQ(s_.eng->counters().get(Ctr::kNakSent), 0u);

  post_write(512, 2);  // genuine, PSN kPsn + 1: executes (ePSN was not moved by A)
  c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 2u);
  // A did not move the ePSN: every duplicate S saw is one of C's own resends (a loaded
  // machine may fire C's probe timer), none is C's genuine PSN kPsn + 1 taken as old.
  EXPECT_LE(qctr(qs_, Ctr::kDuplicateRequest), qctr(qc_, Ctr::kRetransPkts));
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 512), 0);
  for (uint32_t i = 512; i < kLen; ++i) ASSERT_EQ(dst_->data()[i], 0x5a) << i;
  EXPECT_TRUE(dst_->guards_ok());
  EXPECT_EQ(qc_->state(), QpState::kRts);
  EXPECT_EQ(qs_->state(), QpState::kRts);
}

TEST_F(SecurityTest, S32s_WithoutStrictSrcForgedWriteFromOtherPortIsAccepted) {
  ASSERT_NO_FATAL_FAILURE(start(38));
  post_write(256, 1);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);

  Attacker a(c_ip_);
  std::vector<uint8_t> evil(512, 0xEE);
  a.send(s_ip_, forged_write(kPsn + 1, ms_->rkey(), 512), evil);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kRdmaRecvs) == 2; }));
  EXPECT_EQ(qctr(qs_, Ctr::kDropSrcPort), 0u);

  post_write(512, 2);  // now a duplicate: ACKed, not executed
  c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kDuplicateRequest) == 1; }));
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 2u);
  for (uint32_t i = 0; i < 512; ++i) ASSERT_EQ(dst_->data()[i], 0xEE) << i;
  EXPECT_TRUE(dst_->guards_ok());
}

// Strict source check with a fixed port (SOFTRNIC_STRICT_SRC_PORT=4791 through the services
// options): even A's packet sent before any genuine one is dropped (no latch to win).
TEST_F(SecurityTest, S32s_StrictSrcFixedPortDropsForgedFirstPacket) {
  ASSERT_NO_FATAL_FAILURE(start(39));
  ServicesOptions so;
  so.control = ControlMode::kOff;
  so.strict_src = true;
  so.strict_src_port = wire::kRoceUdpPort;
  std::string err;
  svc_ = DeviceServices::create(s_.dev, so, &err);
  ASSERT_NE(svc_, nullptr) << err;
  EXPECT_EQ(s_.dev->strict_src_mode(), Device::kStrictFixed | wire::kRoceUdpPort);

  Attacker a(c_ip_);
  std::vector<uint8_t> evil(512, 0xEE);
  a.send(s_ip_, forged_write(kPsn, ms_->rkey(), 512), evil);
  ASSERT_TRUE(wait_until([&] { return qctr(qs_, Ctr::kDropSrcPort) == 1; }));
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 0u);
  EXPECT_TRUE(target_is(0x5a));

  post_write(512);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 512), 0);
  EXPECT_LE(qctr(qs_, Ctr::kDuplicateRequest), qctr(qc_, Ctr::kRetransPkts));  // only C's resends
  EXPECT_TRUE(dst_->guards_ok());
}

// S33: the same forged WRITE from A's own IP is dropped silently at the address check: no NAK,
// ePSN unchanged (C's genuine WRITE then executes), drop_addr_mismatch counts it.
TEST_F(SecurityTest, S33_ForgedWriteFromForeignIpDroppedAtAddressCheck) {
  ASSERT_NO_FATAL_FAILURE(start(33));
  Attacker a(a_ip_);
  std::vector<uint8_t> evil(512, 0xEE);
  a.send(s_ip_, forged_write(kPsn, ms_->rkey(), 512), evil);
  ASSERT_TRUE(wait_until([&] { return s_.eng->counters().get(Ctr::kDropAddr) == 1; }));
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 0u);
  EXPECT_EQ(s_.eng->counters().get(Ctr::kNakSent), 0u);
  EXPECT_EQ(s_.eng->counters().get(Ctr::kRemAccessNakSent), 0u);
  EXPECT_TRUE(target_is(0x5a));

  post_write(512);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 512), 0);
  for (uint32_t i = 512; i < kLen; ++i) ASSERT_EQ(dst_->data()[i], 0x5a) << i;
  EXPECT_TRUE(dst_->guards_ok());
  EXPECT_LE(qctr(qs_, Ctr::kDuplicateRequest), qctr(qc_, Ctr::kRetransPkts));  // only C's resends
  EXPECT_EQ(qc_->state(), QpState::kRts);
  EXPECT_EQ(qs_->state(), QpState::kRts);
}

// S34: a sweep of 2^16 PSNs ahead of ePSN (spoofed from C's IP, valid rkey) executes nothing
// and draws at most one PSN-sequence NAK; C's connection survives.
TEST_F(SecurityTest, S34_PsnSweepAheadExecutesNothingOneNakPerGap) {
  ASSERT_NO_FATAL_FAILURE(start(34));
  // One genuine WRITE first (PSN kPsn): S has now seen C's requests in order from C's UDP
  // port, as in any live connection, so its stash would take packets from that port.
  post_write(256);
  {
    auto c0 = c_completions(1);
    ASSERT_EQ(c0.size(), 1u);
    ASSERT_EQ(c0[0].status, WcStatus::kSuccess);
  }
  Attacker a(c_ip_);
  std::vector<uint8_t> evil(64, 0xEE);
  std::vector<wire::PacketFields> sweep;
  sweep.reserve(1 << 16);
  // ePSN is kPsn + 1: the sweep starts one past it.
  for (uint32_t k = 2; k <= (1u << 16) + 1; ++k) sweep.push_back(forged_write((kPsn + k) & 0xFFFFFF, ms_->rkey(), 64));
  uint64_t rx0 = s_.eng->port().counters().rx_packets;
  const uint64_t c_rx0 = qctr(qc_, Ctr::kRcvdPkts);
  a.send_many(s_ip_, sweep, evil);
  // Wait until S has taken in what the kernel delivered (some may be lost to the socket
  // buffer; that is fine): its receive count stops moving.
  uint64_t last = 0;
  int still = 0;
  wait_until([&] {
    uint64_t now = s_.eng->port().counters().rx_packets - rx0;
    still = now == last ? still + 1 : 0;
    last = now;
    return now >= (1u << 16) || still >= 200;
  }, 20000);
  EXPECT_GT(last, 0u);
  uint64_t oos = qctr(qs_, Ctr::kOutOfSeqRequest);
  EXPECT_GE(oos, 1u);
  EXPECT_LE(qctr(qs_, Ctr::kNakSent), 1u);   // one PSN-sequence NAK for the gap episode
  // Nothing kept for later either: the stash takes only packets from the UDP source port of
  // C's in-order requests, and the forger's is another (docs/congestion.md §2).
  EXPECT_EQ(qctr(qs_, Ctr::kStashStored), 0u);
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 1u);  // C's genuine WRITE only
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 256), 0);
  for (uint32_t i = 256; i < kLen; ++i) ASSERT_EQ(dst_->data()[i], 0x5a) << i;
  EXPECT_TRUE(dst_->guards_ok());
  EXPECT_EQ(qs_->state(), QpState::kRts);
  std::printf("S34: %llu of 65536 forged packets reached S, out_of_seq_request=%llu naks_sent=%llu\n",
              static_cast<unsigned long long>(last), static_cast<unsigned long long>(oos),
              static_cast<unsigned long long>(qctr(qs_, Ctr::kNakSent)));
  // C has taken in S's NAK (for a PSN it had not sent): rcvd_pkts is bumped under C's send
  // lock with the completer's handling (emu/transport/recv.cc), so post_write comes after it.
  ASSERT_TRUE(wait_until([&] { return qctr(qc_, Ctr::kRcvdPkts) >= c_rx0 + qctr(qs_, Ctr::kNakSent); }))
      << "S's NAK never reached C (rcvd_pkts " << qctr(qc_, Ctr::kRcvdPkts) - c_rx0 << ")";
  // The stale NAK matched nothing; C's genuine WRITE goes through.
  post_write(1024);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 1024), 0);
  for (uint32_t i = 1024; i < kLen; ++i) ASSERT_EQ(dst_->data()[i], 0x5a) << i;
  EXPECT_EQ(qc_->state(), QpState::kRts);
  EXPECT_EQ(qs_->state(), QpState::kRts);
}

// S35: one forged WRITE with the exact ePSN and a wrong rkey kills the connection: S sends
// NAK 0x62 and moves to ERR, memory is unchanged; the NAK matches nothing outstanding at C, so
// C's next WRITE times out against the ERR QP (RETRY_EXC_ERR).
TEST_F(SecurityTest, S35_ForgedWrongRkeyKillsConnection) {
  test::ConnOpts o;
  o.timeout = 8;    // ~1 ms
  o.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(start(35, o));
  Attacker a(c_ip_);
  std::vector<uint8_t> evil(256, 0xEE);
  const uint64_t c_rx0 = qctr(qc_, Ctr::kRcvdPkts);
  a.send(s_ip_, forged_write(kPsn, ms_->rkey() ^ 0x00010000u, 256), evil);
  ASSERT_TRUE(wait_until([&] { return qs_->state() == QpState::kErr; }));
  EXPECT_EQ(qctr(qs_, Ctr::kRemAccessNakSent), 1u);
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 0u);
  EXPECT_TRUE(target_is(0x5a));
  EXPECT_TRUE(dst_->guards_ok());
  // The NAK reached C while nothing was outstanding (PSN kPsn not yet sent): ignored.
  ASSERT_TRUE(wait_until([&] { return qctr(qc_, Ctr::kRcvdPkts) > c_rx0; }))
      << "S's NAK never reached C";
  EXPECT_EQ(qc_->state(), QpState::kRts);
  post_write(256);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(qc_->state(), QpState::kErr);
  EXPECT_EQ(qctr(qc_, Ctr::kRetryExceededErr), 1u);
  // C's tries hit the ERR QP. C's ~1 ms timers can expire before S's progress thread has read
  // the datagrams on a loaded machine, so wait for S's count (bounded) instead of sampling it.
  EXPECT_TRUE(wait_until([&] { return s_.eng->counters().get(Ctr::kDropBadState) >= 1u; }))
      << "S never counted C's WRITE against its ERR QP";
  EXPECT_TRUE(target_is(0x5a));
  EXPECT_TRUE(dst_->guards_ok());
}

// S36: a second local device creates a QP aimed at S's QPN with the guessed PSN. Without the
// bind-local-qp hardening (not implemented) modify_qp(RTR) accepts it; it cannot take C's
// address (UDP 4791 on C's IP is held), and from its own address S's address check drops its
// WRITE, which ends in RETRY_EXC_ERR; S and C are unaffected.
TEST_F(SecurityTest, S36_LocalHijackQpAcceptedAtModifyButDroppedByAddressCheck) {
  ASSERT_NO_FATAL_FAILURE(start(36));
  // Same address as C: refused by the socket layer.
  Node same = Node::make_dev(c_ip_.c_str(), ErrorsMode::kSpec);
  auto e = Engine::start(same.dev, EngineConfig{});
  EXPECT_FALSE(e.has_value());
  if (!e.has_value()) {
    EXPECT_EQ(e.error(), Errc::kAddrInUse);
  }
  same.dev->close();
  // Own address: the QP is accepted.
  Node h = Node::on_udp(a_ip_.c_str());
  ASSERT_TRUE(h.eng);
  auto qh = h.qp(QpType::kRc);
  test::ConnOpts o;
  o.timeout = 8;
  o.retry_cnt = 1;
  o.sq_psn = kPsn;  // guessed
  o.rq_psn = kPsn;
  test::connect_qp(*h.dev, qh, s_ip_.c_str(), qs_->qpn(), o);
  EXPECT_EQ(qh->state(), QpState::kRts);
  test::GuardedBuf hsrc(256, 0xEE);
  auto mh = h.mr(hsrc.data(), 256);
  auto wr = test::send_wr(WrOpcode::kRdmaWrite, 9, {test::sge(hsrc.data(), 256, mh)});
  wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst_->data());
  wr.rdma.rkey = ms_->rkey();
  ASSERT_TRUE(test::post(qh, wr).is_ok());
  auto hc = test::poll_n(*h.scq, 1, 10000);
  ASSERT_EQ(hc.size(), 1u);
  EXPECT_EQ(hc[0].status, WcStatus::kRetryExcErr);
  EXPECT_GE(s_.eng->counters().get(Ctr::kDropAddr), 1u);
  EXPECT_EQ(qctr(qs_, Ctr::kRdmaRecvs), 0u);
  EXPECT_TRUE(target_is(0x5a));
  EXPECT_EQ(qs_->state(), QpState::kRts);
  h.eng->stop();
  // C's real connection is intact.
  post_write(128);
  auto c = c_completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), 128), 0);
  EXPECT_TRUE(dst_->guards_ok());
}

}  // namespace
}  // namespace rnic::emu
