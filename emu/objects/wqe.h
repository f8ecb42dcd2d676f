// emu/objects/wqe.h: work requests as the shim hands them in (Sge, SendWr, RecvWr), the queued
// work-queue entries the transports consume (SendWqe, RecvWqe), and the Ring they live in.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "emu/objects/status.h"
#include "emu/objects/types.h"

namespace rnic::emu {

class Ah;

// Same layout as struct ibv_sge {u64 addr; u32 length; u32 lkey;} (the shim static_asserts
// sizeof/offsetof and may reinterpret_cast an ibv_sge array).
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// MW bind parameters (ibv_mw_bind_info + the MW), by key so no pointer crosses into a WQE.
// mw_rkey: the MW's current rkey as the application knows it (ibv_mw::rkey) - a stale
// value fails the bind (docs/checks.md §2.4 MW bind step 1). new_rkey: only its low byte is used
// (ibv_inc_rkey semantics: the application picks the new key byte). mr_lkey: the MR's lkey
// (0 with length 0 = unbind for type 1).
struct BindInfo {
  uint32_t mw_rkey = 0;
  uint32_t new_rkey = 0;
  uint32_t mr_lkey = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;  // kAccess* bits for the window
};

// One send work request (ibv_send_wr without the list link).
struct SendWr {
  uint64_t wr_id = 0;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t send_flags = 0;  // kSend* bits
  // *_WITH_IMM: immediate data exactly as the app gave it (network byte order, untouched).
  // SEND_WITH_INV / LOCAL_INV: the rkey to invalidate.
  uint32_t imm_data = 0;
  uint32_t invalidate_rkey = 0;
  struct {
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
  } rdma;
  struct {
    uint64_t remote_addr = 0;
    uint64_t compare_add = 0;
    uint64_t swap = 0;
    uint32_t rkey = 0;
  } atomic;
  struct {
    const Ah* ah = nullptr;  // REQUIRED for UD; the WQE copies its address vector
    uint32_t remote_qpn = 0;
    uint32_t remote_qkey = 0;
  } ud;
  // XRC initiator: the SRQ number at the target (ibv_send_wr.qp_type.xrc.remote_srqn,
  // ibv_wr_set_xrc_srqn), carried in every request packet's XRCETH.
  uint32_t xrc_remote_srqn = 0;
  BindInfo bind_mw;
  // FLUSH (rdma.remote_addr/rkey name the target): length, placement type (kFlush* bits),
  // selectivity level (kFlushRange / kFlushMr).
  struct {
    uint64_t length = 0;
    uint8_t type = 0;
    uint8_t level = 0;
  } flush;
  // ATOMIC_WRITE given by value (ibv_wr_atomic_write): the 8 operand bytes in memory order.
  // Without it the operand is the 8-byte gather list (ibv_post_send).
  bool has_operand = false;
  uint64_t operand = 0;
};

// One receive work request (ibv_recv_wr without the list link).
struct RecvWr {
  uint64_t wr_id = 0;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
};

// Address vector: where a packet goes (copied from an Ah into UD WQEs, from QpAttr::ah_attr
// into RC/UC QPs). dgid is the raw 16-byte GID (IPv4-mapped ::ffff:a.b.c.d for IPv4).
struct Av {
  uint8_t dgid[16] = {};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  uint8_t port_num = 1;
  bool ipv4 = true;
  uint32_t dest_ipv4 = 0;  // host byte order (0x7f000002 = 127.0.0.2) when ipv4
  uint32_t scope_id = 0;   // IPv6 link-local dgid: the SGID's interface index
};

// Progress of a send WQE, owned by the requester/completer (emu never reads these
// after enqueue except `state` during flush). All fields are guarded by the QP send lock.
enum class WqeState : uint8_t {
  kPosted = 0,   // not yet looked at by the requester
  kProcessing,   // requester is emitting its packets
  kPending,      // all packets sent, waiting for ACK/response
  kDone,         // completed (CQE generated or suppressed)
  kError,        // failed; completer will report `status`
};

// A queued send work request. sge/inline_data point into per-QP storage sized at create
// time (max_send_sge entries, max_inline_data bytes); the pointers never change.
struct SendWqe {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t send_flags = 0;
  bool signaled = false;      // SIGNALED flag or sq_sig_all
  bool is_inline = false;     // payload is in inline_data[0..inline_len)
  uint32_t imm_data = 0;      // network order, as posted
  uint32_t invalidate_rkey = 0;
  uint64_t remote_addr = 0;   // rdma.remote_addr or atomic.remote_addr
  uint32_t rkey = 0;          // rdma.rkey or atomic.rkey
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint64_t flush_len = 0;     // FLUSH only: RETH DMA length
  uint8_t flush_type = 0;     // FLUSH only: FETH placement type
  uint8_t flush_level = 0;    // FLUSH only: FETH selectivity level
  bool has_operand = false;   // ATOMIC_WRITE by value: `operand` is the payload
  uint64_t operand = 0;       // (memory-order bytes)
  Av av;                      // UD only
  uint32_t remote_qpn = 0;    // UD only
  uint32_t remote_qkey = 0;   // UD only
  uint32_t xrc_srqn = 0;      // XRC_SEND only: the target SRQ (XRCETH)
  BindInfo bind;              // BIND_MW only
  uint32_t num_sge = 0;
  Sge* sge = nullptr;
  uint32_t inline_len = 0;
  uint8_t* inline_data = nullptr;
  uint64_t length = 0;        // total payload bytes (sum of SGE lengths or inline_len)

