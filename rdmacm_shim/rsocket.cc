// rsockets (rdma/rsocket.h) over this library's own public rdma_cm and verbs calls, the way
// rdma-core's librdmacm/rsocket.c layers them (read for the protocol facts, not copied).
//
// SOCK_STREAM only (SOCK_DGRAM: EOPNOTSUPP). Each rsocket owns an rdma_cm event channel in
// async mode; its fd is the rsocket number. A connected rsocket has one CQ (send + recv) with
// its own completion channel, an RC QP, a send ring (sbuf), a receive ring (rbuf) the peer
// writes into, and a "target" buffer the peer writes its SGL / iomap updates into.
//
// Wire protocol (rsockets version 1, what a real librdmacm rsocket speaks):
// - connect / accept private data: rs_conn_data (40 bytes, below), the receive-ring half the
//   peer may write first, the address of our target SGL array (2 entries) and of the iomap
//   table after it, and the receive credits (rq_size).
// - data: RDMA WRITE WITH IMM into the peer's rbuf, imm = OP_DATA | length (big endian);
//   every received message (data or control) consumes one receive WR; data messages (and,
//   sent, iomap announcements) also one message credit.
// - credits: the receiver RDMA-WRITEs the next free rbuf half (an rs_sge) into the sender's
//   target SGL slot, imm = OP_SGL | (rseq_no + rq_size) = the sender's new credit limit; or a
//   zero-length write with that imm when no half is free yet.
// - control: zero-length WRITE WITH IMM, imm = OP_CTRL | DISCONNECT / SHUTDOWN (rsocket.c's
//   keepalive is a zero-length RDMA WRITE without immediate, which its peer never sees; we
//   send none, and accept an OP_CTRL | KEEPALIVE immediate as a no-op).
// - iomap: riomap'd memory is announced by RDMA-WRITE-ing an rs_iomap into the peer's iomap
//   table slot, imm = OP_IOMAP_SGL | index; riowrite is a plain RDMA WRITE there.
// Threads: one mutex per rsocket, held while its state changes, released while blocking.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <infiniband/ib.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "rdmacm_shim/cma.h"  // RDMACM_EXPORT; get_cm_event_on_data_path (rsockets looks at
                               // its CM channel on every rrecv / rpoll without leaving the
                               // data path)

