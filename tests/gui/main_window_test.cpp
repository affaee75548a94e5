// The main window end to end (offscreen): selecting a plan updates every view, a knob re-estimates
// to the cost model's value, bad input and bad files leave the last good result and say why, the
// measurement overlays the prediction, the exports are files the planner reads back, and the
// Launch and CLI tab shows the planner's export of the selected plan for each stack.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <QCheckBox>
#include <QComboBox>
#include <QFile>
#include <QImage>
#include <QLabel>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTableView>
#include <QTemporaryDir>
#include <gtest/gtest.h>

#include "gui_test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/gui/launch_panel.hpp"
#include "trainplan/gui/main_window.hpp"
#include "trainplan/gui/tune_runner.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

using gui::MainWindow;
using gui::PlanningSession;
using gui::PlanTableModel;

constexpr int kTimeoutMs = 20000;

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

class MainWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    window_.resize(1500, 950);
    window_.show();
  }
  // Sets fields as typed, then waits for the search they start.
  void search(const std::vector<std::pair<QString, QString>>& fields) {
    QSignalSpy results(window_.session(), &PlanningSession::resultsChanged);
    for (const auto& [field, value] : fields) ASSERT_TRUE(window_.input_panel()->set_field(field, value)) << field.toStdString();
    ASSERT_TRUE(results.wait(kTimeoutMs));
    ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  }
  const planner::Candidate& selected() const { return *window_.session()->selected(); }
  // Opens a plan file and waits for its search; the file's layout ends up selected.
  void open(const std::string& path) {
    QSignalSpy results(window_.session(), &PlanningSession::resultsChanged);
    ASSERT_TRUE(window_.open_plan(QString::fromStdString(path))) << window_.last_error().toStdString();
    ASSERT_TRUE(results.wait(kTimeoutMs));
    ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  }
  MainWindow window_;
};

TEST_F(MainWindowTest, SelectingAPlanUpdatesEveryView) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}, {QStringLiteral("fix/pp"), QStringLiteral("2")}});
  gui::PlanFilterProxy* proxy = window_.plan_proxy();
  ASSERT_GE(proxy->rowCount(), 3);
  QSignalSpy updated(&window_, &MainWindow::viewsUpdated);
  window_.plan_table()->setCurrentIndex(proxy->index(2, 0));
  ASSERT_EQ(updated.count(), 1);
  const auto& row = window_.plan_model()->row_at(proxy->mapToSource(proxy->index(2, 0)).row());
  const costmodel::Plan& plan = row.candidate.plan;
  EXPECT_EQ(costmodel::parallel_to_json(selected().plan.parallel), costmodel::parallel_to_json(plan.parallel));

  // Every view shows this plan, with the cost model's numbers.
  const costmodel::Estimate e = costmodel::estimate(plan);
  EXPECT_LT(relative(window_.memory_chart()->bar_total(0), e.memory.required.in_gib()), 1e-9);
  EXPECT_DOUBLE_EQ(window_.memory_chart()->capacity_line(), e.memory.capacity.in_gib());
  EXPECT_LT(relative(window_.time_chart()->bar_total(0), e.time.step.value()), 1e-9);
  const int passes = 2 * plan.parallel.pp * e.micro_batches * plan.parallel.virtual_stages;
  EXPECT_EQ(window_.schedule_view()->schedule().passes(), passes);
  window_.show_tab(MainWindow::kPipelineTab);
  (void)window_.schedule_view()->grab();
  EXPECT_EQ(window_.schedule_view()->painted_passes(), passes);
  EXPECT_EQ(window_.what_if_panel()->findChild<QSpinBox*>(QStringLiteral("whatif/tp"))->value(), plan.parallel.tp);
  EXPECT_EQ(window_.what_if_panel()->findChild<QSpinBox*>(QStringLiteral("whatif/mb"))->value(), plan.parallel.micro_batch);
  EXPECT_TRUE(window_.summary_label()->text().contains(gui::layout_text(plan.parallel).toHtmlEscaped()));
  EXPECT_EQ(window_.plan_table()->selectionModel()->selectedRows().size(), 1);
  EXPECT_EQ(window_.plan_table()->selectionModel()->selectedRows().front().row(), 2);
}

