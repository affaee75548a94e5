// Memory: the bytes of parameters, gradients and optimizer state each rank holds must match the
// cost model's model-state figures for the same plan (ZeRO Table 1 accounting) within 2%.

#include <cmath>
#include <fstream>

#include <gtest/gtest.h>

#include "executor_support.hpp"
#include "trainplan/costmodel/estimate.hpp"

namespace trainplan::testing {
namespace {

namespace cm = trainplan::costmodel;

struct MemoryCase {
  std::string name;
  int ranks, zero_stage, shard_group;
  std::string precision;
};

void PrintTo(const MemoryCase& c, std::ostream* os) { *os << c.name; }

class ModelStates : public ::testing::TestWithParam<MemoryCase> {};

TEST_P(ModelStates, MatchTheCostModelWithinTwoPercent) {
  const MemoryCase& c = GetParam();
  const std::string dir = scratch_dir("memory-" + c.name);
  // 4 layers, hidden 256: 1.3 M parameters, large enough that shard padding is negligible.
  std::ofstream(dir + "/small-llama.json") << R"({"schema": "trainplan/model/v1", "name": "small-llama", "source": "test",
    "architecture": "llama", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "vocab": 1024,
    "tied_embeddings": false, "max_seq_len": 64})";
  PlanSpec spec;
  spec.model = dir + "/small-llama.json";
  spec.ranks = c.ranks;
  spec.zero_stage = c.zero_stage;
  spec.shard_group = c.shard_group;
  spec.micro_batch = 8 / c.ranks;
  spec.seq_len = 16;
  spec.precision = c.precision;
  const std::string plan_path = write_plan(dir, c.name, spec);
  const Outcome o = run_executor(c.ranks, "--plan " + plan_path + " --steps 1 --threads 1 --quiet --measurement " + dir + "/m.json");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const auto measured = read_json(dir + "/m.json").at("memory");

  auto request = cm::load_plan_file(plan_path);
  ASSERT_TRUE(request) << request.error().message;
  auto plan = cm::plan_with_defaults(*request);
  ASSERT_TRUE(plan) << plan.error().message;
  const cm::Estimate e = cm::estimate(*plan);
  EXPECT_NEAR(measured.at("weights_bytes").get<double>(), e.memory.weights.value(), 0.02 * e.memory.weights.value());
  EXPECT_NEAR(measured.at("gradients_bytes").get<double>(), e.memory.gradients.value(), 0.02 * e.memory.gradients.value());
  EXPECT_NEAR(measured.at("optimizer_bytes").get<double>(), e.memory.optimizer.value(), 0.02 * e.memory.optimizer.value());

  // By hand (ZeRO paper Table 1 accounting, P parameters): fp32 weights 4P / (ZeRO-3 ? shard : 1),
  // gradients 4P / (ZeRO >= 2 ? shard : 1), AdamW moments 8P / (ZeRO >= 1 ? shard : 1); bf16 adds
  // a 4P fp32 master copy to the optimizer state and keeps 2P weights.
  const double p = cm::count_parameters(plan->model).total(plan->model.layers);
  const int shard = c.zero_stage == 3 && c.shard_group > 0 ? c.shard_group : c.ranks;
  const bool bf16 = c.precision == "bf16";
  const double weights = p * (bf16 ? 2 : 4) / (c.zero_stage == 3 ? shard : 1);
  const double gradients = p * 4 / (c.zero_stage >= 2 ? shard : 1);
  const double optimizer = p * (bf16 ? 12 : 8) / (c.zero_stage >= 1 ? shard : 1);
  EXPECT_NEAR(measured.at("weights_bytes").get<double>(), weights, 0.001 * weights);
  EXPECT_NEAR(measured.at("gradients_bytes").get<double>(), gradients, 0.001 * gradients);
  EXPECT_NEAR(measured.at("optimizer_bytes").get<double>(), optimizer, 0.001 * optimizer);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ModelStates,
                         ::testing::Values(MemoryCase{"ddp_4ranks", 4, 0, 0, "fp32"}, MemoryCase{"zero1_4ranks", 4, 1, 0, "fp32"},
                                           MemoryCase{"zero2_4ranks", 4, 2, 0, "fp32"}, MemoryCase{"zero3_4ranks", 4, 3, 0, "fp32"},
                                           MemoryCase{"hybrid_4ranks", 4, 3, 2, "fp32"}, MemoryCase{"ddp_2ranks_bf16", 2, 0, 0, "bf16"},
                                           MemoryCase{"zero3_2ranks_bf16", 2, 3, 0, "bf16"}),
                         [](const ::testing::TestParamInfo<MemoryCase>& info) { return info.param.name; });

}  // namespace
}  // namespace trainplan::testing