namespace {

// ---- protocol constants (rsocket.c v1) ----
// The immediate data: the op in bits 31..29, its data (a byte count, credits, an iomap index)
// in bits 28..0. Until 2026-12-07 the ops sat one bit lower (bits 31..28 masked, data 27..0),
// which only another softrnic understood: a real librdmacm peer dropped our credits and read
// our control messages as data (Rsocket.ImmediateDataIsRsocketV1Encoded).
constexpr uint32_t kOpShift = 29;
constexpr uint32_t kOpData = 0u << kOpShift, kOpWrite = 2u << kOpShift, kOpSgl = 4u << kOpShift,
                   kOpIomapSgl = 6u << kOpShift, kOpCtrl = 7u << kOpShift;
constexpr uint32_t kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2;
inline uint32_t msg_op(uint32_t imm) { return imm & (7u << kOpShift); }
inline uint32_t msg_data(uint32_t imm) { return imm & ((1u << kOpShift) - 1); }
constexpr uint8_t kConnFlagNet = 1, kConnFlagIomap = 2;
constexpr int kSglSize = 2;
constexpr int kCtrlSlots = 4;  // send WRs kept for credit / control messages
constexpr uint32_t kMaxTransfer = 65536;
constexpr uint32_t kSndLowat = 2048;

struct WireSge {  // rs_sge: host order unless the peer's RS_CONN_FLAG_NET differs from ours
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(WireSge) == 16);
struct WireIomap {  // rs_iomap
  uint64_t offset;
  WireSge sge;
};
static_assert(sizeof(WireIomap) == 24);
struct ConnData {  // rs_conn_data, big-endian fields
  uint8_t version;
  uint8_t flags;
  uint16_t credits;
  uint8_t reserved[3];
  uint8_t target_iomap_size;
  WireSge target_sgl;
  WireSge data_buf;
};
static_assert(sizeof(ConnData) == 40);

// rsocket.c's 8-bit scale (the iomap table size in the connect data): up to 0x80 the value
// itself, above it 0x80 | value / 256. 0x80 is 128 entries (until 2026-12-07 we read it as
// 0, and rounded an RDMA_IOMAPSIZE of 128..255 down to no table at all).
uint8_t value_to_scale(uint32_t v) { return v <= 0x80 ? static_cast<uint8_t>(v) : static_cast<uint8_t>(0x80 | (v >> 8)); }
uint32_t scale_to_value(uint8_t s) { return s <= 0x80 ? s : static_cast<uint32_t>(s & 0x7F) << 8; }

// wr_id of our send WRs: kind in bits 32..39, sbuf bytes in the low 32.
enum WrKind : uint64_t { kWrData = 1, kWrCtrl = 2, kWrIomap = 3, kWrWrite = 4 };
inline uint64_t wr_id(WrKind k, uint32_t sbuf_bytes) { return (static_cast<uint64_t>(k) << 32) | sbuf_bytes; }
constexpr uint64_t kRecvWrId = 0xFFFFFFFF00000000ull;

enum class St { kInit, kBound, kListen, kConnecting, kConnected, kClosedByPeer, kError };
enum class Cs { kNone, kAddr, kRoute, kConn };  // nonblocking connect progress

struct Rs {
  std::mutex mu;
  int fd = -1;
  int domain = AF_INET;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  St st = St::kInit;
  Cs cs = Cs::kNone;
  int err = 0;  // SO_ERROR
  bool readable = false, writable = false;
  int fd_flags = 0;
  // options
  uint32_t sq_size = 384, rq_size = 384, sq_inline = 64, iomap_size = 0;
  uint32_t sbuf_size = 1 << 17, rbuf_size = 1 << 17;
  int keepalive = 0, nodelay = 0, reuseaddr = 0, keepidle = 0;
  linger lng{};
  // listen
  struct Req {
    rdma_cm_id* id;
    ConnData cd;
    bool cd_ok;
  };
  std::deque<Req> reqs;
  int backlog = 0;
  // connection resources
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool cm_gone = false;  // DISCONNECTED seen
  uint8_t* sbuf = nullptr;
  uint8_t* rbuf = nullptr;
  uint8_t* tbuf = nullptr;  // target: kSglSize WireSge then iomap_size WireIomap
  ibv_mr *smr = nullptr, *rmr = nullptr, *tmr = nullptr;
  bool swap = false;
  // send side
  uint32_t ctrl_stage = 0;
  uint32_t sqe_avail = 0, ctrl_avail = kCtrlSlots, sbuf_avail = 0, soffset = 0;
  uint16_t sseq_no = 0, sseq_comp = 0;
  // Target SGL (tbuf, written by the peer's RDMA WRITEs): target_sge is the next slot to
  // take, sgl_ready the slots whose OP_SGL completion was polled but not yet taken. The slot
  // being filled is copied out once (tcur: what is left of it; length 0: none) and kept as it
  // read (ttaken, at tslot) for the check that the peer does not write it while in use.
  int target_sge = 0;
  uint32_t sgl_ready = 0;
  int tslot = 0;
  WireSge tcur{}, ttaken{};
  WireSge remote_sgl{};  // peer's target SGL array (length = entry count)
  int remote_sge = 1;
  WireSge remote_iomap{};  // addr, key, length = entries
  // receive side
  uint16_t rseq_no = 0, rseq_comp = 0;
  std::deque<uint32_t> rmsg;  // lengths of data messages not fully read
  uint32_t roffset = 0, rbuf_avail = 0, rfree_offset = 0;
  // iomaps
  struct Iomap {
    void* buf;
    size_t len;
    off_t offset;
    ibv_mr* mr;
    int index;  // remote slot, -1: local only
    bool sent;
  };
  std::vector<Iomap> iomaps;
  std::vector<bool> slot_used;
};

std::mutex g_mu;
std::map<int, Rs*> g_socks;

Rs* lookup(int fd) {
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_socks.find(fd);
  return it == g_socks.end() ? nullptr : it->second;
}

int fail(int e) {
  errno = e;
  return -1;
}

uint64_t sw64(uint64_t v, bool s) { return s ? __builtin_bswap64(v) : v; }
uint32_t sw32(uint32_t v, bool s) { return s ? __builtin_bswap32(v) : v; }
bool host_is_net() { return htonl(1) == 1; }

WireSge* target_sgl(Rs* r) { return reinterpret_cast<WireSge*>(r->tbuf); }
WireIomap* target_iomap(Rs* r) { return reinterpret_cast<WireIomap*>(r->tbuf + sizeof(WireSge) * kSglSize); }
// After the iomap table: kCtrlSlots staging entries for SGL updates sent without inline.
WireSge* scratch(Rs* r) { return reinterpret_cast<WireSge*>(target_iomap(r) + r->iomap_size); }

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

bool nonblocking(Rs* r, int flags) { return (r->fd_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

// ---- connection resources ----
void free_res(Rs* r) {
  if (r->id != nullptr && r->id->qp != nullptr) rdma_destroy_qp(r->id);
  for (auto& m : r->iomaps)
    if (m.mr) ibv_dereg_mr(m.mr);
  r->iomaps.clear();
  for (ibv_mr** m : {&r->smr, &r->rmr, &r->tmr})
    if (*m) {
      ibv_dereg_mr(*m);
      *m = nullptr;
    }
  if (r->cq) {
    ibv_destroy_cq(r->cq);
    r->cq = nullptr;
  }
  if (r->cc) {
    ibv_destroy_comp_channel(r->cc);
    r->cc = nullptr;
  }
  if (r->pd) {
    ibv_dealloc_pd(r->pd);
    r->pd = nullptr;
  }
  free(r->sbuf);
  free(r->rbuf);
  free(r->tbuf);
  r->sbuf = r->rbuf = r->tbuf = nullptr;
}

int post_recv(Rs* r) {
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvWrId;
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  return ibv_post_recv(r->id->qp, &wr, &bad);
}

// Creates CQ, QP, buffers and MRs on r->id (address and route resolved, or a request).
int create_res(Rs* r) {
  ibv_context* ctx = r->id->verbs;
  if (ctx == nullptr) return fail(ENODEV);
  ibv_device_attr da{};
  if (ibv_query_device(ctx, &da) == 0) {
    // The receive queue holds kCtrlSlots more than the credits (control messages): keep the
    // sum within the device's limit, or the QP is refused.
    uint32_t mx = static_cast<uint32_t>(da.max_qp_wr);
    r->sq_size = std::min(r->sq_size, mx);
    if (mx > kCtrlSlots) r->rq_size = std::min(r->rq_size, mx - kCtrlSlots);
    // And the one CQ takes both queues' completions: within the device's max_cqe too.
    const uint32_t cqmx = static_cast<uint32_t>(da.max_cqe);
    if (r->sq_size + r->rq_size + kCtrlSlots > cqmx && cqmx > r->sq_size + kCtrlSlots + 2)
      r->rq_size = cqmx - r->sq_size - kCtrlSlots;
  }
  r->sq_size = std::max<uint32_t>(r->sq_size, kCtrlSlots + 2);
  r->rq_size = std::max<uint32_t>(r->rq_size, 2);
  r->sbuf_size = std::max<uint32_t>(r->sbuf_size, 2 * kSndLowat);
  r->rbuf_size = std::max<uint32_t>(r->rbuf_size, 2 * kSndLowat) & ~1u;
  r->pd = ibv_alloc_pd(ctx);
  r->cc = r->pd ? ibv_create_comp_channel(ctx) : nullptr;
  if (r->cc == nullptr) goto err;
  fcntl(r->cc->fd, F_SETFL, fcntl(r->cc->fd, F_GETFL) | O_NONBLOCK);
  r->cq = ibv_create_cq(ctx, static_cast<int>(r->sq_size + r->rq_size + kCtrlSlots), r, r->cc, 0);
  if (r->cq == nullptr) goto err;
  {
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = r->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 1;
    qa.cap.max_send_wr = r->sq_size;
    qa.cap.max_recv_wr = r->rq_size + kCtrlSlots;  // control messages also consume receives
    qa.cap.max_send_sge = 2;
    qa.cap.max_recv_sge = 1;
    qa.cap.max_inline_data = r->sq_inline;
    if (rdma_create_qp(r->id, r->pd, &qa) != 0) {
      qa.cap.max_inline_data = 0;
      r->sq_inline = 0;
      if (rdma_create_qp(r->id, r->pd, &qa) != 0) goto err;
    }
    r->sq_inline = std::min(r->sq_inline, qa.cap.max_inline_data);
  }
  {
    size_t tlen = sizeof(WireSge) * kSglSize + sizeof(WireIomap) * r->iomap_size + sizeof(WireSge) * kCtrlSlots;
    r->sbuf = static_cast<uint8_t*>(calloc(1, r->sbuf_size));
    r->rbuf = static_cast<uint8_t*>(calloc(1, r->rbuf_size));
    r->tbuf = static_cast<uint8_t*>(calloc(1, tlen));
    if (!r->sbuf || !r->rbuf || !r->tbuf) {
      errno = ENOMEM;
      goto err;
    }
    r->smr = ibv_reg_mr(r->pd, r->sbuf, r->sbuf_size, 0);
    r->rmr = ibv_reg_mr(r->pd, r->rbuf, r->rbuf_size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    r->tmr = ibv_reg_mr(r->pd, r->tbuf, tlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!r->smr || !r->rmr || !r->tmr) goto err;
  }
  for (uint32_t i = 0; i < r->rq_size + kCtrlSlots; ++i)
    if (post_recv(r) != 0) goto err;
  r->sqe_avail = r->sq_size - kCtrlSlots;
  r->ctrl_avail = kCtrlSlots;
  r->sbuf_avail = r->sbuf_size;
  r->soffset = 0;
  r->rbuf_avail = r->rbuf_size >> 1;
  r->rfree_offset = r->rbuf_size >> 1;
  r->roffset = 0;
  r->rseq_comp = static_cast<uint16_t>(r->rq_size >> 1);
  return 0;
err: {
  int e = errno ? errno : ENOMEM;
  free_res(r);
  return fail(e);
}
}

void format_conn(Rs* r, ConnData* c) {
  std::memset(c, 0, sizeof *c);
  c->version = 1;
  c->flags = kConnFlagIomap | (host_is_net() ? kConnFlagNet : 0);
  c->credits = htons(static_cast<uint16_t>(r->rq_size));
  c->target_iomap_size = value_to_scale(r->iomap_size);
  c->target_sgl.addr = htobe64(reinterpret_cast<uintptr_t>(r->tbuf));
  c->target_sgl.length = htobe32(kSglSize);
  c->target_sgl.key = htobe32(r->tmr->rkey);
  c->data_buf.addr = htobe64(reinterpret_cast<uintptr_t>(r->rbuf));
  c->data_buf.length = htobe32(r->rbuf_size >> 1);
  c->data_buf.key = htobe32(r->rmr->rkey);
}

void save_conn(Rs* r, const ConnData* c) {
  r->remote_sgl.addr = be64toh(c->target_sgl.addr);
  r->remote_sgl.length = be32toh(c->target_sgl.length);
  r->remote_sgl.key = be32toh(c->target_sgl.key);
  r->remote_sge = 1;
  bool peer_net = (c->flags & kConnFlagNet) != 0;
  r->swap = peer_net != host_is_net();
  if (c->flags & kConnFlagIomap) {
    r->remote_iomap.addr = r->remote_sgl.addr + sizeof(WireSge) * r->remote_sgl.length;
    r->remote_iomap.length = scale_to_value(c->target_iomap_size);
    r->remote_iomap.key = r->remote_sgl.key;
  }
  r->slot_used.assign(r->remote_iomap.length, false);
  target_sgl(r)[0].addr = be64toh(c->data_buf.addr);
  target_sgl(r)[0].length = be32toh(c->data_buf.length);
  target_sgl(r)[0].key = be32toh(c->data_buf.key);
  r->target_sge = 0;
  // Slot 0, filled just above. Added, not set: a nonblocking rconnect's rpoll may have polled
  // the peer's first update (slot 1) before the ESTABLISHED event.
  r->sgl_ready++;
  r->tcur = {};
  r->sseq_no = 0;
  r->sseq_comp = be16toh(c->credits);
}

void set_connected(Rs* r) {
  r->st = St::kConnected;
  r->cs = Cs::kNone;
  r->readable = r->writable = true;
}

// ---- posting ----
int post_write(Rs* r, ibv_sge* sge, int nsge, uint64_t id, bool imm, uint32_t immv, int flags, uint64_t addr,
               uint32_t rkey) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.sg_list = nsge ? sge : nullptr;
  wr.num_sge = nsge;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = static_cast<unsigned>(flags);
  wr.imm_data = htobe32(immv);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  int e = ibv_post_send(r->id->qp, &wr, &bad);
  return e ? fail(e) : 0;
}

void mark_dead(Rs* r, int e) {
  if (r->st == St::kConnected) {
    r->st = e ? St::kError : St::kClosedByPeer;
    if (e) r->err = e;
  }
  r->writable = false;
  r->readable = false;
}

// A post that failed put nothing on the send queue, so no completion will return what it
// took: the caller gives it back here (the slot) or at its call site (its own counters).
int post_ctrl(Rs* r, uint32_t immv) {
  r->ctrl_avail--;
  if (post_write(r, nullptr, 0, wr_id(kWrCtrl, 0), true, immv, 0, 0, 0) == 0) return 0;
  r->ctrl_avail++;
  return -1;
}

// Credits back to the sender (rs_send_credits).
// A post that fails leaves the socket in error (rdma-core ignores the failure and counts the
// credit as given; the peer then waits for it forever) with everything it took given back:
// the control slot, the staging entry, rseq_comp and the rbuf half.
void send_credits(Rs* r) {
  const uint16_t comp = r->rseq_comp;
  r->rseq_comp = static_cast<uint16_t>(r->rseq_no + (r->rq_size >> 1));
  uint32_t immv = kOpSgl | static_cast<uint16_t>(r->rseq_no + r->rq_size);
  if (r->rbuf_avail >= (r->rbuf_size >> 1)) {
    WireSge s;
    s.addr = sw64(reinterpret_cast<uintptr_t>(r->rbuf + r->rfree_offset), r->swap);
    s.key = sw32(r->rmr->rkey, r->swap);
    s.length = sw32(r->rbuf_size >> 1, r->swap);
    ibv_sge sge{reinterpret_cast<uintptr_t>(&s), sizeof s, 0};
    int fl = IBV_SEND_INLINE;
    if (r->sq_inline < sizeof s) {  // no inline room: stage it in the target buffer's scratch
      fl = 0;
      WireSge* slot = scratch(r) + (r->ctrl_stage % kCtrlSlots);  // <= kCtrlSlots in flight, FIFO
      std::memcpy(slot, &s, sizeof s);
      sge.addr = reinterpret_cast<uintptr_t>(slot);
      sge.lkey = r->tmr->lkey;
    }
    r->ctrl_avail--;
    if (post_write(r, &sge, 1, wr_id(kWrCtrl, 0), true, immv, fl,
                   r->remote_sgl.addr + static_cast<uint64_t>(r->remote_sge) * sizeof(WireSge),
                   r->remote_sgl.key) != 0) {
      r->ctrl_avail++;
      r->rseq_comp = comp;
      mark_dead(r, ECONNRESET);
      return;
    }
    if (fl == 0) r->ctrl_stage++;
    r->rbuf_avail -= r->rbuf_size >> 1;
    r->rfree_offset += r->rbuf_size >> 1;
    if (r->rfree_offset >= r->rbuf_size) r->rfree_offset = 0;
    if (++r->remote_sge == static_cast<int>(r->remote_sgl.length)) r->remote_sge = 0;
  } else if (post_ctrl(r, immv) != 0) {
    r->rseq_comp = comp;
    mark_dead(r, ECONNRESET);
  }
}

bool give_credits(Rs* r) {
  return (r->rbuf_avail >= (r->rbuf_size >> 1) || static_cast<int16_t>(r->rseq_no - r->rseq_comp) >= 0) &&
         r->ctrl_avail > 0 && r->st == St::kConnected;
}

// The peer broke the target SGL protocol (or one of its credits landed twice): data sent on
// would land where the peer does not expect it, so the connection fails (EPROTO) instead,
// with one line on stderr (base/log.h's form; this library has no logger of its own).
void sgl_violation(Rs* r, const char* what) {
  char line[160];
  int n = std::snprintf(line, sizeof line, "softrnic[%d] error: rsocket %d: %s\n", static_cast<int>(getpid()), r->fd,
                        what);
  if (n > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(static_cast<size_t>(n), sizeof line - 1));
  mark_dead(r, EPROTO);
}

// Polls the CQ until empty (and gives credits); never blocks. Returns the completions it
// took. REQUIRES r->mu.
int progress(Rs* r);

void handle_cm_events(Rs* r) {
  rdma_cm_event* ev = nullptr;
  while (rnic::rdmacm::get_cm_event_on_data_path(r->ch, &ev) == 0) {
    rdma_cm_event e = *ev;
    ConnData cd{};
    bool cd_ok = false;
    if (e.param.conn.private_data != nullptr && e.param.conn.private_data_len >= sizeof(ConnData)) {
      std::memcpy(&cd, e.param.conn.private_data, sizeof cd);
      cd_ok = cd.version == 1;
    }
    rdma_ack_cm_event(ev);
    switch (e.event) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        if (e.listen_id == r->id && r->st == St::kListen &&
            static_cast<int>(r->reqs.size()) < std::max(r->backlog, 1) + 8) {
          r->reqs.push_back({e.id, cd, cd_ok});
        } else {
          rdma_reject(e.id, nullptr, 0);
          rdma_destroy_id(e.id);
        }
        break;
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (r->cs == Cs::kAddr) {
          if (rdma_resolve_route(r->id, 2000) == 0) {
            r->cs = Cs::kRoute;
          } else {
            r->st = St::kError;
            r->err = errno;
            r->cs = Cs::kNone;
          }
        }
        break;
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (r->cs == Cs::kRoute) {
          ConnData c;
          rdma_conn_param p{};
          if (create_res(r) != 0) {
            r->st = St::kError;
            r->err = errno;
            r->cs = Cs::kNone;
            break;
          }
          format_conn(r, &c);
          p.private_data = &c;
          p.private_data_len = sizeof c;
          p.responder_resources = 1;
          p.initiator_depth = 1;
          p.retry_count = 7;
          p.rnr_retry_count = 7;
          if (rdma_connect(r->id, &p) == 0) {
            r->cs = Cs::kConn;
          } else {
            r->st = St::kError;
            r->err = errno;
            r->cs = Cs::kNone;
          }
        }
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        if (r->cs == Cs::kConn) {
          if (!cd_ok) {
            r->st = St::kError;
            r->err = EOPNOTSUPP;
            r->cs = Cs::kNone;
            rdma_disconnect(r->id);
          } else {
            save_conn(r, &cd);
            set_connected(r);
          }
        }
        break;
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        if (r->st == St::kConnecting) {
          r->st = St::kError;
          r->cs = Cs::kNone;
          r->err = e.event == RDMA_CM_EVENT_REJECTED      ? ECONNREFUSED
                   : e.event == RDMA_CM_EVENT_UNREACHABLE ? ETIMEDOUT
                   : e.event == RDMA_CM_EVENT_ADDR_ERROR  ? EHOSTUNREACH
                                                          : ECONNRESET;
        }
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        r->cm_gone = true;
        if (r->st == St::kConnected) {
          progress(r);  // take what the peer wrote before it left
          r->st = St::kClosedByPeer;
          r->writable = false;
          r->readable = false;
        }
        break;
      default:
        break;
    }
  }
}

int progress(Rs* r) {
  int taken = 0;
  if (r->cq != nullptr) {
    ibv_wc wc[32];
    int n;
    while ((n = ibv_poll_cq(r->cq, 32, wc)) > 0) {
      taken += n;
      for (int i = 0; i < n; ++i) {
        const ibv_wc& w = wc[i];
        if (w.wr_id == kRecvWrId) {
          if (w.status != IBV_WC_SUCCESS) {
            if (r->st == St::kConnected) mark_dead(r, w.status == IBV_WC_WR_FLUSH_ERR ? 0 : ECONNRESET);
            continue;
          }
          uint32_t imm = be32toh(w.imm_data);
          if (r->st == St::kConnected || r->st == St::kClosedByPeer) post_recv(r);
          switch (msg_op(imm)) {
            case kOpSgl:
              r->sseq_comp = static_cast<uint16_t>(msg_data(imm));
              // 16 bytes: it also wrote our next target slot (0: a message credit only). The
              // peer has at most kSglSize halves out; one more means it wrote a slot we have
              // not finished.
              if (w.byte_len == sizeof(WireSge)) {
                if (r->sgl_ready + (r->tcur.length != 0 ? 1u : 0u) < static_cast<uint32_t>(kSglSize))
                  r->sgl_ready++;
                else
                  sgl_violation(r, "a target SGL update with every slot still in use");
              }
              break;
            case kOpIomapSgl:
            case kOpWrite:
              break;
            case kOpCtrl:
              if (msg_data(imm) == kCtrlDisconnect) {
                if (r->st == St::kConnected) r->st = St::kClosedByPeer;
                r->readable = r->writable = false;
              } else if (msg_data(imm) == kCtrlShutdown) {
                if (r->writable) {
                  r->readable = false;
                } else {
                  if (r->st == St::kConnected) r->st = St::kClosedByPeer;
                  r->readable = false;
                }
              }
              break;
            case kOpData:
              // Message credits count data messages only, as rsocket.c's rseq_no: counting the
              // peer's credit and control messages too (until 2026-12-07) granted a message
              // credit for each of them, a surplus that grew for the connection's life and let
              // a peer run past our posted receives (RNR NAKs).
              r->rseq_no++;
              if (msg_data(imm) > 0) r->rmsg.push_back(msg_data(imm));
              break;
            default:
              break;  // reserved ops: dropped
          }
        } else {
          WrKind k = static_cast<WrKind>(w.wr_id >> 32);
          uint32_t bytes = static_cast<uint32_t>(w.wr_id);
          if (k == kWrCtrl) {
            r->ctrl_avail++;
          } else {
            r->sqe_avail++;
            r->sbuf_avail += bytes;
          }
          if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR && r->st == St::kConnected)
            mark_dead(r, ECONNRESET);
        }
      }
    }
    while (r->st == St::kConnected && give_credits(r)) send_credits(r);
  }
  return taken;
}

// Waits (r->mu released) until the CQ or the CM channel has something, or timeout_ms
// (-1: forever). Returns 0, or -1 with errno.
int wait_any(Rs* r, std::unique_lock<std::mutex>& lk, int timeout_ms) {
  pollfd p[2];
  int n = 0;
  p[n++] = {r->fd, POLLIN, 0};
  if (r->cq) {
    ibv_req_notify_cq(r->cq, 0);
    // A completion that came between the caller's check and the arm raises no event: the
    // caller must look again before sleeping.
    if (progress(r) > 0) return 0;
    p[n++] = {r->cc->fd, POLLIN, 0};
  }
  lk.unlock();
  int rc = poll(p, static_cast<nfds_t>(n), timeout_ms);
  lk.lock();
  if (r->cc) {
    ibv_cq* cq;
    void* ctx;
    int got = 0;
    while (ibv_get_cq_event(r->cc, &cq, &ctx) == 0) ++got;
    if (got) ibv_ack_cq_events(r->cq, static_cast<unsigned>(got));
  }
  if (rc < 0) return -1;
  return 0;
}

// Runs `ready` after progress until it holds; nonblocking: EAGAIN.
template <class F>
int wait_for(Rs* r, std::unique_lock<std::mutex>& lk, bool nb, F ready) {
  for (;;) {
    handle_cm_events(r);
    progress(r);
    if (ready()) return 0;
    if (nb) return fail(EAGAIN);
    if (wait_any(r, lk, -1) != 0 && errno != EINTR) return -1;
  }
}

bool can_send(Rs* r) {
  return r->sqe_avail > 0 && r->sbuf_avail >= kSndLowat && r->sseq_no != r->sseq_comp &&
         (r->tcur.length != 0 || r->sgl_ready != 0);
}

// Makes r->tcur the target slot to write to; false when there is none (the socket is in
// error if the peer broke the protocol). A slot is read once, after the completion of the
// WRITE that filled it was polled: that completion orders the device's write before our
// read (a non-zero length seen earlier proves nothing about the address beside it). While
// in use it must read as when taken: the peer writes it again only once we have filled the
// half it named. A change there is a credit applied twice, the way data would land at the
// start of a half again.
bool take_target(Rs* r) {
  if (r->tcur.length != 0) {
    if (std::memcmp(&target_sgl(r)[r->tslot], &r->ttaken, sizeof(WireSge)) == 0) return true;
    sgl_violation(r, "target SGL slot rewritten while in use");
    return false;
  }
  if (r->sgl_ready == 0) return false;
  r->tslot = r->target_sge;
  std::memcpy(&r->ttaken, &target_sgl(r)[r->tslot], sizeof(WireSge));
  r->tcur = r->ttaken;
  r->sgl_ready--;
  if (++r->target_sge == kSglSize) r->target_sge = 0;
  if (r->tcur.length != 0) return true;
  sgl_violation(r, "zero-length target SGL slot");
  return false;
}

bool have_rdata(Rs* r) { return !r->rmsg.empty(); }

Rs* new_rs() {
  Rs* r = new (std::nothrow) Rs;
  if (r == nullptr) return nullptr;
  r->ch = rdma_create_event_channel();
  if (r->ch == nullptr) {
    delete r;
    return nullptr;
  }
  r->fd = r->ch->fd;
  fcntl(r->fd, F_SETFL, fcntl(r->fd, F_GETFL) | O_NONBLOCK);
  return r;
}

void register_rs(Rs* r) {
  std::lock_guard<std::mutex> l(g_mu);
  g_socks[r->fd] = r;
}

int send_iomaps(Rs* r, std::unique_lock<std::mutex>& lk, bool nb);

// Sends bytes from user memory (rsend core). Returns bytes or -1.
ssize_t do_send(Rs* r, std::unique_lock<std::mutex>& lk, const struct iovec* iov, int iovcnt, int flags) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  if (r->st == St::kConnecting) {
    handle_cm_events(r);
    if (r->st == St::kConnecting) return fail(EAGAIN);
  }
  if (r->st == St::kInit || r->st == St::kBound || r->st == St::kListen) return fail(ENOTCONN);
  if (r->st != St::kConnected || !r->writable) return fail(r->st == St::kError && r->err ? r->err : ECONNRESET);
  if (total == 0) return 0;
  bool nb = nonblocking(r, flags);
  if (send_iomaps(r, lk, nb) != 0 && errno != EAGAIN) return -1;
  size_t sent = 0;
  int vi = 0;
  size_t voff = 0;
  while (sent < total) {
    if (!can_send(r)) {
      int rc = wait_for(r, lk, nb, [&] { return can_send(r) || r->st != St::kConnected || !r->writable; });
      if (rc != 0 || r->st != St::kConnected || !r->writable) {
        if (sent) break;
        if (rc != 0) return -1;
        return fail(r->err ? r->err : ECONNRESET);
      }
    }
    if (!take_target(r)) {  // can_send held: only a protocol violation gets here
      if (sent) break;
      return fail(r->err ? r->err : EPROTO);
    }
    WireSge& t = r->tcur;
    uint32_t x = static_cast<uint32_t>(std::min<size_t>(total - sent, kMaxTransfer));
    x = std::min({x, r->sbuf_avail, t.length});
    bool inl = x <= r->sq_inline;
    uint32_t used = 0;
    ibv_sge sge[2];
    int nsge = 0;
    if (inl && iovcnt == 1) {
      sge[0] = {reinterpret_cast<uintptr_t>(static_cast<const uint8_t*>(iov[0].iov_base) + voff), x, 0};
      nsge = 1;
      voff += x;
    } else {
      if (r->soffset == r->sbuf_size) r->soffset = 0;
      // Inline data from several iovecs is staged here too: it must fit before the end.
      x = std::min(x, r->sbuf_size - r->soffset);
      // copy from the iovecs into sbuf (inline: a stack copy is not needed; the sbuf copy
      // is used by the device at post time too)
      uint8_t* dst = r->sbuf + r->soffset;
      uint32_t c = 0;
      while (c < x) {
        size_t n = std::min<size_t>(x - c, iov[vi].iov_len - voff);
        std::memcpy(dst + c, static_cast<const uint8_t*>(iov[vi].iov_base) + voff, n);
        c += static_cast<uint32_t>(n);
        voff += n;
        if (voff == iov[vi].iov_len) {
          ++vi;
          voff = 0;
        }
      }
      if (inl) {
        sge[0] = {reinterpret_cast<uintptr_t>(dst), x, r->smr->lkey};
        // inline data is copied at post time: nothing of sbuf stays in use
      } else {
        sge[0] = {reinterpret_cast<uintptr_t>(dst), x, r->smr->lkey};
        used = x;
        r->soffset += x;
      }
      nsge = 1;
    }
    if (iovcnt == 1 && inl) {
      // voff was advanced above
    }
    uint64_t addr = t.addr;
    uint32_t key = t.key;
    t.addr += x;
    t.length -= x;
    r->sseq_no++;
    r->sqe_avail--;
    r->sbuf_avail -= used;
    if (post_write(r, sge, nsge, wr_id(kWrData, used), true, kOpData | x, inl ? IBV_SEND_INLINE : 0, addr, key) != 0) {
      // Not posted: give back what this piece took (no completion will).
      t.addr -= x;
      t.length += x;
      r->sseq_no--;
      r->sqe_avail++;
      r->sbuf_avail += used;
      r->soffset -= used;
      mark_dead(r, ECONNRESET);
      if (sent) break;
      return -1;
    }
    sent += x;
  }
  return static_cast<ssize_t>(sent);
}

