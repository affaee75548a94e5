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

}  // namespace trainplan::executor
