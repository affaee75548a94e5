#pragma once
// Internal to the cost model's estimate (estimate.cpp runs it): the state of one pipeline stage,
// the data-parallel traffic and optimizer step each stage adds (estimate_stage.cpp), and the
// helpers both use (estimate_support.cpp).

#include <string>
#include <vector>

#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel::estimate_detail {

// Ranks of each axis that share one node, with the layout TP (innermost), CP, PP, DP.
struct NodeShare {
  int tp = 1, cp = 1, pp = 1, dp = 1;
};

[[nodiscard]] NodeShare node_share(const ParallelConfig& p, int gpus_per_node);

// Adapter parameters of one layer on one TP rank of `tp` (estimate_support.cpp).
[[nodiscard]] double lora_params_per_layer(const ModelSpec& m, const LoraConfig& lora, int tp = 1);

// Parameter tensors of one layer on one rank of `tp` tensor-parallel and `ep` expert-parallel
// ranks (a mean over the layers where some are dense and some MoE): all of them, and those of at
// least `min_elements` elements (estimate_support.cpp).
struct LayerTensors {
  double all = 0, large = 0;
};
[[nodiscard]] LayerTensors layer_tensors(const ModelSpec& m, int tp, int ep, double min_elements);
// The same for one layer's LoRA adapters (A and B of each target, one pair per expert on MoE MLPs).
[[nodiscard]] LayerTensors lora_tensors_per_layer(const ModelSpec& m, const LoraConfig& lora, int tp, double min_elements);

// ZeRO-3 all-gathers per layer of `layer_params`: 1 for an FSDP unit; DeepSpeed's submodule
// fetches coalesced with its prefetch bucket (DataParallelSpec::gather_bucket_params), chunks of
// at least the largest linear layer, at most the bucket; one per gathered tensor
// (`large_tensors` of the layer) where the stack gathers tensor by tensor (gather_per_tensor).
[[nodiscard]] int gathers_per_layer(const StackSpec& stack, double layer_params, double largest_linear, double large_tensors);

// "%.1f GiB" without printf (the search formats a reason for each plan that does not fit).
[[nodiscard]] std::string gib_text(double bytes);
void append_gib(std::string& out, double bytes);  // gib_text(bytes) appended to out

// ZeRO-3 under a stack that keeps parameters gathered for reuse: the layers (and ends) of a stage
// kept gathered from their forward to their backward.
struct ReuseKept {
  int layers = 0;
  bool head = false, embedding = false;
};

// One pipeline stage's parameters, times and memory.
struct StageState {
  double dense = 0, expert = 0, trainable = 0, frozen_linear = 0;
  double forward = 0, backward = 0, grad_pass = 0, host_wait = 0, dp_copies = 0;
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0, overhead = 0;
  double grads_at_peak = 0;    // of `gradients`, alive at the peak (MemoryBreakdown::gradients)
  double autocast_copies = 0;  // of `activations`, autocast's 16-bit weight copies
  double total = 0, reserved = 0, required = 0;
  double idle_cache = 0;  // MemoryBreakdown::idle_cache
  double in_flight = 0;
  double host = 0;
  ReuseKept kept;  // ZeRO-3 layers kept gathered to their backward
};

// What a stage adds to its compute: data-parallel traffic (exposed and total) and the optimizer
// step, with any offload.
struct StageTail {
  double dp_exposed = 0, dp_total = 0, optimizer = 0, offload = 0;
  // Of dp_exposed, ZeRO-3's unit-by-unit gathers and reduce-scatters (timed against the GPU's
  // compute alone): what runs while the GPU waits for a host-bound stack's host.
  double dp_exposed_units = 0;
  // Of the hidden traffic, what runs while the compute stream is empty (a stack that syncs the
  // device before each gather): no compute to slow.
  double dp_idle_overlap = 0;
};

// What stage_tail_of reads of the estimate in progress.
struct StageTailInputs {
  const Plan& plan;
  const ParallelConfig& p;
  const TrainingConfig& tr;
  const ModelSpec& mdl;
  const HardwareProfile& hw;
  const StackSpec& stack;
  const std::vector<StageState>& st;
  const std::vector<int>& layers;
  const NodeShare& share;
  const ParameterCounts& pc;
  const LayerCost& lc;
  const EndsCost& ec;
  const StateWidths& w;
  const KernelRates& rates;
  LayerTensors tensors;  // a layer's parameter tensors, where the stack loops over them (else zero)
  bool lora, grad_op_units;
  bool bf16_optimizer;  // DeepSpeed's BF16_Optimizer at ZeRO-0 (estimate.cpp)
  double frozen_width, e, reduce_bytes, dense_layer, expert_layer, lora_layer, largest_linear, t, grad_width;
  double layer_gather_width;  // bytes per parameter of a gathered layer (fp8 all-gather: 1 for its linear weights)
  int stages, dense_shard, expert_shard, gpn, m;
  EstimateMemo* memo;  // EstimateOptions::memo (may be null)

  // collective_time, through the memo where there is one.
  [[nodiscard]] double collective(Collective kind, double bytes, const CollectiveGroup& g) const {
    return (memo ? memo->collective(hw, kind, Bytes(bytes), g) : collective_time(hw, kind, Bytes(bytes), g)).value();
  }
};

// Stage i's data-parallel traffic and optimizer step (estimate_stage.cpp).
[[nodiscard]] StageTail stage_tail_of(const StageTailInputs& in, int i);

}  // namespace trainplan::costmodel::estimate_detail
