#include "trainplan/planner/launch.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Plan;
using costmodel::Result;

std::string shell_quote(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string("_@%+=:,./-").find(c) != std::string::npos;
  });
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

Result<std::vector<std::string>> split_shell_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;  // a word has begun (a quoted empty string is a word too)
  const auto end_word = [&] {
    if (in_word) words.push_back(word);
    word.clear();
    in_word = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      end_word();
    } else if (c == '\\') {
      if (i + 1 == text.size()) return Error{"\"" + text + "\": ends with a backslash (escape it as \\\\ or quote it)"};
      if (text[++i] != '\n') {
        word += text[i];
        in_word = true;
      }
    } else if (c == '\'') {
      const std::size_t close = text.find('\'', i + 1);
      if (close == std::string::npos) return Error{"\"" + text + "\": unbalanced single quote (the ' at character " + std::to_string(i + 1) + " is never closed)"};
      word += text.substr(i + 1, close - i - 1);
      in_word = true;
      i = close;
    } else if (c == '"') {
      const std::size_t open = i;
      for (++i;; ++i) {
        if (i >= text.size()) return Error{"\"" + text + "\": unbalanced double quote (the \" at character " + std::to_string(open + 1) + " is never closed)"};
        if (text[i] == '"') break;
        if (text[i] == '\\' && i + 1 < text.size() && std::string("\"\\$`\n").find(text[i + 1]) != std::string::npos) {
          if (text[++i] != '\n') word += text[i];
        } else {
          word += text[i];
        }
      }
      in_word = true;
    } else {
      word += c;
      in_word = true;
    }
  }
  end_word();
  return words;
}

namespace {

int gpus_per_node(const Plan& plan, const LaunchOptions& options) {
  return options.gpus_per_node.value_or(plan.cluster.gpus_per_node);
}

// "tinyllama-4x-zero2 (tinyllama-1.1b on dgx-h100, tp1 pp1 dp4 zero2)"
std::string plan_summary(const Plan& plan) {
  return (plan.name.empty() ? std::string("plan") : plan.name) + " (" + plan.model.name + " on " + plan.cluster.name + ", " +
         ParallelLayout::of(plan.parallel).text() + ")";
}

// The executor's command line after the launcher: EXECUTOR --plan ABS --steps S --measurement FILE [extra],
// every word quoted but `measurement`, which is inserted as written (it may hold a shell variable).
std::string executor_line(const std::string& plan_path, const LaunchOptions& options, const std::string& measurement) {
  std::string line = shell_quote(options.executor) + " --plan " + shell_quote(std::filesystem::absolute(plan_path).string()) +
                     " --steps " + std::to_string(options.steps) + " --measurement " + measurement;
  for (const std::string& word : options.extra_args) line += " " + shell_quote(word);
  return line;
}

// A value written into an #SBATCH line. sbatch reads those lines as its own arguments, splitting
// on white space and taking quotes and backslashes as quoting (slurm src/sbatch/opt.c), and a
// '#' after a blank starts a comment: a value holding any of them would reach SLURM as something
// else. Partition and account names are identifiers; a job name is kept to the same plain set.
Result<bool> check_sbatch_value(const char* flag, const std::string& value) {
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || std::strchr("._-+=:,@%/", c) != nullptr)) {
      return Error{std::string(flag) + ": \"" + value + "\" may hold only letters, digits and . _ - + = : , @ % / (sbatch reads its " +
                   "#SBATCH lines as arguments: white space, quotes, backslashes and # would change them)"};
    }
  }
  return true;
}

// NCCL and libfabric settings worth knowing for an inter-node network kind, as comment lines.
std::string network_hints(const std::string& kind) {
  std::ostringstream out;
  out << "# NCCL settings to consider (" << kind << " between nodes); uncomment what your cluster needs:\n";
  out << "# export NCCL_DEBUG=WARN                    # INFO prints the rings, trees and transports NCCL picks\n";
  out << "# export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # fail fast when a rank dies instead of hanging\n";
  out << "# export NCCL_SOCKET_IFNAME=eth0            # the interface for NCCL's bootstrap traffic\n";
  if (kind == "infiniband" || kind == "roce") {
    out << "# export NCCL_IB_HCA=mlx5                   # the InfiniBand/RoCE adapters to use\n";
    out << "# export NCCL_NET_GDR_LEVEL=PHB             # GPUDirect RDMA between NIC and GPU\n";
  }
  if (kind == "roce") out << "# export NCCL_IB_GID_INDEX=3                # RoCE v2 GID\n";
  if (kind == "efa") {
    out << "# export FI_PROVIDER=efa                    # libfabric over EFA (aws-ofi-nccl plugin)\n";
    out << "# export FI_EFA_USE_DEVICE_RDMA=1           # GPUDirect RDMA on p4d/p5\n";
  }
  return out.str();
}

}  // namespace

