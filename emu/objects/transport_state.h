// emu/objects/transport_state.h: per-QP state of the transports (requester, responder, completer),
// embedded in Qp as req_/resp_/comp_. Owned by the transports (emu/req, comp, resp, recv,
// engine); emu's object model only constructs them (value-initialised) and never reads them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "emu/objects/counters.h"
#include "emu/objects/param.h"
#include "emu/objects/wqe.h"
#include "wire/icrc.h"
#include "wire/port.h"

namespace rnic::emu {

class Mr;
class Srq;
class OneCopyLink;

// Requester state (req.cc). Guarded by the QP send lock.
//
// The send queue (Qp::sq(), index 0 = oldest) is walked by `pos`: WQEs before pos have had
// all their packets emitted (or were local ops executed inline); the completer pops WQEs from
// the head in order and decrements pos. Per-WQE progress lives in SendWqe itself (state,
// first_psn/last_psn, offset, sge cursor).
// The MR a key last resolved to, remembered by the code that resolves it again and again
// (a QP's requester for its lkeys, its responder for rkeys), so that a stream of one key does
// not take the key table's lock for every WQE or request (KeyTable::find_mr: a shared lock,
// 7% of a 64 B ping-pong's engine work in path_bench). A remembered MR is used only when its
// own view, read inside its gate, names it valid under that same key: a deregistered MR is
// invalid, a rekeyed one carries its new key, and a live key names one object, so no freed or
// reissued key resolves through it; anything else is looked up in the table again, so every
// answer is the table's. It keeps a deregistered Mr object (not its pages: the pin is released
// at dereg) alive until its next miss or its owner's end. Not thread-safe: the owner's lock
// (the QP's send or receive lock) guards it.
struct MrCache {
  uint32_t key = 0;
  std::shared_ptr<Mr> mr;
  void clear() {
    key = 0;
    mr.reset();
  }
};

struct ReqState {
  bool ready = false;            // set up by the RTS transition (else the requester idles)
  // The share of the window towards dst this QP may fill (EngineConfig::window_share; the
  // whole of req.h's kMaxUnackedPsns until its window first fills), and the epoch it was last
  // counted in (Engine::window_share).
  static constexpr uint32_t kFullShare = 512;  // req.h kMaxUnackedPsns (engine.cc asserts)
  uint32_t win_share = kFullShare;
  uint64_t share_epoch = UINT64_MAX;  // never
  uint32_t psn = 0;              // next PSN to assign (24 bits); rewound by go-back-N
  uint32_t max_psn = 0;          // one past the highest PSN ever sent (never rewound)
  uint32_t pos = 0;              // SQ index (from head) of the WQE being worked on
  uint32_t pkts_since_ackreq = 0;
  uint32_t rd_atomic_inflight = 0;  // READ/ATOMIC WQEs issued and not completed
  uint32_t max_rd_atomic = 1;    // initiator depth (attr max_rd_atomic, at least 1)
  uint32_t mtu = 256;            // path MTU bytes (RC/UC: attr; UD: port active MTU)
  bool rnr_wait = false;         // blocked until the RNR timer fires (completer)
  // The last requester run answered a message of the peer (an ACK was owed for it, or went
  // less than ack_hold_ns before): a ping-pong, whose peer answers right behind its ACK
  // (Engine::linger_rx). Set by each run (Engine::take_ack). Send lock.
  bool answers = false;
  wire::Endpoint dst;            // RC/UC peer (from the QP's AV)
  wire::IpUdpMeta meta;          // ICRC metadata towards dst (RC/UC)
  // One copy towards dst (emu/transport/one_copy.h): 0 not looked up yet, 1 linked, 2 none.
  uint8_t oc_state = 0;
  OneCopyLink* oc_link = nullptr;  // owned by the engine's OneCopy
  uint32_t oc_shared = 0;          // the memfd id last shared on it (skips the link's lock)
  uint64_t oc_retry_ns = 0;        // oc_state 2: look for a link again from then
  MrCache lkeys;  // the MR of the last lkey the requester checked (send lock)
};

// One responder resource (IBA 9.7.5.1.4 / rxe resp_res): a READ or ATOMIC the responder
// executed, kept so that a duplicate request can be answered without re-executing it.
struct RespRes {
  // kEmptyAck: an ATOMIC_WRITE or FLUSH, answered (and replayed) by a zero-length READ
  // RESPONSE ONLY, never re-executed.
  enum Kind : uint8_t { kFree = 0, kRead = 1, kAtomic = 2, kEmptyAck = 3 } kind = kFree;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint64_t va = 0;        // READ: original VA
  uint32_t rkey = 0;
  uint32_t length = 0;    // READ: original DMA length
  uint64_t orig = 0;      // ATOMIC: value returned (replayed, never re-executed)
  uint32_t msn = 0;       // MSN carried by the original answer
  // Packets duplicates of this request may still cause (resp.cc kReplayFactor x the
  // original's packets): a flood of duplicates is bounded, never amplified without limit.
  uint32_t replay_budget = 0;
};

// A duplicate READ being answered in slices (resp.cc): responses for [va, va+len) at PSNs
// psn, psn+1, ...; `next` of `n` packets sent so far.
struct ReadReplay {
  bool active = false;
  bool listed = false;     // QP is in the engine's replay list
  uint32_t res = 0;        // index of the responder resource
  uint32_t psn = 0;
  uint64_t va = 0;
  uint32_t len = 0;
  uint32_t next = 0;
  uint32_t n = 0;
};

// Responder state (resp.cc). Guarded by the QP receive lock.
struct RespState {
  bool ready = false;            // set up by the RTR transition
  uint32_t epsn = 0;             // expected PSN (RC/UC)
  uint32_t msn = 0;              // message sequence number (24 bits)
  bool nak_sent = false;         // sent_psn_nak latch: one PSN-sequence NAK per gap
  bool rnr_gap = false;          // the latch was set by an RNR NAK: nothing is stashed
  // 0x10000 | the UDP source port of the last request taken in order: only packets from that
  // port are stashed, so a forger must guess the port as well as a PSN (docs/congestion.md §2)
  uint32_t inorder_sport = 0;
  uint64_t cnp_last_ns = 0;      // when this QP last sent a CNP (resp.cc note_ce)
  // ACK coalescing within one receive batch: the latest ACK owed, sent when the batch ends
  // (or before any other packet this QP sends), so a burst of AckReq requests costs one ACK.
  bool ack_pending = false;
  bool ack_listed = false;       // QP is in the engine's pending-ACK list
  uint8_t ack_reqs = 0;          // AckReqs coalesced into the pending ACK beyond the first
  uint32_t ack_psn = 0;
  uint32_t ack_msn = 0;
  // ACKs that ride posts (EngineConfig::ack_hold_ns): the application has been answering
  // this QP's requests with posts of its own, so the owed ACK waits at the batch's end for
  // the next post to carry it (Engine::take_ack), at most ack_hold_ns (then it goes alone and
  // this is cleared). Set by a post that finds an ACK owed, or one sent less than
  // ack_hold_ns before it (ack_sent_ns).
  bool ack_hold = false;
  bool ack_held = false;         // QP is in the engine's held-ACK list
  // A post went while the owed ACK was still listed in another thread's receive batch
  // (resp_take_ack): it cannot ride that post, and held it would wait for the next one, a
  // whole message later; so that batch sends it at once (resp_flush_ack).
  bool ack_passed = false;
  uint64_t ack_hold_until_ns = 0;  // the held ACK goes alone then (0: none held)
  uint64_t ack_sent_ns = 0;      // when the receive context last sent an owed ACK (hold on)
  bool uc_drop = false;          // UC: dropping until the next FIRST/ONLY
  uint32_t mtu = 256;
  // Message in progress (a SEND or WRITE that has seen FIRST but not LAST).
  enum Cur : uint8_t { kNone = 0, kSend = 1, kWrite = 2 } cur = kNone;
  // Receive WQE consumed by the current SEND (or WRITE_WITH_IMM at its last packet). It is
  // taken off the RQ/SRQ at the start of the message and copied here with its SGEs.
  bool have_wqe = false;
  RecvWqe wqe;
  Sge sges[kMaxSge];
  uint64_t recv_offset = 0;      // bytes scattered into wqe so far
  // Tag matching (a SEND on an RC QP of a TM SRQ, resp.cc tm_take): how the held WQE was
  // chosen and how its message completes.
  struct Tm {
    bool active = false;         // the TMH decided: opcode/flags/tag below apply
    uint8_t skip = 0;            // TMH bytes at the message start not placed (matched EAGER)
    bool rndv = false;           // matched RNDV: nothing placed; the data is fetched by READ
    WcOpcode opcode = WcOpcode::kRecv;
    uint32_t flags = 0;          // kWcTm* bits
    uint64_t tag = 0;
    uint32_t priv = 0;           // TMH app_ctx
    uint64_t rva = 0;            // RNDV: the sender's buffer (RVH)
    uint32_t rkey = 0;
    uint32_t rlen = 0;
  } tm;
  // A matched RNDV whose header completed: the READ + FIN the device owes, handed out of the
  // receive lock by deliver_request (recv.cc) to Qp::tm_rndv_start_locked (send lock).
  struct TmRndv {
    bool valid = false;
    uint64_t recv_wr_id = 0;
    uint64_t tag = 0;
    uint32_t priv = 0;
    uint64_t rva = 0;
    uint32_t rkey = 0;
    uint32_t rlen = 0;
    uint64_t length = 0;  // the tag buffer's capacity
    uint32_t num_sge = 0;
    Sge sge[kMaxSge];
  } tm_pend;
  // WRITE in progress: rkey, next VA, bytes remaining (validated for the whole message at
  // FIRST, re-validated for each packet).
  uint32_t w_rkey = 0;
  uint64_t w_va = 0;
  uint32_t w_resid = 0;
  uint32_t w_total = 0;          // DMA length of the WRITE (WRITE_WITH_IMM byte_len)
  MrCache rkeys;  // the MR of the last rkey the responder checked (receive lock)
  // Responder resources: ring of max_dest_rd_atomic slots.
  std::vector<RespRes> res;
  uint32_t res_next = 0;
  ReadReplay replay;
  uint32_t max_dest_rd_atomic = 0;
  // XRC target: the SRQ the current (or last) message's XRCETH named, of the QP's own XRC
  // domain (resp.cc check_xrc). Its PD checks memory, its WQEs and CQ take the receives.
  std::shared_ptr<Srq> xrc_srq;
  wire::Endpoint dst;            // RC: where ACKs and responses go (the QP's AV)
  wire::IpUdpMeta meta;
  // Out-of-sequence stash (resp.cc, emu/transport/stash.h): slot index per PSN &
  // (kStashPerQp - 1), -1 = empty; allocated on the first stashed packet.
  std::vector<int32_t> stash;
  uint32_t stash_n = 0;          // entries held
  bool in_drain = false;         // executing stashed packets: ACKs are held to the end
};

// Loss recovery and the sending window of an RC requester (comp.cc, docs/congestion.md).
// Guarded by the QP send lock. cwnd is 0 until the RTS transition sets it.
struct SendWindow {
  uint32_t cwnd = 0;             // PSNs the requester may run ahead of comp psn (1..max)
  uint32_t max = 0;              // upper bound (req.h kMaxUnackedPsns)
  uint32_t ssthresh = 0;         // below it: slow start (+1 per acknowledged PSN)
  uint32_t target = 0;           // the window before the last cut (regrowth aims at it)
  uint32_t ai_acked = 0;         // PSNs acknowledged towards the next increase step
  uint8_t fr_rounds = 0;         // increase steps since the last cut (fast recovery first)
  uint32_t recover_psn = 0;      // one multiplicative decrease per window: the next cut waits
  bool recovering = false;       // until comp psn has passed the max_psn of the last cut
  bool lossy = false;            // a loss was seen (cut or not, at the floor) and comp psn has
  uint32_t loss_psn = 0;         // ... not yet passed the max_psn of then
  bool probe_out = false;        // a probe of probe_psn went out in a loss episode, unanswered
  uint32_t probe_psn = 0;
  uint8_t backoff = 0;           // IBA timer = timeout_ns << backoff (bounded; reset on progress)
  uint8_t probe_backoff = 0;     // probe timer = pto << probe_backoff (idem)
  uint64_t iba_deadline_ns = 0;  // the IBA local ACK timer (spends retry_cnt); 0 = disarmed
  uint64_t probe_deadline_ns = 0;  // the RTT-based probe timer (spends nothing); 0 = disarmed
  // RTT estimate (RFC 6298 shape): one timed PSN at a time, none across a retransmission
  // (Karn). srtt 0 = no sample yet.
  bool rtt_pending = false;
  uint32_t rtt_psn = 0;
  uint64_t rtt_t0_ns = 0;
  uint64_t srtt_ns = 0;
  uint64_t rttvar_ns = 0;
  // Selective resend (comp.cc nak): after a PSN-sequence NAK for sel_psn only that packet
  // went again; the answer that passes it decides: short of sel_end (max_psn then) the
  // responder lacks the next PSN too (it does not stash, or that one was lost): go back N.
  bool sel_out = false;
  uint32_t sel_psn = 0;
  uint32_t sel_end = 0;
  // Selective resends in a row whose answer showed an in-order responder (ConnectX, rxe, a
  // softrnic with SOFTRNIC_RC_STASH=0): at kInorderVotes the QP stops trying and goes back N
  // at once on a NAK, as before the stash, so such a peer pays two round trips in all, not
  // one per loss. Back to 0 when an answer shows a stash. (Two, not one: with a stashing
  // peer a loss of the PSN after the resent one also looks in-order, with chance p.)
  uint8_t inorder_votes = 0;
  static constexpr uint8_t kInorderVotes = 2;
  // Once learned, every kInorderRetry-th NAK tries a selective resend again: a stashing peer
  // also answers in order when the PSN after the resent one was lost too (at 5% loss two such
  // answers in a row come within a few hundred losses), and the QP must not stay in go-back
  // for its life because of that. Against a real in-order peer this costs one round trip per
  // kInorderRetry losses.
  uint8_t inorder_naks = 0;
  static constexpr uint8_t kInorderRetry = 8;
};

// Completer state (comp.cc), timers and the per-QP counters. Guarded by the QP send lock,
// except `ctr` (atomic, any thread).
struct CompState {
  uint32_t psn = 0;              // oldest PSN not yet acknowledged
  uint8_t retry_cnt = 7;         // attr values (rnr_retry 7 = infinite; retry_cnt 7: comp.cc)
  uint8_t rnr_retry = 7;
  uint8_t retry_left = 7;        // counts down; reset on forward progress
  uint8_t rnr_left = 7;
  uint64_t timeout_ns = 0;       // 4.096 us * 2^timeout; 0 = no retransmit timer
  uint64_t retrans_deadline_ns = 0;  // min(win.iba_deadline_ns, win.probe_deadline_ns); 0 = off
  SendWindow win;                // loss recovery and the adaptive window
  uint64_t rnr_deadline_ns = 0;      // 0 = not waiting
  // A WQE the peer's application may answer (SEND, WRITE, ATOMIC_WRITE, FLUSH: not a READ or
  // a CMP_SWAP / FETCH_ADD, which it never sees) started since the send queue last drained:
  // only then does the drain hand receive back (recv.cc, Engine::sq_drained).
  bool answerable = false;
  bool retry_latched = false;    // a go-back-N for lost read responses is in progress,
  uint32_t retry_latch_psn = 0;  // ... resending up to here: the latch holds until comp psn
                                 // passes it (comp.cc latch_retry)
  bool sqd_notified = true;      // SQD: SQ_DRAINED already reported (or not in SQD)
  bool kick = false;             // run the requester from the progress thread (SQD -> RTS)
  // Earliest entry of this QP in the engine's timer heap (0: none). Written under the
  // engine's timer lock; read without it by arm_timer (engine.cc says why that is safe).
  std::atomic<uint64_t> timer_queued_ns{0};
  bool timer_due = false;        // run_timers: already collected this tick (timer lock)
  bool dead = false;             // on_destroy ran: touch nothing
  // Strict source check (recv.cc): 0 = no UDP source port latched yet, else 0x10000 | port.
  // Any thread (atomic); cleared when the QP goes back to RESET.
  std::atomic<uint32_t> src_latch{0};
  Counters ctr;                  // per-QP counters (rxe names, see counters.h)
};

}  // namespace rnic::emu
