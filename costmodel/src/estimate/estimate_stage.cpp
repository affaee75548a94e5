// One pipeline stage's data-parallel traffic (what overlaps and what is exposed) and its
// optimizer step (estimate_parts.hpp stage_tail_of), as estimate() charges them.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "estimate_parts.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel::estimate_detail {

StageTail stage_tail_of(const StageTailInputs& in, int i) {
  const Plan& plan = in.plan;
  const ParallelConfig& p = in.p;
  const TrainingConfig& tr = in.tr;
  const ModelSpec& mdl = in.mdl;
  const HardwareProfile& hw = in.hw;
  const StackSpec& stack = in.stack;
  const std::vector<StageState>& st = in.st;
  const std::vector<int>& layers = in.layers;
  const NodeShare& share = in.share;
  const ParameterCounts& pc = in.pc;
  const LayerCost& lc = in.lc;
  const EndsCost& ec = in.ec;
  const StateWidths& w = in.w;
  const KernelRates& rates = in.rates;
  const bool lora = in.lora, grad_op_units = in.grad_op_units, bf16_optimizer = in.bf16_optimizer;
  const bool shard_states = p.zero_stage >= 1 || bf16_optimizer;  // optimizer states partitioned over DP (estimate.cpp)
  const double frozen_width = in.frozen_width, e = in.e, reduce_bytes = in.reduce_bytes, dense_layer = in.dense_layer,
               expert_layer = in.expert_layer, lora_layer = in.lora_layer, largest_linear = in.largest_linear, t = in.t,
               grad_width = in.grad_width;
  const int stages = in.stages, dense_shard = in.dense_shard, expert_shard = in.expert_shard, gpn = in.gpn, m = in.m;
  const StageState& X = st[i];
  const int Li = layers[i];
  StageTail out;
  // Data parallelism is the outermost axis: a group of `size` ranks spread over `span` GPUs of
  // contiguous pods (HardwareProfile inter_node.pod_gpus), with every group of its kind that
  // has ranks in a pod running at once (network.hpp CollectiveGroup).
  const int pod = hw.inter_node.pod_gpus;
  const auto spread = [&](int size, int per_node, int span) {
    CollectiveGroup g{size, per_node};
    if (pod > 0 && span > pod && size > 1) {
      g.pods = std::min(size, (span + pod - 1) / pod);
      g.groups_per_pod = std::min(plan.gpus / size, pod);
    }
    return g;
  };
  const CollectiveGroup dp_group = spread(p.dp * p.cp, share.dp * share.cp, plan.gpus);
  const CollectiveGroup edp_group = spread(std::max(1, p.dp / p.ep) * p.cp, std::max(1, share.dp / p.ep) * share.cp, plan.gpus);
  const double dense_trainable = lora ? X.trainable : X.dense;
  const double expert_trainable = lora ? 0.0 : X.expert;
  const double units = std::max(1, Li);
  double dp_exposed = 0, dp_total = 0;
  // Where collectives do not progress while the rank computes (MPI on CPU ranks), none overlaps.
  const bool overlap = hw.collectives_overlap_compute;
  const bool prefetch = p.prefetch && overlap;
  if (p.zero_stage == 3 || grad_op_units) {
    // ZeRO-3 / FSDP full shard, unit by unit in the order the schedule runs them: a unit's
    // parameters are gathered before its forward and again before its backward, its gradients
    // reduce-scattered after its backward. With prefetch (depth 1) the next unit's gather runs
    // during this unit's compute, and in backward also the previous unit's reduce-scatter; what
    // does not fit in that compute is exposed, unit by unit (no slack carries over: a gather
    // cannot start more than one unit ahead). The first gather and the last reduce-scatter of a
    // pass are always exposed. FSDP's SHARD_GRAD_OP (ZeRO-2 in an FSDP stack) keeps the
    // gathered unit from its forward to its backward: no gather in backward.
    const bool regather = p.zero_stage == 3;
    const CollectiveGroup shard = spread(p.shard_size() * p.cp, std::min(p.shard_size(), share.dp) * share.cp, p.shard_size() * p.tp * p.cp * p.pp);
    const double gather_width = lora ? (tr.mode == TrainingMode::kQlora ? frozen_width : e) : w.weights;
    struct DpUnit {
      double gather = 0, reduce = 0, forward = 0, backward = 0;
    };
    std::vector<DpUnit> dp_units;
    // Gradients leave in reduce buckets where the stack fills them (DeepSpeed): a unit pays its
    // share of a bucket's reduce-scatter, whose latency is paid once per bucket.
    const double bucket = stack.dp.reduce_bucket_params > 0 ? std::min(stack.dp.reduce_bucket_params, X.trainable) : 0.0;
    // DeepSpeed v0.3.16 all-reduces its buckets whole (DataParallelSpec::zero3_all_reduce).
    const Collective rs = stack.dp.zero3_all_reduce ? Collective::kAllReduce : Collective::kReduceScatter;
    const double bucket_reduce = bucket > 0 ? in.collective(rs, bucket * reduce_bytes, shard) : 0.0;
    // A list all-gather's copy per rank (DataParallelSpec::list_copy_host_seconds): a kernel per
    // rank on the communication stream, after the collective, moving the gathered tensor once.
    const bool list_copies = stack.dp.list_copy_host_seconds > 0;
    const auto add_unit = [&](double params, double trainable, double forward, double backward, double width) {
      const double reduce = bucket > trainable ? bucket_reduce * trainable / bucket
                                               : in.collective(rs, trainable * reduce_bytes, shard);
      const double gather = in.collective(Collective::kAllGather, params * width, shard) +
                            (list_copies && params > 0 ? rates.stream(2.0 * params * width, shard.size) : 0.0);
      dp_units.push_back({gather, reduce, forward, backward});
    };
    const double layer_params = dense_layer + expert_layer;
    const double layer_trainable = lora ? lora_layer : layer_params;
    // FSDP units of at least fsdp_wrap_min_params: whole layers grouped. DeepSpeed gathers a
    // layer submodule by submodule (gathers_per_layer).
    const int per_unit = std::max(1, static_cast<int>(std::ceil(static_cast<double>(p.fsdp_wrap_min_params) / std::max(1.0, layer_params))));
    const int chunks = gathers_per_layer(stack, layer_params, largest_linear, in.tensors.large);
    // A layer's linear weights travel in fp8 under the fp8 all-gather (StageTailInputs::layer_gather_width).
    const double layer_width = lora ? gather_width : in.layer_gather_width;
    if (i == 0) add_unit(pc.embedding / t, lora ? 0.0 : pc.embedding / t, ec.embedding_forward, ec.embedding_backward, gather_width);
    for (int done = 0; done < Li; done += per_unit) {
      const int n = std::min(per_unit, Li - done);
      // Units of as many layers cost alike: their collectives are timed once.
      if (n == per_unit && done > 0) {
        for (int c = 0; c < chunks; ++c) dp_units.push_back(dp_units[dp_units.size() - static_cast<std::size_t>(chunks)]);
        continue;
      }
      for (int c = 0; c < chunks; ++c) {
        add_unit(n * layer_params / chunks, n * layer_trainable / chunks, n * lc.forward_total() / chunks, n * lc.backward_total() / chunks,
                 layer_width);
      }
    }
    if (i == stages - 1) {
      // With tied embeddings on one stage the output layer is the embedding unit's table, still
      // gathered; on a later stage it is that stage's own copy.
      const double head = pc.final_norm + (mdl.tied_embeddings ? (stages > 1 ? pc.embedding / t : 0.0) : pc.output / t);
      add_unit(head, lora ? 0.0 : head, ec.head_forward, ec.head_backward, gather_width);
    }
    double fwd = 0, bwd = 0, ag_total = 0, bwd_ag_total = 0, rs_total = 0;
    const std::size_t n = dp_units.size();
    // Units kept gathered for reuse (the last ones of the forward) are not gathered in backward.
    const ReuseKept& kept = st[static_cast<std::size_t>(i)].kept;
    const std::size_t kept_units = std::min(n, static_cast<std::size_t>(kept.layers) * static_cast<std::size_t>(chunks) + (kept.head ? 1 : 0) +
                                                   (kept.embedding ? 1 : 0));
    const auto backward_gather = [&](std::size_t u) { return regather && u + kept_units < n ? dp_units[u].gather : 0.0; };
    // A stack that syncs the device before each gather (DataParallelSpec::sync_before_gather)
    // issues it with the GPU idle. Its Python loop over the ranks runs before the collective is
    // queued (_allgather_param), but the list's copies are launched after it: the gather runs
    // during their launches (a host-bound wait, estimate.cpp) as well as the compute after it.
    const double issue = stack.dp.sync_before_gather ? shard.size * stack.dp.list_copy_host_seconds : 0.0;
    const auto after_issue = [&](double gather) { return gather > 0 ? std::max(0.0, gather - issue) : 0.0; };
    double fwd_after_issue = 0, bwd_after_issue = 0, idle = 0;  // the gathers beyond their issue, and during it
    for (std::size_t u = 0; u < n; ++u) {
      ag_total += dp_units[u].gather;
      bwd_ag_total += backward_gather(u);
      rs_total += dp_units[u].reduce;
      fwd_after_issue += after_issue(dp_units[u].gather);
      bwd_after_issue += after_issue(backward_gather(u));
      idle += std::min(dp_units[u].gather, issue) + std::min(backward_gather(u), issue);
      if (!prefetch) continue;
      // Forward in order: unit u computes while unit u + 1 is gathered.
      if (u + 1 < n) fwd += std::max(0.0, after_issue(dp_units[u + 1].gather) - dp_units[u].forward);
      // Backward in reverse: unit u computes while unit u - 1 is gathered and unit u + 1's
      // gradients are reduce-scattered.
      const double during = (u > 0 ? after_issue(backward_gather(u - 1)) : 0.0) + (u + 1 < n ? dp_units[u + 1].reduce : 0.0);
      bwd += std::max(0.0, during - dp_units[u].backward);
    }
    if (prefetch) {
      fwd += after_issue(dp_units.front().gather);
      bwd += after_issue(backward_gather(n - 1)) + dp_units.front().reduce;
    } else {
      fwd = fwd_after_issue;
      bwd = bwd_after_issue + rs_total;
    }
    // What of the gathers runs during their own issue, with the compute stream empty: it slows
    // no compute (estimate.cpp's overlap slowdown leaves it out).
    out.dp_idle_overlap = m * idle;
    dp_exposed += m * (fwd + bwd);
    // What runs during a host-bound wait that overlaps the GPU's work (estimate.cpp); where the
    // host syncs before each gather its wait is exposed whole, the gathers timed against it above.
    out.dp_exposed_units = stack.dp.sync_before_gather ? 0.0 : m * (fwd + bwd);
    dp_total += m * (ag_total + bwd_ag_total + rs_total);
    if (p.shard_size() < p.dp) {  // hybrid shard: all-reduce the shards across replicas
      const int replicas = p.dp / p.shard_size();
      const CollectiveGroup rg = spread(replicas, std::max(1, share.dp / p.shard_size()), plan.gpus);
      const double ar = in.collective(Collective::kAllReduce, (dense_trainable + expert_trainable) * reduce_bytes / p.shard_size(), rg);
      dp_exposed += overlap ? std::max(0.0, ar - X.backward) + ar / units : ar;
      dp_total += ar;
    }
  } else if (p.dp * p.cp > 1) {
    const Collective reduce = p.zero_stage == 0 || stack.dp.zero12_all_reduce ? Collective::kAllReduce : Collective::kReduceScatter;
    // In the stack's buckets where it has them (DeepSpeed): whole buckets, then the rest.
    const auto reduced = [&](double params, const CollectiveGroup& g) {
      const double b = stack.dp.bucket_params;
      if (b <= 0 || params <= b) return in.collective(reduce, params * reduce_bytes, g);
      const double full = std::floor(params / b);
      return full * in.collective(reduce, b * reduce_bytes, g) +
             in.collective(reduce, (params - full * b) * reduce_bytes, g);
    };
    // DeepSpeed's ZeRO-2 reduces every micro-batch, the others once per step.
    const double times = p.zero_stage == 2 && stack.dp.zero2_every_micro_batch ? m : 1.0;
    const double red = reduced(dense_trainable, dp_group) + reduced(expert_trainable, edp_group);
    // Overlaps the last micro-batch's backward, except the last bucket (where the stack overlaps).
    dp_exposed += times * (p.overlap_grad_reduce && stack.dp.zero12_overlap && overlap ? std::max(0.0, red - X.backward) + red / units : red);
    dp_total += times * red;
    if (shard_states) {  // gather updated parameters after the sharded step
      const double ag = in.collective(Collective::kAllGather, dense_trainable * w.weights, dp_group) +
                        in.collective(Collective::kAllGather, expert_trainable * w.weights, edp_group);
      // Overlaps the next step's first forward; DeepSpeed gathers in its step (all_gather_dp_groups).
      dp_exposed += stack.dp.zero12_overlap && overlap ? std::max(0.0, ag - X.forward) + ag / units : ag;
      dp_total += ag;
    }
  }
  out.dp_exposed = dp_exposed;
  out.dp_total = dp_total;

  // Optimizer step (memory-bound), possibly on the host.
  // Expert parameters are sharded over their own data-parallel group (dp / ep), as in memory.
  const double local = shard_states ? dense_trainable / dense_shard + expert_trainable / expert_shard : dense_trainable + expert_trainable;
  // Megatron's 16-bit main-grad buffer: its shard copied to fp32 for the step (stack.hpp).
  const bool fp32_copy_of_grads = stack.main_grad_buffer && w.master && grad_width < 4.0;
  // Read and write the states, read the gradient (BF16_Optimizer's fp32 partition, Megatron's fp32
  // copy), write the weights.
  const double touched = 2.0 * w.optimizer + (bf16_optimizer || fp32_copy_of_grads ? 4.0 : grad_width) + 2.0 * w.weights;
  if (p.offload_optimizer == Offload::kNone) {
    // The stack's update (fused kernel or ATen ops) and the rest of its step (stack.hpp).
    const double tensors = Li * block_parameter_tensors(mdl, stack.fused_qkv, stack.fused_gate_up) + 3.0;
    const int launches = static_cast<int>(std::lround(tensors * stack.optimizer_kernels_per_tensor));
    const double update = stack.fused_optimizer ? rates.adamw_fused(local * touched / 32.0, 0)
                                                : rates.stream(local * touched * stack.optimizer_update_factor, 0);
    out.optimizer = update + rates.stream(local * stack.optimizer_overhead_bytes, launches);
    // BF16_Optimizer's passes over its whole fp32 gradient buffer, not the partition: the norm
    // (get_grads_for_norm, 4 bytes read) and the zeroing after the step (clear_hp_grads, 4
    // written); clipping, when the norm is above the limit, multiplies it too (not counted).
    if (bf16_optimizer) out.optimizer += rates.stream((dense_trainable + expert_trainable) * 8.0, 2);
    if (fp32_copy_of_grads) out.optimizer += rates.stream(local * 6.0, 1);
    // fp16's loss scaling: the gradients the optimizer steps on unscaled and checked for inf
    // (stack.hpp), fp32 beside master weights, fp16 in pure fp16.
    if (tr.precision == Precision::kFp16 && stack.fp16_unscale) out.optimizer += rates.stream(local * 2.0 * (w.master ? 4.0 : 2.0), 1);
  } else {
    const double host_bw = 0.5 * hw.cpu_memory_bandwidth.value() / gpn;  // a GPU's share, at 50% efficiency
    out.optimizer = local * touched / host_bw;
    double offload = std::max(local * grad_width, local * w.weights) / hw.pcie_bandwidth.value();
    if (p.offload_optimizer == Offload::kNvme) offload += 2.0 * local * w.optimizer / (hw.nvme_bandwidth.value() / gpn);
    out.offload = offload;
  }
  // Megatron's main-grad buffer zeroed for the next step (zero_grad_buffer), on the GPU wherever
  // the optimizer runs: the whole local buffer in the reduce dtype, its shard under Megatron FSDP.
  if (stack.main_grad_buffer) {
    const double buffer = p.zero_stage >= 2 ? local : dense_trainable + expert_trainable;
    out.optimizer += rates.stream(buffer * grad_width, 1);
  }
  if (p.offload_params != Offload::kNone) {
    const double shard_bytes = (X.dense + X.expert) * w.weights / p.shard_size();
    const double bw = p.offload_params == Offload::kNvme ? hw.nvme_bandwidth.value() / gpn : hw.pcie_bandwidth.value();
    out.offload += m * 2.0 * shard_bytes / bw;
  }

  return out;
}

}  // namespace trainplan::costmodel::estimate_detail
