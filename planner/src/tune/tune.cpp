#include "trainplan/planner/tune.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "jobs.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/calibrate.hpp"
#include "trainplan/planner/local_run.hpp"
#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/profile_run.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan::planner {

namespace fs = std::filesystem;
using costmodel::Error;
using costmodel::HardwareProfile;
using costmodel::Plan;
using costmodel::PlanRequest;
using costmodel::Result;
using namespace tune_detail;

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::kMpirun: return "mpirun";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kSlurm: return "slurm";
  }
  return "?";
}

std::optional<Launcher> launcher_from_name(const std::string& name) {
  for (Launcher l : {Launcher::kMpirun, Launcher::kTorchrun, Launcher::kSlurm}) {
    if (name == launcher_name(l)) return l;
  }
  return std::nullopt;
}

namespace {

constexpr RunStatus kStatuses[] = {RunStatus::kPending, RunStatus::kMeasured, RunStatus::kOutOfMemory, RunStatus::kDiverged,
                                   RunStatus::kHung,    RunStatus::kFailed,   RunStatus::kCancelled,   RunStatus::kSkipped};

}  // namespace

const char* run_status_name(RunStatus s) {
  switch (s) {
    case RunStatus::kPending: return "pending";
    case RunStatus::kMeasured: return "measured";
    case RunStatus::kOutOfMemory: return "out_of_memory";
    case RunStatus::kDiverged: return "diverged";
    case RunStatus::kHung: return "hung";
    case RunStatus::kFailed: return "failed";
    case RunStatus::kCancelled: return "cancelled";
    case RunStatus::kSkipped: return "skipped";
  }
  return "?";
}

std::optional<RunStatus> run_status_from_name(const std::string& name) {
  for (RunStatus s : kStatuses) {
    if (name == run_status_name(s)) return s;
  }
  return std::nullopt;
}

namespace {

// What must be the same for --resume to go on with a tune: the inputs that decide its plans.
nlohmann::json request_identity(const PlanRequest& r, const TuneOptions& o) {
  const auto& t = r.training;
  return {{"model", r.model.name},
          {"gpus", r.gpus},
          {"cluster", r.cluster.name},
          {"seq_len", t.seq_len},
          {"global_batch", t.global_batch},
          {"precision", costmodel::precision_name(t.precision)},
          {"mode", costmodel::mode_name(t.mode)},
          {"stack", costmodel::stack_name(t.stack)},
          {"launcher", launcher_name(o.launcher)},
          {"steps", o.steps},
          {"repeats", o.repeats}};
}

std::string two_digits(int n) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%02d", n);
  return buf;
}

Result<bool> write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Error{tmp.string() + ": cannot write"};
    out << text;
    out.flush();
    if (!out) return Error{tmp.string() + ": cannot write (disk full?)"};
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // whole or not at all: an interrupted tune never leaves half a state file
  if (ec) return Error{path.string() + ": cannot write: " + ec.message()};
  return true;
}

std::optional<double> number_or_null(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

nlohmann::json optional_json(const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); }

Plan with_cluster(Plan plan, const HardwareProfile& hw) {
  plan.cluster = hw;
  return plan;
}

double predicted_step(const Plan& plan) { return costmodel::estimate(plan).time.step.value(); }

class Tuner {
 public:
  Tuner(const PlanRequest& request, const TuneOptions& options) : request_(request), o_(options) {}

  Result<TuneResult> run();

 private:
  void say(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }
  fs::path out() const { return fs::path(o_.out_dir); }
  Result<bool> check_options() const;
  Result<bool> prepare_base();
  Result<bool> load_state();
  Result<bool> save_state() const;
  Result<std::vector<Candidate>> ranked(const HardwareProfile& profile, int top) const;
  bool tried_layout(const costmodel::ParallelConfig& p) const {
    return std::any_of(r_.candidates.begin(), r_.candidates.end(), [&](const TuneCandidate& c) { return same_layout(c.plan.parallel, p); });
  }
  Result<bool> add_candidate(const Plan& plan, int round, RunStatus status, const std::string& detail);
  std::vector<std::string> executor_words(const TuneCandidate& c) const;
  std::vector<std::string> local_command(const TuneCandidate& c) const;
  Result<std::string> slurm_job_script(const TuneCandidate& c) const;
  Result<bool> run_candidate(TuneCandidate& c);
  Result<bool> run_repeats();
  // Run `n` (1..repeats) of `c` through the launcher; its files are named for it (run_file).
  Result<bool> run_once(TuneCandidate& c, int n) {
    repeat_ = n;
    auto ran = o_.launcher == Launcher::kSlurm ? run_slurm(c) : run_local(c);
    repeat_ = 1;
    return ran;
  }
  Result<bool> run_local(TuneCandidate& c);
  Result<bool> run_slurm(TuneCandidate& c);
  void read_measurement(TuneCandidate& c, const fs::path& measurement, const std::string& ended) const;
  // A run's file in the candidate's folder: `stem` + `ext` for the first run, stem-N + ext for
  // the N-th of TuneOptions::repeats.
  std::string run_file(const TuneCandidate& c, const std::string& stem, const std::string& ext) const {
    return (out() / c.directory / (repeat_ == 1 ? stem + ext : stem + "-" + std::to_string(repeat_) + ext)).string();
  }
  int measured_count() const {
    return static_cast<int>(std::count_if(r_.candidates.begin(), r_.candidates.end(), [](const TuneCandidate& c) { return c.status == RunStatus::kMeasured; }));
  }
  Result<bool> fill_top();
  Result<bool> calibrate_now();
  void choose();
  Result<bool> dry_run();

