#pragma once
// Qt item models over planner and costmodel results, for QTableView and the charts:
//  - PlanTableModel: the ranked layouts of a search (each at its best variant, its other
//    micro-batch, virtual-stage and schedule variants folded under it and shown on request) and
//    the best plan of every other shape, one row each, with units in every header;
//    PlanFilterProxy sorts it by value and filters fitting plans.
//  - BreakdownModel: the memory (GiB) or step-time (s) components of one estimate, with the
//    measured value beside each when a measurement is loaded.
//  - ScalingModel: the best plan's tokens/s and MFU for each GPU count.
//  - ComparisonModel: planner::compare's rows (predicted, measured, relative difference).

#include <optional>
#include <string>
#include <vector>

#include <QAbstractTableModel>
#include <QSortFilterProxyModel>

#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/search.hpp"
#include "trainplan/planner/tune.hpp"

namespace trainplan::gui {

// The role that gives a cell's value as a number (for sorting and tests); display text is formatted.
inline constexpr int kValueRole = Qt::UserRole + 1;

struct PlanRow {
  planner::Candidate candidate;
  int rank = 0;       // 1.. for ranked plans; 0 for the best plan of another shape or a variant
  std::string note;   // why an alternative loses ("12% slower: ...", "stage 0 needs ... GiB")
  int variants = 0;   // ranked rows: the other fitting variants of the layout (folded under it)
  int variant_of = 0; // a variant row: the rank of its layout's row; 0 otherwise
  int variant = 0;    // a variant row: 1.., best first
  std::optional<double> measured_step;  // "Measure the top plans": this layout's measured step, seconds
  std::string measured_status;          // its status when not measured ("pending", "failed", ...)
};

class PlanTableModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    kRank, kTp, kPp, kDp, kCp, kEp, kZero, kMicroBatch, kMicroBatches, kRecompute, kSchedule, kMemory, kCapacity,
    kFits, kStepTime, kTokensPerSecond, kMfu, kDays, kGpuHours, kCost, kMeasured, kVariants, kNote, kColumnCount
  };

  explicit PlanTableModel(QObject* parent = nullptr);

  // Ranked layouts first (their variants folded), then the alternatives (best plan of each other
  // shape).
  void set_result(const planner::SearchResult& result);
  void clear();
  // Shows the folded variants of the ranked row `row` under it, or folds them again. Returns
  // whether anything changed (false for a row with no variants, an alternative or a variant).
  bool toggle_variants(int row);
  [[nodiscard]] bool expanded(int rank) const;
  // The tune's candidates (planner::tune): each row of a candidate's layout shows its measured step
  // or its status in the Measured column.
  void set_tune(const std::vector<planner::TuneCandidate>& candidates);
  [[nodiscard]] const PlanRow& row_at(int row) const { return rows_.at(static_cast<std::size_t>(row)); }
  [[nodiscard]] int row_count() const { return static_cast<int>(rows_.size()); }

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  int columnCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<PlanRow> rows_;
  std::vector<std::vector<planner::Candidate>> folded_;  // by rank - 1: the best variants kept by the search
  std::vector<int> expanded_;                             // ranks whose variants are shown
};

// Sorts PlanTableModel by kValueRole and, when fits_only, hides plans that do not fit.
class PlanFilterProxy : public QSortFilterProxyModel {
  Q_OBJECT
 public:
  explicit PlanFilterProxy(QObject* parent = nullptr);
  void set_fits_only(bool fits_only);
  [[nodiscard]] bool fits_only() const { return fits_only_; }

 protected:
  bool filterAcceptsRow(int source_row, const QModelIndex& source_parent) const override;

 private:
  bool fits_only_ = false;
};

// One component of a breakdown: its name, the document key it is measured under, its value.
struct BreakdownPart {
  std::string name;                // "weights", "tensor-parallel comm (exposed)"
  std::string key;                 // "weights_bytes", "tp_comm_seconds"
  double predicted = 0;            // GiB or seconds
  std::optional<double> measured;  // GiB or seconds, when the measurement has it
};

class BreakdownModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum class Kind { kMemory, kTime };
  enum Column { kPart, kPredicted, kShare, kMeasured, kColumnCount };

  explicit BreakdownModel(Kind kind, QObject* parent = nullptr);

  // The estimate's components (memory: worst stage, GiB; time: per step, s), and the measured
  // value of each that `measured` has (nullptr: none).
  void set_estimate(const costmodel::Estimate& estimate, const planner::PerformanceDocument* measured);
  void clear();

  [[nodiscard]] Kind kind() const { return kind_; }
  [[nodiscard]] const std::vector<BreakdownPart>& parts() const { return parts_; }
  // Memory: total and the GPU's capacity in GiB; time: step seconds (capacity 0).
  [[nodiscard]] double predicted_total() const { return predicted_total_; }
  [[nodiscard]] double capacity() const { return capacity_; }
  [[nodiscard]] std::optional<double> measured_total() const { return measured_total_; }
  [[nodiscard]] bool has_estimate() const { return has_estimate_; }
  [[nodiscard]] QString unit() const { return kind_ == Kind::kMemory ? QStringLiteral("GiB") : QStringLiteral("s"); }

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  int columnCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  Kind kind_;
  bool has_estimate_ = false;
  std::vector<BreakdownPart> parts_;
  double predicted_total_ = 0, capacity_ = 0;
  std::optional<double> measured_total_;
};

struct ScalingPoint {
  int gpus = 0;
  std::optional<planner::Candidate> best;  // absent: no plan fits (or none is valid) on that many GPUs
};

class ScalingModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kGpus, kTokensPerSecond, kMfu, kPlan, kColumnCount };
  explicit ScalingModel(QObject* parent = nullptr);
  void set_points(std::vector<ScalingPoint> points);
  [[nodiscard]] const std::vector<ScalingPoint>& points() const { return points_; }

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  int columnCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::vector<ScalingPoint> points_;
};

class ComparisonModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kSection, kQuantity, kPredicted, kMeasured, kDifference, kColumnCount };
  explicit ComparisonModel(QObject* parent = nullptr);
  void set_comparison(std::optional<planner::Comparison> comparison);
  [[nodiscard]] const std::optional<planner::Comparison>& comparison() const { return comparison_; }

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  int columnCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

 private:
  std::optional<planner::Comparison> comparison_;
};

// A plan's parallel layout in one line: "tp=8 pp=2 dp=4 zero=1 mb=1 recompute=selective 1f1b".
[[nodiscard]] QString layout_text(const costmodel::ParallelConfig& parallel);

}  // namespace trainplan::gui
