// Exporting fixed plans to other stacks (`planner export --to megatron|torchtitan|deepspeed|accelerate`):
// each target's file for three plans, byte for byte against expected files written by hand from
// the plans' numbers (tests/data/export/), the refusals that name the plan field a stack cannot
// express, and the command line (exit codes, --out).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

// The file less its first comment line, the cost model's prediction for the stack that runs it
// (checked on its own by ExportPlan.StatesThePredictionForTheStackThatRunsIt), so the hand-written
// files do not change with the model's numbers.
std::string without_prediction(const std::string& text) {
  const std::string marker = "# trainplan predicts for the ";
  const std::size_t at = text.find(marker);
  if (at == std::string::npos) return text;
  return text.substr(0, at) + text.substr(text.find('\n', at) + 1);
}

namespace fs = std::filesystem;
using planner::ExportTarget;
using testing::quote;

using testing::read_text;

costmodel::Plan load(const std::string& path) {
  auto plan = planner::load_fixed_plan(path);
  if (!plan) throw std::runtime_error(plan.error().message);
  return *plan;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Golden {
  std::string plan;      // relative to the source tree
  ExportTarget target;
  std::string expected;  // in tests/data/export/
};

const Golden kGoldens[] = {
    {"samples/plans/gpt3-175b-1024xa100.json", ExportTarget::kMegatron, "gpt3-175b-1024xa100.megatron.sh"},
    {"tests/data/export/llama3-70b-tp8-pp2-cp2.plan.json", ExportTarget::kMegatron, "llama3-70b-tp8-pp2-cp2.megatron.sh"},
    {"tests/data/export/mixtral-8x7b-ep8-fp8.plan.json", ExportTarget::kMegatron, "mixtral-8x7b-ep8-fp8.megatron.sh"},
    {"tests/data/export/llama3-8b-fsdp8.plan.json", ExportTarget::kTorchtitan, "llama3-8b-fsdp8.torchtitan.toml"},
    {"tests/data/export/llama3-70b-hsdp-tp8.plan.json", ExportTarget::kTorchtitan, "llama3-70b-hsdp-tp8.torchtitan.toml"},
    {"samples/plans/tiny-llama-pp4.json", ExportTarget::kTorchtitan, "tiny-llama-pp4.torchtitan.toml"},
    {"tests/data/export/llama3-8b-fsdp8.plan.json", ExportTarget::kDeepspeed, "llama3-8b-fsdp8.deepspeed.json"},
    {"tests/data/export/llama3-8b-zero2-offload.plan.json", ExportTarget::kDeepspeed, "llama3-8b-zero2-offload.deepspeed.json"},
    {"samples/plans/llama3-8b-lora-8xh100.json", ExportTarget::kDeepspeed, "llama3-8b-lora-8xh100.deepspeed.json"},
    {"tests/data/export/llama3-8b-fsdp8.plan.json", ExportTarget::kAccelerate, "llama3-8b-fsdp8.accelerate.yaml"},
    {"tests/data/export/llama3-8b-hsdp16-offload.plan.json", ExportTarget::kAccelerate, "llama3-8b-hsdp16-offload.accelerate.yaml"},
    {"tests/data/export/llama3.2-1b-zero2-cp2.plan.json", ExportTarget::kAccelerate, "llama3.2-1b-zero2-cp2.accelerate.yaml"},
    {"tests/data/export/llama3-8b-fsdp1-hybrid16.plan.json", ExportTarget::kAccelerate, "llama3-8b-fsdp1-hybrid16.accelerate.yaml"},
    {"tests/data/export/llama3-8b-pretrain-hybrid16.plan.json", ExportTarget::kLitgpt, "llama3-8b-pretrain-hybrid16.litgpt.yaml"},
    {"tests/data/export/llama3-8b-lora-fsdp8.plan.json", ExportTarget::kLitgpt, "llama3-8b-lora-fsdp8.litgpt.yaml"},
};

TEST(ExportPlan, EachTargetWritesTheHandWrittenFileForThreePlans) {
  for (const Golden& g : kGoldens) {
    SCOPED_TRACE(g.plan + " --to " + planner::export_target_name(g.target));
    const costmodel::Plan plan = load(testing::source_path(g.plan));
    auto exported = planner::export_plan(plan, g.target);
    ASSERT_TRUE(exported.ok()) << exported.error().message;
    EXPECT_EQ(without_prediction(exported->text), read_text(testing::data_path("export/" + g.expected)));
    EXPECT_EQ(exported->file_name, plan.name + "-" + planner::export_target_name(g.target) +
                                       g.expected.substr(g.expected.rfind('.')));
  }
}

// The expected files parse as what they claim to be, where Python has the parser (skips otherwise).
TEST(ExportPlan, ExpectedFilesParseAsTomlJsonAndYaml) {
  const std::string dir = testing::data_path("export");
  const struct {
    const char* module;
    const char* extension;
    const char* load;
  } parsers[] = {{"tomllib", ".toml", "tomllib.load(open(f, 'rb'))"},
                 {"json", ".json", "json.load(open(f))"},
                 {"yaml", ".yaml", "yaml.safe_load(open(f))"}};
  int checked = 0;
  for (const auto& p : parsers) {
    if (std::system(("python3 -c 'import " + std::string(p.module) + "' >/dev/null 2>&1").c_str()) != 0) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string f = entry.path().string();
      if (entry.path().extension() != p.extension || contains(f, ".plan.json")) continue;
      const std::string command = "python3 -c \"import " + std::string(p.module) + "; f = '" + f + "'; " + p.load + "\" >/dev/null 2>&1";
      EXPECT_EQ(std::system(command.c_str()), 0) << f << " does not parse with " << p.module;
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no python3 with tomllib, json or yaml";
}

TEST(ExportPlan, NotesSayWhatTheFileLeavesToTheTrainingScript) {
  auto lora = planner::export_plan(load(testing::source_path("samples/plans/llama3-8b-lora-8xh100.json")), ExportTarget::kDeepspeed);
  ASSERT_TRUE(lora.ok()) << lora.error().message;
  std::string notes;
  for (const auto& n : lora->notes) notes += n + "\n";
  EXPECT_TRUE(contains(notes, "deepspeed: mode=lora: add the rank-16 adapters (q, k, v, o) in the training script")) << notes;
  EXPECT_TRUE(contains(notes, "deepspeed: recompute=selective:")) << notes;
  EXPECT_TRUE(contains(notes, "deepspeed --num_nodes 1 --num_gpus 8")) << notes;
  // Stage 0 in bf16 (this plan's) is DeepSpeed's BF16_Optimizer (engine.py
  // _do_optimizer_sanity_check), which the prediction prices: said, since the states are
  // partitioned though the stage is 0. Not at stage 1.
  EXPECT_TRUE(contains(notes, "deepspeed: stage 0 in bf16 runs DeepSpeed's BF16_Optimizer")) << notes;
  costmodel::Plan stage1 = load(testing::source_path("samples/plans/llama3-8b-lora-8xh100.json"));
  stage1.parallel.zero_stage = 1;
  auto zero1 = planner::export_plan(stage1, ExportTarget::kDeepspeed);
  ASSERT_TRUE(zero1.ok()) << zero1.error().message;
  for (const auto& n : zero1->notes) EXPECT_FALSE(contains(n, "BF16_Optimizer")) << n;
  // Expert parallelism is AutoEP: autoep_size ranks share each MoE layer's experts, the model type
  // picks the preset (docs: deepspeed/module_inject/auto_ep_config.py).
  costmodel::Plan moe = load(testing::data_path("export/mixtral-8x7b-ep8-fp8.plan.json"));
  moe.parallel.tp = 1;
  moe.parallel.sequence_parallel = false;
  moe.parallel.dp = 64;
  moe.training.precision = costmodel::Precision::kBf16;
  auto ep = planner::export_plan(moe, ExportTarget::kDeepspeed);
  ASSERT_TRUE(ep.ok()) << ep.error().message;
  EXPECT_TRUE(contains(ep->text, "  \"expert_parallel\": {\n    \"enabled\": true,\n    \"autoep_size\": 8\n  },\n")) << ep->text;
  EXPECT_TRUE(contains(ep->notes.back(), "deepspeed: expert_parallel (AutoEP) finds the MoE layers")) << ep->notes.back();
}

struct Refusal {
  std::string plan;
  ExportTarget target;
  std::vector<std::string> fragments;  // each in the error, in this order
};

TEST(ExportPlan, RefusesWhatAStackCannotExpressNamingTheField) {
  const std::string d = "tests/data/export/";
  const Refusal refusals[] = {
      {d + "llama3-70b-tp8-pp2-cp2.plan.json", ExportTarget::kDeepspeed,
       {"deepspeed: pp=2: DeepSpeed's pipeline engine needs a PipelineModule in the training script; a JSON config cannot express it",
        "; deepspeed: tp=8 with sequence_parallel=true:", "; deepspeed: cp=2:"}},
      {d + "llama3-70b-tp8-pp2-cp2.plan.json", ExportTarget::kTorchtitan, {"torchtitan: zero_stage=1:"}},
      {d + "llama3-70b-tp8-pp2-cp2.plan.json", ExportTarget::kAccelerate,
       {"accelerate: pp=2:", "; accelerate: tp=8:", "; accelerate: zero_stage=1:", "; accelerate: recompute=selective:"}},
      {"samples/plans/gpt3-175b-1024xa100.json", ExportTarget::kTorchtitan, {"torchtitan: architecture=gpt:"}},
      {d + "mixtral-8x7b-ep8-fp8.plan.json", ExportTarget::kTorchtitan, {"torchtitan: moe (8 experts):", "; torchtitan: zero_stage=1:"}},
      {d + "mixtral-8x7b-ep8-fp8.plan.json", ExportTarget::kDeepspeed, {"deepspeed: tp=2 with sequence_parallel=true:", "; deepspeed: precision=fp8:"}},
      {"samples/plans/llama3-8b-lora-8xh100.json", ExportTarget::kMegatron, {"megatron: mode=lora: pretrain_gpt.py trains every weight"}},
      {"samples/plans/llama3-8b-lora-8xh100.json", ExportTarget::kTorchtitan, {"torchtitan: mode=lora:"}},
      {d + "llama3-8b-hsdp16-offload.plan.json", ExportTarget::kMegatron, {"megatron: offload_params=cpu:"}},
      {d + "llama3-8b-hsdp16-offload.plan.json", ExportTarget::kDeepspeed, {"deepspeed: shard_group=8: hybrid sharding is DeepSpeed's MiCS"}},
      {d + "llama3-8b-zero2-offload.plan.json", ExportTarget::kAccelerate, {"accelerate: offload_optimizer=cpu, offload_params=none:"}},
      {d + "llama3-8b-zero2-offload.plan.json", ExportTarget::kTorchtitan, {"torchtitan: offload_optimizer=cpu, offload_params=none:"}},
      {d + "llama3.2-1b-zero2-cp2.plan.json", ExportTarget::kTorchtitan, {"torchtitan: tied_embeddings=true:", "; torchtitan: precision=fp16:"}},
      // LitGPT's recipes fix their layout in code (pretrain.py, finetune/full.py, finetune/lora.py).
      {d + "llama3-8b-fsdp8.plan.json", ExportTarget::kLitgpt, {"litgpt: recompute=full: litgpt pretrain on 8 GPUs runs recompute=none (no activation checkpointing)"}},
      {"samples/plans/llama3-8b-lora-8xh100.json", ExportTarget::kLitgpt,
       {"litgpt: zero_stage=0: litgpt finetune_lora shards parameters, gradients and optimizer states over all 8 GPUs (ZeRO-3, FSDP fully_shard)",
        "; litgpt: recompute=selective:"}},
      {d + "llama3-70b-tp8-pp2-cp2.plan.json", ExportTarget::kLitgpt, {"litgpt: tp=8:", "; litgpt: pp=2:", "; litgpt: cp=2:", "; litgpt: zero_stage=1"}},
      {"samples/plans/gpt3-175b-1024xa100.json", ExportTarget::kLitgpt, {"litgpt: architecture=gpt: LitGPT's models use rotary positions"}},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.plan + " --to " + planner::export_target_name(r.target));
    auto exported = planner::export_plan(load(testing::source_path(r.plan)), r.target);
    ASSERT_FALSE(exported.ok()) << exported->text;
    const std::string& message = exported.error().message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    std::size_t at = 0;
    for (const auto& fragment : r.fragments) {
      const std::size_t found = message.find(fragment, at);
      EXPECT_NE(found, std::string::npos) << "no \"" << fragment << "\" (in order) in: " << message;
      if (found != std::string::npos) at = found + fragment.size();
    }
  }
}

// Context parallelism is exported as it was priced: PyTorch's default rotation ("allgather", the
// fsdp2 stack's, torch 2.11 _context_parallel/_attention.py) unless the plan fixes the ring; the
// all-gather with reduce-scattered gradients (Megatron's) is no PyTorch method, and PyTorch's
// rotation no Megatron one.
TEST(ExportPlan, ContextParallelismIsWrittenAsItWasPriced) {
  costmodel::Plan plan = load(testing::source_path("tests/data/export/llama3.2-1b-zero2-cp2.plan.json"));
  plan.model.tied_embeddings = false;
  plan.training.precision = costmodel::Precision::kBf16;
  auto pytorch = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(pytorch.ok()) << pytorch.error().message;
  EXPECT_NE(pytorch->text.find("context_parallel_rotate_method = \"allgather\""), std::string::npos) << pytorch->text;
  costmodel::Plan ring = plan;
  ring.parallel.cp_comm = costmodel::ContextAttention::kRing;
  auto alltoall = planner::export_plan(ring, ExportTarget::kTorchtitan);
  ASSERT_TRUE(alltoall.ok()) << alltoall.error().message;
  EXPECT_NE(alltoall->text.find("context_parallel_rotate_method = \"alltoall\""), std::string::npos) << alltoall->text;
  costmodel::Plan megatron_style = plan;
  megatron_style.parallel.cp_comm = costmodel::ContextAttention::kAllGatherKv;
  auto refused = planner::export_plan(megatron_style, ExportTarget::kTorchtitan);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("cp_comm_type=all_gather"), std::string::npos) << refused.error().message;
  costmodel::Plan rotate = plan;
  rotate.parallel.cp_comm = costmodel::ContextAttention::kAllGatherRotate;
  rotate.training.stack = costmodel::Stack::kMegatronTe;
  auto megatron = planner::export_plan(rotate, ExportTarget::kMegatron);
  ASSERT_FALSE(megatron.ok());
  EXPECT_NE(megatron.error().message.find("cp_comm_type=allgather_rotate"), std::string::npos) << megatron.error().message;
}

