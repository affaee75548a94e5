// The planner command line, run as a process: what it prints, its exit codes (0 success,
// 1 no plan fits, 2 bad input) and its one-line error messages. Paths are absolute
// (TRAINPLAN_PLANNER_BIN, TRAINPLAN_SOURCE_DIR, a temporary folder), so no test depends on the
// working directory.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/plan.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::quote;

class PlannerCli : public testing::PlannerCliTest {};

std::string sample(const std::string& name) { return testing::source_path("samples/plans/" + name); }

TEST_F(PlannerCli, RecommendsAPlanForLlama70bOn64Gpus) {
  const Outcome r = run("--model 70b --gpus 64");
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("Recommended"), std::string::npos) << r.all();
  EXPECT_NE(r.out.find("llama3-70b"), std::string::npos) << r.all();
}

// The sharding is named as the stack names it: FSDP's strategies, DeepSpeed's stages (its hybrid
// shard is MiCS).
TEST_F(PlannerCli, NamesTheShardingInTheStacksOwnWords) {
  const Outcome fsdp = run("--model 8b --gpus 16 --stack fsdp2 --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=0 --top 1 --quiet");
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.all();
  EXPECT_NE(fsdp.out.find("Sharding: FULL_SHARD."), std::string::npos) << fsdp.out;
  const Outcome mics = run("--model 8b --gpus 16 --stack deepspeed --fix tp=1 --fix pp=1 --fix zero=3 --fix shard_group=8 --top 1 --quiet");
  ASSERT_EQ(mics.exit_code, 0) << mics.all();
  EXPECT_NE(mics.out.find("Sharding: ZeRO-3 within shard groups (DeepSpeed MiCS)."), std::string::npos) << mics.out;
}

// Issue 13 item 4: the flagship question ends with a command the executor accepts (pipelines and
// context parallelism run), and so does mixtral's (experts under context and expert
// parallelism), and QLoRA's under ZeRO-3; a plan it cannot run (experts under tensor parallelism)
// says why under the command.
TEST_F(PlannerCli, TheRecommendationEndsWithACommandTheExecutorAcceptsAndOtherwiseSaysWhyNot) {
  const Outcome flagship = run("--model 70b --gpus 64");
  ASSERT_EQ(flagship.exit_code, 0) << flagship.all();
  EXPECT_NE(flagship.out.find("torchrun"), std::string::npos) << flagship.out;
  EXPECT_EQ(flagship.out.find("note: the executor cannot run"), std::string::npos) << flagship.out;
  const Outcome piped = run("--model 8b --gpus 16 --fix pp=2 --fix cp=2");
  ASSERT_EQ(piped.exit_code, 0) << piped.all();
  EXPECT_EQ(piped.out.find("note: the executor cannot run"), std::string::npos) << piped.out;
  const Outcome experts = run("--model mixtral-8x7b --gpus 64 --fix tp=1 --fix cp=1 --fix ep=4");
  ASSERT_EQ(experts.exit_code, 0) << experts.all();
  EXPECT_NE(experts.out.find("torchrun"), std::string::npos) << experts.out;
  EXPECT_EQ(experts.out.find("note: the executor cannot run"), std::string::npos) << experts.out;
  const Outcome mixtral = run("--model mixtral-8x7b --gpus 64");
  ASSERT_EQ(mixtral.exit_code, 0) << mixtral.all();
  EXPECT_NE(mixtral.out.find("torchrun"), std::string::npos) << mixtral.out;
  EXPECT_EQ(mixtral.out.find("note: the executor cannot run"), std::string::npos) << mixtral.out;
  // QLoRA of the 70B model recommends ZeRO-3 (the quantised base sharded: FSDP-QLoRA).
  const Outcome qlora = run("--model 70b --gpus 64 --mode qlora --fix zero=3");
  ASSERT_EQ(qlora.exit_code, 0) << qlora.all();
  EXPECT_NE(qlora.out.find("--init-from HF_CHECKPOINT_DIR"), std::string::npos) << qlora.out;
  EXPECT_EQ(qlora.out.find("note: the executor cannot run"), std::string::npos) << qlora.out;
  const Outcome tensor = run("--model mixtral-8x7b --gpus 64 --fix tp=2");
  ASSERT_EQ(tensor.exit_code, 0) << tensor.all();
  EXPECT_NE(tensor.out.find("note: the executor cannot run this plan yet:\n    - "), std::string::npos) << tensor.out;
  EXPECT_NE(tensor.out.find("mixture of experts under tensor parallelism (tp=2)"), std::string::npos) << tensor.out;
}

