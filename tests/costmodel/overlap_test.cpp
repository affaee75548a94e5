// Overlap is earned (issue 11): data-parallel communication counted as hidden must fit in the
// compute it overlaps, unit by unit in the order the schedule runs them (estimate.cpp, ZeRO-3).

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

Plan fsdp_plan(int gpus, bool prefetch) {
  Plan p = testing::make_plan("llama3-8b", "dgx-h100", gpus, 4096, 256);
  p.training.stack = Stack::kPytorchEager;
  p.parallel.dp = gpus;
  p.parallel.zero_stage = 3;
  p.parallel.micro_batch = 1;
  p.parallel.recompute = Recompute::kSelective;
  p.parallel.prefetch = prefetch;
  return p;
}

TEST(Zero3Overlap, WithoutPrefetchEveryGatherAndReduceScatterIsExposed) {
  const Estimate e = testing::checked_estimate(fsdp_plan(64, false));
  EXPECT_GT(e.time.dp_comm_total.value(), 0);
  EXPECT_NEAR(e.time.dp_comm_exposed.value(), e.time.dp_comm_total.value(), 1e-9 * e.time.dp_comm_total.value());
}

TEST(Zero3Overlap, PrefetchHidesOnlyWhatTheUnitsComputeCanHide) {
  const Estimate hidden = testing::checked_estimate(fsdp_plan(64, true));
  // Fast links: most of the traffic hides, but the first gather and the last reduce-scatter of
  // every pass cannot.
  EXPECT_LT(hidden.time.dp_comm_exposed.value(), 0.2 * hidden.time.dp_comm_total.value());
  EXPECT_GT(hidden.time.dp_comm_exposed.value(), 0);
  // A link 100 times slower: each unit's gather outlasts its compute, so the excess of every unit
  // is exposed and at least the traffic less all the compute of the step shows.
  Plan slow = fsdp_plan(64, true);
  slow.cluster.inter_node.bandwidth = slow.cluster.inter_node.bandwidth / 100.0;
  const Estimate e = testing::checked_estimate(slow);
  EXPECT_GT(e.time.dp_comm_exposed.value(), e.time.dp_comm_total.value() - (e.time.compute + e.time.recompute).value());
  EXPECT_GT(e.time.dp_comm_exposed.value(), 10 * hidden.time.dp_comm_exposed.value());
}

// CPU ranks under Open MPI (HardwareProfile::collectives_overlap_compute false): a nonblocking
// collective moves on only inside MPI calls, so nothing overlaps, under ZeRO-3 with prefetch or
// under ZeRO-1 with the reduction overlapped; the flag reads back from the profile's JSON.
TEST(Zero3Overlap, WhereCollectivesDoNotProgressDuringComputeAllIsExposed) {
  for (int zero : {1, 3}) {
    Plan p = fsdp_plan(64, true);
    p.parallel.zero_stage = zero;
    p.parallel.overlap_grad_reduce = true;
    const Estimate overlapped = testing::checked_estimate(p);
    EXPECT_LT(overlapped.time.dp_comm_exposed.value(), 0.5 * overlapped.time.dp_comm_total.value()) << "ZeRO-" << zero;
    p.cluster.collectives_overlap_compute = false;
    const Estimate e = testing::checked_estimate(p);
    EXPECT_NEAR(e.time.dp_comm_exposed.value(), e.time.dp_comm_total.value(), 1e-9 * e.time.dp_comm_total.value()) << "ZeRO-" << zero;
    EXPECT_NEAR(e.time.dp_comm_total.value(), overlapped.time.dp_comm_total.value(), 1e-9 * e.time.dp_comm_total.value());
    auto back = parse_hwprofile_text(readable_json(hwprofile_to_json(p.cluster)), "cpu.json");
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_FALSE(back->collectives_overlap_compute);
  }
  EXPECT_TRUE(testing::cluster("dgx-h100").collectives_overlap_compute);
}

TEST(Zero3Overlap, ATiedOutputLayerOnOneStageIsNotGatheredTwice) {
  // Llama 3.2 1B ties its output layer to the embedding: on one stage that is one unit. Untied,
  // the output layer is a unit of its own (263 M more parameters to gather and reduce).
  Plan tied = testing::make_plan("llama3.2-1b", "dgx-h100", 8, 2048, 64);
  tied.parallel.dp = 8;
  tied.parallel.zero_stage = 3;
  Plan untied = tied;
  untied.model.tied_embeddings = false;
  const Estimate a = testing::checked_estimate(tied), b = testing::checked_estimate(untied);
  EXPECT_LT(a.time.dp_comm_total.value(), 0.9 * b.time.dp_comm_total.value());
}

TEST(Zero3Overlap, ExposedGathersGrowWithTheRanksAtAFixedGlobalBatch) {
  // 256 sequences of 4096 tokens on 8 .. 256 GPUs: fewer micro-batches per GPU hide the same
  // per-pass gathers behind less compute, and each ring gather takes more latency steps, so the
  // exposed share of the step grows, and so does the exposed time of one micro-batch.
  double previous_share = 0, previous_per_micro_batch = 0;
  for (int gpus : {8, 16, 32, 64, 128, 256}) {
    const Estimate e = testing::checked_estimate(fsdp_plan(gpus, true));
    const double share = e.time.dp_comm_exposed.value() / e.time.step.value();
    const double per_micro_batch = e.time.dp_comm_exposed.value() / e.micro_batches;
    if (previous_share > 0) {
      EXPECT_GT(share, previous_share) << gpus << " GPUs";
      EXPECT_GT(per_micro_batch, previous_per_micro_batch) << gpus << " GPUs";
    }
    previous_share = share;
    previous_per_micro_batch = per_micro_batch;
  }
}

// While a collective runs beside the compute, NCCL's kernel holds one SM per channel (one thread
// block each, NVIDIA/nccl src/enqueue.cc), 16 channels on a DGX-class node (network.cpp), so the
// overlapped compute runs on the rest: 16 of 132 SMs on an H100, 16 of 108 on an A100; CPU ranks
// overlap nothing.
TEST(OverlapSlowdown, IsTheShareOfSmsNcclsChannelsHold) {
  EXPECT_DOUBLE_EQ(nccl_sm_share(testing::cluster("dgx-h100")), 16.0 / 132.0);
  EXPECT_DOUBLE_EQ(nccl_sm_share(testing::cluster("dgx-a100-80g")), 16.0 / 108.0);
  HardwareProfile cpu = testing::cluster("dgx-h100");
  cpu.collectives_overlap_compute = false;
  EXPECT_EQ(nccl_sm_share(cpu), 0.0);
  // The compute line of an FSDP step grows by that share of the overlapped traffic: twice the SMs,
  // half the loss; a GPU of no stated SM count, none.
  const auto compute_with_sms = [](int sms) {
    Plan p = fsdp_plan(64, true);
    p.cluster.gpu.sm_count = sms;
    return testing::checked_estimate(p).time.compute.value();
  };
  const double none = compute_with_sms(0), h100 = compute_with_sms(132), doubled = compute_with_sms(264);
  const Estimate e = testing::checked_estimate(fsdp_plan(64, true));
  const double overlapped = (e.time.dp_comm_total - e.time.dp_comm_exposed).value();
  EXPECT_GT(h100 - none, 0.5 * 16.0 / 132.0 * overlapped);
  EXPECT_LE(h100 - none, 16.0 / 132.0 * overlapped * (1 + 1e-9));
  EXPECT_NEAR(h100 - none, 2.0 * (doubled - none), 1e-9 * h100);
}

}  // namespace
}  // namespace trainplan
