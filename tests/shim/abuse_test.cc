// Verbs-API abuse through the shim (issue 10): bad arguments, destroy while in use, use
// after close. Every case runs in a forked child with a 10 s alarm: it must neither crash
// nor hang, and must return what rdma-core 44 with the kernel (rxe) returns: int verbs a
// positive errno (errno set too for the command verbs), pointer verbs NULL with errno.
//
// Left out on purpose (undefined in rdma-core, which dereferences without a check, so
// there is no answer to match): NULL context/pd/cq/qp handles to ibv_alloc_pd, ibv_reg_mr,
// ibv_poll_cq, ibv_post_send; any call on an object after it was destroyed (double
// destroy, use after free); ibv_open_device(NULL).
#include <execinfo.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

namespace {

int g_fail = 0;  // failed checks in this child

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", __FILE__,      \
                   __LINE__, #cond, errno);                                       \
      ++g_fail;                                                                   \
    }                                                                             \
  } while (0)
#define CHECK_EQ(a, b)                                                            \
  do {                                                                            \
    long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);   \
    if (va_ != vb_) {                                                             \
      std::fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__,  \
                   __LINE__, #a, va_, #b, vb_);                                   \
      ++g_fail;                                                                   \
    }                                                                             \
  } while (0)

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Objects every case starts from (opened inside the child).
struct Env {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_device_attr da{};
  alignas(64) char buf[8192] = {};
  ibv_mr* mr = nullptr;

  bool open() {
    ibv_device** list = ibv_get_device_list(nullptr);
    if (list == nullptr || list[0] == nullptr) return false;
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) return false;
    if (ibv_query_device(ctx, &da) != 0) return false;
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, kAccess) : nullptr;
    return pd != nullptr && cq != nullptr && mr != nullptr;
  }
  ibv_qp* qp(uint32_t wr = 4, uint32_t sge = 2, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.srq = srq;
    ia.cap.max_send_wr = wr;
    ia.cap.max_recv_wr = srq ? 0 : wr;
    ia.cap.max_send_sge = sge;
    ia.cap.max_recv_sge = sge;
    ia.cap.max_inline_data = 32;
    ia.qp_type = IBV_QPT_RC;
    return ibv_create_qp(pd, &ia);
  }
  // Two RC QPs connected to each other over the device's own GID (real UDP loopback).
  bool pair(ibv_qp** a, ibv_qp** b) {
    *a = qp(8, 2);
    *b = qp(8, 2);
    if (*a == nullptr || *b == nullptr) return false;
    ibv_gid gid;
    if (ibv_query_gid(ctx, 1, 0, &gid) != 0) return false;
    return connect(*a, (*b)->qp_num, gid) && connect(*b, (*a)->qp_num, gid);
  }
  static bool connect(ibv_qp* qp, uint32_t dest, const ibv_gid& gid) {
    return rc_connect(qp, dest, gid, kAccess, 4) == 0;
  }
  // One completion from cq within 5 s; false if none came.
  bool poll_one(ibv_wc* wc) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end) {
      int n = ibv_poll_cq(cq, 1, wc);
      if (n < 0) return false;
      if (n == 1) return true;
    }
    return false;
  }
};

#ifndef __SANITIZE_ADDRESS__  // ASan's own handler reports better
// A child that dies of a signal prints its stack (frames as library+offset, for addr2line)
// before it dies of it again. CI saw SIGSEGV in CreateQpTooManyWr and DeallocPdWithQp: the
// shadow-pin mover froze the page of Env::buf that held the waiting frames (fixed in pin.cc
// run_on_mover; pin_test MoverHandOff*). A death the kernel forces this way runs no handler.
void on_fatal_signal(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  static const char kHead[] = "child: fatal signal, stack:\n";
  ssize_t w = write(2, kHead, sizeof(kHead) - 1);
  (void)w;
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
#endif

// Runs `body` in a forked child with a fresh device; the child must exit 0 within 10 s.
void in_child(const std::function<void(Env&)>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
#ifndef __SANITIZE_ADDRESS__  // ASan's own handler reports better
    void* warm[1];
    (void)backtrace(warm, 1);  // loads libgcc now, not inside the handler
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) signal(sig, on_fatal_signal);
#endif
    alarm(10);
    Env env;
    if (!env.open()) {
      std::fprintf(stderr, "child: cannot open the device: %s\n", std::strerror(errno));
      _exit(100);
    }
    body(env);
    _exit(g_fail > 99 ? 99 : g_fail);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
                                         ? " (hang: 10 s alarm)" : "");
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed checks in the child (see stderr)";
}