TEST(ExportPlan, ScheduleAndLayoutChoicesFollowThePlan) {
  costmodel::Plan plan = load(testing::source_path("samples/plans/tiny-llama-pp4.json"));
  plan.parallel.schedule = costmodel::Schedule::kGpipe;
  auto megatron = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_FALSE(megatron.ok());
  EXPECT_TRUE(contains(megatron.error().message, "megatron: schedule=gpipe: Megatron-LM runs 1F1B and interleaved 1F1B pipelines only"));
  auto titan = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan.ok()) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, "pipeline_parallel_schedule = \"GPipe\"\n")) << titan->text;
  // ZeRO-3 in Megatron is Megatron FSDP sharding everything; ZeRO-2 in torchtitan keeps parameters gathered.
  costmodel::Plan fsdp = load(testing::data_path("export/llama3-8b-fsdp8.plan.json"));
  auto m3 = planner::export_plan(fsdp, ExportTarget::kMegatron);
  ASSERT_TRUE(m3.ok()) << m3.error().message;
  EXPECT_TRUE(contains(m3->text, "  --use-megatron-fsdp\n  --data-parallel-sharding-strategy optim_grads_params\n")) << m3->text;
  EXPECT_FALSE(contains(m3->text, "--num-distributed-optimizer-instances")) << m3->text;
  // Hybrid sharding is Megatron FSDP over num_distributed_optimizer_instances replicas: 16-way dp
  // in shards of 8 is 2 instances (mcore_fsdp_adapter.py enables HSDP when it is above 1).
  auto hsdp = planner::export_plan(load(testing::data_path("export/llama3-70b-hsdp-tp8.plan.json")), ExportTarget::kMegatron);
  ASSERT_TRUE(hsdp.ok()) << hsdp.error().message;
  EXPECT_TRUE(contains(hsdp->text, "  --data-parallel-sharding-strategy optim_grads_params\n"
                                   "  # Hybrid sharding (HSDP): 2 replicas of 8-way shards, the gradients all-reduced across replicas\n"
                                   "  --num-distributed-optimizer-instances 2\n")) << hsdp->text;
  fsdp.parallel.zero_stage = 2;
  auto t2 = planner::export_plan(fsdp, ExportTarget::kTorchtitan);
  ASSERT_TRUE(t2.ok()) << t2.error().message;
  EXPECT_TRUE(contains(t2->text, "data_parallel_shard_degree = 8\n# ZeRO-2: parameters kept gathered from forward to backward\n"
                                 "fsdp_reshard_after_forward = \"never\"\n")) << t2->text;
  // Plain data parallelism is a MULTI_GPU (DDP) Accelerate config without fsdp_config.
  fsdp.parallel.zero_stage = 0;
  auto ddp = planner::export_plan(fsdp, ExportTarget::kAccelerate);
  ASSERT_TRUE(ddp.ok()) << ddp.error().message;
  EXPECT_TRUE(contains(ddp->text, "distributed_type: MULTI_GPU\n")) << ddp->text;
  EXPECT_FALSE(contains(ddp->text, "fsdp_config")) << ddp->text;
}

