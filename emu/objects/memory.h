// emu/objects/memory.h: how the engine touches registered memory. All data movement into and out of
// MRs goes through a MemAccess; SafeMemAccess (the device default) turns a fault on the
// registered side into a `false` return instead of a signal in the host (issue 10).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace rnic::emu {

// One piece of a batched copy: `len` bytes between registered memory at host_addr and the
// engine's own buffer `buf` (read: buf is the destination; write: buf is the source).
struct MemSeg {
  uint64_t host_addr = 0;
  void* buf = nullptr;
  size_t len = 0;
};

// Addresses are "host addresses": the process address the application registered (after
// translate() has mapped an iova/MW address to it). Implementations are thread-safe.
// A `false` return means the registered side could not be read/written (unmapped,
// PROT_NONE, read-only for a write, truncated file mapping): callers report it as a remote
// access error (responder) or a local protection error (requester/completer) and bump
// Ctr::kMemFault. The engine's own buffer must always be valid (a fault there is a bug and
// is not hidden).
class MemAccess {
 public:
  virtual ~MemAccess() = default;
  // Copy len bytes at host_addr into dst. false = the memory could not be read.
  virtual bool read(uint64_t host_addr, void* dst, size_t len) = 0;
  // Copy len bytes from src to host_addr. false = the memory could not be written.
  virtual bool write(uint64_t host_addr, const void* src, size_t len) = 0;
  // Batched forms: all segments, in order; false as soon as one fails (earlier segments
  // may have been copied). The default loops over read()/write().
  virtual bool readv(const MemSeg* segs, size_t n);
  virtual bool writev(const MemSeg* segs, size_t n);
  // 64-bit compare-and-swap at host_addr (REQUIRES: 8-byte aligned). Stores the value found
  // there in *original whether or not the swap happened.
  virtual bool atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                            uint64_t* original) = 0;
  // 64-bit fetch-and-add at host_addr (REQUIRES: 8-byte aligned); *original = old value.
  virtual bool atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) = 0;
  // 64-bit store (IBV_WR_ATOMIC_WRITE), atomic with respect to the other atomics.
  virtual bool atomic_write64(uint64_t host_addr, uint64_t value) = 0;
  // Control path (Device::reg_mr calls it): make sure the fault protection is in place.
  virtual void prepare() {}
  // Accesses refused because the memory faulted (since construction).
  virtual uint64_t faults() const { return 0; }
};

// Raw memcpy and __atomic builtins, no protection: a fault is a signal in the host. Kept for
// tests and benchmarks as the baseline; the device does not use it by default.
class DirectMemAccess final : public MemAccess {
 public:
  bool read(uint64_t host_addr, void* dst, size_t len) override;
  bool write(uint64_t host_addr, const void* src, size_t len) override;
  bool atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                    uint64_t* original) override;
  bool atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) override;
  bool atomic_write64(uint64_t host_addr, uint64_t value) override;
};

// Fault-safe access (the device default).
//  kGuarded: memcpy / __atomic inside a guarded region: a process-wide SIGSEGV/SIGBUS
//    handler (installed once, on first use, with SA_ONSTACK) recognises a fault whose
//    address lies in the registered range this thread is copying and siglongjmps back, so
//    the call returns false. Every other fault is passed to the handler that was installed
//    before ours (SA_SIGINFO or plain; SIG_DFL/SIG_IGN: the default action is restored and
//    the instruction re-faults), so the host's crash reporting is unchanged. prepare()
//    re-installs ours on top (chaining to the newcomer) if the host replaced it.
//    Cost on the fast path: one sigsetjmp without a mask save (~4 ns) per call or batch.
//  kProcessVm: copies through process_vm_readv/writev on our own pid (the kernel returns
//    EFAULT, never signals; writev refuses read-only pages). One syscall per call or batch:
//    ~0.2-0.5 us plus ~60 % slower per byte (tests/bench/mem_access_bench.cc). Atomics still
//    use the guarded path (no syscall does a 64-bit CAS on another address space).
// If the handler cannot be installed, kGuarded falls back to kProcessVm for copies and
// atomics are refused (false).
class SafeMemAccess final : public MemAccess {
 public:
  enum class Mode : uint8_t { kGuarded = 0, kProcessVm = 1 };
  explicit SafeMemAccess(Mode mode = Mode::kGuarded);

  bool read(uint64_t host_addr, void* dst, size_t len) override;
  bool write(uint64_t host_addr, const void* src, size_t len) override;
  bool readv(const MemSeg* segs, size_t n) override;
  bool writev(const MemSeg* segs, size_t n) override;
  bool atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                    uint64_t* original) override;
  bool atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) override;
  bool atomic_write64(uint64_t host_addr, uint64_t value) override;
  void prepare() override;
  uint64_t faults() const override { return faults_.load(std::memory_order_relaxed); }
  Mode mode() const { return mode_; }
  // True while the process-wide fault handler is ours (or chained to by whoever replaced it
  // last time prepare() looked).
  static bool guard_installed();

 private:
  bool fail() {
    faults_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Mode mode_;
  std::atomic<bool> guarded_;  // the handler is available (else copies use process_vm)
  std::atomic<uint64_t> faults_{0};
};

// The write freeze pin.cc holds while it moves registered pages to a memfd (pin.h): between
// begin and end, a write fault (SEGV_ACCERR) inside [lo, hi) makes the faulting thread wait in
// the fault handler until end() and retry the instruction, instead of a crash or a lost
// write. A fault raised during a freeze but handled late (after end(), or while the next freeze
// of another range is on) is retried when its address was in one of the recent freeze windows
// or its page is writable now, once per address and freeze: a repeat with no freeze since is a
// real fault and is passed on.
// One freeze at a time (the caller serialises). begin() returns false, freezing nothing, if
// the process-wide fault handler cannot be ours.
bool write_freeze_begin(uint64_t lo, uint64_t hi);
void write_freeze_end();

}  // namespace rnic::emu
