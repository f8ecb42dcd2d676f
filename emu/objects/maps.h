// emu/objects/maps.h: this process's mappings over an address range, as /proc/self/maps shows
// them (registration's range check, mr.h check_mr_range, and shadow pinning, pin.h).
//
// Two sources, one answer:
//   - kQuery: the PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11+): one system call per
//     mapping, whatever the number of mappings below the range. The fd is opened once per
//     process (O_CLOEXEC; reopened in a forked child, whose mappings are its own).
//   - kText: read and parse /proc/self/maps, stopping at the first line past the range. The
//     kernel formats every line below the range on each read: tens of microseconds in a
//     process with a few hundred mappings (tests/bench/pin_bench BM_Maps).
// kAuto (the default) uses kQuery when the kernel answers it and falls back to kText for good
// the first time it does not (ENOTTY/EINVAL: an older kernel, or a seccomp filter). Both give
// the same mappings with the same fields (maps_test compares them over this process's whole
// address space).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rnic::emu {

// One mapping (a VMA), whole: not clipped to the range asked for.
struct Mapping {
  uint64_t lo = 0, hi = 0;  // [lo, hi), page aligned
  int prot = 0;             // PROT_READ | PROT_WRITE | PROT_EXEC
  bool shared = false;      // 's' in /proc/self/maps (VM_MAYSHARE)
  uint64_t off = 0;         // file offset of lo (0 for anonymous memory)
  uint64_t ino = 0;         // backing file's inode (0: anonymous)
  std::string path;         // the maps name ("", "[heap]", "[stack]", "[anon:x]", "/path ..."):
                            // only when asked for (kNames)
};

enum class MapsSource : uint8_t { kAuto = 0, kQuery = 1, kText = 2 };

enum MapsFlags : unsigned {
  kNames = 1u << 0,      // fill Mapping::path
  kStopAtHole = 1u << 1  // stop at the first unmapped byte of the range (a range check needs
                         // no more); otherwise the mappings after a hole are listed too
};

struct MapsResult {
  bool ok = false;       // the source answered (false: nothing is known, *out is empty)
  bool covered = false;  // every byte of [lo, hi) is mapped (with kStopAtHole: up to the hole)
};

// The mappings that intersect [lo, hi), in address order, into *out (cleared first).
// REQUIRES: lo < hi. Thread-safe (control path: registration, deregistration).
MapsResult read_mappings(uint64_t lo, uint64_t hi, unsigned flags, std::vector<Mapping>* out,
                         MapsSource src = MapsSource::kAuto);

// Whether kAuto uses the ioctl in this process (it answered, or has not failed yet and the
// first query succeeds now).
bool maps_query_available();

// Tests: make kAuto use kText (true) or go back to probing the ioctl (false).
void maps_force_text_for_test(bool text);

}  // namespace rnic::emu
