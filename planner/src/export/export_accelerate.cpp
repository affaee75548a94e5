// Hugging Face Accelerate: an `accelerate launch --config_file` YAML. Keys from huggingface/accelerate
// at 16cb6eb80dd9aa8b4df1a63ef57863e455d53b83 (2026-07-24): src/accelerate/commands/config/cluster.py
// (what `accelerate config` writes: distributed_type, fsdp_config.fsdp_version,
// fsdp_reshard_after_forward (FSDP2's FULL_SHARD / SHARD_GRAD_OP), fsdp_offload_params,
// fsdp_auto_wrap_policy, fsdp_transformer_layer_cls_to_wrap, fsdp_state_dict_type,
// fsdp_activation_checkpointing, parallelism_config.parallelism_config_dp_replicate_size /
// _dp_shard_size / _tp_size / _cp_size / _cp_comm_strategy, mixed_precision, num_machines,
// num_processes (all machines), machine_rank, main_training_function, rdzv_backend, same_network),
// src/accelerate/commands/config/config_args.py (ClusterConfig), src/accelerate/commands/launch.py
// (parallelism_config needs fsdp_version 2) and docs/source/usage_guides/fsdp.md. Read from
// accelerate 1.15.0 (the version tests/export checks with): utils/constants.py
// (FSDP_SHARDING_STRATEGY: FSDP1's fsdp_reshard_after_forward names a ShardingStrategy,
// FSDP_BACKWARD_PREFETCH), utils/dataclasses.py FullyShardedDataParallelPlugin (backward_prefetch
// absent: NO_PREFETCH; limit_all_gathers True, which the config cannot change; set_mixed_precision:
// param_dtype and reduce_dtype both the mixed-precision dtype, FSDP1 and FSDP2 alike), state.py
// (set_mixed_precision called whenever mixed_precision is not "no"), utils/launch.py
// (FSDP_SHARDING_STRATEGY from fsdp_sharding_strategy, default FULL_SHARD, which the Accelerator
// prefers to fsdp_reshard_after_forward for FSDP1: accelerator.py prepare_model).

#include <sstream>

#include "export_writers.hpp"

