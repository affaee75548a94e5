// A measurement the executor wrote against the estimate of the plan its header describes.

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text_table.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/validate.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;
using detail::fmt;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// `memory.reserved_bytes` when measured: a number >= 0, else an error naming the pointer.
Result<std::optional<double>> reserved_bytes(const nlohmann::json& measurement, const std::string& file) {
  const auto memory = measurement.find("memory");
  if (memory == measurement.end() || !memory->is_object()) return std::optional<double>();
  const auto reserved = memory->find("reserved_bytes");
  if (reserved == memory->end() || reserved->is_null()) return std::optional<double>();
  if (!reserved->is_number() || reserved->get<double>() < 0) {
    return Error{file + ": /memory/reserved_bytes: must be a number >= 0" +
                 (reserved->is_number() ? " (got " + reserved->dump() + ")" : std::string())};
  }
  return std::optional<double>(reserved->get<double>());
}

double value_or_zero(const std::map<std::string, double>& quantities, const std::string& key) {
  const auto it = quantities.find(key);
  return it == quantities.end() ? 0 : it->second;
}

}  // namespace

Result<ValidationTable> validate_measurement(const nlohmann::json& document, const std::string& file) {
  auto measured = read_performance_document(document, file, kMeasurementSchema);
  if (!measured) return measured.error();
  auto reserved = reserved_bytes(document, file);
  if (!reserved) return reserved.error();
  auto request = costmodel::parse_plan(measurement_plan_document(document, file), file);
  if (!request) return Error{measurement_plan_error(request.error().message, document, file)};
  auto plan = costmodel::plan_with_defaults(*request);
  if (!plan) return Error{file + ": " + plan.error().message};
  const PerformanceDocument predicted = predict(*plan, file);
  const costmodel::Estimate estimate = costmodel::estimate(*plan);
  const std::string why_not = estimate.fits ? "" : "does not fit: " + (estimate.reasons.empty() ? std::string("?") : estimate.reasons.front());

  ValidationTable table;
  const std::string name = std::filesystem::path(file).filename().string();
  const std::string layout = ParallelLayout::of(plan->parallel).text();
  table.id = "measurement:" + name;
  table.title = "Measurement " + name;
  table.quantity = "seconds, tokens/s, GiB per GPU";
  table.source = fmt("%s: measured on %s, %d ranks; predicted for %s, %s", file.c_str(),
                     measured->device.empty() ? "(device not given)" : measured->device.c_str(), measured->world_size,
                     plan->cluster.name.c_str(), layout.c_str());
  table.reference = "measured";
  table.run_kind = "measured";
  // Rows only for what was measured; a plan the cost model says does not fit says so in every note.
  const auto add = [&](const std::string& label, double measured_value, double predicted_value, std::string note) {
    if (!why_not.empty()) note = note.empty() ? why_not : note + "; " + why_not;
    if (measured_value > 0) table.rows.push_back(validation_row(label, measured_value, predicted_value, note, estimate.fits));
  };
  add("step seconds", value_or_zero(measured->time, "step_seconds"), value_or_zero(predicted.time, "step_seconds"), "");
  add("tokens/s", value_or_zero(measured->throughput, "tokens_per_second"), value_or_zero(predicted.throughput, "tokens_per_second"), "");
  add("peak allocated GiB", value_or_zero(measured->memory, "total_bytes") / kGiB, estimate.memory.total.value() / kGiB, "");
  if (*reserved) add("peak reserved GiB", **reserved / kGiB, estimate.memory.reserved.value() / kGiB, "");
  summarise(table);
  return table;
}

Result<ValidationTable> validate_measurement_file(const std::string& path) {
  auto text = costmodel::read_text_file(path);
  if (!text) return text.error();
  auto json = costmodel::parse_json_text(*text, path);
  if (!json) return json.error();
  return validate_measurement(*json, path);
}

}  // namespace trainplan::planner
