// Strong unit types: decimal and binary prefixes are distinct, and quantities of different kinds
// combine only through the divisions units.hpp defines. Expected values are the SI / IEC
// definitions (1 GB = 1e9 B, 1 GiB = 2^30 B, 1 Gb/s = 1e9 bit/s = 1.25e8 B/s).

#include <type_traits>

#include <gtest/gtest.h>

#include "trainplan/costmodel/units.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

TEST(Bytes, GigabyteAndGibibyteAreDifferentUnits) {
  EXPECT_DOUBLE_EQ(Bytes::gb(1).value(), 1e9);
  EXPECT_DOUBLE_EQ(Bytes::gib(1).value(), 1073741824.0);  // 2^30
  EXPECT_DOUBLE_EQ(Bytes::mib(1).value(), 1048576.0);     // 2^20
  EXPECT_NE(Bytes::gb(1).value(), Bytes::gib(1).value());
  // 80 GiB (an A100 80GB as nvidia-smi reports it) is 85.9 GB, not 80.
  EXPECT_NEAR(Bytes::gib(80).in_gb(), 85.899345920, 1e-9);
  EXPECT_NEAR(Bytes::gb(80).in_gib(), 74.505805969, 1e-9);
}

TEST(Bytes, ConversionsRoundTrip) {
  const double values[] = {0.0, 1.0, 0.5, 141.0, 1e6};
  for (double x : values) {
    EXPECT_DOUBLE_EQ(Bytes::gb(x).in_gb(), x);
    EXPECT_DOUBLE_EQ(Bytes::gib(x).in_gib(), x);
  }
}

TEST(Division, BytesOverBytesPerSecondGivesSeconds) {
  static_assert(std::is_same_v<decltype(Bytes::gb(1) / BytesPerSecond::gb_per_s(1)), Seconds>,
                "Bytes / BytesPerSecond must be Seconds");
  static_assert(std::is_same_v<decltype(Flops(1) / FlopsPerSecond(1)), Seconds>, "Flops / FlopsPerSecond must be Seconds");
  static_assert(std::is_same_v<decltype(Bytes(1) / Bytes(1)), double>, "a ratio of like quantities is a plain number");
  // 1 GiB over a 300 GB/s link: 2^30 / 3e11 s.
  EXPECT_DOUBLE_EQ((Bytes::gib(1) / BytesPerSecond::gb_per_s(300)).value(), 1073741824.0 / 3e11);
  // 1 PFLOP at 312 TFLOP/s (A100 bf16 dense peak) is 1e15 / 3.12e14 s.
  EXPECT_DOUBLE_EQ((Flops(1e15) / FlopsPerSecond::tflops(312)).value(), 1e15 / 3.12e14);
  EXPECT_DOUBLE_EQ((Flops(6e12) / Seconds(2)).in_tflops(), 3.0);
}

TEST(BytesPerSecond, GigabitPerSecondIsAnEighthOfAGigabyte) {
  EXPECT_DOUBLE_EQ(BytesPerSecond::gbit_per_s(1).value(), 1.25e8);
  // One InfiniBand NDR port, 400 Gb/s, carries 50 GB/s.
  EXPECT_DOUBLE_EQ(BytesPerSecond::gbit_per_s(400).in_gb_per_s(), 50.0);
  EXPECT_DOUBLE_EQ(BytesPerSecond::gb_per_s(2).value(), 2e9);
  EXPECT_DOUBLE_EQ(BytesPerSecond::tb_per_s(3.35).value(), 3.35e12);
}

TEST(Seconds, NamedConstructorsUseSiPrefixes) {
  EXPECT_DOUBLE_EQ(Seconds::us(3).value(), 3e-6);
  EXPECT_DOUBLE_EQ(Seconds::ms(250).value(), 0.25);
  EXPECT_DOUBLE_EQ(Seconds::hours(2).value(), 7200.0);
  EXPECT_DOUBLE_EQ(Seconds(86400 * 3).in_days(), 3.0);
  EXPECT_DOUBLE_EQ(Seconds(5400).in_hours(), 1.5);
}

TEST(Quantity, ArithmeticAndComparisonKeepTheUnit) {
  Bytes a = Bytes::gb(3);
  a += Bytes::gb(1);
  EXPECT_DOUBLE_EQ(a.in_gb(), 4.0);
  a -= Bytes::gb(2);
  EXPECT_DOUBLE_EQ(a.in_gb(), 2.0);
  EXPECT_DOUBLE_EQ((Bytes::gb(1) + Bytes::gb(2)).value(), 3e9);
  EXPECT_DOUBLE_EQ((2.0 * Bytes::gb(1)).value(), 2e9);
  EXPECT_DOUBLE_EQ((Bytes::gb(1) * 3.0).value(), 3e9);
  EXPECT_DOUBLE_EQ((Bytes::gb(1) / 4.0).value(), 2.5e8);
  EXPECT_DOUBLE_EQ(Bytes::gib(1) / Bytes::gb(1), 1.073741824);
  EXPECT_TRUE(Bytes::gb(1) < Bytes::gib(1));
  EXPECT_TRUE(Bytes::gib(1) > Bytes::gb(1));
  EXPECT_TRUE(Seconds(1) <= Seconds(1));
  EXPECT_TRUE(Seconds(1) >= Seconds(1));
  EXPECT_TRUE(Seconds::ms(1000) == Seconds(1));
}

}  // namespace
}  // namespace trainplan
