// Mixture of experts in the executor (issue 13 item 2): a tiny Mixtral-shaped model (tiny-llama
// with 4 layers whose MLPs are 4 SwiGLU experts of width 64, top-2, capacity factor 1) trained on
// several layouts, with every rank holding every expert (ep = 1) or the experts split over ep
// ranks (tokens dispatched and combined by all-to-all), must give the one-rank run's losses and
// exported weights within 1e-4, and drop exactly the same tokens every step (the router's choices
// are the same). Capacity is counted per rank and micro-batch, so every run here uses
// micro-batches of one sequence (32 tokens).

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

constexpr double kTolerance = 1e-4;
constexpr int kSteps = 10;

PlanSpec mixtral_spec(int dp, int pp, int zero_stage, double capacity_factor = 1.0, int experts = 4, int ep = 1) {
  PlanSpec s;
  s.ep = ep;
  s.model = "tiny-llama";
  s.layers = 4;
  s.model_patch = {{"moe", {{"experts", experts}, {"top_k", 2}, {"expert_ffn_hidden", 64}, {"capacity_factor", capacity_factor}}}};
  s.ranks = dp;
  s.pp = pp;
  s.zero_stage = zero_stage;
  s.micro_batch = 1;
  return s;
}

struct MoeRunResult {
  std::vector<double> losses;
  Parameters parameters;
  nlohmann::json moe;
};

MoeRunResult train(const std::string& name, const PlanSpec& spec, const std::string& extra = "") {
  const std::string dir = scratch_dir(name);
  const std::string plan = write_plan(dir, name, spec);
  const Outcome o = run_executor(spec.ranks * spec.tp * spec.pp * spec.cp, "--plan " + plan + " --steps " + std::to_string(kSteps) +
                                                           " --lr 3e-3 --threads 1 --quiet --measurement " + dir + "/m.json --export " + dir +
                                                           "/export " + extra);
  if (o.exit_code != 0) throw std::runtime_error(name + " failed (exit " + std::to_string(o.exit_code) + "):\n" + o.output);
  const nlohmann::json m = read_json(dir + "/m.json");
  return {m.at("losses").get<std::vector<double>>(), read_safetensors(dir + "/export/model.safetensors"), m.at("moe")};
}

const MoeRunResult& one_rank() {
  static const MoeRunResult run = train("moe-one-rank", mixtral_spec(1, 1, 0));
  return run;
}

struct Layout {
  std::string name;
  PlanSpec spec;
  std::string extra;
};

class MoeEquivalence : public ::testing::TestWithParam<Layout> {};

