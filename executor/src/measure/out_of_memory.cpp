// Out of memory as an answer (see out_of_memory.hpp).

#include "out_of_memory.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <regex>

#include <c10/util/Exception.h>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

nlohmann::json optional(const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); }

// The planner command line of `plan`, every setting fixed.
std::string planner_command(const cm::Plan& plan) {
  const cm::PlanRequest request{plan.name, plan.model_ref, plan.cluster_ref, plan.model, plan.cluster, plan.gpus, plan.training,
                                cm::ParallelConstraints::of(plan.parallel)};
  return executor::planner_command(request, "throughput");
}

// Bytes for people: GiB up to 1 TiB, then TiB, PiB, EiB.
std::string bytes_text(double bytes) {
  const char* units[] = {"GiB", "TiB", "PiB", "EiB"};
  double x = bytes / 1073741824.0;
  int u = 0;
  while (x >= 1024.0 && u < 3) {
    x /= 1024.0;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.2f %s", x, units[u]);
  return text;
}

}  // namespace

std::optional<std::string> out_of_memory_message(const std::exception& e) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) return oom->what_without_backtrace();
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    const std::string text = error->what_without_backtrace();
    if (text.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
        text.find("DefaultCPUAllocator: not enough memory") != std::string::npos) {
      return text;
    }
  }
  return std::nullopt;
}

std::optional<double> requested_bytes(const std::string& message) {
  std::smatch m;
  static const std::regex cpu("tried to allocate ([0-9]+) bytes");
  if (std::regex_search(message, m, cpu)) return std::stod(m[1].str());
  static const std::regex cuda("Tried to allocate ([0-9]+(\\.[0-9]+)?) (bytes|KiB|MiB|GiB)");
  if (std::regex_search(message, m, cuda)) {
    const std::string unit = m[3].str();
    const double scale = unit == "GiB" ? 1073741824.0 : unit == "MiB" ? 1048576.0 : unit == "KiB" ? 1024.0 : 1.0;
    return std::stod(m[1].str()) * scale;
  }
  return std::nullopt;
}

std::optional<double> process_peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0 || usage.ru_maxrss <= 0) return std::nullopt;
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // kilobytes on Linux
}

std::optional<NextPlan> next_plan_after_out_of_memory(const cm::Plan& plan) {
  const auto& p = plan.parallel;
  const auto try_plan = [&](cm::Plan candidate, const std::string& what) -> std::optional<NextPlan> {
    if (!cm::validate_plan(candidate)) return std::nullopt;
    const cm::Estimate e = cm::estimate(candidate);
    if (!e.fits) return std::nullopt;
    return NextPlan{what, e.memory.required.value(), planner_command(candidate), candidate, ""};
  };
  if (p.micro_batch >= 2) {
    cm::Plan half = plan;
    half.parallel.micro_batch = p.micro_batch / 2;
    if (plan.training.global_batch % (static_cast<int64_t>(p.dp) * half.parallel.micro_batch) == 0) {
      if (auto next = try_plan(half, "micro_batch " + std::to_string(half.parallel.micro_batch))) return next;
    }
  }
  for (cm::Recompute r : {cm::Recompute::kSelective, cm::Recompute::kFull}) {
    if (static_cast<int>(r) <= static_cast<int>(p.recompute)) continue;
    cm::Plan more = plan;
    more.parallel.recompute = r;
    more.parallel.recompute_layers = 0;
    if (auto next = try_plan(more, std::string("recompute ") + cm::recompute_name(r))) return next;
  }
  return std::nullopt;
}

std::string next_plan_path(const std::string& measurement_path) {
  std::string stem = measurement_path;
  for (const char* suffix : {".measurement.json", ".json"}) {
    const std::string s(suffix);
    if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0) {
      stem.resize(stem.size() - s.size());
      break;
    }
  }
  return stem + ".next-plan.json";
}

nlohmann::json out_of_memory_json(const OutOfMemory& oom, const std::optional<NextPlan>& next) {
  nlohmann::json j = {
      {"requested_bytes", optional(oom.requested_bytes)},
      {"allocated_bytes", optional(oom.allocated_bytes)},
      {"reserved_bytes", optional(oom.reserved_bytes)},
      {"process_peak_resident_bytes", optional(oom.process_peak_resident_bytes)},
      {"phase", oom.phase},
      {"micro_batch", oom.micro_batch >= 0 ? nlohmann::json(oom.micro_batch) : nlohmann::json(nullptr)},
      {"step", oom.step},
      {"rank", oom.rank},
      {"message", oom.message},
  };
  j["next_plan"] = nullptr;
  if (next) {
    j["next_plan"] = {{"change", next->what}, {"required_bytes", next->required_bytes}, {"command", next->command}};
    if (!next->plan_path.empty()) j["next_plan"]["plan_file"] = next->plan_path;
  }
  return j;
}

std::string out_of_memory_line(const OutOfMemory& oom, const std::optional<NextPlan>& next) {
  std::string line = "executor: out of memory in " + oom.phase;
  if (oom.micro_batch >= 0) line += " of micro-batch " + std::to_string(oom.micro_batch);
  line += " of step " + std::to_string(oom.step);
  line += oom.requested_bytes ? " asking for " + bytes_text(*oom.requested_bytes) : std::string(" (request size not in the allocator's message)");
  if (oom.allocated_bytes || oom.reserved_bytes) {
    line += " (allocated " + (oom.allocated_bytes ? bytes_text(*oom.allocated_bytes) : std::string("?")) + ", reserved " +
            (oom.reserved_bytes ? bytes_text(*oom.reserved_bytes) : std::string("?")) + ")";
  } else if (oom.process_peak_resident_bytes) {
    line += " (process peak resident " + bytes_text(*oom.process_peak_resident_bytes) + ")";
  }
  if (next) {
    line += "; next plan to try: " + next->what + " (the cost model estimates " + bytes_text(next->required_bytes) + " required) — " +
            (next->plan_path.empty() ? next->command : "written to " + next->plan_path + " (planner evaluate " + next->plan_path + ")");
  } else {
    line += "; the cost model finds no smaller micro-batch or recompute setting of this plan that fits: more GPUs, more sharding "
            "(ZeRO, tp, pp) or a shorter sequence";
  }
  return line;
}

}  // namespace trainplan::executor
