#include "trainplan/planner/measurement.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;

const char* section_name(Section section) {
  switch (section) {
    case Section::kMemory: return "memory";
    case Section::kTime: return "time";
    case Section::kThroughput: return "throughput";
    case Section::kCommunication: return "communication";
  }
  return "?";
}

const std::vector<std::string>& section_keys(Section section) {
  static const std::vector<std::string> kMemory = {
      "weights_bytes", "gradients_bytes", "gradients_step_end_bytes", "autocast_copies_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
      "overhead_bytes", "total_bytes", "reserved_bytes", "required_bytes", "cpu_offload_per_node_bytes", "cpu_offload_per_gpu_bytes"};
  static const std::vector<std::string> kTime = {
      "step_seconds", "compute_seconds", "recompute_seconds", "tp_comm_seconds", "tp_copy_seconds", "autocast_cast_seconds", "cp_comm_seconds",
      "ep_comm_seconds", "pp_comm_seconds", "dp_comm_exposed_seconds", "dp_comm_total_seconds", "dp_copy_seconds", "host_wait_seconds", "sustained_clock_seconds", "straggler_seconds", "sustained_step_seconds", "bubble_seconds",
      "optimizer_seconds", "offload_seconds"};
  static const std::vector<std::string> kThroughput = {
      "tokens_per_second", "tokens_per_second_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"};
  static const std::vector<std::string> kCommunication = {"cp_bytes_sent_per_step", "ep_bytes_sent_per_step"};
  switch (section) {
    case Section::kMemory: return kMemory;
    case Section::kTime: return kTime;
    case Section::kThroughput: return kThroughput;
    case Section::kCommunication: return kCommunication;
  }
  return kThroughput;
}

ParallelLayout ParallelLayout::of(const costmodel::ParallelConfig& p) {
  return ParallelLayout{p.tp, p.pp, p.dp, p.cp, p.ep, p.zero_stage};
}

std::string ParallelLayout::text() const {
  std::string s = "tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " dp" + std::to_string(dp);
  if (cp > 1) s += " cp" + std::to_string(cp);
  if (ep > 1) s += " ep" + std::to_string(ep);
  return s + " zero" + std::to_string(zero_stage);
}

const std::map<std::string, double>& PerformanceDocument::quantities(Section section) const {
  switch (section) {
    case Section::kMemory: return memory;
    case Section::kTime: return time;
    case Section::kThroughput: return throughput;
    case Section::kCommunication: return communication;
  }
  return throughput;
}

std::map<std::string, double>& PerformanceDocument::quantities(Section section) {
  return const_cast<std::map<std::string, double>&>(static_cast<const PerformanceDocument&>(*this).quantities(section));
}

namespace {

// Thrown inside the reader, turned into a Result at the public boundary.
class DocumentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string number_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

// Lenient reads of one JSON object: absent or null keys are absent, unknown keys are ignored,
// present keys must have the right type.
class LenientReader {
 public:
  LenientReader(const nlohmann::json& json, const std::string& file, std::string pointer)
      : json_(json), file_(file), pointer_(std::move(pointer)) {
    if (!json_.is_object()) fail_at(pointer_.empty() ? "/" : pointer_, "must be a JSON object");
  }

  [[noreturn]] void fail_at(const std::string& pointer, const std::string& rule) const {
    throw DocumentError(file_ + ": " + pointer + ": " + rule);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& rule) const { fail_at(pointer(key), rule); }
  [[nodiscard]] std::string pointer(const std::string& key) const { return pointer_ + "/" + key; }
  [[nodiscard]] const std::string& file() const { return file_; }

  [[nodiscard]] const nlohmann::json* find(const std::string& key) const {
    const auto it = json_.find(key);
    return it == json_.end() || it->is_null() ? nullptr : &*it;
  }

  [[nodiscard]] std::string string(const std::string& key) const {
    const auto* v = find(key);
    if (!v) return "";
    if (!v->is_string()) fail(key, "must be a string");
    return v->get<std::string>();
  }

  [[nodiscard]] std::optional<double> number(const std::string& key) const {
    const auto* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number() || v->get<double>() < 0) {
      fail(key, "must be a number >= 0" + (v->is_number() ? " (got " + number_text(v->get<double>()) + ")" : ""));
    }
    return v->get<double>();
  }

