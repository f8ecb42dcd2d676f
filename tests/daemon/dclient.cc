// tests/daemon/dclient: one client process of the daemon tests (daemon_test.cc). It opens the
// softrnicd device through the built shim (SOFTRNIC_HOSTING=daemon) and obeys one command per
// line on stdin, answering one line ("ok ..." or "err ...") per command on stdout, so the test
// can drive several processes, hand QPNs, PSNs, addresses and rkeys between them (the
// out-of-band exchange) and kill them mid-transfer. Test-only; exits 0 on EOF or `quit`.
//
//   open ID                      device, PD, CQ; ID names this process in the data patterns.
//                                -> ok GID(32 hex) PID
//   mr NAME SIZE SEED            registers SIZE bytes (local/remote write, remote read) filled
//                                with pattern(SEED, i)                -> ok ADDR RKEY
//   qp NAME                      an RC QP with a random first PSN       -> ok QPN PSN
//   connect NAME RQPN RPSN GID PEER_ID RADDR RKEY TIMEOUT RETRY
//                                INIT/RTR/RTS towards (RQPN, GID); RADDR/RKEY: the peer's window
//                                MR for `traffic`                       -> ok
//   traffic ROUNDS SIZE NAME...  on every named QP at once: ROUNDS times an RDMA WRITE of
//                                pattern(ID, peer, i) into window slot i % kSlots of the peer's
//                                MR at offset ID * kWindow, then a SEND of the same pattern;
//                                every received SEND is checked.    -> ok SENT RECEIVED
//   checkwin MR PEER ROUNDS SIZE the window PEER wrote into our MR NAME holds its last writes
//                                                                       -> ok | err ...
//   hash MR OFF LEN              FNV-1a of our memory                   -> ok HEX
//   rdma write|read QP MR OFF LEN RADDR RKEY
//                                one RDMA op from our MR; waits for its completion
//                                                                       -> ok STATUS(int)
//   forge IP QPN OPCODE PSN VA RKEY LEN BADICRC
//                                one RoCE packet from a plain UDP socket to IP:4791 (ICRC right,
//                                or wrong when BADICRC is 1)            -> ok
//   stream QP MR LEN             RDMA WRITEs to the peer's window until a completion fails:
//                                "ok started" after the first success, then at the failure
//                                "ok STATUS MONOTONIC_MS" (never, if we are killed first)
//   outstanding QP N             posts N receives and N SENDs (to a peer that never answers)
//                                                                       -> ok
//   waitfatal MS                 waits for IBV_EVENT_DEVICE_FATAL, then for the flush of every
//                                outstanding WR          -> ok EVENT FLUSHED OTHER POSTERR
//   destroy NAME                 destroys a QP                          -> ok
//   quit
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "wire/packet.h"

namespace {

constexpr uint32_t kWindow = 64 * 1024;  // bytes of a peer's window in our MR
constexpr uint32_t kSlots = 8;           // write slots in a window
constexpr int kRecvDepth = 64;
constexpr int kSendDepth = 128;

uint8_t pattern(uint32_t seed, uint32_t i) { return static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8) + 1); }
uint32_t seed_of(uint32_t from, uint32_t to, uint32_t round) { return from * 1000003u + to * 7919u + round; }

uint64_t mono_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

struct Mr {
  std::vector<uint8_t> buf;
  ibv_mr* mr = nullptr;
};

struct Qp {
  ibv_qp* qp = nullptr;
  uint32_t psn = 0;
  uint32_t peer = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  // traffic state
  std::vector<uint8_t> sbuf, rbuf;
  ibv_mr* smr = nullptr;
  ibv_mr* rmr = nullptr;
};

ibv_context* g_ctx = nullptr;
ibv_pd* g_pd = nullptr;
ibv_cq* g_cq = nullptr;
uint32_t g_id = 0;
std::map<std::string, Mr> g_mrs;
std::map<std::string, Qp> g_qps;
std::mt19937 g_rng{std::random_device{}()};
int g_outstanding = 0;  // WRs `outstanding` posted

