// FNV-1a (64-bit): the one non-cryptographic hash of the project, for seeds and for deriving
// node GUIDs. Not for anything an attacker may choose to collide.
#ifndef SOFTRNIC_BASE_HASH_H_
#define SOFTRNIC_BASE_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rnic::base {

inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

// Hashes n bytes at data, continuing from h (kFnvOffset to start).
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

inline uint64_t fnv1a64(std::string_view s, uint64_t h = kFnvOffset) {
  return fnv1a64(s.data(), s.size(), h);
}

}  // namespace rnic::base

#endif  // SOFTRNIC_BASE_HASH_H_
