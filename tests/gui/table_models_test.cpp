// The item models: they pass QAbstractItemModelTester, name a unit in every quantity header,
// sort by value, filter fitting plans, and show the estimate's own numbers.

#include <cmath>
#include <stdexcept>
#include <string>

#include <QAbstractItemModelTester>
#include <gtest/gtest.h>

#include "gui_test_support.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/gui/request_form.hpp"
#include "trainplan/gui/table_models.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

using gui::BreakdownModel;
using gui::kValueRole;
using gui::PlanFilterProxy;
using gui::PlanTableModel;

planner::SearchResult search_for(const std::string& model, const std::string& gpus) {
  gui::RequestForm form;
  form.model.ref = model;
  form.gpus = gpus;
  auto built = gui::build_request(form);
  if (!built.request) throw std::runtime_error(built.errors.front().message);
  auto result = planner::search(*built.request);
  if (!result) throw std::runtime_error(result.error().message);
  return std::move(result).value();
}

// The models are checked while they are filled, cleared and refilled.
TEST(ItemModels, PassQAbstractItemModelTester) {
  testing::QtWarnings warnings;
  const auto result = search_for("llama3-70b", "16");
  PlanTableModel plans;
  PlanFilterProxy proxy;
  proxy.setSourceModel(&plans);
  BreakdownModel memory(BreakdownModel::Kind::kMemory), time(BreakdownModel::Kind::kTime);
  gui::ScalingModel scaling;
  gui::ComparisonModel comparison;
  const auto mode = QAbstractItemModelTester::FailureReportingMode::Warning;
  QAbstractItemModelTester t1(&plans, mode), t2(&proxy, mode), t3(&memory, mode), t4(&time, mode), t5(&scaling, mode), t6(&comparison, mode);

  plans.set_result(result);
  proxy.set_fits_only(true);
  proxy.sort(PlanTableModel::kTokensPerSecond, Qt::DescendingOrder);
  proxy.set_fits_only(false);
  const auto& best = result.ranked.front();
  memory.set_estimate(best.estimate, nullptr);
  time.set_estimate(best.estimate, nullptr);
  scaling.set_points({{8, std::nullopt}, {16, best}});
  comparison.set_comparison(planner::compare(planner::predict(best.plan, "p"), planner::predict(best.plan, "m")));
  plans.clear();
  memory.clear();
  scaling.set_points({});
  comparison.set_comparison(std::nullopt);
  plans.set_result(result);

  EXPECT_TRUE(warnings.messages().isEmpty()) << warnings.messages().join(QStringLiteral("\n")).toStdString();
  EXPECT_EQ(plans.rowCount(), static_cast<int>(result.ranked.size() + result.alternatives.size()));
}

