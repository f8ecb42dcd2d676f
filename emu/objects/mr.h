// emu/objects/mr.h: memory regions and the protection checks built on them: local SGE checks
// (docs/checks.md §2.4, S09) and the remote rkey check (docs/checks.md §2.3, MR and MW paths),
// plus address translation iova/window address -> host address.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>

#include "emu/objects/pd.h"
#include "emu/objects/pin.h"
#include "emu/objects/status.h"
#include "emu/objects/types.h"
#include "emu/objects/wqe.h"

namespace rnic::emu {

class KeyTable;
struct MrCache;  // emu/objects/transport_state.h

// An object's accesses in flight and whether new ones may start (issue 10 item 3). The data
// path enters the gate of the MR (or MW) it resolved a key to before reading its view and
// leaves when the copy is done (AccessGuard); deregistration, rereg, MW bind/invalidate and
// close_device close it and wait for the count to drain, so after they return no access
// through the object is running or can start. Cost per access: one atomic increment and one
// decrement on the object's cache line plus a 16-entry thread-local table
// (tests/bench/mem_access_bench.cc).
class AccessGate {
 public:
  // Data path: false (nothing held) if the gate is closed.
  bool enter();
  void leave();
  // Control path: refuse new entries, then wait until every access in flight on other
  // threads has left. The calling thread's own guards on this gate are not waited for (a
  // MemAccess hook or callback may deregister from inside an access; it cannot wait for
  // itself). Each call must be paired with reopen() unless the object dies closed.
  void close_and_drain();
  // Undo one close_and_drain (rereg / bind / invalidate done). Closes nest: the gate opens
  // when every closer has reopened, so two concurrent mutators cannot let an access in
  // while the second one is still changing the object.
  void reopen();
  bool closed() const { return closers_.load(std::memory_order_acquire) != 0; }
  uint32_t inflight() const { return inflight_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint32_t> inflight_{0};
  std::atomic<uint32_t> closers_{0};
};

// RAII for a mutator (rereg, MW bind/invalidate): close_and_drain() now, reopen() at scope
// exit. Deregistration and dealloc leave the gate closed and call close_and_drain() alone.
class GateClosed {
 public:
  explicit GateClosed(AccessGate& g) : g_(g) { g_.close_and_drain(); }
  ~GateClosed() { g_.reopen(); }
  GateClosed(const GateClosed&) = delete;
  GateClosed& operator=(const GateClosed&) = delete;

 private:
  AccessGate& g_;
};

// RAII: one access in flight through a gate; keeps the gate's owner (Mr/Mw) alive.
class AccessGuard {
 public:
  AccessGuard() = default;
  AccessGuard(AccessGuard&& o) noexcept;
  AccessGuard& operator=(AccessGuard&& o) noexcept;
  AccessGuard(const AccessGuard&) = delete;
  AccessGuard& operator=(const AccessGuard&) = delete;
  ~AccessGuard() { reset(); }
  // Enter `gate` (owned by *owner). false: closed, nothing held. Releases what was held.
  bool acquire(AccessGate& gate, std::shared_ptr<void> owner);
  void reset();
  bool held() const { return gate_ != nullptr; }

 private:
  AccessGate* gate_ = nullptr;
  std::shared_ptr<void> owner_;
};

enum class MrState : uint8_t { kInvalid = 0, kFree = 1, kValid = 2 };

// A consistent snapshot of an MR's mutable fields (they change only under rereg).
struct MrView {
  const Pd* pd = nullptr;  // identity only (compare); never dereference
  uint64_t host_addr = 0;  // process address of byte 0 (ibv_mr::addr)
  uint64_t dev_addr = 0;   // where the device reaches byte 0: its view of the pinned pages
                           // (pin.h), == host_addr for a direct pin
  uint64_t iova = 0;       // I/O virtual address of byte 0 (== host_addr for ibv_reg_mr)
  uint64_t length = 0;
  uint32_t access = 0;     // kAccess* bits
  uint32_t key = 0;        // lkey == rkey
  MrState state = MrState::kInvalid;
  uint32_t seq = 0;        // the publication it was read from (Mr::view_seq)

