// PlanningSession: searches off the UI thread with progress, the newest input wins, bad input and
// impossible requests keep the last good result, and the scaling curve. Every wait has a timeout.

#include <QSignalSpy>
#include <QThread>
#include <gtest/gtest.h>

#include "gui_test_support.hpp"
#include "trainplan/gui/planning_session.hpp"

namespace trainplan {
namespace {

using gui::PlanningSession;
using gui::RequestForm;
using testing::wait_until;

constexpr int kTimeoutMs = 20000;

RequestForm form_for(const std::string& model, const std::string& gpus) {
  RequestForm form;
  form.model.ref = model;
  form.gpus = gpus;
  return form;
}

TEST(PlanningSession, SearchesOffTheUiThreadWithProgressAndGivesThePlannersResult) {
  PlanningSession session;
  QSignalSpy progress(&session, &PlanningSession::progressChanged);
  QSignalSpy results(&session, &PlanningSession::resultsChanged);
  QSignalSpy selection(&session, &PlanningSession::selectionChanged);
  const RequestForm form = form_for("llama3-70b", "64");
  ASSERT_TRUE(session.submit(form, planner::Objective::kThroughput));
  // submit() returns at once: the search runs on another thread and reports through events.
  EXPECT_TRUE(session.searching());
  EXPECT_FALSE(session.result().has_value());
  EXPECT_EQ(results.count(), 0);
  ASSERT_TRUE(results.wait(kTimeoutMs));
  ASSERT_TRUE(session.result().has_value());
  EXPECT_FALSE(session.searching());
  EXPECT_GE(progress.count(), 2);
  EXPECT_EQ(selection.count(), 1) << "the best plan is selected";

  const auto direct = planner::search(*gui::build_request(form).request, [] { planner::SearchOptions o; o.top = 25; return o; }());
  ASSERT_TRUE(direct.ok());
  ASSERT_FALSE(session.result()->ranked.empty());
  EXPECT_EQ(session.result()->evaluated, direct->evaluated);
  EXPECT_DOUBLE_EQ(session.result()->ranked.front().estimate.throughput.tokens_per_second,
                   direct->ranked.front().estimate.throughput.tokens_per_second);
  EXPECT_DOUBLE_EQ(session.selected()->estimate.time.step.value(), direct->ranked.front().estimate.time.step.value());
  EXPECT_TRUE(session.wait_idle(kTimeoutMs));
}

TEST(PlanningSession, TheNewestInputWinsAndStaleResultsAreDropped) {
  PlanningSession session;
  QSignalSpy results(&session, &PlanningSession::resultsChanged);
  ASSERT_TRUE(session.submit(form_for("llama3-405b", "16384"), planner::Objective::kThroughput));
  ASSERT_TRUE(session.submit(form_for("llama3-70b", "64"), planner::Objective::kThroughput));
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "8"), planner::Objective::kCost));
  ASSERT_TRUE(session.wait_idle(kTimeoutMs));
  EXPECT_EQ(results.count(), 1) << "only the newest input's result is shown";
  ASSERT_TRUE(session.request().has_value());
  EXPECT_EQ(session.request()->model.name, "llama3-8b");
  EXPECT_EQ(session.request()->gpus, 8);
  EXPECT_EQ(session.objective(), planner::Objective::kCost);
  for (const auto& point : session.scaling()) EXPECT_LE(point.gpus, 64) << "scaling of the newest request (8 GPUs: 1 .. 64)";
}

TEST(PlanningSession, BadInputIsReportedAndTheLastGoodResultStays) {
  PlanningSession session;
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "16"), planner::Objective::kThroughput));
  ASSERT_TRUE(session.wait_idle(kTimeoutMs));
  const auto evaluated = session.result()->evaluated;
  const double step = session.selected()->estimate.time.step.value();

  for (const char* gpus : {"0", "-16", "sixteen"}) {
    QSignalSpy errors(&session, &PlanningSession::inputErrorsChanged);
    EXPECT_FALSE(session.submit(form_for("llama3-8b", gpus), planner::Objective::kThroughput)) << gpus;
    EXPECT_EQ(errors.count(), 1);
    ASSERT_EQ(session.input_errors().size(), 1u) << gpus;
    EXPECT_EQ(session.input_errors().front().field, "gpus");
    EXPECT_FALSE(session.searching());
    EXPECT_EQ(session.result()->evaluated, evaluated) << gpus;
    EXPECT_EQ(session.request()->gpus, 16);
    EXPECT_DOUBLE_EQ(session.selected()->estimate.time.step.value(), step);
  }
  // A good input clears the errors.
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "32"), planner::Objective::kThroughput));
  EXPECT_TRUE(session.input_errors().empty());
  ASSERT_TRUE(session.wait_idle(kTimeoutMs));
  EXPECT_EQ(session.request()->gpus, 32);
}

