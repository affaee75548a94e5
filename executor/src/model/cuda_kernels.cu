// CUDA kernels of the fused paths (see cuda_kernels.hpp). Element-wise kernels read and write 8
// bf16 values (16 bytes) per thread where the sizes and addresses allow, else one.

#include "cuda_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_common.cuh"

namespace trainplan::executor::cuda_kernels {

namespace {

using namespace common;

template <int W>
__device__ __forceinline__ void load(const bf16* p, int64_t i, bf16 (&out)[W]) {
  if constexpr (W == 8) {
    const Pack pk = reinterpret_cast<const Pack*>(p)[i];
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = pk.v[k];
  } else {
    out[0] = p[i];
  }
}
template <int W>
__device__ __forceinline__ void store(bf16* p, int64_t i, const bf16 (&in)[W]) {
  if constexpr (W == 8) {
    Pack pk;
#pragma unroll
    for (int k = 0; k < 8; ++k) pk.v[k] = in[k];
    reinterpret_cast<Pack*>(p)[i] = pk;
  } else {
    p[i] = in[0];
  }
}

template <int W>
__global__ void swiglu_forward_kernel(const bf16* gate, const bf16* up, bf16* out, int64_t items) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bf16 g[W], u[W], o[W];
    load<W>(gate, i, g);
    load<W>(up, i, u);
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = b(f(b(silu(f(g[k])))) * f(u[k]));
    store<W>(out, i, o);
  }
}

template <int W>
__global__ void swiglu_backward_kernel(const bf16* grad, const bf16* gate, const bf16* up, bf16* product, bf16* grad_gate,
                                       bf16* grad_up, int64_t items) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bf16 dy[W], g[W], u[W], p[W], dg[W], du[W];
    load<W>(grad, i, dy);
    load<W>(gate, i, g);
    load<W>(up, i, u);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float x = f(g[k]), upv = f(u[k]), d = f(dy[k]);
      const float activated = f(b(silu(x)));
      p[k] = b(activated * upv);
      du[k] = b(d * activated);
      const float dsilu = f(b(d * upv));
      const float s = 1.0f / (1.0f + expf(-x));  // as c10's silu_backward
      dg[k] = b(dsilu * s * (1.0f + x * (1.0f - s)));
    }
    store<W>(product, i, p);
    store<W>(grad_gate, i, dg);
    store<W>(grad_up, i, du);
  }
}

// One thread per W elements of a row's first half and the W partners W/2.. of its second half
// (pairs (d, d + half)): both halves' loads and stores are W-wide and consecutive threads touch
// consecutive addresses. I: the index type (32-bit where the tensor allows: cheaper division).
//   forward:  out_d = x_d cos_d - x_{d+h} sin_d,         out_{d+h} = x_{d+h} cos_{d+h} + x_d sin_{d+h}
//   inverse:  out_d = x_d cos_d + x_{d+h} sin_{d+h},     out_{d+h} = x_{d+h} cos_{d+h} - x_d sin_d
// each product rounded to bf16 before the sum, as the reference path's x * cos + rotated * sin.
template <int W, typename I>
__global__ void rotary_kernel(const bf16* x, const bf16* cos, const bf16* sin, bf16* out, I items, I per_row, I heads, I seq, I dim,
                              bool inverse) {
  const I half = dim / 2;
  for (I t = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; t < items; t += static_cast<I>(gridDim.x) * blockDim.x) {
    const I row = t / per_row, d = (t - row * per_row) * W;
    const I s = (row / heads) % seq;
    const I first = row * dim + d, second = first + half, table = s * dim + d;
    bf16 x1[W], x2[W], c1[W], c2[W], s1[W], s2[W], o1[W], o2[W];
    load<W>(x + first, 0, x1);
    load<W>(x + second, 0, x2);
    load<W>(cos + table, 0, c1);
    load<W>(cos + table + half, 0, c2);
    load<W>(sin + table, 0, s1);
    load<W>(sin + table + half, 0, s2);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float a = f(x1[k]), z = f(x2[k]);
      const float a_cos = f(b(a * f(c1[k]))), z_cos = f(b(z * f(c2[k])));
      if (!inverse) {
        o1[k] = b(a_cos + f(b(-z * f(s1[k]))));
        o2[k] = b(z_cos + f(b(a * f(s2[k]))));
      } else {
        o1[k] = b(a_cos + f(b(z * f(s2[k]))));
        o2[k] = b(z_cos - f(b(a * f(s1[k]))));
      }
    }
    store<W>(out + first, 0, o1);
    store<W>(out + second, 0, o2);
  }
}

