#pragma once
// Context parallelism: the sequence split over the cp ranks of a group, attention over the whole
// sequence by all-gathering keys and values (Llama 3, Dubey et al. 2024, Sec. 3.3.2: "all-gather
// based CP", the same as Megatron-Core's cp_comm_type "all_gather").
//
// Causal load balancing: the sequence is cut into 2 cp equal chunks and rank r holds chunks r and
// 2cp-1-r (Megatron-Core, torchtitan), so every rank's queries see the same number of earlier keys.
// Per layer and micro-batch each rank all-gathers K and V ([b, kv_heads, seq/cp, head_dim] each)
// in the forward and reduce-scatters their gradients in the backward; the gathered keys and
// values (in global order) are what attention keeps for its backward. Each of the rank's two
// query chunks attends only the keys up to its own end (chunk j: (j + 1) seq/2cp keys, a causal
// mask on the last chunk), so a rank computes (2cp + 1) / 4cp of the full seq/cp x seq rectangle,
// against 1/2 for an ideal causal kernel. The cost model describes this algorithm
// (stack.hpp ContextAttention::kAllGatherKv), its work and its bytes (compute.cpp).
//
// Rotary angles and learned positions are those of the global sequence (`positions`).

#include <cstdint>

#include <ATen/ATen.h>

#include "comm.hpp"

namespace trainplan::executor {

struct ContextParallel {
  Communicator* comm = nullptr;  // the CP group (same tp, pp, dp); null = no context parallelism
  at::Tensor positions;          // int64 [seq/cp]: global positions of this rank's tokens (CP only)
  at::Tensor key_order;          // int64 [seq]: the gathered keys (rank order) in global order
  // Per query chunk (this rank's first and second): the keys it attends, a prefix of the global
  // order, and its additive mask [seq/2cp, keys] (0 or -inf) in the compute dtype, made once and
  // shared by every layer (a boolean mask would be converted, and kept, per attention call), its
  // rows 16-element aligned as the memory-efficient GPU kernel wants them.
  int64_t chunk_keys[2] = {0, 0};
  at::Tensor chunk_mask[2];
  [[nodiscard]] int size() const { return comm != nullptr ? comm->size() : 1; }
  [[nodiscard]] bool active() const { return size() > 1; }
};

// Global positions of the tokens rank `rank` of `cp` holds in a sequence of `seq` tokens: chunks
// `rank` and 2cp-1-rank of 2cp equal chunks, in that order. REQUIRES: seq % (2 cp) == 0.
[[nodiscard]] at::Tensor context_positions(int64_t seq, int cp, int rank);

// The group's context for sequences of `seq` tokens, positions and mask on `device`. `comm` null
// or of one rank: inactive.
[[nodiscard]] ContextParallel make_context_parallel(Communicator* comm, int64_t seq, const at::Device& device, at::ScalarType dtype);

// This rank's tokens of `x` ([batch, seq, ...]): the columns at cp.positions. Identity without CP.
[[nodiscard]] at::Tensor context_slice(const ContextParallel& cp, const at::Tensor& x);

// Keys or values of every CP rank ([b, heads, seq/cp, d] -> [b, heads, seq, d], global order)
// with a reduce-scatter of the gradient in backward. Identity without CP.
[[nodiscard]] at::Tensor gather_context(const ContextParallel& cp, const at::Tensor& x);

}  // namespace trainplan::executor
