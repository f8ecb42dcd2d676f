// emu/objects/qp.cc: queue pairs — the IBA modify-QP transition table, check-then-commit modify,
// post_send/post_recv validation and queuing, completion of the SQ head, flush on ERR.
#include "emu/objects/qp.h"

#include <algorithm>
#include <cstring>

#include <cstring>

#include "emu/objects/device.h"

namespace rnic::emu {

namespace {

constexpr uint32_t kPsnMask = 0xFFFFFF;

// Index: [cur][next][type], type 0 = UD, 1 = UC, 2 = RC (and the XRC halves, adjusted by
// xrc_adjust).
int type_index(QpType t) {
  switch (t) {
    case QpType::kUd: return 0;
    case QpType::kUc: return 1;
    case QpType::kRc:
    case QpType::kXrcSend:
    case QpType::kXrcRecv: return 2;
  }
  return 0;
}

// Where the XRC initiator (XRC_SEND) and target (XRC_RECV) columns of Linux's qp_state_table
// differ from RC's: the initiator has no responder (no max_dest_rd_atomic / min_rnr_timer),
// the target no requester (RTR->RTS needs only timeout and sq_psn; no retry counts or
// initiator depth).
void xrc_adjust(QpState cur, QpState next, QpType type, QpTransition* t) {
  using S = QpState;
  const bool ini = type == QpType::kXrcSend;
  if (cur == S::kInit && next == S::kRtr && ini) {
    t->required &= ~(kQpMaxDestRdAtomic | kQpMinRnrTimer);
  } else if (cur == S::kRtr && next == S::kRts) {
    if (ini) t->optional &= ~kQpMinRnrTimer;
    else t->required = kQpTimeout | kQpSqPsn;
  } else if ((cur == S::kRts || cur == S::kSqd) && next == S::kRts) {
    if (ini) t->optional &= ~kQpMinRnrTimer;
  } else if (cur == S::kSqd && next == S::kSqd) {
    t->optional &= ini ? ~(kQpMaxDestRdAtomic | kQpMinRnrTimer)
                       : ~(kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic);
  }
}

struct Row {
  bool valid;
  uint32_t req[3];
  uint32_t opt[3];
};

// IBA Vol 1 11.2.5 / Table "QP state transition attributes" (as encoded in Linux
// drivers/infiniband/core/verbs.c qp_state_table, for UD/UC/RC).
Row table_row(QpState cur, QpState next) {
  using S = QpState;
  const uint32_t kAll = 0;
  Row none{false, {0, 0, 0}, {0, 0, 0}};
  Row plain{true, {0, 0, 0}, {0, 0, 0}};
  (void)kAll;
  // Any state -> RESET, and any state but RESET -> ERR: no attributes. (RESET -> ERR does
  // not exist in Linux's qp_state_table, so rdma-core users see EINVAL there.)
  if (next == S::kReset) return plain;
  if (next == S::kErr) return cur == S::kReset ? none : plain;
  switch (cur) {
    case S::kReset:
      if (next == S::kInit)
        return {true,
                {kQpPkeyIndex | kQpPort | kQpQkey, kQpPkeyIndex | kQpPort | kQpAccessFlags,
                 kQpPkeyIndex | kQpPort | kQpAccessFlags},
                {0, 0, 0}};
      return none;
    case S::kInit:
      if (next == S::kInit)
        return {true,
                {0, 0, 0},
                {kQpPkeyIndex | kQpPort | kQpQkey, kQpPkeyIndex | kQpPort | kQpAccessFlags,
                 kQpPkeyIndex | kQpPort | kQpAccessFlags}};
      if (next == S::kRtr)
        return {true,
                {0, kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn,
                 kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic |
                     kQpMinRnrTimer},
                {kQpPkeyIndex | kQpQkey, kQpAltPath | kQpAccessFlags | kQpPkeyIndex,
                 kQpAltPath | kQpAccessFlags | kQpPkeyIndex}};
      return none;
    case S::kRtr:
      if (next == S::kRts)
        return {true,
                {kQpSqPsn, kQpSqPsn,
                 kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpSqPsn | kQpMaxQpRdAtomic},
                {kQpCurState | kQpQkey,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer |
                     kQpPathMigState}};
      return none;
    case S::kRts:
      if (next == S::kRts)
        return {true,
                {0, 0, 0},
                {kQpCurState | kQpQkey,
                 kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState,
                 kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState |
                     kQpMinRnrTimer}};
      if (next == S::kSqd)
        return {true,
                {0, 0, 0},
                {kQpEnSqdAsyncNotify, kQpEnSqdAsyncNotify, kQpEnSqdAsyncNotify}};
      return none;
    case S::kSqd:
      if (next == S::kRts)
        return {true,
                {0, 0, 0},
                {kQpCurState | kQpQkey,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer |
                     kQpPathMigState}};
      if (next == S::kSqd)
        return {true,
                {0, 0, 0},
                {kQpPkeyIndex | kQpQkey,
                 kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState,
                 kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry |
                     kQpMaxQpRdAtomic | kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags |
                     kQpPkeyIndex | kQpMinRnrTimer | kQpPathMigState}};
      return none;
    case S::kSqe:
      // SQE -> RTS exists for UD and UC only (RC never enters SQE).
      if (next == S::kRts)
        return {true, {0, 0, 0}, {kQpCurState | kQpQkey, kQpCurState | kQpAccessFlags, 0}};
      return none;
    case S::kErr:
    case S::kUnknown:
      return none;
  }
  return none;
}

bool valid_ah_for_qp(const Device& dev, const AhAttr& a, Av* out) {
  Result<Av> r = resolve_ah_attr(dev, a);
  if (!r) return false;
  if (out != nullptr) *out = *r;
  return true;
}

}  // namespace

QpTransition qp_transition(QpState cur, QpState next, QpType type) {
  QpTransition t;
  if (static_cast<int>(cur) >= kNumQpStates || static_cast<int>(next) >= kNumQpStates)
    return t;
  Row r = table_row(cur, next);
  if (!r.valid) return t;
  if (cur == QpState::kSqe && next == QpState::kRts && is_reliable(type)) return t;
  int i = type_index(type);
  t.valid = true;
  t.required = r.req[i];
  t.optional = r.opt[i];
  if (is_xrc(type)) xrc_adjust(cur, next, type, &t);
  return t;
}

// ---------------------------------------------------------------- construction

Qp::Qp(Device& dev, std::shared_ptr<Pd> pd, const QpInitAttr& init)
    : dev_(&dev), pd_(std::move(pd)), send_cq_(init.send_cq), recv_cq_(init.recv_cq),
      srq_(init.srq), xrcd_(init.qp_type == QpType::kXrcRecv ? init.xrcd : nullptr),
      type_(init.qp_type), sq_sig_all_(init.sq_sig_all), cap_(init.cap),
      sq_(init.cap.max_send_wr + (init.srq && init.srq->is_tm() && init.qp_type == QpType::kRc
                                       ? kTmRndvSlots : 0)),
      rq_(init.srq ? 0 : init.cap.max_recv_wr) {
  if (srq_) {
    cap_.max_recv_wr = 0;
    cap_.max_recv_sge = 0;
  }
  const bool tm = sq_.capacity() > cap_.max_send_wr;  // device slots for RNDV READ + FIN
  sq_sge_stride_ = tm ? std::max(cap_.max_send_sge, kTmMaxSge) : cap_.max_send_sge;
  sq_inline_stride_ = tm ? std::max(cap_.max_inline_data, kTmhSize) : cap_.max_inline_data;
  sq_sge_store_.resize(size_t{sq_.capacity()} * sq_sge_stride_);
  sq_inline_store_.resize(size_t{sq_.capacity()} * sq_inline_stride_);
  for (uint32_t i = 0; i < sq_.capacity(); ++i) {
    sq_.slot(i).sge = sq_sge_store_.data() + size_t{i} * sq_sge_stride_;
    sq_.slot(i).inline_data = sq_inline_store_.data() + size_t{i} * sq_inline_stride_;
  }
  rq_sge_store_.resize(size_t{rq_.capacity()} * cap_.max_recv_sge);
  for (uint32_t i = 0; i < rq_.capacity(); ++i)
    rq_.slot(i).sge = rq_sge_store_.data() + size_t{i} * cap_.max_recv_sge;
  reset_locked();
}

// Use counts on the PD/CQs/SRQ are taken by Device::create_qp and dropped by destroy_qp,
// so a lingering reference (an undelivered async event) never keeps them busy.
Qp::~Qp() = default;

void Qp::reset_locked() {
  // rxe_qp_reset: queues emptied without completions, attributes back to create defaults.
  sq_.clear();
  rq_.clear();
  tm_inflight_ = 0;
  QpAttr a;
  a.qp_state = a.cur_qp_state = QpState::kReset;
  a.path_mtu = Mtu::k256;  // rxe: a new QP's path MTU is 256 until modified
  a.cap = cap_;
  a.port_num = 1;
  attr_ = a;
  av_ = Av{};
  // req_/resp_/comp_ belong to the transports: they reset them in on_modify(-> RESET).
  state_.store(QpState::kReset, std::memory_order_release);
}

// ---------------------------------------------------------------- modify

Status Qp::check_modify(const QpAttr& a, uint32_t mask, QpState* next_out, Av* av) const {
  if (mask & ~kQpAttrMaskAll) return Errc::kInval;
  const QpState cur = state();
  if (mask & kQpCurState) {
    if (a.cur_qp_state != cur) return Errc::kInval;
  }
  QpState next = cur;
  if (mask & kQpState) {
    if (static_cast<int>(a.qp_state) >= kNumQpStates) return Errc::kInval;
    next = a.qp_state;
  }
  QpTransition t = qp_transition(cur, next, type_);
  if (!t.valid) return Errc::kInval;
  if ((mask & t.required) != t.required) return Errc::kInval;
  if (mask & ~(t.required | t.optional | kQpState)) return Errc::kInval;

  const DeviceAttr& da = dev_->attr();
  if ((mask & kQpPort) && a.port_num != 1) return Errc::kInval;
  if ((mask & kQpPkeyIndex) && a.pkey_index >= kPkeyTableLen) return Errc::kInval;
  if (mask & kQpAccessFlags) {
    constexpr uint32_t kOk = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                             kAccessRemoteAtomic | kAccessMwBind | kAccessFlushGlobal |
                             kAccessFlushPersistent;
    // ON_DEMAND is an MR property; rdma-core's tests pass their MR access flags here and
    // the kernel (mlx5, rxe) ignores it: accepted and not stored.
    if (a.qp_access_flags & ~(kOk | kAccessOptionalRange | kAccessOnDemand)) return Errc::kInval;
  }
  if (mask & kQpPathMtu) {
    auto m = static_cast<uint8_t>(a.path_mtu);
    if (!mtu_valid(m) || m > static_cast<uint8_t>(Mtu::k4096)) return Errc::kInval;
  }
  if ((mask & kQpTimeout) && a.timeout > 31) return Errc::kInval;
  if ((mask & kQpRetryCnt) && a.retry_cnt > 7) return Errc::kInval;
  if ((mask & kQpRnrRetry) && a.rnr_retry > 7) return Errc::kInval;
  if ((mask & kQpMinRnrTimer) && a.min_rnr_timer > 31) return Errc::kInval;
  if ((mask & kQpMaxQpRdAtomic) && a.max_rd_atomic > da.max_qp_init_rd_atom)
    return Errc::kInval;
  if ((mask & kQpMaxDestRdAtomic) && a.max_dest_rd_atomic > da.max_qp_rd_atom)
    return Errc::kInval;
  if ((mask & kQpDestQpn) && a.dest_qp_num > kPsnMask) return Errc::kInval;
  if ((mask & kQpPathMigState) && static_cast<uint8_t>(a.path_mig_state) > 2)
    return Errc::kInval;
  if (mask & kQpAv) {
    if (!valid_ah_for_qp(*dev_, a.ah_attr, av)) return Errc::kInval;
  }
  if (mask & kQpAltPath) {
    if (!valid_ah_for_qp(*dev_, a.alt_ah_attr, nullptr)) return Errc::kInval;
    if (a.alt_port_num != 1 || a.alt_pkey_index >= kPkeyTableLen || a.alt_timeout > 31)
      return Errc::kInval;
  }
  *next_out = next;
  return Status::ok();
}

void Qp::commit_modify(const QpAttr& a, uint32_t mask, QpState next, const Av& av) {
  const QpState from = state();
  if (next == QpState::kReset) {
    reset_locked();
    if (TransportHooks* h = dev_->hooks()) h->on_modify(*this, from, next);
    // Unpolled completions of this QP go too (after the transports stopped producing).
    if (from != QpState::kReset) {
      if (send_cq_) send_cq_->remove_qp(qpn());
      if (recv_cq_ && recv_cq_ != send_cq_) recv_cq_->remove_qp(qpn());
    }
    return;
  }
  if (mask & kQpPort) attr_.port_num = a.port_num;
  if (mask & kQpPkeyIndex) attr_.pkey_index = a.pkey_index;
  if (mask & kQpQkey) attr_.qkey = a.qkey;
  if (mask & kQpAccessFlags)
    attr_.qp_access_flags = a.qp_access_flags & ~(kAccessOptionalRange | kAccessOnDemand);
  if (mask & kQpAv) {
    attr_.ah_attr = a.ah_attr;
    av_ = av;
  }
  if (mask & kQpPathMtu) attr_.path_mtu = a.path_mtu;
  if (mask & kQpTimeout) attr_.timeout = a.timeout;
  if (mask & kQpRetryCnt) attr_.retry_cnt = a.retry_cnt;
  if (mask & kQpRnrRetry) attr_.rnr_retry = a.rnr_retry;
  if (mask & kQpRqPsn) attr_.rq_psn = a.rq_psn & kPsnMask;
  if (mask & kQpSqPsn) attr_.sq_psn = a.sq_psn & kPsnMask;
  if (mask & kQpMaxQpRdAtomic) attr_.max_rd_atomic = a.max_rd_atomic;
  if (mask & kQpMaxDestRdAtomic) attr_.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & kQpMinRnrTimer) attr_.min_rnr_timer = a.min_rnr_timer;
  if (mask & kQpDestQpn) attr_.dest_qp_num = a.dest_qp_num;
  if (mask & kQpPathMigState) attr_.path_mig_state = a.path_mig_state;
  if (mask & kQpEnSqdAsyncNotify) attr_.en_sqd_async_notify = a.en_sqd_async_notify;
  if (mask & kQpAltPath) {
    attr_.alt_ah_attr = a.alt_ah_attr;
    attr_.alt_port_num = a.alt_port_num;
    attr_.alt_pkey_index = a.alt_pkey_index;
    attr_.alt_timeout = a.alt_timeout;
  }
  attr_.qp_state = attr_.cur_qp_state = next;
  attr_.sq_draining = 0;
  state_.store(next, std::memory_order_release);
  if (TransportHooks* h = dev_->hooks()) h->on_modify(*this, from, next);
  if (next == QpState::kErr) {
    flush_sq_locked();
    flush_rq_locked();
    if (srq_ && from != QpState::kErr) {
      AsyncEvent ev;
      ev.type = EventType::kQpLastWqeReached;
      ev.qp = shared_from_this();
      dev_->async_events().push(std::move(ev));
    }
  } else if (next == QpState::kSqd && from != QpState::kSqd) {
    // The SQ drains once no WQE is outstanding; with no transport (or an empty SQ) that is
    // now. The transports report later drains themselves.
    if (sq_.empty() && attr_.en_sqd_async_notify) {
      AsyncEvent ev;
      ev.type = EventType::kSqDrained;
      ev.qp = shared_from_this();
      dev_->async_events().push(std::move(ev));
    }
  }
}

