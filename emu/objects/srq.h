// emu/objects/srq.h: shared receive queues: post, pop by the responder, modify (max_wr resize,
// srq_limit arm), and the one-shot SRQ_LIMIT_REACHED event when the depth drops below it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "emu/objects/pd.h"
#include "emu/objects/status.h"
#include "emu/objects/wqe.h"

namespace rnic::emu {

class Device;

// ibv_srq_attr.
struct SrqAttr {
  uint32_t max_wr = 0;
  uint32_t max_sge = 0;
  uint32_t srq_limit = 0;
};

class Cq;

// ---- Tag matching (IBV_SRQT_TM) ----
// Device limits (ibv_tm_caps): tags in one SRQ's matching list, outstanding list operations
// (ours complete synchronously, so this only bounds max_ops at create), SGEs per tagged
// buffer, and the largest rendezvous SEND (TMH + RVH + user header) a tag accepts.
inline constexpr uint32_t kTmMaxNumTags = 256;
inline constexpr uint32_t kTmMaxOps = 256;
inline constexpr uint32_t kTmMaxSge = 4;
inline constexpr uint32_t kTmMaxRndvHdr = 64;
// Send-queue slots an RC QP of a TM SRQ reserves for the device's RNDV READ + FIN pairs.
inline constexpr uint32_t kTmRndvSlots = 16;
inline constexpr uint32_t kTmhSize = 16;  // struct ibv_tmh
inline constexpr uint32_t kRvhSize = 16;  // struct ibv_rvh
// ibv_tmh.opcode (enum ibv_tmh_op).
inline constexpr uint8_t kTmhNoTag = 0, kTmhRndv = 1, kTmhFin = 2, kTmhEager = 3;

struct TmAttr {
  bool enabled = false;
  uint32_t max_num_tags = 0;
  uint32_t max_ops = 0;
};

// One ibv_ops_wr. flags: kTmOpSignaled / kTmOpSync (IBV_OPS_*).
enum class TmOpKind : uint8_t { kAdd = 0, kDel = 1, kSync = 2 };
inline constexpr uint32_t kTmOpSignaled = 1u << 0, kTmOpSync = 1u << 1;
struct TmOp {
  uint64_t wr_id = 0;
  TmOpKind kind = TmOpKind::kAdd;
  uint32_t flags = 0;
  uint32_t unexpected_cnt = 0;
  uint32_t handle = 0;  // DEL: input; ADD: output
  uint64_t recv_wr_id = 0;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
  uint64_t tag = 0;
  uint64_t mask = 0;
};

// Thread-safe (internal mutex `mu_`). Lock order: a QP's receive lock may be held while
// calling pop(); Srq never calls back into a QP.
class Srq : public std::enable_shared_from_this<Srq> {
 public:
  // xrcd/cq: an XRC SRQ (IBV_SRQT_XRC) of that domain, completing into cq; both null for a
  // basic SRQ.
  Srq(Device& dev, uint32_t handle, std::shared_ptr<Pd> pd, const SrqAttr& attr,
      std::shared_ptr<Xrcd> xrcd = nullptr, std::shared_ptr<Cq> cq = nullptr,
      const TmAttr& tm = TmAttr{});
  ~Srq();

  uint32_t handle() const { return handle_; }
  // The SRQ number an XRC sender names in the XRCETH (ibv_get_srq_num): the handle, which
  // Device keeps in 1..0xFFFFFF.
  uint32_t srq_num() const { return handle_; }
  const std::shared_ptr<Pd>& pd() const { return pd_; }
  bool is_xrc() const { return xrcd_ != nullptr; }
  const std::shared_ptr<Xrcd>& xrcd() const { return xrcd_; }
  // XRC: the CQ receive completions go to (a basic SRQ's go to the QP's receive CQ).
  const std::shared_ptr<Cq>& cq() const { return cq_; }
  SrqAttr query() const;
  bool is_tm() const { return tm_.enabled; }
  const TmAttr& tm_attr() const { return tm_; }