TEST_F(MainWindowTest, EditingAKnobUpdatesTheEstimateToTheCostModelsValue) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}, {QStringLiteral("fix/tp"), QStringLiteral("1")}});
  const costmodel::Plan before = selected().plan;
  ASSERT_EQ(before.parallel.tp, 1);
  costmodel::Plan expected = before;
  expected.parallel.tp = 2;
  expected.parallel.dp = before.gpus / (2 * before.parallel.pp * before.parallel.cp);  // "keep the GPU count" is on
  ASSERT_TRUE(costmodel::validate_plan(expected).ok());
  const costmodel::Estimate e = costmodel::estimate(expected);

  QSignalSpy updated(&window_, &MainWindow::viewsUpdated);
  ASSERT_TRUE(window_.what_if_panel()->set_knob(QStringLiteral("tp"), QStringLiteral("2")));
  EXPECT_EQ(updated.count(), 1) << "at once, no search";
  EXPECT_EQ(costmodel::parallel_to_json(selected().plan.parallel), costmodel::parallel_to_json(expected.parallel));
  EXPECT_DOUBLE_EQ(selected().estimate.time.step.value(), e.time.step.value());
  EXPECT_NE(e.time.step.value(), costmodel::estimate(before).time.step.value());
  EXPECT_LT(relative(window_.time_chart()->bar_total(0), e.time.step.value()), 1e-9);
  EXPECT_LT(relative(window_.memory_chart()->bar_total(0), e.memory.required.in_gib()), 1e-9);

  // A knob that makes the plan too big says why it stops fitting.
  ASSERT_TRUE(window_.what_if_panel()->set_knob(QStringLiteral("mb"), QStringLiteral("32")));
  if (!selected().estimate.fits) {
    EXPECT_TRUE(window_.what_if_panel()->status_text().startsWith(QStringLiteral("Does not fit: ")));
    EXPECT_TRUE(window_.what_if_panel()->status_text().contains(QStringLiteral("GiB"))) << window_.what_if_panel()->status_text().toStdString();
  } else {
    EXPECT_TRUE(window_.what_if_panel()->status_text().startsWith(QStringLiteral("Fits: ")));
  }
}

TEST_F(MainWindowTest, ShardingAndReductionKnobsReachTheEstimate) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}, {QStringLiteral("fix/tp"), QStringLiteral("1")},
          {QStringLiteral("fix/pp"), QStringLiteral("1")}});
  struct Edit {
    const char* knob;
    const char* value;
    void (*apply)(costmodel::ParallelConfig&);
  };
  const Edit edits[] = {
      {"zero", "3", [](costmodel::ParallelConfig& p) { p.zero_stage = 3; }},
      {"overlap_grad_reduce", "off", [](costmodel::ParallelConfig& p) { p.overlap_grad_reduce = false; }},
      {"reduce_dtype", "bf16", [](costmodel::ParallelConfig& p) { p.reduce_dtype = costmodel::Dtype::kBf16; }},
      {"prefetch", "off", [](costmodel::ParallelConfig& p) { p.prefetch = false; }},
      {"fsdp_wrap_min_params", "1000000000", [](costmodel::ParallelConfig& p) { p.fsdp_wrap_min_params = 1000000000; }},
      {"offload_params", "cpu", [](costmodel::ParallelConfig& p) { p.offload_params = costmodel::Offload::kCpu; }},
  };
  for (const Edit& edit : edits) {
    costmodel::Plan expected = selected().plan;
    edit.apply(expected.parallel);
    ASSERT_TRUE(costmodel::validate_plan(expected).ok()) << edit.knob;
    const costmodel::Estimate e = costmodel::estimate(expected);
    ASSERT_TRUE(window_.what_if_panel()->set_knob(QString::fromUtf8(edit.knob), QString::fromUtf8(edit.value))) << edit.knob;
    EXPECT_EQ(costmodel::parallel_to_json(selected().plan.parallel), costmodel::parallel_to_json(expected.parallel)) << edit.knob;
    EXPECT_DOUBLE_EQ(selected().estimate.time.step.value(), e.time.step.value()) << edit.knob;
    EXPECT_DOUBLE_EQ(selected().estimate.memory.total.value(), e.memory.total.value()) << edit.knob;
  }
  EXPECT_FALSE(window_.what_if_panel()->set_knob(QStringLiteral("reduce_dtype"), QStringLiteral("int4")));
}

