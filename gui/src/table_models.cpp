#include "trainplan/gui/table_models.hpp"

#include <algorithm>
#include <cmath>

#include <QBrush>
#include <QColor>
#include <QLocale>

namespace trainplan::gui {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

namespace {

constexpr double kGiB = cm::Bytes::gib(1).value();  // bytes per GiB, from the units header

QVariant right_aligned() { return QVariant::fromValue(Qt::Alignment(Qt::AlignRight | Qt::AlignVCenter)); }

QString number(double value, int decimals) { return QLocale::c().toString(value, 'f', decimals); }

// 1,234,567 with thousands separators.
QString grouped(double value) { return QLocale(QLocale::English, QLocale::UnitedStates).toString(value, 'f', 0); }

PlanRow plan_row(const pl::Candidate& candidate, int rank, const std::string& note) {
  PlanRow row;
  row.candidate = candidate;
  row.rank = rank;
  row.note = note;
  return row;
}

QString schedule_text(const cm::ParallelConfig& p) {
  if (p.pp == 1) return QStringLiteral("-");
  if (p.virtual_stages > 1) return QStringLiteral("interleaved v%1").arg(p.virtual_stages);
  return QString::fromUtf8(cm::schedule_name(p.schedule));
}

}  // namespace

QString layout_text(const cm::ParallelConfig& p) {
  QString s = QStringLiteral("tp=%1 pp=%2 dp=%3").arg(p.tp).arg(p.pp).arg(p.dp);
  if (p.cp > 1) s += QStringLiteral(" cp=%1").arg(p.cp);
  if (p.ep > 1) s += QStringLiteral(" ep=%1").arg(p.ep);
  s += QStringLiteral(" zero=%1").arg(p.zero_stage);
  if (p.shard_group) s += QStringLiteral(" shard_group=%1").arg(p.shard_group);
  s += QStringLiteral(" mb=%1 recompute=%2").arg(p.micro_batch).arg(QString::fromUtf8(cm::recompute_name(p.recompute)));
  if (p.pp > 1) s += QStringLiteral(" ") + schedule_text(p);
  if (p.tp > 1) s += p.sequence_parallel ? QStringLiteral(" sp=on") : QStringLiteral(" sp=off");
  if (p.offload_optimizer != cm::Offload::kNone) s += QStringLiteral(" offload=%1").arg(QString::fromUtf8(cm::offload_name(p.offload_optimizer)));
  return s;
}

// --- PlanTableModel ---

PlanTableModel::PlanTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void PlanTableModel::set_result(const pl::SearchResult& result) {
  beginResetModel();
  rows_.clear();
  folded_.clear();
  expanded_.clear();
  int rank = 1;
  for (std::size_t i = 0; i < result.ranked.size(); ++i) {
    const bool has = i < result.variants.size() && result.variants[i].count > 1;
    PlanRow row = plan_row(result.ranked[i], rank++, "");
    row.variants = has ? static_cast<int>(result.variants[i].count - 1) : 0;
    rows_.push_back(std::move(row));
    folded_.push_back(has ? result.variants[i].best : std::vector<pl::Candidate>{});
  }
  for (const auto& a : result.alternatives) rows_.push_back(plan_row(a.candidate, 0, a.reason));
  endResetModel();
}

void PlanTableModel::clear() {
  beginResetModel();
  rows_.clear();
  folded_.clear();
  expanded_.clear();
  endResetModel();
}

void PlanTableModel::set_tune(const std::vector<pl::TuneCandidate>& candidates) {
  for (auto& row : rows_) {
    if (row.variant_of > 0) continue;
    row.measured_step.reset();
    row.measured_status.clear();
    for (const auto& c : candidates) {
      if (!pl::same_layout(c.plan.parallel, row.candidate.plan.parallel)) continue;
      if (c.status == pl::RunStatus::kMeasured) row.measured_step = c.measured;
      else row.measured_status = c.status == pl::RunStatus::kPending ? "running" : pl::run_status_name(c.status);
    }
  }
  if (!rows_.empty()) emit dataChanged(index(0, kMeasured), index(static_cast<int>(rows_.size()) - 1, kMeasured));
}

bool PlanTableModel::expanded(int rank) const { return std::find(expanded_.begin(), expanded_.end(), rank) != expanded_.end(); }

bool PlanTableModel::toggle_variants(int row) {
  if (row < 0 || row >= static_cast<int>(rows_.size())) return false;
  const PlanRow& parent = rows_[static_cast<std::size_t>(row)];
  if (parent.rank <= 0 || parent.variants == 0 || folded_[static_cast<std::size_t>(parent.rank - 1)].empty()) return false;
  const int rank = parent.rank;
  const auto& variants = folded_[static_cast<std::size_t>(rank - 1)];
  const int n = static_cast<int>(variants.size());
  if (expanded(rank)) {
    beginRemoveRows(QModelIndex(), row + 1, row + n);
    rows_.erase(rows_.begin() + row + 1, rows_.begin() + row + 1 + n);
    expanded_.erase(std::find(expanded_.begin(), expanded_.end(), rank));
    endRemoveRows();
  } else {
    beginInsertRows(QModelIndex(), row + 1, row + n);
    std::vector<PlanRow> added;
    for (int i = 0; i < n; ++i) {
      PlanRow v = plan_row(variants[static_cast<std::size_t>(i)], 0, "");
      v.variant_of = rank;
      v.variant = i + 1;
      added.push_back(std::move(v));
    }
    rows_.insert(rows_.begin() + row + 1, added.begin(), added.end());
    expanded_.push_back(rank);
    endInsertRows();
  }
  const QModelIndex cell = index(row, kVariants);
  emit dataChanged(cell, cell);
  return true;
}

int PlanTableModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }
int PlanTableModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant PlanTableModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size()) || index.column() >= kColumnCount) return {};
  const PlanRow& row = rows_[static_cast<std::size_t>(index.row())];
  const cm::ParallelConfig& p = row.candidate.plan.parallel;
  const cm::Estimate& e = row.candidate.estimate;
  const int column = index.column();
  if (role == Qt::TextAlignmentRole) {
    return column == kRecompute || column == kSchedule || column == kNote || column == kFits || column == kVariants ? QVariant() : right_aligned();
  }
  if (role == Qt::BackgroundRole) {
    if (!e.fits) return QVariant(QBrush(QColor(255, 228, 225)));    // red: does not fit
    if (e.tight) return QVariant(QBrush(QColor(255, 243, 205)));    // amber: within the memory headroom
    return QVariant();
  }
  if (role == Qt::ToolTipRole) {
    QString tip = layout_text(p);
    if ((!e.fits || e.tight) && !e.reasons.empty()) tip += QStringLiteral("\n") + QString::fromStdString(e.reasons.front());
    if (!row.note.empty()) tip += QStringLiteral("\n") + QString::fromStdString(row.note);
    if (row.variants > 0) {
      tip += QStringLiteral("\n%1 other variant(s) of this layout fit (micro-batch, virtual stages, schedule); double-click to %2 the best of them")
                 .arg(row.variants)
                 .arg(expanded(row.rank) ? QStringLiteral("fold") : QStringLiteral("show"));
    }
    if (row.variant_of > 0) tip += QStringLiteral("\nvariant %1 of layout #%2").arg(row.variant).arg(row.variant_of);
    return tip;
  }
  if (role == kValueRole) {
    switch (column) {
      // Variants right under their layout, alternatives after the ranked plans.
      case kRank: return row.rank > 0 ? static_cast<double>(row.rank)
                       : row.variant_of > 0 ? row.variant_of + row.variant / 1000.0 : 100000.0 + index.row();
      case kVariants: return row.variants;
      case kMeasured: return row.measured_step ? *row.measured_step : -1.0;
      case kTp: return p.tp;
      case kPp: return p.pp;
      case kDp: return p.dp;
      case kCp: return p.cp;
      case kEp: return p.ep;
      case kZero: return p.zero_stage;
      case kMicroBatch: return p.micro_batch;
      case kMicroBatches: return e.micro_batches;
      case kRecompute: return static_cast<int>(p.recompute);
      case kSchedule: return p.pp == 1 ? 0 : static_cast<int>(p.schedule) * 100 + p.virtual_stages;
      case kMemory: return e.memory.required.in_gib();
      case kCapacity: return e.memory.capacity.in_gib();
      case kFits: return e.fits ? (e.tight ? 1 : 2) : 0;
      case kStepTime: return e.time.step.value();
      case kTokensPerSecond: return e.throughput.tokens_per_second;
      case kMfu: return 100 * e.throughput.mfu;
      case kDays: return e.run.wall_time.in_days();
      case kGpuHours: return e.run.gpu_hours;
      case kCost: return e.run.cost_usd;
      case kNote: return QString::fromStdString(row.note);
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case kRank: return row.rank > 0 ? QString::number(row.rank) : row.variant_of > 0 ? QStringLiteral("  \u21B3") : QStringLiteral("-");
    case kMeasured:
      if (row.measured_step) return number(*row.measured_step, 3);
      return QString::fromStdString(row.measured_status);
    case kVariants:
      if (row.variants == 0) return QString();
      return expanded(row.rank) ? QStringLiteral("\u25BE +%1").arg(row.variants) : QStringLiteral("\u25B8 +%1").arg(row.variants);
    case kTp: return p.tp;
    case kPp: return p.pp;
    case kDp: return p.dp;
    case kCp: return p.cp;
    case kEp: return p.ep;
    case kZero: return p.shard_group ? QStringLiteral("3/h%1").arg(p.shard_group) : QString::number(p.zero_stage);
    case kMicroBatch: return p.micro_batch;
    case kMicroBatches: return e.micro_batches;
    case kRecompute: return QString::fromUtf8(cm::recompute_name(p.recompute));
    case kSchedule: return schedule_text(p);
    case kMemory: return number(e.memory.required.in_gib(), 1);
    case kCapacity: return number(e.memory.capacity.in_gib(), 0);
    case kFits: return e.fits ? (e.tight ? QStringLiteral("tight") : QStringLiteral("yes")) : QStringLiteral("no");
    case kStepTime: return number(e.time.step.value(), 3);
    case kTokensPerSecond: return grouped(e.throughput.tokens_per_second);
    case kMfu: return number(100 * e.throughput.mfu, 1);
    case kDays: return number(e.run.wall_time.in_days(), 1);
    case kGpuHours: return grouped(e.run.gpu_hours);
    case kCost: return grouped(e.run.cost_usd);
    case kNote:
      if ((!e.fits || e.tight) && !e.reasons.empty()) return QString::fromStdString(e.reasons.front());
      return QString::fromStdString(row.note);
    default: return {};
  }
}

