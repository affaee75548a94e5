// The executor's pipeline runs the schedule the cost model prices: on every stage, the forward and
// backward passes in its recorded timeline come in costmodel::pipeline_order's order (GPipe, 1F1B,
// interleaved 1F1B; Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", SC'21, §2.2), each stage holds at most the micro-batches the cost
// model's activation memory counts, and the cost model's simulation of the plan gives the closed
// form (p-1)/(v m). Nothing here depends on how long a pass takes: the measured bubble is a
// benchmark (bench/pipeline_bench.sh, bench/results.md), since on 2 shared CPU cores a pass's time
// depends on what the other stage does at that moment (this test once asserted it, within 0.15, and
// failed clean-clone CI at random: 0.33 measured against 0.0625 interleaved).

#include <algorithm>
#include <cstdio>

#include <gtest/gtest.h>

#include "executor_support.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::testing {
namespace {

namespace cm = trainplan::costmodel;

struct Expect {
  const char* schedule;
  cm::Schedule kind;
  int virtual_stages;
};

// Runs a pp-stage plan (8 layers, 8 micro-batches of 2) for 2 steps and checks its trace.
void check(int pp, const Expect& e, double closed_form) {
  const std::string name = "order" + std::to_string(pp) + "_" + e.schedule;
  PlanSpec spec;
  spec.model = "tiny-llama";
  spec.layers = 8;
  // Layers wide enough that the head (vocab 256) leaves the stages nearly equal.
  spec.model_patch = {{"hidden", 256}, {"ffn_hidden", 768}, {"max_seq_len", 128}};
  spec.seq_len = 128;
  spec.pp = pp;
  spec.micro_batch = 2;
  spec.global_batch = 16;  // m = 8
  spec.schedule = e.schedule;
  spec.virtual_stages = e.virtual_stages;
  const std::string dir = scratch_dir(name);
  const std::string plan = write_plan(dir, name, spec);
  const Outcome o = run_executor(pp, "--plan " + plan + " --steps 2 --threads 1 --quiet --measurement " + dir + "/m.json");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const auto trace = read_json(dir + "/m.json").at("trace");
  constexpr int kMicroBatches = 8;
  ASSERT_EQ(trace.at("micro_batches").get<int>(), kMicroBatches);

  const auto order = cm::pipeline_order(e.kind, pp, e.virtual_stages, kMicroBatches);
  ASSERT_TRUE(order.ok()) << order.error().message;

  // Each stage's passes as its rank ran them: sorted by start on that rank's clock.
  struct Ran {
    double start;
    cm::PipelinePass pass;
  };
  std::vector<std::vector<Ran>> ran(static_cast<std::size_t>(pp));
  for (const auto& event : trace.at("events")) {
    const std::string kind = event.at("kind");
    if (kind != "forward" && kind != "backward") continue;
    cm::PipelinePass pass;
    pass.kind = kind == "forward" ? cm::PassKind::kForward : cm::PassKind::kBackward;
    pass.micro_batch = event.at("micro_batch").get<int>();
    pass.chunk = event.at("chunk").get<int>();
    ran.at(event.at("stage").get<std::size_t>()).push_back({event.at("start").get<double>(), pass});
  }
  for (int stage = 0; stage < pp; ++stage) {
    auto& mine = ran[static_cast<std::size_t>(stage)];
    std::stable_sort(mine.begin(), mine.end(), [](const Ran& a, const Ran& b) { return a.start < b.start; });
    const auto& want = (*order)[static_cast<std::size_t>(stage)];
    ASSERT_EQ(mine.size(), want.size()) << e.schedule << " stage " << stage;
    // Every (micro-batch, chunk) forward and backward once each: 2 v m passes.
    EXPECT_EQ(want.size(), static_cast<std::size_t>(2 * e.virtual_stages * kMicroBatches));
    for (std::size_t i = 0; i < want.size(); ++i) {
      const cm::PipelinePass& got = mine[i].pass;
      EXPECT_TRUE(got == want[i]) << e.schedule << " stage " << stage << " pass " << i << ": ran " << cm::pass_kind_name(got.kind)
                                  << " of micro-batch " << got.micro_batch << " chunk " << got.chunk << ", the schedule has "
                                  << cm::pass_kind_name(want[i].kind) << " of micro-batch " << want[i].micro_batch << " chunk "
                                  << want[i].chunk;
    }
  }

  // Micro-batches held at the peak: what the runner counted is what the cost model's activation
  // memory charges (GPipe m, 1F1B p - s, interleaved Megatron's warm-up over v).
  const auto held = trace.at("peak_in_flight").get<std::vector<double>>();
  const auto charged = trace.at("predicted_in_flight").get<std::vector<double>>();
  ASSERT_EQ(held.size(), static_cast<std::size_t>(pp));
  for (int stage = 0; stage < pp; ++stage) EXPECT_DOUBLE_EQ(held[stage], charged[stage]) << e.schedule << " stage " << stage;

  // The cost model's own simulation of the plan: on two stages they are nearly equal (the head
  // makes the last one slightly longer), so it gives the closed form within 0.03.
  if (pp == 2) {
    EXPECT_NEAR(trace.at("predicted_bubble_fraction").get<double>(), closed_form, 0.03) << e.schedule;
  }
  std::printf("pp=%d %-11s order as scheduled; held %s; bubble measured %.3f (not asserted: bench/pipeline_bench.sh) | cost model %.3f | "
              "closed form %.3f\n",
              pp, e.schedule, nlohmann::json(held).dump().c_str(), trace.at("bubble_fraction").get<double>(),
              trace.at("predicted_bubble_fraction").get<double>(), closed_form);
}

TEST(PipelineSchedule, TwoStagesRunEachScheduleInItsOrder) {
  // p = 2, m = 8: (p-1)/m = 0.125 for GPipe and 1F1B, (p-1)/(v m) = 0.0625 interleaved (v = 2).
  check(2, {"gpipe", cm::Schedule::kGpipe, 1}, 0.125);
  check(2, {"1f1b", cm::Schedule::kOneFOneB, 1}, 0.125);
  check(2, {"interleaved", cm::Schedule::kInterleaved, 2}, 0.0625);
}

TEST(PipelineSchedule, FourStagesRunEachScheduleInItsOrder) {
  // p = 4, m = 8: 3/8 = 0.375 for GPipe and 1F1B, 3/16 = 0.1875 interleaved (v = 2), printed
  // beside the cost model's simulation, which is not asserted to match: with two layers a stage,
  // the embedding and the head make the end stages longer and the simulated bubble larger (0.42
  // and 0.24). The order does not depend on cores, so four ranks on two cores check it.
  check(4, {"gpipe", cm::Schedule::kGpipe, 1}, 0.375);
  check(4, {"1f1b", cm::Schedule::kOneFOneB, 1}, 0.375);
  check(4, {"interleaved", cm::Schedule::kInterleaved, 2}, 0.1875);
}

}  // namespace
}  // namespace trainplan::testing
