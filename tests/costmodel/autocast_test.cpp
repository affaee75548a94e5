// torch.autocast on an fp32 module (LayerSetting::autocast: torchtitan on one GPU, Accelerate's DDP
// as hf-ddp) and gradients freed each step (StackSpec::grads_freed_each_step), each against values
// derived by hand from what the stacks' code does (stack.cpp cites it).

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

Plan one_gpu(Stack stack, Recompute recompute, int gpus = 1) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", gpus, 8192, gpus);
  p.training.stack = stack;
  p.parallel.recompute = recompute;
  p.parallel.reduce_dtype = default_reduce_dtype(p.training);
  return p;
}

// Llama 3 8B's linear layers (hidden 4096, 8 of 32 heads' width for K and V, FFN 14336): q, k, v,
// o, gate, up, down.
constexpr double kLinears[] = {4096.0 * 4096, 4096.0 * 1024, 4096.0 * 1024, 4096.0 * 4096, 4096.0 * 14336, 4096.0 * 14336, 4096.0 * 14336};

// torchtitan trains the fp32 module under autocast only without FSDP, TP, PP and CP
// (maybe_enable_amp: one GPU, or DDP over data_parallel_replicate_degree in v0.2.2); Accelerate's
// DDP always in a 16-bit precision with fp32 parameters; never in fp32 training, pure 16-bit
// training or another stack.
TEST(Autocast, OnlyWhereTheStackTrainsTheFp32Module) {
  EXPECT_TRUE(autocast_fp32_module(one_gpu(Stack::kFsdp2, Recompute::kNone)));
  EXPECT_TRUE(autocast_fp32_module(one_gpu(Stack::kFsdp2Compile, Recompute::kNone)));
  Plan replicated = one_gpu(Stack::kFsdp2, Recompute::kNone, 8);
  EXPECT_TRUE(autocast_fp32_module(replicated));
  replicated.parallel.zero_stage = 3;
  EXPECT_FALSE(autocast_fp32_module(replicated));
  replicated.parallel.shard_group = 1;  // sharded over groups of one: replicated again
  EXPECT_TRUE(autocast_fp32_module(replicated));
  EXPECT_TRUE(autocast_fp32_module(one_gpu(Stack::kHfDdp, Recompute::kNone, 8)));
  EXPECT_FALSE(autocast_fp32_module(one_gpu(Stack::kFsdp1, Recompute::kNone)));
  EXPECT_FALSE(autocast_fp32_module(one_gpu(Stack::kDeepspeed, Recompute::kNone)));
  Plan fp32 = one_gpu(Stack::kFsdp2, Recompute::kNone);
  fp32.training.precision = Precision::kFp32;
  EXPECT_FALSE(autocast_fp32_module(fp32));
  Plan pure = one_gpu(Stack::kHfDdp, Recompute::kNone);
  pure.training.master_weights = false;
  EXPECT_FALSE(autocast_fp32_module(pure));
}

// The module's parameters stay fp32 (4 bytes), their gradients are fp32 (4) and AdamW's moments
// fp32 (8): no master copy. The gradients are freed by zero_grad and made in backward.
TEST(Autocast, ModelStatesAreFloat32WithoutAMasterCopy) {
  const Plan plan = one_gpu(Stack::kFsdp2, Recompute::kSelective);
  const Estimate e = testing::checked_estimate(plan);
  ASSERT_TRUE(e.autocast);
  const double p = e.parameters;
  EXPECT_DOUBLE_EQ(e.memory.weights.value(), 4.0 * p);
  EXPECT_DOUBLE_EQ(e.memory.optimizer.value(), 8.0 * p);
  EXPECT_DOUBLE_EQ(e.memory.gradients_step_end.value(), 4.0 * p);
}