template <int W, typename I>
void launch_rotary(const bf16* x, const bf16* cos, const bf16* sin, bf16* out, int64_t rows, int64_t seq, int64_t heads, int64_t dim,
                   bool inverse, cudaStream_t stream) {
  const int64_t per_row = dim / 2 / W, items = rows * per_row;
  rotary_kernel<W, I><<<blocks_for(items), kThreads, 0, stream>>>(x, cos, sin, out, static_cast<I>(items), static_cast<I>(per_row),
                                                                  static_cast<I>(heads), static_cast<I>(seq), static_cast<I>(dim), inverse);
}

constexpr int kNormThreads = 256;
constexpr int kNormMaxChunks = 4;  // h up to 4 x 8 x 256 = 8192 columns
constexpr int64_t kNormMaxBlocks = 1024;

// The sum of (a, b) over the block; `shared` has 33 slots (one per warp and the total), so two
// __syncthreads per call and no third before the next call.
__device__ __forceinline__ float2 block_sum(float2 v, float2* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kNormThreads / 32 ? shared[lane] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
      v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
    }
    if (lane == 0) shared[32] = v;
  }
  __syncthreads();
  return shared[32];
}

// One block per group of rows; each thread holds C chunks of 8 columns (the weight's among them)
// and the weight gradient's partial sums of its columns over the block's rows.
template <int C>
__global__ void __launch_bounds__(kNormThreads) rms_norm_backward_kernel(const bf16* grad, const bf16* x, const bf16* weight,
                                                                         const bf16* residual_grad, bf16* grad_x, float* partial,
                                                                         int64_t rows, int h, float eps) {
  __shared__ float2 shared[33];
  bf16 w[C][8];
  float dw[C][8];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int col = (c * kNormThreads + threadIdx.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) dw[c][k] = 0.0f;
    if (col < h) load<8>(weight + col, 0, w[c]);
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    bf16 g[C][8], xv[C][8];
    float2 sums = make_float2(0.0f, 0.0f);  // sum of x^2, sum of weight * grad * x
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = (c * kNormThreads + threadIdx.x) * 8;
      if (col >= h) continue;
      load<8>(grad + r * h + col, 0, g[c]);
      load<8>(x + r * h + col, 0, xv[c]);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float xf = f(xv[c][k]);
        sums.x += xf * xf;
        sums.y += f(w[c][k]) * f(g[c][k]) * xf;
      }
    }
    sums = block_sum(sums, shared);
    const float rstd = rsqrtf(sums.x * inv_h + eps);
    const float correction = rstd * rstd * rstd * sums.y * inv_h;  // rstd * x_hat * mean(w g x_hat) = x * correction
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = (c * kNormThreads + threadIdx.x) * 8;
      if (col >= h) continue;
      bf16 out[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float xf = f(xv[c][k]), gf = f(g[c][k]);
        out[k] = b(rstd * f(w[c][k]) * gf - xf * correction);
        dw[c][k] += gf * xf * rstd;
      }
      if (residual_grad != nullptr) {  // the stream's gradient added to the rounded norm gradient, as autograd's add
        bf16 res[8];
        load<8>(residual_grad + r * h + col, 0, res);
#pragma unroll
        for (int k = 0; k < 8; ++k) out[k] = b(f(out[k]) + f(res[k]));
      }
      store<8>(grad_x + r * h + col, 0, out);
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int col = (c * kNormThreads + threadIdx.x) * 8;
    if (col >= h) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) partial[blockIdx.x * static_cast<int64_t>(h) + col + k] = dw[c][k];
  }
}