  PlanRequest request_;
  TuneOptions o_;
  TuneResult r_;
  int repeat_ = 1;  // the run of a candidate under way, 1..repeats
};

Result<bool> Tuner::check_options() const {
  if (o_.out_dir.empty()) return Error{"tune: --out DIR is required (the tune's state, runs, calibrated profile and plan go there)"};
  if (o_.top < 1 || o_.top > 100) return Error{"--top: must be 1 to 100 layouts (got " + std::to_string(o_.top) + ")"};
  if (o_.steps < 1 || o_.steps > 100000) return Error{"--steps: must be 1 to 100000 (got " + std::to_string(o_.steps) + ")"};
  if (o_.rounds < 0 || o_.rounds > 20) return Error{"--rounds: must be 0 to 20 (got " + std::to_string(o_.rounds) + ")"};
  if (o_.repeats < 1 || o_.repeats > 10) return Error{"--repeats: must be 1 to 10 (got " + std::to_string(o_.repeats) + ")"};
  if (!(o_.deadline_seconds > 0) || !std::isfinite(o_.deadline_seconds)) return Error{"--deadline: must be a number of seconds > 0"};
  if (o_.inject_failure < 0) return Error{"--inject-failure: a candidate number >= 1"};
  if (o_.inject_failure_run < 1 || o_.inject_failure_run > o_.repeats) {
    return Error{"--inject-failure-run: a run from 1 to --repeats (" + std::to_string(o_.repeats) + ")"};
  }
  if (o_.executor.empty()) return Error{"tune: no executor given"};
  if (o_.launcher == Launcher::kTorchrun && request_.gpus > request_.cluster.gpus_per_node) {
    return Error{"--launcher torchrun runs on this node's GPUs: " + std::to_string(request_.gpus) + " GPUs is more than a node of " +
                 request_.cluster.name + " (" + std::to_string(request_.cluster.gpus_per_node) + "); use --launcher slurm"};
  }
  if (o_.launcher == Launcher::kMpirun && !o_.measure_profile && !request_.cluster.gpu.kernels) {
    return Error{"--launcher mpirun runs on this machine's CPU ranks, but --cluster " + request_.cluster.name +
                 " is no measured profile of it: leave --cluster out (the tune measures this machine first) or give one "
                 "`planner profile --device cpu` wrote"};
  }
  return true;
}

// The profile the tune starts from, kept in out/base-profile.json so that --resume plans on the
// same one: measured here first where asked (mpirun without a CPU profile).
Result<bool> Tuner::prepare_base() {
  const fs::path base_file = out() / "base-profile.json";
  if (fs::exists(base_file) && (o_.resume || o_.measure_profile)) {
    auto text = costmodel::read_text_file(base_file.string());
    if (!text) return text.error();
    auto hw = costmodel::parse_hwprofile_text(*text, base_file.string());
    if (!hw) return hw.error();
    if (o_.measure_profile || hw->name == request_.cluster.name) {
      request_.cluster = std::move(hw).value();
      request_.cluster_ref = base_file.string();
      r_.base = request_.cluster;
      if (o_.measure_profile) say("profile of this machine: " + base_file.string() + " (measured before; not measured again)");
      return true;
    }
  }
  if (o_.measure_profile) {
    ProfileRunOptions p;
    p.executor = o_.executor;
    p.mpirun = o_.mpirun;
    p.out = base_file.string();
    p.device = "cpu";
    p.ranks = std::min(request_.gpus, 8);
    // One rank's share of the cores, as the executor takes them (--threads 0: cores / local ranks).
    p.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, request_.gpus));
    p.quick = true;
    p.allow_run_as_root = o_.allow_run_as_root;
    p.command = "planner tune (the profile it starts from)";
    p.base = costmodel::kDefaultCluster;
    auto ok = check_profile_run(p, 8);
    if (!ok) return Error{"tune: measuring this machine: " + ok.error().message};
    say("measuring this machine's CPU ranks first (" + std::to_string(p.ranks) + " ranks, quick sweep): " + base_file.string());
    auto end = run_job(profile_command(p), (out() / "base-profile.log").string(), o_.deadline_seconds, nullptr);
    if (!end) return end.error();
    if (end->kind != JobEnd::Kind::kExited || !end->exit.success()) {
      return Error{"tune: measuring this machine's profile " +
                   std::string(end->kind == JobEnd::Kind::kInterrupted ? "was interrupted"
                               : end->kind == JobEnd::Kind::kDeadline  ? "passed the deadline"
                                                                       : end->exit.text()) +
                   "; its log: " + (out() / "base-profile.log").string() + "\n" + tail_lines((out() / "base-profile.log").string(), 5)};
    }
    auto text = costmodel::read_text_file(base_file.string());
    if (!text) return text.error();
    auto hw = costmodel::parse_hwprofile_text(*text, base_file.string());
    if (!hw) return hw.error();
    request_.cluster = std::move(hw).value();
    request_.cluster_ref = base_file.string();
  } else {
    auto ok = write_text(base_file, costmodel::hwprofile_to_json(request_.cluster).dump(2) + "\n");
    if (!ok) return ok.error();
  }
  r_.base = request_.cluster;
  return true;
}

