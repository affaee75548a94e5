#pragma once
// Starting a program without a shell (fork + execvp), shared by `planner run` (local_run.cpp) and
// `planner tune`'s jobs (tune/jobs.cpp). POSIX.

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner::detail {

struct SpawnOptions {
  int out_fd = -1;               // >= 0: the child's stdout (and stderr when stderr_too)
  bool stderr_too = false;
  bool stdin_null = false;       // the child reads /dev/null
  bool new_group = false;        // the child leads a new process group (its pid), so that it and
                                 // what it starts can be signalled together
  std::function<void()> in_child;  // run in the child before exec (restoring signal handlers)
};

// Starts argv[0] (looked up on PATH when it has no '/'); returns its pid once the exec succeeded.
// A failed exec comes back through a close-on-exec pipe as the error "cannot run NAME: why", and
// the child is reaped. REQUIRES: !argv.empty().
[[nodiscard]] costmodel::Result<pid_t> spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

}  // namespace trainplan::planner::detail