// The embedding and the loss counted in the pipeline split (Megatron-Core's
// --account-for-embedding/loss-in-pipeline-split): a fixed field, a knob, kept by a plan file,
// and drawn. TinyLlama's 22 layers + 2 over 4 stages of 3 chunks: 2 places each, so the first
// chunk holds the embedding and a layer, the last a layer and the loss, the others 2 layers.
TEST_F(MainWindowTest, TheEndsInThePipelineSplitAreAFieldAKnobAndDrawn) {
  search({{QStringLiteral("model"), QStringLiteral("tinyllama-1.1b")}, {QStringLiteral("gpus"), QStringLiteral("8")},
          {QStringLiteral("stack"), QStringLiteral("megatron-te")}, {QStringLiteral("fix/tp"), QStringLiteral("1")},
          {QStringLiteral("fix/pp"), QStringLiteral("4")}, {QStringLiteral("fix/v"), QStringLiteral("3")},
          {QStringLiteral("fix/ends_in_split"), QStringLiteral("on")}});
  ASSERT_TRUE(selected().plan.parallel.ends_in_split);
  std::vector<int> two_each(12, 2);
  two_each.front() = two_each.back() = 1;
  EXPECT_EQ(selected().estimate.pipeline.chunk_layers, two_each);
  // The drawing: stage 0's embedding chunk is shorter than its other chunks, each as the estimate's.
  const auto& schedule = window_.session()->schedule();
  ASSERT_TRUE(schedule.has_value());
  const costmodel::PipelineTimeline& t = selected().estimate.pipeline;
  int drawn = 0;
  for (const auto& pass : schedule->passes) {
    if (pass.stage != 0 || pass.pass.kind != costmodel::PassKind::kForward) continue;
    EXPECT_NEAR(pass.end - pass.start, t.chunk_forward_seconds(pass.pass.chunk * t.stages), 1e-12);
    ++drawn;
  }
  EXPECT_EQ(drawn, 3 * t.micro_batches);
  EXPECT_NEAR(t.chunk_forward_seconds(0) / t.chunk_forward_seconds(t.stages),
              (t.layer_forward_seconds + t.embedding_forward_seconds) / (2 * t.layer_forward_seconds), 1e-12);
  EXPECT_LT(t.chunk_forward_seconds(0), 0.6 * t.chunk_forward_seconds(t.stages));

  // A plan file keeps it: its input shows it, and the re-plan keeps it.
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString path = dir.filePath(QStringLiteral("split.plan.json"));
  ASSERT_TRUE(window_.export_plan_json(path)) << window_.last_error().toStdString();
  ASSERT_TRUE(window_.input_panel()->set_field(QStringLiteral("fix/ends_in_split"), QStringLiteral("auto")));
  ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  open(path.toStdString());
  EXPECT_EQ(window_.input_panel()->field_text(QStringLiteral("fix/ends_in_split")), QStringLiteral("on"));
  ASSERT_TRUE(selected().plan.parallel.ends_in_split);

  // The knob turns it off: the estimate is the cost model's of the plan without it.
  costmodel::Plan expected = selected().plan;
  expected.parallel.ends_in_split = false;
  ASSERT_TRUE(window_.what_if_panel()->set_knob(QStringLiteral("ends_in_split"), QStringLiteral("off")));
  EXPECT_FALSE(selected().plan.parallel.ends_in_split);
  EXPECT_DOUBLE_EQ(selected().estimate.time.step.value(), costmodel::estimate(expected).time.step.value());
  EXPECT_EQ(std::accumulate(selected().estimate.pipeline.chunk_layers.begin(), selected().estimate.pipeline.chunk_layers.end(), 0), 22);
  EXPECT_GE(*std::min_element(selected().estimate.pipeline.chunk_layers.begin(), selected().estimate.pipeline.chunk_layers.end()), 1);

  // A plan file without the split opens with it off (the plan runs without it), not "auto", so a
  // re-plan cannot turn it on.
  const QString off = dir.filePath(QStringLiteral("off.plan.json"));
  ASSERT_TRUE(window_.export_plan_json(off)) << window_.last_error().toStdString();
  ASSERT_TRUE(window_.input_panel()->set_field(QStringLiteral("fix/ends_in_split"), QStringLiteral("on")));
  ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  open(off.toStdString());
  EXPECT_EQ(window_.input_panel()->field_text(QStringLiteral("fix/ends_in_split")), QStringLiteral("off"));
  EXPECT_FALSE(selected().plan.parallel.ends_in_split);
}

TEST_F(MainWindowTest, AnInvalidKnobShowsTheValidateErrorAndKeepsTheLastEstimate) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  const double step = selected().estimate.time.step.value();
  const auto layout = costmodel::parallel_to_json(selected().plan.parallel);
  ASSERT_TRUE(window_.what_if_panel()->set_knob(QStringLiteral("tp"), QStringLiteral("3")));
  const std::string status = window_.what_if_panel()->status_text().toStdString();
  EXPECT_NE(status.find("Invalid plan: "), std::string::npos) << status;
  EXPECT_NE(status.find("tp(3)"), std::string::npos) << status;
  EXPECT_DOUBLE_EQ(selected().estimate.time.step.value(), step);
  EXPECT_EQ(costmodel::parallel_to_json(selected().plan.parallel), layout);
  EXPECT_LT(relative(window_.time_chart()->bar_total(0), step), 1e-9);
}

