// ATOMIC_WRITE and FLUSH through the shim, end to end on loopback: two RC QPs of one context
// connected to each other. ibv_wr_atomic_write (by value) and ibv_post_send(IBV_WR_ATOMIC_WRITE)
// (operand in an 8-byte SGE) land the bytes; ibv_wr_flush (rdma-core 45+ ABI, called through
// verbs_compat.h since Debian's 44 headers lack it) of a range and of a whole MR completes with
// IBV_WC_FLUSH; the capability bits are reported. Bad input gets the errno / completion status
// rdma-core's rxe gives: misaligned ATOMIC_WRITE -> REM_INV_REQ_ERR, no right on the MR ->
// REM_ACCESS_ERR, UC/UD QPs -> EOPNOTSUPP (create_qp_ex) / EINVAL (post_send), reserved FLUSH
// type or level -> EINVAL from wr_complete, FLUSH_PERSISTENT registration -> EINVAL.
#include <gtest/gtest.h>

#include "rc_connect.h"
#include "verbs_shim/verbs_compat.h"
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace {

namespace compat = rnic::shim::compat;

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                        compat::kAccessFlushGlobal;
// The QPs allow both placement types; the MRs can only ever have GLOBAL.
constexpr int kQpAccess = kAccess | compat::kAccessFlushPersistent;

class AtomicFlushTest : public ::testing::Test {
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
    for (int i = 0; i < 2; ++i) {
      cq_[i] = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
      ASSERT_NE(cq_[i], nullptr);
      buf_[i].assign(8192, 0);
      mr_[i] = ibv_reg_mr(pd_, buf_[i].data(), buf_[i].size(), kAccess);
      ASSERT_NE(mr_[i], nullptr) << strerror(errno);
      qp_[i] = create(IBV_QPT_RC, cq_[i], IBV_QP_EX_WITH_ATOMIC_WRITE | compat::kQpExWithFlush |
                                              IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
      ASSERT_NE(qp_[i], nullptr) << strerror(errno);
      qx_[i] = ibv_qp_to_qp_ex(qp_[i]);
    }
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(rc_connect(qp_[i], qp_[1 - i]->qp_num, gid_, kQpAccess, 4), 0);
    }
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
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  ibv_qp* create(ibv_qp_type t, ibv_cq* cq, uint64_t ops) {
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = t;
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.cap.max_send_wr = 16;
    qa.cap.max_recv_wr = 16;
    qa.cap.max_send_sge = 2;
    qa.cap.max_recv_sge = 2;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qa.pd = pd_;
    qa.send_ops_flags = ops;
    return ibv_create_qp_ex(ctx_, &qa);
  }
  ibv_wc poll(int i) {
    ibv_wc wc{};
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int n;
    while ((n = ibv_poll_cq(cq_[i], 1, &wc)) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        ADD_FAILURE() << "no completion";
        wc.status = IBV_WC_GENERAL_ERR;
        return wc;
      }
    }
    EXPECT_EQ(n, 1);
    return wc;
  }
  uint64_t addr(int i, uint32_t off) { return reinterpret_cast<uintptr_t>(buf_[i].data() + off); }
  // One ATOMIC_WRITE of v to QP 1's buffer at off through the builder; returns its completion.
  ibv_wc atomic_write(uint32_t off, uint64_t v, uint32_t rkey = 0) {
    ibv_qp_ex* x = qx_[0];
    ibv_wr_start(x);
    x->wr_id = 1;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(x, rkey ? rkey : mr_[1]->rkey, addr(1, off), &v);
    EXPECT_EQ(ibv_wr_complete(x), 0);
    return poll(0);
  }
  ibv_wc flush(uint64_t va, size_t len, uint8_t type, uint8_t level, uint32_t rkey = 0) {
    ibv_qp_ex* x = qx_[0];
    ibv_wr_start(x);
    x->wr_id = 2;
    x->wr_flags = IBV_SEND_SIGNALED;
    compat::wr_flush(x, rkey ? rkey : mr_[1]->rkey, va, len, type, level);
    EXPECT_EQ(ibv_wr_complete(x), 0);
    return poll(0);
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_[2] = {};
  ibv_mr* mr_[2] = {};
  ibv_qp* qp_[2] = {};
  ibv_qp_ex* qx_[2] = {};
  ibv_gid gid_{};
  std::vector<uint8_t> buf_[2];
};

TEST_F(AtomicFlushTest, CapabilityBitsAreReported) {
  ibv_device_attr_ex a{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &a), 0);
  EXPECT_TRUE(a.device_cap_flags_ex & compat::kDeviceAtomicWrite);
  EXPECT_TRUE(a.device_cap_flags_ex & compat::kDeviceFlushGlobal);
  // No persistent memory behind registered memory: not advertised (and refused at reg_mr).
  EXPECT_FALSE(a.device_cap_flags_ex & compat::kDeviceFlushPersistent);
}

