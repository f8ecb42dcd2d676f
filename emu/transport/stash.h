// emu/transport/stash.h: the RC responder's out-of-sequence stash (docs/congestion.md §2): a
// device-wide pool of fixed-size packet slots, allocated once on first use, shared by the
// device's QPs (each holds at most kStashPerQp of them, indexed by PSN).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "wire/port.h"

namespace rnic::emu {

// Slots in a device's pool, and per QP (a power of two: a QP's entries are indexed by
// PSN & (kStashPerQp - 1) and lie within kStashPerQp PSNs of its expected PSN).
inline constexpr uint32_t kStashSlots = 1024;
// At least the requester's window (req.h kMaxUnackedPsns): with less, a loss early in a full
// window left the packets past the bound to a go-back (measured: most of the window cuts
// that remained at 1% loss with 256).
inline constexpr uint32_t kStashPerQp = 512;
// RoCE bytes (BTH .. ICRC) a slot holds: a 4096-byte MTU payload and every request header.
inline constexpr uint32_t kStashSlotBytes = 4096 + 128;

struct StashSlot {
  wire::RxDesc d;     // as received (buf points at bytes)
  uint32_t psn = 0;
  uint32_t len = 0;
  uint8_t bytes[kStashSlotBytes];
};

class StashPool {
 public:
  // A free slot's index, or -1 when all are taken (allocates the pool on first use).
  int32_t take() {
    std::lock_guard lk(mu_);
    if (!slots_) {
      slots_.reset(new StashSlot[kStashSlots]);
      free_.reserve(kStashSlots);
      for (uint32_t i = kStashSlots; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
    }
    if (free_.empty()) return -1;
    const int32_t i = free_.back();
    free_.pop_back();
    return i;
  }
  void give(int32_t i) {
    std::lock_guard lk(mu_);
    free_.push_back(i);
  }
  StashSlot& at(int32_t i) { return slots_[static_cast<uint32_t>(i)]; }
  uint32_t in_use() {
    std::lock_guard lk(mu_);
    return slots_ ? kStashSlots - static_cast<uint32_t>(free_.size()) : 0;
  }

 private:
  std::mutex mu_;
  std::unique_ptr<StashSlot[]> slots_;
  std::vector<int32_t> free_;
};

}  // namespace rnic::emu
