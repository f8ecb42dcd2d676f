// tests/emu/cq_srq_test.cc: completion queues (ring order, every field, overflow -> CQ error
// + async CQ_ERR + QP to ERR, resize, arming and solicited-only), completion channels with
// a pollable eventfd and event holds, the async event fd, and SRQs (post, limit event, modify).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <thread>

#include "tests/emu/emu_test_util.h"

namespace rnic::emu {
namespace {

using testing::drive_to;
using testing::Env;
using testing::open_device;

bool readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

Cqe make_cqe(uint64_t id, WcStatus st = WcStatus::kSuccess) {
  Cqe e;
  e.wr_id = id;
  e.status = st;
  e.opcode = WcOpcode::kRecv;
  e.byte_len = 100 + static_cast<uint32_t>(id);
  e.imm_data = 0xAABBCCDD;
  e.qp_num = 0x1234;
  e.src_qp = 0x55;
  e.wc_flags = kWcWithImm | kWcGrh;
  e.pkey_index = 0;
  e.slid = 7;
  e.sl = 3;
  e.dlid_path_bits = 1;
  return e;
}

TEST(Cq, FifoOrderAndEveryField) {
  auto dev = open_device();
  auto cq = *dev->create_cq(8, nullptr, 0);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(cq->push(make_cqe(i)));
  Cqe out[8];
  ASSERT_EQ(cq->poll(out, 2), 2);
  ASSERT_EQ(cq->poll(out + 2, 8), 3);
  uint64_t prev_ts = 0;
  for (uint64_t i = 0; i < 5; ++i) {
    Cqe want = make_cqe(i);
    EXPECT_EQ(out[i].wr_id, i);
    EXPECT_EQ(out[i].status, want.status);
    EXPECT_EQ(out[i].opcode, want.opcode);
    EXPECT_EQ(out[i].byte_len, want.byte_len);
    EXPECT_EQ(out[i].imm_data, want.imm_data);
    EXPECT_EQ(out[i].qp_num, want.qp_num);
    EXPECT_EQ(out[i].src_qp, want.src_qp);
    EXPECT_EQ(out[i].wc_flags, want.wc_flags);
    EXPECT_EQ(out[i].slid, want.slid);
    EXPECT_EQ(out[i].sl, want.sl);
    EXPECT_EQ(out[i].dlid_path_bits, want.dlid_path_bits);
    EXPECT_GE(out[i].timestamp_ns, prev_ts);
    EXPECT_GT(out[i].timestamp_ns, 0u);
    prev_ts = out[i].timestamp_ns;
  }
  EXPECT_EQ(cq->poll(out, 8), 0);
}

TEST(Cq, CreateLimits) {
  auto dev = open_device();
  EXPECT_EQ(dev->create_cq(0, nullptr, 0).error(), Errc::kInval);
  EXPECT_EQ(dev->create_cq(dev->attr().max_cqe + 1, nullptr, 0).error(), Errc::kInval);
  EXPECT_EQ(dev->create_cq(4, nullptr, 1).error(), Errc::kInval);  // one comp vector
  EXPECT_TRUE(dev->create_cq(dev->attr().max_cqe, nullptr, 0).has_value());
}

TEST(Cq, OverflowGivesCqErrorAsyncEventAndQpErr) {
  Env env(testing::test_config(), /*cqe=*/4);
  auto qp = env.qp(QpType::kRc, 16, nullptr, /*sig_all=*/true);
  drive_to(*env.dev, qp, QpState::kRts);
  // Six signaled WRs into a 4-entry CQ; the "completer" retires them one by one.
  Sge sge{0, 0, 0};
  for (int i = 0; i < 6; ++i) {
    SendWr wr;
    wr.wr_id = 100 + i;
    wr.opcode = WrOpcode::kSend;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    int bad;
    ASSERT_TRUE(qp->post_send(&wr, 1, &bad).is_ok());
  }
  int completed = 0;
  {
    std::scoped_lock lk(qp->send_mutex(), qp->recv_mutex());
    while (!qp->sq().empty()) {
      if (!qp->complete_send_head_locked(WcStatus::kSuccess)) {
        qp->enter_error_locked();  // IBA Class G: the QP concerned goes to ERR
        break;
      }
      ++completed;
    }
  }
  EXPECT_EQ(completed, 4);
  EXPECT_TRUE(env.cq->in_error());
  EXPECT_EQ(qp->state(), QpState::kErr);
  EXPECT_TRUE(qp->sq().empty());  // the rest was flushed (into the broken CQ: lost)
  AsyncEvent ev;
  ASSERT_TRUE(readable(env.dev->async_events().fd()));
  ASSERT_TRUE(env.dev->async_events().try_get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kCqErr);
  EXPECT_EQ(ev.cq, env.cq);
  EXPECT_EQ(env.dev->async_events().try_get(&ev), Errc::kAgain);  // CQ_ERR raised once
  // The four completions that fit are still there, in order; further pushes fail.
  auto got = env.drain();
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i].wr_id, 100u + i);
  EXPECT_FALSE(env.cq->push(make_cqe(1)));
}