ssize_t do_recv(Rs* r, std::unique_lock<std::mutex>& lk, const struct iovec* iov, int iovcnt, int flags) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  if (r->st == St::kConnecting) {
    handle_cm_events(r);
    if (r->st == St::kConnecting) return fail(EAGAIN);
  }
  if (r->st == St::kInit || r->st == St::kBound || r->st == St::kListen) return fail(ENOTCONN);
  bool nb = nonblocking(r, flags);
  bool waitall = (flags & MSG_WAITALL) && !(flags & MSG_PEEK);
  size_t got = 0;
  int vi = 0;
  size_t voff = 0;
  for (;;) {
    handle_cm_events(r);
    progress(r);
    if (!have_rdata(r)) {
      if (got && !waitall) break;
      if (!r->readable || r->st != St::kConnected) {
        if (got) break;
        if (r->st == St::kError && r->err) return fail(r->err);
        return 0;  // EOF
      }
      if (got == total && total) break;
      if (nb) {
        if (got) break;
        return fail(EAGAIN);
      }
      if (wait_any(r, lk, -1) != 0 && errno != EINTR) return got ? static_cast<ssize_t>(got) : -1;
      continue;
    }
    if (total == 0) return 0;
    if (flags & MSG_PEEK) {
      uint32_t off = r->roffset;
      for (uint32_t m : r->rmsg) {
        uint32_t left = m;
        while (left && got < total) {
          size_t n = std::min<size_t>({left, iov[vi].iov_len - voff, r->rbuf_size - off});
          std::memcpy(static_cast<uint8_t*>(iov[vi].iov_base) + voff, r->rbuf + off, n);
          got += n;
          voff += n;
          left -= static_cast<uint32_t>(n);
          off += static_cast<uint32_t>(n);
          if (off == r->rbuf_size) off = 0;
          if (voff == iov[vi].iov_len) {
            ++vi;
            voff = 0;
          }
        }
        if (got == total) break;
      }
      return static_cast<ssize_t>(got);
    }
    while (!r->rmsg.empty() && got < total) {
      uint32_t& m = r->rmsg.front();
      size_t n = std::min<size_t>({m, iov[vi].iov_len - voff, r->rbuf_size - r->roffset});
      std::memcpy(static_cast<uint8_t*>(iov[vi].iov_base) + voff, r->rbuf + r->roffset, n);
      got += n;
      voff += n;
      m -= static_cast<uint32_t>(n);
      r->roffset += static_cast<uint32_t>(n);
      if (r->roffset == r->rbuf_size) r->roffset = 0;
      r->rbuf_avail += static_cast<uint32_t>(n);
      if (m == 0) r->rmsg.pop_front();
      if (voff == iov[vi].iov_len) {
        ++vi;
        voff = 0;
      }
    }
    while (r->st == St::kConnected && give_credits(r)) send_credits(r);
    if (got == total || !waitall) break;
  }
  return static_cast<ssize_t>(got);
}

