#include "trainplan/planner/local_run.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "trainplan/planner/launch.hpp"
#include "trainplan/planner/measurement.hpp"
#include "spawn.hpp"

namespace trainplan::planner {

namespace fs = std::filesystem;
using costmodel::Error;
using costmodel::Plan;
using costmodel::Result;

namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// `name` with a '/' as an absolute path when it is an executable file; a bare name looked up on
// `path_variable`. Empty when not found.
std::string resolve_executable(const std::string& name, const std::string& path_variable) {
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? fs::absolute(name).lexically_normal().string() : "";
  std::stringstream dirs(path_variable);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (is_executable_file(candidate.string())) return fs::absolute(candidate).lexically_normal().string();
  }
  return "";
}

std::string built_executor(const std::string& planner_dir) {
  if (planner_dir.empty()) return "";
  return (fs::path(planner_dir) / ".." / "executor" / "executor").lexically_normal().string();
}

}  // namespace

Result<std::string> find_executor(const ExecutorSearch& search) {
  if (!search.given.empty()) {
    std::string found = resolve_executable(search.given, search.path);
    if (found.empty()) return Error{"--executor " + search.given + ": no such executable file"};
    return found;
  }
  if (!search.environment.empty()) {
    std::string found = resolve_executable(search.environment, search.path);
    if (found.empty()) return Error{"TRAINPLAN_EXECUTOR=" + search.environment + ": no such executable file"};
    return found;
  }
  const std::string beside = built_executor(search.planner_dir);
  if (!beside.empty() && is_executable_file(beside)) return fs::absolute(beside).string();
  std::string on_path = resolve_executable("executor", search.path);
  if (!on_path.empty()) return on_path;
  return Error{"the executor was not built: it needs LibTorch (`scripts/setup.sh test` builds it); looked for " +
               (beside.empty() ? std::string() : beside + " and for ") +
               "`executor` on PATH; or give --executor PATH or set TRAINPLAN_EXECUTOR"};
}

std::string executor_for_launch(const ExecutorSearch& search) {
  if (!search.given.empty()) return search.given;
  if (!search.environment.empty()) return search.environment;
  const std::string beside = built_executor(search.planner_dir);
  if (!beside.empty() && is_executable_file(beside)) return fs::absolute(beside).string();
  return "executor";
}

std::string own_binary_dir(const char* argv0) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) return self.parent_path().string();
  if (argv0 == nullptr || std::strchr(argv0, '/') == nullptr) return "";
  return fs::absolute(argv0).parent_path().lexically_normal().string();
}

Result<bool> check_local_run(const Plan& plan, const LocalRunOptions& options) {
  if (options.ranks != 0 && options.ranks != plan.gpus) {
    return Error{"--ranks " + std::to_string(options.ranks) + ": the plan runs on " + std::to_string(plan.gpus) +
                 " ranks (its gpus); the executor runs exactly the plan's world size"};
  }
  if (options.steps < 1) return Error{"--steps: must be >= 1 (got " + std::to_string(options.steps) + ")"};
  const std::vector<std::string> problems = executor_limitations(plan);
  if (!problems.empty()) {
    std::string text = "the executor cannot run this plan:";
    for (const auto& s : problems) text += "\n  - " + s;
    return Error{text};
  }
  return true;
}

std::vector<std::string> mpirun_command(const Plan& plan, const LocalRunOptions& options) {
  std::vector<std::string> argv = {options.mpirun, "--oversubscribe", "-n", std::to_string(plan.gpus)};
  if (options.allow_run_as_root) argv.emplace_back("--allow-run-as-root");
  for (const char* word : {"--mca", "btl_vader_single_copy_mechanism", "none"}) argv.emplace_back(word);
  argv.insert(argv.end(), options.mpirun_args.begin(), options.mpirun_args.end());
  const std::vector<std::string> executor = {
      options.executor, "--plan", fs::absolute(options.plan_path).string(), "--steps", std::to_string(options.steps),
      "--device", "cpu", "--measurement", fs::absolute(options.measurement_path).string()};
  argv.insert(argv.end(), executor.begin(), executor.end());
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  return argv;
}