// ---------------------------------------------------------------- errors and flush

bool Qp::flush_push(const std::shared_ptr<Cq>& cq, const Cqe& e) {
  if (!cq) return true;
  return cq->push(e);
}

void Qp::flush_sq_locked() {
  while (!sq_.empty()) {
    SendWqe& w = sq_.head();
    // A WQE the completer already failed (RETRY_EXC, REM_ACCESS, ...) keeps its own status:
    // comp_retire moves the QP to ERR before that completion is visible, so a consumer that
    // polls the error CQE and then queries the QP sees ERR, never RTS.
    const WcStatus st = w.state == WqeState::kError ? w.status : WcStatus::kWrFlushErr;
    if (w.tm_kind != 0) {
      tm_complete_locked(w, st);
      sq_.pop();
      continue;
    }
    Cqe e;
    e.wr_id = w.wr_id;
    e.status = st;
    e.opcode = wc_opcode_for(w.opcode);
    e.qp_num = qpn_;
    flush_push(send_cq_, e);  // errors always complete (IBA 10.7.3.1)
    sq_.pop();
  }
}

void Qp::flush_rq_locked() {
  while (!rq_.empty()) {
    RecvWqe& w = rq_.head();
    Cqe e;
    e.wr_id = w.wr_id;
    e.status = WcStatus::kWrFlushErr;
    e.opcode = WcOpcode::kRecv;
    e.qp_num = qpn_;
    flush_push(recv_cq_, e);
    rq_.pop();
  }
}

