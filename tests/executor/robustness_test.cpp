// Checkpoints, resume, failures and bad input: the run stops with a clear message naming what
// and where, within a bounded time, and loses nothing already checkpointed.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

namespace fs = std::filesystem;

std::string common_args(const std::string& plan) { return "--plan " + plan + " --steps 20 --lr 3e-3 --threads 1 --quiet "; }

// A 2-rank tiny-llama plan with the given ZeRO stage in a fresh directory; returns the plan path.
std::string two_rank_plan(const std::string& dir, int zero_stage, int micro_batch) {
  PlanSpec spec;
  spec.ranks = 2;
  spec.zero_stage = zero_stage;
  spec.micro_batch = micro_batch;
  return write_plan(dir, "plan", spec);
}

TEST(Resume, StoppingAtStepTenAndResumingGivesTheUninterruptedLosses) {
  const std::string dir = scratch_dir("resume");
  const std::string plan = two_rank_plan(dir, 2, 2);
  ASSERT_EQ(run_executor(2, common_args(plan) + "--measurement " + dir + "/full.json").exit_code, 0);
  const Outcome first = run_executor(2, common_args(plan) + "--stop-after 10 --checkpoint-dir " + dir + "/ckpt");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(fs::exists(dir + "/ckpt/step_000010/manifest.json"));
  const Outcome second = run_executor(2, common_args(plan) + "--resume " + dir + "/ckpt --measurement " + dir + "/resumed.json");
  ASSERT_EQ(second.exit_code, 0) << second.output;

  const auto full = read_json(dir + "/full.json").at("losses").get<std::vector<double>>();
  const auto resumed = read_json(dir + "/resumed.json");
  const auto losses = resumed.at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 20u);
  ASSERT_EQ(resumed.at("steps").size(), 10u);  // this run trained steps 11..20
  EXPECT_EQ(resumed.at("steps")[0].at("step"), 11);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_DOUBLE_EQ(losses[i], full[i]) << "step " << i + 1;
}

TEST(Resume, ATruncatedShardIsDetectedAndNamed) {
  const std::string dir = scratch_dir("corrupt");
  const std::string plan = two_rank_plan(dir, 3, 4);
  ASSERT_EQ(run_executor(2, common_args(plan) + "--stop-after 3 --checkpoint-dir " + dir + "/ckpt").exit_code, 0);
  const std::string shard = dir + "/ckpt/step_000003/shard_00001.bin";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const Outcome o = run_executor(2, common_args(plan) + "--resume " + dir + "/ckpt");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("shard_00001.bin"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("truncated"), std::string::npos) << o.output;
}

TEST(Resume, AFlippedByteFailsTheChecksum) {
  const std::string dir = scratch_dir("bitflip");
  const std::string plan = two_rank_plan(dir, 1, 4);
  ASSERT_EQ(run_executor(2, common_args(plan) + "--stop-after 2 --checkpoint-dir " + dir + "/ckpt").exit_code, 0);
  const std::string shard = dir + "/ckpt/step_000002/shard_00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  const Outcome o = run_executor(2, common_args(plan) + "--resume " + dir + "/ckpt");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("shard_00000.bin: CRC-32 mismatch"), std::string::npos) << o.output;
}

// A damaged newest checkpoint (a shard cut short, as by a full disk or a copy that stopped) is
// skipped for the newest intact one, with a warning naming it, and the run continues exactly as
// the uninterrupted one: nothing of the damaged checkpoint is loaded.
TEST(Resume, ADamagedNewestCheckpointFallsBackToThePreviousOneAndSaysSo) {
  const std::string dir = scratch_dir("fallback");
  const std::string plan = two_rank_plan(dir, 2, 2);
  ASSERT_EQ(run_executor(2, common_args(plan) + "--measurement " + dir + "/full.json").exit_code, 0);
  const Outcome first = run_executor(2, common_args(plan) + "--stop-after 6 --checkpoint-every 3 --checkpoint-dir " + dir + "/ckpt");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string shard = dir + "/ckpt/step_000006/shard_00001.bin";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);

  const Outcome resumed = run_executor(2, common_args(plan) + "--resume " + dir + "/ckpt --measurement " + dir + "/resumed.json");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("[rank 0] executor: warning: --resume: skipping a damaged checkpoint, " + dir + "/ckpt/step_000006: " + shard),
            std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("(truncated or overwritten shard)"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/ckpt/step_000003 at step 3 (fell back to the newest intact checkpoint"),
            std::string::npos) << resumed.output;
  const auto full = read_json(dir + "/full.json").at("losses").get<std::vector<double>>();
  const auto losses = read_json(dir + "/resumed.json").at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 20u);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_DOUBLE_EQ(losses[i], full[i]) << "step " << i + 1;
}

