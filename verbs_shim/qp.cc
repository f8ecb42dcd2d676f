// Queue pairs: every QP is an ibv_qp_ex with the whole ibv_wr_* table filled (perftest's
// default post path); create (ibv_create_qp, create_qp_ex), modify, query, destroy, and
// the data path post_send / post_recv translated to emu WRs.
// Hot path: op_post_send, op_post_recv and the wr_* builders (no allocation once the
// batch vectors reserved at create are warm).
#include <cstring>
#include <type_traits>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {

static_assert(sizeof(emu::Sge) == sizeof(ibv_sge));
static_assert(offsetof(emu::Sge, addr) == offsetof(ibv_sge, addr));
static_assert(offsetof(emu::Sge, length) == offsetof(ibv_sge, length));
static_assert(offsetof(emu::Sge, lkey) == offsetof(ibv_sge, lkey));
static_assert(static_cast<int>(emu::QpType::kRc) == IBV_QPT_RC);
static_assert(static_cast<int>(emu::QpType::kUc) == IBV_QPT_UC);
static_assert(static_cast<int>(emu::QpType::kUd) == IBV_QPT_UD);
static_assert(static_cast<int>(emu::QpType::kXrcSend) == IBV_QPT_XRC_SEND);
static_assert(static_cast<int>(emu::QpType::kXrcRecv) == IBV_QPT_XRC_RECV);
static_assert(static_cast<int>(emu::QpState::kErr) == IBV_QPS_ERR);
static_assert(static_cast<int>(emu::QpState::kSqd) == IBV_QPS_SQD);
static_assert(static_cast<int>(emu::MigState::kArmed) == IBV_MIG_ARMED);
static_assert(static_cast<int>(emu::WrOpcode::kRdmaWrite) == IBV_WR_RDMA_WRITE);
static_assert(static_cast<int>(emu::WrOpcode::kSendWithImm) == IBV_WR_SEND_WITH_IMM);
static_assert(static_cast<int>(emu::WrOpcode::kAtomicFetchAndAdd) == IBV_WR_ATOMIC_FETCH_AND_ADD);
static_assert(static_cast<int>(emu::WrOpcode::kBindMw) == IBV_WR_BIND_MW);
static_assert(static_cast<int>(emu::WrOpcode::kSendWithInv) == IBV_WR_SEND_WITH_INV);
static_assert(static_cast<int>(emu::WrOpcode::kTso) == IBV_WR_TSO);
static_assert(static_cast<int>(emu::WrOpcode::kAtomicWrite) == IBV_WR_ATOMIC_WRITE);
static_assert(static_cast<int>(emu::WrOpcode::kFlush) == compat::kWrFlush);
// Qp is not standard-layout (shared_ptr, vectors), but its first two members are laid out
// like QpEx45: checked here so an application's ibv_wr_flush() finds the slot.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(Qp, pub_) == 0 &&
              offsetof(Qp, wr_flush_) == offsetof(compat::QpEx45, wr_flush));
#pragma GCC diagnostic pop
static_assert(emu::kQpState == IBV_QP_STATE && emu::kQpAv == IBV_QP_AV &&
              emu::kQpDestQpn == IBV_QP_DEST_QPN && emu::kQpCap == IBV_QP_CAP &&
              emu::kQpRateLimit == IBV_QP_RATE_LIMIT && emu::kQpSqPsn == IBV_QP_SQ_PSN &&
              emu::kQpMaxDestRdAtomic == IBV_QP_MAX_DEST_RD_ATOMIC);
static_assert(emu::kSendFence == IBV_SEND_FENCE && emu::kSendSignaled == IBV_SEND_SIGNALED &&
              emu::kSendSolicited == IBV_SEND_SOLICITED && emu::kSendInline == IBV_SEND_INLINE &&
              emu::kSendIpCsum == IBV_SEND_IP_CSUM);