TEST_F(PlannerCli, JsonOutputIsASearchDocument) {
  const Outcome r = run("--model 70b --gpus 64 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j.at("schema"), "trainplan/search/v1");
  EXPECT_EQ(j.at("gpus"), 64);
  EXPECT_GT(j.at("evaluated").get<long long>(), 1000);
  ASSERT_TRUE(j.at("recommended").is_object());
  EXPECT_EQ(j.at("recommended").at("schema"), "trainplan/estimate/v1");
  EXPECT_EQ(j.at("recommended").at("fits"), true);
  ASSERT_FALSE(j.at("ranked").empty());
  EXPECT_EQ(j.at("ranked").at(0), j.at("recommended"));
  // Distinct layouts (issue 30): no two ranked plans share tp, pp, dp, cp, ep, ZeRO and recompute;
  // each names its layout and how many of its variants fit, the best of them listed.
  EXPECT_EQ(j.at("distinct_layouts"), true);
  std::set<std::string> layouts;
  for (const auto& entry : j.at("ranked")) {
    EXPECT_TRUE(layouts.insert(entry.at("layout").get<std::string>()).second) << entry.at("layout");
    const auto count = entry.at("variants_fitting").get<long long>();
    EXPECT_GE(count, 1);
    EXPECT_EQ(entry.at("variants").size(), static_cast<std::size_t>(std::min<long long>(count - 1, 7)));
    for (const auto& v : entry.at("variants")) {
      // Plans within the memory headroom rank after those with room, however fast.
      if (v.at("tight") == entry.at("tight")) EXPECT_LE(v.at("tokens_per_second").get<double>(), entry.at("throughput").at("tokens_per_second").get<double>());
      else EXPECT_EQ(v.at("tight"), true);
      for (const char* key : {"tp", "pp", "dp", "cp", "zero_stage", "recompute"}) EXPECT_EQ(v.at("parallel").at(key), entry.at("parallel").at(key)) << key;
    }
  }
}

TEST_F(PlannerCli, TopCountsLayoutsAndAllVariantsUnfoldsThem) {
  // issue 30: the top ten of 70B on 128 GPUs were seven interleaving variants of tp4 pp2 dp16
  // before the first other layout. Folded, ten rows are ten layouts; --all-variants ranks every
  // variant, so its first rows repeat the best layout.
  const Outcome folded = run("--model 70b --gpus 128 --format json --top 10");
  const Outcome all = run("--model 70b --gpus 128 --format json --top 10 --all-variants");
  ASSERT_EQ(folded.exit_code, 0) << folded.all();
  ASSERT_EQ(all.exit_code, 0) << all.all();
  const auto f = nlohmann::json::parse(folded.out), a = nlohmann::json::parse(all.out);
  ASSERT_EQ(f.at("ranked").size(), 10u);
  ASSERT_EQ(a.at("ranked").size(), 10u);
  EXPECT_EQ(a.at("distinct_layouts"), false);
  const auto layout = [](const nlohmann::json& e) {
    const auto& p = e.at("parallel");
    return p.at("tp").dump() + p.at("pp").dump() + p.at("dp").dump() + p.at("cp").dump() + p.at("zero_stage").dump() + p.at("recompute").dump();
  };
  std::set<std::string> in_all;
  for (const auto& e : a.at("ranked")) in_all.insert(layout(e));
  EXPECT_LT(in_all.size(), 10u) << "the unfolded top ten repeats a layout";
  // The best plan is the same either way.
  EXPECT_EQ(f.at("ranked").at(0).at("parallel"), a.at("ranked").at(0).at("parallel"));
  // The second folded layout is the best plan of any other layout: no unfolded plan of another
  // layout ranks before it.
  const std::string second = layout(f.at("ranked").at(1));
  for (const auto& e : a.at("ranked")) {
    if (layout(e) == layout(f.at("ranked").at(0))) continue;
    EXPECT_EQ(layout(e), second);
    break;
  }
}

TEST_F(PlannerCli, ModelsListsThePresets) {
  const Outcome r = run("models");
  EXPECT_EQ(r.exit_code, 0) << r.all();
  for (const char* name : {"llama3-405b", "llama3-70b", "gpt3-175b", "mixtral-8x7b"}) EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

// Issue 14: a Hugging Face config.json is a model (tests/data/hf, README there cites each).
TEST_F(PlannerCli, PlansAHuggingFaceConfigAndNamesTheModel) {
  const Outcome r = run("--model " + quote(testing::data_path("hf/llama-3.1-8b.json")) + " --gpus 8");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("llama-3.1-8b: 8.03 B parameters (llama; 32 layers, hidden 4096, 32 heads / 8 kv"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Recommended"), std::string::npos) << r.out;
}

TEST_F(PlannerCli, AHuggingFaceMlaModelIsPlannedAndRefusedForTheExecutor) {
  const Outcome r = run("--model " + quote(testing::data_path("hf/deepseek-v2-lite.json")) + " --gpus 16 --seq-len 4096");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("deepseek-v2-lite: 15.7 B parameters (llama; 27 layers, hidden 2048, 16 heads with MLA (kv rank 512)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("64 experts top-6 + shared 2816 after 1 dense layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("multi-head latent attention (MLA) is not supported by the executor"), std::string::npos) << r.out;
}

TEST_F(PlannerCli, AnUnknownModelTypeIsAOneLineError) {
  const fs::path file = write("bert.json", R"({"model_type": "bert", "hidden_size": 768})");
  const Outcome r = run("--model " + quote(file.string()) + " --gpus 8");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("bert.json: /model_type: \"bert\" is not supported (supported: llama, "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

TEST_F(PlannerCli, ModelsSaysAHuggingFaceConfigIsAccepted) {
  const Outcome r = run("models");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("Hugging Face config.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("deepseek_v3"), std::string::npos) << r.out;
}

TEST_F(PlannerCli, HardwareListsTheClusters) {
  const Outcome r = run("hardware");
  EXPECT_EQ(r.exit_code, 0) << r.all();
  for (const char* name : {"dgx-b200", "dgx-h100", "dgx-a100-80g", "aws-p5en"}) EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

TEST_F(PlannerCli, EvaluatesASamplePlanAsJson) {
  const Outcome r = run("evaluate " + quote(sample("gpt3-175b-1024xa100.json")) + " --format json");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j.at("schema"), "trainplan/estimate/v1");
  ASSERT_TRUE(j.contains("fits"));
  EXPECT_EQ(j.at("fits"), true);
  EXPECT_EQ(j.at("parallel").at("tp"), 8);
  EXPECT_EQ(j.at("parallel").at("pp"), 8);
  EXPECT_EQ(j.at("parallel").at("virtual_stages"), 2);
}

TEST_F(PlannerCli, SearchesTheOpenFieldsOfAPlanFile) {
  const Outcome r = run("search " + quote(sample("llama3-70b-64xh100-auto.json")) + " --format json");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("schema"), "trainplan/search/v1");
  EXPECT_FALSE(j.at("ranked").empty());
}

TEST_F(PlannerCli, BadInputExitsTwoWithOneLineMessage) {
  const fs::path malformed = write("malformed.json", "{\"schema\": \"trainplan/plan/v1\", \"model\": ");
  const fs::path overflow = write("overflow.json", "{\"schema\": \"trainplan/plan/v1\", \"model\": \"8b\", \"cluster\": \"dgx-h100\", \"gpus\": 1e400}");
  expect_bad_inputs({
      {"unknown model", "--model llama9-1t --gpus 8", "unknown model \"llama9-1t\""},
      {"zero global batch", "--model 8b --gpus 8 --global-batch 0", "--global-batch: must be a whole number of sequences from 1 to 2^32 (got 0)"},
      {"global batch past plan files' limit", "--model 8b --gpus 8 --global-batch 99999999999", "from 1 to 2^32 (got 99999999999)"},
      {"train tokens past plan files' limit", "--model 8b --gpus 8 --train-tokens 1e308", "--train-tokens: at most 1e24 tokens"},
      {"training shorter than one step", "--model 8b --gpus 8 --train-tokens 1000",
       "/training/train_tokens: 1000 tokens is less than one optimizer step (global_batch(512) * seq_len(8192) = 4.194e+06 tokens)"},
      {"sequence past learned positions", "--model tiny-gpt --gpus 1 --seq-len 4096", "/training/seq_len: 4096 exceeds max_seq_len (64) of a model with learned positions"},
      {"zero gpus", "--gpus 0", "--gpus"},
      {"hexadecimal sequence length", "--model 8b --gpus 8 --seq-len 0x10", "--seq-len: \"0x10\" is not a number"},
      {"empty sequence length", "--model 8b --gpus 8 --seq-len ''", "--seq-len: \"\" is not a number"},
      {"negative gpus", "--gpus -5", "--gpus"},
      {"gpus past plan files' limit", "--model 8b --gpus 1073741824", "--gpus: must be a number of GPUs from 1 to 16777216"},
      {"malformed plan file", "evaluate " + quote(malformed.string()), "malformed JSON"},
      {"number beyond double range", "evaluate " + quote(overflow.string()), "number overflow"},
      {"missing plan file", "evaluate " + quote((dir_ / "nope.json").string()), "nope.json"},
      {"export over its plan", "export " + quote(malformed.string()) + " --to megatron --out " + quote(malformed.string()),
       "--out " + malformed.string() + ": is the plan file " + malformed.string() + "; writing there would replace it"},
      {"calibrated profile over its measurement", "calibrate " + quote(malformed.string()) + " --out " + quote(malformed.string()),
       "is the measurement " + malformed.string()},
      {"a parallelism the stack lacks", "--model 8b --gpus 64 --stack fsdp1 --fix cp=2",
       "/parallel/cp: the fsdp1 stack has no context parallelism (ring attention)"},
      // DeepSpeed v0.3.16 had no MoE layers (v0.5.0) and no MiCS (v0.9.2): named before any search.
      {"no expert parallelism", "--model mixtral-8x7b --gpus 64 --stack deepspeed-v0.3 --fix ep=8",
       "/parallel/ep: the deepspeed-v0.3 stack has no expert parallelism"},
      {"no hybrid shard", "--model 8b --gpus 64 --stack deepspeed-v0.3 --fix zero=3 --fix shard_group=8",
       "/parallel/shard_group: the deepspeed-v0.3 stack has no hybrid sharding"},
      // DeepSpeed's PipelineEngine runs TrainSchedule only (runtime/pipe/schedule.py).
      {"no interleaved pipeline", "--model 70b --gpus 64 --stack deepspeed --fix pp=4 --fix schedule=interleaved",
       "/parallel/schedule: the deepspeed stack's pipeline engine runs 1F1B with one chunk per stage"},
      {"FlashAttention-3 off Hopper", "--model 8b --gpus 8 --cluster dgx-a100-80g --attention-kernel flash3",
       "/training/attention_kernel: flash3 (FlashAttention-3) runs on Hopper GPUs only (H100, H200), not on A100 SXM4 80GB"},
      {"unknown stack", "--model 8b --gpus 8 --stack jax", "--stack: must be one of trainplan | trainplan-reference | pytorch-eager | torch-compile | megatron-te | fsdp1 | composer | fsdp2 | fsdp2-compile | deepspeed | deepspeed-v0.3 | hf-ddp | hf-fsdp2 (got \"jax\")"},
      {"headroom past half of HBM", "--model 8b --gpus 8 --memory-headroom 60", "--memory-headroom"},
      {"negative headroom", "--model 8b --gpus 8 --memory-headroom -1", "--memory-headroom"},
      {"heads not divisible by tp", "--model 70b --gpus 64 --fix tp=3", "--fix tp=3: tp must divide the model's attention heads (64)"},
      {"unknown cluster", "--model 8b --gpus 8 --cluster dgx-z900", "unknown cluster \"dgx-z900\""},
      {"bad --fix key", "--model 8b --gpus 8 --fix tensor=2", "unknown key"},
  });
  // The malformed plan's message names the file.
  EXPECT_NE(run("evaluate " + quote(malformed.string())).err.find(malformed.string()), std::string::npos);
}

// --global-batch-tokens is rounded to whole sequences, and the report says so when that changed
// it: 10000 tokens at seq 8192 are 1 sequence (it said nothing); 4M (binary) are 512 exactly.
TEST_F(PlannerCli, GlobalBatchTokensRoundedToWholeSequencesAreSaidSo) {
  const Outcome rounded = run("--model 8b --gpus 8 --quiet --global-batch-tokens 10000");
  ASSERT_EQ(rounded.exit_code, 0) << rounded.all();
  EXPECT_NE(rounded.out.find("global batch 1 sequences (8.19 K tokens; --global-batch-tokens 10000 rounded to whole sequences)"), std::string::npos)
      << rounded.out;
  const Outcome exact = run("--model 8b --gpus 8 --quiet --global-batch-tokens 4M");
  ASSERT_EQ(exact.exit_code, 0) << exact.all();
  EXPECT_NE(exact.out.find("global batch 512 sequences (4.19 M tokens), "), std::string::npos) << exact.out;
}

TEST_F(PlannerCli, TheReportNamesTheStackAndTheHeadroomMarksTightPlans) {
  const Outcome plain = run("--model 8b --gpus 8 --quiet");
  ASSERT_EQ(plain.exit_code, 0) << plain.all();
  EXPECT_NE(plain.out.find("Stack     trainplan: trainplan executor"), std::string::npos) << plain.out;
  const Outcome compiled = run("--model 8b --gpus 8 --quiet --stack torch-compile");
  ASSERT_EQ(compiled.exit_code, 0) << compiled.all();
  EXPECT_NE(compiled.out.find("Stack     torch-compile:"), std::string::npos) << compiled.out;
  // A headroom of half the HBM: plans that keep it come first (8B on 8 GPUs has them).
  const Outcome roomy = run("--model 8b --gpus 8 --quiet --memory-headroom 50 --format json");
  ASSERT_EQ(roomy.exit_code, 0) << roomy.all();
  for (const auto& c : nlohmann::json::parse(roomy.out).at("ranked")) {
    EXPECT_FALSE(c.at("tight").get<bool>());
    EXPECT_LE(c.at("memory").at("required_bytes").get<double>(), 0.5 * 80 * 1073741824.0);
  }
  // 70B on 16 GPUs cannot keep 40% free: the best plans are recommended, marked tight and said so.
  const Outcome tight = run("--model 70b --gpus 16 --quiet --memory-headroom 40");
  ASSERT_EQ(tight.exit_code, 0) << tight.all();
  EXPECT_NE(tight.out.find("Tight: no plan keeps the memory headroom"), std::string::npos) << tight.out;
  EXPECT_NE(tight.out.find(" tight "), std::string::npos) << tight.out;
  EXPECT_NE(tight.out.find("within the 40% memory headroom"), std::string::npos) << tight.out;
}

TEST_F(PlannerCli, HtmlFormatIsAPageWithTheReportTables) {
  const Outcome search = run("--model 8b --gpus 16 --format html");
  ASSERT_EQ(search.exit_code, 0) << search.all();
  EXPECT_EQ(search.out.rfind("<!DOCTYPE html>", 0), 0u) << search.out;
  EXPECT_NE(search.out.find("<title>trainplan: llama3-8b on 16 GPUs</title>"), std::string::npos);
  EXPECT_NE(search.out.find("<th class=\"num\">GiB/GPU (of)</th>"), std::string::npos) << search.out;
  const Outcome evaluate = run("evaluate " + quote(sample("gpt3-175b-1024xa100.json")) + " --format html");
  EXPECT_EQ(evaluate.out.rfind("<!DOCTYPE html>", 0), 0u) << evaluate.all();
  EXPECT_NE(evaluate.out.find("<pre>"), std::string::npos) << "the breakdown tables";
}

TEST_F(PlannerCli, ModelThatFitsNowhereExitsOne) {
  const Outcome r = run("--model 405b --gpus 8 --cluster dgx-a100-40g");
  EXPECT_EQ(r.exit_code, 1) << r.all();
}

TEST_F(PlannerCli, SavedPlanIsAcceptedByEvaluate) {
  const fs::path saved = dir_ / "recommended.json";
  const Outcome search = run("--model 8b --gpus 16 --format json --save-plan " + quote(saved.string()));
  ASSERT_EQ(search.exit_code, 0) << search.all();
  ASSERT_TRUE(fs::exists(saved));
  auto loaded = costmodel::load_plan_file(saved.string());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_TRUE(loaded->parallel.fully_fixed());

  const Outcome evaluate = run("evaluate " + quote(saved.string()) + " --format json");
  ASSERT_EQ(evaluate.exit_code, 0) << evaluate.all();
  const auto recommended = nlohmann::json::parse(search.out).at("recommended");
  const auto evaluated = nlohmann::json::parse(evaluate.out);
  EXPECT_EQ(evaluated.at("parallel"), recommended.at("parallel"));
  EXPECT_EQ(evaluated.at("fits"), true);
  EXPECT_DOUBLE_EQ(evaluated.at("time").at("step_seconds").get<double>(), recommended.at("time").at("step_seconds").get<double>());
}

// Issue 14's reliability items, each as a user meets it.

TEST_F(PlannerCli, DuplicateJsonKeysAreBadInputNamingTheKeyAndPointer) {
  const fs::path plan = dir_ / "plan.json";
  ASSERT_EQ(run("--model 8b --gpus 8 --quiet --save-plan " + quote(plan.string())).exit_code, 0);
  std::ifstream in(plan);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"parallel\": {");
  ASSERT_NE(at, std::string::npos) << text;
  text.insert(at + 13, "\"zero_stage\": 3, ");
  const fs::path duplicate = write("duplicate.json", text);
  for (const std::string command : {"evaluate ", "search ", "launch --nodes 1 "}) {
    SCOPED_TRACE(command);
    testing::expect_bad_input(run(command + quote(duplicate.string())),
                              duplicate.string() + ": /parallel/zero_stage: duplicate key \"zero_stage\"");
  }
}

TEST_F(PlannerCli, ADirectoryGivenAsAJsonFileSaysSo) {
  fs::create_directories(dir_ / "model.json");
  expect_bad_inputs({
      {"plan", "evaluate " + quote(dir_.string()), dir_.string() + ": is a directory, not a file"},
      {"model", "--model " + quote((dir_ / "model.json").string()) + " --gpus 8", (dir_ / "model.json").string() + ": is a directory, not a file"},
      {"cluster", "--model 8b --gpus 8 --cluster " + quote((dir_ / "model.json").string()), ": is a directory, not a file"},
      {"missing file", "evaluate " + quote((dir_ / "nope.json").string()), (dir_ / "nope.json").string() + ": cannot open file (No such file or directory)"},
  });
}

TEST_F(PlannerCli, AFailedSavePlanLeavesNoTemporaryFile) {
  fs::create_directories(dir_ / "taken");
  testing::expect_bad_input(run("--model 8b --gpus 8 --quiet --save-plan " + quote((dir_ / "taken").string())),
                            (dir_ / "taken").string() + ": is a directory, not a file");
  testing::expect_bad_input(run("--model 8b --gpus 8 --quiet --save-plan " + quote((dir_ / "no-dir" / "p.json").string())),
                            (dir_ / "no-dir" / "p.json").string() + ": cannot write");
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"stderr.txt", "taken"}));
}

// --save-plan through a symbolic link replaces the file it names and keeps the link; a path that
// is not a regular file (here /dev/null) is written in place, not renamed over; and output that
// cannot reach standard output (a full device) is an error, not an empty file and exit 0.
TEST_F(PlannerCli, SavePlanFollowsLinksWritesDevicesInPlaceAndAFullStdoutIsAnError) {
  const fs::path target = write("real.json", "{}\n");
  fs::create_symlink("real.json", dir_ / "link.json");
  const auto linked = run("--model 8b --gpus 8 --quiet --save-plan " + quote((dir_ / "link.json").string()));
  ASSERT_EQ(linked.exit_code, 0) << linked.all();
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
  EXPECT_NE(testing::read_text(target.string()).find("\"schema\": \"trainplan/plan/v1\""), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "real.json.tmp"));

  // A link to a file not yet there: the file is made, the link kept.
  fs::create_symlink("made.json", dir_ / "dangling.json");
  ASSERT_EQ(run("--model 8b --gpus 8 --quiet --save-plan " + quote((dir_ / "dangling.json").string())).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(dir_ / "dangling.json"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "made.json"));
  // /dev/stdout appended to a log: the plan follows what the log held (the shell's >> file is
  // the planner's standard output, not a file to rename over).
  const fs::path log = write("log.txt", "kept\n");
  const auto appended = run("--model 8b --gpus 8 --quiet --format json --save-plan /dev/stdout >> " + quote(log.string()));
  ASSERT_EQ(appended.exit_code, 0) << appended.all();
  const std::string logged = testing::read_text(log.string());
  EXPECT_EQ(logged.rfind("kept\n", 0), 0u) << logged.substr(0, 200);
  EXPECT_NE(logged.find("\"schema\": \"trainplan/plan/v1\""), std::string::npos);

  const auto null = run("--model 8b --gpus 8 --quiet --save-plan /dev/null");
  ASSERT_EQ(null.exit_code, 0) << null.all();
  EXPECT_TRUE(fs::is_character_file("/dev/null"));

  if (fs::is_character_file("/dev/full")) {
    const fs::path err = dir_ / "full.err";
    const auto full = run("--model 8b --gpus 8 --quiet > /dev/full 2>" + quote(err.string()) + "; echo \"rc=$?\"");
    EXPECT_NE(full.out.find("rc=2"), std::string::npos) << full.all();
    EXPECT_NE(testing::read_text(err.string()).find("planner: error: writing to standard output failed"), std::string::npos);
  }
}

