// One-directional pipeline links and their send lanes (see pipeline_links.hpp).

#include "pipeline_links.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#ifdef TRAINPLAN_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

// Untagged: a link carries one kind of message one way, matched in order (as NCCL matches).
constexpr int kTag = 0;

// The send completes before post() returns: what a send on the compute stream amounts to.
class CallerLane final : public SendLane {
 public:
  CallerLane(Communicator& link, int peer) : link_(link), peer_(peer) {}
  void post(const at::Tensor& tensor) override { link_.send(tensor, peer_, kTag)->wait(); }
  void drain() override {}

 private:
  Communicator& link_;
  int peer_;
};

// CPU ranks: a thread posts the link's sends in order and waits for each, as a stream would.
class ThreadLane final : public SendLane {
 public:
  ThreadLane(Communicator& link, int peer) : state_(std::make_shared<State>()) {
    thread_ = std::thread([state = state_, &link, peer] {
      while (true) {
        at::Tensor tensor;
        {
          std::unique_lock<std::mutex> lock(state->mutex);
          state->changed.wait(lock, [&] { return state->stop || !state->queue.empty(); });
          if (state->stop) return;
          tensor = std::move(state->queue.front());
          state->queue.pop_front();
          state->sending = true;
        }
        std::exception_ptr failure;
        try {
          link.send(tensor, peer, kTag)->wait();
        } catch (...) {
          failure = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(state->mutex);
        state->sending = false;
        if (failure && !state->error) state->error = failure;
        if (state->error) state->queue.clear();  // the rest would follow a broken link
        state->changed.notify_all();
      }
    });
  }
  ~ThreadLane() override {
    bool sending = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      state_->queue.clear();
      sending = state_->sending;
      state_->changed.notify_all();
    }
    // A send still waiting (an error unwinds the step) ends at the communicator's deadline; the
    // thread then touches only its shared state, so it may outlive the lane.
    if (sending) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void post(const at::Tensor& tensor) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->error) std::rethrow_exception(state_->error);
    state_->queue.push_back(tensor);
    state_->changed.notify_all();
  }
  void drain() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->changed.wait(lock, [&] { return state_->queue.empty() && !state_->sending; });
    if (state_->error) std::rethrow_exception(state_->error);
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<at::Tensor> queue;
    bool sending = false, stop = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
  std::thread thread_;
};

#ifdef TRAINPLAN_HAVE_CUDA
// GPU ranks: the link's sends on a stream of their own, each after the work queued so far on the
// compute stream (an event), so the compute stream goes on to its receives while a send waits
// for the peer.
class StreamLane final : public SendLane {
 public:
  StreamLane(Communicator& link, int peer) : link_(link), peer_(peer), stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true)) {}
  void post(const at::Tensor& tensor) override {
    cudaEvent_t ready = nullptr;
    check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream().stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_.stream(), ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once the wait has been resolved
    c10::cuda::CUDAStreamGuard on_side(stream_);
    // Marked in use by the side stream, the caching allocator keeps the tensor's memory from the
    // compute stream until the send is done, without this lane holding it: a stage sends m
    // activations and m gradients a step, which a held reference would keep until drain().
    tensor.record_stream(stream_);
    pending_.push_back(link_.send(tensor, peer_, kTag));
  }
  void drain() override {
    for (auto& p : pending_) p->wait();
    pending_.clear();
  }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw CommError(std::string("pipeline send lane: ") + what + ": " + cudaGetErrorString(e));
  }
  Communicator& link_;
  int peer_;
  c10::cuda::CUDAStream stream_;
  std::vector<std::unique_ptr<Work>> pending_;
};
#endif

}  // namespace

std::unique_ptr<SendLane> make_send_lane(Communicator& link, int peer, LaneKind kind) {
  if (kind == LaneKind::kCaller) return std::make_unique<CallerLane>(link, peer);
  if (link.device().is_cuda()) {
#ifdef TRAINPLAN_HAVE_CUDA
    return std::make_unique<StreamLane>(link, peer);
#else
    throw CommError("pipeline link '" + link.name() + "': CUDA tensors in an executor built without CUDA");
#endif
  }
  if (!mpi_thread_multiple()) {
    throw CommError("pipeline link '" + link.name() + "': sends run on a thread of their own, which needs MPI initialised with "
                    "MPI_THREAD_MULTIPLE; this MPI library did not grant it");
  }
  return std::make_unique<ThreadLane>(link, peer);
}

struct PipelineLinks::Link {
  std::unique_ptr<Communicator> comm;
  int peer = 0;
  std::unique_ptr<SendLane> lane;  // outgoing links only; declared after `comm`, so it goes first
};

