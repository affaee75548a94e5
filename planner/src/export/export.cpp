#include "trainplan/planner/export.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "export_writers.hpp"
#include "text_table.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Plan;
using costmodel::Result;

namespace {

struct TargetName {
  ExportTarget target;
  const char* name;
  const char* extension;
};

constexpr TargetName kTargets[] = {
    {ExportTarget::kMegatron, "megatron", "sh"},
    {ExportTarget::kTorchtitan, "torchtitan", "toml"},
    {ExportTarget::kDeepspeed, "deepspeed", "json"},
    {ExportTarget::kAccelerate, "accelerate", "yaml"},
    {ExportTarget::kLitgpt, "litgpt", "yaml"},
};

const TargetName& entry(ExportTarget target) {
  for (const auto& t : kTargets) {
    if (t.target == target) return t;
  }
  std::fprintf(stderr, "%s:%d: unknown export target\n", __FILE__, __LINE__);
  std::abort();
}

}  // namespace

const std::vector<ExportTarget>& export_targets() {
  static const std::vector<ExportTarget> targets = {ExportTarget::kMegatron, ExportTarget::kTorchtitan, ExportTarget::kDeepspeed,
                                                    ExportTarget::kAccelerate, ExportTarget::kLitgpt};
  return targets;
}

const char* export_target_name(ExportTarget target) { return entry(target).name; }

Result<ExportTarget> parse_export_target(const std::string& name) {
  std::string names;
  for (const auto& t : kTargets) {
    if (name == t.name) return t.target;
    names += (names.empty() ? "" : ", ") + std::string(t.name);
  }
  return Error{"--to: unknown stack \"" + name + "\" (one of: " + names + ")"};
}

namespace export_detail {


std::string tokens_text(double tokens) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", tokens);
  return buffer;
}

std::string lora_note(const Plan& plan) {
  const auto& t = plan.training;
  std::string targets;
  for (const auto& s : t.lora.targets) targets += (targets.empty() ? "" : ", ") + s;
  return std::string("mode=") + costmodel::mode_name(t.mode) + ": add the rank-" + std::to_string(t.lora.rank) + " adapters (" + targets +
         ") in the training script (e.g. with PEFT); the config carries no LoRA";
}

Result<Derived> derive(const Plan& plan) {
  Derived d;
  const auto& p = plan.parallel;
  d.per_node = std::min(plan.gpus, plan.cluster.gpus_per_node);
  if (d.per_node < 1 || plan.gpus % d.per_node != 0) {
    return Error{"gpus(" + std::to_string(plan.gpus) + ") is not a whole number of nodes of " +
                 std::to_string(plan.cluster.gpus_per_node) + " GPUs (" + plan.cluster.name + ")"};
  }
  d.nodes = plan.gpus / d.per_node;
  d.micro_batches = plan.training.global_batch / (static_cast<long long>(p.dp) * p.micro_batch);
  const double tokens_per_step = static_cast<double>(plan.training.global_batch) * static_cast<double>(plan.training.seq_len);
  const double steps = std::ceil(plan.training.train_tokens / tokens_per_step);
  if (!(steps <= std::ldexp(1.0, 62))) {  // a signed 64-bit step counter (--train-iters, steps) holds it
    char buf[200];
    std::snprintf(buf, sizeof buf, "/training/train_tokens: %.4g tokens are %.4g optimizer steps of %.4g tokens, more than a 64-bit step count holds",
                  plan.training.train_tokens, steps, tokens_per_step);
    return Error{buf};
  }
  d.steps = static_cast<long long>(steps);
  d.nodes_text = std::to_string(plan.gpus) + " GPUs = " + count_text(d.nodes, "node", "nodes") + " x " + std::to_string(d.per_node);
  if (const std::string conf = costmodel::allocator_conf(plan.training.allocator); !conf.empty()) {
    d.env = "PYTORCH_ALLOC_CONF=" + conf + " PYTORCH_CUDA_ALLOC_CONF=" + conf;
  }
  return d;
}