  [[nodiscard]] std::optional<int> integer(const std::string& key, int min, int max) const {
    const auto* v = find(key);
    if (!v) return std::nullopt;
    const double x = v->is_number() ? v->get<double>() : std::nan("");
    if (!(x >= min && x <= max) || std::floor(x) != x) {
      fail(key, "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]" +
                    (v->is_number() ? " (got " + v->dump() + ")" : ""));
    }
    return static_cast<int>(x);
  }

  [[nodiscard]] LenientReader object(const std::string& key) const {
    const auto* v = find(key);
    if (!v) fail(key, "is required (a JSON object)");
    return LenientReader(*v, file_, pointer(key));
  }

 private:
  const nlohmann::json& json_;
  const std::string& file_;
  std::string pointer_;
};

ParallelLayout read_layout(const LenientReader& r) {
  ParallelLayout l;
  l.tp = r.integer("tp", 1, 1 << 24).value_or(1);
  l.pp = r.integer("pp", 1, 1 << 24).value_or(1);
  l.dp = r.integer("dp", 1, 1 << 24).value_or(1);
  l.cp = r.integer("cp", 1, 1 << 24).value_or(1);
  l.ep = r.integer("ep", 1, 1 << 24).value_or(1);
  l.zero_stage = r.integer("zero_stage", 0, 3).value_or(0);
  return l;
}

MoeReport read_moe(const LenientReader& r) {
  MoeReport m;
  m.experts = static_cast<int>(r.integer("experts", 1, 1 << 24).value_or(0));
  m.top_k = static_cast<int>(r.integer("top_k", 1, 1 << 24).value_or(0));
  m.capacity_factor = r.number("capacity_factor").value_or(0);
  m.assignments_per_step = r.number("assignments_per_step").value_or(0);
  m.tokens_dropped_per_step = r.number("tokens_dropped_per_step").value_or(0);
  m.dropped_fraction = r.number("dropped_fraction").value_or(0);
  m.load_imbalance = r.number("load_imbalance");
  m.aux_loss = r.number("aux_loss");
  return m;
}

Trace read_trace(const LenientReader& r) {
  Trace t;
  t.step = r.integer("step", 0, 1 << 30).value_or(0);
  t.stages = r.integer("stages", 1, 1 << 24).value_or(1);
  t.virtual_stages = r.integer("virtual_stages", 1, 1 << 24).value_or(1);
  t.micro_batches = r.integer("micro_batches", 1, 1 << 30).value_or(1);
  t.schedule = r.string("schedule");
  t.bubble_fraction = r.number("bubble_fraction").value_or(0);
  t.predicted_bubble_fraction = r.number("predicted_bubble_fraction");
  for (const char* key : {"peak_in_flight", "predicted_in_flight"}) {
    const auto* list = r.find(key);
    if (!list) continue;
    if (!list->is_array()) r.fail(key, "must be an array of numbers >= 0 (one per stage)");
    auto& out = std::string(key) == "peak_in_flight" ? t.peak_in_flight : t.predicted_in_flight;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const auto& v = (*list)[i];
      if (!v.is_number() || v.get<double>() < 0) r.fail(std::string(key) + "/" + std::to_string(i), "must be a number >= 0");
      out.push_back(v.get<double>());
    }
  }
  const auto* events = r.find("events");
  if (!events) return t;
  if (!events->is_array()) r.fail("events", "must be an array of event objects");
  for (std::size_t i = 0; i < events->size(); ++i) {
    const LenientReader ev((*events)[i], r.file(), r.pointer("events/" + std::to_string(i)));
    TraceEvent x;
    x.rank = ev.integer("rank", 0, 1 << 24).value_or(0);
    x.stage = ev.integer("stage", 0, 1 << 24).value_or(0);
    x.kind = ev.string("kind");
    if (x.kind != "forward" && x.kind != "backward" && x.kind != "send" && x.kind != "recv" && x.kind != "dp_comm" && x.kind != "optimizer") {
      ev.fail("kind", "must be one of forward, backward, send, recv, dp_comm, optimizer (got \"" + x.kind + "\")");
    }
    x.micro_batch = ev.integer("micro_batch", 0, 1 << 30).value_or(-1);  // absent: the step's (dp_comm, optimizer)
    x.chunk = ev.integer("chunk", 0, 1 << 24).value_or(0);
    const auto start = ev.number("start");
    const auto end = ev.number("end");
    if (!start || !end) ev.fail(start ? "end" : "start", "is required (seconds from the step's start)");
    if (*end < *start) ev.fail("end", "must not be before start (" + number_text(*end) + " < " + number_text(*start) + ")");
    x.start = *start;
    x.end = *end;
    t.events.push_back(std::move(x));
  }
  return t;
}

