// Completion queues: every CQ is an ibv_cq_ex, so both ibv_poll_cq (ops.poll_cq) and the
// extended start/next/end_poll + read_* table (completion timestamps included) work on it.
// Hot path: op_poll_cq and the cq_ex table (no allocation, no lock beyond emu's CQ lock).
#include <ctime>
#include <cstring>

#include "verbs_shim/ops.h"
#include "emu/transport/engine.h"
#include "verbs_shim/host.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {

static_assert(static_cast<int>(emu::WcStatus::kSuccess) == IBV_WC_SUCCESS);
static_assert(static_cast<int>(emu::WcStatus::kWrFlushErr) == IBV_WC_WR_FLUSH_ERR);
static_assert(static_cast<int>(emu::WcStatus::kRemAccessErr) == IBV_WC_REM_ACCESS_ERR);
static_assert(static_cast<int>(emu::WcStatus::kRnrRetryExcErr) == IBV_WC_RNR_RETRY_EXC_ERR);
static_assert(static_cast<int>(emu::WcStatus::kTmRndvIncomplete) == IBV_WC_TM_RNDV_INCOMPLETE);
static_assert(static_cast<int>(emu::WcOpcode::kSend) == IBV_WC_SEND);
static_assert(static_cast<int>(emu::WcOpcode::kRdmaWrite) == IBV_WC_RDMA_WRITE);
static_assert(static_cast<int>(emu::WcOpcode::kRdmaRead) == IBV_WC_RDMA_READ);
static_assert(static_cast<int>(emu::WcOpcode::kCompSwap) == IBV_WC_COMP_SWAP);
static_assert(static_cast<int>(emu::WcOpcode::kFetchAdd) == IBV_WC_FETCH_ADD);
static_assert(static_cast<int>(emu::WcOpcode::kBindMw) == IBV_WC_BIND_MW);
static_assert(static_cast<int>(emu::WcOpcode::kLocalInv) == IBV_WC_LOCAL_INV);
static_assert(static_cast<int>(emu::WcOpcode::kAtomicWrite) == IBV_WC_ATOMIC_WRITE);
static_assert(static_cast<int>(emu::WcOpcode::kFlush) == compat::kWcFlush);
static_assert(static_cast<int>(emu::WcOpcode::kRecv) == IBV_WC_RECV);
static_assert(static_cast<int>(emu::WcOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<int>(emu::WcOpcode::kTmAdd) == IBV_WC_TM_ADD &&
              static_cast<int>(emu::WcOpcode::kTmDel) == IBV_WC_TM_DEL &&
              static_cast<int>(emu::WcOpcode::kTmSync) == IBV_WC_TM_SYNC &&
              static_cast<int>(emu::WcOpcode::kTmRecv) == IBV_WC_TM_RECV &&
              static_cast<int>(emu::WcOpcode::kTmNoTag) == IBV_WC_TM_NO_TAG);
static_assert(emu::kWcTmSyncReq == IBV_WC_TM_SYNC_REQ && emu::kWcTmMatch == IBV_WC_TM_MATCH &&
              emu::kWcTmDataValid == IBV_WC_TM_DATA_VALID);
static_assert(static_cast<int>(emu::WcStatus::kTmErr) == IBV_WC_TM_ERR);
static_assert(emu::kWcGrh == IBV_WC_GRH && emu::kWcWithImm == IBV_WC_WITH_IMM &&
              emu::kWcIpCsumOk == IBV_WC_IP_CSUM_OK && emu::kWcWithInv == IBV_WC_WITH_INV);

namespace {

constexpr uint64_t kSupportedWcFlags =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
    IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
    IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;

inline void to_wc(const emu::Cqe& e, ibv_wc* w) {
  w->wr_id = e.wr_id;
  w->status = static_cast<ibv_wc_status>(e.status);
  w->opcode = static_cast<ibv_wc_opcode>(e.opcode);
  w->vendor_err = e.vendor_err;
  w->byte_len = e.byte_len;
  w->imm_data = e.imm_data;  // union with invalidated_rkey
  w->qp_num = e.qp_num;
  w->src_qp = e.src_qp;
  w->wc_flags = e.wc_flags;
  w->pkey_index = e.pkey_index;
  w->slid = e.slid;
  w->sl = e.sl;
  w->dlid_path_bits = e.dlid_path_bits;
}

// ---- ibv_cq_ex table ----
int ex_next(ibv_cq_ex* cq) {
  Cq* c = to_cq(cq);
  if (c->emu_->poll(&c->cur_, 1) != 1) return ENOENT;
  cq->status = static_cast<ibv_wc_status>(c->cur_.status);
  cq->wr_id = c->cur_.wr_id;
  return 0;
}
int ex_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr != nullptr && attr->comp_mask != 0) return fail_errno(EINVAL);
  if (inherited(cq->context)) return fail_errno(EIO);
  return ex_next(cq);
}
void ex_end_poll(ibv_cq_ex*) {}
ibv_wc_opcode ex_opcode(ibv_cq_ex* cq) { return static_cast<ibv_wc_opcode>(to_cq(cq)->cur_.opcode); }
uint32_t ex_vendor_err(ibv_cq_ex* cq) { return to_cq(cq)->cur_.vendor_err; }
uint32_t ex_byte_len(ibv_cq_ex* cq) { return to_cq(cq)->cur_.byte_len; }
__be32 ex_imm_data(ibv_cq_ex* cq) { return to_cq(cq)->cur_.imm_data; }
uint32_t ex_qp_num(ibv_cq_ex* cq) { return to_cq(cq)->cur_.qp_num; }
uint32_t ex_src_qp(ibv_cq_ex* cq) { return to_cq(cq)->cur_.src_qp; }
unsigned int ex_wc_flags(ibv_cq_ex* cq) { return to_cq(cq)->cur_.wc_flags; }
uint32_t ex_slid(ibv_cq_ex* cq) { return to_cq(cq)->cur_.slid; }
uint8_t ex_sl(ibv_cq_ex* cq) { return to_cq(cq)->cur_.sl; }
uint8_t ex_dlid_path_bits(ibv_cq_ex* cq) { return to_cq(cq)->cur_.dlid_path_bits; }
// Device clock = CLOCK_MONOTONIC ns (hca_core_clock 1 GHz in query_device_ex).
uint64_t ex_completion_ts(ibv_cq_ex* cq) { return to_cq(cq)->cur_.timestamp_ns; }
uint16_t ex_cvlan(ibv_cq_ex*) { return 0; }
uint32_t ex_flow_tag(ibv_cq_ex*) { return 0; }
// Tag matching: the TMH tag and app_ctx of a completion with IBV_WC_TM_MATCH (else 0).
void ex_tm_info(ibv_cq_ex* cq, ibv_wc_tm_info* tm) {
  if (tm == nullptr) return;
  const emu::Cqe& e = to_cq(cq)->cur_;
  tm->tag = e.tm_tag;
  tm->priv = e.tm_priv;
}
uint64_t ex_wallclock_ns(ibv_cq_ex* cq) {
  timespec mono, real;
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  int64_t off = (static_cast<int64_t>(real.tv_sec) - mono.tv_sec) * 1000000000LL +
                (static_cast<int64_t>(real.tv_nsec) - mono.tv_nsec);
  return static_cast<uint64_t>(static_cast<int64_t>(to_cq(cq)->cur_.timestamp_ns) + off);
}

