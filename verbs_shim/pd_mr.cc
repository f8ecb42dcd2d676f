// Protection domains, thread and parent domains, memory regions (reg/rereg/dereg, iova variants) and memory windows
// (alloc/dealloc, type-1 bind through ops.bind_mw).
#include <cstring>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace rnic::shim;

namespace rnic::shim {

static_assert(static_cast<int>(emu::MwType::kType1) == IBV_MW_TYPE_1);
static_assert(static_cast<int>(emu::MwType::kType2) == IBV_MW_TYPE_2);
static_assert(emu::kAccessLocalWrite == IBV_ACCESS_LOCAL_WRITE);
static_assert(emu::kAccessRemoteWrite == IBV_ACCESS_REMOTE_WRITE);
static_assert(emu::kAccessRemoteRead == IBV_ACCESS_REMOTE_READ);
static_assert(emu::kAccessRemoteAtomic == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(emu::kAccessMwBind == IBV_ACCESS_MW_BIND);
static_assert(emu::kAccessZeroBased == IBV_ACCESS_ZERO_BASED);
static_assert(emu::kAccessOnDemand == IBV_ACCESS_ON_DEMAND);
static_assert(emu::kAccessFlushGlobal == compat::kAccessFlushGlobal &&
              emu::kAccessFlushPersistent == compat::kAccessFlushPersistent);
static_assert(emu::kAccessRelaxedOrdering == IBV_ACCESS_RELAXED_ORDERING);
static_assert(emu::kAccessOptionalRange == IBV_ACCESS_OPTIONAL_RANGE);
static_assert(emu::kReregChangeTranslation == IBV_REREG_MR_CHANGE_TRANSLATION);
static_assert(emu::kReregChangePd == IBV_REREG_MR_CHANGE_PD);
static_assert(emu::kReregChangeAccess == IBV_REREG_MR_CHANGE_ACCESS);

namespace {

ibv_mr* reg_mr_common(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  return guard_ptr<ibv_mr>([&]() -> ibv_mr* {
    if (pd == nullptr) return static_cast<ibv_mr*>(null_errno(EINVAL));
    if (inherited(pd->context)) return static_cast<ibv_mr*>(null_errno(EIO));
    Pd* p = to_pd(pd);
    Context* ctx = to_ctx(pd->context);
    auto r = ctx->emu_->reg_mr(p->emu_, reinterpret_cast<uintptr_t>(addr), length, iova, access);
    if (!r.has_value()) return static_cast<ibv_mr*>(null_errno(err_of(r.error())));
    auto* m = new Mr();
    m->emu_ = std::move(r.value());
    m->emu_->user_context = m;
    m->pub_.context = pd->context;
    m->pub_.pd = pd;
    m->pub_.addr = addr;
    m->pub_.length = length;
    m->pub_.handle = m->emu_->handle();
    m->pub_.lkey = m->emu_->lkey();
    m->pub_.rkey = m->emu_->rkey();
    pd_hold(pd);
    file_add_mr(ctx, m);
    return &m->pub_;
  });
}

}  // namespace

ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  return guard_ptr<ibv_mw>([&]() -> ibv_mw* {
    if (pd == nullptr) return static_cast<ibv_mw*>(null_errno(EINVAL));
    if (inherited(pd->context)) return static_cast<ibv_mw*>(null_errno(EIO));
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return static_cast<ibv_mw*>(null_errno(EINVAL));
    auto r = to_ctx(pd->context)->emu_->alloc_mw(to_pd(pd)->emu_, static_cast<emu::MwType>(type));
    if (!r.has_value()) return static_cast<ibv_mw*>(null_errno(err_of(r.error())));
    auto* w = new Mw();
    w->emu_ = std::move(r.value());
    w->emu_->user_context = w;
    w->pub_.context = pd->context;
    w->pub_.pd = pd;
    w->pub_.rkey = w->emu_->rkey();
    w->pub_.handle = w->emu_->handle();
    w->pub_.type = type;
    pd_hold(pd);
    return &w->pub_;
  });
}

int op_dealloc_mw(ibv_mw* mw) {
  if (mw == nullptr) return EINVAL;
  if (inherited(mw->context)) return fail_errno(EIO);
  return guard_int([&] {
    Mw* w = to_mw(mw);
    emu::Status st = to_ctx(mw->context)->emu_->dealloc_mw(w->emu_);
    if (!st.is_ok()) return err_of(st);
    pd_release(mw->pd);
    w->emu_->user_context = nullptr;
    delete w;
    return 0;
  });
}

// ibv_bind_mw (type 1): the inline already checked type and PD; post a BIND_MW WR whose
// new key byte is ibv_inc_rkey of the current one, and publish the new rkey.
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  if (qp == nullptr || mw == nullptr || bind == nullptr) return EINVAL;
  if (inherited(qp->context)) return fail_errno(EIO);
  return guard_int([&] {
    emu::SendWr wr;
    wr.wr_id = bind->wr_id;
    wr.opcode = emu::WrOpcode::kBindMw;
    wr.send_flags = bind->send_flags;
    uint32_t new_rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.mw_rkey = mw->rkey;
    wr.bind_mw.new_rkey = new_rkey;
    wr.bind_mw.mr_lkey = bind->bind_info.mr ? bind->bind_info.mr->lkey : 0;
    wr.bind_mw.addr = bind->bind_info.addr;
    wr.bind_mw.length = bind->bind_info.length;
    wr.bind_mw.access = bind->bind_info.mw_access_flags;
    int bad = 0;
    emu::Status st = to_qp(qp)->emu_->post_send(&wr, 1, &bad);
    if (!st.is_ok()) return err_of(st);
    mw->rkey = new_rkey;
    return 0;
  });
}

