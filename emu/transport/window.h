// emu/transport/window.h: the RC requester's sending window and loss-recovery timers as pure
// functions on SendWindow (emu/objects/transport_state.h): AIMD with slow start after a
// timeout, multiplicative decrease (a CNP once per window of data, a loss not below
// kLossFloor), an RTT estimate (RFC 6298 shape, Karn's rule) for the probe timer, bounded
// exponential backoff. The algorithm and its constants are described in docs/congestion.md.
#pragma once

#include <cstdint>

#include "emu/objects/transport_state.h"

namespace rnic::emu {

// IBA local ACK timer: timeout_ns << backoff, backoff at most this (x4), reset on progress.
inline constexpr uint8_t kMaxTimeoutBackoff = 2;
// Probe timer: pto << probe_backoff, probe_backoff at most this.
inline constexpr uint8_t kMaxProbeBackoff = 4;
// Probe timer floor, and its value before the first RTT sample.
inline constexpr uint64_t kMinProbeNs = 200'000;
// ... and its ceiling: a deep queue inflates srtt, and a late probe is a long stall; but a
// full window of 4 KiB packets queues for milliseconds on a veth/bridge, and a 2 ms ceiling
// probed spuriously about once per window there (net_mtu9000: ~5% of packets sent).
inline constexpr uint64_t kMaxProbeNs = 10'000'000;
// Increase steps (one per window of PSNs acknowledged) after a cut: the first
// kFastRecoveryRounds move the window halfway back to the target (the window before the cut);
// after them the target itself grows by kAiStep PSNs per step (DCQCN's reaction point shape).
inline constexpr uint8_t kFastRecoveryRounds = 5;
inline constexpr uint32_t kAiStep = 8;
inline constexpr uint64_t kInitialProbeNs = 1'000'000;
// A loss (NAK, lost response) halves the window down to this many PSNs and no further; CNPs
// and the IBA timer go lower (docs/congestion.md §3).
inline constexpr uint32_t kLossFloor = 32;

// RTS: the full window (max PSNs), no RTT estimate, timers off.
void win_reset(SendWindow& w, uint32_t max);

// Forward progress: `acked` PSNs newly acknowledged, comp psn now `comp_psn`. Slow start
// below ssthresh (after a timeout), then one increase step per cwnd PSNs acknowledged (fast
// recovery towards the target, then additive increase of the target); ends a recovery episode once
// comp psn reached recover_psn; both backoffs back to 0; takes the RTT sample if the timed
// PSN is acknowledged.
void win_on_progress(SendWindow& w, uint32_t acked, uint32_t comp_psn, uint64_t now_ns);

// A loss (PSN-sequence NAK, lost READ/ATOMIC response; `loss` = true) or congestion signal
// (CNP; `loss` = false): halve the window. A CNP cuts at most once per window of data (none
// while comp psn has not passed the max_psn of the last cut) and may take it down to 1. Every
// loss cuts, since with an in-order responder each one costs a window of resends, but never
// below kLossFloor: random loss is not congestion, and below the floor the window no longer
// covers the RTT, so goodput falls faster than the resends it saves. True if cut.
bool win_cut(SendWindow& w, uint32_t max_psn, bool loss);

// A timer expiry (IBA timeout or probe): window to 1 (the oldest packet goes alone), the
// threshold to half the window the loss hit (once per episode). Always a cut.
void win_collapse(SendWindow& w, uint32_t max_psn);

// RTT timing: start on a first transmission carrying AckReq when none is timed; a
// retransmission cancels the sample (Karn).
void win_rtt_start(SendWindow& w, uint32_t psn, uint64_t now_ns);
inline void win_rtt_cancel(SendWindow& w) { w.rtt_pending = false; }

// The probe timeout: srtt + 2 rttvar within [kMinProbeNs, kMaxProbeNs] (kInitialProbeNs before
// a sample).
// Shorter than TCP's RTO on purpose: a spurious probe costs one duplicate packet, nothing else.
uint64_t win_pto_ns(const SendWindow& w);

// AckReq spacing: every min(kMaxPktsPerAck, cwnd / 4) packets (at least every packet), so a
// small window is acknowledged several times before it fills (one lost ACK does not stall it).
// `share`: a cap under cwnd (EngineConfig::window_share); the spacing is from the smaller.
uint32_t win_ackreq_every(const SendWindow& w, uint32_t max_per_ack,
                          uint32_t share = UINT32_MAX);

}  // namespace rnic::emu
