// emu/transport/resp.cc: the responder state machine (rxe_resp.c order: PSN, opcode sequence, access,
// resources, length, rkey, execute, complete, acknowledge) with the error classes mapped to
// NAK syndromes and receive completions in one place; duplicate replay; UD delivery. Every
// refusal (NAK, RNR, drop, duplicate) logs one rate-limited line; each step traces.
#include "emu/transport/resp.h"

#include <algorithm>
#include <atomic>
#include <array>
#include <cstring>

#include "emu/objects/device.h"
#include "emu/transport/engine.h"
#include "emu/objects/mr.h"
#include "emu/objects/mw.h"
#include "emu/transport/recv.h"
#include "emu/transport/req.h"
#include "wire/byteorder.h"
#include "wire/psn.h"

namespace rnic::emu {

using wire::psn_add;
using wire::psn_diff;
namespace op = wire::op;
namespace aeth = wire::aeth;

namespace {

constexpr uint32_t kMaxDmaLen = 1u << 31;  // IBA: RETH DMA length <= 2^31

// Responder steps and outcomes (rxe enum resp_states, trimmed).
enum class Step : uint8_t {
  kCheckPsn,
  kCheckOpSeq,
  kCheckOpValid,
  kCheckResource,
  kCheckLength,
  kCheckRkey,
  kExecute,
  kComplete,
  kAcknowledge,
  kDone,
  // outcomes other than success
  kDrop,            // silent (Class D/E, UC errors, PSN ahead after the one NAK)
  kDuplicate,       // PSN behind ePSN
  kRnr,             // no receive WQE (RC): RNR NAK
  kErrInvReq,       // Class C: Invalid Request NAK, QP -> ERR
  kErrLength,       // receive buffer too short: recv WC, Invalid Request NAK, QP -> ERR
  kErrRkey,         // Class C: Remote Access NAK, QP -> ERR
  kErrRecvProt,     // Class A: receive SGE failed its local check: Remote Op NAK, QP -> ERR
  kErrCqOverflow,   // Class G: QP -> ERR
  kErrInvalidate,   // Class J: SEND_WITH_INV could not invalidate: recv WC, QP -> ERR
  kErrNakSent,      // a READ response failed its rkey re-check: NAK already sent, QP -> ERR
};
constexpr std::array<const char*, 20> kStepNames = {
    "CHECK_PSN",  "CHECK_OP_SEQ", "CHECK_OP_VALID", "CHECK_RESOURCE", "CHECK_LENGTH",
    "CHECK_RKEY", "EXECUTE",      "COMPLETE",       "ACKNOWLEDGE",    "DONE",
    "DROP",       "DUPLICATE",    "RNR",            "ERR_INV_REQ",    "ERR_LENGTH",
    "ERR_RKEY",   "ERR_RECV_PROT", "ERR_CQ_OVERFLOW", "ERR_INVALIDATE", "ERR_NAK_SENT"};

const char* step_name(Step s) { return kStepNames[static_cast<size_t>(s)]; }

// Per-packet context.
struct Pkt {
  const wire::PacketView& p;
  const wire::RxDesc& d;
  uint32_t mask;
  uint32_t psn;
  uint32_t plen;
  // Why a check refused the packet, for the one log line resp_on_packet writes for the
  // outcome (set by the step that returns the error; the steps take a const Pkt).
  mutable const char* why = nullptr;
  mutable RkeyResult rk = RkeyResult::kOk;
};

// Returns err after noting why (and the rkey check's result) for the outcome's log line.
Step refuse(const Pkt& k, Step err, const char* why, RkeyResult rk = RkeyResult::kOk) {
  k.why = why;
  k.rk = rk;
  return err;
}

// RNIC_PKT_LOG / RNIC_PKT_LOG_D (emu/transport/recv.h) for the packet k on qp.
#define RESP_LOG(kind, what, ctr, qp, k) \
  RNIC_PKT_LOG(kind, what, ctr, (k).d.src, (qp).qpn(), (k).p.opcode, (k).psn)
#define RESP_LOG_D(kind, what, detail, ctr, qp, k) \
  RNIC_PKT_LOG_D(kind, what, detail, ctr, (k).d.src, (qp).qpn(), (k).p.opcode, (k).psn)

Counters& dctr(Engine& e) { return e.counters(); }

// The receive side a request lands on. RC/UC/UD: the QP's PD, SRQ (or RQ) and receive CQ.
// XRC target: those of the XRC SRQ the XRCETH named (IBA 11.2.5.4: the SRQ's PD protects
// the data, its CQ takes the completions).
Pd* resp_pd(const Qp& qp) {
  if (qp.type() != QpType::kXrcRecv) return qp.pd().get();
  const auto& x = qp.resp_.xrc_srq;
  return x ? x->pd().get() : nullptr;
}
Srq* resp_srq(const Qp& qp) {
  return qp.type() == QpType::kXrcRecv ? qp.resp_.xrc_srq.get() : qp.srq().get();
}
Cq* resp_cq(const Qp& qp) {
  // A TM SRQ's receive completions go to its CQ, with its list operations (mlx5).
  if (qp.type() != QpType::kXrcRecv) {
    const Srq* srq = qp.srq().get();
    return srq != nullptr && srq->is_tm() ? srq->cq().get() : qp.recv_cq().get();
  }
  const auto& x = qp.resp_.xrc_srq;
  return x ? x->cq().get() : nullptr;
}

// ---- output ----

// Into tx: the receive context's batch (e.rx_batch()), or for a held ACK taken by a
// requester run (resp_take_ack) that run's thread's.
void queue_raw(Engine& e, Qp& qp, TxBatch& tx, const wire::PacketFields& f,
               const uint8_t* payload, uint32_t plen, MemAccess* mem = nullptr,
               uint64_t host = 0, bool* mem_ok = nullptr) {
  RespState& s = qp.resp_;
  if (tx.full()) e.flush(tx);
  uint8_t* buf = tx.next();
  size_t hl;
  if (qp.type() == QpType::kXrcRecv) {
    // An XRC target answers with the XRC twins of RC's responses (0xA0 | op, no XRCETH).
    wire::PacketFields xf = f;
    xf.opcode = static_cast<uint8_t>(op::kXrcBase | f.opcode);
    hl = wire::write_roce_headers(buf, xf, plen);
  } else {
    hl = wire::write_roce_headers(buf, f, plen);
  }
  if (plen > 0) {
    if (mem != nullptr) {
      if (!mem->read(host, buf + hl, plen)) {
        if (mem_ok != nullptr) *mem_ok = false;
        return;
      }
    } else if (payload != nullptr) {
      std::memcpy(buf + hl, payload, plen);
    }
  }
  const auto len = static_cast<uint32_t>(wire::roce_len(hl, plen));
  wire::finish_roce(buf, hl, plen, s.meta, tx.ip_id_for(s.dst, len));
  tx.commit(s.dst, len);
  bump(qp.comp_.ctr, dctr(e), Ctr::kSentPkts);
}

void emit_pending_ack(Engine& e, Qp& qp, TxBatch& tx) {
  RespState& s = qp.resp_;
  if (!s.ack_pending) return;
  s.ack_pending = false;
  wire::PacketFields f;
  f.opcode = op::kRcAcknowledge;
  f.dest_qp = qp.attr().dest_qp_num;
  f.psn = s.ack_psn;
  f.syndrome = aeth::ack(aeth::kCreditInvalid);
  f.msn = s.ack_msn;
  queue_raw(e, qp, tx, f, nullptr, 0);
}
void emit_pending_ack(Engine& e, Qp& qp) { emit_pending_ack(e, qp, e.rx_batch()); }

// Every packet the responder sends goes after the ACK it still owes (PSN/MSN order).
void queue_packet(Engine& e, Qp& qp, const wire::PacketFields& f, const uint8_t* payload,
                  uint32_t plen, MemAccess* mem = nullptr, uint64_t host = 0,
                  bool* mem_ok = nullptr) {
  emit_pending_ack(e, qp);
  queue_raw(e, qp, e.rx_batch(), f, payload, plen, mem, host, mem_ok);
}

// Owes an ACK for psn: coalesced with a later one until the receive batch ends, at most
// kMaxAckReqsPerAck AckReqs per ACK: a requester that spaces AckReqs through its window
// (docs/congestion.md) gets several ACKs per window, so one lost ACK does not stall it.
constexpr uint8_t kMaxAckReqsPerAck = 2;

// Records the ACK owed for psn (at the current MSN) and puts the QP on the engine's
// pending-ACK list, sent when the receive batch ends (or now if the list is full).
void owe_ack(Engine& e, Qp& qp, uint32_t psn) {
  RespState& s = qp.resp_;
  s.ack_pending = true;
  s.ack_psn = psn;
  s.ack_msn = s.msn;
  if (!s.ack_listed) {
    if (e.defer_ack(qp)) {
      s.ack_listed = true;
    } else {
      emit_pending_ack(e, qp);  // list full: send it now
    }
  }
}

void defer_ack(Engine& e, Qp& qp, uint32_t psn) {
  RespState& s = qp.resp_;
  if (s.ack_pending && s.ack_reqs + 1 >= kMaxAckReqsPerAck) emit_pending_ack(e, qp);
  if (s.ack_pending) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kAckDeferred);
    ++s.ack_reqs;
  } else {
    s.ack_reqs = 0;
  }
  owe_ack(e, qp, psn);
}

