// MainWindow's files: opening plans, models and measurements, and writing the plan, the launch
// texts, the stacks' exports, the report and the charts (the File menu and the batch options of
// trainplan-gui). The window itself is main_window.cpp.
#include "trainplan/gui/main_window.hpp"

#include <QCoreApplication>
#include <QFileDialog>
#include <QFileInfo>
#include <QMessageBox>
#include <QStatusBar>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/hf_config.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/gui/export.hpp"
#include "trainplan/gui/launch_panel.hpp"
#include "trainplan/planner/launch.hpp"
#include "trainplan/planner/local_run.hpp"
#include "trainplan/gui/tune_runner.hpp"
#include "trainplan/costmodel/model.hpp"
#include <QDateTime>
#include <unistd.h>
#include <cstdlib>

namespace trainplan::gui {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

bool MainWindow::open_plan(const QString& path) {
  auto request = cm::load_plan_file(path.toStdString());
  if (!request) {
    show_error(tr("Cannot open the plan: %1").arg(QString::fromStdString(request.error().message)));
    return false;
  }
  pending_plan_.reset();
  cm::PlanRequest opened = *request;
  if (cm::unset_layout_fields(opened.parallel).empty()) {
    // A whole plan without ends_in_pipeline_split runs without it (parallel_to_json writes the
    // key only when on; plan_with_defaults reads its absence as off): shown off, not searched.
    // The parser reads "auto" there as absent, so a whole plan saying "auto" opens off too.
    if (!opened.parallel.ends_in_split) opened.parallel.ends_in_split = false;
    if (auto plan = cm::plan_with_defaults(opened)) pending_plan_ = *plan;
  }
  input_->load_request(opened, path);
  return true;
}

bool MainWindow::load_model_file(const QString& path) {
  auto text = cm::read_text_file(path.toStdString());
  if (!text) {
    show_error(tr("Cannot load the model: %1").arg(QString::fromStdString(text.error().message)));
    return false;
  }
  auto model = cm::parse_model_or_hf_config_text(*text, path.toStdString());  // trainplan/model/v1 or HF config.json
  if (!model) {
    show_error(tr("Cannot load the model: %1").arg(QString::fromStdString(model.error().message)));
    return false;
  }
  input_->set_loaded_model(path, cm::model_to_json(*model));
  return true;
}

bool MainWindow::load_measurement(const QString& path) {
  auto loaded = session_->load_measurement(path.toStdString());
  if (!loaded) {
    show_error(tr("Cannot load the measurement: %1").arg(QString::fromStdString(loaded.error().message)));
    return false;
  }
  return true;
}

bool MainWindow::export_plan_json(const QString& path) {
  if (!session_->selected()) {
    show_error(tr("No plan selected to export"));
    return false;
  }
  QString error;
  const std::string text = cm::plan_to_json(session_->selected()->plan).dump(2) + "\n";
  if (!save_text_file(path, QString::fromStdString(text), &error)) {
    show_error(error);
    return false;
  }
  plan_path_ = path;
  on_selection();  // the launch texts name the exported file
  return true;
}

QString MainWindow::launch_text(bool slurm, QString* error) const {
  if (!session_->selected()) {
    if (error) *error = tr("no plan selected");
    return {};
  }
  const cm::Plan& plan = session_->selected()->plan;
  pl::LaunchOptions options;
  const int per_node = plan.cluster.gpus_per_node;
  if (plan.gpus < per_node) {
    options.nodes = 1;
    options.gpus_per_node = plan.gpus;
  } else {
    options.nodes = plan.gpus / per_node;
  }
  auto text = slurm ? pl::slurm_script(plan, plan_path_.toStdString(), options) : pl::torchrun_commands(plan, plan_path_.toStdString(), options);
  if (!text) {
    if (error) *error = QString::fromStdString(text.error().message);
    return {};
  }
  return QString::fromStdString(*text);
}

bool MainWindow::export_launch(const QString& path, bool slurm) {
  QString error;
  const QString text = launch_text(slurm, &error);
  if (text.isEmpty()) {
    show_error(tr("No launch command: %1").arg(error));
    return false;
  }
  if (!save_text_file(path, text, &error)) {
    show_error(error);
    return false;
  }
  return true;
}

bool MainWindow::export_stack(pl::ExportTarget target, const QString& path) {
  if (!session_->selected()) {
    show_error(tr("No plan selected to export"));
    return false;
  }
  auto exported = pl::export_plan(session_->selected()->plan, target);
  if (!exported) {
    show_error(refusal_text(target, exported.error().message));
    return false;
  }
  QString error;
  if (!save_text_file(path, QString::fromStdString(exported->text), &error)) {
    show_error(error);
    return false;
  }
  return true;
}

bool MainWindow::export_report(const QString& path, pl::Format format) {
  const QString text = report_text(format);
  if (text.isEmpty()) {
    show_error(tr("No search result to report yet"));
    return false;
  }
  QString error;
  if (!save_text_file(path, text, &error)) {
    show_error(error);
    return false;
  }
  return true;
}

bool MainWindow::export_chart(ChartKind kind, const QString& path) {
  QWidget* widget = this;
  switch (kind) {
    case ChartKind::kMemory: show_tab(kBreakdownTab); widget = memory_chart_; break;
    case ChartKind::kTime: show_tab(kBreakdownTab); widget = time_chart_; break;
    case ChartKind::kPipeline: show_tab(kPipelineTab); widget = schedule_view_; break;
    case ChartKind::kMeasuredPipeline: show_tab(kPipelineTab); widget = measured_view_; break;
    case ChartKind::kScaling: show_tab(kScalingTab); widget = scaling_chart_; break;
    case ChartKind::kComparison: show_tab(kCompareTab); widget = compare_page_; break;
    case ChartKind::kWindow: widget = this; break;
  }
  if (kind == ChartKind::kMeasuredPipeline && measured_view_->isHidden()) {
    show_error(tr("No measured pipeline to export: load a measurement with a trace first"));
    return false;
  }
  QCoreApplication::processEvents();  // lay out the tab just shown
  QString error;
  if (!save_widget_image(widget, path, &error)) {
    show_error(error);
    return false;
  }
  return true;
}

void MainWindow::choose_and_open_plan() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Open plan"), QString(), tr("Plan (*.json);;All files (*)"));
  if (!path.isEmpty()) open_plan(path);
}