std::string ProcessExit::text() const {
  if (signal != 0) return "was killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  return "exited with status " + std::to_string(code);
}

Result<pid_t> detail::spawn(const std::vector<std::string>& argv, const detail::SpawnOptions& options) {
  if (argv.empty()) {
    std::fprintf(stderr, "%s:%d: spawn: empty argv\n", __FILE__, __LINE__);
    std::abort();
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The child reports a failed exec through this pipe; a successful exec closes it (close-on-exec).
  int report[2];
  if (::pipe(report) != 0 || ::fcntl(report[1], F_SETFD, FD_CLOEXEC) != 0) {
    return Error{std::string("cannot start ") + argv[0] + ": pipe: " + std::strerror(errno)};
  }
  std::fflush(nullptr);  // nothing buffered here is written twice or after the child's output
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(report[0]);
    ::close(report[1]);
    return Error{std::string("cannot start ") + argv[0] + ": fork: " + std::strerror(error)};
  }
  if (pid == 0) {
    if (options.in_child) options.in_child();
    if (options.new_group) ::setpgid(0, 0);
    ::close(report[0]);
    if (options.stdin_null) {
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, 0);
    }
    if (options.out_fd >= 0) {
      ::dup2(options.out_fd, 1);
      if (options.stderr_too) ::dup2(options.out_fd, 2);
    }
    ::execvp(args[0], args.data());
    const int error = errno;
    const ssize_t written = ::write(report[1], &error, sizeof error);
    (void)written;
    ::_exit(127);
  }
  if (options.new_group) ::setpgid(pid, pid);  // also here, so that no signal can come before the child's own call
  ::close(report[1]);
  int exec_error = 0;
  ssize_t got = 0;
  do {
    got = ::read(report[0], &exec_error, sizeof exec_error);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof exec_error)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return Error{std::string("cannot run ") + argv[0] + ": " + std::strerror(exec_error)};
  }
  return pid;
}

Result<ProcessExit> run_process(const std::vector<std::string>& argv) {
  struct sigaction ignore {}, old_int {}, old_quit {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGINT, &ignore, &old_int);
  ::sigaction(SIGQUIT, &ignore, &old_quit);
  const auto restore_signals = [&] {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
  };
  detail::SpawnOptions options;
  options.in_child = restore_signals;
  auto pid = detail::spawn(argv, options);
  if (!pid) {
    restore_signals();
    return pid.error();
  }
  int status = 0;
  pid_t waited = 0;
  do {
    waited = ::waitpid(*pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  const int wait_error = errno;
  restore_signals();

  if (waited < 0) return Error{std::string("waiting for ") + argv[0] + ": " + std::strerror(wait_error)};
  ProcessExit exit;
  if (WIFEXITED(status)) exit.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
  return exit;
}

Result<LocalRun> run_locally(const Plan& plan, const LocalRunOptions& options) {
  auto ok = check_local_run(plan, options);
  if (!ok) return ok.error();
  std::error_code ec;
  const auto written_before = fs::last_write_time(options.measurement_path, ec);
  const bool existed = !ec;

  auto exit = run_process(mpirun_command(plan, options));
  if (!exit) return Error{exit.error().message + " (mpirun comes with Open MPI: apt-get install openmpi-bin; or give --mpirun PATH)"};
  LocalRun run;
  run.exit = *exit;
  if (!run.exit.success()) return run;

  const auto written_after = fs::last_write_time(options.measurement_path, ec);
  if (ec) return Error{options.measurement_path + ": the run succeeded but wrote no measurement there"};
  if (existed && written_after == written_before) {
    return Error{options.measurement_path + ": the run succeeded but did not rewrite this measurement (it is the one from before)"};
  }
  auto measured = load_measurement_file(options.measurement_path);
  if (!measured) return measured.error();
  run.comparison = compare(predict(plan, options.plan_path), std::move(measured).value());
  return run;
}

}  // namespace trainplan::planner
