#include "trainplan/gui/input_panel.hpp"

#include <QCheckBox>
#include <QComboBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan::gui {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

namespace {

const char* const kFilePrefix = "file:";

struct DocumentField {
  const char* pointer;
  const char* label;
};

// The fields of a model or cluster document the panel lets people edit.
const DocumentField kModelFields[] = {
    {"/architecture", "Architecture"}, {"/layers", "Layers"},         {"/hidden", "Hidden size"},
    {"/heads", "Attention heads"},     {"/kv_heads", "KV heads"},     {"/ffn_hidden", "FFN hidden size"},
    {"/vocab", "Vocabulary"},          {"/max_seq_len", "Context (tokens)"}, {"/tied_embeddings", "Tied embeddings"},
};
const DocumentField kClusterFields[] = {
    {"/node/gpus_per_node", "GPUs per node"},
    {"/gpu/hbm_capacity_gib", "HBM per GPU (GiB)"},
    {"/gpu/peak_dense_tflop_per_s/bf16", "bf16 dense peak (TFLOP/s)"},
    {"/gpu/hbm_bandwidth_tb_per_s", "HBM bandwidth (TB/s)"},
    {"/intra_node/bandwidth_gb_per_s", "Intra-node per GPU (GB/s)"},
    {"/inter_node/nic_bandwidth_gbit_per_s", "NIC bandwidth (Gb/s)"},
    {"/inter_node/nics_per_node", "NICs per node"},
    {"/price/usd_per_gpu_hour", "Price (USD per GPU-hour)"},
};

struct Choice {
  const char* key;
  const char* label;
  std::vector<const char*> values;  // first: "auto"
};
const char* const kFixedNumbers[][2] = {{"tp", "TP"}, {"pp", "PP"}, {"dp", "DP"}, {"cp", "CP"}, {"ep", "EP"},
                                        {"zero", "ZeRO stage"}, {"shard_group", "Hybrid-shard group"},
                                        {"mb", "Micro-batch (seq)"}, {"v", "Virtual stages"},
                                        {"first_stage_layers", "First stage layers"}, {"last_stage_layers", "Last stage layers"}};
const Choice kFixedChoices[] = {{"schedule", "Schedule", {"auto", "1f1b", "interleaved", "gpipe"}},
                                {"recompute", "Recompute", {"auto", "none", "selective", "full"}},
                                {"sp", "Sequence parallel", {"auto", "on", "off"}},
                                {"offload", "Optimizer offload", {"auto", "none", "cpu", "nvme"}},
                                {"cp_comm", "CP communication", {"auto", "p2p", "all_gather", "allgather_rotate"}},
                                {"ends_in_split", "Embedding and loss in the pipeline split", {"auto", "on", "off"}}};

QString json_text(const nlohmann::json& v) {
  if (v.is_string()) return QString::fromStdString(v.get<std::string>());
  return QString::fromStdString(v.dump());
}

QString widget_text(const QWidget* w) {
  if (auto* line = qobject_cast<const QLineEdit*>(w)) return line->text();
  if (auto* combo = qobject_cast<const QComboBox*>(w)) {
    const QVariant data = combo->currentData();
    return data.isValid() ? data.toString() : combo->currentText();
  }
  if (auto* check = qobject_cast<const QCheckBox*>(w)) return check->isChecked() ? QStringLiteral("true") : QStringLiteral("false");
  if (auto* spin = qobject_cast<const QSpinBox*>(w)) return QString::number(spin->value());
  return {};
}

}  // namespace

