#pragma once
// The GPU kernels of one training step, ranked by their total time (`executor --kernel-profile
// FILE`, the step --trace-step names): what to fuse next, measured rather than guessed. Uses
// LibTorch's Kineto profiler (CUPTI), recording device activity only, so every kernel counts
// once whichever thread launched it (autograd's device threads too).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainplan::executor {

// One kernel name's share of a step.
struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;  // summed device time
  // Summed time the device ran no kernel right before this one's calls began (from the end of
  // the last kernel to end before it): where the step waits for the host (launches, host
  // synchronisation) rather than for memory or arithmetic.
  double idle_before_seconds = 0;
};

// One kernel run on the device: its name, start and duration in nanoseconds (any origin).
struct KernelRecord {
  std::string name;
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
};

// Kernel records summed by name, largest first (ties by name). Idle time is attributed in start
// order: a kernel starting after every earlier one has ended gets the gap before it; kernels that
// overlap (other streams) get none. The first kernel's gap is not counted.
[[nodiscard]] std::vector<KernelTime> rank_kernels(std::vector<KernelRecord> records);

// CSV: kernel,calls,total_ms,share_of_kernel_time,share_of_step,idle_before_ms (shares from 0
// to 1), a header line first; `step_seconds` is the step's wall time.
[[nodiscard]] std::string kernel_table_csv(const std::vector<KernelTime>& kernels, double step_seconds);

// Records the device's kernels between start() and stop(). REQUIRES: a CUDA device (the trainer
// refuses --kernel-profile on CPU).
class KernelProfiler {
 public:
  KernelProfiler();
  ~KernelProfiler();
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;
  void start();
  // Stops, returns what ran ranked.
  [[nodiscard]] std::vector<KernelTime> stop();

 private:
  bool running_ = false;
};

}  // namespace trainplan::executor