TEST_P(MoeEquivalence, LossesWeightsAndDroppedTokensMatchTheOneRankRun) {
  const MoeRunResult& one = one_rank();
  const MoeRunResult many = train(GetParam().name, GetParam().spec, GetParam().extra);
  ASSERT_EQ(many.losses.size(), static_cast<std::size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) EXPECT_NEAR(many.losses[i], one.losses[i], kTolerance * std::abs(one.losses[i])) << "step " << i + 1;
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3);  // the loss really falls
  expect_parameters_close(one.parameters, many.parameters, kTolerance);
  // The same tokens routed and dropped in every step: the router chose the same experts.
  EXPECT_EQ(many.moe.at("tokens_dropped_per_step_each"), one.moe.at("tokens_dropped_per_step_each"));
  // 4 MoE layers x 8 sequences x 32 tokens x top-2 = 2048 assignments per step.
  EXPECT_EQ(many.moe.at("assignments_per_step").get<double>(), 2048.0);
  double dropped = 0;
  for (const auto& d : one.moe.at("tokens_dropped_per_step_each")) dropped += d.get<double>();
  EXPECT_GT(dropped, 0.0);  // capacity factor 1 drops some as the router is not balanced
  // Load-balancing loss experts x sum f P: 1 when balanced, 4 (experts) if one expert took all.
  EXPECT_NEAR(many.moe.at("aux_loss").get<double>(), one.moe.at("aux_loss").get<double>(), 1e-4);
  EXPECT_GT(many.moe.at("aux_loss").get<double>(), 0.5);
  EXPECT_LT(many.moe.at("aux_loss").get<double>(), 4.0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeEquivalence,
                         ::testing::Values(Layout{"moe_dp2_zero1", mixtral_spec(2, 1, 1), ""}, Layout{"moe_dp2_zero3", mixtral_spec(2, 1, 3), ""},
                                           Layout{"moe_pp2_dp2_zero1", mixtral_spec(2, 2, 1), ""},
                                           // Expert parallelism: each rank holds 2 (ep2) or 1 (ep4) of the 4 experts.
                                           Layout{"moe_ep2", mixtral_spec(2, 1, 0, 1.0, 4, 2), ""}, Layout{"moe_ep4", mixtral_spec(4, 1, 0, 1.0, 4, 4), ""},
                                           // ep2 x dp2: experts sharded over their own data-parallel pair.
                                           Layout{"moe_ep2_dp2_zero3", mixtral_spec(4, 1, 3, 1.0, 4, 2), ""},
                                           Layout{"moe_ep2_zero1_pp2", mixtral_spec(2, 2, 1, 1.0, 4, 2), ""},
                                           Layout{"moe_ep2_full_recompute", [] {
                                                    PlanSpec s = mixtral_spec(2, 1, 2, 1.0, 4, 2);
                                                    s.recompute = "full";  // the all-to-alls run again in the recompute
                                                    return s;
                                                  }(), ""},
                                           Layout{"moe_full_recompute", [] {
                                                    PlanSpec s = mixtral_spec(1, 1, 0);
                                                    s.recompute = "full";  // the layers count once, not again in the recompute
                                                    return s;
                                                  }(), ""}),
                         [](const auto& info) { return info.param.name; });

// Experts under context parallelism: each CP rank routes its part of every sequence and the
// load-balancing loss is the whole sequence's (moe.hpp). Capacity is per CP rank, as in
// Megatron-Core, so these runs are dropless: then cp2, and cp2 x ep2 x dp2 under ZeRO-1 (4
// ranks), give the one-rank losses, weights and load-balancing loss.
TEST(MoeContextParallel, DroplessRunsEqualTheOneRankRun) {
  const MoeRunResult one = train("moe-dropless-one-rank", mixtral_spec(1, 1, 0, 0.0));
  PlanSpec cp2 = mixtral_spec(1, 1, 0, 0.0);
  cp2.cp = 2;
  PlanSpec cp2_ep2 = mixtral_spec(2, 1, 1, 0.0, 4, 2);
  cp2_ep2.cp = 2;
  for (const auto& [name, spec] : {std::pair<std::string, PlanSpec>{"moe_cp2", cp2}, {"moe_cp2_ep2_dp2_zero1", cp2_ep2}}) {
    const MoeRunResult many = train(name, spec);
    ASSERT_EQ(many.losses.size(), static_cast<std::size_t>(kSteps)) << name;
    for (int i = 0; i < kSteps; ++i) EXPECT_NEAR(many.losses[i], one.losses[i], kTolerance * std::abs(one.losses[i])) << name << " step " << i + 1;
    expect_parameters_close(one.parameters, many.parameters, kTolerance);
    EXPECT_EQ(many.moe.at("tokens_dropped_per_step").get<double>(), 0.0) << name;
    EXPECT_EQ(many.moe.at("assignments_per_step"), one.moe.at("assignments_per_step")) << name;
    EXPECT_EQ(many.moe.at("tokens_per_expert_per_step"), one.moe.at("tokens_per_expert_per_step")) << name;  // the same choices
    EXPECT_NEAR(many.moe.at("aux_loss").get<double>(), one.moe.at("aux_loss").get<double>(), 1e-5) << name;
  }
}

