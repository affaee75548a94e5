// Pipeline schedules (costmodel/schedule.hpp): the order each stage runs, and the bubble and
// activation memory the simulation of that order gives. Expected values from Narayanan et al.,
// "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), §2.2:
// bubble fraction (p-1)/m for GPipe and 1F1B, (p-1)/(v*m) for interleaved 1F1B; 1F1B holds at most
// p micro-batches of activations on the first stage (§2.2.1) and GPipe all m.

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "test_support.hpp"
#include "trainplan/costmodel/schedule.hpp"

namespace trainplan::costmodel {
namespace {

PipelineTimeline balanced(Schedule schedule, int p, int v, int m, double f = 1.0, double b = 2.0) {
  PipelineTimeline t;
  t.stages = p;
  t.virtual_stages = v;
  t.micro_batches = m;
  t.schedule = schedule;
  t.forward_seconds.assign(p, f);
  t.backward_seconds.assign(p, b);
  return t;
}

TEST(PipelineOrder, EveryPassOnceBackwardAfterForward) {
  for (auto [schedule, p, v, m] : {std::tuple{Schedule::kGpipe, 4, 1, 8}, std::tuple{Schedule::kOneFOneB, 4, 1, 3},
                                   std::tuple{Schedule::kOneFOneB, 4, 1, 8}, std::tuple{Schedule::kInterleaved, 4, 2, 8},
                                   std::tuple{Schedule::kInterleaved, 2, 3, 4}, std::tuple{Schedule::kInterleaved, 4, 2, 4}}) {
    auto order = pipeline_order(schedule, p, v, m);
    ASSERT_TRUE(order) << order.error().message;
    ASSERT_EQ(order->size(), static_cast<std::size_t>(p));
    for (const auto& stage : *order) {
      ASSERT_EQ(stage.size(), static_cast<std::size_t>(2 * m * v));
      std::set<std::tuple<int, int>> forwarded, backwarded;
      for (const auto& pass : stage) {
        const auto key = std::tuple{pass.micro_batch, pass.chunk};
        if (pass.kind == PassKind::kForward) {
          EXPECT_TRUE(forwarded.insert(key).second);
        } else {
          EXPECT_TRUE(forwarded.count(key)) << "backward before forward";
          EXPECT_TRUE(backwarded.insert(key).second);
        }
      }
      EXPECT_EQ(backwarded.size(), static_cast<std::size_t>(m * v));
    }
  }
}

TEST(PipelineOrder, OneFOneBWarmup) {
  // p=4, m=8: stage 0 warms up with 3 forwards, the last stage alternates from the start.
  auto order = pipeline_order(Schedule::kOneFOneB, 4, 1, 8);
  ASSERT_TRUE(order);
  const auto& first = (*order)[0];
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(first[4], (PipelinePass{PassKind::kBackward, 0, 0}));
  const auto& last = (*order)[3];
  EXPECT_EQ(last[0], (PipelinePass{PassKind::kForward, 0, 0}));
  EXPECT_EQ(last[1], (PipelinePass{PassKind::kBackward, 0, 0}));
}

TEST(PipelineOrder, Errors) {
  EXPECT_FALSE(pipeline_order(Schedule::kOneFOneB, 0, 1, 4));
  EXPECT_FALSE(pipeline_order(Schedule::kOneFOneB, 2, 2, 4));  // v > 1 needs interleaved
  auto e = pipeline_order(Schedule::kInterleaved, 4, 2, 6);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("multiple of pipeline stages (4)"), std::string::npos) << e.error().message;
}

TEST(SimulatePipeline, BubbleMatchesClosedForms) {
  struct Case { Schedule schedule; int p, v, m; double bubble; };
  for (const Case& c : {Case{Schedule::kGpipe, 4, 1, 8, 3.0 / 8}, Case{Schedule::kOneFOneB, 4, 1, 8, 3.0 / 8},
                        Case{Schedule::kOneFOneB, 4, 1, 16, 3.0 / 16}, Case{Schedule::kOneFOneB, 2, 1, 4, 1.0 / 4},
                        Case{Schedule::kInterleaved, 4, 2, 8, 3.0 / 16}, Case{Schedule::kInterleaved, 4, 4, 8, 3.0 / 32},
                        Case{Schedule::kOneFOneB, 1, 1, 4, 0.0}}) {
    auto sim = simulate_pipeline(balanced(c.schedule, c.p, c.v, c.m));
    ASSERT_TRUE(sim) << sim.error().message;
    EXPECT_NEAR(sim->bubble_fraction, c.bubble, 1e-12) << schedule_name(c.schedule) << " p=" << c.p << " v=" << c.v
                                                       << " m=" << c.m;
    // Busy time per stage: m micro-batches of forward (1 s) and backward (2 s).
    for (double busy : sim->busy_seconds) EXPECT_DOUBLE_EQ(busy, 3.0 * c.m);
    EXPECT_NEAR(sim->makespan, 3.0 * c.m * (1 + c.bubble), 1e-9);
  }
}

TEST(SimulatePipeline, ActivationsInFlight) {
  auto one_f_one_b = simulate_pipeline(balanced(Schedule::kOneFOneB, 4, 1, 8));
  ASSERT_TRUE(one_f_one_b);
  const std::vector<double> expected{4, 3, 2, 1};  // p - s
  EXPECT_EQ(one_f_one_b->peak_in_flight, expected);
  auto gpipe = simulate_pipeline(balanced(Schedule::kGpipe, 4, 1, 8));
  ASSERT_TRUE(gpipe);
  for (double x : gpipe->peak_in_flight) EXPECT_EQ(x, 8);
}

TEST(SimulatePipeline, TransfersAndSlowStageStretchTheStep) {
  auto t = balanced(Schedule::kOneFOneB, 2, 1, 4);
  t.p2p_seconds = 0.5;
  auto sim = simulate_pipeline(t);
  ASSERT_TRUE(sim);
  // By hand (stage: pass [start, end]): 0: F0 [0,1] F1 [1,2]; 1: F0 [1.5,2.5] B0 [2.5,4.5];
  // 0: B0 [5,7]; 1: F1 [4.5,5.5] B1 [5.5,7.5]; 0: F2 [7,8] B1 [8,10] F3 [10,11]; 1: F2 [8.5,9.5]
  // B2 [9.5,11.5] F3 [11.5,12.5] B3 [12.5,14.5]; 0: B2 [12,14] B3 [15,17]. Each transfer that
  // the schedule cannot hide stretches the step: 17 s against 15 s without transfers.
  EXPECT_DOUBLE_EQ(sim->makespan, 17.0);
  t.p2p_seconds = 0;
  t.forward_seconds = {1, 2};
  t.backward_seconds = {2, 4};
  sim = simulate_pipeline(t);
  ASSERT_TRUE(sim);
  // The slow last stage bounds the step: the first forward (1), then 4 * (2 + 4), then stage 0's last backward (2).
  EXPECT_DOUBLE_EQ(sim->makespan, 27.0);
  EXPECT_FALSE(simulate_pipeline(PipelineTimeline{2, 1, 4, Schedule::kOneFOneB, {1}, {1}, 0, 0, {}}));
}

// The estimate fills the per-chunk times the drawing takes: TinyLlama's 22 layers + the embedding
// and the loss (ends_in_split) over 4 stages of 3 chunks under megatron-te, chunk_layers
// {1, 2, ..., 2, 1}. A layer, the embedding and the head each take time, and a stage's chunks add
// up to its forward (backward) time; the middle stages, without ends, are 6 layers a micro-batch.
TEST(EstimatePipeline, FillsTheLayerAndEndTimesItsChunksShare) {
  costmodel::Plan plan = testing::make_plan("tinyllama-1.1b", "dgx-h100", 8, 2048, 64);
  plan.training.stack = Stack::kMegatronTe;
  plan.parallel.tp = 1;
  plan.parallel.pp = 4;
  plan.parallel.dp = 2;
  plan.parallel.virtual_stages = 3;
  plan.parallel.schedule = Schedule::kInterleaved;
  plan.parallel.ends_in_split = true;
  const Estimate e = testing::checked_estimate(plan);
  const PipelineTimeline& t = e.pipeline;
  ASSERT_EQ(t.chunk_layers.size(), 12u);
  EXPECT_EQ(t.chunk_layers.front(), 1);
  EXPECT_EQ(t.chunk_layers.back(), 1);
  EXPECT_GT(t.layer_forward_seconds, 0);
  EXPECT_GT(t.layer_backward_seconds, 0);
  EXPECT_GT(t.embedding_forward_seconds, 0);
  EXPECT_GT(t.embedding_backward_seconds, 0);
  EXPECT_GT(t.head_forward_seconds, 0);
  EXPECT_GT(t.head_backward_seconds, 0);
  for (int stage = 0; stage < t.stages; ++stage) {
    double forward = 0, backward = 0;
    for (int c = 0; c < t.virtual_stages; ++c) {
      forward += t.chunk_forward_seconds(c * t.stages + stage);
      backward += t.chunk_backward_seconds(c * t.stages + stage);
    }
    EXPECT_NEAR(forward, t.forward_seconds[static_cast<std::size_t>(stage)], 1e-12) << stage;
    EXPECT_NEAR(backward, t.backward_seconds[static_cast<std::size_t>(stage)], 1e-12) << stage;
  }
  EXPECT_NEAR(t.forward_seconds[1], 6 * t.layer_forward_seconds, 1e-9 * t.forward_seconds[1]);
  // Each chunk its own share: the embedding's chunk holds a layer and the embedding, the loss's a
  // layer and the head, a middle one 2 layers (not a stage's time / v).
  EXPECT_NEAR(t.chunk_forward_seconds(0), t.layer_forward_seconds + t.embedding_forward_seconds, 1e-9 * t.forward_seconds[0]);
  EXPECT_NEAR(t.chunk_forward_seconds(11), t.layer_forward_seconds + t.head_forward_seconds, 1e-9 * t.forward_seconds[3]);
  EXPECT_NEAR(t.chunk_forward_seconds(5), 2 * t.layer_forward_seconds, 1e-9 * t.forward_seconds[1]);
  // The first stage: 5 layers and the embedding; the last: 5 layers and the head.
  EXPECT_NEAR(t.forward_seconds[0], 5 * t.layer_forward_seconds + t.embedding_forward_seconds, 1e-9 * t.forward_seconds[0]);
  EXPECT_NEAR(t.forward_seconds[3], 5 * t.layer_forward_seconds + t.head_forward_seconds, 1e-9 * t.forward_seconds[3]);
}

// A timeline of chunks holding 2 or 1 layers: 126 layers over 16 stages x 7 chunks (Llama 3 405B
// without the ends in the split), the extra layers in the first 14 chunks (partition_layers'
// ties), a layer 1 s forward and 2 s backward, no ends, hops of 0.05 s, exchanges of 0.01 s.
PipelineTimeline two_or_one_layer_chunks(int micro_batches) {
  PipelineTimeline t = balanced(Schedule::kInterleaved, 16, 7, micro_batches);
  t.chunk_layers.assign(112, 1);
  for (int i = 0; i < 14; ++i) t.chunk_layers[static_cast<std::size_t>(i)] = 2;
  for (int s = 0; s < 16; ++s) {
    int layers = 0;
    for (int c = 0; c < 7; ++c) layers += t.chunk_layers[static_cast<std::size_t>(c * 16 + s)];
    t.forward_seconds[static_cast<std::size_t>(s)] = layers;
    t.backward_seconds[static_cast<std::size_t>(s)] = 2.0 * layers;
  }
  t.layer_forward_seconds = 1;
  t.layer_backward_seconds = 2;
  t.p2p_seconds = 0.05;
  t.pass_comm_seconds = 0.01;
  return t;
}

// pipeline_makespan_bound is at most the whole schedule's makespan (simulate_pipeline's): on the
// 2-or-1-layer chunks at 32, 160 and 320 micro-batches, and on a 1F1B pipeline of unequal stages.
// Where every chunk takes as long it is the formula: the last stage's passes and exchanges after
// (p - 1) chunks' forward and backward and 2 (p - 1) hops (p = 4, v = 2, m = 8, a chunk 0.5 s
// forward and 1 s backward).
TEST(PipelineMakespanBound, IsBelowTheScheduleAndTheFormulaWhereChunksAreEven) {
  for (int m : {32, 160, 320}) {
    const PipelineTimeline t = two_or_one_layer_chunks(m);
    EXPECT_LE(pipeline_makespan_bound(t), simulate_pipeline(t)->makespan + 1e-9) << m;
  }
  PipelineTimeline late = balanced(Schedule::kOneFOneB, 4, 1, 48);
  late.forward_seconds = {3, 1, 1, 2.5};
  late.backward_seconds = {4, 1, 1, 4};
  late.p2p_seconds = 0.5;
  EXPECT_LE(pipeline_makespan_bound(late), simulate_pipeline(late)->makespan + 1e-9);
  PipelineTimeline even = balanced(Schedule::kInterleaved, 4, 2, 8);
  even.p2p_seconds = 0.05;
  even.pass_comm_seconds = 0.01;
  const double last_stage = 8 * (1.0 + 2.0) + (2 * 2 * 8 - 1) * 0.01;
  EXPECT_NEAR(pipeline_makespan_bound(even), 3 * (0.5 + 1.0 + 2 * 0.05) + last_stage, 1e-12);
}

// pipeline_makespan (the estimate's, where chunks take unequal times) is the drawn schedule's
// makespan without its passes: the same number on the 2-or-1-layer chunks and on a 1F1B pipeline
// of unequal stages, and 0 for a timeline that cannot be run (one stage's seconds for two stages).
TEST(PipelineMakespan, IsTheSimulatedSchedulesMakespan) {
  for (int m : {16, 32, 160}) {
    const PipelineTimeline t = two_or_one_layer_chunks(m);
    EXPECT_DOUBLE_EQ(pipeline_makespan(t), simulate_pipeline(t)->makespan) << m;
  }
  PipelineTimeline late = balanced(Schedule::kOneFOneB, 4, 1, 48);
  late.forward_seconds = {3, 1, 1, 2.5};
  late.backward_seconds = {4, 1, 1, 4};
  late.p2p_seconds = 0.5;
  EXPECT_DOUBLE_EQ(pipeline_makespan(late), simulate_pipeline(late)->makespan);
  EXPECT_EQ(pipeline_makespan(PipelineTimeline{2, 1, 4, Schedule::kOneFOneB, {1}, {1}, 0, 0, {}}), 0.0);
}

// The 2-or-1-layer chunks hold the schedule up beyond the formula: the bubble (p - 1) / v of a
// mean stage (14 stages of 8 layers, 24 s a micro-batch; 2 of 7, 21 s: 23.625 s) is
// 15 / 7 x 23.625 s = 50.6 s at 32 micro-batches. The bound sees the first micro-batch reach the
// last stages through 14 chunks of 2 layers: (14 x 2 + 1) x 3 s of passes and 30 hops before the
// last stage's 21 x 32 s, and likewise around the stages before it, so its bubble over the busiest
// stages' 768 s (and their exchanges) is larger than the formula's; the schedule run idles them
// longer still (a stage also waits in steady state for a neighbour's longer chunk).
TEST(PipelineMakespanBound, SeesTheLongerChunksTheFormulaAverages) {
  const PipelineTimeline t = two_or_one_layer_chunks(32);
  const double busiest = 32 * (8.0 + 16.0) + (2 * 7 * 32 - 1) * 0.01;
  const double formula = 15.0 / 7.0 * ((14 * 24.0 + 2 * 21.0) / 16);
  const double bound = pipeline_makespan_bound(t) - busiest;
  EXPECT_GT(bound, formula);
  EXPECT_GT(simulate_pipeline(t)->makespan - busiest, bound);
}

// Chunks of a stage that hold different layers take different times (the estimate's chunk_layers,
// ends_in_split: the first chunk holds the embedding alone). p = 2, v = 2, m = 2; a layer 1 s
// forward, 2 s backward; the embedding 0.5 s each way, the head 1 s; chunk_layers {0, 2, 2, 1}:
// positions 0 (stage 0) 0.5 / 0.5, 1 (stage 1) 2 / 4, 2 (stage 0) 2 / 4, 3 (stage 1) 2 / 3. By
// hand (stage: pass mb.chunk [start, end]): 0: F0.0 [0,0.5] F1.0 [0.5,1]; 1: F0.0 [0.5,2.5]
// F1.0 [2.5,4.5]; 0: F0.1 [2.5,4.5] F1.1 [4.5,6.5]; 1: F0.1 [4.5,6.5] B0.1 [6.5,9.5] F1.1
// [9.5,11.5] B1.1 [11.5,14.5]; 0: B0.1 [9.5,13.5] B1.1 [14.5,18.5]; 1: B0.0 [14.5,18.5] B1.0
// [18.5,22.5]; 0: B0.0 [18.5,19] B1.0 [22.5,23]. Stage time / v for every chunk would draw stage
// 0's embedding chunk as long as its two-layer chunk.
TEST(SimulatePipeline, EachChunkTakesItsOwnLayers) {
  auto t = balanced(Schedule::kInterleaved, 2, 2, 2, 2.5, 4.5);
  t.forward_seconds = {2.5, 4.0};
  t.backward_seconds = {4.5, 7.0};
  t.chunk_layers = {0, 2, 2, 1};
  t.layer_forward_seconds = 1;
  t.layer_backward_seconds = 2;
  t.embedding_forward_seconds = t.embedding_backward_seconds = 0.5;
  t.head_forward_seconds = t.head_backward_seconds = 1;
  EXPECT_DOUBLE_EQ(t.chunk_forward_seconds(0), 0.5);
  EXPECT_DOUBLE_EQ(t.chunk_backward_seconds(3), 3.0);
  auto sim = simulate_pipeline(t);
  ASSERT_TRUE(sim) << sim.error().message;
  EXPECT_DOUBLE_EQ(sim->makespan, 23.0);
  EXPECT_DOUBLE_EQ(sim->busy_seconds[0], 14.0);  // 2 x (0.5 + 0.5 + 2 + 4)
  EXPECT_DOUBLE_EQ(sim->busy_seconds[1], 22.0);  // 2 x (2 + 4 + 2 + 3)
  EXPECT_DOUBLE_EQ(sim->bubble_fraction, (9.0 / 14.0 + 1.0 / 22.0) / 2.0);
  t.chunk_layers = {1, 2, 1};  // not stages x virtual_stages entries
  const auto refused = simulate_pipeline(t);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("chunk_layers has 3 entries, not stages x virtual_stages = 4"), std::string::npos)
      << refused.error().message;
}

