// emu/objects/memory.cc: DirectMemAccess (raw memcpy, the baseline) and SafeMemAccess — fault-safe
// access to registered memory: a guarded memcpy with a chained SIGSEGV/SIGBUS handler, or
// process_vm_readv/writev on our own pid (see memory.h for the trade-off and
// tests/bench/mem_access_bench.cc for the numbers).
#include "emu/objects/memory.h"

#include <linux/futex.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

namespace rnic::emu {

// ---------------------------------------------------------------- MemAccess defaults

bool MemAccess::readv(const MemSeg* segs, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!read(segs[i].host_addr, segs[i].buf, segs[i].len)) return false;
  return true;
}

bool MemAccess::writev(const MemSeg* segs, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!write(segs[i].host_addr, segs[i].buf, segs[i].len)) return false;
  return true;
}

// ---------------------------------------------------------------- DirectMemAccess

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

// ---------------------------------------------------------------- the fault guard

namespace {

// The guarded region a thread is in: the registered bytes [lo, lo+len) it is touching now.
struct Frame {
  sigjmp_buf jb;
  uintptr_t lo = 0;
  size_t len = 0;
};
// Not initial-exec: that would force libibverbs.so.1's whole TLS block into the static TLS
// surplus, and dlopen (pyverbs) then fails with "cannot allocate memory in static TLS
// block". Every thread that copies has touched tl_frame before it can fault in a guarded
// region, so the handler's lookup for it never allocates.
thread_local Frame* tl_frame = nullptr;

std::mutex g_install_mu;
struct sigaction g_prev_segv {};
struct sigaction g_prev_bus {};
std::atomic<bool> g_installed{false};

void on_fault(int sig, siginfo_t* si, void* uc);

bool is_ours(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) != 0 && sa.sa_sigaction == on_fault;
}

// Pass a fault that is not ours to whoever was installed before us.
void chain(int sig, siginfo_t* si, void* uc) {
  const struct sigaction& p = sig == SIGBUS ? g_prev_bus : g_prev_segv;
  if ((p.sa_flags & SA_SIGINFO) != 0) {
    if (p.sa_sigaction != nullptr && p.sa_sigaction != on_fault) {
      p.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN && p.sa_handler != nullptr) {
    p.sa_handler(sig);
    return;
  }
  // Default disposition: restore it and let the fault happen again (a hardware fault
  // re-executes the instruction; a signal sent with kill() is raised again).
  struct sigaction d {};
  d.sa_handler = SIG_DFL;
  sigemptyset(&d.sa_mask);
  sigaction(sig, &d, nullptr);
  g_installed.store(false, std::memory_order_relaxed);
  if (si == nullptr || si->si_code <= 0) raise(sig);
}

// The write freeze (memory.h): g_fz_seq is odd while [g_fz_lo, g_fz_hi) is frozen. A fault
// raised during a freeze may be handled late: after it ended, even while the next freeze (of
// another range) is on. Such a fault is retried when its address was in one of the last
// kFzRing windows or its page is writable now, at most once per address and freeze sequence:
// a second fault at the same address with no freeze since is a real one (passed on).
constexpr uint32_t kFzRing = 64;
std::atomic<uint32_t> g_fz_seq{0};
std::atomic<uintptr_t> g_fz_lo{0}, g_fz_hi{0};
std::atomic<uintptr_t> g_fz_ring_lo[kFzRing], g_fz_ring_hi[kFzRing];
std::atomic<long> g_fz_owner{0};  // the freezing thread's tid: its own faults are not waited for
thread_local uintptr_t tl_retried = 0;      // the address this thread last retried
thread_local uint32_t tl_retried_seq = 1;   // g_fz_seq when it did (odd: never matches an end)

bool in_recent_window(uintptr_t a) {
  for (uint32_t i = 0; i < kFzRing; ++i)
    if (a >= g_fz_ring_lo[i].load(std::memory_order_relaxed) &&
        a < g_fz_ring_hi[i].load(std::memory_order_relaxed))
      return true;
  return false;
}

// Whether the page of a can be written now (the kernel faults it in for writing, changing no
// byte; EFAULT/ENOMEM/EINVAL: read-only, PROT_NONE, unmapped, or a kernel before 5.14).
const uintptr_t g_page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
bool writable_now(uintptr_t a) {
  return syscall(SYS_madvise, a & ~(g_page - 1), g_page, 23 /* MADV_POPULATE_WRITE */) == 0;
}

// true: the fault was a write into a (recently) frozen range; return and retry it.
bool freeze_retry(uintptr_t a) {
  const uint32_t seq = g_fz_seq.load(std::memory_order_acquire);
  if ((seq & 1) && a >= g_fz_lo.load(std::memory_order_relaxed) &&
      a < g_fz_hi.load(std::memory_order_relaxed)) {
    if (syscall(SYS_gettid) == g_fz_owner.load(std::memory_order_relaxed)) return false;
    // Wait (async-signal-safe: futex, bounded sleeps) until the move is done.
    struct timespec ms {0, 1000000};
    while (g_fz_seq.load(std::memory_order_acquire) == seq)
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_fz_seq), FUTEX_WAIT_PRIVATE, seq, &ms,
              nullptr, 0);
    tl_retried = a;
    tl_retried_seq = g_fz_seq.load(std::memory_order_acquire);
    return true;
  }
  if (tl_retried == a && tl_retried_seq == seq) return false;  // retried, no freeze since
  if (!in_recent_window(a) && !writable_now(a)) return false;
  tl_retried = a;
  tl_retried_seq = seq;
  return true;
}

