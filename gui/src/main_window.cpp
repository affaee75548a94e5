#include "trainplan/gui/main_window.hpp"

#include <QApplication>
#include <QCheckBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QLocale>
#include <QGridLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressBar>
#include <QScrollArea>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/hf_config.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/gui/export.hpp"
#include "trainplan/gui/launch_panel.hpp"
#include "trainplan/gui/tune_runner.hpp"
#include "trainplan/planner/launch.hpp"

namespace trainplan::gui {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

std::optional<ChartKind> chart_kind(const QString& name) {
  if (name == QStringLiteral("memory")) return ChartKind::kMemory;
  if (name == QStringLiteral("time")) return ChartKind::kTime;
  if (name == QStringLiteral("pipeline")) return ChartKind::kPipeline;
  if (name == QStringLiteral("measured-pipeline")) return ChartKind::kMeasuredPipeline;
  if (name == QStringLiteral("scaling")) return ChartKind::kScaling;
  if (name == QStringLiteral("comparison")) return ChartKind::kComparison;
  if (name == QStringLiteral("window")) return ChartKind::kWindow;
  return std::nullopt;
}

namespace {

// `fit_columns`: columns follow their contents on every change (cheap for the small tables).
QTableView* table_for(QAbstractItemModel* model, QWidget* parent, bool fit_columns = true) {
  auto* view = new QTableView(parent);
  view->setModel(model);
  view->verticalHeader()->hide();
  if (fit_columns) view->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  view->horizontalHeader()->setStretchLastSection(true);
  view->setSelectionBehavior(QAbstractItemView::SelectRows);
  view->setEditTriggers(QAbstractItemView::NoEditTriggers);
  view->setAlternatingRowColors(true);
  return view;
}

bool same_layout(const cm::ParallelConfig& a, const cm::ParallelConfig& b) {
  return cm::parallel_to_json(a) == cm::parallel_to_json(b);
}

const char* objective_key(pl::Objective o) { return pl::objective_name(o); }

}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle(tr("trainplan: plan distributed LLM training"));
  session_ = new PlanningSession(this);
  plan_model_ = new PlanTableModel(this);
  proxy_ = new PlanFilterProxy(this);
  proxy_->setSourceModel(plan_model_);
  memory_model_ = new BreakdownModel(BreakdownModel::Kind::kMemory, this);
  time_model_ = new BreakdownModel(BreakdownModel::Kind::kTime, this);
  scaling_model_ = new ScalingModel(this);
  comparison_model_ = new ComparisonModel(this);

  input_ = new InputPanel();
  auto* input_scroll = new QScrollArea();
  input_scroll->setWidget(input_);
  input_scroll->setWidgetResizable(true);
  input_scroll->setMinimumWidth(input_->sizeHint().width() + 24);

  what_if_ = new WhatIfPanel();
  auto* what_if_scroll = new QScrollArea();
  what_if_scroll->setWidget(what_if_);
  what_if_scroll->setWidgetResizable(true);
  what_if_scroll->setMinimumWidth(what_if_->sizeHint().width() + 24);

  auto* bottom = new QSplitter(Qt::Horizontal);
  auto* what_if_box = new QWidget();
  auto* what_if_layout = new QVBoxLayout(what_if_box);
  what_if_layout->setContentsMargins(0, 0, 0, 0);
  auto* what_if_title = new QLabel(tr("<b>What if</b>: change the selected plan"));
  what_if_layout->addWidget(what_if_title);
  what_if_layout->addWidget(what_if_scroll);
  bottom->addWidget(what_if_box);
  bottom->addWidget(build_views());
  bottom->setStretchFactor(1, 1);
  bottom->setSizes({what_if_->sizeHint().width() + 24, 1000});

  auto* right = new QSplitter(Qt::Vertical);
  right->addWidget(build_results());
  right->addWidget(bottom);
  right->setStretchFactor(0, 2);
  right->setStretchFactor(1, 3);
  right->setSizes({380, 620});

  auto* main = new QSplitter(Qt::Horizontal);
  main->addWidget(input_scroll);
  main->addWidget(right);
  main->setStretchFactor(1, 1);
  setCentralWidget(main);

