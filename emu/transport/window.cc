// emu/transport/window.cc: the sending window and its timers (window.h, docs/congestion.md).
#include "emu/transport/window.h"

#include <algorithm>

#include "wire/psn.h"

namespace rnic::emu {

using wire::psn_diff;

void win_reset(SendWindow& w, uint32_t max) {
  w = SendWindow{};
  w.max = std::max<uint32_t>(max, 1);
  w.cwnd = w.ssthresh = w.target = w.max;
}

void win_on_progress(SendWindow& w, uint32_t acked, uint32_t comp_psn, uint64_t now_ns) {
  w.backoff = 0;
  w.probe_backoff = 0;
  if (w.recovering && psn_diff(comp_psn, w.recover_psn) >= 0) w.recovering = false;
  if (w.lossy && psn_diff(comp_psn, w.loss_psn) >= 0) w.lossy = false;
  if (w.rtt_pending && psn_diff(comp_psn, w.rtt_psn) > 0) {
    w.rtt_pending = false;
    const uint64_t s = now_ns > w.rtt_t0_ns ? now_ns - w.rtt_t0_ns : 1;
    if (w.srtt_ns == 0) {
      w.srtt_ns = s;
      w.rttvar_ns = s / 2;
    } else {
      const uint64_t dev = s > w.srtt_ns ? s - w.srtt_ns : w.srtt_ns - s;
      w.rttvar_ns = (3 * w.rttvar_ns + dev) / 4;
      w.srtt_ns = (7 * w.srtt_ns + s) / 8;
    }
  }
  uint32_t n = acked;
  if (w.cwnd < w.ssthresh) {  // slow start: +1 per acknowledged PSN, up to the threshold
    const uint32_t s = std::min(n, w.ssthresh - w.cwnd);
    w.cwnd += s;
    n -= s;
  }
  w.ai_acked += n;
  while (w.cwnd < w.max && w.ai_acked >= w.cwnd) {  // one step per window acknowledged
    w.ai_acked -= w.cwnd;
    if (w.fr_rounds < kFastRecoveryRounds) {
      ++w.fr_rounds;
    } else {
      w.target = std::min(w.target + kAiStep, w.max);
    }
    w.target = std::max(w.target, w.cwnd + 1);
    w.cwnd = std::max(w.cwnd + 1, (w.cwnd + w.target) / 2);
  }
  if (w.cwnd >= w.max) {
    w.cwnd = w.target = w.max;
    w.ai_acked = 0;
  }
}

bool win_cut(SendWindow& w, uint32_t max_psn, bool loss) {
  if (w.recovering && !loss) return false;  // a CNP: one decrease per window of data
  if (loss) {
    w.lossy = true;
    w.loss_psn = max_psn;
  }
  const uint32_t floor = loss ? std::min(kLossFloor, w.max) : 1;
  if (w.cwnd <= floor) return false;
  w.target = w.cwnd;
  w.ssthresh = std::max(w.cwnd / 2, floor);
  w.cwnd = w.ssthresh;
  w.ai_acked = 0;
  w.fr_rounds = 0;
  w.recovering = true;
  w.recover_psn = max_psn;
  return true;
}

void win_collapse(SendWindow& w, uint32_t max_psn) {
  w.lossy = true;
  w.loss_psn = max_psn;
  if (!w.recovering) {
    w.target = w.cwnd;
    w.ssthresh = std::max<uint32_t>(w.cwnd / 2, 2);
  }
  w.cwnd = 1;
  w.ai_acked = 0;
  w.fr_rounds = 0;
  w.recovering = true;
  w.recover_psn = max_psn;
}

void win_rtt_start(SendWindow& w, uint32_t psn, uint64_t now_ns) {
  if (w.rtt_pending) return;
  w.rtt_pending = true;
  w.rtt_psn = psn;
  w.rtt_t0_ns = now_ns;
}

uint64_t win_pto_ns(const SendWindow& w) {
  if (w.srtt_ns == 0) return kInitialProbeNs;
  return std::clamp(w.srtt_ns + 2 * w.rttvar_ns, kMinProbeNs, kMaxProbeNs);
}

uint32_t win_ackreq_every(const SendWindow& w, uint32_t max_per_ack, uint32_t share) {
  return std::clamp<uint32_t>(std::min(w.cwnd, share) / 4, 1, max_per_ack);
}

}  // namespace rnic::emu
