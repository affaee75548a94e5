#include "trainplan/gui/schedule_view.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <QPainter>
#include <QPaintEvent>

namespace trainplan::gui {

namespace cm = trainplan::costmodel;

int ScheduleData::passes() const {
  return static_cast<int>(std::count_if(bars.begin(), bars.end(), [](const ScheduleBar& b) {
    return b.kind == BarKind::kForward || b.kind == BarKind::kBackward;
  }));
}

ScheduleData schedule_from_simulation(const cm::ScheduleSimulation& sim, const cm::PipelineTimeline& timeline) {
  ScheduleData d;
  d.makespan = sim.makespan;
  d.bubble_fraction = sim.bubble_fraction;
  d.micro_batches = timeline.micro_batches;
  d.virtual_stages = timeline.virtual_stages;
  for (int s = 0; s < timeline.stages; ++s) d.row_labels << QStringLiteral("stage %1").arg(s);
  d.bars.reserve(sim.passes.size());
  for (const auto& p : sim.passes) {
    d.bars.push_back(ScheduleBar{p.stage, p.pass.kind == cm::PassKind::kForward ? BarKind::kForward : BarKind::kBackward,
                                 p.pass.micro_batch, p.pass.chunk, p.start, p.end});
  }
  d.title = QStringLiteral("Predicted (cost model): %1 stages, %2 micro-batches, %3%4; bubble %5% of busy time")
                .arg(timeline.stages)
                .arg(timeline.micro_batches)
                .arg(QString::fromUtf8(cm::schedule_name(timeline.schedule)))
                .arg(timeline.virtual_stages > 1 ? QStringLiteral(" v=%1").arg(timeline.virtual_stages) : QString())
                .arg(100 * sim.bubble_fraction, 0, 'f', 1);
  return d;
}

ScheduleData schedule_from_trace(const planner::Trace& trace) {
  ScheduleData d;
  d.bubble_fraction = trace.bubble_fraction;
  d.micro_batches = trace.micro_batches;
  d.virtual_stages = trace.virtual_stages;
  std::map<int, int> rank_of_stage;  // the lowest rank seen on each stage
  int stages = trace.stages;
  for (const auto& e : trace.events) {
    auto it = rank_of_stage.find(e.stage);
    if (it == rank_of_stage.end() || e.rank < it->second) rank_of_stage[e.stage] = e.rank;
    stages = std::max(stages, e.stage + 1);
  }
  for (int s = 0; s < stages; ++s) {
    const auto it = rank_of_stage.find(s);
    d.row_labels << (it == rank_of_stage.end() ? QStringLiteral("stage %1").arg(s) : QStringLiteral("stage %1 (rank %2)").arg(s).arg(it->second));
  }
  static const std::map<std::string, BarKind> kKinds = {
      {"forward", BarKind::kForward}, {"backward", BarKind::kBackward}, {"send", BarKind::kSend},
      {"recv", BarKind::kRecv},       {"dp_comm", BarKind::kDataParallelComm}, {"optimizer", BarKind::kOptimizer}};
  for (const auto& e : trace.events) {
    if (rank_of_stage[e.stage] != e.rank) continue;
    const auto kind = kKinds.find(e.kind);
    if (kind == kKinds.end()) continue;
    d.bars.push_back(ScheduleBar{e.stage, kind->second, e.micro_batch, e.chunk, e.start, e.end});
    d.makespan = std::max(d.makespan, e.end);
  }
  d.title = QStringLiteral("Measured (executor trace, step %1): %2 stages, %3 micro-batches, %4; bubble %5% of busy time")
                .arg(trace.step)
                .arg(stages)
                .arg(trace.micro_batches)
                .arg(QString::fromStdString(trace.schedule.empty() ? std::string("schedule not named") : trace.schedule))
                .arg(100 * trace.bubble_fraction, 0, 'f', 1);
  return d;
}

PipelineScheduleView::PipelineScheduleView(QWidget* parent) : QWidget(parent) {
  setAutoFillBackground(true);
  setBackgroundRole(QPalette::Base);
  message_ = tr("No plan selected");
}

void PipelineScheduleView::set_schedule(ScheduleData data) {
  data_ = std::move(data);
  message_.clear();
  updateGeometry();
  update();
}

void PipelineScheduleView::clear(const QString& message) {
  data_ = ScheduleData{};
  message_ = message;
  update();
}

void PipelineScheduleView::set_time_span(double seconds) {
  time_span_ = seconds;
  update();
}

QSize PipelineScheduleView::sizeHint() const {
  return QSize(720, 70 + 24 * std::max<int>(1, static_cast<int>(data_.row_labels.size())));
}

QSize PipelineScheduleView::minimumSizeHint() const { return QSize(320, 120); }

namespace {

QColor bar_color(const ScheduleBar& b, int virtual_stages) {
  // Chunks of the same stage in lighter shades of the pass colour.
  const double shade = virtual_stages > 1 ? static_cast<double>(b.chunk) / virtual_stages : 0.0;
  switch (b.kind) {
    case BarKind::kForward: return QColor::fromHslF(0.58, 0.60, 0.45 + 0.30 * shade);
    case BarKind::kBackward: return QColor::fromHslF(0.33, 0.50, 0.40 + 0.30 * shade);
    case BarKind::kSend:
    case BarKind::kRecv: return QColor("#7f7f7f");
    case BarKind::kDataParallelComm: return QColor("#f28e2b");
    case BarKind::kOptimizer: return QColor("#b07aa1");
  }
  return Qt::black;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `count` ticks over `span`.
double tick_step(double span, int count) {
  const double raw = span / std::max(1, count);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

}  // namespace

void PipelineScheduleView::paintEvent(QPaintEvent* /*event*/) {
  QPainter painter(this);
  painter.fillRect(rect(), palette().base());
  painted_passes_ = 0;
  const QFontMetrics fm = painter.fontMetrics();
  if (data_.row_labels.isEmpty() || data_.makespan <= 0) {
    painter.setPen(palette().color(QPalette::Text));
    painter.drawText(rect(), Qt::AlignCenter, message_.isEmpty() ? tr("No pipeline schedule") : message_);
    return;
  }
  const int rows = static_cast<int>(data_.row_labels.size());
  int label_width = 0;
  for (const auto& l : data_.row_labels) label_width = std::max(label_width, fm.horizontalAdvance(l));
  const int left = label_width + 14, right = 12;
  const int top = fm.height() + 10;
  const int legend_height = fm.height() + 8, axis_height = fm.height() + 10;
  const int plot_height = std::max(rows * 8, height() - top - axis_height - legend_height);
  const double row_height = static_cast<double>(plot_height) / rows;
  const int plot_width = std::max(10, width() - left - right);
  const double span = time_span_ > data_.makespan ? time_span_ : data_.makespan;
  const auto x_of = [&](double t) { return left + plot_width * t / span; };

  painter.setPen(palette().color(QPalette::Text));
  painter.drawText(QRect(4, 2, width() - 8, fm.height() + 4), Qt::AlignLeft | Qt::AlignVCenter, data_.title);

  // Rows: idle background, so that what no bar covers is the bubble.
  for (int r = 0; r < rows; ++r) {
    const QRectF row(left, top + r * row_height + 1, x_of(data_.makespan) - left, row_height - 2);
    painter.fillRect(row, QColor("#e6e6e6"));
    painter.setPen(palette().color(QPalette::Text));
    painter.drawText(QRectF(2, top + r * row_height, left - 8, row_height), Qt::AlignRight | Qt::AlignVCenter, data_.row_labels[r]);
  }

  painter.setRenderHint(QPainter::Antialiasing, false);
  for (const ScheduleBar& b : data_.bars) {
    if (b.row < 0 || b.row >= rows) continue;
    const bool pass = b.kind == BarKind::kForward || b.kind == BarKind::kBackward;
    const double x0 = x_of(b.start);
    const double w = std::max(1.0, x_of(b.end) - x0);
    double y = top + b.row * row_height + 1, h = row_height - 2;
    if (!pass) {  // transfers and collectives: a thin strip at the bottom of the row
      y += h * 0.7;
      h *= 0.3;
    }
    const QRectF bar(x0, y, w, h);
    painter.fillRect(bar, bar_color(b, data_.virtual_stages));
    if (pass) {
      ++painted_passes_;
      if (w >= 6) {
        painter.setPen(QColor(255, 255, 255, 160));
        painter.drawLine(QPointF(x0, y), QPointF(x0, y + h));  // separates neighbouring passes
      }
      const QString label = QString::number(b.micro_batch);
      if (w > fm.horizontalAdvance(label) + 4 && h > fm.height()) {
        painter.setPen(Qt::white);
        painter.drawText(bar, Qt::AlignCenter, label);
      }
    }
  }

  // Time axis.
  const int axis_y = top + plot_height + 2;
  painter.setPen(palette().color(QPalette::Text));
  painter.drawLine(left, axis_y, left + plot_width, axis_y);
  const double step = tick_step(span, std::max(2, plot_width / 90));
  const bool millis = span < 1.0;
  for (double t = 0; t <= span * 1.0001; t += step) {
    const double x = x_of(t);
    painter.drawLine(QPointF(x, axis_y), QPointF(x, axis_y + 4));
    const QString text = millis ? QStringLiteral("%1 ms").arg(t * 1e3, 0, 'g', 4) : QStringLiteral("%1 s").arg(t, 0, 'g', 4);
    painter.drawText(QRectF(x - 40, axis_y + 4, 80, fm.height()), Qt::AlignHCenter | Qt::AlignTop, text);
  }

  // Legend.
  struct Entry {
    QColor color;
    QString text;
  };
  std::vector<Entry> legend = {{bar_color({0, BarKind::kForward, 0, 0, 0, 0}, 1), tr("forward (micro-batch number)")},
                               {bar_color({0, BarKind::kBackward, 0, 0, 0, 0}, 1), tr("backward")},
                               {QColor("#e6e6e6"), tr("idle (bubble, pipeline exchanges)")}};
  const bool has_other = std::any_of(data_.bars.begin(), data_.bars.end(), [](const ScheduleBar& b) {
    return b.kind != BarKind::kForward && b.kind != BarKind::kBackward;
  });
  if (has_other) {
    legend.push_back({QColor("#7f7f7f"), tr("send/recv")});
    legend.push_back({QColor("#f28e2b"), tr("data-parallel comm")});
    legend.push_back({QColor("#b07aa1"), tr("optimizer")});
  }
  if (data_.virtual_stages > 1) legend.push_back({bar_color({0, BarKind::kForward, 0, data_.virtual_stages - 1, 0, 0}, data_.virtual_stages), tr("later chunks lighter")});
  int x = left;
  const int legend_y = height() - legend_height + 2;
  for (const auto& e : legend) {
    painter.fillRect(QRect(x, legend_y + 2, 12, fm.height() - 4), e.color);
    painter.setPen(palette().color(QPalette::Text));
    painter.drawText(QPoint(x + 16, legend_y + fm.ascent()), e.text);
    x += 16 + fm.horizontalAdvance(e.text) + 18;
  }
}

}  // namespace trainplan::gui