InputPanel::InputPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  form_errors_ = new QLabel(this);
  form_errors_->setObjectName(QStringLiteral("formErrors"));
  form_errors_->setWordWrap(true);
  form_errors_->setStyleSheet(QStringLiteral("color:#b00000"));
  form_errors_->hide();
  layout->addWidget(form_errors_);

  QFormLayout* rows = nullptr;
  const auto group = [&](const QString& title) {
    auto* box = new QGroupBox(title, this);
    rows = new QFormLayout(box);
    rows->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    layout->addWidget(box);
  };
  // Puts `w` under `label` with its error line below it.
  const auto row = [&](const QString& label, const QString& field, QWidget* w) {
    w->setObjectName(field);
    auto* cell = new QWidget(this);
    auto* v = new QVBoxLayout(cell);
    v->setContentsMargins(0, 0, 0, 0);
    v->setSpacing(1);
    v->addWidget(w);
    auto* error = new QLabel(cell);
    error->setObjectName(field + QStringLiteral("/error"));
    error->setWordWrap(true);
    error->setStyleSheet(QStringLiteral("color:#b00000; font-size:small"));
    error->hide();
    v->addWidget(error);
    rows->addRow(label, cell);
    fields_[field] = w;
    error_labels_[field] = error;
  };
  const auto line = [&](const QString& placeholder) {
    auto* edit = new QLineEdit(this);
    edit->setPlaceholderText(placeholder);
    connect(edit, &QLineEdit::textEdited, this, [this] { if (!filling_) emit changed(); });
    return edit;
  };
  const auto combo = [&](const std::vector<std::pair<QString, QString>>& items) {  // (label, value)
    auto* box = new QComboBox(this);
    for (const auto& [label, value] : items) box->addItem(label, value);
    connect(box, &QComboBox::currentIndexChanged, this, [this] { if (!filling_) emit changed(); });
    return box;
  };

  // Model.
  group(tr("Model"));
  model_ = new QComboBox(this);
  for (const auto& name : cm::model_preset_names()) {
    auto m = cm::find_model(name);
    const QString params = m ? QString::fromStdString(pl::si(cm::count_parameters(*m).total(m->layers))) : QStringLiteral("?");
    model_->addItem(QStringLiteral("%1  (%2 parameters)").arg(QString::fromStdString(name), params), QString::fromStdString(name));
  }
  row(tr("Preset"), QStringLiteral("model"), model_);
  auto* load_model = new QPushButton(tr("Load model (trainplan JSON or Hugging Face config.json)…"), this);
  load_model->setObjectName(QStringLiteral("loadModel"));
  connect(load_model, &QPushButton::clicked, this, &InputPanel::loadModelRequested);
  rows->addRow(QString(), load_model);
  for (const auto& f : kModelFields) {
    const QString field = QStringLiteral("model") + QString::fromUtf8(f.pointer);
    QWidget* w = nullptr;
    if (std::string(f.pointer) == "/architecture") w = combo({{QStringLiteral("llama"), QStringLiteral("llama")}, {QStringLiteral("gpt"), QStringLiteral("gpt")}});
    else if (std::string(f.pointer) == "/tied_embeddings") {
      auto* check = new QCheckBox(this);
      connect(check, &QCheckBox::toggled, this, [this] { if (!filling_) emit changed(); });
      w = check;
    } else {
      w = line(QString());
    }
    row(tr(f.label), field, w);
  }

  // Cluster.
  group(tr("Cluster"));
  cluster_ = new QComboBox(this);
  for (const auto& name : cm::hwprofile_preset_names()) {
    auto h = cm::find_hwprofile(name);
    cluster_->addItem(QStringLiteral("%1  (%2 x %3)").arg(QString::fromStdString(name)).arg(h ? h->gpus_per_node : 0)
                          .arg(h ? QString::fromStdString(h->gpu.name) : QStringLiteral("?")),
                      QString::fromStdString(name));
  }
  row(tr("Preset"), QStringLiteral("cluster"), cluster_);
  auto* gpus = line(tr("number of GPUs"));
  row(tr("GPUs"), QStringLiteral("gpus"), gpus);
  nodes_ = new QSpinBox(this);
  nodes_->setRange(1, 1 << 20);
  row(tr("Nodes"), QStringLiteral("nodes"), nodes_);
  for (const auto& f : kClusterFields) row(tr(f.label), QStringLiteral("cluster") + QString::fromUtf8(f.pointer), line(QString()));
  connect(gpus, &QLineEdit::textEdited, this, &InputPanel::update_nodes_from_gpus);
  connect(nodes_, &QSpinBox::valueChanged, this, [this](int nodes) {
    if (filling_) return;
    const int per_node = field_text(QStringLiteral("cluster/node/gpus_per_node")).toInt();
    if (per_node <= 0) return;
    qobject_cast<QLineEdit*>(fields_[QStringLiteral("gpus")])->setText(QString::number(static_cast<long long>(nodes) * per_node));
    emit changed();
  });

  // Training.
  group(tr("Training"));
  row(tr("Sequence length (tokens)"), QStringLiteral("seq_len"), line(tr("the model's context")));
  auto* batch = new QWidget(this);
  auto* batch_row = new QHBoxLayout(batch);
  batch_row->setContentsMargins(0, 0, 0, 0);
  auto* batch_edit = line(tr("default: 4Mi tokens"));
  batch_edit->setObjectName(QStringLiteral("global_batch"));
  batch_unit_ = combo({{tr("sequences"), QStringLiteral("sequences")}, {tr("tokens (K/M binary)"), QStringLiteral("tokens")}});
  batch_unit_->setObjectName(QStringLiteral("batch_unit"));
  batch_row->addWidget(batch_edit, 1);
  batch_row->addWidget(batch_unit_);
  row(tr("Global batch"), QStringLiteral("global_batch_row"), batch);
  // The row holds two widgets; its error line belongs to the number.
  fields_.erase(QStringLiteral("global_batch_row"));
  fields_[QStringLiteral("global_batch")] = batch_edit;
  error_labels_[QStringLiteral("global_batch")] = error_labels_[QStringLiteral("global_batch_row")];
  error_labels_.erase(QStringLiteral("global_batch_row"));
  fields_[QStringLiteral("batch_unit")] = batch_unit_;
  row(tr("Tokens to train"), QStringLiteral("train_tokens"), line(tr("20 per parameter (e.g. 15T)")));
  row(tr("Precision"), QStringLiteral("precision"),
      combo({{QStringLiteral("bf16"), QStringLiteral("bf16")}, {QStringLiteral("fp16"), QStringLiteral("fp16")},
             {QStringLiteral("fp8"), QStringLiteral("fp8")}, {QStringLiteral("fp32"), QStringLiteral("fp32")}}));
  row(tr("Optimizer"), QStringLiteral("optimizer"),
      combo({{QStringLiteral("AdamW"), QStringLiteral("adamw")}, {QStringLiteral("SGD (momentum)"), QStringLiteral("sgd")},
             {QStringLiteral("Adafactor"), QStringLiteral("adafactor")}, {QStringLiteral("Adam 8-bit"), QStringLiteral("adam8bit")}}));
  row(tr("Mode"), QStringLiteral("mode"),
      combo({{tr("pretrain"), QStringLiteral("pretrain")}, {tr("full fine-tune"), QStringLiteral("full")},
             {QStringLiteral("LoRA"), QStringLiteral("lora")}, {QStringLiteral("QLoRA"), QStringLiteral("qlora")}}));
  auto* lora_rank = line(QString());
  lora_rank->setText(QStringLiteral("16"));
  row(tr("LoRA rank"), QStringLiteral("lora_rank"), lora_rank);
  row(tr("Attention"), QStringLiteral("attention"),
      combo({{tr("flash (no score matrix)"), QStringLiteral("flash")}, {tr("standard (scores stored)"), QStringLiteral("standard")}}));
  row(tr("Dropout"), QStringLiteral("dropout"), combo({{tr("off"), QStringLiteral("off")}, {tr("on"), QStringLiteral("on")}}));
  row(tr("Attention mask"), QStringLiteral("attention_mask"),
      combo({{tr("causal (kernel flag)"), QStringLiteral("causal")}, {tr("explicit tensor (full rectangle)"), QStringLiteral("explicit")}}));
  row(tr("Loss kernel"), QStringLiteral("loss"),
      combo({{tr("the stack's"), QStringLiteral("stack")}, {tr("fp32 logits"), QStringLiteral("fp32-logits")},
             {tr("fused cross-entropy"), QStringLiteral("fused")}, {tr("chunked linear cross-entropy"), QStringLiteral("chunked-linear")},
             {tr("vocab-parallel fp32 (Megatron)"), QStringLiteral("vocab-parallel-fp32")}}));
  row(tr("Fused attention kernel"), QStringLiteral("attention_kernel"),
      combo({{tr("the stack's"), QStringLiteral("stack")}, {tr("profile's measured (cuDNN on H100/H200)"), QStringLiteral("profile")},
             {QStringLiteral("FlashAttention-2"), QStringLiteral("flash2")}, {tr("FlashAttention-3 (Hopper)"), QStringLiteral("flash3")}}));
  row(tr("fp8 scaling"), QStringLiteral("fp8_recipe"),
      combo({{tr("the stack's"), QStringLiteral("stack")}, {tr("delayed (amax history)"), QStringLiteral("delayed")},
             {tr("current (each tensor's amax)"), QStringLiteral("current")}}));
  row(tr("fp8 all-gather"), QStringLiteral("fp8_all_gather"),
      combo({{tr("off (16-bit all-gathers)"), QStringLiteral("off")}, {tr("on (torchao, FSDP2 stacks)"), QStringLiteral("on")}}));
  row(tr("Master weights"), QStringLiteral("master_weights"),
      combo({{tr("fp32 (mixed precision)"), QStringLiteral("fp32")}, {tr("none (pure 16-bit)"), QStringLiteral("none")}}));
  row(tr("CUDA allocator"), QStringLiteral("allocator"),
      combo({{tr("caching (PyTorch's default)"), QStringLiteral("caching")},
             {tr("expandable segments (torchtitan's)"), QStringLiteral("expandable-segments")}}));
  row(tr("Software stack"), QStringLiteral("stack"),
      combo({{tr("trainplan executor"), QStringLiteral("trainplan")},
             {tr("trainplan executor, --kernels reference"), QStringLiteral("trainplan-reference")},
             {tr("PyTorch eager"), QStringLiteral("pytorch-eager")},
             {tr("torch.compile"), QStringLiteral("torch-compile")}, {tr("Megatron-Core + TE"), QStringLiteral("megatron-te")},
             {tr("PyTorch FSDP1 (Accelerate, Lightning)"), QStringLiteral("fsdp1")},
             {tr("PyTorch FSDP1 (Composer, MosaicML MPT)"), QStringLiteral("composer")},
             {tr("PyTorch FSDP2 (torchtitan)"), QStringLiteral("fsdp2")},
             {tr("PyTorch FSDP2 + torch.compile"), QStringLiteral("fsdp2-compile")}, {tr("DeepSpeed ZeRO"), QStringLiteral("deepspeed")},
             {tr("DeepSpeed v0.3 (2021)"), QStringLiteral("deepspeed-v0.3")},
             {tr("Hugging Face + DDP under autocast (Accelerate, Trainer)"), QStringLiteral("hf-ddp")},
             {tr("Hugging Face + FSDP2 (Accelerate)"), QStringLiteral("hf-fsdp2")}}));
  auto* headroom = line(QString::number(100 * cm::kDefaultMemoryHeadroom));
  headroom->setToolTip(tr("Percent of HBM kept free: plans needing more are tight, ranked after the others"));
  row(tr("Memory headroom %"), QStringLiteral("memory_headroom"), headroom);

  // Objective and constraints.
  group(tr("Objective"));
  objective_ = combo({{tr("most tokens per second"), QStringLiteral("throughput")},
                      {tr("least wall-clock time"), QStringLiteral("time")},
                      {tr("least cost (USD)"), QStringLiteral("cost")}});
  row(tr("Rank plans by"), QStringLiteral("objective"), objective_);
  group(tr("Fixed parallel settings (empty = searched)"));
  for (const auto& f : kFixedNumbers) row(tr(f[1]), QStringLiteral("fix/") + QString::fromUtf8(f[0]), line(tr("auto")));
  for (const auto& c : kFixedChoices) {
    std::vector<std::pair<QString, QString>> items;
    for (const char* v : c.values) items.emplace_back(QString::fromUtf8(v), QString::fromUtf8(v));
    row(tr(c.label), QStringLiteral("fix/") + QString::fromUtf8(c.key), combo(items));
  }
  // Errors of the constraints together ("tp(8) * pp(16) = 128 does not divide gpus(64)").
  error_labels_[QStringLiteral("fix")] = form_errors_;
  layout->addStretch(1);

  connect(model_, &QComboBox::currentIndexChanged, this, &InputPanel::model_chosen);
  connect(cluster_, &QComboBox::currentIndexChanged, this, &InputPanel::cluster_chosen);
  filling_ = true;
  model_->setCurrentIndex(std::max(0, model_->findData(QStringLiteral("llama3-70b"))));
  cluster_->setCurrentIndex(std::max(0, cluster_->findData(QString::fromUtf8(cm::kDefaultCluster))));
  qobject_cast<QLineEdit*>(fields_[QStringLiteral("gpus")])->setText(QStringLiteral("64"));
  filling_ = false;
  model_chosen();
  cluster_chosen();
}

