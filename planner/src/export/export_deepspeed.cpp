// DeepSpeed: a JSON config for deepspeed.initialize(config=...). Keys from deepspeedai/DeepSpeed at
// edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (2026-08-22): deepspeed/runtime/constants.py
// (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// gradient_clipping, bf16, fp16, optimizer), deepspeed/runtime/zero/config.py (zero_optimization:
// stage, overlap_comm, contiguous_gradients, reduce_bucket_size, allgather_bucket_size and the
// stage3_* aliases, written at their defaults there), deepspeed/runtime/zero/offload_config.py
// (offload_optimizer / offload_param: device, nvme_path, pin_memory) and docs/_pages/config-json.md
// (tensor_parallel.autotp_size and preset_model: AutoTP; expert_parallel: AutoEP). Pipeline
// parallelism is DeepSpeed's PipelineModule, built in the training script; activation
// checkpointing of a Hugging Face model is the script's too (gradient_checkpointing_enable()).

#include <nlohmann/json.hpp>

#include "export_writers.hpp"

namespace trainplan::planner::export_detail {

namespace cm = costmodel;
using cm::Plan;

std::vector<std::string> deepspeed_refusals(const Plan& plan) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto n = [](long long x) { return std::to_string(x); };
  std::vector<std::string> r;
  if (p.pp > 1) r.push_back("pp=" + n(p.pp) + ": DeepSpeed's pipeline engine needs a PipelineModule in the training script; a JSON config cannot express it");
  if (p.tp > 1 && p.sequence_parallel) {
    r.push_back("tp=" + n(p.tp) + " with sequence_parallel=true: DeepSpeed's AutoTP (tensor_parallel.autotp_size) shards the linear layers only, "
                "without Megatron-style sequence parallelism");
  } else if (p.tp > 1 && (plan.model.architecture != cm::Architecture::kLlama || plan.model.moe)) {
    r.push_back("tp=" + n(p.tp) + ": this export writes DeepSpeed's AutoTP preset for dense Llama models only");
  }
  if (p.cp > 1) {
    r.push_back("cp=" + n(p.cp) + ": DeepSpeed's sequence parallelism (Ulysses) is all-to-all over heads, set up in the training script, "
                "not ring attention");
  }
  if (p.tp > 1 && p.zero_stage == 3) {
    r.push_back("tp=" + n(p.tp) + " with zero_stage=3: DeepSpeed's AutoTP runs with ZeRO-2 at most (runtime/engine.py "
                "_configure_tensor_parallel_states asserts it)");
  }
  if (p.ep > 1 && p.zero_stage == 3) {
    r.push_back("ep=" + n(p.ep) + " with zero_stage=3: DeepSpeed's expert parallelism runs with ZeRO-2 at most (runtime/engine.py "
                "_configure_zero_optimizer asserts \"MoE not supported with Stage 3\")");
  }
  if (p.zero_stage == 3 && p.shard_group > 0 && p.shard_group < p.dp) {
    r.push_back("shard_group=" + n(p.shard_group) + ": hybrid sharding is DeepSpeed's MiCS (mics_shard_size), which needs the model built "
                "under deepspeed.zero.MiCS_Init in the training script");
  }
  if (t.precision == cm::Precision::kFp8) r.push_back("precision=fp8: a DeepSpeed config has no fp8 training switch (Transformer Engine goes in the script)");
  if (t.optimizer != cm::OptimizerKind::kAdamW) {
    r.push_back(std::string("optimizer=") + cm::optimizer_name(t.optimizer) + ": this export writes DeepSpeed's AdamW only");
  }
  if (p.offload_optimizer != cm::Offload::kNone && p.zero_stage == 0) {
    r.push_back(std::string("offload_optimizer=") + cm::offload_name(p.offload_optimizer) + " with zero_stage=0: ZeRO-Offload needs zero_stage >= 1");
  }
  return r;
}

namespace {

nlohmann::ordered_json offload(cm::Offload where) {
  nlohmann::ordered_json o;
  o["device"] = where == cm::Offload::kNvme ? "nvme" : "cpu";
  if (where == cm::Offload::kNvme) o["nvme_path"] = "/local_nvme";
  o["pin_memory"] = true;
  return o;
}

}  // namespace