// Inductor (fsdp2-compile): each weight cast to bf16 in one kernel reading 4 bytes and writing 2,
// and its bf16 gradient cast back the same way; the inputs' casts fuse into the norms.
TEST(Autocast, CompiledCastsEachWeightAndItsGradientOnce) {
  const Plan plan = one_gpu(Stack::kFsdp2Compile, Recompute::kNone);
  const KernelRates rates(plan.cluster.gpu, Dtype::kBf16);
  double expected = 0;
  for (double n : kLinears) expected += 2.0 * rates.stream(6.0 * n);
  EXPECT_NEAR(plan_layer_cost(plan).autocast_casts, expected, 1e-12);
}

// Eager: ATen's casts at their measured rates (the cast op's forward is bf16 -> fp32, its backward
// fp32 -> bf16); besides the weights, Q, K and V each cast the fp32 norm output (3 copies), gate
// and up theirs (2), each input's gradient is cast back to fp32, and the fp32 stream's gradient is
// cast to bf16 for the attention and MLP branches (2). Selective and full recompute run the
// forward's casts again.
TEST(Autocast, EagerCastsTheWeightsTheLinearInputsAndTheBranchGradients) {
  Plan plan = one_gpu(Stack::kFsdp2, Recompute::kNone);
  const KernelRates rates(plan.cluster.gpu, Dtype::kBf16);
  const auto to_bf16 = [&](double n) { return rates.op(ElementwiseOp::kCast, n, true, 2.0); };
  const auto to_fp32 = [&](double n) { return rates.op(ElementwiseOp::kCast, n, false, 2.0); };
  const double th = 8192.0 * 4096.0;
  double weights_forward = 0, weights = 0;
  for (double n : kLinears) {
    weights_forward += to_bf16(n);
    weights += to_bf16(n) + to_fp32(n);
  }
  const double inputs_forward = 5.0 * to_bf16(th);
  const double casts = weights + inputs_forward + 5.0 * to_fp32(th) + 2.0 * to_bf16(th);
  EXPECT_NEAR(plan_layer_cost(plan).autocast_casts, casts, 1e-12);
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    plan.parallel.recompute = r;
    EXPECT_NEAR(plan_layer_cost(plan).autocast_casts, casts + weights_forward + inputs_forward, 1e-12) << recompute_name(r);
  }
}

// What a layer keeps grows by the fp32 stream: its input under recompute (4 bytes an element, not
// 2), and without recompute each linear's own bf16 copy of its input (Q, K, V and gate, up: 3 + 2
// copies where one each sufficed), the norms' fp32 inputs and each GEMM's bf16 copy of its weight
// (2 bytes a parameter).
TEST(Autocast, TheLayerKeepsTheFloat32StreamAndEachLinearsInputCopy) {
  Plan plan = one_gpu(Stack::kFsdp2, Recompute::kFull);
  Plan mixed = plan;  // FSDP over 8 ranks: its mixed precision, no autocast
  mixed.parallel.dp = 8;
  mixed.parallel.zero_stage = 3;
  mixed.gpus = 8;
  mixed.training.global_batch = 8;
  double linear = 0;
  for (double n : kLinears) linear += n;
  const double th = 8192.0 * 4096.0;
  EXPECT_DOUBLE_EQ(plan_layer_cost(plan).activation_bytes, 4.0 * th);
  EXPECT_DOUBLE_EQ(plan_layer_cost(mixed).activation_bytes, 2.0 * th);
  plan.parallel.recompute = mixed.parallel.recompute = Recompute::kNone;
  // Norm inputs 2 x (4 - 2) bytes more; attention's input 3 copies, the MLP's 2, for 1 and 1.
  EXPECT_DOUBLE_EQ(plan_layer_cost(plan).activation_bytes - plan_layer_cost(mixed).activation_bytes,
                   (2.0 * 2.0 + 2.0 * (2.0 + 1.0)) * th + 2.0 * linear);
}

