// Phase timing with CUDA events or the host clock (see phase_timer.hpp).

#include "phase_timer.hpp"

#include <exception>
#include <stdexcept>

#ifdef TRAINPLAN_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace trainplan::executor {

namespace {

constexpr const char* kPhaseNames[kPhaseCount] = {"step", "forward", "backward", "data_parallel_wait", "pipeline_receive", "optimizer"};

#ifdef TRAINPLAN_HAVE_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("phase timer: ") + what + ": " + cudaGetErrorString(e));
}
#endif

}  // namespace

const char* phase_name(Phase phase) { return kPhaseNames[static_cast<std::size_t>(phase)]; }

std::optional<Phase> phase_from_name(const std::string& name) {
  for (std::size_t i = 1; i < kPhaseCount; ++i) {
    if (name == kPhaseNames[i]) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

PhaseTimer::PhaseTimer(at::Device device) : device_(device), cuda_(device.is_cuda()) {
#ifndef TRAINPLAN_HAVE_CUDA
  if (cuda_) throw std::logic_error("PhaseTimer: this executor was built without CUDA");
#endif
  stack_.push_back({Phase::kOther, -1});
}

PhaseTimer::~PhaseTimer() {
#ifdef TRAINPLAN_HAVE_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void* PhaseTimer::event(std::size_t index) {
#ifdef TRAINPLAN_HAVE_CUDA
  while (events_.size() <= index) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
  return events_[index];
#else
  (void)index;
  throw std::logic_error("PhaseTimer: no CUDA");
#endif
}

void PhaseTimer::mark() {
  const std::size_t index = mark_phase_.size();
  mark_phase_.push_back(stack_.back().phase);
  if (!cuda_) {
    mark_time_.push_back(std::chrono::steady_clock::now());
    return;
  }
#ifdef TRAINPLAN_HAVE_CUDA
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event(index)), c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
             "cudaEventRecord");
#endif
}

void PhaseTimer::begin_step(int64_t step) {
  step_ = step;
  stack_.assign(1, Frame{Phase::kOther, -1});
  mark_phase_.clear();
  mark_time_.clear();
  mark();
}

void PhaseTimer::push(Phase phase, int micro_batch) {
  stack_.push_back({phase, micro_batch >= 0 ? micro_batch : stack_.back().micro_batch});
  mark();
  if (injection_ && injection_->phase == phase && (injection_->micro_batch < 0 || injection_->micro_batch == stack_.back().micro_batch) &&
      (injection_->step == 0 || injection_->step == step_)) {
    // A real request the allocator cannot satisfy, so that the real failure path runs.
    at::Tensor impossible = at::empty({int64_t{1} << 60}, at::TensorOptions().dtype(at::kByte).device(device_));
    (void)impossible;
  }
}

void PhaseTimer::pop() {
  if (stack_.size() <= 1) throw std::logic_error("PhaseTimer::pop without a phase");
  stack_.pop_back();
  mark();
}

void PhaseTimer::end_step() {
  stack_.assign(1, Frame{Phase::kOther, -1});
  mark();
}

PhaseSeconds PhaseTimer::collect() {
  PhaseSeconds out;
  const std::size_t n = mark_phase_.size();
  if (n < 2) return out;
  if (!cuda_) {
    for (std::size_t i = 0; i + 1 < n; ++i) {
      out.seconds[static_cast<std::size_t>(mark_phase_[i])] += std::chrono::duration<double>(mark_time_[i + 1] - mark_time_[i]).count();
    }
    return out;
  }
#ifdef TRAINPLAN_HAVE_CUDA
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[n - 1])), "cudaEventSynchronize");
  for (std::size_t i = 0; i + 1 < n; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i]), static_cast<cudaEvent_t>(events_[i + 1])),
               "cudaEventElapsedTime");
    out.seconds[static_cast<std::size_t>(mark_phase_[i])] += ms * 1e-3;
  }
#endif
  return out;
}

PhaseScope::PhaseScope(PhaseTimer* timer, Phase phase, int micro_batch) : timer_(timer), exceptions_(std::uncaught_exceptions()) {
  if (timer_ != nullptr) timer_->push(phase, micro_batch);
}

PhaseScope::~PhaseScope() {
  // Unwinding: leave the phase on the stack for the catch site (begin_step() clears it).
  if (timer_ == nullptr || std::uncaught_exceptions() != exceptions_) return;
  try {
    timer_->pop();
  } catch (const std::exception&) {
    // Only a failing cudaEventRecord throws here: the CUDA context is broken and the next CUDA
    // call of the step reports it; a destructor must not throw.
  }
}

}  // namespace trainplan::executor