QVariant PlanTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || section < 0 || section >= kColumnCount) return QAbstractTableModel::headerData(section, orientation, role);
  if (role == Qt::ToolTipRole) {
    switch (section) {
      case kMicroBatch: return QStringLiteral("Sequences per micro-batch per data-parallel replica");
      case kMicroBatches: return QStringLiteral("Micro-batches per optimizer step (gradient accumulation)");
      case kMemory: return QStringLiteral("Memory per GPU on the worst pipeline stage, GiB (2^30 bytes)");
      case kDays: return QStringLiteral("Wall-clock days for the requested tokens, with checkpoints and failures");
      case kMeasured: return QStringLiteral("Step time this layout measured on this machine's ranks (File > Measure the top plans), seconds");
      case kVariants: return QStringLiteral("Other fitting variants of the layout (micro-batch, virtual stages, schedule), folded under its best: double-click the row");
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  static const char* const kHeaders[kColumnCount] = {
      "#", "TP", "PP", "DP", "CP", "EP", "ZeRO", "Micro-batch (seq)", "Micro-batches / step", "Recompute", "Schedule",
      "Memory / GPU (GiB)", "Capacity (GiB)", "Fits", "Step time (s)", "Throughput (tokens/s)", "MFU (%)",
      "Training time (days)", "GPU-hours (h)", "Cost (USD)", "Measured step (s)", "Variants", "Note"};
  return QString::fromUtf8(kHeaders[section]);
}

// --- PlanFilterProxy ---

PlanFilterProxy::PlanFilterProxy(QObject* parent) : QSortFilterProxyModel(parent) { setSortRole(kValueRole); }

void PlanFilterProxy::set_fits_only(bool fits_only) {
  if (fits_only == fits_only_) return;
  fits_only_ = fits_only;
  invalidateFilter();
}

bool PlanFilterProxy::filterAcceptsRow(int source_row, const QModelIndex& source_parent) const {
  if (!fits_only_) return true;
  const QModelIndex index = sourceModel()->index(source_row, PlanTableModel::kFits, source_parent);
  return sourceModel()->data(index, kValueRole).toInt() >= 1;  // fits: with room (2) or tight (1)
}

// --- BreakdownModel ---

BreakdownModel::BreakdownModel(Kind kind, QObject* parent) : QAbstractTableModel(parent), kind_(kind) {}

void BreakdownModel::set_estimate(const cm::Estimate& e, const pl::PerformanceDocument* measured) {
  beginResetModel();
  parts_.clear();
  has_estimate_ = true;
  const auto measured_value = [&](const std::string& key, double scale) -> std::optional<double> {
    if (!measured) return std::nullopt;
    const auto& section = kind_ == Kind::kMemory ? measured->memory : measured->time;
    const auto it = section.find(key);
    if (it == section.end()) return std::nullopt;
    return it->second / scale;
  };
  const auto add = [&](const char* name, const char* key, double value, double scale) {
    parts_.push_back(BreakdownPart{name, key, value / scale, measured_value(key, scale)});
  };
  if (kind_ == Kind::kMemory) {
    const auto& m = e.memory;
    add("weights", "weights_bytes", m.weights.value(), kGiB);
    // The gradients alive at the peak: fewer than the step ends with where the stack frees them each step.
    add(m.gradients_step_end.value() > m.gradients.value() ? "gradients alive at the peak" : "gradients", "gradients_bytes", m.gradients.value(), kGiB);
    add("optimizer states", "optimizer_bytes", m.optimizer.value(), kGiB);
    add("activations", "activations_bytes", m.activations.value(), kGiB);
    add("comm buffers, workspaces", "buffers_bytes", m.buffers.value(), kGiB);
    add("allocator cache", "allocator_cache_bytes", (m.reserved - m.total).value(), kGiB);
    add("CUDA context", "overhead_bytes", m.overhead.value(), kGiB);
    predicted_total_ = m.required.value() / kGiB;
    capacity_ = m.capacity.value() / kGiB;
    // A measurement has the allocator's peak reserved bytes (GPU runs), else its allocated peak;
    // the context outside the allocator is not measured.
    measured_total_ = measured_value("reserved_bytes", kGiB);
    if (!measured_total_) measured_total_ = measured_value("total_bytes", kGiB);
  } else {
    const auto& t = e.time;
    add("compute", "compute_seconds", t.compute.value(), 1);
    add("recompute", "recompute_seconds", t.recompute.value(), 1);
    add("tensor-parallel comm", "tp_comm_seconds", t.tp_comm.value(), 1);
    add("context-parallel comm", "cp_comm_seconds", t.cp_comm.value(), 1);
    add("expert-parallel comm", "ep_comm_seconds", t.ep_comm.value(), 1);
    add("pipeline p2p", "pp_comm_seconds", t.pp_comm.value(), 1);
    add("pipeline bubble", "bubble_seconds", t.bubble.value(), 1);
    add("data-parallel comm (exposed)", "dp_comm_exposed_seconds", t.dp_comm_exposed.value(), 1);
    add("sharding copies", "dp_copy_seconds", t.dp_copies.value(), 1);
    add("host-bound wait", "host_wait_seconds", t.host_wait.value(), 1);
    add("optimizer step", "optimizer_seconds", t.optimizer.value(), 1);
    add("offload transfers", "offload_seconds", t.offload.value(), 1);
    predicted_total_ = t.step.value();
    capacity_ = 0;
    measured_total_ = measured_value("step_seconds", 1);
  }
  endResetModel();
}

void BreakdownModel::clear() {
  beginResetModel();
  parts_.clear();
  has_estimate_ = false;
  predicted_total_ = capacity_ = 0;
  measured_total_.reset();
  endResetModel();
}

int BreakdownModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(parts_.size()) + (has_estimate_ ? 1 : 0); }
int BreakdownModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant BreakdownModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount() || index.column() >= kColumnCount) return {};
  const bool total_row = index.row() == static_cast<int>(parts_.size());
  const std::string name = total_row ? (kind_ == Kind::kMemory ? "total" : "step") : parts_[static_cast<std::size_t>(index.row())].name;
  const double predicted = total_row ? predicted_total_ : parts_[static_cast<std::size_t>(index.row())].predicted;
  const std::optional<double> measured = total_row ? measured_total_ : parts_[static_cast<std::size_t>(index.row())].measured;
  const double whole = kind_ == Kind::kMemory ? capacity_ : predicted_total_;
  const int decimals = kind_ == Kind::kMemory ? 2 : 4;
  if (role == Qt::TextAlignmentRole) return index.column() == kPart ? QVariant() : right_aligned();
  if (role == kValueRole) {
    switch (index.column()) {
      case kPart: return QString::fromStdString(name);
      case kPredicted: return predicted;
      case kShare: return whole > 0 ? 100 * predicted / whole : 0.0;
      case kMeasured: return measured ? QVariant(*measured) : QVariant();
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kPart: return QString::fromStdString(name);
    case kPredicted: return number(predicted, decimals);
    case kShare: return whole > 0 ? number(100 * predicted / whole, 1) : QString();
    case kMeasured: return measured ? number(*measured, decimals) : QStringLiteral("not measured");
    default: return {};
  }
}

