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

  // What is drawn, read back from the chart's series: the categories ("Predicted", "Measured"),
  // the number of stacked components, and the sum of the bar of category `category` (GiB or s).
  [[nodiscard]] QStringList categories() const { return categories_; }
  [[nodiscard]] int component_count() const;
  [[nodiscard]] double bar_total(int category) const;
  // Memory: where the capacity line stands (GiB); 0 when none is drawn.
  [[nodiscard]] double capacity_line() const { return capacity_line_; }

 private:
  void rebuild();
  BreakdownModel* model_;
  QStringList categories_;
  double capacity_line_ = 0;
};

class ScalingChartView : public QChartView {
  Q_OBJECT
 public:
  explicit ScalingChartView(ScalingModel* model, QWidget* parent = nullptr);
  // Points drawn on the tokens/s and MFU curves (GPU counts where a plan fits).
  [[nodiscard]] int throughput_points() const { return throughput_points_; }
  [[nodiscard]] int mfu_points() const { return mfu_points_; }
  // The request's GPU count, marked on the chart; 0 for none.
  void set_current_gpus(int gpus);

 private:
  void rebuild();
  ScalingModel* model_;
  int current_gpus_ = 0;
  int throughput_points_ = 0, mfu_points_ = 0;
};

}  // namespace trainplan::gui