TEST(Cq, ResizeKeepsOrderAndRefusesShrinkBelowCount) {
  auto dev = open_device();
  auto cq = *dev->create_cq(4, nullptr, 0);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(cq->push(make_cqe(i)));
  Cqe out[8];
  ASSERT_EQ(cq->poll(out, 1), 1);  // move the head off slot 0
  ASSERT_TRUE(cq->push(make_cqe(3)));
  ASSERT_TRUE(cq->push(make_cqe(4)));  // wraps
  EXPECT_EQ(dev->resize_cq(cq, 3), Errc::kInval);
  ASSERT_TRUE(dev->resize_cq(cq, 10).is_ok());
  EXPECT_EQ(cq->cqe(), 10u);
  for (uint64_t i = 5; i < 11; ++i) ASSERT_TRUE(cq->push(make_cqe(i)));
  ASSERT_EQ(cq->poll(out, 8), 8);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(out[i].wr_id, i + 1);
  ASSERT_EQ(cq->poll(out, 8), 2);
  EXPECT_EQ(dev->resize_cq(cq, 0), Errc::kInval);
}

TEST(CompChannel, FdPollsReadableOnlyAfterArmedCompletion) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  EXPECT_FALSE(readable(ch->fd()));
  ASSERT_TRUE(cq->push(make_cqe(1)));  // not armed: no event
  EXPECT_FALSE(readable(ch->fd()));
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(2)));
  EXPECT_TRUE(readable(ch->fd()));
  EXPECT_FALSE(cq->armed());
  ASSERT_TRUE(cq->push(make_cqe(3)));  // one event per arm
  EXPECT_EQ(ch->pending(), 1u);
  auto got = ch->get_event();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, cq);
  EXPECT_FALSE(readable(ch->fd()));
  cq->ack_events(1);
  EXPECT_EQ(cq->events_delivered(), 1u);
  EXPECT_EQ(cq->events_acked(), 1u);
  // Non-blocking fd semantics: O_NONBLOCK set by the application -> EAGAIN when empty.
  int fl = fcntl(ch->fd(), F_GETFL);
  ASSERT_EQ(fcntl(ch->fd(), F_SETFL, fl | O_NONBLOCK), 0);
  EXPECT_EQ(ch->get_event().error(), Errc::kAgain);
  EXPECT_EQ(ch->try_get_event().error(), Errc::kAgain);
  // destroy_comp_channel refuses while a CQ is attached.
  EXPECT_EQ(dev->destroy_comp_channel(ch), Errc::kBusy);
  ASSERT_TRUE(dev->destroy_cq(cq).is_ok());
  EXPECT_TRUE(dev->destroy_comp_channel(ch).is_ok());
}

// ibv_modify_cq moderation: events held back until the count, or the period's end.
TEST(CqModeration, CountHoldsTheEventUntilTheNthCompletion) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  ASSERT_TRUE(cq->set_moderation(3, 0).is_ok());
  EXPECT_EQ(cq->moderation_count(), 3u);
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(1)));
  ASSERT_TRUE(cq->push(make_cqe(2)));
  EXPECT_FALSE(readable(ch->fd()));  // two of three: no event yet
  Cqe out[4];
  EXPECT_EQ(cq->poll(out, 4), 2);  // polling is never held back
  ASSERT_TRUE(cq->push(make_cqe(3)));
  EXPECT_TRUE(readable(ch->fd()));
  EXPECT_EQ(ch->pending(), 1u);
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(1);
  // Count 1 (or 0 with period 0): an event at the first completion, as without moderation.
  ASSERT_TRUE(cq->set_moderation(1, 0).is_ok());
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(4)));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(1);
  EXPECT_EQ(cq->set_moderation(2, kMaxCqPeriodUs + 1), Errc::kInval);
  EXPECT_EQ(cq->moderation_count(), 1u);  // refused: unchanged
  ASSERT_TRUE(dev->destroy_cq(cq).is_ok());
}