QVariant BreakdownModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  const bool memory = kind_ == Kind::kMemory;
  switch (section) {
    case kPart: return memory ? QStringLiteral("Memory per GPU") : QStringLiteral("Time per step");
    case kPredicted: return memory ? QStringLiteral("Predicted (GiB)") : QStringLiteral("Predicted (s)");
    case kShare: return memory ? QStringLiteral("Of capacity (%)") : QStringLiteral("Of step (%)");
    case kMeasured: return memory ? QStringLiteral("Measured (GiB)") : QStringLiteral("Measured (s)");
    default: return {};
  }
}

// --- ScalingModel ---

ScalingModel::ScalingModel(QObject* parent) : QAbstractTableModel(parent) {}

void ScalingModel::set_points(std::vector<ScalingPoint> points) {
  beginResetModel();
  points_ = std::move(points);
  endResetModel();
}

int ScalingModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(points_.size()); }
int ScalingModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant ScalingModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount() || index.column() >= kColumnCount) return {};
  const ScalingPoint& point = points_[static_cast<std::size_t>(index.row())];
  if (role == Qt::TextAlignmentRole) return index.column() == kPlan ? QVariant() : right_aligned();
  if (role != Qt::DisplayRole && role != kValueRole) return {};
  const bool value = role == kValueRole;
  switch (index.column()) {
    case kGpus: return point.gpus;
    case kTokensPerSecond:
      if (!point.best) return value ? QVariant() : QVariant(QStringLiteral("no plan fits"));
      return value ? QVariant(point.best->estimate.throughput.tokens_per_second) : QVariant(grouped(point.best->estimate.throughput.tokens_per_second));
    case kMfu:
      if (!point.best) return {};
      return value ? QVariant(100 * point.best->estimate.throughput.mfu) : QVariant(number(100 * point.best->estimate.throughput.mfu, 1));
    case kPlan: return point.best ? layout_text(point.best->plan.parallel) : QString();
    default: return {};
  }
}