void on_fault(int sig, siginfo_t* si, void* uc) {
  if (sig == SIGSEGV && si != nullptr && si->si_code == SEGV_ACCERR &&
      freeze_retry(reinterpret_cast<uintptr_t>(si->si_addr)))
    return;
  Frame* f = tl_frame;
  if (f != nullptr && si != nullptr && si->si_code > 0) {
    const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
    if (a >= f->lo && a - f->lo < f->len) {
      tl_frame = nullptr;
      // sigsetjmp saved no mask (that would cost a syscall per copy): unblock the signal
      // the kernel blocked for this handler before jumping out of it.
      sigset_t s;
      sigemptyset(&s);
      sigaddset(&s, sig);
      pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
      siglongjmp(f->jb, 1);
    }
  }
  chain(sig, si, uc);
}

bool install_one_locked(int sig, struct sigaction* prev) {
  struct sigaction cur {};
  if (sigaction(sig, nullptr, &cur) != 0) return false;
  if (is_ours(cur)) return true;
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  *prev = cur;  // before installing: the handler may run at once
  return sigaction(sig, &sa, nullptr) == 0;
}

bool ensure_guard() {
  std::lock_guard lk(g_install_mu);
  bool ok = install_one_locked(SIGSEGV, &g_prev_segv) && install_one_locked(SIGBUS, &g_prev_bus);
  g_installed.store(ok, std::memory_order_release);
  return ok;
}

// Run f(Frame&) with faults inside the frame's current [lo, lo+len) turned into `false`.
// f sets lo/len before each touch of registered memory.
template <class F>
bool guarded(F&& f) {
  Frame fr;
  if (sigsetjmp(fr.jb, 0) != 0) {
    tl_frame = nullptr;
    return false;
  }
  tl_frame = &fr;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  f(fr);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tl_frame = nullptr;
  return true;
}

inline void arm(Frame& fr, uint64_t addr, size_t len) {
  fr.lo = static_cast<uintptr_t>(addr);
  fr.len = len;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

// ---------------------------------------------------------------- process_vm

std::atomic<pid_t> g_pid{0};

pid_t self_pid() {
  pid_t p = g_pid.load(std::memory_order_relaxed);
  if (p == 0) {
    static std::once_flag once;
    std::call_once(once, [] {
      pthread_atfork(nullptr, nullptr, [] { g_pid.store(getpid(), std::memory_order_relaxed); });
    });
    p = getpid();
    g_pid.store(p, std::memory_order_relaxed);
  }
  return p;
}

constexpr size_t kIovBatch = 64;  // < IOV_MAX

bool pvm_copy(bool to_registered, const MemSeg* segs, size_t n) {
  iovec local[kIovBatch], remote[kIovBatch];
  size_t i = 0;
  while (i < n) {
    size_t k = 0, want = 0;
    for (; i < n && k < kIovBatch; ++i) {
      if (segs[i].len == 0) continue;
      local[k] = {segs[i].buf, segs[i].len};
      remote[k] = {reinterpret_cast<void*>(segs[i].host_addr), segs[i].len};
      want += segs[i].len;
      ++k;
    }
    if (k == 0) break;
    ssize_t got = to_registered ? process_vm_writev(self_pid(), local, k, remote, k, 0)
                                : process_vm_readv(self_pid(), local, k, remote, k, 0);
    if (got < 0 || static_cast<size_t>(got) != want) return false;
  }
  return true;
}

}  // namespace

bool write_freeze_begin(uint64_t lo, uint64_t hi) {
  if (!ensure_guard()) return false;
  const uint32_t slot = (g_fz_seq.load(std::memory_order_relaxed) / 2) % kFzRing;
  // Emptied first: a handler reading the slot meanwhile sees at worst a wider window (one
  // spare retry), never a narrower one.
  g_fz_ring_hi[slot].store(0, std::memory_order_relaxed);
  g_fz_ring_lo[slot].store(static_cast<uintptr_t>(lo), std::memory_order_relaxed);
  g_fz_ring_hi[slot].store(static_cast<uintptr_t>(hi), std::memory_order_relaxed);
  g_fz_lo.store(static_cast<uintptr_t>(lo), std::memory_order_relaxed);
  g_fz_hi.store(static_cast<uintptr_t>(hi), std::memory_order_relaxed);
  g_fz_owner.store(syscall(SYS_gettid), std::memory_order_relaxed);
  g_fz_seq.fetch_add(1, std::memory_order_acq_rel);  // odd: frozen
  return true;
}