// The manifest carries the CRC-32 of its own text: an edit that leaves it valid JSON (here the
// trainer's step) is damage, not data to load.
TEST(Resume, AnEditedManifestFailsItsOwnChecksum) {
  const std::string dir = scratch_dir("manifest");
  const std::string plan = two_rank_plan(dir, 1, 4);
  ASSERT_EQ(run_executor(2, common_args(plan) + "--stop-after 2 --checkpoint-dir " + dir + "/ckpt").exit_code, 0);
  const std::string manifest = dir + "/ckpt/step_000002/manifest.json";
  nlohmann::json m = read_json(manifest);
  ASSERT_TRUE(m.contains("manifest_crc32")) << m.dump();
  m["trainer"]["step"] = 1;
  std::ofstream(manifest) << m.dump(2);
  const Outcome o = run_executor(2, common_args(plan) + "--resume " + dir + "/ckpt");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("no intact checkpoint to resume from: " + dir + "/ckpt/step_000002: " + manifest + ": CRC-32 mismatch (corrupt manifest)"),
            std::string::npos) << o.output;
}

// Two ranks failing at once (a token file neither can open): each line they print starts with
// its rank, so the lines cannot run into each other and say whose they are.
TEST(Failure, RanksFailingAtOncePrefixEveryLineWithTheirRank) {
  const std::string dir = scratch_dir("prefix");
  const std::string plan = two_rank_plan(dir, 1, 4);
  const Outcome o = run_executor(2, common_args(plan) + "--data " + dir + "/no-such-tokens.bin");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  std::istringstream lines(o.output);
  int reported = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("executor: ") == std::string::npos) continue;  // mpirun's own lines
    EXPECT_TRUE(line.rfind("[rank 0] executor: ", 0) == 0 || line.rfind("[rank 1] executor: ", 0) == 0) << line << "\nin:\n" << o.output;
    if (line.find("no-such-tokens.bin: cannot open token file") != std::string::npos) ++reported;
  }
  EXPECT_GE(reported, 1) << o.output;
}

TEST(Failure, AKilledRankEndsTheRunWithinSixtySecondsAndKeepsCheckpoints) {
  const std::string dir = scratch_dir("killed");
  const std::string plan = two_rank_plan(dir, 2, 4);
  // `timeout 120` only guards the test itself against a hang.
  const Outcome o = run_command("timeout 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(TRAINPLAN_MPIRUN) +
                                " --oversubscribe --mca btl_vader_single_copy_mechanism none -n 2 " + TRAINPLAN_EXECUTOR_BIN + " " +
                                common_args(plan) + "--timeout 30 --checkpoint-dir " + dir + "/ckpt --checkpoint-every 2 --fail-at-step 6 --fail-rank 1");
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_NE(o.exit_code, 124) << "the run hung until the test's guard: " << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  // Steps 2 and 4 were checkpointed before the failure; the newest is complete and resumable.
  EXPECT_TRUE(fs::exists(dir + "/ckpt/step_000004/manifest.json"));
  const Outcome resumed = run_executor(2, "--plan " + plan + " --steps 6 --lr 3e-3 --threads 1 --quiet --resume " + dir + "/ckpt");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 4"), std::string::npos) << resumed.output;
}

TEST(Data, ATokenBeyondTheVocabIsAnErrorNamingFileAndOffset) {
  const std::string dir = scratch_dir("tokens");
  const std::string tokens = dir + "/tokens.bin";
  {
    std::vector<uint16_t> ids(4096);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 256);
    ids[1000] = 300;  // tiny-llama's vocab is 256
    std::ofstream(tokens, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 2));
  }
  PlanSpec spec;
  const std::string plan = write_plan(dir, "tokens", spec);
  const Outcome o = run_executor(1, common_args(plan) + "--data " + tokens);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("tokens.bin: token 300 at token offset 1000"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(">= the model's vocab 256"), std::string::npos) << o.output;
}

