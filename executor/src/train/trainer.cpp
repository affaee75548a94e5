// The training loop: plan -> ranks -> engine -> steps -> checkpoints -> measurement document.

#include <unistd.h>

#include <array>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "cpu_memory.hpp"
#include "comm.hpp"
#include "data.hpp"
#include "engine.hpp"
#include "environment.hpp"
#include "gpu.hpp"
#include "hf_checkpoint.hpp"
#include "kernel_profile.hpp"
#include "out_of_memory.hpp"
#include "parallel_dims.hpp"
#include "phase_timer.hpp"
#include "pipeline.hpp"
#include "rank_output.hpp"
#include "world.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/executor/executor.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;
namespace fs = std::filesystem;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitRunFailed = 3;
// train()'s code for a run that diverged on every rank at once: exit 3, no abort needed.
constexpr int kDivergedEverywhere = 103;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Why `dir` does not take a new entry, or "" when it does: a probe folder is made in it and
// removed at once (permission bits alone do not tell, e.g. for root or under /proc).
std::string refuses_new_entries(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "not a directory";
  const fs::path probe = dir / (".trainplan-probe-" + std::to_string(::getpid()));
  if (!fs::create_directory(probe, ec) || ec) return ec ? ec.message() : "cannot create " + probe.string();
  fs::remove(probe, ec);
  return "";
}

// --inject-oom "PHASE[:MICRO_BATCH[:STEP]]".
std::optional<OomInjection> parse_injection(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const auto bad = [&]() {
    return InputError("--inject-oom " + text + ": expected PHASE[:MICRO_BATCH[:STEP]] (phase forward, backward, data_parallel_wait, "
                      "pipeline_receive or optimizer; micro-batch from 0 or any; step from 1)");
  };
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  if (parts.empty() || parts.size() > 3) throw bad();
  const auto phase = phase_from_name(parts[0]);
  if (!phase) throw bad();
  OomInjection injection{*phase, -1, 0};
  try {
    if (parts.size() > 1 && parts[1] != "any") injection.micro_batch = std::stoi(parts[1]);
    if (parts.size() > 2) injection.step = std::stoll(parts[2]);
  } catch (const std::exception&) {
    throw bad();
  }
  if (injection.micro_batch < -1 || injection.step < 0) throw bad();
  return injection;
}

// Every option in its range, before anything runs.
void check_options(const RunOptions& o) {
  const auto number = [](double x) {
    std::ostringstream out;
    out << x;
    return out.str();
  };
  if (o.steps < 1) throw InputError("--steps: must be at least 1");
  if (o.export_format != "trainplan" && o.export_format != "hf") throw InputError("--export-format: expected trainplan or hf, got \"" + o.export_format + "\"");
  if (o.export_lora != "merged" && o.export_lora != "adapters" && o.export_lora != "both") {
    throw InputError("--export-lora: expected merged, adapters or both, got \"" + o.export_lora + "\"");
  }
  if (o.lr <= 0 || !std::isfinite(o.lr)) throw InputError("--lr: must be a positive number");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) throw InputError("--min-lr-ratio: must be from 0 to 1 (got " + number(o.min_lr_ratio) + ")");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay))) throw InputError("--weight-decay: must be >= 0 (got " + number(o.weight_decay) + ")");
  if (!(o.clip_grad >= 0 && std::isfinite(o.clip_grad))) throw InputError("--clip-grad: must be >= 0, 0 for no clipping (got " + number(o.clip_grad) + ")");
  if (o.warmup_steps < -1) throw InputError("--warmup-steps: must be >= 0, or -1 for steps/10 (got " + std::to_string(o.warmup_steps) + ")");
  if (o.decay_steps < 0) throw InputError("--decay-steps: must be >= 0, 0 for --steps (got " + std::to_string(o.decay_steps) + ")");
  if (o.timeout_seconds < 1) throw InputError("--timeout: must be at least 1 second (got " + std::to_string(o.timeout_seconds) + ")");
  if (o.threads < 0 || o.threads > 1024) throw InputError("--threads: must be from 0 (cores / local ranks) to 1024 (got " + std::to_string(o.threads) + ")");
  (void)parse_injection(o.inject_oom);
  if (o.stop_after < 0) throw InputError("--stop-after: must be >= 1, or 0 to run to --steps (got " + std::to_string(o.stop_after) + ")");
  if (o.checkpoint_every < 0) throw InputError("--checkpoint-every: must be >= 1, or 0 for the end only (got " + std::to_string(o.checkpoint_every) + ")");
  if (o.checkpoint_dir.empty()) {  // each would do nothing, or lose the steps run so far
    if (o.stop_after > 0) throw InputError("--stop-after: stops the run to go on later (--resume), which needs --checkpoint-dir");
    if (o.checkpoint_every > 0) throw InputError("--checkpoint-every: needs --checkpoint-dir (where the checkpoints go)");
  }
  if (o.fail_at_step < 0) throw InputError("--fail-at-step: must be a step >= 1, or 0 for none (got " + std::to_string(o.fail_at_step) + ")");
  if (o.fail_rank < 0) throw InputError("--fail-rank: must be a rank >= 0 (got " + std::to_string(o.fail_rank) + ")");
  if (o.trace_step < 0 || o.trace_step > o.steps) {
    throw InputError("--trace-step: must be from 1 to --steps (" + std::to_string(o.steps) + "), or 0 for the last (got " + std::to_string(o.trace_step) + ")");
  }
  // Where results go is checked now, not after the run that makes them, and none replaces an
  // input (the export's model.safetensors would overwrite --init-from's).
  {
    std::vector<std::pair<std::string, std::string>> inputs = {{"--plan file", o.plan_path}, {"--vocab file", o.vocab}};
    if (o.data != "synthetic") inputs.emplace_back("--data file", o.data);
    if (!o.init_from.empty()) inputs.emplace_back("--init-from checkpoint", o.init_from);
    const std::pair<const char*, std::string> outputs[] = {
        {"--measurement", o.measurement_path}, {"--kernel-profile", o.kernel_profile}, {"--export", o.export_dir}, {"--checkpoint-dir", o.checkpoint_dir}};
    for (const auto& [flag, path] : outputs) {
      if (const std::string conflict = cm::overwrite_conflict(flag, path, inputs); !conflict.empty()) throw InputError(conflict);
    }
    // The export writes model.safetensors and config.json into its folder: not the folder of an
    // --init-from file either.
    if (!o.init_from.empty() && !o.export_dir.empty() && !fs::is_directory(o.init_from)) {
      const std::string conflict = cm::overwrite_conflict("--export", o.export_dir, {{"--init-from checkpoint's folder", fs::absolute(o.init_from).parent_path().string()}});
      if (!conflict.empty()) throw InputError(conflict);
    }
    if (!o.kernel_profile.empty() && !o.measurement_path.empty() &&
        fs::absolute(o.kernel_profile).lexically_normal() == fs::absolute(o.measurement_path).lexically_normal()) {
      throw InputError("--kernel-profile " + o.kernel_profile + ": is also the --measurement file; give each its own path");
    }
  }
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--measurement", o.measurement_path}, {"--kernel-profile", o.kernel_profile}}) {
    if (path.empty()) continue;
    const std::string what = std::string(flag) + " " + path;
    const fs::path dir = fs::absolute(path).parent_path();
    if (fs::is_directory(path)) throw InputError(what + ": is a directory; give a file name");
    if (!fs::is_directory(dir)) throw InputError(what + ": directory " + dir.string() + " does not exist");
    if (const std::string why = refuses_new_entries(dir); !why.empty()) {
      throw InputError(what + ": directory " + dir.string() + " is not writable (" + why + ")");
    }
  }
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--checkpoint-dir", o.checkpoint_dir}, {"--export", o.export_dir}}) {
    if (path.empty()) continue;
    std::error_code ec;
    if (fs::exists(path, ec) && !fs::is_directory(path, ec)) throw InputError(std::string(flag) + " " + path + ": exists and is not a directory");
    // The nearest existing folder must take a new one.
    fs::path existing = fs::absolute(path);
    while (existing.has_relative_path() && !fs::exists(existing, ec)) existing = existing.parent_path();
    if (const std::string why = refuses_new_entries(existing); !why.empty()) {
      throw InputError(std::string(flag) + " " + path + ": cannot be created (" + existing.string() + " does not take new folders: " + why + ")");
    }
  }
}