OutOfMemoryReport read_out_of_memory(const LenientReader& r) {
  OutOfMemoryReport o;
  o.requested_bytes = r.number("requested_bytes");
  o.allocated_bytes = r.number("allocated_bytes");
  o.reserved_bytes = r.number("reserved_bytes");
  o.process_peak_resident_bytes = r.number("process_peak_resident_bytes");
  o.phase = r.string("phase");
  if (o.phase.empty()) r.fail("phase", "is required (forward, backward, data_parallel_wait, pipeline_receive, optimizer or step)");
  o.micro_batch = r.integer("micro_batch", 0, 1 << 30);
  o.step = r.integer("step", 0, 1 << 30);
  o.rank = r.integer("rank", 0, 1 << 24);
  return o;
}

PerformanceDocument read_document(const nlohmann::json& json, const std::string& file, const std::string& expected_schema) {
  const LenientReader r(json, file, "");
  PerformanceDocument d;
  d.file = file;
  if (!r.find("schema")) r.fail("schema", "is required (\"" + expected_schema + "\")");
  d.schema = r.string("schema");
  if (d.schema != expected_schema) r.fail("schema", "must be \"" + expected_schema + "\" (got \"" + d.schema + "\")");
  d.name = r.string("name");
  d.model = r.string("model");
  d.cluster = r.string("cluster");
  d.device = r.string("device");
  const auto gpus = r.integer("gpus", 1, 1 << 24);
  d.world_size = r.integer("world_size", 1, 1 << 24).value_or(gpus.value_or(0));
  if (r.find("parallel")) {
    d.layout = read_layout(r.object("parallel"));
    // The layout covers the GPUs (expert parallelism splits the data-parallel ranks, not more).
    const long long ranks = static_cast<long long>(d.layout->tp) * d.layout->pp * d.layout->dp * d.layout->cp;
    if (d.world_size > 0 && ranks != d.world_size) {
      r.fail("parallel", "tp x pp x dp x cp = " + std::to_string(ranks) + " ranks, but the run had " + std::to_string(d.world_size) + " GPUs");
    }
  }
  if (r.find("training")) {
    const LenientReader t = r.object("training");
    d.stack = t.string("stack");
    if (const std::string allocator = t.string("allocator"); !allocator.empty()) d.allocator = allocator;
  }
  if (expected_schema == kMeasurementSchema) d.stack = measured_stack(json);
  if (expected_schema == kMeasurementSchema && r.find("status")) {
    d.status = r.string("status");
    if (d.status != "ok" && d.status != "out_of_memory" && d.status != "diverged") {
      r.fail("status", "must be \"ok\", \"out_of_memory\" or \"diverged\" (got \"" + d.status + "\")");
    }
  }
  if (d.status == "out_of_memory") d.out_of_memory = read_out_of_memory(r.object("out_of_memory"));
  if (d.status == "diverged") {
    d.diverged_at_step = r.object("diverged").integer("step", 1, 1 << 30);
    if (!d.diverged_at_step) r.object("diverged").fail("step", "is required (the step whose loss was not finite)");
    d.diverged_quantity = r.object("diverged").string("quantity");
    if (d.diverged_quantity != "loss" && d.diverged_quantity != "grad_norm") {
      r.object("diverged").fail("quantity", "must be \"loss\" or \"grad_norm\" (got \"" + d.diverged_quantity + "\")");
    }
  }
  if (expected_schema == kEstimateSchema && r.find("fits")) {
    if (!r.find("fits")->is_boolean()) r.fail("fits", "must be true or false");
    d.fits = r.find("fits")->get<bool>();
  }
  if (const auto* environment = r.find("environment")) {
    if (!environment->is_object()) r.fail("environment", "must be a JSON object");
    for (const auto& [key, value] : environment->items()) {
      if (value.is_null()) continue;
      if (!value.is_string() && !value.is_number() && !value.is_boolean()) {
        r.fail("environment/" + key, "must be a string, a number or true/false");
      }
      d.environment[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }
  for (Section section : kSections) {
    // A run that ran out of memory may have timed nothing.
    if (d.status == "out_of_memory" && section != Section::kMemory && !r.find(section_name(section))) continue;
    if (section == Section::kCommunication && !r.find(section_name(section))) continue;  // optional (older documents)
    const LenientReader s = r.object(section_name(section));
    for (const std::string& key : section_keys(section)) {
      const auto x = s.number(key);
      if (!x) continue;
      // Beyond these a measurement is broken, not a run: an exabyte, four months a step, more
      // than ten times a device's peak (MFU and HFU are fractions).
      const double ceiling = section == Section::kMemory ? 1e18
                             : section == Section::kTime ? 1e7
                             : section == Section::kCommunication ? 1e21
                             : key == "mfu" || key == "hfu" ? 10.0
                             : key.find("tflops") != std::string::npos ? 1e9 : 1e15;
      // Measurements only: an estimate is the cost model's own (a plan of years a step is its answer).
      if (expected_schema == kMeasurementSchema && *x > ceiling) {
        s.fail(key, "is not a plausible value (got " + number_text(*x) + ", at most " + number_text(ceiling) + ")");
      }
      if (key == "step_seconds" && expected_schema == kMeasurementSchema && *x <= 0) s.fail(key, "must be > 0 seconds (got " + number_text(*x) + ")");
      d.quantities(section)[key] = *x;
    }
  }
  if (const auto* losses = r.find("losses")) {
    if (!losses->is_array()) r.fail("losses", "must be an array of numbers");
    for (std::size_t i = 0; i < losses->size(); ++i) {
      const auto& v = (*losses)[i];
      if (!v.is_number() && !v.is_null()) r.fail("losses/" + std::to_string(i), "must be a number (or null for NaN)");
      d.losses.push_back(v.is_null() ? std::nan("") : v.get<double>());  // JSON writers turn NaN into null
    }
  }
  if (r.find("trace")) {
    d.trace = read_trace(r.object("trace"));
    // Every event on a rank, a stage and a model chunk the run had.
    for (std::size_t i = 0; i < d.trace->events.size(); ++i) {
      const TraceEvent& e = d.trace->events[i];
      const std::string at = "trace/events/" + std::to_string(i) + "/";
      if (d.world_size > 0 && e.rank >= d.world_size) r.fail(at + "rank", "must be below the " + std::to_string(d.world_size) + " ranks of the run (got " + std::to_string(e.rank) + ")");
      if (e.stage >= d.trace->stages) r.fail(at + "stage", "must be below the trace's " + std::to_string(d.trace->stages) + " stages (got " + std::to_string(e.stage) + ")");
      if (e.chunk >= d.trace->virtual_stages) {
        r.fail(at + "chunk", "must be below the trace's " + std::to_string(d.trace->virtual_stages) + " virtual stages (got " + std::to_string(e.chunk) + ")");
      }
    }
  }
  if (r.find("moe")) d.moe = read_moe(r.object("moe"));
  return d;
}

Result<nlohmann::json> load_json_file(const std::string& path) {
  auto text = costmodel::read_text_file(path);
  if (!text) return text.error();
  return costmodel::parse_json_text(*text, path);
}

}  // namespace

Result<PerformanceDocument> read_performance_document(const nlohmann::json& json, const std::string& file,
                                                      const std::string& expected_schema) {
  try {
    return read_document(json, file, expected_schema);
  } catch (const DocumentError& e) {
    return Error{e.what()};
  }
}

Result<PerformanceDocument> load_measurement_file(const std::string& path) {
  auto json = load_json_file(path);
  if (!json) return json.error();
  return read_performance_document(*json, path, kMeasurementSchema);
}

std::string default_measurement_file(const std::string& plan_path) {
  return std::filesystem::path(plan_path).stem().string() + ".measurement.json";
}

PerformanceDocument predict(const costmodel::Plan& plan, const std::string& file) {
  const nlohmann::json estimate = costmodel::estimate_to_json(plan, costmodel::estimate(plan));
  auto document = read_performance_document(estimate, file, kEstimateSchema);
  return std::move(document).value();  // the cost model's own output always reads back
}

nlohmann::json chrome_trace(const Trace& trace) {
  nlohmann::json events = nlohmann::json::array();
  std::map<int, int> stage_of_rank;
  for (const TraceEvent& e : trace.events) stage_of_rank.emplace(e.rank, e.stage);
  for (const auto& [rank, stage] : stage_of_rank) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank) + ", stage " + std::to_string(stage)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  }
  for (const TraceEvent& e : trace.events) {
    std::string name = e.kind == "forward" ? "F" : e.kind == "backward" ? "B" : e.kind + (e.micro_batch >= 0 ? " " : "");
    if (e.micro_batch >= 0) name += std::to_string(e.micro_batch);
    if (trace.virtual_stages > 1 && e.micro_batch >= 0) name += ".c" + std::to_string(e.chunk);
    events.push_back({{"ph", "X"}, {"name", name}, {"cat", e.kind}, {"pid", e.rank}, {"tid", 0},
                      {"ts", e.start * 1e6}, {"dur", std::max(0.0, e.end - e.start) * 1e6},
                      {"args", {{"micro_batch", e.micro_batch}, {"chunk", e.chunk}, {"stage", e.stage}}}});
  }
  nlohmann::json other = {{"step", trace.step}, {"schedule", trace.schedule}, {"stages", trace.stages},
                          {"virtual_stages", trace.virtual_stages}, {"micro_batches", trace.micro_batches},
                          {"bubble_fraction", trace.bubble_fraction}};
  if (trace.predicted_bubble_fraction) other["predicted_bubble_fraction"] = *trace.predicted_bubble_fraction;
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

