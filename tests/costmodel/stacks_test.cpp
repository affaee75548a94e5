// The FSDP and DeepSpeed stacks (stack.hpp: fsdp1, fsdp2, deepspeed): FlashAttention-2's
// published rates (attention_kernels.cpp), and what each stack's data parallelism adds beyond the
// collectives (DataParallelSpec), each against a value derived by hand from the stack's source as
// stack.cpp cites it.

#include <cmath>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

// Dao 2023, Fig. 4 (A100, forward + backward, causal, head size 128): 182 TFLOP/s at 8K, 189 at
// 16K and beyond. Shah et al. 2024, Fig. 5 and 6 (H100, FlashAttention-2): 333 forward causal at
// 8K; the causal backward is the non-causal 318 times 333/370. Head size 96 lies between 64 and
// 128 in log2: 0.585 of the way. No published rate on Blackwell.
TEST(Flash2Rates, AreThePapersFigures) {
  EXPECT_DOUBLE_EQ(*flash2_rate(1, 128, 8192, true, false), 182e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(1, 128, 8192, true, true), 182e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(1, 128, 131072, true, false), 189e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(2, 128, 8192, true, false), 333e12);
  EXPECT_NEAR(*flash2_rate(2, 128, 8192, true, true), 318e12 * 333.0 / 370.0, 1e6);
  EXPECT_DOUBLE_EQ(*flash2_rate(2, 128, 8192, false, true), 318e12);
  const double f = std::log2(96.0 / 64.0);
  EXPECT_NEAR(*flash2_rate(2, 96, 8192, true, false), (295 + f * (333 - 295)) * 1e12, 1e6);
  EXPECT_FALSE(flash2_rate(3, 128, 8192, true, false));
}

// On the H100 preset the profile's attention table is torch 2.11's SDPA (cuDNN): 625 TFLOP/s
// forward at hd128, 8K, 32 heads x batch 2. FlashAttention-2 runs the same causal forward of
// 4 x 64 x 8192^2 x 128 / 2 FLOPs at 333 TFLOP/s.
TEST(Flash2Rates, ReplaceTheProfilesTableWhereTheStackRunsFlashAttention2) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const KernelRates profile(hw.gpu, Dtype::kBf16);
  const KernelRates flash2(hw.gpu, Dtype::kBf16, AttentionImpl::kFlash2);
  const double flops = 4.0 * 64 * 8192.0 * 8192.0 * 128 / 2;
  EXPECT_NEAR(flash2.attention_forward(64, 8192, 8192, 128, true), flash2.latency() + flops / 333e12, 1e-12);
  EXPECT_GT(flash2.attention_forward(64, 8192, 8192, 128, true), 1.7 * profile.attention_forward(64, 8192, 8192, 128, true));
  // Blackwell has no published FlashAttention-2 rate: the profile's figures stand.
  const HardwareProfile b200 = testing::cluster("dgx-b200");
  EXPECT_DOUBLE_EQ(KernelRates(b200.gpu, Dtype::kBf16, AttentionImpl::kFlash2).attention_forward(64, 8192, 8192, 128, true),
                   KernelRates(b200.gpu, Dtype::kBf16).attention_forward(64, 8192, 8192, 128, true));
}

// Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608v2), Fig. 5 and 6, FlashAttention-3 bars on
// H100 SXM5 in bf16: 602 TFLOP/s forward causal at hd128, 8K (646 non-causal); backward 559
// non-causal, the causal backward taken as 559 x 602 / 646; 460 forward causal at hd64, 8K; the
// 16K rates beyond. Hopper only.
TEST(Flash3Rates, AreThePapersFigures) {
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 128, 8192, true, false), 602e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 128, 8192, false, false), 646e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 128, 8192, false, true), 559e12);
  EXPECT_NEAR(*flash3_rate(2, 128, 8192, true, true), 559e12 * 602.0 / 646.0, 1e6);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 64, 8192, true, false), 460e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 128, 131072, true, false), 616e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 128, 512, false, false), 467e12);
  EXPECT_FALSE(flash3_rate(1, 128, 8192, true, false));  // Ampere
  EXPECT_FALSE(flash3_rate(3, 128, 8192, true, false));  // Blackwell
}

// Fig. 5's head-size-256 forward panels (H100, bf16), 8K: FlashAttention-3 628 causal and 746 not,
// FlashAttention-2 297 and 324. Head size 192 (MLA's query-key size) lies 0.585 of the way from
// 128 to 256 in log2. No backward is published at 256: above 128 the backward keeps
// 128's rate.
TEST(Flash3Rates, HeadSize256ForwardIsPublished) {
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 256, 8192, true, false), 628e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 256, 8192, false, false), 746e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(2, 256, 8192, true, false), 297e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(2, 256, 8192, false, false), 324e12);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 512, 16384, false, false), 756e12);  // clamped at 256
  const double f = std::log2(192.0 / 128.0);
  EXPECT_NEAR(*flash3_rate(2, 192, 8192, true, false), (602 + f * (628 - 602)) * 1e12, 1e6);
  EXPECT_DOUBLE_EQ(*flash3_rate(2, 256, 8192, false, true), 559e12);
  EXPECT_DOUBLE_EQ(*flash2_rate(2, 256, 8192, false, true), 318e12);
  // A100 (Dao 2023, Fig. 4): 64 and 128 only; 256 takes 128's rate.
  EXPECT_DOUBLE_EQ(*flash2_rate(1, 256, 8192, true, false), 182e12);
}

// A plan states the kernel its script runs (training.attention_kernel): FlashAttention-3 under the
// fsdp2 stack, against FlashAttention-2 stated the same way (the stack's own is SDPA's cuDNN), runs Llama 3 8B's causal attention (32 heads, hd128)
// at 8K on one H100 at 602 TFLOP/s forward where FlashAttention-2 runs 333: the attention time
// of each pass shrinks by its ratio and nothing else moves. Refused off Hopper, in fp32, with a mask tensor, with dropout (it has none), under PyTorch's
// context parallelism (which splits SDPA calls) and beside materialised scores.
TEST(Flash3Rates, APlanThatRunsFlashAttention3) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 1, 8192, 1);
  p.training.stack = Stack::kFsdp2;
  p.parallel.micro_batch = 1;
  p.parallel.recompute = Recompute::kFull;
  p.training.attention_kernel = AttentionImpl::kFlash2;  // fsdp2's own is SDPA's cuDNN (torchtitan v0.2.2)
  const Estimate fa2 = testing::checked_estimate(p);
  p.training.attention_kernel = AttentionImpl::kFlash3;
  const Estimate fa3 = testing::checked_estimate(p);
  const double heads = 32, s = 8192, d = 128, layers = 32;
  const double forward_flops = 4.0 * heads * s * s * d / 2;
  const double backward_flops = 2.5 * forward_flops;
  // Forward, its recompute (full recompute) and backward; FlashAttention-2's causal backward at 8K
  // is 318 x 333 / 370 (attention_kernels.cpp).
  const double saved = layers * (2 * (forward_flops / 333e12 - forward_flops / 602e12) + backward_flops / (318e12 * 333.0 / 370.0) -
                                 backward_flops / (559e12 * 602.0 / 646.0));
  EXPECT_NEAR((fa2.time.compute + fa2.time.recompute).value() - (fa3.time.compute + fa3.time.recompute).value(), saved, 1e-3 * saved);
  EXPECT_EQ(training_to_json(p.training).at("attention_kernel"), "flash3");
  auto parsed = parse_plan(plan_to_json(p), "fa3.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->training.attention_kernel, AttentionImpl::kFlash3);
  // The executor runs SDPA with PyTorch's backend choice: it says it cannot run this plan as stated.
  bool said = false;
  for (const auto& why : executor::executor_limitations(p)) said = said || why.find("attention_kernel flash3") != std::string::npos;
  EXPECT_TRUE(said);

  Plan a100 = p;
  a100.cluster = testing::cluster("dgx-a100-80g");
  const auto ampere = validate_plan(a100);
  ASSERT_FALSE(ampere);
  EXPECT_NE(ampere.error().message.find("/training/attention_kernel: flash3 (FlashAttention-3) runs on Hopper GPUs only"), std::string::npos)
      << ampere.error().message;
  Plan fp32 = p;
  fp32.training.precision = Precision::kFp32;
  EXPECT_FALSE(validate_plan(fp32));
  Plan masked = p;
  masked.training.attention_mask = AttentionMask::kExplicit;
  EXPECT_FALSE(validate_plan(masked));
  Plan dropout = p;
  dropout.training.dropout = true;
  const auto no_dropout = validate_plan(dropout);
  ASSERT_FALSE(no_dropout);
  EXPECT_NE(no_dropout.error().message.find("flash3 (FlashAttention-3) has no attention dropout"), std::string::npos) << no_dropout.error().message;
  Plan split = testing::make_plan("llama3-8b", "dgx-h100", 2, 8192, 1);
  split.training.stack = Stack::kFsdp2;
  split.training.attention_kernel = AttentionImpl::kFlash3;
  split.parallel.dp = 1;
  split.parallel.cp = 2;
  const auto no_cp = validate_plan(split);
  ASSERT_FALSE(no_cp);
  EXPECT_NE(no_cp.error().message.find("does not run under the fsdp2 stack's context parallelism"), std::string::npos) << no_cp.error().message;
  split.training.stack = Stack::kMegatronTe;
  EXPECT_TRUE(validate_plan(split)) << validate_plan(split).error().message;
  Plan scores = p;
  scores.training.attention = AttentionKernel::kStandard;
  const auto standard = validate_plan(scores);
  ASSERT_FALSE(standard);
  EXPECT_NE(standard.error().message.find("/training/attention_kernel"), std::string::npos) << standard.error().message;
  nlohmann::json bad = plan_to_json(p);
  bad["training"]["attention_kernel"] = "flash4";
  const auto unknown = parse_plan(bad, "bad.json");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("must be stack | profile | flash2 | flash3"), std::string::npos) << unknown.error().message;
}

