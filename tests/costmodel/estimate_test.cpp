// Step time, throughput, run cost and the estimate document for fixed plans. Formulas from
// shared/notes/cost-model-references.md: pipeline bubble (p-1)/(v m) of the ideal time
// (Narayanan 2021, Sec. 2.2); MFU and HFU (PaLM, Chowdhery et al. 2022, App. B); checkpoint
// interval and expected wall time with failures (Young 1974; Daly 2006).

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

using testing::make_plan;
using testing::checked_estimate;

Plan sample_plan(const std::string& file) {
  auto req = load_plan_file(testing::source_path("samples/plans/" + file));
  if (!req) throw std::runtime_error(req.error().message);
  return Plan{req->name, req->model_ref, req->cluster_ref, req->model, req->cluster, req->gpus, req->training, req->parallel.fixed()};
}

double component_sum(const TimeBreakdown& t) {
  return (t.compute + t.recompute + t.tp_comm + t.cp_comm + t.ep_comm + t.pp_comm + t.bubble + t.dp_comm_exposed + t.dp_copies + t.host_wait +
          t.optimizer + t.offload)
      .value();
}

struct StepCase {
  const char* what;
  Plan plan;
  std::vector<const char*> nonzero;  // components this layout must have
};

std::vector<StepCase> step_cases() {
  std::vector<StepCase> cases;
  cases.push_back({"gpt3 sample: tp8 pp8 interleaved, full recompute", sample_plan("gpt3-175b-1024xa100.json"),
                   {"tp_comm", "pp_comm", "bubble", "recompute", "dp_comm_exposed"}});
  {
    Plan p = make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
    p.parallel.tp = 8; p.parallel.pp = 4; p.parallel.dp = 2; p.parallel.sequence_parallel = true;
    p.parallel.zero_stage = 1; p.parallel.schedule = Schedule::kInterleaved; p.parallel.virtual_stages = 2;
    p.parallel.recompute = Recompute::kSelective;
    cases.push_back({"llama3-70b tp8 pp4 dp2 interleaved", p, {"tp_comm", "pp_comm", "bubble", "recompute"}});
  }
  {
    Plan p = make_plan("llama3-8b", "dgx-h100", 16, 8192, 64);
    p.parallel.cp = 16; p.parallel.dp = 1; p.parallel.zero_stage = 3;
    cases.push_back({"llama3-8b cp16 across two nodes", p, {"cp_comm", "dp_comm_exposed"}});
  }
  {
    Plan p = make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 256);
    p.parallel.tp = 2; p.parallel.dp = 32; p.parallel.ep = 8; p.parallel.sequence_parallel = true; p.parallel.zero_stage = 1;
    p.parallel.recompute = Recompute::kFull;
    cases.push_back({"mixtral tp2 dp32 ep8", p, {"ep_comm", "tp_comm", "recompute"}});
  }
  {
    Plan p = make_plan("llama3-8b", "dgx-a100-40g", 16, 4096, 64);
    p.parallel.zero_stage = 3; p.parallel.offload_optimizer = Offload::kCpu;
    cases.push_back({"llama3-8b zero3 cpu offload over two nodes", p, {"offload", "optimizer", "dp_comm_exposed"}});
  }
  {
    Plan p = make_plan("llama3-8b", "dgx-h100", 16, 4096, 64);
    p.parallel.zero_stage = 3; p.parallel.shard_group = 8; p.parallel.offload_optimizer = Offload::kNvme;
    cases.push_back({"llama3-8b hybrid shard, nvme offload", p, {"offload", "optimizer"}});
  }
  {
    // DeepSpeed ZeRO-3 over 1024 ranks: its loops over the ranks keep the GPUs waiting.
    Plan p = make_plan("llama3-8b", "dgx-h100", 1024, 4096, 1024);
    p.training.stack = Stack::kDeepspeed;
    p.parallel.dp = 1024; p.parallel.zero_stage = 3; p.parallel.reduce_dtype = Dtype::kBf16; p.parallel.recompute = Recompute::kFull;
    cases.push_back({"llama3-8b deepspeed zero3 on 1024 ranks", p, {"host_wait", "dp_copies", "dp_comm_exposed", "recompute"}});
  }
  return cases;
}

double component(const TimeBreakdown& t, const std::string& name) {
  if (name == "compute") return t.compute.value();
  if (name == "recompute") return t.recompute.value();
  if (name == "tp_comm") return t.tp_comm.value();
  if (name == "cp_comm") return t.cp_comm.value();
  if (name == "ep_comm") return t.ep_comm.value();
  if (name == "pp_comm") return t.pp_comm.value();
  if (name == "bubble") return t.bubble.value();
  if (name == "dp_comm_exposed") return t.dp_comm_exposed.value();
  if (name == "dp_copies") return t.dp_copies.value();
  if (name == "host_wait") return t.host_wait.value();
  if (name == "optimizer") return t.optimizer.value();
  if (name == "offload") return t.offload.value();
  throw std::runtime_error("unknown component " + name);
}

TEST(StepTime, EqualsTheSumOfItsComponents) {
  for (const StepCase& c : step_cases()) {
    SCOPED_TRACE(c.what);
    const Estimate e = checked_estimate(c.plan);
    const TimeBreakdown& t = e.time;
    EXPECT_GT(t.step.value(), 0);
    EXPECT_GT(t.compute.value(), 0);
    EXPECT_NEAR(t.step.value(), component_sum(t), 1e-9 * t.step.value());
    for (const char* name : {"compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm_exposed", "dp_copies", "host_wait",
                             "optimizer", "offload"}) {
      EXPECT_GE(component(t, name), 0.0) << name;
    }
    for (const char* name : c.nonzero) EXPECT_GT(component(t, name), 0.0) << name;
    EXPECT_LE(t.dp_comm_exposed.value(), t.dp_comm_total.value() * (1 + 1e-12));
  }
}

