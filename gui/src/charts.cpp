#include "trainplan/gui/charts.hpp"

#include <algorithm>
#include <cmath>

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QColor>
#include <QHorizontalStackedBarSeries>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QPen>
#include <QScatterSeries>
#include <QValueAxis>

namespace trainplan::gui {

namespace {

// One colour per component, stable across rebuilds (the same part keeps its colour).
QColor part_color(int i) {
  static const QColor kColors[] = {QColor("#4e79a7"), QColor("#f28e2b"), QColor("#e15759"), QColor("#76b7b2"),
                                   QColor("#59a14f"), QColor("#edc948"), QColor("#b07aa1"), QColor("#ff9da7"),
                                   QColor("#9c755f"), QColor("#bab0ac"), QColor("#86bcb6")};
  return kColors[static_cast<std::size_t>(i) % (sizeof kColors / sizeof kColors[0])];
}

QChart* fresh_chart(QChartView* view) {
  auto* chart = new QChart();
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  QChart* old = view->chart();
  view->setChart(chart);  // the view owns the new chart; the old one is ours to delete
  delete old;
  return chart;
}

}  // namespace

BreakdownChartView::BreakdownChartView(BreakdownModel* model, QWidget* parent) : QChartView(parent), model_(model) {
  setRenderHint(QPainter::Antialiasing);
  setMinimumSize(360, 220);
  connect(model_, &QAbstractItemModel::modelReset, this, &BreakdownChartView::model_changed);
  rebuild();
}

void BreakdownChartView::model_changed() {
  if (isVisible()) rebuild();
  else stale_ = true;
}

void BreakdownChartView::showEvent(QShowEvent* event) {
  if (stale_) rebuild();
  QChartView::showEvent(event);
}

QStringList BreakdownChartView::categories() {
  if (stale_) rebuild();
  return categories_;
}

double BreakdownChartView::capacity_line() {
  if (stale_) rebuild();
  return capacity_line_;
}

int BreakdownChartView::component_count() {
  if (stale_) rebuild();
  for (QAbstractSeries* s : chart()->series()) {
    if (auto* bars = qobject_cast<QHorizontalStackedBarSeries*>(s)) return static_cast<int>(bars->count());
  }
  return 0;
}

double BreakdownChartView::bar_total(int category) {
  if (stale_) rebuild();
  double total = 0;
  for (QAbstractSeries* s : chart()->series()) {
    auto* bars = qobject_cast<QHorizontalStackedBarSeries*>(s);
    if (!bars) continue;
    for (QBarSet* set : bars->barSets()) {
      if (category < set->count()) total += set->at(category);
    }
  }
  return total;
}

void BreakdownChartView::rebuild() {
  stale_ = false;
  QChart* chart = fresh_chart(this);
  chart->legend()->setAlignment(Qt::AlignRight);
  categories_.clear();
  capacity_line_ = 0;
  const bool memory = model_->kind() == BreakdownModel::Kind::kMemory;
  const QString unit = model_->unit();
  if (!model_->has_estimate()) {
    chart->setTitle(memory ? tr("Memory per GPU: no plan selected") : tr("Step time: no plan selected"));
    return;
  }
  const auto& parts = model_->parts();
  bool any_measured = false;
  double measured_parts = 0;
  for (const auto& p : parts) {
    if (p.measured) {
      any_measured = true;
      measured_parts += *p.measured;
    }
  }
  const auto measured_total = model_->measured_total();
  any_measured = any_measured || measured_total.has_value();
  categories_ << tr("Predicted");
  if (any_measured) categories_ << tr("Measured");

  auto* series = new QHorizontalStackedBarSeries();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    if (p.predicted <= 0 && (!p.measured || *p.measured <= 0)) continue;  // a part this plan does not have
    auto* set = new QBarSet(QString::fromStdString(p.name));
    set->setColor(part_color(static_cast<int>(i)));
    *set << p.predicted;
    if (any_measured) *set << p.measured.value_or(0.0);
    series->append(set);
  }
  // What the measured total holds beyond the parts the executor attributes.
  if (measured_total && *measured_total > measured_parts + 1e-12) {
    auto* set = new QBarSet(memory ? tr("measured, not attributed") : tr("measured, not attributed"));
    set->setColor(QColor("#d3d3d3"));
    *set << 0.0 << (*measured_total - measured_parts);
    series->append(set);
  }
  series->setBarWidth(0.6);
  chart->addSeries(series);

  auto* categories = new QBarCategoryAxis();
  categories->append(categories_);
  chart->addAxis(categories, Qt::AlignLeft);
  series->attachAxis(categories);

  auto* values = new QValueAxis();
  values->setTitleText(memory ? tr("GiB per GPU (2^30 bytes)") : tr("seconds per step"));
  double top = std::max(model_->predicted_total(), measured_total.value_or(0.0));
  top = std::max(top, measured_parts);
  // The axis reaches the capacity when the plan uses a fair share of it; a small plan on a big GPU
  // would otherwise be a sliver (the title still says "of N GiB").
  const bool show_capacity = memory && model_->capacity() > 0 && top >= 0.2 * model_->capacity();
  if (show_capacity) top = std::max(top, model_->capacity());
  values->setRange(0, top * 1.08 > 0 ? top * 1.08 : 1);
  values->setLabelFormat(QStringLiteral("%.3g"));
  values->applyNiceNumbers();
  chart->addAxis(values, Qt::AlignBottom);
  series->attachAxis(values);