Result<PerformanceDocument> load_prediction_file(const std::string& path) {
  auto json = load_json_file(path);
  if (!json) return json.error();
  if (!json->is_object()) return Error{path + ": /: must be a JSON object"};
  const auto schema = json->find("schema");
  if (schema != json->end() && *schema == "trainplan/plan/v1") {
    auto request = costmodel::parse_plan(*json, path);
    if (!request) return request.error();
    auto plan = fixed_plan(*request, path);
    if (!plan) return plan.error();
    return predict(*plan, path);
  }
  if (schema != json->end() && *schema == kEstimateSchema) return read_performance_document(*json, path, kEstimateSchema);
  const std::string got = schema == json->end() ? "none" : schema->dump();
  return Error{path + ": /schema: must be \"" + std::string(kEstimateSchema) + "\" or \"trainplan/plan/v1\" (got " + got + ")"};
}

std::string measured_stack(const nlohmann::json& measurement) {
  const auto text_at = [&](const char* section, const char* key) -> std::string {
    const auto s = measurement.find(section);
    if (s == measurement.end() || !s->is_object()) return "";
    const auto v = s->find(key);
    return v != s->end() && v->is_string() ? v->get<std::string>() : "";
  };
  const std::string stack = text_at("training", "stack");
  const char* reference = costmodel::stack_name(costmodel::Stack::kTrainplanReference);
  // Written before the executor named its stack, hence before its fused paths: the plain path.
  if (stack.empty()) return reference;
  // Named "trainplan" before --kernels reference ran under its own name.
  if (stack == costmodel::stack_name(costmodel::Stack::kTrainplan) && text_at("environment", "kernels") == "reference") return reference;
  return stack;
}