// Narayanan 2021, Sec. 2.2: the bubble is (p-1)/(v m) of the ideal (bubble-free) time. A
// GPT with 96 layers and a small vocabulary keeps the stages balanced (the output layer adds
// ~3% to the last stage), so the ratio holds within a few per cent.
TEST(PipelineBubble, IsPMinusOneOverVmOfTheComputeTime) {
  const ModelSpec m = testing::gpt_model("gpt-96l", 96, 6144, 48, 2048);
  const int p = 4, micro_batches = 16;
  for (int v : {1, 2, 3, 4}) {
    Plan plan = make_plan(m, "dgx-a100-80g", p, 2048, micro_batches);
    plan.parallel.dp = 1;
    plan.parallel.pp = p;
    plan.parallel.virtual_stages = v;
    plan.parallel.schedule = v > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB;
    const Estimate e = checked_estimate(plan);
    ASSERT_EQ(e.micro_batches, micro_batches);
    const TimeBreakdown& t = e.time;
    const double work = (t.compute + t.recompute + t.tp_comm + t.cp_comm + t.ep_comm).value();
    const double expected = (p - 1.0) / (v * micro_batches);
    EXPECT_NEAR(t.bubble.value() / work / expected, 1.0, 0.04) << "v=" << v;
    // Exactly: the last stage holds the output layer, so its chunks take longer than the others
    // (more than 0.5%: uneven_chunks) and the bubble is the schedule run's makespan above that
    // stage's passes and the exchanges; at least the schedule's lower bound ((p - 1) chunks of
    // the stages before it, forward and backward, and their hops), and a little under (p-1)/v of
    // the mean stage, which counts the head.
    const auto& fw = e.pipeline.forward_seconds;
    const auto& bw = e.pipeline.backward_seconds;
    ASSERT_EQ(fw.size(), static_cast<std::size_t>(p));
    ASSERT_TRUE(e.pipeline.uneven_chunks());
    const double last = micro_batches * (fw.back() + bw.back());
    EXPECT_NEAR(t.bubble.value(), simulate_pipeline(e.pipeline)->makespan - last - t.pp_comm.value(), 1e-9 * t.bubble.value()) << "v=" << v;
    EXPECT_GE(t.bubble.value(), pipeline_makespan_bound(e.pipeline) - last - t.pp_comm.value() - 1e-12) << "v=" << v;
    const double mean_stage = (std::accumulate(fw.begin(), fw.end(), 0.0) + std::accumulate(bw.begin(), bw.end(), 0.0)) / p;
    EXPECT_LT(t.bubble.value(), (p - 1.0) / v * mean_stage) << "v=" << v;
  }
}

// Ring attention (Megatron-Core's default, stack megatron-te) overlaps each step's K/V transfer
// with attention on the previous chunk. Llama 3 8B, seq 8192, cp 4 in one node: T = 2048 tokens
// per rank, a K/V chunk of 2 * 2048 * 1024 * 2 B = 8 MiB takes ~23 us over NVLink (369 GB/s),
// attention on a 2048 x 2048 block (4 T^2 h = 69 GFLOP) ~100 us: hidden. Across two nodes with cp
// 16 (T = 512, 45 GB/s per GPU) it is not.
TEST(ContextParallel, RingTrafficIsHiddenInsideANodeAndExposedAcrossNodes) {
  Plan in_node = make_plan("llama3-8b", "dgx-h100", 8, 8192, 64);
  in_node.training.stack = Stack::kMegatronTe;
  in_node.parallel.cp = 4; in_node.parallel.dp = 2; in_node.parallel.zero_stage = 2;
  EXPECT_EQ(checked_estimate(in_node).time.cp_comm.value(), 0.0);
  Plan across = make_plan("llama3-8b", "dgx-h100", 16, 8192, 64);
  across.training.stack = Stack::kMegatronTe;
  across.parallel.cp = 16; across.parallel.dp = 1; across.parallel.zero_stage = 3;
  EXPECT_GT(checked_estimate(across).time.cp_comm.value(), 0.0);
}

// The executor's context parallelism (stack trainplan, executor/src/parallel/context_parallel.hpp)
// all-gathers K/V before attention and reduce-scatters their gradients after it, unoverlapped.
// Bytes one rank sends per step, by hand: Llama 3 8B (32 layers, kv_dim 1024), seq 8192, cp 4,
// micro-batch 1: T = 2048 tokens, K + V = 2 * 2048 * 1024 * 2 B = 8 MiB; forward all-gather and
// backward reduce-scatter each send (cp - 1) = 3 of them: 48 MiB per layer and micro-batch, x 32
// layers x the step's micro-batches. A ring sends the same K/V forward plus K/V and their
// gradients backward: 3/2 of that. Full recompute gathers once more.
TEST(ContextParallel, AllGatheredKvSendsTwoPassesPerLayerAndIsExposed) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 8192, 64);
  plan.parallel.cp = 4; plan.parallel.dp = 2; plan.parallel.zero_stage = 1; plan.parallel.micro_batch = 1;
  ASSERT_EQ(plan.training.stack, Stack::kTrainplan);
  const Estimate e = checked_estimate(plan);
  const double kv = 2.0 * 2048 * 1024 * 2;
  EXPECT_DOUBLE_EQ(e.communication.cp_sent.value(), 2.0 * 3 * kv * 32 * e.micro_batches);
  // Exposed: the gathers of every layer and micro-batch, more than the ring hides inside a node.
  const Seconds gather = collective_time(plan.cluster, Collective::kAllGather, Bytes(4 * kv), {4, 4});
  const Seconds scatter = collective_time(plan.cluster, Collective::kReduceScatter, Bytes(4 * kv), {4, 4});
  EXPECT_NEAR(e.time.cp_comm.value(), 32.0 * e.micro_batches * (gather + scatter).value(), 1e-9);

  Plan ring = plan;
  ring.training.stack = Stack::kMegatronTe;
  EXPECT_DOUBLE_EQ(checked_estimate(ring).communication.cp_sent.value(), 1.5 * e.communication.cp_sent.value());
  Plan full = plan;
  full.parallel.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(checked_estimate(full).communication.cp_sent.value(), 1.5 * e.communication.cp_sent.value());
  Plan none = plan;
  none.parallel.cp = 1; none.parallel.dp = 8;
  EXPECT_EQ(checked_estimate(none).communication.cp_sent.value(), 0.0);
}