  if (show_capacity) {
    capacity_line_ = model_->capacity();
    auto* line = new QLineSeries();
    line->setName(tr("capacity %1 GiB").arg(capacity_line_, 0, 'f', 0));
    QPen pen(QColor("#c00000"));
    pen.setWidth(2);
    pen.setStyle(Qt::DashLine);
    line->setPen(pen);
    line->append(capacity_line_, -0.5);
    line->append(capacity_line_, categories_.size() - 0.5);
    chart->addSeries(line);
    auto* rows = new QValueAxis();
    rows->setRange(-0.5, categories_.size() - 0.5);
    rows->setVisible(false);
    chart->addAxis(rows, Qt::AlignRight);
    line->attachAxis(values);
    line->attachAxis(rows);
  }

  QString title = memory ? tr("Memory per GPU: %1 of %2 GiB").arg(model_->predicted_total(), 0, 'f', 1).arg(model_->capacity(), 0, 'f', 0)
                         : tr("Step time: %1 s").arg(model_->predicted_total(), 0, 'f', 3);
  if (measured_total) title += tr("; measured %1 %2").arg(*measured_total, 0, 'f', memory ? 1 : 3).arg(unit);
  chart->setTitle(title);
}

ScalingChartView::ScalingChartView(ScalingModel* model, QWidget* parent) : QChartView(parent), model_(model) {
  setRenderHint(QPainter::Antialiasing);
  setMinimumSize(360, 220);
  connect(model_, &QAbstractItemModel::modelReset, this, &ScalingChartView::model_changed);
  rebuild();
}

void ScalingChartView::model_changed() {
  if (isVisible()) rebuild();
  else stale_ = true;
}

void ScalingChartView::showEvent(QShowEvent* event) {
  if (stale_) rebuild();
  QChartView::showEvent(event);
}

int ScalingChartView::throughput_points() {
  if (stale_) rebuild();
  return throughput_points_;
}

int ScalingChartView::mfu_points() {
  if (stale_) rebuild();
  return mfu_points_;
}

void ScalingChartView::set_current_gpus(int gpus) {
  current_gpus_ = gpus;
  model_changed();
}

void ScalingChartView::rebuild() {
  stale_ = false;
  QChart* chart = fresh_chart(this);
  throughput_points_ = mfu_points_ = 0;
  const auto& points = model_->points();
  if (points.empty()) {
    chart->setTitle(tr("Scaling: waiting for the search"));
    return;
  }
  chart->setTitle(tr("Scaling at a fixed global batch: best plan per GPU count"));
  auto* throughput = new QLineSeries();
  throughput->setName(tr("throughput (tokens/s)"));
  throughput->setPointsVisible(true);
  auto* mfu = new QLineSeries();
  mfu->setName(tr("MFU (%)"));
  mfu->setPointsVisible(true);
  auto* current = new QScatterSeries();
  current->setName(tr("this request"));
  current->setMarkerSize(12);
  current->setColor(QColor("#c00000"));
  double max_tps = 0, min_gpus = points.front().gpus, max_gpus = points.back().gpus;
  for (const auto& p : points) {
    min_gpus = std::min<double>(min_gpus, p.gpus);
    max_gpus = std::max<double>(max_gpus, p.gpus);
    if (!p.best) continue;
    const double tps = p.best->estimate.throughput.tokens_per_second;
    throughput->append(p.gpus, tps);
    mfu->append(p.gpus, 100 * p.best->estimate.throughput.mfu);
    if (p.gpus == current_gpus_) current->append(p.gpus, tps);
    max_tps = std::max(max_tps, tps);
  }
  throughput_points_ = static_cast<int>(throughput->count());
  mfu_points_ = static_cast<int>(mfu->count());
  chart->addSeries(throughput);
  chart->addSeries(current);
  chart->addSeries(mfu);

  auto* gpus = new QLogValueAxis();
  gpus->setBase(2);
  gpus->setLabelFormat(QStringLiteral("%.0f"));
  gpus->setTitleText(tr("GPUs (log scale)"));
  gpus->setRange(min_gpus / 1.3, max_gpus * 1.3);
  gpus->setMinorTickCount(0);
  chart->addAxis(gpus, Qt::AlignBottom);
  auto* tps_axis = new QValueAxis();
  tps_axis->setTitleText(tr("tokens/s"));
  tps_axis->setRange(0, max_tps > 0 ? max_tps * 1.1 : 1);
  tps_axis->setLabelFormat(QStringLiteral("%.3g"));
  chart->addAxis(tps_axis, Qt::AlignLeft);
  auto* mfu_axis = new QValueAxis();
  mfu_axis->setTitleText(tr("MFU (%)"));
  mfu_axis->setRange(0, 100);
  mfu_axis->setLabelFormat(QStringLiteral("%.0f"));
  chart->addAxis(mfu_axis, Qt::AlignRight);
  for (QAbstractSeries* s : {static_cast<QAbstractSeries*>(throughput), static_cast<QAbstractSeries*>(current)}) {
    s->attachAxis(gpus);
    s->attachAxis(tps_axis);
  }
  mfu->attachAxis(gpus);
  mfu->attachAxis(mfu_axis);
  QPen mfu_pen(QColor("#59a14f"));
  mfu_pen.setWidth(2);
  mfu_pen.setStyle(Qt::DashLine);
  mfu->setPen(mfu_pen);
  QPen tps_pen(QColor("#4e79a7"));
  tps_pen.setWidth(2);
  throughput->setPen(tps_pen);
}

}  // namespace trainplan::gui