// The mixtral preset at a tiny size: its document (8 experts, top-2, SwiGLU, grouped-query
// attention) with 2 layers and the widths shrunk to tiny-llama's, dropless. Its experts split over
// 4 ranks (2 each, ZeRO-1) give the one-rank run's losses, weights and tokens per expert.
TEST(MixtralPreset, RunsAtATinySizeWithItsExpertsSplitOverFourRanks) {
  PlanSpec spec;
  spec.model = "mixtral-8x7b";
  spec.layers = 2;
  spec.model_patch = {{"hidden", 64}, {"heads", 4}, {"kv_heads", 2}, {"ffn_hidden", 64}, {"vocab", 256}, {"max_seq_len", 64},
                      {"moe", {{"experts", 8}, {"top_k", 2}, {"expert_ffn_hidden", 64}}}};
  spec.micro_batch = 1;
  const MoeRunResult one = train("mixtral-one-rank", spec);
  spec.ranks = 4;
  spec.ep = 4;
  spec.zero_stage = 1;
  const MoeRunResult ep4 = train("mixtral-ep4", spec);
  ASSERT_EQ(ep4.losses.size(), static_cast<std::size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) EXPECT_NEAR(ep4.losses[i], one.losses[i], kTolerance * std::abs(one.losses[i])) << "step " << i + 1;
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3);  // it learns
  expect_parameters_close(one.parameters, ep4.parameters, kTolerance);
  EXPECT_EQ(ep4.moe.at("experts"), 8);
  EXPECT_EQ(ep4.moe.at("tokens_per_expert_per_step"), one.moe.at("tokens_per_expert_per_step"));
  EXPECT_EQ(ep4.moe.at("tokens_dropped_per_step").get<double>(), 0.0);
}

// Two experts, top-2: every token goes to both, so each expert receives all 32 tokens of a
// micro-batch whatever the router says, and keeps ceil(0.25 x 32 x 2 / 2) = 8 of them: 24
// dropped per expert, 48 per layer and micro-batch. 4 layers x 8 micro-batches per step (over
// both data-parallel ranks): 4 x 8 x 48 = 1536 of 4 x 8 x 64 = 2048 assignments.
TEST(MoeCapacity, TokensDroppedEqualTheHandCount) {
  const std::string dir = scratch_dir("moe-capacity");
  const std::string plan = write_plan(dir, "moe-capacity", mixtral_spec(2, 1, 1, 0.25, 2));
  const Outcome o = run_executor(2, "--plan " + plan + " --steps 3 --threads 1 --quiet --measurement " + dir + "/m.json");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const nlohmann::json moe = read_json(dir + "/m.json").at("moe");
  EXPECT_EQ(moe.at("tokens_dropped_per_step_each"), nlohmann::json({1536.0, 1536.0, 1536.0})) << moe.dump();
  EXPECT_EQ(moe.at("assignments_per_step").get<double>(), 2048.0);
  EXPECT_DOUBLE_EQ(moe.at("dropped_fraction").get<double>(), 0.75);
  // Both experts take every token: f = (1/2, 1/2), P sums to 1, so experts x sum f P = 1 exactly.
  EXPECT_NEAR(moe.at("aux_loss").get<double>(), 1.0, 1e-6);
}