void InputPanel::fill_document_fields(const QString& document, const nlohmann::json& doc) {
  const bool was_filling = filling_;
  filling_ = true;
  for (auto& [field, w] : fields_) {
    if (!field.startsWith(document + QStringLiteral("/"))) continue;
    const std::string pointer = field.mid(document.size()).toStdString();
    QString text;
    try {
      text = json_text(doc.at(nlohmann::json::json_pointer(pointer)));
    } catch (const std::exception&) {
      text.clear();  // the document does not have it
    }
    if (auto* lineedit = qobject_cast<QLineEdit*>(w)) lineedit->setText(text);
    else if (auto* box = qobject_cast<QComboBox*>(w)) box->setCurrentIndex(std::max(0, box->findData(text)));
    else if (auto* check = qobject_cast<QCheckBox*>(w)) check->setChecked(text == QStringLiteral("true"));
  }
  filling_ = was_filling;
}

void InputPanel::model_chosen() {
  const QString data = model_->currentData().toString();
  DocumentInput input;
  if (data.startsWith(QString::fromUtf8(kFilePrefix))) {
    input.ref = loaded_model_path_.toStdString();
    input.document = loaded_model_;
  } else {
    input.ref = data.toStdString();
  }
  if (auto doc = model_document(input)) fill_document_fields(QStringLiteral("model"), *doc);
  if (!filling_) emit changed();
}

