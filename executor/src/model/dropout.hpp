#pragma once
// Dropout whose masks depend only on where an element sits in the global batch: the sequence's
// index in the run (step, data-parallel rank and micro-batch give it, data.hpp), the token's
// position in its sequence, the feature's index in the full (unsplit) width, and the site (layer
// and place). Every parallel layout draws the same mask for the same element, so a run on 1, 2 or
// 4 ranks (DP, TP with or without sequence parallelism, CP, PP, recompute) computes the same
// losses; a recomputed forward draws its masks again identically. Each element's keep bit is a
// SplitMix64 hash (Steele et al. 2014) of those coordinates and the run's seed, taken as a
// uniform 53-bit number against the rate. The mask is kept for backward as one byte per element
// (the cost model's count, compute.cpp).

#include <cstdint>

#include <ATen/ATen.h>

namespace trainplan::executor {

struct DropoutRun {
  double hidden = 0;  // on the embedding's output and each block's attention and MLP outputs
  double lora = 0;    // on the LoRA adapters' inputs (PEFT's lora_dropout)
  uint64_t seed = 0;
  at::Tensor samples;    // [micro_batch] int64: each sequence's index in the run
  at::Tensor positions;  // [this rank's tokens per sequence] int64: their positions (context parallelism)
  int layer = -1;        // the block drawing (block_forward), -1 for the embedding
  [[nodiscard]] bool active() const { return (hidden > 0 || lora > 0) && samples.defined(); }
};

// Sites: one id per place a mask is drawn.
enum class DropoutSite : uint64_t { kEmbedding = 0, kAttention = 1, kMlp = 2, kLoraFirst = 3 };
[[nodiscard]] uint64_t dropout_site(int layer, uint64_t site);

// x [b, s, width] with x's rows at `positions` ([s]) of sequences run.samples ([b]) and its
// features feature_offset .. feature_offset + width - 1 of the full width: each element zeroed
// with probability `rate`, the rest scaled by 1 / (1 - rate). rate 0 or !run.active(): x itself.
[[nodiscard]] at::Tensor dropout(const at::Tensor& x, const DropoutRun& run, double rate, uint64_t site, const at::Tensor& positions,
                                 int64_t feature_offset);

// The keep mask alone (bool [b, s, width]), for tests.
[[nodiscard]] at::Tensor dropout_keep(const at::Tensor& samples, const at::Tensor& positions, int64_t feature_offset, int64_t width,
                                      uint64_t seed, uint64_t site, double rate);

}  // namespace trainplan::executor
