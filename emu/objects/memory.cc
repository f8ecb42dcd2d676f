// emu/objects/memory.cc: DirectMemAccess — embedded-mode access to registered memory in this
// process (memcpy; 64-bit atomics with the __atomic builtins).
#include "emu/objects/memory.h"

#include <cstring>

namespace rnic::emu {

bool DirectMemAccess::read(uint64_t host_addr, void* dst, size_t len) {
  if (len != 0) std::memcpy(dst, reinterpret_cast<const void*>(host_addr), len);
  return true;
}

bool DirectMemAccess::write(uint64_t host_addr, const void* src, size_t len) {
  if (len != 0) std::memcpy(reinterpret_cast<void*>(host_addr), src, len);
  return true;
}

bool DirectMemAccess::atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                                   uint64_t* original) {
  if (host_addr & 7) return false;
  auto* p = reinterpret_cast<uint64_t*>(host_addr);
  uint64_t expected = compare;
  __atomic_compare_exchange_n(p, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  *original = expected;  // the value found, whether or not it was swapped
  return true;
}

bool DirectMemAccess::atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) {
  if (host_addr & 7) return false;
  *original = __atomic_fetch_add(reinterpret_cast<uint64_t*>(host_addr), add, __ATOMIC_SEQ_CST);
  return true;
}

bool DirectMemAccess::atomic_write64(uint64_t host_addr, uint64_t value) {
  if (host_addr & 7) return false;
  __atomic_store_n(reinterpret_cast<uint64_t*>(host_addr), value, __ATOMIC_SEQ_CST);
  return true;
}

}  // namespace rnic::emu
