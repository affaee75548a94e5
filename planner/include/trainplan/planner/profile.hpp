#pragma once
// Hardware profiles with measured kernel tables: importing microbenchmark CSVs (the format of
// shared/data/measured/*/h100_kernels.csv and h100_elementwise.csv) into the `gpu.kernels`
// section of a `trainplan/hwprofile/v1` document (`planner profile --from-csv`).

#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

// What an import read, for the report.
struct KernelImport {
  costmodel::KernelTables tables;
  int gemm_rows = 0, attention_rows = 0, elementwise_rows = 0, merged_duplicates = 0;
  std::vector<std::string> notes;  // e.g. how the kernel latency was derived
};

// Reads one or more CSV files; each is recognised by its header:
//   kind,m,n,k,extra,seconds,tflops_or_gbps    (GEMMs, SDPA forward and forward+backward, fused
//                                               AdamW GB/s, device copy GB/s)
//   op,tokens,width,dtype,seconds_fwd,seconds_bwd,...   (eager element-wise ops)
// GEMM shapes measured twice are averaged. The kernel latency is the median intercept of the
// element-wise ops measured at two sizes (2 x t1 - t2 per kernel), else `fallback_latency`.
// Errors name the file and line: unknown header, missing column, a value that is not a finite
// positive number, no GEMM or no attention rows in the files together.
[[nodiscard]] costmodel::Result<KernelImport> import_kernel_csv(const std::vector<std::string>& files, double fallback_latency);

// `base` with its measured tables replaced by `import` (prepared for base's SM count); the
// profile's `source` says where the tables came from.
[[nodiscard]] costmodel::HardwareProfile with_kernel_tables(costmodel::HardwareProfile base, const KernelImport& import,
                                                            const std::string& name);

}  // namespace trainplan::planner