Cq* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector, uint64_t wc_flags) {
  Context* ctx = to_ctx(context);
  std::shared_ptr<emu::CompChannel> ech;
  if (channel != nullptr) ech = to_channel(channel)->emu_;
  auto r = ctx->emu_->create_cq(cqe, ech, comp_vector);
  if (!r.has_value()) {
    errno = err_of(r.error());
    return nullptr;
  }
  auto* c = new Cq();
  c->emu_ = std::move(r.value());
  c->emu_->user_context = c;
  c->wc_flags_ = wc_flags;
  c->emu_->set_timestamps((wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)) != 0);
  ibv_cq_ex& x = c->pub_;
  x.context = context;
  x.channel = channel;
  x.cq_context = cq_context;
  x.handle = c->emu_->handle();
  x.cqe = static_cast<int>(c->emu_->cqe());
  pthread_mutex_init(&x.mutex, nullptr);
  pthread_cond_init(&x.cond, nullptr);
  x.comp_events_completed = 0;
  x.async_events_completed = 0;
  x.comp_mask = 0;
  x.start_poll = ex_start_poll;
  x.next_poll = ex_next;
  x.end_poll = ex_end_poll;
  x.read_opcode = ex_opcode;
  x.read_vendor_err = ex_vendor_err;
  x.read_byte_len = ex_byte_len;
  x.read_imm_data = ex_imm_data;
  x.read_qp_num = ex_qp_num;
  x.read_src_qp = ex_src_qp;
  x.read_wc_flags = ex_wc_flags;
  x.read_slid = ex_slid;
  x.read_sl = ex_sl;
  x.read_dlid_path_bits = ex_dlid_path_bits;
  x.read_completion_ts = ex_completion_ts;
  x.read_cvlan = ex_cvlan;
  x.read_flow_tag = ex_flow_tag;
  x.read_tm_info = ex_tm_info;
  x.read_completion_wallclock_ns = ex_wallclock_ns;
  if (channel != nullptr) {
    pthread_mutex_lock(&context->mutex);
    ++channel->refcnt;
    pthread_mutex_unlock(&context->mutex);
  }
  return c;
}

}  // namespace

int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  if (n <= 0) return 0;
  if (cq == nullptr || wc == nullptr) return -1;
  if (inherited(cq->context)) return -1;  // the parent's CQ: never drive its socket
  Cq* c = to_cq(cq);
  emu::Cqe tmp[16];
  int done = 0;
  while (done < n) {
    int want = n - done < 16 ? n - done : 16;
    int got = c->emu_->poll(tmp, want);
    for (int i = 0; i < got; ++i) to_wc(tmp[i], &wc[done + i]);
    done += got;
    if (got < want) break;
  }
  return done;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  if (cq == nullptr) return fail_errno(EINVAL);
  if (inherited(cq->context)) return fail_errno(EIO);
  // The thread is about to wait for an event, not to poll: receive and the timers go back to
  // the progress thread now (busy-poll hand-off), else the event waits for its re-check.
  host_left_data_path(to_ctx(cq->context)->host_);
  return err_of(to_cq(cq)->emu_->req_notify(solicited_only != 0));
}