Plan sharded(Stack stack, int zero, long long global_batch) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, global_batch);
  p.training.stack = stack;
  p.parallel.zero_stage = zero;
  p.parallel.micro_batch = 1;
  p.parallel.recompute = Recompute::kFull;
  p.parallel.reduce_dtype = stack_spec(stack).reduce_dtype;
  return p;
}

// DeepSpeed keeps one ipg bucket of reduce_bucket_size = 5e8 elements in the compute dtype
// (stage_1_and_2.py, overlap_comm off below stage 3): 1e9 bytes, where DDP keeps two 25 MiB
// buckets. Everything else in the buffers (cuBLAS workspaces) is the same.
TEST(DeepspeedStack, KeepsAGigabyteGradientBucket) {
  const Estimate ds = testing::checked_estimate(sharded(Stack::kDeepspeed, 2, 8));
  const Estimate eager = testing::checked_estimate(sharded(Stack::kPytorchEager, 2, 8));
  EXPECT_NEAR(ds.memory.buffers.value() - eager.memory.buffers.value(), 5e8 * 2 - 2 * 25 * 1048576.0, 1.0);
}

// DeepSpeed's ZeRO-2 all-reduces its buckets after every micro-batch and does not overlap them
// (overlap_comm is off below stage 3), then gathers the updated parameters once in its step: the
// traffic of m micro-batches is m reductions plus one gather, all of it exposed, so going from 2
// to 4 micro-batches adds twice what going from 1 to 2 adds.
TEST(DeepspeedStack, Zero2ReducesEveryMicroBatchExposed) {
  const Estimate one = testing::checked_estimate(sharded(Stack::kDeepspeed, 2, 8));
  const Estimate two = testing::checked_estimate(sharded(Stack::kDeepspeed, 2, 16));
  const Estimate four = testing::checked_estimate(sharded(Stack::kDeepspeed, 2, 32));
  ASSERT_EQ(four.micro_batches, 4);
  const double reduction = two.time.dp_comm_total.value() - one.time.dp_comm_total.value();
  EXPECT_GT(reduction, 0);
  EXPECT_NEAR(four.time.dp_comm_total.value() - two.time.dp_comm_total.value(), 2 * reduction, 1e-9);
  EXPECT_NEAR(four.time.dp_comm_exposed.value(), four.time.dp_comm_total.value(), 1e-9);
  // ZeRO-1 reduces once per step.
  const Estimate z1_one = testing::checked_estimate(sharded(Stack::kDeepspeed, 1, 8));
  const Estimate z1_four = testing::checked_estimate(sharded(Stack::kDeepspeed, 1, 32));
  EXPECT_NEAR(z1_four.time.dp_comm_total.value(), z1_one.time.dp_comm_total.value(), 1e-9);
}

// DeepSpeed at ZeRO stage 0 in bf16 runs its BF16_Optimizer (engine.py get_data_types and
// _do_optimizer_sanity_check; bf16_optimizer.py): the optimizer states are partitioned over the
// data-parallel ranks as under ZeRO-1, the bf16 gradients stay whole beside an unsharded fp32
// buffer (6 bytes per parameter), its all-reduce and the parameters' all-gather are ZeRO-1's,
// and while the buffer is all-reduced a bf16 copy of it is alive (2 bytes per parameter, after
// the activations are freed). Llama 3 8B on 8 GPUs: 2 + 6 + 12 / 8 bytes per parameter.
TEST(DeepspeedStack, Zero0InBf16IsTheBf16OptimizerWithAnFp32GradientBuffer) {
  const Estimate z0 = testing::checked_estimate(sharded(Stack::kDeepspeed, 0, 8));
  const Estimate z1 = testing::checked_estimate(sharded(Stack::kDeepspeed, 1, 8));
  const double params = z0.parameters;
  EXPECT_NEAR(z0.memory.weights.value(), 2.0 * params, 1.0);
  EXPECT_NEAR(z0.memory.gradients.value(), 6.0 * params, 1.0);
  EXPECT_NEAR(z0.memory.optimizer.value(), 12.0 * params / 8, 1.0);
  EXPECT_NEAR(z0.memory.optimizer.value(), z1.memory.optimizer.value(), 1.0);
  EXPECT_NEAR(z0.time.dp_comm_total.value(), z1.time.dp_comm_total.value(), 1e-9);
  // No ipg bucket: the reduction's temporary is the bf16 copy of the whole buffer, larger than
  // the activations at micro-batch 1 with full recompute.
  const double states = z0.memory.weights.value() + z0.memory.gradients.value() + z0.memory.optimizer.value() + z0.memory.buffers.value();
  ASSERT_LT(z0.memory.activations.value(), 2.0 * params);
  EXPECT_NEAR(z0.memory.total.value(), states + 2.0 * params, 1.0);
  EXPECT_LT(z0.memory.buffers.value(), z1.memory.buffers.value() - 0.9e9);
  // Each micro-batch adds its bf16 gradient into the fp32 buffer: slower than ZeRO-1.
  EXPECT_GT(z0.time.step.value(), z1.time.step.value());
  // The reduction's copies once per step, 3 launches each micro-batch's share: the buffer cast to
  // bf16 (4 + 2 bytes), averaged (2 + 2), copied back (2 + 4): 16 bytes per parameter.
  Plan plan = sharded(Stack::kDeepspeed, 0, 8);
  const KernelRates rates(plan.cluster.gpu, Dtype::kBf16);
  const int m = z0.micro_batches;
  EXPECT_NEAR(z0.time.dp_copies.value(), 3.0 * m * rates.latency() + 16.0 * params / rates.copy_bandwidth(), 1e-9);
  // Reduced in fp32 (communication_data_type fp32): no 16-bit copy, only the average in place
  // (8 bytes per parameter), and no transient beyond the activations.
  plan.parallel.reduce_dtype = Dtype::kFp32;
  const Estimate fp32 = testing::checked_estimate(plan);
  EXPECT_NEAR(fp32.time.dp_copies.value(), 3.0 * m * rates.latency() + 8.0 * params / rates.copy_bandwidth(), 1e-9);
  const double fp32_states = fp32.memory.weights.value() + fp32.memory.gradients.value() + fp32.memory.optimizer.value() + fp32.memory.buffers.value();
  EXPECT_NEAR(fp32.memory.total.value(), fp32_states + fp32.memory.activations.value(), 1.0);
  // The step's norm and zeroing run over the whole fp32 buffer (8 bytes per parameter, 2
  // launches), not over the partition as the update does.
  EXPECT_NEAR(z0.time.optimizer.value() - z1.time.optimizer.value(), 2.0 * rates.latency() + 8.0 * params / rates.copy_bandwidth(),
              0.02 * z0.time.optimizer.value());
  // Plain data parallelism where DeepSpeed runs no BF16_Optimizer: fp16 (FP16_Optimizer), and
  // v0.3.16, which had no bf16 mode.
  Plan fp16 = sharded(Stack::kDeepspeed, 0, 8);
  fp16.training.precision = Precision::kFp16;
  EXPECT_NEAR(testing::checked_estimate(fp16).memory.optimizer.value(), 12.0 * params, 1.0);
  EXPECT_NEAR(testing::checked_estimate(sharded(Stack::kDeepspeedV03, 0, 8)).memory.optimizer.value(), 12.0 * params, 1.0);
  // DeepSpeed offloads the optimizer through ZeRO only (ZeRO-Offload): refused at stage 0.
  Plan offload = sharded(Stack::kDeepspeed, 0, 8);
  offload.parallel.offload_optimizer = Offload::kCpu;
  const auto refused = validate_plan(offload);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/parallel/offload_optimizer: the deepspeed stack offloads the optimizer through ZeRO"), std::string::npos)
      << refused.error().message;
  offload.parallel.zero_stage = 1;
  EXPECT_TRUE(validate_plan(offload));
}

