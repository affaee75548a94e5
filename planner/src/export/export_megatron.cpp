// Megatron-LM: a bash script that starts pretrain_gpt.py under torchrun with the plan's arguments.
// Option names from NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
// megatron/training/arguments.py, which also turns the fields of
// megatron/core/model_parallel_config.py (tensor_model_parallel_size, sequence_parallel, bf16, ...),
// megatron/core/transformer/transformer_config.py (num_layers, num_query_groups, recompute_*,
// fp8 as --fp8-format, add_bias_linear as --disable-bias-linear, ...),
// megatron/core/distributed/distributed_data_parallel_config.py and
// megatron/training/config/*.py (micro_batch_size, train_iters, use_megatron_fsdp, tokenizer_type,
// lr_decay_style, ...) into options (megatron/training/argument_utils.py ArgumentGroupFactory:
// field name with '-' for '_'). The distributed optimizer shards optimizer states and fp32 master
// weights but keeps a full gradient buffer (ZeRO-1); Megatron FSDP's
// --data-parallel-sharding-strategy optim_grads / optim_grads_params is ZeRO-2 / ZeRO-3.

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "export_writers.hpp"
#include "trainplan/costmodel/estimate.hpp"

namespace trainplan::planner::export_detail {

namespace cm = costmodel;
using cm::Plan;

std::vector<std::string> megatron_refusals(const Plan& plan) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  // A Llama block with Q/K/V biases (Qwen2) is --disable-bias-linear --add-qkv-bias.
  std::vector<std::string> r = model_shape_refusals(m, "Megatron-LM", /*head_size=*/true, /*qkv_bias=*/m.architecture == cm::Architecture::kLlama);
  if (plan.parallel.cp > 1 && plan.parallel.cp_comm == cm::ContextAttention::kAllGatherRotate) {
    r.push_back("cp_comm_type=allgather_rotate: that is PyTorch's context parallelism; Megatron-LM's --cp-comm-type takes p2p, all_gather, a2a");
  }
  const auto n = [](long long x) { return std::to_string(x); };
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) {
    r.push_back(std::string("mode=") + cm::mode_name(t.mode) + ": pretrain_gpt.py trains every weight; it has no LoRA or QLoRA adapters");
  }
  if (p.pp > 1 && p.schedule == cm::Schedule::kGpipe) r.push_back("schedule=gpipe: Megatron-LM runs 1F1B and interleaved 1F1B pipelines only");
  if (p.offload_params != cm::Offload::kNone) {
    r.push_back(std::string("offload_params=") + cm::offload_name(p.offload_params) +
                ": Megatron-LM keeps sharded parameters on the GPU (its --cpu-offloading-weights, Transformer Engine's, moves a layer's "
                "weights out between its forward and backward, which is not ZeRO-Infinity's parameter offload the plan states)");
  }
  if (p.offload_optimizer == cm::Offload::kNvme) r.push_back("offload_optimizer=nvme: Megatron-LM offloads the optimizer to the CPU only");
  if (p.offload_optimizer == cm::Offload::kCpu && p.zero_stage == 0) {
    r.push_back("offload_optimizer=cpu with zero_stage=0: --optimizer-cpu-offload needs the distributed optimizer (zero_stage >= 1)");
  }
  if (p.recompute == cm::Recompute::kFull && p.recompute_layers > 0 && p.virtual_stages > 1) {
    r.push_back("recompute_layers=" + n(p.recompute_layers) + " with virtual_stages=" + n(p.virtual_stages) +
                ": --recompute-method block counts layers per model chunk, not per stage");
  }
  if (t.optimizer == cm::OptimizerKind::kAdafactor || t.optimizer == cm::OptimizerKind::kAdam8bit) {
    r.push_back(std::string("optimizer=") + cm::optimizer_name(t.optimizer) + ": Megatron-LM's --optimizer has adam (AdamW) and sgd, not this one");
  }
  // Megatron reduces in its main-grad buffer's dtype (arguments.py validate_args): --bf16 in fp32
  // unless --grad-reduce-in-bf16; --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32;
  // fp32 parameters in fp32.
  const cm::Dtype half = t.precision == cm::Precision::kFp16 ? cm::Dtype::kFp16 : cm::Dtype::kBf16;
  if (p.reduce_dtype != cm::Dtype::kFp32 && (t.precision == cm::Precision::kFp32 || p.reduce_dtype != half)) {
    r.push_back(std::string("reduce_dtype=") + cm::dtype_name(p.reduce_dtype) + ": Megatron-LM reduces " + cm::precision_name(t.precision) +
                " gradients in fp32" + (t.precision == cm::Precision::kFp32 ? std::string() : std::string(" or ") + cm::dtype_name(half)));
  }
  return r;
}