Result<bool> Tuner::save_state() const {
  nlohmann::json j = {{"schema", kTuneSchema},
                      {"request", request_identity(request_, o_)},
                      {"base_profile", "base-profile.json"},
                      {"top", o_.top},
                      {"rounds_run", r_.rounds_run},
                      {"interrupted", r_.interrupted}};
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : r_.candidates) {
    j["candidates"].push_back({{"number", c.number},
                               {"round", c.round},
                               {"layout", c.layout},
                               {"plan", c.directory + "/plan.json"},
                               {"status", run_status_name(c.status)},
                               {"detail", c.detail},
                               {"predicted_before_step_seconds", c.predicted_before},
                               {"measured_step_seconds", optional_json(c.measured)},
                               {"measured_tokens_per_second", optional_json(c.measured_tokens_per_second)},
                               {"runs_step_seconds", c.runs},
                               {"predicted_after_step_seconds", optional_json(c.predicted_after)},
                               {"run_seconds", c.run_seconds}});
  }
  j["calibrated_profile"] = r_.profile_path.empty() ? nlohmann::json(nullptr) : nlohmann::json("profile.json");
  if (r_.calibrated) {
    const auto& k = r_.calibrated->gpu.calibration;
    j["calibration"] = {{"gemm_time_scale", k.gemm_time_scale},
                        {"attention_time_scale", k.attention_time_scale},
                        {"memory_time_scale", k.memory_time_scale},
                        {"latency_scale", k.latency_scale},
                        {"collective_time_scale", k.collective_time_scale},
                        {"notes", r_.calibration_notes}};
  }
  j["chosen"] = r_.chosen > 0 ? nlohmann::json(r_.chosen) : nlohmann::json(nullptr);
  j["why"] = r_.why;
  j["final_plan"] = r_.final_plan.empty() ? nlohmann::json(nullptr) : nlohmann::json("plan.json");
  if (o_.updated) o_.updated(r_.candidates);
  return write_text(out() / "tune.json", j.dump(2) + "\n");
}

Result<bool> Tuner::load_state() {
  const fs::path file = out() / "tune.json";
  auto text = costmodel::read_text_file(file.string());
  if (!text) return Error{"--resume: " + file.string() + " cannot be read (" + text.error().message + "): nothing to resume; run without --resume"};
  auto parsed = costmodel::parse_json_text(*text, file.string());
  if (!parsed) return parsed.error();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("schema", "") != kTuneSchema) return Error{file.string() + ": /schema: must be \"" + std::string(kTuneSchema) + "\""};
  const nlohmann::json want = request_identity(request_, o_);
  if (!j.contains("request") || !j["request"].is_object()) return Error{file.string() + ": /request: missing"};
  for (const auto& [key, value] : want.items()) {
    const auto it = j["request"].find(key);
    if (it == j["request"].end() || *it != value) {
      return Error{file.string() + ": /request/" + key + ": the tune there is for " + (it == j["request"].end() ? "nothing" : it->dump()) +
                   ", this command asks for " + value.dump() + ": give the same inputs with --resume, or another --out"};
    }
  }
  if (!j.contains("candidates") || !j["candidates"].is_array()) return Error{file.string() + ": /candidates: must be an array"};
  for (std::size_t i = 0; i < j["candidates"].size(); ++i) {
    const nlohmann::json& c = j["candidates"][i];
    const std::string where = file.string() + ": /candidates/" + std::to_string(i);
    if (!c.is_object() || !c.contains("plan") || !c["plan"].is_string() || !c.contains("status") || !c["status"].is_string()) {
      return Error{where + ": needs plan and status"};
    }
    const auto status = run_status_from_name(c["status"].get<std::string>());
    if (!status) return Error{where + "/status: unknown status \"" + c["status"].get<std::string>() + "\""};
    const fs::path plan_file = out() / c["plan"].get<std::string>();
    auto loaded = load_fixed_plan(plan_file.string());
    if (!loaded) return Error{where + "/plan: " + loaded.error().message};
    TuneCandidate t;
    t.number = c.value("number", static_cast<int>(i) + 1);
    t.round = c.value("round", 0);
    t.plan = with_cluster(std::move(loaded).value(), r_.base);
    t.layout = layout_text(t.plan.parallel);
    t.directory = fs::path(c["plan"].get<std::string>()).parent_path().string();
    t.status = *status;
    t.detail = c.value("detail", "");
    t.predicted_before = predicted_step(t.plan);
    t.measured = number_or_null(c, "measured_step_seconds");
    t.measured_tokens_per_second = number_or_null(c, "measured_tokens_per_second");
    t.run_seconds = number_or_null(c, "run_seconds").value_or(0);
    if (const auto runs = c.find("runs_step_seconds"); runs != c.end() && runs->is_array()) {
      for (const auto& x : *runs) {
        if (x.is_number()) t.runs.push_back(x.get<double>());
      }
    }
    if (t.status == RunStatus::kMeasured && !t.measured) return Error{where + "/measured_step_seconds: a measured candidate needs it"};
    if (t.status == RunStatus::kMeasured && t.runs.empty()) t.runs.push_back(*t.measured);
    if (t.status != RunStatus::kPending) {
      std::string line = two_digits(t.number) + " " + t.layout + ": " + run_status_name(t.status);
      if (t.status == RunStatus::kMeasured && static_cast<int>(t.runs.size()) < o_.repeats) {
        line += " (" + std::to_string(t.runs.size()) + " of " + std::to_string(o_.repeats) + " runs; the others run now)";
      }
      r_.resumed.push_back(line);
    }
    r_.candidates.push_back(std::move(t));
  }
  r_.rounds_run = j.value("rounds_run", 0);
  return true;
}

