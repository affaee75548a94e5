// What a plan may change in its stack (plan.hpp TrainingConfig): the loss kernel, an explicit
// attention mask, pure 16-bit model states. Each against a value derived by hand from the source
// cited beside the field.

#include <algorithm>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/launch.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

// Llama 3 8B fully sharded (ZeRO-3, micro-batch 1) on 8 GPUs of `cluster` under `stack`,
// reducing gradients in `reduce`.
Plan sharded_8b(Stack stack, Dtype reduce, const char* cluster, long long seq, long long global_batch) {
  Plan p = testing::make_plan("llama3-8b", cluster, 8, seq, global_batch);
  p.training.stack = stack;
  p.parallel.zero_stage = 3;
  p.parallel.micro_batch = 1;
  p.parallel.reduce_dtype = reduce;
  return p;
}

// FSDP1 with a bf16 reduce-scatter (its stack's default).
Plan fsdp1_8b(const char* cluster = "dgx-a100-80g", long long seq = 8192) { return sharded_8b(Stack::kFsdp1, Dtype::kBf16, cluster, seq, 64); }

// torch/optim/adamw.py (v2.8.0) creates exp_avg and exp_avg_sq with torch.zeros_like(p): a bf16
// parameter gets bf16 moments, 2 + 2 bytes, and there is no master copy. Mixed precision keeps
// 4 + 4 bytes of moments and a 4-byte master (ZeRO Sec. 3.1: K = 12).
TEST(PureSixteenBit, StatesTakeTheParametersDtype) {
  const StateWidths mixed = state_widths(Precision::kBf16, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(mixed.optimizer, 12.0);
  EXPECT_TRUE(mixed.master);
  const StateWidths pure = state_widths(Precision::kBf16, OptimizerKind::kAdamW, false);
  EXPECT_DOUBLE_EQ(pure.weights, 2.0);
  EXPECT_DOUBLE_EQ(pure.gradients, 2.0);
  EXPECT_DOUBLE_EQ(pure.optimizer, 4.0);
  EXPECT_FALSE(pure.master);
  EXPECT_DOUBLE_EQ(state_widths(Precision::kFp16, OptimizerKind::kSgdMomentum, false).optimizer, 2.0);
  EXPECT_DOUBLE_EQ(state_widths(Precision::kBf16, OptimizerKind::kAdam8bit, false).optimizer, 2.0);  // bitsandbytes' 8-bit states
  EXPECT_FALSE(state_widths(Precision::kFp32, OptimizerKind::kAdamW).master);  // fp32 training: the weights are the masters
}

// FSDP1 FULL_SHARD over 8 GPUs: the optimizer's shard is params x 12 / 8 bytes with fp32 masters,
// params x 4 / 8 pure; the kept gradient shard fp32 (params x 4 / 8, _saved_grad_shard in the
// flat parameter's fp32) or bf16 (x 2 / 8). A checkpoint of pure states holds the bf16 weights
// and moments: 6 bytes per parameter, against 12 (masters and moments) in mixed precision.
TEST(PureSixteenBit, ShrinksTheShardsAndTheCheckpoint) {
  Plan mixed = fsdp1_8b();
  Plan pure = mixed;
  pure.training.master_weights = false;
  ASSERT_TRUE(validate_plan(pure));
  const Estimate m = estimate(mixed);
  const Estimate q = estimate(pure);
  const double params = m.parameters;
  EXPECT_NEAR(m.memory.optimizer.value(), params * 12.0 / 8.0, 1e-6 * params);
  EXPECT_NEAR(q.memory.optimizer.value(), params * 4.0 / 8.0, 1e-6 * params);
  EXPECT_NEAR(m.memory.gradients.value(), params * 4.0 / 8.0, 1e-6 * params);
  EXPECT_NEAR(q.memory.gradients.value(), params * 2.0 / 8.0, 1e-6 * params);
  EXPECT_NEAR(m.run.checkpoint_bytes.value(), params * 12.0, 1e-6 * params);
  EXPECT_NEAR(q.run.checkpoint_bytes.value(), params * 6.0, 1e-6 * params);
  EXPECT_LT(q.time.optimizer.value(), m.time.optimizer.value());  // 14 bytes per parameter touched instead of 32
}

TEST(PureSixteenBit, OnlyWhereTheStackRunsIt) {
  Plan p = fsdp1_8b();
  p.training.master_weights = false;
  p.training.stack = Stack::kMegatronTe;
  const auto megatron = validate_plan(p);
  ASSERT_FALSE(megatron);
  EXPECT_NE(megatron.error().message.find("/training/master_weights"), std::string::npos);
  p.training.stack = Stack::kFsdp2;
  p.training.precision = Precision::kFp32;
  const auto fp32 = validate_plan(p);
  ASSERT_FALSE(fp32);
  EXPECT_NE(fp32.error().message.find("needs precision bf16 or fp16"), std::string::npos);
}

// An explicit mask: the kernel computes the whole 8192 x 8192 rectangle. FlashAttention-2 on an
// A100 at head size 128, 8K (Dao 2023, Fig. 4): 201 TFLOP/s without causal skipping, 182 with.
// Llama 3 8B, one sequence: the forward is 4 x 32 heads x 8192^2 x 128 = 1.0995e15 FLOPs full,
// half causal, the backward 2.5 times its forward; (1 + 2.5) x (1.0995e15 / 201e12 - 0.5498e15 /
// 182e12) = 8.574 ms more per layer. The mask itself, [1, 1, 8192, 8192] in bf16, is 128 MiB
// kept through the step.
TEST(AttentionMask, ExplicitComputesTheWholeRectangleAndKeepsTheMask) {
  const Plan plan = fsdp1_8b();
  const HardwareProfile& hw = plan.cluster;
  LayerSetting s;
  s.seq_len = 8192;
  s.stack = Stack::kFsdp1;
  s.sharded_gradients = true;  // ZeRO-3
  LayerSetting x = s;
  x.attention_mask = AttentionMask::kExplicit;
  const LayerCost causal = transformer_layer_cost(plan.model, hw, s);
  const LayerCost full = transformer_layer_cost(plan.model, hw, x);
  const double flops = 4.0 * 32 * 8192.0 * 8192.0 * 128;
  const double expected = 3.5 * (flops / 201e12 - 0.5 * flops / 182e12);
  EXPECT_NEAR(full.forward + full.backward - causal.forward - causal.backward, expected, 1e-4 * expected);
  EXPECT_NEAR(expected, 8.574e-3, 1e-6);
  const EndsCost causal_ends = ends_cost(plan.model, hw, s);
  const EndsCost full_ends = ends_cost(plan.model, hw, x);
  EXPECT_DOUBLE_EQ(full_ends.embedding_activation_bytes - causal_ends.embedding_activation_bytes, 8192.0 * 8192.0 * 2.0);
}

TEST(AttentionMask, ExplicitIsRefusedUnderContextParallelism) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 8, 8192, 64);
  p.parallel.cp = 2;
  p.parallel.dp = 4;
  p.training.attention_mask = AttentionMask::kExplicit;
  const auto valid = validate_plan(p);
  ASSERT_FALSE(valid);
  EXPECT_NE(valid.error().message.find("/training/attention_mask"), std::string::npos);
}

