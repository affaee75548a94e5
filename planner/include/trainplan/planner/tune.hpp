#pragma once
// `planner tune`: measure the top plans for real, recalibrate the profile, re-rank.
//
// 1. Search; take the top K distinct layouts (search.hpp same_layout) the executor can run.
// 2. Run each for a few steps (after one warm-up step) through a launcher: mpirun on this
//    machine's CPU ranks, torchrun on this node's GPUs, or one SLURM job per candidate (sbatch,
//    state followed with squeue, the end read with sacct), each under a deadline. A candidate
//    that runs out of memory, diverges, hangs or fails is recorded with its status, and the next
//    layout of the ranking is tried in its place.
// 3. Fit the profile to what was measured (calibrate.hpp), re-rank every plan with it, and when
//    a layout that was not tried now ranks first, measure it too (at most `rounds` times).
// 4. The choice is the fastest measured candidate. Everything is written to the tune's folder as
//    it happens (tune.json, each candidate's plan, log and measurement, the calibrated profile,
//    the final plan), so an interrupted tune goes on with --resume and re-runs nothing that ended.

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/launch.hpp"

namespace trainplan::planner {

inline constexpr const char* kTuneSchema = "trainplan/tune/v1";

enum class Launcher { kMpirun, kTorchrun, kSlurm };
[[nodiscard]] const char* launcher_name(Launcher l);
[[nodiscard]] std::optional<Launcher> launcher_from_name(const std::string& name);

// How a candidate's run ended. kPending: not run yet (or interrupted: run again on --resume).
enum class RunStatus { kPending, kMeasured, kOutOfMemory, kDiverged, kHung, kFailed, kCancelled, kSkipped };
// "pending", "measured", "out_of_memory", "diverged", "hung", "failed", "cancelled", "skipped".
[[nodiscard]] const char* run_status_name(RunStatus s);
[[nodiscard]] std::optional<RunStatus> run_status_from_name(const std::string& name);

struct TuneCandidate {
  int number = 0;           // 1-based, in the order tried
  int round = 0;            // 0: the search's ranking; r >= 1: ranked first after the r-th calibration
  std::string layout;       // layout_text
  costmodel::Plan plan;     // on the profile the tune started from
  std::string directory;    // relative to the tune's folder: candidates/NN
  RunStatus status = RunStatus::kPending;
  std::string detail;       // why it did not measure; the SLURM job and its state
  double predicted_before = 0;                // step seconds on the starting profile
  std::optional<double> measured;             // step seconds: the fastest run's median after its warm-up step
  std::vector<double> runs;                   // every run's median step, seconds (TuneOptions::repeats)
  std::optional<double> measured_tokens_per_second;
  std::optional<double> predicted_after;      // step seconds on the calibrated profile
  double run_seconds = 0;                     // wall time of its run
};

struct TuneOptions {
  std::string out_dir;          // REQUIRES: not empty. Everything is written here.
  Launcher launcher = Launcher::kMpirun;
  int top = 3;                  // distinct layouts measured before calibrating. REQUIRES: 1..100
  int steps = 5;                // measured steps after one warm-up step. REQUIRES: 1..100000
  // Runs of each candidate; its step is the fastest run's, as timeit takes the fastest: a slower
  // run was slowed by something else on the machine. The runs after the first take turns across
  // the measured candidates (run 2 of each, then run 3), so that a stretch in which the machine
  // runs slower falls on all of them alike (this 2-core VM ran one plan at 0.16 s a step in one
  // minute and 0.22-0.25 s in another); a candidate added after a calibration runs its own one
  // after the other. REQUIRES: 1..10
  int repeats = 1;
  int rounds = 2;               // re-rank rounds that may add a candidate. REQUIRES: 0..20
  double deadline_seconds = 900;  // one candidate's run; past it the run is ended and recorded as hung. REQUIRES: > 0
  bool resume = false;          // go on with the tune in out_dir (its tune.json)
  bool dry_run = false;         // print the job scripts and commands; run nothing
  // mpirun only, where the request's cluster is no profile of this machine: measure one first
  // (`executor --profile` on the plan's ranks, quick sweep, one thread per rank) into
  // out_dir/base-profile.json, and plan on it.
  bool measure_profile = false;
  std::string executor;         // mpirun and torchrun: an executable path; SLURM: as the nodes see it
  std::string mpirun = "mpirun", torchrun = "torchrun";
  std::string sbatch = "sbatch", squeue = "squeue", sacct = "sacct", scancel = "scancel";
  double poll_seconds = 2.0;    // SLURM: how often squeue is asked
  LaunchOptions slurm;          // SLURM: partition, account, time, job name, cpus per task, executor
  bool allow_run_as_root = false;
  std::vector<std::string> extra_args;  // more executor arguments, for every candidate
  // Fault injection (tests): candidate number `inject_failure` (1-based; 0: none) has its rank 0
  // killed at step 2 (`executor --fail-at-step 2 --fail-rank 0`) in its run `inject_failure_run`
  // (1..repeats).
  int inject_failure = 0;
  int inject_failure_run = 1;
  // Lines for the terminal as the tune goes (progress, each run's end). Optional.
  std::function<void(const std::string&)> progress;
  // Where the terminal is a TTY: a running job's status line, rewritten in place. Optional.
  std::function<void(const std::string&)> status_line;
  // Called with every candidate each time the tune's state is written (a candidate added, ended
  // or re-predicted). Optional; the GUI fills its measured column from it.
  std::function<void(const std::vector<TuneCandidate>&)> updated;
  // Set by a caller that runs the tune on another thread (the GUI): the tune stops as on SIGTERM
  // (the running job ended, its candidate left pending for --resume). Optional.
  const std::atomic<bool>* stop = nullptr;
};

struct TuneResult {
  std::string out_dir;
  costmodel::HardwareProfile base;                    // the profile the tune started from
  std::vector<TuneCandidate> candidates;
  std::optional<costmodel::HardwareProfile> calibrated;
  std::vector<std::string> calibration_notes;
  int rounds_run = 0;
  int chosen = 0;             // the chosen candidate's number; 0: none measured
  std::string why;            // the reason for the choice (or for having none)
  std::string final_plan;     // path of the chosen plan, on the calibrated profile; empty: none
  std::string profile_path;   // path of the calibrated profile; empty: none
  bool interrupted = false;   // stopped by SIGINT or SIGTERM: --resume goes on
  bool dry_run = false;
  std::string dry_run_text;   // the scripts and commands --dry-run prints
  std::vector<std::string> resumed;  // candidates an earlier run had ended (a measured one's missing repeats run now)
};

// Runs the tune (see above). Errors: bad options, an out_dir that holds another tune (or a
// --resume without one, or of other inputs), no plan the executor can run, a launcher that
// cannot start, a profile that cannot be measured. A candidate's failure is no error.
[[nodiscard]] costmodel::Result<TuneResult> tune(const costmodel::PlanRequest& request, const TuneOptions& options);

// For people: every candidate with predicted before, measured and predicted after, its status,
// the calibration, the choice and why, and what was written.
[[nodiscard]] std::string render_tune(const TuneResult& result);

}  // namespace trainplan::planner