// Owes an ACK for psn, replacing any owed one (never sent early): the stash replay
// acknowledges only the last PSN it completed, so the requester sees one answer.
void hold_ack(Engine& e, Qp& qp, uint32_t psn) {
  qp.resp_.ack_reqs = 0;
  owe_ack(e, qp, psn);
}

void send_ack(Engine& e, Qp& qp, uint8_t syndrome, uint32_t psn) {
  wire::PacketFields f;
  f.opcode = op::kRcAcknowledge;
  f.dest_qp = qp.attr().dest_qp_num;
  f.psn = psn;
  f.syndrome = syndrome;
  f.msn = qp.resp_.msn;
  queue_packet(e, qp, f, nullptr, 0);
}

// A request that arrived with ECN CE (IP TOS & 3 == 3), or in a receive batch that found our
// own receive queue past EngineConfig::rx_mark_pct (Engine::rx_marking): as a RoCE NIC's
// notification point (DCQCN), tell the requesting QP with a CNP (opcode 0x81, BECN set, PSN
// 0, 16 reserved bytes, as ConnectX sends it), at most one per QP per Device::cnp_min_gap_ns
// (50 µs, DCQCN's N).
// The requester cuts its window (comp.cc, docs/congestion.md §3). RC and UC only: a UD
// request names no QP to answer, and an XRC target's answers go through the XRC opcodes.
void note_ce(Engine& e, Qp& qp) {
  if (qp.type() != QpType::kRc && qp.type() != QpType::kUc) return;
  RespState& s = qp.resp_;
  const uint64_t now = e.rx_now();  // the batch's reading: a marked batch asks per request
  if (s.cnp_last_ns != 0 && now - s.cnp_last_ns < e.device().cnp_min_gap_ns()) return;
  s.cnp_last_ns = now;
  wire::PacketFields f;
  f.opcode = op::kCnp;
  f.dest_qp = qp.attr().dest_qp_num;
  f.becn = true;
  f.psn = 0;
  queue_raw(e, qp, e.rx_batch(), f, nullptr, 0);
  bump(qp.comp_.ctr, dctr(e), Ctr::kCnpSent);
}

void send_nak(Engine& e, Qp& qp, uint8_t code, uint32_t psn) {
  bump(qp.comp_.ctr, dctr(e), Ctr::kNakSent);
  if (code == aeth::kNakRemoteAccessError) bump(qp.comp_.ctr, dctr(e), Ctr::kRemAccessNakSent);
  send_ack(e, qp, aeth::nak(code), psn);
}

// Packets [from, to) of the READ responses for [va, va+len) starting at psn, one per PSN,
// rkey re-validated for every packet (rxe_recheck_mr; S19). On failure *fail_psn is the PSN
// that could not be answered.
bool send_read_range(Engine& e, Qp& qp, uint32_t rkey, uint32_t psn, uint64_t va, uint32_t len,
                     uint32_t msn, uint32_t from, uint32_t to, uint32_t* fail_psn) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  const uint32_t mtu = s.mtu;
  const uint32_t n = num_pkts(len, mtu);
  for (uint32_t i = from; i < to && i < n; ++i) {
    const uint32_t plen = std::min<uint32_t>(mtu, len - i * mtu);
    wire::PacketFields f;
    f.opcode = n == 1            ? op::kRcRdmaReadResponseOnly
               : i == 0          ? op::kRcRdmaReadResponseFirst
               : i == n - 1      ? op::kRcRdmaReadResponseLast
                                 : op::kRcRdmaReadResponseMiddle;
    f.dest_qp = qp.attr().dest_qp_num;
    f.psn = psn_add(psn, i);
    f.syndrome = aeth::ack(aeth::kCreditInvalid);
    f.msn = msn;
    if (plen == 0) {
      queue_packet(e, qp, f, nullptr, 0);
      continue;
    }
    RemoteTarget t;
    RkeyResult rk = check_remote(dev.keys(), rkey, resp_pd(qp), qp.qpn(), va + uint64_t{i} * mtu,
                                 plen, kAccessRemoteRead, &t, &qp.resp_.rkeys);
    bool ok = rk == RkeyResult::kOk;
    if (ok) {
      queue_packet(e, qp, f, nullptr, plen, &dev.mem(), t.host_addr, &ok);
      if (!ok) bump(qp.comp_.ctr, dctr(e), Ctr::kMemFault);
    }
    if (!ok) {
      *fail_psn = f.psn;
      return false;
    }
  }
  return true;
}

// All READ responses for [va, va+len) starting at psn (a new READ: executed inline).
bool send_read_responses(Engine& e, Qp& qp, uint32_t rkey, uint32_t psn, uint64_t va,
                         uint32_t len, uint32_t msn, uint32_t* fail_psn) {
  return send_read_range(e, qp, rkey, psn, va, len, msn, 0, num_pkts(len, qp.resp_.mtu),
                         fail_psn);
}

// Duplicate READ / ATOMIC replay limits (issue 10 item 5). A duplicate READ is answered only
// from a saved responder resource (IBA 9.7.5.1.x, C9-105 .. C9-112: max_dest_rd_atomic of
// them), in slices of kReplaySlice packets per receive round, round-robin with the other QPs
// that replay (Engine::run_replays_locked), so one QP's replay cannot hold the receive
// thread. A newer duplicate supersedes the replay in progress (the requester restarted).
// Each resource may cause at most kReplayFactor times its own packets in replays: a
// requester retries a READ at most retry_cnt (<= 7) times, plus the original; beyond that
// a duplicate is dropped (counted as duplicate_request).
constexpr uint32_t kReplaySlice = 16;
constexpr uint32_t kReplayFactor = 8;

// One slice of s.replay. from_engine: called by the engine's replay round (it alone clears
// `listed`, so the QP is in its list at most once).
ReplayResult replay_slice(Engine& e, Qp& qp, bool from_engine) {
  RespState& s = qp.resp_;
  ReadReplay& rp = s.replay;
  auto done = [&]() {
    rp.active = false;
    if (from_engine) rp.listed = false;
    return ReplayResult::kDone;
  };
  if (!rp.active || !s.ready || qp.comp_.dead || rp.res >= s.res.size()) return done();
  RespRes& r = s.res[rp.res];
  uint32_t to = std::min(rp.n, rp.next + kReplaySlice);
  to = std::min(to, rp.next + r.replay_budget);
  if (to == rp.next) {
    RNIC_LOG_RL(kWarn, "dup: READ replay budget exhausted on qpn 0x%x at psn %u: rest dropped",
                qp.qpn(), psn_add(rp.psn, rp.next));
    return done();
  }
  uint32_t fail_psn = 0;
  const bool ok = send_read_range(e, qp, r.rkey, rp.psn, rp.va, rp.len, r.msn, rp.next, to,
                                  &fail_psn);
  r.replay_budget -= to - rp.next;
  rp.next = to;
  if (!ok) {
    send_nak(e, qp, aeth::kNakRemoteAccessError, fail_psn);
    RNIC_LOG_RL(kWarn, "nak: duplicate READ replay failed its rkey re-check on qpn 0x%x psn %u",
                qp.qpn(), fail_psn);
    done();
    return ReplayResult::kFatal;
  }
  if (rp.next == rp.n) return done();
  if (!rp.listed && !from_engine) {
    if (!e.list_replay(qp)) {
      // Replay list full: finish here (still bounded by the resource's budget).
      while (rp.active) {
        const ReplayResult x = replay_slice(e, qp, true);
        if (x != ReplayResult::kMore) return x;
      }
      return ReplayResult::kDone;
    }
    rp.listed = true;
  }
  return ReplayResult::kMore;
}

// A packet other than a duplicate READ on a QP with a replay in progress: the replay's
// remaining responses go first (PSN order; bounded by the resource's budget).
ReplayResult finish_replay(Engine& e, Qp& qp) {
  while (qp.resp_.replay.active) {
    const ReplayResult x = replay_slice(e, qp, false);
    if (x != ReplayResult::kMore) return x;
  }
  return ReplayResult::kDone;
}

void send_atomic_ack(Engine& e, Qp& qp, uint32_t psn, uint64_t orig, uint32_t msn) {
  wire::PacketFields f;
  f.opcode = op::kRcAtomicAcknowledge;
  f.dest_qp = qp.attr().dest_qp_num;
  f.psn = psn;
  f.syndrome = aeth::ack(aeth::kCreditInvalid);
  f.msn = msn;
  f.orig = orig;
  queue_packet(e, qp, f, nullptr, 0);
}

// The answer to an ATOMIC_WRITE or FLUSH: a zero-length RDMA READ RESPONSE ONLY (IBA 1.5
// Annex A19; rxe send_read_response_ack).
void send_empty_read_resp(Engine& e, Qp& qp, uint32_t psn, uint32_t msn) {
  wire::PacketFields f;
  f.opcode = op::kRcRdmaReadResponseOnly;
  f.dest_qp = qp.attr().dest_qp_num;
  f.psn = psn;
  f.syndrome = aeth::ack(aeth::kCreditInvalid);
  f.msn = msn;
  queue_packet(e, qp, f, nullptr, 0);
}

