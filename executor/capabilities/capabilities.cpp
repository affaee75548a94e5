// The executor's capabilities and the planner command line (capabilities.hpp).

#include "trainplan/executor/capabilities.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

namespace trainplan::executor {

using costmodel::Plan;

std::vector<std::string> executor_limitations(const Plan& plan) {
  namespace cm = costmodel;
  std::vector<std::string> problems;
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  if (p.ep > 1 && p.zero_stage == 3 && p.shard_group > 0 && p.shard_group % p.ep != 0 && p.ep % p.shard_group != 0) {
    // executor/src/train/engine.cpp: experts are sharded over the expert-data-parallel ranks within a shard group.
    problems.push_back("expert parallelism with hybrid shard: shard_group (" + std::to_string(p.shard_group) + ") and ep(" + std::to_string(p.ep) +
                       ") must divide one another, so that every shard group holds the same number of each expert's copies");
  }
  if (p.cp > 1 && t.seq_len % (2LL * p.cp) != 0) {
    // executor/src/parallel/context_parallel.hpp: rank i holds chunks i and 2cp-1-i.
    problems.push_back("context parallelism: seq_len (" + std::to_string(t.seq_len) + ") must split into 2 x cp(" + std::to_string(p.cp) + ") = " +
                       std::to_string(2 * p.cp) + " equal chunks (causal load balancing: rank i holds chunks i and 2cp-1-i)");
  }
  if (p.tp > 1 && plan.model.vocab % p.tp != 0) {
    problems.push_back("tp(" + std::to_string(p.tp) + ") must divide the vocabulary (" + std::to_string(plan.model.vocab) +
                       ") for the vocabulary-parallel embedding and loss");
  }
  if (p.tp > 1 && p.sequence_parallel && (t.seq_len / p.cp) % p.tp != 0) {  // validate_plan: cp divides seq_len
    problems.push_back("sequence parallelism: tp(" + std::to_string(p.tp) + ") must divide each rank's " +
                       (p.cp > 1 ? "seq_len / cp (" + std::to_string(t.seq_len / p.cp) + ")" : "seq_len (" + std::to_string(t.seq_len) + ")"));
  }
  const cm::ModelSpec& m = plan.model;
  if (m.moe) {  // executor/src/parallel/moe.hpp: SwiGLU experts, every rank routing its own tokens
    if (m.architecture != cm::Architecture::kLlama) problems.push_back("mixture of experts: the executor's experts are SwiGLU MLPs in Llama-style blocks");
    if (m.moe->shared_ffn_hidden > 0) problems.push_back("mixture of experts: shared experts (DeepSeek, Qwen2-MoE) are not in the executor");
    if (p.tp > 1) problems.push_back("mixture of experts under tensor parallelism (tp=" + std::to_string(p.tp) + ") is not in the executor (experts are not TP-split)");
  }
  if (m.mla) problems.push_back("multi-head latent attention (MLA) is not supported by the executor (it builds Q, K, V and O projections)");
  if (!m.mla && m.q_dim() != m.hidden) {
    problems.push_back("heads(" + std::to_string(m.heads) + ") * head_dim(" + std::to_string(m.head_dim()) + ") != hidden(" + std::to_string(m.hidden) +
                       "): the executor's attention has head_dim = hidden / heads");
  }
  const cm::ModelFeatures f = m.features();
  const cm::ModelFeatures built = cm::architecture_features(m.architecture);
  if (f != built) {
    std::string what;
    const auto add = [&](bool differs, const std::string& s) { if (differs) what += (what.empty() ? "" : ", ") + s; };
    add(f.layer_norm != built.layer_norm, f.layer_norm ? "LayerNorm" : "RMSNorm");
    add(f.gated_mlp != built.gated_mlp, f.gated_mlp ? "a gated MLP" : "a plain GELU MLP");
    add(f.learned_positions != built.learned_positions || f.alibi != built.alibi,
        f.learned_positions ? "learned positions" : f.alibi ? "ALiBi positions" : "rotary positions");
    add(f.qkv_bias != built.qkv_bias, f.qkv_bias ? "Q/K/V biases" : "no Q/K/V biases");
    add(f.o_bias != built.o_bias, f.o_bias ? "an output-projection bias" : "no output-projection bias");
    add(f.mlp_bias != built.mlp_bias, f.mlp_bias ? "MLP biases" : "no MLP biases");
    problems.push_back(std::string("the executor builds ") + cm::architecture_name(m.architecture) + " blocks exactly; this " +
                       cm::architecture_name(m.architecture) + "-style model has " + what);
  }
  if (m.sliding_window > 0 && m.sliding_window < t.seq_len) {
    problems.push_back("sliding-window attention (window " + std::to_string(m.sliding_window) + " < seq_len " + std::to_string(t.seq_len) +
                       ") is not supported by the executor");
  }
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) {  // executor/src/model/model.hpp LoraSpec
    if (m.architecture != cm::Architecture::kLlama) problems.push_back("LoRA: the executor's adapters are on Llama-style blocks");
    if (m.moe) problems.push_back("LoRA on a mixture-of-experts model is not in the executor");
  }
  if (t.precision == cm::Precision::kFp8) {  // executor/src/model/fp8.hpp: the dense blocks' linear layers
    if (m.architecture != cm::Architecture::kLlama) problems.push_back("fp8: the executor's fp8 linear layers are in Llama-style blocks (use bf16)");
    if (m.moe) problems.push_back("fp8 with experts is not in the executor (its experts' GEMMs are bf16; use bf16)");
    // cuBLASLt's fp8 GEMM takes dimensions that are multiples of 16 (at::_scaled_mm refuses others).
    const int tp = std::max(1, p.tp);
    const int64_t kv_local = tp <= m.kv_heads ? static_cast<int64_t>(m.kv_heads) * m.head_dim() / tp : m.head_dim();
    const std::pair<const char*, int64_t> dims[] = {{"hidden", m.hidden},
                                                    {"heads x head_dim / tp", static_cast<int64_t>(m.q_dim()) / tp},
                                                    {"kv_heads x head_dim / tp", kv_local},
                                                    {"ffn_hidden / tp", static_cast<int64_t>(m.ffn_hidden) / tp},
                                                    {"micro_batch x seq_len / cp", static_cast<int64_t>(p.micro_batch) * t.seq_len / std::max(1, p.cp)}};
    for (const auto& [name, value] : dims) {
      if (value % 16 != 0) problems.push_back(std::string("fp8: ") + name + " is " + std::to_string(value) + ", not a multiple of 16 (cuBLASLt's fp8 GEMM)");
    }
  }
  if (t.optimizer != cm::OptimizerKind::kAdamW) problems.push_back(std::string("optimizer ") + cm::optimizer_name(t.optimizer) + " is not supported (adamw only)");
  if (p.offload_optimizer == cm::Offload::kNvme) problems.push_back("optimizer offload to NVMe is not in the executor (offload_optimizer cpu is)");
  if (p.offload_params != cm::Offload::kNone) problems.push_back("parameter offload (offload_params) is not in the executor (offload_optimizer cpu is)");
  if (p.fsdp_wrap_min_params != 0) problems.push_back("fsdp_wrap_min_params: the executor wraps one unit per block");
  if (p.ends_in_split) problems.push_back("ends_in_pipeline_split: the executor's model chunks hold at least one layer each (the embedding and the loss are not chunks of their own)");
  if (p.reduce_dtype != cm::Dtype::kFp32) problems.push_back("reduce_dtype: the executor reduces gradients in fp32");
  if (!t.master_weights) problems.push_back("master_weights false: the executor trains with fp32 master weights (pure 16-bit training is not in it)");
  if (t.attention_mask == cm::AttentionMask::kExplicit) problems.push_back("attention_mask explicit: the executor's attention takes the kernel's causal flag");
  if (t.precision == cm::Precision::kFp8 && t.fp8_recipe == cm::Fp8Recipe::kDelayed) {
    problems.push_back("fp8_recipe delayed: the executor scales each fp8 tensor by its current amax (executor/src/model/fp8.hpp)");
  }
  if (p.cp > 1 && p.cp_comm && *p.cp_comm != cm::ContextAttention::kAllGatherKv) {
    // executor/src/parallel/context_parallel.hpp: K/V all-gathered, gradients reduce-scattered
    problems.push_back(std::string("cp_comm_type ") + cm::cp_comm_type_name(*p.cp_comm) +
                       ": the executor's context parallelism all-gathers K/V and reduce-scatters their gradients (all_gather)");
  }
  if (t.loss && *t.loss != cm::LossKernel::kChunkedFused && *t.loss != cm::LossKernel::kFp32Copy) {
    // executor/src/model/model.cpp head_loss: the chunked linear cross-entropy (--kernels fused), fp32 logits (--kernels reference)
    problems.push_back(std::string("loss ") + cm::loss_kernel_name(*t.loss) + ": the executor's loss is chunked-linear (--kernels fused) or fp32-logits (--kernels reference)");
  }
  if (t.attention_kernel && *t.attention_kernel != cm::AttentionImpl::kProfile) {
    // executor/src/model: attention through SDPA, whose backend PyTorch picks (the profile's table measures it)
    problems.push_back(std::string("attention_kernel ") + cm::attention_impl_name(*t.attention_kernel) +
                       ": the executor's attention is SDPA with the backend PyTorch picks (attention_kernel profile)");
  }
  if (t.seq_len > plan.model.max_seq_len) problems.push_back("seq_len " + std::to_string(t.seq_len) + " exceeds the model's max_seq_len " + std::to_string(plan.model.max_seq_len));
  return problems;
}