PlanExport deepspeed_export(const Plan& plan, const Derived& d) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  nlohmann::ordered_json c;
  // Without an mpu DeepSpeedConfig counts every rank, the tensor-parallel ones too, in its batch
  // check (runtime/config.py: world_size = dist.get_world_size(); train_batch == micro x GA x
  // world_size), while AutoTP's ranks of one group read the same samples: its train_batch_size is
  // the plan's global batch times tp.
  c["train_batch_size"] = t.global_batch * p.tp;
  c["train_micro_batch_size_per_gpu"] = p.micro_batch;
  c["gradient_accumulation_steps"] = d.micro_batches;
  c["gradient_clipping"] = 1.0;
  if (t.precision == cm::Precision::kBf16) c["bf16"]["enabled"] = true;
  if (t.precision == cm::Precision::kFp16) c["fp16"]["enabled"] = true;
  // The gradients' reduction dtype, stated: left out, DeepSpeed reduces in the gradients' own
  // (runtime/config.py get_communication_data_type: None, "determined by other parameters").
  if (t.precision != cm::Precision::kFp32 || p.reduce_dtype != cm::Dtype::kFp32) c["communication_data_type"] = cm::dtype_name(p.reduce_dtype);
  nlohmann::ordered_json zero;
  zero["stage"] = p.zero_stage;
  if (p.zero_stage > 0) {
    zero["overlap_comm"] = p.overlap_grad_reduce;
    zero["contiguous_gradients"] = true;
    zero["reduce_bucket_size"] = 500000000;
    if (p.zero_stage < 3) zero["allgather_bucket_size"] = 500000000;
    if (p.zero_stage == 3) {
      zero["stage3_prefetch_bucket_size"] = 50000000;
      zero["stage3_param_persistence_threshold"] = 100000;
      zero["stage3_max_live_parameters"] = 1000000000;
      zero["stage3_max_reuse_distance"] = 1000000000;
      zero["stage3_gather_16bit_weights_on_model_save"] = true;
    }
    if (p.offload_optimizer != cm::Offload::kNone) zero["offload_optimizer"] = offload(p.offload_optimizer);
    if (p.offload_params != cm::Offload::kNone) zero["offload_param"] = offload(p.offload_params);
  }
  c["zero_optimization"] = zero;
  if (p.tp > 1) {
    c["tensor_parallel"]["autotp_size"] = p.tp;
    c["tensor_parallel"]["preset_model"] = "llama";
  }
  if (p.ep > 1) {
    // AutoEP (deepspeed/module_inject/auto_ep_config.py parse_autoep_config): the experts of each
    // MoE layer split over autoep_size ranks, the expert-data-parallel groups over the rest; with
    // no preset_model it tries its presets against the Hugging Face model (auto_ep.py
    // _resolve_presets). Expert tensor parallelism stays 1 (validate_folding_global reserves it).
    c["expert_parallel"]["enabled"] = true;
    c["expert_parallel"]["autoep_size"] = p.ep;
  }
  c["optimizer"]["type"] = "AdamW";
  c["optimizer"]["params"] = nlohmann::ordered_json{{"lr", 0.0003}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}};
  PlanExport e;
  e.text = c.dump(2) + "\n";
  // Across nodes DeepSpeed's runner passes on only variables named MLFLOW*, PYTHON*, MV2*, UCX*,
  // NCCL* and those of a .deepspeed_env file in the home or working directory
  // (deepspeed/launcher/runner.py EXPORT_ENVS, DEEPSPEED_ENVIRONMENT_PATHS; accelerator/cuda_accelerator.py).
  const std::string conf = cm::allocator_conf(t.allocator);
  e.notes.push_back("deepspeed: run " + d.nodes_text + ": " + (d.nodes == 1 ? d.launch_prefix() : std::string()) + "deepspeed --num_nodes " +
                    std::to_string(d.nodes) + " --num_gpus " + std::to_string(d.per_node) + " your_training_script.py --deepspeed_config THIS_FILE" +
                    (d.nodes > 1 && !conf.empty() ? ", with the lines PYTORCH_ALLOC_CONF=" + conf + " and PYTORCH_CUDA_ALLOC_CONF=" + conf +
                                                        " in ~/.deepspeed_env (its runner passes no other variable of yours to the nodes)"
                                                  : std::string()));
  e.notes.push_back("deepspeed: optimizer.params (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight_decay 0.1) and gradient_clipping 1.0 are not in the plan; set yours");
  if (p.recompute == cm::Recompute::kFull) {
    e.notes.push_back("deepspeed: recompute=full: turn it on in the training script (model.gradient_checkpointing_enable()); "
                      "the config's activation_checkpointing section serves deepspeed.checkpointing only");
  } else if (p.recompute == cm::Recompute::kSelective) {
    e.notes.push_back("deepspeed: recompute=selective: recompute the attention core in the training script; "
                      "model.gradient_checkpointing_enable() recomputes whole layers (full), which the plan did not assume");
  }
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) e.notes.push_back("deepspeed: " + lora_note(plan));
  if (p.zero_stage == 0 && t.precision == cm::Precision::kBf16 && t.master_weights) {
    // runtime/engine.py _do_optimizer_sanity_check (costmodel stack.hpp bf16_optimizer_at_zero0).
    e.notes.push_back("deepspeed: stage 0 in bf16 runs DeepSpeed's BF16_Optimizer: optimizer states partitioned over the data-parallel "
                      "ranks as under ZeRO-1, and an fp32 gradient buffer beside the bf16 gradients (6 bytes per parameter), as predicted; "
                      "stage 1 keeps the gradients in bf16 only");
  }
  if (p.offload_optimizer == cm::Offload::kNvme || p.offload_params == cm::Offload::kNvme) {
    e.notes.push_back("deepspeed: nvme_path /local_nvme stands for your NVMe mount");
  }
  if (p.ep > 1) {
    e.notes.push_back("deepspeed: expert_parallel (AutoEP) finds the MoE layers of a Hugging Face model by its model type "
                      "(presets mixtral, qwen3_moe, deepseek_v2, deepseek_v3; they need transformers >= 5.0)");
  }
  if (p.tp > 1) {
    e.notes.push_back("deepspeed: tensor_parallel (AutoTP) with preset_model llama expects a Hugging Face Llama model");
    e.notes.push_back("deepspeed: train_batch_size " + std::to_string(t.global_batch * p.tp) + " counts each of the " + std::to_string(p.tp) +
                      " tensor-parallel ranks' copy of a micro-batch (DeepSpeed checks micro x GA x all ranks); the plan's " +
                      std::to_string(t.global_batch) + " distinct sequences per step");
  }
  return e;
}

}  // namespace trainplan::planner::export_detail
