// RequestForm -> PlanRequest: defaults, every kind of bad value at its field, edited presets,
// batch in tokens, and the planner command line that searches the same request.

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trainplan/costmodel/presets.hpp"
#include "trainplan/gui/request_form.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

using gui::BatchUnit;
using gui::build_request;
using gui::RequestForm;

TEST(RequestForm, DefaultFormIsLlama3_70bOn64H100sWithTheModelsDefaults) {
  const auto built = build_request(RequestForm{});
  ASSERT_TRUE(built.errors.empty()) << built.errors.front().field << ": " << built.errors.front().message;
  ASSERT_TRUE(built.request);
  const auto& r = *built.request;
  EXPECT_EQ(r.model.name, "llama3-70b");
  EXPECT_EQ(r.model_ref, "llama3-70b");
  EXPECT_EQ(r.cluster_ref, "dgx-h100");
  EXPECT_EQ(r.gpus, 64);
  EXPECT_EQ(r.training.seq_len, 8192);
  EXPECT_EQ(r.training.global_batch, 512) << "4 Mi tokens / 8192";
  EXPECT_FALSE(r.parallel.tp.has_value());
}

struct BadField {
  const char* what;
  std::function<void(RequestForm&)> change;
  std::string field;
  std::string fragment;
};

TEST(RequestForm, EveryBadValueIsAnErrorAtItsFieldWithTheReason) {
  const BadField cases[] = {
      {"zero GPUs", [](RequestForm& f) { f.gpus = "0"; }, "gpus", "must be a positive number"},
      {"negative GPUs", [](RequestForm& f) { f.gpus = "-8"; }, "gpus", "must be a positive number"},
      {"GPUs not a number", [](RequestForm& f) { f.gpus = "many"; }, "gpus", "is not a number"},
      {"fractional GPUs", [](RequestForm& f) { f.gpus = "6.5"; }, "gpus", "whole number"},
      {"unknown model", [](RequestForm& f) { f.model.ref = "llama9-1t"; }, "model", "unknown model \"llama9-1t\""},
      {"unknown cluster", [](RequestForm& f) { f.cluster.ref = "dgx-z900"; }, "cluster", "unknown cluster \"dgx-z900\""},
      {"negative layers", [](RequestForm& f) { f.model.edits["/layers"] = "-3"; }, "model/layers", "must be"},
      {"hidden not divisible by heads", [](RequestForm& f) { f.model.edits["/hidden"] = "8191"; }, "model/hidden", "divisible by heads"},
      {"empty field", [](RequestForm& f) { f.model.edits["/vocab"] = " "; }, "model/vocab", "is required"},
      {"zero HBM", [](RequestForm& f) { f.cluster.edits["/gpu/hbm_capacity_gib"] = "0"; }, "cluster/gpu/hbm_capacity_gib", "must be"},
      {"bad sequence length", [](RequestForm& f) { f.seq_len = "8X"; }, "seq_len", "unknown suffix"},
      {"batch below one sequence", [](RequestForm& f) { f.batch_unit = BatchUnit::kTokens; f.global_batch = "100"; }, "global_batch", "less than one sequence"},
      {"negative train tokens", [](RequestForm& f) { f.train_tokens = "-1T"; }, "train_tokens", "must be a positive number"},
      {"train tokens past plan files' limit", [](RequestForm& f) { f.train_tokens = "1e30"; }, "train_tokens", "at most 1e24 tokens"},
      {"tp not dividing heads", [](RequestForm& f) { f.fixed["tp"] = "3"; }, "fix/tp", "must divide heads (64)"},
      {"tp zero", [](RequestForm& f) { f.fixed["tp"] = "0"; }, "fix/tp", "must be an integer in [1, 65536]"},
      {"pp beyond layers", [](RequestForm& f) { f.fixed["pp"] = "128"; }, "fix", "does not divide gpus(64)"},
      {"bad schedule", [](RequestForm& f) { f.fixed["schedule"] = "zigzag"; }, "fix/schedule", "gpipe, 1f1b or interleaved"},
      {"LoRA rank zero", [](RequestForm& f) { f.lora_rank = "0"; }, "lora_rank", "must be a positive number"},
      {"LoRA rank too large", [](RequestForm& f) { f.lora_rank = "100000"; }, "lora_rank", "65536"},
      {"unknown attention", [](RequestForm& f) { f.attention = "sparse"; }, "attention", "must be one of flash, standard"},
      {"dropout not on or off", [](RequestForm& f) { f.dropout = "maybe"; }, "dropout", "must be one of off, on"},
      {"fp8 on A100", [](RequestForm& f) { f.cluster.ref = "dgx-a100-80g"; f.precision = "fp8"; }, "precision", "fp8 is not supported"},
      {"unknown precision", [](RequestForm& f) { f.precision = "fp4"; }, "precision", "must be one of"},
      {"unknown loss", [](RequestForm& f) { f.loss = "softmax"; }, "loss", "fp32-logits | fused"},
      {"pure 16-bit on Megatron", [](RequestForm& f) { f.stack = "megatron-te"; f.master_weights = "none"; }, "master_weights", "keeps fp32 master weights"},
      {"explicit mask with cp", [](RequestForm& f) { f.attention_mask = "explicit"; f.fixed["cp"] = "2"; }, "attention_mask", "context parallelism"},
      {"unknown attention kernel", [](RequestForm& f) { f.attention_kernel = "flash4"; }, "attention_kernel", "must be one of stack, profile, flash2, flash3"},
      {"FlashAttention-3 on A100", [](RequestForm& f) { f.cluster.ref = "dgx-a100-80g"; f.attention_kernel = "flash3"; }, "attention_kernel",
       "runs on Hopper GPUs only"},
      {"unknown fp8 recipe", [](RequestForm& f) { f.fp8_recipe = "blockwise"; }, "fp8_recipe", "must be one of stack, delayed, current"},
      {"unknown allocator", [](RequestForm& f) { f.allocator = "cudaMallocAsync"; }, "allocator", "must be one of caching, expandable-segments"},
      {"fp8 all-gather in bf16", [](RequestForm& f) { f.stack = "fsdp2"; f.fp8_all_gather = "on"; }, "fp8_all_gather", "needs precision fp8"},
      {"fp8 all-gather neither on nor off", [](RequestForm& f) { f.fp8_all_gather = "yes"; }, "fp8_all_gather", "must be one of off, on"},
      {"delayed fp8 under torchtitan", [](RequestForm& f) { f.stack = "fsdp2"; f.precision = "fp8"; f.fp8_recipe = "delayed"; }, "fp8_recipe",
       "current amax only"},
      {"ends in the split neither on nor off", [](RequestForm& f) { f.fixed["ends_in_split"] = "maybe"; }, "fix/ends_in_split", "must be on or off"},
      {"first stage with more layers than the model", [](RequestForm& f) { f.fixed["pp"] = "4"; f.fixed["first_stage_layers"] = "90"; }, "fix/first_stage_layers", ""},
  };
  for (const auto& c : cases) {
    RequestForm form;
    c.change(form);
    const auto built = build_request(form);
    EXPECT_FALSE(built.request) << c.what;
    ASSERT_FALSE(built.errors.empty()) << c.what;
    EXPECT_EQ(built.errors.front().field, c.field) << c.what << ": " << built.errors.front().message;
    EXPECT_NE(built.errors.front().message.find(c.fragment), std::string::npos) << c.what << ": " << built.errors.front().message;
  }
}