// A model from a Hugging Face config whose block is not plain GPT or Llama: Megatron-LM takes
// Qwen2's Q/K/V biases (--add-qkv-bias, TransformerConfig.add_qkv_bias) and Gemma's head size
// (--kv-channels, TransformerConfig.kv_channels); what neither stack's options here express
// (Gemma's GeGLU, Mistral's sliding window, DeepSeek's MLA, shared experts and dense layers) is
// refused naming the model feature, not written as a Llama block.
TEST(ExportPlan, ModelFeaturesBeyondTheGptOrLlamaBlockAreWrittenOrRefused) {
  const auto plan_of = [](const std::string& config) {
    auto model = costmodel::find_model(std::string(TRAINPLAN_SOURCE_DIR) + "/tests/data/hf/" + config + ".json");
    if (!model) throw std::runtime_error(model.error().message);
    costmodel::Plan plan = load(std::string(TRAINPLAN_SOURCE_DIR) + "/tests/data/export/llama3-8b-fsdp8.plan.json");
    plan.model = *model;
    return plan;
  };
  auto qwen2 = planner::export_plan(plan_of("qwen2-7b"), ExportTarget::kMegatron);
  ASSERT_TRUE(qwen2) << qwen2.error().message;
  EXPECT_TRUE(contains(qwen2->text, "  --disable-bias-linear\n  --add-qkv-bias\n")) << qwen2->text;
  EXPECT_FALSE(contains(qwen2->text, "--kv-channels"));
  const auto torchtitan_qwen2 = planner::export_plan(plan_of("qwen2-7b"), ExportTarget::kTorchtitan);
  ASSERT_FALSE(torchtitan_qwen2);
  EXPECT_TRUE(contains(torchtitan_qwen2.error().message, "torchtitan: model qwen2-7b: Q/K/V biases differ from the Llama block"));

  const auto gemma = planner::export_plan(plan_of("gemma-7b"), ExportTarget::kMegatron);
  ASSERT_FALSE(gemma);
  EXPECT_TRUE(contains(gemma.error().message, "megatron: model gemma-7b: gate activation (GeGLU) differ from the Llama block"))
      << gemma.error().message;
  EXPECT_FALSE(contains(gemma.error().message, "head size"));  // --kv-channels expresses it
  const auto torchtitan_gemma = planner::export_plan(plan_of("gemma-7b"), ExportTarget::kTorchtitan);
  ASSERT_FALSE(torchtitan_gemma);
  EXPECT_TRUE(contains(torchtitan_gemma.error().message, "head size 256 != hidden / heads"));

  const auto mistral = planner::export_plan(plan_of("mistral-7b-v0.1"), ExportTarget::kMegatron);
  ASSERT_FALSE(mistral);
  EXPECT_TRUE(contains(mistral.error().message, "megatron: model mistral-7b-v0.1: sliding window 4096"));
  const auto deepseek = planner::export_plan(plan_of("deepseek-v2-lite"), ExportTarget::kMegatron);
  ASSERT_FALSE(deepseek);
  for (const char* part : {"multi-head latent attention", "shared experts", "1 leading dense layer:"}) {
    EXPECT_TRUE(contains(deepseek.error().message, part)) << part << " in " << deepseek.error().message;
  }
  // DeepSpeed and Accelerate configs leave the model to the training script: no model refusals.
  EXPECT_TRUE(planner::export_plan(plan_of("gemma-7b"), ExportTarget::kDeepspeed));
}