// ---- iomap ----
int send_iomaps(Rs* r, std::unique_lock<std::mutex>& lk, bool nb) {
  for (auto& m : r->iomaps) {
    if (m.sent || m.index < 0) continue;
    if (!can_send(r)) {
      int rc = wait_for(r, lk, nb, [&] { return can_send(r) || r->st != St::kConnected; });
      if (rc != 0) return -1;
      if (r->st != St::kConnected) return fail(ECONNRESET);
    }
    WireIomap im;
    im.offset = sw64(static_cast<uint64_t>(m.offset), r->swap);
    im.sge.addr = sw64(reinterpret_cast<uintptr_t>(m.mr->addr), r->swap);
    im.sge.length = sw32(static_cast<uint32_t>(m.mr->length), r->swap);
    im.sge.key = sw32(m.mr->rkey, r->swap);
    // Too little room before the end: the tail is skipped, and counted as used by this write
    // until its completion returns it. Not counted, sbuf_avail would promise those bytes again
    // at the front, where data still being sent lies (can_send leaves kSndLowat for both).
    uint32_t skip = 0;
    if (r->soffset + sizeof im > r->sbuf_size) {
      skip = r->sbuf_size - r->soffset;
      r->soffset = 0;
    }
    uint8_t* dst = r->sbuf + r->soffset;
    std::memcpy(dst, &im, sizeof im);
    ibv_sge sge{reinterpret_cast<uintptr_t>(dst), sizeof im, r->smr->lkey};
    r->soffset += sizeof im;
    r->sseq_no++;
    r->sqe_avail--;
    const uint32_t used = skip + static_cast<uint32_t>(sizeof im);
    r->sbuf_avail -= used;
    if (post_write(r, &sge, 1, wr_id(kWrIomap, used), true, kOpIomapSgl | static_cast<uint32_t>(m.index), 0,
                   r->remote_iomap.addr + static_cast<uint64_t>(m.index) * sizeof(WireIomap), r->remote_iomap.key) != 0)
      return -1;
    m.sent = true;
  }
  return 0;
}

