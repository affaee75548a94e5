#pragma once
// MainWindow: the planning app. Inputs on the left; on the right the ranked, sortable plan table
// (fits-only filter, search progress) above the what-if knobs and the views of the selected plan:
// memory and step-time breakdowns, pipeline schedule, scaling, measured against predicted, and
// the launch command or the file another stack (Megatron-LM, torchtitan, DeepSpeed, Accelerate)
// reads. Every change of an input starts a search in the background (the newest
// input wins); selecting a row or editing a knob re-estimates at once.
//
// Errors never stop the app: a wrong input is marked at its field and the last good result stays;
// a file that cannot be read shows a non-modal message box (error_dialog()) whose text is also
// last_error(). Every menu action has a method taking a path, so that tests and the command line
// (trainplan-gui --screenshot, --export-*) do what the menus do.

#include <functional>
#include <optional>

#include <QMainWindow>

#include "trainplan/gui/charts.hpp"
#include "trainplan/gui/input_panel.hpp"
#include "trainplan/gui/launch_panel.hpp"
#include "trainplan/gui/planning_session.hpp"
#include "trainplan/gui/schedule_view.hpp"
#include "trainplan/gui/table_models.hpp"
#include "trainplan/gui/what_if_panel.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/report.hpp"

QT_BEGIN_NAMESPACE
class QCheckBox;
class QLabel;
class QMessageBox;
class QProgressBar;
class QTabWidget;
class QTableView;
class QTimer;
QT_END_NAMESPACE

namespace trainplan::gui {

// The views that can be exported as images.
enum class ChartKind { kMemory, kTime, kPipeline, kMeasuredPipeline, kScaling, kComparison, kWindow };
// "memory", "time", "pipeline", "measured-pipeline", "scaling", "comparison", "window".
[[nodiscard]] std::optional<ChartKind> chart_kind(const QString& name);

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  enum Tab { kBreakdownTab, kPipelineTab, kScalingTab, kCompareTab, kLaunchTab };

  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // File actions, without dialogs. Each returns false and reports through show_error on failure.
  bool open_plan(const QString& path);         // fills the inputs from a plan; selects its layout
  bool load_model_file(const QString& path);   // a trainplan/model/v1 document as the model
  bool load_measurement(const QString& path);  // an executor measurement to overlay
  bool export_plan_json(const QString& path);  // the selected plan (trainplan/plan/v1)
  bool export_launch(const QString& path, bool slurm);  // torchrun command or SLURM script
  // The file `target` reads to run the selected plan (planner::export_plan); a stack that cannot
  // express the plan is an error naming the plan fields.
  bool export_stack(planner::ExportTarget target, const QString& path);
  bool export_report(const QString& path, planner::Format format);  // kMarkdown or kHtml
  bool export_chart(ChartKind kind, const QString& path);             // .png or .svg
  // "Measure the top plans on this machine": `planner tune` of the current request on this
  // machine's CPU ranks (mpirun; the profile of them measured first) into `out_dir`, in the
  // background; the plan table's Measured column fills as runs end, and the report shows at the
  // end. False (and show_error) for no valid request, a model too large for CPU ranks, no
  // executor, or a tune already running.
  bool measure_top_plans(const QString& out_dir, int top = 3);
  [[nodiscard]] class TuneRunner* tune_runner() const { return tune_; }
  void show_tab(Tab tab);

  // The launch text of the selected plan (torchrun commands, or a SLURM script).
  [[nodiscard]] QString launch_text(bool slurm, QString* error = nullptr) const;
  // The report of the search and, when it differs from the recommended plan, of the selected plan.
  [[nodiscard]] QString report_text(planner::Format format) const;