// An int verb's failure: the positive errno returned, and errno set to it.
#define CHECK_ERR(call, e)         \
  do {                             \
    errno = 0;                     \
    int rc_ = (call);              \
    CHECK_EQ(rc_, e);              \
    CHECK_EQ(errno, e);            \
  } while (0)
// A pointer verb's failure: NULL and errno.
#define CHECK_NULL(call, e)                  \
  do {                                       \
    errno = 0;                               \
    const void* p_ = (call);                 \
    CHECK(p_ == nullptr);                    \
    CHECK_EQ(errno, e);                      \
  } while (0)

// --- Memory registration -------------------------------------------------------------

TEST(Abuse, RegMrNullAddr) {
  // ib_umem_get cannot pin page 0: EFAULT.
  in_child([](Env& e) { CHECK_NULL(ibv_reg_mr(e.pd, nullptr, 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT); });
}

TEST(Abuse, RegMrHugeLength) {
  // 2^44 bytes over an 8 KiB buffer: the pin fails (EFAULT) or exceeds RLIMIT_MEMLOCK (ENOMEM).
  in_child([](Env& e) {
    errno = 0;
    CHECK(ibv_reg_mr(e.pd, e.buf, size_t{1} << 44, IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT || errno == ENOMEM);
  });
}

TEST(Abuse, RegMrWrappingLength) {
  // addr + length wraps: ib_umem_get refuses it with EINVAL.
  in_child([](Env& e) { CHECK_NULL(ibv_reg_mr(e.pd, e.buf, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), EINVAL); });
}

TEST(Abuse, RegMrUnmappedRange) {
  in_child([](Env& e) {
    void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    munmap(p, 8192);
    CHECK_NULL(ibv_reg_mr(e.pd, p, 8192, IBV_ACCESS_LOCAL_WRITE), EFAULT);
  });
}

TEST(Abuse, RegMrRemoteWriteWithoutLocalWrite) {
  in_child([](Env& e) { CHECK_NULL(ibv_reg_mr(e.pd, e.buf, 64, IBV_ACCESS_REMOTE_WRITE), EINVAL); });
}

// --- Destroy while in use (the kernel's uobject refcounts: EBUSY) --------------------

TEST(Abuse, DeallocPdWithMr) {
  in_child([](Env& e) {
    CHECK_ERR(ibv_dealloc_pd(e.pd), EBUSY);
    CHECK_EQ(ibv_dereg_mr(e.mr), 0);
    CHECK_EQ(ibv_dealloc_pd(e.pd), 0);  // usable again once free
  });
}

TEST(Abuse, DeallocPdWithQp) {
  in_child([](Env& e) {
    CHECK_EQ(ibv_dereg_mr(e.mr), 0);
    ibv_qp* q = e.qp();
    CHECK(q != nullptr);
    CHECK_ERR(ibv_dealloc_pd(e.pd), EBUSY);
    CHECK_EQ(ibv_destroy_qp(q), 0);
    CHECK_EQ(ibv_dealloc_pd(e.pd), 0);
  });
}

TEST(Abuse, DestroyCqWithQp) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    CHECK(q != nullptr);
    CHECK_ERR(ibv_destroy_cq(e.cq), EBUSY);
    CHECK_EQ(ibv_destroy_qp(q), 0);
    CHECK_EQ(ibv_destroy_cq(e.cq), 0);
  });
}

