#pragma once
// Checkpoints: every shard owner writes its float32 master weights and AdamW moments
// (`shard_<k>.bin`); rank 0 then writes `manifest.json` (schema trainplan/checkpoint/v1) with
// each file's size and CRC-32, and the trainer state. Files are written to a temporary name,
// fsynced and renamed; the whole step directory appears under its final name
// (`step_000010`) only once complete, so a crash mid-write never leaves a checkpoint that looks
// complete. `--export` writes one consolidated safetensors file plus the model document.

#include <cstdint>
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

// The parallel layout a checkpoint was written under; resuming needs the same one.
[[nodiscard]] nlohmann::json checkpoint_layout(const DataParallelEngine& engine, int world_size, const std::string& precision);

// Collective: every rank calls it. Returns the step directory written.
std::string save_checkpoint(const std::string& dir, DataParallelEngine& engine, Communicator& world,
                            const TrainerState& state, const nlohmann::json& layout);

// The newest complete step directory under `dir` (one with a manifest), if any.
[[nodiscard]] std::optional<std::string> latest_checkpoint(const std::string& dir);

// Collective. Verifies every file's size and CRC-32 against the manifest and the layout against
// `layout`, then loads this rank's shard. Throws CheckpointError naming the directory and file.
[[nodiscard]] TrainerState load_checkpoint(const std::string& step_dir, DataParallelEngine& engine, Communicator& world,
                                           const nlohmann::json& layout);

// Collective. Rank 0 writes `<dir>/model.safetensors` (float32, one tensor per parameter) and
// `<dir>/config.json` (the trainplan/model/v1 document).
void export_safetensors(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step);

}  // namespace trainplan::executor