// Megatron's step outside the optimizer's shard: zero_grad_buffer zeroes the whole main-grad
// buffer every iteration (grad_data.zero_(), one launch; its shard only under Megatron FSDP's
// optim_grads). The buffer is in the reduce dtype: fp32 (4 bytes) unless the gradients are
// reduced in bf16 (--grad-reduce-in-bf16: 2 bytes, and the optimizer copies its shard to fp32
// first, .float(): 2 read + 4 written). In fp16 the optimizer unscales the fp32 main grads of its
// shard and checks them for inf (_amp_foreach_non_finite_check_and_unscale_: 8 bytes, one launch).
// NVIDIA/Megatron-LM d98e8a64dd training.py train_step, core/distributed/param_and_grad_buffer.py
// reset, core/optimizer/distrib_optimizer.py and optimizer.py, arguments.py.
TEST(MegatronStack, ZeroesTheWholeGradientBufferAndUnscalesInFp16) {
  const Plan z1 = sharded(Stack::kMegatronTe, 1, 8);
  ASSERT_EQ(z1.parallel.reduce_dtype, Dtype::kFp32);
  const KernelRates rates(z1.cluster.gpu, Dtype::kBf16);
  const Estimate bf16 = testing::checked_estimate(z1);
  const double params = bf16.parameters;
  EXPECT_NEAR(bf16.memory.gradients.value(), 4.0 * params, 1.0);
  Plan fp16_plan = z1;
  fp16_plan.training.precision = Precision::kFp16;
  const Estimate fp16 = testing::checked_estimate(fp16_plan);
  EXPECT_NEAR(fp16.time.optimizer.value() - bf16.time.optimizer.value(), rates.latency() + 8.0 * params / 8 / rates.copy_bandwidth(), 1e-9);
  // Under optim_grads (ZeRO-2) the buffer is sharded like the optimizer: the zeroing moves 1/8.
  const Estimate z2 = testing::checked_estimate(sharded(Stack::kMegatronTe, 2, 8));
  EXPECT_NEAR(bf16.time.optimizer.value() - z2.time.optimizer.value(), 4.0 * params * (1.0 - 1.0 / 8) / rates.copy_bandwidth(), 1e-9);
  // Reduced in bf16: a 2-byte buffer, zeroed whole (2 bytes less per parameter), and its shard
  // copied to fp32 for the step (6 bytes per parameter of the shard, one launch).
  Plan bf16_reduce = z1;
  bf16_reduce.parallel.reduce_dtype = Dtype::kBf16;
  const Estimate half = testing::checked_estimate(bf16_reduce);
  EXPECT_NEAR(half.memory.gradients.value(), 2.0 * params, 1.0);
  EXPECT_NEAR(half.time.optimizer.value() - bf16.time.optimizer.value(),
              rates.latency() + 6.0 * params / 8 / rates.copy_bandwidth() - 2.0 * params / rates.copy_bandwidth(), 1e-9);
  // The PyTorch stacks' GradScaler runs the same unscale over the fp32 gradients; their
  // gradients are freed, not zeroed.
  const Plan eager = sharded(Stack::kPytorchEager, 1, 8);
  Plan eager_fp16 = eager;
  eager_fp16.training.precision = Precision::kFp16;
  EXPECT_NEAR(testing::checked_estimate(eager_fp16).time.optimizer.value() - testing::checked_estimate(eager).time.optimizer.value(),
              rates.latency() + 8.0 * params / 8 / rates.copy_bandwidth(), 1e-9);
}

// The optimizer's shard of the expert parameters is over their own data-parallel group (dp / ep),
// as their states are in memory: Mixtral on 16 GPUs with ep 8 under ZeRO-1 updates an eighth of
// each expert where the dense parameters are split 16 ways.
TEST(OptimizerStep, ShardsExpertParametersOverTheirOwnGroup) {
  Plan plan = testing::make_plan("mixtral-8x7b", "dgx-h100", 16, 4096, 16);
  plan.parallel.ep = 8;
  plan.parallel.zero_stage = 1;
  plan.parallel.micro_batch = 1;
  plan.parallel.recompute = Recompute::kFull;
  plan.training.stack = Stack::kMegatronTe;
  plan.parallel.reduce_dtype = Dtype::kFp32;
  const Estimate e = testing::checked_estimate(plan);
  const ParameterCounts pc = count_parameters(plan.model);
  const double experts = plan.model.layers * pc.routed_experts;
  const double dense = e.parameters - experts;
  // States: 12 bytes per parameter of each shard.
  EXPECT_NEAR(e.memory.optimizer.value(), 12.0 * (dense / 16 + experts / 8 / 2), 1e-3 * e.memory.optimizer.value());
  // fp16's unscale moves 8 bytes per parameter of the same shards.
  Plan fp16 = plan;
  fp16.training.precision = Precision::kFp16;
  const KernelRates rates(plan.cluster.gpu, Dtype::kBf16);
  EXPECT_NEAR(testing::checked_estimate(fp16).time.optimizer.value() - e.time.optimizer.value(),
              rates.latency() + 8.0 * (dense / 16 + experts / 8 / 2) / rates.copy_bandwidth(), 1e-9);
}

// FSDP2 copies every gathered parameter out of the all-gather buffer (2 bytes read, 2 written),
// twice per micro-batch under FULL_SHARD, and copies each gradient into the fp32 reduce-scatter
// buffer (2 read, 4 written): 2 x 4 + 6 = 14 bytes per parameter per micro-batch, at the copy
// bandwidth, one launch per unit and pass.
TEST(Fsdp2Stack, CopiesParametersAndGradientsThroughItsBuffers) {
  Plan plan = sharded(Stack::kFsdp2, 3, 16);
  const Estimate e = testing::checked_estimate(plan);
  const KernelRates rates(plan.cluster.gpu, Dtype::kBf16);
  const double units = plan.model.layers + 2;  // the blocks, the embedding, the output layer
  const double per_micro_batch = 2 * units * rates.latency() + 14.0 * e.parameters / rates.copy_bandwidth();
  EXPECT_NEAR(e.time.dp_copies.value(), e.micro_batches * per_micro_batch, 1e-9);
  // FSDP1 gathers into the buffer its parameters are views of (no copy-out) and pre-divides the
  // bf16 gradient in place before a bf16 reduce-scatter: 4 bytes per parameter.
  const Estimate f1 = testing::checked_estimate(sharded(Stack::kFsdp1, 3, 16));
  EXPECT_NEAR(f1.time.dp_copies.value(), f1.micro_batches * (2 * units * rates.latency() + 4.0 * f1.parameters / rates.copy_bandwidth()), 1e-9);
}

// FSDP keeps the sharded gradient in fp32 between micro-batches (FSDP1 _saved_grad_shard, FSDP2's
// sharded_param.grad): 4 bytes per parameter over the 8 shards, where DeepSpeed keeps its
// gradient partition in bf16 (2).
TEST(FsdpStacks, KeepTheShardedGradientInFp32) {
  const Estimate f2 = testing::checked_estimate(sharded(Stack::kFsdp2, 3, 16));
  const Estimate ds = testing::checked_estimate(sharded(Stack::kDeepspeed, 3, 16));
  EXPECT_NEAR(f2.memory.gradients.value(), 4.0 * f2.parameters / 8, 1e-3 * f2.memory.gradients.value());
  EXPECT_NEAR(ds.memory.gradients.value(), 2.0 * ds.parameters / 8, 1e-3 * ds.memory.gradients.value());
}

// FSDP's SHARD_GRAD_OP (ZeRO-2 in an FSDP stack) gathers each unit before every micro-batch's
// forward and reduce-scatters its gradients after every backward: the traffic grows with the
// micro-batches, unlike PyTorch DDP-style ZeRO-2, which reduces once per step.
TEST(FsdpStacks, ShardGradOpGathersEveryMicroBatch) {
  const Estimate one = testing::checked_estimate(sharded(Stack::kFsdp1, 2, 8));
  const Estimate four = testing::checked_estimate(sharded(Stack::kFsdp1, 2, 32));
  EXPECT_NEAR(four.time.dp_comm_total.value(), 4 * one.time.dp_comm_total.value(), 1e-9);
  // and it gathers once per micro-batch, where FULL_SHARD gathers twice.
  const Estimate full = testing::checked_estimate(sharded(Stack::kFsdp1, 3, 8));
  EXPECT_LT(one.time.dp_comm_total.value(), full.time.dp_comm_total.value());
}