// issue 30: each ranked row is a distinct layout; its other micro-batch, virtual-stage and
// schedule variants fold under it and open (and fold again) on request, right under their layout
// when sorted by rank, checked by QAbstractItemModelTester through the proxy.
TEST(PlanTableModel, FoldsALayoutsVariantsUnderItAndOpensThem) {
  testing::QtWarnings warnings;
  const auto result = search_for("llama3-70b", "128");
  PlanTableModel plans;
  PlanFilterProxy proxy;
  proxy.setSourceModel(&plans);
  QAbstractItemModelTester tester(&proxy, QAbstractItemModelTester::FailureReportingMode::Warning);
  plans.set_result(result);
  proxy.sort(PlanTableModel::kRank, Qt::AscendingOrder);
  const int rows = plans.rowCount();
  ASSERT_GT(result.variants.at(0).count, 1);
  const int shown = static_cast<int>(result.variants.at(0).best.size());
  EXPECT_EQ(plans.data(plans.index(0, PlanTableModel::kVariants), kValueRole).toInt(), result.variants.at(0).count - 1);
  EXPECT_TRUE(plans.data(plans.index(0, PlanTableModel::kVariants)).toString().contains(QStringLiteral("+")));
  for (int r = 0; r + 1 < static_cast<int>(result.ranked.size()); ++r) {
    EXPECT_FALSE(planner::same_layout(plans.row_at(r).candidate.plan.parallel, plans.row_at(r + 1).candidate.plan.parallel)) << r;
  }

  ASSERT_TRUE(plans.toggle_variants(0));
  EXPECT_EQ(plans.rowCount(), rows + shown);
  for (int i = 1; i <= shown; ++i) {
    const gui::PlanRow& v = plans.row_at(i);
    EXPECT_EQ(v.variant_of, 1);
    EXPECT_TRUE(planner::same_layout(v.candidate.plan.parallel, plans.row_at(0).candidate.plan.parallel));
    // Through the proxy, sorted by rank: the variants come right after their layout's row.
    EXPECT_EQ(proxy.mapToSource(proxy.index(i, 0)).row(), i);
  }
  EXPECT_FALSE(plans.toggle_variants(1)) << "a variant row has nothing folded under it";
  ASSERT_TRUE(plans.toggle_variants(0));
  EXPECT_EQ(plans.rowCount(), rows);
  EXPECT_TRUE(warnings.messages().isEmpty()) << warnings.messages().join(QStringLiteral("\n")).toStdString();
}

TEST(PlanTableModel, EveryQuantityHeaderNamesItsUnit) {
  PlanTableModel plans;
  const auto header = [&](int column) { return plans.headerData(column, Qt::Horizontal).toString().toStdString(); };
  EXPECT_EQ(header(PlanTableModel::kMemory), "Memory / GPU (GiB)");
  EXPECT_EQ(header(PlanTableModel::kCapacity), "Capacity (GiB)");
  EXPECT_EQ(header(PlanTableModel::kStepTime), "Step time (s)");
  EXPECT_EQ(header(PlanTableModel::kTokensPerSecond), "Throughput (tokens/s)");
  EXPECT_EQ(header(PlanTableModel::kMfu), "MFU (%)");
  EXPECT_EQ(header(PlanTableModel::kDays), "Training time (days)");
  EXPECT_EQ(header(PlanTableModel::kCost), "Cost (USD)");
  EXPECT_EQ(header(PlanTableModel::kMicroBatch), "Micro-batch (seq)");
  BreakdownModel memory(BreakdownModel::Kind::kMemory), time(BreakdownModel::Kind::kTime);
  EXPECT_EQ(memory.headerData(BreakdownModel::kPredicted, Qt::Horizontal).toString(), QStringLiteral("Predicted (GiB)"));
  EXPECT_EQ(time.headerData(BreakdownModel::kMeasured, Qt::Horizontal).toString(), QStringLiteral("Measured (s)"));
}

TEST(PlanTableModel, ShowsTheEstimatesNumbersAlignedRight) {
  const auto result = search_for("llama3-8b", "16");
  PlanTableModel plans;
  plans.set_result(result);
  const auto& e = result.ranked.front().estimate;
  const QModelIndex memory = plans.index(0, PlanTableModel::kMemory);
  // The memory a plan needs: the allocator's reserve plus the CUDA context (what must fit).
  EXPECT_DOUBLE_EQ(plans.data(memory, kValueRole).toDouble(), e.memory.required.in_gib());
  EXPECT_EQ(plans.data(memory).toString(), QString::number(e.memory.required.in_gib(), 'f', 1));
  EXPECT_DOUBLE_EQ(plans.data(plans.index(0, PlanTableModel::kStepTime), kValueRole).toDouble(), e.time.step.value());
  EXPECT_EQ(plans.data(memory, Qt::TextAlignmentRole).value<Qt::Alignment>() & Qt::AlignRight, Qt::AlignRight);
  EXPECT_EQ(plans.data(plans.index(0, PlanTableModel::kRank)).toString(), QStringLiteral("1"));
}

