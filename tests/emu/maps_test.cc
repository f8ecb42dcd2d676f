// tests/emu/maps_test: emu/objects/maps.h — the PROCMAP_QUERY ioctl and the /proc/self/maps
// parser give the same mappings (bounds, protections, sharing, offset, inode, name) over this
// process's whole address space and over ranges with holes; the ioctl's fd follows a fork; and
// the registration range check (EFAULT cases) and shadow pinning behave the same on either
// source (the text parser is the fallback for kernels before 6.11).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "emu/objects/device.h"
#include "emu/objects/maps.h"
#include "emu/objects/mr.h"
#include "emu/objects/pin.h"

namespace rnic::emu {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr uint64_t kUserTop = uint64_t{1} << 47;

bool kernel_has_query() {  // PROCMAP_QUERY: Linux 6.11
  utsname u{};
  if (uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 11);
}

std::string describe(const Mapping& m) {
  char b[128];
  std::snprintf(b, sizeof b, "%llx-%llx prot %d %s off %llx ino %llu ",
                static_cast<unsigned long long>(m.lo), static_cast<unsigned long long>(m.hi),
                m.prot, m.shared ? "s" : "p", static_cast<unsigned long long>(m.off),
                static_cast<unsigned long long>(m.ino));
  return b + m.path;
}

// Both sources over [lo, hi); a mapping of this process may change between the two reads
// (the heap grows for the strings), so up to 5 tries for one that agrees.
void expect_same(uint64_t lo, uint64_t hi, unsigned flags) {
  std::vector<Mapping> q, t;
  q.reserve(4096);
  t.reserve(4096);
  std::string diff;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const MapsResult rq = read_mappings(lo, hi, flags, &q, MapsSource::kQuery);
    const MapsResult rt = read_mappings(lo, hi, flags, &t, MapsSource::kText);
    ASSERT_TRUE(rq.ok);
    ASSERT_TRUE(rt.ok);
    diff.clear();
    if (rq.covered != rt.covered) diff = "covered differs";
    for (size_t i = 0; diff.empty() && i < std::max(q.size(), t.size()); ++i) {
      const std::string a = i < q.size() ? describe(q[i]) : "(none)";
      const std::string b = i < t.size() ? describe(t[i]) : "(none)";
      if (a != b) diff = "query: " + a + "\ntext:  " + b;
    }
    if (diff.empty()) {
      EXPECT_FALSE(q.empty());
      return;
    }
  }
  ADD_FAILURE() << diff;
}

TEST(Maps, QueryIsAvailableOnThisKernel) {
  if (!kernel_has_query()) GTEST_SKIP() << "kernel before 6.11: no PROCMAP_QUERY";
  EXPECT_TRUE(maps_query_available());
}

// Every mapping of the process, with names: the same list from both sources (libraries,
// [heap], [stack], [vdso], anonymous memory, this binary's file mappings).
TEST(Maps, QueryAndTextAgreeOnTheWholeAddressSpace) {
  if (!maps_query_available()) GTEST_SKIP() << "no PROCMAP_QUERY here: only the text source";
  // A few kinds of our own first: anonymous, a memfd shared at an offset, read-only, a hole.
  void* anon = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<uint8_t*>(anon) + kPage, kPage, PROT_READ), 0);
  const int fd = memfd_create("maps-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(4 * kPage)), 0);
  void* sh = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 2 * kPage);
  ASSERT_NE(sh, MAP_FAILED);
  expect_same(0, kUserTop, kNames);
  expect_same(0, kUserTop, 0);

  std::vector<Mapping> m;
  const auto s = reinterpret_cast<uint64_t>(sh);
  for (MapsSource src : {MapsSource::kQuery, MapsSource::kText}) {
    ASSERT_TRUE(read_mappings(s, s + 1, kNames, &m, src).covered);
    ASSERT_EQ(m.size(), 1u);
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_TRUE(m[0].shared);
    EXPECT_EQ(m[0].off, 2 * kPage);
    EXPECT_EQ(m[0].ino, st.st_ino);
    EXPECT_EQ(m[0].path.rfind("/memfd:maps-test", 0), 0u) << m[0].path;
    EXPECT_EQ(m[0].prot, PROT_READ | PROT_WRITE);
    volatile int local = 0;
    const auto sp = reinterpret_cast<uint64_t>(&local);
    ASSERT_TRUE(read_mappings(sp, sp + 1, kNames, &m, src).covered);
    ASSERT_EQ(m.size(), 1u);
    if (m[0].path != "[stack]") {
      // gtest runs tests on the main thread; under ASan a local may live on its fake stack.
      EXPECT_EQ(m[0].path, "") << "a local is neither on [stack] nor in anonymous memory";
    }
  }
  munmap(sh, 2 * kPage);
  close(fd);
  munmap(anon, 3 * kPage);
}

