#pragma once
// WhatIfPanel: every knob of the selected plan's parallel layout (TP, PP, DP, CP, EP, ZeRO stage,
// hybrid-shard group, micro-batch, virtual stages, schedule, recompute, sequence parallelism,
// optimizer and parameter offload, FSDP unit size, prefetch, reduction dtype, overlap of the
// gradient reduction) as an editor. Editing one emits edited(); edited_plan() is the selected plan with the
// knobs as set. With "keep the GPU count" on, changing TP, PP or CP sets DP to the GPUs left.
// The status line says whether the edited plan fits, why not, or why it is invalid.

#include <map>

#include <QWidget>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"

QT_BEGIN_NAMESPACE
class QCheckBox;
class QComboBox;
class QLabel;
class QSpinBox;
QT_END_NAMESPACE

namespace trainplan::gui {

class WhatIfPanel : public QWidget {
  Q_OBJECT
 public:
  explicit WhatIfPanel(QWidget* parent = nullptr);

  // Shows `plan`'s knobs (no edited() signal) and `estimate`'s verdict.
  void set_plan(const costmodel::Plan& plan, const costmodel::Estimate& estimate);
  // The plan last set, with the knobs as they are now.
  [[nodiscard]] costmodel::Plan edited_plan() const;
  // Says why the edited plan was refused (validate_plan's message); the last good estimate stays.
  void show_invalid(const QString& message);
  [[nodiscard]] QString status_text() const;

  // Sets a knob as if edited ("tp", "pp", "dp", "cp", "ep", "zero", "shard_group", "mb", "v",
  // "recompute_layers", "fsdp_wrap_min_params": numbers; "schedule", "recompute", "offload",
  // "offload_params", "reduce_dtype": names; "sp", "prefetch", "overlap_grad_reduce": on/off) and
  // emits edited(). False for an unknown knob or value.
  bool set_knob(const QString& knob, const QString& value);

 signals:
  void edited();

 private:
  void knob_changed(const QString& knob);
  costmodel::Plan plan_;
  std::map<QString, QSpinBox*> numbers_;
  std::map<QString, QComboBox*> choices_;
  QCheckBox* keep_gpus_ = nullptr;
  QLabel* status_ = nullptr;
  QLabel* base_ = nullptr;
  bool filling_ = false;
};

}  // namespace trainplan::gui