// Outputs may not replace what the inputs name either (a plan's model file), a flag's bad value
// is the flag's, a config.json without model_type is named as one, and --gpus is asked for.
TEST_F(PlannerCli, InputsNamedByInputsAreKeptAndErrorsNameWhatWasGiven) {
  const fs::path model = write("m.json", testing::read_text(testing::source_path("samples/models/tiny-llama.json")));
  const fs::path plan = write("p.json", R"({"schema": "trainplan/plan/v1", "model": "m.json", "cluster": "dgx-h100", "gpus": 1,
    "training": {"seq_len": 64, "global_batch": 8}})");
  const std::string before = testing::read_text(model.string());
  expect_bad_inputs({
      {"--save-plan over the plan's model file", "search " + quote(plan.string()) + " --save-plan " + quote(model.string()),
       "--save-plan " + model.string() + ": is the file " + plan.string() + " names " + model.string() + "; writing there would replace it"},
      {"a --cluster that is no preset", "calibrate " + quote(testing::source_path("samples/measurements/tiny-llama-pp4.measurement.json")) +
           " --cluster nosuch --out " + quote((dir_ / "c.json").string()),
       "--cluster nosuch: unknown cluster \"nosuch\""},
      {"a config.json without model_type", "--model " + quote(write("config.json", R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2})").string()) +
           " --gpus 1",
       "config.json: /model_type: is required"},
      {"no --gpus", "--model 8b", "--gpus: required, the number of GPUs to plan for"},
      {"one measurement twice", "calibrate " + quote(testing::source_path("samples/measurements/tiny-llama-pp4.measurement.json")) + " " +
           quote(testing::source_path("samples/measurements/../measurements/tiny-llama-pp4.measurement.json")),
       "given twice (as "},
  });
  EXPECT_EQ(testing::read_text(model.string()), before);
  EXPECT_FALSE(fs::exists(dir_ / "c.json"));
}