const WireIomap* find_iomap(Rs* r, uint64_t offset, WireIomap* out) {
  for (uint32_t i = 0; i < r->iomap_size; ++i) {
    WireIomap m;
    // The peer writes its entries in our byte order (it swaps, as send_iomaps does for it):
    // read as they are, as the target SGL slots (take_target).
    std::memcpy(&m, &target_iomap(r)[i], sizeof m);
    if (m.sge.length && offset >= m.offset && offset < m.offset + m.sge.length) {
      *out = m;
      return out;
    }
  }
  return nullptr;
}

template <class F>
auto with_rs(int fd, F f) -> decltype(f(static_cast<Rs*>(nullptr), std::declval<std::unique_lock<std::mutex>&>())) {
  Rs* r = lookup(fd);
  if (r == nullptr) {
    errno = EBADF;
    return -1;
  }
  std::unique_lock<std::mutex> lk(r->mu);
  try {
    return f(r, lk);
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
}

short poll_rs(Rs* r, short events) {
  handle_cm_events(r);
  progress(r);
  short rev = 0;
  switch (r->st) {
    case St::kListen:
      if (!r->reqs.empty()) rev |= POLLIN;
      break;
    case St::kConnecting:
      break;
    case St::kConnected:
    case St::kClosedByPeer:
      if (have_rdata(r) || !r->readable) rev |= POLLIN;
      if (r->st == St::kConnected && r->writable && can_send(r)) rev |= POLLOUT;
      // POLLHUP once the data that came before the peer's disconnect is read (rstream -T a
      // stops at the first POLLHUP; the peer's DISCONNECT often lands with its last data).
      if (r->st == St::kClosedByPeer && !have_rdata(r)) rev |= POLLHUP;
      break;
    case St::kError:
      rev |= POLLERR | POLLHUP;
      if (r->cq) rev |= POLLIN;
      break;
    default:
      break;
  }
  return static_cast<short>(rev & (events | POLLERR | POLLHUP | POLLNVAL));
}

}  // namespace