void InputPanel::cluster_chosen() {
  const QString data = cluster_->currentData().toString();
  DocumentInput input;
  if (data.startsWith(QString::fromUtf8(kFilePrefix))) {
    input.ref = loaded_cluster_path_.toStdString();
    input.document = loaded_cluster_;
  } else {
    input.ref = data.toStdString();
  }
  if (auto doc = cluster_document(input)) fill_document_fields(QStringLiteral("cluster"), *doc);
  update_nodes_from_gpus();
  if (!filling_) emit changed();
}

void InputPanel::update_nodes_from_gpus() {
  const int per_node = field_text(QStringLiteral("cluster/node/gpus_per_node")).toInt();
  bool ok = false;
  const long long gpus = field_text(QStringLiteral("gpus")).trimmed().toLongLong(&ok);
  const bool was_filling = filling_;
  filling_ = true;
  if (ok && per_node > 0 && gpus > 0) nodes_->setValue(static_cast<int>(std::min<long long>((gpus + per_node - 1) / per_node, 1 << 20)));
  filling_ = was_filling;
}

RequestForm InputPanel::form() const {
  RequestForm form;
  const auto document = [&](const QString& name, QComboBox* box, const std::optional<nlohmann::json>& loaded, const QString& path) {
    DocumentInput input;
    const QString data = box->currentData().toString();
    if (data.startsWith(QString::fromUtf8(kFilePrefix))) {
      input.ref = path.toStdString();
      input.document = loaded;
    } else {
      input.ref = data.toStdString();
    }
    for (const auto& [field, w] : fields_) {
      if (field.startsWith(name + QStringLiteral("/"))) input.edits[field.mid(name.size()).toStdString()] = widget_text(w).toStdString();
    }
    return input;
  };
  form.model = document(QStringLiteral("model"), model_, loaded_model_, loaded_model_path_);
  form.cluster = document(QStringLiteral("cluster"), cluster_, loaded_cluster_, loaded_cluster_path_);
  const auto text = [&](const char* field) { return field_text(QString::fromUtf8(field)).toStdString(); };
  form.gpus = text("gpus");
  form.seq_len = text("seq_len");
  form.global_batch = text("global_batch");
  form.batch_unit = batch_unit_->currentData().toString() == QStringLiteral("tokens") ? BatchUnit::kTokens : BatchUnit::kSequences;
  form.train_tokens = text("train_tokens");
  form.precision = text("precision");
  form.optimizer = text("optimizer");
  form.mode = text("mode");
  form.lora_rank = text("lora_rank");
  form.attention = text("attention");
  form.dropout = text("dropout");
  form.attention_mask = text("attention_mask");
  form.loss = text("loss");
  form.attention_kernel = text("attention_kernel");
  form.fp8_recipe = text("fp8_recipe");
  form.fp8_all_gather = text("fp8_all_gather");
  form.master_weights = text("master_weights");
  form.allocator = text("allocator");
  form.stack = text("stack");
  form.memory_headroom = text("memory_headroom");
  for (const auto& [field, w] : fields_) {
    if (field.startsWith(QStringLiteral("fix/"))) form.fixed[field.mid(4).toStdString()] = widget_text(w).toStdString();
  }
  return form;
}

