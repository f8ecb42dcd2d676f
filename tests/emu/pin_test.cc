// tests/emu/pin_test: shadow pinning (issue 10 item 2, emu/objects/pin.h). A buffer freed and
// remapped while still registered never serves the new memory to the old rkey: over real UDP
// a READ from a second device returns the old bytes. Overlapping registrations share the
// moved pages, the last deregistration gives private pages back, application writes during a
// registration are not lost, and a forked child gets a private copy.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emu/objects/device.h"
#include "emu/objects/memory.h"
#include "emu/objects/pin.h"
#include "tests/emu/proto_util.h"

// A library that hooks the mmap family, as UCX's UCM does (its registration cache's callbacks
// store into the heap before and after every mmap/mremap of the process): while g_hook_store
// is set, every mmap and mremap that resolves to these stores into it before and after.
std::atomic<volatile uint64_t*> g_hook_store{nullptr};
std::atomic<uint64_t> g_hook_calls{0};

void hook_store() {
  if (volatile uint64_t* p = g_hook_store.load()) {
    *p = *p + 1;
    g_hook_calls.fetch_add(1);
  }
}

extern "C" void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  hook_store();
  const long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  hook_store();
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}

extern "C" void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) noexcept {
  void* to = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    to = va_arg(ap, void*);
    va_end(ap);
  }
  hook_store();
  const long r = syscall(SYS_mremap, old, old_len, new_len, flags, to);
  hook_store();
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}

