// The planner command line, run as a process: what it prints, its exit codes (0 success,
// 1 no plan fits, 2 bad input) and its one-line error messages. Paths are absolute
// (TRAINPLAN_PLANNER_BIN, TRAINPLAN_SOURCE_DIR, a temporary folder), so no test depends on the
// working directory.

#include <filesystem>
#include <string>

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

TEST_F(PlannerCli, APipelinePlanSaysTheExecutorRunsItOnCpuRanksOnlyAndHowToGetOneItRuns) {
  const Outcome piped = run("--model 8b --gpus 16 --fix pp=2 --fix cp=1");
  ASSERT_EQ(piped.exit_code, 0) << piped.all();
  EXPECT_NE(piped.out.find("note: the executor cannot run this plan on GPUs yet:\n    - pipeline parallelism (pp=2)"), std::string::npos) << piped.out;
  EXPECT_NE(piped.out.find("for a plan it runs today, search again with --fix pp=1\n"), std::string::npos) << piped.out;
  const Outcome flat = run("--model 8b --gpus 16 --fix pp=1 --fix cp=1");
  ASSERT_EQ(flat.exit_code, 0) << flat.all();
  EXPECT_EQ(flat.out.find("note: the executor cannot run"), std::string::npos) << flat.out;
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
      {"train tokens past plan files' limit", "--model 8b --gpus 8 --train-tokens 1e308", "--train-tokens: at most 1e18 tokens"},
      {"training shorter than one step", "--model 8b --gpus 8 --train-tokens 1000",
       "/training/train_tokens: 1000 tokens is less than one optimizer step (global_batch(512) * seq_len(8192) = 4.194e+06 tokens)"},
      {"sequence past learned positions", "--model tiny-gpt --gpus 1 --seq-len 4096", "/training/seq_len: 4096 exceeds max_seq_len (64) of a model with learned positions"},
      {"zero gpus", "--gpus 0", "--gpus"},
      {"negative gpus", "--gpus -5", "--gpus"},
      {"malformed plan file", "evaluate " + quote(malformed.string()), "malformed JSON"},
      {"number beyond double range", "evaluate " + quote(overflow.string()), "number overflow"},
      {"missing plan file", "evaluate " + quote((dir_ / "nope.json").string()), "nope.json"},
      {"unknown stack", "--model 8b --gpus 8 --stack jax", "--stack: must be one of trainplan | pytorch-eager | torch-compile | megatron-te (got \"jax\")"},
      {"headroom past half of HBM", "--model 8b --gpus 8 --memory-headroom 60", "--memory-headroom"},
      {"negative headroom", "--model 8b --gpus 8 --memory-headroom -1", "--memory-headroom"},
      {"heads not divisible by tp", "--model 70b --gpus 64 --fix tp=3", "tp(3) must divide heads (64)"},
      {"unknown cluster", "--model 8b --gpus 8 --cluster dgx-z900", "unknown cluster \"dgx-z900\""},
      {"bad --fix key", "--model 8b --gpus 8 --fix tensor=2", "unknown key"},
  });
  // The malformed plan's message names the file.
  EXPECT_NE(run("evaluate " + quote(malformed.string())).err.find(malformed.string()), std::string::npos);
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

}  // namespace
}  // namespace trainplan