TEST(Abuse, DestroyChannelWithCq) {
  in_child([](Env& e) {
    ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
    CHECK(ch != nullptr);
    ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, ch, 0);
    CHECK(cq != nullptr);
    CHECK_ERR(ibv_destroy_comp_channel(ch), EBUSY);
    CHECK_EQ(ibv_destroy_cq(cq), 0);
    CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
  });
}

TEST(Abuse, DestroySrqWithQp) {
  in_child([](Env& e) {
    ibv_srq_init_attr si{};
    si.attr.max_wr = 4;
    si.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(e.pd, &si);
    CHECK(srq != nullptr);
    ibv_qp* q = e.qp(4, 1, srq);
    CHECK(q != nullptr);
    CHECK_ERR(ibv_destroy_srq(srq), EBUSY);
    CHECK_EQ(ibv_destroy_qp(q), 0);
    CHECK_EQ(ibv_destroy_srq(srq), 0);
  });
}

TEST(Abuse, DeallocPdWithAh) {
  in_child([](Env& e) {
    CHECK_EQ(ibv_dereg_mr(e.mr), 0);
    ibv_ah_attr aa{};
    aa.is_global = 1;
    CHECK_EQ(ibv_query_gid(e.ctx, 1, 0, &aa.grh.dgid), 0);
    aa.grh.hop_limit = 64;
    aa.port_num = 1;
    ibv_ah* ah = ibv_create_ah(e.pd, &aa);
    CHECK(ah != nullptr);
    CHECK_ERR(ibv_dealloc_pd(e.pd), EBUSY);
    CHECK_EQ(ibv_destroy_ah(ah), 0);
    CHECK_EQ(ibv_dealloc_pd(e.pd), 0);
  });
}

TEST(Abuse, CloseDeviceWithObjectsOpen) {
  // rdma-core 44's ibv_close_device always returns 0; the kernel frees what the closed
  // file still held. The child then exits cleanly.
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    CHECK(q != nullptr);
    CHECK_EQ(ibv_close_device(e.ctx), 0);
  });
}

// --- Limits at create ----------------------------------------------------------------

TEST(Abuse, CreateCqTooLarge) {
  in_child([](Env& e) { CHECK_NULL(ibv_create_cq(e.ctx, e.da.max_cqe + 1, nullptr, nullptr, 0), EINVAL); });
}

TEST(Abuse, CreateCqNegative) {
  in_child([](Env& e) { CHECK_NULL(ibv_create_cq(e.ctx, -1, nullptr, nullptr, 0), EINVAL); });
}

TEST(Abuse, CreateCqBadVector) {
  in_child([](Env& e) {
    CHECK_NULL(ibv_create_cq(e.ctx, 4, nullptr, nullptr, e.ctx->num_comp_vectors), EINVAL);
  });
}

TEST(Abuse, CreateQpTooManyWr) {
  in_child([](Env& e) { CHECK_NULL(e.qp(static_cast<uint32_t>(e.da.max_qp_wr) + 1), EINVAL); });
}

TEST(Abuse, CreateQpTooManySge) {
  in_child([](Env& e) { CHECK_NULL(e.qp(4, static_cast<uint32_t>(e.da.max_sge) + 1), EINVAL); });
}

TEST(Abuse, CreateSrqTooLarge) {
  in_child([](Env& e) {
    ibv_srq_init_attr si{};
    si.attr.max_wr = static_cast<uint32_t>(e.da.max_srq_wr) + 1;
    si.attr.max_sge = 1;
    CHECK_NULL(ibv_create_srq(e.pd, &si), EINVAL);
  });
}

// --- modify_qp -----------------------------------------------------------------------

TEST(Abuse, ModifyQpResetToRts) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    CHECK_ERR(ibv_modify_qp(q, &a, IBV_QP_STATE), EINVAL);  // IBA 10.3.1: no such transition
  });
}