namespace rnic::emu {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr size_t kPages = 4;

uint8_t* map_pages(size_t n, uint8_t fill, void* at = nullptr, int extra = 0) {
  void* p = mmap(at, n * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, fill, n * kPage);
  return static_cast<uint8_t*>(p);
}

// Whether any mapping overlapping [p, p+len) is one of the pinning memfds.
bool maps_show_pin(const void* p, size_t len) {
  std::ifstream f("/proc/self/maps");
  const auto lo = reinterpret_cast<uint64_t>(p), hi = lo + len;
  for (std::string l; std::getline(f, l);) {
    unsigned long long a = 0, b = 0;
    if (std::sscanf(l.c_str(), "%llx-%llx", &a, &b) != 2 || b <= lo || a >= hi) continue;
    if (l.find("softrnic-pin") != std::string::npos) return true;
  }
  return false;
}

// A device without an engine: registration and the memory path only.
std::pair<std::shared_ptr<Device>, std::shared_ptr<Pd>> local_device() {
  DeviceConfig cfg;
  cfg.ip = "127.0.0.1";
  cfg.netdev_mtu = 1500;
  auto dev = *Device::open(cfg);
  auto pd = *dev->alloc_pd();
  return {dev, pd};
}

struct Pair {
  test::Node c, s;
  std::shared_ptr<Qp> qc, qs;
  Pair(const char* cip, const char* sip, PinMode pin)
      : c(test::Node::on_udp(cip, true, pin)), s(test::Node::on_udp(sip, true, pin)) {
    qc = c.qp(QpType::kRc);
    qs = s.qp(QpType::kRc);
    test::connect_pair(c, qc, s, qs, test::ConnOpts{});
  }
  ~Pair() {
    if (c.eng) c.eng->stop();
    if (s.eng) s.eng->stop();
  }
  // READ len bytes at the server's (addr, rkey) into dst; the completion status.
  WcStatus read(uint64_t addr, uint32_t rkey, uint8_t* dst, uint32_t len) {
    auto ml = c.mr(dst, len);
    test::Wr rd = test::send_wr(WrOpcode::kRdmaRead, 7, {test::sge(dst, len, ml)});
    rd.rdma.remote_addr = addr;
    rd.rdma.rkey = rkey;
    EXPECT_TRUE(test::post(qc, rd).is_ok());
    auto cq = test::poll_n(*c.scq, 1, 10000);
    EXPECT_EQ(cq.size(), 1u);
    EXPECT_TRUE(c.dev->dereg_mr(ml).is_ok());
    return cq.empty() ? WcStatus::kGeneralErr : cq[0].status;
  }
};

// The server registers 4 pages of 0x11, the application unmaps them (or maps over them) and
// maps new memory of 0x22 at the same address; a READ with the old rkey from the client.
void remap_then_read(PinMode pin, bool munmap_first, const char* cip, const char* sip,
                     uint8_t* got) {
  Pair p(cip, sip, pin);
  uint8_t* buf = map_pages(kPages, 0x11);
  ASSERT_NE(buf, nullptr);
  auto mr = p.s.mr(buf, kPages * kPage);
  ASSERT_NE(mr, nullptr);
  if (munmap_first) {
    ASSERT_EQ(munmap(buf, kPages * kPage), 0);
  }
  uint8_t* again = map_pages(kPages, 0x22, buf, munmap_first ? MAP_FIXED_NOREPLACE : MAP_FIXED);
  ASSERT_EQ(again, buf) << "the new mapping did not land on the registered address";
  ASSERT_EQ(buf[0], 0x22);  // the application sees its new memory
  std::vector<uint8_t> dst(kPages * kPage, 0);
  const WcStatus st = p.read(reinterpret_cast<uint64_t>(buf), mr->rkey(), dst.data(),
                             static_cast<uint32_t>(dst.size()));
  for (size_t i = 0; i < dst.size(); ++i) {
    ASSERT_NE(dst[i], 0x22) << "byte " << i << ": the old rkey served never-registered memory";
    if (st == WcStatus::kSuccess) {
      ASSERT_EQ(dst[i], 0x11) << "byte " << i;
    }
  }
  std::memcpy(got, dst.data(), 16);
  EXPECT_TRUE(p.s.dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(buf[0], 0x22);  // dereg leaves the application's new memory alone
  munmap(buf, kPages * kPage);
}

TEST(Pin, MunmappedAndRemappedBufferServesOldBytesToOldRkey) {
  uint8_t got[16];
  remap_then_read(PinMode::kShadow, true, "127.31.78.1", "127.31.78.2", got);
  EXPECT_EQ(got[0], 0x11);
}

TEST(Pin, MapFixedOverRegisteredBufferServesOldBytesToOldRkey) {
  uint8_t got[16];
  remap_then_read(PinMode::kShadow, false, "127.31.78.3", "127.31.78.4", got);
  EXPECT_EQ(got[0], 0x11);
}

// The two registrations share the moved pages: writes of the application after registration
// reach both, dereg of one keeps the other's pages, the last dereg gives private pages back.
TEST(Pin, OverlappingRegistrationsShareAndLastDeregRestores) {
  auto [dev, pd] = local_device();
  uint8_t* buf = map_pages(3, 0x40);
  const auto a = reinterpret_cast<uint64_t>(buf);
  constexpr uint32_t kRw = kAccessLocalWrite | kAccessRemoteRead;
  auto m1 = *dev->reg_mr(pd, a, 2 * kPage, a, kRw);           // pages 0-1
  auto m2 = *dev->reg_mr(pd, a + kPage + 8, 2 * kPage - 8, a + kPage + 8, kRw);  // 1-2
  ASSERT_TRUE(m1->shadowed());
  ASSERT_TRUE(m2->shadowed());
  EXPECT_TRUE(maps_show_pin(buf, 3 * kPage));
  const size_t pieces = pinned_pieces();
  buf[kPage + 100] = 0x77;  // the page both hold
  uint8_t x = 0, y = 0;
  ASSERT_TRUE(dev->mem().read(m1->view().translate(a + kPage + 100), &x, 1));
  ASSERT_TRUE(dev->mem().read(m2->view().translate(a + kPage + 100), &y, 1));
  EXPECT_EQ(x, 0x77);
  EXPECT_EQ(y, 0x77);
  ASSERT_TRUE(dev->dereg_mr(m1).is_ok());
  EXPECT_TRUE(maps_show_pin(buf + kPage, kPage)) << "m2's page was given back while held";
  buf[kPage + 101] = 0x78;
  ASSERT_TRUE(dev->mem().read(m2->view().translate(a + kPage + 101), &y, 1));
  EXPECT_EQ(y, 0x78);
  ASSERT_TRUE(dev->dereg_mr(m2).is_ok());
  EXPECT_FALSE(maps_show_pin(buf, 3 * kPage)) << "private pages not given back";
  EXPECT_LT(pinned_pieces(), pieces);
  EXPECT_EQ(buf[kPage + 100], 0x77);
  EXPECT_EQ(buf[kPage + 101], 0x78);
  EXPECT_EQ(buf[0], 0x40);
  munmap(buf, 3 * kPage);
}

// An application thread keeps incrementing counters in the page while another registers and
// deregisters it 200 times: the moves (registration) and the returns (dereg) lose no store.
// Both ways of moving (pin.cc run_move): on the registering thread itself (the buffer is far
// from its stack: the default) and on the mover thread.
void writes_during_registration(bool mover) {
  auto [dev, pd] = local_device();
  uint8_t* buf = map_pages(2, 0);
  auto* ctr = reinterpret_cast<volatile uint64_t*>(buf + kPage + 512);  // not in the MR
  std::atomic<bool> stop{false}, started{false};
  uint64_t mine = 0;
  std::thread t([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      *ctr = *ctr + 1;
      ++mine;
      started.store(true, std::memory_order_relaxed);
    }
  });
  // The stores must race the moves: on a loaded machine (CI runs tests side by side) the
  // thread may not run before the 200 registrations are over (CI saw mine == 0 once).
  while (!started.load(std::memory_order_relaxed)) std::this_thread::yield();
  const auto a = reinterpret_cast<uint64_t>(buf);
  pin_force_mover_for_test(mover);
  const PinMoveCounts before = pin_move_counts();
  for (int i = 0; i < 200; ++i) {
    auto mr = *dev->reg_mr(pd, a + 8, 2 * kPage - 8, a + 8, kAccessLocalWrite);
    ASSERT_TRUE(mr->shadowed());
    ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  }
  const PinMoveCounts after = pin_move_counts();
  pin_force_mover_for_test(false);
  stop = true;
  t.join();
  EXPECT_GT(mine, 0u);
  EXPECT_EQ(*ctr, mine) << "stores lost while the pages moved";
  // 200 registrations and 200 give-backs, all of them the way asked for.
  EXPECT_EQ((mover ? after.mover_moves - before.mover_moves
                   : after.inline_moves - before.inline_moves), 400u);
  EXPECT_EQ((mover ? after.inline_moves - before.inline_moves
                   : after.mover_moves - before.mover_moves), 0u);
  munmap(buf, 2 * kPage);
}

TEST(Pin, WritesDuringRegistrationAreNotLost) { writes_during_registration(false); }
TEST(Pin, WritesDuringRegistrationAreNotLostOnTheMover) { writes_during_registration(true); }

// Deregistration gives private pages back while other threads store into heap neighbours of
// the buffers on the same pages (as malloc's chunk headers next to a registered allocation):
// 6 writer threads (more than the cores, so a fault is often handled late, after its freeze
// ended or while the next page's freeze is on) each increment two counters, at the head and
// the tail of their own page of one heap block, while the main thread registers a buffer
// between the counters of every page and then deregisters them one after the other, for ~1.5 s.
// No store may be lost and no fault may reach the default handler (the process would die).
TEST(Pin, DeregGiveBackRacesHeapNeighbourStores) {
  auto [dev, pd] = local_device();
  constexpr size_t kWriters = 6;
  constexpr size_t kCtr = 64;  // bytes at the head and tail of each page that stay unregistered
  auto* block = static_cast<uint8_t*>(std::aligned_alloc(kPage, (kWriters + 1) * kPage));
  ASSERT_NE(block, nullptr);
  std::memset(block, 0, (kWriters + 1) * kPage);
  struct Counters {
    volatile uint64_t* head;
    volatile uint64_t* tail;
  };
  std::vector<Counters> ctr(kWriters);
  for (size_t w = 0; w < kWriters; ++w) {
    uint8_t* pg = block + w * kPage;
    ctr[w] = {reinterpret_cast<volatile uint64_t*>(pg),
              reinterpret_cast<volatile uint64_t*>(pg + kPage - 8)};
  }
  std::atomic<bool> stop{false};
  std::vector<uint64_t> mine(kWriters, 0);
  std::vector<std::thread> ws;
  for (size_t w = 0; w < kWriters; ++w) {
    ws.emplace_back([&, w] {
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        *ctr[w].head = *ctr[w].head + 1;
        *ctr[w].tail = *ctr[w].tail + 1;
        ++n;
        if ((n & 1023) == 0) std::this_thread::yield();
      }
      mine[w] = n;
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  int rounds = 0;
  std::vector<std::shared_ptr<Mr>> mrs(kWriters);
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
    for (size_t w = 0; w < kWriters; ++w) {
      const auto a = reinterpret_cast<uint64_t>(block + w * kPage + kCtr);
      auto mr = dev->reg_mr(pd, a, kPage - 2 * kCtr, a, kAccessLocalWrite | kAccessRemoteWrite);
      ASSERT_TRUE(mr.has_value());
      ASSERT_TRUE((*mr)->shadowed());
      mrs[w] = *mr;
    }
    for (size_t w = 0; w < kWriters; ++w) {
      ASSERT_TRUE(dev->dereg_mr(mrs[w]).is_ok());
      mrs[w].reset();
    }
    ++rounds;
  }
  stop = true;
  for (auto& t : ws) t.join();
  EXPECT_GT(rounds, 10);
  EXPECT_FALSE(maps_show_pin(block, (kWriters + 1) * kPage)) << "private pages not given back";
  for (size_t w = 0; w < kWriters; ++w) {
    EXPECT_GT(mine[w], 0u);
    EXPECT_EQ(*ctr[w].head, mine[w]) << "writer " << w << ": head stores lost (" << rounds
                                     << " rounds)";
    EXPECT_EQ(*ctr[w].tail, mine[w]) << "writer " << w << ": tail stores lost";
  }
  std::free(block);
}

// The write freeze itself, at a much higher rate than registration can drive it: two pages are
// frozen in turn (read-only, then writable again) for 0.5 s while 8 threads (4 per page, on the
// 2 CPUs of CI: often preempted between a fault and its handler) store into them. A fault
// handled late, after its freeze ended, or while the other page's freeze is on, or for the
// second time at the same address, must be retried, not passed on as a crash; no store is
// lost.
TEST(Pin, WriteFreezeRetriesFaultsHandledLate) {
  constexpr size_t kWriters = 8;
  void* m = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* pages = static_cast<uint8_t*>(m);
  std::memset(pages, 0, 2 * kPage);
  std::atomic<bool> stop{false};
  std::vector<uint64_t> mine(kWriters, 0);
  std::vector<std::thread> ws;
  for (size_t w = 0; w < kWriters; ++w) {
    ws.emplace_back([&, w] {
      auto* c = reinterpret_cast<volatile uint64_t*>(pages + (w % 2) * kPage + (w / 2) * 64);
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        *c = *c + 1;
        ++n;
      }
      mine[w] = n;
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t freezes = 0;
  // At least 500 ms and 1000 freezes (8 spinning writers on 2 CPUs can starve this thread: a
  // fixed 500 ms saw 736), at most 20 s.
  for (;;) {
    const auto spent = std::chrono::steady_clock::now() - t0;
    if ((spent >= std::chrono::milliseconds(500) && freezes > 1000) ||
        spent >= std::chrono::seconds(20))
      break;
    for (int pg = 0; pg < 2; ++pg) {
      const auto lo = reinterpret_cast<uint64_t>(pages + pg * kPage);
      ASSERT_TRUE(write_freeze_begin(lo, lo + kPage));
      ASSERT_EQ(syscall(SYS_mprotect, lo, kPage, PROT_READ), 0);
      for (int i = 0; i < 200; ++i) asm volatile("" ::: "memory");
      ASSERT_EQ(syscall(SYS_mprotect, lo, kPage, PROT_READ | PROT_WRITE), 0);
      write_freeze_end();
      ++freezes;
    }
  }
  stop = true;
  for (auto& t : ws) t.join();
  EXPECT_GT(freezes, 1000u);
  for (size_t w = 0; w < kWriters; ++w) {
    auto* c = reinterpret_cast<volatile uint64_t*>(pages + (w % 2) * kPage + (w / 2) * 64);
    EXPECT_GT(mine[w], 0u);
    EXPECT_EQ(*c, mine[w]) << "writer " << w << ": stores lost over " << freezes << " freezes";
  }
  munmap(m, 2 * kPage);
}

// The two late cases, made deterministic: the kernel delivers a write fault's signal after the
// instruction faulted, and a thread preempted in between runs its handler late. A SIGSEGV
// with si_code SEGV_ACCERR is queued to this thread itself (rt_tgsigqueueinfo, as the
// kernel's), for an address on a page whose freeze already ended: (1) right after this thread
// waited out a freeze and retried at that address, and another freeze of the page came and
// went; (2) while a freeze of another page is on. Both must be retried (the handler returns),
// not passed on: passing on restores the default action (and a real late fault would kill the
// process), which the fault guard shows as no longer installed.
TEST(Pin, LateFreezeFaultIsRetriedNotPassedOn) {
  void* m = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* pg = static_cast<uint8_t*>(m);
  const auto lo = reinterpret_cast<uint64_t>(pg), lo2 = lo + kPage;
  SafeMemAccess guard;  // installs the fault handler
  ASSERT_TRUE(SafeMemAccess::guard_installed());
  auto* cell = reinterpret_cast<volatile uint64_t*>(pg + 128);
  auto freeze = [&](uint64_t a, int hold_ms, std::atomic<bool>* frozen) {
    return std::thread([=] {
      ASSERT_TRUE(write_freeze_begin(a, a + kPage));
      ASSERT_EQ(syscall(SYS_mprotect, a, kPage, PROT_READ), 0);
      if (frozen) frozen->store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
      ASSERT_EQ(syscall(SYS_mprotect, a, kPage, PROT_READ | PROT_WRITE), 0);
      write_freeze_end();
    });
  };
  auto late_fault = [&](uint64_t a) {
    siginfo_t si{};
    si.si_signo = SIGSEGV;
    si.si_code = SEGV_ACCERR;
    si.si_addr = reinterpret_cast<void*>(a);
    ASSERT_EQ(syscall(SYS_rt_tgsigqueueinfo, getpid(), syscall(SYS_gettid), SIGSEGV, &si), 0);
  };
  // A real fault during a freeze: this thread waits in the handler and retries.
  std::atomic<bool> frozen{false};
  std::thread t = freeze(lo, 30, &frozen);
  while (!frozen.load()) std::this_thread::yield();
  *cell = 1;
  t.join();
  EXPECT_EQ(*cell, 1u);
  // (1) The page is frozen and thawed again; then the same address faults "late".
  freeze(lo, 1, nullptr).join();
  late_fault(reinterpret_cast<uint64_t>(cell));
  EXPECT_TRUE(SafeMemAccess::guard_installed()) << "a late fault at a retried address was passed on";
  // (2) A late fault for the first page while the second one is frozen.
  frozen = false;
  t = freeze(lo2, 30, &frozen);
  while (!frozen.load()) std::this_thread::yield();
  late_fault(reinterpret_cast<uint64_t>(cell) + 8);
  t.join();
  EXPECT_TRUE(SafeMemAccess::guard_installed()) << "a late fault during another freeze was passed on";
  *cell = 2;
  EXPECT_EQ(*cell, 2u);
  munmap(m, 2 * kPage);
  guard.prepare();  // back in place for the tests after this one if it was passed on
}

// A hooked mmap/mremap (as UCX's UCM installs) never runs inside a freeze: its store into a
// heap neighbour on the page being moved would fault on the mover, the one thread that cannot
// wait for the freeze to end. (UCX 1.13's hook also drops mremap's fifth argument, so the
// give-back's MREMAP_FIXED went to whatever address was in a register: the buffer's pages
// stayed read-only and the next free() next to it crashed.) Registration and deregistration
// make their mapping changes with system calls of their own: the hook is never called for
// them and the private pages are given back.
TEST(Pin, MappingHooksNeverRunInsideAFreeze) {
  auto [dev, pd] = local_device();
  uint8_t* buf = map_pages(2, 0);
  ASSERT_NE(buf, nullptr);
  auto* neighbour = reinterpret_cast<volatile uint64_t*>(buf + kPage + kPage - 8);  // not in the MR
  const auto a = reinterpret_cast<uint64_t>(buf);
  g_hook_calls = 0;
  g_hook_store = neighbour;
  for (int i = 0; i < 20; ++i) {
    auto mr = *dev->reg_mr(pd, a, 2 * kPage - 64, a, kAccessLocalWrite);
    EXPECT_TRUE(mr->shadowed());
    ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  }
  g_hook_store = nullptr;
  EXPECT_FALSE(maps_show_pin(buf, 2 * kPage)) << "private pages not given back";
  *neighbour = *neighbour;  // writable again
  EXPECT_EQ(*neighbour, g_hook_calls.load());  // every hooked store kept (and none crashed)
  EXPECT_EQ(g_hook_calls.load(), 0u) << "pinning called the hooked mmap/mremap";
  munmap(buf, 2 * kPage);
}

// A registered buffer on the registering thread's own stack (the freeze must not stop it).
uint8_t on_stack(Device& dev, const std::shared_ptr<Pd>& pd) {
  volatile uint8_t local[3 * 4096];
  for (size_t i = 0; i < sizeof local; ++i) local[i] = static_cast<uint8_t>(i);
  const auto a = reinterpret_cast<uint64_t>(&local[0]);
  auto mr = *dev.reg_mr(pd, a, sizeof local, a, kAccessLocalWrite);
  local[5] = 99;
  uint8_t v = 0;
  EXPECT_TRUE(dev.mem().read(mr->view().translate(a + 5), &v, 1));
  EXPECT_TRUE(dev.dereg_mr(mr).is_ok());
  return static_cast<uint8_t>(v + local[6]);
}

TEST(Pin, StackAndGlobalBuffers) {
  auto [dev, pd] = local_device();
  const PinMoveCounts before = pin_move_counts();
  EXPECT_EQ(on_stack(*dev, pd), 99 + 6);
  // Pages of the registering thread's own stack are moved by the mover (there and back).
  EXPECT_EQ(pin_move_counts().mover_moves - before.mover_moves, 2u);
  static uint8_t global[2 * 4096];
  global[10] = 3;
  const auto a = reinterpret_cast<uint64_t>(global);
  auto mr = *dev->reg_mr(pd, a, sizeof global, a, kAccessLocalWrite);
  global[10] = 4;
  uint8_t v = 0;
  EXPECT_TRUE(dev->mem().read(mr->view().translate(a + 10), &v, 1));
  EXPECT_EQ(v, 4);
  EXPECT_TRUE(dev->dereg_mr(mr).is_ok());
}

// The registering thread's own frames, and its thread control block, in the range the mover
// freezes (an 8 KiB stack buffer whose first page also holds the registration's call chain; a
// thread-local buffer next to the TCB). Test delays make the race certain: the registering
// thread pauses 5 ms between posting the job and going to sleep, and the mover holds each
// freeze 50 ms. A freeze that began during the pause would kill the process with SIGSEGV: the
// thread's next call stores into its frozen frames, where the kernel cannot push the fault's
// signal frame; and on its return from the pause's sleep the kernel updates its rseq area in
// the TCB, which fails on a frozen page. Each runs in a death-test child.
struct FrozenWaiter {
  uint64_t lo = 0, hi = 0;
  bool shadowed = false;
  uint64_t mover_moves = 0, unconfirmed = 0;
};

[[gnu::noinline]] FrozenWaiter register_and_release(uint64_t lo, uint64_t hi) {
  FrozenWaiter w{lo, hi};
  const PinMoveCounts before = pin_move_counts();
  pin_delays_for_test(5000, 50000);
  auto r = pin_range(lo, hi - lo, PinMode::kShadow);
  w.shadowed = r != nullptr && r->shadowed();
  r.reset();  // the give-back is a mover job too
  pin_delays_for_test(0, 0);
  w.mover_moves = pin_move_counts().mover_moves - before.mover_moves;
  w.unconfirmed = pin_move_counts().mover_unconfirmed - before.mover_unconfirmed;
  return w;
}

// The pages from 8 below this frame to the one above it: every frame of the registration's
// call chain (and of the old condition-variable wait) is in the range.
[[gnu::noinline]] FrozenWaiter register_own_frames() {
  const auto fp = reinterpret_cast<uint64_t>(__builtin_frame_address(0));
  const uint64_t page = fp & ~(kPage - 1);
  return register_and_release(page - 8 * kPage, page + kPage);
}

// The end of the mapping that holds address a (0: none), from /proc/self/maps.
uint64_t mapping_end(uint64_t a) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return hi;
  }
  return 0;
}

void expect_survives(FrozenWaiter (*scenario)()) {
  EXPECT_EXIT(
      {
        FrozenWaiter w;
        std::thread([&] { w = scenario(); }).join();
        const bool ok = w.shadowed && w.mover_moves == 2 && w.unconfirmed == 0;
        if (!ok)
          std::fprintf(stderr, "range %#lx-%#lx shadowed %d mover_moves %lu unconfirmed %lu\n",
                       w.lo, w.hi, w.shadowed, w.mover_moves, w.unconfirmed);
        std::fflush(nullptr);
        _exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// A mover thread that cannot be started (pthread_create failing: no memory, a thread limit)
// fails that registration's move, which falls back to direct pages, and is not published: the
// next hand-off starts it. A mover published without its thread left every later registration
// of a stack or thread-local buffer waiting forever. In a death-test child, where no mover
// exists yet.
TEST(Pin, MoverThatCannotStartFailsTheMoveAndIsStartedLater) {
  EXPECT_EXIT(
      {
        std::thread([] {
          uint8_t* p = map_pages(2, 7);
          if (p == nullptr) _exit(2);
          const auto a = reinterpret_cast<uint64_t>(p);
          pin_force_mover_for_test(true);
          pin_fail_mover_start_for_test(true);
          const PinMoveCounts c0 = pin_move_counts();
          auto r = pin_range(a, 2 * kPage, PinMode::kShadow);
          const bool first_direct = r != nullptr && !r->shadowed();
          r.reset();
          const bool none_moved = pin_move_counts().mover_moves == c0.mover_moves;
          pin_fail_mover_start_for_test(false);
          r = pin_range(a, 2 * kPage, PinMode::kShadow);
          const bool then_shadowed = r != nullptr && r->shadowed();
          r.reset();
          const uint64_t moved = pin_move_counts().mover_moves - c0.mover_moves;
          pin_force_mover_for_test(false);
          const bool kept = p[1] == 7;
          std::fprintf(stderr, "first_direct %d none_moved %d then_shadowed %d moved %lu kept %d\n",
                       first_direct, none_moved, then_shadowed, moved, kept);
          std::fflush(nullptr);
          _exit(first_direct && none_moved && then_shadowed && moved == 2 && kept ? 0 : 1);
        }).join();
      },
      testing::ExitedWithCode(0), "");
}

TEST(Pin, MoverHandOffWaitsOffTheFrozenStack) {
  expect_survives([] {
    volatile uint8_t pad[64 << 10];  // keeps the frames below away from the TCB at the top
    for (size_t i = 0; i < sizeof pad; i += 512) pad[i] = static_cast<uint8_t>(i >> 9);
    FrozenWaiter w = register_own_frames();
    for (size_t i = 0; i < sizeof pad; i += 512)
      if (pad[i] != static_cast<uint8_t>(i >> 9)) w.shadowed = false;  // a byte not kept
    const auto tp = reinterpret_cast<uint64_t>(__builtin_thread_pointer());
    if (w.hi + 4 * kPage > tp) w.shadowed = false;  // the range reached the TCB: not this case
    return w;
  });
}

TEST(Pin, MoverHandOffKeepsTheWaitersTcbOutOfTheFreeze) {
  expect_survives([] {
    const auto tp = reinterpret_cast<uint64_t>(__builtin_thread_pointer());
    const uint64_t page = tp & ~(kPage - 1), end = mapping_end(tp);
    return register_and_release(page - 2 * kPage, std::min(page + 2 * kPage, end));
  });
}

// A buffer in this thread's static TLS, next to its thread control block (the kernel updates
// the rseq area there when the thread is preempted): moved by the mover, and a registration
// far from the stack and the TLS by the registering thread itself.
thread_local uint8_t tl_buf[3 * 4096];

TEST(Pin, ThreadLocalBufferGoesToTheMover) {
  auto [dev, pd] = local_device();
  std::memset(tl_buf, 0x61, sizeof tl_buf);
  const auto a = reinterpret_cast<uint64_t>(tl_buf);
  PinMoveCounts before = pin_move_counts();
  auto mr = *dev->reg_mr(pd, a, sizeof tl_buf, a, kAccessLocalWrite);
  const bool shadowed = mr->shadowed();
  tl_buf[7] = 0x62;
  uint8_t v = 0;
  EXPECT_TRUE(dev->mem().read(mr->view().translate(a + 7), &v, 1));
  ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  if (!shadowed) GTEST_SKIP() << "static TLS not in movable memory here";
  EXPECT_EQ(v, 0x62);
  EXPECT_EQ(tl_buf[8], 0x61);
  PinMoveCounts after = pin_move_counts();
  EXPECT_EQ(after.inline_moves, before.inline_moves);
  EXPECT_GE(after.mover_moves - before.mover_moves, 2u);
  uint8_t* far = map_pages(2, 0x63);
  const auto f = reinterpret_cast<uint64_t>(far);
  before = after;
  mr = *dev->reg_mr(pd, f, 2 * kPage, f, kAccessLocalWrite);
  ASSERT_TRUE(mr->shadowed());
  ASSERT_TRUE(dev->dereg_mr(mr).is_ok());
  after = pin_move_counts();
  EXPECT_EQ(after.inline_moves - before.inline_moves, 2u);
  EXPECT_EQ(after.mover_moves, before.mover_moves);
  munmap(far, 2 * kPage);
}

// fork: the child's stores into a registered buffer never reach the parent (as with pinned
// pages, which the kernel copies for the child).
TEST(Pin, ForkedChildGetsPrivateCopy) {
  auto [dev, pd] = local_device();
  uint8_t* buf = map_pages(2, 0x5c);
  const auto a = reinterpret_cast<uint64_t>(buf);
  auto mr = *dev->reg_mr(pd, a, 2 * kPage, a, kAccessLocalWrite);
  ASSERT_TRUE(mr->shadowed());
  std::fflush(nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::memset(buf, 0x33, 2 * kPage);
    _exit(buf[0] == 0x33 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (size_t i = 0; i < 2 * kPage; ++i) ASSERT_EQ(buf[i], 0x5c) << "the child wrote into the parent";
  EXPECT_TRUE(dev->dereg_mr(mr).is_ok());
  munmap(buf, 2 * kPage);
}

// An already-shared range (MAP_SHARED anonymous: shmem) is mapped a second time from the same
// object through /proc/self/map_files (CAP_SYS_ADMIN); without it the MR stays direct (skip).
TEST(Pin, SharedMappingIsReopenedWhenPermitted) {
  auto [dev, pd] = local_device();
  void* p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* buf = static_cast<uint8_t*>(p);
  std::memset(buf, 0x11, 2 * kPage);
  const auto a = reinterpret_cast<uint64_t>(buf);
  auto mr = *dev->reg_mr(pd, a, 2 * kPage, a, kAccessLocalWrite | kAccessRemoteRead);
  if (!mr->shadowed()) {
    EXPECT_TRUE(dev->dereg_mr(mr).is_ok());
    munmap(p, 2 * kPage);
    GTEST_SKIP() << "/proc/self/map_files not openable (no CAP_SYS_ADMIN): the MR is direct";
  }
  buf[3] = 0x12;  // shared with the device view
  ASSERT_EQ(map_pages(2, 0x22, buf, MAP_FIXED), buf);
  uint8_t v[4] = {};
  ASSERT_TRUE(dev->mem().read(mr->view().translate(a), v, 4));
  EXPECT_EQ(v[0], 0x11);
  EXPECT_EQ(v[3], 0x12);
  EXPECT_TRUE(dev->dereg_mr(mr).is_ok());
  EXPECT_EQ(buf[0], 0x22);
  munmap(buf, 2 * kPage);
}

// The escape hatch (SOFTRNIC_PIN=direct): the device reads the application's addresses, so
// the remapped memory is what the old rkey serves. Kept to show the difference is the pin.
TEST(Pin, DirectPinServesWhateverIsMappedNow) {
  Pair p("127.31.78.5", "127.31.78.6", PinMode::kDirect);
  uint8_t* buf = map_pages(kPages, 0x11);
  auto mr = p.s.mr(buf, kPages * kPage);
  ASSERT_FALSE(mr->shadowed());
  ASSERT_EQ(map_pages(kPages, 0x22, buf, MAP_FIXED), buf);
  std::vector<uint8_t> dst(kPages * kPage, 0);
  ASSERT_EQ(p.read(reinterpret_cast<uint64_t>(buf), mr->rkey(), dst.data(),
                   static_cast<uint32_t>(dst.size())),
            WcStatus::kSuccess);
  EXPECT_EQ(dst[0], 0x22);
  EXPECT_TRUE(p.s.dev->dereg_mr(mr).is_ok());
  munmap(buf, kPages * kPage);
}

}  // namespace
}  // namespace rnic::emu