TEST(ExportPlan, GpusThatAreNotWholeNodesAreAnError) {
  costmodel::Plan plan = load(testing::data_path("export/llama3-8b-hsdp16-offload.plan.json"));
  plan.gpus = 12;
  plan.parallel.dp = 12;
  plan.parallel.shard_group = 0;
  auto exported = planner::export_plan(plan, ExportTarget::kDeepspeed);
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.error().message, "gpus(12) is not a whole number of nodes of 8 GPUs (dgx-h100)");
}

// Plans may train up to 1e24 tokens (plan.hpp kMaxTrainTokens); at a small step that is more
// optimizer steps than a signed 64-bit count holds (--train-iters once read -9223372036854775808).
TEST(ExportPlan, MoreStepsThanA64BitCountHoldsAreAnError) {
  costmodel::Plan plan = load(testing::data_path("export/llama3-8b-hsdp16-offload.plan.json"));
  plan.training.global_batch = 16;  // one sequence per rank
  plan.training.seq_len = 1024;
  const double step_tokens = static_cast<double>(plan.training.global_batch) * static_cast<double>(plan.training.seq_len);
  plan.training.train_tokens = 1e24;
  ASSERT_GT(1e24 / step_tokens, 9.3e18) << "the plan's step must be under 1.08e5 tokens for this case";
  for (ExportTarget target : {ExportTarget::kMegatron, ExportTarget::kTorchtitan, ExportTarget::kDeepspeed, ExportTarget::kAccelerate}) {
    auto exported = planner::export_plan(plan, target);
    ASSERT_FALSE(exported.ok()) << export_target_name(target);
    EXPECT_NE(exported.error().message.find("/training/train_tokens: 1e+24 tokens are"), std::string::npos) << exported.error().message;
    EXPECT_NE(exported.error().message.find("more than a 64-bit step count holds"), std::string::npos) << exported.error().message;
  }
  plan.training.train_tokens = 4e18 * step_tokens;  // under 2^62 steps: written
  auto written = planner::export_plan(plan, ExportTarget::kAccelerate);
  EXPECT_TRUE(written.ok()) << written.error().message;
}