TEST(Data, ATokenFileTrainsAndEveryRankReadsDistinctSamples) {
  const std::string dir = scratch_dir("tokenfile");
  const std::string tokens = dir + "/tokens.bin";
  {
    std::vector<uint32_t> ids(20000);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7) % 256);
    std::ofstream(tokens, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  }
  PlanSpec one, two;
  two.ranks = 2;
  two.micro_batch = 4;
  const std::string a = write_plan(dir, "one", one), b = write_plan(dir, "two", two);
  const std::string data = "--data " + tokens + " --data-dtype uint32 ";
  ASSERT_EQ(run_executor(1, common_args(a) + data + "--measurement " + dir + "/one.measurement.json").exit_code, 0);
  ASSERT_EQ(run_executor(2, common_args(b) + data + "--measurement " + dir + "/two.measurement.json").exit_code, 0);
  const auto l1 = read_json(dir + "/one.measurement.json").at("losses").get<std::vector<double>>();
  const auto l2 = read_json(dir + "/two.measurement.json").at("losses").get<std::vector<double>>();
  // Same samples split over two ranks: same losses; the +7 successor rule is learnt fast.
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l2[i], l1[i], 1e-5 * l1[i]);
  EXPECT_LT(l1.back(), l1.front() - 1.0);
}

// Issue 13: context parallelism cuts each sequence into 2 cp equal chunks (causal load
// balancing); a sequence that does not split is refused with the rule, before any rank starts.
TEST(Plan, ContextParallelPlansWhoseSequenceDoesNotSplitInto2CpChunksAreRefused) {
  const std::string dir = scratch_dir("cp");
  PlanSpec spec;
  spec.cp = 4;
  spec.seq_len = 36;  // divisible by cp = 4, not by 2 cp = 8
  const std::string plan = write_plan(dir, "cp", spec);
  const Outcome o = run_executor(1, common_args(plan));
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("context parallelism: seq_len (36) must split into 2 x cp(4) = 8 equal chunks"), std::string::npos) << o.output;
}

TEST(Plan, AWrongNumberOfRanksNamesBothCounts) {
  const std::string dir = scratch_dir("ranks");
  PlanSpec spec;
  spec.ranks = 4;
  spec.micro_batch = 2;
  const std::string plan = write_plan(dir, "ranks", spec);
  const Outcome o = run_executor(2, common_args(plan));
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.output.find("the plan is for 4 GPUs"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("but 2 ranks were started"), std::string::npos) << o.output;
}

TEST(Plan, AMismatchedLayoutNamesEveryFactor) {
  // torchtitan's rule: the error names every axis, so the fix is obvious.
  const std::string dir = scratch_dir("factors");
  PlanSpec spec;
  spec.tp = 2;
  spec.pp = 2;
  spec.layers = 4;
  spec.micro_batch = 4;
  const std::string plan = write_plan(dir, "factors", spec);
  const Outcome o = run_executor(2, common_args(plan));
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.output.find("tp(2) * cp(1) * pp(2) * dp(1) = 4 != world size (2)"), std::string::npos) << o.output;
}

