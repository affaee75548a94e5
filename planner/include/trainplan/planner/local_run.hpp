#pragma once
// Running a fixed plan on this machine: the executor on CPU ranks under MPI (mpirun), with its
// output streamed through, then the comparison of the plan's estimate with the measurement the
// executor wrote. Also where to find the executor. POSIX (fork, execvp, waitpid); no shell is
// involved, so no argument is ever interpreted by one.

#include <optional>
#include <string>
#include <vector>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/compare.hpp"

namespace trainplan::planner {

// Where to look for the executor; main() fills it from the command line and the environment.
struct ExecutorSearch {
  std::string given;        // --executor; empty when not given
  std::string environment;  // $TRAINPLAN_EXECUTOR; empty when not set
  std::string planner_dir;  // the planner binary's folder: the build puts the executor at ../executor/executor
  std::string path;         // $PATH
};

// The executor, as an absolute path: `given`, else `environment`, else
// planner_dir/../executor/executor, else `executor` on `path`. A name without '/' is looked up on
// `path`. A given or environment value that names no executable file is an error naming it;
// finding none is an error saying that the executor was not built (it needs LibTorch).
[[nodiscard]] costmodel::Result<std::string> find_executor(const ExecutorSearch& search);

// The executor a launch script names: `given` or `environment` as written (it may be a path on
// the cluster), else the built one beside the planner (absolute) when it exists, else "executor".
[[nodiscard]] std::string executor_for_launch(const ExecutorSearch& search);

// The folder of the running binary (/proc/self/exe, else argv[0] made absolute).
[[nodiscard]] std::string own_binary_dir(const char* argv0);

struct LocalRunOptions {
  std::string mpirun = "mpirun";  // path, or a name on PATH
  std::string executor;           // REQUIRES: not empty (find_executor)
  std::string plan_path;          // the plan file; passed on as an absolute path
  std::string measurement_path;   // where the executor writes its measurement; passed on as an absolute path
  int steps = 50;                 // REQUIRES: >= 1
  int ranks = 0;                  // 0: the plan's world size; anything else must equal it
  bool allow_run_as_root = false; // Open MPI refuses to run as root without --allow-run-as-root
  std::vector<std::string> extra_args;  // appended to the executor's arguments
  std::vector<std::string> mpirun_args; // more mpirun options, before the executor (`planner tune`: --bind-to core:overload-allowed)
};

// mpirun --oversubscribe -n GPUS [--allow-run-as-root] --mca btl_vader_single_copy_mechanism none [mpirun_args...]
//   EXECUTOR --plan PLAN --steps S --device cpu --measurement FILE [extra...]
// REQUIRES: the options pass check_local_run.
[[nodiscard]] std::vector<std::string> mpirun_command(const costmodel::Plan& plan, const LocalRunOptions& options);

// Checks the options against the plan: ranks and steps.
[[nodiscard]] costmodel::Result<bool> check_local_run(const costmodel::Plan& plan, const LocalRunOptions& options);

// How a child process ended.
struct ProcessExit {
  int code = 0;    // its exit status, when it exited
  int signal = 0;  // the signal that killed it, or 0
  [[nodiscard]] bool success() const { return code == 0 && signal == 0; }
  // "exited with status 3", "was killed by signal 9 (Killed)".
  [[nodiscard]] std::string text() const;
};

// Runs argv[0] (looked up on PATH when it has no '/') with the given arguments; stdin, stdout and
// stderr are inherited, so its output streams through unbuffered. Waits for it, ignoring SIGINT
// and SIGQUIT meanwhile (as system() does), so Ctrl-C ends the child and its end is reported.
// Errors: it cannot be started. REQUIRES: !argv.empty().
[[nodiscard]] costmodel::Result<ProcessExit> run_process(const std::vector<std::string>& argv);

struct LocalRun {
  ProcessExit exit;                      // how mpirun ended
  std::optional<Comparison> comparison;  // the estimate against the measurement, when it succeeded
};

// check_local_run, then runs mpirun_command and, when it succeeds, compares the plan's estimate
// with the measurement it wrote. A failed run is no error (see `exit`); errors are bad options,
// mpirun that cannot start, a run that succeeded without writing a new measurement, and a
// malformed measurement.
[[nodiscard]] costmodel::Result<LocalRun> run_locally(const costmodel::Plan& plan, const LocalRunOptions& options);

}  // namespace trainplan::planner
