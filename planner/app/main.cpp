// planner: searches every valid parallel plan for a model on a cluster and recommends one;
// `evaluate` estimates one fixed plan; `compare` sets an estimate beside a measurement; `launch`
// prints the SLURM script or torchrun command that runs a plan; `export` writes what Megatron-LM,
// torchtitan, DeepSpeed or Accelerate needs to run it; `run` runs it here on CPU ranks;
// `validate` predicts every published table and given measurement, row by row; `calibrate` fits a
// profile's efficiencies to measurements; `profile` measures this machine's device with the
// executor (or imports measured CSVs) into a hardware profile; `models` and `hardware` list the
// presets.
// Exit codes: 0 success, 1 no plan fits (for a published configuration too), 2 bad input, 3 the
// run failed (`run`).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "trainplan/costmodel/hf_config.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/calibrate.hpp"
#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/stack_logs.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/inputs.hpp"
#include "trainplan/planner/launch.hpp"
#include "trainplan/planner/local_run.hpp"
#include "trainplan/planner/profile.hpp"
#include "trainplan/planner/profile_run.hpp"
#include "trainplan/planner/report.hpp"
#include "trainplan/planner/search.hpp"
#include "trainplan/planner/validate.hpp"

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

namespace {

constexpr int kExitNoFit = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitRunFailed = 3;

int fail(const std::string& message) {
  std::cerr << "planner: error: " << message << "\n";
  return kExitBadInput;
}

pl::Format parse_format(const std::string& s) {
  if (s == "json") return pl::Format::kJson;
  if (s == "csv") return pl::Format::kCsv;
  if (s == "md") return pl::Format::kMarkdown;
  if (s == "html") return pl::Format::kHtml;
  return pl::Format::kText;
}

// Writes `text` to `path` through `path`.tmp and a rename, so a reader never sees half a file;
// on any failure the temporary file is removed and `error` says why.
bool write_file(const std::string& path, const std::string& text, std::string& error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) { error = path + ": is a directory, not a file"; return false; }
  const std::string tmp = path + ".tmp";
  const auto give_up = [&](const std::string& why) {
    error = path + ": " + why;
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return false;
  };
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) {
      error = path + ": cannot write (" + std::strerror(errno) + ")";
      return false;
    }
    out << text;
    out.close();
    if (!out) return give_up("write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return give_up(std::string("cannot rename the temporary file into place (") + std::strerror(errno) + ")");
  return true;
}

// Applies one "--fix key=value" to the constraints.
std::string apply_fix(const std::string& fix, cm::ParallelConstraints& c) {
  const auto eq = fix.find('=');
  if (eq == std::string::npos) return "--fix " + fix + ": expected key=value (e.g. tp=8)";
  auto applied = pl::apply_constraint(fix.substr(0, eq), fix.substr(eq + 1), c);
  return applied ? "" : "--fix " + fix + ": " + applied.error().message;
}

// The one name of a --fix key that has two ("zero" and "zero_stage" are one setting).
std::string canonical_fix_key(const std::string& key) {
  static const std::map<std::string, std::string> aliases = {{"zero_stage", "zero"}, {"micro_batch", "mb"}, {"virtual_stages", "v"},
                                                             {"sequence_parallel", "sp"}, {"offload_optimizer", "offload"}};
  const auto it = aliases.find(key);
  return it == aliases.end() ? key : it->second;
}

// Whether two --fix values of one key set the same value ("sp=on" and "sp=true" do).
bool same_fix(const std::string& a, const std::string& b) {
  const auto fixed = [](const std::string& fix) {
    cm::ParallelConstraints c;
    (void)apply_fix(fix, c);
    std::string text;
    for (const auto& v : {c.tp, c.pp, c.dp, c.cp, c.ep, c.zero_stage, c.shard_group, c.micro_batch, c.virtual_stages}) text += v ? std::to_string(*v) + "," : "-,";
    text += c.sequence_parallel ? (*c.sequence_parallel ? "on," : "off,") : "-,";
    text += c.schedule ? std::string(cm::schedule_name(*c.schedule)) + "," : "-,";
    text += c.recompute ? std::string(cm::recompute_name(*c.recompute)) + "," : "-,";
    text += c.offload_optimizer ? std::string(cm::offload_name(*c.offload_optimizer)) : "-";
    return text;
  };
  return fixed(a) == fixed(b);
}

std::string join_args(int argc, char** argv) {
  std::string s = "planner";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    s += " " + (a.find(' ') != std::string::npos ? "'" + a + "'" : a);
  }
  return s;
}

int list_models() {
  std::printf("%-16s %10s %7s %7s %6s %4s %7s %8s  %s\n", "model", "params", "arch", "layers", "hidden", "kv", "vocab", "context", "aliases");
  const std::map<std::string, std::string> aliases = {{"llama3-8b", "8b"}, {"llama3-70b", "70b"}, {"llama3-405b", "405b"}, {"gpt3-175b", "175b"},
                                                      {"llama2-7b", "7b"}, {"llama2-13b", "13b"}, {"tinyllama-1.1b", "1.1b, tinyllama"},
                                                      {"gpt2-1.5b", "1.5b"}, {"mixtral-8x7b", "8x7b, mixtral"}};
  for (const auto& name : cm::model_preset_names()) {
    auto m = cm::find_model(name);
    if (!m) return fail(m.error().message);
    const auto& x = *m;
    const auto it = aliases.find(name);
    std::printf("%-16s %10s %7s %7d %6lld %4d %7lld %8lld  %s\n", name.c_str(), pl::si(cm::count_parameters(x).total(x.layers)).c_str(),
                cm::architecture_name(x.architecture), x.layers, static_cast<long long>(x.hidden), x.kv_heads,
                static_cast<long long>(x.vocab), static_cast<long long>(x.max_seq_len), it == aliases.end() ? "" : it->second.c_str());
  }
  std::printf("\nAny model can also be given as a trainplan/model/v1 JSON file or a Hugging Face config.json (or the folder\n"
              "holding it): --model path/to/config.json. Its model_type decides the family (%s).\n",
              cm::hf_model_types());
  return 0;
}

