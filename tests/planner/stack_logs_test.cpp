// Training logs of torchtitan and Megatron-LM read as measurements (planner/stack_logs.hpp), so a
// run of an export meets its prediction in `planner compare`. The samples (tests/data/logs/README.md):
// a torchtitan run of Qwen3 14B on 8 B200 (pytorch/torchtitan 026cf9af14f8, run.log of
// outputs/autoresearch/may19-qwen3-14b/run230-...) and Megatron-LM's iteration lines of Mixtral
// 8x7B on 16 H100 (NVIDIA/Megatron-LM issue 756). Expected values worked by hand from the lines.

#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/planner/stack_logs.hpp"

namespace trainplan {
namespace {

using planner::StackLog;

std::string read(const std::string& path) { return testing::read_text(path); }

using testing::quote;

const std::string kTitan = testing::data_path("logs/torchtitan-qwen3-14b-8xb200.log");
const std::string kMegatron = testing::data_path("logs/megatron-mixtral-8x7b-16xh100.log");

TEST(StackLogs, EachStackIsKnownByItsStepLines) {
  EXPECT_EQ(planner::detect_stack_log(read(kTitan)), StackLog::kTorchtitan);
  EXPECT_EQ(planner::detect_stack_log(read(kMegatron)), StackLog::kMegatron);
  EXPECT_FALSE(planner::detect_stack_log(read(testing::data_path("tinyllama-4x-zero2.measurement.json"))));
  EXPECT_FALSE(planner::detect_stack_log("step 5 of something else\niteration 3 done\n"));
}

TEST(StackLogs, ATorchtitanLogIsItsMeshBatchAndTokensPerSecond) {
  // The header states everything: mesh pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=2 (8 GPUs);
  // global batch 640 of 128 tokens; NVIDIA B200; blocks compiled. tps of steps 2-10: 8,750 8,529
  // 8,884 9,095 9,204 9,217 9,190 9,296 9,323, median 9,190 per GPU (step 1 compiles: 341).
  auto d = planner::read_stack_log(kTitan, read(kTitan), StackLog::kTorchtitan, {});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->schema, planner::kMeasurementSchema);
  EXPECT_EQ(d->world_size, 8);
  ASSERT_TRUE(d->layout);
  EXPECT_EQ(d->layout->text(), "tp2 pp1 dp4 zero0");
  EXPECT_EQ(d->device, "NVIDIA B200");
  EXPECT_EQ(d->stack, "fsdp2-compile");
  EXPECT_DOUBLE_EQ(d->throughput.at("tokens_per_second_per_gpu"), 9190.0);
  EXPECT_DOUBLE_EQ(d->throughput.at("tokens_per_second"), 73520.0);
  EXPECT_NEAR(d->time.at("step_seconds"), 640.0 * 128 / 73520.0, 1e-12);  // 1.1143 s
  EXPECT_DOUBLE_EQ(d->memory.at("reserved_bytes"), 100.35 * 1073741824.0);  // the peak "memory: 100.35GiB"
  ASSERT_EQ(d->losses.size(), 10u);
  EXPECT_DOUBLE_EQ(d->losses.front(), 3.11665);
  EXPECT_DOUBLE_EQ(d->losses.back(), 1.76364);
}

TEST(StackLogs, AMegatronLogIsItsIterationTimesAndMemoryReport) {
  // Iterations 3-73 (2 pays the warm-up): 5410.6 5912.1 5571.1 5718.9 5361.6 5470.7 5829.9 ms,
  // median 5571.1; 128 sequences; "using world size: 16, data-parallel size: 8, ...
  // tensor-model-parallel size: 2, pipeline-model-parallel size: 1"; max allocated 54250.99 MB,
  // max reserved 61480 MB. The sequence length is not in these lines: the plan's 4096.
  planner::LogDefaults plan;
  plan.seq_len = 4096;
  plan.ep = 8;
  plan.zero_stage = 1;
  auto d = planner::read_stack_log(kMegatron, read(kMegatron), StackLog::kMegatron, plan);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->world_size, 16);
  ASSERT_TRUE(d->layout);
  EXPECT_EQ(d->layout->text(), "tp2 pp1 dp8 ep8 zero1");
  EXPECT_EQ(d->stack, "megatron-te");
  EXPECT_DOUBLE_EQ(d->time.at("step_seconds"), 5.5711);
  EXPECT_NEAR(d->throughput.at("tokens_per_second"), 128.0 * 4096 / 5.5711, 1e-9);
  EXPECT_NEAR(d->throughput.at("tokens_per_second_per_gpu"), 128.0 * 4096 / 5.5711 / 16, 1e-9);
  EXPECT_DOUBLE_EQ(d->memory.at("reserved_bytes"), 61480.0 * 1048576.0);
  EXPECT_DOUBLE_EQ(d->memory.at("total_bytes"), 54250.98583984375 * 1048576.0);
  ASSERT_EQ(d->losses.size(), 8u);
  EXPECT_DOUBLE_EQ(d->losses.back(), 1.798953);
}

TEST(StackLogs, WhatNeitherTheLogNorThePlanSaysIsAnError) {
  auto no_length = planner::read_stack_log("m.log", read(kMegatron), StackLog::kMegatron, {});
  ASSERT_FALSE(no_length);
  EXPECT_EQ(no_length.error().message, "m.log: the megatron-lm log states no sequence length, and the plan gives none");
  auto empty = planner::read_stack_log("t.log", "[titan] Training starts at step 1\n", StackLog::kTorchtitan, {});
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().message, "t.log: no step lines in this torchtitan log");
}

