#pragma once
// The tune's jobs: a child process in its own process group, its output into a log, under a
// deadline, ended when the planner is interrupted; and short commands whose output is read
// (SLURM's sbatch, squeue, sacct). POSIX; no shell is involved.

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/local_run.hpp"

namespace trainplan::planner::tune_detail {

// While alive, SIGINT and SIGTERM set a flag (interrupted()) instead of ending the planner, so
// that a running job is ended and the tune's state written before it stops; `stop`, when given,
// asks the same from another thread.
class InterruptGuard {
 public:
  explicit InterruptGuard(const std::atomic<bool>* stop = nullptr);
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};
[[nodiscard]] bool interrupted();

struct JobEnd {
  enum class Kind { kExited, kDeadline, kInterrupted };
  Kind kind = Kind::kExited;
  ProcessExit exit;      // kExited: how it ended
  double seconds = 0;    // wall time
};

// Runs argv[0] (looked up on PATH without '/') in a new process group, stdin from /dev/null,
// stdout and stderr appended to `log_path`. Past `deadline_seconds`, or when interrupted(), the
// group gets SIGTERM and, 5 s later, SIGKILL. `tick` (optional) is called about once a second
// with the seconds elapsed. Errors: the log cannot be opened, the program cannot be started.
[[nodiscard]] costmodel::Result<JobEnd> run_job(const std::vector<std::string>& argv, const std::string& log_path, double deadline_seconds,
                                                const std::function<void(double)>& tick);

// Runs argv and returns how it ended and what it wrote to stdout (stderr passes through).
[[nodiscard]] costmodel::Result<std::pair<ProcessExit, std::string>> capture(const std::vector<std::string>& argv);

// The last `lines` non-empty lines of a text file (empty when it cannot be read).
[[nodiscard]] std::string tail_lines(const std::string& path, int lines);

// Sleeps `seconds`, waking early when interrupted().
void pause_for(double seconds);

}  // namespace trainplan::planner::tune_detail
