// LitGPT: the YAML that `litgpt pretrain|finetune_full|finetune_lora --config FILE` reads. Keys are
// the parameters of each recipe's setup() (Lightning-AI/litgpt v0.5.13: litgpt/pretrain.py,
// litgpt/finetune/full.py, litgpt/finetune/lora.py), parsed by jsonargparse (litgpt/__main__.py),
// TrainArgs of litgpt/args.py (global_batch_size, micro_batch_size, max_tokens, max_steps,
// max_seq_length, tie_embeddings) and litgpt.Config (litgpt/config.py) for model_config.
//
// Each recipe fixes its layout in code, so a plan is written only where it is that layout:
// - pretrain: on more than one GPU, Lightning's FSDPStrategy(sharding_strategy="HYBRID_SHARD",
//   auto_wrap_policy={Block}): FSDP1 sharding within a node, replicas across nodes, and no
//   activation checkpointing (pretrain.py setup);
// - finetune_full: FSDPStrategy(activation_checkpointing_policy={Block}, limit_all_gathers=True):
//   FSDP1 FULL_SHARD over every GPU with whole blocks recomputed (finetune/full.py setup);
// - finetune_lora: ModelParallelStrategy(parallelize_fn, data_parallel_size=devices * num_nodes,
//   tensor_parallel_size=1), parallelize_fn fully_shard-ing (FSDP2) every block and trainable
//   linear over all GPUs with checkpoint_wrapper round each block (finetune/lora.py); QLoRA
//   (quantize: bnb.nf4) raises NotImplementedError on more than one GPU;
// - on one GPU, no strategy: no sharding and no recompute.
// What each reduces gradients in (lightning 2.6.6): FSDPStrategy takes its MixedPrecision from
// fabric/plugins/precision/fsdp.py (mixed_precision_config: param, reduce and buffer dtype all the
// precision's, bf16 for bf16-mixed and bf16-true); ModelParallelStrategy's fully_shard gets no
// mp_policy, so FSDP2 reduces in the parameters' dtype, which under bf16-mixed is fp32 (the
// module is built in fp32 and autocast runs the 16-bit math; the frozen weights of LoRA too).

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "export_writers.hpp"