// Eager autocast's cache holds the bf16 copy of every weight it cast until the autocast region
// ends: where the layers recompute their casts only the cache holds the layers' copies, 2 bytes
// for each of their linear weights at the forward's peak (the output layer's GEMM keeps its own
// copy for its backward: counted with the loss's tensors).
TEST(Autocast, EagerForwardHoldsTheCachedWeightCopies) {
  const Plan plan = one_gpu(Stack::kFsdp2, Recompute::kSelective);
  const Estimate e = testing::checked_estimate(plan);
  double linear = 0;
  for (double n : kLinears) linear += n;
  const double copies = 2.0 * 32.0 * linear;
  EXPECT_DOUBLE_EQ(e.memory.autocast_copies.value(), copies);
  EXPECT_DOUBLE_EQ(e.memory.gradients.value(), 0.0);  // the forward's peak: no gradient made yet
  Plan compiled = plan;
  compiled.training.stack = Stack::kFsdp2Compile;
  EXPECT_DOUBLE_EQ(testing::checked_estimate(compiled).memory.autocast_copies.value(), 0.0);  // Inductor casts in its graph
}

// zero_grad(set_to_none=True) frees the gradients: with one micro-batch a step the forward runs
// without them, with two the first micro-batch's are there through the second's forward. FSDP2's
// sharded fp32 gradients (4 bytes / 8 ranks); the activations are the same.
TEST(GradientsFreedEachStep, AreAbsentFromTheForwardOfAOneMicroBatchStep) {
  Plan one = testing::make_plan("llama3-8b", "dgx-h100", 8, 8192, 8);
  one.training.stack = Stack::kFsdp2;
  one.parallel.zero_stage = 3;
  one.parallel.recompute = Recompute::kSelective;
  one.parallel.reduce_dtype = default_reduce_dtype(one.training);
  Plan two = one;
  two.training.global_batch = 16;
  const Estimate e1 = testing::checked_estimate(one), e2 = testing::checked_estimate(two);
  ASSERT_EQ(e1.micro_batches, 1);
  ASSERT_EQ(e2.micro_batches, 2);
  EXPECT_DOUBLE_EQ(e1.memory.gradients_step_end.value(), 4.0 * e1.parameters / 8.0);
  EXPECT_DOUBLE_EQ(e2.memory.gradients.value(), e2.memory.gradients_step_end.value());
  EXPECT_LT(e1.memory.gradients.value(), e1.memory.gradients_step_end.value());
  EXPECT_NEAR(e2.memory.total.value() - e1.memory.total.value(), e2.memory.gradients.value() - e1.memory.gradients.value(), 1.0);
  // DeepSpeed keeps its gradient partitions through the step.
  Plan ds = one;
  ds.training.stack = Stack::kDeepspeed;
  ds.parallel.reduce_dtype = default_reduce_dtype(ds.training);
  const Estimate d = testing::checked_estimate(ds);
  EXPECT_DOUBLE_EQ(d.memory.gradients.value(), d.memory.gradients_step_end.value());
}

// The freed gradients' blocks stay with the caching allocator, which places a tensor only in a
// free block at least its size: over 64 ranks a block's sharded gradient (Llama 3 8B's block,
// 218,112,000 parameters x 4 bytes / 64 = 13.6 MB) is smaller than the smallest tensor the layers
// keep (K's output, 2 x 8192 tokens x 1024 x 2 bytes = 32 MiB), so all 32 stay reserved.
TEST(GradientsFreedEachStep, BlocksSmallerThanTheForwardsTensorsStayReserved) {
  Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 64, 8192, 128);
  plan.training.stack = Stack::kFsdp2;
  plan.parallel.zero_stage = 3;
  plan.parallel.micro_batch = 2;
  plan.parallel.recompute = Recompute::kSelective;
  plan.parallel.reduce_dtype = default_reduce_dtype(plan.training);
  const Estimate e = testing::checked_estimate(plan);
  ASSERT_EQ(e.micro_batches, 1);
  EXPECT_GE(e.memory.reserved.value() - e.memory.total.value(), 32.0 * 218112000.0 * 4.0 / 64.0);
}

