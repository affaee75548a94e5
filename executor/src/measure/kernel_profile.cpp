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

std::vector<KernelTime> rank_kernels(std::vector<KernelRecord> records) {
  std::stable_sort(records.begin(), records.end(), [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  std::map<std::string, KernelTime> by_name;
  uint64_t busy_until = 0;  // the latest end so far
  for (std::size_t i = 0; i < records.size(); ++i) {
    const KernelRecord& r = records[i];
    KernelTime& k = by_name[r.name];
    k.name = r.name;
    ++k.calls;
    k.seconds += static_cast<double>(r.duration_ns) * 1e-9;
    if (i > 0 && r.start_ns > busy_until) k.idle_before_seconds += static_cast<double>(r.start_ns - busy_until) * 1e-9;
    busy_until = std::max(busy_until, r.start_ns + r.duration_ns);
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
  std::string out = "kernel,calls,total_ms,share_of_kernel_time,share_of_step,idle_before_ms\n";
  char line[160];
  for (const KernelTime& k : kernels) {
    std::snprintf(line, sizeof(line), ",%lld,%.4f,%.5f,%.5f,%.4f\n", static_cast<long long>(k.calls), k.seconds * 1e3,
                  total > 0 ? k.seconds / total : 0.0, step_seconds > 0 ? k.seconds / step_seconds : 0.0, k.idle_before_seconds * 1e3);
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
  std::vector<KernelRecord> records;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    records.push_back({e.name(), e.startNs(), e.durationNs()});
  }
  return rank_kernels(records);
}

}  // namespace trainplan::executor
