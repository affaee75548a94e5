#pragma once
// The executor's microbenchmarks (`executor --profile`), mirroring the scripts that measured the
// H100 tables (shared/data/measured/h100-llama3.2-1b/h100_kernels.py and h100_elementwise.py):
// bf16 GEMMs of transformer shapes and logits, causal SDPA forward and forward+backward, the
// eager element-wise ops of costmodel::elementwise_ops() forward and backward at tokens t and 2t,
// AdamW, a device copy and the time of one tiny kernel; and, over a communicator, all-reduce,
// all-gather and reduce-scatter bus bandwidth by message size.
//
// Each benchmark is a task with a label, so the caller can show progress and count them before
// running any. Timing: CUDA events around `repeats` back-to-back calls after `warmup` calls on a
// GPU (the mean, as the scripts); on a CPU each call timed with steady_clock, the median.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "trainplan/costmodel/collectives.hpp"
#include "trainplan/costmodel/kernel_import.hpp"

namespace trainplan::executor {

// What to measure and how often.
struct ProfileSweep {
  struct Gemm {
    int64_t m = 0, n = 0, k = 0;
  };
  struct Attention {
    int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  };
  std::vector<Gemm> gemm;       // bf16 C[m,n] = A[m,k] B[k,n]: the table
  std::vector<Gemm> gemm_fp32;  // fp32, for a CPU's fp32 peak (empty on GPUs: their peaks are datasheet figures)
  std::vector<Attention> attention;
  std::vector<int64_t> tokens;                         // element-wise ops at each (pairs t, 2t fit the kernel latency)
  std::vector<std::pair<int64_t, int64_t>> hidden_ffn; // (hidden, ffn): norms, residual, cast, rotary at hidden; swiglu, gelu, dropout at ffn
  std::vector<int64_t> vocab;                          // cross-entropy widths
  std::vector<std::pair<int64_t, int64_t>> embedding;  // (rows, hidden)
  std::vector<int64_t> adamw_params;                   // fp32 parameters per AdamW step
  int64_t copy_bytes = 0;
  std::vector<int64_t> collective_bytes;               // message sizes, increasing
  int warmup = 1, repeats = 5;                         // kernels
  int collective_warmup = 2, collective_repeats = 5;
};

// The sweep for a device: a GPU gets the shapes of the H100 scripts (`quick`: a subset); a CPU
// small shapes and few repeats, so that the whole profile takes well under a minute on two
// cores.
[[nodiscard]] ProfileSweep profile_sweep(bool cuda, bool quick);

struct BenchmarkTask {
  std::string label;         // for the progress bar: "gemm 8192x2048x2048", "sdpa s=4096 d=128"
  std::function<void()> run; // measures and records its result; throws on failure
};

// What the kernel tasks record.
struct KernelMeasurements {
  costmodel::KernelSamples samples;
  std::vector<double> gemm_fp32_flops_per_second;
  double tiny_kernel_seconds = 0;  // x.add_(1) on one element: the fallback kernel latency
  std::string adamw_implementation; // which AdamW ran ("at::_fused_adamw_", or the ATen ops of unfused AdamW)
};

// The kernel benchmarks of `sweep` on `device`; each task appends to `out`, which must outlive them.
[[nodiscard]] std::vector<BenchmarkTask> kernel_tasks(const ProfileSweep& sweep, at::Device device, KernelMeasurements& out);

// Collective benchmarks over `comm` (every rank runs the same tasks in the same order): fp32
// tensors on `device` of each size in `sweep.collective_bytes` (rounded down to a multiple of
// 4 x ranks); the time is the slowest rank's per-call time (GPU: CUDA events around the
// repeats, their mean, as nccl-tests; CPU: the median of the calls timed one by one); busbw = bytes / time x
// 2(n-1)/n for all-reduce, x (n-1)/n for all-gather (bytes = its output) and reduce-scatter
// (bytes = its input). Each task appends to `out`, which must outlive them. REQUIRES: comm.size() > 1.
[[nodiscard]] std::vector<BenchmarkTask> collective_tasks(const ProfileSweep& sweep, Communicator& comm, at::Device device,
                                                          costmodel::MeasuredCollectives& out);

}  // namespace trainplan::executor
