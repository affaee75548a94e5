#include <array>
#include "trainplan/planner/compare.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text_table.hpp"

namespace trainplan::planner {

using detail::fmt;
using detail::Row;

const ComparisonRow* Comparison::largest_deviation() const {
  const ComparisonRow* largest = nullptr;
  for (const auto& row : rows) {
    if (!row.relative_difference) continue;
    if (!largest || std::fabs(*row.relative_difference) > std::fabs(*largest->relative_difference)) largest = &row;
  }
  return largest;
}

namespace {

std::string gib_text(double bytes) { return fmt("%.2f GiB", bytes / 1073741824.0); }

// The estimate's memory against a run that ran out of memory (Comparison::out_of_memory).
void describe_out_of_memory(const PerformanceDocument& predicted, const PerformanceDocument& measured, Comparison& c) {
  if (!measured.out_of_memory) return;
  const OutOfMemoryReport& oom = *measured.out_of_memory;
  // What must fit by the estimate: required (with the CUDA context), else reserved, else allocated.
  std::optional<double> predicted_bytes;
  for (const char* key : {"required_bytes", "reserved_bytes", "total_bytes"}) {
    const auto it = predicted.memory.find(key);
    if (it != predicted.memory.end() && it->second > 0) {
      predicted_bytes = it->second;
      break;
    }
  }
  std::string text;
  if (predicted.fits) text = *predicted.fits ? "predicted fits" : "predicted does not fit";
  else text = "predicted";
  if (predicted_bytes) text += " at " + gib_text(*predicted_bytes);
  text += "; ran out of memory";
  if (oom.reserved_bytes) text += " at " + gib_text(*oom.reserved_bytes) + " (reserved)";
  else if (oom.allocated_bytes) text += " at " + gib_text(*oom.allocated_bytes) + " (allocated)";
  else if (oom.process_peak_resident_bytes) text += " at " + gib_text(*oom.process_peak_resident_bytes) + " (process peak resident)";
  if (oom.requested_bytes) text += ", asking for " + gib_text(*oom.requested_bytes);
  text += " in " + oom.phase;
  if (oom.micro_batch) text += ", micro-batch " + std::to_string(*oom.micro_batch);
  if (oom.step) text += " of step " + std::to_string(*oom.step);
  if (predicted.fits) {
    c.out_of_memory_predicted = !*predicted.fits;
    if (!*predicted.fits) text += ": the prediction was right";
  }
  c.out_of_memory = text;
}

}  // namespace

Comparison compare(PerformanceDocument predicted, PerformanceDocument measured) {
  Comparison c;
  describe_out_of_memory(predicted, measured, c);
  for (Section section : kSections) {
    const auto& predictions = predicted.quantities(section);
    const auto& measurements = measured.quantities(section);
    for (const std::string& key : section_keys(section)) {
      const auto p = predictions.find(key);
      if (p == predictions.end()) continue;
      const auto m = measurements.find(key);
      ComparisonRow row{section, key, p->second, std::nullopt, std::nullopt};
      if (m != measurements.end()) {
        row.measured = m->second;
        if (row.predicted != 0) row.relative_difference = (m->second - row.predicted) / row.predicted;
        else if (m->second == 0) row.relative_difference = 0.0;
      } else if (row.predicted == 0) {
        continue;  // a part this plan does not have, and nobody measured it
      } else if (key == "gradients_step_end_bytes") {
        // Only where the stack frees its gradients and the peak comes before they are all made.
        const auto at_peak = predictions.find("gradients_bytes");
        if (at_peak != predictions.end() && at_peak->second == row.predicted) continue;
      }
      if (section == Section::kCommunication && row.predicted == 0 && row.measured.value_or(0) == 0) continue;  // none of this kind
      c.rows.push_back(std::move(row));
    }
  }
  if (!predicted.model.empty() && !measured.model.empty() && predicted.model != measured.model) {
    c.warnings.push_back("model differs: the estimate is for " + predicted.model + ", the measurement ran " + measured.model);
  }
  if (predicted.layout && measured.layout && *predicted.layout != *measured.layout) {
    c.warnings.push_back("parallel layout differs: the estimate has " + predicted.layout->text() + ", the measurement " +
                         measured.layout->text());
  }
  if (predicted.world_size > 0 && measured.world_size > 0 && predicted.world_size != measured.world_size) {
    c.warnings.push_back("world size differs: the estimate has " + std::to_string(predicted.world_size) + " GPUs, the measurement " +
                         std::to_string(measured.world_size) + " ranks");
  }
  if (!predicted.stack.empty() && !measured.stack.empty() && predicted.stack != measured.stack) {
    c.warnings.push_back("software stack differs: the estimate is for " + predicted.stack + ", the measurement ran " + measured.stack);
  }
  // An estimate's reserve is for its allocator (estimate.cpp); a GPU run's environment says which
  // one ran (the executor's allocator_conf: absent, PyTorch's default).
  if (!measured.device.empty() && measured.device != "cpu" && !measured.environment.empty()) {
    const auto conf = measured.environment.find("allocator_conf");
    const std::string ran = conf == measured.environment.end() ? std::string() : conf->second;
    const std::string ran_name = costmodel::allocator_name(costmodel::allocator_of_conf(ran));
    if (ran_name != predicted.allocator) {
      c.warnings.push_back("allocator differs: the estimate's reserved memory is for PyTorch's " + predicted.allocator + " allocator, the run's was " +
                           ran_name + (ran.empty() ? " (no PYTORCH_ALLOC_CONF)" : " (PYTORCH_ALLOC_CONF=" + ran + ")"));
    }
  }
  if (measured.device == "cpu" && !predicted.cluster.empty()) {
    c.warnings.push_back("the measurement ran on CPU and the estimate is for " + predicted.cluster +
                         " GPUs: memory compares, time and throughput do not");
  }
  c.predicted = std::move(predicted);
  c.measured = std::move(measured);
  return c;
}

namespace {

// Three significant digits, at least two decimals: 4.10, 0.500, 0.00224.
std::string significant(double x) {
  int decimals = 2;
  if (x != 0 && std::fabs(x) < 1) decimals = std::min(9, 2 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
  return fmt("%.*f", decimals, x);
}

std::string value_text(Section section, const std::string& key, double value) {
  switch (section) {
    case Section::kMemory: return significant(value / 1073741824.0);  // GiB, said in the table header
    case Section::kTime: return value < 1 ? significant(value * 1e3) + " ms" : significant(value) + " s";
    case Section::kThroughput:
      if (key == "mfu" || key == "hfu") return significant(100 * value) + "%";
      if (key.rfind("tokens_per_second", 0) == 0) return si(value, 4);
      return significant(value);
    case Section::kCommunication: return significant(value / 1048576.0);  // MiB, said in the table header
  }
  return significant(value);
}

std::string difference_text(const ComparisonRow& row) {
  if (!row.measured) return "";
  if (!row.relative_difference) return "n/a (predicted 0)";
  double percent = 100 * *row.relative_difference;
  if (std::fabs(percent) < 0.05) percent = 0;  // no "-0.0%"
  return fmt("%+.1f%%", percent);
}

std::string label(const std::string& key) {
  static const std::map<std::string, std::string> kLabels = {
      {"weights_bytes", "weights"},
      {"gradients_bytes", "gradients"},
      {"gradients_step_end_bytes", "gradients at the step's end"},
      {"autocast_copies_bytes", "of activations, autocast's weight copies"},
      {"optimizer_bytes", "optimizer states"},
      {"activations_bytes", "activations"},
      {"buffers_bytes", "comm buffers"},
      {"overhead_bytes", "overhead"},
      {"total_bytes", "total allocated"},
      {"reserved_bytes", "reserved"},
      {"required_bytes", "required"},
      {"cpu_offload_per_node_bytes", "CPU offload per node"},
      {"cpu_offload_per_gpu_bytes", "CPU offload per GPU"},
      {"step_seconds", "step"},
      {"compute_seconds", "compute"},
      {"recompute_seconds", "recompute"},
      {"tp_comm_seconds", "tensor-parallel comm"},
      {"tp_copy_seconds", "of it, DTensor's sequence-shard copies"},
      {"autocast_cast_seconds", "of compute and recompute, autocast's casts"},
      {"cp_comm_seconds", "context-parallel comm"},
      {"ep_comm_seconds", "expert-parallel comm"},
      {"pp_comm_seconds", "pipeline p2p"},
      {"dp_comm_exposed_seconds", "data-parallel comm, exposed"},
      {"dp_comm_total_seconds", "data-parallel comm, total"},
      {"dp_copy_seconds", "sharding copies"},
      {"host_wait_seconds", "host-bound wait"},
      {"sustained_clock_seconds", "sustained clock"},
      {"straggler_seconds", "wait for the slowest GPU"},
      {"sustained_step_seconds", "sustained step"},
      {"bubble_seconds", "pipeline bubble"},
      {"optimizer_seconds", "optimizer step"},
      {"offload_seconds", "offload transfers"},
      {"tokens_per_second", "tokens/s"},
      {"tokens_per_second_per_gpu", "tokens/s per GPU"},
      {"model_tflops_per_gpu", "model TFLOP/s per GPU"},
      {"hardware_tflops_per_gpu", "hardware TFLOP/s per GPU"},
      {"mfu", "MFU"},
      {"hfu", "HFU"},
      {"cp_bytes_sent_per_step", "context parallelism"},
      {"ep_bytes_sent_per_step", "expert parallelism"},
  };
  const auto it = kLabels.find(key);
  return it == kLabels.end() ? key : it->second;
}

const char* table_title(Section section) {
  switch (section) {
    case Section::kMemory: return "memory per GPU (GiB)";
    case Section::kTime: return "time per step";
    case Section::kThroughput: return "throughput";
    case Section::kCommunication: return "bytes sent per step, busiest rank (MiB)";
  }
  return "?";
}

std::string section_table(const Comparison& c, Section section, bool markdown) {
  std::vector<Row> rows;
  for (const auto& row : c.rows) {
    if (row.section != section) continue;
    rows.push_back(Row{{label(row.key), value_text(section, row.key, row.predicted),
                        row.measured ? value_text(section, row.key, *row.measured) : "not measured", difference_text(row)}});
  }
  if (rows.empty()) return "";
  return detail::table({table_title(section), "predicted", "measured", "difference"}, rows, markdown, {false, true, true, true});
}

// The estimate's value where it has one, else the measurement's.
std::string either(const std::string& predicted, const std::string& measured) { return predicted.empty() ? measured : predicted; }

std::string closing_line(const Comparison& c) {
  const ComparisonRow* largest = c.largest_deviation();
  if (!largest) return "Nothing the estimate predicts was measured.";
  const std::string unit = largest->section == Section::kMemory ? " GiB" : largest->section == Section::kCommunication ? " MiB" : "";
  return fmt("Largest deviation: %s %s, %s: measured %s%s against %s%s predicted.", section_name(largest->section),
             label(largest->key).c_str(), difference_text(*largest).c_str(),
             value_text(largest->section, largest->key, *largest->measured).c_str(), unit.c_str(),
             value_text(largest->section, largest->key, largest->predicted).c_str(), unit.c_str());
}

std::string header(const Comparison& c, bool markdown) {
  const PerformanceDocument& p = c.predicted;
  const PerformanceDocument& m = c.measured;
  std::vector<std::pair<std::string, std::string>> lines;
  std::string plan = either(p.name, m.name);
  if (!p.name.empty() && !m.name.empty() && p.name != m.name) plan += " (the measurement says " + m.name + ")";
  lines.emplace_back("Plan", plan.empty() ? "(unnamed)" : plan);
  lines.emplace_back("Model", either(p.model, m.model));
  const auto& layout = p.layout ? p.layout : m.layout;
  lines.emplace_back("Layout", layout ? layout->text() : "(not given)");
  const int world_size = p.world_size > 0 ? p.world_size : m.world_size;
  lines.emplace_back("World size", world_size > 0 ? std::to_string(world_size) : "(not given)");
  std::string device = m.device.empty() ? "(not given)" : m.device;
  if (!p.cluster.empty()) device += " (estimated for " + p.cluster + ")";
  lines.emplace_back("Device", device);
  lines.emplace_back("Estimate", p.file);
  std::string measurement = m.file;
  if (!m.losses.empty()) {
    measurement += fmt(", %zu steps, loss %.4g -> %.4g", m.losses.size(), m.losses.front(), m.losses.back());
  }
  lines.emplace_back("Measurement", measurement);
  if (!m.environment.empty()) {
    std::string environment;
    const auto add = [&](const char* key, const char* label) {
      const auto it = m.environment.find(key);
      if (it != m.environment.end()) environment += (environment.empty() ? "" : ", ") + std::string(label) + it->second;
    };
    add("libtorch_version", "LibTorch ");
    add("cuda_version", "CUDA ");
    add("nccl_version", "NCCL ");
    add("executor_commit", "executor ");
    add("allocator_conf", "PYTORCH_ALLOC_CONF ");
    if (!environment.empty()) lines.emplace_back("Environment", environment);
  }

  std::ostringstream out;
  out << (markdown ? "# " : "") << "trainplan comparison: estimate against measurement\n\n";
  for (const auto& [key, value] : lines) {
    if (markdown) out << "- " << key << ": " << value << "\n";
    else out << "  " << key << std::string(13 - key.size(), ' ') << value << "\n";
  }
  out << "\n";
  for (const auto& w : c.warnings) out << (markdown ? "**warning:** " : "warning: ") << w << (markdown ? "\n\n" : "\n");
  if (!c.warnings.empty() && !markdown) out << "\n";
  return out.str();
}

std::string numbers(const std::vector<double>& xs) {
  std::string out;
  for (double x : xs) out += (out.empty() ? "" : " ") + fmt("%g", x);
  return out.empty() ? "-" : out;
}

// A titled table of quantities with two value columns (`left`, then "measured"), plain text
// (aligned) or markdown.
std::string quantity_table(const std::string& title, const std::string& left, const std::vector<std::array<std::string, 3>>& rows,
                           bool markdown) {
  std::ostringstream out;
  if (markdown) {
    out << "## " << title << "\n\n| quantity | " << left << " | measured |\n|---|---:|---:|\n";
    for (const auto& r : rows) out << "| " << r[0] << " | " << r[1] << " | " << r[2] << " |\n";
    return out.str();
  }
  out << title << "\n";
  std::size_t w0 = 8, w1 = left.size(), w2 = 8;
  for (const auto& r : rows) {
    w0 = std::max(w0, r[0].size());
    w1 = std::max(w1, r[1].size());
    w2 = std::max(w2, r[2].size());
  }
  const auto pad = [](std::size_t n) { return std::string(n, ' '); };
  out << "  quantity" << pad(w0 - 8 + 2 + w1 - left.size()) << left << pad(2 + w2 - 8) << "measured\n";
  for (const auto& r : rows) out << "  " << r[0] << pad(w0 - r[0].size() + 2 + w1 - r[1].size()) << r[1] << pad(2 + w2 - r[2].size()) << r[2] << "\n";
  return out.str();
}

// The pipeline schedule the executor recorded beside the cost model's: bubble and activations.
std::string pipeline_table(const Trace& t, bool markdown) {
  const double closed = (t.stages - 1.0) / (static_cast<double>(t.virtual_stages) * t.micro_batches);
  const std::string title = "Pipeline: " + t.schedule + ", " + count_text(t.stages, "stage", "stages") +
                            (t.virtual_stages > 1 ? fmt(" x %d chunks", t.virtual_stages) : std::string()) + ", " +
                            count_text(t.micro_batches, "micro-batch", "micro-batches") + fmt("; closed-form bubble (p-1)/(v m) = %.3f", closed);
  const std::string predicted_bubble = t.predicted_bubble_fraction ? fmt("%.3f", *t.predicted_bubble_fraction) : "-";
  return quantity_table(title, "predicted",
                        {{"bubble (idle / compute)", predicted_bubble, fmt("%.3f", t.bubble_fraction)},
                         {"micro-batches in flight per stage", numbers(t.predicted_in_flight), numbers(t.peak_in_flight)}},
                        markdown);
}

// What the experts did in the measured run, beside what the cost model assumes (balanced
// routing; min(1, capacity factor) of the routed tokens computed).
std::string moe_table(const MoeReport& m, bool markdown) {
  const std::string title = fmt("Mixture of experts: %d experts, top-%d, ", m.experts, m.top_k) +
                            (m.capacity_factor > 0 ? fmt("capacity factor %g", m.capacity_factor) : std::string("dropless")) +
                            "; the last step over every rank and layer";
  const double assumed = m.capacity_factor > 0 ? std::max(0.0, 1.0 - m.capacity_factor) : 0.0;
  std::vector<std::array<std::string, 3>> rows = {
      {"token copies routed", "-", fmt("%.0f", m.assignments_per_step)},
      {"dropped by capacity", fmt("at most %.1f%%", 100.0 * assumed),
       fmt("%.0f (%.1f%%; run %.1f%%)", m.tokens_dropped_per_step, m.assignments_per_step > 0 ? 100.0 * m.tokens_dropped_per_step / m.assignments_per_step : 0.0,
           100.0 * m.dropped_fraction)},
  };
  if (m.load_imbalance) rows.push_back({"load imbalance (busiest / mean expert)", "1 (balanced)", fmt("%.3f", *m.load_imbalance)});
  if (m.aux_loss) rows.push_back({"load-balancing loss (experts x sum f P)", "1 (balanced)", fmt("%.3f", *m.aux_loss)});
  return quantity_table(title, "cost model", rows, markdown);
}

}  // namespace

nlohmann::json comparison_to_json(const Comparison& c) {
  const PerformanceDocument& p = c.predicted;
  const PerformanceDocument& m = c.measured;
  const auto& layout = p.layout ? p.layout : m.layout;
  const auto optional = [](const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); };
  const auto optional_bool = [](const std::optional<bool>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); };
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : c.rows) {
    rows.push_back({{"section", section_name(row.section)},
                    {"key", row.key},
                    {"predicted", row.predicted},
                    {"measured", optional(row.measured)},
                    {"relative_difference", optional(row.relative_difference)}});
  }
  nlohmann::json largest = nullptr;
  if (const ComparisonRow* row = c.largest_deviation()) {
    largest = {{"section", section_name(row->section)}, {"key", row->key}, {"relative_difference", *row->relative_difference}};
  }
  return {
      {"schema", "trainplan/comparison/v1"},
      {"name", either(p.name, m.name)},
      {"source", "planner compare: " + p.file + " against " + m.file},
      {"estimate_file", p.file},
      {"measurement_file", m.file},
      {"model", either(p.model, m.model)},
      {"cluster", p.cluster},
      {"device", m.device},
      {"world_size", p.world_size > 0 ? p.world_size : m.world_size},
      {"parallel", layout ? nlohmann::json(layout->text()) : nlohmann::json(nullptr)},
      {"warnings", c.warnings},
      {"status", m.status},
      {"diverged", m.diverged_at_step ? nlohmann::json{{"step", *m.diverged_at_step}, {"quantity", m.diverged_quantity}} : nlohmann::json(nullptr)},
      {"out_of_memory", c.out_of_memory ? nlohmann::json{{"summary", *c.out_of_memory},
                                                         {"predicted_out_of_memory", optional_bool(c.out_of_memory_predicted)},
                                                         {"requested_bytes", optional(m.out_of_memory->requested_bytes)},
                                                         {"allocated_bytes", optional(m.out_of_memory->allocated_bytes)},
                                                         {"reserved_bytes", optional(m.out_of_memory->reserved_bytes)},
                                                         {"phase", m.out_of_memory->phase},
                                                         {"micro_batch", m.out_of_memory->micro_batch ? nlohmann::json(*m.out_of_memory->micro_batch) : nlohmann::json(nullptr)},
                                                         {"step", m.out_of_memory->step ? nlohmann::json(*m.out_of_memory->step) : nlohmann::json(nullptr)}}
                                        : nlohmann::json(nullptr)},
      {"environment", m.environment},
      {"rows", rows},
      {"largest_deviation", largest},
      {"pipeline", c.measured.trace && c.measured.trace->stages > 1
                       ? nlohmann::json{{"schedule", c.measured.trace->schedule},
                                        {"stages", c.measured.trace->stages},
                                        {"virtual_stages", c.measured.trace->virtual_stages},
                                        {"micro_batches", c.measured.trace->micro_batches},
                                        {"bubble_fraction_measured", c.measured.trace->bubble_fraction},
                                        {"bubble_fraction_predicted", optional(c.measured.trace->predicted_bubble_fraction)},
                                        {"in_flight_measured", c.measured.trace->peak_in_flight},
                                        {"in_flight_predicted", c.measured.trace->predicted_in_flight}}
                       : nlohmann::json(nullptr)},
      {"moe", c.measured.moe ? nlohmann::json{{"experts", c.measured.moe->experts},
                                              {"top_k", c.measured.moe->top_k},
                                              {"capacity_factor", c.measured.moe->capacity_factor},
                                              {"assignments_per_step", c.measured.moe->assignments_per_step},
                                              {"tokens_dropped_per_step", c.measured.moe->tokens_dropped_per_step},
                                              {"dropped_fraction", c.measured.moe->dropped_fraction},
                                              {"load_imbalance", optional(c.measured.moe->load_imbalance)},
                                              {"aux_loss", optional(c.measured.moe->aux_loss)}}
                             : nlohmann::json(nullptr)},
  };
}