struct TimerHooks : TransportHooks {
  Cq* cq = nullptr;
  uint64_t deadline = 0;
  void on_post_send(Qp&) override {}
  void on_post_recv(Qp&) override {}
  void on_modify(Qp&, QpState, QpState) override {}
  void on_destroy(Qp&) override {}
  void on_poll_empty(Cq&) override {}
  bool on_cq_deadline(Cq& c, uint64_t d) override {
    cq = &c;
    deadline = d;
    return true;
  }
};

TEST(CqModeration, PeriodRaisesTheEventWhenItsTimerRunsOut) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  ASSERT_TRUE(cq->set_moderation(100, 50).is_ok());  // 100 completions or 50 µs
  // Without an engine the period cannot be timed: the event comes at once.
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(1)));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(1);
  Cqe out[4];
  ASSERT_EQ(cq->poll(out, 4), 1);
  // With one: the first completion starts the period and asks for a timer at its end.
  TimerHooks h;
  dev->set_hooks(&h);
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(2)));
  ASSERT_EQ(h.cq, cq.get());
  ASSERT_EQ(cq->poll(out, 4), 1);
  EXPECT_EQ(h.deadline, out[0].timestamp_ns + 50000);
  h.deadline = 0;
  ASSERT_TRUE(cq->push(make_cqe(3)));  // the running period is not restarted
  EXPECT_EQ(h.deadline, 0u);
  EXPECT_FALSE(readable(ch->fd()));
  EXPECT_EQ(cq->moderation_tick(out[0].timestamp_ns + 49999), out[0].timestamp_ns + 50000);
  EXPECT_FALSE(readable(ch->fd()));  // early tick: still held
  EXPECT_EQ(cq->moderation_tick(out[0].timestamp_ns + 50000), 0u);
  EXPECT_TRUE(readable(ch->fd()));
  EXPECT_EQ(ch->pending(), 1u);
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(1);
  EXPECT_EQ(cq->moderation_tick(out[0].timestamp_ns + 90000), 0u);  // nothing left to time
  EXPECT_EQ(ch->pending(), 0u);
  dev->set_hooks(nullptr);
  ASSERT_TRUE(dev->destroy_cq(cq).is_ok());
}

// A CQ that does not stamp completions (the shim's, unless created with a completion-timestamp
// wc_flag) leaves timestamp_ns 0, and a moderation period still starts at the clock's now.
TEST(CqModeration, PeriodStartsAtNowWhenCompletionsAreNotStamped) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  cq->set_timestamps(false);
  ASSERT_TRUE(cq->set_moderation(100, 50).is_ok());
  TimerHooks h;
  dev->set_hooks(&h);
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  const uint64_t before = Device::now_ns();
  ASSERT_TRUE(cq->push(make_cqe(1)));
  const uint64_t after = Device::now_ns();
  Cqe out[4];
  ASSERT_EQ(cq->poll(out, 4), 1);
  EXPECT_EQ(out[0].timestamp_ns, 0u);
  EXPECT_GE(h.deadline, before + 50000);
  EXPECT_LE(h.deadline, after + 50000);
  cq->set_timestamps(true);
  ASSERT_TRUE(cq->push(make_cqe(2)));
  ASSERT_EQ(cq->poll(out, 4), 1);
  EXPECT_GE(out[0].timestamp_ns, after);
  dev->set_hooks(nullptr);
  ASSERT_TRUE(dev->destroy_cq(cq).is_ok());
}

TEST(CompChannel, BlockingGetEventWakesOnCompletion) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  std::thread producer([&] { EXPECT_TRUE(cq->push(make_cqe(9))); });
  auto got = ch->get_event();  // blocking fd: waits for the producer
  producer.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, cq);
  cq->ack_events(1);
}

TEST(CompChannel, SolicitedOnlyArm) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto cq = *dev->create_cq(16, ch, 0);
  ASSERT_TRUE(cq->req_notify(true).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(1), /*solicited=*/false));
  EXPECT_FALSE(readable(ch->fd()));  // unsolicited success does not fire
  ASSERT_TRUE(cq->push(make_cqe(2), /*solicited=*/true));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  // An unsuccessful completion fires a solicited-only arm too.
  ASSERT_TRUE(cq->req_notify(true).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(3, WcStatus::kRemAccessErr), false));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(2);
  // Re-arming "next" over "solicited" keeps the wider condition.
  ASSERT_TRUE(cq->req_notify(false).is_ok());
  ASSERT_TRUE(cq->req_notify(true).is_ok());
  ASSERT_TRUE(cq->push(make_cqe(4), false));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  cq->ack_events(1);
}

