#pragma once
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al.
// 2022) as autograd functions over the TP group:
//   enter_tp_region ("f"): before a column-parallel linear. Identity forward, all-reduce of the
//     gradient backward; with sequence parallelism an all-gather of the sequence shards forward
//     and a reduce-scatter backward.
//   leave_tp_region ("g"): after a row-parallel linear. All-reduce of the partial sums forward,
//     identity backward; with sequence parallelism a reduce-scatter to sequence shards forward
//     and an all-gather backward.
// Activations are [batch, seq, hidden]; sequence shards split dim 1. With one TP rank every
// function is the identity, so the same model code runs unsharded.

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"

namespace trainplan::executor {

struct TensorParallel {
  Communicator* comm = nullptr;  // the TP group; null = no tensor parallelism
  bool sequence_parallel = false;
  [[nodiscard]] int size() const { return comm != nullptr ? comm->size() : 1; }
  [[nodiscard]] int rank() const { return comm != nullptr ? comm->rank() : 0; }
  [[nodiscard]] bool active() const { return size() > 1; }
  [[nodiscard]] bool sharded_sequence() const { return active() && sequence_parallel; }
};

[[nodiscard]] at::Tensor enter_tp_region(const TensorParallel& tp, const at::Tensor& x);
[[nodiscard]] at::Tensor leave_tp_region(const TensorParallel& tp, const at::Tensor& x);

// Column-parallel linears of one input under sequence parallelism: enter_tp_region's all-gather
// of x's sequence shards ([b, s/tp, h] -> [b, s, h]) then linear(gathered, w) for each weight,
// keeping only the shard for backward, which gathers it again (Megatron-Core's column-parallel
// linear with sequence parallelism; Korthikanti et al. 2022, Sec. 4.2.2): 1/tp of the gathered
// input's bytes kept, one more all-gather in backward. Frozen weights (no requires_grad) get no
// gradient. REQUIRES tp.sharded_sequence().
[[nodiscard]] std::vector<at::Tensor> gathered_linears(const TensorParallel& tp, const at::Tensor& x, const std::vector<at::Tensor>& weights);

// Vocabulary-parallel embedding: `weight` holds rows [vocab_start, vocab_start + rows) of the
// token table; tokens outside it contribute zeros. Returns the partial sum ([b, s, h]) that
// leave_tp_region completes.
[[nodiscard]] at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, int64_t vocab_start);

// Mean cross-entropy over logits split by vocabulary ([n, vocab/tp], this rank's columns start at
// vocab_start) without gathering them: global max, sum of exponentials and the target logit are
// reduced over the TP group. Float32. Every TP rank returns the same loss. `denominator` > 0: the
// sum over rows with a target >= 0 (negative ones take no loss) divided by it, not the mean.
[[nodiscard]] at::Tensor vocab_parallel_cross_entropy(const TensorParallel& tp, const at::Tensor& logits,
                                                      const at::Tensor& targets, int64_t vocab_start, double denominator = 0);

}  // namespace trainplan::executor
