// The constexpr 256-entry opcode table (rxe_opcode.c in C++): header masks, lengths, offsets.
#include "wire/opcode.h"

#include "wire/hdr.h"

namespace rnic::wire {
namespace {

// Builds one row. Header offsets follow the wire order of IBA extension headers:
// BTH, DETH, XRCETH, FETH, RETH | AtomicETH, AETH, AtomicAckETH, ImmDt | IETH, (CNP reserved), payload.
constexpr OpcodeInfo row(const char* name, uint32_t mask) {
  OpcodeInfo r{name, mask | kBthMask, 0, {}};
  size_t off = kBthBytes;
  auto place = [&](uint32_t bit, HdrType t, size_t bytes) {
    if (mask & bit) {
      r.offset[t] = static_cast<uint8_t>(off);
      off += bytes;
    }
  };
  r.offset[kHdrBth] = 0;
  place(kDethMask, kHdrDeth, kDethBytes);
  place(kXrcEthMask, kHdrXrcEth, kXrcEthBytes);
  place(kFethMask, kHdrFeth, kFethBytes);
  place(kRethMask, kHdrReth, kRethBytes);
  place(kAtmEthMask, kHdrAtmEth, kAtomicEthBytes);
  place(kAethMask, kHdrAeth, kAethBytes);
  place(kAtmAckMask, kHdrAtmAck, kAtomicAckEthBytes);
  place(kImmMask, kHdrImmDt, kImmDtBytes);
  place(kIethMask, kHdrIeth, kIethBytes);
  if (mask & kCnpRsvdMask) off += kCnpRsvdBytes;
  r.offset[kHdrPayload] = static_cast<uint8_t>(off);
  r.length = static_cast<uint8_t>(off);
  return r;
}

// Rows shared by RC and UC (base 0x00 / 0x20).
constexpr uint32_t kSendFirst = kPayloadMask | kReqMask | kRwrMask | kSendMask | kStartMask;
constexpr uint32_t kSendMiddle = kPayloadMask | kReqMask | kSendMask | kMiddleMask;
constexpr uint32_t kSendLast = kPayloadMask | kReqMask | kCompMask | kSendMask | kEndMask;
constexpr uint32_t kSendOnly =
    kPayloadMask | kReqMask | kCompMask | kRwrMask | kSendMask | kStartMask | kEndMask;
constexpr uint32_t kWriteFirst = kRethMask | kPayloadMask | kReqMask | kWriteMask | kStartMask;
constexpr uint32_t kWriteMiddle = kPayloadMask | kReqMask | kWriteMask | kMiddleMask;
constexpr uint32_t kWriteLast = kPayloadMask | kReqMask | kWriteMask | kEndMask;
constexpr uint32_t kWriteOnly = kRethMask | kPayloadMask | kReqMask | kWriteMask | kStartMask |
                                kEndMask;
constexpr uint32_t kWithImm = kImmMask | kCompMask;
// RDMA WRITE with immediate consumes a receive WQE on its last/only packet.
constexpr uint32_t kWriteImm = kWithImm | kRwrMask;

// Names of the XRC rows, indexed by the RC opcode they mirror (nullptr: no row).
constexpr const char* kXrcNames[] = {
    "XRC_SEND_FIRST", "XRC_SEND_MIDDLE", "XRC_SEND_LAST", "XRC_SEND_LAST_WITH_IMMEDIATE",
    "XRC_SEND_ONLY", "XRC_SEND_ONLY_WITH_IMMEDIATE", "XRC_RDMA_WRITE_FIRST",
    "XRC_RDMA_WRITE_MIDDLE", "XRC_RDMA_WRITE_LAST", "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "XRC_RDMA_WRITE_ONLY", "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "XRC_RDMA_READ_REQUEST",
    "XRC_RDMA_READ_RESPONSE_FIRST", "XRC_RDMA_READ_RESPONSE_MIDDLE",
    "XRC_RDMA_READ_RESPONSE_LAST", "XRC_RDMA_READ_RESPONSE_ONLY", "XRC_ACKNOWLEDGE",
    "XRC_ATOMIC_ACKNOWLEDGE", "XRC_COMPARE_SWAP", "XRC_FETCH_ADD", nullptr,
    "XRC_SEND_LAST_WITH_INVALIDATE", "XRC_SEND_ONLY_WITH_INVALIDATE",
};
static_assert(std::size(kXrcNames) == op::kRcSendOnlyWithInv + 1);

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  for (auto& r : t) r = OpcodeInfo{nullptr, 0, 0, {}};
  using namespace op;
  // RC
  t[kRcSendFirst] = row("RC_SEND_FIRST", kSendFirst);
  t[kRcSendMiddle] = row("RC_SEND_MIDDLE", kSendMiddle);
  t[kRcSendLast] = row("RC_SEND_LAST", kSendLast);
  t[kRcSendLastWithImm] = row("RC_SEND_LAST_WITH_IMMEDIATE", kSendLast | kWithImm);
  t[kRcSendOnly] = row("RC_SEND_ONLY", kSendOnly);
  t[kRcSendOnlyWithImm] = row("RC_SEND_ONLY_WITH_IMMEDIATE", kSendOnly | kWithImm);
  t[kRcRdmaWriteFirst] = row("RC_RDMA_WRITE_FIRST", kWriteFirst);
  t[kRcRdmaWriteMiddle] = row("RC_RDMA_WRITE_MIDDLE", kWriteMiddle);
  t[kRcRdmaWriteLast] = row("RC_RDMA_WRITE_LAST", kWriteLast);
  t[kRcRdmaWriteLastWithImm] = row("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kWriteLast | kWriteImm);
  t[kRcRdmaWriteOnly] = row("RC_RDMA_WRITE_ONLY", kWriteOnly);
  t[kRcRdmaWriteOnlyWithImm] = row("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kWriteOnly | kWriteImm);
  t[kRcRdmaReadRequest] =
      row("RC_RDMA_READ_REQUEST", kRethMask | kReqMask | kReadMask | kStartMask | kEndMask);
  t[kRcRdmaReadResponseFirst] =
      row("RC_RDMA_READ_RESPONSE_FIRST", kAethMask | kPayloadMask | kAckMask | kStartMask);
  t[kRcRdmaReadResponseMiddle] =
      row("RC_RDMA_READ_RESPONSE_MIDDLE", kPayloadMask | kAckMask | kMiddleMask);
  t[kRcRdmaReadResponseLast] =
      row("RC_RDMA_READ_RESPONSE_LAST", kAethMask | kPayloadMask | kAckMask | kEndMask);
  t[kRcRdmaReadResponseOnly] = row("RC_RDMA_READ_RESPONSE_ONLY",
                                   kAethMask | kPayloadMask | kAckMask | kStartMask | kEndMask);
  t[kRcAcknowledge] = row("RC_ACKNOWLEDGE", kAethMask | kAckMask | kStartMask | kEndMask);
  t[kRcAtomicAcknowledge] = row("RC_ATOMIC_ACKNOWLEDGE",
                                kAethMask | kAtmAckMask | kAckMask | kStartMask | kEndMask);
  t[kRcCompareSwap] =
      row("RC_COMPARE_SWAP", kAtmEthMask | kReqMask | kAtomicMask | kStartMask | kEndMask);
  t[kRcFetchAdd] =
      row("RC_FETCH_ADD", kAtmEthMask | kReqMask | kAtomicMask | kStartMask | kEndMask);
  t[kRcSendLastWithInv] = row("RC_SEND_LAST_WITH_INVALIDATE", kSendLast | kIethMask);
  t[kRcSendOnlyWithInv] = row("RC_SEND_ONLY_WITH_INVALIDATE", kSendOnly | kIethMask);
  t[kRcFlush] =
      row("RC_FLUSH", kFethMask | kRethMask | kReqMask | kFlushMask | kStartMask | kEndMask);
  t[kRcAtomicWrite] = row("RC_ATOMIC_WRITE", kRethMask | kPayloadMask | kReqMask |
                                                 kAtomicWriteMask | kStartMask | kEndMask);
  // UC
  t[kUcSendFirst] = row("UC_SEND_FIRST", kSendFirst);
  t[kUcSendMiddle] = row("UC_SEND_MIDDLE", kSendMiddle);
  t[kUcSendLast] = row("UC_SEND_LAST", kSendLast);
  t[kUcSendLastWithImm] = row("UC_SEND_LAST_WITH_IMMEDIATE", kSendLast | kWithImm);
  t[kUcSendOnly] = row("UC_SEND_ONLY", kSendOnly);
  t[kUcSendOnlyWithImm] = row("UC_SEND_ONLY_WITH_IMMEDIATE", kSendOnly | kWithImm);
  t[kUcRdmaWriteFirst] = row("UC_RDMA_WRITE_FIRST", kWriteFirst);
  t[kUcRdmaWriteMiddle] = row("UC_RDMA_WRITE_MIDDLE", kWriteMiddle);
  t[kUcRdmaWriteLast] = row("UC_RDMA_WRITE_LAST", kWriteLast);
  t[kUcRdmaWriteLastWithImm] = row("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kWriteLast | kWriteImm);
  t[kUcRdmaWriteOnly] = row("UC_RDMA_WRITE_ONLY", kWriteOnly);
  t[kUcRdmaWriteOnlyWithImm] = row("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kWriteOnly | kWriteImm);
  // XRC: every RC opcode of 0x00..0x17 at 0xA0 | op, requests with the XRCETH (IBA Table 38).
  // FLUSH and ATOMIC_WRITE (0x1C/0x1D) have no XRC rows.
  for (uint8_t o = 0; o <= kRcSendOnlyWithInv; ++o) {
    const OpcodeInfo rc = t[o];
    if (rc.mask == 0) continue;
    const uint32_t m = rc.mask & ~kBthMask;
    t[kXrcBase | o] = row(kXrcNames[o], m | ((m & kReqMask) ? kXrcEthMask : 0u));
  }
  // UD
  t[kUdSendOnly] = row("UD_SEND_ONLY", kDethMask | kSendOnly);
  t[kUdSendOnlyWithImm] = row("UD_SEND_ONLY_WITH_IMMEDIATE", kDethMask | kSendOnly | kWithImm);
  // RoCEv2 CNP
  t[kCnp] = row("CNP", kCnpMask | kCnpRsvdMask);
  return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = make_table();

// A few rows checked against IBA/rxe by hand.
static_assert(kTable[op::kRcSendOnly].length == 12);
static_assert(kTable[op::kRcRdmaWriteOnlyWithImm].length == 32);
static_assert(kTable[op::kRcRdmaWriteOnlyWithImm].offset[kHdrImmDt] == 28);
static_assert(kTable[op::kRcAtomicAcknowledge].length == 24);
static_assert(kTable[op::kRcAtomicAcknowledge].offset[kHdrAtmAck] == 16);
static_assert(kTable[op::kRcCompareSwap].length == 40);
static_assert(kTable[op::kRcFlush].offset[kHdrFeth] == 12);
static_assert(kTable[op::kRcFlush].offset[kHdrReth] == 16);
static_assert(kTable[op::kUdSendOnlyWithImm].offset[kHdrImmDt] == 20);
static_assert(kTable[op::kCnp].length == 28);
// XRC: XRCETH right after the BTH on requests (then RETH / AtomicETH), none on responses.
static_assert(kTable[op::kXrcSendOnly].length == 16);
static_assert(kTable[op::kXrcSendOnly].offset[kHdrXrcEth] == 12);
static_assert(kTable[op::kXrcRdmaWriteFirst].offset[kHdrReth] == 16);
static_assert(kTable[op::kXrcCompareSwap].length == 44);
static_assert(kTable[op::kXrcAcknowledge].length == 16 &&
              !(kTable[op::kXrcAcknowledge].mask & kXrcEthMask));
static_assert(kTable[op::kXrcSendOnlyWithInv].offset[kHdrIeth] == 16);
static_assert(kTable[op::kXrcBase | 0x15].mask == 0 && kTable[0xbc].mask == 0);
static_assert(kTable[0x15].name == nullptr && kTable[0x15].mask == 0);
static_assert(kTable[op::kRcAcknowledge].mask == (kBthMask | kAethMask | kAckMask | kStartMask |
                                                  kEndMask));

}  // namespace

const std::array<OpcodeInfo, 256>& opcode_table() { return kTable; }
const OpcodeInfo& opcode_info(uint8_t opcode) { return kTable[opcode]; }

}  // namespace rnic::wire