pl::Objective InputPanel::objective() const {
  const QString o = objective_->currentData().toString();
  return o == QStringLiteral("time") ? pl::Objective::kTime : o == QStringLiteral("cost") ? pl::Objective::kCost : pl::Objective::kThroughput;
}

void InputPanel::set_errors(const std::vector<FieldError>& errors) {
  std::map<QString, QStringList> by_field;
  QStringList general;
  for (const auto& e : errors) {
    const QString field = QString::fromStdString(e.field);
    if (error_labels_.count(field) && error_labels_[field] != form_errors_) by_field[field] << QString::fromStdString(e.message);
    else general << (field.isEmpty() ? QString() : field + QStringLiteral(": ")) + QString::fromStdString(e.message);
  }
  for (auto& [field, label] : error_labels_) {
    if (label == form_errors_) continue;
    const auto it = by_field.find(field);
    const QString text = it == by_field.end() ? QString() : it->second.join(QStringLiteral("; "));
    if (text == label->text() && label->isHidden() == text.isEmpty()) continue;  // unchanged: no restyling
    QWidget* w = fields_.count(field) ? fields_[field] : nullptr;
    label->setText(text);
    label->setVisible(!text.isEmpty());
    if (w) {
      w->setStyleSheet(text.isEmpty() ? QString() : QStringLiteral("border: 2px solid #d00000"));
      w->setToolTip(text);
    }
  }
  const QString general_text = general.join(QStringLiteral("\n"));
  if (general_text != form_errors_->text() || form_errors_->isHidden() != general_text.isEmpty()) {
    form_errors_->setText(general_text);
    form_errors_->setVisible(!general_text.isEmpty());
  }
}

