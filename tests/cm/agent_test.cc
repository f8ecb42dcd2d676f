// tests/cm/agent_test: the CM agent between two devices over the in-memory port: REQ/REP/RTU,
// DREQ/DREP and timewait, REJ 8 for no listener, REQ retries then kTimeout, a duplicate REQ
// making one connection (and drawing an MRA), destroy in REQ_SENT (REJ 4 matched by GUID),
// SIDR, argument errors, and a few hundred forged/malformed MADs counted and dropped.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "emu/cm/mad.h"
#include "wire/packet.h"
#include "tests/cm/cm_test_util.h"

namespace rnic::cm::testing {
namespace {

class CmAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = mem_node(net_, "127.0.0.2", 40);
    b_ = mem_node(net_, "127.0.0.3", 40);
    ASSERT_TRUE(a_ && b_);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
  }
  wire::MemNetwork net_;
  std::unique_ptr<Node> a_, b_;
};

TEST_F(CmAgent, NodeGuidsDiffer) {
  EXPECT_NE(a_->cm->ca_guid(), 0u);
  EXPECT_NE(a_->cm->ca_guid(), b_->cm->ca_guid());
}

TEST_F(CmAgent, ConnectDisconnectTimewait) {
  Recorder ra, rb;
  Agent& A = *a_->cm;
  Agent& B = *b_->cm;
  rb.on_event([&](const Event& e) {
    if (e.type == EventType::kReqReceived) {
      const uint8_t pd[3] = {7, 8, 9};
      RepParams r = rep_params();
      r.private_data = pd;
      EXPECT_EQ(B.send_rep(e.comm_id, r), 0);
    } else if (e.type == EventType::kDreqReceived) {
      EXPECT_EQ(B.send_drep(e.comm_id, {}), 0);
    }
  });
  ra.on_event([&](const Event& e) {
    if (e.type == EventType::kRepReceived) {
      EXPECT_EQ(A.send_rtu(e.comm_id, {}), 0);
    }
  });
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
  EXPECT_EQ(B.listen(kSid, rb.sink()), -EADDRINUSE);
  const uint8_t pd[5] = {1, 2, 3, 4, 5};
  const int64_t id = A.send_req(req_to(*a_, *b_, pd), ra.sink());
  ASSERT_GT(id, 0);
  ASSERT_TRUE(rb.wait(EventType::kRtuReceived));
  const Event req = rb.first(EventType::kReqReceived);
  EXPECT_EQ(req.service_id, kSid);
  EXPECT_EQ(req.remote_comm_id, static_cast<uint32_t>(id));
  EXPECT_EQ(req.remote_ca_guid, A.ca_guid());
  EXPECT_EQ(req.remote_qpn, 0x123u);
  EXPECT_EQ(req.starting_psn, 0xABCDu);
  EXPECT_EQ(req.responder_resources, 4);
  EXPECT_EQ(req.initiator_depth, 2);
  EXPECT_EQ(req.path.mtu, 3);
  EXPECT_EQ(req.path.remote_gid, A.local_gid());
  EXPECT_EQ(req.path.local_gid, B.local_gid());
  ASSERT_EQ(req.private_data.size(), kReqPrivateBytes);
  EXPECT_EQ(req.private_data[0], 1);
  EXPECT_EQ(req.private_data[4], 5);
  EXPECT_EQ(req.private_data[5], 0);
  const Event rep = ra.first(EventType::kRepReceived);
  EXPECT_EQ(rep.comm_id, static_cast<uint32_t>(id));
  EXPECT_EQ(rep.remote_comm_id, req.comm_id);
  EXPECT_EQ(rep.remote_qpn, 0x456u);
  EXPECT_EQ(rep.starting_psn, 0xBEEFu);
  EXPECT_EQ(rep.target_ack_delay, 15);
  EXPECT_EQ(rep.remote_ca_guid, B.ca_guid());
  ASSERT_EQ(rep.private_data.size(), kRepPrivateBytes);
  EXPECT_EQ(rep.private_data[2], 9);

  // Only an established id may send a DREQ.
  EXPECT_EQ(A.send_rtu(static_cast<uint32_t>(id), {}), -EPROTO);
  ASSERT_EQ(A.send_dreq(static_cast<uint32_t>(id), {}), 0);
  ASSERT_TRUE(ra.wait(EventType::kDrepReceived));
  ASSERT_TRUE(rb.wait(EventType::kDreqReceived));
  ASSERT_TRUE(ra.wait(EventType::kTimewaitExit));
  ASSERT_TRUE(rb.wait(EventType::kTimewaitExit));
  EXPECT_EQ(A.counters().connections, 0u);
  EXPECT_EQ(B.counters().connections, 0u);
  EXPECT_EQ(A.counters().mads_retried, 0u);
  EXPECT_EQ(ra.count(EventType::kTimeout), 0u);
}

