#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/schedule.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/costmodel/network.hpp"

#include "estimate_parts.hpp"

namespace trainplan::costmodel {

using namespace estimate_detail;

namespace {

// The plan's linear-layer weights are all-gathered in fp8 (TrainingConfig::fp8_all_gather on a
// stack that runs it, ZeRO-3 or FSDP's SHARD_GRAD_OP sharded over more than one data-parallel
// rank, not under LoRA): LayerSetting::fp8_gathered_weights.
bool gathers_fp8_weights(const Plan& plan) {
  const TrainingConfig& tr = plan.training;
  const ParallelConfig& p = plan.parallel;
  const StackSpec& stack = stack_spec(tr.stack);
  const bool lora = tr.mode == TrainingMode::kLora || tr.mode == TrainingMode::kQlora;
  // torchtitan turns the fp8 all-gather on only where FSDP shards over data-parallel ranks
  // (components/quantization/float8.py at v0.2.2: parallel_dims.dp_shard_enabled), not where it
  // shards over context-parallel ranks alone.
  return tr.fp8_all_gather && tr.precision == Precision::kFp8 && stack.fp8_all_gather && !lora && p.shard_size() > 1 &&
         (p.zero_stage == 3 || (p.zero_stage == 2 && stack.dp.grad_op_units));
}

}  // namespace

bool autocast_fp32_module(const Plan& plan) {
  const TrainingConfig& tr = plan.training;
  const ParallelConfig& p = plan.parallel;
  const bool lora = tr.mode == TrainingMode::kLora || tr.mode == TrainingMode::kQlora;
  const AutocastUse use = stack_spec(tr.stack).autocast;
  const bool unsharded = p.tp == 1 && p.pp == 1 && p.cp == 1 && p.ep == 1 && (p.zero_stage == 0 || p.shard_size() == 1);
  return (use == AutocastUse::kAlways || (use == AutocastUse::kUnsharded && unsharded)) && tr.precision != Precision::kFp32 && tr.master_weights &&
         !lora;
}

LayerSetting layer_setting(const Plan& plan) {
  const TrainingConfig& tr = plan.training;
  const ParallelConfig& p = plan.parallel;
  const NodeShare share = node_share(p, plan.cluster.nvlink_domain_gpus());
  LayerSetting s;
  s.micro_batch = p.micro_batch;
  s.seq_len = static_cast<double>(tr.seq_len);
  s.tp = p.tp;
  s.cp = p.cp;
  s.ep = p.ep;
  s.sequence_parallel = p.sequence_parallel && p.tp > 1;
  s.precision = tr.precision;
  s.dropout = tr.dropout;
  s.sharded_gradients = p.zero_stage >= 2;
  s.attention = tr.attention;
  s.attention_mask = tr.attention_mask;
  s.loss = tr.loss;
  s.attention_kernel = tr.attention_kernel;
  s.fp8_recipe = tr.fp8_recipe;
  s.fp8_gathered_weights = gathers_fp8_weights(plan);
  s.autocast = autocast_fp32_module(plan);
  s.cp_comm = p.cp_comm;
  s.stack = tr.stack;
  s.recompute = p.recompute;
  s.mode = tr.mode;
  s.lora = tr.lora;
  s.tp_group = {p.tp, share.tp};
  s.cp_group = {p.cp, share.cp};
  s.ep_group = {p.ep, std::min(p.ep, share.dp)};
  return s;
}

namespace {

// The large pool's page under expandable segments (CUDACachingAllocator.cpp kLargeBuffer, the
// segment_size_ of a large-pool ExpandableSegment): 20 MiB.
constexpr double kExpandablePageBytes = 20.0 * 1048576.0;

// Whether the plan fits (est.fits, est.tight), from est.memory and the host memory offload
// needs, and why not in est.reasons unless options.explain is off.
void judge_memory(const Plan& plan, const EstimateOptions& options, Estimate& est) {
  const MemoryBreakdown& mem = est.memory;
  const double capacity = mem.capacity.value(), required = mem.required.value();
  // The reason, appended piece by piece into one string (the search estimates thousands).
  const auto where = [&](std::string& out) {
    if (plan.parallel.pp > 1) {
      out += "stage ";
      out += std::to_string(mem.worst_stage);
      out += ' ';
    }
    out += "needs ";
  };
  if (required > capacity) {
    est.fits = false;
    if (options.explain) {
      std::string why;
      why.reserve(160);
      where(why);
      const std::pair<const char*, double> parts[] = {{"", required},
                                                      {" > ", capacity},
                                                      {" (weights ", mem.weights.value()},
                                                      {", gradients ", mem.gradients.value()},
                                                      {", optimizer ", mem.optimizer.value()},
                                                      {", activations ", mem.activations.value()},
                                                      {", allocator cache ", (mem.reserved - mem.total).value()}};
      for (const auto& [label, bytes] : parts) {
        why += label;
        append_gib(why, bytes);
      }
      why += ')';
      est.reasons.push_back(std::move(why));
    }
  } else if (required > (1.0 - options.memory_headroom) * capacity) {
    est.tight = true;
    if (options.explain) {
      char headroom[32];
      std::snprintf(headroom, sizeof headroom, "%.0f%%", 100 * options.memory_headroom);
      std::string why = "tight: ";
      where(why);
      append_gib(why, required);
      why += " of ";
      append_gib(why, capacity);
      why += ", within the ";
      why += headroom;
      why += " memory headroom";
      est.reasons.push_back(std::move(why));
    }
  } else if (required + mem.idle_cache.value() > (1.0 - options.memory_headroom) * capacity) {
    // Expandable segments: it fits only by giving back the idle blocks' pages when memory runs
    // short, each step (release_cached_blocks syncs the device, then pages are unmapped and mapped
    // again), a cost the step time does not count.
    est.tight = true;
    if (options.explain) {
      std::string why = "tight: ";
      where(why);
      append_gib(why, required);
      why += " with expandable segments, which unmap idle pages each step to fit; PyTorch's default allocator would need ";
      append_gib(why, required + mem.idle_cache.value());
      est.reasons.push_back(std::move(why));
    }
  }
  const ParallelConfig& p = plan.parallel;
  const HardwareProfile& hw = plan.cluster;
  if (p.offload_optimizer == Offload::kCpu || p.offload_params == Offload::kCpu) {
    if (mem.cpu_offload_per_node.value() > 0.9 * hw.cpu_memory.value()) {
      if (est.tight) {  // it does not fit at all: the reason is the host's memory
        est.tight = false;
        est.reasons.clear();
      }
      est.fits = false;
      if (options.explain) {
        est.reasons.push_back("offload needs " + gib_text(mem.cpu_offload_per_node.value()) + " of host memory per node > 90% of " +
                              gib_text(hw.cpu_memory.value()));
      }
    }
  }
}

}  // namespace

void explain_memory(const Plan& plan, const EstimateOptions& options, Estimate& est) {
  EstimateOptions explained = options;
  explained.explain = true;
  est.fits = true;
  est.tight = false;
  est.reasons.clear();
  judge_memory(plan, explained, est);
}

LayerCost plan_layer_cost(const Plan& plan) { return transformer_layer_cost(plan.model, plan.cluster, layer_setting(plan)); }

Estimate estimate(const Plan& plan, const EstimateOptions& options) {
  const ModelSpec& mdl = plan.model;
  const HardwareProfile& hw = plan.cluster;
  const TrainingConfig& tr = plan.training;
  const ParallelConfig& p = plan.parallel;
  const ParameterCounts pc = count_parameters(mdl);
  const bool lora = tr.mode == TrainingMode::kLora || tr.mode == TrainingMode::kQlora;
  const bool fp32 = tr.precision == Precision::kFp32;
  const double e = fp32 ? 4.0 : 2.0;
  const int gpn = hw.gpus_per_node;
  // Ranks of each axis that share one NVLink domain (a node, or an NVL72 rack of 18 nodes).
  const int domain = hw.nvlink_domain_gpus();
  const NodeShare share = node_share(p, domain);

  Estimate est;
  est.parameters = pc.total(mdl.layers);
  est.micro_batches = static_cast<int>(tr.global_batch / (static_cast<std::int64_t>(p.dp) * p.micro_batch));
  const int m = est.micro_batches;

  const LayerSetting s = layer_setting(plan);
  est.autocast = s.autocast;
  EstimateMemo* const memo = options.memo;
  const auto layer_cost = [&](const LayerSetting& x) { return memo ? memo->layer(mdl, hw, x) : transformer_layer_cost(mdl, hw, x); };
  LayerCost lc = layer_cost(s);
  const int max_stage_layers = (mdl.layers + p.pp - 1) / p.pp;
  const bool partial = p.recompute == Recompute::kFull && p.recompute_layers > 0 && p.recompute_layers < max_stage_layers;
  if (partial) {  // Megatron --recompute-num-layers: only some layers of each stage are recomputed
    LayerSetting none = s;
    none.recompute = Recompute::kNone;
    lc = blend(layer_cost(none), lc, static_cast<double>(p.recompute_layers) / max_stage_layers);
  }
  const EndsCost ec = memo ? memo->ends(mdl, hw, s) : ends_cost(mdl, hw, s);

  // --- per-stage layers, parameters and times ---
  const int stages = p.pp;
  const int model_chunks = stages * p.virtual_stages;
  std::vector<int> chunk_layers;
  if (p.ends_in_split) {
    chunk_layers = partition_ends_in_split(mdl.layers, model_chunks);
  } else if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
    chunk_layers = partition_with_ends(mdl.layers, stages, p.virtual_stages, p.first_stage_layers, p.last_stage_layers);
  } else {
    const double layer_seconds = lc.forward_total() + lc.backward_total();
    const double first_seconds = ec.embedding_forward + ec.embedding_backward, last_seconds = ec.head_forward + ec.head_backward;
    chunk_layers = memo ? memo->partition(mdl.layers, model_chunks, layer_seconds, first_seconds, last_seconds)
                        : partition_layers(mdl.layers, model_chunks, layer_seconds, first_seconds, last_seconds);
  }
  std::vector<int> layers(stages, 0);
  for (std::size_t c = 0; c < chunk_layers.size(); ++c) layers[c % stages] += chunk_layers[c];
  const double t = p.tp;
  const double h = static_cast<double>(mdl.hidden);
  // Per layer: what tensor parallelism splits (everything but the routed experts: attention,
  // norms, router, shared experts, dense layers' MLPs) and what expert parallelism splits too.
  // MLA's replicated down projections are counted as split, a small under-count under TP.
  const double dense_layer = (pc.attention + pc.norms + (pc.mlp - pc.routed_experts)) / t;
  const double expert_layer = mdl.moe ? pc.routed_experts / (t * p.ep) : 0.0;
  const double lora_layer = lora ? lora_params_per_layer(mdl, tr.lora, p.tp) : 0.0;
  const StackSpec& stack = stack_spec(tr.stack);
  // The largest linear layer of a block on one TP rank, for stacks that gather each submodule's
  // parameters on their own (DeepSpeed); not needed (0) for the others.
  double largest_linear = 0;
  if (stack.dp.gather_bucket_params > 0) {
    largest_linear = h * static_cast<double>(mdl.moe ? mdl.moe->expert_ffn_hidden : mdl.ffn_hidden) / t;
    for (const LinearShape& l : attention_linears(mdl)) largest_linear = std::max(largest_linear, l.in * l.out / t);
  }

