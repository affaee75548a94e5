// The environment record of a measurement (see environment.hpp).

#include "environment.hpp"

#include <cstdlib>
#include <string>
#include <utility>

#include <torch/headeronly/version.h>

#include "executor_commit.hpp"

#ifdef TRAINPLAN_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>
#endif
#ifdef TRAINPLAN_HAVE_NCCL
#include <nccl.h>
#endif

namespace trainplan::executor {

namespace {

// PyTorch's allocator settings as it reads them (c10/core/AllocatorConfig.cpp: PYTORCH_ALLOC_CONF
// first, then the older PYTORCH_CUDA_ALLOC_CONF), with the variable's name; null when unset.
std::pair<const char*, const char*> allocator_variable() {
  for (const char* name : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
    if (const char* value = std::getenv(name)) return {name, value};
  }
  return {nullptr, nullptr};
}

#ifdef TRAINPLAN_HAVE_CUDA
// CUDA's integer versions: 1000 * major + 10 * minor.
nlohmann::json cuda_version_text(int v) {
  if (v <= 0) return nullptr;
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

nlohmann::json attribute_mhz(cudaDeviceAttr attribute) {
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, attribute, c10::cuda::current_device()) != cudaSuccess || khz <= 0) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    return nullptr;
  }
  return khz / 1000.0;
}
#endif

}  // namespace

nlohmann::json environment_json(bool cuda_device) {
  nlohmann::json e = {
      {"libtorch_version", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH)},
      {"cuda_version", nullptr},
      {"cuda_driver_version", nullptr},
      {"nccl_version", nullptr},
      {"gpu_name", nullptr},
      {"sm_clock_max_mhz", nullptr},
      {"memory_clock_max_mhz", nullptr},
      {"executor_commit", TRAINPLAN_EXECUTOR_COMMIT},
      {"allocator_conf", nullptr},
  };
  if (const char* conf = allocator_variable().second) e["allocator_conf"] = std::string(conf);
#ifdef TRAINPLAN_HAVE_CUDA
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) e["cuda_version"] = cuda_version_text(runtime);
  if (cudaDriverGetVersion(&driver) == cudaSuccess) e["cuda_driver_version"] = cuda_version_text(driver);  // 0 without a driver
  if (cuda_device) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, c10::cuda::current_device()) == cudaSuccess) e["gpu_name"] = std::string(prop.name);
    e["sm_clock_max_mhz"] = attribute_mhz(cudaDevAttrClockRate);
    e["memory_clock_max_mhz"] = attribute_mhz(cudaDevAttrMemoryClockRate);
  }
#else
  (void)cuda_device;
#endif
#ifdef TRAINPLAN_HAVE_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess && nccl > 0) {
    // NCCL_VERSION_CODE: 10000 * major + 100 * minor + patch since 2.9 (1000 * major + 100 * minor + patch before).
    const int major = nccl >= 10000 ? nccl / 10000 : nccl / 1000;
    const int rest = nccl >= 10000 ? nccl % 10000 : nccl % 1000;
    e["nccl_version"] = std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
  }
#endif
  return e;
}

std::string apply_allocator_setting(costmodel::Allocator allocator) {
  const std::string wanted = costmodel::allocator_conf(allocator);
  const auto [name, value] = allocator_variable();
  if (value == nullptr) {
    // Both names: PyTorch reads PYTORCH_ALLOC_CONF from 2.9 on, the older name before it.
    if (!wanted.empty()) {
      setenv("PYTORCH_ALLOC_CONF", wanted.c_str(), 0);
      setenv("PYTORCH_CUDA_ALLOC_CONF", wanted.c_str(), 0);
    }
    return "";
  }
  const bool expandable = costmodel::allocator_of_conf(value) == costmodel::Allocator::kExpandableSegments;
  if (expandable == (allocator == costmodel::Allocator::kExpandableSegments)) return "";
  return std::string(name) + "=" + value + " is set, so PyTorch's allocator runs " + (expandable ? "with" : "without") +
         " expandable segments; the plan's allocator is " + costmodel::allocator_name(allocator) +
         " (training.allocator), which the prediction's reserved memory assumes";
}

}  // namespace trainplan::executor
