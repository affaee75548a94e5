#include "trainplan/planner/calibrate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include <Eigen/Dense>
#include <nlohmann/json.hpp>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/measurement.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;

namespace {

constexpr int kScales = 4;  // gemm, attention, memory, latency scales
constexpr const char* kNames[kScales + 1] = {"GEMM time", "attention time", "memory-bound time", "kernel latency", "collective time"};
// The fit's parameters, in log space (scales stay positive, the prior is symmetric in ratio): one
// scale common to every kernel class (a device slower or faster in everything: another clock,
// ranks sharing cores), without a prior, and each class's own deviation from it, held near 0 by
// the prior: log(scale_k) = x(0) + x(1 + k). Last, the collectives' own scale, outside the common
// one (their time is the network's or MPI's, not the device's), held near 0 by the prior too.
constexpr int kCollective = 1 + kScales;
constexpr int kParameters = 2 + kScales;
constexpr int kPriors = kScales + 1;  // the class deviations and the collective scale
using Parameters = Eigen::Matrix<double, kParameters, 1>;

// The bounds a profile accepts for a time scale (hardware.cpp): 0.1 (exclusive) to 10.
constexpr double kLowestScale = 0.1 * (1 + 1e-9), kHighestScale = 10.0;
const double kLowestLog = std::log(kLowestScale), kHighestLog = std::log(kHighestScale);

// x with every log scale moved inside the bounds (the class deviations take the change), so that
// the fit never stands where the clamp makes the error flat.
Parameters feasible(Parameters x) {
  for (int k = 0; k < kScales; ++k) x(1 + k) = std::clamp(x(0) + x(1 + k), kLowestLog, kHighestLog) - x(0);
  x(kCollective) = std::clamp(x(kCollective), kLowestLog, kHighestLog);
  return x;
}

double scale_of(const Parameters& x, int k) {
  return std::clamp(std::exp(k == kScales ? x(kCollective) : x(0) + x(1 + k)), kLowestScale, kHighestScale);
}

costmodel::Calibration with_scales(costmodel::Calibration c, const Parameters& x) {
  c.gemm_time_scale = scale_of(x, 0);
  c.attention_time_scale = scale_of(x, 1);
  c.memory_time_scale = scale_of(x, 2);
  c.latency_scale = scale_of(x, 3);
  c.collective_time_scale = scale_of(x, kScales);
  return c;
}

costmodel::Estimate estimate_on(const MeasuredRun& run, const costmodel::HardwareProfile& profile) {
  costmodel::Plan plan = run.plan;
  plan.cluster = profile;
  return costmodel::estimate(plan);
}

// Relative step-time errors of every run, then the prior's residuals: the class deviations from
// 0, the collective scale from where the profile had it (`collective_start`, its log).
Eigen::VectorXd residuals(const std::vector<MeasuredRun>& runs, costmodel::HardwareProfile profile, const Parameters& x,
                          double prior_weight, double collective_start) {
  profile.gpu.calibration = with_scales(profile.gpu.calibration, x);
  Eigen::VectorXd r(static_cast<Eigen::Index>(runs.size()) + kPriors);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    r(static_cast<Eigen::Index>(i)) = estimate_on(runs[i], profile).time.step.value() / runs[i].step_seconds - 1.0;
  }
  for (int k = 0; k < kPriors; ++k) {
    r(static_cast<Eigen::Index>(runs.size()) + k) = prior_weight * (x(1 + k) - (1 + k == kCollective ? collective_start : 0.0));
  }
  return r;
}

}  // namespace

std::string calibration_scales_text(const costmodel::Calibration& c) {
  const double scales[kScales + 1] = {c.gemm_time_scale, c.attention_time_scale, c.memory_time_scale, c.latency_scale, c.collective_time_scale};
  std::string text;
  for (int k = 0; k <= kScales; ++k) {
    char part[64];
    std::snprintf(part, sizeof part, "%s%s x %.3g", k > 0 ? ", " : "", kNames[k], scales[k]);
    text += part;
  }
  return text;
}

Result<MeasuredRun> load_measured_run(const std::string& path, const std::string& cluster_override) {
  auto text = costmodel::read_text_file(path);
  if (!text) return text.error();
  auto json = costmodel::parse_json_text(*text, path);
  if (!json) return json.error();
  const nlohmann::json& m = *json;
  const auto text_at = [&](const char* key) -> std::string {
    const auto it = m.find(key);
    return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!m.is_object() || text_at("schema") != "trainplan/measurement/v1") {
    return Error{path + ": /schema: must be \"trainplan/measurement/v1\" (a measurement the executor wrote)"};
  }
  for (const char* key : {"model", "cluster", "gpus", "training", "parallel"}) {
    if (!m.contains(key)) return Error{path + ": /" + key + ": missing (the plan the run was made for)"};
  }
  nlohmann::json plan = measurement_plan_document(m, path);
  if (!cluster_override.empty()) {
    // The --cluster given instead of the run's own: its errors are the flag's, not the file's.
    auto profile = costmodel::find_hwprofile(cluster_override);
    if (!profile) return Error{"--cluster " + cluster_override + ": " + profile.error().message};
    plan["cluster"] = cluster_override;
  }
  auto request = costmodel::parse_plan(plan, path);
  if (!request) return Error{measurement_plan_error(request.error().message, m, path)};
  auto fixed = costmodel::plan_with_defaults(*request);
  if (!fixed) return Error{path + ": " + fixed.error().message};
  MeasuredRun run;
  run.name = std::filesystem::path(path).filename().string();
  run.plan = *fixed;
  const auto number = [&](const char* section, const char* key) -> std::optional<double> {
    const auto s = m.find(section);
    if (s == m.end() || !s->is_object()) return std::nullopt;
    const auto v = s->find(key);
    if (v == s->end() || !v->is_number()) return std::nullopt;
    return v->get<double>();
  };
  const auto step = number("time", "step_seconds");
  if (!step || !(*step > 0) || !std::isfinite(*step)) return Error{path + ": /time/step_seconds: must be a number > 0"};
  run.step_seconds = *step;
  if (auto reserved = number("memory", "reserved_bytes"); reserved && *reserved > 0) run.reserved_bytes = *reserved;
  return run;
}