int list_hardware() {
  std::printf("%-13s %-20s %5s %6s %8s %9s %9s %11s  %-22s %8s\n", "cluster", "GPU", "GPUs", "NVLink", "HBM GiB", "HBM TB/s", "bf16 TF/s",
              "NVLink GB/s", "inter-node per node", "$/GPU-h");
  for (const auto& name : cm::hwprofile_preset_names()) {
    auto h = cm::find_hwprofile(name);
    if (!h) return fail(h.error().message);
    const auto& x = *h;
    const std::string inter = std::to_string(x.inter_node.nics_per_node) + " x " +
                              std::to_string(static_cast<int>(x.inter_node.bandwidth.value() * 8 / 1e9)) + " Gb/s " + x.inter_node.kind;
    std::printf("%-13s %-20s %5d %6d %8.0f %9.2f %9.0f %11.0f  %-22s %8.2f%s\n", name.c_str(), x.gpu.name.c_str(), x.gpus_per_node,
                x.nvlink_domain_gpus(), x.gpu.hbm_capacity.in_gib(), x.gpu.hbm_bandwidth.value() / 1e12, x.gpu.peak_for(cm::Dtype::kBf16).in_tflops(),
                x.intra_node.bandwidth.in_gb_per_s(), inter.c_str(), x.price_per_gpu_hour_usd, name == cm::kDefaultCluster ? "  (default)" : "");
  }
  std::printf("\nGPUs: per node (host); NVLink: GPUs in one NVLink domain (a node, or a 72-GPU NVL72 rack of 4-GPU trays).\n"
              "Any cluster can also be given as a trainplan/hwprofile/v1 JSON file: --cluster path/to/cluster.json (format: README.md)\n");
  return 0;
}

// Prints the comparison of an estimate (or fixed plan) file with a measurement file, or with a
// torchtitan or Megatron-LM training log (stack_logs.hpp).
int compare_files(const std::string& estimate_file, const std::string& measurement_file, pl::Format format) {
  auto text = cm::read_text_file(measurement_file);
  if (!text) return fail(text.error().message);
  const auto first = text->find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (*text)[first] != '{') {
    const auto log = pl::detect_stack_log(*text);
    if (!log) {
      return fail(measurement_file + ": neither a trainplan/measurement/v1 document (JSON) nor a torchtitan or Megatron-LM training log "
                  "(no torchtitan step lines, \"step: N  loss: ...  tps: ...\", nor Megatron-LM iteration lines, \"iteration N/ M | ... | "
                  "elapsed time per iteration (ms): ...\")");
    }
    auto sides = pl::load_log_comparison(estimate_file, measurement_file, *text, *log);
    if (!sides) return fail(sides.error().message);
    std::cout << pl::render_comparison(pl::compare(std::move(sides->first), std::move(sides->second)), format);
    return 0;
  }
  auto predicted = pl::load_prediction_file(estimate_file);
  if (!predicted) return fail(predicted.error().message);
  auto measured = pl::load_measurement_file(measurement_file);
  if (!measured) return fail(measured.error().message);
  std::cout << pl::render_comparison(pl::compare(std::move(predicted).value(), std::move(measured).value()), format);
  return 0;
}

int write_chrome_trace(const std::string& measurement_file) {
  auto measured = pl::load_measurement_file(measurement_file);
  if (!measured) return fail(measured.error().message);
  if (!measured->trace || measured->trace->events.empty()) {
    return fail(measurement_file + ": /trace: no events (the executor records one step's events; see --trace-step)");
  }
  std::cout << pl::chrome_trace(*measured->trace).dump() << "\n";
  return 0;
}

int launch_plan(const std::string& plan_file, const pl::LaunchOptions& options, bool slurm) {
  auto plan = pl::load_fixed_plan(plan_file);
  if (!plan) return fail(plan.error().message);
  auto text = slurm ? pl::slurm_script(*plan, plan_file, options) : pl::torchrun_commands(*plan, plan_file, options);
  if (!text) return fail(plan_file + ": " + text.error().message);
  std::cout << *text;
  return 0;
}

// Writes the target stack's file for a fixed plan to stdout or (through a temporary file) `out`;
// the notes go to stderr. A plan the stack cannot express is bad input: nothing is written.
int export_plan(const std::string& plan_file, const std::string& target_name, const std::string& out) {
  auto target = pl::parse_export_target(target_name);
  if (!target) return fail(target.error().message);
  auto plan = pl::load_fixed_plan(plan_file);
  if (!plan) return fail(plan.error().message);
  auto exported = pl::export_plan(*plan, *target);
  if (!exported) return fail(plan_file + ": " + exported.error().message);
  if (out.empty()) {
    std::cout << exported->text;
  } else {
    std::string error;
    if (!write_file(out, exported->text, error)) return fail(error);
  }
  for (const auto& note : exported->notes) std::cerr << "planner: note: " << note << "\n";
  return 0;
}

int run_plan(const std::string& plan_file, pl::LocalRunOptions options, const pl::ExecutorSearch& search,
             const std::string& measurement_file, pl::Format format) {
  auto plan = pl::load_fixed_plan(plan_file);
  if (!plan) return fail(plan.error().message);
  options.plan_path = plan_file;
  options.measurement_path = measurement_file.empty() ? pl::default_measurement_file(plan_file) : measurement_file;
  options.allow_run_as_root = ::geteuid() == 0;
  auto valid = pl::check_local_run(*plan, options);
  if (!valid) return fail(plan_file + ": " + valid.error().message);
  auto executor = pl::find_executor(search);
  if (!executor) return fail(executor.error().message);
  options.executor = *executor;

  std::cerr << "planner: running:";
  for (const auto& word : pl::mpirun_command(*plan, options)) std::cerr << " " << pl::shell_quote(word);
  std::cerr << std::endl;
  auto run = pl::run_locally(*plan, options);
  if (!run) return fail(run.error().message);
  if (!run->exit.success()) {
    // The executor's exit 2: it refused its input (the arguments after --, the plan), not a failed run.
    const bool refused = run->exit.signal == 0 && run->exit.code == 2;
    std::cerr << "planner: error: " << options.mpirun << " " << run->exit.text() << ": "
              << (refused ? "the executor refused its input" : "the run of " + plan_file + " failed") << " (its output is above)\n";
    return refused ? kExitBadInput : kExitRunFailed;
  }
  std::cout << pl::render_comparison(*run->comparison, format);
  return 0;
}

