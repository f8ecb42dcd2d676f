// Fork safety of the embedded device (issue 10, verbs_shim/host.h): a parent keeps an RC
// ping-pong going between two QPs over real loopback UDP while a forked child pokes the
// inherited objects (every data-path verb fails cleanly and never touches the parent's
// socket), opens a device of its own on a new address, and exits; every parent message
// arrives intact.
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kMsg = 2048;
constexpr int kRounds = 400;

void connect(ibv_qp* qp, uint32_t dest, const ibv_gid& gid) {
  ASSERT_EQ(rc_connect(qp, dest, gid, kAccess, 1), 0);
}

uint8_t pattern(int round, uint32_t i) { return static_cast<uint8_t>(round * 31 + i * 7 + 1); }

// What the child checks; returns the number of failed checks (its exit status).
// The parent's objects the child is handed.
struct Inherited {
  ibv_context* ctx;
  ibv_pd* pd;
  ibv_cq* cq;
  ibv_qp* qp;
  ibv_mr* mr;
  ibv_ah* ah;
  ibv_mw* mw;
  ibv_comp_channel* channel;
};

// Queries, create_* on inherited objects, bind_mw, destroy_ah and the event channels: each
// fails with EIO (NULL + errno EIO) and never reaches the parent's engine, whose locks a
// thread of the parent may have held at fork.
void check_control_verbs(const Inherited& p, const std::function<void(bool, const char*)>& check) {
  auto eio = [&](int rc, const char* what) {
    check(rc == EIO && errno == EIO, what);
  };
  auto null_eio = [&](const void* obj, const char* what) {
    check(obj == nullptr && errno == EIO, what);
  };
  // The device queries read fixed attributes only and answer (device.cc), as do device
  // memory allocations (the child's own memory, dm.cc).
  ibv_device_attr da;
  check(ibv_query_device(p.ctx, &da) == 0 && da.max_qp > 0, "query_device: failed");
  ibv_device_attr_ex dax;
  check(ibv_query_device_ex(p.ctx, nullptr, &dax) == 0 && dax.max_dm_size > 0,
        "query_device_ex: failed");
  ibv_alloc_dm_attr dma{};
  dma.length = 64;
  ibv_dm* dm = ibv_alloc_dm(p.ctx, &dma);
  check(dm != nullptr && ibv_free_dm(dm) == 0, "alloc_dm/free_dm: failed");
  ibv_port_attr pa;
  eio(ibv_query_port(p.ctx, 1, &pa), "query_port: not EIO");
  ibv_gid g;
  errno = 0;
  check(ibv_query_gid(p.ctx, 1, 0, &g) == -1 && errno == EIO, "query_gid: not -1/EIO");
  __be16 pkey;
  errno = 0;
  check(ibv_query_pkey(p.ctx, 1, 0, &pkey) == -1 && errno == EIO, "query_pkey: not -1/EIO");
  ibv_gid_entry ge;
  eio(ibv_query_gid_ex(p.ctx, 1, 0, &ge, 0), "query_gid_ex: not EIO");
  ibv_qp_attr qa;
  ibv_qp_init_attr qia;
  eio(ibv_query_qp(p.qp, &qa, IBV_QP_STATE, &qia), "query_qp: not EIO");
  null_eio(ibv_alloc_pd(p.ctx), "alloc_pd on the parent's context");
  null_eio(ibv_create_cq(p.ctx, 4, nullptr, nullptr, 0), "create_cq on the parent's context");
  null_eio(ibv_create_comp_channel(p.ctx), "create_comp_channel on the parent's context");
  ibv_qp_init_attr ia{};
  ia.send_cq = p.cq;
  ia.recv_cq = p.cq;
  ia.cap.max_send_wr = 1;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.qp_type = IBV_QPT_RC;
  null_eio(ibv_create_qp(p.pd, &ia), "create_qp on the parent's PD");
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  null_eio(ibv_create_srq(p.pd, &sa), "create_srq on the parent's PD");
  char local[64];
  null_eio(ibv_reg_mr(p.pd, local, sizeof local, IBV_ACCESS_LOCAL_WRITE),
           "reg_mr on the parent's PD");
  null_eio(ibv_alloc_mw(p.pd, IBV_MW_TYPE_1), "alloc_mw on the parent's PD");
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  ibv_query_gid(p.ctx, 1, 0, &aa.grh.dgid);
  null_eio(ibv_create_ah(p.pd, &aa), "create_ah on the parent's PD");
  ibv_mw_bind bind{};
  bind.wr_id = 1;
  bind.bind_info.mr = p.mr;
  bind.bind_info.addr = reinterpret_cast<uintptr_t>(p.mr->addr);
  bind.bind_info.length = 8;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  eio(ibv_bind_mw(p.qp, p.mw, &bind), "bind_mw on the parent's QP: not EIO");
  eio(ibv_resize_cq(p.cq, 32), "resize_cq: not EIO");
  eio(ibv_destroy_ah(p.ah), "destroy_ah of the parent's AH: not EIO");
  eio(ibv_dealloc_mw(p.mw), "dealloc_mw of the parent's MW: not EIO");
  ibv_cq* ecq = nullptr;
  void* ectx = nullptr;
  errno = 0;
  check(ibv_get_cq_event(p.channel, &ecq, &ectx) == -1 && errno == EIO,
        "get_cq_event on the parent's channel: not -1/EIO");
  ibv_async_event ev;
  errno = 0;
  check(ibv_get_async_event(p.ctx, &ev) == -1 && errno == EIO,
        "get_async_event on the parent's context: not -1/EIO");
  eio(ibv_destroy_comp_channel(p.channel), "destroy_comp_channel: not EIO");
}

