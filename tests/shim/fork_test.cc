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
int child_main(ibv_context* pctx, ibv_cq* pcq, ibv_qp* pqp, ibv_mr* pmr, const ibv_gid& pgid) {
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
      if (child == 0) _exit(child_main(ctx, cq[0], qp[0], mr[0], gid));
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