// What this build of the executor runs (planner::executor_limitations); everything else in a
// plan is refused with the reasons.
void check_supported(const cm::Plan& plan) {
  const std::vector<std::string> problems = executor_limitations(plan);
  if (problems.empty()) return;
  std::string text = plan.name + ": the executor cannot run this plan:";
  for (const auto& s : problems) text += "\n  - " + s;
  throw InputError(text);
}

cm::Plan load_plan(const std::string& path) {
  auto request = cm::load_plan_file(path);
  if (!request) throw InputError(request.error().message);
  std::string open;
  for (const auto& n : cm::unset_layout_fields(request->parallel)) open += (open.empty() ? "" : ", ") + n;
  if (!open.empty()) {
    throw InputError(path + ": /parallel: " + open + " not fixed: this is a plan request; fix it first with `planner search " + path +
                     " --save-plan FIXED.json`");
  }
  auto plan = cm::plan_with_defaults(*request);
  if (!plan) throw InputError(path + ": " + plan.error().message);
  return *plan;
}

at::ScalarType torch_dtype(cm::Precision p) {
  switch (p) {
    case cm::Precision::kFp32: return at::kFloat;
    case cm::Precision::kBf16: return at::kBFloat16;
    case cm::Precision::kFp16: return at::kHalf;
    case cm::Precision::kFp8: return at::kBFloat16;  // the linear layers' GEMMs in fp8 (fp8.hpp), the rest in bf16
  }
  throw std::logic_error("torch_dtype: unknown precision");
}

// A parameter count for the start-up line, to 3 significant digits: "1.24 billion", "6.4 million".
std::string parameter_count_text(double n) {
  char text[64];
  if (n >= 1e9) std::snprintf(text, sizeof text, "%.3g billion", n / 1e9);
  else if (n >= 1e6) std::snprintf(text, sizeof text, "%.3g million", n / 1e6);
  else std::snprintf(text, sizeof text, "%.0f", n);
  return text;
}