// ibv_alloc_td: no attribute is defined yet (comp_mask != 0 -> EINVAL, as mlx5).
ibv_td* op_alloc_td(ibv_context* context, ibv_td_init_attr* init) {
  return guard_ptr<ibv_td>([&]() -> ibv_td* {
    if (context == nullptr || init == nullptr || init->comp_mask != 0)
      return static_cast<ibv_td*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_td*>(null_errno(EIO));
    auto* t = new Td();
    t->pub_.context = context;
    return &t->pub_;
  });
}

// ibv_dealloc_td: EBUSY while a parent domain names it (mlx5's refcount).
int op_dealloc_td(ibv_td* td) {
  if (td == nullptr) return fail_errno(EINVAL);
  if (inherited(td->context)) return fail_errno(EIO);
  Td* t = to_td(td);
  if (t->users_.load() != 0) return fail_errno(EBUSY);
  delete t;
  return 0;
}

// ibv_alloc_parent_domain: pd (a real PD of this context, not a parent domain) is required,
// td optional; the allocators and pd_context are kept and readable by the provider's
// contract, but never called: every queue buffer (SQ, RQ, CQ, SRQ rings) is engine memory
// the application never maps, so there is no buffer to place (README support table).
ibv_pd* op_alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  return guard_ptr<ibv_pd>([&]() -> ibv_pd* {
    constexpr uint32_t kKnown =
        IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if (context == nullptr || attr == nullptr || attr->pd == nullptr ||
        (attr->comp_mask & ~kKnown) != 0)
      return static_cast<ibv_pd*>(null_errno(EINVAL));
    if (attr->pd->context != context || is_parent_domain(attr->pd) ||
        (attr->td != nullptr && attr->td->context != context))
      return static_cast<ibv_pd*>(null_errno(EINVAL));
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
        (attr->alloc == nullptr || attr->free == nullptr))
      return static_cast<ibv_pd*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_pd*>(null_errno(EIO));
    Pd* base = to_pd(attr->pd);
    auto* p = new Pd();
    p->emu_ = base->emu_;
    p->parent_ = true;
    p->protection_domain_ = attr->pd;
    p->td_ = attr->td ? to_td(attr->td) : nullptr;
    p->attr_ = *attr;
    p->pub_.context = context;
    p->pub_.handle = attr->pd->handle;  // one PD handle, as the kernel sees it
    base->emu_->add_user();             // dealloc of the PD: EBUSY while this lives
    if (p->td_) p->td_->users_.fetch_add(1);
    return &p->pub_;
  });
}

// ibv_advise_mr (ibv_advise_mr(3)): flags other than IBV_ADVISE_MR_FLAG_FLUSH, no SGE or no
// PD: EINVAL; an advice other than PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT: EOPNOTSUPP;
// an lkey that is not an ODP MR of this PD (or lacks LOCAL_WRITE for PREFETCH_WRITE), a
// range outside it, or (with FLUSH) pages that cannot be faulted in: EFAULT. Without FLUSH
// the prefetch is a hint: done now, its page faults ignored.
int op_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                 uint32_t num_sge) {
  if (pd == nullptr || (flags & ~static_cast<uint32_t>(IBV_ADVISE_MR_FLAG_FLUSH)) != 0 ||
      sg_list == nullptr || num_sge == 0)
    return fail_errno(EINVAL);
  // The caller may pass any number as the enum: read its bits, not the enum (UBSan).
  uint32_t adv = 0;
  static_assert(sizeof adv == sizeof advice);
  std::memcpy(&adv, &advice, sizeof adv);
  if (adv != IBV_ADVISE_MR_ADVICE_PREFETCH && adv != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      adv != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return fail_errno(EOPNOTSUPP);
  if (inherited(pd->context)) return fail_errno(EIO);
  return guard_int([&] {
    emu::Device* dev = to_ctx(pd->context)->emu_;
    const emu::Pd* epd = to_pd(pd)->emu_.get();
    for (uint32_t i = 0; i < num_sge; ++i) {
      emu::Sge s{sg_list[i].addr, sg_list[i].length, sg_list[i].lkey};
      emu::Status st = dev->advise_mr(epd, s, adv == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                                      adv != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
                                      (flags & IBV_ADVISE_MR_FLAG_FLUSH) != 0);
      if (!st.is_ok()) return err_of(st);
    }
    return 0;
  });
}

}  // namespace rnic::shim

