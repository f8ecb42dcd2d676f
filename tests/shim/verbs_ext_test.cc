// Verbs beyond the RC core through the shim, end to end on loopback (issue 14): ibv_rereg_mr
// with a new address or a new PD followed by traffic, the reset that recovers from it (its
// stale completions leave the CQ), thread and parent domains, ODP, device memory, and the
// errno each verb gives for bad input.
// Two RC QPs of one context connected to each other, each with its own CQ (as rdma-core's
// tests/test_mr.py does).
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/verbs.h>

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kLen = 1024;

class VerbsExtTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ibv_device** list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    ASSERT_NE(list[0], nullptr);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    ch_ = ibv_create_comp_channel(ctx_);  // the receiver's CQ (1) reports to it
    ASSERT_NE(ch_, nullptr);
    for (int i = 0; i < 2; ++i) {
      ibv_cq_init_attr_ex cx{};
      cx.cqe = 64;
      cx.channel = i == 1 ? ch_ : nullptr;
      cx.wc_flags = static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS) |
                    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
      cqx_[i] = ibv_create_cq_ex(ctx_, &cx);
      ASSERT_NE(cqx_[i], nullptr) << strerror(errno);
      cq_[i] = ibv_cq_ex_to_cq(cqx_[i]);
      buf_[i].assign(kLen, 0);
      mr_[i] = ibv_reg_mr(pd_, buf_[i].data(), kLen, kAccess);
      ASSERT_NE(mr_[i], nullptr);
      ibv_qp_init_attr qa{};
      qa.qp_type = IBV_QPT_RC;
      qa.send_cq = cq_[i];
      qa.recv_cq = cq_[i];
      qa.cap.max_send_wr = 16;
      qa.cap.max_recv_wr = 16;
      qa.cap.max_send_sge = 1;
      qa.cap.max_recv_sge = 1;
      qp_[i] = ibv_create_qp(pd_, &qa);
      ASSERT_NE(qp_[i], nullptr) << strerror(errno);
    }
    connect_both();
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (qp_[i]) {
        EXPECT_EQ(ibv_destroy_qp(qp_[i]), 0);
      }
      if (mr_[i]) {
        EXPECT_EQ(ibv_dereg_mr(mr_[i]), 0);
      }
      if (cq_[i]) {
        EXPECT_EQ(ibv_destroy_cq(cq_[i]), 0);
      }
    }
    if (ch_) {
      EXPECT_EQ(ibv_destroy_comp_channel(ch_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  void connect_both() {
    for (int i = 0; i < 2; ++i)
      ASSERT_EQ(rc_connect(qp_[i], qp_[1 - i]->qp_num, gid_, kAccess, 4), 0);
  }
  // Both QPs RESET and back to RTS (test_mr.py's restate_qps).
  void restate() {
    for (int i = 0; i < 2; ++i) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RESET;
      ASSERT_EQ(ibv_modify_qp(qp_[i], &a, IBV_QP_STATE), 0);
    }
    connect_both();
  }
  ibv_wc poll(int i) {
    ibv_wc wc{};
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      int n = ibv_poll_cq(cq_[i], 1, &wc);
      if (n == 1) return wc;
      EXPECT_EQ(n, 0);
      if (n < 0 || std::chrono::steady_clock::now() > end) {
        ADD_FAILURE() << "no completion on cq " << i;
        wc.status = IBV_WC_GENERAL_ERR;
        return wc;
      }
    }
  }
  bool cq_empty(int i) {
    ibv_wc wc;
    return ibv_poll_cq(cq_[i], 1, &wc) == 0;
  }
  void post_recv(int i, void* addr, uint32_t lkey, uint64_t wr_id) {
    ibv_sge s{reinterpret_cast<uintptr_t>(addr), kLen, lkey};
    ibv_recv_wr r{};
    r.wr_id = wr_id;
    r.sg_list = &s;
    r.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp_[i], &r, &bad), 0);
  }
  void post_send(int i, uint64_t wr_id) {
    ibv_sge s{reinterpret_cast<uintptr_t>(buf_[i].data()), kLen, mr_[i]->lkey};
    ibv_send_wr w{};
    w.wr_id = wr_id;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp_[i], &w, &bad), 0);
  }
  // One SEND 0 -> 1 into `dst` (registered as mr_[1]); both completions successful.
  void send_ok(void* dst, uint8_t pattern) {
    post_recv(1, dst, mr_[1]->lkey, 20);
    std::memset(buf_[0].data(), pattern, kLen);
    post_send(0, 10);
    ibv_wc s = poll(0);
    EXPECT_EQ(s.status, IBV_WC_SUCCESS) << ibv_wc_status_str(s.status);
    EXPECT_EQ(s.wr_id, 10u);
    ibv_wc r = poll(1);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS) << ibv_wc_status_str(r.status);
    EXPECT_EQ(r.wr_id, 20u);
    EXPECT_EQ(r.byte_len, kLen);
    EXPECT_EQ(std::memcmp(dst, buf_[0].data(), kLen), 0);
  }
  // A SEND 0 -> 1 that finds the receive WQE's lkey unusable: the responder completes it
  // with LOC_PROT_ERR and NAKs (Remote Operational Error), the requester sees REM_OP_ERR.
  void send_fails_remote_op() {
    std::memset(buf_[0].data(), 0x5A, kLen);
    post_send(0, 11);
    ibv_wc s = poll(0);
    EXPECT_EQ(s.status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(s.status);
    ibv_wc r = poll(1);
    EXPECT_EQ(r.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(r.status);
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_gid gid_{};
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq_ex* cqx_[2] = {};
  ibv_cq* cq_[2] = {};
  ibv_mr* mr_[2] = {};
  ibv_qp* qp_[2] = {};
  std::vector<uint8_t> buf_[2];
};

// ------------------------------------------------------------------ ibv_rereg_mr

TEST_F(VerbsExtTest, ReregNewAddressThenTrafficAfterReset) {
  // Given: a receive posted with the MR's old translation, then the MR moved to a new buffer.
  post_recv(1, buf_[1].data(), mr_[1]->lkey, 21);
  const uint32_t old_lkey = mr_[1]->lkey;
  void* fresh = nullptr;
  ASSERT_EQ(posix_memalign(&fresh, 4096, kLen), 0);
  std::memset(fresh, 0, kLen);
  ASSERT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh, kLen, 0), 0);
  EXPECT_EQ(mr_[1]->addr, fresh);
  EXPECT_EQ(mr_[1]->length, kLen);
  EXPECT_NE(mr_[1]->lkey, old_lkey);  // new key: the old one must not match any more
  // Expect: the send fails on the stale receive, both QPs end in ERR.
  send_fails_remote_op();
  // Expect: after RESET -> RTS the CQs hold nothing of the failed round (the flushed
  // receive of QP 0 was taken off with the reset), and traffic lands in the new buffer.
  restate();
  EXPECT_TRUE(cq_empty(0));
  EXPECT_TRUE(cq_empty(1));
  send_ok(fresh, 0xC3);
  ASSERT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf_[1].data(),
                         kLen, 0), 0);
  free(fresh);
}