TEST_F(PlannerCli, ContradictoryFixValuesNameTheConstraints) {
  expect_bad_inputs({
      {"axes beyond the GPUs", "--model 8b --gpus 32 --fix tp=8 --fix pp=8", "no plan can satisfy the fixed values: --fix tp=8 x --fix pp=8 = 64 > 32 GPUs"},
      {"one key twice", "--model 8b --gpus 32 --fix tp=2 --fix tp=4", "--fix tp=2 and --fix tp=4 contradict each other: tp can be fixed once"},
      {"aliases of one key", "--model 8b --gpus 32 --fix zero=1 --fix zero_stage=3", "--fix zero=1 and --fix zero_stage=3 contradict each other"},
      {"interleaved without a pipeline", "--model 8b --gpus 32 --fix schedule=interleaved --fix pp=1",
       "--fix schedule=interleaved needs pp > 1, but --fix pp=1"},
      {"micro-batch", "--model 8b --gpus 32 --fix mb=3", "--fix mb=3: the micro-batch must divide the global batch (512 sequences)"},
      {"hybrid shard", "--model 8b --gpus 32 --fix zero=1 --fix shard_group=2", "--fix shard_group=2 (hybrid sharding) needs zero=3, but --fix zero=1"},
  });
  // The same value twice is no contradiction.
  EXPECT_EQ(run("--model 8b --gpus 8 --quiet --fix sp=on --fix sequence_parallel=true --fix tp=2").exit_code, 0);
}