ibv_cq_ex* op_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  return guard_ptr<ibv_cq_ex>([&]() -> ibv_cq_ex* {
    if (context == nullptr || attr == nullptr) return static_cast<ibv_cq_ex*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_cq_ex*>(null_errno(EIO));
    if (attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
      return static_cast<ibv_cq_ex*>(null_errno(EINVAL));
    // IBV_CQ_INIT_ATTR_MASK_PD names a parent domain of this context; a plain PD or none
    // is EINVAL (mlx5). The CQ holds it (its dealloc is EBUSY until the CQ is destroyed).
    ibv_pd* parent = nullptr;
    if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
      parent = attr->parent_domain;
      if (!is_parent_domain(parent) || parent->context != context)
        return static_cast<ibv_cq_ex*>(null_errno(EINVAL));
    }
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
        (attr->flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)))
      return static_cast<ibv_cq_ex*>(null_errno(EOPNOTSUPP));
    if (attr->wc_flags & ~kSupportedWcFlags) return static_cast<ibv_cq_ex*>(null_errno(EOPNOTSUPP));
    if (attr->cqe > 0x7fffffffu) return static_cast<ibv_cq_ex*>(null_errno(EINVAL));
    if (attr->comp_vector > 0x7fffffffu) return static_cast<ibv_cq_ex*>(null_errno(EINVAL));
    Cq* c = create_cq_common(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                             static_cast<int>(attr->comp_vector), attr->wc_flags);
    if (c == nullptr) return nullptr;
    c->parent_domain_ = parent;
    pd_hold(parent);
    return &c->pub_;
  });
}

// ibv_modify_cq: rdma-core refuses attr_mask bits from IBV_CQ_ATTR_RESERVED up and the
// kernel an empty mask (EINVAL); a period above the device's max_cq_period is EINVAL (mlx5).
// What is honoured: emu::Cq::set_moderation (event moderation; poll is never delayed).
int op_modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr) {
  if (cq == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (inherited(cq->context)) return fail_errno(EIO);
  if (attr->attr_mask == 0 || (attr->attr_mask & ~static_cast<uint32_t>(IBV_CQ_ATTR_MODERATE)))
    return fail_errno(EINVAL);
  return guard_int([&] {
    emu::Status st = to_cq(cq)->emu_->set_moderation(attr->moderate.cq_count,
                                                     attr->moderate.cq_period);
    return st.is_ok() ? 0 : fail_errno(err_of(st));
  });
}

}  // namespace rnic::shim

SHIM_EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* context, int cqe, void* cq_context,
                                         struct ibv_comp_channel* channel, int comp_vector) {
  return guard_ptr<ibv_cq>([&]() -> ibv_cq* {
    if (context == nullptr) return static_cast<ibv_cq*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_cq*>(null_errno(EIO));
    Cq* c = create_cq_common(context, cqe, cq_context, channel, comp_vector,
                             IBV_WC_STANDARD_FLAGS);
    return c ? reinterpret_cast<ibv_cq*>(&c->pub_) : nullptr;
  });
}

SHIM_EXPORT int ibv_resize_cq(struct ibv_cq* cq, int cqe) {
  if (cq == nullptr) return fail_errno(EINVAL);
  if (inherited(cq->context)) return fail_errno(EIO);
  if (cqe < 1) return fail_errno(EINVAL);
  return guard_int([&] {
    Cq* c = to_cq(cq);
    emu::Status st = to_ctx(cq->context)->emu_->resize_cq(c->emu_, cqe);
    if (!st.is_ok()) return err_of(st);
    cq->cqe = static_cast<int>(c->emu_->cqe());
    return 0;
  });
}

SHIM_EXPORT int ibv_destroy_cq(struct ibv_cq* cq) {
  if (cq == nullptr) return fail_errno(EINVAL);
  if (inherited(cq->context)) return fail_errno(EIO);
  return guard_int([&] {
    Cq* c = to_cq(cq);
    ibv_context* context = cq->context;
    emu::Status st = to_ctx(context)->emu_->destroy_cq(c->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while QPs use it
    pd_release(c->parent_domain_);
    if (cq->channel != nullptr) {
      pthread_mutex_lock(&context->mutex);
      --cq->channel->refcnt;
      pthread_mutex_unlock(&context->mutex);
    }
    const uint32_t reported = to_ctx(context)->retire_async(&c->emu_->user_context, cq);
    wait_async_acks(&cq->mutex, &cq->cond, &cq->async_events_completed, reported);
    pthread_mutex_destroy(&cq->mutex);
    pthread_cond_destroy(&cq->cond);
    delete c;
    return 0;
  });
}