TEST_F(VerbsExtTest, ReregNewPdThenBackToTheQpsPd) {
  send_ok(buf_[1].data(), 0x11);
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  // Given: the receiver's MR moved to a PD its QP is not on.
  ASSERT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  EXPECT_EQ(mr_[1]->pd, other);
  // Expect: a receive through it fails the PD check (IBA 10.6.3.2: MR and QP PDs differ).
  post_recv(1, buf_[1].data(), mr_[1]->lkey, 22);
  send_fails_remote_op();
  EXPECT_EQ(ibv_dealloc_pd(other), EBUSY);  // the MR uses it now
  // Expect: back on the QP's PD, after a reset, traffic works again.
  restate();
  ASSERT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, 0), 0);
  send_ok(buf_[1].data(), 0x22);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

TEST_F(VerbsExtTest, ReregBadInputErrnos) {
  // rdma-core's ibv_rereg_mr: IBV_REREG_MR_ERR_INPUT with errno EINVAL for each of these.
  void* p = buf_[1].data();
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_[1], 0x8, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, p, 0, 0),
            IBV_REREG_MR_ERR_INPUT);  // length 0
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_ACCESS, nullptr, p, kLen, kAccess),
            IBV_REREG_MR_ERR_INPUT);  // an address without CHANGE_TRANSLATION
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_[1], IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);  // no PD
  EXPECT_EQ(errno, EINVAL);
  // The MR is untouched by the refused calls.
  EXPECT_EQ(mr_[1]->addr, p);
  send_ok(p, 0x33);
}

// ------------------------------------------------------------------ timestamps

uint64_t rt_now(ibv_context* ctx) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx, &v), 0);
  EXPECT_EQ(v.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
  EXPECT_EQ(v.raw_clock.tv_sec, 0);  // the whole count in tv_nsec, as libmlx5 reports it
  return static_cast<uint64_t>(v.raw_clock.tv_nsec);
}

uint64_t real_ns() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