// One block per row (grid-stride past the grid's rows): the row's sum x + branch rounded to bf16
// (kept in registers, written to sum_out when asked), its mean square in float32, then
// bf16((sum * rstd) * weight), as ATen's RMSNorm kernel orders the products.
template <int C>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(const bf16* x, const bf16* branch, const bf16* weight, bf16* sum_out,
                                                                    bf16* normed, int64_t rows, int h, float eps) {
  __shared__ float2 shared[33];
  const float inv_h = 1.0f / static_cast<float>(h);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    bf16 v[C][8];
    float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = (c * kNormThreads + threadIdx.x) * 8;
      if (col >= h) continue;
      load<8>(x + r * h + col, 0, v[c]);
      if (branch != nullptr) {
        bf16 other[8];
        load<8>(branch + r * h + col, 0, other);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[c][k] = b(f(v[c][k]) + f(other[k]));
        if (sum_out != nullptr) store<8>(sum_out + r * h + col, 0, v[c]);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) sums.x += f(v[c][k]) * f(v[c][k]);
    }
    sums = block_sum(sums, shared);
    const float rstd = rsqrtf(sums.x * inv_h + eps);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = (c * kNormThreads + threadIdx.x) * 8;
      if (col >= h) continue;
      bf16 w[8], out[8];
      load<8>(weight + col, 0, w);
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = b(f(v[c][k]) * rstd * f(w[k]));
      store<8>(normed + r * h + col, 0, out);
    }
  }
}

// (max, sum of exp(x - max)) pairs merged.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY) return;  // both empty
  s = s * expf(m - top) + s2 * expf(m2 - top);
  m = top;
}

constexpr int kRowThreads = 512;

template <int W>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_kernel(bf16* logits, const int64_t* targets, float* row_loss, int64_t vocab,
                                                                     float scale) {
  bf16* row = logits + blockIdx.x * vocab;
  const int64_t items = vocab / W;
  const int64_t target = targets[blockIdx.x];
  const float target_logit = f(row[target]);
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = threadIdx.x; i < items; i += kRowThreads) {
    bf16 v[W];
    load<W>(row, i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) merge(m, s, f(v[k]), 1.0f);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset), s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    merge(m, s, m2, s2);
  }
  __shared__ float warp_m[kRowThreads / 32], warp_s[kRowThreads / 32];
  __shared__ float shared_lse;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float tm = warp_m[0], ts = warp_s[0];
    for (int w = 1; w < kRowThreads / 32; ++w) merge(tm, ts, warp_m[w], warp_s[w]);
    shared_lse = tm + logf(ts);
    row_loss[blockIdx.x] = shared_lse - target_logit;
  }
  __syncthreads();
  const float lse = shared_lse;
  for (int64_t i = threadIdx.x; i < items; i += kRowThreads) {
    bf16 v[W];
    load<W>(row, i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float p = expf(f(v[k]) - lse);
      if (i * W + k == target) p -= 1.0f;
      v[k] = b(p * scale);
    }
    store<W>(row, i, v);
  }
}

constexpr int64_t kNf4Block = 64;   // values per block maximum (quantize.cpp kBlock)
constexpr int64_t kNf4Group = 256;  // blocks per float32 scale (quantize.cpp kGroup)

constexpr int64_t kNf4Chunk = 16;   // values per thread: 8 code bytes in, two 16-byte stores out

// Byte k (0-7, little-endian as the memory) of 8 bytes loaded as a uint2.
__host__ __device__ __forceinline__ uint32_t byte_of(uint2 raw, int k) { return ((k < 4 ? raw.x : raw.y) >> (8 * (k % 4))) & 0xFFu; }

