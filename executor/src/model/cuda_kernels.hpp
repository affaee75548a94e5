#pragma once
// CUDA kernels for the fused paths (fused_ops.cpp chooses them at run time for bf16 tensors on a
// GPU, else the LibTorch composition). Each reproduces the reference path's roundings: inputs
// and every intermediate the reference stores in bf16 are rounded to bf16 (round to nearest
// even, as c10::BFloat16), arithmetic between them in float32. Built only where CMake finds a
// CUDA compiler (TRAINPLAN_HAVE_CUDA_KERNELS); plain C++ interface, no LibTorch in the .cu file.
// Pointers are device pointers to bf16 values unless typed otherwise; `stream` is a cudaStream_t.
// Each throws std::runtime_error with CUDA's message when a launch fails.

#include <cstdint>

namespace trainplan::executor::cuda_kernels {

// out = bf16(bf16(silu(gate)) * up), n elements.
void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, void* stream);

// From d loss / d out (`grad`): the recomputed product bf16(silu(gate)) * up, and the gradients
// of gate (silu_backward of grad * up) and up (grad * silu(gate)).
void swiglu_backward(const void* grad, const void* gate, const void* up, void* product, void* grad_gate, void* grad_up, int64_t n,
                     void* stream);

// Rotary "rotate half" over x laid out [batch, seq, heads, head_dim] contiguous, cos and sin
// [seq, head_dim]: out = x * cos + rotate_half(x) * sin; `inverse` applies the transpose
// (backward): out = x * cos + rotate_half^T(x * sin).
void rotary(const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq, int64_t heads,
            int64_t head_dim, bool inverse, void* stream);

// RMSNorm backward over `rows` rows of `h` (y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps),
// rstd recomputed from x, float32 throughout): writes grad_x = rstd * (weight * grad - x_hat *
// mean(weight * grad * x_hat)), x_hat = x * rstd, and, for the weight's gradient, float32 partial
// sums of grad * x_hat over the rows: `partial` holds rms_norm_partial_rows(rows) rows of h, to be
// summed over its first dim. `residual_grad` (null, or rows x h like grad_x): the gradient of the
// residual stream the norm's input continues, added to each rounded grad_x value (bf16(grad_x +
// residual_grad), autograd's add where the stream forks, in the same pass). REQUIRES:
// rms_norm_backward_supports(h).
[[nodiscard]] bool rms_norm_backward_supports(int64_t h);
[[nodiscard]] int64_t rms_norm_partial_rows(int64_t rows);
void rms_norm_backward(const void* grad, const void* x, const void* weight, const void* residual_grad, void* grad_x, float* partial,
                       int64_t rows, int64_t h, float eps, void* stream);

// RMSNorm forward of `rows` rows of `h`, optionally of a sum: with `branch` (else null), the
// row is bf16(x + branch), written to `sum_out` when that is not null; `normed` gets
// bf16((row * rstd) * weight), rstd = 1 / sqrt(mean(row^2) + eps) in float32 (ATen's RMSNorm
// forward, the residual add before it in the same pass). REQUIRES: rms_norm_backward_supports(h).
void add_rms_norm(const void* x, const void* branch, const void* weight, void* sum_out, void* normed, int64_t rows, int64_t h, float eps,
                  void* stream);

// Softmax cross-entropy of `rows` rows of `vocab` logits, in float32 from bf16 logits: writes each
// row's loss (logsumexp - logit[target]) to `row_loss` and replaces the logits in place with the
// gradient bf16((softmax - one_hot(target)) * scale).
void cross_entropy_backward_in_place(void* logits, const int64_t* targets, float* row_loss, int64_t rows, int64_t vocab,
                                     float scale, void* stream);

// fp8 training's cast (fp8.hpp; torchao's tensorwise dynamic scaling): n bf16 values of `in`
// times scale = max / max(*amax, 1e-12) (float32; `amax` a device float), saturated to ±max and
// rounded to nearest even into fp8, e4m3fn, or e5m2 where `e5m2` (one byte each, into `out`).
// Writes *inverse_scale = 1 / scale (device float) for the scaled GEMM. One pass: reads 2 bytes,
// writes 1 per value.
void fp8_cast(const void* in, uint8_t* out, const float* amax, float max, bool e5m2, float* inverse_scale, int64_t n, void* stream);
// The same per-thread work on the host (`amax` a host value; `wide`: the 8-value path where the
// addresses allow), for tests on machines without a GPU.
void fp8_cast_on_host(const void* in, uint8_t* out, float amax, float max, bool e5m2, int64_t n, bool wide);
// fp8_cast of a [rows, cols] bf16 matrix into its row-major layout (`out`, [rows, cols]) and/or
// its transpose (`out_t`, [cols, rows], contiguous), either may be null, in one pass through
// shared-memory tiles of 32 x 32 (Transformer Engine's cast-transpose): the operand layouts the
// weight-gradient and input-gradient GEMMs take.
void fp8_cast_transpose(const void* in, uint8_t* out, uint8_t* out_t, const float* amax, float max, bool e5m2, float* inverse_scale,
                        int64_t rows, int64_t cols, void* stream);
// The same values on the host (`amax` a host value), element by element, for tests.
void fp8_cast_transpose_on_host(const void* in, uint8_t* out, uint8_t* out_t, float amax, float max, bool e5m2, int64_t rows, int64_t cols);

// QLoRA's NF4 matrices (quantize.hpp) into bf16: `codes` holds two level indices a byte, the high
// nibble first; value v lies in block v / 64, whose maximum is
// ((block_codes[block] - 128) / 127) * group_scales[block / 256] + offset, all in float32; writes
// out[v] = bf16(levels[index] * maximum) for v < n, as quantize.cpp's LibTorch path.
struct Nf4Levels {
  float v[16];
};
void nf4_dequantize(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset, Nf4Levels levels,
                    int64_t n, void* out, void* stream);
// INT8 (quantize.hpp): out[r, c] = bf16(float(codes[r, c]) * scales[r]) over rows x cols.
void int8_dequantize(const int8_t* codes, const float* scales, int64_t rows, int64_t cols, void* out, void* stream);
// Both kernels' per-thread work run on the host over host memory (pointers to host values): what
// a test without a GPU can check of them, their indexing and arithmetic. `wide`: the vector path
// (8 code bytes per NF4 thread, 8 codes per INT8 thread) where the kernel would take it.
void nf4_dequantize_on_host(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset, Nf4Levels levels,
                            int64_t n, bool wide, void* out);
void int8_dequantize_on_host(const int8_t* codes, const float* scales, int64_t rows, int64_t cols, bool wide, void* out);

}  // namespace trainplan::executor::cuda_kernels
