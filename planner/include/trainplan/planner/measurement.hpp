#pragma once
// Performance documents: the header and the quantities of a `trainplan/estimate/v1` (predicted)
// or `trainplan/measurement/v1` (measured by the executor) document. The two share one shape;
// a measurement holds only the keys it measured. Both are read leniently: unknown keys are
// ignored, but `schema` and the `memory`, `time` and `throughput` objects are required (a
// measurement whose `status` is "out_of_memory" needs only `memory` and its `out_of_memory`
// object) and every known quantity must be a number >= 0. Errors name the file and the JSON pointer
// ("m.json: /memory/weights_bytes: must be a number >= 0 (got -1)").

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

inline constexpr const char* kEstimateSchema = "trainplan/estimate/v1";
inline constexpr const char* kMeasurementSchema = "trainplan/measurement/v1";

// kCommunication (bytes sent per step) is optional in both documents: older ones lack it.
enum class Section { kMemory, kTime, kThroughput, kCommunication };
inline constexpr Section kSections[] = {Section::kMemory, Section::kTime, Section::kThroughput, Section::kCommunication};

// The document key of a section: "memory", "time", "throughput".
[[nodiscard]] const char* section_name(Section section);

// The quantities of a section that are compared, in the order reports list them: the estimate's
// `*_bytes` (bar `capacity_bytes`, a hardware figure), `*_seconds` and throughput keys.
[[nodiscard]] const std::vector<std::string>& section_keys(Section section);

// The parallel layout as reports show it.
struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, zero_stage = 0;

  [[nodiscard]] static ParallelLayout of(const costmodel::ParallelConfig& parallel);
  // "tp1 pp1 dp4 zero2"; cp and ep only when > 1.
  [[nodiscard]] std::string text() const;
  friend bool operator==(const ParallelLayout& a, const ParallelLayout& b) {
    return a.tp == b.tp && a.pp == b.pp && a.dp == b.dp && a.cp == b.cp && a.ep == b.ep && a.zero_stage == b.zero_stage;
  }
  friend bool operator!=(const ParallelLayout& a, const ParallelLayout& b) { return !(a == b); }
};

// One event of the executor's timeline (`trace.events[]` of a measurement document).
struct TraceEvent {
  int rank = 0;          // global rank
  int stage = 0;         // pipeline stage of that rank
  std::string kind;      // "forward", "backward", "send", "recv", "dp_comm", "optimizer"
  int micro_batch = -1;  // -1 when the event belongs to no micro-batch (dp_comm, optimizer)
  int chunk = 0;         // model chunk (virtual stage) on that rank
  double start = 0;      // seconds from the traced step's start (rank 0's clock after a barrier)
  double end = 0;
};

// The `trace` section: what each rank did during one step, and the bubble it shows.
struct Trace {
  int step = 0;               // which step was traced (0-based)
  int stages = 1, virtual_stages = 1, micro_batches = 1;
  std::string schedule;       // "gpipe", "1f1b", "interleaved"
  double bubble_fraction = 0; // measured: mean over ranks of idle / busy (costmodel/schedule.hpp), median over steps
  std::optional<double> predicted_bubble_fraction;  // the cost model's simulation of the same plan
  std::vector<double> peak_in_flight;       // measured, per stage: micro-batches of activations held at once
  std::vector<double> predicted_in_flight;  // the cost model's count for the schedule
  std::vector<TraceEvent> events;
};

// The `out_of_memory` object of a measurement whose run ran out of memory (the executor's
// out_of_memory.hpp): what the failed request asked for, the allocator's figures, and where.
struct OutOfMemoryReport {
  std::optional<double> requested_bytes;
  std::optional<double> allocated_bytes;              // CUDA caching allocator, peak of the failed step
  std::optional<double> reserved_bytes;               // CUDA caching allocator, peak of the failed step
  std::optional<double> process_peak_resident_bytes;  // CPU runs: the process's peak resident set
  std::string phase;                                  // "forward", "backward", "optimizer", ...
  std::optional<int> micro_batch;                     // from 0; absent for phases outside micro-batches
  std::optional<int> step;                            // from 1
  std::optional<int> rank;
};

// A measurement's `moe` object (executor/src/train/trainer.cpp moe_json): what the experts did in the
// run's last step, over every rank and layer.
struct MoeReport {
  int experts = 0, top_k = 0;
  double capacity_factor = 0;               // 0: dropless
  double assignments_per_step = 0;          // token copies routed (tokens x top_k x MoE layers)
  double tokens_dropped_per_step = 0;       // of them, dropped by capacity
  double dropped_fraction = 0;              // over the whole run
  std::optional<double> load_imbalance;     // busiest expert over the mean (1: balanced)
  std::optional<double> aux_loss;           // experts x sum f P (1: balanced)
};