// DeepSpeed's ZeRO-3 gathers a block submodule by submodule, coalesced with its 5e7-parameter
// prefetch bucket: Llama 3 8B's block (218 M parameters, its largest linear 58.7 M) goes in 4
// all-gathers where FSDP gathers it in one, so latency is paid four times as often.
TEST(DeepspeedStack, Zero3GathersInSubmoduleChunks) {
  Plan ds = sharded(Stack::kDeepspeed, 3, 8);
  Plan f1 = sharded(Stack::kFsdp1, 3, 8);
  ds.gpus = f1.gpus = 1024;
  ds.parallel.dp = f1.parallel.dp = 1024;
  ds.training.global_batch = f1.training.global_batch = 1024;
  ds.parallel.reduce_dtype = f1.parallel.reduce_dtype = Dtype::kBf16;
  const Estimate a = testing::checked_estimate(ds), b = testing::checked_estimate(f1);
  // The same bytes, more collectives of a ring over 1024 ranks: more time.
  EXPECT_GT(a.time.dp_comm_total.value(), 1.2 * b.time.dp_comm_total.value());
}

// DeepSpeed ZeRO-3 loops over the ranks in Python for every tensor it gathers and every gradient
// it reduces (stack.cpp kDeepspeed: 2.6 us per rank per gathered tensor, 2.0 per gather, 2.0 per
// reduced gradient, bench/deepspeed_host_loops.py), on the thread that launches the kernels.
// Llama 3 8B: 7 linear weights a layer above the 1e5-element persistence threshold, 9 tensors in
// all (the two RMSNorm weights of 4096 stay whole); no layer kept for reuse (its 525 M-parameter
// head is past half of 1e9); a block in 4 gathers (the test above). Per micro-batch: 64 layer
// gathers of 7 tensors and 4 calls, the embedding twice and the output layer once (kept to its
// backward), 32 x 9 + 3 gradients (embedding, final norm, output):
//   2.6e-6 x (64 x 7 + 3) + 2.0e-6 x (64 x 4 + 3) + 2.0e-6 x 291 = 2.2726e-3 s per rank.
// With one micro-batch of one sequence per GPU the GPUs' work is the same on 1024 and 2048
// ranks, and both are host-bound: the host's time grows by 1024 x 2.2726e-3 s, and with it the
// wait plus the exposed collectives that run during it (the step is the host's time). FSDP's
// copies are single ops over the flat buffer, with no loop over ranks.
TEST(DeepspeedStack, Zero3LoopsOverTheRanksOnTheHost) {
  const auto at = [](Stack stack, int gpus) {
    Plan p = sharded(stack, 3, gpus);
    p.gpus = gpus;
    p.parallel.dp = gpus;
    return testing::checked_estimate(p);
  };
  const Estimate a = at(Stack::kDeepspeed, 1024), b = at(Stack::kDeepspeed, 2048);
  ASSERT_GT(a.time.host_wait.value(), 0.5);
  const auto waited = [](const Estimate& e) { return e.time.host_wait.value() + e.time.dp_comm_exposed.value(); };
  EXPECT_NEAR(waited(b) - waited(a), 1024 * 2.2726e-3, 1e-6);
  // On 8 ranks the loops take 8 x 2.2726e-3 s, under the GPUs' work: no wait.
  EXPECT_DOUBLE_EQ(at(Stack::kDeepspeed, 8).time.host_wait.value(), 0.0);
  // On 192 ranks they take 0.436 s of a micro-batch whose GPU work is longer, but the forward's
  // loops (2.6e-6 x (32 x 7 + 2) + 2.0e-6 x (32 x 4 + 2) = 0.8476e-3 s per rank, 0.163 s) outrun
  // the forward's GPU time, and DeepSpeed's fetch syncs keep the host from carrying the
  // backward's slack over: the forward waits.
  const Estimate c = at(Stack::kDeepspeed, 192);
  EXPECT_LT(192 * 2.2726e-3, 0.85 * (c.time.compute + c.time.recompute + c.time.dp_copies).value());
  EXPECT_GT(c.time.host_wait.value(), 0.0);
  EXPECT_DOUBLE_EQ(at(Stack::kFsdp2, 2048).time.host_wait.value(), 0.0);
  // DeepSpeed's expert parallelism asserts ZeRO-2 at most ("MoE not supported with Stage 3").
  Plan moe = testing::make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 64);
  moe.training.stack = Stack::kDeepspeed;
  moe.parallel.dp = 64;
  moe.parallel.ep = 8;
  moe.parallel.zero_stage = 3;
  const auto refused = validate_plan(moe);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("expert parallelism with ZeRO-2 at most"), std::string::npos) << refused.error().message;
}

// DeepSpeed v0.3.16 (stack.cpp kDeepspeedV03) gathers each parameter on its own, after a device
// sync, through a list all-gather: per rank, its Python loop (3.5 us, bench/deepspeed_host_loops.py
// `gather03`) and ProcessGroupNCCL's copy launch (5 us), with nothing queued on the GPU, so all of
// it is a wait. GPT-3 175B: per layer the fused QKV weight (453 M), the output projection (151 M),
// fc1 and fc2 (604 M each) pass the 1e5-element persistence threshold, the biases and LayerNorms
// (36,864 and fewer) do not: 4 gathers. No layer is kept for reuse (2 x the 629 M tied table
// alone passes 1e9); the table is gathered forward as the embedding and as the output layer,
// backward once as the embedding (the output layer is kept to its backward). Per micro-batch:
//   (96 x 4 + 2) + (96 x 4 + 1) = 771 gathers x 8.5e-6 s = 6.5535e-3 s per rank,
// 10.066 s on 1,536 ranks. At a fixed global batch of 1,536 sequences the same wait comes back
// on 768 ranks with two micro-batches each: a constant cost per step while the compute per GPU
// halves, where v0.16.5's coalesced gathers (its loops hidden behind the GPU's work) wait not at all.
TEST(DeepspeedV03Stack, GathersTensorByTensorWithTheDeviceSynced) {
  const auto at = [](Stack stack, int gpus, int micro_batches) {
    Plan p = testing::make_plan("gpt3-175b", "dgx-a100-80g", gpus, 2048, 1536);
    p.training.stack = stack;
    p.parallel.zero_stage = 3;
    p.parallel.micro_batch = 1536 / gpus / micro_batches;
    p.parallel.recompute = Recompute::kFull;
    p.parallel.reduce_dtype = stack_spec(stack).reduce_dtype;
    return testing::checked_estimate(p);
  };
  const double per_rank = 771 * (3.5e-6 + 5e-6);
  const Estimate wide = at(Stack::kDeepspeedV03, 1536, 1);
  EXPECT_NEAR(wide.time.host_wait.value(), 1536 * per_rank, 1e-9);
  EXPECT_NEAR(at(Stack::kDeepspeedV03, 768, 2).time.host_wait.value(), 1536 * per_rank, 1e-9);
  EXPECT_NEAR(at(Stack::kDeepspeedV03, 384, 1).time.host_wait.value(), 384 * per_rank, 1e-9);
  EXPECT_DOUBLE_EQ(at(Stack::kDeepspeed, 1536, 1).time.host_wait.value(), 0.0);
  // MiCS came in v0.9.2: no hybrid shard.
  Plan hybrid = testing::make_plan("gpt3-175b", "dgx-a100-80g", 1536, 2048, 1536);
  hybrid.training.stack = Stack::kDeepspeedV03;
  hybrid.parallel.zero_stage = 3;
  hybrid.parallel.shard_group = 8;
  const auto refused = validate_plan(hybrid);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/parallel/shard_group: the deepspeed-v0.3 stack has no hybrid sharding"), std::string::npos)
      << refused.error().message;
  // ZeRO-3 ran beside Megatron's tensor parallelism (its mpu); MoE layers came in v0.5.0.
  Plan sliced = testing::make_plan("gpt3-175b", "dgx-a100-80g", 1536, 2048, 1536);
  sliced.training.stack = Stack::kDeepspeedV03;
  sliced.parallel.zero_stage = 3;
  sliced.parallel.tp = 8;
  sliced.parallel.dp = 192;
  EXPECT_TRUE(validate_plan(sliced));
  Plan moe = testing::make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 64);
  moe.training.stack = Stack::kDeepspeedV03;
  moe.parallel.ep = 8;
  moe.parallel.zero_stage = 1;
  const auto no_experts = validate_plan(moe);
  ASSERT_FALSE(no_experts);
  EXPECT_NE(no_experts.error().message.find("/parallel/ep: the deepspeed-v0.3 stack has no expert parallelism"), std::string::npos)
      << no_experts.error().message;
}