  [[nodiscard]] const QString& last_error() const { return last_error_; }
  [[nodiscard]] QMessageBox* error_dialog() const { return error_box_; }
  [[nodiscard]] PlanningSession* session() const { return session_; }
  [[nodiscard]] InputPanel* input_panel() const { return input_; }
  [[nodiscard]] WhatIfPanel* what_if_panel() const { return what_if_; }
  [[nodiscard]] QTableView* plan_table() const { return table_; }
  [[nodiscard]] PlanTableModel* plan_model() const { return plan_model_; }
  [[nodiscard]] PlanFilterProxy* plan_proxy() const { return proxy_; }
  [[nodiscard]] QCheckBox* fits_only_box() const { return fits_only_; }
  [[nodiscard]] BreakdownModel* memory_model() const { return memory_model_; }
  [[nodiscard]] BreakdownModel* time_model() const { return time_model_; }
  [[nodiscard]] ScalingModel* scaling_model() const { return scaling_model_; }
  [[nodiscard]] ComparisonModel* comparison_model() const { return comparison_model_; }
  [[nodiscard]] BreakdownChartView* memory_chart() const { return memory_chart_; }
  [[nodiscard]] BreakdownChartView* time_chart() const { return time_chart_; }
  [[nodiscard]] ScalingChartView* scaling_chart() const { return scaling_chart_; }
  [[nodiscard]] PipelineScheduleView* schedule_view() const { return schedule_view_; }
  [[nodiscard]] PipelineScheduleView* measured_schedule_view() const { return measured_view_; }
  [[nodiscard]] QLabel* summary_label() const { return summary_; }
  [[nodiscard]] QLabel* status_label() const { return status_; }
  [[nodiscard]] LaunchPanel* launch_panel() const { return launch_panel_; }

 signals:
  // Every view shows the selected plan (after a search result, a row selection or a knob).
  void viewsUpdated();

 public slots:
  void show_error(const QString& message);

 private:
  void build_menus();
  QWidget* build_results();
  QWidget* build_views();
  void submit_now();
  void on_results();
  void on_selection();
  void on_table_selection();
  void on_measurement();
  void on_scaling();
  void on_input_errors();
  void select_table_row_of_selection();
  void choose_and_open_plan();
  void choose_and_load_model();
  void choose_and_load_measurement();
  void choose_and_export(const QString& title, const QString& filter, const std::function<bool(const QString&)>& action,
                         const QString& suggested_name = QString());
  void choose_and_export_stack(planner::ExportTarget target);
  void choose_and_save_launch_choice();  // Save on the Launch and CLI tab
  void choose_and_measure_top_plans();

  PlanningSession* session_ = nullptr;
  class TuneRunner* tune_ = nullptr;
  InputPanel* input_ = nullptr;
  WhatIfPanel* what_if_ = nullptr;
  QTimer* submit_timer_ = nullptr;
  PlanTableModel* plan_model_ = nullptr;
  PlanFilterProxy* proxy_ = nullptr;
  QTableView* table_ = nullptr;
  QCheckBox* fits_only_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QLabel* status_ = nullptr;
  QLabel* summary_ = nullptr;
  QTabWidget* tabs_ = nullptr;
  BreakdownModel* memory_model_ = nullptr;
  BreakdownModel* time_model_ = nullptr;
  ScalingModel* scaling_model_ = nullptr;
  ComparisonModel* comparison_model_ = nullptr;
  BreakdownChartView* memory_chart_ = nullptr;
  BreakdownChartView* time_chart_ = nullptr;
  BreakdownChartView* compare_memory_chart_ = nullptr;
  BreakdownChartView* compare_time_chart_ = nullptr;
  ScalingChartView* scaling_chart_ = nullptr;
  PipelineScheduleView* schedule_view_ = nullptr;
  PipelineScheduleView* measured_view_ = nullptr;
  PipelineScheduleView* compare_schedule_view_ = nullptr;
  PipelineScheduleView* compare_measured_view_ = nullptr;
  QWidget* compare_page_ = nullptr;
  QLabel* compare_note_ = nullptr;
  LaunchPanel* launch_panel_ = nullptr;
  QMessageBox* error_box_ = nullptr;
  QString last_error_;
  QString plan_path_ = QStringLiteral("plan.json");  // where the plan was last exported
  std::optional<costmodel::Plan> pending_plan_;      // opened from a file: selected when its search ends
  bool updating_selection_ = false;
};

}  // namespace trainplan::gui