namespace {

constexpr uint64_t kSupportedSendOps =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
    IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
    IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_ATOMIC_WRITE | compat::kQpExWithFlush;
// ATOMIC_WRITE and FLUSH are RC operations: asking for them on another QP type is
// EOPNOTSUPP, as rdma-core's rxe provider answers (check_qp_init_attr).
constexpr uint64_t kRcOnlySendOps = IBV_QP_EX_WITH_ATOMIC_WRITE | compat::kQpExWithFlush;

// ---- attribute conversion ----

// An application fills only the fields its attr_mask names (ibv_modify_qp(3): ibv_xsrq_pingpong
// leaves the rest of its ibv_qp_attr uninitialised), so enum fields are read as integers: no
// load of an invalid enum value (UBSan), and anything above 255 stays invalid for emu's checks.
template <class E>
uint8_t enum_byte(const E& v) {
  static_assert(sizeof(E) == sizeof(uint32_t));
  uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  return x > 0xff ? uint8_t{0xff} : static_cast<uint8_t>(x);
}

emu::QpAttr qp_attr_to_emu(const ibv_qp_attr& a) {
  emu::QpAttr e;
  e.qp_state = static_cast<emu::QpState>(enum_byte(a.qp_state));
  e.cur_qp_state = static_cast<emu::QpState>(enum_byte(a.cur_qp_state));
  e.path_mtu = static_cast<emu::Mtu>(enum_byte(a.path_mtu));
  e.path_mig_state = static_cast<emu::MigState>(enum_byte(a.path_mig_state));
  e.qkey = a.qkey;
  e.rq_psn = a.rq_psn;
  e.sq_psn = a.sq_psn;
  e.dest_qp_num = a.dest_qp_num;
  e.qp_access_flags = a.qp_access_flags;
  e.cap.max_send_wr = a.cap.max_send_wr;
  e.cap.max_recv_wr = a.cap.max_recv_wr;
  e.cap.max_send_sge = a.cap.max_send_sge;
  e.cap.max_recv_sge = a.cap.max_recv_sge;
  e.cap.max_inline_data = a.cap.max_inline_data;
  e.ah_attr = rnic::shim::to_emu(a.ah_attr);
  e.alt_ah_attr = rnic::shim::to_emu(a.alt_ah_attr);
  e.pkey_index = a.pkey_index;
  e.alt_pkey_index = a.alt_pkey_index;
  e.en_sqd_async_notify = a.en_sqd_async_notify;
  e.sq_draining = a.sq_draining;
  e.max_rd_atomic = a.max_rd_atomic;
  e.max_dest_rd_atomic = a.max_dest_rd_atomic;
  e.min_rnr_timer = a.min_rnr_timer;
  e.port_num = a.port_num;
  e.timeout = a.timeout;
  e.retry_cnt = a.retry_cnt;
  e.rnr_retry = a.rnr_retry;
  e.alt_port_num = a.alt_port_num;
  e.alt_timeout = a.alt_timeout;
  e.rate_limit = a.rate_limit;
  return e;
}

void qp_attr_from_emu(const emu::QpAttr& e, ibv_qp_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->qp_state = static_cast<ibv_qp_state>(e.qp_state);
  a->cur_qp_state = static_cast<ibv_qp_state>(e.cur_qp_state);
  a->path_mtu = static_cast<ibv_mtu>(e.path_mtu);
  a->path_mig_state = static_cast<ibv_mig_state>(e.path_mig_state);
  a->qkey = e.qkey;
  a->rq_psn = e.rq_psn;
  a->sq_psn = e.sq_psn;
  a->dest_qp_num = e.dest_qp_num;
  a->qp_access_flags = e.qp_access_flags;
  a->cap.max_send_wr = e.cap.max_send_wr;
  a->cap.max_recv_wr = e.cap.max_recv_wr;
  a->cap.max_send_sge = e.cap.max_send_sge;
  a->cap.max_recv_sge = e.cap.max_recv_sge;
  a->cap.max_inline_data = e.cap.max_inline_data;
  rnic::shim::from_emu(e.ah_attr, &a->ah_attr);
  rnic::shim::from_emu(e.alt_ah_attr, &a->alt_ah_attr);
  a->pkey_index = e.pkey_index;
  a->alt_pkey_index = e.alt_pkey_index;
  a->en_sqd_async_notify = e.en_sqd_async_notify;
  a->sq_draining = e.sq_draining;
  a->max_rd_atomic = e.max_rd_atomic;
  a->max_dest_rd_atomic = e.max_dest_rd_atomic;
  a->min_rnr_timer = e.min_rnr_timer;
  a->port_num = e.port_num;
  a->timeout = e.timeout;
  a->retry_cnt = e.retry_cnt;
  a->rnr_retry = e.rnr_retry;
  a->alt_port_num = e.alt_port_num;
  a->alt_timeout = e.alt_timeout;
  a->rate_limit = e.rate_limit;
}

// ---- ibv_send_wr -> emu::SendWr ----

// Returns 0 or EINVAL (opcode outside the verbs enum).
inline int convert_send(const Qp* q, const ibv_send_wr* w, emu::SendWr* e) {
  // A C caller may store any int in the enum; in C++ a value outside the enumerators' range
  // is undefined to load as the enum (UBSan: -fsanitize=enum), so read its bytes.
  std::underlying_type_t<ibv_wr_opcode> raw_op;
  static_assert(sizeof(raw_op) == sizeof(w->opcode));
  std::memcpy(&raw_op, &w->opcode, sizeof(raw_op));
  if (raw_op < IBV_WR_RDMA_WRITE || raw_op > IBV_WR_ATOMIC_WRITE) return EINVAL;
  // FLUSH has no ibv_send_wr form (its placement type and level exist only as ibv_wr_flush
  // arguments): EINVAL, as for any opcode the provider cannot post.
  if (raw_op == compat::kWrFlush) return EINVAL;
  e->wr_id = w->wr_id;
  e->sg_list = reinterpret_cast<const emu::Sge*>(w->sg_list);
  e->num_sge = w->num_sge;
  e->opcode = static_cast<emu::WrOpcode>(w->opcode);
  e->send_flags = w->send_flags;
  e->imm_data = w->imm_data;
  e->invalidate_rkey = w->invalidate_rkey;
  switch (w->opcode) {
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      e->atomic.remote_addr = w->wr.atomic.remote_addr;
      e->atomic.compare_add = w->wr.atomic.compare_add;
      e->atomic.swap = w->wr.atomic.swap;
      e->atomic.rkey = w->wr.atomic.rkey;
      break;
    case IBV_WR_BIND_MW:
      e->bind_mw.mw_rkey = w->bind_mw.mw ? w->bind_mw.mw->rkey : 0;
      e->bind_mw.new_rkey = w->bind_mw.rkey;
      e->bind_mw.mr_lkey = w->bind_mw.bind_info.mr ? w->bind_mw.bind_info.mr->lkey : 0;
      e->bind_mw.addr = w->bind_mw.bind_info.addr;
      e->bind_mw.length = w->bind_mw.bind_info.length;
      e->bind_mw.access = w->bind_mw.bind_info.mw_access_flags;
      break;
    default:
      e->rdma.remote_addr = w->wr.rdma.remote_addr;
      e->rdma.rkey = w->wr.rdma.rkey;
      break;
  }
  if (q->pub_.qp_base.qp_type == IBV_QPT_XRC_SEND)
    e->xrc_remote_srqn = w->qp_type.xrc.remote_srqn;
  if (q->pub_.qp_base.qp_type == IBV_QPT_UD) {
    e->ud.ah = w->wr.ud.ah ? to_ah(w->wr.ud.ah)->emu_.get() : nullptr;
    e->ud.remote_qpn = w->wr.ud.remote_qpn;
    e->ud.remote_qkey = w->wr.ud.remote_qkey;
  }
  return 0;
}

// ---- ibv_qp_ex builders ----

inline emu::SendWr* last_wr(Qp* q) { return q->batch_.empty() ? nullptr : &q->batch_.back(); }

// The builders are void C callbacks: growth past the storage reserved at create (a batch
// longer than max_send_wr) may allocate, and a failure must not throw through the ABI. It
// is recorded in batch_err_ (wr_complete returns it) and the WR lands in a scratch slot.
thread_local emu::SendWr g_scratch_wr;  // written only when a batch already failed; never posted

inline emu::SendWr& begin_wr(ibv_qp_ex* x, emu::WrOpcode op) {
  Qp* q = to_qp(x);
  try {
    q->batch_.emplace_back();
    q->batch_sge_at_.push_back(static_cast<uint32_t>(q->batch_sge_.size()));
    q->batch_inline_at_.push_back(~0u);
  } catch (...) {
    q->batch_err_ = ENOMEM;
    return g_scratch_wr;
  }
  emu::SendWr& w = q->batch_.back();
  w.wr_id = x->wr_id;
  w.send_flags = x->wr_flags;
  w.opcode = op;
  return w;
}

// Runs a storage-growing builder step; ENOMEM instead of an exception.
template <class F>
inline void grow(Qp* q, F&& f) {
  try {
    f();
  } catch (...) {
    q->batch_err_ = ENOMEM;
  }
}

void wr_start(ibv_qp_ex* x) {
  Qp* q = to_qp(x);
  q->batch_.clear();
  q->batch_sge_.clear();
  q->batch_sge_at_.clear();
  q->batch_inline_.clear();
  q->batch_inline_at_.clear();
  q->batch_err_ = 0;
}

void wr_abort(ibv_qp_ex* x) { wr_start(x); }

int wr_complete(ibv_qp_ex* x) {
  Qp* q = to_qp(x);
  if (inherited(x->qp_base.context)) {
    wr_abort(x);
    return EIO;
  }
  int err = q->batch_err_;
  size_t n = q->batch_.size();
  if (err == 0 && n > 0) {
    // Point each WR at its SGEs (and inline copies) now that the vectors stopped growing.
    for (size_t i = 0; i < n; ++i) {
      emu::SendWr& w = q->batch_[i];
      uint32_t at = q->batch_sge_at_[i];
      uint32_t end = (i + 1 < n) ? q->batch_sge_at_[i + 1] : static_cast<uint32_t>(q->batch_sge_.size());
      w.num_sge = static_cast<int>(end - at);
      w.sg_list = w.num_sge ? &q->batch_sge_[at] : nullptr;
      if (q->batch_inline_at_[i] != ~0u && w.num_sge == 1) {
        q->batch_sge_[at].addr = reinterpret_cast<uintptr_t>(q->batch_inline_.data() + q->batch_inline_at_[i]);
      }
    }
    int bad = 0;
    emu::Status st = q->emu_->post_send(q->batch_.data(), static_cast<int>(n), &bad);
    if (!st.is_ok()) err = err_of(st);
  }
  wr_start(x);
  return err;
}

void wr_send(ibv_qp_ex* x) { begin_wr(x, emu::WrOpcode::kSend); }
void wr_send_imm(ibv_qp_ex* x, __be32 imm) { begin_wr(x, emu::WrOpcode::kSendWithImm).imm_data = imm; }
void wr_send_inv(ibv_qp_ex* x, uint32_t rkey) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kSendWithInv);
  w.invalidate_rkey = rkey;
  w.imm_data = rkey;
}
void wr_send_tso(ibv_qp_ex* x, void*, uint16_t, uint16_t) {
  begin_wr(x, emu::WrOpcode::kTso);
  to_qp(x)->batch_err_ = EOPNOTSUPP;
}
void wr_rdma_read(ibv_qp_ex* x, uint32_t rkey, uint64_t addr) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kRdmaRead);
  w.rdma.rkey = rkey;
  w.rdma.remote_addr = addr;
}
void wr_rdma_write(ibv_qp_ex* x, uint32_t rkey, uint64_t addr) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kRdmaWrite);
  w.rdma.rkey = rkey;
  w.rdma.remote_addr = addr;
}
void wr_rdma_write_imm(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, __be32 imm) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kRdmaWriteWithImm);
  w.rdma.rkey = rkey;
  w.rdma.remote_addr = addr;
  w.imm_data = imm;
}
void wr_atomic_cmp_swp(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kAtomicCmpAndSwp);
  w.atomic.rkey = rkey;
  w.atomic.remote_addr = addr;
  w.atomic.compare_add = compare;
  w.atomic.swap = swap;
}
void wr_atomic_fetch_add(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t add) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kAtomicFetchAndAdd);
  w.atomic.rkey = rkey;
  w.atomic.remote_addr = addr;
  w.atomic.compare_add = add;
}
void wr_atomic_write(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, const void* value) {
  Qp* q = to_qp(x);
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kAtomicWrite);
  if (q->batch_err_ != 0) return;
  w.rdma.rkey = rkey;
  w.rdma.remote_addr = addr;
  // The 8-byte operand is copied now, by value (no inline-data capacity needed).
  if (value == nullptr) {
    q->batch_err_ = EINVAL;
    return;
  }
  std::memcpy(&w.operand, value, 8);
  w.has_operand = true;
}
void wr_flush(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, size_t len, uint8_t type,
              uint8_t level) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kFlush);
  w.rdma.rkey = rkey;
  w.rdma.remote_addr = addr;
  w.flush.length = len;
  w.flush.type = type;    // checked by post_send (EINVAL from wr_complete)
  w.flush.level = level;
}
void wr_bind_mw(ibv_qp_ex* x, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kBindMw);
  w.bind_mw.mw_rkey = mw ? mw->rkey : 0;
  w.bind_mw.new_rkey = rkey;
  if (info != nullptr) {
    w.bind_mw.mr_lkey = info->mr ? info->mr->lkey : 0;
    w.bind_mw.addr = info->addr;
    w.bind_mw.length = info->length;
    w.bind_mw.access = info->mw_access_flags;
  }
}
void wr_local_inv(ibv_qp_ex* x, uint32_t rkey) {
  emu::SendWr& w = begin_wr(x, emu::WrOpcode::kLocalInv);
  w.invalidate_rkey = rkey;
  w.imm_data = rkey;
}
void wr_set_ud_addr(ibv_qp_ex* x, ibv_ah* ah, uint32_t qpn, uint32_t qkey) {
  emu::SendWr* w = last_wr(to_qp(x));
  if (w == nullptr) return;
  w->ud.ah = ah ? to_ah(ah)->emu_.get() : nullptr;
  w->ud.remote_qpn = qpn;
  w->ud.remote_qkey = qkey;
}
void wr_set_xrc_srqn(ibv_qp_ex* x, uint32_t remote_srqn) {
  // The target SRQ of the WR being built (XRC_SEND); other QP types ignore it.
  emu::SendWr* w = last_wr(to_qp(x));
  if (w == nullptr) return;
  w->xrc_remote_srqn = remote_srqn;
}
void wr_set_sge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
  Qp* q = to_qp(x);
  if (q->batch_.empty() || q->batch_err_ != 0) return;
  grow(q, [&] {
    q->batch_sge_.resize(q->batch_sge_at_.back());
    q->batch_sge_.push_back(emu::Sge{addr, length, lkey});
  });
}
void wr_set_sge_list(ibv_qp_ex* x, size_t num, const ibv_sge* list) {
  Qp* q = to_qp(x);
  if (q->batch_.empty() || q->batch_err_ != 0) return;
  grow(q, [&] {
    q->batch_sge_.resize(q->batch_sge_at_.back());
    for (size_t i = 0; i < num; ++i)
      q->batch_sge_.push_back(emu::Sge{list[i].addr, list[i].length, list[i].lkey});
  });
}
void wr_set_inline_data_list(ibv_qp_ex* x, size_t num, const ibv_data_buf* bufs) {
  Qp* q = to_qp(x);
  if (q->batch_.empty() || q->batch_err_ != 0) return;
  size_t total = 0;
  for (size_t i = 0; i < num; ++i) total += bufs[i].length;
  if (total > q->emu_->cap().max_inline_data) {
    q->batch_err_ = EINVAL;  // as post_send: inline data beyond max_inline_data
    return;
  }
  // Copy now: the application may reuse its buffers as soon as the builder returns.
  grow(q, [&] {
    uint32_t off = static_cast<uint32_t>(q->batch_inline_.size());
    for (size_t i = 0; i < num; ++i) {
      const auto* b = static_cast<const uint8_t*>(bufs[i].addr);
      q->batch_inline_.insert(q->batch_inline_.end(), b, b + bufs[i].length);
    }
    q->batch_inline_at_.back() = off;
    q->batch_sge_.resize(q->batch_sge_at_.back());
    q->batch_sge_.push_back(emu::Sge{0, static_cast<uint32_t>(total), 0});
  });
  q->batch_.back().send_flags |= emu::kSendInline;
}
void wr_set_inline_data(ibv_qp_ex* x, void* addr, size_t length) {
  ibv_data_buf b{addr, length};
  wr_set_inline_data_list(x, 1, &b);
}

}  // namespace

