// Memory per GPU: model states (ZeRO accounting), the micro-batches a pipeline schedule keeps in
// flight, LoRA/QLoRA and optimizer offload. References: shared/notes/cost-model-references.md
// (ZeRO, Rajbhandari et al. 2020, Sec. 3-5 and Fig. 1; Korthikanti 2022 on 1F1B in-flight
// micro-batches), Megatron-LM's interleaved schedule, LoRA (Hu et al. 2021) and QLoRA
// (Dettmers et al. 2023).

#include <string>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/model.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

using testing::make_plan;
using testing::checked_estimate;

// ZeRO Fig. 1: Psi = 7.5B, N_d = 64, K = 12: baseline (2+2+K) Psi = 120 GB; P_os 4 Psi + K Psi/N_d
// = 31.4 GB; P_os+g 2 Psi + (2+K) Psi/N_d = 16.6 GB; P_os+g+p (2+2+K) Psi/N_d = 1.9 GB.
TEST(ZeroModelStates, MatchFigureOneOfTheZeroPaper) {
  const double psi = 7.5e9;
  const struct { int stage; double weights, gradients, optimizer, total_gb; } cases[] = {
      {0, 2 * psi, 2 * psi, 12 * psi, 120.0},
      {1, 2 * psi, 2 * psi, 12 * psi / 64, 31.40625},
      {2, 2 * psi, 2 * psi / 64, 12 * psi / 64, 16.640625},
      {3, 2 * psi / 64, 2 * psi / 64, 12 * psi / 64, 1.875},
  };
  for (const auto& c : cases) {
    const ModelStateBytes b = zero_model_states(psi, Precision::kBf16, OptimizerKind::kAdamW, c.stage, 64);
    EXPECT_DOUBLE_EQ(b.weights, c.weights) << "stage " << c.stage;
    EXPECT_DOUBLE_EQ(b.gradients, c.gradients) << "stage " << c.stage;
    EXPECT_DOUBLE_EQ(b.optimizer, c.optimizer) << "stage " << c.stage;
    EXPECT_NEAR((b.weights + b.gradients + b.optimizer) / 1e9, c.total_gb, 1e-9) << "stage " << c.stage;
  }
}

TEST(ZeroModelStates, OneReplicaIsNotSharded) {
  for (int stage = 0; stage <= 3; ++stage) {
    const ModelStateBytes b = zero_model_states(1e9, Precision::kBf16, OptimizerKind::kAdamW, stage, 1);
    EXPECT_DOUBLE_EQ(b.weights + b.gradients + b.optimizer, 16e9) << stage;
  }
}

// Bytes per parameter: 16-bit weights and gradients plus fp32 master weights (4) under mixed
// precision; AdamW keeps two fp32 moments (8), SGD one (4), 8-bit Adam two 1-byte moments (2),
// Adafactor a factored second moment (O(rows + cols), counted as 0 per parameter).
TEST(StateWidths, MatchOptimizerAndPrecisionAccounting) {
  const struct { Precision precision; OptimizerKind kind; double weights, gradients, optimizer; } cases[] = {
      {Precision::kFp32, OptimizerKind::kAdamW, 4, 4, 8},
      {Precision::kBf16, OptimizerKind::kAdamW, 2, 2, 12},  // ZeRO's K = 12
      {Precision::kFp16, OptimizerKind::kAdamW, 2, 2, 12},
      {Precision::kBf16, OptimizerKind::kSgdMomentum, 2, 2, 8},
      {Precision::kFp32, OptimizerKind::kSgdMomentum, 4, 4, 4},
      {Precision::kBf16, OptimizerKind::kAdam8bit, 2, 2, 6},
      {Precision::kBf16, OptimizerKind::kAdafactor, 2, 2, 4},
  };
  for (const auto& c : cases) {
    const StateWidths w = state_widths(c.precision, c.kind);
    SCOPED_TRACE(std::string(precision_name(c.precision)) + " " + optimizer_name(c.kind));
    EXPECT_DOUBLE_EQ(w.weights, c.weights);
    EXPECT_DOUBLE_EQ(w.gradients, c.gradients);
    EXPECT_DOUBLE_EQ(w.optimizer, c.optimizer);
  }
}

