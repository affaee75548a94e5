// The JSON documents: every shipped hardware profile, model and sample plan loads; plans
// round-trip through plan_to_json; and bad input is an error that names the file, the JSON
// pointer of the offending value and the rule it breaks (house style: "file: /pointer: rule").

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan {
namespace {

using namespace costmodel;
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<fs::path> json_files(const std::string& folder) {
  std::vector<fs::path> files;
  const fs::path dir = testing::source_path(folder);
  if (!fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read(const fs::path& path) {
  auto text = read_text_file(path.string());
  if (!text) throw std::runtime_error(text.error().message);
  return *text;
}

Plan plan_from(const PlanRequest& r) {
  return Plan{r.name, r.model_ref, r.cluster_ref, r.model, r.cluster, r.gpus, r.training, r.parallel.fixed()};
}

void expect_same_parallel(const ParallelConfig& a, const ParallelConfig& b) {
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.cp, b.cp);
  EXPECT_EQ(a.ep, b.ep);
  EXPECT_EQ(a.sequence_parallel, b.sequence_parallel);
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.shard_group, b.shard_group);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.virtual_stages, b.virtual_stages);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.recompute_layers, b.recompute_layers);
  EXPECT_EQ(a.offload_optimizer, b.offload_optimizer);
  EXPECT_EQ(a.offload_params, b.offload_params);
  EXPECT_EQ(a.fsdp_wrap_min_params, b.fsdp_wrap_min_params);
  EXPECT_EQ(a.prefetch, b.prefetch);
  EXPECT_EQ(a.reduce_dtype, b.reduce_dtype);
  EXPECT_EQ(a.overlap_grad_reduce, b.overlap_grad_reduce);
}

void expect_same_training(const TrainingConfig& a, const TrainingConfig& b) {
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.lora.rank, b.lora.rank);
  EXPECT_EQ(a.lora.targets, b.lora.targets);
  EXPECT_DOUBLE_EQ(a.train_tokens, b.train_tokens);
  EXPECT_EQ(a.dropout, b.dropout);
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.attention_mask, b.attention_mask);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.attention_kernel, b.attention_kernel);
  EXPECT_EQ(a.fp8_recipe, b.fp8_recipe);
  EXPECT_EQ(a.master_weights, b.master_weights);
  EXPECT_EQ(a.allocator, b.allocator);
  EXPECT_EQ(a.stack, b.stack);
}

// ---------------------------------------------------------------------------------------------
// Shipped documents

TEST(ShippedDocuments, EveryHardwareProfileLoads) {
  const auto files = json_files("hwprofiles");
  ASSERT_GE(files.size(), 8u);
  for (const auto& f : files) {
    auto hw = parse_hwprofile_text(read(f), f.string());
    ASSERT_TRUE(hw.ok()) << hw.error().message;
    EXPECT_EQ(hw->name, f.stem().string()) << "a profile's name is its file name";
    EXPECT_GT(hw->gpu.peak_for(Dtype::kBf16).value(), 0) << f;
    EXPECT_GT(hw->gpus_per_node, 0) << f;
    EXPECT_FALSE(hw->source.empty()) << f;
    // Every file is compiled in as a preset of the same name.
    auto preset = find_hwprofile(f.stem().string());
    ASSERT_TRUE(preset.ok()) << preset.error().message;
    EXPECT_DOUBLE_EQ(preset->gpu.hbm_capacity.value(), hw->gpu.hbm_capacity.value()) << f;
  }
}

TEST(ShippedDocuments, EveryModelLoads) {
  const auto files = json_files("samples/models");
  ASSERT_GE(files.size(), 10u);
  for (const auto& f : files) {
    auto m = parse_model_text(read(f), f.string());
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->name, f.stem().string()) << "a model's name is its file name";
    EXPECT_FALSE(m->source.empty()) << f;
    EXPECT_EQ(m->hidden % m->heads, 0) << f;
    auto preset = find_model(f.stem().string());
    ASSERT_TRUE(preset.ok()) << preset.error().message;
    EXPECT_EQ(preset->layers, m->layers) << f;
  }
}

