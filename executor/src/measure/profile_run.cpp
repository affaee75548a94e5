// `executor --profile`: the ranks, the progress bar, the microbenchmark tasks (profile.hpp) and
// the `trainplan/hwprofile/v1` document they become.

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "gpu.hpp"
#include "profile.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/executor/executor.hpp"
#include "trainplan/costmodel/kernel_import.hpp"
#include "rank_output.hpp"
#include "world.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;
namespace fs = std::filesystem;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitRunFailed = 3;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One line on stderr, `profiling [#######-----]  58% sdpa s=4096 d=128`, redrawn at most five
// times a second; nothing at all when disabled (stderr is not a terminal, or not rank 0).
class ProgressBar {
 public:
  ProgressBar(std::size_t total, bool enabled) : total_(std::max<std::size_t>(1, total)), enabled_(enabled) {}
  ~ProgressBar() { finish(); }

  // Task `index` (from 0) of the total starts.
  void begin(std::size_t index, const std::string& label) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
    draw(static_cast<double>(index) / static_cast<double>(total_), label);
    last_ = now;
  }
  // Clears the bar's line so that a message can be printed; the next begin() draws it again.
  void clear_line() {
    if (!enabled_ || !drawn_) return;
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
    drawn_ = false;
  }
  void finish() {
    if (!enabled_ || !drawn_) return;
    draw(1.0, "done");
    std::fputc('\n', stderr);
    drawn_ = false;
    enabled_ = false;
  }

 private:
  void draw(double fraction, const std::string& label) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(kWidth - filled), '-');
    std::fprintf(stderr, "\rprofiling [%s] %3.0f%% %s\x1b[K", bar.c_str(), 100.0 * fraction, label.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  std::size_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// Runs the tasks in order, naming the one that failed.
void run_tasks(std::vector<BenchmarkTask>& tasks, ProgressBar& bar, std::size_t& done, bool cuda) {
  for (BenchmarkTask& task : tasks) {
    bar.begin(done++, task.label);
    try {
      task.run();
      if (cuda) cuda_empty_cache();
    } catch (const c10::Error& e) {
      throw std::runtime_error(task.label + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw std::runtime_error(task.label + ": " + e.what());
    }
  }
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string model = line.substr(colon + 1);
    model.erase(0, model.find_first_not_of(' '));
    return model;
  }
  return "unknown CPU";
}

// The 1-minute load average (/proc/loadavg), or a negative number where it cannot be read.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double one_minute = -1;
  if (!(in >> one_minute)) return -1;
  return one_minute;
}

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// "measured-nvidia-h100-80gb-hbm3": a default profile name from the device description.
std::string slug(const std::string& text) {
  std::string out = "measured-";
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (out.back() != '-') out += '-';
    if (c == '(') break;  // "cpu (AMD EPYC, 2 threads)" -> "measured-cpu-"
  }
  while (out.back() == '-') out.pop_back();
  return out;
}

std::string number(double x, const char* pattern = "%.4g") {
  char text[32];
  std::snprintf(text, sizeof text, pattern, x);
  return text;
}

// Checks what can be checked before any rank starts: option ranges, the base profile, and that
// the output's folder takes a new file (a probe file named for this process, removed at once).
cm::HardwareProfile check_inputs(const ProfileOptions& o) {
  if (o.out_path.empty()) throw InputError("--profile: give the file to write");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") throw InputError("--device: expected auto, cpu or cuda, got \"" + o.device + "\"");
  if (o.threads < 0 || o.threads > 1024) throw InputError("--threads: must be from 0 (every core) to 1024 (got " + std::to_string(o.threads) + ")");
  if (o.timeout_seconds < 1) throw InputError("--timeout: must be at least 1 second (got " + std::to_string(o.timeout_seconds) + ")");
  auto base = cm::find_hwprofile(o.base);
  if (!base) throw InputError("--base: " + base.error().message);
  if (fs::is_directory(o.out_path)) throw InputError("--profile " + o.out_path + ": is a directory; give a file name");
  const std::string probe = o.out_path + ".probe-" + std::to_string(::getpid());
  {
    std::ofstream out(probe);
    if (!out) throw InputError("--profile " + o.out_path + ": cannot create a file in " + fs::absolute(o.out_path).parent_path().string());
  }
  std::error_code ec;
  fs::remove(probe, ec);
  return std::move(base).value();
}

struct Measured {
  KernelMeasurements kernels;
  cm::MeasuredCollectives collectives;  // ranks == 0: not measured
  int threads = 0;                      // CPU threads the kernels ran on
  double load_before = -1;              // CPU: the 1-minute load average when the kernels started
  double seconds = 0;
};

