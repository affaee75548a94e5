#pragma once
// Estimate: memory per GPU on the worst rank, time per step, throughput, and the cost of a whole
// training run (checkpoints, failures, GPU-hours) for one fixed Plan; the
// `trainplan/estimate/v1` document. The executor writes measurements in the same shape.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/units.hpp"

namespace trainplan::costmodel {

// Model states per GPU (ZeRO paper accounting), before activations and buffers.
struct ModelStateBytes {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;  // optimizer states incl. fp32 master weights
};

// Bytes per trainable parameter of each model state for a precision and optimizer
// (ZeRO §3: mixed-precision Adam is 2 + 2 + K with K = 12). `master`: the optimizer's bytes
// include a 4-byte fp32 master copy of the weights (mixed precision); false in fp32 training and
// in pure 16-bit training (TrainingConfig::master_weights false: weights, gradients and the
// optimizer's states all in the 16-bit dtype, 2 + 2 + 4 for AdamW).
struct StateWidths {
  double weights = 0, gradients = 0, optimizer = 0;
  bool master = true;
};
[[nodiscard]] StateWidths state_widths(Precision precision, OptimizerKind optimizer, bool master_weights = true);

// Model-state bytes of `params` parameters replicated over `dp` ranks with ZeRO stage
// `zero_stage` (0..3): ZeRO Table 1 for mixed-precision Adam.
[[nodiscard]] ModelStateBytes zero_model_states(double params, Precision precision, OptimizerKind optimizer,
                                                int zero_stage, int dp);

// ZeRO-3 with DeepSpeed's stage3_max_reuse_distance (StackSpec DataParallelSpec): how many of a
// stage's last layers stay gathered from their forward to their backward. Between a layer's two
// uses the trace fetches the layers after it and the head twice, so layer L - m stays when
// 2 (m x layer_params + head_params) < max_reuse_distance: ceil((distance / 2 - head) / layer)
// layers, at most the stage's; none when the head alone is past half the distance.
[[nodiscard]] int layers_kept_for_reuse(double max_reuse_distance, double layer_params, double head_params, int stage_layers);

// Memory per GPU as PyTorch's caching allocator sees it. `total` is the peak of allocated bytes
// (weights + gradients + optimizer + activations + buffers, or the optimizer step's peak);
// `reserved` adds the blocks the allocator holds cached at that peak; `required` adds the CUDA
// context and workspaces outside the allocator (`overhead`) and is what must fit in `capacity`.
struct MemoryBreakdown {
  // At the peak: `gradients` are those alive then, which is fewer than the step ends with
  // (`gradients_step_end`) where the stack frees them each step and the peak comes before its
  // backward has made them all (StackSpec::grads_freed_each_step).
  Bytes weights, gradients, optimizer, activations, buffers, overhead, total, reserved, required, capacity;
  Bytes gradients_step_end;
  // Of `activations`: eager torch.autocast's 16-bit copies of the weights, held by its cache to the
  // end of the forward (LayerSetting::autocast); 0 where the peak is later or there is no cache.
  Bytes autocast_copies;
  int worst_stage = 0;           // pipeline stage with the largest total
  double micro_batches_in_flight = 0;  // on that stage, per the schedule
  Bytes cpu_offload_per_node;    // host memory used by offloaded states
  Bytes cpu_offload_per_gpu;     // the same for one GPU's rank (the worst stage's)
  // Under expandable segments (TrainingConfig::allocator): what PyTorch's default allocator would
  // hold beyond `reserved` at the peak, the idle blocks that expandable segments unmap and map
  // again when memory runs short; 0 under the default allocator.
  Bytes idle_cache;
};

struct TimeBreakdown {
  Seconds step, compute, recompute, tp_comm, cp_comm, ep_comm, pp_comm, dp_comm_exposed, dp_comm_total, bubble,
      optimizer, offload;
  // The sharding stack's own passes on the compute stream (stack.hpp DataParallelSpec): copies
  // into and out of all-gather and reduce-scatter buffers, pre-divides, casts to the reduce dtype.
  Seconds dp_copies;
  // Of tp_comm: the copies of the gathered tensor DTensor's sequence-parallel collectives make
  // (StackSpec::sequence_parallel_rearranges); 0 in the other stacks.
  Seconds tp_copies;
  // Of compute and recompute: torch.autocast's dtype casts (LayerSetting::autocast); 0 elsewhere.
  Seconds autocast_casts;
  // What the GPUs wait for a host that issues work slower than they run it: kernel launches
  // (StackSpec::host_seconds_per_kernel) and the stack's loops over the ranks of its shard group
  // (DataParallelSpec::*_host_seconds_per_rank_*), beyond the micro-batch's GPU time.
  Seconds host_wait;
  // The benchmark step above is one GPU's; a synchronous job of N GPUs runs each step at the pace
  // of its slowest (HardwareProfile::gpu_speed_cv, step_jitter_cv): `straggler` is that wait.
  // `clock`: what the step loses when the GPUs hold their sustained clock rather than the one the
  // peaks are for (GpuSpec::clock_slowdown; 0 where the profile states no clocks).
  // `sustained_step` = step + clock + straggler, what a long production run sees per step.
  Seconds clock, straggler, sustained_step;
};

// The expected largest of n independent standard normal draws (Blom's approximation,
// Phi^-1((n - 0.375) / (n + 0.25)); 0 for n <= 1): 0.59 for 2 (exactly 0.564), 1.434 for 8
// (1.424), 3.956 for 16384 (3.971): within 0.5% from 64 draws on.
[[nodiscard]] double expected_max_of_normals(double n);

// The layers of each model chunk (chunk c on pipeline stage c % stages) when the first and last
// stages hold a fixed number (ParallelConfig::first_stage_layers, last_stage_layers; 0 = not
// fixed), split evenly over their virtual stages, and the rest spread over the other chunks, the
// earlier ones a layer more. REQUIRES: validate_plan's rules for them hold.
[[nodiscard]] std::vector<int> partition_with_ends(int layers, int stages, int virtual_stages, int first_stage_layers, int last_stage_layers);

// The layers of each of `chunks` model chunks when the embedding and the loss count as a layer
// each (ParallelConfig::ends_in_split, Megatron-Core's get_num_layers_to_build): (layers + 2) /
// chunks each, one fewer in the first chunk and in the last (0 where a chunk holds only the
// embedding or the loss). REQUIRES: (layers + 2) % chunks == 0, chunks >= 2.
[[nodiscard]] std::vector<int> partition_ends_in_split(int layers, int chunks);

struct Throughput {
  double tokens_per_second = 0;
  double tokens_per_second_per_gpu = 0;
  // Model FLOPs per token of the global batch, the convention of mfu: forward and backward, no
  // recompute; LoRA's and QLoRA's frozen weights take no weight gradient (4 FLOPs per parameter,
  // not 6). The executor measures its MFU with it, so the two compare.
  double model_flops_per_token = 0;
  double model_tflops_per_gpu = 0;     // model FLOPs (no recompute) per second per GPU, in TFLOP/s
  double hardware_tflops_per_gpu = 0;  // executed FLOPs (recompute included), in TFLOP/s
  double mfu = 0;                      // model FLOPs utilisation, fraction of dense peak
  double hfu = 0;                      // hardware FLOPs utilisation
};

struct RunCost {
  double train_tokens = 0;
  Seconds compute_time;          // failure-free time to train train_tokens
  Bytes checkpoint_bytes;        // whole job, all shards
  Seconds checkpoint_write_time; // blocking write at the cluster's storage bandwidth
  Seconds checkpoint_interval;   // optimal interval (Young/Daly)
  Seconds job_mtbf;
  double goodput = 1;            // compute_time / wall_time
  Seconds wall_time;             // with checkpoints, failures, restarts
  double gpu_hours = 0;
  double cost_usd = 0;
};

// The pipeline schedule the time model assumes, for drawing it.
struct PipelineTimeline {
  int stages = 1;
  int virtual_stages = 1;
  int micro_batches = 1;
  Schedule schedule = Schedule::kOneFOneB;
  std::vector<double> forward_seconds;   // per stage, one micro-batch through all its chunks
  std::vector<double> backward_seconds;  // per stage, recompute included
  double p2p_seconds = 0;                // one hop between stages: the exchange after a pass and the gather after it
  // What a stage spends after each pass on its exchange with its neighbours and the all-gathers
  // over TP that rebuild what it received, not computing (the step's pp_comm, per pass): the
  // exchange plus half of a micro-batch's gathers.
  double pass_comm_seconds = 0;
  // Transformer layers of each model chunk in pipeline order (stages * virtual_stages entries;
  // chunk c of stage s is entry c * stages + s): partition_layers with the layer, embedding and
  // head times of this plan. The executor partitions its stages with these counts.
  std::vector<int> chunk_layers;
  // With chunk_layers: one transformer layer's forward and backward (recompute included), and what
  // the embedding adds to the first chunk and the output layer with the loss to the last. The
  // chunks of a stage need not take the same time: a chunk may hold only the embedding or the
  // loss (ends_in_split), or a layer fewer than its neighbours.
  double layer_forward_seconds = 0, layer_backward_seconds = 0;
  double embedding_forward_seconds = 0, embedding_backward_seconds = 0;
  double head_forward_seconds = 0, head_backward_seconds = 0;