  error_box_ = new QMessageBox(QMessageBox::Warning, tr("trainplan"), QString(), QMessageBox::Ok, this);
  error_box_->setObjectName(QStringLiteral("errorDialog"));
  error_box_->setModal(false);
  error_box_->setWindowModality(Qt::NonModal);

  build_menus();

  submit_timer_ = new QTimer(this);
  submit_timer_->setSingleShot(true);
  submit_timer_->setInterval(0);  // coalesces the changes of one event-loop pass; no added delay
  connect(submit_timer_, &QTimer::timeout, this, &MainWindow::submit_now);
  connect(input_, &InputPanel::changed, submit_timer_, qOverload<>(&QTimer::start));
  connect(input_, &InputPanel::loadModelRequested, this, &MainWindow::choose_and_load_model);

  connect(session_, &PlanningSession::searchStarted, this, [this] {
    progress_->setValue(0);
    progress_->show();
  });
  connect(session_, &PlanningSession::progressChanged, this, [this](double f) { progress_->setValue(static_cast<int>(1000 * f)); });
  connect(session_, &PlanningSession::resultsChanged, this, &MainWindow::on_results);
  connect(session_, &PlanningSession::searchFailed, this, [this](const QString& message) {
    progress_->hide();
    std::vector<FieldError> errors = session_->input_errors();
    errors.push_back(FieldError{"", message.toStdString()});
    input_->set_errors(errors);
    status_->setStyleSheet(QStringLiteral("color:#b00000"));
    status_->setText(tr("No plan for this input (%1); showing the last good result.").arg(message));
  });
  connect(session_, &PlanningSession::inputErrorsChanged, this, &MainWindow::on_input_errors);
  connect(session_, &PlanningSession::selectionChanged, this, &MainWindow::on_selection);
  connect(session_, &PlanningSession::measurementChanged, this, &MainWindow::on_measurement);
  connect(session_, &PlanningSession::scalingChanged, this, &MainWindow::on_scaling);
  connect(what_if_, &WhatIfPanel::edited, this, [this] {
    if (!session_->select_plan(what_if_->edited_plan())) what_if_->show_invalid(session_->selection_error());
  });
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this, &MainWindow::on_table_selection);
  // A ranked layout's folded variants (micro-batch, virtual stages, schedule) open under it.
  connect(table_, &QTableView::doubleClicked, this, [this](const QModelIndex& index) {
    const QModelIndex source = proxy_->mapToSource(index);
    if (source.isValid()) plan_model_->toggle_variants(source.row());
  });
  // Measure the top plans: the tune's progress in the status line, its runs in the Measured
  // column as they end, its report at the end.
  tune_ = new TuneRunner(this);
  connect(tune_, &TuneRunner::progress, this, [this](const QString& line) { statusBar()->showMessage(tr("Measuring: %1").arg(line.trimmed())); });
  connect(tune_, &TuneRunner::candidatesChanged, this, [this] { plan_model_->set_tune(tune_->candidates()); });
  connect(tune_, &TuneRunner::finished, this, [this](const QString& report, bool ok) {
    statusBar()->showMessage(ok ? tr("Measured: the report is open") : tr("The measurement ended without a choice"), 8000);
    auto* box = new QMessageBox(QMessageBox::Information, tr("Measure the top plans"),
                                ok ? tr("The top plans ran on this machine; the report:") : tr("The tune ended without a choice:"), QMessageBox::Ok, this);
    box->setDetailedText(report);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->setModal(false);
    box->show();
  });
  connect(fits_only_, &QCheckBox::toggled, this, [this](bool on) {
    proxy_->set_fits_only(on);
    select_table_row_of_selection();
  });

  resize(1600, 1000);
  submit_timer_->start();
}

MainWindow::~MainWindow() = default;