// One thread's work: values [16 chunk, 16 chunk + 16) of n, one block maximum for all of them (a
// 64-value block holds 4 chunks). `wide`: codes 8-byte and out 16-byte aligned, one load and two
// stores for a whole chunk; the last, partial chunk and unaligned memory go value by value. The
// same arithmetic either way: bf16(levels[index] * maximum), all float32.
__host__ __device__ __forceinline__ void nf4_chunk(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset,
                                                   const float* levels, int64_t n, int64_t chunk, bool wide, bf16* out) {
  const int64_t first = chunk * kNf4Chunk, block = first / kNf4Block;
  const float maximum = (static_cast<float>(block_codes[block]) - 128.0f) / 127.0f * group_scales[block / kNf4Group] + offset;
  if (wide && first + kNf4Chunk <= n) {
    const uint2 raw = *reinterpret_cast<const uint2*>(codes + first / 2);
    Pack half[2];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t c = byte_of(raw, k);
      half[k / 4].v[2 * (k % 4)] = b(levels[c >> 4] * maximum);
      half[k / 4].v[2 * (k % 4) + 1] = b(levels[c & 15u] * maximum);
    }
    reinterpret_cast<Pack*>(out + first)[0] = half[0];
    reinterpret_cast<Pack*>(out + first)[1] = half[1];
    return;
  }
  for (int64_t v = first; v < n && v < first + kNf4Chunk; ++v) {
    const uint32_t c = codes[v / 2];
    out[v] = b(levels[v % 2 == 0 ? c >> 4 : c & 15u] * maximum);
  }
}

// Values [8 chunk, 8 chunk + 8) of an rows x cols INT8 matrix: bf16(code * scale of its row).
// `wide`: cols % 8 == 0 (one row), codes 8-byte and out 16-byte aligned.
__host__ __device__ __forceinline__ void int8_chunk(const int8_t* codes, const float* scales, int64_t cols, int64_t n, int64_t chunk, bool wide,
                                                    bf16* out) {
  const int64_t first = chunk * 8;
  if (wide && first + 8 <= n) {
    const uint2 raw = *reinterpret_cast<const uint2*>(codes + first);
    const float scale = scales[first / cols];
    Pack p;
#pragma unroll
    for (int k = 0; k < 8; ++k) p.v[k] = b(static_cast<float>(static_cast<int8_t>(byte_of(raw, k))) * scale);
    *reinterpret_cast<Pack*>(out + first) = p;
    return;
  }
  for (int64_t v = first; v < n && v < first + 8; ++v) out[v] = b(static_cast<float>(codes[v]) * scales[v / cols]);
}

__global__ void nf4_dequantize_kernel(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset,
                                      Nf4Levels levels, int64_t n, bool wide, bf16* out) {
  __shared__ float table[16];  // indexed by value: from shared memory, not the parameters' local copy
  if (threadIdx.x < 16) table[threadIdx.x] = levels.v[threadIdx.x];
  __syncthreads();
  const int64_t chunks = (n + kNf4Chunk - 1) / kNf4Chunk;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    nf4_chunk(codes, block_codes, group_scales, offset, table, n, i, wide, out);
  }
}

__global__ void int8_dequantize_kernel(const int8_t* codes, const float* scales, int64_t cols, int64_t n, bool wide, bf16* out) {
  const int64_t chunks = (n + 7) / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int8_chunk(codes, scales, cols, n, i, wide, out);
  }
}


bool nf4_wide(const void* codes, const void* out) { return reinterpret_cast<uintptr_t>(codes) % 8 == 0 && aligned16(out); }
bool int8_wide(const void* codes, int64_t cols, const void* out) {
  return cols % 8 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0 && aligned16(out);
}

}  // namespace

void nf4_dequantize(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset, Nf4Levels levels,
                    int64_t n, void* out, void* stream) {
  if (n <= 0) return;
  nf4_dequantize_kernel<<<blocks_for((n + kNf4Chunk - 1) / kNf4Chunk), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      codes, block_codes, group_scales, offset, levels, n, nf4_wide(codes, out), static_cast<bf16*>(out));
  check("nf4_dequantize");
}

void int8_dequantize(const int8_t* codes, const float* scales, int64_t rows, int64_t cols, void* out, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t n = rows * cols;
  int8_dequantize_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(codes, scales, cols, n,
                                                                                                   int8_wide(codes, cols, out),
                                                                                                   static_cast<bf16*>(out));
  check("int8_dequantize");
}