// ---- receive WQEs ----

// Takes the next receive WQE (SRQ or own RQ) into s.wqe / s.sges.
bool take_wqe(Qp& qp) {
  RespState& s = qp.resp_;
  if (Srq* srq = resp_srq(qp)) {
    if (!srq->pop(&s.wqe, s.sges)) return false;
  } else {
    Ring<RecvWqe>& rq = qp.rq();
    if (rq.empty()) return false;
    const RecvWqe& h = rq.head();
    s.wqe = h;
    uint32_t n = std::min<uint32_t>(h.num_sge, kMaxSge);
    for (uint32_t i = 0; i < n; ++i) s.sges[i] = h.sge[i];
    s.wqe.num_sge = n;
    rq.pop();
  }
  s.wqe.sge = s.sges;
  s.have_wqe = true;
  s.recv_offset = 0;
  s.tm = RespState::Tm{};
  return true;
}

Cqe recv_cqe(const Qp& qp, WcStatus st) {
  const RespState& s = qp.resp_;
  Cqe c;
  c.wr_id = s.wqe.wr_id;
  c.status = st;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp.qpn();
  c.src_qp = qp.attr().dest_qp_num;
  c.byte_len = static_cast<uint32_t>(s.recv_offset);
  if (s.tm.active) {
    c.opcode = s.tm.opcode;
    c.wc_flags = s.tm.flags;
    if (s.tm.flags & kWcTmMatch) {
      c.tm_tag = s.tm.tag;
      c.tm_priv = s.tm.priv;
    }
  }
  return c;
}

// Completes the held WQE with an error status (pushes regardless of signaling).
void complete_held_error(Qp& qp, WcStatus st) {
  RespState& s = qp.resp_;
  if (!s.have_wqe) return;
  Cqe c = recv_cqe(qp, st);
  if (Cq* cq = resp_cq(qp)) (void)cq->push(c);
  s.have_wqe = false;
  s.cur = RespState::kNone;
}

// UC: abandon the message in progress; a held WQE is kept for the next message.
void uc_abort(Qp& qp) {
  RespState& s = qp.resp_;
  s.cur = RespState::kNone;
  s.recv_offset = 0;
}

// ---- checks ----

// ---- out-of-sequence stash (docs/congestion.md §2) ----

constexpr uint32_t kStashMask = kStashPerQp - 1;

void stash_release(Engine& e, RespState& s, uint32_t idx) {
  if (s.stash[idx] < 0) return;
  e.stash_pool().give(s.stash[idx]);
  s.stash[idx] = -1;
  --s.stash_n;
}

// SEND and WRITE packets only (RC opcodes 0x00-0x0b, SEND_*_WITH_INVALIDATE): READ, ATOMIC,
// ATOMIC_WRITE and FLUSH answer with data or depend on state, so they wait for the resend.
bool stashable(uint8_t opcode) {
  return opcode <= op::kRcRdmaWriteOnlyWithImm || opcode == op::kRcSendLastWithInv ||
         opcode == op::kRcSendOnlyWithInv;
}

// A request d PSNs ahead of the expected one (the gap already NAKed once): kept for
// execution once the gap fills, if the device stashes, it is a simple request, within the
// QP's bound and a pool slot is free. A duplicate of a stashed PSN is dropped.
void stash_put(Engine& e, Qp& qp, const Pkt& k, int32_t d) {
  RespState& s = qp.resp_;
  if (qp.type() != QpType::kRc || !e.device().rc_stash() || !stashable(k.p.opcode)) return;
  // After an RNR NAK the requester resends everything from the RNR PSN once the RNR timer
  // runs out: a stashed copy would only be replayed into the same empty receive queue.
  if (s.rnr_gap) return;
  // Only from the UDP source port the QP's in-order requests came from (a requester keeps one
  // per QP): a blind forger spraying PSNs ahead of ePSN from elsewhere fills no slot, and one
  // must guess the port too (2^16 x the 512-PSN reach of the stash, against 1 exact PSN without
  // it). Packets from another port are dropped as before; the go-back recovers them.
  if (s.inorder_sport != (0x10000u | k.d.src.port)) return;
  if (d >= static_cast<int32_t>(kStashPerQp) || k.p.roce_len > kStashSlotBytes) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kStashFull);
    return;
  }
  if (s.stash.empty()) s.stash.assign(kStashPerQp, -1);
  const uint32_t idx = k.psn & kStashMask;
  if (s.stash[idx] >= 0) {
    if (e.stash_pool().at(s.stash[idx]).psn == k.psn) return;  // a duplicate
    stash_release(e, s, idx);                                   // stale (behind epsn)
  }
  const int32_t slot = e.stash_pool().take();
  if (slot < 0) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kStashFull);
    return;
  }
  StashSlot& ss = e.stash_pool().at(slot);
  std::memcpy(ss.bytes, k.p.roce, k.p.roce_len);
  ss.len = static_cast<uint32_t>(k.p.roce_len);
  ss.psn = k.psn;
  ss.d = k.d;
  ss.d.buf = ss.bytes;
  ss.d.len = ss.len;
  ss.d.cap = kStashSlotBytes;
  ss.d.seg_size = 0;
  s.stash[idx] = slot;
  ++s.stash_n;
  bump(qp.comp_.ctr, dctr(e), Ctr::kStashStored);
}

Step check_psn(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  const int32_t d = psn_diff(k.psn, s.epsn);
  if (qp.type() == QpType::kUc) {
    const bool start = k.mask & wire::kStartMask;
    if (d != 0 || s.uc_drop) {
      if (!start) {
        // IBA 9.7.5.1.1 (UC): a gap drops everything up to the next FIRST/ONLY.
        if (d != 0) bump(qp.comp_.ctr, dctr(e), Ctr::kOutOfSeqRequest);
        s.uc_drop = true;
        uc_abort(qp);
        s.epsn = psn_add(k.psn, 1);
        return refuse(k, Step::kDrop,
                      d != 0 ? "UC PSN gap: message dropped up to the next FIRST/ONLY"
                             : "UC message after a gap or error: dropped to the next FIRST/ONLY");
      }
      if (s.cur != RespState::kNone) uc_abort(qp);
      s.uc_drop = false;
      s.epsn = k.psn;
    }
    return Step::kCheckOpSeq;
  }
  if (d > 0) {
    // Class B: one PSN-sequence NAK per gap (sent_psn_nak latch), then silent drops.
    bump(qp.comp_.ctr, dctr(e), Ctr::kOutOfSeqRequest);
    RNIC_LOG_RL(kWarn,
                "drop: PSN ahead of the expected %u (%s) from %s to qpn 0x%x op %s psn %u "
                "(out_of_seq_request)",
                s.epsn, s.nak_sent ? "NAK already sent for this gap" : "PSN sequence NAK sent",
                EndpointText(k.d.src).c_str(), qp.qpn(), opcode_log_name(k.p.opcode), k.psn);
    if (!s.nak_sent) {
      s.nak_sent = true;
      send_nak(e, qp, aeth::kNakPsnSeqError, s.epsn);
    }
    stash_put(e, qp, k, d);
    return Step::kDrop;
  }
  if (d < 0) return Step::kDuplicate;
  s.nak_sent = s.rnr_gap = false;
  s.inorder_sport = 0x10000u | k.d.src.port;
  return Step::kCheckOpSeq;
}

// XRC target (IBA 9.3.6 / 11.2.5.4): the XRCETH must name an XRC SRQ of the QP's own XRC
// domain, the same one for every packet of a message; else Invalid Request NAK.
Step check_xrc(Engine& e, Qp& qp, const Pkt& k) {
  if (qp.type() != QpType::kXrcRecv) return Step::kCheckOpSeq;
  RespState& s = qp.resp_;
  const uint32_t n = k.p.xrceth().srqn();
  if (s.xrc_srq && s.xrc_srq->srq_num() == n && s.xrc_srq->alive()) return Step::kCheckOpSeq;
  if (s.cur != RespState::kNone)
    return refuse(k, Step::kErrInvReq, "XRCETH changed its SRQ in the middle of a message");
  std::shared_ptr<Srq> srq = e.device().find_srq(n);
  if (!srq || !srq->is_xrc())
    return refuse(k, Step::kErrInvReq, "XRCETH names no XRC SRQ");
  if (srq->xrcd() != qp.xrcd())
    return refuse(k, Step::kErrInvReq, "XRCETH names an SRQ of another XRC domain");
  s.xrc_srq = std::move(srq);
  return Step::kCheckOpSeq;
}

Step check_op_seq(Qp& qp, const Pkt& k) {
  const RespState& s = qp.resp_;
  const bool start = k.mask & wire::kStartMask;
  switch (s.cur) {
    case RespState::kNone:
      if (!start)
        return refuse(k, Step::kErrInvReq, "opcode sequence: MIDDLE/LAST outside a message");
      break;
    case RespState::kSend:
      if (start || !(k.mask & wire::kSendMask))
        return refuse(k, Step::kErrInvReq, "opcode sequence: SEND message interrupted");
      break;
    case RespState::kWrite:
      if (start || !(k.mask & wire::kWriteMask))
        return refuse(k, Step::kErrInvReq, "opcode sequence: WRITE message interrupted");
      break;
  }
  return Step::kCheckOpValid;
}

