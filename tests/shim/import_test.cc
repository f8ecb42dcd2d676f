// tests/shim/import_test.cc: shared objects between contexts (ibv_import_device,
// ibv_import_pd/mr/dm, unimport) and the GID table's empty slots, through the built shim.
// Each case fails while the feature is missing (the stubs answered EOPNOTSUPP; gid_tbl_len
// counted only the populated GIDs).
#include <gtest/gtest.h>

#include "rc_connect.h"
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kLen = 4096;

ibv_context* open_first() {
  ibv_device** list = ibv_get_device_list(nullptr);
  if (list == nullptr || list[0] == nullptr) return nullptr;
  ibv_context* c = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  return c;
}

bool poll_one(ibv_cq* cq, ibv_wc* wc) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n == 1) return true;
    if (n < 0) return false;
  }
  return false;
}

class ImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = open_first();
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    buf_.assign(kLen, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), kLen, kAccess);
    ASSERT_NE(mr_, nullptr);
  }
  void TearDown() override {
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buf_;
};

// The imported context is another ibv_context on the same device; the imported PD and MR carry
// the original's handle and keys, and an RDMA WRITE from a QP of the original context lands in
// the MR through a QP created on the imported context and PD.
TEST_F(ImportTest, ImportedContextPdMrCarryTraffic) {
  int fd = dup(ctx_->cmd_fd);
  ASSERT_GE(fd, 0);
  ibv_context* ictx = ibv_import_device(fd);
  ASSERT_NE(ictx, nullptr) << strerror(errno);
  EXPECT_NE(ictx, ctx_);
  EXPECT_EQ(ictx->device, ctx_->device);
  EXPECT_EQ(ictx->cmd_fd, fd);
  ibv_pd* ipd = ibv_import_pd(ictx, pd_->handle);
  ASSERT_NE(ipd, nullptr) << strerror(errno);
  EXPECT_EQ(ipd->handle, pd_->handle);
  EXPECT_EQ(ipd->context, ictx);
  ibv_mr* imr = ibv_import_mr(ipd, mr_->handle);
  ASSERT_NE(imr, nullptr) << strerror(errno);
  EXPECT_EQ(imr->handle, mr_->handle);
  EXPECT_EQ(imr->lkey, mr_->lkey);
  EXPECT_EQ(imr->rkey, mr_->rkey);
  EXPECT_EQ(imr->length, mr_->length);
  EXPECT_EQ(imr->addr, nullptr);  // as rdma-core's import
  EXPECT_EQ(imr->pd, ipd);

  // Client: its own MR, CQ, QP on the original context. Server: CQ and QP on the imported.
  std::vector<uint8_t> src(kLen, 0xA5);
  ibv_mr* smr = ibv_reg_mr(pd_, src.data(), kLen, kAccess);
  ASSERT_NE(smr, nullptr);
  ibv_cq* cq[2] = {ibv_create_cq(ctx_, 16, nullptr, nullptr, 0),
                   ibv_create_cq(ictx, 16, nullptr, nullptr, 0)};
  ASSERT_NE(cq[0], nullptr);
  ASSERT_NE(cq[1], nullptr);
  ibv_qp* qp[2];
  for (int i = 0; i < 2; ++i) {
    ibv_qp_init_attr qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.send_cq = qa.recv_cq = cq[i];
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qp[i] = ibv_create_qp(i == 0 ? pd_ : ipd, &qa);
    ASSERT_NE(qp[i], nullptr) << strerror(errno);
  }
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ictx, 1, 0, &gid), 0);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(rc_connect(qp[i], qp[1 - i]->qp_num, gid, kAccess, 1), 0);
  ibv_sge s{reinterpret_cast<uintptr_t>(src.data()), kLen, smr->lkey};
  ibv_send_wr w{};
  w.wr_id = 7;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_.data());
  w.wr.rdma.rkey = imr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(qp[0], &w, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(cq[0], &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::memcmp(buf_.data(), src.data(), kLen), 0);

  // While imported, the originals stay: dealloc_pd / dereg_mr are EBUSY.
  EXPECT_EQ(ibv_dereg_mr(mr_), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp[0]), 0);
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  ibv_unimport_mr(imr);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);  // the imported PD (and the QP on it) still name it
  // As rdma-core's test_shared_pd: the PD is unimported while a QP created on it lives; the
  // QP is destroyed afterwards (the engine PD stays in use until then).
  ibv_unimport_pd(ipd);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);  // the QP on the imported PD
  EXPECT_EQ(ibv_destroy_qp(qp[1]), 0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ibv_destroy_cq(cq[i]), 0);
  EXPECT_EQ(ibv_close_device(ictx), 0);  // closes fd; the original's cmd_fd stays open
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_NE(fcntl(ctx_->cmd_fd, F_GETFD), -1);
}

