// Teardown under load (issue 10): two processes, each with its own device, keep RDMA WRITE
// streams going at each other over real loopback UDP through the shim.
//  - KilledPeer: the peer is killed with SIGKILL mid-transfer; the survivor's outstanding WRs
//    all complete, the first with RETRY_EXC_ERR, within the retry timeout (timeout 14 =
//    67 ms, retry_cnt 7: 8 x 67 ms), and the survivor tears everything down cleanly.
//  - TeardownWhileTrafficFlows: while the peer writes into two of its MRs on two QPs, the
//    process deregisters one target MR (the peer's WRs fail with REM_ACCESS_ERR), destroys its
//    own sending QP with WRs in flight, destroys the other QP, deregisters, closes the device
//    (the peer's WRs on it fail with RETRY_EXC_ERR) and lives on. Both run in the default and
//    asan configurations (LeakSanitizer checks the teardown at exit).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "rc_connect.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kMsg = 65536;
constexpr int kDepth = 16;
constexpr int kQps = 3;
// The survivor's bound: (retry_cnt + 1) x 4.096 us x 2^timeout = 0.55 s, plus slack for a
// loaded 2-core machine (and ASan).
constexpr auto kRetryBound = std::chrono::seconds(5);

struct Info {
  uint32_t qpn[kQps];
  ibv_gid gid;
  uint64_t addr[kQps];  // target buffer of the peer's WRITEs on QP i
  uint32_t rkey[kQps];
};

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq[kQps] = {};
  ibv_qp* qp[kQps] = {};
  std::vector<uint8_t> src, dst[kQps];
  ibv_mr* msrc = nullptr;
  ibv_mr* mdst[kQps] = {};
  int outstanding[kQps] = {};

  bool open() {
    ibv_device** list = ibv_get_device_list(nullptr);
    if (list == nullptr || list[0] == nullptr) return false;
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr || (pd = ibv_alloc_pd(ctx)) == nullptr) return false;
    src.assign(kMsg, 0x5a);
    if ((msrc = ibv_reg_mr(pd, src.data(), src.size(), kAccess)) == nullptr) return false;
    for (int i = 0; i < kQps; ++i) {
      dst[i].assign(kMsg, 0);
      mdst[i] = ibv_reg_mr(pd, dst[i].data(), dst[i].size(), kAccess);
      cq[i] = ibv_create_cq(ctx, 2 * kDepth, nullptr, nullptr, 0);
      if (mdst[i] == nullptr || cq[i] == nullptr) return false;
      ibv_qp_init_attr ia{};
      ia.send_cq = cq[i];
      ia.recv_cq = cq[i];
      ia.cap.max_send_wr = kDepth;
      ia.cap.max_recv_wr = 1;
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ia.qp_type = IBV_QPT_RC;
      if ((qp[i] = ibv_create_qp(pd, &ia)) == nullptr) return false;
    }
    return true;
  }
  Info info() const {
    Info in{};
    for (int i = 0; i < kQps; ++i) {
      in.qpn[i] = qp[i]->qp_num;
      in.addr[i] = reinterpret_cast<uintptr_t>(dst[i].data());
      in.rkey[i] = mdst[i]->rkey;
    }
    ibv_query_gid(ctx, 1, 0, &in.gid);
    return in;
  }
  bool connect(const Info& peer) {
    for (int i = 0; i < kQps; ++i)
      if (rc_connect(qp[i], peer.qpn[i], peer.gid, kAccess, 1) != 0) return false;
    return true;
  }
  // Keeps QP i's send queue full of WRITEs into the peer's buffer i; returns the number of
  // successful completions polled, and in *err the first error status (IBV_WC_SUCCESS: none).
  // Posts WRITEs until kDepth are outstanding (or the QP refuses).
  void fill(int i, const Info& peer, const ibv_wc_status* err) {
    while (outstanding[i] < kDepth && *err == IBV_WC_SUCCESS) {
      ibv_sge s{reinterpret_cast<uintptr_t>(src.data()), kMsg, msrc->lkey};
      ibv_send_wr w{};
      w.sg_list = &s;
      w.num_sge = 1;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.rdma.remote_addr = peer.addr[i];
      w.wr.rdma.rkey = peer.rkey[i];
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(qp[i], &w, &bad) != 0) break;  // the QP went to ERR meanwhile
      ++outstanding[i];
    }
  }
  int pump(int i, const Info& peer, ibv_wc_status* err) {
    fill(i, peer, err);
    ibv_wc wc[kDepth];
    int n = ibv_poll_cq(cq[i], kDepth, wc);
    int ok = 0;
    for (int k = 0; k < n; ++k) {
      --outstanding[i];
      if (wc[k].status == IBV_WC_SUCCESS) {
        ++ok;
      } else if (*err == IBV_WC_SUCCESS) {
        *err = wc[k].status;
      }
    }
    return ok;
  }
  int teardown() {
    int fails = 0;
    for (int i = 0; i < kQps; ++i) {
      if (qp[i] != nullptr) fails += ibv_destroy_qp(qp[i]) != 0;
      if (cq[i] != nullptr) fails += ibv_destroy_cq(cq[i]) != 0;
      if (mdst[i] != nullptr) fails += ibv_dereg_mr(mdst[i]) != 0;
    }
    if (msrc != nullptr) fails += ibv_dereg_mr(msrc) != 0;
    if (pd != nullptr) fails += ibv_dealloc_pd(pd) != 0;
    if (ctx != nullptr) fails += ibv_close_device(ctx) != 0;
    return fails;
  }
};

bool read_full(int fd, void* p, size_t n, int timeout_ms) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0) return false;
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool write_full(int fd, const void* p, size_t n) {
  return write(fd, p, n) == static_cast<ssize_t>(n);
}

