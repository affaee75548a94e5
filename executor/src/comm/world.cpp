// The ranks of this job (see world.hpp).

#include "world.hpp"

#include <cstdlib>

#include "cpu_memory.hpp"
#include "gpu.hpp"

namespace trainplan::executor {

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return std::stoi(v);
  }
  return fallback;
}

int launcher_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}, 0); }

World make_world(const std::string& device, int timeout_seconds) {
  World w;
  const CommOptions comm_options{std::chrono::seconds(timeout_seconds)};
  const bool want_cuda = device == "cuda" || (device == "auto" && cuda_present());
  if (device == "cuda" && !cuda_present()) throw WorldError("--device cuda: no CUDA device is visible to this process");
  if (device != "auto" && device != "cpu" && device != "cuda") throw WorldError("--device: expected auto, cpu or cuda, got \"" + device + "\"");

  int gpu = 0;  // this rank's CUDA device index
  if (launched_by_mpi()) {
    w.local_rank = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0);
    w.local_size = env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}, 1);
    // The rank's GPU before MPI_Init: a CUDA-aware MPI (UCX) would otherwise make a context on
    // GPU 0 in every rank.
    if (want_cuda) gpu = cuda_set_device(w.local_rank);
    w.bootstrap = make_mpi_communicator(comm_options);
    if (want_cuda) {
      w.comm = w.bootstrap->size() > 1 ? make_nccl_communicator(w.bootstrap->rank(), w.bootstrap->size(), w.bootstrap.get(), comm_options)
                                       : make_self_communicator();
    } else {
      w.comm = std::move(w.bootstrap);
    }
  } else {
    const int size = env_int({"WORLD_SIZE", "SLURM_NTASKS"}, 1);
    const int rank = env_int({"RANK", "SLURM_PROCID"}, 0);
    w.local_rank = env_int({"LOCAL_RANK", "SLURM_LOCALID"}, 0);
    w.local_size = env_int({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, 1);
    if (size > 1 && !want_cuda) {
      throw WorldError("WORLD_SIZE=" + std::to_string(size) + " on CPU: CPU ranks communicate through MPI; start them with mpirun (or srun --mpi=pmix)");
    }
    if (want_cuda) gpu = cuda_set_device(w.local_rank);
    w.comm = size > 1 ? make_nccl_communicator(rank, size, nullptr, comm_options) : make_self_communicator();
  }
  if (want_cuda) {
    w.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(gpu));
    w.device_name = cuda_device_name();
  } else {
    install_cpu_memory_counter();  // before the model exists: its tensors count (cpu_memory.hpp)
  }
  return w;
}

}  // namespace trainplan::executor