TEST_F(VerbsExtTest, CompletionTimestampsOnTheDeviceClockAndWallclock) {
  // The device clock: 1 GHz (hca_core_clock in kHz), 64 bits of timestamp.
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  EXPECT_EQ(ax.hca_core_clock, 1000000u);
  EXPECT_EQ(ax.completion_timestamp_mask, ~0ull);
  // Given: the device clock and the wall clock read before and after one SEND.
  const uint64_t t0 = rt_now(ctx_), w0 = real_ns();
  post_recv(1, buf_[1].data(), mr_[1]->lkey, 30);
  post_send(0, 31);
  uint64_t ts[2], wall[2];
  for (int i = 0; i < 2; ++i) {
    ibv_poll_cq_attr pa{};
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int rc;
    while ((rc = ibv_start_poll(cqx_[i], &pa)) == ENOENT)
      ASSERT_LT(std::chrono::steady_clock::now(), end) << "no completion";
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(cqx_[i]->status, IBV_WC_SUCCESS);
    ts[i] = ibv_wc_read_completion_ts(cqx_[i]);
    wall[i] = ibv_wc_read_completion_wallclock_ns(cqx_[i]);
    ibv_end_poll(cqx_[i]);
  }
  const uint64_t t1 = rt_now(ctx_), w1 = real_ns();
  // Expect: both completions stamped inside the window on the device clock, and in
  // nanoseconds of wall time inside the wall-clock window (1 ms slack: the wall time is the
  // device time plus the REALTIME - MONOTONIC offset read when the completion is read).
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(ts[i], t0);
    EXPECT_LE(ts[i], t1);
    EXPECT_GE(wall[i] + 1000000, w0);
    EXPECT_LE(wall[i], w1 + 1000000);
  }
  EXPECT_LE(ts[1], ts[0] + 1000000000ull);  // one round trip on loopback: well under 1 s
}

TEST_F(VerbsExtTest, RtValuesAndTimestampCqBadInput) {
  // Unknown comp_mask bits are ignored (libmlx5) and cleared from the answer.
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK | (1u << 7);
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  EXPECT_EQ(v.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
  v = {};
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  EXPECT_EQ(v.comp_mask, 0u);  // nothing asked, nothing filled
  errno = 0;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, nullptr), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  // A wc_flags bit the device cannot fill: NULL, errno EOPNOTSUPP (as libmlx5).
  ibv_cq_init_attr_ex cx{};
  cx.cqe = 4;
  cx.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_FLOW_TAG;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &cx), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

// ------------------------------------------------------------------ ibv_modify_cq

// Waits up to ms for a CQ event on the channel; true and acked if one came.
bool got_event(ibv_comp_channel* ch, int ms) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  if (ibv_get_cq_event(ch, &cq, &cq_ctx) != 0) return false;
  ibv_ack_cq_events(cq, 1);
  return true;
}

uint64_t mono_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

TEST_F(VerbsExtTest, ModifyCqCountHoldsTheEventUntilTheNthCompletion) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  EXPECT_EQ(ax.cq_mod_caps.max_cq_count, 0xffffu);
  EXPECT_EQ(ax.cq_mod_caps.max_cq_period, 4095u);
  ibv_modify_cq_attr m{};
  m.attr_mask = IBV_CQ_ATTR_MODERATE;
  m.moderate.cq_count = 3;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(cq_[1], &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq_[1], 0), 0);
  // Given: two receive completions of three; both pollable at once, no event.
  for (int k = 0; k < 2; ++k) send_ok(buf_[1].data(), uint8_t(0x40 + k));
  EXPECT_FALSE(got_event(ch_, 50));
  // Expect: the third raises it.
  send_ok(buf_[1].data(), 0x43);
  EXPECT_TRUE(got_event(ch_, 5000));
}

TEST_F(VerbsExtTest, ModifyCqPeriodRaisesTheEventAfterThePeriod) {
  ibv_modify_cq_attr m{};
  m.attr_mask = IBV_CQ_ATTR_MODERATE;
  m.moderate.cq_count = 1000;
  m.moderate.cq_period = 4000;  // µs
  ASSERT_EQ(ibv_modify_cq(cq_[1], &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq_[1], 0), 0);
  // One completion of a thousand: the event comes from the period's timer, never before
  // the period has passed since the completion (a lower bound: load can only delay it).
  post_recv(1, buf_[1].data(), mr_[1]->lkey, 40);
  post_send(0, 41);
  EXPECT_EQ(poll(0).status, IBV_WC_SUCCESS);
  ibv_poll_cq_attr pa{};
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int rc;
  while ((rc = ibv_start_poll(cqx_[1], &pa)) == ENOENT)
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "no completion";
  ASSERT_EQ(rc, 0);
  const uint64_t done = ibv_wc_read_completion_ts(cqx_[1]);
  ibv_end_poll(cqx_[1]);
  ASSERT_TRUE(got_event(ch_, 5000));
  EXPECT_GE(mono_ns(), done + 4000 * 1000ull);
  // Back to no moderation (count 1, period 0): an event per arm at the first completion.
  m.moderate.cq_count = 1;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(cq_[1], &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq_[1], 0), 0);
  send_ok(buf_[1].data(), 0x44);
  EXPECT_TRUE(got_event(ch_, 5000));
}