namespace trainplan::planner::export_detail {

namespace cm = costmodel;
using cm::Plan;

namespace {

enum class Recipe { kPretrain, kFull, kLora };

Recipe recipe_of(const Plan& plan) {
  switch (plan.training.mode) {
    case cm::TrainingMode::kPretrain: return Recipe::kPretrain;
    case cm::TrainingMode::kFull: return Recipe::kFull;
    case cm::TrainingMode::kLora:
    case cm::TrainingMode::kQlora: return Recipe::kLora;
  }
  return Recipe::kPretrain;
}

const char* command_of(Recipe r) { return r == Recipe::kPretrain ? "pretrain" : r == Recipe::kFull ? "finetune_full" : "finetune_lora"; }

// The dtype a recipe's FSDP reduces gradients in on more than one GPU (see the top of this file).
cm::Dtype recipe_reduce_dtype(Recipe r, const cm::TrainingConfig& t) {
  if (t.precision == cm::Precision::kFp32) return cm::Dtype::kFp32;
  if (r == Recipe::kLora && t.master_weights) return cm::Dtype::kFp32;  // bf16-mixed: fp32 parameters
  return cm::Dtype::kBf16;
}

// The recompute a recipe runs with on `gpus` GPUs.
cm::Recompute recipe_recompute(Recipe r, int gpus) { return gpus > 1 && r != Recipe::kPretrain ? cm::Recompute::kFull : cm::Recompute::kNone; }

}  // namespace

std::vector<std::string> litgpt_refusals(const Plan& plan) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  const auto n = [](long long x) { return std::to_string(x); };
  const Recipe recipe = recipe_of(plan);
  const std::string cmd = std::string("litgpt ") + command_of(recipe);
  std::vector<std::string> r;
  if (m.architecture == cm::Architecture::kGpt) r.push_back("architecture=gpt: LitGPT's models use rotary positions, not learned ones");
  if (recipe == Recipe::kPretrain) {
    for (std::string& reason : model_shape_refusals(m, "LitGPT", /*head_size=*/true, /*qkv_bias=*/true)) r.push_back(std::move(reason));
  }
  if (p.tp > 1) r.push_back("tp=" + n(p.tp) + ": " + cmd + " runs data parallelism only (its strategy has no tensor parallelism)");
  if (p.pp > 1) r.push_back("pp=" + n(p.pp) + ": " + cmd + " has no pipeline parallelism");
  if (p.cp > 1) r.push_back("cp=" + n(p.cp) + ": " + cmd + " has no context parallelism");
  if (p.ep > 1) r.push_back("ep=" + n(p.ep) + ": " + cmd + " has no expert parallelism");
  if (plan.gpus > 1) {
    const int per_node = std::min(plan.gpus, plan.cluster.gpus_per_node);
    if (recipe == Recipe::kPretrain) {
      if (p.zero_stage != 3 || p.shard_size() != per_node) {
        r.push_back("zero_stage=" + n(p.zero_stage) + (p.zero_stage == 3 ? ", shard_group=" + n(p.shard_size()) : std::string()) + ": " + cmd +
                    " shards with FSDP HYBRID_SHARD, ZeRO-3 within each node of " + n(per_node) + " GPUs and replicas across nodes (pretrain.py)");
      }
    } else if (p.zero_stage != 3 || p.shard_size() != p.dp) {
      r.push_back("zero_stage=" + n(p.zero_stage) + (p.zero_stage == 3 ? ", shard_group=" + n(p.shard_size()) : std::string()) + ": " + cmd +
                  " shards parameters, gradients and optimizer states over all " + n(plan.gpus) + " GPUs (ZeRO-3, FSDP " +
                  (recipe == Recipe::kFull ? "FULL_SHARD" : "fully_shard") + ")");
    }
  }
  const cm::Recompute runs = recipe_recompute(recipe, plan.gpus);
  if (p.recompute != runs) {
    r.push_back(std::string("recompute=") + cm::recompute_name(p.recompute) + ": " + cmd + " on " + n(plan.gpus) + " GPU" + (plan.gpus > 1 ? "s" : "") +
                " runs recompute=" + cm::recompute_name(runs) +
                (runs == cm::Recompute::kFull ? " (every block checkpointed)" : " (no activation checkpointing)"));
  } else if (p.recompute == cm::Recompute::kFull && p.recompute_layers > 0) {
    r.push_back("recompute_layers=" + n(p.recompute_layers) + ": " + cmd + " checkpoints every block");
  }
  if (p.offload_optimizer != cm::Offload::kNone || p.offload_params != cm::Offload::kNone) r.push_back("offload: " + cmd + " offloads nothing to the CPU");
  if (t.precision == cm::Precision::kFp8 || t.precision == cm::Precision::kFp16) {
    r.push_back(std::string("precision=") + cm::precision_name(t.precision) + ": " + cmd + " trains in bf16-mixed, bf16-true or 32-true");
  }
  if (!t.master_weights && t.precision != cm::Precision::kBf16) r.push_back("master_weights=false: LitGPT's pure 16-bit precision is bf16-true");
  if (plan.gpus > 1 && p.reduce_dtype != recipe_reduce_dtype(recipe, t)) {
    r.push_back(std::string("reduce_dtype=") + cm::dtype_name(p.reduce_dtype) + ": " + cmd + " reduces gradients in " +
                cm::dtype_name(recipe_reduce_dtype(recipe, t)) +
                (recipe == Recipe::kLora ? " (FSDP2 without a mixed-precision policy: the parameters' dtype)"
                                         : " (Lightning's FSDPPrecision: the precision's dtype; --stack fsdp1 plans so)"));
  }
  if (t.optimizer != cm::OptimizerKind::kAdamW) r.push_back(std::string("optimizer=") + cm::optimizer_name(t.optimizer) + ": this export writes AdamW only");
  if (t.mode == cm::TrainingMode::kQlora && plan.gpus > 1) r.push_back("mode=qlora on " + n(plan.gpus) + " GPUs: LitGPT quantizes on one GPU only");
  if (t.mode == cm::TrainingMode::kQlora && t.lora.base_format != cm::QuantFormat::kNf4) {
    r.push_back("base_format: this export writes LitGPT's bnb.nf4 quantization only");
  }
  if (recipe == Recipe::kLora) {
    const auto& lora = t.lora;
    const bool mlp = lora.targets_include("gate") || lora.targets_include("up") || lora.targets_include("down");
    if (mlp && !(lora.targets_include("gate") && lora.targets_include("up") && lora.targets_include("down"))) {
      r.push_back("lora targets: LitGPT's lora_mlp puts adapters on gate, up and down together");
    }
  }
  return r;
}