TEST(ExportTargetName, ParsesTheFiveNamesAndListsThemOtherwise) {
  for (ExportTarget t : planner::export_targets()) {
    auto parsed = planner::parse_export_target(planner::export_target_name(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  auto bad = planner::parse_export_target("nemo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "--to: unknown stack \"nemo\" (one of: megatron, torchtitan, deepspeed, accelerate, litgpt)");
}

class ExportCli : public testing::PlannerCliTest {};

TEST_F(ExportCli, PrintsTheFileAndItsNotesOnStderr) {
  const std::string plan = testing::data_path("export/llama3-8b-fsdp8.plan.json");
  const auto r = run("export " + quote(plan) + " --to deepspeed");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(r.out, read_text(testing::data_path("export/llama3-8b-fsdp8.deepspeed.json")));
  EXPECT_EQ(r.err.rfind("planner: note: trainplan predicts for the deepspeed stack: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("\nplanner: note: deepspeed: run 8 GPUs = 1 node x 8:"), std::string::npos) << r.err;
}

TEST_F(ExportCli, OutWritesTheFileAndNothingElse) {
  const std::string plan = testing::source_path("samples/plans/gpt3-175b-1024xa100.json");
  const fs::path out = dir_ / "gpt3.sh";
  const auto r = run("export " + quote(plan) + " --to megatron --out " + quote(out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(without_prediction(read_text(out.string())), read_text(testing::data_path("export/gpt3-175b-1024xa100.megatron.sh")));
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
}

TEST_F(ExportCli, BadInputAndPlansAStackCannotExpressExitTwoWritingNothing) {
  const std::string tiny = testing::source_path("samples/plans/tiny-llama-pp4.json");
  const std::string request = testing::source_path("samples/plans/llama3-70b-64xh100-auto.json");
  const fs::path out = dir_ / "never.json";
  expect_bad_inputs({
      {"unknown stack", "export " + quote(tiny) + " --to nemo", "--to: unknown stack \"nemo\" (one of: megatron, torchtitan, deepspeed, accelerate, litgpt)"},
      {"a plan request", "export " + quote(request) + " --to megatron", request + ": /parallel: tp, pp, dp"},
      {"missing plan", "export " + quote((dir_ / "nope.json").string()) + " --to megatron", "cannot open file"},
      {"a pipeline for DeepSpeed", "export " + quote(tiny) + " --to deepspeed --out " + quote(out.string()),
       tiny + ": deepspeed: pp=4: DeepSpeed's pipeline engine needs a PipelineModule in the training script"},
  });
  EXPECT_FALSE(fs::exists(out));
  const auto no_target = run("export " + quote(tiny));
  EXPECT_EQ(no_target.exit_code, 2) << no_target.all();
}

// Each export states the prediction for the stack that runs it (issue 32): torchtitan is FSDP2,
// DeepSpeed its own stack, Megatron-LM megatron-te, Accelerate FSDP2 where the plan shards; the
// line is the estimate of the plan with that stack, first among the notes and, except in
// DeepSpeed's JSON, the file's first comment (after Megatron's #! line).
TEST(ExportPlan, StatesThePredictionForTheStackThatRunsIt) {
  const costmodel::Plan plan = load(testing::data_path("export/llama3-8b-fsdp8.plan.json"));
  const struct {
    planner::ExportTarget target;
    const char* stack;
  } cases[] = {{planner::ExportTarget::kMegatron, "megatron-te"},
               {planner::ExportTarget::kTorchtitan, "fsdp2"},
               {planner::ExportTarget::kDeepspeed, "deepspeed"},
               {planner::ExportTarget::kAccelerate, plan.parallel.zero_stage >= 2 ? "hf-fsdp2" : "hf-ddp"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.stack);
    EXPECT_STREQ(costmodel::stack_name(planner::export_stack(plan, c.target)), c.stack);
    auto exported = planner::export_plan(plan, c.target);
    ASSERT_TRUE(exported.ok()) << exported.error().message;
    costmodel::Plan as_run = plan;
    as_run.training.stack = planner::export_stack(plan, c.target);
    if (as_run.training.stack == costmodel::Stack::kHfDdp) as_run.parallel.zero_stage = 0;  // DDP: nothing sharded
    const costmodel::Estimate e = costmodel::estimate(as_run);
    char step[32];
    std::snprintf(step, sizeof step, "%.3g s per step", e.time.step.value());
    ASSERT_FALSE(exported->notes.empty());
    const std::string& note = exported->notes.front();
    EXPECT_EQ(note.rfind(std::string("trainplan predicts for the ") + c.stack + " stack: " + step, 0), 0u) << note;
    if (c.target == planner::ExportTarget::kDeepspeed) {
      EXPECT_EQ(exported->text.find("trainplan predicts"), std::string::npos);
    } else {
      EXPECT_NE(exported->text.find("# " + note + ".\n"), std::string::npos);
    }
  }
}

// Accelerate follows the plan's FSDP version (issue 32): a plan made for the fsdp1 stack is
// written as fsdp_version 1 and predicted for fsdp1, any other sharded plan as fsdp_version 2 and
// hf-fsdp2 (FSDP2 with the Hugging Face module the script trains). FSDP1's HYBRID_SHARD builds its shard group from the node's devices and Accelerate's
// parallelism_config needs FSDP2, so an fsdp1 plan sharded over another group is refused
// (accelerate 1.15.0 utils/dataclasses.py, commands/launch.py).
TEST(ExportPlan, AccelerateFollowsThePlansFsdpVersion) {
  costmodel::Plan plan = load(testing::data_path("export/llama3-8b-fsdp1-hybrid16.plan.json"));
  EXPECT_EQ(planner::export_stack(plan, ExportTarget::kAccelerate), costmodel::Stack::kFsdp1);
  plan.training.stack = costmodel::Stack::kFsdp2;
  EXPECT_EQ(planner::export_stack(plan, ExportTarget::kAccelerate), costmodel::Stack::kHfFsdp2);
  auto v2 = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(v2.ok()) << v2.error().message;
  EXPECT_TRUE(contains(v2->text, "  fsdp_version: 2\n"));
  EXPECT_TRUE(contains(v2->text, "parallelism_config_dp_shard_size: 8\n"));
  plan.training.stack = costmodel::Stack::kFsdp1;
  plan.parallel.shard_group = 16;  // the whole data-parallel group
  auto whole = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  EXPECT_TRUE(contains(whole->text, "  fsdp_sharding_strategy: FULL_SHARD\n"));
  EXPECT_FALSE(contains(whole->text, "parallelism_config"));
  plan.parallel.zero_stage = 2;
  auto zero2 = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(zero2.ok()) << zero2.error().message;
  EXPECT_TRUE(contains(zero2->text, "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"));
  plan.parallel.zero_stage = 3;
  plan.parallel.shard_group = 4;  // half a node: FSDP1 cannot be told
  auto refused = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(contains(refused.error().message, "accelerate: shard_group=4 (stack fsdp1): FSDP1's HYBRID_SHARD shards within each node of 8 GPUs"))
      << refused.error().message;
}

// Accelerate's FSDP reduces gradients in the mixed-precision dtype: set_mixed_precision makes
// reduce_dtype the param dtype for FSDP1 and FSDP2 (accelerate 1.15.0 utils/dataclasses.py, called
// from state.py when mixed_precision is not "no"); its DDP all-reduces the parameters' (fp32)
// gradients unless a communication hook casts them. The config cannot say another dtype; the
// script can, and the note names what it passes. Pure 16-bit DDP gradients cannot be reduced in
// fp32 by a hook: refused.
TEST(ExportPlan, AccelerateReducesInTheMixedPrecisionDtype) {
  costmodel::Plan plan = load(testing::data_path("export/llama3-8b-fsdp8.plan.json"));
  plan.parallel.reduce_dtype = costmodel::Dtype::kBf16;
  auto bf16 = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(bf16.ok()) << bf16.error().message;
  EXPECT_FALSE(contains(bf16->text, "reduce_dtype"));
  plan.parallel.reduce_dtype = costmodel::Dtype::kFp32;
  auto fp32 = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(fp32.ok()) << fp32.error().message;
  EXPECT_TRUE(contains(fp32->text, "# reduce_dtype=fp32: predicted for a script that passes FullyShardedDataParallelPlugin(mixed_precision_policy="
                                   "{\"param_dtype\": torch.bfloat16, \"reduce_dtype\": torch.float32, \"output_dtype\": torch.bfloat16}) "
                                   "(Accelerate's FSDP reduces in bf16, its set_mixed_precision's policy).\n"));
  plan.parallel.zero_stage = 0;  // DDP
  plan.parallel.reduce_dtype = costmodel::Dtype::kBf16;
  auto ddp = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(ddp.ok()) << ddp.error().message;
  EXPECT_TRUE(contains(ddp->text, "# reduce_dtype=bf16: predicted for a script that passes Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                                  "comm_hook=DDPCommunicationHookType.BF16)]) (Accelerate's DDP all-reduces the fp32 gradients).\n"));
  plan.parallel.reduce_dtype = costmodel::Dtype::kFp32;
  auto ddp_fp32 = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_TRUE(ddp_fp32.ok()) << ddp_fp32.error().message;
  EXPECT_FALSE(contains(ddp_fp32->text, "reduce_dtype"));
  plan.training.master_weights = false;  // a bf16 model: its DDP gradients are bf16
  auto pure = planner::export_plan(plan, ExportTarget::kAccelerate);
  ASSERT_FALSE(pure.ok());
  EXPECT_TRUE(contains(pure.error().message, "accelerate: reduce_dtype=fp32: Accelerate's DDP all-reduces the bf16 gradients in their own dtype"))
      << pure.error().message;
}

// Megatron-LM reduces in its main-grad buffer's dtype, which validate_args sets from the
// precision flags (NVIDIA/Megatron-LM d98e8a64dd megatron/training/arguments.py): --bf16 keeps it
// in fp32 unless --grad-reduce-in-bf16; --fp16 keeps it in fp16 unless
// --accumulate-allreduce-grads-in-fp32. The export writes the flag the plan's dtype needs and
// refuses one Megatron cannot reduce in (bf16 beside fp16 parameters).
TEST(ExportPlan, MegatronWritesTheFlagForThePlansReductionDtype) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.training.precision = costmodel::Precision::kFp16;
  plan.parallel.reduce_dtype = costmodel::Dtype::kFp32;
  auto fp32 = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(fp32.ok()) << fp32.error().message;
  EXPECT_TRUE(contains(fp32->text, "--accumulate-allreduce-grads-in-fp32"));
  plan.parallel.reduce_dtype = costmodel::Dtype::kFp16;
  auto fp16 = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(fp16.ok()) << fp16.error().message;
  EXPECT_FALSE(contains(fp16->text, "--accumulate-allreduce-grads-in-fp32"));
  EXPECT_FALSE(contains(fp16->text, "--grad-reduce-in-bf16"));
  plan.parallel.reduce_dtype = costmodel::Dtype::kBf16;
  auto bf16 = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_FALSE(bf16.ok());
  EXPECT_TRUE(contains(bf16.error().message, "megatron: reduce_dtype=bf16: Megatron-LM reduces fp16 gradients in fp32 or fp16")) << bf16.error().message;
  plan.training.precision = costmodel::Precision::kBf16;
  auto bf16_bf16 = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(bf16_bf16.ok()) << bf16_bf16.error().message;
  EXPECT_TRUE(contains(bf16_bf16->text, "--grad-reduce-in-bf16"));
  EXPECT_FALSE(contains(bf16_bf16->text, "--accumulate-allreduce-grads-in-fp32"));
}

// LitGPT's recipes reduce in what Lightning gives them (lightning 2.6.6): pretrain's and
// finetune_full's FSDPStrategy the precision's dtype (fabric/plugins/precision/fsdp.py: bf16 for
// bf16-mixed), finetune_lora's fully_shard the parameters' dtype (fp32 under bf16-mixed, which
// also keeps the frozen weights in fp32: a note). A plan reducing otherwise is refused.
TEST(ExportPlan, LitgptReducesAsLightningDoes) {
  costmodel::Plan plan = load(testing::data_path("export/llama3-8b-pretrain-hybrid16.plan.json"));
  ASSERT_EQ(plan.parallel.reduce_dtype, costmodel::Dtype::kBf16);
  ASSERT_TRUE(planner::export_plan(plan, ExportTarget::kLitgpt).ok());
  plan.parallel.reduce_dtype = costmodel::Dtype::kFp32;
  auto refused = planner::export_plan(plan, ExportTarget::kLitgpt);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "litgpt: reduce_dtype=fp32: litgpt pretrain reduces gradients in bf16 (Lightning's FSDPPrecision: the precision's "
                                     "dtype; --stack fsdp1 plans so)");
  costmodel::Plan lora = load(testing::data_path("export/llama3-8b-lora-fsdp8.plan.json"));
  ASSERT_EQ(lora.parallel.reduce_dtype, costmodel::Dtype::kFp32);
  auto written = planner::export_plan(lora, ExportTarget::kLitgpt);
  ASSERT_TRUE(written.ok()) << written.error().message;
  EXPECT_TRUE(contains(written->text, "# litgpt: precision bf16-mixed builds the model in fp32, so the frozen weights take 4 bytes a parameter"));
  lora.parallel.reduce_dtype = costmodel::Dtype::kBf16;
  auto bf16 = planner::export_plan(lora, ExportTarget::kLitgpt);
  ASSERT_FALSE(bf16.ok());
  EXPECT_TRUE(contains(bf16.error().message, "litgpt: reduce_dtype=bf16: litgpt finetune_lora reduces gradients in fp32 (FSDP2 without a mixed-precision policy"))
      << bf16.error().message;
}

// Uneven pipelines (issue 32): the plan's first and last stage layers, or a split the layers do
// not make evenly, go to Megatron-LM as --pipeline-model-parallel-layout (one entry per model
// chunk in layer order, E the embedding, t a decoder layer, L the loss; NVIDIA/Megatron-LM
// d98e8a64dd megatron/core/transformer/pipeline_parallel_layer_layout.py), the chunks' layers
// being the estimate's (what the executor runs too).
TEST(ExportPlan, MegatronWritesAnUnevenPipelineAsItsLayout) {
  costmodel::Plan plan = load(testing::source_path("samples/plans/gpt3-175b-1024xa100.json"));
  ASSERT_GT(plan.parallel.pp, 2);
  const int pp = plan.parallel.pp, v = plan.parallel.virtual_stages;
  plan.parallel.first_stage_layers = v;
  plan.parallel.last_stage_layers = v;
  ASSERT_TRUE(costmodel::validate_plan(plan)) << costmodel::validate_plan(plan).error().message;
  const std::vector<int> chunks = costmodel::estimate(plan).pipeline.chunk_layers;
  ASSERT_EQ(chunks.size(), static_cast<std::size_t>(pp * v));
  EXPECT_EQ(chunks.front(), 1);
  EXPECT_EQ(chunks.back(), 1);
  std::string layout = "E";
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (c > 0) layout += "|";
    layout += chunks[c] == 1 ? "t" : "t*" + std::to_string(chunks[c]);
  }
  layout += "L";
  auto exported = planner::export_plan(plan, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(exported.ok()) << exported.error().message;
  EXPECT_TRUE(contains(exported->text, "--pipeline-model-parallel-layout \"" + layout + "\"\n")) << exported->text;
  EXPECT_FALSE(contains(exported->text, "--num-layers-per-virtual-pipeline-stage"));
  // Stages that split evenly keep the plain options.
  const costmodel::Plan even = load(testing::source_path("samples/plans/gpt3-175b-1024xa100.json"));
  auto plain = planner::export_plan(even, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(contains(plain->text, "--pipeline-model-parallel-layout"));
}

// The embedding and the loss counted as a layer each of the pipeline split (issue 32; Megatron-Core's
// --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split, Llama 3's
// pipeline, Dubey et al. 2024 Sec. 3.3.2): Llama 3 405B's 126 layers + 2 in 16 stages x 8 chunks
// of one layer, the first chunk holding the embedding alone, the last the loss alone; written for
// Megatron-LM as its layout "E|t|...|t|L", and refused where it cannot be.
TEST(ExportPlan, MegatronWritesTheEmbeddingAndTheLossAsChunksOfTheirOwn) {
  costmodel::Plan plan = testing::make_plan("llama3-405b", "dgx-h100", 1024, 8192, 2048);
  plan.training.stack = costmodel::Stack::kMegatronTe;
  plan.parallel.tp = 8;
  plan.parallel.pp = 16;
  plan.parallel.dp = 8;
  plan.parallel.sequence_parallel = true;
  plan.parallel.zero_stage = 1;
  plan.parallel.virtual_stages = 8;
  plan.parallel.schedule = costmodel::Schedule::kInterleaved;
  EXPECT_TRUE(contains(costmodel::validate_plan(plan).error().message, "pp(16) * virtual_stages(8) exceeds layers (126)"));
  plan.parallel.ends_in_split = true;
  ASSERT_TRUE(costmodel::validate_plan(plan)) << costmodel::validate_plan(plan).error().message;
  const std::vector<int> chunks = costmodel::estimate(plan).pipeline.chunk_layers;
  ASSERT_EQ(chunks.size(), 128u);
  EXPECT_EQ(chunks.front(), 0);
  EXPECT_EQ(chunks.back(), 0);
  EXPECT_EQ(std::count(chunks.begin(), chunks.end(), 1), 126);
  std::string layout = "E";
  for (int c = 1; c < 127; ++c) layout += "|t";
  layout += "|L";
  auto exported = planner::export_plan(plan, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(exported.ok()) << exported.error().message;
  EXPECT_TRUE(contains(exported->text, "--pipeline-model-parallel-layout \"" + layout + "\"\n")) << exported->text;
  // The document keeps it; a fixed request reads it back.
  const auto j = costmodel::parallel_to_json(plan.parallel);
  EXPECT_EQ(j.at("ends_in_pipeline_split"), true);
  EXPECT_FALSE(costmodel::parallel_to_json(costmodel::Plan{}.parallel).contains("ends_in_pipeline_split"));
  // Refused: an uneven split, one stage, beside first_stage_layers, a stack that does not split so.
  costmodel::Plan uneven = plan;
  uneven.parallel.virtual_stages = 7;
  EXPECT_TRUE(contains(costmodel::validate_plan(uneven).error().message,
                       "/parallel/ends_in_pipeline_split: the model's 126 layers + the embedding + the loss = 128 must split evenly over pp(16) x "
                       "virtual_stages(7) = 112 model chunks"))
      << costmodel::validate_plan(uneven).error().message;
  costmodel::Plan both = plan;
  both.parallel.virtual_stages = 1;
  both.parallel.schedule = costmodel::Schedule::kOneFOneB;
  both.parallel.first_stage_layers = 7;
  EXPECT_TRUE(contains(costmodel::validate_plan(both).error().message, "not with first_stage_layers"));
  costmodel::Plan executor = plan;
  executor.training.stack = costmodel::Stack::kTrainplan;
  EXPECT_TRUE(contains(costmodel::validate_plan(executor).error().message,
                       "/parallel/ends_in_pipeline_split: the trainplan stack does not count the embedding and the loss"))
      << costmodel::validate_plan(executor).error().message;
}

// What the first and last stage layers must satisfy, each error naming the field.
TEST(PlanDocument, FirstAndLastStageLayersAreChecked) {
  costmodel::Plan plan = load(testing::source_path("samples/plans/gpt3-175b-1024xa100.json"));
  costmodel::Plan one_stage = plan;
  one_stage.parallel.pp = 1;
  one_stage.parallel.dp *= plan.parallel.pp;
  one_stage.parallel.virtual_stages = 1;
  one_stage.parallel.schedule = costmodel::Schedule::kOneFOneB;
  one_stage.parallel.first_stage_layers = 4;
  EXPECT_TRUE(contains(costmodel::validate_plan(one_stage).error().message, "/parallel/first_stage_layers: needs pp > 1"));
  costmodel::Plan too_many = plan;
  too_many.parallel.first_stage_layers = plan.model.layers;
  too_many.parallel.virtual_stages = 1;
  too_many.parallel.schedule = costmodel::Schedule::kOneFOneB;
  EXPECT_TRUE(contains(costmodel::validate_plan(too_many).error().message, "each of which needs at least one"));
  if (plan.parallel.virtual_stages > 1) {
    costmodel::Plan odd = plan;
    odd.parallel.last_stage_layers = plan.parallel.virtual_stages + 1;
    EXPECT_TRUE(contains(costmodel::validate_plan(odd).error().message, "split evenly over virtual_stages"));
  }
  // The document keeps them.
  costmodel::Plan kept = plan;
  kept.parallel.first_stage_layers = plan.parallel.virtual_stages;
  const auto j = costmodel::parallel_to_json(kept.parallel);
  EXPECT_EQ(j.at("first_stage_layers"), plan.parallel.virtual_stages);
  EXPECT_FALSE(j.contains("last_stage_layers"));
}

}  // namespace
}  // namespace trainplan

namespace trainplan {
namespace {

// Issue 33, part 5: a plan's name travels into comments, TOML strings and file names. A line
// break would end a comment and start a command (a plan named "evil\ntouch /tmp/x\n#" made the
// SLURM script and the Megatron export run `touch /tmp/x`): documents refuse control characters
// where they are read, naming the field.
TEST(HostileNames, ControlCharactersAreRefusedWhereTheDocumentIsRead) {
  nlohmann::json j = costmodel::plan_to_json(testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64));
  j["name"] = "evil\ntouch /tmp/x\n#";
  const auto parsed = costmodel::parse_plan(j, "evil.json");
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.error().message.find("evil.json: /name: must be single-line printable text (control character 0x0a at character 5)"),
            std::string::npos)
      << parsed.error().message;
  j["name"] = "tab\there";
  EXPECT_FALSE(costmodel::parse_plan(j, "evil.json"));
}

// What may stay in a name (quotes, backslashes, $(...), backticks, ;) is quoted for each file: a
// TOML basic string escapes the quote and the backslash, comments hold the rest, and the suggested
// file name keeps none of it.
TEST(HostileNames, AreQuotedInEveryFileTheyReach) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  plan.parallel.micro_batch = 1;
  plan.name = "a\"b\\c $(touch x) `id`; rm -rf ../..";
  const auto titan = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, "description = \"trainplan plan a\\\"b\\\\c $(touch x) `id`; rm -rf ../..\"\n")) << titan->text;
  EXPECT_EQ(titan->file_name, "a_b_c___touch_x___id___rm_-rf_.._..-torchtitan.toml");
  for (const ExportTarget target : planner::export_targets()) {
    const auto exported = planner::export_plan(plan, target);
    if (!exported) continue;
    EXPECT_EQ(exported->file_name.find('/'), std::string::npos) << planner::export_target_name(target);
    std::istringstream lines(exported->text);
    for (std::string line; std::getline(lines, line);) {
      // The name's only unquoted home is a comment (or, in TOML, the escaped string above).
      if (!contains(line, "$(touch x)") || line.rfind("description = ", 0) == 0) continue;
      EXPECT_EQ(line.find_first_not_of(' '), line.find('#')) << planner::export_target_name(target) << ": " << line;
    }
  }
}

}  // namespace
}  // namespace trainplan

