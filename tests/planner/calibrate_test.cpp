// planner calibrate: least squares recovers known efficiencies from runs made with them, and
// lowers the error of the real H100 runs without touching datasheet figures or tables.

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/planner/calibrate.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

const char* const kRuns[] = {"llama3.2-1b-s2048-mb1_none", "llama3.2-1b-s2048-mb2_none", "llama3.2-1b-s2048-mb8_none",
                             "llama3.2-1b-s2048-mb8_full"};

std::string measurement_path(const char* stem) { return testing::data_path(std::string("h100-llama3.2-1b/") + stem + ".measurement.json"); }

// Runs "measured" on a GPU that behaves like dgx-h100 with the given calibration: each plan's
// estimate under it is the measurement. Several micro-batch sizes and recompute settings weigh
// the kernel classes differently, which is what lets the fit tell them apart.
std::vector<planner::MeasuredRun> synthetic_runs(const Calibration& truth) {
  std::vector<planner::MeasuredRun> runs;
  for (const char* stem : kRuns) {
    auto run = planner::load_measured_run(measurement_path(stem));
    if (!run) throw std::runtime_error(run.error().message);
    for (Stack stack : {Stack::kTrainplan, Stack::kTorchCompile}) {
      Plan plan = run->plan;
      plan.training.stack = stack;
      plan.cluster.gpu.calibration = truth;
      const Estimate e = estimate(plan);
      planner::MeasuredRun m;
      m.name = std::string(stem) + "/" + stack_name(stack);
      m.plan = run->plan;
      m.plan.training.stack = stack;
      m.step_seconds = e.time.step.value();
      m.reserved_bytes = e.memory.reserved.value();
      runs.push_back(m);
    }
  }
  return runs;
}

TEST(Calibrate, RecoversKnownEfficienciesFromRunsMadeWithThem) {
  Calibration truth;
  truth.gemm_time_scale = 1.20;
  truth.attention_time_scale = 1.10;
  truth.memory_time_scale = 0.90;
  truth.latency_scale = 1.0;
  truth.allocator_extra_bytes = 1073741824.0;  // 1 GiB
  const HardwareProfile base = testing::cluster("dgx-h100");
  planner::CalibrationOptions options;
  options.prior_weight = 1e-4;  // the data determines every scale here
  auto result = planner::calibrate(base, synthetic_runs(truth), options);
  ASSERT_TRUE(result.ok()) << result.error().message;
  const Calibration& fit = result->profile.gpu.calibration;
  EXPECT_NEAR(fit.gemm_time_scale, 1.20, 0.02);
  EXPECT_NEAR(fit.attention_time_scale, 1.10, 0.05);
  EXPECT_NEAR(fit.memory_time_scale, 0.90, 0.02);
  EXPECT_NEAR(fit.allocator_extra_bytes / 1073741824.0, 1.0, 0.01);
  for (const auto& r : result->runs) EXPECT_NEAR(r.step_after / r.measured_step, 1.0, 0.005) << r.name;
  // Datasheet figures and measured tables are untouched.
  EXPECT_EQ(result->profile.gpu.peak_for(Dtype::kBf16).value(), base.gpu.peak_for(Dtype::kBf16).value());
  EXPECT_EQ(result->profile.gpu.hbm_bandwidth.value(), base.gpu.hbm_bandwidth.value());
  EXPECT_EQ(result->profile.gpu.kernels, base.gpu.kernels);
}

TEST(Calibrate, LowersTheErrorOfTheH100RunsAndTheProfileReadsBack) {
  std::vector<planner::MeasuredRun> runs;
  for (const char* stem : kRuns) {
    auto run = planner::load_measured_run(measurement_path(stem));
    ASSERT_TRUE(run.ok()) << run.error().message;
    runs.push_back(*run);
  }
  auto result = planner::calibrate(testing::cluster("dgx-h100"), runs);
  ASSERT_TRUE(result.ok()) << result.error().message;
  double before = 0, after = 0;
  for (const auto& r : result->runs) {
    before += std::pow(r.step_before / r.measured_step - 1, 2);
    after += std::pow(r.step_after / r.measured_step - 1, 2);
  }
  EXPECT_LT(after, before);
  auto back = parse_hwprofile_text(readable_json(hwprofile_to_json(result->profile)), "calibrated.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_NEAR(back->gpu.calibration.gemm_time_scale, result->profile.gpu.calibration.gemm_time_scale, 1e-12);
  EXPECT_NE(back->gpu.calibration.source.find("4 measurement(s)"), std::string::npos);
}

TEST(Calibrate, NoMeasurementsIsAnError) {
  auto result = planner::calibrate(testing::cluster("dgx-h100"), {});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("no measurements"), std::string::npos);
}

class CalibrateCli : public testing::PlannerCliTest {};

TEST_F(CalibrateCli, WritesAProfileThatThePlannerReads) {
  const std::string out = (dir_ / "calibrated.json").string();
  std::string args = "calibrate";
  for (const char* stem : kRuns) args += " " + testing::quote(measurement_path(stem));
  const auto r = run(args + " --out " + testing::quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("fitted: GEMM time x"), std::string::npos) << r.out;
  // The planner plans with the calibrated profile.
  const auto e = run("--model llama3.2-1b --gpus 8 --cluster " + testing::quote(out) + " --quiet --top 1");
  EXPECT_EQ(e.exit_code, 0) << e.all();
  testing::expect_bad_input(run("calibrate " + testing::quote(testing::data_path("megatron2021_table1.csv"))), "megatron2021_table1.csv");
}

}  // namespace
}  // namespace trainplan
