// CUDA helpers (see gpu.hpp).

#include "gpu.hpp"

#include <algorithm>

#ifdef TRAINPLAN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
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
#else
bool cuda_present() { return false; }
int cuda_set_device(int) { return 0; }
void cuda_synchronize() {}
std::string cuda_device_name() { return "none"; }
double cuda_peak_allocated_bytes() { return 0; }
double cuda_peak_reserved_bytes() { return 0; }
void cuda_reset_peak() {}
#endif

}  // namespace trainplan::executor
