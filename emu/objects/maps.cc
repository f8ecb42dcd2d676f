// emu/objects/maps.cc: read_mappings through PROCMAP_QUERY or by parsing /proc/self/maps
// (maps.h).
#include "emu/objects/maps.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace rnic::emu {
namespace {

// The uapi of PROCMAP_QUERY (include/uapi/linux/fs.h, Linux 6.11). Spelled out here: the
// build machine's headers may be older than the kernel the library runs on.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01, kVmaWritable = 0x02, kVmaExecutable = 0x04,
                   kVmaShared = 0x08;
constexpr uint64_t kCoveringOrNext = 0x10;

// 0: not tried yet, 1: the ioctl answers, 2: it does not (text from now on).
std::atomic<int> g_query_state{0};
std::atomic<bool> g_force_text{false};

// The /proc/self/maps fd the ioctl goes to, for the process that opened it.
std::mutex g_fd_mu;
int g_fd = -1;
pid_t g_fd_pid = 0;
dev_t g_fd_dev = 0;
ino_t g_fd_ino = 0;

// Forget g_fd; close it only if it is still the file we opened (the application may have
// closed it and got the number back for a file of its own). REQUIRES: g_fd_mu.
void drop_fd_locked() {
  if (g_fd >= 0) {
    struct stat st {};
    if (::fstat(g_fd, &st) == 0 && st.st_dev == g_fd_dev && st.st_ino == g_fd_ino &&
        g_fd_pid == static_cast<pid_t>(syscall(SYS_getpid)))
      ::close(g_fd);
  }
  g_fd = -1;
}

// REQUIRES: g_fd_mu. -1 if /proc/self/maps cannot be opened.
int maps_fd_locked() {
  const auto pid = static_cast<pid_t>(syscall(SYS_getpid));
  if (g_fd >= 0 && g_fd_pid == pid) return g_fd;
  // A forked child inherited the parent's fd: it names the parent's mappings. The child's copy
  // is its own to close.
  if (g_fd >= 0) ::close(g_fd);
  g_fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (g_fd < 0) return -1;
  struct stat st {};
  if (::fstat(g_fd, &st) != 0) {
    ::close(g_fd);
    g_fd = -1;
    return -1;
  }
  g_fd_pid = pid;
  g_fd_dev = st.st_dev;
  g_fd_ino = st.st_ino;
  return g_fd;
}

// One PROCMAP_QUERY: the mapping covering addr or the next one above. 0, or an errno
// (ENOENT: none).
int query_one(int fd, uint64_t addr, bool names, char* name, Mapping* m) {
  ProcmapQuery q{};
  q.size = sizeof q;
  q.query_flags = kCoveringOrNext;
  q.query_addr = addr;
  if (names) {
    q.vma_name_size = PATH_MAX;
    q.vma_name_addr = reinterpret_cast<uint64_t>(name);
  }
  if (::ioctl(fd, kProcmapQuery, &q) != 0) {
    const int e = errno;
    if (e != ENAMETOOLONG || !names) return e;
    // A path longer than PATH_MAX: the mapping without its name ("?": not a name pinning
    // recognises, so it is treated as special).
    q = ProcmapQuery{};
    q.size = sizeof q;
    q.query_flags = kCoveringOrNext;
    q.query_addr = addr;
    if (::ioctl(fd, kProcmapQuery, &q) != 0) return errno;
    std::strcpy(name, "?");
    q.vma_name_size = 2;
  }
  m->lo = q.vma_start;
  m->hi = q.vma_end;
  m->prot = ((q.vma_flags & kVmaReadable) ? PROT_READ : 0) |
            ((q.vma_flags & kVmaWritable) ? PROT_WRITE : 0) |
            ((q.vma_flags & kVmaExecutable) ? PROT_EXEC : 0);
  m->shared = (q.vma_flags & kVmaShared) != 0;
  m->off = q.vma_offset;
  m->ino = q.inode;
  m->path.clear();
  if (names && q.vma_name_size > 1) m->path.assign(name, q.vma_name_size - 1);  // size has the NUL
  return 0;
}

// The ioctl walk. ok=false with errno_out set when the first query failed (nothing listed).
MapsResult read_query(uint64_t lo, uint64_t hi, unsigned flags, std::vector<Mapping>* out,
                      int* errno_out) {
  MapsResult r;
  char name[PATH_MAX];
  std::lock_guard lk(g_fd_mu);
  for (int attempt = 0; attempt < 2; ++attempt) {
    out->clear();
    const int fd = maps_fd_locked();
    if (fd < 0) {
      *errno_out = EBADF;
      return r;
    }
    uint64_t cur = lo;
    bool hole = false;
    int e = 0;
    while (cur < hi) {
      Mapping m;
      e = query_one(fd, cur, (flags & kNames) != 0, name, &m);
      if (e == ENOENT) {  // nothing at or above cur
        e = 0;
        hole = true;
        break;
      }
      if (e != 0) break;
      if (m.lo >= hi) {
        hole = true;
        break;
      }
      if (m.lo > cur) {
        hole = true;
        if (flags & kStopAtHole) break;
      }
      cur = m.hi;
      out->push_back(std::move(m));
    }
    if (e == 0) {
      r.ok = true;
      r.covered = !hole;
      return r;
    }
    // The fd may not be ours any more (closed by the application, or a number reused): once
    // more with a fresh one, then give up on the ioctl.
    *errno_out = e;
    drop_fd_locked();
  }
  out->clear();
  return r;
}

// Parses "lo-hi perms offset maj:min inode [path]" (one line, no newline). false: unparsable.
bool parse_line(const char* p, const char* end, bool names, Mapping* m) {
  char* q = nullptr;
  m->lo = std::strtoull(p, &q, 16);
  if (q == p || q >= end || *q != '-') return false;
  p = q + 1;
  m->hi = std::strtoull(p, &q, 16);
  if (q == p || q + 5 >= end || *q != ' ') return false;
  const char* perms = q + 1;
  m->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
            (perms[2] == 'x' ? PROT_EXEC : 0);
  m->shared = perms[3] == 's';
  p = perms + 4;
  m->off = std::strtoull(p, &q, 16);
  if (q == p || q >= end) return false;
  p = q;
  std::strtoul(p, &q, 16);  // major
  if (q >= end || *q != ':') return false;
  p = q + 1;
  std::strtoul(p, &q, 16);  // minor
  if (q == p || q >= end) return false;
  p = q;
  m->ino = std::strtoull(p, &q, 10);
  if (q == p) return false;
  m->path.clear();
  if (names) {
    p = q;
    while (p < end && *p == ' ') ++p;
    m->path.assign(p, static_cast<size_t>(end - p));
  }
  return true;
}

MapsResult read_text(uint64_t lo, uint64_t hi, unsigned flags, std::vector<Mapping>* out) {
  MapsResult r;
  out->clear();
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return r;
  // Lines are sorted by address and do not overlap. Read in chunks and stop as soon as a line
  // starts at or above hi (buffers low in the address space need only the first lines).
  std::string pending;
  char buf[4096];
  uint64_t cur = lo;
  bool hole = false, done = false, bad = false;
  while (!done) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t pos = 0;
    for (size_t nl; !done && (nl = pending.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      Mapping m;
      if (!parse_line(pending.data() + pos, pending.data() + nl, (flags & kNames) != 0, &m)) {
        bad = done = true;
        break;
      }
      if (m.hi <= cur) continue;
      if (m.lo >= hi) {
        done = true;
        break;
      }
      if (m.lo > cur) {
        hole = true;
        if (flags & kStopAtHole) {
          done = true;
          break;
        }
      }
      cur = m.hi;
      out->push_back(std::move(m));
      if (cur >= hi) done = true;
    }
    pending.erase(0, pos);
  }
  ::close(fd);
  if (bad) {
    out->clear();
    return r;
  }
  r.ok = true;
  r.covered = !hole && cur >= hi;
  return r;
}

}  // namespace

