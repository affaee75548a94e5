#pragma once
// Launching a fixed plan on a cluster: a SLURM batch script, or the torchrun command to run on
// every node, that starts the executor on exactly the plan's world size (one process per GPU).
// The texts are returned, not run.

#include <optional>
#include <string>
#include <vector>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::planner {

inline constexpr int kDefaultMasterPort = 29500;

struct LaunchOptions {
  // Nodes to run on. REQUIRES: nodes * gpus per node == the plan's gpus (checked).
  int nodes = 0;
  // GPUs (executor processes) per node. Default (none): the plan cluster's gpus_per_node.
  // REQUIRES: >= 1 when given (checked; 0 is refused, not read as "the default").
  std::optional<int> gpus_per_node;
  // Optimizer steps the executor runs. REQUIRES: >= 1.
  int steps = 50;
  // The executor as the nodes see it: a path, or a name on their PATH.
  std::string executor = "executor";
  // SLURM only: `#SBATCH --cpus-per-task`. REQUIRES: >= 1.
  int cpus_per_task = 8;
  // SLURM only, each written as an #SBATCH line when not empty. REQUIRES: no white space;
  // time_limit in SLURM's forms (digits, ':' and '-', e.g. 12:00:00 or 2-00:00:00).
  std::string partition, account, time_limit, job_name;
  // More executor arguments, one word each (split_shell_words splits `--extra` text into them);
  // each is shell-quoted onto the executor's command line, so it reaches the executor as one
  // literal argument whatever it holds (;, $(...), quotes, newlines).
  std::vector<std::string> extra_args;
  int master_port = kDefaultMasterPort;
};

// What keeps the executor from running a plan (the executor's own list, capabilities.hpp).
using executor::executor_limitations;

// Checks the options against the plan; the error says what the plan needs:
// "plan needs 64 GPUs = 8 nodes x 8 GPUs; --nodes 4 gives 32".
[[nodiscard]] costmodel::Result<bool> check_launch(const costmodel::Plan& plan, const LaunchOptions& options);

// A bash script for sbatch (with executor_limitations(plan) as comments at the top when
// there are any): #SBATCH lines (nodes, one task and one GPU per GPU, exclusive nodes,
// and the optional partition, account, time and job name), MASTER_ADDR (first node of the
// allocation) and MASTER_PORT, NCCL hints for the cluster's network as comments, and
// `srun EXECUTOR --plan ABS_PLAN --steps S --measurement measurement-$SLURM_JOB_ID.json`.
// `plan_path` is made absolute. Errors as check_launch.
[[nodiscard]] costmodel::Result<std::string> slurm_script(const costmodel::Plan& plan, const std::string& plan_path,
                                                          const LaunchOptions& options);

// The same run without SLURM (limitations as above): comments and the one torchrun command (c10d rendezvous at
// $MASTER_ADDR:port) to start on each node. Errors as check_launch.
[[nodiscard]] costmodel::Result<std::string> torchrun_commands(const costmodel::Plan& plan, const std::string& plan_path,
                                                               const LaunchOptions& options);

// Splits `text` into words by the POSIX shell's quoting rules, without any expansion: blanks
// (space, tab, newline) separate words; '...' keeps everything literally; "..." keeps everything
// but lets a backslash escape " \ $ ` and newline; a backslash outside quotes keeps the next
// character (backslash-newline joins lines). $, `, ;, |, &, *, # and the like are ordinary
// characters. An unclosed quote or a trailing backslash is an error naming it.
// split_shell_words("--note 'a b' x\\ y") == {"--note", "a b", "x y"}.
[[nodiscard]] costmodel::Result<std::vector<std::string>> split_shell_words(const std::string& text);

// `word` as one POSIX shell word: unchanged when it is made of safe characters
// (letters, digits, and _ @ % + = : , . / -), else single-quoted.
[[nodiscard]] std::string shell_quote(const std::string& word);

}  // namespace trainplan::planner
