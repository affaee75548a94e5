#pragma once
// The planner app's subcommands and the helpers its option parsing shares (app/commands.cpp);
// app/main.cpp defines the command line and dispatches to these. Each command prints what it
// made and returns the process's exit code: 0 success, 1 no plan fits, 2 bad input, 3 the run
// failed.

#include <string>
#include <vector>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/planner/launch.hpp"
#include "trainplan/planner/local_run.hpp"
#include "trainplan/planner/profile_run.hpp"
#include "trainplan/planner/report.hpp"
#include "trainplan/planner/tune.hpp"

namespace trainplan::planner_app {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

inline constexpr int kExitNoFit = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitRunFailed = 3;

int fail(const std::string& message);
pl::Format parse_format(const std::string& s);
bool write_file(const std::string& path, const std::string& text, std::string& error);
std::string apply_fix(const std::string& fix, cm::ParallelConstraints& c);
std::string canonical_fix_key(const std::string& key);
bool same_fix(const std::string& a, const std::string& b);
std::string join_args(int argc, char** argv);
int list_models();
int list_hardware();
int compare_files(const std::string& estimate_file, const std::string& measurement_file, pl::Format format);
int write_chrome_trace(const std::string& measurement_file);
int launch_plan(const std::string& plan_file, const pl::LaunchOptions& options, bool slurm);
int export_plan(const std::string& plan_file, const std::string& target_name, const std::string& out);
int run_plan(const std::string& plan_file, pl::LocalRunOptions options, const pl::ExecutorSearch& search,
             const std::string& measurement_file, pl::Format format);
int import_profile(const std::vector<std::string>& csv_files, const std::string& base_name, const std::string& name,
                   const std::string& source, const std::string& out);
int validate(const std::vector<std::string>& measurement_files, pl::Format format);
int calibrate_profile(const std::vector<std::string>& files, const std::string& base_name, const std::string& out, pl::Format format);
int measure_profile(pl::ProfileRunOptions options, const pl::ExecutorSearch& search);
std::string environment(const char* name);
// `planner tune`: exit 0 with a choice, 3 when no candidate measured, 130 when interrupted
// (--resume goes on), 2 for bad input.
int tune_plans(const cm::PlanRequest& request, pl::TuneOptions options, const pl::ExecutorSearch& search);

}  // namespace trainplan::planner_app
