// tests/bench/qp_scale.cc: many connected RC QPs on one device (issue 15, scale). Plain
// libibverbs, run against the shim: the process forks, parent and child each open the device
// (each gets its own loopback address), create --qps RC QPs, trade QP numbers over a pipe and
// connect QP i to the peer's QP i (INIT -> RTR -> RTS). Every QP then WRITEs 64 B into the
// peer's slot i and SENDs 64 B into the peer's receive slot i; each side checks that every
// one of its QPs received the right SEND (wc.qp_num, length, bytes) and that slot i holds the
// right WRITE. It measures, per side:
//   create/s, connect/s (three modify_qp each), destroy/s;
//   resident memory per QP: /proc/self/statm before creating the QPs and after every QP
//     passed traffic (buffers and MRs are made and touched before the first reading);
//   the idle-QP progress cost: a SEND ping-pong on --active QPs (made before the others),
//     timed (median us per round trip, and process CPU per round trip) with no other QP,
//     then again with the --qps QPs connected and idle.
// Prints one `qp_scale:` key=value line per side; exits 0 only if every QP of both sides
// passed checked data and (with --max-rss-kib) both sides' resident memory per QP is within
// the bound. Not timed as a test: the CI test (tests/bench/meson.build, qp_scale_1000) asserts
// only data and memory; scripts/bench scale runs the full count and reports the times.
//   qp_scale [--qps N] [--wr W] [--active K] [--rounds R] [--max-rss-kib KIB]
// (--wr: max_send_wr = max_recv_wr of the --qps QPs, default 4; the active QPs use 4)
#include <infiniband/verbs.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kSlot = 64;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
constexpr int kPipeTimeoutMs = 300'000;
constexpr int kWindow = 256;  // QPs with traffic in flight at once (socket buffers)

struct Opts {
  int qps = 5000;
  int active = 2;
  int rounds = 2000;
  int wr = 4;  // max_send_wr = max_recv_wr of the --qps QPs
  double max_rss_kib = 0;  // 0: no bound
};

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

double cpu_s() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// CPU time (ns, /proc/self/task/*/schedstat) of every thread but the caller: the shim's
// progress and dispatcher threads, where timers and background receive run.
double background_cpu_s() {
  const long self = static_cast<long>(gettid());
  double sum = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || std::atol(e->d_name) == self) continue;
    std::string path = std::string("/proc/self/task/") + e->d_name + "/schedstat";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      unsigned long long ns = 0;
      if (std::fscanf(f, "%llu", &ns) == 1) sum += ns * 1e-9;
      std::fclose(f);
    }
  }
  closedir(d);
  return sum;
}

