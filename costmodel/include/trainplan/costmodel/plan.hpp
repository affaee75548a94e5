#pragma once
// Plan: what to train (model), where (cluster, GPU count), how (training settings) and with
// which parallel layout; the `trainplan/plan/v1` document. A PlanRequest may leave parallel
// fields open ("auto" or omitted) for the planner to search; a Plan has all of them fixed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

enum class Precision { kFp32, kBf16, kFp16, kFp8 };
enum class OptimizerKind { kAdamW, kSgdMomentum, kAdafactor, kAdam8bit };
enum class TrainingMode { kPretrain, kFull, kLora, kQlora };
enum class Schedule { kGpipe, kOneFOneB, kInterleaved };
enum class Recompute { kNone, kSelective, kFull };
enum class Offload { kNone, kCpu, kNvme };
enum class AttentionKernel { kFlash, kStandard };
// How causality reaches the attention kernel: its own causal flag, which skips the key blocks
// above the diagonal (SDPA's is_causal, flash-attn's causal=True), or an explicit mask tensor
// (a padded batch, or a module that always builds one), which the kernel applies to the whole
// seq x seq rectangle.
enum class AttentionMask { kCausal, kExplicit };
enum class QuantFormat { kNf4, kInt8 };
// How PyTorch's CUDA caching allocator holds memory (PYTORCH_ALLOC_CONF, formerly
// PYTORCH_CUDA_ALLOC_CONF): its default, which keeps each freed block for a later request of its
// size or less, or expandable_segments:True (torchtitan's run_train.sh sets it), which maps
// pages into one growing segment per stream and, when memory runs short, unmaps every empty
// page so fragmentation no longer needs memory of its own (estimate.cpp, the reserve).
enum class Allocator { kCaching, kExpandableSegments };

const char* precision_name(Precision p);
const char* optimizer_name(OptimizerKind o);
const char* mode_name(TrainingMode m);
const char* schedule_name(Schedule s);
const char* recompute_name(Recompute r);
const char* offload_name(Offload o);
const char* allocator_name(Allocator a);  // "caching", "expandable-segments"
std::optional<Allocator> allocator_from_name(const std::string& name);
// The PYTORCH_ALLOC_CONF value a launch sets for `a` (empty for the default).
const char* allocator_conf(Allocator a);
// The allocator a PYTORCH_ALLOC_CONF value runs: expandable segments where it holds
// "expandable_segments:True" (spaces allowed around the colon, as PyTorch's tokenizer allows:
// c10/core/AllocatorConfig.cpp), else PyTorch's default.
Allocator allocator_of_conf(const std::string& conf);

struct LoraConfig {
  int rank = 16;
  // Linear layers that carry adapters: any of q, k, v, o, gate, up, down.
  std::vector<std::string> targets = {"q", "k", "v", "o"};
  QuantFormat base_format = QuantFormat::kNf4;  // QLoRA only: storage of the frozen base weights
  // An adapter adds (alpha / rank) x B A x to its projection's output (Hu et al. 2021; PEFT's
  // lora_alpha), with dropout of this probability on the adapter's input x. Defaults: 16, 0.
  double alpha = 16.0;
  double dropout = 0.0;
  [[nodiscard]] double scale() const { return alpha / rank; }
  // Whether the adapters include this projection ("q", "gate", ...).
  [[nodiscard]] bool targets_include(const std::string& name) const {
    for (const std::string& t : targets) {
      if (t == name) return true;
    }
    return false;
  }
};

// The most tokens a plan may train: a guard against absurd input, above the default (20 per
// parameter) of the largest model a model document allows (10,000 layers of 65,536 experts of
// width 2^22 over hidden 2^20: about 8.6e21 parameters, 1.7e23 tokens).
inline constexpr double kMaxTrainTokens = 1e24;