TEST(Abuse, ModifyQpInitMissingAttrs) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;  // RC RESET->INIT requires PKEY_INDEX, PORT, ACCESS_FLAGS
    CHECK_ERR(ibv_modify_qp(q, &a, IBV_QP_STATE), EINVAL);
  });
}

TEST(Abuse, ModifyQpBadPort) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 2;
    CHECK_ERR(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS), EINVAL);
  });
}

TEST(Abuse, ModifyQpForbiddenAttrInTransition) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.sq_psn = 5;  // SQ_PSN is not allowed on RESET->INIT (IBA table 91)
    CHECK_ERR(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS | IBV_QP_SQ_PSN), EINVAL);
  });
}

// --- Queries -------------------------------------------------------------------------

TEST(Abuse, QueryGidOutOfRange) {
  in_child([](Env& e) {
    ibv_gid g;
    CHECK_EQ(ibv_query_gid(e.ctx, 1, 1 << 20, &g), -1);
    CHECK_EQ(ibv_query_gid(e.ctx, 1, -1, &g), -1);
  });
}

TEST(Abuse, QueryPortZero) {
  in_child([](Env& e) {
    ibv_port_attr pa;
    CHECK_EQ(ibv_query_port(e.ctx, 0, &pa), EINVAL);
  });
}

// --- Data path -----------------------------------------------------------------------

TEST(Abuse, PostSendTooManySge) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_sge sge[4];
    for (auto& s : sge) s = {reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = sge;
    wr.num_sge = 4;  // the QP was created with max_send_sge 2
    wr.opcode = IBV_WR_SEND;
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostSendNullSgList) {
  // rxe would read through the NULL list; the shim refuses it. num_sge 0 stays valid.
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_send_wr wr{};
    wr.sg_list = nullptr;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(e.buf);
    wr.wr.rdma.rkey = e.mr->rkey;
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
    wr.num_sge = 0;
    wr.send_flags = IBV_SEND_SIGNALED;
    CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
    ibv_wc wc{};
    CHECK(e.poll_one(&wc));
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  });
}

TEST(Abuse, PostRecvNullSgList) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_recv_wr wr{};
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    CHECK_EQ(ibv_post_recv(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostRecvTooManySge) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_sge sge[4];
    for (auto& s : sge) s = {reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = sge;
    wr.num_sge = 4;
    ibv_recv_wr* bad = nullptr;
    CHECK_EQ(ibv_post_recv(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostSendUnalignedCas) {
  // rxe's validate_send_wr refuses an atomic whose remote address is not 8-aligned at post
  // time (EINVAL); either way it must not crash or touch memory.
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    std::memset(e.buf, 0x5a, sizeof e.buf);
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(e.buf) + 4096 + 3;
    wr.wr.atomic.rkey = e.mr->rkey;
    wr.wr.atomic.compare_add = 0x5a5a5a5a5a5a5a5aull;
    wr.wr.atomic.swap = 1;
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(a, &wr, &bad);
    if (rc == 0) {
      ibv_wc wc{};
      CHECK(e.poll_one(&wc));
      CHECK(wc.status != IBV_WC_SUCCESS);
    } else {
      CHECK_EQ(rc, EINVAL);
      CHECK(bad == &wr);
    }
    for (size_t i = 4096; i < 4096 + 16; ++i) CHECK_EQ(static_cast<unsigned char>(e.buf[i]), 0x5a);
  });
}

TEST(Abuse, PostSendAtomicShortSge) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf), 4, e.mr->lkey};  // atomics need 8 bytes
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(e.buf) + 4096;
    wr.wr.atomic.rkey = e.mr->rkey;
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(a, &wr, &bad);
    if (rc == 0) {
      ibv_wc wc{};
      CHECK(e.poll_one(&wc));
      CHECK(wc.status != IBV_WC_SUCCESS);
    } else {
      CHECK_EQ(rc, EINVAL);
    }
  });
}