  // One pass of model chunk `position` (pipeline order: chunk c of stage s is c * stages + s):
  // its stage's forward_seconds (backward_seconds) shared over the stage's chunks in proportion
  // to their layers and ends (the stage's gradient pass, copies and host wait with them), where
  // chunk_layers names every chunk; else the stage's time / virtual_stages.
  // REQUIRES: 0 <= position < stages * virtual_stages; forward_seconds and backward_seconds per stage.
  [[nodiscard]] double chunk_forward_seconds(int position) const;
  [[nodiscard]] double chunk_backward_seconds(int position) const;
  // Those of every position at once (the schedule's simulation). REQUIRES: as above.
  [[nodiscard]] std::vector<double> chunk_forward_seconds_all() const;
  [[nodiscard]] std::vector<double> chunk_backward_seconds_all() const;
  // Whether the chunks take unequal times: their forward (backward) passes differ by more than
  // 0.5% (the bubble then comes from the schedule's lower bound, pipeline_makespan_bound).
  [[nodiscard]] bool uneven_chunks() const;
};

// Splits `layers` transformer layers into `chunks` contiguous chunks (>= 1 layer each) that
// minimise the slowest chunk, where a chunk costs its layers x `layer_seconds`, plus
// `first_seconds` for the first chunk (embedding) and `last_seconds` for the last (final norm,
// output layer, loss). Ties give the extra layer to the earlier chunk (Megatron's even split
// when the ends cost nothing). REQUIRES: 1 <= chunks <= layers; costs >= 0.
[[nodiscard]] std::vector<int> partition_layers(int layers, int chunks, double layer_seconds, double first_seconds,
                                                double last_seconds);

// Bytes one rank sends per optimizer step, on the rank that sends the most, as the ring
// algorithms move them (compute.hpp cp_bytes). The executor's measurement counts the same way
// (its "communication" object). Context and expert parallelism so far.
struct CommunicationVolume {
  Bytes cp_sent;
  Bytes ep_sent;  // balanced routing; the measurement counts the rows really sent
};

struct Estimate {
  bool fits = true;
  // The stack trains the fp32 module under torch.autocast (autocast_fp32_module): fp32 weights,
  // gradients and optimizer states, no master copy.
  bool autocast = false;
  bool tight = false;  // fits, but `required` is within the memory headroom of capacity
  std::vector<std::string> reasons;  // why it does not fit or is tight, or notable warnings
  MemoryBreakdown memory;
  TimeBreakdown time;
  Throughput throughput;
  RunCost run;
  PipelineTimeline pipeline;
  CommunicationVolume communication;
  int micro_batches = 1;  // per optimizer step per pipeline (gradient-accumulation steps)
  double parameters = 0;  // total model parameters
  double trainable_parameters = 0;
};

// The headroom a plan keeps below HBM capacity unless told otherwise: twice the largest error
// of the predicted peak reserved memory against the measured H100 runs (tests/data/
// h100-llama3.2-1b, docs/cost-model.md "The cost model against real GPUs"), rounded up to a whole percent. A plan that needs more
// than (1 - headroom) x capacity is "tight".
inline constexpr double kDefaultMemoryHeadroom = 0.02;

// What a search prices again and again, each priced once and looked up after: a search over one
// model on one cluster asks for a few hundred distinct layer settings (micro-batch, tp, cp, ep,
// recompute) and data-parallel collectives for tens of thousands of plans, which differ in what
// these do not see (the micro-batch leaves the data-parallel traffic alone; dp, pp, ZeRO and the
// schedule leave the layer alone). Results are those of the functions named, exactly.
// REQUIRES: every call on one memo passes the same model and hardware, unchanged (a search's
// request): they are not part of the key. A call naming another model or profile (by name) is
// priced without the memo. Not thread-safe: one memo per thread.
class EstimateMemo {
 public:
  EstimateMemo();
  ~EstimateMemo();
  EstimateMemo(const EstimateMemo&) = delete;
  EstimateMemo& operator=(const EstimateMemo&) = delete;