std::string double_quoted(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string refusal_error(ExportTarget target, const std::vector<std::string>& reasons) {
  std::string message;
  for (const auto& r : reasons) message += (message.empty() ? "" : "; ") + std::string(export_target_name(target)) + ": " + r;
  return message;
}

bool pytorch_cp_ring(const costmodel::ParallelConfig& p) {
  return p.cp_comm.value_or(costmodel::stack_spec(costmodel::Stack::kFsdp2).context_attention) == costmodel::ContextAttention::kRing;
}

std::vector<std::string> pytorch_cp_refusals(const costmodel::ParallelConfig& p, const char* stack) {
  if (p.cp <= 1 || p.cp_comm != costmodel::ContextAttention::kAllGatherKv) return {};
  return {std::string("cp_comm_type=all_gather: ") + stack + "'s context parallelism is PyTorch's, which rotates K/V (allgather_rotate, its "
          "default, or p2p); Megatron's all-gather with reduce-scattered gradients is not one of its methods"};
}

std::vector<std::string> model_shape_refusals(const costmodel::ModelSpec& m, const char* stack, bool head_size, bool qkv_bias) {
  const auto n = [](long long x) { return std::to_string(x); };
  const std::string block = m.architecture == costmodel::Architecture::kGpt ? "GPT" : "Llama";
  std::vector<std::string> r;
  if (m.mla) r.push_back("model " + m.name + ": multi-head latent attention: this export writes " + block + " attention only");
  if (m.head_size > 0 && m.head_size * m.heads != m.hidden && !head_size) {
    r.push_back("model " + m.name + ": head size " + n(m.head_size) + " != hidden / heads: " + stack + " has no option for it here");
  }
  if (m.sliding_window > 0) r.push_back("model " + m.name + ": sliding window " + n(m.sliding_window) + ": this export writes full causal attention only");
  if (m.moe && m.moe->shared_ffn_hidden > 0) r.push_back("model " + m.name + ": shared experts: this export writes routed experts only");
  if (m.moe && m.moe->dense_layers > 0) {
    r.push_back("model " + m.name + ": " + count_text(m.moe->dense_layers, "leading dense layer", "leading dense layers") + ": this export makes every layer's MLP a mixture of experts");
  }
  costmodel::ModelFeatures f = m.features();
  const costmodel::ModelFeatures base = costmodel::architecture_features(m.architecture);
  if (qkv_bias) f.qkv_bias = base.qkv_bias;  // written as its own option
  if (f != base) {
    std::string what;
    const auto differs = [&](bool a, bool b, const char* name) { if (a != b) what += (what.empty() ? "" : ", ") + std::string(name); };
    differs(f.layer_norm, base.layer_norm, "norm");
    differs(f.gated_mlp, base.gated_mlp, "MLP kind");
    differs(f.gelu_gate, base.gelu_gate, "gate activation (GeGLU)");
    differs(f.learned_positions, base.learned_positions, "positions");
    differs(f.alibi, base.alibi, "ALiBi");
    differs(f.qkv_bias, base.qkv_bias, "Q/K/V biases");
    differs(f.o_bias, base.o_bias, "output-projection bias");
    differs(f.mlp_bias, base.mlp_bias, "MLP biases");
    r.push_back("model " + m.name + ": " + what + " differ from the " + block + " block, the only one this export writes");
  }
  return r;
}

}  // namespace export_detail

costmodel::Stack export_stack(const Plan& plan, ExportTarget target) {
  switch (target) {
    case ExportTarget::kMegatron: return costmodel::Stack::kMegatronTe;
    case ExportTarget::kTorchtitan:  // compiled where the plan's stack is (its [compile] section)
      return plan.training.stack == costmodel::Stack::kFsdp2Compile ? costmodel::Stack::kFsdp2Compile : costmodel::Stack::kFsdp2;
    case ExportTarget::kDeepspeed: return costmodel::Stack::kDeepspeed;
    case ExportTarget::kAccelerate:  // FSDP where the plan shards, in its FSDP version (fsdp_version 1 for fsdp1, else 2); else DDP
      if (plan.parallel.dp <= 1 || plan.parallel.zero_stage < 2) return costmodel::Stack::kHfDdp;
      return costmodel::is_fsdp1(plan.training.stack) ? costmodel::Stack::kFsdp1 : costmodel::Stack::kHfFsdp2;
    case ExportTarget::kLitgpt:  // Lightning Fabric's FSDPStrategy (FSDP1) or, for LoRA, ModelParallelStrategy (FSDP2)
      if (plan.gpus == 1) return costmodel::Stack::kPytorchEager;
      return plan.training.mode == costmodel::TrainingMode::kLora || plan.training.mode == costmodel::TrainingMode::kQlora ? costmodel::Stack::kFsdp2
                                                                                                                          : costmodel::Stack::kFsdp1;
  }
  return costmodel::Stack::kPytorchEager;
}