// A hole in the middle: kStopAtHole stops there; without it the mapping after is listed too.
TEST(Maps, HolesOnBothSources) {
  void* p = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* b = static_cast<uint8_t*>(p);
  ASSERT_EQ(munmap(b + kPage, kPage), 0);
  const auto a = reinterpret_cast<uint64_t>(b);
  std::vector<MapsSource> sources{MapsSource::kText};
  if (maps_query_available()) sources.push_back(MapsSource::kQuery);
  for (MapsSource src : sources) {
    SCOPED_TRACE(src == MapsSource::kQuery ? "query" : "text");
    std::vector<Mapping> m;
    MapsResult r = read_mappings(a, a + 3 * kPage, kStopAtHole, &m, src);
    ASSERT_TRUE(r.ok);
    EXPECT_FALSE(r.covered);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_LE(m[0].lo, a);
    EXPECT_EQ(m[0].hi, a + kPage);
    r = read_mappings(a, a + 3 * kPage, 0, &m, src);
    ASSERT_TRUE(r.ok);
    EXPECT_FALSE(r.covered);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[1].lo, a + 2 * kPage);
    // Only the hole.
    r = read_mappings(a + kPage, a + 2 * kPage, 0, &m, src);
    ASSERT_TRUE(r.ok);
    EXPECT_FALSE(r.covered);
    EXPECT_TRUE(m.empty());
    // Only mapped bytes.
    r = read_mappings(a + 2 * kPage, a + 3 * kPage, 0, &m, src);
    EXPECT_TRUE(r.covered);
    ASSERT_EQ(m.size(), 1u);
  }
  munmap(b, kPage);
  munmap(b + 2 * kPage, kPage);
}

// The ioctl's fd names the mappings of the process that opened it: a forked child must see
// its own (a mapping made after the fork exists only there; one unmapped there is gone).
TEST(Maps, ForkedChildQueriesItsOwnMappings) {
  if (!maps_query_available()) GTEST_SKIP() << "no PROCMAP_QUERY here";
  void* p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::vector<Mapping> m;
  const auto a = reinterpret_cast<uint64_t>(p);
  ASSERT_TRUE(read_mappings(a, a + kPage, 0, &m, MapsSource::kQuery).covered);  // fd opened
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    std::vector<Mapping> c;
    if (munmap(p, kPage) != 0) bad |= 1;
    if (read_mappings(a, a + kPage, 0, &c, MapsSource::kQuery).covered) bad |= 2;
    void* q = mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const auto b = reinterpret_cast<uint64_t>(q);
    if (q == MAP_FAILED || !read_mappings(b, b + kPage, 0, &c, MapsSource::kQuery).covered)
      bad |= 4;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: munmap, 2: the child saw the parent's mapping, "
                                       "4: the child did not see its own";
  EXPECT_TRUE(read_mappings(a, a + kPage, 0, &m, MapsSource::kQuery).covered);  // still ours
  munmap(p, kPage);
}

struct ForceText {
  explicit ForceText(bool on) { maps_force_text_for_test(on); }
  ~ForceText() { maps_force_text_for_test(false); }
};

