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
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::testing {
namespace {

// What the executor recorded for one pipeline run.
struct Measured {
  double bubble = 0;          // median over steps of the measured bubble
  double predicted = 0;       // the cost model's simulation of the plan (its own pass times)
  double replayed = 0;        // the schedule simulated with the pass times this run measured
};

// A model big enough that a pass (~20 ms on one core) dwarfs a message; 8 micro-batches.
Measured run_pipeline(const std::string& name, int pp, const std::string& schedule, int virtual_stages) {
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
  Measured m;
  m.bubble = trace.at("bubble_fraction").get<double>();
  m.predicted = trace.at("predicted_bubble_fraction").get<double>();
  // Replay: each stage's measured forward and backward time per micro-batch, in the same schedule.
  costmodel::PipelineTimeline t;
  t.stages = pp;
  t.virtual_stages = virtual_stages;
  t.micro_batches = 8;
  t.schedule = schedule == "gpipe" ? costmodel::Schedule::kGpipe
               : schedule == "1f1b" ? costmodel::Schedule::kOneFOneB
                                    : costmodel::Schedule::kInterleaved;
  t.forward_seconds.assign(pp, 0.0);
  t.backward_seconds.assign(pp, 0.0);
  for (const auto& e : trace.at("events")) {
    const std::string kind = e.at("kind");
    const auto stage = e.at("stage").get<std::size_t>();
    const double length = (e.at("end").get<double>() - e.at("start").get<double>()) / t.micro_batches;
    if (kind == "forward") t.forward_seconds[stage] += length;
    if (kind == "backward") t.backward_seconds[stage] += length;
  }
  const auto replay = costmodel::simulate_pipeline(t);
  if (!replay) throw std::runtime_error(replay.error().message);
  m.replayed = replay->bubble_fraction;
  return m;
}

// Printed: the measured bubble, the schedule replayed with the mean pass times this run measured,
// the cost model's prediction and the closed form. Asserted: the cost model's schedule gives the
// closed form within 0.03 (its stages are nearly equal), and the measured bubble is within 0.15
// of it. The closed form needs equal, steady passes; on 2 shared CPU cores a pass's time depends
// on what the other stage does at that moment (the last stage's forwards run 10-40% longer while
// the first stage computes), so "within a few percent" is not reachable here: measured 0.16 to
// 0.23 against 0.125 (GPipe, 1F1B) and 0.11 against 0.0625 (interleaved) on the development VM,
// where the same one-rank run varies by up to 35% from run to run (bench/results.md).
// Before the MPI progress thread the same test measured 1.03 and 0.49, which this bound catches.
void check(int pp, double closed_gpipe, double closed_interleaved) {
  struct Expect { const char* schedule; int v; double bubble; };
  for (const Expect& e : {Expect{"gpipe", 1, closed_gpipe}, Expect{"1f1b", 1, closed_gpipe}, Expect{"interleaved", 2, closed_interleaved}}) {
    const Measured m = run_pipeline("bubble" + std::to_string(pp) + "_" + e.schedule, pp, e.schedule, e.v);
    std::printf("pp=%d %-11s bubble measured %.3f | replayed with measured pass times %.3f | cost model %.3f | closed form %.3f\n", pp,
                e.schedule, m.bubble, m.replayed, m.predicted, e.bubble);
    EXPECT_NEAR(m.predicted, e.bubble, 0.03) << e.schedule;
    EXPECT_NEAR(m.bubble, e.bubble, 0.15) << e.schedule;
  }
}

TEST(PipelineBubble, MatchesTheScheduleOnTwoStages) {
  // p = 2, m = 8: (p-1)/m = 0.125 for GPipe and 1F1B, (p-1)/(v m) = 0.0625 interleaved (v = 2).
  check(2, 0.125, 0.0625);
}

TEST(PipelineBubble, MatchesTheScheduleOnFourStages) {
  // Four ranks need four cores: on fewer, stages share cores and a pass's time depends on how
  // many other stages compute at that moment.
  if (std::thread::hardware_concurrency() < 4) GTEST_SKIP() << "needs 4 cores, this machine has " << std::thread::hardware_concurrency();
  check(4, 0.375, 0.1875);
}

}  // namespace
}  // namespace trainplan::testing