int child_main(const Inherited& p, const ibv_gid& pgid) {
  ibv_context* pctx = p.ctx;
  ibv_cq* pcq = p.cq;
  ibv_qp* pqp = p.qp;
  ibv_mr* pmr = p.mr;
  alarm(20);
  int fails = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "child: %s (errno %d)\n", what, errno);
      ++fails;
    }
  };
  // Keep polling the inherited CQ for a while: with the parent's traffic in flight a poll
  // that reached the engine would read (steal) the parent's datagrams.
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  ibv_wc wc[4];
  while (std::chrono::steady_clock::now() < end) {
    int n = ibv_poll_cq(pcq, 4, wc);
    if (n >= 0) {
      check(false, "poll_cq on the parent's CQ did not fail");
      break;
    }
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(pmr->addr), 8, pmr->lkey};
  ibv_send_wr swr{};
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* sbad = nullptr;
  check(ibv_post_send(pqp, &swr, &sbad) == EIO, "post_send on the parent's QP: not EIO");
  check(sbad == &swr, "post_send: bad_wr not set");
  ibv_recv_wr rwr{};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  check(ibv_post_recv(pqp, &rwr, &rbad) == EIO, "post_recv on the parent's QP: not EIO");
  check(ibv_req_notify_cq(pcq, 0) == EIO, "req_notify_cq on the parent's CQ: not EIO");
  ibv_qp_attr qa{};
  qa.qp_state = IBV_QPS_ERR;
  check(ibv_modify_qp(pqp, &qa, IBV_QP_STATE) == EIO, "modify_qp on the parent's QP: not EIO");
  check(ibv_destroy_qp(pqp) == EIO, "destroy_qp on the parent's QP: not EIO");
  check_control_verbs(p, check);
  check(ibv_close_device(pctx) == 0, "close_device of the inherited context");

  // A device of the child's own: a new engine on a new address, usable end to end.
  ibv_device** list = ibv_get_device_list(nullptr);
  check(list != nullptr && list[0] != nullptr, "no device list in the child");
  if (list == nullptr || list[0] == nullptr) return fails;
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  check(ctx != nullptr, "child cannot open its own device");
  if (ctx == nullptr) return fails;
  ibv_gid gid;
  check(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
  check(std::memcmp(&gid, &pgid, sizeof gid) != 0, "child's device on the parent's address");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
  check(pd != nullptr && cq != nullptr, "child objects");
  if (pd == nullptr || cq == nullptr) return fails;
  check(ibv_poll_cq(cq, 1, wc) == 0, "poll_cq on the child's own empty CQ");
  check(ibv_destroy_cq(cq) == 0, "destroy_cq");
  check(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
  check(ibv_close_device(ctx) == 0, "close_device");
  return fails;
}

TEST(Fork, ChildCannotStealParentTraffic) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  ASSERT_NE(list[0], nullptr);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq[2];
  ibv_qp* qp[2];
  ibv_mr* mr[2];
  std::vector<uint8_t> buf[2];
  for (int i = 0; i < 2; ++i) {
    cq[i] = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq[i], nullptr);
    buf[i].assign(2 * kMsg, 0);  // [0, kMsg) send, [kMsg, 2 kMsg) receive
    mr[i] = ibv_reg_mr(pd, buf[i].data(), buf[i].size(), kAccess);
    ASSERT_NE(mr[i], nullptr);
    ibv_qp_init_attr ia{};
    ia.send_cq = cq[i];
    ia.recv_cq = cq[i];
    ia.cap.max_send_wr = 8;
    ia.cap.max_recv_wr = 8;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.qp_type = IBV_QPT_RC;
    qp[i] = ibv_create_qp(pd, &ia);
    ASSERT_NE(qp[i], nullptr);
  }
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  connect(qp[0], qp[1]->qp_num, gid);
  connect(qp[1], qp[0]->qp_num, gid);
  // Objects only the child's control-verb checks use (the parent destroys them at the end:
  // the child's EIO must have left them intact).
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  aa.grh.dgid = gid;
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr);
  ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx);
  ASSERT_NE(channel, nullptr);

  auto post_recv = [&](int i) {
    ibv_sge s{reinterpret_cast<uintptr_t>(buf[i].data() + kMsg), kMsg, mr[i]->lkey};
    ibv_recv_wr w{};
    w.sg_list = &s;
    w.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(qp[i], &w, &bad);
  };
  auto send = [&](int i, int round) {
    for (uint32_t k = 0; k < kMsg; ++k) buf[i][k] = pattern(round, k);
    ibv_sge s{reinterpret_cast<uintptr_t>(buf[i].data()), kMsg, mr[i]->lkey};
    ibv_send_wr w{};
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    return ibv_post_send(qp[i], &w, &bad);
  };
  // Waits for the send completion of i and the receive completion of the peer.
  auto wait = [&](int i, int round) -> bool {
    int got_send = 0, got_recv = 0;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((got_send == 0 || got_recv == 0) && std::chrono::steady_clock::now() < end) {
      ibv_wc wc;
      for (int c = 0; c < 2; ++c) {
        int n = ibv_poll_cq(cq[c], 1, &wc);
        if (n < 0) return false;
        if (n == 0) continue;
        if (wc.status != IBV_WC_SUCCESS) {
          ADD_FAILURE() << "round " << round << ": " << ibv_wc_status_str(wc.status);
          return false;
        }
        if (wc.opcode == IBV_WC_SEND) ++got_send;
        if (wc.opcode == IBV_WC_RECV) {
          ++got_recv;
          EXPECT_EQ(wc.byte_len, kMsg);
        }
      }
    }
    if (got_send != 1 || got_recv != 1) return false;
    const uint8_t* r = buf[1 - i].data() + kMsg;
    for (uint32_t k = 0; k < kMsg; ++k) {
      if (r[k] != pattern(round, k)) {
        ADD_FAILURE() << "round " << round << " byte " << k << " corrupted";
        return false;
      }
    }
    return true;
  };

  ASSERT_EQ(post_recv(0), 0);
  ASSERT_EQ(post_recv(1), 0);
  pid_t child = -1;
  for (int round = 0; round < kRounds; ++round) {
    int from = round % 2;
    if (round == kRounds / 4) {
      std::fflush(nullptr);
      child = fork();
      ASSERT_GE(child, 0);
      if (child == 0) _exit(child_main({ctx, pd, cq[0], qp[0], mr[0], ah, mw, channel}, gid));
    }
    ASSERT_EQ(send(from, round), 0) << "round " << round;
    ASSERT_TRUE(wait(from, round)) << "round " << round;
    ASSERT_EQ(post_recv(1 - from), 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed checks in the child (see stderr)";

  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ibv_destroy_qp(qp[i]), 0);
    EXPECT_EQ(ibv_dereg_mr(mr[i]), 0);
    EXPECT_EQ(ibv_destroy_cq(cq[i]), 0);
  }
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST(Fork, ForkStatus) {
  // softrnic pins nothing in a kernel: a fork never breaks the parent's registered memory,
  // so ibv_fork_init has nothing to do (verbs_shim/context.cc).
  EXPECT_EQ(ibv_fork_init(), 0);
  EXPECT_EQ(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
}

}  // namespace
