// Invalid verbs calls through the shim return what rdma-core (with the kernel behind it)
// returns: int verbs a positive errno, pointer verbs NULL with errno, *bad_wr always set.
// One test per verb family; none of these calls may crash.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

class ErrnoTest : public ::testing::Test {
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
    cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    buf_.resize(4096);
  }
  void TearDown() override {
    if (cq_) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  ibv_qp* make_qp(ibv_qp_type type, ibv_srq* srq = nullptr, uint32_t wr = 4) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq_;
    ia.recv_cq = cq_;
    ia.srq = srq;
    ia.cap.max_send_wr = wr;
    ia.cap.max_recv_wr = srq ? 0 : wr;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.qp_type = type;
    return ibv_create_qp(pd_, &ia);
  }
  ibv_srq* make_srq() {
    ibv_srq_init_attr si{};
    si.attr.max_wr = 4;
    si.attr.max_sge = 1;
    return ibv_create_srq(pd_, &si);
  }
  // RESET -> INIT -> ERR: a QP with an SRQ entering ERR reports LAST_WQE_REACHED
  // (IBA 11.6.3.2), an async event naming it.
  void to_err(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                        IBV_QP_ACCESS_FLAGS), 0);
    a = {};
    a.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  }
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<char> buf_;
};

TEST_F(ErrnoTest, DeviceQueries) {
  ibv_port_attr pa;
  errno = 0;
  EXPECT_EQ(ibv_query_port(ctx_, 2, &pa), EINVAL);
  EXPECT_EQ(errno, EINVAL);  // int verbs set errno too (UCX and Open MPI print %m)
  EXPECT_EQ(ibv_query_port(ctx_, 0, &pa), EINVAL);
  ibv_gid g;
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 4096, &g), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 2, 0, &g), -1);
  __be16 pkey;
  EXPECT_EQ(ibv_query_pkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(pkey, htobe16(0xffff));
  EXPECT_EQ(ibv_query_pkey(ctx_, 1, 5, &pkey), -1);
  ibv_gid_entry e;
  errno = 0;
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &e, 1), EINVAL);  // unknown flags
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 4096, &e, 0), ENODATA);
  EXPECT_EQ(errno, ENODATA);
  ibv_query_device_ex_input in{};
  in.comp_mask = 1;
  ibv_device_attr_ex ex;
  EXPECT_EQ(ibv_query_device_ex(ctx_, &in, &ex), EINVAL);
}

TEST_F(ErrnoTest, ProtectionDomain) {
  ibv_mr* mr = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);  // still in use: the kernel says EBUSY
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  ibv_pd* pd2 = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd2, nullptr);
  EXPECT_NE(pd2->handle, pd_->handle);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
}

TEST_F(ErrnoTest, MemoryRegion) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), 0, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  // Remote write without local write is refused (IBA 10.6.3.1).
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = ibv_reg_mr(pd_, buf_.data(), buf_.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->lkey, mr->rkey);
  EXPECT_EQ(mr->addr, buf_.data());
  EXPECT_EQ(mr->length, buf_.size());
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, 1 << 5, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(ErrnoTest, MemoryWindow) {
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(pd_, static_cast<ibv_mw_type>(3)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(mw->type, IBV_MW_TYPE_2);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST_F(ErrnoTest, CompletionQueue) {
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_device_attr da;
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, da.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 4, nullptr, nullptr, ctx_->num_comp_vectors), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq_init_attr_ex cx{};
  cx.cqe = 4;
  cx.wc_flags = IBV_WC_EX_WITH_CVLAN;  // not supported
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &cx), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  cx.wc_flags = static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &cx);
  ASSERT_NE(cqx, nullptr);
  ibv_wc wc[2];
  EXPECT_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 2, wc), 0);
  ibv_poll_cq_attr pa{};
  pa.comp_mask = 1;
  EXPECT_EQ(ibv_start_poll(cqx, &pa), EINVAL);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
  // A CQ used by a QP cannot be destroyed.
  ibv_qp* qp = make_qp(IBV_QPT_RC);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq_), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_resize_cq(cq_, 0), EINVAL);
}