TEST_F(ImportTest, BadFdsAndHandles) {
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  int p[2];
  ASSERT_EQ(pipe(p), 0);  // an open fd that is no cmd_fd
  errno = 0;
  EXPECT_EQ(ibv_import_device(p[0]), nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(p[0]);
  close(p[1]);
  int devnull = open("/dev/null", O_RDWR);
  errno = 0;
  EXPECT_EQ(ibv_import_device(devnull), nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(devnull);

  // The cmd_fd of a context already closed (a dup kept open): EOPNOTSUPP.
  ibv_context* gone = open_first();
  ASSERT_NE(gone, nullptr);
  int kept = dup(gone->cmd_fd);
  ASSERT_EQ(ibv_close_device(gone), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(kept), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(kept);

  // Handles not in the file: ENOENT. A PD of ANOTHER ibv_open_device (another file) too.
  errno = 0;
  EXPECT_EQ(ibv_import_pd(ctx_, pd_->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd_, mr_->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(ctx_, 0xdead), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(nullptr, pd_->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(nullptr, mr_->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_context* other = open_first();
  ASSERT_NE(other, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(other, pd_->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_pd* opd = ibv_alloc_pd(other);
  ASSERT_NE(opd, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(opd, mr_->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_dealloc_pd(opd), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
  // Unimport of objects that were never imported is ignored: they stay usable.
  ibv_unimport_mr(mr_);
  ibv_unimport_pd(pd_);
  EXPECT_EQ(mr_->context, ctx_);
  // A deregistered MR's handle is gone from the table.
  ibv_mr* m2 = ibv_reg_mr(pd_, buf_.data(), 64, kAccess);
  ASSERT_NE(m2, nullptr);
  uint32_t h = m2->handle;
  ASSERT_EQ(ibv_dereg_mr(m2), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd_, h), nullptr);
  EXPECT_EQ(errno, ENOENT);
}

// An object created on the imported context is importable back on the original (one file),
// and closing the importing context releases its live imports: the originals are freeable.
TEST_F(ImportTest, CloseReleasesImportsAndTheFileIsShared) {
  ibv_context* ictx = ibv_import_device(dup(ctx_->cmd_fd));
  ASSERT_NE(ictx, nullptr) << strerror(errno);
  ibv_pd* pd2 = ibv_alloc_pd(ictx);
  ASSERT_NE(pd2, nullptr);
  ibv_pd* back = ibv_import_pd(ctx_, pd2->handle);
  ASSERT_NE(back, nullptr) << strerror(errno);
  ibv_unimport_pd(back);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  ASSERT_NE(ibv_import_pd(ictx, pd_->handle), nullptr);
  ASSERT_NE(ibv_import_mr(ibv_import_pd(ictx, pd_->handle), mr_->handle), nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr_), EBUSY);
  // A second import from the imported context's own fd works too.
  ibv_context* i2 = ibv_import_device(dup(ictx->cmd_fd));
  ASSERT_NE(i2, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_close_device(i2), 0);
  EXPECT_EQ(ibv_close_device(ictx), 0);  // releases the 2 PD imports and the MR import
  EXPECT_EQ(ibv_dereg_mr(mr_), 0);
  mr_ = nullptr;
  EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
  pd_ = nullptr;
}

// Device memory: the imported DM is the same memory; free of the original is EBUSY until the
// import is released; dealloc/free of an import releases only the import.
TEST_F(ImportTest, ImportDmSharesTheMemory) {
  ibv_alloc_dm_attr a{};
  a.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &a);
  ASSERT_NE(dm, nullptr) << strerror(errno);
  ibv_context* ictx = ibv_import_device(dup(ctx_->cmd_fd));
  ASSERT_NE(ictx, nullptr) << strerror(errno);
  ibv_dm* idm = ibv_import_dm(ictx, dm->handle);
  ASSERT_NE(idm, nullptr) << strerror(errno);
  EXPECT_EQ(idm->handle, dm->handle);
  EXPECT_EQ(idm->context, ictx);
  std::vector<uint8_t> w(4096, 0xAB), r(4096, 0);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, w.data(), w.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(r.data(), idm, 0, r.size()), 0);
  EXPECT_EQ(r, w);
  EXPECT_EQ(ibv_memcpy_from_dm(r.data(), idm, 4, r.size()), EFAULT);  // its bounds are the DM's
  // An MR over the imported DM counts on the original.
  ibv_pd* ipd = ibv_import_pd(ictx, pd_->handle);
  ASSERT_NE(ipd, nullptr);
  ibv_mr* dmr = ibv_reg_dm_mr(ipd, idm, 0, 4096, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(dmr, nullptr) << strerror(errno);
  ibv_unimport_dm(idm);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);  // the MR lies in it
  EXPECT_EQ(ibv_dereg_mr(dmr), 0);
  idm = ibv_import_dm(ictx, dm->handle);
  ASSERT_NE(idm, nullptr);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);  // imported
  EXPECT_EQ(ibv_free_dm(idm), 0);     // releases the import only
  EXPECT_EQ(ibv_dealloc_pd(ipd), 0);  // likewise
  const uint32_t h = dm->handle;
  EXPECT_EQ(ibv_free_dm(dm), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(ictx, h), nullptr);  // freed: gone from the table
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_close_device(ictx), 0);
}

void send_fd(int sock, int fd) {
  char c = 'x';
  char cbuf[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&c, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  cmsghdr* h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd, sizeof(int));
  (void)!sendmsg(sock, &m, 0);
}

int recv_fd(int sock) {
  char c;
  char cbuf[CMSG_SPACE(sizeof(int))];
  iovec iov{&c, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  if (recvmsg(sock, &m, 0) != 1 || CMSG_FIRSTHDR(&m) == nullptr) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  return fd;
}

// Another process's cmd_fd (passed by SCM_RIGHTS): EOPNOTSUPP, its objects live in that
// process's engine. A forked child importing its parent's (inherited) cmd_fd: EIO, as every
// verb on an inherited context.
TEST_F(ImportTest, CmdFdOfAnotherProcessIsNotSupported) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const int parent_fd = ctx_->cmd_fd;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child: imports the parent's fd, then opens its own device and sends it
    close(sv[0]);
    errno = 0;
    int fd = dup(parent_fd);
    bool inherited_eio = ibv_import_device(fd) == nullptr && errno == EIO;
    close(fd);
    ibv_context* mine = open_first();
    if (mine == nullptr) _exit(2);
    send_fd(sv[1], mine->cmd_fd);
    char c;
    (void)!read(sv[1], &c, 1);  // the parent has tried
    ibv_close_device(mine);
    _exit(inherited_eio ? 0 : 1);
  }
  close(sv[1]);
  int fd = recv_fd(sv[0]);
  ASSERT_GE(fd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(fd), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(fd);
  ASSERT_EQ(write(sv[0], "k", 1), 1);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  close(sv[0]);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// The GID table has empty slots, as a kernel device's: gid_tbl_len counts slots; an empty one
// reads as a zero GID (ibv_query_gid), ENODATA (ibv_query_gid_ex), and is not listed by
// ibv_query_gid_table; an AH on it is refused.
TEST(GidTable, EmptySlotsPastThePopulatedGids) {
  ibv_context* ctx = open_first();
  ASSERT_NE(ctx, nullptr);
  ibv_port_attr pa{};
  ASSERT_EQ(ibv_query_port(ctx, 1, &pa), 0);
  std::vector<ibv_gid_entry> ents(static_cast<size_t>(pa.gid_tbl_len));
  ssize_t n = ibv_query_gid_table(ctx, ents.data(), ents.size(), 0);
  ASSERT_GE(n, 1);
  EXPECT_LT(n, pa.gid_tbl_len);  // empty slots exist
  EXPECT_EQ(pa.gid_tbl_len, 1024);  // rxe's table length
  for (ssize_t i = 0; i < n; ++i) EXPECT_EQ(ents[static_cast<size_t>(i)].gid_index, i);
  const int empty = static_cast<int>(n);
  ibv_gid g;
  std::memset(g.raw, 0x11, sizeof g.raw);
  ASSERT_EQ(ibv_query_gid(ctx, 1, empty, &g), 0);
  for (uint8_t b : g.raw) EXPECT_EQ(b, 0);
  ASSERT_EQ(ibv_query_gid(ctx, 1, pa.gid_tbl_len - 1, &g), 0);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx, 1, pa.gid_tbl_len, &g), -1);  // past the table
  EXPECT_EQ(errno, EINVAL);
  ibv_gid_entry e{};
  EXPECT_EQ(ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(empty), &e, 0), ENODATA);
  EXPECT_EQ(ibv_query_gid_ex(ctx, 1, 0, &e, 0), 0);
  EXPECT_EQ(ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(pa.gid_tbl_len), &e, 0), ENODATA);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  aa.grh.dgid = ents[0].gid;
  aa.grh.sgid_index = static_cast<uint8_t>(empty);
  aa.grh.hop_limit = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &aa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
