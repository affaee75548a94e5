// Kernel profile of one step (see kernel_profile.hpp).

#include "kernel_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

namespace trainplan::executor {

namespace {

using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

const std::set<ActivityType>& device_only() {
  static const std::set<ActivityType> activities{ActivityType::CUDA};
  return activities;
}

std::string csv_field(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<KernelTime> rank_kernels(const std::vector<std::pair<std::string, uint64_t>>& records) {
  std::map<std::string, KernelTime> by_name;
  for (const auto& [name, ns] : records) {
    KernelTime& k = by_name[name];
    k.name = name;
    ++k.calls;
    k.seconds += static_cast<double>(ns) * 1e-9;
  }
  std::vector<KernelTime> out;
  for (auto& [name, k] : by_name) out.push_back(k);
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

std::string kernel_table_csv(const std::vector<KernelTime>& kernels, double step_seconds) {
  double total = 0;
  for (const KernelTime& k : kernels) total += k.seconds;
  std::string out = "kernel,calls,total_ms,share_of_kernel_time,share_of_step\n";
  char line[128];
  for (const KernelTime& k : kernels) {
    std::snprintf(line, sizeof(line), ",%lld,%.4f,%.5f,%.5f\n", static_cast<long long>(k.calls), k.seconds * 1e3,
                  total > 0 ? k.seconds / total : 0.0, step_seconds > 0 ? k.seconds / step_seconds : 0.0);
    out += csv_field(k.name) + line;
  }
  return out;
}

KernelProfiler::KernelProfiler() = default;

KernelProfiler::~KernelProfiler() {
  if (!running_) return;
  try {  // unwinding from a failed step (out of memory): its report matters, not the profile
    (void)torch::autograd::profiler::disableProfiler();
  } catch (...) {
  }
}

void KernelProfiler::start() {
  const ProfilerConfig config(ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, device_only());
  torch::autograd::profiler::enableProfiler(config, device_only());
  running_ = true;
}

std::vector<KernelTime> KernelProfiler::stop() {
  running_ = false;
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  std::vector<std::pair<std::string, uint64_t>> records;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    records.emplace_back(e.name(), e.durationNs());
  }
  return rank_kernels(records);
}

}  // namespace trainplan::executor
