#pragma once
// Checkpoints: every shard owner writes its float32 master weights and AdamW moments
// (`shard_<k>.bin`); rank 0 then writes `manifest.json` (schema trainplan/checkpoint/v1) with
// each file's size and CRC-32, and the trainer state. Files are written to a temporary name,
// fsynced and renamed; the whole step directory appears under its final name
// (`step_000010`) only once complete, so a crash mid-write never leaves a checkpoint that looks
// complete; the manifest carries the CRC-32 of its own text too, and a resume skips a damaged
// newest checkpoint for the newest intact one. `--export` writes one consolidated safetensors file plus the model document.

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm.hpp"
#include "engine.hpp"

namespace trainplan::executor {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the trainer needs to continue exactly.
struct TrainerState {
  int64_t step = 0;           // optimizer steps completed
  double loss_scale = 1.0;    // fp16 dynamic loss scale
  int64_t good_steps = 0;     // steps since the loss scale last changed
  std::vector<double> losses; // per-step losses so far
};

// The parallel layout a checkpoint was written under; resuming needs the same one. `parallel`
// describes the TP/PP/DP layout (the trainer's).
[[nodiscard]] nlohmann::json checkpoint_layout(const DataParallelEngine& engine, int world_size, const std::string& precision,
                                               const nlohmann::json& parallel);

// Collective: every rank calls it. Returns the step directory written.
std::string save_checkpoint(const std::string& dir, DataParallelEngine& engine, Communicator& world,
                            const TrainerState& state, const nlohmann::json& layout);

// The newest complete step directory under `dir` (one with a manifest), if any.
[[nodiscard]] std::optional<std::string> latest_checkpoint(const std::string& dir);

// Every step directory under `dir` (step_NNNNNN, with a manifest or not), newest first.
[[nodiscard]] std::vector<std::string> checkpoint_directories(const std::string& dir);

// What is wrong with the checkpoint in `step_dir`, read on this rank alone: "" when intact, else
// why not (a missing, unparsable or self-inconsistent manifest, whose CRC-32 covers its own
// text, or a file of another size or CRC-32 than the manifest gives: "shard_00001.bin: 512
// bytes, the manifest says 1024 (truncated or overwritten shard)"). Throws CheckpointError when
// the checkpoint is intact but written under another layout than `layout` (a different plan:
// no older checkpoint of the same directory would do either).
[[nodiscard]] std::string checkpoint_damage(const std::string& step_dir, const nlohmann::json& layout);

// Collective. Verifies the checkpoint (checkpoint_damage, on rank 0), then loads this rank's
// shard. Throws CheckpointError naming the directory and file.
[[nodiscard]] TrainerState load_checkpoint(const std::string& step_dir, DataParallelEngine& engine, Communicator& world,
                                           const nlohmann::json& layout);

struct Resumed {
  TrainerState state;
  std::string step_dir;              // the checkpoint loaded
  std::vector<std::string> skipped;  // newer damaged ones, "DIR: why", newest first
};

// Collective. Loads the newest intact checkpoint under `dir`: a damaged newer one (a truncated
// or corrupt shard, a torn manifest) is skipped and reported in `skipped`, never loaded. Throws
// CheckpointError when there is none (listing every checkpoint's damage), or as
// checkpoint_damage for another layout.
[[nodiscard]] Resumed resume_newest_intact(const std::string& dir, DataParallelEngine& engine, Communicator& world,
                                           const nlohmann::json& layout);

// Where the pieces of every parameter live, for consolidating them (the trainer knows the layout).
struct ExportPlan {
  // Whether this rank sends its pieces of `unit` (the first replica holding them).
  std::function<bool(const UnitLayout& unit)> sends;
  // The cut of parameter `slot` of unit `unit` as held by the TP rank with piece `piece`.
  std::function<const ParamSlot&(const std::string& unit, const std::string& slot, int piece)> piece_slot;
  // The world rank that sends piece `piece` of parameter `slot` of unit `unit`.
  std::function<int(const std::string& unit, const std::string& slot, int piece)> owner_rank;
};

// What an export writes (--export-format, --export-lora).
struct ExportOptions {
  bool hugging_face = false;  // true: transformers' LlamaForCausalLM names and config.json; false: the executor's names and model document
  bool merged = true;         // LoRA: the base weights with the adapters merged in (W + scale B A), under the base's names
  bool adapters = false;      // LoRA: the adapters alone (PEFT's adapter_model.safetensors and adapter_config.json)
  std::string base_model;     // LoRA: adapter_config.json's base_model_name_or_path
};

// Collective. Rank 0 writes `<dir>/model.safetensors` (float32, one whole tensor per parameter,
// the TP pieces joined, pipeline stages and expert-parallel ranks gathered) and `<dir>/config.json`
// (the trainplan/model/v1 document, or transformers' config with `hugging_face`); and, for a
// LoRA run, `adapter_model.safetensors` and `adapter_config.json` (PEFT) when asked. Without LoRA
// the model file is streamed one parameter at a time; with it rank 0 holds a block and its
// adapters at once (merging needs both).
void export_safetensors(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step,
                        const ExportPlan& plan, const ExportOptions& options = {});

}  // namespace trainplan::executor