struct TrainingConfig {
  std::int64_t seq_len = 0;        // tokens per sequence; 0 = the model's max_seq_len
  std::int64_t global_batch = 0;   // sequences per optimizer step; 0 = default (see resolve_defaults)
  Precision precision = Precision::kBf16;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  TrainingMode mode = TrainingMode::kPretrain;
  LoraConfig lora;
  double train_tokens = 0;         // tokens to train; 0 = default (20 per parameter when pretraining)
  bool dropout = false;            // dropout layers present (stores masks, costs time)
  double dropout_rate = 0.1;       // their probability (the embedding's and each block's two residual branches)
  AttentionKernel attention = AttentionKernel::kFlash;
  AttentionMask attention_mask = AttentionMask::kCausal;
  // The loss kernel (stack.hpp LossKernel); empty: the stack's own. A plan states its own where
  // the training script swaps it (flash-attn's or Liger's fused cross-entropy on an FSDP stack).
  std::optional<LossKernel> loss;
  // The fused attention kernel (kernels.hpp AttentionImpl: the profile's measured table,
  // FlashAttention-2 or -3); empty: the stack's own. A plan states its own where the training
  // script picks another (flash-attn's hopper/ build, Hugging Face's attn_implementation).
  std::optional<AttentionImpl> attention_kernel;
  // fp8 training's scaling recipe (stack.hpp Fp8Recipe); empty: the stack's own (delayed for
  // megatron-te, Megatron's default; current for the others).
  std::optional<Fp8Recipe> fp8_recipe;
  // fp8 training under FSDP2 (a stack with StackSpec::fp8_all_gather) with torchao's
  // enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp: each linear
  // layer's sharded weight is cast to fp8 before its all-gather with a scale computed once a step
  // after the optimizer, so the all-gathers move 1 byte per such parameter instead of 2 and no
  // gathered weight is cast again (plan key training.fp8_all_gather; those stacks scale fp8 tensorwise).
  bool fp8_all_gather = false;
  // false: pure 16-bit training (bf16/fp16 only): the parameters are the 16-bit tensors, with
  // their gradients and optimizer states in the same dtype and no fp32 master copy (a Hugging Face
  // model loaded in bf16 and sharded by FSDP without mixed precision). estimate.hpp StateWidths.
  bool master_weights = true;
  // PyTorch's CUDA allocator setting the run starts with (plan key training.allocator; exports
  // and launch scripts set PYTORCH_ALLOC_CONF to match). Default: PyTorch's own.
  Allocator allocator = Allocator::kCaching;
  // The software stack the prediction is for (stack.hpp): which kernels are fused, which tensors
  // are kept, how the loss and the optimizer run. Default: this project's executor.
  Stack stack = Stack::kTrainplan;
};

struct ParallelConfig {
  int tp = 1;                      // tensor parallel (within a node, innermost axis)
  int pp = 1;                      // pipeline stages
  int dp = 1;                      // data parallel replicas (ZeRO shards over this axis)
  int cp = 1;                      // context parallel (ring attention over sequence chunks)
  int ep = 1;                      // expert parallel, carved out of dp; REQUIRES dp % ep == 0
  bool sequence_parallel = false;  // Megatron SP; meaningful only with tp > 1
  int zero_stage = 0;              // 0 DDP, 1 optimizer, 2 +gradients, 3 +parameters (FSDP full shard)
  int shard_group = 0;             // ZeRO-3 hybrid shard group size; 0 = dp (shard over all of dp)
  int micro_batch = 1;             // sequences per micro-batch per replica
  int virtual_stages = 1;          // model chunks per pipeline rank (interleaved 1F1B)
  Schedule schedule = Schedule::kOneFOneB;
  Recompute recompute = Recompute::kNone;
  int recompute_layers = 0;        // with recompute "full": layers per stage recomputed; 0 = all
  // Layers of the first and last pipeline stages (Megatron's --decoder-first/last-pipeline-num-
  // layers), each split evenly over the stage's virtual stages, the rest spread over the others;
  // 0: every stage's layers balanced by their time, the embedding's and the loss's included.
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // The embedding and the loss each count as one layer of the pipeline split (Megatron-Core's
  // --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split, NeMo's
  // recipes; Llama 3, Dubey et al. 2024 Sec. 3.3.2): layers + 2 split evenly over pp x
  // virtual_stages model chunks, the first chunk one layer short (the embedding's place), the last
  // one too (the loss's). REQUIRES (layers + 2) % (pp x virtual_stages) == 0, pp > 1.
  bool ends_in_split = false;
  Offload offload_optimizer = Offload::kNone;  // optimizer states (+ master weights) and step on CPU/NVMe
  Offload offload_params = Offload::kNone;     // ZeRO-Infinity: sharded parameters kept off the GPU
  std::int64_t fsdp_wrap_min_params = 0;       // FSDP unit size: 0 = one unit per transformer block
  bool prefetch = true;                        // FSDP/ZeRO-3 forward/backward prefetch of the next unit
  Dtype reduce_dtype = Dtype::kFp32;           // gradient reduction dtype for data parallelism
  // Gradient reduction overlaps the backward pass (DDP, FSDP, Megatron --overlap-grad-reduce);
  // false: it runs after the last backward (Megatron-LM before 2023).
  bool overlap_grad_reduce = true;
  // How context parallelism moves K/V (stack.hpp ContextAttention: Megatron-Core's --cp-comm-type
  // p2p, the ring, or all_gather); empty: the stack's own.
  std::optional<ContextAttention> cp_comm;

  [[nodiscard]] int gpus() const { return tp * pp * dp * cp; }
  [[nodiscard]] int shard_size() const { return zero_stage == 3 && shard_group > 0 ? shard_group : dp; }
};

