// Stand-ins for the engines a build leaves out (TRAINPLAN_EXECUTOR_MPI / _NCCL off): they report
// that the engine is missing instead of failing to link.

#include "comm.hpp"

namespace trainplan::executor {

#ifndef TRAINPLAN_HAVE_MPI
bool mpi_available() { return false; }
bool mpi_thread_multiple() { return false; }
bool launched_by_mpi() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions&) {
  throw CommError("this executor was built without MPI (install libopenmpi-dev and rebuild)");
}
void finalize_mpi() {}
#endif

#ifndef TRAINPLAN_HAVE_NCCL
bool nccl_available() { return false; }
void mark_communication_failed() {}
std::unique_ptr<Communicator> make_nccl_communicator(int, int, Communicator*, const CommOptions&) {
  throw CommError("this executor was built without CUDA/NCCL (LibTorch without CUDA)");
}
#endif

}  // namespace trainplan::executor