// `planner profile --from-csv`: the base profile with the imported kernel tables, written to
// `out` (or stdout), after checking that the result reads back as a valid profile.
int import_profile(const std::vector<std::string>& csv_files, const std::string& base_name, const std::string& name,
                   const std::string& source, const std::string& out) {
  auto base = cm::find_hwprofile(base_name);
  if (!base) return fail("--base: " + base.error().message);
  // What the CSVs do not measure stays the base's: its measured kernel latency, its element-wise tables.
  const cm::KernelTables* base_tables = base->gpu.kernels.get();
  auto result = pl::import_kernel_csv(csv_files, base_tables ? base_tables->kernel_latency : base->gpu.min_kernel_time.value());
  if (!result) return fail(result.error().message);
  pl::KernelImport imported = std::move(result).value();
  if (base_tables != nullptr && imported.elementwise_rows == 0) {
    imported.tables.elementwise = base_tables->elementwise;
    imported.notes.push_back("element-wise tables kept from the base profile");
  }
  if (!source.empty()) imported.tables.source = source + " (" + imported.tables.source + ")";
  const cm::HardwareProfile profile = pl::with_kernel_tables(std::move(base).value(), imported, name);
  const std::string text = cm::readable_json(cm::hwprofile_to_json(profile));
  auto check = cm::parse_hwprofile_text(text, out.empty() ? "<output>" : out);
  if (!check) return fail("the imported profile does not read back: " + check.error().message);
  std::fprintf(stderr, "planner profile: %d GEMM shapes, %d attention shapes, %d element-wise samples (%d duplicates averaged); %s\n",
               imported.gemm_rows, imported.attention_rows, imported.elementwise_rows, imported.merged_duplicates,
               imported.notes.empty() ? "" : imported.notes.front().c_str());
  if (out.empty()) {
    std::cout << text;
    return 0;
  }
  std::string error;
  if (!write_file(out, text, error)) return fail(error);
  std::fprintf(stderr, "planner profile: wrote %s\n", out.c_str());
  return 0;
}

// Prints every published table and each measurement predicted against what it holds. Bad
// measurements are bad input (2); a published configuration no plan fits any more is 1.
int validate(const std::vector<std::string>& measurement_files, pl::Format format) {
  std::vector<pl::ValidationTable> measured;
  for (const std::string& file : measurement_files) {
    auto table = pl::validate_measurement_file(file);
    if (!table) return fail(table.error().message);
    measured.push_back(std::move(table).value());
  }
  auto tables = pl::validate_published();
  if (!tables) {
    std::cerr << "planner: error: " << tables.error().message << "\n";
    return kExitNoFit;
  }
  std::vector<pl::ValidationTable> all = std::move(tables).value();
  for (auto& table : measured) all.push_back(std::move(table));
  std::cout << pl::render_validation(all, format);
  return 0;
}

// `planner calibrate`: fits the profile's calibration to the measurements, prints each run's
// error before and after, and writes the calibrated profile.
int calibrate_profile(const std::vector<std::string>& files, const std::string& base_name, const std::string& out, pl::Format format) {
  std::vector<pl::MeasuredRun> runs;
  for (const auto& file : files) {
    auto run = pl::load_measured_run(file, base_name);
    if (!run) return fail(run.error().message);
    runs.push_back(std::move(run).value());
  }
  cm::HardwareProfile base = runs.front().plan.cluster;
  if (!base_name.empty()) {
    auto found = cm::find_hwprofile(base_name);
    if (!found) return fail("--cluster: " + found.error().message);
    base = std::move(found).value();
  } else {
    for (const auto& run : runs) {
      if (run.plan.cluster.name != base.name) {
        return fail("calibrate: the measurements ran on different clusters (" + base.name + ", " + run.plan.cluster.name +
                    "); give the profile to fit with --cluster");
      }
    }
  }
  auto result = pl::calibrate(base, runs);
  if (!result) return fail(result.error().message);
  const auto& c = result->profile.gpu.calibration;
  const bool md = format == pl::Format::kMarkdown;
  const char* li = md ? "- " : "  ";
  std::printf("%scalibration of %s from %zu measurement(s), %d iterations\n\n", md ? "# " : "", base.name.c_str(), runs.size(), result->iterations);
  std::printf("%sfitted: GEMM time x %.3f, attention time x %.3f, memory-bound time x %.3f, kernel latency x %.3f, allocator %+.2f GiB\n", li,
              c.gemm_time_scale, c.attention_time_scale, c.memory_time_scale, c.latency_scale, c.allocator_extra_bytes / 1073741824.0);
  for (const auto& note : result->notes) std::printf("%s%s\n", li, note.c_str());
  std::printf("\n");
  const auto pct = [](double predicted, double measured) { return 100 * (predicted / measured - 1); };
  constexpr double kGiB = 1073741824.0;
  if (md) {
    std::printf("| measurement | step s measured | before | after | reserved GiB measured | before | after |\n|---|--:|--:|--:|--:|--:|--:|\n");
  } else {
    std::printf("  %-44s %8s %17s %17s %8s %17s %17s\n", "measurement", "step s", "before", "after", "GiB", "before", "after");
  }
  for (const auto& r : result->runs) {
    std::string memory = md ? "- | - | -" : "";
    if (r.measured_reserved) {
      char text[128];
      std::snprintf(text, sizeof text, md ? "%.2f | %.2f (%+.1f%%) | %.2f (%+.1f%%)" : "%8.2f %8.2f (%+5.1f%%) %8.2f (%+5.1f%%)",
                    *r.measured_reserved / kGiB, r.reserved_before / kGiB, pct(r.reserved_before, *r.measured_reserved), r.reserved_after / kGiB,
                    pct(r.reserved_after, *r.measured_reserved));
      memory = text;
    }
    std::printf(md ? "| %s | %.3f | %.3f (%+.1f%%) | %.3f (%+.1f%%) | %s |\n" : "  %-44s %8.3f %8.3f (%+5.1f%%) %8.3f (%+5.1f%%) %s\n",
                r.name.c_str(), r.measured_step, r.step_before, pct(r.step_before, r.measured_step), r.step_after, pct(r.step_after, r.measured_step),
                memory.c_str());
  }
  if (out.empty()) {
    std::printf("\n(no --out: the calibrated profile was not written)\n");
    return 0;
  }
  const std::string text = cm::readable_json(cm::hwprofile_to_json(result->profile));
  if (auto back = cm::parse_hwprofile_text(text, out); !back) return fail("the calibrated profile does not read back: " + back.error().message);
  std::string error;
  if (!write_file(out, text, error)) return fail(error);
  std::printf("\nwrote %s (use it with --cluster %s)\n", out.c_str(), out.c_str());
  return 0;
}