QWidget* MainWindow::build_results() {
  auto* box = new QWidget();
  auto* layout = new QVBoxLayout(box);
  layout->setContentsMargins(4, 4, 4, 0);
  auto* top = new QHBoxLayout();
  status_ = new QLabel(tr("Searching…"));
  status_->setObjectName(QStringLiteral("searchStatus"));
  status_->setWordWrap(true);
  progress_ = new QProgressBar();
  progress_->setObjectName(QStringLiteral("searchProgress"));
  progress_->setRange(0, 1000);
  progress_->setTextVisible(false);
  progress_->setMaximumWidth(160);
  fits_only_ = new QCheckBox(tr("Only plans that fit"));
  fits_only_->setObjectName(QStringLiteral("fitsOnly"));
  top->addWidget(status_, 1);
  top->addWidget(progress_);
  top->addWidget(fits_only_);
  layout->addLayout(top);
  table_ = table_for(proxy_, box, false);
  table_->setObjectName(QStringLiteral("planTable"));
  table_->setSortingEnabled(true);
  table_->sortByColumn(PlanTableModel::kRank, Qt::AscendingOrder);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->horizontalHeader()->setStretchLastSection(true);
  layout->addWidget(table_);
  summary_ = new QLabel();
  summary_->setObjectName(QStringLiteral("selectedSummary"));
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(summary_);
  return box;
}

