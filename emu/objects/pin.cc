// emu/objects/pin.cc: shadow pinning (design, races and costs in pin.h).
#include "emu/objects/pin.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "emu/objects/memory.h"

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
// Copies n bytes of the application at `from` (the kernel copies: a range unmapped meanwhile
// is EFAULT, never a signal, and bytes of a page outside any allocation are no sanitizer
// report: the page copy is deliberate).
bool sys_copy(uint64_t from, void* to, size_t n) {
  const iovec local{to, n};
  const iovec remote{reinterpret_cast<void*>(from), n};
  return syscall(SYS_process_vm_readv, syscall(SYS_getpid), &local, 1, &remote, 1, 0) ==
         static_cast<long>(n);
}

// One line of /proc/self/maps, clipped to the range asked for.
struct Line {
  uint64_t lo = 0, hi = 0;          // clipped
  uint64_t map_lo = 0, map_hi = 0;  // the whole mapping (its /proc/self/map_files name)
  int prot = 0;
  bool shared = false;
  uint64_t off = 0;                 // file offset of lo
  uint64_t ino = 0;
  std::string path;
};

// The mappings covering [lo, hi), in order; false if one byte is not mapped.
bool read_maps(uint64_t lo, uint64_t hi, std::vector<Line>* out) {
  out->clear();
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[4096 + 256];
  uint64_t cur = lo;
  while (cur < hi && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long a = 0, b = 0, off = 0, ino = 0;
    char perms[8] = {};
    unsigned maj = 0, min = 0;
    int n = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &a, &b, perms, &off, &maj, &min,
                    &ino, &n) < 7)
      break;
    if (b <= cur) continue;
    if (a > cur) break;  // a hole
    Line l;
    l.map_lo = a;
    l.map_hi = b;
    l.lo = cur;
    l.hi = b < hi ? b : hi;
    l.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
             (perms[2] == 'x' ? PROT_EXEC : 0);
    l.shared = perms[3] == 's';
    l.off = off + (l.lo - a);
    l.ino = ino;
    l.path = line + n;
    while (!l.path.empty() && (l.path.back() == '\n' || l.path.back() == ' ')) l.path.pop_back();
    cur = l.hi;
    out->push_back(std::move(l));
  }
  std::fclose(f);
  return cur >= hi;
}

// A memfd holding moved pages.
struct Backing {
  int fd = -1;
  uint64_t ino = 0;
  ~Backing() {
    if (fd >= 0) ::close(fd);
  }
};

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

// The mover: a thread of ours that makes every copy under a write freeze. The registering
// thread cannot: its own stack, or a global next to the buffer, may lie in the frozen pages,
// and its next store there would fault with nobody left to end the freeze. The mover writes
// nothing in the application's memory between freeze begin and end (its stack and TLS are
// its own; results are stored after end), and its first pass resolved every call it makes.
struct Mover {
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void()>* job = nullptr;
  bool done = false;
};
Mover* g_mover = nullptr;  // leaked: it lives as long as the process

