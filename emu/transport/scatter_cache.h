// emu/transport/scatter_cache.h: the local checks a receive batch keeps for its scatters.
#pragma once

#include <cstdint>

#include "emu/objects/mr.h"

namespace rnic::emu {

// The local checks of one receive batch's scatters (scatter_sges: READ responses and atomic
// results at the requester, SEND and UD payloads at the responder). A 64 KiB READ's responses are
// 16 to 64 packets into one SGE, and each looked its lkey up, entered the MR's gate and read its
// view again (7% of the READ requester's samples with the lock and guard work, docs/progress.md).
// A kept check holds its MR's guard, so another thread cannot deregister or rereg the MR under it
// (they wait), and its view, with the view's publication: a later piece compares the key, PD and
// range with the kept view (LOCAL_WRITE and VALID were checked when kept), that the view is still
// the current publication (a dereg publishes the MR invalid before it waits; a rereg, close or
// dereg from inside a copy on this thread changes it) and that no closer waits (then the guard
// goes at once and the full check refuses as it would have). Each engine's lives for one batch of
// its drain_locked, under rx_mu_, and no longer (also on an early way out): a guard kept across
// drains would make a dereg wait for the peer's next packet. A rereg or dereg on another thread
// that closes the gate meanwhile makes the batch's next piece into that MR fail (it lets the
// guard go, and the full check finds the MR in transition), as it would have if the piece had
// come while the gate was closed: ibv_rereg_mr(3) is a dereg followed by a reg. Not thread-safe
// (the drain's thread only).
class ScatterCache {
 public:
  static constexpr int kSlots = 4;  // MRs kept at once (a few QPs' buffers in one batch)
  // The device address of piece if a kept check of keys' table covers it for a write by a
  // QP of pd; a kept check that no longer holds is dropped.
  bool find(const KeyTable& keys, const Sge& piece, const Pd* pd, uint64_t* host);
  // Keeps a successful check_local with need_write (its MR, view and guard).
  void keep(const KeyTable& keys, const Mr& mr, const MrView& v, AccessGuard&& g);
  // Lets every guard go (at a batch's end); returns the hits since the last reset.
  uint64_t reset() {
    if (n_ == 0 && hits_ == 0) return 0;  // an empty batch: nothing to do
    return reset_slow();
  }

 private:
  struct Slot {
    const KeyTable* keys = nullptr;
    const Mr* mr = nullptr;  // kept alive by g
    MrView v;
    AccessGuard g;
    void clear() {
      g.reset();
      mr = nullptr;
    }
  };
  uint64_t reset_slow();
  void drop(int i);
  Slot slots_[kSlots];
  int n_ = 0;     // slots_[0, n_) hold a check
  int next_ = 0;  // the one replaced when all are taken
  uint64_t hits_ = 0;
};

}  // namespace rnic::emu