namespace {

// The plan's own loss kernel, attention mask, pure 16-bit states and fp8 all-gather against what the target can
// be told. Megatron-LM and torchtitan build their own loss and causal mask and keep fp32 master
// weights; DeepSpeed's 16-bit optimizers keep fp32 partitions. Accelerate and DeepSpeed run the
// user's training script, where the loss and the mask live: said as notes there.
std::vector<std::string> stack_setting_refusals(const Plan& plan, ExportTarget target) {
  const auto& t = plan.training;
  std::vector<std::string> r;
  const bool own_script = target == ExportTarget::kAccelerate || target == ExportTarget::kDeepspeed;
  const costmodel::StackSpec& runs = costmodel::stack_spec(export_stack(plan, target));
  if (!t.master_weights && target != ExportTarget::kAccelerate && target != ExportTarget::kLitgpt) {
    r.push_back(std::string("master_weights=false: ") + entry(target).name +
                " keeps fp32 master weights (pure 16-bit training runs under --to accelerate or --to litgpt)");
  }
  if (!own_script && t.attention_mask == costmodel::AttentionMask::kExplicit) {
    r.push_back("attention_mask=explicit: " + std::string(entry(target).name) + " builds its own causal mask");
  }
  if (t.precision == costmodel::Precision::kFp8 && !costmodel::fp8_casting(runs, t.fp8_recipe)) {
    r.push_back(std::string("fp8_recipe=") + costmodel::fp8_recipe_name(*t.fp8_recipe) + ": " + entry(target).name + " scales fp8 tensors the " +
                costmodel::fp8_recipe_name(runs.fp8_recipe) + " way only");
  }
  if (t.fp8_all_gather && !runs.fp8_all_gather) {
    r.push_back(std::string("fp8_all_gather=true: ") + entry(target).name +
                " all-gathers 16-bit parameters (torchao's fp8 all-gather hooks FSDP2: --to torchtitan)");
  }
  if (!own_script && t.attention_kernel && *t.attention_kernel != runs.attention_kernel) {
    r.push_back(std::string("attention_kernel=") + costmodel::attention_impl_name(*t.attention_kernel) + ": " + entry(target).name +
                " picks its own attention kernel (" + costmodel::attention_impl_name(runs.attention_kernel) + ")");
  }
  if (!own_script && t.loss && *t.loss != runs.loss) {
    r.push_back(std::string("loss=") + costmodel::loss_kernel_name(*t.loss) + ": " + entry(target).name + " computes the loss its own way (" +
                costmodel::loss_kernel_name(runs.loss) + ")");
  }
  return r;
}

std::vector<std::string> script_notes(const Plan& plan, ExportTarget target) {
  const auto& t = plan.training;
  std::vector<std::string> notes;
  if (target != ExportTarget::kAccelerate && target != ExportTarget::kDeepspeed) return notes;
  if (t.loss) {
    notes.push_back(std::string("loss=") + costmodel::loss_kernel_name(*t.loss) +
                    ": the training script computes the loss (fused: flash-attn's CrossEntropyLoss(inplace_backward=True); chunked-linear: "
                    "Liger-Kernel's LigerFusedLinearCrossEntropyLoss); the config carries none");
  }
  if (t.attention_kernel) {
    notes.push_back(std::string("attention_kernel=") + costmodel::attention_impl_name(*t.attention_kernel) +
                    ": predicted for a script whose model runs that kernel (a Hugging Face model's attn_implementation; flash3: "
                    "FlashAttention-3's hopper/ build); the config carries none");
  }
  if (t.attention_mask == costmodel::AttentionMask::kExplicit) {
    notes.push_back("attention_mask=explicit: predicted for a script that hands attention a mask tensor (the whole seq x seq rectangle computed)");
  }
  if (!t.master_weights) {
    notes.push_back("master_weights=false: load the model in bf16 (from_pretrained(..., torch_dtype=torch.bfloat16)); its parameters, gradients and "
                    "AdamW states then stay bf16");
  }
  return notes;
}

}  // namespace

