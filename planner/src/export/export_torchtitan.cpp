// torchtitan: a TOML job config (--job.config_file). Sections and options from pytorch/torchtitan
// v0.2.2 (commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce, 2026-02-20):
// torchtitan/config/job_config.py ([job], [model] name/flavor, [training] local_batch_size,
// global_batch_size, seq_len, steps, mixed_precision_param/_reduce, enable_cpu_offload,
// [parallelism] data_parallel_replicate_degree, data_parallel_shard_degree,
// fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_*,
// context_parallel_degree/_rotate_method, expert_parallel_degree, [activation_checkpoint] mode, early_stop);
// torchtitan/train.py (gradient accumulation = global_batch_size / (local_batch_size * dp));
// torchtitan/distributed/pipeline_parallel.py (local batch split into pipeline micro-batches,
// stage sizes from pipeline_parallel_layers_per_stage and the first/last-stage weights);
// torchtitan/models/llama3/__init__.py (flavors 8B, 70B, 405B). v0.2.2 is the last release that
// reads TOML: commit 9810191 (2026-02-23) replaced job configs with Python ones (--module, --config).

#include <cmath>
#include <cstdio>
#include <sstream>

#include "export_writers.hpp"

namespace trainplan::planner::export_detail {

namespace cm = costmodel;
using cm::Plan;

namespace {

// The torchtitan llama3 flavor with exactly this shape, or "".
std::string llama3_flavor(const cm::ModelSpec& m) {
  struct Flavor {
    const char* name;
    int layers;
    std::int64_t hidden;
    int heads;
    std::int64_t ffn;
  };
  constexpr Flavor kFlavors[] = {{"8B", 32, 4096, 32, 14336}, {"70B", 80, 8192, 64, 28672}, {"405B", 126, 16384, 128, 53248}};
  for (const auto& f : kFlavors) {
    // ... and the flavors' rotary base (models/llama3/__init__.py: rope_theta=500000).
    if (m.layers == f.layers && m.hidden == f.hidden && m.heads == f.heads && m.kv_heads == 8 && m.ffn_hidden == f.ffn &&
        m.vocab == 128256 && m.rope_theta == 500000.0) {
      return f.name;
    }
  }
  return "";
}

const char* pipeline_schedule(cm::Schedule s) {
  switch (s) {
    case cm::Schedule::kGpipe: return "GPipe";
    case cm::Schedule::kOneFOneB: return "1F1B";
    case cm::Schedule::kInterleaved: return "Interleaved1F1B";
  }
  return "1F1B";
}

}  // namespace

std::vector<std::string> torchtitan_refusals(const Plan& plan) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  const auto n = [](long long x) { return std::to_string(x); };
  std::vector<std::string> r;
  if (m.architecture == cm::Architecture::kLlama) r = model_shape_refusals(m, "torchtitan's llama3", /*head_size=*/false, /*qkv_bias=*/false);
  if (m.architecture == cm::Architecture::kGpt) {
    r.push_back("architecture=gpt: torchtitan has no GPT model with learned positions, LayerNorm and biases (its llama3 is RMSNorm, SwiGLU, rotary)");
  }
  if (m.moe) {
    r.push_back("moe (" + n(m.moe->experts) + " experts): torchtitan's llama3 is dense, and its MoE models (deepseek_v3, gpt_oss, llama4, qwen3) are other architectures");
  }
  if (m.architecture == cm::Architecture::kLlama && m.tied_embeddings) {
    r.push_back("tied_embeddings=true: torchtitan's llama3 has separate embedding and output weights");
  }
  if (t.dropout) r.push_back("dropout=true: torchtitan's llama3 has no dropout");
  for (std::string& why : pytorch_cp_refusals(p, "torchtitan")) r.push_back(std::move(why));
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) {
    r.push_back(std::string("mode=") + cm::mode_name(t.mode) + ": torchtitan v0.2.2 has no LoRA adapters");
  }
  if (t.precision == cm::Precision::kFp16) r.push_back("precision=fp16: torchtitan trains in bfloat16 or float32");

  if (t.optimizer != cm::OptimizerKind::kAdamW) {
    r.push_back(std::string("optimizer=") + cm::optimizer_name(t.optimizer) + ": this export writes torchtitan's default optimizer, AdamW, only");
  }
  // torchtitan's DDP (data_parallel_replicate_degree without sharding) is 1-D only
  // (models/llama3/infra/parallelize.py at 42b0beb4: "DDP has not supported > 1D parallelism").
  if (p.zero_stage == 0 && p.dp > 1 && (p.tp > 1 || p.pp > 1 || p.cp > 1)) {
    r.push_back("zero_stage=0 with tp, pp or cp: torchtitan's DDP runs alone (\"DDP has not supported > 1D parallelism\"); choose zero_stage 2 or 3 "
                "(FSDP)");
  }
  // Without FSDP (no data parallelism sharded) and without CP, torchtitan's mixed precision is
  // autocast, which it turns off beside TP or PP: the model trains in float32
  // (distributed/utils.py maybe_enable_amp at v0.2.2: "Mixed precision training with TP or PP is
  // only supported when FSDP/HSDP/CP is enabled").
  const bool fsdp = p.zero_stage >= 2 && p.shard_size() > 1;  // data_parallel_shard_degree > 1, as written below
  if (t.precision != cm::Precision::kFp32 && !fsdp && p.cp == 1 && (p.tp > 1 || p.pp > 1)) {
    r.push_back(std::string("precision=") + cm::precision_name(t.precision) +
                " with tp or pp and no sharded data parallelism: torchtitan then trains in float32 (\"Mixed precision training with TP or PP is "
                "only supported when FSDP/HSDP/CP is enabled\"); shard over dp > 1 (zero_stage 2 or 3) or plan with --precision fp32");
  }
  if (p.zero_stage == 1 && p.dp > 1) {
    r.push_back("zero_stage=1: torchtitan has no optimizer-only sharding (data_parallel_replicate_degree shards nothing, "
                "data_parallel_shard_degree shards gradients and parameters too); choose zero_stage 0, 2 or 3");
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    r.push_back("sequence_parallel=false with tp=" + n(p.tp) + ": torchtitan's tensor parallel plan always shards norms along the sequence");
  }
  if (p.pp > 1 && m.layers % (p.pp * p.virtual_stages) != 0) {
    r.push_back("pp=" + n(p.pp) + ", virtual_stages=" + n(p.virtual_stages) + ": " + n(m.layers) + " layers do not split evenly");
  }
  if (p.recompute == cm::Recompute::kFull && p.recompute_layers > 0) {
    r.push_back("recompute_layers=" + n(p.recompute_layers) + ": torchtitan's full mode recomputes every layer");
  }
  const bool both_cpu = p.offload_params == cm::Offload::kCpu && p.offload_optimizer == cm::Offload::kCpu;
  if ((p.offload_params != cm::Offload::kNone || p.offload_optimizer != cm::Offload::kNone) && !both_cpu) {
    r.push_back(std::string("offload_optimizer=") + cm::offload_name(p.offload_optimizer) + ", offload_params=" + cm::offload_name(p.offload_params) +
                ": torchtitan offloads parameters, gradients and optimizer states to the CPU together (training.enable_cpu_offload) or nothing");
  }
  if (both_cpu && p.zero_stage < 2) r.push_back("offload_params=cpu: torchtitan's CPU offload is FSDP's; it needs zero_stage 2 or 3");
  if (p.reduce_dtype != cm::Dtype::kFp32) {
    r.push_back(std::string("reduce_dtype=") + cm::dtype_name(p.reduce_dtype) +
                ": torchtitan's mixed_precision_reduce is float32 only (config/job_config.py: Literal[\"float32\"])");
  }
  return r;
}

