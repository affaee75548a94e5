// CUDA helpers (see gpu.hpp).

#include "gpu.hpp"

#include <algorithm>
#include <stdexcept>

#ifdef TRAINPLAN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace trainplan::executor {

#ifdef TRAINPLAN_HAVE_CUDA
bool cuda_present() { return c10::cuda::device_count() > 0; }
int cuda_set_device(int local_rank) {
  const int index = local_rank % std::max<int>(1, c10::cuda::device_count());
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return index;
}
void cuda_synchronize() { c10::cuda::device_synchronize(); }
std::string cuda_device_name() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, c10::cuda::current_device()) != cudaSuccess) return "cuda";
  return prop.name;
}
double cuda_peak_allocated_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  return static_cast<double>(stats.allocated_bytes[0].peak);
}
double cuda_peak_reserved_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  return static_cast<double>(stats.reserved_bytes[0].peak);
}
void cuda_reset_peak() { c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device()); }
void cuda_empty_cache() { c10::cuda::CUDACachingAllocator::emptyCache(); }

namespace {
cudaDeviceProp current_properties() {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, c10::cuda::current_device());
  if (e != cudaSuccess) throw std::runtime_error(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e));
  return prop;
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
}  // namespace

double cuda_total_memory_bytes() { return static_cast<double>(current_properties().totalGlobalMem); }
int cuda_sm_count() { return current_properties().multiProcessorCount; }
std::string cuda_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  return "CUDA runtime " + version_text(runtime) + ", driver " + version_text(driver);
}

CudaInterval::CudaInterval() {
  cudaEvent_t a = nullptr, b = nullptr;
  check_cuda(cudaEventCreate(&a), "cudaEventCreate");
  if (cudaEventCreate(&b) != cudaSuccess) {
    cudaEventDestroy(a);
    throw std::runtime_error("cudaEventCreate failed");
  }
  start_ = a;
  stop_ = b;
}
CudaInterval::~CudaInterval() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void CudaInterval::start() {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(start_), c10::cuda::getCurrentCUDAStream().stream()), "cudaEventRecord");
}
void CudaInterval::stop() {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(stop_), c10::cuda::getCurrentCUDAStream().stream()), "cudaEventRecord");
}
double CudaInterval::seconds() {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)), "cudaEventElapsedTime");
  return ms * 1e-3;
}
#else
bool cuda_present() { return false; }
int cuda_set_device(int) { return 0; }
void cuda_synchronize() {}
std::string cuda_device_name() { return "none"; }
double cuda_peak_allocated_bytes() { return 0; }
double cuda_peak_reserved_bytes() { return 0; }
void cuda_reset_peak() {}
void cuda_empty_cache() {}
double cuda_total_memory_bytes() { return 0; }
int cuda_sm_count() { return 0; }
std::string cuda_versions() { return ""; }
CudaInterval::CudaInterval() { throw std::logic_error("CudaInterval: this executor was built without CUDA"); }
CudaInterval::~CudaInterval() = default;
void CudaInterval::start() { throw std::logic_error("CudaInterval: no CUDA"); }
void CudaInterval::stop() { throw std::logic_error("CudaInterval: no CUDA"); }
double CudaInterval::seconds() { throw std::logic_error("CudaInterval: no CUDA"); }
#endif

}  // namespace trainplan::executor