TEST_F(MainWindowTest, InvalidInputIsMarkedAtItsFieldAndTheLastResultStays) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  const int rows = window_.plan_model()->rowCount();
  const double step = selected().estimate.time.step.value();
  const struct {
    QString field, value, fragment;
  } cases[] = {
      {QStringLiteral("gpus"), QStringLiteral("0"), QStringLiteral("must be a positive number")},
      {QStringLiteral("gpus"), QStringLiteral("-16"), QStringLiteral("must be a positive number")},
      {QStringLiteral("gpus"), QStringLiteral("lots"), QStringLiteral("is not a number")},
      {QStringLiteral("model/layers"), QStringLiteral("-1"), QStringLiteral("must be")},
      {QStringLiteral("cluster/gpu/hbm_capacity_gib"), QStringLiteral("-80"), QStringLiteral("must be")},
      {QStringLiteral("fix/tp"), QStringLiteral("3"), QStringLiteral("must divide heads (32)")},
      {QStringLiteral("global_batch"), QStringLiteral("-5"), QStringLiteral("must be a positive number")},
      {QStringLiteral("seq_len"), QStringLiteral("4Q"), QStringLiteral("unknown suffix")},
  };
  for (const auto& c : cases) {
    QSignalSpy errors(window_.session(), &PlanningSession::inputErrorsChanged);
    const QString good = window_.input_panel()->field_text(c.field);
    ASSERT_TRUE(window_.input_panel()->set_field(c.field, c.value));
    ASSERT_TRUE(errors.wait(kTimeoutMs)) << c.field.toStdString();
    const QString shown = window_.input_panel()->error_text(c.field);
    EXPECT_TRUE(shown.contains(c.fragment)) << c.field.toStdString() << " = " << c.value.toStdString() << ": " << shown.toStdString();
    EXPECT_TRUE(window_.status_label()->text().contains(QStringLiteral("last valid input"))) << window_.status_label()->text().toStdString();
    EXPECT_EQ(window_.plan_model()->rowCount(), rows);
    EXPECT_EQ(window_.session()->request()->gpus, 16);
    EXPECT_DOUBLE_EQ(selected().estimate.time.step.value(), step);
    // Back to the good value: the mark goes away.
    QSignalSpy again(window_.session(), &PlanningSession::resultsChanged);
    ASSERT_TRUE(window_.input_panel()->set_field(c.field, good));
    ASSERT_TRUE(again.wait(kTimeoutMs));
    EXPECT_TRUE(window_.input_panel()->error_text(c.field).isEmpty()) << c.field.toStdString();
  }
}

// Issue 14: Load model takes a Hugging Face config.json as well (tests/data/hf/README.md cites it);
// Gemma 7B's head_dim 256 (16 x 256 != hidden 3072) reaches the search, and an unsupported
// model_type is a message naming it, the last result kept.
TEST_F(MainWindowTest, LoadModelAcceptsAHuggingFaceConfig) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  const std::string path = std::string(TRAINPLAN_TEST_DATA_DIR) + "/hf/gemma-7b.json";
  QSignalSpy results(window_.session(), &PlanningSession::resultsChanged);
  ASSERT_TRUE(window_.load_model_file(QString::fromStdString(path))) << window_.last_error().toStdString();
  ASSERT_TRUE(results.wait(kTimeoutMs));
  ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  ASSERT_TRUE(window_.session()->request().has_value());
  const costmodel::ModelSpec& m = window_.session()->request()->model;
  EXPECT_EQ(m.name, "gemma-7b");
  EXPECT_EQ(m.head_dim(), 256);
  auto expected = costmodel::find_model(path);
  ASSERT_TRUE(expected) << expected.error().message;
  EXPECT_DOUBLE_EQ(costmodel::count_parameters(m).total(m.layers), costmodel::count_parameters(*expected).total(expected->layers));
  EXPECT_GT(window_.plan_model()->rowCount(), 0);

  QTemporaryDir dir;
  const QString bert = dir.filePath(QStringLiteral("bert.json"));
  {
    std::ofstream out(bert.toStdString());
    out << R"({"model_type": "bert", "hidden_size": 768})";
  }
  const int rows = window_.plan_model()->rowCount();
  EXPECT_FALSE(window_.load_model_file(bert));
  EXPECT_TRUE(window_.last_error().contains(QStringLiteral("/model_type: \"bert\" is not supported"))) << window_.last_error().toStdString();
  EXPECT_EQ(window_.plan_model()->rowCount(), rows);
}

