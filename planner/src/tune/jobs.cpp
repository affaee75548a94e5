#include "jobs.hpp"

#include "../run/spawn.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

namespace trainplan::planner::tune_detail {

using costmodel::Error;
using costmodel::Result;

namespace {

std::atomic<bool> g_interrupted{false};
const std::atomic<bool>* g_stop = nullptr;
struct sigaction g_old_int {}, g_old_term {};

extern "C" void on_interrupt(int) { g_interrupted.store(true); }

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ProcessExit exit_of(int status) {
  ProcessExit e;
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  return e;
}

// The child's signal handlers as they were before the tune's guard.
void restore_in_child() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

Result<pid_t> start(const std::vector<std::string>& argv, int out_fd, bool both, bool group) {
  detail::SpawnOptions options;
  options.out_fd = out_fd;
  options.stderr_too = both;
  options.stdin_null = true;
  options.new_group = group;
  options.in_child = restore_in_child;
  return detail::spawn(argv, options);
}

}  // namespace

InterruptGuard::InterruptGuard(const std::atomic<bool>* stop) {
  g_interrupted.store(false);
  g_stop = stop;
  struct sigaction on {};
  on.sa_handler = on_interrupt;
  sigemptyset(&on.sa_mask);
  ::sigaction(SIGINT, &on, &g_old_int);
  ::sigaction(SIGTERM, &on, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  g_stop = nullptr;
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

bool interrupted() { return g_interrupted.load() || (g_stop != nullptr && g_stop->load()); }

void pause_for(double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (!interrupted() && since(start) < seconds) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

Result<JobEnd> run_job(const std::vector<std::string>& argv, const std::string& log_path, double deadline_seconds,
                       const std::function<void(double)>& tick) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return Error{log_path + ": cannot open the run's log: " + std::strerror(errno)};
  const auto started = std::chrono::steady_clock::now();
  auto pid = start(argv, log, true, true);
  ::close(log);
  if (!pid) return pid.error();
  JobEnd end;
  int status = 0;
  double last_tick = 0;
  bool ending = false;
  double term_sent = 0;
  for (;;) {
    const pid_t w = ::waitpid(*pid, &status, WNOHANG);
    if (w == *pid) break;
    if (w < 0 && errno != EINTR) return Error{"waiting for " + argv[0] + ": " + std::strerror(errno)};
    const double t = since(started);
    if (!ending && (t > deadline_seconds || interrupted())) {
      end.kind = interrupted() ? JobEnd::Kind::kInterrupted : JobEnd::Kind::kDeadline;
      ::kill(-*pid, SIGTERM);
      ending = true;
      term_sent = t;
    } else if (ending && t - term_sent > 5.0) {
      ::kill(-*pid, SIGKILL);
    }
    if (tick && t - last_tick >= 1.0) {
      last_tick = t;
      tick(t);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (ending) ::kill(-*pid, SIGKILL);  // what the group still holds (mpirun's daemons, ranks)
  end.exit = exit_of(status);
  end.seconds = since(started);
  return end;
}

Result<std::pair<ProcessExit, std::string>> capture(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe(out) != 0) return Error{"cannot start " + argv[0] + ": pipe: " + std::strerror(errno)};
  // Both ends close on exec: the child's stdout is a dup2 of the write end, and a copy left
  // open would reach whatever the child leaves running (sbatch's job) and hold off the EOF.
  ::fcntl(out[0], F_SETFD, FD_CLOEXEC);
  ::fcntl(out[1], F_SETFD, FD_CLOEXEC);
  auto pid = start(argv, out[1], false, false);
  ::close(out[1]);
  if (!pid) {
    ::close(out[0]);
    return pid.error();
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n > 0) text.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) return Error{"waiting for " + argv[0] + ": " + std::strerror(errno)};
  }
  return std::make_pair(exit_of(status), text);
}

std::string tail_lines(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    kept.push_back(line);
    if (kept.size() > static_cast<std::size_t>(lines)) kept.erase(kept.begin());
  }
  std::string text;
  for (const auto& l : kept) text += (text.empty() ? "" : "\n") + l;
  return text;
}

}  // namespace trainplan::planner::tune_detail
