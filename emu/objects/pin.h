// emu/objects/pin.h: the device's hold on registered pages ("shadow pinning", issue 10 item 2).
//
// A NIC pins the physical pages behind an MR and DMAs to them: if the application later frees
// the buffer and new memory appears at the same address, the NIC still sees the old pages,
// never the new mapping. In user space we get the same by making the pages shareable and
// giving the device a second mapping of them:
//   - registration moves each private page range of the MR (anonymous, heap, stack, private
//     file mapping) into a memfd: copy the bytes, then mmap the memfd MAP_SHARED|MAP_FIXED over
//     the same addresses with the same protections. The application keeps its addresses and
//     bytes; its pages are now the memfd's.
//   - the device maps the same memfd a second time at an address of its own (the "device
//     view", MADV_DONTFORK) and every engine access to the MR goes through that view
//     (MrView::translate returns view addresses). It is still one memcpy per access.
//   - when the application munmaps, or mmaps MAP_FIXED over the range, only its own mapping
//     goes: the device view keeps the old pages until deregistration. A READ with the old rkey
//     returns the old bytes, never the new memory.
//   - a range that is already MAP_SHARED (memfd, shm, a file) is mapped a second time from the
//     same object (/proc/self/map_files; needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE). If it
//     cannot be opened, or a mapping is special ([vdso], hugetlb, a device), the whole MR keeps
//     direct access to the application's addresses (PinnedRange::shadowed() false; the
//     README says so).
//   - overlapping registrations share the moved pages: each moved range is a refcounted piece;
//     the last deregistration of a piece gives the application private anonymous pages again
//     (copy + mremap), so THP, fork and MADV_DONTNEED behave as before registration.
// Races and costs (README "Security"):
//   - both moves (registration's to the memfd, the last deregistration's back to private pages)
//     copy under a write freeze: the range is made read-only, an application thread that writes
//     to it meanwhile (a heap neighbour of the buffer on the same page) faults, waits in the
//     fault handler until the move is done and retries (memory.h: also a fault whose handler
//     runs late, after its freeze ended or during the next one); one mmap/mremap puts the new
//     pages in place, so no access sees the range unmapped. The move runs on the registering
//     (or deregistering) thread itself, with asynchronous signals blocked, unless the range is
//     near that thread's stack or errno, which it stores into during the move: then on the
//     mover, a persistent thread of ours (pin.cc run_move). The mover starts only once the
//     registering thread sleeps in the kernel (its stack, thread control block or rseq area
//     may be the frozen pages), and that thread posts and waits on a stack of its own with
//     asynchronous signals blocked (pin.cc run_on_mover). Either makes its mapping changes
//     and the copy with raw system calls: a library hooking mmap/mremap (UCX's UCM) runs none
//     of its code, which stores into the heap, inside the freeze. A system call writing into
//     the range during the move (read(2) into a buffer being registered by another thread)
//     gets EFAULT instead.
//   - fork: the device view is not inherited; the child's copy of a moved range is made private
//     in the child (as the kernel copies pinned pages at fork), taken right after fork.
//   - moved ranges lose transparent huge pages and mlock() while registered.
//   - registration and deregistration copy the range once each, as file I/O on the memfd
//     (pwrite of the application's pages into it, pread into fresh private pages populated
//     beforehand), and look the range's mappings up with PROCMAP_QUERY (maps.h); what is left
//     is the kernel's per-page work: allocating, copying and freeing every page twice
//     (tests/bench/pin_bench.cc, `scripts/bench regmr`).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace rnic::emu {

// SOFTRNIC_PIN: kShadow (default) as above; kDirect: the device accesses the application's
// addresses (a freed-and-remapped range is served with its new contents).
enum class PinMode : uint8_t { kShadow = 0, kDirect = 1 };

// A memfd holding moved pages (one per registration that moved any). Sealed against
// shrinking (F_SEAL_SHRINK), so a mapping of it never faults: another device on this host
// may map it read-only to copy a message's payload straight out of it (one-copy, emu/transport/
// one_copy.h). `id` is unique in this process.
struct PinBacking {
  int fd = -1;
  uint64_t ino = 0;
  uint64_t size = 0;
  uint32_t id = 0;
  PinBacking() = default;
  PinBacking(const PinBacking&) = delete;
  PinBacking& operator=(const PinBacking&) = delete;
  ~PinBacking();
};

// Where device bytes [a, a+len) of a pinned range live: one backing, from file offset `off`.
struct PinLoc {
  std::shared_ptr<const PinBacking> backing;
  uint64_t off = 0;
};

class PinnedRange {
 public:
  PinnedRange(const PinnedRange&) = delete;
  PinnedRange& operator=(const PinnedRange&) = delete;
  ~PinnedRange();  // unmaps the device view and releases the pieces

  // The device address of host address `a` (REQUIRES: inside the pinned pages).
  uint64_t dev_addr(uint64_t a) const { return a - host_lo_ + dev_lo_; }
  // Whether the device has its own view (false: direct access, dev_addr(a) == a).
  bool shadowed() const { return view_ != 0; }
  // The memfd and offset behind device bytes [a, a+len) when they lie in one moved piece
  // (false: direct, a shared file mapping, or the range crosses pieces).
  bool locate(uint64_t a, uint64_t len, PinLoc* out) const;

 private:
  friend std::shared_ptr<PinnedRange> pin_range(uint64_t, uint64_t, PinMode);
  PinnedRange() = default;
  uint64_t host_lo_ = 0, size_ = 0;
  uint64_t dev_lo_ = 0;   // == host_lo_ when direct
  uint64_t view_ = 0;     // the device view's mapping (0: none)
  uint64_t fork_gen_ = 0; // a forked child never unmaps or restores the parent's objects
  std::vector<uint64_t> pieces_;  // host start of every piece this range holds a ref on
  void add_seg(uint64_t view_off, uint64_t len, uint64_t file_off,
               std::shared_ptr<const PinBacking> b);
  struct Seg {  // a part of the device view mapped from a moved piece's memfd
    uint64_t view_off = 0, len = 0, file_off = 0;
    std::shared_ptr<const PinBacking> b;
  };
  std::vector<Seg> segs_;
};

// Pins the pages of [addr, addr+len) (REQUIRES: check_mr_range accepted it). Never fails: when
// the range cannot be shadowed (or mode is kDirect) the result is a direct pin. nullptr only
// for len == 0.
std::shared_ptr<PinnedRange> pin_range(uint64_t addr, uint64_t len, PinMode mode);

// Moved pieces alive in this process (tests).
size_t pinned_pieces();

// Page moves (to the memfd and back) made so far on the registering or deregistering thread
// itself, and on the mover thread (pin.cc run_move: a range near that thread's stack).
struct PinMoveCounts {
  uint64_t inline_moves = 0;
  uint64_t mover_moves = 0;
  uint64_t mover_unconfirmed = 0;  // mover jobs started without seeing the waiter asleep
};
PinMoveCounts pin_move_counts();

// Tests: make every move go to the mover thread (true), or choose as usual (false).
void pin_force_mover_for_test(bool on);
// Tests: starting the mover thread fails (as pthread_create would) while on.
void pin_fail_mover_start_for_test(bool on);
// Tests: the registering thread pauses this long between posting a mover job and waiting for
// it, and every move to the memfd holds its freeze this long (0, 0: no delays).
void pin_delays_for_test(uint32_t waiter_pause_us, uint32_t freeze_hold_us);

}  // namespace rnic::emu