TEST(PlanningSession, ARequestNoPlanCanSatisfyIsAnErrorAndKeepsTheLastResult) {
  PlanningSession session;
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "16"), planner::Objective::kThroughput));
  ASSERT_TRUE(session.wait_idle(kTimeoutMs));
  RequestForm impossible = form_for("llama3-8b", "64");
  impossible.global_batch = "1";  // one sequence cannot be split over the data-parallel replicas
  for (const char* axis : {"tp", "pp", "cp"}) impossible.fixed[axis] = "1";
  QSignalSpy failed(&session, &PlanningSession::searchFailed);
  ASSERT_TRUE(session.submit(impossible, planner::Objective::kThroughput));
  ASSERT_TRUE(failed.wait(kTimeoutMs));
  EXPECT_NE(session.search_error().toStdString().find("no valid plan"), std::string::npos) << session.search_error().toStdString();
  EXPECT_EQ(session.request()->gpus, 16) << "the last good result stays";
}

TEST(PlanningSession, AnInvalidPlanIsRefusedAndTheSelectionStays) {
  PlanningSession session;
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "16"), planner::Objective::kThroughput));
  ASSERT_TRUE(session.wait_idle(kTimeoutMs));
  const auto before = session.selected()->plan.parallel;
  costmodel::Plan bad = session.selected()->plan;
  bad.parallel.tp = 3;
  QSignalSpy rejected(&session, &PlanningSession::selectionRejected);
  EXPECT_FALSE(session.select_plan(bad));
  EXPECT_EQ(rejected.count(), 1);
  EXPECT_NE(session.selection_error().toStdString().find("tp(3)"), std::string::npos) << session.selection_error().toStdString();
  EXPECT_EQ(costmodel::parallel_to_json(session.selected()->plan.parallel), costmodel::parallel_to_json(before));
}

TEST(PlanningSession, ScalingCoversAnEighthToEightTimesTheGpusWithTheSameBatch) {
  EXPECT_EQ(PlanningSession::scaling_gpu_counts(64), (std::vector<int>{8, 16, 32, 64, 128, 256, 512}));
  EXPECT_EQ(PlanningSession::scaling_gpu_counts(12), (std::vector<int>{3, 6, 12, 24, 48, 96}));
  PlanningSession session;
  QSignalSpy scaling(&session, &PlanningSession::scalingChanged);
  ASSERT_TRUE(session.submit(form_for("llama3-8b", "64"), planner::Objective::kThroughput));
  ASSERT_TRUE(scaling.wait(kTimeoutMs));
  const auto& points = session.scaling();
  ASSERT_EQ(points.size(), 7u);
  const auto& here = points[3];
  EXPECT_EQ(here.gpus, 64);
  ASSERT_TRUE(here.best.has_value());
  EXPECT_DOUBLE_EQ(here.best->estimate.throughput.tokens_per_second, session.result()->ranked.front().estimate.throughput.tokens_per_second);
  for (const auto& p : points) {
    if (!p.best) continue;
    EXPECT_EQ(p.best->plan.gpus, p.gpus);
    EXPECT_EQ(p.best->plan.training.global_batch, session.request()->training.global_batch);
  }
  ASSERT_TRUE(points[4].best.has_value());
  EXPECT_GT(points[4].best->estimate.throughput.tokens_per_second, here.best->estimate.throughput.tokens_per_second) << "128 GPUs beat 64";
}

TEST(PlanningSession, AMalformedMeasurementIsAnErrorAndThePreviousOneStays) {
  PlanningSession session;
  ASSERT_TRUE(session.load_measurement(testing::gui_data_path("gui-pp4.measurement.json")).ok());
  auto bad = session.load_measurement(testing::gui_data_path("megatron2021_table1.csv"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("malformed JSON"), std::string::npos) << bad.error().message;
  ASSERT_TRUE(session.measurement().has_value());
  EXPECT_EQ(session.measurement()->name, "gui-pp4");
}

}  // namespace
}  // namespace trainplan
