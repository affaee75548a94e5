#pragma once
// Pipeline parallelism: which model chunks a stage holds, and one training step run in the
// order costmodel::pipeline_order gives (GPipe, 1F1B, interleaved 1F1B), with activations sent
// forward and their gradients backward between neighbouring stages over one-directional links
// (pipeline_links.hpp), the loss on the last chunk.
// Without pipeline parallelism the same runner does forward, backward per micro-batch.
// Each step can record a timeline (forward, backward, waits for data) for the trace.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "engine.hpp"
#include "model.hpp"
#include "pipeline_links.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::executor {

// The units of stage `stage` in execution order, with the chunk of each: chunk c holds model
// position c * stages + stage, whose transformer layers are chunk_layers' share (in position
// order); position 0 starts with the embedding, the last ends with the head.
struct StageUnits {
  std::vector<UnitLayout> units;
  std::vector<int> chunk_of_unit;
};
[[nodiscard]] StageUnits stage_units(const std::vector<UnitLayout>& all_units, const std::vector<int>& chunk_layers,
                                     int stages, int stage);
// The stage that holds unit `name` ("embedding", "layers.7", "head").
[[nodiscard]] int stage_of_unit(const std::string& name, const std::vector<int>& chunk_layers, int stages);

struct TraceRecord {
  std::string kind;  // forward, backward, recv, dp_comm, optimizer
  int micro_batch = -1, chunk = 0;
  double start = 0, end = 0;  // seconds from the step's start on this rank
};

struct PipelineConfig {
  int stages = 1, stage = 0, virtual_stages = 1, micro_batches = 1;
  costmodel::Schedule schedule = costmodel::Schedule::kOneFOneB;
  std::vector<int64_t> activation_shape;  // [micro_batch, seq (or seq / tp), hidden]
  at::ScalarType activation_dtype = at::kFloat;
  at::Device device = at::kCPU;
};

class PipelineRunner {
 public:
  // `links`: this stage's links to its neighbours; null without pipeline parallelism. Throws
  // std::logic_error if the schedule would have a link's two ends take its messages in different
  // orders (link_order_mismatch).
  PipelineRunner(const PipelineConfig& config, DataParallelEngine& engine, PipelineLinks* links);

  // One step's forward and backward passes. `batch(i)` gives micro-batch i's tokens and targets.
  // Returns the sum of the micro-batch losses computed on this rank (0 off the last stage).
  // With `trace`, records the step's events into it.
  using BatchFn = std::function<std::pair<at::Tensor, at::Tensor>(int micro_batch)>;
  double run_step(const BatchFn& batch, double loss_multiplier, std::vector<TraceRecord>* trace);

  // Most micro-batch chunks whose activations this stage held at once in the last step, over
  // virtual stages (costmodel::micro_batches_in_flight).
  [[nodiscard]] double peak_in_flight() const { return peak_in_flight_; }

 private:
  PipelineConfig config_;
  DataParallelEngine& engine_;
  PipelineLinks* links_;
  std::vector<std::vector<costmodel::PipelinePass>> order_;
  double peak_in_flight_ = 0;
};

}  // namespace trainplan::executor