// PyTorch's context parallelism with its default "allgather" rotation, fsdp2's (torchtitan): K/V
// all-gathered once in forward and once in backward, each gather behind the first block only, and
// the K/V gradients passed round the cp ranks in float32 (torch 2.11
// torch/distributed/tensor/experimental/_context_parallel/_attention.py). By hand, Llama 3 8B, seq
// 8192, cp 4, micro-batch 1: T = 2048, K + V = kv = 8 MiB in bf16; per layer and micro-batch the
// two gathers send (cp - 1) kv each and the gradients cp chunks of 2 kv (float32): 6 kv + 8 kv =
// 14 kv, against the ring's 9 kv and the all-gather-with-reduce-scatter's 6 kv.
TEST(ContextParallel, PyTorchsAllGatherRotationSendsTwoGathersAndFloat32GradientsRound) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 8192, 64);
  plan.training.stack = Stack::kFsdp2;
  plan.parallel.cp = 4; plan.parallel.dp = 2; plan.parallel.zero_stage = 3; plan.parallel.micro_batch = 1;
  ASSERT_EQ(stack_spec(Stack::kFsdp2).context_attention, ContextAttention::kAllGatherRotate);
  const Estimate e = checked_estimate(plan);
  const double kv = 2.0 * 2048 * 1024 * 2;
  const double per_layer = 14.0 * kv;
  EXPECT_DOUBLE_EQ(e.communication.cp_sent.value(), per_layer * 32 * e.micro_batches);
  Plan ring = plan;
  ring.parallel.cp_comm = ContextAttention::kRing;
  EXPECT_DOUBLE_EQ(checked_estimate(ring).communication.cp_sent.value(), 9.0 * kv * 32 * e.micro_batches);
  // Exposed: at least the last gradient chunk of every layer and micro-batch (it arrives after the
  // loop); at most both gathers and every chunk unhidden.
  const bool across = false;  // cp 4 inside one node of 8
  const Seconds last = send_recv_time(plan.cluster, Bytes(2.0 * kv), across);
  const Seconds gather = collective_time(plan.cluster, Collective::kAllGather, Bytes(4 * kv), {4, 4});
  const double layers = 32.0 * e.micro_batches;
  EXPECT_GE(e.time.cp_comm.value(), layers * last.value() * (1 - 1e-9));
  EXPECT_LE(e.time.cp_comm.value(), layers * (2 * gather.value() + 4 * last.value()) * (1 + 1e-9));
  // The executor cannot run it (it all-gathers and reduce-scatters), and says so.
  Plan fixed = plan;
  fixed.parallel.cp_comm = ContextAttention::kAllGatherRotate;
  fixed.training.stack = Stack::kTrainplan;
  bool said = false;
  for (const auto& why : executor::executor_limitations(fixed)) said = said || why.find("allgather_rotate") != std::string::npos;
  EXPECT_TRUE(said);
}

// A capacity factor caps the tokens each expert multiplies at ceil(cf x T x top_k / experts)
// (executor/src/parallel/moe.hpp): at or above 1 the balanced share fits, so the estimate is the dropless
// one; below 1 the experts do cf of the work. The document keeps both keys.
TEST(MixtureOfExperts, ACapacityFactorBelowOneCutsTheExpertsWorkAndTheDocumentKeepsIt) {
  Plan plan = make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 256);
  const Estimate dropless = checked_estimate(plan);
  Plan roomy = plan;
  roomy.model.moe->capacity_factor = 1.25;
  EXPECT_DOUBLE_EQ(checked_estimate(roomy).time.compute.value(), dropless.time.compute.value());
  Plan tight = plan;
  tight.model.moe->capacity_factor = 0.5;
  EXPECT_LT(checked_estimate(tight).time.compute.value(), 0.9 * dropless.time.compute.value());

  tight.model.moe->aux_loss_coeff = 0.02;
  const nlohmann::json doc = model_to_json(tight.model);
  EXPECT_EQ(doc.at("moe").at("capacity_factor"), 0.5);
  EXPECT_EQ(doc.at("moe").at("aux_loss_coeff"), 0.02);
  const auto back = parse_model(doc, "m.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->moe->capacity_factor, 0.5);
  EXPECT_EQ(back->moe->aux_loss_coeff, 0.02);
  EXPECT_EQ(model_to_json(plan.model).at("moe").count("capacity_factor"), 0u);  // dropless: no key
  EXPECT_EQ(plan.model.moe->aux_loss_coeff, 0.01);  // Switch Transformer's alpha by default
  nlohmann::json bad = doc;
  bad["moe"]["capacity_factor"] = -1;
  const auto refused = parse_model(bad, "m.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("/moe/capacity_factor"), std::string::npos) << refused.error().message;
}

// Expert parallelism's all-to-all bytes per step, by hand (executor/src/parallel/moe.cpp moves the same):
// Mixtral 8x7B (32 MoE layers, hidden 4096, 8 experts, top-2), seq 4096, micro-batch 1, bf16,
// ep 4: each layer and micro-batch routes 4096 x 2 token copies of 4096 x 2 B = 64 MiB, of which
// 3/4 go to other ranks with balanced routing, out (dispatch) and back (combine), forward and
// again backward: 4 x 48 MiB; plus the counts per expert before each dispatch, 8 experts x 8 B
// x 3/4 = 48 B. Full recompute dispatches and combines once more (with its counts).
TEST(MixtureOfExperts, ExpertParallelAllToAllBytesAreTheRoutedCopiesOtherRanksHold) {
  Plan plan = make_plan("mixtral-8x7b", "dgx-h100", 64, 4096, 256);
  plan.parallel.tp = 1; plan.parallel.cp = 1; plan.parallel.dp = 16; plan.parallel.pp = 4; plan.parallel.ep = 4; plan.parallel.zero_stage = 1; plan.parallel.micro_batch = 1;
  const Estimate e = checked_estimate(plan);
  const double copies = 4096.0 * 2 * 4096 * 2;  // bytes of one micro-batch's routed token copies
  const double per_layer = 4.0 * 0.75 * copies + 48.0;
  EXPECT_DOUBLE_EQ(e.communication.ep_sent.value(), per_layer * 8 * e.micro_batches);  // 32 layers over 4 stages
  Plan full = plan;
  full.parallel.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(checked_estimate(full).communication.ep_sent.value(), (per_layer + 2.0 * 0.75 * copies + 48.0) * 8 * e.micro_batches);
  Plan none = plan;
  none.parallel.ep = 1;
  EXPECT_EQ(checked_estimate(none).communication.ep_sent.value(), 0.0);
}

TEST(PipelineBubble, IsZeroWithoutPipelining) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  const Estimate e = checked_estimate(plan);
  EXPECT_EQ(e.time.bubble.value(), 0.0);
  EXPECT_EQ(e.time.pp_comm.value(), 0.0);
}

