// planner calibrate: least squares recovers known efficiencies from runs made with them, and
// lowers the error of the real H100 runs without touching datasheet figures or tables.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
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
    for (Stack stack : {Stack::kTrainplanReference, Stack::kTorchCompile}) {
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

// The device the synthetic runs were "measured" on: GEMMs 20% slower than the profile says,
// attention 10% slower, memory-bound kernels 10% faster.
Calibration known_scales() {
  Calibration truth;
  truth.gemm_time_scale = 1.20;
  truth.attention_time_scale = 1.10;
  truth.memory_time_scale = 0.90;
  return truth;
}

TEST(Calibrate, RecoversKnownEfficienciesFromRunsMadeWithThem) {
  Calibration truth = known_scales();
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

// The collectives have a scale of their own, outside the common one (their time is the network's
// or MPI's, not the device's): runs on 16 GPUs of two nodes with ZeRO-3, whose gathers and
// reduce-scatters are partly exposed, beside the single-GPU runs that have none, tell it apart.
TEST(Calibrate, RecoversTheCollectivesScaleFromRunsOnTwoNodes) {
  Calibration truth = known_scales();
  truth.collective_time_scale = 1.60;
  std::vector<planner::MeasuredRun> runs = synthetic_runs(truth);
  const std::size_t single = runs.size();
  double exposed = 0;  // the largest share of a step the collectives take, exposed
  for (std::size_t i = 0; i < single; ++i) {
    planner::MeasuredRun m = runs[i];
    m.name += "/16 GPUs";
    m.plan.gpus = 16;
    m.plan.parallel.dp = 16;
    m.plan.parallel.zero_stage = 3;
    m.plan.training.global_batch = 16 * m.plan.parallel.micro_batch;
    Plan truth_plan = m.plan;
    truth_plan.cluster.gpu.calibration = truth;
    const Estimate e = estimate(truth_plan);
    exposed = std::max(exposed, e.time.dp_comm_exposed.value() / e.time.step.value());
    m.step_seconds = e.time.step.value();
    m.reserved_bytes.reset();
    runs.push_back(m);
  }
  ASSERT_GT(exposed, 0.05) << "the collectives must show in some steps";
  planner::CalibrationOptions options;
  options.prior_weight = 1e-4;
  auto result = planner::calibrate(testing::cluster("dgx-h100"), runs, options);
  ASSERT_TRUE(result.ok()) << result.error().message;
  const Calibration& fit = result->profile.gpu.calibration;
  EXPECT_NEAR(fit.collective_time_scale, 1.60, 0.05);
  EXPECT_NEAR(fit.gemm_time_scale, 1.20, 0.02);
  for (const auto& r : result->runs) EXPECT_NEAR(r.step_after / r.measured_step, 1.0, 0.005) << r.name;
  // It reads back, and the single-GPU runs alone leave it where the profile had it, saying so.
  auto back = parse_hwprofile_text(readable_json(hwprofile_to_json(result->profile)), "calibrated.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_NEAR(back->gpu.calibration.collective_time_scale, fit.collective_time_scale, 1e-12);
  runs.resize(single);
  HardwareProfile calibrated_before = testing::cluster("dgx-h100");
  calibrated_before.gpu.calibration.collective_time_scale = 1.6;
  auto alone = planner::calibrate(calibrated_before, runs, options);
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  EXPECT_NEAR(alone->profile.gpu.calibration.collective_time_scale, 1.6, 1e-9);
  bool said = false;
  for (const auto& note : alone->notes) said = said || note.rfind("collective time: the measurements do not depend on it", 0) == 0;
  EXPECT_TRUE(said);
  EXPECT_NE(planner::calibration_scales_text(fit).find(", collective time x 1.6"), std::string::npos) << planner::calibration_scales_text(fit);
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

TEST(Calibrate, MeasurementsFarFromTheProfileSaturateAScaleSaySoAndStillReadBack) {
  // A device 20 times slower than the profile (another GPU, a CPU run): the GEMM scale meets the
  // profile's bound of 10, the fit says so, and the profile it writes is still a valid one.
  auto loaded = planner::load_measured_run(measurement_path(kRuns[2]));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  planner::MeasuredRun run = *loaded;
  run.step_seconds *= 20;
  auto result = planner::calibrate(testing::cluster("dgx-h100"), {run});
  ASSERT_TRUE(result.ok()) << result.error().message;
  bool noted = false;
  for (const auto& note : result->notes) noted |= note.find("at the bound") != std::string::npos;
  EXPECT_TRUE(noted);
  auto back = parse_hwprofile_text(readable_json(hwprofile_to_json(result->profile)), "far.json");
  EXPECT_TRUE(back.ok()) << back.error().message;
  // A reserve the model over-counts lowers the allocator's bytes, never below what is allocated.
  planner::MeasuredRun lower = *loaded;
  lower.reserved_bytes = *lower.reserved_bytes - 20.0 * 1073741824.0;
  auto fit = planner::calibrate(testing::cluster("dgx-h100"), {lower});
  ASSERT_TRUE(fit.ok());
  EXPECT_LT(fit->profile.gpu.calibration.allocator_extra_bytes, 0);
  Plan plan = lower.plan;
  plan.cluster = fit->profile;
  const Estimate e = estimate(plan);
  EXPECT_GE(e.memory.reserved.value(), e.memory.total.value());
}

TEST(Calibrate, AMeasurementOfAModelThatIsNoPresetCarriesItsDocument) {
  nlohmann::json m = nlohmann::json::parse(R"({"schema": "trainplan/measurement/v1", "name": "custom", "model": "tiny-llama-8l-h256",
    "cluster": "my-cluster", "gpus": 1, "training": {"seq_len": 64, "global_batch": 8}, "parallel": {"tp": 1, "pp": 1, "dp": 1,
    "zero_stage": 0, "micro_batch": 1}, "memory": {}, "time": {"step_seconds": 0.5}, "throughput": {}})");
  m["model_document"] = nlohmann::json::parse(R"({"schema": "trainplan/model/v1", "name": "tiny-llama-8l-h256", "source": "test",
    "architecture": "llama", "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 688, "vocab": 512,
    "tied_embeddings": false, "max_seq_len": 512})");
  const std::string path = "/tmp/trainplan_calibrate_custom.measurement.json";
  {
    std::ofstream out(path);
    out << m.dump();
  }
  // "my-cluster" is no preset: without an override the cluster cannot be found, with one it can.
  auto plain = planner::load_measured_run(path);
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.error().message.find("my-cluster"), std::string::npos) << plain.error().message;
  auto run = planner::load_measured_run(path, "dgx-h100");
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_EQ(run->plan.model.name, "tiny-llama-8l-h256");
  EXPECT_EQ(run->plan.model.hidden, 256);
  EXPECT_EQ(run->plan.cluster.name, "dgx-h100");
  std::remove(path.c_str());
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
  // A schema that is not text is bad input, not a crash.
  const auto bad = write("bad.measurement.json", R"({"schema": 5, "name": 7})");
  testing::expect_bad_input(run("calibrate " + testing::quote(bad.string())), "/schema");
}

}  // namespace
}  // namespace trainplan
