#pragma once
// Training logs of other stacks as measurements: what a torchtitan or Megatron-LM run printed on
// its console, read into the measurement document `planner compare` sets beside a prediction,
// so that a run of an export meets its prediction without our executor.
//
// torchtitan (pytorch/torchtitan v0.2.2 73a0e6979dd1 and main b5bcd76c6): the step lines of
// components/metrics.py ("step: 10  loss:  1.76364  grad_norm: ...  memory: 100.35GiB(56.27%)
// tps: 9,323  tflops: 785.55  mfu: 34.91%", colour codes and "[rank0]:" prefixes allowed, "wps"
// for older versions), where memory is the allocator's peak reserved GiB and tps the tokens per
// second per GPU; the header lines "Building device mesh with parallelism: pp=.., dp_replicate=..,
// dp_shard=.., cp=.., tp=.., ep=.." (parallel_dims.py), "Trainer is initialized with local batch
// size L, global batch size G, gradient accumulation steps A, sequence length S" (train.py),
// "CUDA capacity: <GPU> with ..." and "Compiling each TransformerBlock with torch.compile".
//
// Megatron-LM (NVIDIA/Megatron-LM megatron/training/training.py training_log at d98e8a64dd): the
// iteration lines ("iteration 30/ 100 | ... | elapsed time per iteration (ms): 5571.1 | ... |
// global batch size: 128 | lm loss: 1.924535E+00 | ..."), the memory report of
// megatron/training/utils report_memory ("[Rank 1] (after 1 iterations) memory (MB) | allocated:
// ... | max allocated: ... | reserved: ... | max reserved: ..."), "using world size: 16,
// data-parallel size: 8, context-parallel size: 1 tensor-model-parallel size: 2,
// pipeline-model-parallel size: 1" (arguments.py) and the arguments block ("seq_length ..... 4096").

#include <optional>
#include <string>
#include <utility>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/measurement.hpp"

namespace trainplan::planner {

enum class StackLog { kTorchtitan, kMegatron };

// "torchtitan", "megatron-lm".
[[nodiscard]] const char* stack_log_name(StackLog log);

// Which stack wrote this text, from its step or iteration lines; nothing when neither did.
[[nodiscard]] std::optional<StackLog> detect_stack_log(const std::string& text);

// What the plan says where the log does not (older torchtitan prints no mesh or batch; Megatron's
// iteration lines have no sequence length unless the arguments block is in the log); a log that
// states another sequence length, global batch or world size is refused (0: no plan's value).
struct LogDefaults {
  long long seq_len = 0;       // tokens per sequence
  long long global_batch = 0;  // sequences per optimizer step
  int world_size = 0;          // GPUs
  int zero_stage = 0;          // the layout's ZeRO stage (neither log names it)
  int ep = 1;                  // expert parallelism, where the log does not state it
};

// Reads the log at `path` as a `trainplan/measurement/v1` document: step_seconds (the median over
// the logged steps after the first, which pays compilation and warm-up), tokens_per_second and
// per GPU, reserved_bytes (and total_bytes, Megatron's peak allocated), the losses, the world size
// and layout where the log states them, the GPU name, and the stack (torchtitan: fsdp2, or
// fsdp2-compile where it compiled the blocks; Megatron-LM: megatron-te). Errors name the file: no
// step lines, or a figure the log cannot give without the plan (a sequence length, a world size).
[[nodiscard]] costmodel::Result<PerformanceDocument> read_stack_log(const std::string& path, const std::string& text, StackLog log,
                                                                   const LogDefaults& defaults);

// The two sides of `planner compare PREDICTION LOG`: the prediction file read for the log's run
// (a fixed plan is estimated now for the stack the log shows ran: torchtitan's fsdp2 or
// fsdp2-compile, Megatron-LM's megatron-te; an estimate file is taken as it is) and the log read
// with that file's sequence length, global batch, GPUs and ZeRO stage where the log lacks them.
[[nodiscard]] costmodel::Result<std::pair<PerformanceDocument, PerformanceDocument>> load_log_comparison(const std::string& prediction_path,
                                                                                                       const std::string& log_path,
                                                                                                       const std::string& log_text,
                                                                                                       StackLog log);

}  // namespace trainplan::planner
