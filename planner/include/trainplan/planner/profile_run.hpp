#pragma once
// `planner profile` without --from-csv: the command that runs the executor's microbenchmarks on
// this machine's device (`executor --profile OUT`, under mpirun when several ranks measure the
// collectives too), and the summary printed of the profile it wrote.

#include <string>
#include <vector>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

struct ProfileRunOptions {
  std::string executor;          // REQUIRES: not empty (find_executor)
  std::string mpirun = "mpirun"; // path, or a name on PATH; used when ranks > 1
  std::string out;               // the profile the executor writes; passed on as an absolute path
  std::string device = "auto";   // auto | cpu | cuda
  std::string base;              // cluster preset or hwprofile file the measured tables go into; empty: the executor's default
  std::string name;              // name of the new profile; empty: the executor's default
  std::string command;           // the command line recorded in the tables' source; empty: the executor's
  int ranks = 1;                 // > 1: ranks under mpirun, collectives measured; at most the base's GPUs per node
  int threads = 0;               // CPU threads for the kernels; 0: the executor's default (every core)
  bool quick = false;            // the executor's shorter sweep
  bool allow_run_as_root = false;  // Open MPI refuses to run as root without --allow-run-as-root
};

// Checks device, ranks (1 to `gpus_per_node`, the base profile's), threads (0 to 1024) and that
// `out` is given.
[[nodiscard]] costmodel::Result<bool> check_profile_run(const ProfileRunOptions& options, int gpus_per_node);

// ranks == 1: EXECUTOR --profile OUT --device D [--base B] [--name N] [--command C] [--threads T] [--quick]
// ranks > 1:  mpirun --oversubscribe -n RANKS [--allow-run-as-root] --mca btl_vader_single_copy_mechanism none
//             EXECUTOR ... (as above)
// One word per element; no shell is involved. REQUIRES: check_profile_run passed.
[[nodiscard]] std::vector<std::string> profile_command(const ProfileRunOptions& options);

// A few lines for people: the device, rows per table, median and best GEMM TFLOP/s, attention
// TFLOP/s, copy and AdamW GB/s, the kernel latency, and the collectives' bus bandwidths when
// measured.
[[nodiscard]] std::string profile_summary(const costmodel::HardwareProfile& profile);

}  // namespace trainplan::planner