PipelineLinks::PipelineLinks(Communicator& pp, bool wrap, LaneKind lanes) {
  const int p = pp.size(), s = pp.rank();
  if (p < 2) return;
  // Edge e joins stage e to stage (e + 1) % p; the last one only when the ring wraps. Each split
  // (collective over pp) makes the links of edges that share no stage: the even edges, the odd
  // ones, and on an odd ring the wrap edge alone (it shares stage 0 with edge 0).
  const int edges = wrap ? p : p - 1;
  const auto round_of = [&](int e) { return wrap && p % 2 == 1 && e == p - 1 ? 2 : e % 2; };
  for (int round = 0; round < 3; ++round) {
    bool used = false;
    for (int e = 0; e < edges; ++e) used = used || round_of(e) == round;
    if (!used) continue;
    for (const bool activations : {true, false}) {  // activations go e -> e+1, gradients e+1 -> e
      int colour = -1, key = 0, from = 0, to = 0;
      for (int e = 0; e < edges; ++e) {
        if (round_of(e) != round) continue;
        const int low = e, high = (e + 1) % p;
        if (s != low && s != high) continue;
        from = activations ? low : high;
        to = activations ? high : low;
        colour = e;
        key = s == from ? 0 : 1;
      }
      const std::string name = "pp_" + std::string(activations ? "activations_" : "gradients_") + std::to_string(from) + "to" + std::to_string(to);
      std::unique_ptr<Communicator> comm = pp.split(colour, key, name);
      if (colour < 0) continue;
      if (comm == nullptr || comm->size() != 2) throw CommError("pipeline link " + name + ": the split did not give a two-rank group");
      auto link = std::make_unique<Link>();
      link->comm = std::move(comm);
      link->peer = 1 - link->comm->rank();
      const bool sending = key == 0;
      if (sending) link->lane = make_send_lane(*link->comm, link->peer, lanes);
      (activations ? (sending ? activations_out_ : activations_in_) : (sending ? gradients_out_ : gradients_in_)) = std::move(link);
    }
  }
}

PipelineLinks::~PipelineLinks() = default;

PipelineLinks::Link& PipelineLinks::need(const std::unique_ptr<Link>& link, const char* what) {
  if (!link) throw std::logic_error(std::string("pipeline: this stage has no link to ") + what);
  return *link;
}

void PipelineLinks::send_activation(const at::Tensor& tensor) { need(activations_out_, "send activations on").lane->post(tensor); }
void PipelineLinks::send_gradient(const at::Tensor& tensor) { need(gradients_out_, "send gradients on").lane->post(tensor); }
void PipelineLinks::recv_activation(const at::Tensor& tensor) {
  Link& l = need(activations_in_, "receive activations from");
  l.comm->recv(tensor, l.peer, kTag)->wait();
}
void PipelineLinks::recv_gradient(const at::Tensor& tensor) {
  Link& l = need(gradients_in_, "receive gradients from");
  l.comm->recv(tensor, l.peer, kTag)->wait();
}
void PipelineLinks::drain() {
  for (auto* link : {&activations_out_, &gradients_out_}) {
    if (*link) (*link)->lane->drain();
  }
}

std::string link_order_mismatch(const std::vector<std::vector<cm::PipelinePass>>& order, int stages, int virtual_stages) {
  const int p = stages, positions = stages * virtual_stages;
  // (activations?, sending stage) -> the (position it leaves, micro-batch) of each message.
  using Messages = std::vector<std::pair<int, int>>;
  std::map<std::pair<bool, int>, Messages> sent, received;
  for (int s = 0; s < p; ++s) {
    for (const cm::PipelinePass& pass : order[static_cast<std::size_t>(s)]) {
      const int pos = pass.chunk * p + s, i = pass.micro_batch;
      if (pass.kind == cm::PassKind::kForward) {
        if (pos != positions - 1) sent[{true, s}].emplace_back(pos, i);
        if (pos != 0) received[{true, (s - 1 + p) % p}].emplace_back(pos - 1, i);
      } else {
        if (pos != 0) sent[{false, s}].emplace_back(pos, i);
        if (pos != positions - 1) received[{false, (s + 1) % p}].emplace_back(pos + 1, i);
      }
    }
  }
  for (const auto& [link, messages] : sent) {
    const Messages& taken = received[link];
    const int from = link.second, to = link.first ? (from + 1) % p : (from - 1 + p) % p;
    const std::string name = std::string(link.first ? "activation" : "gradient") + " link stage " + std::to_string(from) + " -> " + std::to_string(to);
    for (std::size_t k = 0; k < std::max(messages.size(), taken.size()); ++k) {
      const auto text = [](const Messages& m, std::size_t k) {
        return k < m.size() ? "(position " + std::to_string(m[k].first) + ", micro-batch " + std::to_string(m[k].second) + ")" : std::string("nothing");
      };
      if (k >= messages.size() || k >= taken.size() || messages[k] != taken[k]) {
        return name + ": message " + std::to_string(k) + " is sent as " + text(messages, k) + " but received as " + text(taken, k);
      }
    }
  }
  for (const auto& [link, taken] : received) {
    if (!taken.empty() && sent.find(link) == sent.end()) return "a stage receives on a link nobody sends on";
  }
  return "";
}

}  // namespace trainplan::executor
