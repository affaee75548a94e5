// executor --kernel-profile's table (executor/src/kernel_profile.hpp): kernels summed by name and
// ranked by device time, written as CSV with their share of the kernels' time and of the step.

#include <gtest/gtest.h>

#include "kernel_profile.hpp"

namespace trainplan::executor {
namespace {

TEST(KernelProfile, SumsByNameAndRanksByTotalTime) {
  // Three launches of a GEMM (2 + 3 + 1 ms), two of an add (2.5 ms each), one memset (0.5 ms).
  const std::vector<std::pair<std::string, uint64_t>> records = {
      {"gemm", 2'000'000}, {"add", 2'500'000}, {"gemm", 3'000'000}, {"memset", 500'000}, {"add", 2'500'000}, {"gemm", 1'000'000}};
  const std::vector<KernelTime> ranked = rank_kernels(records);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].name, "gemm");
  EXPECT_EQ(ranked[0].calls, 3);
  EXPECT_DOUBLE_EQ(ranked[0].seconds, 6e-3);
  EXPECT_EQ(ranked[1].name, "add");
  EXPECT_EQ(ranked[1].calls, 2);
  EXPECT_DOUBLE_EQ(ranked[1].seconds, 5e-3);
  EXPECT_EQ(ranked[2].name, "memset");
}

TEST(KernelProfile, CsvGivesSharesOfKernelTimeAndOfTheStep) {
  // 6 + 5 + 0.5 = 11.5 ms of kernels in a 20 ms step: gemm 6/11.5 = 0.52174 and 6/20 = 0.3.
  const std::vector<KernelTime> ranked = rank_kernels({{"gemm", 6'000'000}, {"add \"x\", y", 5'000'000}, {"memset", 500'000}});
  const std::string csv = kernel_table_csv(ranked, 0.020);
  EXPECT_EQ(csv,
            "kernel,calls,total_ms,share_of_kernel_time,share_of_step\n"
            "\"gemm\",1,6.0000,0.52174,0.30000\n"
            "\"add \"\"x\"\", y\",1,5.0000,0.43478,0.25000\n"
            "\"memset\",1,0.5000,0.04348,0.02500\n");
}

}  // namespace
}  // namespace trainplan::executor