TEST_F(AtomicFlushTest, AtomicWriteByValueAndByPostSendThenFlushRangeAndMr) {
  const uint64_t v = 0x0123456789abcdefull;
  ibv_wc wc = atomic_write(64, v);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 64, &v, 8), 0);

  // ibv_post_send: address in wr.rdma, operand in an 8-byte SGE.
  const uint8_t bytes[8] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7};
  std::memcpy(buf_[0].data() + 512, bytes, 8);
  ibv_sge s{addr(0, 512), 8, mr_[0]->lkey};
  ibv_send_wr w{};
  w.wr_id = 3;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_ATOMIC_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = addr(1, 72);
  w.wr.rdma.rkey = mr_[1]->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp_[0], &w, &bad), 0);
  wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 72, bytes, 8), 0);

  // A FETCH_AND_ADD after the ATOMIC_WRITE returns the written word.
  ibv_qp_ex* x = qx_[0];
  ibv_wr_start(x);
  x->wr_id = 4;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_fetch_add(x, mr_[1]->rkey, addr(1, 64), 1);
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 1024), 8);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  wc = poll(0);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  uint64_t orig = 0;
  std::memcpy(&orig, buf_[0].data() + 1024, 8);
  EXPECT_EQ(orig, v);

  wc = flush(addr(1, 0), 4096, compat::kFlushGlobal, compat::kFlushRange);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(static_cast<int>(wc.opcode), compat::kWcFlush);
  EXPECT_EQ(wc.byte_len, 0u);
  wc = flush(0, 0, compat::kFlushGlobal, compat::kFlushMr);  // whole MR: VA/length unused
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(static_cast<int>(wc.opcode), compat::kWcFlush);
}

TEST_F(AtomicFlushTest, MisalignedAtomicWriteIsRemoteInvalidRequest) {
  ibv_wc wc = atomic_write(65, 1);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  for (int k = 64; k < 80; ++k) EXPECT_EQ(buf_[1][k], 0) << k;
}

TEST_F(AtomicFlushTest, AtomicWriteWithoutRemoteWriteOnTheMrIsRemoteAccessError) {
  ibv_mr* ro = ibv_reg_mr(pd_, buf_[1].data(), 4096,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(ro, nullptr);
  ibv_wc wc = atomic_write(64, 1, ro->rkey);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
}

// rdma-core test_qp_ex_rc_flush_type_violate: the MR lacks FLUSH_PERSISTENT.
TEST_F(AtomicFlushTest, PersistentFlushOnGlobalOnlyMrIsRemoteAccessError) {
  ibv_wc wc = flush(addr(1, 0), 64, compat::kFlushPersistent, compat::kFlushRange);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
}

TEST_F(AtomicFlushTest, GlobalFlushOnMrWithoutFlushRightIsRemoteAccessError) {
  ibv_mr* plain = ibv_reg_mr(pd_, buf_[1].data(), 4096,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(plain, nullptr);
  ibv_wc wc = flush(addr(1, 0), 64, compat::kFlushGlobal, compat::kFlushRange, plain->rkey);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(ibv_dereg_mr(plain), 0);
}

TEST_F(AtomicFlushTest, BadInputGetsTheErrnoRxeGives) {
  // FLUSH_PERSISTENT on ordinary memory: EINVAL (rxe: not a pmem page).
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_[1].data(), 4096,
                       IBV_ACCESS_LOCAL_WRITE | compat::kAccessFlushPersistent),
            nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Reserved placement type / level: the batch fails with EINVAL, nothing is sent.
  for (auto [type, level] : {std::pair<uint8_t, uint8_t>{0, 0}, {4, 0}, {1, 2}}) {
    ibv_wr_start(qx_[0]);
    compat::wr_flush(qx_[0], mr_[1]->rkey, addr(1, 0), 64, type, level);
    EXPECT_EQ(ibv_wr_complete(qx_[0]), EINVAL) << int(type) << "/" << int(level);
  }
  // ibv_post_send cannot carry a FLUSH (no placement type / level fields): EINVAL.
  ibv_send_wr w{};
  w.opcode = static_cast<ibv_wr_opcode>(compat::kWrFlush);
  w.wr.rdma.remote_addr = addr(1, 0);
  w.wr.rdma.rkey = mr_[1]->rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp_[0], &w, &bad), EINVAL);
  // ATOMIC_WRITE whose operand is not exactly 8 bytes: EINVAL.
  ibv_sge s{addr(0, 0), 4, mr_[0]->lkey};
  w = {};
  w.opcode = IBV_WR_ATOMIC_WRITE;
  w.sg_list = &s;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = addr(1, 0);
  w.wr.rdma.rkey = mr_[1]->rkey;
  EXPECT_EQ(ibv_post_send(qp_[0], &w, &bad), EINVAL);
  // UC and UD QPs cannot be created with ATOMIC_WRITE / FLUSH (rxe: EOPNOTSUPP)...
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
    for (uint64_t op : {uint64_t{IBV_QP_EX_WITH_ATOMIC_WRITE}, compat::kQpExWithFlush}) {
      errno = 0;
      EXPECT_EQ(create(t, cq_[0], IBV_QP_EX_WITH_SEND | op), nullptr);
      EXPECT_EQ(errno, EOPNOTSUPP) << t;
    }
  }
  // ...and an ATOMIC_WRITE posted on one is EINVAL.
  ibv_qp* uc = create(IBV_QPT_UC, cq_[0], IBV_QP_EX_WITH_SEND);
  ASSERT_NE(uc, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(uc, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp_[1]->qp_num;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid_;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(uc, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN), 0);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(uc, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  // A WRITE is accepted there (the QP is ready), the ATOMIC_WRITE is not.
  w.opcode = IBV_WR_RDMA_WRITE;
  s.length = 8;
  EXPECT_EQ(ibv_post_send(uc, &w, &bad), 0);
  w.opcode = IBV_WR_ATOMIC_WRITE;
  EXPECT_EQ(ibv_post_send(uc, &w, &bad), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(uc), 0);
  // Nothing above reached the peer: the RC QP still works.
  ibv_wc wc = atomic_write(8, 42);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
}

}  // namespace