  [[nodiscard]] LayerCost layer(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);  // transformer_layer_cost
  [[nodiscard]] EndsCost ends(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);    // ends_cost
  [[nodiscard]] Seconds collective(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g);  // collective_time
  // partition_layers (above), by its arguments. The reference is valid until the memo's next call.
  [[nodiscard]] const std::vector<int>& partition(int layers, int chunks, double layer_seconds, double first_seconds, double last_seconds);
  // Whether calls for this model and hardware are memoised (their names are the first call's).
  [[nodiscard]] bool serves(const ModelSpec& model, const HardwareProfile& hw);
  // A memo of its own for the same plans at the GPU's sustained clock (estimate.cpp), whose
  // hardware is the one above with its tensor-core kernels slowed. Use it only for plans this
  // memo serves.
  [[nodiscard]] EstimateMemo& sustained();
  [[nodiscard]] std::size_t settings() const;     // distinct layer settings priced so far
  [[nodiscard]] std::size_t collectives() const;  // distinct collectives priced so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct EstimateOptions {
  double memory_headroom = kDefaultMemoryHeadroom;  // fraction of HBM capacity, 0 <= x < 1
  // Layers, ends and collectives priced once each, for callers that estimate many plans of one
  // model on one cluster (the search). Null: priced each time.
  EstimateMemo* memo = nullptr;
  // Write `reasons` (false: fits and tight alone, for a search that explains only the plans it
  // keeps, with explain_memory).
  bool explain = true;
  // Price a pipeline whose chunks take unequal times by running its schedule (pipeline_makespan).
  // Off: by the schedule's lower bound (pipeline_makespan_bound), 25-200 times cheaper and never
  // slower; for a search's sweep, which prices what it ranks again with this on (search.cpp).
  bool exact_pipeline = true;
};

// REQUIRES: validate_plan(plan) is ok. Never fails: a plan that does not fit has fits == false
// and the reason in `reasons`; a tight one has tight == true and the reason there too.
[[nodiscard]] Estimate estimate(const Plan& plan, const EstimateOptions& options = {});

// The reasons of an estimate made with explain off, as estimate() writes them: whether `e`
// fits and is tight again, from its memory, and why. REQUIRES: e = estimate(plan, options).
void explain_memory(const Plan& plan, const EstimateOptions& options, Estimate& e);

// Whether the plan's stack trains its fp32 module under torch.autocast (StackSpec::autocast: always,
// or without FSDP's sharding, tensor, context, pipeline or expert parallelism), in a 16-bit or fp8
// precision with master weights, not LoRA.
[[nodiscard]] bool autocast_fp32_module(const Plan& plan);
// The setting of one transformer layer of `plan` (its micro-batch, parallelism, precision, stack,
// recompute and the groups' placement in the NVLink domain) and that layer's cost for one
// micro-batch on one GPU: the layer estimate() prices (before partial recompute is blended in).
// REQUIRES: validate_plan(plan) is ok.
[[nodiscard]] LayerSetting layer_setting(const Plan& plan);
[[nodiscard]] LayerCost plan_layer_cost(const Plan& plan);

// Cost of a run given a step time; exposed for tests of the Young/Daly model.
[[nodiscard]] RunCost run_cost(const Plan& plan, Seconds step, double checkpoint_bytes);

[[nodiscard]] nlohmann::json estimate_to_json(const Plan& plan, const Estimate& e);

}  // namespace trainplan::costmodel
