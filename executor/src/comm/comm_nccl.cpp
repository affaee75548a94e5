// The NCCL engine: CUDA tensors; collectives on a stream of each communicator's own, after the
// work queued so far on the caller's stream, so that a data-parallel reduction launched during
// backward overlaps the backward kernels queued after it; sends, receives and broadcasts on the
// caller's stream (the pipeline's send lanes choose theirs). Completion is tracked with CUDA
// events; a wait past the deadline aborts the NCCL communicator and throws.

#include <nccl.h>

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm.hpp"

namespace trainplan::executor {
namespace {

void check(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress) throw CommError(what + " failed: " + ncclGetErrorString(r));
}
void check_cuda(cudaError_t r, const std::string& what) {
  if (r != cudaSuccess) throw CommError(what + " failed: " + cudaGetErrorString(r));
}

ncclDataType_t nccl_type(const at::Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default: throw CommError(what + ": unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  }
}

// Set once a communicator is aborted: an aborted NCCL communicator must not be aborted or
// destroyed again, nor asked anything (ncclCommAbort frees it).
using AbortedFlag = std::shared_ptr<std::atomic<bool>>;

// Set once any collective of this process failed or timed out, or the run failed
// (mark_communication_failed): from then on communicators are aborted, not destroyed, since
// ncclCommDestroy waits for every kernel of its communicator, and one a dead peer never matches
// spins for ever.
std::atomic<bool> g_failed{false};

// Aborts `comm` once (whatever else shares `aborted`).
void abort_once(ncclComm_t comm, const AbortedFlag& aborted) {
  if (!aborted->exchange(true)) ncclCommAbort(comm);
}

class NcclWork final : public Work {
 public:
  // `keep`: the tensors a collective on a side stream uses, held until the work is known done
  // (their memory must not go back to the caching allocator for the caller's stream before).
  NcclWork(ncclComm_t comm, AbortedFlag aborted, cudaStream_t stream, std::string what, std::chrono::seconds timeout,
           std::vector<at::Tensor> keep)
      : comm_(comm), aborted_(std::move(aborted)), what_(std::move(what)), timeout_(timeout), keep_(std::move(keep)) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), what_);
    check_cuda(cudaEventRecord(event_, stream), what_);
  }
  // Dropped unwaited (an error path): the caller's stream, where freed memory is reused, waits
  // for the work before the tensors go; after a failure nothing waits for work that may never end.
  ~NcclWork() override {
    if (!keep_.empty() && !aborted_->load() && !g_failed.load()) cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream().stream(), event_, 0);
    keep_.clear();
    cudaEventDestroy(event_);
  }
  // Blocks the host until the work is done (surfacing failures, enforcing the deadline), then
  // orders the caller's stream after it: work queued on another stream (a collective's) is
  // followed by whatever the caller queues next, on any stream.
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    // The first 2 ms polled without sleeping: a tensor-parallel all-reduce inside a layer takes
    // tens of microseconds, and a 100 us sleep per wait would add more than that (twice per layer
    // and pass); longer waits (a data-parallel drain, a dead peer) sleep between polls.
    const auto spin_until = start + std::chrono::milliseconds(2);
    while (true) {
      if (aborted_->load()) throw CommError(what_ + ": the communicator was aborted after an earlier failure");
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) {
        order_current_stream();
        keep_.clear();
        return;
      }
      if (q != cudaErrorNotReady) {
        g_failed = true;
        check_cuda(q, what_);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        g_failed = true;
        abort_once(comm_, aborted_);  // its kernel may still spin
        throw CommError(what_ + " failed: " + ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        g_failed = true;
        abort_once(comm_, aborted_);
        throw CommError(what_ + " did not complete within " + std::to_string(timeout_.count()) +
                        " s: a peer rank has probably died or hangs");
      }
      if (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void order_current_stream() override {
    check_cuda(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream().stream(), event_, 0), what_);
  }

 private:
  ncclComm_t comm_;
  AbortedFlag aborted_;
  cudaEvent_t event_{};
  std::string what_;
  std::chrono::seconds timeout_;
  std::vector<at::Tensor> keep_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::string name, CommOptions options) : comm_(comm), name_(std::move(name)), options_(options) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }
  // Destroyed while an exception unwinds, or after a failure: aborted (a destroy would wait for
  // kernels a dead or failed peer never completes).
  ~NcclCommunicator() override {
    if (aborted_->load()) return;
    if (g_failed.load() || std::uncaught_exceptions() > 0) abort_once(comm_, aborted_);
    else ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::unique_ptr<Work> all_reduce_sum(const at::Tensor& t) override {
    const std::string what = label("all-reduce", t.numel());
    require(t, what);
    const cudaStream_t side = collective_stream(what);
    check(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t, what), ncclSum, comm_, side), what);
    return work(what, side, {t});
  }
  std::unique_ptr<Work> reduce_scatter_sum(const at::Tensor& in, const at::Tensor& out) override {
    const std::string what = label("reduce-scatter", in.numel());
    require(in, what);
    require(out, what);
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type()) {
      throw CommError(what + ": input must hold size() x output elements of the same dtype");
    }
    const cudaStream_t side = collective_stream(what);
    check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), nccl_type(in, what), ncclSum, comm_, side),
          what);
    return work(what, side, {in, out});
  }
  std::unique_ptr<Work> all_gather(const at::Tensor& in, const at::Tensor& out) override {
    const std::string what = label("all-gather", out.numel());
    require(in, what);
    require(out, what);
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type()) {
      throw CommError(what + ": output must hold size() x input elements of the same dtype");
    }
    const cudaStream_t side = collective_stream(what);
    check(ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()), nccl_type(in, what), comm_, side), what);
    return work(what, side, {in, out});
  }
  // Grouped sends and receives (NCCL has no all-to-all-v; this is how PyTorch's does it).
  std::unique_ptr<Work> all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts, const at::Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    const std::string what = label("all-to-all", in.numel());
    require(in, what);
    require(out, what);
    if (static_cast<int>(send_counts.size()) != size_ || static_cast<int>(recv_counts.size()) != size_ || in.scalar_type() != out.scalar_type()) {
      throw CommError(what + ": one count per rank and one dtype expected");
    }
    const ncclDataType_t type = nccl_type(in, what);
    const auto element = static_cast<int64_t>(in.element_size());
    auto* send_base = static_cast<char*>(in.data_ptr());
    auto* recv_base = static_cast<char*>(out.data_ptr());
    int64_t sent = 0, received = 0;
    for (int j = 0; j < size_; ++j) {
      sent += send_counts[static_cast<std::size_t>(j)];
      received += recv_counts[static_cast<std::size_t>(j)];
    }
    if (sent != in.numel() || received != out.numel()) throw CommError(what + ": counts do not add up to the tensors' sizes");
    sent = received = 0;
    const cudaStream_t side = collective_stream(what);
    // The group is always closed, a failure inside it reported after: an open group would hold
    // every later NCCL call of this thread back, unlaunched.
    ncclResult_t first = ncclGroupStart();
    check(first, what);
    for (int j = 0; j < size_ && (first == ncclSuccess || first == ncclInProgress); ++j) {
      const auto n = static_cast<size_t>(send_counts[static_cast<std::size_t>(j)]);
      const auto m = static_cast<size_t>(recv_counts[static_cast<std::size_t>(j)]);
      if (n > 0) first = ncclSend(send_base + sent * element, n, type, j, comm_, side);
      if (m > 0 && (first == ncclSuccess || first == ncclInProgress)) first = ncclRecv(recv_base + received * element, m, type, j, comm_, side);
      sent += static_cast<int64_t>(n);
      received += static_cast<int64_t>(m);
    }
    const ncclResult_t ended = ncclGroupEnd();
    check(first, what);
    check(ended, what);
    return work(what, side, {in, out});
  }
  std::unique_ptr<Work> send(const at::Tensor& t, int peer, int /*tag: NCCL matches in order*/) override {
    const std::string what = label("send", t.numel()) + " to rank " + std::to_string(peer);
    require(t, what);
    check(ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t, what), peer, comm_, stream()), what);
    return work(what, stream(), {});
  }
  std::unique_ptr<Work> recv(const at::Tensor& t, int peer, int /*tag*/) override {
    const std::string what = label("receive", t.numel()) + " from rank " + std::to_string(peer);
    require(t, what);
    check(ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t, what), peer, comm_, stream()), what);
    return work(what, stream(), {});
  }
  void broadcast(const at::Tensor& t, int root) override {
    const std::string what = label("broadcast", t.numel());
    require(t, what);
    check(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t, what), root, comm_, stream()), what);
    work(what, stream(), {})->wait();
  }
  void barrier() override {
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    all_reduce_sum(one)->wait();
  }
  std::vector<std::string> all_gather_strings(const std::string& value) override {
    const auto cuda = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
    at::Tensor length = at::full({1}, static_cast<int64_t>(value.size()), cuda);
    at::Tensor lengths = at::empty({size_}, cuda);
    all_gather(length, lengths)->wait();
    const at::Tensor host_lengths = lengths.cpu();
    const int64_t longest = host_lengths.max().item<int64_t>();
    at::Tensor mine = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(mine.data_ptr(), value.data(), value.size());
    at::Tensor everything = at::empty({longest * size_}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
    all_gather(mine.to(at::kCUDA), everything)->wait();
    const at::Tensor host = everything.cpu();
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) {
      const char* base = static_cast<const char*>(host.data_ptr()) + r * longest;
      out.emplace_back(base, static_cast<std::size_t>(host_lengths[r].item<int64_t>()));
    }
    return out;
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    ncclComm_t sub = nullptr;
    check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr), "ncclCommSplit for group " + name);
    if (sub == nullptr) return nullptr;
    return std::make_unique<NcclCommunicator>(sub, name, options_);
  }
  // Leaves at once: aborting communicators whose kernels still spin may block, and the peers'
  // collectives with this rank fail by their deadline.
  [[noreturn]] void abort(int exit_code) override {
    g_failed = true;
    std::_Exit(exit_code);
  }
  at::Device device() const override { return at::Device(at::kCUDA, c10::cuda::current_device()); }

 private:
  static cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
  static void require(const at::Tensor& t, const std::string& what) {
    if (!t.is_cuda()) throw CommError(what + ": the NCCL engine takes CUDA tensors");
    if (!t.is_contiguous()) throw CommError(what + ": tensor must be contiguous");
  }
  std::string label(const char* op, int64_t elements) const {
    return std::string(op) + " of " + std::to_string(elements) + " elements on group '" + name_ + "' (rank " +
           std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }
  std::unique_ptr<Work> work(const std::string& what, cudaStream_t on, std::vector<at::Tensor> keep) const {
    return std::make_unique<NcclWork>(comm_, aborted_, on, what, options_.timeout, std::move(keep));
  }
  // The communicator's collective stream (made on first use, on the current device), ordered
  // after the work queued so far on the caller's stream. The work holds the collective's tensors
  // until it is waited for (PyTorch's TORCH_NCCL_AVOID_RECORD_STREAMS): record_stream would keep
  // a freed tensor's memory from the caller's stream until everything queued on this stream at
  // the free is done, a ZeRO-3 unit's gathered weights until its gradients' reduce-scatter.
  cudaStream_t collective_stream(const std::string& what) {
    if (!side_) side_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/true));
    cudaEvent_t ready = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
    const cudaError_t recorded = cudaEventRecord(ready, stream());
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(side_->stream(), ready, 0) : recorded;
    cudaEventDestroy(ready);  // released once the wait has been resolved
    check_cuda(waited, what);
    return side_->stream();
  }

  ncclComm_t comm_;
  AbortedFlag aborted_ = std::make_shared<std::atomic<bool>>(false);
  std::optional<c10::cuda::CUDAStream> side_;
  std::string name_;
  CommOptions options_;
  int rank_ = 0, size_ = 1;
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// Exchanges the NCCL unique id through the torchrun-style store at MASTER_ADDR:MASTER_PORT.
ncclUniqueId exchange_through_store(int rank, int size, const CommOptions& options) {
  const std::string host = env_or("MASTER_ADDR", "127.0.0.1");
  const int port = std::stoi(env_or("MASTER_PORT", "29500"));
  // Under torchrun's agent store every worker is a client, keys live under /worker/attempt_<n>.
  const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(port);
  store_options.isServer = !agent_store && rank == 0;
  store_options.numWorkers = agent_store ? std::nullopt : std::optional<std::size_t>(static_cast<std::size_t>(size));
  store_options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(host, store_options);
  const std::string prefix = agent_store ? "/worker/attempt_" + env_or("TORCHELASTIC_RESTART_COUNT", "0") : "";
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/trainplan", tcp);
  ncclUniqueId id;
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<uint8_t> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    store->set("nccl_unique_id", bytes);
    // Rank 0 may host the store: it stays until every other rank has read the id.
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    while (store->add("nccl_unique_id_read", 0) < size - 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommError("NCCL unique id: not every rank read it from " + host + ":" + std::to_string(port) + " within " +
                        std::to_string(options.timeout.count()) + " s (a rank did not start?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } else {
    const std::vector<uint8_t> bytes = store->get("nccl_unique_id");
    if (bytes.size() != sizeof(id)) throw CommError("NCCL unique id from the store has the wrong size");
    std::memcpy(&id, bytes.data(), sizeof(id));
    store->add("nccl_unique_id_read", 1);
  }
  return id;
}

}  // namespace

bool nccl_available() { return true; }

void mark_communication_failed() { g_failed = true; }

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, Communicator* bootstrap, const CommOptions& options) {
  ncclUniqueId id;
  if (bootstrap != nullptr) {
    at::Tensor bytes = at::zeros({static_cast<int64_t>(sizeof(id))}, at::TensorOptions().dtype(at::kByte));
    if (bootstrap->rank() == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data_ptr(), &id, sizeof(id));
    }
    bootstrap->broadcast(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
  } else {
    id = exchange_through_store(rank, size, options);
  }
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")");
  return std::make_unique<NcclCommunicator>(comm, "world", options);
}

}  // namespace trainplan::executor
