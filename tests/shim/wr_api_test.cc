// The extended verbs through the shim, end to end on loopback: two RC QPs of one context
// connected to each other, driven with the ibv_wr_* builders (send, send_imm, inline data,
// SGE lists, RDMA write/write_imm/read, both atomics) and completions read with the
// ibv_cq_ex start/next/end_poll table (opcode, byte_len, imm, qp_num, timestamps); and UD
// with the GRH area and ibv_create_ah_from_wc.
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct Wc {
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint64_t wr_id;
  uint32_t byte_len;
  uint32_t wc_flags;
  __be32 imm;
  uint32_t qp_num;
  uint64_t ts;
};

class WrApiTest : public ::testing::Test {
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
    ibv_cq_init_attr_ex cx{};
    cx.cqe = 64;
    cx.wc_flags = static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    for (auto*& c : cq_) {
      c = ibv_create_cq_ex(ctx_, &cx);
      ASSERT_NE(c, nullptr) << strerror(errno);
    }
    for (int i = 0; i < 2; ++i) {
      buf_[i].assign(8192, 0);
      mr_[i] = ibv_reg_mr(pd_, buf_[i].data(), buf_[i].size(), kAccess);
      ASSERT_NE(mr_[i], nullptr);
      ibv_qp_init_attr_ex qa{};
      qa.qp_type = IBV_QPT_RC;
      qa.send_cq = ibv_cq_ex_to_cq(cq_[i]);
      qa.recv_cq = ibv_cq_ex_to_cq(cq_[i]);
      qa.cap.max_send_wr = 32;
      qa.cap.max_recv_wr = 32;
      qa.cap.max_send_sge = 4;
      qa.cap.max_recv_sge = 4;
      qa.cap.max_inline_data = 64;
      qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      qa.pd = pd_;
      qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                          IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
      qp_[i] = ibv_create_qp_ex(ctx_, &qa);
      ASSERT_NE(qp_[i], nullptr) << strerror(errno);
      qx_[i] = ibv_qp_to_qp_ex(qp_[i]);
      ASSERT_NE(qx_[i], nullptr);
    }
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
    for (int i = 0; i < 2; ++i) connect(qp_[i], qp_[1 - i]->qp_num, gid);
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
        EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_[i])), 0);
      }
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  static void connect(ibv_qp* qp, uint32_t dest, const ibv_gid& gid) {
    ASSERT_EQ(rc_connect(qp, dest, gid, kAccess, 4), 0);
  }
  // Polls one completion from cq i with the extended API (10 s limit).
  Wc poll(int i) {
    ibv_cq_ex* cq = cq_[i];
    ibv_poll_cq_attr pa{};
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int rc;
    while ((rc = ibv_start_poll(cq, &pa)) == ENOENT) {
      if (std::chrono::steady_clock::now() > end) {
        ADD_FAILURE() << "no completion";
        return Wc{IBV_WC_GENERAL_ERR, IBV_WC_SEND, 0, 0, 0, 0, 0, 0};
      }
    }
    EXPECT_EQ(rc, 0);
    Wc w{cq->status, ibv_wc_read_opcode(cq), cq->wr_id, ibv_wc_read_byte_len(cq),
         ibv_wc_read_wc_flags(cq), ibv_wc_read_imm_data(cq), ibv_wc_read_qp_num(cq),
         ibv_wc_read_completion_ts(cq)};
    ibv_end_poll(cq);
    return w;
  }
  void post_recv(int i, uint64_t wr_id, uint32_t off, uint32_t len) {
    ibv_sge s{reinterpret_cast<uintptr_t>(buf_[i].data() + off), len, mr_[i]->lkey};
    ibv_recv_wr r{};
    r.wr_id = wr_id;
    r.sg_list = &s;
    r.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp_[i], &r, &bad), 0);
  }
  uint64_t addr(int i, uint32_t off) { return reinterpret_cast<uintptr_t>(buf_[i].data() + off); }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq_ex* cq_[2] = {};
  ibv_mr* mr_[2] = {};
  ibv_qp* qp_[2] = {};
  ibv_qp_ex* qx_[2] = {};
  std::vector<uint8_t> buf_[2];
};

