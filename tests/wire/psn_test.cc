// Tests for 24-bit PSN arithmetic: wrap-around add, signed distance and window compares.
#include "wire/psn.h"

#include <gtest/gtest.h>

namespace rnic::wire {
namespace {

TEST(PsnTest, AddWraps) {
  EXPECT_EQ(psn_add(0, 1), 1u);
  EXPECT_EQ(psn_add(0xffffff, 1), 0u);
  EXPECT_EQ(psn_add(0xfffff0, 0x20), 0x10u);
  EXPECT_EQ(psn_add(5, 0xffffffffu), 4u);  // adding -1
  EXPECT_EQ(psn_add(0, 0xffffffffu), 0xffffffu);
  EXPECT_EQ(psn_add(0x123456, 0x1000000), 0x123456u);  // full cycle
}

TEST(PsnTest, DiffIsSignedAndWrapSafe) {
  EXPECT_EQ(psn_diff(10, 3), 7);
  EXPECT_EQ(psn_diff(3, 10), -7);
  EXPECT_EQ(psn_diff(0, 0xffffff), 1);
  EXPECT_EQ(psn_diff(0xffffff, 0), -1);
  EXPECT_EQ(psn_diff(2, 0xfffffe), 4);
  EXPECT_EQ(psn_diff(0x7fffff, 0), 0x7fffff);
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);  // exactly half: treated as "before"
  EXPECT_EQ(psn_diff(0x123456, 0x123456), 0);
  // Upper bits of the inputs are ignored.
  EXPECT_EQ(psn_diff(0xff000005, 0x00000003), 2);
}

TEST(PsnTest, DiffInvertsAdd) {
  for (uint32_t base : {0u, 1u, 0x7fffffu, 0x800000u, 0xfffff0u, 0xffffffu}) {
    for (int32_t d : {0, 1, -1, 100, -100, 0x7fffff, -0x800000}) {
      EXPECT_EQ(psn_diff(psn_add(base, static_cast<uint32_t>(d)), base), d)
          << base << " " << d;
    }
  }
}

TEST(PsnTest, ComparisonsAcrossWrap) {
  EXPECT_TRUE(psn_lt(0xffffff, 0));
  EXPECT_TRUE(psn_gt(0, 0xffffff));
  EXPECT_TRUE(psn_le(0xfffffe, 0xfffffe));
  EXPECT_TRUE(psn_ge(0xfffffe, 0xfffffe));
  EXPECT_FALSE(psn_lt(5, 5));
  EXPECT_FALSE(psn_gt(5, 5));
  EXPECT_TRUE(psn_lt(0xfff000, 0x000100));
  EXPECT_FALSE(psn_ge(0xfff000, 0x000100));
  EXPECT_EQ(psn_compare(1, 2), -1);
  EXPECT_EQ(psn_compare(2, 1), 1);
  EXPECT_EQ(psn_compare(7, 7), 0);
  EXPECT_EQ(psn_compare(0, 0xffffff), 1);
  // Window boundary: 2^23 - 1 ahead is "after", 2^23 ahead is "before".
  EXPECT_TRUE(psn_gt(0x7fffff, 0));
  EXPECT_TRUE(psn_lt(0x800000, 0));
}

}  // namespace
}  // namespace rnic::wire