void fill_qp_ex(Qp* q) {
  ibv_qp_ex& x = q->pub_;
  x.comp_mask = 0;
  x.wr_id = 0;
  x.wr_flags = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  q->wr_flush_ = wr_flush;
}

namespace {

// Shared by ibv_create_qp and create_qp_ex. Returns nullptr with errno set. An XRC target
// (XRC_RECV) is created on xrcd and takes no PD, CQ or SRQ; an XRC initiator (XRC_SEND)
// needs pd and send_cq and ignores recv_cq/srq (the kernel's create_qp rules).
ibv_qp* create_qp_common(ibv_context* context, ibv_pd* pd, ibv_qp_init_attr* init,
                         uint64_t send_ops_flags, ibv_xrcd* xrcd = nullptr) {
  if (context == nullptr || init == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (inherited(context)) return static_cast<ibv_qp*>(null_errno(EIO));
  switch (init->qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_UD:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      break;
    case IBV_QPT_RAW_PACKET:
    case IBV_QPT_DRIVER:
      errno = EOPNOTSUPP;
      return nullptr;
    default:
      errno = EINVAL;
      return nullptr;
  }
  const bool tgt = init->qp_type == IBV_QPT_XRC_RECV;
  const bool ini = init->qp_type == IBV_QPT_XRC_SEND;
  if (tgt) {
    if (xrcd == nullptr || xrcd->context != context)
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    pd = nullptr;
    init->send_cq = init->recv_cq = nullptr;
    init->srq = nullptr;
    init->cap = ibv_qp_cap{};
  } else {
    if (pd == nullptr || pd->context != context || init->send_cq == nullptr ||
        init->send_cq->context != context)
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    if (ini) {
      init->recv_cq = nullptr;
      init->srq = nullptr;
    } else if (init->recv_cq == nullptr || init->recv_cq->context != context ||
               (init->srq != nullptr && init->srq->context != context)) {
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    }
  }
  emu::QpInitAttr ei;
  ei.send_cq = init->send_cq ? to_cq(init->send_cq)->emu_ : nullptr;
  ei.recv_cq = init->recv_cq ? to_cq(init->recv_cq)->emu_ : nullptr;
  ei.srq = init->srq ? to_srq(init->srq)->emu_ : nullptr;
  ei.xrcd = tgt ? to_xrcd(xrcd)->emu_ : nullptr;
  ei.cap.max_send_wr = init->cap.max_send_wr;
  ei.cap.max_recv_wr = init->cap.max_recv_wr;
  ei.cap.max_send_sge = init->cap.max_send_sge;
  ei.cap.max_recv_sge = init->cap.max_recv_sge;
  ei.cap.max_inline_data = init->cap.max_inline_data;
  ei.qp_type = static_cast<emu::QpType>(init->qp_type);
  ei.sq_sig_all = init->sq_sig_all != 0;
  auto r = to_ctx(context)->emu_->create_qp(pd ? to_pd(pd)->emu_ : nullptr, ei);
  if (!r.has_value()) {
    errno = err_of(r.error());
    return nullptr;
  }
  auto* q = new Qp();
  q->emu_ = std::move(r.value());
  q->emu_->user_context = q;
  q->send_ops_flags_ = send_ops_flags;
  const emu::QpCap& cap = q->emu_->cap();
  init->cap.max_send_wr = cap.max_send_wr;
  init->cap.max_recv_wr = cap.max_recv_wr;
  init->cap.max_send_sge = cap.max_send_sge;
  init->cap.max_recv_sge = cap.max_recv_sge;
  init->cap.max_inline_data = cap.max_inline_data;
  // Reserve the wr_* batch storage so the hot path does not allocate.
  size_t depth = cap.max_send_wr ? cap.max_send_wr : 1;
  q->batch_.reserve(depth);
  q->batch_sge_at_.reserve(depth);
  q->batch_inline_at_.reserve(depth);
  q->batch_sge_.reserve(depth * (cap.max_send_sge ? cap.max_send_sge : 1));
  q->batch_inline_.reserve(cap.max_inline_data + 8);
  ibv_qp& b = q->pub_.qp_base;
  b.context = context;
  b.qp_context = init->qp_context;
  b.pd = pd;
  pd_hold(pd);
  b.send_cq = init->send_cq;
  b.recv_cq = init->recv_cq;
  b.srq = init->srq;
  b.handle = q->emu_->qpn();
  b.qp_num = q->emu_->qpn();
  b.state = IBV_QPS_RESET;
  b.qp_type = init->qp_type;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  b.events_completed = 0;
  fill_qp_ex(q);
  if (tgt) xrc_tgt_handle_add(to_ctx(context), q->emu_.get());
  return &b;
}

}  // namespace

int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (qp == nullptr) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  if (inherited(qp->context)) {
    if (bad) *bad = wr;
    return EIO;
  }
  Qp* q = to_qp(qp);
  constexpr int kBatch = 16;
  emu::SendWr buf[kBatch];
  ibv_send_wr* src[kBatch];
  while (wr != nullptr) {
    int n = 0;
    int conv_err = 0;
    ibv_send_wr* conv_bad = nullptr;
    for (; wr != nullptr && n < kBatch; wr = wr->next) {
      buf[n] = emu::SendWr{};
      int e = convert_send(q, wr, &buf[n]);
      if (e != 0) {
        conv_err = e;
        conv_bad = wr;
        break;
      }
      src[n++] = wr;
    }
    if (n > 0) {
      int b = 0;
      emu::Status st = q->emu_->post_send(buf, n, &b);
      if (!st.is_ok()) {
        if (bad) *bad = src[b < n ? b : n - 1];
        return err_of(st);
      }
    }
    if (conv_err != 0) {
      if (bad) *bad = conv_bad;
      return conv_err;
    }
  }
  return 0;
}