namespace trainplan {
namespace {

// Issue 33: what the stacks' own argument checks said of the exports.
// Megatron-LM d98e8a64dd megatron/training/arguments.py: tensor or context parallelism asserts
// CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell; Megatron FSDP asserts it is not 1 and that
// --ckpt-format is fsdp_dtensor.
TEST(StackChecks, MegatronScriptSetsWhatValidateArgsAsserts) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 16, 4096, 64);
  plan.parallel.tp = 2;
  plan.parallel.dp = 8;
  plan.parallel.sequence_parallel = true;
  plan.parallel.zero_stage = 1;
  auto tp = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(tp) << tp.error().message;
  EXPECT_TRUE(contains(tp->text, "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"));
  plan.parallel.zero_stage = 3;
  auto fsdp = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(fsdp) << fsdp.error().message;
  EXPECT_TRUE(contains(fsdp->text, "\nunset CUDA_DEVICE_MAX_CONNECTIONS\n"));
  EXPECT_TRUE(contains(fsdp->text, "  --ckpt-format fsdp_dtensor\n"));
  EXPECT_FALSE(contains(fsdp->text, "export CUDA_DEVICE_MAX_CONNECTIONS"));
}

// torchtitan 42b0beb4 models/llama3/infra/parallelize.py: "DDP has not supported > 1D
// parallelism": ZeRO-0 beside tp, pp or cp is refused, saying so.
TEST(StackChecks, TorchtitanRefusesDdpBesideOtherParallelisms) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 16, 4096, 64);
  plan.parallel.tp = 2;
  plan.parallel.dp = 8;
  plan.parallel.sequence_parallel = true;
  const auto refused = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message, "DDP has not supported > 1D parallelism")) << refused.error().message;
  plan.parallel.zero_stage = 3;
  EXPECT_TRUE(planner::export_plan(plan, ExportTarget::kTorchtitan));
}