void Qp::enter_error_locked(bool fatal) {
  const QpState from = state();
  attr_.qp_state = attr_.cur_qp_state = QpState::kErr;
  state_.store(QpState::kErr, std::memory_order_release);
  if (from != QpState::kErr) {
    if (TransportHooks* h = dev_->hooks()) h->on_modify(*this, from, QpState::kErr);
    if (fatal) {
      AsyncEvent ev;
      ev.type = EventType::kQpFatal;
      ev.qp = shared_from_this();
      dev_->async_events().push(std::move(ev));
    }
  }
  flush_sq_locked();
  flush_rq_locked();
  if (srq_ && from != QpState::kErr) {
    AsyncEvent ev;
    ev.type = EventType::kQpLastWqeReached;
    ev.qp = shared_from_this();
    dev_->async_events().push(std::move(ev));
  }
}

void Qp::enter_sqe_locked() {
  const QpState from = state();
  if (from == QpState::kErr) return;
  attr_.qp_state = attr_.cur_qp_state = QpState::kSqe;
  state_.store(QpState::kSqe, std::memory_order_release);
  if (from != QpState::kSqe) {
    if (TransportHooks* h = dev_->hooks()) h->on_modify(*this, from, QpState::kSqe);
  }
  flush_sq_locked();
}