void nf4_dequantize_on_host(const uint8_t* codes, const uint8_t* block_codes, const float* group_scales, float offset, Nf4Levels levels,
                            int64_t n, bool wide, void* out) {
  auto* o = static_cast<bf16*>(out);
  wide = wide && nf4_wide(codes, out);
  for (int64_t i = 0; i < (n + kNf4Chunk - 1) / kNf4Chunk; ++i) nf4_chunk(codes, block_codes, group_scales, offset, levels.v, n, i, wide, o);
}

void int8_dequantize_on_host(const int8_t* codes, const float* scales, int64_t rows, int64_t cols, bool wide, void* out) {
  auto* o = static_cast<bf16*>(out);
  const int64_t n = rows * cols;
  wide = wide && int8_wide(codes, cols, out);
  for (int64_t i = 0; i < (n + 7) / 8; ++i) int8_chunk(codes, scales, cols, n, i, wide, o);
}

void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, void* stream) {
  auto* st = static_cast<cudaStream_t>(stream);
  const auto* g = static_cast<const bf16*>(gate);
  const auto* u = static_cast<const bf16*>(up);
  auto* o = static_cast<bf16*>(out);
  if (n % 8 == 0 && aligned16(g) && aligned16(u) && aligned16(o)) {
    swiglu_forward_kernel<8><<<blocks_for(n / 8), kThreads, 0, st>>>(g, u, o, n / 8);
  } else {
    swiglu_forward_kernel<1><<<blocks_for(n), kThreads, 0, st>>>(g, u, o, n);
  }
  check("swiglu_forward");
}

void swiglu_backward(const void* grad, const void* gate, const void* up, void* product, void* grad_gate, void* grad_up, int64_t n,
                     void* stream) {
  auto* st = static_cast<cudaStream_t>(stream);
  const auto* dy = static_cast<const bf16*>(grad);
  const auto* g = static_cast<const bf16*>(gate);
  const auto* u = static_cast<const bf16*>(up);
  auto* p = static_cast<bf16*>(product);
  auto* dg = static_cast<bf16*>(grad_gate);
  auto* du = static_cast<bf16*>(grad_up);
  if (n % 8 == 0 && aligned16(dy) && aligned16(g) && aligned16(u) && aligned16(p) && aligned16(dg) && aligned16(du)) {
    swiglu_backward_kernel<8><<<blocks_for(n / 8), kThreads, 0, st>>>(dy, g, u, p, dg, du, n / 8);
  } else {
    swiglu_backward_kernel<1><<<blocks_for(n), kThreads, 0, st>>>(dy, g, u, p, dg, du, n);
  }
  check("swiglu_backward");
}

void rotary(const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
            bool inverse, void* stream) {
  if (head_dim % 2 != 0) throw std::invalid_argument("rotary: head_dim must be even, got " + std::to_string(head_dim));
  auto* st = static_cast<cudaStream_t>(stream);
  const auto* xp = static_cast<const bf16*>(x);
  const auto* c = static_cast<const bf16*>(cos);
  const auto* sn = static_cast<const bf16*>(sin);
  auto* o = static_cast<bf16*>(out);
  const int64_t rows = batch * seq * heads;
  const bool wide = (head_dim / 2) % 8 == 0 && aligned16(xp) && aligned16(c) && aligned16(sn) && aligned16(o);
  const bool small = rows * head_dim < (int64_t{1} << 31) && seq * head_dim < (int64_t{1} << 31);
  if (wide && small) launch_rotary<8, uint32_t>(xp, c, sn, o, rows, seq, heads, head_dim, inverse, st);
  else if (wide) launch_rotary<8, int64_t>(xp, c, sn, o, rows, seq, heads, head_dim, inverse, st);
  else if (small) launch_rotary<1, uint32_t>(xp, c, sn, o, rows, seq, heads, head_dim, inverse, st);
  else launch_rotary<1, int64_t>(xp, c, sn, o, rows, seq, heads, head_dim, inverse, st);
  check("rotary");
}

bool rms_norm_backward_supports(int64_t h) { return h > 0 && h % 8 == 0 && h <= int64_t{kNormMaxChunks} * 8 * kNormThreads; }