TEST(Options, OutOfRangeValuesAndUnwritableOutputsAreRefusedBeforeTraining) {
  const std::string dir = scratch_dir("options");
  const std::string plan = write_plan(dir, "options", PlanSpec{});
  std::ofstream(dir + "/a-file") << "x";
  const struct {
    std::string args, message;
  } cases[] = {
      {"--min-lr-ratio -1", "--min-lr-ratio: must be from 0 to 1 (got -1)"},
      {"--weight-decay -0.5", "--weight-decay: must be >= 0 (got -0.5)"},
      {"--clip-grad -1", "--clip-grad: must be >= 0"},
      {"--warmup-steps -5", "--warmup-steps: must be >= 0, or -1"},
      {"--timeout 0", "--timeout: must be at least 1 second"},
      {"--threads 5000", "--threads: must be from 0 (cores / local ranks) to 1024 (got 5000)"},
      {"--trace-step 99", "--trace-step: must be from 1 to --steps (2)"},
      {"--measurement " + dir + "/missing/m.json", "directory " + dir + "/missing does not exist"},
      {"--checkpoint-dir " + dir + "/a-file", "--checkpoint-dir " + dir + "/a-file: exists and is not a directory"},
      {"--measurement " + plan, "--measurement " + plan + ": is the --plan file " + plan + "; writing there would replace it"},
      {"--stop-after -1", "--stop-after: must be >= 1, or 0 to run to --steps (got -1)"},
      {"--stop-after 1", "--stop-after: stops the run to go on later (--resume), which needs --checkpoint-dir"},
      {"--checkpoint-every 2", "--checkpoint-every: needs --checkpoint-dir"},
      {"--fail-at-step -1", "--fail-at-step: must be a step >= 1, or 0 for none (got -1)"},
      {"--fail-at-step 1 --fail-rank 3", "--fail-rank: must be one of the 1 ranks, 0 to 0 (got 3)"},
      {"--seed -1", "--seed: must be a whole number from 0 to 18446744073709551615 (got -1)"},
      {"--measurement " + dir + "/k.csv --kernel-profile " + dir + "/k.csv", "--kernel-profile " + dir + "/k.csv: is also the --measurement file"},
      {"--export /proc/trainplan-export", "--export /proc/trainplan-export: cannot be created"},
      {"--kernel-profile " + dir + "/missing/k.csv", "--kernel-profile " + dir + "/missing/k.csv: directory " + dir + "/missing does not exist"},
      {"--kernel-profile " + dir + "/k.csv", "--kernel-profile " + dir + "/k.csv: records GPU kernels, and this run is on the CPU"},
  };
  for (const auto& c : cases) {
    const Outcome o = run_executor(1, "--plan " + plan + " --steps 2 --device cpu " + c.args);
    EXPECT_EQ(o.exit_code, 2) << c.args << "\n" << o.output;
    EXPECT_NE(o.output.find(c.message), std::string::npos) << c.args << "\n" << o.output;
    EXPECT_EQ(o.output.find("step     1/"), std::string::npos) << c.args << ": trained before refusing\n" << o.output;
  }
}

TEST(Resume, ACheckpointAtOrPastStepsIsNothingToRunAndSaysSo) {
  const std::string dir = scratch_dir("nothing");
  const std::string plan = write_plan(dir, "nothing", PlanSpec{});
  ASSERT_EQ(run_executor(1, "--plan " + plan + " --steps 2 --device cpu --quiet --checkpoint-dir " + dir + "/ck").exit_code, 0);
  const Outcome o = run_executor(1, "--plan " + plan + " --steps 2 --device cpu --resume " + dir + "/ck");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("the checkpoint is at step 2, --steps 2 leaves nothing to run"), std::string::npos) << o.output;
}

// Saving a step whose checkpoint exists, and saving over a crash's leftover ".partial", replace
// what was there (both once crashed with SIGSEGV in std::filesystem::remove_all, which binds to
// LibTorch's exported copy; checkpoint.cpp remove_tree).
TEST(Resume, ACheckpointSavedAgainAndACrashsLeftoverPartialAreReplaced) {
  const std::string dir = scratch_dir("again");
  const std::string plan = write_plan(dir, "again", PlanSpec{});
  const std::string args = "--plan " + plan + " --device cpu --quiet --checkpoint-dir " + dir + "/ck ";
  ASSERT_EQ(run_executor(1, args + "--steps 2").exit_code, 0);
  const Outcome again = run_executor(1, args + "--steps 2");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(fs::exists(dir + "/ck/step_000002/manifest.json"));
  fs::create_directories(dir + "/ck/step_000003.partial/junk");
  std::ofstream(dir + "/ck/step_000003.partial/junk/shard_00000.bin.tmp") << "half-written";
  const Outcome resumed = run_executor(1, args + "--steps 3 --resume " + dir + "/ck");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(dir + "/ck/step_000003/manifest.json"));
  EXPECT_FALSE(fs::exists(dir + "/ck/step_000003.partial"));
  EXPECT_FALSE(fs::exists(dir + "/ck/step_000003/junk"));
}