PlanExport torchtitan_export(const Plan& plan, const Derived& d) {
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const auto& m = plan.model;
  const int shard = p.zero_stage >= 2 ? p.shard_size() : 1;
  const int replicate = p.dp / shard;
  std::ostringstream o;
  o << "# torchtitan job config for the trainplan plan \"" << plan.name << "\":\n";
  o << "#   " << m.name << " on " << plan.cluster.name << ", " << d.nodes_text << "; tp " << p.tp << ", pp " << p.pp << ", cp " << p.cp
    << ", dp " << p.dp;
  if (p.zero_stage > 0) {
    o << " (ZeRO-" << p.zero_stage;
    if (p.shard_size() < p.dp) o << ", sharded over groups of " << p.shard_size();
    o << ")";
  }
  o << "\n";
  o << "# Written by `planner export --to torchtitan`. Sections and options of pytorch/torchtitan v0.2.2\n";
  o << "# (73a0e6979dd1) torchtitan/config/job_config.py, the last release that reads TOML job configs;\n";
  o << "# torchtitan after 9810191 (2026-02-23) takes Python configs (--module, --config) instead.\n";
  if (d.nodes == 1 && t.allocator == cm::Allocator::kExpandableSegments) {
    // run_train.sh sets PYTORCH_ALLOC_CONF="expandable_segments:True" before its torchrun.
    o << "# Run: CONFIG_FILE=THIS_FILE NGPU=" << plan.gpus << " ./run_train.sh\n";
    o << "#   (it sets PYTORCH_ALLOC_CONF=expandable_segments:True, as the plan assumes)\n";
  } else if (d.nodes == 1) {
    o << "# Run: torchrun --standalone --nproc-per-node " << plan.gpus << " -m torchtitan.train --job.config_file THIS_FILE\n";
    o << "#   (not ./run_train.sh: it sets PYTORCH_ALLOC_CONF=expandable_segments:True, which this plan does not assume;\n";
    o << "#   `planner --allocator expandable-segments` prices it)\n";
  } else {
    o << "# Run on each of the " << d.nodes << " nodes: " << d.launch_prefix() << "torchrun --nnodes " << d.nodes << " --nproc-per-node " << d.per_node
      << " --rdzv-backend c10d\n";
    o << "#   --rdzv-endpoint \"$MASTER_ADDR:29500\" -m torchtitan.train --job.config_file THIS_FILE\n";
  }
  o << "\n[job]\ndescription = " << double_quoted("trainplan plan " + plan.name) << "\n";
  o << "\n[model]\nname = \"llama3\"\n";
  const std::string flavor = llama3_flavor(m);
  if (flavor.empty()) {
    o << "# torchtitan has no flavor of this shape. Register it in torchtitan/models/llama3/__init__.py:\n";
    // torchtitan's FeedForward (models/llama3/model/model.py at 42b0beb4) makes its width
    // int(2 * 4 dim / 3), times ffn_dim_multiplier (int), rounded up to multiple_of: with
    // multiple_of 1 and the multiplier (ffn + 0.5) / int(8 dim / 3) it comes out at the plan's.
    const double base = std::floor(8.0 * static_cast<double>(m.hidden) / 3.0);
    char multiplier[64];
    std::snprintf(multiplier, sizeof multiplier, "%.12g", (static_cast<double>(m.ffn_hidden) + 0.5) / base);
    // The rotary base: TransformerModelArgs defaults to 10000 (models/llama3/model/args.py), Llama 3's is 500000.
    char rope_theta[32];
    std::snprintf(rope_theta, sizeof rope_theta, "%.12g", m.rope_theta);
    // The name double-quoted, a Python string literal of the same text: the line pastes into
    // Python as the name and nothing else.
    o << "#   llama3_args[" << double_quoted(m.name) << "] = TransformerModelArgs(dim=" << m.hidden << ", n_layers=" << m.layers << ", n_heads=" << m.heads
      << ", n_kv_heads=" << m.kv_heads << ", vocab_size=" << m.vocab << ", multiple_of=1, ffn_dim_multiplier=" << multiplier
      << ", rope_theta=" << rope_theta << ")\n";
    o << "# (its MLP width then comes out at the plan's " << m.ffn_hidden << ": int(" << multiplier << " * int(8 * " << m.hidden << " / 3))).\n";
    o << "flavor = " << double_quoted(m.name) << "\n";
  } else {
    o << "flavor = \"" << flavor << "\"\n";
  }
  if (t.precision == cm::Precision::kFp8) {
    // v0.2.2 components/quantization/float8.py registers the converter as "quantize.linear.float8".
    o << "# fp8: torchao's Float8Linear on the linear layers (the converter), bf16 elsewhere\n";
    o << "converters = [\"quantize.linear.float8\"]\n";
  }
  o << "\n[training]\n";
  if (p.pp > 1) {
    const long long local = t.global_batch / p.dp;
    o << "# " << t.global_batch << " sequences per step = dp " << p.dp << " x local batch " << local
      << "; the pipeline splits it into micro-batches\n";
    o << "local_batch_size = " << local << "\n";
  } else {
    o << "# " << t.global_batch << " sequences per step = dp " << p.dp << " x local batch " << p.micro_batch << " x " << d.micro_batches
      << " gradient accumulation steps (torchtitan derives them)\n";
    o << "local_batch_size = " << p.micro_batch << "\n";
  }
  o << "global_batch_size = " << t.global_batch << "\n";
  o << "seq_len = " << t.seq_len << "\n";
  o << "# " << tokens_text(t.train_tokens) << " tokens / (" << t.global_batch << " x " << t.seq_len << " tokens per step), rounded up\n";
  o << "steps = " << d.steps << "\n";
  o << "mixed_precision_param = \"" << (t.precision == cm::Precision::kFp32 ? "float32" : "bfloat16") << "\"\n";
  o << "mixed_precision_reduce = \"float32\"\n";
  if (p.offload_params == cm::Offload::kCpu) {
    o << "# Parameters, gradients and optimizer states on the CPU (FSDP's CPU offload)\nenable_cpu_offload = true\n";
  }
  o << "\n[parallelism]\n";
  if (replicate > 1 && shard > 1) o << "# Hybrid sharding (HSDP): " << replicate << " replicas of " << shard << "-way shards\n";
  o << "data_parallel_replicate_degree = " << replicate << "\n";
  o << "data_parallel_shard_degree = " << shard << "\n";
  if (shard > 1) {
    o << (p.zero_stage == 3 ? "# ZeRO-3: parameters resharded after forward\nfsdp_reshard_after_forward = \"always\"\n"
                            : "# ZeRO-2: parameters kept gathered from forward to backward\nfsdp_reshard_after_forward = \"never\"\n");
  }
  if (p.tp > 1) o << "# torchtitan's tensor parallel plan shards norms and dropout along the sequence (sequence parallelism)\n";
  o << "tensor_parallel_degree = " << p.tp << "\n";
  o << "enable_async_tensor_parallel = false\n";
  o << "pipeline_parallel_degree = " << p.pp << "\n";
  if (p.pp > 1) {
    const int per_stage = m.layers / (p.pp * p.virtual_stages);
    o << "pipeline_parallel_schedule = \"" << pipeline_schedule(p.schedule) << "\"\n";
    o << "pipeline_parallel_microbatch_size = " << p.micro_batch << "\n";
    o << "# An even split of the " << m.layers << " layers, " << per_stage << " per stage, embedding and output not counted as layers\n";
    o << "pipeline_parallel_layers_per_stage = " << per_stage << "\n";
    o << "pipeline_parallel_first_stage_less_layers = 0\n";
    o << "pipeline_parallel_last_stage_less_layers = 0\n";
  }
  o << "context_parallel_degree = " << p.cp << "\n";
  if (p.cp > 1) {
    // The plan's way of moving K/V, as the prediction above priced it (fsdp2's default is PyTorch's).
    if (pytorch_cp_ring(p)) {
      o << "# Ring attention: key/value shards passed round the " << p.cp << " ranks\n";
      o << "context_parallel_rotate_method = \"alltoall\"\n";
    } else {
      o << "# Key/value shards all-gathered once per layer and pass, their gradients passed round the " << p.cp << " ranks in float32\n";
      o << "context_parallel_rotate_method = \"allgather\"\n";
    }
  }
  o << "expert_parallel_degree = " << p.ep << "\n";
  // Selective recompute as the fsdp2 stacks price it: torchtitan's per-operator policy
  // (distributed/activation_checkpoint.py at v0.2.2: SDPA's and every other matmul's outputs saved,
  // the rest recomputed; StackSpec::op_level_selective).
  o << "\n[activation_checkpoint]\nmode = \""
    << (p.recompute == cm::Recompute::kFull ? "full" : p.recompute == cm::Recompute::kSelective ? "selective" : "none") << "\"\n";
  if (p.recompute == cm::Recompute::kSelective) {
    o << "# Per operator: the outputs of attention and of every other matmul kept, the rest recomputed in backward\n";
    o << "selective_ac_option = \"op\"\n";
  }
  // torchtitan's default since 25413d224 replays the whole block; the fsdp2 stack prices torch's
  // early stop (the replay ends before w2, StackSpec::full_recompute_replay), which this asks for.
  if (p.recompute == cm::Recompute::kFull) {
    o << "# Stop each block's replay once backward has every tensor it saved: w2 and what follows are not run again\n";
    o << "early_stop = true\n";
  }
  if (t.stack == cm::Stack::kFsdp2Compile) {
    // job_config.py Compile at v0.2.2: each transformer block compiled on its own
    // (models/llama3/infra/parallelize.py apply_compile) and the loss (components/loss.py
    // build_cross_entropy_loss), what the fsdp2-compile stack prices.
    o << "\n[compile]\n# torch.compile (Inductor) of each transformer block and of the loss\nenable = true\ncomponents = [\"model\", \"loss\"]\n";
  }
  if (t.precision == cm::Precision::kFp8) {
    // job_config.py Float8Linear. Tensorwise dynamic scaling, the output layer left in bf16, as the
    // cost model's fp8 assumes. FSDP's all-gathers move fp8 where the plan says so
    // (training.fp8_all_gather); components/quantization/float8.py refuses recipe_name beside
    // enable_fsdp_float8_all_gather, and without a recipe name torchao's default is tensorwise.
    // It turns the fp8 all-gather off where no parameters are sharded (dp_shard_enabled).
    o << "\n[quantize.linear.float8]\n";
    if (t.fp8_all_gather) {
      o << "# Tensorwise scaling (torchao's default: recipe_name is refused beside the fp8 all-gather); the linear\n"
           "# layers' weights all-gathered in fp8 with scales computed once a step, after the optimizer\n";
    } else {
      o << "recipe_name = \"tensorwise\"\n";
    }
    o << "filter_fqns = [\"output\"]\n";
    o << "enable_fsdp_float8_all_gather = " << (t.fp8_all_gather ? "true" : "false") << "\n";
    o << "precompute_float8_dynamic_scale_for_fsdp = " << (t.fp8_all_gather ? "true" : "false") << "\n";
  }
  PlanExport e;
  e.text = o.str();
  return e;
}

}  // namespace trainplan::planner::export_detail
