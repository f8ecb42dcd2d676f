// emu/transport/recv.h: ingress (rxe_recv.c): every received datagram passes ICRC (first, counted),
// parse, BTH, QPN, QP type/state, address binding (plus the opt-in strict UDP source port,
// DeviceConfig::strict_src), P_Key and Q_Key checks — each failure a counted silent drop
// (docs/checks.md §2.1) — and is then handed to the responder
// (request opcodes) or the completer (responses) under that one QP's lock.
#pragma once

#include <cstdint>
#include <span>

#include "base/log.h"
#include "emu/objects/counters.h"
#include "wire/packet.h"
#include "wire/port.h"

namespace rnic::emu {

class Engine;

// ---- logging a dropped or refused packet (ingress and responder) ----
// "127.0.0.3:51234" / "[::1]:4791" in a stack buffer: no allocation, so a log line can be
// formatted on a receive path. Used only inside an enabled log branch.
class EndpointText {
 public:
  explicit EndpointText(const wire::Endpoint& ep);
  const char* c_str() const { return s_; }

 private:
  char s_[56];
};
// The opcode's IBA name ("RC_SEND_ONLY"), or "UNKNOWN" for an opcode without a table row.
const char* opcode_log_name(uint8_t opcode);

}  // namespace rnic::emu

// One rate-limited kWarn line for a dropped or refused packet (per call site, rxe's
// pr_warn_ratelimited), naming what happened, where the packet came from, its destination QPN,
// opcode and PSN, and the counter that counted it:
//   "drop: bad ICRC from 127.0.0.3:51234 to qpn 0x11 op RC_SEND_ONLY psn 12 (icrc_err)"
// kind is "drop" or "nak"; ctr is the emu::Ctr the caller bumped.
// Off (the default threshold is error): one relaxed load and a branch; nothing is formatted.
#define RNIC_PKT_LOG(kind, what, ctr, src, qpn, opcode, psn)                                  \
  RNIC_LOG_RL(kWarn, "%s: %s from %s to qpn 0x%x op %s psn %u (%.*s)", kind, what,             \
              ::rnic::emu::EndpointText(src).c_str(), static_cast<unsigned>(qpn),            \
              ::rnic::emu::opcode_log_name(opcode), static_cast<unsigned>(psn),              \
              static_cast<int>(::rnic::emu::counter_name(ctr).size()),                       \
              ::rnic::emu::counter_name(ctr).data())
// As RNIC_PKT_LOG with a second, variable string after what ("QP state" "RTR").
#define RNIC_PKT_LOG_D(kind, what, detail, ctr, src, qpn, opcode, psn)                        \
  RNIC_LOG_RL(kWarn, "%s: %s %s from %s to qpn 0x%x op %s psn %u (%.*s)", kind, what, detail,  \
              ::rnic::emu::EndpointText(src).c_str(), static_cast<unsigned>(qpn),            \
              ::rnic::emu::opcode_log_name(opcode), static_cast<unsigned>(psn),              \
              static_cast<int>(::rnic::emu::counter_name(ctr).size()),                       \
              ::rnic::emu::counter_name(ctr).data())
// As RNIC_PKT_LOG for a drop no counter records (a QP being torn down, not yet ready).
#define RNIC_PKT_LOG_NC(kind, what, src, qpn, opcode, psn)                                    \
  RNIC_LOG_RL(kWarn, "%s: %s from %s to qpn 0x%x op %s psn %u (not counted)", kind, what,      \
              ::rnic::emu::EndpointText(src).c_str(), static_cast<unsigned>(qpn),            \
              ::rnic::emu::opcode_log_name(opcode), static_cast<unsigned>(psn))

namespace rnic::emu {

// Handles one RoCE datagram (BTH .. ICRC). seg_index is its index within a GRO buffer (its
// IPv4 ID is d.ip_id + seg_index). Runs in the engine's receive context (rx lock held).
// Hot path: no allocation; locks only the destination QP.
void recv_packet(Engine& e, const wire::RxDesc& d, std::span<const uint8_t> roce,
                 uint32_t seg_index = 0);

// A parsed TVer-1 request (emu/transport/one_copy.h): points p's payload at the bytes its
// descriptor names in the peer's shared memory. False: dropped and counted (drop_one_copy).
// Receive context (rx lock held); the payload stays valid until the next call.
bool resolve_one_copy(Engine& e, const wire::RxDesc& d, wire::PacketView* p);

}  // namespace rnic::emu
