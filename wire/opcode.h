// IBA transport opcodes (RC, UC, UD, RoCEv2 CNP) and the 256-entry opcode table that drives
// build and parse: name, header mask, total transport-header length and per-header offsets.
// Values follow IBA Vol 1 Table 38 as amended (FLUSH 0x1C, ATOMIC_WRITE 0x1D, as in Linux
// include/rdma/ib_pack.h). XRC (0xA0..0xB7) mirrors RC 0x00..0x17: requests carry the XRCETH
// right after the BTH, responses do not (IBA 9.2, 9.3.6). RD (0x40..) rows are absent.
#pragma once

#include <array>
#include <cstdint>

namespace rnic::wire {

namespace op {
// RC (transport class 0b000)
constexpr uint8_t kRcSendFirst = 0x00;
constexpr uint8_t kRcSendMiddle = 0x01;
constexpr uint8_t kRcSendLast = 0x02;
constexpr uint8_t kRcSendLastWithImm = 0x03;
constexpr uint8_t kRcSendOnly = 0x04;
constexpr uint8_t kRcSendOnlyWithImm = 0x05;
constexpr uint8_t kRcRdmaWriteFirst = 0x06;
constexpr uint8_t kRcRdmaWriteMiddle = 0x07;
constexpr uint8_t kRcRdmaWriteLast = 0x08;
constexpr uint8_t kRcRdmaWriteLastWithImm = 0x09;
constexpr uint8_t kRcRdmaWriteOnly = 0x0a;
constexpr uint8_t kRcRdmaWriteOnlyWithImm = 0x0b;
constexpr uint8_t kRcRdmaReadRequest = 0x0c;
constexpr uint8_t kRcRdmaReadResponseFirst = 0x0d;
constexpr uint8_t kRcRdmaReadResponseMiddle = 0x0e;
constexpr uint8_t kRcRdmaReadResponseLast = 0x0f;
constexpr uint8_t kRcRdmaReadResponseOnly = 0x10;
constexpr uint8_t kRcAcknowledge = 0x11;
constexpr uint8_t kRcAtomicAcknowledge = 0x12;
constexpr uint8_t kRcCompareSwap = 0x13;
constexpr uint8_t kRcFetchAdd = 0x14;
// 0x15 is reserved (was RESYNC, RD only).
constexpr uint8_t kRcSendLastWithInv = 0x16;
constexpr uint8_t kRcSendOnlyWithInv = 0x17;
// 0x18..0x1b are reserved for RC.
constexpr uint8_t kRcFlush = 0x1c;
constexpr uint8_t kRcAtomicWrite = 0x1d;
// UC (transport class 0b001)
constexpr uint8_t kUcSendFirst = 0x20;
constexpr uint8_t kUcSendMiddle = 0x21;
constexpr uint8_t kUcSendLast = 0x22;
constexpr uint8_t kUcSendLastWithImm = 0x23;
constexpr uint8_t kUcSendOnly = 0x24;
constexpr uint8_t kUcSendOnlyWithImm = 0x25;
constexpr uint8_t kUcRdmaWriteFirst = 0x26;
constexpr uint8_t kUcRdmaWriteMiddle = 0x27;
constexpr uint8_t kUcRdmaWriteLast = 0x28;
constexpr uint8_t kUcRdmaWriteLastWithImm = 0x29;
constexpr uint8_t kUcRdmaWriteOnly = 0x2a;
constexpr uint8_t kUcRdmaWriteOnlyWithImm = 0x2b;
// XRC (transport class 0b101): RC's opcodes | 0xA0 (requests add the XRCETH).
constexpr uint8_t kXrcBase = 0xa0;
constexpr uint8_t kXrcSendFirst = 0xa0;
constexpr uint8_t kXrcSendMiddle = 0xa1;
constexpr uint8_t kXrcSendLast = 0xa2;
constexpr uint8_t kXrcSendLastWithImm = 0xa3;
constexpr uint8_t kXrcSendOnly = 0xa4;
constexpr uint8_t kXrcSendOnlyWithImm = 0xa5;
constexpr uint8_t kXrcRdmaWriteFirst = 0xa6;
constexpr uint8_t kXrcRdmaWriteOnly = 0xaa;
constexpr uint8_t kXrcRdmaReadRequest = 0xac;
constexpr uint8_t kXrcRdmaReadResponseOnly = 0xb0;
constexpr uint8_t kXrcAcknowledge = 0xb1;
constexpr uint8_t kXrcAtomicAcknowledge = 0xb2;
constexpr uint8_t kXrcCompareSwap = 0xb3;
constexpr uint8_t kXrcFetchAdd = 0xb4;
constexpr uint8_t kXrcSendLastWithInv = 0xb6;
constexpr uint8_t kXrcSendOnlyWithInv = 0xb7;
// UD (transport class 0b011)
constexpr uint8_t kUdSendOnly = 0x64;
constexpr uint8_t kUdSendOnlyWithImm = 0x65;
// RoCEv2 Congestion Notification Packet (Annex A17): BTH + 16 reserved bytes + ICRC.
constexpr uint8_t kCnp = 0x81;
}  // namespace op

// Header kinds, in the order they can appear after the BTH. offset[] is measured from the
// first byte of the BTH. offset[kPayload] == length for every valid opcode.
enum HdrType : uint8_t {
  kHdrBth,
  kHdrReth,
  kHdrAeth,
  kHdrAtmEth,
  kHdrAtmAck,
  kHdrIeth,
  kHdrDeth,
  kHdrImmDt,
  kHdrFeth,
  kHdrXrcEth,
  kHdrPayload,
  kNumHdrTypes,
};

// Header presence bits, then operation-class bits (modelled on rxe_opcode.h).
constexpr uint32_t kBthMask = 1u << 0;
constexpr uint32_t kRethMask = 1u << 1;
constexpr uint32_t kAethMask = 1u << 2;
constexpr uint32_t kAtmEthMask = 1u << 3;
constexpr uint32_t kAtmAckMask = 1u << 4;
constexpr uint32_t kIethMask = 1u << 5;
constexpr uint32_t kDethMask = 1u << 6;
constexpr uint32_t kImmMask = 1u << 7;
constexpr uint32_t kFethMask = 1u << 8;
constexpr uint32_t kPayloadMask = 1u << 9;       // packet carries a (possibly empty) payload
constexpr uint32_t kCnpRsvdMask = 1u << 10;      // 16 reserved bytes after BTH (CNP)
constexpr uint32_t kXrcEthMask = 1u << 11;       // XRCETH after the BTH (XRC requests)
constexpr uint32_t kReqMask = 1u << 12;          // requester -> responder
constexpr uint32_t kAckMask = 1u << 13;          // responder -> requester (ACK, read resp, atomic ack)
constexpr uint32_t kSendMask = 1u << 14;
constexpr uint32_t kWriteMask = 1u << 15;
constexpr uint32_t kReadMask = 1u << 16;
constexpr uint32_t kAtomicMask = 1u << 17;       // compare&swap / fetch&add
constexpr uint32_t kAtomicWriteMask = 1u << 18;
constexpr uint32_t kFlushMask = 1u << 19;
constexpr uint32_t kRwrMask = 1u << 20;          // needs a new receive WQE (send start, write-imm end)
constexpr uint32_t kCompMask = 1u << 21;         // completes a receive WQE at the responder
constexpr uint32_t kStartMask = 1u << 22;        // first packet of a message (FIRST or ONLY)
constexpr uint32_t kMiddleMask = 1u << 23;
constexpr uint32_t kEndMask = 1u << 24;          // last packet of a message (LAST or ONLY)
constexpr uint32_t kCnpMask = 1u << 25;
constexpr uint32_t kLoopbackMask = 1u << 26;     // reserved for per-packet use by emu/, never in table

struct OpcodeInfo {
  const char* name;  // IBA-style name, e.g. "RC_SEND_ONLY"; nullptr for invalid opcodes
  uint32_t mask;     // 0 for invalid opcodes
  uint8_t length;    // bytes of all transport headers, BTH included (ICRC and payload excluded)
  uint8_t offset[kNumHdrTypes];  // from BTH start; meaningful only where the mask bit is set
};

// Transport class = top 3 bits of the opcode.
constexpr uint8_t transport_class(uint8_t opcode) { return opcode >> 5; }
constexpr bool is_rc(uint8_t opcode) { return transport_class(opcode) == 0; }
constexpr bool is_uc(uint8_t opcode) { return transport_class(opcode) == 1; }
constexpr bool is_ud(uint8_t opcode) { return transport_class(opcode) == 3; }
constexpr bool is_xrc(uint8_t opcode) { return transport_class(opcode) == 5; }
// The RC opcode an RC or XRC opcode stands for (XRC 0xA0 | x -> x), so the reliable
// transports compare one set of constants; other classes are returned unchanged.
constexpr uint8_t rc_equivalent(uint8_t opcode) {
  return is_xrc(opcode) ? static_cast<uint8_t>(opcode & 0x1f) : opcode;
}
constexpr bool is_cnp(uint8_t opcode) { return opcode == op::kCnp; }

// The full table; opcode_table()[op].name == nullptr for unsupported/reserved opcodes.
const std::array<OpcodeInfo, 256>& opcode_table();
// Same as opcode_table()[opcode]. Always returns a valid reference.
const OpcodeInfo& opcode_info(uint8_t opcode);
// True if the opcode has a row in the table.
inline bool opcode_valid(uint8_t opcode) { return opcode_info(opcode).mask != 0; }

}  // namespace rnic::wire
