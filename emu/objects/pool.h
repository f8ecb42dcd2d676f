// emu/objects/pool.h: the device's object tables. KeyTable issues and resolves memory keys (MR
// lkey/rkey and MW rkey); ObjectTable<T> maps a 24/32-bit number (QPN, SRQ/CQ/PD handle)
// to an object. Both are read on the per-packet path from several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "emu/objects/status.h"

namespace rnic::emu {

class Mr;
class Mw;

enum class KeyKind : uint8_t { kNone = 0, kMr = 1, kMw = 2 };

// Key layout (default mode): key = (index << 8) | key_byte, as rxe. MR indices are
// [kMinMrIndex, kMaxMrIndex], MW indices [kMinMwIndex, kMaxMwIndex], disjoint, so
// `key >> 8` alone says MR or MW (key_index_is_mw). The key byte is random and differs from
// the previous byte issued for the same index. Freed indices are reused FIFO (last), so a
// freed key stays dead as long as possible; a key that is not live is always refused.
//
// Secure mode (DeviceConfig::secure_keys): the upper 24 bits are a random "handle" instead
// of an index (no visible index; resolved through a hash map) and the low byte is random:
// 32 random bits for an MR. Live handles never collide, and a freed handle is retired and
// never reissued while it is in the retired set (the last kRetiredCap handles), so a freed
// key is refused. An MW keeps its handle across binds; only its low byte changes.
// In both modes key 0 is never issued.
//
// Thread-safety: all members may be called from any thread. Lookups take a shared lock and
// return a shared_ptr (the object cannot vanish while the caller holds it).
class KeyTable {
 public:
  static constexpr uint32_t kMinMrIndex = 0x000001;
  static constexpr uint32_t kMaxMrIndex = 0x07FFFF;
  static constexpr uint32_t kMinMwIndex = 0x080001;
  static constexpr uint32_t kMaxMwIndex = 0x0FFFFF;
  static constexpr size_t kRetiredCap = 1u << 20;
  // With a prefix (Options::prefix): live-object limits and the retired-handle cap, whose sum
  // stays under the 65535 handles of a prefix.
  static constexpr uint32_t kPrefixMaxMr = 0x7000;
  static constexpr uint32_t kPrefixMaxMw = 0x7000;
  static constexpr size_t kPrefixRetiredCap = 0x1000;
  static constexpr bool key_index_is_mw(uint32_t key) {
    return (key >> 8) >= kMinMwIndex && (key >> 8) <= kMaxMwIndex;
  }

  struct Options {
    bool secure = false;
    uint32_t max_mr = kMaxMrIndex - kMinMrIndex + 1;  // live-object limits (ENOMEM past)
    uint32_t max_mw = kMaxMwIndex - kMinMwIndex + 1;
    uint64_t seed = 0;  // 0 = seed from std::random_device; else deterministic keys
    // Non-zero (daemon hosting, DeviceConfig::slot): every key's top byte is `prefix`. MR
    // indices are prefix << 16 | [0x0001, 0x7FFF], MW indices prefix << 16 | [0x8001, 0xFFFF]
    // (at most kPrefixMaxMr / kPrefixMaxMw live), secure handles prefix << 16 | a random 16 bits.
    uint8_t prefix = 0;
  };
  explicit KeyTable(const Options& opt);
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  // Register an object and return its fresh key (ENOMEM when full).
  Result<uint32_t> add_mr(std::shared_ptr<Mr> mr);
  Result<uint32_t> add_mw(std::shared_ptr<Mw> mw);
  // Give a live MR a new random key byte (default mode) or a new handle+byte (secure mode);
  // used by rereg with CHANGE_TRANSLATION or CHANGE_PD so old keys die. Returns the new key.
  Result<uint32_t> rekey_mr(uint32_t old_key);
  // Change a live MW's low key byte (bind: the byte comes from the application). The old
  // key stops resolving at once. EINVAL if old_key is not a live MW key.
  Result<uint32_t> set_mw_key_byte(uint32_t old_key, uint8_t new_byte);
  // Drop a live key (dereg/dealloc). ENOENT if not live.
  Status remove(uint32_t key);

  // Lookups: the full 32-bit key must match a live object of that kind; else nullptr.
  std::shared_ptr<Mr> find_mr(uint32_t key) const;
  std::shared_ptr<Mw> find_mw(uint32_t key) const;
  // Which kind a live key names (kNone if not live).
  KeyKind kind_of(uint32_t key) const;

  // Drop every live key (Device::close). Retired secure handles stay retired.
  void clear();