// The stack settings a plan may change, and the uneven pipeline's end stages, reach the request.
TEST(RequestForm, CarriesTheStackSettingsAndTheEndStagesLayers) {
  RequestForm form;
  form.stack = "fsdp2";
  form.loss = "fused";
  form.attention_mask = "explicit";
  form.master_weights = "none";
  form.fp8_recipe = "current";
  form.attention_kernel = "flash2";
  form.allocator = "expandable-segments";
  form.fixed["pp"] = "4";
  form.fixed["first_stage_layers"] = "18";
  form.fixed["last_stage_layers"] = "17";
  const auto built = build_request(form);
  ASSERT_TRUE(built.request) << built.errors.front().field << ": " << built.errors.front().message;
  const auto& t = built.request->training;
  EXPECT_EQ(t.loss, costmodel::LossKernel::kFused);
  EXPECT_EQ(t.attention_mask, costmodel::AttentionMask::kExplicit);
  EXPECT_FALSE(t.master_weights);
  EXPECT_EQ(t.fp8_recipe, costmodel::Fp8Recipe::kCurrent);
  EXPECT_EQ(t.attention_kernel, costmodel::AttentionImpl::kFlash2);
  EXPECT_EQ(t.allocator, costmodel::Allocator::kExpandableSegments);
  // The command line the GUI shows carries them (planner_command).
  const std::string command = gui::planner_command(*built.request, "throughput");
  EXPECT_NE(command.find(" --attention-mask explicit --loss fused --attention-kernel flash2 --fp8-recipe current --pure-16bit --allocator expandable-segments"), std::string::npos) << command;
  EXPECT_EQ(built.request->parallel.reduce_dtype, costmodel::Dtype::kBf16);  // reduced in the parameters' dtype
  EXPECT_EQ(built.request->parallel.first_stage_layers, 18);
  EXPECT_EQ(built.request->parallel.last_stage_layers, 17);

  // fp8 with torchao's fp8 all-gather (FSDP2): the request and the command line carry it.
  RequestForm fp8;
  fp8.cluster.ref = "dgx-h100";
  fp8.stack = "fsdp2-compile";
  fp8.precision = "fp8";
  fp8.fp8_all_gather = "on";
  const auto gathered = build_request(fp8);
  ASSERT_TRUE(gathered.request) << gathered.errors.front().field << ": " << gathered.errors.front().message;
  EXPECT_TRUE(gathered.request->training.fp8_all_gather);
  EXPECT_NE(gui::planner_command(*gathered.request, "throughput").find(" --fp8-all-gather"), std::string::npos);
}