void MainWindow::choose_and_load_model() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Load model (trainplan JSON or Hugging Face config.json)"), QString(),
                                                    tr("Model or Hugging Face config (*.json);;All files (*)"));
  if (!path.isEmpty()) load_model_file(path);
}

void MainWindow::choose_and_load_measurement() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Load measurement"), QString(), tr("Measurement (*.json);;All files (*)"));
  if (!path.isEmpty()) load_measurement(path);
}

void MainWindow::choose_and_export_stack(pl::ExportTarget target) {
  if (!session_->selected()) {
    show_error(tr("No plan selected to export"));
    return;
  }
  auto exported = pl::export_plan(session_->selected()->plan, target);
  if (!exported) {  // before the dialog: there is nothing to save
    show_error(refusal_text(target, exported.error().message));
    return;
  }
  const QString name = QString::fromStdString(exported->file_name);
  const QString suffix = QFileInfo(name).suffix();
  choose_and_export(tr("Export for %1").arg(stack_label(target)), tr("%1 file (*.%2);;All files (*)").arg(stack_label(target), suffix),
                    [this, target](const QString& p) { return export_stack(target, p); }, name);
}

void MainWindow::choose_and_save_launch_choice() {
  const LaunchChoice& choice = launch_panel_->choice();
  if (choice.stack) {
    choose_and_export_stack(*choice.stack);
    return;
  }
  const bool slurm = choice.slurm;
  choose_and_export(slurm ? tr("Export SLURM script") : tr("Export launch command"), launch_panel_->file_filter(),
                    [this, slurm](const QString& p) { return export_launch(p, slurm); }, launch_panel_->suggested_file_name());
}

bool MainWindow::measure_top_plans(const QString& out_dir, int top) {
  const auto& request = session_->request();
  if (!request) {
    show_error(tr("Measure the top plans: the inputs are not valid yet"));
    return false;
  }
  if (tune_->running()) {
    show_error(tr("Measure the top plans: a measurement runs already"));
    return false;
  }
  // The runs are this machine's CPU ranks, one per planned GPU.
  constexpr double kMaxParameters = 1e9;
  const double parameters = costmodel::count_parameters(request->model).total(request->model.layers);
  if (parameters > kMaxParameters || request->gpus > 64) {
    show_error(tr("Measure the top plans runs the plans on this machine's CPU ranks, one per GPU: %1 with %2 parameters on %3 ranks is "
                  "beyond them (at most 1e9 parameters and 64 ranks). On GPUs: planner tune --launcher torchrun or --launcher slurm.")
                   .arg(QString::fromStdString(request->model.name))
                   .arg(parameters, 0, 'g', 3)
                   .arg(request->gpus));
    return false;
  }
  const char* env = std::getenv("TRAINPLAN_EXECUTOR");
  const char* path = std::getenv("PATH");
  auto executor = planner::find_executor({"", env ? env : "", QCoreApplication::applicationDirPath().toStdString(), path ? path : ""});
  if (!executor) {
    show_error(tr("Measure the top plans: %1").arg(QString::fromStdString(executor.error().message)));
    return false;
  }
  planner::TuneOptions options;
  options.out_dir = out_dir.toStdString();
  options.launcher = planner::Launcher::kMpirun;
  options.measure_profile = true;
  options.top = top;
  options.executor = *executor;
  options.allow_run_as_root = ::geteuid() == 0;
  if (!tune_->start(*request, options)) {
    show_error(tr("Measure the top plans: a measurement runs already"));
    return false;
  }
  statusBar()->showMessage(tr("Measuring the top %1 plans on this machine's CPU ranks into %2").arg(top).arg(out_dir));
  return true;
}

void MainWindow::choose_and_measure_top_plans() {
  const QString parent = QFileDialog::getExistingDirectory(this, tr("Folder for the measurements (a new folder is made in it)"));
  if (parent.isEmpty()) return;
  measure_top_plans(parent + QStringLiteral("/tune-") + QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-HHmmss")));
}

void MainWindow::choose_and_export(const QString& title, const QString& filter, const std::function<bool(const QString&)>& action,
                                   const QString& suggested_name) {
  const QString path = QFileDialog::getSaveFileName(this, title, suggested_name, filter);
  if (!path.isEmpty() && action(path)) statusBar()->showMessage(tr("Wrote %1").arg(path), 8000);
}

}  // namespace trainplan::gui
