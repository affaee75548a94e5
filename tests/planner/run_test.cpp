// Running a plan locally: the mpirun command line, where the executor is found, how a child
// process's end is reported, and `planner run` end to end with a fake mpirun (drops its own
// options, execs the rest) and a fake executor (prints step lines, writes a measurement).

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/planner/local_run.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using testing::quote;

const std::string kPlanFile = testing::data_path("tinyllama-4x-zero2.plan.json");
const std::string kMeasurementFile = testing::data_path("tinyllama-4x-zero2.measurement.json");

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void write_executable(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  fs::permissions(path, fs::perms::owner_all, fs::perm_options::add);
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

costmodel::Plan tinyllama_plan() {
  auto plan = planner::load_fixed_plan(kPlanFile);
  if (!plan) throw std::runtime_error(plan.error().message);
  return *plan;
}

TEST(MpirunCommand, RunsThePlansWorldSizeOnCpuRanks) {
  planner::LocalRunOptions o;
  o.executor = "/build/executor/executor";
  o.plan_path = "/plans/tiny.json";
  o.measurement_path = "/runs/tiny.measurement.json";
  o.steps = 5;
  o.extra_args = {"--seed", "7"};
  const std::vector<std::string> expected = {"mpirun", "--oversubscribe", "-n", "4", "--mca", "btl_vader_single_copy_mechanism", "none",
                                             "/build/executor/executor", "--plan", "/plans/tiny.json", "--steps", "5", "--device", "cpu",
                                             "--measurement", "/runs/tiny.measurement.json", "--seed", "7"};
  EXPECT_EQ(planner::mpirun_command(tinyllama_plan(), o), expected);
  o.allow_run_as_root = true;
  std::vector<std::string> as_root = expected;
  as_root.insert(as_root.begin() + 4, "--allow-run-as-root");
  EXPECT_EQ(planner::mpirun_command(tinyllama_plan(), o), as_root);
}

TEST(LocalRunCheck, RanksMayOnlyConfirmTheWorldSize) {
  planner::LocalRunOptions o;
  o.ranks = 4;
  EXPECT_TRUE(planner::check_local_run(tinyllama_plan(), o).ok());
  o.ranks = 2;
  auto wrong = planner::check_local_run(tinyllama_plan(), o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().message, "--ranks 2: the plan runs on 4 ranks (its gpus); the executor runs exactly the plan's world size");
}

class FindExecutor : public testing::PlannerCliTest {
 protected:
  // A build tree: build/planner/ (the planner's folder) and, when built, build/executor/executor.
  fs::path planner_dir() const { return dir_ / "build" / "planner"; }
  fs::path built() const { return dir_ / "build" / "executor" / "executor"; }
};

TEST_F(FindExecutor, LooksAtTheFlagTheEnvironmentTheBuildAndPathInThatOrder) {
  const fs::path given = dir_ / "given" / "executor", from_env = dir_ / "env" / "executor", on_path = dir_ / "bin" / "executor";
  for (const auto& p : {given, from_env, built(), on_path}) write_executable(p, "#!/bin/sh\n");
  fs::create_directories(planner_dir());
  planner::ExecutorSearch search{given.string(), from_env.string(), planner_dir().string(), (dir_ / "bin").string()};
  EXPECT_EQ(planner::find_executor(search).value(), given.string());
  search.given.clear();
  EXPECT_EQ(planner::find_executor(search).value(), from_env.string());
  search.environment.clear();
  EXPECT_EQ(planner::find_executor(search).value(), built().string());
  fs::remove(built());
  EXPECT_EQ(planner::find_executor(search).value(), on_path.string());
}

TEST_F(FindExecutor, NoneFoundSaysTheExecutorWasNotBuilt) {
  fs::create_directories(planner_dir());
  auto none = planner::find_executor({"", "", planner_dir().string(), (dir_ / "bin").string()});
  ASSERT_FALSE(none.ok());
  const std::string& m = none.error().message;
  EXPECT_EQ(m.rfind("the executor was not built: it needs LibTorch (`scripts/setup.sh test` builds it)", 0), 0u) << m;
  EXPECT_TRUE(contains(m, built().string())) << m;
}

TEST_F(FindExecutor, AGivenPathThatIsNoExecutableIsAnError) {
  const fs::path not_executable = write("executor", "not a program");
  auto missing = planner::find_executor({(dir_ / "nope").string(), "", "", ""});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "--executor " + (dir_ / "nope").string() + ": no such executable file");
  EXPECT_FALSE(planner::find_executor({not_executable.string(), "", "", ""}).ok());
  auto from_env = planner::find_executor({"", (dir_ / "nope").string(), "", ""});
  ASSERT_FALSE(from_env.ok());
  EXPECT_EQ(from_env.error().message, "TRAINPLAN_EXECUTOR=" + (dir_ / "nope").string() + ": no such executable file");
}

