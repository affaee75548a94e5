#pragma once
// Pipeline schedules: the order in which each pipeline stage runs the forward and backward passes
// of its micro-batches (GPipe, 1F1B, interleaved 1F1B), and an event simulation of that order
// with per-stage pass times. The executor runs the same order (one source of truth), the GUI
// draws the simulation, and the bubble it gives is compared with the executor's timeline.
//
// Bubble, here and in the executor's measurement: for each stage, the time within the step (from
// the first pass's start on any stage to the last pass's end) that it does not compute, over the
// time it computes; then the mean over stages. With
// balanced stages and free transfers it is (p-1)/m for GPipe and 1F1B and (p-1)/(v*m) for
// interleaved 1F1B (Narayanan et al. 2021, §2.2).

#include <vector>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

enum class PassKind { kForward, kBackward };
[[nodiscard]] const char* pass_kind_name(PassKind k);  // "forward", "backward"

// One pass of one micro-batch through one model chunk of a stage.
struct PipelinePass {
  PassKind kind = PassKind::kForward;
  int micro_batch = 0;  // 0 .. micro_batches-1
  int chunk = 0;        // model chunk on this stage, 0 .. virtual_stages-1; its place in the model
                        // is chunk * stages + stage (Megatron's interleaved assignment)
  friend bool operator==(const PipelinePass& a, const PipelinePass& b) {
    return a.kind == b.kind && a.micro_batch == b.micro_batch && a.chunk == b.chunk;
  }
};

// The passes of every stage in the order that stage runs them: [stage][i]. Every stage runs
// each (micro-batch, chunk) forward once and backward once, a backward after its forward.
// GPipe: all forwards, then all backwards. 1F1B: p-s-1 warm-up forwards, then one forward one
// backward, then the cool-down backwards. Interleaved: Megatron-LM's interleaved 1F1B over
// micro-batch groups of size p. Errors: a count < 1; virtual_stages > 1 without the
// interleaved schedule; interleaved with micro_batches not a multiple of stages (as Megatron).
[[nodiscard]] Result<std::vector<std::vector<PipelinePass>>> pipeline_order(Schedule schedule, int stages,
                                                                            int virtual_stages, int micro_batches);

struct ScheduledPass {
  int stage = 0;
  PipelinePass pass;
  double start = 0;  // seconds from the step's start
  double end = 0;
};

struct ScheduleSimulation {
  std::vector<ScheduledPass> passes;  // every pass, grouped by stage, each stage in run order
  double makespan = 0;                // seconds, first start to last end
  double bubble_fraction = 0;         // mean over stages of idle / busy (see above)
  std::vector<double> busy_seconds;   // per stage
  // Per stage, in micro-batches: the most (micro-batch, chunk) pairs whose activations are held
  // at once (forward done, backward not yet), over virtual_stages. 1F1B: p - s on stage s.
  std::vector<double> peak_in_flight;
};

// Micro-batches whose activations pipeline stage `stage` holds at its peak under the plan's
// schedule with m micro-batches per step (the cost model's activation memory): 1 without a
// pipeline, m for GPipe, min(m, p - stage) for 1F1B, and Megatron's interleaved warm-up
// ((p - stage - 1) * 2 + (v - 1) * p chunks, plus the one in backward) over v.
[[nodiscard]] double micro_batches_in_flight(const ParallelConfig& parallel, int stage, int micro_batches);

// Simulates pipeline_order(timeline.schedule, ...) with a pass of chunk c on stage s taking
// timeline.chunk_forward_seconds(c * p + s) (its share of the stage's time by its layers and ends;
// forward_seconds[s] / v without chunk_layers; backward likewise), the stage then held pass_comm_seconds by its
// exchange (idle, not computing), and each transfer between stages arriving p2p_seconds after
// the pass that sent it ended. A pass starts when its stage is free and its input has arrived.
[[nodiscard]] Result<ScheduleSimulation> simulate_pipeline(const PipelineTimeline& timeline);

// simulate_pipeline's makespan alone, without keeping the passes (0 where the timeline cannot be
// run): the estimate's bubble where chunks take unequal times (estimate.cpp).
[[nodiscard]] double pipeline_makespan(const PipelineTimeline& timeline);

// A lower bound of simulate_pipeline's makespan in O(stages) (0 where the timeline is mis-sized):
// the largest, over the stages, of the first micro-batch's way to a stage, the stage's passes and
// exchanges back to back, and the last backward's way back from it. Where every chunk takes as
// long it is (p - 1) / v of the last stage's time above its passes: the formula's bubble. The
// estimate's bubble where chunks take unequal times (estimate.cpp).
[[nodiscard]] double pipeline_makespan_bound(const PipelineTimeline& timeline);

}  // namespace trainplan::costmodel
