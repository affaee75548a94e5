// The planner app's subcommands (app/commands.hpp): listing presets, comparing, tracing,
// launching, exporting, running, validating, calibrating and profiling.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <sys/stat.h>
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


#include "commands.hpp"

namespace trainplan::planner_app {

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
// on any failure the temporary file is removed and `error` says why. What is not a plain file is
// not renamed over: the planner's own standard output (/dev/stdout, or the file it is redirected
// to) gets the text there, after what was written before; another device or a FIFO is written
// in place; a symbolic link is followed to the file it names (created if missing), which is
// replaced while the link stays.
bool write_file(const std::string& path, const std::string& text, std::string& error) {
  namespace fs = std::filesystem;
  struct stat target_stat {}, stdout_stat {};
  const bool exists = ::stat(path.c_str(), &target_stat) == 0;  // follows links
  if (exists && S_ISDIR(target_stat.st_mode)) { error = path + ": is a directory, not a file"; return false; }
  if (exists && ::fstat(STDOUT_FILENO, &stdout_stat) == 0 && target_stat.st_dev == stdout_stat.st_dev &&
      target_stat.st_ino == stdout_stat.st_ino) {
    std::cout << text;
    std::cout.flush();
    if (!std::cout) { error = path + ": write failed (standard output)"; return false; }
    return true;
  }
  if (exists && !S_ISREG(target_stat.st_mode)) {
    std::ofstream out(path, std::ios::binary);
    if (!out) { error = path + ": cannot write (" + std::strerror(errno) + ")"; return false; }
    out << text;
    out.flush();
    if (!out) { error = path + ": write failed"; return false; }
    return true;
  }
  // The file at the end of a chain of links, each relative to its own folder (the kernel's 40 at most).
  std::error_code ec;
  fs::path target = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    if (hops == 40) { error = path + ": too many levels of symbolic links"; return false; }
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) { error = path + ": cannot read the link (" + ec.message() + ")"; return false; }
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const std::string tmp = target.string() + ".tmp";
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
  if (std::rename(tmp.c_str(), target.c_str()) != 0) return give_up(std::string("cannot rename the temporary file into place (") + std::strerror(errno) + ")");
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
  std::printf("%sfitted: %s, allocator %+.2f GiB\n", li, pl::calibration_scales_text(c).c_str(), c.allocator_extra_bytes / 1073741824.0);
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

int tune_plans(const cm::PlanRequest& request, pl::TuneOptions options, const pl::ExecutorSearch& search) {
  if (options.launcher == pl::Launcher::kSlurm) {
    options.executor = pl::executor_for_launch(search);
  } else {
    auto found = pl::find_executor(search);
    if (!found) return fail(found.error().message);
    options.executor = *found;
  }
  options.allow_run_as_root = ::geteuid() == 0;
  options.progress = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  if (isatty(fileno(stderr)) && isatty(fileno(stdout))) {
    options.status_line = [](const std::string& line) {
      std::fprintf(stderr, "\r%-78.78s%s", line.c_str(), line.empty() ? "\r" : "");
      std::fflush(stderr);
    };
  }
  auto result = pl::tune(request, options);
  if (!result) return fail(result.error().message);
  std::printf("%s", pl::render_tune(*result).c_str());
  if (result->interrupted) return 130;
  if (result->dry_run) return 0;
  return result->chosen > 0 ? 0 : kExitRunFailed;
}

}  // namespace trainplan::planner_app