// A learning rate of 1e30 blows the first update up: a later step's loss or gradient norm is not
// finite. The run ends there (exit 3) without checkpointing or exporting it, says so, and its
// measurement has "status": "diverged" (once it went on to "ok" with null losses, and in fp16
// checkpointed the NaN weights over good ones). On one rank and on two (pipeline stages), in
// fp32 (the plan's) and fp16 (where a NaN loss ends the run whatever the loss scale).
TEST(Failure, ATrainingThatDivergesStopsWithoutCheckpointingOrExportingItAndSaysSo) {
  const std::string dir = scratch_dir("diverged");
  PlanSpec two;
  two.pp = 2;
  PlanSpec half;
  half.precision = "fp16";
  const struct {
    std::string name;
    PlanSpec spec;
  } cases[] = {{"fp32", PlanSpec{}}, {"fp16", half}, {"pp2", two}};
  for (const auto& c : cases) {
    const std::string plan = write_plan(dir, c.name, c.spec);
    const std::string out = dir + "/" + c.name;
    const Outcome o = run_executor(c.spec.ranks * c.spec.pp, "--plan " + plan + " --steps 8 --device cpu --quiet --lr 1e30 --measurement " + out +
                                                                 ".measurement.json --checkpoint-dir " + out + "-ck --checkpoint-every 1 --export " + out + "-export");
    EXPECT_EQ(o.exit_code, 3) << c.name << "\n" << o.output;
    EXPECT_NE(o.output.find("executor: error: training diverged: the "), std::string::npos) << c.name << "\n" << o.output;
    EXPECT_NE(o.output.find("and wrote no checkpoint or export of it (the last checkpoint, " + out + "-ck/step_"), std::string::npos)
        << c.name << "\n" << o.output;
    EXPECT_EQ(o.output.find("MPI_ABORT"), std::string::npos) << c.name << ": every rank stopped at once, nothing to abort\n" << o.output;
    const auto m = read_json(out + ".measurement.json");
    EXPECT_EQ(m.at("status"), "diverged") << c.name;
    const int64_t step = m.at("diverged").at("step").get<int64_t>();
    EXPECT_EQ(m.at("losses").size(), static_cast<std::size_t>(step)) << c.name;
    ASSERT_GE(step, 2) << c.name << ": the first update is what blows up";
    char last[32], diverged[32];
    std::snprintf(last, sizeof last, "/step_%06lld", static_cast<long long>(step - 1));
    std::snprintf(diverged, sizeof diverged, "/step_%06lld", static_cast<long long>(step));
    EXPECT_TRUE(fs::exists(out + "-ck" + last + "/manifest.json")) << c.name;
    EXPECT_FALSE(fs::exists(out + "-ck" + diverged)) << c.name;
    EXPECT_FALSE(fs::exists(out + "-export")) << c.name;
  }
}

TEST(Plan, AMalformedPlanIsAnErrorNamingTheFile) {
  const std::string dir = scratch_dir("malformed");
  std::ofstream(dir + "/bad.json") << "{\"schema\": \"trainplan/plan/v1\", ";
  const Outcome o = run_executor(1, "--plan " + dir + "/bad.json");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("bad.json"), std::string::npos) << o.output;
}

TEST(Export, PythonSafetensorsReadsTheConsolidatedFile) {
  const std::string python = TRAINPLAN_PYTHON;
  if (python.empty() || run_command(python + " -c 'import safetensors.numpy'").exit_code != 0) {
    GTEST_SKIP() << "python with the safetensors package not available (scripts/setup.sh test installs it)";
  }
  const std::string dir = scratch_dir("export");
  const std::string plan = two_rank_plan(dir, 3, 4);
  ASSERT_EQ(run_executor(2, "--plan " + plan + " --steps 2 --threads 1 --quiet --export " + dir + "/out").exit_code, 0);
  const Outcome o = run_command(python + " -c \"from safetensors.numpy import load_file; t = load_file('" + dir +
                                "/out/model.safetensors'); print(len(t), t['layers.1.mlp.down.weight'].shape, t['embedding.tokens.weight'].dtype)\"");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  // tiny-llama: embedding + 2 blocks x 9 tensors + final norm + output = 21 tensors.
  EXPECT_NE(o.output.find("21 (64, 128) float32"), std::string::npos) << o.output;
  EXPECT_TRUE(fs::exists(dir + "/out/config.json"));
}

}  // namespace
}  // namespace trainplan::testing