int64_t rms_norm_partial_rows(int64_t rows) { return rows < kNormMaxBlocks ? (rows > 0 ? rows : 1) : kNormMaxBlocks; }

void rms_norm_backward(const void* grad, const void* x, const void* weight, const void* residual_grad, void* grad_x, float* partial,
                       int64_t rows, int64_t h, float eps, void* stream) {
  if (!rms_norm_backward_supports(h)) throw std::invalid_argument("rms_norm_backward: unsupported width " + std::to_string(h));
  const auto* g = static_cast<const bf16*>(grad);
  const auto* xp = static_cast<const bf16*>(x);
  const auto* w = static_cast<const bf16*>(weight);
  const auto* res = static_cast<const bf16*>(residual_grad);
  auto* dx = static_cast<bf16*>(grad_x);
  if (!aligned16(g) || !aligned16(xp) || !aligned16(w) || !aligned16(dx) || !aligned16(res)) {
    throw std::invalid_argument("rms_norm_backward: unaligned tensors");
  }
  if (rows <= 0) return;
  auto* st = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(rms_norm_partial_rows(rows));
  const int chunks = static_cast<int>((h + 8 * kNormThreads - 1) / (8 * kNormThreads));
  const int hi = static_cast<int>(h);
  switch (chunks) {
    case 1: rms_norm_backward_kernel<1><<<blocks, kNormThreads, 0, st>>>(g, xp, w, res, dx, partial, rows, hi, eps); break;
    case 2: rms_norm_backward_kernel<2><<<blocks, kNormThreads, 0, st>>>(g, xp, w, res, dx, partial, rows, hi, eps); break;
    default: rms_norm_backward_kernel<kNormMaxChunks><<<blocks, kNormThreads, 0, st>>>(g, xp, w, res, dx, partial, rows, hi, eps); break;
  }
  check("rms_norm_backward");
}

void add_rms_norm(const void* x, const void* branch, const void* weight, void* sum_out, void* normed, int64_t rows, int64_t h, float eps,
                  void* stream) {
  if (!rms_norm_backward_supports(h)) throw std::invalid_argument("add_rms_norm: unsupported width " + std::to_string(h));
  const auto* xp = static_cast<const bf16*>(x);
  const auto* br = static_cast<const bf16*>(branch);
  const auto* w = static_cast<const bf16*>(weight);
  auto* so = static_cast<bf16*>(sum_out);
  auto* out = static_cast<bf16*>(normed);
  if (!aligned16(xp) || !aligned16(br) || !aligned16(w) || !aligned16(so) || !aligned16(out)) {
    throw std::invalid_argument("add_rms_norm: unaligned tensors");
  }
  if (rows <= 0) return;
  auto* st = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(rows < (int64_t{1} << 30) ? rows : (int64_t{1} << 30));
  const int chunks = static_cast<int>((h + 8 * kNormThreads - 1) / (8 * kNormThreads));
  const int hi = static_cast<int>(h);
  switch (chunks) {
    case 1: add_rms_norm_kernel<1><<<blocks, kNormThreads, 0, st>>>(xp, br, w, so, out, rows, hi, eps); break;
    case 2: add_rms_norm_kernel<2><<<blocks, kNormThreads, 0, st>>>(xp, br, w, so, out, rows, hi, eps); break;
    default: add_rms_norm_kernel<kNormMaxChunks><<<blocks, kNormThreads, 0, st>>>(xp, br, w, so, out, rows, hi, eps); break;
  }
  check("add_rms_norm");
}

void cross_entropy_backward_in_place(void* logits, const int64_t* targets, float* row_loss, int64_t rows, int64_t vocab, float scale,
                                     void* stream) {
  if (rows <= 0) return;
  auto* st = static_cast<cudaStream_t>(stream);
  auto* l = static_cast<bf16*>(logits);
  if (vocab % 8 == 0 && aligned16(l)) {
    cross_entropy_kernel<8><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(l, targets, row_loss, vocab, scale);
  } else {
    cross_entropy_kernel<1><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(l, targets, row_loss, vocab, scale);
  }
  check("cross_entropy");
}

}  // namespace trainplan::executor::cuda_kernels