  // Parameter tensors of a layer on this rank, for stacks that loop over them (DeepSpeed).
  const bool loops_over_ranks = stack.dp.loops_over_ranks();
  const LayerTensors tensors = loops_over_ranks ? layer_tensors(mdl, p.tp, p.ep, stack.dp.persistence_threshold_elements) : LayerTensors{};
  const LayerTensors adapters =
      loops_over_ranks && lora ? lora_tensors_per_layer(mdl, tr.lora, p.tp, stack.dp.persistence_threshold_elements) : LayerTensors{};
  // Tensors a layer gathers under ZeRO-3: LoRA's frozen base as in pretraining, its adapters too
  // where large enough.
  const double gathered = tensors.large + (lora ? adapters.large : 0.0);
  // torch.autocast on the fp32 module (autocast_fp32_module): weights, gradients and optimizer
  // states as in fp32 training, no master copy.
  const StateWidths w = s.autocast ? state_widths(Precision::kFp32, tr.optimizer, false) : state_widths(tr.precision, tr.optimizer, tr.master_weights);
  // ZeRO-3 under a stack that keeps parameters gathered for reuse (DeepSpeed's
  // stage3_max_reuse_distance, stack.hpp): between a layer's forward and its backward the trace
  // fetches the stage's later layers and its output layer twice (their forward, then their
  // backward), so the last k layers stay gathered, k the count of m = 0, 1, ... with
  // 2 (m x layer + head) < the distance; the output layer always (its backward follows its
  // forward), the embedding when the whole stage is within half the distance.
  const auto reuse_kept = [&](int stage_layers, bool first, bool last) {
    ReuseKept k;
    const double d = stack.dp.max_reuse_distance_params;
    if (p.zero_stage != 3 || d <= 0) return k;
    const double head = last ? pc.final_norm + (mdl.tied_embeddings ? pc.embedding : pc.output) / t : 0.0;
    const double layer = std::max(1.0, dense_layer + expert_layer);
    k.head = last;
    k.layers = layers_kept_for_reuse(d, layer, head, stage_layers);
    k.embedding = first && k.layers == stage_layers && 2.0 * (stage_layers * layer + head) < d;
    return k;
  };
  const double reduce_bytes = fp32 ? 4.0 : dtype_bytes(p.reduce_dtype);
  // DeepSpeed's BF16_Optimizer at ZeRO-0 in bf16 (stack.hpp bf16_optimizer_at_zero0): optimizer
  // states sharded as under ZeRO-1, an unsharded fp32 gradient buffer beside the bf16 gradients.
  // (fp8 too: DeepSpeed's engine runs bf16, the fp8 GEMMs are the script's modules'.)
  const bool bf16_optimizer = stack.bf16_optimizer_at_zero0 && p.zero_stage == 0 &&
                              (tr.precision == Precision::kBf16 || tr.precision == Precision::kFp8) && w.master;
  const bool shard_states = p.zero_stage >= 1 || bf16_optimizer;
  const double grad_width = std::max(w.gradients, reduce_bytes);  // grads are accumulated in the reduce dtype
  const int dense_shard = p.zero_stage == 3 ? p.shard_size() * p.cp : p.dp * p.cp;
  const int expert_shard = std::max(1, (p.zero_stage == 3 ? p.shard_size() : p.dp) / p.ep) * p.cp;
  const double frozen_width = tr.mode == TrainingMode::kQlora
                                  ? (tr.lora.base_format == QuantFormat::kNf4 ? 4.127 / 8.0 : 1.0 + 4.0 / h)
                                  : e;