// Bytes the all-to-all dispatch and combine send per step, against the cost model's
// communication.ep_bytes_sent_per_step, which assumes balanced routing: within 5% when dropless,
// for the mean over ranks (what balanced routing predicts, every rank's tokens being drawn
// alike). A rank sends 2 x (rows it dispatches + rows it receives) per layer pass; under ep2 that
// is 2 x its tokens' copies whatever the routing, under ep4 the rank holding the busiest experts
// sends more than the mean, which the measurement's busiest-rank figure shows. The hand count: 2 experts, top-2, ep2, dropless: each rank sends the other expert a
// copy of each of its 32 tokens per micro-batch, and gets it back (combine), forward and again
// backward: 4 x 32 rows x 64 (hidden) x 4 B = 32768 B, after one int64 count (8 B), per layer
// and micro-batch; x 4 layers x 4 micro-batches per rank = 524416 B. Balanced here by
// construction, so the cost model says the same.
TEST(ExpertParallelBytes, MeasuredBytesSentPerStepMatchTheCostModel) {
  struct Row {
    std::string name;
    PlanSpec spec;
    double by_hand;  // 0: only against the cost model
  };
  PlanSpec recompute = mixtral_spec(2, 1, 1, 0.0, 4, 2);
  recompute.recompute = "full";
  const std::vector<Row> rows = {
      {"ep_bytes_hand", mixtral_spec(2, 1, 1, 0.0, 2, 2), 524416.0},
      {"ep_bytes_ep2", mixtral_spec(2, 1, 1, 0.0, 4, 2), 0},
      {"ep_bytes_ep4", mixtral_spec(4, 1, 1, 0.0, 4, 4), 0},
      {"ep_bytes_ep2_full_recompute", recompute, 0},
  };
  for (const Row& row : rows) {
    const std::string dir = scratch_dir(row.name);
    const std::string plan_path = write_plan(dir, row.name, row.spec);
    const Outcome o = run_executor(row.spec.ranks, "--plan " + plan_path + " --steps 2 --threads 1 --quiet --measurement " + dir + "/m.json");
    ASSERT_EQ(o.exit_code, 0) << row.name << "\n" << o.output;
    const nlohmann::json m = read_json(dir + "/m.json");
    const double busiest = m.at("communication").at("ep_bytes_sent_per_step").get<double>();
    const double measured = m.at("communication").at("ep_bytes_sent_per_step_mean").get<double>();
    EXPECT_GE(busiest, measured) << row.name;
    const double predicted = estimate_plan_file(plan_path).communication.ep_sent.value();
    EXPECT_NEAR(measured, predicted, 0.05 * predicted) << row.name;
    if (row.by_hand > 0) {
      EXPECT_EQ(measured, row.by_hand) << row.name;
      EXPECT_EQ(busiest, row.by_hand) << row.name;
    }
    EXPECT_GT(measured, 0.0) << row.name;
    std::printf("%-28s mean %8.0f B  busiest %8.0f B  predicted %8.0f B  (mean %+.2f%%, busiest %+.2f%%, load imbalance %.3f)\n",
                row.name.c_str(), measured, busiest, predicted, 100.0 * (measured / predicted - 1.0), 100.0 * (busiest / predicted - 1.0),
                m.at("moe").at("load_imbalance").get<double>());
  }
}

// Stopped after 5 of 10 steps and resumed, ep2 x dp2 under ZeRO-3 gives the uninterrupted run's
// losses exactly. The checkpoint holds the dense units' ZeRO-3 shards over the 4 data-parallel
// ranks (shard_0000k.bin) and each expert-parallel rank's experts in shards over their own
// data-parallel pair (shard_ep0e_0000k.bin): 4 + 2 x 2 files.
TEST(MoeCheckpoint, ResumingAnExpertParallelRunGivesTheUninterruptedLosses) {
  const std::string dir = scratch_dir("moe-resume");
  const std::string plan = write_plan(dir, "moe-resume", mixtral_spec(4, 1, 3, 1.0, 4, 2));
  const std::string args = "--plan " + plan + " --steps " + std::to_string(kSteps) + " --lr 3e-3 --threads 1 --quiet ";
  ASSERT_EQ(run_executor(4, args + "--measurement " + dir + "/full.json").exit_code, 0);
  const Outcome first = run_executor(4, args + "--stop-after 5 --checkpoint-dir " + dir + "/ckpt");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Outcome second = run_executor(4, args + "--resume " + dir + "/ckpt --measurement " + dir + "/resumed.json");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto full = read_json(dir + "/full.json").at("losses").get<std::vector<double>>();
  const auto resumed = read_json(dir + "/resumed.json").at("losses").get<std::vector<double>>();
  ASSERT_EQ(resumed.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << "step " << i + 1;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt/step_000005")) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"manifest.json", "shard_00000.bin", "shard_00001.bin", "shard_00002.bin", "shard_00003.bin",
                                             "shard_ep00_00000.bin", "shard_ep00_00001.bin", "shard_ep01_00000.bin", "shard_ep01_00001.bin"}));
}

// A plan whose ep does not divide the experts is refused by the plan's validation, the rule named.
TEST(MoeRefusals, ExpertsThatDoNotSplitOverEpAreRefusedWithTheRule) {
  const std::string dir = scratch_dir("moe-refusals");
  PlanSpec ep = mixtral_spec(3, 1, 1);
  ep.ep = 3;  // 4 experts do not split over 3 ranks
  const std::string plan = write_plan(dir, "ep3", ep);
  const Outcome o = run_executor(1, "--plan " + plan);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("/parallel/ep: ep(3) must divide experts (4)"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace trainplan::testing
