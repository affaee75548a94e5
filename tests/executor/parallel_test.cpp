// Tensor, sequence, context and pipeline parallelism change where the work runs, not what is computed:
// every layout must give the per-step losses of the 1-rank run with the same global batch over
// 10 steps, and its exported (consolidated) weights must equal the 1-rank run's, to 1e-4
// relative. Also checked here: the micro-batches each pipeline stage holds (activation memory)
// and the bytes context parallelism sends per step, against the cost model. The order each
// stage runs its passes in is checked in bubble_test.cpp, the measured bubble by bench/pipeline_bench.sh.

#include <cmath>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

constexpr double kTolerance = 1e-4;
constexpr int kSteps = 10;

struct Case {
  std::string name;
  std::string model;  // tiny-llama or tiny-gpt, with 8 layers
  int ranks;          // tp * cp * pp * dp
  PlanSpec spec;
};

struct TrainedRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> parameters;
  nlohmann::json measurement;
};

TrainedRun train(const std::string& name, const PlanSpec& spec, int ranks) {
  const std::string dir = scratch_dir(name);
  const std::string plan = write_plan(dir, name, spec);
  const Outcome o = run_executor(ranks, "--plan " + plan + " --steps " + std::to_string(kSteps) +
                                            " --lr 3e-3 --threads 1 --quiet --measurement " + dir + "/m.json --export " + dir + "/export");
  if (o.exit_code != 0) throw std::runtime_error(name + " failed (exit " + std::to_string(o.exit_code) + "):\n" + o.output);
  TrainedRun r;
  r.measurement = read_json(dir + "/m.json");
  r.losses = r.measurement.at("losses").get<std::vector<double>>();
  r.parameters = read_safetensors(dir + "/export/model.safetensors");
  return r;
}

PlanSpec base_spec(const std::string& model) {
  PlanSpec s;
  s.model = model;
  s.layers = 8;
  s.micro_batch = 8;  // one micro-batch of the global batch of 8
  return s;
}

const TrainedRun& baseline(const std::string& model) {
  static std::map<std::string, TrainedRun> runs;
  auto it = runs.find(model);
  if (it == runs.end()) it = runs.emplace(model, train("parallel-baseline-" + model, base_spec(model), 1)).first;
  return it->second;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ModelParallelEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ModelParallelEquivalence, LossesAndExportedWeightsMatchTheOneRankRun) {
  const Case& c = GetParam();
  const TrainedRun& one = baseline(c.model);
  const TrainedRun many = train(c.name, c.spec, c.ranks);

  ASSERT_EQ(many.losses.size(), static_cast<std::size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(many.losses[i], one.losses[i], kTolerance * std::abs(one.losses[i])) << "step " << i + 1;
  }
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3);  // the loss really falls

  // The consolidated export holds every parameter whole (TP pieces joined, stages gathered, the
  // tied copy left out): 1e-4 over the model. Per tensor 1e-3: Adam divides by sqrt(v), so
  // elements with a near-zero gradient turn summation-order rounding into larger relative steps.
  expect_parameters_close(one.parameters, many.parameters, kTolerance);

  // Activation memory: the micro-batches each stage held at once equal the cost model's count
  // for the schedule (1F1B: p - s on stage s; GPipe: all m; interleaved: Megatron's warm-up).
  const auto& trace = many.measurement.at("trace");
  EXPECT_EQ(trace.at("peak_in_flight"), trace.at("predicted_in_flight")) << trace.at("peak_in_flight").dump();
}

Case make(const std::string& name, const std::string& model, int tp, int pp, int dp, int micro_batch,
          const std::string& schedule = "1f1b", int virtual_stages = 1, bool sp = false, int zero_stage = 0, int cp = 1) {
  Case c{name, model, tp * cp * pp * dp, base_spec(model)};
  c.spec.tp = tp;
  c.spec.cp = cp;
  c.spec.pp = pp;
  c.spec.ranks = dp;
  c.spec.micro_batch = micro_batch;
  c.spec.schedule = schedule;
  c.spec.virtual_stages = virtual_stages;
  c.spec.sequence_parallel = sp;
  c.spec.zero_stage = zero_stage;
  return c;
}