PlanExport litgpt_export(const Plan& plan, const Derived& d) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  const Recipe recipe = recipe_of(plan);
  PlanExport e;
  e.notes.push_back(std::string("litgpt: data: ") +
                    (recipe == Recipe::kPretrain ? "pretrain reads TinyLlama's dataset unless the config names one (data: class_path litgpt.data.TextFiles ...)"
                                                 : "finetuning reads Alpaca unless the config names a dataset (data: class_path litgpt.data.JSON ...)"));
  if (recipe != Recipe::kPretrain) e.notes.push_back("litgpt: checkpoint_dir: the model's shape comes from its checkpoint (litgpt download), not this file");
  // QLoRA: LitGPT refuses quantization under mixed precision (finetune/lora.py: "Quantization and
  // mixed precision is not supported."), so the recipe runs in bf16-true.
  const bool qlora_true = t.mode == cm::TrainingMode::kQlora && t.master_weights && t.precision == cm::Precision::kBf16;
  if (qlora_true) {
    e.notes.push_back("litgpt: precision bf16-true, as LitGPT quantizes only without mixed precision: the adapters and their AdamW states in "
                      "bf16, not beside fp32 masters as predicted (a few bytes a parameter of the adapters)");
  } else if (recipe == Recipe::kLora && t.master_weights && t.precision == cm::Precision::kBf16) {
    e.notes.push_back(std::string("litgpt: precision bf16-mixed builds the model in fp32, so the frozen weights take 4 bytes a parameter") +
                      (plan.gpus > 1 ? " and FSDP2 gathers them in fp32" : "") +
                      ", twice what the prediction has; bf16-true (a plan with master_weights false) keeps them in bf16");
  }
  std::ostringstream o;
  o << "# LitGPT config for the trainplan plan " << double_quoted(plan.name) << ":\n";
  o << "#   " << m.name << " on " << plan.cluster.name << ", " << d.nodes_text << "; dp " << p.dp
    << (plan.gpus == 1 ? "" : recipe == Recipe::kPretrain && d.nodes > 1 ? " (FSDP HYBRID_SHARD: ZeRO-3 within each node, replicas across nodes)"
                                : recipe == Recipe::kLora                 ? " (FSDP2 fully_shard: ZeRO-3)"
                                                                          : " (FSDP FULL_SHARD: ZeRO-3)")
    << "\n";
  o << "# Written by `planner export --to litgpt`: the parameters of litgpt " << command_of(recipe) << "'s setup() (Lightning-AI/litgpt\n";
  o << "# v0.5.13), which also fixes its layout: " << (recipe == Recipe::kPretrain ? "no activation checkpointing" : "every block recomputed on more than one GPU")
    << ".\n";
  for (const auto& note : e.notes) o << "# " << note << ".\n";
  if (d.nodes == 1) {
    o << "# Run: " << d.launch_prefix() << "litgpt " << command_of(recipe) << " --config THIS_FILE\n";
  } else {
    o << "# Run on each of the " << d.nodes << " nodes (Lightning Fabric reads MASTER_ADDR, MASTER_PORT and NODE_RANK):\n";
    o << "#   " << d.launch_prefix() << "litgpt " << command_of(recipe) << " --config THIS_FILE\n";
  }
  if (recipe == Recipe::kPretrain) {
    o << "model_name: " << double_quoted(m.name) << "\n";
    o << "model_config:\n";
    o << "  name: " << double_quoted(m.name) << "\n";
    o << "  block_size: " << std::max<long long>(m.max_seq_len, t.seq_len) << "\n";
    o << "  vocab_size: " << m.vocab << "\n  padded_vocab_size: " << m.vocab << "\n";
    o << "  n_layer: " << m.layers << "\n  n_head: " << m.heads << "\n  n_embd: " << m.hidden << "\n";
    o << "  n_query_groups: " << m.kv_heads << "\n";
    if (m.head_size > 0) o << "  head_size: " << m.head_size << "\n";
    o << "  rotary_percentage: 1.0\n  parallel_residual: false\n  bias: false\n";
    if (m.features().qkv_bias) o << "  attn_bias: true\n";
    o << "  norm_class_name: RMSNorm\n  norm_eps: 1.0e-05\n";
    if (m.moe) {
      o << "  mlp_class_name: LLaMAMoE\n  moe_intermediate_size: " << m.ffn_hidden << "\n";
      o << "  n_expert: " << m.moe->experts << "\n  n_expert_per_token: " << m.moe->top_k << "\n";
    } else {
      o << "  mlp_class_name: LLaMAMLP\n  intermediate_size: " << m.ffn_hidden << "\n";
    }
  } else {
    o << "# The base model's LitGPT checkpoint (litgpt download <repo>): replace with yours\n";
    o << "checkpoint_dir: " << double_quoted("checkpoints/" + m.name) << "\n";
  }
  o << "precision: " << (!t.master_weights || qlora_true ? "bf16-true" : t.precision == cm::Precision::kBf16 ? "bf16-mixed" : "32-true") << "\n";
  if (t.mode == cm::TrainingMode::kQlora) o << "quantize: bnb.nf4\n";
  if (recipe == Recipe::kLora) {
    o << "lora_r: " << t.lora.rank << "\n";
    char alpha[32];
    std::snprintf(alpha, sizeof alpha, "%g", t.lora.alpha);
    o << "lora_alpha: " << alpha << "\n";
    std::snprintf(alpha, sizeof alpha, "%g", t.lora.dropout);
    o << "lora_dropout: " << alpha << "\n";
    o << "lora_query: " << (t.lora.targets_include("q") ? "true" : "false") << "\n";
    o << "lora_key: " << (t.lora.targets_include("k") ? "true" : "false") << "\n";
    o << "lora_value: " << (t.lora.targets_include("v") ? "true" : "false") << "\n";
    o << "lora_projection: " << (t.lora.targets_include("o") ? "true" : "false") << "\n";
    o << "lora_mlp: " << (t.lora.targets_include("gate") ? "true" : "false") << "\n";
    o << "lora_head: false\n";
  }
  o << "devices: " << d.per_node << "\nnum_nodes: " << d.nodes << "\n";
  o << "train:\n";
  o << "  # " << t.global_batch << " sequences per step = " << plan.gpus << " GPUs x micro-batch " << p.micro_batch << " x " << d.micro_batches
    << " accumulation steps (TrainArgs.gradient_accumulation_iters)\n";
  o << "  global_batch_size: " << t.global_batch << "\n  micro_batch_size: " << p.micro_batch << "\n";
  o << "  max_seq_length: " << t.seq_len << "\n";
  if (recipe == Recipe::kPretrain) {
    o << "  max_tokens: " << static_cast<long long>(d.steps) * t.global_batch * t.seq_len << "\n";
    o << "  tie_embeddings: " << (m.tied_embeddings ? "true" : "false") << "\n";
  } else {
    o << "  max_steps: " << d.steps << "\n";
  }
  o << "optimizer: AdamW\n";
  e.text = o.str();
  return e;
}

}  // namespace trainplan::planner::export_detail