TEST(Throughput, FollowsFromStepTimeAndPeak) {
  for (const StepCase& c : step_cases()) {
    SCOPED_TRACE(c.what);
    const Estimate e = checked_estimate(c.plan);
    const Throughput& th = e.throughput;
    const double tokens = static_cast<double>(c.plan.training.global_batch) * c.plan.training.seq_len;
    EXPECT_NEAR(th.tokens_per_second, tokens / e.time.step.value(), 1e-9 * th.tokens_per_second);
    EXPECT_NEAR(th.tokens_per_second_per_gpu, th.tokens_per_second / c.plan.gpus, 1e-9 * th.tokens_per_second_per_gpu);
    const double peak = c.plan.cluster.gpu.peak_for(Dtype::kBf16).value();  // all cases train in bf16
    EXPECT_NEAR(th.mfu, th.model_tflops_per_gpu * 1e12 / peak, 1e-12);
    EXPECT_NEAR(th.hfu, th.hardware_tflops_per_gpu * 1e12 / peak, 1e-12);
    EXPECT_GT(th.mfu, 0.05);
    EXPECT_LT(th.mfu, 1.0);
    EXPECT_GE(th.hfu, th.mfu);
  }
}

// PaLM App. B: model FLOPs per token 6N + 12 L h s; the per-GPU model TFLOP/s must agree with
// model_flops_per_token times the tokens each GPU processes per second.
TEST(Throughput, ModelTflopsAgreeWithModelFlopsPerToken) {
  for (const StepCase& c : step_cases()) {
    SCOPED_TRACE(c.what);
    const Estimate e = checked_estimate(c.plan);
    const double expected = model_flops_per_token(c.plan.model, c.plan.training.seq_len) * e.throughput.tokens_per_second_per_gpu / 1e12;
    EXPECT_NEAR(e.throughput.model_tflops_per_gpu / expected, 1.0, 0.01);
  }
}

// Full recompute reruns each layer's forward in the backward pass (~ +33% compute, Korthikanti
// 2022 Table 4: 27.2 vs 19.6 ms per layer) and keeps only the layer inputs.
TEST(Recompute, FullRecomputeIsSlowerAndSmallerThanNone) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
  plan.parallel.tp = 8; plan.parallel.pp = 4; plan.parallel.dp = 2; plan.parallel.sequence_parallel = true; plan.parallel.zero_stage = 1;
  plan.parallel.recompute = Recompute::kNone;
  const Estimate none = checked_estimate(plan);
  plan.parallel.recompute = Recompute::kSelective;
  const Estimate selective = checked_estimate(plan);
  plan.parallel.recompute = Recompute::kFull;
  const Estimate full = checked_estimate(plan);
  EXPECT_GT(full.time.step.value(), none.time.step.value());
  EXPECT_LT(full.memory.activations.value(), none.memory.activations.value());
  EXPECT_EQ(none.time.recompute.value(), 0.0);
  EXPECT_GT(full.time.recompute.value(), selective.time.recompute.value());
  EXPECT_LE(selective.memory.activations.value(), none.memory.activations.value());
  EXPECT_LT(full.memory.activations.value(), selective.memory.activations.value());
  // Extra forward is at most the forward itself: < 1/2 of compute (backward is ~2x forward).
  EXPECT_LT(full.time.recompute.value(), 0.5 * full.time.compute.value());
  EXPECT_GT(full.throughput.hfu, full.throughput.mfu);
}

// H100 SXM datasheet: fp8 dense 1979 TFLOP/s, twice bf16's 989. Megatron-LM with Transformer
// Engine, the stack that trains a 70B in fp8 on 64 GPUs (its casts fused into the norms, fp8
// weights cast once per step); the executor's own casts are slower (the next tests, stack.cpp).
TEST(Precision, Fp8OnH100IsFasterThanBf16) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
  plan.parallel.tp = 8; plan.parallel.pp = 4; plan.parallel.dp = 2; plan.parallel.sequence_parallel = true; plan.parallel.zero_stage = 1;
  plan.parallel.recompute = Recompute::kSelective;
  plan.training.stack = Stack::kMegatronTe;
  const Estimate bf16 = checked_estimate(plan);
  plan.training.precision = Precision::kFp8;
  const Estimate fp8 = checked_estimate(plan);
  EXPECT_LT(fp8.time.step.value(), bf16.time.step.value());
  EXPECT_LT(fp8.time.compute.value(), bf16.time.compute.value());
  EXPECT_GT(fp8.throughput.tokens_per_second, bf16.throughput.tokens_per_second);
}

// An H100 whose fp8 peak is its bf16 peak, so that a GEMM takes as long in both and an fp8
// layer's extra time is its casts; and one Llama 3 8B sequence of 8192 tokens for `stack`.
HardwareProfile h100_with_fp8_at_bf16_peak() {
  HardwareProfile hw = testing::cluster("dgx-h100");
  hw.gpu.peak[static_cast<int>(Dtype::kFp8)] = hw.gpu.peak_for(Dtype::kBf16);
  return hw;
}
LayerSetting one_sequence_of_8192(Stack stack) {
  LayerSetting s;
  s.micro_batch = 1;
  s.seq_len = 8192;
  s.stack = stack;
  s.sharded_gradients = false;  // ZeRO-1
  return s;
}

// What one such layer takes in fp8 beyond bf16, forward and backward, under `stack` and `recipe`.
std::pair<double, double> fp8_extra(Stack stack, std::optional<Fp8Recipe> recipe = std::nullopt) {
  const HardwareProfile hw = h100_with_fp8_at_bf16_peak();
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s = one_sequence_of_8192(stack);
  const LayerCost bf16 = transformer_layer_cost(m, hw, s);
  s.precision = Precision::kFp8;
  s.fp8_recipe = recipe;
  const LayerCost fp8 = transformer_layer_cost(m, hw, s);
  return {fp8.forward - bf16.forward, fp8.backward - bf16.backward};
}