Step check_op_valid(Qp& qp, const Pkt& k) {
  const uint32_t acc = qp.attr().qp_access_flags;
  if ((k.mask & wire::kWriteMask) && !(acc & kAccessRemoteWrite))
    return refuse(k, Step::kErrInvReq, "QP access flags lack REMOTE_WRITE");
  if ((k.mask & wire::kReadMask) && !(acc & kAccessRemoteRead))
    return refuse(k, Step::kErrInvReq, "QP access flags lack REMOTE_READ");
  if ((k.mask & wire::kAtomicMask) && !(acc & kAccessRemoteAtomic))
    return refuse(k, Step::kErrInvReq, "QP access flags lack REMOTE_ATOMIC");
  // ATOMIC_WRITE needs REMOTE_WRITE (rxe check_qp_attr_access; docs/checks.md §2.2 row 3).
  if ((k.mask & wire::kAtomicWriteMask) && !(acc & kAccessRemoteWrite))
    return refuse(k, Step::kErrInvReq, "QP access flags lack REMOTE_WRITE (ATOMIC_WRITE)");
  if (k.mask & wire::kFlushMask) {
    const auto f = k.p.feth();
    // Reserved placement types / selectivity levels: a malformed request.
    if (f.plt() == 0 || (f.plt() & ~(kFlushGlobal | kFlushPersistent)) != 0 ||
        f.sel() > kFlushMr)
      return refuse(k, Step::kErrInvReq, "FLUSH with a reserved placement type or level");
    if (((f.plt() & kFlushGlobal) && !(acc & kAccessFlushGlobal)) ||
        ((f.plt() & kFlushPersistent) && !(acc & kAccessFlushPersistent)))
      return refuse(k, Step::kErrInvReq, "QP access flags lack the FLUSH placement type");
  }
  if (qp.type() == QpType::kUc && (k.mask & (wire::kReadMask | wire::kAtomicMask)))
    return refuse(k, Step::kErrInvReq, "READ/ATOMIC on a UC QP");
  return Step::kCheckResource;
}

// A SEND starting on an RC QP of a TM SRQ: the TMH at the payload start picks the buffer.
// EAGER / RNDV: the oldest posted tag that matches (Srq::tm_match, only while the phase
// counts agree), else an unexpected buffer (the SRQ's ordinary WQEs) taking the whole message,
// TMH included, counted unexpected. NO_TAG / FIN: an unexpected buffer, never matched nor
// counted (completes as IBV_WC_TM_NO_TAG). Malformed TMH: counted, Invalid Request NAK.
Step tm_bad(Engine& e, Qp& qp, const Pkt& k, const char* why) {
  bump(qp.comp_.ctr, dctr(e), Ctr::kTmBadHeader);
  return refuse(k, Step::kErrInvReq, why);
}

Step tm_take(Engine& e, Qp& qp, const Pkt& k, Srq& srq) {
  RespState& s = qp.resp_;
  if (k.plen < kTmhSize) return tm_bad(e, qp, k, "SEND to a TM SRQ shorter than the TMH");
  const uint8_t* h = k.p.payload;
  const uint8_t opc = h[0];
  const bool tagged = opc == kTmhEager || opc == kTmhRndv;
  if (!tagged && opc != kTmhNoTag && opc != kTmhFin)
    return tm_bad(e, qp, k, "SEND to a TM SRQ with an unknown TMH opcode");
  if (opc == kTmhRndv && (k.plen < kTmhSize + kRvhSize || !(k.mask & wire::kEndMask)))
    return tm_bad(e, qp, k, "RNDV SEND not one packet holding TMH and RVH");
  const uint64_t tag = wire::load_be64(h + 8);
  bool matched = tagged && srq.tm_match(tag, &s.wqe, s.sges);
  if (!matched) {
    if (!srq.pop(&s.wqe, s.sges)) return Step::kRnr;
    if (tagged) srq.tm_count_unexpected();
  }
  s.wqe.sge = s.sges;
  s.have_wqe = true;
  s.recv_offset = 0;
  RespState::Tm& t = s.tm;
  t = RespState::Tm{};
  t.active = true;
  t.opcode = tagged ? WcOpcode::kTmRecv : WcOpcode::kTmNoTag;
  if (matched) {
    t.tag = tag;
    t.priv = wire::load_be32(h + 4);
    if (opc == kTmhRndv) {
      t.rndv = true;
      t.flags = kWcTmMatch;
      t.rva = wire::load_be64(h + kTmhSize);
      t.rkey = wire::load_be32(h + kTmhSize + 8);
      t.rlen = wire::load_be32(h + kTmhSize + 12);
    } else {
      t.flags = kWcTmMatch | kWcTmDataValid;
      t.skip = kTmhSize;
    }
  }
  return Step::kCheckLength;
}

Step check_resource(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  if (k.mask & wire::kRwrMask) {
    if (!s.have_wqe) {
      Srq* srq = resp_srq(qp);
      if (srq != nullptr && srq->is_tm() && qp.type() == QpType::kRc &&
          (k.mask & wire::kSendMask)) {
        const Step st = tm_take(e, qp, k, *srq);
        if (st != Step::kCheckLength) return st;
      } else if (!take_wqe(qp)) {
        return Step::kRnr;
      }
    }
  }
  if (k.mask & (wire::kReadMask | wire::kAtomicMask | wire::kAtomicWriteMask |
                wire::kFlushMask)) {
    if (s.res.empty())
      return refuse(k, Step::kErrInvReq, "READ/ATOMIC with max_dest_rd_atomic 0");
  }
  return Step::kCheckLength;
}

Step check_length(Engine& e, Qp& qp, const Pkt& k) {
  const RespState& s = qp.resp_;
  const uint32_t mtu = s.mtu;
  const bool start = k.mask & wire::kStartMask;
  const bool end = k.mask & wire::kEndMask;
  constexpr const char* kBadPayload = "payload length illegal for the opcode and path MTU";
  constexpr const char* kBadWrite = "WRITE payload disagrees with the RETH DMA length";
  // IBA 9.7.5.1.4 / 9.6 (C9-20..22): the path MTU the QP got at RTR is the one that counts; a
  // packet longer than it is a malformed length — Invalid Request NAK (RC), dropped (UC). A
  // peer whose path MTU is larger than ours (SOFTRNIC_MTU differs) ends here.
  if ((k.mask & wire::kPayloadMask) && k.plen > mtu) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kMtuExceeded);
    return refuse(k, Step::kErrInvReq, "payload longer than the QP's path MTU");
  }
  if (k.mask & wire::kPayloadMask) {
    if (start && end) {
      if (k.plen > mtu) return refuse(k, Step::kErrInvReq, kBadPayload);
    } else if (end) {
      if (k.plen < 1 || k.plen > mtu) return refuse(k, Step::kErrInvReq, kBadPayload);
    } else if (k.plen != mtu) {
      return refuse(k, Step::kErrInvReq, kBadPayload);
    }
  }
  if (k.mask & wire::kRethMask) {
    if (k.p.reth().dma_len() > kMaxDmaLen)
      return refuse(k, Step::kErrInvReq, "RETH DMA length above 2^31");
  }
  // ATOMIC_WRITE: the RETH names exactly the 8 payload bytes (parse_roce checked those).
  if ((k.mask & wire::kAtomicWriteMask) && k.p.reth().dma_len() != 8)
    return refuse(k, Step::kErrInvReq, "ATOMIC_WRITE RETH DMA length is not 8");
  if (k.mask & wire::kWriteMask) {
    // Payload vs DMA length (rxe check_length / ReDMArk A2).
    if (start) {
      const uint32_t dl = k.p.reth().dma_len();
      if (end ? k.plen != dl : dl <= mtu) return refuse(k, Step::kErrInvReq, kBadWrite);
    } else if (end) {
      if (k.plen != s.w_resid) return refuse(k, Step::kErrInvReq, kBadWrite);
    } else if (s.w_resid <= mtu) {
      return refuse(k, Step::kErrInvReq, kBadWrite);
    }
  }
  return Step::kCheckRkey;
}

// The rights a FLUSH of placement type plt needs (rxe check_rkey).
uint32_t flush_access(uint8_t plt) {
  return ((plt & kFlushGlobal) ? kAccessFlushGlobal : 0) |
         ((plt & kFlushPersistent) ? kAccessFlushPersistent : 0);
}

// The range a FLUSH covers: the RETH range (level RANGE), or the whole MR / window the rkey
// names (level MR: VA and length are not used, rxe skips the range check). A zero-length
// RANGE flush still has its key checked (rxe validates FLUSH keys whatever the length), so it
// is checked as a flush of the whole object, which it cannot exceed.
RkeyResult flush_target(Device& dev, const Qp& qp, const Pkt& k, uint64_t* va, uint64_t* len) {
  const auto reth = k.p.reth();
  if (k.p.feth().sel() == kFlushRange && reth.dma_len() != 0) {
    *va = reth.va();
    *len = reth.dma_len();
    return RkeyResult::kOk;
  }
  const uint32_t rkey = reth.rkey();
  if (std::shared_ptr<Mw> mw = dev.keys().find_mw(rkey)) {
    const MwView w = mw->view();
    *va = w.zero_based ? 0 : w.addr;
    *len = w.length;
  } else if (std::shared_ptr<Mr> mr = dev.keys().find_mr(rkey)) {
    const MrView v = mr->view();
    *va = v.iova;
    *len = v.length;
  } else {
    return RkeyResult::kBadKey;
  }
  (void)qp;
  // check_remote checks no key for a zero length: an empty MR/window is refused here.
  return *len == 0 ? RkeyResult::kOutOfRange : RkeyResult::kOk;
}

