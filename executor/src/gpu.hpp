#pragma once
// The few CUDA calls the trainer needs, kept in one translation unit (gpu.cpp, or stand-ins when
// LibTorch has no CUDA).

#include <cstdint>
#include <string>

namespace trainplan::executor {

[[nodiscard]] bool cuda_present();
void cuda_set_device(int index);
void cuda_synchronize();
[[nodiscard]] std::string cuda_device_name();
// Peak bytes allocated by the caching allocator on the current device since the last reset.
[[nodiscard]] double cuda_peak_allocated_bytes();
[[nodiscard]] double cuda_peak_reserved_bytes();
void cuda_reset_peak();

}  // namespace trainplan::executor
