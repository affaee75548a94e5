#pragma once
// What fused_ops.cpp's autograd functions and cross_entropy.cpp's share (not part of the
// executor's interface: fused_ops.hpp is).

#include <optional>

#include <ATen/ATen.h>

namespace trainplan::executor::fused {

// cuda_kernels.hpp's kernels take bf16 tensors on a GPU; everything else takes ATen operators.
[[nodiscard]] bool kernel_for(const at::Tensor& t);
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
// The current CUDA stream of t's device, as a cudaStream_t.
[[nodiscard]] void* stream_of(const at::Tensor& t);
// The norm kernels load and store 16 bytes at a time.
[[nodiscard]] bool aligned16(const at::Tensor& t);
#endif

// [..., n] -> [rows, n] (a view where the layout allows).
[[nodiscard]] at::Tensor rows(const at::Tensor& t);

// sum += g^T input (g: [rows, out], input: [rows, in], sum: [out, in], float32 or the inputs'
// dtype). 16-bit inputs on a GPU: one cuBLAS GEMM with a float32 output and beta = 1 (no 16-bit
// product, no add pass); on CPU the 16-bit product is rounded, then widened as it is added.
void add_weight_gradient(at::Tensor& sum, const at::Tensor& g, const at::Tensor& input);

// A sum argument checked and detached; absent, std::nullopt (an optional without a value is no
// variable to autograd, where an undefined tensor would be one).
[[nodiscard]] std::optional<at::Tensor> checked_sum(const at::Tensor& sum, const at::Tensor& weight, const char* what);

}  // namespace trainplan::executor::fused