void reply(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

std::string gid_hex(const ibv_gid& g) {
  char b[40];
  for (int i = 0; i < 16; ++i) std::snprintf(b + 2 * i, 3, "%02x", g.raw[i]);
  return b;
}

bool parse_gid(const std::string& s, ibv_gid* g) {
  if (s.size() != 32) return false;
  for (int i = 0; i < 16; ++i) g->raw[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return true;
}

std::string err(const char* what) { return std::string("err ") + what + ": " + std::strerror(errno); }

std::string cmd_open(std::istringstream& in) {
  in >> g_id;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) return err("no device");
  g_ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (g_ctx == nullptr) return err("ibv_open_device");
  g_pd = ibv_alloc_pd(g_ctx);
  g_cq = ibv_create_cq(g_ctx, 4096, nullptr, nullptr, 0);
  if (g_pd == nullptr || g_cq == nullptr) return err("pd/cq");
  ibv_gid gid;
  if (ibv_query_gid(g_ctx, 1, 0, &gid) != 0) return err("ibv_query_gid");
  return "ok " + gid_hex(gid) + " " + std::to_string(getpid());
}

std::string cmd_mr(std::istringstream& in) {
  std::string name;
  size_t size = 0;
  uint32_t seed = 0;
  in >> name >> size >> seed;
  Mr& m = g_mrs[name];
  m.buf.resize(size);
  for (size_t i = 0; i < size; ++i) m.buf[i] = pattern(seed, static_cast<uint32_t>(i));
  m.mr = ibv_reg_mr(g_pd, m.buf.data(), size,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (m.mr == nullptr) return err("ibv_reg_mr");
  return "ok " + std::to_string(reinterpret_cast<uintptr_t>(m.buf.data())) + " " +
         std::to_string(m.mr->rkey);
}

std::string cmd_qp(std::istringstream& in) {
  std::string name;
  in >> name;
  ibv_qp_init_attr a{};
  a.send_cq = g_cq;
  a.recv_cq = g_cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = kSendDepth;
  a.cap.max_recv_wr = kRecvDepth * 2;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  Qp& q = g_qps[name];
  q.qp = ibv_create_qp(g_pd, &a);
  if (q.qp == nullptr) return err("ibv_create_qp");
  q.psn = g_rng() & 0xffffff;
  return "ok " + std::to_string(q.qp->qp_num) + " " + std::to_string(q.psn);
}

std::string cmd_connect(std::istringstream& in) {
  std::string name, gs;
  uint32_t rqpn = 0, rpsn = 0, timeout = 14, retry = 7;
  in >> name >> rqpn >> rpsn >> gs;
  Qp& q = g_qps[name];
  in >> q.peer >> q.raddr >> q.rkey >> timeout >> retry;
  ibv_gid gid{};
  if (q.qp == nullptr || !parse_gid(gs, &gid)) return "err bad connect";
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return err("INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = rqpn;
  a.rq_psn = rpsn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return err("RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(timeout);
  a.retry_cnt = static_cast<uint8_t>(retry);
  a.rnr_retry = 7;
  a.sq_psn = q.psn;
  a.max_rd_atomic = 4;
  if (ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    return err("RTS");
  return "ok";
}

// wr_id: qp index << 32 | kind << 24 | slot/round.
enum Kind : uint64_t { kRecv = 1, kWrite = 2, kSend = 3 };
uint64_t wrid(size_t qi, uint64_t kind, uint32_t n) { return uint64_t(qi) << 32 | kind << 24 | (n & 0xffffff); }

int post_recv(Qp& q, size_t qi, uint32_t slot, uint32_t size) {
  ibv_sge s{reinterpret_cast<uintptr_t>(q.rbuf.data() + size_t(slot) * size), size, q.rmr->lkey};
  ibv_recv_wr w{};
  w.wr_id = wrid(qi, kRecv, slot);
  w.sg_list = &s;
  w.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(q.qp, &w, &bad);
}

std::string cmd_traffic(std::istringstream& in) {
  uint32_t rounds = 0, size = 0;
  in >> rounds >> size;
  std::vector<Qp*> qs;
  for (std::string n; in >> n;) {
    auto it = g_qps.find(n);
    if (it == g_qps.end()) return "err no qp " + n;
    qs.push_back(&it->second);
  }
  if (size == 0 || size > kWindow / kSlots) return "err bad size";
  struct St {
    uint32_t posted = 0, sent = 0, recvd = 0, inflight = 0;
  };
  std::vector<St> st(qs.size());
  for (size_t qi = 0; qi < qs.size(); ++qi) {
    Qp& q = *qs[qi];
    q.sbuf.assign(size_t(kSendDepth) * size, 0);
    q.rbuf.assign(size_t(kRecvDepth) * size, 0);
    q.smr = ibv_reg_mr(g_pd, q.sbuf.data(), q.sbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    q.rmr = ibv_reg_mr(g_pd, q.rbuf.data(), q.rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    if (q.smr == nullptr || q.rmr == nullptr) return err("traffic reg_mr");
    for (uint32_t s = 0; s < kRecvDepth; ++s) {
      if (post_recv(q, qi, s, size) != 0) return err("post_recv");
    }
  }
  uint64_t bad_data = 0;
  const uint64_t deadline = mono_ms() + 60000;
  for (;;) {
    bool done = true;
    for (size_t qi = 0; qi < qs.size(); ++qi) {
      Qp& q = *qs[qi];
      St& s = st[qi];
      // Each round: WRITE + SEND (2 WRs, one slot of sbuf holds the round's pattern).
      while (s.posted < rounds && s.inflight + 2 <= kSendDepth / 2) {
        uint32_t i = s.posted;
        uint8_t* p = q.sbuf.data() + size_t(i % (kSendDepth / 2)) * size;
        uint32_t seed = seed_of(g_id, q.peer, i);
        for (uint32_t k = 0; k < size; ++k) p[k] = pattern(seed, k);
        ibv_sge sg{reinterpret_cast<uintptr_t>(p), size, q.smr->lkey};
        ibv_send_wr w[2]{};
        w[0].wr_id = wrid(qi, kWrite, i);
        w[0].sg_list = &sg;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].wr.rdma.remote_addr = q.raddr + uint64_t(g_id) * kWindow + uint64_t(i % kSlots) * size;
        w[0].wr.rdma.rkey = q.rkey;
        w[0].next = &w[1];
        w[1].wr_id = wrid(qi, kSend, i);
        w[1].sg_list = &sg;
        w[1].num_sge = 1;
        w[1].opcode = IBV_WR_SEND;
        w[1].send_flags = IBV_SEND_SIGNALED;
        w[0].send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(q.qp, w, &bad) != 0) return err("post_send");
        s.inflight += 2;
        ++s.posted;
      }
      if (s.sent < rounds || s.recvd < rounds) done = false;
    }
    if (done) break;
    if (mono_ms() > deadline) return "err traffic timed out";
    ibv_wc wc[32];
    int n = ibv_poll_cq(g_cq, 32, wc);
    if (n < 0) return "err poll_cq";
    for (int j = 0; j < n; ++j) {
      const size_t qi = wc[j].wr_id >> 32;
      const uint64_t kind = (wc[j].wr_id >> 24) & 0xff;
      const uint32_t num = wc[j].wr_id & 0xffffff;
      if (qi >= qs.size()) return "err stray completion";
      if (wc[j].status != IBV_WC_SUCCESS) {
        return "err completion status " + std::to_string(wc[j].status) + " kind " + std::to_string(kind);
      }
      Qp& q = *qs[qi];
      St& s = st[qi];
      if (kind == kRecv) {
        const uint8_t* p = q.rbuf.data() + size_t(num) * size;
        uint32_t seed = seed_of(q.peer, g_id, s.recvd);
        if (wc[j].byte_len != size) ++bad_data;
        for (uint32_t k = 0; k < size; ++k) {
          if (p[k] != pattern(seed, k)) {
            ++bad_data;
            break;
          }
        }
        ++s.recvd;
        if (post_recv(q, qi, num, size) != 0) return err("post_recv");
      } else {
        --s.inflight;
        if (kind == kSend) ++s.sent;
      }
    }
  }
  uint64_t sent = 0, recvd = 0;
  for (const St& s : st) {
    sent += s.sent;
    recvd += s.recvd;
  }
  if (bad_data != 0) return "err bad data in " + std::to_string(bad_data) + " messages";
  return "ok " + std::to_string(sent) + " " + std::to_string(recvd);
}

std::string cmd_checkwin(std::istringstream& in) {
  std::string name;
  uint32_t peer = 0, rounds = 0, size = 0;
  in >> name >> peer >> rounds >> size;
  auto it = g_mrs.find(name);
  if (it == g_mrs.end() || it->second.buf.size() < size_t(peer + 1) * kWindow) return "err no mr";
  const uint8_t* w = it->second.buf.data() + size_t(peer) * kWindow;
  for (uint32_t slot = 0; slot < kSlots && slot < rounds; ++slot) {
    // The last round i < rounds with i % kSlots == slot.
    uint32_t i = (rounds - 1) - ((rounds - 1 - slot) % kSlots);
    uint32_t seed = seed_of(peer, g_id, i);
    for (uint32_t k = 0; k < size; ++k) {
      if (w[size_t(slot) * size + k] != pattern(seed, k)) {
        return "err window of " + std::to_string(peer) + " slot " + std::to_string(slot) +
               " byte " + std::to_string(k);
      }
    }
  }
  return "ok";
}

std::string cmd_hash(std::istringstream& in) {
  std::string name;
  size_t off = 0, len = 0;
  in >> name >> off >> len;
  auto it = g_mrs.find(name);
  if (it == g_mrs.end() || off + len > it->second.buf.size()) return "err no mr";
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; ++i) h = (h ^ it->second.buf[off + i]) * 1099511628211ull;
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return std::string("ok ") + b;
}

// One signaled WR on q; returns its completion status, or -1.
int wait_one(uint64_t id, int timeout_ms) {
  uint64_t end = mono_ms() + uint64_t(timeout_ms);
  while (mono_ms() < end) {
    ibv_wc wc;
    int n = ibv_poll_cq(g_cq, 1, &wc);
    if (n < 0) return -1;
    if (n == 1 && wc.wr_id == id) return wc.status;
  }
  return -1;
}

std::string cmd_rdma(std::istringstream& in) {
  std::string op, qn, mn;
  size_t off = 0;
  uint32_t len = 0, rkey = 0;
  uint64_t raddr = 0;
  in >> op >> qn >> mn >> off >> len >> raddr >> rkey;
  auto q = g_qps.find(qn);
  auto m = g_mrs.find(mn);
  if (q == g_qps.end() || m == g_mrs.end() || off + len > m->second.buf.size()) return "err args";
  ibv_sge sg{reinterpret_cast<uintptr_t>(m->second.buf.data() + off), len, m->second.mr->lkey};
  ibv_send_wr w{};
  w.wr_id = 0xabc0000000000000ull | g_rng();
  w.sg_list = &sg;
  w.num_sge = 1;
  w.opcode = op == "read" ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = raddr;
  w.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(q->second.qp, &w, &bad) != 0) return err("post_send");
  return "ok " + std::to_string(wait_one(w.wr_id, 10000));
}

std::string cmd_forge(std::istringstream& in) {
  std::string ip;
  uint32_t qpn = 0, opcode = 0, psn = 0, rkey = 0, len = 0, bad = 0;
  uint64_t va = 0;
  in >> ip >> qpn >> opcode >> psn >> va >> rkey >> len >> bad;
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(4791);
  if (inet_pton(AF_INET, ip.c_str(), &dst.sin_addr) != 1) return "err ip";
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int pmtu = IP_PMTUDISC_DO;  // DF on an unconnected socket: IPv4 ID 0, as the ICRC assumes
  (void)setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  sockaddr_in src = dst;
  src.sin_port = 0;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) return err("bind");
  socklen_t sl = sizeof src;
  getsockname(fd, reinterpret_cast<sockaddr*>(&src), &sl);
  rnic::wire::PacketFields f;
  f.opcode = static_cast<uint8_t>(opcode);
  f.dest_qp = qpn;
  f.psn = psn & 0xffffff;
  f.ack_req = true;
  f.va = va;
  f.rkey = rkey;
  f.dma_len = len;
  std::vector<uint8_t> payload(len, 0xEE);
  if (!rnic::wire::opcode_valid(f.opcode)) return "err opcode";
  const bool has_payload = (opcode & 0x1f) <= 0x0b && opcode != 0x0c;  // SEND/WRITE opcodes
  rnic::wire::IpUdpMeta meta;
  std::memcpy(meta.src, &src.sin_addr, 4);
  std::memcpy(meta.dst, &dst.sin_addr, 4);
  meta.src_port = ntohs(src.sin_port);
  meta.ip_id = 0;
  std::vector<uint8_t> pkt(4096);
  size_t n = rnic::wire::build_roce(pkt, f, has_payload ? std::span<const uint8_t>(payload)
                                                        : std::span<const uint8_t>(), meta);
  if (n == 0) {
    close(fd);
    return "err build";
  }
  if (bad != 0) pkt[n - 1] ^= 0x5a;
  ssize_t w = sendto(fd, pkt.data(), n, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst);
  close(fd);
  if (w != static_cast<ssize_t>(n)) return err("sendto");
  return "ok";
}

std::string cmd_stream(std::istringstream& in) {
  std::string qn, mn;
  uint32_t len = 0;
  in >> qn >> mn >> len;
  auto q = g_qps.find(qn);
  auto m = g_mrs.find(mn);
  if (q == g_qps.end() || m == g_mrs.end() || len > m->second.buf.size()) return "err args";
  Qp& qp = q->second;
  ibv_sge sg{reinterpret_cast<uintptr_t>(m->second.buf.data()), len, m->second.mr->lkey};
  int inflight = 0;
  bool started = false;
  for (uint64_t i = 0;; ++i) {
    while (inflight < 16) {
      ibv_send_wr w{};
      w.wr_id = i;
      w.sg_list = &sg;
      w.num_sge = 1;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.rdma.remote_addr = qp.raddr;
      w.wr.rdma.rkey = qp.rkey;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(qp.qp, &w, &bad) != 0) break;
      ++inflight;
    }
    ibv_wc wc[16];
    int n = ibv_poll_cq(g_cq, 16, wc);
    if (n < 0) return "err poll_cq";
    for (int j = 0; j < n; ++j) {
      --inflight;
      if (wc[j].status != IBV_WC_SUCCESS) {
        uint64_t t = mono_ms();
        // The rest of the SQ flushes (some already in this batch); take it so the CQ is empty
        // for the next command.
        inflight -= n - j - 1;
        uint64_t end = t + 2000;
        while (inflight > 0 && mono_ms() < end) {
          ibv_wc x;
          if (ibv_poll_cq(g_cq, 1, &x) == 1) --inflight;
        }
        return "ok " + std::to_string(wc[j].status) + " " + std::to_string(t);
      }
      if (!started) {
        started = true;
        reply("ok started");
      }
    }
  }
}

std::string cmd_outstanding(std::istringstream& in) {
  std::string qn;
  int n = 0;
  in >> qn >> n;
  auto q = g_qps.find(qn);
  if (q == g_qps.end()) return "err args";
  Mr& m = g_mrs["out"];
  m.buf.assign(4096, 0);
  m.mr = ibv_reg_mr(g_pd, m.buf.data(), m.buf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (m.mr == nullptr) return err("reg_mr");
  ibv_sge sg{reinterpret_cast<uintptr_t>(m.buf.data()), 64, m.mr->lkey};
  for (int i = 0; i < n; ++i) {
    ibv_recv_wr r{};
    r.wr_id = 0x100000 + i;
    r.sg_list = &sg;
    r.num_sge = 1;
    ibv_recv_wr* br = nullptr;
    if (ibv_post_recv(q->second.qp, &r, &br) != 0) return err("post_recv");
    ibv_send_wr w{};
    w.wr_id = 0x200000 + i;
    w.sg_list = &sg;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bs = nullptr;
    if (ibv_post_send(q->second.qp, &w, &bs) != 0) return err("post_send");
    g_outstanding += 2;
  }
  return "ok";
}

std::string cmd_waitfatal(std::istringstream& in) {
  int ms = 0;
  in >> ms;
  pollfd p{g_ctx->async_fd, POLLIN, 0};
  int event = -1;
  uint64_t end = mono_ms() + uint64_t(ms);
  while (event != IBV_EVENT_DEVICE_FATAL && mono_ms() < end) {
    if (poll(&p, 1, 100) != 1) continue;
    ibv_async_event ev;
    if (ibv_get_async_event(g_ctx, &ev) != 0) continue;
    // QP events (LAST_WQE, FATAL) may come first.
    if (event != IBV_EVENT_DEVICE_FATAL) event = ev.event_type;
    ibv_ack_async_event(&ev);
  }
  int flushed = 0, other = 0;
  while (flushed + other < g_outstanding && mono_ms() < end) {
    ibv_wc wc[16];
    int n = ibv_poll_cq(g_cq, 16, wc);
    if (n < 0) break;
    for (int j = 0; j < n; ++j) (wc[j].status == IBV_WC_WR_FLUSH_ERR ? flushed : other)++;
  }
  // A post after the device died: refused or flushed, never lost.
  int post_err = 0;
  if (!g_qps.empty()) {
    ibv_recv_wr r{};
    r.wr_id = 7;
    ibv_recv_wr* br = nullptr;
    post_err = ibv_post_recv(g_qps.begin()->second.qp, &r, &br);
  }
  return "ok " + std::to_string(event) + " " + std::to_string(flushed) + " " + std::to_string(other) +
         " " + std::to_string(post_err);
}

std::string cmd_destroy(std::istringstream& in) {
  std::string qn;
  in >> qn;
  auto q = g_qps.find(qn);
  if (q == g_qps.end()) return "err no qp";
  if (ibv_destroy_qp(q->second.qp) != 0) return err("destroy_qp");
  if (q->second.smr) ibv_dereg_mr(q->second.smr);
  if (q->second.rmr) ibv_dereg_mr(q->second.rmr);
  g_qps.erase(q);
  // Whatever the QP left in the CQ.
  ibv_wc wc[16];
  while (ibv_poll_cq(g_cq, 16, wc) > 0) {
  }
  return "ok";
}

void teardown() {
  for (auto& [n, q] : g_qps) {
    ibv_destroy_qp(q.qp);
    if (q.smr) ibv_dereg_mr(q.smr);
    if (q.rmr) ibv_dereg_mr(q.rmr);
  }
  g_qps.clear();
  for (auto& [n, m] : g_mrs) {
    if (m.mr) ibv_dereg_mr(m.mr);
  }
  g_mrs.clear();
  if (g_cq) ibv_destroy_cq(g_cq);
  if (g_pd) ibv_dealloc_pd(g_pd);
  if (g_ctx) ibv_close_device(g_ctx);
}

}  // namespace

int main() {
  char line[1024];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    std::istringstream in(line);
    std::string c;
    in >> c;
    if (c.empty()) continue;
    if (c == "quit") break;
    std::string r;
    try {
      if (c == "open") r = cmd_open(in);
      else if (g_ctx == nullptr) r = "err not open";
      else if (c == "mr") r = cmd_mr(in);
      else if (c == "qp") r = cmd_qp(in);
      else if (c == "connect") r = cmd_connect(in);
      else if (c == "traffic") r = cmd_traffic(in);
      else if (c == "checkwin") r = cmd_checkwin(in);
      else if (c == "hash") r = cmd_hash(in);
      else if (c == "rdma") r = cmd_rdma(in);
      else if (c == "forge") r = cmd_forge(in);
      else if (c == "stream") r = cmd_stream(in);
      else if (c == "outstanding") r = cmd_outstanding(in);
      else if (c == "waitfatal") r = cmd_waitfatal(in);
      else if (c == "destroy") r = cmd_destroy(in);
      else r = "err unknown command " + c;
    } catch (const std::exception& e) {
      r = std::string("err ") + e.what();
    }
    reply(r);
  }
  teardown();
  return 0;
}
