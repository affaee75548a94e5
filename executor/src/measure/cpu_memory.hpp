#pragma once
// The bytes live in LibTorch's CPU allocator, counted as CUDA's caching allocator counts its
// allocated bytes: a wrapper around c10::GetCPUAllocator() that adds each allocation's size when
// it is made and takes it off when it is freed. The CPU path's measured memory
// (memory.total_bytes, activations_bytes): every tensor of the run, model states included, with
// no cache (what is allocated is what is held). Memory outside LibTorch (MPI's buffers, the
// loader's file pages) is not counted.

namespace trainplan::executor {

// Installs the counter as the CPU allocator (once; later calls do nothing). Allocations made
// before it are not counted, nor their frees.
void install_cpu_memory_counter();
[[nodiscard]] bool cpu_memory_counted();  // installed
[[nodiscard]] double cpu_allocated_bytes();
// The most bytes live at once since the last reset (or the install).
[[nodiscard]] double cpu_peak_allocated_bytes();
void cpu_reset_peak();

}  // namespace trainplan::executor