  // fp8 all-gather (LayerSetting::fp8_gathered_weights): a layer's linear weights travel, and stay gathered, as
  // fp8 (1 byte), its norms in the parameter dtype; the embedding and the output layer stay 16-bit
  // (torchtitan's filter_fqns keeps the output layer out of Float8Linear; the embedding is no
  // linear layer). Bytes per parameter of a gathered layer.
  const bool fp8_gather = s.fp8_gathered_weights;
  const double layer_params = dense_layer + expert_layer;
  const double layer_norms = std::min(layer_params, pc.norms / t);
  const double layer_gather_width =
      fp8_gather && layer_params > 0 ? ((layer_params - layer_norms) * 1.0 + layer_norms * w.weights) / layer_params : w.weights;

  const KernelRates rates(hw.gpu, compute_dtype(tr.precision));
  // Gradients this rank keeps between micro-batches: the executor's fp32 buffer; Megatron's
  // main_grad in the reduce dtype (fp32 unless it reduces in 16 bits); PyTorch modules' param.grad
  // in the compute dtype (the reduce dtype once sharded).
  // FSDP's sharded gradient takes the sharded parameter's dtype: fp32 beside fp32 parameters,
  // the 16-bit dtype in pure 16-bit training (pytorch v2.8.0 _runtime_utils.py
  // _accumulate_sharded_grad casts to the flat parameter's dtype).
  const double sharded_grad_bytes = w.master ? stack.dp.sharded_grad_bytes : std::min(stack.dp.sharded_grad_bytes, w.gradients);
  const double stack_grad_width = stack.grads == GradAccumulation::kParamDtype && p.zero_stage < 2 ? w.gradients
                                  : p.zero_stage >= 2 && sharded_grad_bytes > 0                  ? std::max(sharded_grad_bytes, w.gradients)
                                  : stack.grads == GradAccumulation::kParamDtype || stack.main_grad_buffer ? grad_width
                                                                                                 : std::max(4.0, w.gradients);
  // Where the stack's data parallelism reduces every micro-batch (stack.hpp DataParallelSpec):
  // ZeRO-3, FSDP's SHARD_GRAD_OP, DeepSpeed's ZeRO-2.
  const bool sharded_dp = p.dp * p.cp > 1;
  const bool grad_op_units = p.zero_stage == 2 && stack.dp.grad_op_units;
  const bool reduce_each_micro_batch = p.zero_stage == 3 || grad_op_units || (p.zero_stage == 2 && stack.dp.zero2_every_micro_batch);
  // PyTorch DDP's buckets beside the gradients (DataParallelSpec::ddp_bucket_copies).
  const bool ddp_buckets = stack.dp.ddp_bucket_copies && p.zero_stage < 2 && sharded_dp && !bf16_optimizer;
  const double tokens = p.micro_batch * static_cast<double>(tr.seq_len) / p.cp;

