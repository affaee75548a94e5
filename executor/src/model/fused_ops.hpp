#pragma once
// The executor's fused paths (`--kernels fused`, the default): autograd functions that keep fewer
// tensors for backward and run fewer passes over memory than the plain composition of ATen
// operators in model.cpp (`--kernels reference`), with the same arithmetic in the same dtypes, so
// the two agree within rounding (tests/executor_fused_test.cpp on CPU; bench/results.md on GPU).
// Each is LibTorch on CPU (the fallback the CPU tests check) and, for bf16 on a GPU, runs
// cuda_kernels.hpp's kernels where the build has them.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace trainplan::executor {

enum class Kernels { kReference, kFused };
// "fused" or "reference"; anything else throws std::invalid_argument naming the choices.
[[nodiscard]] Kernels parse_kernels(const std::string& name);
[[nodiscard]] const char* kernels_name(Kernels kernels);
// Whether this build has cuda_kernels.hpp's kernels (a CUDA compiler was found): then the fused
// paths run them for bf16 tensors on a GPU, else LibTorch operators everywhere.
[[nodiscard]] bool have_cuda_kernels();

// Gradient-accumulation fusion (Megatron's gradient_accumulation_fusion): a weight given a
// `grad_sum` (float32, the weight's shape, contiguous) has its gradient added into that sum by
// its weight-gradient GEMM (on a GPU with 16-bit inputs: one cuBLAS GEMM with a float32 output
// and beta = 1), and backward returns none for it: no 16-bit gradient tensor, no add pass into
// the caller's float32 buffer. Without a sum (an undefined tensor) the gradient comes out of
// backward as usual. The gradient added is the one backward would return (already times the
// caller's loss multiplier), summed in float32 instead of rounded to 16 bits first.

// at::rms_norm(x, {h}, weight, eps), keeping for backward what CUDA's fused kernel keeps: the
// input and the float32 reciprocal RMS per row. On CUDA it is at::rms_norm; on CPU, where
// at::rms_norm is ATen's composite (which also keeps the normalised input, one more [.., h]
// tensor), an autograd function with the same forward and the composite's backward, so a CPU
// rank holds the activations a GPU rank holds.
[[nodiscard]] at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// rms_norm(x, norm_weight) then linear(normed, w) for each w, keeping x (not the normed
// activation, which each linear would keep) for backward, where the norm is recomputed.
// x: [..., h]; each w: [out_i, h]. Returns one [..., out_i] tensor per weight. `grad_sums`: empty,
// or one entry per weight, and `norm_grad_sum` the norm weight's (see above). The input gradients
// of the linears are summed by the GEMMs themselves (beta = 1), not by separate adds; for bf16 on
// a GPU the norm's backward is one CUDA kernel (input gradient and the weight's partial sums).
// `residual`: x is also returned, last, for the residual stream to go on from (a view of x, no
// copy); its gradient is added to the norm's input gradient inside the norm's backward (the
// kernel's pass, on a GPU), where autograd would otherwise add the two branches' gradients of x
// in a pass of its own. `branch` (x's shape): the norm's input is x + branch, the residual add
// before it (for bf16 on a GPU in the norm's kernel, and the stream returned is that sum).
// `fp8_weights`: the first that many weights train in fp8 (fp8.hpp; the normalised input cast
// once for them, recomputed and cast again in backward), the rest (LoRA's A matrices) in x's dtype.
[[nodiscard]] std::vector<at::Tensor> norm_linears(const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                                                   const std::vector<at::Tensor>& weights,
                                                   const std::vector<at::Tensor>& grad_sums = {},
                                                   const at::Tensor& norm_grad_sum = {}, bool residual = false,
                                                   const at::Tensor& branch = {}, std::size_t fp8_weights = 0);

// linear(x, w) (no bias) with the weight's gradient added into `grad_sum` (see above; without one,
// returned by backward). `fp8`: the three GEMMs on fp8 operands (fp8.hpp), keeping x's fp8 copy
// for backward instead of x.
[[nodiscard]] at::Tensor linear_into(const at::Tensor& x, const at::Tensor& w, const at::Tensor& grad_sum, bool fp8 = false);

// embedding(table, tokens) with the table's gradient added into `grad_sum` (float32, the table's
// shape) by one accumulating scatter of the rows used (no dense 16-bit [vocab x h] gradient).
[[nodiscard]] at::Tensor embedding_into(const at::Tensor& table, const at::Tensor& tokens, const at::Tensor& grad_sum);

// cat(-x2, x1) over the halves of the last dim (the rotary "rotate half").
[[nodiscard]] at::Tensor rotate_half(const at::Tensor& x);

// Rotary "rotate half" (x * cos + rotate_half(x) * sin), keeping nothing of x for backward (its
// backward is the inverse rotation). cos, sin: [seq, head_dim] in x's dtype.
[[nodiscard]] at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up keeping gate and up, not silu(gate) (recomputed in backward): the product for a
// down projection with a LoRA adapter, which keeps it as the adapter's input.
[[nodiscard]] at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// linear(silu(gate) * up, down), keeping gate and up but not their product (recomputed in
// backward: one element-wise pass instead of [tokens x ffn] bytes held per layer).
// `down_grad_sum`: see gradient-accumulation fusion above. `fp8`: the down projection's GEMMs on
// fp8 operands (fp8.hpp), the product recomputed and cast again in backward.
[[nodiscard]] at::Tensor swiglu_down(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                                     const at::Tensor& down_grad_sum = {}, bool fp8 = false);

// Mean cross-entropy of linear(x, weight) against `targets`, in float32, taken `chunk_tokens`
// rows at a time: the gradients of x and weight are computed in forward (the loss is the end of
// the graph), so at most one chunk of logits exists, never [tokens x vocab] in float32.
// x: [n, h]; weight: [vocab, h]; targets: [n] int64; chunk_tokens 0: cross_entropy_chunk_tokens
// for x's dtype (a chunk's logits are kept in it: the CUDA kernel's bf16, or the ATen path's, which
// takes 16-bit logits through float32 a block of rows at a time).
// `multiplier`: what the caller multiplies the returned loss by before backward (the engine's
// loss multiplier: 1/accumulation, times the loss scale with fp16). The gradients are computed
// times it in forward, before their rounding to the compute dtype, as the reference path's
// backward scales before it rounds; backward then applies d(final)/d(loss) / multiplier, 1 when
// the promise holds. `weight_grad_sum` (optional, float32, the weight's shape, contiguous): the
// weight's gradient times `multiplier` is added into it during this forward, GEMM by GEMM, and
// backward returns none for the weight (Megatron's gradient-accumulation fusion for the largest
// matrix: no float32 buffer of its own, no scaling, cast or add pass); without a sum the weight's
// gradient comes out of backward like any other. Returns a 0-dim float32 loss.
// `denominator` > 0: the loss is the sum over the rows whose target is >= 0 (negative targets take
// no loss and no gradient: instruction data's prompt and padding) divided by it, not the mean.
[[nodiscard]] at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                              int64_t chunk_tokens = 0, const at::Tensor& weight_grad_sum = {},
                                              double multiplier = 1.0, double denominator = 0);
// Tokens per chunk for a vocabulary: a chunk's logits (`bytes_per_logit` each) stay within
// 1 GiB, a multiple of 64 tokens (at least 64). Fewer chunks mean fewer passes over the float32
// sum of the weight's gradient ([vocab x h], read and written once per chunk).
[[nodiscard]] int64_t cross_entropy_chunk_tokens(int64_t vocab, int64_t bytes_per_logit);

}  // namespace trainplan::executor
