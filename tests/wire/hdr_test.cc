// Tests for the header views: exact wire bytes per field, setters leave neighbours intact,
// byte-order helpers and AETH syndrome helpers.
#include "wire/hdr.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "wire/byteorder.h"

namespace rnic::wire {
namespace {

TEST(ByteOrderTest, LoadsAndStoresAreBigEndian) {
  uint8_t b[8] = {};
  store_be16(b, 0x1234);
  EXPECT_EQ(b[0], 0x12);
  EXPECT_EQ(b[1], 0x34);
  EXPECT_EQ(load_be16(b), 0x1234);
  store_be24(b, 0xffabcdef);  // only the low 24 bits
  EXPECT_EQ(b[0], 0xab);
  EXPECT_EQ(b[2], 0xef);
  EXPECT_EQ(load_be24(b), 0xabcdefu);
  store_be32(b, 0xdeadbeef);
  EXPECT_EQ(b[0], 0xde);
  EXPECT_EQ(b[3], 0xef);
  EXPECT_EQ(load_be32(b), 0xdeadbeefu);
  store_be64(b, 0x0102030405060708ull);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[i], i + 1);
  EXPECT_EQ(load_be64(b), 0x0102030405060708ull);
  store_le32(b, 0x11223344);
  EXPECT_EQ(b[0], 0x44);
  EXPECT_EQ(load_le32(b), 0x11223344u);
  static_assert(load_be16(std::array<uint8_t, 2>{0xab, 0xcd}.data()) == 0xabcd);
}

TEST(BthTest, DecodesKnownBytes) {
  // opcode 0x04, SE=1 M=0 PadCnt=2 TVer=0, P_Key 0xffff, FECN=0 BECN=1, QP 0x000118,
  // AckReq=1, PSN 0xabcdef.
  const uint8_t b[12] = {0x04, 0xa0, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x80, 0xab, 0xcd, 0xef};
  ConstBth h(b);
  EXPECT_EQ(h.opcode(), 0x04);
  EXPECT_TRUE(h.se());
  EXPECT_FALSE(h.mig());
  EXPECT_EQ(h.pad_cnt(), 2);
  EXPECT_EQ(h.tver(), 0);
  EXPECT_EQ(h.pkey(), 0xffff);
  EXPECT_FALSE(h.fecn());
  EXPECT_TRUE(h.becn());
  EXPECT_EQ(h.resv8a(), 0x40);
  EXPECT_EQ(h.dest_qp(), 0x118u);
  EXPECT_TRUE(h.ack_req());
  EXPECT_EQ(h.psn(), 0xabcdefu);
}

TEST(BthTest, SettersWriteExactBytesAndKeepNeighbours) {
  uint8_t b[12];
  std::memset(b, 0, sizeof(b));
  Bth h(b);
  h.set_opcode(0x81);
  h.set_se(true);
  h.set_mig(true);
  h.set_pad_cnt(3);
  h.set_tver(0x5);
  h.set_pkey(0x8001);
  h.set_fecn(true);
  h.set_becn(true);
  h.set_dest_qp(0x12345678);  // truncated to 24 bits
  h.set_ack_req(true);
  h.set_psn(0xfedcba98);
  const uint8_t want[12] = {0x81, 0xf5, 0x80, 0x01, 0xc0, 0x34, 0x56, 0x78, 0x80, 0xdc, 0xba, 0x98};
  EXPECT_EQ(0, std::memcmp(b, want, 12));
  h.set_pad_cnt(1);
  EXPECT_EQ(b[1], 0xd5);  // SE, M, TVer untouched
  h.set_se(false);
  EXPECT_EQ(b[1], 0x55);
  h.set_tver(0);
  EXPECT_EQ(b[1], 0x50);
  h.set_fecn(false);
  EXPECT_EQ(b[4], 0x40);
  h.set_ack_req(false);
  EXPECT_EQ(b[8], 0x00);
  EXPECT_EQ(h.psn(), 0xdcba98u);
  h.set_dest_qp(0);
  EXPECT_EQ(b[4], 0x40);  // BECN survives a QP write
}

TEST(RethTest, Fields) {
  uint8_t b[kRethBytes] = {};
  Reth r(b);
  r.set_va(0x0011223344556677ull);
  r.set_rkey(0x89abcdef);
  r.set_dma_len(0x00010000);
  const uint8_t want[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                            0x89, 0xab, 0xcd, 0xef, 0x00, 0x01, 0x00, 0x00};
  EXPECT_EQ(0, std::memcmp(b, want, 16));
  ConstReth c(b);
  EXPECT_EQ(c.va(), 0x0011223344556677ull);
  EXPECT_EQ(c.rkey(), 0x89abcdefu);
  EXPECT_EQ(c.dma_len(), 0x10000u);
}

TEST(AethTest, FieldsAndSyndromes) {
  uint8_t b[kAethBytes] = {};
  Aeth a(b);
  a.set_syndrome(aeth::nak(aeth::kNakRemoteAccessError));
  a.set_msn(0x123456);
  EXPECT_EQ(b[0], 0x62);
  EXPECT_EQ(b[1], 0x12);
  EXPECT_EQ(b[3], 0x56);
  EXPECT_EQ(a.msn(), 0x123456u);
  EXPECT_TRUE(aeth::is_nak(a.syndrome()));
  EXPECT_EQ(aeth::value(a.syndrome()), aeth::kNakRemoteAccessError);
  EXPECT_EQ(aeth::ack(aeth::kCreditInvalid), 0x1f);
  EXPECT_TRUE(aeth::is_ack(0x1f));
  EXPECT_EQ(aeth::rnr_nak(14), 0x2e);
  EXPECT_TRUE(aeth::is_rnr_nak(0x2e));
  EXPECT_FALSE(aeth::is_ack(0x2e));
  EXPECT_EQ(aeth::nak(aeth::kNakPsnSeqError), 0x60);
  EXPECT_EQ(aeth::nak(aeth::kNakInvalidRequest), 0x61);
  EXPECT_EQ(aeth::nak(aeth::kNakRemoteOperationalError), 0x63);
  EXPECT_EQ(aeth::type(0x40), aeth::kTypeReserved);
}

TEST(AtomicEthTest, Fields) {
  uint8_t b[kAtomicEthBytes] = {};
  AtomicEth a(b);
  a.set_va(0x1000);
  a.set_rkey(0x42);
  a.set_swap_add(0x0102030405060708ull);
  a.set_compare(0x1112131415161718ull);
  EXPECT_EQ(b[7], 0x00);
  EXPECT_EQ(b[6], 0x10);
  EXPECT_EQ(b[11], 0x42);
  EXPECT_EQ(b[12], 0x01);
  EXPECT_EQ(b[19], 0x08);
  EXPECT_EQ(b[20], 0x11);
  EXPECT_EQ(b[27], 0x18);
  ConstAtomicEth c(b);
  EXPECT_EQ(c.va(), 0x1000u);
  EXPECT_EQ(c.rkey(), 0x42u);
  EXPECT_EQ(c.swap_add(), 0x0102030405060708ull);
  EXPECT_EQ(c.compare(), 0x1112131415161718ull);
}

TEST(AtomicAckEthTest, Fields) {
  uint8_t b[kAtomicAckEthBytes] = {};
  AtomicAckEth a(b);
  a.set_orig(0xfffffffffffffffeull);
  EXPECT_EQ(b[0], 0xff);
  EXPECT_EQ(b[7], 0xfe);
  EXPECT_EQ(a.orig(), 0xfffffffffffffffeull);
}

TEST(DethTest, Fields) {
  uint8_t b[kDethBytes];
  std::memset(b, 0xee, sizeof(b));
  Deth d(b);
  d.set_qkey(0x80010000);
  d.set_src_qp(0xabcdef);
  const uint8_t want[8] = {0x80, 0x01, 0x00, 0x00, 0x00, 0xab, 0xcd, 0xef};
  EXPECT_EQ(0, std::memcmp(b, want, 8));
  EXPECT_EQ(d.qkey(), 0x80010000u);
  EXPECT_EQ(d.src_qp(), 0xabcdefu);
}

TEST(SmallHeadersTest, ImmIethFeth) {
  uint8_t b[4] = {};
  ImmDt(b).set_imm(0xa1b2c3d4);
  EXPECT_EQ(b[0], 0xa1);
  EXPECT_EQ(ConstImmDt(b).imm(), 0xa1b2c3d4u);
  Ieth(b).set_inv_rkey(0x01020304);
  EXPECT_EQ(b[3], 0x04);
  EXPECT_EQ(ConstIeth(b).inv_rkey(), 0x01020304u);
  EXPECT_EQ(ConstIeth(b).rkey(), 0x01020304u);
  Feth f(b);
  f.set_sel_plt(2, 0x9);
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[3], 0x29);
  EXPECT_EQ(f.sel(), 2);
  EXPECT_EQ(f.plt(), 0x9);
  EXPECT_EQ(f.raw(), 0x29u);
}

TEST(HdrConstantsTest, Sizes) {
  EXPECT_EQ(kBthBytes, 12u);
  EXPECT_EQ(kRethBytes, 16u);
  EXPECT_EQ(kAethBytes, 4u);
  EXPECT_EQ(kAtomicEthBytes, 28u);
  EXPECT_EQ(kAtomicAckEthBytes, 8u);
  EXPECT_EQ(kDethBytes, 8u);
  EXPECT_EQ(kIcrcBytes, 4u);
  EXPECT_EQ(kRoceUdpPort, 4791);
}

}  // namespace
}  // namespace rnic::wire