// check_mr_range's verdicts (mr.h) on both sources: mapped and readable -> ok; a hole, NULL,
// PROT_NONE -> EFAULT; read-only with write access -> EFAULT, without -> ok.
TEST(Maps, RangeCheckIsTheSameOnBothSources) {
  void* p = mmap(nullptr, 6 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* b = static_cast<uint8_t*>(p);
  const auto a = reinterpret_cast<uint64_t>(b);
  ASSERT_EQ(mprotect(b + 2 * kPage, kPage, PROT_NONE), 0);
  ASSERT_EQ(mprotect(b + 3 * kPage, kPage, PROT_READ), 0);
  ASSERT_EQ(munmap(b + 5 * kPage, kPage), 0);
  constexpr uint64_t kMax = uint64_t{1} << 40;
  for (bool text : {false, true}) {
    ForceText f(text);
    SCOPED_TRACE(text ? "text" : "auto");
    EXPECT_EQ(maps_query_available(), !text && kernel_has_query());
    EXPECT_TRUE(check_mr_range(a, 2 * kPage, kAccessLocalWrite, kMax).is_ok());
    EXPECT_TRUE(check_mr_range(a + 100, kPage, kAccessRemoteRead, kMax).is_ok());
    EXPECT_EQ(check_mr_range(a, 3 * kPage, 0, kMax).code(), Errc::kFault);  // PROT_NONE
    EXPECT_TRUE(check_mr_range(a + 3 * kPage, kPage, 0, kMax).is_ok());       // read-only, read
    EXPECT_EQ(check_mr_range(a + 3 * kPage, kPage, kAccessLocalWrite, kMax).code(), Errc::kFault);
    EXPECT_EQ(check_mr_range(a + 4 * kPage, 2 * kPage, 0, kMax).code(), Errc::kFault);  // hole
    EXPECT_EQ(check_mr_range(a + 5 * kPage, 1, 0, kMax).code(), Errc::kFault);
    EXPECT_EQ(check_mr_range(0, 8, 0, kMax).code(), Errc::kFault);  // NULL
  }
  munmap(b, 5 * kPage);
}

// Shadow pinning on the text source: the registration moves the pages (the memfd shows in
// the maps), a remap of the buffer leaves the device view's bytes alone, dereg gives the
// private pages back.
TEST(Maps, ShadowPinningOnTheTextSource) {
  ForceText f(true);
  DeviceConfig cfg;
  cfg.ip = "127.0.0.1";
  cfg.netdev_mtu = 1500;
  auto dev = *Device::open(cfg);
  auto pd = *dev->alloc_pd();
  void* p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* b = static_cast<uint8_t*>(p);
  std::memset(b, 0x11, 2 * kPage);
  const auto a = reinterpret_cast<uint64_t>(b);
  auto mr = *dev->reg_mr(pd, a, 2 * kPage, a, kAccessLocalWrite | kAccessRemoteRead);
  ASSERT_TRUE(mr->shadowed());
  std::vector<Mapping> m;
  ASSERT_TRUE(read_mappings(a, a + 2 * kPage, kNames, &m, MapsSource::kText).covered);
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m[0].path.rfind("/memfd:softrnic-pin", 0), 0u) << m[0].path;
  ASSERT_EQ(mmap(b, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0),
            p);
  std::memset(b, 0x22, 2 * kPage);
  uint8_t v = 0;
  ASSERT_TRUE(dev->mem().read(mr->view().translate(a + 5), &v, 1));
  EXPECT_EQ(v, 0x11);
  ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(b[5], 0x22);
  // Registered and deregistered in place: private anonymous pages again, bytes kept.
  mr = *dev->reg_mr(pd, a, 2 * kPage, a, kAccessLocalWrite);
  ASSERT_TRUE(mr->shadowed());
  b[6] = 0x33;
  ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  ASSERT_TRUE(read_mappings(a, a + 2 * kPage, kNames, &m, MapsSource::kText).covered);
  for (const Mapping& x : m) EXPECT_EQ(x.path, "") << describe(x);
  EXPECT_EQ(b[5], 0x22);
  EXPECT_EQ(b[6], 0x33);
  munmap(b, 2 * kPage);
}

}  // namespace
}  // namespace rnic::emu