// What a pipeline stage sends, by hand: GPT-3 175B on two DGX A100 nodes, tp 8 within each, pp 2
// across them, 8 micro-batches of one 2,048-token sequence in 1F1B. An activation is 2,048 x
// 12,288 x 2 bytes = 50,331,648; a GPU's share of its node's NICs is 200 Gb/s x 8 / 8 = 25 GB/s at
// the profile's efficiency 0.9, plus 6 us (send_recv_time): the whole tensor takes 2.2430 ms, an
// eighth 0.2856 ms. Each micro-batch crosses twice (after its forward and its backward), m + pp - 1
// = 9 times in all. Without sequence parallelism:
//  - megatron-te (Megatron-LM's scatter-gather): an eighth, sent and received at once, then
//    all-gathered over the 8 tensor-parallel GPUs, both ways: 2 gathers.
//  - deepspeed (PipelineEngine: blocking send then recv, pipe_partitioned and grad_partitioned):
//    an eighth each way, one after the other; 3 gathers (the received activation, the stage's own
//    output before its backward, the received gradient).
//  - deepspeed-v0.3 (gradients sent whole before v0.5.4): an eighth forward, the whole gradient
//    back, one after the other; 2 gathers (the received activation, the stage's own output).
//  - the executor (trainplan): the whole tensor from each rank, both ways at once, no gather.
// With sequence parallelism Megatron and the executor send the eighth they hold and gather
// nothing (DeepSpeed's AutoTP has no sequence parallelism).
// GPT-3 175B on 16 A100s: tp 8, two pipeline stages, 8 micro-batches of one sequence.
Estimate two_stage_estimate(Stack stack, bool sequence_parallel) {
  Plan p = testing::make_plan("gpt3-175b", "dgx-a100-80g", 16, 2048, 8);
  p.training.stack = stack;
  p.parallel.tp = 8;
  p.parallel.pp = 2;
  p.parallel.dp = 1;
  p.parallel.sequence_parallel = sequence_parallel;
  p.parallel.micro_batch = 1;
  return testing::checked_estimate(p);
}

TEST(PipelineSend, AsEachStacksEngineSendsIt) {
  const auto pp_comm = [](Stack stack, bool sequence_parallel) { return two_stage_estimate(stack, sequence_parallel).time.pp_comm.value(); };
  const double link = 22.5e9, latency = 6e-6, whole = 2048.0 * 12288 * 2;
  const double eighth = whole / 8 / link + latency, all = whole / link + latency;
  const HardwareProfile a100 = testing::cluster("dgx-a100-80g");
  const double gather = collective_time(a100, Collective::kAllGather, Bytes(whole), CollectiveGroup{8, 8}).value();
  ASSERT_GT(gather, 0.0);
  EXPECT_NEAR(pp_comm(Stack::kMegatronTe, false), 9 * (2 * eighth + 2 * gather), 1e-9);
  EXPECT_NEAR(pp_comm(Stack::kDeepspeed, false), 9 * (2 * (eighth + eighth) + 3 * gather), 1e-9);
  EXPECT_NEAR(pp_comm(Stack::kDeepspeedV03, false), 9 * (2 * (eighth + all) + 2 * gather), 1e-9);
  EXPECT_NEAR(pp_comm(Stack::kTrainplan, false), 9 * (2 * all), 1e-9);
  EXPECT_NEAR(pp_comm(Stack::kMegatronTe, true), 9 * (2 * eighth), 1e-9);
  EXPECT_NEAR(pp_comm(Stack::kTrainplan, true), 9 * (2 * eighth), 1e-9);
}

// The pipeline the GUI draws (simulate_pipeline) holds each stage for its exchange after every
// pass, so the drawing's step is the step's pipeline part: compute, pp_comm and the bubble, less
// the last pass's exchange (nothing waits for it). Before, the drawing charged only the hop
// between dependent passes, and a stage was free again at once: shorter than the step, most of
// all for DeepSpeed's blocking exchanges and three gathers a micro-batch.
TEST(PipelineSend, TheDrawnScheduleTakesWhatTheStepCharges) {
  for (Stack stack : {Stack::kDeepspeed, Stack::kMegatronTe, Stack::kTrainplan}) {
    const Estimate e = two_stage_estimate(stack, false);
    ASSERT_GT(e.pipeline.pass_comm_seconds, 0.0);
    // 2 exchanges and all the gathers of each of the (m + p - 1) slots the step charges.
    EXPECT_NEAR(2.0 * e.pipeline.pass_comm_seconds * (e.micro_batches + 1), e.time.pp_comm.value(), 1e-9) << stack_name(stack);
    const auto sim = simulate_pipeline(e.pipeline);
    ASSERT_TRUE(sim.ok());
    double stage_sum = 0;
    for (int s = 0; s < 2; ++s) stage_sum = std::max(stage_sum, e.pipeline.forward_seconds[s] + e.pipeline.backward_seconds[s]);
    // Two stages of nearly equal time (the head makes the last one longer): within 2% of
    // m + p - 1 slots of the slowest stage's pass pair plus its exchanges.
    const double charged = (e.micro_batches + 1) * (stage_sum + 2.0 * e.pipeline.pass_comm_seconds) - e.pipeline.pass_comm_seconds;
    EXPECT_NEAR(sim->makespan / charged, 1.0, 0.02) << stack_name(stack);
  }
}

// DeepSpeed's PipelineEngine runs TrainSchedule only (runtime/pipe/schedule.py): an interleaved
// or GPipe plan is refused, naming the field; Megatron runs interleaving. Neither DeepSpeed stack
// runs Megatron's sequence parallelism (AutoTP shards the linear layers only; v0.3 ran before 2022).
TEST(PipelineSchedule, DeepspeedRunsOneFOneBWithOneChunkPerStage) {
  Plan p = testing::make_plan("gpt3-175b", "dgx-a100-80g", 16, 2048, 8);
  p.parallel.tp = 8;
  p.parallel.pp = 2;
  p.parallel.dp = 1;
  p.parallel.micro_batch = 1;
  p.parallel.schedule = Schedule::kInterleaved;
  p.parallel.virtual_stages = 2;
  Plan gpipe = p;
  gpipe.parallel.schedule = Schedule::kGpipe;
  gpipe.parallel.virtual_stages = 1;
  for (Stack stack : {Stack::kDeepspeed, Stack::kDeepspeedV03}) {
    for (Plan* plan : {&p, &gpipe}) {
      plan->training.stack = stack;
      const auto refused = validate_plan(*plan);
      ASSERT_FALSE(refused);
      EXPECT_NE(refused.error().message.find("/parallel/schedule: the " + std::string(stack_name(stack)) + " stack's pipeline engine runs 1F1B"),
                std::string::npos)
          << refused.error().message;
    }
  }
  p.training.stack = Stack::kMegatronTe;
  EXPECT_TRUE(validate_plan(p));
  Plan sp = gpipe;
  sp.parallel.schedule = Schedule::kOneFOneB;
  sp.parallel.sequence_parallel = true;
  for (Stack stack : {Stack::kDeepspeed, Stack::kDeepspeedV03}) {
    sp.training.stack = stack;
    sp.parallel.sequence_parallel = true;
    const auto no_sp = validate_plan(sp);
    ASSERT_FALSE(no_sp);
    EXPECT_NE(no_sp.error().message.find("/parallel/sequence_parallel: the " + std::string(stack_name(stack)) + " stack has no sequence parallelism"),
              std::string::npos)
        << no_sp.error().message;
    sp.parallel.sequence_parallel = false;
    EXPECT_TRUE(validate_plan(sp));
  }
}

// FSDP has no optimizer-only sharding (torch/distributed/fsdp api.py ShardingStrategy; FSDP2's
// fully_shard): ZeRO-1 is refused wherever it would shard, over data-parallel ranks or, as
// torchtitan's dp_shard_cp mesh does, over context-parallel ones; with one rank it shards nothing.
TEST(OptimizerOnlySharding, IsRefusedForFsdpOverDataAndContextRanks) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 2, 8192, 2);
  p.training.stack = Stack::kFsdp2;
  p.parallel.zero_stage = 1;
  for (const auto& [dp, cp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    p.parallel.dp = dp;
    p.parallel.cp = cp;
    const auto refused = validate_plan(p);
    ASSERT_FALSE(refused) << dp << " " << cp;
    EXPECT_NE(refused.error().message.find("/parallel/zero_stage: the fsdp2 stack has no optimizer-only sharding"), std::string::npos)
        << refused.error().message;
  }
  Plan one = testing::make_plan("llama3-8b", "dgx-h100", 1, 8192, 1);
  one.training.stack = Stack::kFsdp2;
  one.parallel.zero_stage = 1;
  EXPECT_TRUE(validate_plan(one));
}