  // [va, va+len) inside [iova, iova+length), overflow-free (docs/checks.md §2.3 step 6).
  bool in_range(uint64_t va, uint64_t len) const {
    return va >= iova && len <= length && va - iova <= length - len;
  }
  // The address the engine copies to/from (the device view). REQUIRES: in_range(va, ...).
  uint64_t translate(uint64_t va) const { return dev_addr + (va - iova); }
};

// A memory region. Created by Device::reg_mr; the key table holds it by key.
// Thread-safety: all const members are safe from any thread (a shared lock guards the
// fields rereg can change; view() reads their published copy without it); the mutators are
// for Device (control path).
class Mr {
 public:
  Mr(Device& dev, std::shared_ptr<Pd> pd, uint64_t host_addr, uint64_t length, uint64_t iova,
     uint32_t access, std::shared_ptr<PinnedRange> pin);
  ~Mr();

  // Device-wide registration handle (ibv_mr::handle); stable across rereg.
  uint32_t handle() const { return handle_; }
  uint32_t lkey() const { return key_.load(std::memory_order_acquire); }
  uint32_t rkey() const { return key_.load(std::memory_order_acquire); }
  MrView view() const;
  // Changes with every publication of the view (rereg, dereg, close, the pin's release): a
  // view whose seq is still current describes the MR as it is. One acquire load.
  uint32_t view_seq() const { return vseq_.load(std::memory_order_acquire); }
  std::shared_ptr<Pd> pd() const;
  uint64_t addr() const { return view().host_addr; }
  uint64_t iova() const { return view().iova; }
  uint64_t length() const { return view().length; }
  uint32_t access() const { return view().access; }
  // Number of memory windows currently bound to this MR (dereg/rereg refuse while > 0).
  uint32_t bound_mws() const { return bound_mws_.load(); }
  // Whether the device reaches this MR through its own view of the pinned pages (pin.h).
  bool shadowed() const;
  // The pinned pages (null once deregistered, or for an MR that pins nothing).
  std::shared_ptr<PinnedRange> pin() const;
  // Accesses in flight through this MR (AccessGate).
  AccessGate& gate() const { return gate_; }

  void* user_context = nullptr;

 private:
  friend class Device;
  friend struct MwOps;
  // Publishes the fields below to view(): after every change of them. REQUIRES: mu_
  // exclusively (the only writer).
  void publish_view_locked();