Step check_rkey(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  if ((k.mask & wire::kWriteMask) && (k.mask & wire::kStartMask)) {
    const auto reth = k.p.reth();
    // The whole message is validated before its first byte lands, so a failing message
    // changes nothing — not even the in-range part of its first packet (S05).
    if (reth.dma_len() > 0) {
      RkeyResult r = check_remote(dev.keys(), reth.rkey(), resp_pd(qp), qp.qpn(), reth.va(),
                                  reth.dma_len(), kAccessRemoteWrite, nullptr, &qp.resp_.rkeys);
      if (r != RkeyResult::kOk) return refuse(k, Step::kErrRkey, "WRITE refused by rkey check:", r);
    }
    s.w_rkey = reth.rkey();
    s.w_va = reth.va();
    s.w_resid = reth.dma_len();
    s.w_total = reth.dma_len();
  } else if (k.mask & wire::kReadMask) {
    const auto reth = k.p.reth();
    if (reth.dma_len() > 0) {
      RkeyResult r = check_remote(dev.keys(), reth.rkey(), resp_pd(qp), qp.qpn(), reth.va(),
                                  reth.dma_len(), kAccessRemoteRead, nullptr, &qp.resp_.rkeys);
      if (r != RkeyResult::kOk) return refuse(k, Step::kErrRkey, "READ refused by rkey check:", r);
    }
  } else if (k.mask & wire::kAtomicMask) {
    const auto a = k.p.atomic_eth();
    RkeyResult r = check_remote(dev.keys(), a.rkey(), resp_pd(qp), qp.qpn(), a.va(), 8,
                                kAccessRemoteAtomic, nullptr, &qp.resp_.rkeys);
    if (r == RkeyResult::kMisaligned)  // S08
      return refuse(k, Step::kErrInvReq, "ATOMIC address not 8-byte aligned");
    if (r != RkeyResult::kOk) return refuse(k, Step::kErrRkey, "ATOMIC refused by rkey check:", r);
  } else if (k.mask & wire::kAtomicWriteMask) {
    const auto reth = k.p.reth();
    RkeyResult r = check_remote(dev.keys(), reth.rkey(), resp_pd(qp), qp.qpn(), reth.va(), 8,
                                kAccessRemoteWrite, nullptr, &qp.resp_.rkeys);
    if (r != RkeyResult::kOk)
      return refuse(k, Step::kErrRkey, "ATOMIC_WRITE refused by rkey check:", r);
    if (reth.va() & 7)  // IBA A19.4.2 (rxe): 8-byte aligned, else Invalid Request
      return refuse(k, Step::kErrInvReq, "ATOMIC_WRITE address not 8-byte aligned");
  } else if (k.mask & wire::kFlushMask) {
    uint64_t va = 0, len = 0;
    RkeyResult r = flush_target(dev, qp, k, &va, &len);
    if (r == RkeyResult::kOk)
      r = check_remote(dev.keys(), k.p.reth().rkey(), resp_pd(qp), qp.qpn(), va, len,
                       flush_access(k.p.feth().plt()), nullptr, &qp.resp_.rkeys);
    if (r != RkeyResult::kOk) return refuse(k, Step::kErrRkey, "FLUSH refused by rkey check:", r);
  }
  return Step::kExecute;
}

RespRes& next_res(RespState& s) {
  RespRes& r = s.res[s.res_next];
  s.res_next = (s.res_next + 1) % static_cast<uint32_t>(s.res.size());
  return r;
}

// kExecute, one function per request kind (docs/checks.md §2.2 rows 9-12).
// SEND: scatter the payload into the held receive WQE.
Step execute_send(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  const bool end = k.mask & wire::kEndMask;
  constexpr const char* kShort = "SEND longer than the receive WQE";
  // Tag matching: a matched EAGER message lands without its TMH; a matched RNDV header is
  // consumed (its data is READ into the tag's buffer once the message completes).
  const uint8_t* payload = k.p.payload;
  uint32_t plen = k.plen;
  if (s.tm.rndv) {
    plen = 0;
  } else if (s.tm.skip != 0) {
    payload += s.tm.skip;
    plen -= s.tm.skip;  // tm_take: the first packet holds the whole TMH
  }
  if (s.recv_offset + plen > s.wqe.length) return refuse(k, Step::kErrLength, kShort);
  if (plen > 0) {
    WcStatus st = scatter_sges(dev, resp_pd(qp), s.wqe.sge, s.wqe.num_sge, s.recv_offset,
                               payload, plen, &qp.comp_.ctr, &dctr(e));
    if (st == WcStatus::kLocLenErr) return refuse(k, Step::kErrLength, kShort);
    if (st != WcStatus::kSuccess)
      return refuse(k, Step::kErrRecvProt, "receive SGE failed its local check");
  }
  s.tm.skip = 0;
  s.recv_offset += plen;
  s.cur = end ? RespState::kNone : RespState::kSend;
  return end ? Step::kComplete : Step::kAcknowledge;
}

// RDMA WRITE: the rkey is re-validated for every packet, then the payload lands.
Step execute_write(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  const bool end = k.mask & wire::kEndMask;
  if (k.plen > 0) {
    // Re-validated for every packet: an invalidation between packets stops the rest.
    RemoteTarget t;
    RkeyResult r = check_remote(dev.keys(), s.w_rkey, resp_pd(qp), qp.qpn(), s.w_va, k.plen,
                                kAccessRemoteWrite, &t, &qp.resp_.rkeys);
    if (r != RkeyResult::kOk)
      return refuse(k, Step::kErrRkey, "WRITE packet refused by rkey re-check:", r);
    if (!dev.mem().write(t.host_addr, k.p.payload, k.plen)) {
      bump(qp.comp_.ctr, dctr(e), Ctr::kMemFault);
      return refuse(k, Step::kErrRkey, "WRITE target memory not writable");
    }
  }
  s.w_va += k.plen;
  s.w_resid -= k.plen;
  s.cur = end ? RespState::kNone : RespState::kWrite;
  if (end) bump(qp.comp_.ctr, dctr(e), Ctr::kRdmaRecvs);
  if (end && (k.mask & wire::kImmMask)) return Step::kComplete;
  if (end) s.msn = psn_add(s.msn, 1);
  return Step::kAcknowledge;
}

// RDMA READ: save the request in the responder resources, then send the responses.
Step execute_read(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  const auto reth = k.p.reth();
  RespRes& r = next_res(s);
  r.kind = RespRes::kRead;
  r.first_psn = k.psn;
  r.last_psn = psn_add(k.psn, num_pkts(reth.dma_len(), s.mtu) - 1);
  r.va = reth.va();
  r.rkey = reth.rkey();
  r.length = reth.dma_len();
  r.replay_budget = kReplayFactor * num_pkts(r.length, s.mtu);
  s.msn = psn_add(s.msn, 1);  // C9-148: MSN counts the READ when it starts
  r.msn = s.msn;
  s.epsn = psn_add(r.last_psn, 1);
  bump(qp.comp_.ctr, dctr(e), Ctr::kRdmaRecvs);
  uint32_t fail_psn = 0;
  if (!send_read_responses(e, qp, r.rkey, k.psn, r.va, r.length, r.msn, &fail_psn)) {
    send_nak(e, qp, aeth::kNakRemoteAccessError, fail_psn);
    // The NAK replaced the remaining responses (S19).
    return refuse(k, Step::kErrNakSent, "READ response failed its rkey re-check");
  }
  return Step::kDone;
}

// ATOMIC: execute once, save the original value for replay, answer with it.
Step execute_atomic(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  const auto a = k.p.atomic_eth();
  RemoteTarget t;
  RkeyResult rk = check_remote(dev.keys(), a.rkey(), resp_pd(qp), qp.qpn(), a.va(), 8,
                               kAccessRemoteAtomic, &t, &qp.resp_.rkeys);
  if (rk != RkeyResult::kOk)
    return refuse(k, Step::kErrRkey, "ATOMIC refused by rkey check:", rk);
  uint64_t orig = 0;
  bool ok = wire::rc_equivalent(k.p.opcode) == op::kRcCompareSwap
                ? dev.mem().atomic_cas64(t.host_addr, a.compare(), a.swap_add(), &orig)
                : dev.mem().atomic_faa64(t.host_addr, a.swap_add(), &orig);
  if (!ok) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kMemFault);
    return refuse(k, Step::kErrRkey, "ATOMIC target memory not accessible");
  }
  RespRes& r = next_res(s);
  r.kind = RespRes::kAtomic;
  r.first_psn = r.last_psn = k.psn;
  r.orig = orig;
  r.replay_budget = kReplayFactor;
  s.msn = psn_add(s.msn, 1);
  r.msn = s.msn;
  s.epsn = psn_add(k.psn, 1);
  bump(qp.comp_.ctr, dctr(e), Ctr::kRdmaRecvs);
  send_atomic_ack(e, qp, k.psn, orig, r.msn);
  return Step::kDone;
}

