#pragma once
// What the .cu files of the executor's kernels share (cuda_kernels.cu, cuda_fp8.cu): bf16 and
// float conversions as c10 rounds, the launch check, the grid size and the 16-byte pack.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace trainplan::executor::cuda_kernels::common {

using bf16 = __nv_bfloat16;

__host__ __device__ __forceinline__ float f(bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ bf16 b(float x) { return __float2bfloat16_rn(x); }
// As c10's silu: x / (1 + exp(-x)) in float.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

inline void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

constexpr int kThreads = 256;
inline int blocks_for(int64_t items) {
  const int64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct alignas(16) Pack {
  bf16 v[8];
};

}  // namespace trainplan::executor::cuda_kernels::common