void warm_up() {
  const uint64_t ps = page_size();
  void* p = sys_mmap(0, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  const auto a = reinterpret_cast<uint64_t>(p);
  char b[64];
  sys_mprotect(a, ps, PROT_READ);
  (void)sys_copy(a, b, sizeof b);
  std::memcpy(b, p, sizeof b);
  void* q = sys_mmap(0, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q != MAP_FAILED) (void)sys_mremap_fixed(reinterpret_cast<uint64_t>(q), ps, a);
  sys_munmap(a, ps);
  if (write_freeze_begin(0, 0)) write_freeze_end();
}

// Runs f on the mover and waits for it. REQUIRES: g_mu held (one job at a time).
void run_on_mover(const std::function<void()>& f) {
  if (g_mover == nullptr) {
    g_mover = new Mover();
    std::thread([m = g_mover] {
      warm_up();
      std::unique_lock lk(m->mu);
      for (;;) {
        m->cv.wait(lk, [m] { return m->job != nullptr; });
        const std::function<void()>* j = m->job;
        m->job = nullptr;
        lk.unlock();
        (*j)();
        lk.lock();
        m->done = true;
        m->cv.notify_all();
      }
    }).detach();
  }
  std::unique_lock lk(g_mover->mu);
  g_mover->done = false;
  g_mover->job = &f;
  g_mover->cv.notify_all();
  g_mover->cv.wait(lk, [] { return g_mover->done; });
}

// Copies [l.lo, l.hi) into b at `off` and maps the memfd over it (same protections) under a
// write freeze. false: nothing changed (or the application unmapped the range meanwhile).
bool move_to_memfd(const Line& l, const Backing& b, uint64_t off) {
  const size_t n = l.hi - l.lo;
  void* tmp = sys_mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd, off);
  if (tmp == MAP_FAILED) return false;
  const auto t = reinterpret_cast<uint64_t>(tmp);
  if (!write_freeze_begin(l.lo, l.hi)) {
    sys_munmap(t, n);
    return false;
  }
  const bool wr = (l.prot & PROT_WRITE) != 0;
  bool ok = !wr || sys_mprotect(l.lo, n, l.prot & ~PROT_WRITE);
  const bool frozen = ok;
  if (ok) ok = sys_copy(l.lo, tmp, n);
  // One system call replaces the private pages by the memfd's: no access sees a hole.
  if (ok) ok = sys_mmap(l.lo, n, l.prot, MAP_SHARED | MAP_FIXED, b.fd, off) != MAP_FAILED;
  if (!ok && frozen && wr) sys_mprotect(l.lo, n, l.prot);
  write_freeze_end();
  sys_munmap(t, n);
  return ok;
}

// Gives [l.lo, l.hi) (a line of a piece) private anonymous pages with the same bytes again,
// under the same write freeze as the move: the range is read-only while it is copied, a
// thread storing into it meanwhile (a heap neighbour of the buffer on the same page) waits in
// the fault handler and retries on the private pages, and one mremap puts the copy in place
// atomically (no access sees the range unmapped). freeze: false in a forked child (one
// thread, nothing to race). If any step fails the range keeps the shared pages (still the
// application's bytes, only not private).
void move_to_private(const Line& l, bool freeze) {
  const size_t n = l.hi - l.lo;
  void* tmp = sys_mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return;
  const auto t = reinterpret_cast<uint64_t>(tmp);
  const bool wr = freeze && (l.prot & PROT_WRITE) != 0;
  if (freeze && !write_freeze_begin(l.lo, l.hi)) {
    sys_munmap(t, n);
    return;
  }
  bool frozen = !wr || sys_mprotect(l.lo, n, l.prot & ~PROT_WRITE);
  bool moved = frozen && sys_copy(l.lo, tmp, n) && sys_mprotect(t, n, l.prot) &&
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
  read_maps(p.lo, p.hi, &lines);  // a hole (unmapped by the application) is fine
  for (const Line& l : lines) {
    if (l.lo >= p.hi) break;
    if (!l.shared || l.ino != p.b->ino || l.off != p.off + (l.lo - p.lo)) continue;
    if (freeze)
      run_on_mover([&] { move_to_private(l, true); });
    else
      move_to_private(l, false);
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
  if (!read_maps(lo, hi, &lines)) return r;
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
    b->fd = memfd_create(kMemfdName, MFD_CLOEXEC);
    struct stat st {};
    if (b->fd < 0 || ftruncate(b->fd, static_cast<off_t>(to_move)) != 0 || fstat(b->fd, &st) != 0) {
      sys_munmap(view, r->size_);
      close_fds();
      return r;
    }
    b->ino = st.st_ino;
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
      }
    } else if (shared_fd[i] >= 0) {
      ok = map_view(view, lo, l, shared_fd[i], l.off);
    } else {
      run_on_mover([&] { ok = move_to_memfd(l, *b, moved); });
      if (ok) {
        g_pieces[l.lo] = Piece{b, l.lo, l.hi, moved, 1};
        r->pieces_.push_back(l.lo);
        ok = map_view(view, lo, l, b->fd, moved);
      }
      moved += l.hi - l.lo;
    }
  }
  close_fds();
  if (!ok) {  // back to direct; the pieces moved so far go back to private pages
    sys_munmap(view, r->size_);
    release_locked(r->pieces_);
    r->pieces_.clear();
    return r;
  }
  syscall(SYS_madvise, view, r->size_, MADV_DONTFORK);  // the child has no device: no view either
  r->view_ = view;
  r->dev_lo_ = view;
  return r;
}

}  // namespace rnic::emu