TEST_F(WrApiTest, SendWithSgeListAndInlineAndImm) {
  post_recv(1, 100, 0, 256);
  post_recv(1, 101, 256, 256);
  post_recv(1, 102, 512, 256);
  std::memcpy(buf_[0].data(), "hello ", 6);
  std::memcpy(buf_[0].data() + 100, "world", 5);
  ibv_qp_ex* x = qx_[0];
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_sge sl[2] = {{addr(0, 0), 6, mr_[0]->lkey}, {addr(0, 100), 5, mr_[0]->lkey}};
  ibv_wr_set_sge_list(x, 2, sl);
  x->wr_id = 2;
  x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_wr_send(x);
  char tmp[] = "inline!";
  ibv_wr_set_inline_data(x, tmp, 7);
  x->wr_id = 3;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htobe32(0x1234));
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 0), 3);
  std::memset(tmp, 'X', 7);  // inline data was copied at set time
  ASSERT_EQ(ibv_wr_complete(x), 0);

  for (uint64_t id = 1; id <= 3; ++id) {
    Wc w = poll(0);
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(w.opcode, IBV_WC_SEND);
    EXPECT_EQ(w.wr_id, id);
  }
  Wc r1 = poll(1);
  EXPECT_EQ(r1.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r1.opcode, IBV_WC_RECV);
  EXPECT_EQ(r1.wr_id, 100u);
  EXPECT_EQ(r1.byte_len, 11u);
  EXPECT_EQ(r1.qp_num, qp_[1]->qp_num);
  EXPECT_NE(r1.ts, 0u);
  EXPECT_EQ(std::memcmp(buf_[1].data(), "hello world", 11), 0);
  Wc r2 = poll(1);
  EXPECT_EQ(r2.byte_len, 7u);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 256, "inline!", 7), 0);
  Wc r3 = poll(1);
  EXPECT_EQ(r3.byte_len, 3u);
  EXPECT_TRUE(r3.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(be32toh(r3.imm), 0x1234u);
  EXPECT_GE(r3.ts, r1.ts);
}

TEST_F(WrApiTest, RdmaWriteReadAndAtomics) {
  for (int i = 0; i < 64; ++i) buf_[0][i] = static_cast<uint8_t>(i * 3);
  ibv_qp_ex* x = qx_[0];
  ibv_wr_start(x);
  x->wr_id = 10;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, mr_[1]->rkey, addr(1, 1024));
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 0), 64);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  Wc w = poll(0);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(w.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 1024, buf_[0].data(), 64), 0);

  std::memcpy(buf_[1].data() + 2048, "remote bytes", 12);
  ibv_wr_start(x);
  x->wr_id = 11;
  ibv_wr_rdma_read(x, mr_[1]->rkey, addr(1, 2048));
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 4096), 12);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  w = poll(0);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(w.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(w.byte_len, 12u);
  EXPECT_EQ(std::memcmp(buf_[0].data() + 4096, "remote bytes", 12), 0);

  uint64_t v = 40;
  std::memcpy(buf_[1].data() + 3072, &v, 8);
  ibv_wr_start(x);
  x->wr_id = 12;
  ibv_wr_atomic_fetch_add(x, mr_[1]->rkey, addr(1, 3072), 2);
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 5000 & ~7u), 8);
  x->wr_id = 13;
  ibv_wr_atomic_cmp_swp(x, mr_[1]->rkey, addr(1, 3072), 42, 7);
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 5008 & ~7u), 8);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  w = poll(0);
  EXPECT_EQ(w.opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  w = poll(0);
  EXPECT_EQ(w.opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  uint64_t old1, old2, now;
  std::memcpy(&old1, buf_[0].data() + (5000 & ~7u), 8);
  std::memcpy(&old2, buf_[0].data() + (5008 & ~7u), 8);
  std::memcpy(&now, buf_[1].data() + 3072, 8);
  EXPECT_EQ(old1, 40u);
  EXPECT_EQ(old2, 42u);
  EXPECT_EQ(now, 7u);
}

TEST_F(WrApiTest, WriteWithImmConsumesReceive) {
  post_recv(1, 200, 0, 16);
  std::memcpy(buf_[0].data(), "imm-write", 9);
  ibv_qp_ex* x = qx_[0];
  ibv_wr_start(x);
  x->wr_id = 20;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write_imm(x, mr_[1]->rkey, addr(1, 6000), htobe32(77));
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 0), 9);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  Wc s = poll(0);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS);
  Wc r = poll(1);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(r.wr_id, 200u);
  EXPECT_EQ(be32toh(r.imm), 77u);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 6000, "imm-write", 9), 0);
}