// The profile: `base` with the measured tables and what describes the device measured.
cm::HardwareProfile build_profile(const ProfileOptions& o, const cm::HardwareProfile& base, const Measured& m, const World& w,
                                  const std::string& command) {
  const bool cuda = w.device.is_cuda();
  const std::string device = cuda ? w.device_name : "cpu (" + cpu_model() + ", " + std::to_string(m.threads) + (m.threads == 1 ? " thread)" : " threads)");
  const std::string date = today();
  const ProfileSweep sweep = profile_sweep(cuda, o.quick);
  const double latency_fallback = std::clamp(m.kernels.tiny_kernel_seconds, 0.5e-6, 20e-6);
  auto built = costmodel::build_kernel_tables(m.kernels.samples, latency_fallback);
  if (!built) throw std::runtime_error("the measured samples do not make kernel tables: " + built.error().message);
  costmodel::KernelImport tables = std::move(built).value();
  std::string versions = std::string("LibTorch ") + TORCH_VERSION;
  if (cuda) versions += ", " + cuda_versions();
  tables.tables.source = device + "; " + versions + "; " + date + "; `" + command + "`; " + std::to_string(sweep.repeats) + " calls after " +
                         std::to_string(sweep.warmup) + " warm-up calls per shape, " +
                         (cuda ? "CUDA events, mean" : "steady_clock, median") + "; AdamW: " + m.kernels.adamw_implementation + "; " +
                         (tables.notes.empty() ? std::string() : tables.notes.front()) +
                         (tables.notes.empty() || tables.notes.front().find("fallback") == std::string::npos ? ""
                                                                                                             : " = one tiny kernel's time") +
                         (!cuda && m.load_before >= 0 ? "; load average " + number(m.load_before, "%.2f") + " when the kernels started" : "");

  cm::HardwareProfile p = base;
  p.gpu.name = device;
  p.gpu.sm_count = cuda ? cuda_sm_count() : m.threads;
  p.gpu.hbm_capacity = cm::Bytes(cuda ? cuda_total_memory_bytes() : physical_memory_bytes());
  p = costmodel::with_kernel_tables(std::move(p), tables, o.name.empty() ? slug(device) : o.name);
  const cm::KernelTables& k = *p.gpu.kernels;
  double best_gemm = 0, best_attention = 0;
  for (const auto& g : k.gemm) best_gemm = std::max(best_gemm, 2.0 * g.m * g.n * g.k / g.seconds);
  for (const auto& a : k.attention) best_attention = std::max(best_attention, 2.0 * a.batch * a.heads * a.seq_len * a.seq_len * a.head_dim / a.forward_seconds);
  p.gpu.min_kernel_time = cm::Seconds(k.kernel_latency);
  if (cuda) {
    const double peak = base.gpu.peak_for(cm::Dtype::kBf16).value();
    if (best_gemm > peak) {
      print_for_rank(0, "executor: warning: a measured bf16 GEMM ran at " + number(best_gemm / 1e12) + " TFLOP/s, above the base profile's peak of " +
                            number(peak / 1e12) + " TFLOP/s (" + base.gpu.name + "): give --base a profile of this GPU");
    }
    const double hbm = base.gpu.hbm_bandwidth.value(), capacity = base.gpu.hbm_capacity.value();
    if (k.copy_bandwidth > hbm) {
      print_for_rank(0, "executor: warning: the measured copy ran at " + number(k.copy_bandwidth / 1e9) + " GB/s, above the base profile's HBM bandwidth of " +
                            number(hbm / 1e9) + " GB/s (" + base.gpu.name + "): give --base a profile of this GPU");
    }
    if (std::abs(p.gpu.hbm_capacity.value() - capacity) > 0.1 * capacity) {
      print_for_rank(0, "executor: warning: this GPU has " + number(p.gpu.hbm_capacity.in_gib()) + " GiB, the base profile's " + base.gpu.name + " " +
                            number(base.gpu.hbm_capacity.in_gib()) + " GiB: its peaks and HBM bandwidth are probably another GPU's; give --base a "
                            "profile of this GPU (or correct both gpu.hbm_bandwidth_tb_per_s and gpu.kernels.hbm_tb_per_s, the bandwidth "
                            "the tables were measured at, in the written profile)");
    }
    p.gpu.gemm_efficiency = std::min(1.0, best_gemm / peak);
    p.gpu.attention_efficiency = std::min(1.0, best_attention / peak);
    p.gpu.memory_efficiency = std::min(1.0, k.copy_bandwidth / base.gpu.hbm_bandwidth.value());
    p.gpu.source = "name, sm_count, HBM capacity: this device (cudaGetDeviceProperties); peaks and HBM bandwidth: " + base.name +
                   "'s figures (" + base.gpu.name + ", datasheet); gemm_efficiency, attention_efficiency: the fastest measured bf16 GEMM and " +
                   "causal SDPA forward over that bf16 peak; memory_bandwidth_efficiency: the measured copy over that HBM bandwidth; " +
                   "min_kernel_us: the tables' kernel latency; reserved memory: " + base.name + "'s; measured " + date;
  } else {
    double best_fp32 = 0;
    for (double r : m.kernels.gemm_fp32_flops_per_second) best_fp32 = std::max(best_fp32, r);
    p.gpu.peak[static_cast<int>(cm::Dtype::kBf16)] = cm::FlopsPerSecond(best_gemm);
    p.gpu.peak[static_cast<int>(cm::Dtype::kFp16)] = cm::FlopsPerSecond(best_gemm);
    p.gpu.peak[static_cast<int>(cm::Dtype::kFp32)] = cm::FlopsPerSecond(best_fp32 > 0 ? best_fp32 : best_gemm);
    p.gpu.peak[static_cast<int>(cm::Dtype::kFp8)] = cm::FlopsPerSecond(0);
    p.gpu.hbm_bandwidth = cm::BytesPerSecond(k.copy_bandwidth);
    p.gpu.gemm_efficiency = 1.0;
    p.gpu.memory_efficiency = 1.0;
    p.gpu.attention_efficiency = std::min(1.0, best_attention / best_gemm);
    p.gpu.source = "a CPU measured by the executor's microbenchmarks, " + date +
                   ": peak bf16 (and fp16, not measured on its own) = the fastest measured bf16 GEMM and fp32 = the fastest fp32 GEMM, "
                   "measured maxima, not datasheet figures (gemm_efficiency 1 for that reason); attention_efficiency = the fastest causal SDPA "
                   "forward over that bf16 peak; HBM = this machine's RAM: capacity = physical memory, bandwidth = the measured copy "
                   "(memory_bandwidth_efficiency 1); sm_count = CPU threads; min_kernel_us = the tables' kernel latency; no fp8; reserved "
                   "memory: " + base.name + "'s";
    // The tables were measured on this machine: their memory-bound samples are at its bandwidth,
    // not the base profile's (KernelTables::hbm_bandwidth).
    auto tables_here = std::make_shared<cm::KernelTables>(*p.gpu.kernels);
    tables_here->hbm_bandwidth = p.gpu.hbm_bandwidth.value();
    p.gpu.kernels = std::move(tables_here);
  }
  if (m.collectives.ranks > 1) {
    auto table = std::make_shared<cm::MeasuredCollectives>(m.collectives);
    table->source = std::to_string(table->ranks) + " " + (cuda ? w.device_name + " ranks over NCCL" : "CPU ranks over MPI") +
                    ", fp32 tensors, " + date + ": bus bandwidth (nccl-tests convention) from the slowest rank's " +
                    (cuda ? "mean" : "median") + " of " + std::to_string(sweep.collective_repeats) + " calls after " +
                    std::to_string(sweep.collective_warmup) + " warm-up calls";
    // Large-message bus bandwidth, as link efficiencies are quoted: all-reduce at the largest size.
    const double large = table->all_reduce.empty() ? 0.0 : table->all_reduce.back().bus_bandwidth;
    if (large > 0 && cuda) {
      p.intra_node.efficiency = std::min(1.0, large / p.intra_node.bandwidth.value());
      p.intra_node.source = base.intra_node.source + "; efficiency: the measured all-reduce bus bandwidth at the largest message over that rate (`measured`, " +
                            date + ")";
    } else if (large > 0) {
      p.intra_node.bandwidth = cm::BytesPerSecond(large);
      p.intra_node.efficiency = 1.0;
      p.intra_node.source = "CPU ranks: bandwidth = the measured all-reduce bus bandwidth at the largest message (`measured`), efficiency 1; kind and latency: " +
                            base.name + "'s";
    }
    p.intra_node.measured = std::move(table);
  }
  p.source = "measured on " + device + " by `" + command + "` (" + date + "); the node, inter_node, storage, reliability and price sections: " +
             base.name + "'s";
  if (!cuda && p.collectives_overlap_compute) {
    // Open MPI's shared-memory collectives copy and reduce on the CPU cores the ranks compute on,
    // and the executor gives each rank cores / ranks threads: no core is left to run them beside
    // the compute (the progress thread of comm_mpi.cpp drives them on the same cores).
    p.collectives_overlap_compute = false;
    p.node_source += std::string(p.node_source.empty() ? "" : "; ") +
                     "collectives_overlap_compute false: CPU ranks, whose MPI collectives copy and reduce on the cores that compute";
  }
  return p;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(path + ": cannot write the profile");
    out << text;
    if (!out) throw std::runtime_error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp);
}