// Saves an ATOMIC_WRITE / FLUSH in the responder resources (duplicates are re-answered from
// it, never re-executed: C9-105 .. C9-112, rxe duplicate_request) and answers it.
void empty_ack_done(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  RespRes& r = next_res(s);
  r.kind = RespRes::kEmptyAck;
  r.first_psn = r.last_psn = k.psn;
  r.replay_budget = kReplayFactor;
  s.msn = psn_add(s.msn, 1);
  r.msn = s.msn;
  s.epsn = psn_add(k.psn, 1);
  bump(qp.comp_.ctr, dctr(e), Ctr::kRdmaRecvs);
  send_empty_read_resp(e, qp, k.psn, r.msn);
}

// ATOMIC_WRITE: one 8-byte store, atomic with respect to CMP_AND_SWP / FETCH_AND_ADD and to
// other ATOMIC_WRITEs on the same address (MemAccess::atomic_write64); the bytes land as sent.
Step execute_atomic_write(Engine& e, Qp& qp, const Pkt& k) {
  Device& dev = e.device();
  const auto reth = k.p.reth();
  RemoteTarget t;
  RkeyResult rk = check_remote(dev.keys(), reth.rkey(), resp_pd(qp), qp.qpn(), reth.va(), 8,
                               kAccessRemoteWrite, &t, &qp.resp_.rkeys);
  if (rk != RkeyResult::kOk)
    return refuse(k, Step::kErrRkey, "ATOMIC_WRITE refused by rkey check:", rk);
  uint64_t value;
  std::memcpy(&value, k.p.payload, 8);
  if (!dev.mem().atomic_write64(t.host_addr, value)) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kMemFault);
    return refuse(k, Step::kErrRkey, "ATOMIC_WRITE target memory not accessible");
  }
  empty_ack_done(e, qp, k);
  return Step::kDone;
}

// FLUSH: every earlier request of this QP has been executed (the responder runs them in PSN
// order and its stores are plain process-memory stores), so global visibility is a full
// fence. PERSISTENT never gets here: no MR can carry FLUSH_PERSISTENT (check_mr_access).
Step execute_flush(Engine& e, Qp& qp, const Pkt& k) {
  Device& dev = e.device();
  uint64_t va = 0, len = 0;
  RkeyResult rk = flush_target(dev, qp, k, &va, &len);
  RemoteTarget t;
  if (rk == RkeyResult::kOk)
    rk = check_remote(dev.keys(), k.p.reth().rkey(), resp_pd(qp), qp.qpn(), va, len,
                      flush_access(k.p.feth().plt()), &t, &qp.resp_.rkeys);
  if (rk != RkeyResult::kOk) return refuse(k, Step::kErrRkey, "FLUSH refused by rkey check:", rk);
  // A full barrier as a seq_cst read-modify-write (a locked instruction on x86), which
  // ThreadSanitizer models; it rejects a bare atomic_thread_fence (-Wtsan).
  static std::atomic<uint32_t> flush_barrier{0};
  flush_barrier.fetch_add(1, std::memory_order_seq_cst);
  empty_ack_done(e, qp, k);
  return Step::kDone;
}

Step execute(Engine& e, Qp& qp, const Pkt& k) {
  if (k.mask & wire::kSendMask) return execute_send(e, qp, k);
  if (k.mask & wire::kWriteMask) return execute_write(e, qp, k);
  if (k.mask & wire::kReadMask) return execute_read(e, qp, k);
  if (k.mask & wire::kAtomicMask) return execute_atomic(e, qp, k);
  if (k.mask & wire::kAtomicWriteMask) return execute_atomic_write(e, qp, k);
  if (k.mask & wire::kFlushMask) return execute_flush(e, qp, k);
  return refuse(k, Step::kErrInvReq, "request opcode the responder does not execute");
}

// SEND_WITH_INV naming a type-2 window bound through another QP (issue 10 item 6). A type 2
// window is associated with the QP it was bound through (IBA 10.6.7.2, bind_mw in
// emu/objects/mw.h records it; check_remote refuses other QPs' accesses), and a remote
// invalidation arriving on any other QP is refused like any failed invalidation (Class J,
// docs/checks.md §2.2 row 11). rxe (rxe_invalidate_mw) checks only the key, the state and
// the type, so on rxe any QP may invalidate it.
bool bound_to_other_qp(Device& dev, const Qp& qp, uint32_t rkey) {
  std::shared_ptr<Mw> mw = dev.keys().find_mw(rkey);
  if (!mw) return false;
  const MwView v = mw->view();
  return v.type == MwType::kType2 && v.state == MwState::kValid && v.qpn != qp.qpn();
}

Step complete(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Cqe c = recv_cqe(qp, WcStatus::kSuccess);
  Step next = Step::kAcknowledge;
  if (k.mask & wire::kWriteMask) {
    // WRITE_WITH_IMM: byte_len is the message length (rxe: resp.length).
    c.opcode = WcOpcode::kRecvRdmaWithImm;
    c.byte_len = s.w_total;
  }
  if (k.mask & wire::kImmMask) {
    c.wc_flags |= kWcWithImm;
    std::memcpy(&c.imm_data, k.p.hdr + k.p.info->offset[wire::kHdrImmDt], 4);
  }
  if (k.mask & wire::kIethMask) {
    // C10-44, docs/checks.md §2.2 row 11: invalidate once the data landed. Failure is Class J.
    const uint32_t rkey = k.p.ieth().inv_rkey();
    if (bound_to_other_qp(e.device(), qp, rkey)) {
      c.status = WcStatus::kRemInvReqErr;
      next = refuse(k, Step::kErrInvalidate,
                    "SEND_WITH_INV names a type-2 window bound to another QP");
    } else if (remote_invalidate(e.device(), resp_pd(qp), rkey)) {
      c.wc_flags |= kWcWithInv;
      c.imm_data = rkey;
    } else {
      c.status = WcStatus::kRemInvReqErr;
      next = refuse(k, Step::kErrInvalidate, "SEND_WITH_INV could not invalidate the rkey");
    }
  }
  if (s.tm.rndv) {
    // The header matched a tag: the data comes by READ (deliver_request starts it).
    RespState::TmRndv& r = s.tm_pend;
    r.valid = true;
    r.recv_wr_id = s.wqe.wr_id;
    r.tag = s.tm.tag;
    r.priv = s.tm.priv;
    r.rva = s.tm.rva;
    r.rkey = s.tm.rkey;
    r.rlen = s.tm.rlen;
    r.length = s.wqe.length;
    r.num_sge = s.wqe.num_sge;
    for (uint32_t i = 0; i < s.wqe.num_sge; ++i) r.sge[i] = s.wqe.sge[i];
  }
  s.have_wqe = false;
  s.msn = psn_add(s.msn, 1);
  const bool se = k.p.bth().se();
  if (Cq* cq = resp_cq(qp); cq != nullptr && !cq->push(c, se))
    return refuse(k, Step::kErrCqOverflow, "receive CQ overflow");
  return next;
}

Step acknowledge(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  s.epsn = psn_add(k.psn, 1);
  if (!is_reliable(qp.type())) return Step::kDone;
  if (s.in_drain) {
    hold_ack(e, qp, k.psn);
  } else if (k.p.bth().ack_req()) {
    defer_ack(e, qp, k.psn);
  } else {
    bump(qp.comp_.ctr, dctr(e), Ctr::kAckDeferred);
  }
  return Step::kDone;
}