namespace trainplan::planner::export_detail {

namespace cm = costmodel;
using cm::Plan;

namespace {

const char* layer_class(const cm::ModelSpec& m) {
  if (m.architecture == cm::Architecture::kGpt) return "GPT2Block";
  return m.moe ? "MixtralDecoderLayer" : "LlamaDecoderLayer";
}

// ZeRO stage as Accelerate sees it: with one data-parallel rank nothing is sharded.
int effective_zero(const cm::ParallelConfig& p) { return p.dp > 1 ? p.zero_stage : 0; }

// The dtype the model computes in: Accelerate's mixed_precision dtype (fp8 computes in bf16 there).
cm::Dtype compute_dtype(const cm::TrainingConfig& t) {
  if (t.precision == cm::Precision::kFp32) return cm::Dtype::kFp32;
  return t.precision == cm::Precision::kFp16 ? cm::Dtype::kFp16 : cm::Dtype::kBf16;
}

// The dtype the parameters train in under Accelerate: fp32 beside autocast (mixed_precision
// bf16 or fp16) and in fp32; the 16-bit dtype when the model is loaded in it (no master weights).
cm::Dtype param_dtype(const cm::TrainingConfig& t) { return t.master_weights ? cm::Dtype::kFp32 : compute_dtype(t); }

// The dtype Accelerate reduces gradients in. FSDP: with mixed_precision bf16 or fp16,
// set_mixed_precision makes reduce_dtype that dtype; with "no" (fp32, or a model loaded in 16
// bits) FSDP reduces in the parameters' dtype. DDP (no FSDP): the gradients' own dtype, the
// parameters', as no communication hook is registered unless the script asks.
cm::Dtype accelerate_reduce_dtype(const cm::TrainingConfig& t, bool fsdp) { return fsdp ? compute_dtype(t) : param_dtype(t); }

const char* torch_dtype(cm::Dtype d) { return d == cm::Dtype::kFp32 ? "torch.float32" : d == cm::Dtype::kFp16 ? "torch.float16" : "torch.bfloat16"; }

// What the training script must pass for Accelerate to reduce in the plan's dtype, where the
// config cannot say it; empty where the script cannot (DDP reducing 16-bit gradients in another dtype).
std::string reduce_dtype_setting(const Plan& plan, bool fsdp1) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const bool fsdp = effective_zero(p) >= 2;
  const cm::Dtype runs = accelerate_reduce_dtype(t, fsdp);
  if (fsdp) {
    const cm::Dtype compute = compute_dtype(t);
    return std::string("FullyShardedDataParallelPlugin(mixed_precision_policy={\"param_dtype\": ") + torch_dtype(compute) + ", \"reduce_dtype\": " +
           torch_dtype(p.reduce_dtype) + (fsdp1 ? ", \"buffer_dtype\": " : ", \"output_dtype\": ") + torch_dtype(compute) +
           "}) (Accelerate's FSDP reduces in " + cm::dtype_name(runs) +
           (t.master_weights && t.precision != cm::Precision::kFp32 ? ", its set_mixed_precision's policy" : ", the parameters' dtype") + ")";
  }
  if (runs == cm::Dtype::kFp32 && p.reduce_dtype != cm::Dtype::kFp32) {
    return std::string("Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.") +
           (p.reduce_dtype == cm::Dtype::kFp16 ? "FP16" : "BF16") + ")]) (Accelerate's DDP all-reduces the fp32 gradients)";
  }
  return {};
}

// FSDP1's sharding strategy for a plan Accelerate runs with fsdp_version 1 (ZeRO-2/3, dp > 1).
// A plan shards over a smaller group under ZeRO-3 only: HYBRID_SHARD, within each node (FSDP1
// builds the intra-node group from the node's devices; Accelerate gives it no other, its
// parallelism_config needs FSDP2), which the refusals hold the plan to.
const char* fsdp1_strategy(const cm::ParallelConfig& p) {
  if (p.zero_stage == 2) return "SHARD_GRAD_OP";
  return p.shard_size() < p.dp ? "HYBRID_SHARD" : "FULL_SHARD";
}

}  // namespace

std::vector<std::string> accelerate_refusals(const Plan& plan) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto n = [](long long x) { return std::to_string(x); };
  const bool fsdp1 = cm::is_fsdp1(t.stack);
  std::vector<std::string> r;
  if (p.pp > 1) r.push_back("pp=" + n(p.pp) + ": Accelerate has no pipeline parallelism for FSDP training");
  if (p.tp > 1) {
    r.push_back("tp=" + n(p.tp) + ": Accelerate's parallelism_config_tp_size applies the Transformers model's own tp_plan, "
                "which this export cannot match to the plan's tensor and sequence parallelism");
  }
  if (p.ep > 1) r.push_back("ep=" + n(p.ep) + ": Accelerate's config has no expert parallelism");
  if (effective_zero(p) == 1) {
    r.push_back("zero_stage=1: FSDP has no optimizer-only sharding (Accelerate does it through DeepSpeed: --to deepspeed)");
  }
  if (p.cp > 1 && effective_zero(p) == 0) r.push_back("cp=" + n(p.cp) + " with zero_stage=0: Accelerate's context parallelism needs FSDP2 (zero_stage 2 or 3)");
  for (std::string& why : pytorch_cp_refusals(p, "Accelerate")) r.push_back(std::move(why));
  if (p.recompute == cm::Recompute::kSelective) {
    r.push_back("recompute=selective: fsdp_activation_checkpointing recomputes whole transformer layers");
  }
  if (p.recompute == cm::Recompute::kFull && p.recompute_layers > 0) {
    r.push_back("recompute_layers=" + n(p.recompute_layers) + ": fsdp_activation_checkpointing recomputes every layer");
  }
  const bool both_cpu = p.offload_params == cm::Offload::kCpu && p.offload_optimizer == cm::Offload::kCpu;
  if ((p.offload_params != cm::Offload::kNone || p.offload_optimizer != cm::Offload::kNone) && !both_cpu) {
    r.push_back(std::string("offload_optimizer=") + cm::offload_name(p.offload_optimizer) + ", offload_params=" + cm::offload_name(p.offload_params) +
                ": fsdp_offload_params moves parameters, gradients and the optimizer step to the CPU together (--to deepspeed offloads them apart)");
  }
  if (both_cpu && effective_zero(p) < 2) r.push_back("offload_params=cpu: Accelerate's CPU offload is FSDP's; it needs zero_stage 2 or 3");
  if (t.precision == cm::Precision::kFp8) r.push_back("precision=fp8: Accelerate's fp8 needs a backend config (Transformer Engine, MS-AMP or torchao) this export does not write");
  // A reduction in another dtype than Accelerate's is the script's to set (a note), where it can.
  if (p.dp > 1 && p.reduce_dtype != accelerate_reduce_dtype(t, effective_zero(p) >= 2) && reduce_dtype_setting(plan, fsdp1).empty()) {
    r.push_back(std::string("reduce_dtype=") + cm::dtype_name(p.reduce_dtype) + ": Accelerate's DDP all-reduces the " +
                cm::dtype_name(param_dtype(t)) + " gradients in their own dtype, and no communication hook casts them to " + cm::dtype_name(p.reduce_dtype));
  }
  if (fsdp1 && effective_zero(p) >= 2 && p.shard_size() < p.dp && p.shard_size() != plan.cluster.gpus_per_node) {
    r.push_back("shard_group=" + n(p.shard_size()) + " (stack fsdp1): FSDP1's HYBRID_SHARD shards within each node of " +
                n(plan.cluster.gpus_per_node) + " GPUs, and Accelerate's parallelism_config (any other shard group) needs FSDP2: plan for the fsdp2 stack");
  }
  return r;
}