TEST_F(CmAgent, NoListenerGetsRej8) {
  Recorder ra;
  const int64_t id = a_->cm->send_req(req_to(*a_, *b_), ra.sink());
  ASSERT_GT(id, 0);
  ASSERT_TRUE(ra.wait(EventType::kRejReceived));
  const Event e = ra.first(EventType::kRejReceived);
  EXPECT_EQ(e.reject_reason, kRejInvalidServiceId);
  EXPECT_EQ(e.msg, Msg::kReq);
  EXPECT_EQ(e.comm_id, static_cast<uint32_t>(id));
  EXPECT_EQ(b_->cm->counters().rej_sent, 1u);
  EXPECT_EQ(a_->cm->counters().connections, 0u);
}

// perftest -R listens twice on one port: a REQ that arrives between the first listen's end
// and the second listen is held, and delivered once the listen comes back.
TEST_F(CmAgent, ReqBetweenListensIsHeldForTheNextListen) {
  Recorder ra, rb1, rb2;
  Agent& A = *a_->cm;
  Agent& B = *b_->cm;
  ASSERT_EQ(B.listen(kSid, rb1.sink()), 0);
  ASSERT_EQ(B.cancel_listen(kSid), 0);
  const int64_t id = A.send_req(req_to(*a_, *b_), ra.sink());
  ASSERT_GT(id, 0);
  for (int i = 0; i < 500 && B.counters().reqs_held == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(B.counters().reqs_held, 1u);
  EXPECT_EQ(B.counters().rej_sent, 0u);
  EXPECT_EQ(ra.count(EventType::kRejReceived), 0u);
  ASSERT_EQ(B.listen(kSid, rb2.sink()), 0);
  ASSERT_TRUE(rb2.wait(EventType::kReqReceived));
  EXPECT_EQ(rb2.first(EventType::kReqReceived).remote_comm_id, static_cast<uint32_t>(id));
  EXPECT_EQ(rb1.count(EventType::kReqReceived), 0u);
  EXPECT_EQ(B.counters().rej_sent, 0u);
  EXPECT_EQ(B.counters().connections, 1u);
  // The held REQ is one MAD received, not two; its retransmissions are duplicates.
  const AgentCounters cb = B.counters();
  EXPECT_EQ(cb.mads_received, 1 + cb.dropped_duplicate);
}

// Several held REQs are delivered in the order they arrived.
TEST_F(CmAgent, HeldReqsAreDeliveredInArrivalOrder) {
  Recorder ra, rc, rb;
  Agent& B = *b_->cm;
  auto c = mem_node(net_, "127.0.0.4", 40);
  ASSERT_TRUE(c);
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
  ASSERT_EQ(B.cancel_listen(kSid), 0);
  const auto wait_held = [&](uint64_t n) {
    for (int i = 0; i < 500 && B.counters().reqs_held < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return B.counters().reqs_held == n;
  };
  ASSERT_GT(a_->cm->send_req(req_to(*a_, *b_), ra.sink()), 0);
  ASSERT_TRUE(wait_held(1));
  ASSERT_GT(c->cm->send_req(req_to(*c, *b_), rc.sink()), 0);
  ASSERT_TRUE(wait_held(2));
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
  ASSERT_TRUE(rb.wait(EventType::kReqReceived, 2));
  std::vector<uint64_t> from;
  for (const Event& e : rb.all())
    if (e.type == EventType::kReqReceived) from.push_back(e.remote_ca_guid);
  ASSERT_EQ(from.size(), 2u);
  EXPECT_EQ(from[0], a_->cm->ca_guid());
  EXPECT_EQ(from[1], c->cm->ca_guid());
}

// ... and answered with REJ 8 when no listen comes within kRelistenWindowMs.
TEST_F(CmAgent, HeldReqWithoutRelistenGetsRej8AfterTheWindow) {
  Recorder ra, rb;
  Agent& B = *b_->cm;
  // A requester whose REQ outlives the window (a_ caps its waits at 40 ms, 16 tries): its
  // retransmissions are dropped as duplicates while the first is held. 300 ms apart, so
  // none lands near the window's end (at 200 ms the fifth came at 1000 ms, on the deadline,
  // and sometimes drew a second REJ).
  auto slow = mem_node(net_, "127.0.0.4", 300);
  ASSERT_TRUE(slow);
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
  ASSERT_EQ(B.cancel_listen(kSid), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_GT(slow->cm->send_req(req_to(*slow, *b_), ra.sink()), 0);
  ASSERT_TRUE(ra.wait(EventType::kRejReceived, 1, 5000));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(ra.first(EventType::kRejReceived).reject_reason, kRejInvalidServiceId);
  EXPECT_EQ(B.counters().reqs_held, 1u);
  EXPECT_EQ(B.counters().rej_sent, 1u);
  EXPECT_GE(waited, std::chrono::milliseconds(kRelistenWindowMs));
  EXPECT_GE(B.counters().dropped_duplicate, 2u);  // ~3 REQ retries in the window
  EXPECT_EQ(B.counters().connections, 0u);
  const AgentCounters cb = B.counters();
  EXPECT_EQ(cb.mads_received, 1 + cb.dropped_duplicate);
}

TEST_F(CmAgent, ReqRetriesThenTimeout) {
  Recorder ra;
  ReqParams p = req_to(*a_, *b_);
  p.path.remote_gid[15] = 99;  // 127.0.0.99: nobody there
  p.max_cm_retries = 3;
  ASSERT_GT(a_->cm->send_req(p, ra.sink()), 0);
  ASSERT_TRUE(ra.wait(EventType::kTimeout));
  const Event e = ra.first(EventType::kTimeout);
  EXPECT_EQ(e.msg, Msg::kReq);
  EXPECT_EQ(e.status, -ETIMEDOUT);
  const AgentCounters c = a_->cm->counters();
  EXPECT_EQ(c.mads_sent, 4u);  // 1 + max_cm_retries
  EXPECT_EQ(c.mads_retried, 3u);
  EXPECT_EQ(c.timeouts, 1u);
  EXPECT_EQ(c.connections, 0u);
}

TEST_F(CmAgent, DuplicateReqMakesOneConnectionAndDrawsMra) {
  Recorder ra, rb;
  Agent& A = *a_->cm;
  Agent& B = *b_->cm;
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);  // answers nothing at first
  ra.on_event([&](const Event& e) {
    if (e.type == EventType::kRepReceived) {
      EXPECT_EQ(A.send_rtu(e.comm_id, {}), 0);
    }
  });
  ASSERT_GT(A.send_req(req_to(*a_, *b_), ra.sink()), 0);
  ASSERT_TRUE(ra.wait(EventType::kMraReceived));  // the retransmitted REQ drew an MRA
  EXPECT_EQ(ra.first(EventType::kMraReceived).service_timeout, 24);
  EXPECT_EQ(ra.first(EventType::kMraReceived).msg, Msg::kReq);
  ASSERT_TRUE(rb.wait(EventType::kReqReceived));
  EXPECT_EQ(rb.count(EventType::kReqReceived), 1u);
  EXPECT_GE(B.counters().dropped_duplicate, 1u);
  EXPECT_EQ(B.counters().connections, 1u);
  // Accept after the MRA: the active side (in MRA_REQ_RCVD) takes the REP.
  ASSERT_EQ(B.send_rep(rb.first(EventType::kReqReceived).comm_id, rep_params()), 0);
  ASSERT_TRUE(rb.wait(EventType::kRtuReceived));
  EXPECT_EQ(rb.count(EventType::kReqReceived), 1u);
}

TEST_F(CmAgent, DestroyInReqSentSendsRej4MatchedByGuid) {
  Recorder ra, rb;
  ASSERT_EQ(b_->cm->listen(kSid, rb.sink()), 0);
  const int64_t id = a_->cm->send_req(req_to(*a_, *b_), ra.sink());
  ASSERT_TRUE(rb.wait(EventType::kReqReceived));
  ASSERT_EQ(a_->cm->destroy(static_cast<uint32_t>(id)), 0);
  ASSERT_TRUE(rb.wait(EventType::kRejReceived));
  const Event e = rb.first(EventType::kRejReceived);
  EXPECT_EQ(e.reject_reason, kRejTimeout);
  ASSERT_EQ(e.ari.size(), 8u);
  EXPECT_EQ(b_->cm->counters().connections, 0u);
  EXPECT_EQ(a_->cm->counters().connections, 0u);
}

TEST_F(CmAgent, SidrResolvesAndNoListenerIsStatus1) {
  Recorder ra, rb;
  Agent& B = *b_->cm;
  constexpr uint64_t kUdpSid = 0x0000000001111C06ull;
  rb.on_event([&](const Event& e) {
    if (e.type != EventType::kSidrReqReceived) return;
    SidrRepParams p;
    p.qpn = 0x777;
    p.qkey = 0x01234567;
    EXPECT_EQ(B.sidr_rep(e.comm_id, p), 0);
  });
  ASSERT_EQ(B.listen(kUdpSid, rb.sink()), 0);
  SidrReqParams q;
  q.service_id = kUdpSid;
  q.path.local_gid = a_->cm->local_gid();
  q.path.remote_gid = b_->cm->local_gid();
  const uint8_t pd[2] = {0xAB, 0xCD};
  q.private_data = pd;
  ASSERT_GT(a_->cm->sidr_req(q, ra.sink()), 0);
  ASSERT_TRUE(ra.wait(EventType::kSidrRepReceived));
  Event e = ra.first(EventType::kSidrRepReceived);
  EXPECT_EQ(e.sidr_status, kSidrOk);
  EXPECT_EQ(e.qpn, 0x777u);
  EXPECT_EQ(e.qkey, 0x01234567u);
  EXPECT_EQ(rb.first(EventType::kSidrReqReceived).private_data.size(), kSidrReqPrivateBytes);
  EXPECT_EQ(rb.first(EventType::kSidrReqReceived).private_data[1], 0xCD);
  q.service_id = kUdpSid + 1;
  Recorder r2;
  ASSERT_GT(a_->cm->sidr_req(q, r2.sink()), 0);
  ASSERT_TRUE(r2.wait(EventType::kSidrRepReceived));
  EXPECT_EQ(r2.first(EventType::kSidrRepReceived).sidr_status, kSidrUnsupported);
  EXPECT_EQ(a_->cm->counters().connections, 0u);
}

TEST_F(CmAgent, BadArguments) {
  Recorder r;
  std::vector<uint8_t> big(kReqPrivateBytes + 1);
  EXPECT_EQ(a_->cm->send_req(req_to(*a_, *b_, big), r.sink()), -EINVAL);
  ReqParams p = req_to(*a_, *b_);
  p.local_qpn = 1u << 24;
  EXPECT_EQ(a_->cm->send_req(p, r.sink()), -EINVAL);
  p = req_to(*a_, *b_);
  p.path.remote_gid = {};
  EXPECT_EQ(a_->cm->send_req(p, r.sink()), -EHOSTUNREACH);
  EXPECT_EQ(a_->cm->send_rep(12345, rep_params()), -ENOENT);
  EXPECT_EQ(a_->cm->send_dreq(12345, {}), -ENOENT);
  EXPECT_EQ(a_->cm->cancel_listen(kSid), -ENOENT);
  std::vector<uint8_t> big_rej(kRejPrivateBytes + 1);
  RejParams rj;
  rj.private_data = big_rej;
  EXPECT_EQ(a_->cm->send_rej(1, rj), -EINVAL);
  EXPECT_EQ(a_->cm->destroy(12345), 0);
}

// Forged and malformed MADs: counted, dropped, never crash; a connection works afterwards.
TEST_F(CmAgent, MalformedMadsCountedAndDropped) {
  std::mt19937_64 rng(7);
  emu::Engine& ea = *a_->dev->engine();
  const wire::Endpoint to = *wire::Endpoint::parse("127.0.0.3", 4791);
  int wire_bad = 0;
  for (int i = 0; i < 300; ++i) {  // over the wire, random lengths and bytes
    std::vector<uint8_t> m(rng() % 300);
    for (auto& x : m) x = static_cast<uint8_t>(rng());
    if (m.size() == 256) m[0] = 9;  // bad base version
    ASSERT_TRUE(ea.send_gsi(to, 1, 0xFFFF, m).is_ok());
    ++wire_bad;
  }
  int injected = 0;
  for (int i = 0; i < 300; ++i) {  // valid headers over random bodies
    mad::Buf b;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    b[0] = 1;
    b[1] = 7;
    b[2] = 2;
    b[3] = 3;
    b[16] = 0;
    b[17] = static_cast<uint8_t>(0x10 + rng() % 9);
    b_->cm->inject_mad(b, 0x7f000002);
    ++injected;
  }
  for (int i = 0; i < 50; ++i) {  // truncated
    mad::Buf b{};
    b_->cm->inject_mad(std::span<const uint8_t>(b.data(), rng() % 256), 0x7f000002);
  }
  // Let the agent work through the queue.
  for (int i = 0; i < 200; ++i) {
    const AgentCounters c = b_->cm->counters();
    if (c.dropped_malformed + c.mads_received + c.dropped_unsupported >=
        static_cast<uint64_t>(wire_bad + injected + 50))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const AgentCounters c = b_->cm->counters();
  EXPECT_GE(c.dropped_malformed, static_cast<uint64_t>(wire_bad + 50));
  EXPECT_EQ(c.dropped_malformed + c.mads_received + c.dropped_unsupported,
            static_cast<uint64_t>(wire_bad + injected + 50));
  // Still works.
  Recorder ra, rb;
  Agent& A = *a_->cm;
  Agent& B = *b_->cm;
  rb.on_event([&](const Event& e) {
    if (e.type == EventType::kReqReceived) {
      EXPECT_EQ(B.send_rep(e.comm_id, rep_params()), 0);
    }
  });
  ra.on_event([&](const Event& e) {
    if (e.type == EventType::kRepReceived) {
      EXPECT_EQ(A.send_rtu(e.comm_id, {}), 0);
    }
  });
  ASSERT_EQ(B.listen(kSid, rb.sink()), 0);
  ASSERT_GT(A.send_req(req_to(*a_, *b_), ra.sink()), 0);
  EXPECT_TRUE(rb.wait(EventType::kRtuReceived));
}

// QP1 only takes the GSI Q_Key: a UD SEND to QPN 1 with another Q_Key never reaches the agent.
TEST_F(CmAgent, WrongQkeyOnQp1IsAQkeyViolation) {
  const uint64_t before = b_->cm->counters().dropped_malformed;
  wire::PacketFields f;
  f.opcode = wire::op::kUdSendOnly;
  f.dest_qp = 1;
  f.qkey = 0x12345678;
  f.src_qp = 1;
  mad::Rtu t;
  const mad::Buf m = mad::encode(t, 1);
  std::vector<uint8_t> pkt(512);
  const wire::Endpoint from = *wire::Endpoint::parse("127.0.0.2", 4791);
  const wire::Endpoint to = *wire::Endpoint::parse("127.0.0.3", 4791);
  const size_t n = wire::build_roce(pkt, f, m, wire::meta_between(from, to));
  ASSERT_GT(n, 0u);
  wire::TxDesc d{to, pkt.data(), static_cast<uint32_t>(n), 0};
  a_->dev->engine()->port().send_batch(std::span<wire::TxDesc>(&d, 1));
  for (int i = 0; i < 100 && b_->dev->query_port(1)->qkey_viol_cntr == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(b_->dev->query_port(1)->qkey_viol_cntr, 1u);
  EXPECT_EQ(b_->cm->counters().dropped_malformed, before);
  EXPECT_EQ(b_->cm->counters().dropped_unmatched, 0u);
}

}  // namespace
}  // namespace rnic::cm::testing
