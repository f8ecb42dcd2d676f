// emu/objects/pin.cc: shadow pinning (design, races and costs in pin.h).
#include "emu/objects/pin.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "emu/objects/maps.h"
#include "emu/objects/memory.h"

// glibc 2.35+: the offset of this thread's rseq area from the thread pointer (weak: older
// libcs have none, and then no rseq area is registered by libc).
extern "C" [[gnu::weak]] const ptrdiff_t __rseq_offset;

namespace rnic::emu {
namespace {

constexpr const char* kMemfdName = "softrnic-pin";

uint64_t page_size() {
  static const uint64_t ps = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return ps;
}

// Every mapping change here is a raw system call. A library in the process may hook the libc
// wrappers (UCX's UCM patches mmap/mremap/munmap to run its registration cache's callbacks,
// which store into the heap; sanitizers intercept them): inside a freeze such code would store
// into the frozen pages on the mover, and it must not take our moves of the application's
// pages, which keep every byte, or our own temporary and view mappings for memory events.
void* sys_mmap(uint64_t a, size_t n, int prot, int flags, int fd, uint64_t off) {
  const long r = syscall(SYS_mmap, a, n, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}
bool sys_munmap(uint64_t a, size_t n) { return syscall(SYS_munmap, a, n) == 0; }
bool sys_mprotect(uint64_t a, size_t n, int prot) { return syscall(SYS_mprotect, a, n, prot) == 0; }
bool sys_mremap_fixed(uint64_t from, size_t n, uint64_t to) {
  return syscall(SYS_mremap, from, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, to) != -1;
}
// The page copies are file I/O on the memfd, done by the kernel: a range of the application
// unmapped meanwhile is EFAULT, never a signal; bytes of a page outside any allocation are no
// sanitizer report (the page copy is deliberate, and raw system calls are not intercepted);
// and no temporary mapping of the memfd is made (populating and tearing one down cost more
// than the copy: tests/bench/pin_bench). Loops over short transfers; false on an error.
bool sys_pwrite_all(int fd, uint64_t from, size_t n, uint64_t off) {
  while (n != 0) {
    const long r = syscall(SYS_pwrite64, fd, from, n, off);
    if (r <= 0) return false;
    from += static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool sys_pread_all(int fd, uint64_t to, size_t n, uint64_t off) {
  while (n != 0) {
    const long r = syscall(SYS_pread64, fd, to, n, off);
    if (r <= 0) return false;
    to += static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return true;
}

// One mapping over the range, clipped to it.
struct Line {
  uint64_t lo = 0, hi = 0;          // clipped
  uint64_t map_lo = 0, map_hi = 0;  // the whole mapping (its /proc/self/map_files name)
  int prot = 0;
  bool shared = false;
  uint64_t off = 0;                 // file offset of lo
  uint64_t ino = 0;
  std::string path;
};

// The mappings covering [lo, hi), in order (maps.h: PROCMAP_QUERY, or /proc/self/maps parsed).
// whole: the range must be mapped without a hole (false at the first one); else every mapping
// that intersects it is listed and the result says whether the source answered.
bool read_maps(uint64_t lo, uint64_t hi, std::vector<Line>* out, bool whole, bool names) {
  std::vector<Mapping> ms;
  const MapsResult r =
      read_mappings(lo, hi, (names ? kNames : 0u) | (whole ? kStopAtHole : 0u), &ms);
  out->clear();
  if (!r.ok) return false;
  out->reserve(ms.size());
  for (Mapping& m : ms) {
    Line l;
    l.map_lo = m.lo;
    l.map_hi = m.hi;
    l.lo = m.lo > lo ? m.lo : lo;
    l.hi = m.hi < hi ? m.hi : hi;
    l.prot = m.prot;
    l.shared = m.shared;
    l.off = m.off + (l.lo - m.lo);
    l.ino = m.ino;
    l.path = std::move(m.path);
    out->push_back(std::move(l));
  }
  return whole ? r.covered : true;
}

using Backing = PinBacking;
std::atomic<uint32_t> g_backing_ids{0};

// A host range whose pages were moved into `b` at file offset `off`; refs = PinnedRanges on it.
struct Piece {
  std::shared_ptr<Backing> b;
  uint64_t lo = 0, hi = 0, off = 0;
  uint32_t refs = 0;
};

std::mutex g_mu;
std::map<uint64_t, Piece> g_pieces;  // by lo; non-overlapping
std::atomic<uint64_t> g_fork_gen{0};

// The piece a maps line shows intact (same memfd, same offset), or nullptr.
Piece* piece_of(const Line& l) {
  if (l.ino == 0 || !l.shared) return nullptr;
  auto it = g_pieces.upper_bound(l.lo);
  if (it == g_pieces.begin()) return nullptr;
  --it;
  Piece& p = it->second;
  if (l.hi > p.hi || p.b->ino != l.ino || l.off != p.off + (l.lo - p.lo)) return nullptr;
  return &p;
}

// Two moved pieces next to each other (same memfd, consecutive offsets, same protections)
// show as one maps line: cut lines at piece boundaries so each maps into one piece.
void split_at_pieces(std::vector<Line>* lines) {
  std::vector<Line> out;
  for (Line& l : *lines) {
    if (l.shared && l.ino != 0) {
      for (auto it = g_pieces.upper_bound(l.lo); it != g_pieces.end() && it->first < l.hi; ++it) {
        Line head = l;
        head.hi = it->first;
        out.push_back(head);
        l.off += it->first - l.lo;
        l.lo = it->first;
      }
    }
    out.push_back(std::move(l));
  }
  *lines = std::move(out);
}

// Private mappings whose pages can be moved: anonymous, heap, stack, named anonymous, and
// private file mappings. Not: vdso/vvar/vsyscall (kernel-special), hugetlb, device files.
bool movable(const Line& l) {
  if (l.shared || (l.prot & PROT_READ) == 0) return false;
  const std::string& p = l.path;
  if (p.empty() || p == "[heap]" || p.rfind("[anon:", 0) == 0) return true;
  // The main stack grows down from its lowest page: that page must stay the stack's.
  if (p == "[stack]") return l.lo > l.map_lo;
  if (p[0] != '/') return false;
  return p.rfind("/dev/", 0) != 0 && p.rfind("/anon_hugepage", 0) != 0 &&
         p.rfind("/memfd:", 0) != 0;
}

// Who makes a copy under a write freeze. Between the range becoming read-only and its new
// pages being in place, the thread doing it must store nothing into the range: its next
// store there would fault with nobody left to end the freeze. What is stored for it in that
// window is known: its stack (the frames of the move, below the frame of run_move), errno (a
// failing system call), its thread control block, where the kernel updates the rseq area
// when the thread is preempted (a failed update is a SIGSEGV), and whatever a signal handler
// run on it meanwhile touches. So:
//   - inline (the registering thread itself) when the range is away from this thread's stack
//     (kStackBelow under the frame of run_move, kStackAbove over it) and from the pages of its
//     errno, thread pointer and rseq area; asynchronous signals are blocked for the move (the
//     synchronous ones, SIGSEGV / SIGBUS, cannot be: a fault would then kill). No thread
//     hand-off: most registrations.
//   - otherwise (a buffer on this thread's stack, next to its TLS) on the mover, a thread of
//     ours whose stack and TLS are its own, with every asynchronous signal blocked for good.
// Both write nothing else in the window (results are stored after it), and warm_up resolved
// every call they make there (lazy binding stores into the GOT).
constexpr uint64_t kStackBelow = 256 << 10, kStackAbove = 16 << 10;

struct Mover {
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void()>* job = nullptr;  // under mu
  pid_t waiter = 0;                            // the posting thread's id, under mu
  std::atomic<uint32_t> state{0};              // futex word: kPosted, then kDone
};
constexpr uint32_t kPosted = 1, kDone = 2;
Mover* g_mover = nullptr;  // leaked: it lives as long as the process
std::atomic<uint64_t> g_moves_inline{0}, g_moves_mover{0};
std::atomic<uint64_t> g_mover_unconfirmed{0};  // jobs started without seeing the waiter asleep
std::atomic<bool> g_force_mover{false};

void warm_up() {
  const uint64_t ps = page_size();
  void* p = sys_mmap(0, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  const auto a = reinterpret_cast<uint64_t>(p);
  sys_mprotect(a, ps, PROT_READ);
  void* q = sys_mmap(0, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q != MAP_FAILED) (void)sys_mremap_fixed(reinterpret_cast<uint64_t>(q), ps, a);
  sys_munmap(a, ps);
  if (write_freeze_begin(0, 0)) write_freeze_end();
}

// The kernel's signal set (8 bytes on Linux): every signal but the synchronous fault signals.
constexpr uint64_t sig_bit(int s) { return uint64_t{1} << (s - 1); }
constexpr uint64_t kAsyncSignals =
    ~(sig_bit(SIGSEGV) | sig_bit(SIGBUS) | sig_bit(SIGILL) | sig_bit(SIGFPE) | sig_bit(SIGTRAP));
// The mover's mask for good: not glibc's internal SIGCANCEL (32) and SIGSETXID (33), which
// setuid() and friends send to every thread and wait for (blocked there, they would hang the
// process once the mover exists), nor SIGSYS (a seccomp trap blocked is a kill).
constexpr uint64_t kMoverSignals = kAsyncSignals & ~(sig_bit(32) | sig_bit(33) | sig_bit(SIGSYS));

// Runs fn(arg) with the stack pointer at top (16-byte aligned) and returns on the caller's
// stack. The frame-pointer CFI keeps backtraces through it whole.
extern "C" void softrnic_pin_call_on_stack(void* arg, void (*fn)(void*) noexcept,
                                           void* top) noexcept;
#if defined(__x86_64__)
#define SOFTRNIC_PIN_ALT_STACK 1
asm(R"(
  .text
  .p2align 4
  .globl softrnic_pin_call_on_stack
  .hidden softrnic_pin_call_on_stack
  .type softrnic_pin_call_on_stack, @function
softrnic_pin_call_on_stack:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_def_cfa_register %rbp
  movq %rdx, %rsp
  callq *%rsi
  movq %rbp, %rsp
  popq %rbp
  .cfi_restore %rbp
  .cfi_def_cfa %rsp, 8
  retq
  .cfi_endproc
  .size softrnic_pin_call_on_stack, .-softrnic_pin_call_on_stack
)");
#elif defined(__aarch64__)
#define SOFTRNIC_PIN_ALT_STACK 1
asm(R"(
  .text
  .p2align 2
  .globl softrnic_pin_call_on_stack
  .hidden softrnic_pin_call_on_stack
  .type softrnic_pin_call_on_stack, %function
softrnic_pin_call_on_stack:
  .cfi_startproc
  stp x29, x30, [sp, #-16]!
  .cfi_def_cfa_offset 16
  .cfi_offset x29, -16
  .cfi_offset x30, -8
  mov x29, sp
  .cfi_def_cfa_register x29
  mov sp, x2
  blr x1
  mov sp, x29
  .cfi_def_cfa sp, 16
  ldp x29, x30, [sp], #16
  .cfi_def_cfa_offset 0
  .cfi_restore x29
  .cfi_restore x30
  ret
  .cfi_endproc
  .size softrnic_pin_call_on_stack, .-softrnic_pin_call_on_stack
)");
#else
#define SOFTRNIC_PIN_ALT_STACK 0
#endif

std::atomic<uint32_t> g_test_waiter_pause_us{0}, g_test_freeze_hold_us{0};
std::atomic<bool> g_test_fail_mover_start{false};

void sleep_us(uint32_t us) {
  if (us == 0) return;
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  syscall(SYS_nanosleep, &ts, nullptr);
}

// The registering thread's side of a hand-off: post f, then sleep in the kernel until the mover
// is done. Between the post and the mover's wake-up it runs only this function's code on the
// wait stack and the raw futex wait, which stores nothing into its stack or thread control
// block (syscall(2) sets errno only on a failure, which comes after kDone).
void post_and_wait(void* arg) noexcept {
  Mover* m = g_mover;
  {
    std::lock_guard lk(m->mu);
    m->state.store(kPosted, std::memory_order_relaxed);
    m->job = static_cast<const std::function<void()>*>(arg);
    m->waiter = static_cast<pid_t>(syscall(SYS_gettid));
    m->cv.notify_all();
  }
  sleep_us(g_test_waiter_pause_us.load(std::memory_order_relaxed));  // tests: a slow waiter
  while (m->state.load(std::memory_order_acquire) != kDone)
    syscall(SYS_futex, &m->state, FUTEX_WAIT_PRIVATE, kPosted, nullptr, nullptr, 0);
}

// The mover's side: true once thread `tid` sleeps in the futex wait on `word`, read from
// /proc/self/task/<tid>/syscall ("202 0x<word> ..." while it is blocked there). A thread
// asleep in the kernel stores nothing into its stack, nor into its rseq area: the kernel
// updates that on the thread's return to user space after a context switch, and a failed
// update (the page frozen) is a SIGSEGV nobody can handle. The waiter returns only after
// kDone. Gives up after 200 ms (false): /proc unreadable, or a waiter held by a debugger.
bool wait_asleep(pid_t tid, const void* word) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const auto want = reinterpret_cast<uintptr_t>(word);
  bool asleep = false;
  timespec t0{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) break;
    buf[n] = '\0';
    char* end = nullptr;
    const long nr = std::strtol(buf, &end, 10);
    if (end != buf && nr == SYS_futex && std::strtoull(end, nullptr, 16) == want) {
      asleep = true;
      break;
    }
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > 200000000L) break;
    sched_yield();
  }
  ::close(fd);
  return asleep;
}

// The mover thread: takes each posted job, starts it once its waiter sleeps, wakes it after.
void* mover_main(void* arg) {
  auto* m = static_cast<Mover*>(arg);
  uint64_t block = kMoverSignals;
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, &block, nullptr, sizeof block);
  warm_up();
  std::unique_lock lk(m->mu);
  for (;;) {
    m->cv.wait(lk, [m] { return m->job != nullptr; });
    const std::function<void()>* j = m->job;
    const pid_t waiter = m->waiter;
    m->job = nullptr;
    lk.unlock();
    if (!wait_asleep(waiter, &m->state)) g_mover_unconfirmed.fetch_add(1);
    (*j)();
    m->state.store(kDone, std::memory_order_release);
    syscall(SYS_futex, &m->state, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    lk.lock();
  }
  return nullptr;
}

// Runs f on the mover and waits for it. REQUIRES: g_mu held (one job at a time).
//
// The range being moved may hold the registering thread's own stack pages (a buffer on its
// stack whose first page also holds the frames of this very call, a registration spanning
// the stack) or its thread control block and rseq area (a thread-local buffer). It must store
// nothing there while they are frozen: a store faults, and when the kernel cannot push the
// signal frame (the stack pointer is in the frozen pages) or cannot update the rseq area
// (it does so whenever the thread returns to user space after a context switch), it kills
// the process with SIGSEGV. So:
//   - the mover starts the job only once the waiter sleeps in its futex wait (wait_asleep),
//     and the waiter is woken only after the job: it runs no user code during the freeze;
//   - the waiter posts and waits on a stack of its own, allocated once (x86-64 and arm64; the
//     wait stays on this stack elsewhere), so even a wait_asleep that gave up leaves its
//     stack frames out of the freeze;
//   - asynchronous signals are blocked and cancellation disabled for the hand-off: no handler
//     runs, and no cancellation unwinds out of a wait whose job is still running.
// false: the mover thread could not be started (f did not run; a later call tries again).
bool run_on_mover(const std::function<void()>& f) {
  if (g_mover == nullptr) {
    // Published only once its thread runs: a mover without one would leave every hand-off
    // waiting forever.
    if (g_test_fail_mover_start.load(std::memory_order_relaxed)) return false;  // tests
    auto* m = new (std::nothrow) Mover();
    if (m == nullptr) return false;
    pthread_t t;
    if (pthread_create(&t, nullptr, mover_main, m) != 0) {
      delete m;
      return false;
    }
    pthread_detach(t);
    g_mover = m;
  }
  int cancel = 0;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
  uint64_t block = kAsyncSignals, old = 0;
  const bool masked = syscall(SYS_rt_sigprocmask, SIG_BLOCK, &block, &old, sizeof block) == 0;
  void* arg = const_cast<std::function<void()>*>(&f);
#if SOFTRNIC_PIN_ALT_STACK
  // One stack for every hand-off (g_mu makes them one at a time), with a guard page below;
  // kept across fork (a child's first hand-off uses the inherited copy).
  static constexpr size_t kWaitStack = 256 << 10;
  static uint64_t wait_stack = 0;
  if (wait_stack == 0) {
    void* s = sys_mmap(0, kWaitStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (s != MAP_FAILED) {
      wait_stack = reinterpret_cast<uint64_t>(s);
      sys_mprotect(wait_stack, page_size(), PROT_NONE);
    }
  }
  if (wait_stack != 0) {
    softrnic_pin_call_on_stack(arg, post_and_wait,
                               reinterpret_cast<void*>(wait_stack + kWaitStack));
  } else {
    post_and_wait(arg);
  }
#else
  post_and_wait(arg);
#endif
  if (masked) syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, nullptr, sizeof old);
  pthread_setcancelstate(cancel, nullptr);
  return true;
}

// Runs the move f of [lo, hi) (the pages it freezes) inline or on the mover, as above.
// false: f did not run (it needed the mover, which could not be started). REQUIRES: g_mu held.
[[gnu::noinline]] bool run_move(const std::function<void()>& f, uint64_t lo, uint64_t hi) {
  const uint64_t ps = page_size();
  const auto sp = reinterpret_cast<uint64_t>(__builtin_frame_address(0));
  const bool near_stack = lo < sp + kStackAbove && hi > sp - kStackBelow;
  // errno (static TLS) lies just below the thread pointer on x86-64 and the rseq area in the
  // thread control block above it: the pages from the lowest to the highest, one either side.
  const auto tp = reinterpret_cast<uint64_t>(__builtin_thread_pointer());
  uint64_t tls_lo = reinterpret_cast<uint64_t>(&errno), tls_hi = tls_lo;
  auto widen = [&](uint64_t a) {
    tls_lo = a < tls_lo ? a : tls_lo;
    tls_hi = a > tls_hi ? a : tls_hi;
  };
  widen(tp);
  if (&__rseq_offset != nullptr) widen(tp + static_cast<uint64_t>(__rseq_offset) + 32);
  tls_lo = (tls_lo & ~(ps - 1)) - ps;
  tls_hi = (tls_hi & ~(ps - 1)) + 2 * ps;
  const bool near_tls = lo < tls_hi && hi > tls_lo;
  if (near_stack || near_tls || g_force_mover.load(std::memory_order_relaxed)) {
    if (!run_on_mover(f)) return false;
    g_moves_mover.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  static std::once_flag warm;
  std::call_once(warm, warm_up);
  uint64_t block = kAsyncSignals, old = 0;
  const bool masked =
      syscall(SYS_rt_sigprocmask, SIG_BLOCK, &block, &old, sizeof block) == 0;
  f();
  if (masked) syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, nullptr, sizeof old);
  g_moves_inline.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Copies [l.lo, l.hi) into b at `off` and maps the memfd over it (same protections) under a
// write freeze. false: nothing changed (or the application unmapped the range meanwhile).
bool move_to_memfd(const Line& l, const Backing& b, uint64_t off) {
  const size_t n = l.hi - l.lo;
  if (!write_freeze_begin(l.lo, l.hi)) return false;
  const bool wr = (l.prot & PROT_WRITE) != 0;
  bool ok = !wr || sys_mprotect(l.lo, n, l.prot & ~PROT_WRITE);
  const bool frozen = ok;
  sleep_us(g_test_freeze_hold_us.load(std::memory_order_relaxed));  // tests: a long freeze
  if (ok) ok = sys_pwrite_all(b.fd, l.lo, n, off);
  // One system call replaces the private pages by the memfd's: no access sees a hole.
  if (ok) ok = sys_mmap(l.lo, n, l.prot, MAP_SHARED | MAP_FIXED, b.fd, off) != MAP_FAILED;
  if (!ok && frozen && wr) sys_mprotect(l.lo, n, l.prot);
  write_freeze_end();
  return ok;
}

// Gives [l.lo, l.hi) (a line of piece p) private anonymous pages with the same bytes again,
// under the same write freeze as the move: the range is read-only while it is copied, a
// thread storing into it meanwhile (a heap neighbour of the buffer on the same page) waits in
// the fault handler and retries on the private pages, and one mremap puts the copy in place
// atomically (no access sees the range unmapped). The bytes are read from the memfd, which
// the range maps (no device view maps it any more: the piece has no reference left).
// freeze: false in a forked child (one thread, nothing to race). If any step fails the range
// keeps the shared pages (still the application's bytes, only not private).
void move_to_private(const Line& l, int fd, bool freeze) {
  const size_t n = l.hi - l.lo;
  void* tmp = sys_mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return;
  const auto t = reinterpret_cast<uint64_t>(tmp);
  // The private pages are allocated before the freeze, in one pass (no fault per page
  // during the copy; MADV_POPULATE_WRITE, Linux 5.14: on older kernels the copy faults them).
  syscall(SYS_madvise, t, n, 23 /* MADV_POPULATE_WRITE */);
  const bool wr = freeze && (l.prot & PROT_WRITE) != 0;
  if (freeze && !write_freeze_begin(l.lo, l.hi)) {
    sys_munmap(t, n);
    return;
  }
  bool frozen = !wr || sys_mprotect(l.lo, n, l.prot & ~PROT_WRITE);
  bool moved = frozen && sys_pread_all(fd, t, n, l.off) && sys_mprotect(t, n, l.prot) &&
               sys_mremap_fixed(t, n, l.lo);
  if (!moved) {
    sys_munmap(t, n);
    if (frozen && wr) sys_mprotect(l.lo, n, l.prot);
  }
  if (freeze) write_freeze_end();
}

// The last PinnedRange on *p is gone: give the application its private pages back where the
// mapping is still ours (it may have been unmapped or replaced meanwhile).
void restore_locked(const Piece& p, bool freeze) {
  std::vector<Line> lines;
  // A hole (unmapped by the application) is fine: the lines after it are given back too.
  read_maps(p.lo, p.hi, &lines, false, false);
  for (const Line& l : lines) {
    if (l.lo >= p.hi) break;
    if (!l.shared || l.ino != p.b->ino || l.off != p.off + (l.lo - p.lo)) continue;
    if (freeze)  // no mover: the pages stay on the memfd, shared, which works but for fork
      (void)run_move([&] { move_to_private(l, p.b->fd, true); }, l.lo, l.hi);
    else
      move_to_private(l, p.b->fd, false);
  }
}

// fork: the parent's moved pages would be shared with the child; as the kernel copies pinned
// pages at fork, the child gets private copies (the device views are MADV_DONTFORK).
void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  g_fork_gen.fetch_add(1, std::memory_order_relaxed);
  for (auto& [lo, p] : g_pieces) restore_locked(p, false);
  g_pieces.clear();  // the Backing fds close with the last inherited PinnedRange (never, mostly)
  g_mover = nullptr;  // the parent's thread does not exist here
  g_mu.unlock();
}

// Maps [l.lo, l.hi) of the device view from fd at off; false on failure.
bool map_view(uint64_t view, uint64_t host_lo, const Line& l, int fd, uint64_t off) {
  const int prot = l.prot & (PROT_READ | PROT_WRITE);
  return sys_mmap(view + (l.lo - host_lo), l.hi - l.lo, prot, MAP_SHARED | MAP_FIXED, fd, off) !=
         MAP_FAILED;
}

void release_locked(const std::vector<uint64_t>& pieces) {
  for (uint64_t lo : pieces) {
    auto it = g_pieces.find(lo);
    if (it == g_pieces.end() || --it->second.refs != 0) continue;
    restore_locked(it->second, true);
    g_pieces.erase(it);
  }
}

}  // namespace

PinBacking::~PinBacking() {
  if (fd >= 0) ::close(fd);
}

void PinnedRange::add_seg(uint64_t view_off, uint64_t len, uint64_t file_off,
                          std::shared_ptr<const PinBacking> b) {
  // Consecutive maps lines moved into one memfd (split only by protections or VMA history)
  // are one segment: a payload crossing them still lies in one memfd range.
  if (!segs_.empty()) {
    Seg& t = segs_.back();
    if (t.b == b && t.view_off + t.len == view_off && t.file_off + t.len == file_off) {
      t.len += len;
      return;
    }
  }
  segs_.push_back({view_off, len, file_off, std::move(b)});
}

bool PinnedRange::locate(uint64_t a, uint64_t len, PinLoc* out) const {
  if (view_ == 0 || a < dev_lo_) return false;
  const uint64_t off = a - dev_lo_;
  for (const Seg& s : segs_) {
    if (off >= s.view_off && off - s.view_off <= s.len && len <= s.len - (off - s.view_off)) {
      out->backing = s.b;
      out->off = s.file_off + (off - s.view_off);
      return true;
    }
  }
  return false;
}

PinnedRange::~PinnedRange() {
  if (fork_gen_ != g_fork_gen.load(std::memory_order_relaxed)) return;  // the parent's
  if (view_ != 0) sys_munmap(view_, size_);
  std::lock_guard lk(g_mu);
  release_locked(pieces_);
}

size_t pinned_pieces() {
  std::lock_guard lk(g_mu);
  return g_pieces.size();
}

PinMoveCounts pin_move_counts() {
  return {g_moves_inline.load(std::memory_order_relaxed),
          g_moves_mover.load(std::memory_order_relaxed),
          g_mover_unconfirmed.load(std::memory_order_relaxed)};
}

void pin_force_mover_for_test(bool on) { g_force_mover.store(on, std::memory_order_relaxed); }

void pin_fail_mover_start_for_test(bool on) {
  g_test_fail_mover_start.store(on, std::memory_order_relaxed);
}

void pin_delays_for_test(uint32_t waiter_pause_us, uint32_t freeze_hold_us) {
  g_test_waiter_pause_us.store(waiter_pause_us, std::memory_order_relaxed);
  g_test_freeze_hold_us.store(freeze_hold_us, std::memory_order_relaxed);
}

std::shared_ptr<PinnedRange> pin_range(uint64_t addr, uint64_t len, PinMode mode) {
  if (len == 0) return nullptr;
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
  const uint64_t ps = page_size();
  std::shared_ptr<PinnedRange> r(new PinnedRange());
  r->host_lo_ = addr & ~(ps - 1);
  r->size_ = ((addr + len + ps - 1) & ~(ps - 1)) - r->host_lo_;
  r->dev_lo_ = r->host_lo_;
  r->fork_gen_ = g_fork_gen.load(std::memory_order_relaxed);
  if (mode == PinMode::kDirect) return r;
  const uint64_t lo = r->host_lo_, hi = lo + r->size_;

  std::lock_guard lk(g_mu);
  std::vector<Line> lines;
  if (!read_maps(lo, hi, &lines, true, true)) return r;
  split_at_pieces(&lines);
  // Decide every line before changing anything: one line that cannot be shadowed keeps the
  // whole MR direct. Shared mappings other than ours are reopened through map_files.
  std::vector<int> shared_fd(lines.size(), -1);
  auto close_fds = [&] {
    for (int fd : shared_fd)
      if (fd >= 0) ::close(fd);
  };
  uint64_t to_move = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    if (piece_of(l) != nullptr) continue;
    if (movable(l)) {
      to_move += l.hi - l.lo;
      continue;
    }
    if (l.shared && l.path.rfind("/memfd:softrnic-pin", 0) != 0) {
      char name[96];
      std::snprintf(name, sizeof name, "/proc/self/map_files/%llx-%llx",
                    static_cast<unsigned long long>(l.map_lo),
                    static_cast<unsigned long long>(l.map_hi));
      shared_fd[i] = ::open(name, ((l.prot & PROT_WRITE) ? O_RDWR : O_RDONLY) | O_CLOEXEC);
      if (shared_fd[i] >= 0) continue;
    }
    close_fds();
    return r;  // direct
  }
  void* v = sys_mmap(0, r->size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (v == MAP_FAILED) {
    close_fds();
    return r;
  }
  const auto view = reinterpret_cast<uint64_t>(v);
  std::shared_ptr<Backing> b;
  if (to_move != 0) {
    b = std::make_shared<Backing>();
    b->fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    struct stat st {};
    // Sealed against shrinking: whoever maps it (the device view, a peer device's one-copy
    // import) can never fault on a truncated page.
    if (b->fd < 0 || ftruncate(b->fd, static_cast<off_t>(to_move)) != 0 ||
        fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 || fstat(b->fd, &st) != 0) {
      sys_munmap(view, r->size_);
      close_fds();
      return r;
    }
    b->ino = st.st_ino;
    b->size = to_move;
    b->id = g_backing_ids.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  bool ok = true;
  uint64_t moved = 0;
  for (size_t i = 0; ok && i < lines.size(); ++i) {
    const Line& l = lines[i];
    if (Piece* p = piece_of(l)) {
      ok = map_view(view, lo, l, p->b->fd, l.off);
      if (ok) {
        ++p->refs;
        r->pieces_.push_back(p->lo);
        r->add_seg(l.lo - lo, l.hi - l.lo, l.off, p->b);
      }
    } else if (shared_fd[i] >= 0) {
      ok = map_view(view, lo, l, shared_fd[i], l.off);
    } else {
      if (!run_move([&] { ok = move_to_memfd(l, *b, moved); }, l.lo, l.hi)) ok = false;
      if (ok) {
        g_pieces[l.lo] = Piece{b, l.lo, l.hi, moved, 1};
        r->pieces_.push_back(l.lo);
        ok = map_view(view, lo, l, b->fd, moved);
        r->add_seg(l.lo - lo, l.hi - l.lo, moved, b);
      }
      moved += l.hi - l.lo;
    }
  }
  close_fds();
  if (!ok) {  // back to direct; the pieces moved so far go back to private pages
    sys_munmap(view, r->size_);
    release_locked(r->pieces_);
    r->pieces_.clear();
    r->segs_.clear();
    return r;
  }
  syscall(SYS_madvise, view, r->size_, MADV_DONTFORK);  // the child has no device: no view either
  r->view_ = view;
  r->dev_lo_ = view;
  return r;
}

}  // namespace rnic::emu
