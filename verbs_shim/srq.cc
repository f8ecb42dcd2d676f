// Shared receive queues: create (ibv_create_srq, create_srq_ex basic and XRC), modify,
// query, destroy, and the post_srq_recv data path.
#include <cstring>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

using namespace rnic::shim;

namespace rnic::shim {

static_assert(emu::kSrqMaxWr == IBV_SRQ_MAX_WR && emu::kSrqLimit == IBV_SRQ_LIMIT);

namespace {

// xrcd/cq non-null: an XRC SRQ of that domain completing into cq (both of this context).
ibv_srq* create_srq_common(ibv_context* context, ibv_pd* pd, void* srq_context, ibv_srq_attr* attr,
                           ibv_xrcd* xrcd = nullptr, ibv_cq* cq = nullptr) {
  if (pd == nullptr || attr == nullptr || pd->context != context) {
    errno = EINVAL;
    return nullptr;
  }
  if (xrcd != nullptr && (xrcd->context != context || cq == nullptr || cq->context != context))
    return static_cast<ibv_srq*>(null_errno(EINVAL));
  if (inherited(context)) return static_cast<ibv_srq*>(null_errno(EIO));
  emu::SrqAttr ea;
  ea.max_wr = attr->max_wr;
  ea.max_sge = attr->max_sge;
  ea.srq_limit = attr->srq_limit;
  auto r = to_ctx(context)->emu_->create_srq(to_pd(pd)->emu_, ea,
                                             xrcd ? to_xrcd(xrcd)->emu_ : nullptr,
                                             xrcd ? to_cq(cq)->emu_ : nullptr);
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
    if ((mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC && !xrc)
      return static_cast<ibv_srq*>(null_errno(EOPNOTSUPP));  // no tag matching
    if (!(mask & IBV_SRQ_INIT_ATTR_PD)) return static_cast<ibv_srq*>(null_errno(EINVAL));
    // libibverbs ibv_cmd_create_srq_ex: an XRC SRQ needs its XRC domain and its CQ.
    if (xrc && (!(mask & IBV_SRQ_INIT_ATTR_XRCD) || !(mask & IBV_SRQ_INIT_ATTR_CQ) ||
                attr->xrcd == nullptr || attr->cq == nullptr))
      return static_cast<ibv_srq*>(null_errno(EINVAL));
    return create_srq_common(context, attr->pd, attr->srq_context, &attr->attr,
                             xrc ? attr->xrcd : nullptr, xrc ? attr->cq : nullptr);
  });
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
