// emu/transport/recv.h: ingress (rxe_recv.c): every received datagram passes ICRC (first, counted),
// parse, BTH, QPN, QP type/state, address binding (plus the opt-in strict UDP source port,
// DeviceConfig::strict_src), P_Key and Q_Key checks — each failure a counted silent drop
// (checks-and-faults §2.1) — and is then handed to the responder
// (request opcodes) or the completer (responses) under that one QP's lock.
#pragma once

#include <cstdint>
#include <span>

#include "wire/port.h"

namespace rnic::emu {

class Engine;

// Handles one RoCE datagram (BTH .. ICRC). seg_index is its index within a GRO buffer (its
// IPv4 ID is d.ip_id + seg_index). Runs in the engine's receive context (rx lock held).
// Hot path: no allocation; locks only the destination QP.
void recv_packet(Engine& e, const wire::RxDesc& d, std::span<const uint8_t> roce,
                 uint32_t seg_index = 0);

}  // namespace rnic::emu
