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

#include "trainplan/costmodel/model.hpp"

namespace trainplan::executor {

enum class InitKind { kNormal, kScaledNormal, kOnes, kZeros };

struct ParamSlot {
  std::string name;              // e.g. "layers.3.attention.wq.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;            // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  InitKind init = InitKind::kNormal;
  bool weight_decay = true;      // matrices decay; norms, biases and embeddings of positions do not
};

enum class UnitKind { kEmbedding, kBlock, kHead };

struct UnitLayout {
  std::string name;  // "embedding", "layers.3", "head"
  UnitKind kind = UnitKind::kBlock;
  int layer = -1;    // block index for kBlock
  std::vector<ParamSlot> slots;
  int64_t numel = 0;
};

// Units in execution order: embedding, layers.0 .. layers.L-1, head. With tied embeddings the
// output projection is the embedding unit's token table.
// REQUIRES: no mixture of experts (the executor rejects MoE models before this).
[[nodiscard]] std::vector<UnitLayout> model_layout(const costmodel::ModelSpec& model);

// Initial values of one unit into `flat` (float32, unit.numel elements): N(0, 0.02) for
// matrices, N(0, 0.02/sqrt(2L)) for the projections that feed the residual stream (GPT-2),
// ones for norm weights, zeros for biases. Deterministic in (seed, unit name), independent of
// the parallel layout.
void init_unit(const UnitLayout& unit, const costmodel::ModelSpec& model, uint64_t seed, at::Tensor& flat);

// Rotary tables for Llama-style attention: cos and sin of shape [seq, head_dim], float32.
struct Rotary {
  at::Tensor cos, sin;
};
[[nodiscard]] Rotary make_rotary(const costmodel::ModelSpec& model, int64_t seq_len, const at::Device& device);

// tokens [batch, seq] int64 -> hidden [batch, seq, h] in the parameters' dtype.
[[nodiscard]] at::Tensor embedding_forward(const costmodel::ModelSpec& model, const std::vector<at::Tensor>& params,
                                           const at::Tensor& tokens);

enum class AttentionRecompute { kNone, kSelective };

// One transformer block: x + attention(norm(x)), then + mlp(norm(x)).
[[nodiscard]] at::Tensor block_forward(const costmodel::ModelSpec& model, const std::vector<at::Tensor>& params,
                                       const at::Tensor& x, const Rotary& rotary, AttentionRecompute recompute);

// Final norm, output projection (`output_weight` [vocab, h]) and mean cross-entropy over every
// token in float32. Returns the scalar loss.
[[nodiscard]] at::Tensor head_loss(const costmodel::ModelSpec& model, const std::vector<at::Tensor>& head_params,
                                   const at::Tensor& output_weight, const at::Tensor& x, const at::Tensor& targets);

}  // namespace trainplan::executor