TEST_F(MainWindowTest, AMalformedJsonFileShowsAnErrorMessageNotACrash) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("8")}});
  const auto evaluated = window_.session()->result()->evaluated;
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString malformed = dir.filePath(QStringLiteral("broken.json"));
  {
    std::ofstream out(malformed.toStdString());
    out << "{\"schema\": \"trainplan/plan/v1\", \"model\": ";
  }
  using Load = bool (MainWindow::*)(const QString&);
  const std::pair<const char*, Load> loads[] = {{"plan", &MainWindow::open_plan},
                                                {"model", &MainWindow::load_model_file},
                                                {"measurement", &MainWindow::load_measurement}};
  for (const auto& [what, load] : loads) {
    window_.error_dialog()->hide();
    EXPECT_FALSE((window_.*load)(malformed)) << what;
    EXPECT_TRUE(window_.error_dialog()->isVisible()) << what;
    EXPECT_FALSE(window_.error_dialog()->isModal()) << what;
    const std::string text = window_.error_dialog()->text().toStdString();
    EXPECT_NE(text.find("malformed JSON"), std::string::npos) << what << ": " << text;
    EXPECT_NE(text.find("broken.json"), std::string::npos) << what << ": " << text;
    EXPECT_EQ(window_.last_error(), window_.error_dialog()->text());
  }
  const QString unknown = dir.filePath(QStringLiteral("unknown.json"));
  {
    std::ofstream out(unknown.toStdString());
    out << R"({"schema": "trainplan/plan/v1", "name": "x", "model": "llama9-1t", "cluster": "dgx-h100", "gpus": 8})";
  }
  EXPECT_FALSE(window_.open_plan(unknown));
  EXPECT_TRUE(window_.error_dialog()->text().contains(QStringLiteral("unknown model \"llama9-1t\""))) << window_.last_error().toStdString();
  EXPECT_FALSE(window_.open_plan(dir.filePath(QStringLiteral("missing.json"))));
  EXPECT_TRUE(window_.last_error().contains(QStringLiteral("cannot open file"))) << window_.last_error().toStdString();
  QCoreApplication::processEvents();
  EXPECT_EQ(window_.session()->result()->evaluated, evaluated) << "the last result stays";
  EXPECT_FALSE(window_.session()->measurement().has_value());
}

TEST_F(MainWindowTest, FitsOnlyHidesThePlansThatDoNotFit) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-70b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  int fitting = 0;
  for (int r = 0; r < window_.plan_model()->row_count(); ++r) fitting += window_.plan_model()->row_at(r).candidate.estimate.fits ? 1 : 0;
  ASSERT_LT(fitting, window_.plan_model()->row_count()) << "the test needs plans that do not fit";
  window_.fits_only_box()->setChecked(true);
  EXPECT_EQ(window_.plan_proxy()->rowCount(), fitting);
  window_.fits_only_box()->setChecked(false);
  EXPECT_EQ(window_.plan_proxy()->rowCount(), window_.plan_model()->row_count());
}

// issue 30, "Measure the top plans": the runs are this machine's CPU ranks, so a model they cannot
// train is refused with the reason and nothing starts; the Measured column shows what a tune's
// candidates measured (or their status) on the rows of their layouts.
TEST_F(MainWindowTest, MeasureTheTopPlansRefusesWhatCpuRanksCannotRunAndFillsTheMeasuredColumn) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-70b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  QTemporaryDir dir;
  EXPECT_FALSE(window_.measure_top_plans(dir.path() + QStringLiteral("/tune-70b")));
  EXPECT_TRUE(window_.last_error().contains(QStringLiteral("CPU ranks"))) << window_.last_error().toStdString();
  EXPECT_FALSE(window_.tune_runner()->running());

  PlanTableModel* model = window_.plan_model();
  ASSERT_GE(model->row_count(), 3);
  planner::TuneCandidate measured, failed;
  measured.plan = model->row_at(0).candidate.plan;
  measured.status = planner::RunStatus::kMeasured;
  measured.measured = 61.25;
  failed.plan = model->row_at(1).candidate.plan;
  failed.status = planner::RunStatus::kOutOfMemory;
  model->set_tune({measured, failed});
  EXPECT_EQ(model->data(model->index(0, PlanTableModel::kMeasured)).toString(), QStringLiteral("61.250"));
  EXPECT_DOUBLE_EQ(model->data(model->index(0, PlanTableModel::kMeasured), gui::kValueRole).toDouble(), 61.25);
  EXPECT_EQ(model->data(model->index(1, PlanTableModel::kMeasured)).toString(), QStringLiteral("out_of_memory"));
  EXPECT_EQ(model->data(model->index(2, PlanTableModel::kMeasured)).toString(), QString());
}