Result<std::vector<Candidate>> Tuner::ranked(const HardwareProfile& profile, int top) const {
  PlanRequest req = request_;
  req.cluster = profile;
  // The executor runs every model chunk with a layer at least: a split that gives the embedding
  // and the loss chunks of their own is not searched unless asked (then refused by the executor).
  if (!req.parallel.ends_in_split) req.parallel.ends_in_split = false;
  SearchOptions so;
  so.top = top;
  so.distinct_layouts = true;
  so.threads = std::max(1u, std::thread::hardware_concurrency());
  auto found = search(req, so);
  if (!found) return found.error();
  return std::move(found->ranked);
}

Result<bool> Tuner::add_candidate(const Plan& plan, int round, RunStatus status, const std::string& detail) {
  TuneCandidate c;
  c.number = static_cast<int>(r_.candidates.size()) + 1;
  c.round = round;
  c.plan = with_cluster(plan, r_.base);
  c.layout = layout_text(plan.parallel);
  c.directory = "candidates/" + two_digits(c.number);
  c.status = status;
  c.detail = detail;
  c.predicted_before = predicted_step(c.plan);
  std::error_code ec;
  fs::create_directories(out() / c.directory, ec);
  if (ec) return Error{(out() / c.directory).string() + ": cannot create: " + ec.message()};
  Plan written = c.plan;
  written.name = "tune-" + two_digits(c.number);
  auto ok = write_text(out() / c.directory / "plan.json", costmodel::plan_to_json(written, true).dump(2) + "\n");
  if (!ok) return ok.error();
  r_.candidates.push_back(std::move(c));
  return true;
}

std::vector<std::string> Tuner::executor_words(const TuneCandidate& c) const {
  std::vector<std::string> words = o_.extra_args;
  if (o_.inject_failure == c.number && repeat_ == o_.inject_failure_run) {
    for (const char* w : {"--fail-at-step", "2", "--fail-rank", "0"}) words.emplace_back(w);
  }
  return words;
}

std::vector<std::string> Tuner::local_command(const TuneCandidate& c) const {
  const fs::path dir = fs::absolute(out() / c.directory);
  const std::string plan = (dir / "plan.json").string(), measurement = fs::absolute(run_file(c, "measurement", ".json")).string();
  if (o_.launcher == Launcher::kMpirun) {
    LocalRunOptions lo;
    lo.mpirun = o_.mpirun;
    lo.executor = o_.executor;
    lo.plan_path = plan;
    lo.measurement_path = measurement;
    lo.steps = o_.steps + 1;  // the executor's median leaves out the first step
    lo.allow_run_as_root = o_.allow_run_as_root;
    lo.extra_args = executor_words(c);
    // Each rank pinned to a core (two or more to a core where there are more ranks than cores):
    // a tune compares runs, and with ranks the scheduler moves about 4 runs of one plan measured
    // 22% apart (4 ranks on a 2-core VM), pinned 4% apart.
    lo.mpirun_args = {"--bind-to", "core:overload-allowed"};
    return mpirun_command(c.plan, lo);
  }
  std::vector<std::string> argv = {o_.torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", std::to_string(c.plan.gpus),
                                   o_.executor, "--plan", plan, "--steps", std::to_string(o_.steps + 1), "--device", "cuda",
                                   "--measurement", measurement};
  for (const auto& w : executor_words(c)) argv.push_back(w);
  return argv;
}

Result<std::string> Tuner::slurm_job_script(const TuneCandidate& c) const {
  LaunchOptions lo = o_.slurm;
  const int per_node = std::min(c.plan.gpus, c.plan.cluster.gpus_per_node);
  lo.gpus_per_node = per_node;
  lo.nodes = (c.plan.gpus + per_node - 1) / per_node;
  lo.steps = o_.steps + 1;
  lo.executor = o_.executor;
  lo.extra_args = executor_words(c);
  if (lo.job_name.empty()) lo.job_name = "tune-" + two_digits(c.number);
  return slurm_script(c.plan, fs::absolute(out() / c.directory / "plan.json").string(), lo);
}