// Which parallel fields the user fixed; unset fields are searched by the planner.
struct ParallelConstraints {
  std::optional<int> tp, pp, dp, cp, ep, zero_stage, shard_group, micro_batch, virtual_stages;
  std::optional<bool> sequence_parallel;
  std::optional<Schedule> schedule;
  std::optional<Recompute> recompute;
  int recompute_layers = 0;
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  std::optional<bool> ends_in_split;  // empty: searched where the stack splits that way (false in a fixed plan)
  std::optional<Offload> offload_optimizer;
  Offload offload_params = Offload::kNone;
  std::int64_t fsdp_wrap_min_params = 0;
  bool prefetch = true;
  Dtype reduce_dtype = Dtype::kFp32;
  bool overlap_grad_reduce = true;
  std::optional<ContextAttention> cp_comm;
  [[nodiscard]] bool fully_fixed() const;
  // REQUIRES: fully_fixed().
  [[nodiscard]] ParallelConfig fixed() const;
  // The constraints that fix every setting of `config` (fixed() of them gives it back).
  [[nodiscard]] static ParallelConstraints of(const ParallelConfig& config);
};

struct PlanRequest {
  std::string name;
  std::string model_ref;     // what the document named ("llama3-70b", a path, or "inline")
  std::string cluster_ref;
  ModelSpec model;
  HardwareProfile cluster;
  int gpus = 0;
  TrainingConfig training;
  ParallelConstraints parallel;
};

struct Plan {
  std::string name;
  std::string model_ref;
  std::string cluster_ref;
  ModelSpec model;
  HardwareProfile cluster;
  int gpus = 0;
  TrainingConfig training;
  ParallelConfig parallel;
};

// Fills seq_len, global_batch and train_tokens left at 0 with their documented defaults:
// seq_len = max_seq_len; global_batch = 4 Mi tokens / seq_len when pretraining, 128 otherwise;
// train_tokens = 20 x parameters (Chinchilla) when pretraining, 1e9 otherwise, and at least one
// step (global_batch x seq_len).
void resolve_training_defaults(const ModelSpec& model, TrainingConfig& training);

// The gradient reduction dtype a request starts with: the parameters' own 16-bit dtype in pure
// 16-bit training (FSDP without mixed precision reduces in it), else the stack's default
// (StackSpec::reduce_dtype). `planner --stack/--pure-16bit` and the GUI start from it.
[[nodiscard]] Dtype default_reduce_dtype(const TrainingConfig& training);

// Parses a plan document. Model and cluster may be preset names, paths (relative paths are
// tried as given, then beside `file`), or inline documents.
[[nodiscard]] Result<PlanRequest> parse_plan(const nlohmann::json& json, const std::string& file);
[[nodiscard]] Result<PlanRequest> parse_plan_text(const std::string& text, const std::string& file);
[[nodiscard]] Result<PlanRequest> load_plan_file(const std::string& path);
// The files a plan or measurement document at `path` names as its "model" and "cluster" (paths
// resolved as parse_plan resolves them; presets and inline documents are no files), so that no
// output replaces them. Empty where the document is not a regular file (a pipe is read once, by
// the command) or cannot be read (reading it reports that).
[[nodiscard]] std::vector<std::string> referenced_files(const std::string& path);

// Structural checks of a fixed plan (divisibility, products, supported combinations).
// Returns the first violated rule as an error, e.g.
// "tp(8) * cp(1) * pp(4) * dp(4) = 128 != gpus(64)". Not fitting in memory is no error.
[[nodiscard]] Result<bool> validate_plan(const Plan& plan);
// Checks constraints alone against model and GPU count (for early, clear CLI errors).
[[nodiscard]] Result<bool> validate_request(const PlanRequest& request);
// The fixed plan a request describes, unset parallel fields taking their documented defaults
// (tp = pp = cp = ep = 1, dp = the remaining GPUs, ZeRO 0, micro-batch 1, no recompute, SP on
// when tp > 1), checked with validate_plan. What `planner evaluate` and the executor run.
[[nodiscard]] Result<Plan> plan_with_defaults(const PlanRequest& request);
// The layout fields a runnable plan must state (tp, pp, dp, zero_stage, micro_batch) that
// `request` leaves open; empty when it can be run (the rest take plan_with_defaults' defaults).
[[nodiscard]] std::vector<std::string> unset_layout_fields(const ParallelConstraints& constraints);

[[nodiscard]] nlohmann::json plan_to_json(const Plan& plan, bool inline_documents = false);
[[nodiscard]] nlohmann::json parallel_to_json(const ParallelConfig& p);
[[nodiscard]] nlohmann::json training_to_json(const TrainingConfig& t);

}  // namespace trainplan::costmodel
