// Kernel tables from microbenchmark samples (kernel_import.hpp).

#include "trainplan/costmodel/kernel_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "trainplan/costmodel/statistics.hpp"

namespace trainplan::costmodel {

namespace {

// "4096x1024x2048": the numbers of a shape, whole ones without a fraction.
std::string shape_text(std::initializer_list<double> values) {
  std::string out;
  for (double v : values) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    if (!out.empty()) out += 'x';
    out += text;
  }
  return out;
}

// What no GPU reaches, so that a sample beyond it is a unit or typing error, not a measurement:
// 100 PFLOP/s of one kernel (a B300's dense fp4 peak is 15 PFLOP/s, NVIDIA's datasheet) and 100
// TB/s of memory traffic, at least one byte an element (a B300's HBM3e: 8 TB/s).
constexpr double kImpossibleFlops = 1e17;
constexpr double kImpossibleElementsPerSecond = 1e14;

}  // namespace

Result<KernelImport> build_kernel_tables(const KernelSamples& samples, double fallback_latency) {
  if (samples.gemm.empty()) return Error{"no GEMM samples: a kernel table needs measured GEMMs"};
  if (samples.attention.empty()) return Error{"no attention samples: a kernel table needs measured attention"};
  if (samples.copy_gb_per_s.empty()) return Error{"no copy sample: the copy bandwidth is needed for streaming kernels"};
  KernelImport out;
  KernelTables& k = out.tables;
  std::map<std::tuple<double, double, double>, std::vector<double>> gemm;
  std::map<std::tuple<double, double, double, double>, std::vector<std::pair<double, double>>> attention;  // forward, forward+backward
  // (op, elements) -> forward, backward seconds; (op, shape) -> {tokens: forward seconds} for the latency fit
  std::map<std::pair<int, double>, std::vector<std::pair<double, double>>> elementwise;
  std::map<std::pair<std::string, std::string>, std::map<double, double>> by_size;

  for (const auto& g : samples.gemm) {
    if (!(g.m > 0 && g.n > 0 && g.k > 0 && g.seconds > 0 && std::isfinite(g.seconds))) {
      return Error{"GEMM sample " + shape_text({g.m, g.n, g.k}) + ": every value must be a finite number > 0"};
    }
    if (const double flops = 2 * g.m * g.n * g.k / g.seconds; flops > kImpossibleFlops) {
      return Error{"GEMM sample " + shape_text({g.m, g.n, g.k}) + " in " + shape_text({g.seconds}) + " s: " + shape_text({flops / 1e15}) +
                   " PFLOP/s, beyond any GPU (a unit or shape typed wrong?)"};
    }
    gemm[{g.m, g.n, g.k}].push_back(g.seconds);
  }
  for (const auto& a : samples.attention) {
    attention[{a.head_dim, a.seq_len, a.heads, a.batch}].push_back({a.forward_seconds, a.forward_backward_seconds});
  }
  for (const auto& e : samples.elementwise) {
    const ElementwiseOpInfo* info = elementwise_op_named(e.op);
    if (info == nullptr) return Error{"element-wise sample: unknown op \"" + e.op + "\""};
    if (!(e.tokens > 0 && e.width > 0 && e.forward_seconds > 0 && e.backward_seconds > 0 && std::isfinite(e.forward_seconds) &&
          std::isfinite(e.backward_seconds))) {
      return Error{"element-wise sample " + e.op + " " + shape_text({e.tokens, e.width}) + ": every value must be a finite number > 0"};
    }
    // The forward only: a backward may launch nothing (a residual add's gradient passes through:
    // the H100 CSVs time it at 1e-9 s).
    if (e.tokens * e.width / e.forward_seconds > kImpossibleElementsPerSecond) {
      return Error{"element-wise sample " + e.op + " " + shape_text({e.tokens, e.width}) +
                   ": more than 1e14 elements a second, beyond any GPU's memory (a unit typed wrong?)"};
    }
    elementwise[{static_cast<int>(info->op), e.tokens * e.width}].push_back({e.forward_seconds, e.backward_seconds});
    by_size[{e.op, e.shape.empty() ? shape_text({e.width}) : e.shape}][e.tokens] = e.forward_seconds;
  }

  // Kernel latency: intercepts of element-wise ops timed at two sizes, per kernel.
  std::vector<double> intercepts;
  for (const auto& [key, sizes] : by_size) {
    if (sizes.size() < 2) continue;
    const auto first = sizes.begin();
    const auto second = std::next(first);
    if (second->first != 2 * first->first) continue;
    const double intercept = (2 * first->second - second->second) / elementwise_op_named(key.first)->forward_kernels;
    if (intercept > 0) intercepts.push_back(intercept);
  }
  k.kernel_latency = intercepts.empty() ? fallback_latency : std::round(std::clamp(median(intercepts), 0.5e-6, 20e-6) * 1e8) / 1e8;  // 0.01 us
  out.notes.push_back(intercepts.empty() ? "kernel latency: not measurable from these samples, the fallback (" + shape_text({fallback_latency * 1e6}) + " us)"
                                         : "kernel latency: median intercept of " + std::to_string(intercepts.size()) +
                                               " element-wise ops timed at two sizes");
  k.copy_bandwidth = median(samples.copy_gb_per_s) * 1e9;
  k.adamw_fused_bandwidth = samples.adamw_fused_gb_per_s.empty() ? 0 : median(samples.adamw_fused_gb_per_s) * 1e9;
  k.gemm_dtype = Dtype::kBf16;
  for (const auto& [shape, seconds] : gemm) {
    double sum = 0;
    for (double s : seconds) sum += s;
    k.gemm.push_back({std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), sum / seconds.size()});
    out.merged_duplicates += static_cast<int>(seconds.size()) - 1;
  }
  for (const auto& [key, times] : attention) {
    double fwd = 0, both = 0;
    for (const auto& [f, b] : times) {
      fwd += f / times.size();
      both += b / times.size();
    }
    if (!(fwd > 0) || !(both > fwd) || !std::isfinite(both)) {
      return Error{"attention head_dim " + shape_text({std::get<0>(key)}) + ", seq_len " + shape_text({std::get<1>(key)}) +
                   ": needs a forward time and a longer forward+backward time"};
    }
    k.attention.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), fwd, both - fwd});
    out.merged_duplicates += static_cast<int>(times.size()) - 1;
  }
  for (const auto& [key, times] : elementwise) {
    double f = 0, b = 0;
    for (const auto& [fs, bs] : times) {
      f += fs;
      b += bs;
    }
    k.elementwise[static_cast<std::size_t>(key.first)].push_back({key.second, f / times.size(), b / times.size()});
    out.merged_duplicates += static_cast<int>(times.size()) - 1;
    ++out.elementwise_rows;
  }
  out.gemm_rows = static_cast<int>(k.gemm.size());
  out.attention_rows = static_cast<int>(k.attention.size());
  return out;
}

HardwareProfile with_kernel_tables(HardwareProfile base, const KernelImport& import, const std::string& name) {
  auto tables = std::make_shared<KernelTables>(import.tables);
  tables->hbm_bandwidth = base.gpu.hbm_bandwidth.value();  // measured on the profile's own GPU
  tables->prepare(base.gpu.sm_count);
  base.gpu.kernels = std::move(tables);
  if (!name.empty()) base.name = name;
  return base;
}

}  // namespace trainplan::costmodel
