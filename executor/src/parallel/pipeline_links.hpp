#pragma once
// The point-to-point links between pipeline stages, built so that NCCL cannot deadlock on them.
//
// ncclSend holds its CUDA stream until the peer posts the matching receive, and NCCL matches a
// communicator's operations in the order each rank issues them. In 1F1B a stage sends an
// activation forward while its neighbour sends a gradient back; with both sends on the compute
// stream (or both directions on one communicator) each stage waits for the other forever. So:
//   - every pair of neighbouring stages gets one-directional links: one communicator that carries
//     only activations from stage s to s+1, another only gradients from s+1 to s (and, for
//     interleaved schedules, the wrap-around pair from the last stage to the first);
//   - each outgoing link posts its sends in order on a lane of its own, off the compute path: a
//     side CUDA stream that first waits (an event) for the work already queued on the compute
//     stream, or on CPU ranks a thread;
//   - receives are posted on the compute stream (the calling thread on CPU), so the kernels that
//     use the data follow them.
// Messages carry no tags: a link's receiver takes them in the order the sender posted them, as
// NCCL does; on CPU the MPI sends are synchronous (MPI_Issend), so a send completes only once its
// receive is posted, as on a GPU. The CPU ranks therefore run exactly the structure the GPU does,
// and a layout that would deadlock there deadlocks (and times out) here.

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::executor {

// Posts one link's sends in order, off the caller's compute path.
class SendLane {
 public:
  virtual ~SendLane() = default;
  // Sends `tensor` after the work queued so far on the caller's stream. The lane keeps the tensor
  // until the send completes. REQUIRES: contiguous.
  virtual void post(const at::Tensor& tensor) = 0;
  // Waits until every posted send completed; rethrows the first failure (CommError on timeout).
  virtual void drain() = 0;
};

enum class LaneKind {
  kSideStreamOrThread,  // a side CUDA stream for CUDA links, a thread for CPU (MPI) links
  kCaller,              // the send completes on the caller's path before post() returns: the
                        // structure that deadlocks on NCCL (kept to prove the tests can see it)
};

// A lane over `link` (a two-rank group) to its rank `peer`.
[[nodiscard]] std::unique_ptr<SendLane> make_send_lane(Communicator& link, int peer, LaneKind kind);

class PipelineLinks {
 public:
  // Collective over `pp` (group rank = stage): splits it into the one-directional links of each
  // neighbouring pair, the last-to-first pair too when `wrap` (interleaved schedules).
  PipelineLinks(Communicator& pp, bool wrap, LaneKind lanes = LaneKind::kSideStreamOrThread);
  ~PipelineLinks();
  PipelineLinks(const PipelineLinks&) = delete;
  PipelineLinks& operator=(const PipelineLinks&) = delete;

  // Activation to the next stage / from the previous one; gradient to the previous / from the next.
  void send_activation(const at::Tensor& tensor);
  void recv_activation(const at::Tensor& tensor);
  void send_gradient(const at::Tensor& tensor);
  void recv_gradient(const at::Tensor& tensor);
  // Waits for every send posted so far (end of a step).
  void drain();

 private:
  struct Link;
  static Link& need(const std::unique_ptr<Link>& link, const char* what);
  std::unique_ptr<Link> activations_out_, activations_in_, gradients_out_, gradients_in_;
};

// The messages each one-directional link carries, in the order its sender posts them and in the
// order its receiver takes them, for one step of `order` (costmodel::pipeline_order). Untagged
// matching is right only when the two agree; returns a description of the first link where they
// do not, or "" when every link agrees.
[[nodiscard]] std::string link_order_mismatch(const std::vector<std::vector<costmodel::PipelinePass>>& order, int stages,
                                              int virtual_stages);

}  // namespace trainplan::executor