// The executor's measurement decides what a run that ended gave: measured, out of memory or
// diverged (the executor writes those too); without one the run failed.
void Tuner::read_measurement(TuneCandidate& c, const fs::path& measurement, const std::string& ended) const {
  std::error_code ec;
  if (!fs::exists(measurement, ec)) {
    c.status = RunStatus::kFailed;
    const std::string log = tail_lines(run_file(c, "run", ".log"), 3);
    c.detail = ended + ", no measurement" + (log.empty() ? "" : ": " + log);
    return;
  }
  auto m = load_measurement_file(measurement.string());
  if (!m) {
    c.status = RunStatus::kFailed;
    c.detail = ended + "; its measurement cannot be read: " + m.error().message;
    return;
  }
  if (m->status == "out_of_memory") {
    c.status = RunStatus::kOutOfMemory;
    c.detail = "ran out of memory" + (m->out_of_memory && !m->out_of_memory->phase.empty() ? " in " + m->out_of_memory->phase : std::string());
    return;
  }
  if (m->status == "diverged") {
    c.status = RunStatus::kDiverged;
    c.detail = "diverged: the " + m->diverged_quantity + " was not finite";
    return;
  }
  const auto step = m->time.find("step_seconds");
  if (step == m->time.end() || !(step->second > 0)) {
    c.status = RunStatus::kFailed;
    c.detail = ended + "; its measurement has no step time";
    return;
  }
  c.status = RunStatus::kMeasured;
  c.detail.clear();
  c.measured = step->second;
  const auto tps = m->throughput.find("tokens_per_second");
  if (tps != m->throughput.end()) c.measured_tokens_per_second = tps->second;
}

Result<bool> Tuner::run_local(TuneCandidate& c) {
  const fs::path measurement = run_file(c, "measurement", ".json"), log = run_file(c, "run", ".log");
  std::error_code ec;
  fs::remove(measurement, ec);  // a measurement found after the run is this run's
  fs::remove(log, ec);
  auto end = run_job(local_command(c), log.string(), o_.deadline_seconds, [&](double t) {
    if (o_.status_line) o_.status_line("     running, " + std::to_string(static_cast<int>(t)) + " s (log: " + log.string() + ")");
  });
  if (!end) return end.error();
  c.run_seconds = end->seconds;
  if (end->kind == JobEnd::Kind::kInterrupted) {
    r_.interrupted = true;
    c.status = RunStatus::kPending;
    c.detail = "interrupted; --resume runs it again";
    return true;
  }
  if (end->kind == JobEnd::Kind::kDeadline) {
    c.status = RunStatus::kHung;
    char text[96];
    std::snprintf(text, sizeof text, "passed the deadline of %.0f s and was ended", o_.deadline_seconds);
    c.detail = text;
    return true;
  }
  read_measurement(c, measurement, launcher_name(o_.launcher) + std::string(" ") + end->exit.text());
  if (c.status == RunStatus::kMeasured && !end->exit.success()) {
    c.status = RunStatus::kFailed;
    c.detail = launcher_name(o_.launcher) + std::string(" ") + end->exit.text() + " after writing its measurement";
  }
  return true;
}

Result<bool> Tuner::run_slurm(TuneCandidate& c) {
  const fs::path dir = fs::absolute(out() / c.directory);
  auto script = slurm_job_script(c);
  if (!script) return script.error();
  auto ok = write_text(dir / "job.sh", *script);
  if (!ok) return ok.error();
  auto submitted = capture({o_.sbatch, "--parsable", "--chdir", dir.string(), "--output", (dir / "slurm-%j.out").string(), (dir / "job.sh").string()});
  if (!submitted) return Error{submitted.error().message + " (is SLURM installed here? --sbatch PATH)"};
  std::string id = submitted->second.substr(0, submitted->second.find_first_of(";\n \t"));
  if (!submitted->first.success() || id.empty() || id.find_first_not_of("0123456789_") != std::string::npos) {
    c.status = RunStatus::kFailed;
    c.detail = "sbatch " + submitted->first.text() + (submitted->second.empty() ? "" : ": " + submitted->second);
    return true;
  }
  say("     SLURM job " + id + " submitted");
  const auto started = std::chrono::steady_clock::now();
  std::string state;
  bool ended_early = false;
  for (;;) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (interrupted() || t > o_.deadline_seconds) {
      (void)capture({o_.scancel, id});
      ended_early = true;
      c.run_seconds = t;
      if (interrupted()) {
        r_.interrupted = true;
        c.status = RunStatus::kPending;
        c.detail = "interrupted; SLURM job " + id + " cancelled; --resume runs it again";
      } else {
        c.status = RunStatus::kHung;
        char text[128];
        std::snprintf(text, sizeof text, "SLURM job %s passed the deadline of %.0f s in state %s and was cancelled", id.c_str(), o_.deadline_seconds,
                      state.empty() ? "?" : state.c_str());
        c.detail = text;
      }
      break;
    }
    auto queued = capture({o_.squeue, "-h", "-j", id, "-o", "%T"});
    if (!queued) return queued.error();
    std::string now = queued->second.substr(0, queued->second.find_first_of("\n \t"));
    if (now.empty()) break;  // left the queue
    if (now != state) {
      state = now;
      say("     SLURM job " + id + " " + state);
    }
    if (o_.status_line) o_.status_line("     SLURM job " + id + " " + state + ", " + std::to_string(static_cast<int>(t)) + " s");
    pause_for(o_.poll_seconds);
  }
  if (ended_early) return true;
  c.run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // How the job ended, from accounting: COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL...
  auto accounted = capture({o_.sacct, "-n", "-P", "-X", "-j", id, "-o", "State"});
  std::string final_state;
  if (accounted && accounted->first.success()) final_state = accounted->second.substr(0, accounted->second.find_first_of("\n \t"));
  const fs::path measurement = dir / ("measurement-" + id + ".json");
  const std::string ended = "SLURM job " + id + " " + (final_state.empty() ? std::string("ended (sacct gave no state)") : final_state);
  if (final_state == "CANCELLED") {
    c.status = RunStatus::kCancelled;
    c.detail = ended + " (by someone else than this tune)";
  } else if (final_state == "TIMEOUT" || final_state == "DEADLINE") {
    c.status = RunStatus::kHung;
    c.detail = ended + ": the job's time limit passed";
  } else {
    read_measurement(c, measurement, ended);
    if (c.status == RunStatus::kMeasured && !final_state.empty() && final_state != "COMPLETED") {
      c.status = RunStatus::kFailed;
      c.detail = ended + " after writing its measurement";
    }
  }
  return true;
}

