// 24-bit packet sequence number arithmetic (IBA 9.7.1): wrap-safe add, distance and compare.
// Comparisons treat a and b as within a window of 2^23 of each other (half the PSN space).
#pragma once

#include <cstdint>

namespace rnic::wire {

constexpr uint32_t kPsnMask = 0xffffff;
constexpr uint32_t kPsnWindow = 1u << 23;

// (psn + n) mod 2^24. n may be "negative" when given as a wrapped uint32_t.
constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Signed distance a - b in [-2^23, 2^23): positive when a is after b.
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) & kPsnMask;
  // Sign-extend from bit 23.
  return static_cast<int32_t>(d << 8) >> 8;
}

// Three-way compare: <0 if a before b, 0 if equal, >0 if a after b.
constexpr int psn_compare(uint32_t a, uint32_t b) {
  int32_t d = psn_diff(a, b);
  return d < 0 ? -1 : (d > 0 ? 1 : 0);
}
constexpr bool psn_lt(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_le(uint32_t a, uint32_t b) { return psn_diff(a, b) <= 0; }
constexpr bool psn_gt(uint32_t a, uint32_t b) { return psn_diff(a, b) > 0; }
constexpr bool psn_ge(uint32_t a, uint32_t b) { return psn_diff(a, b) >= 0; }

static_assert(psn_add(0xffffff, 1) == 0);
static_assert(psn_diff(0, 0xffffff) == 1);
static_assert(psn_diff(0xffffff, 0) == -1);
static_assert(psn_lt(0xfffffe, 2));

}  // namespace rnic::wire