std::string export_prediction(const Plan& plan, ExportTarget target) {
  Plan as_run = plan;
  as_run.training.stack = export_stack(plan, target);
  // Accelerate without FSDP is DDP: nothing sharded (its one-GPU export of a ZeRO plan among them).
  if (as_run.training.stack == costmodel::Stack::kHfDdp) as_run.parallel.zero_stage = 0;
  const costmodel::Estimate e = costmodel::estimate(as_run);
  return detail::fmt("trainplan predicts for the %s stack: %.3g s per step, %s tokens/s (%s per GPU), MFU %.1f%%, %.1f of %.0f GiB per GPU%s",
                     costmodel::stack_name(as_run.training.stack), e.time.step.value(), si(e.throughput.tokens_per_second).c_str(),
                     si(e.throughput.tokens_per_second_per_gpu).c_str(), 100 * e.throughput.mfu, e.memory.required.in_gib(),
                     e.memory.capacity.in_gib(), e.fits ? "" : ": does not fit");
}

Result<PlanExport> export_plan(const Plan& plan, ExportTarget target) {
  using namespace export_detail;
  auto derived = derive(plan);
  if (!derived) return derived.error();
  std::vector<std::string> reasons;
  PlanExport out;
  switch (target) {
    case ExportTarget::kMegatron: reasons = megatron_refusals(plan); break;
    case ExportTarget::kTorchtitan: reasons = torchtitan_refusals(plan); break;
    case ExportTarget::kDeepspeed: reasons = deepspeed_refusals(plan); break;
    case ExportTarget::kAccelerate: reasons = accelerate_refusals(plan); break;
    case ExportTarget::kLitgpt: reasons = litgpt_refusals(plan); break;
  }
  for (std::string& reason : stack_setting_refusals(plan, target)) reasons.push_back(std::move(reason));
  if (!reasons.empty()) return Error{refusal_error(target, reasons)};
  switch (target) {
    case ExportTarget::kMegatron: out = megatron_export(plan, *derived); break;
    case ExportTarget::kTorchtitan: out = torchtitan_export(plan, *derived); break;
    case ExportTarget::kDeepspeed: out = deepspeed_export(plan, *derived); break;
    case ExportTarget::kAccelerate: out = accelerate_export(plan, *derived); break;
    case ExportTarget::kLitgpt: out = litgpt_export(plan, *derived); break;
  }
  // A suggested file name in the current folder: the plan's name with anything but letters,
  // digits, '.', '-' and '_' replaced (no separators, no leading dot: "../x" names no other folder).
  std::string stem = plan.name.empty() ? std::string("plan") : plan.name;
  for (char& ch : stem) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') ch = '_';
  }
  if (stem.front() == '.') stem.front() = '_';
  out.file_name = stem + "-" + entry(target).name + "." + entry(target).extension;
  // The prediction for the stack that runs the file, first among the notes and, where the format
  // has comments, on the file's first comment line.
  const std::string prediction = export_prediction(plan, target);
  out.notes.insert(out.notes.begin(), prediction);
  for (std::string& note : script_notes(plan, target)) out.notes.push_back(std::move(note));
  if (target != ExportTarget::kDeepspeed) {
    const std::size_t at = out.text.rfind("#!", 0) == 0 ? out.text.find('\n') + 1 : 0;
    out.text.insert(at, "# " + prediction + ".\n");
  }
  return out;
}

}  // namespace trainplan::planner
