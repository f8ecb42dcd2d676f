// emu/objects/pool.cc: KeyTable — memory key issue, lookup, rekey and retirement (default indexed
// keys and secure random keys).
#include "emu/objects/pool.h"

#include <algorithm>

namespace rnic::emu {

namespace {
// Fresh indices are preferred while fewer than this many freed indices wait for reuse; past
// it the oldest freed index is reused. Bounds memory to live + kReuseDistance slots while
// keeping a freed index out of circulation for at least kReuseDistance allocations.
constexpr size_t kReuseDistance = 1024;
}  // namespace

KeyTable::KeyTable(const Options& opt) : opt_(opt) {
  if (opt_.seed != 0) {
    rng_.seed(opt_.seed);
  } else {
    std::random_device rd;
    rng_.seed((uint64_t{rd()} << 32) ^ rd());
  }
  const uint32_t base = uint32_t{opt_.prefix} << 16;
  if (opt_.prefix != 0) {
    opt_.max_mr = std::min<uint32_t>(opt_.max_mr, kPrefixMaxMr);
    opt_.max_mw = std::min<uint32_t>(opt_.max_mw, kPrefixMaxMw);
  }
  mr_space_.min_index = opt_.prefix != 0 ? base | 0x0001 : kMinMrIndex;
  mr_space_.max_index = opt_.prefix != 0 ? base | 0x7FFF : kMaxMrIndex;
  mr_space_.next_unused = mr_space_.min_index;
  mr_space_.limit = opt_.max_mr;
  mw_space_.min_index = opt_.prefix != 0 ? base | 0x8001 : kMinMwIndex;
  mw_space_.max_index = opt_.prefix != 0 ? base | 0xFFFF : kMaxMwIndex;
  mw_space_.next_unused = mw_space_.min_index;
  mw_space_.limit = opt_.max_mw;
}

uint8_t KeyTable::fresh_byte(uint8_t prev) {
  // Uniform over the 255 values != prev.
  std::uniform_int_distribution<uint32_t> d(1, 255);
  return static_cast<uint8_t>(prev + d(rng_));
}

uint32_t KeyTable::fresh_handle_locked() {
  std::uniform_int_distribution<uint32_t> d(1, opt_.prefix != 0 ? 0xFFFF : 0xFFFFFF);
  for (;;) {
    uint32_t h = (uint32_t{opt_.prefix} << 16) | d(rng_);
    if (secure_slots_.count(h) == 0 && retired_.count(h) == 0) return h;
  }
}

void KeyTable::retire_handle_locked(uint32_t handle) {
  if (retired_.insert(handle).second) {
    retired_fifo_.push_back(handle);
    // A prefixed table has 65535 handles: live MRs + MWs + retired stay below that, so
    // fresh_handle_locked always finds a free one.
    if (retired_fifo_.size() > (opt_.prefix != 0 ? kPrefixRetiredCap : kRetiredCap)) {
      retired_.erase(retired_fifo_.front());
      retired_fifo_.pop_front();
    }
  }
}

Result<uint32_t> KeyTable::add_locked(KeyKind kind, std::shared_ptr<Mr> mr,
                                      std::shared_ptr<Mw> mw) {
  if (opt_.secure) {
    size_t& live = kind == KeyKind::kMr ? secure_live_mr_ : secure_live_mw_;
    uint32_t limit = kind == KeyKind::kMr ? opt_.max_mr : opt_.max_mw;
    if (live >= limit) return Errc::kNoMem;
    uint32_t h = fresh_handle_locked();
    Slot& s = secure_slots_[h];
    s.last_byte = static_cast<uint8_t>(rng_());
    s.key = (h << 8) | s.last_byte;
    s.kind = kind;
    s.mr = std::move(mr);
    s.mw = std::move(mw);
    ++live;
    return s.key;
  }
  Space& sp = kind == KeyKind::kMr ? mr_space_ : mw_space_;
  if (sp.live >= sp.limit) return Errc::kNoMem;
  uint32_t index;
  if ((sp.free_fifo.size() < kReuseDistance && sp.next_unused <= sp.max_index) ||
      sp.free_fifo.empty()) {
    if (sp.next_unused > sp.max_index) return Errc::kNoMem;
    index = sp.next_unused++;
  } else {
    index = sp.free_fifo.front();
    sp.free_fifo.pop_front();
  }
  Slot& s = sp.slots[index];  // new slots start with last_byte 0
  s.last_byte = fresh_byte(s.last_byte);
  s.key = (index << 8) | s.last_byte;
  s.kind = kind;
  s.mr = std::move(mr);
  s.mw = std::move(mw);
  ++sp.live;
  return s.key;
}

Result<uint32_t> KeyTable::add_mr(std::shared_ptr<Mr> mr) {
  std::unique_lock lk(mu_);
  return add_locked(KeyKind::kMr, std::move(mr), nullptr);
}

Result<uint32_t> KeyTable::add_mw(std::shared_ptr<Mw> mw) {
  std::unique_lock lk(mu_);
  return add_locked(KeyKind::kMw, nullptr, std::move(mw));
}

const KeyTable::Slot* KeyTable::find_locked(uint32_t key) const {
  if (key == 0) return nullptr;
  const Slot* s = nullptr;
  if (opt_.secure) {
    auto it = secure_slots_.find(key >> 8);
    if (it != secure_slots_.end()) s = &it->second;
  } else {
    const Space& sp = is_mw_key(key) ? mw_space_ : mr_space_;
    auto it = sp.slots.find(key >> 8);
    if (it != sp.slots.end()) s = &it->second;
  }
  if (s == nullptr || s->key != key || s->kind == KeyKind::kNone) return nullptr;
  return s;
}

KeyTable::Slot* KeyTable::find_locked(uint32_t key) {
  return const_cast<Slot*>(static_cast<const KeyTable*>(this)->find_locked(key));
}

Result<uint32_t> KeyTable::rekey_mr(uint32_t old_key) {
  std::unique_lock lk(mu_);
  Slot* s = find_locked(old_key);
  if (s == nullptr || s->kind != KeyKind::kMr) return Errc::kInval;
  if (opt_.secure) {
    Slot moved = std::move(*s);
    secure_slots_.erase(old_key >> 8);
    retire_handle_locked(old_key >> 8);
    uint32_t h = fresh_handle_locked();
    Slot& n = secure_slots_[h];
    n = std::move(moved);
    n.last_byte = static_cast<uint8_t>(rng_());
    n.key = (h << 8) | n.last_byte;
    return n.key;
  }
  s->last_byte = fresh_byte(s->last_byte);
  s->key = (old_key & ~0xFFu) | s->last_byte;
  return s->key;
}

Result<uint32_t> KeyTable::set_mw_key_byte(uint32_t old_key, uint8_t new_byte) {
  std::unique_lock lk(mu_);
  Slot* s = find_locked(old_key);
  if (s == nullptr || s->kind != KeyKind::kMw) return Errc::kInval;
  s->last_byte = new_byte;
  s->key = (old_key & ~0xFFu) | new_byte;
  return s->key;
}

Status KeyTable::remove(uint32_t key) {
  std::unique_lock lk(mu_);
  Slot* s = find_locked(key);
  if (s == nullptr) return Errc::kNoEnt;
  KeyKind kind = s->kind;
  if (opt_.secure) {
    secure_slots_.erase(key >> 8);
    retire_handle_locked(key >> 8);
    (kind == KeyKind::kMr ? secure_live_mr_ : secure_live_mw_)--;
    return Status::ok();
  }
  Space& sp = kind == KeyKind::kMr ? mr_space_ : mw_space_;
  s->key = 0;
  s->kind = KeyKind::kNone;
  s->mr.reset();
  s->mw.reset();
  sp.free_fifo.push_back(key >> 8);
  --sp.live;
  return Status::ok();
}

std::shared_ptr<Mr> KeyTable::find_mr(uint32_t key) const {
  std::shared_lock lk(mu_);
  const Slot* s = find_locked(key);
  return (s != nullptr && s->kind == KeyKind::kMr) ? s->mr : nullptr;
}

std::shared_ptr<Mw> KeyTable::find_mw(uint32_t key) const {
  std::shared_lock lk(mu_);
  const Slot* s = find_locked(key);
  return (s != nullptr && s->kind == KeyKind::kMw) ? s->mw : nullptr;
}

KeyKind KeyTable::kind_of(uint32_t key) const {
  std::shared_lock lk(mu_);
  const Slot* s = find_locked(key);
  return s == nullptr ? KeyKind::kNone : s->kind;
}

void KeyTable::clear() {
  std::unique_lock lk(mu_);
  for (auto& [h, s] : secure_slots_) retire_handle_locked(h);
  secure_slots_.clear();
  secure_live_mr_ = secure_live_mw_ = 0;
  for (Space* sp : {&mr_space_, &mw_space_}) {
    for (auto& [i, s] : sp->slots) {
      if (s.kind != KeyKind::kNone) sp->free_fifo.push_back(i);
      s.key = 0;
      s.kind = KeyKind::kNone;
      s.mr.reset();
      s.mw.reset();
    }
    sp->live = 0;
  }
}

size_t KeyTable::live_mrs() const {
  std::shared_lock lk(mu_);
  return opt_.secure ? secure_live_mr_ : mr_space_.live;
}

size_t KeyTable::live_mws() const {
  std::shared_lock lk(mu_);
  return opt_.secure ? secure_live_mw_ : mw_space_.live;
}

bool KeyTable::set_secure(bool on) {
  std::unique_lock lk(mu_);
  if (!mr_space_.slots.empty() || !mw_space_.slots.empty() || !secure_slots_.empty() ||
      !retired_.empty())
    return false;
  opt_.secure = on;
  return true;
}

}  // namespace rnic::emu