TEST(Abuse, PostSendUnknownOpcode) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_send_wr wr{};
    wr.opcode = static_cast<ibv_wr_opcode>(77);
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostSendInlineTooLong) {
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf), 4096, 0};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE;
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostSendQueueFull) {
  // More WRs than max_send_wr: the providers answer ENOMEM for a full send queue.
  in_child([](Env& e) {
    ibv_qp *a, *b;
    CHECK(e.pair(&a, &b));
    ibv_qp_attr qa;
    ibv_qp_init_attr qi;
    CHECK_EQ(ibv_query_qp(a, &qa, IBV_QP_CAP, &qi), 0);
    uint32_t n = qi.cap.max_send_wr + 1;
    ibv_send_wr wr[64]{};
    CHECK(n <= 64);
    // RDMA READ of 0 bytes to the peer, unsignaled; the peer keeps up but the SQ slots are
    // released only by completion processing, so the chain cannot fit.
    for (uint32_t i = 0; i < n && i < 64; ++i) {
      wr[i].opcode = IBV_WR_RDMA_WRITE;
      wr[i].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(e.buf);
      wr[i].wr.rdma.rkey = e.mr->rkey;
      wr[i].next = i + 1 < n ? &wr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(a, wr, &bad), ENOMEM);
    CHECK(bad == &wr[qi.cap.max_send_wr]);
  });
}

TEST(Abuse, PostSendResetQp) {
  in_child([](Env& e) {
    ibv_qp* q = e.qp();
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    ibv_send_wr* bad = nullptr;
    CHECK_EQ(ibv_post_send(q, &wr, &bad), EINVAL);  // RESET/INIT/RTR: no sends (IBA 10.8.2)
    CHECK(bad == &wr);
  });
}

TEST(Abuse, PostSrqRecvTooManySge) {
  in_child([](Env& e) {
    ibv_srq_init_attr si{};
    si.attr.max_wr = 4;
    si.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(e.pd, &si);
    CHECK(srq != nullptr);
    ibv_sge sge[2] = {{reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey},
                      {reinterpret_cast<uintptr_t>(e.buf), 8, e.mr->lkey}};
    ibv_recv_wr wr{};
    wr.sg_list = sge;
    wr.num_sge = 2;
    ibv_recv_wr* bad = nullptr;
    CHECK_EQ(ibv_post_srq_recv(srq, &wr, &bad), EINVAL);
    CHECK(bad == &wr);
  });
}

TEST(Abuse, ModifySrqLimitAboveMaxWr) {
  in_child([](Env& e) {
    ibv_srq_init_attr si{};
    si.attr.max_wr = 4;
    si.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(e.pd, &si);
    CHECK(srq != nullptr);
    ibv_srq_attr sa{};
    sa.srq_limit = 1000;
    CHECK_ERR(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL);
  });
}

// --- Completion channels -------------------------------------------------------------

TEST(Abuse, ReqNotifyWithoutChannel) {
  // Arming a CQ without a channel is legal (the kernel arms it; no event can be read).
  in_child([](Env& e) { CHECK_EQ(ibv_req_notify_cq(e.cq, 0), 0); });
}

TEST(Abuse, GetCqEventNonBlockingEmpty) {
  in_child([](Env& e) {
    ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
    CHECK(ch != nullptr);
    ibv_cq* cq = ibv_create_cq(e.ctx, 4, nullptr, ch, 0);
    CHECK(cq != nullptr);
    CHECK_EQ(ibv_req_notify_cq(cq, 0), 0);
    CHECK_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
    ibv_cq* got = nullptr;
    void* cctx = nullptr;
    errno = 0;
    CHECK_EQ(ibv_get_cq_event(ch, &got, &cctx), -1);
    CHECK_EQ(errno, EAGAIN);
  });
}

TEST(Abuse, ResizeCqBelowZero) {
  in_child([](Env& e) { CHECK_ERR(ibv_resize_cq(e.cq, 0), EINVAL); });
}

}  // namespace
