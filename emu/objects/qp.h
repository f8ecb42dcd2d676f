// emu/objects/qp.h: queue pairs (RC, UC, UD): creation caps, the IBA state machine with required /
// optional attribute masks per transition and QP type (check everything, then commit),
// query, post_send / post_recv validation and queuing, flush to WR_FLUSH_ERR on ERR.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "emu/objects/cq.h"
#include "emu/objects/pd.h"
#include "emu/objects/srq.h"
#include "emu/objects/status.h"
#include "emu/objects/transport_state.h"
#include "emu/objects/types.h"
#include "emu/objects/wqe.h"
#include "emu/objects/wr_opcode.h"

namespace rnic::emu {

class Device;

// ibv_qp_cap.
struct QpCap {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

// ibv_qp_init_attr.
struct QpInitAttr {
  std::shared_ptr<Cq> send_cq;
  std::shared_ptr<Cq> recv_cq;
  std::shared_ptr<Srq> srq;  // null = own RQ
  // XRC_RECV (target) QPs: the domain they are created on (no PD, CQs, SQ or RQ). Ignored
  // for other types.
  std::shared_ptr<Xrcd> xrcd;
  QpCap cap;
  QpType qp_type = QpType::kRc;
  bool sq_sig_all = false;
};

// ibv_qp_attr, field for field (same names; enums are emu's mirrors).
struct QpAttr {
  QpState qp_state = QpState::kReset;
  QpState cur_qp_state = QpState::kReset;
  Mtu path_mtu = Mtu::k256;
  MigState path_mig_state = MigState::kMigrated;
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;
  QpCap cap;
  AhAttr ah_attr;
  AhAttr alt_ah_attr;
  uint16_t pkey_index = 0;
  uint16_t alt_pkey_index = 0;
  uint8_t en_sqd_async_notify = 0;
  uint8_t sq_draining = 0;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 0;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint8_t alt_port_num = 0;
  uint8_t alt_timeout = 0;
  uint32_t rate_limit = 0;
};

// The IBA transition table (IBA 11.2.5 / Linux ib_modify_qp_is_ok): for (cur, next, type)
// whether the transition exists and which attribute bits are required and optional
// (kQpState itself is always allowed). valid=false for a non-existent transition.
struct QpTransition {
  bool valid = false;
  uint32_t required = 0;
  uint32_t optional = 0;
};
QpTransition qp_transition(QpState cur, QpState next, QpType type);
const char* qp_state_name(QpState s);
const char* qp_type_name(QpType t);

// A queue pair.
//
// LOCKING. Each QP has two std::mutex:
//  * send lock (send_mutex()): guards the send queue ring (sq()), req_ and comp_ state, and
//    the send-side attributes. Held by post_send, by the requester/completer, and by
//    TransportHooks::on_post_send.
//  * receive lock (recv_mutex()): guards the receive queue ring (rq()) and resp_ state.
//    Held by post_recv, by the responder, and by TransportHooks::on_post_recv.
//  * modify/destroy/enter_error take BOTH (send first, then receive); attr() may therefore
//    be read while holding EITHER lock. state() is an atomic mirror readable lock-free.
// Lock order: send -> receive -> Srq -> Cq -> CompChannel. Never take a QP lock while
// holding a Cq/Srq lock. Functions named *_locked state which lock they REQUIRE.
class Qp : public std::enable_shared_from_this<Qp> {
 public:
  Qp(Device& dev, std::shared_ptr<Pd> pd, const QpInitAttr& init);
  ~Qp();

  uint32_t qpn() const { return qpn_; }
  QpType type() const { return type_; }
  Device& device() const { return *dev_; }
  const std::shared_ptr<Pd>& pd() const { return pd_; }
  const std::shared_ptr<Cq>& send_cq() const { return send_cq_; }
  const std::shared_ptr<Cq>& recv_cq() const { return recv_cq_; }
  const std::shared_ptr<Srq>& srq() const { return srq_; }
  // XRC_RECV: the domain the target QP lives in (null for other types; such a QP has no PD).
  const std::shared_ptr<Xrcd>& xrcd() const { return xrcd_; }
  bool sq_sig_all() const { return sq_sig_all_; }
  const QpCap& cap() const { return cap_; }  // actual caps (as returned by create)
  // UDP source port for this QP: 0xC000 + hash(QPN) mod 2^14 (rxe), fixed at create.
  uint16_t udp_sport() const { return udp_sport_; }
  // Current state, lock-free (acquire).
  QpState state() const { return state_.load(std::memory_order_acquire); }

  // Current attributes. REQUIRES: send or receive lock held (or single-threaded use).
  const QpAttr& attr() const { return attr_; }
  // Resolved destination of an RC/UC QP (valid after a modify with kQpAv).
  const Av& av() const { return av_; }

  // ibv_post_send. Validates and enqueues WRs in order; stops at the first bad one and sets
  // *bad to its index (n when all were queued). Errors (nothing queued for that WR):
  //   EINVAL  QP in RESET/INIT/RTR; opcode not valid for the QP type (TSO, DRIVER1, ...);
  //           num_sge < 0 or > max_send_sge; INLINE with total length > max_inline_data or
  //           on a non-SEND/WRITE opcode; UD without an AH; message > 2^31.
  //   ENOMEM  send queue full.
  // In SQE/ERR state WRs are queued and immediately flushed (WR_FLUSH_ERR CQEs).
  // Takes the send lock; calls hooks->on_post_send(*this) with it held if anything was
  // queued in RTS/SQD; then, with no lock held, hooks->on_app_post().
  Status post_send(const SendWr* wrs, int n, int* bad);
  // ibv_post_recv. EINVAL: QP in RESET, QP uses an SRQ, num_sge > max_recv_sge. ENOMEM:
  // receive queue full. In ERR state WRs are queued and flushed at once. Takes the receive
  // lock; calls hooks->on_post_recv(*this) with it held; then, with no lock held,
  // hooks->on_app_post().
  Status post_recv(const RecvWr* wrs, int n, int* bad);

