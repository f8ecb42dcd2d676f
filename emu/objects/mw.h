// emu/objects/mw.h: memory windows, type 1 and type 2: allocation state, binding (all the checks
// of docs/checks.md §2.4 "MW bind checks", scenario S15), invalidation (LOCAL_INV,
// SEND_WITH_INV) and the MR bound-window count that makes dereg refuse.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "emu/objects/mr.h"
#include "emu/objects/pd.h"
#include "emu/objects/status.h"
#include "emu/objects/types.h"
#include "emu/objects/wqe.h"

namespace rnic::emu {

class Device;
class Mw;

// Internal: the bind/invalidate paths' access to Mr and Mw internals (defined in mw.cc).
struct MwOps {
  static void bound_inc(Mr& mr);
  static void bound_dec(Mr& mr);
  // Drop the window's binding. REQUIRES: mw's lock held.
  static void unbind_locked(Mw& mw);
  static WcStatus bind(Device& dev, const Pd* qp_pd, uint32_t qpn, const BindInfo& b,
                       uint32_t* out_rkey);
  static bool invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey);
};

// kFree: type 2 after alloc/invalidate (bindable). kValid: type 1 always (bound or not;
// length 0 = unbound), type 2 while bound. kInvalid: deallocated.
enum class MwState : uint8_t { kInvalid = 0, kFree = 1, kValid = 2 };

struct MwView {
  MwType type = MwType::kType1;
  MwState state = MwState::kInvalid;
  uint32_t rkey = 0;
  const Pd* pd = nullptr;       // identity only
  std::shared_ptr<Mr> mr;       // bound MR (null when unbound)
  uint64_t addr = 0;            // window start: VA (or 0-based offset base when zero_based)
  uint64_t length = 0;
  uint32_t access = 0;          // window rights (kAccessRemote*, kAccessZeroBased)
  bool zero_based = false;
  uint32_t qpn = 0;             // type 2: the QP it was bound through; 0 otherwise
};

class Mw {
 public:
  Mw(Device& dev, std::shared_ptr<Pd> pd, MwType type);
  ~Mw();
  uint32_t handle() const { return handle_; }
  MwType type() const { return type_; }
  uint32_t rkey() const;
  const std::shared_ptr<Pd>& pd() const { return pd_; }
  MwView view() const;
  // Accesses in flight through this window (mr.h AccessGate); bind, invalidate and
  // dealloc drain it before the binding changes.
  AccessGate& gate() const { return gate_; }

  void* user_context = nullptr;

 private:
  friend class Device;
  friend struct MwOps;
  Device* dev_;
  uint32_t handle_ = 0;
  std::shared_ptr<Pd> pd_;
  MwType type_;
  mutable std::mutex mu_;
  MwState state_;
  uint32_t rkey_ = 0;
  std::shared_ptr<Mr> mr_;
  uint64_t addr_ = 0, length_ = 0;
  uint32_t access_ = 0;
  bool zero_based_ = false;
  uint32_t qpn_ = 0;
  mutable AccessGate gate_;
};

// Execute a BIND_MW WQE for the QP (qp_pd, qpn): the function the requester calls when
// it reaches a kBindMw WQE (both types; ibv_bind_mw for type 1 posts such a WQE).
// In order (docs/checks.md §2.4): MW exists with full mw_rkey; if length != 0 the MR exists with
// full mr_lkey; access bits ⊆ {REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED};
// type 1: VALID and not zero-based; type 2: FREE, qp PD == MW PD, length != 0; MR PD ==
// MW PD, MR not zero-based, MR has MW_BIND; REMOTE_WRITE/ATOMIC window needs MR
// LOCAL_WRITE; window inside the MR. Any failure -> kMwBindErr and NOTHING changes (the old
// rkey keeps its validity). Success: rkey = (rkey & ~0xff) | (new_rkey & 0xff), state
// VALID, MR bound counts moved, type 2 records qpn; *out_rkey = the new rkey.
// Type 1 with length 0 unbinds (stays VALID, length 0: remote access fails).
// REQUIRES: caller holds the QP's send lock (serialises binds per QP). Thread-safe w.r.t.
// lookups on other threads.
WcStatus bind_mw(Device& dev, const Pd* qp_pd, uint32_t qpn, const BindInfo& bind,
                 uint32_t* out_rkey = nullptr);

// LOCAL_INV of an rkey/lkey from this QP (requester). MW: full key match, same PD, type 2,
// VALID -> FREE. MR: fast-reg MRs only (none yet) -> failure. Failure -> kLocQpOpErr.
WcStatus local_invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey);

// SEND_WITH_INV received (IETH; docs/checks.md §2.2 row 11). MW: full key match, same PD,
// type 2, VALID -> FREE. A type-1 MW, an MR, or an unknown key -> false (Class J: recv WC
// kRemInvReqErr). Nothing is invalidated on failure.
bool remote_invalidate(Device& dev, const Pd* qp_pd, uint32_t rkey);

}  // namespace rnic::emu
