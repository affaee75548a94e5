#include "trainplan/gui/launch_panel.hpp"

#include <algorithm>

#include <QComboBox>
#include <QFileInfo>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QLabel>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QVBoxLayout>

namespace trainplan::gui {

namespace pl = trainplan::planner;

const std::vector<LaunchChoice>& launch_choices() {
  static const std::vector<LaunchChoice> choices = [] {
    std::vector<LaunchChoice> c = {{QStringLiteral("trainplan executor (torchrun)"), std::nullopt, false},
                                   {QStringLiteral("trainplan executor (SLURM)"), std::nullopt, true}};
    for (pl::ExportTarget target : pl::export_targets()) c.push_back({stack_label(target), target, false});
    return c;
  }();
  return choices;
}

QString stack_label(pl::ExportTarget target) {
  switch (target) {
    case pl::ExportTarget::kMegatron: return QStringLiteral("Megatron-LM");
    case pl::ExportTarget::kTorchtitan: return QStringLiteral("torchtitan");
    case pl::ExportTarget::kDeepspeed: return QStringLiteral("DeepSpeed");
    case pl::ExportTarget::kAccelerate: return QStringLiteral("Accelerate");
    case pl::ExportTarget::kLitgpt: return QStringLiteral("LitGPT");
  }
  return QString::fromUtf8(pl::export_target_name(target));
}

QString refusal_text(pl::ExportTarget target, const std::string& message) {
  // Each reason starts with "<target>: "; a reason may itself hold "; ", so split only before one.
  const QString prefix = QString::fromUtf8(pl::export_target_name(target)) + QStringLiteral(": ");
  QStringList reasons = QString::fromStdString(message).split(QStringLiteral("; ") + prefix);
  if (!reasons.isEmpty() && reasons.front().startsWith(prefix)) reasons.front().remove(0, prefix.size());
  QString text = QObject::tr("%1 cannot run this plan as it stands:\n\n").arg(stack_label(target));
  for (const QString& reason : reasons) text += QStringLiteral("  - ") + reason + QStringLiteral("\n");
  text += QObject::tr("\nThere is nothing to save. Change the plan (What if) or choose another stack.\n");
  return text;
}

LaunchPanel::LaunchPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout();
  chooser_ = new QComboBox(this);
  chooser_->setObjectName(QStringLiteral("exportTarget"));
  for (const LaunchChoice& c : launch_choices()) chooser_->addItem(c.label);
  save_ = new QPushButton(tr("Save…"), this);
  save_->setObjectName(QStringLiteral("saveExport"));
  auto* run_with = new QLabel(tr("Run the selected plan with"), this);
  run_with->setBuddy(chooser_);
  row->addWidget(run_with);
  row->addWidget(chooser_);
  row->addStretch(1);
  row->addWidget(save_);
  layout->addLayout(row);

  notes_ = new QLabel(this);
  notes_->setObjectName(QStringLiteral("exportNotes"));
  notes_->setTextFormat(Qt::PlainText);
  notes_->setWordWrap(true);
  notes_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  notes_->hide();
  layout->addWidget(notes_);

  view_ = new QPlainTextEdit(this);
  view_->setObjectName(QStringLiteral("launchView"));
  view_->setReadOnly(true);
  view_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  layout->addWidget(view_, 1);

  connect(chooser_, &QComboBox::currentIndexChanged, this, &LaunchPanel::refresh);
  connect(save_, &QPushButton::clicked, this, &LaunchPanel::saveRequested);
  refresh();
}

void LaunchPanel::set_plan(const costmodel::Plan& plan, const ExecutorTexts& executor) {
  plan_ = plan;
  executor_ = executor;
  refresh();
}

const LaunchChoice& LaunchPanel::choice() const { return launch_choices().at(static_cast<size_t>(std::max(0, chooser_->currentIndex()))); }

QString LaunchPanel::text() const { return view_->toPlainText(); }

QString LaunchPanel::notes_text() const { return notes_->text(); }

bool LaunchPanel::can_save() const { return save_->isEnabled(); }

QString LaunchPanel::file_filter() const {
  const QString suffix = QFileInfo(file_name_).suffix();
  if (suffix.isEmpty()) return tr("All files (*)");
  return tr("%1 file (*.%2);;All files (*)").arg(choice().label, suffix);
}

void LaunchPanel::refresh() {
  const LaunchChoice& c = choice();
  QString text;
  QStringList notes;
  bool savable = false;
  file_name_.clear();
  if (!plan_) {
    text = tr("Select a plan in the table.");
  } else if (!c.stack) {
    const QString base = QString::fromStdString(plan_->name.empty() ? std::string("plan") : plan_->name);
    if (c.slurm) {
      savable = !executor_.slurm.isEmpty();
      text = savable ? executor_.slurm : tr("No SLURM script for this plan: %1\n").arg(executor_.slurm_error);
      file_name_ = base + QStringLiteral("-slurm.sbatch");
    } else {
      savable = !executor_.torchrun.isEmpty();
      text = executor_.overview;
      file_name_ = base + QStringLiteral("-torchrun.sh");
    }
  } else {
    auto exported = pl::export_plan(*plan_, *c.stack);
    if (!exported) {
      text = refusal_text(*c.stack, exported.error().message);
    } else {
      savable = true;
      text = QString::fromStdString(exported->text);
      file_name_ = QString::fromStdString(exported->file_name);
      for (const std::string& note : exported->notes) notes << QStringLiteral("• ") + QString::fromStdString(note);
    }
  }
  if (!savable) file_name_.clear();
  if (view_->toPlainText() != text) view_->setPlainText(text);  // unchanged: keeps the scroll position
  save_->setEnabled(savable);
  save_->setToolTip(savable ? tr("Save as %1").arg(file_name_) : QString());
  if (notes.isEmpty()) {
    notes_->clear();
    notes_->hide();
  } else {
    notes_->setText(tr("Left to the training script or to you:") + QStringLiteral("\n") + notes.join(QStringLiteral("\n")));
    notes_->show();
  }
}

}  // namespace trainplan::gui
