// The pipeline schedule view: every forward and backward pass of the cost model's schedule is
// drawn (p * m * v * 2), the bubble shows as time a stage does not compute, and the executor's
// trace is read one rank per stage.

#include <algorithm>
#include <map>

#include <gtest/gtest.h>

#include "gui_test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/gui/schedule_view.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

// Llama 3 8B on 8 GPUs with pp stages, v chunks, global batch 16 sequences (m = 16 / dp).
Plan pipeline_plan(int pp, int v) {
  Plan plan;
  plan.model = find_model("llama3-8b").value();
  plan.cluster = find_hwprofile("dgx-h100").value();
  plan.gpus = 8;
  plan.training.global_batch = 16;
  resolve_training_defaults(plan.model, plan.training);
  plan.parallel.pp = pp;
  plan.parallel.dp = 8 / pp;
  plan.parallel.virtual_stages = v;
  plan.parallel.schedule = v > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB;
  plan.parallel.zero_stage = 1;
  EXPECT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).error().message;
  return plan;
}

struct Case {
  int pp, v, micro_batches;
};

TEST(PipelineScheduleView, DrawsEveryForwardAndBackwardPassOfTheCostModelsSchedule) {
  const Case cases[] = {{8, 1, 16}, {4, 1, 8}, {4, 2, 8}, {2, 4, 4}};
  for (const auto& c : cases) {
    const Plan plan = pipeline_plan(c.pp, c.v);
    const Estimate e = estimate(plan);
    ASSERT_EQ(e.pipeline.micro_batches, c.micro_batches);
    const auto sim = simulate_pipeline(e.pipeline);
    ASSERT_TRUE(sim.ok());
    gui::PipelineScheduleView view;
    view.resize(900, 300);
    view.set_schedule(gui::schedule_from_simulation(*sim, e.pipeline));
    const int expected = c.pp * c.micro_batches * c.v * 2;
    EXPECT_EQ(view.schedule().passes(), expected) << "pp " << c.pp << " v " << c.v;
    EXPECT_EQ(view.schedule().row_labels.size(), c.pp);
    (void)view.grab();  // paints
    EXPECT_EQ(view.painted_passes(), expected) << "pp " << c.pp << " v " << c.v;
    EXPECT_DOUBLE_EQ(view.schedule().makespan, sim->makespan);
  }
}

TEST(PipelineScheduleView, TheBubbleIsTimeAStageDoesNotCompute) {
  const Plan plan = pipeline_plan(8, 1);
  const Estimate e = estimate(plan);
  const auto sim = simulate_pipeline(e.pipeline);
  ASSERT_TRUE(sim.ok());
  const gui::ScheduleData data = gui::schedule_from_simulation(*sim, e.pipeline);
  std::map<int, double> busy;
  for (const auto& b : data.bars) busy[b.row] += b.end - b.start;
  double bubble = 0;
  for (const auto& [row, seconds] : busy) {
    EXPECT_LT(seconds, data.makespan) << "stage " << row << " idles at the start or end of the step";
    bubble += (data.makespan - seconds) / seconds;
  }
  EXPECT_NEAR(bubble / 8, sim->bubble_fraction, 1e-12);
  EXPECT_GT(sim->bubble_fraction, 0.3) << "8 stages, 16 micro-batches: (p-1)/m = 0.44 with free transfers";
  EXPECT_TRUE(data.title.contains(QString::number(100 * sim->bubble_fraction, 'f', 1))) << data.title.toStdString();
}

TEST(ScheduleFromTrace, DrawsTheLowestRankOfEachStageAndSkipsUnknownKinds) {
  planner::Trace trace;
  trace.stages = 2;
  trace.micro_batches = 2;
  trace.schedule = "1f1b";
  trace.bubble_fraction = 0.25;
  // Stage 0 on ranks 0 and 2, stage 1 on ranks 1 and 3.
  for (int rank : {2, 0, 3, 1}) {
    const int stage = rank % 2;
    for (int mb = 0; mb < 2; ++mb) {
      trace.events.push_back({rank, stage, "forward", mb, 0, 0.1 * mb + 0.1 * stage, 0.1 * mb + 0.1 * stage + 0.1});
      trace.events.push_back({rank, stage, "backward", mb, 0, 0.5 + 0.2 * mb, 0.7 + 0.2 * mb});
    }
    trace.events.push_back({rank, stage, "optimizer", -1, 0, 1.0, 1.25});
    trace.events.push_back({rank, stage, "mystery", -1, 0, 1.3, 1.4});
  }
  const gui::ScheduleData data = gui::schedule_from_trace(trace);
  EXPECT_EQ(data.passes(), 2 * 2 * 2);
  EXPECT_EQ(data.bars.size(), 2u * 5u) << "4 passes and the optimizer per stage; 'mystery' skipped";
  EXPECT_EQ(data.row_labels, (QStringList{QStringLiteral("stage 0 (rank 0)"), QStringLiteral("stage 1 (rank 1)")}));
  EXPECT_DOUBLE_EQ(data.makespan, 1.25);
  EXPECT_DOUBLE_EQ(data.bubble_fraction, 0.25);
  gui::PipelineScheduleView view;
  view.resize(600, 200);
  view.set_schedule(data);
  (void)view.grab();
  EXPECT_EQ(view.painted_passes(), 8);
}

}  // namespace
}  // namespace trainplan