void Qp::tm_complete_locked(const SendWqe& w, WcStatus status) {
  --tm_inflight_;
  if (w.tm_kind != kTmRndvRead || !srq_ || !srq_->cq()) return;  // the FIN: no completion
  Cqe e;
  e.wr_id = w.wr_id;
  e.status = status == WcStatus::kSuccess ? status : WcStatus::kTmRndvIncomplete;
  e.opcode = WcOpcode::kTmRecv;
  e.wc_flags = status == WcStatus::kSuccess ? kWcTmDataValid : 0;
  e.byte_len = static_cast<uint32_t>(w.length);
  e.qp_num = qpn_;
  e.src_qp = attr_.dest_qp_num;
  (void)flush_push(srq_->cq(), e);
}

void Qp::tm_rndv_start_locked(const RespState::TmRndv& r) {
  const QpState st = state();
  const bool ok_state = st == QpState::kRts || st == QpState::kSqd;
  if (!ok_state || destroyed_ || sq_.capacity() - sq_.size() < 2 || r.rlen > r.length ||
      r.num_sge > sq_sge_stride_) {
    SendWqe w;
    w.tm_kind = kTmRndvRead;
    w.wr_id = r.recv_wr_id;
    ++tm_inflight_;
    tm_complete_locked(w, WcStatus::kRemAbortErr);
    return;
  }
  auto base = [](SendWqe& w) {
    w.send_flags = 0;
    w.signaled = false;
    w.imm_data = w.invalidate_rkey = 0;
    w.compare_add = w.swap = 0;
    w.xrc_srqn = 0;
    w.bind = BindInfo{};
    w.flush_len = 0;
    w.flush_type = w.flush_level = 0;
    w.has_operand = false;
    w.operand = 0;
    w.state = WqeState::kPosted;
    w.status = WcStatus::kSuccess;
    w.first_psn = w.last_psn = 0;
    w.offset = 0;
    w.sge_index = w.sge_offset = 0;
    for (auto& x : w.scratch) x = 0;
  };
  SendWqe& rd = sq_.tail_slot();
  base(rd);
  rd.tm_kind = kTmRndvRead;
  rd.wr_id = r.recv_wr_id;
  rd.opcode = WrOpcode::kRdmaRead;
  rd.remote_addr = r.rva;
  rd.rkey = r.rkey;
  rd.is_inline = false;
  rd.inline_len = 0;
  // The sink: the tag's buffer, cut to the sender's length.
  uint64_t left = r.rlen;
  rd.num_sge = 0;
  for (uint32_t i = 0; i < r.num_sge && left > 0; ++i) {
    Sge g = r.sge[i];
    if (g.length > left) g.length = static_cast<uint32_t>(left);
    left -= g.length;
    rd.sge[rd.num_sge++] = g;
  }
  rd.length = r.rlen;
  sq_.commit_push();
  SendWqe& fin = sq_.tail_slot();
  base(fin);
  fin.tm_kind = kTmRndvFin;
  fin.wr_id = r.recv_wr_id;
  fin.opcode = WrOpcode::kSend;
  fin.send_flags = kSendFence | kSendInline;  // after the READ's data is in
  fin.is_inline = true;
  fin.num_sge = 0;
  std::memset(fin.inline_data, 0, kTmhSize);
  fin.inline_data[0] = kTmhFin;
  for (int i = 0; i < 4; ++i) fin.inline_data[4 + i] = static_cast<uint8_t>(r.priv >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) fin.inline_data[8 + i] = static_cast<uint8_t>(r.tag >> (56 - 8 * i));
  fin.inline_len = kTmhSize;
  fin.length = kTmhSize;
  sq_.commit_push();
  tm_inflight_ += 2;
  if (TransportHooks* h = dev_->hooks()) h->on_post_send(*this);
}