TEST(RequestForm, SeveralBadFieldsAreAllReported) {
  RequestForm form;
  form.gpus = "0";
  form.seq_len = "abc";
  form.model.edits["/layers"] = "0";
  const auto built = build_request(form);
  ASSERT_EQ(built.errors.size(), 3u);
  EXPECT_EQ(built.errors[0].field, "model/layers");
  EXPECT_EQ(built.errors[1].field, "gpus");
  EXPECT_EQ(built.errors[2].field, "seq_len");
}

TEST(RequestForm, AnEditedPresetIsCarriedInlineAndAnUnchangedOneByName) {
  RequestForm same;
  same.model.edits["/layers"] = "80";  // the preset's own value
  same.cluster.edits["/gpu/hbm_capacity_gib"] = "80";
  const auto unchanged = build_request(same);
  ASSERT_TRUE(unchanged.request);
  EXPECT_EQ(unchanged.request->model_ref, "llama3-70b");
  EXPECT_EQ(unchanged.request->cluster_ref, "dgx-h100");

  RequestForm edited;
  edited.model.edits["/layers"] = "40";
  edited.cluster.edits["/gpu/hbm_capacity_gib"] = "141";
  const auto built = build_request(edited);
  ASSERT_TRUE(built.request) << built.errors.front().message;
  EXPECT_EQ(built.request->model.layers, 40);
  EXPECT_EQ(built.request->model_ref, "inline");
  EXPECT_DOUBLE_EQ(built.request->cluster.gpu.hbm_capacity.in_gib(), 141.0);
  EXPECT_EQ(built.request->cluster_ref, "inline");
}

TEST(RequestForm, BatchInTokensIsRoundedToWholeSequencesWithBinarySuffixes) {
  RequestForm form;
  form.batch_unit = BatchUnit::kTokens;
  form.global_batch = "16M";
  form.seq_len = "8K";
  const auto built = build_request(form);
  ASSERT_TRUE(built.request);
  EXPECT_EQ(built.request->training.seq_len, 8192);
  EXPECT_EQ(built.request->training.global_batch, 2048) << "16 Mi / 8 Ki";
  form.train_tokens = "15T";
  EXPECT_DOUBLE_EQ(build_request(form).request->training.train_tokens, 15e12) << "decimal";
}

