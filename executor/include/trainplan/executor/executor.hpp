#pragma once
// The executor's entry points: trains a `trainplan/plan/v1` plan for real (LibTorch; MPI ranks on
// CPU, NCCL ranks on GPU), prints a line per step on rank 0 and writes a
// `trainplan/measurement/v1` document in the shape of the cost model's estimate; or profiles this
// machine's device (`--profile`) into a `trainplan/hwprofile/v1` document with measured kernel
// tables, and collective bus bandwidths when started on several ranks.
// This header is free of LibTorch so apps and tests can include it cheaply.

#include <cstdint>
#include <string>

namespace trainplan::executor {

struct RunOptions {
  std::string plan_path;               // REQUIRES: a fully fixed plan (planner --save-plan)
  int64_t steps = 20;                  // optimizer steps to reach (counting resumed ones)
  std::string device = "auto";         // "auto" (cuda when present), "cpu" or "cuda"
  std::string data = "synthetic";      // "synthetic" or a token file path
  std::string data_dtype = "uint16";   // token file element: "uint16" or "uint32"
  std::string vocab;                   // instruction data (--data *.jsonl|*.json): a vocabulary file; empty: bytes
  uint64_t seed = 1234;                // initialisation and synthetic data
  double lr = 3e-4;                    // peak learning rate
  double min_lr_ratio = 0.1;           // cosine decay floor, fraction of lr
  int64_t warmup_steps = -1;           // linear warmup; -1 = steps / 10
  int64_t decay_steps = 0;             // end of the cosine; 0 = steps
  double weight_decay = 0.1;
  double clip_grad = 1.0;              // global-norm clipping; 0 = off
  std::string checkpoint_dir;          // empty = no checkpoints
  int64_t checkpoint_every = 0;        // steps between checkpoints; 0 = only at the end/stop
  std::string resume;                  // a checkpoint directory: continue from its newest step
  std::string export_dir;              // consolidated safetensors + config.json at the end
  std::string export_format = "trainplan";  // "trainplan" (the executor's names) or "hf" (transformers' Llama layout)
  std::string export_lora = "merged";  // LoRA runs: "merged", "adapters" (PEFT) or "both"
  std::string init_from;               // a Hugging Face Llama checkpoint directory to start from
  std::string measurement_path;        // where rank 0 writes the measurement document
  int64_t stop_after = 0;              // stop (and checkpoint) after this many steps of this run
  int timeout_seconds = 300;           // a collective waiting longer ends the run
  int threads = 0;                     // intra-op CPU threads per rank; 0 = cores / local ranks
  int64_t fail_at_step = 0;            // fault injection for tests: SIGKILL `fail_rank` at this step
  int fail_rank = 0;
  // Fault injection for tests: "PHASE[:MICRO_BATCH[:STEP]]" (phase_timer.hpp's names; MICRO_BATCH
  // from 0 or "any"; STEP from 1, absent: any) makes a real allocation fail when that phase
  // begins, on `inject_oom_rank` (-1: every rank). Empty: off.
  std::string inject_oom;
  int inject_oom_rank = -1;
  bool quiet = false;                  // no per-step lines
  // "fused": the fused paths (executor/src/model/fused_ops.hpp) and LibTorch's fused AdamW; "reference":
  // the plain ATen composition they are checked against.
  std::string kernels = "fused";
  // A CSV of the GPU kernels of step `trace_step`, ranked by total device time (Kineto, CUDA only).
  std::string kernel_profile;
  int64_t trace_step = 0;              // step whose timeline goes into the measurement's `trace`; 0 = the last
};

// Prints `text` on standard error as this process's rank of the job (from the launcher's
// environment, 0 for a single process): every line prefixed "[rank N] ", the whole message in
// one write, so ranks failing at once never mix their lines.
void print_rank_message(const std::string& text);

// Runs the plan in this process as one rank of the job the environment describes (MPI launcher,
// torchrun/SLURM variables, or a single process). Returns the exit code: 0 success, 2 bad input
// (plan, data, checkpoint), 3 a failure during the run (dead peer, I/O, out of memory: the rank
// says so in one line and the measurement document has "status": "out_of_memory"). Messages go to stderr
// prefixed with the rank.
[[nodiscard]] int run_executor(const RunOptions& options, const std::string& command_line);

struct ProfileOptions {
  std::string out_path;           // REQUIRES: not empty; rank 0 writes the hwprofile document here
  std::string device = "auto";    // "auto" (cuda when present), "cpu" or "cuda"
  std::string base = "dgx-h100";  // cluster preset or hwprofile file: the sections not measured, and a GPU's datasheet peaks
  std::string name;               // the new profile's name; empty: "measured-<device>"
  std::string command;            // the command recorded in the tables' source; empty: this executor's command line
  bool quick = false;             // fewer shapes and repeats
  int threads = 0;                // CPU threads for the kernels; 0 = every core
  int timeout_seconds = 300;      // a collective waiting longer ends the run
};

// Runs the microbenchmarks as one rank of the job the environment describes. With several ranks
// every rank measures all-reduce, all-gather and reduce-scatter bus bandwidth by message size;
// then rank 0 alone measures the kernels (GEMMs, attention, element-wise ops, AdamW, copy) and
// writes the profile. A progress bar goes to stderr when it is a terminal. Returns the exit code:
// 0 success, 2 bad input (device, base profile, output path), 3 a failure during the run.
[[nodiscard]] int run_profile(const ProfileOptions& options, const std::string& command_line);

}  // namespace trainplan::executor