struct PerformanceDocument {
  std::string file;    // where it was read (for messages); may be empty for one made in memory
  std::string schema;  // kEstimateSchema or kMeasurementSchema
  std::string name;    // the plan's name; empty when the document has none
  std::string model;
  std::string cluster;
  std::string device;  // measurements: "cpu" or the GPU name; empty for estimates
  // `training.stack`; a measurement without one (older executors) ran the executor's own stack.
  std::string stack;
  // `training.allocator` (plan.hpp Allocator's names); "caching" where absent, PyTorch's default.
  std::string allocator = "caching";
  int world_size = 0;  // `world_size`, else `gpus`; 0 when the document has neither
  std::optional<ParallelLayout> layout;  // from `parallel`, when present
  // Quantities by key, only those the document has, in the document's units (bytes, seconds,
  // tokens/s, TFLOP/s, fractions).
  std::map<std::string, double> memory, time, throughput, communication;
  std::vector<double> losses;  // per step, from `losses`, when present; null (a diverged step) reads as NaN
  std::optional<Trace> trace;  // measurements with a `trace` section (pipeline runs)
  std::optional<MoeReport> moe;  // measurements of mixture-of-experts models
  // Measurements: "ok" (also when absent: older executors), "out_of_memory" or "diverged" (the
  // loss or gradient norm, `diverged_quantity` "loss" or "grad_norm", was not finite at
  // `diverged_at_step`, where the run stopped; its timings stand).
  std::string status = "ok";
  std::optional<OutOfMemoryReport> out_of_memory;  // when status is "out_of_memory"
  std::optional<long long> diverged_at_step;       // when status is "diverged"
  std::string diverged_quantity;
  // Measurements: the `environment` object (libtorch_version, cuda_version, nccl_version,
  // gpu_name, clocks, executor_commit), values as text (numbers as JSON writes them); null
  // values left out. Empty for older documents.
  std::map<std::string, std::string> environment;
  std::optional<bool> fits;  // estimates: the cost model's `fits`

  [[nodiscard]] const std::map<std::string, double>& quantities(Section section) const;
  [[nodiscard]] std::map<std::string, double>& quantities(Section section);
};

// Reads parsed JSON whose `schema` must be `expected_schema`; `file` names it in errors.
[[nodiscard]] costmodel::Result<PerformanceDocument> read_performance_document(const nlohmann::json& json, const std::string& file,
                                                                               const std::string& expected_schema);

// Reads a `trainplan/measurement/v1` file. Missing file, malformed JSON (with line and column),
// wrong schema and bad quantities are errors naming `path`.
[[nodiscard]] costmodel::Result<PerformanceDocument> load_measurement_file(const std::string& path);

// Reads what to compare a measurement with: a `trainplan/estimate/v1` file (as `planner evaluate
// --format json` writes it), or a fixed `trainplan/plan/v1` file, which is estimated now.
[[nodiscard]] costmodel::Result<PerformanceDocument> load_prediction_file(const std::string& path);

// Where a run of the plan at `plan_path` writes its measurement by default: "<plan stem>.measurement.json"
// in the current directory ("runs/llama.json" -> "llama.measurement.json").
[[nodiscard]] std::string default_measurement_file(const std::string& plan_path);

// The trace as Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one process per rank
// named "rank R, stage S", one complete ("X") event per recorded event named F3 / B3 / recv 3 (with
// ".c" and the chunk under interleaving), times in microseconds, and the schedule, step and bubbles
// under `otherData`.
[[nodiscard]] nlohmann::json chrome_trace(const Trace& trace);

// The `trainplan/plan/v1` document of a measurement's header: its model, cluster, GPU count
// (`gpus`, else `world_size`), training and parallel settings, as they are (a `kernels` key in
// `training` included); a model or cluster that is no preset comes from its `*_document`. Named
// by the measurement's `name`, else by the stem of `file`. The plan is not checked here. Its
// `training.stack` is measured_stack()'s.
[[nodiscard]] nlohmann::json measurement_plan_document(const nlohmann::json& measurement, const std::string& file);

// `message`, an error about measurement_plan_document()'s plan, with the pointers that came from
// a `*_document` moved there ("m.json: /model/layers" -> "m.json: /model_document/layers").
[[nodiscard]] std::string measurement_plan_error(const std::string& message, const nlohmann::json& measurement, const std::string& file);

// The stack a measurement ran: its `training.stack`; "trainplan-reference" where it names none
// (the executor wrote it before it named its stack, which was before its fused paths) or where
// it says "trainplan" with `environment.kernels` "reference" (written before that path had a
// name of its own).
[[nodiscard]] std::string measured_stack(const nlohmann::json& measurement);

// The cost model's estimate of a plan as a performance document. REQUIRES: validate_plan(plan) is ok.
[[nodiscard]] PerformanceDocument predict(const costmodel::Plan& plan, const std::string& file);

}  // namespace trainplan::planner
