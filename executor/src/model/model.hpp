#pragma once
// The decoder the executor trains, built from the cost model's ModelSpec: GPT-style (LayerNorm
// with bias, learned positions, GELU MLP, biases) or Llama-style (RMSNorm, rotary positions,
// SwiGLU, grouped-query attention, no biases). Parameters live in per-unit flat buffers (the
// embedding, each transformer block, the head) so data-parallel sharding works on whole units;
// the forward functions here take the unit's parameter views and hold no state.
// Parameter counts equal costmodel::count_parameters exactly (tests check it).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "context_parallel.hpp"
#include "dropout.hpp"
#include "fused_ops.hpp"
#include "moe.hpp"
#include "tensor_parallel.hpp"
#include "trainplan/costmodel/model.hpp"

namespace trainplan::executor {

// kFanInUniform: U(-1/sqrt(in), 1/sqrt(in)), in = the matrix's full input width (PEFT's
// kaiming_uniform_(a=sqrt(5)) of a LoRA A matrix).
enum class InitKind { kNormal, kScaledNormal, kOnes, kZeros, kFanInUniform };

// How a parameter's gradient is completed across the TP group before data-parallel reduction.
enum class GradSum {
  kNone,            // sharded, or replicated with identical gradients on every TP rank
  kTensorParallel,  // replicated, each TP rank holding part of the gradient (sequence parallelism)
  kKvGroup,         // a key/value head replicated over tp / kv_heads ranks (tp > kv_heads)
};

struct ParamSlot {
  std::string name;              // e.g. "layers.3.attention.wq.weight"
  std::vector<int64_t> shape;    // this rank's piece
  std::vector<int64_t> full_shape;  // the whole parameter (equal to shape without TP)
  int split_dim = -1;            // the dim TP splits, -1 when replicated
  int shard_index = 0;           // this rank's piece along split_dim, of shard_count equal pieces
  int shard_count = 1;
  bool primary = true;           // the first TP rank holding this piece (counts it in norms, exports it)
  bool tied_copy = false;        // pp > 1 with tied embeddings: the last stage's copy of the token table
  GradSum grad_sum = GradSum::kNone;
  int64_t offset = 0;            // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  InitKind init = InitKind::kNormal;
  bool weight_decay = true;      // matrices decay; norms, biases and embeddings of positions do not
  int expert = -1;               // mixture of experts: the (global) expert this matrix belongs to
};

// kExperts: the routed experts of an MoE block that this rank holds, a unit of their own right
// after the block's (their gradients are reduced over another group; engine.hpp).
// kAdapters: a block's LoRA adapters, likewise right after it (the block itself is frozen).
enum class UnitKind { kEmbedding, kBlock, kExperts, kAdapters, kHead };

struct UnitLayout {
  std::string name;  // "embedding", "layers.3", "layers.3.experts", "layers.3.lora", "head"
  UnitKind kind = UnitKind::kBlock;
  int layer = -1;    // block index for kBlock, kExperts and kAdapters
  std::vector<ParamSlot> slots;
  int64_t numel = 0;
  bool frozen = false;  // LoRA: no gradient, no optimizer state, only the compute-dtype weights
};

// LoRA (Hu et al. 2021): every base parameter frozen, and each targeted projection W of every
// block given an adapter, y = W x + scale x B (A x), A [rank x in], B [out x rank]; A starts
// U(-1/sqrt(in), 1/sqrt(in)) and B at zero (PEFT), so training starts from the base model.
// Targets: q, k, v, o (attention.wq..wo), gate, up, down (mlp.gate..down).
struct LoraSpec {
  int rank = 0;  // 0: no adapters, every parameter trained
  double scale = 0;  // alpha / rank
  std::vector<std::string> targets;
  [[nodiscard]] bool active() const { return rank > 0; }
  [[nodiscard]] bool has(const std::string& target) const;
};
// The targets in the order their adapters sit in a layers.L.lora unit (each A then B).
[[nodiscard]] const std::vector<std::string>& lora_target_order();
// "attention.wq" for "q", ..., "mlp.down" for "down": the base projection's slot name without
// the layer prefix and ".weight".
[[nodiscard]] std::string lora_base_slot(const std::string& target);

// How this rank's copy of the model is cut (tensor_parallel.hpp for the operators).
struct ModelSharding {
  int tp = 1, tp_rank = 0;
  bool sequence_parallel = false;
  // The embedding and the output layer are tied but live on different pipeline stages: the head
  // unit gets its own copy of the token table (`head.output.weight`, tied_copy), kept equal to
  // the embedding's by summing their gradients (Megatron's embedding group).
  bool split_tied_embedding = false;
  // Expert parallelism: this rank holds experts [ep_rank x E/ep, (ep_rank + 1) x E/ep) of every
  // MoE layer (parallel_dims.hpp).
  int ep = 1, ep_rank = 0;
  // LoRA: base units frozen, a "layers.L.lora" adapters unit after each block (LoraSpec).
  LoraSpec lora;
};

// Units in execution order: embedding, layers.0 .. layers.L-1, head, with this rank's TP pieces:
// q/k/v, MLP up/gate/fc1 column-parallel (split dim 0), attention output and MLP down/fc2
// row-parallel (split dim 1), token table and output layer split by vocabulary (dim 0), norms
// and row-parallel biases replicated. Key/value heads are split when tp <= kv_heads, else each
// rank holds the one its query heads use. With tied embeddings (and no split) the output
// projection is the embedding unit's token table.
// Mixture-of-experts layers (is_moe_layer) hold the router `moe.router.weight` [experts, h] in
// place of the MLP, and are followed by a kExperts unit "layers.L.experts" with this rank's
// experts' `layers.L.moe.experts.E.{gate,up,down}.weight` (moe.hpp); block_forward takes the
// block's parameters followed by the experts'.
// REQUIRES: tp divides heads, ffn_hidden and vocab, and tp and kv_heads divide one another; with
// experts, tp = 1 and a Llama-style (SwiGLU) block (checked by the trainer).
[[nodiscard]] std::vector<UnitLayout> model_layout(const costmodel::ModelSpec& model, const ModelSharding& sharding = {});
// True when block `layer`'s MLP is a mixture of experts (after moe.dense_layers dense ones).
[[nodiscard]] bool is_moe_layer(const costmodel::ModelSpec& model, int layer);

// Initial values of one unit into `flat` (float32, all unit.numel elements written): N(0, 0.02) for
// matrices, N(0, 0.02/sqrt(2L)) for the projections that feed the residual stream (GPT-2),
// ones for norm weights, zeros for biases. Deterministic in (seed, unit name) for the whole
// unit, then cut to this rank's pieces, so every layout starts from the same model; drawn in
// chunks of 2^20 values on all of ATen's threads, each chunk from its own seeded generator, so
// the values do not depend on the thread count either.
// `lora`: the layout's LoRA adapters (ModelSharding::lora), which adapters units are cut from.
void init_unit(const UnitLayout& unit, const costmodel::ModelSpec& model, uint64_t seed, at::Tensor& flat, const LoraSpec& lora = {});

// This rank's piece of a whole parameter (`full` has slot.full_shape): a view of `full` (strided
// when cut along a later dim), for the caller to copy where the piece lives.
[[nodiscard]] at::Tensor slot_piece(const ParamSlot& slot, const at::Tensor& full);

// Rotary tables for Llama-style attention: cos and sin of shape [seq, head_dim], computed in
// float32 and stored in `dtype` (the compute dtype: converted once, not per layer and micro-batch).
struct Rotary {
  at::Tensor cos, sin;
};
[[nodiscard]] Rotary make_rotary(const costmodel::ModelSpec& model, int64_t seq_len, const at::Device& device,
                                 at::ScalarType dtype = at::kFloat);

// tokens [batch, seq] int64 -> hidden [batch, seq, h] (sequence parallel: [batch, seq/tp, h])
// in the parameters' dtype. Under context parallelism `tokens` are this rank's (seq/cp of them) and
// learned positions are those of the global sequence (cp.positions). `table_grad_sum` (without TP only): the token table's float32
// gradient sum, which its gradient is scattered into (fused_ops.hpp embedding_into).
[[nodiscard]] at::Tensor embedding_forward(const costmodel::ModelSpec& model, const TensorParallel& tp, const ContextParallel& cp,
                                           const std::vector<at::Tensor>& params, const at::Tensor& tokens,
                                           const at::Tensor& table_grad_sum = {});

enum class AttentionRecompute { kNone, kSelective };

// One transformer block: x + attention(norm(x)), then + mlp(norm(x)). Kernels::kFused takes
// fused_ops.hpp's paths for Llama-style blocks: rotary and SwiGLU always, the norm recomputed in
// backward without TP (with TP the norm's output enters the TP region, so it stays as is).
// `grad_sums` (empty, or one float32 tensor per parameter, undefined where none): on the fused
// path without TP the weight matrices' gradients are added into their sums by the weight-gradient
// GEMMs (gradient-accumulation fusion, fused_ops.hpp) and do not come out of backward; elsewhere
// they are ignored. Under context parallelism (cp.active()) `x` holds this rank's tokens, `rotary`
// their rows, and attention runs over the whole sequence's keys and values (context_parallel.hpp).
// An MoE layer routes with `moe` (load-balancing loss weight, where to count; moe.hpp).
// With `lora` active the block's parameters are followed by its adapters unit's (LoraSpec); the
// row-parallel adapters (o, down) add their partial sums before the TP reduction, as the base does.
// `dropout` (dropout.hpp) drops the attention and MLP outputs before their residual adds and the
// adapters' inputs; with adapter dropout the norms are not fused into the linears (the adapters
// need the normalised input itself). `fp8` (dense Llama-style blocks): the linear layers' GEMMs on
// fp8 operands (fp8.hpp), LoRA's adapters in the compute dtype; under sequence parallelism the
// column-parallel linears then take the gathered norm output through enter_tp_region.
[[nodiscard]] at::Tensor block_forward(const costmodel::ModelSpec& model, const TensorParallel& tp, const ContextParallel& cp,
                                       const std::vector<at::Tensor>& params, const at::Tensor& x, const Rotary& rotary,
                                       AttentionRecompute recompute, Kernels kernels,
                                       const std::vector<at::Tensor>& grad_sums = {}, const MoeRun& moe = {}, const LoraSpec& lora = {},
                                       const DropoutRun& dropout = {}, bool fp8 = false);

// Final norm, output projection (`output_weight`: this rank's [vocab/tp, h] rows) and mean
// cross-entropy over every token in float32 (vocabulary-parallel under TP). Returns the scalar loss.
// Kernels::kFused without TP: the chunked linear_cross_entropy (no [tokens x vocab] float32 logits),
// which adds the output weight's gradient times `loss_multiplier` straight into
// `output_weight_grad_sum` when that is given (see linear_cross_entropy).
[[nodiscard]] at::Tensor head_loss(const costmodel::ModelSpec& model, const TensorParallel& tp,
                                   const std::vector<at::Tensor>& head_params, const at::Tensor& output_weight,
                                   const at::Tensor& x, const at::Tensor& targets, Kernels kernels,
                                   const at::Tensor& output_weight_grad_sum = {}, double loss_multiplier = 1.0, double denominator = 0);

// Final norm and output projection without a loss, one rank (no TP): float32 logits [.., vocab].
[[nodiscard]] at::Tensor head_logits(const costmodel::ModelSpec& model, const std::vector<at::Tensor>& head_params,
                                     const at::Tensor& output_weight, const at::Tensor& x);

}  // namespace trainplan::executor
