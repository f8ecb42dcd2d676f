// emu/objects/wr_opcode.cc: build-time checks of the WR-opcode table (emu/objects/wr_opcode.h)
// against the ibv numbering (emu/objects/types.h) and the BTH opcodes (wire/opcode.h). The
// table itself is constexpr in the header so the requester's lookups inline.
#include "emu/objects/wr_opcode.h"

namespace rnic::emu {
namespace {

namespace o = wire::op;
constexpr QpType kRc = QpType::kRc, kUc = QpType::kUc, kUd = QpType::kUd;

// Validity per QP type (IBA 10.8.3; rdma-core's rxe accepts the same sets).
static_assert(wr_valid(kUd, WrOpcode::kSend) && wr_valid(kUd, WrOpcode::kSendWithImm));
static_assert(!wr_valid(kUd, WrOpcode::kRdmaWrite) && !wr_valid(kUd, WrOpcode::kSendWithInv) &&
              !wr_valid(kUd, WrOpcode::kLocalInv) && !wr_valid(kUd, WrOpcode::kRdmaRead));
static_assert(!wr_valid(kUc, WrOpcode::kSendWithInv) && wr_valid(kRc, WrOpcode::kSendWithInv));
static_assert(wr_valid(kUc, WrOpcode::kRdmaWriteWithImm) && !wr_valid(kUc, WrOpcode::kRdmaRead) &&
              !wr_valid(kUc, WrOpcode::kAtomicCmpAndSwp) && !wr_valid(kUc, WrOpcode::kAtomicWrite));
static_assert(wr_valid(kRc, WrOpcode::kAtomicWrite) && !wr_valid(kRc, WrOpcode::kTso) &&
              !wr_valid(kRc, WrOpcode::kDriver1) && !wr_valid(kRc, static_cast<WrOpcode>(12)) &&
              !wr_valid(kRc, static_cast<WrOpcode>(200)));

// One is_atomic: CMP_AND_SWP and FETCH_AND_ADD; ATOMIC_WRITE is its own fact.
static_assert((wr_mask(kRc, WrOpcode::kAtomicCmpAndSwp) & kWrAtomicMask) &&
              (wr_mask(kRc, WrOpcode::kAtomicFetchAndAdd) & kWrAtomicMask) &&
              !(wr_mask(kRc, WrOpcode::kAtomicWrite) & kWrAtomicMask) &&
              !(wr_mask(kRc, WrOpcode::kRdmaRead) & kWrAtomicMask));
// Initiator depth: READ, the two atomics, ATOMIC_WRITE and FLUSH (the non-posted requests).
static_assert((wr_mask(kRc, WrOpcode::kRdmaRead) & kWrRdAtomicMask) &&
              (wr_mask(kRc, WrOpcode::kAtomicWrite) & kWrRdAtomicMask) &&
              (wr_mask(kRc, WrOpcode::kFlush) & kWrRdAtomicMask) &&
              !(wr_mask(kRc, WrOpcode::kRdmaWrite) & kWrRdAtomicMask) &&
              !(wr_mask(kRc, WrOpcode::kSend) & kWrRdAtomicMask));

// BTH opcodes: class bits and families.
static_assert(wr_bth_opcode(kRc, WrOpcode::kSend, true, true) == o::kRcSendOnly);
static_assert(wr_bth_opcode(kUc, WrOpcode::kSend, true, false) == o::kUcSendFirst);
static_assert(wr_bth_opcode(kUd, WrOpcode::kSend, true, true) == o::kUdSendOnly);
static_assert(wr_bth_opcode(kUd, WrOpcode::kSendWithImm, true, true) == o::kUdSendOnlyWithImm);
static_assert(wr_bth_opcode(kRc, WrOpcode::kSendWithInv, false, true) == o::kRcSendLastWithInv);
static_assert(wr_bth_opcode(kUc, WrOpcode::kRdmaWriteWithImm, false, true) ==
              o::kUcRdmaWriteLastWithImm);
static_assert(wr_bth_opcode(kRc, WrOpcode::kRdmaWrite, false, false) == o::kRcRdmaWriteMiddle);
static_assert(wr_bth_opcode(kRc, WrOpcode::kRdmaRead, true, true) == o::kRcRdmaReadRequest);
static_assert(wr_bth_opcode(kRc, WrOpcode::kAtomicFetchAndAdd, true, true) == o::kRcFetchAdd);
static_assert(wr_bth_opcode(kRc, WrOpcode::kAtomicWrite, true, true) == o::kRcAtomicWrite);
static_assert(wr_bth_opcode(kRc, WrOpcode::kFlush, true, true) == o::kRcFlush);
static_assert(wr_valid(kRc, WrOpcode::kFlush) && !wr_valid(kUc, WrOpcode::kFlush) &&
              !wr_valid(kUd, WrOpcode::kFlush) && !wr_valid(kUd, WrOpcode::kAtomicWrite));

// WC opcodes (ibv_wc_opcode of each ibv_wr_opcode).
static_assert(wc_opcode_for(WrOpcode::kRdmaWriteWithImm) == WcOpcode::kRdmaWrite);
static_assert(wc_opcode_for(WrOpcode::kSendWithInv) == WcOpcode::kSend);
static_assert(wc_opcode_for(WrOpcode::kAtomicCmpAndSwp) == WcOpcode::kCompSwap);
static_assert(wc_opcode_for(WrOpcode::kBindMw) == WcOpcode::kBindMw);

// Every valid row says it is valid; an opcode has the same facts on every QP type that takes
// it (RC/UC/UD differ only in validity today); rows that send packets name their BTH opcodes.
constexpr bool rows_consistent() {
  for (int i = 0; i < kNumWrOpcodes; ++i) {
    const WrOpcodeInfo& r = wr_detail::kTable[i];
    uint32_t facts = 0;
    for (uint32_t m : r.mask) {
      if (m == 0) continue;
      if (!(m & kWrValidMask)) return false;
      if (facts != 0 && m != facts) return false;
      facts = m;
    }
    if (facts != 0 && r.name == nullptr) return false;
    const bool sends = facts != 0 && !(facts & kWrLocalMask);
    if (sends && r.bth[kWrPktOnly] == kWrNoBth) return false;
    if ((facts & kWrLocalMask) && r.bth[kWrPktOnly] != kWrNoBth) return false;
  }
  return true;
}
static_assert(rows_consistent());

}  // namespace
}  // namespace rnic::emu