TEST_F(VerbsExtTest, ModifyCqBadInput) {
  ibv_modify_cq_attr m{};
  errno = 0;
  EXPECT_EQ(ibv_modify_cq(cq_[0], &m), EINVAL);  // empty mask (the kernel's EINVAL)
  EXPECT_EQ(errno, EINVAL);
  m.attr_mask = IBV_CQ_ATTR_MODERATE | IBV_CQ_ATTR_RESERVED;  // rdma-core: EINVAL
  errno = 0;
  EXPECT_EQ(ibv_modify_cq(cq_[0], &m), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  m.attr_mask = IBV_CQ_ATTR_MODERATE;
  m.moderate.cq_count = 8;
  m.moderate.cq_period = 4096;  // above max_cq_period (mlx5: EINVAL)
  errno = 0;
  EXPECT_EQ(ibv_modify_cq(cq_[0], &m), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  m.moderate.cq_period = 4095;
  EXPECT_EQ(ibv_modify_cq(cq_[0], &m), 0);
}

// ------------------------------------------------------------------ TD and parent domain

int g_pd_alloc_calls = 0;
void* counting_alloc(ibv_pd*, void*, size_t, size_t, uint64_t) {
  ++g_pd_alloc_calls;
  return IBV_ALLOCATOR_USE_DEFAULT;
}
void counting_free(ibv_pd*, void*, void*, uint64_t) {}

TEST_F(VerbsExtTest, ThreadAndParentDomainBadInputAndDeallocOrder) {
  ibv_td_init_attr ta{};
  ta.comp_mask = 1;  // no attribute is defined (mlx5: EINVAL)
  errno = 0;
  EXPECT_EQ(ibv_alloc_td(ctx_, &ta), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ta.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(ctx_, &ta);
  ASSERT_NE(td, nullptr) << strerror(errno);
  EXPECT_EQ(td->context, ctx_);

  ibv_parent_domain_init_attr pa{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &pa), nullptr);  // pd is required
  EXPECT_EQ(errno, EINVAL);
  pa.pd = pd_;
  pa.td = td;
  pa.comp_mask = 1u << 7;  // unknown bit
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &pa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  // allocators named, none given
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &pa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pa.pd_context = this;
  ibv_pd* par = ibv_alloc_parent_domain(ctx_, &pa);
  ASSERT_NE(par, nullptr) << strerror(errno);
  EXPECT_EQ(par->context, ctx_);

  ibv_parent_domain_init_attr nested{};
  nested.pd = par;  // wrong type: a parent domain over a parent domain
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &nested), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq_init_attr_ex cx{};
  cx.cqe = 4;
  cx.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cx.parent_domain = pd_;  // wrong type: a plain PD (mlx5: EINVAL)
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &cx), nullptr);
  EXPECT_EQ(errno, EINVAL);

  // Dealloc order (mlx5's refcounts): TD and PD are busy while the parent domain lives; the
  // parent domain is busy while an object created on it lives.
  errno = 0;
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  errno = 0;
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  ibv_mr* mr = ibv_reg_mr(par, buf_[0].data(), kLen, kAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(mr->pd, par);
  cx.parent_domain = par;
  ibv_cq_ex* pcq = ibv_create_cq_ex(ctx_, &cx);
  ASSERT_NE(pcq, nullptr) << strerror(errno);
  errno = 0;
  EXPECT_EQ(ibv_dealloc_pd(par), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(par), EBUSY);  // the CQ still holds it
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(pcq)), 0);
  EXPECT_EQ(ibv_dealloc_pd(par), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

// A QP, its CQ and its receive MR all on a parent domain (with a TD and custom allocators)
// take a SEND from the fixture's QP 0, whose MR is on the parent domain's PD; the
// allocators are never called (softrnic's queues are engine memory: README).
TEST_F(VerbsExtTest, ParentDomainQpCqMrCarryTraffic) {
  ibv_td_init_attr ta{};
  ibv_td* td = ibv_alloc_td(ctx_, &ta);
  ASSERT_NE(td, nullptr);
  ibv_parent_domain_init_attr pa{};
  pa.pd = pd_;
  pa.td = td;
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pa.alloc = counting_alloc;
  pa.free = counting_free;
  pa.pd_context = this;
  ibv_pd* par = ibv_alloc_parent_domain(ctx_, &pa);
  ASSERT_NE(par, nullptr) << strerror(errno);
  g_pd_alloc_calls = 0;
  ibv_cq_init_attr_ex cx{};
  cx.cqe = 16;
  cx.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  cx.parent_domain = par;
  ibv_cq_ex* pcqx = ibv_create_cq_ex(ctx_, &cx);
  ASSERT_NE(pcqx, nullptr) << strerror(errno);
  ibv_cq* pcq = ibv_cq_ex_to_cq(pcqx);
  std::vector<uint8_t> dst(kLen, 0);
  ibv_mr* pmr = ibv_reg_mr(par, dst.data(), kLen, kAccess);
  ASSERT_NE(pmr, nullptr);
  ibv_qp_init_attr_ex qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.send_cq = pcq;
  qa.recv_cq = pcq;
  qa.cap.max_send_wr = 4;
  qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD;
  qa.pd = par;
  ibv_qp* pqp = ibv_create_qp_ex(ctx_, &qa);
  ASSERT_NE(pqp, nullptr) << strerror(errno);
  EXPECT_EQ(pqp->pd, par);
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(qp_[0], &r, IBV_QP_STATE), 0);
  ASSERT_EQ(rc_connect(qp_[0], pqp->qp_num, gid_, kAccess, 4), 0);
  ASSERT_EQ(rc_connect(pqp, qp_[0]->qp_num, gid_, kAccess, 4), 0);

  ibv_sge rs{reinterpret_cast<uintptr_t>(dst.data()), kLen, pmr->lkey};
  ibv_recv_wr rw{};
  rw.wr_id = 7;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(pqp, &rw, &bad_r), 0);
  std::memset(buf_[0].data(), 0x6C, kLen);
  post_send(0, 8);
  ibv_wc s = poll(0);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << ibv_wc_status_str(s.status);
  ibv_wc wc{};
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int n = 0;
  while ((n = ibv_poll_cq(pcq, 1, &wc)) == 0 && std::chrono::steady_clock::now() < end) {
  }
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.byte_len, kLen);
  EXPECT_EQ(std::memcmp(dst.data(), buf_[0].data(), kLen), 0);
  EXPECT_EQ(g_pd_alloc_calls, 0);

  EXPECT_EQ(ibv_dealloc_pd(par), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(pqp), 0);
  EXPECT_EQ(ibv_dereg_mr(pmr), 0);
  EXPECT_EQ(ibv_destroy_cq(pcq), 0);
  EXPECT_EQ(ibv_dealloc_pd(par), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

// ------------------------------------------------------------------ ODP

constexpr int kOdpAccess = kAccess | IBV_ACCESS_ON_DEMAND;

// Fresh anonymous pages (not resident until touched) in which a test can unmap a page (a hole
// in an ODP MR) that nobody else's mapping takes while the test runs; unmapped at scope exit,
// except a hole still open.
// Why the placement: other threads map pages meanwhile (the engine's; ASan's runtime maps one
// page for a thread's DTV block at its first dynamic TLS access), and mmap(NULL) takes the
// highest free gap that fits below mmap_base (top-down layout; the legacy bottom-up one takes
// the lowest above it). A one-page hole among recent mappings is soon someone else's page:
// the WRITE into the "hole" then succeeds, and remapping the page or unmapping the range at
// scope exit destroys that page (with ASan: SEGV in DTLS_Destroy when the thread exits, 1 run
// in 10). Low in the address space (below 2 GiB, in ASan's low application memory) with the
// free space up to the libraries above, the hole is never the gap mmap(NULL) chooses.
struct Pages {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t n;
  uint8_t* p = nullptr;
  std::vector<bool> hole;
  explicit Pages(size_t np) : n(np), hole(np, false) {
    for (uintptr_t at = uintptr_t{1} << 28; at < (uintptr_t{1} << 31) && p == nullptr;
         at += uintptr_t{1} << 26) {
      void* m = mmap(reinterpret_cast<void*>(at), n * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (m == reinterpret_cast<void*>(at)) p = static_cast<uint8_t*>(m);
      else if (m != MAP_FAILED) munmap(m, n * page);  // a kernel without MAP_FIXED_NOREPLACE
    }
  }
  ~Pages() {
    for (size_t i = 0; p != nullptr && i < n; ++i)
      if (!hole[i]) munmap(p + i * page, page);
  }
  bool punch(size_t i) {
    if (munmap(p + i * page, page) != 0) return false;
    hole[i] = true;
    return true;
  }
  // Whether page i is unmapped (mincore: ENOMEM).
  bool unmapped(size_t i) const {
    unsigned char v = 0;
    return mincore(p + i * page, page, &v) != 0 && errno == ENOMEM;
  }
  // Maps the hole again, never over a mapping that is not ours.
  bool refill(size_t i) {
    void* m = mmap(p + i * page, page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m != p + i * page) return false;
    hole[i] = false;
    return true;
  }
  bool resident(size_t i) const {
    unsigned char v = 0;
    return mincore(p + i * page, page, &v) == 0 && (v & 1);
  }
};

// The placement above: while a hole is open, pages mapped by another thread (as many as the
// engine and ASan map in a test, and more) land elsewhere.
TEST(OdpPages, AHoleIsNotTakenByOtherThreadsMappings) {
  Pages pg(2);
  ASSERT_NE(pg.p, nullptr);
  ASSERT_TRUE(pg.punch(1));
  std::vector<void*> theirs(256, MAP_FAILED);
  std::thread([&] {
    for (void*& m : theirs)
      m = mmap(nullptr, pg.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }).join();
  for (void* m : theirs) {
    ASSERT_NE(m, MAP_FAILED);
    EXPECT_NE(m, pg.p + pg.page) << "another thread's mapping took the hole";
  }
  EXPECT_TRUE(pg.unmapped(1));
  for (void* m : theirs)
    if (m != pg.p + pg.page) munmap(m, pg.page);
  EXPECT_TRUE(pg.refill(1));  // still free: ours again
}

int advise(ibv_pd* pd, ibv_advise_mr_advice a, uint32_t flags, uint64_t addr, uint32_t len,
           uint32_t lkey) {
  ibv_sge s{addr, len, lkey};
  return ibv_advise_mr(pd, a, flags, &s, 1);
}

TEST_F(VerbsExtTest, OdpCapsAndAdviseMrErrnos) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  EXPECT_EQ(ax.odp_caps.general_caps, uint64_t{IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT});
  const uint32_t rc = ax.odp_caps.per_transport_caps.rc_odp_caps;
  EXPECT_EQ(rc & (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                  IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV),
            rc);
  EXPECT_NE(ax.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND, 0u);

  Pages pg(4);
  ASSERT_NE(pg.p, nullptr);
  ASSERT_TRUE(pg.punch(3));  // page 3: a hole inside the MR
  ibv_mr* m = ibv_reg_mr(pd_, pg.p, 4 * pg.page, kOdpAccess);  // ODP: holes allowed
  ASSERT_NE(m, nullptr) << strerror(errno);
  ibv_mr* ro = ibv_reg_mr(pd_, pg.p, pg.page, IBV_ACCESS_ON_DEMAND);  // no LOCAL_WRITE
  ASSERT_NE(ro, nullptr) << strerror(errno);
  const uint64_t a = reinterpret_cast<uintptr_t>(pg.p);
  const auto pf = IBV_ADVISE_MR_ADVICE_PREFETCH;
  const auto pfw = IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  struct Case {
    const char* what;
    int got;
    int want;
  } cases[] = {
      {"unknown flag", advise(pd_, pf, 2, a, 64, m->lkey), EINVAL},
      {"no SGE", ibv_advise_mr(pd_, pf, 0, nullptr, 0), EINVAL},
      {"unknown advice", advise(pd_, static_cast<ibv_advise_mr_advice>(3), 0, a, 64, m->lkey),
       EOPNOTSUPP},
      {"bad lkey", advise(pd_, pf, IBV_ADVISE_MR_FLAG_FLUSH, a, 64, m->lkey ^ 0x100), EFAULT},
      {"not an ODP MR", advise(pd_, pf, IBV_ADVISE_MR_FLAG_FLUSH,
                               reinterpret_cast<uintptr_t>(buf_[0].data()), 64, mr_[0]->lkey),
       EFAULT},
      {"past the end", advise(pd_, pf, IBV_ADVISE_MR_FLAG_FLUSH, a + 4 * pg.page - 8, 16, m->lkey),
       EFAULT},
      {"write without LOCAL_WRITE", advise(pd_, pfw, IBV_ADVISE_MR_FLAG_FLUSH, a, 64, ro->lkey),
       EFAULT},
      {"sync prefetch of the hole", advise(pd_, pfw, IBV_ADVISE_MR_FLAG_FLUSH, a + 3 * pg.page,
                                          64, m->lkey), EFAULT},
      {"async prefetch of the hole (a hint)", advise(pd_, pf, 0, a + 3 * pg.page, 64, m->lkey), 0},
  };
  for (const Case& c : cases) EXPECT_EQ(c.got, c.want) << c.what;
  errno = 0;
  EXPECT_EQ(advise(pd_, pf, 0, a, 64, 0xdead00), EFAULT);
  EXPECT_EQ(errno, EFAULT);

  EXPECT_FALSE(pg.resident(1));
  EXPECT_EQ(advise(pd_, pfw, IBV_ADVISE_MR_FLAG_FLUSH, a + pg.page, 64, m->lkey), 0);
  EXPECT_TRUE(pg.resident(1));  // faulted in by the prefetch
  EXPECT_EQ(advise(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH,
                   a + 2 * pg.page, 64, m->lkey), 0);
  EXPECT_FALSE(pg.resident(2));  // NO_FAULT maps only what is present
  EXPECT_TRUE(pg.unmapped(3)) << "the hole became another mapping during the test";

  // Implicit ODP needs ON_DEMAND; rereg cannot change ODP-ness.
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kAccess),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
  EXPECT_EQ(ibv_dereg_mr(m), 0);
}

// Traffic through ODP MRs: a SEND from an implicit ODP MR (the whole address space) into an
// explicit ODP MR over pages never touched, then an RDMA WRITE into it whose target page was
// unmapped after registration: a page fault the NIC cannot resolve, REM_ACCESS_ERR.
TEST_F(VerbsExtTest, OdpSendIntoUntouchedPagesThenWriteIntoAHole) {
  ibv_mr* imp = ibv_reg_mr(pd_, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(imp, nullptr) << strerror(errno);
  Pages pg(2);
  ASSERT_NE(pg.p, nullptr);
  ibv_mr* odp = ibv_reg_mr(pd_, pg.p, 2 * pg.page, kOdpAccess);
  ASSERT_NE(odp, nullptr) << strerror(errno);
  EXPECT_FALSE(pg.resident(0));
  post_recv(1, pg.p, odp->lkey, 30);
  std::memset(buf_[0].data(), 0x3C, kLen);
  ibv_sge s{reinterpret_cast<uintptr_t>(buf_[0].data()), kLen, imp->lkey};
  ibv_send_wr w{};
  w.wr_id = 31;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  ibv_wc sc = poll(0);
  EXPECT_EQ(sc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(sc.status);
  ibv_wc rc = poll(1);
  EXPECT_EQ(rc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(rc.byte_len, kLen);
  EXPECT_EQ(std::memcmp(pg.p, buf_[0].data(), kLen), 0);

  ASSERT_TRUE(pg.punch(1));
  w.opcode = IBV_WR_RDMA_WRITE;
  w.wr_id = 32;
  w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(pg.p + pg.page);
  w.wr.rdma.rkey = odp->rkey;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  ibv_wc wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_TRUE(pg.unmapped(1)) << "the hole became another mapping during the test";
  EXPECT_EQ(ibv_dereg_mr(odp), 0);
  EXPECT_EQ(ibv_dereg_mr(imp), 0);
}

// ------------------------------------------------------------------ device memory

TEST_F(VerbsExtTest, DeviceMemoryErrnosAndLimits) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  ASSERT_GT(ax.max_dm_size, 0u);
  ibv_alloc_dm_attr da{};
  struct Case {
    const char* what;
    uint64_t length;
    uint32_t log_align;
    uint32_t comp_mask;
    int want;
  } cases[] = {
      {"length 0", 0, 0, 0, EINVAL},
      {"above max_dm_size", ax.max_dm_size + 4, 0, 0, EINVAL},
      {"unknown comp_mask", 64, 0, 1, EINVAL},
      {"alignment above a page", 64, 13, 0, EINVAL},
  };
  for (const Case& c : cases) {
    da.length = c.length;
    da.log_align_req = c.log_align;
    da.comp_mask = c.comp_mask;
    errno = 0;
    EXPECT_EQ(ibv_alloc_dm(ctx_, &da), nullptr) << c.what;
    EXPECT_EQ(errno, c.want) << c.what;
  }
  // The pool: two halves fit, a third allocation does not (ENOMEM) until one is freed.
  da = {};
  da.length = ax.max_dm_size / 2;
  da.log_align_req = 6;
  ibv_dm* a = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(a, nullptr) << strerror(errno);
  ibv_dm* b = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(b, nullptr) << strerror(errno);
  da.length = 4;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx_, &da), nullptr);
  EXPECT_EQ(errno, ENOMEM);

  // memcpy: 4-byte aligned offset and length (EINVAL), inside the DM (EFAULT).
  uint32_t w[4] = {1, 2, 3, 4}, r[4] = {};
  EXPECT_EQ(ibv_memcpy_to_dm(a, 2, w, 8), EINVAL);
  EXPECT_EQ(ibv_memcpy_to_dm(a, 0, w, 6), EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_memcpy_from_dm(r, a, ax.max_dm_size / 2 - 4, 8), EFAULT);
  EXPECT_EQ(errno, EFAULT);
  EXPECT_EQ(ibv_memcpy_to_dm(a, 16, w, sizeof w), 0);
  EXPECT_EQ(ibv_memcpy_from_dm(r, a, 16, sizeof r), 0);
  EXPECT_EQ(std::memcmp(w, r, sizeof w), 0);

  // reg_dm_mr: ZERO_BASED required, only the four DM rights may join it, range inside.
  const unsigned zb = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, a, 0, 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, a, 0, 64, zb | IBV_ACCESS_MW_BIND), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, a, 8, ax.max_dm_size / 2, zb), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* m = ibv_reg_dm_mr(pd_, a, 0, 64, zb);
  ASSERT_NE(m, nullptr) << strerror(errno);
  EXPECT_EQ(m->addr, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_free_dm(a), EBUSY);  // an MR lies in it
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_free_dm(a), 0);
  EXPECT_EQ(ibv_free_dm(b), 0);
  da.length = ax.max_dm_size;  // the whole pool is free again
  ibv_dm* all = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(all, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_free_dm(all), 0);
}