// One DGX H100 node, Llama 3 8B, pure data parallelism (dp = 8). With 16-bit gradient reduction
// the estimate's model states are exactly ZeRO's accounting for Psi = 8,030,261,248.
TEST(EstimateMemory, ModelStatesFollowZeroAccountingAtDp8) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  // The ZeRO paper's accounting (16-bit gradients) is DeepSpeed's, and PyTorch's with a bf16
  // reduction (gradients in the parameters' dtype); Megatron keeps an fp32 main_grad and the
  // trainplan executor fp32 gradients whatever the reduction dtype.
  plan.training.stack = Stack::kPytorchEager;
  plan.parallel.reduce_dtype = Dtype::kBf16;
  plan.parallel.recompute = Recompute::kSelective;
  const double psi = 8030261248.0;
  for (int stage = 0; stage <= 3; ++stage) {
    plan.parallel.zero_stage = stage;
    const Estimate e = checked_estimate(plan);
    const ModelStateBytes z = zero_model_states(psi, Precision::kBf16, OptimizerKind::kAdamW, stage, 8);
    EXPECT_NEAR(e.memory.weights.value() / z.weights, 1.0, 1e-12) << "stage " << stage;
    EXPECT_NEAR(e.memory.gradients.value() / z.gradients, 1.0, 1e-12) << "stage " << stage;
    EXPECT_NEAR(e.memory.optimizer.value() / z.optimizer, 1.0, 1e-12) << "stage " << stage;
  }
}

TEST(EstimateMemory, ShrinksMonotonicallyWithZeroStageAtDp8) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.recompute = Recompute::kSelective;
  double previous_total = 0, previous_states = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    plan.parallel.zero_stage = stage;
    const Estimate e = checked_estimate(plan);
    const double states = (e.memory.weights + e.memory.gradients + e.memory.optimizer).value();
    if (stage > 0) {
      EXPECT_LT(e.memory.total.value(), previous_total) << "stage " << stage;
      EXPECT_LT(states, previous_states) << "stage " << stage;
    }
    previous_total = e.memory.total.value();
    previous_states = states;
  }
  // Stage 0 (16 Psi + fp32 gradient buckets) does not fit in 80 GiB; stage 3 does.
  plan.parallel.zero_stage = 0;
  EXPECT_FALSE(checked_estimate(plan).fits);
  plan.parallel.zero_stage = 3;
  EXPECT_TRUE(checked_estimate(plan).fits);
}

// Pipeline schedules: 1F1B's first stage starts p micro-batches before its first backward, the
// last stage one (Narayanan 2021 Sec. 2.2; Korthikanti 2022 Sec. 4.2.3); GPipe runs all m
// forwards first.
Plan pipeline_plan(Schedule schedule, Recompute recompute, long long global_batch) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 4, 8192, global_batch);
  plan.parallel.dp = 1;
  plan.parallel.pp = 4;
  plan.parallel.schedule = schedule;
  plan.parallel.recompute = recompute;
  return plan;
}

TEST(PipelineInFlight, OneFOneBFirstStageHoldsPMicroBatches) {
  const Estimate e = checked_estimate(pipeline_plan(Schedule::kOneFOneB, Recompute::kNone, 8));
  ASSERT_EQ(e.micro_batches, 8);
  ASSERT_EQ(e.memory.worst_stage, 0) << "without recompute the first stage holds the most activations";
  EXPECT_DOUBLE_EQ(e.memory.micro_batches_in_flight, 4.0);
}

TEST(PipelineInFlight, OneFOneBLastStageHoldsOneMicroBatch) {
  // With full recompute a layer keeps only its input (2sbh), so the last stage's fp32 logits
  // (V = 128256; the executor's plain path, trainplan-reference) outweigh the first stage's extra
  // in-flight micro-batches.
  Plan plan = pipeline_plan(Schedule::kOneFOneB, Recompute::kFull, 8);
  plan.training.stack = Stack::kTrainplanReference;
  const Estimate e = checked_estimate(plan);
  ASSERT_EQ(e.memory.worst_stage, 3);
  EXPECT_DOUBLE_EQ(e.memory.micro_batches_in_flight, 1.0);
}

TEST(PipelineInFlight, OneFOneBWithFewerMicroBatchesThanStagesHoldsThemAll) {
  const Estimate e = checked_estimate(pipeline_plan(Schedule::kOneFOneB, Recompute::kNone, 2));
  ASSERT_EQ(e.micro_batches, 2);
  ASSERT_EQ(e.memory.worst_stage, 0);
  EXPECT_DOUBLE_EQ(e.memory.micro_batches_in_flight, 2.0);
}