// hf-ddp is PyTorch DDP: no ZeRO stage over more than one rank; Accelerate without FSDP runs it.
TEST(HfDdp, IsDataParallelOnly) {
  Plan plan = one_gpu(Stack::kHfDdp, Recompute::kNone, 8);
  EXPECT_TRUE(validate_plan(plan));
  plan.parallel.zero_stage = 1;
  const auto refused = validate_plan(plan);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/parallel/zero_stage: the hf-ddp stack is PyTorch DDP"), std::string::npos) << refused.error().message;
  Plan alone = one_gpu(Stack::kHfDdp, Recompute::kNone);  // on one GPU too: DDP has no ZeRO stage and no offload
  alone.parallel.zero_stage = 3;
  EXPECT_FALSE(validate_plan(alone));
  alone.parallel.zero_stage = 0;
  alone.parallel.offload_optimizer = Offload::kCpu;
  const auto offload = validate_plan(alone);
  ASSERT_FALSE(offload);
  EXPECT_NE(offload.error().message.find("/parallel/offload_optimizer: the hf-ddp stack is PyTorch DDP: no CPU offload"), std::string::npos);
}

// hf-fsdp2 is fsdp2's sharding with the Hugging Face module: the same parameters gathered and the
// same collectives, but LlamaRMSNorm's float32 ops (36 bytes an element forward, 92 backward, against
// the fused norm's 4 and 6) and its float32 copy kept; whole-layer recompute only.
TEST(HfFsdp2, IsFsdp2WithTheHuggingFaceModule) {
  Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 8192, 8);
  plan.parallel.zero_stage = 3;
  plan.parallel.recompute = Recompute::kFull;
  plan.training.stack = Stack::kFsdp2;
  plan.training.attention_kernel = AttentionImpl::kFlash2;
  plan.parallel.reduce_dtype = Dtype::kBf16;
  Plan hf = plan;
  hf.training.stack = Stack::kHfFsdp2;
  const LayerCost a = plan_layer_cost(plan), b = plan_layer_cost(hf);
  EXPECT_GT(b.forward, a.forward);
  EXPECT_GT(b.backward, a.backward);
  // A layer's full activations keep each norm's float32 copy beside its input: 2 x 4 bytes more.
  EXPECT_DOUBLE_EQ(b.full_activation_bytes - a.full_activation_bytes, 2.0 * 4.0 * 8192.0 * 4096.0);
  EXPECT_DOUBLE_EQ(testing::checked_estimate(hf).time.dp_comm_total.value(), testing::checked_estimate(plan).time.dp_comm_total.value());
  hf.parallel.recompute = Recompute::kSelective;
  const auto refused = validate_plan(hf);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/parallel/recompute: the hf-fsdp2 stack recomputes whole layers only"), std::string::npos);
}

// One stage with a tied table: the output layer's gradient of it is made at the backward's top
// and waits there for the embedding's share, so a one-micro-batch step of Llama 3.2 1B (tied,
// 128,256 x 2048) holds it, fp32 under autocast (4 bytes), from the loss's backward on: the
// backward's peak (this plan's: the loss's backward, 8K tokens of fp32 logits) holds 128256 x 2048 x 4
// bytes of gradient beside the activations.
TEST(GradientsFreedEachStep, ATiedTablesGradientIsMadeAtTheBackwardsTop) {
  Plan plan = testing::make_plan("llama3.2-1b", "dgx-h100", 1, 8192, 1);
  plan.training.stack = Stack::kFsdp2;
  plan.parallel.recompute = Recompute::kFull;
  plan.parallel.reduce_dtype = default_reduce_dtype(plan.training);
  ASSERT_TRUE(plan.model.tied_embeddings);
  const Estimate e = testing::checked_estimate(plan);
  ASSERT_TRUE(e.autocast);
  EXPECT_DOUBLE_EQ(e.memory.gradients.value(), 128256.0 * 2048.0 * 4.0);
}

}  // namespace
}  // namespace trainplan
