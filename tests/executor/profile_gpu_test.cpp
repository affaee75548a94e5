// `planner profile --device cuda` on a GPU (label gpu): the executor's GPU microbenchmarks
// (CUDA-event timing) write a profile of the device. Skips when no CUDA device is visible (the
// executor refuses --device cuda with exit 2 before measuring anything).

#include <cmath>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "executor_support.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan {
namespace {

using testing::Outcome;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ProfileOnGpu, WritesAProfileOfTheDevice) {
  const std::string dir = testing::scratch_dir("profile-gpu");
  const std::string out = dir + "/gpu.json";
  const Outcome r = testing::run_command(std::string(TRAINPLAN_PLANNER_BIN) + " profile --executor " + TRAINPLAN_EXECUTOR_BIN +
                                         " --device cuda --quick --out " + out);
  if (r.exit_code == 2 && contains(r.output, "no CUDA device is visible")) GTEST_SKIP() << "no CUDA device is visible";
  std::cout << "planner profile --device cuda --quick: " << r.seconds << " s\n" << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto text = costmodel::read_text_file(out);
  ASSERT_TRUE(text) << text.error().message;
  auto p = costmodel::parse_hwprofile_text(*text, out);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_NE(p->gpu.name.rfind("cpu", 0), 0u) << p->gpu.name;
  EXPECT_GT(p->gpu.sm_count, 0);
  ASSERT_TRUE(p->gpu.kernels);
  const auto& k = *p->gpu.kernels;
  double best_gemm = 0;
  for (const auto& g : k.gemm) best_gemm = std::max(best_gemm, 2 * g.m * g.n * g.k / g.seconds);
  EXPECT_GT(best_gemm, 10e12) << "a GPU's bf16 GEMMs run at more than 10 TFLOP/s";
  EXPECT_GT(k.copy_bandwidth, 100e9);
  EXPECT_GT(k.adamw_fused_bandwidth, 0);
  EXPECT_TRUE(contains(k.source, "CUDA events")) << k.source;
  EXPECT_TRUE(contains(k.source, "AdamW: at::_fused_adamw_")) << k.source;
  // A GPU keeps the base profile's datasheet peaks.
  auto base = costmodel::find_hwprofile("dgx-h100");
  ASSERT_TRUE(base);
  EXPECT_DOUBLE_EQ(p->gpu.peak_for(costmodel::Dtype::kBf16).value(), base->gpu.peak_for(costmodel::Dtype::kBf16).value());
}

}  // namespace
}  // namespace trainplan