Result<bool> Tuner::run_candidate(TuneCandidate& c) {
  const std::string label = c.layout + " (mb=" + std::to_string(c.plan.parallel.micro_batch) +
                            (c.plan.parallel.virtual_stages > 1 ? " v=" + std::to_string(c.plan.parallel.virtual_stages) : "") + ")";
  char predicted[64];
  std::snprintf(predicted, sizeof predicted, "predicted %.4g s per step", c.predicted_before);
  say("[" + std::to_string(c.number) + "] " + label + ": " + predicted + (c.round > 0 ? ", ranked first after calibration " + std::to_string(c.round) : ""));
  // The first run decides the candidate's status; run_repeats adds the others.
  c.runs.clear();
  c.run_seconds = 0;
  c.measured_tokens_per_second.reset();
  auto ran = run_once(c, 1);
  if (!ran) return ran.error();
  if (c.status == RunStatus::kMeasured) c.runs.push_back(*c.measured);
  if (o_.status_line) o_.status_line("");
  char text[160];
  if (c.status == RunStatus::kMeasured) {
    std::snprintf(text, sizeof text, "measured %.4g s per step (%+.1f%% predicted) in %.0f s", *c.measured, 100 * (c.predicted_before / *c.measured - 1),
                  c.run_seconds);
    say("     " + std::string(text) + (o_.repeats > 1 ? "; run 1 of " + std::to_string(o_.repeats) : ""));
  } else {
    say("     " + std::string(run_status_name(c.status)) + ": " + c.detail);
  }
  return save_state();
}

// The runs after the first, taken in turns across the measured candidates (run 2 of every one,
// then run 3, ...), so that a stretch of time in which the machine runs slower or faster falls on
// all of them alike; each candidate counts its fastest run (as timeit does: what slows a run is
// added to it). A run that does not measure decides the candidate's status; an interrupted one
// leaves it measured with the runs it has, and --resume takes the missing ones.
Result<bool> Tuner::run_repeats() {
  for (int r = 2; r <= o_.repeats; ++r) {
    for (auto& c : r_.candidates) {
      if (r_.interrupted) return true;
      if (c.status != RunStatus::kMeasured || static_cast<int>(c.runs.size()) >= r) continue;
      const TuneCandidate before = c;
      c.run_seconds = 0;  // this run's, added below (a launcher that refuses the job leaves it 0)
      c.measured_tokens_per_second.reset();
      const int number = static_cast<int>(c.runs.size()) + 1;
      auto ran = run_once(c, number);
      if (!ran) return ran.error();
      if (o_.status_line) o_.status_line("");
      const double seconds = before.run_seconds + c.run_seconds;
      if (r_.interrupted) {
        c = before;
        c.run_seconds = seconds;
        return save_state();
      }
      char text[200];
      if (c.status == RunStatus::kMeasured) {
        const double step = *c.measured;
        c.runs.push_back(step);
        if (step >= *before.measured) {  // the fastest run stays the count
          c.measured = before.measured;
          c.measured_tokens_per_second = before.measured_tokens_per_second;
        }
        c.run_seconds = seconds;
        std::snprintf(text, sizeof text, "[%d] run %d of %d: %.4g s per step; the fastest %.4g", c.number, number, o_.repeats, step, *c.measured);
        say(text);
      } else {
        c.run_seconds = seconds;
        c.detail = "run " + std::to_string(number) + " of " + std::to_string(o_.repeats) + ": " + c.detail;
        say("[" + std::to_string(c.number) + "] " + run_status_name(c.status) + ": " + c.detail);
      }
      auto saved = save_state();
      if (!saved) return saved;
    }
  }
  return true;
}