std::string render_comparison(const Comparison& c, Format format) {
  if (format == Format::kJson) return comparison_to_json(c).dump(2) + "\n";
  if (format == Format::kHtml) return markdown_to_html(render_comparison(c, Format::kMarkdown), "trainplan: predicted against measured");
  const bool markdown = format == Format::kMarkdown;
  std::ostringstream out;
  out << header(c, markdown);
  if (c.out_of_memory) out << (markdown ? "**Out of memory:** " : "Out of memory: ") << *c.out_of_memory << "\n\n";
  if (c.measured.diverged_at_step) {
    out << (markdown ? "**Diverged:** " : "Diverged: ") << "the " << (c.measured.diverged_quantity == "loss" ? "loss" : "gradient norm")
        << " at step " << *c.measured.diverged_at_step
        << " was not finite and the run stopped there; the timings are those of the steps it ran.\n\n";
  }
  for (Section section : kSections) {
    const std::string table = section_table(c, section, markdown);
    if (!table.empty()) out << table << "\n";
  }
  if (c.measured.trace && c.measured.trace->stages > 1) out << pipeline_table(*c.measured.trace, markdown) << "\n";
  if (c.measured.moe) out << moe_table(*c.measured.moe, markdown) << "\n";
  out << closing_line(c) << "\n";
  return out.str();
}

}  // namespace trainplan::planner
