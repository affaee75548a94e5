// The pipeline's links are untagged: each one-directional link's receiver takes messages in the
// order its sender posts them (NCCL's matching; pipeline_links.hpp). That is right only if, for
// every schedule the executor runs, both ends of every link list the same messages in the same
// order. link_order_mismatch checks it from costmodel::pipeline_order; the runner refuses a
// schedule where it fails.

#include <gtest/gtest.h>

#include "pipeline_links.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::executor {
namespace {

namespace cm = trainplan::costmodel;

TEST(PipelineLinkOrder, EveryScheduleSendsAndReceivesEachLinksMessagesInOneOrder) {
  int checked = 0;
  for (const int p : {2, 3, 4, 8}) {
    for (const int m : {1, 2, 3, 4, 8, 16}) {
      for (const auto schedule : {cm::Schedule::kGpipe, cm::Schedule::kOneFOneB}) {
        const auto order = cm::pipeline_order(schedule, p, 1, m);
        ASSERT_TRUE(order.ok());
        EXPECT_EQ(link_order_mismatch(*order, p, 1), "") << "p=" << p << " m=" << m;
        ++checked;
      }
      for (const int v : {2, 3, 4}) {
        const auto order = cm::pipeline_order(cm::Schedule::kInterleaved, p, v, m);
        if (!order) continue;  // interleaved needs m a multiple of p (Megatron)
        EXPECT_EQ(link_order_mismatch(*order, p, v), "") << "interleaved p=" << p << " v=" << v << " m=" << m;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 60);
}

TEST(PipelineLinkOrder, NamesTheLinkWhereTheTwoEndsDisagree) {
  // 1F1B on 2 stages, 2 micro-batches: stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1. Swapping
  // stage 1's forwards (F1 before F0) makes it take activation 1 where stage 0 sends 0 first.
  auto result = cm::pipeline_order(cm::Schedule::kOneFOneB, 2, 1, 2);
  ASSERT_TRUE(result.ok());
  std::vector<std::vector<cm::PipelinePass>> order = result.value();
  auto& second = order[1];
  ASSERT_EQ(second.size(), 4u);
  std::swap(second[0], second[2]);  // F1 B0 F0 B1
  EXPECT_EQ(link_order_mismatch(order, 2, 1),
            "activation link stage 0 -> 1: message 0 is sent as (position 0, micro-batch 0) but received as (position 0, micro-batch 1)");
}

}  // namespace
}  // namespace trainplan::executor