Result<CalibrationResult> calibrate(const costmodel::HardwareProfile& base, const std::vector<MeasuredRun>& runs,
                                    const CalibrationOptions& options) {
  if (runs.empty()) return Error{"calibrate: no measurements given"};
  for (const auto& run : runs) {
    if (!(run.step_seconds > 0)) return Error{"calibrate: " + run.name + ": no step time"};
  }
  costmodel::HardwareProfile profile = base;
  // Start from the profile's current calibration, in log space.
  const costmodel::Calibration& c0 = base.gpu.calibration;
  Parameters x;
  x << 0.0, std::log(c0.gemm_time_scale), std::log(c0.attention_time_scale), std::log(c0.memory_time_scale),
      std::log(std::max(c0.latency_scale, 1e-3)), std::log(c0.collective_time_scale);
  const double collective_start = x(kCollective);
  profile.gpu.calibration.allocator_extra_bytes = 0;

  // Levenberg-Marquardt with a forward-difference Jacobian.
  double lambda = 1e-3;
  Eigen::VectorXd r = residuals(runs, profile, x, options.prior_weight, collective_start);
  int iterations = 0;
  bool converged = false;
  Eigen::MatrixXd J(r.size(), kParameters);
  while (!converged && iterations < options.max_iterations) {
    ++iterations;
    constexpr double kStep = 1e-4;
    for (int k = 0; k < kParameters; ++k) {
      Parameters xk = x;
      xk(k) += kStep;
      J.col(k) = (residuals(runs, profile, xk, options.prior_weight, collective_start) - r) / kStep;
    }
    const Eigen::MatrixXd JtJ = J.transpose() * J;
    const Eigen::VectorXd g = J.transpose() * r;
    bool improved = false;
    for (int attempt = 0; attempt < 10 && !improved; ++attempt) {
      Eigen::MatrixXd A = JtJ;
      A.diagonal() += lambda * (JtJ.diagonal().array() + 1e-12).matrix();
      const Parameters step = A.ldlt().solve(-g);
      const Parameters candidate = feasible(x + step);
      const Eigen::VectorXd rc = residuals(runs, profile, candidate, options.prior_weight, collective_start);
      if (rc.squaredNorm() < r.squaredNorm()) {
        const double gain = r.squaredNorm() - rc.squaredNorm();
        x = candidate;
        r = rc;
        lambda = std::max(lambda / 3, 1e-9);
        improved = true;
        converged = gain < 1e-14;
      } else {
        lambda *= 10;
      }
    }
    if (!improved) {  // no step lowers the error: a minimum
      converged = true;
      break;
    }
  }

  CalibrationResult result;
  result.iterations = iterations;
  profile.gpu.calibration = with_scales(profile.gpu.calibration, x);
  // The allocator's extra bytes: the mean reserved-memory residual (least squares of a constant)
  // of the runs under PyTorch's default allocator, the reserve it applies to (estimate.cpp); under
  // expandable segments the predicted reserve is the least the run needs, and what it reports
  // depends on whether memory ran short.
  double residual_sum = 0;
  int with_memory = 0;
  for (const auto& run : runs) {
    if (!run.reserved_bytes || run.plan.training.allocator != costmodel::Allocator::kCaching) continue;
    residual_sum += *run.reserved_bytes - estimate_on(run, profile).memory.reserved.value();
    ++with_memory;
  }
  if (with_memory > 0) profile.gpu.calibration.allocator_extra_bytes = residual_sum / with_memory;

  // What the data determined: a parameter whose column of the Jacobian (on the runs, not the
  // prior) is small is held by the prior.
  for (int k = 0; k < kPriors; ++k) {
    const double value = scale_of(x, k);
    const bool at_bound = value <= kLowestScale * 1.0001 || value >= kHighestScale * 0.9999;
    const double sensitivity = J.col(1 + k).head(static_cast<Eigen::Index>(runs.size())).norm();
    if (sensitivity < 1e-3 && !at_bound) {
      result.notes.push_back(std::string(kNames[k]) + (k == kScales ? ": the measurements do not depend on it; it stays as it was"
                                                                    : ": the measurements do not depend on it; it follows the common scale"));
    }
    if (at_bound) {
      result.notes.push_back(std::string(kNames[k]) + " x " + std::to_string(value) +
                             " is at the bound of what a profile accepts (0.1 to 10): the measurements are far from this profile; "
                             "is it the device they ran on?");
    }
  }
  if (!converged) result.notes.push_back("the fit stopped after " + std::to_string(iterations) + " iterations without converging");
  std::string names;
  for (const auto& run : runs) names += (names.empty() ? "" : ", ") + run.name;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  profile.gpu.calibration.source = "planner calibrate, " + std::string(date) + ", from " + std::to_string(runs.size()) + " measurement(s): " + names;

  for (const auto& run : runs) {
    const costmodel::Estimate before = estimate_on(run, base);
    const costmodel::Estimate after = estimate_on(run, profile);
    result.runs.push_back({run.name, run.step_seconds, before.time.step.value(), after.time.step.value(), run.reserved_bytes,
                           before.memory.reserved.value(), after.memory.reserved.value()});
  }
  result.profile = std::move(profile);
  return result;
}

}  // namespace trainplan::planner