  // --- progress, for the transports (reset to zero/kPosted at enqueue) ---
  WqeState state = WqeState::kPosted;
  WcStatus status = WcStatus::kSuccess;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint64_t offset = 0;        // payload bytes already sent
  uint32_t sge_index = 0;     // gather cursor
  uint32_t sge_offset = 0;
  uint64_t scratch[4] = {};   // free for the transports
  // Tag matching: a WQE the device queued itself for a matched rendezvous (Qp::tm_rndv_start
  // _locked), never the application's: kTmRndvRead fetches the sender's data into the tag's
  // buffer (completes on the TM SRQ's CQ, wr_id = the tag's recv_wr_id); kTmRndvFin is the
  // FIN SEND back to the sender (no completion).
  uint8_t tm_kind = 0;
};
inline constexpr uint8_t kTmRndvRead = 1, kTmRndvFin = 2;

// A queued receive work request (QP RQ or SRQ). sge points into per-queue storage.
struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  Sge* sge = nullptr;
  uint64_t length = 0;        // total capacity (sum of SGE lengths)
};

// Fixed-capacity FIFO ring of T. NOT thread-safe: the owner's lock guards it (see qp.h,
// srq.h). Index 0 is the oldest entry (the head).
template <class T>
class Ring {
 public:
  Ring() = default;
  explicit Ring(uint32_t capacity) : slots_(capacity) {}
  uint32_t capacity() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == slots_.size(); }
  // The slot the next push will fill (REQUIRES: !full()); fill it, then commit_push().
  T& tail_slot() { return slots_[(head_ + count_) % slots_.size()]; }
  void commit_push() {
    assert(!full());
    ++count_;
  }
  // Oldest entry (REQUIRES: !empty()).
  T& head() { return slots_[head_]; }
  // i-th entry from the head (REQUIRES: i < size()).
  T& at(uint32_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const T& at(uint32_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  // Drop the head (REQUIRES: !empty()).
  void pop() {
    assert(count_ > 0);
    head_ = (head_ + 1) % static_cast<uint32_t>(slots_.size());
    --count_;
  }
  void clear() {
    head_ = 0;
    count_ = 0;
  }
  // Raw slot by absolute index (for one-time setup of per-slot pointers).
  T& slot(uint32_t i) { return slots_[i]; }
  // Move the live entries into a ring of new_capacity (REQUIRES: new_capacity >= size()).
  // Entries keep their order; per-slot pointers travel with the entries, so callers that
  // store per-slot storage must re-point afterwards (Srq does).
  void resize(uint32_t new_capacity) {
    std::vector<T> n(new_capacity);
    for (uint32_t i = 0; i < count_; ++i) n[i] = at(i);
    slots_.swap(n);
    head_ = 0;
  }

 private:
  std::vector<T> slots_;
  uint32_t head_ = 0;
  uint32_t count_ = 0;
};

// Appends wrs[0..n) to a receive ring (a QP's RQ or an SRQ), stopping at the first WR
// that fails: EINVAL for num_sge outside [0, max_sge] or a missing sg_list, ENOMEM when
// the ring is full. *done = WRs appended (the index of the bad one on failure).
// REQUIRES: the ring owner's lock; every slot's sge points at max_sge entries.
inline Status push_recv_wrs(Ring<RecvWqe>& ring, const RecvWr* wrs, int n, uint32_t max_sge,
                            int* done) {
  Status result;
  int i = 0;
  for (; i < n; ++i) {
    const RecvWr& wr = wrs[i];
    if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > max_sge ||
        (wr.num_sge > 0 && wr.sg_list == nullptr)) {
      result = Errc::kInval;
      break;
    }
    if (ring.full()) {
      result = Errc::kNoMem;
      break;
    }
    RecvWqe& w = ring.tail_slot();
    w.wr_id = wr.wr_id;
    w.num_sge = static_cast<uint32_t>(wr.num_sge);
    w.length = 0;
    for (int k = 0; k < wr.num_sge; ++k) {
      w.sge[k] = wr.sg_list[k];
      w.length += wr.sg_list[k].length;
    }
    ring.commit_push();
  }
  *done = i;
  return result;
}

}  // namespace rnic::emu
