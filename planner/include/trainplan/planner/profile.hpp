#pragma once
// Hardware profiles with measured kernel tables: importing microbenchmark CSVs (the format of
// shared/data/measured/*/h100_kernels.csv and h100_elementwise.csv) into the `gpu.kernels`
// section of a `trainplan/hwprofile/v1` document (`planner profile --from-csv`), building the
// same tables from samples measured in memory (the executor's `--profile`), and running the
// executor's microbenchmarks (`planner profile` without --from-csv).

#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernel_import.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

// The samples, their tables and the profile they go into (costmodel/kernel_import.hpp, which the
// executor's --profile shares).
using costmodel::build_kernel_tables;
using costmodel::KernelImport;
using costmodel::KernelSamples;
using costmodel::with_kernel_tables;

// Reads one or more CSV files into KernelSamples, then build_kernel_tables; each file is
// recognised by its header:
//   kind,m,n,k,extra,seconds,tflops_or_gbps    (GEMMs, SDPA forward and forward+backward, fused
//                                               AdamW GB/s, device copy GB/s)
//   op,tokens,width,dtype,seconds_fwd,seconds_bwd,...   (eager element-wise ops)
// GEMM shapes measured twice are averaged. The kernel latency is the median intercept of the
// element-wise ops measured at two sizes (2 x t1 - t2 per kernel), else `fallback_latency`.
// Errors name the file and line: unknown header, missing column, a value that is not a finite
// positive number, no GEMM or no attention rows in the files together.
[[nodiscard]] costmodel::Result<KernelImport> import_kernel_csv(const std::vector<std::string>& files, double fallback_latency);

}  // namespace trainplan::planner
