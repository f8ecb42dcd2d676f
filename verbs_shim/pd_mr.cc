// Protection domains, memory regions (reg/rereg/dereg, iova variants) and memory windows
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
    return &p->pub_;
  });
}

SHIM_EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  if (pd == nullptr) return EINVAL;
  if (inherited(pd->context)) return fail_errno(EIO);
  return guard_int([&] {
    Pd* p = to_pd(pd);
    emu::Status st = to_ctx(pd->context)->emu_->dealloc_pd(p->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while objects use it
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
    if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
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
    emu::Status st = to_ctx(mr->context)->emu_->dereg_mr(m->emu_);
    if (!st.is_ok()) return err_of(st);  // EBUSY while a MW is bound
    m->emu_->user_context = nullptr;
    delete m;
    return 0;
  });
}
