#pragma once
// The data-parallel engine: one flat buffer per model unit (embedding, each block, head) and the
// DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 (FSDP full shard) / hybrid-shard state kept for it.
//
// Every stage is one shape, "shard over S ranks, replicate over R = dp / S":
//   stage 0 (DDP)   S = 1,  R = dp: full params, full grads all-reduced over replicas, full AdamW.
//   stage 1         S = dp, R = 1:  full params and grads; grads reduce-scattered at the last
//                   micro-batch; each rank updates its shard; params all-gathered after the step.
//   stage 2         as 1, but the full gradient of a unit lives only while it is reduce-scattered
//                   (every micro-batch); each rank keeps its gradient shard.
//   stage 3         params sharded too: a unit is all-gathered before its forward and its backward
//                   (the next unit prefetched) and freed after each; shard_group < dp is hybrid
//                   shard (S = shard_group; gradient shards then all-reduced over the R replicas).
// Expert units (mixture of experts) take the same shape over the expert-data-parallel group
// instead: its ranks within this rank's shard group shard them, the others replicate them. Every
// gradient is then divided by the dp group's size, since each rank's loss is the mean over its
// own tokens and an expert's gradient already sums what every rank's tokens sent it.
// Gradient reductions start from the autograd callbacks of each unit, so they overlap the rest
// of backward. Master weights, gradients and AdamW moments are float32; the compute copy is the
// plan's precision (fp32, bf16 or fp16).

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "context_parallel.hpp"
#include "tensor_parallel.hpp"
#include "model.hpp"
#include "phase_timer.hpp"
#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

// The groups the engine works over (parallel_dims.hpp builds them).
struct EngineGroups {
  Communicator* dp = nullptr;     // data-parallel group: ZeRO shards and gradient averages over it
  Communicator* world = nullptr;  // every rank: gradient norm and overflow checks
  Communicator* tied = nullptr;   // first and last stage when they both hold the tied token table
  Communicator* kv = nullptr;     // TP ranks that share a key/value head (tp > kv_heads)
  TensorParallel tp;
  ContextParallel cp;             // under CP, `dp` spans dp x cp ranks (parallel_dims.hpp)
  Communicator* ep = nullptr;     // expert parallelism: the ranks this rank's tokens are dispatched over
  Communicator* edp = nullptr;    // the ranks holding the same experts (null: dp)
};

struct EngineConfig {
  int zero_stage = 0;
  int shard_group = 0;            // 0 = dp (see ParallelConfig::shard_group)
  bool prefetch = true;
  bool overlap_grad_reduce = true;
  costmodel::Recompute recompute = costmodel::Recompute::kNone;
  int recompute_layers = 0;       // with kFull: the first n blocks of this pipeline stage are recomputed; 0 = all
  at::ScalarType compute_dtype = at::kFloat;
  Kernels kernels = Kernels::kFused;  // fused_ops.hpp's paths and LibTorch's fused AdamW, or the plain ones
  bool fp8 = false;                   // the blocks' linear layers train in fp8 (fp8.hpp; compute_dtype bf16)
  at::Device device = at::kCPU;
  uint64_t seed = 1234;
  // False when the base weights will be imported (--init-from overwrites every unit but LoRA's
  // adapters): those units start at zero instead of being drawn for nothing.
  bool draw_base_weights = true;
  std::string shard_prefix;       // checkpoint shard files of this TP/PP position ("pp01_tp00_")
  LoraSpec lora;                  // LoRA: the units' layout has frozen base units and adapters units (model.hpp)
  double hidden_dropout = 0;      // dropout.hpp: the embedding's and every block's residual branches
  double lora_dropout = 0;        // and the adapters' inputs
  // ZeRO-Offload (Ren et al. 2021): the float32 master weights and AdamW moments of this rank's
  // shards live in host memory (pinned on a GPU run), the update runs on the CPU; see optimizer_step.
  bool offload_optimizer = false;
  // QLoRA: the frozen blocks' linear weights stored in this format (quantize.hpp), dequantised
  // into the compute dtype while their block runs (gathered and released as ZeRO-3 units are).
  std::optional<costmodel::QuantFormat> quantized_base;
};

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// Bytes of model state this rank holds between steps (the cost model's weights, gradients and
// optimizer, ZeRO accounting: a separate fp32 master copy counts as optimizer state).
struct StateBytes {
  double weights = 0, gradients = 0, optimizer = 0;
  double host = 0;  // optimizer offload: the master weights and moments in host memory, and the gradient staging buffer
};

