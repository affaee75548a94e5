// Launching a plan on a cluster: the SLURM batch script and the torchrun command `planner launch`
// prints, the check of nodes x GPUs per node against the plan's world size, and the command line.

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/planner/launch.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using testing::quote;

// Llama 3 70B on 64 H100s (8 per node): tp 8 within a node, dp 8 across nodes.
costmodel::Plan llama70b_on_64() {
  costmodel::Plan plan = testing::make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
  plan.name = "llama3-70b-64gpu";
  plan.parallel.tp = 8;
  plan.parallel.dp = 8;
  plan.parallel.zero_stage = 1;
  return plan;
}

planner::LaunchOptions options_for(int nodes) {
  planner::LaunchOptions o;
  o.nodes = nodes;
  o.executor = "/opt/trainplan/executor";
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SlurmScript, For70bOn64GpusAsksEightNodesOfEightTasks) {
  auto script = planner::slurm_script(llama70b_on_64(), "/plans/70b.json", options_for(8));
  ASSERT_TRUE(script.ok()) << script.error().message;
  const std::string& s = *script;
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u) << s;
  for (const char* line : {"#SBATCH --nodes=8\n", "#SBATCH --ntasks-per-node=8\n", "#SBATCH --gpus-per-node=8\n",
                           "#SBATCH --cpus-per-task=8\n", "#SBATCH --exclusive\n",
                           "export MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\"\n",
                           "export MASTER_PORT=29500\n",
                           "srun --kill-on-bad-exit=1 /opt/trainplan/executor --plan /plans/70b.json --steps 50 "
                           "--measurement \"measurement-${SLURM_JOB_ID}.json\"\n",
                           "# export NCCL_IB_HCA=mlx5"}) {
    EXPECT_TRUE(contains(s, line)) << "no " << line << " in:\n" << s;
  }
  // Options not given leave no line, and sbatch reads every #SBATCH line before the first command.
  for (const char* absent : {"--partition", "--account", "--time", "--job-name"}) EXPECT_FALSE(contains(s, absent)) << absent;
  EXPECT_LT(s.rfind("#SBATCH"), s.find("set -euo pipefail")) << s;
}

// Models from Hugging Face configs the executor's GPT and Llama blocks cannot build are refused
// for execution, each with its reason; a Llama 3.1 config (a Llama block exactly) is not.
TEST(ExecutorLimitations, HuggingFaceModelsTheExecutorCannotBuildAreRefused) {
  const auto limits = [](const std::string& file, long long seq_len) {
    costmodel::Plan plan = testing::make_plan(testing::model(testing::data_path("hf/" + file + ".json")), "dgx-h100", 8, seq_len, 64);
    return planner::executor_limitations(plan);
  };
  const auto has = [](const std::vector<std::string>& problems, const std::string& part) {
    for (const auto& p : problems) if (contains(p, part)) return true;
    return false;
  };
  EXPECT_TRUE(limits("llama-3.1-8b", 8192).empty());
  EXPECT_TRUE(limits("mistral-7b-v0.1", 4096).empty());  // the window covers the whole sequence
  EXPECT_TRUE(has(limits("mistral-7b-v0.1", 8192), "sliding-window attention (window 4096 < seq_len 8192)"));
  EXPECT_TRUE(has(limits("gemma-7b", 8192), "heads(16) * head_dim(256) != hidden(3072)"));
  EXPECT_TRUE(has(limits("qwen2-7b", 8192), "this llama-style model has Q/K/V biases"));
  EXPECT_TRUE(has(limits("falcon-7b", 2048), "this gpt-style model has rotary positions, no Q/K/V biases"));
  EXPECT_TRUE(has(limits("gpt-neox-20b", 2048), "this gpt-style model has rotary positions"));
  EXPECT_TRUE(limits("gpt2-xl", 1024).empty());
  const auto v3 = limits("deepseek-v3", 4096);
  EXPECT_TRUE(has(v3, "multi-head latent attention (MLA)"));
  EXPECT_TRUE(has(v3, "shared experts (DeepSeek, Qwen2-MoE) are not in the executor"));
}