// Training in fp8 also moves the casts of each linear layer's operands (stack.hpp Fp8Casting),
// derived here by hand for one Llama 3 8B layer under Megatron-LM + Transformer Engine's delayed
// scaling, on an H100 whose fp8 peak is set to its bf16 peak so that the GEMMs take as long in
// both: forward, the Q/K/V and fc1 inputs written in fp8 by their LayerNormLinear's norm (net 1
// byte per element), the output projection's input and fc2's (Megatron's own SwiGLU writes bf16)
// cast and transposed (4 each); backward, the gradients of all four outputs cast and transposed
// (4 each; fc1's is the SwiGLU backward's bf16 output). Each cast is one kernel. The output layer
// stays in bf16: the ends cost the same in both.
TEST(Precision, Fp8AddsTheCastsOfEachLinearsOperands) {
  const HardwareProfile hw = h100_with_fp8_at_bf16_peak();
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s = one_sequence_of_8192(Stack::kMegatronTe);
  const LayerCost bf16 = transformer_layer_cost(m, hw, s);
  const EndsCost bf16_ends = ends_cost(m, hw, s);
  s.precision = Precision::kFp8;
  const LayerCost fp8 = transformer_layer_cost(m, hw, s);
  const EndsCost fp8_ends = ends_cost(m, hw, s);
  const KernelRates rates(hw.gpu, Dtype::kBf16);
  const double T = 8192, h = 4096, ffn = 14336, qkv = h + 2.0 * 1024;
  const double forward_casts = rates.stream(1 * T * h) + rates.stream(4 * T * h) + rates.stream(1 * T * h) + rates.stream(4 * T * ffn);
  const double backward_casts = rates.stream(4 * T * qkv) + rates.stream(4 * T * h) + rates.stream(4 * T * 2 * ffn) + rates.stream(4 * T * h);
  EXPECT_NEAR(fp8.forward - bf16.forward, forward_casts, 1e-3 * forward_casts);
  EXPECT_NEAR(fp8.backward - bf16.backward, backward_casts, 1e-3 * backward_casts);
  // The output layer at the real fp8 peak (twice bf16's) still takes its bf16 time.
  const HardwareProfile real = testing::cluster("dgx-h100");
  const EndsCost fp8_real = ends_cost(m, real, s);
  s.precision = Precision::kBf16;
  const EndsCost bf16_real = ends_cost(m, real, s);
  EXPECT_NEAR(fp8_real.head_forward, bf16_real.head_forward, 1e-12);
  EXPECT_NEAR(fp8_real.head_backward, bf16_real.head_backward, 1e-12);
  EXPECT_NEAR(fp8_ends.head_forward, bf16_ends.head_forward, 1e-12);
}

// The same layer under Transformer Engine's current scaling (Megatron's --fp8-recipe tensorwise,
// TE's Float8CurrentScalingQuantizer::quantize_impl): a cast is the tensor's amax (reads 2), the
// scale and the cast-transpose (reads 2, writes 2), three kernels and 6 bytes per element; a
// LayerNormLinear's norm takes the amax itself but writes bf16 (normalization.cpp
// FUSED_NORM_AMAX_FP8), so its output costs the scale and the cast-transpose, two kernels and 4.
// Forward: Q/K/V and fc1 from their norms (4), the output projection's input and fc2's (6);
// backward: every output's gradient (6). Weights stay cast once a step.
TEST(Precision, Fp8CurrentScalingTakesEachTensorsAmaxFirst) {
  const auto [extra_forward, extra_backward] = fp8_extra(Stack::kMegatronTe, Fp8Recipe::kCurrent);
  const KernelRates r(h100_with_fp8_at_bf16_peak().gpu, Dtype::kBf16);
  const double T = 8192, h = 4096, ffn = 14336, qkv = h + 2.0 * 1024;
  const double forward = r.stream(4 * T * h, 2) + r.stream(6 * T * h, 3) + r.stream(4 * T * h, 2) + r.stream(6 * T * ffn, 3);
  const double backward = r.stream(6 * T * qkv, 3) + r.stream(6 * T * h, 3) + r.stream(6 * T * 2 * ffn, 3) + r.stream(6 * T * h, 3);
  EXPECT_NEAR(extra_forward, forward, 1e-3 * forward);
  EXPECT_NEAR(extra_backward, backward, 1e-3 * backward);
  // The stack's own recipe stated is the default; torchtitan's float8 has no delayed scaling.
  EXPECT_EQ(fp8_extra(Stack::kMegatronTe, Fp8Recipe::kDelayed), fp8_extra(Stack::kMegatronTe));
  EXPECT_EQ(fp8_casting(stack_spec(Stack::kFsdp2), Fp8Recipe::kDelayed), nullptr);
  EXPECT_EQ(fp8_casting(stack_spec(Stack::kFsdp2), Fp8Recipe::kCurrent), &stack_spec(Stack::kFsdp2).fp8);
}

// The same layer under torch.compile with torchao's tensorwise casts (torchao's roofline,
// roofline_utils.py): separate Q, K, V and gate, up linears each cast the norm's output with the
// amax pass fused into the norm (4 bytes per element), the output projection's input takes its
// own amax pass (6) and the down projection's the activation's (4); backward, every output's
// gradient 6, gate's and up's from the SwiGLU backward 4; every weight 5 forward (amax and cast)
// and 3 backward (the transposed cast), every micro-batch.
TEST(Precision, Fp8UnderTorchaoCastsWeightsEveryMicroBatch) {
  const auto [extra_forward, extra_backward] = fp8_extra(Stack::kTorchCompile);
  const KernelRates r(h100_with_fp8_at_bf16_peak().gpu, Dtype::kBf16);
  const double T = 8192, h = 4096, kv = 1024, ffn = 14336;
  const double weights[] = {h * h, h * kv, h * kv, h * h, h * ffn, h * ffn, ffn * h};  // q k v o gate up down
  double forward = 3 * r.stream(4 * T * h) + r.stream(6 * T * h) + 2 * r.stream(4 * T * h) + r.stream(4 * T * ffn);
  double backward = r.stream(6 * T * h) + 2 * r.stream(6 * T * kv) + r.stream(6 * T * h) + 2 * r.stream(4 * T * ffn) + r.stream(6 * T * h);
  for (double w : weights) {
    forward += r.stream(5 * w);
    backward += r.stream(3 * w);
  }
  EXPECT_NEAR(extra_forward, forward, 1e-3 * forward);
  EXPECT_NEAR(extra_backward, backward, 1e-3 * backward);
}