double lr_at(const RunOptions& o, int64_t step) {
  const int64_t warmup = o.warmup_steps >= 0 ? o.warmup_steps : o.steps / 10;
  const int64_t decay = o.decay_steps > 0 ? o.decay_steps : o.steps;
  if (warmup > 0 && step <= warmup) return o.lr * static_cast<double>(step) / static_cast<double>(warmup);
  const double span = std::max<double>(1.0, static_cast<double>(decay - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", bytes / 1073741824.0);
  return s;
}

using SentBytes = std::array<double, 5>;

struct StepRecord {
  int64_t step = 0;
  double loss = 0, seconds = 0, tokens_per_second = 0, grad_norm = 0, lr = 0;
  // This rank's phase times (phase_timer.hpp), each exclusive of the others.
  double forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0, dp_wait_seconds = 0;
  double peak_memory_bytes = 0, mfu = 0;
  bool skipped = false;
  SentBytes bytes_sent{};  // this rank's step, by group: tp, cp, pp, dp, ep (kSentGroups)
};

constexpr const char* kSentGroups[] = {"tp", "cp", "pp", "dp", "ep"};
constexpr std::size_t kSentEp = 4;  // kSentGroups[kSentEp] == "ep"

SentBytes bytes_sent_so_far(const ProcessGroups& g) {
  return {g.bytes_sent.tp->load(), g.bytes_sent.cp->load(), g.bytes_sent.pp->load(), g.bytes_sent.dp->load(), g.bytes_sent.ep->load()};
}

// What the MoE layers did in one step, over every rank (collective; the tally is reset).
struct MoeStep {
  double assignments = 0, dropped = 0, aux_loss = 0;  // aux: mean over layer passes of experts x sum f P
  std::vector<double> kept_per_expert;                 // assignments each expert took
};
MoeStep take_moe_step(Communicator& comm, MoeTally& tally, int experts) {
  const auto read = [](const at::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; };
  std::vector<double> values = {tally.assignments, read(tally.dropped), static_cast<double>(tally.layer_passes), read(tally.aux_sum)};
  tally.kept_per_expert.resize(static_cast<std::size_t>(experts), 0.0);  // stages without MoE layers counted none
  values.insert(values.end(), tally.kept_per_expert.begin(), tally.kept_per_expert.end());
  at::Tensor sums = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(comm.device());
  tally.reset();
  if (comm.size() > 1) comm.all_reduce_sum(sums)->wait();  // one collective for every sum
  sums = sums.cpu();
  const double* v = sums.data_ptr<double>();
  return {v[0], v[1], v[2] > 0 ? v[3] / v[2] : 0.0, std::vector<double>(v + 4, v + 4 + experts)};
}

// The measurement's `moe` object: tokens routed and dropped per step (every layer, micro-batch
// and rank; the last step and the run's total) and the mean load-balancing loss.
nlohmann::json moe_json(const cm::MoeSpec& moe, const std::vector<MoeStep>& steps) {
  nlohmann::json j = {{"experts", moe.experts}, {"top_k", moe.top_k}, {"capacity_factor", moe.capacity_factor},
                      {"aux_loss_coeff", moe.aux_loss_coeff}};
  if (steps.empty()) return j;
  double routed = 0, dropped = 0;
  nlohmann::json per_step = nlohmann::json::array();
  for (const MoeStep& s : steps) {
    routed += s.assignments;
    dropped += s.dropped;
    per_step.push_back(s.dropped);
  }
  j["assignments_per_step"] = steps.back().assignments;  // tokens x top_k x MoE layers, before capacity
  j["tokens_dropped_per_step"] = steps.back().dropped;
  j["tokens_dropped_per_step_each"] = per_step;
  j["dropped_fraction"] = routed > 0 ? dropped / routed : 0.0;
  j["aux_loss"] = steps.back().aux_loss;  // 1 when perfectly balanced
  // The last step's load: assignments each expert took, and the busiest over the mean (1 when
  // balanced). Under expert parallelism the rank holding the busiest experts receives, and sends
  // back, more rows than a balanced all-to-all (the cost model's).
  const std::vector<double>& load = steps.back().kept_per_expert;
  j["tokens_per_expert_per_step"] = load;
  double total = 0, most = 0;
  for (double n : load) {
    total += n;
    most = std::max(most, n);
  }
  j["load_imbalance"] = total > 0 ? most * static_cast<double>(load.size()) / total : 1.0;
  return j;
}

// The pipeline bubble of one step (collective): per rank, the time within the step's compute
// span (first pass start to last pass end over all ranks) it does not compute, over the time it
// computes (costmodel/schedule.hpp); the mean over ranks.
double step_bubble(Communicator& comm, const std::vector<TraceRecord>& events) {
  double busy = 0, first = 1e300, last = 0;
  for (const TraceRecord& e : events) {
    if (e.kind != "forward" && e.kind != "backward") continue;
    busy += e.end - e.start;
    first = std::min(first, e.start);
    last = std::max(last, e.end);
  }
  std::ostringstream mine;
  mine.precision(17);
  mine << busy << " " << first << " " << last;
  double span_first = 1e300, span_last = 0;
  std::vector<double> ranks_busy;
  for (const std::string& text : comm.all_gather_strings(mine.str())) {
    std::istringstream in(text);
    double b = 0, f = 0, l = 0;
    in >> b >> f >> l;
    span_first = std::min(span_first, f);
    span_last = std::max(span_last, l);
    ranks_busy.push_back(b);
  }
  double bubble = 0;
  for (double b : ranks_busy) bubble += b > 0 ? (span_last - span_first - b) / b : 0.0;
  return bubble / static_cast<double>(ranks_busy.size());
}

// One rank's memory, for picking the fullest rank (the estimate reports the worst stage).
struct RankMemory {
  StateBytes states;
  double peak_bytes = 0, reserved_bytes = 0;
  [[nodiscard]] double total() const { return peak_bytes > 0 ? peak_bytes : states.weights + states.gradients + states.optimizer; }
};

nlohmann::json measurement_json(const cm::Plan& plan, const World& w, const RankMemory& fullest,
                                const std::vector<StepRecord>& steps, const std::vector<double>& losses,
                                const std::string& command_line, const std::string& data, const nlohmann::json& trace,
                                const std::string& kernels, const nlohmann::json& communication) {
  const cm::Estimate estimate = cm::estimate(plan);
  const StateBytes states = fullest.states;
  std::vector<double> seconds, forward, backward, optimizer, dp_wait;
  // The first step of a run pays one-time costs (allocator growth, kernel selection).
  for (std::size_t i = steps.size() > 2 ? 1 : 0; i < steps.size(); ++i) {
    if (steps[i].skipped) continue;
    seconds.push_back(steps[i].seconds);
    forward.push_back(steps[i].forward_seconds);
    backward.push_back(steps[i].backward_seconds);
    optimizer.push_back(steps[i].optimizer_seconds);
    dp_wait.push_back(steps[i].dp_wait_seconds);
  }
  const double step_seconds = median(seconds);
  const double tokens = static_cast<double>(plan.training.global_batch) * static_cast<double>(plan.training.seq_len);
  const double world = w.comm->size();
  const double tokens_per_second = step_seconds > 0 ? tokens / step_seconds : 0;
  // The estimate's convention (LoRA's frozen weights take no weight gradient), so MFUs compare.
  const double flops_per_token = estimate.throughput.model_flops_per_token;
  const double model_tflops = tokens_per_second * flops_per_token / world / 1e12;

  nlohmann::json memory = {{"weights_bytes", states.weights}, {"gradients_bytes", states.gradients}, {"optimizer_bytes", states.optimizer}};
  if (plan.parallel.offload_optimizer != cm::Offload::kNone) memory["cpu_offload_per_gpu_bytes"] = states.host;  // this rank's host memory (the estimate's key)
  nlohmann::json throughput = {{"tokens_per_second", tokens_per_second},
                               {"tokens_per_second_per_gpu", tokens_per_second / world},
                               {"model_tflops_per_gpu", model_tflops}};
  if (w.device.is_cuda() || fullest.peak_bytes > 0) {
    // The allocator's peak: CUDA's, or on CPU ranks the counted one (cpu_memory.hpp).
    // On CPU ranks the counted allocator holds the offloaded host state too.
    const double host = w.device.is_cuda() ? 0.0 : states.host;
    memory["activations_bytes"] = std::max(0.0, fullest.peak_bytes - states.weights - states.gradients - states.optimizer - host);
    memory["peak_allocated_bytes"] = fullest.peak_bytes;
  }
  if (w.device.is_cuda()) {  // not on CPU ranks: the estimate's total holds GPU communication buffers
    // total_bytes and reserved_bytes are the estimate's names for the allocator's two peaks, kept
    // so that planner compare sets them side by side.
    memory["total_bytes"] = fullest.peak_bytes;
    memory["reserved_bytes"] = fullest.reserved_bytes;
    memory["peak_reserved_bytes"] = fullest.reserved_bytes;
    const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(plan.training.precision)).value();
    if (peak_flops > 0) throughput["mfu"] = model_tflops * 1e12 / peak_flops;
  }
  // What ran is this executor's own stack, whatever stack the plan was estimated for: its fused
  // paths (trainplan) or, with --kernels reference, its plain path (trainplan-reference).
  nlohmann::json training = cm::training_to_json(plan.training);
  training["stack"] = cm::stack_name(kernels == "reference" ? cm::Stack::kTrainplanReference : cm::Stack::kTrainplan);
  // A model or cluster that is no preset (inline in the plan, or a file) travels as a document,
  // so that the plan can be rebuilt from the measurement (planner validate, calibrate).
  const auto is_preset = [](const std::string& ref) {
    return !ref.empty() && ref != "inline" && ref.find('/') == std::string::npos && ref.find(".json") == std::string::npos;
  };
  nlohmann::json step_list = nlohmann::json::array();
  for (const auto& s : steps) {
    nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}, {"tokens_per_second", s.tokens_per_second},
                        {"grad_norm", s.grad_norm}, {"lr", s.lr}, {"skipped", s.skipped},
                        {"forward_seconds", s.forward_seconds}, {"backward_seconds", s.backward_seconds},
                        {"optimizer_seconds", s.optimizer_seconds}, {"dp_comm_exposed_seconds", s.dp_wait_seconds}};
    if (w.device.is_cuda()) {
      j["peak_memory_bytes"] = s.peak_memory_bytes;
      j["mfu"] = s.mfu;
    }
    step_list.push_back(j);
  }
  nlohmann::json document = {
      {"schema", "trainplan/measurement/v1"},
      {"status", "ok"},
      {"name", plan.name},
      {"source", "trainplan executor: " + command_line},
      {"model", plan.model.name},
      {"cluster", plan.cluster.name},
      {"gpus", plan.gpus},
      {"world_size", w.comm->size()},
      {"device", w.device_name},
      {"environment", environment_json(w.device.is_cuda())},
      {"data", data},
      {"training", training},
      {"parallel", cm::parallel_to_json(plan.parallel)},
      {"parameters", estimate.parameters},
      {"trainable_parameters", estimate.trainable_parameters},
      {"micro_batches_per_step", plan.training.global_batch / (plan.parallel.dp * plan.parallel.micro_batch)},
      {"memory", memory},
      // Medians over steps of this rank's phase times; forward + backward + optimizer + exposed
      // data-parallel wait <= step (the rest: pipeline receives, loss reduction, host work).
      {"time", {{"step_seconds", step_seconds}, {"forward_seconds", median(forward)}, {"backward_seconds", median(backward)},
                {"optimizer_seconds", median(optimizer)}, {"dp_comm_exposed_seconds", median(dp_wait)}}},
      {"throughput", throughput},
      {"steps", step_list},
      {"losses", losses},
      {"trace", trace},
  };
  if (!communication.is_null()) document["communication"] = communication;
  document["environment"]["kernels"] = kernels;  // --kernels: fused or reference paths
  document["environment"]["cuda_kernels"] = have_cuda_kernels() && w.device.is_cuda();  // fused paths' own kernels ran
  if (!is_preset(plan.model_ref)) document["model_document"] = cm::model_to_json(plan.model);
  if (!is_preset(plan.cluster_ref)) document["cluster_document"] = cm::hwprofile_to_json(plan.cluster);
  return document;
}