QString InputPanel::error_text(const QString& field) const {
  if (field.isEmpty() || field == QStringLiteral("fix")) return form_errors_->isVisibleTo(this) ? form_errors_->text() : QString();
  const auto it = error_labels_.find(field);
  if (it == error_labels_.end() || it->second->isHidden()) return {};
  return it->second->text();
}

bool InputPanel::set_field(const QString& field, const QString& text) {
  const auto it = fields_.find(field);
  if (it == fields_.end()) return false;
  QWidget* w = it->second;
  if (auto* edit = qobject_cast<QLineEdit*>(w)) {
    edit->setText(text);
    if (field == QStringLiteral("gpus")) update_nodes_from_gpus();
    emit changed();
    return true;
  }
  if (auto* box = qobject_cast<QComboBox*>(w)) {
    int index = box->findData(text);
    if (index < 0) index = box->findText(text);
    if (index < 0) return false;
    if (index == box->currentIndex()) emit changed();
    else box->setCurrentIndex(index);  // emits changed() (or model/cluster chosen)
    return true;
  }
  if (auto* check = qobject_cast<QCheckBox*>(w)) {
    if (text != QStringLiteral("true") && text != QStringLiteral("false")) return false;
    const bool on = text == QStringLiteral("true");
    if (check->isChecked() == on) emit changed();
    else check->setChecked(on);
    return true;
  }
  if (auto* spin = qobject_cast<QSpinBox*>(w)) {
    bool ok = false;
    const int v = text.toInt(&ok);
    if (!ok) return false;
    spin->setValue(v);
    return true;
  }
  return false;
}