  std::vector<StageState> st(stages);
  for (int i = 0; i < stages; ++i) {
    StageState& x = st[i];
    const bool first = i == 0, last = i == stages - 1;
    x.kept = reuse_kept(layers[i], first, last);  // ZeRO-3 layers kept gathered to their backward
    const ReuseKept& kept = x.kept;
    x.dense = layers[i] * dense_layer;
    x.expert = layers[i] * expert_layer;
    if (first) x.dense += pc.embedding / t;
    if (last) {
      x.dense += pc.final_norm + (mdl.tied_embeddings ? (stages > 1 ? pc.embedding / t : 0.0) : pc.output / t);
    }
    x.forward = layers[i] * lc.forward_total() + (first ? ec.embedding_forward : 0.0) + (last ? ec.head_forward : 0.0);
    x.backward = layers[i] * lc.backward_total() + (first ? ec.embedding_backward : 0.0) + (last ? ec.head_backward : 0.0);

    // Model states.
    const double base = x.dense + x.expert;
    if (lora) {
      x.trainable = layers[i] * lora_layer;
      x.frozen_linear = layers[i] * (pc.attention / t + (mdl.moe ? expert_layer : pc.mlp / t));  // quantized in QLoRA
      const double other = base - x.frozen_linear;
      const double frozen_bytes = x.frozen_linear * frozen_width + other * e;
      const double adapters_shard = shard_states ? static_cast<double>(dense_shard) : 1.0;
      x.weights = frozen_bytes / (p.zero_stage == 3 ? dense_shard : 1) + x.trainable * w.weights / (p.zero_stage == 3 ? dense_shard : 1);
      x.gradients = x.trainable * stack_grad_width / (p.zero_stage >= 2 ? dense_shard : 1);
      x.optimizer = x.trainable * w.optimizer / adapters_shard;
    } else {
      x.trainable = base;
      x.weights = x.dense * w.weights / (p.zero_stage == 3 ? dense_shard : 1) + x.expert * w.weights / (p.zero_stage == 3 ? expert_shard : 1);
      // FSDP2 without resharding after forward keeps the gathered layers, fp8 where it gathers fp8.
      if (fp8_gather && p.zero_stage == 2) x.weights -= layers[i] * layer_params * (w.weights - layer_gather_width);
      x.gradients = x.dense * stack_grad_width / (p.zero_stage >= 2 ? dense_shard : 1) +
                    x.expert * stack_grad_width / (p.zero_stage >= 2 ? expert_shard : 1);
      x.optimizer = x.dense * w.optimizer / (shard_states ? dense_shard : 1) + x.expert * w.optimizer / (shard_states ? expert_shard : 1);
      if (tr.precision == Precision::kFp8 && stack.fp8.weight_forward == 0 && p.zero_stage < 3) {
        // fp8 weights cached for the step (stack.hpp Fp8Casting: Transformer Engine casts each
        // linear layer's weight on the first micro-batch and keeps it and its transpose): 2 bytes
        // per parameter of the stage's linear layers.
        x.weights += 2.0 * (layers[i] * (pc.attention + pc.mlp - pc.routed_experts - pc.router) / t + x.expert);
      }
    }
    // BF16_Optimizer: each parameter's bf16 gradient and its slice of the fp32 buffer, both whole.
    if (bf16_optimizer) x.gradients = x.trainable * (w.gradients + 4.0);
    if (p.offload_optimizer != Offload::kNone) {
      // ZeRO-Offload keeps a float32 master copy with the moments on the host even in fp32
      // training (the device's weights are the compute copy), and stages each unit's float32
      // gradient shard there for the CPU update (the executor's buffer holds the largest unit's).
      const double master_in_states = fp32 ? 0.0 : 4.0;
      const double shard = shard_states ? static_cast<double>(dense_shard) : 1.0;
      const double largest_unit = std::max({lora ? lora_layer : dense_layer + expert_layer, first && !lora ? pc.embedding / t : 0.0,
                                            last && !lora && (!mdl.tied_embeddings || stages > 1) ? pc.embedding / t : 0.0});
      x.host += x.optimizer + x.trainable * (4.0 - master_in_states) / shard + 4.0 * largest_unit / shard;
      x.optimizer = 0;
    }
    if (p.offload_params != Offload::kNone) {
      x.host += x.weights;
      x.weights = 0;
    }

    // Each micro-batch's gradient accumulation pass (stack.hpp) and the host's kernel launches.
    // A table tied on one stage is the embedding's and the output layer's: it skips the pass when
    // the embedding's lookup adds into it too (its first-stage term), not for the loss alone.
    const bool one_table = mdl.tied_embeddings && stages == 1;
    const double in_gemm = (lc.gradients_in_gemm ? layers[i] * dense_layer : 0.0) + (first ? ec.fused_embedding_params : 0.0) +
                           (last && !one_table ? ec.fused_accumulation_params : 0.0);
    const double grads_local = std::max(0.0, x.trainable - in_gemm);
    // An add per parameter tensor (block_parameter_tensors: 9 for an unfused Llama block, 16 for GPT's;
    // the embedding's and the head's units counted as blocks); with the layers' gradients in the
    // GEMMs (and so the embedding's), one add is left: the head's final norm.
    const double units = layers[i] + (first ? 1 : 0) + (last ? 1 : 0);
    const double per_unit = block_parameter_tensors(mdl, stack.fused_qkv, stack.fused_gate_up);
    const double pass_kernels = lc.gradients_in_gemm ? (last ? 1.0 : 0.0) : units * per_unit;
    // BF16_Optimizer's update_hp_grads after each backward: per parameter tensor its bf16
    // gradient cast to fp32 (2 bytes read, 4 written) and added into the buffer (8 read, 4 written).
    if (bf16_optimizer) x.grad_pass = rates.stream(grads_local * 18.0, static_cast<int>(std::lround(units * per_unit * 2)));
    else switch (stack.grads) {
      case GradAccumulation::kFp32Buffer:  // 16-bit gradient read, fp32 buffer read and written
      case GradAccumulation::kFusedInGemmUnsharded:  // where it does not apply, or what it leaves (the final norm)
        x.grad_pass = pass_kernels > 0 ? rates.stream(grads_local * (e + 8.0), static_cast<int>(std::lround(pass_kernels))) : 0.0;
        break;
      case GradAccumulation::kParamDtype:
        if (reduce_each_micro_batch && sharded_dp && sharded_grad_bytes > 0) {
          // The reduced shard added into the kept sharded gradient from the second micro-batch on
          // (FSDP: cast to fp32 and added; DeepSpeed: added into its partition).
          x.grad_pass = (m - 1.0) / m * rates.stream(grads_local / dense_shard * 3.0 * sharded_grad_bytes, static_cast<int>(std::lround(units)));
        } else {  // param.grad += from the second micro-batch on
          x.grad_pass = (m - 1.0) / m * rates.stream(grads_local * 3.0 * w.gradients, static_cast<int>(std::lround(units * per_unit)));
        }
        break;
      case GradAccumulation::kFusedInGemm:
        break;
    }
    x.backward += x.grad_pass;
    // The stack's own passes over gathered parameters and reduced gradients, each micro-batch
    // (stack.hpp DataParallelSpec): copies into and out of all-gather buffers (twice under ZeRO-3,
    // forward and backward; once under SHARD_GRAD_OP), the gradient's copy into the reduce buffer
    // and pre-divide, and its cast to the reduce dtype.
    if (bf16_optimizer) {
      // Its reduction once per step, on any number of ranks (engine.py allreduce_gradients runs
      // whenever backward all-reduce is on): in a 16-bit reduce dtype the fp32 buffer cast to it
      // (4 bytes read, r written), averaged after the all-reduce (r + r), copied back (r read,
      // 4 written): 8 + 4r; in fp32 only the average in place (4 + 4).
      x.dp_copies = rates.stream(x.trainable * (reduce_bytes < 4.0 ? 8.0 + 4.0 * reduce_bytes : 8.0) / m, 3);
      x.backward += x.dp_copies;
    } else if (sharded_dp && !lora) {
      const double gathers = p.zero_stage == 3 ? 2.0 : grad_op_units ? 1.0 : 0.0;
      // fp8 all-gathers copy 1-byte parameters out of their buffer. The shard's cast before each
      // gather and the step's amax over the shards (torchao fsdp_utils.py fsdp_pre_all_gather,
      // precompute_float8_dynamic_scale_for_fsdp) read 1/dp of the parameters: not counted, as
      // the 16-bit copy-in of a shard is not.
      const double copy_scale = layer_gather_width / w.weights;
      double bytes = (gathers * (x.dense + x.expert - layers[i] * layer_params * (1.0 - copy_scale)) - kept.layers * layer_params * copy_scale) *
                     stack.dp.gather_copy_bytes;
      if (stack.dp.reduce_copy_bytes > 0) {
        const double cast = reduce_bytes == e ? 0.0 : stack.dp.reduce_cast_fused ? reduce_bytes - e : e + reduce_bytes;
        bytes += x.trainable * (stack.dp.reduce_copy_bytes + cast) / (reduce_each_micro_batch ? 1.0 : m);
      }
      x.dp_copies = bytes > 0 ? rates.stream(bytes, static_cast<int>(std::lround(2 * units))) : 0.0;
      x.backward += x.dp_copies;
    }
    // PyTorch DDP (DataParallelSpec::ddp_bucket_copies): every gradient into its bucket and the
    // average back, once a step (read and written each way), a kernel per parameter tensor each way.
    double ddp_copy_kernels = 0;
    if (ddp_buckets) {
      // LoRA: the adapters' A and B of each target in each block.
      ddp_copy_kernels = 2.0 * (lora ? layers[i] * 2.0 * static_cast<double>(tr.lora.targets.size()) : units * per_unit);
      const double copies = rates.stream(x.trainable * 4.0 * stack_grad_width, static_cast<int>(std::lround(ddp_copy_kernels))) / m;
      x.dp_copies += copies;
      x.backward += copies;
    }
    const double kernels = layers[i] * lc.kernels + (first || last ? ec.kernels : 0.0) + ddp_copy_kernels / m;
    const double host = kernels * stack.host_seconds_per_kernel + (stack.host_sync_per_micro_batch ? 2.0 * stack.host_seconds_per_kernel : 0.0);
    // The stack's loops over the shard group's ranks (stack.hpp DataParallelSpec), forward and
    // backward: per gathered tensor (each layer forward, again backward less the layers kept for
    // reuse; the ends as below), per gather (gathers_per_layer, as estimate_stage.cpp times them)
    // and per reduced gradient.
    double loops_forward = 0, loops_backward = 0, loops_backward_gathers = 0;
    if (p.zero_stage == 3 && sharded_dp && loops_over_ranks) {
      const double chunks = gathers_per_layer(stack, dense_layer + expert_layer, largest_linear, gathered);
      // The embedding and output tables are gathered where they pass the persistence threshold
      // (the embedding each way unless kept, the output layer once: kept to its backward).
      const double table = static_cast<double>(mdl.vocab) * h / t;
      const bool tables = table >= stack.dp.persistence_threshold_elements;
      const double ends_forward = tables ? (first ? 1.0 : 0.0) + (last ? 1.0 : 0.0) : 0.0;
      const double ends_backward = tables && first && !kept.embedding ? 1.0 : 0.0;
      // LoRA reduces only the adapters' gradients.
      const double reduced = lora ? layers[i] * adapters.all : layers[i] * tensors.all + (first ? 1.0 : 0.0) + (last ? 2.0 : 0.0);
      // A submodule whose parameters all persist is not fetched: no gather call for it.
      // A list all-gather adds a copy launch per rank (list_copy_host_seconds) to each tensor's.
      const double per_tensor = stack.dp.gather_host_seconds_per_rank_per_tensor + stack.dp.list_copy_host_seconds;
      const auto gathers = [&](double layer_passes, double ends) {
        return per_tensor * (layer_passes * gathered + ends) +
               stack.dp.gather_host_seconds_per_rank_per_call * ((gathered > 0 ? layer_passes * chunks : 0.0) + ends);
      };
      loops_forward = dense_shard * gathers(layers[i], ends_forward);
      loops_backward_gathers = dense_shard * gathers(layers[i] - kept.layers, ends_backward);
      loops_backward = loops_backward_gathers + dense_shard * stack.dp.reduce_host_seconds_per_rank_per_tensor * reduced;
    }
    if (stack.dp.sync_before_gather && loops_forward + loops_backward > 0) {
      // A device sync before each gather (DeepSpeed v0.3.16): the gathers' loops run with nothing
      // queued on the GPU, all of them a wait; the rest of the host's work (its launches, the
      // reductions' loops) still runs ahead of the GPU within the pass.
      const double f = x.forward / std::max(1e-30, x.forward + x.backward);
      x.host_wait = loops_forward + loops_backward_gathers + std::max(0.0, host * f - x.forward) +
                    std::max(0.0, host * (1.0 - f) + loops_backward - loops_backward_gathers - x.backward);
    } else if (loops_forward + loops_backward > 0) {
      // DeepSpeed's fetches sync the host to the GPU two at a time (partitioned_param_coordinator.py
      // __max_ongoing_fetch_events): the host cannot carry the forward's slack into the backward,
      // so each pass waits on its own (the launches shared by the passes' GPU time).
      const double f = x.forward / std::max(1e-30, x.forward + x.backward);
      x.host_wait = std::max(0.0, host * f + loops_forward - x.forward) + std::max(0.0, host * (1.0 - f) + loops_backward - x.backward);
    } else {
      x.host_wait = std::max(0.0, host - (x.forward + x.backward));
    }
    x.backward += x.host_wait;

    // Communication buffers, and cuBLAS workspaces (PyTorch's default on Hopper, 32 MiB per
    // handle, one for the forward thread and one for the autograd engine's).
    const double layer_linear = pc.attention / t + (mdl.moe ? expert_layer : pc.mlp / t);  // LoRA's frozen (QLoRA's quantised) part
    if (p.zero_stage == 3) {
      // The largest units gathered at once: a layer group, or the embedding (first stage) and the
      // output layer (last stage, untied or a tied copy).
      const double ends = std::max(first ? pc.embedding / t : 0.0,
                                   last && (!mdl.tied_embeddings || stages > 1) ? (mdl.tied_embeddings ? pc.embedding : pc.output) / t : 0.0);
      double unit = std::max({static_cast<double>(p.fsdp_wrap_min_params), dense_layer + expert_layer, ends});
      double gathers = p.prefetch ? 2.0 : 1.0;  // the unit running and the next one
      if (p.prefetch && stack.dp.gathered_units > 0) gathers = stack.dp.gathered_units;
      if (stack.dp.gather_bucket_params > 0) {
        // DeepSpeed: a submodule's parameters with the prefetch bucket, gathered into a flat buffer
        // and copied out of it (both alive until the copy-out ends).
        unit = std::max(largest_linear, std::min(stack.dp.gather_bucket_params, unit)) + (p.prefetch ? stack.dp.gather_bucket_params : 0.0);
        gathers = 2.0;
      }
      if (!lora) {
        // The gathered unit in bytes: a layer group in fp8 under the fp8 all-gather, the ends in 16 bits.
        const double unit_bytes =
            fp8_gather ? std::max(std::max(static_cast<double>(p.fsdp_wrap_min_params), layer_params) * layer_gather_width, ends * w.weights)
                       : unit * w.weights;
        x.buffers += gathers * unit_bytes + unit * reduce_bytes;
        // Layers kept gathered for reuse are alive together at the backward's start, the running
        // unit among them.
        x.buffers += std::max(0.0, kept.layers * (dense_layer + expert_layer) - unit) * w.weights;
      } else {
        // The frozen base is gathered in the compute dtype and never reduced; the adapters' units
        // are gathered and their gradients reduce-scattered (engine.cpp: a unit of their own).
        x.buffers += lora_layer * (gathers * w.weights + reduce_bytes);
        if (tr.mode == TrainingMode::kQlora) {
          // A block travels as its packed bytes (quantize.hpp PackedUnit): the running block's
          // while it is dequantised (into the block counted below), else the next one's; the
          // embedding and output layer are not quantised.
          const double packed = layer_linear * frozen_width + (dense_layer + expert_layer - layer_linear) * e;
          x.buffers += packed + std::max(0.0, ends - layer_linear) * e;
        } else {
          x.buffers += gathers * unit * e;
        }
      }
    } else if (ddp_buckets) {
      x.buffers += x.trainable * stack_grad_width;  // a bucket copy of every gradient (DataParallelSpec)
    } else if (p.dp * p.cp > 1 && stack.dp.buckets == 0) {
      x.buffers += 2.0 * 25.0 * 1048576.0;  // two 25 MiB gradient buckets in flight
    }
    // The stack's gradient bucket buffers (DeepSpeed's ipg buckets), in the reduce dtype.
    // BF16_Optimizer reduces its flat buffer instead (below, with the step's temporaries).
    if (p.dp * p.cp > 1 && stack.dp.buckets > 0 && !bf16_optimizer) x.buffers += stack.dp.buckets * std::min(stack.dp.bucket_params, x.trainable) * reduce_bytes;
    // The gathered input of a column-parallel GEMM, where the stack gathers it again in backward
    // (kept as an activation otherwise).
    if (s.sequence_parallel && !stack.sequence_parallel_keeps_gathered_input) x.buffers += tokens * h * e;
    if (stages > 1) x.buffers += 2.0 * tokens * h * e / (s.sequence_parallel ? t : 1.0);  // p2p send/recv
    x.buffers += 2.0 * 32.0 * 1048576.0;
    // QLoRA: a block's quantised linear weights dequantised into the compute dtype while it runs
    // forward or backward (the trainplan executor dequantises the whole block; engine.cpp).
    if (tr.mode == TrainingMode::kQlora && layers[i] > 0) x.buffers += layer_linear * e;

    // Activations: the allocated bytes at each peak of the step, and the allocator's slack
    // there (PyTorch's caching allocator keeps freed blocks for reuse; a request larger than
    // every cached block gets a new segment). See docs/cost-model.md, "Memory as the allocator sees it".
    x.in_flight = micro_batches_in_flight(p, i, m);
    const double saved = x.in_flight * layers[i] * lc.activation_bytes + (first ? x.in_flight * ec.embedding_activation_bytes : 0.0);
    const double layer_cache = lc.forward_transient_bytes;  // one layer's forward temporaries, cached
    // Peak in a layer's backward: its gradients (and, with full recompute, its rebuilt activations).
    const double layer_backward_peak = saved + lc.backward_transient_bytes + (p.recompute == Recompute::kFull ? lc.full_activation_bytes : 0.0);
    // Eager autocast's cache (LayerSetting::autocast): the 16-bit copy of every weight it cast
    // lives until the autocast region ends, after the forward and the loss (torch/amp/
    // autocast_mode.py __exit__: clear_autocast_cache); where the layers recompute their casts
    // only the cache holds them (LayerCost::autocast_cache_bytes; without recompute autograd
    // keeps them too and they are counted with the activations, as the output layer's are).
    const double autocast_copies = x.in_flight * layers[i] * lc.autocast_cache_bytes;
    // Phases of the step (each a max of allocated bytes beyond the model states, and with the
    // allocator's slack): the forward to the loss, the backward from its top, a layer's backward.
    double forward_peak = saved + autocast_copies, reserved_forward_peak = forward_peak + layer_cache;
    double backward_peak = layer_backward_peak, reserved_backward_peak = layer_backward_peak + layer_cache;
    if (last) {
      const double held = (p.schedule == Schedule::kGpipe && stages > 1 ? m : 1) * ec.head_activation_bytes;
      const double loss_forward = saved + held + ec.head_forward_transient_bytes + autocast_copies;
      const double loss_backward = saved + held + ec.head_backward_transient_bytes;
      // Saved tensors under 10 MiB share segments; once the loss's big blocks sit idle between
      // micro-batches, such tensors are carved from them and pin one for the next peak.
      const bool pinned = lc.smallest_saved_tensor_bytes >= 1048576.0 && lc.smallest_saved_tensor_bytes < 10.0 * 1048576.0;
      const double loss_slack = layer_cache + ec.head_idle_bytes + (pinned ? ec.largest_head_block_bytes : 0.0);
      forward_peak = std::max(forward_peak, loss_forward);
      reserved_forward_peak = std::max(reserved_forward_peak, loss_forward + layer_cache);
      backward_peak = std::max(backward_peak, loss_backward);
      reserved_backward_peak = std::max(reserved_backward_peak, loss_backward + loss_slack);
    }
    double activation_peak = std::max(forward_peak, backward_peak);
    double reserved_activation_peak = std::max(reserved_forward_peak, reserved_backward_peak);
    // The optimizer step's temporaries (activations are freed by then).
    double optimizer_temporaries = 0;
    if (p.offload_optimizer == Offload::kNone) {
      const double shard = shard_states ? static_cast<double>(dense_shard) : 1.0;
      // trainplan's fused AdamW (at::_fused_adamw_) needs no fp32 temporaries; its plain path does.
      if (stack.stack == Stack::kTrainplanReference) {  // per unit: g * c, sqrt and the division, fp32
        const double embedding_unit = (first || (last && mdl.tied_embeddings && stages > 1) || (last && !mdl.tied_embeddings))
                                          ? pc.embedding / t : 0.0;
        optimizer_temporaries = 3.0 * 4.0 * std::max(embedding_unit, lora ? lora_layer : dense_layer + expert_layer) / shard;
      } else if (bf16_optimizer) {  // the 16-bit copy of the whole fp32 buffer being all-reduced; the step needs no cast
        optimizer_temporaries = reduce_bytes < 4.0 ? reduce_bytes * x.trainable : 0.0;
      } else if (stack.grads == GradAccumulation::kParamDtype && !s.autocast) {  // master.grad = w.grad.float() for every tensor
        optimizer_temporaries = 4.0 * x.trainable / shard;
      }
    }
    const double states = x.weights + x.gradients + x.optimizer + x.buffers;
    x.activations = activation_peak;
    x.grads_at_peak = x.gradients;
    x.autocast_copies = autocast_copies;
    x.total = states + std::max(activation_peak, optimizer_temporaries);
    double held = states + std::max(reserved_activation_peak, optimizer_temporaries);
    if (stack.grads_freed_each_step && m == 1) {
      // zero_grad(set_to_none=True) freed the gradients (StackSpec::grads_freed_each_step): in a
      // step of one micro-batch the forward runs with none; backward makes them as the
      // activations go, the output layer's first (with the logits' gradient), a layer's as its
      // own activations are freed, so a layer's backward sees the stage's gradients only at the
      // bottom, beside one layer's activations.
      // The output layer's gradient (a tied table's on one stage too: it waits in the table's
      // accumulation until the embedding's backward adds its share) from the backward's top; the
      // untied embedding's only after the bottom layer.
      const double grad_shard = p.zero_stage >= 2 ? dense_shard : 1;
      const double head_grads = last ? (mdl.tied_embeddings ? pc.embedding : pc.output) / t * stack_grad_width / grad_shard : 0.0;
      const double embedding_grads = first && !(mdl.tied_embeddings && last) ? pc.embedding / t * stack_grad_width / grad_shard : 0.0;
      const double bottom = x.gradients - embedding_grads + lc.activation_bytes + lc.backward_transient_bytes +
                            (p.recompute == Recompute::kFull ? lc.full_activation_bytes : 0.0);
      const double backward_top = backward_peak + head_grads;
      const double others = states - x.gradients;
      const double step_end = x.gradients + optimizer_temporaries;
      // The freed gradients' blocks stay with the caching allocator, and the forward's tensors
      // reuse only blocks at least their size (c10/cuda/CUDACachingAllocator.cpp get_free_block:
      // the smallest free block that fits, split): a block smaller than the smallest tensor the
      // layers keep is still reserved at the forward's peak. A sharded gradient is one buffer
      // per unit (FSDP2's reduce-scatter output, whose views the parameters' gradients are:
      // _fsdp_collectives.py foreach_reduce; FSDP1's FlatParameter); an unsharded one a tensor
      // per parameter.
      const double smallest = lc.smallest_saved_tensor_bytes;
      const auto unusable = [&](double elements, double count) {
        const double block = elements * stack_grad_width;
        return block < smallest ? block * count : 0.0;
      };
      double unreused = 0;
      if (p.zero_stage >= 2 && dense_shard > 1) {
        unreused = unusable(dense_layer / dense_shard + expert_layer / expert_shard, layers[i]);
        if (first) unreused += unusable(pc.embedding / t / dense_shard, 1);
        if (last && !mdl.tied_embeddings) unreused += unusable(pc.output / t / dense_shard, 1);
      } else {
        for (const LinearShape& l : attention_linears(mdl)) unreused += unusable(l.in * l.out / t, layers[i]);
        const double mlp_matrix = (pc.mlp - pc.router) / t / (mdl.features().gated_mlp ? 3.0 : 2.0);
        unreused += unusable(mlp_matrix, (mdl.features().gated_mlp ? 3.0 : 2.0) * layers[i]) + unusable(h, 2.0 * layers[i]);
        if (first) unreused += unusable(pc.embedding / t, 1);
        if (last && !mdl.tied_embeddings) unreused += unusable(pc.output / t, 1);
      }
      x.total = others + std::max({forward_peak, backward_top, bottom, step_end});
      // They stay idle into the backward until its own gradients, the same sizes, take them.
      unreused = std::min(unreused, x.gradients);
      held = others + std::max({reserved_forward_peak + unreused, reserved_backward_peak + std::max(head_grads, unreused), bottom + layer_cache,
                                step_end});
      // The breakdown at the peak: the gradients alive then, the rest activations.
      if (forward_peak >= std::max({backward_top, bottom, step_end})) {
        x.grads_at_peak = 0;
        x.activations = forward_peak;
      } else if (backward_top >= std::max(bottom, step_end)) {
        x.grads_at_peak = head_grads;
        x.activations = backward_peak;
        x.autocast_copies = 0;
      } else if (bottom >= step_end) {
        x.grads_at_peak = x.gradients - embedding_grads;
        x.activations = bottom - x.grads_at_peak;
        x.autocast_copies = 0;
      } else {
        x.activations = optimizer_temporaries;
        x.autocast_copies = 0;
      }
    } else if (forward_peak < backward_peak) {
      x.autocast_copies = 0;  // gone by the backward's peak
    }
    if (tr.allocator == Allocator::kExpandableSegments) {
      // expandable_segments:True (pytorch c10/cuda/CUDACachingAllocator.cpp, the note above
      // struct ExpandableSegment): each stream's segment grows by pages of 20 MiB (the large
      // pool's; 2 MiB the small pool's), and a request that finds no memory unmaps every empty
      // page of the segments (release_cached_blocks) and maps it where the request goes. The
      // blocks the default allocator keeps idle above (a layer's cached temporaries, the loss's
      // blocks) then need no memory of their own at the peak: what is allocated does, and the
      // part-used last page of each stream's segment: the compute stream's and, under ZeRO-3,
      // the gathers' and the reduce-scatters' (FSDP's and DeepSpeed's streams allocate their
      // buffers). A run with memory to spare may still report more reserved: empty pages are
      // unmapped only when memory runs short.
      const double pages = x.total + (p.zero_stage == 3 ? 3.0 : 1.0) * kExpandablePageBytes;
      x.idle_cache = std::max(0.0, held - pages);
      x.reserved = pages;
    } else {
      // A profile's calibration (planner calibrate: the default allocator's reserve) may lower it
      // (the model over-counted); never below what is allocated.
      x.reserved = std::max(x.total, held + hw.gpu.calibration.allocator_extra_bytes);
    }
    x.overhead = hw.gpu.reserved_memory.value();
    x.required = x.reserved + x.overhead;
  }

