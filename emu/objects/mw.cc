// emu/objects/mw.cc: memory windows — state, bind (every check of docs/checks.md §2.4, S15),
// local and remote invalidation.
#include "emu/objects/mw.h"

#include <mutex>

#include "emu/objects/device.h"
#include "emu/objects/pool.h"

namespace rnic::emu {

void MwOps::bound_inc(Mr& mr) { mr.bound_mws_.fetch_add(1); }
void MwOps::bound_dec(Mr& mr) { mr.bound_mws_.fetch_sub(1); }

void MwOps::unbind_locked(Mw& mw) {
  if (mw.mr_) bound_dec(*mw.mr_);
  mw.mr_.reset();
  mw.addr_ = mw.length_ = 0;
  mw.access_ = 0;
  mw.zero_based_ = false;
  mw.qpn_ = 0;
}

Mw::Mw(Device& dev, std::shared_ptr<Pd> pd, MwType type)
    : dev_(&dev), pd_(std::move(pd)), type_(type),
      state_(type == MwType::kType1 ? MwState::kValid : MwState::kFree) {}

Mw::~Mw() {
  if (mr_) MwOps::bound_dec(*mr_);
}

uint32_t Mw::rkey() const {
  std::lock_guard lk(mu_);
  return rkey_;
}

MwView Mw::view() const {
  std::lock_guard lk(mu_);
  MwView v;
  v.type = type_;
  v.state = state_;
  v.rkey = rkey_;
  v.pd = pd_.get();
  v.mr = mr_;
  v.addr = addr_;
  v.length = length_;
  v.access = access_;
  v.zero_based = zero_based_;
  v.qpn = qpn_;
  return v;
}

WcStatus MwOps::bind(Device& dev, const Pd* qp_pd, uint32_t qpn, const BindInfo& b,
                     uint32_t* out_rkey) {
  constexpr WcStatus kErr = WcStatus::kMwBindErr;
  KeyTable& keys = dev.keys();
  // 1. The MW exists and the full mw_rkey matches (a stale key fails).
  std::shared_ptr<Mw> mw = keys.find_mw(b.mw_rkey);
  if (!mw) return kErr;
  // 2. With a non-zero length, the MR exists and the full lkey matches.
  std::shared_ptr<Mr> mr;
  if (b.length != 0) {
    mr = keys.find_mr(b.mr_lkey);
    if (!mr) return kErr;
  }
  // 3. Access bits are a supported subset.
  constexpr uint32_t kSupported = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                                  kAccessRemoteAtomic | kAccessMwBind | kAccessZeroBased;
  if (b.access & ~(kSupported | kAccessOptionalRange)) return kErr;
  const bool zero_based = (b.access & kAccessZeroBased) != 0;

  // Every check of docs/checks.md §2.4, run under the MW lock (twice: before and after draining).
  auto checks_locked = [&]() -> bool {
    if (mw->rkey_ != b.mw_rkey) return false;  // raced with another bind
    if (mw->type_ == MwType::kType1) {
      // 4. Type 1: VALID, and not zero-based (o10-36.2.2).
      if (mw->state_ != MwState::kValid) return false;
      if (zero_based) return false;
    } else {
      // 5. Type 2: FREE (o10-37.2.30); QP PD == MW PD (C10-72); MR and length != 0
      // (o10-37.2.40: a type 2 MW cannot be invalidated by a zero-length bind).
      if (mw->state_ != MwState::kFree) return false;
      if (qp_pd != mw->pd_.get()) return false;
      if (!mr || b.length == 0) return false;
    }
    if (mr) {
      MrView v = mr->view();
      if (v.state != MrState::kValid) return false;
      if (v.pd != mw->pd_.get()) return false;  // MR and MW in the same PD
      // 6. MR not zero-based; MR grants MW_BIND (C10-73).
      if (v.access & kAccessZeroBased) return false;
      if (!(v.access & kAccessMwBind)) return false;
      // 7. A remote-write/atomic window needs LOCAL_WRITE on the MR (C10-74).
      if ((b.access & (kAccessRemoteWrite | kAccessRemoteAtomic)) &&
          !(v.access & kAccessLocalWrite))
        return false;
      // 8. The window lies inside the MR (C10-75).
      if (zero_based) {
        if (b.length > v.length || !v.in_range(b.addr, b.length)) return false;
      } else if (!v.in_range(b.addr, b.length)) {
        return false;
      }
    }
    return true;
  };
  {
    std::lock_guard lk(mw->mu_);
    if (!checks_locked()) return kErr;
  }
  // Accesses in flight through the old binding finish before it changes (issue 10 item 3);
  // drained unlocked (an accessor reads the view under mu_), then checked again.
  GateClosed closed{mw->gate_};
  std::lock_guard lk(mw->mu_);
  if (!checks_locked()) return kErr;
  // Commit: new key byte from the application (ibv_inc_rkey), then the binding.
  Result<uint32_t> nk = keys.set_mw_key_byte(mw->rkey_, static_cast<uint8_t>(b.new_rkey));
  if (!nk) return kErr;
  mw->rkey_ = *nk;
  unbind_locked(*mw);
  if (mr) {
    bound_inc(*mr);
    mw->mr_ = std::move(mr);
    mw->addr_ = b.addr;
    mw->length_ = b.length;
    mw->access_ = b.access;
    mw->zero_based_ = zero_based;
  }
  if (mw->type_ == MwType::kType2) mw->qpn_ = qpn;
  mw->state_ = MwState::kValid;
  if (out_rkey != nullptr) *out_rkey = mw->rkey_;
  return WcStatus::kSuccess;
}

bool MwOps::invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey) {
  std::shared_ptr<Mw> mw = dev.keys().find_mw(rkey);
  if (!mw) return false;  // unknown key, or an MR (no fast-reg MRs yet)
  auto checks_locked = [&]() -> bool {
    if (mw->rkey_ != rkey) return false;
    if (mw->pd_.get() != qp_pd) return false;
    if (mw->type_ != MwType::kType2) return false;  // o10-37.2.26
    return mw->state_ == MwState::kValid;
  };
  {
    std::lock_guard lk(mw->mu_);
    if (!checks_locked()) return false;
  }
  // Accesses in flight through the window finish before it is invalidated (as bind).
  GateClosed closed{mw->gate_};
  std::lock_guard lk(mw->mu_);
  if (!checks_locked()) return false;
  unbind_locked(*mw);
  mw->state_ = MwState::kFree;
  return true;
}

WcStatus bind_mw(Device& dev, const Pd* qp_pd, uint32_t qpn, const BindInfo& bind,
                 uint32_t* out_rkey) {
  return MwOps::bind(dev, qp_pd, qpn, bind, out_rkey);
}

WcStatus local_invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey) {
  return MwOps::invalidate(dev, qp_pd, rkey) ? WcStatus::kSuccess : WcStatus::kLocQpOpErr;
}

bool remote_invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey) {
  return MwOps::invalidate(dev, qp_pd, rkey);
}

}  // namespace rnic::emu