TEST_F(PlannerCli, TrainTokensErrorListsEverySuffix) {
  testing::expect_bad_input(run("--model 8b --gpus 8 --train-tokens 15X"),
                            "--train-tokens: unknown suffix \"X\" in \"15X\" (accepted, in either case: K, M, G or B, T, P = powers of 1000 here; "
                            "Ki, Mi, Gi, Ti, Pi = powers of 1024; or no suffix)");
  // Every suffix the message lists is accepted.
  for (const char* count : {"1e7K", "1e4M", "10G", "10B", "1T", "0.001P", "1e7Ki", "1e4Mi", "10Gi", "1Ti", "0.001Pi", "1e7k", "1t"}) {
    SCOPED_TRACE(count);
    const Outcome r = run("--model 8b --gpus 8 --quiet --format json --top 1 --train-tokens " + std::string(count));
    EXPECT_EQ(r.exit_code, 0) << r.all();
  }
}

// LoRA's targets size the adapters: Llama 3 8B, rank 16 (Hu et al. 2021: r (in + out) per
// adapted matrix; h 4096, kv 1024, ffn 14336, 32 layers): q, k, v, o: 32 x 16 x (8192 + 5120 +
// 5120 + 8192) = 13631488; all-linear adds gate, up and down, 16 x (4096 + 14336) each: 41943040.
TEST_F(PlannerCli, LoraTargetsSizeTheAdaptersAndAreChecked) {
  for (const auto& [targets, adapters] : {std::pair<const char*, double>{"q,k,v,o", 13631488.0}, {"all-linear", 41943040.0}}) {
    const Outcome r = run("--model 8b --gpus 8 --mode lora --lora-rank 16 --quiet --format json --top 1 --lora-targets " + std::string(targets));
    ASSERT_EQ(r.exit_code, 0) << r.all();
    EXPECT_EQ(nlohmann::json::parse(r.out).at("ranked").at(0).at("trainable_parameters").get<double>(), adapters) << targets;
  }
  testing::expect_bad_input(run("--model 8b --gpus 8 --mode lora --lora-targets q,x"),
                            "--lora-targets: \"x\" is not one of q, k, v, o, gate, up, down (or give all-linear)");
}