TEST(ShippedDocuments, EverySamplePlanLoadsAndFixedOnesValidate) {
  const auto files = json_files("samples/plans");  // may be empty in a checkout without samples
  for (const auto& f : files) {
    auto req = load_plan_file(f.string());
    ASSERT_TRUE(req.ok()) << req.error().message;
    EXPECT_GT(req->gpus, 0) << f;
    if (req->parallel.fully_fixed()) {
      auto valid = validate_plan(plan_from(*req));
      EXPECT_TRUE(valid.ok()) << f << ": " << valid.error().message;
    }
  }
}

TEST(SamplePlans, Gpt3On1024A100IsFullyFixed) {
  auto req = load_plan_file(testing::source_path("samples/plans/gpt3-175b-1024xa100.json"));
  ASSERT_TRUE(req.ok()) << req.error().message;
  EXPECT_EQ(req->model.name, "gpt3-175b");
  EXPECT_EQ(req->cluster.name, "dgx-a100-80g");
  EXPECT_EQ(req->gpus, 1024);
  EXPECT_EQ(req->training.global_batch, 1536);
  EXPECT_EQ(req->training.seq_len, 2048);
  ASSERT_TRUE(req->parallel.fully_fixed());
  const ParallelConfig p = req->parallel.fixed();
  EXPECT_EQ(p.tp, 8);
  EXPECT_EQ(p.pp, 8);
  EXPECT_EQ(p.dp, 16);
  EXPECT_EQ(p.cp, 1);
  EXPECT_EQ(p.ep, 1);
  EXPECT_EQ(p.schedule, Schedule::kInterleaved);
  EXPECT_EQ(p.virtual_stages, 2);
  EXPECT_EQ(p.recompute, Recompute::kFull);
  EXPECT_EQ(p.micro_batch, 1);
  EXPECT_EQ(p.zero_stage, 1);
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_EQ(p.gpus(), 1024);
}

TEST(SamplePlans, Llama70bAutoLeavesEveryParallelFieldOpen) {
  auto req = load_plan_file(testing::source_path("samples/plans/llama3-70b-64xh100-auto.json"));
  ASSERT_TRUE(req.ok()) << req.error().message;
  const ParallelConstraints& c = req->parallel;
  EXPECT_FALSE(c.tp || c.pp || c.dp || c.cp || c.ep || c.zero_stage || c.shard_group || c.micro_batch || c.virtual_stages ||
               c.sequence_parallel || c.schedule || c.recompute || c.offload_optimizer);
  EXPECT_EQ(req->model.name, "llama3-70b");
  EXPECT_EQ(req->gpus, 64);
}