// The owned part of one unit's optimizer state (checkpoint shards).
struct OwnedState {
  at::Tensor master, exp_avg, exp_avg_sq;  // float32, shard_numel elements each
};

class Unit;

class DataParallelEngine {
 public:
  // `units`: this rank's units (model_layout pieces), grouped by model chunk in execution order;
  // `chunk_of_unit[i]` is unit i's chunk (0 .. chunks-1, non-decreasing).
  // REQUIRES: groups.dp->size() % S == 0 (validated with the plan).
  DataParallelEngine(const costmodel::ModelSpec& model, const EngineConfig& config, const EngineGroups& groups,
                     std::vector<UnitLayout> units, const std::vector<int>& chunk_of_unit, int64_t seq_len);
  ~DataParallelEngine();
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  // Forward of one model chunk for one micro-batch, recording the graph. `input`: tokens
  // ([micro_batch, seq] int64) when the chunk holds the embedding, else the previous chunk's
  // activation. Returns the activation, or, when the chunk holds the head, the loss multiplied
  // by `loss_multiplier` (1/accumulation x loss scale) with the unscaled loss in `*loss` (a 0-dim
  // float32 tensor on the device: reading it would wait for the GPU).
  [[nodiscard]] at::Tensor forward_chunk(int chunk, const at::Tensor& input, const at::Tensor& targets,
                                         double loss_multiplier, at::Tensor* loss);
  [[nodiscard]] int chunks() const { return static_cast<int>(chunk_ranges_.size()); }
  // Dropout's coordinates (dropout.hpp): this step's first sequence on this rank and the
  // micro-batch size, then, before each forward, the micro-batch's index in the step.
  void set_step_samples(int64_t first_sample, int64_t micro_batch);
  void begin_micro_batch(int micro_batch);
  // Masked targets (instruction data): each micro-batch's loss is the sum over its targets that
  // take a loss divided by this (data.hpp step_targets / (dp x cp x accumulation), so that the
  // step's loss is the mean over the whole global batch's); 0: the mean over its tokens.
  void set_loss_denominator(double denominator) { loss_denominator_ = denominator; }
  // What block `layer`'s forward draws its masks from (inactive without dropout).
  [[nodiscard]] DropoutRun dropout_run(int layer) const;
  // Around the autograd backward of one chunk's micro-batch: `last` marks the chunk's last
  // micro-batch of the step (gradient reductions start during it); end waits for the reductions.
  void backward_begin(bool last);
  void backward_end();
  // After every micro-batch: tied-embedding gradients summed between first and last stage,
  // deferred reductions, hybrid-shard replicas, and the average over data-parallel ranks.
  void finish_step();

  // Global L2 norm of the (averaged, still loss-scaled) gradients over every shard.
  [[nodiscard]] double gradient_norm();
  // False when any gradient on any rank is inf or NaN (fp16 loss scaling).
  [[nodiscard]] bool gradients_finite();
  // AdamW on the owned shards with gradients multiplied by `gradient_multiplier` (clipping and
  // loss-scale removal), then the compute copies refreshed. `step` counts from 1.
  // With optimizer offload each unit's gradient goes to a host staging buffer, the CPU updates the
  // host master and moments, and the new weights go back to the device, unit by unit in forward
  // order. Under ZeRO-0 and ZeRO-3 (no collective in the refresh) this runs on a thread of its
  // own and the call returns at once: the next step's forward waits for each unit's update only
  // when it reaches that unit, so the CPU updates later units while the device computes earlier
  // ones. ZeRO-1/2 all-gather the new weights, a collective, so the update finishes in the call.
  void optimizer_step(const AdamWSettings& settings, double lr, double gradient_multiplier, int64_t step);
  // Zeroes the gradients (an offloaded update zeroes each unit's after reading it).
  void zero_gradients();