int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (qp == nullptr) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  if (inherited(qp->context)) {
    if (bad) *bad = wr;
    return EIO;
  }
  Qp* q = to_qp(qp);
  return post_recv_chain(wr, bad, [q](const emu::RecvWr* w, int n, int* b) {
    return q->emu_->post_recv(w, n, b);
  });
}

ibv_qp* op_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  return guard_ptr<ibv_qp>([&]() -> ibv_qp* {
    if (context == nullptr || attr == nullptr) return static_cast<ibv_qp*>(null_errno(EINVAL));
    uint32_t mask = attr->comp_mask;
    // An XRC target is created on its XRC domain, every other QP on a PD.
    if (attr->qp_type == IBV_QPT_XRC_RECV ? !(mask & IBV_QP_INIT_ATTR_XRCD)
                                          : !(mask & IBV_QP_INIT_ATTR_PD))
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    if (mask & ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                                      IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_XRCD))
      return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP));  // TSO, RSS ...
    if ((mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags != 0)
      return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP));
    uint64_t ops = 0;
    if (mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
      ops = attr->send_ops_flags;
      if (ops & ~kSupportedSendOps) return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP));
      if ((ops & kRcOnlySendOps) && attr->qp_type != IBV_QPT_RC)
        return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP));
    }
    ibv_qp_init_attr init{};
    init.qp_context = attr->qp_context;
    init.send_cq = attr->send_cq;
    init.recv_cq = attr->recv_cq;
    init.srq = attr->srq;
    init.cap = attr->cap;
    init.qp_type = attr->qp_type;
    init.sq_sig_all = attr->sq_sig_all;
    ibv_qp* qp = create_qp_common(context, (mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr,
                                  &init, ops,
                                  (mask & IBV_QP_INIT_ATTR_XRCD) ? attr->xrcd : nullptr);
    if (qp != nullptr) attr->cap = init.cap;
    return qp;
  });
}

}  // namespace rnic::shim