std::vector<Case> cases() {
  return {
      make("tp2", "tiny-llama", 2, 1, 1, 8),
      make("tp2_sequence_parallel", "tiny-llama", 2, 1, 1, 8, "1f1b", 1, true),
      // tp 4 > kv_heads 2: each key/value head is replicated on two ranks.
      make("tp4_replicated_kv_heads", "tiny-llama", 4, 1, 1, 8),
      make("pp2_gpipe", "tiny-llama", 1, 2, 1, 1, "gpipe"),
      make("pp2_1f1b", "tiny-llama", 1, 2, 1, 1),
      make("pp2_interleaved", "tiny-llama", 1, 2, 1, 1, "interleaved", 2),
      make("pp4_gpipe", "tiny-llama", 1, 4, 1, 1, "gpipe"),
      make("pp4_1f1b", "tiny-llama", 1, 4, 1, 1),
      make("pp4_interleaved", "tiny-llama", 1, 4, 1, 1, "interleaved", 2),
      make("tp2_pp2", "tiny-llama", 2, 2, 1, 2),
      make("tp2_pp2_dp2_zero1", "tiny-llama", 2, 2, 2, 1, "1f1b", 1, false, 1),
      make("tp2_sp_pp2_dp2_zero3", "tiny-llama", 2, 2, 2, 1, "1f1b", 1, true, 3),
      // Without TP under ZeRO-1 the fused path adds every gradient into the fp32 buffer itself
      // while the stages interleave micro-batches and the replicas reduce (gradient fusion).
      make("pp2_dp2_zero1", "tiny-llama", 1, 2, 2, 1, "1f1b", 1, false, 1),
      make("pp2_interleaved_dp2_ddp", "tiny-llama", 1, 2, 2, 1, "interleaved", 2),
      // GPT: biases, learned positions and tied embeddings split over the first and last stage.
      make("gpt_tp2_sequence_parallel", "tiny-gpt", 2, 1, 1, 8, "1f1b", 1, true),
      make("gpt_pp2_tied_embeddings", "tiny-gpt", 1, 2, 1, 2),
      make("gpt_pp2_dp2_zero2_tied_embeddings", "tiny-gpt", 1, 2, 2, 1, "1f1b", 1, false, 2),
      make("gpt_pp2_dp2_zero1_tied_embeddings", "tiny-gpt", 1, 2, 2, 1, "1f1b", 1, false, 1),
      // Context parallelism (issue 13): each rank holds chunks i and 2cp-1-i of the 32 tokens;
      // K/V all-gathered, gradients reduced over dp x cp.
      make("cp2", "tiny-llama", 1, 1, 1, 8, "1f1b", 1, false, 0, 2),
      make("cp4", "tiny-llama", 1, 1, 1, 8, "1f1b", 1, false, 0, 4),
      make("cp2_tp2_sequence_parallel", "tiny-llama", 2, 1, 1, 8, "1f1b", 1, true, 0, 2),
      make("cp2_pp2_dp2_zero1", "tiny-llama", 1, 2, 2, 1, "1f1b", 1, false, 1, 2),
      make("cp2_dp2_zero3", "tiny-llama", 1, 1, 2, 2, "1f1b", 1, false, 3, 2),
      // Learned positions of the global sequence; tied embeddings split over two stages.
      make("gpt_cp2_pp2_tied_embeddings", "tiny-gpt", 1, 2, 1, 2, "1f1b", 1, false, 0, 2),
  };
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelParallelEquivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Context parallelism's bytes: per layer and micro-batch, K and V of this rank's tokens
// all-gathered in the forward and their gradients reduce-scattered in the backward, (cp - 1)
// pieces each (context_parallel.hpp). tiny-llama: kv_dim = 2 heads x 16 = 32, fp32. cp2 with 8
// layers and one micro-batch of 8 x 16 tokens per rank: 2 x 1 x 128 x (32 + 32) x 4 B x 8 =
// 524288 B; full recompute gathers once more: x 3/2. The cost model must agree within 5%.
TEST(ContextParallelBytes, MeasuredBytesSentPerStepMatchTheCostModel) {
  struct Row {
    Case c;
    std::string recompute;
    double by_hand;  // 0: only against the cost model
  };
  const std::vector<Row> rows = {
      {make("bytes_cp2", "tiny-llama", 1, 1, 1, 8, "1f1b", 1, false, 0, 2), "none", 524288.0},
      {make("bytes_cp2_full_recompute", "tiny-llama", 1, 1, 1, 8, "1f1b", 1, false, 0, 2), "full", 786432.0},
      // cp 4: (cp - 1) = 3 pieces of 8 x 8 tokens: 2 x 3 x 64 x 64 x 4 B x 8 layers.
      {make("bytes_cp4", "tiny-llama", 1, 1, 1, 8, "1f1b", 1, false, 0, 4), "none", 786432.0},
      // tp 2 splits the kv heads: 16 + 16 per rank.
      {make("bytes_cp2_tp2", "tiny-llama", 2, 1, 1, 8, "1f1b", 1, true, 0, 2), "selective", 262144.0},
      {make("bytes_cp2_pp2_dp2", "tiny-llama", 1, 2, 2, 1, "1f1b", 1, false, 1, 2), "none", 0},
  };
  for (const Row& row : rows) {
    Case c = row.c;
    c.spec.recompute = row.recompute;
    const std::string dir = scratch_dir(c.name);
    const std::string plan_path = write_plan(dir, c.name, c.spec);
    const Outcome o = run_executor(c.ranks, "--plan " + plan_path + " --steps 2 --threads 1 --quiet --measurement " + dir + "/m.json");
    ASSERT_EQ(o.exit_code, 0) << c.name << "\n" << o.output;
    const double measured = read_json(dir + "/m.json").at("communication").at("cp_bytes_sent_per_step").get<double>();
    const double predicted = estimate_plan_file(plan_path).communication.cp_sent.value();
    EXPECT_NEAR(measured, predicted, 0.05 * predicted) << c.name;
    if (row.by_hand > 0) {
      EXPECT_EQ(measured, row.by_hand) << c.name;
    }
    EXPECT_GT(measured, 0.0) << c.name;
  }
}

// Stops `c` after 5 of 10 steps, resumes it, and compares the losses with an uninterrupted run;
// returns the number of shard files of the checkpoint.
int expect_resumed_run_equals_uninterrupted(const Case& c) {
  const std::string dir = scratch_dir(c.name);
  const std::string plan = write_plan(dir, c.name, c.spec);
  const std::string args = "--plan " + plan + " --steps " + std::to_string(kSteps) + " --lr 3e-3 --threads 1 --quiet ";
  EXPECT_EQ(run_executor(c.ranks, args + "--measurement " + dir + "/full.json").exit_code, 0);
  const Outcome first = run_executor(c.ranks, args + "--stop-after 5 --checkpoint-dir " + dir + "/ckpt");
  EXPECT_EQ(first.exit_code, 0) << first.output;
  const Outcome second = run_executor(c.ranks, args + "--resume " + dir + "/ckpt --measurement " + dir + "/resumed.json");
  EXPECT_EQ(second.exit_code, 0) << second.output;
  const auto full = read_json(dir + "/full.json").at("losses").get<std::vector<double>>();
  const auto resumed = read_json(dir + "/resumed.json").at("losses").get<std::vector<double>>();
  EXPECT_EQ(resumed.size(), full.size());
  for (std::size_t i = 0; i < std::min(full.size(), resumed.size()); ++i) EXPECT_EQ(resumed[i], full[i]) << c.name << " step " << i + 1;
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt/step_000005")) {
    shards += entry.path().filename().string().rfind("shard_pp", 0) == 0;
  }
  return shards;
}

TEST(ModelParallelCheckpoint, ResumingATensorAndPipelineRunGivesTheUninterruptedLosses) {
  // tp=2 x pp=2 with ZeRO-1 over dp=2 (8 ranks). One shard file per (stage, TP rank) of the first
  // replica: 2 x 2 x (ZeRO-1 shards over dp = 2).
  EXPECT_EQ(expect_resumed_run_equals_uninterrupted(make("resume_tp2_pp2_dp2", "tiny-gpt", 2, 2, 2, 1, "1f1b", 1, true, 1)), 8);
}

TEST(ModelParallelCheckpoint, ResumingAContextParallelRunGivesTheUninterruptedLosses) {
  // cp=2 x pp=2 with ZeRO-1 over dp=2 (8 ranks): ZeRO-1 shards over dp x cp = 4 per stage.
  EXPECT_EQ(expect_resumed_run_equals_uninterrupted(make("resume_cp2_pp2_dp2", "tiny-llama", 1, 2, 2, 1, "1f1b", 1, false, 1, 2)), 8);
}

}  // namespace
}  // namespace trainplan::testing