RDMACM_EXPORT int rsocket(int domain, int type, int protocol) {
  if (domain != AF_INET && domain != AF_INET6 && domain != AF_IB) return fail(EAFNOSUPPORT);
  int t = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (t == SOCK_DGRAM) return fail(EOPNOTSUPP);  // UDP rsockets are not built
  if (t != SOCK_STREAM) return fail(EPROTOTYPE);
  if (protocol != 0 && protocol != IPPROTO_TCP) return fail(EPROTONOSUPPORT);
  Rs* r = new_rs();
  if (r == nullptr) return -1;
  if (rdma_create_id(r->ch, &r->id, r, RDMA_PS_TCP) != 0) {
    int e = errno;
    rdma_destroy_event_channel(r->ch);
    delete r;
    return fail(e);
  }
  r->domain = domain;
  if (type & SOCK_NONBLOCK) r->fd_flags |= O_NONBLOCK;
  register_rs(r);
  return r->fd;
}

RDMACM_EXPORT int rbind(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    if (addr == nullptr || addrlen < sizeof(sa_family_t)) return fail(EINVAL);
    if (r->st != St::kInit) return fail(EINVAL);
    if (rdma_bind_addr(r->id, const_cast<sockaddr*>(addr)) != 0) return -1;
    r->st = St::kBound;
    return 0;
  });
}

RDMACM_EXPORT int rlisten(int socket, int backlog) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    if (r->st == St::kListen) {
      r->backlog = backlog;
      return 0;
    }
    if (r->st != St::kBound && r->st != St::kInit) return fail(EINVAL);
    if (rdma_listen(r->id, backlog) != 0) return -1;
    r->backlog = backlog;
    r->st = St::kListen;
    return 0;
  });
}

RDMACM_EXPORT int raccept(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  Rs* lr = lookup(socket);
  if (lr == nullptr) return fail(EBADF);
  std::unique_lock<std::mutex> lk(lr->mu);
  if (lr->st != St::kListen) return fail(EINVAL);
  if (wait_for(lr, lk, nonblocking(lr, 0), [&] { return !lr->reqs.empty(); }) != 0) return -1;
  Rs::Req q = lr->reqs.front();
  lr->reqs.pop_front();
  Rs* r = new_rs();
  if (r == nullptr) {
    rdma_reject(q.id, nullptr, 0);
    rdma_destroy_id(q.id);
    return fail(ENOMEM);
  }
  r->domain = lr->domain;
  r->sq_size = lr->sq_size;
  r->rq_size = lr->rq_size;
  r->sq_inline = lr->sq_inline;
  r->iomap_size = lr->iomap_size;
  r->sbuf_size = lr->sbuf_size;
  r->rbuf_size = lr->rbuf_size;
  r->keepalive = lr->keepalive;
  r->nodelay = lr->nodelay;
  r->fd_flags = lr->fd_flags;
  lk.unlock();
  int e = 0;
  if (!q.cd_ok) {
    e = EOPNOTSUPP;
  } else if (rdma_migrate_id(q.id, r->ch) != 0) {
    e = errno;
  }
  if (e) {
    rdma_reject(q.id, nullptr, 0);
    rdma_destroy_id(q.id);
    rdma_destroy_event_channel(r->ch);
    delete r;
    return fail(e);
  }
  r->id = q.id;
  r->id->context = r;
  if (create_res(r) != 0) {
    e = errno;
    rdma_reject(r->id, nullptr, 0);
    rdma_destroy_id(r->id);
    rdma_destroy_event_channel(r->ch);
    delete r;
    return fail(e);
  }
  save_conn(r, &q.cd);
  ConnData c;
  format_conn(r, &c);
  rdma_conn_param p{};
  p.private_data = &c;
  p.private_data_len = sizeof c;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.rnr_retry_count = 7;
  if (rdma_accept(r->id, &p) != 0) {
    e = errno;
    free_res(r);
    rdma_destroy_id(r->id);
    rdma_destroy_event_channel(r->ch);
    delete r;
    return fail(e);
  }
  // The QP is ready to receive; the RTU follows (an ESTABLISHED event we take as it comes).
  set_connected(r);
  register_rs(r);
  if (addr && addrlen) {
    sockaddr* pa = rdma_get_peer_addr(r->id);
    socklen_t l = pa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    std::memcpy(addr, pa, std::min(*addrlen, l));
    *addrlen = l;
  }
  return r->fd;
}

RDMACM_EXPORT int rconnect(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> int {
    if (r->st == St::kConnected) return fail(EISCONN);
    if (r->st == St::kConnecting) {
      handle_cm_events(r);
      if (r->st == St::kConnecting) return fail(EALREADY);
      if (r->st == St::kConnected) return 0;
      return fail(r->err);
    }
    if (r->st == St::kListen) return fail(EINVAL);
    if (r->st != St::kInit && r->st != St::kBound) return fail(EISCONN);
    if (addr == nullptr || addrlen < sizeof(sockaddr_in)) return fail(EINVAL);
    if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return fail(EAFNOSUPPORT);
    sockaddr_storage dst{};
    std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
    r->st = St::kConnecting;
    r->err = 0;
    r->cs = Cs::kAddr;
    if (rdma_resolve_addr(r->id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) {
      int e = errno;
      r->st = St::kInit;
      r->cs = Cs::kNone;
      return fail(e);
    }
    if (r->fd_flags & O_NONBLOCK) {
      handle_cm_events(r);
      if (r->st == St::kConnected) return 0;
      if (r->st == St::kError) return fail(r->err);
      return fail(EINPROGRESS);
    }
    for (;;) {
      handle_cm_events(r);
      if (r->st != St::kConnecting) break;
      lk.unlock();
      pollfd p{r->fd, POLLIN, 0};
      poll(&p, 1, -1);
      lk.lock();
    }
    if (r->st == St::kConnected) return 0;
    int e = r->err ? r->err : ECONNREFUSED;
    return fail(e);
  });
}

namespace {
// Waits (bounded) for our posted sends to complete.
void drain_sends(Rs* r, std::unique_lock<std::mutex>& lk) {
  int64_t end = now_ms() + 2000;
  while (r->cq && (r->ctrl_avail < kCtrlSlots || r->sqe_avail < r->sq_size - kCtrlSlots) && now_ms() < end) {
    handle_cm_events(r);
    if (r->cm_gone) break;  // the peer disconnected: what is left will not complete
    progress(r);
    if (r->ctrl_avail == kCtrlSlots && r->sqe_avail == r->sq_size - kCtrlSlots) break;
    wait_any(r, lk, 50);
  }
}

int shutdown_locked(Rs* r, std::unique_lock<std::mutex>& lk, int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(EINVAL);
  if (r->st != St::kConnected && r->st != St::kClosedByPeer && r->st != St::kError) return fail(ENOTCONN);
  uint32_t ctrl;
  bool send = r->st == St::kConnected;
  if (how == SHUT_RDWR) {
    ctrl = kCtrlDisconnect;
    r->readable = r->writable = false;
  } else if (how == SHUT_WR) {
    ctrl = r->readable ? kCtrlShutdown : kCtrlDisconnect;
    if (!r->writable) send = false;
    r->writable = false;
  } else {
    r->readable = false;
    if (r->writable) return 0;
    ctrl = kCtrlDisconnect;
  }
  if (send) {
    if (r->ctrl_avail == 0) {
      int64_t end = now_ms() + 2000;
      while (r->ctrl_avail == 0 && now_ms() < end) {
        progress(r);
        if (r->ctrl_avail) break;
        wait_any(r, lk, 50);
      }
    }
    if (r->ctrl_avail) post_ctrl(r, kOpCtrl | ctrl);
    drain_sends(r, lk);
  }
  if (ctrl == kCtrlDisconnect && r->st == St::kConnected) r->st = St::kClosedByPeer;
  return 0;
}
}  // namespace

RDMACM_EXPORT int rshutdown(int socket, int how) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) { return shutdown_locked(r, lk, how); });
}