SHIM_EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* init_attr) {
  return guard_ptr<ibv_qp>([&]() -> ibv_qp* {
    if (pd == nullptr) return static_cast<ibv_qp*>(null_errno(EINVAL));
    return create_qp_common(pd->context, pd, init_attr, 0);
  });
}

SHIM_EXPORT int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask) {
  if (qp == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (inherited(qp->context)) return fail_errno(EIO);
  return guard_int([&] {
    Qp* q = to_qp(qp);
    emu::QpAttr ea = qp_attr_to_emu(*attr);
    emu::Status st = to_ctx(qp->context)->emu_->modify_qp(q->emu_, ea, static_cast<uint32_t>(attr_mask));
    if (!st.is_ok()) return err_of(st);
    if (attr_mask & IBV_QP_STATE) qp->state = attr->qp_state;
    return 0;
  });
}

SHIM_EXPORT int ibv_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                             struct ibv_qp_init_attr* init_attr) {
  (void)attr_mask;  // rdma-core providers return every attribute regardless of the mask
  if (qp == nullptr || attr == nullptr || init_attr == nullptr) return fail_errno(EINVAL);
  if (inherited(qp->context)) return fail_errno(EIO);
  return guard_int([&] {
    Qp* q = to_qp(qp);
    emu::QpAttr ea;
    emu::QpInitAttr ei;
    emu::Status st = to_ctx(qp->context)->emu_->query_qp(q->emu_, &ea, &ei);
    if (!st.is_ok()) return err_of(st);
    qp_attr_from_emu(ea, attr);
    std::memset(init_attr, 0, sizeof *init_attr);
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    init_attr->cap = attr->cap;
    init_attr->qp_type = qp->qp_type;
    init_attr->sq_sig_all = ei.sq_sig_all ? 1 : 0;
    qp->state = attr->qp_state;
    return 0;
  });
}