TEST_F(PlannerCli, CsvKeepsFullPrecision) {
  const Outcome csv = run("--model 8b --gpus 8 --quiet --format csv --top 1");
  const Outcome json = run("--model 8b --gpus 8 --quiet --format json --top 1");
  ASSERT_EQ(csv.exit_code, 0) << csv.all();
  ASSERT_EQ(json.exit_code, 0) << json.all();
  const auto header_end = csv.out.find('\n');
  std::vector<std::string> names, values;
  std::string cell;
  for (std::istringstream in(csv.out.substr(0, header_end)); std::getline(in, cell, ',');) names.push_back(cell);
  for (std::istringstream in(csv.out.substr(header_end + 1, csv.out.find('\n', header_end + 1) - header_end - 1)); std::getline(in, cell, ',');) values.push_back(cell);
  ASSERT_EQ(names.size(), values.size()) << csv.out;
  const auto value_of = [&](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    return it == names.end() ? std::string() : values[static_cast<std::size_t>(it - names.begin())];
  };
  const nlohmann::json best = nlohmann::json::parse(json.out).at("recommended");
  // Each number reads back as exactly the double the estimate holds.
  EXPECT_EQ(std::stod(value_of("step_seconds")), best.at("time").at("step_seconds").get<double>()) << value_of("step_seconds");
  EXPECT_EQ(std::stod(value_of("memory_total_bytes")), best.at("memory").at("total_bytes").get<double>()) << value_of("memory_total_bytes");
  EXPECT_EQ(std::stod(value_of("tokens_per_second")), best.at("throughput").at("tokens_per_second").get<double>()) << value_of("tokens_per_second");
}