TEST(RequestForm, LoraRankAttentionAndDropoutReachTheRequestAndTheCommandLine) {
  RequestForm form;
  form.model.ref = "8b";
  form.gpus = "8";
  form.mode = "lora";
  form.lora_rank = "64";
  form.attention = "standard";
  form.dropout = "on";
  const auto built = build_request(form);
  ASSERT_TRUE(built.request) << built.errors.front().field << ": " << built.errors.front().message;
  const auto& t = built.request->training;
  EXPECT_EQ(t.mode, costmodel::TrainingMode::kLora);
  EXPECT_EQ(t.lora.rank, 64);
  EXPECT_EQ(t.attention, costmodel::AttentionKernel::kStandard);
  EXPECT_TRUE(t.dropout);
  const std::string command = gui::planner_command(*built.request, "throughput");
  EXPECT_NE(command.find("--mode lora --objective throughput --lora-rank 64 --attention standard --dropout"), std::string::npos) << command;
}

// The planner command line the GUI shows searches the same request: same recommendation.
TEST(RequestForm, StackAndMemoryHeadroomReachTheRequestAndTheCommandLine) {
  RequestForm form;
  form.stack = "torch-compile";
  form.memory_headroom = "5";
  const auto built = build_request(form);
  ASSERT_TRUE(built.request) << (built.errors.empty() ? "" : built.errors.front().message);
  EXPECT_EQ(built.request->training.stack, costmodel::Stack::kTorchCompile);
  EXPECT_DOUBLE_EQ(built.memory_headroom, 0.05);
  const std::string command = gui::planner_command(*built.request, "throughput", built.memory_headroom);
  EXPECT_NE(command.find(" --stack torch-compile"), std::string::npos) << command;
  EXPECT_NE(command.find(" --memory-headroom 5"), std::string::npos) << command;
  // The defaults (the executor's stack, the derived headroom) are not spelled out.
  const auto plain = build_request(RequestForm{});
  EXPECT_DOUBLE_EQ(plain.memory_headroom, costmodel::kDefaultMemoryHeadroom);
  EXPECT_EQ(gui::planner_command(*plain.request, "throughput").find("--stack"), std::string::npos);
  for (const char* bad : {"abc", "-1", "60"}) {
    RequestForm wrong;
    wrong.memory_headroom = bad;
    const auto b = build_request(wrong);
    ASSERT_FALSE(b.errors.empty()) << bad;
    EXPECT_EQ(b.errors.front().field, "memory_headroom") << bad;
  }
  RequestForm unknown;
  unknown.stack = "jax";
  const auto u = build_request(unknown);
  ASSERT_FALSE(u.errors.empty());
  EXPECT_EQ(u.errors.front().field, "stack");
}

TEST(PlannerCommand, TheCliGivesTheGuisRecommendation) {
  RequestForm form;
  form.model.ref = "8b";
  form.gpus = "16";
  form.fixed["pp"] = "2";
  form.fixed["recompute"] = "selective";
  const auto built = build_request(form);
  ASSERT_TRUE(built.request);
  const std::string command = gui::planner_command(*built.request, "cost");
  EXPECT_NE(command.find("--model llama3-8b --gpus 16 --cluster dgx-h100"), std::string::npos) << command;
  EXPECT_NE(command.find("--fix pp=2"), std::string::npos) << command;
  EXPECT_NE(command.find("--fix recompute=selective"), std::string::npos) << command;

  const std::string cli = std::string(TRAINPLAN_PLANNER_BIN) + command.substr(std::string("planner").size()) + " --format json";
  FILE* pipe = ::popen(cli.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  ASSERT_EQ(::pclose(pipe), 0) << cli;
  const auto recommended = nlohmann::json::parse(out).at("recommended");

  planner::SearchOptions options;
  options.objective = planner::Objective::kCost;
  const auto result = planner::search(*built.request, options);
  ASSERT_TRUE(result.ok());
  ASSERT_FALSE(result->ranked.empty());
  EXPECT_EQ(recommended.at("parallel"), costmodel::parallel_to_json(result->ranked.front().plan.parallel));
  EXPECT_DOUBLE_EQ(recommended.at("run").at("cost_usd").get<double>(), result->ranked.front().estimate.run.cost_usd);
}

}  // namespace
}  // namespace trainplan