// UD multicast (emu::Device::attach_mcast): the lid is meaningless on RoCE and ignored, as
// rxe does. EINVAL for a non-UD QP or a GID that is not multicast (ib_attach_mcast's checks).
static int mcast_op(struct ibv_qp* qp, const union ibv_gid* gid, bool attach) {
  if (qp == nullptr || gid == nullptr) return fail_errno(EINVAL);
  if (inherited(qp->context)) return fail_errno(EIO);
  return guard_int([&] {
    Qp* q = to_qp(qp);
    uint8_t raw[16];
    std::memcpy(raw, gid->raw, 16);
    emu::Device& dev = *to_ctx(qp->context)->emu_;
    emu::Status st = attach ? dev.attach_mcast(q->emu_, raw) : dev.detach_mcast(q->emu_, raw);
    return st.is_ok() ? 0 : err_of(st);
  });
}

SHIM_EXPORT int ibv_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  (void)lid;
  return mcast_op(qp, gid, true);
}

SHIM_EXPORT int ibv_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  (void)lid;
  return mcast_op(qp, gid, false);
}

SHIM_EXPORT int ibv_destroy_qp(struct ibv_qp* qp) {
  if (qp == nullptr) return fail_errno(EINVAL);
  if (inherited(qp->context)) return fail_errno(EIO);
  return guard_int([&] {
    Qp* q = to_qp(qp);
    if (q->emu_->type() == emu::QpType::kXrcRecv &&
        !xrc_tgt_handle_drop(to_ctx(qp->context), q->emu_.get())) {
      // Another handle (ibv_open_qp) still has the XRC target QP: only this one goes.
      // Its async events stop here (the kernel reports them to the creating handle only).
      if (q->emu_->user_context == q) {
        const uint32_t reported = to_ctx(qp->context)->retire_async(&q->emu_->user_context, qp);
        wait_async_acks(&qp->mutex, &qp->cond, &qp->events_completed, reported);
      }
      pthread_mutex_destroy(&qp->mutex);
      pthread_cond_destroy(&qp->cond);
      delete q;
      return 0;
    }
    emu::Status st = to_ctx(qp->context)->emu_->destroy_qp(q->emu_);
    if (!st.is_ok()) return err_of(st);
    pd_release(qp->pd);
    const uint32_t reported = to_ctx(qp->context)->retire_async(&q->emu_->user_context, qp);
    wait_async_acks(&qp->mutex, &qp->cond, &qp->events_completed, reported);
    pthread_mutex_destroy(&qp->mutex);
    pthread_cond_destroy(&qp->cond);
    delete q;
    return 0;
  });
}

SHIM_EXPORT struct ibv_qp_ex* ibv_qp_to_qp_ex(struct ibv_qp* qp) {
  if (qp == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return &to_qp(qp)->pub_;
}

// rdma-core answers 0 ("not guaranteed") when the provider has no opinion; so do we.
SHIM_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp* qp, enum ibv_wr_opcode op, uint32_t flags) {
  (void)qp;
  (void)op;
  (void)flags;
  return 0;
}