// Every rank: the collectives (several ranks); then rank 0 alone: the kernels and the document.
int profile(const ProfileOptions& o, const std::string& command, World& w, const cm::HardwareProfile& base) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = w.comm->rank(), size = w.comm->size();
  if (size > base.gpus_per_node) {
    throw InputError(std::to_string(size) + " ranks: the collectives are measured inside one node and --base " + o.base + " has " +
                     std::to_string(base.gpus_per_node) + " GPUs per node");
  }
  const bool cuda = w.device.is_cuda();
  const ProfileSweep sweep = profile_sweep(cuda, o.quick);
  Measured m;
  m.threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<BenchmarkTask> collectives;
  if (size > 1) collectives = collective_tasks(sweep, *w.comm, w.device, m.collectives);
  std::vector<BenchmarkTask> kernels;
  if (rank == 0) kernels = kernel_tasks(sweep, w.device, m.kernels);
  ProgressBar bar(collectives.size() + kernels.size(), rank == 0 && ::isatty(STDERR_FILENO));
  std::size_t done = 0;
  if (size > 1) {
    run_tasks(collectives, bar, done, cuda);
    m.collectives.ranks = size;
    w.comm->barrier();
  }
  // The other ranks are done; their communicators go now so that none waits on rank 0's kernels.
  w.comm.reset();
  w.bootstrap.reset();
  if (rank != 0) return 0;

  if (!cuda) {
    at::set_num_threads(m.threads);
    m.load_before = load_average();
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    if (m.load_before > 0.5 * cores) {
      bar.clear_line();
      print_for_rank(0, "executor: warning: load average " + number(m.load_before, "%.2f") + " on " + std::to_string(cores) +
                            " cores: other processes share the CPU, so its kernels time slower and less steadily than on an idle machine");
    }
  }
  run_tasks(kernels, bar, done, cuda);
  bar.finish();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string recorded = o.command.empty() ? command : o.command;
  const std::string file_name = fs::path(o.out_path).filename().string();
  for (std::size_t at = recorded.find(o.out_path); at != std::string::npos; at = recorded.find(o.out_path, at + file_name.size())) {
    recorded.replace(at, o.out_path.size(), file_name);  // a profile names no machine's paths
  }
  const cm::HardwareProfile p = build_profile(o, base, m, w, recorded);
  const std::string text = cm::readable_json(cm::hwprofile_to_json(p));
  auto check = cm::parse_hwprofile_text(text, o.out_path);
  if (!check) throw std::runtime_error("the measured profile does not read back (a bug): " + check.error().message);
  write_text_atomically(o.out_path, text);
  int elementwise = 0;
  for (const auto& rows : p.gpu.kernels->elementwise) elementwise += static_cast<int>(rows.size());
  std::cout << "profile: wrote " << o.out_path << " (" << p.gpu.kernels->gemm.size() << " GEMM, " << p.gpu.kernels->attention.size()
            << " attention, " << elementwise << " element-wise rows"
            << (p.intra_node.measured ? ", collectives on " + std::to_string(size) + " ranks" : std::string()) << ") in "
            << number(m.seconds, "%.1f") << " s" << std::endl;
  return 0;
}

}  // namespace

int run_profile(const ProfileOptions& o, const std::string& command_line) {
  const int env_rank = launcher_rank();
  cm::HardwareProfile base;
  try {
    base = check_inputs(o);
  } catch (const std::exception& e) {
    if (env_rank == 0) print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }
  World w;
  try {
    w = make_world(o.device, o.timeout_seconds);
  } catch (const std::exception& e) {
    print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }
  int code = 0;
  try {
    code = profile(o, command_line, w, base);
  } catch (const InputError& e) {
    if (env_rank == 0) print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    code = kExitBadInput;
  } catch (const std::exception& e) {
    if (env_rank == 0) std::cerr << "\n";  // ends the progress line
    print_for_rank(env_rank, std::string("executor: profile failed: ") + e.what());
    code = kExitRunFailed;
  }
  if (code != 0 && w.comm && w.comm->size() > 1) w.comm->abort(code);  // no rank is left waiting for this one
  w.comm.reset();
  w.bootstrap.reset();
  finalize_mpi();
  return code;
}

}  // namespace trainplan::executor