// Expert parallelism runs (issue 13 item 2), with context parallelism too; under hybrid shard
// only where shard_group and ep divide one another (executor/src/train/engine.cpp shards experts within
// a shard group), and experts under tensor parallelism are still refused.
TEST(ExecutorLimitations, ExpertParallelPlansRunAndTheirRemainingLimitsAreNamed) {
  costmodel::Plan plan = testing::make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 256);
  plan.parallel.tp = 1; plan.parallel.cp = 1; plan.parallel.pp = 4; plan.parallel.dp = 16; plan.parallel.ep = 4;
  plan.parallel.zero_stage = 1;
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  plan.parallel.zero_stage = 3;
  plan.parallel.shard_group = 8;  // 8 and 4 divide one another
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  plan.parallel.ep = 8;
  plan.parallel.shard_group = 4;  // still
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  costmodel::Plan odd = testing::make_plan("mixtral-8x7b", "dgx-h100", 48, 4096, 240);
  odd.parallel.tp = 1; odd.parallel.cp = 1; odd.parallel.pp = 4; odd.parallel.dp = 12; odd.parallel.ep = 4;
  odd.parallel.zero_stage = 3; odd.parallel.shard_group = 6;  // 6 and 4: shard groups would hold 1 or 2 copies of an expert
  const auto hybrid = planner::executor_limitations(odd);
  ASSERT_EQ(hybrid.size(), 1u);
  EXPECT_TRUE(contains(hybrid[0], "shard_group (6) and ep(4) must divide one another")) << hybrid[0];
  plan.parallel.shard_group = 0;
  plan.parallel.ep = 2;
  plan.parallel.cp = 2; plan.parallel.dp = 8;
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  plan.parallel.cp = 1; plan.parallel.tp = 2;
  const auto problems = planner::executor_limitations(plan);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(contains(problems[0], "mixture of experts under tensor parallelism (tp=2)")) << problems[0];
}

TEST(ExecutorLimitations, PipelineAndContextParallelPlansRunAndBadShapesAreRefused) {
  costmodel::Plan plan = llama70b_on_64();
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  // Pipelines run on GPU ranks as on CPU ranks (one-directional links, sends on side streams;
  // issue 13 item 3), context parallelism too (item 1).
  plan.parallel.pp = 2;
  plan.parallel.dp = 4;
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  plan.parallel.cp = 2;
  plan.parallel.dp = 2;
  EXPECT_TRUE(planner::executor_limitations(plan).empty());
  // Only a sequence that does not split into 2 cp chunks is refused.
  costmodel::Plan odd = plan;
  odd.parallel.cp = 3;
  odd.parallel.sequence_parallel = false;
  odd.training.seq_len = 4095;  // 3 x 1365: divisible by cp, odd, so not by 2 cp
  const auto odd_problems = planner::executor_limitations(odd);
  ASSERT_EQ(odd_problems.size(), 1u);
  EXPECT_TRUE(contains(odd_problems[0], "seq_len (4095) must split into 2 x cp(3) = 6 equal chunks")) << odd_problems[0];
  // The launch texts carry them as comments; a plan the executor runs gets none.
  auto script = planner::slurm_script(odd, "/plans/70b.json", options_for(8));
  ASSERT_TRUE(script.ok()) << script.error().message;
  EXPECT_TRUE(contains(*script, "# WARNING: the executor cannot run this plan yet:\n#   - context parallelism: seq_len (4095)")) << *script;
  auto plain = planner::slurm_script(plan, "/plans/70b.json", options_for(8));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_FALSE(contains(*plain, "WARNING")) << *plain;
}

TEST(SlurmScript, NamesPartitionAccountTimeJobNameAndExtraArguments) {
  planner::LaunchOptions o = options_for(8);
  o.partition = "h100";
  o.account = "llm-team";
  o.time_limit = "2-00:00:00";
  o.job_name = "llama70b";
  o.steps = 20;
  o.cpus_per_task = 12;
  o.extra_args = {"--seed", "7"};
  auto script = planner::slurm_script(llama70b_on_64(), "/plans/70b.json", o);
  ASSERT_TRUE(script.ok()) << script.error().message;
  for (const char* line : {"#SBATCH --partition=h100\n", "#SBATCH --account=llm-team\n", "#SBATCH --time=2-00:00:00\n",
                           "#SBATCH --job-name=llama70b\n", "#SBATCH --cpus-per-task=12\n",
                           "--steps 20 --measurement \"measurement-${SLURM_JOB_ID}.json\" --seed 7\n"}) {
    EXPECT_TRUE(contains(*script, line)) << "no " << line << " in:\n" << *script;
  }
}