QVariant ScalingModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  switch (section) {
    case kGpus: return QStringLiteral("GPUs");
    case kTokensPerSecond: return QStringLiteral("Throughput (tokens/s)");
    case kMfu: return QStringLiteral("MFU (%)");
    case kPlan: return QStringLiteral("Best plan");
    default: return {};
  }
}

// --- ComparisonModel ---

namespace {

// A document key as people read it, with the unit values are shown in, and the scale to it.
struct QuantityUnit {
  QString name;
  double scale = 1;
  int decimals = 3;
};

QuantityUnit unit_of(const std::string& key) {
  const auto strip = [&](const std::string& suffix) { return QString::fromStdString(key.substr(0, key.size() - suffix.size())).replace('_', ' '); };
  const auto ends_with = [&](const std::string& suffix) { return key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0; };
  if (ends_with("_bytes")) return {strip("_bytes") + QStringLiteral(" (GiB)"), kGiB, 2};
  if (ends_with("_bytes_sent_per_step")) return {strip("_bytes_sent_per_step") + QStringLiteral(" bytes sent per step (MiB)"), kGiB / 1024, 2};
  if (ends_with("_seconds")) return {strip("_seconds") + QStringLiteral(" (s)"), 1, 4};
  if (key == "tokens_per_second") return {QStringLiteral("tokens per second (tokens/s)"), 1, 0};
  if (key == "tokens_per_second_per_gpu") return {QStringLiteral("tokens per second per GPU (tokens/s)"), 1, 0};
  if (key == "mfu" || key == "hfu") return {QString::fromStdString(key).toUpper() + QStringLiteral(" (%)"), 0.01, 1};
  if (ends_with("_tflops_per_gpu")) return {strip("_tflops_per_gpu") + QStringLiteral(" TFLOP/s per GPU (TFLOP/s)"), 1, 1};
  return {QString::fromStdString(key), 1, 3};
}

}  // namespace

