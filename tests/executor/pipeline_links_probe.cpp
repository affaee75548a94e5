// Replays one step of a pipeline schedule's messages over the executor's pipeline links, on CPU
// ranks under mpirun (one rank per stage), each message carrying its (position, micro-batch) so a
// receiver can check it got the one the schedule says. Run by pipeline_links_test.cpp.
//
//   pipeline_links_probe SCHEDULE VIRTUAL_STAGES MICRO_BATCHES LANES TIMEOUT_S
//     SCHEDULE gpipe | 1f1b | interleaved; LANES thread (the executor's) | caller (a send completes
//     before the stage goes on: the structure that deadlocks on NCCL)
//
// Exit 0 with "rank R: N messages received, each the one the schedule names"; 3 when a transfer
// timed out (a deadlock), printing the CommError; 4 when a message was not the expected one.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "pipeline_links.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace ex = trainplan::executor;
namespace cm = trainplan::costmodel;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: pipeline_links_probe gpipe|1f1b|interleaved VIRTUAL_STAGES MICRO_BATCHES thread|caller TIMEOUT_S\n");
    return 2;
  }
  const std::string schedule_name = argv[1], lanes = argv[4];
  const int v = std::atoi(argv[2]), m = std::atoi(argv[3]);
  const cm::Schedule schedule = schedule_name == "gpipe" ? cm::Schedule::kGpipe
                                : schedule_name == "interleaved" ? cm::Schedule::kInterleaved
                                                                 : cm::Schedule::kOneFOneB;
  ex::CommOptions options;
  options.timeout = std::chrono::seconds(std::atoi(argv[5]));
  std::unique_ptr<ex::Communicator> world = ex::make_mpi_communicator(options);
  const int p = world->size(), s = world->rank(), positions = p * v;
  int status = 0;
  try {
    const auto order = cm::pipeline_order(schedule, p, v, m);
    if (!order) throw std::invalid_argument(order.error().message);
    ex::PipelineLinks links(*world, v > 1, lanes == "caller" ? ex::LaneKind::kCaller : ex::LaneKind::kSideStreamOrThread);
    const auto message = [](int pos, int i) { return at::tensor({static_cast<float>(pos), static_cast<float>(i)}); };
    const auto expect = [&](const at::Tensor& got, int pos, int i, const char* what) {
      if (got[0].item<float>() != static_cast<float>(pos) || got[1].item<float>() != static_cast<float>(i)) {
        std::printf("rank %d: %s: expected (position %d, micro-batch %d), got (%g, %g)\n", s, what, pos, i, got[0].item<float>(),
                    got[1].item<float>());
        status = 4;
      }
    };
    int received = 0;
    for (const cm::PipelinePass& pass : (*order)[static_cast<std::size_t>(s)]) {
      const int pos = pass.chunk * p + s, i = pass.micro_batch;
      at::Tensor buffer = at::empty({2});
      if (pass.kind == cm::PassKind::kForward) {
        if (pos != 0) {
          links.recv_activation(buffer);
          expect(buffer, pos - 1, i, "activation");
          ++received;
        }
        if (pos != positions - 1) links.send_activation(message(pos, i));
      } else {
        if (pos != positions - 1) {
          links.recv_gradient(buffer);
          expect(buffer, pos + 1, i, "gradient");
          ++received;
        }
        if (pos != 0) links.send_gradient(message(pos, i));
      }
    }
    links.drain();
    if (status == 0) std::printf("rank %d: %d messages received, each the one the schedule names\n", s, received);
  } catch (const ex::CommError& e) {
    std::printf("rank %d: %s\n", s, e.what());
    std::fflush(stdout);
    world->abort(3);  // the other stage is stuck too: end every rank
  }
  std::fflush(stdout);
  world->barrier();
  world.reset();
  ex::finalize_mpi();
  return status;
}
