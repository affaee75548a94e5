#include "trainplan/gui/what_if_panel.hpp"

#include <algorithm>
#include <cstdint>

#include <QCheckBox>
#include <QComboBox>
#include <QFormLayout>
#include <QLabel>
#include <QSpinBox>
#include <QVBoxLayout>

#include "trainplan/gui/table_models.hpp"

namespace trainplan::gui {

namespace cm = trainplan::costmodel;

namespace {

struct NumberKnob {
  const char* key;
  const char* label;
  int min, max;
};
const NumberKnob kNumbers[] = {
    {"tp", "TP (tensor parallel)", 1, 1 << 16},   {"pp", "PP (pipeline stages)", 1, 1 << 16},
    {"dp", "DP (data parallel)", 1, 1 << 24},     {"cp", "CP (context parallel)", 1, 1 << 16},
    {"ep", "EP (expert parallel)", 1, 1 << 16},   {"zero", "ZeRO stage", 0, 3},
    {"shard_group", "Hybrid-shard group (0 = all DP)", 0, 1 << 24},
    {"mb", "Micro-batch (sequences)", 1, 1 << 20}, {"v", "Virtual stages per rank", 1, 1024},
    {"recompute_layers", "Recomputed layers per stage (0 = all)", 0, 100000},
    {"fsdp_wrap_min_params", "FSDP unit, min. parameters (0 = per block)", 0, 2000000000},
};

}  // namespace

WhatIfPanel::WhatIfPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  base_ = new QLabel(tr("Select a plan in the table, then change any knob."), this);
  base_->setWordWrap(true);
  layout->addWidget(base_);
  auto* rows = new QFormLayout();
  layout->addLayout(rows);
  for (const auto& k : kNumbers) {
    auto* spin = new QSpinBox(this);
    spin->setRange(k.min, k.max);
    spin->setObjectName(QStringLiteral("whatif/") + QString::fromUtf8(k.key));
    const QString key = QString::fromUtf8(k.key);
    connect(spin, &QSpinBox::valueChanged, this, [this, key] { knob_changed(key); });
    rows->addRow(tr(k.label), spin);
    numbers_[key] = spin;
  }
  const auto choice = [&](const char* key, const char* label, std::initializer_list<const char*> values) {
    auto* box = new QComboBox(this);
    for (const char* v : values) box->addItem(QString::fromUtf8(v), QString::fromUtf8(v));
    box->setObjectName(QStringLiteral("whatif/") + QString::fromUtf8(key));
    const QString k = QString::fromUtf8(key);
    connect(box, &QComboBox::currentIndexChanged, this, [this, k] { knob_changed(k); });
    rows->addRow(tr(label), box);
    choices_[k] = box;
  };
  choice("schedule", "Schedule", {"1f1b", "interleaved", "gpipe"});
  choice("recompute", "Recompute", {"none", "selective", "full"});
  choice("sp", "Sequence parallel", {"on", "off"});
  choice("offload", "Optimizer offload", {"none", "cpu", "nvme"});
  choice("offload_params", "Parameter offload (ZeRO-3)", {"none", "cpu", "nvme"});
  choice("prefetch", "Prefetch next unit (ZeRO-3)", {"on", "off"});
  choice("reduce_dtype", "Gradient reduction dtype", {"fp32", "bf16", "fp16"});
  choice("overlap_grad_reduce", "Overlap gradient reduction", {"on", "off"});
  choice("ends_in_split", "Embedding and loss in the pipeline split", {"off", "on"});
  keep_gpus_ = new QCheckBox(tr("Keep the GPU count (DP follows TP, PP, CP)"), this);
  keep_gpus_->setObjectName(QStringLiteral("whatif/keep_gpus"));
  keep_gpus_->setChecked(true);
  layout->addWidget(keep_gpus_);
  status_ = new QLabel(this);
  status_->setObjectName(QStringLiteral("whatIfStatus"));
  status_->setWordWrap(true);
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(status_);
  layout->addStretch(1);
  setEnabled(false);
}