// MosaicML's MPT loss (stack composer): flash-attn's CrossEntropyLoss on the bf16 logits keeps them
// and their float32 log-sum-exp (4 bytes a token) and writes a new bf16 gradient; Hugging Face's
// (fsdp1) keeps an fp32 log-softmax of an fp32 copy (4 bytes a logit) and at its backward's peak
// holds their fp32 gradients (8). Llama 2 7B's shape, one sequence of 32,768 tokens: 32,768 x 32,000
// logits, 2.1 GB in bf16. Everything else is fsdp1's.
TEST(ComposerStack, KeepsTheBf16LogitsAndTheirLogSumExp) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const ModelSpec m = testing::model("llama2-7b");
  LayerSetting s;
  s.seq_len = 32768;
  s.stack = Stack::kFsdp1;
  const EndsCost hf = ends_cost(m, hw, s);
  s.stack = Stack::kComposer;
  const EndsCost foundry = ends_cost(m, hw, s);
  const double logits = 32768.0 * 32000;
  // And the final norm: fsdp1's Hugging Face LlamaRMSNorm keeps its fp32 copy beside the normalised
  // bf16 tensor (4 + 2 bytes an element), MPT's norm its bf16 input (2).
  EXPECT_NEAR(hf.head_activation_bytes - foundry.head_activation_bytes, 4.0 * logits - (2.0 * logits + 4.0 * 32768) + 4.0 * 32768 * 4096, 1.0);
  EXPECT_NEAR(hf.head_backward_transient_bytes, 8.0 * logits, 1.0);
  EXPECT_NEAR(foundry.head_backward_transient_bytes, 2.0 * logits, 1.0);
  EXPECT_LT(foundry.head_forward + foundry.head_backward, hf.head_forward + hf.head_backward);
  EXPECT_EQ(foundry.embedding_forward, hf.embedding_forward);
  // The layer is fsdp1's but for the two norms: LlamaRMSNorm's eight ATen ops against one kernel.
  const KernelRates rates(hw.gpu, Dtype::kBf16, AttentionImpl::kFlash2);
  const double n = 32768.0 * 4096;
  LayerSetting x = s;
  x.stack = Stack::kFsdp1;
  EXPECT_NEAR(transformer_layer_cost(m, hw, x).forward - transformer_layer_cost(m, hw, s).forward,
              2 * (rates.op(ElementwiseOp::kRmsNormUnfused, n, false, 2) - rates.op(ElementwiseOp::kRmsNorm, n, false, 2)), 1e-12);
}

// The ends' tensor-parallel collectives where the conjugates put them (Megatron-Core mappings.py):
// the vocab-parallel embedding's all-reduce forward (identity backward) and the column-parallel
// output layer's all-reduce of its input's gradient backward; under sequence parallelism the
// embedding's reduce-scatter forward and all-gather backward, the output layer's all-gather of the
// final norm's output forward and reduce-scatter backward. Measured as what they add on links
// of the profile's bandwidth over links a thousand times faster (the kernels are the same); the
// loss's three small all-reduces are the head's forward either way. Llama 3 8B, tp 2, one
// sequence of 4096 tokens: each collective moves 4096 x 4096 bf16.
TEST(EndsTensorParallel, TheEmbeddingAndOutputLayerCollectivesAreTheirConjugates) {
  HardwareProfile hw = testing::cluster("dgx-h100");
  hw.intra_node.measured = nullptr;  // NCCL's model on the link rate, which the test scales
  HardwareProfile fast = hw;
  fast.intra_node.bandwidth = fast.intra_node.bandwidth * 1000.0;
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s;
  s.stack = Stack::kMegatronTe;
  s.tp = 2;
  s.tp_group = CollectiveGroup{2, 2};
  s.seq_len = 4096;
  const Bytes block(4096.0 * 4096 * 2);
  const auto added = [&](Collective kind, const Bytes& bytes) {
    return collective_time(hw, kind, bytes, s.tp_group).value() - collective_time(fast, kind, bytes, s.tp_group).value();
  };
  const double loss = 3.0 * added(Collective::kAllReduce, Bytes(4.0 * 4096));
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallelism");
    s.sequence_parallel = sp;
    const EndsCost slow = ends_cost(m, hw, s), quick = ends_cost(m, fast, s);
    const double forward = sp ? added(Collective::kReduceScatter, block) : added(Collective::kAllReduce, block);
    EXPECT_NEAR(slow.embedding_forward - quick.embedding_forward, forward, 1e-12);
    EXPECT_NEAR(slow.embedding_backward - quick.embedding_backward, sp ? added(Collective::kAllGather, block) : 0.0, 1e-12);
    EXPECT_NEAR(slow.head_forward - quick.head_forward, loss + (sp ? added(Collective::kAllGather, block) : 0.0), 1e-12);
    EXPECT_NEAR(slow.head_backward - quick.head_backward, forward, 1e-12);
  }
  // Learned positions (GPT): Megatron all-reduces the embedding's output, adds the positions to the
  // whole sequence and splits it (LanguageModelEmbedding: reduce_scatter_embeddings only without
  // position embeddings); the executor reduce-scatters first. GPT-2 1.5B, hidden 1600.
  const ModelSpec gpt = testing::model("gpt2-1.5b");
  const Bytes gpt_block(4096.0 * 1600 * 2);
  s.sequence_parallel = true;
  const EndsCost megatron = ends_cost(gpt, hw, s), megatron_fast = ends_cost(gpt, fast, s);
  EXPECT_NEAR(megatron.embedding_forward - megatron_fast.embedding_forward, added(Collective::kAllReduce, gpt_block), 1e-12);
  EXPECT_NEAR(megatron.embedding_backward - megatron_fast.embedding_backward, added(Collective::kAllGather, gpt_block), 1e-12);
  s.stack = Stack::kTrainplan;
  EXPECT_NEAR(ends_cost(gpt, hw, s).embedding_forward - ends_cost(gpt, fast, s).embedding_forward, added(Collective::kReduceScatter, gpt_block), 1e-12);
}

// PyTorch DDP (ZeRO-0/1 of the PyTorch stacks) keeps its buckets beside the gradients,
// gradient_as_bucket_view=False by default (torch 2.11.0 nn/parallel/distributed.py: True saves
// "the total gradients size"): Llama 3 8B's bf16 gradients once more, 2 bytes a parameter (4 in
// fp32), where one rank keeps none. Each gradient is copied in and the average back once a step
// (accumulation runs under no_sync), 8 bytes a bf16 parameter moved, a kernel per parameter tensor
// each way: 9 a block, the embedding's and the head's units counted as blocks, as the
// accumulation pass counts them (2 x 34 x 9), however many micro-batches. FSDP1 without sharding
// (NO_SHARD), FSDP2 and Megatron reduce their own flat buffers: two 25 MiB buckets in flight.
TEST(DdpBuckets, HoldACopyOfEveryGradient) {
  const auto estimate = [](Stack stack, int gpus, int micro_batches = 8, Precision precision = Precision::kBf16) {
    Plan p = testing::make_plan("llama3-8b", "dgx-h100", gpus, 4096, micro_batches * gpus);
    p.training.stack = stack;
    p.training.precision = precision;
    p.parallel.dp = gpus;
    p.parallel.zero_stage = 0;
    p.parallel.micro_batch = 1;
    return testing::checked_estimate(p);
  };
  const KernelRates rates(testing::cluster("dgx-h100").gpu, Dtype::kBf16);
  for (Stack stack : {Stack::kPytorchEager, Stack::kTorchCompile}) {
    SCOPED_TRACE(stack_spec(stack).name);
    const Estimate one = estimate(stack, 1), eight = estimate(stack, 8);
    const double params = eight.trainable_parameters;
    EXPECT_NEAR((eight.memory.buffers - one.memory.buffers).value(), 2.0 * params, 1.0);
    EXPECT_NEAR(eight.time.dp_copies.value(), rates.stream(8.0 * params, 2 * 34 * 9), 1e-12);
    EXPECT_NEAR(estimate(stack, 8, 1).time.dp_copies.value(), eight.time.dp_copies.value(), 1e-12);
    EXPECT_EQ(one.time.dp_copies.value(), 0.0);
    const Estimate fp32 = estimate(stack, 8, 8, Precision::kFp32);
    EXPECT_NEAR((fp32.memory.buffers - estimate(stack, 1, 8, Precision::kFp32).memory.buffers).value(), 4.0 * params, 1.0);
  }
  for (Stack stack : {Stack::kFsdp1, Stack::kFsdp2, Stack::kMegatronTe}) {
    SCOPED_TRACE(stack_spec(stack).name);
    EXPECT_NEAR((estimate(stack, 8).memory.buffers - estimate(stack, 1).memory.buffers).value(), 2.0 * 25.0 * 1048576.0, 1.0);
  }
}

// A host-bound step under ZeRO-1 (a tiny model, each eager kernel's 9.2 us of host time above its
// GPU time): the reduction was timed against a backward that includes the wait, so the wait is
// not shortened by it again. Eight ranks wait as long as one does, but for the bucket copies
// PyTorch DDP adds.
TEST(HostWait, IsNotShortenedByReductionsTimedAgainstIt) {
  const auto tiny = [](int gpus) {
    Plan p = testing::make_plan("tiny-llama", "dgx-h100", gpus, 64, 4 * gpus);
    p.training.stack = Stack::kPytorchEager;
    p.parallel.dp = gpus;
    p.parallel.zero_stage = gpus > 1 ? 1 : 0;
    return testing::checked_estimate(p);
  };
  const Estimate one = tiny(1), eight = tiny(8);
  ASSERT_EQ(one.micro_batches, eight.micro_batches);
  ASSERT_GT(one.time.host_wait.value(), 0.0);
  EXPECT_GT(eight.time.dp_comm_exposed.value(), 0.0);
  // DDP's bucket copies add their launches to the host (2 x 4 units x 9 tensors, 9.2 us each) and
  // their time to the GPU's work, which fills that much of the wait.
  EXPECT_GT(eight.time.dp_copies.value(), 0.0);
  EXPECT_NEAR(eight.time.host_wait.value() + eight.time.dp_copies.value(), one.time.host_wait.value() + 2 * 4 * 9 * 9.2e-6, 1e-12);
}

