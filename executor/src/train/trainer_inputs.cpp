// A run's inputs checked before anything runs (trainer_parts.hpp).

#include "trainer_parts.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "checkpoint.hpp"
#include "cpu_memory.hpp"
#include "environment.hpp"
#include "gpu.hpp"
#include "hf_checkpoint.hpp"
#include "kernel_profile.hpp"
#include "out_of_memory.hpp"
#include "rank_output.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::executor::trainer_parts {

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

// What this build of the executor runs (capabilities.hpp executor_limitations); everything else in a
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

}  // namespace trainplan::executor::trainer_parts
