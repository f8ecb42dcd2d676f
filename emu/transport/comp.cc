// emu/transport/comp.cc: the completer — ACK/NAK/READ response/ATOMIC ACK handling as a state
// machine with named steps (CompStep, rxe_comp.c order), in-order retirement of send WQEs,
// retransmit and RNR timers with retry_cnt / rnr_retry.
#include "emu/transport/comp.h"

#include <algorithm>
#include <array>
#include <mutex>

#include "base/log.h"
#include "emu/objects/device.h"
#include "emu/objects/wr_opcode.h"
#include "emu/transport/engine.h"
#include "emu/transport/req.h"
#include "emu/transport/window.h"
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

// WR-opcode facts of w on qp (emu/objects/wr_opcode.h).
uint32_t facts(const Qp& qp, const SendWqe& w) { return wr_mask(qp.type(), w.opcode); }

// byte_len of w's send completion: 8 for an atomic (the original value), else the length.
uint32_t wc_byte_len(const Qp& qp, const SendWqe& w) {
  if (facts(qp, w) & kWrAtomicMask) return 8;
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
  if ((facts(qp, w) & kWrRdAtomicMask) && qp.req_.rd_atomic_inflight > 0 &&
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

// The oldest WQE waiting for the network is a SEND or WRITE: its lost packet can be resent
// alone. (A READ/ATOMIC's responses are themselves the rest: a resent request asks for all.)
bool oldest_resends_alone(Qp& qp) {
  const int i = first_active(qp);
  return i >= 0 && !(facts(qp, qp.sq().at(static_cast<uint32_t>(i))) & kWrRdAtomicMask);
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
    if (facts(qp, w) & kWrRdAtomicMask) {
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

// Retry after a timeout or a NAK: spend one retry_cnt and go back N, or fail the oldest
// outstanding WQE with RETRY_EXC_ERR. In the IBA only rnr_retry 7 means infinite; retry_cnt 7
// is seven retries (issue 10 item 8: a dead peer must not hang the requester). rxe counts
// retry_cnt 7 as infinite: kept under the rxe errors mode (DeviceConfig::errors).
void do_retry(Engine& e, Qp& qp) {
  CompState& c = qp.comp_;
  int i = first_active(qp);
  if (i < 0) return;
  if (c.retry_left == 0) {
    bump(c.ctr, e.counters(), Ctr::kRetryExceededErr);
    fail_wqe(qp, qp.sq().at(static_cast<uint32_t>(i)), WcStatus::kRetryExcErr);
    return;
  }
  if (c.retry_cnt != 7 || e.device().config().errors != ErrorsMode::kRxe) --c.retry_left;
  bump(c.ctr, e.counters(), Ctr::kCompleterRetryErr);
  req_retry(e, qp);
}

void window_cut(Engine& e, Qp& qp, bool loss);

// Forward progress: comp psn moved from psn0. Retry counts back to full, the window grows,
// the retransmit timers restart without backoff.
void on_progress(Engine& e, Qp& qp, uint32_t psn0) {
  CompState& c = qp.comp_;
  ReqState& r = qp.req_;
  c.retry_left = c.retry_cnt;
  c.rnr_left = c.rnr_retry;
  // A go-back for lost responses resent everything up to retry_latch_psn (one READ request
  // re-asks for all of its remaining responses): later out-of-order responses of the same
  // episode are not new losses. Released once comp psn passes it; a loss inside the resent
  // range is recovered by the probe timer.
  if (c.retry_latched && psn_diff(c.psn, c.retry_latch_psn) >= 0) c.retry_latched = false;
  // The answer to a probe sent in a loss episode acknowledges exactly the probed PSN: the
  // responder did not have it, so (in order) it discarded everything sent after it too —
  // the NAK or the resend was lost. Go back at once instead of waiting for the NAK that the
  // next new packet would draw (one round trip). A late ACK of exactly that PSN makes this
  // resend packets the responder has: duplicates, answered and not executed.
  bool probe_answered = c.win.probe_out && psn0 == c.win.probe_psn &&
                        c.psn == psn_add(psn0, 1);
  // The answer to a selective resend (nak): acknowledged past the resent PSN but short of
  // what was sent before it, the responder lacks the next PSN (it does not stash, or that
  // one was lost as well, or its stash was full): go back N from there, as the in-order
  // recovery does, window cut included.
  // Acknowledged past the resent PSN itself, the responder stashes (it executed packets it
  // kept): the gap at comp psn is another loss whose NAK was lost (or is not due yet):
  // resend that one alone as well instead of going back.
  bool sel_goback = false, sel_again = false;
  if (c.win.sel_out && psn_diff(c.psn, c.win.sel_psn) > 0) {
    c.win.sel_out = false;
    probe_answered = false;
    if (psn_diff(c.win.sel_end, c.psn) > 0) {
      if (c.psn != psn_add(c.win.sel_psn, 1) && oldest_resends_alone(qp)) {
        c.win.inorder_votes = 0;
        sel_again = true;
        c.win.sel_out = true;
        c.win.sel_psn = c.psn;
      } else {
        if (c.psn == psn_add(c.win.sel_psn, 1) && c.win.inorder_votes < SendWindow::kInorderVotes)
          ++c.win.inorder_votes;
        sel_goback = true;
        window_cut(e, qp, true);
      }
    } else {
      c.win.inorder_votes = 0;  // everything sent before the resend acknowledged: it stashed
    }
  }
  c.win.probe_out = false;
  const uint64_t now = e.rx_now();  // the batch's reading (an ACK is a received packet)
  const int32_t acked = psn_diff(c.psn, psn0);
  if (is_reliable(qp.type()) && acked > 0)
    win_on_progress(c.win, static_cast<uint32_t>(acked), c.psn, now);
  // Acknowledged past what a go-back was about to resend (the loss was a delay): resume at
  // the first unacknowledged PSN instead of resending acknowledged packets.
  if (sel_goback) {
    do_retry(e, qp);  // the in-order peer's go-back spends a retry_cnt, as a NAK's always did
  } else if (psn_diff(c.psn, r.psn) > 0 || (probe_answered && psn_diff(r.psn, c.psn) > 0)) {
    req_retry(e, qp);
  }
  comp_disarm_retrans(c);
  if (c.timeout_ns != 0 && psn_diff(r.max_psn, c.psn) > 0) comp_arm_retrans(e, qp, now);
  if (sel_again && qp.state() == QpState::kRts) req_probe(e, qp);
}

// A loss (PSN-sequence NAK, lost READ/ATOMIC response: every one, not below kLossFloor) or a
// CNP (once per window of data) halves the window (docs/congestion.md §3).
void window_cut(Engine& e, Qp& qp, bool loss) {
  CompState& c = qp.comp_;
  if (win_cut(c.win, qp.req_.max_psn, loss)) bump(c.ctr, e.counters(), Ctr::kWindowCuts);
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
      bool ok = qp.complete_send_head_locked(WcStatus::kSuccess, wc_byte_len(qp, w));
      if (r.pos > 0) --r.pos;
      if (!ok) {  // send CQ overflow: IBA Class G, the QP goes to ERR
        fail_qp(qp, false);
        return;
      }
      continue;
    }
    if (w.state == WqeState::kError) {
      // Spec: a UC/UD send error takes the QP to SQE; RC to ERR (and remote errors too). The
      // state changes first; the flush then completes this WQE with its own status, and the
      // rest with WR_FLUSH_ERR.
      r.pos = 0;
      fail_qp(qp, !is_reliable(qp.type()));
      return;
    }
    break;
  }
  comp_check_sq_drained(qp);
}

// ---------------------------------------------------------------- response state machine

namespace {

// Completer steps (rxe enum comp_state, trimmed to what an RC response can need here). One
// response packet walks CHECK_PSN -> CHECK_ACK -> one of the handlers -> UPDATE_COMP ->
// COMPLETE_WQE -> [ERROR_RETRY] -> DONE; DROP leaves the QP untouched.
enum class CompStep : uint8_t {
  kCheckPsn,      // the response names a PSN we sent and that is not acknowledged yet
  kCheckAck,      // classify: ACK, NAK, RNR NAK, READ response, ATOMIC ACK
  kWriteSend,     // positive ACK: SEND/WRITE WQEs through its PSN are done (IBA 9.7.5.1.1)
  kImplicitAck,   // NAK / READ response / ATOMIC ACK: every earlier PSN is acknowledged
  kRnrRetry,      // RNR NAK: wait the RNR timer, or fail the WQE when rnr_retry is spent
  kNak,           // NAK: PSN sequence error -> go back N; other codes fail the WQE
  kGetWqe,        // the oldest outstanding WQE must be the READ/ATOMIC this answers
  kCheckSeq,      // a response ahead of comp psn means one was lost: go back N (latched)
  kRead,          // READ response: scatter the payload, the last one completes the WQE
  kAtomic,        // ATOMIC ACK: scatter the original value, complete the WQE
  kUpdateComp,    // forward progress: retry counters back to full, retransmit timer re-armed
  kCompleteWqe,   // retire finished WQEs from the SQ head in order (CQEs)
  kErrorRetry,    // go back N (spends a retry_cnt, or fails with RETRY_EXC_ERR)
  kDone,          // run the requester (window opened, retry) and return
  kDrop,          // silent drop: stale, duplicate or unsent PSN
};
constexpr std::array<const char*, 15> kCompStepNames = {
    "CHECK_PSN", "CHECK_ACK",  "WRITE_SEND",   "IMPLICIT_ACK", "RNR_RETRY",
    "NAK",       "GET_WQE",    "CHECK_SEQ",    "READ",         "ATOMIC",
    "UPDATE_COMP", "COMPLETE_WQE", "ERROR_RETRY", "DONE",      "DROP"};
static_assert(kCompStepNames.size() == static_cast<size_t>(CompStep::kDrop) + 1);

const char* comp_step_name(CompStep s) { return kCompStepNames[static_cast<size_t>(s)]; }

// One response packet and what handling it decided.
struct Resp {
  const wire::PacketView& p;
  uint32_t psn;
  SendWqe* wqe = nullptr;  // kGetWqe: the READ/ATOMIC WQE this response answers
  bool progress = false;   // something was acknowledged: kUpdateComp runs on_progress
  bool retry = false;      // go back N after retiring
  bool resend_one = false; // selective: resend only the packet at comp psn (nak)
};

// Go back N once per episode of lost responses: the latch holds until comp psn passes
// everything sent so far (on_progress), so a reordered READ response stream (X, X+2, ...,
// X+1) costs one resend of the READ, not one per response packet — each resend is a replay
// of the rest of the READ, bounded by the responder's replay budget.
void latch_retry(Engine& e, Qp& qp, Resp& k) {
  CompState& c = qp.comp_;
  if (c.retry_latched) return;
  c.retry_latched = true;
  c.retry_latch_psn = qp.req_.max_psn;
  k.retry = true;
  window_cut(e, qp, true);
}

CompStep check_psn(Qp& qp, const Resp& k) {
  // A response must name a PSN we have sent (not yet-unsent or spoofed-ahead ones) and not
  // one already acknowledged.
  if (psn_diff(k.psn, qp.req_.max_psn) >= 0) return CompStep::kDrop;
  if (psn_diff(k.psn, qp.comp_.psn) < 0) return CompStep::kDrop;  // old / duplicate
  return CompStep::kCheckAck;
}

CompStep check_ack(const Resp& k) {
  if (wire::rc_equivalent(k.p.opcode) == op::kRcAcknowledge)
    return aeth::is_ack(k.p.aeth().syndrome()) ? CompStep::kWriteSend : CompStep::kImplicitAck;
  // READ responses and ATOMIC ACKs acknowledge every request before them.
  if (k.p.has(wire::kAckMask)) return CompStep::kImplicitAck;
  return CompStep::kUpdateComp;  // not a response (recv.cc routes only kAckMask opcodes here)
}

CompStep write_send(Engine& e, Qp& qp, Resp& k) {
  bool lost = false;
  k.progress = ack_through(e, qp, k.psn, &lost);
  if (lost) latch_retry(e, qp, k);
  return CompStep::kUpdateComp;
}

CompStep implicit_ack(Engine& e, Qp& qp, Resp& k) {
  bool lost = false;  // an unanswered READ/ATOMIC before a NAK is not a loss
  k.progress = ack_through(e, qp, psn_add(k.psn, wire::kPsnMask), &lost);
  if (wire::rc_equivalent(k.p.opcode) != op::kRcAcknowledge) return CompStep::kGetWqe;
  const uint8_t syn = k.p.aeth().syndrome();
  if (aeth::is_rnr_nak(syn)) return CompStep::kRnrRetry;
  if (aeth::is_nak(syn)) return CompStep::kNak;
  return CompStep::kUpdateComp;  // reserved syndrome: only the implicit acknowledgement
}

CompStep rnr_retry(Engine& e, Qp& qp, const Resp& k) {
  CompState& c = qp.comp_;
  bump(c.ctr, e.counters(), Ctr::kRcvdRnrErr);
  int i = first_active(qp);
  if (i < 0) return CompStep::kUpdateComp;
  if (c.rnr_left == 0) {
    bump(c.ctr, e.counters(), Ctr::kRnrNakRetryErr);
    fail_wqe(qp, qp.sq().at(static_cast<uint32_t>(i)), WcStatus::kRnrRetryExcErr);
    return CompStep::kUpdateComp;
  }
  if (c.rnr_retry != 7) --c.rnr_left;
  // The receiver is behind with its posts: send it less at a time (a CNP's decrease, one a
  // window), so the next RNR NAK finds less in flight behind it to resend. Only with at least
  // kLossFloor PSNs in flight behind the RNR'd one: with fewer the cut saves next to nothing,
  // and a request/response QP that meets RNR NAKs often would ratchet its window down to 1 for
  // the bulk transfer that may follow.
  if (psn_diff(qp.req_.max_psn, k.psn) >= static_cast<int32_t>(kLossFloor))
    window_cut(e, qp, /*loss=*/false);
  qp.req_.rnr_wait = true;
  comp_disarm_retrans(c);  // a timeout during an RNR wait is deferred
  c.rnr_deadline_ns = wire::monotonic_ns() + rnr_timer_ns(aeth::value(k.p.aeth().syndrome()));
  e.arm_timer(qp, c.rnr_deadline_ns);
  return CompStep::kUpdateComp;
}

CompStep nak(Engine& e, Qp& qp, Resp& k) {
  CompState& c = qp.comp_;
  const uint8_t code = aeth::value(k.p.aeth().syndrome());
  if (code == aeth::kNakPsnSeqError) {
    bump(c.ctr, e.counters(), Ctr::kRcvdSeqErr);
    c.win.sel_out = false;
    // Selective first: resend the NAK'd packet alone and let its answer say whether the
    // responder kept what followed (a stashing responder acknowledges past it; one that
    // discards out-of-order packets, as ConnectX and rxe, acknowledges exactly it, and the
    // go-back follows one round trip later: on_progress). Not while a go-back is resending,
    // nor for a READ/ATOMIC (its responses are the rest).
    const bool try_sel = c.win.inorder_votes < SendWindow::kInorderVotes ||
                         ++c.win.inorder_naks % SendWindow::kInorderRetry == 0;
    if (qp.req_.psn == qp.req_.max_psn && try_sel && oldest_resends_alone(qp)) {
      c.win.sel_out = true;
      c.win.sel_psn = c.psn;
      c.win.sel_end = qp.req_.max_psn;
      k.resend_one = true;
      return CompStep::kUpdateComp;
    }
    k.retry = true;  // resend from the NAK's PSN (comp psn now), as the halved window allows
    window_cut(e, qp, true);
    return CompStep::kUpdateComp;
  }
  bump(c.ctr, e.counters(), Ctr::kNakRcvd);
  if (code == aeth::kNakRemoteAccessError) bump(c.ctr, e.counters(), Ctr::kRemAccessNakRcvd);
  // The WQE whose PSN range holds the NAK's PSN fails.
  Ring<SendWqe>& sq = qp.sq();
  const uint32_t lim = std::min(qp.req_.pos + 1, sq.size());
  for (uint32_t i = 0; i < lim; ++i) {
    SendWqe& w = sq.at(i);
    if (w.state != WqeState::kPending && w.state != WqeState::kProcessing) continue;
    if (psn_diff(k.psn, w.first_psn) >= 0 && psn_diff(k.psn, w.last_psn) <= 0) {
      fail_wqe(qp, w, nak_status(code));
      break;
    }
  }
  return CompStep::kUpdateComp;
}

CompStep get_wqe(Qp& qp, Resp& k) {
  int i = first_active(qp);
  if (i < 0) return CompStep::kUpdateComp;
  SendWqe& w = qp.sq().at(static_cast<uint32_t>(i));
  const bool is_atomic_ack = wire::rc_equivalent(k.p.opcode) == op::kRcAtomicAcknowledge;
  // A READ response answers a READ, or (zero-length, RESPONSE_ONLY) an ATOMIC_WRITE / FLUSH.
  if (!(facts(qp, w) & (is_atomic_ack ? kWrAtomicMask : (kWrReadMask | kWrEmptyReadRespMask))))
    return CompStep::kUpdateComp;
  if (psn_diff(k.psn, w.first_psn) < 0 || psn_diff(k.psn, w.last_psn) > 0)
    return CompStep::kUpdateComp;
  k.wqe = &w;
  return CompStep::kCheckSeq;
}

CompStep check_seq(Engine& e, Qp& qp, Resp& k) {
  if (k.psn != qp.comp_.psn) {
    latch_retry(e, qp, k);  // a response is missing (psn > comp psn)
    return CompStep::kUpdateComp;
  }
  return wire::rc_equivalent(k.p.opcode) == op::kRcAtomicAcknowledge ? CompStep::kAtomic
                                                                     : CompStep::kRead;
}

// The READ/ATOMIC WQE k.wqe is answered in full.
void rd_atomic_done(Qp& qp, SendWqe& w) {
  w.state = WqeState::kDone;
  if (qp.req_.rd_atomic_inflight > 0) --qp.req_.rd_atomic_inflight;
}

CompStep atomic_ack(Engine& e, Qp& qp, Resp& k) {
  SendWqe& w = *k.wqe;
  uint64_t orig = k.p.atomic_ack_eth().orig();
  WcStatus st = scatter_sges(e.device(), qp.pd().get(), w.sge, w.num_sge, 0,
                             reinterpret_cast<const uint8_t*>(&orig), 8, &qp.comp_.ctr,
                             &e.counters());
  if (st != WcStatus::kSuccess) {
    fail_wqe(qp, w, WcStatus::kLocProtErr);
  } else {
    rd_atomic_done(qp, w);
  }
  qp.comp_.psn = psn_add(k.psn, 1);
  k.progress = true;
  return CompStep::kUpdateComp;
}

CompStep read_resp(Engine& e, Qp& qp, Resp& k) {
  SendWqe& w = *k.wqe;
  if (facts(qp, w) & kWrEmptyReadRespMask) {
    // ATOMIC_WRITE / FLUSH: done by a zero-length RDMA READ RESPONSE ONLY (rxe
    // send_read_response_ack); anything else is dropped (the retry timer recovers).
    if (wire::rc_equivalent(k.p.opcode) != op::kRcRdmaReadResponseOnly || k.p.payload_len != 0)
      return CompStep::kUpdateComp;
    rd_atomic_done(qp, w);
    qp.comp_.psn = psn_add(k.psn, 1);
    k.progress = true;
    return CompStep::kUpdateComp;
  }
  const uint32_t mtu = qp.req_.mtu;
  const uint64_t off = static_cast<uint64_t>(psn_diff(k.psn, w.first_psn)) * mtu;
  const bool last = k.psn == w.last_psn;
  const uint64_t want = last ? w.length - off : mtu;
  // A response of the wrong size is dropped (the retry timer recovers).
  if (off > w.length || k.p.payload_len != want) return CompStep::kUpdateComp;
  WcStatus st = scatter_sges(e.device(), qp.pd().get(), w.sge, w.num_sge, off, k.p.payload,
                             k.p.payload_len, &qp.comp_.ctr, &e.counters());
  if (st != WcStatus::kSuccess) {
    fail_wqe(qp, w, WcStatus::kLocProtErr);
  } else if (last) {
    rd_atomic_done(qp, w);
  }
  qp.comp_.psn = psn_add(k.psn, 1);
  k.progress = true;
  return CompStep::kUpdateComp;
}

}  // namespace

void comp_on_packet(Engine& e, Qp& qp, const wire::PacketView& p) {
  if (!qp.req_.ready || qp.comp_.dead || !is_reliable(qp.type())) return;
  Resp k{p, p.bth().psn()};
  const uint32_t psn0 = qp.comp_.psn;
  const bool trace = base::log_enabled(base::LogLevel::kTrace);  // one branch per packet off
  CompStep st = CompStep::kCheckPsn;
  for (;;) {
    CompStep next;
    switch (st) {
      case CompStep::kCheckPsn: next = check_psn(qp, k); break;
      case CompStep::kCheckAck: next = check_ack(k); break;
      case CompStep::kWriteSend: next = write_send(e, qp, k); break;
      case CompStep::kImplicitAck: next = implicit_ack(e, qp, k); break;
      case CompStep::kRnrRetry: next = rnr_retry(e, qp, k); break;
      case CompStep::kNak: next = nak(e, qp, k); break;
      case CompStep::kGetWqe: next = get_wqe(qp, k); break;
      case CompStep::kCheckSeq: next = check_seq(e, qp, k); break;
      case CompStep::kRead: next = read_resp(e, qp, k); break;
      case CompStep::kAtomic: next = atomic_ack(e, qp, k); break;
      case CompStep::kUpdateComp:
        if (k.progress) on_progress(e, qp, psn0);
        next = CompStep::kCompleteWqe;
        break;
      case CompStep::kCompleteWqe:
        comp_retire(e, qp);
        if (k.resend_one && qp.state() == QpState::kRts) req_probe(e, qp);
        next = k.retry && qp.state() == QpState::kRts ? CompStep::kErrorRetry : CompStep::kDone;
        break;
      case CompStep::kErrorRetry:
        do_retry(e, qp);
        next = CompStep::kDone;
        break;
      case CompStep::kDone:
        req_run(e, qp);
        return;
      case CompStep::kDrop:
        return;
    }
    if (trace)
      RNIC_TRACE("comp qp %u psn %u: %s -> %s", qp.qpn(), k.psn, comp_step_name(st),
                 comp_step_name(next));
    st = next;
  }
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
    SendWindow& w = c.win;
    c.retrans_deadline_ns = 0;
    const bool iba = w.iba_deadline_ns != 0 && now_ns >= w.iba_deadline_ns;
    if (psn_diff(r.max_psn, c.psn) > 0 && first_active(qp) >= 0) {
      if (iba) {
        // The IBA local ACK timer: spends a retry_cnt (or fails the WQE). The oldest
        // unacknowledged packet goes alone (window 1); the rest follows as ACKs return.
        w.iba_deadline_ns = 0;
        w.probe_deadline_ns = 0;
        w.backoff = static_cast<uint8_t>(std::min<int>(w.backoff + 1, kMaxTimeoutBackoff));
        win_collapse(w, r.max_psn);
        bump(c.ctr, e.counters(), Ctr::kWindowCuts);
        bump(c.ctr, e.counters(), Ctr::kLocalAckTimeoutErr);
        do_retry(e, qp);
      } else {
        // The probe timer: no answer for an RTO. Resend the oldest unacknowledged packet
        // alone and change nothing else; spends no retry_cnt. A lost NAK or lost last ACKs
        // are recovered by its answer, a late ACK costs one duplicate.
        w.probe_deadline_ns = 0;
        w.probe_backoff = static_cast<uint8_t>(std::min<int>(w.probe_backoff + 1,
                                                             kMaxProbeBackoff));
        bump(c.ctr, e.counters(), Ctr::kRetransProbes);
        // A probed READ/ATOMIC is answered by responses that are already the rest: no go-back.
        w.probe_out = w.lossy && oldest_resends_alone(qp);
        w.probe_psn = c.psn;
        req_probe(e, qp);
      }
      run = true;
    } else {
      comp_disarm_retrans(c);
    }
  }
  if (run) {
    comp_retire(e, qp);
    req_run(e, qp);  // the resent packet re-arms the timers (send_batch, the clock)
    // Re-arm even if nothing was sent (the retried packets count as sent).
    if (c.timeout_ns != 0 && !r.rnr_wait && psn_diff(r.max_psn, c.psn) > 0 &&
        qp.state() == QpState::kRts)
      comp_arm_retrans(e, qp, now_ns);
  }
}

void comp_disarm_retrans(CompState& c) {
  c.retrans_deadline_ns = 0;
  c.win.iba_deadline_ns = 0;
  c.win.probe_deadline_ns = 0;
}

void comp_arm_retrans(Engine& e, Qp& qp, uint64_t now_ns) {
  CompState& c = qp.comp_;
  SendWindow& w = c.win;
  if (c.timeout_ns == 0) return;  // timeout 0: no retransmit timer at all (IBA)
  if (w.iba_deadline_ns == 0) w.iba_deadline_ns = now_ns + (c.timeout_ns << w.backoff);
  if (w.probe_deadline_ns == 0) {
    const uint64_t p = now_ns + (win_pto_ns(w) << w.probe_backoff);
    if (p < w.iba_deadline_ns) w.probe_deadline_ns = p;
  }
  uint64_t d = w.iba_deadline_ns;
  if (w.probe_deadline_ns != 0 && w.probe_deadline_ns < d) d = w.probe_deadline_ns;
  c.retrans_deadline_ns = d;
  e.arm_timer(qp, d);
}

void comp_on_cnp(Engine& e, Qp& qp) {
  if (!qp.req_.ready || qp.comp_.dead || !is_reliable(qp.type())) return;
  window_cut(e, qp, false);
}

}  // namespace rnic::emu