// The flavor the torchtitan export asks to register has the plan's MLP width under torchtitan's
// own rule (models/llama3/model/model.py FeedForward: int(2 x 4 dim / 3), times
// ffn_dim_multiplier, rounded up to multiple_of), for widths no default multiple_of of 256 gives.
TEST(StackChecks, TorchtitanFlavorLineGivesThePlansMlpWidth) {
  for (const auto& [hidden, ffn] : std::vector<std::pair<int, int>>{{256, 256}, {256, 768}, {2048, 5461}, {8192, 28672}, {5120, 13824}}) {
    costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
    plan.model.name = "custom";
    plan.model.hidden = hidden;
    plan.model.heads = hidden / 128;
    plan.model.kv_heads = std::min(8, hidden / 128);
    plan.model.ffn_hidden = ffn;
    plan.parallel.zero_stage = 3;
    const auto exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
    ASSERT_TRUE(exported) << exported.error().message;
    const std::string key = "ffn_dim_multiplier=";
    const std::size_t at = exported->text.find(key);
    ASSERT_NE(at, std::string::npos) << exported->text;
    const double multiplier = std::stod(exported->text.substr(at + key.size()));
    const long base = static_cast<long>(2.0 * (4.0 * hidden) / 3.0);  // Python: int(2 * hidden_dim / 3)
    EXPECT_EQ(static_cast<long>(multiplier * static_cast<double>(base)), ffn) << hidden << " " << ffn;
    EXPECT_TRUE(contains(exported->text, "multiple_of=1,"));
  }
}