std::string planner_command(const costmodel::PlanRequest& r, const std::string& objective, double memory_headroom) {
  const auto number = [](double x) {  // the shortest text that reads back as x
    char buf[64];
    for (int digits = 6; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, x);
      if (std::strtod(buf, nullptr) == x) break;
    }
    return std::string(buf);
  };
  const costmodel::TrainingConfig& t = r.training;
  std::string s = "planner --model " + (r.model_ref.empty() || r.model_ref == "inline" ? std::string("MODEL.json") : r.model_ref);
  s += " --gpus " + std::to_string(r.gpus);
  s += " --cluster " + (r.cluster_ref.empty() || r.cluster_ref == "inline" ? std::string("CLUSTER.json") : r.cluster_ref);
  s += " --seq-len " + std::to_string(t.seq_len) + " --global-batch " + std::to_string(t.global_batch);
  s += " --train-tokens " + number(t.train_tokens);
  s += std::string(" --precision ") + costmodel::precision_name(t.precision) + " --optimizer " + costmodel::optimizer_name(t.optimizer) +
       " --mode " + costmodel::mode_name(t.mode) + " --objective " + objective;
  if (t.mode == costmodel::TrainingMode::kLora || t.mode == costmodel::TrainingMode::kQlora) {
    s += " --lora-rank " + std::to_string(t.lora.rank);
    std::string targets;
    for (const std::string& target : t.lora.targets) targets += (targets.empty() ? "" : ",") + target;
    if (targets != "q,k,v,o") s += " --lora-targets " + targets;
    if (t.mode == costmodel::TrainingMode::kQlora && t.lora.base_format == costmodel::QuantFormat::kInt8) s += " --base-format int8";
  }
  if (t.attention == costmodel::AttentionKernel::kStandard) s += " --attention standard";
  if (t.attention_mask == costmodel::AttentionMask::kExplicit) s += " --attention-mask explicit";
  if (t.loss) s += std::string(" --loss ") + costmodel::loss_kernel_name(*t.loss);
  if (t.attention_kernel) s += std::string(" --attention-kernel ") + costmodel::attention_impl_name(*t.attention_kernel);
  if (t.fp8_recipe) s += std::string(" --fp8-recipe ") + costmodel::fp8_recipe_name(*t.fp8_recipe);
  if (t.fp8_all_gather) s += " --fp8-all-gather";
  if (!t.master_weights) s += " --pure-16bit";
  if (t.allocator != costmodel::Allocator::kCaching) s += std::string(" --allocator ") + costmodel::allocator_name(t.allocator);
  if (t.dropout) s += " --dropout";
  if (t.stack != costmodel::Stack::kTrainplan) s += std::string(" --stack ") + costmodel::stack_name(t.stack);
  if (memory_headroom != costmodel::kDefaultMemoryHeadroom) s += " --memory-headroom " + number(100 * memory_headroom);
  const costmodel::ParallelConstraints& c = r.parallel;
  const auto fix = [&](const char* key, const std::optional<int>& v) {
    if (v) s += std::string(" --fix ") + key + "=" + std::to_string(*v);
  };
  fix("tp", c.tp);
  fix("pp", c.pp);
  fix("dp", c.dp);
  fix("cp", c.cp);
  fix("ep", c.ep);
  fix("zero", c.zero_stage);
  fix("shard_group", c.shard_group);
  fix("mb", c.micro_batch);
  fix("v", c.virtual_stages);
  if (c.sequence_parallel) s += std::string(" --fix sp=") + (*c.sequence_parallel ? "on" : "off");
  if (c.schedule) s += std::string(" --fix schedule=") + costmodel::schedule_name(*c.schedule);
  if (c.recompute) s += std::string(" --fix recompute=") + costmodel::recompute_name(*c.recompute);
  if (c.offload_optimizer) s += std::string(" --fix offload=") + costmodel::offload_name(*c.offload_optimizer);
  if (c.first_stage_layers > 0) s += " --fix first_stage_layers=" + std::to_string(c.first_stage_layers);
  if (c.last_stage_layers > 0) s += " --fix last_stage_layers=" + std::to_string(c.last_stage_layers);
  if (c.ends_in_split) s += std::string(" --fix ends_in_split=") + (*c.ends_in_split ? "on" : "off");
  if (c.cp_comm) s += std::string(" --fix cp_comm=") + costmodel::cp_comm_type_name(*c.cp_comm);
  return s;
}

}  // namespace trainplan::executor
