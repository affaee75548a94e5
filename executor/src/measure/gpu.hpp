#pragma once
// The few CUDA calls the trainer needs, kept in one translation unit (gpu.cpp, or stand-ins when
// LibTorch has no CUDA).

#include <cstdint>
#include <string>

namespace trainplan::executor {

[[nodiscard]] bool cuda_present();
// Selects the GPU of a rank with this node-local index: index % visible devices, so one GPU per
// rank (SLURM --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank) and all GPUs per node both work.
// Returns the device index chosen.
int cuda_set_device(int local_rank);
void cuda_synchronize();
[[nodiscard]] std::string cuda_device_name();
// Peak bytes allocated by the caching allocator on the current device since the last reset.
[[nodiscard]] double cuda_peak_allocated_bytes();
[[nodiscard]] double cuda_peak_reserved_bytes();
void cuda_reset_peak();
// Returns the caching allocator's unused blocks to the driver (between benchmarks of very
// different sizes, so that fragmentation does not run a later one out of memory).
void cuda_empty_cache();
// Properties of the current device: total memory (bytes), streaming multiprocessors.
[[nodiscard]] double cuda_total_memory_bytes();
[[nodiscard]] int cuda_sm_count();
// "CUDA runtime 13.0, driver 13.0" (the versions this process runs with); "" without CUDA.
[[nodiscard]] std::string cuda_versions();

// GPU time of the work queued on the current CUDA stream between start() and stop(), measured
// with CUDA events (not a host clock around asynchronous launches). Without CUDA every call
// throws std::logic_error.
class CudaInterval {
 public:
  CudaInterval();
  ~CudaInterval();
  CudaInterval(const CudaInterval&) = delete;
  CudaInterval& operator=(const CudaInterval&) = delete;
  void start();
  void stop();
  // Blocks until the stop event has completed. REQUIRES: start() and stop() were called.
  [[nodiscard]] double seconds();

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace trainplan::executor