  // Worst stage for memory; slowest stage for time.
  int worst = 0, slowest = 0;
  double stage_sum = 0;
  for (int i = 0; i < stages; ++i) {
    if (st[i].required > st[worst].required) worst = i;
    if (st[i].forward + st[i].backward > st[slowest].forward + st[slowest].backward) slowest = i;
    stage_sum += st[i].forward + st[i].backward;
  }
  const StageState& W = st[worst];
  est.trainable_parameters = lora ? mdl.layers * lora_params_per_layer(mdl, tr.lora) : est.parameters;

  MemoryBreakdown& mem = est.memory;
  mem.weights = Bytes(W.weights);
  mem.gradients = Bytes(W.grads_at_peak);
  mem.gradients_step_end = Bytes(W.gradients);
  mem.autocast_copies = Bytes(W.autocast_copies);
  mem.optimizer = Bytes(W.optimizer);
  mem.activations = Bytes(W.activations);
  mem.buffers = Bytes(W.buffers);
  mem.overhead = Bytes(W.overhead);
  mem.total = Bytes(W.total);
  mem.reserved = Bytes(W.reserved);
  mem.idle_cache = Bytes(W.idle_cache);
  mem.required = Bytes(W.required);
  mem.capacity = hw.gpu.hbm_capacity;
  mem.worst_stage = worst;
  mem.micro_batches_in_flight = W.in_flight;
  double host = 0;
  for (const auto& x : st) host = std::max(host, x.host);
  mem.cpu_offload_per_node = Bytes(host * gpn);
  mem.cpu_offload_per_gpu = Bytes(host);