TEST_F(ErrnoTest, CompletionChannelAndAsyncFd) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  ASSERT_GE(ch->fd, 0);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ch->refcnt, 1);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  // Non-blocking fds: nothing pending -> -1 / EAGAIN, and poll() says not readable.
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, fcntl(ctx_->async_fd, F_GETFL) | O_NONBLOCK), 0);
  ibv_async_event ae;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ae), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ch->refcnt, 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST_F(ErrnoTest, QueuePairCreateAndModify) {
  ibv_device_attr da;
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  errno = 0;
  EXPECT_EQ(make_qp(IBV_QPT_RC, nullptr, static_cast<uint32_t>(da.max_qp_wr) + 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_qp(static_cast<ibv_qp_type>(77)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_qp_init_attr ia{};
  ia.send_cq = cq_;
  ia.recv_cq = nullptr;  // missing CQ
  ia.cap.max_send_wr = 1;
  ia.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &ia), nullptr);
  EXPECT_EQ(errno, EINVAL);

  ibv_qp* qp = make_qp(IBV_QPT_RC);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;  // RESET -> RTR does not exist
  errno = ENOMEM;  // a stale value: UCX printed it ("Cannot allocate memory") before
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  a = {};
  a.qp_state = IBV_QPS_INIT;  // missing PKEY_INDEX | PORT | ACCESS_FLAGS
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS), 0);
  EXPECT_EQ(qp->state, IBV_QPS_INIT);
  ibv_qp_attr q;
  ibv_qp_init_attr qi;
  EXPECT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(qi.send_cq, cq_);
  EXPECT_EQ(qi.qp_type, IBV_QPT_RC);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(ErrnoTest, QueuePairPostSetsBadWr) {
  ibv_qp* qp = make_qp(IBV_QPT_RC);
  ASSERT_NE(qp, nullptr);
  ibv_mr* mr = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 16, mr->lkey};
  ibv_send_wr swr{};
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &swr, &bad), EINVAL);  // RESET: no sends
  EXPECT_EQ(bad, &swr);
  ibv_recv_wr rwr{};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), EINVAL);  // RESET: no receives
  EXPECT_EQ(rbad, &rwr);
  ibv_send_wr w2 = swr;
  w2.opcode = static_cast<ibv_wr_opcode>(99);
  bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &w2, &bad), EINVAL);
  EXPECT_EQ(bad, &w2);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(ErrnoTest, SharedReceiveQueue) {
  ibv_srq_init_attr si{};
  si.attr.max_wr = 0;
  si.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd_, &si), nullptr);
  EXPECT_EQ(errno, EINVAL);
  si.attr.max_wr = 8;
  si.attr.max_sge = 1000;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd_, &si), nullptr);
  EXPECT_EQ(errno, EINVAL);
  si.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq, nullptr);
  ibv_srq_attr sa{};
  sa.srq_limit = 100;  // above max_wr
  EXPECT_EQ(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL);
  ibv_sge sges[2] = {};
  ibv_recv_wr rwr{};
  rwr.sg_list = sges;
  rwr.num_sge = 2;  // more than max_sge
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, &rwr, &bad), EINVAL);
  EXPECT_EQ(bad, &rwr);
  ibv_qp* qp = make_qp(IBV_QPT_RC, srq);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

// Async events travel from the engine's device queue to the owning context's async_fd.
TEST_F(ErrnoTest, AsyncEventReachesOwningContext) {
  ibv_srq* srq = make_srq();
  ASSERT_NE(srq, nullptr);
  ibv_qp* qp = make_qp(IBV_QPT_RC, srq);
  ASSERT_NE(qp, nullptr);
  ASSERT_NO_FATAL_FAILURE(to_err(qp));
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, qp);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(qp->events_completed, 1u);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

