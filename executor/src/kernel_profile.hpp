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
};

// Kernel records (name, nanoseconds) summed by name, largest first (ties by name).
[[nodiscard]] std::vector<KernelTime> rank_kernels(const std::vector<std::pair<std::string, uint64_t>>& records);

// CSV: kernel,calls,total_ms,share_of_kernel_time,share_of_step (shares from 0 to 1), a header
// line first; `step_seconds` is the step's wall time.
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