  // Queues for the transports. REQUIRES: sq(): send lock; rq(): receive lock.
  Ring<SendWqe>& sq() { return sq_; }
  Ring<RecvWqe>& rq() { return rq_; }

  // Complete the send-queue head with `status` and pop it: a CQE is generated if the WQE
  // was signaled or status != kSuccess (IBA 10.7.3.1). byte_len is the WQE length for
  // READ/atomics as the completer sets it (pass explicitly). Returns false if the CQ
  // overflowed (then the caller should enter_error_locked()). REQUIRES: send lock.
  bool complete_send_head_locked(WcStatus status, uint32_t byte_len = 0);
  // Tag matching, a matched RNDV on this RC QP of a TM SRQ: queues the READ of the sender's
  // buffer into the tag's and, fenced behind it, the FIN SEND (TMH opcode FIN, the RNDV's
  // app_ctx and tag), in send-queue slots reserved for the device (kTmRndvSlots, beyond
  // max_send_wr). The READ's completion (IBV_WC_TM_RECV, DATA_VALID, or an error status) goes
  // to the SRQ's CQ. No slot, a sender length above the buffer, or a QP not in RTS/SQD:
  // IBV_WC_TM_RNDV_INCOMPLETE at once. REQUIRES: send lock.
  void tm_rndv_start_locked(const RespState::TmRndv& r);

  // Move the QP to ERR from inside the transports (completion error, CQ overflow, fatal):
  // state ERR, hooks->on_modify(from, ERR), QP_FATAL async event if `fatal`, flush every
  // SQ and RQ WQE with WR_FLUSH_ERR, LAST_WQE_REACHED if the QP uses an SRQ.
  // REQUIRES: BOTH locks held (send, then receive).
  void enter_error_locked(bool fatal = false);
  // UC/UD send error (spec: SQE, not ERR): state SQE, flush the SQ only.
  // REQUIRES: both locks held.
  void enter_sqe_locked();
  // Flush helpers. REQUIRES: send lock / receive lock respectively.
  void flush_sq_locked();
  void flush_rq_locked();

  std::mutex& send_mutex() const { return send_mu_; }
  // A post_send is waiting for the send lock (another thread holds it). A requester run that
  // holds it lets the post in at the next message boundary where an ACK is certain to run
  // the requester again (req_run).
  bool post_waiting() const { return post_waiters_.load(std::memory_order_relaxed) != 0; }
  std::mutex& recv_mutex() const { return recv_mu_; }

  // Per-QP transport state (see transport_state.h). req_/comp_: send lock; resp_: receive.
  ReqState req_;
  RespState resp_;
  CompState comp_;

  void* user_context = nullptr;  // free for the shim (its ibv_qp wrapper)

 private:
  Status queue_send(const SendWr* wrs, int n, int* bad);  // post_send under the send lock
  Status queue_recv(const RecvWr* wrs, int n, int* bad);  // post_recv under the receive lock
  friend class Device;
  // Pure check of a modify: valid transition, mask ⊆ required|optional|kQpState with every
  // required bit, and every supplied value in range (port 1, pkey index 0, MTU enum <=
  // 4096, timeout/min_rnr_timer <= 31, retry counts <= 7, rd_atomic <= device max, AV
  // resolvable, QPN <= 0xFFFFFF, cur_qp_state (if given) == actual...). kOk or kInval.
  // REQUIRES: both locks held.
  Status check_modify(const QpAttr& a, uint32_t mask, QpState* next, Av* av) const;
  void commit_modify(const QpAttr& a, uint32_t mask, QpState next, const Av& av);
  void reset_locked();
  bool flush_push(const std::shared_ptr<Cq>& cq, const Cqe& e);
  Status validate_send_wr(const SendWr& wr) const;

  Device* dev_;
  std::shared_ptr<Pd> pd_;
  std::shared_ptr<Cq> send_cq_, recv_cq_;
  std::shared_ptr<Srq> srq_;
  std::shared_ptr<Xrcd> xrcd_;
  QpType type_;
  bool sq_sig_all_;
  QpCap cap_;
  uint32_t qpn_ = 0;
  uint16_t udp_sport_ = 0;
  std::atomic<QpState> state_{QpState::kReset};
  QpAttr attr_;
  Av av_;
  mutable std::mutex send_mu_, recv_mu_;
  std::atomic<uint32_t> post_waiters_{0};  // post_send calls waiting for send_mu_
  Ring<SendWqe> sq_;
  Ring<RecvWqe> rq_;
  std::vector<Sge> sq_sge_store_, rq_sge_store_;
  std::vector<uint8_t> sq_inline_store_;
  uint32_t sq_sge_stride_ = 0, sq_inline_stride_ = 0;
  uint32_t tm_inflight_ = 0;  // device WQEs (tm_kind != 0) in sq_
  void tm_complete_locked(const SendWqe& w, WcStatus status);
  bool destroyed_ = false;
};

// wc_opcode_for(WrOpcode), the WC opcode a send WQE completes with, is in wr_opcode.h.

}  // namespace rnic::emu