TEST(PlanFilterProxy, SortsByValueAndFitsOnlyHidesPlansThatDoNotFit) {
  const auto result = search_for("llama3-70b", "16");
  PlanTableModel plans;
  plans.set_result(result);
  int fitting = 0, not_fitting = 0;
  for (int r = 0; r < plans.row_count(); ++r) (plans.row_at(r).candidate.estimate.fits ? fitting : not_fitting)++;
  ASSERT_GT(fitting, 0);
  ASSERT_GT(not_fitting, 0) << "the test needs shapes that do not fit";

  PlanFilterProxy proxy;
  proxy.setSourceModel(&plans);
  proxy.sort(PlanTableModel::kTokensPerSecond, Qt::DescendingOrder);
  for (int r = 1; r < proxy.rowCount(); ++r) {
    EXPECT_GE(proxy.index(r - 1, PlanTableModel::kTokensPerSecond).data(kValueRole).toDouble(),
              proxy.index(r, PlanTableModel::kTokensPerSecond).data(kValueRole).toDouble())
        << "row " << r;
  }
  EXPECT_EQ(proxy.rowCount(), fitting + not_fitting);
  proxy.set_fits_only(true);
  EXPECT_EQ(proxy.rowCount(), fitting);
  for (int r = 0; r < proxy.rowCount(); ++r) {
    const QString fits = proxy.index(r, PlanTableModel::kFits).data().toString();
    const bool tight = proxy.mapToSource(proxy.index(r, 0)).isValid() && plans.row_at(proxy.mapToSource(proxy.index(r, 0)).row()).candidate.estimate.tight;
    EXPECT_EQ(fits, tight ? QStringLiteral("tight") : QStringLiteral("yes")) << "row " << r;
  }
}

TEST(BreakdownModel, PartsAddUpToTheEstimateAndMeasuredValuesSitBeside) {
  const auto result = search_for("llama3-8b", "16");
  const auto& e = result.ranked.front().estimate;
  planner::PerformanceDocument measured;
  measured.memory["weights_bytes"] = 2.0 * 1073741824.0;
  measured.time["compute_seconds"] = 0.5;
  BreakdownModel memory(BreakdownModel::Kind::kMemory), time(BreakdownModel::Kind::kTime);
  memory.set_estimate(e, &measured);
  time.set_estimate(e, &measured);
  double memory_sum = 0, time_sum = 0;
  for (const auto& p : memory.parts()) memory_sum += p.predicted;
  for (const auto& p : time.parts()) time_sum += p.predicted;
  // Tensors, then the allocator's cache and the CUDA context: what the plan requires.
  EXPECT_NEAR(memory_sum, e.memory.required.in_gib(), 1e-9 * e.memory.required.in_gib());
  EXPECT_NEAR(time_sum, e.time.step.value(), 1e-9 * e.time.step.value());
  EXPECT_DOUBLE_EQ(memory.capacity(), e.memory.capacity.in_gib());
  EXPECT_EQ(memory.parts()[0].key, "weights_bytes");
  EXPECT_DOUBLE_EQ(*memory.parts()[0].measured, 2.0);
  EXPECT_FALSE(memory.parts()[1].measured.has_value());
  EXPECT_EQ(memory.data(memory.index(1, BreakdownModel::kMeasured)).toString(), QStringLiteral("not measured"));
  EXPECT_DOUBLE_EQ(*time.parts()[0].measured, 0.5);
  // The last row is the total.
  const int total_row = memory.rowCount() - 1;
  EXPECT_EQ(memory.data(memory.index(total_row, BreakdownModel::kPart)).toString(), QStringLiteral("total"));
  EXPECT_DOUBLE_EQ(memory.data(memory.index(total_row, BreakdownModel::kPredicted), kValueRole).toDouble(), e.memory.required.in_gib());
}

}  // namespace
}  // namespace trainplan