// Writes `j` to `path` through a temporary file. `overwrite` false: an existing `path` is kept
// (link(2) refuses to replace it) and false is returned.
bool write_json_atomically(const std::string& path, const nlohmann::json& j, bool overwrite = true) {
  const std::string tmp = path + ".tmp" + (overwrite ? std::string() : "." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(path + ": cannot write the measurement");
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error(path + ": write failed");
  }
  if (!overwrite) {
    const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
    std::remove(tmp.c_str());
    return linked;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp);
  return true;
}

int train(const RunOptions& o, const std::string& command_line, World& w, const cm::Plan& plan) {
  Communicator& comm = *w.comm;
  const int rank = comm.rank();
  const bool talk = rank == 0;
  const ParallelDims dims{plan.parallel.tp, plan.parallel.cp, plan.parallel.pp, plan.parallel.dp, plan.parallel.ep};
  if (const std::string why = dims.mismatch(comm.size()); !why.empty()) {
    throw InputError(o.plan_path + ": the plan is for " + std::to_string(plan.gpus) + " GPUs but " + std::to_string(comm.size()) +
                     " ranks were started: " + why);
  }
  if (!o.kernel_profile.empty() && !w.device.is_cuda()) {
    throw InputError("--kernel-profile " + o.kernel_profile + ": records GPU kernels, and this run is on the CPU (--device cuda)");
  }
  if (o.fail_at_step > 0 && o.fail_rank >= comm.size()) {
    throw InputError("--fail-rank: must be one of the " + std::to_string(comm.size()) + " ranks, 0 to " + std::to_string(comm.size() - 1) +
                     " (got " + std::to_string(o.fail_rank) + ")");
  }
  if (!w.device.is_cuda()) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, cores / static_cast<unsigned>(std::max(1, w.local_size)))));
  }

  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const int64_t accumulation = t.global_batch / (static_cast<int64_t>(p.dp) * p.micro_batch);

  // A measurement at this path describes this run: an older one goes now, before the first
  // collective, so that a rank that fails later (out of memory) never finds a stale one in place.
  if (talk && !o.measurement_path.empty()) {
    std::remove(o.measurement_path.c_str());
    std::remove(next_plan_path(o.measurement_path).c_str());
  }

  // Parallelisms in torchtitan's order: process groups, TP pieces of every unit, this stage's
  // chunks (cost-balanced by the cost model), then data parallelism (ZeRO) over what is left.
  ProcessGroups groups = make_process_groups(dims, comm);
  const RankCoords& at = groups.coords;
  std::unique_ptr<Communicator> kv_group;
  if (p.tp > plan.model.kv_heads) kv_group = groups.tp->split(at.tp / (p.tp / plan.model.kv_heads), at.tp, "kv");
  const cm::Estimate estimate = cm::estimate(plan);
  const std::vector<int> chunk_layers = estimate.pipeline.chunk_layers;
  ModelSharding sharding;
  sharding.tp = p.tp;
  sharding.tp_rank = at.tp;
  sharding.sequence_parallel = p.sequence_parallel && p.tp > 1;
  sharding.split_tied_embedding = plan.model.tied_embeddings && p.pp > 1;
  sharding.ep = p.ep;
  sharding.ep_rank = at.dp % p.ep;
  const bool lora = t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora;
  if (lora) sharding.lora = LoraSpec{t.lora.rank, t.lora.scale(), t.lora.targets};
  if (o.export_format == "hf" && !o.export_dir.empty() && plan.model.architecture != cm::Architecture::kLlama) {
    throw InputError("--export-format hf: writes the Llama layout, and " + plan.model.name + " is a GPT-style model");
  }
  // A Hugging Face checkpoint to start from: its architecture must be the plan's.
  std::unique_ptr<HfCheckpoint> base;
  if (!o.init_from.empty()) {
    base = std::make_unique<HfCheckpoint>(o.init_from);
    if (const std::string why = base->mismatch(plan.model); !why.empty()) {
      throw InputError("--init-from " + o.init_from + ": the checkpoint is not the plan's model " + plan.model.name + ": " + why);
    }
    if (const std::string extra = base->unused_tensor(plan.model); !extra.empty()) {
      throw ImportError("--init-from " + o.init_from + ": tensor " + extra + " has no place in the executor's model " + plan.model.name +
                        " (a layer its Llama block lacks)");
    }
  }
  StageUnits mine = stage_units(model_layout(plan.model, sharding), chunk_layers, p.pp, at.pp);
  // Context parallelism: this rank's load-balanced chunks of every sequence (context_parallel.hpp).
  const ContextParallel context = make_context_parallel(groups.cp.get(), t.seq_len, w.device, torch_dtype(t.precision));
  EngineGroups engine_groups{groups.dp.get(), &comm, groups.tied.get(), kv_group.get(), TensorParallel{groups.tp.get(), sharding.sequence_parallel},
                             context, groups.ep.get(), groups.edp.get()};

  EngineConfig config;
  config.zero_stage = p.zero_stage;
  config.shard_group = p.shard_group * p.cp;  // the engine's data-parallel group spans dp x cp (parallel_dims.hpp)
  config.prefetch = p.prefetch;
  config.overlap_grad_reduce = p.overlap_grad_reduce;
  config.recompute = p.recompute;
  config.recompute_layers = p.recompute_layers;
  config.compute_dtype = torch_dtype(t.precision);
  config.fp8 = t.precision == cm::Precision::kFp8;
  config.kernels = parse_kernels(o.kernels);
  config.device = w.device;
  config.seed = o.seed;
  config.draw_base_weights = o.init_from.empty();
  config.lora = sharding.lora;
  config.hidden_dropout = t.dropout ? t.dropout_rate : 0.0;
  config.offload_optimizer = p.offload_optimizer == cm::Offload::kCpu;
  if (t.mode == cm::TrainingMode::kQlora) config.quantized_base = t.lora.base_format;
  config.lora_dropout = config.lora.active() ? t.lora.dropout : 0.0;
  if (p.tp > 1 || p.pp > 1) {
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "pp%02d_tp%02d_", at.pp, at.tp);
    config.shard_prefix = prefix;
  }
  // Building the model draws every unit's initial weights on the host (model.hpp init_unit): a
  // line before and after, since for billions of parameters it takes a while.
  const auto t_build = std::chrono::steady_clock::now();
  if (talk && !o.quiet) {
    std::cout << "executor: building the model (" << parameter_count_text(cm::count_parameters(plan.model).total(plan.model.layers))
              << " parameters): "
              << (config.draw_base_weights ? "drawing the initial weights on " + std::to_string(at::get_num_threads()) + " host thread(s)"
                                           : "the weights come from " + o.init_from)
              << std::endl;
  }
  DataParallelEngine engine(plan.model, config, engine_groups, std::move(mine.units), mine.chunk_of_unit, t.seq_len);
  if (talk && !o.quiet) {
    std::cout << "executor: model built in " << std::fixed << std::setprecision(1)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count() << " s" << std::defaultfloat << std::endl;
  }
  PhaseTimer phases(w.device);
  if (const auto injection = parse_injection(o.inject_oom); injection && (o.inject_oom_rank < 0 || o.inject_oom_rank == rank)) {
    phases.set_injection(*injection);
  }
  engine.set_phase_timer(&phases);

  PipelineConfig pipeline;
  pipeline.stages = p.pp;
  pipeline.stage = at.pp;
  pipeline.virtual_stages = p.virtual_stages;
  pipeline.micro_batches = static_cast<int>(accumulation);
  pipeline.schedule = p.schedule;
  const int64_t local_seq = t.seq_len / p.cp;  // this rank's tokens of each sequence
  pipeline.activation_shape = {p.micro_batch, sharding.sequence_parallel ? local_seq / p.tp : local_seq, plan.model.hidden};
  pipeline.activation_dtype = config.compute_dtype;
  pipeline.device = w.device;
  // The stages' one-directional links (collective over the pipeline group; none without one).
  std::unique_ptr<PipelineLinks> links;
  if (p.pp > 1) links = std::make_unique<PipelineLinks>(*groups.pp, /*wrap=*/p.virtual_stages > 1);
  PipelineRunner runner(pipeline, engine, links.get());

  DataSpec data_spec;
  data_spec.source = o.data;
  data_spec.seed = o.seed;
  data_spec.vocab = o.vocab;
  data_spec.token_bytes = o.data_dtype == "uint32" ? 4 : o.data_dtype == "uint16" ? 2 : 0;
  if (data_spec.token_bytes == 0) throw InputError("--data-dtype: expected uint16 or uint32, got \"" + o.data_dtype + "\"");
  DataLoader loader(data_spec, plan.model.vocab, t.seq_len);

  const std::string precision = cm::precision_name(t.precision);
  nlohmann::json parallel_layout = {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"sequence_parallel", sharding.sequence_parallel},
                                    {"virtual_stages", p.virtual_stages}, {"chunk_layers", chunk_layers}};
  if (p.cp > 1) parallel_layout["cp"] = p.cp;  // only then: checkpoints written before CP existed still resume
  if (p.ep > 1) parallel_layout["ep"] = p.ep;
  if (config.lora.active()) {  // a LoRA checkpoint holds the adapters: the base must be the same
    parallel_layout["lora"] = {{"rank", t.lora.rank}, {"alpha", t.lora.alpha}, {"targets", t.lora.targets},
                               {"base", o.init_from.empty() ? "initialised, seed " + std::to_string(o.seed) : fs::absolute(o.init_from).string()}};
  }
  if (base) {
    import_hf_weights(*base, engine);
    if (talk) std::cout << "imported: " << o.init_from << " (Hugging Face " << base->model().name << ")" << std::endl;
  }
  const nlohmann::json layout = checkpoint_layout(engine, comm.size(), precision, parallel_layout);
  TrainerState state;
  state.loss_scale = t.precision == cm::Precision::kFp16 ? 65536.0 : 1.0;
  std::string last_checkpoint;  // the newest checkpoint this run wrote or resumed from
  if (!o.resume.empty()) {
    const Resumed resumed = resume_newest_intact(o.resume, engine, comm, layout);
    state = resumed.state;
    last_checkpoint = resumed.step_dir;
    if (talk) {
      for (const std::string& why : resumed.skipped) {
        print_for_rank(rank, "executor: warning: --resume: skipping a damaged checkpoint, " + why);
      }
      std::cout << "resumed from " << resumed.step_dir << " at step " << state.step;
      if (!resumed.skipped.empty()) {
        std::cout << " (fell back to the newest intact checkpoint: " << resumed.skipped.size() << " newer one" << (resumed.skipped.size() == 1 ? " is" : "s are")
                  << " damaged, see above)";
      }
      std::cout << std::endl;
    }
    if (state.step >= o.steps) {
      throw InputError("--resume " + o.resume + ": the checkpoint is at step " + std::to_string(state.step) + ", --steps " +
                       std::to_string(o.steps) + " leaves nothing to run (--steps counts resumed steps too; give more)");
    }
  }

  if (talk) {
    const StateBytes sb = engine.state_bytes();
    std::string stages;
    for (int n : chunk_layers) stages += (stages.empty() ? "" : "/") + std::to_string(n);
    std::cout << "executor: " << plan.name << " | " << plan.model.name << " | " << comm.size() << " rank(s) on " << w.device_name
              << " | tp " << p.tp << (sharding.sequence_parallel ? " (sequence parallel)" : "");
    if (p.cp > 1) std::cout << ", cp " << p.cp << " (all-gathered K/V, " << 2 * p.cp << " load-balanced chunks)";
    std::cout << ", pp " << p.pp;
    if (p.pp > 1) {
      std::cout << " (" << cm::schedule_name(p.schedule) << (p.virtual_stages > 1 ? ", " + std::to_string(p.virtual_stages) + " chunks/stage" : "")
                << ", layers per chunk " << stages << ")";
    }
    std::cout << ", dp " << p.dp << ", ZeRO-" << p.zero_stage
              << (p.zero_stage == 3 && p.shard_group > 0 && p.shard_group < p.dp ? " hybrid (shard " + std::to_string(p.shard_group) + ")" : "")
              << ", micro-batch " << p.micro_batch << " x " << accumulation << " accumulation, recompute "
              << cm::recompute_name(p.recompute) << ", " << precision << "\n"
              << "data: " << loader.describe() << " | global batch " << t.global_batch << " x " << t.seq_len << " tokens\n"
              << "model states on rank 0: weights " << gib(sb.weights) << ", gradients " << gib(sb.gradients) << ", optimizer "
              << gib(sb.optimizer) << (sb.host > 0 ? ", offloaded to host memory " + gib(sb.host) : std::string()) << "\n";
  }

  const AdamWSettings adamw{0.9, 0.95, 1e-8, o.weight_decay};
  const double flops_per_token = estimate.throughput.model_flops_per_token;  // as the measurement's
  const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(t.precision)).value();
  std::vector<StepRecord> records;
  int64_t run_steps = 0;
  // The step whose loss or gradient norm was not finite, if any, which, and its value.
  int64_t diverged_at = 0;
  std::string diverged_what, diverged_value;
  const int64_t trace_step = o.trace_step > 0 ? o.trace_step : o.steps;
  nlohmann::json trace_events = nlohmann::json::array();
  std::vector<double> stage_in_flight(static_cast<std::size_t>(p.pp), 0.0);
  std::vector<double> step_bubbles;  // measured pipeline bubble of each step of this run
  std::vector<MoeStep> moe_steps;     // what the experts did in each step of this run
  try {
    while (state.step < o.steps) {
      const int64_t step = state.step + 1;
      if (o.fail_at_step == step && o.fail_rank == rank) {
        print_for_rank(rank, "executor: --fail-at-step " + std::to_string(step) + ": killing this rank (fault injection)");
        std::raise(SIGKILL);
      }
      if (w.device.is_cuda()) cuda_reset_peak();
      else cpu_reset_peak();
      const bool tracing = step == trace_step;
      std::unique_ptr<KernelProfiler> kernel_profiler;
      if (tracing && talk && !o.kernel_profile.empty()) {
        kernel_profiler = std::make_unique<KernelProfiler>();
        kernel_profiler->start();
      }
      const bool timing_pipeline = p.pp > 1 || tracing;  // the bubble is measured every step of a pipeline
      std::vector<TraceRecord> events;
      if (timing_pipeline) comm.barrier();  // every rank's step starts together: one clock for the timeline
      const auto t0 = std::chrono::steady_clock::now();
      phases.begin_step(step);
      const SentBytes sent_before = bytes_sent_so_far(groups);
      const auto batch = [&](int k) {
        MicroBatch mb = loader.micro_batch(step, at.dp, p.dp, t.global_batch, p.micro_batch, k, w.device);
        return std::make_pair(context_slice(context, mb.tokens), context_slice(context, mb.targets));
      };
      engine.set_step_samples((step - 1) * t.global_batch + at.dp * (t.global_batch / p.dp), p.micro_batch);  // dropout.hpp
      if (loader.masked()) {  // the loss over the global batch's response tokens (data.hpp)
        engine.set_loss_denominator(static_cast<double>(loader.step_targets(step, t.global_batch)) / static_cast<double>(p.dp * p.cp * accumulation));
      }
      const double loss_sum = runner.run_step(batch, state.loss_scale / static_cast<double>(accumulation), timing_pipeline ? &events : nullptr);
      if (p.pp > 1) step_bubbles.push_back(step_bubble(comm, events));
      if (plan.model.moe) moe_steps.push_back(take_moe_step(comm, engine.moe_tally(), plan.model.moe->experts));
      const auto t_finish = std::chrono::steady_clock::now();
      engine.finish_step();
      if (tracing) events.push_back({"dp_comm", -1, 0, std::chrono::duration<double>(t_finish - t0).count(),
                                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
      StepRecord r;
      r.step = step;
      // The loss lives on the last stage, the same on every TP rank there.
      // Under CP each rank's loss is the mean over its own tokens (equal counts): their mean is the sequence's.
      r.loss = all_reduce_scalar(comm, at.tp == 0 ? loss_sum : 0.0) / static_cast<double>(accumulation * p.dp * p.cp);
      r.lr = lr_at(o, step);
      const auto t_opt = std::chrono::steady_clock::now();
      bool finite = true;
      {
        // From the completed gradient reduction to the end of the update: norm, clipping, AdamW.
        PhaseScope optimizer(&phases, Phase::kOptimizer);
        finite = t.precision != cm::Precision::kFp16 || engine.gradients_finite();
        if (finite) {
          r.grad_norm = engine.gradient_norm() / state.loss_scale;
          // Not fp16 (its gradients were checked): a norm that is not finite would make every
          // weight NaN, so the update is not applied and the run ends below.
          if (std::isfinite(r.grad_norm)) {
            const double clip = o.clip_grad > 0 && r.grad_norm > o.clip_grad ? o.clip_grad / (r.grad_norm + 1e-6) : 1.0;
            engine.optimizer_step(adamw, r.lr, clip / state.loss_scale, step);
          } else {
            r.skipped = true;
          }
        } else {
          r.skipped = true;
          state.loss_scale /= 2;
          state.good_steps = 0;
        }
        engine.zero_gradients();
      }
      phases.end_step();
      const SentBytes sent_after = bytes_sent_so_far(groups);
      if (w.device.is_cuda()) cuda_synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      if (kernel_profiler) {
        const std::vector<KernelTime> kernels = kernel_profiler->stop();
        std::ofstream out(o.kernel_profile);
        out << kernel_table_csv(kernels, std::chrono::duration<double>(t1 - t0).count());
        if (!out) throw std::runtime_error(o.kernel_profile + ": cannot write the kernel profile");
        double busy = 0, idle = 0;
        for (const KernelTime& k : kernels) {
          busy += k.seconds;
          idle += k.idle_before_seconds;
        }
        std::cout << "kernel profile of step " << step << ": " << kernels.size() << " kernels, busy " << std::fixed << std::setprecision(1)
                  << busy * 1e3 << " ms, idle between them " << idle * 1e3 << " ms, written to " << o.kernel_profile << std::defaultfloat
                  << std::endl;
      }
      const PhaseSeconds phase_seconds = phases.collect();
      if (finite && t.precision == cm::Precision::kFp16 && ++state.good_steps % 2000 == 0) state.loss_scale *= 2;
      r.seconds = std::chrono::duration<double>(t1 - t0).count();
      for (std::size_t g = 0; g < r.bytes_sent.size(); ++g) r.bytes_sent[g] = sent_after[g] - sent_before[g];
      r.forward_seconds = phase_seconds[Phase::kForward];
      r.backward_seconds = phase_seconds[Phase::kBackward];
      r.optimizer_seconds = phase_seconds[Phase::kOptimizer];
      // Exposed data-parallel communication as the cost model counts it: gradient reductions (their
      // starts and the wait for them) plus, under ZeRO-3, parameter gathers (engine.hpp).
      r.dp_wait_seconds = phase_seconds[Phase::kDataParallelWait];
      if (tracing) {
        events.push_back({"optimizer", -1, 0, std::chrono::duration<double>(t_opt - t0).count(), r.seconds});
        nlohmann::json mine_json = {{"rank", rank}, {"stage", at.pp}, {"in_flight", runner.peak_in_flight()}, {"events", nlohmann::json::array()}};
        for (const TraceRecord& e : events) {
          mine_json["events"].push_back({{"kind", e.kind}, {"micro_batch", e.micro_batch}, {"chunk", e.chunk}, {"start", e.start}, {"end", e.end}});
        }
        const std::vector<std::string> all = comm.all_gather_strings(mine_json.dump());
        if (talk) {
          trace_events = nlohmann::json::array();
          std::fill(stage_in_flight.begin(), stage_in_flight.end(), 0.0);
          for (const std::string& text : all) {
            const nlohmann::json one = nlohmann::json::parse(text);
            const int stage = one["stage"].get<int>();
            stage_in_flight[static_cast<std::size_t>(stage)] = std::max(stage_in_flight[static_cast<std::size_t>(stage)], one["in_flight"].get<double>());
            for (const auto& e : one["events"]) {
              nlohmann::json event = e;
              event["rank"] = one["rank"];
              event["stage"] = stage;
              if (event["micro_batch"].get<int>() < 0) event.erase("micro_batch");
              trace_events.push_back(event);
            }
          }
        }
      }
      r.tokens_per_second = static_cast<double>(t.global_batch * t.seq_len) / r.seconds;
      r.peak_memory_bytes = w.device.is_cuda() ? cuda_peak_allocated_bytes() : cpu_peak_allocated_bytes();
      if (w.device.is_cuda()) {
        r.mfu = peak_flops > 0 ? r.tokens_per_second * flops_per_token / comm.size() / peak_flops : 0;
      }
      state.step = step;
      state.losses.push_back(r.loss);
      records.push_back(r);
      ++run_steps;
      if (talk && !o.quiet) {
        char line[256];
        std::snprintf(line, sizeof(line), "step %5lld/%lld | loss %9.5f | grad norm %8.4f | lr %.3e | %12.0f tok/s | %8.3f s",
                      static_cast<long long>(step), static_cast<long long>(o.steps), r.loss, r.grad_norm, r.lr, r.tokens_per_second, r.seconds);
        std::cout << line;
        if (w.device.is_cuda()) std::cout << " | MFU " << std::fixed << std::setprecision(1) << 100 * r.mfu << "% | peak " << gib(r.peak_memory_bytes);
        if (r.skipped) std::cout << " | skipped (inf/nan gradients, loss scale now " << state.loss_scale << ")";
        std::cout << std::endl;
      }
      // Training diverged, and the run ends here: nothing after it would train, and neither a
      // checkpoint nor the export of such weights replaces a good one. A loss that is not finite
      // (the forward overflowed, which no loss scale mends); a gradient norm that is not finite
      // (bf16, fp32: its update was not applied); in fp16, gradients that overflow at a loss scale
      // already below 1. The loss, the norm and the fp16 check are all-reduced: every rank stops
      // at the same step.
      const bool fp16_gave_up = t.precision == cm::Precision::kFp16 && r.skipped && state.loss_scale < 1.0;
      if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm) || fp16_gave_up) {
        const bool loss = !std::isfinite(r.loss);
        const double value = loss ? r.loss : r.grad_norm;
        diverged_at = step;
        diverged_what = loss ? "loss" : "gradient norm";
        diverged_value = !loss && fp16_gave_up ? "not_finite" : std::isnan(value) ? "nan" : "inf";
        break;
      }
      const bool stopping = o.stop_after > 0 && run_steps >= o.stop_after;
      const bool due = !o.checkpoint_dir.empty() &&
                       ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == o.steps || stopping);
      if (due) {
        const std::string where = save_checkpoint(o.checkpoint_dir, engine, comm, state, layout);
        last_checkpoint = where;
        if (talk) std::cout << "checkpoint: " << where << "\n";
      }
      if (stopping) break;
    }
  } catch (const std::exception& e) {
    const std::optional<std::string> message = out_of_memory_message(e);
    if (!message) throw;
    // No collective from here: the other ranks may be anywhere. This rank reports and leaves;
    // run_executor's abort ends the others (MPI_Abort, or the NCCL timeout).
    mark_communication_failed();
    OutOfMemory oom;
    oom.phase = phase_name(phases.current_phase());
    oom.micro_batch = phases.current_micro_batch();
    oom.step = phases.step();
    oom.rank = rank;
    oom.requested_bytes = requested_bytes(*message);
    oom.message = *message;
    if (w.device.is_cuda()) {
      // Peaks since the failed step began: the figures at the failure (unwinding freed the rest).
      oom.allocated_bytes = cuda_peak_allocated_bytes();
      oom.reserved_bytes = cuda_peak_reserved_bytes();
    } else {
      oom.process_peak_resident_bytes = process_peak_resident_bytes();
    }
    std::optional<NextPlan> next = next_plan_after_out_of_memory(plan);
    if (next && !o.measurement_path.empty()) {
      // The whole next plan beside the measurement, so that nothing of this plan is lost in a
      // command line (inline models, schedules, stacks); rank 0's replaces another rank's.
      const std::string path = next_plan_path(o.measurement_path);
      try {
        write_json_atomically(path, cm::plan_to_json(next->plan, /*inline_documents=*/true), /*overwrite=*/rank == 0);
        next->plan_path = path;
      } catch (const std::exception&) {
        // Not written: the line gives the planner command instead.
      }
    }
    print_for_rank(rank, out_of_memory_line(oom, next));
    if (!o.measurement_path.empty()) {
      RankMemory mine_memory{engine.state_bytes(), oom.allocated_bytes.value_or(0), oom.reserved_bytes.value_or(0)};
      nlohmann::json m = measurement_json(plan, w, mine_memory, records, state.losses, command_line, loader.describe(), nullptr, o.kernels, nullptr);
      m["status"] = "out_of_memory";
      m["out_of_memory"] = out_of_memory_json(oom, next);
      if (w.device.is_cuda()) {
        // The failed step's peaks; the completed steps' are in `steps`.
        m["memory"]["peak_allocated_bytes"] = oom.allocated_bytes.value_or(0);
        m["memory"]["peak_reserved_bytes"] = oom.reserved_bytes.value_or(0);
        for (const char* key : {"total_bytes", "reserved_bytes", "activations_bytes"}) m["memory"].erase(key);
      }
      if (records.empty()) {  // nothing was timed
        m.erase("time");
        m.erase("throughput");
      }
      // Rank 0's document replaces another rank's; another rank's is written only where none is.
      write_json_atomically(o.measurement_path, m, /*overwrite=*/rank == 0);
    }
    return kExitRunFailed;
  }

  if (!o.export_dir.empty() && diverged_at == 0) {
    // Piece j of a parameter comes from the first data-parallel replica's TP rank holding it, on
    // the stage that holds its unit; an expert's from the first replica of the ep rank holding it.
    std::vector<std::vector<UnitLayout>> tp_layouts;
    for (int r = 0; r < p.tp; ++r) {
      ModelSharding other = sharding;
      other.tp_rank = r;
      other.ep = 1;  // every expert's slot (ep cuts none of them)
      other.ep_rank = 0;
      tp_layouts.push_back(model_layout(plan.model, other));
    }
    const auto find_slot = [&](int tp_rank, const std::string& unit, const std::string& slot) -> const ParamSlot& {
      for (const UnitLayout& u : tp_layouts[static_cast<std::size_t>(tp_rank)]) {
        if (u.name != unit) continue;
        for (const ParamSlot& s : u.slots) {
          if (s.name == slot) return s;
        }
      }
      throw std::logic_error("export: no parameter " + slot);
    };
    const auto holder = [&](const std::string& unit, const std::string& slot, int piece) {
      for (int r = 0; r < p.tp; ++r) {
        const ParamSlot& s = find_slot(r, unit, slot);
        if (s.primary && s.shard_index == piece) return r;
      }
      throw std::logic_error("export: no TP rank holds piece " + std::to_string(piece) + " of " + slot);
    };
    ExportPlan export_plan;
    export_plan.sends = [&](const UnitLayout& unit) { return at.cp == 0 && (unit.kind == UnitKind::kExperts ? at.dp < p.ep : at.dp == 0); };
    export_plan.piece_slot = [&](const std::string& unit, const std::string& slot, int piece) -> const ParamSlot& {
      return find_slot(holder(unit, slot, piece), unit, slot);
    };
    export_plan.owner_rank = [&](const std::string& unit, const std::string& slot, int piece) {
      const int tp_rank = holder(unit, slot, piece);
      const int expert = find_slot(tp_rank, unit, slot).expert;
      const int dp_index = expert < 0 ? 0 : expert / (plan.model.moe->experts / p.ep);  // ep rank = dp index % ep
      return rank_of(dims, RankCoords{tp_rank, 0, stage_of_unit(unit, chunk_layers, p.pp), dp_index});
    };
    ExportOptions export_options;
    export_options.hugging_face = o.export_format == "hf";
    export_options.merged = o.export_lora != "adapters";
    export_options.adapters = config.lora.active() && o.export_lora != "merged";
    export_options.base_model = o.init_from.empty() ? plan.model.name : fs::absolute(o.init_from).string();
    export_safetensors(o.export_dir, engine, comm, state.step, export_plan, export_options);
    if (talk) {
      std::cout << "exported: " << o.export_dir << " (" << (export_options.hugging_face ? "Hugging Face Llama layout" : "executor names");
      if (config.lora.active()) std::cout << "; " << (export_options.merged && export_options.adapters ? "merged weights and adapters" : export_options.merged ? "merged weights" : "adapters");
      std::cout << ")\n";
    }
  }
  // The fullest rank's memory (the estimate reports the worst pipeline stage).
  RankMemory memory{engine.state_bytes(), 0, 0};
  for (const auto& rec : records) memory.peak_bytes = std::max(memory.peak_bytes, rec.peak_memory_bytes);
  if (w.device.is_cuda() && !records.empty()) memory.reserved_bytes = cuda_peak_reserved_bytes();
  const nlohmann::json memory_json = {{"w", memory.states.weights}, {"g", memory.states.gradients}, {"o", memory.states.optimizer},
                                      {"peak", memory.peak_bytes}, {"reserved", memory.reserved_bytes},
                                      {"sent", records.empty() ? SentBytes{} : records.back().bytes_sent}};
  RankMemory fullest = memory;
  SentBytes most_sent{};  // per group, the most any rank sent in the last step
  double ep_sent_total = 0;  // and the expert-parallel bytes over the ranks that sent any
  int ep_senders = 0;
  for (const std::string& text : comm.all_gather_strings(memory_json.dump())) {
    const nlohmann::json j = nlohmann::json::parse(text);
    const auto sent = j["sent"].get<SentBytes>();
    for (std::size_t g = 0; g < most_sent.size(); ++g) most_sent[g] = std::max(most_sent[g], sent[g]);
    if (sent[kSentEp] > 0) {
      ep_sent_total += sent[kSentEp];
      ++ep_senders;
    }
    const RankMemory other{{j["w"].get<double>(), j["g"].get<double>(), j["o"].get<double>()}, j["peak"].get<double>(), j["reserved"].get<double>()};
    if (other.total() > fullest.total()) fullest = other;
  }
  if (talk && !records.empty()) {
    nlohmann::json predicted_in_flight = nlohmann::json::array();
    for (int stage = 0; stage < p.pp; ++stage) predicted_in_flight.push_back(cm::micro_batches_in_flight(p, stage, static_cast<int>(accumulation)));
    const auto simulated = cm::simulate_pipeline(estimate.pipeline);
    // The first step pays one-time costs; the median of the others is the measurement.
    const double traced_bubble = step_bubbles.empty() ? 0.0
                                 : median(std::vector<double>(step_bubbles.begin() + (step_bubbles.size() > 2 ? 1 : 0), step_bubbles.end()));
    const nlohmann::json trace = {
        {"step", trace_step <= state.step ? trace_step : state.step},
        {"stages", p.pp},
        {"virtual_stages", p.virtual_stages},
        {"micro_batches", accumulation},
        {"schedule", cm::schedule_name(p.schedule)},
        {"chunk_layers", chunk_layers},
        {"bubble_fraction", traced_bubble},
        {"bubble_fraction_per_step", step_bubbles},
        {"predicted_bubble_fraction", simulated ? simulated->bubble_fraction : 0.0},
        {"peak_in_flight", stage_in_flight},
        {"predicted_in_flight", predicted_in_flight},
        {"events", trace_events},
    };
    // Bytes sent in the last step, by process group, on the rank that sent the most (the cost
    // model's communication volume: comm.hpp make_counting_communicator for the convention).
    nlohmann::json communication = {{"step", records.back().step}, {"rank", "the most of any rank"}};
    for (std::size_t g = 0; g < most_sent.size(); ++g) communication[std::string(kSentGroups[g]) + "_bytes_sent_per_step"] = most_sent[g];
    // Routing is never quite balanced, so the busiest rank's all-to-all bytes exceed the mean
    // (moe.load_imbalance); the mean over ranks is what balanced routing predicts, since every
    // rank's tokens are drawn alike.
    if (ep_senders > 0) communication["ep_bytes_sent_per_step_mean"] = ep_sent_total / ep_senders;
    nlohmann::json m = measurement_json(plan, w, fullest, records, state.losses, command_line, loader.describe(), trace, o.kernels, communication);
    if (plan.model.moe) m["moe"] = moe_json(*plan.model.moe, moe_steps);
    std::cout << "done: " << records.size() << " step(s), median " << m["time"]["step_seconds"].get<double>() << " s/step, "
              << m["throughput"]["tokens_per_second"].get<double>() << " tokens/s\n";
    if (p.pp > 1) {
      std::printf("pipeline (step %lld): bubble %.3f measured, %.3f predicted by the cost model's schedule; micro-batches in flight per stage:",
                  static_cast<long long>(trace["step"].get<int64_t>()), traced_bubble, trace["predicted_bubble_fraction"].get<double>());
      for (double x : stage_in_flight) std::printf(" %g", x);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (diverged_at > 0) {
      m["status"] = "diverged";
      m["diverged"] = {{"step", diverged_at}, {"quantity", diverged_what == "loss" ? "loss" : "grad_norm"}, {"value", diverged_value}};
    }
    if (!o.measurement_path.empty()) {
      write_json_atomically(o.measurement_path, m);
      std::cout << "measurement: " << o.measurement_path << "\n";
    }
  }
  if (diverged_at > 0 && talk) {
    std::ostringstream line;
    line << "executor: error: training diverged: the " << diverged_what << " at step " << diverged_at << " is "
         << (diverged_value == "not_finite" ? "not finite at a loss scale below 1" : diverged_value) << " (" << cm::precision_name(t.precision)
         << ", peak --lr " << o.lr << "); the run stopped there" << (diverged_what == "loss" ? "" : ", without applying that step's update,")
         << " and wrote no checkpoint or export of it" << (last_checkpoint.empty() ? "" : " (the last checkpoint, " + last_checkpoint + ", stands)")
         << ". A lower --lr, --clip-grad or a longer --warmup-steps may help";
    print_for_rank(rank, line.str());
  }
  comm.barrier();
  // Every rank stopped at the same step: nothing to abort (kDivergedEverywhere).
  return diverged_at > 0 ? kDivergedEverywhere : 0;
}

}  // namespace