// ibv_destroy_qp waits until the events the application got for the QP are acked (an
// async thread still holds one and acks it into the ibv_qp: UCX does), and drops the events it
// never read, as the kernel does: nothing names the freed QP afterwards.
TEST_F(ErrnoTest, DestroyWaitsForAckAndDropsUnreadEvents) {
  ibv_srq* srq = make_srq();
  ASSERT_NE(srq, nullptr);
  ibv_qp* held = make_qp(IBV_QPT_RC, srq);
  ASSERT_NE(held, nullptr);
  ASSERT_NO_FATAL_FAILURE(to_err(held));
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  ASSERT_EQ(ev.element.qp, held);
  std::atomic<bool> destroyed{false};
  std::thread t([&] {
    EXPECT_EQ(ibv_destroy_qp(held), 0);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(destroyed.load()) << "destroy returned with an event not acked";
  ibv_ack_async_event(&ev);  // writes into the ibv_qp: it must still be there
  t.join();
  EXPECT_TRUE(destroyed.load());

  // An event never read: destroy drops it, and the fd (non-blocking) then reports EAGAIN
  // rather than an event naming the freed QP.
  ibv_qp* unread = make_qp(IBV_QPT_RC, srq);
  ASSERT_NE(unread, nullptr);
  ASSERT_NO_FATAL_FAILURE(to_err(unread));
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  EXPECT_EQ(ibv_destroy_qp(unread), 0);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, fcntl(ctx_->async_fd, F_GETFL) | O_NONBLOCK), 0);
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(ErrnoTest, AddressHandle) {
  ibv_ah_attr aa{};
  aa.is_global = 0;  // RoCE needs a GRH
  aa.port_num = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd_, &aa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  aa.is_global = 1;
  aa.grh.dgid.raw[10] = 0xff;
  aa.grh.dgid.raw[11] = 0xff;
  aa.grh.dgid.raw[12] = 127;
  aa.grh.dgid.raw[15] = 9;
  aa.grh.hop_limit = 64;
  ibv_ah* ah = ibv_create_ah(pd_, &aa);
  ASSERT_NE(ah, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

// UD multicast: the checks of ib_attach_mcast (UD QP, multicast GID: EINVAL) and rxe's
// (idempotent attach, EINVAL detaching what is not attached), and honest device limits.
TEST_F(ErrnoTest, AttachDetachMcast) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  EXPECT_EQ(da.max_mcast_grp, 64);
  EXPECT_EQ(da.max_mcast_qp_attach, 56);
  EXPECT_EQ(da.max_total_mcast_qp_attach, 64 * 56);
  ibv_qp* ud = make_qp(IBV_QPT_UD);
  ibv_qp* rc = make_qp(IBV_QPT_RC);
  ASSERT_NE(ud, nullptr);
  ASSERT_NE(rc, nullptr);
  ibv_gid mc{};
  mc.raw[10] = mc.raw[11] = 0xff;
  mc.raw[12] = 239;
  mc.raw[13] = 194;
  mc.raw[14] = static_cast<uint8_t>(getpid());
  mc.raw[15] = 9;
  ibv_gid uni = mc;
  uni.raw[12] = 127;
  errno = 0;
  EXPECT_EQ(ibv_attach_mcast(nullptr, &mc, 0), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_attach_mcast(rc, &mc, 0), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_attach_mcast(ud, &uni, 0), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_detach_mcast(ud, &mc, 0), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_attach_mcast(ud, &mc, 0), 0) << strerror(errno);
  EXPECT_EQ(ibv_attach_mcast(ud, &mc, 0), 0);  // again: no change
  EXPECT_EQ(ibv_detach_mcast(rc, &mc, 0), EINVAL);
  EXPECT_EQ(ibv_detach_mcast(ud, &mc, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(ud, &mc, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(ud, &mc, 0), 0);
  EXPECT_EQ(ibv_destroy_qp(ud), 0);  // detaches it
  EXPECT_EQ(ibv_destroy_qp(rc), 0);
}

TEST_F(ErrnoTest, UnsupportedVerbs) {
  ibv_wq_init_attr wa{};
  errno = 0;
  EXPECT_EQ(ibv_create_wq(ctx_, &wa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_modify_cq_attr mc{};  // empty attr_mask: EINVAL (the kernel's answer)
  errno = 0;
  EXPECT_EQ(ibv_modify_cq(cq_, &mc), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  EXPECT_TRUE(v.raw_clock.tv_sec != 0 || v.raw_clock.tv_nsec != 0);
}

// ---- XRC (issue 14): each new verb's bad input gives the errno rdma-core 44 gives (libibverbs
// ibv_cmd_* checks, then the kernel's), with errno set.

// A temporary file whose inode names an XRC domain; removed at destruction.
struct XrcFile {
  XrcFile() {
    char t[] = "/tmp/softrnic-xrcd-XXXXXX";
    fd = mkstemp(t);
    path = t;
  }
  ~XrcFile() {
    if (fd >= 0) close(fd);
    unlink(path.c_str());
  }
  int fd = -1;
  std::string path;
};

ibv_xrcd* open_xrcd(ibv_context* ctx, int fd, int oflags) {
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = fd;
  xa.oflags = oflags;
  return ibv_open_xrcd(ctx, &xa);
}

ibv_srq* make_xrc_srq(ibv_context* ctx, ibv_pd* pd, ibv_xrcd* xrcd, ibv_cq* cq,
                      uint32_t max_wr = 4) {
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = max_wr;
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                IBV_SRQ_INIT_ATTR_PD;
  a.srq_type = IBV_SRQT_XRC;
  a.xrcd = xrcd;
  a.cq = cq;
  a.pd = pd;
  return ibv_create_srq_ex(ctx, &a);
}

ibv_qp* make_xrc_tgt(ibv_context* ctx, ibv_xrcd* xrcd) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_RECV;
  a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  a.xrcd = xrcd;
  return ibv_create_qp_ex(ctx, &a);
}

TEST_F(ErrnoTest, XrcdOpenCloseFileSemantics) {
  ibv_xrcd_init_attr xa{};
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);  // FD and OFLAGS are required
  EXPECT_EQ(errno, EINVAL);
  xa.comp_mask = IBV_XRCD_INIT_ATTR_RESERVED | IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = -1;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);  // unknown comp_mask bit
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(open_xrcd(ctx_, 9999, O_CREAT), nullptr);  // not a file descriptor
  EXPECT_EQ(errno, EBADF);
  XrcFile f;
  ASSERT_GE(f.fd, 0);
  errno = 0;
  EXPECT_EQ(open_xrcd(ctx_, f.fd, 0), nullptr);  // no domain for this inode and no O_CREAT
  EXPECT_EQ(errno, EAGAIN);
  ibv_xrcd* a = open_xrcd(ctx_, f.fd, O_CREAT);
  ASSERT_NE(a, nullptr) << strerror(errno);
  EXPECT_EQ(a->context, ctx_);
  // The same file (another descriptor of it) opens the same domain; O_EXCL refuses it.
  int fd2 = open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd2, 0);
  errno = 0;
  EXPECT_EQ(open_xrcd(ctx_, fd2, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_xrcd* b = open_xrcd(ctx_, fd2, 0);
  ASSERT_NE(b, nullptr) << strerror(errno);
  // Shared: a target QP created through one handle opens through the other.
  ibv_qp* tgt = make_xrc_tgt(ctx_, a);
  ASSERT_NE(tgt, nullptr) << strerror(errno);
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = tgt->qp_num;
  oa.xrcd = b;
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* opened = ibv_open_qp(ctx_, &oa);
  ASSERT_NE(opened, nullptr) << strerror(errno);
  EXPECT_EQ(opened->qp_num, tgt->qp_num);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
  EXPECT_EQ(ibv_destroy_qp(tgt), 0);
  EXPECT_EQ(ibv_close_xrcd(b), 0);
  EXPECT_EQ(ibv_close_xrcd(a), 0);
  // The last close freed the domain: O_EXCL creates a new one now.
  ibv_xrcd* c = open_xrcd(ctx_, fd2, O_CREAT | O_EXCL);
  ASSERT_NE(c, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_close_xrcd(c), 0);
  close(fd2);
  // fd -1: a private domain each time.
  ibv_xrcd* p1 = open_xrcd(ctx_, -1, O_CREAT | O_EXCL);
  ibv_xrcd* p2 = open_xrcd(ctx_, -1, O_CREAT | O_EXCL);
  ASSERT_NE(p1, nullptr);
  ASSERT_NE(p2, nullptr);
  EXPECT_EQ(ibv_close_xrcd(p1), 0);
  EXPECT_EQ(ibv_close_xrcd(p2), 0);
  // The device reports XRC.
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  EXPECT_NE(da.device_cap_flags & IBV_DEVICE_XRC, 0u);
}

TEST_F(ErrnoTest, XrcSrqBadInput) {
  ibv_xrcd* x = open_xrcd(ctx_, -1, O_CREAT);
  ASSERT_NE(x, nullptr) << strerror(errno);
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = 4;
  a.attr.max_sge = 1;
  a.srq_type = IBV_SRQT_XRC;
  a.pd = pd_;
  a.xrcd = x;
  a.cq = cq_;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &a), nullptr);  // XRC without its domain
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &a), nullptr);  // XRC without its CQ
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_xrc_srq(ctx_, pd_, x, cq_, 1u << 30), nullptr);  // too large
  EXPECT_EQ(errno, EINVAL);
  // Wrong domain: the XRCD, CQ or PD of another context.
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  ibv_context* other = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(other, nullptr);
  ibv_xrcd* ox = open_xrcd(other, -1, O_CREAT);
  ibv_cq* ocq = ibv_create_cq(other, 4, nullptr, nullptr, 0);
  ASSERT_NE(ox, nullptr);
  ASSERT_NE(ocq, nullptr);
  errno = 0;
  EXPECT_EQ(make_xrc_srq(ctx_, pd_, ox, cq_), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_xrc_srq(ctx_, pd_, x, ocq), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_xrc_tgt(ctx_, ox), nullptr);  // target QP on another context's domain
  EXPECT_EQ(errno, EINVAL);
  // ibv_get_srq_num: XRC SRQs have one, a basic SRQ does not.
  ibv_srq* xs = make_xrc_srq(ctx_, pd_, x, cq_);
  ASSERT_NE(xs, nullptr) << strerror(errno);
  uint32_t num = 0;
  EXPECT_EQ(ibv_get_srq_num(xs, &num), 0);
  EXPECT_NE(num, 0u);
  EXPECT_LE(num, 0xffffffu);
  ibv_srq* basic = make_srq();
  ASSERT_NE(basic, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_get_srq_num(basic, &num), EOPNOTSUPP);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // An XRC SRQ takes no RC QP (wrong type); the domain is busy while the SRQ lives.
  errno = 0;
  EXPECT_EQ(make_qp(IBV_QPT_RC, xs), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_close_xrcd(x), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_destroy_srq(basic), 0);
  EXPECT_EQ(ibv_destroy_srq(xs), 0);
  EXPECT_EQ(ibv_close_xrcd(x), 0);
  EXPECT_EQ(ibv_destroy_cq(ocq), 0);
  EXPECT_EQ(ibv_close_xrcd(ox), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST_F(ErrnoTest, XrcQpBadInput) {
  ibv_xrcd* x = open_xrcd(ctx_, -1, O_CREAT);
  ibv_xrcd* y = open_xrcd(ctx_, -1, O_CREAT);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_RECV;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd_;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);  // a target QP needs its XRC domain
  EXPECT_EQ(errno, EINVAL);
  ibv_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_XRC_RECV;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &ia), nullptr);  // ibv_create_qp has no domain to give
  EXPECT_EQ(errno, EINVAL);
  // XRC_SEND: PD and send CQ required, caps bounded.
  a = {};
  a.qp_type = IBV_QPT_XRC_SEND;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd_;
  a.cap.max_send_wr = 4;
  a.cap.max_send_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.send_cq = cq_;
  a.cap.max_send_wr = 1u << 30;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.cap.max_send_wr = 4;
  ibv_qp* ini = ibv_create_qp_ex(ctx_, &a);
  ASSERT_NE(ini, nullptr) << strerror(errno);
  EXPECT_EQ(ini->qp_type, IBV_QPT_XRC_SEND);
  ibv_recv_wr rw{};
  ibv_recv_wr* bad_r = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_post_recv(ini, &rw, &bad_r), EINVAL);  // no receive queue
  EXPECT_EQ(bad_r, &rw);
  ibv_qp* tgt = make_xrc_tgt(ctx_, x);
  ASSERT_NE(tgt, nullptr) << strerror(errno);
  EXPECT_EQ(tgt->pd, nullptr);
  EXPECT_EQ(tgt->send_cq, nullptr);
  EXPECT_EQ(tgt->qp_type, IBV_QPT_XRC_RECV);
  // The target's transitions: RESET -> INIT as RC; INIT -> RTR requires the responder's
  // max_dest_rd_atomic and min_rnr_timer (the initiator's does not).
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.port_num = 1;
  m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(tgt, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS), 0);
  ASSERT_EQ(ibv_modify_qp(ini, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS), 0);
  m = {};
  m.qp_state = IBV_QPS_RTR;
  m.path_mtu = IBV_MTU_1024;
  m.dest_qp_num = 0x123;
  m.ah_attr.is_global = 1;
  m.ah_attr.port_num = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &m.ah_attr.grh.dgid), 0);
  const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  errno = 0;
  EXPECT_EQ(ibv_modify_qp(tgt, &m, rtr), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_modify_qp(ini, &m, rtr), 0);
  EXPECT_EQ(ibv_modify_qp(tgt, &m, rtr | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(tgt, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(qi.qp_type, IBV_QPT_XRC_RECV);
  EXPECT_EQ(q.cap.max_send_wr, 0u);
  // A target QP has no send queue (wrong type for post_send).
  ibv_send_wr sw{};
  sw.opcode = IBV_WR_SEND;
  ibv_send_wr* bad_s = nullptr;
  m = {};
  m.qp_state = IBV_QPS_RTS;
  m.sq_psn = 1;
  m.timeout = 14;
  ASSERT_EQ(ibv_modify_qp(tgt, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN), 0);
  errno = 0;
  EXPECT_EQ(ibv_post_send(tgt, &sw, &bad_s), EINVAL);
  EXPECT_EQ(bad_s, &sw);
  // ibv_open_qp: masks as libibverbs checks them, then the QP must be a target of that domain.
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = tgt->qp_num;
  oa.xrcd = x;
  oa.qp_type = IBV_QPT_XRC_RECV;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);  // no XRCD bit
  EXPECT_EQ(errno, EINVAL);
  oa.comp_mask = IBV_QP_OPEN_ATTR_RESERVED | IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
                 IBV_QP_OPEN_ATTR_TYPE;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.xrcd = y;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);  // SRQ/QP of another XRC domain
  EXPECT_EQ(errno, EINVAL);
  oa.xrcd = x;
  oa.qp_num = ini->qp_num;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);  // not a target QP (wrong type)
  EXPECT_EQ(errno, EINVAL);
  oa.qp_num = tgt->qp_num;
  oa.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* opened = ibv_open_qp(ctx_, &oa);
  ASSERT_NE(opened, nullptr) << strerror(errno);
  // The QP outlives the creating handle while an opened one remains.
  EXPECT_EQ(ibv_destroy_qp(tgt), 0);
  errno = 0;
  EXPECT_EQ(ibv_close_xrcd(x), EBUSY);  // the target QP still uses it
  ASSERT_EQ(ibv_query_qp(opened, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
  EXPECT_EQ(ibv_destroy_qp(ini), 0);
  EXPECT_EQ(ibv_close_xrcd(x), 0);
  EXPECT_EQ(ibv_close_xrcd(y), 0);
}

}  // namespace
