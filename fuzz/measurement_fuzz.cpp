// Fuzz target for the measurement reader and the comparison report: any text given to
// `planner compare` as a measurement (trainplan/measurement/v1, from the executor or a person)
// must give a document or an error message, and a document must compare and render in every
// format: no crash, no hang, no exception escaping. Built like json_loaders_fuzz.cpp.

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/measurement.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pl = trainplan::planner;
  const nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  (void)pl::read_performance_document(json, "fuzz.json", pl::kEstimateSchema);
  auto measured = pl::read_performance_document(json, "fuzz.json", pl::kMeasurementSchema);
  if (!measured) return 0;
  // Against itself read as an estimate: every key then has a prediction to compare with.
  pl::PerformanceDocument predicted = *measured;
  predicted.schema = pl::kEstimateSchema;
  const pl::Comparison comparison = pl::compare(predicted, *measured);
  for (pl::Format f : {pl::Format::kText, pl::Format::kMarkdown, pl::Format::kJson, pl::Format::kCsv, pl::Format::kHtml}) (void)pl::render_comparison(comparison, f);
  (void)comparison.largest_deviation();
  return 0;
}