// tests/data/gui-pp4.*: a plan and a hand-written measurement in the executor's shape (see its
// "source"), with a trace of 4 stages x 8 micro-batches.
TEST_F(MainWindowTest, AMeasurementIsOverlaidOnMemoryTimeAndThePipelineTimeline) {
  QSignalSpy results(window_.session(), &PlanningSession::resultsChanged);
  ASSERT_TRUE(window_.open_plan(QString::fromStdString(testing::gui_data_path("gui-pp4.plan.json"))));
  ASSERT_TRUE(results.wait(kTimeoutMs));
  ASSERT_TRUE(window_.session()->wait_idle(kTimeoutMs));
  EXPECT_EQ(selected().plan.parallel.pp, 4);
  EXPECT_EQ(selected().plan.model.layers, 8);
  EXPECT_EQ(window_.input_panel()->field_text(QStringLiteral("fix/pp")), QStringLiteral("4"));

  ASSERT_TRUE(window_.load_measurement(QString::fromStdString(testing::gui_data_path("gui-pp4.measurement.json"))));
  const auto& m = *window_.session()->measurement();
  EXPECT_EQ(window_.memory_chart()->categories(), (QStringList{QStringLiteral("Predicted"), QStringLiteral("Measured")}));
  EXPECT_LT(relative(window_.memory_chart()->bar_total(1), m.memory.at("total_bytes") / 1073741824.0), 1e-9);
  EXPECT_LT(relative(window_.memory_chart()->bar_total(0), selected().estimate.memory.required.in_gib()), 1e-9);
  EXPECT_LT(relative(window_.time_chart()->bar_total(1), m.time.at("step_seconds")), 1e-9);
  EXPECT_TRUE(window_.measured_schedule_view()->isVisibleTo(&window_) || window_.measured_schedule_view()->isVisibleTo(window_.measured_schedule_view()->parentWidget()));
  EXPECT_EQ(window_.measured_schedule_view()->schedule().passes(), 4 * 8 * 2);
  EXPECT_EQ(window_.measured_schedule_view()->schedule().row_labels.size(), 4);
  ASSERT_GT(window_.comparison_model()->rowCount(), 0);
  bool weights = false;
  for (const auto& row : window_.comparison_model()->comparison()->rows) {
    if (row.key == "weights_bytes") {
      weights = true;
      ASSERT_TRUE(row.measured.has_value());
      EXPECT_DOUBLE_EQ(*row.measured, m.memory.at("weights_bytes"));
    }
  }
  EXPECT_TRUE(weights);
}

TEST_F(MainWindowTest, ExportsAreFilesThePlannerReadsBack) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  const QString plan_path = dir.filePath(QStringLiteral("plan.json"));
  ASSERT_TRUE(window_.export_plan_json(plan_path)) << window_.last_error().toStdString();
  auto plan = planner::load_fixed_plan(plan_path.toStdString());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(costmodel::parallel_to_json(plan->parallel), costmodel::parallel_to_json(selected().plan.parallel));
  EXPECT_DOUBLE_EQ(costmodel::estimate(*plan).time.step.value(), selected().estimate.time.step.value());

  const auto read = [](const QString& path) {
    QFile f(path);
    return f.open(QIODevice::ReadOnly) ? QString::fromUtf8(f.readAll()) : QString();
  };
  ASSERT_TRUE(window_.export_launch(dir.filePath(QStringLiteral("job.sbatch")), true));
  const QString slurm = read(dir.filePath(QStringLiteral("job.sbatch")));
  EXPECT_TRUE(slurm.contains(QStringLiteral("#SBATCH --nodes=2"))) << slurm.toStdString();
  EXPECT_TRUE(slurm.contains(plan_path)) << "names the exported plan";
  ASSERT_TRUE(window_.export_launch(dir.filePath(QStringLiteral("run.sh")), false));
  EXPECT_TRUE(read(dir.filePath(QStringLiteral("run.sh"))).contains(QStringLiteral("torchrun")));

  ASSERT_TRUE(window_.export_report(dir.filePath(QStringLiteral("report.md")), planner::Format::kMarkdown));
  const QString md = read(dir.filePath(QStringLiteral("report.md")));
  EXPECT_TRUE(md.startsWith(QStringLiteral("# trainplan: llama3-8b on 16 GPUs")));
  EXPECT_TRUE(md.contains(QStringLiteral("## Recommended")));
  ASSERT_TRUE(window_.export_report(dir.filePath(QStringLiteral("report.html")), planner::Format::kHtml));
  const QString html = read(dir.filePath(QStringLiteral("report.html")));
  EXPECT_TRUE(html.startsWith(QStringLiteral("<!DOCTYPE html>")));
  EXPECT_TRUE(html.contains(QStringLiteral("<h2>Recommended: ")));

  for (auto kind : {gui::ChartKind::kMemory, gui::ChartKind::kTime, gui::ChartKind::kPipeline, gui::ChartKind::kScaling}) {
    const QString png = dir.filePath(QStringLiteral("chart%1.png").arg(static_cast<int>(kind)));
    const QString svg = dir.filePath(QStringLiteral("chart%1.svg").arg(static_cast<int>(kind)));
    ASSERT_TRUE(window_.export_chart(kind, png)) << window_.last_error().toStdString();
    ASSERT_TRUE(window_.export_chart(kind, svg)) << window_.last_error().toStdString();
    const QImage image(png);
    EXPECT_GT(image.width(), 100);
    EXPECT_GT(image.height(), 100);
    EXPECT_TRUE(read(svg).contains(QStringLiteral("<svg"))) << svg.toStdString();
  }
  EXPECT_FALSE(window_.export_chart(gui::ChartKind::kMemory, dir.filePath(QStringLiteral("chart.gif"))));
  EXPECT_TRUE(window_.last_error().contains(QStringLiteral("unknown image type")));
  EXPECT_FALSE(window_.export_chart(gui::ChartKind::kMeasuredPipeline, dir.filePath(QStringLiteral("m.png")))) << "no measurement loaded";
}

