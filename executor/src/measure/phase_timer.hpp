#pragma once
// Where each step's time goes on this rank: forward, backward, data-parallel waits, pipeline
// receives and the optimizer, each exclusive of the others, and which phase (and micro-batch) is
// running now, for a failure report.
//
// Phases nest (a ZeRO-3 parameter gather inside a forward): push() starts an inner phase and
// pauses the outer one, pop() resumes it, so every moment of the step counts for one phase at
// most. Between marks, time counts for the phase on top of the stack; the bottom of the stack is
// kOther, which is not reported (loss reduction, data loading, host bookkeeping).
//
// On CUDA every mark records a CUDA event on the current stream: the time of a phase is the time
// the stream spends on the work queued while it was on top, read once per step in collect()
// after the step's final synchronisation (no host synchronisation inside the micro-batch loop).
// On CPU LibTorch operators are synchronous, so a steady_clock reading at the same marks is the
// same quantity.

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace trainplan::executor {

enum class Phase { kOther, kForward, kBackward, kDataParallelWait, kPipelineReceive, kOptimizer };
inline constexpr std::size_t kPhaseCount = 6;

// "forward", "backward", "data_parallel_wait", "pipeline_receive", "optimizer", "step" (kOther).
[[nodiscard]] const char* phase_name(Phase phase);
// The phase named `name` by phase_name(), except kOther; nullopt for any other text.
[[nodiscard]] std::optional<Phase> phase_from_name(const std::string& name);

// Seconds per phase of one step (index: Phase).
struct PhaseSeconds {
  std::array<double, kPhaseCount> seconds{};
  [[nodiscard]] double operator[](Phase p) const { return seconds[static_cast<std::size_t>(p)]; }
};

// A fault to inject for tests: a real allocation the allocator cannot satisfy when `phase` of
// `micro_batch` (-1: any) of `step` (0: any) begins.
struct OomInjection {
  Phase phase = Phase::kForward;
  int micro_batch = -1;
  int64_t step = 0;
};

class PhaseTimer {
 public:
  // `device`: where the step runs; CUDA devices are timed with events.
  explicit PhaseTimer(at::Device device);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void set_injection(const OomInjection& injection) { injection_ = injection; }

  // Starts step `step` (counting from 1): the stack is kOther only, no marks.
  void begin_step(int64_t step);
  // Starts `phase` for `micro_batch` (-1: that of the enclosing phase). With an injection matching
  // it, asks the allocator for 2^60 bytes (which throws the allocator's out-of-memory error).
  void push(Phase phase, int micro_batch = -1);
  void pop();
  // Ends the step's last phase. REQUIRES: the device work of the step is complete or queued;
  // collect() waits for it.
  void end_step();
  // The step's seconds per phase. On CUDA, waits for the last event.
  [[nodiscard]] PhaseSeconds collect();

  // What is running now (the innermost phase and its micro-batch, -1 for none); after an
  // exception escaped a PhaseScope, where it was thrown.
  [[nodiscard]] Phase current_phase() const { return stack_.back().phase; }
  [[nodiscard]] int current_micro_batch() const { return stack_.back().micro_batch; }
  [[nodiscard]] int64_t step() const { return step_; }

 private:
  struct Frame {
    Phase phase;
    int micro_batch;
  };
  void mark();
  void* event(std::size_t index);  // cudaEvent_t, created on first use and kept

  at::Device device_;
  bool cuda_ = false;
  int64_t step_ = 0;
  std::vector<Frame> stack_;
  std::vector<Phase> mark_phase_;  // mark i opens an interval counted for mark_phase_[i]
  std::vector<std::chrono::steady_clock::time_point> mark_time_;  // CPU
  std::vector<void*> events_;      // CUDA: one per mark, reused every step
  std::optional<OomInjection> injection_;
};

// push() for the scope's life. When the scope ends by an exception the phase stays on the stack,
// so the catch site can read where the failure happened.
class PhaseScope {
 public:
  PhaseScope(PhaseTimer* timer, Phase phase, int micro_batch = -1);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* timer_;
  int exceptions_;
};

}  // namespace trainplan::executor
