// fp8 training's cast kernels (cuda_kernels.hpp fp8_cast, fp8_cast_transpose; fp8.hpp).

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "cuda_kernels.hpp"

namespace trainplan::executor::cuda_kernels {

namespace {

using namespace common;

// fp8_cast: scale, saturate and round 8 values per thread (16 bytes read, 8 written) where the
// addresses allow, else one at a time.
__host__ __device__ __forceinline__ float fp8_scale(float amax, float max) { return max / fmaxf(amax, 1e-12f); }
struct alignas(8) Fp8Pack {
  uint8_t v[8];
};
template <bool E5M2>
__host__ __device__ __forceinline__ uint8_t to_fp8(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3));
}
template <bool E5M2>
__host__ __device__ __forceinline__ void fp8_chunk(const bf16* in, uint8_t* out, float scale, int64_t n, int64_t i, bool wide) {
  const int64_t first = i * 8;
  if (wide && first + 8 <= n) {
    const Pack pk = reinterpret_cast<const Pack*>(in)[i];
    Fp8Pack o;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.v[k] = to_fp8<E5M2>(f(pk.v[k]) * scale);
    reinterpret_cast<Fp8Pack*>(out)[i] = o;
    return;
  }
  for (int64_t v = first; v < n && v < first + 8; ++v) out[v] = to_fp8<E5M2>(f(in[v]) * scale);
}
template <bool E5M2>
__global__ void fp8_cast_kernel(const bf16* in, uint8_t* out, const float* amax, float max, float* inverse_scale, int64_t n, bool wide) {
  const float scale = fp8_scale(*amax, max);
  if (inverse_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = 1.0f / scale;
  const int64_t chunks = (n + 7) / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    fp8_chunk<E5M2>(in, out, scale, n, i, wide);
  }
}
// A 32 x 32 tile per block of 32 x 8 threads: each thread casts 4 values of its column, writes
// them row-major, and through shared memory writes 4 values of the transposed tile.
constexpr int kTile = 32, kTileRows = 8;
template <bool E5M2>
__global__ void __launch_bounds__(kTile * kTileRows) fp8_cast_transpose_kernel(const bf16* in, uint8_t* out, uint8_t* out_t, const float* amax,
                                                                              float max, float* inverse_scale, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float scale = fp8_scale(*amax, max);
  if (inverse_scale != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *inverse_scale = 1.0f / scale;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const uint8_t v = to_fp8<E5M2>(f(in[r * cols + c]) * scale);
      if (out != nullptr) out[r * cols + c] = v;
      tile[j][threadIdx.x] = v;
    }
  }
  if (out_t == nullptr) return;
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;  // out_t[c][r] = value (r, c)
    if (c < cols && r < rows) out_t[c * rows + r] = tile[threadIdx.x][j];
  }
}
bool fp8_wide(const void* in, const void* out) { return aligned16(in) && reinterpret_cast<uintptr_t>(out) % 8 == 0; }

}  // namespace

void fp8_cast(const void* in, uint8_t* out, const float* amax, float max, bool e5m2, float* inverse_scale, int64_t n, void* stream) {
  const auto* x = static_cast<const bf16*>(in);
  const bool wide = fp8_wide(in, out);
  const int blocks = blocks_for(std::max<int64_t>((n + 7) / 8, 1));  // one block at least: it writes the inverse scale
  if (e5m2) fp8_cast_kernel<true><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, out, amax, max, inverse_scale, n, wide);
  else fp8_cast_kernel<false><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, out, amax, max, inverse_scale, n, wide);
  check("fp8_cast");
}

void fp8_cast_on_host(const void* in, uint8_t* out, float amax, float max, bool e5m2, int64_t n, bool wide) {
  const auto* x = static_cast<const bf16*>(in);
  wide = wide && fp8_wide(in, out);
  const float scale = fp8_scale(amax, max);
  for (int64_t i = 0; i < (n + 7) / 8; ++i) {
    if (e5m2) fp8_chunk<true>(x, out, scale, n, i, wide);
    else fp8_chunk<false>(x, out, scale, n, i, wide);
  }
}

void fp8_cast_transpose(const void* in, uint8_t* out, uint8_t* out_t, const float* amax, float max, bool e5m2, float* inverse_scale,
                        int64_t rows, int64_t cols, void* stream) {
  const auto* x = static_cast<const bf16*>(in);
  // One block at least: it writes the inverse scale.
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>((cols + kTile - 1) / kTile, 1)), static_cast<unsigned>(std::max<int64_t>((rows + kTile - 1) / kTile, 1)));
  if (grid.y > 65535) throw std::runtime_error("fp8_cast_transpose: more than 65535 x 32 rows");
  const dim3 block(kTile, kTileRows);
  if (e5m2) fp8_cast_transpose_kernel<true><<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(x, out, out_t, amax, max, inverse_scale, rows, cols);
  else fp8_cast_transpose_kernel<false><<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(x, out, out_t, amax, max, inverse_scale, rows, cols);
  check("fp8_cast_transpose");
}

void fp8_cast_transpose_on_host(const void* in, uint8_t* out, uint8_t* out_t, float amax, float max, bool e5m2, int64_t rows, int64_t cols) {
  const auto* x = static_cast<const bf16*>(in);
  const float scale = fp8_scale(amax, max);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = e5m2 ? to_fp8<true>(f(x[r * cols + c]) * scale) : to_fp8<false>(f(x[r * cols + c]) * scale);
      if (out != nullptr) out[r * cols + c] = v;
      if (out_t != nullptr) out_t[c * rows + r] = v;
    }
  }
}

}  // namespace trainplan::executor::cuda_kernels