// The receive path holds events until its batch's ACKs are sent (ib_send_lat -e relies on
// the ACK reaching the peer before the reply it provokes): completions stay pollable at
// once, events fire in push order at release(), and nothing is lost or duplicated.
TEST(CompChannel, EventHoldDelaysEventsNotCompletions) {
  auto dev = open_device();
  auto ch = *dev->create_comp_channel();
  auto a = *dev->create_cq(16, ch, 0);
  auto b = *dev->create_cq(16, ch, 0);
  ASSERT_TRUE(a->req_notify(false).is_ok());
  ASSERT_TRUE(b->req_notify(false).is_ok());
  {
    CqEventHold hold;
    ASSERT_TRUE(b->push(make_cqe(1)));
    ASSERT_TRUE(a->push(make_cqe(2)));
    EXPECT_FALSE(b->armed());  // the arm is consumed at push, as without a hold
    EXPECT_FALSE(readable(ch->fd()));
    EXPECT_EQ(ch->pending(), 0u);
    Cqe out;
    ASSERT_EQ(b->poll(&out, 1), 1);
    EXPECT_EQ(out.wr_id, 1u);
    hold.release();
    EXPECT_EQ(ch->pending(), 2u);
    ASSERT_TRUE(b->req_notify(false).is_ok());
    ASSERT_TRUE(b->push(make_cqe(3)));  // still held: fires when the hold ends
    EXPECT_EQ(ch->pending(), 2u);
  }
  EXPECT_EQ(ch->pending(), 3u);
  EXPECT_EQ(*ch->get_event(), b);
  EXPECT_EQ(*ch->get_event(), a);
  EXPECT_EQ(*ch->get_event(), b);
  EXPECT_FALSE(readable(ch->fd()));
  a->ack_events(1);
  b->ack_events(2);
  // Without a hold, push notifies at once again.
  ASSERT_TRUE(a->req_notify(false).is_ok());
  ASSERT_TRUE(a->push(make_cqe(4)));
  EXPECT_TRUE(readable(ch->fd()));
  ASSERT_TRUE(ch->get_event().has_value());
  a->ack_events(1);
}

TEST(AsyncEvents, PortStateEventsOnPollableFd) {
  auto dev = open_device();
  EXPECT_FALSE(readable(dev->async_events().fd()));
  dev->set_port_state(PortState::kDown);
  dev->set_port_state(PortState::kActive);
  AsyncEvent ev;
  ASSERT_TRUE(readable(dev->async_events().fd()));
  ASSERT_TRUE(dev->async_events().get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kPortErr);
  ASSERT_TRUE(dev->async_events().get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kPortActive);
  EXPECT_EQ(ev.port_num, 1);
  EXPECT_FALSE(readable(dev->async_events().fd()));
  EXPECT_EQ((*dev->query_port(1)).state, PortState::kActive);
}

// ------------------------------------------------------------------ SRQ

std::shared_ptr<Srq> make_srq(Env& env, uint32_t max_wr, uint32_t limit) {
  SrqAttr a;
  a.max_wr = max_wr;
  a.max_sge = 2;
  a.srq_limit = limit;
  auto r = env.dev->create_srq(env.pd, a);
  EXPECT_TRUE(r.has_value());
  return *r;
}

void post_srq(const std::shared_ptr<Srq>& srq, int n, uint64_t first_id = 0) {
  for (int i = 0; i < n; ++i) {
    Sge s[2] = {{0x1000, 64, 7}, {0x2000, 32, 7}};
    RecvWr wr{first_id + i, s, 2};
    int bad;
    ASSERT_TRUE(srq->post_recv(&wr, 1, &bad).is_ok());
  }
}