  size_t live_mrs() const;
  size_t live_mws() const;
  bool secure() const { return opt_.secure; }
  // Whether `key` falls in this table's MW index range (default mode; key_index_is_mw for
  // a table without prefix).
  bool is_mw_key(uint32_t key) const {
    return (key >> 8) >= mw_space_.min_index && (key >> 8) <= mw_space_.max_index;
  }
  // Switch secure mode on/off. Only while no key has ever been issued (returns false after);
  // call before the table is shared with other threads (device setup).
  bool set_secure(bool on);

 private:
  struct Slot {
    uint32_t key = 0;  // live key; 0 = free
    uint8_t last_byte = 0;
    KeyKind kind = KeyKind::kNone;
    std::shared_ptr<Mr> mr;
    std::shared_ptr<Mw> mw;
  };
  struct Space {  // one index range (MR or MW) in default mode
    uint32_t min_index = 0, max_index = 0;
    uint32_t next_unused = 0;  // next never-used index
    std::deque<uint32_t> free_fifo;
    std::unordered_map<uint32_t, Slot> slots;  // index -> slot (live and dead-but-known)
    size_t live = 0;
    uint32_t limit = 0;
  };
  Result<uint32_t> add_locked(KeyKind kind, std::shared_ptr<Mr> mr, std::shared_ptr<Mw> mw);
  const Slot* find_locked(uint32_t key) const;
  Slot* find_locked(uint32_t key);
  uint8_t fresh_byte(uint8_t prev);
  uint32_t fresh_handle_locked();
  void retire_handle_locked(uint32_t handle);

  Options opt_;
  mutable std::shared_mutex mu_;
  std::mt19937_64 rng_;
  Space mr_space_, mw_space_;
  // secure mode: handle (key >> 8) -> slot
  std::unordered_map<uint32_t, Slot> secure_slots_;
  size_t secure_live_mr_ = 0, secure_live_mw_ = 0;
  std::unordered_set<uint32_t> retired_;
  std::deque<uint32_t> retired_fifo_;
};

// A thread-safe number -> object map (QPN -> Qp, handles -> Cq/Srq/Pd/Ah).
// insert_random() draws numbers at random in [lo, hi] (QPNs are not sequential, S18);
// insert_next() hands out lo, lo+1, ... (skipping live numbers).
template <class T>
class ObjectTable {
 public:
  ObjectTable(uint32_t lo, uint32_t hi, uint32_t limit, uint64_t seed)
      : lo_(lo), hi_(hi), limit_(limit), next_(lo), rng_(seed) {}

  Result<uint32_t> insert_random(std::shared_ptr<T> obj) {
    std::unique_lock lk(mu_);
    if (map_.size() >= limit_) return Errc::kNoMem;
    std::uniform_int_distribution<uint32_t> d(lo_, hi_);
    for (;;) {
      uint32_t n = d(rng_);
      if (map_.emplace(n, obj).second) return n;
    }
  }
  Result<uint32_t> insert_next(std::shared_ptr<T> obj) {
    std::unique_lock lk(mu_);
    if (map_.size() >= limit_) return Errc::kNoMem;
    for (;;) {
      uint32_t n = next_;
      next_ = (next_ >= hi_) ? lo_ : next_ + 1;
      if (map_.emplace(n, obj).second) return n;
    }
  }
  std::shared_ptr<T> find(uint32_t n) const {
    std::shared_lock lk(mu_);
    auto it = map_.find(n);
    return it == map_.end() ? nullptr : it->second;
  }
  bool erase(uint32_t n) {
    std::unique_lock lk(mu_);
    if (map_.erase(n) == 0) return false;
    gen_.fetch_add(1, std::memory_order_release);
    return true;
  }
  // Changes with every erase (and clear): a number -> object pair found under an unchanged
  // generation is still in the table. For callers that remember lookups (Engine::rx_find_qp).
  uint64_t generation() const { return gen_.load(std::memory_order_acquire); }
  size_t size() const {
    std::shared_lock lk(mu_);
    return map_.size();
  }
  // Snapshot of all live objects (control path: device close, CQ error fan-out).
  std::vector<std::shared_ptr<T>> snapshot() const {
    std::shared_lock lk(mu_);
    std::vector<std::shared_ptr<T>> v;
    v.reserve(map_.size());
    for (auto& [n, o] : map_) v.push_back(o);
    return v;
  }
  void clear() {
    std::unique_lock lk(mu_);
    map_.clear();
    gen_.fetch_add(1, std::memory_order_release);
  }

 private:
  uint32_t lo_, hi_, limit_, next_;
  std::atomic<uint64_t> gen_{0};
  mutable std::shared_mutex mu_;
  std::mt19937_64 rng_;
  std::unordered_map<uint32_t, std::shared_ptr<T>> map_;
};

}  // namespace rnic::emu