TEST_F(WrApiTest, AbortDropsTheBatchAndBadSgeFailsComplete) {
  ibv_qp_ex* x = qx_[0];
  ibv_wr_start(x);
  x->wr_id = 30;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, mr_[0]->lkey, addr(0, 0), 8);
  ibv_wr_abort(x);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cq_[0], &pa), ENOENT);
  // More SGEs than max_send_sge: wr_complete reports the error (rdma-core: EINVAL/ENOMEM).
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_sge many[8];
  for (auto& s : many) s = {addr(0, 0), 1, mr_[0]->lkey};
  ibv_wr_set_sge_list(x, 8, many);
  EXPECT_NE(ibv_wr_complete(x), 0);
  // Inline data beyond max_inline_data (64 here) fails the batch with EINVAL.
  std::vector<char> big(65, 'x');
  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_INLINE;
  ibv_wr_send(x);
  ibv_wr_set_inline_data(x, big.data(), big.size());
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  EXPECT_EQ(ibv_start_poll(cq_[0], &pa), ENOENT);
}

}  // namespace

namespace {

// UD over loopback: the receive buffer starts with the 40-byte GRH area (IPv4 header in its
// last 20 bytes), and ibv_create_ah_from_wc builds the reply AH from it.
TEST(UdTest, ReplyThroughAhFromWc) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(pd, nullptr);
  ASSERT_NE(cq, nullptr);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_qp* qp[2];
  for (auto& q : qp) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.qp_type = IBV_QPT_UD;
    q = ibv_create_qp(pd, &ia);
    ASSERT_NE(q, nullptr);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = 0x11111111;
    ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  auto post_recv = [&](ibv_qp* q, uint32_t off) {
    ibv_sge s{reinterpret_cast<uintptr_t>(buf.data() + off), 40 + 64, mr->lkey};
    ibv_recv_wr r{};
    r.sg_list = &s;
    r.num_sge = 1;
    r.wr_id = off;
    ibv_recv_wr* bad;
    ASSERT_EQ(ibv_post_recv(q, &r, &bad), 0);
  };
  auto send = [&](ibv_qp* q, ibv_ah* ah, uint32_t qpn, const char* msg) {
    std::memcpy(buf.data() + 3000, msg, std::strlen(msg));
    ibv_sge s{reinterpret_cast<uintptr_t>(buf.data() + 3000), static_cast<uint32_t>(std::strlen(msg)), mr->lkey};
    ibv_send_wr w{};
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = qpn;
    w.wr.ud.remote_qkey = 0x11111111;
    ibv_send_wr* bad;
    ASSERT_EQ(ibv_post_send(q, &w, &bad), 0);
  };
  auto wait_recv = [&](ibv_wc* out) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) == 1) {
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
        if (wc.opcode == IBV_WC_RECV) {
          *out = wc;
          return;
        }
      }
    }
    FAIL() << "no receive";
  };
  post_recv(qp[1], 0);
  post_recv(qp[0], 1000);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.grh.dgid = gid;
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr);
  send(qp[0], ah, qp[1]->qp_num, "ping");
  ibv_wc wc;
  wait_recv(&wc);
  EXPECT_EQ(wc.byte_len, 40u + 4);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wc.src_qp, qp[0]->qp_num);
  EXPECT_EQ(std::memcmp(buf.data() + 40, "ping", 4), 0);
  // Reply through an AH built from the completion and its GRH area.
  auto* grh = reinterpret_cast<ibv_grh*>(buf.data());
  ibv_ah_attr from{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx, 1, &wc, grh, &from), 0);
  EXPECT_EQ(from.is_global, 1);
  EXPECT_EQ(std::memcmp(from.grh.dgid.raw, gid.raw, 16), 0);
  EXPECT_EQ(from.grh.sgid_index, 0);
  ibv_ah* reply = ibv_create_ah_from_wc(pd, &wc, grh, 1);
  ASSERT_NE(reply, nullptr) << strerror(errno);
  send(qp[1], reply, wc.src_qp, "pong");
  wait_recv(&wc);
  EXPECT_EQ(wc.wr_id, 1000u);
  EXPECT_EQ(std::memcmp(buf.data() + 1040, "pong", 4), 0);
  EXPECT_EQ(ibv_destroy_ah(reply), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (auto* q : qp) EXPECT_EQ(ibv_destroy_qp(q), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