  Device* dev_;
  uint32_t handle_ = 0;
  mutable std::shared_mutex mu_;
  // view()'s copy of the fields, read without a lock (one per packet: the shared lock's two
  // atomic read-modify-writes on a line every receiving and posting thread shares were ~3%
  // of a 64 B message's CPU, tests/bench/path_bench). A sequence lock: odd while
  // publish_view_locked writes; a reader that saw it change reads again. Atomic words
  // (release stores, acquire loads), so a read racing a write is defined, also for TSan.
  std::atomic<uint32_t> vseq_{0};
  std::atomic<uint64_t> vw_[7] = {};
  std::shared_ptr<Pd> pd_;
  uint64_t host_addr_, length_, iova_;
  uint32_t access_;
  std::shared_ptr<PinnedRange> pin_;  // null once deregistered
  MrState state_ = MrState::kValid;
  // The key again, as view word 5 holds it: both are written under mu_, so they are equal
  // whenever it is free (a lock-free reader may see them differ inside add_mr or rereg, while
  // the key is not yet handed out or the gate is closed, so covers() fails anyway). Kept
  // twice on purpose: lkey() is read per packet (GatherCache::covers), and one atomic load is
  // cheaper than a sequence read of the view.
  std::atomic<uint32_t> key_{0};
  std::atomic<uint32_t> bound_mws_{0};
  mutable AccessGate gate_;
};

// Validate reg_mr access flags like rdma-core/the kernel: REMOTE_WRITE or REMOTE_ATOMIC
// without LOCAL_WRITE -> EINVAL; unknown non-optional bits -> EINVAL. ON_DEMAND is
// accepted (Device::reg_mr: not pinned, not checked against the mappings). Optional-range
// bits (RELAXED_ORDERING...) are accepted and ignored.
Status check_mr_access(uint32_t access);

// Whether reg_mr needs the pages writable: LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC or
// MW_BIND, as the kernel's ib_access_writable() (a bound window may grant remote write).
bool mr_access_writable(uint32_t access);

// Validate a registration range against this process's mappings, as the kernel's page pin
// (ib_umem_get) would: [addr, addr+length) overflowing -> EINVAL; length > max_size ->
// EINVAL; any byte unmapped (NULL, a hole) or in a mapping without read permission
// (PROT_NONE) -> EFAULT; writable access (mr_access_writable) and a mapping without write
// permission -> EFAULT. REQUIRES: length != 0. Asks the mappings over the range only
// (maps.h: one PROCMAP_QUERY per mapping, about a microsecond each; or parsing
// /proc/self/maps up to the range on kernels before 6.11). They are the only source of the
// protection bits — mincore and process_vm_readv see mapped/readable but not writable, and
// probing writes would race the application's own stores.
Status check_mr_range(uint64_t addr, uint64_t length, uint32_t access, uint64_t max_size);

// Which status a bad local lkey produces. kSpec (default): IBV_WC_LOC_PROT_ERR for every
// local protection failure. kRxe: IBV_WC_LOC_QP_OP_ERR for an unknown/stale lkey, as Linux
// rxe reports (docs/checks.md §2.4, §7 question 2; DeviceConfig::errors).
enum class ErrorsMode : uint8_t { kSpec = 0, kRxe = 1 };

// Local SGE check (docs/checks.md §2.4; S09): lkey names a live MR (full key, VALID), the MR's
// PD is `pd`, LOCAL_WRITE is granted when need_write (memory will be written: RECV scatter,
// READ response, atomic result), and [addr, addr+length) lies inside the MR without
// overflow. A zero-length SGE is always fine (nothing is touched). Returns kSuccess and, if
// host_addr != nullptr, the translated address; else kLocProtErr (or kLocQpOpErr for an
// unknown lkey in kRxe mode). Hot path: one shared-locked lookup, no allocation.
// With guard != nullptr the MR's gate is entered before its view is read and, on success,
// held in *guard: the caller copies while holding it and dereg waits for it. Without a
// guard nothing is held (a check-only call, or a legacy caller that copies unguarded).
// view_out: the view the check read (what the guard keeps so), for a caller that keeps it.
// cache: the caller's MrCache for this key's kind (see there), or nullptr.
WcStatus check_local(const KeyTable& keys, const Sge& sge, const Pd* pd, bool need_write,
                     ErrorsMode mode = ErrorsMode::kSpec, uint64_t* host_addr = nullptr,
                     AccessGuard* guard = nullptr, std::shared_ptr<Mr>* mr_out = nullptr,
                     MrView* view_out = nullptr, MrCache* cache = nullptr);

// Outcome of a remote rkey check. Every failure is a Remote Access error (NAK 0x62,
// requester IBV_WC_REM_ACCESS_ERR); the distinct values exist for counters and tests.
enum class RkeyResult : uint8_t {
  kOk = 0,
  kBadKey,          // no live MR/MW with this full 32-bit key
  kPdMismatch,      // MR/MW PD != QP PD
  kMwWrongQp,       // type-2 MW bound to another QP
  kMwUnbound,       // MW length 0 or not VALID (type 1 unbound / type 2 FREE)
  kAccessDenied,    // MR/MW lacks a required REMOTE_* right
  kInvalidState,    // MR not VALID, or MR/MW being deregistered/rebound (gate closed)
  kOutOfRange,      // [va, va+len) not inside the MR/window
  kMisaligned,      // atomic address not 8-byte aligned (callers map this to INV_REQ)
};
const char* rkey_result_name(RkeyResult r);

// Where a successful remote check says the bytes are.
// Holding it holds an access in flight on the MR or MW the rkey named (AccessGuard): copy
// while it lives; dereg_mr / MW invalidation wait until it is destroyed or reset.
struct RemoteTarget {
  std::shared_ptr<Mr> mr;  // keeps the MR alive while the caller copies
  uint64_t host_addr = 0;  // translated address of va
  AccessGuard guard;       // declared last: released before mr
};

// Remote access check (docs/checks.md §2.3), in rxe's order. `required` is kAccessRemoteRead,
// kAccessRemoteWrite or kAccessRemoteAtomic (derived from the opcode by the caller).
// Zero-length READ/WRITE (len == 0 and required != atomic) return kOk without touching the
// key table (C9-88); out->mr stays null. For atomics, checks 8-byte alignment of va last.
// MW path: full key match, MW PD == qp_pd, type 2 bound to qpn, length != 0, access ⊇
// required, VALID; then the underlying MR (VALID) and, for a zero-based window, va is an
// offset added to the window base. MR path: full key, PD, access ⊇ required (all bits),
// VALID, range. Thread-safe; hot path.
// cache: as check_local's (MR keys only: an MW key is always looked up).
RkeyResult check_remote(const KeyTable& keys, uint32_t rkey, const Pd* qp_pd, uint32_t qpn,
                        uint64_t va, uint64_t len, uint32_t required, RemoteTarget* out,
                        MrCache* cache = nullptr);

}  // namespace rnic::emu