MapsResult read_mappings(uint64_t lo, uint64_t hi, unsigned flags, std::vector<Mapping>* out,
                         MapsSource src) {
  if (src == MapsSource::kAuto) {
    src = (g_force_text.load(std::memory_order_relaxed) ||
           g_query_state.load(std::memory_order_relaxed) == 2)
              ? MapsSource::kText
              : MapsSource::kQuery;
    if (src == MapsSource::kQuery) {
      int e = 0;
      MapsResult r = read_query(lo, hi, flags, out, &e);
      if (r.ok) {
        g_query_state.store(1, std::memory_order_relaxed);
        return r;
      }
      // ENOTTY (before 6.11), EINVAL, EPERM/EACCES (a filter): text from now on. Any other
      // failure of a kernel that answered before is taken as this call's only.
      if (g_query_state.load(std::memory_order_relaxed) == 0) g_query_state.store(2);
      return read_text(lo, hi, flags, out);
    }
  }
  if (src == MapsSource::kQuery) {
    int e = 0;
    return read_query(lo, hi, flags, out, &e);
  }
  return read_text(lo, hi, flags, out);
}

bool maps_query_available() {
  if (g_force_text.load(std::memory_order_relaxed)) return false;
  const int s = g_query_state.load(std::memory_order_relaxed);
  if (s != 0) return s == 1;
  std::vector<Mapping> m;
  const auto probe = reinterpret_cast<uint64_t>(&g_query_state);
  return read_mappings(probe, probe + 1, 0, &m).ok && g_query_state.load() == 1;
}

void maps_force_text_for_test(bool text) {
  g_force_text.store(text, std::memory_order_relaxed);
  if (!text) g_query_state.store(0, std::memory_order_relaxed);
}

}  // namespace rnic::emu