TEST_F(FindExecutor, LaunchScriptsNameTheGivenExecutorAsWritten) {
  EXPECT_EQ(planner::executor_for_launch({"/cluster/bin/executor", "", "", ""}), "/cluster/bin/executor");
  EXPECT_EQ(planner::executor_for_launch({"", "", planner_dir().string(), ""}), "executor");
  write_executable(built(), "#!/bin/sh\n");
  EXPECT_EQ(planner::executor_for_launch({"", "", planner_dir().string(), ""}), built().string());
}

TEST(RunProcess, ReportsTheExitStatusOrTheSignal) {
  auto three = planner::run_process({"/bin/sh", "-c", "exit 3"});
  ASSERT_TRUE(three.ok()) << three.error().message;
  EXPECT_EQ(three->code, 3);
  EXPECT_FALSE(three->success());
  EXPECT_EQ(three->text(), "exited with status 3");

  auto killed = planner::run_process({"/bin/sh", "-c", "kill -9 $$"});
  ASSERT_TRUE(killed.ok()) << killed.error().message;
  EXPECT_EQ(killed->signal, 9);
  EXPECT_EQ(killed->text(), "was killed by signal 9 (Killed)");

  auto ok = planner::run_process({"/bin/sh", "-c", "exit 0"});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->success());
}

TEST(RunProcess, AProgramThatCannotStartIsAnError) {
  auto missing = planner::run_process({"/nonexistent/mpirun", "-n", "4"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "cannot run /nonexistent/mpirun: No such file or directory");
}

TEST(RunProcess, PassesArgumentsWithoutAShell) {
  // A word with shell syntax arrives as one argument, unexpanded.
  auto r = planner::run_process({"/bin/sh", "-c", "[ \"$1\" = '$(exit 9); x' ] && [ $# -eq 1 ]", "sh", "$(exit 9); x"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->success()) << r->text();
}

// `planner run` with fakes: mpirun records its arguments to mpirun-args.txt, drops its own
// options and execs the executor; the executor prints step lines, copies the test measurement to
// the path after --measurement (unless FAKE_NO_MEASUREMENT is set) and exits with $FAKE_EXIT.
class RunCli : public testing::PlannerCliTest {
 protected:
  void SetUp() override {
    PlannerCliTest::SetUp();
    write_executable(mpirun(), R"(#!/bin/sh
printf '%s\n' "$@" > "$(dirname "$0")/mpirun-args.txt"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) shift 2 ;;
    --mca) shift 3 ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec "$@"
)");
    write_executable(executor(), R"(#!/bin/sh
out=""
previous=""
for arg in "$@"; do
  [ "$previous" = "--measurement" ] && out="$arg"
  previous="$arg"
done
echo "fake executor: step 1 loss 10.4"
echo "fake executor: step 2 loss 10.1"
[ -n "${FAKE_NO_MEASUREMENT:-}" ] || cp )" + quote(kMeasurementFile) + R"( "$out"
exit "${FAKE_EXIT:-0}"
)");
  }

  fs::path mpirun() const { return dir_ / "fake" / "mpirun"; }
  fs::path executor() const { return dir_ / "fake" / "executor"; }
  std::string fakes() const { return " --mpirun " + quote(mpirun().string()) + " --executor " + quote(executor().string()); }
};

TEST_F(RunCli, RunsTheExecutorUnderMpirunAndPrintsTheComparison) {
  const fs::path measurement = dir_ / "out" / "m.json";
  fs::create_directories(measurement.parent_path());
  const auto r = run("run " + quote(kPlanFile) + " --steps 3 --measurement " + quote(measurement.string()) + fakes() + " -- --seed 7");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  // The executor's output streams through before the report.
  EXPECT_EQ(r.out.rfind("fake executor: step 1 loss 10.4\nfake executor: step 2 loss 10.1\n", 0), 0u) << r.out;
  EXPECT_TRUE(contains(r.out, "trainplan comparison")) << r.out;
  const auto weights = r.out.find("\n  weights ");
  ASSERT_NE(weights, std::string::npos) << r.out;
  EXPECT_TRUE(contains(r.out.substr(weights, r.out.find('\n', weights + 1) - weights), "+100.0%")) << r.out;

  std::vector<std::string> expected = {"--oversubscribe", "-n", "4", "--mca", "btl_vader_single_copy_mechanism", "none",
                                       executor().string(), "--plan", kPlanFile, "--steps", "3", "--device", "cpu",
                                       "--measurement", measurement.string(), "--seed", "7"};
  if (::geteuid() == 0) expected.insert(expected.begin() + 3, "--allow-run-as-root");
  EXPECT_EQ(read_lines(dir_ / "fake" / "mpirun-args.txt"), expected);
  EXPECT_TRUE(contains(r.err, "planner: running: " + mpirun().string() + " --oversubscribe -n 4")) << r.err;
}

