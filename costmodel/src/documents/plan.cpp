#include "trainplan/costmodel/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan::costmodel {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    case Precision::kFp8: return "fp8";
  }
  return "?";
}
const char* optimizer_name(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kSgdMomentum: return "sgd";
    case OptimizerKind::kAdafactor: return "adafactor";
    case OptimizerKind::kAdam8bit: return "adam8bit";
  }
  return "?";
}
const char* mode_name(TrainingMode m) {
  switch (m) {
    case TrainingMode::kPretrain: return "pretrain";
    case TrainingMode::kFull: return "full";
    case TrainingMode::kLora: return "lora";
    case TrainingMode::kQlora: return "qlora";
  }
  return "?";
}
const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe: return "gpipe";
    case Schedule::kOneFOneB: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
  }
  return "?";
}
const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}
const char* offload_name(Offload o) {
  switch (o) {
    case Offload::kNone: return "none";
    case Offload::kCpu: return "cpu";
    case Offload::kNvme: return "nvme";
  }
  return "?";
}

const char* allocator_name(Allocator a) { return a == Allocator::kExpandableSegments ? "expandable-segments" : "caching"; }

std::optional<Allocator> allocator_from_name(const std::string& name) {
  if (name == "caching") return Allocator::kCaching;
  if (name == "expandable-segments") return Allocator::kExpandableSegments;
  return std::nullopt;
}

const char* allocator_conf(Allocator a) { return a == Allocator::kExpandableSegments ? "expandable_segments:True" : ""; }

Allocator allocator_of_conf(const std::string& conf) {
  const std::string key = "expandable_segments";
  const std::size_t at = conf.find(key);
  if (at == std::string::npos) return Allocator::kCaching;
  std::size_t i = at + key.size();
  const auto skip_spaces = [&] {
    while (i < conf.size() && (conf[i] == ' ' || conf[i] == '\t')) ++i;
  };
  skip_spaces();
  if (i >= conf.size() || conf[i] != ':') return Allocator::kCaching;
  ++i;
  skip_spaces();
  return conf.compare(i, 4, "True") == 0 ? Allocator::kExpandableSegments : Allocator::kCaching;
}

bool ParallelConstraints::fully_fixed() const {
  return tp && pp && dp && cp && ep && zero_stage && micro_batch && virtual_stages && sequence_parallel &&
         schedule && recompute && offload_optimizer && shard_group;
}

ParallelConfig ParallelConstraints::fixed() const {
  ParallelConfig p;
  p.tp = *tp; p.pp = *pp; p.dp = *dp; p.cp = *cp; p.ep = *ep;
  p.zero_stage = *zero_stage; p.shard_group = *shard_group; p.micro_batch = *micro_batch;
  p.virtual_stages = *virtual_stages; p.sequence_parallel = *sequence_parallel;
  p.schedule = *schedule; p.recompute = *recompute; p.offload_optimizer = *offload_optimizer;
  p.recompute_layers = recompute_layers;
  p.first_stage_layers = first_stage_layers;
  p.last_stage_layers = last_stage_layers;
  p.ends_in_split = ends_in_split.value_or(false);
  p.offload_params = offload_params; p.fsdp_wrap_min_params = fsdp_wrap_min_params;
  p.prefetch = prefetch; p.reduce_dtype = reduce_dtype; p.overlap_grad_reduce = overlap_grad_reduce;
  p.cp_comm = cp_comm;
  return p;
}

ParallelConstraints ParallelConstraints::of(const ParallelConfig& p) {
  ParallelConstraints c;
  c.tp = p.tp; c.pp = p.pp; c.dp = p.dp; c.cp = p.cp; c.ep = p.ep;
  c.zero_stage = p.zero_stage; c.shard_group = p.shard_group; c.micro_batch = p.micro_batch;
  c.virtual_stages = p.virtual_stages; c.sequence_parallel = p.sequence_parallel;
  c.schedule = p.schedule; c.recompute = p.recompute; c.offload_optimizer = p.offload_optimizer;
  c.recompute_layers = p.recompute_layers;
  c.first_stage_layers = p.first_stage_layers;
  c.last_stage_layers = p.last_stage_layers;
  c.ends_in_split = p.ends_in_split;
  c.offload_params = p.offload_params; c.fsdp_wrap_min_params = p.fsdp_wrap_min_params;
  c.prefetch = p.prefetch; c.reduce_dtype = p.reduce_dtype; c.overlap_grad_reduce = p.overlap_grad_reduce;
  c.cp_comm = p.cp_comm;
  return c;
}

Dtype default_reduce_dtype(const TrainingConfig& t) {
  if (!t.master_weights) return t.precision == Precision::kFp16 ? Dtype::kFp16 : Dtype::kBf16;
  return stack_spec(t.stack).reduce_dtype;
}

void resolve_training_defaults(const ModelSpec& model, TrainingConfig& t) {
  if (t.seq_len == 0) t.seq_len = model.max_seq_len;
  const bool pretrain = t.mode == TrainingMode::kPretrain;
  if (t.global_batch == 0) {
    t.global_batch = pretrain ? std::max<std::int64_t>(1, std::llround(4194304.0 / static_cast<double>(t.seq_len))) : 128;
  }
  if (t.train_tokens == 0) {
    // At least one optimizer step (a tiny model's 20 tokens per parameter can be less).
    const double step_tokens = static_cast<double>(t.global_batch) * static_cast<double>(t.seq_len);
    t.train_tokens = std::max(step_tokens, pretrain ? 20.0 * count_parameters(model).total(model.layers) : 1e9);
  }
}

