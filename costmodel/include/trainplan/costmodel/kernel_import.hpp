#pragma once
// Measured kernel tables from microbenchmark samples: the executor's `--profile` measures them,
// `planner profile --from-csv` reads them from CSV files (planner/profile.hpp); both build the
// tables here and put them into a hardware profile.

#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

// What an import read, for the report.
struct KernelImport {
  KernelTables tables;
  int gemm_rows = 0, attention_rows = 0, elementwise_rows = 0, merged_duplicates = 0;
  std::vector<std::string> notes;  // e.g. how the kernel latency was derived
};

// Microbenchmark results as measured, before duplicates are averaged and the kernel latency is
// fitted: the rows of the CSV files, or what the executor's --profile measured. Seconds per call.
struct KernelSamples {
  // C[m,n] = A[m,k] B[k,n] (bf16).
  struct Gemm {
    double m = 0, n = 0, k = 0, seconds = 0;
  };
  // Causal fused attention over batch x heads sequences of seq_len, head size head_dim.
  struct Attention {
    double batch = 0, seq_len = 0, head_dim = 0, heads = 0, forward_seconds = 0, forward_backward_seconds = 0;
  };
  // An eager element-wise op (a elementwise_ops() name) on tokens x width elements.
  // `shape` groups samples for the kernel-latency fit, which pairs the samples of one (op, shape)
  // at tokens t and 2t: the width as text ("2048"), or ROWSxHIDDEN for the embedding; empty: the
  // width.
  struct Elementwise {
    std::string op;
    double tokens = 0, width = 0;
    std::string shape;
    double forward_seconds = 0, backward_seconds = 0;
  };
  std::vector<Gemm> gemm;
  std::vector<Attention> attention;
  std::vector<Elementwise> elementwise;
  std::vector<double> adamw_fused_gb_per_s;  // fused AdamW, 32 bytes per fp32 parameter
  std::vector<double> copy_gb_per_s;         // device copy, read + write counted
};

// The kernel tables of `samples` (source left empty for the caller): shapes measured more than
// once are averaged; the kernel latency is the median over the element-wise ops measured at
// tokens t and 2t of (2 x time(t) - time(2t)) / the op's forward kernels, clamped to
// [0.5, 20] us, else `fallback_latency`; the copy and AdamW rates are medians. Errors: no GEMM,
// attention or copy sample, a value that is not a finite number > 0, an unknown op, an
// attention shape whose forward+backward is not longer than its forward.
[[nodiscard]] Result<KernelImport> build_kernel_tables(const KernelSamples& samples, double fallback_latency);

// `base` with its measured tables replaced by `import` (prepared for base's SM count); the
// profile's `source` says where the tables came from.
[[nodiscard]] HardwareProfile with_kernel_tables(HardwareProfile base, const KernelImport& import,
                                                            const std::string& name);

}  // namespace trainplan::costmodel