void WhatIfPanel::set_plan(const cm::Plan& plan, const cm::Estimate& estimate) {
  plan_ = plan;
  filling_ = true;
  const cm::ParallelConfig& p = plan.parallel;
  numbers_[QStringLiteral("tp")]->setValue(p.tp);
  numbers_[QStringLiteral("pp")]->setValue(p.pp);
  numbers_[QStringLiteral("dp")]->setValue(p.dp);
  numbers_[QStringLiteral("cp")]->setValue(p.cp);
  numbers_[QStringLiteral("ep")]->setValue(p.ep);
  numbers_[QStringLiteral("zero")]->setValue(p.zero_stage);
  numbers_[QStringLiteral("shard_group")]->setValue(p.shard_group);
  numbers_[QStringLiteral("mb")]->setValue(p.micro_batch);
  numbers_[QStringLiteral("v")]->setValue(p.virtual_stages);
  numbers_[QStringLiteral("recompute_layers")]->setValue(p.recompute_layers);
  numbers_[QStringLiteral("fsdp_wrap_min_params")]->setValue(static_cast<int>(std::min<std::int64_t>(p.fsdp_wrap_min_params, 2000000000)));
  const auto choose = [&](const char* key, const char* value) {
    QComboBox* box = choices_[QString::fromUtf8(key)];
    box->setCurrentIndex(std::max(0, box->findData(QString::fromUtf8(value))));
  };
  choose("schedule", cm::schedule_name(p.schedule));
  choose("recompute", cm::recompute_name(p.recompute));
  choose("sp", p.sequence_parallel ? "on" : "off");
  choose("offload", cm::offload_name(p.offload_optimizer));
  choose("offload_params", cm::offload_name(p.offload_params));
  choose("prefetch", p.prefetch ? "on" : "off");
  choose("reduce_dtype", cm::dtype_name(p.reduce_dtype));
  choose("overlap_grad_reduce", p.overlap_grad_reduce ? "on" : "off");
  choose("ends_in_split", p.ends_in_split ? "on" : "off");
  filling_ = false;
  setEnabled(true);
  base_->setText(tr("%1 on %2 GPUs: %3").arg(QString::fromStdString(plan.model.name)).arg(plan.gpus).arg(layout_text(p)));
  if (estimate.fits) {
    status_->setStyleSheet(estimate.tight ? QStringLiteral("color:#a06000") : QStringLiteral("color:#006000"));
    status_->setText((estimate.tight ? tr("Tight (within the memory headroom): %1 of %2 GiB per GPU; %3 s per step, MFU %4%")
                                     : tr("Fits: %1 of %2 GiB per GPU; %3 s per step, MFU %4%"))
                         .arg(estimate.memory.required.in_gib(), 0, 'f', 1)
                         .arg(estimate.memory.capacity.in_gib(), 0, 'f', 0)
                         .arg(estimate.time.step.value(), 0, 'f', 3)
                         .arg(100 * estimate.throughput.mfu, 0, 'f', 1));
  } else {
    QStringList reasons;
    for (const auto& r : estimate.reasons) reasons << QString::fromStdString(r);
    status_->setStyleSheet(QStringLiteral("color:#b00000"));
    status_->setText(tr("Does not fit: %1").arg(reasons.join(QStringLiteral("; "))));
  }
}

cm::Plan WhatIfPanel::edited_plan() const {
  cm::Plan plan = plan_;
  cm::ParallelConfig& p = plan.parallel;
  const auto n = [&](const char* key) { return numbers_.at(QString::fromUtf8(key))->value(); };
  const auto c = [&](const char* key) { return choices_.at(QString::fromUtf8(key))->currentData().toString(); };
  p.tp = n("tp");
  p.pp = n("pp");
  p.dp = n("dp");
  p.cp = n("cp");
  p.ep = n("ep");
  p.zero_stage = n("zero");
  p.shard_group = n("shard_group");
  p.micro_batch = n("mb");
  p.virtual_stages = n("v");
  p.recompute_layers = n("recompute_layers");
  const QString schedule = c("schedule");
  p.schedule = schedule == QStringLiteral("gpipe") ? cm::Schedule::kGpipe
             : schedule == QStringLiteral("interleaved") ? cm::Schedule::kInterleaved : cm::Schedule::kOneFOneB;
  const QString recompute = c("recompute");
  p.recompute = recompute == QStringLiteral("full") ? cm::Recompute::kFull
              : recompute == QStringLiteral("selective") ? cm::Recompute::kSelective : cm::Recompute::kNone;
  p.sequence_parallel = c("sp") == QStringLiteral("on");
  const auto offload = [](const QString& v) {
    return v == QStringLiteral("cpu") ? cm::Offload::kCpu : v == QStringLiteral("nvme") ? cm::Offload::kNvme : cm::Offload::kNone;
  };
  p.offload_optimizer = offload(c("offload"));
  p.offload_params = offload(c("offload_params"));
  p.fsdp_wrap_min_params = n("fsdp_wrap_min_params");
  p.prefetch = c("prefetch") == QStringLiteral("on");
  const QString reduce = c("reduce_dtype");
  p.reduce_dtype = reduce == QStringLiteral("bf16") ? cm::Dtype::kBf16 : reduce == QStringLiteral("fp16") ? cm::Dtype::kFp16 : cm::Dtype::kFp32;
  p.overlap_grad_reduce = c("overlap_grad_reduce") == QStringLiteral("on");
  p.ends_in_split = c("ends_in_split") == QStringLiteral("on");
  return plan;
}

void WhatIfPanel::knob_changed(const QString& knob) {
  if (filling_) return;
  if (keep_gpus_->isChecked() && (knob == QStringLiteral("tp") || knob == QStringLiteral("pp") || knob == QStringLiteral("cp"))) {
    const long long product = static_cast<long long>(numbers_[QStringLiteral("tp")]->value()) * numbers_[QStringLiteral("pp")]->value() *
                              numbers_[QStringLiteral("cp")]->value();
    if (product > 0 && plan_.gpus % product == 0) {
      filling_ = true;
      numbers_[QStringLiteral("dp")]->setValue(static_cast<int>(plan_.gpus / product));
      filling_ = false;
    }
  }
  emit edited();
}

void WhatIfPanel::show_invalid(const QString& message) {
  status_->setStyleSheet(QStringLiteral("color:#b00000"));
  status_->setText(tr("Invalid plan: %1 (the estimate shown is the last valid one)").arg(message));
}

QString WhatIfPanel::status_text() const { return status_->text(); }

bool WhatIfPanel::set_knob(const QString& knob, const QString& value) {
  if (auto it = numbers_.find(knob); it != numbers_.end()) {
    bool ok = false;
    const int v = value.toInt(&ok);
    if (!ok || v < it->second->minimum() || v > it->second->maximum()) return false;
    if (it->second->value() == v) knob_changed(knob);
    else it->second->setValue(v);
    return true;
  }
  if (auto it = choices_.find(knob); it != choices_.end()) {
    const int index = it->second->findData(value);
    if (index < 0) return false;
    if (it->second->currentIndex() == index) knob_changed(knob);
    else it->second->setCurrentIndex(index);
    return true;
  }
  return false;
}

}  // namespace trainplan::gui