Result<bool> check_launch(const Plan& plan, const LaunchOptions& options) {
  const int per_node = gpus_per_node(plan, options);
  if (options.nodes < 1) return Error{"--nodes: must be >= 1 (got " + std::to_string(options.nodes) + ")"};
  if (per_node < 1) {
    return Error{options.gpus_per_node ? "--gpus-per-node: must be >= 1 (got " + std::to_string(per_node) + ")"
                                       : "the plan's cluster has gpus_per_node " + std::to_string(per_node) + "; give --gpus-per-node"};
  }
  if (options.steps < 1) return Error{"--steps: must be >= 1 (got " + std::to_string(options.steps) + ")"};
  if (options.cpus_per_task < 1) return Error{"--cpus-per-task: must be >= 1 (got " + std::to_string(options.cpus_per_task) + ")"};
  const long long given = static_cast<long long>(options.nodes) * per_node;
  if (given != plan.gpus) {
    const std::string gives = "--nodes " + std::to_string(options.nodes) + " gives " + std::to_string(given);
    if (plan.gpus % per_node == 0) {
      return Error{"plan needs " + std::to_string(plan.gpus) + " GPUs = " + count_text(plan.gpus / per_node, "node", "nodes") + " x " +
                   std::to_string(per_node) + " GPUs; " + gives};
    }
    const std::string source = options.gpus_per_node ? "--gpus-per-node " + std::to_string(per_node)
                                                     : "the cluster's " + std::to_string(per_node) + " GPUs per node";
    return Error{"plan needs " + std::to_string(plan.gpus) + " GPUs, not a whole number of nodes of " + std::to_string(per_node) +
                 " GPUs (" + source + " does not divide " + std::to_string(plan.gpus) + "); " + gives +
                 " (choose --nodes and --gpus-per-node with nodes x GPUs per node = " + std::to_string(plan.gpus) + ")"};
  }
  const std::pair<const char*, const std::string&> sbatch_values[] = {
      {"--partition", options.partition}, {"--account", options.account}, {"--job-name", options.job_name}, {"--time", options.time_limit}};
  for (const auto& [flag, value] : sbatch_values) {
    auto ok = check_sbatch_value(flag, value);
    if (!ok) return ok.error();
  }
  if (options.time_limit.find_first_not_of("0123456789:-") != std::string::npos) {
    return Error{"--time: \"" + options.time_limit + "\" is not a SLURM time (HH:MM:SS, or D-HH:MM:SS)"};
  }
  return true;
}

namespace {

// The limitations as shell comments, or nothing.
std::string limitation_comments(const Plan& plan) {
  const std::vector<std::string> problems = executor_limitations(plan);
  if (problems.empty()) return "";
  std::string out = "# WARNING: the executor cannot run this plan yet:\n";
  for (const auto& s : problems) out += "#   - " + s + "\n";
  return out;
}

}  // namespace

Result<std::string> slurm_script(const Plan& plan, const std::string& plan_path, const LaunchOptions& options) {
  auto ok = check_launch(plan, options);
  if (!ok) return ok.error();
  const int per_node = gpus_per_node(plan, options);
  std::ostringstream out;
  out << "#!/bin/bash\n";
  out << "# trainplan: " << plan_summary(plan) << "\n";
  out << limitation_comments(plan);
  out << "# " << count_text(options.nodes, "node", "nodes") << " x " << per_node << " GPUs = " << plan.gpus
      << " executor ranks, one per GPU. Submit with: sbatch THIS_FILE\n";
  if (!options.job_name.empty()) out << "#SBATCH --job-name=" << options.job_name << "\n";
  out << "#SBATCH --nodes=" << options.nodes << "\n";
  out << "#SBATCH --ntasks-per-node=" << per_node << "\n";
  out << "#SBATCH --gpus-per-node=" << per_node << "\n";
  out << "#SBATCH --cpus-per-task=" << options.cpus_per_task << "\n";
  out << "#SBATCH --exclusive\n";
  if (!options.partition.empty()) out << "#SBATCH --partition=" << options.partition << "\n";
  if (!options.account.empty()) out << "#SBATCH --account=" << options.account << "\n";
  if (!options.time_limit.empty()) out << "#SBATCH --time=" << options.time_limit << "\n";
  out << "\nset -euo pipefail\n\n";
  out << "# Rendezvous at the first node of the allocation. Each task is one rank: the executor reads\n";
  out << "# SLURM_PROCID (rank), SLURM_NTASKS (world size) and SLURM_LOCALID (its GPU on the node).\n";
  out << "export MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\"\n";
  out << "export MASTER_PORT=" << options.master_port << "\n\n";
  out << network_hints(plan.cluster.inter_node.kind) << "\n";
  out << "srun --kill-on-bad-exit=1 " << executor_line(plan_path, options, "\"measurement-${SLURM_JOB_ID}.json\"") << "\n\n";
  out << "# Then compare the run with the estimate:\n";
  out << "#   planner compare " << shell_quote(std::filesystem::absolute(plan_path).string()) << " measurement-JOBID.json\n";
  return out.str();
}

Result<std::string> torchrun_commands(const Plan& plan, const std::string& plan_path, const LaunchOptions& options) {
  auto ok = check_launch(plan, options);
  if (!ok) return ok.error();
  const int per_node = gpus_per_node(plan, options);
  std::ostringstream out;
  out << "# trainplan: " << plan_summary(plan) << "\n";
  out << limitation_comments(plan);
  out << "# " << count_text(options.nodes, "node", "nodes") << " x " << per_node << " GPUs = " << plan.gpus << " executor ranks, one per GPU.\n";
  if (options.nodes == 1) {
    out << "export MASTER_ADDR=localhost\n";
  } else {
    out << "# Run these two lines on each of the " << options.nodes << " nodes, with HOST replaced by the first node's host name\n";
    out << "# (the same on every node):\n";
    out << "export MASTER_ADDR=HOST\n";
  }
  out << "torchrun --nnodes " << options.nodes << " --nproc-per-node " << per_node << " --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:"
      << options.master_port << "\" --no-python " << executor_line(plan_path, options, shell_quote(default_measurement_file(plan_path)))
      << "\n";
  return out.str();
}

}  // namespace trainplan::planner