QString InputPanel::field_text(const QString& field) const {
  const auto it = fields_.find(field);
  return it == fields_.end() ? QString() : widget_text(it->second);
}

void InputPanel::set_loaded_model(const QString& path, const nlohmann::json& document) {
  loaded_model_ = document;
  loaded_model_path_ = path;
  const QString data = QString::fromUtf8(kFilePrefix) + path;
  int index = model_->findData(data);
  if (index < 0) {
    model_->addItem(QStringLiteral("%1  (file)").arg(path), data);
    index = model_->count() - 1;
  }
  if (index == model_->currentIndex()) model_chosen();
  else model_->setCurrentIndex(index);
}

void InputPanel::load_request(const cm::PlanRequest& request, const QString& source) {
  filling_ = true;
  // Model and cluster: the preset when the request names one, else its document.
  int model_index = model_->findData(QString::fromStdString(cm::resolve_model_alias(request.model_ref)));
  if (model_index < 0) {
    loaded_model_ = cm::model_to_json(request.model);
    loaded_model_path_ = source + QStringLiteral(" (model)");
    model_->addItem(loaded_model_path_, QString::fromUtf8(kFilePrefix) + loaded_model_path_);
    model_index = model_->count() - 1;
  }
  model_->setCurrentIndex(model_index);
  int cluster_index = cluster_->findData(QString::fromStdString(request.cluster_ref));
  if (cluster_index < 0) {
    loaded_cluster_ = cm::hwprofile_to_json(request.cluster);
    loaded_cluster_path_ = source + QStringLiteral(" (cluster)");
    cluster_->addItem(loaded_cluster_path_, QString::fromUtf8(kFilePrefix) + loaded_cluster_path_);
    cluster_index = cluster_->count() - 1;
  }
  cluster_->setCurrentIndex(cluster_index);
  model_chosen();
  cluster_chosen();
  // The documents as the request has them (a plan may carry edited ones).
  fill_document_fields(QStringLiteral("model"), cm::model_to_json(request.model));
  fill_document_fields(QStringLiteral("cluster"), cm::hwprofile_to_json(request.cluster));

  const auto set_line = [&](const char* field, const QString& text) {
    if (auto* edit = qobject_cast<QLineEdit*>(fields_[QString::fromUtf8(field)])) edit->setText(text);
  };
  const auto set_choice = [&](const char* field, const QString& value) {
    if (auto* box = qobject_cast<QComboBox*>(fields_[QString::fromUtf8(field)])) box->setCurrentIndex(std::max(0, box->findData(value)));
  };
  const cm::TrainingConfig& t = request.training;
  set_line("gpus", QString::number(request.gpus));
  set_line("seq_len", QString::number(t.seq_len));
  set_line("global_batch", QString::number(t.global_batch));
  batch_unit_->setCurrentIndex(0);
  set_line("train_tokens", QString::number(t.train_tokens, 'g', 15));
  set_choice("precision", QString::fromUtf8(cm::precision_name(t.precision)));
  set_choice("optimizer", QString::fromUtf8(cm::optimizer_name(t.optimizer)));
  set_choice("mode", QString::fromUtf8(cm::mode_name(t.mode)));
  set_choice("attention_mask", t.attention_mask == cm::AttentionMask::kExplicit ? QStringLiteral("explicit") : QStringLiteral("causal"));
  set_choice("loss", t.loss ? QString::fromUtf8(cm::loss_kernel_name(*t.loss)) : QStringLiteral("stack"));
  set_choice("attention_kernel", t.attention_kernel ? QString::fromUtf8(cm::attention_impl_name(*t.attention_kernel)) : QStringLiteral("stack"));
  set_choice("fp8_recipe", t.fp8_recipe ? QString::fromUtf8(cm::fp8_recipe_name(*t.fp8_recipe)) : QStringLiteral("stack"));
  set_choice("fp8_all_gather", t.fp8_all_gather ? QStringLiteral("on") : QStringLiteral("off"));
  set_choice("master_weights", t.master_weights ? QStringLiteral("fp32") : QStringLiteral("none"));
  set_choice("allocator", QString::fromUtf8(cm::allocator_name(t.allocator)));
  const cm::ParallelConstraints& c = request.parallel;
  const auto number = [](const std::optional<int>& v) { return v ? QString::number(*v) : QString(); };
  set_line("fix/tp", number(c.tp));
  set_line("fix/pp", number(c.pp));
  set_line("fix/dp", number(c.dp));
  set_line("fix/cp", number(c.cp));
  set_line("fix/ep", number(c.ep));
  set_line("fix/zero", number(c.zero_stage));
  set_line("fix/shard_group", number(c.shard_group));
  set_line("fix/mb", number(c.micro_batch));
  set_line("fix/v", number(c.virtual_stages));
  const auto layers = [](int n) { return n > 0 ? QString::number(n) : QString(); };
  set_line("fix/first_stage_layers", layers(c.first_stage_layers));
  set_line("fix/last_stage_layers", layers(c.last_stage_layers));
  set_choice("fix/schedule", c.schedule ? QString::fromUtf8(cm::schedule_name(*c.schedule)) : QStringLiteral("auto"));
  set_choice("fix/recompute", c.recompute ? QString::fromUtf8(cm::recompute_name(*c.recompute)) : QStringLiteral("auto"));
  set_choice("fix/sp", c.sequence_parallel ? (*c.sequence_parallel ? QStringLiteral("on") : QStringLiteral("off")) : QStringLiteral("auto"));
  set_choice("fix/offload", c.offload_optimizer ? QString::fromUtf8(cm::offload_name(*c.offload_optimizer)) : QStringLiteral("auto"));
  set_choice("fix/cp_comm", c.cp_comm ? QString::fromUtf8(cm::cp_comm_type_name(*c.cp_comm)) : QStringLiteral("auto"));
  set_choice("fix/ends_in_split", c.ends_in_split ? (*c.ends_in_split ? QStringLiteral("on") : QStringLiteral("off")) : QStringLiteral("auto"));
  update_nodes_from_gpus();
  filling_ = false;
  emit changed();
}

}  // namespace trainplan::gui