TEST(Srq, LimitEventFiresOnceWhenDepthDropsBelowLimit) {
  Env env;
  auto srq = make_srq(env, 16, 0);
  post_srq(srq, 10);
  SrqAttr a;
  a.srq_limit = 4;
  ASSERT_TRUE(env.dev->modify_srq(srq, a, kSrqLimit).is_ok());
  EXPECT_TRUE(srq->limit_armed());
  RecvWqe w;
  Sge sges[2];
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(srq->pop(&w, sges));  // depth 4: not below
  AsyncEvent ev;
  EXPECT_EQ(env.dev->async_events().try_get(&ev), Errc::kAgain);
  ASSERT_TRUE(srq->pop(&w, sges));  // depth 3 < 4
  EXPECT_EQ(w.wr_id, 6u);
  EXPECT_EQ(w.length, 96u);
  EXPECT_EQ(w.sge[1].addr, 0x2000u);
  ASSERT_TRUE(env.dev->async_events().try_get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kSrqLimitReached);
  EXPECT_EQ(ev.srq, srq);
  EXPECT_FALSE(srq->limit_armed());
  ASSERT_TRUE(srq->pop(&w, sges));
  EXPECT_EQ(env.dev->async_events().try_get(&ev), Errc::kAgain);  // once per arm
}

TEST(Srq, PostAndModifyRules) {
  Env env;
  auto srq = make_srq(env, 4, 0);
  Sge s[3] = {};
  RecvWr too_many{1, s, 3};
  int bad = -1;
  EXPECT_EQ(srq->post_recv(&too_many, 1, &bad), Errc::kInval);
  EXPECT_EQ(bad, 0);
  RecvWr no_list{2, nullptr, 1};  // SGEs promised, none given: refused, not dereferenced
  bad = -1;
  EXPECT_EQ(srq->post_recv(&no_list, 1, &bad), Errc::kInval);
  EXPECT_EQ(bad, 0);
  post_srq(srq, 4);
  RecvWr one{9, s, 1};
  EXPECT_EQ(srq->post_recv(&one, 1, &bad), Errc::kNoMem);
  SrqAttr a;
  a.max_wr = 3;  // below the current count
  EXPECT_EQ(env.dev->modify_srq(srq, a, kSrqMaxWr), Errc::kInval);
  a.srq_limit = 5;  // above max_wr
  EXPECT_EQ(env.dev->modify_srq(srq, a, kSrqLimit), Errc::kInval);
  a.max_wr = 8;
  ASSERT_TRUE(env.dev->modify_srq(srq, a, kSrqMaxWr).is_ok());
  EXPECT_EQ(srq->query().max_wr, 8u);
  EXPECT_TRUE(srq->post_recv(&one, 1, &bad).is_ok());
  RecvWqe w;
  Sge out[2];
  for (uint64_t i = 0; i < 4; ++i) {  // the entries survived the resize, in order, with SGEs
    ASSERT_TRUE(srq->pop(&w, out));
    EXPECT_EQ(w.wr_id, i);
    EXPECT_EQ(w.sge[0].addr, 0x1000u);
  }
  ASSERT_TRUE(srq->pop(&w, out));
  EXPECT_EQ(w.wr_id, 9u);
  EXPECT_FALSE(srq->pop(&w, out));
  SrqAttr bad_attr;
  bad_attr.max_wr = 0;
  bad_attr.max_sge = 1;
  EXPECT_EQ(env.dev->create_srq(env.pd, bad_attr).error(), Errc::kInval);
  bad_attr.max_wr = 4;
  bad_attr.max_sge = 28;
  EXPECT_EQ(env.dev->create_srq(env.pd, bad_attr).error(), Errc::kInval);
}

TEST(Srq, QpWithSrqRefusesPostRecvAndSignalsLastWqeOnErr) {
  Env env;
  auto srq = make_srq(env, 8, 0);
  auto qp = env.qp(QpType::kRc, 8, srq);
  EXPECT_EQ(qp->cap().max_recv_wr, 0u);
  drive_to(*env.dev, qp, QpState::kRts);
  Sge s{0, 0, 0};
  RecvWr wr{1, &s, 1};
  int bad;
  EXPECT_EQ(qp->post_recv(&wr, 1, &bad), Errc::kInval);
  EXPECT_EQ(env.dev->destroy_srq(srq), Errc::kBusy);
  drive_to(*env.dev, qp, QpState::kErr);
  AsyncEvent ev;
  ASSERT_TRUE(env.dev->async_events().try_get(&ev).is_ok());
  EXPECT_EQ(ev.type, EventType::kQpLastWqeReached);
  EXPECT_EQ(ev.qp, qp);
  ASSERT_TRUE(env.dev->destroy_qp(qp).is_ok());
  EXPECT_TRUE(env.dev->destroy_srq(srq).is_ok());
}

}  // namespace
}  // namespace rnic::emu