PlanExport accelerate_export(const Plan& plan, const Derived& d) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const int zero = effective_zero(p);
  const int shard = p.shard_size();
  const int replicate = p.dp / shard;
  const bool fsdp1 = zero >= 2 && cm::is_fsdp1(t.stack);
  PlanExport e;
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) e.notes.push_back(lora_note(plan));
  if (p.dp > 1 && p.reduce_dtype != accelerate_reduce_dtype(t, zero >= 2)) {
    e.notes.push_back(std::string("reduce_dtype=") + cm::dtype_name(p.reduce_dtype) + ": predicted for a script that passes " +
                      reduce_dtype_setting(plan, fsdp1));
  }
  std::ostringstream o;
  o << "# Accelerate config for the trainplan plan \"" << plan.name << "\":\n";
  o << "#   " << plan.model.name << " on " << plan.cluster.name << ", " << d.nodes_text << "; " << (p.cp > 1 ? "cp " + std::to_string(p.cp) + ", " : "")
    << "dp " << p.dp;
  if (zero == 0) {
    o << " (DDP)";
  } else {
    o << " (ZeRO-" << zero << (shard < p.dp ? ", sharded over groups of " + std::to_string(shard) : std::string()) << ")";
  }
  o << "\n";
  o << "# Written by `planner export --to accelerate`. Keys of huggingface/accelerate 16cb6eb80dd9:\n";
  o << "# src/accelerate/commands/config/cluster.py and config_args.py, docs/source/usage_guides/fsdp.md.\n";
  o << "# The batch is the training script's: micro-batch " << p.micro_batch << " per GPU and " << d.micro_batches
    << " gradient accumulation steps\n";
  o << "# (Accelerator(gradient_accumulation_steps=" << d.micro_batches << ")) give " << t.global_batch << " sequences of " << t.seq_len
    << " tokens per step.\n";
  for (const auto& note : e.notes) o << "# " << note << ".\n";
  if (d.nodes == 1) {
    o << "# Run: " << d.launch_prefix() << "accelerate launch --config_file THIS_FILE your_training_script.py\n";
  } else {
    o << "# Run on each of the " << d.nodes << " nodes: " << d.launch_prefix() << "accelerate launch --config_file THIS_FILE --machine_rank NODE_RANK\n";
    o << "#   --main_process_ip FIRST_NODE --main_process_port 29500 your_training_script.py\n";
  }
  o << "compute_environment: LOCAL_MACHINE\ndebug: false\n";
  o << "distributed_type: " << (zero == 0 ? "MULTI_GPU" : "FSDP") << "\n";
  o << "downcast_bf16: 'no'\n";
  if (fsdp1) {
    // FSDP1 (the plan's fsdp1 stack): a FlatParameter per wrapped layer, limit_all_gathers on.
    const char* strategy = fsdp1_strategy(p);
    o << "fsdp_config:\n  fsdp_version: 1\n";
    o << "  # ZeRO-" << zero << (zero == 3 ? ": parameters resharded after forward" : ": parameters kept gathered from forward to backward")
      << (shard < p.dp ? ", sharded within each node and replicated across nodes" : "") << "\n";
    // launch.py always sets FSDP_SHARDING_STRATEGY (FULL_SHARD unless the config says), and the
    // Accelerator hands FSDP1 sharding_strategy before reshard_after_forward: both are written.
    o << "  fsdp_sharding_strategy: " << strategy << "\n  fsdp_reshard_after_forward: " << strategy << "\n";
    o << (p.prefetch ? "  # The next layer's all-gather issued before this layer's backward\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                     : "  fsdp_backward_prefetch: NO_PREFETCH\n");
    o << "  fsdp_forward_prefetch: false\n  fsdp_use_orig_params: true\n";
  } else if (zero >= 2) {
    o << "fsdp_config:\n  fsdp_version: 2\n";
    o << (zero == 3 ? "  # ZeRO-3: parameters resharded after forward (FULL_SHARD)\n  fsdp_reshard_after_forward: true\n"
                    : "  # ZeRO-2: parameters kept gathered from forward to backward (SHARD_GRAD_OP)\n  fsdp_reshard_after_forward: false\n");
  }
  if (zero >= 2) {
    if (p.offload_params == cm::Offload::kCpu) {
      o << "  # Parameters, gradients and the optimizer step on the CPU\n  fsdp_offload_params: true\n";
    } else {
      o << "  fsdp_offload_params: false\n";
    }
    o << "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n";
    o << "  fsdp_transformer_layer_cls_to_wrap: " << layer_class(plan.model) << "\n";
    o << "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
    o << "  fsdp_activation_checkpointing: " << (p.recompute == cm::Recompute::kFull ? "true" : "false") << "\n";
    if (!fsdp1 && (replicate > 1 || p.cp > 1)) {
      o << "parallelism_config:\n";
      if (replicate > 1) o << "  # Hybrid sharding (HSDP): " << replicate << " replicas of " << shard << "-way shards\n";
      o << "  parallelism_config_dp_replicate_size: " << replicate << "\n";
      o << "  parallelism_config_dp_shard_size: " << shard << "\n";
      o << "  parallelism_config_tp_size: 1\n";
      const bool ring = pytorch_cp_ring(p);
      if (p.cp > 1 && ring) o << "  # Context parallelism: ring attention, key/value shards passed round the " << p.cp << " ranks\n";
      if (p.cp > 1 && !ring) o << "  # Context parallelism: key/value shards all-gathered once per layer and pass, their gradients passed round the " << p.cp << " ranks\n";
      o << "  parallelism_config_cp_size: " << p.cp << "\n";
      if (p.cp > 1) o << "  parallelism_config_cp_comm_strategy: " << (ring ? "alltoall" : "allgather") << "\n";
    }
  } else if (p.recompute == cm::Recompute::kFull) {
    // Non-reentrant, as the hf-ddp stack prices it (the replay ends before w2); transformers'
    // default is reentrant, which replays the whole block.
    e.notes.push_back("accelerate: recompute=full: without FSDP, turn on activation checkpointing in the training script "
                      "(model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False}))");
  }
  o << "machine_rank: 0\nmain_training_function: main\n";
  // Pure 16-bit: the model is loaded in bf16 and trained as it is, no autocast or cast policy.
  o << "mixed_precision: " << (!t.master_weights ? "'no'" : t.precision == cm::Precision::kBf16 ? "bf16" : t.precision == cm::Precision::kFp16 ? "fp16" : "'no'") << "\n";
  o << "num_machines: " << d.nodes << "\nnum_processes: " << plan.gpus << "\n";
  o << "rdzv_backend: static\nsame_network: true\nuse_cpu: false\n";
  e.text = o.str();
  return e;
}

}  // namespace trainplan::planner::export_detail
