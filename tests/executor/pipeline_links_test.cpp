// The pipeline's point-to-point structure on CPU ranks, as the GPU runs it (pipeline_links.hpp):
// one-directional links per stage pair, untagged in-order matching, sends that complete only when
// the receive is posted (MPI synchronous mode, NCCL's rule), each outgoing link's sends on a lane
// of their own. pipeline_links_probe replays one step of a schedule's messages over the links.
//
// The first test is the deadlock the GPU refusal stood for: with each send completing on the
// stage's own path (what a send on the compute stream amounts to), 1F1B's stage 0 sends
// activation 1 while stage 1 sends gradient 0, and both wait forever; the probe must report the
// timeout. The rest show the executor's lanes carrying pp2 and pp4 under 1F1B and interleaved,
// every message the one the schedule names. The training runs over the same links (losses equal
// to one rank) are in parallel_test.cpp.

#include <gtest/gtest.h>

#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

Outcome probe(int stages, const std::string& schedule, int virtual_stages, int micro_batches, const std::string& lanes, int timeout_s) {
  return run_mpi(stages, std::string(TRAINPLAN_LINKS_PROBE_BIN) + " " + schedule + " " + std::to_string(virtual_stages) + " " +
                             std::to_string(micro_batches) + " " + lanes + " " + std::to_string(timeout_s));
}

TEST(PipelineLinks, SendsOnTheStagesOwnPathDeadlockUnder1F1B) {
  const Outcome o = probe(2, "1f1b", 1, 4, "caller", 2);
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("did not complete within 2 s"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("send of 2 elements on group 'pp_"), std::string::npos) << o.output;
}

TEST(PipelineLinks, SendsOnTheStagesOwnPathDeadlockUnderInterleaved) {
  const Outcome o = probe(2, "interleaved", 2, 4, "caller", 2);
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("did not complete within 2 s"), std::string::npos) << o.output;
}

struct LinkCase {
  int stages;
  std::string schedule;
  int virtual_stages, micro_batches;
  int messages_on_stage_1;  // receives: activations in (not on position 0) + gradients in (not on the last)
};

class PipelineLinksOnLanes : public ::testing::TestWithParam<LinkCase> {};

TEST_P(PipelineLinksOnLanes, CarryEveryMessageOfTheScheduleInItsOrder) {
  const LinkCase& c = GetParam();
  const Outcome o = probe(c.stages, c.schedule, c.virtual_stages, c.micro_batches, "thread", 30);
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("rank 1: " + std::to_string(c.messages_on_stage_1) + " messages received, each the one the schedule names"),
            std::string::npos)
      << o.output;
}

// Stage 1 of p stages, v chunks, m micro-batches receives, per micro-batch, one activation per
// chunk (its positions are never 0) and one gradient per chunk unless the chunk is the model's
// last (position p v - 1, on stage 1 only when p = 2): pp2: 1F1B 8 x (1 + 0) = 8, interleaved
// v=2: 8 x (2 + 1) = 24; pp4: 1F1B 8 x (1 + 1) = 16, interleaved v=2: 8 x (2 + 2) = 32.
INSTANTIATE_TEST_SUITE_P(Schedules, PipelineLinksOnLanes,
                         ::testing::Values(LinkCase{2, "1f1b", 1, 8, 8}, LinkCase{2, "interleaved", 2, 8, 24},
                                           LinkCase{4, "1f1b", 1, 8, 16}, LinkCase{4, "interleaved", 2, 8, 32},
                                           LinkCase{2, "gpipe", 1, 8, 8}),
                         [](const ::testing::TestParamInfo<LinkCase>& info) {
                           return "pp" + std::to_string(info.param.stages) + "_" + info.param.schedule;
                         });

}  // namespace
}  // namespace trainplan::testing