// A stage that exchanges after each pass (pass_comm_seconds) computes nothing meanwhile. By hand
// (p = 2, m = 2, forward 1 s, backward 2 s, exchange 0.5 s, hop 0.5 s; stage: pass [start, end]):
// 0: F0 [0,1] F1 [1.5,2.5]; 1: F0 [1.5,2.5] B0 [3,5]; 0: B0 [5.5,7.5]; 1: F1 [5.5,6.5]
// B1 [7,9]; 0: B1 [9.5,11.5]. The step charges the same: compute 6, exchanges 2 x 0.5 x
// (m + p - 1) = 3, bubble 3, less the last backward's exchange that nothing waits for (0.5).
TEST(SimulatePipeline, BlockingExchangesHoldTheStage) {
  auto t = balanced(Schedule::kOneFOneB, 2, 1, 2);
  t.p2p_seconds = 0.5;
  t.pass_comm_seconds = 0.5;
  auto sim = simulate_pipeline(t);
  ASSERT_TRUE(sim);
  EXPECT_DOUBLE_EQ(sim->makespan, 11.5);
  for (double busy : sim->busy_seconds) EXPECT_DOUBLE_EQ(busy, 6.0);  // the exchanges are not busy time
  EXPECT_DOUBLE_EQ(sim->bubble_fraction, 5.5 / 6.0);
}

}  // namespace
}  // namespace trainplan::costmodel