  // ibv_post_srq_ops on a TM SRQ, one operation (the shim walks the chain). Phase sync
  // (the ibv_post_srq_ops man page): every unexpected EAGER/RNDV message the responder hands
  // to an unexpected buffer counts once; an op with kTmOpSync (TAG_SYNC always) reports how
  // many the application has handled. Tags match only while both counts agree.
  // ADD: EINVAL (num_sge 0/too many, sg_list null), ENOMEM (list full); op->handle is set.
  // DEL: a handle not in the list completes with kTmErr (already consumed or deleted).
  // Completion on the SRQ's CQ when signaled or failed (ADD: kWcTmSyncReq while out of
  // sync). Not a TM SRQ: EOPNOTSUPP.
  Status tm_post(TmOp* op);
  // Responder: the oldest posted tag matching `tag` while in sync, removed from the list and
  // copied into *out (wr_id = its recv_wr_id; its SGEs into out_sges, kTmMaxSge entries).
  bool tm_match(uint64_t tag, RecvWqe* out, Sge* out_sges);
  // Responder: an unexpected message took an unexpected buffer (pop): count it.
  void tm_count_unexpected();
  uint32_t tm_unexpected() const;  // messages counted so far
  uint32_t tm_tags() const;        // tags in the list

  // ibv_post_srq_recv: validates every WR in order (num_sge <= max_sge else EINVAL; full
  // -> ENOMEM) and enqueues until the first bad one; *bad = index of the first rejected
  // WR (n when all were taken). Then calls hooks->on_post_srq_recv(*this) if any were.
  Status post_recv(const RecvWr* wrs, int n, int* bad);
  // Responder: take the oldest WQE into *out (its sge array is copied into out_sges, which
  // must hold max_sge entries; out->sge points at out_sges). false if empty. If the limit
  // is armed and the depth drops below srq_limit, queues SRQ_LIMIT_REACHED once and
  // disarms (IBA 10.2.9.3; rxe).
  bool pop(RecvWqe* out, Sge* out_sges);
  uint32_t count() const;

  // ibv_modify_srq. kSrqMaxWr: resize to max_wr (>= current count, <= device max, else
  // EINVAL). kSrqLimit: arm with srq_limit (srq_limit > max_wr -> EINVAL; 0 disarms).
  // Check everything, then commit.
  Status modify(const SrqAttr& attr, uint32_t mask);
  bool limit_armed() const;

  uint32_t users() const { return users_.load(); }  // QPs attached
  // False once destroy_srq removed it: an XRC target holding it (resp_.xrc_srq) must look the
  // SRQ number up again. Any thread.
  bool alive() const { return alive_.load(std::memory_order_acquire); }

  void* user_context = nullptr;

 private:
  friend class Device;
  void relink_storage_locked();
  Device* dev_;
  uint32_t handle_;
  std::shared_ptr<Pd> pd_;
  std::shared_ptr<Xrcd> xrcd_;
  std::shared_ptr<Cq> cq_;
  mutable std::mutex mu_;
  SrqAttr attr_;
  bool armed_ = false;
  Ring<RecvWqe> ring_;
  std::vector<Sge> sge_store_;
  struct TmTag {
    bool used = false;
    uint64_t seq = 0;  // posting order: the oldest match wins
    uint64_t tag = 0, mask = 0, recv_wr_id = 0, length = 0;
    uint32_t num_sge = 0;
    Sge sge[kTmMaxSge];
  };
  TmAttr tm_;
  std::vector<TmTag> tags_;  // max_num_tags slots, the index is the handle
  uint32_t tm_used_ = 0;
  uint64_t tm_seq_ = 0;
  uint32_t hw_unexp_ = 0, sw_unexp_ = 0;
  std::atomic<uint32_t> users_{0};
  std::atomic<bool> alive_{true};
};

}  // namespace rnic::emu