// Runs the ranking's layouts in order until `top` are measured (or the ranking ends): a layout
// the executor cannot run is recorded as skipped, a failed one is replaced by the next (run()
// calls it again when a candidate's later run fails).
Result<bool> Tuner::fill_top() {
  auto list = ranked(r_.base, std::max(4 * o_.top, o_.top + 8));
  if (!list) return list.error();
  if (list->empty()) return Error{"tune: no plan fits " + request_.model.name + " on " + std::to_string(request_.gpus) + " of " + r_.base.name};
  std::size_t next = 0;
  const auto ended = [](const TuneCandidate& c) { return c.status != RunStatus::kPending && c.status != RunStatus::kSkipped; };
  for (;;) {
    if (r_.interrupted) return true;
    // Resumed or new: run the first round's pending candidates, in order.
    for (auto& c : r_.candidates) {
      if (c.round != 0 || c.status != RunStatus::kPending) continue;
      auto ok = run_candidate(c);
      if (!ok) return ok;
      if (r_.interrupted) return true;
    }
    const int tried = static_cast<int>(std::count_if(r_.candidates.begin(), r_.candidates.end(), [&](const TuneCandidate& c) { return c.round == 0 && ended(c); }));
    if (measured_count() >= o_.top || tried >= 2 * o_.top + 4) return true;
    // The next layout of the ranking that was not tried.
    while (next < list->size() && tried_layout((*list)[next].plan.parallel)) ++next;
    if (next >= list->size()) return true;
    const Plan& plan = (*list)[next++].plan;
    const std::vector<std::string> why_not = executor_limitations(plan);
    if (!why_not.empty()) {
      std::string text = "the executor cannot run it: " + why_not.front();
      auto ok = add_candidate(plan, 0, RunStatus::kSkipped, text);
      if (!ok) return ok;
      say("[" + std::to_string(r_.candidates.back().number) + "] " + r_.candidates.back().layout + ": skipped, " + text);
      auto saved = save_state();
      if (!saved) return saved;
      continue;
    }
    auto ok = add_candidate(plan, 0, RunStatus::kPending, "");
    if (!ok) return ok;
    auto saved = save_state();
    if (!saved) return saved;
  }
}

Result<bool> Tuner::calibrate_now() {
  std::vector<MeasuredRun> runs;
  for (const auto& c : r_.candidates) {
    if (c.status != RunStatus::kMeasured) continue;
    MeasuredRun m;
    m.name = two_digits(c.number) + " " + c.layout;
    m.plan = c.plan;
    m.step_seconds = *c.measured;
    runs.push_back(std::move(m));
  }
  if (runs.empty()) return true;
  auto fitted = calibrate(r_.base, runs);
  if (!fitted) return fitted.error();
  r_.calibrated = fitted->profile;
  r_.calibrated->name = r_.base.name + "-tuned";
  r_.calibration_notes = fitted->notes;
  for (auto& c : r_.candidates) {
    if (c.status == RunStatus::kSkipped) continue;
    c.predicted_after = predicted_step(with_cluster(c.plan, *r_.calibrated));
  }
  auto ok = write_text(out() / "profile.json", costmodel::hwprofile_to_json(*r_.calibrated).dump(2) + "\n");
  if (!ok) return ok;
  r_.profile_path = (out() / "profile.json").string();
  const auto& k = r_.calibrated->gpu.calibration;
  say("calibrated on " + std::to_string(runs.size()) + " measured run(s): " + calibration_scales_text(k));
  return save_state();
}

void Tuner::choose() {
  const TuneCandidate* best = nullptr;
  const TuneCandidate* second = nullptr;
  const auto speed = [](const TuneCandidate& c) { return c.measured_tokens_per_second.value_or(1.0 / *c.measured); };
  for (const auto& c : r_.candidates) {
    if (c.status != RunStatus::kMeasured) continue;
    if (!best || speed(c) > speed(*best)) {
      second = best;
      best = &c;
    } else if (!second || speed(c) > speed(*second)) {
      second = &c;
    }
  }
  if (!best) {
    r_.chosen = 0;
    r_.why = "no candidate measured: each one's status says why; fix that (or --deadline, --top) and run again";
    return;
  }
  r_.chosen = best->number;
  char text[512];
  std::snprintf(text, sizeof text, "fastest of the %d measured: %.4g s per step", measured_count(), *best->measured);
  r_.why = text;
  if (best->measured_tokens_per_second) r_.why += " (" + std::to_string(static_cast<long long>(std::llround(*best->measured_tokens_per_second))) + " tokens/s)";
  if (second) {
    std::snprintf(text, sizeof text, ", %.1f%% ahead of %s", 100 * (speed(*best) / speed(*second) - 1), second->layout.c_str());
    r_.why += text;
  }
  if (r_.calibrated) {
    auto list = ranked(*r_.calibrated, 1);
    if (list && !list->empty()) {
      const Plan& top = list->front().plan;
      if (same_layout(top.parallel, best->plan.parallel)) r_.why += "; the calibrated model ranks its layout first too";
      else if (tried_layout(top.parallel)) r_.why += "; the calibrated model ranks " + layout_text(top.parallel) + " first, which measured slower here";
      else r_.why += "; the calibrated model ranks " + layout_text(top.parallel) + " first, not measured (more --rounds would)";
    }
  }
}