TEST_F(PlannerCli, ReportTextUsesUnitsSingularsAndBoundedCells) {
  const Outcome big = run("--model 405b --gpus 1024 --quiet");
  ASSERT_EQ(big.exit_code, 0) << big.all();
  EXPECT_NE(big.out.find(" TB, written in"), std::string::npos) << big.out;  // 405B's states: terabytes
  EXPECT_EQ(big.out.find(" K GB"), std::string::npos) << big.out;

  const fs::path plan = dir_ / "one.json";
  ASSERT_EQ(run("--model 8b --gpus 8 --global-batch 8 --fix tp=1 --fix pp=1 --fix dp=8 --fix mb=1 --quiet --save-plan " + quote(plan.string())).exit_code, 0);
  const Outcome one = run("evaluate " + quote(plan.string()));
  ASSERT_EQ(one.exit_code, 0) << one.all();
  EXPECT_NE(one.out.find(" 1 micro-batch "), std::string::npos) << one.out;
  EXPECT_EQ(one.out.find(" 1 micro-batches"), std::string::npos) << one.out;

  // 1e18 tokens on one GPU: ~2e8 days, which "%.1f" printed as 11 characters and more.
  const Outcome huge = run("--model 1.1b --gpus 1 --train-tokens 1e18 --quiet");
  ASSERT_EQ(huge.exit_code, 0) << huge.all();
  const auto top = huge.out.find("Top plans\n");
  ASSERT_NE(top, std::string::npos) << huge.out;
  std::istringstream table(huge.out.substr(top + 10, huge.out.find("\n\n", top) - top - 10));
  std::size_t width = 0;
  for (std::string line; std::getline(table, line);) {
    if (width == 0) width = line.size();
    EXPECT_EQ(line.size(), width) << line;
    std::istringstream cells(line);
    for (std::string c; cells >> c;) EXPECT_LE(c.size(), 10u) << c << " in " << line;
  }
  EXPECT_NE(huge.out.find("e+08 days"), std::string::npos) << huge.out;
}

}  // namespace
}  // namespace trainplan