std::string measurement_plan_error(const std::string& message, const nlohmann::json& measurement, const std::string& file) {
  std::string out = message;
  for (const char* key : {"model", "cluster"}) {
    const auto document = measurement.find(std::string(key) + "_document");
    if (document == measurement.end() || !document->is_object()) continue;
    const std::string from = file + ": /" + key, to = file + ": /" + key + "_document";
    if (out.rfind(from + "/", 0) == 0 || out == from || out.rfind(from + ":", 0) == 0) out = to + out.substr(from.size());
  }
  return out;
}

nlohmann::json measurement_plan_document(const nlohmann::json& measurement, const std::string& file) {
  nlohmann::json plan = {{"schema", "trainplan/plan/v1"}};
  const std::string stem = std::filesystem::path(file).stem().string();
  const auto name = measurement.find("name");
  plan["name"] = name != measurement.end() && name->is_string() ? name->get<std::string>() : stem;
  for (const char* key : {"model", "cluster", "gpus", "training", "parallel"}) {
    const auto it = measurement.find(key);
    if (it != measurement.end() && !it->is_null()) plan[key] = *it;
  }
  // A model or cluster that is no preset travels as a document beside its name.
  for (const char* key : {"model", "cluster"}) {
    const auto document = measurement.find(std::string(key) + "_document");
    if (document != measurement.end() && document->is_object()) plan[key] = *document;
  }
  const auto world_size = measurement.find("world_size");
  if (!plan.contains("gpus") && world_size != measurement.end()) plan["gpus"] = *world_size;
  if (plan.contains("training") && plan["training"].is_object()) plan["training"]["stack"] = measured_stack(measurement);
  return plan;
}

}  // namespace trainplan::planner