// What the child reports: the first error of its streams on QP 1 and QP 2.
struct Report {
  int status[kQps];
  int64_t ms_to_error[kQps];
};

// The child: opens its own device, connects, then streams on the QPs in `streams` until
// every one of them has failed or 20 s passed; reports and exits.
[[noreturn]] void child(int rd, int wr, std::vector<int> streams) {
  alarm(40);
  Side s;
  Info mine{}, peer{};
  if (!s.open()) _exit(10);
  mine = s.info();
  if (!write_full(wr, &mine, sizeof mine) || !read_full(rd, &peer, sizeof peer, 10000)) _exit(11);
  if (!s.connect(peer)) _exit(12);
  char go = 1;
  if (!write_full(wr, &go, 1)) _exit(13);
  Report rep{};
  ibv_wc_status err[kQps] = {};
  auto start = Clock::now();
  auto end = start + std::chrono::seconds(20);
  size_t failed = 0;
  while (failed < streams.size() && Clock::now() < end) {
    failed = 0;
    for (int i : streams) {
      if (err[i] == IBV_WC_SUCCESS) {
        s.pump(i, peer, &err[i]);
        if (err[i] != IBV_WC_SUCCESS) rep.ms_to_error[i] = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      }
      failed += err[i] != IBV_WC_SUCCESS;
    }
  }
  for (int i = 0; i < kQps; ++i) rep.status[i] = err[i];
  write_full(wr, &rep, sizeof rep);
  _exit(s.teardown() == 0 ? 0 : 14);
}

struct Peer {
  pid_t pid = -1;
  int rd = -1, wr = -1;
  Info info{};
  bool start(std::vector<int> streams, Side& me) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) return false;
    std::fflush(nullptr);
    pid = fork();
    if (pid == 0) {
      close(a[1]);
      close(b[0]);
      child(a[0], b[1], std::move(streams));
    }
    close(a[0]);
    close(b[1]);
    wr = a[1];
    rd = b[0];
    if (!me.open()) return false;
    Info mine = me.info();
    if (!read_full(rd, &info, sizeof info, 10000) || !write_full(wr, &mine, sizeof mine)) return false;
    if (!me.connect(info)) return false;
    char go = 0;
    return read_full(rd, &go, 1, 10000);
  }
  int wait_exit() {
    int st = 0;
    for (int i = 0; i < 300; ++i) {
      if (waitpid(pid, &st, WNOHANG) == pid) return st;
      usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return st;
  }
  ~Peer() {
    if (rd >= 0) close(rd);
    if (wr >= 0) close(wr);
  }
};

TEST(Teardown, KilledPeerFailsSurvivorsWrsWithinRetryTimeout) {
  Side me;
  Peer peer;
  ASSERT_TRUE(peer.start({0}, me));  // the child writes to us on QP 0 until killed
  ibv_wc_status err = IBV_WC_SUCCESS;
  int done = 0;
  auto until = Clock::now() + std::chrono::seconds(20);
  while (done < 200 && err == IBV_WC_SUCCESS && Clock::now() < until) done += me.pump(0, peer.info, &err);
  ASSERT_EQ(err, IBV_WC_SUCCESS) << ibv_wc_status_str(err);
  ASSERT_GE(done, 200) << "no traffic";
  ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
  const auto killed = Clock::now();
  int st = 0;
  waitpid(peer.pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st));
  // Every outstanding WR completes: the first with RETRY_EXC_ERR, the rest flushed.
  while ((err == IBV_WC_SUCCESS || me.outstanding[0] > 0) && Clock::now() < killed + 3 * kRetryBound)
    me.pump(0, peer.info, &err);
  const auto took = Clock::now() - killed;
  EXPECT_EQ(err, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(err);
  EXPECT_EQ(me.outstanding[0], 0) << "WRs left without a completion";
  EXPECT_LT(took, kRetryBound) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_EQ(me.teardown(), 0);
}

TEST(Teardown, TeardownWhileTrafficFlows) {
  Side me;
  Peer peer;
  ASSERT_TRUE(peer.start({1, 2}, me));  // the child writes to us on QPs 1 and 2
  ibv_wc_status err = IBV_WC_SUCCESS;
  int done = 0;
  auto until = Clock::now() + std::chrono::seconds(20);
  while (done < 200 && err == IBV_WC_SUCCESS && Clock::now() < until) done += me.pump(0, peer.info, &err);
  ASSERT_EQ(err, IBV_WC_SUCCESS) << ibv_wc_status_str(err);
  // Mid-transfer: the MR the peer writes on QP 1 goes, then our sending QP with WRs in flight,
  // then the QP the peer writes on (2) and everything else, and the device.
  ASSERT_EQ(ibv_dereg_mr(me.mdst[1]), 0);
  me.mdst[1] = nullptr;
  me.fill(0, peer.info, &err);  // posted, never polled: destroy meets them unreaped
  EXPECT_GT(me.outstanding[0], 0);
  ASSERT_EQ(ibv_destroy_qp(me.qp[0]), 0);
  me.qp[0] = nullptr;
  usleep(50000);  // the peer's QP 2 still flows while QP 1 has failed
  EXPECT_EQ(me.teardown(), 0);
  Report rep{};
  ASSERT_TRUE(read_full(peer.rd, &rep, sizeof rep, 30000)) << "the peer's WRs did not all fail";
  EXPECT_EQ(rep.status[1], IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(rep.status[1]));
  EXPECT_EQ(rep.status[2], IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(rep.status[2]));
  const int st = peer.wait_exit();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "peer status " << st;
}

}  // namespace
