// The MPI engine: CPU tensors, non-blocking MPI-3 collectives, waits with a deadline.

#include <mpi.h>

#include <cstdlib>
#include <atomic>
#include <thread>

#include "comm.hpp"

namespace trainplan::executor {
namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw CommError(what + " failed: " + mpi_error(code));
}

MPI_Datatype reduce_type(const at::Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    default: throw CommError(what + ": MPI reductions need float32, float64 or int64 tensors, got " +
                             std::string(c10::toString(t.scalar_type())));
  }
}

void require_cpu(const at::Tensor& t, const std::string& what) {
  if (!t.device().is_cpu()) throw CommError(what + ": the MPI engine takes CPU tensors (use NCCL for CUDA)");
  if (!t.is_contiguous()) throw CommError(what + ": tensor must be contiguous");
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, std::string what, std::chrono::seconds timeout)
      : request_(request), what_(std::move(what)), timeout_(timeout) {}
  ~MpiWork() override {
    // A collective must complete before its buffers go away; abandoning it is a programmer error.
    if (request_ != MPI_REQUEST_NULL) {
      try { wait(); } catch (...) {}
    }
  }
  void wait() override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    int spins = 0;
    while (true) {
      int done = 0;
      check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), what_);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        request_ = MPI_REQUEST_NULL;  // abandoned: the run is about to abort
        throw CommError(what_ + " did not complete within " + std::to_string(timeout_.count()) +
                        " s: a peer rank has probably died or hangs");
      }
      if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  MPI_Request request_;
  std::string what_;
  std::chrono::seconds timeout_;
};

// A Work that keeps arrays the pending call reads (Ialltoallv's counts and displacements).
class MpiArraysWork final : public Work {
 public:
  MpiArraysWork(std::unique_ptr<Work> inner, std::vector<int> a, std::vector<int> b, std::vector<int> c, std::vector<int> d)
      : inner_(std::move(inner)), arrays_{std::move(a), std::move(b), std::move(c), std::move(d)} {}
  void wait() override { inner_->wait(); }

 private:
  std::unique_ptr<Work> inner_;  // destroyed (waited for) before the arrays
  std::vector<int> arrays_[4];
};

class MpiCommunicator final : public Communicator {
  static constexpr int kMaxTag = 32767;  // the least MPI_TAG_UB the standard allows