QWidget* MainWindow::build_views() {
  tabs_ = new QTabWidget();
  tabs_->setObjectName(QStringLiteral("views"));

  auto* breakdown = new QWidget();
  auto* grid = new QGridLayout(breakdown);
  memory_chart_ = new BreakdownChartView(memory_model_);
  memory_chart_->setObjectName(QStringLiteral("memoryChart"));
  time_chart_ = new BreakdownChartView(time_model_);
  time_chart_->setObjectName(QStringLiteral("timeChart"));
  grid->addWidget(memory_chart_, 0, 0);
  grid->addWidget(time_chart_, 0, 1);
  grid->addWidget(table_for(memory_model_, breakdown), 1, 0);
  grid->addWidget(table_for(time_model_, breakdown), 1, 1);
  grid->setRowStretch(0, 3);
  grid->setRowStretch(1, 2);
  tabs_->addTab(breakdown, tr("Memory and step time"));

  auto* pipeline = new QWidget();
  auto* pipeline_layout = new QVBoxLayout(pipeline);
  schedule_view_ = new PipelineScheduleView();
  schedule_view_->setObjectName(QStringLiteral("scheduleView"));
  measured_view_ = new PipelineScheduleView();
  measured_view_->setObjectName(QStringLiteral("measuredScheduleView"));
  measured_view_->hide();
  pipeline_layout->addWidget(schedule_view_, 1);
  pipeline_layout->addWidget(measured_view_, 1);
  tabs_->addTab(pipeline, tr("Pipeline schedule"));

  auto* scaling = new QWidget();
  auto* scaling_layout = new QHBoxLayout(scaling);
  scaling_chart_ = new ScalingChartView(scaling_model_);
  scaling_chart_->setObjectName(QStringLiteral("scalingChart"));
  scaling_layout->addWidget(scaling_chart_, 3);
  scaling_layout->addWidget(table_for(scaling_model_, scaling), 2);
  tabs_->addTab(scaling, tr("Scaling"));

  compare_page_ = new QWidget();
  compare_page_->setObjectName(QStringLiteral("comparePage"));
  auto* compare = new QGridLayout(compare_page_);
  compare_note_ = new QLabel(tr("Load an executor measurement (File > Load measurement) to set it beside the prediction."));
  compare_note_->setWordWrap(true);
  compare->addWidget(compare_note_, 0, 0, 1, 3);
  compare->addWidget(table_for(comparison_model_, compare_page_), 1, 0);
  compare_memory_chart_ = new BreakdownChartView(memory_model_);
  compare_time_chart_ = new BreakdownChartView(time_model_);
  compare->addWidget(compare_memory_chart_, 1, 1);
  compare->addWidget(compare_time_chart_, 1, 2);
  compare_schedule_view_ = new PipelineScheduleView();
  compare_measured_view_ = new PipelineScheduleView();
  compare->addWidget(compare_schedule_view_, 2, 0, 1, 3);
  compare->addWidget(compare_measured_view_, 3, 0, 1, 3);
  compare->setColumnStretch(0, 4);
  compare->setColumnStretch(1, 3);
  compare->setColumnStretch(2, 3);
  compare->setRowStretch(1, 3);
  compare->setRowStretch(2, 2);
  compare->setRowStretch(3, 2);
  tabs_->addTab(compare_page_, tr("Measured vs predicted"));

  launch_panel_ = new LaunchPanel();
  launch_panel_->setObjectName(QStringLiteral("launchPanel"));
  connect(launch_panel_, &LaunchPanel::saveRequested, this, &MainWindow::choose_and_save_launch_choice);
  tabs_->addTab(launch_panel_, tr("Launch and CLI"));
  return tabs_;
}

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("&Open plan…"), this, &MainWindow::choose_and_open_plan);
  file->addAction(tr("Load &model (trainplan JSON or Hugging Face config.json)…"), this, &MainWindow::choose_and_load_model);
  file->addAction(tr("Load &measurement…"), this, &MainWindow::choose_and_load_measurement);
  file->addAction(tr("Clear measurement"), session_, &PlanningSession::clear_measurement);
  file->addAction(tr("Measure the &top plans on this machine…"), this, &MainWindow::choose_and_measure_top_plans);
  file->addSeparator();
  file->addAction(tr("Export plan &JSON…"), this, [this] {
    choose_and_export(tr("Export plan"), tr("Plan (*.json)"), [this](const QString& p) { return export_plan_json(p); });
  });
  file->addAction(tr("Export &launch command…"), this, [this] {
    choose_and_export(tr("Export launch command"), tr("Shell script (*.sh)"), [this](const QString& p) { return export_launch(p, false); });
  });
  file->addAction(tr("Export &SLURM script…"), this, [this] {
    choose_and_export(tr("Export SLURM script"), tr("SLURM batch script (*.sbatch *.sh)"), [this](const QString& p) { return export_launch(p, true); });
  });
  QMenu* stacks = file->addMenu(tr("Export for another s&tack"));
  for (pl::ExportTarget target : pl::export_targets()) {
    stacks->addAction(stack_label(target) + QStringLiteral("…"), this, [this, target] { choose_and_export_stack(target); });
  }
  file->addAction(tr("Export report (Markdown)…"), this, [this] {
    choose_and_export(tr("Export report"), tr("Markdown (*.md)"), [this](const QString& p) { return export_report(p, pl::Format::kMarkdown); });
  });
  file->addAction(tr("Export report (HTML)…"), this, [this] {
    choose_and_export(tr("Export report"), tr("HTML (*.html)"), [this](const QString& p) { return export_report(p, pl::Format::kHtml); });
  });
  QMenu* charts = file->addMenu(tr("Export &chart"));
  const std::pair<QString, ChartKind> kinds[] = {{tr("Memory breakdown"), ChartKind::kMemory},   {tr("Step-time breakdown"), ChartKind::kTime},
                                                 {tr("Pipeline schedule"), ChartKind::kPipeline}, {tr("Measured pipeline"), ChartKind::kMeasuredPipeline},
                                                 {tr("Scaling"), ChartKind::kScaling},            {tr("Measured vs predicted"), ChartKind::kComparison},
                                                 {tr("Whole window"), ChartKind::kWindow}};
  for (const auto& [label, kind] : kinds) {
    const ChartKind k = kind;
    charts->addAction(label + QStringLiteral("…"), this, [this, k] {
      choose_and_export(tr("Export chart"), tr("PNG image (*.png);;SVG image (*.svg)"), [this, k](const QString& p) { return export_chart(k, p); });
    });
  }
  file->addSeparator();
  file->addAction(tr("&Quit"), qApp, &QApplication::quit);
}

void MainWindow::submit_now() { session_->submit(input_->form(), input_->objective()); }

void MainWindow::on_input_errors() {
  input_->set_errors(session_->input_errors());
  if (!session_->input_errors().empty()) {
    status_->setStyleSheet(QStringLiteral("color:#b00000"));
    status_->setText(session_->result() ? tr("Some inputs are not valid (marked on the left); the results are those of the last valid input.")
                                        : tr("Some inputs are not valid (marked on the left)."));
  }
}

