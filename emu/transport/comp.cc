// emu/transport/comp.cc: the completer — ACK/NAK/READ response/ATOMIC ACK handling, in-order
// retirement of send WQEs, retransmit and RNR timers with retry_cnt / rnr_retry.
#include "emu/transport/comp.h"

#include <array>
#include <mutex>

#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/transport/req.h"
#include "wire/hdr.h"
#include "wire/psn.h"

namespace rnic::emu {

using wire::psn_add;
using wire::psn_diff;
namespace op = wire::op;
namespace aeth = wire::aeth;

uint64_t rnr_timer_ns(uint8_t code) {
  // IBA Vol 1 Table 45, in units of 10 us (code 0 = 655.36 ms).
  static constexpr std::array<uint32_t, 32> kTenUs = {
      65536, 1,    2,    3,    4,    6,    8,    12,   16,    24,    32,
      48,    64,   96,   128,  192,  256,  384,  512,  768,   1024,  1536,
      2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return uint64_t{kTenUs[code & 31]} * 10'000;
}

uint64_t ack_timeout_ns(uint8_t timeout) {
  if (timeout == 0) return 0;
  // 4.096 us * 2^timeout = 4096 ns << timeout.
  return uint64_t{4096} << (timeout & 31);
}

namespace {

bool is_read(WrOpcode o) { return o == WrOpcode::kRdmaRead; }
bool is_atomic(WrOpcode o) {
  return o == WrOpcode::kAtomicCmpAndSwp || o == WrOpcode::kAtomicFetchAndAdd;
}
bool is_rd_atomic(WrOpcode o) { return is_read(o) || is_atomic(o); }

uint32_t wc_byte_len(const SendWqe& w) {
  if (is_atomic(w.opcode)) return 8;
  return static_cast<uint32_t>(w.length);
}

// REQUIRES: send lock. Moves the QP to ERR (or SQE for a UC/UD send error).
void fail_qp(Qp& qp, bool sqe) {
  std::lock_guard lk(qp.recv_mutex());
  if (sqe) {
    qp.enter_sqe_locked();
  } else {
    qp.enter_error_locked(false);
  }
}

// Marks WQE w failed with status st (the completer retires it, then the QP fails).
void fail_wqe(Qp& qp, SendWqe& w, WcStatus st) {
  if (is_rd_atomic(w.opcode) && w.state != WqeState::kDone && qp.req_.rd_atomic_inflight > 0 &&
      (w.state == WqeState::kPending || w.state == WqeState::kProcessing))
    --qp.req_.rd_atomic_inflight;
  w.status = st;
  w.state = WqeState::kError;
}

// Index of the oldest WQE still waiting for the network (kProcessing/kPending), or -1.
int first_active(Qp& qp) {
  Ring<SendWqe>& sq = qp.sq();
  const uint32_t lim = std::min(qp.req_.pos + 1, sq.size());
  for (uint32_t i = 0; i < lim; ++i) {
    WqeState s = sq.at(i).state;
    if (s == WqeState::kProcessing || s == WqeState::kPending) return static_cast<int>(i);
    if (s == WqeState::kPosted || s == WqeState::kError) return -1;
  }
  return -1;
}

// Completes SEND/WRITE WQEs whose packets are all acknowledged by `psn` (inclusive) and
// records a partial acknowledgement. Sets *lost when the ACK passes an unanswered READ or
// ATOMIC (its responses were lost: rxe retries). Returns true on forward progress.
bool ack_through(Engine& e, Qp& qp, uint32_t psn, bool* lost) {
  (void)e;
  CompState& c = qp.comp_;
  Ring<SendWqe>& sq = qp.sq();
  bool progress = false;
  const uint32_t lim = std::min(qp.req_.pos + 1, sq.size());
  for (uint32_t i = 0; i < lim; ++i) {
    SendWqe& w = sq.at(i);
    if (w.state == WqeState::kDone) continue;
    if (w.state != WqeState::kPending && w.state != WqeState::kProcessing) break;
    if (psn_diff(psn, w.first_psn) < 0) break;
    if (is_rd_atomic(w.opcode)) {
      *lost = true;
      break;
    }
    if (psn_diff(psn, w.last_psn) >= 0) {
      if (w.state == WqeState::kProcessing && w.offset < w.length) {
        // Re-armed by a retry but every packet was acknowledged meanwhile.
      }
      w.state = WqeState::kDone;
      c.psn = psn_add(w.last_psn, 1);
      progress = true;
      continue;
    }
    if (psn_diff(psn, c.psn) >= 0) {
      c.psn = psn_add(psn, 1);
      progress = true;
    }
    break;
  }
  return progress;
}

// Retry after a timeout or a NAK: spend one retry_cnt (7 = infinite) and go back N, or fail
// the oldest outstanding WQE with RETRY_EXC_ERR.
void do_retry(Engine& e, Qp& qp) {
  CompState& c = qp.comp_;
  int i = first_active(qp);
  if (i < 0) return;
  if (c.retry_left == 0) {
    bump(c.ctr, e.counters(), Ctr::kRetryExceededErr);
    fail_wqe(qp, qp.sq().at(static_cast<uint32_t>(i)), WcStatus::kRetryExcErr);
    return;
  }
  if (c.retry_cnt != 7) --c.retry_left;
  bump(c.ctr, e.counters(), Ctr::kCompleterRetryErr);
  req_retry(e, qp);
}

void on_progress(Engine& e, Qp& qp) {
  CompState& c = qp.comp_;
  ReqState& r = qp.req_;
  c.retry_left = c.retry_cnt;
  c.rnr_left = c.rnr_retry;
  c.retry_latched = false;
  if (psn_diff(c.psn, r.psn) > 0) r.psn = c.psn;
  if (c.timeout_ns != 0 && psn_diff(r.max_psn, c.psn) > 0) {
    c.retrans_deadline_ns = wire::monotonic_ns() + c.timeout_ns;
    e.arm_timer(c.retrans_deadline_ns);
  } else {
    c.retrans_deadline_ns = 0;
  }
}

WcStatus nak_status(uint8_t code) {
  switch (code) {
    case aeth::kNakInvalidRequest: return WcStatus::kRemInvReqErr;
    case aeth::kNakRemoteAccessError: return WcStatus::kRemAccessErr;
    case aeth::kNakRemoteOperationalError: return WcStatus::kRemOpErr;
    case aeth::kNakInvalidRdRequest: return WcStatus::kRemInvRdReqErr;
    default: return WcStatus::kRemOpErr;
  }
}

}  // namespace

void comp_check_sq_drained(Qp& qp) {
  CompState& c = qp.comp_;
  if (c.sqd_notified || qp.state() != QpState::kSqd) return;
  Ring<SendWqe>& sq = qp.sq();
  for (uint32_t i = 0; i < sq.size(); ++i) {
    WqeState s = sq.at(i).state;
    if (s == WqeState::kProcessing || s == WqeState::kPending) return;
  }
  c.sqd_notified = true;
  if (qp.attr().en_sqd_async_notify) {
    AsyncEvent ev;
    ev.type = EventType::kSqDrained;
    ev.qp = qp.shared_from_this();
    qp.device().async_events().push(std::move(ev));
  }
}

void comp_retire(Engine& e, Qp& qp) {
  (void)e;
  Ring<SendWqe>& sq = qp.sq();
  ReqState& r = qp.req_;
  while (!sq.empty()) {
    SendWqe& w = sq.head();
    if (w.state == WqeState::kDone) {
      bool ok = qp.complete_send_head_locked(WcStatus::kSuccess, wc_byte_len(w));
      if (r.pos > 0) --r.pos;
      if (!ok) {  // send CQ overflow: IBA Class G, the QP goes to ERR
        fail_qp(qp, false);
        return;
      }
      continue;
    }
    if (w.state == WqeState::kError) {
      WcStatus st = w.status;
      (void)qp.complete_send_head_locked(st, wc_byte_len(w));
      if (r.pos > 0) --r.pos;
      // Spec: a UC/UD send error takes the QP to SQE; RC to ERR (and remote errors too).
      fail_qp(qp, qp.type() != QpType::kRc);
      return;
    }
    break;
  }
  comp_check_sq_drained(qp);
}

void comp_on_packet(Engine& e, Qp& qp, const wire::PacketView& p) {
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  if (!r.ready || c.dead || qp.type() != QpType::kRc) return;
  const uint32_t psn = p.bth().psn();
  // A response must name a PSN we have sent (not yet-unsent or spoofed-ahead ones) and not
  // one already acknowledged.
  if (psn_diff(psn, r.max_psn) >= 0) return;
  if (psn_diff(psn, c.psn) < 0) return;  // old / duplicate response

  bool progress = false;
  bool lost = false;
  bool retry = false;
  Ring<SendWqe>& sq = qp.sq();

  if (p.opcode == op::kRcAcknowledge) {
    const uint8_t syn = p.aeth().syndrome();
    if (aeth::is_ack(syn)) {
      progress = ack_through(e, qp, psn, &lost);
      if (lost && !c.retry_latched) {
        c.retry_latched = true;
        retry = true;
      }
    } else {
      // NAKs acknowledge every PSN before theirs (IBA 9.7.5.1.2).
      bool dummy = false;
      progress = ack_through(e, qp, psn_add(psn, wire::kPsnMask), &dummy);
      if (aeth::is_rnr_nak(syn)) {
        bump(c.ctr, e.counters(), Ctr::kRcvdRnrErr);
        int i = first_active(qp);
        if (i >= 0) {
          if (c.rnr_left == 0) {
            bump(c.ctr, e.counters(), Ctr::kRnrNakRetryErr);
            fail_wqe(qp, sq.at(static_cast<uint32_t>(i)), WcStatus::kRnrRetryExcErr);
          } else {
            if (c.rnr_retry != 7) --c.rnr_left;
            r.rnr_wait = true;
            c.retrans_deadline_ns = 0;  // a timeout during an RNR wait is deferred
            c.rnr_deadline_ns = wire::monotonic_ns() + rnr_timer_ns(aeth::value(syn));
            e.arm_timer(c.rnr_deadline_ns);
          }
        }
      } else if (aeth::is_nak(syn)) {
        const uint8_t code = aeth::value(syn);
        if (code == aeth::kNakPsnSeqError) {
          bump(c.ctr, e.counters(), Ctr::kRcvdSeqErr);
          retry = true;
        } else {
          bump(c.ctr, e.counters(), Ctr::kNakRcvd);
          if (code == aeth::kNakRemoteAccessError)
            bump(c.ctr, e.counters(), Ctr::kRemAccessNakRcvd);
          // The WQE whose PSN range holds the NAK's PSN fails.
          const uint32_t lim = std::min(r.pos + 1, sq.size());
          for (uint32_t i = 0; i < lim; ++i) {
            SendWqe& w = sq.at(i);
            if (w.state != WqeState::kPending && w.state != WqeState::kProcessing) continue;
            if (psn_diff(psn, w.first_psn) >= 0 && psn_diff(psn, w.last_psn) <= 0) {
              fail_wqe(qp, w, nak_status(code));
              break;
            }
          }
        }
      }
    }
  } else if (p.has(wire::kAckMask)) {
    // READ response or ATOMIC ACK: implicitly acknowledges earlier requests.
    bool dummy = false;
    if (ack_through(e, qp, psn_add(psn, wire::kPsnMask), &dummy)) progress = true;
    int i = first_active(qp);
    if (i >= 0) {
      SendWqe& w = sq.at(static_cast<uint32_t>(i));
      const bool is_atomic_ack = p.opcode == op::kRcAtomicAcknowledge;
      const bool match = is_atomic_ack ? is_atomic(w.opcode) : is_read(w.opcode);
      if (match && psn_diff(psn, w.first_psn) >= 0 && psn_diff(psn, w.last_psn) <= 0) {
        if (psn != c.psn) {
          // A response is missing (psn > c.psn): go back once per episode.
          if (!c.retry_latched) {
            c.retry_latched = true;
            retry = true;
          }
        } else if (is_atomic_ack) {
          uint64_t orig = p.atomic_ack_eth().orig();
          WcStatus st = scatter_sges(e.device(), qp.pd().get(), w.sge, w.num_sge, 0,
                                     reinterpret_cast<const uint8_t*>(&orig), 8);
          if (st != WcStatus::kSuccess) {
            fail_wqe(qp, w, WcStatus::kLocProtErr);
          } else {
            w.state = WqeState::kDone;
            if (r.rd_atomic_inflight > 0) --r.rd_atomic_inflight;
          }
          c.psn = psn_add(psn, 1);
          progress = true;
        } else {
          const uint64_t off = static_cast<uint64_t>(psn_diff(psn, w.first_psn)) * r.mtu;
          const bool last = psn == w.last_psn;
          const uint64_t want = last ? w.length - off : r.mtu;
          if (off <= w.length && p.payload_len == want) {
            WcStatus st = scatter_sges(e.device(), qp.pd().get(), w.sge, w.num_sge, off,
                                       p.payload, p.payload_len);
            if (st != WcStatus::kSuccess) {
              fail_wqe(qp, w, WcStatus::kLocProtErr);
            } else if (last) {
              w.state = WqeState::kDone;
              if (r.rd_atomic_inflight > 0) --r.rd_atomic_inflight;
            }
            c.psn = psn_add(psn, 1);
            progress = true;
          }
          // A response of the wrong size is dropped (the retry timer recovers).
        }
      }
    }
  }

  if (progress) on_progress(e, qp);
  comp_retire(e, qp);
  if (retry && qp.state() == QpState::kRts) do_retry(e, qp);
  req_run(e, qp);
}

void comp_on_timer(Engine& e, Qp& qp, uint64_t now_ns) {
  ReqState& r = qp.req_;
  CompState& c = qp.comp_;
  if (!r.ready || c.dead) return;
  bool run = c.kick;
  c.kick = false;
  if (c.rnr_deadline_ns != 0 && now_ns >= c.rnr_deadline_ns) {
    c.rnr_deadline_ns = 0;
    r.rnr_wait = false;
    req_retry(e, qp);
    run = true;
  }
  if (c.retrans_deadline_ns != 0 && now_ns >= c.retrans_deadline_ns && !r.rnr_wait) {
    c.retrans_deadline_ns = 0;
    if (psn_diff(r.max_psn, c.psn) > 0 && first_active(qp) >= 0) {
      bump(c.ctr, e.counters(), Ctr::kLocalAckTimeoutErr);
      do_retry(e, qp);
      run = true;
    }
  }
  if (run) {
    comp_retire(e, qp);
    req_run(e, qp);
    // Re-arm even if nothing new was sent (the retried packets count as sent).
    if (c.timeout_ns != 0 && c.retrans_deadline_ns == 0 && !r.rnr_wait &&
        psn_diff(r.max_psn, c.psn) > 0 && qp.state() == QpState::kRts) {
      c.retrans_deadline_ns = now_ns + c.timeout_ns;
      e.arm_timer(c.retrans_deadline_ns);
    }
  }
}

}  // namespace rnic::emu
