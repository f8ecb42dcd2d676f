// Shared receive queues: create (ibv_create_srq, create_srq_ex basic and XRC), modify,
// query, destroy, and the post_srq_recv data path.
#include <cstring>
#include <type_traits>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {

static_assert(emu::kSrqMaxWr == IBV_SRQ_MAX_WR && emu::kSrqLimit == IBV_SRQ_LIMIT);

namespace {

// xrcd/cq non-null: an XRC SRQ of that domain completing into cq (both of this context).
// tm non-null: a tag-matching SRQ (IBV_SRQT_TM) completing into cq.
ibv_srq* create_srq_common(ibv_context* context, ibv_pd* pd, void* srq_context, ibv_srq_attr* attr,
                           ibv_xrcd* xrcd = nullptr, ibv_cq* cq = nullptr,
                           const ibv_tm_cap* tm = nullptr) {
  if (pd == nullptr || attr == nullptr || pd->context != context) {
    errno = EINVAL;
    return nullptr;
  }
  if (xrcd != nullptr && (xrcd->context != context || cq == nullptr || cq->context != context))
    return static_cast<ibv_srq*>(null_errno(EINVAL));
  if (tm != nullptr && (cq == nullptr || cq->context != context))
    return static_cast<ibv_srq*>(null_errno(EINVAL));
  if (inherited(context)) return static_cast<ibv_srq*>(null_errno(EIO));
  emu::TmAttr et;
  if (tm != nullptr) {
    et.enabled = true;
    et.max_num_tags = tm->max_num_tags;
    et.max_ops = tm->max_ops;
  }
  emu::SrqAttr ea;
  ea.max_wr = attr->max_wr;
  ea.max_sge = attr->max_sge;
  ea.srq_limit = attr->srq_limit;
  auto r = to_ctx(context)->emu_->create_srq(to_pd(pd)->emu_, ea,
                                             xrcd ? to_xrcd(xrcd)->emu_ : nullptr,
                                             cq ? to_cq(cq)->emu_ : nullptr, et);
  if (!r.has_value()) {
    errno = err_of(r.error());
    return nullptr;
  }
  auto* s = new Srq();
  s->emu_ = std::move(r.value());
  s->emu_->user_context = s;
  emu::SrqAttr got = s->emu_->query();
  attr->max_wr = got.max_wr;
  attr->max_sge = got.max_sge;
  ibv_srq& p = s->pub_;
  p.context = context;
  p.srq_context = srq_context;
  p.pd = pd;
  pd_hold(pd);
  p.handle = s->emu_->handle();
  pthread_mutex_init(&p.mutex, nullptr);
  pthread_cond_init(&p.cond, nullptr);
  p.events_completed = 0;
  return &p;
}

}  // namespace

int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (srq == nullptr) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  if (inherited(srq->context)) {
    if (bad) *bad = wr;
    return EIO;
  }
  Srq* s = to_srq(srq);
  return post_recv_chain(wr, bad, [s](const emu::RecvWr* w, int n, int* b) {
    return s->emu_->post_recv(w, n, b);
  });
}

