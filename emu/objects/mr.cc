// emu/objects/mr.cc: memory regions, reg_mr access-flag rules, the local SGE check (§2.4) and the
// remote rkey check (§2.3) over MRs and MWs.
#include "emu/objects/mr.h"

#include <mutex>

#include "emu/objects/device.h"
#include "emu/objects/mw.h"
#include "emu/objects/pool.h"

namespace rnic::emu {

Mr::Mr(Device& dev, std::shared_ptr<Pd> pd, uint64_t host_addr, uint64_t length, uint64_t iova,
       uint32_t access)
    : dev_(&dev), pd_(std::move(pd)), host_addr_(host_addr), length_(length), iova_(iova),
      access_(access) {}

Mr::~Mr() = default;

MrView Mr::view() const {
  std::shared_lock lk(mu_);
  MrView v;
  v.pd = pd_.get();
  v.host_addr = host_addr_;
  v.iova = iova_;
  v.length = length_;
  v.access = access_;
  v.key = key_.load(std::memory_order_relaxed);
  v.state = state_;
  return v;
}

std::shared_ptr<Pd> Mr::pd() const {
  std::shared_lock lk(mu_);
  return pd_;
}

Status check_mr_access(uint32_t access) {
  constexpr uint32_t kKnown = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                              kAccessRemoteAtomic | kAccessMwBind | kAccessZeroBased |
                              kAccessOnDemand | kAccessHugetlb;
  if (access & ~(kKnown | kAccessOptionalRange)) return Errc::kInval;
  // ibv_reg_mr(3): REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE (IBA C10-?; the
  // kernel's ib_check_mr_access returns EINVAL).
  if ((access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(access & kAccessLocalWrite))
    return Errc::kInval;
  if (access & kAccessOnDemand) return Errc::kOpNotSupp;
  // ZERO_BASED is for MWs (and ibv_reg_mr_iova expresses it for MRs): refused on reg_mr.
  if (access & kAccessZeroBased) return Errc::kInval;
  return Status::ok();
}

WcStatus check_local(const KeyTable& keys, const Sge& sge, const Pd* pd, bool need_write,
                     ErrorsMode mode, uint64_t* host_addr) {
  // A zero-length SGE touches nothing; rxe skips it too.
  if (sge.length == 0) {
    if (host_addr != nullptr) *host_addr = 0;
    return WcStatus::kSuccess;
  }
  std::shared_ptr<Mr> mr = keys.find_mr(sge.lkey);
  if (!mr) {
    // Unknown/stale lkey: the spec says L_Key violation (LOC_PROT); rxe says LOC_QP_OP.
    return mode == ErrorsMode::kRxe ? WcStatus::kLocQpOpErr : WcStatus::kLocProtErr;
  }
  MrView v = mr->view();
  if (v.state != MrState::kValid || v.key != sge.lkey) return WcStatus::kLocProtErr;
  if (v.pd != pd) return WcStatus::kLocProtErr;                        // PD mismatch
  if (need_write && !(v.access & kAccessLocalWrite)) return WcStatus::kLocProtErr;
  if (!v.in_range(sge.addr, sge.length)) return WcStatus::kLocProtErr;  // bounds (S09)
  if (host_addr != nullptr) *host_addr = v.translate(sge.addr);
  return WcStatus::kSuccess;
}

RkeyResult check_remote(const KeyTable& keys, uint32_t rkey, const Pd* qp_pd, uint32_t qpn,
                        uint64_t va, uint64_t len, uint32_t required, RemoteTarget* out) {
  const bool atomic = (required & kAccessRemoteAtomic) != 0;
  // C9-88: a zero-length READ/WRITE checks no key and touches nothing.
  if (len == 0 && !atomic) {
    if (out != nullptr) {
      out->mr.reset();
      out->host_addr = 0;
    }
    return RkeyResult::kOk;
  }
  std::shared_ptr<Mr> mr;
  uint64_t iova = va;
  if (keys.secure() ? keys.kind_of(rkey) == KeyKind::kMw : KeyTable::key_index_is_mw(rkey)) {
    // MW path (rxe_lookup_mw + rxe_check_mw).
    std::shared_ptr<Mw> mw = keys.find_mw(rkey);
    if (!mw) return RkeyResult::kBadKey;
    MwView w = mw->view();
    if (w.rkey != rkey) return RkeyResult::kBadKey;
    if (w.pd != qp_pd) return RkeyResult::kPdMismatch;
    if (w.type == MwType::kType2 && w.qpn != qpn) return RkeyResult::kMwWrongQp;
    if (w.state != MwState::kValid || w.length == 0 || !w.mr) return RkeyResult::kMwUnbound;
    if ((w.access & required) != required) return RkeyResult::kAccessDenied;
    // Window range: a zero-based window takes offsets from 0; otherwise VAs.
    uint64_t base = w.zero_based ? 0 : w.addr;
    if (!(va >= base && len <= w.length && va - base <= w.length - len))
      return RkeyResult::kOutOfRange;
    iova = w.zero_based ? w.addr + va : va;
    mr = std::move(w.mr);
  } else {
    mr = keys.find_mr(rkey);
    if (!mr) return RkeyResult::kBadKey;
    MrView v = mr->view();
    if (v.key != rkey) return RkeyResult::kBadKey;
    if (v.pd != qp_pd) return RkeyResult::kPdMismatch;
    if ((v.access & required) != required) return RkeyResult::kAccessDenied;
  }
  MrView v = mr->view();
  if (v.state != MrState::kValid) return RkeyResult::kInvalidState;
  if (!v.in_range(iova, len)) return RkeyResult::kOutOfRange;
  if (atomic && (iova & 7) != 0) return RkeyResult::kMisaligned;
  if (out != nullptr) {
    out->host_addr = v.translate(iova);
    out->mr = std::move(mr);
  }
  return RkeyResult::kOk;
}

}  // namespace rnic::emu
