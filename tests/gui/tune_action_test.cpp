// "Measure the top plans on this machine" end to end (issue 30): the window runs `planner tune`
// of its inputs on 4 CPU ranks with the real executor in the background, the plan table's Measured
// column fills for the rows of the layouts it ran, and the report comes at the end. Built where
// the executor is (LibTorch); run alone, its runs are timed.

#include <QSignalSpy>
#include <QTemporaryDir>
#include <gtest/gtest.h>

#include <cstdlib>

#include "gui_test_support.hpp"
#include "trainplan/gui/main_window.hpp"
#include "trainplan/gui/tune_runner.hpp"

namespace trainplan {
namespace {

using gui::MainWindow;
using gui::PlanningSession;
using gui::PlanTableModel;

TEST(MeasureTheTopPlans, RunsTheTuneAndFillsTheMeasuredColumnAsRunsEnd) {
  ::setenv("TRAINPLAN_EXECUTOR", TRAINPLAN_EXECUTOR_BIN, 1);
  MainWindow window;
  window.show();
  QSignalSpy results(window.session(), &PlanningSession::resultsChanged);
  for (const auto& [field, value] : std::vector<std::pair<QString, QString>>{{QStringLiteral("model"), QStringLiteral("small-llama")},
                                                                             {QStringLiteral("gpus"), QStringLiteral("4")},
                                                                             {QStringLiteral("seq_len"), QStringLiteral("64")},
                                                                             {QStringLiteral("global_batch"), QStringLiteral("16")},
                                                                             {QStringLiteral("precision"), QStringLiteral("fp32")}}) {
    ASSERT_TRUE(window.input_panel()->set_field(field, value)) << field.toStdString();
  }
  ASSERT_TRUE(results.wait(60000));
  ASSERT_TRUE(window.session()->wait_idle(60000));

  QTemporaryDir dir;
  QSignalSpy changed(window.tune_runner(), &gui::TuneRunner::candidatesChanged);
  QSignalSpy done(window.tune_runner(), &gui::TuneRunner::finished);
  ASSERT_TRUE(window.measure_top_plans(dir.path() + QStringLiteral("/tune"), 2)) << window.last_error().toStdString();
  EXPECT_TRUE(window.tune_runner()->running());
  EXPECT_FALSE(window.measure_top_plans(dir.path() + QStringLiteral("/again"), 2)) << "a second measurement while one runs";
  ASSERT_TRUE(done.wait(240000)) << "the tune did not end";
  EXPECT_GE(changed.count(), 2) << "the candidates reached the window as the runs ended, not once at the end";
  EXPECT_TRUE(done.at(0).at(1).toBool()) << done.at(0).at(0).toString().toStdString();
  EXPECT_TRUE(done.at(0).at(0).toString().contains(QStringLiteral("Choice:"))) << done.at(0).at(0).toString().toStdString();

  // Every measured candidate whose layout has a row shows its step there.
  PlanTableModel* model = window.plan_model();
  int shown = 0;
  for (const auto& c : window.tune_runner()->candidates()) {
    if (c.status != planner::RunStatus::kMeasured) continue;
    for (int r = 0; r < model->row_count(); ++r) {
      if (model->row_at(r).variant_of > 0 || !planner::same_layout(model->row_at(r).candidate.plan.parallel, c.plan.parallel)) continue;
      EXPECT_DOUBLE_EQ(model->data(model->index(r, PlanTableModel::kMeasured), gui::kValueRole).toDouble(), *c.measured);
      ++shown;
    }
  }
  EXPECT_GE(shown, 1) << "no row of a measured layout";
}

}  // namespace
}  // namespace trainplan
