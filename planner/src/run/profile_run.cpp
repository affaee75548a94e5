#include "trainplan/planner/profile_run.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "statistics.hpp"

namespace trainplan::planner {

namespace fs = std::filesystem;
using costmodel::Error;
using costmodel::Result;

namespace {

// printf into a std::string.
template <typename... Args>
std::string format(const char* pattern, Args... args) {
  char text[512];
  std::snprintf(text, sizeof text, pattern, args...);
  return text;
}

}  // namespace

Result<bool> check_profile_run(const ProfileRunOptions& o, int gpus_per_node) {
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    return Error{"--device: expected auto, cpu or cuda (got \"" + o.device + "\")"};
  }
  if (o.ranks < 1 || o.ranks > gpus_per_node) {
    return Error{"--ranks " + std::to_string(o.ranks) + ": must be from 1 to the base profile's GPUs per node (" + std::to_string(gpus_per_node) +
                 "): the collectives are measured inside one node"};
  }
  if (o.threads < 0 || o.threads > 1024) return Error{"--threads: must be from 0 (every core) to 1024 (got " + std::to_string(o.threads) + ")"};
  if (o.out.empty()) return Error{"--out: the executor writes the profile to a file; give one"};
  return true;
}

std::vector<std::string> profile_command(const ProfileRunOptions& o) {
  std::vector<std::string> argv;
  if (o.ranks > 1) {
    argv = {o.mpirun, "--oversubscribe", "-n", std::to_string(o.ranks)};
    if (o.allow_run_as_root) argv.emplace_back("--allow-run-as-root");
    for (const char* word : {"--mca", "btl_vader_single_copy_mechanism", "none"}) argv.emplace_back(word);
  }
  for (const std::string& word : {o.executor, std::string("--profile"), fs::absolute(o.out).string(), std::string("--device"), o.device}) {
    argv.push_back(word);
  }
  const auto add = [&](const char* flag, const std::string& value) {
    if (value.empty()) return;
    argv.emplace_back(flag);
    argv.push_back(value);
  };
  add("--base", o.base);
  add("--name", o.name);
  add("--command", o.command);
  if (o.threads > 0) add("--threads", std::to_string(o.threads));
  if (o.quick) argv.emplace_back("--quick");
  return argv;
}

std::string profile_summary(const costmodel::HardwareProfile& p) {
  std::string out = "profile " + p.name + ": " + p.gpu.name + "\n";
  const costmodel::KernelTables* k = p.gpu.kernels.get();
  if (k == nullptr) return out + "  no kernel tables\n";
  std::vector<double> gemm_rates, attention_rates;
  for (const auto& g : k->gemm) gemm_rates.push_back(2.0 * g.m * g.n * g.k / g.seconds / 1e12);
  for (const auto& a : k->attention) {
    const double flops = 4.0 * a.batch * a.heads * a.seq_len * a.seq_len * a.head_dim * (k->attention_causal ? 0.5 : 1.0);
    attention_rates.push_back(flops / a.forward_seconds / 1e12);
  }
  int elementwise_rows = 0, elementwise_ops = 0;
  for (const auto& rows : k->elementwise) {
    elementwise_rows += static_cast<int>(rows.size());
    elementwise_ops += rows.empty() ? 0 : 1;
  }
  out += "  rows: " + std::to_string(k->gemm.size()) + " GEMM, " + std::to_string(k->attention.size()) + " attention, " +
         std::to_string(elementwise_rows) + " element-wise (" + std::to_string(elementwise_ops) + " ops)\n";
  if (gemm_rates.empty() || attention_rates.empty()) return out + "  empty GEMM or attention table\n";
  out += format("  GEMM (%s): median %.4g TFLOP/s, best %.4g TFLOP/s\n", costmodel::dtype_name(k->gemm_dtype), median(gemm_rates),
                 *std::max_element(gemm_rates.begin(), gemm_rates.end()));
  out += format("  attention forward (causal): median %.4g TFLOP/s, best %.4g TFLOP/s\n", median(attention_rates),
                *std::max_element(attention_rates.begin(), attention_rates.end()));
  out += format("  copy %.4g GB/s", k->copy_bandwidth / 1e9);
  if (k->adamw_fused_bandwidth > 0) out += format(", fused AdamW %.4g GB/s", k->adamw_fused_bandwidth / 1e9);
  out += format(", kernel latency %.3g us\n", k->kernel_latency * 1e6);
  if (const costmodel::MeasuredCollectives* m = p.intra_node.measured.get()) {
    out += "  collectives on " + std::to_string(m->ranks) + " ranks (bus bandwidth, largest message):";
    const std::pair<const char*, const std::vector<costmodel::BusBandwidthSample>*> kinds[] = {
        {"all-reduce", &m->all_reduce}, {"all-gather", &m->all_gather}, {"reduce-scatter", &m->reduce_scatter}};
    for (const auto& [name, rows] : kinds) {
      if (rows->empty()) continue;
      out += format(" %s %.3g GB/s at %.3g MB (%zu sizes);", name, rows->back().bus_bandwidth / 1e9, rows->back().bytes / 1e6, rows->size());
    }
    out.back() = '\n';
  }
  return out;
}

}  // namespace trainplan::planner