// DeepSpeed's stage3_max_reuse_distance (1e9, runtime/zero/config.py) keeps the last layers of
// the forward gathered to their backward (partitioned_param_coordinator.py __params_to_release).
// Llama 2 7B: a layer is 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202.38 M parameters, the head
// 32000 x 4096 + 4096 = 131.08 M: (5e8 - 131.08 M) / 202.38 M = 1.82, so 2 layers. Llama 3.2 1B:
// 60.82 M a layer, the tied head 128256 x 2048 + 2048 = 262.67 M: 3.90, so 4. Llama 3 8B: its head
// of 525.34 M is past half the distance, so none.
TEST(DeepspeedReuse, KeepsTheLastLayersWithinTheReuseDistance) {
  EXPECT_EQ(layers_kept_for_reuse(1e9, 202.38e6, 131.08e6, 32), 2);
  EXPECT_EQ(layers_kept_for_reuse(1e9, 60.82e6, 262.67e6, 16), 4);
  EXPECT_EQ(layers_kept_for_reuse(1e9, 218.1e6, 525.34e6, 32), 0);
  EXPECT_EQ(layers_kept_for_reuse(1e9, 1e6, 0, 12), 12);  // a model under half the distance keeps every layer
  EXPECT_EQ(layers_kept_for_reuse(0, 202.38e6, 131.08e6, 32), 0);
}

// Llama 3 8B's layer on H100 under tp 2 inside a node, two sequences of 4096 tokens, sequence
// parallel: the gathered tensor is 8192 x 4096 bf16 (64 MiB).
LayerSetting tp2_two_sequences() {
  LayerSetting s;
  s.tp = 2;
  s.tp_group = CollectiveGroup{2, 2};
  s.micro_batch = 2;
  s.seq_len = 4096;
  s.sequence_parallel = true;
  return s;
}

// PyTorch's tensor parallelism (DTensor, as torchtitan runs it) shards [batch, seq, hidden]
// activations on the sequence, while NCCL gathers and scatters along the first dimension: each
// sequence-parallel reduce-scatter concatenates its input's chunks first, and each all-gather of
// more than one sequence rearranges its output (torch 2.11.0 _functional_collectives.py
// reduce_scatter_tensor and all_gather_tensor, _utils.py _maybe_view_chunk_cat: a view at batch 1).
// Llama 3 8B, tp 2 in a node, two sequences of 4096 tokens: the gathered tensor is 8192 x 4096
// bf16, 64 MiB, read and written by each copy. Forward: 2 reduce-scatters and 2 all-gathers, 4
// copies (2 at one sequence). Backward, their conjugates: eager 4 (2); under Inductor the
// reduce-scatters' input copies are fused into the input-gradient sums, 2 (0). Full recompute
// (torchtitan's non-reentrant checkpoint, early_stop) replays the forward but the block's last
// reduce-scatter and its copy: 3 more. Megatron's [seq, batch, hidden] layout copies nothing.
TEST(TensorParallel, DTensorCopiesTheSequenceShardsAroundEachCollective) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const ModelSpec m = testing::model("llama3-8b");
  const LayerSetting s = tp2_two_sequences();
  const KernelRates rates(hw.gpu, Dtype::kBf16);
  const Bytes gathered(8192.0 * 4096 * 2);
  const double copy = rates.stream(2.0 * gathered.value());
  const double reduce_scatter = collective_time(hw, Collective::kReduceScatter, gathered, s.tp_group).value();
  const auto layer = [&](Stack stack, double micro_batch, Recompute recompute, bool sp) {
    LayerSetting x = s;
    x.stack = stack;
    x.micro_batch = micro_batch;
    x.seq_len = 8192 / micro_batch;
    x.recompute = recompute;
    x.sequence_parallel = sp;
    return transformer_layer_cost(m, hw, x);
  };
  const LayerCost megatron = layer(Stack::kMegatronTe, 2, Recompute::kNone, true);
  for (Stack stack : {Stack::kPytorchEager, Stack::kTorchCompile, Stack::kFsdp2, Stack::kFsdp2Compile}) {
    SCOPED_TRACE(stack_spec(stack).name);
    const double fused = stack_spec(stack).fused_elementwise ? 1.0 : 0.0;  // Inductor
    const LayerCost two = layer(stack, 2, Recompute::kNone, true);
    EXPECT_NEAR(two.tp_comm_forward - megatron.tp_comm_forward, 4 * copy, 1e-12);
    EXPECT_NEAR(two.tp_comm_backward - megatron.tp_comm_backward, (4 - 2 * fused) * copy, 1e-12);
    EXPECT_NEAR(two.tp_copies, (8 - 2 * fused) * copy, 1e-12);
    const LayerCost one = layer(stack, 1, Recompute::kNone, true);
    EXPECT_NEAR(one.tp_comm_forward - megatron.tp_comm_forward, 2 * copy, 1e-12);
    EXPECT_NEAR(one.tp_copies, (4 - 2 * fused) * copy, 1e-12);
    const LayerCost full = layer(stack, 2, Recompute::kFull, true);
    EXPECT_NEAR(full.tp_comm_recompute, full.tp_comm_forward - reduce_scatter - copy, 1e-12);
    EXPECT_NEAR(full.tp_copies, (11 - 2 * fused) * copy, 1e-12);
    // Without sequence parallelism the row-parallel outputs are all-reduced whole: no copy.
    EXPECT_EQ(layer(stack, 2, Recompute::kNone, false).tp_copies, 0.0);
  }
  EXPECT_EQ(megatron.tp_copies, 0.0);
  EXPECT_EQ(layer(Stack::kMegatronTe, 2, Recompute::kFull, true).tp_comm_recompute, megatron.tp_comm_forward);
  EXPECT_EQ(layer(Stack::kTrainplan, 2, Recompute::kNone, true).tp_copies, 0.0);

  // The step: every micro-batch's 32 layers, part of the tensor-parallel line and its own JSON key.
  Plan plan = sharded(Stack::kFsdp2, 3, 8);
  plan.parallel.tp = 2;
  plan.parallel.dp = 4;
  plan.parallel.sequence_parallel = true;
  plan.parallel.micro_batch = 2;
  plan.parallel.recompute = Recompute::kNone;
  const Estimate e = testing::checked_estimate(plan);
  const double per_layer = plan_layer_cost(plan).tp_copies;
  EXPECT_GT(per_layer, 0);
  EXPECT_NEAR(e.time.tp_copies.value(), e.micro_batches * 32 * per_layer, 1e-12);
  EXPECT_LT(e.time.tp_copies.value(), e.time.tp_comm.value());
  EXPECT_DOUBLE_EQ(estimate_to_json(plan, e).at("time").at("tp_copy_seconds").get<double>(), e.time.tp_copies.value());
}

// torchao's float8 tensor parallelism (torchtitan's enable_float8_tensorwise_tp: Float8ColwiseParallel,
// PrepareFloat8ModuleInput, Float8RowwiseParallel) all-gathers fp8: 1 byte an element for every
// all-gather of the layer and its copy, 2 for the reduce-scatters. The same layer as above in fp8,
// two sequences: forward 2 x (all-gather of 32 MiB + reduce-scatter of 64 MiB) and the copies.
TEST(TensorParallel, Float8TensorParallelismGathersFp8) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s = tp2_two_sequences();
  s.precision = Precision::kFp8;
  s.stack = Stack::kFsdp2Compile;
  const KernelRates rates(hw.gpu, Dtype::kBf16);
  const double tokens = 8192, h = 4096;
  const double gather = collective_time(hw, Collective::kAllGather, Bytes(tokens * h), s.tp_group).value();
  const double reduce_scatter = collective_time(hw, Collective::kReduceScatter, Bytes(tokens * h * 2), s.tp_group).value();
  const double copies = 2 * rates.stream(2.0 * tokens * h * 2) + 2 * rates.stream(2.0 * tokens * h);
  EXPECT_NEAR(transformer_layer_cost(m, hw, s).tp_comm_forward, 2 * (gather + reduce_scatter) + copies, 1e-12);
  // Megatron with Transformer Engine gathers the 16-bit tensor here.
  s.stack = Stack::kMegatronTe;
  EXPECT_NEAR(transformer_layer_cost(m, hw, s).tp_comm_forward,
              2 * (collective_time(hw, Collective::kAllGather, Bytes(tokens * h * 2), s.tp_group).value() + reduce_scatter), 1e-12);
}