// The executor's fp8 (executor/src/model/fp8.hpp; costmodel/src/compute/stack.cpp kTrainplanFp8), by hand for
// the same layer: every input 8 bytes per element (amax 2, cast 3, backward's transposed recast
// 3), the norm's output once for Q/K/V and once for gate/up; every output gradient 6 (amax 2, one
// cast into both layouts 4); every weight 5 forward and 3 backward; all at 0.41 of the stream rate
// (the executor's cast kernels as measured on the H200); and per trained weight element a float32
// add of 12 bytes at the stream rate. The kept inputs are the bf16 tensors: the layer keeps what
// it keeps in bf16.
TEST(Precision, TheExecutorsFp8CastsAtTheRateItsKernelsReach) {
  const HardwareProfile hw = h100_with_fp8_at_bf16_peak();
  const ModelSpec m = testing::model("llama3-8b");
  LayerSetting s = one_sequence_of_8192(Stack::kTrainplan);
  const LayerCost bf16 = transformer_layer_cost(m, hw, s);
  s.precision = Precision::kFp8;
  const LayerCost fp8 = transformer_layer_cost(m, hw, s);
  const KernelRates r(hw.gpu, Dtype::kBf16);
  const auto cast = [&](double bytes) { return r.stream(bytes) / 0.41; };
  const double T = 8192, h = 4096, kv = 1024, ffn = 14336;
  const double weights[] = {h * h, h * kv, h * kv, h * h, h * ffn, h * ffn, ffn * h};  // q k v o gate up down
  double forward = cast(8 * T * h) + cast(8 * T * h) + cast(8 * T * h) + cast(8 * T * ffn);  // q/k/v, o, gate/up, down inputs
  double backward = cast(6 * T * h) + 2 * cast(6 * T * kv) + cast(6 * T * h) + 2 * cast(6 * T * ffn) + cast(6 * T * h);
  for (double w : weights) {
    forward += cast(5 * w);
    backward += cast(3 * w) + r.stream(12 * w);
  }
  EXPECT_NEAR(fp8.forward - bf16.forward, forward, 1e-3 * forward);
  EXPECT_NEAR(fp8.backward - bf16.backward, backward, 1e-3 * backward);
  EXPECT_EQ(fp8.activation_bytes, bf16.activation_bytes);
}

// Transformer Engine keeps each linear layer's fp8 weight and its transpose for the step (cast on
// the first micro-batch): 2 bytes per linear parameter more than in bf16. Llama 3 70B over tp 4 and
// pp 8 (10 layers a stage): per layer Q, K, V, O = 2 * 8192^2 + 2 * 8192 * 1024 and the SwiGLU MLP
// 3 * 8192 * 28672, split four ways; the embedding, norms and output layer stay in bf16. torchao
// casts the weights every micro-batch and keeps no copy.
TEST(Precision, Fp8WeightsCachedByTransformerEngineAreCounted) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 64, 8192, 128);
  plan.parallel.tp = 4; plan.parallel.pp = 8; plan.parallel.dp = 2; plan.parallel.sequence_parallel = true; plan.parallel.zero_stage = 1;
  plan.training.stack = Stack::kMegatronTe;
  const Estimate bf16 = checked_estimate(plan);
  plan.training.precision = Precision::kFp8;
  const Estimate fp8 = checked_estimate(plan);
  const double per_layer = (2.0 * 8192 * 8192 + 2.0 * 8192 * 1024 + 3.0 * 8192 * 28672) / 4;
  EXPECT_NEAR(fp8.memory.weights.value() - bf16.memory.weights.value(), 2.0 * 10 * per_layer, 1.0);
  plan.training.stack = Stack::kTorchCompile;
  const Estimate compiled = checked_estimate(plan);
  plan.training.precision = Precision::kBf16;
  EXPECT_EQ(compiled.memory.weights.value(), checked_estimate(plan).memory.weights.value());
}

// A100 has no fp8 tensor cores (datasheet): the plan is invalid, and the error says why.
TEST(Precision, Fp8OnA100FailsValidation) {
  Plan plan = make_plan("llama3-8b", "dgx-a100-80g", 8, 4096, 64);
  plan.parallel.zero_stage = 3;
  ASSERT_TRUE(validate_plan(plan).ok());
  plan.training.precision = Precision::kFp8;
  auto valid = validate_plan(plan);
  ASSERT_FALSE(valid.ok());
  EXPECT_NE(valid.error().message.find("/training/precision"), std::string::npos) << valid.error().message;
  EXPECT_NE(valid.error().message.find("fp8"), std::string::npos) << valid.error().message;
  EXPECT_NE(valid.error().message.find("A100"), std::string::npos) << valid.error().message;
}

TEST(ValidatePlan, ProductOfAxesMustEqualGpusAndTheMessageNamesEveryFactor) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 64, 8192, 512);
  plan.parallel.tp = 8; plan.parallel.pp = 4; plan.parallel.dp = 4;
  auto valid = validate_plan(plan);
  ASSERT_FALSE(valid.ok());
  EXPECT_EQ(valid.error().message, "/parallel: tp(8) * cp(1) * pp(4) * dp(4) = 128 != gpus(64)");
}

TEST(ValidatePlan, StepsMustBeWithinTheRunAndItsCounts) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 8, 8192, 512);
  plan.parallel.dp = 8;
  plan.training.train_tokens = 1e6;  // one step is 512 * 8192 = 4.19 M tokens
  auto valid = validate_plan(plan);
  ASSERT_FALSE(valid.ok());
  EXPECT_EQ(valid.error().message,
            "/training/train_tokens: 1e+06 tokens is less than one optimizer step (global_batch(512) * seq_len(8192) = 4.194e+06 tokens)");
  // 2^20 micro-batches per step is the most; one more is refused (they overflowed the counts).
  plan.training.train_tokens = 1e18;
  plan.training.global_batch = 8 * ((INT64_C(1) << 20) + 1);
  valid = validate_plan(plan);
  ASSERT_FALSE(valid.ok());
  EXPECT_NE(valid.error().message.find("1048577 micro-batches per step, more than 1048576"), std::string::npos) << valid.error().message;
  plan.training.global_batch = 8 * (INT64_C(1) << 20);
  EXPECT_TRUE(validate_plan(plan).ok());
}

TEST(RunCost, WallTimeCoversComputeAndGpuHoursFollow) {
  for (const StepCase& c : step_cases()) {
    SCOPED_TRACE(c.what);
    const Estimate e = checked_estimate(c.plan);
    const RunCost& r = e.run;
    const double tokens_per_step = static_cast<double>(c.plan.training.global_batch) * c.plan.training.seq_len;
    // A long run's steps are sustained ones: each waits for the slowest GPU.
    EXPECT_NEAR(r.compute_time.value(), r.train_tokens / tokens_per_step * e.time.sustained_step.value(), 1e-9 * r.compute_time.value());
    EXPECT_GE(r.wall_time.value(), r.compute_time.value());
    EXPECT_GT(r.goodput, 0.0);
    EXPECT_LE(r.goodput, 1.0);
    EXPECT_NEAR(r.goodput, r.compute_time.value() / r.wall_time.value(), 1e-12);
    EXPECT_NEAR(r.gpu_hours, r.wall_time.in_hours() * c.plan.gpus, 1e-9 * r.gpu_hours);
    EXPECT_NEAR(r.cost_usd, r.gpu_hours * c.plan.cluster.price_per_gpu_hour_usd, 1e-9 * r.cost_usd);
    EXPECT_NEAR(r.job_mtbf.in_hours(), c.plan.cluster.gpu_mtbf_hours / c.plan.gpus, 1e-9);
  }
}