  judge_memory(plan, options, est);

  // Per stage: data-parallel traffic (what overlaps and what is exposed) and the optimizer step.
  // Stages differ (the first holds the embedding, the last the output layer), so the step is set
  // by the stage whose compute plus these is longest, and the breakdown is that stage's.
  // Overlapped collectives are not free: while one runs, its kernel holds one SM per NCCL channel
  // and the compute it hides behind runs on the rest (nccl_sm_share: 16 of 132 SMs on an H100,
  // 12%; of 108 on an A100, 15%), so that compute loses that share of the overlapped time. arXiv
  // 2507.03114 (2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated
  // Distributed Deep Learning") measures 18.9% on average on A100 and H100 (up to
  // 40%, where a GEMM's last wave spills over); the HBM traffic of the collective is not charged.
  const double overlap_slowdown = nccl_sm_share(hw);
  const StageTailInputs tail_inputs{plan, p, tr, mdl, hw, stack, st, layers, share, pc, lc, ec, w, rates,
                                    LayerTensors{tensors.all, gathered}, lora, grad_op_units, bf16_optimizer, frozen_width, e, reduce_bytes, dense_layer, expert_layer, lora_layer,
                                    largest_linear, t, grad_width, layer_gather_width, stages, dense_shard, expert_shard, gpn, m, memo};
  const auto stage_tail = [&](int i) { return stage_tail_of(tail_inputs, i); };
  std::vector<StageTail> tails;
  tails.reserve(static_cast<std::size_t>(stages));
  int critical = slowest;
  double critical_time = -1;
  for (int i = 0; i < stages; ++i) {
    // Middle stages with as many layers hold the same units: computed once.
    int same = -1;
    for (int j = 0; j < i && same < 0; ++j) {
      if (layers[j] == layers[i] && j != 0 && i != stages - 1) same = j;
    }
    tails.push_back(same >= 0 ? tails[static_cast<std::size_t>(same)] : stage_tail(i));
    const StageTail& x = tails.back();
    // ZeRO-3's unit collectives run while the GPU waits for the host (as the step below counts them).
    const double busy = m * (st[i].forward + st[i].backward) + x.dp_exposed - std::min(m * st[i].host_wait, x.dp_exposed_units) +
                        overlap_slowdown * std::max(0.0, x.dp_total - x.dp_exposed - x.dp_idle_overlap) + x.optimizer + x.offload;
    if (busy > critical_time + 1e-15) {
      critical = i;
      critical_time = busy;
    }
  }
  const StageState& S = st[critical];
  const StageTail& tail = tails[static_cast<std::size_t>(critical)];
  // --- time per step ---
  TimeBreakdown& tm = est.time;
  const int L = layers[critical];
  tm.compute = Seconds(m * (L * (lc.forward + lc.backward) + (critical == 0 ? ec.embedding_forward + ec.embedding_backward : 0.0) +
                            (critical == stages - 1 ? ec.head_forward + ec.head_backward : 0.0) + S.grad_pass) +
                       overlap_slowdown * std::max(0.0, tail.dp_total - tail.dp_exposed - tail.dp_idle_overlap));
  tm.recompute = Seconds(static_cast<double>(m) * L * lc.recompute);
  tm.dp_copies = Seconds(m * S.dp_copies);
  tm.tp_comm = Seconds(static_cast<double>(m) * L * (lc.tp_comm_forward + lc.tp_comm_backward + lc.tp_comm_recompute));
  tm.tp_copies = Seconds(static_cast<double>(m) * L * lc.tp_copies);
  tm.autocast_casts = Seconds(m * (L * lc.autocast_casts + (critical == stages - 1 ? ec.head_autocast_casts : 0.0)));
  tm.cp_comm = Seconds(static_cast<double>(m) * L * lc.cp_comm);
  est.communication.cp_sent = Bytes(static_cast<double>(m) * *std::max_element(layers.begin(), layers.end()) * lc.cp_bytes);
  est.communication.ep_sent = Bytes(static_cast<double>(m) * *std::max_element(layers.begin(), layers.end()) * lc.ep_bytes);
  tm.ep_comm = Seconds(static_cast<double>(m) * L * lc.ep_comm);
  double p2p = 0, pass_comm = 0;
  if (stages > 1) {
    const bool across = static_cast<long long>(p.tp) * p.cp * p.pp > domain;
    // What a tensor-parallel rank sends (StackSpec::pipeline_send): what it holds (its sequence
    // shard under sequence parallelism, else the whole activation), or 1/t of it where the stack
    // splits it over the tensor-parallel group, with the all-gathers over that group that put it
    // back together (pipeline_split, exposed: the next pass takes the gathered tensor).
    const double held = tokens * h * e / (s.sequence_parallel ? t : 1.0);
    const PipelineSplit split = p.tp > 1 ? pipeline_split(stack.pipeline_send, s.sequence_parallel) : PipelineSplit{};
    const double activation = send_recv_time(hw, Bytes(split.activation ? held / t : held), across).value();
    const double gradient = send_recv_time(hw, Bytes(split.gradient ? held / t : held), across).value();
    const double gather = split.gathers > 0 ? tail_inputs.collective(Collective::kAllGather, held, s.tp_group) : 0.0;
    // After each pass a stage sends its output and receives its neighbour's: both at once
    // (Megatron's batch_isend_irecv), or one after the other (DeepSpeed's blocking send and recv).
    const double exchange = stack.pipeline_send_recv_together ? std::max(activation, gradient) : activation + gradient;
    // The timeline's hop: the exchange and the gather after the receive.
    p2p = exchange + gather;
    pass_comm = exchange + 0.5 * split.gathers * gather;
    tm.pp_comm = Seconds((2.0 * exchange + split.gathers * gather) * (static_cast<double>(p.virtual_stages) * m + stages - 1));
    tm.bubble = Seconds((stages - 1.0) / p.virtual_stages * stage_sum / stages);
  }