RDMACM_EXPORT int rclose(int socket) {
  Rs* r = nullptr;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_socks.find(socket);
    if (it == g_socks.end()) return fail(EBADF);
    r = it->second;
    g_socks.erase(it);
  }
  {
    std::unique_lock<std::mutex> lk(r->mu);
    handle_cm_events(r);
    progress(r);  // the peer may have gone already: then there is nothing to tell it
    if (r->st == St::kConnected) shutdown_locked(r, lk, SHUT_RDWR);
    if (r->cq) rdma_disconnect(r->id);
    for (auto& q : r->reqs) {
      rdma_reject(q.id, nullptr, 0);
      rdma_destroy_id(q.id);
    }
    r->reqs.clear();
    free_res(r);
    if (r->id) rdma_destroy_id(r->id);
    rdma_destroy_event_channel(r->ch);
  }
  delete r;
  return 0;
}

RDMACM_EXPORT ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    iovec v{const_cast<void*>(buf), len};
    return do_send(r, lk, &v, 1, flags);
  });
}
RDMACM_EXPORT ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const struct sockaddr* dest_addr,
                              socklen_t addrlen) {
  if (dest_addr != nullptr || addrlen != 0) {
    if (lookup(socket) == nullptr) return fail(EBADF);
    return fail(EISCONN);
  }
  return rsend(socket, buf, len, flags);
}
RDMACM_EXPORT ssize_t rsendmsg(int socket, const struct msghdr* msg, int flags) {
  if (msg == nullptr) return fail(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail(EOPNOTSUPP);
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    return do_send(r, lk, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  });
}
RDMACM_EXPORT ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }
RDMACM_EXPORT ssize_t rwritev(int socket, const struct iovec* iov, int iovcnt) {
  if (iovcnt < 0 || (iovcnt > 0 && iov == nullptr)) return fail(EINVAL);
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    return do_send(r, lk, iov, iovcnt, 0);
  });
}

RDMACM_EXPORT ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    iovec v{buf, len};
    return do_recv(r, lk, &v, 1, flags);
  });
}
RDMACM_EXPORT ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, struct sockaddr* src_addr,
                                socklen_t* addrlen) {
  ssize_t n = rrecv(socket, buf, len, flags);
  if (n > 0 && src_addr && addrlen) rgetpeername(socket, src_addr, addrlen);
  return n;
}
RDMACM_EXPORT ssize_t rrecvmsg(int socket, struct msghdr* msg, int flags) {
  if (msg == nullptr) return fail(EINVAL);
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
    return do_recv(r, lk, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  });
}
RDMACM_EXPORT ssize_t rread(int socket, void* buf, size_t count) { return rrecv(socket, buf, count, 0); }
RDMACM_EXPORT ssize_t rreadv(int socket, const struct iovec* iov, int iovcnt) {
  if (iovcnt < 0 || (iovcnt > 0 && iov == nullptr)) return fail(EINVAL);
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    return do_recv(r, lk, iov, iovcnt, 0);
  });
}

RDMACM_EXPORT int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) {
  int64_t end = timeout < 0 ? -1 : now_ms() + timeout;
  std::vector<pollfd> sys;
  std::vector<int> owner;
  for (;;) {
    int ready = 0;
    sys.clear();
    owner.clear();
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = 0;
      Rs* r = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
      if (r == nullptr) {
        sys.push_back({fds[i].fd, fds[i].events, 0});
        owner.push_back(static_cast<int>(i));
        continue;
      }
      std::lock_guard<std::mutex> l(r->mu);
      fds[i].revents = poll_rs(r, fds[i].events);
      if (fds[i].revents) {
        ++ready;
        continue;
      }
      if (r->cq) {
        ibv_req_notify_cq(r->cq, 0);
        fds[i].revents = poll_rs(r, fds[i].events);  // what came before the arm
        if (fds[i].revents) {
          ++ready;
          continue;
        }
        sys.push_back({r->cc->fd, POLLIN, 0});
        owner.push_back(static_cast<int>(i));
      }
      sys.push_back({r->fd, POLLIN, 0});
      owner.push_back(static_cast<int>(i));
    }
    int wait = ready ? 0 : (end < 0 ? -1 : static_cast<int>(std::max<int64_t>(0, end - now_ms())));
    int rc = poll(sys.data(), sys.size(), wait);
    if (rc < 0) return -1;
    for (size_t k = 0; k < sys.size(); ++k) {
      int i = owner[k];
      Rs* r = lookup(fds[i].fd);
      if (r == nullptr) {
        fds[i].revents = sys[k].revents;
        if (sys[k].revents) ++ready;
      } else if (sys[k].revents && r->cc && sys[k].fd == r->cc->fd) {
        std::lock_guard<std::mutex> l(r->mu);
        ibv_cq* cq;
        void* ctx;
        int got = 0;
        while (ibv_get_cq_event(r->cc, &cq, &ctx) == 0) ++got;
        if (got) ibv_ack_cq_events(r->cq, static_cast<unsigned>(got));
      }
    }
    if (ready) return ready;
    if (rc == 0 && end >= 0 && now_ms() >= end) return 0;
  }
}

RDMACM_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, struct timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return fail(EINVAL);
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (exceptfds && FD_ISSET(fd, exceptfds)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int tmo = timeout ? static_cast<int>(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
  int rc = rpoll(p.data(), p.size(), tmo);
  if (rc < 0) return rc;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int n = 0;
  for (auto& e : p) {
    if (e.revents & POLLNVAL) return fail(EBADF);
    if (readfds && (e.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(e.fd, readfds);
      ++n;
    }
    if (writefds && (e.revents & (POLLOUT | POLLERR))) {
      FD_SET(e.fd, writefds);
      ++n;
    }
    if (exceptfds && (e.revents & POLLPRI)) {
      FD_SET(e.fd, exceptfds);
      ++n;
    }
  }
  if (timeout) *timeout = {0, 0};
  return n;
}

namespace {
int copy_addr(const sockaddr* a, struct sockaddr* out, socklen_t* len) {
  if (out == nullptr || len == nullptr) return fail(EFAULT);
  socklen_t l = a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : a->sa_family == AF_IB ? sizeof(sockaddr_ib) : sizeof(sockaddr_in);
  std::memcpy(out, a, std::min(*len, l));
  *len = l;
  return 0;
}
}  // namespace

RDMACM_EXPORT int rgetpeername(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    if (r->st != St::kConnected && r->st != St::kClosedByPeer) return fail(ENOTCONN);
    return copy_addr(rdma_get_peer_addr(r->id), addr, addrlen);
  });
}
RDMACM_EXPORT int rgetsockname(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    sockaddr* a = rdma_get_local_addr(r->id);
    if (a->sa_family == AF_UNSPEC) {
      sockaddr_storage z{};
      z.ss_family = static_cast<sa_family_t>(r->domain);
      return copy_addr(reinterpret_cast<sockaddr*>(&z), addr, addrlen);
    }
    return copy_addr(a, addr, addrlen);
  });
}

RDMACM_EXPORT int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    if (optval == nullptr && optlen) return fail(EFAULT);
    if (level == SOL_SOCKET && optname == SO_LINGER) {
      if (optlen < sizeof(linger)) return fail(EINVAL);
      std::memcpy(&r->lng, optval, sizeof(linger));
      return 0;
    }
    if (level == SOL_RDMA && optname == RDMA_ROUTE) return fail(EOPNOTSUPP);
    if (optlen < sizeof(int)) return fail(EINVAL);
    int v;
    std::memcpy(&v, optval, sizeof v);
    bool pre = r->cq == nullptr;
    switch (level) {
      case SOL_SOCKET:
        switch (optname) {
          case SO_REUSEADDR: {
            int on = v != 0;
            if (rdma_set_option(r->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on) != 0 && pre)
              return -1;
            r->reuseaddr = on;
            return 0;
          }
          case SO_KEEPALIVE:
            r->keepalive = v != 0;
            return 0;
          case SO_RCVBUF:
            if (v <= 0) return fail(EINVAL);
            if (pre) r->rbuf_size = static_cast<uint32_t>(std::min(v, 1 << 26)) << 1;
            return 0;
          case SO_SNDBUF:
            if (v <= 0) return fail(EINVAL);
            if (pre) r->sbuf_size = static_cast<uint32_t>(std::min(v, 1 << 26)) << 1;
            return 0;
          case SO_OOBINLINE:
            return 0;
          default:
            return fail(ENOPROTOOPT);
        }
      case IPPROTO_TCP:
        switch (optname) {
          case TCP_NODELAY:
            r->nodelay = v != 0;
            return 0;
          case TCP_KEEPIDLE:
            if (v <= 0) return fail(EINVAL);
            r->keepidle = v;
            return 0;
          case TCP_MAXSEG:
            return 0;
          default:
            return fail(ENOPROTOOPT);
        }
      case IPPROTO_IPV6:
        if (optname == IPV6_V6ONLY) {
          int on = v != 0;
          return rdma_set_option(r->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on);
        }
        return fail(ENOPROTOOPT);
      case SOL_RDMA:
        if (!pre || r->st == St::kConnecting) return fail(EINVAL);
        if (v < 0) return fail(EINVAL);
        switch (optname) {
          case RDMA_SQSIZE:
            r->sq_size = static_cast<uint32_t>(std::clamp(v, kCtrlSlots + 2, 0xFFFE));
            return 0;
          case RDMA_RQSIZE:  // the connect data's credits field is 16 bits (rsocket.c: 0xFFFE)
            r->rq_size = static_cast<uint32_t>(std::clamp(v, 2, 0xFFFE));
            return 0;
          case RDMA_INLINE:
            r->sq_inline = static_cast<uint32_t>(std::min(v, 1024));
            return 0;
          case RDMA_IOMAPSIZE:
            r->iomap_size = scale_to_value(value_to_scale(static_cast<uint32_t>(std::min(v, 0x7F << 8))));
            return 0;
          default:
            return fail(ENOPROTOOPT);
        }
      default:
        return fail(ENOPROTOOPT);
    }
  });
}