long rss_bytes() {
  long size = 0, res = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  if (std::fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
  std::fclose(f);
  return res * sysconf(_SC_PAGESIZE);
}

bool write_full(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_full(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, kPipeTimeoutMs) <= 0) return false;
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The byte pattern QP `qpn` sends (kind 1) or writes (kind 2) as its message i.
void fill(uint8_t* p, uint32_t qpn, uint32_t i, uint8_t kind) {
  for (uint32_t k = 0; k < kSlot; ++k) p[k] = static_cast<uint8_t>(qpn * 7 + i * 13 + k + kind * 101);
}
bool matches(const uint8_t* p, uint32_t qpn, uint32_t i, uint8_t kind) {
  uint8_t want[kSlot];
  fill(want, qpn, i, kind);
  return std::memcmp(p, want, kSlot) == 0;
}

struct Hello {
  ibv_gid gid;
  uint64_t wbuf;
  uint32_t wkey;
};

class Side {
 public:
  Side(int rd, int wr, bool parent, const Opts& o) : rd_(rd), wr_(wr), parent_(parent), o_(o) {}

  int run();

 private:
  bool fail(const char* what) {
    std::fprintf(stderr, "qp_scale %s: %s (errno %d %s)\n", parent_ ? "parent" : "child", what,
                 errno, std::strerror(errno));
    return false;
  }
  bool open();
  bool create(std::vector<ibv_qp*>& v, int n, int wr);
  bool trade(const std::vector<ibv_qp*>& v, std::vector<uint32_t>& peer);
  bool connect(const std::vector<ibv_qp*>& v, const std::vector<uint32_t>& peer);
  bool post_recv(ibv_qp* qp, uint64_t id, uint8_t* buf);
  bool post_send(ibv_qp* qp, ibv_wr_opcode op, uint64_t id, uint8_t* buf, uint64_t raddr,
                 bool signaled);
  bool barrier();
  bool traffic();
  bool pingpong(double* us_median, double* cpu_us, double* bg_us);
  int wait_cq(ibv_cq* cq, ibv_wc* wc, int want);

  int rd_, wr_;
  bool parent_;
  Opts o_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* scq_ = nullptr;
  ibv_cq* rcq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> mem_;  // [send][recv][write target][write source], kSlot per QP each
  uint8_t* sbuf_ = nullptr;
  uint8_t* rbuf_ = nullptr;
  uint8_t* wbuf_ = nullptr;  // the peer WRITEs here
  uint8_t* xbuf_ = nullptr;  // the WRITEs' source
  Hello peer_{};
  std::vector<ibv_qp*> act_, qps_;
  std::vector<uint32_t> peer_act_, peer_qps_;
  int data_ok_ = 0;
};

bool Side::open() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) return fail("no device");
  ctx_ = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx_ == nullptr) return fail("ibv_open_device");
  if ((pd_ = ibv_alloc_pd(ctx_)) == nullptr) return fail("ibv_alloc_pd");
  ibv_device_attr da{};
  if (ibv_query_device(ctx_, &da) != 0) return fail("ibv_query_device");
  const int cqe = std::min(da.max_cqe, std::max(o_.qps, o_.rounds) + 2 * kWindow);
  scq_ = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
  rcq_ = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
  if (scq_ == nullptr || rcq_ == nullptr) return fail("ibv_create_cq");
  const size_t slots = static_cast<size_t>(o_.qps + o_.active);
  mem_.assign(4 * slots * kSlot, 0);
  sbuf_ = mem_.data();
  rbuf_ = sbuf_ + slots * kSlot;
  wbuf_ = rbuf_ + slots * kSlot;
  xbuf_ = wbuf_ + slots * kSlot;
  if ((mr_ = ibv_reg_mr(pd_, mem_.data(), mem_.size(), kAccess)) == nullptr) return fail("ibv_reg_mr");
  Hello me{};
  if (ibv_query_gid(ctx_, 1, 0, &me.gid) != 0) return fail("ibv_query_gid");
  me.wbuf = reinterpret_cast<uintptr_t>(wbuf_);
  me.wkey = mr_->rkey;
  if (!write_full(wr_, &me, sizeof me) || !read_full(rd_, &peer_, sizeof peer_)) return fail("hello");
  return true;
}

bool Side::create(std::vector<ibv_qp*>& v, int n, int wr) {
  for (int i = 0; i < n; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq_;
    ia.recv_cq = rcq_;
    ia.cap.max_send_wr = static_cast<uint32_t>(wr);
    ia.cap.max_recv_wr = static_cast<uint32_t>(wr);
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.qp_type = IBV_QPT_RC;
    ibv_qp* qp = ibv_create_qp(pd_, &ia);
    if (qp == nullptr) {
      std::fprintf(stderr, "qp_scale: ibv_create_qp #%d failed\n", i);
      return fail("ibv_create_qp");
    }
    v.push_back(qp);
  }
  return true;
}

bool Side::trade(const std::vector<ibv_qp*>& v, std::vector<uint32_t>& peer) {
  std::vector<uint32_t> mine;
  for (ibv_qp* q : v) mine.push_back(q->qp_num);
  peer.resize(v.size());
  if (!write_full(wr_, mine.data(), mine.size() * 4) || !read_full(rd_, peer.data(), peer.size() * 4))
    return fail("trading QP numbers");
  return true;
}