  // --- pipeline timeline ---
  PipelineTimeline& pl = est.pipeline;
  pl.stages = stages;
  pl.virtual_stages = p.virtual_stages;
  pl.micro_batches = m;
  pl.schedule = p.schedule;
  pl.p2p_seconds = p2p;
  pl.pass_comm_seconds = pass_comm;
  pl.chunk_layers = chunk_layers;
  pl.layer_forward_seconds = lc.forward_total();
  pl.layer_backward_seconds = lc.backward_total();
  pl.embedding_forward_seconds = ec.embedding_forward;
  pl.embedding_backward_seconds = ec.embedding_backward;
  pl.head_forward_seconds = ec.head_forward;
  pl.head_backward_seconds = ec.head_backward;
  pl.forward_seconds.reserve(st.size());
  pl.backward_seconds.reserve(st.size());
  for (const auto& x : st) {
    pl.forward_seconds.push_back(x.forward);
    pl.backward_seconds.push_back(x.backward);
  }

  // Chunks of unequal times (layers that do not split evenly over pp x v, the embedding and the
  // loss in the split, or the ends beside as many layers) hold the schedule up beyond (p - 1) / v
  // of a mean stage: the first micro-batch reaches each stage through the chunks before it, and the
  // last backward leaves it through them again, and in steady state a stage waits for a
  // neighbour's longer chunk. The bubble is what the schedule run (pipeline_makespan: the drawn
  // schedule's makespan) adds to the critical stage's passes and the exchanges charged above; in a
  // search's sweep, what its lower bound adds (pipeline_makespan_bound: the chains around each
  // stage's passes, without the steady-state waits).
  if (stages > 1 && pl.uneven_chunks()) {
    // (The run is never shorter than its bound: they add the same passes in other orders, and the
    // larger of the two keeps a rounding apart from breaking that; 0 from a run that could not be
    // made leaves the bound.)
    const double bound = pipeline_makespan_bound(pl);
    const double makespan = options.exact_pipeline ? std::max(bound, pipeline_makespan(pl)) : bound;
    tm.bubble = Seconds(std::max(0.0, makespan - m * (S.forward + S.backward) - tm.pp_comm.value()));
  }

