#pragma once
// Helpers for executor tests: plan files for tiny models, running the executor (directly or
// under mpirun), and reading its measurement documents and safetensors exports.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/estimate.hpp"

namespace trainplan::testing {

struct PlanSpec {
  std::string model = "tiny-llama";
  int ranks = 1;
  int zero_stage = 0;
  int shard_group = 0;
  int micro_batch = 8;
  int global_batch = 8;
  int seq_len = 32;
  std::string recompute = "none";
  int recompute_layers = 0;  // with recompute "full": the blocks of each pipeline stage recomputed (0 = all)
  std::string precision = "fp32";
  int tp = 1;
  int pp = 1;
  int cp = 1;
  int ep = 1;  // carved out of dp (`ranks`)
  int virtual_stages = 1;
  std::string schedule = "1f1b";
  bool sequence_parallel = false;
  int layers = 0;  // > 0: an inline copy of `model` (tiny-llama or tiny-gpt) with this many layers
  nlohmann::json model_patch = nlohmann::json::object();  // more changes to that inline copy
  nlohmann::json training_patch = nlohmann::json::object();  // changes to the plan's training section (mode, lora)
};

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// A new directory under the system temp dir, unique per call (nothing is removed).
std::string scratch_dir(const std::string& name);
// Writes a trainplan/plan/v1 document for `spec` into `dir`; returns its path.
std::string write_plan(const std::string& dir, const std::string& name, const PlanSpec& spec);
// The cost model's estimate of the plan file at `path`, defaults filled in as the planner does.
// Throws std::runtime_error naming the problem when the plan does not load.
costmodel::Estimate estimate_plan_file(const std::string& path);
// Runs the executor on `ranks` ranks (mpirun when ranks > 1) with `args` after the binary.
Outcome run_executor(int ranks, const std::string& args);
// Runs `command` (a program and its arguments) on `ranks` ranks under mpirun.
Outcome run_mpi(int ranks, const std::string& command);
// Runs a shell command, capturing output.
Outcome run_command(const std::string& command);
nlohmann::json read_json(const std::string& path);
// Every tensor of a float32 safetensors file, by name (parsed from the format's header).
std::map<std::string, std::vector<float>> read_safetensors(const std::string& path);

using Parameters = std::map<std::string, std::vector<float>>;
// GoogleTest assertions that `got` holds the parameters of `expected` (same names and sizes),
// equal as one vector to `tolerance` of its norm and each tensor to 10 x `tolerance` of its own.
// GPT's key bias, whose true gradient is exactly 0 (softmax is shift-invariant), is held to an
// absolute RMS of 1e-3: Adam steps on rounding noise there.
void expect_parameters_close(const Parameters& expected, const Parameters& got, double tolerance);

}  // namespace trainplan::testing
