#pragma once
// fp8 training of linear layers as torchao's tensorwise dynamic scaling does it
// (torchao/float8/float8_linear.py, float8_scaling_utils.py, float8_utils.py: the "tensorwise"
// recipe, Float8LinearConfig's defaults): each GEMM operand is scaled by one float32 factor per
// tensor, max(fp8) / amax (amax clamped below at 1e-12), computed from the tensor itself on
// every use, saturated to ±max(fp8) and rounded to fp8; inputs and weights in e4m3, output
// gradients in e5m2; the three GEMMs of a linear layer run on fp8 operands through
// at::_scaled_mm with the inverse scales, the forward's with fast accumulation (torchao's
// gemm_config_output), the backward's without. The output is bf16 (the weight's gradient
// float32 where it goes into a float32 sum).
//
// The fused paths (fused_ops.hpp) call these for the block's linear layers; the output layer,
// routers and LoRA adapters stay in bf16, as the cost model assumes (costmodel stack.hpp, fp8).
// What is kept for backward is what the bf16 paths keep (torchao keeps the high-precision input
// too): no fp8 tensor outlives its GEMM; backward casts the kept (or recomputed) input again with
// its forward amax, straight into the transposed layout the weight gradient takes, and the output
// gradient into both layouts in one pass (Transformer Engine's cast-transpose).
//
// CPU ranks train in fp8 too, as an emulation for tests (torchao's `emulate`): the same casts,
// and each GEMM the float32 product of the dequantised fp8 operands (LibTorch's CPU _scaled_mm
// is a reference loop, about 20 ms for a 128 x 64 x 64 product); not a speed to compare.

#include <ATen/ATen.h>

namespace trainplan::executor::fp8 {

constexpr at::ScalarType kForwardType = at::kFloat8_e4m3fn;  // inputs and weights
constexpr at::ScalarType kGradientType = at::kFloat8_e5m2;   // output gradients

// The largest finite value of an fp8 type: 448 (e4m3fn), 57344 (e5m2).
[[nodiscard]] double max_of(at::ScalarType type);

// Which layouts of a 2-D tensor a cast writes: the tensor's own (row-major), its transpose
// (contiguous [cols, rows]: the column-major operand a GEMM below takes), or both, in one pass.
enum class Layout { kRows, kTransposed, kBoth };

// A tensor in fp8 with what undoes its scaling: real value = data * inverse_scale.
struct Cast {
  at::Tensor data;           // fp8, x's shape, contiguous (undefined for Layout::kTransposed)
  at::Tensor transposed;     // fp8, x's transpose, contiguous (Layout::kTransposed, kBoth)
  at::Tensor inverse_scale;  // float32 0-dim: amax / max(fp8) as 1 / (max / amax)
  at::Tensor amax;           // float32 0-dim: the absolute maximum the scale came from
};

// max |x| over all of x, float32 0-dim (one reduction pass).
[[nodiscard]] at::Tensor absolute_max(const at::Tensor& x);

// x (bf16 or float32, any shape; 2-D for a transposed layout) cast to `type` with the scale from
// `amax`, or from x's own amax when that is undefined (a recomputed tensor reuses its forward's,
// so both casts are alike). bf16 on a GPU: one pass of cuda_kernels.hpp's fp8_cast or
// fp8_cast_transpose where the build has them.
[[nodiscard]] Cast cast(const at::Tensor& x, at::ScalarType type, const at::Tensor& amax = {}, Layout layout = Layout::kRows);

// a [m, k] times b [k, n] on fp8 operands: `a` row-major, `b` column-major (the transpose of a
// contiguous [n, k]), both dims multiples of 16 (cuBLASLt's fp8 GEMM). Returns [m, n] in `out`.
[[nodiscard]] at::Tensor mm(const at::Tensor& a, const at::Tensor& a_inverse_scale, const at::Tensor& b,
                            const at::Tensor& b_inverse_scale, at::ScalarType out, bool fast_accumulation);

// The three GEMMs of y = x w^T (x: [rows, k], w: [n, k]) on fp8 operands.
// forward: x's cast (rows x k) and the weight's (cast here; its amax returned for backward).
[[nodiscard]] at::Tensor forward(const Cast& x, const at::Tensor& w, at::Tensor& w_amax);
// grad_x = g w, g the output gradient's cast ([rows, n] e5m2, Layout::kRows or kBoth), the weight
// cast again with its forward amax, straight into its transposed layout.
[[nodiscard]] at::Tensor input_gradient(const Cast& g, const at::Tensor& w, const at::Tensor& w_amax);
// grad_w = g^T x: g_t the output gradient's cast, transposed ([n, rows]), x_t the input's
// ([k, rows]): the `transposed` of Layout::kTransposed or kBoth casts. `out` float32 for a
// gradient sum, else the weight's dtype.
[[nodiscard]] at::Tensor weight_gradient(const at::Tensor& g_t, const at::Tensor& g_inverse_scale, const at::Tensor& x_t,
                                         const at::Tensor& x_inverse_scale, at::ScalarType out);

}  // namespace trainplan::executor::fp8
