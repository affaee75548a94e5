#pragma once
// Prediction against measurement: the quantities of an estimate beside those a measurement has,
// with the relative difference of each, and the report of it for people (aligned text or
// Markdown tables, one per section) or machines (`trainplan/comparison/v1`).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan::planner {

struct ComparisonRow {
  Section section = Section::kMemory;
  std::string key;                            // as in the documents: "weights_bytes"
  double predicted = 0;                       // document units (bytes, seconds, ...)
  std::optional<double> measured;             // absent: not measured
  // (measured - predicted) / predicted; 0 when both are 0; absent when not measured or when only
  // the prediction is 0.
  std::optional<double> relative_difference;
};

struct Comparison {
  PerformanceDocument predicted;
  PerformanceDocument measured;
  // Every quantity the prediction has, by section in section_keys() order, except those predicted
  // as 0 and not measured (parts the plan does not have, such as pipeline bubbles without pp).
  std::vector<ComparisonRow> rows;
  // Where the two documents describe different runs (model, parallel layout, world size), and a
  // note when a CPU measurement is compared with a GPU estimate.
  std::vector<std::string> warnings;
  // When the measured run ran out of memory: the estimate beside it, one sentence ("predicted
  // fits at 51.30 GiB; ran out of memory at 69.40 GiB (reserved), asking for 15.66 GiB in
  // backward, micro-batch 3 of step 1"), and whether the estimate had said it would not fit.
  std::optional<std::string> out_of_memory;
  std::optional<bool> out_of_memory_predicted;

  // The row with the largest |relative_difference|; nullptr when nothing comparable was measured.
  [[nodiscard]] const ComparisonRow* largest_deviation() const;
};

[[nodiscard]] Comparison compare(PerformanceDocument predicted, PerformanceDocument measured);

// Text and Markdown: a header (plan, model, layout, world size, device, the two files), the
// warnings, a table per section (quantity, predicted, measured, difference) and a closing line
// naming the largest deviation. Json: comparison_to_json. kCsv is rendered as text.
[[nodiscard]] std::string render_comparison(const Comparison& comparison, Format format);

// The `trainplan/comparison/v1` document: header fields, warnings, and rows
// {section, key, predicted, measured, relative_difference} with null where a value is absent.
[[nodiscard]] nlohmann::json comparison_to_json(const Comparison& comparison);

}  // namespace trainplan::planner