// PSN behind ePSN (RC): re-ACK, replay, or drop; never re-execute (C9-105 .. C9-112).
// Returns true when the replay hit a fatal error (a NAK was sent; the QP must go to ERR).
bool duplicate(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  bump(qp.comp_.ctr, dctr(e), Ctr::kDuplicateRequest);
  RNIC_LOG_RL(kWarn,
              "dup: PSN behind the expected %u: re-ACK/replay, not executed, from %s to qpn 0x%x "
              "op %s psn %u (duplicate_request)",
              s.epsn, EndpointText(k.d.src).c_str(), qp.qpn(), opcode_log_name(k.p.opcode), k.psn);
  if (k.mask & (wire::kSendMask | wire::kWriteMask)) {
    if (k.p.bth().ack_req() || (k.mask & wire::kEndMask))
      send_ack(e, qp, aeth::ack(aeth::kCreditInvalid), psn_add(s.epsn, wire::kPsnMask));
    return false;
  }
  for (uint32_t idx = 0; idx < s.res.size(); ++idx) {
    RespRes& r = s.res[idx];
    if (r.kind == RespRes::kFree) continue;
    if (psn_diff(k.psn, r.first_psn) < 0 || psn_diff(k.psn, r.last_psn) > 0) continue;
    if (r.replay_budget == 0 && (k.mask & (wire::kAtomicMask | wire::kReadMask |
                                           wire::kAtomicWriteMask | wire::kFlushMask))) {
      RESP_LOG("drop", "duplicate READ/ATOMIC beyond the resource's replay budget",
               Ctr::kDuplicateRequest, qp, k);
      return false;
    }
    if ((k.mask & wire::kAtomicMask) && r.kind == RespRes::kAtomic && k.psn == r.first_psn) {
      --r.replay_budget;
      send_atomic_ack(e, qp, r.first_psn, r.orig, r.msn);  // never re-executed
      return false;
    }
    if ((k.mask & (wire::kAtomicWriteMask | wire::kFlushMask)) && r.kind == RespRes::kEmptyAck &&
        k.psn == r.first_psn) {
      --r.replay_budget;
      send_empty_read_resp(e, qp, r.first_psn, r.msn);  // never re-executed
      return false;
    }
    if ((k.mask & wire::kReadMask) && r.kind == RespRes::kRead) {
      const auto reth = k.p.reth();
      const uint64_t va = reth.va();
      const uint64_t len = reth.dma_len();
      // The retried READ must be a subset of the original with the same rkey.
      if (reth.rkey() != r.rkey || va < r.va || len > r.length ||
          va - r.va > r.length - len) {
        RESP_LOG("drop", "duplicate READ is not a subset of the original", Ctr::kDuplicateRequest,
                 qp, k);
        return false;
      }
      // Supersedes a replay in progress; the first slice goes now, the rest from the
      // engine's replay rounds.
      ReadReplay& rp = s.replay;
      rp.active = true;
      rp.res = idx;
      rp.psn = k.psn;
      rp.va = va;
      rp.len = static_cast<uint32_t>(len);
      rp.next = 0;
      rp.n = num_pkts(rp.len, s.mtu);
      return replay_slice(e, qp, false) == ReplayResult::kFatal;
    }
  }
  // No matching resource: Class D, silent drop.
  RESP_LOG("drop", "duplicate READ/ATOMIC without a responder resource", Ctr::kDuplicateRequest,
           qp, k);
  return false;
}

// ---- UD ----

RespOutcome ud_recv(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  Device& dev = e.device();
  const auto deth = k.p.deth();
  if (k.plen > s.mtu) {  // longer than the port MTU (IBA C9-20): silently dropped, counted
    bump(qp.comp_.ctr, dctr(e), Ctr::kMtuExceeded);
    bump(qp.comp_.ctr, dctr(e), Ctr::kUdDropped);
    RESP_LOG("drop", "UD message longer than the path MTU", Ctr::kUdDropped, qp, k);
    return RespOutcome::kOk;
  }
  if (!take_wqe(qp)) {
    bump(qp.comp_.ctr, dctr(e), Ctr::kUdDropped);
    RESP_LOG("drop", "UD receive without a receive WQE", Ctr::kUdDropped, qp, k);
    return RespOutcome::kOk;
  }
  // The 40-byte GRH area: the IP header of the datagram as it arrived (wire/packet.h).
  std::array<uint8_t, 40> grh{};
  wire::IpUdpMeta im = wire::meta_between(k.d.src, k.d.dst);
  im.tos = k.d.tos;
  if (im.ipv6) {  // the IPv6 header is the GRH (IBA A17.4.5.1): hop limit and flow label too
    im.ttl = k.d.hop_limit;
    im.flow_label = k.d.flow_label;
  }
  (void)wire::write_grh_image(grh, im, k.p.roce_len);
  RNIC_TRACE("resp: qpn 0x%x UD %s psn %u len %u from %s", qp.qpn(), opcode_log_name(k.p.opcode),
             k.psn, k.plen, EndpointText(k.d.src).c_str());
  Cqe c = recv_cqe(qp, WcStatus::kSuccess);
  c.src_qp = deth.src_qp();
  c.wc_flags = kWcGrh;
  c.sl = k.d.src.ipv6 ? kRoceL3Ipv6 : kRoceL3Ipv4;
  c.byte_len = 40 + k.plen;
  if (40 + uint64_t{k.plen} > s.wqe.length) {
    c.status = WcStatus::kLocLenErr;
  } else {
    WcStatus st = scatter_sges(dev, resp_pd(qp), s.wqe.sge, s.wqe.num_sge, 0, grh.data(), 40,
                               &qp.comp_.ctr, &dctr(e));
    if (st == WcStatus::kSuccess && k.plen > 0)
      st = scatter_sges(dev, resp_pd(qp), s.wqe.sge, s.wqe.num_sge, 40, k.p.payload, k.plen,
                        &qp.comp_.ctr, &dctr(e));
    if (st != WcStatus::kSuccess) c.status = st;
  }
  if (k.mask & wire::kImmMask) {
    c.wc_flags |= kWcWithImm;
    std::memcpy(&c.imm_data, k.p.hdr + k.p.info->offset[wire::kHdrImmDt], 4);
  }
  s.have_wqe = false;
  if (qp.recv_cq() && !qp.recv_cq()->push(c, k.p.bth().se())) return RespOutcome::kFatal;
  return RespOutcome::kOk;
}

}  // namespace

bool resp_flush_ack(Engine& e, Qp& qp, uint64_t now_ns) {
  RespState& s = qp.resp_;
  s.ack_listed = false;
  if (qp.comp_.dead || !s.ready) {
    s.ack_pending = false;
    return false;
  }
  const bool passed = s.ack_passed;
  s.ack_passed = false;
  if (!s.ack_pending) return false;
  if (now_ns != 0 && s.ack_hold && !passed) return true;  // for the next post (Engine::take_ack)
  emit_pending_ack(e, qp);
  s.ack_sent_ns = now_ns;
  return false;
}

void resp_release_ack(Engine& e, Qp& qp) {
  RespState& s = qp.resp_;
  s.ack_held = false;
  s.ack_hold_until_ns = 0;
  if (!s.ack_pending) return;  // a post took it
  s.ack_hold = false;          // no post came in time: the next ACKs go at once
  s.ack_sent_ns = 0;
  bump(qp.comp_.ctr, dctr(e), Ctr::kAckHoldExpired);
  if (qp.comp_.dead || !s.ready) {
    s.ack_pending = false;
    return;
  }
  emit_pending_ack(e, qp);
}

bool resp_send_owed_ack(Engine& e, Qp& qp) {
  RespState& s = qp.resp_;
  if (!s.ack_pending || !s.ready || qp.comp_.dead) return false;
  s.ack_hold = true;  // a request follows the ACK at once: the application answers
  emit_pending_ack(e, qp);
  return true;
}

bool resp_take_ack(Engine& e, Qp& qp, TxBatch& tx, uint64_t now_ns, uint64_t hold_ns,
                   bool* answering) {
  RespState& s = qp.resp_;
  // This run answers a message of the peer: an ACK is owed for it, or went a moment ago.
  // Signed: the caller's clock reading may predate an ACK sent while it waited for the lock.
  const bool answers =
      s.ack_pending || (s.ack_sent_ns != 0 && static_cast<int64_t>(now_ns - s.ack_sent_ns) <
                                                  static_cast<int64_t>(hold_ns));
  if (answering != nullptr) *answering = answers && s.ready && !qp.comp_.dead;
  if (!s.ready || qp.comp_.dead) return false;
  // Only a held ACK: its batch has ended and sent everything built before it. One still
  // listed belongs to a batch in progress, whose responses for this QP (queued in the
  // receive context's batch) must not be overtaken; it goes when that batch ends.
  if (!s.ack_pending || !s.ack_held || s.ack_listed) {
    // An ACK owed, or one that went alone a moment ago: the application answers; hold the
    // next one.
    if (answers) s.ack_hold = true;
    if (s.ack_pending && s.ack_listed) s.ack_passed = true;  // not this one (resp_flush_ack)
    return false;
  }
  emit_pending_ack(e, qp, tx);  // ack_held stays: the held list finds nothing owed
  s.ack_hold_until_ns = 0;      // the next ACK held gets a whole hold of its own
  return true;
}

ReplayResult resp_replay_slice(Engine& e, Qp& qp) { return replay_slice(e, qp, true); }

void resp_flush_held(Qp& qp) {
  RespState& s = qp.resp_;
  if (s.have_wqe) complete_held_error(qp, WcStatus::kWrFlushErr);
  s.have_wqe = false;
  s.cur = RespState::kNone;
}

// Terminal state kRnr: RC answers with an RNR NAK; UC drops the message (no receive WQE).
RespOutcome on_rnr(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  if (qp.type() == QpType::kUc) {
    s.uc_drop = true;
    uc_abort(qp);
    bump(qp.comp_.ctr, dctr(e), Ctr::kUcDropped);
    RESP_LOG("drop", "UC message without a receive WQE", Ctr::kUcDropped, qp, k);
    return RespOutcome::kOk;
  }
  bump(qp.comp_.ctr, dctr(e), Ctr::kSendRnrErr);
  RESP_LOG("nak", "RNR: no receive WQE", Ctr::kSendRnrErr, qp, k);
  send_ack(e, qp, aeth::rnr_nak(qp.attr().min_rnr_timer), k.psn);
  // The rest of the message is already on its way; the RNR NAK stands for the gap it
  // leaves, so no PSN-sequence NAK follows it (the requester resends from this PSN).
  s.nak_sent = s.rnr_gap = true;
  return RespOutcome::kOk;
}