  [[nodiscard]] StateBytes state_bytes() const;
  // Where the engine's data-parallel communication is timed (Phase::kDataParallelWait): gradient
  // reductions as they are started and waited for, and ZeRO-3 parameter gathers. Not owned; null:
  // untimed. The starts are non-blocking and the waits are the exposed time: on CPU (MPI) by the
  // host clock, on GPU by events on the compute stream, which waits for NCCL's collective stream
  // where the host waits (comm_nccl.cpp).
  void set_phase_timer(PhaseTimer* timer) { timer_ = timer; }
  [[nodiscard]] PhaseTimer* phase_timer() const { return timer_; }

  // Checkpoint support: units in order, and this rank's owned state in parts: the dense units'
  // (shard `shard` of the data-parallel shard group) and, with experts, the expert units' (prefix
  // "ep<e>_": shard `shard` of expert-parallel rank e's experts). The first replica of each part
  // writes it; replicas hold identical shards.
  struct StatePart {
    std::string prefix;  // config().shard_prefix, then "ep<e>_" for the experts
    int shard = 0;
    bool writes = false;
    std::vector<OwnedState> states;
  };
  [[nodiscard]] const std::vector<UnitLayout>& layout() const { return layout_; }
  [[nodiscard]] std::vector<StatePart> state_parts();
  [[nodiscard]] int shard_size() const;
  [[nodiscard]] int expert_shard_size() const;  // 0 without experts
  [[nodiscard]] int64_t shard_numel(std::size_t unit) const;
  // After master weights were loaded: refresh the compute copies.
  void load_masters_done();
  // Sets unit `unit`'s values from `values` (float32, unit.numel elements: this rank's TP pieces
  // in slot order, as init_unit writes them): the owned range of the master weights, or of a
  // frozen unit's compute-dtype weights. Call load_masters_done() after the last one.
  void load_unit(std::size_t unit, const at::Tensor& values);
  // The full float32 master weights of one unit (unpadded), on every rank of its shard group; a
  // frozen unit's are its compute-dtype weights, widened.
  [[nodiscard]] at::Tensor full_master(std::size_t unit);

  // Callbacks from the autograd functions (not for other callers).
  void on_unit_gradients(std::size_t unit, const std::vector<at::Tensor>& grads);
  void before_unit_backward(std::size_t unit);
  void gather(std::size_t unit, int prefetch_direction);
  void release(std::size_t unit);
  [[nodiscard]] std::vector<at::Tensor> unit_views(std::size_t unit);
  [[nodiscard]] at::Tensor anchor(std::size_t unit);
  // The unit that runs with block `unit`, right after it: its experts (an MoE layer) or its LoRA
  // adapters; -1 when none.
  [[nodiscard]] int64_t companion_of(std::size_t unit) const;
  // A unit's parameter views as block_forward takes them: through UnitViewsFn (their gradients
  // reach on_unit_gradients), or plain tensors for a frozen unit.
  [[nodiscard]] std::vector<at::Tensor> views_in_graph(std::size_t unit);
  // How block forwards run their MoE layers: `tally` null in a recompute pass.
  [[nodiscard]] MoeRun moe_run(double aux_scale, MoeTally* tally) const { return MoeRun{aux_scale, tally, groups_.ep, config_.kernels, groups_.cp.comm}; }
  [[nodiscard]] const costmodel::ModelSpec& model() const { return model_; }
  [[nodiscard]] const Rotary& rotary() const { return rotary_; }
  [[nodiscard]] const TensorParallel& tp() const { return groups_.tp; }
  [[nodiscard]] const ContextParallel& cp() const { return groups_.cp; }
  [[nodiscard]] const EngineConfig& config() const { return config_; }
  // Mixture of experts: the load-balancing loss's gradient weight for the current micro-batch
  // (coefficient x loss multiplier), and what the MoE layers counted since the last reset.
  [[nodiscard]] double aux_scale() const { return aux_scale_; }
  [[nodiscard]] MoeTally& moe_tally() { return moe_tally_; }
  // The float32 gradient sums the fused path adds into, one per slot of the unit (undefined for a
  // frozen unit's); empty where the fusion does not apply (engine.cpp fused_accumulation).
  [[nodiscard]] std::vector<at::Tensor> grad_sums(std::size_t unit);

