// Tests for the opcode table: presence of every RC/UC/UD/CNP opcode, row consistency, offsets.
#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "wire/hdr.h"

namespace rnic::wire {
namespace {

struct Expected {
  uint8_t opcode;
  const char* name;
  uint8_t length;
};

// Every opcode softrnic knows, with the header length from IBA Vol 1 (BTH = 12).
const std::vector<Expected> kExpected = {
    {op::kRcSendFirst, "RC_SEND_FIRST", 12},
    {op::kRcSendMiddle, "RC_SEND_MIDDLE", 12},
    {op::kRcSendLast, "RC_SEND_LAST", 12},
    {op::kRcSendLastWithImm, "RC_SEND_LAST_WITH_IMMEDIATE", 16},
    {op::kRcSendOnly, "RC_SEND_ONLY", 12},
    {op::kRcSendOnlyWithImm, "RC_SEND_ONLY_WITH_IMMEDIATE", 16},
    {op::kRcRdmaWriteFirst, "RC_RDMA_WRITE_FIRST", 28},
    {op::kRcRdmaWriteMiddle, "RC_RDMA_WRITE_MIDDLE", 12},
    {op::kRcRdmaWriteLast, "RC_RDMA_WRITE_LAST", 12},
    {op::kRcRdmaWriteLastWithImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16},
    {op::kRcRdmaWriteOnly, "RC_RDMA_WRITE_ONLY", 28},
    {op::kRcRdmaWriteOnlyWithImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32},
    {op::kRcRdmaReadRequest, "RC_RDMA_READ_REQUEST", 28},
    {op::kRcRdmaReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", 16},
    {op::kRcRdmaReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", 12},
    {op::kRcRdmaReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", 16},
    {op::kRcRdmaReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", 16},
    {op::kRcAcknowledge, "RC_ACKNOWLEDGE", 16},
    {op::kRcAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", 24},
    {op::kRcCompareSwap, "RC_COMPARE_SWAP", 40},
    {op::kRcFetchAdd, "RC_FETCH_ADD", 40},
    {op::kRcSendLastWithInv, "RC_SEND_LAST_WITH_INVALIDATE", 16},
    {op::kRcSendOnlyWithInv, "RC_SEND_ONLY_WITH_INVALIDATE", 16},
    {op::kRcFlush, "RC_FLUSH", 32},
    {op::kRcAtomicWrite, "RC_ATOMIC_WRITE", 28},
    {op::kUcSendFirst, "UC_SEND_FIRST", 12},
    {op::kUcSendMiddle, "UC_SEND_MIDDLE", 12},
    {op::kUcSendLast, "UC_SEND_LAST", 12},
    {op::kUcSendLastWithImm, "UC_SEND_LAST_WITH_IMMEDIATE", 16},
    {op::kUcSendOnly, "UC_SEND_ONLY", 12},
    {op::kUcSendOnlyWithImm, "UC_SEND_ONLY_WITH_IMMEDIATE", 16},
    {op::kUcRdmaWriteFirst, "UC_RDMA_WRITE_FIRST", 28},
    {op::kUcRdmaWriteMiddle, "UC_RDMA_WRITE_MIDDLE", 12},
    {op::kUcRdmaWriteLast, "UC_RDMA_WRITE_LAST", 12},
    {op::kUcRdmaWriteLastWithImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16},
    {op::kUcRdmaWriteOnly, "UC_RDMA_WRITE_ONLY", 28},
    {op::kUcRdmaWriteOnlyWithImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32},
    {op::kUdSendOnly, "UD_SEND_ONLY", 20},
    {op::kUdSendOnlyWithImm, "UD_SEND_ONLY_WITH_IMMEDIATE", 24},
    {op::kCnp, "CNP", 28},
    // XRC (IBA Table 38): RC's rows at 0xA0 | op; requests carry the 4-byte XRCETH.
    {0xa0, "XRC_SEND_FIRST", 16},
    {0xa1, "XRC_SEND_MIDDLE", 16},
    {0xa2, "XRC_SEND_LAST", 16},
    {0xa3, "XRC_SEND_LAST_WITH_IMMEDIATE", 20},
    {0xa4, "XRC_SEND_ONLY", 16},
    {0xa5, "XRC_SEND_ONLY_WITH_IMMEDIATE", 20},
    {0xa6, "XRC_RDMA_WRITE_FIRST", 32},
    {0xa7, "XRC_RDMA_WRITE_MIDDLE", 16},
    {0xa8, "XRC_RDMA_WRITE_LAST", 16},
    {0xa9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 20},
    {0xaa, "XRC_RDMA_WRITE_ONLY", 32},
    {0xab, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 36},
    {0xac, "XRC_RDMA_READ_REQUEST", 32},
    {0xad, "XRC_RDMA_READ_RESPONSE_FIRST", 16},
    {0xae, "XRC_RDMA_READ_RESPONSE_MIDDLE", 12},
    {0xaf, "XRC_RDMA_READ_RESPONSE_LAST", 16},
    {0xb0, "XRC_RDMA_READ_RESPONSE_ONLY", 16},
    {0xb1, "XRC_ACKNOWLEDGE", 16},
    {0xb2, "XRC_ATOMIC_ACKNOWLEDGE", 24},
    {0xb3, "XRC_COMPARE_SWAP", 44},
    {0xb4, "XRC_FETCH_ADD", 44},
    {0xb6, "XRC_SEND_LAST_WITH_INVALIDATE", 20},
    {0xb7, "XRC_SEND_ONLY_WITH_INVALIDATE", 20},
};

TEST(OpcodeTest, OpcodeValuesMatchIba) {
  EXPECT_EQ(op::kRcCompareSwap, 0x13);
  EXPECT_EQ(op::kRcFetchAdd, 0x14);
  EXPECT_EQ(op::kRcSendLastWithInv, 0x16);
  EXPECT_EQ(op::kRcSendOnlyWithInv, 0x17);
  EXPECT_EQ(op::kRcFlush, 0x1c);
  EXPECT_EQ(op::kRcAtomicWrite, 0x1d);
  EXPECT_EQ(op::kUcSendFirst, 0x20);
  EXPECT_EQ(op::kUcRdmaWriteOnlyWithImm, 0x2b);
  EXPECT_EQ(op::kUdSendOnly, 0x64);
  EXPECT_EQ(op::kUdSendOnlyWithImm, 0x65);
  EXPECT_EQ(op::kCnp, 0x81);
  EXPECT_EQ(op::kXrcSendFirst, 0xa0);
  EXPECT_EQ(op::kXrcAcknowledge, 0xb1);
  EXPECT_EQ(op::kXrcSendOnlyWithInv, 0xb7);
}

TEST(OpcodeTest, EveryExpectedOpcodeHasItsRow) {
  for (const auto& e : kExpected) {
    const OpcodeInfo& info = opcode_info(e.opcode);
    ASSERT_NE(info.name, nullptr) << int(e.opcode);
    EXPECT_STREQ(info.name, e.name);
    EXPECT_EQ(info.length, e.length) << e.name;
    EXPECT_TRUE(opcode_valid(e.opcode));
  }
}

TEST(OpcodeTest, NothingElseIsValid) {
  std::set<uint8_t> expected;
  for (const auto& e : kExpected) expected.insert(e.opcode);
  for (int i = 0; i < 256; ++i) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(i));
    if (expected.count(static_cast<uint8_t>(i))) continue;
    EXPECT_EQ(info.name, nullptr) << i;
    EXPECT_EQ(info.mask, 0u) << i;
    EXPECT_FALSE(opcode_valid(static_cast<uint8_t>(i))) << i;
  }
  EXPECT_EQ(expected.size(), 63u);
}

TEST(OpcodeTest, RowsAreSelfConsistent) {
  const std::pair<uint32_t, std::pair<HdrType, size_t>> hdrs[] = {
      {kRethMask, {kHdrReth, kRethBytes}},       {kAethMask, {kHdrAeth, kAethBytes}},
      {kAtmEthMask, {kHdrAtmEth, kAtomicEthBytes}}, {kAtmAckMask, {kHdrAtmAck, kAtomicAckEthBytes}},
      {kIethMask, {kHdrIeth, kIethBytes}},       {kDethMask, {kHdrDeth, kDethBytes}},
      {kImmMask, {kHdrImmDt, kImmDtBytes}},      {kFethMask, {kHdrFeth, kFethBytes}},
      {kXrcEthMask, {kHdrXrcEth, kXrcEthBytes}},
  };
  for (const auto& e : kExpected) {
    const OpcodeInfo& info = opcode_info(e.opcode);
    SCOPED_TRACE(info.name);
    EXPECT_TRUE(info.mask & kBthMask);
    EXPECT_EQ(info.offset[kHdrBth], 0);
    EXPECT_EQ(info.offset[kHdrPayload], info.length);
    EXPECT_EQ(info.length % 4, 0);
    // Present headers tile [12, length) exactly (CNP: 16 reserved bytes at the end).
    std::vector<bool> covered(info.length, false);
    for (size_t i = 0; i < kBthBytes; ++i) covered[i] = true;
    for (const auto& [bit, h] : hdrs) {
      if (!(info.mask & bit)) continue;
      ASSERT_LE(info.offset[h.first] + h.second, info.length);
      for (size_t i = 0; i < h.second; ++i) {
        EXPECT_FALSE(covered[info.offset[h.first] + i]) << "overlap";
        covered[info.offset[h.first] + i] = true;
      }
    }
    if (info.mask & kCnpRsvdMask) {
      for (size_t i = kBthBytes; i < kBthBytes + kCnpRsvdBytes; ++i) covered[i] = true;
    }
    for (size_t i = 0; i < covered.size(); ++i) EXPECT_TRUE(covered[i]) << "gap at " << i;
    // Name-derived properties.
    std::string n = info.name;
    bool first = n.find("FIRST") != std::string::npos;
    bool middle = n.find("MIDDLE") != std::string::npos;
    bool last = n.find("LAST") != std::string::npos;
    if (n != "CNP") {
      EXPECT_EQ(bool(info.mask & kStartMask), !middle && !last) << n;
      EXPECT_EQ(bool(info.mask & kEndMask), !middle && !first) << n;
    }
    EXPECT_EQ(bool(info.mask & kMiddleMask), middle);
    EXPECT_EQ(bool(info.mask & kImmMask), n.find("IMMEDIATE") != std::string::npos);
    EXPECT_EQ(bool(info.mask & kIethMask), n.find("INVALIDATE") != std::string::npos);
    EXPECT_EQ(bool(info.mask & kSendMask), n.find("SEND") != std::string::npos);
    EXPECT_EQ(bool(info.mask & kWriteMask), n.find("RDMA_WRITE") != std::string::npos);
    EXPECT_EQ(bool(info.mask & kDethMask), is_ud(e.opcode));
    EXPECT_FALSE(info.mask & kLoopbackMask);
    EXPECT_FALSE((info.mask & kReqMask) && (info.mask & kAckMask));
  }
}

TEST(OpcodeTest, HeaderOffsetsOfMultiHeaderRows) {
  EXPECT_EQ(opcode_info(op::kRcRdmaWriteOnlyWithImm).offset[kHdrReth], 12);
  EXPECT_EQ(opcode_info(op::kRcRdmaWriteOnlyWithImm).offset[kHdrImmDt], 28);
  EXPECT_EQ(opcode_info(op::kRcAtomicAcknowledge).offset[kHdrAeth], 12);
  EXPECT_EQ(opcode_info(op::kRcAtomicAcknowledge).offset[kHdrAtmAck], 16);
  EXPECT_EQ(opcode_info(op::kRcCompareSwap).offset[kHdrAtmEth], 12);
  EXPECT_EQ(opcode_info(op::kRcFlush).offset[kHdrFeth], 12);
  EXPECT_EQ(opcode_info(op::kRcFlush).offset[kHdrReth], 16);
  EXPECT_EQ(opcode_info(op::kUdSendOnlyWithImm).offset[kHdrDeth], 12);
  EXPECT_EQ(opcode_info(op::kUdSendOnlyWithImm).offset[kHdrImmDt], 20);
  EXPECT_EQ(opcode_info(op::kRcSendOnlyWithInv).offset[kHdrIeth], 12);
  EXPECT_EQ(opcode_info(op::kRcRdmaReadResponseFirst).offset[kHdrAeth], 12);
}

TEST(OpcodeTest, OperationClassMasks) {
  EXPECT_TRUE(opcode_info(op::kRcCompareSwap).mask & kAtomicMask);
  EXPECT_TRUE(opcode_info(op::kRcFetchAdd).mask & kAtomicMask);
  EXPECT_TRUE(opcode_info(op::kRcAtomicWrite).mask & kAtomicWriteMask);
  EXPECT_TRUE(opcode_info(op::kRcAtomicWrite).mask & kPayloadMask);
  EXPECT_TRUE(opcode_info(op::kRcFlush).mask & kFlushMask);
  EXPECT_FALSE(opcode_info(op::kRcFlush).mask & kPayloadMask);
  EXPECT_TRUE(opcode_info(op::kRcRdmaReadRequest).mask & kReadMask);
  EXPECT_FALSE(opcode_info(op::kRcRdmaReadRequest).mask & kPayloadMask);
  EXPECT_TRUE(opcode_info(op::kRcRdmaReadResponseMiddle).mask & kAckMask);
  EXPECT_FALSE(opcode_info(op::kRcAcknowledge).mask & kPayloadMask);
  EXPECT_TRUE(opcode_info(op::kRcSendFirst).mask & kRwrMask);
  EXPECT_FALSE(opcode_info(op::kRcSendMiddle).mask & kRwrMask);
  EXPECT_TRUE(opcode_info(op::kRcRdmaWriteLastWithImm).mask & kRwrMask);
  EXPECT_TRUE(opcode_info(op::kRcRdmaWriteLastWithImm).mask & kCompMask);
  EXPECT_FALSE(opcode_info(op::kRcRdmaWriteLast).mask & kCompMask);
  EXPECT_TRUE(opcode_info(op::kCnp).mask & kCnpMask);
  EXPECT_FALSE(opcode_info(op::kCnp).mask & (kReqMask | kAckMask | kPayloadMask));
}

TEST(OpcodeTest, TransportClassHelpers) {
  EXPECT_TRUE(is_rc(op::kRcSendOnly));
  EXPECT_TRUE(is_rc(op::kRcAtomicWrite));
  EXPECT_FALSE(is_rc(op::kUcSendOnly));
  EXPECT_TRUE(is_uc(op::kUcRdmaWriteOnlyWithImm));
  EXPECT_TRUE(is_ud(op::kUdSendOnly));
  EXPECT_TRUE(is_ud(op::kUdSendOnlyWithImm));
  EXPECT_FALSE(is_ud(op::kCnp));
  EXPECT_TRUE(is_cnp(op::kCnp));
  EXPECT_FALSE(is_cnp(0x80));
  EXPECT_EQ(transport_class(op::kCnp), 4);
}

TEST(OpcodeTest, TableAccessorsAgree) {
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(&opcode_table()[i], &opcode_info(static_cast<uint8_t>(i)));
  }
}

}  // namespace
}  // namespace rnic::wire
