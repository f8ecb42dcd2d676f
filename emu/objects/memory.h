// emu/objects/memory.h: how the engine touches registered memory. All data movement into and out of
// MRs goes through a MemAccess, so embedded mode (the app's own address space, memcpy) and
// the later daemon (another process, process_vm_readv/writev) share every check above it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace rnic::emu {

// Addresses are "host addresses": the process address the application registered (after
// translate() has mapped an iova/MW address to it). Implementations are thread-safe.
class MemAccess {
 public:
  virtual ~MemAccess() = default;
  // Copy len bytes at host_addr into dst. false = the memory could not be read.
  virtual bool read(uint64_t host_addr, void* dst, size_t len) = 0;
  // Copy len bytes from src to host_addr. false = the memory could not be written.
  virtual bool write(uint64_t host_addr, const void* src, size_t len) = 0;
  // 64-bit compare-and-swap at host_addr (REQUIRES: 8-byte aligned). Stores the value found
  // there in *original whether or not the swap happened.
  virtual bool atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                            uint64_t* original) = 0;
  // 64-bit fetch-and-add at host_addr (REQUIRES: 8-byte aligned); *original = old value.
  virtual bool atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) = 0;
  // 64-bit store (IBV_WR_ATOMIC_WRITE), atomic with respect to the other atomics.
  virtual bool atomic_write64(uint64_t host_addr, uint64_t value) = 0;
};

// Embedded mode: the registered memory is in this process. memcpy and __atomic builtins.
class DirectMemAccess final : public MemAccess {
 public:
  bool read(uint64_t host_addr, void* dst, size_t len) override;
  bool write(uint64_t host_addr, const void* src, size_t len) override;
  bool atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                    uint64_t* original) override;
  bool atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) override;
  bool atomic_write64(uint64_t host_addr, uint64_t value) override;
};

}  // namespace rnic::emu
