// The pipeline bubble in the executor's recorded timeline (idle time within the step over
// compute time, per rank, averaged) against (p-1)/m for GPipe and 1F1B and (p-1)/(v m) for
// interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", SC'21, §2.2), and against the cost model's simulation of the same
// schedule. Timing tests: ctest runs this binary alone (RUN_SERIAL), since another process on
// the same cores changes pass times.

#include <cstdio>
#include <thread>

#include <gtest/gtest.h>

#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

// The bubble in the recorded timeline: per rank, idle time within the step over compute time.
// A model big enough that a pass (~10 ms) dwarfs a message; stages balanced by layer count.
double measured_bubble(const std::string& name, int pp, const std::string& schedule, int virtual_stages, double* predicted) {
  PlanSpec spec;
  spec.model = "tiny-llama";
  spec.layers = 8;
  spec.model_patch = {{"hidden", 256}, {"ffn_hidden", 768}, {"max_seq_len", 128}};
  spec.seq_len = 128;
  spec.pp = pp;
  spec.micro_batch = 2;
  spec.global_batch = 16;  // m = 8
  spec.schedule = schedule;
  spec.virtual_stages = virtual_stages;
  const std::string dir = scratch_dir(name);
  const std::string plan = write_plan(dir, name, spec);
  const Outcome o = run_executor(pp, "--plan " + plan + " --steps 6 --threads 1 --quiet --measurement " + dir + "/m.json");
  if (o.exit_code != 0) throw std::runtime_error(name + " failed:\n" + o.output);
  const auto trace = read_json(dir + "/m.json").at("trace");
  *predicted = trace.at("predicted_bubble_fraction").get<double>();
  return trace.at("bubble_fraction").get<double>();
}

TEST(PipelineBubble, MatchesTheScheduleOnTwoStages) {
  // p = 2, m = 8: (p-1)/m = 0.125 for GPipe and 1F1B, (p-1)/(v m) = 0.0625 interleaved (v = 2).
  struct Expect { const char* schedule; int v; double bubble; };
  for (const Expect& e : {Expect{"gpipe", 1, 0.125}, Expect{"1f1b", 1, 0.125}, Expect{"interleaved", 2, 0.0625}}) {
    double predicted = 0;
    const double measured = measured_bubble(std::string("bubble2_") + e.schedule, 2, e.schedule, e.v, &predicted);
    std::printf("pp=2 %-11s bubble measured %.3f, cost model's schedule %.3f, closed form %.3f\n", e.schedule, measured, predicted, e.bubble);
    EXPECT_NEAR(predicted, e.bubble, 0.02) << e.schedule;  // the head and embedding make stages slightly unequal
    EXPECT_NEAR(measured, e.bubble, 0.05) << e.schedule;
    EXPECT_NEAR(measured, predicted, 0.05) << e.schedule;
  }
}

TEST(PipelineBubble, MatchesTheScheduleOnFourStages) {
  // Four ranks need four cores: on fewer, stages share cores and a pass's time depends on how
  // many other stages compute at that moment, which is not the schedule's bubble.
  if (std::thread::hardware_concurrency() < 4) GTEST_SKIP() << "needs 4 cores, this machine has " << std::thread::hardware_concurrency();
  struct Expect { const char* schedule; int v; double bubble; };
  for (const Expect& e : {Expect{"gpipe", 1, 0.375}, Expect{"1f1b", 1, 0.375}, Expect{"interleaved", 2, 0.1875}}) {
    double predicted = 0;
    const double measured = measured_bubble(std::string("bubble4_") + e.schedule, 4, e.schedule, e.v, &predicted);
    std::printf("pp=4 %-11s bubble measured %.3f, cost model's schedule %.3f, closed form %.3f\n", e.schedule, measured, predicted, e.bubble);
    EXPECT_NEAR(measured, e.bubble, 0.05) << e.schedule;
  }
}

}  // namespace
}  // namespace trainplan::testing
