// Tag matching on SRQs through the shim, end to end on loopback: an RC "client" QP with its own
// RQ sends to an RC "server" QP on a TM SRQ (IBV_SRQT_TM) whose CQ is an extended CQ with
// IBV_WC_EX_WITH_TM_INFO. Covered: tm_caps, TAG_ADD / TAG_DEL / TAG_SYNC completions, EAGER
// matched (tag & mask, oldest first, TMH stripped, tag/app_ctx in ibv_wc_read_tm_info),
// unexpected (whole message in an unexpected buffer, counted; matching stays off until a SYNC
// reports the count), NO_TAG (unexpected list, not counted), RNDV (the device READs the
// sender's buffer into the tag's, sends a FIN back, completes MATCH then DATA_VALID), deleted
// tags, and bad input: create/post errnos, list full, a malformed TMH (Invalid Request NAK,
// counted tm_bad_header).
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <endian.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kBuf = 4096;
constexpr uint64_t kMask = 0xffff;

struct Wc {
  int rc = ENOENT;
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  unsigned flags = 0;
  uint32_t byte_len = 0;
  ibv_wc_tm_info tm{};
};

class TagMatchingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ibv_device** list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    ASSERT_NE(list[0], nullptr);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    ibv_device_attr_ex dx{};
    ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
    caps_ = dx.tm_caps;
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    for (int i = 0; i < 2; ++i) {
      ibv_cq_init_attr_ex ca{};
      ca.cqe = 256;
      ca.wc_flags = uint64_t{IBV_WC_EX_WITH_TM_INFO} | uint64_t{IBV_WC_STANDARD_FLAGS};
      cq_[i] = ibv_create_cq_ex(ctx_, &ca);
      ASSERT_NE(cq_[i], nullptr) << strerror(errno);
      buf_[i].assign(kBuf, 0);
      mr_[i] = ibv_reg_mr(pd_, buf_[i].data(), kBuf, kAccess);
      ASSERT_NE(mr_[i], nullptr);
    }
    ibv_srq_init_attr_ex sa{};
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                   IBV_SRQ_INIT_ATTR_TM;
    sa.srq_type = IBV_SRQT_TM;
    sa.pd = pd_;
    sa.cq = ibv_cq_ex_to_cq(cq_[1]);
    sa.attr.max_wr = 64;
    sa.attr.max_sge = 1;
    sa.tm_cap.max_num_tags = 8;
    sa.tm_cap.max_ops = 8;
    srq_ = ibv_create_srq_ex(ctx_, &sa);
    ASSERT_NE(srq_, nullptr) << strerror(errno);
    for (int i = 0; i < 2; ++i) {
      ibv_qp_init_attr qa{};
      qa.qp_type = IBV_QPT_RC;
      qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq_[i]);
      qa.cap.max_send_wr = i == 0 ? 8 : 0;  // the server never posts a send (as pyverbs' test)
      qa.cap.max_send_sge = 1;
      qa.cap.max_recv_wr = i == 0 ? 16 : 0;
      qa.cap.max_recv_sge = 1;
      qa.srq = i == 1 ? srq_ : nullptr;
      qp_[i] = ibv_create_qp(pd_, &qa);
      ASSERT_NE(qp_[i], nullptr) << strerror(errno);
    }
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
    for (int i = 0; i < 2; ++i) ASSERT_EQ(rc_connect(qp_[i], qp_[1 - i]->qp_num, gid, kAccess, 4), 0);
  }
  void TearDown() override {
    for (auto* q : qp_) {
      if (q) {
        EXPECT_EQ(ibv_destroy_qp(q), 0);
      }
    }
    if (srq_) {
      EXPECT_EQ(ibv_destroy_srq(srq_), 0);
    }
    for (int i = 0; i < 2; ++i) {
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

  Wc poll(int side, int ms = 3000) {
    Wc w;
    ibv_poll_cq_attr pa{};
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    ibv_cq_ex* cq = cq_[side];
    int rc;
    while ((rc = ibv_start_poll(cq, &pa)) == ENOENT && std::chrono::steady_clock::now() < end) {
    }
    w.rc = rc;
    if (rc != 0) return w;
    w.wr_id = cq->wr_id;
    w.status = cq->status;
    w.opcode = ibv_wc_read_opcode(cq);
    w.flags = ibv_wc_read_wc_flags(cq);
    w.byte_len = ibv_wc_read_byte_len(cq);
    ibv_wc_read_tm_info(cq, &w.tm);
    ibv_end_poll(cq);
    return w;
  }
  // Unexpected buffers: server buffer offset 2048 + 256*i.
  void post_unexp(int n) {
    for (int i = 0; i < n; ++i) {
      ibv_sge g{reinterpret_cast<uint64_t>(buf_[1].data()) + 2048 + 256 * (i % 8), 256,
                mr_[1]->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = 1000 + i;
      wr.sg_list = &g;
      wr.num_sge = 1;
      ibv_recv_wr* bad;
      ASSERT_EQ(ibv_post_srq_recv(srq_, &wr, &bad), 0);
    }
  }
  // TAG_ADD of a 512-byte tag buffer at server offset off; returns the op's errno.
  int add_tag(uint64_t tag, uint64_t wr_id, size_t off, uint32_t* handle = nullptr,
              uint32_t unexp = 0, int flags = IBV_OPS_SIGNALED) {
    ibv_sge g{reinterpret_cast<uint64_t>(buf_[1].data()) + off, 512, mr_[1]->lkey};
    ibv_ops_wr op{};
    op.wr_id = wr_id;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = flags;
    op.tm.unexpected_cnt = unexp;
    op.tm.add.recv_wr_id = wr_id;
    op.tm.add.sg_list = &g;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = kMask;
    ibv_ops_wr* bad = nullptr;
    int rc = ibv_post_srq_ops(srq_, &op, &bad);
    if (handle) *handle = op.tm.handle;
    return rc;
  }
  int simple_op(ibv_ops_wr_opcode opc, uint64_t wr_id, uint32_t unexp, uint32_t handle = 0) {
    ibv_ops_wr op{};
    op.wr_id = wr_id;
    op.opcode = opc;
    op.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    op.tm.unexpected_cnt = unexp;
    op.tm.handle = handle;
    ibv_ops_wr* bad = nullptr;
    return ibv_post_srq_ops(srq_, &op, &bad);
  }
  // Client message: TMH (opcode, app_ctx, tag) then len-16 bytes of `fill`.
  void send_tm(uint8_t opc, uint64_t tag, uint32_t len, uint8_t fill, uint32_t app = 0xabcd) {
    uint8_t* b = buf_[0].data();
    std::memset(b, fill, len);
    ibv_tmh h{};
    h.opcode = opc;
    h.app_ctx = htonl(app);
    h.tag = htobe64(tag);
    std::memcpy(b, &h, sizeof h);
    post_send(len);
  }
  void post_send(uint32_t len) {
    ibv_sge g{reinterpret_cast<uint64_t>(buf_[0].data()), len, mr_[0]->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 7;
    wr.sg_list = &g;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    ASSERT_EQ(ibv_post_send(qp_[0], &wr, &bad), 0);
  }
  void expect_op(ibv_wc_opcode opc, uint64_t wr_id, unsigned flags = 0) {
    Wc w = poll(1);
    ASSERT_EQ(w.rc, 0);
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(w.opcode, opc);
    EXPECT_EQ(w.wr_id, wr_id);
    EXPECT_EQ(w.flags, flags);
  }
  void expect_send_ok() {
    Wc w = poll(0);
    ASSERT_EQ(w.rc, 0);
    EXPECT_EQ(w.status, IBV_WC_SUCCESS) << ibv_wc_status_str(w.status);
    EXPECT_EQ(w.opcode, IBV_WC_SEND);
  }

  ibv_context* ctx_ = nullptr;
  ibv_tm_caps caps_{};
  ibv_pd* pd_ = nullptr;
  ibv_cq_ex* cq_[2] = {};
  std::vector<uint8_t> buf_[2];
  ibv_mr* mr_[2] = {};
  ibv_srq* srq_ = nullptr;
  ibv_qp* qp_[2] = {};
};

TEST_F(TagMatchingTest, Caps) {
  EXPECT_TRUE(caps_.flags & IBV_TM_CAP_RC);
  EXPECT_GE(caps_.max_num_tags, 8u);
  EXPECT_GE(caps_.max_ops, 8u);
  EXPECT_GE(caps_.max_sge, 1u);
  EXPECT_GE(caps_.max_rndv_hdr_size, sizeof(ibv_tmh) + sizeof(ibv_rvh));
}

TEST_F(TagMatchingTest, EagerMatchesOldestTagAndStripsTheTmh) {
  post_unexp(2);
  ASSERT_EQ(add_tag(5, 50, 0), 0);
  expect_op(IBV_WC_TM_ADD, 50);
  ASSERT_EQ(add_tag(0x10005, 51, 512), 0);  // same tag under the mask: younger
  expect_op(IBV_WC_TM_ADD, 51);
  send_tm(IBV_TMH_EAGER, 0x70005, 100, 'x', 0x1234);
  expect_send_ok();
  Wc w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(w.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(w.wr_id, 50u);
  EXPECT_EQ(w.flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(w.tm.tag, 0x70005u);
  EXPECT_EQ(w.tm.priv, 0x1234u);
  EXPECT_EQ(w.byte_len, 84u);
  EXPECT_EQ(buf_[1][0], 'x');
  EXPECT_EQ(buf_[1][83], 'x');
  EXPECT_EQ(buf_[1][84], 0);
  send_tm(IBV_TMH_EAGER, 5, 32, 'y');
  expect_send_ok();
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.wr_id, 51u);
  EXPECT_EQ(buf_[1][512], 'y');
}

TEST_F(TagMatchingTest, UnexpectedIsCountedAndMatchingWaitsForTheSync) {
  post_unexp(4);
  ASSERT_EQ(add_tag(1, 10, 0), 0);
  expect_op(IBV_WC_TM_ADD, 10);
  send_tm(IBV_TMH_EAGER, 99, 64, 'u');
  expect_send_ok();
  Wc w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(w.flags, 0u);
  EXPECT_EQ(w.wr_id, 1000u);
  EXPECT_EQ(w.tm.tag, 0u);
  EXPECT_EQ(w.byte_len, 64u);
  EXPECT_EQ(buf_[1][2048], IBV_TMH_EAGER);  // the whole message, TMH included
  EXPECT_EQ(buf_[1][2048 + 63], 'u');
  // Out of sync: tag 1 is posted but not matched; an ADD asks for a sync.
  send_tm(IBV_TMH_EAGER, 1, 64, 'v');
  expect_send_ok();
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.flags, 0u);
  EXPECT_EQ(w.wr_id, 1001u);
  ASSERT_EQ(add_tag(2, 11, 512), 0);
  expect_op(IBV_WC_TM_ADD, 11, IBV_WC_TM_SYNC_REQ);
  ASSERT_EQ(simple_op(IBV_WR_TAG_SYNC, 27, 1), 0);  // a stale count keeps it off
  expect_op(IBV_WC_TM_SYNC, 27);
  ASSERT_EQ(simple_op(IBV_WR_TAG_SYNC, 28, 2), 0);
  expect_op(IBV_WC_TM_SYNC, 28);
  send_tm(IBV_TMH_EAGER, 1, 64, 'w');
  expect_send_ok();
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(w.wr_id, 10u);
  EXPECT_EQ(w.tm.tag, 1u);
}

TEST_F(TagMatchingTest, NoTagGoesToTheUnexpectedListUncounted) {
  post_unexp(2);
  ASSERT_EQ(add_tag(3, 30, 0), 0);
  expect_op(IBV_WC_TM_ADD, 30);
  send_tm(IBV_TMH_NO_TAG, 3, 40, 'n');
  expect_send_ok();
  Wc w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(w.flags, 0u);
  EXPECT_EQ(w.wr_id, 1000u);
  EXPECT_EQ(w.byte_len, 40u);
  EXPECT_EQ(buf_[1][2048 + 39], 'n');
  // Not counted: the tag still matches without a sync.
  send_tm(IBV_TMH_EAGER, 3, 40, 'm');
  expect_send_ok();
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(w.wr_id, 30u);
}

TEST_F(TagMatchingTest, RendezvousReadsTheSenderBufferAndSendsFin) {
  post_unexp(1);
  ibv_sge rg{reinterpret_cast<uint64_t>(buf_[0].data()) + 3072, 64, mr_[0]->lkey};
  ibv_recv_wr rw{};
  rw.wr_id = 77;
  rw.sg_list = &rg;
  rw.num_sge = 1;
  ibv_recv_wr* rbad;
  ASSERT_EQ(ibv_post_recv(qp_[0], &rw, &rbad), 0);  // for the FIN
  ASSERT_EQ(add_tag(9, 90, 1024), 0);
  expect_op(IBV_WC_TM_ADD, 90);
  // Sender data: bytes 1024..1423 of the client buffer.
  for (int i = 0; i < 400; ++i) buf_[0][1024 + i] = static_cast<uint8_t>(i * 7 + 1);
  uint8_t* b = buf_[0].data();
  ibv_tmh h{};
  h.opcode = IBV_TMH_RNDV;
  h.app_ctx = htonl(0x55);
  h.tag = htobe64(9);
  ibv_rvh v{};
  v.va = htobe64(reinterpret_cast<uint64_t>(b) + 1024);
  v.rkey = htonl(mr_[0]->rkey);
  v.len = htonl(400);
  std::memcpy(b, &h, sizeof h);
  std::memcpy(b + sizeof h, &v, sizeof v);
  post_send(sizeof h + sizeof v);
  expect_send_ok();
  Wc w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(w.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(w.flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(w.wr_id, 90u);
  EXPECT_EQ(w.tm.tag, 9u);
  EXPECT_EQ(w.tm.priv, 0x55u);
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_SUCCESS) << ibv_wc_status_str(w.status);
  EXPECT_EQ(w.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(w.flags, unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(w.wr_id, 90u);
  EXPECT_EQ(w.byte_len, 400u);
  EXPECT_EQ(std::memcmp(buf_[1].data() + 1024, buf_[0].data() + 1024, 400), 0);
  Wc f = poll(0);
  ASSERT_EQ(f.rc, 0);
  EXPECT_EQ(f.status, IBV_WC_SUCCESS);
  EXPECT_EQ(f.opcode, IBV_WC_RECV);
  EXPECT_EQ(f.wr_id, 77u);
  EXPECT_EQ(f.byte_len, sizeof(ibv_tmh));
  ibv_tmh fin;
  std::memcpy(&fin, buf_[0].data() + 3072, sizeof fin);
  EXPECT_EQ(fin.opcode, IBV_TMH_FIN);
  EXPECT_EQ(ntohl(fin.app_ctx), 0x55u);
  EXPECT_EQ(be64toh(fin.tag), 9u);
}

TEST_F(TagMatchingTest, DeletedTagNoLongerMatches) {
  post_unexp(2);
  uint32_t h = ~0u;
  ASSERT_EQ(add_tag(4, 40, 0, &h), 0);
  expect_op(IBV_WC_TM_ADD, 40);
  ASSERT_EQ(simple_op(IBV_WR_TAG_DEL, 41, 0, h), 0);
  expect_op(IBV_WC_TM_DEL, 41);
  ASSERT_EQ(simple_op(IBV_WR_TAG_DEL, 42, 0, h), 0);  // gone: IBV_WC_TM_ERR
  Wc w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_TM_ERR);
  EXPECT_EQ(w.wr_id, 42u);
  send_tm(IBV_TMH_EAGER, 4, 32, 'd');
  expect_send_ok();
  w = poll(1);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.flags, 0u);  // unexpected
  EXPECT_EQ(w.wr_id, 1000u);
}

TEST_F(TagMatchingTest, BadInputAndLimits) {
  // The list holds max_num_tags (8); unsignaled ADDs complete silently.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(add_tag(100 + i, i, 0, nullptr, 0, 0), 0);
  EXPECT_EQ(add_tag(200, 9, 0), ENOMEM);
  // ADD without an SGE, bad opcode, bad flags.
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_ADD;
  ibv_ops_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_ops(srq_, &op, &bad), EINVAL);
  EXPECT_EQ(bad, &op);
  op.opcode = static_cast<ibv_ops_wr_opcode>(17);
  EXPECT_EQ(ibv_post_srq_ops(srq_, &op, &bad), EINVAL);
  Wc w = poll(1, 50);
  EXPECT_EQ(w.rc, ENOENT);  // nothing completed
  // TM SRQ creation: needs its CQ and limits within tm_caps.
  ibv_srq_init_attr_ex sa{};
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TM;
  sa.srq_type = IBV_SRQT_TM;
  sa.pd = pd_;
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  sa.tm_cap.max_num_tags = 4;
  sa.tm_cap.max_ops = 4;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  sa.cq = ibv_cq_ex_to_cq(cq_[0]);
  sa.tm_cap.max_num_tags = caps_.max_num_tags + 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  sa.tm_cap.max_num_tags = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  // A basic SRQ has no list operations.
  ibv_srq_init_attr ba{};
  ba.attr.max_wr = 4;
  ba.attr.max_sge = 1;
  ibv_srq* basic = ibv_create_srq(pd_, &ba);
  ASSERT_NE(basic, nullptr);
  op.opcode = IBV_WR_TAG_SYNC;
  EXPECT_EQ(ibv_post_srq_ops(basic, &op, &bad), EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_srq(basic), 0);
  // A SEND shorter than the TMH: Invalid Request NAK, the sender sees REM_INV_REQ_ERR.
  post_unexp(1);
  post_send(8);
  w = poll(0);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(w.status);
}

TEST_F(TagMatchingTest, UnknownTmhOpcodeIsRefused) {
  post_unexp(1);
  send_tm(9, 1, 32, 'z');
  Wc w = poll(0);
  ASSERT_EQ(w.rc, 0);
  EXPECT_EQ(w.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(w.status);
  w = poll(1, 50);
  EXPECT_NE(w.rc == 0 && w.status == IBV_WC_SUCCESS, true);  // nothing was delivered
}

}  // namespace