bool Qp::complete_send_head_locked(WcStatus status, uint32_t byte_len) {
  SendWqe& w = sq_.head();
  if (w.tm_kind != 0) {
    tm_complete_locked(w, status);
    sq_.pop();
    return true;
  }
  bool ok = true;
  if (w.signaled || status != WcStatus::kSuccess) {
    Cqe e;
    e.wr_id = w.wr_id;
    e.status = status;
    e.opcode = wc_opcode_for(w.opcode);
    e.byte_len = byte_len;
    e.qp_num = qpn_;
    ok = flush_push(send_cq_, e);
  }
  sq_.pop();
  return ok;
}

// ---------------------------------------------------------------- post

Status Qp::validate_send_wr(const SendWr& wr) const {
  // Validity, inline and operand rules come from the WR-opcode table (wr_opcode.h).
  const uint32_t m = wr_mask(type_, wr.opcode);
  if (m == 0) return Errc::kInval;
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > cap_.max_send_sge)
    return Errc::kInval;
  if (wr.num_sge > 0 && wr.sg_list == nullptr) return Errc::kInval;
  uint64_t len = 0;
  for (int i = 0; i < wr.num_sge; ++i) len += wr.sg_list[i].length;
  if (len > kPortMaxMsgSz) return Errc::kInval;
  if (wr.send_flags & kSendInline) {
    if (!(m & kWrInlineMask)) return Errc::kInval;
    if (len > cap_.max_inline_data) return Errc::kInval;
  }
  if ((m & kWrAtomicMask) && len < 8) return Errc::kInval;  // operand
  // ATOMIC_WRITE: exactly one 8-byte operand, by value or as the gather list.
  if ((m & kWrAtomicWriteMask) && (wr.has_operand ? wr.num_sge != 0 : len != 8))
    return Errc::kInval;
  if (m & kWrFlushMask) {
    // Placement type: GLOBAL and/or PERSISTENT; level: RANGE or the whole MR. No payload.
    const uint8_t t = wr.flush.type;
    if (t == 0 || (t & ~(kFlushGlobal | kFlushPersistent)) != 0) return Errc::kInval;
    if (wr.flush.level != kFlushRange && wr.flush.level != kFlushMr) return Errc::kInval;
    if (wr.num_sge != 0 || wr.flush.length > kPortMaxMsgSz) return Errc::kInval;
  }
  if (type_ == QpType::kUd && wr.ud.ah == nullptr) return Errc::kInval;
  return Status::ok();
}

