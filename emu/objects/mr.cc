// emu/objects/mr.cc: memory regions, reg_mr access-flag rules, the local SGE check and the
// remote rkey check over MRs and MWs (docs/checks.md §2.4, §2.3).
#include "emu/objects/mr.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "emu/objects/device.h"
#include "emu/objects/maps.h"
#include "emu/objects/mw.h"
#include "emu/objects/pool.h"
#include "emu/objects/transport_state.h"

namespace rnic::emu {

// ---------------------------------------------------------------- access gates

namespace {

// The gates this thread holds guards on (so close_and_drain does not wait for itself).
// A thread holds a few at once: one per copy in progress, the requester's GatherCache (one),
// and a receive batch's ScatterCache (up to 4 per engine whose drain the thread is in). Past
// kHeldSlots entries a thread's own guards are not recognised, which only matters if that
// thread then deregisters the object (it would wait for itself).
constexpr int kHeldSlots = 16;
struct Held {
  const AccessGate* gate;
  uint32_t n;
};
thread_local Held tl_held[kHeldSlots];
thread_local int tl_nheld = 0;

void note_enter(const AccessGate* g) {
  for (int i = 0; i < tl_nheld; ++i) {
    if (tl_held[i].gate == g) {
      ++tl_held[i].n;
      return;
    }
  }
  if (tl_nheld < kHeldSlots) tl_held[tl_nheld++] = {g, 1};
}

void note_leave(const AccessGate* g) {
  for (int i = 0; i < tl_nheld; ++i) {
    if (tl_held[i].gate == g) {
      if (--tl_held[i].n == 0) tl_held[i] = tl_held[--tl_nheld];
      return;
    }
  }
}

uint32_t held_by_me(const AccessGate* g) {
  for (int i = 0; i < tl_nheld; ++i)
    if (tl_held[i].gate == g) return tl_held[i].n;
  return 0;
}

}  // namespace

bool AccessGate::enter() {
  // Dekker pair with close_and_drain(): increment, then look at closers_ (both seq_cst), so
  // either the closer sees our count or we see it closed.
  inflight_.fetch_add(1, std::memory_order_seq_cst);
  if (closers_.load(std::memory_order_seq_cst) != 0) {
    inflight_.fetch_sub(1, std::memory_order_seq_cst);
    inflight_.notify_all();
    return false;
  }
  note_enter(this);
  return true;
}

void AccessGate::leave() {
  note_leave(this);
  inflight_.fetch_sub(1, std::memory_order_seq_cst);
  if (closers_.load(std::memory_order_seq_cst) != 0) inflight_.notify_all();
}

void AccessGate::close_and_drain() {
  closers_.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t mine = held_by_me(this);
  for (;;) {
    uint32_t v = inflight_.load(std::memory_order_seq_cst);
    if (v <= mine) return;
    inflight_.wait(v, std::memory_order_seq_cst);
  }
}

void AccessGate::reopen() { closers_.fetch_sub(1, std::memory_order_seq_cst); }

AccessGuard::AccessGuard(AccessGuard&& o) noexcept
    : gate_(std::exchange(o.gate_, nullptr)), owner_(std::move(o.owner_)) {}

AccessGuard& AccessGuard::operator=(AccessGuard&& o) noexcept {
  if (this != &o) {
    reset();
    gate_ = std::exchange(o.gate_, nullptr);
    owner_ = std::move(o.owner_);
  }
  return *this;
}

bool AccessGuard::acquire(AccessGate& gate, std::shared_ptr<void> owner) {
  reset();
  if (!gate.enter()) return false;
  gate_ = &gate;
  owner_ = std::move(owner);
  return true;
}

void AccessGuard::reset() {
  if (gate_ != nullptr) {
    gate_->leave();
    gate_ = nullptr;
  }
  owner_.reset();
}

// ---------------------------------------------------------------- Mr

Mr::Mr(Device& dev, std::shared_ptr<Pd> pd, uint64_t host_addr, uint64_t length, uint64_t iova,
       uint32_t access, std::shared_ptr<PinnedRange> pin)
    : dev_(&dev), pd_(std::move(pd)), host_addr_(host_addr), length_(length), iova_(iova),
      access_(access), pin_(std::move(pin)) {
  std::unique_lock lk(mu_);
  publish_view_locked();
}

Mr::~Mr() = default;

void Mr::publish_view_locked() {
  const uint32_t s = vseq_.load(std::memory_order_relaxed);
  vseq_.store(s + 1, std::memory_order_relaxed);
  // Release stores (no fences: TSan does not model them): a reader that loads a new word
  // (acquire) then sees the odd count, or a later one, when it reads the count again.
  const auto r = std::memory_order_release;
  vw_[0].store(reinterpret_cast<uint64_t>(pd_.get()), r);
  vw_[1].store(host_addr_, r);
  vw_[2].store(pin_ ? pin_->dev_addr(host_addr_) : host_addr_, r);
  vw_[3].store(iova_, r);
  vw_[4].store(length_, r);
  vw_[5].store(uint64_t{access_} | uint64_t{key_.load(std::memory_order_relaxed)} << 32, r);
  vw_[6].store(static_cast<uint64_t>(state_), r);
  vseq_.store(s + 2, std::memory_order_release);  // the words before even
}

MrView Mr::view() const {
  const auto r = std::memory_order_acquire;  // a plain load on x86
  for (;;) {
    const uint32_t s = vseq_.load(std::memory_order_acquire);
    if (s & 1u) {  // a writer (control path, seven stores) is in the middle
      std::this_thread::yield();  // (it may have been preempted there)
      continue;
    }
    MrView v;
    v.pd = reinterpret_cast<const Pd*>(vw_[0].load(r));
    v.host_addr = vw_[1].load(r);
    v.dev_addr = vw_[2].load(r);
    v.iova = vw_[3].load(r);
    v.length = vw_[4].load(r);
    const uint64_t w5 = vw_[5].load(r);
    const uint64_t w6 = vw_[6].load(r);
    if (vseq_.load(std::memory_order_relaxed) != s) continue;  // ordered by the acquires
    v.access = static_cast<uint32_t>(w5);
    v.key = static_cast<uint32_t>(w5 >> 32);
    v.state = static_cast<MrState>(w6);
    v.seq = s;
    return v;
  }
}

bool Mr::shadowed() const {
  std::shared_lock lk(mu_);
  return pin_ && pin_->shadowed();
}

std::shared_ptr<PinnedRange> Mr::pin() const {
  std::shared_lock lk(mu_);
  return pin_;
}

std::shared_ptr<Pd> Mr::pd() const {
  std::shared_lock lk(mu_);
  return pd_;
}

Status check_mr_access(uint32_t access) {
  constexpr uint32_t kKnown = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                              kAccessRemoteAtomic | kAccessMwBind | kAccessZeroBased |
                              kAccessOnDemand | kAccessHugetlb | kAccessFlushGlobal |
                              kAccessFlushPersistent;
  if (access & ~(kKnown | kAccessOptionalRange)) return Errc::kInval;
  // FLUSH_PERSISTENT needs persistent memory behind every page; softrnic registers ordinary
  // process memory, so it answers as rxe does for non-pmem pages: EINVAL (and the device does
  // not report IBV_DEVICE_FLUSH_PERSISTENT).
  if (access & kAccessFlushPersistent) return Errc::kInval;
  // ibv_reg_mr(3): REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE (IBA C10-?; the
  // kernel's ib_check_mr_access returns EINVAL).
  if ((access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(access & kAccessLocalWrite))
    return Errc::kInval;
  // ZERO_BASED is for MWs (and ibv_reg_mr_iova expresses it for MRs): refused on reg_mr.
  if (access & kAccessZeroBased) return Errc::kInval;
  return Status::ok();
}

bool mr_access_writable(uint32_t access) {
  return (access & (kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteAtomic |
                    kAccessMwBind)) != 0;
}

Status check_mr_range(uint64_t addr, uint64_t length, uint32_t access, uint64_t max_size) {
  if (addr + length < addr) return Errc::kInval;  // wraps (ib_umem_get: EINVAL)
  if (length > max_size) return Errc::kInval;
  const bool need_write = mr_access_writable(access);
  std::vector<Mapping> maps;
  const MapsResult r = read_mappings(addr, addr + length, kStopAtHole, &maps);
  if (!r.ok || !r.covered) return Errc::kFault;  // a hole (or NULL): EFAULT
  for (const Mapping& m : maps) {
    if ((m.prot & PROT_READ) == 0) return Errc::kFault;                // PROT_NONE (or write-only)
    if (need_write && (m.prot & PROT_WRITE) == 0) return Errc::kFault;  // read-only, write asked
  }
  return Status::ok();
}

WcStatus check_local(const KeyTable& keys, const Sge& sge, const Pd* pd, bool need_write,
                     ErrorsMode mode, uint64_t* host_addr, AccessGuard* guard,
                     std::shared_ptr<Mr>* mr_out, MrView* view_out, MrCache* cache) {
  // A zero-length SGE touches nothing; rxe skips it too.
  if (sge.length == 0) {
    if (host_addr != nullptr) *host_addr = 0;
    return WcStatus::kSuccess;
  }
  const bool cached = cache != nullptr && cache->mr && cache->key == sge.lkey;
  std::shared_ptr<Mr> mr = cached ? cache->mr : keys.find_mr(sge.lkey);
  if (!mr) {
    // Unknown/stale lkey: the spec says L_Key violation (LOC_PROT); rxe says LOC_QP_OP.
    return mode == ErrorsMode::kRxe ? WcStatus::kLocQpOpErr : WcStatus::kLocProtErr;
  }
  // Enter before reading the view: while held, dereg/rereg cannot change it.
  AccessGuard g;
  const bool entered = guard == nullptr || g.acquire(mr->gate(), mr);
  MrView v;
  if (entered) v = mr->view();
  if (!entered || v.state != MrState::kValid || v.key != sge.lkey) {
    if (cached) {  // no longer the key's MR: the table decides (MrCache)
      g.reset();
      cache->clear();
      return check_local(keys, sge, pd, need_write, mode, host_addr, guard, mr_out, view_out,
                         cache);
    }
    return WcStatus::kLocProtErr;
  }
  if (cache != nullptr && !cached) {
    cache->key = sge.lkey;
    cache->mr = mr;
  }
  if (v.pd != pd) return WcStatus::kLocProtErr;                        // PD mismatch
  if (need_write && !(v.access & kAccessLocalWrite)) return WcStatus::kLocProtErr;
  if (!v.in_range(sge.addr, sge.length)) return WcStatus::kLocProtErr;  // bounds (S09)
  if (host_addr != nullptr) *host_addr = v.translate(sge.addr);
  if (guard != nullptr) *guard = std::move(g);
  if (mr_out != nullptr) *mr_out = std::move(mr);
  if (view_out != nullptr) *view_out = v;
  return WcStatus::kSuccess;
}

RkeyResult check_remote(const KeyTable& keys, uint32_t rkey, const Pd* qp_pd, uint32_t qpn,
                        uint64_t va, uint64_t len, uint32_t required, RemoteTarget* out,
                        MrCache* cache) {
  const bool atomic = (required & kAccessRemoteAtomic) != 0;
  // C9-88: a zero-length READ/WRITE checks no key and touches nothing.
  if (len == 0 && !atomic) {
    if (out != nullptr) {
      out->guard.reset();
      out->mr.reset();
      out->host_addr = 0;
    }
    return RkeyResult::kOk;
  }
  std::shared_ptr<Mr> mr;
  uint64_t iova = va;
  // The gate of the object the key names is entered before its view is read (AccessGate):
  // the MW's on the MW path (a bound MR cannot be deregistered or rereg'd, and unbinding
  // drains the MW's gate), else the MR's. Only when the caller will copy (out != nullptr).
  AccessGuard g;
  MrView mv;
  // A remembered MR still valid under this key (MrCache) is what the table would return: the
  // MR path without the lookup (a live key names one object, so not an MW either).
  bool hit = false;
  if (cache != nullptr && cache->mr && cache->key == rkey) {
    mr = cache->mr;
    if (out == nullptr || g.acquire(mr->gate(), mr)) {
      mv = mr->view();
      hit = mv.state == MrState::kValid && mv.key == rkey;
    }
    if (!hit) {
      g.reset();
      mr.reset();
      cache->clear();
    }
  }
  const bool mw_path =
      !hit && (keys.secure() ? keys.kind_of(rkey) == KeyKind::kMw : keys.is_mw_key(rkey));
  if (hit) {
    if (mv.pd != qp_pd) return RkeyResult::kPdMismatch;
    if ((mv.access & required) != required) return RkeyResult::kAccessDenied;
  } else if (mw_path) {
    // MW path (rxe_lookup_mw + rxe_check_mw).
    std::shared_ptr<Mw> mw = keys.find_mw(rkey);
    if (!mw) return RkeyResult::kBadKey;
    if (out != nullptr && !g.acquire(mw->gate(), mw)) return RkeyResult::kInvalidState;
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
    if (out != nullptr && !g.acquire(mr->gate(), mr)) return RkeyResult::kInvalidState;
    mv = mr->view();
    if (mv.key != rkey) return RkeyResult::kBadKey;
    if (cache != nullptr && mv.state == MrState::kValid) {
      cache->key = rkey;
      cache->mr = mr;
    }
    if (mv.pd != qp_pd) return RkeyResult::kPdMismatch;
    if ((mv.access & required) != required) return RkeyResult::kAccessDenied;
  }
  // The MR path's view is the one its checks read (one read of the MR's lock, not two);
  // the MW path reads the MR the window is bound to.
  const MrView v = mw_path ? mr->view() : mv;
  if (v.state != MrState::kValid) return RkeyResult::kInvalidState;
  if (!v.in_range(iova, len)) return RkeyResult::kOutOfRange;
  if (atomic && (iova & 7) != 0) return RkeyResult::kMisaligned;
  if (out != nullptr) {
    out->guard = std::move(g);  // releases what out held before (a reused RemoteTarget)
    out->host_addr = v.translate(iova);
    out->mr = std::move(mr);
  }
  return RkeyResult::kOk;
}

}  // namespace rnic::emu