// torchtitan's op-level selective recompute saves the reduce-scatters' outputs but no all-gather
// or all-reduce (torchtitan 820504e parallelize_llama.py _save_list), and torch.compile recomputes
// a collective the checkpointed region marks for recompute (torch 2.11.0
// _functorch/partitioners.py force_save_collectives): the recomputed wk and w3 GEMMs take their
// gathered inputs from the two sequence-parallel all-gathers again (with their copies at two
// sequences); eager's replay also runs wo and the copy before its reduce-scatter again, whose
// saved result it returns, where Inductor drops both. Without sequence parallelism the second
// norm's input needs the attention output's all-reduce again. Megatron's selective recompute
// reruns no collective.
TEST(TensorParallel, OpLevelSelectiveRecomputeGathersTheRecomputedGemmsInputsAgain) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s = tp2_two_sequences();
  s.recompute = Recompute::kSelective;
  const KernelRates rates(hw.gpu, Dtype::kBf16);
  const Bytes gathered(8192.0 * 4096 * 2);
  const double copy = rates.stream(2.0 * gathered.value());
  const double gather = collective_time(hw, Collective::kAllGather, gathered, s.tp_group).value();
  for (Stack stack : {Stack::kFsdp2, Stack::kFsdp2Compile}) {
    SCOPED_TRACE(stack_spec(stack).name);
    const bool fused = stack_spec(stack).fused_elementwise;
    s.stack = stack;
    s.sequence_parallel = true;
    const LayerCost sp = transformer_layer_cost(m, hw, s);
    EXPECT_NEAR(sp.tp_comm_recompute, 2 * (gather + copy) + (fused ? 0.0 : copy), 1e-12);
    EXPECT_NEAR(sp.tp_copies, (fused ? 6 + 2 : 8 + 2 + 1) * copy, 1e-12);
    s.sequence_parallel = false;
    EXPECT_NEAR(transformer_layer_cost(m, hw, s).tp_comm_recompute, collective_time(hw, Collective::kAllReduce, gathered, s.tp_group).value(), 1e-12);
  }
  s.stack = Stack::kMegatronTe;
  s.sequence_parallel = true;
  EXPECT_EQ(transformer_layer_cost(m, hw, s).tp_comm_recompute, 0.0);
}

// How much of the block full recompute runs again (StackSpec::full_recompute_replay). Llama 3 8B,
// one sequence of 4096 tokens on an H100, no TP: the layer's GEMMs are 2 x 4096 x (4096 + 1024 +
// 1024 + 4096) FLOPs a token for attention and 2 x 3 x 4096 x 14336 for the MLP, of which w2 is a
// third, 2 x 4096 x 14336. A replay that stops before w2 (torch's non-reentrant checkpoint with its
// default early stop: w2's autograd node saves its input and weight before the GEMM runs, and
// nothing after it saves; Inductor's partitioner: nothing after it is needed) executes that much
// less; Megatron's reentrant CheckpointFunction, DeepSpeed's and the executor's replay the whole
// block. A dropout mask or torchao's fp8 matmul (an autograd function, saving after its
// forward) after w2 keeps the eager replay running; Inductor still drops them.
TEST(FullRecompute, ReplaysTheBlockUpToTheLastTensorBackwardNeeds) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const ModelSpec m = testing::model("llama3-8b");
  const double tokens = 4096, w2_flops = 2.0 * 4096 * 14336 * tokens;
  const auto layer = [&](Stack stack, Recompute recompute, bool dropout = false, Precision precision = Precision::kBf16) {
    LayerSetting s;
    s.stack = stack;
    s.seq_len = tokens;
    s.recompute = recompute;
    s.dropout = dropout;
    s.precision = precision;
    return transformer_layer_cost(m, hw, s);
  };
  for (Stack stack : {Stack::kMegatronTe, Stack::kDeepspeed, Stack::kTrainplan}) {
    SCOPED_TRACE(stack_spec(stack).name);
    const LayerCost full = layer(stack, Recompute::kFull), none = layer(stack, Recompute::kNone);
    EXPECT_DOUBLE_EQ(full.recompute, full.forward);
    // The forward's GEMMs and its attention again (QK^T and PV, 4 x 4096 keys x 4096 a token, the
    // non-causal convention the FLOP counts use).
    EXPECT_NEAR(full.hardware_flops - none.hardware_flops, (2.0 * (10240.0 * 4096 + 3.0 * 4096 * 14336) + 4.0 * 4096 * 4096) * tokens, 1.0);
  }
  const double whole_flops = layer(Stack::kMegatronTe, Recompute::kFull).hardware_flops - layer(Stack::kMegatronTe, Recompute::kNone).hardware_flops;
  for (Stack stack : {Stack::kPytorchEager, Stack::kFsdp1, Stack::kFsdp2, Stack::kTorchCompile, Stack::kFsdp2Compile}) {
    SCOPED_TRACE(stack_spec(stack).name);
    const bool inductor = stack_spec(stack).full_recompute_replay == FullRecomputeReplay::kWhatBackwardNeeds;
    const LayerCost full = layer(stack, Recompute::kFull), none = layer(stack, Recompute::kNone);
    EXPECT_NEAR(full.hardware_flops - none.hardware_flops, whole_flops - w2_flops, 1.0);
    // w2's GEMM at no more than the dense bf16 peak, and less than a third of the forward's time.
    const double skipped = full.forward - full.recompute;
    EXPECT_GT(skipped, w2_flops / hw.gpu.peak[static_cast<int>(Dtype::kBf16)].value());
    EXPECT_LT(skipped, full.forward / 3.0);
    const LayerCost dropped = layer(stack, Recompute::kFull, true);
    const LayerCost fp8 = layer(stack, Recompute::kFull, false, Precision::kFp8);
    if (inductor) {
      EXPECT_LT(dropped.recompute, dropped.forward);
      EXPECT_LT(fp8.recompute, fp8.forward);
    } else {
      EXPECT_DOUBLE_EQ(dropped.recompute, dropped.forward);
      EXPECT_DOUBLE_EQ(fp8.recompute, fp8.forward);
    }
    // A LoRA adapter on w2 saves after it (its B's input): the eager replay runs w2 too.
    LayerSetting adapted;
    adapted.stack = stack;
    adapted.seq_len = tokens;
    adapted.recompute = Recompute::kFull;
    adapted.mode = TrainingMode::kLora;
    adapted.lora.targets = {"q", "v", "down"};
    const LayerCost lora = transformer_layer_cost(m, hw, adapted);
    if (inductor) EXPECT_LT(lora.recompute, lora.forward);
    else EXPECT_DOUBLE_EQ(lora.recompute, lora.forward);
    // Tensor parallelism without sequence parallelism: the all-reduce after w2 is not run again.
    LayerSetting tp = adapted;
    tp.mode = TrainingMode::kPretrain;
    tp.tp = 2;
    tp.tp_group = CollectiveGroup{2, 2};
    const LayerCost sharded = transformer_layer_cost(m, hw, tp);
    EXPECT_NEAR(sharded.tp_comm_recompute,
                sharded.tp_comm_forward - collective_time(hw, Collective::kAllReduce, Bytes(tokens * 4096 * 2), tp.tp_group).value(), 1e-15);
  }
  // A mixture of experts ends in the experts' combine, which keeps the routing weights: replayed whole.
  LayerSetting moe;
  moe.stack = Stack::kFsdp2Compile;
  moe.seq_len = tokens;
  moe.recompute = Recompute::kFull;
  const LayerCost experts = transformer_layer_cost(testing::model("mixtral-8x7b"), hw, moe);
  EXPECT_DOUBLE_EQ(experts.recompute, experts.forward);
}

// What each stack runs besides data parallelism: FSDP1 shards data only (Composer, Accelerate's
// FSDP1 and Lightning's FSDPStrategy have no TP, CP or PP with it); DeepSpeed's pipeline engine
// asserts ZeRO below 2 (runtime/pipe/engine.py) and its Ulysses sequence parallelism is no ring;
// torchtitan's FSDP2 composes all of them. The search never recommends what the stack lacks.
TEST(StackCapabilities, ArePlanErrorsNamingTheField) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", 16, 4096, 64);
  p.parallel.dp = 8;
  p.parallel.tp = 2;
  p.training.stack = Stack::kFsdp1;
  EXPECT_EQ(validate_plan(p).error().message.find("/parallel/tp: the fsdp1 stack has no tensor parallelism"), 0u)
      << validate_plan(p).error().message;
  p.training.stack = Stack::kFsdp2;
  EXPECT_TRUE(validate_plan(p));
  Plan pipe = testing::make_plan("llama3-8b", "dgx-h100", 16, 4096, 64);
  pipe.parallel.dp = 8;
  pipe.parallel.pp = 2;
  pipe.parallel.zero_stage = 2;
  pipe.training.stack = Stack::kDeepspeed;
  EXPECT_NE(validate_plan(pipe).error().message.find("ZeRO-1 at most"), std::string::npos);
  pipe.parallel.zero_stage = 1;
  EXPECT_TRUE(validate_plan(pipe));
}

}  // namespace
}  // namespace trainplan