// ---------------------------------------------------------------------------------------
// PD.

SHIM_EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* context) {
  return guard_ptr<ibv_pd>([&]() -> ibv_pd* {
    if (context == nullptr) return static_cast<ibv_pd*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_pd*>(null_errno(EIO));
    auto r = to_ctx(context)->emu_->alloc_pd();
    if (!r.has_value()) return static_cast<ibv_pd*>(null_errno(err_of(r.error())));
    auto* p = new Pd();
    p->emu_ = std::move(r.value());
    p->emu_->user_context = p;
    p->pub_.context = context;
    p->pub_.handle = p->emu_->handle();
    file_add_pd(to_ctx(context), p);
    return &p->pub_;
  });
}

SHIM_EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  if (pd == nullptr) return EINVAL;
  if (inherited(pd->context)) return fail_errno(EIO);
  return guard_int([&] {
    Pd* p = to_pd(pd);
    if (p->import_of_ != nullptr) {  // an import: releases only it (import.cc)
      unimport_pd(p);
      return 0;
    }
    if (p->parent_) {  // a parent domain: EBUSY while objects use it
      if (p->users_.load() != 0) return EBUSY;
      p->emu_->drop_user();
      if (p->td_) p->td_->users_.fetch_sub(1);
      delete p;
      return 0;
    }
    emu::Status st = to_ctx(pd->context)->emu_->dealloc_pd(p->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while objects (or imports) use it
    file_del_pd(to_ctx(pd->context), p);
    p->emu_->user_context = nullptr;
    delete p;
    return 0;
  });
}

// ---------------------------------------------------------------------------------------
// MR.

SHIM_EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_mr_common(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                       static_cast<unsigned>(access));
}

SHIM_EXPORT struct ibv_mr* ibv_reg_mr_iova(struct ibv_pd* pd, void* addr, size_t length,
                                           uint64_t iova, int access) {
  return reg_mr_common(pd, addr, length, iova, static_cast<unsigned>(access));
}

SHIM_EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length,
                                            uint64_t iova, unsigned int access) {
  return reg_mr_common(pd, addr, length, iova, access);
}

// rdma-core's return convention: 0, or a negative ibv_rereg_mr_err_code with errno set.
SHIM_EXPORT int ibv_rereg_mr(struct ibv_mr* mr, int flags, struct ibv_pd* pd, void* addr,
                             size_t length, int access) {
  if (mr == nullptr) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr == nullptr || length == 0)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr != nullptr || length != 0)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if ((flags & IBV_REREG_MR_CHANGE_PD) && pd == nullptr) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (inherited(mr->context)) {
    errno = EIO;
    return IBV_REREG_MR_ERR_INPUT;
  }
  try {
    Mr* m = to_mr(mr);
    std::shared_ptr<emu::Pd> new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? to_pd(pd)->emu_ : nullptr;
    emu::Status st = to_ctx(mr->context)->emu_->rereg_mr(
        m->emu_, static_cast<uint32_t>(flags), new_pd, reinterpret_cast<uintptr_t>(addr), length,
        static_cast<uint32_t>(access));
    if (!st.is_ok()) {
      errno = err_of(st);
      return IBV_REREG_MR_ERR_CMD;
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) {
      pd_hold(pd);
      pd_release(mr->pd);
      mr->pd = pd;
    }
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
      mr->addr = addr;
      mr->length = length;
    }
    mr->lkey = m->emu_->lkey();
    mr->rkey = m->emu_->rkey();
    return 0;
  } catch (...) {
    errno = ENOMEM;
    return IBV_REREG_MR_ERR_CMD;
  }
}

SHIM_EXPORT int ibv_dereg_mr(struct ibv_mr* mr) {
  if (mr == nullptr) return EINVAL;
  if (inherited(mr->context)) return fail_errno(EIO);
  return guard_int([&] {
    Mr* m = to_mr(mr);
    if (m->import_of_ != nullptr) {  // an import: releases only it (import.cc)
      unimport_mr(m);
      return 0;
    }
    if (m->imports_.load() != 0) return EBUSY;  // imported on some context
    emu::Status st = to_ctx(mr->context)->emu_->dereg_mr(m->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while a MW is bound
    file_del_mr(to_ctx(mr->context), m);
    pd_release(mr->pd);
    if (m->dm_ != nullptr) m->dm_->mrs_.fetch_sub(1);
    m->emu_->user_context = nullptr;
    delete m;
    return 0;
  });
}