// `planner profile` without --from-csv: runs `executor --profile` on this machine's device (under
// mpirun for several ranks), then checks the profile it wrote and prints a summary. Without
// --out the profile goes to standard output (the summary to stderr).
int measure_profile(pl::ProfileRunOptions options, const pl::ExecutorSearch& search) {
  auto base = cm::find_hwprofile(options.base);
  if (!base) return fail("--base: " + base.error().message);
  const bool to_stdout = options.out.empty();
  if (to_stdout) options.out = (std::filesystem::temp_directory_path() / ("trainplan-profile-" + std::to_string(::getpid()) + ".json")).string();
  auto valid = pl::check_profile_run(options, base->gpus_per_node);
  if (!valid) return fail("profile: " + valid.error().message);
  auto executor = pl::find_executor(search);
  if (!executor) {
    return fail("profile: measuring this machine runs the executor's microbenchmarks: " + executor.error().message +
                "; build it with `scripts/setup.sh build` (or import measured CSVs with --from-csv FILE)");
  }
  options.executor = *executor;
  options.allow_run_as_root = ::geteuid() == 0;
  std::error_code ec;
  const auto written_before = std::filesystem::last_write_time(options.out, ec);
  const bool existed = !ec;

  const std::vector<std::string> command = pl::profile_command(options);
  std::cerr << "planner: running:";
  for (const auto& word : command) std::cerr << " " << pl::shell_quote(word);
  std::cerr << std::endl;
  auto run = pl::run_process(command);
  if (!run) return fail(run.error().message + (options.ranks > 1 ? " (mpirun comes with Open MPI: apt-get install openmpi-bin; or give --mpirun PATH)" : ""));
  if (!run->success()) {
    std::cerr << "planner: error: " << command.front() << " " << run->text() << ": the profile run failed (its output is above)\n";
    if (to_stdout) std::filesystem::remove(options.out, ec);
    return run->code == kExitBadInput ? kExitBadInput : kExitRunFailed;
  }
  const auto written_after = std::filesystem::last_write_time(options.out, ec);
  if (ec || (existed && written_after == written_before)) {
    std::cerr << "planner: error: " << options.out << ": the profile run succeeded but did not write this file\n";
    return kExitRunFailed;
  }
  auto text = cm::read_text_file(options.out);
  if (to_stdout) std::filesystem::remove(options.out, ec);
  if (!text) return fail(text.error().message);
  auto profile = cm::parse_hwprofile_text(*text, to_stdout ? "<profile>" : options.out);
  if (!profile) {
    std::cerr << "planner: error: the executor wrote a profile that does not read back: " << profile.error().message << "\n";
    return kExitRunFailed;
  }
  if (to_stdout) {
    std::cout << *text;
    std::cerr << pl::profile_summary(*profile);
  } else {
    std::cout << pl::profile_summary(*profile) << "wrote " << options.out << "\n";
  }
  return 0;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainplan planner: what fits, how fast it goes, and why"};
  app.require_subcommand(0, 1);

  std::string model = "70b", cluster, seq_len_text, batch_tokens_text, train_tokens_text, format = "text", save_plan, objective = "throughput";
  std::string precision = "bf16", optimizer = "adamw", mode = "pretrain", attention = "flash", stack, lora_targets = "q,k,v,o", base_format = "nf4";
  std::string attention_mask = "causal", loss = "stack";
  bool pure_16bit = false;
  double memory_headroom_percent = 100 * cm::kDefaultMemoryHeadroom;
  int gpus = 0, lora_rank = 16, top = 10;
  long long global_batch = 0;
  bool dropout = false, quiet = false;
  std::vector<std::string> fixes;
  app.add_option("--model", model, "Model preset, alias (70b, 405b, 8b, 175b), model JSON file, or Hugging Face config.json")->capture_default_str();
  app.add_option("--gpus", gpus, "Number of GPUs");
  app.add_option("--cluster", cluster, std::string("Cluster preset or hwprofile JSON file (default ") + cm::kDefaultCluster + ")");
  app.add_option("--seq-len", seq_len_text, "Tokens per sequence (default: the model's context length)");
  app.add_option("--global-batch", global_batch, "Sequences per optimizer step");
  app.add_option("--global-batch-tokens", batch_tokens_text, "Tokens per optimizer step; K/M/G suffixes are binary here (16M = 16*2^20)");
  app.add_option("--train-tokens", train_tokens_text, "Tokens to train; suffixes K, M, G or B, T, P are decimal (15T = 15e12), Ki, Mi, Gi, Ti, Pi binary. Default: 20 per parameter");
  app.add_option("--precision", precision, "fp32 | bf16 | fp16 | fp8")->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}))->capture_default_str();
  app.add_option("--optimizer", optimizer, "adamw | sgd | adafactor | adam8bit")->check(CLI::IsMember({"adamw", "sgd", "adafactor", "adam8bit"}))->capture_default_str();
  app.add_option("--mode", mode, "pretrain | full | lora | qlora")->check(CLI::IsMember({"pretrain", "full", "lora", "qlora"}))->capture_default_str();
  app.add_option("--lora-rank", lora_rank, "LoRA rank")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--lora-targets", lora_targets, "LoRA: the projections with adapters, comma-separated (q k v o gate up down; all-linear for every one)")
      ->capture_default_str();
  app.add_option("--base-format", base_format, "QLoRA: storage of the frozen base weights, nf4 | int8")->check(CLI::IsMember({"nf4", "int8"}))->capture_default_str();
  app.add_option("--attention", attention, "flash | standard (materialised scores)")->check(CLI::IsMember({"flash", "standard"}))->capture_default_str();
  app.add_option("--attention-mask", attention_mask, "causal (the kernel's causal flag) | explicit (a mask tensor: the whole seq x seq rectangle computed, the mask kept)")
      ->check(CLI::IsMember({"causal", "explicit"}))->capture_default_str();
  app.add_option("--loss", loss, std::string("Loss kernel: stack (the stack's own) | ") + cm::loss_kernel_choices())->capture_default_str();
  app.add_flag("--pure-16bit", pure_16bit, "No fp32 master weights: parameters, gradients, optimizer states and the gradient reduction in the 16-bit dtype (a model cast to bf16 under FSDP without mixed precision)");
  app.add_flag("--dropout", dropout, "Model has dropout layers");
  const std::string stack_help = std::string("Software stack to predict for: ") + cm::stack_choices() + " (default trainplan, this project's executor)";
  const std::string headroom_help = "Percent of HBM kept free: plans needing more are \"tight\", ranked after the others (default " +
                                    std::to_string(static_cast<int>(100 * cm::kDefaultMemoryHeadroom)) + ", twice the largest memory error on the measured H100 runs)";
  app.add_option("--stack", stack, stack_help);
  app.add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  app.add_option("--fix", fixes, "Fix a parallel setting, e.g. --fix tp=8 --fix pp=4 --fix recompute=full");
  app.add_option("--objective", objective, "throughput | time | cost")->check(CLI::IsMember({"throughput", "time", "cost"}))->capture_default_str();
  app.add_option("--top", top, "Plans to list")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}))->capture_default_str();
  app.add_option("--save-plan", save_plan, "Write the recommended plan (trainplan/plan/v1) to this file");
  app.add_flag("--quiet", quiet, "No progress on stderr");

  CLI::App* evaluate_cmd = app.add_subcommand("evaluate", "Estimate one fixed plan (trainplan/plan/v1) with the full breakdown");
  std::string plan_file;
  evaluate_cmd->add_option("plan", plan_file, "Plan JSON file")->required();
  evaluate_cmd->add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}));
  evaluate_cmd->add_option("--stack", stack, stack_help + "; overrides the plan's training.stack");
  evaluate_cmd->add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  CLI::App* search_cmd = app.add_subcommand("search", "Search the open (\"auto\") fields of a plan file");
  search_cmd->add_option("plan", plan_file, "Plan JSON file")->required();
  search_cmd->add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}));
  search_cmd->add_option("--save-plan", save_plan, "Write the recommended plan to this file");
  search_cmd->add_option("--top", top, "Plans to list")->check(CLI::Range(1, 1000));
  search_cmd->add_option("--stack", stack, stack_help + "; overrides the plan's training.stack");
  search_cmd->add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  CLI::App* compare_cmd = app.add_subcommand("compare", "Compare an estimate with a measurement the executor wrote");
  std::string estimate_file, measurement_file;
  compare_cmd->add_option("estimate", estimate_file, "trainplan/estimate/v1 file (planner evaluate --format json) or a fixed plan file")->required();
  compare_cmd->add_option("measurement", measurement_file,
                          "trainplan/measurement/v1 file, or a torchtitan or Megatron-LM training log (its console output)")->required();
  compare_cmd->add_option("--format", format, "text | md | html | json")->check(CLI::IsMember({"text", "md", "html", "json"}));
  CLI::App* launch_cmd = app.add_subcommand("launch", "Print the SLURM script (--slurm) or torchrun command that runs a fixed plan");
  pl::LaunchOptions launch;
  bool slurm = false;
  std::string executor;
  launch_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  launch_cmd->add_option("--nodes", launch.nodes, "Nodes; nodes x GPUs per node must equal the plan's GPUs")->required();
  launch_cmd->add_flag("--slurm", slurm, "Print a SLURM batch script for sbatch instead of the torchrun command");
  launch_cmd->add_option("--steps", launch.steps, "Optimizer steps to run")->capture_default_str();
  launch_cmd->add_option("--executor", executor, "The executor on the nodes (default: $TRAINPLAN_EXECUTOR, the one built beside planner, else executor)");
  int launch_gpus_per_node = 0;
  launch_cmd->add_option("--gpus-per-node", launch_gpus_per_node, "Ranks (GPUs) per node, >= 1 (default: the plan cluster's)");
  launch_cmd->add_option("--cpus-per-task", launch.cpus_per_task, "CPU cores per rank (SLURM)")->capture_default_str();
  launch_cmd->add_option("--partition", launch.partition, "SLURM partition");
  launch_cmd->add_option("--account", launch.account, "SLURM account");
  launch_cmd->add_option("--time", launch.time_limit, "SLURM time limit (HH:MM:SS)");
  launch_cmd->add_option("--job-name", launch.job_name, "SLURM job name");
  std::vector<std::string> launch_extra;
  launch_cmd->add_option("--extra", launch_extra,
                         "More executor arguments, e.g. --extra \"--seed 1\"; repeatable. The text is split into words by the shell's "
                         "quoting rules ('...', \"...\", backslash) with no expansion ($, ;, backticks are plain characters; an unclosed "
                         "quote is an error), and each word reaches the executor as one argument")
      ->allow_extra_args(false);

  CLI::App* export_cmd = app.add_subcommand("export", "Write what Megatron-LM, torchtitan, DeepSpeed, Accelerate or LitGPT needs to run a fixed plan");
  std::string export_target, export_out;
  export_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  export_cmd->add_option("--to", export_target, "megatron (a torchrun script), torchtitan (TOML), deepspeed (JSON), accelerate (YAML) or litgpt (YAML)")->required();
  export_cmd->add_option("--out", export_out, "Write the file here instead of to stdout");

  CLI::App* run_cmd = app.add_subcommand("run", "Run a fixed plan on this machine's CPUs under MPI with the executor, then compare");
  pl::LocalRunOptions local;
  run_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  run_cmd->add_option("--steps", local.steps, "Optimizer steps to run")->capture_default_str();
  run_cmd->add_option("--executor", executor, "The executor (default: $TRAINPLAN_EXECUTOR, the one built beside planner, executor on PATH)");
  run_cmd->add_option("--ranks", local.ranks, "MPI ranks; must equal the plan's GPUs, which is the default")->check(CLI::Range(1, 1 << 24));
  run_cmd->add_option("--measurement", measurement_file, "Measurement file the executor writes (default: <plan stem>.measurement.json here)");
  run_cmd->add_option("--mpirun", local.mpirun, "The mpirun to use")->capture_default_str();
  run_cmd->add_option("--format", format, "text | md | html | json")->check(CLI::IsMember({"text", "md", "html", "json"}));
  run_cmd->add_option("executor_args", local.extra_args, "After --: more arguments for the executor");
  CLI::App* trace_cmd = app.add_subcommand("trace", "Write a measurement's trace as Chrome trace-event JSON (ui.perfetto.dev)");
  trace_cmd->add_option("measurement", measurement_file, "trainplan/measurement/v1 file")->required();
  CLI::App* profile_cmd = app.add_subcommand("profile", "Measure this machine's device with the executor's microbenchmarks and write a hardware "
                                                          "profile with the measured tables (--from-csv imports microbenchmark CSVs instead)");
  std::vector<std::string> profile_csv;
  std::string profile_base = cm::kDefaultCluster, profile_name, profile_out, profile_source;
  pl::ProfileRunOptions profile_run;
  profile_cmd->add_option("--device", profile_run.device, "auto | cpu | cuda: the device measured (auto: cuda when present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  profile_cmd->add_option("--ranks", profile_run.ranks, "Ranks on this node; > 1 runs them under mpirun and measures all-reduce, all-gather "
                                                        "and reduce-scatter bus bandwidth too")->capture_default_str();
  profile_cmd->add_flag("--quick", profile_run.quick, "The executor's shorter sweep (fewer shapes and repeats)");
  profile_cmd->add_option("--threads", profile_run.threads, "CPU threads for the kernels (default: every core; 1 gives steadier figures on "
                                                            "cores shared with other work)");
  profile_cmd->add_option("--executor", executor, "The executor (default: $TRAINPLAN_EXECUTOR, the one built beside planner, executor on PATH)");
  profile_cmd->add_option("--mpirun", profile_run.mpirun, "The mpirun to use with --ranks > 1")->capture_default_str();
  profile_cmd->add_option("--from-csv", profile_csv, "Microbenchmark CSV to import (h100_kernels.csv and h100_elementwise.csv formats); repeatable");
  profile_cmd->add_option("--base", profile_base, "Cluster preset or hwprofile file whose tables are replaced")->capture_default_str();
  profile_cmd->add_option("--name", profile_name, "Name of the new profile (default: the base's)");
  profile_cmd->add_option("--source", profile_source, "Where the measurements come from (machine, software, date), for the tables' source");
  profile_cmd->add_option("--out", profile_out, "Write the profile here (default: standard output)");
  CLI::App* calibrate_cmd = app.add_subcommand("calibrate", "Fit a profile's efficiencies (time scales, kernel latency, allocator bytes) to executor measurements by least squares");
  std::vector<std::string> calibrate_files;
  std::string calibrate_out;
  calibrate_cmd->add_option("measurements", calibrate_files, "trainplan/measurement/v1 files the executor wrote")->required();
  calibrate_cmd->add_option("--cluster", cluster, "Profile to fit (default: the measurements' cluster)");
  calibrate_cmd->add_option("--out", calibrate_out, "Write the calibrated profile here");
  calibrate_cmd->add_option("--format", format, "text | md")->check(CLI::IsMember({"text", "md"}));
  CLI::App* validate_cmd = app.add_subcommand("validate", "Predict every published table (tests/data) and each measurement given, row by row, with MAPE per table");
  std::vector<std::string> validate_files;
  validate_cmd->add_option("measurements", validate_files, "trainplan/measurement/v1 files (0 or more)");
  validate_cmd->add_option("--format", format, "text | json | md")->check(CLI::IsMember({"text", "json", "md"}));
  app.add_subcommand("models", "List model presets");
  app.add_subcommand("hardware", "List cluster presets");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  if (app.got_subcommand("models")) return list_models();
  if (app.got_subcommand("hardware")) return list_hardware();

  const pl::Format fmt = parse_format(format);
  pl::ReportContext ctx;
  ctx.command = join_args(argc, argv);
  if (!(memory_headroom_percent >= 0 && memory_headroom_percent <= 50)) {
    return fail("--memory-headroom: must be a percentage of HBM from 0 to 50 (got " + std::to_string(memory_headroom_percent) + ")");
  }
  ctx.memory_headroom = memory_headroom_percent / 100.0;
  std::optional<cm::Stack> stack_choice;
  if (!stack.empty()) {
    stack_choice = cm::stack_from_name(stack);
    if (!stack_choice) return fail("--stack: must be one of " + std::string(cm::stack_choices()) + " (got \"" + stack + "\")");
  }

  // No output replaces an input: checked before anything runs.
  {
    std::vector<std::pair<std::string, std::string>> inputs;
    if (!plan_file.empty()) inputs.emplace_back("plan file", plan_file);
    for (const std::string& f : calibrate_files) inputs.emplace_back("measurement", f);
    for (const std::string& f : profile_csv) inputs.emplace_back("--from-csv file", f);
    // A preset's name is no file even where a file of that name exists (presets come first).
    const auto is_preset = [](const std::vector<std::string>& names, const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (!cluster.empty() && !is_preset(cm::hwprofile_preset_names(), cluster)) inputs.emplace_back("--cluster file", cluster);
    if (!model.empty() && !is_preset(cm::model_preset_names(), cm::resolve_model_alias(model))) inputs.emplace_back("--model file", model);
    const std::pair<const char*, std::string> outputs[] = {
        {"--save-plan", save_plan}, {"--out", export_out}, {"--out", profile_out}, {"--out", calibrate_out}, {"--measurement", app.got_subcommand("run") ? measurement_file : ""}};
    for (const auto& [flag, path] : outputs) {
      if (const std::string conflict = cm::overwrite_conflict(flag, path, inputs); !conflict.empty()) return fail(conflict);
    }
  }
  if (app.got_subcommand("compare")) return compare_files(estimate_file, measurement_file, fmt);
  if (app.got_subcommand("calibrate")) return calibrate_profile(calibrate_files, cluster, calibrate_out, fmt);
  if (app.got_subcommand("trace")) return write_chrome_trace(measurement_file);
  if (app.got_subcommand("validate")) return validate(validate_files, fmt);
  const pl::ExecutorSearch executor_search{executor, environment("TRAINPLAN_EXECUTOR"), pl::own_binary_dir(argv[0]), environment("PATH")};
  if (app.got_subcommand("profile")) {
    if (!profile_csv.empty()) {
      for (const char* flag : {"--device", "--ranks", "--quick", "--threads", "--executor", "--mpirun"}) {
        if (profile_cmd->count(flag) > 0) return fail(std::string("profile: ") + flag + " measures this machine; it does not go with --from-csv");
      }
      return import_profile(profile_csv, profile_base, profile_name, profile_source, profile_out);
    }
    if (!profile_source.empty()) return fail("profile: --source describes imported CSVs; it goes with --from-csv (a measured profile says its own source)");
    profile_run.out = profile_out;
    profile_run.base = profile_base;
    profile_run.name = profile_name;
    profile_run.command = ctx.command;
    return measure_profile(profile_run, executor_search);
  }
  if (app.got_subcommand("launch")) {
    launch.executor = pl::executor_for_launch(executor_search);
    if (launch_cmd->count("--gpus-per-node") > 0) launch.gpus_per_node = launch_gpus_per_node;
    for (const std::string& text : launch_extra) {
      auto words = pl::split_shell_words(text);
      if (!words) return fail("--extra " + words.error().message);
      launch.extra_args.insert(launch.extra_args.end(), words->begin(), words->end());
    }
    return launch_plan(plan_file, launch, slurm);
  }
  if (app.got_subcommand("export")) return export_plan(plan_file, export_target, export_out);
  if (app.got_subcommand("run")) return run_plan(plan_file, local, executor_search, measurement_file, fmt);

  if (app.got_subcommand("evaluate")) {
    auto loaded = cm::load_plan_file(plan_file);
    if (!loaded) return fail(loaded.error().message);
    cm::PlanRequest fixed_request = std::move(loaded).value();
    auto* req = &fixed_request;
    // Unset fields take their documented defaults (tp=pp=cp=ep=1, dp = the rest, zero 0, ...).
    if (stack_choice) req->training.stack = *stack_choice;
    auto plan = cm::plan_with_defaults(*req);
    if (!plan) return fail(plan_file + ": " + plan.error().message);
    cm::EstimateOptions estimate_options;
    estimate_options.memory_headroom = ctx.memory_headroom;
    auto cand = pl::evaluate(*plan, estimate_options);
    if (!cand) return fail(plan_file + ": " + cand.error().message);
    std::cout << pl::render_evaluation(*cand, ctx, fmt);
    return cand->estimate.fits ? 0 : kExitNoFit;
  }

  cm::PlanRequest req;
  if (app.got_subcommand("search")) {
    auto loaded = cm::load_plan_file(plan_file);
    if (!loaded) return fail(loaded.error().message);
    req = std::move(loaded).value();
    if (stack_choice) req.training.stack = *stack_choice;
  } else {
    if (gpus <= 0 || gpus > (1 << 24)) {  // 2^24, as in plan files (wider counts overflow the search's products)
      return fail("--gpus: must be a number of GPUs from 1 to 16777216 (e.g. --gpus 64; got " + std::to_string(gpus) + ")");
    }
    auto m = cm::find_model(model);
    if (!m) return fail("--model: " + m.error().message);
    ctx.default_cluster = cluster.empty();
    auto hw = cm::find_hwprofile(cluster.empty() ? cm::kDefaultCluster : cluster);
    if (!hw) return fail("--cluster: " + hw.error().message);
    req.model = std::move(m).value();
    req.model_ref = cm::resolve_model_alias(model);
    req.cluster = std::move(hw).value();
    req.cluster_ref = cluster.empty() ? cm::kDefaultCluster : cluster;
    req.gpus = gpus;
    req.name = req.model.name + "-" + std::to_string(gpus) + "gpu";
    auto& t = req.training;
    if (app.count("--seq-len") > 0) {  // given, even as "" (an error, not the default)
      auto s = pl::parse_count(seq_len_text, true, "--seq-len");
      if (!s) return fail(s.error().message);
      if (*s > (1 << 24) || std::floor(*s) != *s) return fail("--seq-len: must be a whole number of tokens <= 16Mi");
      t.seq_len = static_cast<std::int64_t>(*s);
    }
    t.precision = precision == "fp32" ? cm::Precision::kFp32 : precision == "fp16" ? cm::Precision::kFp16
                : precision == "fp8" ? cm::Precision::kFp8 : cm::Precision::kBf16;
    t.optimizer = optimizer == "sgd" ? cm::OptimizerKind::kSgdMomentum : optimizer == "adafactor" ? cm::OptimizerKind::kAdafactor
                : optimizer == "adam8bit" ? cm::OptimizerKind::kAdam8bit : cm::OptimizerKind::kAdamW;
    t.mode = mode == "full" ? cm::TrainingMode::kFull : mode == "lora" ? cm::TrainingMode::kLora
           : mode == "qlora" ? cm::TrainingMode::kQlora : cm::TrainingMode::kPretrain;
    t.lora.rank = lora_rank;
    t.lora.base_format = base_format == "int8" ? cm::QuantFormat::kInt8 : cm::QuantFormat::kNf4;
    t.lora.targets.clear();
    if (lora_targets == "all-linear") lora_targets = "q,k,v,o,gate,up,down";
    for (std::size_t start = 0; start <= lora_targets.size();) {
      const std::size_t comma = std::min(lora_targets.find(',', start), lora_targets.size());
      const std::string target = lora_targets.substr(start, comma - start);
      static const std::vector<std::string> kTargets = {"q", "k", "v", "o", "gate", "up", "down"};
      if (std::find(kTargets.begin(), kTargets.end(), target) == kTargets.end()) {
        return fail("--lora-targets: \"" + target + "\" is not one of q, k, v, o, gate, up, down (or give all-linear)");
      }
      t.lora.targets.push_back(target);
      start = comma + 1;
    }
    t.dropout = dropout;
    t.attention = attention == "standard" ? cm::AttentionKernel::kStandard : cm::AttentionKernel::kFlash;
    t.attention_mask = attention_mask == "explicit" ? cm::AttentionMask::kExplicit : cm::AttentionMask::kCausal;
    if (loss != "stack") {
      const auto kernel = cm::loss_kernel_from_name(loss);
      if (!kernel) return fail("--loss: \"" + loss + "\" is not one of stack | " + cm::loss_kernel_choices());
      t.loss = *kernel;
    }
    if (stack_choice) t.stack = *stack_choice;
    t.master_weights = !pure_16bit;
    req.parallel.reduce_dtype = cm::default_reduce_dtype(t);
    if (t.seq_len == 0) t.seq_len = req.model.max_seq_len;
    constexpr long long kMaxGlobalBatch = 1LL << 32;  // as in plan files
    if (app.count("--global-batch") > 0 && (global_batch <= 0 || global_batch > kMaxGlobalBatch)) {
      return fail("--global-batch: must be a whole number of sequences from 1 to 2^32 (got " + std::to_string(global_batch) + ")");
    }
    if (global_batch > 0 && app.count("--global-batch-tokens") > 0) return fail("--global-batch and --global-batch-tokens: give one, not both");
    if (global_batch > 0) t.global_batch = global_batch;
    if (app.count("--global-batch-tokens") > 0) {
      auto tokens = pl::parse_count(batch_tokens_text, true, "--global-batch-tokens");
      if (!tokens) return fail(tokens.error().message);
      const double sequences = std::round(*tokens / static_cast<double>(t.seq_len));
      if (sequences < 1) return fail("--global-batch-tokens: less than one sequence of " + std::to_string(t.seq_len) + " tokens");
      if (sequences > static_cast<double>(kMaxGlobalBatch)) return fail("--global-batch-tokens: more than 2^32 sequences of " + std::to_string(t.seq_len) + " tokens");
      t.global_batch = static_cast<std::int64_t>(sequences);
      if (std::fabs(sequences * static_cast<double>(t.seq_len) - *tokens) > 1e-3 * *tokens) {  // said, not silently changed
        ctx.batch_note = "--global-batch-tokens " + batch_tokens_text + " rounded to whole sequences";
      }
    }
    if (app.count("--train-tokens") > 0) {
      auto tokens = pl::parse_count(train_tokens_text, false, "--train-tokens");
      if (!tokens) return fail(tokens.error().message);
      if (*tokens > cm::kMaxTrainTokens) return fail("--train-tokens: at most 1e24 tokens, as in plan files (got " + train_tokens_text + ")");
      t.train_tokens = *tokens;
    } else {
      ctx.train_tokens_note = t.mode == cm::TrainingMode::kPretrain ? "20 per parameter or one step, the default; set --train-tokens" : "default; set --train-tokens";
    }
    cm::resolve_training_defaults(req.model, t);
    std::map<std::string, std::string> fixed_by;  // canonical key -> the --fix that set it
    for (const auto& f : fixes) {
      const std::string error = apply_fix(f, req.parallel);
      if (!error.empty()) return fail(error);
      const std::string key = canonical_fix_key(f.substr(0, f.find('=')));
      const auto [it, first] = fixed_by.emplace(key, f);
      if (!first && !same_fix(it->second, f)) return fail("--fix " + it->second + " and --fix " + f + " contradict each other: " + key + " can be fixed once");
    }
    if (const std::vector<std::string> conflicts = pl::constraint_conflicts(req, "--fix "); !conflicts.empty()) {
      std::string text;
      for (const auto& why : conflicts) text += (text.empty() ? "" : "; ") + why;
      return fail("no plan can satisfy the fixed values: " + text);
    }
    auto valid = cm::validate_request(req);
    if (!valid) return fail(valid.error().message);
  }

  pl::SearchOptions options;
  options.top = top;
  options.memory_headroom = ctx.memory_headroom;
  options.objective = objective == "cost" ? pl::Objective::kCost : objective == "time" ? pl::Objective::kTime : pl::Objective::kThroughput;
  const bool show_progress = !quiet && fmt == pl::Format::kText && isatty(fileno(stderr));
  if (show_progress) {
    options.progress = [](double f) { std::fprintf(stderr, "\rsearching... %3.0f%%", 100 * f); };
  }
  auto result = pl::search(req, options);
  if (show_progress) std::fprintf(stderr, "\r                \r");
  if (!result) return fail(result.error().message);

  if (!save_plan.empty() && !result->ranked.empty()) {
    std::string error;
    if (!write_file(save_plan, cm::plan_to_json(result->ranked.front().plan).dump(2) + "\n", error)) return fail(error);
    ctx.plan_path = save_plan;
  }
  std::cout << pl::render_search(req, *result, ctx, fmt);
  return result->ranked.empty() ? kExitNoFit : 0;
}