bool Side::connect(const std::vector<ibv_qp*>& v, const std::vector<uint32_t>& peer) {
  for (size_t i = 0; i < v.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = kAccess;
    if (ibv_modify_qp(v[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return fail("modify INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer[i];
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer_.gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(v[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return fail("modify RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(v[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      return fail("modify RTS");
  }
  return true;
}

bool Side::post_recv(ibv_qp* qp, uint64_t id, uint8_t* buf) {
  ibv_sge s{reinterpret_cast<uintptr_t>(buf), kSlot, mr_->lkey};
  ibv_recv_wr w{};
  w.wr_id = id;
  w.sg_list = &s;
  w.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &w, &bad) == 0 || fail("ibv_post_recv");
}

bool Side::post_send(ibv_qp* qp, ibv_wr_opcode op, uint64_t id, uint8_t* buf, uint64_t raddr,
                     bool signaled) {
  ibv_sge s{reinterpret_cast<uintptr_t>(buf), kSlot, mr_->lkey};
  ibv_send_wr w{};
  w.wr_id = id;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = op;
  w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  if (op == IBV_WR_RDMA_WRITE) {
    w.wr.rdma.remote_addr = raddr;
    w.wr.rdma.rkey = peer_.wkey;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &w, &bad) == 0 || fail("ibv_post_send");
}

bool Side::barrier() {
  char c = 'b';
  return (write_full(wr_, &c, 1) && read_full(rd_, &c, 1)) || fail("barrier");
}

// Polls until `want` completions arrived (or 60 s passed); returns the number polled.
int Side::wait_cq(ibv_cq* cq, ibv_wc* wc, int want) {
  int got = 0;
  const double until = now_s() + 60;
  while (got < want) {
    int n = ibv_poll_cq(cq, want - got, wc + got);
    if (n < 0) return got;
    got += n;
    if (n == 0 && now_s() > until) return got;
  }
  return got;
}

// Every QP: one WRITE into the peer's write slot i, then one SEND into its receive slot i.
bool Side::traffic() {
  const int n = o_.qps;
  for (int i = 0; i < n; ++i) {
    const size_t s = static_cast<size_t>(o_.active + i);
    fill(sbuf_ + s * kSlot, qps_[i]->qp_num, static_cast<uint32_t>(i), 1);
    fill(wbuf_ + s * kSlot, 0, 0, 0);  // overwritten by the peer's WRITE
    std::memset(rbuf_ + s * kSlot, 0, kSlot);
    if (!post_recv(qps_[i], static_cast<uint64_t>(i), rbuf_ + s * kSlot)) return false;
  }
  for (int i = 0; i < n; ++i)
    fill(xbuf_ + static_cast<size_t>(o_.active + i) * kSlot, qps_[i]->qp_num, i, 2);
  if (!barrier()) return false;  // both sides' receives are posted

  std::vector<ibv_wc> wc(static_cast<size_t>(kWindow));
  int posted = 0, done = 0, bad = 0;
  while (done < n) {
    while (posted < n && posted - done < kWindow) {
      const size_t s = static_cast<size_t>(o_.active + posted);
      ibv_sge ws{reinterpret_cast<uintptr_t>(xbuf_ + s * kSlot), kSlot, mr_->lkey};
      ibv_send_wr w{};
      w.sg_list = &ws;
      w.num_sge = 1;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.wr.rdma.remote_addr = peer_.wbuf + s * kSlot;
      w.wr.rdma.rkey = peer_.wkey;
      ibv_send_wr* badwr = nullptr;
      if (ibv_post_send(qps_[posted], &w, &badwr) != 0) return fail("post WRITE");
      if (!post_send(qps_[posted], IBV_WR_SEND, static_cast<uint64_t>(posted), sbuf_ + s * kSlot, 0, true))
        return false;
      ++posted;
    }
    int got = wait_cq(scq_, wc.data(), 1);
    if (got == 0) return fail("send completions stopped");
    for (int k = 0; k < got; ++k)
      if (wc[k].status != IBV_WC_SUCCESS) {
        if (bad++ < 5)
          std::fprintf(stderr, "qp_scale: send wr %llu: %s\n",
                       static_cast<unsigned long long>(wc[k].wr_id), ibv_wc_status_str(wc[k].status));
      }
    done += got;
  }
  // Receive side: one SEND per QP, checked against the peer's pattern for its QP i.
  std::vector<ibv_wc> rwc(static_cast<size_t>(n));
  int got = wait_cq(rcq_, rwc.data(), n);
  std::vector<char> seen(static_cast<size_t>(n), 0);
  int ok = 0;
  for (int k = 0; k < got; ++k) {
    const ibv_wc& c = rwc[k];
    const uint64_t i = c.wr_id;
    const size_t s = static_cast<size_t>(o_.active) + i;
    const bool good = c.status == IBV_WC_SUCCESS && i < static_cast<uint64_t>(n) && !seen[i] &&
                      c.qp_num == qps_[i]->qp_num && c.byte_len == kSlot &&
                      matches(rbuf_ + s * kSlot, peer_qps_[i], static_cast<uint32_t>(i), 1) &&
                      matches(wbuf_ + s * kSlot, peer_qps_[i], static_cast<uint32_t>(i), 2);
    if (good) {
      seen[i] = 1;
      ++ok;
    } else if (bad++ < 5) {
      std::fprintf(stderr, "qp_scale: recv wr %llu qp %u: %s, bad data or duplicate\n",
                   static_cast<unsigned long long>(i), c.qp_num, ibv_wc_status_str(c.status));
    }
  }
  data_ok_ = ok;
  return bad == 0 && ok == n;
}

// SEND ping-pong on every active QP in turn: the parent sends, the child answers; one round =
// one round trip on each active QP. Median microseconds per round and CPU per round.
bool Side::pingpong(double* us_median, double* cpu_us, double* bg_us) {
  const int k = o_.active;
  ibv_wc wc[4];
  for (int q = 0; q < k; ++q)
    for (int r = 0; r < 2; ++r)
      if (!post_recv(act_[q], static_cast<uint64_t>(q), rbuf_ + static_cast<size_t>(q) * kSlot)) return false;
  if (!barrier()) return false;
  std::vector<double> t;
  t.reserve(static_cast<size_t>(o_.rounds));
  const int warm = o_.rounds / 10;  // untimed: first packets, caches, the spin settling
  double c0 = cpu_s(), b0 = background_cpu_s();
  for (int r = 0; r < warm + o_.rounds; ++r) {
    if (r == warm) {
      c0 = cpu_s();
      b0 = background_cpu_s();
    }
    const double t0 = now_s();
    for (int q = 0; q < k; ++q) {
      uint8_t* sb = sbuf_ + static_cast<size_t>(q) * kSlot;
      if (parent_ && !post_send(act_[q], IBV_WR_SEND, q, sb, 0, true)) return false;
      if (wait_cq(rcq_, wc, 1) != 1 || wc[0].status != IBV_WC_SUCCESS) return fail("ping-pong receive");
      if (!post_recv(act_[q], static_cast<uint64_t>(q), rbuf_ + static_cast<size_t>(q) * kSlot)) return false;
      if (!parent_ && !post_send(act_[q], IBV_WR_SEND, q, sb, 0, true)) return false;
      if (wait_cq(scq_, wc, 1) != 1 || wc[0].status != IBV_WC_SUCCESS) return fail("ping-pong send");
    }
    if (r >= warm) t.push_back((now_s() - t0) * 1e6);
  }
  *cpu_us = (cpu_s() - c0) * 1e6 / o_.rounds;
  *bg_us = (background_cpu_s() - b0) * 1e6 / o_.rounds;
  std::sort(t.begin(), t.end());
  *us_median = t[t.size() / 2];
  // The receives still posted (one per QP) are flushed at destroy.
  return barrier();
}

int Side::run() {
  if (!open()) return 2;
  // Active QPs first, measured alone.
  if (!create(act_, o_.active, 4) || !trade(act_, peer_act_) || !connect(act_, peer_act_) || !barrier())
    return 3;
  double us0 = 0, cpu0 = 0, bg0 = 0;
  if (!pingpong(&us0, &cpu0, &bg0)) return 4;

  const long rss0 = rss_bytes();
  double t0 = now_s();
  if (!create(qps_, o_.qps, o_.wr)) return 5;
  const double t_create = now_s() - t0;
  if (!trade(qps_, peer_qps_)) return 5;
  t0 = now_s();
  if (!connect(qps_, peer_qps_)) return 6;
  const double t_connect = now_s() - t0;
  const long rss_conn = rss_bytes();
  if (!barrier()) return 6;
  const bool data = traffic();
  const long rss_traffic = rss_bytes();
  if (!barrier()) return 7;
  double us1 = 0, cpu1 = 0, bg1 = 0;
  if (!pingpong(&us1, &cpu1, &bg1)) return 8;

  t0 = now_s();
  for (ibv_qp* q : qps_)
    if (ibv_destroy_qp(q) != 0) return fail("ibv_destroy_qp"), 9;
  const double t_destroy = now_s() - t0;
  for (ibv_qp* q : act_) ibv_destroy_qp(q);
  ibv_dereg_mr(mr_);
  ibv_destroy_cq(scq_);
  ibv_destroy_cq(rcq_);
  ibv_dealloc_pd(pd_);
  ibv_close_device(ctx_);

  const double n = o_.qps;
  const double kib_conn = (rss_conn - rss0) / 1024.0 / n;
  const double kib = (rss_traffic - rss0) / 1024.0 / n;
  std::printf("qp_scale: side=%s qps=%d data_ok=%d create_per_s=%.0f connect_per_s=%.0f "
              "destroy_per_s=%.0f rss_kib_per_qp=%.1f rss_kib_per_qp_connected=%.1f "
              "active=%d rtt_us_idle0=%.1f rtt_us_idle%d=%.1f cpu_us_idle0=%.1f cpu_us_idle%d=%.1f "
              "bg_us_idle0=%.2f bg_us_idle%d=%.2f\n",
              parent_ ? "parent" : "child", o_.qps, data_ok_, n / t_create, n / t_connect,
              n / t_destroy, kib, kib_conn, o_.active, us0, o_.qps, us1, cpu0, o_.qps, cpu1, bg0,
              o_.qps, bg1);
  std::fflush(stdout);
  if (!data) return 10;
  if (o_.max_rss_kib > 0 && kib > o_.max_rss_kib) {
    std::fprintf(stderr, "qp_scale: %.1f KiB per QP > %.1f\n", kib, o_.max_rss_kib);
    return 11;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--qps") o.qps = std::atoi(argv[i + 1]);
    else if (k == "--active") o.active = std::atoi(argv[i + 1]);
    else if (k == "--rounds") o.rounds = std::atoi(argv[i + 1]);
    else if (k == "--wr") o.wr = std::atoi(argv[i + 1]);
    else if (k == "--max-rss-kib") o.max_rss_kib = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: qp_scale [--qps N] [--wr W] [--active K] [--rounds R] [--max-rss-kib KIB]\n");
      return 2;
    }
  }
  if (o.qps < 1 || o.active < 1 || o.rounds < 1 || o.wr < 2) return 2;
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) return 2;
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    close(a[1]);
    close(b[0]);
    Side s(a[0], b[1], false, o);
    int rc = s.run();
    std::fflush(nullptr);
    _exit(rc);
  }
  close(a[0]);
  close(b[1]);
  int rc = Side(b[0], a[1], true, o).run();
  if (rc != 0) kill(pid, SIGTERM);  // the child would wait on the pipe until its timeout
  int st = 0;
  waitpid(pid, &st, 0);
  const int crc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (rc != 0 || crc != 0) {
    std::fprintf(stderr, "qp_scale: FAILED (parent %d, child %d)\n", rc, crc);
    return 1;
  }
  std::printf("qp_scale: PASS %d QPs per side, every QP passed checked data\n", o.qps);
  return 0;
}