Result<bool> Tuner::dry_run() {
  auto list = ranked(r_.base, std::max(4 * o_.top, o_.top + 8));
  if (!list) return list.error();
  std::string text;
  int shown = 0;
  for (const auto& cand : *list) {
    if (shown >= o_.top) break;
    if (!executor_limitations(cand.plan).empty()) continue;
    auto ok = add_candidate(cand.plan, 0, RunStatus::kPending, "");
    if (!ok) return ok;
    ++shown;
    const TuneCandidate& c = r_.candidates.back();
    text += "# [" + std::to_string(c.number) + "] " + c.layout + ", micro-batch " + std::to_string(c.plan.parallel.micro_batch) + "; plan " +
            (out() / c.directory / "plan.json").string() + "\n";
    if (o_.launcher == Launcher::kSlurm) {
      auto script = slurm_job_script(c);
      if (!script) return script.error();
      text += *script + "\n";
    } else {
      std::string line;
      for (const auto& w : local_command(c)) line += (line.empty() ? "" : " ") + shell_quote(w);
      text += line + "\n\n";
    }
  }
  r_.dry_run_text = text;
  return true;
}

Result<TuneResult> Tuner::run() {
  auto ok = check_options();
  if (!ok) return ok.error();
  r_.out_dir = o_.out_dir;
  r_.dry_run = o_.dry_run;
  std::error_code ec;
  if (!o_.resume && !o_.dry_run && fs::exists(out() / "tune.json", ec)) {
    return Error{(out() / "tune.json").string() + ": this folder holds a tune already: --resume goes on with it; or give another --out"};
  }
  fs::create_directories(out(), ec);
  if (ec) return Error{o_.out_dir + ": cannot create: " + ec.message()};
  InterruptGuard guard(o_.stop);
  if (o_.dry_run) {
    r_.base = request_.cluster;
    auto dr = dry_run();
    if (!dr) return dr.error();
    return r_;
  }
  auto base = prepare_base();
  if (!base) return base.error();
  if (o_.resume) {
    auto loaded = load_state();
    if (!loaded) return loaded.error();
    say("resuming " + (out() / "tune.json").string() + ": " + std::to_string(r_.resumed.size()) + " candidate(s) ended before, not run again (a measured one's missing runs excepted)");
  }
  // The first runs, then the repeats in turns; a candidate whose later run fails leaves the
  // measured ones, and the next layout of the ranking takes its place (and its repeats).
  for (;;) {
    const std::size_t known = r_.candidates.size();
    auto filled = fill_top();
    if (!filled) return filled.error();
    auto repeated = run_repeats();
    if (!repeated) return repeated.error();
    if (r_.interrupted || measured_count() >= o_.top || r_.candidates.size() == known) break;
  }
  if (r_.interrupted) {
    auto saved = save_state();
    if (!saved) return saved.error();
    return r_;
  }
  // Re-rank with the calibrated profile: a layout not tried that now ranks first is measured too.
  auto calibrated = calibrate_now();
  if (!calibrated) return calibrated.error();
  for (auto& c : r_.candidates) {  // resumed candidates of later rounds that had not run
    if (r_.interrupted || c.round == 0 || c.status != RunStatus::kPending) continue;
    auto ran = run_candidate(c);
    if (!ran) return ran.error();
    auto more = run_repeats();
    if (!more) return more.error();
    if (!r_.interrupted) {
      auto again = calibrate_now();
      if (!again) return again.error();
    }
  }
  while (!r_.interrupted && r_.calibrated && r_.rounds_run < o_.rounds) {
    auto list = ranked(*r_.calibrated, 8);
    if (!list) return list.error();
    const Candidate* first = nullptr;
    for (const auto& cand : *list) {
      if (executor_limitations(cand.plan).empty()) {
        first = &cand;
        break;
      }
    }
    if (!first || tried_layout(first->plan.parallel)) break;  // the calibrated ranking's first layout was measured
    ++r_.rounds_run;
    auto added = add_candidate(first->plan, r_.rounds_run, RunStatus::kPending, "");
    if (!added) return added.error();
    auto ran = run_candidate(r_.candidates.back());
    if (!ran) return ran.error();
    auto more = run_repeats();
    if (!more) return more.error();
    if (r_.interrupted) break;
    auto again = calibrate_now();
    if (!again) return again.error();
  }
  if (r_.interrupted) {
    auto saved = save_state();
    if (!saved) return saved.error();
    return r_;
  }
  choose();
  if (r_.chosen > 0) {
    const TuneCandidate& c = r_.candidates[static_cast<std::size_t>(r_.chosen - 1)];
    Plan final_plan = with_cluster(c.plan, r_.calibrated ? *r_.calibrated : r_.base);
    final_plan.name = request_.model.name + "-" + std::to_string(request_.gpus) + "-tuned";
    auto written = write_text(out() / "plan.json", costmodel::plan_to_json(final_plan, true).dump(2) + "\n");
    if (!written) return written.error();
    r_.final_plan = (out() / "plan.json").string();
  }
  auto saved = save_state();
  if (!saved) return saved.error();
  return r_;
}

}  // namespace

Result<TuneResult> tune(const PlanRequest& request, const TuneOptions& options) {
  Tuner tuner(request, options);
  return tuner.run();
}

}  // namespace trainplan::planner