TEST_F(RunCli, MeasurementDefaultsToThePlanStemInTheWorkingDirectory) {
  const fs::path plan = dir_ / "tiny.json";
  fs::copy_file(kPlanFile, plan);
  const auto r = run("run tiny.json" + fakes(), "cd " + quote(dir_.string()) + " && ");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(fs::exists(dir_ / "tiny.measurement.json"));
  const auto args = read_lines(dir_ / "fake" / "mpirun-args.txt");
  ASSERT_GE(args.size(), 2u);
  EXPECT_EQ(args.back(), (dir_ / "tiny.measurement.json").string());
  EXPECT_EQ(args[args.size() - 2], "--measurement");
}

TEST_F(RunCli, AFailingExecutorMakesRunFailNamingTheStatus) {
  const fs::path measurement = dir_ / "m.json";
  const auto r = run("run " + quote(kPlanFile) + " --measurement " + quote(measurement.string()) + fakes(), "FAKE_EXIT=3 ");
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_TRUE(contains(r.err, "planner: error: " + mpirun().string() + " exited with status 3: the run of " + kPlanFile + " failed"))
      << r.err;
  EXPECT_TRUE(contains(r.out, "fake executor: step 1")) << r.out;
  EXPECT_FALSE(contains(r.out, "trainplan comparison")) << r.out;
}

// The executor's exit 2 is bad input (arguments after --, the plan), not a failed run: exit 2.
TEST_F(RunCli, AnExecutorThatRefusesItsInputMakesRunExitTwo) {
  const fs::path measurement = dir_ / "m.json";
  const auto r = run("run " + quote(kPlanFile) + " --measurement " + quote(measurement.string()) + fakes(), "FAKE_EXIT=2 ");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, "planner: error: " + mpirun().string() + " exited with status 2: the executor refused its input")) << r.err;
}

TEST_F(RunCli, SuccessWithoutAMeasurementIsAnError) {
  const fs::path measurement = dir_ / "m.json";
  const auto r = run("run " + quote(kPlanFile) + " --measurement " + quote(measurement.string()) + fakes(), "FAKE_NO_MEASUREMENT=1 ");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, measurement.string() + ": the run succeeded but wrote no measurement there")) << r.err;
}

TEST_F(RunCli, AStaleMeasurementIsNotCompared) {
  const fs::path measurement = dir_ / "m.json";
  fs::copy_file(kMeasurementFile, measurement);
  const auto r = run("run " + quote(kPlanFile) + " --measurement " + quote(measurement.string()) + fakes(), "FAKE_NO_MEASUREMENT=1 ");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, measurement.string() + ": the run succeeded but did not rewrite this measurement")) << r.err;
}

TEST_F(RunCli, BadInputExitsTwo) {
  const std::string plan = quote(kPlanFile);
  const std::string request = testing::source_path("samples/plans/llama3-70b-64xh100-auto.json");
  expect_bad_inputs({
      {"ranks differ from the plan's", "run " + plan + " --ranks 3" + fakes(), kPlanFile + ": --ranks 3: the plan runs on 4 ranks"},
      {"no such executor", "run " + plan + " --mpirun " + quote(mpirun().string()) + " --executor " + quote((dir_ / "nope").string()),
       "--executor " + (dir_ / "nope").string() + ": no such executable file"},
      {"a plan request", "run " + quote(request) + fakes(), request + ": /parallel: tp, pp, dp"},
      {"missing plan", "run " + quote((dir_ / "nope.json").string()) + fakes(), (dir_ / "nope.json").string() + ": cannot open file"},
  });
}

TEST_F(RunCli, MissingMpirunExitsTwoSayingWhereToGetIt) {
  const fs::path nompi = dir_ / "nompi";
  const auto r = run("run " + quote(kPlanFile) + " --executor " + quote(executor().string()) + " --mpirun " + quote(nompi.string()));
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, "planner: error: cannot run " + nompi.string() + ": No such file or directory (mpirun comes with Open MPI"))
      << r.err;
}

}  // namespace
}  // namespace trainplan
