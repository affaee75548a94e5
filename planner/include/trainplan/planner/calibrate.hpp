#pragma once
// Calibration (`planner calibrate`): fits a hardware profile's free parameters (costmodel
// Calibration: time scales of GEMM, attention and memory-bound kernels, the kernel-latency
// scale, the collectives' time scale, extra bytes the allocator reserves) to executor
// measurements by least squares, and reports each measurement's error before and after. Datasheet figures and measured kernel
// tables are never changed.

#include <optional>
#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

// One measured run: the plan it ran and what the executor measured.
struct MeasuredRun {
  std::string name;                      // for the report (the file name)
  costmodel::Plan plan;                  // its cluster is replaced by the profile being fitted
  double step_seconds = 0;               // > 0
  std::optional<double> reserved_bytes;  // peak reserved memory (GPU runs)
};

// Reads a `trainplan/measurement/v1` file the executor wrote and the plan its header describes
// (a model or cluster that is no preset from `model_document` / `cluster_document`);
// `cluster_override` (a preset or path), when not empty, replaces the cluster. Errors name the
// file (and the JSON pointer).
[[nodiscard]] costmodel::Result<MeasuredRun> load_measured_run(const std::string& path, const std::string& cluster_override = "");

struct CalibrationRunReport {
  std::string name;
  double measured_step = 0, step_before = 0, step_after = 0;
  std::optional<double> measured_reserved;
  double reserved_before = 0, reserved_after = 0;
};

struct CalibrationResult {
  costmodel::HardwareProfile profile;  // the base with the fitted calibration
  std::vector<CalibrationRunReport> runs;
  int iterations = 0;
  // Which parameters the data determined (a scale the measurements do not move stays at the
  // prior; these are named for the report).
  std::vector<std::string> notes;
};

struct CalibrationOptions {
  // The time scales are one scale common to every kernel class (free: a device slower or faster
  // in everything) times each class's own; this is the weight of the prior that keeps each
  // class's own scale near 1 (in units of relative step-time error), and the collectives' scale
  // (outside the common one) near the profile's: with fewer measurements than parameters the fit
  // stays well posed, a class the data cannot see follows the common scale, and collectives no
  // run has keep their scale.
  double prior_weight = 0.05;
  int max_iterations = 50;
};

// Fits `base`'s calibration to `runs` (each run's plan is estimated on the profile being fitted):
// Levenberg-Marquardt on the relative step-time errors (Eigen), and the allocator's extra bytes
// as the mean reserved-memory residual of the runs that measured it. Errors: no runs, a run
// without a step time.
[[nodiscard]] costmodel::Result<CalibrationResult> calibrate(const costmodel::HardwareProfile& base, const std::vector<MeasuredRun>& runs,
                                                             const CalibrationOptions& options = {});

// "GEMM time x 1.45, attention time x 1.24, memory-bound time x 2.76, kernel latency x 1.76,
// collective time x 1.3": a calibration's time scales, for reports.
[[nodiscard]] std::string calibration_scales_text(const costmodel::Calibration& c);

}  // namespace trainplan::planner