TEST(PipelineInFlight, GpipeHoldsEveryMicroBatch) {
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    const Estimate gpipe = checked_estimate(pipeline_plan(Schedule::kGpipe, r, 8));
    EXPECT_DOUBLE_EQ(gpipe.memory.micro_batches_in_flight, 8.0) << recompute_name(r);
    EXPECT_GT(gpipe.memory.activations.value(), checked_estimate(pipeline_plan(Schedule::kOneFOneB, r, 8)).memory.activations.value());
  }
}

// Megatron-LM's interleaved schedule (megatron/core/pipeline_parallel/schedules.py): rank i runs
// (p - i - 1) * 2 + (v - 1) * p warm-up chunks, plus one in backward: for p = 4, v = 2, stage 0
// holds 11 chunks of half a stage = 5.5 stage-sized micro-batches.
TEST(PipelineInFlight, InterleavedFirstStageFollowsMegatronWarmup) {
  Plan plan = pipeline_plan(Schedule::kInterleaved, Recompute::kNone, 8);
  plan.parallel.virtual_stages = 2;
  const Estimate e = checked_estimate(plan);
  ASSERT_EQ(e.memory.worst_stage, 0);
  EXPECT_DOUBLE_EQ(e.memory.micro_batches_in_flight, ((4 - 0 - 1) * 2 + (2 - 1) * 4 + 1) / 2.0);
}

// LoRA (Hu et al. 2021, Sec. 4): an adapter on a d_in x d_out matrix has r (d_in + d_out)
// parameters. Llama 3 8B, r = 16 on q, k, v, o: 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024)).
TEST(Lora, TrainableParametersAreATinyFractionAndOptimizerShrinksWithThem) {
  Plan full = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  full.training.mode = TrainingMode::kFull;
  full.parallel.recompute = Recompute::kSelective;
  Plan lora = full;
  lora.training.mode = TrainingMode::kLora;
  lora.training.lora.rank = 16;
  const Estimate f = checked_estimate(full), l = checked_estimate(lora);
  const double trainable = 32.0 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024));
  EXPECT_DOUBLE_EQ(l.trainable_parameters, trainable);
  EXPECT_DOUBLE_EQ(l.parameters, f.parameters);
  EXPECT_LT(l.trainable_parameters / l.parameters, 0.002);
  EXPECT_DOUBLE_EQ(f.trainable_parameters, f.parameters);
  // Optimizer states (12 bytes per trainable parameter) scale with the trainable count.
  EXPECT_NEAR(l.memory.optimizer.value() / f.memory.optimizer.value(), trainable / f.parameters, 1e-12);
  EXPECT_NEAR(l.memory.optimizer.value(), 12.0 * trainable, 1e-3);
  EXPECT_LT(l.memory.gradients.value(), 0.01 * f.memory.gradients.value());
  EXPECT_LT(l.memory.total.value(), f.memory.total.value());
  // Frozen base weights stay in 16 bits: 2 bytes per parameter plus the adapters.
  EXPECT_NEAR(l.memory.weights.value(), 2.0 * (f.parameters + trainable), 1e-3);
}