TEST(SlurmScript, MakesThePlanPathAbsoluteAndQuotesIt) {
  auto script = planner::slurm_script(llama70b_on_64(), "my plans/70b.json", options_for(8));
  ASSERT_TRUE(script.ok()) << script.error().message;
  const std::string absolute = (fs::current_path() / "my plans/70b.json").string();
  EXPECT_TRUE(contains(*script, "--plan '" + absolute + "' --steps")) << *script;
}

TEST(SlurmScript, HintsFollowTheClustersNetwork) {
  costmodel::Plan plan = llama70b_on_64();
  plan.cluster = testing::cluster("aws-p5");
  auto script = planner::slurm_script(plan, "/p.json", options_for(plan.gpus / plan.cluster.gpus_per_node));
  ASSERT_TRUE(script.ok()) << script.error().message;
  EXPECT_TRUE(contains(*script, "# export FI_PROVIDER=efa")) << *script;
  EXPECT_FALSE(contains(*script, "NCCL_IB_HCA")) << *script;
}

TEST(TorchrunCommands, StartOneRankPerGpuOnEachNode) {
  auto text = planner::torchrun_commands(llama70b_on_64(), "/plans/70b.json", options_for(8));
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_TRUE(contains(*text, "export MASTER_ADDR=HOST\n")) << *text;
  EXPECT_TRUE(contains(*text, "torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:29500\" "
                              "--no-python /opt/trainplan/executor --plan /plans/70b.json --steps 50 --measurement 70b.measurement.json\n"))
      << *text;
}

TEST(TorchrunCommands, GpusPerNodeDefaultsToTheClustersAndMayBeGiven) {
  costmodel::Plan plan = llama70b_on_64();
  plan.cluster.gpus_per_node = 4;  // 64 GPUs = 16 nodes x 4
  auto by_default = planner::torchrun_commands(plan, "/p.json", options_for(16));
  ASSERT_TRUE(by_default.ok()) << by_default.error().message;
  EXPECT_TRUE(contains(*by_default, "--nnodes 16 --nproc-per-node 4 ")) << *by_default;
  planner::LaunchOptions two = options_for(32);
  two.gpus_per_node = 2;
  auto given = planner::torchrun_commands(plan, "/p.json", two);
  ASSERT_TRUE(given.ok()) << given.error().message;
  EXPECT_TRUE(contains(*given, "--nnodes 32 --nproc-per-node 2 ")) << *given;
}