void print_rank_message(const std::string& text) {
  print_for_rank(launcher_rank(), text);
}

int run_executor(const RunOptions& o, const std::string& command_line) {
  const int env_rank = launcher_rank();
  cm::Plan plan;
  try {
    plan = load_plan(o.plan_path);
    check_supported(plan);
    check_options(o);
  } catch (const std::exception& e) {
    if (env_rank == 0) print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }

  World w;
  try {
    w = make_world(o.device, o.timeout_seconds);
  } catch (const std::exception& e) {
    print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }
  int code = 0;
  try {
    code = train(o, command_line, w, plan);
  } catch (const InputError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: error: ") + e.what());
    code = kExitBadInput;
  } catch (const DataError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: data error: ") + e.what());
    code = kExitBadInput;
  } catch (const CheckpointError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: checkpoint error: ") + e.what());
    code = kExitBadInput;
  } catch (const ImportError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: import error: ") + e.what());
    code = kExitBadInput;
  } catch (const std::exception& e) {
    print_for_rank(w.comm->rank(), std::string("executor: run failed: ") + e.what());
    code = kExitRunFailed;
  }
  if (code == kDivergedEverywhere) {
    code = kExitRunFailed;
  } else if (code != 0 && w.comm->size() > 1) {  // no rank is left waiting for this one
    (w.bootstrap ? w.bootstrap : w.comm)->abort(code);  // under mpirun, MPI_Abort ends every rank at once
  }
  w.comm.reset();
  w.bootstrap.reset();
  finalize_mpi();
  return code;
}

}  // namespace trainplan::executor
