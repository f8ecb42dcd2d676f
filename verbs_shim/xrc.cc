// XRC domains and XRC target QP handles: ibv_open_xrcd / ibv_close_xrcd (shared by file within
// the process, with the kernel's O_CREAT / O_EXCL rules) and ibv_open_qp. The XRC SRQ and
// the XRC_SEND / XRC_RECV QPs themselves are created in srq.cc and qp.cc.
#include <fcntl.h>
#include <sys/stat.h>

#include "verbs_shim/ops.h"
#include "verbs_shim/shim.h"

namespace rnic::shim {

void xrc_tgt_handle_add(Context* ctx, const emu::Qp* qp) {
  std::lock_guard lk(ctx->xrc_mu_);
  ++ctx->tgt_handles_[qp];
}

bool xrc_tgt_handle_drop(Context* ctx, const emu::Qp* qp) {
  std::lock_guard lk(ctx->xrc_mu_);
  auto it = ctx->tgt_handles_.find(qp);
  if (it == ctx->tgt_handles_.end() || it->second <= 1) {
    if (it != ctx->tgt_handles_.end()) ctx->tgt_handles_.erase(it);
    return true;
  }
  --it->second;
  return false;
}

// ib_uverbs_open_xrcd: with an fd, the domain of that file's inode is shared; none yet needs
// O_CREAT (else EAGAIN), one already there refuses O_EXCL (EINVAL). fd -1: a private domain.
// libibverbs ibv_cmd_open_xrcd: unknown comp_mask bits EOPNOTSUPP, FD and OFLAGS required.
ibv_xrcd* op_open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  return guard_ptr<ibv_xrcd>([&]() -> ibv_xrcd* {
    if (context == nullptr || attr == nullptr) return static_cast<ibv_xrcd*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_xrcd*>(null_errno(EIO));
    if (attr->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED)
      return static_cast<ibv_xrcd*>(null_errno(EOPNOTSUPP));
    if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
      return static_cast<ibv_xrcd*>(null_errno(EINVAL));
    Context* c = to_ctx(context);
    std::lock_guard lk(c->xrc_mu_);
    std::shared_ptr<emu::Xrcd> x;
    struct stat st{};
    const bool by_file = attr->fd != -1;
    Context::XrcdShare* share = nullptr;
    if (by_file) {
      if (fstat(attr->fd, &st) != 0) return static_cast<ibv_xrcd*>(null_errno(EBADF));
      auto& by_ino = c->xrcd_by_file_[static_cast<uint64_t>(st.st_dev)];
      auto it = by_ino.find(static_cast<uint64_t>(st.st_ino));
      if (it == by_ino.end()) {
        if (!(attr->oflags & O_CREAT)) return static_cast<ibv_xrcd*>(null_errno(EAGAIN));
      } else {
        if (attr->oflags & O_EXCL) return static_cast<ibv_xrcd*>(null_errno(EINVAL));
        share = &it->second;
        x = share->xrcd;
      }
    }
    if (!x) {
      auto r = c->emu_->alloc_xrcd();
      if (!r.has_value()) return static_cast<ibv_xrcd*>(null_errno(err_of(r.error())));
      x = std::move(r.value());
      if (by_file) {
        share = &c->xrcd_by_file_[static_cast<uint64_t>(st.st_dev)]
                                 [static_cast<uint64_t>(st.st_ino)];
        share->xrcd = x;
      }
    }
    if (share != nullptr) ++share->opens;
    auto* h = new Xrcd();
    h->pub_.context = context;
    h->comp_mask_ = 0;
    h->handle_ = x->handle();
    h->emu_ = std::move(x);
    h->by_file_ = by_file;
    h->dev_ = static_cast<uint64_t>(st.st_dev);
    h->ino_ = static_cast<uint64_t>(st.st_ino);
    return &h->pub_;
  });
}

// The last handle of a domain frees it: EBUSY while XRC SRQs or target QPs use it.
int op_close_xrcd(ibv_xrcd* xrcd) {
  if (xrcd == nullptr) return fail_errno(EINVAL);
  if (inherited(xrcd->context)) return fail_errno(EIO);
  return guard_int([&] {
    Xrcd* h = to_xrcd(xrcd);
    Context* c = to_ctx(xrcd->context);
    std::lock_guard lk(c->xrc_mu_);
    Context::XrcdShare* share = nullptr;
    if (h->by_file_) {
      auto d = c->xrcd_by_file_.find(h->dev_);
      if (d != c->xrcd_by_file_.end()) {
        auto i = d->second.find(h->ino_);
        if (i != d->second.end()) share = &i->second;
      }
    }
    if (share != nullptr && share->opens > 1) {
      --share->opens;
      delete h;
      return 0;
    }
    emu::Status st = c->emu_->dealloc_xrcd(h->emu_);
    if (!st.is_ok()) return err_of(st);
    if (share != nullptr) c->xrcd_by_file_[h->dev_].erase(h->ino_);
    delete h;
    return 0;
  });
}

// ibv_open_qp: another handle on an XRC target QP of the given domain (libibverbs
// ibv_cmd_open_qp: unknown comp_mask bits EOPNOTSUPP; XRCD, NUM and TYPE required; the kernel:
// the QP must be an XRC_RECV QP of that domain, else EINVAL).
ibv_qp* op_open_qp(ibv_context* context, ibv_qp_open_attr* attr) {
  return guard_ptr<ibv_qp>([&]() -> ibv_qp* {
    if (context == nullptr || attr == nullptr) return static_cast<ibv_qp*>(null_errno(EINVAL));
    if (inherited(context)) return static_cast<ibv_qp*>(null_errno(EIO));
    if (attr->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED)
      return static_cast<ibv_qp*>(null_errno(EOPNOTSUPP));
    if (!(attr->comp_mask & IBV_QP_OPEN_ATTR_XRCD) || !(attr->comp_mask & IBV_QP_OPEN_ATTR_NUM) ||
        !(attr->comp_mask & IBV_QP_OPEN_ATTR_TYPE))
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    if (attr->xrcd == nullptr || attr->xrcd->context != context ||
        attr->qp_type != IBV_QPT_XRC_RECV)
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    Context* c = to_ctx(context);
    std::shared_ptr<emu::Qp> e = c->emu_->find_qp(attr->qp_num);
    if (!e || e->type() != emu::QpType::kXrcRecv || e->xrcd() != to_xrcd(attr->xrcd)->emu_)
      return static_cast<ibv_qp*>(null_errno(EINVAL));
    auto* q = new Qp();
    q->emu_ = std::move(e);
    ibv_qp& b = q->pub_.qp_base;
    b.context = context;
    b.qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : nullptr;
    b.pd = nullptr;
    b.send_cq = b.recv_cq = nullptr;
    b.srq = nullptr;
    b.handle = q->emu_->qpn();
    b.qp_num = q->emu_->qpn();
    b.state = static_cast<ibv_qp_state>(q->emu_->state());
    b.qp_type = IBV_QPT_XRC_RECV;
    pthread_mutex_init(&b.mutex, nullptr);
    pthread_cond_init(&b.cond, nullptr);
    b.events_completed = 0;
    fill_qp_ex(q);
    xrc_tgt_handle_add(c, q->emu_.get());
    return &b;
  });
}

}  // namespace rnic::shim