  tm.dp_comm_exposed = Seconds(tail.dp_exposed);
  // While the GPU waits for the host, ZeRO-3's unit collectives (timed against the GPU's compute
  // alone) run: the wait is what the host takes beyond both. The other data-parallel reductions
  // were timed against a backward that includes the wait already.
  tm.host_wait = Seconds(std::max(0.0, m * S.host_wait - tail.dp_exposed_units));
  tm.dp_comm_total = Seconds(tail.dp_total);
  tm.optimizer = Seconds(tail.optimizer);
  tm.offload = Seconds(tail.offload);

  tm.step = tm.compute + tm.recompute + tm.tp_comm + tm.cp_comm + tm.ep_comm + tm.pp_comm + tm.bubble +
            tm.dp_comm_exposed + tm.dp_copies + tm.host_wait + tm.optimizer + tm.offload;
  // Every step of a synchronous job waits for its slowest GPU: the GPU-bound part of the step
  // (communication runs at the network's pace) stretched by the expected largest of N draws of
  // the GPUs' speed and step-time spread (HardwareProfile::gpu_speed_cv, step_jitter_cv).
  const double spread = std::hypot(hw.gpu_speed_cv, hw.step_jitter_cv);
  // (The host's wait is not the GPUs' spread either.)
  const double gpu_bound = (tm.step - tm.tp_comm - tm.cp_comm - tm.ep_comm - tm.pp_comm - tm.dp_comm_exposed - tm.host_wait - tm.offload).value();
  tm.straggler = Seconds(std::max(0.0, gpu_bound) * spread * expected_max_of_normals(plan.gpus));
  // Hours of full load hold the SM clock at what the power limit allows (GpuSpec::clocks):
  // tensor-core work (GEMMs, attention) slows by peak / sustained, memory-bound work does not
  // (the HBM clock is its own). The same plan again with those kernels' times scaled; the
  // difference is its own line.
  if (const double slowdown = hw.gpu.clock_slowdown(); slowdown > 1.0) {
    Plan slowed = plan;
    GpuSpec& g = slowed.cluster.gpu;
    g.calibration.gemm_time_scale *= slowdown;
    g.calibration.attention_time_scale *= slowdown;
    g.sustained_clock_mhz = g.peak_clock_mhz;
    EstimateOptions at_sustained_clock = options;
    at_sustained_clock.memo = memo && memo->serves(mdl, hw) ? &memo->sustained() : nullptr;
    tm.clock = Seconds(std::max(0.0, estimate(slowed, at_sustained_clock).time.step.value() - tm.step.value()));
  }
  tm.sustained_step = tm.step + tm.clock + tm.straggler;

  // --- throughput ---
  const double step_tokens = static_cast<double>(tr.global_batch) * tr.seq_len;
  Throughput& th = est.throughput;
  th.tokens_per_second = step_tokens / tm.step.value();
  th.tokens_per_second_per_gpu = th.tokens_per_second / plan.gpus;
  const double per_token_model = (mdl.layers * lc.model_flops + ec.head_model_flops) * t / tokens;
  const double per_token_hw = (mdl.layers * lc.hardware_flops + ec.head_model_flops) * t / tokens;
  const double peak = hw.gpu.peak_for(compute_dtype(tr.precision)).value();
  th.model_flops_per_token = per_token_model;
  th.model_tflops_per_gpu = per_token_model * th.tokens_per_second_per_gpu / 1e12;
  th.hardware_tflops_per_gpu = per_token_hw * th.tokens_per_second_per_gpu / 1e12;
  th.mfu = th.model_tflops_per_gpu * 1e12 / peak;
  th.hfu = th.hardware_tflops_per_gpu * 1e12 / peak;

  // --- whole run ---
  const double trainable = est.trainable_parameters;
  // A checkpoint holds what resuming needs: the master weights (the weights themselves where there
  // is no separate master) and optimizer states (LoRA: adapters only).
  est.run = run_cost(plan, tm.sustained_step, trainable * (w.optimizer + (w.master ? 0.0 : w.weights)));
  return est;
}

}  // namespace trainplan::costmodel