 public:
  MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options)
      : comm_(comm), name_(std::move(name)), options_(options) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::unique_ptr<Work> all_reduce_sum(const at::Tensor& t) override {
    const std::string what = label("all-reduce", t.numel());
    require_cpu(t, what);
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count(t.numel(), what), reduce_type(t, what), MPI_SUM, comm_, &r), what);
    return work(r, what);
  }
  std::unique_ptr<Work> reduce_scatter_sum(const at::Tensor& in, const at::Tensor& out) override {
    const std::string what = label("reduce-scatter", in.numel());
    require_cpu(in, what);
    require_cpu(out, what);
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type()) {
      throw CommError(what + ": input must hold size() x output elements of the same dtype");
    }
    MPI_Request r;
    check(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out.numel(), what), reduce_type(in, what), MPI_SUM,
                                    comm_, &r),
          what);
    return work(r, what);
  }
  std::unique_ptr<Work> all_gather(const at::Tensor& in, const at::Tensor& out) override {
    const std::string what = label("all-gather", out.numel());
    require_cpu(in, what);
    require_cpu(out, what);
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type()) {
      throw CommError(what + ": output must hold size() x input elements of the same dtype");
    }
    MPI_Request r;
    const int bytes = count(in.numel() * static_cast<int64_t>(in.element_size()), what);
    check(MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm_, &r), what);
    return work(r, what);
  }
  std::unique_ptr<Work> all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts, const at::Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    const std::string what = label("all-to-all", in.numel());
    require_cpu(in, what);
    require_cpu(out, what);
    const auto bytes = [&](const std::vector<int64_t>& counts, int64_t total, const at::Tensor& t, std::vector<int>& n, std::vector<int>& at) {
      if (static_cast<int>(counts.size()) != size_ || t.scalar_type() != in.scalar_type()) {
        throw CommError(what + ": one count per rank and one dtype expected");
      }
      int64_t sum = 0;
      for (int64_t c : counts) {
        at.push_back(count(sum * static_cast<int64_t>(t.element_size()), what));
        n.push_back(count(c * static_cast<int64_t>(t.element_size()), what));
        sum += c;
      }
      if (sum != total) throw CommError(what + ": counts add up to " + std::to_string(sum) + " elements, the tensor has " + std::to_string(total));
    };
    std::vector<int> send_bytes, send_at, recv_bytes, recv_at;
    bytes(send_counts, in.numel(), in, send_bytes, send_at);
    bytes(recv_counts, out.numel(), out, recv_bytes, recv_at);
    MPI_Request r;
    check(MPI_Ialltoallv(in.data_ptr(), send_bytes.data(), send_at.data(), MPI_BYTE, out.data_ptr(), recv_bytes.data(), recv_at.data(),
                         MPI_BYTE, comm_, &r),
          what);
    // The count arrays must outlive the request (MPI-3 non-blocking collectives read them later).
    return std::make_unique<MpiArraysWork>(work(r, what), std::move(send_bytes), std::move(send_at), std::move(recv_bytes), std::move(recv_at));
  }
  std::unique_ptr<Work> send(const at::Tensor& t, int peer, int tag) override {
    const std::string what = label("send", t.numel()) + " to rank " + std::to_string(peer);
    require_cpu(t, what);
    MPI_Request r;
    const int bytes = count(t.numel() * static_cast<int64_t>(t.element_size()), what);
    check(MPI_Issend(t.data_ptr(), bytes, MPI_BYTE, peer, tag % kMaxTag, comm_, &r), what);  // synchronous, as NCCL (comm.hpp)
    return work(r, what);
  }
  std::unique_ptr<Work> recv(const at::Tensor& t, int peer, int tag) override {
    const std::string what = label("receive", t.numel()) + " from rank " + std::to_string(peer);
    require_cpu(t, what);
    MPI_Request r;
    const int bytes = count(t.numel() * static_cast<int64_t>(t.element_size()), what);
    check(MPI_Irecv(t.data_ptr(), bytes, MPI_BYTE, peer, tag % kMaxTag, comm_, &r), what);
    return work(r, what);
  }
  void broadcast(const at::Tensor& t, int root) override {
    const std::string what = label("broadcast", t.numel());
    require_cpu(t, what);
    MPI_Request r;
    const int bytes = count(t.numel() * static_cast<int64_t>(t.element_size()), what);
    check(MPI_Ibcast(t.data_ptr(), bytes, MPI_BYTE, root, comm_, &r), what);
    work(r, what)->wait();
  }
  void barrier() override {
    const std::string what = label("barrier", 0);
    MPI_Request r;
    check(MPI_Ibarrier(comm_, &r), what);
    work(r, what)->wait();
  }
  std::vector<std::string> all_gather_strings(const std::string& value) override {
    const std::string what = label("all-gather of strings", static_cast<int64_t>(value.size()));
    int length = static_cast<int>(value.size());
    std::vector<int> lengths(static_cast<std::size_t>(size_));
    MPI_Request r;
    check(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_, &r), what);
    work(r, what)->wait();
    std::vector<int> offsets(lengths.size(), 0);
    int total = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      offsets[i] = total;
      total += lengths[i];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    check(MPI_Iallgatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm_, &r), what);
    work(r, what)->wait();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < lengths.size(); ++i) out.push_back(all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lengths[i])));
    return out;
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split for group " + name);
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, name, options_);
  }
  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  std::string label(const char* op, int64_t elements) const {
    return std::string(op) + " of " + std::to_string(elements) + " elements on group '" + name_ + "' (rank " +
           std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }
  static int count(int64_t n, const std::string& what) {
    if (n > INT32_MAX) throw CommError(what + ": more than 2^31-1 elements in one MPI call");
    return static_cast<int>(n);
  }
  std::unique_ptr<Work> work(MPI_Request r, const std::string& what) const {
    return std::make_unique<MpiWork>(r, what, options_.timeout);
  }

  MPI_Comm comm_;
  std::string name_;
  CommOptions options_;
  int rank_ = 0, size_ = 1;
};

// Open MPI moves a large message (beyond the eager limit, without a single-copy mechanism) only
// while the sender is inside an MPI call, so a pipeline stage that sends an activation and goes
// on computing would hold it back for a whole pass. This thread calls into MPI every 100 us so
// transfers proceed during compute, as NCCL's do on a GPU. It needs MPI_THREAD_MULTIPLE.
class ProgressThread {
 public:
  ProgressThread() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
  }
  ~ProgressThread() {
    stop_.store(true);
    thread_.join();
    MPI_Comm_free(&comm_);
  }

 private:
  MPI_Comm comm_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::unique_ptr<ProgressThread>& progress_thread() {
  static std::unique_ptr<ProgressThread> thread;
  return thread;
}

int& thread_level() {
  static int level = MPI_THREAD_SINGLE;
  return level;
}

}  // namespace

bool mpi_available() { return true; }
bool mpi_thread_multiple() { return thread_level() == MPI_THREAD_MULTIPLE; }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    thread_level() = provided;
    if (provided == MPI_THREAD_MULTIPLE && size > 1) progress_thread() = std::make_unique<ProgressThread>();
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", options);
}

void finalize_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  progress_thread().reset();
  if (initialized && !finalized) MPI_Finalize();
}

}  // namespace trainplan::executor
