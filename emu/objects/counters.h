// emu/objects/counters.h: transport counters kept per device and per QP, named like rxe's hardware
// counters (rxe_hw_counters.c) plus softrnic's own (icrc_err, drop reasons, NAKs by kind).
// Every counter is a relaxed atomic: bump from any thread, read a (possibly torn) snapshot.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rnic::emu {

// One index per counter. The names (counter_name()) are what the CLI and tests print.
enum class Ctr : uint8_t {
  kSentPkts,            // sent_pkts: RoCE packets handed to the port
  kRcvdPkts,            // rcvd_pkts: packets that passed ingress checks
  kDuplicateRequest,    // duplicate_request: responder saw a PSN behind ePSN
  kOutOfSeqRequest,     // out_of_seq_request: responder saw a PSN ahead of ePSN (once per pkt)
  kRcvdRnrErr,          // rcvd_rnr_err: requester received an RNR NAK
  kSendRnrErr,          // send_rnr_err: responder sent an RNR NAK
  kRcvdSeqErr,          // rcvd_seq_err: requester received a PSN-sequence NAK
  kAckDeferred,         // ack_deferred: ACK coalesced (request without AckReq, no ACK sent)
  kRetryExceededErr,    // retry_exceeded_err: retry_cnt exhausted -> RETRY_EXC_ERR
  kRnrNakRetryErr,      // rnr_nak_retry_err: rnr_retry exhausted -> RNR_RETRY_EXC_ERR
  kCompleterRetryErr,   // completer_retry_err: go-back-N retries started by the completer
  kSendErr,             // send_err: the port refused a packet
  kLinkDowned,          // link_downed (always 0 here; kept for name parity)
  kRdmaSends,           // rdma_sends: RDMA WRITE/READ/atomic request messages started
  kRdmaRecvs,           // rdma_recvs: RDMA WRITE/READ/atomic request messages executed
  kLocalAckTimeoutErr,  // local_ack_timeout_err: retransmit timer expiries
  kIcrcErr,             // icrc_err (ours): ICRC mismatch, dropped before any state change
  kDropUnknownQpn,      // drop_unknown_qpn (ours)
  kDropBadState,        // drop_bad_state (ours): QP type/state refuses the packet
  kDropAddr,            // drop_addr_mismatch (ours): RC/UC source/destination IP check
  kDropMalformed,       // drop_malformed (ours): parse error other than ICRC
  kBadPkeyCntr,         // bad_pkey_cntr
  kQkeyViolCntr,        // qkey_viol_cntr
  kNakSent,             // naks_sent (ours): NAKs other than RNR
  kNakRcvd,             // naks_rcvd (ours): NAKs other than RNR / PSN sequence
  kRemAccessNakSent,    // rem_access_nak_sent (ours)
  kRemAccessNakRcvd,    // rem_access_nak_rcvd (ours)
  kRetransPkts,         // retrans_pkts (ours): request packets sent again (go-back-N after a
                        // NAK or lost response, and timeout retransmits); counted by req
  kUcDropped,           // uc_dropped (ours): UC packets dropped (gap, bad rkey, no WQE)
  kUdDropped,           // ud_dropped (ours): UD packets dropped (no WQE, too long)
  kDropSrcPort,         // drop_src_port (ours): strict source check refused the UDP port
  kMemFault,            // mem_fault (ours): an access to registered memory faulted (MemAccess
                        // returned false: unmapped / PROT_NONE / read-only page)
  // How each accepted packet's ICRC verified (wire::icrc_verify_rx, docs/wire.md §3):
  kIcrcIdZero,          // icrc_id_zero (ours): with IPv4 ID 0 (or IPv6: no ID)
  kIcrcIdGro,           // icrc_id_gro (ours): with the GRO segment's ID (base + k)
  kIcrcIdSolved,        // icrc_id_solved (ours): with the one ID solved for (peer-chosen IDs)
  kCnpRcvd,             // cnp_rcvd (ours): RoCEv2 CNPs (opcode 0x81) received (cut the QP's window)
  kEcnCeRcvd,           // ecn_ce_rcvd (ours): packets that arrived with ECN CE (IP TOS & 3 == 3)
  // Loss recovery and the sending window (docs/congestion.md):
  kRetransBytes,        // retrans_bytes (ours): RoCE bytes (headers + payload + ICRC) of
                        // retrans_pkts
  kWindowCuts,          // window_cuts (ours): multiplicative decreases of the sending window
                        // (PSN-sequence NAK, lost response, timeout, probe, CNP)
  kRetransProbes,       // retrans_probes (ours): RTT-based probe timer expiries (the oldest
                        // unacknowledged packet resent; no retry_cnt spent)
  kMtuExceeded,         // mtu_exceeded (ours): a packet longer than the receiving QP's path MTU
                        // (RC: Invalid Request NAK; UC: dropped; UD: above the port MTU, dropped)
  kTmBadHeader,         // tm_bad_header (ours): a SEND to a TM SRQ without a valid TMH/RVH
                        // (shorter than it, unknown opcode, RNDV too long): Invalid Request NAK
  // The responder's out-of-sequence stash (docs/congestion.md §2):
  kStashStored,         // stash_stored (ours): RC requests after a gap kept for in-order replay
  kStashReplayed,       // stash_replayed (ours): stashed requests executed once the gap filled
  kStashFull,           // stash_full (ours): requests after a gap dropped, no stash room
  kCnpSent,             // cnp_sent (ours): CNPs sent for CE-marked requests (docs/congestion.md §3)
  kSpinSkipped,         // spin_skipped (ours): the progress thread slept instead of spinning
                        // (SOFTRNIC_SPIN_US) because runnable threads filled the CPUs; counted
                        // once per check, at most every 10 ms (docs/progress.md)
  kTxDeferred,          // tx_deferred (ours): posts whose WQEs were left for the requester run
                        // of the next ACK (doorbell batching, SOFTRNIC_TX_DEFER)
  kAckOnPost,           // ack_on_post (ours): owed ACKs sent by a requester run of the QP
                        // (a post's, mostly), in its batch (SOFTRNIC_ACK_HOLD_US)
  kAckHoldExpired,      // ack_hold_expired (ours): held ACKs no requester run took in time,
                        // sent alone
  kRxDrainProgress,     // rx_drain_progress (ours): receive drains that got datagrams, run by
                        // the progress thread (its epoll wake-up or spin)
  kRxDrainPoll,         // rx_drain_poll (ours): receive drains that got datagrams, run by an
                        // application thread (poll_cq on an empty CQ)
  kLingerHit,           // linger_hit (ours): a poll_cq drain that waited for the answer
                        // behind a ping-pong's ACK got it (Engine::linger_rx)
  kLingerExpired,       // linger_expired (ours): ... and gave up (EngineConfig::linger_ns)
  // One-copy between two devices of one host (emu/transport/one_copy.h):
  kOneCopyTx,           // one_copy_tx (ours): request packets sent as a descriptor of the
                        // sender's registered memory instead of their payload
  kOneCopyRx,           // one_copy_rx (ours): descriptor packets whose payload was copied
                        // straight from the sender's memory
  kDropOneCopy,         // drop_one_copy (ours): descriptor packets refused (unknown token,
                        // unknown memory, out of range, one-copy off, wrong opcode)
  // The busy-poll hand-off (EngineConfig::busy_poll_ns):
  kBusyPollTaken,       // busy_poll_taken (ours): an application's polls took receive from
                        // the progress thread
  kBusyPollReturned,    // busy_poll_returned (ours): ... and handed it back (no answer in,
                        // the application left the data path, polls further apart)
  kBusyPollLeaseEnded,  // busy_poll_lease_ended (ours): ... or the progress thread took it
                        // back when the polls stopped and their lease ran out
  kTimersOnPoll,        // timers_on_poll (ours): timer runs done by a polling application
                        // thread while it held receive
  kScatterKept,         // scatter_kept (ours): pieces of a receive scatter (READ response,
                        // atomic result, SEND or UD payload) that used a local check kept
                        // from earlier in the same receive batch (ScatterCache) instead of
                        // looking their key up
  kRxOnPost,            // rx_on_post (ours): receive looks (try-lock) done by an
                        // application's post while its polls held receive, when no empty
                        // poll or post had looked for a busy-poll gap (Engine::on_app_post)
  kBusyPollLateForgiven,  // busy_poll_late_forgiven (ours): empty polls further apart than
                          // the busy-poll gap that kept the polls' receive
                          // (EngineConfig::busy_poll_late_polls)
  kBusyPollLeaseKept,     // busy_poll_lease_kept (ours): looks at a run-out lease that kept
                          // it: an application thread inside a call of ours, or the thread
                          // that renewed it last waiting for a CPU (Engine::lease_holder_waits)
  kRxBacklogMarks,       // rx_backlog_marks (ours): receive batches that found the port's
                          // queue past SOFTRNIC_RX_MARK_PCT, whose requests drew CNPs as if
                          // CE-marked (EngineConfig::rx_mark_pct)
  kCount,
};
inline constexpr size_t kNumCtrs = static_cast<size_t>(Ctr::kCount);

// "sent_pkts", "rcvd_pkts", ... (stable names; never nullptr).
std::string_view counter_name(Ctr c);

// A block of counters. Increment from any thread.
class Counters {
 public:
  void add(Ctr c, uint64_t n = 1) { v_[idx(c)].fetch_add(n, std::memory_order_relaxed); }
  uint64_t get(Ctr c) const { return v_[idx(c)].load(std::memory_order_relaxed); }
  // Reads every counter (relaxed; not one atomic snapshot).
  std::array<uint64_t, kNumCtrs> snapshot() const;
  void reset();

 private:
  static constexpr size_t idx(Ctr c) { return static_cast<size_t>(c); }
  std::array<std::atomic<uint64_t>, kNumCtrs> v_{};
};

// Bumps a per-QP counter block and its device's block together.
inline void bump(Counters& qp, Counters& dev, Ctr c, uint64_t n = 1) {
  qp.add(c, n);
  dev.add(c, n);
}

}  // namespace rnic::emu