// Young 1974 / Daly 2006: checkpoint write time delta, job MTBF M, x = sqrt(delta / 2M):
// interval tau = sqrt(2 delta M) (1 + x/3 + x^2/9) - delta, and the expected wall time
// M e^{R/M} (e^{(tau + delta)/M} - 1) T / tau for restart time R and failure-free time T.
TEST(RunCost, CheckpointIntervalAndWallTimeFollowDaly) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 1024, 8192, 1024);
  const HardwareProfile& hw = plan.cluster;
  const double delta = 120.0;  // seconds to write the checkpoint
  const double checkpoint_bytes = delta * hw.checkpoint_write_bandwidth.value();
  const RunCost r = run_cost(plan, Seconds(10.0), checkpoint_bytes);
  const double M = hw.gpu_mtbf_hours * 3600.0 / 1024;
  const double x = std::sqrt(delta / (2 * M));
  const double tau = std::sqrt(2 * delta * M) * (1 + x / 3 + x * x / 9) - delta;
  EXPECT_NEAR(r.checkpoint_write_time.value(), delta, 1e-9);
  EXPECT_NEAR(r.checkpoint_interval.value(), tau, 1e-6 * tau);
  EXPECT_NEAR(r.checkpoint_interval.value() / std::sqrt(2 * delta * M), 1.0, 0.05);  // Young's first-order estimate
  const double T = plan.training.train_tokens / (1024.0 * 8192) * 10.0;
  const double R = hw.restart_time.value();
  const double wall = M * std::exp(R / M) * std::expm1((tau + delta) / M) * T / tau;
  EXPECT_NEAR(r.compute_time.value(), T, 1e-9 * T);
  EXPECT_NEAR(r.wall_time.value(), wall, 1e-9 * wall);
  EXPECT_GT(r.goodput, 0.8);
  EXPECT_LT(r.goodput, 1.0);
}

TEST(RunCost, MoreGpusMeanMoreFrequentFailures) {
  const Plan small = make_plan("llama3-8b", "dgx-h100", 64, 8192, 512);
  const Plan large = make_plan("llama3-8b", "dgx-h100", 8192, 8192, 8192);
  const RunCost a = run_cost(small, Seconds(5), 1e11), b = run_cost(large, Seconds(5), 1e11);
  EXPECT_GT(a.job_mtbf.value(), b.job_mtbf.value());
  EXPECT_GT(a.checkpoint_interval.value(), b.checkpoint_interval.value());
  EXPECT_GT(a.goodput, b.goodput);
}

TEST(EstimateDocument, HasEveryDocumentedKey) {
  const Plan plan = sample_plan("gpt3-175b-1024xa100.json");
  const nlohmann::json j = estimate_to_json(plan, checked_estimate(plan));
  EXPECT_EQ(j.at("schema"), "trainplan/estimate/v1");
  ASSERT_TRUE(j.contains("fits"));
  EXPECT_TRUE(j.at("fits").is_boolean());
  ASSERT_TRUE(j.contains("reasons"));
  EXPECT_TRUE(j.at("reasons").is_array());
  const std::pair<const char*, std::vector<const char*>> sections[] = {
      {"memory", {"weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "overhead_bytes",
                  "total_bytes", "capacity_bytes"}},
      {"time", {"step_seconds", "compute_seconds", "recompute_seconds", "tp_comm_seconds", "pp_comm_seconds", "dp_comm_exposed_seconds",
                "dp_copy_seconds", "host_wait_seconds", "bubble_seconds", "optimizer_seconds"}},
      {"throughput", {"tokens_per_second", "tokens_per_second_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"}},
  };
  for (const auto& [section, keys] : sections) {
    ASSERT_TRUE(j.contains(section)) << section;
    for (const char* key : keys) {
      ASSERT_TRUE(j.at(section).contains(key)) << section << "." << key;
      EXPECT_TRUE(j.at(section).at(key).is_number()) << section << "." << key;
    }
  }
  const Estimate e = checked_estimate(plan);
  EXPECT_DOUBLE_EQ(j.at("time").at("step_seconds").get<double>(), e.time.step.value());
  EXPECT_DOUBLE_EQ(j.at("memory").at("total_bytes").get<double>(), e.memory.total.value());
  EXPECT_DOUBLE_EQ(j.at("throughput").at("mfu").get<double>(), e.throughput.mfu);
  EXPECT_EQ(j.at("parallel").at("tp"), 8);
  EXPECT_EQ(j.at("gpus"), 1024);
}

// Llama 3 70B on one node with plain data parallelism needs 16 bytes per parameter (> 1 TB).
TEST(Fit, PlanBeyondCapacityDoesNotFitAndSaysByHowMuch) {
  Plan plan = make_plan("llama3-70b", "dgx-h100", 8, 8192, 64);
  plan.parallel.tp = 8;
  plan.parallel.dp = 1;
  plan.parallel.sequence_parallel = true;
  const Estimate e = checked_estimate(plan);
  EXPECT_FALSE(e.fits);
  EXPECT_GT(e.memory.total.value(), e.memory.capacity.value());
  ASSERT_FALSE(e.reasons.empty());
  EXPECT_NE(e.reasons.front().find("GiB >"), std::string::npos) << e.reasons.front();
  EXPECT_NE(e.reasons.front().find("80.0 GiB"), std::string::npos) << e.reasons.front();
  const nlohmann::json j = estimate_to_json(plan, e);
  EXPECT_EQ(j.at("fits"), false);
  EXPECT_EQ(j.at("reasons").size(), e.reasons.size());
}

TEST(Fit, SamplePlanFitsWithinCapacity) {
  const Estimate e = checked_estimate(sample_plan("gpt3-175b-1024xa100.json"));
  EXPECT_TRUE(e.fits);
  EXPECT_LE(e.memory.total.value(), e.memory.capacity.value());
  EXPECT_TRUE(e.reasons.empty() || e.reasons.front().find("GiB >") == std::string::npos);
}

