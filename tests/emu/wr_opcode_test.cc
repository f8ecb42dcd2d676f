// tests/emu/wr_opcode_test.cc: the WR-opcode table (emu/objects/wr_opcode.h) row by row — which
// QP types take each opcode, its facts, its WC opcode — and its BTH opcodes checked against
// wire's own opcode table (wire/opcode.h: header mask, transport class, first/last bits).
#include <gtest/gtest.h>

#include <utility>

#include <cstring>
#include <set>

#include "emu/objects/wr_opcode.h"
#include "tests/emu/emu_test_util.h"
#include "wire/opcode.h"

namespace rnic::emu {
namespace {

constexpr QpType kTypes[] = {QpType::kRc, QpType::kUc, QpType::kUd};
constexpr WrOpcode kAll[] = {
    WrOpcode::kRdmaWrite,        WrOpcode::kRdmaWriteWithImm, WrOpcode::kSend,
    WrOpcode::kSendWithImm,      WrOpcode::kRdmaRead,         WrOpcode::kAtomicCmpAndSwp,
    WrOpcode::kAtomicFetchAndAdd, WrOpcode::kLocalInv,        WrOpcode::kBindMw,
    WrOpcode::kSendWithInv,      WrOpcode::kTso,              WrOpcode::kDriver1,
    WrOpcode::kFlush,            WrOpcode::kAtomicWrite};

// Expected validity, written out independently of the table (IBA 10.8.3; rxe's
// rxe_wr_opcode_info gives the same sets for RC/UC/UD).
bool expect_valid(QpType t, WrOpcode op) {
  static const std::set<WrOpcode> kUd = {WrOpcode::kSend, WrOpcode::kSendWithImm};
  static const std::set<WrOpcode> kUc = {
      WrOpcode::kSend,     WrOpcode::kSendWithImm, WrOpcode::kRdmaWrite,
      WrOpcode::kRdmaWriteWithImm, WrOpcode::kLocalInv, WrOpcode::kBindMw};  // no SEND_WITH_INV
  if (t == QpType::kUd) return kUd.count(op) != 0;
  if (t == QpType::kUc) return kUc.count(op) != 0;
  return op != WrOpcode::kTso && op != WrOpcode::kDriver1;
}

TEST(WrOpcodeTable, ValidityPerQpType) {
  for (QpType t : kTypes)
    for (WrOpcode op : kAll)
      EXPECT_EQ(wr_valid(t, op), expect_valid(t, op))
          << "type " << int(t) << " op " << wr_opcode_name(op);
  for (int v : {12, 13, 16, 100, 255})
    for (QpType t : kTypes) EXPECT_FALSE(wr_valid(t, static_cast<WrOpcode>(v))) << v;
}

// The names are ibv_wr_opcode's without "IBV_WR_" (verbs.h), written out here independently.
TEST(WrOpcodeTable, NamesAreTheVerbsNames) {
  const std::pair<WrOpcode, const char*> kExpected[] = {
      {WrOpcode::kRdmaWrite, "RDMA_WRITE"},
      {WrOpcode::kRdmaWriteWithImm, "RDMA_WRITE_WITH_IMM"},
      {WrOpcode::kSend, "SEND"},
      {WrOpcode::kSendWithImm, "SEND_WITH_IMM"},
      {WrOpcode::kRdmaRead, "RDMA_READ"},
      {WrOpcode::kAtomicCmpAndSwp, "ATOMIC_CMP_AND_SWP"},
      {WrOpcode::kAtomicFetchAndAdd, "ATOMIC_FETCH_AND_ADD"},
      {WrOpcode::kLocalInv, "LOCAL_INV"},
      {WrOpcode::kBindMw, "BIND_MW"},
      {WrOpcode::kSendWithInv, "SEND_WITH_INV"},
      {WrOpcode::kTso, "TSO"},
      {WrOpcode::kDriver1, "DRIVER1"},
      {WrOpcode::kFlush, "FLUSH"},
      {WrOpcode::kAtomicWrite, "ATOMIC_WRITE"},
  };
  for (const auto& [op, name] : kExpected) {
    ASSERT_NE(wr_opcode_info(op).name, nullptr) << name;
    EXPECT_STREQ(wr_opcode_name(op), name);
  }
  EXPECT_STREQ(wr_opcode_name(static_cast<WrOpcode>(200)), "WR_OPCODE_?");
}

TEST(WrOpcodeTable, OneAtomicOneReadOneInitiatorDepth) {
  for (WrOpcode op : kAll) {
    const uint32_t m = wr_mask(QpType::kRc, op);
    const bool cas_faa = op == WrOpcode::kAtomicCmpAndSwp || op == WrOpcode::kAtomicFetchAndAdd;
    EXPECT_EQ((m & kWrAtomicMask) != 0, cas_faa) << wr_opcode_name(op);
    EXPECT_EQ((m & kWrReadMask) != 0, op == WrOpcode::kRdmaRead) << wr_opcode_name(op);
    // Initiator depth: every non-posted request (READ, atomics, ATOMIC_WRITE, FLUSH).
    EXPECT_EQ((m & kWrRdAtomicMask) != 0, cas_faa || op == WrOpcode::kRdmaRead ||
                                              op == WrOpcode::kAtomicWrite ||
                                              op == WrOpcode::kFlush);
    EXPECT_EQ((m & kWrLocalWriteMask) != 0, cas_faa || op == WrOpcode::kRdmaRead);
    EXPECT_EQ((m & kWrCompareMask) != 0, op == WrOpcode::kAtomicCmpAndSwp);
    EXPECT_EQ((m & kWrLocalMask) != 0, op == WrOpcode::kLocalInv || op == WrOpcode::kBindMw);
    EXPECT_EQ(m & kWrUnimplementedMask, 0u) << wr_opcode_name(op);  // every valid op runs
    EXPECT_EQ((m & kWrEmptyReadRespMask) != 0,
              op == WrOpcode::kAtomicWrite || op == WrOpcode::kFlush);
  }
  // Inline: the SEND and WRITE families only (rxe WR_INLINE_MASK).
  for (WrOpcode op : kAll) {
    const bool inl = op == WrOpcode::kSend || op == WrOpcode::kSendWithImm ||
                     op == WrOpcode::kSendWithInv || op == WrOpcode::kRdmaWrite ||
                     op == WrOpcode::kRdmaWriteWithImm;
    EXPECT_EQ((wr_mask(QpType::kRc, op) & kWrInlineMask) != 0, inl) << wr_opcode_name(op);
  }
}

TEST(WrOpcodeTable, WcOpcodes) {
  const std::pair<WrOpcode, WcOpcode> kWant[] = {
      {WrOpcode::kRdmaWrite, WcOpcode::kRdmaWrite}, {WrOpcode::kRdmaWriteWithImm, WcOpcode::kRdmaWrite},
      {WrOpcode::kSend, WcOpcode::kSend},           {WrOpcode::kSendWithImm, WcOpcode::kSend},
      {WrOpcode::kSendWithInv, WcOpcode::kSend},    {WrOpcode::kRdmaRead, WcOpcode::kRdmaRead},
      {WrOpcode::kAtomicCmpAndSwp, WcOpcode::kCompSwap},
      {WrOpcode::kAtomicFetchAndAdd, WcOpcode::kFetchAdd},
      {WrOpcode::kLocalInv, WcOpcode::kLocalInv},   {WrOpcode::kBindMw, WcOpcode::kBindMw},
      {WrOpcode::kTso, WcOpcode::kTso},             {WrOpcode::kAtomicWrite, WcOpcode::kAtomicWrite},
      {WrOpcode::kFlush, WcOpcode::kFlush},
      {WrOpcode::kDriver1, WcOpcode::kSend}};
  for (auto [wr, wc] : kWant) EXPECT_EQ(wc_opcode_for(wr), wc) << wr_opcode_name(wr);
}

// Every BTH opcode the requester can emit is a real opcode whose wire facts agree with the
// WR opcode's: transport class, start/end bits, SEND/WRITE/READ/ATOMIC class, RETH on a
// WRITE's first packet, ImmDt/IETH on the last, requester direction.
TEST(WrOpcodeTable, BthOpcodesAgreeWithTheWireTable) {
  int checked = 0;
  for (QpType t : kTypes) {
    for (WrOpcode op : kAll) {
      const uint32_t m = wr_mask(t, op);
      if (m == 0 || (m & (kWrLocalMask | kWrUnimplementedMask))) continue;
      for (int pos = 0; pos < 4; ++pos) {
        const bool first = pos == 0 || pos == 3, last = pos >= 2;
        if (t == QpType::kUd && !(first && last)) continue;  // a UD message is one packet
        if ((m & (kWrReadMask | kWrAtomicMask)) && !(first && last)) continue;
        const uint8_t bth = wr_bth_opcode(t, op, first, last);
        const wire::OpcodeInfo& w = wire::opcode_info(bth);
        SCOPED_TRACE(std::string(wr_opcode_name(op)) + " type " + std::to_string(int(t)) +
                     " pos " + std::to_string(pos));
        ASSERT_TRUE(wire::opcode_valid(bth));
        ++checked;
        EXPECT_EQ(wire::is_rc(bth), t == QpType::kRc);
        EXPECT_EQ(wire::is_uc(bth), t == QpType::kUc);
        EXPECT_EQ(wire::is_ud(bth), t == QpType::kUd);
        EXPECT_TRUE(w.mask & wire::kReqMask);
        EXPECT_EQ((w.mask & wire::kSendMask) != 0, (m & kWrSendMask) != 0);
        EXPECT_EQ((w.mask & wire::kWriteMask) != 0, (m & kWrWriteMask) != 0);
        EXPECT_EQ((w.mask & wire::kReadMask) != 0, (m & kWrReadMask) != 0);
        EXPECT_EQ((w.mask & wire::kAtomicMask) != 0, (m & kWrAtomicMask) != 0);
        EXPECT_EQ((w.mask & wire::kAtomicWriteMask) != 0, (m & kWrAtomicWriteMask) != 0);
        EXPECT_EQ((w.mask & wire::kFlushMask) != 0, (m & kWrFlushMask) != 0);
        if (m & (kWrSendMask | kWrWriteMask)) {
          EXPECT_EQ((w.mask & wire::kStartMask) != 0, first);
          EXPECT_EQ((w.mask & wire::kEndMask) != 0, last);
          EXPECT_EQ((w.mask & wire::kImmMask) != 0, last && (m & kWrImmMask));
          EXPECT_EQ((w.mask & wire::kIethMask) != 0, last && (m & kWrInvMask));
          EXPECT_EQ((w.mask & wire::kRethMask) != 0, first && (m & kWrWriteMask));
          EXPECT_TRUE(w.mask & wire::kPayloadMask);
        } else {
          EXPECT_TRUE(w.mask & (wire::kRethMask | wire::kAtmEthMask));  // remote address
          EXPECT_TRUE(m & kWrRemoteAddrMask);
        }
        EXPECT_EQ((w.mask & wire::kDethMask) != 0, t == QpType::kUd);
      }
    }
  }
  // RC: 3 SEND x 4 + 2 WRITE x 4 + READ + 2 atomics + ATOMIC_WRITE x 4 + FLUSH x 4;
  // UC: 2 SEND x 4 + 2 WRITE x 4; UD: 2.
  EXPECT_EQ(checked, (12 + 8 + 3 + 8) + (8 + 8) + 2);
}

// post_send answers from the table: every (QP type, opcode) pair the table refuses is EINVAL
// at post time, every pair it takes is queued (8-byte SGE, UD with an AH).
TEST(WrOpcodeTable, PostSendFollowsTheTable) {
  testing::Env env;
  AhAttr aa = testing::peer_ah(9);
  auto ah = *env.dev->create_ah(env.pd, aa);
  Sge s{0, 8, 0};
  for (QpType t : kTypes) {
    for (WrOpcode op : kAll) {
      auto qp = env.qp(t);
      testing::drive_to(*env.dev, qp, QpState::kRts);
      SendWr w;
      w.wr_id = 1;
      w.sg_list = &s;
      w.num_sge = 1;
      w.opcode = op;
      w.ud.ah = ah.get();
      if (op == WrOpcode::kFlush) {  // no gather list; a valid placement type
        w.num_sge = 0;
        w.flush.type = kFlushGlobal;
      }
      int bad = -1;
      Status st = qp->post_send(&w, 1, &bad);
      EXPECT_EQ(st.is_ok(), wr_valid(t, op)) << qp_type_name(t) << " " << wr_opcode_name(op);
      if (!wr_valid(t, op)) {
        EXPECT_EQ(st, Errc::kInval);
      }
    }
  }
}

}  // namespace
}  // namespace rnic::emu
