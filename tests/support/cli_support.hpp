#pragma once
// Test helpers for the planner command line run as a process: a fixture with a fresh temporary
// folder per test, and `run`, which returns the exit code with stdout and stderr kept apart.
// Paths are absolute (TRAINPLAN_PLANNER_BIN, the temporary folder), so no test depends on the
// working directory.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace trainplan::testing {

struct Outcome {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
  [[nodiscard]] std::string all() const { return out + err; }
};

// `s` as one single-quoted shell word.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Expects the one-line error a planner run prints for bad input: exit code 2, nothing on stdout,
// "planner: error: " and `fragment` on one line of stderr.
inline void expect_bad_input(const Outcome& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n') << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_EQ(r.err.rfind("planner: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << "no \"" << fragment << "\" in: " << r.err;
}

// One bad command line and a part of the one-line message it must give.
struct BadInput {
  const char* what;      // for the trace when it fails
  std::string args;      // as for PlannerCliTest::run
  std::string fragment;  // expected in the message
};

class PlannerCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("trainplan_cli_test_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `prefix planner args` in a shell (args already quoted where needed); `prefix` may set the
  // scene, e.g. "cd DIR && " or "env -u VAR ".
  Outcome run(const std::string& args, const std::string& prefix = "") const {
    const std::filesystem::path err_file = dir_ / "stderr.txt";
    const std::string command = prefix + quote(TRAINPLAN_PLANNER_BIN) + " " + args + " 2>" + quote(err_file.string());
    Outcome r;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) throw std::runtime_error("popen failed: " + command);
    char buffer[4096];
    std::size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.out.append(buffer, n);
    const int status = ::pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(err_file);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    return r;
  }

  // Runs each case; each must exit 2 with a one-line message holding its fragment.
  void expect_bad_inputs(const std::vector<BadInput>& cases) const {
    for (const BadInput& c : cases) {
      SCOPED_TRACE(c.what);
      expect_bad_input(run(c.args), c.fragment);
    }
  }

  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  std::filesystem::path dir_;
};

}  // namespace trainplan::testing
