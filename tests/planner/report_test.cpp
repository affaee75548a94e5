// The report's number formatting: units that climb a ladder instead of "2.1 K GB", singular
// counts, cells that stay short however large the value, and full precision for CSV.

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "trainplan/planner/report.hpp"

namespace trainplan {
namespace {

TEST(DecimalBytesText, ClimbsTheUnitLadder) {
  const std::pair<double, const char*> cases[] = {
      {512, "512 bytes"},      {2.1e3, "2.1 kB"},      {512e6, "512 MB"},   {13.2e9, "13.2 GB"},  {2.1e12, "2.1 TB"},
      {6.48e12, "6.48 TB"},    {3.4e15, "3.4 PB"},     {1.5e18, "1.5 EB"},  {2e21, "2e+21 bytes"}, {999.7e9, "1 TB"},
  };
  for (const auto& [bytes, text] : cases) EXPECT_EQ(planner::decimal_bytes_text(bytes), text) << bytes;
}

TEST(Si, UsesSuffixesThenScientificPastE) {
  EXPECT_EQ(planner::si(70.6e9), "70.6 B");
  EXPECT_EQ(planner::si(1.2e6), "1.2 M");
  EXPECT_EQ(planner::si(999.99e3), "1 M");  // rounding to 1000 K climbs a unit
  EXPECT_EQ(planner::si(1e18), "1 E");
  EXPECT_EQ(planner::si(2.5e21), "2.5e+21");
}

TEST(BoundedNumber, KeepsDecimalsWhileShortThenGoesScientific) {
  EXPECT_EQ(planner::bounded_number(68.519, 2), "68.52");
  EXPECT_EQ(planner::bounded_number(1234567.8, 1), "1234567.8");
  EXPECT_EQ(planner::bounded_number(189082312.5, 1), "1.89e+08");  // "189082312.5" is 11 characters
  EXPECT_EQ(planner::bounded_number(1e300, 2), "1e+300");
  EXPECT_EQ(planner::bounded_number(std::numeric_limits<double>::infinity(), 2), "inf");
}

TEST(CountText, IsSingularForOne) {
  EXPECT_EQ(planner::count_text(1, "micro-batch", "micro-batches"), "1 micro-batch");
  EXPECT_EQ(planner::count_text(4, "micro-batch", "micro-batches"), "4 micro-batches");
  EXPECT_EQ(planner::count_text(1024, "micro-batch", "micro-batches"), "1024 micro-batches");
  EXPECT_EQ(planner::count_text(2.5, "micro-batch", "micro-batches"), "2.5 micro-batches");
  EXPECT_EQ(planner::count_text(0, "stage", "stages"), "0 stages");
}

TEST(FullPrecision, ReadsBackAsTheSameDouble) {
  for (double x : {0.1, 1.0 / 3.0, 85899345920.0, 123456789.123456789, 6.02214076e23, 1e-300, 12.0}) {
    const std::string text = planner::full_precision(x);
    EXPECT_EQ(std::stod(text), x) << text;
  }
  EXPECT_EQ(planner::full_precision(85899345920.0), "85899345920");
  EXPECT_EQ(planner::full_precision(0.1), "0.1");
}

}  // namespace
}  // namespace trainplan