RDMACM_EXPORT int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    if (optval == nullptr || optlen == nullptr) return fail(EFAULT);
    if (level == SOL_SOCKET && optname == SO_LINGER) {
      if (*optlen < sizeof(linger)) return fail(EINVAL);
      std::memcpy(optval, &r->lng, sizeof(linger));
      *optlen = sizeof(linger);
      return 0;
    }
    int v;
    switch (level) {
      case SOL_SOCKET:
        switch (optname) {
          case SO_REUSEADDR: v = r->reuseaddr; break;
          case SO_KEEPALIVE: v = r->keepalive; break;
          case SO_RCVBUF: v = static_cast<int>(r->rbuf_size); break;
          case SO_SNDBUF: v = static_cast<int>(r->sbuf_size); break;
          case SO_OOBINLINE: v = 1; break;
          case SO_ERROR:
            handle_cm_events(r);
            v = r->st == St::kConnecting ? 0 : r->err;
            if (r->st == St::kError) r->err = 0;
            break;
          case SO_TYPE: v = SOCK_STREAM; break;
          default: return fail(ENOPROTOOPT);
        }
        break;
      case IPPROTO_TCP:
        switch (optname) {
          case TCP_NODELAY: v = r->nodelay; break;
          case TCP_KEEPIDLE: v = r->keepidle ? r->keepidle : 7200; break;
          case TCP_MAXSEG: v = 1 << 16; break;
          default: return fail(ENOPROTOOPT);
        }
        break;
      case SOL_RDMA:
        switch (optname) {
          case RDMA_SQSIZE: v = static_cast<int>(r->sq_size); break;
          case RDMA_RQSIZE: v = static_cast<int>(r->rq_size); break;
          case RDMA_INLINE: v = static_cast<int>(r->sq_inline); break;
          case RDMA_IOMAPSIZE: v = static_cast<int>(r->iomap_size); break;
          default: return fail(ENOPROTOOPT);
        }
        break;
      default:
        return fail(ENOPROTOOPT);
    }
    if (*optlen < sizeof(int)) return fail(EINVAL);
    std::memcpy(optval, &v, sizeof v);
    *optlen = sizeof v;
    return 0;
  });
}

RDMACM_EXPORT int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = (cmd == F_SETFL) ? va_arg(ap, long) : 0;
  va_end(ap);
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>&) -> int {
    switch (cmd) {
      case F_GETFL:
        return r->fd_flags | O_RDWR;
      case F_SETFL:
        r->fd_flags = static_cast<int>(arg) & O_NONBLOCK;
        return 0;
      default:
        return fail(EOPNOTSUPP);
    }
  });
}

RDMACM_EXPORT off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> off_t {
    if (buf == nullptr || len == 0 || flags != 0) return fail(EINVAL);
    if (r->st != St::kConnected) return fail(ENOTCONN);
    Rs::Iomap m{buf, len, offset == -1 ? static_cast<off_t>(reinterpret_cast<uintptr_t>(buf)) : offset, nullptr, -1,
                false};
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (prot & PROT_WRITE) {
      for (size_t i = 0; i < r->slot_used.size(); ++i)
        if (!r->slot_used[i]) {
          m.index = static_cast<int>(i);
          break;
        }
      if (m.index < 0) return fail(ENOMEM);  // the peer's RDMA_IOMAPSIZE is used up
      access |= IBV_ACCESS_REMOTE_WRITE;
    } else if (prot != PROT_NONE) {
      return fail(EINVAL);
    }
    m.mr = ibv_reg_mr(r->pd, buf, len, access);
    if (m.mr == nullptr) return -1;
    if (m.index >= 0) r->slot_used[static_cast<size_t>(m.index)] = true;
    r->iomaps.push_back(m);
    if (m.index >= 0) send_iomaps(r, lk, true);  // EAGAIN: rsend / riowrite send it later
    return m.offset;
  });
}

RDMACM_EXPORT int riounmap(int socket, void* buf, size_t len) {
  return with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> int {
    for (auto it = r->iomaps.begin(); it != r->iomaps.end(); ++it) {
      if (it->buf == buf && it->len == len) {
        drain_sends(r, lk);
        if (it->index >= 0 && static_cast<size_t>(it->index) < r->slot_used.size())
          r->slot_used[static_cast<size_t>(it->index)] = false;
        ibv_dereg_mr(it->mr);
        r->iomaps.erase(it);
        return 0;
      }
    }
    return fail(EINVAL);
  });
}

RDMACM_EXPORT size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  ssize_t rc = with_rs(socket, [&](Rs* r, std::unique_lock<std::mutex>& lk) -> ssize_t {
    if (r->st == St::kInit || r->st == St::kBound || r->st == St::kListen) return fail(ENOTCONN);
    if (r->st != St::kConnected || !r->writable) return fail(ECONNRESET);
    bool nb = nonblocking(r, flags);
    if (send_iomaps(r, lk, nb) != 0 && errno != EAGAIN) return -1;
    size_t sent = 0;
    WireIomap im{};
    bool have = false;
    auto ready = [&] {
      return (r->sqe_avail > 0 && r->sbuf_avail >= kSndLowat) || r->st != St::kConnected;
    };
    while (sent < count) {
      uint64_t off = static_cast<uint64_t>(offset) + sent;
      if (!have || off >= im.offset + im.sge.length) {
        progress(r);
        have = find_iomap(r, off, &im) != nullptr;
        if (!have) {
          if (sent) break;
          return fail(EINVAL);
        }
      }
      if (!ready() || r->st != St::kConnected) {
        if (wait_for(r, lk, nb, ready) != 0) {
          if (sent) break;
          return -1;
        }
        if (r->st != St::kConnected) {
          if (sent) break;
          return fail(ECONNRESET);
        }
      }
      uint32_t x = static_cast<uint32_t>(std::min<uint64_t>({count - sent, kMaxTransfer, r->sbuf_avail,
                                                             im.offset + im.sge.length - off}));
      if (r->soffset == r->sbuf_size) r->soffset = 0;
      x = std::min(x, r->sbuf_size - r->soffset);
      uint8_t* dst = r->sbuf + r->soffset;
      std::memcpy(dst, static_cast<const uint8_t*>(buf) + sent, x);
      bool inl = x <= r->sq_inline;
      uint32_t used = inl ? 0 : x;
      if (!inl) r->soffset += x;
      ibv_sge sge{reinterpret_cast<uintptr_t>(dst), x, r->smr->lkey};
      r->sqe_avail--;
      r->sbuf_avail -= used;
      if (post_write(r, &sge, 1, wr_id(kWrWrite, used), false, kOpWrite | x, inl ? IBV_SEND_INLINE : 0,
                     im.sge.addr + (off - im.offset), im.sge.key) != 0) {
        if (sent) break;
        return -1;
      }
      sent += x;
    }
    return static_cast<ssize_t>(sent);
  });
  // riowrite returns size_t: -1 (SIZE_MAX) with errno on failure, as librdmacm's does.
  return static_cast<size_t>(rc);
}
