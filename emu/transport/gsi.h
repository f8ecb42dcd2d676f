// emu/transport/gsi.h: QP1, the General Services Interface of the device (IBA 13.5), as the
// transport sees it. QPN 1 is reserved (Device::create_qp never hands it out); a UD SEND_ONLY
// to QPN 1 that passed the ICRC and parse checks, whose P_Key is the default partition (0xFFFF,
// full or limited member) and whose DETH Q_Key is the GSI key 0x80010000, is handed to the
// one registered GsiHandler (emu/cm's Agent) with its payload (the MAD). Anything else sent to
// QPN 1 is counted and dropped like a packet for any other QP (bad P_Key -> bad_pkey_cntr,
// Q_Key -> qkey_viol_cntr, other opcode -> drop_bad_state, no handler -> drop_unknown_qpn).
// Sending: Engine::send_gsi builds the UD SEND_ONLY with SrcQP 1 and the GSI Q_Key through the
// one packet writer and the port (so captures and fault rules see it like any packet).
#pragma once

#include <cstdint>
#include <span>

#include "emu/objects/param.h"
#include "wire/port.h"

namespace rnic::emu {

inline constexpr uint32_t kGsiQpn = 1;
// kGsiQkey (0x80010000) is in emu/objects/param.h.

struct GsiPacket {
  wire::Endpoint src;   // IP and UDP source port of the datagram
  wire::Endpoint dst;   // our address as received (may be unknown: all zero)
  uint32_t src_qpn = 0;  // DETH SrcQP (1 for a CM peer)
  uint16_t pkey = 0;
  uint8_t tos = 0;
  std::span<const uint8_t> payload;  // the MAD (valid only during the call)
};

class GsiHandler {
 public:
  virtual ~GsiHandler() = default;
  // Called on the engine's receive context (rx lock held, one call at a time). Must not block
  // or call back into the engine's receive path; copy what is needed and return.
  virtual void on_gsi_packet(const GsiPacket& p) = 0;
};

}  // namespace rnic::emu