// The Launch and CLI tab: a chooser of what runs the selected plan, the text, its notes and Save.
struct LaunchTab {
  explicit LaunchTab(MainWindow& window)
      : chooser(window.findChild<QComboBox*>(QStringLiteral("exportTarget"))),
        view(window.findChild<QPlainTextEdit*>(QStringLiteral("launchView"))),
        save(window.findChild<QPushButton*>(QStringLiteral("saveExport"))),
        notes(window.findChild<QLabel*>(QStringLiteral("exportNotes"))) {}
  bool choose(const QString& label) {
    const int index = chooser->findText(label);
    if (index < 0) return false;
    chooser->setCurrentIndex(index);
    return true;
  }
  QComboBox* chooser;
  QPlainTextEdit* view;
  QPushButton* save;
  QLabel* notes;
};

TEST_F(MainWindowTest, TheLaunchTabListsTheExecutorThenEveryStack) {
  LaunchTab tab(window_);
  ASSERT_NE(tab.chooser, nullptr);
  ASSERT_NE(tab.view, nullptr);
  ASSERT_NE(tab.save, nullptr);
  ASSERT_NE(tab.notes, nullptr);
  QStringList labels;
  for (int i = 0; i < tab.chooser->count(); ++i) labels << tab.chooser->itemText(i);
  EXPECT_EQ(labels, (QStringList{QStringLiteral("trainplan executor (torchrun)"), QStringLiteral("trainplan executor (SLURM)"), QStringLiteral("Megatron-LM"),
                                 QStringLiteral("torchtitan"), QStringLiteral("DeepSpeed"), QStringLiteral("Accelerate"), QStringLiteral("LitGPT")}));
  EXPECT_EQ(tab.chooser->currentIndex(), 0) << "torchrun first, as before";
}

// tests/data/export/llama3-8b-fsdp8.plan.json: a plan every stack expresses (tests/planner/export_test.cpp).
TEST_F(MainWindowTest, EachStackShowsThePlannersExportOfTheSelectedPlan) {
  open(testing::gui_data_path("export/llama3-8b-fsdp8.plan.json"));
  ASSERT_EQ(selected().plan.parallel.zero_stage, 3);
  LaunchTab tab(window_);
  window_.show_tab(MainWindow::kLaunchTab);
  const struct {
    QString label;
    planner::ExportTarget target;
    QString marker;
  } stacks[] = {
      {QStringLiteral("Megatron-LM"), planner::ExportTarget::kMegatron, QStringLiteral("--tensor-model-parallel-size")},
      {QStringLiteral("torchtitan"), planner::ExportTarget::kTorchtitan, QStringLiteral("[parallelism]")},
      {QStringLiteral("DeepSpeed"), planner::ExportTarget::kDeepspeed, QStringLiteral("\"zero_optimization\"")},
      {QStringLiteral("Accelerate"), planner::ExportTarget::kAccelerate, QStringLiteral("distributed_type:")},
  };
  QTemporaryDir dir;
  ASSERT_TRUE(dir.isValid());
  for (const auto& s : stacks) {
    SCOPED_TRACE(s.label.toStdString());
    ASSERT_TRUE(tab.choose(s.label));
    auto expected = planner::export_plan(selected().plan, s.target);
    ASSERT_TRUE(expected.ok()) << expected.error().message;
    EXPECT_TRUE(tab.view->toPlainText().contains(s.marker)) << tab.view->toPlainText().toStdString();
    EXPECT_EQ(tab.view->toPlainText().toStdString(), expected->text);
    EXPECT_TRUE(tab.save->isEnabled());
    EXPECT_EQ(window_.launch_panel()->suggested_file_name().toStdString(), expected->file_name);
    EXPECT_EQ(tab.notes->isVisibleTo(&window_), !expected->notes.empty());
    for (const auto& note : expected->notes) EXPECT_TRUE(tab.notes->text().contains(QString::fromStdString(note))) << note;
    // What Save writes (through the File menu's method) is the text shown.
    const QString path = dir.filePath(QString::fromStdString(expected->file_name));
    ASSERT_TRUE(window_.export_stack(s.target, path)) << window_.last_error().toStdString();
    QFile file(path);
    ASSERT_TRUE(file.open(QIODevice::ReadOnly));
    EXPECT_EQ(QString::fromUtf8(file.readAll()), tab.view->toPlainText());
  }

  // Another plan selected (a knob): the chosen stack's text follows it.
  ASSERT_TRUE(tab.choose(QStringLiteral("Megatron-LM")));
  ASSERT_TRUE(window_.what_if_panel()->set_knob(QStringLiteral("tp"), QStringLiteral("2")));
  ASSERT_EQ(selected().plan.parallel.tp, 2);
  auto megatron = planner::export_plan(selected().plan, planner::ExportTarget::kMegatron);
  ASSERT_TRUE(megatron.ok()) << megatron.error().message;
  EXPECT_EQ(tab.view->toPlainText().toStdString(), megatron->text);
  EXPECT_TRUE(tab.view->toPlainText().contains(QStringLiteral("--tensor-model-parallel-size 2")));
}