 private:
  struct Pending;
  void launch_reduction(std::size_t unit, at::Tensor full_grad);
  void drain();
  [[nodiscard]] int tied_slot(std::size_t unit) const;
  [[nodiscard]] bool recompute_block(int layer) const;
  [[nodiscard]] at::Tensor run_unit_forward(std::size_t unit, const at::Tensor& x);
  [[nodiscard]] bool fused_accumulation() const;
  [[nodiscard]] at::Tensor output_weight_grad_sum(std::size_t unit);
  void refresh_compute_copies();
  void release_frozen_after(int64_t unit);
  // Whether a unit's weights are materialised only while it runs (ZeRO-3, or quantised).
  [[nodiscard]] bool gathered_on_use(std::size_t unit) const;
  void store_quantized(Unit& u, const at::Tensor& values);
  // Optimizer offload (optimizer_step).
  void offloaded_update(std::size_t unit, const AdamWSettings& settings, double lr, double gradient_multiplier, int64_t step);
  void await_update(std::size_t unit);  // until the running offloaded update has reached `unit`
  void finish_offload();                // until it has finished (rethrows its error)
  void fused_optimizer_step(const AdamWSettings& settings, double lr, double gradient_multiplier, int64_t step);

  costmodel::ModelSpec model_;
  EngineConfig config_;
  EngineGroups groups_;
  Communicator& dp_;  // the data-parallel group (groups_.dp)
  std::unique_ptr<Communicator> shard_comm_, replica_comm_;                // dense units
  std::unique_ptr<Communicator> expert_shard_comm_, expert_replica_comm_;  // expert units
  std::vector<UnitLayout> layout_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Pending> pending_;
  std::vector<std::pair<std::size_t, at::Tensor>> deferred_;  // without overlap: reduced after backward
  std::vector<std::size_t> tied_deferred_;                     // units whose reduction waits for the tied sum
  std::vector<std::pair<std::size_t, std::size_t>> chunk_ranges_;  // [begin, end) units of each chunk
  bool local_tied_ = false;  // tied embeddings with embedding and head on this rank
  std::vector<int> recomputed_layers_;  // the blocks run under full recompute (recompute_block)
  Rotary rotary_;
  bool last_micro_batch_ = false;
  PhaseTimer* timer_ = nullptr;
  double aux_scale_ = 0;
  MoeTally moe_tally_;
  int64_t first_sample_ = 0, micro_batch_size_ = 0;
  double loss_denominator_ = 0;
  at::Tensor samples_;    // the current micro-batch's sequences (dropout)
  at::Tensor positions_;  // this rank's token positions per sequence
  at::Tensor staging_;    // optimizer offload: host float32, the largest owned gradient shard
  std::thread offload_thread_;
  std::mutex offload_mutex_;
  std::condition_variable offload_cv_;
  std::size_t offload_ready_ = 0;  // units the running update has finished
  std::exception_ptr offload_error_;
  bool offload_zeroes_ = false;    // the running update zeroes the gradients
};

}  // namespace trainplan::executor