namespace {

using detail::ObjectReader;

bool is_auto(ObjectReader& r, const std::string& key) {
  if (!r.has(key)) return true;
  const auto& v = r.raw(key);
  return v.is_string() && v.get<std::string>() == "auto";
}

std::optional<int> auto_int(ObjectReader& r, const std::string& key, int min, int max) {
  if (is_auto(r, key)) { r.optional_string(key); return std::nullopt; }
  return static_cast<int>(r.integer(key, min, max));
}

template <typename E>
std::optional<E> auto_enum(ObjectReader& r, const std::string& key, std::initializer_list<const char*> names,
                           std::initializer_list<E> values) {
  if (is_auto(r, key)) { r.optional_string(key); return std::nullopt; }
  const std::string s = r.one_of(key, names);
  auto v = values.begin();
  for (const char* n : names) { if (s == n) return *v; ++v; }
  return std::nullopt;
}

Offload parse_offload_value(ObjectReader& r, const std::string& key) {
  const auto& v = r.raw(key);
  if (v.is_boolean()) return v.get<bool>() ? Offload::kCpu : Offload::kNone;
  const std::string s = r.one_of(key, {"none", "cpu", "nvme"});
  return s == "cpu" ? Offload::kCpu : s == "nvme" ? Offload::kNvme : Offload::kNone;
}

std::string resolve_relative(const std::string& ref, const std::string& plan_file) {
  namespace fs = std::filesystem;
  if (ref.find('/') == std::string::npos && ref.find(".json") == std::string::npos) return ref;  // a preset
  std::error_code ec;
  if (fs::exists(ref, ec) || fs::path(ref).is_absolute()) return ref;
  const fs::path beside = fs::path(plan_file).parent_path() / ref;
  if (fs::exists(beside, ec)) return beside.string();
  return ref;
}

ParallelConstraints parse_parallel(ObjectReader r) {
  ParallelConstraints c;
  c.tp = auto_int(r, "tp", 1, 1 << 16);
  c.pp = auto_int(r, "pp", 1, 1 << 16);
  c.dp = auto_int(r, "dp", 1, 1 << 24);
  c.cp = auto_int(r, "cp", 1, 1 << 16);
  c.ep = auto_int(r, "ep", 1, 1 << 16);
  c.zero_stage = auto_int(r, "zero_stage", 0, 3);
  c.shard_group = auto_int(r, "shard_group", 0, 1 << 24);
  c.micro_batch = auto_int(r, "micro_batch", 1, 1 << 20);
  c.virtual_stages = auto_int(r, "virtual_stages", 1, 1024);
  if (is_auto(r, "sequence_parallel")) r.optional_string("sequence_parallel");
  else c.sequence_parallel = r.boolean("sequence_parallel");
  c.schedule = auto_enum<Schedule>(r, "schedule", {"gpipe", "1f1b", "interleaved"},
                                   {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kInterleaved});
  c.recompute = auto_enum<Recompute>(r, "recompute", {"none", "selective", "full"},
                                     {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  c.recompute_layers = static_cast<int>(r.optional_integer("recompute_layers", 0, 100000).value_or(0));
  c.first_stage_layers = static_cast<int>(r.optional_integer("first_stage_layers", 0, 100000).value_or(0));
  c.last_stage_layers = static_cast<int>(r.optional_integer("last_stage_layers", 0, 100000).value_or(0));
  if (is_auto(r, "ends_in_pipeline_split")) r.optional_string("ends_in_pipeline_split");
  else c.ends_in_split = r.boolean("ends_in_pipeline_split");
  if (is_auto(r, "offload_optimizer")) r.optional_string("offload_optimizer");
  else c.offload_optimizer = parse_offload_value(r, "offload_optimizer");
  if (r.has("offload_params")) c.offload_params = parse_offload_value(r, "offload_params");
  c.fsdp_wrap_min_params = r.optional_integer("fsdp_wrap_min_params", 0, INT64_C(1) << 50).value_or(0);
  c.prefetch = r.optional_boolean("prefetch").value_or(true);
  c.overlap_grad_reduce = r.optional_boolean("overlap_grad_reduce").value_or(true);
  if (auto d = r.optional_one_of("reduce_dtype", {"fp32", "bf16", "fp16"})) {
    c.reduce_dtype = *d == "fp32" ? Dtype::kFp32 : *d == "bf16" ? Dtype::kBf16 : Dtype::kFp16;
  }
  if (auto t = r.optional_one_of("cp_comm_type", {"p2p", "all_gather", "allgather_rotate", "stack"}); t && *t != "stack") {
    c.cp_comm = cp_comm_type_from_name(*t);
  }
  r.finish();
  return c;
}

TrainingConfig parse_training(ObjectReader r) {
  TrainingConfig t;
  t.seq_len = r.optional_integer("seq_len", 1, 1 << 24).value_or(0);
  t.global_batch = r.optional_integer("global_batch", 1, INT64_C(1) << 32).value_or(0);
  const std::string precision = r.optional_one_of("precision", {"fp32", "bf16", "fp16", "fp8"}).value_or("bf16");
  t.precision = precision == "fp32" ? Precision::kFp32 : precision == "fp16" ? Precision::kFp16
              : precision == "fp8" ? Precision::kFp8 : Precision::kBf16;
  const std::string opt = r.optional_one_of("optimizer", {"adamw", "sgd", "adafactor", "adam8bit"}).value_or("adamw");
  t.optimizer = opt == "sgd" ? OptimizerKind::kSgdMomentum : opt == "adafactor" ? OptimizerKind::kAdafactor
              : opt == "adam8bit" ? OptimizerKind::kAdam8bit : OptimizerKind::kAdamW;
  const std::string mode = r.optional_one_of("mode", {"pretrain", "full", "lora", "qlora"}).value_or("pretrain");
  t.mode = mode == "full" ? TrainingMode::kFull : mode == "lora" ? TrainingMode::kLora
         : mode == "qlora" ? TrainingMode::kQlora : TrainingMode::kPretrain;
  if (r.has("lora")) {
    ObjectReader l = r.object("lora");
    t.lora.rank = static_cast<int>(l.optional_integer("rank", 1, 65536).value_or(16));
    if (l.has("targets")) {
      const auto& targets = l.raw("targets");
      if (!targets.is_array() || targets.empty()) l.fail("targets", "must be a non-empty array of strings");
      t.lora.targets.clear();
      for (std::size_t i = 0; i < targets.size(); ++i) {
        const auto& v = targets[i];
        static const char* kValid[] = {"q", "k", "v", "o", "gate", "up", "down"};
        bool ok = v.is_string();
        if (ok) ok = std::find_if(std::begin(kValid), std::end(kValid), [&](const char* n) { return v.get<std::string>() == n; }) != std::end(kValid);
        if (!ok) l.fail("targets/" + std::to_string(i), "must be one of q | k | v | o | gate | up | down");
        t.lora.targets.push_back(v.get<std::string>());
      }
    }
    if (auto f = l.optional_one_of("base_format", {"nf4", "int8"})) t.lora.base_format = *f == "int8" ? QuantFormat::kInt8 : QuantFormat::kNf4;
    t.lora.alpha = l.optional_number("alpha", 1e-6, 1e6).value_or(16.0);
    t.lora.dropout = l.optional_number("dropout", 0, 0.99).value_or(0.0);
    l.finish();
  } else {
    r.optional_string("lora");
  }
  t.train_tokens = r.optional_number("train_tokens", 0, kMaxTrainTokens, true).value_or(0);
  t.dropout = r.optional_boolean("dropout").value_or(false);
  t.dropout_rate = r.optional_number("dropout_rate", 0, 0.99).value_or(0.1);
  t.attention = r.optional_one_of("attention", {"flash", "standard"}).value_or("flash") == "standard"
                    ? AttentionKernel::kStandard : AttentionKernel::kFlash;
  t.attention_mask = r.optional_one_of("attention_mask", {"causal", "explicit"}).value_or("causal") == "explicit"
                         ? AttentionMask::kExplicit : AttentionMask::kCausal;
  if (const auto name = r.optional_string("loss")) {
    if (*name != "stack") {
      const auto loss = loss_kernel_from_name(*name);
      if (!loss) r.fail("loss", std::string("must be stack | ") + loss_kernel_choices() + " (got \"" + *name + "\")");
      t.loss = *loss;
    }
  }
  if (const auto name = r.optional_string("attention_kernel")) {
    if (*name != "stack") {
      const auto impl = attention_impl_from_name(*name);
      if (!impl) r.fail("attention_kernel", std::string("must be stack | ") + attention_impl_choices() + " (got \"" + *name + "\")");
      t.attention_kernel = *impl;
    }
  }
  if (const auto name = r.optional_string("fp8_recipe")) {
    if (*name != "stack") {
      const auto recipe = fp8_recipe_from_name(*name);
      if (!recipe) r.fail("fp8_recipe", "must be stack | delayed | current (got \"" + *name + "\")");
      t.fp8_recipe = *recipe;
    }
  }
  t.fp8_all_gather = r.optional_boolean("fp8_all_gather").value_or(false);
  t.master_weights = r.optional_boolean("master_weights").value_or(true);
  if (const auto name = r.optional_one_of("allocator", {"caching", "expandable-segments"})) t.allocator = *allocator_from_name(*name);
  if (const auto name = r.optional_string("stack")) {
    const auto stack = stack_from_name(*name);
    if (!stack) r.fail("stack", std::string("must be one of ") + stack_choices() + " (got \"" + *name + "\")");
    t.stack = *stack;
  }
  // Documents written before `stack` existed carry `kernels`; it never described the executor
  // (whose runs said "fused"), so it is read and ignored.
  r.optional_one_of("kernels", {"fused", "eager"});
  r.finish();
  return t;
}

}  // namespace

Result<PlanRequest> parse_plan(const nlohmann::json& json, const std::string& file) {
  try {
    ObjectReader r(json, file, "");
    r.expect_schema("trainplan/plan/v1");
    PlanRequest req;
    req.name = r.optional_string("name").value_or("");
    r.optional_string("source");
    // model and cluster: name, path, or inline document.
    const auto load_ref = [&](const std::string& key, auto find, auto parse_inline, std::string& ref) {
      const auto& v = r.raw(key);
      if (v.is_object()) {
        ref = "inline";
        auto parsed = parse_inline(v, file, "/" + key);
        if (!parsed) throw detail::DocumentError(parsed.error().message);
        return std::move(parsed).value();
      }
      if (!v.is_string()) r.fail(key, "must be a preset name, a path, or an inline document");
      ref = v.get<std::string>();
      auto found = find(resolve_relative(ref, file));
      if (!found) r.fail(key, found.error().message);
      return std::move(found).value();
    };
    req.model = load_ref("model", find_model, parse_model, req.model_ref);
    req.cluster = load_ref("cluster", find_hwprofile, parse_hwprofile, req.cluster_ref);
    req.gpus = static_cast<int>(r.integer("gpus", 1, 1 << 24));
    req.training = r.has("training") ? parse_training(r.object("training")) : TrainingConfig{};
    if (!r.has("training")) r.optional_string("training");
    req.parallel = r.has("parallel") ? parse_parallel(r.object("parallel")) : ParallelConstraints{};
    if (!r.has("parallel")) r.optional_string("parallel");
    r.finish();
    resolve_training_defaults(req.model, req.training);
    auto valid = validate_request(req);
    if (!valid) return Error{file + ": " + valid.error().message};
    return req;
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

Result<PlanRequest> parse_plan_text(const std::string& text, const std::string& file) {
  try {
    return parse_plan(detail::parse_json(text, file), file);
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

Result<PlanRequest> load_plan_file(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) return text.error();
  return parse_plan_text(*text, path);
}

std::vector<std::string> referenced_files(const std::string& path) {
  std::vector<std::string> files;
  // A pipe (/dev/stdin, <(...)) is read once, by the command: not here.
  std::error_code regular;
  if (!std::filesystem::is_regular_file(path, regular)) return files;
  auto text = read_text_file(path);
  if (!text) return files;
  auto json = parse_json_text(*text, path);
  if (!json || !json->is_object()) return files;
  for (const char* key : {"model", "cluster"}) {
    const auto it = json->find(key);
    if (it == json->end() || !it->is_string()) continue;
    const std::string file = resolve_relative(it->get<std::string>(), path);
    std::error_code ec;
    if (std::filesystem::is_regular_file(file, ec)) files.push_back(file);
  }
  return files;
}

namespace {
std::string dims_text(int tp, int cp, int pp, int dp) {
  return "tp(" + std::to_string(tp) + ") * cp(" + std::to_string(cp) + ") * pp(" + std::to_string(pp) + ") * dp(" +
         std::to_string(dp) + ") = " + std::to_string(static_cast<long long>(tp) * cp * pp * dp);
}
}  // namespace

namespace {

// What the training settings must satisfy whatever the layout: a step no longer than the whole
// run, and no sequence longer than a model with learned positions has positions for.
std::string training_error(const ModelSpec& m, const TrainingConfig& t) {
  const double step_tokens = static_cast<double>(t.global_batch) * static_cast<double>(t.seq_len);
  if (t.train_tokens > 0 && t.train_tokens < step_tokens) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "/training/train_tokens: %.4g tokens is less than one optimizer step (global_batch(%lld) * seq_len(%lld) = %.4g tokens)",
                  t.train_tokens, static_cast<long long>(t.global_batch), static_cast<long long>(t.seq_len), step_tokens);
    return buf;
  }
  if (m.features().learned_positions && t.seq_len > m.max_seq_len) {
    return "/training/seq_len: " + std::to_string(t.seq_len) + " exceeds max_seq_len (" + std::to_string(m.max_seq_len) +
           ") of a model with learned positions";
  }
  if (t.precision == Precision::kFp8 && t.fp8_recipe && !fp8_casting(stack_spec(t.stack), t.fp8_recipe)) {
    return std::string("/training/fp8_recipe: the ") + stack_name(t.stack) + " stack scales fp8 tensors by " +
           (*t.fp8_recipe == Fp8Recipe::kDelayed ? "their current amax only (no delayed scaling)" : "an amax history only (delayed scaling)") +
           "; \"" + fp8_recipe_name(stack_spec(t.stack).fp8_recipe) + "\" is what it runs";
  }
  if (t.fp8_all_gather) {
    if (t.precision != Precision::kFp8) {
      return std::string("/training/fp8_all_gather: true gathers fp8 weights, which needs precision fp8 (got ") + precision_name(t.precision) + ")";
    }
    if (!stack_spec(t.stack).fp8_all_gather) {
      return std::string("/training/fp8_all_gather: the ") + stack_name(t.stack) +
             " stack all-gathers 16-bit parameters; torchao's fp8 all-gather hooks FSDP2 (stacks fsdp2, fsdp2-compile)";
    }
    if (t.mode == TrainingMode::kLora || t.mode == TrainingMode::kQlora) {
      // The frozen base is not trained in fp8 and the adapters are not Float8Linear modules.
      return std::string("/training/fp8_all_gather: mode ") + mode_name(t.mode) + " trains adapters; the fp8 all-gather is for pretraining or full fine-tuning";
    }
    if (m.moe) {
      // torchao's Float8Linear replaces nn.Linear modules; torchtitan's routed experts are grouped
      // GEMMs over 3-D weights (GroupedExperts), which its float8 linear converter does not touch.
      return "/training/fp8_all_gather: a mixture-of-experts model: torchao's fp8 all-gather covers nn.Linear weights, not grouped experts";
    }
  }
  if (t.attention_kernel && t.attention == AttentionKernel::kStandard) {
    return std::string("/training/attention_kernel: ") + attention_impl_name(*t.attention_kernel) +
           " is a fused attention kernel; attention \"standard\" materialises the scores instead (attention \"flash\", or no attention_kernel)";
  }
  if (t.attention_kernel == AttentionImpl::kFlash3 && t.attention_mask == AttentionMask::kExplicit) {
    return "/training/attention_kernel: flash3 (FlashAttention-3) takes no mask tensor (its causal flag only): attention_mask \"causal\"";
  }
  if (t.attention_kernel == AttentionImpl::kFlash3 && t.dropout) {
    // Dao-AILab/flash-attention hopper/ (flash_attn_interface): no dropout_p argument.
    return "/training/attention_kernel: flash3 (FlashAttention-3) has no attention dropout: dropout false, or attention_kernel flash2";
  }
  if (!t.master_weights) {
    if (t.precision != Precision::kBf16 && t.precision != Precision::kFp16) {
      return std::string("/training/master_weights: false (pure 16-bit training) needs precision bf16 or fp16 (got ") + precision_name(t.precision) + ")";
    }
    if (!stack_spec(t.stack).pure_16bit) {
      return std::string("/training/master_weights: the ") + stack_name(t.stack) +
             " stack keeps fp32 master weights; pure 16-bit training runs on pytorch-eager, torch-compile, fsdp1, composer, fsdp2 and "
                                                  "fsdp2-compile";
    }
  }
  return "";
}

// FlashAttention-3 runs on Hopper only (its kernels are sm90's TMA and WGMMA), in 16-bit dtypes;
// under context parallelism only where the stack's calls the plan's kernel on each chunk
// (StackSpec::context_parallel_calls_kernel).
std::string attention_kernel_error(const TrainingConfig& t, const GpuSpec& gpu, int cp) {
  if (t.attention_kernel != AttentionImpl::kFlash3) return "";
  if (cp > 1 && !stack_spec(t.stack).context_parallel_calls_kernel) {
    return std::string("/training/attention_kernel: flash3 (FlashAttention-3) does not run under the ") + stack_name(t.stack) +
           " stack's context parallelism, which splits SDPA calls (megatron-te's calls the kernel on each chunk)";
  }
  if (gpu_generation(gpu) != 2) {
    return "/training/attention_kernel: flash3 (FlashAttention-3) runs on Hopper GPUs only (H100, H200), not on " + gpu.name;
  }
  if (t.precision == Precision::kFp32) return "/training/attention_kernel: flash3 (FlashAttention-3) runs in bf16 or fp16, not fp32";
  return "";
}

// Context parallelism splits the sequence into causal blocks (ring attention, or K/V gathered
// round a causal mask the stack builds itself): an explicit mask of the user's has no place.
std::string mask_error(const TrainingConfig& t, int cp) {
  if (t.attention_mask == AttentionMask::kExplicit && cp > 1) {
    return "/training/attention_mask: \"explicit\" cannot run with context parallelism (cp " + std::to_string(cp) + "), whose kernels take causal blocks";
  }
  return "";
}

}  // namespace

Result<bool> validate_request(const PlanRequest& req) {
  const ParallelConstraints& c = req.parallel;
  const ModelSpec& m = req.model;
  const auto err = [](const std::string& s) { return Error{s}; };
  if (const std::string e = training_error(m, req.training); !e.empty()) return err(e);
  // What the stack cannot run, named before any search.
  if (const std::string e = unsupported_parallelism(req.training.stack, c.tp.value_or(1), c.cp.value_or(1), c.pp.value_or(1), c.ep.value_or(1),
                                                    c.shard_group.value_or(0), c.sequence_parallel.value_or(false));
      !e.empty()) {
    return err(e);
  }
  if (const std::string e = unsupported_schedule(req.training.stack, c.schedule == Schedule::kGpipe,
                                                 c.schedule == Schedule::kInterleaved || c.virtual_stages.value_or(1) > 1);
      !e.empty()) {
    return err(e);
  }
  if (const std::string e = mask_error(req.training, c.cp.value_or(1)); !e.empty()) return err(e);
  if (c.tp && m.heads % *c.tp != 0) return err("/parallel/tp: tp(" + std::to_string(*c.tp) + ") must divide heads (" + std::to_string(m.heads) + ")");
  if (c.tp && c.pp && c.dp && c.cp && static_cast<long long>(*c.tp) * *c.pp * *c.dp * *c.cp != req.gpus) {
    return err("/parallel: " + dims_text(*c.tp, *c.cp, *c.pp, *c.dp) + " != gpus(" + std::to_string(req.gpus) + ")");
  }
  long long fixed_product = 1;
  std::string factors;
  const std::pair<const char*, std::optional<int>> axes[] = {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"dp", c.dp}};
  for (const auto& [axis, d] : axes) {
    if (!d) continue;
    fixed_product *= *d;
    factors += (factors.empty() ? "" : " * ") + std::string(axis) + "(" + std::to_string(*d) + ")";
  }
  if (req.gpus % fixed_product != 0) {
    return err("/parallel: " + factors + " = " + std::to_string(fixed_product) + " does not divide gpus(" +
               std::to_string(req.gpus) + ")");
  }
  if (c.pp && *c.pp > m.layers) return err("/parallel/pp: pp(" + std::to_string(*c.pp) + ") exceeds layers (" + std::to_string(m.layers) + ")");
  if (c.first_stage_layers + c.last_stage_layers > 0) {
    const char* key = c.first_stage_layers > 0 ? "/parallel/first_stage_layers" : "/parallel/last_stage_layers";
    if (c.pp && *c.pp < 2) return err(std::string(key) + ": needs pp > 1");
    // Every other stage keeps at least one layer (validate_plan checks the whole rule once pp is known).
    const int others = c.pp ? *c.pp - (c.first_stage_layers > 0 ? 1 : 0) - (c.last_stage_layers > 0 ? 1 : 0) : 0;
    if (c.first_stage_layers + c.last_stage_layers + others > m.layers) {
      return err(std::string(key) + ": first_stage_layers(" + std::to_string(c.first_stage_layers) + ") + last_stage_layers(" +
                 std::to_string(c.last_stage_layers) + ") leave too few of the model's " + std::to_string(m.layers) + " layers for the other stages");
    }
  }
  if (c.ep && *c.ep > 1 && !m.moe) return err("/parallel/ep: ep(" + std::to_string(*c.ep) + ") needs a mixture-of-experts model");
  if (c.ep && m.moe && m.moe->experts % *c.ep != 0) return err("/parallel/ep: ep(" + std::to_string(*c.ep) + ") must divide experts (" + std::to_string(m.moe->experts) + ")");
  if (c.cp && req.training.seq_len % *c.cp != 0) return err("/parallel/cp: cp(" + std::to_string(*c.cp) + ") must divide seq_len (" + std::to_string(req.training.seq_len) + ")");
  if (c.dp && req.training.global_batch % *c.dp != 0) return err("/training/global_batch: " + std::to_string(req.training.global_batch) + " sequences must be divisible by dp(" + std::to_string(*c.dp) + ")");
  if (c.micro_batch && c.dp && req.training.global_batch % (static_cast<long long>(*c.dp) * *c.micro_batch) != 0) {
    return err("/parallel/micro_batch: global_batch(" + std::to_string(req.training.global_batch) + ") must be divisible by dp(" +
               std::to_string(*c.dp) + ") * micro_batch(" + std::to_string(*c.micro_batch) + ")");
  }
  if (req.training.precision == Precision::kFp8 && req.cluster.gpu.peak_for(Dtype::kFp8).value() <= 0) {
    return err("/training/precision: fp8 is not supported by " + req.cluster.gpu.name);
  }
  if (const std::string e = attention_kernel_error(req.training, req.cluster.gpu, c.cp.value_or(1)); !e.empty()) return err(e);
  if (req.training.seq_len < 1) return err("/training/seq_len: must be >= 1");
  return true;
}

Result<Plan> plan_with_defaults(const PlanRequest& request) {
  ParallelConstraints c = request.parallel;
  c.tp = c.tp.value_or(1);
  c.pp = c.pp.value_or(1);
  c.cp = c.cp.value_or(1);
  c.ep = c.ep.value_or(1);
  c.dp = c.dp.value_or(request.gpus / std::max(1, *c.tp * *c.pp * *c.cp));
  c.zero_stage = c.zero_stage.value_or(0);
  c.shard_group = c.shard_group.value_or(0);
  c.micro_batch = c.micro_batch.value_or(1);
  c.virtual_stages = c.virtual_stages.value_or(1);
  c.sequence_parallel = c.sequence_parallel.value_or(*c.tp > 1 && stack_spec(request.training.stack).sequence_parallel);
  c.schedule = c.schedule.value_or(*c.virtual_stages > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB);
  c.recompute = c.recompute.value_or(Recompute::kNone);
  c.offload_optimizer = c.offload_optimizer.value_or(Offload::kNone);
  Plan plan{request.name, request.model_ref, request.cluster_ref, request.model, request.cluster, request.gpus,
            request.training, c.fixed()};
  auto valid = validate_plan(plan);
  if (!valid) return valid.error();
  return plan;
}

std::vector<std::string> unset_layout_fields(const ParallelConstraints& c) {
  std::vector<std::string> open;
  if (!c.tp) open.emplace_back("tp");
  if (!c.pp) open.emplace_back("pp");
  if (!c.dp) open.emplace_back("dp");
  if (!c.zero_stage) open.emplace_back("zero_stage");
  if (!c.micro_batch) open.emplace_back("micro_batch");
  return open;
}

Result<bool> validate_plan(const Plan& plan) {
  const ParallelConfig& p = plan.parallel;
  const ModelSpec& m = plan.model;
  const auto err = [](const std::string& s) { return Error{s}; };
  const auto n = [](long long x) { return std::to_string(x); };
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.ep < 1 || p.micro_batch < 1 || p.virtual_stages < 1) {
    return err("/parallel: every axis and micro_batch must be >= 1");
  }
  if (p.gpus() != plan.gpus) return err("/parallel: " + dims_text(p.tp, p.cp, p.pp, p.dp) + " != gpus(" + n(plan.gpus) + ")");
  if (const std::string e = training_error(m, plan.training); !e.empty()) return err(e);
  if (m.heads % p.tp != 0) return err("/parallel/tp: tp(" + n(p.tp) + ") must divide heads (" + n(m.heads) + ")");
  if (m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0) {
    return err("/parallel/tp: tp(" + n(p.tp) + ") and kv_heads (" + n(m.kv_heads) + ") must divide one another");
  }
  if (m.ffn_hidden % p.tp != 0) return err("/parallel/tp: tp(" + n(p.tp) + ") must divide ffn_hidden (" + n(m.ffn_hidden) + ")");
  // Model chunks: one layer each at least, or the embedding's or the loss's place (ends_in_split).
  if (p.pp * p.virtual_stages > m.layers + (p.ends_in_split ? 2 : 0)) {
    return err("/parallel/pp: pp(" + n(p.pp) + ") * virtual_stages(" + n(p.virtual_stages) + ") exceeds layers (" + n(m.layers) + ")" +
               (p.ends_in_split ? " + the embedding + the loss" : ""));
  }
  if (p.virtual_stages > 1 && p.schedule != Schedule::kInterleaved) return err("/parallel/virtual_stages: > 1 needs schedule \"interleaved\"");
  if (p.schedule == Schedule::kInterleaved && p.pp == 1) return err("/parallel/schedule: \"interleaved\" needs pp > 1");
  const std::int64_t gb = plan.training.global_batch;
  if (gb % (static_cast<std::int64_t>(p.dp) * p.micro_batch) != 0) {
    return err("/parallel/micro_batch: global_batch(" + n(gb) + ") must be divisible by dp(" + n(p.dp) + ") * micro_batch(" + n(p.micro_batch) + ")");
  }
  // Real runs accumulate at most thousands of micro-batches per step; far beyond that the step
  // is a whole training run, and per-step counts stop fitting the model's integers.
  constexpr std::int64_t kMaxMicroBatches = INT64_C(1) << 20;
  if (gb / (static_cast<std::int64_t>(p.dp) * p.micro_batch) > kMaxMicroBatches) {
    return err("/training/global_batch: global_batch(" + n(gb) + ") / (dp(" + n(p.dp) + ") * micro_batch(" + n(p.micro_batch) +
               ")) = " + n(gb / (static_cast<std::int64_t>(p.dp) * p.micro_batch)) + " micro-batches per step, more than " +
               n(kMaxMicroBatches));
  }
  if (p.schedule == Schedule::kInterleaved && (gb / (static_cast<std::int64_t>(p.dp) * p.micro_batch)) % p.pp != 0) {
    // Megatron-LM's interleaved schedule runs micro-batches in groups of pp (costmodel/schedule.hpp).
    return err("/parallel/schedule: \"interleaved\" needs micro-batches per step (global_batch(" + n(gb) + ") / (dp(" +
               n(p.dp) + ") * micro_batch(" + n(p.micro_batch) + ")) = " + n(gb / (static_cast<std::int64_t>(p.dp) * p.micro_batch)) +
               ") to be a multiple of pp(" + n(p.pp) + ")");
  }
  if (plan.training.seq_len % p.cp != 0) return err("/parallel/cp: cp(" + n(p.cp) + ") must divide seq_len (" + n(plan.training.seq_len) + ")");
  if (p.ep > 1) {
    if (!m.moe) return err("/parallel/ep: ep(" + n(p.ep) + ") needs a mixture-of-experts model");
    if (m.moe->experts % p.ep != 0) return err("/parallel/ep: ep(" + n(p.ep) + ") must divide experts (" + n(m.moe->experts) + ")");
    if (p.dp % p.ep != 0) return err("/parallel/ep: ep(" + n(p.ep) + ") must divide dp(" + n(p.dp) + ")");
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) return err("/parallel/zero_stage: must be 0, 1, 2 or 3");
  if (p.shard_group != 0) {
    if (p.zero_stage != 3) return err("/parallel/shard_group: hybrid sharding needs zero_stage 3");
    if (p.dp % p.shard_group != 0) return err("/parallel/shard_group: shard_group(" + n(p.shard_group) + ") must divide dp(" + n(p.dp) + ")");
  }
  if (p.recompute_layers < 0) return err("/parallel/recompute_layers: must be >= 0");
  if (p.recompute_layers > 0 && p.recompute != Recompute::kFull) return err("/parallel/recompute_layers: needs recompute \"full\"");
  if (p.offload_params != Offload::kNone && p.zero_stage != 3) return err("/parallel/offload_params: needs zero_stage 3");
  {
    const StackSpec& stack = stack_spec(plan.training.stack);
    if (stack.offload_needs_zero && p.offload_optimizer != Offload::kNone && p.zero_stage == 0) {
      return err(std::string("/parallel/offload_optimizer: the ") + stack.name + " stack offloads the optimizer through ZeRO (ZeRO-Offload): needs zero_stage >= 1");
    }
    if (const std::string e = unsupported_parallelism(plan.training.stack, p.tp, p.cp, p.pp, p.ep, p.shard_group, p.sequence_parallel && p.tp > 1);
        !e.empty()) {
      return err(e);
    }
    if (const std::string e = unsupported_schedule(plan.training.stack, p.pp > 1 && p.schedule == Schedule::kGpipe,
                                                   p.schedule == Schedule::kInterleaved || p.virtual_stages > 1);
        !e.empty()) {
      return err(e);
    }
    if (const std::string e = mask_error(plan.training, p.cp); !e.empty()) return err(e);
    if (p.zero_stage > stack.max_zero) {
      return err("/parallel/zero_stage: the " + std::string(stack.name) + " stack is PyTorch DDP: zero_stage " + n(stack.max_zero) +
                 " (FSDP runs as fsdp1 or fsdp2, ZeRO as deepspeed)");
    }
    if (p.recompute == Recompute::kSelective && !stack.selective_recompute) {
      return err("/parallel/recompute: the " + std::string(stack.name) + " stack recomputes whole layers only: recompute none or full");
    }
    if (stack.max_zero == 0 && (p.offload_optimizer != Offload::kNone || p.offload_params != Offload::kNone)) {
      return err(std::string(p.offload_optimizer != Offload::kNone ? "/parallel/offload_optimizer" : "/parallel/offload_params") + ": the " +
                 stack.name + " stack is PyTorch DDP: no CPU offload (FSDP's or ZeRO's)");
    }
    if (p.zero_stage == 1 && p.dp * p.cp > 1 && !stack.optimizer_only_sharding) {  // sharded over dp x cp (torchtitan's dp_shard_cp)
      return err("/parallel/zero_stage: the " + std::string(stack.name) +
                 " stack has no optimizer-only sharding (FSDP shards gradients with the optimizer states): zero_stage 0, 2 or 3");
    }
    if (p.pp > 1 && p.zero_stage > stack.max_zero_with_pipeline) {
      return err("/parallel/zero_stage: the " + std::string(stack.name) + " stack runs a pipeline with ZeRO-" + n(stack.max_zero_with_pipeline) +
                 " at most (got " + n(p.zero_stage) + ")");
    }
    if (p.tp > 1 && p.zero_stage > stack.max_zero_with_tensor_parallel) {
      return err("/parallel/zero_stage: the " + std::string(stack.name) + " stack runs tensor parallelism with ZeRO-" +
                 n(stack.max_zero_with_tensor_parallel) + " at most (got " + n(p.zero_stage) + ")");
    }
    if (p.ep > 1 && p.zero_stage > stack.max_zero_with_expert_parallel) {
      return err("/parallel/zero_stage: the " + std::string(stack.name) + " stack runs expert parallelism with ZeRO-" +
                 n(stack.max_zero_with_expert_parallel) + " at most (got " + n(p.zero_stage) + ")");
    }
  }
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0) return err("/parallel/first_stage_layers: must be >= 0 (last_stage_layers too)");
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
    const int v = p.virtual_stages;
    const char* key = p.first_stage_layers > 0 ? "/parallel/first_stage_layers" : "/parallel/last_stage_layers";
    if (p.pp < 2) return err(std::string(key) + ": needs pp > 1");
    if (p.first_stage_layers % v != 0 || p.last_stage_layers % v != 0) {
      return err(std::string(key) + ": the first and last stages' layers must split evenly over virtual_stages(" + n(v) + ")");
    }
    // Every other model chunk keeps at least one layer; with two stages both set must be the model.
    const int free_chunks = (p.pp - (p.first_stage_layers > 0 ? 1 : 0) - (p.last_stage_layers > 0 ? 1 : 0)) * v;
    const int rest = m.layers - p.first_stage_layers - p.last_stage_layers;
    if (rest < free_chunks || (free_chunks == 0 && rest != 0)) {
      return err(std::string(key) + ": first_stage_layers(" + n(p.first_stage_layers) + ") + last_stage_layers(" + n(p.last_stage_layers) +
                 ") leave " + n(rest) + " of the " + n(m.layers) + " layers for " + n(free_chunks) + " other model chunks (pp " + n(p.pp) +
                 " x virtual_stages " + n(v) + "), each of which needs at least one" + (free_chunks == 0 ? " and none may be left" : ""));
    }
  }
  if (p.ends_in_split) {
    const std::string key = "/parallel/ends_in_pipeline_split";
    const StackSpec& stack = stack_spec(plan.training.stack);
    if (!stack.ends_in_pipeline_split) {
      return err(key + ": the " + std::string(stack.name) + " stack does not count the embedding and the loss as layers of its pipeline split");
    }
    if (p.pp < 2) return err(key + ": needs pp > 1");
    if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
      return err(key + ": not with first_stage_layers or last_stage_layers (Megatron-Core refuses both at once)");
    }
    const long long chunks = static_cast<long long>(p.pp) * p.virtual_stages;
    if ((m.layers + 2) % chunks != 0) {
      return err(key + ": the model's " + n(m.layers) + " layers + the embedding + the loss = " + n(m.layers + 2) +
                 " must split evenly over pp(" + n(p.pp) + ") x virtual_stages(" + n(p.virtual_stages) + ") = " + n(chunks) + " model chunks");
    }
  }
  if (plan.training.precision == Precision::kFp8 && plan.cluster.gpu.peak_for(Dtype::kFp8).value() <= 0) {
    return err("/training/precision: fp8 is not supported by " + plan.cluster.gpu.name);
  }
  if (const std::string e = attention_kernel_error(plan.training, plan.cluster.gpu, p.cp); !e.empty()) return err(e);
  return true;
}

