#pragma once
// Collective communication for the executor: a small Communicator interface (sum all-reduce,
// reduce-scatter, all-gather, all-to-all, broadcast, send/receive, split into sub-groups) with three engines: MPI (CPU
// tensors), NCCL (CUDA tensors) and a single-rank one. Every collective is asynchronous and
// returns a Work whose wait() rethrows a failure; a wait that exceeds the communicator's timeout
// throws CommError naming the collective and the group, so a dead peer never hangs the run.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace trainplan::executor {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective completed. Throws CommError on failure or timeout.
  virtual void wait() = 0;
  // Orders the work the caller queues next on its device stream after this work, without
  // blocking the host (GPU timing: an event recorded next measures the work's end). Nothing to do
  // where work completes on the host (MPI, one rank). wait() is still owed.
  virtual void order_current_stream() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  // Group name for messages ("world", "dp", "shard", "replica").
  [[nodiscard]] virtual const std::string& name() const = 0;

  // In place: tensor = sum over ranks. REQUIRES: contiguous; not touched until wait() returns.
  [[nodiscard]] virtual std::unique_ptr<Work> all_reduce_sum(const at::Tensor& tensor) = 0;
  // output (n elements) = sum over ranks of input chunk rank() (input has size()*n elements).
  [[nodiscard]] virtual std::unique_ptr<Work> reduce_scatter_sum(const at::Tensor& input, const at::Tensor& output) = 0;
  // output (size()*n elements) = concatenation of every rank's input (n elements).
  [[nodiscard]] virtual std::unique_ptr<Work> all_gather(const at::Tensor& input, const at::Tensor& output) = 0;
  // Every rank sends send_counts[j] elements of `input` (in rank order) to rank j and receives
  // recv_counts[i] elements from rank i into `output` (in rank order): MPI_Alltoallv; NCCL's
  // grouped sends and receives. Counts are elements, one per rank; a rank's recv_counts[i] equals
  // rank i's send_counts[rank()]. The mixture of experts' token dispatch and combine.
  // REQUIRES: contiguous, same dtype; input has sum(send_counts) and output sum(recv_counts) elements.
  [[nodiscard]] virtual std::unique_ptr<Work> all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                                                         const at::Tensor& output, const std::vector<int64_t>& recv_counts) = 0;
  // Point-to-point (pipeline activations and gradients). `tag` tells messages between the same
  // two ranks apart where the engine supports it (MPI); NCCL matches sends and receives in
  // order. A send completes only once the peer has posted the matching receive, in every engine
  // (NCCL's rule; MPI uses synchronous-mode sends), so an ordering that deadlocks on GPUs
  // deadlocks on CPU ranks too. REQUIRES: contiguous; not touched until wait() returns; peer != rank().
  [[nodiscard]] virtual std::unique_ptr<Work> send(const at::Tensor& tensor, int peer, int tag) = 0;
  [[nodiscard]] virtual std::unique_ptr<Work> recv(const at::Tensor& tensor, int peer, int tag) = 0;
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // Every rank's string, in rank order (small control messages: checkpoint manifests, errors).
  [[nodiscard]] virtual std::vector<std::string> all_gather_strings(const std::string& value) = 0;
  // The ranks with equal `color` form a new group, ordered by `key` (MPI_Comm_split semantics).
  // A rank with a negative color joins no group and gets null (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR).
  [[nodiscard]] virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
  // Ends every rank of the job at once (MPI_Abort / process exit); used after a fatal error.
  [[noreturn]] virtual void abort(int exit_code) = 0;
  // Where this engine's tensors live: scratch tensors (scalars, received checkpoint pieces) are
  // made here. CPU for MPI and the self group, the current CUDA device for NCCL.
  [[nodiscard]] virtual at::Device device() const { return at::Device(at::kCPU); }
};

// `t` as a reduction takes it: MPI reduces float32/float64 only, so reduced-precision CPU tensors
// travel as float32; others as they are (contiguous).
[[nodiscard]] at::Tensor reducible(const at::Tensor& t);

// Sum over ranks of a double (loss, norms, flags) through `comm`.
[[nodiscard]] double all_reduce_scalar(Communicator& comm, double value);

struct CommOptions {
  std::chrono::seconds timeout{300};  // Default: 300 s. A collective waiting longer fails.
};

// A one-rank group: collectives are local copies.
[[nodiscard]] std::unique_ptr<Communicator> make_self_communicator(const std::string& name = "world");

// `inner`, counting into `*sent` the bytes this rank sends in its tensor collectives (and in the
// groups split from it), as the ring algorithms move them: all-reduce 2 (n-1)/n of the buffer,
// reduce-scatter (n-1)/n of the input, all-gather (n-1)/n of the output, an all-to-all what it
// sends to other ranks, a send all of it (the
// convention of the cost model's communication volume). Tensors count at the element size they
// are handed over in (on CPU, MPI reduces 16-bit tensors as float32). Control traffic (broadcast,
// strings, barriers) is not counted.
[[nodiscard]] std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner,
                                                                       std::shared_ptr<std::atomic<double>> sent);

// True when the executor was built with MPI.
[[nodiscard]] bool mpi_available();
// True when MPI was initialised with MPI_THREAD_MULTIPLE (calls from several threads at once).
[[nodiscard]] bool mpi_thread_multiple();
// True when this process was started by an MPI launcher (mpirun, srun with PMI).
[[nodiscard]] bool launched_by_mpi();
// MPI_COMM_WORLD. Initialises MPI on first use. REQUIRES: mpi_available().
[[nodiscard]] std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options);
void finalize_mpi();

// True when the executor was built with CUDA/NCCL support.
[[nodiscard]] bool nccl_available();
// The run failed on this rank (out of memory, an error it reports and leaves on): from now on the
// NCCL engine aborts its communicators instead of destroying them (a destroy waits for kernels
// that peers may never complete). Nothing to do for MPI, whose communicators free locally.
void mark_communication_failed();
// NCCL over all ranks; the unique id travels through `bootstrap` (rank 0 broadcasts it) or, when
// bootstrap is null, through a c10d::TCPStore at MASTER_ADDR:MASTER_PORT. REQUIRES: the current
// CUDA device is set.
[[nodiscard]] std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, Communicator* bootstrap,
                                                                   const CommOptions& options);

}  // namespace trainplan::executor