PlanExport megatron_export(const Plan& plan, const Derived& d) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  const bool llama = m.architecture == cm::Architecture::kLlama;
  std::ostringstream o;
  o << "#!/bin/bash\n";
  o << "# Megatron-LM pretrain_gpt.py for the trainplan plan \"" << plan.name << "\":\n";
  o << "#   " << m.name << " on " << plan.cluster.name << ", " << d.nodes_text << "; tp " << p.tp << ", pp " << p.pp << ", cp " << p.cp
    << ", dp " << p.dp << (p.ep > 1 ? ", ep " + std::to_string(p.ep) : "") << "\n";
  o << "#   (Megatron derives dp from the world size: " << plan.gpus << " / (tp " << p.tp << " * pp " << p.pp << " * cp " << p.cp
    << ") = " << p.dp << ").\n";
  o << "# Written by `planner export --to megatron`. Option names from NVIDIA/Megatron-LM d98e8a64dd:\n";
  o << "# megatron/training/arguments.py and the dataclasses it turns into options\n";
  o << "# (megatron/core/model_parallel_config.py, megatron/core/transformer/transformer_config.py).\n";
  if (d.nodes > 1) {
    o << "# Run it from a Megatron-LM checkout on each node, with NODE_RANK (0 to " << d.nodes - 1 << ") and MASTER_ADDR\n";
    o << "# (the first node's host name) set.\n";
  } else {
    o << "# Run it from a Megatron-LM checkout.\n";
  }
  o << "set -euo pipefail\nNODE_RANK=${NODE_RANK:-0}\nMASTER_ADDR=${MASTER_ADDR:-localhost}\n";
  // megatron/training/arguments.py (validate_args): before Blackwell, tensor or context
  // parallelism asserts CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue keeps the TP
  // communication ahead of the GEMMs that wait for it); Megatron FSDP asserts it is not 1.
  const int sharding = p.dp > 1 ? p.zero_stage : std::min(p.zero_stage, 1);
  if (sharding >= 2) {
    o << "# Megatron FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (megatron/training/arguments.py)\n";
    o << "unset CUDA_DEVICE_MAX_CONNECTIONS\n";
  } else if (p.tp > 1 || p.cp > 1) {
    o << "# Tensor or context parallelism: one CUDA connection, as megatron/training/arguments.py requires before Blackwell\n";
    o << "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
  }
  if (!d.env.empty()) {
    o << "# PyTorch's expandable segments, as the plan was priced (PYTORCH_CUDA_ALLOC_CONF for PyTorch before 2.9)\n";
    o << "export " << d.env << "\n";
  }
  o << "\nARGS=(\n";
  const auto line = [&o](const std::string& s) { o << "  " << s << "\n"; };
  line("# Model: " + m.name + (!llama ? " (GPT: LayerNorm, GELU, learned positions, biases)"
                                     : m.features().qkv_bias ? " (Llama: RMSNorm, SwiGLU, rotary positions, biases on Q, K and V only)"
                                                             : " (Llama: RMSNorm, SwiGLU, rotary positions, no biases)"));
  line("--num-layers " + std::to_string(m.layers));
  line("--hidden-size " + std::to_string(m.hidden));
  line("--num-attention-heads " + std::to_string(m.heads));
  if (m.kv_heads != m.heads) {
    line("--group-query-attention");
    line("--num-query-groups " + std::to_string(m.kv_heads));
  }
  // kv_channels and add_qkv_bias: TransformerConfig fields (transformer_config.py), as options.
  if (m.head_size > 0 && m.head_size * m.heads != m.hidden) line("--kv-channels " + std::to_string(m.head_size));
  line("--ffn-hidden-size " + std::to_string(m.ffn_hidden));
  line("--seq-length " + std::to_string(t.seq_len));
  // validate_args asserts max_position_embeddings >= seq_length. With rotary positions it only
  // sizes the rotary table, so a plan that trains past the model's context (a long-context
  // extension) writes its own length; learned positions never get here (the plan refuses them).
  line("--max-position-embeddings " + std::to_string(std::max<long long>(m.max_seq_len, t.seq_len)));
  if (llama) {
    line("--swiglu");
    line("--normalization RMSNorm");
    line("--position-embedding-type rope");
    // The rotary base (arguments.py --rotary-base, an int, 10000 by default): Llama 3's is 500000.
    if (m.rope_theta != 10000.0) {
      char base[32];
      std::snprintf(base, sizeof base, "%.0f", m.rope_theta);
      line(std::string("--rotary-base ") + base);
    }
    line("--disable-bias-linear");
    if (m.features().qkv_bias) line("--add-qkv-bias");
  } else {
    line("--normalization LayerNorm");
    line("--position-embedding-type learned_absolute");
  }
  if (!m.tied_embeddings) line("--untie-embeddings-and-output-weights");
  if (!t.dropout) {
    line("--attention-dropout 0.0");
    line("--hidden-dropout 0.0");
  }
  if (m.moe) {
    line("# Mixture of experts: every layer's MLP");
    line("--num-experts " + std::to_string(m.moe->experts));
    line("--moe-router-topk " + std::to_string(m.moe->top_k));
    line("--moe-ffn-hidden-size " + std::to_string(m.moe->expert_ffn_hidden));
  }
  // The model chunks' layers as the estimate (and the executor) split them: evenly where they
  // can, otherwise fewer where the embedding and the loss sit, or as the plan's first and last
  // stage layers say. An uneven split is Megatron's --pipeline-model-parallel-layout: one entry
  // per model chunk in layer order (chunk c on rank c % pp), "E" the embedding, "t" a decoder
  // layer, "L" the loss (megatron/core/transformer/pipeline_parallel_layer_layout.py).
  const std::vector<int> chunk_layers = p.pp > 1 ? cm::estimate(plan).pipeline.chunk_layers : std::vector<int>{};
  const bool even = std::all_of(chunk_layers.begin(), chunk_layers.end(), [&](int c) { return c == chunk_layers.front(); });
  std::string layout;
  for (std::size_t c = 0; c < chunk_layers.size(); ++c) {
    layout += c == 0 ? "E" : "|";
    layout += chunk_layers[c] == 1 ? std::string("t") : chunk_layers[c] > 1 ? "t*" + std::to_string(chunk_layers[c]) : std::string();
  }
  if (!layout.empty()) layout += "L";
  if (p.pp > 1 && !even) {
    line("# Parallelism: " + std::string(p.schedule == cm::Schedule::kInterleaved ? "interleaved 1F1B with " + std::to_string(p.virtual_stages) +
                                                                                        " model chunks per pipeline rank"
                                                                                  : "1F1B") +
         ", layers per model chunk " + [&] {
           std::string s;
           for (int c : chunk_layers) s += (s.empty() ? "" : "/") + std::to_string(c);
           return s;
         }() + " (fewer where the embedding and the loss sit)");
  } else if (p.pp > 1 && p.schedule == cm::Schedule::kInterleaved) {
    line("# Parallelism: interleaved 1F1B with " + std::to_string(p.virtual_stages) + " model chunks per pipeline rank (" +
         std::to_string(m.layers) + " / (" + std::to_string(p.pp) + " * " + std::to_string(p.virtual_stages) + ") = " +
         std::to_string(m.layers / (p.pp * p.virtual_stages)) + " layers each)");
  } else {
    line(p.pp > 1 ? "# Parallelism: 1F1B" : "# Parallelism");
  }
  line("--tensor-model-parallel-size " + std::to_string(p.tp));
  line("--pipeline-model-parallel-size " + std::to_string(p.pp));
  if (p.pp > 1 && !even) {
    line("--pipeline-model-parallel-layout \"" + layout + "\"");
  } else if (p.pp > 1 && p.schedule == cm::Schedule::kInterleaved) {
    line("--num-layers-per-virtual-pipeline-stage " + std::to_string(m.layers / (p.pp * p.virtual_stages)));
  }
  if (p.cp > 1) line("--context-parallel-size " + std::to_string(p.cp));
  if (p.cp > 1 && p.cp_comm) line(std::string("--cp-comm-type ") + cm::cp_comm_type_name(*p.cp_comm));
  if (p.ep > 1) line("--expert-model-parallel-size " + std::to_string(p.ep));
  if (p.sequence_parallel && p.tp > 1) line("--sequence-parallel");
  const int zero = p.dp > 1 ? p.zero_stage : std::min(p.zero_stage, 1);
  if (zero == 0) {
    line("# Data parallelism: DDP (gradients all-reduced)");
  } else if (zero == 1) {
    line("# ZeRO-1: Megatron's distributed optimizer shards optimizer states and fp32 master weights over dp");
    line("--use-distributed-optimizer");
  } else {
    line(zero == 2 ? "# ZeRO-2: Megatron FSDP shards optimizer states and gradients over dp"
                   : "# ZeRO-3: Megatron FSDP shards optimizer states, gradients and parameters over dp");
    line("--use-megatron-fsdp");
    line(std::string("--data-parallel-sharding-strategy ") + (zero == 2 ? "optim_grads" : "optim_grads_params"));
    if (zero == 3 && p.shard_size() < p.dp) {
      // Hybrid FSDP: mcore_fsdp_adapter.py _init_dist_index enables it when
      // num_distributed_optimizer_instances > 1, sharding within each "intra partial" data-parallel
      // group of dp x cp / instances consecutive ranks (parallel_state.py) and replicating across
      // them (--outer-dp-sharding-strategy no_shard, the default): the plan's shard_group x cp.
      const int replicas = p.dp / p.shard_size();
      line("# Hybrid sharding (HSDP): " + std::to_string(replicas) + " replicas of " + std::to_string(p.shard_size()) +
           "-way shards, the gradients all-reduced across replicas");
      line("--num-distributed-optimizer-instances " + std::to_string(replicas));
    }
    line("# Megatron FSDP checkpoints only in its DTensor format (arguments.py asserts it)");
    line("--ckpt-format fsdp_dtensor");
  }
  if (p.overlap_grad_reduce) {
    line("--overlap-grad-reduce");
    if (zero >= 1) line("--overlap-param-gather");
  }
  if (p.reduce_dtype == cm::Dtype::kBf16) line("--grad-reduce-in-bf16");
  if (t.precision == cm::Precision::kFp16 && p.reduce_dtype == cm::Dtype::kFp32) {
    line("# Gradients accumulated and reduced in fp32 (--fp16 alone keeps them in fp16)");
    line("--accumulate-allreduce-grads-in-fp32");
  }
  if (p.offload_optimizer == cm::Offload::kCpu) {
    line("# Optimizer states and step on the CPU (the CPU offload needs the precision-aware optimizer)");
    line("--optimizer-cpu-offload");
    line("--optimizer-offload-fraction 1.0");
    line("--use-precision-aware-optimizer");
  }
  line("# Batch: " + std::to_string(t.global_batch) + " sequences per step = dp " + std::to_string(p.dp) + " x " +
       std::to_string(d.micro_batches) + " micro-batches of " + std::to_string(p.micro_batch) + "; " + tokens_text(t.train_tokens) + " tokens");
  line("--micro-batch-size " + std::to_string(p.micro_batch));
  line("--global-batch-size " + std::to_string(t.global_batch));
  line("--train-iters " + std::to_string(d.steps));
  switch (t.precision) {
    case cm::Precision::kBf16: line("# Precision"); line("--bf16"); break;
    case cm::Precision::kFp16: line("# Precision"); line("--fp16"); break;
    case cm::Precision::kFp32: line("# Precision: fp32 (neither --bf16 nor --fp16)"); break;
    case cm::Precision::kFp8:
      line("# Precision: fp8 matrix multiplies through Transformer Engine (e4m3 forward, e5m2 gradients), bf16 elsewhere");
      line("--bf16");
      line("--fp8-format hybrid");
      if (t.fp8_recipe == cm::Fp8Recipe::kCurrent) {
        line("# fp8 current scaling (Transformer Engine's Float8CurrentScaling), as the plan states; Megatron's default is delayed");
        line("--fp8-recipe tensorwise");
      }
      break;
  }
  if (p.recompute == cm::Recompute::kSelective) {
    line("# Recompute: selective (the attention core, Korthikanti et al. 2022; --recompute-modules defaults to core_attn)");
    line("--recompute-granularity selective");
  } else if (p.recompute == cm::Recompute::kFull) {
    if (p.recompute_layers > 0) {
      line("# Recompute: " + std::to_string(p.recompute_layers) + " layers of each pipeline stage");
      line("--recompute-granularity full");
      line("--recompute-method block");
      line("--recompute-num-layers " + std::to_string(p.recompute_layers));
    } else {
      line("# Recompute: every layer of every stage");
      line("--recompute-granularity full");
      line("--recompute-method uniform");
      line("--recompute-num-layers 1");
    }
  }
  if (t.optimizer == cm::OptimizerKind::kSgdMomentum) {
    line("# Optimizer: SGD with momentum");
    line("--optimizer sgd");
    line("--sgd-momentum 0.9");
  } else {
    line("# Optimizer: Megatron's adam is AdamW (decoupled weight decay by default)");
    line("--optimizer adam");
  }
  if (t.mode == cm::TrainingMode::kFull) line("# Fine-tuning (mode full): add --load YOUR_CHECKPOINT --finetune");
  line("# Data: mock data and a null tokenizer; replace with --data-path and your tokenizer");
  line("--mock-data");
  line("--tokenizer-type NullTokenizer");
  line("--vocab-size " + std::to_string(m.vocab));
  line("# Not in the plan: learning-rate schedule and optimizer settings (Llama 2's); set yours");
  line("--lr 3.0e-4");
  line("--min-lr 3.0e-5");
  line("--lr-decay-style cosine");
  line("--lr-warmup-fraction 0.01");
  line("--weight-decay 0.1");
  if (t.optimizer != cm::OptimizerKind::kSgdMomentum) {
    line("--adam-beta1 0.9");
    line("--adam-beta2 0.95");
  }
  line("--clip-grad 1.0");
  o << ")\n\n";
  o << "torchrun --nnodes " << d.nodes << " --nproc-per-node " << d.per_node
    << " --node-rank \"$NODE_RANK\" --master-addr \"$MASTER_ADDR\" --master-port 29500 \\\n";
  o << "  pretrain_gpt.py \"${ARGS[@]}\"\n";
  PlanExport e;
  e.text = o.str();
  e.notes.push_back("megatron: --lr, --min-lr, --lr-decay-style, --lr-warmup-fraction, --weight-decay, --adam-beta1/2 and --clip-grad are not in the plan (Llama 2's values); --mock-data and NullTokenizer stand for your data");
  return e;
}

}  // namespace trainplan::planner::export_detail