// tests/data/gui-pp4.plan.json has pp=4: DeepSpeed's JSON and Accelerate cannot express it.
TEST_F(MainWindowTest, AStackThatCannotExpressThePlanSaysWhyAndOffersNothingToSave) {
  open(testing::gui_data_path("gui-pp4.plan.json"));
  ASSERT_EQ(selected().plan.parallel.pp, 4);
  LaunchTab tab(window_);
  const struct {
    QString label;
    planner::ExportTarget target;
  } refusing[] = {{QStringLiteral("DeepSpeed"), planner::ExportTarget::kDeepspeed}, {QStringLiteral("Accelerate"), planner::ExportTarget::kAccelerate}};
  for (const auto& s : refusing) {
    SCOPED_TRACE(s.label.toStdString());
    auto refused = planner::export_plan(selected().plan, s.target);
    ASSERT_FALSE(refused.ok());
    ASSERT_TRUE(tab.choose(s.label));
    const QString shown = tab.view->toPlainText();
    EXPECT_TRUE(shown.startsWith(s.label + QStringLiteral(" cannot run this plan as it stands:"))) << shown.toStdString();
    EXPECT_TRUE(shown.contains(QStringLiteral("  - pp=4: "))) << shown.toStdString();
    EXPECT_EQ(shown, gui::refusal_text(s.target, refused.error().message));
    EXPECT_FALSE(tab.save->isEnabled());
    EXPECT_TRUE(window_.launch_panel()->suggested_file_name().isEmpty());
    EXPECT_FALSE(tab.notes->isVisibleTo(&window_));
    EXPECT_FALSE(window_.error_dialog()->isVisible()) << "a refusal is shown in the tab, not as an error";
    // The File menu's method refuses as well, with the same words.
    QTemporaryDir dir;
    EXPECT_FALSE(window_.export_stack(s.target, dir.filePath(QStringLiteral("x"))));
    EXPECT_TRUE(window_.last_error().contains(QStringLiteral("pp=4"))) << window_.last_error().toStdString();
    EXPECT_FALSE(QFile::exists(dir.filePath(QStringLiteral("x"))));
    window_.error_dialog()->hide();
  }
  // A stack that can: Save comes back.
  ASSERT_TRUE(tab.choose(QStringLiteral("Megatron-LM")));
  EXPECT_TRUE(tab.save->isEnabled());
  EXPECT_TRUE(tab.view->toPlainText().contains(QStringLiteral("--pipeline-model-parallel-size 4")));
}

TEST_F(MainWindowTest, TheExecutorEntriesKeepTheLaunchTextAndTheSlurmScript) {
  search({{QStringLiteral("model"), QStringLiteral("llama3-8b")}, {QStringLiteral("gpus"), QStringLiteral("16")}});
  LaunchTab tab(window_);
  ASSERT_TRUE(tab.choose(QStringLiteral("trainplan executor (torchrun)")));
  const QString overview = tab.view->toPlainText();
  EXPECT_TRUE(overview.startsWith(QStringLiteral("# Run the selected plan: export it first (File > Export plan JSON, here plan.json)"))) << overview.toStdString();
  EXPECT_TRUE(overview.contains(window_.launch_text(false))) << "the torchrun commands";
  EXPECT_TRUE(overview.contains(QStringLiteral("# As a SLURM batch script:\n\n") + window_.launch_text(true)));
  EXPECT_TRUE(overview.contains(QStringLiteral("# The same from the command line:")));
  EXPECT_TRUE(tab.save->isEnabled());
  EXPECT_TRUE(window_.launch_panel()->suggested_file_name().endsWith(QStringLiteral("-torchrun.sh")));
  EXPECT_FALSE(tab.notes->isVisibleTo(&window_));

  ASSERT_TRUE(tab.choose(QStringLiteral("trainplan executor (SLURM)")));
  EXPECT_EQ(tab.view->toPlainText(), window_.launch_text(true));
  EXPECT_TRUE(tab.view->toPlainText().contains(QStringLiteral("#SBATCH --nodes=2")));
  EXPECT_TRUE(tab.save->isEnabled());
  EXPECT_TRUE(window_.launch_panel()->suggested_file_name().endsWith(QStringLiteral("-slurm.sbatch")));
}

}  // namespace
}  // namespace trainplan