void write_freeze_end() {
  g_fz_seq.fetch_add(1, std::memory_order_acq_rel);  // even: done
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_fz_seq), FUTEX_WAKE_PRIVATE, INT32_MAX,
          nullptr, nullptr, 0);
}

// ---------------------------------------------------------------- SafeMemAccess

SafeMemAccess::SafeMemAccess(Mode mode) : mode_(mode), guarded_(ensure_guard()) {}

bool SafeMemAccess::guard_installed() { return g_installed.load(std::memory_order_acquire); }

void SafeMemAccess::prepare() { guarded_.store(ensure_guard(), std::memory_order_relaxed); }

bool SafeMemAccess::read(uint64_t host_addr, void* dst, size_t len) {
  if (len == 0) return true;
  if (mode_ == Mode::kGuarded && guarded_.load(std::memory_order_relaxed)) {
    bool ok = guarded([&](Frame& fr) {
      arm(fr, host_addr, len);
      std::memcpy(dst, reinterpret_cast<const void*>(host_addr), len);
    });
    return ok ? true : fail();
  }
  MemSeg s{host_addr, dst, len};
  return pvm_copy(false, &s, 1) ? true : fail();
}

bool SafeMemAccess::write(uint64_t host_addr, const void* src, size_t len) {
  if (len == 0) return true;
  if (mode_ == Mode::kGuarded && guarded_.load(std::memory_order_relaxed)) {
    bool ok = guarded([&](Frame& fr) {
      arm(fr, host_addr, len);
      std::memcpy(reinterpret_cast<void*>(host_addr), src, len);
    });
    return ok ? true : fail();
  }
  MemSeg s{host_addr, const_cast<void*>(src), len};
  return pvm_copy(true, &s, 1) ? true : fail();
}

bool SafeMemAccess::readv(const MemSeg* segs, size_t n) {
  if (mode_ == Mode::kGuarded && guarded_.load(std::memory_order_relaxed)) {
    bool ok = guarded([&](Frame& fr) {
      for (size_t i = 0; i < n; ++i) {
        if (segs[i].len == 0) continue;
        arm(fr, segs[i].host_addr, segs[i].len);
        std::memcpy(segs[i].buf, reinterpret_cast<const void*>(segs[i].host_addr), segs[i].len);
      }
    });
    return ok ? true : fail();
  }
  return pvm_copy(false, segs, n) ? true : fail();
}

bool SafeMemAccess::writev(const MemSeg* segs, size_t n) {
  if (mode_ == Mode::kGuarded && guarded_.load(std::memory_order_relaxed)) {
    bool ok = guarded([&](Frame& fr) {
      for (size_t i = 0; i < n; ++i) {
        if (segs[i].len == 0) continue;
        arm(fr, segs[i].host_addr, segs[i].len);
        std::memcpy(reinterpret_cast<void*>(segs[i].host_addr), segs[i].buf, segs[i].len);
      }
    });
    return ok ? true : fail();
  }
  return pvm_copy(true, segs, n) ? true : fail();
}

bool SafeMemAccess::atomic_cas64(uint64_t host_addr, uint64_t compare, uint64_t swap,
                                 uint64_t* original) {
  if (host_addr & 7) return false;
  if (!guarded_.load(std::memory_order_relaxed)) return fail();
  uint64_t found = 0;
  bool ok = guarded([&](Frame& fr) {
    arm(fr, host_addr, 8);
    uint64_t expected = compare;
    __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(host_addr), &expected, swap, false,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    found = expected;
  });
  if (!ok) return fail();
  *original = found;
  return true;
}

bool SafeMemAccess::atomic_faa64(uint64_t host_addr, uint64_t add, uint64_t* original) {
  if (host_addr & 7) return false;
  if (!guarded_.load(std::memory_order_relaxed)) return fail();
  uint64_t old = 0;
  bool ok = guarded([&](Frame& fr) {
    arm(fr, host_addr, 8);
    old = __atomic_fetch_add(reinterpret_cast<uint64_t*>(host_addr), add, __ATOMIC_SEQ_CST);
  });
  if (!ok) return fail();
  *original = old;
  return true;
}

bool SafeMemAccess::atomic_write64(uint64_t host_addr, uint64_t value) {
  if (host_addr & 7) return false;
  if (!guarded_.load(std::memory_order_relaxed)) return fail();
  bool ok = guarded([&](Frame& fr) {
    arm(fr, host_addr, 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(host_addr), value, __ATOMIC_SEQ_CST);
  });
  return ok ? true : fail();
}

}  // namespace rnic::emu
