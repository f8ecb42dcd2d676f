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

// Thread-safe (internal mutex `mu_`). Lock order: a QP's receive lock may be held while
// calling pop(); Srq never calls back into a QP.
class Srq : public std::enable_shared_from_this<Srq> {
 public:
  // xrcd/cq: an XRC SRQ (IBV_SRQT_XRC) of that domain, completing into cq; both null for a
  // basic SRQ.
  Srq(Device& dev, uint32_t handle, std::shared_ptr<Pd> pd, const SrqAttr& attr,
      std::shared_ptr<Xrcd> xrcd = nullptr, std::shared_ptr<Cq> cq = nullptr);
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
  std::atomic<uint32_t> users_{0};
  std::atomic<bool> alive_{true};
};

}  // namespace rnic::emu
