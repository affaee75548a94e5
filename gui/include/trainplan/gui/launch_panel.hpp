#pragma once
// LaunchPanel: the "Launch and CLI" tab. A chooser (objectName exportTarget) of what runs the
// selected plan: the trainplan executor (its torchrun commands, or a SLURM script) or another
// stack (the file Megatron-LM, torchtitan, DeepSpeed or Accelerate reads, planner::export_plan);
// the notes that file leaves to the training script or to the user (exportNotes); the text
// (launchView); and Save (saveExport, which emits saveRequested()). A stack that cannot express
// the plan shows why in the view, and Save is disabled. Every text is the planner's; the panel
// only chooses and shows.

#include <optional>
#include <vector>

#include <QString>
#include <QWidget>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/planner/export.hpp"

QT_BEGIN_NAMESPACE
class QComboBox;
class QLabel;
class QPlainTextEdit;
class QPushButton;
QT_END_NAMESPACE

namespace trainplan::gui {

// One entry of the chooser.
struct LaunchChoice {
  QString label;                               // "trainplan executor (torchrun)", "Megatron-LM", ...
  std::optional<planner::ExportTarget> stack;  // none: the trainplan executor
  bool slurm = false;                          // the executor's SLURM script rather than torchrun
};
// The executor's two forms, then every planner::export_targets() in its order.
[[nodiscard]] const std::vector<LaunchChoice>& launch_choices();
// "Megatron-LM", "torchtitan", "DeepSpeed", "Accelerate".
[[nodiscard]] QString stack_label(planner::ExportTarget target);
// A refusal of planner::export_plan (its "; "-separated reasons, each "<target>: <field>: why") as
// plain lines: "Megatron-LM cannot run this plan as it stands:", then one reason a line.
[[nodiscard]] QString refusal_text(planner::ExportTarget target, const std::string& message);

class LaunchPanel : public QWidget {
  Q_OBJECT
 public:
  // The executor's texts of the selected plan; the window makes them, since they name the file the
  // plan was exported to.
  struct ExecutorTexts {
    QString overview;      // shown for torchrun: its commands, the SLURM script, the planner command lines
    QString torchrun;      // what Save writes for torchrun; empty when there is none
    QString slurm;         // the SLURM script; empty when there is none (slurm_error says why)
    QString slurm_error;
  };

  explicit LaunchPanel(QWidget* parent = nullptr);

  // Shows `plan` (REQUIRES: validate_plan(plan) holds) as the chosen entry has it.
  void set_plan(const costmodel::Plan& plan, const ExecutorTexts& executor);

  [[nodiscard]] const LaunchChoice& choice() const;
  [[nodiscard]] QString text() const;                 // as shown
  [[nodiscard]] QString notes_text() const;           // empty when the entry has no notes
  [[nodiscard]] bool can_save() const;                // false for a refusal or no plan
  [[nodiscard]] const QString& suggested_file_name() const { return file_name_; }  // e.g. "llama3-8b-fsdp8-megatron.sh"
  [[nodiscard]] QString file_filter() const;          // for the save dialog, from the file's suffix

 signals:
  void saveRequested();

 private:
  void refresh();

  std::optional<costmodel::Plan> plan_;
  ExecutorTexts executor_;
  QString file_name_;
  QComboBox* chooser_ = nullptr;
  QPushButton* save_ = nullptr;
  QLabel* notes_ = nullptr;
  QPlainTextEdit* view_ = nullptr;
};

}  // namespace trainplan::gui
