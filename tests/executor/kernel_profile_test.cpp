// executor --kernel-profile's table (executor/src/measure/kernel_profile.hpp): kernels summed by name and
// ranked by device time, written as CSV with their share of the kernels' time and of the step and
// the device's idle time before them.

#include <gtest/gtest.h>

#include "kernel_profile.hpp"

namespace trainplan::executor {
namespace {

TEST(KernelProfile, SumsByNameAndRanksByTotalTime) {
  // Three launches of a GEMM (2 + 3 + 1 ms), two of an add (2.5 ms each), one memset (0.5 ms),
  // given out of order; in start order (ms): gemm 0-2, add 2-4.5, gemm 5-8 (0.5 idle before it),
  // memset 8.25-8.75 (0.25 idle), add 8.5-11 (overlapping the memset on another stream: no idle),
  // gemm 12-13 (1 idle).
  const std::vector<KernelRecord> records = {{"gemm", 5'000'000, 3'000'000},   {"gemm", 0, 2'000'000},
                                             {"add", 2'000'000, 2'500'000},    {"memset", 8'250'000, 500'000},
                                             {"add", 8'500'000, 2'500'000},    {"gemm", 12'000'000, 1'000'000}};
  const std::vector<KernelTime> ranked = rank_kernels(records);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].name, "gemm");
  EXPECT_EQ(ranked[0].calls, 3);
  EXPECT_DOUBLE_EQ(ranked[0].seconds, 6e-3);
  EXPECT_DOUBLE_EQ(ranked[0].idle_before_seconds, 1.5e-3);
  EXPECT_EQ(ranked[1].name, "add");
  EXPECT_EQ(ranked[1].calls, 2);
  EXPECT_DOUBLE_EQ(ranked[1].seconds, 5e-3);
  EXPECT_DOUBLE_EQ(ranked[1].idle_before_seconds, 0.0);
  EXPECT_EQ(ranked[2].name, "memset");
  EXPECT_DOUBLE_EQ(ranked[2].idle_before_seconds, 0.25e-3);
}

TEST(KernelProfile, CsvGivesSharesOfKernelTimeAndOfTheStep) {
  // 6 + 5 + 0.5 = 11.5 ms of kernels in a 20 ms step: gemm 6/11.5 = 0.52174 and 6/20 = 0.3. Back
  // to back (gemm 0-6, add 6-11) but for 1 ms before the memset (12-12.5).
  const std::vector<KernelTime> ranked =
      rank_kernels({{"gemm", 0, 6'000'000}, {"add \"x\", y", 6'000'000, 5'000'000}, {"memset", 12'000'000, 500'000}});
  const std::string csv = kernel_table_csv(ranked, 0.020);
  EXPECT_EQ(csv,
            "kernel,calls,total_ms,share_of_kernel_time,share_of_step,idle_before_ms\n"
            "\"gemm\",1,6.0000,0.52174,0.30000,0.0000\n"
            "\"add \"\"x\"\", y\",1,5.0000,0.43478,0.25000,0.0000\n"
            "\"memset\",1,0.5000,0.04348,0.02500,1.0000\n");
}

}  // namespace
}  // namespace trainplan::executor