void MainWindow::on_results() {
  progress_->hide();
  const pl::SearchResult& r = *session_->result();
  const bool first = plan_model_->row_count() == 0;
  plan_model_->set_result(r);
  if (first) table_->resizeColumnsToContents();  // once: measuring every cell on each result is slow
  status_->setStyleSheet(QString());
  status_->setText(tr("%1 on %2 GPUs: %3 plans evaluated in %4 s, %5 fit; ranked by %6%7")
                       .arg(QString::fromStdString(session_->request()->model.name))
                       .arg(session_->request()->gpus)
                       .arg(r.evaluated)
                       .arg(r.seconds, 0, 'f', 3)
                       .arg(r.fitting)
                       .arg(QString::fromUtf8(objective_key(session_->objective())))
                       .arg(r.ranked.empty() ? tr(". No plan fits: the rows show what each shape needs.") : QString()));
  if (pending_plan_) {
    const cm::Plan plan = *pending_plan_;
    pending_plan_.reset();
    session_->select_plan(plan);
  }
  select_table_row_of_selection();
}

void MainWindow::select_table_row_of_selection() {
  const auto& selected = session_->selected();
  updating_selection_ = true;
  table_->clearSelection();
  if (selected) {
    for (int row = 0; row < proxy_->rowCount(); ++row) {
      const QModelIndex source = proxy_->mapToSource(proxy_->index(row, 0));
      if (same_layout(plan_model_->row_at(source.row()).candidate.plan.parallel, selected->plan.parallel)) {
        table_->selectRow(row);
        table_->scrollTo(proxy_->index(row, 0));
        break;
      }
    }
  }
  updating_selection_ = false;
}

void MainWindow::on_table_selection() {
  if (updating_selection_) return;
  const QModelIndex current = table_->currentIndex();
  if (!current.isValid()) return;
  const QModelIndex source = proxy_->mapToSource(current);
  if (source.row() < 0 || source.row() >= plan_model_->row_count()) return;
  session_->select_plan(plan_model_->row_at(source.row()).candidate.plan);
}