namespace trainplan::costmodel {
namespace {

TEST(PartitionLayers, EvenSplitWhenTheEndsCostNothing) {
  // Megatron's split: 10 layers over 4 stages, the extra layers on the first stages.
  EXPECT_EQ(partition_layers(10, 4, 1.0, 0, 0), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(partition_layers(8, 8, 1.0, 0, 0), (std::vector<int>(8, 1)));
}

TEST(PartitionLayers, HeavyEndsGetFewerLayers) {
  // 16 layers on 4 stages, the embedding costing 0.2 layers and the head 1.5. By hand: the even
  // split {4,4,4,4} costs {4.2, 4, 4, 5.5}, max 5.5; {5,4,4,3} costs max 5.2; {4,5,4,3} costs
  // {4.2, 5, 4, 4.5}, max 5, the least possible (15 layers + 1.7 over 4 chunks needs one >= 4.2,
  // and whole layers make it 5). Ties go to the earlier chunk: {4,5,4,3}, not {4,4,5,3}.
  EXPECT_EQ(partition_layers(16, 4, 1.0, 0.2, 1.5), (std::vector<int>{4, 5, 4, 3}));
}

TEST(MicroBatchesInFlight, FollowsTheSimulatedSchedule) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kInterleaved}) {
    ParallelConfig p;
    p.pp = 4;
    p.schedule = schedule;
    p.virtual_stages = schedule == Schedule::kInterleaved ? 2 : 1;
    auto sim = simulate_pipeline(balanced(schedule, 4, p.virtual_stages, 8));
    ASSERT_TRUE(sim);
    for (int s = 0; s < 4; ++s) {
      EXPECT_DOUBLE_EQ(micro_batches_in_flight(p, s, 8), sim->peak_in_flight[s]) << schedule_name(schedule) << " stage " << s;
    }
  }
}

}  // namespace
}  // namespace trainplan::costmodel