TEST(LaunchCheck, NodesTimesGpusPerNodeMustEqualThePlansGpus) {
  struct Case {
    int nodes;
    std::optional<int> gpus_per_node;  // none: the cluster's 8
    std::string message;               // empty: accepted
  };
  const Case cases[] = {
      {8, std::nullopt, ""},
      {16, 4, ""},
      {4, std::nullopt, "plan needs 64 GPUs = 8 nodes x 8 GPUs; --nodes 4 gives 32"},
      {9, std::nullopt, "plan needs 64 GPUs = 8 nodes x 8 GPUs; --nodes 9 gives 72"},
      {1, std::nullopt, "plan needs 64 GPUs = 8 nodes x 8 GPUs; --nodes 1 gives 8"},
      {3, 7, "plan needs 64 GPUs, not a whole number of nodes of 7 GPUs (--gpus-per-node 7 does not divide 64); --nodes 3 gives 21 "
             "(choose --nodes and --gpus-per-node with nodes x GPUs per node = 64)"},
      {0, std::nullopt, "--nodes: must be >= 1 (got 0)"},
      // 0 given is refused, not taken for "the cluster's" (8 nodes x 8 would have passed).
      {8, 0, "--gpus-per-node: must be >= 1 (got 0)"},
      {8, -2, "--gpus-per-node: must be >= 1 (got -2)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("nodes " + std::to_string(c.nodes) + ", gpus per node " + (c.gpus_per_node ? std::to_string(*c.gpus_per_node) : "default"));
    planner::LaunchOptions o = options_for(c.nodes);
    o.gpus_per_node = c.gpus_per_node;
    auto ok = planner::check_launch(llama70b_on_64(), o);
    if (c.message.empty()) {
      EXPECT_TRUE(ok.ok()) << ok.error().message;
    } else {
      ASSERT_FALSE(ok.ok());
      EXPECT_EQ(ok.error().message, c.message);
    }
  }
}

TEST(LaunchCheck, SbatchValuesMustBeOneWord) {
  planner::LaunchOptions o = options_for(8);
  o.partition = "gpu\n#SBATCH --nodes=1";
  auto bad_partition = planner::check_launch(llama70b_on_64(), o);
  ASSERT_FALSE(bad_partition.ok());
  EXPECT_EQ(bad_partition.error().message.rfind("--partition: ", 0), 0u) << bad_partition.error().message;
  o.partition.clear();
  o.time_limit = "12h";
  auto bad_time = planner::check_launch(llama70b_on_64(), o);
  ASSERT_FALSE(bad_time.ok());
  EXPECT_EQ(bad_time.error().message, "--time: \"12h\" is not a SLURM time (HH:MM:SS, or D-HH:MM:SS)");
}

TEST(ShellQuote, LeavesSafeWordsAndSingleQuotesTheRest) {
  EXPECT_EQ(planner::shell_quote("/plans/llama-70b_v2.json"), "/plans/llama-70b_v2.json");
  EXPECT_EQ(planner::shell_quote("my plan.json"), "'my plan.json'");
  EXPECT_EQ(planner::shell_quote("$HOME;rm"), "'$HOME;rm'");
  EXPECT_EQ(planner::shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(planner::shell_quote(""), "''");
}

TEST(LaunchCheck, AClusterWhoseNodesDoNotDivideThePlanSaysSo) {
  costmodel::Plan plan = llama70b_on_64();
  plan.cluster.gpus_per_node = 6;
  auto ok = planner::check_launch(plan, options_for(10));
  ASSERT_FALSE(ok.ok());
  EXPECT_EQ(ok.error().message,
            "plan needs 64 GPUs, not a whole number of nodes of 6 GPUs (the cluster's 6 GPUs per node does not divide 64); --nodes 10 gives 60 "
            "(choose --nodes and --gpus-per-node with nodes x GPUs per node = 64)");
}

TEST(SplitShellWords, FollowsTheShellsQuotingWithoutExpansion) {
  struct Case {
    std::string text;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {"--seed 7", {"--seed", "7"}},
      {"  a\t b\n\nc  ", {"a", "b", "c"}},
      {"", {}},
      {"a;b $(touch pwned) `id` $HOME *", {"a;b", "$(touch", "pwned)", "`id`", "$HOME", "*"}},
      {"'$(touch pwned)'", {"$(touch pwned)"}},
      {"\"it's \\\"quoted\\\"\"", {"it's \"quoted\""}},
      {"'line one\nline two'", {"line one\nline two"}},
      {"x\\ y a\\'b", {"x y", "a'b"}},
      {"\"a\\$b\\`c\\\\d\\e\"", {"a$b`c\\d\\e"}},  // in "...", a backslash escapes only " \ $ ` and newline
      {"'' \"\" x''y", {"", "", "xy"}},
      {"a\\\nb", {"ab"}},  // backslash-newline joins lines
      {"--name='a b'c", {"--name=a bc"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto words = planner::split_shell_words(c.text);
    ASSERT_TRUE(words.ok()) << words.error().message;
    EXPECT_EQ(*words, c.words);
  }
}

TEST(SplitShellWords, UnclosedQuotesAndATrailingBackslashAreErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"--note 'oops", "unbalanced single quote (the ' at character 8 is never closed)"},
      {"\"oops", "unbalanced double quote (the \" at character 1 is never closed)"},
      {"\"a\\\"", "unbalanced double quote"},
      {"a\\", "ends with a backslash"},
  };
  for (const auto& [text, fragment] : cases) {
    auto words = planner::split_shell_words(text);
    ASSERT_FALSE(words.ok()) << text;
    EXPECT_TRUE(contains(words.error().message, fragment)) << words.error().message;
  }
}

TEST(SlurmScript, QuotesEveryExtraArgumentSoTheShellPassesItLiterally) {
  planner::LaunchOptions o = options_for(8);
  o.extra_args = {"a;b", "$(touch pwned)", "it's \"quoted\"", "line one\nline two", "--seed"};
  auto script = planner::slurm_script(llama70b_on_64(), "/plans/70b.json", o);
  ASSERT_TRUE(script.ok()) << script.error().message;
  EXPECT_TRUE(contains(*script, "--measurement \"measurement-${SLURM_JOB_ID}.json\" 'a;b' '$(touch pwned)' 'it'\\''s \"quoted\"' "
                                "'line one\nline two' --seed\n"))
      << *script;
}

class LaunchCli : public testing::PlannerCliTest {
 protected:
  // A fixed plan for llama3-70b on 64 GPUs, saved by the planner's own search.
  fs::path saved_plan() const {
    const fs::path plan = dir_ / "llama70b-64.json";
    const auto r = run("--model 70b --gpus 64 --quiet --format json --save-plan " + quote(plan.string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return plan;
  }
};

TEST_F(LaunchCli, SlurmScriptForASavedPlanAsksEightNodesOfEightTasks) {
  const fs::path plan = saved_plan();
  const auto r = run("launch " + quote(plan.string()) + " --nodes 8 --slurm --executor /opt/trainplan/executor --time 04:00:00");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "#SBATCH --nodes=8\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "#SBATCH --ntasks-per-node=8\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "#SBATCH --time=04:00:00\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "srun --kill-on-bad-exit=1 /opt/trainplan/executor --plan " + plan.string() + " --steps 50 ")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(LaunchCli, WithoutSlurmPrintsTheTorchrunCommand) {
  const fs::path plan = saved_plan();
  const auto r = run("launch " + quote(plan.string()) + " --nodes 8 --steps 10 --executor /opt/trainplan/executor");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:29500\" "
                              "--no-python /opt/trainplan/executor --plan " + plan.string() + " --steps 10 "))
      << r.out;
}

TEST_F(LaunchCli, TheSearchReportSaysHowToLaunchTheRecommendedPlan) {
  const auto on_64 = run("--model 70b --gpus 64 --quiet");
  ASSERT_EQ(on_64.exit_code, 0) << on_64.all();
  EXPECT_TRUE(contains(on_64.out, "planner launch plan.json --nodes 8 --slurm")) << on_64.out;
  const auto on_4 = run("--model 8b --gpus 4 --quiet");
  ASSERT_EQ(on_4.exit_code, 0) << on_4.all();
  EXPECT_TRUE(contains(on_4.out, "planner launch plan.json --nodes 1 --gpus-per-node 4 --slurm")) << on_4.out;
}

TEST_F(LaunchCli, BadInputExitsTwoNamingThePlan) {
  const fs::path plan = saved_plan();
  const fs::path malformed = write("malformed.json", "{\"schema\": \"trainplan/plan/v1\",");
  const std::string request = testing::source_path("samples/plans/llama3-70b-64xh100-auto.json");
  expect_bad_inputs({
      {"nodes do not give the plan's GPUs", "launch " + quote(plan.string()) + " --nodes 4 --slurm",
       plan.string() + ": plan needs 64 GPUs = 8 nodes x 8 GPUs; --nodes 4 gives 32"},
      {"a plan request", "launch " + quote(request) + " --nodes 8 --slurm", request + ": /parallel: tp, pp, dp"},
      {"a plan request says how to fix it", "launch " + quote(request) + " --nodes 8", "--save-plan"},
      {"missing plan", "launch " + quote((dir_ / "nope.json").string()) + " --nodes 8", (dir_ / "nope.json").string() + ": cannot open file"},
      {"malformed plan", "launch " + quote(malformed.string()) + " --nodes 8", malformed.string() + ": line 1"},
      {"white space in --account", "launch " + quote(plan.string()) + " --nodes 8 --slurm --account 'a b'",
       plan.string() + ": --account: \"a b\" may hold only letters, digits and . _ - + = : , @ % /"},
      // sbatch takes quotes in #SBATCH lines as quoting: the job name would reach SLURM changed.
      {"a quote in --job-name", "launch " + quote(plan.string()) + " --nodes 8 --slurm --job-name 'it\"s'",
       plan.string() + ": --job-name: \"it\"s\" may hold only"},
      {"zero GPUs per node", "launch " + quote(plan.string()) + " --nodes 8 --gpus-per-node 0", plan.string() + ": --gpus-per-node: must be >= 1 (got 0)"},
      {"GPUs per node that do not divide the plan's", "launch " + quote(plan.string()) + " --nodes 9 --gpus-per-node 7",
       "(--gpus-per-node 7 does not divide 64)"},
      {"an unclosed quote in --extra", "launch " + quote(plan.string()) + " --nodes 8 --extra \"--note 'oops\"",
       "--extra \"--note 'oops\": unbalanced single quote"},
  });
}

TEST_F(LaunchCli, ExtraMayBeRepeatedAndEachWordIsQuoted) {
  const fs::path plan = saved_plan();
  const auto r = run("launch " + quote(plan.string()) + " --nodes 8 --executor /x/executor --extra '--seed 7' --extra " + quote("'a;b' \"$(id)\""));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, " --seed 7 'a;b' '$(id)'\n")) << r.out;
}

}  // namespace
}  // namespace trainplan