// The loss on fsdp1 swapped for a fused kernel (flash-attn's CrossEntropyLoss with
// inplace_backward): kept to the backward are the bf16 logits and an fp32 log-sum-exp per token,
// 8192 x 128256 x 2 + 8192 x 4 bytes, against the fp32 log-softmax's 8192 x 128256 x 4; beside
// them the output layer's input, 8192 x 4096 x 2, and what the final norm keeps, fsdp1's
// LlamaRMSNorm: its fp32 copy and the normalised bf16 tensor, 8192 x 4096 x (4 + 2).
TEST(LossKernel, APlansLossReplacesTheStacks) {
  const Plan plan = fsdp1_8b();
  LayerSetting s;
  s.seq_len = 8192;
  s.stack = Stack::kFsdp1;
  const double T = 8192, V = 128256, h = 4096;
  EXPECT_DOUBLE_EQ(ends_cost(plan.model, plan.cluster, s).head_activation_bytes, T * h * 6 + T * h * 2 + 4 * T * V);
  s.loss = LossKernel::kFused;
  EXPECT_DOUBLE_EQ(ends_cost(plan.model, plan.cluster, s).head_activation_bytes, T * h * 6 + T * h * 2 + 2 * T * V + 4 * T);
}

TEST(TrainingOptions, RoundTripThroughThePlanDocument) {
  Plan p = fsdp1_8b();
  p.training.loss = LossKernel::kChunkedFused;
  p.training.attention_mask = AttentionMask::kExplicit;
  p.training.master_weights = false;
  const nlohmann::json j = training_to_json(p.training);
  EXPECT_EQ(j.at("loss"), "chunked-linear");
  EXPECT_EQ(j.at("attention_mask"), "explicit");
  EXPECT_EQ(j.at("master_weights"), false);
  EXPECT_FALSE(training_to_json(fsdp1_8b().training).contains("loss"));  // defaults are not written
  auto parsed = parse_plan(plan_to_json(p), "round-trip.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->training.loss, LossKernel::kChunkedFused);
  EXPECT_EQ(parsed->training.attention_mask, AttentionMask::kExplicit);
  EXPECT_FALSE(parsed->training.master_weights);
  nlohmann::json bad = plan_to_json(p);
  bad["training"]["loss"] = "softmax";
  const auto refused = parse_plan(bad, "bad.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("loss"), std::string::npos);
}

// Megatron-LM and torchtitan build their own loss and keep fp32 masters: refused there.
// Accelerate runs the user's script: it takes the plan, and says where the loss goes.
TEST(TrainingOptions, ExportsRefuseWhatTheirStackCannotBeToldAndNoteTheScriptsPart) {
  Plan p = fsdp1_8b();
  p.training.master_weights = false;
  p.training.loss = LossKernel::kFused;
  const auto titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_FALSE(titan);
  EXPECT_NE(titan.error().message.find("master_weights=false"), std::string::npos);
  EXPECT_NE(titan.error().message.find("loss=fused"), std::string::npos);
  const auto accelerate = planner::export_plan(p, planner::ExportTarget::kAccelerate);
  ASSERT_TRUE(accelerate) << accelerate.error().message;
  bool loss_note = false, dtype_note = false;
  for (const std::string& note : accelerate->notes) {
    loss_note = loss_note || note.find("flash-attn's CrossEntropyLoss") != std::string::npos;
    dtype_note = dtype_note || note.find("torch_dtype=torch.bfloat16") != std::string::npos;
  }
  EXPECT_TRUE(loss_note);
  EXPECT_TRUE(dtype_note);
}

// fp8's scaling recipe (stack.hpp Fp8Recipe): Megatron-LM with Transformer Engine runs delayed
// scaling by default and current scaling with --fp8-recipe tensorwise (megatron/core/enums.py
// Fp8Recipe); torchtitan's float8 (torchao) and the executor scale by the current amax only. A
// plan states it; the Megatron export passes it on, the others refuse what they cannot run.
TEST(Fp8Recipe, APlanStatesItAndTheStacksThatCannotRunItSaySo) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 8, 8192, 64);
  p.training.stack = Stack::kMegatronTe;
  p.training.precision = Precision::kFp8;
  p.parallel.zero_stage = 1;
  ASSERT_TRUE(validate_plan(p));
  const Estimate delayed = estimate(p);
  p.training.fp8_recipe = Fp8Recipe::kCurrent;
  ASSERT_TRUE(validate_plan(p));
  EXPECT_GT(estimate(p).time.compute.value(), delayed.time.compute.value());  // an amax pass more per cast
  EXPECT_EQ(training_to_json(p.training).at("fp8_recipe"), "current");
  auto parsed = parse_plan(plan_to_json(p), "fp8.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->training.fp8_recipe, Fp8Recipe::kCurrent);
  const auto megatron = planner::export_plan(p, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(megatron) << megatron.error().message;
  EXPECT_NE(megatron->text.find("--fp8-recipe tensorwise"), std::string::npos);

  p.training.fp8_recipe = Fp8Recipe::kDelayed;
  const auto titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_FALSE(titan);
  EXPECT_NE(titan.error().message.find("fp8_recipe=delayed"), std::string::npos) << titan.error().message;
  p.training.stack = Stack::kFsdp2;
  p.parallel.zero_stage = 3;
  const auto refused = validate_plan(p);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/training/fp8_recipe"), std::string::npos) << refused.error().message;
  p.training.precision = Precision::kBf16;  // a recipe without fp8 changes nothing
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  p.training.precision = Precision::kFp8;
  nlohmann::json bad = plan_to_json(p);
  bad["training"]["fp8_recipe"] = "blockwise";
  const auto unknown = parse_plan(bad, "bad.json");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("fp8_recipe"), std::string::npos);
}

// torchao's fp8 all-gather under FSDP2 (Float8LinearConfig enable_fsdp_float8_all_gather with
// precompute_float8_dynamic_scale_for_fsdp; torchao float8/fsdp_utils.py): each linear layer's
// weight shard is cast to fp8 before the all-gather with a scale computed once a step, so what is
// gathered, and kept gathered under SHARD_GRAD_OP, is 1 byte per linear parameter instead of 2.
// Llama 3 8B's linear weights per layer: q and o 4096 x 4096, k and v 1024 x 4096, gate, up and
// down 14336 x 4096: 2 x 16,777,216 + 2 x 4,194,304 + 3 x 58,720,256 = 218,103,808; 32 layers
// keep 6,979,321,856 bytes less. The norms, the embedding and the output layer stay 16-bit.
TEST(Fp8AllGather, GatheredLinearWeightsTakeOneByte) {
  Plan p = sharded_8b(Stack::kFsdp2, Dtype::kFp32, "dgx-h100", 8192, 64);
  p.training.precision = Precision::kFp8;
  p.parallel.zero_stage = 2;  // reshard_after_forward=False: the gathered layers stay to backward
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  const Estimate bf16_gather = estimate(p);
  p.training.fp8_all_gather = true;
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  const Estimate fp8_gather = estimate(p);
  EXPECT_DOUBLE_EQ(bf16_gather.memory.weights.value() - fp8_gather.memory.weights.value(), 32.0 * 218103808.0);
  EXPECT_LT(fp8_gather.time.dp_comm_total.value(), bf16_gather.time.dp_comm_total.value());

  // Per layer, forward casts no gathered weight (torchao: amax 2 + cast 3 bytes a weight element
  // otherwise) and backward copies the fp8 weight into the other layout (read 1, write 1) instead
  // of casting the bf16 one (read 2, write 1): on each of the 7 linear layers at the stream rate.
  p.parallel.zero_stage = 3;
  LayerSetting s = layer_setting(p);
  ASSERT_TRUE(s.fp8_gathered_weights);
  const LayerCost with = transformer_layer_cost(p.model, p.cluster, s);
  s.fp8_gathered_weights = false;
  const LayerCost without = transformer_layer_cost(p.model, p.cluster, s);
  const KernelRates rates(p.cluster.gpu, Dtype::kBf16, AttentionImpl::kFlash2);
  double forward_casts = 0, backward_saved = 0;
  for (const double weights : {16777216.0, 4194304.0, 4194304.0, 16777216.0, 58720256.0, 58720256.0, 58720256.0}) {
    forward_casts += rates.stream(5.0 * weights);
    backward_saved += rates.stream(3.0 * weights) - rates.stream(2.0 * weights);
  }
  EXPECT_NEAR(without.forward - with.forward, forward_casts, 1e-12);
  EXPECT_NEAR(without.backward - with.backward, backward_saved, 1e-12);

  // Without parameters sharded over data-parallel ranks there is no fp8 all-gather: not at ZeRO-1,
  // and not under ZeRO-3 sharded over context-parallel ranks alone, where torchtitan turns it off
  // (components/quantization/float8.py at v0.2.2: parallel_dims.dp_shard_enabled).
  p.parallel.zero_stage = 1;
  EXPECT_FALSE(layer_setting(p).fp8_gathered_weights);
  p.parallel.zero_stage = 3;
  p.parallel.cp = 8;
  p.parallel.dp = 1;
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  EXPECT_FALSE(layer_setting(p).fp8_gathered_weights);
}

TEST(Fp8AllGather, OnlyInFp8UnderFsdp2AndExportedToTorchtitan) {
  Plan p = sharded_8b(Stack::kFsdp2Compile, Dtype::kFp32, "dgx-h100", 8192, 64);
  p.training.precision = Precision::kFp8;
  p.training.fp8_all_gather = true;
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  EXPECT_EQ(training_to_json(p.training).at("fp8_all_gather"), true);
  auto parsed = parse_plan(plan_to_json(p), "fp8-gather.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_TRUE(parsed->training.fp8_all_gather);
  // torchtitan v0.2.2 components/quantization/float8.py asserts that recipe_name is not set beside
  // the fp8 all-gather; without it torchao's Float8LinearConfig is tensorwise. Selective recompute
  // is its per-operator policy, the one the fsdp2 stacks price.
  p.parallel.recompute = Recompute::kSelective;
  const auto titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_NE(titan->text.find("enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\n"), std::string::npos)
      << titan->text;
  EXPECT_EQ(titan->text.find("recipe_name ="), std::string::npos);
  EXPECT_NE(titan->text.find("mode = \"selective\"\n# Per operator: the outputs of attention and of every other matmul kept, the rest recomputed "
                             "in backward\nselective_ac_option = \"op\"\n"),
            std::string::npos)
      << titan->text;
  const auto megatron = planner::export_plan(p, planner::ExportTarget::kMegatron);
  ASSERT_FALSE(megatron);
  EXPECT_NE(megatron.error().message.find("fp8_all_gather=true"), std::string::npos) << megatron.error().message;

  const auto refused = [&](const Plan& bad, const char* what) {
    const auto r = validate_plan(bad);
    ASSERT_FALSE(r) << what;
    EXPECT_NE(r.error().message.find("/training/fp8_all_gather"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  };
  Plan bf16 = p;
  bf16.training.precision = Precision::kBf16;
  refused(bf16, "needs precision fp8");
  Plan fsdp1 = p;
  fsdp1.training.stack = Stack::kFsdp1;
  fsdp1.parallel.reduce_dtype = Dtype::kBf16;
  refused(fsdp1, "fsdp1 stack all-gathers 16-bit parameters");
  Plan delayed = p;
  delayed.training.stack = Stack::kMegatronTe;
  refused(delayed, "megatron-te stack all-gathers 16-bit parameters");
  Plan moe = testing::make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 64);
  moe.training.stack = Stack::kFsdp2;
  moe.training.precision = Precision::kFp8;
  moe.training.fp8_all_gather = true;
  moe.parallel.zero_stage = 3;
  moe.parallel.reduce_dtype = Dtype::kFp32;
  refused(moe, "grouped experts");
  Plan lora = p;
  lora.training.mode = TrainingMode::kLora;
  refused(lora, "trains adapters");
  nlohmann::json bad = plan_to_json(p);
  bad["training"]["fp8_all_gather"] = "yes";
  const auto unparsed = parse_plan(bad, "bad.json");
  ASSERT_FALSE(unparsed);
  EXPECT_NE(unparsed.error().message.find("fp8_all_gather"), std::string::npos) << unparsed.error().message;
}

// PyTorch's expandable segments (plan.hpp Allocator; c10/cuda/CUDACachingAllocator.cpp, the note
// above struct ExpandableSegment): one segment per stream grows by 20 MiB pages, and a request
// that finds no memory unmaps every empty page first. Llama 3 8B at 32K tokens under FSDP2 on 8
// H100 (full recompute, micro-batch 1): the default allocator keeps the idle blocks of the loss
// (the fp32 logits alone are 32768 x 128256 x 4 bytes = 15.66 GiB) beside what is allocated and
// does not fit in 80 GiB; with expandable segments what is allocated fits, and the reserve beyond
// it is the part-used last page of three streams' segments (compute, all-gather, reduce-scatter):
// 3 x 20 MiB. Time does not change. Without ZeRO-3 only the compute stream's page is counted.
// FSDP2 on H100 with torchtitan's fp32 reduce-scatter.
Plan fsdp2_8b(long long seq, long long global_batch) { return sharded_8b(Stack::kFsdp2, Dtype::kFp32, "dgx-h100", seq, global_batch); }

TEST(Allocator, ExpandableSegmentsNeedWhatIsAllocatedAndAPagePerStream) {
  Plan p = fsdp2_8b(32768, 8);
  p.parallel.recompute = Recompute::kFull;
  ASSERT_TRUE(validate_plan(p)) << validate_plan(p).error().message;
  const Estimate caching = estimate(p);
  p.training.allocator = Allocator::kExpandableSegments;
  const Estimate expandable = estimate(p);
  const double mib = 1048576.0, gib = 1024.0 * mib;
  EXPECT_DOUBLE_EQ(expandable.memory.total.value(), caching.memory.total.value());
  EXPECT_DOUBLE_EQ(expandable.memory.reserved.value() - expandable.memory.total.value(), 3 * 20 * mib);
  EXPECT_GT(caching.memory.reserved.value() - caching.memory.total.value(), 32768.0 * 128256 * 4 / 2);  // at least half the fp32 logits idle
  EXPECT_FALSE(caching.fits) << caching.memory.required.value() / gib << " GiB";
  EXPECT_TRUE(expandable.fits) << expandable.memory.required.value() / gib << " GiB";
  // It fits only by giving the idle blocks' pages back each step: tight, and the reason says so.
  EXPECT_DOUBLE_EQ(expandable.memory.idle_cache.value(), caching.memory.reserved.value() - expandable.memory.reserved.value());
  EXPECT_TRUE(expandable.tight);
  ASSERT_FALSE(expandable.reasons.empty());
  EXPECT_NE(expandable.reasons.front().find("with expandable segments, which unmap idle pages each step"), std::string::npos)
      << expandable.reasons.front();
  EXPECT_LT(expandable.memory.required.value(), 80 * gib);
  EXPECT_GT(caching.memory.required.value(), 80 * gib);
  EXPECT_DOUBLE_EQ(expandable.time.step.value(), caching.time.step.value());

  Plan ddp = testing::make_plan("llama3.2-1b", "dgx-h100", 8, 4096, 64);
  ddp.training.stack = Stack::kPytorchEager;
  ddp.parallel.micro_batch = 1;
  ddp.training.allocator = Allocator::kExpandableSegments;
  ASSERT_TRUE(validate_plan(ddp)) << validate_plan(ddp).error().message;
  const Estimate e = estimate(ddp);
  EXPECT_DOUBLE_EQ(e.memory.reserved.value() - e.memory.total.value(), 20 * mib);
  EXPECT_FALSE(e.tight);  // room for the idle blocks too
}

// The plan key training.allocator: written where it is not PyTorch's default, read back, and a
// value PyTorch has not refused with the field named.
TEST(Allocator, ThePlanKeyRoundTripsAndAnUnknownOneIsNamed) {
  Plan p = fsdp1_8b();
  EXPECT_FALSE(training_to_json(p.training).contains("allocator"));
  p.training.allocator = Allocator::kExpandableSegments;
  EXPECT_EQ(training_to_json(p.training).at("allocator"), "expandable-segments");
  auto parsed = parse_plan(plan_to_json(p), "alloc.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->training.allocator, Allocator::kExpandableSegments);
  nlohmann::json bad = plan_to_json(p);
  bad["training"]["allocator"] = "cudaMallocAsync";
  const auto refused = parse_plan(bad, "bad.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/training/allocator"), std::string::npos) << refused.error().message;
  EXPECT_STREQ(allocator_conf(Allocator::kExpandableSegments), "expandable_segments:True");
  EXPECT_STREQ(allocator_conf(Allocator::kCaching), "");
  // What a PYTORCH_ALLOC_CONF value runs (PyTorch's tokenizer takes spaces around the colon).
  EXPECT_EQ(allocator_of_conf("expandable_segments:True"), Allocator::kExpandableSegments);
  EXPECT_EQ(allocator_of_conf("max_split_size_mb:128,expandable_segments : True"), Allocator::kExpandableSegments);
  EXPECT_EQ(allocator_of_conf("expandable_segments:False"), Allocator::kCaching);
  EXPECT_EQ(allocator_of_conf("max_split_size_mb:128"), Allocator::kCaching);
  EXPECT_EQ(allocator_of_conf(""), Allocator::kCaching);
}

// Each export's launch line sets the allocator the plan was priced with (PYTORCH_ALLOC_CONF for
// PyTorch 2.9 on, PYTORCH_CUDA_ALLOC_CONF before it). torchtitan's run_train.sh sets expandable
// segments itself (run_train.sh at v0.2.2: PYTORCH_ALLOC_CONF="expandable_segments:True"), so a
// one-node plan with the default allocator is started by torchrun instead.
TEST(Allocator, ExportsLaunchWithThePlansAllocator) {
  Plan p = fsdp2_8b(8192, 64);
  const auto contains = [](const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; };
  const std::string env = "PYTORCH_ALLOC_CONF=expandable_segments:True PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ";
  auto titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, "# Run: torchrun --standalone --nproc-per-node 8 -m torchtitan.train")) << titan->text;
  EXPECT_FALSE(contains(titan->text, "# Run: CONFIG_FILE")) << titan->text;
  auto accelerate = planner::export_plan(p, planner::ExportTarget::kAccelerate);
  ASSERT_TRUE(accelerate) << accelerate.error().message;
  EXPECT_FALSE(contains(accelerate->text, "ALLOC_CONF")) << accelerate->text;

  p.training.allocator = Allocator::kExpandableSegments;
  titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan->text;
  EXPECT_TRUE(contains(titan->text, "# Run: CONFIG_FILE=THIS_FILE NGPU=8 ./run_train.sh")) << titan->text;
  accelerate = planner::export_plan(p, planner::ExportTarget::kAccelerate);
  ASSERT_TRUE(accelerate) << accelerate.error().message;
  EXPECT_TRUE(contains(accelerate->text, "# Run: " + env + "accelerate launch")) << accelerate->text;
  auto deepspeed = planner::export_plan(p, planner::ExportTarget::kDeepspeed);
  ASSERT_TRUE(deepspeed) << deepspeed.error().message;
  bool noted = false;
  for (const std::string& note : deepspeed->notes) noted = noted || contains(note, env + "deepspeed --num_nodes 1");
  EXPECT_TRUE(noted);
  p.gpus = 16;
  p.parallel.dp = 16;
  titan = planner::export_plan(p, planner::ExportTarget::kTorchtitan);
  ASSERT_TRUE(titan) << titan.error().message;
  EXPECT_TRUE(contains(titan->text, "nodes: " + env + "torchrun --nnodes 2")) << titan->text;
  // LitGPT's multi-node line (a plan its pretrain recipe runs: tests/data/export).
  auto lit = load_plan_file(testing::source_path("tests/data/export/llama3-8b-pretrain-hybrid16.plan.json"));
  ASSERT_TRUE(lit) << lit.error().message;
  PlanRequest lit_request = std::move(lit).value();
  lit_request.training.allocator = Allocator::kExpandableSegments;
  const auto lit_plan = plan_with_defaults(lit_request);
  ASSERT_TRUE(lit_plan) << lit_plan.error().message;
  const auto litgpt = planner::export_plan(*lit_plan, planner::ExportTarget::kLitgpt);
  ASSERT_TRUE(litgpt) << litgpt.error().message;
  EXPECT_TRUE(contains(litgpt->text, "#   " + env + "litgpt pretrain --config THIS_FILE")) << litgpt->text;
  // DeepSpeed across nodes: through ~/.deepspeed_env, as its runner passes no other variable on.
  deepspeed = planner::export_plan(p, planner::ExportTarget::kDeepspeed);
  ASSERT_TRUE(deepspeed) << deepspeed.error().message;
  noted = false;
  for (const std::string& note : deepspeed->notes) {
    noted = noted || (contains(note, ": deepspeed --num_nodes 2") && contains(note, "PYTORCH_ALLOC_CONF=expandable_segments:True and "
                                                                                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in ~/.deepspeed_env"));
  }
  EXPECT_TRUE(noted);
  p.training.stack = Stack::kMegatronTe;
  p.parallel.zero_stage = 1;
  const auto megatron = planner::export_plan(p, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(megatron) << megatron.error().message;
  EXPECT_TRUE(contains(megatron->text, "\nexport PYTORCH_ALLOC_CONF=expandable_segments:True PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"))
      << megatron->text;
}

// Megatron-Core's --cp-comm-type: p2p passes K/V round a ring, overlapped with the blocks'
// attention; all_gather (Llama 3, Dubey et al. 2024, Sec. 3.3.2) gathers them first and
// reduce-scatters their gradients after, exposed. A plan states it; the stack's is the default.
TEST(CpCommType, APlanChoosesHowContextParallelismMovesKeysAndValues) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 8, 32768, 8);
  p.training.stack = Stack::kMegatronTe;
  p.parallel.tp = 2;
  p.parallel.cp = 4;
  p.parallel.dp = 1;
  p.parallel.sequence_parallel = true;
  p.parallel.zero_stage = 1;
  ASSERT_TRUE(validate_plan(p));
  const Estimate ring = estimate(p);
  p.parallel.cp_comm = ContextAttention::kAllGatherKv;
  const Estimate gathered = estimate(p);
  EXPECT_GT(gathered.time.cp_comm.value(), ring.time.cp_comm.value());
  EXPECT_EQ(parallel_to_json(p.parallel).at("cp_comm_type"), "all_gather");
  auto parsed = parse_plan(plan_to_json(p), "cp.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->parallel.cp_comm, ContextAttention::kAllGatherKv);
  const auto megatron = planner::export_plan(p, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(megatron) << megatron.error().message;
  EXPECT_NE(megatron->text.find("--cp-comm-type all_gather"), std::string::npos);
  EXPECT_FALSE(parallel_to_json(ParallelConfig{}).contains("cp_comm_type"));  // the stack's: not written
  // The executor all-gathers (executor/src/parallel/context_parallel.hpp): a ring is one thing it cannot run.
  const auto said = [](const std::vector<std::string>& problems) {
    return std::any_of(problems.begin(), problems.end(), [](const std::string& s) { return s.find("cp_comm_type p2p") != std::string::npos; });
  };
  EXPECT_FALSE(said(planner::executor_limitations(p)));
  p.parallel.cp_comm = ContextAttention::kRing;
  EXPECT_TRUE(said(planner::executor_limitations(p)));
}

}  // namespace
}  // namespace trainplan
