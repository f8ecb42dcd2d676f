// emu/objects/wr_opcode.h: the one table of send work-request opcode facts, per QP type (in the
// spirit of rxe's rxe_wr_opcode_info: a fact mask per QP type, the WC opcode, the BTH opcodes).
// Post-send validation (qp.cc), the requester (req.cc) and the completer (comp.cc) read it.
#pragma once

#include <array>
#include <cstdint>

#include "emu/objects/types.h"
#include "wire/opcode.h"

namespace rnic::emu {

// Fact bits of one WR opcode on one QP type. A mask of 0 means "not valid on that QP type"
// (post_send answers EINVAL); every valid mask has kWrValidMask.
inline constexpr uint32_t kWrValidMask = 1u << 0;        // may be posted on this QP type
inline constexpr uint32_t kWrSendMask = 1u << 1;         // SEND*: consumes a receive WQE remotely
inline constexpr uint32_t kWrWriteMask = 1u << 2;        // RDMA WRITE*: writes remote memory
inline constexpr uint32_t kWrReadMask = 1u << 3;         // RDMA READ
inline constexpr uint32_t kWrAtomicMask = 1u << 4;       // CMP_AND_SWP / FETCH_AND_ADD: one packet,
                                                         // 8-byte result, WC byte_len 8
inline constexpr uint32_t kWrAtomicWriteMask = 1u << 5;  // ATOMIC_WRITE (8-byte operand)
inline constexpr uint32_t kWrImmMask = 1u << 6;          // carries immediate data (last packet)
inline constexpr uint32_t kWrInvMask = 1u << 7;          // carries an rkey to invalidate (IETH)
inline constexpr uint32_t kWrRemoteAddrMask = 1u << 8;   // needs remote address + rkey
inline constexpr uint32_t kWrPayloadMask = 1u << 9;      // request packets carry the gather list
inline constexpr uint32_t kWrInlineMask = 1u << 10;      // IBV_SEND_INLINE allowed
inline constexpr uint32_t kWrRdAtomicMask = 1u << 11;    // takes an initiator-depth slot
                                                         // (max_rd_atomic, IBA 9.4.4)
inline constexpr uint32_t kWrLocalWriteMask = 1u << 12;  // the response lands in the SGEs
                                                         // (they need LOCAL_WRITE)
inline constexpr uint32_t kWrSolicitedMask = 1u << 13;   // SE is honoured on its last packet
inline constexpr uint32_t kWrCompareMask = 1u << 14;     // carries a compare operand (CMP_AND_SWP)
inline constexpr uint32_t kWrAtomicFieldsMask = 1u << 15;  // address/rkey come from wr.atomic
inline constexpr uint32_t kWrLocalMask = 1u << 16;       // executed by the requester, no packet
inline constexpr uint32_t kWrWaitSqMask = 1u << 17;      // starts only once every earlier WQE
                                                         // has completed (LOCAL_INV, as rxe)
inline constexpr uint32_t kWrBindMask = 1u << 18;        // carries MW bind parameters
inline constexpr uint32_t kWrUnimplementedMask = 1u << 19;  // valid, but the requester fails it
                                                            // with LOC_QP_OP_ERR, nothing sent
inline constexpr uint32_t kWrFlushMask = 1u << 20;       // FLUSH: RETH + FETH, no payload
// Answered by a zero-length RDMA READ RESPONSE ONLY (IBA 1.5 oA19; rxe
// send_read_response_ack): ATOMIC_WRITE and FLUSH.
inline constexpr uint32_t kWrEmptyReadRespMask = kWrAtomicWriteMask | kWrFlushMask;

// Position of a packet in its message (BTH opcode families: IBA Vol 1 9.2, Table 38).
enum WrPkt : uint8_t { kWrPktFirst = 0, kWrPktMiddle, kWrPktLast, kWrPktOnly, kNumWrPkts };
// bth[] value for WR opcodes that send no packet.
inline constexpr uint8_t kWrNoBth = 0xff;

inline constexpr int kNumWrQpTypes = 3;  // RC, UC, UD (wr_qp_index)
inline constexpr int kNumWrOpcodes = 16;  // WrOpcode values 0..15

struct WrOpcodeInfo {
  const char* name;                   // ibv_wr_opcode name without IBV_WR_; nullptr: no opcode
  uint32_t mask[kNumWrQpTypes];       // by wr_qp_index(); 0 = not valid on that QP type
  WcOpcode wc_opcode;                 // the send completion's opcode (ibv_wc_opcode)
  uint8_t bth[kNumWrPkts];            // RC-class BTH opcode by WrPkt (kWrNoBth: no packet);
                                      // the QP type's transport class is OR'ed in
};

// Index of a QP type in WrOpcodeInfo::mask. An XRC initiator sends what RC sends (minus
// FLUSH and ATOMIC_WRITE, which have no XRC opcodes: wr_mask).
constexpr int wr_qp_index(QpType t) {
  return (t == QpType::kRc || t == QpType::kXrcSend) ? 0 : t == QpType::kUc ? 1 : 2;
}

namespace wr_detail {
inline constexpr uint8_t kRc = 1, kUc = 2, kUd = 4;  // "valid on" bits for row()
constexpr WrOpcodeInfo row(const char* name, uint8_t valid_on, uint32_t facts, WcOpcode wc,
                           uint8_t first, uint8_t middle, uint8_t last, uint8_t only) {
  const uint32_t m = facts | kWrValidMask;
  return WrOpcodeInfo{name,
                      {(valid_on & kRc) ? m : 0u, (valid_on & kUc) ? m : 0u,
                       (valid_on & kUd) ? m : 0u},
                      wc,
                      {first, middle, last, only}};
}
constexpr WrOpcodeInfo none() { return WrOpcodeInfo{nullptr, {0, 0, 0}, WcOpcode::kSend,
                                                    {kWrNoBth, kWrNoBth, kWrNoBth, kWrNoBth}}; }
constexpr WrOpcodeInfo local(const char* name, uint8_t valid_on, uint32_t facts, WcOpcode wc) {
  return row(name, valid_on, facts | kWrLocalMask, wc, kWrNoBth, kWrNoBth, kWrNoBth, kWrNoBth);
}

constexpr uint32_t kSendFacts = kWrSendMask | kWrPayloadMask | kWrInlineMask | kWrSolicitedMask;
constexpr uint32_t kWriteFacts = kWrWriteMask | kWrRemoteAddrMask | kWrPayloadMask | kWrInlineMask;
constexpr uint32_t kAtomicFacts = kWrAtomicMask | kWrRemoteAddrMask | kWrRdAtomicMask |
                                  kWrLocalWriteMask | kWrAtomicFieldsMask;
namespace o = wire::op;

// IBA Vol 1 10.8.3 (work request operations by service type, Table 86 as used by verbs):
// UD: SEND only; UC: no READ/ATOMIC/SEND_WITH_INV; RC: all. TSO and DRIVER1 are not offered
// (EINVAL).
inline constexpr std::array<WrOpcodeInfo, kNumWrOpcodes> kTable = {
    // 0 RDMA_WRITE
    row("RDMA_WRITE", kRc | kUc, kWriteFacts, WcOpcode::kRdmaWrite, o::kRcRdmaWriteFirst,
        o::kRcRdmaWriteMiddle, o::kRcRdmaWriteLast, o::kRcRdmaWriteOnly),
    // 1 RDMA_WRITE_WITH_IMM
    row("RDMA_WRITE_WITH_IMM", kRc | kUc, kWriteFacts | kWrImmMask | kWrSolicitedMask,
        WcOpcode::kRdmaWrite, o::kRcRdmaWriteFirst, o::kRcRdmaWriteMiddle,
        o::kRcRdmaWriteLastWithImm, o::kRcRdmaWriteOnlyWithImm),
    // 2 SEND
    row("SEND", kRc | kUc | kUd, kSendFacts, WcOpcode::kSend, o::kRcSendFirst, o::kRcSendMiddle,
        o::kRcSendLast, o::kRcSendOnly),
    // 3 SEND_WITH_IMM
    row("SEND_WITH_IMM", kRc | kUc | kUd, kSendFacts | kWrImmMask, WcOpcode::kSend,
        o::kRcSendFirst, o::kRcSendMiddle, o::kRcSendLastWithImm, o::kRcSendOnlyWithImm),
    // 4 RDMA_READ: one request packet; the responses fill the SGEs.
    row("RDMA_READ", kRc, kWrReadMask | kWrRemoteAddrMask | kWrRdAtomicMask | kWrLocalWriteMask,
        WcOpcode::kRdmaRead, o::kRcRdmaReadRequest, o::kRcRdmaReadRequest,
        o::kRcRdmaReadRequest, o::kRcRdmaReadRequest),
    // 5 ATOMIC_CMP_AND_SWP
    row("ATOMIC_CMP_AND_SWP", kRc, kAtomicFacts | kWrCompareMask, WcOpcode::kCompSwap,
        o::kRcCompareSwap, o::kRcCompareSwap, o::kRcCompareSwap, o::kRcCompareSwap),
    // 6 ATOMIC_FETCH_AND_ADD
    row("ATOMIC_FETCH_AND_ADD", kRc, kAtomicFacts, WcOpcode::kFetchAdd, o::kRcFetchAdd,
        o::kRcFetchAdd, o::kRcFetchAdd, o::kRcFetchAdd),
    // 7 LOCAL_INV (IBA 10.6.3.3 / 10.8.2): waits for the SQ ahead of it.
    local("LOCAL_INV", kRc | kUc, kWrWaitSqMask, WcOpcode::kLocalInv),
    // 8 BIND_MW (IBA 10.6.3.2)
    local("BIND_MW", kRc | kUc, kWrBindMask, WcOpcode::kBindMw),
    // 9 SEND_WITH_INV: RC only — IBA Table 38 defines SEND_LAST/ONLY_WITH_INVALIDATE for RC
    // (and XRC), not UC (UC used to accept it and sent a packet with an undefined opcode).
    row("SEND_WITH_INV", kRc, kSendFacts | kWrInvMask, WcOpcode::kSend, o::kRcSendFirst,
        o::kRcSendMiddle, o::kRcSendLastWithInv, o::kRcSendOnlyWithInv),
    // 10 TSO, 11 DRIVER1: no QP type takes them.
    row("TSO", 0, 0, WcOpcode::kTso, kWrNoBth, kWrNoBth, kWrNoBth, kWrNoBth),
    row("DRIVER1", 0, 0, WcOpcode::kSend, kWrNoBth, kWrNoBth, kWrNoBth, kWrNoBth),
    none(), none(),
    // 14 FLUSH (IBA 1.5 Annex A19): RETH + FETH, RC only, only through ibv_wr_flush. A
    // non-posted request: it takes an initiator-depth slot, as the responder gives it a
    // responder resource (rxe_prepare_res).
    row("FLUSH", kRc, kWrFlushMask | kWrRemoteAddrMask | kWrRdAtomicMask, WcOpcode::kFlush,
        o::kRcFlush, o::kRcFlush, o::kRcFlush, o::kRcFlush),
    // 15 ATOMIC_WRITE (IBA 1.5 Annex A19): RETH + 8-byte payload, RC only. The address and
    // rkey come from wr.rdma (as rxe); the operand from the 8-byte gather list (ibv_post_send;
    // no IBV_SEND_INLINE, as rxe) or by value (ibv_wr_atomic_write). Non-posted, like FLUSH.
    row("ATOMIC_WRITE", kRc,
        kWrAtomicWriteMask | kWrRemoteAddrMask | kWrPayloadMask | kWrRdAtomicMask,
        WcOpcode::kAtomicWrite, o::kRcAtomicWrite, o::kRcAtomicWrite, o::kRcAtomicWrite,
        o::kRcAtomicWrite),
};
inline constexpr WrOpcodeInfo kInvalid = none();
}  // namespace wr_detail

// The row of op; values outside the table give an all-invalid row.
constexpr const WrOpcodeInfo& wr_opcode_info(WrOpcode op) {
  const auto i = static_cast<uint8_t>(op);
  return i < kNumWrOpcodes ? wr_detail::kTable[i] : wr_detail::kInvalid;
}

// Facts of op on a QP of type t (0 = not valid there).
// An XRC target has no send queue: nothing is valid on it.
constexpr uint32_t wr_mask(QpType t, WrOpcode op) {
  if (t == QpType::kXrcRecv) return 0;
  if (t == QpType::kXrcSend && (op == WrOpcode::kFlush || op == WrOpcode::kAtomicWrite))
    return 0;
  return wr_opcode_info(op).mask[wr_qp_index(t)];
}
constexpr bool wr_valid(QpType t, WrOpcode op) { return wr_mask(t, op) != 0; }

// The WC opcode a send WQE of op completes (and is flushed) with.
constexpr WcOpcode wc_opcode_for(WrOpcode op) { return wr_opcode_info(op).wc_opcode; }

// BTH transport class of a QP type in the opcode's top 3 bits (IBA 9.2 Table 38).
constexpr uint8_t wr_transport_class_bits(QpType t) {
  return t == QpType::kRc ? 0x00 : t == QpType::kUc ? 0x20 : t == QpType::kXrcSend ? 0xa0 : 0x60;
}

// BTH opcode of the packet of op that is (first, last) in its message, on a QP of type t.
// REQUIRES: wr_valid(t, op) and the opcode sends packets (no kWrLocalMask).
constexpr uint8_t wr_bth_opcode(QpType t, WrOpcode op, bool first, bool last) {
  const WrPkt k = first ? (last ? kWrPktOnly : kWrPktFirst) : (last ? kWrPktLast : kWrPktMiddle);
  return static_cast<uint8_t>(wr_opcode_info(op).bth[k] | wr_transport_class_bits(t));
}

}  // namespace rnic::emu