// Terminal error states (kErr*): UC drops the message and stays in RTS (Class D/E); RC
// completes the held receive WQE with the error where one is held, sends the NAK the class
// calls for (docs/checks.md §2.2) and reports the QP fatal.
RespOutcome on_error(Engine& e, Qp& qp, const Pkt& k, Step st) {
  RespState& s = qp.resp_;
  const wire::PacketView& p = k.p;
  const wire::RxDesc& d = k.d;
  const bool uc = qp.type() == QpType::kUc;
  const char* why = k.why ? k.why : step_name(st);
  const bool has_rk = k.rk != RkeyResult::kOk;
  const char* rk = rkey_result_name(k.rk);
  if (uc) {
    // UC errors are Class D/E: drop the message, QP stays RTS (docs/checks.md §2.2 row 6').
    if (st == Step::kErrLength || st == Step::kErrRecvProt) s.recv_offset = 0;
    s.uc_drop = !(k.mask & wire::kEndMask);
    uc_abort(qp);
    bump(qp.comp_.ctr, dctr(e), Ctr::kUcDropped);
    if (has_rk) {
      RESP_LOG_D("drop", why, rk, Ctr::kUcDropped, qp, k);
    } else {
      RESP_LOG("drop", why, Ctr::kUcDropped, qp, k);
    }
    return RespOutcome::kOk;
  }
  const bool rxe = e.device().config().errors == ErrorsMode::kRxe;
  if (st == Step::kErrLength) {
    complete_held_error(qp, rxe ? WcStatus::kRemInvReqErr : WcStatus::kLocLenErr);
    send_nak(e, qp, aeth::kNakInvalidRequest, k.psn);
    RESP_LOG("nak", why, Ctr::kNakSent, qp, k);
  } else if (st == Step::kErrRecvProt) {
    complete_held_error(qp, rxe ? WcStatus::kLocQpOpErr : WcStatus::kLocProtErr);
    send_nak(e, qp, aeth::kNakRemoteOperationalError, k.psn);
    RESP_LOG("nak", why, Ctr::kNakSent, qp, k);
  } else if (st == Step::kErrInvReq) {
    send_nak(e, qp, aeth::kNakInvalidRequest, k.psn);
    RESP_LOG("nak", why, Ctr::kNakSent, qp, k);
  } else if (st == Step::kErrRkey) {
    send_nak(e, qp, aeth::kNakRemoteAccessError, k.psn);
    if (has_rk) {
      RESP_LOG_D("nak", why, rk, Ctr::kRemAccessNakSent, qp, k);
    } else {
      RESP_LOG("nak", why, Ctr::kRemAccessNakSent, qp, k);
    }
  } else if (st == Step::kErrNakSent) {
    RESP_LOG("nak", why, Ctr::kRemAccessNakSent, qp, k);
  } else if (st == Step::kErrInvalidate) {
    // rxe: no NAK for Class J; the ACK goes out normally, the receive WC reports it.
    acknowledge(e, qp, k);
    RNIC_PKT_LOG_NC("refuse", why, d.src, qp.qpn(), p.opcode, k.psn);
  } else if (st == Step::kErrCqOverflow) {
    RNIC_PKT_LOG_NC("drop", why, d.src, qp.qpn(), p.opcode, k.psn);
  }
  return RespOutcome::kFatal;
}

namespace {
RespOutcome run_steps(Engine& e, Qp& qp, const Pkt& k);
RespOutcome drain_stash(Engine& e, Qp& qp, uint32_t fresh_psn);
}  // namespace

void resp_stash_clear(Engine& e, Qp& qp) {
  RespState& s = qp.resp_;
  for (uint32_t i = 0; s.stash_n > 0 && i < s.stash.size(); ++i) stash_release(e, s, i);
  s.stash_n = 0;
  s.in_drain = false;
}

RespOutcome resp_on_packet(Engine& e, Qp& qp, const wire::PacketView& p, const wire::RxDesc& d) {
  RespState& s = qp.resp_;
  Pkt k{p, d, p.info->mask, p.bth().psn(), static_cast<uint32_t>(p.payload_len)};
  if (!s.ready) {
    RNIC_PKT_LOG_NC("drop", "responder not ready (QP never reached RTR)", d.src, qp.qpn(),
                    p.opcode, k.psn);
    return RespOutcome::kOk;
  }
  if ((d.tos & 3u) == 3u || e.rx_marking()) note_ce(e, qp);
  if (qp.type() == QpType::kUd) return ud_recv(e, qp, k);
  if (s.replay.active &&
      !((k.mask & wire::kReadMask) && psn_diff(k.psn, s.epsn) < 0) &&
      finish_replay(e, qp) == ReplayResult::kFatal)
    return RespOutcome::kFatal;

  RespOutcome out = run_steps(e, qp, k);
  if (out == RespOutcome::kAccepted && s.stash_n > 0) return drain_stash(e, qp, k.psn);
  return out;
}

namespace {

// Executes the stashed requests that now follow in order, each through the same steps as a
// fresh packet, then acknowledges the last one completed, or NAKs the next gap when more are
// stashed behind it. Anything but a success (RNR, an error NAK) empties the stash: the
// requester's go-back resends the rest.
RespOutcome drain_stash(Engine& e, Qp& qp, uint32_t fresh_psn) {
  RespState& s = qp.resp_;
  stash_release(e, s, fresh_psn & kStashMask);  // the stashed copy of a resent fresh packet
  bool any = false;
  while (s.stash_n > 0) {
    const uint32_t idx = s.epsn & kStashMask;
    if (s.stash[idx] < 0) break;
    StashSlot& ss = e.stash_pool().at(s.stash[idx]);
    if (ss.psn != s.epsn) {
      stash_release(e, s, idx);  // stale: behind epsn
      continue;
    }
    wire::PacketView p;
    if (wire::parse_roce(std::span<const uint8_t>(ss.bytes, ss.len), &p,
                         e.one_copy() != nullptr) != wire::ParseError::kOk ||
        (p.bth().tver() == wire::kTverOneCopy && !resolve_one_copy(e, ss.d, &p))) {
      stash_release(e, s, idx);
      break;
    }
    Pkt k{p, ss.d, p.info->mask, ss.psn, static_cast<uint32_t>(p.payload_len)};
    s.in_drain = true;
    const RespOutcome out = run_steps(e, qp, k);
    s.in_drain = false;
    stash_release(e, s, idx);
    bump(qp.comp_.ctr, dctr(e), Ctr::kStashReplayed);
    if (out != RespOutcome::kAccepted) {
      resp_stash_clear(e, qp);
      return out;
    }
    any = true;
  }
  if (any && s.stash_n > 0) {
    // A later gap: its NAK implicitly acknowledges everything before it.
    s.ack_pending = false;
    s.nak_sent = true;
    send_nak(e, qp, aeth::kNakPsnSeqError, s.epsn);
  }
  return RespOutcome::kAccepted;
}

RespOutcome run_steps(Engine& e, Qp& qp, const Pkt& k) {
  RespState& s = qp.resp_;
  const wire::PacketView& p = k.p;
  const bool uc = qp.type() == QpType::kUc;
  Step st = Step::kCheckPsn;
  for (;;) {
    RNIC_TRACE("resp: qpn 0x%x %s psn %u epsn %u step %s", qp.qpn(), opcode_log_name(p.opcode),
               k.psn, s.epsn, step_name(st));
    switch (st) {
      case Step::kCheckPsn: st = check_psn(e, qp, k); break;
      case Step::kCheckOpSeq:
        st = check_xrc(e, qp, k);
        if (st == Step::kCheckOpSeq) st = check_op_seq(qp, k);
        break;
      case Step::kCheckOpValid: st = check_op_valid(qp, k); break;
      case Step::kCheckResource: st = check_resource(e, qp, k); break;
      case Step::kCheckLength: st = check_length(e, qp, k); break;
      case Step::kCheckRkey: st = check_rkey(e, qp, k); break;
      case Step::kExecute: st = execute(e, qp, k); break;
      case Step::kComplete: st = complete(e, qp, k); break;
      case Step::kAcknowledge: st = acknowledge(e, qp, k); break;
      case Step::kDone:  // reached only through kExecute
        return RespOutcome::kAccepted;
      case Step::kDrop:
        // RC: only check_psn drops (PSN ahead), and it logged the line.
        if (uc) {
          bump(qp.comp_.ctr, dctr(e), Ctr::kUcDropped);
          RESP_LOG("drop", k.why ? k.why : "UC packet dropped", Ctr::kUcDropped, qp, k);
        }
        return RespOutcome::kOk;
      case Step::kDuplicate:
        return duplicate(e, qp, k) ? RespOutcome::kFatal : RespOutcome::kOk;
      case Step::kRnr:
        return on_rnr(e, qp, k);
      case Step::kErrInvReq:
      case Step::kErrLength:
      case Step::kErrRkey:
      case Step::kErrRecvProt:
      case Step::kErrCqOverflow:
      case Step::kErrInvalidate:
      case Step::kErrNakSent:
        return on_error(e, qp, k, st);
    }
  }
}

}  // namespace

}  // namespace rnic::emu
