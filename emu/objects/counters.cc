// emu/objects/counters.cc: counter names and snapshot/reset helpers.
#include "emu/objects/counters.h"

namespace rnic::emu {

namespace {
constexpr std::array<std::string_view, kNumCtrs> kNames = {
    "sent_pkts",          "rcvd_pkts",          "duplicate_request",  "out_of_seq_request",
    "rcvd_rnr_err",       "send_rnr_err",       "rcvd_seq_err",       "ack_deferred",
    "retry_exceeded_err", "rnr_nak_retry_err",  "completer_retry_err", "send_err",
    "link_downed",        "rdma_sends",         "rdma_recvs",         "local_ack_timeout_err",
    "icrc_err",           "drop_unknown_qpn",   "drop_bad_state",     "drop_addr_mismatch",
    "drop_malformed",     "bad_pkey_cntr",      "qkey_viol_cntr",     "naks_sent",
    "naks_rcvd",          "rem_access_nak_sent", "rem_access_nak_rcvd", "retrans_pkts",
    "uc_dropped",         "ud_dropped",         "drop_src_port",      "mem_fault",
    "icrc_id_zero",       "icrc_id_gro",        "icrc_id_solved",     "cnp_rcvd",
    "ecn_ce_rcvd",        "retrans_bytes",      "window_cuts",        "retrans_probes",
    "mtu_exceeded",       "tm_bad_header",      "stash_stored",       "stash_replayed",
    "stash_full",         "cnp_sent",           "spin_skipped",       "tx_deferred",
    "ack_on_post",        "ack_hold_expired",   "rx_drain_progress",  "rx_drain_poll",
    "linger_hit",         "linger_expired",     "one_copy_tx",
    "one_copy_rx",        "drop_one_copy",      "busy_poll_taken",    "busy_poll_returned",
    "busy_poll_lease_ended", "timers_on_poll", "scatter_kept",  "rx_on_post",
    "busy_poll_late_forgiven", "busy_poll_lease_kept", "rx_backlog_marks",
};
}  // namespace

std::string_view counter_name(Ctr c) {
  auto i = static_cast<size_t>(c);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

std::array<uint64_t, kNumCtrs> Counters::snapshot() const {
  std::array<uint64_t, kNumCtrs> out{};
  for (size_t i = 0; i < kNumCtrs; ++i) out[i] = v_[i].load(std::memory_order_relaxed);
  return out;
}

void Counters::reset() {
  for (auto& a : v_) a.store(0, std::memory_order_relaxed);
}

}  // namespace rnic::emu