ibv_srq* op_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  return guard_ptr<ibv_srq>([&]() -> ibv_srq* {
    if (context == nullptr || attr == nullptr) return static_cast<ibv_srq*>(null_errno(EINVAL));
    uint32_t mask = attr->comp_mask;
    if (mask & ~static_cast<uint32_t>(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                                      IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                                      IBV_SRQ_INIT_ATTR_TM))
      return static_cast<ibv_srq*>(null_errno(EINVAL));
    const bool xrc = (mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_XRC;
    const bool tm = (mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_TM;
    if ((mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC && !xrc && !tm)
      return static_cast<ibv_srq*>(null_errno(EINVAL));
    // A TM SRQ needs its limits and the CQ its list operations complete into (mlx5).
    if (tm && (!(mask & IBV_SRQ_INIT_ATTR_TM) || !(mask & IBV_SRQ_INIT_ATTR_CQ) ||
               attr->cq == nullptr))
      return static_cast<ibv_srq*>(null_errno(EINVAL));
    if (!(mask & IBV_SRQ_INIT_ATTR_PD)) return static_cast<ibv_srq*>(null_errno(EINVAL));
    // libibverbs ibv_cmd_create_srq_ex: an XRC SRQ needs its XRC domain and its CQ.
    if (xrc && (!(mask & IBV_SRQ_INIT_ATTR_XRCD) || !(mask & IBV_SRQ_INIT_ATTR_CQ) ||
                attr->xrcd == nullptr || attr->cq == nullptr))
      return static_cast<ibv_srq*>(null_errno(EINVAL));
    return create_srq_common(context, attr->pd, attr->srq_context, &attr->attr,
                             xrc ? attr->xrcd : nullptr, (xrc || tm) ? attr->cq : nullptr,
                             tm ? &attr->tm_cap : nullptr);
  });
}

// ibv_post_srq_ops: each op runs at once (emu::Srq::tm_post); its completion, when
// signaled or failed, is on the SRQ's CQ before this returns.
int op_post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  if (srq == nullptr) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  if (inherited(srq->context)) {
    if (bad) *bad = wr;
    return EIO;
  }
  static_assert(sizeof(emu::Sge) == sizeof(ibv_sge));
  Srq* s = to_srq(srq);
  for (ibv_ops_wr* w = wr; w != nullptr; w = w->next) {
    int err = 0;
    emu::TmOp op;
    op.wr_id = w->wr_id;
    op.flags = (w->flags & IBV_OPS_SIGNALED ? emu::kTmOpSignaled : 0) |
               (w->flags & IBV_OPS_TM_SYNC ? emu::kTmOpSync : 0);
    op.unexpected_cnt = w->tm.unexpected_cnt;
    // The opcode as an integer: an application may pass a value outside the enum.
    std::underlying_type_t<ibv_ops_wr_opcode> opc;
    std::memcpy(&opc, &w->opcode, sizeof opc);
    switch (opc) {
      case IBV_WR_TAG_ADD: op.kind = emu::TmOpKind::kAdd; break;
      case IBV_WR_TAG_DEL: op.kind = emu::TmOpKind::kDel; break;
      case IBV_WR_TAG_SYNC: op.kind = emu::TmOpKind::kSync; break;
      default: err = EINVAL; break;
    }
    if (err == 0 && (w->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC))) err = EINVAL;
    if (err == 0) {
      op.handle = w->tm.handle;
      op.recv_wr_id = w->tm.add.recv_wr_id;
      op.sg_list = reinterpret_cast<const emu::Sge*>(w->tm.add.sg_list);
      op.num_sge = w->tm.add.num_sge;
      op.tag = w->tm.add.tag;
      op.mask = w->tm.add.mask;
      err = guard_int([&] { return err_of(s->emu_->tm_post(&op)); });
    }
    if (err != 0) {
      if (bad) *bad = w;
      return err;
    }
    if (opc == IBV_WR_TAG_ADD) w->tm.handle = op.handle;
  }
  return 0;
}

int op_get_srq_num(ibv_srq* srq, uint32_t* num) {
  if (srq == nullptr || num == nullptr) return fail_errno(EINVAL);
  const auto& e = to_srq(srq)->emu_;
  if (!e->is_xrc()) return fail_errno(EOPNOTSUPP);  // SRQ numbers exist only for XRC SRQs
  *num = e->srq_num();
  return 0;
}

}  // namespace rnic::shim

SHIM_EXPORT struct ibv_srq* ibv_create_srq(struct ibv_pd* pd, struct ibv_srq_init_attr* init) {
  return guard_ptr<ibv_srq>([&]() -> ibv_srq* {
    if (pd == nullptr || init == nullptr) return static_cast<ibv_srq*>(null_errno(EINVAL));
    return create_srq_common(pd->context, pd, init->srq_context, &init->attr);
  });
}

SHIM_EXPORT int ibv_modify_srq(struct ibv_srq* srq, struct ibv_srq_attr* attr, int mask) {
  if (srq == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (inherited(srq->context)) return fail_errno(EIO);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return fail_errno(EINVAL);
  return guard_int([&] {
    emu::SrqAttr ea;
    ea.max_wr = attr->max_wr;
    ea.max_sge = attr->max_sge;
    ea.srq_limit = attr->srq_limit;
    Srq* s = to_srq(srq);
    return err_of(to_ctx(srq->context)->emu_->modify_srq(s->emu_, ea, static_cast<uint32_t>(mask)));
  });
}

SHIM_EXPORT int ibv_query_srq(struct ibv_srq* srq, struct ibv_srq_attr* attr) {
  if (srq == nullptr || attr == nullptr) return fail_errno(EINVAL);
  if (inherited(srq->context)) return fail_errno(EIO);
  return guard_int([&] {
    emu::SrqAttr got = to_srq(srq)->emu_->query();
    attr->max_wr = got.max_wr;
    attr->max_sge = got.max_sge;
    attr->srq_limit = got.srq_limit;
    return 0;
  });
}

SHIM_EXPORT int ibv_destroy_srq(struct ibv_srq* srq) {
  if (srq == nullptr) return fail_errno(EINVAL);
  if (inherited(srq->context)) return fail_errno(EIO);
  return guard_int([&] {
    Srq* s = to_srq(srq);
    emu::Status st = to_ctx(srq->context)->emu_->destroy_srq(s->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while QPs use it
    pd_release(srq->pd);
    const uint32_t reported = to_ctx(srq->context)->retire_async(&s->emu_->user_context, srq);
    wait_async_acks(&srq->mutex, &srq->cond, &srq->events_completed, reported);
    pthread_mutex_destroy(&srq->mutex);
    pthread_cond_destroy(&srq->cond);
    delete s;
    return 0;
  });
}