Status Qp::post_send(const SendWr* wrs, int n, int* bad) {
  if (TransportHooks* h = dev_->hooks()) h->on_app_enter();
  // on_app_post ends what on_app_enter began (the engine's "inside a call" mark), on an
  // exception too.
  struct Leave {
    Device* dev;
    ~Leave() {
      if (TransportHooks* h = dev->hooks()) h->on_app_post();
    }
  } leave{dev_};
  return queue_send(wrs, n, bad);
}

Status Qp::queue_send(const SendWr* wrs, int n, int* bad) {
  // Held by another thread: usually a requester run that an ACK released (doorbell
  // batching leaves up to defer_max WQEs for it, megabytes at 64 KiB). It stops at its next
  // message boundary once it sees a post waiting (post_waiting), so a poster waits for one
  // message, not the whole run.
  std::unique_lock lk(send_mu_, std::try_to_lock);
  if (!lk.owns_lock()) {
    post_waiters_.fetch_add(1, std::memory_order_relaxed);
    lk.lock();
    post_waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  const QpState st = state();
  int i = 0;
  Status result;
  if (destroyed_ || st == QpState::kReset || st == QpState::kInit || st == QpState::kRtr) {
    if (bad != nullptr) *bad = 0;
    return n > 0 ? Status(Errc::kInval) : Status::ok();
  }
  for (; i < n; ++i) {
    const SendWr& wr = wrs[i];
    result = validate_send_wr(wr);
    if (!result) break;
    if (sq_.full() || sq_.size() - tm_inflight_ >= cap_.max_send_wr) {
      result = Errc::kNoMem;
      break;
    }
    SendWqe& w = sq_.tail_slot();
    w.wr_id = wr.wr_id;
    w.opcode = wr.opcode;
    w.send_flags = wr.send_flags;
    w.signaled = sq_sig_all_ || (wr.send_flags & kSendSignaled);
    w.imm_data = wr.imm_data;
    w.invalidate_rkey = wr.invalidate_rkey;
    const uint32_t m = wr_mask(type_, wr.opcode);
    if (m & kWrAtomicFieldsMask) {
      w.remote_addr = wr.atomic.remote_addr;
      w.rkey = wr.atomic.rkey;
      w.compare_add = wr.atomic.compare_add;
      w.swap = wr.atomic.swap;
    } else {
      w.remote_addr = wr.rdma.remote_addr;
      w.rkey = wr.rdma.rkey;
      w.compare_add = w.swap = 0;
    }
    if (type_ == QpType::kUd) {
      w.av = wr.ud.ah->av();
      w.remote_qpn = wr.ud.remote_qpn & kPsnMask;
      w.remote_qkey = wr.ud.remote_qkey;
    }
    w.xrc_srqn = type_ == QpType::kXrcSend ? (wr.xrc_remote_srqn & kPsnMask) : 0;
    w.bind = (m & kWrBindMask) ? wr.bind_mw : BindInfo{};
    w.flush_len = (m & kWrFlushMask) ? wr.flush.length : 0;
    w.flush_type = (m & kWrFlushMask) ? wr.flush.type : 0;
    w.flush_level = (m & kWrFlushMask) ? wr.flush.level : 0;
    w.has_operand = (m & kWrAtomicWriteMask) && wr.has_operand;
    w.operand = w.has_operand ? wr.operand : 0;
    w.length = 0;
    w.is_inline = (wr.send_flags & kSendInline) != 0;
    w.inline_len = 0;
    w.num_sge = 0;
    if (w.is_inline) {
      // The payload is copied now: the application may reuse its buffers on return.
      for (int k = 0; k < wr.num_sge; ++k) {
        const Sge& s = wr.sg_list[k];
        if (s.length != 0)
          std::memcpy(w.inline_data + w.inline_len, reinterpret_cast<const void*>(s.addr),
                      s.length);
        w.inline_len += s.length;
      }
      w.length = w.inline_len;
    } else {
      for (int k = 0; k < wr.num_sge; ++k) {
        w.sge[k] = wr.sg_list[k];
        w.length += wr.sg_list[k].length;
      }
      w.num_sge = static_cast<uint32_t>(wr.num_sge);
    }
    if (w.has_operand) w.length = 8;
    w.state = WqeState::kPosted;
    w.status = WcStatus::kSuccess;
    w.first_psn = w.last_psn = 0;
    w.offset = 0;
    w.sge_index = w.sge_offset = 0;
    for (auto& s : w.scratch) s = 0;
    w.tm_kind = 0;
    sq_.commit_push();
  }
  if (bad != nullptr) *bad = i;
  if (i > 0) {
    if (st == QpState::kSqe || st == QpState::kErr) {
      flush_sq_locked();
    } else if (TransportHooks* h = dev_->hooks()) {
      h->on_post_send(*this);
    }
  }
  return result;
}

Status Qp::post_recv(const RecvWr* wrs, int n, int* bad) {
  const Status st = queue_recv(wrs, n, bad);
  if (TransportHooks* h = dev_->hooks()) h->on_app_post(true);
  return st;
}

Status Qp::queue_recv(const RecvWr* wrs, int n, int* bad) {
  std::lock_guard lk(recv_mu_);
  const QpState st = state();
  // XRC QPs have no receive queue: the initiator receives nothing, the target's SRQs are
  // named per message.
  if (destroyed_ || st == QpState::kReset || srq_ || is_xrc(type_)) {
    if (bad != nullptr) *bad = 0;
    return n > 0 ? Status(Errc::kInval) : Status::ok();
  }
  int i = 0;
  Status result = push_recv_wrs(rq_, wrs, n, cap_.max_recv_sge, &i);
  if (bad != nullptr) *bad = i;
  if (i > 0) {
    if (st == QpState::kErr) {
      flush_rq_locked();
    } else if (TransportHooks* h = dev_->hooks()) {
      h->on_post_recv(*this);
    }
  }
  return result;
}

}  // namespace rnic::emu
