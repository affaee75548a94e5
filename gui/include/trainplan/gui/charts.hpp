#pragma once
// Chart widgets (Qt Charts) drawn from the item models, rebuilt whenever the model resets:
//  - BreakdownChartView: a stacked horizontal bar of a BreakdownModel: the prediction, and the
//    measurement below it when one is loaded; for memory, the GPU's capacity as a vertical line.
//  - ScalingChartView: tokens/s (left axis) and MFU (right axis) against the GPU count (log 2).

#include <QChartView>

#include "trainplan/gui/table_models.hpp"

QT_BEGIN_NAMESPACE
class QAbstractSeries;
QT_END_NAMESPACE

namespace trainplan::gui {

class BreakdownChartView : public QChartView {
  Q_OBJECT
 public:
  // `model` must outlive the view.
  explicit BreakdownChartView(BreakdownModel* model, QWidget* parent = nullptr);

  // What is drawn, read back from the chart's series (brought up to date first if hidden): the categories ("Predicted", "Measured"),
  // the number of stacked components, and the sum of the bar of category `category` (GiB or s).
  [[nodiscard]] QStringList categories();
  [[nodiscard]] int component_count();
  [[nodiscard]] double bar_total(int category);
  // Memory: where the capacity line stands (GiB); 0 when none is drawn (no prediction, or the
  // larger bar under 20% of the capacity: then the axis ends near the bars).
  [[nodiscard]] double capacity_line();

 protected:
  // A hidden chart (another tab) is rebuilt when it is shown, not on every model change.
  void showEvent(QShowEvent* event) override;

 private:
  void model_changed();
  void rebuild();
  BreakdownModel* model_;
  bool stale_ = false;
  QStringList categories_;
  double capacity_line_ = 0;
};

class ScalingChartView : public QChartView {
  Q_OBJECT
 public:
  explicit ScalingChartView(ScalingModel* model, QWidget* parent = nullptr);
  // Points drawn on the tokens/s and MFU curves (GPU counts where a plan fits).
  [[nodiscard]] int throughput_points();
  [[nodiscard]] int mfu_points();
  // The request's GPU count, marked on the chart; 0 for none.
  void set_current_gpus(int gpus);

 protected:
  void showEvent(QShowEvent* event) override;

 private:
  void model_changed();
  void rebuild();
  ScalingModel* model_;
  bool stale_ = false;
  int current_gpus_ = 0;
  int throughput_points_ = 0, mfu_points_ = 0;
};

}  // namespace trainplan::gui