// The expected largest of n standard normal draws, against its integral n x phi(x) Phi(x)^(n-1)
// (exactly 1/sqrt(pi) = 0.5642 for two draws; 1.4236 for eight, 3.2482 for 1024, 3.9714 for
// 16384 by numeric integration): Blom's approximation is within 5% at 2 and 1% from 8 draws on;
// none for one GPU.
TEST(Straggler, ExpectedMaxOfNormalsFollowsTheOrderStatistics) {
  EXPECT_EQ(expected_max_of_normals(1), 0.0);
  EXPECT_NEAR(expected_max_of_normals(2), 0.5642, 0.05 * 0.5642);
  EXPECT_NEAR(expected_max_of_normals(8), 1.4236, 0.01 * 1.4236);
  EXPECT_NEAR(expected_max_of_normals(1024), 3.2482, 0.005 * 3.2482);
  EXPECT_NEAR(expected_max_of_normals(16384), 3.9714, 0.005 * 3.9714);
}

// The sustained step waits for the slowest of the job's GPUs: the GPU-bound part of the step
// times hypot(gpu_speed_cv, step_jitter_cv) times the expected largest of N normal draws. For the
// presets' 1% and 0.2% on 1024 GPUs: hypot = 1.0198%, z(1024) = 3.23 (3.25 exactly).
TEST(Straggler, SustainedStepWaitsForTheSlowestGpu) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 1024, 8192, 1024);
  plan.parallel.zero_stage = 1;
  const Estimate e = checked_estimate(plan);
  const auto& t = e.time;
  const double gpu_bound = (t.step - t.tp_comm - t.cp_comm - t.ep_comm - t.pp_comm - t.dp_comm_exposed - t.offload).value();
  EXPECT_NEAR(t.straggler.value(), gpu_bound * std::hypot(0.01, 0.002) * expected_max_of_normals(1024), 1e-12);
  EXPECT_NEAR(expected_max_of_normals(1024), 3.234, 0.001);
  EXPECT_NEAR(t.sustained_step.value(), t.step.value() + t.straggler.value(), 1e-12);
  // One GPU waits for nobody.
  const Estimate one = checked_estimate(make_plan("llama3.2-1b", "dgx-h100", 1, 2048, 8));
  EXPECT_EQ(one.time.straggler.value(), 0.0);
}

// EstimateMemo: each distinct setting priced once, by the very functions it stands for; a call
// for another model bypasses it; settings that differ in any field are told apart.
TEST(EstimateMemo, PricesEachSettingOnceAsTheFunctionsDo) {
  const Plan plan = make_plan("llama3-8b", "dgx-h100", 16, 8192, 64);
  const LayerSetting s = layer_setting(plan);
  EstimateMemo memo;
  const LayerCost direct = transformer_layer_cost(plan.model, plan.cluster, s);
  for (int i = 0; i < 3; ++i) {
    const LayerCost memoised = memo.layer(plan.model, plan.cluster, s);
    EXPECT_EQ(memoised.forward, direct.forward);
    EXPECT_EQ(memoised.backward, direct.backward);
    EXPECT_EQ(memoised.activation_bytes, direct.activation_bytes);
    EXPECT_EQ(memo.ends(plan.model, plan.cluster, s).head_forward, ends_cost(plan.model, plan.cluster, s).head_forward);
  }
  EXPECT_EQ(memo.settings(), 1u);
  // Each field of the setting is part of the key.
  std::vector<LayerSetting> others(12, s);
  others[0].micro_batch = 2;
  others[1].tp = 2;
  others[2].sequence_parallel = !s.sequence_parallel;
  others[3].sharded_gradients = !s.sharded_gradients;
  others[4].recompute = Recompute::kFull;
  others[5].stack = Stack::kFsdp2;
  others[6].attention_mask = AttentionMask::kExplicit;
  others[7].lora.rank = 8;
  others[8].tp_group.per_node = 2;
  others[9].loss = LossKernel::kChunkedFused;
  others[10].dropout = !s.dropout;
  others[11].precision = Precision::kFp8;
  for (std::size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(same_setting(s, others[i])) << i;
    (void)memo.layer(plan.model, plan.cluster, others[i]);
  }
  EXPECT_EQ(memo.settings(), 1u + others.size());
  // Another model (by name) is priced without the memo: its own cost, nothing stored.
  const ModelSpec other = testing::model("llama3-70b");
  EXPECT_EQ(memo.layer(other, plan.cluster, s).forward, transformer_layer_cost(other, plan.cluster, s).forward);
  EXPECT_EQ(memo.settings(), 1u + others.size());
  // Collectives and pipeline splits, likewise.
  const CollectiveGroup g{16, 8, 1, 1};
  EXPECT_EQ(memo.collective(plan.cluster, Collective::kReduceScatter, Bytes(3e8), g).value(),
            collective_time(plan.cluster, Collective::kReduceScatter, Bytes(3e8), g).value());
  (void)memo.collective(plan.cluster, Collective::kReduceScatter, Bytes(3e8), g);
  (void)memo.collective(plan.cluster, Collective::kAllGather, Bytes(3e8), g);
  EXPECT_EQ(memo.collectives(), 2u);
  EXPECT_EQ(memo.partition(32, 4, 1.0, 2.5, 3.0), partition_layers(32, 4, 1.0, 2.5, 3.0));
}

// A memo bound to one profile is not used for another, even one put in the same object (and the
// second estimate the sustained clock makes is not served from the first profile's either).
TEST(EstimateMemo, AnotherProfileInTheSameObjectIsPricedAfresh) {
  Plan plan = make_plan("llama3-8b", "dgx-h100", 16, 8192, 64);
  plan.cluster.gpu.peak_clock_mhz = 1830;
  plan.cluster.gpu.sustained_clock_mhz = 1525;
  EstimateMemo memo;
  EstimateOptions options;
  options.memo = &memo;
  const Estimate first = estimate(plan, options);
  EXPECT_EQ(first.time.clock.value(), estimate(plan).time.clock.value());
  plan.cluster.name = "dgx-h100-held-lower";
  plan.cluster.gpu.sustained_clock_mhz = 1200;
  plan.cluster.gpu.calibration.gemm_time_scale = 1.3;
  const Estimate second = estimate(plan, options);
  const Estimate alone = estimate(plan);
  EXPECT_EQ(second.time.step.value(), alone.time.step.value());
  EXPECT_EQ(second.time.clock.value(), alone.time.clock.value());
  EXPECT_GT(second.time.clock.value(), first.time.clock.value());
}

}  // namespace
}  // namespace trainplan
