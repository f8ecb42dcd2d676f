// emu/objects/srq.cc: shared receive queues — post, pop, modify and the limit event.
#include "emu/objects/srq.h"

#include "emu/objects/cq.h"
#include "emu/objects/device.h"

namespace rnic::emu {

Srq::Srq(Device& dev, uint32_t handle, std::shared_ptr<Pd> pd, const SrqAttr& attr,
         std::shared_ptr<Xrcd> xrcd, std::shared_ptr<Cq> cq, const TmAttr& tm)
    : dev_(&dev), handle_(handle), pd_(std::move(pd)), xrcd_(std::move(xrcd)), cq_(std::move(cq)),
      attr_(attr), ring_(attr.max_wr), tm_(tm) {
  if (tm_.enabled) tags_.resize(tm_.max_num_tags);
  armed_ = attr.srq_limit != 0;
  relink_storage_locked();
}

Srq::~Srq() = default;

void Srq::relink_storage_locked() {
  // Each ring slot owns max_sge entries of sge_store_. After a resize the live entries have
  // moved to slots 0..count-1 carrying stale pointers: copy their SGEs into the new store.
  std::vector<Sge> store(size_t{ring_.capacity()} * attr_.max_sge);
  for (uint32_t i = 0; i < ring_.capacity(); ++i) {
    RecvWqe& w = ring_.slot(i);
    Sge* dst = store.data() + size_t{i} * attr_.max_sge;
    if (i < ring_.size() && w.sge != nullptr) {
      for (uint32_t k = 0; k < w.num_sge; ++k) dst[k] = w.sge[k];
    }
    w.sge = dst;
  }
  sge_store_.swap(store);
}

SrqAttr Srq::query() const {
  std::lock_guard lk(mu_);
  return attr_;
}

Status Srq::post_recv(const RecvWr* wrs, int n, int* bad) {
  int i = 0;
  Status st;
  {
    std::lock_guard lk(mu_);
    st = push_recv_wrs(ring_, wrs, n, attr_.max_sge, &i);
  }
  if (bad != nullptr) *bad = i;
  if (TransportHooks* h = dev_->hooks()) {
    if (i > 0) h->on_post_srq_recv(*this);
    h->on_app_post(true);
  }
  return st;
}

bool Srq::pop(RecvWqe* out, Sge* out_sges) {
  bool fire = false;
  {
    std::lock_guard lk(mu_);
    if (ring_.empty()) return false;
    RecvWqe& w = ring_.head();
    *out = w;
    for (uint32_t k = 0; k < w.num_sge; ++k) out_sges[k] = w.sge[k];
    out->sge = out_sges;
    ring_.pop();
    // IBA 10.2.9.3: when armed and the number of WQEs drops below the limit, raise
    // SRQ_LIMIT_REACHED once and disarm.
    if (armed_ && ring_.size() < attr_.srq_limit) {
      armed_ = false;
      fire = true;
    }
  }
  if (fire) {
    AsyncEvent ev;
    ev.type = EventType::kSrqLimitReached;
    ev.srq = shared_from_this();
    dev_->async_events().push(std::move(ev));
  }
  return true;
}

uint32_t Srq::count() const {
  std::lock_guard lk(mu_);
  return ring_.size();
}

Status Srq::modify(const SrqAttr& attr, uint32_t mask) {
  if (mask & ~(kSrqMaxWr | kSrqLimit)) return Errc::kInval;
  std::lock_guard lk(mu_);
  uint32_t new_max = attr_.max_wr;
  if (mask & kSrqMaxWr) {
    if (attr.max_wr == 0 || attr.max_wr > static_cast<uint32_t>(dev_->attr().max_srq_wr))
      return Errc::kInval;
    if (attr.max_wr < ring_.size()) return Errc::kInval;
    new_max = attr.max_wr;
  }
  if (mask & kSrqLimit) {
    if (attr.srq_limit > new_max) return Errc::kInval;
  }
  // Commit.
  if (mask & kSrqMaxWr && new_max != attr_.max_wr) {
    ring_.resize(new_max);
    attr_.max_wr = new_max;
    relink_storage_locked();
  }
  if (mask & kSrqLimit) {
    attr_.srq_limit = attr.srq_limit;
    armed_ = attr.srq_limit != 0;
  }
  return Status::ok();
}

Status Srq::tm_post(TmOp* op) {
  if (!tm_.enabled) return Errc::kOpNotSupp;
  Cqe c;
  c.wr_id = op->wr_id;
  bool push = (op->flags & kTmOpSignaled) != 0;
  {
    std::lock_guard lk(mu_);
    switch (op->kind) {
      case TmOpKind::kAdd: {
        if (op->num_sge <= 0 || static_cast<uint32_t>(op->num_sge) > kTmMaxSge ||
            static_cast<uint32_t>(op->num_sge) > attr_.max_sge || op->sg_list == nullptr)
          return Errc::kInval;
        if (tm_used_ >= tags_.size()) return Errc::kNoMem;
        uint32_t h = 0;
        while (tags_[h].used) ++h;
        TmTag& t = tags_[h];
        t.used = true;
        t.seq = ++tm_seq_;
        t.tag = op->tag;
        t.mask = op->mask;
        t.recv_wr_id = op->recv_wr_id;
        t.num_sge = static_cast<uint32_t>(op->num_sge);
        t.length = 0;
        for (uint32_t i = 0; i < t.num_sge; ++i) {
          t.sge[i] = op->sg_list[i];
          t.length += op->sg_list[i].length;
        }
        ++tm_used_;
        op->handle = h;
        c.opcode = WcOpcode::kTmAdd;
        break;
      }
      case TmOpKind::kDel:
        c.opcode = WcOpcode::kTmDel;
        if (op->handle < tags_.size() && tags_[op->handle].used) {
          tags_[op->handle].used = false;
          --tm_used_;
        } else {
          c.status = WcStatus::kTmErr;  // consumed by a message, or never added
          push = true;
        }
        break;
      case TmOpKind::kSync:
        c.opcode = WcOpcode::kTmSync;
        break;
      default:
        return Errc::kInval;
    }
    if ((op->flags & kTmOpSync) || op->kind == TmOpKind::kSync) sw_unexp_ = op->unexpected_cnt;
    if (op->kind == TmOpKind::kAdd && sw_unexp_ != hw_unexp_) c.wc_flags |= kWcTmSyncReq;
  }
  if (push && cq_) (void)cq_->push(c);
  return Status::ok();
}

bool Srq::tm_match(uint64_t tag, RecvWqe* out, Sge* out_sges) {
  std::lock_guard lk(mu_);
  if (!tm_.enabled || tm_used_ == 0 || sw_unexp_ != hw_unexp_) return false;
  TmTag* best = nullptr;
  for (TmTag& t : tags_) {
    if (t.used && ((t.tag ^ tag) & t.mask) == 0 && (best == nullptr || t.seq < best->seq))
      best = &t;
  }
  if (best == nullptr) return false;
  out->wr_id = best->recv_wr_id;
  out->num_sge = best->num_sge;
  out->length = best->length;
  for (uint32_t i = 0; i < best->num_sge; ++i) out_sges[i] = best->sge[i];
  out->sge = out_sges;
  best->used = false;
  --tm_used_;
  return true;
}

void Srq::tm_count_unexpected() {
  std::lock_guard lk(mu_);
  ++hw_unexp_;
}

uint32_t Srq::tm_unexpected() const {
  std::lock_guard lk(mu_);
  return hw_unexp_;
}

uint32_t Srq::tm_tags() const {
  std::lock_guard lk(mu_);
  return tm_used_;
}

bool Srq::limit_armed() const {
  std::lock_guard lk(mu_);
  return armed_;
}

}  // namespace rnic::emu
