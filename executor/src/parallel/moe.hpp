#pragma once
// Mixture-of-experts MLP (Mixtral-style): a router picks each token's top-k experts by softmax
// probability, their weights renormalised over the k; each expert (a SwiGLU MLP) takes the tokens
// routed to it up to its capacity, and the token's output is the weighted sum of its kept experts'
// outputs (a dropped assignment contributes nothing; the token keeps its residual). The
// load-balancing loss (Switch Transformer) is added to the training loss through the backward
// pass (AttachAuxLoss), so it reaches the router on any pipeline stage.
//
// Capacity is counted per rank and micro-batch: ceil(capacity_factor x tokens x top_k / experts),
// filled in GShard's order: every token's first choice before any second choice, tokens in order.
// Under context parallelism a rank's tokens are its part of each sequence, so capacity is per CP
// rank (as in Megatron-Core): only dropless routing drops what one rank with whole sequences would.

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "fused_ops.hpp"
#include "trainplan/costmodel/model.hpp"

namespace trainplan::executor {

struct Routing {
  at::Tensor probs;    // [T, E] float32: softmax of the router logits
  at::Tensor experts;  // [T, k] int64: the chosen experts, most probable first
  at::Tensor weights;  // [T, k] float32: their probabilities renormalised over the k
  at::Tensor kept;     // [T, k] bool: false where the expert was already full
};

// Tokens one expert takes: ceil(capacity_factor x tokens x top_k / experts); 0 (no limit) when
// capacity_factor is 0.
[[nodiscard]] int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor);

// Routes T tokens given their router logits [T, E] (any float dtype; computed in float32).
// capacity 0: no limit.
[[nodiscard]] Routing route(const at::Tensor& logits, int top_k, int64_t capacity);

// experts x sum_e f_e P_e, f_e the share of the top-k assignments (before capacity) routed to e,
// P_e the mean probability of e over the tokens: 1 when perfectly balanced. A float32 scalar
// with the router's graph. With `sequence` (context parallelism: the ranks holding the rest of
// each sequence; collective) f_e and P_e are over the whole sequence, as Megatron-Core reduces
// the counts over its TP x CP group: this rank's value is the group size times its tokens' part
// of the sum, so the group's mean, which the gradient average over CP ranks takes, is the whole
// sequence's loss.
[[nodiscard]] at::Tensor load_balancing_loss(const Routing& routing, Communicator* sequence = nullptr);

// What the MoE layers did over a step on this rank (read once per step).
struct MoeTally {
  at::Tensor dropped;        // top-k assignments dropped by capacity (int64 scalar, host)
  at::Tensor aux_sum;        // sum of the layers' load-balancing losses, before the coefficient (device)
  double assignments = 0;    // top-k assignments
  int64_t layer_passes = 0;  // layer forward passes counted (layers x micro-batches)
  std::vector<double> kept_per_expert;  // assignments each expert took (after capacity)
  void reset() { *this = MoeTally{}; }
};

struct MoeRun {
  double aux_scale = 0;        // gradient weight of the load-balancing loss: coefficient x loss multiplier
  MoeTally* tally = nullptr;   // where to count (null: a recompute pass, already counted)
  Communicator* ep = nullptr;  // the expert-parallel group (null or one rank: every expert is here)
  Kernels kernels = Kernels::kReference;  // kFused: the experts' SwiGLU keeps gate and up only (fused_ops.hpp)
  Communicator* sequence = nullptr;  // context parallelism: the load-balancing loss over the whole sequence
};

// The MoE MLP of one block on the normed input `x` [b, s, h]: `params` are the router [E, h],
// then each of this rank's experts' gate [f, h], up [f, h] and down [h, f]. `grad_sums`: empty,
// or one float32 sum per parameter that its weight-gradient GEMM adds into (gradient-accumulation
// fusion, fused_ops.hpp), as the dense MLP's.
[[nodiscard]] at::Tensor moe_mlp(const costmodel::MoeSpec& moe, const at::Tensor& x, const std::vector<at::Tensor>& params,
                                 const MoeRun& run, const std::vector<at::Tensor>& grad_sums = {});

}  // namespace trainplan::executor