// The sample logs with one value edited: a value that is not a number above 0 (a zero time, a
// number the log would not print whole) names its line; a log of other work than the plan's is
// refused rather than set beside the plan's prediction.
std::string edited(const std::string& text, const std::string& from, const std::string& to) {
  std::string out = text;
  const auto at = out.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) out.replace(at, from.size(), to);
  return out;
}

TEST(StackLogs, AValueThatIsNotANumberAboveZeroNamesItsLine) {
  planner::LogDefaults plan;
  plan.seq_len = 4096;
  // Megatron's second iteration line (line 3 of the sample) at 0 ms: a step of no time.
  auto zero = planner::read_stack_log("m.log", edited(read(kMegatron), "(ms): 5630.1", "(ms): 0"), StackLog::kMegatron, plan);
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().message, "m.log: line 3: elapsed time per iteration (ms) \"0\" is not a number above 0 (a megatron-lm log)");
  // "1e999" is beyond a double: refused, not read as 1.
  auto huge = planner::read_stack_log("m.log", edited(read(kMegatron), "(ms): 5630.1", "(ms): 1e999"), StackLog::kMegatron, plan);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().message.find("\"1e999\" is not a number above 0"), std::string::npos) << huge.error().message;
  // An exponent is read whole: 5.6e3 ms is 5.6 s, not 5.6 ms.
  auto exponent = planner::read_stack_log("m.log", edited(read(kMegatron), "(ms): 5630.1", "(ms): 5.6301e3"), StackLog::kMegatron, plan);
  ASSERT_TRUE(exponent.ok()) << exponent.error().message;
  auto plain = planner::read_stack_log("m.log", read(kMegatron), StackLog::kMegatron, plan);
  ASSERT_TRUE(plain.ok());
  EXPECT_DOUBLE_EQ(exponent->time.at("step_seconds"), plain->time.at("step_seconds"));
  // torchtitan's tps of 0 on a step line.
  const std::string titan = read(kTitan);
  const auto step = titan.find("tps: 8,750");
  ASSERT_NE(step, std::string::npos);
  auto stalled = planner::read_stack_log("t.log", edited(titan, "tps: 8,750", "tps: 0"), StackLog::kTorchtitan, {});
  ASSERT_FALSE(stalled);
  const int line = 1 + static_cast<int>(std::count(titan.begin(), titan.begin() + static_cast<long>(step), '\n'));
  EXPECT_EQ(stalled.error().message, "t.log: line " + std::to_string(line) + ": tps \"0\" is not a number above 0 (a torchtitan log)");
}

TEST(StackLogs, ALogOfOtherWorkThanThePlansIsRefused) {
  planner::LogDefaults plan;
  plan.seq_len = 4096;
  plan.global_batch = 256;  // the log's iterations say 128
  auto other = planner::read_stack_log("m.log", read(kMegatron), StackLog::kMegatron, plan);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().message, "m.log: the megatron-lm log ran global batch 128 where the plan has 256; compare a log with the plan it ran");
  planner::LogDefaults eight;
  eight.world_size = 16;  // the torchtitan sample's mesh is 8 GPUs
  auto ranks = planner::read_stack_log("t.log", read(kTitan), StackLog::kTorchtitan, eight);
  ASSERT_FALSE(ranks);
  EXPECT_EQ(ranks.error().message, "t.log: the torchtitan log ran world size 8 where the plan has 16; compare a log with the plan it ran");
}

class StackLogCli : public testing::PlannerCliTest {};

TEST_F(StackLogCli, ComparePredictsThePlanForTheStackThatWroteTheLog) {
  const std::string plan = testing::data_path("logs/mixtral-8x7b-16xh100.plan.json");
  const auto r = run("compare " + quote(plan) + " " + quote(kMegatron) + " --format json");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  bool step = false;
  for (const auto& row : j.at("rows")) {
    if (row.at("key") == "step_seconds") {
      step = true;
      EXPECT_DOUBLE_EQ(row.at("measured").get<double>(), 5.5711);
      EXPECT_GT(row.at("predicted").get<double>(), 0.0);
    }
  }
  EXPECT_TRUE(step) << r.out;
  // The prediction is for megatron-te, the stack the log says ran: no "stack differs" warning.
  EXPECT_EQ(r.out.find("software stack differs"), std::string::npos) << r.out;

  const auto titan = run("compare " + quote(testing::data_path("logs/qwen3-14b-8xb200.plan.json")) + " " + quote(kTitan));
  ASSERT_EQ(titan.exit_code, 0) << titan.all();
  EXPECT_NE(titan.out.find("Device       NVIDIA B200 (estimated for dgx-b200)"), std::string::npos) << titan.out;
  EXPECT_NE(titan.out.find("10 steps, loss 3.117 -> 1.764"), std::string::npos) << titan.out;
}

TEST_F(StackLogCli, TextThatIsNeitherAMeasurementNorALogIsRefused) {
  const auto path = write("notes.txt", "hello\nworld\n");
  const auto r = run("compare " + quote(testing::data_path("logs/mixtral-8x7b-16xh100.plan.json")) + " " + quote(path.string()));
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find(path.string() + ": neither a trainplan/measurement/v1 document (JSON) nor a torchtitan or Megatron-LM training log"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace trainplan
