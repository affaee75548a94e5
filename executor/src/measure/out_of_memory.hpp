#pragma once
// Out of memory as an answer: recognising the allocator's failure, the `out_of_memory` object of
// the measurement document, the one line a rank prints, and the next plan the cost model suggests.

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

// The allocator's message (without LibTorch's stack trace) when `e` is an allocation failure:
// c10::OutOfMemoryError (the CUDA caching allocator, and the CPU allocator when malloc returns
// null), or the c10::Error the CPU allocator raises when posix_memalign fails
// ("DefaultCPUAllocator: can't allocate memory"); nullopt for anything else.
[[nodiscard]] std::optional<std::string> out_of_memory_message(const std::exception& e);

// The bytes the failed request asked for, from the allocator's message: "you tried to allocate
// N bytes" (CPU, exact) or "Tried to allocate 15.66 GiB" (CUDA, to the message's two decimals);
// nullopt when the message says neither.
[[nodiscard]] std::optional<double> requested_bytes(const std::string& message);

struct OutOfMemory {
  std::string phase;                       // phase_name() of the phase running at the failure
  int micro_batch = -1;                    // -1: the phase belongs to no micro-batch (optimizer)
  int64_t step = 0;                        // the step that failed, from 1
  int rank = 0;
  std::optional<double> requested_bytes;
  std::optional<double> allocated_bytes;   // CUDA: the caching allocator's peak allocated bytes of the failed step
  std::optional<double> reserved_bytes;    // CUDA: its peak reserved bytes
  std::optional<double> process_peak_resident_bytes;  // CPU: the process's peak resident set (getrusage)
  std::string message;                     // the allocator's message
};

// This process's peak resident set size (getrusage ru_maxrss), bytes; nullopt when unreadable.
[[nodiscard]] std::optional<double> process_peak_resident_bytes();

// The next plan to try, by the cost model: the plan with half the micro-batch, else selective
// recompute, else full recompute, the first the cost model says fits. `what` is what changed
// ("micro_batch 8"), `required_bytes` its estimated memory per GPU, `command` a planner command
// line that evaluates it (every parallel axis fixed); nullopt when none of them fits (or none applies).
struct NextPlan {
  std::string what;
  double required_bytes = 0;
  std::string command;
  costmodel::Plan plan;    // the whole next plan (written beside the measurement, see next_plan_path)
  std::string plan_path;   // where it was written; empty when it was not
};

// Where the next plan is written beside a measurement: "run.measurement.json" ->
// "run.next-plan.json", "run.json" -> "run.next-plan.json".
[[nodiscard]] std::string next_plan_path(const std::string& measurement_path);
[[nodiscard]] std::optional<NextPlan> next_plan_after_out_of_memory(const costmodel::Plan& plan);

// {requested_bytes, allocated_bytes, reserved_bytes, process_peak_resident_bytes, phase,
//  micro_batch (null when -1), step, rank, message}; absent figures are null.
[[nodiscard]] nlohmann::json out_of_memory_json(const OutOfMemory& oom, const std::optional<NextPlan>& next);

// "executor: out of memory in backward of micro-batch 3 of step 1 asking for 15.66 GiB
// (allocated 60.10 GiB, reserved 69.40 GiB); next plan to try: micro_batch 8 (the cost model
// estimates 52.00 GiB required) — planner ... --fix mb=8". One line. Micro-batches count from 0.
[[nodiscard]] std::string out_of_memory_line(const OutOfMemory& oom, const std::optional<NextPlan>& next);

}  // namespace trainplan::executor
