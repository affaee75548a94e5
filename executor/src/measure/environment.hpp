#pragma once
// What a measurement ran on: the `environment` object of the measurement document.

#include <string>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

// {libtorch_version, cuda_version, cuda_driver_version, nccl_version, gpu_name, sm_clock_max_mhz,
//  memory_clock_max_mhz, executor_commit}. Versions as "2.11.0" / "13.0" / "2.28.9"; null where
// this build has no CUDA or NCCL, or the value cannot be read (no driver); the GPU keys are null
// unless `cuda_device` (the ranks run on the current CUDA device). The clocks are the device's
// rated peak clocks as CUDA reports them (cudaDevAttrClockRate, cudaDevAttrMemoryClockRate), not
// the clocks during the run. executor_commit: the git commit the executor was built from,
// "-dirty" when the tree had changes, "unknown" outside git. allocator_conf: PyTorch's allocator
// settings the run read (PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF; null: neither set).
[[nodiscard]] nlohmann::json environment_json(bool cuda_device);

// Sets PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF for the plan's allocator (plan key
// training.allocator) where the launcher set neither; call it before anything allocates on a
// GPU. A setting the launcher made first is kept: the return value then says how it differs from
// the plan's (empty when it agrees), for a warning.
[[nodiscard]] std::string apply_allocator_setting(costmodel::Allocator allocator);

}  // namespace trainplan::executor