// torchtitan v0.2.2's float8 training: the "quantize.linear.float8" converter with tensorwise
// scaling, the output layer filtered out (job_config.py Float8Linear; components/quantization/float8.py).
TEST(StackChecks, TorchtitanWritesFloat8AsItsConverter) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  plan.training.precision = costmodel::Precision::kFp8;
  const auto exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_TRUE(contains(exported->text, "converters = [\"quantize.linear.float8\"]\n"));
  EXPECT_TRUE(contains(exported->text, "\n[quantize.linear.float8]\nrecipe_name = \"tensorwise\"\nfilter_fqns = [\"output\"]\n"));
}

// torchtitan's mixed precision without FSDP or CP is autocast, which it turns off beside TP or PP
// (distributed/utils.py maybe_enable_amp at v0.2.2): a bf16 plan with tp 8 and dp 1 would train in
// float32 there, so the export refuses it; sharded over dp 2 it is written, and in fp32 too.
TEST(StackChecks, TorchtitanRefusesMixedPrecisionItWouldTurnOff) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 8);
  plan.parallel.tp = 8;
  plan.parallel.dp = 1;
  plan.parallel.sequence_parallel = true;
  auto exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_FALSE(exported);
  EXPECT_TRUE(contains(exported.error().message, "precision=bf16 with tp or pp and no sharded data parallelism: torchtitan then trains in float32"))
      << exported.error().message;
  plan.training.precision = costmodel::Precision::kFp32;
  EXPECT_TRUE(planner::export_plan(plan, ExportTarget::kTorchtitan)) << "an fp32 plan is what torchtitan runs";
  plan = testing::make_plan("llama3-8b", "dgx-h100", 16, 4096, 16);
  plan.parallel.tp = 8;
  plan.parallel.dp = 2;
  plan.parallel.zero_stage = 3;
  plan.parallel.sequence_parallel = true;
  exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
  EXPECT_TRUE(exported) << exported.error().message;
}

// The rotary base goes with the model: Llama 3's 500000 (the presets, from config.json) as
// Megatron's --rotary-base (its default is 10000) and as torchtitan's built-in 8B flavor; the same
// shape with another base is no built-in flavor, and its registration line carries the base.
TEST(StackChecks, TheRotaryBaseGoesWithTheModel) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  EXPECT_DOUBLE_EQ(plan.model.rope_theta, 500000.0);
  auto megatron = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(megatron) << megatron.error().message;
  EXPECT_TRUE(contains(megatron->text, "  --rotary-base 500000\n"));
  auto titan = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, "flavor = \"8B\"\n"));
  plan.model.rope_theta = 10000.0;
  megatron = planner::export_plan(plan, ExportTarget::kMegatron);
  ASSERT_TRUE(megatron) << megatron.error().message;
  EXPECT_FALSE(contains(megatron->text, "--rotary-base"));
  titan = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, ", rope_theta=10000)\n"));
  EXPECT_FALSE(contains(titan->text, "flavor = \"8B\""));
}

// A plan for the fsdp2-compile stack turns torchtitan's compile on for the blocks and the loss
// (job_config.py Compile at v0.2.2; the stack prices both compiled) and is predicted for that stack;
// one for fsdp2 leaves it off (torchtitan's default) and writes no [compile] section.
TEST(StackChecks, TorchtitanCompilesWhereThePlansStackDoes) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  plan.training.stack = costmodel::Stack::kFsdp2Compile;
  EXPECT_EQ(planner::export_stack(plan, ExportTarget::kTorchtitan), costmodel::Stack::kFsdp2Compile);
  auto exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_TRUE(contains(exported->text, "\n[compile]\n"));
  EXPECT_TRUE(contains(exported->text, "enable = true\ncomponents = [\"model\", \"loss\"]\n"));
  EXPECT_TRUE(contains(exported->notes.front(), "trainplan predicts for the fsdp2-compile stack")) << exported->notes.front();
  plan.training.stack = costmodel::Stack::kFsdp2;
  exported = planner::export_plan(plan, ExportTarget::kTorchtitan);
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_FALSE(contains(exported->text, "[compile]"));
  EXPECT_TRUE(contains(exported->notes.front(), "trainplan predicts for the fsdp2 stack")) << exported->notes.front();
}

// DeepSpeed reduces gradients in communication_data_type, and left out in the gradients' own dtype
// (runtime/config.py get_communication_data_type): the export states the plan's, bf16 included
// (the deepspeed stack's default), where it used to refuse anything but fp32.
TEST(StackChecks, DeepspeedStatesTheReductionDtype) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  plan.parallel.reduce_dtype = costmodel::Dtype::kBf16;
  const auto exported = planner::export_plan(plan, ExportTarget::kDeepspeed);
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_EQ(nlohmann::json::parse(exported->text).at("communication_data_type"), "bf16");
}

// DeepSpeed's AutoTP: without an mpu its config counts all ranks in the batch check
// (runtime/config.py), so train_batch_size is the plan's global batch times tp; and AutoTP asserts
// ZeRO-2 at most (runtime/engine.py), which the export refuses and the deepspeed stack never plans.
TEST(StackChecks, DeepspeedAutoTpCountsTheTensorParallelRanksAndStopsAtZero2) {
  costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.tp = 2;
  plan.parallel.dp = 4;
  plan.parallel.sequence_parallel = false;
  plan.parallel.zero_stage = 2;
  plan.parallel.micro_batch = 2;
  const auto exported = planner::export_plan(plan, ExportTarget::kDeepspeed);
  ASSERT_TRUE(exported) << exported.error().message;
  const nlohmann::json c = nlohmann::json::parse(exported->text);
  EXPECT_EQ(c.at("train_batch_size"), 128);  // 2 x 8 micro-batches x 8 ranks, as DeepSpeed checks it
  EXPECT_EQ(c.at("train_batch_size").get<int>(),
            c.at("train_micro_batch_size_per_gpu").get<int>() * c.at("gradient_accumulation_steps").get<int>() * plan.gpus);
  plan.parallel.zero_stage = 3;
  const auto refused = planner::export_plan(plan, ExportTarget::kDeepspeed);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message, "AutoTP runs with ZeRO-2 at most")) << refused.error().message;
  plan.training.stack = costmodel::Stack::kDeepspeed;
  const auto invalid = costmodel::validate_plan(plan);
  ASSERT_FALSE(invalid);
  EXPECT_TRUE(contains(invalid.error().message, "runs tensor parallelism with ZeRO-2 at most")) << invalid.error().message;
}

}  // namespace
}  // namespace trainplan