// QLoRA (Dettmers et al. 2023, Sec. 3): NF4 with double quantization stores 4 + 0.127 bits per
// parameter of the frozen linear layers; embeddings, norms and the output layer stay 16-bit.
TEST(Lora, QloraStoresFrozenLinearWeightsInNf4) {
  Plan lora = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  lora.training.mode = TrainingMode::kLora;
  lora.parallel.recompute = Recompute::kSelective;
  Plan qlora = lora;
  qlora.training.mode = TrainingMode::kQlora;
  qlora.training.lora.base_format = QuantFormat::kNf4;
  const Estimate l = checked_estimate(lora), q = checked_estimate(qlora);
  EXPECT_LT(q.memory.weights.value(), 0.5 * l.memory.weights.value());
  const double linear = 32.0 * (41943040.0 + 176160768.0);  // attention + SwiGLU MLP per layer
  const double other = 8030261248.0 - linear;                // embedding, output, norms
  const double adapters = 13631488.0;
  EXPECT_NEAR(q.memory.weights.value() / (linear * 4.127 / 8 + 2 * other + 2 * adapters), 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(q.memory.optimizer.value(), l.memory.optimizer.value());
}

// LoRA and QLoRA under ZeRO-3 (engine.cpp, quantize.hpp PackedUnit): the frozen base is gathered
// and never reduced, so the communication buffers are the gathered units (with prefetch, the one
// running and the next) and the adapters' gathers and float32 reduce-scatter; QLoRA gathers a
// block as its packed NF4 bytes, besides the one block dequantised to bf16. By hand for Llama 3 8B
// on 8 GPUs (one stage): the largest unit is the token table or the output layer, 128256 x 4096;
// a block has 218103808 linear and 8192 norm parameters; rank 16 on q, k, v, o is 425984 adapter
// parameters a layer; cuBLAS's two 32 MiB workspaces.
TEST(Lora, ZeroThreeBuffersHoldTheGatheredBaseAndTheAdaptersReduceScatter) {
  Plan lora = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  lora.training.mode = TrainingMode::kLora;
  lora.parallel.zero_stage = 3;
  lora.parallel.recompute = Recompute::kSelective;
  Plan qlora = lora;
  qlora.training.mode = TrainingMode::kQlora;
  qlora.training.lora.base_format = QuantFormat::kNf4;
  const double table = 128256.0 * 4096, linear = 218103808.0, norms = 8192.0, adapters = 425984.0, workspaces = 2 * 32 * 1048576.0;
  const double adapter_buffers = adapters * (2 * 2 + 4);  // two bf16 gathers and a float32 reduce-scatter
  EXPECT_NEAR(checked_estimate(lora).memory.buffers.value(), 2 * table * 2 + adapter_buffers + workspaces, 1.0);
  const double packed = linear * 4.127 / 8 + norms * 2;
  EXPECT_NEAR(checked_estimate(qlora).memory.buffers.value(), linear * 2 + packed + (table - linear) * 2 + adapter_buffers + workspaces, 1.0);
}

TEST(Offload, CpuOptimizerOffloadLeavesNoOptimizerBytesOnTheGpu) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 1;
  plan.parallel.recompute = Recompute::kSelective;
  const Estimate on_gpu = checked_estimate(plan);
  plan.parallel.offload_optimizer = Offload::kCpu;
  const Estimate offloaded = checked_estimate(plan);
  EXPECT_GT(on_gpu.memory.optimizer.value(), 0);
  EXPECT_EQ(offloaded.memory.optimizer.value(), 0.0);
  EXPECT_EQ(on_gpu.memory.cpu_offload_per_node.value(), 0.0);
  // The node's 8 GPUs each put their ZeRO-1 shard (12 Psi / 8) in host memory, 12 Psi per node,
  // and each stages its shard of the largest unit's float32 gradient there for the CPU update:
  // the token table, 128256 x 4096, 4 bytes / 8 per GPU.
  EXPECT_NEAR(offloaded.memory.cpu_offload_per_node.value() / (12.0 * 8030261248.0 + 4.0 * 128256 * 4096), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(offloaded.memory.cpu_offload_per_gpu.value() * 8, offloaded.memory.cpu_offload_per_node.value());
  EXPECT_NEAR((on_gpu.memory.total - offloaded.memory.total).value(), on_gpu.memory.optimizer.value(), 1.0);
  EXPECT_GT(offloaded.time.offload.value(), 0);
  EXPECT_EQ(on_gpu.time.offload.value(), 0.0);
}

TEST(EstimateMemory, TotalIsTheSumOfItsParts) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
  plan.parallel.tp = 8;
  plan.parallel.pp = 4;
  plan.parallel.dp = 2;
  plan.parallel.sequence_parallel = true;
  plan.parallel.zero_stage = 1;
  plan.parallel.recompute = Recompute::kSelective;
  const Estimate e = checked_estimate(plan);
  const MemoryBreakdown& m = e.memory;
  // Allocated at the activation peak (it exceeds the optimizer step's temporaries here), then
  // the allocator's cached blocks, then the CUDA context and workspaces outside the allocator.
  EXPECT_NEAR(m.total.value(), (m.weights + m.gradients + m.optimizer + m.activations + m.buffers).value(), 1.0);
  EXPECT_GT(m.reserved.value(), m.total.value());
  EXPECT_DOUBLE_EQ(m.overhead.value(), plan.cluster.gpu.reserved_memory.value());
  EXPECT_NEAR(m.required.value(), (m.reserved + m.overhead).value(), 1.0);
  EXPECT_DOUBLE_EQ(m.capacity.value(), Bytes::gib(80).value());
}

}  // namespace
}  // namespace trainplan
