#pragma once
// The training loop's parts, which trainer.cpp runs: checking a run's inputs (trainer_inputs.cpp);
// the per-step records, the measurement document, the export of the trained weights and the
// out-of-memory report (trainer_records.cpp).

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "comm.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "moe.hpp"
#include "parallel_dims.hpp"
#include "phase_timer.hpp"
#include "pipeline.hpp"
#include "world.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/statistics.hpp"
#include "trainplan/executor/executor.hpp"

namespace trainplan::executor::trainer_parts {

namespace cm = trainplan::costmodel;
namespace fs = std::filesystem;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Why `dir` does not take a new entry, or "" when it does: a probe folder is made in it and
// removed at once (permission bits alone do not tell, e.g. for root or under /proc).
[[nodiscard]] std::string refuses_new_entries(const fs::path& dir);

// --inject-oom "PHASE[:MICRO_BATCH[:STEP]]".
[[nodiscard]] std::optional<OomInjection> parse_injection(const std::string& text);

// Every option in its range, before anything runs.
void check_options(const RunOptions& o);

// What this build of the executor runs (capabilities.hpp executor_limitations); everything else in a
// plan is refused with the reasons.
void check_supported(const cm::Plan& plan);

[[nodiscard]] cm::Plan load_plan(const std::string& path);

[[nodiscard]] at::ScalarType torch_dtype(cm::Precision p);

// A parameter count for the start-up line, to 3 significant digits: "1.24 billion", "6.4 million".
[[nodiscard]] std::string parameter_count_text(double n);

[[nodiscard]] double lr_at(const RunOptions& o, int64_t step);

using SentBytes = std::array<double, 5>;

struct StepRecord {
  int64_t step = 0;
  double loss = 0, seconds = 0, tokens_per_second = 0, grad_norm = 0, lr = 0;
  // This rank's phase times (phase_timer.hpp), each exclusive of the others.
  double forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0, dp_wait_seconds = 0;
  double peak_memory_bytes = 0, mfu = 0;
  bool skipped = false;
  SentBytes bytes_sent{};  // this rank's step, by group: tp, cp, pp, dp, ep (kSentGroups)
};

constexpr const char* kSentGroups[] = {"tp", "cp", "pp", "dp", "ep"};

constexpr std::size_t kSentEp = 4;  // kSentGroups[kSentEp] == "ep"

// What the MoE layers did in one step, over every rank (collective; the tally is reset).
struct MoeStep {
  double assignments = 0, dropped = 0, aux_loss = 0;  // aux: mean over layer passes of experts x sum f P
  std::vector<double> kept_per_expert;                 // assignments each expert took
};

// One rank's memory, for picking the fullest rank (the estimate reports the worst stage).
struct RankMemory {
  StateBytes states;
  double peak_bytes = 0, reserved_bytes = 0;
  [[nodiscard]] double total() const { return peak_bytes > 0 ? peak_bytes : states.weights + states.gradients + states.optimizer; }
};

using costmodel::median;  // costmodel/statistics.hpp

[[nodiscard]] std::string gib(double bytes);

[[nodiscard]] SentBytes bytes_sent_so_far(const ProcessGroups& g);

[[nodiscard]] MoeStep take_moe_step(Communicator& comm, MoeTally& tally, int experts);

// The measurement's `moe` object: tokens routed and dropped per step (every layer, micro-batch
// and rank; the last step and the run's total) and the mean load-balancing loss.
[[nodiscard]] nlohmann::json moe_json(const cm::MoeSpec& moe, const std::vector<MoeStep>& steps);

// The pipeline bubble of one step (collective): per rank, the time within the step's compute
// span (first pass start to last pass end over all ranks) it does not compute, over the time it
// computes (costmodel/schedule.hpp); the mean over ranks.
[[nodiscard]] double step_bubble(Communicator& comm, const std::vector<TraceRecord>& events);

[[nodiscard]] nlohmann::json measurement_json(const cm::Plan& plan, const World& w, const RankMemory& fullest,
                                const std::vector<StepRecord>& steps, const std::vector<double>& losses,
                                const std::string& command_line, const std::string& data, const nlohmann::json& trace,
                                const std::string& kernels, const nlohmann::json& communication);

// Writes `j` to `path` through a temporary file. `overwrite` false: an existing `path` is kept
// (link(2) refuses to replace it) and false is returned.
bool write_json_atomically(const std::string& path, const nlohmann::json& j, bool overwrite = true);

// The trained weights written to o.export_dir (checkpoint.hpp export_safetensors): each piece of a
// parameter from the first data-parallel replica's TP rank holding it, on the stage that holds its
// unit; an expert's from the first replica of the ep rank holding it. Collective.
void export_trained(const RunOptions& o, const cm::Plan& plan, const ModelSharding& sharding, const RankCoords& at,
                    const ParallelDims& dims, const std::vector<int>& chunk_layers, bool lora, DataParallelEngine& engine,
                    Communicator& comm, int64_t step, bool talk);

// This rank's report of running out of memory (`message`, out_of_memory.hpp): the line, the next
// plan beside the measurement, and the measurement with status out_of_memory. No collective.
void report_out_of_memory(const std::string& message, const PhaseTimer& phases, int rank, const World& w, const cm::Plan& plan,
                          const RunOptions& o, DataParallelEngine& engine, const std::vector<StepRecord>& records,
                          const std::vector<double>& losses, const std::string& command_line, const std::string& data);

}  // namespace trainplan::executor::trainer_parts