void MainWindow::on_selection() {
  const auto& selected = session_->selected();
  if (!selected) return;
  const cm::Estimate& e = selected->estimate;
  const auto& measurement = session_->measurement();
  const pl::PerformanceDocument* measured = measurement ? &*measurement : nullptr;
  memory_model_->set_estimate(e, measured);
  time_model_->set_estimate(e, measured);
  if (session_->schedule()) {
    const ScheduleData data = schedule_from_simulation(*session_->schedule(), e.pipeline);
    schedule_view_->set_schedule(data);
    compare_schedule_view_->set_schedule(data);
  }
  if (measured && measured->trace) {
    const ScheduleData trace = schedule_from_trace(*measured->trace);
    measured_view_->set_schedule(trace);
    compare_measured_view_->set_schedule(trace);
    measured_view_->show();
  } else {
    measured_view_->clear(tr("No measured trace loaded"));
    compare_measured_view_->clear(tr("No measured trace: load a measurement of a pipeline run (it carries the executor's trace)"));
    measured_view_->hide();
  }
  what_if_->set_plan(selected->plan, e);
  comparison_model_->set_comparison(session_->comparison());
  if (const auto& c = comparison_model_->comparison()) {
    QStringList lines;
    lines << tr("Measured: %1 (%2, world size %3) against the selected plan's prediction.")
                 .arg(QString::fromStdString(c->measured.file), QString::fromStdString(c->measured.device.empty() ? "device not named" : c->measured.device))
                 .arg(c->measured.world_size);
    for (const auto& w : c->warnings) lines << tr("Note: %1").arg(QString::fromStdString(w));
    compare_note_->setText(lines.join(QStringLiteral("\n")));
  }

  const QString fits = !e.fits ? tr("DOES NOT FIT (%1)").arg(QString::fromStdString(e.reasons.empty() ? "" : e.reasons.front()))
                       : e.tight ? tr("tight (%1)").arg(QString::fromStdString(e.reasons.empty() ? "" : e.reasons.front()))
                                 : tr("fits");
  summary_->setText(tr("<b>Selected</b>: %1 &nbsp;|&nbsp; %2 of %3 GiB per GPU, %4 &nbsp;|&nbsp; %5 s per step &nbsp;|&nbsp; %6 tokens/s, MFU %7% "
                       "&nbsp;|&nbsp; %8 days, %9 GPU-hours, %10 USD")
                        .arg(layout_text(selected->plan.parallel).toHtmlEscaped())
                        .arg(e.memory.required.in_gib(), 0, 'f', 1)
                        .arg(e.memory.capacity.in_gib(), 0, 'f', 0)
                        .arg(fits.toHtmlEscaped())
                        .arg(e.time.step.value(), 0, 'f', 3)
                        .arg(QLocale(QLocale::English).toString(e.throughput.tokens_per_second, 'f', 0))
                        .arg(100 * e.throughput.mfu, 0, 'f', 1)
                        .arg(e.run.wall_time.in_days(), 0, 'f', 1)
                        .arg(QLocale(QLocale::English).toString(e.run.gpu_hours, 'f', 0))
                        .arg(QLocale(QLocale::English).toString(e.run.cost_usd, 'f', 0)));

  LaunchPanel::ExecutorTexts executor;
  QString& launch = executor.overview;
  QString error;
  executor.torchrun = launch_text(false, &error);
  launch += tr("# Run the selected plan: export it first (File > Export plan JSON, here %1)\n\n").arg(plan_path_);
  launch += executor.torchrun.isEmpty() ? tr("# no launch command: %1\n").arg(error) : executor.torchrun;
  executor.slurm = launch_text(true, &executor.slurm_error);
  if (!executor.slurm.isEmpty()) launch += tr("\n# As a SLURM batch script:\n\n") + executor.slurm;
  if (session_->request()) {
    const int nodes = std::max(1, selected->plan.gpus / std::max(1, selected->plan.cluster.gpus_per_node));
    launch += tr("\n# The same from the command line:\n#   %1 --save-plan %2\n#   planner evaluate %2 --format html > report.html\n"
                 "#   planner launch %2 --nodes %3 --slurm > job.sbatch\n")
                  .arg(QString::fromStdString(planner_command(*session_->request(), objective_key(session_->objective()), session_->memory_headroom())), plan_path_)
                  .arg(nodes);
  }
  launch_panel_->set_plan(selected->plan, executor);
  select_table_row_of_selection();
  emit viewsUpdated();
}

void MainWindow::on_measurement() {
  on_selection();
  if (session_->measurement()) show_tab(kCompareTab);
}

void MainWindow::on_scaling() {
  scaling_model_->set_points(session_->scaling());
  scaling_chart_->set_current_gpus(session_->request() ? session_->request()->gpus : 0);
}

void MainWindow::show_tab(Tab tab) { tabs_->setCurrentIndex(static_cast<int>(tab)); }

void MainWindow::show_error(const QString& message) {
  last_error_ = message;
  error_box_->setText(message);
  error_box_->show();  // non-modal: the window stays usable and nothing waits for it
  statusBar()->showMessage(message, 15000);
}

QString MainWindow::report_text(pl::Format format) const {
  if (!session_->request() || !session_->result()) return {};
  const cm::PlanRequest& request = *session_->request();
  const pl::SearchResult& result = *session_->result();
  pl::ReportContext context;
  context.command = planner_command(request, objective_key(session_->objective()), session_->memory_headroom());
  std::string markdown = pl::render_search(request, result, context, pl::Format::kMarkdown);
  const auto& selected = session_->selected();
  if (selected && (result.ranked.empty() || !same_layout(result.ranked.front().plan.parallel, selected->plan.parallel))) {
    markdown += "\n" + pl::render_evaluation(*selected, context, pl::Format::kMarkdown);
  }
  if (format == pl::Format::kHtml) {
    return QString::fromStdString(pl::markdown_to_html(markdown, "trainplan: " + request.model.name + " on " + std::to_string(request.gpus) + " GPUs"));
  }
  return QString::fromStdString(markdown);
}

}  // namespace trainplan::gui