nlohmann::json parallel_to_json(const ParallelConfig& p) {
  nlohmann::json j = {
      {"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"cp", p.cp}, {"ep", p.ep},
      {"sequence_parallel", p.sequence_parallel}, {"zero_stage", p.zero_stage}, {"shard_group", p.shard_group},
      {"micro_batch", p.micro_batch}, {"virtual_stages", p.virtual_stages}, {"schedule", schedule_name(p.schedule)},
      {"recompute", recompute_name(p.recompute)}, {"recompute_layers", p.recompute_layers}, {"offload_optimizer", offload_name(p.offload_optimizer)},
      {"offload_params", offload_name(p.offload_params)}, {"fsdp_wrap_min_params", p.fsdp_wrap_min_params},
      {"prefetch", p.prefetch}, {"reduce_dtype", dtype_name(p.reduce_dtype)}, {"overlap_grad_reduce", p.overlap_grad_reduce},
  };
  if (p.cp_comm) j["cp_comm_type"] = cp_comm_type_name(*p.cp_comm);
  if (p.first_stage_layers > 0) j["first_stage_layers"] = p.first_stage_layers;
  if (p.last_stage_layers > 0) j["last_stage_layers"] = p.last_stage_layers;
  if (p.ends_in_split) j["ends_in_pipeline_split"] = true;
  return j;
}

nlohmann::json training_to_json(const TrainingConfig& t) {
  nlohmann::json j = {
      {"seq_len", t.seq_len}, {"global_batch", t.global_batch}, {"precision", precision_name(t.precision)},
      {"optimizer", optimizer_name(t.optimizer)}, {"mode", mode_name(t.mode)}, {"train_tokens", t.train_tokens},
      {"dropout", t.dropout}, {"dropout_rate", t.dropout_rate}, {"attention", t.attention == AttentionKernel::kFlash ? "flash" : "standard"},
      {"stack", stack_name(t.stack)},
  };
  // Written only where they differ from their defaults, so documents of earlier versions stay as they were.
  if (t.attention_mask == AttentionMask::kExplicit) j["attention_mask"] = "explicit";
  if (t.loss) j["loss"] = loss_kernel_name(*t.loss);
  if (t.attention_kernel) j["attention_kernel"] = attention_impl_name(*t.attention_kernel);
  if (t.fp8_recipe) j["fp8_recipe"] = fp8_recipe_name(*t.fp8_recipe);
  if (t.fp8_all_gather) j["fp8_all_gather"] = true;
  if (!t.master_weights) j["master_weights"] = false;
  if (t.allocator != Allocator::kCaching) j["allocator"] = allocator_name(t.allocator);
  if (t.mode == TrainingMode::kLora || t.mode == TrainingMode::kQlora) {
    j["lora"] = {{"rank", t.lora.rank}, {"targets", t.lora.targets},
                 {"base_format", t.lora.base_format == QuantFormat::kNf4 ? "nf4" : "int8"}, {"alpha", t.lora.alpha}, {"dropout", t.lora.dropout}};
  }
  return j;
}

nlohmann::json plan_to_json(const Plan& plan, bool inline_documents) {
  const bool model_inline = inline_documents || plan.model_ref.empty() || plan.model_ref == "inline";
  const bool cluster_inline = inline_documents || plan.cluster_ref.empty() || plan.cluster_ref == "inline";
  nlohmann::json j = {
      {"schema", "trainplan/plan/v1"},
      {"name", plan.name},
      {"model", model_inline ? model_to_json(plan.model) : nlohmann::json(plan.model_ref)},
      {"cluster", cluster_inline ? hwprofile_to_json(plan.cluster) : nlohmann::json(plan.cluster_ref)},
      {"gpus", plan.gpus},
      {"training", training_to_json(plan.training)},
      {"parallel", parallel_to_json(plan.parallel)},
  };
  return j;
}

}  // namespace trainplan::costmodel
