#pragma once
// The ranks of this job, from the launcher's environment (mpirun, torchrun, SLURM, or a single
// process), and the communicator and device each rank uses. Shared by training and profiling.

#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm.hpp"

namespace trainplan::executor {

// Bad input: a device that is not there, or a launcher environment the executor cannot use.
struct WorldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct World {
  std::unique_ptr<Communicator> bootstrap;  // MPI, when launched by MPI and the ranks are GPUs
  std::unique_ptr<Communicator> comm;       // what the ranks use (MPI, NCCL or self)
  int local_rank = 0, local_size = 1;
  at::Device device = at::kCPU;
  std::string device_name = "cpu";
};

// The first of the environment variables `names` that is set, as an integer, else `fallback`.
[[nodiscard]] int env_int(std::initializer_list<const char*> names, int fallback);

// This process's rank as its launcher set it (mpirun, torchrun, SLURM); 0 for a single process.
// For messages before the communicator exists.
[[nodiscard]] int launcher_rank();

// `device`: "auto" (cuda when present), "cpu" or "cuda". CPU ranks talk over MPI (started by
// mpirun); GPU ranks over NCCL, bootstrapped through MPI or torchrun's MASTER_ADDR/PORT.
// Throws WorldError for bad input, CommError when the communicator cannot be set up.
[[nodiscard]] World make_world(const std::string& device, int timeout_seconds);

}  // namespace trainplan::executor