// Device memory on the data path, zero-based: QP 0 SENDs from a DM MR (a local SGE whose
// address is an offset into the MR) into QP 1's ordinary buffer, then RDMA WRITEs into a
// second DM MR at remote address 16 (an offset) and READs it back.
TEST_F(VerbsExtTest, DeviceMemoryAsLocalSgeAndRemoteTarget) {
  ibv_alloc_dm_attr da{};
  da.length = 2 * kLen;
  ibv_dm* src = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(src, nullptr) << strerror(errno);
  ibv_dm* dst = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(dst, nullptr);
  const unsigned acc = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE |
                       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* smr = ibv_reg_dm_mr(pd_, src, kLen, kLen, acc);  // the DM's second half
  ASSERT_NE(smr, nullptr) << strerror(errno);
  ibv_mr* dmr = ibv_reg_dm_mr(pd_, dst, 0, 2 * kLen, acc);
  ASSERT_NE(dmr, nullptr) << strerror(errno);
  std::vector<uint8_t> pat(kLen);
  for (uint32_t i = 0; i < kLen; ++i) pat[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_EQ(ibv_memcpy_to_dm(src, kLen, pat.data(), kLen), 0);

  post_recv(1, buf_[1].data(), mr_[1]->lkey, 40);
  ibv_sge s{0, kLen, smr->lkey};  // offset 0 of the zero-based MR
  ibv_send_wr w{};
  w.wr_id = 41;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  EXPECT_EQ(poll(0).status, IBV_WC_SUCCESS);
  ibv_wc rc = poll(1);
  EXPECT_EQ(rc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(std::memcmp(buf_[1].data(), pat.data(), kLen), 0);

  w.wr_id = 42;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.wr.rdma.remote_addr = 16;
  w.wr.rdma.rkey = dmr->rkey;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  ibv_wc wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  std::vector<uint8_t> got(kLen);
  ASSERT_EQ(ibv_memcpy_from_dm(got.data(), dst, 16, kLen), 0);
  EXPECT_EQ(got, pat);

  std::memset(buf_[0].data(), 0, kLen);
  ibv_sge ls{reinterpret_cast<uintptr_t>(buf_[0].data()), kLen, mr_[0]->lkey};
  w.wr_id = 43;
  w.sg_list = &ls;
  w.opcode = IBV_WR_RDMA_READ;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::memcmp(buf_[0].data(), pat.data(), kLen), 0);

  // Past the DM MR's end (zero-based length 2 * kLen): Remote Access error.
  w.wr_id = 44;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.wr.rdma.remote_addr = 2 * kLen - 8;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);

  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_dereg_mr(dmr), 0);
  EXPECT_EQ(ibv_free_dm(src), 0);
  EXPECT_EQ(ibv_free_dm(dst), 0);
}

}  // namespace