TEST(SamplePlans, Llama8bLoraUsesRank16) {
  auto req = load_plan_file(testing::source_path("samples/plans/llama3-8b-lora-8xh100.json"));
  ASSERT_TRUE(req.ok()) << req.error().message;
  EXPECT_EQ(req->training.mode, TrainingMode::kLora);
  EXPECT_EQ(req->training.lora.rank, 16);
  EXPECT_EQ(req->gpus, 8);
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(PlanDocument, RoundTripKeepsParallelAndTrainingConfig) {
  for (const char* name : {"gpt3-175b-1024xa100.json", "llama3-8b-lora-8xh100.json"}) {
    auto req = load_plan_file(testing::source_path(std::string("samples/plans/") + name));
    ASSERT_TRUE(req.ok()) << req.error().message;
    const Plan plan = plan_from(*req);
    for (bool inline_documents : {false, true}) {
      SCOPED_TRACE(std::string(name) + (inline_documents ? " (inline documents)" : " (preset names)"));
      const std::string text = plan_to_json(plan, inline_documents).dump(2);
      auto back = parse_plan_text(text, "roundtrip.json");
      ASSERT_TRUE(back.ok()) << back.error().message;
      ASSERT_TRUE(back->parallel.fully_fixed());
      expect_same_parallel(back->parallel.fixed(), plan.parallel);
      expect_same_training(back->training, plan.training);
      EXPECT_EQ(back->gpus, plan.gpus);
      EXPECT_EQ(back->name, plan.name);
      EXPECT_EQ(back->model.name, plan.model.name);
      EXPECT_EQ(back->model.hidden, plan.model.hidden);
      EXPECT_EQ(back->cluster.name, plan.cluster.name);
      EXPECT_EQ(back->model_ref, inline_documents ? "inline" : plan.model_ref);
    }
  }
}

// The default tokens to train (20 per parameter) of the largest model a model document allows
// stay within what a plan document accepts, so a saved plan reads back. The bounds are the model
// reader's (model.cpp): 10,000 layers, hidden 2^20, 4,096 heads, ffn 2^22, vocab 2^24, 65,536
// experts of width 2^22. A 132 P-parameter dense model's default (2.6e18) once failed to read back
// against a ceiling of 1e18.
TEST(PlanDocument, TheLargestModelsDefaultTokensReadBack) {
  ModelSpec m = testing::model("gpt3-175b");
  m.name = "largest";
  m.layers = 10000;
  m.hidden = 1 << 20;
  m.heads = 4096;
  m.kv_heads = 4096;
  m.ffn_hidden = 1 << 22;
  m.vocab = 1 << 24;
  m.moe = MoeSpec{};
  m.moe->experts = 1 << 16;
  m.moe->top_k = 1;
  m.moe->expert_ffn_hidden = 1 << 22;
  PlanRequest req;
  req.model = m;
  req.cluster = testing::cluster("dgx-h100");
  req.gpus = 1;
  resolve_training_defaults(req.model, req.training);
  EXPECT_GT(req.training.train_tokens, 1e23) << "20 x about 8.6e21 parameters";
  EXPECT_LE(req.training.train_tokens, kMaxTrainTokens);
  Plan plan;
  plan.model = req.model;
  plan.cluster = req.cluster;
  plan.gpus = req.gpus;
  plan.training = req.training;
  auto back = parse_plan_text(plan_to_json(plan, true).dump(), "largest.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_DOUBLE_EQ(back->training.train_tokens, req.training.train_tokens);
  json over = plan_to_json(plan, true);
  over["training"]["train_tokens"] = 2e24;
  auto refused = parse_plan_text(over.dump(), "over.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("over.json: /training/train_tokens"), std::string::npos) << refused.error().message;
}

TEST(HwprofileDocument, EveryPresetRoundTripsThroughJson) {
  for (const auto& name : hwprofile_preset_names()) {
    const HardwareProfile a = testing::cluster(name);
    auto b = parse_hwprofile(hwprofile_to_json(a), "roundtrip.json");
    ASSERT_TRUE(b.ok()) << name << ": " << b.error().message;
    for (int d = 0; d < kDtypeCount; ++d) EXPECT_NEAR(b->gpu.peak[d].value(), a.gpu.peak[d].value(), 1e-6 * a.gpu.peak[d].value()) << name;
    EXPECT_NEAR(b->gpu.hbm_capacity.value(), a.gpu.hbm_capacity.value(), 1.0) << name;
    EXPECT_NEAR(b->gpu.hbm_bandwidth.value(), a.gpu.hbm_bandwidth.value(), 1e-9 * a.gpu.hbm_bandwidth.value()) << name;
    EXPECT_EQ(b->gpus_per_node, a.gpus_per_node) << name;
    EXPECT_NEAR(b->intra_node.bandwidth.value(), a.intra_node.bandwidth.value(), 1.0) << name;
    EXPECT_NEAR(b->inter_node.bandwidth.value(), a.inter_node.bandwidth.value(), 1.0) << name;
    EXPECT_EQ(b->inter_node.nics_per_node, a.inter_node.nics_per_node) << name;
    EXPECT_DOUBLE_EQ(b->inter_node.efficiency, a.inter_node.efficiency) << name;
    EXPECT_NEAR(b->inter_node.latency.value(), a.inter_node.latency.value(), 1e-12) << name;
    EXPECT_NEAR(b->restart_time.value(), a.restart_time.value(), 1e-9) << name;
    EXPECT_DOUBLE_EQ(b->price_per_gpu_hour_usd, a.price_per_gpu_hour_usd) << name;
  }
}

// A model or cluster named by a relative path is found beside the plan file, whatever the
// working directory is.
TEST(PlanDocument, RelativeModelPathIsResolvedBesideThePlanFile) {
  const fs::path dir = fs::temp_directory_path() / ("trainplan_documents_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "plans");
  {
    std::ofstream(dir / "plans" / "tiny-model-xyz.json") << model_to_json(testing::model("tinyllama-1.1b")).dump();
    json plan = {{"schema", "trainplan/plan/v1"}, {"model", "tiny-model-xyz.json"}, {"cluster", "dgx-h100"}, {"gpus", 8}};
    std::ofstream(dir / "plans" / "plan.json") << plan.dump();
  }
  auto req = load_plan_file((dir / "plans" / "plan.json").string());
  fs::remove_all(dir);
  ASSERT_TRUE(req.ok()) << req.error().message;
  EXPECT_EQ(req->model.name, "tinyllama-1.1b");
  EXPECT_EQ(req->model_ref, "tiny-model-xyz.json");
}

TEST(PlanDocument, MissingFileFailsNamingThePath) {
  const std::string path = testing::source_path("samples/plans/no-such-plan.json");
  auto req = load_plan_file(path);
  ASSERT_FALSE(req.ok());
  EXPECT_NE(req.error().message.find(path), std::string::npos) << req.error().message;
}

// ---------------------------------------------------------------------------------------------
// Bad input: every case is an error naming the file and the pointer / rule.

enum class Kind { kPlan, kModel, kHwprofile };

struct BadCase {
  const char* what;
  Kind kind;
  std::string text;
  std::vector<std::string> fragments;  // each must appear in the message
};

json good_plan() {
  return {{"schema", "trainplan/plan/v1"},
          {"model", "llama3-70b"},
          {"cluster", "dgx-h100"},
          {"gpus", 64},
          {"training", {{"seq_len", 8192}, {"global_batch", 512}}},
          {"parallel", {{"tp", 8}, {"pp", 4}, {"dp", 2}}}};
}

json good_model() { return model_to_json(testing::model("llama3-8b")); }

json good_hwprofile() { return json::parse(read(testing::source_path("hwprofiles/dgx-h100.json"))); }

json set(json doc, const std::string& pointer, json value) {
  doc[json::json_pointer(pointer)] = std::move(value);
  return doc;
}

std::string with(json doc, const std::string& pointer, json value) { return set(std::move(doc), pointer, std::move(value)).dump(); }

std::string without(json doc, const std::string& pointer) {
  const json::json_pointer p(pointer);
  doc[p.parent_pointer()].erase(p.back());
  return doc.dump();
}

std::vector<BadCase> bad_cases() {
  const std::string truncated = good_plan().dump(2).substr(0, good_plan().dump(2).size() / 2);
  json inline_huge = good_plan();
  inline_huge["model"] = good_model();
  inline_huge["model"]["hidden"] = 1e12;
  json tp3 = good_plan();
  tp3["parallel"] = {{"tp", 3}};
  return {
      {"malformed JSON", Kind::kPlan, "{", {"bad.json", "line 1", "malformed JSON"}},
      {"truncated JSON", Kind::kPlan, truncated, {"bad.json", "malformed JSON"}},
      {"not an object", Kind::kPlan, "[1, 2]", {"bad.json", "must be a JSON object"}},
      {"empty text", Kind::kModel, "", {"bad.json", "malformed JSON"}},
      {"unknown top-level key", Kind::kPlan, with(good_plan(), "/colour", "blue"), {"bad.json: /colour: unknown key"}},
      {"unknown nested key", Kind::kPlan, with(good_plan(), "/training/sequence_len", 4096), {"bad.json: /training/sequence_len: unknown key"}},
      {"unknown parallel key", Kind::kPlan, with(good_plan(), "/parallel/tensor_parallel", 8), {"bad.json: /parallel/tensor_parallel: unknown key"}},
      {"unknown model preset", Kind::kPlan, with(good_plan(), "/model", "llama9-1t"), {"bad.json: /model:", "unknown model \"llama9-1t\"", "llama3-405b"}},
      {"unknown cluster preset", Kind::kPlan, with(good_plan(), "/cluster", "dgx-z900"), {"bad.json: /cluster:", "unknown cluster \"dgx-z900\"", "dgx-b200"}},
      {"model neither name nor document", Kind::kPlan, with(good_plan(), "/model", 70), {"bad.json: /model:", "preset name"}},
      {"missing gpus", Kind::kPlan, without(good_plan(), "/gpus"), {"bad.json: /gpus: is required"}},
      {"negative gpus", Kind::kPlan, with(good_plan(), "/gpus", -64), {"bad.json: /gpus: must be in [1,", "(got -64)"}},
      {"zero gpus", Kind::kPlan, with(good_plan(), "/gpus", 0), {"bad.json: /gpus: must be in [1,", "(got 0)"}},
      {"fractional gpus", Kind::kPlan, with(good_plan(), "/gpus", 6.5), {"bad.json: /gpus: must be an integer"}},
      {"string for gpus", Kind::kPlan, with(good_plan(), "/gpus", "64"), {"bad.json: /gpus: must be an integer"}},
      {"zero seq_len", Kind::kPlan, with(good_plan(), "/training/seq_len", 0), {"bad.json: /training/seq_len: must be in [1,"}},
      {"string for global_batch", Kind::kPlan, with(good_plan(), "/training/global_batch", "lots"), {"bad.json: /training/global_batch: must be an integer"}},
      {"negative train_tokens", Kind::kPlan, with(good_plan(), "/training/train_tokens", -1), {"bad.json: /training/train_tokens: must be > 0"}},
      {"unknown precision", Kind::kPlan, with(good_plan(), "/training/precision", "fp4"), {"bad.json: /training/precision: must be one of fp32 | bf16 | fp16 | fp8", "\"fp4\""}},
      {"zero tp", Kind::kPlan, with(good_plan(), "/parallel/tp", 0), {"bad.json: /parallel/tp: must be in [1,"}},
      {"zero_stage 4", Kind::kPlan, with(good_plan(), "/parallel/zero_stage", 4), {"bad.json: /parallel/zero_stage: must be in [0, 3]"}},
      {"string for a boolean", Kind::kPlan, with(good_plan(), "/parallel/sequence_parallel", "yes"), {"bad.json: /parallel/sequence_parallel: must be true or false"}},
      {"inline model with absurd hidden", Kind::kPlan, inline_huge.dump(), {"bad.json: /model/hidden: must be in [1, 1048576]"}},
      {"heads not divisible by tp", Kind::kPlan, tp3.dump(), {"bad.json", "/parallel/tp", "tp(3)", "heads (64)"}},
      {"axes do not multiply to gpus", Kind::kPlan, with(set(good_plan(), "/parallel/dp", 4), "/parallel/cp", 1),
       {"bad.json", "/parallel", "tp(8)", "cp(1)", "pp(4)", "dp(4)", "= 128", "!= gpus(64)"}},
      {"wrong plan schema", Kind::kPlan, with(good_plan(), "/schema", "trainplan/plan/v2"), {"bad.json: /schema: must be \"trainplan/plan/v1\"", "v2"}},
      {"missing schema", Kind::kPlan, without(good_plan(), "/schema"), {"bad.json: /schema: is required"}},
      // model documents
      {"absurd hidden", Kind::kModel, with(good_model(), "/hidden", 1e12), {"bad.json: /hidden: must be in [1, 1048576]"}},
      {"negative layers", Kind::kModel, with(good_model(), "/layers", -32), {"bad.json: /layers: must be in [1,"}},
      {"string for layers", Kind::kModel, with(good_model(), "/layers", "32"), {"bad.json: /layers: must be an integer"}},
      {"heads do not divide hidden", Kind::kModel, with(good_model(), "/heads", 3), {"bad.json: /hidden: must be divisible by heads (3)"}},
      {"kv_heads do not divide heads", Kind::kModel, with(good_model(), "/kv_heads", 5), {"bad.json: /kv_heads: must divide heads (32)"}},
      {"unknown architecture", Kind::kModel, with(good_model(), "/architecture", "rwkv"), {"bad.json: /architecture: must be one of gpt | llama"}},
      {"unknown model key", Kind::kModel, with(good_model(), "/n_layers", 32), {"bad.json: /n_layers: unknown key"}},
      {"top_k above experts", Kind::kModel, with(good_model(), "/moe", {{"experts", 2}, {"top_k", 3}}), {"bad.json: /moe/top_k: must be in [1, 2]"}},
      {"wrong model schema", Kind::kModel, with(good_model(), "/schema", "trainplan/hwprofile/v1"), {"bad.json: /schema: must be \"trainplan/model/v1\""}},
      // hardware profiles
      {"negative NIC bandwidth", Kind::kHwprofile, with(good_hwprofile(), "/inter_node/nic_bandwidth_gbit_per_s", -400),
       {"bad.json: /inter_node/nic_bandwidth_gbit_per_s: must be >= 0.001 (got -400)"}},
      {"efficiency above one", Kind::kHwprofile, with(good_hwprofile(), "/intra_node/efficiency", 1.5), {"bad.json: /intra_node/efficiency: must be <= 1"}},
      {"zero bf16 peak", Kind::kHwprofile, with(good_hwprofile(), "/gpu/peak_dense_tflop_per_s/bf16", 0), {"bad.json: /gpu/peak_dense_tflop_per_s/bf16: must be >= 0.001"}},
      // Positive but absurd: once taken, and every time and cost in the report came out infinite.
      {"vanishing bf16 peak", Kind::kHwprofile, with(good_hwprofile(), "/gpu/peak_dense_tflop_per_s/bf16", 1e-300),
       {"bad.json: /gpu/peak_dense_tflop_per_s/bf16: must be >= 0.001 (got 1e-300)"}},
      {"vanishing NVLink bandwidth", Kind::kHwprofile, with(good_hwprofile(), "/intra_node/bandwidth_gb_per_s", 1e-300),
       {"bad.json: /intra_node/bandwidth_gb_per_s: must be >= 0.001"}},
      {"string for HBM capacity", Kind::kHwprofile, with(good_hwprofile(), "/gpu/hbm_capacity_gib", "80"), {"bad.json: /gpu/hbm_capacity_gib: must be a number"}},
      {"reserved memory beyond HBM", Kind::kHwprofile, with(good_hwprofile(), "/gpu/reserved_memory_gib", 200),
       {"bad.json: /gpu/reserved_memory_gib: must be less than hbm_capacity_gib (80)"}},
      {"zero SMs", Kind::kHwprofile, with(good_hwprofile(), "/gpu/sm_count", 0), {"bad.json: /gpu/sm_count: must be in [1,"}},
      {"unknown link kind", Kind::kHwprofile, with(good_hwprofile(), "/intra_node/kind", "carrier-pigeon"), {"bad.json: /intra_node/kind: must be one of"}},
      {"unknown nested hw key", Kind::kHwprofile, with(good_hwprofile(), "/node/gpus", 8), {"bad.json: /node/gpus: unknown key"}},
      {"missing GPU name", Kind::kHwprofile, without(good_hwprofile(), "/gpu/name"), {"bad.json: /gpu/name: is required"}},
      {"wrong hwprofile schema", Kind::kHwprofile, with(good_hwprofile(), "/schema", "trainplan/hwprofile/v0"), {"bad.json: /schema: must be \"trainplan/hwprofile/v1\""}},
  };
}

std::string error_of(Kind kind, const std::string& text) {
  switch (kind) {
    case Kind::kPlan: { auto r = parse_plan_text(text, "bad.json"); return r.ok() ? "" : r.error().message; }
    case Kind::kModel: { auto r = parse_model_text(text, "bad.json"); return r.ok() ? "" : r.error().message; }
    case Kind::kHwprofile: { auto r = parse_hwprofile_text(text, "bad.json"); return r.ok() ? "" : r.error().message; }
  }
  return "";
}

TEST(BadInput, BaseDocumentsOfTheTableAreValid) {
  EXPECT_EQ(error_of(Kind::kPlan, good_plan().dump()), "");
  EXPECT_EQ(error_of(Kind::kModel, good_model().dump()), "");
  EXPECT_EQ(error_of(Kind::kHwprofile, good_hwprofile().dump()), "");
}

TEST(BadInput, EveryCaseFailsNamingFileAndPointer) {
  const auto cases = bad_cases();
  ASSERT_GE(cases.size(), 40u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string message = error_of(c.kind, c.text);
    ASSERT_FALSE(message.empty()) << "accepted: " << c.text;
    for (const auto& fragment : c.fragments) EXPECT_NE(message.find(fragment), std::string::npos) << "\"" << fragment << "\" not in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

// JSON cannot hold NaN or infinity, but a literal beyond double range (1e400) is valid JSON
// syntax; it must be rejected as an error, not escape as an exception.
TEST(BadInput, NumberBeyondDoubleRangeIsAnError) {
  std::string text = good_model().dump();
  const std::string key = "\"hidden\":4096";
  const auto pos = text.find(key);
  ASSERT_NE(pos, std::string::npos);
  text.replace(pos, key.size(), "\"hidden\":1e400");
  std::string message;
  EXPECT_NO_THROW(message = error_of(Kind::kModel, text));
  EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
  EXPECT_NE(message.find("1e400"), std::string::npos) << message;
  // The same in a plan document.
  EXPECT_NO_THROW(message = error_of(Kind::kPlan, "{\"schema\": \"trainplan/plan/v1\", \"gpus\": 1e400}"));
  EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
}

// nlohmann keeps the last of two equal keys silently; every document reader refuses them,
// naming the key's JSON pointer (RFC 6901: "~" as ~0, "/" as ~1).
TEST(BadInput, DuplicateKeysAreRefusedNamingTheirPointer) {
  struct Case {
    const char* text;
    const char* message;  // "" when the text is valid
  };
  const Case cases[] = {
      {R"({"a": 1, "a": 2})", "d.json: /a: duplicate key \"a\""},
      {R"({"x": {"b": 1, "c": 2, "b": 3}})", "d.json: /x/b: duplicate key \"b\""},
      {R"({"x": [{"k": 1}, {"k": 1, "k": 2}]})", "d.json: /x/1/k: duplicate key \"k\""},
      {R"([[1, 2], [3, {"z": [], "y": 0, "z": {}}]])", "d.json: /1/1/z: duplicate key \"z\""},
      {R"({"x": [1, [2, 3], {"q": 1}], "y": {"q": {"q": 1, "w/~": 1, "w/~": 2}}})", "d.json: /y/q/w~1~0: duplicate key \"w/~\""},
      {R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})", ""},  // equal keys in different objects
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto parsed = parse_json_text(c.text, "d.json");
    if (*c.message == '\0') {
      EXPECT_TRUE(parsed.ok()) << parsed.error().message;
      continue;
    }
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.error().message.rfind(c.message, 0), 0u) << parsed.error().message;
  }
  // A long array of objects (a measurement's trace events) read in one pass: the duplicate in its
  // last element is found at its index. (nlohmann's callback parser, used before, re-scanned the
  // array at every object's end: 200,000 objects took seconds.)
  std::string events = "{\"events\": [";
  for (int i = 0; i < 200000; ++i) events += "{\"t\": 1, \"rank\": 0},";
  events += "{\"t\": 1, \"t\": 2}]}";
  auto parsed = parse_json_text(events, "m.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().message.rfind("m.json: /events/200000/t: duplicate key \"t\"", 0), 0u) << parsed.error().message;
}

TEST(BadInput, ADuplicateKeyInAPlanOrModelFileIsAnErrorNotTheLastValue) {
  std::string text = good_model().dump();
  const std::string key = "\"hidden\":4096";
  const auto pos = text.find(key);
  ASSERT_NE(pos, std::string::npos);
  text.replace(pos, key.size(), key + ",\"hidden\":8192");
  const std::string message = error_of(Kind::kModel, text);
  EXPECT_NE(message.find("bad.json: /hidden: duplicate key \"hidden\""), std::string::npos) << message;
}

TEST(ReadTextFile, ADirectoryIsNamedAsOne) {
  const fs::path dir = fs::temp_directory_path() / ("trainplan_read_dir_" + std::to_string(::getpid()) + ".json");
  fs::create_directories(dir);
  auto text = read_text_file(dir.string());
  auto plan = load_plan_file(dir.string());
  fs::remove_all(dir);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().message, dir.string() + ": is a directory, not a file");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().message, dir.string() + ": is a directory, not a file");
}

}  // namespace
}  // namespace trainplan
