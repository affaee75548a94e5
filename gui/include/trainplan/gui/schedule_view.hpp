#pragma once
// PipelineScheduleView: a time line of one optimizer step per pipeline stage: every forward and
// backward pass of every micro-batch as a bar over time (seconds from the step's start), idle
// time (the bubble) left as the grey row behind them. The data come from the cost model's
// schedule (costmodel::simulate_pipeline of the estimate's PipelineTimeline) or from the
// executor's trace (planner::Trace, one rank per stage).

#include <vector>

#include <QString>
#include <QStringList>
#include <QWidget>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/planner/measurement.hpp"

namespace trainplan::gui {

enum class BarKind { kForward, kBackward, kSend, kRecv, kDataParallelComm, kOptimizer };

struct ScheduleBar {
  int row = 0;  // pipeline stage
  BarKind kind = BarKind::kForward;
  int micro_batch = -1;  // -1: belongs to no micro-batch
  int chunk = 0;         // model chunk (virtual stage) on that stage
  double start = 0;      // seconds from the step's start
  double end = 0;
};

struct ScheduleData {
  QString title;
  QStringList row_labels;  // one per stage
  double makespan = 0;     // seconds, the drawn time span
  double bubble_fraction = 0;
  int micro_batches = 0, virtual_stages = 1;
  std::vector<ScheduleBar> bars;
  [[nodiscard]] int passes() const;  // forward and backward bars
};

// The cost model's schedule of a plan. `timeline` is the estimate's; `simulation` its simulation.
[[nodiscard]] ScheduleData schedule_from_simulation(const costmodel::ScheduleSimulation& simulation,
                                                    const costmodel::PipelineTimeline& timeline);
// The executor's trace: for each stage the events of its lowest rank. Unknown kinds are skipped.
[[nodiscard]] ScheduleData schedule_from_trace(const planner::Trace& trace);

class PipelineScheduleView : public QWidget {
  Q_OBJECT
 public:
  explicit PipelineScheduleView(QWidget* parent = nullptr);

  void set_schedule(ScheduleData data);
  void clear(const QString& message);
  [[nodiscard]] const ScheduleData& schedule() const { return data_; }
  // Forward and backward bars drawn by the last paint (each at least one pixel wide).
  [[nodiscard]] int painted_passes() const { return painted_passes_; }
  // The time the view ends at: the makespan, or a longer one shared with another view so that
  // prediction and measurement line up (0: own makespan).
  void set_time_span(double seconds);

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;

 private:
  ScheduleData data_;
  QString message_;
  double time_span_ = 0;
  int painted_passes_ = 0;
};

}  // namespace trainplan::gui