ComparisonModel::ComparisonModel(QObject* parent) : QAbstractTableModel(parent) {}

void ComparisonModel::set_comparison(std::optional<pl::Comparison> comparison) {
  beginResetModel();
  comparison_ = std::move(comparison);
  endResetModel();
}

int ComparisonModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !comparison_ ? 0 : static_cast<int>(comparison_->rows.size());
}
int ComparisonModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant ComparisonModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount() || index.column() >= kColumnCount) return {};
  const pl::ComparisonRow& row = comparison_->rows[static_cast<std::size_t>(index.row())];
  const QuantityUnit unit = unit_of(row.key);
  if (role == Qt::TextAlignmentRole) return index.column() <= kQuantity ? QVariant() : right_aligned();
  if (role == kValueRole) {
    switch (index.column()) {
      case kSection: return QString::fromUtf8(pl::section_name(row.section));
      case kQuantity: return QString::fromStdString(row.key);
      case kPredicted: return row.predicted;
      case kMeasured: return row.measured ? QVariant(*row.measured) : QVariant();
      case kDifference: return row.relative_difference ? QVariant(*row.relative_difference) : QVariant();
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kSection: return QString::fromUtf8(pl::section_name(row.section));
    case kQuantity: return unit.name;
    case kPredicted: return number(row.predicted / unit.scale, unit.decimals);
    case kMeasured: return row.measured ? number(*row.measured / unit.scale, unit.decimals) : QStringLiteral("not measured");
    case kDifference: return row.relative_difference ? number(100 * *row.relative_difference, 1) : QString();
    default: return {};
  }
}

QVariant ComparisonModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  switch (section) {
    case kSection: return QStringLiteral("Section");
    case kQuantity: return QStringLiteral("Quantity (unit)");
    case kPredicted: return QStringLiteral("Predicted");
    case kMeasured: return QStringLiteral("Measured");
    case kDifference: return QStringLiteral("Difference (%)");
    default: return {};
  }
}

}  // namespace trainplan::gui
